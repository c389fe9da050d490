//! Planner correctness: the count rule, the solvers against exhaustive search, the policies against each other and
//! the invariants, on seeded synthetic inputs over the shipped model profiles.

use std::collections::BTreeMap;
use std::path::Path;

use proptest::prelude::*;
use tessera_core::enumerate::{ProfileSet, all_layouts};
use tessera_core::fleet::GpuHealth;
use tessera_core::ids::TenantId;
use tessera_core::invariants::check_gpu_plan;
use tessera_core::model::ModelProfile;
use tessera_core::plan::Role;
use tessera_core::sharing::Sharing;
use tessera_core::{GpuModel, Layout, Placement, Profile};
use tessera_planner::input::Interference;
use tessera_planner::level2::build::{Arrivals, gpu_problem};
use tessera_planner::level2::problem::GpuProblem;
use tessera_planner::level2::solver::{SolverConfig, relative_gap};
use tessera_planner::level2::{cg, evaluate, exhaustive, goodput};
use tessera_planner::policies::migrator;
use tessera_planner::policies::{all_names, by_name};
use tessera_planner::policy::{GpuStats, PlanOutcome, PlanReport};
use tessera_planner::synthetic::{SyntheticSpec, input as synthetic};
use tessera_planner::{PlannerConfig, PlannerInput, assign};

fn models() -> BTreeMap<String, ModelProfile> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    tessera_core::config::load_model_dir(&dir).expect("shipped model profiles load")
}

fn exact() -> SolverConfig {
    SolverConfig { mip_rel_gap: 0.0, time_limit_s: 60.0, max_nodes: 10_000_000, ..SolverConfig::default() }
}

fn tiny(tenants: usize, slots: usize, seed: u64, retraining: usize) -> PlannerInput {
    let spec = SyntheticSpec { gpus: 1, tenants, slots, gpu_model: GpuModel::A100_40GB, seed };
    let mut input = synthetic(&spec, &models(), PlannerConfig { solver: exact(), ..PlannerConfig::default() });
    for (k, t) in input.tenants.values_mut().enumerate() {
        t.retraining_due = k < retraining;
    }
    input
}

fn problem(input: &PlannerInput, arrivals: Arrivals) -> GpuProblem {
    let gpu = input.gpus.keys().next().unwrap().clone();
    let tenants: Vec<TenantId> = input.tenants.keys().cloned().collect();
    gpu_problem(input, &gpu, &tenants, arrivals)
}

/// Adds an empty, healthy GPU `id` of `model` to `input`.
fn add_gpu(input: &mut PlannerInput, id: tessera_core::ids::GpuId, model: GpuModel) {
    input.gpus.insert(
        id,
        tessera_planner::input::GpuInput {
            model,
            health: GpuHealth::Healthy,
            layout: Layout::empty(),
            assignments: vec![],
            warm: None,
            memory_gib: Default::default(),
        },
    );
}

