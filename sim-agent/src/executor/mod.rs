//! # The workload executor
//!
//! A fleet of simulated MIG GPUs serving continuous-learning tenants under a **virtual clock**: inference requests
//! queue per instance, are batched dynamically and served with the model profile's
//! latency scaled by interference; retraining advances by the profile's speed; accuracy jumps when a retraining
//! completes and drifts when a window ends without one; plans are applied per GPU with the device's MIG latencies.
//! Goodput is counted with `tessera-core`'s [`GoodputLedger`], the definition the planner estimates with.
//!
//! ## Layout
//! - `mod.rs`: [`Executor`], its public calls and the invariant check.
//! - [`config`]: [`ExecutorConfig`] (batching, dispatch, no-instance policy, latencies) with its defaults.
//! - `serve.rs`: the event loop and the inference hot path (dispatch, batching, completion, waiting queue).
//! - `fluid.rs`: fluid serving ([`Executor::flow`]): requests as counts per tick, for fleet-and-day-sized runs.
//! - `reconfigure.rs`: applying a [`GpuPlan`] (keep, reassign, destroy, create; drains; make-before-break).
//! - `retrain.rs`: retraining progress, completion and drift.
//! - [`interference`]: the [`Interference`] trait, [`NoInterference`] and [`TlbInterference`] (the L3 TLB model).
//! - [`arrivals`]: [`Arrival`] and seeded Poisson streams.
//! - [`metrics`]: per-tenant and per-GPU counters, [`TenantState`] for replay, the serialisable report.
//!
//! ## Time
//! Workload time is milliseconds as `f64` from the start of the run (batch latencies are fractions of a
//! millisecond). Nothing reads a clock: time moves only through [`Executor::arrive`] and
//! [`Executor::advance_to`], which handle every event due up to the time given, earliest first (ties: instance
//! events, then retraining completions, then window ends, then waiting-queue expiries, each by index). The
//! executor draws no random numbers; the seed only feeds the arrival streams it generates, so a run is a function
//! of its inputs and seed (no `HashMap` order reaches a result).
//!
//! ## Inference
//! - **Queue and batch** (the unit of work). Each inference instance has a FIFO of arrival times. An idle instance
//!   starts a batch when its queue holds a full batch, or when its head request has waited the batch timeout
//!   (Triton's `max_queue_delay`: a lone request waits at most the timeout); a busy one starts the next batch when
//!   the current one completes, under the same rule. A batch of `b` takes
//!   `ModelProfile::latency_on(gpu, profile, b) x slowdown`. The batch cap is the model's `max_batch`, or by
//!   default the largest batch with `2 x latency <= SLO` ([`BatchCap::SloAdmissible`]: the rule of
//!   [`ModelProfile::slo_capacity_on`], so the capacity the planner plans with is the one served). The default
//!   timeout is [`BATCH_WINDOW_OF_SLO`] (a quarter) of the SLO, PARIS's batching window, so PARIS's batch-size
//!   model and the simulated server agree.
//! - **Accounting.** An arrival is recorded at once ([`GoodputLedger::record_arrivals`]); each completed request
//!   is recorded with latency = completion - arrival and the accuracy of the model that served its batch (the
//!   tenant's accuracy when the batch started: a retrained model is swapped in between batches). Drops are
//!   recorded when they happen. At every instant `requests = completed + dropped + queued + waiting`.
//! - **Dispatch** among a tenant's serving instances (on any GPU): by default the earliest estimated finish;
//!   with [`Dispatch::Elsa`] the same estimates go to PARIS's [`elsa_dispatch`] (the smallest instance that meets
//!   the deadline, else the earliest finish). The estimate is an upper bound on the request's finish: its batch
//!   starts after the batch in service and the full batches queued ahead, at once if the request fills it, else
//!   at the latest when the batch's first request has waited the timeout; and it takes at most the latency of a
//!   full batch. An optimistic estimate (the batch's current size, no timeout) would let ELSA fill the smallest
//!   instances to the deadline and then miss it as batches grow; with the bound, an instance ELSA picks as
//!   meeting the SLO does meet it (unless a reconfiguration intervenes).
//! - **Late requests** ([`LateRequests`]): by default a queued request is served however late. With
//!   [`LateRequests::Shed`], when a batch is about to start, the oldest queued request is dropped while it would
//!   complete after its deadline (arrival + SLO) in that batch; the queue is in arrival order and a batch's requests
//!   complete together, so the first one kept makes every request of the batch meet the SLO.
//! - **No serving instance** (none planned, or being created, warmed or switched): the request is dropped at once,
//!   or waits in the tenant's queue until an instance serves, at most `max_wait_of_slo x SLO` (default: the SLO,
//!   after which it can no longer meet it), then it is dropped ([`NoInstance`]). Both are counted.
//!
//! ## Reconfiguration
//! [`Executor::apply_plan`] takes a GPU's target at the current time. Instances whose placement and work are
//! unchanged are not touched and keep serving. The rest, in order:
//! 1. **Pre-initialised creates** (an assignment with `preinit` whose slices are free now) are issued first; the
//!    work is loaded at creation, so the instance is warm `create_ms + warmup_ms` after its call starts. Where it
//!    replaces an instance of the same work (tenant and role) on this GPU, that old instance keeps serving until
//!    the new one is warm, then switches off, and the new one serves `switch_ms` later (the short switch; default
//!    the planner's `dead_preinit_s`, so the dead time measured is the one planned). A `preinit` whose slices are
//!    not free is created cold (counted).
//! 2. **Cold creates** whose slices are free are issued next; the rest wait for their slices.
//! 3. **Switch-offs**: every other instance whose work goes stops taking requests at once. An inference instance
//!    **drains**: its queued requests are routed again (to the tenant's other serving instances or its waiting
//!    queue) and its batch in service completes; a retraining instance **checkpoints** (progress is kept, so a
//!    moved retraining resumes where it stopped, as the agent runtime checkpoints retraining progress on
//!    drain). A drained instance is destroyed (`destroy_ms`), which issues the waiting creates its slices free;
//!    a kept placement whose work changes loads the new work once drained and serves `warmup_ms` later.
//!
//! MIG calls run one after another on the GPU ([`SimGpu`], the device module, whose clock is whole
//! milliseconds; latencies are [`ExecutorConfig::latency`], by default `core::reconfig`'s). So a cold instance
//! serves `create_ms + warmup_ms` after its call starts, behind any calls before it; a tenant moved by a cold
//! create is without that instance from the switch-off until then. Make-before-break is per GPU: a tenant moved
//! to another GPU is switched off on the old one when that GPU's plan is applied. A plan applied while an earlier
//! one is still in progress supersedes its creates that have not started; destroys under way complete.
//!
//! ## Retraining and accuracy
//! A tenant with a [`RetrainingSpec`] has windows of `window_ms` from time zero. At each window start a
//! retraining is due with fresh data (progress 0) of `work_for_epochs(epochs)` 7g GPU-seconds, `epochs` from the
//! latest plan that gave the tenant a retraining instance (`GpuPlan::retraining_epochs`, else the spec's). Each of
//! its serving retraining instances adds `training_speed_on(gpu, profile) / slowdown` 7g GPU-seconds per second
//! (several add up). When the work is done, the accuracy becomes `accuracy_after(epochs)` and nothing is due until
//! the next window. A window that ends without a completed retraining drifts the accuracy once
//! (`Drift::after(accuracy, 1)`, floored), and an unfinished retraining is abandoned for the fresh one. A tenant
//! without retraining keeps accuracy 1. [`Executor::tenant_state`] gives accuracy, `retraining_due` and
//! `retraining_done_gpu_s` as the planner's `TenantInput` takes them.
//!
//! ## Interference
//! Whenever the set of instances with work on a GPU changes, the [`Interference`] model gives each a factor
//! (>= 1): inference latencies are multiplied by it, retraining speed divided. Batches in service keep theirs.
//!
//! ## Invariants
//! [`Executor::check_invariants`]: per GPU the core invariants on the live layout (valid for the model, no slice
//! used twice) and on the serving assignments (one role per instance; a tenant may have several inference
//! instances, on one GPU or several, as PARIS plans), the executor's instances equal the device's, and per tenant the accounting identity above. Debug
//! builds check all of them after every public call that changes state, except [`Executor::arrive`], which checks
//! the accounting of the arriving tenant only (its other effects are events that a later call checks).
//!
//! ## Performance
//! Event-driven with batches as the unit of work: one heap entry per batch or timeout, none per request; arrival
//! times live in per-instance `VecDeque`s whose capacity is reused; latency tables are computed per instance at
//! reconfiguration, not per batch. The hot path allocates nothing once queues have grown.
//!
//! ## Fluid serving
//! [`Executor::flow`] serves a tick's requests as counts instead (`fluid.rs`): each tenant's serving instances are
//! pooled into one server of their summed full-batch throughput, a FIFO backlog of evenly spaced chunks is served
//! at that rate, and a request is within SLO when its wait plus a full-batch latency meets it, corrected below
//! capacity by the stationary queueing tail of a Poisson stream (which the deterministic fluid lacks).
//! Everything else (plans, MIG latencies, drains, warm-ups, retraining, drift, interference) is the events above,
//! handled at tick ends. One instance at loads 0.3 to 1.1 agrees with request-by-request serving within 2 points
//! of SLO attainment (test 10.1), at a cost per tenant and tick instead of per batch: replay's `--executor fluid`
//! runs a day of a 100-GPU fleet (68 billion requests) in under a minute. Dispatch rules are not modelled (a
//! tenant's instances are pooled), so ELSA's placement of requests on heterogeneous instances is not either.
//!
//! ## Not modelled
//! Network and pre/post-processing time, per-request compute variance (latency is deterministic given the batch),
//! memory fit of a model on its instance (the planner's job), GPU failures, and cross-GPU make-before-break.
//!
//! [`ModelProfile::slo_capacity_on`]: tessera_core::model::ModelProfile::slo_capacity_on
//! [`BATCH_WINDOW_OF_SLO`]: tessera_core::serving::BATCH_WINDOW_OF_SLO
//! [`elsa_dispatch`]: elsa::elsa_dispatch
//! [`RetrainingSpec`]: tessera_core::tenant::RetrainingSpec

