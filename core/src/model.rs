//! Model performance profiles: memory, inference latency as a function of instance size and batch, and retraining
//! speed. Profiles ship as TOML under `configs/models/` (parsed by [`crate::config`]).
//!
//! ## Latency
//! Either a table of measured points `(g, batch, ms)` (linear interpolation in batch; linear extrapolation past the
//! last two points) or the parametric form `lat(g, b) = base_ms * (7/g)^alpha * (1 + beta (b - 1))`, where `g` is
//! the instance's compute slices, `alpha` near 1 means compute-bound and near 0.3 light.
//!
//! ## SLO capacity
//! [`ModelProfile::slo_capacity`] is the throughput an instance sustains while every request meets a latency
//! target: with dynamic batching at full load a request may wait for the batch in service and then be served in the
//! next one, so a batch size `b` is admissible when `2 * lat(g, b) * slowdown <= slo`; capacity is the best
//! `b / (lat(g, b) * slowdown)` over admissible batches. The planner's estimates and the simulator's measurement of
//! the same instance agree on this definition.
//!
//! ## Other GPU models
//! Profiles are measured on [`REFERENCE_GPU`] (A100-40GB, whose slices have 14 SMs). On another model an instance
//! of the same profile has another SM count (H100 1g: 16, H100 1g.20gb: 26, B200 1g: 20), so
//! [`ModelProfile::latency_on`] divides the reference latency by `(sms / reference_sms)^alpha`, with `alpha` the
//! model's size sensitivity (the parametric `alpha`, or for a table the batch-1 slope between 1g and 7g). Memory
//! bandwidth differences between generations are not modelled [I]: a profile measured on the GPU model itself is
//! the better input where one exists.
//!
//! ## Retraining speed
//! Work is counted in GPU-seconds on a full 7g instance; a `g`-slice instance does `speed(g)` of it per second,
//! `speed(g) = (g/7)^speed_exponent` (or a table), so `speed(7) = 1`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::{GpuModel, Profile, ProfileSpec};

/// The GPU model profiles' latency and training numbers refer to.
pub const REFERENCE_GPU: GpuModel = GpuModel::A100_40GB;

/// Compute-slice sizes of GPU instances, the points a latency table must cover.
pub const INSTANCE_SIZES: [u8; 5] = [1, 2, 3, 4, 7];

/// Inference latency model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatencyModel {
    /// `lat(g, b) = base_ms * (7/g)^alpha * (1 + beta (b - 1))`.
    Parametric {
        /// Latency on a 7g instance at batch 1, ms.
        base_ms: f64,
        /// Sensitivity to instance size.
        alpha: f64,
        /// Extra latency per additional request in a batch, relative to batch 1.
        beta: f64,
    },
    /// Measured points: per compute-slice size, `(batch, ms)` sorted by batch.
    Table {
        /// Points per instance size.
        #[serde(with = "slice_keys")]
        points: BTreeMap<u8, Vec<(u32, f64)>>,
    },
}

impl LatencyModel {
    /// [`LatencyModel::latency_ms`] of a `g`-slice instance as a function of the batch, with what does not depend
    /// on the batch worked out once (the same values to the last bit): capacity searches call it per batch size.
    pub fn curve(&self, g: u8) -> impl Fn(u32) -> f64 + '_ {
        let (scale, beta, points): (f64, f64, &[(u32, f64)]) = match self {
            LatencyModel::Parametric { base_ms, alpha, beta } => {
                (base_ms * (7.0 / f64::from(g.max(1))).powf(*alpha), *beta, &[])
            }
            // Validated tables cover every instance size; fall back to the nearest larger size otherwise.
            LatencyModel::Table { points } => (
                0.0,
                0.0,
                points.range(g..).next().or_else(|| points.iter().next_back()).map_or(&[], |(_, v)| v.as_slice()),
            ),
        };
        let parametric = matches!(self, LatencyModel::Parametric { .. });
        move |batch: u32| {
            let batch = batch.max(1);
            if parametric { scale * (1.0 + beta * f64::from(batch - 1)) } else { interpolate(points, batch) }
        }
    }

    /// Latency of a batch of `batch` requests on a `g`-slice instance, ms.
    pub fn latency_ms(&self, g: u8, batch: u32) -> f64 {
        self.curve(g)(batch)
    }
}

