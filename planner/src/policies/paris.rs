//! `paris`: PARIS heterogeneous partitioning, with ELSA dispatch of each request.
//!
//! **Original** (Kim, Choi, Rhu, DAC 2022, arXiv 2202.13481).
//! PARIS profiles a model's latency `L(g, b)` on every partition size `g` and batch `b`, finds for each size the
//! batch at which the partition saturates (the knee of throughput against batch), gives each size the batch range
//! just above the previous size's knee, and from the expected batch-size distribution sizes the number of
//! partitions of each size in proportion to the GPC-time demand of its range, within the GPC budget and MIG's
//! rules. The layout is set once for the deployment. ELSA then sends each query to the **smallest** partition
//! that still meets the SLO (finish = now + queued work + `L(g, b)`), else to the one that finishes first.
//!
//! **Adapted to Tessera.**
//! - *Batch sizes.* PARIS's queries arrive with a batch size; Tessera's requests are single inputs that the server
//!   batches. The batch-size distribution is that of dynamic batching: a batch holds its first request plus those
//!   arriving within the batching window ([`BATCH_WINDOW_OF_SLO`] of the SLO), Poisson at the tenant's mean
//!   forecast rate, capped at the largest batch that meets the SLO.
//! - *Several tenants per GPU.* PARIS partitions a GPU for one model. Here each GPU's tenants (placed by the fleet
//!   level 1 every per-GPU policy gets, [`crate::assign::place`]) share its GPC budget in proportion to their GPC-time demand, and each tenant's
//!   share is split across sizes by PARIS's rule. The union is made MIG-valid by removing the partitions with the
//!   least demand per slice, then topped up with the partitions whose demand is least covered while they fit.
//! - *Retraining.* PARIS serves inference only. When a GPU's tenants retrain, the smallest instance that fits
//!   their training memory is set aside as the retraining pool before the budget is split (the jobs run there
//!   first come, first served, [`crate::level2::fixed`]); without it they would never retrain.
//! - *Sizes.* The classic profiles (1g, 2g, 3g, 4g, 7g; a double-memory 1g where a model does not fit the plain
//!   1g). MIG profiles are PARIS's GPC partitions.
//!
//! **Parameters.** Knee at [`KNEE`] of a size's best throughput within SLO; batching window
//! [`BATCH_WINDOW_OF_SLO`] of the SLO (both assumptions: the paper gives neither as a number). The layout is kept while the GPU serves the
//! same tenants ([`crate::level2::fixed::keep_current`]): static for the deployment.
//!
//! [`elsa_dispatch`] is the per-request rule, exposed for the simulated backend to call.

use std::collections::BTreeMap;

use tessera_core::ids::{GpuId, TenantId};
use tessera_core::model::ModelProfile;
use tessera_core::serving::{BATCH_WINDOW_OF_SLO, Dispatch};
use tessera_core::{GpuModel, Layout, Placement, Profile, migparted};

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::fixed::{self, Fixed};
use crate::level2::problem::{GpuProblem, mean_demand};
use crate::level2::solver::{SolveError, SolveStatus};
use crate::policy::{GpuOutcome, PlanError, PlanOutcome, Policy, plan_fleet};

/// The PARIS + ELSA policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Paris;

/// A partition saturates at the smallest batch whose throughput reaches this share of its best within the SLO.
pub const KNEE: f64 = 0.9;

/// One partition size in a model's PARIS plan.
#[derive(Debug, Clone, PartialEq)]
pub struct SizePlan {
    /// The MIG profile.
    pub profile: Profile,
    /// Smallest batch it takes.
    pub batch_lo: u32,
    /// Largest batch it takes.
    pub batch_hi: u32,
    /// GPC-time demand of its batch range: compute slices kept busy on average.
    pub demand_slices: f64,
}

/// The batch-size distribution of dynamic batching at `rate_rps` with a `window_s` window, capped at `max_batch`:
/// `P(b)` for `b = 1..=max_batch` (index `b - 1`).
pub fn batch_distribution(rate_rps: f64, window_s: f64, max_batch: u32) -> Vec<f64> {
    let max_batch = max_batch.max(1) as usize;
    let mu = (rate_rps * window_s).max(0.0);
    let mut out = vec![0.0; max_batch];
    // b = 1 + k, k ~ Poisson(mu); the tail folds into the largest batch.
    let mut pk = (-mu).exp();
    let mut acc = 0.0;
    for (k, slot) in out.iter_mut().enumerate().take(max_batch - 1) {
        *slot = pk;
        acc += pk;
        pk *= mu / (k as f64 + 1.0);
    }
    out[max_batch - 1] = (1.0 - acc).max(0.0);
    out
}

