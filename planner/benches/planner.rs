//! Planner benchmarks: per-GPU level-2 solves (1, 3, 7 tenants x 10, 30, 200 slots), the backends on the compact
//! MILP, whole fleet rounds (10, 100 GPUs; 1,000 GPUs with `TESSERA_BENCH_FLEET_1000=1`, minutes per sample), the
//! fleet placement (level 1) of a cold round on 1,000 and 10,000 GPUs, and the next round after a plan,
//! warm-started from it and cold.
//!
//! Run: `cargo bench -p tessera-planner --bench planner`. Besides criterion's timings, each case prints one line
//! with its objective, bound and relative gap (gap = (bound - objective) / bound, the bound from column
//! generation's Lagrangian or the solver's dual bound).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tessera_core::GpuModel;
use tessera_core::ids::TenantId;
use tessera_core::model::ModelProfile;
use tessera_planner::level2::build::{Arrivals, gpu_problem};
use tessera_planner::level2::problem::GpuProblem;
use tessera_planner::level2::solver::{Backend, SolverConfig, relative_gap};
use tessera_planner::level2::{cg, goodput, ilp};
use tessera_planner::policies::by_name;
use tessera_planner::policy::PlanOutcome;
use tessera_planner::synthetic::{SyntheticSpec, input as synthetic, next_round};
use tessera_planner::{PlannerConfig, PlannerInput};

fn models() -> BTreeMap<String, ModelProfile> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    tessera_core::config::load_model_dir(&dir).expect("shipped model profiles load")
}

fn fleet(gpus: usize, tenants: usize, slots: usize, seed: u64) -> PlannerInput {
    let spec = SyntheticSpec { gpus, tenants, slots, gpu_model: GpuModel::A100_40GB, seed };
    synthetic(&spec, &models(), PlannerConfig::default())
}

fn one_gpu(tenants: usize, slots: usize, seed: u64) -> GpuProblem {
    let input = fleet(1, tenants, slots, seed);
    let gpu = input.gpus.keys().next().expect("one GPU").clone();
    let ids: Vec<TenantId> = input.tenants.keys().cloned().collect();
    // Tessera's level-2 problem: the forecast band and the value of retraining beyond the horizon.
    let mut pb = gpu_problem(&input, &gpu, &ids, Arrivals::Band);
    goodput::tail_values(&input, &mut pb);
    pb
}

fn level2(c: &mut Criterion) {
    let mut group = c.benchmark_group("level2");
    group.sample_size(10);
    let config = SolverConfig::default();
    for tenants in [1, 3, 7] {
        for slots in [10, 30, 200] {
            let pb = one_gpu(tenants, slots, 1);
            let s = cg::solve(&pb, &config).expect("solves");
            println!(
                "level2 tenants={tenants} slots={slots}: objective {:.1} bound {:.1} gap {:.3}% ({:?})",
                s.objective,
                s.bound,
                100.0 * relative_gap(s.objective, s.bound),
                s.status
            );
            group.bench_with_input(BenchmarkId::new(format!("{tenants}t"), slots), &pb, |b, pb| {
                b.iter(|| cg::solve(black_box(pb), &config).expect("solves"))
            });
        }
    }
    group.finish();
}

fn backends(c: &mut Criterion) {
    let mut group = c.benchmark_group("compact_milp");
    group.sample_size(10);
    for (tenants, slots) in [(2, 4), (3, 6)] {
        let pb = one_gpu(tenants, slots, 2);
        for backend in [Backend::Highs, Backend::Microlp] {
            let config = SolverConfig { backend, mip_rel_gap: 0.0, time_limit_s: 30.0, max_nodes: 1_000_000 };
            let s = ilp::solve(&pb, &config).expect("solves");
            println!(
                "compact {backend:?} tenants={tenants} slots={slots}: objective {:.1} bound {:.1} ({:?})",
                s.objective, s.bound, s.status
            );
            group.bench_with_input(
                BenchmarkId::new(format!("{backend:?}"), format!("{tenants}t{slots}s")),
                &pb,
                |b, pb| b.iter(|| ilp::solve(black_box(pb), &config).expect("solves")),
            );
        }
    }
    group.finish();
}

