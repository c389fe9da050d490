//! Seeded synthetic planner inputs, for sizing the planner (`replay plan --synthetic`), benchmarks and tests.
//!
//! Each tenant draws a model from the given profiles (among those that fit the GPU), an SLO of four times its
//! batch-1 latency on a 2g instance, a mean load of 0.3 to 1.2 times what its fair share of compute slices
//! (`7 x gpus / tenants`, at most 7) serves at the model's best requests per slice, a weight that makes each
//! tenant's whole demand worth the same (1000 / mean load: otherwise the cheapest model's requests dominate
//! goodput and the planner starves everything else), a
//! diurnal-looking rate curve over the horizon with noise, a forecast band of +-25 %, and (for 70 % of tenants) a
//! retraining due now of 10 to 60 7g-seconds with an Optimus curve whose new accuracy is 5 to 15 points above the
//! drifted one. The true arrivals deviate from the forecast mean by a seeded factor inside the band most of the
//! time. GPUs start empty unless `warm` asks for a previous plan, which the caller applies.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_core::accuracy::{Drift, OptimusCurve};
use tessera_core::fleet::GpuHealth;
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::model::ModelProfile;
use tessera_core::tenant::{DemandSource, RetrainingSpec, TenantSpec};
use tessera_core::time::SimTime;
use tessera_core::{GpuModel, Layout, Profile};

use crate::forecast::Forecast;
use crate::input::{GpuInput, PlannerConfig, PlannerInput, TenantInput};

/// What to generate.
#[derive(Debug, Clone)]
pub struct SyntheticSpec {
    /// GPUs (8 per node).
    pub gpus: usize,
    /// Tenants.
    pub tenants: usize,
    /// Slots in the horizon.
    pub slots: usize,
    /// GPU model of every GPU.
    pub gpu_model: GpuModel,
    /// Seed.
    pub seed: u64,
}

/// A synthetic input over `models` (at least one must fit a 1g or 2g instance of the GPU).
pub fn input(spec: &SyntheticSpec, models: &BTreeMap<String, ModelProfile>, config: PlannerConfig) -> PlannerInput {
    input_with_archetypes(spec, 0, models, config)
}

