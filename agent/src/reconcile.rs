//! The reconcile loop's pass: desired targets (epoch-numbered, persisted) against what the GPUs and the workload
//! report, turned into MIG calls and workload drains and loads.
//!
//! ## One pass over a GPU ([`Reconciler::reconcile_gpu`])
//! 1. Read the GPU (model, MIG mode) and its instances; enable MIG mode if the target needs instances and it is off
//!    (a change that waits for a GPU reset is reported as an error: resetting is an operator's act).
//! 2. Read the work loaded on each instance from the [`Workload`]; forget work on instances that are gone.
//! 3. [`diff_assigned`] (core) gives the ordered steps from the observed layout and work to the target: instances
//!    in both layouts are never touched (a changed tenant or role is a `Reassign`, no MIG call); creates on free
//!    slices come first (make before break); every intermediate layout is valid.
//! 4. Execute the steps one by one: **create** the instance, then load its planned work; **destroy**: drain the
//!    instance's work (stop routing, let in-flight requests finish, checkpoint retraining), then destroy it;
//!    **reassign**: drain, then load the new work. After each step the GPU is read again and the observed state is
//!    published ([`Reconciler::status`], the step observer).
//! 5. **Pre-initialisation**: work that moves to an instance the plan marks `preinit` is not taken away from its old
//!    instance until the new one is warm ([`Workload::ready`]); until then the pass stops for this GPU and reports it
//!    waiting, and the next pass continues. (A marked instance whose slices are not free yet is simply created when
//!    they are, like any other.)
//!
//! ## Backends that take whole targets
//! A backend whose [`MigBackend::applies_whole_targets`] is true (the simulator's workload executor, which times a
//! reconfiguration's drains, creates and warm-ups in virtual time, where no call can wait for them) is handed each
//! GPU's target once, whole, instead of steps 3-5; the GPU counts as converged once its backend has taken the
//! target, and its observed instances and work show the transition as it happens. Epochs, validation, the state
//! file and the status are the same for every backend.
//!
//! ## Crash safety
//! A pass keeps nothing between steps that is not in the GPU, the workload or the state file: every pass
//! recomputes the diff from what it reads. So a pass interrupted at any point (the agent killed, a call failing,
//! a reply lost after the driver acted) leaves a valid GPU, and the next pass, by this agent or a restarted one,
//! continues from what is there: an instance created but not loaded gets a `Reassign` that loads it; one drained but
//! not destroyed is destroyed; nothing is done twice. Tests inject a failure at every step.
//!
//! ## Epochs
//! [`Reconciler::accept`] takes a plan epoch and per-GPU targets. An epoch older than the newest accepted is
//! refused ([`Acceptance::Stale`]); the same epoch with the same targets is a no-op (a retried push); a newer one
//! replaces the targets of the GPUs it names (others keep theirs, as `core::plan::Plan` says) and is written to the
//! state file before it is acknowledged, so a restarted agent still refuses older epochs.
//!
//! A held epoch the coordinators say was never committed (beyond their newest plan epoch: a forged push, or a
//! cluster whose state was reset) cannot freeze the node: [`Reconciler::accept_within`] then takes the push the
//! agent has checked against them, and drops the targets of that uncommitted epoch.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tessera_core::catalog::GpuModel;
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::invariants::{self, Violation};
use tessera_core::jobs::TenantJobs;
use tessera_core::layout::{Layout, Placement};
use tessera_core::plan::{Assignment, GpuPlan, Role};
use tessera_core::reconfig::{DiffError, ReconfigLatency, StepAction, Work, diff_assigned};
use tracing::field::Empty;

use crate::backend::{BackendError, GpuInfo, GpuInstance, MigBackend};
use crate::state::{DesiredState, GpuTarget, StateError, StateFile};
use crate::workload::{Workload, WorkloadError, WorkloadMetrics};

