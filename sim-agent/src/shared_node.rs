//! Simulated nodes over one shared workload executor: each node is a real agent (`tessera-agent`'s `Reconciler`
//! and gRPC `Agent` service) whose [`MigBackend`] and [`Workload`] are its GPUs in a fleet-wide [`Executor`].
//!
//! Replay's cluster mode runs a trace's requests through these nodes, so that the layouts come from a coordinator
//! cluster and reach the simulated GPUs through the agent's epoch rules, validation, state file and reports, while
//! the requests are served by the same executor, with the same timing, as in-process replay.
//!
//! The executor models a reconfiguration as a whole: a drain lasts as long as the requests in flight, a create
//! waits for its slices, work warms up, a pre-initialised instance takes over when warm, all in virtual time. So an
//! [`ExecutorNode`] takes whole targets ([`MigBackend::applies_whole_targets`]): the reconciler hands each target
//! over once and the executor carries it out (`Executor::apply_plan`). Reads show the executor's state as it is:
//! the instances on the simulated device (one being drained for destruction included) and, per instance, the work
//! it runs or is switching to (`Executor::gpu_assignments`), which is what in-process replay plans from.
//!
//! What it does not do: single MIG calls (`create_instance`, `destroy_instance` and `set_mig_mode` are refused: the
//! step-by-step path runs over [`crate::node::PersistentSim`] in `sim-agent run`), take requests through the agent
//! (the fleet's owner feeds them to the executor), or move the clock (the owner advances the executor; a node
//! reports the executor's time).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tessera_agent::backend::{BackendError, GpuInfo, GpuInstance, InstanceId, MigBackend, MigMode, Operation};
use tessera_agent::workload::{TenantCounters, Workload, WorkloadError, WorkloadMetrics};
use tessera_core::catalog::GpuModel;
use tessera_core::ids::{GpuId, NodeId};
use tessera_core::layout::Placement;
use tessera_core::plan::GpuPlan;
use tessera_core::reconfig::Work;

use crate::executor::{Executor, GpuIndex};

/// The executor behind a group of nodes, with what they hand to and take from its owner.
pub struct SharedFleet {
    /// The workload executor: every GPU of every node.
    pub exec: Executor,
    /// Targets the nodes have handed to the executor since the owner last took them, in order.
    pub taken: Vec<(GpuId, GpuPlan)>,
    /// Per tenant (executor order): the measured arrival rates of the planner slots completed since the last
    /// report. The node that reports tenants takes them with its next metrics.
    pub slot_rates: Vec<Vec<f64>>,
}

impl SharedFleet {
    /// A fleet over `exec`, shareable by its nodes.
    pub fn new(exec: Executor) -> Arc<Mutex<SharedFleet>> {
        Arc::new(Mutex::new(SharedFleet { exec, taken: Vec::new(), slot_rates: Vec::new() }))
    }
}

/// Locks the shared fleet (a panic elsewhere does not make it unusable: its state is checked by the executor).
pub fn lock(fleet: &Mutex<SharedFleet>) -> MutexGuard<'_, SharedFleet> {
    fleet.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One GPU of a node: its NVML-style index, its fleet id, its index in the executor and its model.
#[derive(Debug, Clone)]
pub struct NodeGpu {
    /// The index on the node.
    pub index: u32,
    /// The fleet-wide id.
    pub id: GpuId,
    /// The executor's index.
    pub exec: GpuIndex,
    /// The model.
    pub model: GpuModel,
}

/// One simulated node's GPUs in the shared executor: its agent's backend and workload (see the
/// [module documentation](self)).
pub struct ExecutorNode {
    node: NodeId,
    gpus: Vec<NodeGpu>,
    fleet: Arc<Mutex<SharedFleet>>,
    reports_tenants: bool,
}

impl ExecutorNode {
    /// Node `node` with `gpus` of `fleet`. Exactly one node of a fleet should `report_tenants`: the executor's
    /// per-tenant counters are fleet-wide, and the coordinator would otherwise see them once per node.
    pub fn new(node: NodeId, gpus: Vec<NodeGpu>, fleet: Arc<Mutex<SharedFleet>>, report_tenants: bool) -> ExecutorNode {
        ExecutorNode { node, gpus, fleet, reports_tenants: report_tenants }
    }

    /// The node's id.
    pub fn node(&self) -> &NodeId {
        &self.node
    }

    fn gpu(&self, index: u32) -> Result<&NodeGpu, BackendError> {
        self.gpus
            .iter()
            .find(|g| g.index == index)
            .ok_or(BackendError::NoSuchGpu { gpu: index, count: self.gpus.len() as u32 })
    }

    fn single_calls(&self, gpu: u32, operation: Operation) -> BackendError {
        BackendError::Driver {
            gpu,
            operation,
            detail: format!("simulated node {} takes whole targets, not single MIG calls", self.node),
        }
    }
}

