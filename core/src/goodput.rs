//! Goodput accounting, shared by the planner's estimates and the simulator's measurements.
//!
//! **Goodput** is the sum, over inference requests completed within their SLO, of the accuracy of the model version
//! that served them. It is always reported beside **SLO attainment** (requests within SLO / requests that arrived,
//! dropped ones and ones still queued included) and **mean accuracy** (over completed requests), never alone: a
//! policy can raise one by sacrificing the other.
//!
//! Requests are counted when they **arrive** ([`GoodputLedger::record_arrivals`]); completions and drops settle
//! them later. A request still queued when a window's ledger is read counts against attainment until it completes,
//! so a backlog can never look like good service.

use std::ops::AddAssign;

use serde::{Deserialize, Serialize};

/// Counters for a tenant, a GPU or a whole run. Merge with `+=`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GoodputLedger {
    /// Requests that arrived (completed, dropped or still in flight).
    pub requests: u64,
    /// Requests completed (within SLO or not).
    pub completed: u64,
    /// Requests completed within their SLO.
    pub within_slo: u64,
    /// Requests dropped without being served.
    pub dropped: u64,
    /// Sum of the serving model's accuracy over requests within SLO.
    pub goodput: f64,
    /// Sum of the serving model's accuracy over completed requests.
    pub accuracy_sum: f64,
}

impl GoodputLedger {
    /// Records `n` arriving requests.
    pub fn record_arrivals(&mut self, n: u64) {
        self.requests += n;
    }

    /// Records the completion of a request that arrived earlier.
    pub fn record_completion(&mut self, latency_ms: f64, slo_ms: f64, accuracy: f64) {
        self.completed += 1;
        self.accuracy_sum += accuracy;
        if latency_ms <= slo_ms {
            self.within_slo += 1;
            self.goodput += accuracy;
        }
    }

    /// Records the completion of `n` earlier arrivals with the same latency and accuracy (a batch).
    pub fn record_batch(&mut self, n: u64, latency_ms: f64, slo_ms: f64, accuracy: f64) {
        self.completed += n;
        self.accuracy_sum += accuracy * n as f64;
        if latency_ms <= slo_ms {
            self.within_slo += n;
            self.goodput += accuracy * n as f64;
        }
    }

    /// Records that an earlier arrival was dropped without being served.
    pub fn record_drop(&mut self) {
        self.dropped += 1;
    }

    /// Requests that arrived and are neither completed nor dropped.
    pub fn in_flight(&self) -> u64 {
        self.requests.saturating_sub(self.completed + self.dropped)
    }

    /// Requests within SLO over requests that arrived; `None` when none arrived (0/0 is no share).
    pub fn attainment(&self) -> Option<f64> {
        (self.requests > 0).then(|| self.within_slo as f64 / self.requests as f64)
    }

    /// Requests within SLO over requests that arrived (1 when none arrived: nothing was missed). For reports, where
    /// 0/0 must not read as a share, [`GoodputLedger::attainment`].
    pub fn slo_attainment(&self) -> f64 {
        if self.requests == 0 { 1.0 } else { self.within_slo as f64 / self.requests as f64 }
    }

    /// Mean accuracy of the model versions that served completed requests (0 when none completed).
    pub fn mean_accuracy(&self) -> f64 {
        if self.completed == 0 { 0.0 } else { self.accuracy_sum / self.completed as f64 }
    }
}

impl AddAssign for GoodputLedger {
    fn add_assign(&mut self, o: GoodputLedger) {
        self.requests += o.requests;
        self.completed += o.completed;
        self.within_slo += o.within_slo;
        self.dropped += o.dropped;
        self.goodput += o.goodput;
        self.accuracy_sum += o.accuracy_sum;
    }
}

/// Expected goodput of serving `arrivals` requests with capacity for `capacity` of them within SLO, with a model
/// of `accuracy`: the planner's estimate of what [`GoodputLedger::goodput`] will measure.
pub fn expected_goodput(arrivals: f64, capacity: f64, accuracy: f64) -> f64 {
    arrivals.min(capacity).max(0.0) * accuracy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_counts_goodput_attainment_and_accuracy() {
        let mut l = GoodputLedger::default();
        l.record_arrivals(5);
        l.record_completion(10.0, 20.0, 0.9);
        l.record_completion(30.0, 20.0, 0.9);
        l.record_batch(2, 5.0, 20.0, 0.5);
        l.record_drop();
        assert_eq!((l.requests, l.completed, l.within_slo, l.dropped, l.in_flight()), (5, 4, 3, 1, 0));
        assert!((l.goodput - 1.9).abs() < 1e-12);
        assert!((l.slo_attainment() - 0.6).abs() < 1e-12);
        assert!((l.mean_accuracy() - 0.7).abs() < 1e-12);
        let mut total = GoodputLedger::default();
        total += l;
        total += l;
        assert_eq!(total.requests, 10);
        assert!((total.slo_attainment() - 0.6).abs() < 1e-12);
    }

    #[test]
    fn a_backlog_counts_against_attainment() {
        let mut l = GoodputLedger::default();
        l.record_arrivals(10);
        l.record_batch(4, 5.0, 20.0, 0.8);
        assert_eq!(l.in_flight(), 6);
        assert!((l.slo_attainment() - 0.4).abs() < 1e-12);
    }

    #[test]
    fn empty_ledger_is_well_defined() {
        let l = GoodputLedger::default();
        assert_eq!((l.slo_attainment(), l.mean_accuracy()), (1.0, 0.0));
        assert_eq!(expected_goodput(100.0, 60.0, 0.5), 30.0);
    }
}
