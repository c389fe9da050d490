//! The fleet state machine: each command's accepted and rejected cases, and the two properties the coordinator
//! relies on: a rejected command changes nothing, and the invariants hold after any sequence of commands.

use proptest::prelude::*;
use tessera_core::accuracy::{Drift, OptimusCurve};
use tessera_core::fleet::{Command, Event, FleetState, GpuDescriptor, GpuHealth, NodeHealth, Rejected, TenantStatus};
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::invariants::Violation;
use tessera_core::layout::Layout;
use tessera_core::model::{LatencyModel, ModelProfile, TrainingSpeed};
use tessera_core::plan::{Assignment, GpuPlan, Plan, Role};
use tessera_core::tenant::{DemandSource, RetrainingSpec, TenantSpec};
use tessera_core::time::SimTime;
use tessera_core::{GpuModel, Profile};

fn model(name: &str, inference_gib: f64, training_gib: f64) -> ModelProfile {
    ModelProfile {
        name: name.into(),
        description: String::new(),
        inference_memory_gib: inference_gib,
        training_memory_gib: training_gib,
        max_batch: 16,
        latency: LatencyModel::Parametric { base_ms: 2.0, alpha: 0.8, beta: 0.1 },
        training: TrainingSpeed::Exponent(0.9),
    }
}

fn tenant(id: &str, model: &str) -> TenantSpec {
    TenantSpec {
        jobs: Default::default(),
        pin: Default::default(),
        id: TenantId::new(id).unwrap(),
        name: id.into(),
        model: model.into(),
        slo_ms: 50.0,
        slo_percentile: 99.0,
        weight: 1.0,
        demand: DemandSource::Poisson { rate_rps: 100.0 },
        retraining: Some(RetrainingSpec {
            window_ms: 200_000,
            work_gpu_s: 60.0,
            epochs: 5.0,
            curve: OptimusCurve { b0: 2.0, b1: 1.5, b2: 0.08 },
            initial_accuracy: 0.7,
            drift: Drift { per_window: 0.02, floor: 0.5 },
        }),
    }
}

fn node(id: &str) -> NodeId {
    NodeId::new(id).unwrap()
}

fn gpu(s: &str) -> GpuId {
    s.parse().unwrap()
}

fn register(id: &str, models: &[GpuModel]) -> Command {
    Command::RegisterNode {
        node: node(id),
        address: format!("{id}:50051"),
        gpus: models.iter().enumerate().map(|(i, m)| GpuDescriptor::fresh(i as u32, *m)).collect(),
        at: SimTime::ZERO,
    }
}

fn assign(p: &str, t: &str, role: Role) -> Assignment {
    Assignment { placement: p.parse().unwrap(), tenant: TenantId::new(t).unwrap(), role, preinit: false }
}

fn plan(epoch: u64, gpus: &[(&str, &str, Vec<Assignment>)]) -> Command {
    Command::CommitPlan {
        plan: Plan {
            epoch,
            made_at: SimTime::from_secs(epoch),
            policy: "test".into(),
            gpus: gpus
                .iter()
                .map(|(g, l, a)| {
                    (
                        gpu(g),
                        GpuPlan {
                            layout: l.parse().unwrap(),
                            assignments: a.clone(),
                            expected_goodput: 1.0,
                            explanation: "test".into(),
                            upcoming: Vec::new(),
                            retraining_epochs: Default::default(),
                            sharing: Default::default(),
                        },
                    )
                })
                .collect(),
        },
    }
}

/// Models `small` (fits 1g) and `big` (17.5 GiB: 3g and up on A100-40GB), tenants `a` (small) and `b` (big), and
/// node `n` with two A100-40GB.
fn fleet() -> FleetState {
    let mut s = FleetState::new();
    for c in [
        Command::PutModel { profile: model("small", 1.0, 4.0) },
        Command::PutModel { profile: model("big", 17.5, 18.0) },
        register("n", &[GpuModel::A100_40GB, GpuModel::A100_40GB]),
        Command::CreateTenant { spec: tenant("a", "small") },
        Command::CreateTenant { spec: tenant("b", "big") },
    ] {
        s.apply(c).unwrap();
    }
    s
}

