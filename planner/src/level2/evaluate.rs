//! The expected goodput of a placed schedule: the number a plan reports and the one policies are compared by.
//!
//! Per tenant and slot: each inference instance serves `cap x (slot - dead)` requests within SLO at most, where
//! `dead` is 0 for an instance kept from the previous slot, `dead_preinit_s` for a new instance on slices that were
//! free in the previous slot (created and warmed before the switch) and `dead_cold_s` otherwise (capped at one
//! slot); a tenant's instances add up. Served = `min(arrivals, capacity)` per arrival scenario, weighted by the
//! scenario's probability, times the accuracy of the serving model: `acc_old` until the retraining has done its
//! work, `acc_new` from the slot after. Retraining progresses by the profile's speed for each slot it holds its
//! instance; a retraining that loses its instance starts over (non-preemptive, no checkpoint within a plan). A
//! retraining on the tenant's own inference instance (a shared instance, [`crate::level2::problem::SharedTask`])
//! progresses by the share of the instance inference leaves it, and that instance serves at the shared capacity.
//! [`goodput_and_tail`] adds what the completed retrainings earn beyond the horizon, for the policies that count it.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use tessera_core::plan::Role;

use crate::input::PlannerInput;
use crate::level2::problem::{GpuProblem, Scenario};
use crate::level2::realize::{Placed, free_in};

/// Expected goodput of `placed` on `pb`, per tenant, with each tenant's arrivals from `scenarios(i)`.
pub fn goodput_per_tenant<'a>(
    pb: &'a GpuProblem,
    placed: &Placed,
    scenarios: impl Fn(usize) -> &'a [Scenario],
) -> Vec<f64> {
    run(pb, placed, scenarios).0
}

/// [`goodput_and_tail`], and per tenant the share of its retraining's work done by the end of the horizon on the
/// instance it holds in the last slot (1 once completed; 0 without a retraining there).
pub fn goodput_tail_progress(pb: &GpuProblem, placed: &Placed) -> (f64, f64, Vec<f64>) {
    let (goodput, done, progress) = run_full(pb, placed, |i| &pb.tenants[i].scenarios);
    let tail = pb.tenants.iter().zip(done).filter(|(_, d)| *d).map(|(t, _)| t.tail_value).sum();
    (goodput.iter().sum(), tail, progress)
}

/// [`goodput`], and what the retrainings `placed` completes within the horizon earn beyond it
/// ([`crate::level2::problem::TenantTask::tail_value`]): the part of a policy's planning value that the horizon's
/// goodput does not count.
pub fn goodput_and_tail(pb: &GpuProblem, placed: &Placed) -> (f64, f64) {
    let (goodput, done) = run(pb, placed, |i| &pb.tenants[i].scenarios);
    let tail = pb.tenants.iter().zip(done).filter(|(_, d)| *d).map(|(t, _)| t.tail_value).sum();
    (goodput.iter().sum(), tail)
}

/// Goodput per tenant, and whether each tenant's retraining completed within the horizon.
fn run<'a>(pb: &'a GpuProblem, placed: &Placed, scenarios: impl Fn(usize) -> &'a [Scenario]) -> (Vec<f64>, Vec<bool>) {
    let (out, completed, _) = run_full(pb, placed, scenarios);
    (out, completed)
}

