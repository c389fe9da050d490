//! The goodput plan of one GPU over the horizon, as `tessera` plans it (from its forecast band) and the
//! perfect-forecast reference plans it (from the true rates): the per-GPU problem with the retraining tail
//! ([`tail_values`]), solved by column generation ([`crate::level2::cg`]) from two starts, the thief scheduler's
//! allocation ([`crate::level2::thief`]) and the previous round's plan shifted onto this round's slots
//! ([`WarmStart`]), which also brings the prices of its best bound.

use std::collections::BTreeMap;

use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::{Assignment, Role};

use crate::forecast::Forecast;
use crate::input::{PlannedFor, PlannerInput, TenantInput, WarmStart, WarmTenant};
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::cg;
use crate::level2::evaluate;
use crate::level2::outcome::GpuOutcome;
pub use crate::level2::outcome::Replan;
use crate::level2::problem::{GpuProblem, Schedule, TenantTask, describe_retraining};
use crate::level2::realize::{Placed, realize};
use crate::level2::shared::SharedSolves;
use crate::level2::solver::{SolveError, SolveStatus, SolverConfig};
use crate::level2::thief;

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
    /// Choose each retraining's configuration (its epochs, from [`EPOCH_FACTORS`]) with the layout
    /// ([`choose_epochs`]); without it every retraining runs the tenant's default epochs.
    pub epochs: bool,
    /// Incremental rounds: with a warm start, keep the last plan shifted forward where nothing it depends on moved
    /// beyond [`PlannerConfig::replan_band`](crate::input::PlannerConfig::replan_band) ([`still_planned`]).
    pub incremental: bool,
}

impl Features {
    /// Everything tessera does.
    pub const ALL: Features = Features { tail: true, warm: true, share: true, epochs: true, incremental: true };
    /// The problem as MIGRator states it: the horizon's goodput alone, every round solved cold, default epochs.
    pub const NONE: Features = Features { tail: false, warm: false, share: false, epochs: false, incremental: false };
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
    solve_with(input, gpu, tenants, arrivals, solver, &SharedSolves::default(), Features::ALL)
}

/// [`solve`] with only the ideas `features` names, sharing solves with the round's other GPUs through `shared`
/// (one [`SharedSolves`] per round and policy).
pub fn solve_with(
    input: &PlannerInput,
    gpu: &GpuId,
    tenants: &[TenantId],
    arrivals: Arrivals,
    solver: &SolverConfig,
    shared: &SharedSolves,
    features: Features,
) -> Result<Option<GpuOutcome>, SolveError> {
    if tenants.is_empty() {
        return Ok(None);
    }
    let mut problem = gpu_problem(input, gpu, tenants, arrivals);
    if features.tail {
        tail_values(input, &mut problem);
    }
    let shifted = match (&input.gpus[gpu].warm, features.warm) {
        (Some(w), true) => Some(w),
        _ => None,
    };
    let mut replanned = None;
    if features.incremental
        && input.config.replan_band > 0.0
        && let Some(w) = shifted
    {
        match still_planned(input, gpu, &problem, w, solver) {
            Ok(kept) => return Ok(Some(kept_outcome(input, problem, kept, w, features))),
            Err(why) => replanned = Some(why),
        }
    }
    let first = solve_one(input, &problem, shifted, None, None, solver, shared)?;
    let Configured { problem, solved: cg::WarmSolved { solved, prices, .. }, chosen } = if features.epochs {
        choose_epochs(input, problem, first, shifted, solver, shared, features.tail)?
    } else {
        Configured { problem, solved: first, chosen: Vec::new() }
    };
    let warm = features.warm.then(|| warm_start(input, gpu, &problem, &solved.schedule, prices));
    let mut note = describe_retraining(&problem, &solved.schedule);
    if let Some(why) = replanned {
        note = format!("solved again: {why}; {note}");
    }
    let mut outcome =
        outcome(input, problem, &solved.schedule, solved.bound, solved.status, note, &chosen, warm, features);
    outcome.replanned = replanned;
    Ok(Some(outcome))
}

/// The outcome of a GPU that keeps its last plan `w`, shifted forward ([`still_planned`]).
fn kept_outcome(
    input: &PlannerInput,
    problem: GpuProblem,
    kept: Kept,
    w: &WarmStart,
    features: Features,
) -> GpuOutcome {
    let note = format!(
        "kept the plan of {} shifted forward (inputs within {} of its band); {}",
        w.at,
        input.config.replan_band,
        describe_retraining(&problem, &kept.schedule)
    );
    // The warm start stays the last plan's, so that its horizon runs out.
    outcome(input, problem, &kept.schedule, kept.bound, SolveStatus::Shifted, note, &[], Some(w.clone()), features)
}

