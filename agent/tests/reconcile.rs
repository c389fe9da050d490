//! The reconcile pass: ordering (drain before destroy, unchanged instances untouched), epochs (persisted, never
//! overridden by an older one), pre-initialisation, and crash safety: a failure injected before and after every
//! mutating call of a reconfiguration, then a fresh reconciler over the same GPU, workload and data directory
//! converges without touching what it must not.
//!
//! The backend here is a small in-memory GPU that follows core's placement rules and refuses to destroy an
//! instance with work on it (`InUse`), so a missing drain fails the test.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tessera_agent::backend::{BackendError, GpuInfo, GpuInstance, InstanceId, MigBackend, MigMode, Operation};
use tessera_agent::reconcile::{Acceptance, GpuOutcome, ReconcileError, Reconciler};
use tessera_agent::workload::{Workload, WorkloadError, WorkloadMetrics};
use tessera_core::catalog::GpuModel;
use tessera_core::ids::{NodeId, TenantId};
use tessera_core::layout::{Layout, Placement};
use tessera_core::plan::{Assignment, GpuPlan, Role};
use tessera_core::reconfig::Work;

/// What happened on the GPU, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Created(Placement, InstanceId),
    Destroyed(Placement, InstanceId),
    Loaded(Placement),
    Drained(Placement),
}

#[derive(Default)]
struct GpuState {
    instances: BTreeMap<InstanceId, (Placement, bool)>,
    next_id: u32,
    loaded: BTreeMap<Placement, Vec<Work>>,
    warm: BTreeMap<Placement, bool>,
    events: Vec<Event>,
}

/// One A100-40GB; `fail_at` makes the k-th mutating call (create, destroy, load, drain; counted from 0) fail,
/// before or after taking effect.
#[derive(Default)]
struct Node {
    gpu: Mutex<GpuState>,
    calls: AtomicUsize,
    fail_at: Mutex<Option<(usize, bool)>>,
    /// Whether loaded work is warm at once (false: warm only when `warm_up` is called).
    cold_loads: bool,
}

impl Node {
    fn crash_check(&self, before: bool) -> Result<(), String> {
        let k = self.calls.load(Ordering::SeqCst);
        match *self.fail_at.lock().unwrap() {
            Some((at, after)) if at == k && after != before => Err(format!("injected crash at call {k}")),
            _ => Ok(()),
        }
    }

    fn mutate<T>(&self, f: impl FnOnce(&mut GpuState) -> Result<T, String>) -> Result<T, String> {
        self.crash_check(true)?;
        let out = f(&mut self.gpu.lock().unwrap())?;
        self.crash_check(false)?;
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(out)
    }

    fn layout(&self) -> Layout {
        self.gpu.lock().unwrap().instances.values().map(|(p, _)| *p).collect()
    }

    fn events(&self) -> Vec<Event> {
        self.gpu.lock().unwrap().events.clone()
    }

    fn id_of(&self, p: &str) -> InstanceId {
        let p: Placement = p.parse().unwrap();
        *self.gpu.lock().unwrap().instances.iter().find(|(_, (q, _))| *q == p).unwrap().0
    }
}

fn driver(op: Operation, detail: String) -> BackendError {
    BackendError::Driver { gpu: 0, operation: op, detail }
}

struct Backend(Arc<Node>);
struct Load(Arc<Node>);

impl MigBackend for Backend {
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        Ok(vec![GpuInfo {
            index: 0,
            name: "NVIDIA A100-SXM4-40GB".into(),
            model: Some(GpuModel::A100_40GB),
            mig: Some(MigMode::ENABLED),
        }])
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, BackendError> {
        assert_eq!(gpu, 0);
        let g = self.0.gpu.lock().unwrap();
        let mut v: Vec<GpuInstance> =
            g.instances.iter().map(|(id, (p, _))| GpuInstance { id: *id, placement: *p, uuid: None }).collect();
        v.sort_by_key(|i| i.placement);
        Ok(v)
    }

