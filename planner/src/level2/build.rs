//! From a [`PlannerInput`] and a level-1 assignment to the level-2 [`GpuProblem`] of one GPU.

use tessera_core::Profile;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::Role;
use tessera_core::sharing::ShareParams;

use crate::input::{GpuInput, PlannerInput};
use crate::level2::problem::{GpuProblem, RetrainTask, Scenario, SharedTask, TenantTask};

/// Which arrivals level 2 plans against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrivals {
    /// The forecast's mean (a point forecast).
    Point,
    /// Three scenarios from the forecast band: low, mean and high with probabilities 1/6, 2/3, 1/6 (a three-point
    /// approximation of the band's spread).
    Band,
    /// The true future arrivals (clairvoyant); falls back to the mean where the input has none.
    Actual,
}

/// Extends or cuts `rates` to `len` slots (the last value repeats).
fn fit(rates: &[f64], len: usize) -> Vec<f64> {
    let last = rates.last().copied().unwrap_or(0.0);
    (0..len).map(|i| rates.get(i).copied().unwrap_or(last)).collect()
}

/// How tenant `id`'s inference instances would serve with its retraining beside them, where the round allows
/// sharing and the tenant retrains: per profile, the shared SLO capacity (0 where the instance does not hold the
/// inference and the retraining together).
fn shared_task(
    input: &PlannerInput,
    id: &TenantId,
    g: &GpuInput,
    profiles: &[Profile],
    slowdown: f64,
) -> Option<SharedTask> {
    let gpu = g.model;
    let cfg = &input.config;
    let t = &input.tenants[id];
    if cfg.sharing.is_exclusive() || t.spec.retraining.is_none() {
        return None;
    }
    let model = &input.models[&t.spec.model];
    let params = ShareParams::default();
    let (mut cap, mut batch, mut batch_ms, mut batch_train_ms) = (vec![], vec![], vec![], vec![]);
    for p in profiles {
        let spec = g.profile_spec(*p).expect("candidate profiles exist on the model");
        // An operator's pin leaves one profile to its inference, shared or not.
        let both =
            t.spec.pin.allows_profile(*p) && model.inference_memory_gib + model.training_memory_gib <= spec.memory_gib;
        let c = both
            .then(|| {
                model.slo_capacity_served_on(gpu, *p, t.spec.slo_ms, slowdown, |l| {
                    params.batch_latency_ms(cfg.sharing, l)
                })
            })
            .flatten();
        cap.push(c.map_or(0.0, |c| c.rps * cfg.target_utilization));
        batch.push(c.map_or(0.0, |c| f64::from(c.batch)));
        batch_ms.push(c.map_or(0.0, |c| c.latency_ms));
        let alone = c.map_or(0.0, |c| model.latency_on(gpu, *p, c.batch) * slowdown);
        batch_train_ms.push(params.batch_train_ms(cfg.sharing, alone));
    }
    Some(SharedTask { mode: cfg.sharing, cap, batch, batch_ms, batch_train_ms, params })
}

/// The level-2 problem of `gpu` hosting `tenants`.
pub fn gpu_problem(input: &PlannerInput, gpu: &GpuId, tenants: &[TenantId], arrivals: Arrivals) -> GpuProblem {
    let g = &input.gpus[gpu];
    let cfg = &input.config;
    let slots = cfg.horizon_slots;
    let profiles = GpuProblem::candidate_profiles(g.model);
    let mut out = Vec::with_capacity(tenants.len());
    for id in tenants {
        let t = &input.tenants[id];
        let model = &input.models[&t.spec.model];
        let slowdown = tenants
            .iter()
            .filter(|o| *o != id)
            .map(|o| {
                input.interference.as_ref().map_or(1.0, |x| x.slowdown(&t.spec.model, &input.tenants[o].spec.model))
            })
            .fold(1.0, f64::max);
        let cap = profiles
            .iter()
            .map(|p| {
                let spec = g.profile_spec(*p).expect("candidate profiles exist on the model");
                // An operator's pin leaves one profile to its inference.
                if !model.fits_inference(&spec) || !t.spec.pin.allows_profile(*p) {
                    return 0.0;
                }
                model
                    .slo_capacity_on(g.model, *p, t.spec.slo_ms, slowdown)
                    .map_or(0.0, |c| c.rps * cfg.target_utilization)
            })
            .collect();
        let current_inference = g.instance_of(id, Role::Inference).map(|a| a.placement);
        // A retraining beside the tenant's inference (a shared instance) holds no instance of its own: it is
        // decided afresh each round, its progress kept.
        let running =
            g.instance_of(id, Role::Retraining).map(|a| a.placement).filter(|p| Some(*p) != current_inference);
        let retrain = (t.retraining_left_s() > 0.0 || running.is_some()).then(|| RetrainTask {
            work_s: t.retraining_left_s(),
            speed: profiles
                .iter()
                .map(|p| {
                    let spec = g.profile_spec(*p).expect("candidate profiles exist on the model");
                    if model.fits_training(&spec) { model.training_speed_on(g.model, *p) } else { 0.0 }
                })
                .collect(),
            running_on: running,
        });
        let mean = fit(&t.forecast.mean, slots);
        let scenarios = match arrivals {
            Arrivals::Point => vec![Scenario { prob: 1.0, rate: mean }],
            Arrivals::Band => vec![
                Scenario { prob: 1.0 / 6.0, rate: fit(&t.forecast.low, slots) },
                Scenario { prob: 2.0 / 3.0, rate: mean },
                Scenario { prob: 1.0 / 6.0, rate: fit(&t.forecast.high, slots) },
            ],
            Arrivals::Actual => vec![Scenario { prob: 1.0, rate: t.actual.as_deref().map_or(mean, |a| fit(a, slots)) }],
        };
        out.push(TenantTask {
            id: id.clone(),
            weight: t.spec.weight,
            scenarios,
            cap,
            acc_old: t.accuracy,
            acc_new: t.accuracy_after_retraining(),
            retrain,
            tail_value: 0.0,
            current_inference,
            shared: shared_task(input, id, g, &profiles, slowdown),
        });
    }
    let mut pb = GpuProblem {
        gpu: g.model,
        slots,
        slot_s: cfg.slot_s,
        dead_cold_s: cfg.dead_cold_s,
        dead_preinit_s: cfg.dead_preinit_s,
        profiles,
        tenants: out,
        current: g.layout.clone(),
    };
    pb.prune_profiles();
    pb
}
