//! `astraea`: maximise the inference load served within the SLO, blind to accuracy; retraining gets what is left.
//!
//! **Original.** Two papers share the name; MIGRator's baselines are GPU-sharing techniques on one GPU, so the
//! intended one is most likely Zhang et al., ASPLOS 2022: MPS
//! spatial sharing of a GPU between latency-critical services, a predictor of each service's throughput and
//! latency under a resource quota, and a deployment policy that maximises the peak load the services support
//! while meeting their p99 latency QoS. It has no notion of retraining or accuracy.
//!
//! **Adapted to MIG.** Quotas are MIG instances. Each round, on each GPU, one inference instance per tenant is
//! chosen (exhaustively over the profiles each tenant meets its SLO on) to maximise the requests served within the
//! SLO over the horizon at the forecast rates, `sum min(arrivals, capacity)`, unweighted by accuracy or tenant
//! weight; ties keep a tenant's current profile (fewer reconfigurations), then use fewer slices. The profile's
//! capacity within the SLO is Astraea's predictor (`core`'s SLO capacity rule, the same profiles every policy
//! uses). Retraining gets the slices left: pending jobs, in tenant order, take the largest profile that fits
//! beside the inference instances as soon as one does, and keep it until done. A job already running keeps its
//! instance when inference loses no served load by leaving it alone; otherwise inference takes its slices.
//! Level 1 is the fleet placement every per-GPU policy gets ([`crate::assign::place`], `--placement`). Re-planned
//! every round from the latest forecast.
//!
//! **Parameters.** None beyond the SLO and the forecast.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use tessera_core::ids::{GpuId, TenantId};

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::problem::{GpuProblem, RetrainOption, Schedule, describe_retraining};
use crate::level2::realize::realize;
use crate::level2::solver::{SolveError, SolveStatus};
use crate::policy::{GpuOutcome, PlanError, PlanOutcome, Policy, plan_fleet};

/// The Astraea policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Astraea;

impl Policy for Astraea {
    fn name(&self) -> &'static str {
        "astraea"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let l1 = assign::place(input);
        plan_fleet(self.name(), input, l1, |gpu, tenants| level2(input, gpu, tenants))
    }
}

/// Requests tenant `i` has served within SLO over the horizon on profile `p` (accuracy-blind).
fn served(pb: &GpuProblem, i: usize, p: Option<usize>) -> f64 {
    let Some(p) = p else { return 0.0 };
    let t = &pb.tenants[i];
    let capacity = t.cap[p] * pb.slot_s;
    t.scenarios.iter().map(|s| s.prob * s.rate.iter().map(|r| (r * pb.slot_s).min(capacity)).sum::<f64>()).sum()
}

/// A candidate's rank: served load, then tenants keeping their profile, then minus the slices it uses.
type Key = (f64, usize, i32);

fn better(a: Key, b: Key) -> bool {
    a.0 > b.0 + 1e-9 || ((a.0 - b.0).abs() <= 1e-9 && (a.1, a.2) > (b.1, b.2))
}

/// The inference profiles that serve the most load within SLO, with `reserved` counts already in use.
pub fn best_inference(pb: &GpuProblem, reserved: &[u8]) -> (Vec<Option<usize>>, f64) {
    let n = pb.tenants.len();
    let options: Vec<Vec<Option<usize>>> = (0..n)
        .map(|i| {
            let mut o: Vec<Option<usize>> =
                (0..pb.profiles.len()).filter(|p| pb.tenants[i].cap[*p] > 0.0).map(Some).collect();
            o.push(None);
            o
        })
        .collect();
    let best_each: Vec<f64> =
        (0..n).map(|i| options[i].iter().map(|p| served(pb, i, *p)).fold(0.0, f64::max)).collect();
    let current: Vec<Option<usize>> =
        pb.tenants.iter().map(|t| t.current_inference.and_then(|pl| pb.profile_index(pl.profile))).collect();
    #[allow(clippy::too_many_arguments)]
    fn search(
        pb: &GpuProblem,
        options: &[Vec<Option<usize>>],
        best_each: &[f64],
        current: &[Option<usize>],
        i: usize,
        counts: &mut Vec<u8>,
        chosen: &mut Vec<Option<usize>>,
        key: Key,
        best: &mut Option<(Key, Vec<Option<usize>>)>,
    ) {
        if i == options.len() {
            if best.as_ref().is_none_or(|(k, _)| better(key, *k)) {
                *best = Some((key, chosen.clone()));
            }
            return;
        }
        let rest: f64 = best_each[i..].iter().sum();
        if let Some((k, _)) = best
            && key.0 + rest < k.0 - 1e-9
        {
            return;
        }
        for p in &options[i] {
            if let Some(p) = p {
                counts[*p] += 1;
                if !pb.counts_feasible(counts) {
                    counts[*p] -= 1;
                    continue;
                }
            }
            chosen[i] = *p;
            let slices = p.map_or(0, |p| i32::from(pb.compute_slices(p)));
            let k = (key.0 + served(pb, i, *p), key.1 + usize::from(current[i] == *p), key.2 - slices);
            search(pb, options, best_each, current, i + 1, counts, chosen, k, best);
            if let Some(p) = p {
                counts[*p] -= 1;
            }
        }
    }
    let mut best = None;
    let mut counts = reserved.to_vec();
    let mut chosen = vec![None; n];
    search(pb, &options, &best_each, &current, 0, &mut counts, &mut chosen, (0.0, 0, 0), &mut best);
    let (key, chosen) = best.expect("choosing nothing is always feasible");
    (chosen, key.0)
}

