//! Level 2: the per-GPU toolkit every policy plans with.
//!
//! - [`problem`] and [`build`]: one GPU's planning problem (slots over a horizon, tenants with capacities per
//!   profile, arrival scenarios, retraining options) built from a [`crate::PlannerInput`] and level 1's choice.
//! - [`ilp`]: the compact count-level MILP; [`cg`] and [`master`]: the same model by column generation (pricing,
//!   pair moves, starts, heuristics, the HiGHS fallback); [`exhaustive`]: the cross-check on small problems;
//!   [`solver`]: MILP backends, budgets, statuses and gaps; [`shared`]: one solve for the GPUs of a round whose
//!   problems are the same up to the tenants' names.
//! - [`realize`]: a count-level schedule placed on slices; [`evaluate`]: its exact goodput; [`outcome`]: a GPU's
//!   result, as the round takes it.
//! - [`goodput`]: the goodput plan with warm starts and the retraining tail (what `tessera` and the
//!   perfect-forecast reference plan with); [`thief`]: Ekya's thief scheduler (Ekya's plan, and one of
//!   tessera's starts); [`fixed`]: fixed layouts over a horizon (`static`, `paris`).
//!
//! The formulation is written out in `docs/planner.md`.

pub mod build;
pub mod cg;
pub mod evaluate;
pub mod exhaustive;
pub mod fixed;
pub mod goodput;
pub mod ilp;
pub mod master;
pub mod outcome;
pub mod problem;
pub mod realize;
pub mod shared;
pub mod solver;
pub mod thief;
