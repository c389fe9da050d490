//! Solves shared within a planning round: GPUs whose problems are the same up to the tenants' names share one
//! column-generation solve.
//!
//! A fleet's first round often holds many such GPUs: tenants added together with the same model, SLO, declared
//! demand and retraining (replicas of one service, or a capacity study's archetypes) have the same forecast until
//! they have a history of their own, and level 1 spreads them over GPUs of one model that all start empty. Every
//! one of them would be solved again from scratch, to the same plan.
//!
//! [`cg::solve_warm`] reads nothing but the problem, the solver's settings, the seeds and the start prices, and
//! knows tenants only by their position: a tenant's name never reaches it. So two calls whose inputs agree once the
//! names are blanked return the same result, bit for bit, and [`SharedSolves`] answers the second from the first.
//! A round's plans, bounds and statuses are exactly those it makes without sharing; only the time differs.
//!
//! Inputs are compared by a 128-bit digest of their serialised form, under keys drawn at random for each
//! [`SharedSolves`] (two SipHash-1-3 states of [`RandomState`]): without the keys, no input can be built to collide
//! with another, and by chance two of the round's few thousand solves collide with odds below 2^-100.
//!
//! Tenants match by position, in the order level 1 lists them: two GPUs holding the same tenants in another order do
//! not share (solving every GPU in a canonical order would let them, but would change every plan's tie-breaks).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher, RandomState};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use serde::Serialize;
use tessera_core::ids::TenantId;

use crate::level2::cg::{self, WarmSolved};
use crate::level2::problem::{GpuProblem, Schedule};
use crate::level2::solver::{SolveError, SolverConfig};

/// One solve's result, computed once for every GPU that asks for it.
type Cell = Arc<OnceLock<Result<WarmSolved, SolveError>>>;

/// The solves of one planning round, shared between GPUs whose inputs are the same up to the tenants' names (see
/// the module doc). Safe to use from many threads at once: a GPU asking for a solve another is running waits for it.
/// A level-2 solve must not itself wait on the thread pool that runs the GPUs (it does not), or a thread could
/// wait on itself.
#[derive(Debug)]
pub struct SharedSolves {
    /// The digest's two keyed hash states.
    keys: [RandomState; 2],
    /// Results by digest.
    solves: Mutex<HashMap<u128, Cell>>,
    /// Solves asked for.
    asked: AtomicUsize,
    /// Of those, answered from another GPU's solve.
    shared: AtomicUsize,
}

impl Default for SharedSolves {
    fn default() -> Self {
        SharedSolves {
            keys: [RandomState::new(), RandomState::new()],
            solves: Mutex::default(),
            asked: AtomicUsize::new(0),
            shared: AtomicUsize::new(0),
        }
    }
}

/// What a solve reads, as digested.
#[derive(Serialize)]
struct Inputs<'a> {
    problem: &'a GpuProblem,
    config: &'a SolverConfig,
    seeds: &'a [Schedule],
    prices: Option<&'a [Vec<f64>]>,
}

/// Feeds serialised bytes to the digest's two hash states.
struct Digest<H>([H; 2]);

