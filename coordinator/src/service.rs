//! The coordinator's gRPC services: `CoordinatorApi` (operators, replay), `Coordinator` (agents' registration
//! and heartbeats) and `Raft` (peers). Every error becomes a `tonic::Status` in [`status`], one place.
//!
//! Any node accepts any call. Writes are proposed on this node (raft-rs forwards a follower's proposal to the
//! leader) and answered once applied here; reads go through a read index unless the request asks for a stale read.
//! Calls that only the leader can serve (planning, membership, the clock) are forwarded to the leader by this node.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_auth::{Auth, Identity, Need, TlsFiles};
use tessera_core::fleet::{Command, GpuHealth, Rejected, TenantStatus};
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::plan::Assignment;
use tessera_core::tenant::TenantSpec;
use tessera_core::time::SimTime;
use tessera_core::{Layout, Placement};
use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::planning::{ClockMode, Planner, RoundError};
use crate::replica::{Replica, ReplicaError};
use crate::state::{AuditEntry, CoordState, Op, Outcome};
use crate::transport::{TermGuard, Transport};

/// Metadata key carrying the leader's address on a `NotLeader` answer.
pub const LEADER_KEY: &str = "tessera-leader";
/// Metadata key of a client's id for a write: a retry with the same id is applied at most once.
pub const REQUEST_ID_KEY: &str = "tessera-request-id";

/// Deadline of a call a follower forwards to the leader (a planning round over a large fleet included).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(60);

/// Most GPUs one node may register.
pub const MAX_GPUS_PER_NODE: usize = tessera_core::config::MAX_GPUS_PER_NODE;
/// Longest `HOST:PORT` accepted for an agent or a member.
pub const MAX_ADDRESS_BYTES: usize = 256;

/// Checks a `HOST:PORT` address field: not empty, at most [`MAX_ADDRESS_BYTES`], no spaces or control characters.
fn check_address(field: &str, address: &str) -> Result<(), Status> {
    if address.is_empty() || address.len() > MAX_ADDRESS_BYTES {
        return Err(bad(field, format!("must be HOST:PORT of 1 to {MAX_ADDRESS_BYTES} bytes, got {}", address.len())));
    }
    if !address.contains(':') || address.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(bad(field, format!("{address:?} is not HOST:PORT")));
    }
    Ok(())
}

/// The request id a write carries in its metadata, checked ([`crate::state::MAX_REQUEST_ID_BYTES`] printable ASCII
/// bytes at most).
fn request_id<T>(req: &Request<T>) -> Result<Option<String>, Status> {
    let Some(v) = req.metadata().get(REQUEST_ID_KEY) else { return Ok(None) };
    let id = v.to_str().map_err(|_| bad(REQUEST_ID_KEY, "must be printable ASCII"))?;
    if id.is_empty() || id.len() > crate::state::MAX_REQUEST_ID_BYTES || !id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad(
            REQUEST_ID_KEY,
            format!("must be 1 to {} printable ASCII bytes", crate::state::MAX_REQUEST_ID_BYTES),
        ));
    }
    Ok(Some(id.to_string()))
}

/// Maps every coordinator error to a gRPC status (the one place that does).
pub fn status(e: ReplicaError) -> Status {
    match e {
        ReplicaError::NoLeader => Status::unavailable(e.to_string()),
        ReplicaError::NotLeader { ref address, .. } => {
            let mut s = Status::unavailable(e.to_string());
            if let Ok(v) = address.parse() {
                s.metadata_mut().insert(LEADER_KEY, v);
            }
            s
        }
        ReplicaError::Timeout(_) | ReplicaError::LeaderChanged | ReplicaError::Stopped => {
            Status::unavailable(e.to_string())
        }
        ReplicaError::Rejected(r) => rejected(r),
        ReplicaError::Raft(_)
        | ReplicaError::Store(_)
        | ReplicaError::NotAPeer { .. }
        | ReplicaError::Spawn { .. }
        | ReplicaError::ConfChange { .. }
        | ReplicaError::Snapshot(_)
        | ReplicaError::PersistStopped => Status::internal(e.to_string()),
    }
}

/// A planning round's error as a gRPC status: the replica's as [`status`] maps them, the policy's as internal.
pub fn round_status(e: RoundError) -> Status {
    match e {
        RoundError::Replica(e) => status(e),
        RoundError::Plan(_) | RoundError::Panicked(_) => Status::internal(e.to_string()),
    }
}

fn rejected(r: Rejected) -> Status {
    let msg = r.to_string();
    match r {
        Rejected::TenantExists(_) => Status::already_exists(msg),
        Rejected::UnknownTenant(_) | Rejected::UnknownNode(_) | Rejected::UnknownGpu(_) => Status::not_found(msg),
        Rejected::StaleReport { .. }
        | Rejected::FutureReport { .. }
        | Rejected::TenantRetiring(_)
        | Rejected::RevisionMismatch { .. } => Status::failed_precondition(msg),
        _ => Status::invalid_argument(msg),
    }
}

/// `ok`, or the refusal's message, for the audit log.
fn outcome_text<T>(result: &Result<Response<T>, Status>) -> String {
    match result {
        Ok(_) => "ok".into(),
        Err(e) => format!("{:?}: {}", e.code(), e.message()),
    }
}

fn bad(field: &str, e: impl std::fmt::Display) -> Status {
    Status::invalid_argument(format!("field `{field}`: {e}"))
}

fn health_name(h: GpuHealth) -> &'static str {
    match h {
        GpuHealth::Healthy => "healthy",
        GpuHealth::Draining => "draining",
        GpuHealth::Failed => "failed",
    }
}

/// Shared by the three services.
#[derive(Clone)]
pub struct Services {
    node: Replica,
    planner: Arc<Planner>,
    leader_channels: Arc<Mutex<std::collections::HashMap<String, Channel>>>,
    auth: Auth,
    tls: Option<TlsFiles>,
}

impl Services {
    /// Services over a node and its planner; `auth` checks each caller's role, and `tls` (this member's
    /// certificate) is what it presents when it forwards a call to the leader.
    pub fn new(node: Replica, planner: Arc<Planner>, auth: Auth, tls: Option<TlsFiles>) -> Services {
        Services { node, planner, leader_channels: Arc::default(), auth, tls }
    }