fn interpolate(points: &[(u32, f64)], batch: u32) -> f64 {
    match points {
        [] => f64::INFINITY,
        [(_, ms)] => *ms,
        _ => {
            let i = points.partition_point(|(b, _)| *b < batch).clamp(1, points.len() - 1);
            let ((b0, y0), (b1, y1)) = (points[i - 1], points[i]);
            let t = (f64::from(batch) - f64::from(b0)) / (f64::from(b1) - f64::from(b0));
            (y0 + t * (y1 - y0)).max(f64::MIN_POSITIVE)
        }
    }
}

/// Retraining speed of an instance relative to a full 7g instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TrainingSpeed {
    /// `speed(g) = (g/7)^exponent`.
    Exponent(f64),
    /// Measured relative speeds per compute-slice size.
    Table(#[serde(with = "slice_keys")] BTreeMap<u8, f64>),
}

impl TrainingSpeed {
    /// Work (7g GPU-seconds) a `g`-slice instance does per second.
    pub fn speed(&self, g: u8) -> f64 {
        match self {
            TrainingSpeed::Exponent(e) => (f64::from(g) / 7.0).powf(*e),
            TrainingSpeed::Table(t) => t.range(..=g).next_back().map_or(0.0, |(_, s)| *s),
        }
    }
}

/// The best SLO-meeting operating point of an instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SloCapacity {
    /// Requests per second served within the SLO at full load.
    pub rps: f64,
    /// The batch size that achieves it.
    pub batch: u32,
    /// The batch latency there, ms (slowdown included).
    pub latency_ms: f64,
}

/// Performance profile of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelProfile {
    /// The id tenants refer to.
    pub name: String,
    /// What the model is.
    pub description: String,
    /// Memory an inference instance needs (weights, activations at max batch, context), GiB.
    pub inference_memory_gib: f64,
    /// Memory a retraining job needs, GiB.
    pub training_memory_gib: f64,
    /// Largest batch served.
    pub max_batch: u32,
    /// Inference latency.
    pub latency: LatencyModel,
    /// Retraining speed.
    pub training: TrainingSpeed,
}

impl ModelProfile {
    /// Batch latency on a `g`-slice instance, ms.
    pub fn latency_ms(&self, g: u8, batch: u32) -> f64 {
        self.latency.latency_ms(g, batch)
    }

    /// Whether an inference instance of this model fits `profile`'s memory.
    pub fn fits_inference(&self, profile: &ProfileSpec) -> bool {
        self.inference_memory_gib <= profile.memory_gib
    }

    /// Whether a retraining job of this model fits `profile`'s memory.
    pub fn fits_training(&self, profile: &ProfileSpec) -> bool {
        self.training_memory_gib <= profile.memory_gib
    }

    /// The smallest profile of `model` (by compute, then memory slices) an inference instance fits, if any.
    pub fn smallest_inference_profile(&self, model: GpuModel) -> Option<Profile> {
        let mut fitting: Vec<&ProfileSpec> =
            model.spec().profiles.iter().filter(|p| p.profile != Profile::G1Me && self.fits_inference(p)).collect();
        fitting.sort_by_key(|p| (p.profile.compute_slices(), p.profile.memory_slices()));
        fitting.first().map(|p| p.profile)
    }

    /// How strongly latency depends on instance size: the parametric `alpha`, or for a table the batch-1 slope
    /// `ln(lat(1,1) / lat(7,1)) / ln 7`.
    pub fn size_sensitivity(&self) -> f64 {
        match &self.latency {
            LatencyModel::Parametric { alpha, .. } => *alpha,
            LatencyModel::Table { .. } => (self.latency_ms(1, 1) / self.latency_ms(7, 1)).ln() / 7f64.ln(),
        }
    }