    fn create_instance(&self, _gpu: u32, placement: Placement) -> Result<GpuInstance, BackendError> {
        let layout = self.0.layout();
        if !layout.can_add(GpuModel::A100_40GB, placement) {
            return Err(BackendError::InsufficientResources { gpu: 0, placement, reason: None });
        }
        self.0
            .mutate(|g| {
                let id = InstanceId(g.next_id);
                g.next_id += 1;
                g.instances.insert(id, (placement, false));
                g.events.push(Event::Created(placement, id));
                Ok(GpuInstance { id, placement, uuid: None })
            })
            .map_err(|e| driver(Operation::Create, e))
    }

    fn destroy_instance(&self, _gpu: u32, instance: InstanceId) -> Result<(), BackendError> {
        let (placement, busy) =
            *self.0.gpu.lock().unwrap().instances.get(&instance).ok_or(BackendError::NotFound { gpu: 0, instance })?;
        if busy {
            return Err(BackendError::InUse { gpu: 0, instance, placement });
        }
        self.0
            .mutate(|g| {
                g.instances.remove(&instance);
                g.events.push(Event::Destroyed(placement, instance));
                Ok(())
            })
            .map_err(|e| driver(Operation::Destroy, e))
    }

    fn set_mig_mode(&self, _gpu: u32, _enabled: bool) -> Result<MigMode, BackendError> {
        Ok(MigMode::ENABLED)
    }
}

impl Workload for Load {
    fn loaded(&self, _gpu: u32) -> BTreeMap<Placement, Vec<Work>> {
        self.0.gpu.lock().unwrap().loaded.clone()
    }

    fn load(&self, _gpu: u32, instance: &GpuInstance, work: &[Work]) -> Result<(), WorkloadError> {
        let cold = self.0.cold_loads;
        self.0
            .mutate(|g| {
                let p = instance.placement;
                g.loaded.insert(p, work.to_vec());
                g.warm.insert(p, !cold);
                g.instances.get_mut(&instance.id).ok_or("load on a missing instance")?.1 = true;
                g.events.push(Event::Loaded(p));
                Ok(())
            })
            .map_err(|message| WorkloadError::Instance { gpu: 0, placement: instance.placement, message })
    }

    fn drain(&self, _gpu: u32, instance: &GpuInstance) -> Result<(), WorkloadError> {
        self.0
            .mutate(|g| {
                let p = instance.placement;
                g.loaded.remove(&p);
                g.warm.remove(&p);
                if let Some(i) = g.instances.get_mut(&instance.id) {
                    i.1 = false;
                }
                g.events.push(Event::Drained(p));
                Ok(())
            })
            .map_err(|message| WorkloadError::Instance { gpu: 0, placement: instance.placement, message })
    }

    fn ready(&self, _gpu: u32, placement: Placement) -> bool {
        self.0.gpu.lock().unwrap().warm.get(&placement).copied().unwrap_or(false)
    }

    fn retain(&self, _gpu: u32, live: &[Placement]) {
        self.0.gpu.lock().unwrap().loaded.retain(|p, _| live.contains(p));
    }

    fn metrics(&self) -> WorkloadMetrics {
        WorkloadMetrics::default()
    }

    fn now_ms(&self) -> u64 {
        0
    }
}

fn reconciler(node: &Arc<Node>, dir: &std::path::Path) -> Reconciler {
    Reconciler::new(NodeId::new("n1").unwrap(), Arc::new(Backend(node.clone())), Arc::new(Load(node.clone())), dir)
        .unwrap()
}

fn a(p: &str, tenant: &str, role: Role) -> Assignment {
    Assignment { placement: p.parse().unwrap(), tenant: TenantId::new(tenant).unwrap(), role, preinit: false }
}

fn plan(layout: &str, assignments: Vec<Assignment>) -> GpuPlan {
    GpuPlan {
        layout: layout.parse().unwrap(),
        assignments,
        expected_goodput: 0.0,
        explanation: String::new(),
        upcoming: vec![],
        retraining_epochs: BTreeMap::new(),
        sharing: Default::default(),
    }
}