/// How long a destroy waits for an instance's processes to go after its drain.
pub const IN_USE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long moves wait for their new instance to be ready before the old one is drained anyway.
pub const MAKE_BEFORE_BREAK_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Why the reconciler refused a target or a pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// A plan epoch of 0 (0 means "none").
    #[error("epoch 0 is not a plan epoch (epochs start at 1)")]
    ZeroEpoch,
    /// The same epoch arrived again with different targets.
    #[error(
        "epoch {epoch} was already accepted with different targets for GPU {gpu}; a changed plan needs a new epoch"
    )]
    EpochConflict {
        /// The epoch.
        epoch: u64,
        /// The first GPU whose target differs.
        gpu: u32,
    },
    /// A target names a GPU the node does not have.
    #[error("GPU {gpu}: no such GPU on this node (it has {count})")]
    UnknownGpu {
        /// The index.
        gpu: u32,
        /// How many GPUs the node has.
        count: usize,
    },
    /// A target for a GPU whose model the catalog does not know (or without MIG).
    #[error("GPU {gpu}: {name} is not a MIG GPU the catalog knows; it cannot take a layout")]
    NotMigCapable {
        /// The index.
        gpu: u32,
        /// The product name.
        name: String,
    },
    /// A target breaks a core invariant (invalid layout, shared instance, several inference instances).
    #[error("GPU {gpu}: invalid target: {violation}")]
    InvalidTarget {
        /// The index.
        gpu: u32,
        /// What is wrong.
        violation: Violation,
    },
    /// MIG mode is off and enabling it waits for a GPU reset.
    #[error("GPU {gpu}: MIG mode is enabled only after a GPU reset (an operator must reset it)")]
    MigPending {
        /// The index.
        gpu: u32,
    },
    /// A backend call failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// A workload call failed.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The diff could not be computed (the GPU reported a layout that breaks its model's rules).
    #[error("GPU {gpu}: {error}")]
    Diff {
        /// The index.
        gpu: u32,
        /// Why.
        error: DiffError,
    },
    /// After every step the GPU still differs from its target: something else changed it during the pass.
    #[error("GPU {gpu}: after the pass the GPU has `{observed}`, not the target `{target}`; changed concurrently?")]
    Diverged {
        /// The index.
        gpu: u32,
        /// What it has.
        observed: Layout,
        /// What it should have.
        target: Layout,
    },
    /// An instance still has processes (or the driver says it is in use) after its work was drained.
    #[error(
        "GPU {gpu}: {placement} still has processes {pids:?} after its drain ({waited_ms} ms); not destroyed, \
         the next pass tries again (stop them, or fix the job's drain and stop actions)"
    )]
    StillInUse {
        /// The index.
        gpu: u32,
        /// The instance.
        placement: Placement,
        /// The processes the driver lists on it.
        pids: Vec<u32>,
        /// How long the pass waited.
        waited_ms: u64,
    },
    /// The state file could not be written (the target was not accepted).
    #[error(transparent)]
    State(#[from] StateError),
}

/// What [`Reconciler::accept`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Acceptance {
    /// A newer epoch: its targets are persisted and will be reconciled.
    Accepted,
    /// The accepted epoch again with the same targets: nothing changed.
    AlreadyAccepted,
    /// An older epoch: refused, nothing changed.
    Stale {
        /// The agent's epoch.
        current: u64,
    },
}

/// An instance as observed, with its work.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObservedInstance {
    /// NVML's view.
    pub instance: GpuInstance,
    /// The work loaded on it.
    pub work: Vec<Work>,
    /// Whether its work is warm and serving.
    pub serving: bool,
    /// Where supervised jobs on it listen, with their state (empty without a supervisor).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<crate::workload::Endpoint>,
}

/// One GPU as last observed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    /// The GPU.
    pub info: GpuInfo,
    /// Its instances, ordered by placement.
    pub instances: Vec<ObservedInstance>,
    /// Its target, if a plan named it.
    pub target: Option<GpuTarget>,
    /// Whether the instances and their work equal the target (true when there is no target).
    pub converged: bool,
    /// The preinitialised instance whose warm-up the GPU's reconfiguration waits for.
    pub waiting_for: Option<Placement>,
    /// The last pass's error on this GPU.
    pub last_error: Option<String>,
}

/// The node as last observed: what GetState and heartbeats report.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// The newest epoch accepted.
    pub epoch: u64,
    /// The newest epoch whose targets were all observed in place.
    pub applied_epoch: u64,
    /// Per GPU index.
    pub gpus: BTreeMap<u32, GpuStatus>,
    /// Reconcile steps executed since the reconciler was made.
    pub steps: u64,
    /// The workload's metrics.
    pub metrics: WorkloadMetrics,
}

/// How one GPU's pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuOutcome {
    /// No target: the GPU is observed and left alone.
    Untargeted,
    /// Instances and work equal the target.
    Converged,
    /// Stopped until the preinitialised instance at this placement is warm.
    Waiting(Placement),
}

/// How a pass over every GPU ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Every targeted GPU converged.
    pub converged: bool,
    /// Some GPU waits for a warm-up: run another pass soon.
    pub waiting: bool,
    /// GPUs whose pass failed, with the error.
    pub errors: Vec<(u32, String)>,
    /// Steps executed in this pass.
    pub steps: u64,
}

