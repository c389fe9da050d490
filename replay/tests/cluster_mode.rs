//! `replay --mode cluster` through a real coordinator cluster started by `replay cluster-up` (3 Raft nodes over
//! gRPC in a child process, virtual workload clock): the same requests as in-process, planned by the cluster.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::Value;

fn replay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_replay"));
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    c
}

const SMALL: &[&str] = &["--gpus", "2", "--duration", "5m", "--horizon", "6", "--load", "0.1", "--json"];

struct Up(std::process::Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_replay_through_a_coordinator_cluster_serves_the_same_requests_with_the_clusters_plans() {
    let mut child = replay()
        .args(["cluster-up", "--listen-base", "127.0.0.1:0", "--plan-every", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let up = Up(child);
    let mut endpoints = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(addr) = line.split_whitespace().find_map(|w| w.strip_prefix("addr=")) {
            endpoints.push(addr.to_string());
        }
        if line.starts_with("ready:") {
            break;
        }
    }
    assert_eq!(endpoints.len(), 3, "cluster-up printed {endpoints:?}");

    // Through a follower or the leader alike: give the second node.
    let out = replay().args(SMALL).args(["--mode", "cluster", "--coordinator", &endpoints[1]]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let cluster: Value = serde_json::from_slice(&out.stdout).unwrap();
    let out = replay().args(SMALL).args(["--policy", "tessera"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let local: Value = serde_json::from_slice(&out.stdout).unwrap();

    let run = |v: &Value, name: &str| -> Value {
        v["policies"].get(name).cloned().unwrap_or_else(|| panic!("no {name} in {v}"))
    };
    let c = run(&cluster, "cluster");
    let l = run(&local, "tessera");
    // The same trace and seed: the same requests reached the simulated GPUs.
    assert_eq!(c["requests"], l["requests"], "cluster {c}\nin-process {l}");
    assert!(c["requests"].as_u64().unwrap() > 1000, "{c}");
    // The cluster planned every window and its layouts served most of them within SLO.
    assert!(c["slo_attainment"].as_f64().unwrap() > 0.5, "{c}");
    assert!(c["goodput"].as_f64().unwrap() > 0.0, "{c}");
    eprintln!(
        "goodput: cluster {} vs in-process {}; SLO attainment {} vs {}",
        c["goodput"], l["goodput"], c["slo_attainment"], l["slo_attainment"]
    );

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
