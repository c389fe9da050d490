//! The [`Workload`] trait: what runs on a node's GPU instances, as far as the reconcile loop needs it.
//!
//! The reconcile loop changes MIG layouts; the work on the instances (an inference server, a retraining job) is
//! somebody else's. Before it destroys an instance or gives it other work, the loop **drains** it through this
//! trait: stop routing requests to it, let the requests in flight finish, checkpoint retraining progress. After it
//! creates an instance (or reassigns one) it **loads** the planned work. The trait also carries workload time (wall
//! or virtual) and the metrics a heartbeat reports.
//!
//! Implementations: the simulator's tracker in `tessera-sim` (`node` module), and [`Bookkeeping`], the hook used
//! with real GPUs: it records what was loaded where and drains at once, because driving a serving stack is outside
//! the agent (the operator's serving system watches the agent's state).
//!
//! Work is keyed by placement, not by NVML instance id: ids are reused after a destroy, a placement names one live
//! instance on its GPU.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessera_core::ids::TenantId;
use tessera_core::jobs::TenantJobs;
use tessera_core::layout::Placement;
use tessera_core::reconfig::Work;

use crate::backend::GpuInstance;
use crate::load::LoadSignal;

/// Why a workload call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadError {
    /// The work could not be loaded onto the instance or drained from it.
    #[error("GPU {gpu}: {placement}: {message}")]
    Instance {
        /// The GPU index.
        gpu: u32,
        /// The instance.
        placement: Placement,
        /// What went wrong.
        message: String,
    },
    /// Workload time follows the wall clock; only a virtual clock can be advanced.
    #[error("workload time follows the wall clock here; only a node with a virtual clock can be advanced")]
    WallClock,
    /// The workload does not take requests from the agent (real serving systems receive their own).
    #[error("this node's workload does not take requests through the agent")]
    ArrivalsUnsupported,
    /// The workload counts its requests itself, or the agent was started without a load signal.
    #[error("this node's workload does not take load reports (it counts requests itself, or has no [load] section)")]
    LoadUnsupported,
    /// A request for a tenant the node does not serve and cannot queue.
    #[error("unknown tenant {0}")]
    UnknownTenant(TenantId),
}

/// A tenant's counters on one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TenantCounters {
    /// Requests that arrived since the agent started.
    pub arrivals: u64,
    /// Requests served within their SLO.
    pub served_within_slo: u64,
    /// Requests dropped (no serving instance).
    pub dropped: u64,
    /// Requests queued on its instances now.
    pub queued: u64,
    /// Retraining work done, 7g GPU-seconds, checkpoints included.
    pub retraining_done_gpu_s: f64,
    /// Inference instances serving it now.
    pub serving_instances: u32,
    /// Retraining instances working for it now.
    pub retraining_instances: u32,
    /// The accuracy of the model version serving it, where the workload knows it (0: unknown, the coordinator
    /// keeps the last value it had).
    pub accuracy: f64,
    /// Retrainings completed (the serving model's version), where the workload knows it (0: unknown).
    pub model_version: u64,
    /// Whether a retraining is due, where the workload knows it.
    pub retraining_due: Option<bool>,
    /// Measured arrival rates (requests per second) of the planner slots completed since the last report, oldest
    /// first, where the workload measures them.
    pub slot_rates: Vec<f64>,
}

/// The node's workload metrics at one workload time.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkloadMetrics {
    /// Workload time of the reading, ms.
    pub now_ms: u64,
    /// Per tenant.
    pub tenants: BTreeMap<TenantId, TenantCounters>,
}

/// Where a supervised job of a tenant listens, and whether requests may go there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// The tenant.
    pub tenant: TenantId,
    /// Its role on the instance.
    pub role: tessera_core::plan::Role,
    /// The port on the node the job listens on.
    pub port: u16,
    /// The job's state.
    pub state: EndpointState,
}

/// A supervised job's state, as routes need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndpointState {
    /// Started, not ready yet (warming up, or restarting after a crash): no request goes there.
    Starting,
    /// Ready: requests may go there.
    Ready,
    /// Being drained: no new request goes there; those in flight finish.
    Draining,
}

