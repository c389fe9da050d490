//! Tenants: a continuous-learning workload with an inference service under a latency SLO and, optionally, a
//! retraining job that refreshes the model every window.

use serde::{Deserialize, Serialize};

use crate::accuracy::{Drift, OptimusCurve};
use crate::catalog::Profile;
use crate::ids::{GpuId, TenantId};
use crate::jobs::TenantJobs;

/// Where a tenant's inference demand comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DemandSource {
    /// A stream selected from a replayed trace; the selector's meaning is the trace adapter's (for example
    /// `rank:1` for the most popular function, or an application hash).
    Trace {
        /// Which part of the trace.
        selector: String,
        /// Multiplier on the selected rate.
        scale: f64,
    },
    /// Poisson arrivals at a constant rate.
    Poisson {
        /// Mean arrival rate, requests per second.
        rate_rps: f64,
    },
}

/// A tenant's retraining job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrainingSpec {
    /// Retraining window: fresh data arrives and accuracy drifts once per window, ms.
    pub window_ms: u64,
    /// Work of one retraining at the default `epochs`, in GPU-seconds on a full 7g instance.
    pub work_gpu_s: f64,
    /// Epochs of one retraining by default (policies such as Ekya may choose others).
    pub epochs: f64,
    /// Accuracy after `x` epochs.
    pub curve: OptimusCurve,
    /// Accuracy of the model deployed at the start.
    pub initial_accuracy: f64,
    /// Accuracy decay without retraining.
    pub drift: Drift,
}

impl RetrainingSpec {
    /// Work of one retraining of `epochs` epochs, 7g GPU-seconds.
    pub fn work_for_epochs(&self, epochs: f64) -> f64 {
        self.work_gpu_s / self.epochs * epochs
    }

    /// Accuracy of the model a retraining of `epochs` epochs produces.
    pub fn accuracy_after(&self, epochs: f64) -> f64 {
        self.curve.accuracy(epochs)
    }
}

/// A tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantSpec {
    /// Id.
    pub id: TenantId,
    /// Human-readable name.
    pub name: String,
    /// The model profile's name (`configs/models/<name>.toml`).
    pub model: String,
    /// Latency target, ms.
    pub slo_ms: f64,
    /// Percentile the target applies to (e.g. 99).
    pub slo_percentile: f64,
    /// Relative importance in the planner's objective.
    pub weight: f64,
    /// Inference demand.
    pub demand: DemandSource,
    /// Retraining job, if the tenant retrains.
    pub retraining: Option<RetrainingSpec>,
    /// How its work runs on a real node (`serve` and `retrain` jobs); empty: bookkeeping only.
    #[serde(default, skip_serializing_if = "TenantJobs::is_empty")]
    pub jobs: TenantJobs,
    /// An operator's placement constraint (the GPUs it may run on, its inference profile); empty: the planner
    /// decides.
    #[serde(default, skip_serializing_if = "TenantPin::is_empty")]
    pub pin: TenantPin,
}

/// An operator's constraint on where a tenant runs, honoured by every planning round: a customer contracted for one
/// instance size, a tenant kept on (or moved to) given GPUs for maintenance, a model that must stay near its data.
/// The planner still decides everything the pin leaves open, and moves a tenant whose pin changes the way it moves
/// any tenant (make-before-break where the target has room).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantPin {
    /// The GPUs it may be placed on; empty: any. A GPU that is not (yet) in the fleet is allowed and takes the
    /// tenant once it joins; a tenant whose GPUs are all absent, failed or too small is left unplaced, with the
    /// reason in the plan.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuId>,
    /// The one profile its inference instance may have; `None`: the planner sizes it. Its retraining is not pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<Profile>,
}

impl TenantPin {
    /// Most GPUs one pin may name.
    pub const MAX_GPUS: usize = 256;

    /// Whether it constrains nothing.
    pub fn is_empty(&self) -> bool {
        self.gpus.is_empty() && self.profile.is_none()
    }

    /// Whether the tenant may be placed on `gpu`.
    pub fn allows(&self, gpu: &GpuId) -> bool {
        self.gpus.is_empty() || self.gpus.contains(gpu)
    }

    /// Whether its inference may use an instance of `profile`.
    pub fn allows_profile(&self, profile: Profile) -> bool {
        self.profile.is_none_or(|p| p == profile)
    }
}

impl std::fmt::Display for TenantPin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        let gpus = if self.gpus.is_empty() {
            "any GPU".to_string()
        } else {
            self.gpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
        };
        match self.profile {
            Some(p) => write!(f, "{gpus} as {p}"),
            None => f.write_str(&gpus),
        }
    }
}

impl TenantSpec {
    /// Accuracy of the deployed model at the start (1 for a tenant that never retrains: its accuracy does not
    /// change, so goodput reduces to requests within SLO).
    pub fn initial_accuracy(&self) -> f64 {
        self.retraining.as_ref().map_or(1.0, |r| r.initial_accuracy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retraining_work_and_accuracy_scale_with_epochs() {
        let r = RetrainingSpec {
            window_ms: 200_000,
            work_gpu_s: 60.0,
            epochs: 5.0,
            curve: OptimusCurve { b0: 2.0, b1: 1.5, b2: 0.08 },
            initial_accuracy: 0.7,
            drift: Drift { per_window: 0.02, floor: 0.5 },
        };
        assert!((r.work_for_epochs(5.0) - 60.0).abs() < 1e-12);
        assert!((r.work_for_epochs(2.0) - 24.0).abs() < 1e-12);
        assert!(r.accuracy_after(5.0) > r.accuracy_after(2.0));
        assert!((r.accuracy_after(5.0) - (1.0 - (1.0 / 11.5 + 0.08))).abs() < 1e-12);
    }
}
