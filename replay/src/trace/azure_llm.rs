//! Azure LLM inference traces (Patel et al., "Splitwise", ISCA 2024): `TIMESTAMP,ContextTokens,GeneratedTokens`.
//! The 2023 files write `2023-11-16 18:17:03.9799600` (7 fractional digits, no zone), the 2024 week-long ones
//! `2024-05-10 00:00:00.009930+00:00` (with or without the fraction). The whole file is one stream (named after the
//! file stem); time 0 is the first row's timestamp, and every row must lie within
//! [`MAX_TRACE_TIME_S`](super::reader::MAX_TRACE_TIME_S) after it (a row before it is a bad row); work is the
//! weighted token count over the window's mean.

use super::error::RowError;
use super::reader::{CsvFile, MAX_TRACE_TIME_S, shown};
use super::row::{Row, RowParser};

/// Parses one row.
#[inline]
pub(crate) fn parse(csv: &CsvFile, p: &mut RowParser) -> Result<Row, RowError> {
    csv.check_len(csv.header.len())?;
    let raw = csv.field(0);
    let ns = timestamp_ns(raw).ok_or_else(|| {
        csv.err(0, format!("expected a timestamp like 2023-11-16 18:17:03.9799600, found {}", shown(raw)))
    })?;
    let context = csv.u64(1)?;
    let generated = csv.u64(2)?;
    let origin = match p.origin_ns {
        Some(o) => o,
        None => {
            p.origin_ns = Some(ns);
            p.origin_text = Some(String::from_utf8_lossy(raw.trim_ascii()).into_owned());
            ns
        }
    };
    // Both lie in i64 nanoseconds, so their difference fits in i128; as seconds it must be a trace time.
    let t = (i128::from(ns) - i128::from(origin)) as f64 * 1e-9;
    if !(0.0..=MAX_TRACE_TIME_S).contains(&t) {
        let first = p.origin_text.as_deref().unwrap_or("");
        let message = if t < 0.0 {
            format!("timestamp {} is before the first row's, {first}, which is time 0", shown(raw))
        } else {
            format!(
                "timestamp {} is more than {MAX_TRACE_TIME_S} s (366 days) after the first row's, {first}",
                shown(raw)
            )
        };
        return Err(csv.err(0, message));
    }
    if p.key != p.file_key {
        p.key.clear();
        p.key.extend_from_slice(&p.file_key);
    }
    let tokens = p.prefill_weight * context as f64 + p.decode_weight * generated as f64;
    Ok(Row { order_t: t, t, tokens: Some(tokens), duration_s: None })
}

/// Parses `YYYY-MM-DD HH:MM:SS[.fraction][Z|+HH:MM|-HH:MM]` (a `T` may replace the space) to nanoseconds since
/// 1970-01-01 UTC; a timestamp without a zone is read as UTC. `None` when malformed or outside what an i64 of
/// nanoseconds holds (1677-09-21 to 2262-04-11).
pub fn parse_timestamp_ns(s: &str) -> Option<i64> {
    timestamp_ns(s.as_bytes())
}

#[inline]
fn digits(b: &[u8], at: usize, n: usize) -> Option<i64> {
    let mut v = 0i64;
    for &c in b.get(at..at + n)? {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + d as i64;
    }
    Some(v)
}

#[inline]
pub(crate) fn timestamp_ns(b: &[u8]) -> Option<i64> {
    let b = b.trim_ascii();
    if b.len() < 19
        || b[4] != b'-'
        || b[7] != b'-'
        || !(b[10] == b' ' || b[10] == b'T')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut frac_ns = 0i64;
    if b.get(i) == Some(&b'.') {
        i += 1;
        let start = i;
        let mut scale = 100_000_000i64;
        while let Some(&c) = b.get(i) {
            let d = c.wrapping_sub(b'0');
            if d > 9 {
                break;
            }
            frac_ns += d as i64 * scale;
            scale /= 10;
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset_s = match b.get(i) {
        None => 0,
        Some(b'Z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if b.len() == i + 6 && b[i + 3] == b':' => {
            let off = digits(b, i + 1, 2)? * 3600 + digits(b, i + 4, 2)? * 60;
            if sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_s;
    // Nanoseconds since 1970 fit in an i64 from 1677 to 2262; a year outside is malformed here.
    secs.checked_mul(1_000_000_000)?.checked_add(frac_ns)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if (year % 4 == 0 && year % 100 != 0) || year % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_timestamp_styles() {
        // 2023-11-16 18:17:03 UTC = 1700158623.
        assert_eq!(parse_timestamp_ns("2023-11-16 18:17:03.9799600"), Some(1_700_158_623_979_960_000));
        assert_eq!(parse_timestamp_ns("2024-05-10 00:00:00.009930+00:00"), Some(1_715_299_200_009_930_000));
        assert_eq!(parse_timestamp_ns("2024-05-10 00:00:00+00:00"), Some(1_715_299_200_000_000_000));
        assert_eq!(parse_timestamp_ns("2024-05-10T02:00:00+02:00"), Some(1_715_299_200_000_000_000));
        assert_eq!(parse_timestamp_ns("2024-05-10 00:00:00Z"), Some(1_715_299_200_000_000_000));
        assert_eq!(parse_timestamp_ns("2024-02-30 00:00:00"), None);
        assert_eq!(parse_timestamp_ns("2024-05-10 00:00:00."), None);
        assert_eq!(parse_timestamp_ns("2024-05-10 00:00:00+0000"), None);
        assert_eq!(parse_timestamp_ns("yesterday"), None);
        // Outside an i64 of nanoseconds: refused, not wrapped (and no overflow panic).
        assert_eq!(parse_timestamp_ns("9999-12-31 23:59:59.9999999"), None);
        assert_eq!(parse_timestamp_ns("0001-01-01 00:00:00"), None);
        assert_eq!(parse_timestamp_ns("2262-04-11 23:47:16"), Some(i64::MAX - 854_775_807));
    }
}
