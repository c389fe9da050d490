//! # tessera-coordinator
//!
//! The control plane's replicated brain (DESIGN.md section 5): a raft-rs `RawNode` driven by one task, with its log,
//! hard state and snapshots in sled; a state machine that applies `tessera_core::fleet::Command`s; tonic services
//! for tenants, fleet, plans and cluster membership; the leader-only planning loop that runs a `tessera-planner`
//! policy each window and pushes epoch-numbered targets to agents; OpenTelemetry traces of every decision.

pub mod client;
pub mod config;
pub mod logging;
pub mod metrics;
pub mod node;
pub mod planning;
pub mod server;
pub mod service;
pub mod state;
pub mod storage;
pub mod telemetry;
pub mod transport;
