//! The generic CSV: `timestamp_s,tenant[,tokens...]` for users' own traces. `timestamp_s` is in seconds from the
//! trace's time 0, from 0 to [`MAX_TRACE_TIME_S`](super::reader::MAX_TRACE_TIME_S) (any order: pass 2 reorders
//! within the measured horizon); `tenant` names the stream; optional
//! token columns make the work: the first is weighted by `prefill_weight`, the second by `decode_weight`, further
//! ones by 1.

use super::error::RowError;
use super::reader::CsvFile;
use super::row::{Row, RowParser};

/// Parses one row; writes the tenant into `p.key`.
#[inline]
pub(crate) fn parse(csv: &CsvFile, p: &mut RowParser) -> Result<Row, RowError> {
    let columns = csv.header.len();
    csv.check_len(columns)?;
    let t = csv.time_s(0)?;
    let tenant = csv.key(1)?;
    p.key.clear();
    p.key.extend_from_slice(tenant);
    let tokens = if columns > 2 {
        let mut sum = 0.0;
        for i in 2..columns {
            let v = csv.f64(i)?;
            if v < 0.0 {
                return Err(csv.err(i, format!("expected a non-negative token count, found {v}")));
            }
            let w = match i {
                2 => p.prefill_weight,
                3 => p.decode_weight,
                _ => 1.0,
            };
            sum += w * v;
        }
        Some(sum)
    } else {
        None
    };
    Ok(Row { order_t: t, t, tokens, duration_s: None })
}