/// Applies a command that must be rejected, and checks that the state did not change.
fn rejected(s: &mut FleetState, c: Command) -> Rejected {
    let before = s.clone();
    let e = s.apply(c).expect_err("command should be rejected");
    assert_eq!(*s, before, "a rejected command changed the state: {e}");
    e
}

#[test]
fn tenants_are_created_updated_and_deleted() {
    let mut s = fleet();
    let mut t = tenant("a", "small");
    t.slo_ms = 80.0;
    assert_eq!(
        s.apply(Command::UpdateTenant { spec: t }),
        Ok(Event::TenantUpdated { id: TenantId::new("a").unwrap() })
    );
    assert_eq!(s.tenants[&TenantId::new("a").unwrap()].slo_ms, 80.0);
    assert!(matches!(
        rejected(&mut s, Command::CreateTenant { spec: tenant("a", "small") }),
        Rejected::TenantExists(_)
    ));
    assert!(matches!(
        rejected(&mut s, Command::UpdateTenant { spec: tenant("zz", "small") }),
        Rejected::UnknownTenant(_)
    ));
    s.apply(Command::DeleteTenant { id: TenantId::new("a").unwrap() }).unwrap();
    assert!(matches!(
        rejected(&mut s, Command::DeleteTenant { id: TenantId::new("a").unwrap() }),
        Rejected::UnknownTenant(_)
    ));
}

#[test]
fn tenants_are_validated_against_models_and_the_fleet() {
    let mut s = fleet();
    let e = rejected(&mut s, Command::CreateTenant { spec: tenant("c", "nope") });
    assert_eq!(e.to_string(), "tenant c: unknown model `nope` (known: big, small)");
    let none = Rejected::UnknownModel { tenant: TenantId::new("c").unwrap(), model: "nope".into(), known: vec![] };
    assert!(none.to_string().contains("no model profiles are loaded: start the coordinator with --models-dir"));
    s.apply(Command::PutModel { profile: model("huge", 120.0, 200.0) }).unwrap();
    let e = rejected(&mut s, Command::CreateTenant { spec: tenant("c", "huge") });
    assert_eq!(
        e.to_string(),
        "tenant c: model `huge` needs 120 GiB for inference; the largest instance in the fleet has 39.25 GiB"
    );
    // Retraining memory counts too when the tenant retrains.
    s.apply(Command::PutModel { profile: model("trains-big", 2.0, 60.0) }).unwrap();
    let e = rejected(&mut s, Command::CreateTenant { spec: tenant("c", "trains-big") });
    assert!(e.to_string().contains("needs 60 GiB for retraining"), "{e}");
    let mut serve_only = tenant("d", "trains-big");
    serve_only.retraining = None;
    s.apply(Command::CreateTenant { spec: serve_only }).unwrap();
    let mut bad = tenant("c", "small");
    bad.slo_ms = -1.0;
    let e = rejected(&mut s, Command::CreateTenant { spec: bad });
    assert_eq!(e.to_string(), "invalid tenant c: field `slo`: must be a positive number, got -1");
    let mut m = model("bad", 1.0, 1.0);
    m.max_batch = 0;
    let e = rejected(&mut s, Command::PutModel { profile: m });
    assert_eq!(e.to_string(), "invalid model bad: field `max_batch`: must be at least 1");
}

