//! A true upper bound on the goodput any policy can measure on a run, computed from the trace itself.
//!
//! Goodput is the sum, over requests completed within their SLO, of the accuracy of the model version that served
//! them. The bound relaxes everything a policy has to get right, so that no policy, in either executor, can exceed
//! it by construction (`docs/evaluation.md` states it in full):
//!
//! - **Accuracy**: every request is credited with the best accuracy its tenant could ever reach,
//!   `max(initial, acc(e_max))`, where `e_max` is the epochs the whole fleet could retrain in one retraining window
//!   (every GPU filled with the instances that retrain fastest per slice, all at once; a retraining cannot span
//!   windows) and `acc` the tenant's Optimus curve. Tenants that never retrain are credited 1. Retraining uses no
//!   capacity in the bound.
//! - **Capacity**: instances are fractional and free to change every instant, with zero reconfiguration cost, no
//!   interference, no warm-up; only the fleet's compute and memory slices (7 and 8 per GPU, per GPU model) are
//!   shared. An instance of profile `p` completes at most `r dt + b` requests within SLO in a slot of `dt` seconds,
//!   where `r = max_b b / L(b)` over batches whose latency `L(b)` alone meets the SLO (100 % of what it can serve
//!   within SLO, with no queueing) and `b` the largest such batch (one batch straddling the slot's end).
//! - **Demand**: requests are counted in the slot where the batch that served them started (and credited with the
//!   accuracy of that moment, as the simulator credits them). A request served within SLO by a batch started in slot
//!   `s` arrived in slot `s` or within its SLO before the slot began (the tail `T` of slot `s - 1`), and the requests
//!   served by batches started by the end of any slot never exceed those that had arrived.
//!
//! The result is a linear programme per block of slots (blocks are independent: each starts with its previous
//! block's tail as carry-in), solved with HiGHS.
//!
//! A second bound charges retraining for the slices it takes ([`lagrangian`]): a Lagrangian relaxation of the
//! fleet's compute slices whose value, at any prices, is a bound. The reported bound is the smaller of the two.

mod lagrangian;

use std::collections::BTreeMap;

use good_lp::{Expression, ProblemVariables, Variable, variable};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tessera_core::GpuModel;
use tessera_core::ids::GpuId;
use tessera_core::model::ModelProfile;
use tessera_core::tenant::TenantSpec;

use crate::level2::solver::{Backend, SolveError, SolveStatus, SolverConfig, maximise};

/// Why no bound could be computed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BoundError {
    /// The demand does not match the tenants.
    #[error("demand has {got} tenants, expected {expected}")]
    Tenants {
        /// Tenants in the demand.
        got: usize,
        /// Tenants given.
        expected: usize,
    },
    /// The demand's slot length is not positive.
    #[error("demand.slot_ms must be > 0 (got {0})")]
    Slot(f64),
    /// A tenant's model has no profile.
    #[error("tenant {tenant}: unknown model {model:?}")]
    UnknownModel {
        /// The tenant.
        tenant: String,
        /// Its model.
        model: String,
    },
    /// A block's linear programme failed.
    #[error("slots {from}..{to}: {source}")]
    Solve {
        /// First slot of the block.
        from: usize,
        /// One past its last slot.
        to: usize,
        /// Why.
        source: SolveError,
    },
    /// A block's linear programme ended short of optimal.
    #[error("slots {from}..{to}: the bound's LP ended {status:?}")]
    NotOptimal {
        /// First slot of the block.
        from: usize,
        /// One past its last slot.
        to: usize,
        /// How it ended.
        status: SolveStatus,
    },
}

/// Slots per linear programme: blocks keep every programme small, whatever the length of the run.
const BLOCK_SLOTS: usize = 60;

/// The arrivals a bound is computed from, per tenant and slot of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Demand {
    /// Slot length, ms.
    pub slot_ms: f64,
    /// Length of the run, ms (the last slot may be shorter).
    pub duration_ms: f64,
    /// `arrivals[tenant][slot]`: requests that arrived in the slot.
    pub arrivals: Vec<Vec<f64>>,
    /// `tail[tenant][slot]`: of those, the requests that arrived within the tenant's SLO of the slot's end (they may
    /// complete in the next slot). Any over-estimate keeps the bound valid.
    pub tail: Vec<Vec<f64>>,
}

/// The bound and how it was computed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpperBound {
    /// The bound on goodput: the smaller of the two below.
    pub goodput: f64,
    /// The LP bound (best reachable accuracy, retraining free).
    pub lp: f64,
    /// The retraining-aware Lagrangian bound, where it applies.
    pub lagrangian: Option<f64>,
    /// Within-SLO completions in the bound's optimum (not itself a bound on SLO attainment).
    pub within_slo: f64,
    /// What the bound relaxes, in a line.
    pub method: String,
    /// The accuracy credited to each tenant, in tenant order.
    pub accuracy: Vec<f64>,
}

