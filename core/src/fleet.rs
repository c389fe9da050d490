//! Fleet state and the replicated commands that change it.
//!
//! [`FleetState::apply`] is the coordinator's Raft state machine: a pure function of the state and one
//! [`Command`]. It validates everything first and changes nothing when it returns [`Rejected`], so a rejected
//! command never loses data already accepted; an accepted one yields an [`Event`] saying what changed. The
//! invariants of [`crate::invariants`] hold before and after every command (checked with `debug_assert!`).
//!
//! Tenants refer to model profiles by name; profiles enter the state with [`Command::PutModel`] (the coordinator
//! loads `configs/models/` at bootstrap). A tenant is accepted only if its model is known and, once the fleet has
//! GPUs, its inference (and retraining, if any) fits an instance of at least one of them.
//!
//! Deleting a tenant that a committed target still assigns *retires* it (like a Kubernetes finalizer): it stays
//! known, no new plan may give it new work, and the first plan commit after which nothing assigns it removes it.
//! A tenant update or model replacement that would no longer fit an instance the tenant holds is rejected. A
//! draining GPU accepts plans that keep or remove its work but add none; a failed GPU accepts only the empty
//! layout.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::catalog::{GpuModel, Profile};
use crate::config::{FieldError, validate_model_profile, validate_tenant};
use crate::ids::{GpuId, NodeId, TenantId};
use crate::invariants::{self, Violation};
use crate::layout::Layout;
use crate::model::ModelProfile;
use crate::plan::{Assignment, GpuPlan, Plan, Role};
use crate::tenant::TenantSpec;
use crate::time::SimTime;

/// Health of a GPU as the planner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuHealth {
    /// Usable.
    Healthy,
    /// Being emptied by an operator: keeps serving, gets no new work.
    Draining,
    /// Failed (Xid error, fell off the bus, node lost): plan nothing on it.
    Failed,
}

/// Health of a node as the leader's failure detector judges it from heartbeats and pushes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeHealth {
    /// Heartbeating and reachable.
    #[default]
    Healthy,
    /// Heartbeats missed or pushes failing: keeps its work, gets no new work.
    Suspect,
    /// Silent past the failure threshold: its GPUs are planned empty and its tenants served elsewhere until it
    /// heartbeats again.
    Failed,
}

impl NodeHealth {
    /// The name operators see (`healthy`, `suspect`, `failed`).
    pub fn name(self) -> &'static str {
        match self {
            NodeHealth::Healthy => "healthy",
            NodeHealth::Suspect => "suspect",
            NodeHealth::Failed => "failed",
        }
    }
}

/// A GPU as a node reports it when registering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuDescriptor {
    /// Device index on the node.
    pub index: u32,
    /// Model.
    pub model: GpuModel,
    /// Whether MIG mode is on.
    pub mig_enabled: bool,
    /// The layout the node observes now.
    pub layout: Layout,
    /// Each profile's memory as the node's driver reports it, GiB (`agent mig probe`), where the node read it; the
    /// planner plans the GPU with these rather than the catalog's. Empty: the catalog's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_gib: BTreeMap<Profile, f64>,
}

impl GpuDescriptor {
    /// A GPU of `model` at `index` as a new node reports it: MIG on, no instances, the catalog's memory.
    pub fn fresh(index: u32, model: GpuModel) -> GpuDescriptor {
        GpuDescriptor { index, model, mig_enabled: true, layout: Layout::empty(), memory_gib: BTreeMap::new() }
    }
}

/// What the fleet knows about a node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeState {
    /// The agent's gRPC address.
    pub address: String,
    /// When it (last) registered.
    pub registered_at: SimTime,
    /// Its GPUs' indices.
    pub gpus: Vec<u32>,
    /// What the failure detector last decided.
    #[serde(default)]
    pub health: NodeHealth,
    /// Why (empty while healthy since registration).
    #[serde(default)]
    pub health_reason: String,
    /// Workload time of the last health change (or of the registration).
    #[serde(default)]
    pub health_since: SimTime,
}