#[test]
fn nodes_register_reregister_and_leave() {
    let mut s = fleet();
    s.apply(plan(1, &[("n/0", "7g@0", vec![assign("7g@0", "b", Role::Inference)])])).unwrap();
    s.apply(Command::SetGpuHealth { gpu: gpu("n/1"), health: GpuHealth::Draining }).unwrap();
    // Re-registering the same hardware keeps targets and health, takes the observed layout, drops vanished GPUs.
    let mut c = register("n", &[GpuModel::A100_40GB]);
    if let Command::RegisterNode { gpus, .. } = &mut c {
        gpus[0].layout = "3g@4".parse().unwrap();
    }
    assert_eq!(s.apply(c), Ok(Event::NodeRegistered { node: node("n"), known: true, gpus: 1 }));
    assert_eq!(s.gpus.len(), 1);
    let g = &s.gpus[&gpu("n/0")];
    assert_eq!((g.target_epoch, g.applied.to_string()), (1, "3g@4".to_string()));
    assert!(g.target.is_some());

    let mut dup = register("m", &[GpuModel::H100_80GB, GpuModel::H100_80GB]);
    if let Command::RegisterNode { gpus, .. } = &mut dup {
        gpus[1].index = 0;
    }
    assert_eq!(rejected(&mut s, dup).to_string(), "node m: GPU index 0 listed twice");
    let mut bad = register("m", &[GpuModel::H100_80GB]);
    if let Command::RegisterNode { gpus, .. } = &mut bad {
        gpus[0].layout = "3g@0 2g@2".parse().unwrap();
    }
    assert!(matches!(rejected(&mut s, bad), Rejected::Violation(Violation::InvalidLayout { .. })));

    let ev = s.apply(Command::RemoveNode { node: node("n") }).unwrap();
    assert_eq!(ev, Event::NodeRemoved { node: node("n"), gpus: vec![gpu("n/0")] });
    assert!(s.gpus.is_empty());
    assert!(matches!(rejected(&mut s, Command::RemoveNode { node: node("n") }), Rejected::UnknownNode(_)));
    assert!(matches!(
        rejected(&mut s, Command::SetGpuHealth { gpu: gpu("n/0"), health: GpuHealth::Failed }),
        Rejected::UnknownGpu(_)
    ));
}

#[test]
fn plans_are_committed_only_when_every_rule_holds() {
    let mut s = fleet();
    let good = vec![assign("3g@0", "a", Role::Inference), assign("3g@4", "b", Role::Inference)];
    assert_eq!(
        s.apply(plan(1, &[("n/0", "3g@0 3g@4", good.clone())])),
        Ok(Event::PlanCommitted { epoch: 1, gpus: vec![gpu("n/0")], tenants_removed: vec![] })
    );
    assert_eq!(s.plan_epoch, 1);

    // Epochs must increase.
    let e = rejected(&mut s, plan(1, &[("n/0", "3g@0 3g@4", good.clone())]));
    assert_eq!(e.to_string(), "plan epoch 1 does not follow 1 (epochs must increase)");
    // Unknown GPU, invalid layout, shared instance, unknown tenant.
    assert!(matches!(rejected(&mut s, plan(2, &[("x/0", "7g@0", vec![])])), Rejected::UnknownGpu(_)));
    assert!(matches!(
        rejected(&mut s, plan(2, &[("n/0", "3g@0 2g@2", vec![])])),
        Rejected::Violation(Violation::SliceUsedTwice { .. })
    ));
    let shared = vec![assign("7g@0", "a", Role::Inference), assign("7g@0", "b", Role::Retraining)];
    assert!(matches!(
        rejected(&mut s, plan(2, &[("n/0", "7g@0", shared)])),
        Rejected::Violation(Violation::InstanceSharedByRoles { .. })
    ));
    assert!(matches!(
        rejected(&mut s, plan(2, &[("n/0", "7g@0", vec![assign("7g@0", "ghost", Role::Inference)])])),
        Rejected::UnknownTenant(_)
    ));
    // A model that does not fit its instance: `big` needs 17.5 GiB, a 2g.10gb has 9.62.
    let e = rejected(&mut s, plan(2, &[("n/0", "2g@0", vec![assign("2g@0", "b", Role::Inference)])]));
    assert_eq!(e.to_string(), "n/0: b's model `big` needs 17.5 GiB for inference; 2g@0 has 9.62 GiB");
    // Retraining memory counts for retraining roles: `small` trains in 4 GiB, which fits 1g.5gb (4.75).
    s.apply(plan(2, &[("n/1", "1g@0", vec![assign("1g@0", "a", Role::Retraining)])])).unwrap();
    // A failed GPU takes no layout; a drained-to-empty plan is fine.
    s.apply(Command::SetGpuHealth { gpu: gpu("n/1"), health: GpuHealth::Failed }).unwrap();
    assert!(matches!(rejected(&mut s, plan(3, &[("n/1", "7g@0", vec![])])), Rejected::GpuFailed(_)));
    s.apply(plan(3, &[("n/1", "-", vec![])])).unwrap();
    // The other GPU kept its epoch-1 target.
    assert_eq!(s.gpus[&gpu("n/0")].target_epoch, 1);
    assert_eq!(s.gpus[&gpu("n/1")].target_epoch, 3);
}