/// Called after every step with the GPU and its observed state.
pub type StepObserver = Box<dyn Fn(u32, &GpuStatus) + Send + Sync>;

/// Desired against observed, for one node: see the [module documentation](self).
pub struct Reconciler {
    node: NodeId,
    backend: Arc<dyn MigBackend>,
    workload: Arc<dyn Workload>,
    file: StateFile,
    desired: Mutex<DesiredState>,
    status: Mutex<NodeStatus>,
    steps: AtomicU64,
    /// Serialises passes (the backend wants one caller per GPU).
    pass: Mutex<()>,
    /// For a backend that takes whole targets: per GPU, the epoch of the target it was handed.
    handed: Mutex<BTreeMap<u32, u64>>,
    /// Per GPU: the trace context of the push that brought its target (epoch, context), until the GPU converges;
    /// its passes are `reconcile` spans in that trace.
    traces: Mutex<BTreeMap<u32, (u64, opentelemetry::Context)>>,
    observer: Option<StepObserver>,
    /// Per GPU and target layout: when make-before-break first waited for it.
    mbb_waits: Mutex<BTreeMap<(u32, String), std::time::Instant>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Reconciler {
    /// A reconciler for node `node` over `backend` and `workload`, with its state file in `data_dir` (read now: a
    /// restarted agent resumes its last target and epoch).
    pub fn new(
        node: NodeId,
        backend: Arc<dyn MigBackend>,
        workload: Arc<dyn Workload>,
        data_dir: &std::path::Path,
    ) -> Result<Reconciler, ReconcileError> {
        let (file, desired) = StateFile::open(data_dir)?;
        workload.set_jobs(&desired.jobs);
        let status = NodeStatus { epoch: desired.epoch, ..NodeStatus::default() };
        Ok(Reconciler {
            node,
            backend,
            workload,
            file,
            desired: Mutex::new(desired),
            status: Mutex::new(status),
            steps: AtomicU64::new(0),
            pass: Mutex::new(()),
            handed: Mutex::new(BTreeMap::new()),
            traces: Mutex::new(BTreeMap::new()),
            observer: None,
            mbb_waits: Mutex::new(BTreeMap::new()),
        })
    }

    /// The same reconciler, calling `observer` after every step.
    pub fn with_observer(mut self, observer: StepObserver) -> Reconciler {
        self.observer = Some(observer);
        self
    }

    /// The node's id.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn MigBackend> {
        &self.backend
    }

    /// The workload.
    pub fn workload(&self) -> &Arc<dyn Workload> {
        &self.workload
    }

    /// The accepted epoch and targets.
    pub fn desired(&self) -> DesiredState {
        lock(&self.desired).clone()
    }

    /// The newest epoch whose targets were all observed in place.
    pub fn applied_epoch(&self) -> u64 {
        lock(&self.status).applied_epoch
    }

    /// The node as last observed, with the workload's metrics now.
    pub fn status(&self) -> NodeStatus {
        let mut s = lock(&self.status).clone();
        // Endpoints change between passes (a job gets ready, crashes, restarts): read them now.
        for (gpu, g) in &mut s.gpus {
            let mut endpoints = self.workload.endpoints(*gpu);
            for i in &mut g.instances {
                i.endpoints = endpoints.remove(&i.instance.placement).unwrap_or_default();
            }
        }
        s.epoch = lock(&self.desired).epoch;
        s.steps = self.steps.load(Ordering::SeqCst);
        s.metrics = self.workload.metrics();
        s
    }

    /// Takes the targets of plan `epoch` (see "Epochs" in the module doc). Targets are checked against the GPUs'
    /// models and core's plan invariants before anything changes.
    pub fn accept(&self, epoch: u64, targets: BTreeMap<u32, GpuPlan>) -> Result<Acceptance, ReconcileError> {
        self.accept_with_jobs(epoch, targets, BTreeMap::new())
    }

    /// [`Reconciler::accept`] with the jobs of the tenants the targets assign (those that have jobs): for every
    /// tenant the targets assign, its jobs become these (none if absent), are persisted with the targets and handed
    /// to the workload ([`Workload::set_jobs`]).
    pub fn accept_with_jobs(
        &self,
        epoch: u64,
        targets: BTreeMap<u32, GpuPlan>,
        jobs: BTreeMap<TenantId, TenantJobs>,
    ) -> Result<Acceptance, ReconcileError> {
        self.accept_within(epoch, targets, jobs, None)
    }