/// The GPU's outcome for `schedule` on `problem`: placed, its retrainings run beside inference where the round
/// shares and that earns more, described, with the epochs it plans and the warm start it leaves.
#[allow(clippy::too_many_arguments)]
fn outcome(
    input: &PlannerInput,
    problem: GpuProblem,
    schedule: &Schedule,
    bound: f64,
    status: SolveStatus,
    mut note: String,
    chosen: &[(usize, f64)],
    warm: Option<WarmStart>,
    features: Features,
) -> GpuOutcome {
    let placed = realize(&problem, schedule);
    let sharing = input.config.sharing;
    let (placed, shared) = if features.share && !sharing.is_exclusive() {
        share_retraining(&problem, schedule, placed, features.tail)
    } else {
        (placed, Vec::new())
    };
    if !shared.is_empty() {
        let names: Vec<String> = shared.iter().map(ToString::to_string).collect();
        note.push_str(&format!("; {sharing} sharing: retrain {} beside inference", names.join(", ")));
    }
    let retraining_epochs = planned_epochs(input, &problem, chosen);
    if !retraining_epochs.is_empty() {
        let parts: Vec<String> = retraining_epochs.iter().map(|(t, e)| format!("{t} {e} epochs")).collect();
        note.push_str(&format!("; retraining configured: {}", parts.join(", ")));
    }
    let mut outcome = GpuOutcome::new(problem, placed, bound, status, note);
    outcome.warm = warm;
    outcome.retraining_epochs = retraining_epochs;
    if !shared.is_empty() {
        outcome.sharing = sharing;
    }
    outcome
}

/// A previous plan that still holds this round ([`still_planned`]).
struct Kept {
    /// Its schedule, shifted onto this round's slots.
    schedule: Schedule,
    /// The Lagrangian bound at its prices, shifted likewise: a valid bound on this round's problem.
    bound: f64,
}