#[test]
fn a_failed_node_takes_only_empty_targets_and_keeps_its_verdict_across_registration() {
    let mut s = fleet();
    s.apply(plan(1, &[("n/0", "7g@0", vec![])])).unwrap();
    let verdict = |health, reason: &str| Command::SetNodeHealth {
        node: node("n"),
        health,
        reason: reason.into(),
        at: SimTime::from_secs(9),
    };
    assert_eq!(
        s.apply(verdict(NodeHealth::Failed, "no heartbeat for 10.0 s")),
        Ok(Event::NodeHealthSet { node: node("n"), health: NodeHealth::Failed })
    );
    assert!(matches!(rejected(&mut s, plan(2, &[("n/0", "3g@0", vec![])])), Rejected::GpuFailed(_)));
    s.apply(plan(2, &[("n/0", "-", vec![]), ("n/1", "-", vec![])])).unwrap();
    // Registering again is not a heartbeat: the verdict stays until the leader lifts it.
    s.apply(register("n", &[GpuModel::A100_40GB, GpuModel::A100_40GB])).unwrap();
    assert_eq!(s.nodes[&node("n")].health, NodeHealth::Failed);
    assert_eq!(s.nodes[&node("n")].health_reason, "no heartbeat for 10.0 s");
    s.apply(verdict(NodeHealth::Healthy, "heartbeats resumed")).unwrap();
    s.apply(plan(3, &[("n/0", "3g@0", vec![])])).unwrap();
    assert!(matches!(
        rejected(
            &mut s,
            Command::SetNodeHealth {
                node: node("ghost"),
                health: NodeHealth::Failed,
                reason: String::new(),
                at: SimTime::ZERO,
            }
        ),
        Rejected::UnknownNode(_)
    ));
}

#[test]
fn applied_layouts_are_recorded_in_epoch_order() {
    let mut s = fleet();
    s.apply(plan(1, &[("n/0", "4g@0 3g@4", vec![])])).unwrap();
    s.apply(plan(2, &[("n/0", "7g@0", vec![])])).unwrap();
    let applied = |epoch, layout: &str| Command::LayoutApplied {
        gpu: gpu("n/0"),
        epoch,
        layout: layout.parse().unwrap(),
        assignments: vec![],
    };
    // Half-way through epoch 2's reconfiguration: recorded, not converged.
    assert_eq!(s.apply(applied(2, "3g@4")), Ok(Event::LayoutRecorded { gpu: gpu("n/0"), epoch: 2, converged: false }));
    assert_eq!(s.apply(applied(2, "7g@0")), Ok(Event::LayoutRecorded { gpu: gpu("n/0"), epoch: 2, converged: true }));
    let e = rejected(&mut s, applied(1, "4g@0 3g@4"));
    assert_eq!(e.to_string(), "n/0: report for epoch 1 is older than the recorded epoch 2");
    assert!(matches!(rejected(&mut s, applied(3, "7g@0")), Rejected::FutureReport { .. }));
    assert!(matches!(rejected(&mut s, applied(2, "3g@2")), Rejected::Violation(Violation::InvalidLayout { .. })));
}

