//! The goodput plan of one GPU over the horizon, as `tessera` plans it (from its forecast band) and the
//! perfect-forecast reference plans it (from the true rates): the per-GPU problem with the retraining tail
//! ([`tail_values`]), solved by column generation ([`crate::level2::cg`]) from two starts, the thief scheduler's
//! allocation ([`crate::level2::thief`]) and the previous round's plan shifted onto this round's slots
//! ([`WarmStart`]), which also brings the prices of its best bound.

use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::{Assignment, Role};

use crate::input::{PlannerInput, WarmStart, WarmTenant};
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::cg;
use crate::level2::evaluate;
use crate::level2::problem::{GpuProblem, Schedule, describe_retraining};
use crate::level2::realize::{Placed, realize};
use crate::level2::solver::{SolveError, SolverConfig};
use crate::level2::thief;
use crate::policy::GpuOutcome;

/// Which of tessera's level-2 ideas a solve uses: the ablations and MIGRator switch them off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Credit completed retrainings with the goodput they earn beyond the horizon ([`tail_values`]).
    pub tail: bool,
    /// Start from the previous round's plan and prices ([`WarmStart`]), and leave this round's for the next.
    pub warm: bool,
    /// Where the round allows sharing ([`crate::PlannerConfig::sharing`]), run a retraining the plan leaves
    /// without an instance beside its tenant's inference when that earns more ([`share_retraining`]).
    pub share: bool,
}

impl Features {
    /// Everything tessera does.
    pub const ALL: Features = Features { tail: true, warm: true, share: true };
    /// The problem as MIGRator states it: the horizon's goodput alone, every round solved cold.
    pub const NONE: Features = Features { tail: false, warm: false, share: false };
}

/// The goodput plan of one GPU: build the problem from `arrivals`, credit retraining beyond the horizon, solve by
/// column generation from the thief-scheduler start and the GPU's warm start, place, describe, and leave the next
/// round's warm start.
pub fn solve(
    input: &PlannerInput,
    gpu: &GpuId,
    tenants: &[TenantId],
    arrivals: Arrivals,
    solver: &SolverConfig,
) -> Result<Option<GpuOutcome>, SolveError> {
    solve_with(input, gpu, tenants, arrivals, solver, Features::ALL)
}

/// [`solve`] with only the ideas `features` names.
pub fn solve_with(
    input: &PlannerInput,
    gpu: &GpuId,
    tenants: &[TenantId],
    arrivals: Arrivals,
    solver: &SolverConfig,
    features: Features,
) -> Result<Option<GpuOutcome>, SolveError> {
    if tenants.is_empty() {
        return Ok(None);
    }
    let mut problem = gpu_problem(input, gpu, tenants, arrivals);
    if features.tail {
        tail_values(input, &mut problem);
    }
    let mut seeds = vec![thief_seed(input, &problem)];
    let shifted = match (&input.gpus[gpu].warm, features.warm) {
        (Some(w), true) => shift(w, input, &problem),
        _ => Shifted::default(),
    };
    seeds.extend(shifted.schedule);
    let cg::WarmSolved { solved, prices, .. } = cg::solve_warm(&problem, solver, &seeds, shifted.prices.as_deref())?;
    let placed = realize(&problem, &solved.schedule);
    let mut note = describe_retraining(&problem, &solved.schedule);
    let sharing = input.config.sharing;
    let (placed, shared) = if features.share && !sharing.is_exclusive() {
        share_retraining(&problem, &solved.schedule, placed, features.tail)
    } else {
        (placed, Vec::new())
    };
    if !shared.is_empty() {
        let names: Vec<String> = shared.iter().map(ToString::to_string).collect();
        note.push_str(&format!("; {sharing} sharing: retrain {} beside inference", names.join(", ")));
    }
    let warm = features.warm.then(|| warm_start(input, &problem, &solved.schedule, prices));
    let mut outcome = GpuOutcome::new(problem, placed, solved.bound, solved.status, note);
    outcome.warm = warm;
    if !shared.is_empty() {
        outcome.sharing = sharing;
    }
    Ok(Some(outcome))
}