impl MigBackend for ExecutorNode {
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let f = lock(&self.fleet);
        Ok(self
            .gpus
            .iter()
            .map(|g| {
                let device = f.exec.device(g.exec);
                GpuInfo { index: g.index, name: device.info().name, model: Some(g.model), mig: Some(MigMode::ENABLED) }
            })
            .collect())
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, BackendError> {
        let g = self.gpu(gpu)?;
        let f = lock(&self.fleet);
        let mut v: Vec<GpuInstance> = f.exec.device(g.exec).instances().map(|i| i.as_gpu_instance()).collect();
        v.sort_by_key(|i| i.placement);
        Ok(v)
    }

    fn create_instance(&self, gpu: u32, _placement: Placement) -> Result<GpuInstance, BackendError> {
        Err(self.single_calls(gpu, Operation::Create))
    }

    fn destroy_instance(&self, gpu: u32, _instance: InstanceId) -> Result<(), BackendError> {
        Err(self.single_calls(gpu, Operation::Destroy))
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode, BackendError> {
        self.gpu(gpu)?;
        if enabled { Ok(MigMode::ENABLED) } else { Err(self.single_calls(gpu, Operation::SetMigMode)) }
    }

    fn applies_whole_targets(&self) -> bool {
        true
    }

    fn apply_target(&self, gpu: u32, plan: &GpuPlan) -> Result<(), BackendError> {
        let g = self.gpu(gpu)?;
        let mut f = lock(&self.fleet);
        f.exec.apply_plan(&g.id, plan).map_err(|e| BackendError::Driver {
            gpu,
            operation: Operation::ApplyTarget,
            detail: e.to_string(),
        })?;
        f.taken.push((g.id.clone(), plan.clone()));
        Ok(())
    }
}

impl Workload for ExecutorNode {
    fn loaded(&self, gpu: u32) -> BTreeMap<Placement, Vec<Work>> {
        let Ok(g) = self.gpu(gpu) else { return BTreeMap::new() };
        let f = lock(&self.fleet);
        let mut out: BTreeMap<Placement, Vec<Work>> = BTreeMap::new();
        for a in f.exec.gpu_assignments(g.exec) {
            out.entry(a.placement).or_default().push(Work { tenant: a.tenant, role: a.role });
        }
        out
    }

    fn load(&self, gpu: u32, instance: &GpuInstance, _work: &[Work]) -> Result<(), WorkloadError> {
        Err(WorkloadError::Instance {
            gpu,
            placement: instance.placement,
            message: format!("simulated node {} takes whole targets; the executor loads the work", self.node),
        })
    }

    fn drain(&self, gpu: u32, instance: &GpuInstance) -> Result<(), WorkloadError> {
        Err(WorkloadError::Instance {
            gpu,
            placement: instance.placement,
            message: format!("simulated node {} takes whole targets; the executor drains the work", self.node),
        })
    }

    fn ready(&self, gpu: u32, placement: Placement) -> bool {
        self.loaded(gpu).contains_key(&placement)
    }

    fn retain(&self, _gpu: u32, _live: &[Placement]) {
        // The executor's instances are the truth; nothing is kept here.
    }

    fn metrics(&self) -> WorkloadMetrics {
        let mut f = lock(&self.fleet);
        let now_ms = f.exec.now_ms().round() as u64;
        if !self.reports_tenants {
            return WorkloadMetrics { now_ms, tenants: BTreeMap::new() };
        }
        let slot_rates = std::mem::take(&mut f.slot_rates);
        let tenants = f
            .exec
            .tenant_ids()
            .map(|(i, id)| {
                let m = f.exec.tenant_metrics(i);
                let st = f.exec.tenant_state(i);
                let counters = TenantCounters {
                    arrivals: m.ledger.requests,
                    served_within_slo: m.ledger.within_slo,
                    dropped: m.ledger.dropped,
                    queued: st.queued,
                    retraining_done_gpu_s: st.retraining_done_gpu_s,
                    serving_instances: st.serving_instances,
                    retraining_instances: 0,
                    accuracy: st.accuracy,
                    model_version: m.retrainings_completed,
                    retraining_due: Some(st.retraining_due),
                    slot_rates: slot_rates.get(i.0 as usize).cloned().unwrap_or_default(),
                };
                (id.clone(), counters)
            })
            .collect();
        WorkloadMetrics { now_ms, tenants }
    }

    fn now_ms(&self) -> u64 {
        lock(&self.fleet).exec.now_ms().round() as u64
    }

    fn advance_to(&self, _to_ms: u64) -> Result<u64, WorkloadError> {
        // The fleet's owner moves the executor with the arrivals it feeds; a node's clock only follows.
        Ok(self.now_ms())
    }
}