    async fn read<R>(&self, stale: bool, f: impl FnOnce(&CoordState) -> R) -> Result<R, Status> {
        if stale { Ok(self.node.read(f)) } else { self.node.read_current(f).await.map_err(status) }
    }

    async fn propose(&self, command: Command) -> Result<(u64, Outcome), Status> {
        self.node.propose(Op::Fleet { command }).await.map_err(status)
    }

    /// Proposes a client's tenant write: conditional on the tenant's revision when `if_revision > 0`, and applied at
    /// most once per request id.
    async fn propose_write(
        &self,
        command: Command,
        tenant: &TenantId,
        if_revision: u64,
        request: Option<String>,
        audit: Option<AuditEntry>,
    ) -> Result<(u64, Outcome), Status> {
        let op = if if_revision > 0 {
            Op::Guarded { command, tenant: tenant.clone(), revision: if_revision }
        } else {
            Op::Fleet { command }
        };
        self.node.propose_request(op, request, audit).await.map_err(status)
    }

    /// Who calls, for the audit log: the certificate's identity, and, for a member's certificate, whose call it
    /// says it forwards (the `tessera-on-behalf-of` metadata a follower adds).
    fn caller<T>(&self, req: &Request<T>, need: Need<'_>) -> Result<Caller, Status> {
        let identity = self.auth.check(req, need)?;
        let on_behalf = identity
            .as_ref()
            .filter(|w| w.role == tessera_auth::Role::Coordinator)
            .and_then(|_| req.metadata().get(ON_BEHALF_OF)?.to_str().ok())
            .filter(|v| v.len() <= 200 && v.chars().all(|c| c.is_ascii_graphic()))
            .map(str::to_string);
        Ok(Caller { identity, on_behalf })
    }

    /// The audit entry of an action by `who`. Every call is audited where it is carried out, a member's too: a
    /// call a follower forwarded reads `CLIENT via coordinator:node-N` on the leader (the follower records nothing),
    /// and a member certificate used directly is named as itself.
    fn audit(&self, who: &Caller, action: String) -> AuditEntry {
        let name = |w: &Identity| format!("{}:{}", w.role.name(), w.name);
        let who = match (&who.identity, &who.on_behalf) {
            (None, _) => "anonymous".to_string(),
            (Some(w), Some(client)) => format!("{client} via {}", name(w)),
            (Some(w), None) => name(w),
        };
        AuditEntry { index: 0, at_ms: crate::replica::wall_ms(), who, action, result: String::new() }
    }

    /// Records an action that is not a fleet command once it is done (or failed), with its result.
    async fn audit_done(&self, who: &Caller, action: String, result: String) {
        let mut entry = self.audit(who, action);
        entry.result = result;
        if let Err(e) = self.node.propose(Op::Audit { entry }).await {
            tracing::warn!(error = %e, "could not record an audit entry");
        }
    }

    /// A channel to the leader, for calls this follower forwards; `None` when this node leads.
    fn leader_channel(&self) -> Result<Option<Channel>, Status> {
        match self.node.not_leader() {
            None => Ok(None),
            Some(ReplicaError::NotLeader { address, .. }) if !address.is_empty() => {
                let mut channels = self.leader_channels.lock().expect("channels lock");
                if let Some(c) = channels.get(&address) {
                    return Ok(Some(c.clone()));
                }
                let tls = self.tls.as_ref().map(|f| (f, tessera_auth::COORDINATOR_SERVER_NAME));
                let channel = crate::net::channel(&address, Duration::from_secs(1), Some(FORWARD_TIMEOUT), tls)
                    .map_err(|e| Status::internal(format!("leader: {e}")))?;
                channels.insert(address, channel.clone());
                Ok(Some(channel))
            }
            Some(e) => Err(status(e)),
        }
    }

    /// Drops the connections to the leader, so the next forwarded call opens a new one (after the certificates were
    /// reloaded).
    pub fn forget_channels(&self) {
        self.leader_channels.lock().expect("channels lock").clear();
    }

    /// An API client of the leader, for calls this follower forwards; `None` when this node leads.
    fn leader_client(&self) -> Result<Option<CoordinatorApiClient<Channel>>, Status> {
        Ok(self.leader_channel()?.map(CoordinatorApiClient::new))
    }
}

fn tenant_response(s: &CoordState, id: &TenantId, index: u64) -> Option<v1::TenantResponse> {
    s.fleet.tenants.get(id).map(|spec| v1::TenantResponse {
        spec: Some(spec.into()),
        retiring: s.fleet.retiring.contains(id),
        index,
        revision: s.tenant_revisions.get(id).copied().unwrap_or(0),
    })
}

fn gpu_status(id: &GpuId, g: &tessera_core::fleet::GpuState) -> v1::GpuStatus {
    v1::GpuStatus {
        id: id.to_string(),
        index: id.index,
        model: g.model.to_string(),
        health: health_name(g.health).into(),
        mig_enabled: g.mig_enabled,
        applied: Some((&g.applied).into()),
        applied_assignments: g.applied_assignments.iter().map(Into::into).collect(),
        applied_epoch: g.applied_epoch,
        target: g.target.as_ref().map(Into::into),
        target_epoch: g.target_epoch,
    }
}

#[tonic::async_trait]
impl v1::coordinator_api_server::CoordinatorApi for Services {
    async fn create_tenant(&self, req: Request<v1::TenantRequest>) -> Result<Response<v1::TenantResponse>, Status> {
        let who = self.caller(&req, Need::Operator)?;
        let request = request_id(&req)?;
        let spec = req.into_inner().spec.ok_or_else(|| bad("spec", "is required"))?;
        let spec = TenantSpec::try_from(spec).map_err(|e| bad(&format!("spec.{}", e.field), e.message))?;
        tessera_core::config::validate_tenant(&spec).map_err(|e| bad(&format!("spec.{}", e.field), e.message))?;
        let id = spec.id.clone();
        let audit = Some(self.audit(&who, format!("create_tenant {id}")));
        let (index, _) = self.propose_write(Command::CreateTenant { spec }, &id, 0, request, audit).await?;
        let r = self.node.read(|s| tenant_response(s, &id, index));
        r.map(Response::new).ok_or_else(|| Status::aborted("the tenant was deleted right after its creation"))
    }