fn fleets(c: &mut Criterion) {
    let mut group = c.benchmark_group("fleet");
    group.sample_size(10);
    let mut sizes = vec![10, 100];
    if std::env::var_os("TESSERA_BENCH_FLEET_1000").is_some() {
        sizes.push(1000);
    } else {
        println!("fleet 1000 GPUs skipped (set TESSERA_BENCH_FLEET_1000=1; or `replay plan --synthetic --gpus 1000`)");
    }
    for gpus in sizes {
        let input = fleet(gpus, 4 * gpus, 30, 3);
        let policy = by_name("tessera").expect("known");
        if let PlanOutcome::Planned(r) = policy.plan(&input).expect("plans") {
            println!(
                "fleet gpus={gpus} tenants={}: objective {:.1} bound {:.1} gap {:.3}%",
                4 * gpus,
                r.stats.objective,
                r.stats.bound,
                100.0 * r.stats.gap
            );
        }
        group.bench_with_input(BenchmarkId::new("tessera", gpus), &input, |b, input| {
            b.iter(|| policy.plan(black_box(input)).expect("plans"))
        });
    }
    group.finish();
}

/// Level 1 alone on a cold round (every tenant placed afresh), 4 tenants a GPU: the serial part of a fleet round,
/// which must grow no faster than the fleet.
fn level1(c: &mut Criterion) {
    let mut group = c.benchmark_group("level1");
    group.sample_size(10);
    for gpus in [1000, 10_000] {
        let input = fleet(gpus, 4 * gpus, 12, 3);
        let placed = tessera_planner::assign::place(&input);
        println!(
            "level1 gpus={gpus} tenants={}: {} placed, {} unplaced",
            4 * gpus,
            placed.per_gpu.values().map(Vec::len).sum::<usize>(),
            placed.unplaced.len()
        );
        group.bench_with_input(BenchmarkId::new("place", gpus), &input, |b, input| {
            b.iter(|| tessera_planner::assign::place(black_box(input)))
        });
    }
    group.finish();
}

/// Consecutive rounds: the round 6 slots (one plan period) after a first one, whose plan it runs, with forecasts
/// moved on and revised ([`next_round`]), planned warm (from the first round's plan and prices, as replay and the
/// coordinator plan) and cold. One GPU: Tessera's level 2 with every tenant on it (as `level2/`); 100 GPUs: the
/// whole round.
fn warm_rounds(c: &mut Criterion) {
    let mut group = c.benchmark_group("warm");
    group.sample_size(10);
    let config = SolverConfig::default();
    let strip = |input: &PlannerInput| {
        let mut cold = input.clone();
        for g in cold.gpus.values_mut() {
            g.warm = None;
        }
        cold
    };
    for (tenants, slots) in [(7, 30), (3, 30), (7, 10)] {
        let first = fleet(1, tenants, slots, 1);
        let gpu = first.gpus.keys().next().expect("one GPU").clone();
        let ids: Vec<TenantId> = first.tenants.keys().cloned().collect();
        let solve = |input: &PlannerInput| {
            goodput::solve(input, &gpu, &ids, Arrivals::Band, &config).expect("solves").expect("has tenants")
        };
        let outcomes = BTreeMap::from([(gpu.clone(), solve(&first))]);
        let warm = next_round(&first, &outcomes, 6, 1);
        let cold = strip(&warm);
        for (name, input) in [("warm", &warm), ("cold", &cold)] {
            let o = solve(input);
            let (g, tail) = tessera_planner::level2::evaluate::goodput_and_tail(&o.problem, &o.placed);
            println!(
                "{name} level2 tenants={tenants} slots={slots}: objective {:.1} bound {:.1} gap {:.3}% ({:?})",
                g + tail,
                o.bound,
                100.0 * relative_gap(g + tail, o.bound.max(g + tail)),
                o.status
            );
            group.bench_with_input(BenchmarkId::new(name, format!("{tenants}t/{slots}")), input, |b, input| {
                b.iter(|| solve(black_box(input)))
            });
        }
    }
    let policy = by_name("tessera").expect("known");
    let first = fleet(100, 300, 12, 1);
    let PlanOutcome::Planned(report) = policy.plan(&first).expect("plans") else { panic!("infeasible") };
    let warm = next_round(&first, &report.outcomes, 6, 1);
    let cold = strip(&warm);
    for (name, input) in [("warm", &warm), ("cold", &cold)] {
        if let PlanOutcome::Planned(r) = policy.plan(input).expect("plans") {
            println!(
                "{name} fleet gpus=100 tenants=300 slots=12: objective {:.1} bound {:.1} gap {:.3}%",
                r.stats.objective,
                r.stats.bound,
                100.0 * r.stats.gap
            );
        }
        group.bench_with_input(BenchmarkId::new(name, "fleet100"), input, |b, input| {
            b.iter(|| policy.plan(black_box(input)).expect("plans"))
        });
    }
    group.finish();
}

criterion_group!(benches, level2, backends, fleets, level1, warm_rounds);
criterion_main!(benches);