fn first() -> GpuPlan {
    plan(
        "4g@0 2g@4 1g@6",
        vec![
            a("4g@0", "resnet", Role::Inference),
            a("2g@4", "bert", Role::Inference),
            a("1g@6", "bert", Role::Retraining),
        ],
    )
}

/// From `first`: 4g@0 is kept with its work, 2g@4 and 1g@6 are replaced by 3g@4 (bert moves there), 1g@6's
/// retraining stops. Steps: drain and destroy 2g@4 and 1g@6, create 3g@4, load it.
fn second() -> GpuPlan {
    plan("4g@0 3g@4", vec![a("4g@0", "resnet", Role::Inference), a("3g@4", "bert", Role::Inference)])
}

/// Installs `first` and returns the id of the instance at 4g@0.
fn install_first(node: &Arc<Node>, dir: &std::path::Path) -> InstanceId {
    let r = reconciler(node, dir);
    assert_eq!(r.accept(1, BTreeMap::from([(0, first())])).unwrap(), Acceptance::Accepted);
    let report = r.reconcile().unwrap();
    assert!(report.converged && report.errors.is_empty(), "{report:?}");
    assert_eq!(r.status().applied_epoch, 1);
    node.id_of("4g@0")
}

fn assert_converged_on_second(node: &Arc<Node>, kept: InstanceId) {
    assert_eq!(node.layout().to_string(), "4g@0 3g@4");
    let g = node.gpu.lock().unwrap();
    assert_eq!(g.instances.get(&kept).map(|i| i.0.to_string()), Some("4g@0".into()), "4g@0 kept its instance");
    let work = |p: &str| g.loaded.get(&p.parse::<Placement>().unwrap()).cloned().unwrap_or_default();
    assert_eq!(work("4g@0"), vec![Work { tenant: TenantId::new("resnet").unwrap(), role: Role::Inference }]);
    assert_eq!(work("3g@4"), vec![Work { tenant: TenantId::new("bert").unwrap(), role: Role::Inference }]);
    // The unchanged instance was never drained nor destroyed, whatever happened.
    let p4g: Placement = "4g@0".parse().unwrap();
    let touched: Vec<&Event> =
        g.events.iter().filter(|e| matches!(e, Event::Drained(p) | Event::Destroyed(p, _) if *p == p4g)).collect();
    assert!(touched.is_empty(), "4g@0 was touched: {touched:?}");
}

#[test]
fn case_01_a_reconfiguration_drains_before_destroying_and_leaves_unchanged_instances_alone() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::default());
    let kept = install_first(&node, dir.path());
    let r = reconciler(&node, dir.path());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    let r = r.with_observer(Box::new(move |_, s| seen2.lock().unwrap().push(s.instances.len())));
    let before = node.events().len();
    assert_eq!(r.accept(2, BTreeMap::from([(0, second())])).unwrap(), Acceptance::Accepted);
    let report = r.reconcile().unwrap();
    assert!(report.converged, "{report:?}");
    assert_eq!(report.steps, 3, "two destroys and one create");
    assert_converged_on_second(&node, kept);
    let events = node.events()[before..].to_vec();
    // Every destroy follows a drain of the same instance.
    for (i, e) in events.iter().enumerate() {
        if let Event::Destroyed(p, _) = e {
            assert!(events[..i].contains(&Event::Drained(*p)), "{p} destroyed without a drain: {events:?}");
        }
    }
    assert_eq!(*seen.lock().unwrap(), vec![2, 1, 2], "the observed state is published after each step");
    // A second pass does nothing.
    let again = r.reconcile().unwrap();
    assert_eq!((again.converged, again.steps), (true, 0));
    assert_eq!(r.status().applied_epoch, 2);
}

