//! [`TraceArgs`]: the command-line flags of the trace adapters, flattened into `replay run` by the driver (which
//! owns `--trace`, `--seed`, `--gpus` and `--policy`).

use std::path::PathBuf;

use super::{CountsToArrivals, GroupBy, Sample, SyntheticArrivals, TraceError, TraceFormat, TraceOptions};

/// Seconds, as a number (`90`, `1.5`) or a duration (`90s`, `10m`, `2h 30m`).
pub(crate) fn parse_seconds(s: &str) -> Result<f64, String> {
    let t = s.trim();
    if let Ok(v) = t.parse::<f64>() {
        return Ok(v);
    }
    humantime::parse_duration(t)
        .map(|d| d.as_secs_f64())
        .map_err(|e| format!("expected seconds (e.g. 90) or a duration (e.g. 10m, 2h): {e}"))
}

/// How to read the trace: format, bad rows, arrival conventions, window, scaling and sampling.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(next_help_heading = "Trace reading")]
pub struct TraceArgs {
    /// Trace format; detected from the header when absent.
    ///
    /// azure-functions-2019 (HashOwner,HashApp,HashFunction,Trigger,1..1440: per-minute counts; the durations and
    /// memory files are joined by hash when found beside it as function_durations_percentiles.anon.dNN.csv and
    /// app_memory_percentiles.anon.dNN.csv), azure-functions-2021 (app,func,end_timestamp,duration in seconds;
    /// arrival = end - duration), azure-llm (TIMESTAMP,ContextTokens,GeneratedTokens; one stream, time 0 = first
    /// row), alibaba-2023 (pod list; each GPU pod is a stream of Poisson requests while it lives, see
    /// --pod-rps-per-gpu), generic (timestamp_s,tenant[,tokens...]). With a forced format the header names are not
    /// checked, only the column count.
    #[arg(long, value_name = "FORMAT")]
    pub format: Option<TraceFormat>,

    /// Count and skip malformed rows (the first few are reported) instead of stopping at the first.
    ///
    /// Without it, the first malformed row stops the run with its file, line and column, and so does the first row
    /// out of order by more than --max-reorder; with it, such rows are replayed late and counted.
    #[arg(long)]
    pub skip_bad_rows: bool,

    /// How per-minute counts (Azure Functions 2019) become arrival times.
    ///
    /// uniform: each invocation at a uniform random time in its minute. equidistant: N invocations at 60 s / N
    /// spacing. exp-normalised: N exponential gaps rescaled to fill the minute. These three keep the exact count per
    /// minute. poisson-fit: one constant rate per stream over the window, its total kept exact (the diurnal shape is
    /// dropped). Seeded by --seed.
    #[arg(long, value_name = "CONVENTION", default_value = "uniform")]
    pub arrivals: CountsToArrivals,

    /// Shift each stream's arrivals of each minute by a random offset, modulo the minute.
    ///
    /// Removes the burst at the start of every minute (equidistant, exp-normalised) and keeps the count per minute.
    #[arg(long)]
    pub arrival_shift: bool,

    /// Time scaling: t' = K * (t - window start); K < 1 compresses the trace (raises rates), K > 1 stretches it.
    #[arg(long, value_name = "K", default_value_t = 1.0)]
    pub time_scale: f64,

    /// Rate scaling: keep each invocation floor(R) times plus once more with probability frac(R).
    ///
    /// R < 1 thins the trace, R > 1 duplicates invocations; a replay run spreads the copies of a request over the
    /// next 10 s (as it does for --load). Independent of --time-scale. Seeded.
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    pub rate_scale: f64,

