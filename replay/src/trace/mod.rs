//! # Trace adapters
//!
//! Reads production traces as streams of request arrivals for replay, in two streaming passes: [`scan`] reads the
//! file once and returns per-stream statistics of the selected window and the sampled streams ([`TraceScan`]);
//! [`TraceScan::arrivals`] reads it again and yields the arrivals of the sampled streams window by window, in time
//! order ([`ArrivalStream::next_window`]). A multi-GB trace is never loaded whole: memory is bounded by the number of
//! streams (one small accumulator each in pass 1), the sampled streams and the window.
//!
//! ## Formats (detected from the header; [`TraceOptions::format`] overrides)
//! | format | header | stream (tenant) | arrival | work |
//! |---|---|---|---|---|
//! | `azure-functions-2019` | `HashOwner,HashApp,HashFunction,Trigger,1..1440` | owner, app or function ([`GroupBy`]) | per-minute counts placed by [`CountsToArrivals`] | 1 |
//! | `azure-functions-2021` | `app,func,end_timestamp,duration` | app or app/func | `end_timestamp - duration` (s) | 1 |
//! | `azure-llm` | `TIMESTAMP,ContextTokens,GeneratedTokens` | the whole file (its stem) | `TIMESTAMP` | tokens / mean |
//! | `alibaba-2023` | `name,cpu_milli,memory_mib,num_gpu,gpu_milli,...` | one GPU pod | Poisson, rate ∝ GPU share | 1 |
//! | `generic` | `timestamp_s,tenant[,tokens...]` | `tenant` | `timestamp_s` | tokens / mean (if any) |
//!
//! * **Azure Functions 2019** (one day per file): counts are recorded when a function finishes; they are read as
//!   arrivals in that minute. The durations file (`function_durations_percentiles.anon.dNN.csv`, `Average` weighted by
//!   `Count`) and the memory file (`app_memory_percentiles.anon.dNN.csv`, `AverageAllocatedMb`) are joined by hash when
//!   found beside the invocations file under those names (or given explicitly); negative or missing values are treated
//!   as unknown. The window is rounded to whole minutes (the minutes whose start lies in it). Pass 1 keeps one total
//!   per stream; pass 2 keeps the window's counts of the sampled streams only.
//! * **Azure Functions 2021**: times in seconds from the trace start. The file is ordered by end time, so arrivals
//!   are reordered through a bounded buffer whose horizon pass 1 measures (the largest `running max end - arrival`);
//!   it is capped by [`TraceOptions::max_reorder_s`]. A row of the window later than the cap is an error naming it
//!   and the line it is late behind; with [`TraceOptions::skip_bad_rows`] it is emitted at the current time and
//!   counted in [`ArrivalStream::late_rows`]. The 2021 trace has no owner, so `owner` groups by app.
//! * **Azure LLM 2023/2024**: timestamps `2023-11-16 18:17:03.9799600` (no zone) or `2024-05-10 00:00:00.009930+00:00`
//!   (with or without fraction); time 0 is the first row's timestamp. Work = `prefill_weight * ContextTokens +
//!   decode_weight * GeneratedTokens`, divided by the window's mean so that the mean work is 1.
//! * **Alibaba GPU-sharing 2023**: pods carry no requests, so each GPU pod (`num_gpu` from 1 to 64; CPU-only pods
//!   are counted in [`TraceScan::skipped_rows`]) becomes a stream active from `creation_time` to `deletion_time` (or
//!   from `scheduled_time` with [`TraceOptions::scheduled_pods_only`], which drops never-scheduled pods; a missing
//!   `deletion_time` means still running at the end of the trace) whose requests are a Poisson process of rate
//!   `pod_rps_per_gpu * num_gpu * gpu_milli / 1000`. Its count in the window is drawn in pass 1 (so
//!   [`StreamStats::requests`] is exact) and placed as sorted uniform points in pass 2. `gpu_milli` maps to the
//!   smallest classic MIG profile covering it ([`mig_fit`]: 1g = 143, 2g = 286, 3g = 429, 4g = 571, 7g = 1000
//!   milli); [`TraceScan::profile_waste`] reports the rounding waste. The trace has no GPU-memory column, so memory
//!   cannot take part in that choice.
//! * **Synthetic arrivals** ([`TraceOptions::synthetic_arrivals`], per-row formats): every accepted row keeps its
//!   stream and tokens, in file order, and gets its time from a Poisson or Gamma renewal process at a chosen rate
//!   (the first row at 0): the trace's token distribution at any load.
//! * **Generic**: `timestamp_s` in seconds from the trace start; optional token columns after `tenant`: the first is
//!   weighted by `prefill_weight`, the second by `decode_weight`, any further ones by 1.
//!
//! ## Times
//! Every time a row carries is a trace time, in seconds from the trace's time 0, from 0 to [`MAX_TRACE_TIME_S`] (366
//! days): the generic `timestamp_s`, Azure 2021's `end_timestamp` (and `end_timestamp - duration >= 0`: an invocation
//! starts within the trace), Alibaba's `creation_time`, `deletion_time` and `scheduled_time`, and Azure LLM timestamps
//! measured from the first row's. A negative, non-finite or later time is a bad row naming its file, line and column
//! (counted and skipped with [`TraceOptions::skip_bad_rows`]), so one corrupt value cannot stretch the window, and with
//! it the run and every rate measured over it. Azure 2019 has no time field: its minutes are the header's columns.
//!
//! ## Conventions (all seeded by [`TraceOptions::seed`])
//! Window selection ([`TraceOptions::window_start_s`], [`TraceOptions::window_duration_s`], in trace seconds), then
//! time scaling (`t' = time_scale * (t - window_start)`), then rate scaling ([`TraceScan::arrivals`]: each invocation
//! kept `floor(r)` times plus once with probability `frac(r)`), and sampling of streams by popularity (requests in
//! the window; [`Sample`]: top-k, quantile range, or a spread sample; nested, a larger sample contains a smaller
//! one). Every stream draws from its own generator seeded by `(seed, stream key)`, so sampling more streams does not
//! change the arrivals of the others.
//!
//! ## Layout
//! - `error`: [`TraceError`], [`RowError`].
//! - `reader`: the streaming CSV reader and field parsers shared by every format.
//! - `conventions`: counts to arrivals, sampling, rate scaling, the MIG mapping.
//! - `azure2019`, `azure2021`, `azure_llm`, `alibaba`, `generic`: one file per format.
//! - `rows`: the per-row formats' passes and reorder buffer; `arrivals`: [`ArrivalStream`].
//! - `synthetic`: [`generate_azure_functions_2019_day`].
//! - `args`: [`TraceArgs`], the command-line flags.
//!
//! Not done here: mapping streams to tenants' models and SLOs (the replay driver does that), and reading compressed
//! files.