pub mod arrivals;
pub mod config;
mod cotrain;
pub mod elsa;
mod fluid;
pub mod interference;
pub mod metrics;
mod reconfigure;
mod retrain;
mod serve;
mod state;

use std::collections::{BTreeMap, BinaryHeap};

use serde::{Deserialize, Serialize};
use tessera_agent::backend::BackendError;
use tessera_core::GpuModel;
use tessera_core::goodput::GoodputLedger;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::invariants::{self, Violation};
use tessera_core::layout::{Layout, LayoutError};
use tessera_core::model::ModelProfile;
use tessera_core::plan::{Assignment, GpuPlan, Plan, Role};
use tessera_core::tenant::TenantSpec;

pub use arrivals::{Arrival, PoissonArrivals, poisson_arrivals};
pub use config::{BatchCap, BatchTimeout, Dispatch, ExecutorConfig, LateRequests, NoInstance};
pub use elsa::{ElsaPartition, elsa_dispatch};
pub use interference::{Interference, InterferenceError, NoInterference, Resident, TlbInterference};
pub use metrics::{
    BatchRecord, ExecutorReport, GpuMetrics, GpuReport, LatencyHistogram, ReconfigSummary, SharedMetrics,
    TenantMetrics, TenantReport, TenantState,
};

use crate::device::SimGpu;
use state::{AfterDrain, Event, EventKind, Gpu, Inst, NEVER, Phase, Retrain, Tenant, Work};

