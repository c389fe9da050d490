//! What the executor measures: per-tenant and per-GPU counters around a [`GoodputLedger`], a latency histogram,
//! the state replay reads to build the next planner input, and the serialisable report.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tessera_core::goodput::GoodputLedger;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::layout::Placement;
use tessera_core::plan::Assignment;

use super::{GpuIndex, TenantIndex};

/// Sub-buckets per power of two: about 12% resolution.
const SUB_BUCKETS: usize = 8;
/// Powers of two above the first 8 microseconds covered (up to 2^40 us, about 12 days).
const OCTAVES: usize = 38;
const BUCKETS: usize = SUB_BUCKETS + OCTAVES * SUB_BUCKETS;

/// Request latencies in logarithmic buckets of microseconds (exact below 8 us, then 8 buckets per power of two).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// Requests per bucket.
    pub counts: Vec<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram { counts: vec![0; BUCKETS] }
    }
}

impl LatencyHistogram {
    fn bucket(latency_ms: f64) -> usize {
        let us = (latency_ms * 1000.0) as u64; // saturating; negative and NaN become 0
        if us < SUB_BUCKETS as u64 {
            return us as usize;
        }
        let e = 63 - us.leading_zeros() as usize; // >= 3
        let sub = ((us >> (e - 3)) & 7) as usize;
        (SUB_BUCKETS + (e - 3) * SUB_BUCKETS + sub).min(BUCKETS - 1)
    }

    /// Upper edge of bucket `i`, ms.
    fn upper_ms(i: usize) -> f64 {
        if i < SUB_BUCKETS {
            return (i + 1) as f64 / 1000.0;
        }
        let e = (i - SUB_BUCKETS) / SUB_BUCKETS + 3;
        let sub = (i - SUB_BUCKETS) % SUB_BUCKETS;
        ((9 + sub) as u64 * (1u64 << (e - 3))) as f64 / 1000.0
    }

    /// Adds `n` requests of `latency_ms`.
    pub fn record(&mut self, latency_ms: f64, n: u64) {
        self.counts[Self::bucket(latency_ms)] += n;
    }

    /// Adds every request of `other` (histograms of several tenants make the run's).
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
    }

    /// Requests recorded.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The distribution as steps, for a CDF: each non-empty bucket's upper edge (ms) with the requests recorded at
    /// or below it, in increasing order.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut seen = 0;
        let mut steps = Vec::new();
        for (i, &c) in self.counts.iter().enumerate() {
            if c > 0 {
                seen += c;
                steps.push((Self::upper_ms(i), seen));
            }
        }
        steps
    }

    /// The upper edge of the bucket holding the `q`-quantile (`q` in `[0, 1]`), ms; `None` when empty.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::upper_ms(i));
            }
        }
        Some(Self::upper_ms(BUCKETS - 1))
    }
}

/// Counters of one tenant since the start.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantMetrics {
    /// Goodput accounting: arrivals, completions, drops, goodput.
    pub ledger: GoodputLedger,
    /// Sum of the latencies (completion - arrival) of completed requests, ms.
    pub latency_sum_ms: f64,
    /// Largest latency of a completed request, ms.
    pub latency_max_ms: f64,
    /// Latencies of completed requests.
    pub latency: LatencyHistogram,
    /// Batches completed.
    pub batches: u64,
    /// Requests that went to the tenant's waiting queue (no serving instance).
    pub waited: u64,
    /// Requests dropped at once because no instance was serving ([`NoInstance::Drop`](super::NoInstance::Drop)).
    pub dropped_no_instance: u64,
    /// Requests dropped after waiting their longest wait.
    pub dropped_wait_expired: u64,
    /// Requests shed from a queue because they could no longer meet the SLO ([`LateRequests::Shed`](super::LateRequests::Shed)).
    pub dropped_late: u64,
    /// Queued requests moved off an instance that was switched off (drain).
    pub redispatched: u64,
    /// Longest queue (requests waiting for a batch, batch in service excluded) seen on one of its instances.
    pub max_queue_len: u64,
    /// Longest waiting queue (no serving instance) seen.
    pub max_waiting_len: u64,
    /// Retrainings completed.
    pub retrainings_completed: u64,
    /// Retraining windows that ended without a completed retraining (the model drifted).
    pub drift_windows: u64,
    /// Its instances that shared inference with retraining ([`tessera_core::sharing`]).
    #[serde(default)]
    pub shared: SharedMetrics,
}

