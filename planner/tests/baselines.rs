//! The baselines' characteristic behaviour on small hand-made inputs: PARIS sizes partitions by model weight and
//! ELSA dispatches to the smallest partition that meets the SLO; Ekya's thief moves slices toward the retraining
//! that gains most; Astraea ignores accuracy; static keeps the balanced layout.

use std::collections::BTreeMap;
use std::path::Path;

use tessera_core::accuracy::OptimusCurve;
use tessera_core::ids::TenantId;
use tessera_core::model::{LatencyModel, ModelProfile};
use tessera_core::plan::{GpuPlan, Role};
use tessera_core::{GpuModel, Profile};
use tessera_planner::policies::by_name;
use tessera_planner::policies::paris::partition_plan;
use tessera_planner::policies::static_layout::balanced_layout;
use tessera_planner::policy::{PlanOutcome, PlanReport};
use tessera_planner::synthetic::{SyntheticSpec, input as synthetic};
use tessera_planner::{PlannerConfig, PlannerInput};

fn models() -> BTreeMap<String, ModelProfile> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    tessera_core::config::load_model_dir(&dir).expect("shipped model profiles load")
}

fn planned(policy: &str, input: &PlannerInput) -> Box<PlanReport> {
    match by_name(policy).unwrap().plan(input).unwrap() {
        PlanOutcome::Planned(r) => r,
        PlanOutcome::Infeasible { reason } => panic!("{policy}: infeasible: {reason}"),
    }
}

fn one_gpu(tenants: usize, seed: u64) -> PlannerInput {
    let spec = SyntheticSpec { gpus: 1, tenants, slots: 20, gpu_model: GpuModel::A100_40GB, seed };
    synthetic(&spec, &models(), PlannerConfig::default())
}

/// Sets the tenant's accuracy now and after a default retraining (b1 = 2, b2 = 0.08, 5 epochs).
fn set_accuracy(input: &mut PlannerInput, id: &TenantId, now: f64, after: f64) {
    let t = input.tenants.get_mut(id).unwrap();
    t.accuracy = now;
    let r = t.spec.retraining.as_mut().unwrap();
    let b0 = ((1.0 / (1.0 - 0.08 - after)) - 2.0) / r.epochs;
    r.curve = OptimusCurve { b0, b1: 2.0, b2: 0.08 };
    assert!((r.accuracy_after(r.epochs) - after).abs() < 1e-9);
}

fn compute_slices(plan: &GpuPlan, id: &TenantId, role: Role) -> u8 {
    plan.assignments
        .iter()
        .filter(|a| &a.tenant == id && a.role == role)
        .map(|a| a.placement.profile.compute_slices())
        .sum()
}

/// Who holds which instance in which role (pre-initialisation aside: a kept instance is not pre-initialised).
fn owners(plan: &GpuPlan) -> Vec<(tessera_core::Placement, TenantId, Role)> {
    plan.assignments.iter().map(|a| (a.placement, a.tenant.clone(), a.role)).collect()
}

#[test]
fn paris_gives_a_heavy_model_larger_partitions_than_a_light_one() {
    let base = models()["resnet50"].clone();
    let with_alpha = |alpha: f64| ModelProfile {
        latency: LatencyModel::Parametric { base_ms: 2.0, alpha, beta: 0.1 },
        max_batch: 32,
        ..base.clone()
    };
    let (heavy, light) = (with_alpha(1.0), with_alpha(0.3));
    // Same SLO, same load: the heavy model slows sharply on small partitions.
    let mean_size = |m: &ModelProfile| {
        let plan = partition_plan(m, GpuModel::A100_40GB, 30.0, 1.0, 2000.0, None);
        assert!(!plan.is_empty());
        let total: f64 = plan.iter().map(|s| s.demand_slices).sum();
        plan.iter().map(|s| s.demand_slices * f64::from(s.profile.compute_slices())).sum::<f64>() / total
    };
    let (h, l) = (mean_size(&heavy), mean_size(&light));
    assert!(h > l + 0.5, "heavy {h:.2} vs light {l:.2}");
    // Batch ranges tile 1..=max without overlap, smallest partitions taking the smallest batches.
    let plan = partition_plan(&light, GpuModel::A100_40GB, 30.0, 1.0, 2000.0, None);
    assert_eq!(plan[0].batch_lo, 1);
    for w in plan.windows(2) {
        assert_eq!(w[1].batch_lo, w[0].batch_hi + 1);
        assert!(w[1].profile.compute_slices() > w[0].profile.compute_slices());
    }
}