/// A tenant's position in an executor (tenants are numbered in id order). The hot path takes this, not the id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TenantIndex(pub u32);

/// A GPU's position in an executor (GPUs are numbered in id order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct GpuIndex(pub u32);

/// What the executor runs: model profiles, tenants and GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetSpec {
    /// Model profiles by name.
    pub models: BTreeMap<String, ModelProfile>,
    /// Tenants (any order; they are numbered by id).
    pub tenants: Vec<TenantSpec>,
    /// GPUs and their models; each starts in MIG mode without instances.
    pub gpus: BTreeMap<GpuId, GpuModel>,
}

/// Why the executor refused a call. Nothing is changed when it does, except where a variant says otherwise.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    /// A setting out of range.
    #[error("config.{field}: {reason}")]
    InvalidConfig {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A tenant refers to a model profile the fleet does not have.
    #[error("tenant {tenant}: unknown model {model:?}")]
    UnknownModel {
        /// The tenant.
        tenant: TenantId,
        /// The model name.
        model: String,
    },
    /// A tenant field out of range.
    #[error("tenant {tenant}: {field}: {reason}")]
    InvalidTenant {
        /// The tenant.
        tenant: TenantId,
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// Two tenants share an id.
    #[error("tenant {0} is listed twice")]
    DuplicateTenant(TenantId),
    /// No tenant has this id.
    #[error("unknown tenant {0}")]
    UnknownTenant(TenantId),
    /// No tenant has this index.
    #[error("no tenant has index {0} (the executor has {1})")]
    NoSuchTenantIndex(u32, usize),
    /// No GPU has this id.
    #[error("unknown GPU {0}")]
    UnknownGpu(GpuId),
    /// An arrival or advance to a time before the executor's (or not a number).
    #[error("time {at_ms} ms is before the executor's time {now_ms} ms")]
    TimeWentBack {
        /// The executor's time, ms.
        now_ms: f64,
        /// The time asked for, ms.
        at_ms: f64,
    },
    /// A plan breaks a core invariant (invalid layout, a shared instance, an unknown tenant, an old epoch).
    #[error("invalid plan: {0}")]
    InvalidPlan(#[from] Violation),
    /// The simulated device refused a MIG call: a bug in the executor (plans are validated first). The GPU may be
    /// left part-way through its reconfiguration.
    #[error("{gpu}: device error: {error}")]
    Device {
        /// The GPU.
        gpu: GpuId,
        /// The device's error.
        error: BackendError,
    },
    /// [`Executor::install_plan`] on a GPU that already has instances.
    #[error("{gpu}: install_plan needs a GPU without instances ({instances} present)")]
    NotEmpty {
        /// The GPU.
        gpu: GpuId,
        /// Instances on it.
        instances: usize,
    },
    /// The interference model failed; the reconfiguration that asked may be part-way through.
    #[error(transparent)]
    Interference(#[from] InterferenceError),
}

/// A broken executor invariant (see "Invariants" in the module doc): a bug.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvariantError {
    /// A core invariant on a live layout or the serving assignments.
    #[error(transparent)]
    Core(#[from] Violation),
    /// The device's own invariant.
    #[error("{gpu}: device layout: {error}")]
    Device {
        /// The GPU.
        gpu: GpuId,
        /// What is wrong.
        error: LayoutError,
    },
    /// The executor's instances differ from the device's.
    #[error("{gpu}: executor instances `{executor}` differ from the device's `{device}`")]
    InstancesDiffer {
        /// The GPU.
        gpu: GpuId,
        /// The executor's layout.
        executor: Layout,
        /// The device's layout.
        device: Layout,
    },
    /// A tenant's dispatch set holds an instance that does not serve its inference.
    #[error("{tenant}: its dispatch set holds an instance that does not serve its inference")]
    DispatchSet {
        /// The tenant.
        tenant: TenantId,
    },
    /// Requests are lost or invented.
    #[error(
        "{tenant}: {requests} requests arrived but {completed} completed + {dropped} dropped + {queued} queued + \
         {waiting} waiting"
    )]
    Accounting {
        /// The tenant.
        tenant: TenantId,
        /// Arrivals.
        requests: u64,
        /// Completions.
        completed: u64,
        /// Drops.
        dropped: u64,
        /// On instances.
        queued: u64,
        /// In the waiting queue.
        waiting: u64,
    },
}

/// The workload executor: see the [module documentation](self).
pub struct Executor {
    config: ExecutorConfig,
    now: f64,
    models: Vec<ModelProfile>,
    tenants: Vec<Tenant>,
    tenant_ix: BTreeMap<TenantId, usize>,
    gpus: Vec<Gpu>,
    gpu_ix: BTreeMap<GpuId, usize>,
    /// Instance slab; freed slots are reused.
    insts: Vec<Inst>,
    free_slots: Vec<u32>,
    heap: BinaryHeap<Event>,
    interference: Box<dyn Interference>,
    last_epoch: Option<u64>,
    batch_log: Vec<BatchRecord>,
    /// Reused buffers.
    elsa_partitions: Vec<ElsaPartition>,
    moved: Vec<f64>,
    factors: Vec<f64>,
    /// Fluid serving's per-tenant, per-step results of a batch of steps (see [`Executor::flow_steps`]).
    flow_deltas: Vec<Option<fluid::GpuDelta>>,
    /// Bumped whenever a dispatch set or an inference latency table changes: fluid serving's pooled capacities
    /// are valid while it stands still.
    serving_epoch: u64,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("now_ms", &self.now)
            .field("tenants", &self.tenants.len())
            .field("gpus", &self.gpus.len())
            .field("instances", &(self.insts.len() - self.free_slots.len()))
            .field("pending_events", &self.heap.len())
            .finish_non_exhaustive()
    }
}

