//! # tessera-replay
//!
//! Feeds production traces (Azure Functions 2019/2021, Azure LLM 2023/2024, Alibaba GPU-sharing 2023, generic CSV)
//! through the planner and a simulated fleet, in process or against a running cluster, and reports goodput, SLO
//! attainment and accuracy per policy . It never links the coordinator.
//!
//! Its rooms, each using only those above it:
//!
//! - [`trace`]: the trace formats and their conventions (every format, arrival conventions, sampling; streaming,
//!   two passes).
//! - [`run`]: a run of every policy on a trace, in process or through a coordinator cluster, and the upper bound.
//! - [`report`]: what a run shows (table, `summary.json`, `timeseries.csv`, `report.html`) and its figures.
//! - [`study`]: studies (scenarios x policies x seeds, with intervals) and the capacity search.
//! - [`plan_cmd`]: `replay plan`, which times planning rounds.

pub mod plan_cmd;
pub mod report;
pub mod run;
pub mod study;
pub mod trace;

/// Writes one line to stderr, ignoring a failure: where the reader of stderr has gone (`replay ... 2>&1 | head`),
/// `eprintln!` would panic (Rust ignores SIGPIPE, so the write fails with EPIPE instead of ending the process).
pub fn note(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
