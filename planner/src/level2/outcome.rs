//! One GPU's level-2 result, as every policy's level 2 returns it to the round ([`crate::policy::plan_fleet`]), and
//! why incremental rounds solved a GPU again.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_core::Layout;
use tessera_core::ids::TenantId;
use tessera_core::sharing::Sharing;

use crate::input::WarmStart;
use crate::level2::problem::GpuProblem;
use crate::level2::realize::Placed;
use crate::level2::solver::SolveStatus;

/// One GPU's level-2 result.
#[derive(Debug, Clone)]
pub struct GpuOutcome {
    /// The problem solved.
    pub problem: GpuProblem,
    /// Its placed schedule.
    pub placed: Placed,
    /// Proven bound on the goodput of any plan (`f64::INFINITY` when unknown).
    pub bound: f64,
    /// Solver status.
    pub status: SolveStatus,
    /// What the policy wants an operator to read first.
    pub note: String,
    /// The layout the GPU keeps over the whole horizon when the policy holds instances that no assignment uses
    /// (fixed-layout baselines keep idle instances rather than destroy them); `None`: each slot's layout is that
    /// of its assignments.
    pub fixed_layout: Option<Layout>,
    /// Retraining configurations (epochs) the policy chose, where it chose other than the tenant's default.
    pub retraining_epochs: BTreeMap<TenantId, f64>,
    /// What the policy's next round on this GPU may start from, where it warm-starts.
    pub warm: Option<WarmStart>,
    /// How instances that hold one tenant's inference and retraining share them (the placed assignments put
    /// both roles on one placement only under a sharing mode).
    pub sharing: Sharing,
    /// Why incremental rounds solved the GPU again rather than keep its last plan, where it had one to keep
    /// ([`crate::input::PlannerConfig::replan_band`]).
    pub replanned: Option<Replan>,
}

impl GpuOutcome {
    /// An outcome whose layout follows its assignments and whose retraining uses each tenant's default epochs.
    pub fn new(problem: GpuProblem, placed: Placed, bound: f64, status: SolveStatus, note: String) -> GpuOutcome {
        GpuOutcome {
            problem,
            placed,
            bound,
            status,
            note,
            fixed_layout: None,
            retraining_epochs: BTreeMap::new(),
            sharing: Default::default(),
            warm: None,
            replanned: None,
        }
    }

    /// The layout of slot `t`.
    pub fn layout(&self, t: usize) -> Layout {
        self.fixed_layout.clone().unwrap_or_else(|| self.placed.layout(t))
    }
}

/// Why incremental rounds solve a GPU again rather than keep its last plan ([`crate::level2::goodput`]'s incremental rounds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Replan {
    /// Every slot the last plan covered is past, or it left no prices to bound it with.
    HorizonOut,
    /// The slots do not line up with the last plan's (another slot length, a plan from the future).
    SlotsMoved,
    /// A tenant arrived or left (level 1 moved one, or one was added or removed).
    Tenants,
    /// The GPU's health changed.
    Health,
    /// A tenant serves from another instance than the plan runs now (a failed or lagging reconfiguration).
    Instances,
    /// A retraining became due, or finished other than when the plan had it finish, or its epochs changed.
    RetrainingDue,
    /// A retraining runs where the plan did not start it, or does not run where the plan did.
    RetrainingRuns,
    /// The shifted plan starts a retraining now whose configuration this round chooses.
    RetrainingStarts,
    /// A tenant's forecast left the band its plan was made for.
    Forecast,
    /// The shifted plan is not feasible on this round's problem, or would drop part of itself to be (a profile that
    /// is no longer a candidate, a retraining that can no longer start or go on as planned).
    Infeasible,
}

impl Replan {
    /// Every reason, in order.
    pub const ALL: [Replan; 10] = [
        Replan::HorizonOut,
        Replan::SlotsMoved,
        Replan::Tenants,
        Replan::Health,
        Replan::Instances,
        Replan::RetrainingDue,
        Replan::RetrainingRuns,
        Replan::RetrainingStarts,
        Replan::Forecast,
        Replan::Infeasible,
    ];

    /// Its name, as JSON and reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Replan::HorizonOut => "horizon_out",
            Replan::SlotsMoved => "slots_moved",
            Replan::Tenants => "tenants",
            Replan::Health => "health",
            Replan::Instances => "instances",
            Replan::RetrainingDue => "retraining_due",
            Replan::RetrainingRuns => "retraining_runs",
            Replan::RetrainingStarts => "retraining_starts",
            Replan::Forecast => "forecast",
            Replan::Infeasible => "infeasible",
        }
    }
}

impl std::fmt::Display for Replan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Replan::HorizonOut => "the last plan's horizon ran out",
            Replan::SlotsMoved => "the slots moved against the last plan's",
            Replan::Tenants => "its tenants changed",
            Replan::Health => "its health changed",
            Replan::Instances => "a tenant serves from another instance than planned",
            Replan::RetrainingDue => "a retraining became due, or finished other than planned",
            Replan::RetrainingRuns => "a retraining runs otherwise than planned",
            Replan::RetrainingStarts => "a retraining whose configuration is chosen starts now",
            Replan::Forecast => "a forecast left its planned band",
            Replan::Infeasible => "the shifted plan is not feasible",
        })
    }
}
