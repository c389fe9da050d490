//! `tessera`: Tessera's policy.
//!
//! It starts from the MIGRator goodput MILP and adds what MIGRator lacks:
//! - **Fleet-wide level 1** ([`crate::assign::balanced`]): sticky, memory-aware, demand-balanced, and spreading
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

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::Arrivals;
use crate::level2::goodput;
use crate::policy::{PlanError, PlanOutcome, Policy, plan_fleet};

/// Tessera's policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Tessera;

impl Policy for Tessera {
    fn name(&self) -> &'static str {
        "tessera"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let l1 = assign::balanced(input);
        plan_fleet(self.name(), input, l1, |gpu, tenants| {
            goodput::solve(input, gpu, tenants, Arrivals::Band, &input.config.solver)
        })
    }
}