mod alibaba;
pub(crate) mod args;
mod arrivals;
mod azure2019;
mod azure2021;
mod azure_llm;
mod conventions;
mod error;
mod generic;
mod reader;
mod row;
mod rows;
mod synthetic;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use args::TraceArgs;
pub use arrivals::ArrivalStream;
pub use azure_llm::parse_timestamp_ns;
pub use conventions::{CountsToArrivals, MigFit, Sample, SyntheticArrivals, mig_fit, profile_milli};
pub use error::{RowError, TraceError};
pub use reader::MAX_TRACE_TIME_S;
pub use synthetic::{
    SyntheticDay, SyntheticDaySpec, generate_azure_functions_2019_day, generate_azure_functions_2019_day_report,
};
use tessera_core::Profile;

use reader::CsvFile;

/// A trace format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TraceFormat {
    /// Azure Functions 2019: per-minute invocation counts per function, one day per file.
    AzureFunctions2019,
    /// Azure Functions 2021: one row per invocation, `app,func,end_timestamp,duration`.
    AzureFunctions2021,
    /// Azure LLM inference 2023 / 2024: `TIMESTAMP,ContextTokens,GeneratedTokens`.
    AzureLlm,
    /// Alibaba GPU-sharing 2023 pod list.
    Alibaba2023,
    /// `timestamp_s,tenant[,tokens...]`.
    Generic,
}

impl TraceFormat {
    /// Every format.
    pub const ALL: [TraceFormat; 5] = [
        TraceFormat::AzureFunctions2019,
        TraceFormat::AzureFunctions2021,
        TraceFormat::AzureLlm,
        TraceFormat::Alibaba2023,
        TraceFormat::Generic,
    ];