    /// [`Reconciler::accept_with_jobs`] for a push checked against the coordinators, whose newest committed plan
    /// epoch is `committed`: if the epoch held is beyond it, it was never committed, so it does not make this push
    /// stale, and its targets are dropped (see "Epochs" in the module doc).
    pub fn accept_within(
        &self,
        epoch: u64,
        targets: BTreeMap<u32, GpuPlan>,
        jobs: BTreeMap<TenantId, TenantJobs>,
        committed: Option<u64>,
    ) -> Result<Acceptance, ReconcileError> {
        if epoch == 0 {
            return Err(ReconcileError::ZeroEpoch);
        }
        let mut desired = lock(&self.desired);
        let uncommitted = committed.filter(|c| desired.epoch > *c && epoch <= *c);
        if let Some(committed) = uncommitted {
            tracing::warn!(node = %self.node, held = desired.epoch, committed, epoch,
                "the epoch held was never committed (beyond the coordinators' newest): taking this push instead");
        }
        if uncommitted.is_none() && epoch < desired.epoch {
            return Ok(Acceptance::Stale { current: desired.epoch });
        }
        if epoch == desired.epoch {
            for (gpu, plan) in &targets {
                if desired.gpus.get(gpu).is_none_or(|t| t.epoch != epoch || &t.plan != plan) {
                    return Err(ReconcileError::EpochConflict { epoch, gpu: *gpu });
                }
            }
            return Ok(Acceptance::AlreadyAccepted);
        }
        let gpus = self.backend.gpus()?;
        for (gpu, plan) in &targets {
            let info = gpus
                .iter()
                .find(|g| g.index == *gpu)
                .ok_or(ReconcileError::UnknownGpu { gpu: *gpu, count: gpus.len() })?;
            let model = mig_model(info)?;
            invariants::check_gpu_plan(&self.gpu_id(*gpu), model, plan)
                .map_err(|violation| ReconcileError::InvalidTarget { gpu: *gpu, violation })?;
        }
        let mut next = desired.clone();
        if let Some(committed) = uncommitted {
            next.gpus.retain(|_, t| t.epoch <= committed);
        }
        next.epoch = epoch;
        let assigned: Vec<TenantId> =
            targets.values().flat_map(|p| p.assignments.iter().map(|a| a.tenant.clone())).collect();
        for (gpu, plan) in targets {
            next.gpus.insert(gpu, GpuTarget { epoch, plan });
        }
        for tenant in assigned {
            match jobs.get(&tenant) {
                Some(j) if !j.is_empty() => next.jobs.insert(tenant, j.clone()),
                _ => next.jobs.remove(&tenant),
            };
        }
        // Jobs of tenants no target assigns any more are kept only while their work may still run somewhere here.
        let still: std::collections::BTreeSet<&TenantId> =
            next.gpus.values().flat_map(|t| t.plan.assignments.iter().map(|a| &a.tenant)).collect();
        next.jobs.retain(|t, _| still.contains(t) || self.workload.runs_tenant(t));
        self.file.save(&next)?;
        self.workload.set_jobs(&next.jobs);
        *desired = next;
        Ok(Acceptance::Accepted)
    }

    /// Continues trace `cx` (the push that brought epoch `epoch`) in the passes that realise `gpus`' targets of that
    /// epoch: each pass is a `reconcile` span, child of `cx`, with one span per MIG step.
    pub fn follow_trace(&self, epoch: u64, gpus: impl IntoIterator<Item = u32>, cx: &opentelemetry::Context) {
        use opentelemetry::trace::TraceContextExt as _;
        if !cx.span().span_context().is_valid() {
            return;
        }
        let mut traces = lock(&self.traces);
        for gpu in gpus {
            traces.insert(gpu, (epoch, cx.clone()));
        }
    }

    /// Drops the trace contexts [`Reconciler::follow_trace`] kept for epoch `epoch` (its push was not accepted).
    pub fn forget_trace(&self, epoch: u64) {
        lock(&self.traces).retain(|_, (e, _)| *e != epoch);
    }

    /// How many GPUs' passes currently continue a push's trace.
    pub fn traced_gpus(&self) -> usize {
        lock(&self.traces).len()
    }

    fn gpu_id(&self, gpu: u32) -> GpuId {
        GpuId::new(self.node.clone(), gpu)
    }