/// What the fleet knows about a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuState {
    /// Model.
    pub model: GpuModel,
    /// Health.
    pub health: GpuHealth,
    /// Whether MIG mode is on.
    pub mig_enabled: bool,
    /// The layout the agent last reported applied.
    pub applied: Layout,
    /// Who its instances serve, as last reported.
    pub applied_assignments: Vec<Assignment>,
    /// The plan epoch of that report (0 before any plan).
    pub applied_epoch: u64,
    /// The committed target, if any.
    pub target: Option<GpuPlan>,
    /// The epoch of the target.
    pub target_epoch: u64,
    /// Each profile's memory as the node's driver reported it at registration, GiB; empty: the catalog's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub memory_gib: BTreeMap<Profile, f64>,
}

/// The replicated fleet state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetState {
    /// Model profiles by name.
    pub models: BTreeMap<String, ModelProfile>,
    /// Tenants.
    pub tenants: BTreeMap<TenantId, TenantSpec>,
    /// Deleted tenants still assigned by a committed target; removed once no target assigns them.
    pub retiring: BTreeSet<TenantId>,
    /// The last reported dynamic state of each tenant (accuracy, model version, retraining progress).
    pub tenant_status: BTreeMap<TenantId, TenantStatus>,
    /// Nodes.
    pub nodes: BTreeMap<NodeId, NodeState>,
    /// GPUs.
    pub gpus: BTreeMap<GpuId, GpuState>,
    /// The last committed plan epoch (0: none yet).
    pub plan_epoch: u64,
    /// When and by which policy the last plan was made.
    pub last_plan: Option<PlanSummary>,
}

/// A tenant's dynamic state, reported by the agents that run it and replicated so that a new leader plans from
/// it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantStatus {
    /// Accuracy of the model version now serving.
    pub accuracy: f64,
    /// Version of the serving model; increases with each completed retraining.
    pub model_version: u64,
    /// Work done on the current retraining, 7g GPU-seconds.
    pub retraining_done_gpu_s: f64,
    /// Workload time of the report.
    pub at: SimTime,
    /// Whether a retraining is due, when the agent knows (`None`: due while the work done is short of the job's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retraining_due: Option<bool>,
}

/// A committed plan's header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanSummary {
    /// Epoch.
    pub epoch: u64,
    /// Workload time it was made for.
    pub made_at: SimTime,
    /// Policy.
    pub policy: String,
    /// Total expected goodput.
    pub expected_goodput: f64,
}

/// A change to the fleet state, as replicated through Raft.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Command {
    /// Add or replace a model profile.
    PutModel {
        /// The profile.
        profile: ModelProfile,
    },
    /// Add a tenant.
    CreateTenant {
        /// The tenant.
        spec: TenantSpec,
    },
    /// Replace an existing tenant's spec.
    UpdateTenant {
        /// The new spec (its id names the tenant).
        spec: TenantSpec,
    },
    /// Remove a tenant.
    DeleteTenant {
        /// Which.
        id: TenantId,
    },
    /// A node (re)registers with its GPUs.
    RegisterNode {
        /// Node id.
        node: NodeId,
        /// Agent address.
        address: String,
        /// Its GPUs.
        gpus: Vec<GpuDescriptor>,
        /// Workload time of registration.
        at: SimTime,
    },
    /// A node leaves the fleet (decommissioned or declared lost); its GPUs go with it.
    RemoveNode {
        /// Node id.
        node: NodeId,
    },
    /// The failure detector's verdict on a node.
    SetNodeHealth {
        /// The node.
        node: NodeId,
        /// Its health.
        health: NodeHealth,
        /// Why, for operators.
        reason: String,
        /// Workload time of the verdict.
        at: SimTime,
    },
    /// Set a GPU's health.
    SetGpuHealth {
        /// The GPU.
        gpu: GpuId,
        /// Its health.
        health: GpuHealth,
    },
    /// Commit a plan.
    CommitPlan {
        /// The plan.
        plan: Plan,
    },
    /// An agent applied (part of) a target.
    LayoutApplied {
        /// The GPU.
        gpu: GpuId,
        /// The plan epoch the agent was working towards.
        epoch: u64,
        /// The layout it observes now.
        layout: Layout,
        /// Who its instances serve now.
        #[serde(default)]
        assignments: Vec<Assignment>,
    },
    /// A tenant's accuracy, model version and retraining progress.
    ReportTenantStatus {
        /// The tenant.
        tenant: TenantId,
        /// Its status.
        status: TenantStatus,
    },
}