#[test]
fn case_02_a_crash_at_any_step_is_repaired_by_a_fresh_reconciler() {
    // Count the mutating calls of the clean reconfiguration first.
    let total = {
        let dir = tempfile::tempdir().unwrap();
        let node = Arc::new(Node::default());
        install_first(&node, dir.path());
        let start = node.calls.load(Ordering::SeqCst);
        let r = reconciler(&node, dir.path());
        r.accept(2, BTreeMap::from([(0, second())])).unwrap();
        r.reconcile().unwrap();
        node.calls.load(Ordering::SeqCst) - start
    };
    assert_eq!(total, 6, "drain, destroy, drain, destroy, create, load");
    for k in 0..total {
        for after in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let node = Arc::new(Node::default());
            let kept = install_first(&node, dir.path());
            let start = node.calls.load(Ordering::SeqCst);
            {
                let r = reconciler(&node, dir.path());
                r.accept(2, BTreeMap::from([(0, second())])).unwrap();
                *node.fail_at.lock().unwrap() = Some((start + k, after));
                let report = r.reconcile().unwrap();
                assert!(!report.converged && report.errors.len() == 1, "k={k} after={after}: {report:?}");
                assert!(report.errors[0].1.contains("injected crash"), "{report:?}");
                // The reconciler is dropped here: the agent died.
            }
            *node.fail_at.lock().unwrap() = None;
            let fresh = reconciler(&node, dir.path());
            assert_eq!(fresh.desired().epoch, 2, "the accepted target survives the restart");
            let report = fresh.reconcile().unwrap();
            assert!(report.converged && report.errors.is_empty(), "k={k} after={after}: {report:?}");
            assert_converged_on_second(&node, kept);
            // Nothing was done twice: at most the two destroys and the one create of the plan.
            let events = node.events();
            let creates =
                events.iter().filter(|e| matches!(e, Event::Created(p, _) if p.to_string() == "3g@4")).count();
            assert_eq!(creates, 1, "k={k} after={after}: {events:?}");
        }
    }
}

#[test]
fn case_03_an_older_epoch_never_overrides_a_newer_one_even_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::default());
    let r = reconciler(&node, dir.path());
    assert_eq!(r.accept(5, BTreeMap::from([(0, first())])).unwrap(), Acceptance::Accepted);
    assert_eq!(r.accept(5, BTreeMap::from([(0, first())])).unwrap(), Acceptance::AlreadyAccepted);
    assert!(matches!(
        r.accept(5, BTreeMap::from([(0, second())])),
        Err(ReconcileError::EpochConflict { epoch: 5, gpu: 0 })
    ));
    assert_eq!(r.accept(4, BTreeMap::from([(0, second())])).unwrap(), Acceptance::Stale { current: 5 });
    drop(r);
    let restarted = reconciler(&node, dir.path());
    assert_eq!(restarted.accept(3, BTreeMap::from([(0, second())])).unwrap(), Acceptance::Stale { current: 5 });
    assert_eq!(restarted.desired().gpus[&0].plan, first());
    assert!(matches!(restarted.accept(0, BTreeMap::new()), Err(ReconcileError::ZeroEpoch)));
}

/// A held epoch the coordinators never committed (a forged push) does not freeze the node: the next push checked
/// against them replaces it, and the uncommitted targets go, even across a restart.
#[test]
fn case_03b_an_epoch_never_committed_does_not_make_committed_pushes_stale() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::default());
    let r = reconciler(&node, dir.path());
    let none = BTreeMap::new;
    assert_eq!(r.accept(5, BTreeMap::from([(0, first())])).unwrap(), Acceptance::Accepted);
    assert_eq!(r.accept(1 << 63, BTreeMap::from([(0, second())])).unwrap(), Acceptance::Accepted, "forged");
    drop(r);
    let r = reconciler(&node, dir.path());
    // Unchecked, the forged epoch holds; checked against a committed epoch of 6, it is known forged.
    assert_eq!(r.accept(6, BTreeMap::new()).unwrap(), Acceptance::Stale { current: 1 << 63 });
    assert_eq!(r.accept_within(6, BTreeMap::new(), none(), Some(6)).unwrap(), Acceptance::Accepted);
    assert_eq!(r.desired().epoch, 6);
    assert!(r.desired().gpus.is_empty(), "the forged target went: {:?}", r.desired().gpus);
    // A committed epoch held still makes older pushes stale, checked or not.
    assert_eq!(r.accept_within(4, BTreeMap::new(), none(), Some(6)).unwrap(), Acceptance::Stale { current: 6 });
    assert_eq!(
        r.accept_within(7, BTreeMap::from([(0, first())]), none(), Some(6)).unwrap(),
        Acceptance::Accepted,
        "the reconciler takes what the authority passed"
    );
}

