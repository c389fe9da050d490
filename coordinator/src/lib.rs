//! # tessera-coordinator
//!
//! The control plane's replicated brain (DESIGN.md section 5): a raft-rs `RawNode` driven by one task, with its log,
//! hard state and snapshots in sled; a state machine that applies `tessera_core::fleet::Command`s; tonic services
//! for tenants, fleet, plans and cluster membership; the leader-only planning loop that runs a `tessera-planner`
//! policy each window and pushes epoch-numbered targets to agents; OpenTelemetry traces of every decision.
//!
//! Built by the coordinator issue. The state machine it will replicate is already complete in
//! `tessera_core::fleet`.