/// What an accepted command changed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// A model profile was added (`replaced`: it existed).
    ModelPut {
        /// Name.
        name: String,
        /// Whether it replaced one.
        replaced: bool,
    },
    /// A tenant was created.
    TenantCreated {
        /// Id.
        id: TenantId,
    },
    /// A tenant was updated.
    TenantUpdated {
        /// Id.
        id: TenantId,
    },
    /// A tenant was deleted.
    TenantDeleted {
        /// Id.
        id: TenantId,
    },
    /// A tenant was deleted but committed targets still assign it: it is retired until a plan drops it.
    TenantRetiring {
        /// Id.
        id: TenantId,
        /// GPUs whose target still assigns it.
        assigned_on: Vec<GpuId>,
    },
    /// A tenant's status was recorded.
    TenantStatusRecorded {
        /// Id.
        id: TenantId,
    },
    /// A node registered (`known`: it had registered before).
    NodeRegistered {
        /// Id.
        node: NodeId,
        /// Whether it was known.
        known: bool,
        /// How many GPUs it has.
        gpus: usize,
    },
    /// A node was removed with its GPUs.
    NodeRemoved {
        /// Id.
        node: NodeId,
        /// The GPUs that went with it.
        gpus: Vec<GpuId>,
    },
    /// A node's health changed.
    NodeHealthSet {
        /// The node.
        node: NodeId,
        /// New health.
        health: NodeHealth,
    },
    /// A GPU's health changed.
    GpuHealthSet {
        /// The GPU.
        gpu: GpuId,
        /// New health.
        health: GpuHealth,
    },
    /// A plan was committed.
    PlanCommitted {
        /// Epoch.
        epoch: u64,
        /// GPUs with a new target.
        gpus: Vec<GpuId>,
        /// Retiring tenants removed because no target assigns them any more.
        tenants_removed: Vec<TenantId>,
    },
    /// An applied layout was recorded.
    LayoutRecorded {
        /// The GPU.
        gpu: GpuId,
        /// Epoch.
        epoch: u64,
        /// Whether the GPU now matches its target.
        converged: bool,
    },
}

