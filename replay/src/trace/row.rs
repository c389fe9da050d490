//! One row of the per-row formats (Azure Functions 2021, Azure LLM, generic) and the parser state their adapters
//! read and write; the passes over a file (`rows.rs`) run the adapters.

use super::TraceOptions;
use super::conventions::SyntheticClock;
use super::reader::CsvFile;
use super::{GroupBy, TraceFormat};

/// One parsed row; its stream key is in [`RowParser::key`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Row {
    /// The time the file is ordered by (end time for Azure 2021, the arrival otherwise), trace seconds.
    pub order_t: f64,
    /// The arrival, trace seconds.
    pub t: f64,
    /// Weighted tokens, for formats that have them.
    pub tokens: Option<f64>,
    /// Execution time, seconds (Azure 2021).
    pub duration_s: Option<f64>,
}

/// Parses rows of one per-row format.
pub(crate) struct RowParser {
    pub format: TraceFormat,
    pub group_by: GroupBy,
    pub prefill_weight: f64,
    pub decode_weight: f64,
    /// LLM: the timestamp of time 0, ns since the epoch (set by the first good row of pass 1).
    pub origin_ns: Option<i64>,
    /// LLM: the raw timestamp of the first good row.
    pub origin_text: Option<String>,
    /// The key of the last parsed row.
    pub key: Vec<u8>,
    /// LLM: the single stream's key (the file stem).
    pub file_key: Vec<u8>,
    /// Synthetic arrivals replacing the recorded times, if asked for.
    pub synthetic: Option<SyntheticClock>,
}

impl RowParser {
    pub fn new(format: TraceFormat, opts: &TraceOptions, csv: &CsvFile) -> RowParser {
        let stem = csv.path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "trace".into());
        RowParser {
            format,
            group_by: opts.group_by,
            prefill_weight: opts.prefill_weight,
            decode_weight: opts.decode_weight,
            origin_ns: None,
            origin_text: None,
            key: Vec::with_capacity(160),
            file_key: stem.into_bytes(),
            synthetic: opts.synthetic_arrivals.map(|spec| SyntheticClock::new(spec, opts.seed)),
        }
    }
}