/// The method line of [`UpperBound::method`].
pub const METHOD: &str = "min of two relaxations: (1) fluid LP relaxation per slot: fractional instances on the \
                          fleet's compute and memory slices, zero reconfiguration cost, capacity at 100% of what an \
                          instance serves within SLO, every request at the best accuracy the fleet could retrain to \
                          in a window; (2) its Lagrangian relaxation over compute slices with retraining charged its \
                          slices, each tenant solved exactly by dynamic programming over its retraining windows";

/// One tenant's serving options on one GPU model.
#[derive(Debug, Clone)]
struct ServeOption {
    /// Index into the fleet's GPU models.
    model: usize,
    compute: f64,
    memory: f64,
    /// Requests per second within SLO at 100 %.
    rps: f64,
    /// Largest batch whose latency meets the SLO.
    batch: f64,
}

/// The most retraining work (7g GPU-seconds) one compute slice of a `gpu` does per second for `model`, over the
/// profiles its retraining fits (0 where none does).
fn train_per_slice(model: &ModelProfile, gpu: GpuModel) -> f64 {
    gpu.spec()
        .profiles
        .iter()
        .filter(|p| model.fits_training(p))
        .map(|p| model.training_speed_on(gpu, p.profile) / f64::from(p.profile.compute_slices().max(1)))
        .fold(0.0, f64::max)
}

/// The best accuracy `tenant` can reach on `gpus` (see the module doc).
pub fn best_accuracy(tenant: &TenantSpec, model: &ModelProfile, gpus: &BTreeMap<GpuId, GpuModel>) -> f64 {
    let Some(r) = &tenant.retraining else { return tenant.initial_accuracy() };
    let fleet_speed: f64 = gpus.values().map(|g| 7.0 * train_per_slice(model, *g)).sum();
    let per_epoch = r.work_for_epochs(1.0);
    let epochs = if per_epoch > 0.0 { r.window_ms as f64 / 1000.0 * fleet_speed / per_epoch } else { f64::INFINITY };
    let reachable = if epochs.is_finite() { r.accuracy_after(epochs) } else { r.curve.asymptote() };
    r.initial_accuracy.max(reachable).min(1.0)
}

/// The serving options of `tenant` on each GPU model of `models`.
fn options(tenant: &TenantSpec, model: &ModelProfile, models: &[GpuModel]) -> Vec<ServeOption> {
    let mut out = Vec::new();
    for (m, gpu) in models.iter().enumerate() {
        for p in gpu.spec().profiles.iter().filter(|p| model.fits_inference(p)) {
            let (mut rps, mut batch) = (0.0f64, 0u32);
            for b in 1..=model.max_batch.max(1) {
                let lat = model.latency_on(*gpu, p.profile, b);
                if lat > tenant.slo_ms {
                    continue;
                }
                rps = rps.max(f64::from(b) * 1000.0 / lat);
                batch = b;
            }
            if rps > 0.0 {
                out.push(ServeOption {
                    model: m,
                    compute: f64::from(p.profile.compute_slices()),
                    memory: f64::from(p.profile.memory_slices()),
                    rps,
                    batch: f64::from(batch),
                });
            }
        }
    }
    out
}

/// The upper bound on the goodput of `tenants` (with `profiles` by model name) on `gpus` under `demand`.
pub fn upper_bound(
    tenants: &[TenantSpec],
    profiles: &BTreeMap<String, ModelProfile>,
    gpus: &BTreeMap<GpuId, GpuModel>,
    demand: &Demand,
) -> Result<UpperBound, BoundError> {
    upper_bound_with(tenants, profiles, gpus, demand, true)
}