/// Why a command was refused. The state is unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Rejected {
    /// A field of the command is invalid.
    #[error("invalid {what}: {error}")]
    Invalid {
        /// What was being validated (`tenant t1`, `model resnet50`).
        what: String,
        /// The field and what is wrong with it.
        error: FieldError,
    },
    /// A tenant with that id exists.
    #[error("tenant {0} already exists")]
    TenantExists(TenantId),
    /// No tenant with that id.
    #[error("no tenant {0}")]
    UnknownTenant(TenantId),
    /// The tenant's model profile is unknown.
    #[error("tenant {tenant}: unknown model `{model}` ({})", known_models(known))]
    UnknownModel {
        /// The tenant.
        tenant: TenantId,
        /// The model name.
        model: String,
        /// Known model names.
        known: Vec<String>,
    },
    /// The tenant's model fits no instance of any GPU in the fleet.
    #[error(
        "tenant {tenant}: model `{model}` needs {needed_gib} GiB for {role}; the largest instance in the fleet has {largest_gib} GiB"
    )]
    ModelFitsNoGpu {
        /// The tenant.
        tenant: TenantId,
        /// The model.
        model: String,
        /// Inference or retraining.
        role: Role,
        /// GiB needed.
        needed_gib: f64,
        /// Largest instance memory in the fleet.
        largest_gib: f64,
    },
    /// No node with that id.
    #[error("no node {0}")]
    UnknownNode(NodeId),
    /// No GPU with that id.
    #[error("no GPU {0}")]
    UnknownGpu(GpuId),
    /// A registration lists a device index twice.
    #[error("node {node}: GPU index {index} listed twice")]
    DuplicateGpuIndex {
        /// The node.
        node: NodeId,
        /// The index.
        index: u32,
    },
    /// The command breaks an invariant.
    #[error("{0}")]
    Violation(Violation),
    /// A plan assigns a tenant to an instance its model does not fit.
    #[error("{gpu}: {tenant}'s model `{model}` needs {needed_gib} GiB for {role}; {placement} has {available_gib} GiB")]
    DoesNotFit {
        /// The GPU.
        gpu: GpuId,
        /// The tenant.
        tenant: TenantId,
        /// Its model.
        model: String,
        /// The role.
        role: Role,
        /// The instance.
        placement: crate::layout::Placement,
        /// GiB needed.
        needed_gib: f64,
        /// GiB the instance has.
        available_gib: f64,
    },
    /// The tenant is retiring: it can be neither updated nor given new work.
    #[error("tenant {0} is being deleted: it can be neither updated nor given new work")]
    TenantRetiring(TenantId),
    /// A plan adds work to a draining GPU.
    #[error("{gpu} is draining: the plan may keep or remove its work but not add {assignment}")]
    GpuDraining {
        /// The GPU.
        gpu: GpuId,
        /// The new assignment.
        assignment: Assignment,
    },
    /// A status report is invalid or older than the recorded one.
    #[error("tenant {tenant}: status rejected: {reason}")]
    BadStatus {
        /// The tenant.
        tenant: TenantId,
        /// Why.
        reason: String,
    },
    /// A plan's GPU (or its node) is failed.
    #[error("{0} (or its node) is failed: plans may only empty it")]
    GpuFailed(GpuId),
    /// A node reported a memory figure for a profile its model lacks, or one that is not a size of its memory.
    #[error("{gpu}: the driver's memory for {profile}, {value} GiB, is not a memory size of this GPU")]
    BadDriverMemory {
        /// The GPU.
        gpu: GpuId,
        /// The profile.
        profile: Profile,
        /// The value.
        value: f64,
    },
    /// A plan's expected goodput is not a finite non-negative number.
    #[error("{gpu}: expected goodput {value} is not a finite non-negative number")]
    BadGoodput {
        /// The GPU.
        gpu: GpuId,
        /// The value.
        value: f64,
    },
    /// A conditional write found the tenant at another revision than the one the client read.
    #[error("tenant {tenant} is at revision {actual}, not {expected}: it changed since it was read")]
    RevisionMismatch {
        /// The tenant.
        tenant: TenantId,
        /// The revision the write was conditional on.
        expected: u64,
        /// Its revision now (0: it does not exist).
        actual: u64,
    },
    /// An applied-layout report older than one already recorded.
    #[error("{gpu}: report for epoch {epoch} is older than the recorded epoch {recorded}")]
    StaleReport {
        /// The GPU.
        gpu: GpuId,
        /// The report's epoch.
        epoch: u64,
        /// The recorded epoch.
        recorded: u64,
    },
    /// An applied-layout report for an epoch never committed.
    #[error("{gpu}: report for epoch {epoch} but the last committed plan is epoch {committed}")]
    FutureReport {
        /// The GPU.
        gpu: GpuId,
        /// The report's epoch.
        epoch: u64,
        /// The last committed epoch.
        committed: u64,
    },
}

impl From<Violation> for Rejected {
    fn from(v: Violation) -> Self {
        Rejected::Violation(v)
    }
}

impl FleetState {
    /// An empty fleet.
    pub fn new() -> FleetState {
        FleetState::default()
    }