impl EndpointState {
    /// The name used on the wire and in tables.
    pub const fn name(self) -> &'static str {
        match self {
            EndpointState::Starting => "starting",
            EndpointState::Ready => "ready",
            EndpointState::Draining => "draining",
        }
    }
}

/// What runs on the instances: see the [module documentation](self). Calls for one GPU come from its reconcile
/// pass, one at a time; calls for different GPUs may overlap.
pub trait Workload: Send + Sync {
    /// The work loaded (or loading) on each instance of `gpu`, by placement. Instances not listed run nothing.
    fn loaded(&self, gpu: u32) -> BTreeMap<Placement, Vec<Work>>;

    /// Loads `work` onto a live instance (after its creation, or after a drain when it is reassigned). Requests are
    /// routed to it once it is warm ([`Workload::ready`]).
    fn load(&self, gpu: u32, instance: &GpuInstance, work: &[Work]) -> Result<(), WorkloadError>;

    /// Drains an instance: stops routing requests to it, waits for those in flight, checkpoints retraining
    /// progress. Afterwards it runs nothing and may be destroyed. Draining an instance that runs nothing is a no-op.
    fn drain(&self, gpu: u32, instance: &GpuInstance) -> Result<(), WorkloadError>;

    /// Whether the work loaded on `placement` is warm and serving.
    fn ready(&self, gpu: u32, placement: Placement) -> bool;

    /// The jobs of the tenants this node's targets assign (`tessera_core::jobs`), whenever they change and once at
    /// start. A workload that runs jobs (the supervisor) starts them from these; others ignore them (the default).
    fn set_jobs(&self, jobs: &BTreeMap<TenantId, TenantJobs>) {
        let _ = jobs;
    }

    /// Whether any of `tenant`'s work still runs here (its jobs are kept until it stops).
    fn runs_tenant(&self, tenant: &TenantId) -> bool {
        let _ = tenant;
        false
    }

    /// Whether work that moves to another instance of the node waits there until it is ready before its old
    /// instance is drained, for every move and not only those the plan marks pre-initialised (the supervisor: its
    /// jobs' readiness is real). False by default.
    fn make_before_break(&self) -> bool {
        false
    }

    /// The endpoints the work on `gpu` serves at, by placement (a supervised `serve` job's port and state); empty
    /// where the workload does not run jobs (the default).
    fn endpoints(&self, gpu: u32) -> BTreeMap<Placement, Vec<Endpoint>> {
        let _ = gpu;
        BTreeMap::new()
    }

    /// Forgets instances of `gpu` that no longer exist (destroyed behind the agent's back, or by a GPU reset), so
    /// their work is not reported as running.
    fn retain(&self, gpu: u32, live: &[Placement]);

    /// The metrics now.
    fn metrics(&self) -> WorkloadMetrics;

    /// Workload time now, ms.
    fn now_ms(&self) -> u64;

    /// Moves virtual workload time to `to_ms` (no-op if not later) and returns the time afterwards.
    /// [`WorkloadError::WallClock`] where workload time is the wall clock.
    fn advance_to(&self, to_ms: u64) -> Result<u64, WorkloadError> {
        let _ = to_ms;
        Err(WorkloadError::WallClock)
    }

    /// Delivers `count` requests of `tenant` now. [`WorkloadError::ArrivalsUnsupported`] where the workload takes
    /// its requests elsewhere.
    fn arrive(&self, tenant: &TenantId, count: u64) -> Result<(), WorkloadError> {
        let _ = (tenant, count);
        Err(WorkloadError::ArrivalsUnsupported)
    }

    /// Takes a serving stack's counter: `requests_total` requests of `tenant` since `source` started (see
    /// `load.rs`). [`WorkloadError::LoadUnsupported`] where the workload counts requests itself.
    fn report_load(&self, source: &str, tenant: &TenantId, requests_total: u64) -> Result<(), WorkloadError> {
        let _ = (source, tenant, requests_total);
        Err(WorkloadError::LoadUnsupported)
    }
}

