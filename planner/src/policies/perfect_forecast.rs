//! `perfect-forecast`: tessera planning with the true future arrival rates: a reference, not a bound.
//!
//! The same optimisation as `tessera` (level 1 and level 2), given the true future arrivals in place of the
//! forecast (the band collapses onto the truth) and solved to a tighter gap (1e-4) with five times the budget.
//! It shows what perfect forecasts would be worth to tessera; it is **not** an upper bound on other policies: it plans
//! under the planner's fluid capacity model, one round at a time, on its own trajectory, and a policy can serve
//! more than it does in the simulator. The true upper bound is [`crate::bound`].

use crate::assign;
use crate::forecast::Forecast;
use crate::input::PlannerInput;
use crate::level2::build::Arrivals;
use crate::level2::goodput::{self, Features};
use crate::level2::solver::SolverConfig;
use crate::policy::{PlanError, PlanOutcome, Policy, plan_fleet_shared};

/// The perfect-forecast reference.
#[derive(Debug, Clone, Copy, Default)]
pub struct PerfectForecast;

/// `input` with every forecast replaced by the true arrivals (where the input has them).
pub fn clairvoyant(input: &PlannerInput) -> PlannerInput {
    let mut input = input.clone();
    for t in input.tenants.values_mut() {
        if let Some(actual) = &t.actual {
            t.forecast = Forecast { mean: actual.clone(), low: actual.clone(), high: actual.clone() };
        }
    }
    input
}

impl Policy for PerfectForecast {
    fn name(&self) -> &'static str {
        "perfect-forecast"
    }

    fn sees_truth(&self) -> bool {
        true
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let truth = clairvoyant(input);
        let l1 = assign::place(&truth);
        let solver = SolverConfig {
            time_limit_s: truth.config.solver.time_limit_s * 5.0,
            mip_rel_gap: 1e-4,
            max_nodes: truth.config.solver.max_nodes.saturating_mul(5),
            ..truth.config.solver
        };
        plan_fleet_shared(self.name(), &truth, l1, |gpu, tenants, shared| {
            // A reference solves every GPU every round: it keeps no plan for a cheaper round.
            let features = Features { incremental: false, ..Features::ALL };
            goodput::solve_with(&truth, gpu, tenants, Arrivals::Actual, &solver, shared, features)
        })
    }
}
