//! # tessera-agent
//!
//! The node agent (DESIGN.md section 6): it will own the reconcile loop from desired to observed layout, its gRPC
//! service and its coordinator client (the agent-runtime issue), over a [`backend::MigBackend`].
//!
//! ## Modules
//! - [`backend`]: the `MigBackend` trait (list GPUs, read instances, create at an explicit placement, destroy, set
//!   the MIG mode) with NVML-shaped errors. Implemented by the simulator in `tessera-sim`; the NVML backend (feature
//!   `nvml`) comes with the agent runtime.
//! - [`mig_tools`]: the operator tools below.
//!
//! It also carries the operator tools of the `agent mig` subcommands ([`mig_tools`]): the profile table of a GPU
//! model, the enumeration of valid and maximal layouts, validation, reconfiguration diffs and mig-parted import and
//! export. They need no GPU: they are `tessera-core` rendered for people and scripts.

pub mod backend;
pub mod cli;
pub mod mig_tools;