    async fn update_tenant(&self, req: Request<v1::TenantRequest>) -> Result<Response<v1::TenantResponse>, Status> {
        let who = self.caller(&req, Need::Operator)?;
        let request = request_id(&req)?;
        let r = req.into_inner();
        let spec = r.spec.ok_or_else(|| bad("spec", "is required"))?;
        let spec = TenantSpec::try_from(spec).map_err(|e| bad(&format!("spec.{}", e.field), e.message))?;
        tessera_core::config::validate_tenant(&spec).map_err(|e| bad(&format!("spec.{}", e.field), e.message))?;
        let id = spec.id.clone();
        let audit = Some(self.audit(&who, format!("update_tenant {id} (if revision {})", r.if_revision)));
        let (index, _) = self.propose_write(Command::UpdateTenant { spec }, &id, r.if_revision, request, audit).await?;
        let r = self.node.read(|s| tenant_response(s, &id, index));
        r.map(Response::new).ok_or_else(|| Status::aborted("the tenant was deleted right after its update"))
    }

    async fn delete_tenant(
        &self,
        req: Request<v1::TenantIdRequest>,
    ) -> Result<Response<v1::DeleteTenantResponse>, Status> {
        let who = self.caller(&req, Need::Operator)?;
        let request = request_id(&req)?;
        let r = req.into_inner();
        let id = TenantId::new(r.id).map_err(|e| bad("id", e))?;
        let audit = Some(self.audit(&who, format!("delete_tenant {id} (if revision {})", r.if_revision)));
        let (index, _) =
            self.propose_write(Command::DeleteTenant { id: id.clone() }, &id, r.if_revision, request, audit).await?;
        let retiring = self.node.read(|s| s.fleet.retiring.contains(&id));
        Ok(Response::new(v1::DeleteTenantResponse { retiring, index }))
    }

