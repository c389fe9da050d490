//! From trace streams to tenants: which model, SLO, retraining job and mean demand each tenant gets.
//!
//! No public MIG trace exists, so MIG demand always comes from a mapping (reference traces.md). Ours, documented in
//! `replay --help` and the README:
//! - **Derived tenants** (no `--tenants` file): `--tenants-count N` tenants (default: 3 per GPU), each drawn from
//!   `--seed` on a random stream of its own ([`derived_tenant`]):
//!   - its **stream**: the seed shuffles the tenants, and the `j`-th of the shuffle takes stream `j mod S` of the
//!     `S` sampled streams (most popular first), so every stream is used while there are tenants for it, and which
//!     tenant (model, SLO) gets the popular streams changes with the seed;
//!   - its **share** of that stream: tenants sharing a stream split it by weights drawn uniformly from
//!     [[`SHARE_RANGE`]], each drawing its own seeded realisation of the stream's rate curve;
//!   - its **model**: uniformly from the model profiles that serve on a 2g instance or smaller of the fleet's GPU
//!     model;
//!   - its **SLO**: a multiple, uniform in [[`SLO_RANGE`]], of the model's batch-1 latency on a 2g instance;
//!   - its **retraining**: with probability 0.7 it retrains every 200 s: 10-60 GPU-seconds of work at 5 epochs, an
//!     Optimus curve from a stale accuracy of 0.60-0.75 to 5-15 points more (at most 0.91), drifting 3 points per
//!     window without retraining (floor 0.5). These follow the Ekya and MIGRator setups (see
//!     `docs/references.md`).
//!
//!   The arrivals are drawn from the seed too: the scaling of each stream to its tenant's rate
//!   ([`Scaler`](super::arrivals::Scaler)), and in
//!   the fluid executor Poisson noise around each tenant's expected count per second
//!   ([`Noisy`](super::arrivals::Noisy)).
//! - **Demand**: a tenant's mean demand, in compute slices needed to serve it within its SLO at the model's best
//!   rate per slice, is proportional to its stream's mean rate (split among the tenants sharing the stream by their
//!   shares),
//!   capped at [`MAX_TENANT_SLICES`] (the excess is shared among the others), and all demands add up to `--load`
//!   times the fleet's compute slices. Each tenant's arrivals are its stream's, scaled by one factor (thinned or
//!   duplicated, [`Scaler`](super::arrivals::Scaler)), so the trace's rate curve and burstiness are kept.
//! - **Given tenants** (`--tenants FILE`): each tenant's `demand = { trace = "rank:N", scale = k }` takes the N-th
//!   most popular sampled stream times `k`; with `--load`, one further factor for all trace tenants makes their
//!   demand add up to `--load` times the fleet's slices. `poisson_rps` tenants keep their rate.

use std::collections::BTreeMap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_core::accuracy::{Drift, OptimusCurve};
use tessera_core::ids::TenantId;
use tessera_core::model::ModelProfile;
use tessera_core::tenant::{DemandSource, RetrainingSpec, TenantSpec};
use tessera_core::{GpuModel, Profile};

use super::ReplayError;

/// Most compute slices one tenant's mean demand may take (a tenant lives on one GPU; the rest of its GPU is left
/// for retraining and its neighbours).
pub const MAX_TENANT_SLICES: f64 = 4.0;

/// A tenant and where its requests come from.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// The tenant.
    pub spec: TenantSpec,
    /// Its stream and the factor on the stream's requests, or `None` for a Poisson tenant.
    pub stream: Option<(usize, f64)>,
}

/// Models that serve on a 2g instance or smaller of `gpu`, in name order.
pub fn usable_models(models: &BTreeMap<String, ModelProfile>, gpu: GpuModel) -> Vec<&ModelProfile> {
    models.values().filter(|m| m.smallest_inference_profile(gpu).is_some_and(|p| p.compute_slices() <= 2)).collect()
}

/// Compute slices needed per request per second of `spec` on `gpu` at its best slice efficiency.
pub fn slices_per_rps(models: &BTreeMap<String, ModelProfile>, spec: &TenantSpec, gpu: GpuModel) -> f64 {
    let m = &models[&spec.model];
    1.0 / m.best_rps_per_slice_on(gpu, spec.slo_ms).max(1e-9)
}

