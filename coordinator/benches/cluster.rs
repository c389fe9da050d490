//! Cluster benchmarks on real processes (`cargo bench -p tessera-coordinator --bench cluster`), printing medians:
//!
//! - commits per second of tenant updates on a 3-node loopback cluster, with many updates in flight (the node
//!   batches every proposal that arrives while it persists the previous batch: one fsync per batch);
//! - time from SIGKILL of the leader to the first write acknowledged by the new leader (default timeouts: 100 ms
//!   ticks, election after 10 to 20 ticks);
//! - the planning round for 100 simulated GPUs (10 nodes of 10) and 300 tenants, end to end through TriggerPlan.
//!
//! Options through the environment: `BENCH_UPDATES` (default 5000), `BENCH_INFLIGHT` (256), `BENCH_FAILOVERS` (5),
//! `BENCH_ROUNDS` (3), `BENCH_ONLY` (`commits`, `failover` or `plan`).

#[path = "../tests/support/cluster.rs"]
#[allow(dead_code)]
mod cluster;

use std::time::{Duration, Instant};

use cluster::{Cluster, create, tenant};
use futures::StreamExt;
use tessera_proto::v1;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

const MODELS: [&str; 4] = ["resnet50", "bert_base", "mobilenet_v2", "yolov5s"];

async fn commits(updates: usize, inflight: usize) {
    let c = Cluster::start(3, &[]);
    let leader = c.wait_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let tenants = 100;
    for i in 0..tenants {
        create(&c, leader, tenant(&format!("u{i}"), MODELS[i % 4], 10.0)).await;
    }
    let mut rates = Vec::new();
    for run in 0..3 {
        let start = Instant::now();
        let client = c.client(leader);
        let results: Vec<bool> = futures::stream::iter(0..updates)
            .map(|k| {
                let mut client = client.clone();
                async move {
                    let i = k % tenants;
                    let spec = tenant(&format!("u{i}"), MODELS[i % 4], 10.0 + (run * updates + k) as f64 / 1000.0);
                    client.update_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await.is_ok()
                }
            })
            .buffer_unordered(inflight)
            .collect()
            .await;
        let secs = start.elapsed().as_secs_f64();
        let ok = results.iter().filter(|r| **r).count();
        println!("commits: run {run}: {ok}/{updates} updates acknowledged in {secs:.2} s = {:.0}/s", ok as f64 / secs);
        rates.push(ok as f64 / secs);
    }
    println!(
        "commits: median {:.0} commits/s ({inflight} in flight, 3-node loopback cluster, sled with fsync per batch)",
        median(&mut rates)
    );
}

async fn failover(n: usize) {
    let mut c = Cluster::start(3, &[]);
    let mut times = Vec::new();
    for round in 0..n {
        let leader = c.wait_leader(&[1, 2, 3], Duration::from_secs(30)).await;
        create(&c, leader, tenant(&format!("f{round}-pre"), "resnet50", 1.0)).await;
        let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
        let start = Instant::now();
        c.kill(leader);
        // Write through a survivor until one is acknowledged.
        let id = format!("f{round}");
        loop {
            let mut client = c.client(survivors[0]);
            let spec = tenant(&id, "resnet50", 1.0);
            match client.create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await {
                Ok(_) => break,
                Err(s) if s.code() == tonic::Code::AlreadyExists => break,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        println!("failover: round {round}: leader {leader} killed; a write was acknowledged after {ms:.0} ms");
        times.push(ms);
        c.spawn(leader);
        c.wait_converged(&[1, 2, 3], Duration::from_secs(30)).await;
    }
    println!(
        "failover: median {:.0} ms from leader SIGKILL to an acknowledged write (goal < 3000 ms)",
        median(&mut times)
    );
}

async fn plan(rounds: usize) {
    let c = Cluster::start(3, &["--plan-every", "1h"]);
    let leader = c.wait_leader(&[1, 2, 3], Duration::from_secs(20)).await;
    let sim = cluster::start_sim(&c.addr(leader), 10, 10, tessera_sim::node::ClockKind::Wall, "sim").await;
    cluster::eventually(Duration::from_secs(60), "100 GPUs to register", || async {
        let r = c.client(leader).list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        (r.nodes.iter().map(|n| n.gpus.len()).sum::<usize>() == 100).then_some(())
    })
    .await;
    for i in 0..300 {
        create(&c, leader, tenant(&format!("p{i}"), MODELS[i % 4], 20.0 + (i % 7) as f64 * 10.0)).await;
    }
    let mut totals = Vec::new();
    let mut solves = Vec::new();
    for round in 0..rounds {
        let start = Instant::now();
        let mut client = c.client(leader);
        let r = client.trigger_plan(v1::TriggerPlanRequest {}).await.unwrap().into_inner();
        let ms = start.elapsed().as_secs_f64() * 1000.0;
        println!(
            "plan: round {round}: {} epoch {} objective {:.1} bound {:.1} gap {:.4}; policy {:.0} ms, whole round {ms:.0} ms (commit + push to {} nodes, {} failed)",
            r.outcome, r.epoch, r.objective, r.bound, r.gap, r.solve_ms, r.pushed, r.push_failures
        );
        totals.push(ms);
        solves.push(r.solve_ms);
    }
    println!(
        "plan: 100 GPUs, 300 tenants: median policy time {:.0} ms, median whole round {:.0} ms",
        median(&mut solves),
        median(&mut totals)
    );
    sim.stop().await;
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("coordinator cluster benchmarks (a shared 2-core machine: compare medians and ratios, not absolutes)");
    rt.block_on(async {
        if only.is_empty() || only == "commits" {
            commits(env("BENCH_UPDATES", 5000), env("BENCH_INFLIGHT", 256)).await;
        }
        if only.is_empty() || only == "failover" {
            failover(env("BENCH_FAILOVERS", 5)).await;
        }
        if only.is_empty() || only == "plan" {
            plan(env("BENCH_ROUNDS", 3)).await;
        }
    });
}
