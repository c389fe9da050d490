//! `oracle`: the clairvoyant upper bound.
//!
//! The same optimisation as `tessera` (level 1 and level 2), given the true future arrivals in place of the
//! forecast (the band collapses onto the truth) and solved to a tighter gap with a longer time limit. Level 2 is a
//! heuristic on large GPUs (see [`crate::level2::cg`]), so a policy planning from a forecast can, by luck, land on a plan
//! that is better under the truth; the clairvoyant therefore also evaluates the plans of every other policy under
//! the true arrivals and returns the best plan it knows of. Its own level 2 optimises Tessera's planning value (the
//! retraining tail included), but it keeps whichever plan has the most goodput within the horizon under the truth:
//! that is what it bounds. It is thus an upper bound on every policy by
//! construction, and a lower bound on the true clairvoyant optimum (each GPU's level-2 bound, reported beside it,
//! bounds that from above). Replay divides every policy's goodput by the oracle's; a test checks that no policy
//! beats it on the same input.

use crate::assign;
use crate::forecast::Forecast;
use crate::input::PlannerInput;
use crate::level2::build::Arrivals;
use crate::level2::goodput;
use crate::level2::solver::SolverConfig;
use crate::policies::REGISTRY;
use crate::policy::{PlanError, PlanOutcome, Policy, plan_fleet};

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

    fn sees_truth(&self) -> bool {
        true
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let truth = clairvoyant(input);
        let l1 = assign::balanced(&truth);
        let solver = SolverConfig {
            time_limit_s: truth.config.solver.time_limit_s * 5.0,
            mip_rel_gap: 1e-4,
            max_nodes: truth.config.solver.max_nodes.saturating_mul(5),
            ..truth.config.solver
        };
        let own = plan_fleet(self.name(), &truth, l1, |gpu, tenants| {
            goodput::solve(&truth, gpu, tenants, Arrivals::Actual, &solver)
        })?;
        let PlanOutcome::Planned(mut best) = own else { return Ok(own) };
        let mut best_value = best.goodput_under_truth(input);
        for entry in REGISTRY.iter().filter(|e| e.name != self.name()) {
            let other_policy = (entry.make)();
            if other_policy.sees_truth() {
                continue;
            }
            let Ok(PlanOutcome::Planned(other)) = other_policy.plan(input) else {
                continue;
            };
            let name = entry.name;
            let value = other.goodput_under_truth(input);
            if value > best_value {
                best_value = value;
                best = other;
                best.plan.policy = self.name().to_string();
                for g in best.plan.gpus.values_mut() {
                    g.explanation = format!("{}: clairvoyant pick of {name}'s plan; {}", self.name(), g.explanation);
                }
            }
        }
        Ok(PlanOutcome::Planned(best))
    }
}
