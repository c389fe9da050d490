//! Streaming CSV access shared by every format: one reused record, field parsers whose errors name file, line and
//! column, and the bad-row policy (fail, or count and keep the first few).

use std::fs::File;
use std::path::{Path, PathBuf};

use super::error::{RowError, TraceError};

/// How many bad rows are kept for the report when `skip_bad_rows` is on.
pub const BAD_ROW_EXAMPLES: usize = 10;

/// The latest trace time a row may carry, seconds from the trace's time 0: 366 days.
///
/// Every time field of every format is checked against `[0, MAX_TRACE_TIME_S]` (the Azure LLM timestamps relative
/// to the first row's), and a row outside is a bad row naming its file, line and column. The longest public traces
/// read here span 149 days (Alibaba GPU-sharing 2023: deletions up to 12.9 M s), 14 days (Azure Functions 2021), a
/// week (Azure LLM 2024) and a day (Azure Functions 2019); a year and a day holds any year-long trace, leap day
/// included. A time past it is not a longer trace but a wrong one: milliseconds or epoch seconds (1.7e9) written as
/// seconds from the start, or a corrupt value such as `1e308`, which would stretch the trace's window and with it
/// the run's length and every rate measured over it.
pub const MAX_TRACE_TIME_S: f64 = 366.0 * 86_400.0;

/// One CSV file read record by record (never loaded whole).
pub(crate) struct CsvFile {
    pub path: PathBuf,
    pub header: Vec<String>,
    rdr: csv::Reader<File>,
    pub rec: csv::ByteRecord,
}

impl CsvFile {
    /// Opens `path` and reads its header line.
    pub fn open(path: &Path) -> Result<CsvFile, TraceError> {
        let file = File::open(path).map_err(|e| TraceError::io(path, e))?;
        let mut rdr =
            csv::ReaderBuilder::new().has_headers(false).flexible(true).buffer_capacity(1 << 20).from_reader(file);
        let mut rec = csv::ByteRecord::new();
        let got = rdr.read_byte_record(&mut rec).map_err(|e| csv_error(path, e))?;
        if !got {
            return Err(TraceError::Empty { path: path.to_path_buf() });
        }
        let header = rec
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let f = if i == 0 { f.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(f) } else { f };
                String::from_utf8_lossy(f).trim().to_string()
            })
            .collect();
        Ok(CsvFile { path: path.to_path_buf(), header, rdr, rec })
    }

    /// Reads the next record into `self.rec`; false at the end of the file.
    #[inline]
    pub fn next(&mut self) -> Result<bool, TraceError> {
        self.rdr.read_byte_record(&mut self.rec).map_err(|e| csv_error(&self.path, e))
    }

    /// The line the current record starts on (1-based).
    #[inline]
    pub fn line(&self) -> u64 {
        self.rec.position().map_or(0, |p| p.line())
    }

    /// The raw bytes of field `i` of the current record (empty if absent).
    #[inline]
    pub fn field(&self, i: usize) -> &[u8] {
        self.rec.get(i).unwrap_or(b"")
    }

    /// An error about column `i` of the current record.
    pub fn err(&self, i: usize, message: impl Into<String>) -> RowError {
        let column = self.header.get(i).cloned().unwrap_or_else(|| format!("#{}", i + 1));
        RowError { path: self.path.clone(), line: self.line(), column: Some(column), message: message.into() }
    }

    /// Checks the current record has exactly `expected` fields.
    #[inline]
    pub fn check_len(&self, expected: usize) -> Result<(), RowError> {
        if self.rec.len() == expected {
            Ok(())
        } else {
            Err(RowError {
                path: self.path.clone(),
                line: self.line(),
                column: None,
                message: format!("expected {expected} fields, found {}", self.rec.len()),
            })
        }
    }

    /// Field `i` as a non-negative integer.
    #[inline]
    pub fn u64(&self, i: usize) -> Result<u64, RowError> {
        parse_u64(self.field(i))
            .ok_or_else(|| self.err(i, format!("expected an integer, found {}", shown(self.field(i)))))
    }

    /// Field `i` as a finite number.
    #[inline]
    pub fn f64(&self, i: usize) -> Result<f64, RowError> {
        parse_f64(self.field(i))
            .ok_or_else(|| self.err(i, format!("expected a number, found {}", shown(self.field(i)))))
    }

    /// Field `i` as a trace time: seconds from the trace's time 0, in `[0, MAX_TRACE_TIME_S]`. A number outside
    /// (negative, too late, or non-finite: `inf`, `NaN`, `1e400`) is refused as a time, anything else as a number.
    #[inline]
    pub fn time_s(&self, i: usize) -> Result<f64, RowError> {
        let f = self.field(i);
        match parse_f64(f) {
            Some(t) if (0.0..=MAX_TRACE_TIME_S).contains(&t) => Ok(t),
            Some(_) => Err(self.err(i, time_message(f))),
            None if std::str::from_utf8(trim(f)).is_ok_and(|s| s.parse::<f64>().is_ok()) => {
                Err(self.err(i, time_message(f)))
            }
            None => Err(self.err(i, format!("expected a number, found {}", shown(f)))),
        }
    }

    /// Field `i` as a trace time ([`CsvFile::time_s`]), `None` when empty.
    #[inline]
    pub fn opt_time_s(&self, i: usize) -> Result<Option<f64>, RowError> {
        let f = trim(self.field(i));
        if f.is_empty() { Ok(None) } else { self.time_s(i).map(Some) }
    }

    /// Field `i` as a finite number, `None` when empty.
    #[inline]
    pub fn opt_f64(&self, i: usize) -> Result<Option<f64>, RowError> {
        let f = trim(self.field(i));
        if f.is_empty() { Ok(None) } else { self.f64(i).map(Some) }
    }

    /// Field `i` as a non-empty key.
    #[inline]
    pub fn key(&self, i: usize) -> Result<&[u8], RowError> {
        let f = trim(self.field(i));
        if f.is_empty() { Err(self.err(i, "expected a non-empty value")) } else { Ok(f) }
    }
}

