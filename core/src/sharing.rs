//! # Sharing one MIG instance between a tenant's inference and its retraining
//!
//! MIG isolates instances from one another; inside one instance, two processes share its SMs the way they share a
//! whole GPU. A plan may put a tenant's inference and its retraining on one instance ([`Sharing`] on the GPU's
//! plan); this module is the model the planner and both executors of the simulator agree on, so that what is
//! planned is what is served:
//!
//! - **timeslice** (TGS-like, time-sliced contexts): one context runs at a time; while both have work they
//!   alternate slices of [`ShareParams::timeslice_ms`], a slice ending at the first kernel boundary of its holder
//!   after it expires, and each switch costs [`ShareParams::switch_ms`].
//! - **priority** (Tally: Zhao, Jayarajan, Pekhimenko, ASPLOS 2025): inference kernels launch at once and preempt
//!   training at thread-block granularity, waiting at most [`ShareParams::preempt_bound_ms`] for the blocks in
//!   flight; training launches after [`ShareParams::idle_before_train_ms`] of inference idleness and runs
//!   transformed kernels at [`ShareParams::transform_efficiency`] of their speed.
//!
//! ## What the executors and the planner charge
//! Per batch of `L` ms of inference work (its latency alone on the instance):
//! - **priority**: the batch may start while training blocks are in flight, so it takes `L + preempt_bound_ms`
//!   ([`ShareParams::batch_latency_ms`]; the bound, not a draw: the executors draw no random numbers).
//! - **timeslice**: the batch first waits for training's slice: at worst a whole slice, the rest of the training
//!   kernel in flight at its end (the mean residual of the log-normal kernel durations,
//!   [`ShareParams::train_kernel_residual_ms`]) and a switch. It then runs in slices of at least `timeslice_ms`
//!   (whole inference kernels of `L / inference_kernels`), and between two of them training takes a slice (plus
//!   its residual kernel and two switches). Training runs in the wait and in those slices
//!   ([`ShareParams::batch_train_ms`]).
//!
//! Training's share of the instance over a period of `T` ms with `n` batches of `B` ms of latency in total
//! ([`ShareParams::train_share`]): priority `eff (T - B - n min(idle, gap)) / T` (every idle gap loses the idleness
//! Tally waits for before training launches); timeslice `(T - B - n switch + in-batch training) / T`.
//!
//! The discrete `sim-agent share` command simulates the same mechanisms kernel by kernel with random arrivals and
//! kernel durations (its p99 and training share are the distribution these bounds summarise). Neither models
//! memory-bandwidth or cache contention between the two jobs. Parameters marked \[I\] are assumptions; the rest
//! cite Tally.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// How a tenant's inference and retraining share one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Sharing {
    /// One role per instance: retraining needs an instance of its own.
    #[default]
    Exclusive,
    /// Time-sliced contexts (TGS-like): the jobs alternate, switching at kernel boundaries.
    Timeslice,
    /// Tally's block-level priority: inference preempts training within a bounded wait; training fills idle time.
    Priority,
}

impl Sharing {
    /// Every mode, in order.
    pub const ALL: [Sharing; 3] = [Sharing::Exclusive, Sharing::Timeslice, Sharing::Priority];