    async fn get_tenant(&self, req: Request<v1::TenantIdRequest>) -> Result<Response<v1::TenantResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let id = TenantId::new(req.into_inner().id).map_err(|e| bad("id", e))?;
        self.read(false, |s| tenant_response(s, &id, 0))
            .await?
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("unknown tenant {id}")))
    }

    async fn list_tenants(&self, req: Request<v1::ListRequest>) -> Result<Response<v1::ListTenantsResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let tenants = self
            .read(req.into_inner().stale, |s| {
                s.fleet.tenants.keys().filter_map(|id| tenant_response(s, id, 0)).collect()
            })
            .await?;
        Ok(Response::new(v1::ListTenantsResponse { tenants }))
    }

    async fn list_nodes(&self, req: Request<v1::ListRequest>) -> Result<Response<v1::ListNodesResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let nodes = self
            .read(req.into_inner().stale, |s| {
                s.fleet
                    .nodes
                    .iter()
                    .map(|(id, n)| v1::NodeInfo {
                        id: id.to_string(),
                        address: n.address.clone(),
                        registered_at_ms: n.registered_at.as_ms(),
                        health: n.health.name().into(),
                        health_reason: n.health_reason.clone(),
                        health_since_ms: n.health_since.as_ms(),
                        gpus: n
                            .gpus
                            .iter()
                            .filter_map(|i| {
                                let gid = GpuId::new(id.clone(), *i);
                                s.fleet.gpus.get(&gid).map(|g| gpu_status(&gid, g))
                            })
                            .collect(),
                    })
                    .collect()
            })
            .await?;
        Ok(Response::new(v1::ListNodesResponse { nodes }))
    }

    async fn drain_gpu(&self, req: Request<v1::DrainGpuRequest>) -> Result<Response<v1::DrainGpuResponse>, Status> {
        let who = self.caller(&req, Need::Operator)?;
        let request = request_id(&req)?;
        let r = req.into_inner();
        let gpu: GpuId = r.gpu.parse().map_err(|e| bad("gpu", e))?;
        let health = if r.drain { GpuHealth::Draining } else { GpuHealth::Healthy };
        let audit = Some(self.audit(&who, format!("{} {gpu}", if r.drain { "drain_gpu" } else { "undrain_gpu" })));
        let op = Op::Fleet { command: Command::SetGpuHealth { gpu, health } };
        let (index, _) = self.node.propose_request(op, request, audit).await.map_err(status)?;
        Ok(Response::new(v1::DrainGpuResponse { index }))
    }

    async fn get_plan(&self, req: Request<v1::ListRequest>) -> Result<Response<v1::PlanResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let r = self
            .read(req.into_inner().stale, |s| {
                let Some(last) = &s.fleet.last_plan else { return v1::PlanResponse::default() };
                v1::PlanResponse {
                    epoch: last.epoch,
                    made_at_ms: last.made_at.as_ms(),
                    policy: last.policy.clone(),
                    expected_goodput: last.expected_goodput,
                    gpus: s
                        .fleet
                        .gpus
                        .iter()
                        .filter_map(|(id, g)| {
                            g.target.as_ref().map(|t| v1::PlanGpu { gpu: id.to_string(), plan: Some(t.into()) })
                        })
                        .collect(),
                }
            })
            .await?;
        Ok(Response::new(r))
    }

    async fn plan_history(&self, req: Request<v1::GpuRequest>) -> Result<Response<v1::PlanHistoryResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let r = req.into_inner();
        let gpu: GpuId = r.gpu.parse().map_err(|e| bad("gpu", e))?;
        let entries = self
            .read(r.stale, |s| {
                s.history.get(&gpu).map(|h| {
                    h.iter()
                        .rev()
                        .map(|e| v1::PlanHistoryEntry {
                            epoch: e.epoch,
                            made_at_ms: e.made_at.as_ms(),
                            policy: e.policy.clone(),
                            plan: Some((&e.plan).into()),
                        })
                        .collect()
                })
            })
            .await?
            .unwrap_or_default();
        Ok(Response::new(v1::PlanHistoryResponse { entries }))
    }

    async fn trigger_plan(
        &self,
        req: Request<v1::TriggerPlanRequest>,
    ) -> Result<Response<v1::TriggerPlanResponse>, Status> {
        let who = self.caller(&req, Need::Operator)?;
        let leader = self.leader_client()?;
        let forwarded = leader.is_some();
        let result = async {
            if let Some(mut leader) = leader {
                return leader.trigger_plan(who.forward(req.into_inner())).await;
            }
            let r = self.planner.round("api").await.map_err(round_status)?;
            Ok(Response::new(v1::TriggerPlanResponse {
                outcome: r.outcome,
                epoch: r.epoch,
                objective: r.objective,
                bound: r.bound,
                gap: r.gap,
                solve_ms: r.solve_ms,
                reason: r.reason,
                pushed: r.pushed,
                push_failures: r.push_failures,
            }))
        }
        .await;
        let what = match &result {
            Ok(r) => format!("ok: {} epoch {}", r.get_ref().outcome, r.get_ref().epoch),
            Err(e) => e.message().to_string(),
        };
        if !forwarded {
            self.audit_done(&who, "trigger_plan".into(), what).await;
        }
        result
    }

    async fn explain(&self, req: Request<v1::GpuRequest>) -> Result<Response<v1::ExplainResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        if let Some(mut leader) = self.leader_client()? {
            return leader.explain(req.into_inner()).await;
        }
        let r = req.into_inner();
        let gpu: GpuId = r.gpu.parse().map_err(|e| bad("gpu", e))?;
        let (epoch, policy, target) = self
            .read(r.stale, |s| {
                let g = s.fleet.gpus.get(&gpu)?;
                let policy = s.history.get(&gpu).and_then(|h| h.back()).map(|e| e.policy.clone()).unwrap_or_default();
                Some((g.target_epoch, policy, g.target.clone()))
            })
            .await?
            .ok_or_else(|| Status::not_found(format!("unknown GPU {gpu}")))?;
        let d = self.planner.decision(&gpu).unwrap_or_default();
        Ok(Response::new(v1::ExplainResponse {
            gpu: gpu.to_string(),
            epoch,
            policy,
            explanation: target.as_ref().map(|t| t.explanation.clone()).unwrap_or_default(),
            plan: target.as_ref().map(Into::into),
            status: d.status,
            objective: d.objective,
            bound: d.bound,
            tenants: d.tenants as u32,
            forecasts: d.forecasts,
        }))
    }

    async fn dump_planner_input(
        &self,
        req: Request<v1::ListRequest>,
    ) -> Result<Response<v1::DumpPlannerInputResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        if let Some(mut leader) = self.leader_client()? {
            return leader.dump_planner_input(req.into_inner()).await;
        }
        let (epoch, json) = self
            .planner
            .last_input()
            .ok_or_else(|| Status::failed_precondition("no planning round has run on the current leader yet"))?;
        Ok(Response::new(v1::DumpPlannerInputResponse { json, epoch }))
    }

    async fn cluster_status(
        &self,
        req: Request<v1::ClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let st = self.node.status();
        let leader_address = self.node.leader().map(|(_, a)| a).unwrap_or_default();
        let (clock, epoch) = self.node.read(|s| (s.clock_ms, s.fleet.plan_epoch));
        Ok(Response::new(v1::ClusterStatusResponse {
            id: st.id,
            leader_id: st.leader_id,
            leader_address,
            term: st.term,
            commit_index: st.commit,
            applied_index: st.applied,
            members: self.node.members().into_iter().map(|(id, address)| v1::Member { id, address }).collect(),
            role: st.role_name().into(),
            workload_time_ms: if self.planner.settings().clock == ClockMode::Virtual {
                clock
            } else {
                self.planner.now_ms()
            },
            plan_epoch: epoch,
            policy: self.planner.settings().policy.clone(),
            round_settings_json: serde_json::to_string(&self.planner.settings().round)
                .map_err(|e| Status::internal(format!("round settings: {e}")))?,
        }))
    }

    async fn add_member(&self, req: Request<v1::AddMemberRequest>) -> Result<Response<v1::MembersResponse>, Status> {
        let who = self.caller(&req, Need::Admin)?;
        let action = format!("add_member {} {}", req.get_ref().id, req.get_ref().address);
        let leader = self.leader_client()?;
        let forwarded = leader.is_some();
        let result = async {
            if let Some(mut leader) = leader {
                return leader.add_member(who.forward(req.into_inner())).await;
            }
            let r = req.into_inner();
            if r.id == 0 {
                return Err(bad("id", "must be > 0"));
            }
            check_address("address", &r.address)?;
            let index = self.node.add_member(r.id, &r.address).await.map_err(status)?;
            let members = self.node.members().into_iter().map(|(id, address)| v1::Member { id, address }).collect();
            Ok(Response::new(v1::MembersResponse { members, index }))
        }
        .await;
        if !forwarded {
            self.audit_done(&who, action, outcome_text(&result)).await;
        }
        result
    }

    async fn remove_member(
        &self,
        req: Request<v1::RemoveMemberRequest>,
    ) -> Result<Response<v1::MembersResponse>, Status> {
        let who = self.caller(&req, Need::Admin)?;
        let action = format!("remove_member {}", req.get_ref().id);
        let leader = self.leader_client()?;
        let forwarded = leader.is_some();
        let result = async {
            if let Some(mut leader) = leader {
                return leader.remove_member(who.forward(req.into_inner())).await;
            }
            let r = req.into_inner();
            if !self.node.status().voters.contains(&r.id) {
                return Err(Status::not_found(format!("node {} is not a member", r.id)));
            }
            // A removed member's certificates are revoked: were its id added again, they would speak for it.
            for serial in self.member_certificates(r.id) {
                let audit = Some(
                    self.audit(&who, format!("revoke_certificate {serial} (coordinator node-{}) on removal", r.id)),
                );
                let certificate = crate::state::Revocation {
                    serial,
                    name: format!("node-{}", r.id),
                    role: "coordinator".into(),
                    index: 0,
                };
                self.node.propose_request(Op::Revoke { certificate }, None, audit).await.map_err(status)?;
            }
            let index = self.node.remove_member(r.id).await.map_err(status)?;
            let members = self.node.members().into_iter().map(|(id, address)| v1::Member { id, address }).collect();
            Ok(Response::new(v1::MembersResponse { members, index }))
        }
        .await;
        if !forwarded {
            self.audit_done(&who, action, outcome_text(&result)).await;
        }
        result
    }

    async fn get_routes(&self, req: Request<v1::RoutesRequest>) -> Result<Response<v1::Routes>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let tenant = routes_tenant(&req.into_inner())?;
        self.routes_leader()?;
        Ok(Response::new(self.planner.routes().snapshot(tenant.as_ref(), self.node.status().leader_id)))
    }

    type WatchRoutesStream = tokio_stream::wrappers::ReceiverStream<Result<v1::Routes, Status>>;

    async fn watch_routes(&self, req: Request<v1::RoutesRequest>) -> Result<Response<Self::WatchRoutesStream>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let tenant = routes_tenant(&req.into_inner())?;
        self.routes_leader()?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let routes = self.planner.routes().clone();
        let node = self.node.clone();
        tokio::spawn(async move {
            loop {
                // A member that lost the lead ends the stream (UNAVAILABLE naming the leader): the watcher moves on.
                if let Some(e) = node.not_leader() {
                    let _ = tx.send(Err(status(e))).await;
                    return;
                }
                let snap = routes.snapshot(tenant.as_ref(), node.status().leader_id);
                let seen = snap.version;
                if tx.send(Ok(snap)).await.is_err() {
                    return;
                }
                routes.changed(seen, ROUTES_KEEPALIVE).await;
                tokio::time::sleep(ROUTES_MIN_INTERVAL).await;
            }
        });
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn list_audit(&self, req: Request<v1::ListRequest>) -> Result<Response<v1::AuditResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let entries = self
            .read(req.into_inner().stale, |s| {
                s.audit
                    .iter()
                    .map(|e| v1::AuditEntry {
                        index: e.index,
                        at_ms: e.at_ms,
                        who: e.who.clone(),
                        action: e.action.clone(),
                        result: e.result.clone(),
                    })
                    .collect()
            })
            .await?;
        Ok(Response::new(v1::AuditResponse { entries }))
    }

    async fn revoke_certificate(
        &self,
        req: Request<v1::RevokeCertificateRequest>,
    ) -> Result<Response<v1::RevokeCertificateResponse>, Status> {
        let who = self.caller(&req, Need::Admin)?;
        let r = req.into_inner();
        let serial = tessera_auth::normalize_serial(&r.serial)
            .ok_or_else(|| bad("serial", "must be 1 to 20 bytes of hex (colons allowed)"))?;
        let bounded = |field: &str, v: &str| {
            if v.len() > 128 || v.chars().any(char::is_control) {
                Err(bad(field, "must be at most 128 characters, none of them control characters"))
            } else {
                Ok(v.to_string())
            }
        };
        let (name, role) = (bounded("name", &r.name)?, bounded("role", &r.role)?);
        if self.node.read(|s| s.revoked.len() >= crate::state::MAX_REVOKED && !s.revoked.contains_key(&serial)) {
            return Err(Status::resource_exhausted(format!(
                "{} certificates are revoked already: issue a new CA and certificates instead",
                crate::state::MAX_REVOKED
            )));
        }
        let audit = Some(self.audit(&who, format!("revoke_certificate {serial} ({role} {name})")));
        let certificate = crate::state::Revocation { serial, name, role, index: 0 };
        let (index, outcome) =
            self.node.propose_request(Op::Revoke { certificate }, None, audit).await.map_err(status)?;
        match outcome {
            Outcome::Revoked(true) => Ok(Response::new(v1::RevokeCertificateResponse { index })),
            _ => Err(Status::resource_exhausted("the revocation list is full")),
        }
    }

    async fn list_revoked(&self, req: Request<v1::ListRequest>) -> Result<Response<v1::ListRevokedResponse>, Status> {
        self.auth.check(&req, Need::Reader)?;
        let certificates = self
            .read(req.into_inner().stale, |s| {
                s.revoked
                    .values()
                    .map(|c| v1::RevokedCertificate {
                        serial: c.serial.clone(),
                        name: c.name.clone(),
                        role: c.role.clone(),
                        index: c.index,
                    })
                    .collect()
            })
            .await?;
        Ok(Response::new(v1::ListRevokedResponse { certificates }))
    }

    async fn advance_clock(
        &self,
        req: Request<v1::AdvanceClockRequest>,
    ) -> Result<Response<v1::AdvanceClockResponse>, Status> {
        self.auth.check(&req, Need::Operator)?;
        if self.planner.settings().clock != ClockMode::Virtual {
            return Err(Status::failed_precondition(
                "this cluster runs on the wall clock (start it with --clock virtual)",
            ));
        }
        if let Some(mut leader) = self.leader_client()? {
            return leader.advance_clock(req.into_inner()).await;
        }
        let to = req.into_inner().to_ms;
        let before = self.node.read(|s| s.clock_ms);
        let (_, outcome) = self.node.propose(Op::Clock { now_ms: to }).await.map_err(status)?;
        let now_ms = match outcome {
            Outcome::Clock(t) => t,
            _ => to,
        };
        self.planner.advance_agents(now_ms).await;
        let window = self.planner.settings().round.plan_every.as_millis() as u64;
        if window > 0 && now_ms / window > before / window {
            self.planner.round("window").await.map_err(round_status)?;
        } else if self.planner.settings().round.replan_on_burst
            && now_ms > before
            && self.planner.burst_left_band(now_ms)
        {
            self.planner.round("burst").await.map_err(round_status)?;
        }
        Ok(Response::new(v1::AdvanceClockResponse { now_ms }))
    }
}