/// Time on a tenant's shared instances (inference and retraining on one instance), ms of instance time: each
/// settled period is split into inference's own work, training (at its speed alone on the instance) and the rest
/// (idle, switches, Tally's idleness threshold, transformed kernels' loss), so
/// `inference_ms + train_ms <= serving_ms`: no instance second is counted twice.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct SharedMetrics {
    /// Time its shared instances served.
    pub serving_ms: f64,
    /// Time inference kernels ran on them (batch latency less the training within it).
    pub inference_ms: f64,
    /// Training time credited, as time alone on the instance.
    pub train_ms: f64,
    /// Retraining work credited there, 7g GPU-seconds.
    pub train_gpu_s: f64,
}

impl TenantMetrics {
    /// Mean latency of completed requests, ms (0 when none completed).
    pub fn mean_latency_ms(&self) -> f64 {
        if self.ledger.completed == 0 { 0.0 } else { self.latency_sum_ms / self.ledger.completed as f64 }
    }
}

/// Counters of one GPU since the start. Its ledger counts the requests queued on its instances: a request moved to
/// another GPU's instance by a drain counts there, not here, and drops happen at the tenant, so its only drops are
/// the late requests its instances shed ([`LateRequests::Shed`](super::LateRequests::Shed)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuMetrics {
    /// Goodput of the requests its instances served.
    pub ledger: GoodputLedger,
    /// Batches completed.
    pub batches: u64,
    /// Instance-milliseconds spent serving batches.
    pub busy_ms: f64,
    /// Plans applied that changed something.
    pub reconfigurations: u64,
    /// When each of those plans was applied, ms of workload time, in order.
    #[serde(default)]
    pub reconfigured_at_ms: Vec<f64>,
    /// Instances created.
    pub creates: u64,
    /// Instances destroyed.
    pub destroys: u64,
    /// Instances kept whose work changed.
    pub reassigns: u64,
    /// Pre-initialised creates (made while the work they replace still ran).
    pub preinit_creates: u64,
    /// Assignments marked `preinit` whose slices were not free, created cold instead.
    pub preinit_not_free: u64,
    /// Longest queue seen on one of its instances.
    pub max_queue_len: u64,
}

/// A tenant's state as replay needs it to build the next `PlannerInput` (`tessera_planner::PlannerInput`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TenantState {
    /// Accuracy of the model serving now.
    pub accuracy: f64,
    /// A retraining is due in this window (fresh data arrived and it has not completed).
    pub retraining_due: bool,
    /// Work done on the due retraining, 7g GPU-seconds (0 when none is due).
    pub retraining_done_gpu_s: f64,
    /// Work of the due retraining at the epochs last planned, 7g GPU-seconds.
    pub retraining_work_gpu_s: f64,
    /// Epochs of the retraining, as the latest plan that gave the tenant a retraining instance chose them (the
    /// spec's until one did; 0 without retraining).
    #[serde(default)]
    pub retraining_epochs: f64,
    /// Requests that arrived since the start (difference two readings for a window's arrivals).
    pub arrivals: u64,
    /// Requests queued on its instances now, batches in service included.
    pub queued: u64,
    /// Requests in its waiting queue now (no serving instance).
    pub waiting: u64,
    /// Inference instances serving now.
    pub serving_instances: u32,
}

/// One completed batch ([`ExecutorConfig::record_batches`](super::ExecutorConfig::record_batches)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BatchRecord {
    /// The GPU.
    pub gpu: GpuIndex,
    /// The instance.
    pub placement: Placement,
    /// The tenant.
    pub tenant: TenantIndex,
    /// Requests in the batch.
    pub size: u32,
    /// When it started, ms.
    pub started_ms: f64,
    /// When it completed, ms.
    pub completed_ms: f64,
    /// Accuracy of the model that served it.
    pub accuracy: f64,
}