#[test]
fn commands_round_trip_through_json() {
    let cmds = [
        Command::PutModel { profile: model("small", 1.0, 4.0) },
        Command::CreateTenant { spec: tenant("a", "small") },
        register("n", &[GpuModel::H200_141GB]),
        plan(1, &[("n/0", "3g@0 3g@4", vec![assign("3g@4", "a", Role::Retraining)])]),
        Command::LayoutApplied {
            gpu: gpu("n/0"),
            epoch: 1,
            layout: "3g@4".parse().unwrap(),
            assignments: vec![assign("3g@4", "a", Role::Retraining)],
        },
        Command::ReportTenantStatus {
            tenant: TenantId::new("a").unwrap(),
            status: TenantStatus {
                accuracy: 0.8,
                model_version: 2,
                retraining_done_gpu_s: 12.5,
                at: SimTime::from_secs(9),
                retraining_due: Some(true),
            },
        },
    ];
    for c in cmds {
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), c, "{json}");
    }
}

fn arb_command() -> impl Strategy<Value = Command> {
    let tenants = prop::sample::select(vec!["a", "b", "c"]);
    let models = prop::sample::select(vec!["small", "big", "none"]);
    let layouts = prop::sample::select(vec!["-", "7g@0", "3g@0 3g@4", "4g@0 2g@4 1g@6", "1g@0 1g@1", "3g@0 2g@2"]);
    let gpus = prop::sample::select(vec!["n/0", "n/1", "m/0"]);
    let roles = prop::sample::select(vec![Role::Inference, Role::Retraining]);
    prop_oneof![
        (tenants.clone(), models.clone()).prop_map(|(t, m)| Command::CreateTenant { spec: tenant(t, m) }),
        (tenants.clone(), models).prop_map(|(t, m)| Command::UpdateTenant { spec: tenant(t, m) }),
        tenants.clone().prop_map(|t| Command::DeleteTenant { id: TenantId::new(t).unwrap() }),
        (tenants.clone(), 0u64..4, 0u64..4).prop_map(|(t, v, at)| Command::ReportTenantStatus {
            tenant: TenantId::new(t).unwrap(),
            status: TenantStatus {
                accuracy: 0.7,
                model_version: v,
                retraining_done_gpu_s: 1.0,
                at: SimTime::from_secs(at),
                retraining_due: None,
            },
        }),
        prop::sample::select(vec!["n", "m"]).prop_map(|n| register(n, &[GpuModel::A100_40GB, GpuModel::H100_80GB])),
        prop::sample::select(vec!["n", "m"]).prop_map(|n| Command::RemoveNode { node: node(n) }),
        (gpus.clone(), prop::sample::select(vec![GpuHealth::Healthy, GpuHealth::Draining, GpuHealth::Failed]))
            .prop_map(|(g, h)| Command::SetGpuHealth { gpu: gpu(g), health: h }),
        (
            prop::sample::select(vec!["n", "m"]),
            prop::sample::select(vec![NodeHealth::Healthy, NodeHealth::Suspect, NodeHealth::Failed])
        )
            .prop_map(|(n, h)| Command::SetNodeHealth {
                node: node(n),
                health: h,
                reason: String::new(),
                at: SimTime::ZERO
            }),
        (0u64..6, gpus.clone(), layouts.clone(), tenants, roles).prop_map(|(e, g, l, t, r)| {
            let layout: Layout = l.parse().unwrap();
            let a = layout.placements().first().map(|p| vec![assign(&p.to_string(), t, r)]).unwrap_or_default();
            plan(e, &[(g, l, a)])
        }),
        (0u64..6, gpus, layouts).prop_map(|(e, g, l)| Command::LayoutApplied {
            gpu: gpu(g),
            epoch: e,
            layout: l.parse().unwrap(),
            assignments: vec![],
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Whatever the sequence: rejected commands change nothing, invariants hold, epochs never go back.
    #[test]
    fn any_command_sequence_keeps_the_invariants(cmds in prop::collection::vec(arb_command(), 1..40)) {
        let mut s = fleet();
        let mut last_epoch = s.plan_epoch;
        for c in cmds {
            let before = s.clone();
            match s.apply(c) {
                Ok(_) => {}
                Err(e) => prop_assert_eq!(&s, &before, "rejected command changed the state: {}", e),
            }
            prop_assert_eq!(s.check_invariants(), Ok(()));
            prop_assert!(s.plan_epoch >= last_epoch);
            last_epoch = s.plan_epoch;
        }
    }
}

#[test]
fn deleting_an_assigned_tenant_retires_it_until_a_plan_drops_it() {
    let mut s = fleet();
    s.apply(plan(1, &[("n/0", "3g@0 3g@4", vec![assign("3g@0", "a", Role::Inference)])])).unwrap();
    let a = TenantId::new("a").unwrap();
    assert_eq!(
        s.apply(Command::DeleteTenant { id: a.clone() }),
        Ok(Event::TenantRetiring { id: a.clone(), assigned_on: vec![gpu("n/0")] })
    );
    assert!(s.tenants.contains_key(&a) && s.retiring.contains(&a));
    assert_eq!(s.active_tenants().map(|t| t.id.as_str()).collect::<Vec<_>>(), ["b"]);
    // No update, no new work; keeping its current instance is allowed.
    assert!(matches!(
        rejected(&mut s, Command::UpdateTenant { spec: tenant("a", "small") }),
        Rejected::TenantRetiring(_)
    ));
    let more = vec![assign("3g@0", "a", Role::Inference), assign("3g@4", "a", Role::Retraining)];
    assert!(matches!(rejected(&mut s, plan(2, &[("n/0", "3g@0 3g@4", more)])), Rejected::TenantRetiring(_)));
    let ev = s.apply(plan(2, &[("n/0", "3g@0 3g@4", vec![assign("3g@0", "a", Role::Inference)])])).unwrap();
    assert_eq!(ev, Event::PlanCommitted { epoch: 2, gpus: vec![gpu("n/0")], tenants_removed: vec![] });
    // The plan that drops it removes it.
    let ev = s.apply(plan(3, &[("n/0", "7g@0", vec![assign("7g@0", "b", Role::Inference)])])).unwrap();
    assert_eq!(ev, Event::PlanCommitted { epoch: 3, gpus: vec![gpu("n/0")], tenants_removed: vec![a.clone()] });
    assert!(!s.tenants.contains_key(&a) && s.retiring.is_empty());
    // Deleting a tenant nobody assigns removes it at once.
    s.apply(Command::CreateTenant { spec: tenant("c", "small") }).unwrap();
    let c = TenantId::new("c").unwrap();
    assert_eq!(s.apply(Command::DeleteTenant { id: c.clone() }), Ok(Event::TenantDeleted { id: c }));
}

#[test]
fn updates_that_would_not_fit_held_instances_are_rejected() {
    let mut s = fleet();
    s.apply(plan(1, &[("n/0", "1g@0", vec![assign("1g@0", "a", Role::Inference)])])).unwrap();
    // Switching tenant a to the 17.5 GiB model while it holds a 4.75 GiB 1g instance.
    let e = rejected(&mut s, Command::UpdateTenant { spec: tenant("a", "big") });
    assert_eq!(e.to_string(), "n/0: a's model `big` needs 17.5 GiB for inference; 1g@0 has 4.75 GiB");
    // Growing the model itself is refused the same way.
    let e = rejected(&mut s, Command::PutModel { profile: model("small", 6.0, 4.0) });
    assert!(matches!(e, Rejected::DoesNotFit { .. }), "{e}");
    s.apply(Command::PutModel { profile: model("small", 2.0, 4.0) }).unwrap();
}

#[test]
fn draining_gpus_keep_or_shed_work_but_take_none() {
    let mut s = fleet();
    s.apply(plan(1, &[("n/0", "3g@0 3g@4", vec![assign("3g@0", "a", Role::Inference)])])).unwrap();
    s.apply(Command::SetGpuHealth { gpu: gpu("n/0"), health: GpuHealth::Draining }).unwrap();
    let more = vec![assign("3g@0", "a", Role::Inference), assign("3g@4", "b", Role::Inference)];
    let e = rejected(&mut s, plan(2, &[("n/0", "3g@0 3g@4", more)]));
    assert_eq!(
        e.to_string(),
        "n/0 is draining: the plan may keep or remove its work but not add 3g@4 -> b (inference)"
    );
    s.apply(plan(2, &[("n/0", "3g@0 3g@4", vec![assign("3g@0", "a", Role::Inference)])])).unwrap();
    s.apply(plan(3, &[("n/0", "-", vec![])])).unwrap();
}

#[test]
fn applied_assignments_decide_convergence() {
    let mut s = fleet();
    let work = vec![assign("3g@0", "a", Role::Inference), assign("3g@4", "b", Role::Retraining)];
    s.apply(plan(1, &[("n/0", "3g@0 3g@4", work.clone())])).unwrap();
    let report = |assignments: Vec<Assignment>| Command::LayoutApplied {
        gpu: gpu("n/0"),
        epoch: 1,
        layout: "3g@0 3g@4".parse().unwrap(),
        assignments,
    };
    // Right layout, work not loaded yet: not converged.
    assert_eq!(s.apply(report(vec![])), Ok(Event::LayoutRecorded { gpu: gpu("n/0"), epoch: 1, converged: false }));
    let mut reversed = work.clone();
    reversed.reverse();
    assert_eq!(s.apply(report(reversed)), Ok(Event::LayoutRecorded { gpu: gpu("n/0"), epoch: 1, converged: true }));
    assert_eq!(s.gpus[&gpu("n/0")].applied_assignments, work);
    let stray = vec![assign("7g@0", "a", Role::Inference)];
    assert!(matches!(rejected(&mut s, report(stray)), Rejected::Violation(Violation::AssignmentOutsideLayout { .. })));
}

#[test]
fn tenant_status_is_recorded_in_order() {
    let mut s = fleet();
    let a = TenantId::new("a").unwrap();
    let status = |accuracy, model_version, at| Command::ReportTenantStatus {
        tenant: a.clone(),
        status: TenantStatus {
            accuracy,
            model_version,
            retraining_done_gpu_s: 3.0,
            at: SimTime::from_secs(at),
            retraining_due: None,
        },
    };
    s.apply(status(0.72, 1, 10)).unwrap();
    s.apply(status(0.81, 2, 20)).unwrap();
    assert_eq!(s.tenant_status[&a].model_version, 2);
    let e = rejected(&mut s, status(0.8, 2, 15));
    assert_eq!(e.to_string(), "tenant a: status rejected: report at 15.000s is older than the recorded one at 20.000s");
    assert!(matches!(rejected(&mut s, status(0.8, 1, 30)), Rejected::BadStatus { .. }));
    assert!(matches!(rejected(&mut s, status(1.5, 3, 30)), Rejected::BadStatus { .. }));
    s.apply(Command::DeleteTenant { id: a.clone() }).unwrap();
    assert!(!s.tenant_status.contains_key(&a));
}

#[test]
fn a_node_registers_its_drivers_memory_and_absurd_figures_are_refused() {
    let mut s = fleet();
    let with = |memory: &[(Profile, f64)]| {
        let mut c = register("h200", &[GpuModel::H200_141GB]);
        if let Command::RegisterNode { gpus, .. } = &mut c {
            gpus[0].memory_gib = memory.iter().copied().collect();
        }
        c
    };
    s.apply(with(&[(Profile::G1, 16.0), (Profile::G7, 140.0)])).unwrap();
    let gpu = &s.gpus[&"h200/0".parse::<GpuId>().unwrap()];
    assert_eq!(gpu.memory_gib.get(&Profile::G1), Some(&16.0));
    for bad in [(Profile::G1, 0.0), (Profile::G1, f64::NAN), (Profile::G3, 400.0)] {
        assert!(matches!(rejected(&mut s, with(&[bad])), Rejected::BadDriverMemory { .. }), "{bad:?}");
    }
    // A registration without figures goes back to the catalog's.
    s.apply(register("h200", &[GpuModel::H200_141GB])).unwrap();
    assert!(s.gpus[&"h200/0".parse::<GpuId>().unwrap()].memory_gib.is_empty());
}
