//! Exhaustive search over the count-level model: the cross-check that the MILP formulations reach the optimum.
//!
//! Every combination of retraining options (or none) is tried; for each, a dynamic programme over slots whose
//! state is the vector of inference profiles (one per tenant, or none) finds the best inference schedule. Only
//! for tiny problems: the state space is `(profiles + 1) ^ tenants` per slot.
//!
//! [`solve_placed`] does the same over placements instead of profiles (the MIGRator model: a task that moves to
//! another placement of the same profile is charged the dead time too, and a running retraining cannot move).

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use tessera_core::{Layout, Placement};

use crate::level2::problem::{GpuProblem, RetrainOption, Schedule};

/// The optimal count-level schedule of `pb` and its objective ([`Schedule::objective`]).
pub fn solve(pb: &GpuProblem) -> (Schedule, f64) {
    let feasible = |counts: &[u8]| pb.counts_feasible(counts);
    search(pb, &feasible)
}

/// The optimal placement-level objective of `pb`, with each slot's placements.
pub fn solve_placed(pb: &GpuProblem) -> (Vec<Vec<Option<Placement>>>, f64) {
    // Re-express the problem with one "profile" per placement.
    let placements: Vec<Placement> =
        Placement::all_for(&pb.profiles).into_iter().filter(|p| pb.gpu.profile(p.profile).is_some()).collect();
    let of = |q: usize| pb.profile_index(placements[q].profile).expect("from the problem's profiles");
    let mut unit = pb.clone();
    unit.profiles = placements.iter().map(|p| p.profile).collect();
    for (i, t) in unit.tenants.iter_mut().enumerate() {
        t.cap = (0..placements.len()).map(|q| pb.tenants[i].cap[of(q)]).collect();
        if let Some(r) = &mut t.retrain {
            r.speed =
                (0..placements.len()).map(|q| pb.tenants[i].retrain.as_ref().expect("same").speed[of(q)]).collect();
        }
    }
    let feasible = |counts: &[u8]| {
        let mut layout = Layout::empty();
        for (q, c) in counts.iter().enumerate() {
            match c {
                0 => {}
                1 if layout.can_add(pb.gpu, placements[q]) => layout.insert(placements[q]),
                _ => return false,
            }
        }
        true
    };
    let index = |pl: Option<Placement>| pl.and_then(|pl| placements.iter().position(|p| *p == pl));
    let (schedule, value) =
        search_units(&unit, &feasible, Charge::Fixed(pb.dead_preinit_s), &|t| index(t.current_inference), &|t| {
            index(t.retrain.as_ref().and_then(|r| r.running_on))
        });
    let placed = schedule.inference.iter().map(|row| row.iter().map(|u| u.map(|q| placements[q])).collect()).collect();
    (placed, value)
}

fn search(pb: &GpuProblem, feasible: &dyn Fn(&[u8]) -> bool) -> (Schedule, f64) {
    search_units(
        pb,
        feasible,
        Charge::Room,
        &|t| t.current_inference.and_then(|pl| pb.profile_index(pl.profile)),
        &|t| t.retrain.as_ref().and_then(|r| r.running_on).and_then(|pl| pb.profile_index(pl.profile)),
    )
}

type UnitOf<'a> = dyn Fn(&crate::level2::problem::TenantTask) -> Option<usize> + 'a;

/// How a changed instance is charged.
#[derive(Clone, Copy)]
enum Charge {
    /// As the count-level model does: pre-initialised when the new instances fit beside the previous slot.
    Room,
    /// A fixed dead time (MIGRator's `R`).
    Fixed(f64),
}

fn search_units(
    pb: &GpuProblem,
    feasible: &dyn Fn(&[u8]) -> bool,
    charge: Charge,
    current: &UnitOf<'_>,
    running: &UnitOf<'_>,
) -> (Schedule, f64) {
    let n = pb.tenants.len();
    let np = pb.profiles.len();
    let options: Vec<Vec<Option<RetrainOption>>> = (0..n)
        .map(|i| {
            let os = unit_options(pb, i, running);
            let forced = pb.tenants[i].retrain.as_ref().is_some_and(|r| r.running_on.is_some()) && !os.is_empty();
            let mut v: Vec<Option<RetrainOption>> = os.into_iter().map(Some).collect();
            if !forced {
                v.push(None);
            }
            v
        })
        .collect();
    // Every inference vector.
    let choices: Vec<Vec<Option<usize>>> = (0..n)
        .map(|i| std::iter::once(None).chain((0..np).filter(|p| pb.tenants[i].cap[*p] > 0.0).map(Some)).collect())
        .collect();
    let mut vectors: Vec<Vec<Option<usize>>> = vec![Vec::new()];
    for c in &choices {
        vectors = vectors.iter().flat_map(|v| c.iter().map(move |x| [v.clone(), vec![*x]].concat())).collect();
    }
    let mut best: Option<(f64, Schedule)> = None;
    let mut combo = vec![0usize; n];
    loop {
        let retrain: Vec<Option<RetrainOption>> = (0..n).map(|i| options[i][combo[i]]).collect();
        let tail: f64 = retrain.iter().enumerate().map(|(i, o)| pb.tail_value(i, *o)).sum();
        if let Some((value, schedule)) =
            best_inference(pb, &retrain, &vectors, feasible, charge, current).map(|(v, s)| (v + tail, s))
            && best.as_ref().is_none_or(|(b, _)| value > *b + 1e-9)
        {
            best = Some((value, schedule));
        }
        // Next combination.
        let mut k = 0;
        while k < n {
            combo[k] += 1;
            if combo[k] < options[k].len() {
                break;
            }
            combo[k] = 0;
            k += 1;
        }
        if k == n {
            break;
        }
    }
    let (value, schedule) = best.expect("the empty schedule is always feasible");
    (schedule, value)
}