/// Range of a derived tenant's SLO, in multiples of its model's batch-1 latency on a 2g instance.
pub const SLO_RANGE: std::ops::Range<f64> = 3.0..6.0;

/// Range of the weight by which derived tenants sharing a stream split it.
pub const SHARE_RANGE: std::ops::Range<f64> = 0.5..1.5;

/// A derived tenant (see the module documentation), without its demand.
#[derive(Debug, Clone, PartialEq)]
pub struct Derived {
    /// The tenant.
    pub spec: TenantSpec,
    /// Index of its stream among the sampled streams.
    pub stream: usize,
    /// Its weight among the tenants sharing the stream.
    pub share: f64,
}

/// The `n` derived tenants of a trace with `streams` sampled streams (their keys), serving the `usable` models
/// ([`usable_models`]) on `gpu`, drawn from `seed` (see the module documentation).
pub fn derived_tenants(n: usize, streams: &[&str], usable: &[&ModelProfile], gpu: GpuModel, seed: u64) -> Vec<Derived> {
    assert!(!streams.is_empty() && !usable.is_empty(), "derived tenants need a stream and a model");
    // Which tenant takes which stream: a seeded shuffle, dealt round the streams by popularity.
    let mut order: Vec<usize> = (0..n).collect();
    let mut deal = ChaCha8Rng::seed_from_u64(seed ^ 0x6465_616c);
    for i in (1..n).rev() {
        order.swap(i, deal.random_range(0..=i));
    }
    let mut stream_of = vec![0; n];
    for (j, &i) in order.iter().enumerate() {
        stream_of[i] = j % streams.len();
    }
    (0..n).map(|i| derived_tenant(i, stream_of[i], streams[stream_of[i]], usable, gpu, seed)).collect()
}

/// The derived tenant `i`, on stream `stream` (key `stream_key`): its model, SLO, share and retraining from its own
/// random stream of `seed`.
fn derived_tenant(
    i: usize,
    stream: usize,
    stream_key: &str,
    usable: &[&ModelProfile],
    gpu: GpuModel,
    seed: u64,
) -> Derived {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7465_6e61_6e74);
    rng.set_stream(i as u64);
    let model = usable[rng.random_range(0..usable.len())];
    let slo_factor = rng.random_range(SLO_RANGE);
    let share = rng.random_range(SHARE_RANGE);
    let retrains = rng.random_bool(0.7);
    let initial: f64 = rng.random_range(0.6..0.75);
    let gain: f64 = rng.random_range(0.05..0.15);
    let target = (initial + gain).min(0.91);
    let b2 = 0.08;
    // acc(5) = 1 - (1 / (5 b0 + b1) + b2) = target  =>  b0 = (1 / (1 - b2 - target) - b1) / 5.
    let b1 = 2.0;
    let b0 = ((1.0 / (1.0 - b2 - target)) - b1) / 5.0;
    let retraining = retrains.then(|| RetrainingSpec {
        window_ms: 200_000,
        work_gpu_s: rng.random_range(10.0..60.0),
        epochs: 5.0,
        curve: OptimusCurve { b0: b0.max(0.01), b1, b2 },
        initial_accuracy: initial,
        drift: Drift { per_window: 0.03, floor: 0.5 },
    });
    let spec = TenantSpec {
        jobs: Default::default(),
        pin: Default::default(),
        id: TenantId::new(format!("t{i:04}")).expect("valid tenant id"),
        name: format!("{} on stream {stream_key}", model.name),
        model: model.name.clone(),
        slo_ms: slo_factor * model.latency_on(gpu, Profile::G2, 1),
        slo_percentile: 99.0,
        weight: 1.0,
        demand: DemandSource::Trace { selector: format!("rank:{}", 1 + stream), scale: 1.0 },
        retraining,
    };
    Derived { spec, stream, share }
}

