//! `ekya`: Ekya's thief scheduler, on MIG slices.
//!
//! **Original** (Bhardwaj et al., NSDI 2022). Per retraining
//! window (200 s) and per video stream, Ekya chooses a retraining configuration (or none), an inference
//! configuration and GPU shares for both, maximising the accuracy averaged over the window: the old model's
//! accuracy while retraining runs, the new one's after it completes. The **thief scheduler** starts from a fair
//! split of the GPUs over all jobs and, for each (thief, victim) pair, repeatedly moves `delta = 0.1` GPU from the
//! victim to the thief while the estimated average accuracy improves. It re-runs at each window start and when a
//! retraining job completes. Accuracy after retraining is estimated from micro-profiling with the Optimus curve
//! `acc(x) = 1 - (1 / (b0 x + b1) + b2)`.
//!
//! **Adapted to MIG**:
//! - `delta` is one compute slice; a job's slices map to the largest profile with at most that many slices that
//!   it can use, and when the set does not fit one GPU, the job whose downgrade costs least estimated accuracy
//!   steps down to the next smaller profile until it does (the nearest valid layout).
//! - Inference "configurations" on MIG are instance sizes: requests an instance cannot serve within the SLO count
//!   as served at accuracy 0, so a stream's estimated accuracy is `served fraction x window-averaged model
//!   accuracy`, averaged over streams **unweighted** (Ekya maximises mean accuracy across streams, not goodput).
//! - Retraining configurations are the tenant's default epochs scaled by [`EPOCH_CHOICES`], each estimated by its
//!   Optimus curve and work (the micro-profiling result Ekya would fit); the chosen epochs travel in the plan
//!   (`GpuPlan::retraining_epochs`). A job already under way keeps its configuration (the input's
//!   `TenantInput::retraining_epochs`, whose work and accuracy the round plans with, restated in the plan) and its
//!   instance (MIG retraining does not migrate without a restart).
//! - Level 1 is the fleet placement every per-GPU policy gets ([`crate::assign::place`], `--placement`); each GPU
//!   runs its own thief scheduler.
//! - Re-planned only at window boundaries and when a job completes: between those, a round keeps the GPU's
//!   current instances when they still serve every tenant.
//!
//! **Parameters.** Window [`Ekya::window_s`] = 200 s (the paper's); delta = 1 compute slice; epochs x {0.5, 1, 2}.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use std::collections::BTreeMap;

use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::Role;

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::problem::{GpuProblem, describe_retraining};
use crate::level2::realize::realize;
use crate::level2::solver::{SolveError, SolveStatus};
use crate::level2::thief::{self, Allocation, Config, run_horizon};
use crate::policy::{GpuOutcome, PlanError, PlanOutcome, Policy, plan_fleet};

/// Retraining configurations: the tenant's default epochs times these.
pub const EPOCH_CHOICES: [f64; 3] = [0.5, 1.0, 2.0];

/// The Ekya policy.
#[derive(Debug, Clone, Copy)]
pub struct Ekya {
    /// Retraining window, seconds.
    pub window_s: f64,
}

impl Default for Ekya {
    fn default() -> Ekya {
        Ekya { window_s: thief::WINDOW_S }
    }
}

impl Policy for Ekya {
    fn name(&self) -> &'static str {
        "ekya"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let l1 = assign::place(input);
        plan_fleet(self.name(), input, l1, |gpu, tenants| self.level2(input, gpu, tenants))
    }
}