/// Incremental rounds ([`PlannerConfig::replan_band`](crate::input::PlannerConfig::replan_band)): the GPU's last
/// plan, shifted onto this round's slots, where nothing it depends on moved beyond the band, so that solving again
/// is not worth its cost. The reason to solve again ([`Replan`]) where:
/// - the plan's horizon has run out (every slot it planned is past), or it has no prices to bound it with;
/// - a tenant arrived or left (level 1 moved one, or one was added or removed);
/// - the GPU's health changed, or a tenant's inference instance is not the one the plan runs now (a failed or
///   lagging reconfiguration, a restarted node);
/// - a tenant's retraining became due, or finished other than when the plan had it finish, its epochs changed, or
///   it runs where the plan did not expect it, or does not run where the plan started it; or the shifted plan
///   starts now a retraining whose configuration this round would choose ([`configurable`]);
/// - a tenant's forecast, in any slot, leaves its planned mean widened by `replan_band` times the distance to the
///   planned band's edges (slots beyond the plan's horizon are held against its last, as the shift repeats it);
/// - the shifted schedule is not feasible on this round's problem, or is only by dropping an instance or a
///   retraining the plan runs.
///
/// The plan is valued exactly on this round's problem (its forecasts, accuracies and dead times), and bounded by the
/// Lagrangian bound at its shifted prices, so the gap a kept plan reports is a proven one. The warm start is left
/// as it was, so that its horizon runs out and the GPU is solved again at the latest once every slot it planned
/// is past.
fn still_planned(
    input: &PlannerInput,
    gpu: &GpuId,
    pb: &GpuProblem,
    w: &WarmStart,
    solver: &SolverConfig,
) -> Result<Kept, Replan> {
    let band = input.config.replan_band;
    if w.prices.is_empty() {
        return Err(Replan::HorizonOut);
    }
    if w.tenants.len() != pb.tenants.len() {
        return Err(Replan::Tenants);
    }
    if w.health != Some(input.gpus[gpu].health) {
        return Err(Replan::Health);
    }
    let d = slots_since(w, input, pb).ok_or(Replan::SlotsMoved)?;
    let len = w.prices.len();
    if d >= len {
        return Err(Replan::HorizonOut);
    }
    // Each tenant's part of the last plan, in the problem's order.
    let olds: Vec<_> = pb.tenants.iter().map(|t| w.tenants.iter().find(|o| o.id == t.id)).collect();
    for (t, old) in pb.tenants.iter().zip(&olds) {
        let old = old.ok_or(Replan::Tenants)?;
        let planned = old.planned_for.as_ref().ok_or(Replan::Tenants)?;
        let ti = &input.tenants[&t.id];
        // A retraining that finished when the plan had it finish (its last slot is past) is what the plan planned
        // for: the plan already serves the new accuracy from then on.
        let finished_as_planned =
            planned.retraining_due && !ti.retraining_due && old.retraining.is_some_and(|(_, _, end)| end <= d);
        let moved = ti.retraining_due != planned.retraining_due || ti.retraining_epochs != planned.retraining_epochs;
        if moved && !finished_as_planned {
            return Err(Replan::RetrainingDue);
        }
        // The instance it serves from now is the one the plan gave it for the slot just ended or the one starting.
        let now = t.current_inference.map(|p| p.profile);
        let planned_now = |s: usize| old.inference.get(s.min(old.inference.len() - 1)).copied().flatten();
        if now != planned_now(d.saturating_sub(1)) && now != planned_now(d) {
            return Err(Replan::Instances);
        }
        // A retraining runs now exactly where the plan started it before now and had not yet finished it.
        let running = t.retrain.as_ref().is_some_and(|r| r.running_on.is_some());
        let expected = old.retraining.is_some_and(|(_, start, end)| start < d && end > d);
        if planned.retraining_due && running != expected {
            return Err(Replan::RetrainingRuns);
        }
        let f = &ti.forecast;
        let p = &planned.forecast;
        for s in 0..pb.slots.min(f.mean.len()) {
            let k = (s + d).min(len - 1);
            let (lo, hi) = (p.mean[k] - band * (p.mean[k] - p.low[k]), p.mean[k] + band * (p.high[k] - p.mean[k]));
            let tolerance = 1e-9 * p.mean[k].abs().max(1.0);
            if f.mean[s] < lo - tolerance || f.mean[s] > hi + tolerance {
                return Err(Replan::Forecast);
            }
        }
    }
    let shifted = shift(w, input, pb);
    let schedule = shifted.schedule.ok_or(Replan::Infeasible)?;
    // The shift drops what no longer fits this round's problem (a profile no longer a candidate, a retraining option
    // gone), which a seed may do but a kept plan may not: it must run as planned.
    for (i, (t, old)) in pb.tenants.iter().zip(&olds).enumerate() {
        let old = old.ok_or(Replan::Tenants)?;
        let len = old.inference.len();
        let dropped_inference =
            (0..pb.slots).any(|s| old.inference[(s + d).min(len - 1)].is_some() && schedule.inference[s][i].is_none());
        let running = t.retrain.as_ref().is_some_and(|r| r.running_on.is_some());
        let planned_later = old.retraining.is_some_and(|(_, start, _)| start >= d);
        if dropped_inference || ((running || planned_later) && schedule.retrain[i].is_none()) {
            return Err(Replan::Infeasible);
        }
    }
    let starts_configurable = (0..pb.tenants.len())
        .any(|i| schedule.retrain[i].is_some_and(|o| o.start == 0) && configurable(input, pb, i).is_some());
    if starts_configurable {
        return Err(Replan::RetrainingStarts);
    }
    let prices = shifted.prices.as_deref().ok_or(Replan::HorizonOut)?;
    let bound = cg::bound_at(pb, solver, prices).ok_or(Replan::HorizonOut)?;
    Ok(Kept { schedule, bound })
}

/// Retraining configurations tessera and the perfect-forecast reference choose from: the tenant's default epochs
/// times these. Each has its work ([`tessera_core::tenant::RetrainingSpec::work_for_epochs`]) and the accuracy its
/// curve gives ([`tessera_core::tenant::RetrainingSpec::accuracy_after`]). Ekya keeps its own set
/// ([`crate::policies::ekya::EPOCH_CHOICES`]); the other baselines retrain with the default.
pub const EPOCH_FACTORS: [f64; 4] = [0.5, 1.0, 2.0, 4.0];

/// One column-generation solve of `pb`: seeded by the thief scheduler's allocation, the warm start shifted onto
/// `pb`'s slots and `seed`, priced first at `prices` (else the warm start's); answered from another GPU's solve
/// where `shared` holds one of the same inputs.
fn solve_one(
    input: &PlannerInput,
    pb: &GpuProblem,
    warm: Option<&WarmStart>,
    seed: Option<Schedule>,
    prices: Option<&[Vec<f64>]>,
    solver: &SolverConfig,
    shared: &SharedSolves,
) -> Result<cg::WarmSolved, SolveError> {
    let shifted = warm.map(|w| shift(w, input, pb)).unwrap_or_default();
    let mut seeds = vec![thief_seed(input, pb)];
    seeds.extend(shifted.schedule);
    seeds.extend(seed);
    shared.solve_warm(pb, solver, &seeds, prices.or(shifted.prices.as_deref()))
}