    /// Window start, in trace time from the trace's time 0 (seconds, or a duration such as 6h).
    ///
    /// Time 0 is the first row's timestamp for azure-llm and the file's own zero otherwise. Azure Functions 2019
    /// windows are rounded to whole minutes (the minutes whose start lies in the window).
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = parse_seconds)]
    pub window_start: f64,

    /// Window length in trace time (seconds or a duration such as 1h); to the end of the trace when absent.
    #[arg(long, value_name = "DURATION", value_parser = parse_seconds)]
    pub window_duration: Option<f64>,

    /// Which streams (tenants) to keep, by popularity (requests in the window).
    ///
    /// all; top-k:N (the N most popular); quantile:LO-HI (popularity quantiles, 0 = least, 1 = most popular, e.g.
    /// quantile:0.9-1 is the top decile) or quantile:LO-HI:N (N of them spread over that range); spread:N (N streams
    /// spread over the whole ranking, preserving its distribution). Samples are nested: a larger N contains a
    /// smaller one with the same seed.
    #[arg(long, value_name = "SAMPLE", default_value = "all")]
    pub sample: Sample,

    /// Stream granularity for Azure Functions traces: owner (tenant), app (deployment / model) or function
    /// (endpoint).
    ///
    /// The 2021 trace has no owner column: owner groups by app there. Ignored by the other formats.
    #[arg(long, value_name = "LEVEL", default_value = "function")]
    pub group_by: GroupBy,

    /// Weight of prompt (context) tokens in a request's work (LLM and generic traces).
    ///
    /// work = (prefill weight * context tokens + decode weight * generated tokens) / the window's mean.
    #[arg(long, value_name = "W", default_value_t = 1.0)]
    pub prefill_weight: f64,

    /// Weight of generated (decode) tokens in a request's work (LLM and generic traces).
    #[arg(long, value_name = "W", default_value_t = 1.0)]
    pub decode_weight: f64,

    /// Alibaba: requests per second of a pod holding one whole GPU.
    ///
    /// A pod's requests are a Poisson process of rate R * num_gpu * gpu_milli / 1000 from its creation to its
    /// deletion; its gpu_milli maps to the smallest MIG profile covering it (1g = 143, 2g = 286, 3g = 429,
    /// 4g = 571, 7g = 1000 milli) and the rounding waste is reported.
    #[arg(long, value_name = "R", default_value_t = 1.0)]
    pub pod_rps_per_gpu: f64,

    /// Alibaba: keep only pods that were scheduled, active from scheduled_time (default: every GPU pod from its
    /// creation, i.e. the demand whether or not it was served).
    #[arg(long)]
    pub scheduled_pods_only: bool,

    /// Cap on the reorder buffer's horizon (per-row traces not in arrival order, e.g. Azure Functions 2021 which is
    /// ordered by end time).
    ///
    /// The horizon the file needs is measured in the first pass; a row later than the cap is an error naming it and
    /// the line it is late behind, or with --skip-bad-rows is emitted at the current time and counted.
    #[arg(long, value_name = "DURATION", default_value = "3600", value_parser = parse_seconds)]
    pub max_reorder: f64,

    /// Per-row traces (azure-llm, azure-functions-2021, generic): replace the recorded arrival times by a synthetic
    /// process at a chosen rate, keeping each row's stream and tokens in file order.
    ///
    /// poisson:RATE (exponential gaps, RATE requests per second of trace time) or gamma:RATE:CV (Gamma gaps with
    /// coefficient of variation CV; above 1 is burstier). The first row arrives at 0. Seeded by --seed.
    #[arg(long, value_name = "PROCESS")]
    pub synthetic_arrivals: Option<SyntheticArrivals>,

    /// Azure Functions 2019 durations file (default: function_durations_percentiles.anon.dNN.csv beside the trace,
    /// if present).
    #[arg(long, value_name = "FILE")]
    pub durations: Option<PathBuf>,

    /// Azure Functions 2019 memory file (default: app_memory_percentiles.anon.dNN.csv beside the trace, if
    /// present).
    #[arg(long, value_name = "FILE")]
    pub memory: Option<PathBuf>,
}

impl TraceArgs {
    /// The validated options, with the run's seed. The rate scale is not part of them: pass
    /// [`TraceArgs::rate_scale`] to [`super::TraceScan::arrivals`].
    pub fn options(&self, seed: u64) -> Result<TraceOptions, TraceError> {
        let opts = TraceOptions {
            format: self.format,
            skip_bad_rows: self.skip_bad_rows,
            counts_to_arrivals: self.arrivals,
            random_shift: self.arrival_shift,
            time_scale: self.time_scale,
            window_start_s: self.window_start,
            window_duration_s: self.window_duration,
            sample: self.sample,
            group_by: self.group_by,
            seed,
            prefill_weight: self.prefill_weight,
            decode_weight: self.decode_weight,
            pod_rps_per_gpu: self.pod_rps_per_gpu,
            scheduled_pods_only: self.scheduled_pods_only,
            max_reorder_s: self.max_reorder,
            durations_path: self.durations.clone(),
            memory_path: self.memory.clone(),
            synthetic_arrivals: self.synthetic_arrivals,
        };
        opts.validate()?;
        if !(self.rate_scale.is_finite() && self.rate_scale >= 0.0) {
            return Err(TraceError::invalid("--rate-scale", self.rate_scale, "must be a non-negative number"));
        }
        Ok(opts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_parse_numbers_and_durations() {
        assert_eq!(parse_seconds("90"), Ok(90.0));
        assert_eq!(parse_seconds("1.5"), Ok(1.5));
        assert_eq!(parse_seconds("10m"), Ok(600.0));
        assert_eq!(parse_seconds("2h 30m"), Ok(9000.0));
        assert!(parse_seconds("soon").is_err());
    }
}
