//! Errors of the trace adapters.

use std::fmt;
use std::path::PathBuf;

/// A malformed row: where it is and what is wrong with it.
///
/// Displays as `path:line: column NAME: message` (or `path:line: message` when the whole row is wrong, e.g. a wrong
/// number of fields). With `skip_bad_rows` the first few are kept in [`super::TraceScan::bad_row_examples`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowError {
    /// The file, as it was given.
    pub path: PathBuf,
    /// 1-based line number (the header is line 1).
    pub line: u64,
    /// The column's header name, when one column is at fault.
    pub column: Option<String>,
    /// What is wrong, e.g. `expected an integer, found "abc"`.
    pub message: String,
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.column {
            Some(column) => write!(f, "{}:{}: column {}: {}", self.path.display(), self.line, column, self.message),
            None => write!(f, "{}:{}: {}", self.path.display(), self.line, self.message),
        }
    }
}

/// Everything that can go wrong reading a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The file has no header line.
    #[error("{}: empty file (no header line)", path.display())]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// The header matches no known format (and no `--format` override was given).
    #[error("{}: unknown trace header \"{header}\"; known formats: {known}", path.display())]
    UnknownHeader {
        /// The file.
        path: PathBuf,
        /// The header line as read.
        header: String,
        /// The formats and the headers they expect.
        known: String,
    },
    /// The file is an Azure Functions 2019 companion file (durations or memory), not an invocations file.
    #[error(
        "{}: this is an Azure Functions 2019 {kind} file; pass the invocations file \
         (invocations_per_function_md.anon.dNN.csv) and the {kind} file is joined from beside it",
        path.display()
    )]
    CompanionFile {
        /// The file.
        path: PathBuf,
        /// `durations` or `memory`.
        kind: &'static str,
    },
    /// The header has fewer columns than the format (forced with `--format`) needs.
    #[error("{}: header has {found} columns, format {format} needs at least {expected}", path.display())]
    HeaderTooShort {
        /// The file.
        path: PathBuf,
        /// The format in use.
        format: super::TraceFormat,
        /// Columns the format needs.
        expected: usize,
        /// Columns the header has.
        found: usize,
    },
    /// A malformed row (without `skip_bad_rows`).
    #[error("{0}")]
    Row(RowError),
    /// An option value is out of range or unparsable.
    #[error("invalid {option} \"{value}\": {reason}")]
    InvalidOption {
        /// The option (its command-line name).
        option: &'static str,
        /// The value given.
        value: String,
        /// Why it is rejected, and what is accepted.
        reason: String,
    },
}

impl TraceError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TraceError {
        TraceError::Io { path: path.into(), source }
    }

    pub(crate) fn invalid(option: &'static str, value: impl fmt::Display, reason: impl Into<String>) -> TraceError {
        TraceError::InvalidOption { option, value: value.to_string(), reason: reason.into() }
    }
}

impl From<RowError> for TraceError {
    fn from(e: RowError) -> TraceError {
        TraceError::Row(e)
    }
}