/// The default epochs of tenant `i`'s retraining where the round may still choose its configuration: it is due, has
/// not started (no instance, no work done) and no plan has configured it yet. `None` otherwise: a retraining under
/// way keeps the configuration it started with.
fn configurable(input: &PlannerInput, pb: &GpuProblem, i: usize) -> Option<f64> {
    let t = &pb.tenants[i];
    let ti = &input.tenants[&t.id];
    let r = ti.spec.retraining.as_ref()?;
    let task = t.retrain.as_ref()?;
    (ti.retraining_due
        && task.running_on.is_none()
        && ti.retraining_done_gpu_s <= 0.0
        && ti.retraining_epochs.is_none()
        && task.work_s > 0.0)
        .then_some(r.epochs)
}

/// `pb` with tenant `i`'s retraining at `epochs`: its work, the accuracy it reaches and (with `tail`) its tail value.
fn with_epochs(input: &PlannerInput, pb: &GpuProblem, i: usize, epochs: f64, tail: bool) -> GpuProblem {
    let mut pb = pb.clone();
    let ti = &input.tenants[&pb.tenants[i].id];
    let Some(r) = &ti.spec.retraining else { return pb };
    let t = &mut pb.tenants[i];
    t.acc_new = r.accuracy_after(epochs);
    if let Some(task) = &mut t.retrain {
        task.work_s = (r.work_for_epochs(epochs) - ti.retraining_done_gpu_s).max(0.0);
    }
    if tail {
        t.tail_value = tail_value_of(ti, t);
    }
    pb
}

/// The planning value of `schedule` on `pb`, placed: exact goodput and the tail of the retrainings it completes.
fn placed_value(pb: &GpuProblem, schedule: &Schedule) -> f64 {
    let (goodput, tail) = evaluate::goodput_and_tail(pb, &realize(pb, schedule));
    goodput + tail
}

/// The retraining configurations [`choose_epochs`] settled on.
struct Configured {
    /// The problem with them.
    problem: GpuProblem,
    /// Its solve.
    solved: cg::WarmSolved,
    /// The tenants (by index) configured other than by default, with their epochs.
    chosen: Vec<(usize, f64)>,
}

/// Chooses each configurable retraining's epochs ([`configurable`], [`EPOCH_FACTORS`]) together with the layout:
/// tenant by tenant, where the best plan so far starts the tenant's retraining now, the GPU is solved again with it
/// at more epochs (2x, then 4x while that gains) or, where more does not gain, at fewer (0.5x); where the plan leaves
/// the retraining out, at fewer only. Each solve is seeded by the best plan so far and priced at its prices; a
/// configuration is kept only where its plan's exact planning value (goodput and tail) beats the best.
/// More epochs cost more work on a longer-held instance and buy a better model: the solve decides whether the
/// slices are there (idle slices buy accuracy, busy ones do not). `tail`: the problem credits retraining beyond the
/// horizon ([`tail_values`]).
fn choose_epochs(
    input: &PlannerInput,
    problem: GpuProblem,
    first: cg::WarmSolved,
    warm: Option<&WarmStart>,
    solver: &SolverConfig,
    shared: &SharedSolves,
    tail: bool,
) -> Result<Configured, SolveError> {
    let mut best_value = placed_value(&problem, &first.solved.schedule);
    let (mut best_pb, mut best) = (problem, first);
    let mut chosen: Vec<(usize, f64)> = Vec::new();
    for i in 0..best_pb.tenants.len() {
        let Some(default) = configurable(input, &best_pb, i) else { continue };
        // Only a retraining that starts now takes its configuration this round; one planned to start later is
        // configured in the round it starts. One the plan leaves out may fit at fewer epochs.
        let up = EPOCH_FACTORS.iter().copied().filter(|f| *f > 1.0).collect::<Vec<_>>();
        let down = EPOCH_FACTORS.iter().copied().rev().filter(|f| *f < 1.0).collect::<Vec<_>>();
        let directions = match best.solved.schedule.retrain[i] {
            Some(o) if o.start == 0 => vec![up, down],
            Some(_) => continue,
            None => vec![down],
        };
        for direction in directions {
            let mut gained = false;
            for factor in direction {
                let alt = with_epochs(input, &best_pb, i, default * factor, tail);
                if alt.tenants[i].acc_new <= alt.tenants[i].acc_old {
                    break;
                }
                // The best plan so far, with this tenant's retraining moved to the same start and profile where
                // that is still an option (and fits), else without it.
                let mut seed = best.solved.schedule.clone();
                let old = seed.retrain[i];
                seed.retrain[i] = old.and_then(|o| {
                    alt.retrain_options(i).into_iter().find(|n| n.profile == o.profile && n.start == o.start)
                });
                if !seed.feasible(&alt) {
                    seed.retrain[i] = None;
                }
                let solved = solve_one(input, &alt, warm, Some(seed), Some(&best.prices), solver, shared)?;
                let value = placed_value(&alt, &solved.solved.schedule);
                if value <= best_value + 1e-9 * best_value.abs().max(1.0) {
                    break;
                }
                (best_value, best_pb, best) = (value, alt, solved);
                chosen.retain(|(k, _)| *k != i);
                chosen.push((i, default * factor));
                gained = true;
            }
            if gained {
                break;
            }
        }
    }
    Ok(Configured { problem: best_pb, solved: best, chosen })
}

