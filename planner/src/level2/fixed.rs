//! Fixed layouts over a horizon: the machinery the `static` and `paris` baselines share.
//!
//! A fixed-layout policy sets a layout, gives some of its instances to tenants for inference (a tenant may hold
//! several), and keeps the layout for the whole horizon. The other instances form a **retraining pool**: each slot,
//! every pending retraining (tenant-id order, as a first-come batch queue would run them) takes the largest free
//! pool instance its job fits and keeps it until its work is done (non-preemptive); a retraining already running on
//! a pool instance continues there. Instances nobody uses stay idle rather than be destroyed: a fixed layout never
//! reconfigures.
//!
//! A fixed policy is static "for the deployment": once a GPU serves exactly a policy's tenants with instances the
//! layout still holds, [`keep_current`] hands the current layout back unchanged, so later rounds never reshuffle
//! instances because a forecast moved.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use tessera_core::plan::{Assignment, Role};
use tessera_core::{Layout, Placement};

use crate::input::GpuInput;
use crate::level2::problem::GpuProblem;
use crate::level2::realize::{Placed, current_assignments, free_in};

/// A fixed layout and who serves from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fixed {
    /// The layout.
    pub layout: Layout,
    /// Inference instances: `(placement, tenant index)`.
    pub inference: Vec<(Placement, usize)>,
}

impl Fixed {
    /// Instances no tenant serves inference from: the retraining pool.
    pub fn pool(&self) -> Vec<Placement> {
        self.layout.placements().iter().copied().filter(|p| !self.inference.iter().any(|(q, _)| q == p)).collect()
    }
}

/// The current layout of `gpu` as a [`Fixed`], when it serves only tenants of `pb`, from instances it still holds,
/// and at least as many of them as `fresh` (the instances the policy would hand out now): a static policy keeps it.
/// A tenant that no instance can serve now (its SLO capacity is 0 on each, as under a large slowdown), or that only
/// an instance another tenant holds could serve, does not force a new layout every round as forecasts reorder the
/// tenants; a new tenant that `fresh` can serve as well does.
pub fn keep_current(pb: &GpuProblem, gpu: &GpuInput, fresh: &Fixed) -> Option<Fixed> {
    let mut inference = Vec::new();
    for a in gpu.assignments.iter().filter(|a| a.role == Role::Inference) {
        let i = pb.tenants.iter().position(|t| t.id == a.tenant)?;
        if !gpu.layout.contains(a.placement) {
            return None;
        }
        inference.push((a.placement, i));
    }
    let served = |f: &[(Placement, usize)]| f.iter().map(|(_, i)| *i).collect::<std::collections::BTreeSet<_>>().len();
    let enough = served(&inference) >= served(&fresh.inference);
    (enough && !inference.is_empty()).then(|| Fixed { layout: gpu.layout.clone(), inference })
}

/// Runs `fixed` over the horizon of `pb` (see the module doc).
pub fn run(pb: &GpuProblem, fixed: &Fixed) -> Placed {
    let n = pb.tenants.len();
    let pool = fixed.pool();
    let dt = pb.slot_s;
    // Per tenant: the pool instance its retraining holds, its progress, whether it is done.
    let mut running: Vec<Option<Placement>> = vec![None; n];
    let mut progress = vec![0.0f64; n];
    let mut done = vec![false; n];
    for (i, t) in pb.tenants.iter().enumerate() {
        if let Some(pl) = t.retrain.as_ref().and_then(|r| r.running_on)
            && pool.contains(&pl)
        {
            running[i] = Some(pl);
        }
    }
    let speed = |i: usize, pl: Placement| -> f64 {
        let t = &pb.tenants[i];
        match (pb.profile_index(pl.profile), &t.retrain) {
            (Some(p), Some(r)) => r.speed[p],
            _ => 0.0,
        }
    };
    let mut prev: Vec<Assignment> = current_assignments(pb);
    let mut prev_layout = pb.current.clone();
    let mut slots = Vec::with_capacity(pb.slots);
    for _ in 0..pb.slots {
        // Pending jobs take the largest free pool instance they fit, in tenant order.
        for i in 0..n {
            let Some(r) = &pb.tenants[i].retrain else { continue };
            if done[i] || running[i].is_some() || r.work_s <= 0.0 {
                continue;
            }
            let pick = pool
                .iter()
                .filter(|pl| !running.contains(&Some(**pl)) && speed(i, **pl) > 0.0)
                .max_by(|a, b| speed(i, **a).total_cmp(&speed(i, **b)).then(b.cmp(a)));
            running[i] = pick.copied();
        }
        let mut here: Vec<Assignment> = Vec::new();
        let mut add = |placement: Placement, i: usize, role: Role| {
            let tenant = pb.tenants[i].id.clone();
            let kept = prev.iter().any(|a| a.tenant == tenant && a.role == role && a.placement == placement);
            here.push(Assignment { placement, tenant, role, preinit: !kept && free_in(&prev_layout, placement) });
        };
        for (pl, i) in &fixed.inference {
            add(*pl, *i, Role::Inference);
        }
        for i in 0..n {
            if let Some(pl) = running[i] {
                add(pl, i, Role::Retraining);
            }
        }
        // Progress; a finished job frees its instance from the next slot.
        for i in 0..n {
            if let Some(pl) = running[i] {
                progress[i] += speed(i, pl) * dt;
                let work = pb.tenants[i].retrain.as_ref().map_or(0.0, |r| r.work_s);
                if progress[i] >= work - 1e-9 {
                    done[i] = true;
                    running[i] = None;
                }
            }
        }
        here.sort();
        // The layout stays whole: idle instances count as present for the next slot's pre-initialisation.
        prev_layout = fixed.layout.clone();
        prev = here.clone();
        slots.push(here);
    }
    Placed { slots, dropped: Vec::new() }
}

/// "a: 3g.20gb@0 + 1g.5gb@6; pool 2g.10gb@4" for operators.
pub fn describe(pb: &GpuProblem, fixed: &Fixed) -> String {
    let mut parts = Vec::new();
    for (i, t) in pb.tenants.iter().enumerate() {
        let mine: Vec<String> = fixed
            .inference
            .iter()
            .filter(|(_, j)| *j == i)
            .map(|(p, _)| format!("{}@{}", pb.gpu.profile(p.profile).map_or("?", |s| s.name), p.start))
            .collect();
        parts.push(format!("{}: {}", t.id, if mine.is_empty() { "unserved".to_string() } else { mine.join(" + ") }));
    }
    let pool: Vec<String> = fixed
        .pool()
        .iter()
        .map(|p| format!("{}@{}", pb.gpu.profile(p.profile).map_or("?", |s| s.name), p.start))
        .collect();
    if !pool.is_empty() {
        parts.push(format!("retraining pool {}", pool.join(" ")));
    }
    parts.join("; ")
}