    /// Applies `command`; on `Err` the state is unchanged.
    pub fn apply(&mut self, command: Command) -> Result<Event, Rejected> {
        let event = match command {
            Command::PutModel { profile } => self.put_model(profile)?,
            Command::CreateTenant { spec } => {
                if self.tenants.contains_key(&spec.id) {
                    return Err(Rejected::TenantExists(spec.id));
                }
                self.check_tenant(&spec)?;
                let id = spec.id.clone();
                self.tenants.insert(id.clone(), spec);
                Event::TenantCreated { id }
            }
            Command::UpdateTenant { spec } => {
                if !self.tenants.contains_key(&spec.id) {
                    return Err(Rejected::UnknownTenant(spec.id));
                }
                if self.retiring.contains(&spec.id) {
                    return Err(Rejected::TenantRetiring(spec.id));
                }
                self.check_tenant(&spec)?;
                if let Some(model) = self.models.get(&spec.model) {
                    self.check_held_instances_fit(&spec.id, model)?;
                }
                let id = spec.id.clone();
                self.tenants.insert(id.clone(), spec);
                Event::TenantUpdated { id }
            }
            Command::DeleteTenant { id } => {
                if !self.tenants.contains_key(&id) {
                    return Err(Rejected::UnknownTenant(id));
                }
                let assigned_on: Vec<GpuId> = self
                    .gpus
                    .iter()
                    .filter(|(_, g)| g.target.as_ref().is_some_and(|t| t.assignments.iter().any(|a| a.tenant == id)))
                    .map(|(gid, _)| gid.clone())
                    .collect();
                if assigned_on.is_empty() {
                    self.remove_tenant(&id);
                    Event::TenantDeleted { id }
                } else {
                    self.retiring.insert(id.clone());
                    Event::TenantRetiring { id, assigned_on }
                }
            }
            Command::RegisterNode { node, address, gpus, at } => self.register_node(node, address, gpus, at)?,
            Command::RemoveNode { node } => {
                let state = self.nodes.remove(&node).ok_or_else(|| Rejected::UnknownNode(node.clone()))?;
                let gpus: Vec<GpuId> = state.gpus.iter().map(|&i| GpuId::new(node.clone(), i)).collect();
                for g in &gpus {
                    self.gpus.remove(g);
                }
                Event::NodeRemoved { node, gpus }
            }
            Command::SetNodeHealth { node, health, reason, at } => {
                let n = self.nodes.get_mut(&node).ok_or_else(|| Rejected::UnknownNode(node.clone()))?;
                n.health = health;
                n.health_reason = reason;
                n.health_since = at;
                Event::NodeHealthSet { node, health }
            }
            Command::SetGpuHealth { gpu, health } => {
                let g = self.gpus.get_mut(&gpu).ok_or_else(|| Rejected::UnknownGpu(gpu.clone()))?;
                g.health = health;
                Event::GpuHealthSet { gpu, health }
            }
            Command::CommitPlan { plan } => self.commit_plan(plan)?,
            Command::LayoutApplied { gpu, epoch, layout, assignments } => {
                self.layout_applied(gpu, epoch, layout, assignments)?
            }
            Command::ReportTenantStatus { tenant, status } => self.tenant_status(tenant, status)?,
        };
        debug_assert_eq!(self.check_invariants(), Ok(()), "after {event:?}");
        Ok(event)
    }

    fn put_model(&mut self, profile: ModelProfile) -> Result<Event, Rejected> {
        validate_model_profile(&profile)
            .map_err(|error| Rejected::Invalid { what: format!("model {}", profile.name), error })?;
        for t in self.tenants.values().filter(|t| t.model == profile.name) {
            self.check_held_instances_fit(&t.id, &profile)?;
        }
        let name = profile.name.clone();
        let replaced = self.models.insert(name.clone(), profile).is_some();
        Ok(Event::ModelPut { name, replaced })
    }

    fn check_tenant(&self, spec: &TenantSpec) -> Result<(), Rejected> {
        validate_tenant(spec).map_err(|error| Rejected::Invalid { what: format!("tenant {}", spec.id), error })?;
        let model = self.models.get(&spec.model).ok_or_else(|| Rejected::UnknownModel {
            tenant: spec.id.clone(),
            model: spec.model.clone(),
            known: self.models.keys().cloned().collect(),
        })?;
        let largest_gib = self.gpus.values().map(|g| g.model.spec().memory_gib).fold(0.0, f64::max);
        let mut needs = vec![(Role::Inference, model.inference_memory_gib)];
        if spec.retraining.is_some() {
            needs.push((Role::Retraining, model.training_memory_gib));
        }
        for (role, needed_gib) in needs {
            if !self.gpus.is_empty() && needed_gib > largest_gib {
                return Err(Rejected::ModelFitsNoGpu {
                    tenant: spec.id.clone(),
                    model: spec.model.clone(),
                    role,
                    needed_gib,
                    largest_gib,
                });
            }
        }
        Ok(())
    }

