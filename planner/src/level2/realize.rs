//! From a count-level [`Schedule`] to placed instances, slot by slot.
//!
//! Each slot's instances are placed by a small exhaustive search (at most seven instances, a handful of starts
//! each) that maximises, in order: a running retraining keeps its instance (required: retraining is
//! non-preemptive); a newly started retraining gets an instance that every later slot of its run can be built
//! around; an inference instance keeps its placement when its profile is unchanged; a new instance lands on slices
//! that were free in the previous slot, so it can be pre-initialised before the switch (make-before-break). If a
//! slot cannot be built at all (only possible when a fixed retraining instance blocks a count vector), the
//! inference instance with the least capacity is left out and the search repeats; [`crate::level2::evaluate`] then charges
//! what that costs, so a plan's expected goodput is always that of what it actually places.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use tessera_core::plan::{Assignment, Role};
use tessera_core::{GpuModel, Layout, Placement};

use crate::level2::problem::{GpuProblem, Schedule};

/// Placed instances per slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placed {
    /// `slots[t]`: the assignments of slot `t` (preinit marks instances new in that slot on free slices).
    pub slots: Vec<Vec<Assignment>>,
    /// Inference instances the placement had to leave out, as `(slot, tenant index)`.
    pub dropped: Vec<(usize, usize)>,
}

impl Placed {
    /// The layout of slot `t`.
    pub fn layout(&self, t: usize) -> Layout {
        // A shared instance carries two assignments (inference and retraining): one placement.
        let placements: std::collections::BTreeSet<Placement> = self.slots[t].iter().map(|a| a.placement).collect();
        Layout::new(placements)
    }
}

#[derive(Clone, Copy)]
struct Demand {
    tenant: usize,
    role: Role,
    profile: usize,
    /// A placement it must keep.
    fixed: Option<Placement>,
    /// The placement it had in the previous slot with the same profile.
    previous: Option<Placement>,
}

/// The problem's tenants' instances on the GPU now.
pub(crate) fn current_assignments(pb: &GpuProblem) -> Vec<Assignment> {
    pb.tenants
        .iter()
        .flat_map(|t| {
            let inf = t.current_inference.map(|p| (p, Role::Inference));
            let rt = t.retrain.as_ref().and_then(|r| r.running_on).map(|p| (p, Role::Retraining));
            inf.into_iter().chain(rt).map(|(placement, role)| Assignment {
                placement,
                tenant: t.id.clone(),
                role,
                preinit: false,
            })
        })
        .collect()
}

/// Whether `p` uses only slices that `layout` leaves free.
pub(crate) fn free_in(layout: &Layout, p: Placement) -> bool {
    layout.memory_mask() & p.memory_mask() == 0 && layout.compute_mask() & p.compute_mask() == 0
}

/// Places `schedule` slot by slot.
pub fn realize(pb: &GpuProblem, schedule: &Schedule) -> Placed {
    let mut slots: Vec<Vec<Assignment>> = Vec::with_capacity(pb.slots);
    let mut dropped = Vec::new();
    let mut prev = current_assignments(pb);
    let mut prev_layout = pb.current.clone();
    for t in 0..pb.slots {
        let mut demands = Vec::new();
        for (i, tenant) in pb.tenants.iter().enumerate() {
            let had = |role: Role| prev.iter().find(|a| a.tenant == tenant.id && a.role == role).map(|a| a.placement);
            if let Some(o) = schedule.retrain[i]
                && o.active(t)
            {
                let continuing =
                    t > o.start || (t == 0 && tenant.retrain.as_ref().is_some_and(|r| r.running_on.is_some()));
                let fixed = if continuing { had(Role::Retraining) } else { None };
                demands.push(Demand { tenant: i, role: Role::Retraining, profile: o.profile, fixed, previous: None });
            }
            if let Some(p) = schedule.inference[t][i] {
                let previous = had(Role::Inference).filter(|pl| pl.profile == pb.profiles[p]);
                demands.push(Demand { tenant: i, role: Role::Inference, profile: p, fixed: None, previous });
            }
        }
        let future = |start: usize, end: usize| -> Vec<(usize, Vec<u8>)> {
            (start..end.min(pb.slots)).map(|s| (s, schedule.counts(s, pb.profiles.len()))).collect()
        };
        let placed = loop {
            if let Some(found) = place_slot(pb, &demands, &prev_layout, |d, placement| {
                // Lookahead for a retraining that starts now: every later slot of its run must fit around it.
                let Some(o) = schedule.retrain[d.tenant] else { return true };
                if d.role != Role::Retraining || d.fixed.is_some() {
                    return true;
                }
                future(t + 1, o.end).iter().all(|(_, counts)| {
                    let mut c = counts.clone();
                    c[d.profile] -= 1;
                    fits_around(pb, &Layout::new([placement]), &c)
                })
            }) {
                break found;
            }
            // Leave out the inference demand with the least capacity.
            let worst = demands
                .iter()
                .enumerate()
                .filter(|(_, d)| d.role == Role::Inference)
                .min_by(|a, b| {
                    let ca = pb.tenants[a.1.tenant].cap[a.1.profile];
                    let cb = pb.tenants[b.1.tenant].cap[b.1.profile];
                    ca.total_cmp(&cb).then(a.0.cmp(&b.0))
                })
                .map(|(k, _)| k);
            match worst {
                Some(k) => {
                    dropped.push((t, demands[k].tenant));
                    demands.remove(k);
                }
                None => {
                    // Only fixed retraining instances remain and they conflict: impossible for a valid input.
                    demands.retain(|d| d.fixed.is_none());
                }
            }
        };
        let assignments: Vec<Assignment> = demands
            .iter()
            .zip(&placed)
            .map(|(d, pl)| {
                let kept =
                    prev.iter().any(|a| a.tenant == pb.tenants[d.tenant].id && a.role == d.role && a.placement == *pl);
                let free_before = free_in(&prev_layout, *pl);
                Assignment {
                    placement: *pl,
                    tenant: pb.tenants[d.tenant].id.clone(),
                    role: d.role,
                    preinit: !kept && free_before,
                }
            })
            .collect();
        prev_layout = Layout::new(assignments.iter().map(|a| a.placement));
        prev = assignments.clone();
        slots.push(assignments);
    }
    Placed { slots, dropped }
}