/// Keepalive of a `WatchRoutes` stream: the routes are sent again at least this often.
const ROUTES_KEEPALIVE: Duration = Duration::from_secs(5);
/// Shortest time between two `WatchRoutes` messages.
const ROUTES_MIN_INTERVAL: Duration = Duration::from_millis(50);

fn routes_tenant(r: &v1::RoutesRequest) -> Result<Option<TenantId>, Status> {
    if r.tenant.is_empty() { Ok(None) } else { TenantId::new(r.tenant.clone()).map(Some).map_err(|e| bad("tenant", e)) }
}

impl Services {
    /// Routes are the leader's (see `routes.rs`): a follower answers UNAVAILABLE naming the leader.
    fn routes_leader(&self) -> Result<(), Status> {
        match self.node.not_leader() {
            None => Ok(()),
            Some(e) => Err(status(e)),
        }
    }

    /// The serials of member `id`'s certificates this member knows: those it spoke Raft with here, and this
    /// member's own.
    fn member_certificates(&self, id: u64) -> Vec<String> {
        let mut serials = self.node.certificates_seen(id);
        if id == self.node.id()
            && let Some(own) = self.tls.as_ref().and_then(|f| tessera_auth::Identity::from_pem_file(&f.cert).ok())
        {
            serials.push(own.serial);
        }
        serials
    }

