//! # tessera-sim
//!
//! The simulated hardware every replay and most tests run on (DESIGN.md section 6): a MIG device state machine
//! with NVML's placement rules, errors and latencies; a workload executor under a virtual clock (inference queues
//! with dynamic batching, retraining progress, accuracy drift) that accounts goodput with `tessera-core`'s
//! definitions; and a trace-driven L3 TLB model (baseline and STAR) that turns co-location into slowdown. Its
//! binary, `sim-agent`, hosts many simulated nodes, each a real agent.
//!
//! Built by the sim-agent issue; the placement rules it must follow are `tessera_core::layout`.
