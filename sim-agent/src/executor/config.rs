//! The executor's settings: batching, dispatch, what happens to requests without an instance, and the
//! reconfiguration latencies. One source of defaults ([`ExecutorConfig::default`]); [`ExecutorConfig::validate`]
//! names the bad field.

use serde::{Deserialize, Serialize};
use tessera_core::reconfig::ReconfigLatency;
pub use tessera_core::serving::Dispatch;
use tessera_core::serving::{BATCH_WINDOW_OF_SLO, DEAD_PREINIT_S};
pub use tessera_core::sharing::ShareParams;

use super::ExecError;

/// The largest batch an inference instance forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchCap {
    /// The model's `max_batch`, whatever its latency.
    MaxBatch,
    /// The largest batch `b <= max_batch` with `2 x lat(b) x slowdown <= slo` (at least 1): the batch core's SLO
    /// capacity ([`tessera_core::model::ModelProfile::slo_capacity_on`]) and PARIS's batch distribution assume, so
    /// the planner's capacity and the measured one describe the same server. A model that misses its SLO even at
    /// batch 1 is served one request at a time.
    SloAdmissible,
}

/// How long a request at the head of an idle instance's queue waits for its batch to fill.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchTimeout {
    /// This share of the tenant's SLO.
    OfSlo(f64),
    /// A fixed time, ms.
    Ms(f64),
}

impl BatchTimeout {
    /// The timeout for a tenant with `slo_ms`, ms.
    pub fn ms(self, slo_ms: f64) -> f64 {
        match self {
            BatchTimeout::OfSlo(share) => share * slo_ms,
            BatchTimeout::Ms(ms) => ms,
        }
    }
}

/// What happens to a request of a tenant that has no serving inference instance (none planned, or its instances
/// are being created, warmed or switched).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoInstance {
    /// Dropped at once.
    Drop,
    /// Waits in the tenant's queue for an instance for at most `max_wait_of_slo x slo`, then is dropped. With
    /// 1.0 (the default) a request is dropped exactly when it can no longer meet its SLO: served later, it would
    /// count as completed but late, which earns no goodput either.
    Wait {
        /// Longest wait, as a share of the SLO.
        max_wait_of_slo: f64,
    },
}

/// What a serving instance does with queued requests that can no longer meet their SLO.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LateRequests {
    /// Served anyway, in arrival order (Triton's default queue policy). They complete late and earn nothing, and
    /// under overload they take the capacity of the requests behind them, which then complete late too.
    #[default]
    Serve,
    /// Shed when a batch starts, as Clockwork and Nexus do: while the oldest queued request would finish after
    /// its deadline in the batch about to start, it is dropped (counted in
    /// [`TenantMetrics::dropped_late`](super::TenantMetrics::dropped_late)). Every request served then meets
    /// the SLO, and an overload loses only its excess.
    Shed,
}

/// Settings of an [`Executor`](super::Executor).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorConfig {
    /// Seed of the arrivals the executor generates ([`Executor::poisson_arrivals`](super::Executor::poisson_arrivals)).
    /// The executor itself draws no random numbers.
    pub seed: u64,
    /// MIG call and warm-up latencies of every GPU (the device module's, from `core::reconfig`).
    pub latency: ReconfigLatency,
    /// The short switch of a pre-initialised instance that replaces an instance of the same work on its GPU: the
    /// old one stops taking requests when the new one is warm, the new one serves `switch_ms` later. Default: the
    /// planner's `dead_preinit_s` (1 s), the dead time it charges such an instance.
    pub switch_ms: f64,
    /// Batching window. Default: [`BATCH_WINDOW_OF_SLO`] of the SLO, the window PARIS's batch distribution assumes.
    pub batch_timeout: BatchTimeout,
    /// Largest batch. Default: [`BatchCap::SloAdmissible`].
    pub batch_cap: BatchCap,
    /// Requests without a serving instance. Default: wait up to the SLO.
    pub no_instance: NoInstance,
    /// Dispatch rule among a tenant's instances. Default: [`Dispatch::EarliestFinish`].
    pub dispatch: Dispatch,
    /// Queued requests that can no longer meet their SLO. Default: [`LateRequests::Serve`].
    pub late: LateRequests,
    /// Keep a [`BatchRecord`](super::BatchRecord) of every completed batch (for tests and time series; it
    /// allocates per batch, so it is off by default).
    pub record_batches: bool,
    /// The sharing model of instances that serve a tenant's inference and its retraining
    /// ([`tessera_core::sharing`]).
    pub share: ShareParams,
}

impl Default for ExecutorConfig {
    fn default() -> Self {
        ExecutorConfig {
            seed: 0,
            latency: ReconfigLatency::default(),
            switch_ms: DEAD_PREINIT_S * 1000.0,
            batch_timeout: BatchTimeout::OfSlo(BATCH_WINDOW_OF_SLO),
            batch_cap: BatchCap::SloAdmissible,
            no_instance: NoInstance::Wait { max_wait_of_slo: 1.0 },
            dispatch: Dispatch::EarliestFinish,
            late: LateRequests::Serve,
            record_batches: false,
            share: ShareParams::default(),
        }
    }
}

impl ExecutorConfig {
    /// Checks the settings, naming the first bad field.
    pub fn validate(&self) -> Result<(), ExecError> {
        let bad = |field: &'static str, reason: String| Err(ExecError::InvalidConfig { field, reason });
        if !(self.switch_ms.is_finite() && self.switch_ms >= 0.0) {
            return bad("switch_ms", format!("must be finite and >= 0 (got {})", self.switch_ms));
        }
        match self.batch_timeout {
            BatchTimeout::OfSlo(v) | BatchTimeout::Ms(v) if !(v.is_finite() && v >= 0.0) => {
                return bad("batch_timeout", format!("must be finite and >= 0 (got {v})"));
            }
            _ => {}
        }
        if let NoInstance::Wait { max_wait_of_slo } = self.no_instance
            && !(max_wait_of_slo.is_finite() && max_wait_of_slo >= 0.0)
        {
            return bad("no_instance.max_wait_of_slo", format!("must be finite and >= 0 (got {max_wait_of_slo})"));
        }
        if let Err(e) = self.share.validate() {
            return bad("share", e.to_string());
        }
        Ok(())
    }
}
