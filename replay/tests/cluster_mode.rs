//! `replay --mode cluster` through a real coordinator cluster (a development cluster of 3 Raft replicas over gRPC on
//! loopback, virtual workload clock, started in the test process as `coordinator dev-cluster` starts it) gives the
//! same numbers as `--mode in-process` for the same seed, with and without replans on bursts.

use std::path::Path;
use std::process::Command;

use clap::Parser;
use serde_json::Value;
use tessera_coordinator::dev_cluster::{self, DevCluster, DevClusterArgs};

fn replay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_replay"));
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    c
}

const SMALL: &[&str] = &["--gpus", "2", "--duration", "5m", "--load", "0.1", "--json"];

/// A running development cluster and the runtime that serves it; dropping it stops the cluster.
struct Up {
    runtime: Option<tokio::runtime::Runtime>,
    cluster: Option<DevCluster>,
}

impl Drop for Up {
    fn drop(&mut self) {
        if let (Some(rt), Some(c)) = (self.runtime.take(), self.cluster.take()) {
            rt.block_on(c.stop());
        }
    }
}

/// The arguments of `coordinator dev-cluster` with `extra` flags, on free ports.
#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: DevClusterArgs,
}

/// Starts a development cluster with `extra` arguments and returns its three endpoints.
fn cluster_up(extra: &[&str]) -> (Up, Vec<String>) {
    let mut argv = vec!["dev-cluster", "--listen-base", "127.0.0.1:0", "--plan-every", "60s"];
    argv.extend_from_slice(extra);
    let mut args = Cli::parse_from(argv).args;
    args.models = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cluster = runtime.block_on(dev_cluster::start(&args)).unwrap();
    let endpoints = cluster.endpoints.clone();
    assert_eq!(endpoints.len(), 3, "the cluster has {endpoints:?}");
    (Up { runtime: Some(runtime), cluster: Some(cluster) }, endpoints)
}

#[test]
fn a_replay_through_a_coordinator_cluster_gives_the_same_numbers_as_in_process() {
    let (up, endpoints) = cluster_up(&["--horizon", "6"]);

    // A planning flag that disagrees with the cluster's settings is refused, in one line naming the difference.
    let out = replay()
        .args(SMALL)
        .args(["--horizon", "8", "--mode", "cluster", "--coordinator", &endpoints[0]])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("horizon_slots = 8 (6)") && err.trim().lines().count() == 1, "{err}");

    // Through a follower or the leader alike: give the second node. Replay adopts the cluster's horizon of 6 (a flag
    // that repeats it is welcome).
    let cluster_args = ["--mode", "cluster", "--coordinator", &endpoints[1], "--slot", "10s"];
    let out = replay().args(SMALL).args(cluster_args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cluster: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cluster["scenario"]["horizon_slots"], 6, "{}", cluster["scenario"]);
    let out = replay().args(SMALL).args(["--policy", "tessera", "--horizon", "6"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local: Value = serde_json::from_slice(&out.stdout).unwrap();

    let run = |v: &Value, name: &str| -> Value {
        v["policies"].get(name).cloned().unwrap_or_else(|| panic!("no {name} in {v}"))
    };
    let c = run(&cluster, "cluster");
    let l = run(&local, "tessera");
    // The same trace and seed give the same numbers: the cluster's leader planned from what the nodes reported
    // exactly what in-process replay planned from the executor, and the executor served the same requests.
    assert!(c["requests"].as_u64().unwrap() > 1000, "{c}");
    for key in [
        "requests",
        "requests_within_slo",
        "completed",
        "dropped",
        "goodput",
        "slo_attainment",
        "mean_accuracy",
        "reconfigurations",
        "retrainings_completed",
        "drift_windows",
        "gpu_hours",
    ] {
        assert_eq!(c[key], l[key], "{key}: cluster {c}\nin-process {l}");
    }

    // A second replay against the same cluster is refused: it already holds a fleet.
    let out = replay().args(SMALL).args(["--mode", "cluster", "--coordinator", &endpoints[0]]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("fresh cluster"));
    drop(up);
}

#[test]
fn cluster_mode_needs_a_coordinator() {
    let out = replay().args(["--mode", "cluster"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--coordinator"));
}

/// With `--replan-on-burst` on both sides, the code trace's burst at 180 s makes the cluster's leader plan again
/// inside the window, at the same slot and with the same plan as in-process replay: the same numbers.
#[test]
fn burst_replans_through_a_cluster_give_the_same_numbers_as_in_process() {
    let (up, endpoints) = cluster_up(&["--replan-on-burst"]);
    let code = ["--trace", "traces/azure-llm-2023-code.csv", "--duration", "4m", "--replan-on-burst", "--json"];
    let out = replay().args(code).args(["--mode", "cluster", "--coordinator", &endpoints[0]]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cluster: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = replay().args(code).args(["--policy", "tessera"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (c, l) = (&cluster["policies"]["cluster"], &local["policies"]["tessera"]);
    assert!(c["burst_replans"].as_u64().unwrap() >= 1, "{c}");
    for key in ["burst_replans", "requests", "requests_within_slo", "dropped", "goodput", "reconfigurations"] {
        assert_eq!(c[key], l[key], "{key}: cluster {c}\nin-process {l}");
    }
    drop(up);
}