    /// The name used on command lines, in configs and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Sharing::Exclusive => "exclusive",
            Sharing::Timeslice => "timeslice",
            Sharing::Priority => "priority",
        }
    }

    /// Whether the mode is [`Sharing::Exclusive`] (for serde's `skip_serializing_if`).
    pub fn is_exclusive(&self) -> bool {
        *self == Sharing::Exclusive
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A sharing mode name that is not one of [`Sharing::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown sharing mode {0:?} (expected exclusive, timeslice or priority)")]
pub struct UnknownSharing(pub String);

impl FromStr for Sharing {
    type Err = UnknownSharing;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Sharing::ALL.into_iter().find(|m| m.name() == s).ok_or_else(|| UnknownSharing(s.to_string()))
    }
}

/// Parameters of the sharing model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShareParams {
    /// Kernels per inference batch \[I: a ResNet-50-sized network is tens of kernels\]. 40.
    pub inference_kernels: u32,
    /// Median training kernel duration, ms \[I: backward GEMMs of a BERT-base step on a MIG slice\]. 0.3.
    pub train_kernel_median_ms: f64,
    /// Log-normal sigma of training kernel durations \[I: a long tail of large GEMMs, p99 about 10x the median\]. 1.0.
    pub train_kernel_sigma: f64,
    /// Time slice of each context in the time-slice mode, ms \[I: NVIDIA's driver sets per-context timeslices in
    /// microseconds with a 1 ms minimum (DRIVE OS `NVRM_GPU_CHANNEL_TIMESLICE`); 2 ms is assumed\]. 2.0.
    pub timeslice_ms: f64,
    /// Cost of one context switch in the time-slice mode, ms \[I\]. 0.05.
    pub switch_ms: f64,
    /// Tally's bound on the estimated preemption latency, ms (0.1 by default in Tally). 0.1.
    pub preempt_bound_ms: f64,
    /// Inference idleness before a training kernel launches in the priority mode, ms (Tally: 0.1). 0.1.
    pub idle_before_train_ms: f64,
    /// Speed of Tally-transformed training kernels relative to the originals \[I: slicing and persistent thread
    /// blocks cost a few per cent\]. 0.95.
    pub transform_efficiency: f64,
}

impl Default for ShareParams {
    fn default() -> Self {
        ShareParams {
            inference_kernels: 40,
            train_kernel_median_ms: 0.3,
            train_kernel_sigma: 1.0,
            timeslice_ms: 2.0,
            switch_ms: 0.05,
            preempt_bound_ms: 0.1,
            idle_before_train_ms: 0.1,
            transform_efficiency: 0.95,
        }
    }
}

/// A sharing parameter out of range.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("sharing parameter {field}: {reason}")]
pub struct InvalidShareParams {
    /// The parameter.
    pub field: &'static str,
    /// Why.
    pub reason: String,
}

impl ShareParams {
    /// Checks every parameter against a range that keeps durations measurable in `f64` milliseconds.
    pub fn validate(&self) -> Result<(), InvalidShareParams> {
        let ranges = [
            ("train_kernel_median_ms", self.train_kernel_median_ms, 1e-3, 1e3),
            ("train_kernel_sigma", self.train_kernel_sigma, 0.0, 3.0),
            ("timeslice_ms", self.timeslice_ms, 1e-3, 1e3),
            ("switch_ms", self.switch_ms, 0.0, 1e3),
            ("preempt_bound_ms", self.preempt_bound_ms, 0.0, 1e3),
            ("idle_before_train_ms", self.idle_before_train_ms, 0.0, 1e3),
            ("transform_efficiency", self.transform_efficiency, 1e-3, 1.0),
        ];
        for (field, v, lo, hi) in ranges {
            if !(lo..=hi).contains(&v) {
                return Err(InvalidShareParams { field, reason: format!("{v} is not in [{lo}, {hi}]") });
            }
        }
        if !(1..=10_000).contains(&self.inference_kernels) {
            return Err(InvalidShareParams {
                field: "inference_kernels",
                reason: format!("{} is not in [1, 10000]", self.inference_kernels),
            });
        }
        Ok(())
    }

    /// Mean training kernel duration, ms: `median e^(sigma^2 / 2)` (log-normal).
    pub fn train_kernel_mean_ms(&self) -> f64 {
        self.train_kernel_median_ms * (self.train_kernel_sigma.powi(2) / 2.0).exp()
    }

    /// Mean rest of the training kernel in flight when a slice expires at a random moment, ms: `E[K^2] / (2 E[K])`,
    /// `median e^(3 sigma^2 / 2) / 2` (the inspection paradox: long kernels are more likely to be in flight).
    pub fn train_kernel_residual_ms(&self) -> f64 {
        self.train_kernel_median_ms * (1.5 * self.train_kernel_sigma.powi(2)).exp() / 2.0
    }

    /// Time-slice mode: breaks a batch of `batch_ms` of inference work takes for training's slices.
    fn timeslice_breaks(&self, batch_ms: f64) -> f64 {
        let kernel = batch_ms / f64::from(self.inference_kernels.max(1));
        // Inference yields at its first kernel boundary after the slice expires.
        let slice = if kernel > 0.0 { (self.timeslice_ms / kernel).ceil().max(1.0) * kernel } else { batch_ms };
        if slice <= 0.0 { 0.0 } else { ((batch_ms / slice).ceil() - 1.0).max(0.0) }
    }

    /// Latency of a batch of `batch_ms` of inference work (alone on the instance) under `mode`, ms.
    pub fn batch_latency_ms(&self, mode: Sharing, batch_ms: f64) -> f64 {
        match mode {
            Sharing::Exclusive => batch_ms,
            Sharing::Priority => batch_ms + self.preempt_bound_ms,
            Sharing::Timeslice => {
                let train_slice = self.timeslice_ms + self.train_kernel_residual_ms();
                let wait = train_slice + self.switch_ms;
                wait + batch_ms + self.timeslice_breaks(batch_ms) * (train_slice + 2.0 * self.switch_ms)
            }
        }
    }

    /// Training time within one batch's latency under `mode`, ms: time-slice mode's wait and slices between the
    /// batch's own (0 in the other modes).
    pub fn batch_train_ms(&self, mode: Sharing, batch_ms: f64) -> f64 {
        match mode {
            Sharing::Timeslice => {
                let train_slice = self.timeslice_ms + self.train_kernel_residual_ms();
                train_slice * (1.0 + self.timeslice_breaks(batch_ms))
            }
            _ => 0.0,
        }
    }

    /// Training's share of a shared instance (1 = the training job alone on it) over `period_ms` in which
    /// inference ran `batches` batches taking `busy_ms` of latency in total and training ran `in_batch_train_ms`
    /// within them ([`ShareParams::batch_train_ms`]). 0 for [`Sharing::Exclusive`].
    pub fn train_share(
        &self,
        mode: Sharing,
        period_ms: f64,
        busy_ms: f64,
        batches: f64,
        in_batch_train_ms: f64,
    ) -> f64 {
        if period_ms <= 0.0 {
            return 0.0;
        }
        let idle = (period_ms - busy_ms).max(0.0);
        let share = match mode {
            Sharing::Exclusive => 0.0,
            Sharing::Priority => {
                // Each idle gap loses Tally's idleness threshold (at most the mean gap).
                let gap = if batches > 0.0 { idle / batches } else { idle };
                let lost = batches * self.idle_before_train_ms.min(gap);
                self.transform_efficiency * (idle - lost) / period_ms
            }
            Sharing::Timeslice => {
                (idle - batches * self.switch_ms).max(0.0) / period_ms + in_batch_train_ms / period_ms
            }
        };
        share.clamp(0.0, 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for m in Sharing::ALL {
            assert_eq!(m.name().parse::<Sharing>(), Ok(m));
            assert_eq!(serde_json::to_string(&m).unwrap(), format!("\"{m}\""));
        }
        let e = "tally".parse::<Sharing>().unwrap_err();
        assert_eq!(e.to_string(), "unknown sharing mode \"tally\" (expected exclusive, timeslice or priority)");
        assert_eq!(Sharing::default(), Sharing::Exclusive);
    }

    #[test]
    fn priority_costs_inference_the_preemption_bound_and_timeslice_a_slice_or_more() {
        let p = ShareParams::default();
        assert_eq!(p.batch_latency_ms(Sharing::Exclusive, 5.0), 5.0);
        assert!((p.batch_latency_ms(Sharing::Priority, 5.0) - 5.1).abs() < 1e-12);
        let short = p.batch_latency_ms(Sharing::Timeslice, 1.0);
        // One wait for training's slice (2 ms + the residual kernel + a switch), no break: the batch fits a slice.
        assert!((short - (1.0 + 2.0 + p.train_kernel_residual_ms() + 0.05)).abs() < 1e-12, "{short}");
        // A 10 ms batch runs in 2 ms slices (whole 0.25 ms kernels): four breaks for training.
        let long = p.batch_latency_ms(Sharing::Timeslice, 10.0);
        let slice = 2.0 + p.train_kernel_residual_ms();
        assert!((long - (10.0 + slice + 0.05 + 4.0 * (slice + 0.1))).abs() < 1e-9, "{long}");
        assert!((p.batch_train_ms(Sharing::Timeslice, 10.0) - 5.0 * slice).abs() < 1e-9);
        assert_eq!(p.batch_train_ms(Sharing::Priority, 10.0), 0.0);
        // The residual exceeds the mean kernel (inspection paradox) for any sigma > 0.
        assert!(p.train_kernel_residual_ms() > p.train_kernel_mean_ms() / 2.0);
    }

    #[test]
    fn training_shares_conserve_the_instance_time() {
        let p = ShareParams::default();
        for mode in Sharing::ALL {
            for (busy, batches) in [(0.0f64, 0.0f64), (300.0, 100.0), (999.0, 1000.0), (1000.0, 10.0)] {
                let in_batch = batches * p.batch_train_ms(mode, 1.0).min(busy / batches.max(1.0));
                let s = p.train_share(mode, 1000.0, busy, batches, in_batch);
                assert!((0.0..=1.0).contains(&s), "{mode} {busy} {batches}: {s}");
                // Training never runs in inference's own time: its share plus inference's own work is at most 1.
                let own = (busy - in_batch).max(0.0) / 1000.0;
                assert!(s + own <= 1.0 + 1e-12, "{mode} {busy} {batches}: {s} + {own}");
            }
        }
        assert_eq!(p.train_share(Sharing::Exclusive, 1000.0, 0.0, 0.0, 0.0), 0.0);
        assert!((p.train_share(Sharing::Priority, 1000.0, 0.0, 0.0, 0.0) - 0.95).abs() < 1e-12);
        // 100 gaps of 7 ms each lose 0.1 ms: 0.95 x (700 - 10) / 1000.
        assert!((p.train_share(Sharing::Priority, 1000.0, 300.0, 100.0, 0.0) - 0.95 * 0.69).abs() < 1e-12);
        assert_eq!(p.train_share(Sharing::Priority, 0.0, 0.0, 0.0, 0.0), 0.0);
    }

    #[test]
    fn parameters_out_of_range_are_named() {
        assert!(ShareParams::default().validate().is_ok());
        let bad = ShareParams { timeslice_ms: 0.0, ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().field, "timeslice_ms");
        let bad = ShareParams { inference_kernels: 0, ..Default::default() };
        assert_eq!(bad.validate().unwrap_err().field, "inference_kernels");
    }
}