    /// Every instance a committed target gives `tenant` still fits `model`.
    fn check_held_instances_fit(&self, tenant: &TenantId, model: &ModelProfile) -> Result<(), Rejected> {
        for (gid, g) in &self.gpus {
            for a in g.target.iter().flat_map(|t| &t.assignments).filter(|a| &a.tenant == tenant) {
                check_fit(gid, g.model, a, model)?;
            }
        }
        Ok(())
    }

    fn remove_tenant(&mut self, id: &TenantId) {
        self.tenants.remove(id);
        self.tenant_status.remove(id);
        self.retiring.remove(id);
    }

    fn tenant_status(&mut self, tenant: TenantId, status: TenantStatus) -> Result<Event, Rejected> {
        if !self.tenants.contains_key(&tenant) {
            return Err(Rejected::UnknownTenant(tenant));
        }
        let bad = |reason: String| Rejected::BadStatus { tenant: tenant.clone(), reason };
        if !(0.0..=1.0).contains(&status.accuracy) {
            return Err(bad(format!("accuracy {} is not in [0, 1]", status.accuracy)));
        }
        if !status.retraining_done_gpu_s.is_finite() || status.retraining_done_gpu_s < 0.0 {
            return Err(bad(format!(
                "retraining progress {} is not a non-negative number",
                status.retraining_done_gpu_s
            )));
        }
        if let Some(old) = self.tenant_status.get(&tenant) {
            if status.at < old.at {
                return Err(bad(format!("report at {} is older than the recorded one at {}", status.at, old.at)));
            }
            if status.model_version < old.model_version {
                return Err(bad(format!("model version {} is older than {}", status.model_version, old.model_version)));
            }
        }
        self.tenant_status.insert(tenant.clone(), status);
        Ok(Event::TenantStatusRecorded { id: tenant })
    }

    fn register_node(
        &mut self,
        node: NodeId,
        address: String,
        gpus: Vec<GpuDescriptor>,
        at: SimTime,
    ) -> Result<Event, Rejected> {
        let mut indices: Vec<u32> = Vec::with_capacity(gpus.len());
        for g in &gpus {
            if indices.contains(&g.index) {
                return Err(Rejected::DuplicateGpuIndex { node, index: g.index });
            }
            indices.push(g.index);
            invariants::layout_valid_for_model(&GpuId::new(node.clone(), g.index), g.model, &g.layout)?;
            // A driver's memory figure is believed for a profile the model has, within the whole GPU's memory.
            for (profile, gib) in &g.memory_gib {
                let whole = g.model.spec().memory_gib * 1.05;
                if g.model.profile(*profile).is_none() || !gib.is_finite() || *gib <= 0.0 || *gib > whole {
                    return Err(Rejected::BadDriverMemory {
                        gpu: GpuId::new(node.clone(), g.index),
                        profile: *profile,
                        value: *gib,
                    });
                }
            }
        }
        let known = self.nodes.contains_key(&node);
        if let Some(old) = self.nodes.get(&node) {
            for i in old.gpus.iter().filter(|i| !indices.contains(i)) {
                self.gpus.remove(&GpuId::new(node.clone(), *i));
            }
        }
        let count = gpus.len();
        for d in gpus {
            let id = GpuId::new(node.clone(), d.index);
            match self.gpus.get_mut(&id) {
                // Same hardware: keep health, target and epochs; take the observed layout.
                Some(g) if g.model == d.model => {
                    g.mig_enabled = d.mig_enabled;
                    g.memory_gib = d.memory_gib;
                    g.applied_assignments.retain(|a| d.layout.contains(a.placement));
                    g.applied = d.layout;
                }
                _ => {
                    self.gpus.insert(
                        id,
                        GpuState {
                            model: d.model,
                            health: GpuHealth::Healthy,
                            mig_enabled: d.mig_enabled,
                            applied: d.layout,
                            applied_assignments: Vec::new(),
                            applied_epoch: 0,
                            target: None,
                            target_epoch: 0,
                            memory_gib: d.memory_gib,
                        },
                    );
                }
            }
        }
        indices.sort_unstable();
        // A node that registers again keeps the failure detector's verdict until the leader sees it heartbeat.
        let (health, health_reason, health_since) = match self.nodes.get(&node) {
            Some(n) => (n.health, n.health_reason.clone(), n.health_since),
            None => (NodeHealth::Healthy, String::new(), at),
        };
        self.nodes.insert(
            node.clone(),
            NodeState { address, registered_at: at, gpus: indices, health, health_reason, health_since },
        );
        Ok(Event::NodeRegistered { node, known, gpus: count })
    }

