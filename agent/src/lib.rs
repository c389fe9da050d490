//! # tessera-agent
//!
//! The node agent: it keeps a node's MIG layouts equal to the targets the coordinator pushes,
//! drains work before it takes instances away, serves its state over gRPC and reports to the coordinator.
//!
//! ## Modules
//! - [`backend`]: the `MigBackend` trait (list GPUs, read instances, create at an explicit placement, destroy, set
//!   the MIG mode) with NVML-shaped errors. Implemented by the simulator in `tessera-sim` and by the `nvml` module
//!   (feature `nvml`; [`nvml_codes`] is its pure, always-built part: return codes and profile ids to core types).
//! - [`procs`]: which host processes run on a MIG device (read from `/proc`), for the simulated node.
//! - [`supervisor`]: the workload for real nodes that runs each tenant's jobs (start, readiness, restart, drain,
//!   checkpoint, stop; adopted again after an agent restart).
//! - [`workload`]: the `Workload` trait (drain, load, readiness, workload time, metrics) and the bookkeeping hook
//!   used with real GPUs.
//! - [`state`]: the persisted desired state (newest epoch, per-GPU targets).
//! - [`reconcile`]: one pass from desired to observed: the diff, drains, destroys, creates, crash safety, epochs.
//! - [`service`]: the gRPC `Agent` service and the one mapping of errors to `tonic::Status`.
//! - [`coordinator`]: the coordinator client (register, heartbeat, backoff).
//! - [`runtime`]: ties them together: the reconcile loop task, the server and the client ([`runtime::run`]).
//! - [`config`]: `agent run --config FILE`, parsed raw then validated.
//! - [`mig_tools`]: the operator tools of `agent mig` (profiles, layouts, diffs, mig-parted import and export); no GPU.
//! - [`cli`]: the command-line conventions shared by the binaries.
//!
//! ## What it does not do
//! Choose layouts (the planner's job) or reset GPUs (an operator's act). A tenant without jobs is recorded only (the
//! [`workload::Bookkeeping`] hook, or the supervisor's bookkeeping): its serving system follows the agent's state.

pub mod authority;
pub mod backend;
pub mod cli;
pub mod config;
pub mod coordinator;
pub mod load;
pub mod metrics;
pub mod mig_tools;
#[cfg(feature = "nvml")]
pub mod nvml;
pub mod nvml_codes;
pub mod procs;
pub mod reconcile;
pub mod runtime;
pub mod service;
pub mod state;
pub mod supervisor;
pub mod workload;
