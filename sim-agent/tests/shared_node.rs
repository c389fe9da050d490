//! Simulated nodes over a shared executor (`tessera_sim::shared_node`): the agent's real `Reconciler` hands each
//! accepted target to the executor once, keeps the agent's epoch rules, and reports the executor's state.

use std::collections::BTreeMap;
use std::sync::Arc;

use tessera_agent::backend::{BackendError, MigBackend};
use tessera_agent::reconcile::{Acceptance, ReconcileError, Reconciler};
use tessera_agent::workload::Workload;
use tessera_core::GpuModel;
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::model::{LatencyModel, ModelProfile, TrainingSpeed};
use tessera_core::plan::{Assignment, GpuPlan, Role};
use tessera_core::tenant::{DemandSource, TenantSpec};
use tessera_sim::executor::{Executor, ExecutorConfig, FleetSpec, NoInterference};
use tessera_sim::shared_node::{ExecutorNode, NodeGpu, SharedFleet, lock};

fn tenant(id: &str) -> TenantSpec {
    TenantSpec {
        jobs: Default::default(),
        pin: Default::default(),
        id: TenantId::new(id).unwrap(),
        name: id.into(),
        model: "m".into(),
        slo_ms: 100.0,
        slo_percentile: 99.0,
        weight: 1.0,
        demand: DemandSource::Poisson { rate_rps: 0.0 },
        retraining: None,
    }
}

fn plan(layout: &str, assignments: &[(&str, &str)]) -> GpuPlan {
    GpuPlan {
        layout: layout.parse().unwrap(),
        assignments: assignments
            .iter()
            .map(|(p, t)| Assignment {
                placement: p.parse().unwrap(),
                tenant: TenantId::new(*t).unwrap(),
                role: Role::Inference,
                preinit: false,
            })
            .collect(),
        expected_goodput: 0.0,
        explanation: String::new(),
        upcoming: Vec::new(),
        retraining_epochs: BTreeMap::new(),
        sharing: Default::default(),
    }
}

/// Two nodes of one GPU each over one executor with tenants `a` and `b`; node 0 reports the tenants.
struct Setup {
    fleet: Arc<std::sync::Mutex<SharedFleet>>,
    nodes: Vec<(Arc<ExecutorNode>, Reconciler)>,
    _dir: tempfile::TempDir,
}

fn setup() -> Setup {
    let model = ModelProfile {
        name: "m".into(),
        description: String::new(),
        inference_memory_gib: 1.0,
        training_memory_gib: 4.0,
        max_batch: 4,
        latency: LatencyModel::Parametric { base_ms: 10.0, alpha: 1.0, beta: 0.1 },
        training: TrainingSpeed::Exponent(1.0),
    };
    let gpus: Vec<GpuId> = vec!["n0/0".parse().unwrap(), "n1/0".parse().unwrap()];
    let spec = FleetSpec {
        models: BTreeMap::from([("m".to_string(), model)]),
        tenants: vec![tenant("a"), tenant("b")],
        gpus: gpus.iter().map(|g| (g.clone(), GpuModel::A100_40GB)).collect(),
    };
    let exec = Executor::new(ExecutorConfig::default(), spec, Box::new(NoInterference)).unwrap();
    let fleet = SharedFleet::new(exec);
    let dir = tempfile::tempdir().unwrap();
    let nodes = gpus
        .iter()
        .enumerate()
        .map(|(k, id)| {
            let exec_ix = lock(&fleet).exec.gpu_index(id).unwrap();
            let gpu = NodeGpu { index: 0, id: id.clone(), exec: exec_ix, model: GpuModel::A100_40GB };
            let node = Arc::new(ExecutorNode::new(id.node.clone(), vec![gpu], Arc::clone(&fleet), k == 0));
            let r = Reconciler::new(id.node.clone(), node.clone(), node.clone(), &dir.path().join(id.node.as_str()))
                .unwrap();
            (node, r)
        })
        .collect();
    Setup { fleet, nodes, _dir: dir }
}

