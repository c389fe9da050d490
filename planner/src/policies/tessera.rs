//! `tessera`: Tessera's policy.
//!
//! It starts from the MIGRator goodput MILP and adds what MIGRator lacks:
//! - **Fleet-wide level 1** ([`crate::assign::balanced`], the default `--placement` of every policy): sticky, memory-aware, demand-balanced, and spreading
//!   tenants that slow each other down when an interference table is given.
//! - **A formulation that solves in milliseconds** ([`crate::level2::ilp`]): profile counts against maximal count vectors
//!   instead of per-slice overlap rows, retraining as enumerated non-preemptive options instead of big-M progress.
//! - **Reconfiguration awareness**: only tenants whose instance changes are charged, and new instances are placed
//!   on slices free in the previous slot so they are pre-initialised (charged `dead_preinit_s`, not
//!   `dead_cold_s`); the count-level model charges the pre-initialised dead time, the evaluation charges the exact
//!   one ([`crate::level2::realize`], [`crate::level2::evaluate`]).
//! - **Forecast hedging**: level 2 maximises expected goodput over three arrival scenarios from the forecast band
//!   (low, mean, high), so capacity is sized for the band rather than its midpoint.
//! - **Warm starts** ([`crate::input::WarmStart`]): each GPU's next round starts from this round's plan, shifted
//!   to its slots (a candidate its search improves), and from the prices of this round's best bound (its first
//!   Lagrangian bound and stabilisation centre). A GPU whose situation barely moved proves its gap before solving
//!   a single master LP; plans stay as exact as cold ones, and keep more of what runs (fewer reconfigurations).
//! - **Accuracy beyond the horizon** ([`goodput::tail_values`]): a retraining completed within the horizon keeps paying after
//!   it, so level 2 credits it with the goodput its accuracy gain earns over half a retraining window at the
//!   horizon's last arrival rate. A planner that counts the horizon alone never starts a retraining that ends
//!   near the horizon's end, however many requests the better model would serve: on a heavy tenant it leaves the
//!   accuracy of most of the traffic to drift.
//! - **Retraining configurations chosen with the layout** ([`goodput::EPOCH_FACTORS`]): a due retraining may run at
//!   0.5x, 1x, 2x or 4x its default epochs, each with its own work and the accuracy the tenant's curve gives; level 2
//!   solves the GPU again for the configurations worth trying and keeps the one whose plan earns most, so idle
//!   slices buy accuracy and busy ones do not. The chosen epochs travel in the plan (`GpuPlan::retraining_epochs`)
//!   and a retraining under way keeps them.
//! - **Incremental rounds** ([`crate::input::PlannerConfig::replan_band`]): a GPU is solved again only when something
//!   its plan depends on moved beyond a band (a forecast, its tenants, a retraining's state, its health or
//!   instances) or its plan's horizon ran out; otherwise it keeps its last plan shifted forward, valued on this
//!   round's inputs and bounded at its prices. A planning round costs what changed, not the fleet's size.

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::Arrivals;
use crate::level2::goodput::{self, Features};
use crate::policy::{PlanError, PlanOutcome, Policy, plan_fleet_shared};

/// One of tessera's ideas switched off, for ablation studies (`tessera-*` policies).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ablation {
    /// Nothing switched off: tessera itself.
    #[default]
    None,
    /// Level 1 spreads tenants by demand ([`assign::spread`]) instead of the fleet placement.
    Spread,
    /// Level 2 plans for the forecast mean instead of the band.
    PointForecast,
    /// No accuracy credited beyond the horizon.
    NoTail,
    /// No warm start: every round solved cold.
    ColdStart,
    /// No replanning inside a window on bursts, even when the run asks for it.
    NoBurstReplans,
    /// Every retraining at the tenant's default epochs: no configuration chosen with the layout.
    DefaultEpochs,
    /// Every GPU solved every round, whatever the round's `replan_band`: no incremental rounds.
    FullRounds,
}

/// Tessera's policy, or one of its ablations.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tessera {
    /// What is switched off.
    pub ablation: Ablation,
}

impl Tessera {
    /// The ablation that switches `ablation` off.
    pub const fn without(ablation: Ablation) -> Tessera {
        Tessera { ablation }
    }
}

impl Policy for Tessera {
    fn name(&self) -> &'static str {
        match self.ablation {
            Ablation::None => "tessera",
            Ablation::Spread => "tessera-spread",
            Ablation::PointForecast => "tessera-point",
            Ablation::NoTail => "tessera-no-tail",
            Ablation::ColdStart => "tessera-cold",
            Ablation::NoBurstReplans => "tessera-no-burst",
            Ablation::DefaultEpochs => "tessera-default-epochs",
            Ablation::FullRounds => "tessera-full-rounds",
        }
    }

    fn replans_on_bursts(&self) -> bool {
        self.ablation != Ablation::NoBurstReplans
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let l1 = if self.ablation == Ablation::Spread { assign::spread(input, 7) } else { assign::place(input) };
        let arrivals = if self.ablation == Ablation::PointForecast { Arrivals::Point } else { Arrivals::Band };
        let features = Features {
            tail: self.ablation != Ablation::NoTail,
            warm: self.ablation != Ablation::ColdStart,
            share: true,
            epochs: self.ablation != Ablation::DefaultEpochs,
            incremental: self.ablation != Ablation::FullRounds,
        };
        plan_fleet_shared(self.name(), input, l1, |gpu, tenants, shared| {
            goodput::solve_with(input, gpu, tenants, arrivals, &input.config.solver, shared, features)
        })
    }
}