    /// One pass over every GPU of the node. Errors of one GPU are recorded in its status and do not stop the others;
    /// an error listing the GPUs is returned as is.
    pub fn reconcile(&self) -> Result<PassReport, ReconcileError> {
        let _pass = lock(&self.pass);
        let snapshot = self.desired();
        let steps_before = self.steps.load(Ordering::SeqCst);
        let gpus = self.backend.gpus()?;
        let mut report = PassReport { converged: true, ..PassReport::default() };
        for info in &gpus {
            let target = snapshot.gpus.get(&info.index);
            match self.reconcile_gpu_with(info, target) {
                Ok(GpuOutcome::Converged | GpuOutcome::Untargeted) => {}
                Ok(GpuOutcome::Waiting(_)) => {
                    report.converged = false;
                    report.waiting = true;
                }
                Err(e) => {
                    report.converged = false;
                    report.errors.push((info.index, e.to_string()));
                    let mut status = lock(&self.status);
                    if let Some(g) = status.gpus.get_mut(&info.index) {
                        g.last_error = Some(e.to_string());
                        g.converged = false;
                    } else {
                        status.gpus.insert(
                            info.index,
                            GpuStatus {
                                info: info.clone(),
                                instances: Vec::new(),
                                target: target.cloned(),
                                converged: false,
                                waiting_for: None,
                                last_error: Some(e.to_string()),
                            },
                        );
                    }
                }
            }
        }
        let mut status = lock(&self.status);
        status.gpus.retain(|i, _| gpus.iter().any(|g| g.index == *i));
        if report.converged && snapshot.epoch > status.applied_epoch {
            status.applied_epoch = snapshot.epoch;
        }
        report.steps = self.steps.load(Ordering::SeqCst) - steps_before;
        Ok(report)
    }

    /// One pass over GPU `gpu` towards its current target.
    pub fn reconcile_gpu(&self, gpu: u32) -> Result<GpuOutcome, ReconcileError> {
        let _pass = lock(&self.pass);
        let gpus = self.backend.gpus()?;
        let info = gpus.iter().find(|g| g.index == gpu).ok_or(ReconcileError::UnknownGpu { gpu, count: gpus.len() })?;
        let target = self.desired().gpus.get(&gpu).cloned();
        self.reconcile_gpu_with(info, target.as_ref())
    }

    fn reconcile_gpu_with(&self, info: &GpuInfo, target: Option<&GpuTarget>) -> Result<GpuOutcome, ReconcileError> {
        let gpu = info.index;
        let Some(target) = target else {
            self.observe(info, None, None)?;
            return Ok(GpuOutcome::Untargeted);
        };
        // A pass for a traced push is a span in its trace; an untraced pass gets a (root) span once it has steps.
        let cx = lock(&self.traces).get(&gpu).filter(|(e, _)| *e == target.epoch).map(|(_, cx)| cx.clone());
        let mut span = match cx {
            Some(cx) => self.reconcile_span(gpu, target.epoch, Some(cx)),
            None => tracing::Span::none(),
        };
        let steps_before = self.steps.load(Ordering::SeqCst);
        let result = self.reconcile_target(info, target, &mut span);
        // What this pass did: a pass that waits, or fails, part-way leaves the rest to the next.
        span.record("tessera.reconfiguration.steps", (self.steps.load(Ordering::SeqCst) - steps_before) as i64);
        let label = match &result {
            Ok(GpuOutcome::Untargeted) => "untargeted",
            Ok(GpuOutcome::Converged) => "converged",
            Ok(GpuOutcome::Waiting(_)) => "waiting",
            Err(_) => "error",
        };
        span.record("tessera.reconcile.outcome", label);
        tessera_telemetry::record_status(&span, &result);
        if matches!(result, Ok(GpuOutcome::Converged)) {
            lock(&self.traces).remove(&gpu);
            // A later wait for the same target starts its clock afresh.
            lock(&self.mbb_waits).retain(|k, _| k.0 != gpu);
        }
        result
    }

    /// The `reconcile` span of one pass over `gpu` towards epoch `epoch`'s target, child of `cx` (a root without).
    fn reconcile_span(&self, gpu: u32, epoch: u64, cx: Option<opentelemetry::Context>) -> tracing::Span {
        let span = tracing::info_span!(
            parent: None,
            "reconcile",
            tessera.node = %self.node,
            tessera.gpu = %self.gpu_id(gpu),
            tessera.plan.epoch = i64::try_from(epoch).unwrap_or(i64::MAX),
            tessera.layout.from = Empty,
            tessera.layout.to = Empty,
            tessera.reconfiguration.planned = Empty,
            tessera.reconfiguration.steps = Empty,
            tessera.reconcile.outcome = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        );
        if let Some(cx) = cx {
            use tracing_opentelemetry::OpenTelemetrySpanExt as _;
            let _ = span.set_parent(cx);
        }
        span
    }