#[test]
fn an_accepted_target_is_handed_to_the_executor_once_and_reported_as_the_executor_runs_it() {
    let s = setup();
    let (_, r) = &s.nodes[0];
    let target = plan("3g@0 3g@4", &[("3g@0", "a"), ("3g@4", "b")]);
    assert_eq!(r.accept(1, BTreeMap::from([(0, target.clone())])).unwrap(), Acceptance::Accepted);
    let report = r.reconcile().unwrap();
    assert!(report.converged && report.errors.is_empty(), "{report:?}");
    assert_eq!(report.steps, 1, "one hand-over, no single MIG call");
    let taken = std::mem::take(&mut lock(&s.fleet).taken);
    assert_eq!(taken, vec![("n0/0".parse().unwrap(), target.clone())]);
    {
        let f = lock(&s.fleet);
        let g = f.exec.gpu_index(&"n0/0".parse().unwrap()).unwrap();
        assert_eq!(f.exec.gpu_layout(g).to_string(), "3g@0 3g@4", "the executor creates the instances at once");
    }
    // The status is the executor's state, by placement, and the epoch counts as applied.
    let status = r.status();
    assert_eq!((status.epoch, status.applied_epoch), (1, 1));
    let gpu = &status.gpus[&0];
    assert!(gpu.converged);
    let work: Vec<(String, String)> = gpu
        .instances
        .iter()
        .map(|i| (i.instance.placement.to_string(), i.work.iter().map(|w| w.tenant.to_string()).collect()))
        .collect();
    assert_eq!(work, vec![("3g@0".into(), "a".into()), ("3g@4".into(), "b".into())]);

    // Another pass, or the same epoch pushed again, hands nothing over.
    assert_eq!(r.reconcile().unwrap().steps, 0);
    assert_eq!(r.accept(1, BTreeMap::from([(0, target)])).unwrap(), Acceptance::AlreadyAccepted);
    assert_eq!(r.reconcile().unwrap().steps, 0);
    assert!(lock(&s.fleet).taken.is_empty());
}

#[test]
fn the_agents_epoch_rules_and_validation_guard_the_executor() {
    let s = setup();
    let (_, r) = &s.nodes[0];
    let first = plan("7g@0", &[("7g@0", "a")]);
    r.accept(5, BTreeMap::from([(0, first)])).unwrap();
    // An older epoch is refused; the same epoch with other targets is a conflict; a GPU the node lacks and a
    // target that breaks a plan invariant (two tenants on one instance) are refused before anything reaches the
    // executor.
    let other = plan("3g@0", &[("3g@0", "a")]);
    assert_eq!(r.accept(4, BTreeMap::from([(0, other.clone())])).unwrap(), Acceptance::Stale { current: 5 });
    assert!(matches!(r.accept(5, BTreeMap::from([(0, other.clone())])), Err(ReconcileError::EpochConflict { .. })));
    assert!(matches!(r.accept(6, BTreeMap::from([(3, other)])), Err(ReconcileError::UnknownGpu { gpu: 3, .. })));
    let shared = plan("7g@0", &[("7g@0", "a"), ("7g@0", "b")]);
    assert!(matches!(r.accept(6, BTreeMap::from([(0, shared)])), Err(ReconcileError::InvalidTarget { .. })));
    r.reconcile().unwrap();
    assert_eq!(lock(&s.fleet).taken.len(), 1, "only epoch 5 reached the executor");
    assert_eq!(r.status().epoch, 5);
}

#[test]
fn a_target_the_executor_refuses_is_a_gpu_error_and_is_not_taken() {
    let s = setup();
    let (_, r) = &s.nodes[1];
    // Tenant `z` is not one the executor serves: the agent accepts the target (it knows no tenants), the
    // executor refuses it, and the pass reports the GPU's error.
    r.accept(1, BTreeMap::from([(0, plan("7g@0", &[("7g@0", "z")]))])).unwrap();
    let report = r.reconcile().unwrap();
    assert!(!report.converged);
    assert_eq!(report.errors.len(), 1, "{report:?}");
    assert!(report.errors[0].1.contains("apply a target"), "{}", report.errors[0].1);
    assert!(lock(&s.fleet).taken.is_empty());
    assert_eq!(r.status().applied_epoch, 0);
}

#[test]
fn only_the_reporting_node_reports_tenants_and_slot_rates_are_reported_once() {
    let s = setup();
    let (reporting, _) = &s.nodes[0];
    let (quiet, _) = &s.nodes[1];
    lock(&s.fleet).slot_rates = vec![vec![1.5, 2.0], vec![0.5]];
    assert!(quiet.metrics().tenants.is_empty());
    let m = reporting.metrics();
    let a = &m.tenants[&TenantId::new("a").unwrap()];
    assert_eq!(a.slot_rates, vec![1.5, 2.0]);
    assert_eq!(a.retraining_due, Some(false));
    assert_eq!(m.tenants[&TenantId::new("b").unwrap()].slot_rates, vec![0.5]);
    assert!(reporting.metrics().tenants.values().all(|c| c.slot_rates.is_empty()), "taken by the first report");
}

#[test]
fn single_mig_calls_and_workload_calls_are_refused() {
    let s = setup();
    let (node, _) = &s.nodes[0];
    assert!(node.applies_whole_targets());
    let e = node.create_instance(0, "1g@0".parse().unwrap()).unwrap_err();
    assert!(matches!(e, BackendError::Driver { .. }), "{e}");
    assert!(matches!(node.instances(9), Err(BackendError::NoSuchGpu { gpu: 9, count: 1 })));
    assert_eq!(node.set_mig_mode(0, true).unwrap(), tessera_agent::backend::MigMode::ENABLED);
    assert!(node.set_mig_mode(0, false).is_err());
    assert_eq!(node.node(), &NodeId::new("n0").unwrap());
}
