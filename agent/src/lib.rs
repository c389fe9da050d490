//! # tessera-agent
//!
//! The node agent (DESIGN.md section 6): it will own the `MigBackend` trait (NVML behind the `nvml` feature, or
//! the simulator), the reconcile loop from desired to observed layout, its gRPC service and its coordinator client.
//! Those arrive with the agent-runtime issue.
//!
//! Today it carries the operator tools of the `agent mig` subcommands ([`mig_tools`]): the profile table of a GPU
//! model, the enumeration of valid and maximal layouts, validation, reconfiguration diffs and mig-parted import and
//! export. They need no GPU: they are `tessera-core` rendered for people and scripts.

pub mod mig_tools;