/// The workload hook for real GPUs: records which work the agent loaded on which instance, drains at once (the
/// serving stack outside the agent follows the agent's state), is ready as soon as it is loaded, and keeps wall
/// time. Its request counters (`arrivals`) are those of the serving stack, from a [`LoadSignal`] (scraped, or
/// reported with `ReportLoad`: see `load.rs`); without one it reports none.
#[derive(Debug)]
pub struct Bookkeeping {
    loaded: Mutex<BTreeMap<(u32, Placement), Vec<Work>>>,
    origin: Instant,
    load: Option<Arc<LoadSignal>>,
}

impl Default for Bookkeeping {
    fn default() -> Self {
        Bookkeeping { loaded: Mutex::new(BTreeMap::new()), origin: Instant::now(), load: None }
    }
}

impl Bookkeeping {
    /// A hook whose request counters come from `load`.
    pub fn with_load(load: Arc<LoadSignal>) -> Bookkeeping {
        Bookkeeping { load: Some(load), ..Bookkeeping::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(u32, Placement), Vec<Work>>> {
        self.loaded.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Workload for Bookkeeping {
    fn loaded(&self, gpu: u32) -> BTreeMap<Placement, Vec<Work>> {
        self.lock().iter().filter(|((g, _), _)| *g == gpu).map(|((_, p), w)| (*p, w.clone())).collect()
    }

    fn load(&self, gpu: u32, instance: &GpuInstance, work: &[Work]) -> Result<(), WorkloadError> {
        if work.is_empty() {
            self.lock().remove(&(gpu, instance.placement));
        } else {
            self.lock().insert((gpu, instance.placement), work.to_vec());
        }
        Ok(())
    }

    fn drain(&self, gpu: u32, instance: &GpuInstance) -> Result<(), WorkloadError> {
        self.lock().remove(&(gpu, instance.placement));
        Ok(())
    }

    fn ready(&self, gpu: u32, placement: Placement) -> bool {
        self.lock().contains_key(&(gpu, placement))
    }

    fn retain(&self, gpu: u32, live: &[Placement]) {
        self.lock().retain(|(g, p), _| *g != gpu || live.contains(p));
    }

    fn metrics(&self) -> WorkloadMetrics {
        let mut tenants: BTreeMap<TenantId, TenantCounters> = BTreeMap::new();
        for works in self.lock().values() {
            for w in works {
                let c = tenants.entry(w.tenant.clone()).or_default();
                match w.role {
                    tessera_core::plan::Role::Inference => c.serving_instances += 1,
                    tessera_core::plan::Role::Retraining => c.retraining_instances += 1,
                }
            }
        }
        add_load_arrivals(self.load.as_deref(), &mut tenants);
        WorkloadMetrics { now_ms: self.now_ms(), tenants }
    }

    fn now_ms(&self) -> u64 {
        wall_ms_since(self.origin)
    }

    fn report_load(&self, source: &str, tenant: &TenantId, requests_total: u64) -> Result<(), WorkloadError> {
        report_into(self.load.as_deref(), source, tenant, requests_total)
    }
}

/// Sets each tenant's `arrivals` to its serving stack's counter, where the workload has a load signal (the
/// workloads of real nodes: [`Bookkeeping`] and the supervisor).
pub(crate) fn add_load_arrivals(load: Option<&LoadSignal>, tenants: &mut BTreeMap<TenantId, TenantCounters>) {
    for (tenant, n) in load.map(LoadSignal::arrivals).unwrap_or_default() {
        tenants.entry(tenant).or_default().arrivals = n;
    }
}

/// Takes a `ReportLoad` counter into `load`; [`WorkloadError::LoadUnsupported`] without one.
pub(crate) fn report_into(
    load: Option<&LoadSignal>,
    source: &str,
    tenant: &TenantId,
    requests_total: u64,
) -> Result<(), WorkloadError> {
    let load = load.ok_or(WorkloadError::LoadUnsupported)?;
    load.observe(tenant, &format!("report:{source}"), requests_total as f64);
    Ok(())
}

/// Wall-clock workload time: ms since `origin`.
pub(crate) fn wall_ms_since(origin: Instant) -> u64 {
    u64::try_from(origin.elapsed().as_millis()).unwrap_or(u64::MAX)
}