    fn commit_plan(&mut self, plan: Plan) -> Result<Event, Rejected> {
        invariants::plan_epochs_never_decrease(self.plan_epoch, plan.epoch)?;
        for (id, gp) in &plan.gpus {
            let gpu = self.gpus.get(id).ok_or_else(|| Rejected::UnknownGpu(id.clone()))?;
            let node_failed = self.nodes.get(&id.node).is_some_and(|n| n.health == NodeHealth::Failed);
            if (gpu.health == GpuHealth::Failed || node_failed) && !gp.layout.is_empty() {
                return Err(Rejected::GpuFailed(id.clone()));
            }
            let current = gpu.target.as_ref().map_or(&[][..], |t| t.assignments.as_slice());
            if gpu.health == GpuHealth::Draining
                && let Some(a) = gp.assignments.iter().find(|a| !current.contains(a))
            {
                return Err(Rejected::GpuDraining { gpu: id.clone(), assignment: a.clone() });
            }
            if !gp.expected_goodput.is_finite() || gp.expected_goodput < 0.0 {
                return Err(Rejected::BadGoodput { gpu: id.clone(), value: gp.expected_goodput });
            }
            invariants::check_gpu_plan(id, gpu.model, gp)?;
            for a in &gp.assignments {
                let tenant = self.tenants.get(&a.tenant).ok_or_else(|| Rejected::UnknownTenant(a.tenant.clone()))?;
                if self.retiring.contains(&a.tenant) && !current.contains(a) {
                    return Err(Rejected::TenantRetiring(a.tenant.clone()));
                }
                // A tenant whose model profile was never put is caught at tenant creation.
                if let Some(model) = self.models.get(&tenant.model) {
                    check_fit(id, gpu.model, a, model)?;
                }
            }
        }
        let gpus: Vec<GpuId> = plan.gpus.keys().cloned().collect();
        self.plan_epoch = plan.epoch;
        self.last_plan = Some(PlanSummary {
            epoch: plan.epoch,
            made_at: plan.made_at,
            policy: plan.policy.clone(),
            expected_goodput: plan.expected_goodput(),
        });
        for (id, gp) in plan.gpus {
            let g = self.gpus.get_mut(&id).expect("checked above");
            g.target = Some(gp);
            g.target_epoch = plan.epoch;
        }
        let still_assigned: BTreeSet<&TenantId> =
            self.gpus.values().flat_map(|g| g.target.iter().flat_map(|t| &t.assignments)).map(|a| &a.tenant).collect();
        let tenants_removed: Vec<TenantId> =
            self.retiring.iter().filter(|t| !still_assigned.contains(t)).cloned().collect();
        for t in &tenants_removed {
            self.remove_tenant(t);
        }
        Ok(Event::PlanCommitted { epoch: plan.epoch, gpus, tenants_removed })
    }