    /// The kebab-case name (`--format` value).
    pub const fn name(self) -> &'static str {
        match self {
            TraceFormat::AzureFunctions2019 => "azure-functions-2019",
            TraceFormat::AzureFunctions2021 => "azure-functions-2021",
            TraceFormat::AzureLlm => "azure-llm",
            TraceFormat::Alibaba2023 => "alibaba-2023",
            TraceFormat::Generic => "generic",
        }
    }

    /// The header the format is detected by (its leading columns).
    pub const fn header(self) -> &'static [&'static str] {
        match self {
            TraceFormat::AzureFunctions2019 => &["HashOwner", "HashApp", "HashFunction", "Trigger"],
            TraceFormat::AzureFunctions2021 => &["app", "func", "end_timestamp", "duration"],
            TraceFormat::AzureLlm => &["TIMESTAMP", "ContextTokens", "GeneratedTokens"],
            TraceFormat::Alibaba2023 => &[
                "name",
                "cpu_milli",
                "memory_mib",
                "num_gpu",
                "gpu_milli",
                "gpu_spec",
                "qos",
                "pod_phase",
                "creation_time",
                "deletion_time",
                "scheduled_time",
            ],
            TraceFormat::Generic => &["timestamp_s", "tenant"],
        }
    }

    /// Columns a row must have at least.
    const fn min_columns(self) -> usize {
        match self {
            TraceFormat::AzureFunctions2019 => 5,
            _ => self.header().len(),
        }
    }

    /// Detects the format from a header; errors list the known formats.
    pub fn detect(path: &Path, header: &[String]) -> Result<TraceFormat, TraceError> {
        let starts = |cols: &[&str]| header.len() >= cols.len() && cols.iter().zip(header).all(|(a, b)| a == b);
        if starts(&["HashOwner", "HashApp", "HashFunction", "Average"]) {
            return Err(TraceError::CompanionFile { path: path.to_path_buf(), kind: "durations" });
        }
        if starts(&["HashOwner", "HashApp", "SampleCount"]) {
            return Err(TraceError::CompanionFile { path: path.to_path_buf(), kind: "memory" });
        }
        if let Some(f) = TraceFormat::ALL.into_iter().find(|f| starts(f.header())) {
            return Ok(f);
        }
        let known = TraceFormat::ALL
            .iter()
            .map(|f| {
                let more = if *f == TraceFormat::AzureFunctions2019 {
                    ",1..1440"
                } else if *f == TraceFormat::Generic {
                    "[,tokens...]"
                } else {
                    ""
                };
                format!("{} ({}{more})", f.name(), f.header().join(","))
            })
            .collect::<Vec<_>>()
            .join("; ");
        let mut shown = header.join(",");
        if shown.len() > 120 {
            shown = format!("{}...", shown.chars().take(120).collect::<String>());
        }
        Err(TraceError::UnknownHeader { path: path.to_path_buf(), header: shown, known })
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TraceFormat {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        let t = s.trim().to_ascii_lowercase();
        TraceFormat::ALL.into_iter().find(|f| f.name() == t).ok_or_else(|| {
            let names: Vec<_> = TraceFormat::ALL.iter().map(|f| f.name()).collect();
            TraceError::invalid("--format", s, format!("expected one of {}", names.join(", ")))
        })
    }
}

/// Which level of the Azure Functions hierarchy becomes one stream (ignored by the other formats).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupBy {
    /// One stream per owner (tenant). The 2021 trace has no owner column: there it groups by app.
    Owner,
    /// One stream per application (deployment / model).
    App,
    /// One stream per function (endpoint).
    #[default]
    Function,
}

impl GroupBy {
    /// The kebab-case name.
    pub const fn name(self) -> &'static str {
        match self {
            GroupBy::Owner => "owner",
            GroupBy::App => "app",
            GroupBy::Function => "function",
        }
    }
}

impl fmt::Display for GroupBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GroupBy {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "owner" => Ok(GroupBy::Owner),
            "app" => Ok(GroupBy::App),
            "function" | "func" => Ok(GroupBy::Function),
            _ => Err(TraceError::invalid("--group-by", s, "expected owner, app or function")),
        }
    }
}