/// [`upper_bound`], with the second relaxation (retraining charged its slices) only where `retraining_takes_slices`:
/// where a policy may run retraining on an inference instance ([`tessera_core::sharing`]), retraining takes no
/// slices of its own, and only the first relaxation (which gives retraining no capacity cost) is a bound.
pub fn upper_bound_with(
    tenants: &[TenantSpec],
    profiles: &BTreeMap<String, ModelProfile>,
    gpus: &BTreeMap<GpuId, GpuModel>,
    demand: &Demand,
    retraining_takes_slices: bool,
) -> Result<UpperBound, BoundError> {
    if demand.arrivals.len() != tenants.len() || demand.tail.len() != tenants.len() {
        return Err(BoundError::Tenants { got: demand.arrivals.len(), expected: tenants.len() });
    }
    if !(demand.slot_ms.is_finite() && demand.slot_ms > 0.0) {
        return Err(BoundError::Slot(demand.slot_ms));
    }
    let mut models: Vec<GpuModel> = gpus.values().copied().collect();
    models.sort_unstable();
    models.dedup();
    let counts: Vec<f64> = models.iter().map(|m| gpus.values().filter(|g| *g == m).count() as f64).collect();
    let mut accuracy = Vec::with_capacity(tenants.len());
    let mut opts = Vec::with_capacity(tenants.len());
    for t in tenants {
        let model = profiles
            .get(&t.model)
            .ok_or_else(|| BoundError::UnknownModel { tenant: t.id.to_string(), model: t.model.clone() })?;
        accuracy.push(best_accuracy(t, model, gpus));
        opts.push(options(t, model, &models));
    }
    let slots = demand.arrivals.iter().map(Vec::len).max().unwrap_or(0);
    // Slot lengths, seconds. Requests still in flight at the end may complete after it, within their SLO: the last
    // slot gets that time.
    let overrun_ms = tenants.iter().map(|t| t.slo_ms).fold(0.0, f64::max);
    let dt: Vec<f64> = (0..slots)
        .map(|s| {
            let start = s as f64 * demand.slot_ms;
            let end = ((s + 1) as f64 * demand.slot_ms).min(demand.duration_ms.max(start));
            (end - start + if s + 1 == slots { overrun_ms } else { 0.0 }) / 1000.0
        })
        .collect();
    let blocks: Vec<usize> = (0..slots).step_by(BLOCK_SLOTS).collect();
    let solved: Vec<Result<(f64, f64), BoundError>> = blocks
        .par_iter()
        .map(|&from| block(&accuracy, &opts, &counts, demand, &dt, from..(from + BLOCK_SLOTS).min(slots)))
        .collect();
    let (mut lp, mut within_slo) = (0.0, 0.0);
    for s in solved {
        let (g, w) = s?;
        lp += g;
        within_slo += w;
    }
    let model_profiles: Vec<&ModelProfile> = tenants.iter().map(|t| &profiles[&t.model]).collect();
    let fleet = lagrangian::Fleet { models: &models, counts: &counts, dt: &dt };
    let lagrangian = if retraining_takes_slices {
        lagrangian::bound(tenants, &model_profiles, &fleet, demand, &opts, &accuracy)
    } else {
        None
    };
    let goodput = lagrangian.map_or(lp, |l| l.min(lp));
    Ok(UpperBound { goodput, lp, lagrangian, within_slo, method: METHOD.to_string(), accuracy })
}

/// Solves slots `from..to` (of lengths `dt`, seconds); returns the block's goodput bound and within-SLO completions.
fn block(
    accuracy: &[f64],
    opts: &[Vec<ServeOption>],
    counts: &[f64],
    demand: &Demand,
    dt: &[f64],
    std::ops::Range { start: from, end: to }: std::ops::Range<usize>,
) -> Result<(f64, f64), BoundError> {
    let at = |v: &Vec<f64>, s: usize| v.get(s).copied().unwrap_or(0.0).max(0.0);
    let mut vars = ProblemVariables::new();
    let mut rows = Vec::new();
    let mut objective = Expression::from(0.0);
    let mut served: Vec<Variable> = Vec::new();
    // Slices in use per GPU model and slot.
    let mut compute: Vec<Vec<Expression>> = vec![vec![Expression::from(0.0); to - from]; counts.len()];
    let mut memory: Vec<Vec<Expression>> = vec![vec![Expression::from(0.0); to - from]; counts.len()];
    let mut any_slices = vec![vec![false; to - from]; counts.len()];
    for (i, tenant_opts) in opts.iter().enumerate() {
        let (arrivals, tail) = (&demand.arrivals[i], &demand.tail[i]);
        let carry_in = if from > 0 { at(tail, from - 1) } else { 0.0 };
        let mut cumulative_served = Expression::from(0.0);
        let mut cumulative_arrived = carry_in;
        for s in from..to {
            let available = at(arrivals, s) + if s > 0 { at(tail, s - 1) } else { 0.0 };
            cumulative_arrived += at(arrivals, s);
            if available <= 0.0 || tenant_opts.is_empty() {
                continue;
            }
            let dt_s = dt[s];
            let sv = vars.add(variable().min(0.0).max(available));
            served.push(sv);
            let mut capacity = Expression::from(0.0);
            for o in tenant_opts {
                let x = vars.add(variable().min(0.0));
                capacity += x * (o.rps * dt_s + o.batch);
                compute[o.model][s - from] += x * o.compute;
                memory[o.model][s - from] += x * o.memory;
                any_slices[o.model][s - from] = true;
            }
            rows.push(Expression::from(sv).leq(capacity));
            cumulative_served += sv;
            rows.push(cumulative_served.clone().leq(cumulative_arrived));
            objective += sv * accuracy[i];
        }
    }
    for (m, n) in counts.iter().enumerate() {
        for k in 0..to - from {
            if any_slices[m][k] {
                rows.push(std::mem::take(&mut compute[m][k]).leq(7.0 * n));
                rows.push(std::mem::take(&mut memory[m][k]).leq(8.0 * n));
            }
        }
    }
    if served.is_empty() {
        return Ok((0.0, 0.0));
    }
    let config = SolverConfig { backend: Backend::Highs, time_limit_s: 3600.0, mip_rel_gap: 0.0, max_nodes: 1 };
    let result = maximise(vars, objective, rows, &config).map_err(|source| BoundError::Solve { from, to, source })?;
    if result.status != SolveStatus::Optimal {
        return Err(BoundError::NotOptimal { from, to, status: result.status });
    }
    let within: f64 = served.iter().map(|v| result.values.get(v).copied().unwrap_or(0.0)).sum();
    Ok((result.objective, within))
}