impl<H: Hasher> std::io::Write for Digest<H> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.iter_mut().for_each(|h| h.write(bytes));
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl SharedSolves {
    /// [`cg::solve_warm`], or the result of an earlier call whose inputs were the same up to the tenants' names.
    pub fn solve_warm(
        &self,
        pb: &GpuProblem,
        config: &SolverConfig,
        seeds: &[Schedule],
        prices: Option<&[Vec<f64>]>,
    ) -> Result<WarmSolved, SolveError> {
        let key = self.digest(pb, config, seeds, prices);
        let cell: Cell = self.solves.lock().unwrap_or_else(PoisonError::into_inner).entry(key).or_default().clone();
        let mut solved_here = false;
        let result = cell
            .get_or_init(|| {
                solved_here = true;
                cg::solve_warm(pb, config, seeds, prices)
            })
            .clone();
        self.asked.fetch_add(1, Ordering::Relaxed);
        if !solved_here {
            self.shared.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// Solves asked for so far, and how many of them another GPU's solve answered.
    pub fn counts(&self) -> (usize, usize) {
        (self.asked.load(Ordering::Relaxed), self.shared.load(Ordering::Relaxed))
    }

    /// The digest of a solve's inputs with the tenants' names blanked.
    fn digest(&self, pb: &GpuProblem, config: &SolverConfig, seeds: &[Schedule], prices: Option<&[Vec<f64>]>) -> u128 {
        let mut problem = pb.clone();
        let blank = TenantId::new("tenant").expect("a valid tenant id");
        problem.tenants.iter_mut().for_each(|t| t.id = blank.clone());
        let mut digest = Digest([self.keys[0].build_hasher(), self.keys[1].build_hasher()]);
        let inputs = Inputs { problem: &problem, config, seeds, prices };
        serde_json::to_writer(&mut digest, &inputs).expect("level-2 inputs serialise");
        let [a, b] = digest.0;
        (u128::from(a.finish()) << 64) | u128::from(b.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::level2::build::{Arrivals, gpu_problem};
    use crate::level2::goodput;
    use crate::policy::PlanOutcome;
    use crate::synthetic::{SyntheticSpec, input_with_archetypes};
    use crate::{PlannerConfig, PlannerInput};

    fn fleet(gpus: usize, tenants: usize, archetypes: usize) -> PlannerInput {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
        let models = tessera_core::config::load_model_dir(&dir).expect("the bundled models load");
        let spec = SyntheticSpec { gpus, tenants, slots: 6, gpu_model: tessera_core::GpuModel::A100_40GB, seed: 4 };
        input_with_archetypes(&spec, archetypes, &models, PlannerConfig::default())
    }

    /// On a fleet of replicated tenants the round shares solves, and every GPU's plan and bound are those it gets
    /// solved alone.
    #[test]
    fn a_shared_round_plans_every_gpu_as_it_would_alone() {
        let input = fleet(8, 24, 3);
        let policy = crate::policies::by_name("tessera").expect("tessera is registered");
        let PlanOutcome::Planned(report) = policy.plan(&input).expect("plans") else { panic!("infeasible") };
        assert!(
            report.stats.shared_solves > 0,
            "no solve shared: {:?}",
            (report.stats.solves, report.stats.shared_solves)
        );
        assert!(report.stats.shared_solves < report.stats.solves);
        for (gpu, outcome) in &report.outcomes {
            let tenants: Vec<TenantId> = outcome.problem.tenants.iter().map(|t| t.id.clone()).collect();
            let alone = goodput::solve(&input, gpu, &tenants, Arrivals::Band, &input.config.solver)
                .expect("solves")
                .expect("the GPU has tenants");
            assert_eq!(alone.placed, outcome.placed, "{gpu}");
            assert_eq!(alone.bound.to_bits(), outcome.bound.to_bits(), "{gpu}");
            assert_eq!(alone.retraining_epochs, outcome.retraining_epochs, "{gpu}");
        }
    }

    /// The same problem under other names is answered from the first solve, with the same result; a problem that
    /// differs in one rate is solved on its own.
    #[test]
    fn renamed_problems_share_a_solve_and_others_do_not() {
        let input = fleet(1, 3, 0);
        let (gpu, _) = input.gpus.iter().next().expect("one GPU");
        let tenants: Vec<TenantId> = input.tenants.keys().cloned().collect();
        let pb = gpu_problem(&input, gpu, &tenants, Arrivals::Band);
        let config = SolverConfig::default();
        let shared = SharedSolves::default();
        let first = shared.solve_warm(&pb, &config, &[], None).expect("solves");
        let mut renamed = pb.clone();
        for (i, t) in renamed.tenants.iter_mut().enumerate() {
            t.id = TenantId::new(format!("other-{i}")).expect("valid id");
        }
        let again = shared.solve_warm(&renamed, &config, &[], None).expect("solves");
        assert_eq!(shared.counts(), (2, 1));
        assert_eq!(again.solved.schedule, first.solved.schedule);
        assert_eq!(again.solved.objective.to_bits(), first.solved.objective.to_bits());
        assert_eq!(again.prices, first.prices);
        let mut other = pb.clone();
        other.tenants[0].scenarios[0].rate[0] *= 1.5;
        let alone = shared.solve_warm(&other, &config, &[], None).expect("solves");
        assert_eq!(shared.counts(), (3, 1));
        let unshared = cg::solve_warm(&other, &config, &[], None).expect("solves");
        assert_eq!(alone.solved.schedule, unshared.solved.schedule);
        assert_eq!(alone.solved.objective.to_bits(), unshared.solved.objective.to_bits());
    }
}