/// The epochs a plan states per tenant, where other than the spec's default: those [`choose_epochs`] chose, and
/// those of retrainings under way (the executor takes the epochs of the latest plan that gives the tenant a
/// retraining instance, so a plan that did not restate them would reset the job to the default).
fn planned_epochs(input: &PlannerInput, pb: &GpuProblem, chosen: &[(usize, f64)]) -> BTreeMap<TenantId, f64> {
    let mut out = BTreeMap::new();
    for (i, t) in pb.tenants.iter().enumerate() {
        let ti = &input.tenants[&t.id];
        let Some(r) = &ti.spec.retraining else { continue };
        let epochs = chosen.iter().find(|(k, _)| *k == i).map(|(_, e)| *e).or(ti.retraining_epochs);
        if let Some(e) = epochs.filter(|e| *e != r.epochs) {
            out.insert(t.id.clone(), e);
        }
    }
    out
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

/// What the next round starts from: this round's schedule and best-bound prices, and what they were made for.
fn warm_start(
    input: &PlannerInput,
    gpu: &GpuId,
    pb: &GpuProblem,
    schedule: &Schedule,
    prices: Vec<Vec<f64>>,
) -> WarmStart {
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
                planned_for: input.tenants.get(&t.id).map(|ti| PlannedFor {
                    forecast: planned_forecast(&ti.forecast, pb.slots),
                    retraining_due: ti.retraining_due,
                    retraining_epochs: ti.retraining_epochs,
                }),
            })
            .collect(),
        prices,
        health: input.gpus.get(gpu).map(|g| g.health),
    }
}

/// `forecast` over exactly `slots` slots (its last repeated, as the problem reads a short one).
fn planned_forecast(forecast: &Forecast, slots: usize) -> Forecast {
    let at = |v: &[f64], t: usize| v.get(t.min(v.len().saturating_sub(1))).copied().unwrap_or(0.0);
    let over = |v: &[f64]| (0..slots).map(|t| at(v, t)).collect();
    Forecast { mean: over(&forecast.mean), low: over(&forecast.low), high: over(&forecast.high) }
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
    let Some(d) = slots_since(w, input, pb) else { return Shifted::default() };
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

/// How many of `pb`'s slots this round starts after `w`'s slot 0, to the nearest slot: rounds on a virtual clock
/// fall on slot boundaries, rounds on a wall clock (the coordinator's) a few milliseconds to seconds off them, and a
/// plan's slot is the nearest one. `None` where the slots do not line up: another slot length, or a warm start from
/// the future.
fn slots_since(w: &WarmStart, input: &PlannerInput, pb: &GpuProblem) -> Option<usize> {
    let slot_ms = pb.slot_s * 1000.0;
    let elapsed = input.now.as_ms().checked_sub(w.at.as_ms())? as f64;
    ((w.slot_s - pb.slot_s).abs() <= 1e-9).then_some((elapsed / slot_ms).round() as usize)
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
        t.tail_value = tail_value_of(&input.tenants[&t.id], t);
    }
}

/// [`tail_values`] of one tenant (0 without a retraining).
fn tail_value_of(input: &TenantInput, t: &TenantTask) -> f64 {
    let Some(window_s) = input.spec.retraining.as_ref().map(|r| r.window_ms as f64 / 1000.0) else {
        return t.tail_value;
    };
    if t.retrain.is_none() {
        return t.tail_value;
    }
    let best = t.cap.iter().copied().fold(0.0, f64::max);
    let rate: f64 = t.scenarios.iter().map(|s| s.prob * s.rate.last().copied().unwrap_or(0.0).min(best)).sum();
    TAIL_WINDOWS * t.weight * (t.acc_new - t.acc_old).max(0.0) * rate * window_s
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