/// How to read a trace. One place for the defaults: [`TraceOptions::default`].
#[derive(Debug, Clone, PartialEq)]
pub struct TraceOptions {
    /// The format; `None` detects it from the header.
    pub format: Option<TraceFormat>,
    /// Count and skip malformed rows (keeping the first few for the report) instead of failing on the first.
    pub skip_bad_rows: bool,
    /// How Azure Functions 2019 per-minute counts become arrival times.
    pub counts_to_arrivals: CountsToArrivals,
    /// Shift each stream's arrivals of each minute by a random offset (modulo the minute): removes the burst at the
    /// start of the minute of `equidistant` and `exp-normalised`, keeps the count per minute.
    pub random_shift: bool,
    /// Time scaling: `t' = time_scale * (t - window_start)`; below 1 compresses the trace (higher rates).
    pub time_scale: f64,
    /// Start of the window, seconds of trace time from the trace's time 0.
    pub window_start_s: f64,
    /// Length of the window in trace seconds; `None` runs to the end of the trace.
    pub window_duration_s: Option<f64>,
    /// Which streams to keep.
    pub sample: Sample,
    /// Stream granularity for Azure Functions traces.
    pub group_by: GroupBy,
    /// Seed of every random choice.
    pub seed: u64,
    /// Weight of prompt (context) tokens in a request's work.
    pub prefill_weight: f64,
    /// Weight of generated (decode) tokens in a request's work.
    pub decode_weight: f64,
    /// Alibaba: requests per second of a pod holding one whole GPU.
    pub pod_rps_per_gpu: f64,
    /// Alibaba: keep only pods that were scheduled, active from `scheduled_time` (default: every GPU pod, from
    /// `creation_time`: the demand, whether or not the cluster served it).
    pub scheduled_pods_only: bool,
    /// Cap on the reorder buffer's horizon, trace seconds (per-row formats whose file order is not arrival order).
    pub max_reorder_s: f64,
    /// Azure Functions 2019 durations file; `None` looks beside the trace under the conventional name.
    pub durations_path: Option<PathBuf>,
    /// Azure Functions 2019 memory file; `None` looks beside the trace under the conventional name.
    pub memory_path: Option<PathBuf>,
    /// Per-row formats: replace the recorded arrival times by a Poisson or Gamma process at a chosen rate, keeping
    /// each row's stream and tokens (the token distribution) in file order.
    pub synthetic_arrivals: Option<SyntheticArrivals>,
}

impl Default for TraceOptions {
    fn default() -> TraceOptions {
        TraceOptions {
            format: None,
            skip_bad_rows: false,
            counts_to_arrivals: CountsToArrivals::Uniform,
            random_shift: false,
            time_scale: 1.0,
            window_start_s: 0.0,
            window_duration_s: None,
            sample: Sample::All,
            group_by: GroupBy::Function,
            seed: 0,
            prefill_weight: 1.0,
            decode_weight: 1.0,
            pod_rps_per_gpu: 1.0,
            scheduled_pods_only: false,
            max_reorder_s: 3600.0,
            durations_path: None,
            memory_path: None,
            synthetic_arrivals: None,
        }
    }
}

impl TraceOptions {
    /// Checks every value is in range.
    pub fn validate(&self) -> Result<(), TraceError> {
        let positive = |option: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(TraceError::invalid(option, v, "must be a positive number"))
            }
        };
        let non_negative = |option: &'static str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(TraceError::invalid(option, v, "must be a non-negative number"))
            }
        };
        positive("--time-scale", self.time_scale)?;
        non_negative("--window-start", self.window_start_s)?;
        if let Some(d) = self.window_duration_s {
            positive("--window-duration", d)?;
        }
        non_negative("--prefill-weight", self.prefill_weight)?;
        non_negative("--decode-weight", self.decode_weight)?;
        if self.prefill_weight + self.decode_weight <= 0.0 {
            return Err(TraceError::invalid(
                "--decode-weight",
                self.decode_weight,
                "prefill and decode weights are both 0",
            ));
        }
        positive("--pod-rps-per-gpu", self.pod_rps_per_gpu)?;
        non_negative("--max-reorder", self.max_reorder_s)?;
        if let Some(a) = self.synthetic_arrivals {
            positive("--synthetic-arrivals", a.rate_rps)?;
            positive("--synthetic-arrivals", a.cv)?;
        }
        match self.sample {
            Sample::TopK(0) | Sample::Spread(0) | Sample::Quantile { n: Some(0), .. } => {
                return Err(TraceError::invalid("--sample", self.sample, "N must be positive"));
            }
            Sample::Quantile { lo, hi, .. } if !((0.0..1.0).contains(&lo) && hi > lo && hi <= 1.0) => {
                return Err(TraceError::invalid("--sample", self.sample, "need 0 <= LO < HI <= 1"));
            }
            _ => {}
        }
        Ok(())
    }

    /// The window's end in trace seconds (infinite without a duration).
    fn window_end_s(&self) -> f64 {
        self.window_duration_s.map_or(f64::INFINITY, |d| self.window_start_s + d)
    }
}