    /// `(sms on gpu / sms on the reference)` for `profile`, the compute ratio of the same profile across models.
    fn sm_ratio(gpu: GpuModel, profile: Profile) -> f64 {
        match (gpu.profile(profile), REFERENCE_GPU.profile(profile)) {
            (Some(p), Some(r)) => f64::from(p.sms) / f64::from(r.sms),
            _ => 1.0,
        }
    }

    /// Batch latency on a `profile` instance of a `gpu`, ms (see "Other GPU models" in the module doc).
    pub fn latency_on(&self, gpu: GpuModel, profile: Profile, batch: u32) -> f64 {
        self.latency_ms(profile.compute_slices(), batch) / Self::sm_ratio(gpu, profile).powf(self.size_sensitivity())
    }

    /// Retraining work (7g GPU-seconds of the reference GPU) a `profile` instance of a `gpu` does per second.
    pub fn training_speed_on(&self, gpu: GpuModel, profile: Profile) -> f64 {
        let g = profile.compute_slices();
        let exponent = match &self.training {
            TrainingSpeed::Exponent(e) => *e,
            TrainingSpeed::Table(_) => 1.0,
        };
        self.training_speed(g) * Self::sm_ratio(gpu, profile).powf(exponent)
    }

    /// Throughput within `slo_ms` on a `profile` instance of a `gpu` whose latency is multiplied by `slowdown`
    /// (>= 1 under interference); `None` when even a batch of one misses the SLO. See the module doc for the rule.
    pub fn slo_capacity_on(&self, gpu: GpuModel, profile: Profile, slo_ms: f64, slowdown: f64) -> Option<SloCapacity> {
        // `latency_on` per batch, with its batch-independent factors computed once.
        let curve = self.latency.curve(profile.compute_slices());
        let divisor = Self::sm_ratio(gpu, profile).powf(self.size_sensitivity());
        self.best_batch(slo_ms, |b| curve(b) / divisor * slowdown)
    }

    /// [`ModelProfile::slo_capacity_on`] for an instance whose batches take `served(latency alone)` ms, such as
    /// one shared with a retraining ([`crate::sharing::ShareParams::batch_latency_ms`]).
    pub fn slo_capacity_served_on(
        &self,
        gpu: GpuModel,
        profile: Profile,
        slo_ms: f64,
        slowdown: f64,
        served: impl Fn(f64) -> f64,
    ) -> Option<SloCapacity> {
        let curve = self.latency.curve(profile.compute_slices());
        let divisor = Self::sm_ratio(gpu, profile).powf(self.size_sensitivity());
        self.best_batch(slo_ms, |b| served(curve(b) / divisor * slowdown))
    }

    /// The most requests per second one compute slice of a `gpu` serves within `slo_ms`, over the profiles an
    /// inference instance fits (`1g+me` aside); 0 when none meets the SLO.
    pub fn best_rps_per_slice_on(&self, gpu: GpuModel, slo_ms: f64) -> f64 {
        gpu.spec()
            .profiles
            .iter()
            .filter(|p| p.profile != Profile::G1Me && self.fits_inference(p))
            .filter_map(|p| {
                self.slo_capacity_on(gpu, p.profile, slo_ms, 1.0).map(|c| c.rps / f64::from(p.profile.compute_slices()))
            })
            .fold(0.0, f64::max)
    }

    /// [`ModelProfile::slo_capacity_on`] for a `g`-slice instance of the reference GPU.
    pub fn slo_capacity(&self, g: u8, slo_ms: f64, slowdown: f64) -> Option<SloCapacity> {
        let curve = self.latency.curve(g);
        self.best_batch(slo_ms, |b| curve(b) * slowdown)
    }

    fn best_batch(&self, slo_ms: f64, latency: impl Fn(u32) -> f64) -> Option<SloCapacity> {
        let mut best: Option<SloCapacity> = None;
        for batch in 1..=self.max_batch.max(1) {
            let latency_ms = latency(batch);
            if 2.0 * latency_ms > slo_ms {
                break; // latency grows with batch in every shipped profile
            }
            let rps = f64::from(batch) * 1000.0 / latency_ms;
            if best.is_none_or(|b| rps > b.rps) {
                best = Some(SloCapacity { rps, batch, latency_ms });
            }
        }
        best
    }