    /// Runs `action` as MIG step `name` on `gpu` (a span under `pass`, with its status), creating `pass` as a root
    /// span first when the pass has none.
    fn mig_step<T>(
        &self,
        pass: &mut tracing::Span,
        epoch: u64,
        (name, gpu, placement): (&'static str, u32, Option<Placement>),
        tenants: usize,
        action: impl FnOnce() -> Result<T, ReconcileError>,
    ) -> Result<T, ReconcileError> {
        if pass.is_none() {
            *pass = self.reconcile_span(gpu, epoch, None);
        }
        let span = tracing::info_span!(
            parent: &*pass,
            "mig_step",
            otel.name = name,
            tessera.node = %self.node,
            tessera.gpu = %self.gpu_id(gpu),
            tessera.mig.profile = placement.map(|p| p.profile.to_string()).unwrap_or_default(),
            tessera.mig.placement.start = placement.map_or(-1, |p| i64::from(p.start)),
            tessera.mig.instance_id = Empty,
            tessera.tenant.count = tenants as i64,
            otel.status_code = Empty,
            otel.status_description = Empty,
        );
        let result = span.in_scope(action);
        tessera_telemetry::record_status(&span, &result);
        result
    }

    fn reconcile_target(
        &self,
        info: &GpuInfo,
        target: &GpuTarget,
        pass: &mut tracing::Span,
    ) -> Result<GpuOutcome, ReconcileError> {
        let gpu = info.index;
        let epoch = target.epoch;
        let model = mig_model(info)?;
        let mut info = info.clone();
        if info.mig.is_some_and(|m| !m.current) {
            if target.plan.layout.is_empty() {
                self.observe(&info, Some(target), None)?;
                return Ok(GpuOutcome::Converged);
            }
            let mode = self.mig_step(pass, epoch, ("mig.set_mode", gpu, None), 0, || {
                Ok(self.backend.set_mig_mode(gpu, true)?)
            })?;
            info.mig = Some(mode);
            if !mode.current {
                return Err(ReconcileError::MigPending { gpu });
            }
        }
        if self.backend.applies_whole_targets() {
            return self.hand_over(&info, target, pass);
        }
        let plan = &target.plan;
        let observed = self.backend.instances(gpu)?;
        let live: Vec<Placement> = observed.iter().map(|i| i.placement).collect();
        self.workload.retain(gpu, &live);
        let current_work = assignments(&self.workload.loaded(gpu));
        let layout: Layout = live.iter().copied().collect();
        let steps =
            diff_assigned(model, &layout, &current_work, &plan.layout, &plan.assignments, &ReconfigLatency::default())
                .map_err(|error| ReconcileError::Diff { gpu, error })?
                .steps;
        if !steps.is_empty() || !pass.is_none() {
            if pass.is_none() {
                *pass = self.reconcile_span(gpu, epoch, None);
            }
            pass.record("tessera.layout.from", layout.to_string())
                .record("tessera.layout.to", plan.layout.to_string())
                .record("tessera.reconfiguration.planned", steps.len() as i64);
        }
        let mut instances: BTreeMap<Placement, GpuInstance> = observed.iter().map(|i| (i.placement, *i)).collect();
        for step in &steps {
            if matches!(step.action, StepAction::Destroy | StepAction::Reassign)
                && let Some(p) = self.preinit_not_warm(gpu, plan, step.placement, &step.before, &step.after, &instances)
            {
                self.observe(&info, Some(target), Some(p))?;
                return Ok(GpuOutcome::Waiting(p));
            }
            let tenants = step.after.len().max(step.before.len());
            match step.action {
                StepAction::Create => {
                    let id = ("mig.create_instance", gpu, Some(step.placement));
                    self.mig_step(pass, epoch, id, tenants, || {
                        let created = self.backend.create_instance(gpu, step.placement)?;
                        tracing::Span::current().record("tessera.mig.instance_id", i64::from(created.id.0));
                        instances.insert(created.placement, created);
                        if !step.after.is_empty() {
                            self.workload.load(gpu, &created, &step.after)?;
                        }
                        Ok(())
                    })?;
                }
                StepAction::Destroy => {
                    let instance = instances[&step.placement];
                    self.mig_step(pass, epoch, ("mig.destroy_instance", gpu, Some(step.placement)), tenants, || {
                        self.workload.drain(gpu, &instance)?;
                        self.destroy_when_unused(gpu, &instance)
                    })?;
                    instances.remove(&step.placement);
                }
                StepAction::Reassign => {
                    let instance = instances[&step.placement];
                    self.mig_step(pass, epoch, ("mig.reassign", gpu, Some(step.placement)), tenants, || {
                        self.workload.drain(gpu, &instance)?;
                        if !step.after.is_empty() {
                            self.workload.load(gpu, &instance, &step.after)?;
                        }
                        Ok(())
                    })?;
                }
            }
            self.steps.fetch_add(1, Ordering::SeqCst);
            let status = self.observe(&info, Some(target), None)?;
            if let Some(observer) = &self.observer {
                observer(gpu, &status);
            }
        }
        let status = self.observe(&info, Some(target), None)?;
        if status.converged {
            Ok(GpuOutcome::Converged)
        } else {
            // Something changed the GPU or the workload behind the pass's back; the next pass starts over.
            let observed: Layout = status.instances.iter().map(|i| i.instance.placement).collect();
            Err(ReconcileError::Diverged { gpu, observed, target: plan.layout.clone() })
        }
    }

    /// Hands GPU `info`'s target to a backend that takes whole targets, once per target epoch (see "Backends that
    /// take whole targets" in the module doc), and publishes what the GPU shows.
    fn hand_over(
        &self,
        info: &GpuInfo,
        target: &GpuTarget,
        pass: &mut tracing::Span,
    ) -> Result<GpuOutcome, ReconcileError> {
        let gpu = info.index;
        let handed = lock(&self.handed).get(&gpu) == Some(&target.epoch);
        if !handed {
            let tenants = target.plan.assignments.len();
            self.mig_step(pass, target.epoch, ("mig.apply_target", gpu, None), tenants, || {
                Ok(self.backend.apply_target(gpu, &target.plan)?)
            })?;
            lock(&self.handed).insert(gpu, target.epoch);
            self.steps.fetch_add(1, Ordering::SeqCst);
        }
        let mut status = self.observe(info, Some(target), None)?;
        if !status.converged {
            status.converged = true;
            lock(&self.status).gpus.insert(gpu, status.clone());
        }
        if !handed && let Some(observer) = &self.observer {
            observer(gpu, &status);
        }
        Ok(GpuOutcome::Converged)
    }

    /// The preinitialised instance (other than `placement`) that takes over work the step removes and is not warm
    /// yet, if any.
    fn preinit_not_warm(
        &self,
        gpu: u32,
        plan: &GpuPlan,
        placement: Placement,
        before: &[Work],
        after: &[Work],
        instances: &BTreeMap<Placement, GpuInstance>,
    ) -> Option<Placement> {
        let marked = before.iter().filter(|w| !after.contains(w)).find_map(|w| {
            plan.assignments
                .iter()
                .find(|a| {
                    a.preinit
                        && a.placement != placement
                        && a.tenant == w.tenant
                        && a.role == w.role
                        && instances.contains_key(&a.placement)
                        && !self.workload.ready(gpu, a.placement)
                })
                .map(|a| a.placement)
        });
        if marked.is_some() || !self.workload.make_before_break() {
            return marked;
        }
        // Make-before-break for every move of inference work (a workload whose readiness is real): the step waits
        // while the instance that takes the work over, on this GPU or another of the node, is not ready.
        let desired = self.desired();
        let waiting = before.iter().filter(|w| !after.contains(w) && w.role == Role::Inference).find_map(|w| {
            desired.gpus.iter().find_map(|(g, t)| {
                t.plan
                    .assignments
                    .iter()
                    .find(|a| {
                        a.tenant == w.tenant
                            && a.role == Role::Inference
                            && !(*g == gpu && a.placement == placement)
                            // Only an instance that exists, or can be made at once, is waited for: on this GPU one
                            // that needs the old one's slices cannot come first, and on another GPU one whose slices
                            // are taken waits on its own GPU's drains (no cycle of waits).
                            && (if *g == gpu {
                                instances.contains_key(&a.placement)
                            } else {
                                self.creatable_or_present(*g, a.placement)
                            })
                            && !self.workload.ready(*g, a.placement)
                    })
                    .map(|a| a.placement)
            })
        })?;
        (!self.mbb_timed_out(gpu, plan)).then_some(waiting)
    }

    /// Whether `placement` is on GPU `gpu` now, or its slices are free there (its GPU's pass creates it without
    /// draining anything first).
    fn creatable_or_present(&self, gpu: u32, placement: Placement) -> bool {
        let Ok(layout) = self.backend.layout(gpu) else { return false };
        layout.contains(placement) || layout.memory_mask() & Layout::new([placement]).memory_mask() == 0
    }

    /// Whether make-before-break waits on `gpu` for this plan have lasted longer than [`MAKE_BEFORE_BREAK_LIMIT`]
    /// (then moves proceed without waiting, as break-before-make: a new instance that never gets ready must not pin
    /// the old one forever). The clock starts at the first wait for the plan.
    fn mbb_timed_out(&self, gpu: u32, plan: &GpuPlan) -> bool {
        let mut waits = lock(&self.mbb_waits);
        let key = (gpu, format!("{} {:?}", plan.layout, plan.assignments));
        let since = *waits.entry(key.clone()).or_insert_with(std::time::Instant::now);
        waits.retain(|k, _| k.0 != gpu || *k == key);
        let out = since.elapsed() > MAKE_BEFORE_BREAK_LIMIT;
        if out {
            tracing::warn!(node = %self.node, gpu, "new instances not ready after {MAKE_BEFORE_BREAK_LIMIT:?}; \
                draining the old ones anyway");
        }
        out
    }

    /// Destroys `instance` once no process runs on it: the backend's process list (NVML's running processes on the
    /// MIG device) must be empty, and `NVML_ERROR_IN_USE` from the destroy means "not drained yet"; both are waited
    /// out for at most [`IN_USE_LIMIT`], then the pass fails with [`ReconcileError::StillInUse`] and the next pass
    /// tries again. An instance with processes attached is never destroyed.
    fn destroy_when_unused(&self, gpu: u32, instance: &GpuInstance) -> Result<(), ReconcileError> {
        let started = std::time::Instant::now();
        loop {
            let pids = self.backend.processes(gpu, instance)?;
            if pids.is_empty() {
                match self.backend.destroy_instance(gpu, instance.id) {
                    Ok(()) => return Ok(()),
                    Err(BackendError::InUse { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            if started.elapsed() >= IN_USE_LIMIT {
                let pids = self.backend.processes(gpu, instance).unwrap_or_default();
                return Err(ReconcileError::StillInUse {
                    gpu,
                    placement: instance.placement,
                    pids,
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// Reads the GPU's instances and work and publishes them as its status.
    fn observe(
        &self,
        info: &GpuInfo,
        target: Option<&GpuTarget>,
        waiting_for: Option<Placement>,
    ) -> Result<GpuStatus, ReconcileError> {
        let gpu = info.index;
        let observed = if info.mig.is_some_and(|m| m.current) { self.backend.instances(gpu)? } else { Vec::new() };
        let loaded = self.workload.loaded(gpu);
        let mut endpoints = self.workload.endpoints(gpu);
        let instances: Vec<ObservedInstance> = observed
            .iter()
            .map(|i| ObservedInstance {
                instance: *i,
                work: loaded.get(&i.placement).cloned().unwrap_or_default(),
                serving: loaded.contains_key(&i.placement) && self.workload.ready(gpu, i.placement),
                endpoints: endpoints.remove(&i.placement).unwrap_or_default(),
            })
            .collect();
        let converged = target.is_none_or(|t| {
            let layout: Layout = observed.iter().map(|i| i.placement).collect();
            layout == t.plan.layout && same_work(&assignments(&loaded), &t.plan.assignments)
        }) && waiting_for.is_none();
        let status = GpuStatus {
            info: info.clone(),
            instances,
            target: target.cloned(),
            converged,
            waiting_for,
            last_error: None,
        };
        lock(&self.status).gpus.insert(gpu, status.clone());
        Ok(status)
    }
}

/// The catalog model of a MIG-capable GPU.
fn mig_model(info: &GpuInfo) -> Result<GpuModel, ReconcileError> {
    match (info.model, info.mig) {
        (Some(model), Some(_)) => Ok(model),
        _ => Err(ReconcileError::NotMigCapable { gpu: info.index, name: info.name.clone() }),
    }
}

/// Loaded work as assignments (the diff's "current" side).
fn assignments(loaded: &BTreeMap<Placement, Vec<Work>>) -> Vec<Assignment> {
    loaded
        .iter()
        .flat_map(|(p, works)| {
            works.iter().map(|w| Assignment { placement: *p, tenant: w.tenant.clone(), role: w.role, preinit: false })
        })
        .collect()
}

/// Whether two assignment lists put the same work on the same instances (the preinit flag aside).
fn same_work(a: &[Assignment], b: &[Assignment]) -> bool {
    let key = |v: &[Assignment]| {
        let mut k: Vec<(Placement, Work)> =
            v.iter().map(|a| (a.placement, Work { tenant: a.tenant.clone(), role: a.role })).collect();
        k.sort();
        k
    };
    key(a) == key(b)
}
