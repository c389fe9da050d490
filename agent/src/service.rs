//! The gRPC `tessera.v1.Agent` service over a [`Reconciler`], the conversion of the agent's status to the wire, and
//! the one place that maps the agent's errors to `tonic::Status`.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_auth::{Auth, Need};
use tessera_core::ids::TenantId;
use tessera_core::plan::GpuPlan;
use tessera_proto::v1;
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use crate::authority::Authority;
use crate::metrics::{PushOutcome, SharedMetrics};
use crate::reconcile::{Acceptance, GpuStatus, NodeStatus, ReconcileError, Reconciler};
use crate::workload::{WorkloadError, WorkloadMetrics};

impl From<ReconcileError> for Status {
    fn from(e: ReconcileError) -> Status {
        let msg = e.to_string();
        match e {
            ReconcileError::ZeroEpoch
            | ReconcileError::UnknownGpu { .. }
            | ReconcileError::NotMigCapable { .. }
            | ReconcileError::InvalidTarget { .. } => Status::invalid_argument(msg),
            ReconcileError::EpochConflict { .. } => Status::failed_precondition(msg),
            ReconcileError::MigPending { .. } | ReconcileError::Diverged { .. } | ReconcileError::StillInUse { .. } => {
                Status::unavailable(msg)
            }
            ReconcileError::Backend(_) | ReconcileError::Workload(_) | ReconcileError::Diff { .. } => {
                Status::internal(msg)
            }
            ReconcileError::State(_) => Status::unavailable(msg),
        }
    }
}

impl From<WorkloadError> for Status {
    fn from(e: WorkloadError) -> Status {
        let msg = e.to_string();
        match e {
            WorkloadError::WallClock | WorkloadError::ArrivalsUnsupported | WorkloadError::LoadUnsupported => {
                Status::failed_precondition(msg)
            }
            WorkloadError::UnknownTenant(_) => Status::not_found(msg),
            WorkloadError::Instance { .. } => Status::internal(msg),
        }
    }
}