/// Shares of `total` proportional to `weights`, none above `cap` (water-filling: capped shares are fixed and the
/// rest is divided again).
pub fn capped_shares(weights: &[f64], total: f64, cap: f64) -> Vec<f64> {
    let mut out = vec![0.0; weights.len()];
    let mut open: Vec<usize> = (0..weights.len()).filter(|&i| weights[i] > 0.0).collect();
    let mut left = total;
    while !open.is_empty() && left > 1e-12 {
        let sum: f64 = open.iter().map(|&i| weights[i]).sum();
        let over: Vec<usize> = open.iter().copied().filter(|&i| left * weights[i] / sum > cap).collect();
        if over.is_empty() {
            for &i in &open {
                out[i] = left * weights[i] / sum;
            }
            break;
        }
        for &i in &over {
            out[i] = cap;
            left -= cap;
        }
        open.retain(|i| !over.contains(i));
    }
    out
}

/// Parses a `rank:N` selector (1-based) into a stream index, naming the tenant on error.
pub fn rank_of(tenant: &TenantId, selector: &str, streams: usize) -> Result<usize, ReplayError> {
    let n: usize = selector
        .strip_prefix("rank:")
        .and_then(|n| n.trim().parse().ok())
        .filter(|&n| n >= 1)
        .ok_or_else(|| {
            ReplayError::Usage(format!(
                "tenant {tenant}: demand.trace = {selector:?}: expected \"rank:N\" with N >= 1 (the N-th most popular stream)"
            ))
        })?;
    if n > streams {
        return Err(ReplayError::Usage(format!(
            "tenant {tenant}: demand.trace = {selector:?}, but the trace's sample has {streams} stream(s)"
        )));
    }
    Ok(n - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capped_shares_add_up_and_respect_the_cap() {
        let s = capped_shares(&[100.0, 10.0, 1.0, 1.0], 10.0, 4.0);
        assert!((s.iter().sum::<f64>() - 10.0).abs() < 1e-9, "{s:?}");
        assert_eq!(s[0], 4.0);
        assert!(s[1] <= 4.0 + 1e-12 && s[1] > s[2]);
        assert!((s[2] - s[3]).abs() < 1e-12);
        // Not enough room: everyone at the cap.
        let full = capped_shares(&[1.0, 2.0], 100.0, 4.0);
        assert_eq!(full, vec![4.0, 4.0]);
        assert_eq!(capped_shares(&[0.0, 1.0], 2.0, 4.0), vec![0.0, 2.0]);
    }

    #[test]
    fn a_seed_draws_models_slos_shares_and_streams() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
        let models = tessera_core::config::load_model_dir(&dir).unwrap();
        let gpu = GpuModel::A100_40GB;
        let usable = usable_models(&models, gpu);
        assert!(usable.len() >= 2);
        let streams = ["a", "b", "c"];
        let draw = |seed| derived_tenants(12, &streams, &usable, gpu, seed);
        assert_eq!(draw(1), draw(1));
        let (a, b) = (draw(1), draw(2));
        for d in a.iter().chain(&b) {
            let m = &models[&d.spec.model];
            let factor = d.spec.slo_ms / m.latency_on(gpu, Profile::G2, 1);
            assert!(SLO_RANGE.contains(&factor) && SHARE_RANGE.contains(&d.share), "{d:?}");
            assert_eq!(d.spec.demand, DemandSource::Trace { selector: format!("rank:{}", 1 + d.stream), scale: 1.0 });
        }
        // Every stream is dealt the same number of tenants, whichever tenants they are.
        for s in 0..3 {
            assert_eq!(a.iter().filter(|d| d.stream == s).count(), 4);
        }
        let models_of = |v: &[Derived]| v.iter().map(|d| d.spec.model.clone()).collect::<Vec<_>>();
        let streams_of = |v: &[Derived]| v.iter().map(|d| d.stream).collect::<Vec<_>>();
        assert_ne!(models_of(&a), models_of(&b));
        assert_ne!(streams_of(&a), streams_of(&b));
        assert_ne!(a[0].spec.slo_ms, b[0].spec.slo_ms);
    }

    #[test]
    fn rank_selectors_name_the_tenant_and_the_problem() {
        let t = TenantId::new("cam").unwrap();
        assert_eq!(rank_of(&t, "rank:2", 3).unwrap(), 1);
        let e = rank_of(&t, "rank:4", 3).unwrap_err().to_string();
        assert!(e.contains("cam") && e.contains("3 stream"), "{e}");
        let e = rank_of(&t, "top", 3).unwrap_err().to_string();
        assert!(e.contains("rank:N"), "{e}");
    }
}
