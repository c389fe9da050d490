//! # tessera-planner
//!
//! Pure policies over `tessera-core` (DESIGN.md section 4): given a `PlannerInput` snapshot (fleet with current
//! layouts and health, tenants with forecasts, accuracy and retraining progress, time, config), a `Policy` returns
//! a `Plan` or `Infeasible { reason }`.
//!
//! Planned layout (filled by the planner and baselines issues): `policy` (the trait and the registry by name),
//! `forecast` (EWMA, seasonal), `assign` (level 1: tenants to GPUs), `ilp` (level 2: the per-GPU goodput ILP),
//! one file per policy (`tessera`, `migrator`, `oracle`, `static`, `paris`, `ekya`, `astraea`).
//!
//! Deliberately not here: clocks, I/O, global randomness (seeds are passed in), and anything about how a plan is
//! carried out (that is the coordinator's and the agents' job).

pub mod assign;
pub mod build;
pub mod cg;
pub mod evaluate;
pub mod exhaustive;
pub mod forecast;
pub mod ilp;
pub mod input;
pub mod migrator;
pub mod oracle;
pub mod policy;
pub mod problem;
pub mod realize;
pub mod solver;
pub mod synthetic;
pub mod tessera;

pub use input::{PlannerConfig, PlannerInput};
pub use policy::{PlanOutcome, PlanReport, Policy, by_name};
