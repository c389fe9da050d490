//! # tessera-core
//!
//! The pure domain model every other Tessera crate stands on: what a MIG GPU is, which layouts are valid, how to go
//! from one layout to another, what tenants and models are, how goodput is counted, and the replicated fleet state
//! with the commands that change it.
//!
//! ## Modules
//! - [`catalog`]: GPU models, GPU-instance profiles (IDs, names, slices, SMs, copy engines, memory), placements and
//!   compute-instance profiles, exactly as the NVIDIA MIG User Guide gives them.
//! - [`driver`]: the profile table as a GPU's driver reports it, and its differences from the catalog.
//! - [`layout`]: `Placement { profile, start }` and `Layout`, with validation that explains what is wrong.
//! - [`enumerate`]: all valid and all maximal layouts of a model.
//! - [`reconfig`]: `diff(current, target)`: ordered, always-valid reconfiguration steps with time and disruption.
//! - [`migparted`]: NVIDIA mig-parted YAML import (with explicit placements) and export.
//! - [`jobs`]: how a tenant's serve and retrain jobs run on a real node (command or container, readiness, drain,
//!   stop, checkpoint), with templates.
//! - [`model`], [`accuracy`], [`tenant`], [`goodput`]: the continuous-learning workload model.
//! - [`plan`]: what the planner decides (per-GPU layout and assignments).
//! - [`serving`]: how requests reach instances (dispatch rules, batching window, dead times) as planner and
//!   simulator both assume them.
//! - [`sharing`]: a tenant's inference and retraining on one instance (time-sliced or Tally's priority), the
//!   model planner and simulator share.
//! - [`fleet`]: the fleet state machine `apply(state, command) -> Result<Event, Rejected>`.
//! - [`invariants`]: the invariants as functions, each with why it must hold.
//! - [`config`]: TOML configuration, parsed raw then validated, with errors naming file and field.
//! - [`ids`], [`time`]: identifier newtypes and explicit workload time.
//!
//! ## What it does not do
//! No I/O beyond reading a config file it is asked to read, no async, no clock (time is a [`time::SimTime`]
//! argument), no global random number generator, no logging. Policies live in `tessera-planner`, the simulated
//! hardware in `tessera-sim`, and everything that talks to a network in the service crates.

/// Gives a type with `Display` and `FromStr` its string form in serde (`#[serde(try_from = "String", into =
/// "String")]`): `TryFrom<String>` through `FromStr`, `From<T> for String` through `Display`.
#[macro_export]
#[doc(hidden)]
macro_rules! string_serde {
    ($t:ty) => {
        impl TryFrom<String> for $t {
            type Error = <$t as std::str::FromStr>::Err;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                s.parse()
            }
        }

        impl From<$t> for String {
            fn from(v: $t) -> String {
                v.to_string()
            }
        }
    };
}

pub mod accuracy;
pub mod catalog;
pub mod config;
pub mod driver;
pub mod enumerate;
pub mod fleet;
pub mod goodput;
pub mod ids;
pub mod invariants;
pub mod jobs;
pub mod layout;
pub mod migparted;
pub mod model;
pub mod plan;
pub mod reconfig;
pub mod serving;
pub mod sharing;
pub mod tenant;
pub mod time;

pub use catalog::{GpuModel, Profile};
pub use layout::{Layout, Placement};