    /// Who leads as this member knows it, for an agent to check the pushes it gets against.
    fn leadership(&self) -> v1::Leadership {
        let status = self.node.status();
        let plan_epoch = self.node.read(|s| s.fleet.plan_epoch);
        v1::Leadership { leader_id: status.leader_id, term: status.term, plan_epoch, revocations: None }
    }

    /// [`Services::leadership`] with the revocation list, unless the agent's copy (index `revocations_known`) is
    /// current.
    fn leadership_with_list(&self, revocations_known: Option<u64>) -> v1::Leadership {
        let revocations = self
            .node
            .revocations_unless(revocations_known)
            .map(|(index, serials)| v1::RevocationList { index, serials });
        v1::Leadership { revocations, ..self.leadership() }
    }
}

/// What agents call.
#[tonic::async_trait]
impl v1::coordinator_server::Coordinator for Services {
    async fn register(&self, req: Request<v1::RegisterRequest>) -> Result<Response<v1::RegisterResponse>, Status> {
        let claimed = req.get_ref().node_id.clone();
        self.auth.check(&req, Need::AgentOf(&claimed))?;
        let r = req.into_inner();
        let node = NodeId::new(r.node_id).map_err(|e| bad("node_id", e))?;
        check_address("address", &r.address)?;
        if r.gpus.len() > MAX_GPUS_PER_NODE {
            return Err(bad("gpus", format!("{} GPUs; a node may have at most {MAX_GPUS_PER_NODE}", r.gpus.len())));
        }
        let gpus = r
            .gpus
            .into_iter()
            .enumerate()
            .map(|(i, g)| {
                tessera_core::fleet::GpuDescriptor::try_from(g)
                    .map_err(|e| bad(&format!("gpus[{i}].{}", e.field), e.message))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let at = SimTime::from_ms(self.planner.now_ms());
        self.propose(Command::RegisterNode { node, address: r.address, gpus, at }).await?;
        Ok(Response::new(v1::RegisterResponse {
            heartbeat_interval_ms: 0,
            leadership: Some(self.leadership_with_list(None)),
        }))
    }

    async fn get_leadership(&self, req: Request<v1::LeadershipRequest>) -> Result<Response<v1::Leadership>, Status> {
        self.auth.check(&req, Need::AgentOf(&req.get_ref().node_id))?;
        // This member's own view: an agent counts the members that agree, so a follower must not relay another's.
        Ok(Response::new(self.leadership()))
    }

    async fn heartbeat(&self, req: Request<v1::HeartbeatRequest>) -> Result<Response<v1::HeartbeatResponse>, Status> {
        let claimed = req.get_ref().state.as_ref().map(|s| s.node_id.clone()).unwrap_or_default();
        self.auth.check(&req, Need::AgentOf(&claimed))?;
        // The leader plans, so it is the one that learns from what agents measure: a follower forwards.
        if let Some(channel) = self.leader_channel()? {
            return v1::coordinator_client::CoordinatorClient::new(channel).heartbeat(req.into_inner()).await;
        }
        let req = req.into_inner();
        let known = Some(req.revocations_index);
        let mut state = req.state.ok_or_else(|| bad("state", "is required"))?;
        let node = NodeId::new(state.node_id.clone()).map_err(|e| bad("state.node_id", e))?;
        if !self.node.read(|s| s.fleet.nodes.contains_key(&node)) {
            return Ok(Response::new(v1::HeartbeatResponse {
                registered: false,
                leadership: Some(self.leadership_with_list(known)),
            }));
        }
        self.planner.saw(&node);
        // The node's endpoints become its tenants' routes, for the tenants the committed targets place on it.
        let pushed = self.planner.pushed_tenants(&node);
        let (address, placed) = self.node.read(|s| {
            let address = s.fleet.nodes.get(&node).map(|n| n.address.clone()).unwrap_or_default();
            // The tenants of its committed targets, and of the targets the leader pushed it last (a tenant moving to
            // another node is served here until its new home is ready: `push_all`). Not what the agent reports as
            // applied: that is its own claim.
            let placed: Vec<TenantId> = s
                .fleet
                .gpus
                .iter()
                .filter(|(id, _)| id.node == node)
                .flat_map(|(_, g)| g.target.iter().flat_map(|t| t.assignments.iter().map(|a| a.tenant.clone())))
                .chain(pushed)
                .collect();
            (address, placed)
        });
        // An agent speaks for the tenants placed on its node only: counters for any other (a forged heartbeat once
        // moved another tenant's forecast from 0.0006 to 657,000 rps and its accuracy to 0.01) are dropped and
        // counted. Without TLS there are no identities, and replay's shared fleet reports every tenant from one node.
        if self.auth.is_secure()
            && let Some(m) = &mut state.metrics
        {
            let before = m.tenants.len();
            m.tenants.retain(|t| placed.iter().any(|p| p.as_str() == t.tenant));
            let foreign = before - m.tenants.len();
            if foreign > 0 {
                self.planner.refused(crate::metrics::FOREIGN_TENANT, foreign as u64);
                tracing::warn!(%node, foreign, "dropped a heartbeat's counters for tenants not placed on its node");
            }
        }
        self.planner.routes().heard(&node, &address, &state, &placed);
        if let Some(m) = &state.metrics {
            self.planner.observe(&node, m.now_ms, &m.tenants);
        }
        let commands = self.node.read(|s| reports(s, &node, &state));
        for c in &commands {
            if let Command::LayoutApplied { gpu, epoch, .. } = c {
                self.planner.layout_applied(gpu, *epoch);
            }
        }
        if !commands.is_empty() {
            // The reports are replicated before the heartbeat is answered, so an agent (or replay) that heartbeats
            // and then asks for a plan is planned from what it reported; a failure is retried by the next beat.
            // Bounded, so an agent's heartbeat (2 s deadline by default) still succeeds during an election.
            match tokio::time::timeout(Duration::from_secs(1), self.node.propose(Op::Batch { commands })).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "heartbeat report not replicated; the next beat retries"),
                Err(_) => tracing::debug!("heartbeat report not replicated within 1 s; the next beat retries"),
            }
        }
        Ok(Response::new(v1::HeartbeatResponse {
            registered: true,
            leadership: Some(self.leadership_with_list(known)),
        }))
    }
}

