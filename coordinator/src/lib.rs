//! # tessera-coordinator
//!
//! The control plane's replicated brain: a raft-rs `RawNode` driven by one task, with its log,
//! hard state and snapshots in sled; a state machine that applies `tessera_core::fleet::Command`s; tonic services
//! for tenants, fleet, plans and cluster membership; the leader-only planning loop that runs a `tessera-planner`
//! policy each window and pushes epoch-numbered targets to agents; OpenTelemetry traces of every decision.
//!
//! ## Modules
//! - [`replica`]: this member of the Raft group (one thread owns `RawNode`; proposals, read index, snapshots,
//!   membership). "Node" in Tessera means a GPU host; a coordinator process is a replica.
//! - [`storage`]: the durable log behind a trait: [`storage::SledStore`] and [`storage::MemStore`].
//! - [`wal`]: the Raft entries' own segment files, which [`storage::SledStore`] appends to and fdatasyncs;
//!   [`store_error`]: the errors of both.
//! - [`state`]: the replicated state machine ([`state::CoordState`]) and its operations.
//! - [`limits`]: what the server lets one caller take (sizes, streams, deadlines).
//! - [`net`]: every outgoing gRPC channel (keepalive, TCP user timeout, deadlines).
//! - [`transport`]: Raft messages between coordinators over tonic, with a test-only partition switch.
//! - [`routes`]: where each tenant is served now (its jobs' endpoints from the agents' heartbeats), for front ends.
//! - [`service`]: the gRPC services (API, agents, peers) and the one mapping of errors to `tonic::Status`.
//! - [`planning`]: the leader's planning loop, forecasts, pushes and decision spans.
//! - [`server`]: `coordinator serve`; [`client`]: the etcdctl-like client; [`config`]: the TOML file and flags.
//! - [`telemetry`]: tracing with OTLP export; [`metrics`]: Prometheus `/metrics`; [`logging`]: raft-rs logs into
//!   tracing.

pub mod client;
pub mod config;
pub mod dev_cluster;
pub mod limits;
pub mod logging;
pub mod metrics;
pub mod net;
pub mod planning;
pub mod replica;
pub mod routes;
pub mod server;
pub mod service;
pub mod state;
pub mod storage;
pub mod store_error;
/// Tracing and OTLP export (the `tessera-telemetry` crate, shared with the agent).
pub use tessera_telemetry as telemetry;
pub mod transport;
pub mod wal;