    /// Retraining work (7g GPU-seconds) a `g`-slice instance does per second.
    pub fn training_speed(&self, g: u8) -> f64 {
        self.training.speed(g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resnet() -> ModelProfile {
        ModelProfile {
            name: "resnet50".into(),
            description: String::new(),
            inference_memory_gib: 2.0,
            training_memory_gib: 12.0,
            max_batch: 32,
            latency: LatencyModel::Parametric { base_ms: 2.0, alpha: 1.0, beta: 0.1 },
            training: TrainingSpeed::Exponent(1.0),
        }
    }

    #[test]
    fn parametric_latency_follows_the_formula() {
        let m = resnet();
        assert!((m.latency_ms(7, 1) - 2.0).abs() < 1e-12);
        assert!((m.latency_ms(1, 1) - 14.0).abs() < 1e-12);
        assert!((m.latency_ms(7, 11) - 4.0).abs() < 1e-12);
        assert!((m.training_speed(7) - 1.0).abs() < 1e-12);
        assert!((m.training_speed(1) - 1.0 / 7.0).abs() < 1e-12);
    }

    #[test]
    fn table_latency_interpolates_in_batch() {
        let points =
            INSTANCE_SIZES.iter().map(|&g| (g, vec![(1, 10.0 / f64::from(g)), (9, 50.0 / f64::from(g))])).collect();
        let lat = LatencyModel::Table { points };
        assert!((lat.latency_ms(1, 5) - 30.0).abs() < 1e-9);
        assert!((lat.latency_ms(2, 1) - 5.0).abs() < 1e-9);
        // Past the last point: linear extrapolation.
        assert!((lat.latency_ms(1, 17) - 90.0).abs() < 1e-9);
    }

    #[test]
    fn slo_capacity_picks_the_largest_admissible_batch() {
        let m = resnet();
        // 7g: lat(b) = 2 (1 + 0.1 (b-1)); 2 lat <= 10 -> lat <= 5 -> b <= 16; rps = 16 / 5 ms = 3200/s.
        let c = m.slo_capacity(7, 10.0, 1.0).unwrap();
        assert_eq!(c.batch, 16);
        assert!((c.rps - 3200.0).abs() < 1e-6);
        // A 1g instance misses a 10 ms SLO even at batch 1 (14 ms).
        assert_eq!(m.slo_capacity(1, 10.0, 1.0), None);
        // Interference lowers capacity.
        assert!(m.slo_capacity(7, 10.0, 1.3).unwrap().rps < c.rps);
    }

    #[test]
    fn other_gpu_models_scale_by_their_sm_counts() {
        let m = resnet(); // alpha = 1
        assert_eq!(m.latency_on(GpuModel::A100_40GB, Profile::G1, 1), m.latency_ms(1, 1));
        // H100 1g has 16 SMs against A100's 14; its 1g.20gb has 26.
        assert!((m.latency_on(GpuModel::H100_80GB, Profile::G1, 1) - 14.0 * 14.0 / 16.0).abs() < 1e-9);
        assert!((m.latency_on(GpuModel::H100_80GB, Profile::G1Double, 1) - 14.0 * 14.0 / 26.0).abs() < 1e-9);
        let a100 = m.slo_capacity_on(GpuModel::A100_40GB, Profile::G3, 20.0, 1.0).unwrap();
        let h100 = m.slo_capacity_on(GpuModel::H100_80GB, Profile::G3, 20.0, 1.0).unwrap();
        assert!(h100.rps > a100.rps);
        assert_eq!(Some(a100), m.slo_capacity(3, 20.0, 1.0));
        assert!(m.training_speed_on(GpuModel::B200_180GB, Profile::G7) > 1.0);
        // A table's sensitivity is its batch-1 slope: 10 ms at 1g, 10/7 ms at 7g gives 1.
        let points = INSTANCE_SIZES.iter().map(|&g| (g, vec![(1, 10.0 / f64::from(g))])).collect();
        let t = ModelProfile { latency: LatencyModel::Table { points }, ..resnet() };
        assert!((t.size_sensitivity() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn capacity_searches_see_the_latencies_batch_by_batch() {
        // The searches work out a curve's batch-independent factors once; the values must be the rule's own.
        let points =
            INSTANCE_SIZES.iter().map(|&g| (g, vec![(1, 12.0 / f64::from(g)), (8, 40.0 / f64::from(g))])).collect();
        let table = ModelProfile { latency: LatencyModel::Table { points }, ..resnet() };
        let (base_ms, alpha, beta) = (2.0f64, 1.0f64, 0.1f64);
        for g in 1..=7u8 {
            for b in 1..=40 {
                let formula = base_ms * (7.0 / f64::from(g)).powf(alpha) * (1.0 + beta * f64::from(b - 1));
                assert_eq!(resnet().latency_ms(g, b), formula);
            }
        }
        for m in [resnet(), table] {
            for gpu in GpuModel::ALL {
                for p in gpu.spec().profiles {
                    for (slo, slowdown) in [(10.0, 1.0), (30.0, 1.0), (30.0, 1.3), (200.0, 1.0)] {
                        let by_batch = m.best_batch(slo, |b| m.latency_on(gpu, p.profile, b) * slowdown);
                        assert_eq!(
                            m.slo_capacity_on(gpu, p.profile, slo, slowdown),
                            by_batch,
                            "{gpu:?} {:?}",
                            p.profile
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn best_rps_per_slice_is_the_best_profile_per_compute_slice() {
        let m = resnet();
        let best = m.best_rps_per_slice_on(GpuModel::A100_40GB, 30.0);
        for g in [1u8, 2, 3, 4, 7] {
            let per = m.slo_capacity(g, 30.0, 1.0).map_or(0.0, |c| c.rps / f64::from(g));
            assert!(per <= best + 1e-9);
        }
        assert!(best > 0.0);
        // No instance meets a 1 ms SLO.
        assert_eq!(m.best_rps_per_slice_on(GpuModel::A100_40GB, 1.0), 0.0);
    }

    #[test]
    fn memory_fit_picks_the_smallest_instance() {
        let mut m = resnet();
        assert_eq!(m.smallest_inference_profile(GpuModel::A100_40GB), Some(Profile::G1));
        m.inference_memory_gib = 8.0;
        assert_eq!(m.smallest_inference_profile(GpuModel::A100_40GB), Some(Profile::G1Double));
        m.inference_memory_gib = 60.0;
        assert_eq!(m.smallest_inference_profile(GpuModel::A100_40GB), None);
        assert_eq!(m.smallest_inference_profile(GpuModel::H100_80GB), Some(Profile::G7));
    }
}

/// Maps keyed by compute-slice size (`1`, `2`, ...) written with string keys, as TOML and JSON keys are strings,
/// and parsed back here. Serde's derived impls cannot read integer keys from JSON strings once a value has been
/// buffered (inside an internally tagged enum such as the coordinator's replicated `fleet::Command`).
mod slice_keys {
    use std::collections::BTreeMap;

    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<V: Serialize, S: Serializer>(map: &BTreeMap<u8, V>, s: S) -> Result<S::Ok, S::Error> {
        // In numeric order (the map's), which a map keyed by text would not keep ("10" before "2").
        s.collect_map(map.iter().map(|(k, v)| (k.to_string(), v)))
    }

    pub fn deserialize<'de, V: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<u8, V>, D::Error> {
        BTreeMap::<String, V>::deserialize(d)?
            .into_iter()
            .map(|(k, v)| {
                let n = k.trim().parse::<u8>().map_err(|_| D::Error::custom(format!("`{k}` is not a slice size")))?;
                Ok((n, v))
            })
            .collect()
    }
}