/// [`input`], with tenants of `archetypes` kinds (0: every tenant its own): tenant `i` draws everything from the seed
/// and `i % archetypes`, so the tenants of a kind have the same model, SLO, demand, forecast and retraining, as
/// replicas of one service added together do before each has a history of its own.
pub fn input_with_archetypes(
    spec: &SyntheticSpec,
    archetypes: usize,
    models: &BTreeMap<String, ModelProfile>,
    config: PlannerConfig,
) -> PlannerInput {
    let mut fleet_rng = ChaCha8Rng::seed_from_u64(spec.seed);
    let usable: Vec<&ModelProfile> = models
        .values()
        .filter(|m| m.smallest_inference_profile(spec.gpu_model).is_some_and(|p| p.compute_slices() <= 2))
        .collect();
    assert!(!usable.is_empty(), "no model fits a small instance of {}", spec.gpu_model);
    let mut gpus = BTreeMap::new();
    for g in 0..spec.gpus {
        let node = NodeId::new(format!("node-{:04}", g / 8)).expect("valid node id");
        gpus.insert(
            GpuId::new(node, (g % 8) as u32),
            GpuInput {
                model: spec.gpu_model,
                health: GpuHealth::Healthy,
                layout: Layout::empty(),
                assignments: vec![],
                warm: None,
                memory_gib: Default::default(),
            },
        );
    }
    let slots = spec.slots.max(1);
    let mut tenants = BTreeMap::new();
    for i in 0..spec.tenants {
        let mut kind_rng;
        let rng = if archetypes > 0 {
            let kind = (i % archetypes) as u64 + 1;
            kind_rng = ChaCha8Rng::seed_from_u64(spec.seed ^ kind.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            &mut kind_rng
        } else {
            &mut fleet_rng
        };
        let model = usable[rng.random_range(0..usable.len())];
        let id = TenantId::new(format!("t{i:05}")).expect("valid tenant id");
        let slo_ms = 4.0 * model.latency_on(spec.gpu_model, Profile::G2, 1);
        // Requests per second one compute slice serves at best, over the profiles the model fits.
        let unit = model.best_rps_per_slice_on(spec.gpu_model, slo_ms).max(1e-3);
        let share = 7.0 * spec.gpus as f64 / spec.tenants.max(1) as f64;
        let load = rng.random_range(0.3..1.2) * share.min(7.0) * unit;
        let phase = rng.random_range(0.0..std::f64::consts::TAU);
        let period = rng.random_range(0.5..2.0) * slots as f64;
        let mean: Vec<f64> = (0..slots)
            .map(|s| load * (1.0 + 0.4 * (phase + std::f64::consts::TAU * s as f64 / period).sin()))
            .collect();
        let actual: Vec<f64> = mean.iter().map(|m| m * rng.random_range(0.75..1.3)).collect();
        let forecast = Forecast {
            low: mean.iter().map(|m| m * 0.75).collect(),
            high: mean.iter().map(|m| m * 1.25).collect(),
            mean,
        };
        let retrains = rng.random_bool(0.7);
        let initial: f64 = rng.random_range(0.6..0.75);
        let gain: f64 = rng.random_range(0.05..0.15);
        // acc(5) = 1 - (1/(5 b0 + b1) + b2) = initial + gain with b1 = 2, b2 = 0.08.
        let target = (initial + gain).min(0.91);
        let b0 = ((1.0 / (1.0 - 0.08 - target)) - 2.0) / 5.0;
        let retraining = RetrainingSpec {
            window_ms: 200_000,
            work_gpu_s: rng.random_range(10.0..60.0),
            epochs: 5.0,
            curve: OptimusCurve { b0: b0.max(0.01), b1: 2.0, b2: 0.08 },
            initial_accuracy: initial,
            drift: Drift { per_window: 0.03, floor: 0.5 },
        };
        let spec_t = TenantSpec {
            jobs: Default::default(),
            pin: Default::default(),
            id: id.clone(),
            name: format!("synthetic {i}"),
            model: model.name.clone(),
            slo_ms,
            slo_percentile: 99.0,
            weight: 1000.0 / load,
            demand: DemandSource::Poisson { rate_rps: load },
            retraining: Some(retraining),
        };
        tenants.insert(
            id,
            TenantInput {
                spec: spec_t,
                forecast,
                actual: Some(actual),
                accuracy: initial,
                retraining_due: retrains,
                retraining_done_gpu_s: 0.0,
                retraining_epochs: None,
            },
        );
    }
    let config = PlannerConfig { horizon_slots: slots, seed: spec.seed, ..config };
    PlannerInput { epoch: 1, now: SimTime::ZERO, config, models: models.clone(), gpus, tenants, interference: None }
}

/// The round `advance` slots after `input`, whose GPUs were planned as `outcomes` ([`crate::PlanReport::outcomes`]),
/// for timing warm-started rounds (`replay plan --warm` and the benchmark): each GPU runs what the plan put on it at
/// that time and carries the plan's warm start; retraining progresses by the slots the plan gave it (a finished one
/// raises the tenant's accuracy); forecasts (and the true arrivals) move on by `advance` slots, the last slot
/// repeating, and each tenant's is revised by a seeded factor in 0.9-1.1, as a forecaster revises its estimate
/// between rounds.
pub fn next_round(
    input: &PlannerInput,
    outcomes: &BTreeMap<GpuId, crate::policy::GpuOutcome>,
    advance: usize,
    seed: u64,
) -> PlannerInput {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ input.epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut next = input.clone();
    next.epoch += 1;
    next.now = SimTime::from_ms(input.now.as_ms() + (advance as f64 * input.config.slot_s * 1000.0).round() as u64);
    let mut trained: BTreeMap<TenantId, f64> = BTreeMap::new();
    for (id, g) in &mut next.gpus {
        let Some(o) = outcomes.get(id) else { continue };
        let at = advance.min(o.placed.slots.len().saturating_sub(1));
        for slot in &o.placed.slots[..at] {
            for a in slot.iter().filter(|a| a.role == tessera_core::plan::Role::Retraining) {
                let model = &input.models[&input.tenants[&a.tenant].spec.model];
                let speed = model.training_speed_on(g.model, a.placement.profile);
                *trained.entry(a.tenant.clone()).or_default() += speed * input.config.slot_s;
            }
        }
        g.layout = o.layout(at);
        g.assignments = o.placed.slots[at].clone();
        g.warm = o.warm.clone();
    }
    let shift = |v: &[f64], factor: f64| -> Vec<f64> {
        (0..v.len()).map(|t| v[(t + advance).min(v.len().saturating_sub(1))] * factor).collect()
    };
    for (id, t) in &mut next.tenants {
        let factor = rng.random_range(0.9..1.1);
        t.forecast = Forecast {
            mean: shift(&t.forecast.mean, factor),
            low: shift(&t.forecast.low, factor),
            high: shift(&t.forecast.high, factor),
        };
        t.actual = t.actual.as_deref().map(|a| shift(a, 1.0));
        if let Some(done) = trained.get(id) {
            t.retraining_done_gpu_s += done;
            if t.retraining_due && t.retraining_left_s() <= 0.0 {
                t.accuracy = t.accuracy_after_retraining();
                t.retraining_due = false;
                t.retraining_done_gpu_s = 0.0;
            }
        }
    }
    next
}
