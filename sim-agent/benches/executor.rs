//! Workload executor throughput: simulated requests per second of host time.
//!
//! Fleet: 8 A100-40GB GPUs, each `2g@0 1g@2 1g@3 3g@4`, shared by 4 tenants (two ResNet-50-like, two
//! BERT-like, SLO 30 ms) so that every tenant has one instance on every GPU (8 instances, two of each size);
//! Poisson arrivals at 60% of each tenant's SLO capacity (about 125 000 requests per second), about 1 million
//! requests (8 simulated seconds). Cases: earliest-finish dispatch and ELSA dispatch. Criterion reports elements
//! (requests) per second of one thread, arrival generation and executor construction excluded; each case also
//! prints the run's SLO attainment once, so a benchmark of a broken run does not go unnoticed.
//!
//! Run: `cargo bench -p tessera-sim --bench executor -- --warm-up-time 1 --measurement-time 5`.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::model::{LatencyModel, ModelProfile, TrainingSpeed};
use tessera_core::plan::{Assignment, GpuPlan, Role};
use tessera_core::tenant::{DemandSource, TenantSpec};
use tessera_core::{GpuModel, Placement};
use tessera_sim::executor::{
    Arrival, Dispatch, Executor, ExecutorConfig, FleetSpec, NoInterference, TenantIndex, poisson_arrivals,
};

const GPUS: u32 = 8;
const SLO_MS: f64 = 30.0;
const REQUESTS: f64 = 1_000_000.0;
const PLACEMENTS: [&str; 4] = ["2g@0", "1g@2", "1g@3", "3g@4"];

fn model(name: &str, base_ms: f64, alpha: f64, beta: f64, max_batch: u32) -> ModelProfile {
    ModelProfile {
        name: name.into(),
        description: String::new(),
        inference_memory_gib: 1.0,
        training_memory_gib: 4.0,
        max_batch,
        latency: LatencyModel::Parametric { base_ms, alpha, beta },
        training: TrainingSpeed::Exponent(1.0),
    }
}

fn fleet() -> FleetSpec {
    // ResNet-50's parametric fit (configs/models/resnet50.toml) and a heavier, more compute-bound model.
    let models = [model("resnet", 0.5, 0.38, 0.095, 64), model("bert", 2.0, 0.8, 0.05, 32)];
    let tenants = (0..4)
        .map(|i| TenantSpec {
            jobs: Default::default(),
            pin: Default::default(),
            id: TenantId::new(format!("t{i}")).unwrap(),
            name: format!("t{i}"),
            model: if i % 2 == 0 { "resnet" } else { "bert" }.into(),
            slo_ms: SLO_MS,
            slo_percentile: 99.0,
            weight: 1.0,
            demand: DemandSource::Poisson { rate_rps: 0.0 },
            retraining: None,
        })
        .collect();
    let gpus = (0..GPUS).map(|g| (GpuId::new("node".parse().unwrap(), g), GpuModel::A100_40GB)).collect();
    FleetSpec { models: models.into_iter().map(|m| (m.name.clone(), m)).collect(), tenants, gpus }
}

/// GPU `g` gives placement `j` to tenant `(g + j) mod 4`.
fn gpu_plan(g: u32) -> GpuPlan {
    GpuPlan {
        layout: PLACEMENTS.join(" ").parse().unwrap(),
        assignments: PLACEMENTS
            .iter()
            .enumerate()
            .map(|(j, p)| Assignment {
                placement: p.parse().unwrap(),
                tenant: TenantId::new(format!("t{}", (g as usize + j) % 4)).unwrap(),
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

fn executor(dispatch: Dispatch) -> Executor {
    let config = ExecutorConfig { dispatch, ..ExecutorConfig::default() };
    let mut ex = Executor::new(config, fleet(), Box::new(NoInterference)).unwrap();
    for g in 0..GPUS {
        ex.install_plan(&GpuId::new("node".parse().unwrap(), g), &gpu_plan(g)).unwrap();
    }
    ex
}

/// Poisson arrivals at 60% of each tenant's SLO capacity over its 8 instances, about `REQUESTS` in all.
fn arrivals() -> (Vec<Arrival>, f64) {
    let f = fleet();
    let rates: Vec<(TenantIndex, f64)> = f
        .tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let m = &f.models[&t.model];
            // Over the 8 GPUs every tenant holds each of the 4 placements twice.
            let capacity: f64 = PLACEMENTS
                .iter()
                .map(|p| {
                    let profile = p.parse::<Placement>().unwrap().profile;
                    2.0 * m.slo_capacity_on(GpuModel::A100_40GB, profile, t.slo_ms, 1.0).map_or(0.0, |c| c.rps)
                })
                .sum();
            (TenantIndex(i as u32), 0.6 * capacity)
        })
        .collect();
    let total_rps: f64 = rates.iter().map(|r| r.1).sum();
    let end_ms = REQUESTS / total_rps * 1000.0;
    (poisson_arrivals(1, &rates, 0.0, end_ms), end_ms)
}

fn run(ex: &mut Executor, arrivals: &[Arrival], end_ms: f64) {
    ex.arrive_all(arrivals).unwrap();
    ex.advance_to(end_ms + 1_000.0).unwrap();
}

fn throughput(c: &mut Criterion) {
    let (arrivals, end_ms) = arrivals();
    let mut group = c.benchmark_group("executor");
    group.sample_size(10);
    group.throughput(Throughput::Elements(arrivals.len() as u64));
    for (name, dispatch) in [("earliest_finish", Dispatch::EarliestFinish), ("elsa", Dispatch::Elsa)] {
        let mut check = executor(dispatch);
        run(&mut check, &arrivals, end_ms);
        let total = check.report().total;
        println!(
            "executor/{name}: {} requests over {:.0} s simulated, SLO attainment {:.4}, {} batches",
            total.requests,
            end_ms / 1000.0,
            total.slo_attainment(),
            check.report().tenants.values().map(|t| t.metrics.batches).sum::<u64>()
        );
        group.bench_function(format!("8gpu_4tenant_1M_{name}"), |b| {
            b.iter_batched(
                || executor(dispatch),
                |mut ex| {
                    run(&mut ex, black_box(&arrivals), end_ms);
                    ex
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, throughput);
criterion_main!(benches);