    fn layout_applied(
        &mut self,
        gpu: GpuId,
        epoch: u64,
        layout: Layout,
        mut assignments: Vec<Assignment>,
    ) -> Result<Event, Rejected> {
        let g = self.gpus.get(&gpu).ok_or_else(|| Rejected::UnknownGpu(gpu.clone()))?;
        if epoch < g.applied_epoch {
            return Err(Rejected::StaleReport { gpu, epoch, recorded: g.applied_epoch });
        }
        if epoch > self.plan_epoch {
            return Err(Rejected::FutureReport { gpu, epoch, committed: self.plan_epoch });
        }
        invariants::layout_valid_for_model(&gpu, g.model, &layout)?;
        // An agent may report one tenant's inference and retraining on one instance only where its target shares.
        let sharing = g.target.as_ref().map_or(Default::default(), |t| t.sharing);
        invariants::placement_serves_at_most_one_role(&gpu, &layout, &assignments, sharing)?;
        assignments.sort();
        let g = self.gpus.get_mut(&gpu).expect("checked above");
        let converged = epoch == g.target_epoch
            && g.target.as_ref().is_some_and(|t| {
                let mut want = t.assignments.clone();
                want.sort();
                t.layout == layout && want == assignments
            });
        g.applied = layout;
        g.applied_assignments = assignments;
        g.applied_epoch = epoch;
        Ok(Event::LayoutRecorded { gpu, epoch, converged })
    }

    /// Checks every invariant over the whole state.
    pub fn check_invariants(&self) -> Result<(), Violation> {
        for (id, g) in &self.gpus {
            invariants::no_slice_used_twice(id, &g.applied)?;
            invariants::layout_valid_for_model(id, g.model, &g.applied)?;
            if let Some(t) = &g.target {
                invariants::check_gpu_plan(id, g.model, t)?;
                invariants::assignments_name_known_tenants(id, &t.assignments, |t| self.tenants.contains_key(t))?;
                if g.target_epoch > self.plan_epoch {
                    return Err(Violation::EpochWentBack { previous: g.target_epoch, next: self.plan_epoch });
                }
            }
        }
        Ok(())
    }

    /// Tenants that can be planned: known and not retiring, in id order.
    pub fn active_tenants(&self) -> impl Iterator<Item = &TenantSpec> {
        self.tenants.values().filter(|t| !self.retiring.contains(&t.id))
    }

    /// The epochs of `tenant`'s retraining where a GPU reports it on a retraining instance, as that GPU's target
    /// chose them (`GpuPlan::retraining_epochs`; the agent takes the epochs of each plan that gives the tenant a
    /// retraining instance, its later steps included): the configuration its agent runs. `None` where no GPU
    /// reports one (in-process replay reads the executor alike: a retraining on an instance now) or the target
    /// keeps the spec's default.
    pub fn retraining_epochs(&self, tenant: &TenantId) -> Option<f64> {
        self.gpus.values().find_map(|g| {
            g.applied_assignments
                .iter()
                .any(|a| &a.tenant == tenant && a.role == Role::Retraining)
                .then(|| g.target.as_ref()?.retraining_epochs.get(tenant).copied())
                .flatten()
        })
    }
}

/// Whether the model of `a`'s tenant fits its instance on a GPU of `gpu_model`, for its role.
fn check_fit(gpu: &GpuId, gpu_model: GpuModel, a: &Assignment, model: &ModelProfile) -> Result<(), Rejected> {
    let spec = gpu_model.profile(a.placement.profile).expect("validated layout");
    let (fits, needed_gib) = match a.role {
        Role::Inference => (model.fits_inference(spec), model.inference_memory_gib),
        Role::Retraining => (model.fits_training(spec), model.training_memory_gib),
    };
    if fits {
        return Ok(());
    }
    Err(Rejected::DoesNotFit {
        gpu: gpu.clone(),
        tenant: a.tenant.clone(),
        model: model.name.clone(),
        role: a.role,
        placement: a.placement,
        needed_gib,
        available_gib: spec.memory_gib,
    })
}
/// The known models as an error message lists them, or what to do when there are none.
fn known_models(known: &[String]) -> String {
    if known.is_empty() {
        "no model profiles are loaded: start the coordinator with --models-dir (or models_dir in its config)".into()
    } else {
        format!("known: {}", known.join(", "))
    }
}