/// Runs the retraining of tenants the plan leaves without a retraining instance now beside their inference instead
/// ([`crate::level2::problem::SharedTask`]), where the GPU's exact evaluation gains. A local search over the solved
/// schedule, tenant by tenant: for each profile whose instance holds the tenant's inference and retraining
/// together, the tenant's inference moves to that profile from the first slot for as long as the slot's counts
/// stay valid (the others keep theirs), the schedule is placed again, and the retraining runs on that instance
/// while the tenant keeps it. A candidate is valued by [`evaluate::goodput_tail_progress`]: goodput, the tail of
/// completed retrainings where the plan counts it, and for a shared retraining that does not complete within the
/// horizon, its share of the work done times its tail value (a shared retraining is checkpointed, so the next
/// round continues it; exclusive retrainings are valued at completion only, as level 2 plans them). The best
/// candidate is kept only if it beats the plan; returns the plan and the tenants that share.
pub fn share_retraining(pb: &GpuProblem, schedule: &Schedule, placed: Placed, tail: bool) -> (Placed, Vec<TenantId>) {
    let mut shared: Vec<usize> = Vec::new();
    let value = |p: &Placed, shared: &[usize]| {
        let (goodput, t, progress) = evaluate::goodput_tail_progress(pb, p);
        let partial: f64 =
            shared.iter().filter(|i| progress[**i] < 1.0).map(|i| progress[*i] * pb.tenants[*i].tail_value).sum();
        goodput + if tail { t + partial } else { 0.0 }
    };
    let mut best_value = value(&placed, &[]);
    let mut best = placed;
    let mut schedule = schedule.clone();
    for (i, t) in pb.tenants.iter().enumerate() {
        let Some(sh) = &t.shared else { continue };
        if t.retrain.as_ref().is_none_or(|r| r.work_s <= 0.0 || r.running_on.is_some()) || t.acc_new <= t.acc_old {
            continue;
        }
        // A retraining the plan starts at once keeps its instance; one it starts later may run shared from now
        // instead (its instance is then not created).
        if schedule.retrain[i].is_some_and(|o| o.start == 0)
            || schedule.inference.first().is_none_or(|s| s[i].is_none())
        {
            continue;
        }
        let mut found: Option<(f64, Schedule, Placed)> = None;
        for p in (0..pb.profiles.len()).filter(|p| sh.cap[*p] > 0.0) {
            let mut cand = schedule.clone();
            cand.retrain[i] = None;
            for slot in 0..pb.slots {
                if cand.inference[slot][i].is_none() {
                    break;
                }
                let before = cand.inference[slot][i];
                cand.inference[slot][i] = Some(p);
                if !pb.counts_feasible(&cand.counts(slot, pb.profiles.len())) {
                    cand.inference[slot][i] = before;
                    break;
                }
            }
            if cand.inference[0][i] != Some(p) {
                continue;
            }
            let mut with = shared.clone();
            with.push(i);
            let placed = place_shared(pb, &cand, &with);
            let v = value(&placed, &with);
            if v > found.as_ref().map_or(best_value, |f| f.0) + 1e-9 * best_value.abs().max(1.0) {
                found = Some((v, cand, placed));
            }
        }
        if let Some((v, cand, placed)) = found {
            best_value = v;
            schedule = cand;
            best = placed;
            shared.push(i);
        }
    }
    (best, shared.iter().map(|i| pb.tenants[*i].id.clone()).collect())
}

/// Places `schedule` and runs the retraining of each tenant in `shared` on its inference instance from the first
/// slot for as long as it keeps that instance.
fn place_shared(pb: &GpuProblem, schedule: &Schedule, shared: &[usize]) -> Placed {
    let mut placed = realize(pb, schedule);
    for &i in shared {
        let id = &pb.tenants[i].id;
        let Some(pl) = placed
            .slots
            .first()
            .and_then(|s| s.iter().find(|a| &a.tenant == id && a.role == Role::Inference))
            .map(|a| a.placement)
        else {
            continue;
        };
        for slot in &mut placed.slots {
            if !slot.iter().any(|a| &a.tenant == id && a.role == Role::Inference && a.placement == pl) {
                break;
            }
            slot.push(Assignment { placement: pl, tenant: id.clone(), role: Role::Retraining, preinit: false });
        }
    }
    placed
}

/// What the next round starts from: this round's schedule and best-bound prices.
fn warm_start(input: &PlannerInput, pb: &GpuProblem, schedule: &Schedule, prices: Vec<Vec<f64>>) -> WarmStart {
    WarmStart {
        at: input.now,
        slot_s: pb.slot_s,
        tenants: pb
            .tenants
            .iter()
            .enumerate()
            .map(|(i, t)| WarmTenant {
                id: t.id.clone(),
                inference: schedule.inference.iter().map(|row| row[i].map(|p| pb.profiles[p])).collect(),
                retraining: schedule.retrain[i].map(|o| (pb.profiles[o.profile], o.start, o.end)),
            })
            .collect(),
        prices,
    }
}

/// A [`WarmStart`] on this round's slots.
#[derive(Default)]
struct Shifted {
    /// Its plan, where every tenant of the problem has one and it is feasible here.
    schedule: Option<Schedule>,
    /// Its prices, where it has them.
    prices: Option<Vec<Vec<f64>>>,
}