/// What pass 1 learnt about one sampled stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamStats {
    /// The stream's identity: `owner`, `owner/app` or `owner/app/function` hashes (Azure 2019), `app` or
    /// `app/func` (Azure 2021), the file stem (LLM), the pod name (Alibaba), the tenant (generic).
    pub key: String,
    /// Requests in the window (before rate scaling).
    pub requests: u64,
    /// `requests / TraceScan::duration_s` (after time scaling).
    pub mean_rate_rps: f64,
    /// Mean work per request relative to the trace mean: 1.0 unless the format has tokens, then the stream's mean
    /// weighted tokens over the window's mean.
    pub mean_work: f64,
    /// Mean execution time, ms: measured (Azure 2021) or joined from the durations file (Azure 2019).
    pub mean_duration_ms: Option<f64>,
    /// Memory, MB: the app's average allocated memory joined from the Azure 2019 memory file (summed over apps for
    /// an owner).
    pub memory_mb: Option<f64>,
    /// Alibaba: the pod's GPU share per GPU, 1/1000 of a GPU.
    pub gpu_milli: Option<u32>,
    /// Alibaba: GPUs the pod holds.
    pub num_gpu: Option<u32>,
    /// Alibaba: the MIG profile `gpu_milli` maps to (one per GPU of the pod).
    pub mig_profile: Option<Profile>,
    /// Alibaba: compute share allocated but not requested, 1/1000 of a GPU, over all the pod's GPUs.
    pub profile_waste_milli: Option<u32>,
    /// Azure 2019: the trigger (`mixed` when a group has several); Alibaba: the QoS class.
    pub label: Option<String>,
    /// Alibaba: the pod's active interval within the window, trace seconds (before time scaling).
    pub active_s: Option<(f64, f64)>,
}

impl StreamStats {
    fn new(key: String, requests: u64) -> StreamStats {
        StreamStats {
            key,
            requests,
            mean_rate_rps: 0.0,
            mean_work: 1.0,
            mean_duration_ms: None,
            memory_mb: None,
            gpu_milli: None,
            num_gpu: None,
            mig_profile: None,
            profile_waste_milli: None,
            label: None,
            active_s: None,
        }
    }
}

/// Alibaba: the rounding waste of the `gpu_milli` to MIG-profile mapping over the sampled pods.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileWaste {
    /// Sampled GPU pods.
    pub pods: u64,
    /// Sum of `num_gpu * gpu_milli`.
    pub requested_milli: u64,
    /// Sum of `num_gpu * profile_milli`.
    pub allocated_milli: u64,
    /// `1 - requested / allocated`.
    pub waste_fraction: f64,
    /// Pods (GPU instances for multi-GPU pods) per profile short name (`1g`, `2g`, ...).
    pub by_profile: BTreeMap<String, u64>,
}

/// Azure 2019: which companion files were joined, and how many sampled streams they covered.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Join {
    /// The durations file read, if any.
    pub durations_path: Option<PathBuf>,
    /// The memory file read, if any.
    pub memory_path: Option<PathBuf>,
    /// Sampled streams that got a duration.
    pub streams_with_duration: usize,
    /// Sampled streams that got a memory size.
    pub streams_with_memory: usize,
}