/// Retraining options over units: like [`GpuProblem::retrain_options`], with the running job on its own unit.
fn unit_options(pb: &GpuProblem, i: usize, running: &UnitOf<'_>) -> Vec<RetrainOption> {
    let t = &pb.tenants[i];
    match (t.retrain.as_ref().and_then(|r| r.running_on), running(t)) {
        (Some(_), Some(u)) => {
            let mut os = pb.retrain_options(i);
            for o in &mut os {
                o.profile = u;
            }
            os
        }
        _ => pb.retrain_options(i),
    }
}

fn best_inference(
    pb: &GpuProblem,
    retrain: &[Option<RetrainOption>],
    vectors: &[Vec<Option<usize>>],
    feasible: &dyn Fn(&[u8]) -> bool,
    charge: Charge,
    current: &UnitOf<'_>,
) -> Option<(f64, Schedule)> {
    let n = pb.tenants.len();
    let np = pb.profiles.len();
    let dt = pb.slot_s;
    let counts_at = |t: usize, v: &[Option<usize>]| {
        let mut c = vec![0u8; np];
        for p in v.iter().flatten() {
            c[*p] += 1;
        }
        for o in retrain.iter().flatten() {
            if o.active(t) {
                c[o.profile] += 1;
            }
        }
        c
    };
    let feasible_at = |t: usize, v: &[Option<usize>]| feasible(&counts_at(t, v));
    let done = |i: usize, t: usize| retrain[i].is_some_and(|o| o.end <= t);
    let gain = |t: usize, prev: &[Option<usize>], cur: &[Option<usize>]| -> f64 {
        let dead = match charge {
            Charge::Fixed(d) => d.min(dt),
            Charge::Room => {
                let before = if t == 0 { pb.current_usage() } else { pb.usage_of(&counts_at(t - 1, prev)) };
                return pb.slot_value(t, prev, cur, &before, |i| done(i, t));
            }
        };
        let mut g = 0.0;
        for i in 0..n {
            let tenant = &pb.tenants[i];
            let Some(p) = cur[i] else { continue };
            let d = if prev[i] != cur[i] { dead } else { 0.0 };
            let capacity = tenant.cap[p] * (dt - d);
            let acc = if retrain[i].is_some_and(|o| o.end <= t) { tenant.acc_new } else { tenant.acc_old };
            for s in &tenant.scenarios {
                let arrivals = s.rate.get(t).copied().unwrap_or(0.0) * dt;
                g += tenant.weight * s.prob * acc * arrivals.min(capacity);
            }
        }
        g
    };
    let initial: Vec<Option<usize>> = pb.tenants.iter().map(current).collect();
    // value[t][k], parent[t][k]
    let mut value: Vec<Vec<f64>> = Vec::with_capacity(pb.slots);
    let mut parent: Vec<Vec<usize>> = Vec::with_capacity(pb.slots);
    for t in 0..pb.slots {
        let mut row = vec![f64::NEG_INFINITY; vectors.len()];
        let mut from = vec![usize::MAX; vectors.len()];
        for (k, v) in vectors.iter().enumerate() {
            if !feasible_at(t, v) {
                continue;
            }
            if t == 0 {
                row[k] = gain(0, &initial, v);
            } else {
                for (j, u) in vectors.iter().enumerate() {
                    let before = value[t - 1][j];
                    if before == f64::NEG_INFINITY {
                        continue;
                    }
                    let candidate = before + gain(t, u, v);
                    if candidate > row[k] + 1e-12 {
                        row[k] = candidate;
                        from[k] = j;
                    }
                }
            }
        }
        value.push(row);
        parent.push(from);
    }
    let last = value.last()?;
    let (mut k, best) = last.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))?;
    if best == f64::NEG_INFINITY {
        return None;
    }
    let mut schedule = Schedule { inference: vec![Vec::new(); pb.slots], retrain: retrain.to_vec() };
    for t in (0..pb.slots).rev() {
        schedule.inference[t] = vectors[k].clone();
        if t > 0 {
            k = parent[t][k];
        }
    }
    Some((value[pb.slots - 1][k_last(&value)], schedule))
}

fn k_last(value: &[Vec<f64>]) -> usize {
    let last = value.last().expect("at least one slot");
    last.iter().copied().enumerate().max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0))).map_or(0, |(k, _)| k)
}