fn level2(input: &PlannerInput, gpu: &GpuId, tenants: &[TenantId]) -> Result<Option<GpuOutcome>, SolveError> {
    if tenants.is_empty() {
        return Ok(None);
    }
    let pb = gpu_problem(input, gpu, tenants, Arrivals::Point);
    let n = pb.tenants.len();
    let np = pb.profiles.len();
    // Running jobs: keep them only where inference loses nothing by it.
    let running: Vec<Option<RetrainOption>> = (0..n)
        .map(|i| {
            pb.tenants[i]
                .retrain
                .as_ref()
                .and_then(|r| r.running_on)
                .and_then(|_| pb.retrain_options(i).first().copied())
        })
        .collect();
    let mut reserved = vec![0u8; np];
    for o in running.iter().flatten() {
        reserved[o.profile] += 1;
    }
    let (with_jobs, load_with) = best_inference(&pb, &reserved);
    let (without, load_without) = best_inference(&pb, &vec![0u8; np]);
    let (inference, keep_running) = if load_with >= load_without - 1e-9 { (with_jobs, true) } else { (without, false) };
    let mut schedule = Schedule::empty(pb.slots, n);
    for t in 0..pb.slots {
        schedule.inference[t] = inference.clone();
    }
    if keep_running {
        schedule.retrain.clone_from(&running);
    }
    // Leftover slices: pending jobs in tenant order, as soon as a profile fits.
    for t in 0..pb.slots {
        for i in 0..n {
            if schedule.retrain[i].is_some() || running[i].is_some() {
                continue;
            }
            let Some(r) = &pb.tenants[i].retrain else { continue };
            if r.work_s <= 0.0 {
                continue;
            }
            let counts = schedule.counts(t, np);
            let pick = (0..np)
                .filter(|p| r.speed[*p] > 0.0)
                .filter(|p| {
                    let mut c = counts.clone();
                    c[*p] += 1;
                    pb.counts_feasible(&c)
                })
                .max_by(|a, b| r.speed[*a].total_cmp(&r.speed[*b]).then(b.cmp(a)));
            if let Some(p) = pick {
                let d = ((r.work_s / (r.speed[p] * pb.slot_s)) - 1e-9).ceil().max(1.0) as usize;
                // Only when every slot of the run has room (later starts in the horizon do not shrink it).
                schedule.retrain[i] = Some(RetrainOption { profile: p, start: t, end: t + d });
                if !(t..(t + d).min(pb.slots)).all(|s| pb.counts_feasible(&schedule.counts(s, np))) {
                    schedule.retrain[i] = None;
                }
            }
        }
    }
    let placed = realize(&pb, &schedule);
    let objective = crate::level2::evaluate::goodput(&pb, &placed);
    let note = format!(
        "max load within SLO ({:.0} requests over the horizon){}; {}",
        if keep_running { load_with } else { load_without },
        if keep_running || running.iter().all(Option::is_none) { "" } else { "; running retraining preempted" },
        describe_retraining(&pb, &schedule)
    );
    Ok(Some(GpuOutcome::new(pb, placed, objective, SolveStatus::Rule, note)))
}