/// PARIS for one model on `gpu`: the sizes it uses, their batch ranges and their GPC-time demand at `rate_rps`.
/// Empty when the model meets its SLO on no size. A tenant pinned to a profile (`pin`) gets that size alone.
pub fn partition_plan(
    model: &ModelProfile,
    gpu: GpuModel,
    slo_ms: f64,
    slowdown: f64,
    rate_rps: f64,
    pin: Option<Profile>,
) -> Vec<SizePlan> {
    let latency = |p: Profile, b: u32| model.latency_on(gpu, p, b) * slowdown;
    // Per compute size, the profile a model fits (a double-memory 1g where the plain one is too small).
    let mut sizes: Vec<(Profile, u32)> = Vec::new();
    for p in Profile::CLASSIC {
        let candidates: &[Profile] = if p == Profile::G1 { &[Profile::G1, Profile::G1Double] } else { &[p] };
        // An operator's pin leaves one size.
        let Some(p) = candidates
            .iter()
            .copied()
            .filter(|c| pin.is_none_or(|p| p == *c))
            .find(|c| gpu.profile(*c).is_some_and(|spec| model.fits_inference(spec)))
        else {
            continue;
        };
        // Largest batch meeting the SLO (the capacity rule of `core`: twice the latency within the SLO).
        let feasible = (1..=model.max_batch.max(1)).take_while(|b| 2.0 * latency(p, *b) <= slo_ms).last();
        if let Some(b) = feasible {
            sizes.push((p, b));
        }
    }
    let Some(max_batch) = sizes.iter().map(|s| s.1).max() else { return Vec::new() };
    let window_s = slo_ms * BATCH_WINDOW_OF_SLO / 1000.0;
    let dist = batch_distribution(rate_rps, window_s, max_batch);
    let mean_batch: f64 = dist.iter().enumerate().map(|(k, p)| (k + 1) as f64 * p).sum();
    let batches_per_s = rate_rps / mean_batch.max(1.0);
    let mut out = Vec::new();
    let mut lo = 1u32;
    for (k, (p, feasible)) in sizes.iter().enumerate() {
        let last = k + 1 == sizes.len();
        let throughput = |b: u32| f64::from(b) / latency(*p, b);
        let best = (1..=*feasible).map(throughput).fold(0.0, f64::max);
        let knee = (1..=*feasible).find(|b| throughput(*b) >= KNEE * best).unwrap_or(*feasible);
        let hi = if last { max_batch } else { knee.min(*feasible) };
        if hi < lo {
            continue;
        }
        let demand_slices: f64 = (lo..=hi)
            .map(|b| {
                let lat_s = latency(*p, b.min(*feasible)) / 1000.0;
                dist[(b - 1) as usize] * batches_per_s * lat_s * f64::from(p.compute_slices())
            })
            .sum();
        out.push(SizePlan { profile: *p, batch_lo: lo, batch_hi: hi, demand_slices });
        lo = hi + 1;
    }
    out
}

impl Policy for Paris {
    fn name(&self) -> &'static str {
        "paris"
    }

    fn dispatch(&self) -> Dispatch {
        Dispatch::Elsa
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let l1 = assign::place(input);
        plan_fleet(self.name(), input, l1, |gpu, tenants| level2(input, gpu, tenants))
    }
}

fn level2(input: &PlannerInput, gpu: &GpuId, tenants: &[TenantId]) -> Result<Option<GpuOutcome>, SolveError> {
    if tenants.is_empty() {
        return Ok(None);
    }
    let pb = gpu_problem(input, gpu, tenants, Arrivals::Point);
    let fresh = partition(input, &pb);
    let fixed = fixed::keep_current(&pb, &input.gpus[gpu], &fresh).unwrap_or(fresh);
    let placed = fixed::run(&pb, &fixed);
    let note = format!("PARIS partitions; {}", fixed::describe(&pb, &fixed));
    let objective = crate::level2::evaluate::goodput(&pb, &placed);
    let layout = fixed.layout.clone();
    let mut out = GpuOutcome::new(pb, placed, objective, SolveStatus::Rule, note);
    out.fixed_layout = Some(layout);
    Ok(Some(out))
}

/// The retraining pool PARIS sets aside on a GPU whose tenants retrain: the smallest profile their jobs fit.
fn retraining_reserve(input: &PlannerInput, pb: &GpuProblem) -> Option<Profile> {
    let memory = pb
        .tenants
        .iter()
        .filter(|t| input.tenants[&t.id].spec.retraining.is_some())
        .map(|t| input.models[&input.tenants[&t.id].spec.model].training_memory_gib)
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))?;
    pb.gpu
        .spec()
        .profiles
        .iter()
        .filter(|s| s.profile != Profile::G1Me && s.memory_gib >= memory)
        .map(|s| s.profile)
        .min()
}

