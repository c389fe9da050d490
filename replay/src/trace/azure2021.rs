//! Azure Functions 2021 (Zhang et al., SOSP 2021): `app,func,end_timestamp,duration`, one row per invocation, both
//! times in seconds from the trace start; arrival = `end_timestamp - duration`. The file is ordered by end time, so
//! pass 2 reorders arrivals (see `rows`).
//!
//! `end_timestamp` is a trace time (from 0 to [`MAX_TRACE_TIME_S`](super::reader::MAX_TRACE_TIME_S)), and an
//! invocation starts within the trace: `duration <= end_timestamp`. The trace writes durations rounded to the
//! millisecond, so a start up to [`START_SLACK_S`] before 0 is read as 0; a longer duration is a bad row.

use super::GroupBy;
use super::error::RowError;
use super::reader::{CsvFile, shown};
use super::row::Row;

/// How far before the trace start an invocation's start (`end_timestamp - duration`) may fall and be read as 0,
/// seconds: the rounding of `duration` to the millisecond.
pub(crate) const START_SLACK_S: f64 = 0.001;

/// Parses one row; writes the stream key (`app`, or `app/func` per function) into `key`.
#[inline]
pub(crate) fn parse(csv: &CsvFile, group_by: GroupBy, key: &mut Vec<u8>) -> Result<Row, RowError> {
    csv.check_len(csv.header.len())?;
    let app = csv.key(0)?;
    let func = csv.key(1)?;
    let end = csv.time_s(2)?;
    let duration = csv.f64(3)?;
    if duration < 0.0 {
        return Err(csv.err(3, format!("expected a non-negative duration, found {}", shown(csv.field(3)))));
    }
    if duration > end + START_SLACK_S {
        return Err(csv.err(
            3,
            format!(
                "duration {} is longer than end_timestamp {}: the invocation would start before the trace \
                 (end_timestamp - duration < 0)",
                shown(csv.field(3)),
                shown(csv.field(2))
            ),
        ));
    }
    key.clear();
    key.extend_from_slice(app);
    if group_by == GroupBy::Function {
        key.push(b'/');
        key.extend_from_slice(func);
    }
    Ok(Row { order_t: end, t: (end - duration).max(0.0), tokens: None, duration_s: Some(duration) })
}