/// [`run`], and each tenant's retraining progress at the end (a share of its work).
fn run_full<'a>(
    pb: &'a GpuProblem,
    placed: &Placed,
    scenarios: impl Fn(usize) -> &'a [Scenario],
) -> (Vec<f64>, Vec<bool>, Vec<f64>) {
    let dt = pb.slot_s;
    let mut out = vec![0.0; pb.tenants.len()];
    let mut completed = vec![false; pb.tenants.len()];
    let mut share_done = vec![0.0; pb.tenants.len()];
    for (i, t) in pb.tenants.iter().enumerate() {
        let mut prev_inf: Vec<tessera_core::Placement> = t.current_inference.into_iter().collect();
        let mut prev_rt = t.retrain.as_ref().and_then(|r| r.running_on);
        let mut progress = 0.0;
        let work = t.retrain.as_ref().map_or(f64::INFINITY, |r| r.work_s);
        let mut done = false;
        let mut prev_layout = pb.current.clone();
        for slot in 0..pb.slots {
            let acc = if done { t.acc_new } else { t.acc_old };
            let here = &placed.slots[slot];
            // A tenant may hold several inference instances (PARIS's heterogeneous partitions): their capacities add.
            let inf: Vec<tessera_core::Placement> =
                here.iter().filter(|a| a.tenant == t.id && a.role == Role::Inference).map(|a| a.placement).collect();
            let rt = here.iter().find(|a| a.tenant == t.id && a.role == Role::Retraining).map(|a| a.placement);
            // The retraining beside the tenant's inference on one instance (a shared instance).
            let shared = t.shared.as_ref().filter(|_| rt.is_some_and(|r| inf.contains(&r)));
            let mut shared_capacity = 0.0;
            let capacity: f64 = inf
                .iter()
                .map(|pl| {
                    let Some(p) = pb.profile_index(pl.profile) else { return 0.0 };
                    let dead = if prev_inf.contains(pl) {
                        0.0
                    } else if free_in(&prev_layout, *pl) {
                        pb.dead_preinit_s
                    } else {
                        pb.dead_cold_s
                    };
                    let cap = match shared {
                        Some(sh) if rt == Some(*pl) => sh.cap[p],
                        _ => t.cap[p],
                    };
                    let c = cap * (dt - dead.min(dt));
                    if shared.is_some() && rt == Some(*pl) {
                        shared_capacity = c;
                    }
                    c
                })
                .sum();
            // Requests the shared instance serves (its share of the tenant's, by capacity), over the scenarios.
            let mut shared_served = 0.0;
            for s in scenarios(i) {
                let arrivals = s.rate.get(slot).copied().unwrap_or(0.0) * dt;
                let served = arrivals.min(capacity);
                out[i] += t.weight * s.prob * acc * served;
                if capacity > 0.0 {
                    shared_served += s.prob * served * shared_capacity / capacity;
                }
            }
            match rt {
                Some(pl) if !done => {
                    if prev_rt != Some(pl) && slot > 0 {
                        progress = 0.0;
                    }
                    let speed = pb
                        .profile_index(pl.profile)
                        .and_then(|p| {
                            let full = t.retrain.as_ref().map(|r| r.speed[p])?;
                            Some(match shared {
                                Some(sh) => full * sh.train_share(p, shared_served, dt),
                                None => full,
                            })
                        })
                        .unwrap_or(0.0);
                    progress += speed * dt;
                    if progress >= work - 1e-9 {
                        done = true;
                    }
                }
                Some(_) => {}
                None => progress = 0.0,
            }
            prev_inf = inf;
            prev_rt = rt;
            prev_layout = placed.layout(slot);
        }
        completed[i] = done;
        share_done[i] = if done {
            1.0
        } else if work > 0.0 && work.is_finite() {
            (progress / work).min(1.0)
        } else {
            0.0
        };
    }
    (out, completed, share_done)
}

/// Expected goodput of `placed` under the problem's own scenarios.
pub fn goodput(pb: &GpuProblem, placed: &Placed) -> f64 {
    goodput_per_tenant(pb, placed, |i| &pb.tenants[i].scenarios).iter().sum()
}

/// Goodput of `placed` under the true arrivals `input` records for the problem's tenants (their forecast mean
/// where it has none).
pub fn under_truth(input: &PlannerInput, pb: &GpuProblem, placed: &Placed) -> f64 {
    let truth: Vec<Vec<Scenario>> = pb
        .tenants
        .iter()
        .map(|t| {
            let ti = &input.tenants[&t.id];
            let rate = ti.actual.clone().unwrap_or_else(|| ti.forecast.mean.clone());
            let last = rate.last().copied().unwrap_or(0.0);
            let rate = (0..pb.slots).map(|s| rate.get(s).copied().unwrap_or(last)).collect();
            vec![Scenario { prob: 1.0, rate }]
        })
        .collect();
    goodput_per_tenant(pb, placed, |i| &truth[i]).iter().sum()
}