/// The best placement of `demands` (same order), or `None` when they cannot all be placed.
fn place_slot(
    pb: &GpuProblem,
    demands: &[Demand],
    prev_layout: &Layout,
    retrain_ok: impl Fn(&Demand, Placement) -> bool,
) -> Option<Vec<Placement>> {
    // Most constrained first: fixed, then large profiles.
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|k| {
        let d = &demands[*k];
        (d.fixed.is_none(), std::cmp::Reverse(pb.profiles[d.profile].memory_slices()), *k)
    });
    let mut best: Option<(i64, Vec<Placement>)> = None;
    let mut chosen = vec![Placement::new(pb.profiles[0], 0); demands.len()];
    search(pb.gpu, pb, demands, &order, 0, &mut Layout::empty(), &mut chosen, 0, prev_layout, &retrain_ok, &mut best);
    best.map(|(_, p)| p)
}

#[allow(clippy::too_many_arguments)]
fn search(
    gpu: GpuModel,
    pb: &GpuProblem,
    demands: &[Demand],
    order: &[usize],
    depth: usize,
    layout: &mut Layout,
    chosen: &mut Vec<Placement>,
    score: i64,
    prev_layout: &Layout,
    retrain_ok: &impl Fn(&Demand, Placement) -> bool,
    best: &mut Option<(i64, Vec<Placement>)>,
) {
    if depth == order.len() {
        if best.as_ref().is_none_or(|(s, _)| score > *s) {
            *best = Some((score, chosen.clone()));
        }
        return;
    }
    // Upper bound: every remaining demand gets the best score.
    if let Some((s, _)) = best
        && score + 1000 * (order.len() - depth) as i64 <= *s
    {
        return;
    }
    let d = &demands[order[depth]];
    let candidates: Vec<Placement> = match d.fixed {
        Some(p) => vec![p],
        None => Placement::all_for(&[pb.profiles[d.profile]]),
    };
    for p in candidates {
        if !layout.can_add(gpu, p) {
            continue;
        }
        let mut gain = 0;
        if d.fixed.is_none() {
            if d.previous == Some(p) {
                gain += 1000;
            } else if free_in(prev_layout, p) {
                gain += 100;
            }
            if d.role == Role::Retraining {
                if retrain_ok(d, p) {
                    gain += 500;
                } else {
                    gain -= 500;
                }
            }
        } else {
            gain += 1000;
        }
        layout.insert(p);
        chosen[order[depth]] = p;
        search(gpu, pb, demands, order, depth + 1, layout, chosen, score + gain, prev_layout, retrain_ok, best);
        layout.remove(p);
    }
}

/// Whether instances with `counts` (over the problem's profiles) fit around `fixed`.
fn fits_around(pb: &GpuProblem, fixed: &Layout, counts: &[u8]) -> bool {
    let mut need: Vec<usize> = Vec::new();
    for (p, c) in counts.iter().enumerate() {
        need.extend(std::iter::repeat_n(p, usize::from(*c)));
    }
    need.sort_by_key(|p| std::cmp::Reverse(pb.profiles[*p].memory_slices()));
    fn go(pb: &GpuProblem, need: &[usize], layout: &mut Layout) -> bool {
        let Some((&p, rest)) = need.split_first() else { return true };
        for pl in Placement::all_for(&[pb.profiles[p]]) {
            if layout.can_add(pb.gpu, pl) {
                layout.insert(pl);
                let ok = go(pb, rest, layout);
                layout.remove(pl);
                if ok {
                    return true;
                }
            }
        }
        false
    }
    go(pb, &need, &mut fixed.clone())
}

/// A [`Placed`] from per-slot assignments chosen elsewhere (a placement-level solver), with the pre-initialise
/// flags set the same way as [`realize`] sets them.
pub fn from_assignments(pb: &GpuProblem, mut slots: Vec<Vec<Assignment>>) -> Placed {
    let mut prev = current_assignments(pb);
    let mut prev_layout = pb.current.clone();
    for slot in &mut slots {
        slot.sort();
        for a in slot.iter_mut() {
            let kept = prev.iter().any(|b| b.tenant == a.tenant && b.role == a.role && b.placement == a.placement);
            let free_before = free_in(&prev_layout, a.placement);
            a.preinit = !kept && free_before;
        }
        prev_layout = Layout::new(slot.iter().map(|a| a.placement));
        prev = slot.clone();
    }
    Placed { slots, dropped: Vec::new() }
}