/// The commands a heartbeat implies: a `LayoutApplied` for each converged GPU whose observed layout, work or
/// epoch differs from what the state records, and a `ReportTenantStatus` when retraining progressed.
fn reports(s: &CoordState, node: &NodeId, state: &v1::NodeState) -> Vec<Command> {
    let mut out = Vec::new();
    for g in &state.gpus {
        let id = GpuId::new(node.clone(), g.index);
        let Some(known) = s.fleet.gpus.get(&id) else { continue };
        if !g.converged || g.desired_epoch == 0 {
            continue;
        }
        let mut placements = Vec::new();
        let mut assignments = Vec::new();
        let mut ok = true;
        for inst in &g.instances {
            let Some(p) = inst.placement.clone().and_then(|p| Placement::try_from(p).ok()) else {
                ok = false;
                break;
            };
            placements.push(p);
            for w in &inst.work {
                let (Ok(tenant), Ok(role)) =
                    (TenantId::new(w.tenant.clone()), tessera_proto::convert::plan::role_from_wire("role", w.role))
                else {
                    ok = false;
                    continue;
                };
                assignments.push(Assignment { placement: p, tenant, role, preinit: false });
            }
        }
        let layout = Layout::new(placements);
        if !ok {
            continue;
        }
        // Recorded in the order reported (the agent's instance order); compared regardless of order.
        let key = |a: &Assignment| (a.placement, a.tenant.clone(), a.role);
        let mut reported = assignments.clone();
        reported.sort_by_key(key);
        let mut recorded = known.applied_assignments.clone();
        recorded.sort_by_key(key);
        if known.applied_epoch == g.desired_epoch && known.applied == layout && recorded == reported {
            continue;
        }
        if g.desired_epoch < known.applied_epoch {
            continue;
        }
        out.push(Command::LayoutApplied { gpu: id, epoch: g.desired_epoch, layout, assignments });
    }
    if let Some(m) = &state.metrics {
        for t in &m.tenants {
            let Ok(id) = TenantId::new(t.tenant.clone()) else { continue };
            let Some(spec) = s.fleet.tenants.get(&id) else { continue };
            let prev = s.fleet.tenant_status.get(&id);
            // An agent whose workload knows the serving model's accuracy reports it (> 0); others keep the last.
            let status = TenantStatus {
                accuracy: if t.accuracy > 0.0 {
                    t.accuracy.min(1.0)
                } else {
                    prev.map_or_else(|| spec.initial_accuracy(), |p| p.accuracy)
                },
                model_version: t.model_version.max(prev.map_or(0, |p| p.model_version)),
                retraining_done_gpu_s: t.retraining_done_gpu_s,
                at: SimTime::from_ms(m.now_ms.max(prev.map_or(0, |p| p.at.as_ms()))),
                retraining_due: t.retraining_due.or(prev.and_then(|p| p.retraining_due)),
            };
            let unchanged = prev.is_some_and(|p| {
                p.accuracy == status.accuracy
                    && p.model_version == status.model_version
                    && p.retraining_done_gpu_s == status.retraining_done_gpu_s
                    && p.retraining_due == status.retraining_due
            });
            if unchanged || (spec.retraining.is_none() && t.accuracy <= 0.0) {
                continue;
            }
            out.push(Command::ReportTenantStatus { tenant: id, status });
        }
    }
    out
}

/// The metadata a follower adds to a call it forwards to the leader: the client's `role:name`, for the audit log.
const ON_BEHALF_OF: &str = "tessera-on-behalf-of";

/// Who makes a call: the certificate's identity (`None` without TLS), and, for a member, the client whose call it
/// says it forwards.
struct Caller {
    identity: Option<Identity>,
    on_behalf: Option<String>,
}

impl Caller {
    /// `message` as the request a follower forwards to the leader for this caller, naming the client.
    fn forward<T>(&self, message: T) -> Request<T> {
        let mut req = Request::new(message);
        let client = match (&self.on_behalf, &self.identity) {
            (Some(client), _) => Some(client.clone()),
            (None, Some(w)) => Some(format!("{}:{}", w.role.name(), w.name)),
            (None, None) => None,
        };
        if let Some(value) = client.and_then(|c| c.parse().ok()) {
            req.metadata_mut().insert(ON_BEHALF_OF, value);
        }
        req
    }
}

/// Between coordinators.
#[derive(Clone)]
pub struct RaftService {
    node: Replica,
    transport: Transport,
    fault_injection: bool,
    metrics: Arc<crate::metrics::Metrics>,
    auth: Auth,
    /// Becomes true when the server shuts down: open `StepStream` calls end then.
    stopping: tokio::sync::watch::Receiver<bool>,
    /// Which terms ahead of this member's it believes, per peer.
    terms: Arc<TermGuard>,
}

impl RaftService {
    /// The peer service of `node`; with mutual TLS, a batch is accepted only from the member its certificate names.
    /// `stopping` becomes true when the server shuts down, which ends the peers' open streams.
    pub fn new(
        node: Replica,
        fault_injection: bool,
        metrics: Arc<crate::metrics::Metrics>,
        auth: Auth,
        stopping: tokio::sync::watch::Receiver<bool>,
    ) -> RaftService {
        let transport = node.transport().clone();
        RaftService { node, transport, fault_injection, metrics, auth, stopping, terms: Arc::default() }
    }
}