fn planned(policy: &str, input: &PlannerInput) -> Box<PlanReport> {
    match by_name(policy).unwrap().plan(input).unwrap() {
        PlanOutcome::Planned(r) => r,
        PlanOutcome::Infeasible { reason } => panic!("{policy}: infeasible: {reason}"),
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn count_rule_matches_the_enumerated_layouts_on_every_gpu() {
    for gpu in GpuModel::ALL {
        let profiles = GpuProblem::candidate_profiles(gpu);
        let feasible: std::collections::BTreeSet<Vec<u8>> = all_layouts(gpu, ProfileSet::WithDoubleMemory)
            .iter()
            .map(|l| profiles.iter().map(|p| l.count(*p) as u8).collect())
            .chain(std::iter::once(vec![0; profiles.len()]))
            .collect();
        let mut v = vec![0u8; profiles.len()];
        let mut checked = 0;
        loop {
            assert_eq!(GpuProblem::fits(gpu, &profiles, &v), feasible.contains(&v), "{gpu}: counts {v:?}");
            checked += 1;
            let mut k = 0;
            while k < v.len() {
                v[k] += 1;
                if v[k] <= 7 {
                    break;
                }
                v[k] = 0;
                k += 1;
            }
            if k == v.len() {
                break;
            }
        }
        assert!(checked > 1000);
    }
}

/// At the planning gap, small problems are not sent to the compact MILP (`cg::EXACT_GAP`): the heuristics' plan
/// must then itself be within that gap of the exhaustive optimum. Checked on a fixed sample of 600 problems of 2-3
/// tenants and 3-6 slots, some retraining, with the tail values Tessera plans with. (Not a property: a random
/// search of 1,000 cases found one problem, 3 tenants over 3 slots, whose plan is 2.5 % below the optimum, a
/// three-way split of the GPU that single-tenant and pair moves do not reach.)
#[test]
fn tessera_level2_is_within_the_planning_gap_without_the_compact_milp() {
    let config = SolverConfig::default();
    assert!(config.mip_rel_gap > cg::EXACT_GAP);
    let (mut planned, mut optimal) = (0.0, 0.0);
    for seed in 0..100u64 {
        for (tenants, slots) in [(2, 3), (2, 4), (2, 6), (3, 3), (3, 4), (3, 6)] {
            let retraining = (seed % 3) as usize;
            let input = tiny(tenants, slots, seed, retraining.min(tenants));
            let mut pb = problem(&input, if seed % 2 == 0 { Arrivals::Band } else { Arrivals::Point });
            goodput::tail_values(&input, &mut pb);
            let solved = cg::solve(&pb, &config).unwrap();
            let (best, optimum) = exhaustive::solve(&pb);
            let case = format!("seed {seed}, {tenants} tenants, {slots} slots, {retraining} retraining");
            assert!(solved.schedule.feasible(&pb), "{case}");
            assert!(
                solved.objective >= optimum * (1.0 - config.mip_rel_gap) - 1e-6,
                "{case}: solver {} vs exhaustive {optimum} ({best:?})",
                solved.objective
            );
            assert!(solved.bound >= optimum * (1.0 - 1e-6), "{case}");
            planned += solved.objective;
            optimal += optimum;
        }
    }
    // Over the sample, far less is lost than the gap allows (measured: 0.014 %).
    assert!(planned >= optimal * (1.0 - 0.001), "planned {planned} against {optimal} at the optimum");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Tessera's level 2 reaches the optimum of the count-level model found by exhaustive search.
    #[test]
    fn tessera_level2_is_optimal_on_tiny_problems(
        tenants in 1usize..=3, slots in 2usize..=6, seed in 0u64..1000, retraining in 0usize..=2, band in any::<bool>(),
        tail in any::<bool>(),
    ) {
        let input = tiny(tenants, slots, seed, retraining.min(tenants));
        let mut pb = problem(&input, if band { Arrivals::Band } else { Arrivals::Point });
        if tail {
            // With the value a completed retraining earns beyond the horizon (Tessera's objective).
            goodput::tail_values(&input, &mut pb);
        }
        let solved = cg::solve(&pb, &exact()).unwrap();
        let (best, optimum) = exhaustive::solve(&pb);
        prop_assert!(solved.schedule.feasible(&pb));
        prop_assert!(close(solved.objective, optimum), "solver {} vs exhaustive {} ({best:?})", solved.objective, optimum);
        prop_assert!(solved.bound >= optimum * (1.0 - 1e-6));
    }

    /// Alone on a GPU, a tenant's best plan is one pricing at zero prices: column generation must reach the
    /// exhaustive optimum by itself (these horizons are beyond the compact MILP's fallback), retraining included.
    #[test]
    fn column_generation_is_exact_for_one_tenant_over_long_horizons(slots in 19usize..=30, seed in 0u64..1000) {
        let input = tiny(1, slots, seed, 1);
        let mut pb = problem(&input, Arrivals::Band);
        if seed % 2 == 0 {
            goodput::tail_values(&input, &mut pb);
        }
        let solved = cg::solve(&pb, &exact()).unwrap();
        let (_, optimum) = exhaustive::solve(&pb);
        prop_assert!(close(solved.objective, optimum), "solver {} vs exhaustive {}", solved.objective, optimum);
        prop_assert!(solved.bound >= optimum * (1.0 - 1e-6));
    }

    /// A warm start cannot make level 2 wrong: from any prices (here arbitrary, shaped or not), or from its own
    /// result, the solve still reaches the exhaustive optimum and its bound stays valid. (That a warm start also
    /// saves work holds in total, not on every problem: [`warm_starts_from_their_own_result_save_rounds_in_total`].)
    #[test]
    fn warm_starts_from_any_prices_keep_level2_exact(
        tenants in 1usize..=3, slots in 2usize..=6, seed in 0u64..1000, retraining in 0usize..=2,
        scale in 0.0f64..2000.0, width in 5usize..=7,
    ) {
        let input = tiny(tenants, slots, seed, retraining.min(tenants));
        let mut pb = problem(&input, Arrivals::Band);
        goodput::tail_values(&input, &mut pb);
        let (best, optimum) = exhaustive::solve(&pb);
        // Prices from a seeded walk: any non-negative prices give a valid Lagrangian bound.
        let prices: Vec<Vec<f64>> = (0..slots)
            .map(|t| (0..width).map(|k| scale * (((seed as usize + 7 * t + 3 * k) % 11) as f64) / 10.0).collect())
            .collect();
        let warm = cg::solve_warm(&pb, &exact(), &[], Some(&prices)).unwrap();
        prop_assert!(warm.solved.schedule.feasible(&pb));
        prop_assert!(close(warm.solved.objective, optimum), "warm {} vs exhaustive {} ({best:?})", warm.solved.objective, optimum);
        prop_assert!(warm.solved.bound >= optimum * (1.0 - 1e-6));
        // Its own result as the next warm start: the optimum is reached again, with a valid bound.
        let cold = cg::solve_warm(&pb, &exact(), &[], None).unwrap();
        let again = cg::solve_warm(&pb, &exact(), std::slice::from_ref(&cold.solved.schedule), Some(&cold.prices)).unwrap();
        prop_assert!(close(again.solved.objective, optimum));
        prop_assert!(again.solved.bound >= optimum * (1.0 - 1e-6));
    }

    /// The MIGRator placement ILP reaches the optimum of its model found by exhaustive search.
    #[test]
    fn migrator_ilp_is_optimal_on_tiny_problems(
        tenants in 1usize..=2, slots in 2usize..=4, seed in 0u64..1000, retraining in 0usize..=1,
    ) {
        let input = tiny(tenants, slots, seed, retraining);
        let pb = problem(&input, Arrivals::Point);
        let solved = migrator::solve(&pb, &exact()).unwrap();
        let (_, optimum) = exhaustive::solve_placed(&pb);
        prop_assert!(close(solved.objective, optimum), "ILP {} vs exhaustive {}", solved.objective, optimum);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// MIGRator's level 2 solves its model in the count-level reformulation, which charges reconfiguration as the
    /// simulator does (pre-initialised where the new instance's slices were free, cold otherwise) where the paper's
    /// placement-level ILP charges every change the pre-initialised dead time. The count-level model never charges
    /// a plan more than the exact evaluation does, so its optimum is at least the placement ILP's plan evaluated as the
    /// simulator charges it: solving the reformulation loses nothing the paper's formulation would have found.
    #[test]
    fn migrator_reformulation_is_at_least_the_placement_ilp_plan(
        tenants in 1usize..=2, slots in 2usize..=4, seed in 0u64..1000, retraining in 0usize..=1,
    ) {
        let input = tiny(tenants, slots, seed, retraining);
        let pb = problem(&input, Arrivals::Point);
        let ilp = migrator::solve(&pb, &exact()).unwrap();
        let (ilp_exact, _) = tessera_planner::level2::evaluate::goodput_and_tail(&pb, &ilp.placed);
        let cg = cg::solve(&pb, &exact()).unwrap();
        prop_assert!(
            cg.objective >= ilp_exact * (1.0 - 1e-6) - 1e-6,
            "reformulation {} below the placement ILP's plan {} (its own objective {})", cg.objective, ilp_exact,
            ilp.objective
        );
    }
}

/// Every policy plans the same input the same way twice, on problems where the MIGRator placement ILP used to stop
/// on the wall clock (its plan then depended on the machine's load).
#[test]
fn every_policy_plans_deterministically_on_a_crowded_fleet() {
    let spec = SyntheticSpec { gpus: 4, tenants: 12, slots: 12, gpu_model: GpuModel::A100_40GB, seed: 5 };
    let input = synthetic(&spec, &models(), PlannerConfig::default());
    for policy in ["migrator", "tessera"] {
        let a = planned(policy, &input);
        let b = planned(policy, &input);
        let json = |p: &PlanReport| serde_json::to_string(&p.plan).unwrap();
        assert_eq!(json(&a), json(&b), "{policy}: two plans of one input differ");
        assert_eq!(a.stats.objective, b.stats.objective, "{policy}");
    }
}

#[test]
fn plans_are_deterministic_and_keep_the_invariants() {
    // Small enough that every MILP (the MIGRator ILP included) finishes within its budget: a solve stopped by the
    // wall clock is the one thing that is not reproducible.
    let spec = SyntheticSpec { gpus: 3, tenants: 6, slots: 6, gpu_model: GpuModel::A100_40GB, seed: 7 };
    let mut input = synthetic(&spec, &models(), PlannerConfig::default());
    // Every policy and ablation under every level-1 placement.
    let runs = assign::Placement::ALL.into_iter().flat_map(|(_, p)| all_names().into_iter().map(move |n| (p, n)));
    for (placement, policy) in runs {
        input.config.placement = placement;
        let a = planned(policy, &input);
        let b = planned(policy, &input);
        assert_eq!(serde_json::to_string(&a.plan).unwrap(), serde_json::to_string(&b.plan).unwrap(), "{policy}");
        for (gpu, plan) in &a.plan.gpus {
            let model = input.gpus[gpu].model;
            check_gpu_plan(gpu, model, plan).unwrap();
            for change in &plan.upcoming {
                let later = tessera_core::plan::GpuPlan {
                    layout: change.layout.clone(),
                    assignments: change.assignments.clone(),
                    ..plan.clone()
                };
                check_gpu_plan(gpu, model, &later).unwrap();
            }
            for a in &plan.assignments {
                let t = &input.tenants[&a.tenant];
                let m = &input.models[&t.spec.model];
                let spec = model.profile(a.placement.profile).unwrap();
                match a.role {
                    Role::Inference => assert!(m.fits_inference(spec), "{policy}: {a} does not fit"),
                    Role::Retraining => assert!(m.fits_training(spec), "{policy}: {a} does not fit"),
                }
            }
            assert!(plan.expected_goodput >= 0.0);
            assert!(plan.explanation.starts_with(policy));
        }
        assert!(a.stats.bound + 1e-6 >= a.stats.objective);
    }
}

#[test]
fn a_tenant_that_fits_nowhere_makes_the_round_infeasible_with_the_reason() {
    let mut input = tiny(1, 4, 3, 0);
    let id = input.tenants.keys().next().unwrap().clone();
    let model = input.tenants[&id].spec.model.clone();
    input.models.get_mut(&model).unwrap().inference_memory_gib = 500.0;
    match by_name("tessera").unwrap().plan(&input).unwrap() {
        PlanOutcome::Infeasible { reason } => assert!(reason.contains(&model), "{reason}"),
        PlanOutcome::Planned(_) => panic!("planned a tenant that fits nowhere"),
    }
    assert!(by_name("nonsense").is_err());
}

#[test]
fn level1_is_sticky_memory_aware_and_spreads_interfering_tenants() {
    let spec = SyntheticSpec { gpus: 4, tenants: 8, slots: 6, gpu_model: GpuModel::A100_40GB, seed: 11 };
    let mut input = synthetic(&spec, &models(), PlannerConfig::default());
    // Apply a first plan, then plan again: nobody moves.
    let first = planned("tessera", &input);
    for (gpu, plan) in &first.plan.gpus {
        let g = input.gpus.get_mut(gpu).unwrap();
        g.layout = plan.layout.clone();
        g.assignments = plan.assignments.clone();
    }
    let again = assign::balanced(&input);
    assert_eq!(again.moved, 0);
    for (gpu, tenants) in &again.per_gpu {
        for t in tenants {
            assert_eq!(input.current_gpu(t), Some(gpu), "{t} moved");
        }
    }
    // The one-pass index level 1 uses answers as the per-tenant scan does, retraining-only tenants included.
    let mut probe = input.clone();
    let retraining_only = probe.tenants.keys().next().unwrap().clone();
    for g in probe.gpus.values_mut() {
        g.assignments.retain(|a| a.tenant != retraining_only || a.role == Role::Retraining);
    }
    let index = probe.current_gpus();
    for t in probe.tenants.keys() {
        assert_eq!(index.get(t).copied(), probe.current_gpu(t), "{t}");
    }
    assert!(index.len() + 1 >= probe.tenants.len());
    for (gpu, tenants) in &first.outcomes {
        for t in &tenants.problem.tenants {
            if input.gpus[gpu].instance_of(&t.id, Role::Inference).is_some() {
                assert!(again.per_gpu[gpu].contains(&t.id), "{} left {gpu}", t.id);
            }
        }
    }
    // A failed GPU's tenants move; a draining GPU keeps its tenants but takes no new ones.
    let failed = input.gpus.keys().next().unwrap().clone();
    input.gpus.get_mut(&failed).unwrap().health = GpuHealth::Failed;
    let after = assign::balanced(&input);
    assert!(!after.per_gpu.contains_key(&failed));
    assert_eq!(after.per_gpu.values().map(Vec::len).sum::<usize>() + after.unplaced.len(), input.tenants.len());

    // Memory: a model too large for A100-40GB goes to the H100 of a mixed fleet.
    let mut mixed = tiny(2, 4, 5, 0);
    let big = mixed.tenants.keys().next().unwrap().clone();
    let model = mixed.tenants[&big].spec.model.clone();
    mixed.models.get_mut(&model).unwrap().inference_memory_gib = 60.0;
    let h100 = tessera_core::ids::GpuId::new(tessera_core::ids::NodeId::new("h100-node").unwrap(), 0);
    add_gpu(&mut mixed, h100.clone(), GpuModel::H100_80GB);
    let l1 = assign::balanced(&mixed);
    assert!(l1.per_gpu[&h100].contains(&big), "{l1:?}");

    // Interference: two tenants that slow each other down by 2x land on different GPUs.
    let mut pair = tiny(2, 4, 9, 0);
    let node = tessera_core::ids::NodeId::new("node-0000").unwrap();
    add_gpu(&mut pair, tessera_core::ids::GpuId::new(node, 1), GpuModel::A100_40GB);
    let ms: Vec<String> = pair.tenants.values().map(|t| t.spec.model.clone()).collect();
    pair.interference = Some(Interference {
        source: None,
        pairs: vec![(ms[0].clone(), ms[1].clone(), 2.0), (ms[1].clone(), ms[0].clone(), 2.0)],
    });
    let l1 = assign::balanced(&pair);
    assert!(l1.per_gpu.values().all(|ts| ts.len() <= 1), "{l1:?}");
}

/// Level 2 plans each tenant with its largest slowdown against the tenants it shares the GPU with: a table that
/// slows one tenant down by its co-tenant's model lowers that tenant's SLO capacity on every profile it fits (never
/// raises any), leaves a tenant it does not name alone, and a table that names no co-located pair changes nothing.
/// A bad table is refused by the input's validation, naming the pair.
#[test]
fn level2_plans_with_the_slowed_capacities_of_the_interference_table() {
    let mut input = tiny(3, 4, 21, 0);
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    let ms: Vec<String> = input.tenants.values().map(|t| t.spec.model.clone()).collect();
    let plain = problem(&input, Arrivals::Point);
    input.interference = Some(Interference {
        source: Some("test".into()),
        pairs: vec![(ms[0].clone(), ms[1].clone(), 1.6), ("no_such".into(), ms[0].clone(), 3.0)],
    });
    input.validate().unwrap();
    let slowed = problem(&input, Arrivals::Point);
    for (k, (a, b)) in plain.tenants.iter().zip(&slowed.tenants).enumerate() {
        assert_eq!(a.id, b.id);
        for (ca, cb) in a.cap.iter().zip(&b.cap) {
            assert!(cb <= ca, "{}: {cb} > {ca}", a.id);
        }
        // Tenant 0 is slowed by tenant 1's model (unless both share a model it is also slowed by); others are not,
        // unless they run tenant 0's model.
        let named = input.tenants[&ids[k]].spec.model == ms[0];
        let lower = a.cap.iter().zip(&b.cap).any(|(ca, cb)| cb < ca);
        assert_eq!(lower, named && a.cap.iter().any(|c| *c > 0.0), "{}: {:?} -> {:?}", a.id, a.cap, b.cap);
    }
    input.interference = Some(Interference { source: None, pairs: vec![("no_such".into(), "other".into(), 2.0)] });
    assert_eq!(
        problem(&input, Arrivals::Point).tenants.iter().map(|t| &t.cap).collect::<Vec<_>>(),
        plain.tenants.iter().map(|t| &t.cap).collect::<Vec<_>>()
    );
    input.interference = Some(Interference { source: None, pairs: vec![(ms[0].clone(), ms[1].clone(), 0.5)] });
    let e = input.validate().unwrap_err();
    assert!(e.field.starts_with("interference.pairs[0]"), "{e}");
}

/// Level 1 relieves a crowded GPU: its smallest tenants leave, each to the first GPU (in order) with room for it by
/// instance count and by its size on that GPU's own model, until the crowded GPU holds at most 7 slices.
#[test]
fn level1_relieves_a_crowded_gpu_smallest_first() {
    let spec = SyntheticSpec { gpus: 4, tenants: 6, slots: 6, gpu_model: GpuModel::A100_40GB, seed: 5 };
    let mut input = synthetic(&spec, &models(), PlannerConfig::default());
    // Tenants of different sizes, none of them due to retrain.
    for (k, t) in input.tenants.values_mut().enumerate() {
        t.retraining_due = false;
        let scale = 0.06 * (k + 1) as f64;
        for v in t.forecast.mean.iter_mut().chain(t.forecast.low.iter_mut()).chain(t.forecast.high.iter_mut()) {
            *v *= scale;
        }
    }
    // A mixed fleet: the GPUs after the crowded one are A100s and an H100 (last in order).
    let h100 = tessera_core::ids::GpuId::new(tessera_core::ids::NodeId::new("zz-h100-node").unwrap(), 0);
    add_gpu(&mut input, h100.clone(), GpuModel::H100_80GB);
    // The third and fourth GPUs drain: they keep their work but take none.
    for g in input.gpus.values_mut().skip(2).take(2) {
        g.health = GpuHealth::Draining;
    }
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    // Every tenant serves on the first GPU now (one instance each: 6 fit by count, not by size).
    let crowded = input.gpus.keys().next().unwrap().clone();
    for g in input.gpus.values_mut() {
        g.assignments.clear();
    }
    input.gpus.get_mut(&crowded).unwrap().assignments = ids
        .iter()
        .map(|id| tessera_core::plan::Assignment {
            placement: Placement::new(Profile::G1, 0),
            tenant: id.clone(),
            role: Role::Inference,
            preinit: false,
        })
        .collect();
    let size = |id: &TenantId, gpu: &tessera_core::ids::GpuId| {
        assign::inference_slices(&input, id, input.gpus[gpu].model).expect("every tenant fits")
    };
    // Sizes 1, 2, 2, 2, 3 and 7 slices, 17 in all: the four smallest leave to fill the second GPU, the next skips
    // the draining ones for the H100, and the largest stays.
    let sizes: Vec<f64> = ids.iter().map(|id| size(id, &crowded)).collect();
    assert_eq!(sizes, [1.0, 2.0, 2.0, 2.0, 3.0, 7.0]);
    let l1 = assign::balanced(&input);
    assert!(l1.unplaced.is_empty(), "{l1:?}");
    let second = input.gpus.keys().nth(1).unwrap();
    assert_eq!(l1.per_gpu[second], ids[..4], "{l1:?}");
    assert_eq!(l1.per_gpu[&h100], ids[4..5], "{l1:?}");
    assert_eq!(l1.per_gpu[&crowded], ids[5..], "{l1:?}");
    assert_eq!(l1.moved, 5);
    // Each GPU holds at most 7 slices of its own model's sizes.
    for (gpu, tenants) in &l1.per_gpu {
        let slices: f64 = tenants.iter().map(|id| size(id, gpu)).sum();
        assert!(slices <= 7.0 + 1e-9, "{gpu}: {slices} slices ({l1:?})");
    }
}

/// Level 1 places every tenant a GPU can hold by instance count: 7 due to retrain on one A100 all get a place (a due
/// retraining that has not started holds no instance of its own; level 2 shares the 7 between inference and
/// retraining), for every policy's level 1. A running retraining holds its instance: with three running, the GPU
/// holds those three tenants and one more.
#[test]
fn level1_places_every_tenant_a_gpu_holds_by_instance_count() {
    let mut input = tiny(7, 6, 11, 7);
    for placement in assign::Placement::ALL.map(|(_, p)| p) {
        input.config.placement = placement;
        let l1 = assign::place(&input);
        assert!(l1.unplaced.is_empty(), "{placement}: {l1:?}");
        assert_eq!(l1.per_gpu.values().map(Vec::len).sum::<usize>(), 7, "{placement}");
    }
    let gpu = input.gpus.keys().next().unwrap().clone();
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    input.gpus.get_mut(&gpu).unwrap().assignments = ids[..3]
        .iter()
        .enumerate()
        .flat_map(|(k, id)| {
            [(Role::Inference, 2 * k), (Role::Retraining, 2 * k + 1)].map(|(role, start)| {
                tessera_core::plan::Assignment {
                    placement: Placement::new(Profile::G1, start as u8),
                    tenant: id.clone(),
                    role,
                    preinit: false,
                }
            })
        })
        .collect();
    for placement in [assign::Placement::Fleet, assign::Placement::RoundRobin] {
        input.config.placement = placement;
        let l1 = assign::place(&input);
        assert_eq!(l1.unplaced.len(), 3, "{placement}: {l1:?}");
        assert!(ids[..3].iter().all(|id| l1.per_gpu[&gpu].contains(id)), "{placement}: {l1:?}");
    }
    // Once those retrainings are done (their instances still in the last plan), they hold nothing more.
    let mut done = input.clone();
    for id in &ids[..3] {
        done.tenants.get_mut(id).unwrap().retraining_due = false;
    }
    for placement in [assign::Placement::Fleet, assign::Placement::RoundRobin] {
        done.config.placement = placement;
        let l1 = assign::place(&done);
        assert!(l1.unplaced.is_empty(), "{placement}: {l1:?}");
    }
    // Planned by tessera, no tenant is left out.
    let mut fresh = tiny(7, 6, 11, 7);
    fresh.config.solver = SolverConfig::default();
    let report = planned("tessera", &fresh);
    assert!(report.stats.unplaced.is_empty(), "{:?}", report.stats.unplaced);
}

#[test]
fn planner_input_round_trips_through_json_and_bad_input_names_the_field() {
    let input = tiny(2, 4, 1, 1);
    let text = serde_json::to_string(&input).unwrap();
    let back: PlannerInput = serde_json::from_str(&text).unwrap();
    assert_eq!(back, input);
    let mut bad = input.clone();
    bad.tenants.values_mut().next().unwrap().forecast.mean[0] = -1.0;
    let err = bad.validate().unwrap_err();
    assert!(err.field.contains("forecast"), "{err}");
    let mut bad = input;
    bad.gpus.values_mut().next().unwrap().layout =
        Layout::new([Placement::new(Profile::G4, 0), Placement::new(Profile::G4, 0)]);
    assert!(bad.validate().unwrap_err().field.contains("layout"));
}

#[test]
fn level1_sizes_inference_by_the_instance_that_serves_the_peak() {
    let mut input = tiny(1, 6, 2, 0);
    let id = input.tenants.keys().next().unwrap().clone();
    let gpu = GpuModel::A100_40GB;
    let t = input.tenants[&id].clone();
    let model = input.models[&t.spec.model].clone();
    let util = input.config.target_utilization;
    let cap = |p: Profile| model.slo_capacity_on(gpu, p, t.spec.slo_ms, 1.0).unwrap().rps * util;
    let (three, four) = (cap(Profile::G3), cap(Profile::G4));
    assert!(three < four);
    let mut at = |rate: f64| {
        let f = &mut input.tenants.get_mut(&id).unwrap().forecast;
        for v in f.mean.iter_mut().chain(f.low.iter_mut()).chain(f.high.iter_mut()) {
            *v = rate;
        }
        assign::inference_slices(&input, &id, gpu).unwrap()
    };
    // Just above what a 3g serves at the target utilisation: a 4g, not 3.x slices of a fluid GPU.
    assert_eq!(at(three * 1.01), 4.0);
    assert_eq!(at(three * 0.99), 3.0);
    assert_eq!(at(0.001), f64::from(model.smallest_inference_profile(gpu).unwrap().compute_slices()));
    assert_eq!(at(cap(Profile::G7) * 2.0), 7.0);
}

#[test]
fn level1_reserves_retraining_room_for_the_most_valuable_retrainings_first() {
    let mut input = tiny(4, 6, 3, 4);
    let first = input.tenants.values().next().unwrap().spec.retraining.clone().unwrap();
    let horizon_s = input.config.slot_s * input.config.horizon_slots as f64;
    for (k, t) in input.tenants.values_mut().enumerate() {
        // The same small model, rate, accuracy and retraining (2 slices of work over the horizon); weights differ.
        t.spec.model = "resnet50".into();
        t.spec.weight = 1.0 + k as f64;
        t.spec.retraining =
            Some(tessera_core::tenant::RetrainingSpec { work_gpu_s: 2.0 * horizon_s / 7.0, ..first.clone() });
        t.accuracy = 0.5;
        t.retraining_done_gpu_s = 0.0;
        for v in t.forecast.mean.iter_mut().chain(t.forecast.low.iter_mut()).chain(t.forecast.high.iter_mut()) {
            *v = 1.0;
        }
    }
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    // One GPU: 4 slices of inference leave 3, room for one 2-slice retraining: the heaviest-weighted tenant's.
    let budget = assign::retraining_budget(&input);
    assert_eq!(budget.into_iter().collect::<Vec<_>>(), vec![ids[3].clone()]);
    // A running retraining keeps its instance whatever it is worth: its room comes first.
    let mut running = input.clone();
    let g = running.gpus.values_mut().next().unwrap();
    g.layout = Layout::new([Placement::new(Profile::G2, 0)]);
    g.assignments = vec![tessera_core::plan::Assignment {
        placement: Placement::new(Profile::G2, 0),
        tenant: ids[0].clone(),
        role: Role::Retraining,
        preinit: false,
    }];
    assert_eq!(assign::retraining_budget(&running).into_iter().collect::<Vec<_>>(), vec![ids[0].clone()]);
    // Room for all: every due retraining is reserved.
    let node = tessera_core::ids::NodeId::new("node-0000").unwrap();
    add_gpu(&mut input, tessera_core::ids::GpuId::new(node, 1), GpuModel::A100_40GB);
    assert_eq!(assign::retraining_budget(&input).len(), 4);
}

/// A retraining under way is planned at the epochs its plan chose, not the spec's: its work left and the accuracy
/// it reaches follow them, and Ekya, which chose them, restates them so that the executor keeps them.
#[test]
fn a_retraining_under_way_keeps_the_epochs_its_plan_chose() {
    let mut input = tiny(2, 6, 5, 1);
    let id = input.tenants.keys().next().unwrap().clone();
    let t = input.tenants.get_mut(&id).unwrap();
    let r = t.spec.retraining.clone().expect("the first tenant retrains");
    t.retraining_done_gpu_s = 0.25 * r.work_gpu_s;
    let default_left = t.retraining_left_s();
    assert!((default_left - 0.75 * r.work_gpu_s).abs() < 1e-9);
    assert_eq!(t.accuracy_after_retraining(), r.accuracy_after(r.epochs));
    t.retraining_epochs = Some(2.0 * r.epochs);
    assert!((t.retraining_left_s() - (r.work_for_epochs(2.0 * r.epochs) - 0.25 * r.work_gpu_s)).abs() < 1e-9);
    assert!(t.retraining_left_s() > default_left);
    assert_eq!(t.accuracy_after_retraining(), r.accuracy_after(2.0 * r.epochs));
    // Ekya with the job on a retraining instance: the plan restates its epochs wherever it keeps the job.
    let g = input.gpus.values_mut().next().unwrap();
    g.layout = Layout::new([Placement::new(Profile::G2, 0)]);
    g.assignments = vec![tessera_core::plan::Assignment {
        placement: Placement::new(Profile::G2, 0),
        tenant: id.clone(),
        role: Role::Retraining,
        preinit: false,
    }];
    let report = planned("ekya", &input);
    let keeps: Vec<_> = report
        .plan
        .gpus
        .values()
        .filter(|p| p.assignments.iter().any(|a| a.tenant == id && a.role == Role::Retraining))
        .collect();
    assert!(!keeps.is_empty(), "Ekya keeps a job under way on its instance: {:?}", report.plan);
    for plan in keeps {
        assert_eq!(plan.retraining_epochs.get(&id), Some(&(2.0 * r.epochs)), "{plan:?}");
    }
    // The input round-trips with the field; an input without it reads as the default.
    let json = serde_json::to_string(&input).unwrap();
    let back: PlannerInput = serde_json::from_str(&json).unwrap();
    assert_eq!(back.tenants[&id].retraining_epochs, Some(2.0 * r.epochs));
}

/// Tessera chooses a due retraining's epochs with the layout (`goodput::EPOCH_FACTORS`): with a GPU to itself and
/// little traffic, a small job buys accuracy with more epochs than the default, and the plan states them; the plan's
/// planning value is never below that of retraining at the default (the search starts there and keeps a
/// configuration only where it earns more); the baselines but Ekya state no configuration; and a retraining under
/// way keeps its epochs, restated in the plan so that the executor does not reset them.
#[test]
fn tessera_chooses_retraining_epochs_with_the_layout() {
    let mut input = tiny(1, 12, 5, 1);
    let id = input.tenants.keys().next().unwrap().clone();
    let t = input.tenants.get_mut(&id).unwrap();
    let r = t.spec.retraining.as_mut().expect("the tenant retrains");
    r.work_gpu_s = 2.0;
    let (default, r) = (r.epochs, r.clone());
    t.accuracy = r.initial_accuracy.min(r.accuracy_after(0.5 * default) - 0.01).max(0.0);
    t.forecast
        .mean
        .iter_mut()
        .chain(t.forecast.low.iter_mut())
        .chain(t.forecast.high.iter_mut())
        .for_each(|x| *x = 1.0);
    let tessera = planned("tessera", &input);
    let plain = planned("tessera-default-epochs", &input);
    let epochs = |report: &PlanReport| report.plan.gpus.values().find_map(|p| p.retraining_epochs.get(&id).copied());
    let chosen = epochs(&tessera).expect("a small job on an idle GPU retrains at more epochs");
    assert!(
        goodput::EPOCH_FACTORS.iter().any(|f| (f * default - chosen).abs() < 1e-9) && chosen > default,
        "{chosen} epochs (default {default}): {:?}",
        tessera.plan
    );
    assert_eq!(epochs(&plain), None);
    assert!(
        tessera.stats.objective >= plain.stats.objective - 1e-9 * plain.stats.objective.abs().max(1.0),
        "tessera {} < default epochs {}",
        tessera.stats.objective,
        plain.stats.objective
    );
    for name in ["migrator", "paris", "astraea", "static"] {
        assert_eq!(epochs(&planned(name, &input)), None, "{name}");
    }
    // Under way at those epochs: the job keeps them, and the plan restates them.
    let t = input.tenants.get_mut(&id).unwrap();
    t.retraining_epochs = Some(chosen);
    t.retraining_done_gpu_s = 0.1 * r.work_for_epochs(chosen);
    let g = input.gpus.values_mut().next().unwrap();
    g.layout = Layout::new([Placement::new(Profile::G7, 0)]);
    g.assignments = vec![tessera_core::plan::Assignment {
        placement: Placement::new(Profile::G7, 0),
        tenant: id.clone(),
        role: Role::Retraining,
        preinit: false,
    }];
    let running = planned("tessera", &input);
    assert_eq!(epochs(&running), Some(chosen), "{:?}", running.plan);
}

/// Consecutive rounds warm-started from the previous plan (as replay and the coordinator's leader run them) keep
/// the invariants, are deterministic, and plan within the configured gap of a cold round of the same input; a warm
/// start that no longer fits its GPU is used as far as it fits.
#[test]
fn warm_started_rounds_plan_as_well_as_cold_ones() {
    let spec = SyntheticSpec { gpus: 4, tenants: 12, slots: 12, gpu_model: GpuModel::A100_40GB, seed: 5 };
    // Every GPU solved from its warm start: a plan kept whole (incremental rounds) is bounded at its old prices, not
    // solved to the gap, and has its own test (`incremental_rounds_keep_a_plan_only_while_its_inputs_hold`).
    let first = synthetic(&spec, &models(), PlannerConfig { replan_band: 0.0, ..PlannerConfig::default() });
    let report = planned("tessera", &first);
    assert_eq!(report.warm_starts().len(), report.outcomes.len(), "every solved GPU leaves a warm start");
    let warm = tessera_planner::synthetic::next_round(&first, &report.outcomes, 6, 1);
    assert!(warm.gpus.values().all(|g| g.warm.is_some()));
    let mut cold = warm.clone();
    for g in cold.gpus.values_mut() {
        g.warm = None;
    }
    let (w, c) = (planned("tessera", &warm), planned("tessera", &cold));
    assert_eq!(w.plan, planned("tessera", &warm).plan, "warm rounds are deterministic");
    for (gpu, p) in &w.plan.gpus {
        check_gpu_plan(gpu, warm.gpus[gpu].model, p).unwrap();
    }
    let gap = warm.config.solver.mip_rel_gap;
    // Per GPU, a warm start's plan is within the configured gap of the cold start's, and it ends within the
    // configured gap of its bound or no further than the gap beyond the cold start's. (Where neither proves the gap,
    // both stop once the master LP settles, at Lagrangian bounds from different prices: on this input the same plan
    // ends 2.16 % below its warm bound and 1.90 % below its cold one.) The fleet's gaps are not compared: a cold
    // start's relaxation prices often prove far more than the configured gap at once, where a warm start stops
    // once it proves the gap.
    let rel = |s: &GpuStats| relative_gap(s.objective, s.bound);
    let no_worse_than_cold = |r: &PlanReport| {
        for (ws, cs) in r.stats.gpus.iter().zip(&c.stats.gpus) {
            assert_eq!(ws.gpu, cs.gpu);
            assert!(
                ws.objective >= cs.objective * (1.0 - gap),
                "{}: warm {} vs cold {}",
                ws.gpu,
                ws.objective,
                cs.objective
            );
            assert!(rel(ws) <= rel(cs).max(gap) + gap, "{}: warm gap {} vs cold {}", ws.gpu, rel(ws), rel(cs));
        }
    };
    no_worse_than_cold(&w);
    assert!(
        w.stats.objective >= c.stats.objective * (1.0 - gap),
        "warm {} vs cold {}",
        w.stats.objective,
        c.stats.objective
    );
    // The warm start survives JSON (the coordinator dumps its rounds' inputs) and re-plans to the same plan.
    let text = serde_json::to_string(&warm).unwrap();
    let back: PlannerInput = serde_json::from_str(&text).unwrap();
    assert_eq!(planned("tessera", &back).plan, w.plan);

    // A warm start from another GPU (other tenants, other prices) is no worse than none.
    let mut swapped = warm.clone();
    let ids: Vec<_> = swapped.gpus.keys().cloned().collect();
    let moved = swapped.gpus[&ids[1]].warm.clone();
    swapped.gpus.get_mut(&ids[0]).unwrap().warm = moved;
    no_worse_than_cold(&planned("tessera", &swapped));
}

#[test]
fn a_malformed_warm_start_is_a_bad_input_naming_the_field() {
    let spec = SyntheticSpec { gpus: 1, tenants: 2, slots: 6, gpu_model: GpuModel::A100_40GB, seed: 2 };
    let input = synthetic(&spec, &models(), PlannerConfig::default());
    let report = planned("tessera", &input);
    let mut next = tessera_planner::synthetic::next_round(&input, &report.outcomes, 3, 1);
    let gpu = next.gpus.keys().next().unwrap().clone();
    let w = next.gpus.get_mut(&gpu).unwrap().warm.as_mut().unwrap();
    let good = w.clone();
    w.prices.pop();
    let err = by_name("tessera").unwrap().plan(&next).unwrap_err().to_string();
    assert!(err.contains(&format!("gpus.{gpu}.warm.prices")), "{err}");

    // What a tenant's plan was made for (incremental rounds) must cover the plan's slots, with finite rates.
    let w = next.gpus.get_mut(&gpu).unwrap().warm.as_mut().unwrap();
    *w = good.clone();
    let tenant = w.tenants[0].id.clone();
    w.tenants[0].planned_for.as_mut().expect("tessera records what it planned for").forecast.high.pop();
    let err = by_name("tessera").unwrap().plan(&next).unwrap_err().to_string();
    assert!(err.contains(&format!("gpus.{gpu}.warm.tenants.{tenant}.planned_for.forecast")), "{err}");
    let w = next.gpus.get_mut(&gpu).unwrap().warm.as_mut().unwrap();
    *w = good;
    w.tenants[0].planned_for.as_mut().unwrap().forecast.mean[0] = f64::NAN;
    let err = by_name("tessera").unwrap().plan(&next).unwrap_err().to_string();
    assert!(err.contains("planned_for.forecast: rates must be finite"), "{err}");
}

/// A solve warm-started from its own result (plan and prices) takes far fewer column-generation rounds than the
/// cold solve, in total over many small problems. Not on every one: from the cold solve's final prices a few
/// problems (3 of 2,700 on a wider grid) take one or two rounds more than the cold path did.
#[test]
fn warm_starts_from_their_own_result_save_rounds_in_total() {
    let (mut problems, mut worse, mut warm_rounds, mut cold_rounds) = (0, 0, 0, 0);
    for tenants in 1..=3 {
        for slots in 2..=6 {
            for seed in 0..20u64 {
                let input = tiny(tenants, slots, seed, (seed as usize % 3).min(tenants));
                let mut pb = problem(&input, Arrivals::Band);
                goodput::tail_values(&input, &mut pb);
                let cold = cg::solve_warm(&pb, &exact(), &[], None).unwrap();
                let again =
                    cg::solve_warm(&pb, &exact(), std::slice::from_ref(&cold.solved.schedule), Some(&cold.prices))
                        .unwrap();
                problems += 1;
                worse += usize::from(again.rounds > cold.rounds);
                warm_rounds += again.rounds;
                cold_rounds += cold.rounds;
            }
        }
    }
    assert!(cold_rounds > 0 && 2 * warm_rounds <= cold_rounds, "warm {warm_rounds} rounds against cold {cold_rounds}");
    assert!(100 * worse <= problems, "{worse} of {problems} problems took more rounds warm than cold");
}

/// With sharing allowed, tessera and the perfect-forecast reference may run a tenant's retraining on its own
/// inference instance: every such plan keeps the invariants (one tenant's inference and retraining, and only
/// under the round's mode), the instance holds both in memory, sharing is taken only where the GPU's exact
/// evaluation gains, and the baselines never share.
#[test]
fn sharing_runs_retraining_beside_inference_only_where_it_gains() {
    let mut shared_plans = 0;
    for seed in 1..=6 {
        let mut input = tiny(7, 12, seed, 7);
        input.config.sharing = Sharing::Priority;
        for policy in all_names() {
            let report = planned(policy, &input);
            for (gpu, p) in &report.plan.gpus {
                let model = input.gpus[gpu].model;
                check_gpu_plan(gpu, model, p).unwrap_or_else(|e| panic!("{policy} seed {seed}: {e}"));
                let pairs: Vec<_> = p
                    .assignments
                    .iter()
                    .filter(|a| a.role == Role::Retraining)
                    .filter(|r| p.assignments.iter().any(|a| a.role == Role::Inference && a.placement == r.placement))
                    .collect();
                if !(policy.starts_with("tessera") || policy == "perfect-forecast") {
                    assert!(pairs.is_empty() && p.sharing == Sharing::Exclusive, "{policy} seed {seed} shares");
                    continue;
                }
                if pairs.is_empty() {
                    continue;
                }
                shared_plans += 1;
                assert_eq!(p.sharing, Sharing::Priority, "{policy} seed {seed}");
                for r in pairs {
                    let m = &input.models[&input.tenants[&r.tenant].spec.model];
                    let spec = model.profile(r.placement.profile).unwrap();
                    assert!(m.inference_memory_gib + m.training_memory_gib <= spec.memory_gib, "{policy}: {r}");
                }
            }
        }
        // The pass only keeps what gains: on the same solve, the shared plan is worth at least the exclusive one
        // (goodput, tails, and the progress of the shared retrainings it does not complete, as the pass values it).
        let gpu = input.gpus.keys().next().unwrap().clone();
        let ids = pb_ids(&problem(&input, Arrivals::Band));
        let solve =
            |input: &PlannerInput| goodput::solve(input, &gpu, &ids, Arrivals::Band, &exact()).unwrap().unwrap();
        let with = solve(&input);
        let mut exclusive = input.clone();
        exclusive.config.sharing = Sharing::Exclusive;
        let without = solve(&exclusive);
        let (g0, t0) = evaluate::goodput_and_tail(&without.problem, &without.placed);
        let (g, t, progress) = evaluate::goodput_tail_progress(&with.problem, &with.placed);
        let partial: f64 = with
            .problem
            .tenants
            .iter()
            .enumerate()
            .filter(|(_, x)| {
                with.placed.slots[0]
                    .iter()
                    .filter(|a| a.tenant == x.id)
                    .map(|a| a.placement)
                    .collect::<Vec<_>>()
                    .windows(2)
                    .any(|w| w[0] == w[1])
            })
            .filter(|(i, _)| progress[*i] < 1.0)
            .map(|(i, x)| progress[i] * x.tail_value)
            .sum();
        assert!(g + t + partial >= g0 + t0 - 1e-6 * (g0 + t0), "seed {seed}: {} < {}", g + t + partial, g0 + t0);
    }
    assert!(shared_plans > 0, "no plan shared an instance on a crowded GPU with every retraining due");
}

fn pb_ids(pb: &GpuProblem) -> Vec<TenantId> {
    pb.tenants.iter().map(|t| t.id.clone()).collect()
}

/// Level 2 decides what fits an instance with the memory the GPU's driver reported (the H200's 1g profiles were once
/// planned with 17.18 GiB where the driver gives 16): a model that fits the catalog's 1g but not the driver's gets
/// no capacity there.
#[test]
fn level_2_plans_with_the_drivers_memory_where_the_node_reported_it() {
    let spec = SyntheticSpec { gpus: 1, tenants: 1, slots: 4, gpu_model: GpuModel::H100_80GB, seed: 3 };
    let mut input = synthetic(&spec, &models(), PlannerConfig { solver: exact(), ..PlannerConfig::default() });
    let model_name = input.tenants.values().next().unwrap().spec.model.clone();
    let catalog_1g = GpuModel::H100_80GB.profile(Profile::G1).unwrap().memory_gib;
    input.models.get_mut(&model_name).unwrap().inference_memory_gib = catalog_1g - 0.25;
    let at = |pb: &GpuProblem, p: Profile| pb.tenants[0].cap[pb.profiles.iter().position(|x| *x == p).unwrap()];
    let pb = problem(&input, Arrivals::Point);
    assert!(at(&pb, Profile::G1) > 0.0, "fits the catalog's 1g");
    let gpu = input.gpus.values_mut().next().unwrap();
    gpu.memory_gib.insert(Profile::G1, catalog_1g - 0.75);
    assert_eq!(gpu.profile_spec(Profile::G1).unwrap().memory_gib, catalog_1g - 0.75);
    assert_eq!(gpu.profile_spec(Profile::G2), GpuModel::H100_80GB.profile(Profile::G2).copied());
    let pb = problem(&input, Arrivals::Point);
    assert_eq!(at(&pb, Profile::G1), 0.0, "does not fit the driver's 1g");
    assert!(at(&pb, Profile::G2) > 0.0);
}

/// An operator's pin holds under every policy and level-1 rule: a tenant pinned to a GPU and a profile is served
/// only there and only so (and tessera does serve it), one pinned to a GPU moves there from wherever it was, and one
/// pinned to a GPU that is not in the fleet gets no instance and is reported unplaced with its pin named.
#[test]
fn operators_pins_hold_under_every_policy() {
    let spec = SyntheticSpec { gpus: 3, tenants: 6, slots: 6, gpu_model: GpuModel::A100_40GB, seed: 7 };
    let mut input = synthetic(&spec, &models(), PlannerConfig::default());
    let gpus: Vec<_> = input.gpus.keys().cloned().collect();
    // Start from tessera's plan, so that the pins move tenants away from where they are.
    let first = planned("tessera", &input);
    for (gpu, plan) in &first.plan.gpus {
        let g = input.gpus.get_mut(gpu).unwrap();
        g.layout = plan.layout.clone();
        g.assignments = plan.assignments.clone();
    }
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    let served_on = |input: &PlannerInput, t: &TenantId| input.current_gpu(t).cloned();
    let moved_gpu = gpus.iter().find(|g| Some(*g) != served_on(&input, &ids[1]).as_ref()).unwrap().clone();
    let sized_gpu = gpus[2].clone();
    let absent: tessera_core::ids::GpuId = "elsewhere/0".parse().unwrap();
    {
        let pin = &mut input.tenants.get_mut(&ids[0]).unwrap().spec.pin;
        pin.gpus = vec![sized_gpu.clone()];
        pin.profile = Some(Profile::G3);
    }
    input.tenants.get_mut(&ids[1]).unwrap().spec.pin.gpus = vec![moved_gpu.clone()];
    input.tenants.get_mut(&ids[2]).unwrap().spec.pin.gpus = vec![absent];
    let runs = assign::Placement::ALL.into_iter().flat_map(|(_, p)| all_names().into_iter().map(move |n| (p, n)));
    for (placement, policy) in runs {
        input.config.placement = placement;
        let report = planned(policy, &input);
        let inference = |t: &TenantId| -> Vec<(tessera_core::ids::GpuId, Profile)> {
            report
                .plan
                .gpus
                .iter()
                .flat_map(|(g, p)| p.assignments.iter().map(move |a| (g, a)))
                .filter(|(_, a)| a.tenant == *t && a.role == Role::Inference)
                .map(|(g, a)| (g.clone(), a.placement.profile))
                .collect()
        };
        let what = format!("{policy} under {placement}");
        for (g, p) in inference(&ids[0]) {
            assert_eq!((&g, p), (&sized_gpu, Profile::G3), "{what}: pinned to {sized_gpu} as 3g");
        }
        for (g, _) in inference(&ids[1]) {
            assert_eq!(g, moved_gpu, "{what}: pinned to {moved_gpu}");
        }
        assert!(inference(&ids[2]).is_empty(), "{what}: pinned to a GPU not in the fleet");
        let reason = report.stats.unplaced.iter().find(|(t, _)| *t == ids[2]).map(|(_, r)| r.as_str());
        assert!(reason.is_some_and(|r| r.contains("elsewhere/0")), "{what}: {:?}", report.stats.unplaced);
        if policy == "tessera" {
            assert_eq!(inference(&ids[0]), vec![(sized_gpu.clone(), Profile::G3)], "{what}");
            assert_eq!(inference(&ids[1]).len(), 1, "{what}");
        }
    }
}

/// The statuses of a report's GPUs.
fn statuses(report: &PlanReport) -> BTreeMap<tessera_core::ids::GpuId, tessera_planner::level2::solver::SolveStatus> {
    report.stats.gpus.iter().map(|g| (g.gpu.clone(), g.status)).collect()
}

#[test]
fn incremental_rounds_keep_a_plan_only_while_its_inputs_hold() {
    use tessera_planner::level2::goodput::Replan;
    use tessera_planner::level2::solver::SolveStatus;
    use tessera_planner::synthetic::next_round;
    let spec = SyntheticSpec { gpus: 6, tenants: 18, slots: 12, gpu_model: GpuModel::A100_40GB, seed: 9 };
    let config = PlannerConfig { replan_band: 1.0, ..PlannerConfig::default() };
    let first = synthetic(&spec, &models(), config);
    let cold = planned("tessera", &first);
    assert!(statuses(&cold).values().all(|s| *s != SolveStatus::Shifted), "a cold round keeps nothing");

    // Six slots on, forecasts revised by 0.9-1.1 (inside the synthetic +-25 % band): GPUs whose retrainings did not
    // change state keep their plans, shifted forward; the others are solved again.
    let second = next_round(&first, &cold.outcomes, 6, 1);
    let kept = planned("tessera", &second);
    let full = planned("tessera-full-rounds", &second);
    let shifted: Vec<_> = statuses(&kept).into_iter().filter(|(_, s)| *s == SolveStatus::Shifted).collect();
    assert!(!shifted.is_empty(), "no plan was kept: {:?}", statuses(&kept));
    assert!(statuses(&full).values().all(|s| *s != SolveStatus::Shifted));
    assert_eq!(kept.plan.gpus.keys().collect::<Vec<_>>(), full.plan.gpus.keys().collect::<Vec<_>>());
    for (gpu, _) in &shifted {
        let (k, f, c) = (&kept.outcomes[gpu], &full.outcomes[gpu], &cold.outcomes[gpu]);
        // The same tenants (level 1 does not depend on the rounds), the last plan moved on by six slots...
        assert_eq!(k.problem.tenants.len(), f.problem.tenants.len());
        for t in 0..6 {
            let inference = |p: &tessera_planner::level2::realize::Placed, s: usize| {
                p.slots[s]
                    .iter()
                    .filter(|a| a.role == Role::Inference)
                    .map(|a| (a.tenant.clone(), a.placement.profile))
                    .collect::<Vec<_>>()
            };
            assert_eq!(inference(&k.placed, t), inference(&c.placed, t + 6), "{gpu}: slot {t} is not the last plan's");
        }
        // ...bounded by a valid bound: no plan of this round's problem, the full solve's included, beats it.
        let stats = |r: &PlanReport| r.stats.gpus.iter().find(|g| &g.gpu == gpu).unwrap().clone();
        assert!(stats(&kept).bound + 1e-6 * stats(&kept).bound.abs() >= stats(&full).objective, "{gpu}");
        assert!(stats(&kept).bound + 1e-6 >= stats(&kept).objective);
        // The warm start is the last plan's, so that its horizon runs out.
        assert_eq!(k.warm.as_ref().unwrap().at, first.now);
        let plan = &kept.plan.gpus[gpu];
        check_gpu_plan(gpu, second.gpus[gpu].model, plan).unwrap();
        assert!(plan.explanation.contains("kept the plan"), "{}", plan.explanation);
    }
    // GPUs solved again plan as the full round does, bit for bit.
    for (gpu, s) in statuses(&kept) {
        if s != SolveStatus::Shifted {
            assert_eq!(same_plan(&kept, &gpu), same_plan(&full, &gpu), "{gpu}");
        }
    }

    // A round seconds off the slot grid (the coordinator's wall clock) counts from the nearest slot.
    let mut off_grid = second.clone();
    off_grid.now = tessera_core::time::SimTime::from_ms(second.now.as_ms() + 3_000);
    let off_grid = planned("tessera", &off_grid);
    assert!(statuses(&off_grid).values().any(|s| *s == SolveStatus::Shifted), "{:?}", statuses(&off_grid));

    // Six more slots: the kept plans' horizon has run out, so every one of them is solved again.
    let third = next_round(&second, &kept.outcomes, 6, 1);
    let third = planned("tessera", &third);
    let again = statuses(&third);
    for (gpu, _) in &shifted {
        assert_ne!(again[gpu], SolveStatus::Shifted, "{gpu}: a plan past its horizon was kept");
        // Each says why it was solved again, in its stats and to the operator.
        let why = replanned(&third, gpu).unwrap_or_else(|| panic!("{gpu}: solved again for no reason given"));
        assert!(third.plan.gpus[gpu].explanation.contains("solved again: "), "{}", third.plan.gpus[gpu].explanation);
        assert!(matches!(why, Replan::HorizonOut | Replan::Tenants), "{gpu}: {why:?}");
    }
    assert!(shifted.iter().any(|(gpu, _)| replanned(&third, gpu) == Some(Replan::HorizonOut)));

    // A forecast beyond the band, or a GPU whose health changed, is solved again.
    let (gpu, _) = &shifted[0];
    let tenant = kept.outcomes[gpu].problem.tenants[0].id.clone();
    let mut burst = second.clone();
    let f = &mut burst.tenants.get_mut(&tenant).unwrap().forecast;
    f.mean.iter_mut().for_each(|m| *m *= 1.5);
    f.high.iter_mut().for_each(|m| *m *= 1.5);
    let burst = planned("tessera", &burst);
    assert_ne!(statuses(&burst)[gpu], SolveStatus::Shifted, "a burst was not replanned");
    assert!(matches!(replanned(&burst, gpu), Some(Replan::Forecast | Replan::Tenants)), "{:?}", replanned(&burst, gpu));
    let mut draining = second.clone();
    draining.gpus.get_mut(gpu).unwrap().health = GpuHealth::Draining;
    let draining = planned("tessera", &draining);
    assert_ne!(statuses(&draining).get(gpu), Some(&SolveStatus::Shifted));
    if draining.stats.gpus.iter().any(|g| &g.gpu == gpu) {
        assert_eq!(replanned(&draining, gpu), Some(Replan::Health));
    }

    // Band 0 (the setting off): every GPU is solved, and the round is the full round, bit for bit.
    let mut off = second.clone();
    off.config.replan_band = 0.0;
    let off = planned("tessera", &off);
    assert!(statuses(&off).values().all(|s| *s != SolveStatus::Shifted));
    for gpu in full.plan.gpus.keys() {
        assert_eq!(same_plan(&off, gpu), same_plan(&full, gpu), "{gpu}");
    }
}

/// Why incremental rounds solved `gpu` again, as the report's stats say.
fn replanned(report: &PlanReport, gpu: &tessera_core::ids::GpuId) -> Option<goodput::Replan> {
    report.stats.gpus.iter().find(|g| &g.gpu == gpu).and_then(|g| g.replanned)
}

/// What a GPU's plan does, whichever policy's name it carries: its layout and assignments now and later, and its
/// expected goodput, as JSON.
fn same_plan(report: &PlanReport, gpu: &tessera_core::ids::GpuId) -> String {
    let p = &report.plan.gpus[gpu];
    serde_json::to_string(&(&p.layout, &p.assignments, &p.upcoming, p.expected_goodput, &p.retraining_epochs)).unwrap()
}