/// A warm start moved onto `pb`'s slots, which begin `d` of its slots later: slot `t` takes its slot `t + d`,
/// and slots beyond its horizon repeat its last. Nothing where the slots do not line up.
fn shift(w: &WarmStart, input: &PlannerInput, pb: &GpuProblem) -> Shifted {
    let slot_ms = pb.slot_s * 1000.0;
    let Some(elapsed) = input.now.as_ms().checked_sub(w.at.as_ms()).map(|e| e as f64) else {
        return Shifted::default();
    };
    let d = (elapsed / slot_ms).round();
    if (w.slot_s - pb.slot_s).abs() > 1e-9 || (elapsed - d * slot_ms).abs() > 1.0 {
        return Shifted::default();
    }
    let d = d as usize;
    let from = |t: usize, len: usize| (t + d).min(len.saturating_sub(1));
    let prices = (!w.prices.is_empty() && d < w.prices.len())
        .then(|| (0..pb.slots).map(|t| w.prices[from(t, w.prices.len())].clone()).collect());
    let mut schedule = Schedule::empty(pb.slots, pb.tenants.len());
    for (i, t) in pb.tenants.iter().enumerate() {
        let Some(old) = w.tenants.iter().find(|o| o.id == t.id).filter(|o| d < o.inference.len()) else {
            return Shifted { schedule: None, prices };
        };
        for slot in 0..pb.slots {
            schedule.inference[slot][i] =
                old.inference[from(slot, old.inference.len())].and_then(|p| pb.profile_index(p));
        }
        let options = pb.retrain_options(i);
        schedule.retrain[i] = match (&t.retrain, old.retraining) {
            // A retraining under way has one option: going on where it runs.
            (Some(r), _) if r.running_on.is_some() => options.first().copied(),
            // One planned to start later starts as planned, where that is still an option.
            (_, Some((p, start, _))) if start >= d => {
                let p = pb.profile_index(p);
                options.iter().find(|o| Some(o.profile) == p && o.start == start - d).copied()
            }
            _ => None,
        };
    }
    Shifted { schedule: schedule.feasible(pb).then_some(schedule), prices }
}

/// How long, in retraining windows, level 2 counts the accuracy a retraining buys beyond the horizon: the gain lasts
/// until the next retraining, due a window later, so half a window is the conservative middle (measured:
/// `docs/performance.md`, 2026-11-25, planning constants).
pub const TAIL_WINDOWS: f64 = 0.5;

/// Sets each due tenant's [`TenantTask::tail_value`](crate::level2::problem::TenantTask::tail_value): weight x accuracy
/// gain x the requests its best instance serves at the horizon's last expected arrival rate, over
/// [`TAIL_WINDOWS`] retraining windows.
pub fn tail_values(input: &PlannerInput, pb: &mut GpuProblem) {
    for t in &mut pb.tenants {
        let Some(window_s) = input.tenants[&t.id].spec.retraining.as_ref().map(|r| r.window_ms as f64 / 1000.0) else {
            continue;
        };
        if t.retrain.is_none() {
            continue;
        }
        let best = t.cap.iter().copied().fold(0.0, f64::max);
        let rate: f64 = t.scenarios.iter().map(|s| s.prob * s.rate.last().copied().unwrap_or(0.0).min(best)).sum();
        t.tail_value = TAIL_WINDOWS * t.weight * (t.acc_new - t.acc_old).max(0.0) * rate * window_s;
    }
}

/// The thief scheduler's allocation of the same problem (default epochs), a start for the local search: a rule-based
/// allocation is sometimes a better neighbourhood than the column-generation greedy finds within its budget.
fn thief_seed(input: &PlannerInput, pb: &GpuProblem) -> Schedule {
    let defaults: Vec<thief::Config> = pb
        .tenants
        .iter()
        .map(|t| thief::Config {
            epochs: input.tenants[&t.id].spec.retraining.as_ref().map_or(0.0, |r| r.epochs),
            work_s: t.retrain.as_ref().map_or(0.0, |r| r.work_s),
            accuracy: t.acc_new,
        })
        .collect();
    let configs: Vec<Vec<thief::Config>> = pb
        .tenants
        .iter()
        .zip(&defaults)
        .map(|(t, d)| match &t.retrain {
            Some(r) if r.running_on.is_none() && t.acc_new > t.acc_old => vec![*d],
            _ => Vec::new(),
        })
        .collect();
    let now_s = input.now.as_ms() as f64 / 1000.0;
    thief::run_horizon(pb, now_s, thief::WINDOW_S, &configs, &defaults, None).schedule
}