fn csv_error(path: &Path, e: csv::Error) -> TraceError {
    let line = e.position().map(|p| p.line());
    match e.into_kind() {
        csv::ErrorKind::Io(io) => TraceError::io(path, io),
        other => TraceError::Row(RowError {
            path: path.to_path_buf(),
            line: line.unwrap_or(0),
            column: None,
            message: format!("{other:?}"),
        }),
    }
}

/// Why `field` is not a trace time.
pub(crate) fn time_message(field: &[u8]) -> String {
    format!(
        "expected a time in seconds from the trace start, from 0 to {MAX_TRACE_TIME_S} (366 days), found {}",
        shown(field)
    )
}

/// A field quoted for an error message (at most 40 characters).
pub(crate) fn shown(f: &[u8]) -> String {
    let s = String::from_utf8_lossy(f);
    if s.chars().count() > 40 { format!("\"{}...\"", s.chars().take(40).collect::<String>()) } else { format!("{s:?}") }
}

#[inline]
pub(crate) fn trim(f: &[u8]) -> &[u8] {
    f.trim_ascii()
}

/// Parses a non-negative decimal integer (surrounding spaces allowed).
#[inline]
pub(crate) fn parse_u64(f: &[u8]) -> Option<u64> {
    let f = trim(f);
    if f.is_empty() || f.len() > 19 {
        return None;
    }
    let mut v: u64 = 0;
    for &b in f {
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        v = v * 10 + d as u64;
    }
    Some(v)
}

/// Parses a finite decimal number (surrounding spaces allowed).
#[inline]
pub(crate) fn parse_f64(f: &[u8]) -> Option<f64> {
    let f = trim(f);
    // Fast path: plain `digits[.digits]` with at most 15 significant digits is exact via one division.
    if let Some(v) = fast_decimal(f) {
        return Some(v);
    }
    let s = std::str::from_utf8(f).ok()?;
    let v: f64 = s.parse().ok()?;
    v.is_finite().then_some(v)
}

#[inline]
fn fast_decimal(f: &[u8]) -> Option<f64> {
    const POW10: [f64; 16] = [1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15];
    if f.is_empty() || f.len() > 16 {
        return None;
    }
    let mut mantissa: u64 = 0;
    let mut frac_digits: usize = 0;
    let mut seen_dot = false;
    let mut digits = 0;
    for &b in f {
        if b == b'.' {
            if seen_dot {
                return None;
            }
            seen_dot = true;
            continue;
        }
        let d = b.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        mantissa = mantissa * 10 + d as u64;
        digits += 1;
        if seen_dot {
            frac_digits += 1;
        }
    }
    if digits == 0 || digits > 15 {
        return None;
    }
    Some(mantissa as f64 / POW10[frac_digits])
}

/// The bad-row policy: fail on the first, or count them and keep the first few.
#[derive(Debug, Clone, Default)]
pub(crate) struct BadRows {
    pub skip: bool,
    pub count: u64,
    pub examples: Vec<RowError>,
}

impl BadRows {
    pub fn new(skip: bool) -> BadRows {
        BadRows { skip, count: 0, examples: Vec::new() }
    }

    /// Fails with `e`, or counts it when skipping.
    pub fn handle(&mut self, e: RowError) -> Result<(), TraceError> {
        if !self.skip {
            return Err(TraceError::Row(e));
        }
        self.count += 1;
        if self.examples.len() < BAD_ROW_EXAMPLES {
            self.examples.push(e);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_exactly() {
        assert_eq!(parse_u64(b"123"), Some(123));
        assert_eq!(parse_u64(b" 7 "), Some(7));
        assert_eq!(parse_u64(b"-1"), None);
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_f64(b"57.15786004066467"), Some(57.15786004066467));
        assert_eq!(parse_f64(b"0.078"), Some(0.078));
        assert_eq!(parse_f64(b"1e3"), Some(1000.0));
        assert_eq!(parse_f64(b"-2.5"), Some(-2.5));
        assert_eq!(parse_f64(b"abc"), None);
        assert_eq!(parse_f64(b"NaN"), None);
        assert_eq!(parse_f64(b"inf"), None);
    }
}