impl RaftService {
    /// Checks a batch whose sender the caller's certificate allows and hands its messages to the node.
    fn accept(&self, batch: v1::RaftBatch) -> Result<(), Status> {
        if self.transport.is_blocked(batch.from) {
            return Err(Status::unavailable("partitioned (fault injection)"));
        }
        // A peer's address comes from the configuration or a committed membership change, never from a message.
        let mut messages = Transport::decode(&batch).map_err(|e| bad("messages", e))?;
        // The batch's sender is what the certificate allowed; no message inside may claim another.
        if let Some(m) = messages.iter().find(|m| m.from != batch.from) {
            return Err(bad("messages", format!("a message from {} inside a batch from {}", m.from, batch.from)));
        }
        // Even a real member may not move the cluster to a term far beyond this one's at once; one that keeps
        // claiming it is believed a little further each second, so no member is left refusing its peers for good.
        let own_term = self.node.status().term;
        let term = Transport::highest_term(&messages);
        if let Err(allowance) = self.terms.admit(batch.from, term, own_term, std::time::Instant::now()) {
            self.metrics.auth_refusal("term_out_of_bounds");
            tracing::warn!(
                from = batch.from,
                term,
                own_term,
                allowance,
                "refused a Raft message with a term far ahead"
            );
            return Err(bad(
                "messages",
                format!(
                    "term {term} is more than {allowance} beyond this member's term {own_term} (believed only as its sender insists, {} more per second)",
                    crate::transport::TERM_STEP_PER_SECOND
                ),
            ));
        }
        let dropped = Transport::drop_expired_proposals(&mut messages, crate::replica::wall_ms());
        if dropped > 0 {
            self.metrics.proposals_dropped_late(dropped as u64);
            tracing::warn!(from = batch.from, dropped, "dropped forwarded proposals that arrived after their deadline");
        }
        self.node.step(messages).map_err(status)
    }
}

/// The longest a peer's `StepStream` may take to deliver its next whole batch. A leader sends heartbeats every
/// `heartbeat_ticks` ticks (a fraction of a second), so a live stream to a follower is never near it; a stream that
/// carries nothing for this long (or trickles one batch's body over it) is ended, its partial body dropped, and the
/// peer's transport opens a new one when it next has something to send (raft resends what was lost). This bounds
/// what a member certificate can pin with a slow body on a long-lived stream, which the unary calls' deadline
/// (`tessera_auth::deadline`) does not cover.
pub const STREAM_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The next message of a peer's stream, or `DEADLINE_EXCEEDED` when no whole message arrives within `within`.
async fn next_batch<S, T>(stream: &mut S, within: Duration) -> Result<Option<T>, Status>
where
    S: futures::Stream<Item = Result<T, Status>> + Unpin,
{
    use futures::StreamExt;
    match tokio::time::timeout(within, stream.next()).await {
        Ok(m) => m.transpose(),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no whole batch on this stream within {} s: it is closed (open a new one)",
            within.as_secs()
        ))),
    }
}

#[tonic::async_trait]
impl v1::raft_server::Raft for RaftService {
    async fn step(&self, req: Request<v1::RaftBatch>) -> Result<Response<v1::RaftAck>, Status> {
        let from = req.get_ref().from;
        if let Some(who) = self.auth.check(&req, Need::Member(from))? {
            self.node.saw_certificate(from, &who.serial);
        }
        self.accept(req.into_inner())?;
        Ok(Response::new(v1::RaftAck {}))
    }

    async fn step_stream(
        &self,
        mut req: Request<tonic::Streaming<v1::RaftBatch>>,
    ) -> Result<Response<v1::RaftAck>, Status> {
        let mut stopping = self.stopping.clone();
        let stopped = || Status::unavailable("this member is shutting down");
        let first = tokio::select! {
            m = next_batch(req.get_mut(), STREAM_READ_TIMEOUT) => m?,
            _ = stopping.wait_for(|s| *s) => return Err(stopped()),
        };
        let Some(first) = first else {
            return Ok(Response::new(v1::RaftAck {}));
        };
        // The certificate is checked once, against the first batch's sender; every later batch must name the same.
        let from = first.from;
        if let Some(who) = self.auth.check(&req, Need::Member(from))? {
            self.node.saw_certificate(from, &who.serial);
        }
        self.accept(first)?;
        let stream = req.get_mut();
        loop {
            let batch = tokio::select! {
                m = next_batch(stream, STREAM_READ_TIMEOUT) => m?,
                _ = stopping.wait_for(|s| *s) => return Err(stopped()),
            };
            let Some(batch) = batch else { break };
            if batch.from != from {
                return Err(bad("from", format!("a batch from {} on a stream from {from}", batch.from)));
            }
            self.accept(batch)?;
        }
        Ok(Response::new(v1::RaftAck {}))
    }

    async fn isolate(&self, req: Request<v1::IsolateRequest>) -> Result<Response<v1::RaftAck>, Status> {
        self.auth.check(&req, Need::Admin)?;
        if !self.fault_injection {
            return Err(Status::permission_denied(
                "fault injection is off (only test builds with the `fault-injection` feature accept it, when \
                 started with --allow-fault-injection)",
            ));
        }
        let peers: BTreeSet<u64> = req.into_inner().peers.into_iter().collect();
        tracing::warn!(?peers, "fault injection: dropping messages to and from these peers");
        self.transport.set_blocked(peers);
        Ok(Response::new(v1::RaftAck {}))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// A peer's stream that delivers a batch and then nothing more (a stalled peer, or a body that never completes)
    /// is ended once the read timeout passes, after what it delivered was taken; a stream that ends or fails says
    /// so at once.
    #[tokio::test]
    async fn a_stream_that_stalls_is_closed_after_the_read_timeout() {
        let within = Duration::from_millis(50);
        let batch = v1::RaftBatch { from: 2, ..Default::default() };
        let mut stalls = futures::stream::iter(vec![Ok(batch.clone())]).chain(futures::stream::pending());
        assert_eq!(next_batch(&mut stalls, within).await.unwrap(), Some(batch));
        let started = std::time::Instant::now();
        let e = next_batch(&mut stalls, within).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::DeadlineExceeded, "{e}");
        assert!(started.elapsed() >= within);
        let mut ends = futures::stream::iter(Vec::<Result<v1::RaftBatch, Status>>::new());
        assert_eq!(next_batch(&mut ends, within).await.unwrap(), None);
        let mut fails = futures::stream::iter(vec![Err::<v1::RaftBatch, _>(Status::data_loss("torn"))]);
        assert_eq!(next_batch(&mut fails, within).await.unwrap_err().code(), tonic::Code::DataLoss);
        assert!(STREAM_READ_TIMEOUT > Duration::from_secs(5), "far above a heartbeat interval");
    }
}