/// The result of pass 1.
#[derive(Debug, Clone)]
pub struct TraceScan {
    /// The trace file.
    pub path: PathBuf,
    /// Its format.
    pub format: TraceFormat,
    /// Data rows read (every row after the header, good or bad).
    pub rows: u64,
    /// Malformed rows skipped (only with `skip_bad_rows`; companion files' bad rows included).
    pub bad_rows: u64,
    /// The first few malformed rows, for the report.
    pub bad_row_examples: Vec<RowError>,
    /// Well-formed rows that carry no demand (Alibaba CPU-only pods, pods never scheduled with
    /// `scheduled_pods_only`).
    pub skipped_rows: u64,
    /// Effective window start, trace seconds (rounded up to a minute for Azure 2019).
    pub window_start_s: f64,
    /// Effective window end, trace seconds (the end of the data without a duration).
    pub window_end_s: f64,
    /// The time scale applied.
    pub time_scale: f64,
    /// Length of the selected window after time scaling, seconds.
    pub duration_s: f64,
    /// Streams with at least one request in the window, before sampling.
    pub total_streams: usize,
    /// Requests in the window over every stream, before sampling.
    pub total_requests: u64,
    /// The sampled streams, most popular first.
    pub streams: Vec<StreamStats>,
    /// LLM: the timestamp of time 0 (the first row's), as written in the file.
    pub start_timestamp: Option<String>,
    /// Per-row formats: the reorder horizon pass 2 uses, trace seconds (0 when the file is in arrival order).
    pub reorder_horizon_s: f64,
    /// Per-row formats: the reorder horizon the file needs (above `reorder_horizon_s` when capped).
    pub reorder_needed_s: f64,
    /// Per-row formats: rows of the window more than `TraceOptions::max_reorder_s` before the latest time read
    /// before them in the file (only with `TraceOptions::skip_bad_rows`: without it the first is an error). Any of them whose time was replayed already when it is read is replayed late, at
    /// the time replayed last ([`ArrivalStream::late_rows`] counts those).
    pub late_rows: u64,
    /// Formats with tokens: the window's mean weighted tokens per request (the unit of work).
    pub mean_tokens: Option<f64>,
    /// Azure 2019: the companion files joined.
    pub join: Option<Join>,
    /// Alibaba: the profile mapping's rounding waste.
    pub profile_waste: Option<ProfileWaste>,
    opts: TraceOptions,
    plan: Plan,
}

/// What pass 2 needs from pass 1, per format.
#[derive(Debug, Clone)]
enum Plan {
    /// Per-row formats: sampled keys to stream indices.
    Rows { keys: HashMap<Box<[u8]>, u32>, origin_ns: i64 },
    /// Azure 2019 minute counts: sampled keys, the window's minutes.
    Minutes { keys: HashMap<Box<[u8]>, u32>, first_minute: usize, minutes: usize, columns: usize },
    /// Streams of `n` points on `[lo, hi)` (Alibaba pods, Azure 2019 poisson-fit).
    Intervals { spans: Vec<(f64, f64, u64)> },
}

impl TraceScan {
    /// The options the scan used.
    pub fn options(&self) -> &TraceOptions {
        &self.opts
    }

    /// Requests of the sampled streams in the window (before rate scaling).
    pub fn sampled_requests(&self) -> u64 {
        self.streams.iter().map(|s| s.requests).sum()
    }

    /// Pass 2: the arrivals of the sampled streams, in time order. `rate_scale` thins (< 1) or duplicates (> 1)
    /// invocations, seeded per stream.
    pub fn arrivals(&self, rate_scale: f64) -> Result<ArrivalStream, TraceError> {
        self.arrivals_before(rate_scale, f64::INFINITY)
    }

    /// Pass 2 cut at `end_s` (seconds from the window start, after time scaling): the arrivals before `end_s` only,
    /// as [`TraceScan::arrivals`] gives them. Rows at or after it never enter memory, and the file is read no
    /// further than `end_s` plus the reorder horizon: a run shorter than the window reads and holds only its part.
    pub fn arrivals_before(&self, rate_scale: f64, end_s: f64) -> Result<ArrivalStream, TraceError> {
        if !(rate_scale.is_finite() && rate_scale >= 0.0) {
            return Err(TraceError::invalid("--rate-scale", rate_scale, "must be a non-negative number"));
        }
        ArrivalStream::open(self, rate_scale, end_s)
    }
}