#[test]
fn case_04_invalid_targets_are_refused_before_anything_changes() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node::default());
    let r = reconciler(&node, dir.path());
    let overlap = plan("4g@0 3g@2", vec![]);
    let e = r.accept(1, BTreeMap::from([(0, overlap)])).unwrap_err();
    assert!(matches!(e, ReconcileError::InvalidTarget { gpu: 0, .. }), "{e}");
    let e = r.accept(1, BTreeMap::from([(3, first())])).unwrap_err();
    assert_eq!(e.to_string(), "GPU 3: no such GPU on this node (it has 1)");
    let stray = plan("7g@0", vec![a("3g@4", "bert", Role::Inference)]);
    assert!(matches!(r.accept(1, BTreeMap::from([(0, stray)])), Err(ReconcileError::InvalidTarget { .. })));
    assert_eq!(r.desired().epoch, 0);
    assert!(!dir.path().join(tessera_agent::state::STATE_FILE).exists(), "nothing was persisted");
}

#[test]
fn case_05_work_moving_to_a_preinitialised_instance_stays_until_it_is_warm() {
    let dir = tempfile::tempdir().unwrap();
    let node = Arc::new(Node { cold_loads: true, ..Node::default() });
    let r = reconciler(&node, dir.path());
    r.accept(1, BTreeMap::from([(0, plan("3g@0", vec![a("3g@0", "bert", Role::Inference)]))])).unwrap();
    // The first load is cold too; nothing waits on it (no preinit), so the pass converges.
    assert!(r.reconcile().unwrap().converged);
    let mut moved = a("3g@4", "bert", Role::Inference);
    moved.preinit = true;
    r.accept(2, BTreeMap::from([(0, plan("3g@4", vec![moved]))])).unwrap();
    assert_eq!(r.reconcile_gpu(0).unwrap(), GpuOutcome::Waiting("3g@4".parse().unwrap()));
    assert_eq!(node.layout().to_string(), "3g@0 3g@4", "created and loaded, the old one still serves");
    assert!(!node.events().contains(&Event::Drained("3g@0".parse().unwrap())));
    let status = r.status();
    assert_eq!(status.gpus[&0].waiting_for, Some("3g@4".parse().unwrap()));
    assert!(!status.gpus[&0].converged);
    // Warm-up done: the next pass drains and destroys the old instance.
    node.gpu.lock().unwrap().warm.insert("3g@4".parse().unwrap(), true);
    assert_eq!(r.reconcile_gpu(0).unwrap(), GpuOutcome::Converged);
    assert_eq!(node.layout().to_string(), "3g@4");
}

#[test]
fn trace_contexts_are_kept_until_the_gpu_converges_or_the_push_fails() {
    use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
    let node = Arc::new(Node::default());
    let dir = tempfile::tempdir().unwrap();
    let r = reconciler(&node, dir.path());
    let remote = SpanContext::new(TraceId::from(7), SpanId::from(9), TraceFlags::SAMPLED, true, TraceState::default());
    let cx = opentelemetry::Context::new().with_remote_span_context(remote);
    // An invalid context (no trace) is not kept.
    r.follow_trace(1, [0], &opentelemetry::Context::new());
    assert_eq!(r.traced_gpus(), 0);
    // A refused push forgets its context.
    r.follow_trace(5, [0, 3], &cx);
    assert_eq!(r.traced_gpus(), 2);
    r.forget_trace(5);
    assert_eq!(r.traced_gpus(), 0);
    // An accepted one keeps it until the GPU converges.
    r.follow_trace(1, [0], &cx);
    assert_eq!(r.accept(1, BTreeMap::from([(0, first())])).unwrap(), Acceptance::Accepted);
    assert_eq!(r.traced_gpus(), 1);
    let report = r.reconcile().unwrap();
    assert!(report.converged, "{report:?}");
    assert_eq!(r.traced_gpus(), 0);
}