/// PARIS's partitioning of one GPU (see the module doc).
pub fn partition(input: &PlannerInput, pb: &GpuProblem) -> Fixed {
    let gpu = pb.gpu;
    let reserve = retraining_reserve(input, pb);
    let budget = 7.0 - reserve.map_or(0.0, |p| f64::from(p.compute_slices()));
    let plans: Vec<Vec<SizePlan>> = pb
        .tenants
        .iter()
        .map(|t| {
            let ti = &input.tenants[&t.id];
            let model = &input.models[&ti.spec.model];
            let slowdown = slowdown_of(input, pb, &t.id);
            let i = pb.tenants.iter().position(|x| x.id == t.id).expect("own tenant");
            partition_plan(model, gpu, ti.spec.slo_ms, slowdown, mean_demand(pb, i), ti.spec.pin.profile)
        })
        .collect();
    let demand: Vec<f64> = plans.iter().map(|p| p.iter().map(|s| s.demand_slices).sum()).collect();
    let total: f64 = demand.iter().sum();
    // Target slices per (tenant, size): the tenant's share of the budget split by its sizes' demand.
    let target: Vec<Vec<f64>> = plans
        .iter()
        .enumerate()
        .map(|(i, sizes)| {
            let share = if total > 0.0 { budget * demand[i] / total } else { budget / pb.tenants.len() as f64 };
            sizes
                .iter()
                .map(|s| if demand[i] > 0.0 { share * s.demand_slices / demand[i] } else { share / sizes.len() as f64 })
                .collect()
        })
        .collect();
    let mut counts: Vec<Vec<usize>> = plans
        .iter()
        .zip(&target)
        .map(|(sizes, tg)| {
            let mut c: Vec<usize> = sizes
                .iter()
                .zip(tg)
                .map(|(s, t)| (t / f64::from(s.profile.compute_slices())).round() as usize)
                .collect();
            if !c.is_empty() && c.iter().all(|n| *n == 0) {
                let k = (0..tg.len()).max_by(|a, b| tg[*a].total_cmp(&tg[*b])).expect("non-empty");
                c[k] = 1;
            }
            c
        })
        .collect();
    let mut reserve = reserve;
    let union = |counts: &Vec<Vec<usize>>, reserve: Option<Profile>| -> BTreeMap<Profile, usize> {
        let mut u: BTreeMap<Profile, usize> = BTreeMap::new();
        for (sizes, c) in plans.iter().zip(counts) {
            for (s, n) in sizes.iter().zip(c) {
                if *n > 0 {
                    *u.entry(s.profile).or_default() += n;
                }
            }
        }
        if let Some(p) = reserve {
            *u.entry(p).or_default() += 1;
        }
        u
    };
    let fits = |u: &BTreeMap<Profile, usize>| {
        let (profiles, c): (Vec<Profile>, Vec<u8>) = u.iter().map(|(p, n)| (*p, (*n).min(255) as u8)).unzip();
        GpuProblem::fits(gpu, &profiles, &c)
    };
    // Make it valid: drop the partition with the least target per slice it holds (a tenant's last partition only
    // after the retraining reserve).
    while !fits(&union(&counts, reserve)) {
        let mut worst: Option<(f64, usize, usize)> = None;
        for (i, c) in counts.iter().enumerate() {
            let held: usize = c.iter().sum();
            for (k, n) in c.iter().enumerate() {
                if *n == 0 || (held == 1 && reserve.is_some()) {
                    continue;
                }
                let per_slice = target[i][k] / (*n as f64 * f64::from(plans[i][k].profile.compute_slices()));
                let key = per_slice + if held == 1 { 1e9 } else { 0.0 };
                if worst.is_none_or(|w| key < w.0) {
                    worst = Some((key, i, k));
                }
            }
        }
        match worst {
            Some((_, i, k)) => counts[i][k] -= 1,
            None if reserve.is_some() => reserve = None,
            None => break,
        }
    }
    // Top up: the partition whose target is least covered, while it fits.
    loop {
        let mut best: Option<(f64, usize, usize)> = None;
        for (i, c) in counts.iter().enumerate() {
            for (k, n) in c.iter().enumerate() {
                let g = f64::from(plans[i][k].profile.compute_slices());
                let uncovered = target[i][k] - *n as f64 * g;
                if uncovered <= 0.0 {
                    continue;
                }
                let mut trial = counts.clone();
                trial[i][k] += 1;
                if fits(&union(&trial, reserve)) && best.is_none_or(|b| uncovered > b.0) {
                    best = Some((uncovered, i, k));
                }
            }
        }
        let Some((_, i, k)) = best else { break };
        counts[i][k] += 1;
    }
    let layout = migparted::place(gpu, &union(&counts, reserve)).unwrap_or_else(|_| Layout::empty());
    let mut free: Vec<Placement> = layout.placements().to_vec();
    let mut inference = Vec::new();
    for (i, (sizes, c)) in plans.iter().zip(&counts).enumerate() {
        for (s, n) in sizes.iter().zip(c) {
            for _ in 0..*n {
                if let Some(k) = free.iter().position(|p| p.profile == s.profile) {
                    inference.push((free.remove(k), i));
                }
            }
        }
    }
    Fixed { layout, inference }
}

fn slowdown_of(input: &PlannerInput, pb: &GpuProblem, id: &TenantId) -> f64 {
    let me = &input.tenants[id].spec.model;
    pb.tenants
        .iter()
        .filter(|t| &t.id != id)
        .map(|t| input.interference.as_ref().map_or(1.0, |x| x.slowdown(me, &input.tenants[&t.id].spec.model)))
        .fold(1.0, f64::max)
}
