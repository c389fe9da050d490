//! # tessera-sim
//!
//! The simulated hardware every replay and most tests run on: a MIG device state machine
//! with NVML's placement rules, errors and latencies; a workload executor under a virtual clock (inference queues
//! with dynamic batching, retraining progress, accuracy drift) that accounts goodput with `tessera-core`'s
//! definitions; and a trace-driven L3 TLB model (baseline and STAR) that turns co-location into slowdown. Its
//! binary, `sim-agent`, hosts many simulated nodes, each a real agent.
//!
//! The placement rules it follows are `tessera_core::layout`'s; nothing here restates them.
//!
//! ## Modules
//! - [`device`]: the simulated MIG device: [`device::SimGpu`] (state machine, time as an argument) and
//!   [`device::SimBackend`] (the agent's `MigBackend` over simulated GPUs, with a virtual or wall clock).
//! - [`tlb`]: the L3 TLB interference model (baseline and STAR): [`tlb::TlbModel`] caches per-mix reports of
//!   hit rates, sub-entry utilisation and per-tenant slowdowns; [`tlb::simulate`] runs one.
//! - [`executor`]: the workload executor under a virtual clock: [`executor::Executor`] applies plans per GPU with
//!   the device's latencies, batches and serves inference requests, advances retraining and accounts goodput.
//! - [`node`]: simulated nodes for `sim-agent run`: each a real agent (`tessera-agent`'s reconcile loop, gRPC
//!   service and coordinator client) over persisted simulated GPUs and a workload tracker.
//! - [`shared_node`]: simulated nodes over one shared executor, each a real agent that hands whole targets to
//!   the executor (replay's cluster mode).
//! - [`standin`]: stand-in workloads (binary `standin`): an inference server and a retraining job as real
//!   processes, with no GPU, that model readiness, draining and checkpoints for tests of the agent's job supervisor.

/// The agent runtime the simulated nodes run (its reconciler, gRPC service and command-line conventions), for
/// crates that host simulated nodes through this one (replay's cluster mode).
pub use tessera_agent as agent;

pub mod device;
pub mod executor;
pub mod node;
pub mod share;
pub mod shared_node;
pub mod standin;
pub mod tlb;