/// What applying a plan to a GPU set in motion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigSummary {
    /// Instances kept with their work.
    pub kept: u32,
    /// Instances kept whose work changes.
    pub reassigned: u32,
    /// Instances to destroy.
    pub destroyed: u32,
    /// Instances created at once, pre-initialised (their work's old instance serves until they are warm).
    pub created_preinit: u32,
    /// Instances created cold (at once on free slices, or once the slices they need are freed).
    pub created_cold: u32,
}

impl ReconfigSummary {
    /// Whether the plan changed nothing.
    pub fn is_noop(&self) -> bool {
        self.reassigned + self.destroyed + self.created_preinit + self.created_cold == 0
    }
}

/// One tenant in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    /// State now.
    pub state: TenantState,
    /// Counters.
    pub metrics: TenantMetrics,
}

/// One GPU in a report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    /// Its live instances.
    pub layout: String,
    /// Who works on which instance (work loaded or loading).
    pub assignments: Vec<Assignment>,
    /// Requests queued on its instances now.
    pub queued: u64,
    /// Counters.
    pub metrics: GpuMetrics,
}

/// Everything the executor measured, ordered by id (deterministic when serialised).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExecutorReport {
    /// Workload time of the report, ms.
    pub now_ms: f64,
    /// All tenants' ledgers added.
    pub total: GoodputLedger,
    /// Per tenant.
    pub tenants: BTreeMap<TenantId, TenantReport>,
    /// Per GPU.
    pub gpus: BTreeMap<GpuId, GpuReport>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_histograms_count_every_request_once() {
        let (mut a, mut b) = (LatencyHistogram::default(), LatencyHistogram::default());
        a.record(1.0, 3);
        b.record(1.0, 2);
        b.record(100.0, 5);
        a.merge(&b);
        assert_eq!(a.total(), 10);
        assert_eq!(a.counts[LatencyHistogram::bucket(1.0)], 5);
        assert!(a.quantile_ms(0.5).unwrap() < 2.0 && a.quantile_ms(0.9).unwrap() >= 100.0);
    }

    #[test]
    fn cumulative_steps_rise_to_the_total_and_agree_with_the_quantiles() {
        let mut h = LatencyHistogram::default();
        assert!(h.cumulative().is_empty());
        for (ms, n) in [(0.5, 2), (3.0, 5), (40.0, 1), (3.1, 2), (900.0, 10)] {
            h.record(ms, n);
        }
        let steps = h.cumulative();
        assert_eq!(steps.last().map(|s| s.1), Some(h.total()));
        assert!(steps.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1), "{steps:?}");
        // The median is the first step holding half the requests.
        let median = steps.iter().find(|s| s.1 * 2 >= h.total()).map(|s| s.0);
        assert_eq!(median, h.quantile_ms(0.5));
    }

    #[test]
    fn histogram_buckets_are_ordered_and_quantiles_bound_the_values() {
        let mut h = LatencyHistogram::default();
        let mut last = 0;
        for us in [0u64, 1, 7, 8, 15, 16, 17, 100, 1_000, 12_345, 10_000_000] {
            let b = LatencyHistogram::bucket(us as f64 / 1000.0);
            assert!(b >= last, "{us}");
            assert!(LatencyHistogram::upper_ms(b) * 1000.0 > us as f64 - 1e-9, "{us} in {b}");
            last = b;
        }
        for ms in 1..=100 {
            h.record(f64::from(ms), 1);
        }
        let p50 = h.quantile_ms(0.5).unwrap();
        let p99 = h.quantile_ms(0.99).unwrap();
        assert!((50.0..=50.0 * 1.13).contains(&p50), "{p50}");
        assert!((99.0..=99.0 * 1.13).contains(&p99), "{p99}");
        assert_eq!(h.total(), 100);
        assert_eq!(LatencyHistogram::default().quantile_ms(0.5), None);
    }
}