#[test]
fn paris_partitions_are_heterogeneous_valid_and_static() {
    let mut input = one_gpu(2, 5);
    for t in input.tenants.values_mut() {
        t.retraining_due = false;
        t.spec.retraining = None;
        t.accuracy = 1.0;
    }
    let first = planned("paris", &input);
    let (gpu, plan) = first.plan.gpus.iter().next().unwrap();
    plan.layout.validate(GpuModel::A100_40GB).unwrap();
    // Without retraining the whole GPU goes to inference, and at least one tenant holds partitions of two sizes.
    assert!(plan.layout.compute_slices_used() >= 6, "{}", plan.layout.display_for(GpuModel::A100_40GB));
    let mixed = input.tenants.keys().any(|id| {
        let sizes: std::collections::BTreeSet<Profile> =
            plan.assignments.iter().filter(|a| &a.tenant == id).map(|a| a.placement.profile).collect();
        sizes.len() >= 2
    });
    assert!(mixed, "no heterogeneous partition set: {:?}", plan.assignments);
    // Applied, then re-planned with a doubled forecast: PARIS is set once for the deployment.
    let g = input.gpus.get_mut(gpu).unwrap();
    g.layout = plan.layout.clone();
    g.assignments = plan.assignments.clone();
    for t in input.tenants.values_mut() {
        t.forecast.mean.iter_mut().for_each(|r| *r *= 2.0);
    }
    let again = planned("paris", &input);
    assert_eq!(again.plan.gpus[gpu].layout, plan.layout);
    assert_eq!(owners(&again.plan.gpus[gpu]), owners(plan));
}

#[test]
fn ekya_moves_slices_toward_the_retraining_that_gains_most() {
    let mut input = one_gpu(2, 9);
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    // The same model, load and work for both; only the accuracy gain of retraining differs.
    let template = input.tenants[&ids[0]].clone();
    for id in &ids {
        let t = input.tenants.get_mut(id).unwrap();
        let keep_id = t.spec.id.clone();
        *t = template.clone();
        t.spec.id = keep_id;
        t.retraining_due = true;
        t.spec.retraining.as_mut().unwrap().work_gpu_s = 60.0;
        // Light inference load, so that slices are there to steal.
        for r in t.forecast.mean.iter_mut().chain(&mut t.forecast.low).chain(&mut t.forecast.high) {
            *r *= 0.25;
        }
    }
    let retraining_of = |input: &PlannerInput, big: &TenantId, small: &TenantId| {
        let report = planned("ekya", input);
        let plan = report.plan.gpus.values().next().unwrap();
        (compute_slices(plan, big, Role::Retraining), compute_slices(plan, small, Role::Retraining))
    };
    set_accuracy(&mut input, &ids[0], 0.55, 0.9);
    set_accuracy(&mut input, &ids[1], 0.84, 0.85);
    let (big, small) = retraining_of(&input, &ids[0], &ids[1]);
    assert!(big > small, "retraining slices: big gain {big}, small gain {small}");
    // Swap the gains: the slices follow.
    set_accuracy(&mut input, &ids[0], 0.84, 0.85);
    set_accuracy(&mut input, &ids[1], 0.55, 0.9);
    let (small, big) = retraining_of(&input, &ids[0], &ids[1]);
    assert!(big > small, "after the swap: big gain {big}, small gain {small}");
}

