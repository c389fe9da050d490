//! # tessera-replay
//!
//! Feeds production traces (Azure Functions 2019/2021, Azure LLM 2023/2024, Alibaba GPU-sharing 2023, generic CSV)
//! through the planner and a simulated fleet, in process or against a running cluster, and reports goodput, SLO
//! attainment and accuracy per policy . It never links the coordinator.
//!
//! Built so far: the trace adapters ([`trace`]), the in-process replay of every policy with its reports and the
//! capacity search ([`run`]), and `replay plan` ([`plan_cmd`]), the planner sizing tool. Cluster mode comes with the
//! coordinator.
//!
//! [`trace`]: the trace adapters (every format, arrival conventions, sampling; streaming, two passes).

pub mod plan_cmd;
pub mod run;
pub mod trace;

/// Writes one line to stderr, ignoring a failure: where the reader of stderr has gone (`replay ... 2>&1 | head`),
/// `eprintln!` would panic (Rust ignores SIGPIPE, so the write fails with EPIPE instead of ending the process).
pub fn note(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}