impl Ekya {
    fn level2(
        &self,
        input: &PlannerInput,
        gpu: &GpuId,
        tenants: &[TenantId],
    ) -> Result<Option<GpuOutcome>, SolveError> {
        if tenants.is_empty() {
            return Ok(None);
        }
        let mut pb = gpu_problem(input, gpu, tenants, Arrivals::Point);
        let n = pb.tenants.len();
        let now_s = input.now.as_ms() as f64 / 1000.0;
        // Configurations each tenant may start.
        let configs: Vec<Vec<Config>> = pb
            .tenants
            .iter()
            .map(|t| {
                let ti = &input.tenants[&t.id];
                let (Some(r), Some(task)) = (&ti.spec.retraining, &t.retrain) else { return Vec::new() };
                if task.running_on.is_some() || ti.retraining_done_gpu_s > 0.0 {
                    return Vec::new();
                }
                EPOCH_CHOICES
                    .iter()
                    .map(|f| {
                        let epochs = r.epochs * f;
                        Config { epochs, work_s: r.work_for_epochs(epochs), accuracy: r.accuracy_after(epochs) }
                    })
                    .filter(|c| c.accuracy > t.acc_old)
                    .collect()
            })
            .collect();
        let defaults: Vec<Config> = (0..n)
            .map(|i| {
                let t = &pb.tenants[i];
                // A job under way runs at the epochs its plan chose (`TenantInput::retraining_epochs`): its work
                // left and the accuracy it reaches are that configuration's.
                Config {
                    epochs: input.tenants[&t.id].epochs(),
                    work_s: t.retrain.as_ref().map_or(0.0, |r| r.work_s),
                    accuracy: t.acc_new,
                }
            })
            .collect();
        let keep = self.keep(input, gpu, &pb);
        let run = run_horizon(&pb, now_s, self.window_s, &configs, &defaults, keep);
        let (schedule, started, replans, last_value) = (run.schedule, run.configs, run.replans, run.value);
        // The problem evaluates the configurations Ekya chose.
        let mut epochs = BTreeMap::new();
        // A job under way is started with its own configuration (`defaults`), so the plan restates its epochs: the
        // executor takes those of the latest plan that gives the tenant a retraining instance.
        for i in 0..n {
            if let Some(c) = started[i]
                && let Some(r) = pb.tenants[i].retrain.as_mut()
            {
                r.work_s = c.work_s;
                pb.tenants[i].acc_new = c.accuracy;
                let default = input.tenants[&pb.tenants[i].id].spec.retraining.as_ref().map(|r| r.epochs);
                if default != Some(c.epochs) {
                    epochs.insert(pb.tenants[i].id.clone(), c.epochs);
                }
            }
        }
        let placed = realize(&pb, &schedule);
        let objective = crate::level2::evaluate::goodput(&pb, &placed);
        let note = format!(
            "thief scheduler ({} run(s) in the horizon, estimated mean window accuracy {:.3}); {}",
            replans,
            last_value,
            describe_retraining(&pb, &schedule)
        );
        let mut out = GpuOutcome::new(pb, placed, objective, SolveStatus::Rule, note);
        out.retraining_epochs = epochs;
        Ok(Some(out))
    }

    /// Between window boundaries, the current instances when they still serve every tenant and no job has just
    /// completed (a tenant still holds a retraining instance with nothing left to do).
    fn keep(&self, input: &PlannerInput, gpu: &GpuId, pb: &GpuProblem) -> Option<Allocation> {
        let now_s = input.now.as_ms() as f64 / 1000.0;
        if now_s.rem_euclid(self.window_s) < pb.slot_s - 1e-9 {
            return None;
        }
        let g = &input.gpus[gpu];
        let mut inference = Vec::new();
        let mut retraining = Vec::new();
        for t in &pb.tenants {
            let inf = g.instance_of(&t.id, Role::Inference).and_then(|a| pb.profile_index(a.placement.profile))?;
            inference.push(Some(inf));
            let holds = g.instance_of(&t.id, Role::Retraining).is_some();
            match &t.retrain {
                Some(r) if r.running_on.is_some() => retraining.push(None),
                _ if holds => return None, // a job completed: Ekya re-plans
                _ => retraining.push(None),
            }
        }
        Some(Allocation { inference, retraining, value: 0.0 })
    }
}
