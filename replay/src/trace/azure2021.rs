//! Azure Functions 2021 (Zhang et al., SOSP 2021): `app,func,end_timestamp,duration`, one row per invocation, both
//! times in seconds from the trace start; arrival = `end_timestamp - duration`. The file is ordered by end time, so
//! pass 2 reorders arrivals (see `rows`).

use super::GroupBy;
use super::error::RowError;
use super::reader::{CsvFile, shown};
use super::rows::Row;

/// Parses one row; writes the stream key (`app`, or `app/func` per function) into `key`.
#[inline]
pub(crate) fn parse(csv: &CsvFile, group_by: GroupBy, key: &mut Vec<u8>) -> Result<Row, RowError> {
    csv.check_len(csv.header.len())?;
    let app = csv.key(0)?;
    let func = csv.key(1)?;
    let end = csv.f64(2)?;
    let duration = csv.f64(3)?;
    if duration < 0.0 {
        return Err(csv.err(3, format!("expected a non-negative duration, found {}", shown(csv.field(3)))));
    }
    key.clear();
    key.extend_from_slice(app);
    if group_by == GroupBy::Function {
        key.push(b'/');
        key.extend_from_slice(func);
    }
    Ok(Row { order_t: end, t: end - duration, tokens: None, duration_s: Some(duration) })
}
