//! `oracle`: the clairvoyant upper bound.
//!
//! The same optimisation as `tessera` (level 1 and level 2), given the true future arrivals in place of the
//! forecast (the band collapses onto the truth) and solved to a tighter gap with a longer time limit. Replay
//! divides every policy's goodput by the oracle's; a test checks that no policy beats it on the same input.

use crate::assign;
use crate::build::Arrivals;
use crate::forecast::Forecast;
use crate::input::PlannerInput;
use crate::policy::{PlanError, PlanOutcome, Policy, plan_fleet};
use crate::solver::SolverConfig;
use crate::tessera::level2;

/// The clairvoyant policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Oracle;

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

impl Policy for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let input = clairvoyant(input);
        let l1 = assign::balanced(&input);
        let solver = SolverConfig {
            time_limit_s: input.config.solver.time_limit_s * 5.0,
            mip_rel_gap: 1e-4,
            ..input.config.solver
        };
        plan_fleet(self.name(), &input, l1, |gpu, tenants| level2(&input, gpu, tenants, Arrivals::Actual, &solver))
    }
}
