//! # tessera-planner
//!
//! Pure policies over `tessera-core` (DESIGN.md section 4): given a `PlannerInput` snapshot (fleet with current
//! layouts and health, tenants with forecasts, accuracy and retraining progress, time, config), a `Policy` returns
//! a `Plan` or `Infeasible { reason }`.
//!
//! Modules: [`input`] (the snapshot and round settings), [`policy`] (the trait, the registry by name, the fleet
//! driver), [`assign`] (level 1: tenants to GPUs), [`problem`] and [`build`] (the per-GPU level-2 model),
//! [`cg`] (column generation, Tessera's level-2 solver), [`ilp`] (the compact MILP), [`exhaustive`] (the
//! cross-check), [`realize`] and [`evaluate`] (placements and their exact goodput), [`solver`] (MILP backends and
//! budgets), [`master`] (column generation's master LP), [`forecast`] (last value, EWMA, seasonal), [`synthetic`]
//! (seeded inputs), and one file per policy ([`tessera`], [`migrator`], [`oracle`], and the baselines
//! [`static_layout`] (`static`), [`paris`], [`ekya`], [`astraea`], with [`fixed`] for the fixed-layout ones).
//!
//! Deliberately not here: clocks, I/O, global randomness (seeds are passed in), and anything about how a plan is
//! carried out (that is the coordinator's and the agents' job).

pub mod assign;
pub mod astraea;
pub mod build;
pub mod cg;
pub mod ekya;
pub mod evaluate;
pub mod exhaustive;
pub mod fixed;
pub mod forecast;
pub mod ilp;
pub mod input;
pub mod master;
pub mod migrator;
pub mod oracle;
pub mod paris;
pub mod policy;
pub mod problem;
pub mod realize;
pub mod solver;
pub mod static_layout;
pub mod synthetic;
pub mod tessera;

pub use input::{PlannerConfig, PlannerInput};
pub use policy::{PlanOutcome, PlanReport, Policy, by_name};