impl Executor {
    /// An executor at time 0 over `fleet`, every GPU empty, every tenant at its initial accuracy with its first
    /// retraining due.
    pub fn new(
        config: ExecutorConfig,
        fleet: FleetSpec,
        interference: Box<dyn Interference>,
    ) -> Result<Executor, ExecError> {
        config.validate()?;
        let model_names: Vec<&String> = fleet.models.keys().collect();
        let mut specs = fleet.tenants;
        specs.sort_by(|a, b| a.id.cmp(&b.id));
        if let Some(w) = specs.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(ExecError::DuplicateTenant(w[0].id.clone()));
        }
        let mut tenants = Vec::with_capacity(specs.len());
        for spec in specs {
            let model = model_names
                .iter()
                .position(|m| **m == spec.model)
                .ok_or_else(|| ExecError::UnknownModel { tenant: spec.id.clone(), model: spec.model.clone() })?;
            tenants.push(Self::tenant(&config, spec, model)?);
        }
        let models: Vec<ModelProfile> = fleet.models.into_values().collect();
        let gpus: Vec<Gpu> = fleet
            .gpus
            .into_iter()
            .map(|(id, model)| Gpu {
                device: SimGpu::new(id.index, model).with_latency(config.latency),
                id,
                model,
                insts: Vec::new(),
                pending: Vec::new(),
                metrics: GpuMetrics::default(),
                sharing: Default::default(),
            })
            .collect();
        let mut heap = BinaryHeap::new();
        for (t, tenant) in tenants.iter().enumerate() {
            if let Some(r) = &tenant.retrain {
                heap.push(Event { at: r.window_end, kind: EventKind::Window, id: t as u32, generation: 0 });
            }
        }
        Ok(Executor {
            tenant_ix: tenants.iter().enumerate().map(|(i, t)| (t.spec.id.clone(), i)).collect(),
            gpu_ix: gpus.iter().enumerate().map(|(i, g)| (g.id.clone(), i)).collect(),
            config,
            now: 0.0,
            models,
            tenants,
            gpus,
            insts: Vec::new(),
            free_slots: Vec::new(),
            heap,
            interference,
            last_epoch: None,
            batch_log: Vec::new(),
            elsa_partitions: Vec::new(),
            moved: Vec::new(),
            factors: Vec::new(),
            flow_deltas: Vec::new(),
            serving_epoch: 0,
        })
    }

    fn tenant(config: &ExecutorConfig, spec: TenantSpec, model: usize) -> Result<Tenant, ExecError> {
        let bad =
            |field: &'static str, reason: String| ExecError::InvalidTenant { tenant: spec.id.clone(), field, reason };
        if !(spec.slo_ms.is_finite() && spec.slo_ms > 0.0) {
            return Err(bad("slo_ms", format!("must be > 0 (got {})", spec.slo_ms)));
        }
        let retrain = match &spec.retraining {
            None => None,
            Some(r) => {
                if r.window_ms == 0 {
                    return Err(bad("retraining.window_ms", "must be > 0".into()));
                }
                if !(r.epochs.is_finite() && r.epochs > 0.0) {
                    return Err(bad("retraining.epochs", format!("must be > 0 (got {})", r.epochs)));
                }
                if !(r.work_gpu_s.is_finite() && r.work_gpu_s >= 0.0) {
                    return Err(bad("retraining.work_gpu_s", format!("must be >= 0 (got {})", r.work_gpu_s)));
                }
                Some(Retrain {
                    spec: r.clone(),
                    epochs: r.epochs,
                    due: true,
                    done_gpu_s: 0.0,
                    progress_at: 0.0,
                    speed: 0.0,
                    running: 0,
                    completed_in_window: false,
                    generation: 0,
                    window_end: r.window_ms as f64,
                })
            }
        };
        let max_wait_ms = match config.no_instance {
            NoInstance::Drop => 0.0,
            NoInstance::Wait { max_wait_of_slo } => max_wait_of_slo * spec.slo_ms,
        };
        Ok(Tenant {
            model,
            timeout_ms: config.batch_timeout.ms(spec.slo_ms),
            max_wait_ms,
            serving: Vec::new(),
            waiting: Default::default(),
            wait_wake_at: NEVER,
            accuracy: spec.initial_accuracy(),
            retrain,
            metrics: TenantMetrics::default(),
            fluid: state::FluidTenant::default(),
            co_insts: 0,
            spec,
        })
    }

    /// The settings.
    pub fn config(&self) -> &ExecutorConfig {
        &self.config
    }

    /// Workload time, ms.
    pub fn now_ms(&self) -> f64 {
        self.now
    }

    /// The index of the tenant with this id.
    pub fn tenant_index(&self, id: &TenantId) -> Option<TenantIndex> {
        self.tenant_ix.get(id).map(|&i| TenantIndex(i as u32))
    }

    /// The tenants, in index order.
    pub fn tenant_ids(&self) -> impl Iterator<Item = (TenantIndex, &TenantId)> {
        self.tenants.iter().enumerate().map(|(i, t)| (TenantIndex(i as u32), &t.spec.id))
    }

    /// The index of the GPU with this id.
    pub fn gpu_index(&self, id: &GpuId) -> Option<GpuIndex> {
        self.gpu_ix.get(id).map(|&i| GpuIndex(i as u32))
    }

    /// The GPUs, in index order.
    pub fn gpu_ids(&self) -> impl Iterator<Item = (GpuIndex, &GpuId)> {
        self.gpus.iter().enumerate().map(|(i, g)| (GpuIndex(i as u32), &g.id))
    }

    fn gpu_of(&self, id: &GpuId) -> Result<usize, ExecError> {
        self.gpu_ix.get(id).copied().ok_or_else(|| ExecError::UnknownGpu(id.clone()))
    }

    fn check_time(&self, at_ms: f64) -> Result<(), ExecError> {
        if at_ms.is_nan() || at_ms < self.now {
            return Err(ExecError::TimeWentBack { now_ms: self.now, at_ms });
        }
        Ok(())
    }

    /// A request of `tenant` arrives at `at_ms` (not before the executor's time): everything due before it
    /// happens first, then it is dispatched.
    pub fn arrive(&mut self, tenant: TenantIndex, at_ms: f64) -> Result<(), ExecError> {
        let t = tenant.0 as usize;
        if t >= self.tenants.len() {
            return Err(ExecError::NoSuchTenantIndex(tenant.0, self.tenants.len()));
        }
        self.check_time(at_ms)?;
        self.run_until(at_ms)?;
        self.now = at_ms;
        self.tenants[t].metrics.ledger.record_arrivals(1);
        self.dispatch(t, at_ms);
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_accounting(t) {
            panic!("executor invariant broken at {} ms: {e}", self.now);
        }
        Ok(())
    }

    /// [`Executor::arrive`] for each arrival, in order (they must be sorted by time).
    pub fn arrive_all(&mut self, arrivals: &[Arrival]) -> Result<(), ExecError> {
        for a in arrivals {
            self.arrive(a.tenant, a.at_ms)?;
        }
        self.debug_check();
        Ok(())
    }

    /// Handles everything due up to `t_ms` and moves the clock there.
    pub fn advance_to(&mut self, t_ms: f64) -> Result<(), ExecError> {
        self.check_time(t_ms)?;
        self.run_until(t_ms)?;
        self.now = t_ms;
        self.co_settle_all();
        self.debug_check();
        Ok(())
    }

    /// Poisson arrivals of `(tenant, rate_rps)` over `[from_ms, to_ms)` from the configured seed
    /// ([`poisson_arrivals`]).
    pub fn poisson_arrivals(&self, rates: &[(TenantIndex, f64)], from_ms: f64, to_ms: f64) -> Vec<Arrival> {
        poisson_arrivals(self.config.seed, rates, from_ms, to_ms)
    }

    /// Applies `plan`'s target to `gpu` now (see "Reconfiguration" in the module doc). A plan that breaks a core
    /// invariant is refused before anything changes.
    pub fn apply_plan(&mut self, gpu: &GpuId, plan: &GpuPlan) -> Result<ReconfigSummary, ExecError> {
        let g = self.gpu_of(gpu)?;
        let summary = self.apply_gpu_plan(g, plan)?;
        self.debug_check();
        Ok(summary)
    }

    /// Applies every GPU target of a committed plan now. Its epoch must be newer than the last applied one, and
    /// every GPU target must be valid; otherwise nothing changes.
    pub fn apply(&mut self, plan: &Plan) -> Result<BTreeMap<GpuId, ReconfigSummary>, ExecError> {
        if let Some(previous) = self.last_epoch {
            invariants::plan_epochs_never_decrease(previous, plan.epoch)?;
        }
        for (gpu, target) in &plan.gpus {
            let g = self.gpu_of(gpu)?;
            self.validate_plan(g, target)?;
        }
        let mut out = BTreeMap::new();
        for (gpu, target) in &plan.gpus {
            out.insert(gpu.clone(), self.apply_plan(gpu, target)?);
        }
        self.last_epoch = Some(plan.epoch);
        Ok(out)
    }

    /// Creates `plan`'s instances on an empty `gpu` at once, warm and serving now: the state a run starts from
    /// (no MIG latency is charged).
    pub fn install_plan(&mut self, gpu: &GpuId, plan: &GpuPlan) -> Result<(), ExecError> {
        let g = self.gpu_of(gpu)?;
        self.install_gpu_plan(g, plan)?;
        self.debug_check();
        Ok(())
    }

    fn queued(&self, t: usize) -> u64 {
        self.insts
            .iter()
            .filter(|i| i.alive && i.work.is_some_and(|w| w.tenant as usize == t))
            .map(|i| i.queue.len() as u64)
            .sum::<u64>()
            + self.tenants[t].fluid.queued
    }

    /// Tenant `tenant`'s state now (retraining progress brought up to now).
    ///
    /// # Panics
    /// If the index is not one of the executor's.
    pub fn tenant_state(&self, tenant: TenantIndex) -> TenantState {
        let t = tenant.0 as usize;
        let x = &self.tenants[t];
        let (due, done, work, epochs) = match &x.retrain {
            Some(r) if r.due => (true, r.done_at(self.now), r.work_gpu_s(), r.epochs),
            Some(r) => (false, 0.0, r.work_gpu_s(), r.epochs),
            None => (false, 0.0, 0.0, 0.0),
        };
        TenantState {
            accuracy: x.accuracy,
            retraining_due: due,
            retraining_done_gpu_s: done,
            retraining_work_gpu_s: work,
            retraining_epochs: epochs,
            arrivals: x.metrics.ledger.requests,
            queued: self.queued(t),
            waiting: x.waiting.len() as u64,
            serving_instances: x.serving.len() as u32,
        }
    }

    /// Tenant `tenant`'s counters.
    ///
    /// # Panics
    /// If the index is not one of the executor's.
    pub fn tenant_metrics(&self, tenant: TenantIndex) -> &TenantMetrics {
        &self.tenants[tenant.0 as usize].metrics
    }

    /// GPU `gpu`'s counters.
    ///
    /// # Panics
    /// If the index is not one of the executor's.
    pub fn gpu_metrics(&self, gpu: GpuIndex) -> &GpuMetrics {
        &self.gpus[gpu.0 as usize].metrics
    }

    /// The simulated device of GPU `gpu` (its live instances and MIG-call timeline).
    ///
    /// # Panics
    /// If the index is not one of the executor's.
    pub fn device(&self, gpu: GpuIndex) -> &SimGpu {
        &self.gpus[gpu.0 as usize].device
    }

    /// GPU `gpu`'s live layout (what the planner's `GpuInput::layout` takes).
    ///
    /// # Panics
    /// If the index is not one of the executor's.
    pub fn gpu_layout(&self, gpu: GpuIndex) -> Layout {
        self.gpus[gpu.0 as usize].device.layout()
    }

    /// Who works on which live instance of GPU `gpu` (`GpuInput::assignments`): the work loaded or loading, or
    /// for an instance being switched over, the work it will load; none for one being destroyed.
    ///
    /// # Panics
    /// If the index is not one of the executor's.
    pub fn gpu_assignments(&self, gpu: GpuIndex) -> Vec<Assignment> {
        self.gpus[gpu.0 as usize]
            .insts
            .iter()
            .map(|&s| &self.insts[s as usize])
            .filter_map(|i| {
                let work = match (i.phase, i.after_drain) {
                    (Phase::Draining, AfterDrain::Load(next)) => next,
                    (Phase::Draining, _) | (_, AfterDrain::Destroy) => None,
                    _ => i.work,
                }?;
                Some((i.placement, work))
            })
            .flat_map(|(placement, work)| self.assignments_of(placement, work))
            .collect()
    }

    /// The assignments an instance's work stands for: two (inference and retraining) on a shared instance.
    fn assignments_of(&self, placement: tessera_core::Placement, work: Work) -> Vec<Assignment> {
        let tenant = &self.tenants[work.tenant as usize].spec.id;
        let one = |role| Assignment { placement, tenant: tenant.clone(), role, preinit: false };
        if work.co_trains() { vec![one(Role::Inference), one(Role::Retraining)] } else { vec![one(work.role)] }
    }

    /// The completed batches recorded so far ([`ExecutorConfig::record_batches`]).
    pub fn batches(&self) -> &[BatchRecord] {
        &self.batch_log
    }

    /// Takes the recorded batches, leaving none.
    pub fn take_batches(&mut self) -> Vec<BatchRecord> {
        std::mem::take(&mut self.batch_log)
    }

    /// Everything measured so far, ordered by id.
    pub fn report(&self) -> ExecutorReport {
        let mut total = GoodputLedger::default();
        let tenants = self
            .tenants
            .iter()
            .enumerate()
            .map(|(t, x)| {
                total += x.metrics.ledger;
                let state = self.tenant_state(TenantIndex(t as u32));
                (x.spec.id.clone(), TenantReport { state, metrics: x.metrics.clone() })
            })
            .collect();
        let gpus = self
            .gpus
            .iter()
            .enumerate()
            .map(|(g, x)| {
                let queued = x.insts.iter().map(|&s| self.insts[s as usize].queue.len() as u64).sum();
                let report = GpuReport {
                    layout: x.device.layout().to_string(),
                    assignments: self.gpu_assignments(GpuIndex(g as u32)),
                    queued,
                    metrics: x.metrics.clone(),
                };
                (x.id.clone(), report)
            })
            .collect();
        ExecutorReport { now_ms: self.now, total, tenants, gpus }
    }

    fn check_accounting(&self, t: usize) -> Result<(), InvariantError> {
        let x = &self.tenants[t];
        let l = &x.metrics.ledger;
        let (queued, waiting) = (self.queued(t), x.waiting.len() as u64);
        if l.requests != l.completed + l.dropped + queued + waiting {
            return Err(InvariantError::Accounting {
                tenant: x.spec.id.clone(),
                requests: l.requests,
                completed: l.completed,
                dropped: l.dropped,
                queued,
                waiting,
            });
        }
        Ok(())
    }

    /// Checks every invariant listed in the module doc.
    pub fn check_invariants(&self) -> Result<(), InvariantError> {
        for gpu in &self.gpus {
            let layout = gpu.device.layout();
            gpu.device.check_invariant().map_err(|error| InvariantError::Device { gpu: gpu.id.clone(), error })?;
            invariants::no_slice_used_twice(&gpu.id, &layout)?;
            invariants::layout_valid_for_model(&gpu.id, gpu.model, &layout)?;
            let ours: Layout = gpu.insts.iter().map(|&s| self.insts[s as usize].placement).collect();
            if ours != layout {
                return Err(InvariantError::InstancesDiffer { gpu: gpu.id.clone(), executor: ours, device: layout });
            }
            let serving: Vec<Assignment> = gpu
                .insts
                .iter()
                .map(|&s| &self.insts[s as usize])
                .filter(|i| i.phase == Phase::Serving)
                .filter_map(|i| Some((i.placement, i.work?)))
                .flat_map(|(placement, work)| self.assignments_of(placement, work))
                .collect();
            invariants::placement_serves_at_most_one_role(&gpu.id, &layout, &serving, gpu.sharing)?;
        }
        for t in 0..self.tenants.len() {
            self.check_accounting(t)?;
            let serves = |s: &u32| {
                let i = &self.insts[*s as usize];
                i.alive
                    && i.phase == Phase::Serving
                    && i.work.is_some_and(|w| w.tenant == t as u32 && w.role == Role::Inference)
            };
            if !self.tenants[t].serving.iter().all(serves) {
                return Err(InvariantError::DispatchSet { tenant: self.tenants[t].spec.id.clone() });
            }
        }
        Ok(())
    }

    /// In debug builds, panics on a broken invariant.
    fn debug_check(&self) {
        #[cfg(debug_assertions)]
        if let Err(e) = self.check_invariants() {
            panic!("executor invariant broken at {} ms: {e}", self.now);
        }
    }
}