#[test]
fn astraea_ignores_accuracy() {
    let mut input = one_gpu(4, 21);
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    let inference = |input: &PlannerInput| {
        let report = planned("astraea", input);
        let plan = report.plan.gpus.values().next().unwrap().clone();
        let mut inf: Vec<_> = plan.assignments.into_iter().filter(|a| a.role == Role::Inference).collect();
        inf.sort();
        inf
    };
    let before = inference(&input);
    assert!(!before.is_empty());
    for (k, id) in ids.iter().enumerate() {
        let (now, after) = if k % 2 == 0 { (0.3, 0.95) } else { (0.9, 0.91) };
        set_accuracy(&mut input, id, now, after);
    }
    assert_eq!(inference(&input), before, "accuracy changed Astraea's inference allocation");
    // Tessera, by contrast, weighs accuracy: the same change moves its objective.
    let mut plain = input.clone();
    for id in &ids {
        set_accuracy(&mut plain, id, 0.7, 0.75);
    }
    let a = planned("tessera", &input).stats.objective;
    let b = planned("tessera", &plain).stats.objective;
    assert!((a - b).abs() > 1e-6);
}

/// A tenant that no instance can serve (an interference table slows it past its SLO on every instance) gets none
/// from `static` or `paris`, and does not make them hand out their instances again every round: the next round
/// keeps the owners while the forecasts move.
#[test]
fn a_tenant_no_instance_can_serve_does_not_make_fixed_policies_reshuffle() {
    for policy in ["static", "paris"] {
        let spec = SyntheticSpec { gpus: 1, tenants: 4, slots: 10, gpu_model: GpuModel::A100_40GB, seed: 5 };
        let mut input = synthetic(&spec, &models(), PlannerConfig::default());
        let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
        let victim = input.tenants[&ids[0]].spec.model.clone();
        // The victim is slowed 100x next to every other model (and its own, in case another tenant runs it).
        let others: std::collections::BTreeSet<String> = input.tenants.values().map(|t| t.spec.model.clone()).collect();
        let pairs = others.into_iter().map(|m| (victim.clone(), m, 100.0)).collect();
        input.interference = Some(tessera_planner::input::Interference { source: None, pairs });
        input.validate().unwrap();
        let first = planned(policy, &input);
        let inference = |p: &GpuPlan| owners(p).into_iter().filter(|a| a.2 == Role::Inference).collect::<Vec<_>>();
        for (gpu, plan) in &first.plan.gpus {
            assert!(inference(plan).iter().all(|a| a.1 != ids[0]), "{policy}: the victim got an instance");
            let g = input.gpus.get_mut(gpu).unwrap();
            g.layout = plan.layout.clone();
            g.assignments = plan.assignments.clone();
        }
        for t in input.tenants.values_mut() {
            t.forecast.mean.iter_mut().rev().for_each(|r| *r *= 3.0);
        }
        let again = planned(policy, &input);
        for (gpu, plan) in &again.plan.gpus {
            assert_eq!(plan.layout, first.plan.gpus[gpu].layout, "{policy}");
            assert_eq!(inference(plan), inference(&first.plan.gpus[gpu]), "{policy}");
        }
    }
}

#[test]
fn static_keeps_the_balanced_layout_and_its_owners() {
    let spec = SyntheticSpec { gpus: 2, tenants: 6, slots: 10, gpu_model: GpuModel::A100_40GB, seed: 3 };
    let mut input = synthetic(&spec, &models(), PlannerConfig::default());
    let first = planned("static", &input);
    for (gpu, plan) in &first.plan.gpus {
        assert_eq!(plan.layout, balanced_layout(GpuModel::A100_40GB), "{gpu}");
        assert!(plan.upcoming.iter().all(|c| c.layout == plan.layout), "static reconfigured within its horizon");
        let g = input.gpus.get_mut(gpu).unwrap();
        g.layout = plan.layout.clone();
        g.assignments = plan.assignments.clone();
    }
    for t in input.tenants.values_mut() {
        t.forecast.mean.iter_mut().rev().for_each(|r| *r *= 3.0);
    }
    let again = planned("static", &input);
    for (gpu, plan) in &again.plan.gpus {
        assert_eq!(plan.layout, first.plan.gpus[gpu].layout);
        let inference = |p: &GpuPlan| owners(p).into_iter().filter(|a| a.2 == Role::Inference).collect::<Vec<_>>();
        assert_eq!(inference(plan), inference(&first.plan.gpus[gpu]));
    }
}