/// One request arrival.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceArrival {
    /// Index into [`TraceScan::streams`].
    pub stream: u32,
    /// Seconds from the window start, after time scaling.
    pub time_s: f64,
    /// Work relative to the trace's mean request (1.0 for formats without tokens).
    pub work: f64,
}

/// Pass 1: reads `path` once (streaming) and returns the window's statistics and the sampled streams.
pub fn scan(path: &Path, opts: &TraceOptions) -> Result<TraceScan, TraceError> {
    opts.validate()?;
    let csv = CsvFile::open(path)?;
    let format = match opts.format {
        Some(f) => f,
        None => TraceFormat::detect(path, &csv.header)?,
    };
    if csv.header.len() < format.min_columns() {
        return Err(TraceError::HeaderTooShort {
            path: path.to_path_buf(),
            format,
            expected: format.min_columns(),
            found: csv.header.len(),
        });
    }
    match format {
        TraceFormat::AzureFunctions2019 => azure2019::scan(csv, opts),
        TraceFormat::AzureFunctions2021 | TraceFormat::AzureLlm | TraceFormat::Generic => rows::scan(csv, format, opts),
        TraceFormat::Alibaba2023 => alibaba::scan(csv, opts),
    }
}

/// Pass 1 result shared by every format, before sampling.
struct Pass1 {
    rows: u64,
    bad: reader::BadRows,
    skipped_rows: u64,
    window_start_s: f64,
    window_end_s: f64,
    /// Every stream with requests in the window: key, requests, stats filled by the format.
    streams: Vec<StreamStats>,
}

/// Ranks `p.streams` (most requests first, key as tie-break), applies the sample, fills rates; returns the
/// sampled streams, most popular first, the requests and the number of streams before sampling.
fn finish(p: &mut Pass1, opts: &TraceOptions) -> (Vec<StreamStats>, u64, usize) {
    let total_requests = p.streams.iter().map(|s| s.requests).sum();
    let total_streams = p.streams.len();
    let mut order: Vec<usize> = (0..p.streams.len()).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (&p.streams[a], &p.streams[b]);
        b.requests.cmp(&a.requests).then_with(|| a.key.cmp(&b.key))
    });
    let keep = conventions::select(opts.sample, order.len(), opts.seed);
    let duration_s = (p.window_end_s - p.window_start_s).max(0.0) * opts.time_scale;
    let mut picked = Vec::with_capacity(keep.len());
    for rank in keep {
        let i = order[rank];
        let mut s = std::mem::replace(&mut p.streams[i], StreamStats::new(String::new(), 0));
        s.mean_rate_rps = if duration_s > 0.0 { s.requests as f64 / duration_s } else { 0.0 };
        picked.push(s);
    }
    (picked, total_requests, total_streams)
}

/// Maps sampled keys to their stream index.
fn key_index(streams: &[StreamStats]) -> HashMap<Box<[u8]>, u32> {
    streams.iter().enumerate().map(|(i, s)| (s.key.as_bytes().to_vec().into_boxed_slice(), i as u32)).collect()
}

/// Builds the scan from pass 1's common part.
#[allow(clippy::too_many_arguments)]
fn build_scan(
    path: PathBuf,
    format: TraceFormat,
    p: Pass1,
    streams: Vec<StreamStats>,
    total_requests: u64,
    total_streams: usize,
    opts: &TraceOptions,
    plan: Plan,
) -> TraceScan {
    TraceScan {
        path,
        format,
        rows: p.rows,
        bad_rows: p.bad.count,
        bad_row_examples: p.bad.examples,
        skipped_rows: p.skipped_rows,
        window_start_s: p.window_start_s,
        window_end_s: p.window_end_s,
        time_scale: opts.time_scale,
        duration_s: (p.window_end_s - p.window_start_s).max(0.0) * opts.time_scale,
        total_streams,
        total_requests,
        streams,
        start_timestamp: None,
        reorder_horizon_s: 0.0,
        reorder_needed_s: 0.0,
        late_rows: 0,
        mean_tokens: None,
        join: None,
        profile_waste: None,
        opts: opts.clone(),
        plan,
    }
}
