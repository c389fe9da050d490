//! # tessera-planner
//!
//! Pure policies over `tessera-core`: given a [`PlannerInput`] snapshot (fleet with current layouts and health,
//! tenants with forecasts, accuracy and retraining progress, time, config), a [`Policy`] returns a plan or
//! `Infeasible { reason }`.
//!
//! Modules: [`input`] (the snapshot and round settings), [`policy`] (the trait and the fleet driver every policy
//! shares), [`policies`] (one file per policy, and the registry by name), [`round`] (one planning round and the
//! settings of the planning loop, shared by the coordinator and replay), [`assign`] (level 1: tenants to GPUs),
//! [`level2`] (the per-GPU toolkit: problem, MILP, column generation, placement, evaluation and the helpers several
//! policies use), [`forecast`] (last value, EWMA, seasonal), [`synthetic`] (seeded inputs) and [`error`] (bad
//! settings and inputs, by field). The formulation is
//! in `docs/planner.md`.
//!
//! Deliberately not here: clocks, I/O, global randomness (seeds are passed in), and anything about how a plan is
//! carried out (that is the coordinator's and the agents' job).

pub mod assign;
pub mod bound;
pub mod error;
pub mod forecast;
pub mod input;
pub mod level2;
pub mod policies;
pub mod policy;
pub mod round;
pub mod settings;
pub mod synthetic;

pub use input::{PlannerConfig, PlannerInput};
pub use policies::by_name;
pub use policy::{PlanOutcome, PlanReport, Policy};