fn bad_field(e: tessera_proto::ConvertError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The node's status as the wire's `NodeState`.
pub fn node_state_to_wire(status: &NodeStatus, node_id: &str) -> v1::NodeState {
    v1::NodeState {
        node_id: node_id.to_string(),
        epoch: status.epoch,
        applied_epoch: status.applied_epoch,
        gpus: status.gpus.values().map(gpu_state_to_wire).collect(),
        metrics: Some(metrics_to_wire(&status.metrics)),
        steps: status.steps,
    }
}

fn gpu_state_to_wire(g: &GpuStatus) -> v1::GpuState {
    v1::GpuState {
        index: g.info.index,
        name: g.info.name.clone(),
        model: g.info.model.map(|m| m.to_string()).unwrap_or_default(),
        mig: g.info.mig.map(|m| v1::MigMode { current: m.current, pending: m.pending }),
        instances: g
            .instances
            .iter()
            .map(|i| v1::Instance {
                id: i.instance.id.0,
                placement: Some(i.instance.placement.into()),
                work: i.work.iter().map(Into::into).collect(),
                serving: i.serving,
                mig_uuid: i.instance.uuid.map(|u| u.to_string()).unwrap_or_default(),
                endpoints: i
                    .endpoints
                    .iter()
                    .map(|e| v1::Endpoint {
                        tenant: e.tenant.to_string(),
                        role: tessera_proto::v1::Role::from(e.role).into(),
                        port: u32::from(e.port),
                        state: e.state.name().to_string(),
                    })
                    .collect(),
            })
            .collect(),
        desired: g.target.as_ref().map(|t| (&t.plan).into()),
        desired_epoch: g.target.as_ref().map_or(0, |t| t.epoch),
        converged: g.converged,
        last_error: g.last_error.clone().unwrap_or_default(),
    }
}

/// Workload metrics as the wire's message.
pub fn metrics_to_wire(m: &WorkloadMetrics) -> v1::WorkloadMetrics {
    v1::WorkloadMetrics {
        now_ms: m.now_ms,
        tenants: m
            .tenants
            .iter()
            .map(|(t, c)| v1::TenantMetrics {
                tenant: t.to_string(),
                arrivals: c.arrivals,
                served_within_slo: c.served_within_slo,
                dropped: c.dropped,
                queued: c.queued,
                retraining_done_gpu_s: c.retraining_done_gpu_s,
                serving_instances: c.serving_instances,
                retraining_instances: c.retraining_instances,
                accuracy: c.accuracy,
                model_version: c.model_version,
                retraining_due: c.retraining_due,
                slot_rates: c.slot_rates.clone(),
            })
            .collect(),
    }
}

/// Most tenants' jobs one push may carry.
pub const MAX_PUSHED_JOBS: usize = 4096;

/// The jobs of an `ApplyLayout` request, converted and validated; a bad field is named with its position.
pub fn jobs_from_wire(jobs: Vec<v1::TenantJobs>) -> Result<BTreeMap<TenantId, tessera_core::jobs::TenantJobs>, Status> {
    if jobs.len() > MAX_PUSHED_JOBS {
        return Err(Status::invalid_argument(format!(
            "field `jobs`: {} entries; at most {MAX_PUSHED_JOBS}",
            jobs.len()
        )));
    }
    let mut out = BTreeMap::new();
    for (i, w) in jobs.into_iter().enumerate() {
        let field = |f: &str| format!("field `jobs[{i}].{f}`");
        let tenant = TenantId::new(w.tenant.clone())
            .map_err(|e| Status::invalid_argument(format!("{}: {e}", field("tenant"))))?;
        let j = tessera_core::jobs::TenantJobs::try_from(w)
            .map_err(|e| Status::invalid_argument(format!("field `jobs[{i}].{}`: {}", e.field, e.message)))?;
        j.validate().map_err(|e| Status::invalid_argument(format!("{}: {}", field(&e.field), e.message)))?;
        out.insert(tenant, j);
    }
    Ok(out)
}

/// The targets of an `ApplyLayout` request, converted; a bad field is named with its position.
pub fn targets_from_wire(targets: Vec<v1::GpuTarget>) -> Result<BTreeMap<u32, GpuPlan>, Status> {
    let mut out = BTreeMap::new();
    for (i, t) in targets.into_iter().enumerate() {
        let field = format!("targets[{i}].plan");
        let plan = t.plan.ok_or_else(|| Status::invalid_argument(format!("field `{field}`: is required")))?;
        let plan = GpuPlan::try_from(plan).map_err(|e| bad_field(e.within(&field)))?;
        if out.insert(t.gpu, plan).is_some() {
            return Err(Status::invalid_argument(format!("field `targets[{i}].gpu`: GPU {} is listed twice", t.gpu)));
        }
    }
    Ok(out)
}

/// The `Agent` service: see the [module documentation](self).
#[derive(Clone)]
pub struct AgentService {
    reconciler: Arc<Reconciler>,
    wake: Arc<Notify>,
    auth: Auth,
    authority: Arc<Authority>,
    metrics: Option<SharedMetrics>,
}

impl AgentService {
    /// A service over `reconciler` that wakes the reconcile loop through `wake` when targets or time change.
    pub fn new(reconciler: Arc<Reconciler>, wake: Arc<Notify>) -> AgentService {
        AgentService {
            reconciler,
            wake,
            auth: Auth::insecure(),
            authority: Arc::new(Authority::standalone()),
            metrics: None,
        }
    }

    /// Checks callers with `auth`: with mutual TLS, only a coordinator member may push layouts or move the clock, a
    /// reader (or more) may read the state, and an operator may deliver simulated arrivals.
    pub fn with_auth(mut self, auth: Auth) -> AgentService {
        self.auth = auth;
        self
    }

    /// Checks pushes against what the coordinators say about who leads ([`Authority`]).
    pub fn with_authority(mut self, authority: Arc<Authority>) -> AgentService {
        self.authority = authority;
        self
    }

    /// Counts pushes and refusals in `metrics`.
    pub fn with_metrics(mut self, metrics: Option<SharedMetrics>) -> AgentService {
        self.metrics = metrics;
        self
    }

    fn count_push(&self, outcome: PushOutcome<'_>) {
        if let Some(m) = &self.metrics {
            m.0.push(self.reconciler.node().as_str(), outcome);
        }
    }

    /// The tonic server for it.
    pub fn into_server(self) -> v1::agent_server::AgentServer<AgentService> {
        v1::agent_server::AgentServer::new(self)
    }
}

#[tonic::async_trait]
impl v1::agent_server::Agent for AgentService {
    async fn apply_layout(
        &self,
        request: Request<v1::ApplyLayoutRequest>,
    ) -> Result<Response<v1::ApplyLayoutResponse>, Status> {
        use tracing::Instrument as _;
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let span = tracing::info_span!(
            "tessera.v1.Agent/ApplyLayout",
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = "tessera.v1.Agent",
            rpc.method = "ApplyLayout",
            tessera.node = %self.reconciler.node(),
            tessera.plan.epoch = i64::try_from(request.get_ref().epoch).unwrap_or(i64::MAX),
            tessera.apply.result = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            otel.status_description = tracing::field::Empty,
        );
        // The coordinator's client span is the parent (W3C trace context in the metadata), whoever sent it: a
        // refused push is traced too, and a trace id gives no rights.
        let _ = span.set_parent(tessera_telemetry::extract_context(request.metadata()));
        let result = self.apply_layout_in(request, &span).instrument(span.clone()).await;
        match &result {
            Ok(r) => {
                let label = match v1::ApplyStatus::try_from(r.get_ref().status) {
                    Ok(v1::ApplyStatus::Accepted) => "accepted",
                    Ok(v1::ApplyStatus::AlreadyAccepted) => "already_accepted",
                    Ok(v1::ApplyStatus::Stale) => "stale",
                    _ => "unknown",
                };
                span.record("tessera.apply.result", label);
            }
            Err(status) => {
                span.record("tessera.apply.result", status.code().description());
            }
        }
        tessera_telemetry::record_status(&span, &result.as_ref().map_err(|status| status.message()));
        result
    }

    async fn get_state(&self, request: Request<v1::GetStateRequest>) -> Result<Response<v1::NodeState>, Status> {
        self.auth.check(&request, Need::Reader)?;
        let reconciler = self.reconciler.clone();
        let status = tokio::task::spawn_blocking(move || reconciler.status())
            .await
            .map_err(|e| Status::internal(format!("state task failed: {e}")))?;
        Ok(Response::new(node_state_to_wire(&status, self.reconciler.node().as_str())))
    }

    async fn advance_clock(
        &self,
        request: Request<v1::AdvanceClockRequest>,
    ) -> Result<Response<v1::AdvanceClockResponse>, Status> {
        self.auth.check(&request, Need::Coordinator)?;
        let now_ms = self.reconciler.workload().advance_to(request.into_inner().to_ms)?;
        // Warm-ups may have completed: let the loop look.
        self.wake.notify_one();
        Ok(Response::new(v1::AdvanceClockResponse { now_ms }))
    }

    async fn arrive(&self, request: Request<v1::ArriveRequest>) -> Result<Response<v1::ArriveResponse>, Status> {
        self.auth.check(&request, Need::Operator)?;
        let req = request.into_inner();
        let mut parsed = Vec::with_capacity(req.arrivals.len());
        for (i, a) in req.arrivals.into_iter().enumerate() {
            let tenant = TenantId::new(a.tenant)
                .map_err(|e| Status::invalid_argument(format!("field `arrivals[{i}].tenant`: {e}")))?;
            parsed.push((tenant, a.count));
        }
        let workload = self.reconciler.workload();
        for (tenant, count) in &parsed {
            workload.arrive(tenant, *count)?;
        }
        Ok(Response::new(v1::ArriveResponse { now_ms: workload.now_ms() }))
    }

    async fn report_load(
        &self,
        request: Request<v1::ReportLoadRequest>,
    ) -> Result<Response<v1::ReportLoadResponse>, Status> {
        // The node's serving stack runs with the node's own identity.
        self.auth.check(&request, Need::AgentOf(self.reconciler.node().as_str()))?;
        let req = request.into_inner();
        if req.source.is_empty() || req.source.len() > MAX_LOAD_SOURCE_BYTES {
            return Err(Status::invalid_argument(format!(
                "field `source`: 1 to {MAX_LOAD_SOURCE_BYTES} bytes naming the serving process"
            )));
        }
        if req.tenants.len() > MAX_LOAD_TENANTS {
            return Err(Status::invalid_argument(format!(
                "field `tenants`: {} entries, at most {MAX_LOAD_TENANTS}",
                req.tenants.len()
            )));
        }
        let mut parsed = Vec::with_capacity(req.tenants.len());
        for (i, t) in req.tenants.into_iter().enumerate() {
            let tenant = TenantId::new(t.tenant)
                .map_err(|e| Status::invalid_argument(format!("field `tenants[{i}].tenant`: {e}")))?;
            parsed.push((tenant, t.requests_total));
        }
        let workload = self.reconciler.workload();
        for (tenant, total) in &parsed {
            workload.report_load(&req.source, tenant, *total)?;
        }
        Ok(Response::new(v1::ReportLoadResponse {}))
    }
}

/// Longest `ReportLoad` source name.
pub const MAX_LOAD_SOURCE_BYTES: usize = 128;
/// Most tenants in one `ReportLoad`.
pub const MAX_LOAD_TENANTS: usize = 4096;

impl AgentService {
    /// `ApplyLayout` inside its server span `span`: checks, accepts, and hands the span's context to the passes
    /// that realise the accepted targets.
    async fn apply_layout_in(
        &self,
        request: Request<v1::ApplyLayoutRequest>,
        span: &tracing::Span,
    ) -> Result<Response<v1::ApplyLayoutResponse>, Status> {
        let pusher = self.auth.check(&request, Need::Coordinator)?.and_then(|who| who.member_id());
        let req = request.into_inner();
        // A member may push only as the leader it is known to be, and only an epoch the cluster could have committed.
        if let Err(refusal) = self.authority.check(pusher, req.term, req.epoch).await {
            tracing::warn!(node = %self.reconciler.node(), ?pusher, term = req.term, epoch = req.epoch,
                "refused a push: {refusal}");
            self.count_push(PushOutcome::Refused { rule: refusal.rule() });
            return Err(Status::failed_precondition(format!("push refused: {refusal}")));
        }
        let targets = targets_from_wire(req.targets)?;
        let jobs = jobs_from_wire(req.jobs)?;
        let reconciler = self.reconciler.clone();
        let epoch = req.epoch;
        // Before accepting: a pass may start as soon as the target is in.
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        self.reconciler.follow_trace(epoch, targets.keys().copied(), &span.context());
        // Checking targets reads the GPUs and saving syncs a file: both block.
        // The push was checked against the coordinators' newest committed epoch: an epoch held beyond it was never
        // committed and does not make this push stale.
        let committed = if pusher.is_some() { self.authority.known().map(|k| k.plan_epoch) } else { None };
        let outcome = tokio::task::spawn_blocking(move || reconciler.accept_within(epoch, targets, jobs, committed))
            .await
            .map_err(|e| Status::internal(format!("apply task failed: {e}")))
            .and_then(|r| r.map_err(Status::from));
        if !matches!(outcome, Ok(Acceptance::Accepted | Acceptance::AlreadyAccepted)) {
            // Nothing of this push will be realised: its trace context goes (the map holds the GPUs of accepted
            // targets only).
            self.reconciler.forget_trace(epoch);
        }
        let outcome = outcome?;
        let status = match outcome {
            Acceptance::Accepted => {
                self.count_push(PushOutcome::Accepted { epoch });
                self.wake.notify_one();
                v1::ApplyStatus::Accepted
            }
            Acceptance::AlreadyAccepted => v1::ApplyStatus::AlreadyAccepted,
            Acceptance::Stale { .. } => {
                self.count_push(PushOutcome::Stale);
                v1::ApplyStatus::Stale
            }
        };
        let epoch = self.reconciler.desired().epoch;
        Ok(Response::new(v1::ApplyLayoutResponse { status: status.into(), epoch }))
    }
}
