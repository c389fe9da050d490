//! A real 3-process coordinator cluster on loopback with real sled files: elections, writes through any node,
//! SIGKILL and restart of the leader, a minority partition, snapshot catch-up and membership changes.

mod support;

use std::time::Duration;

use support::cluster::{Cluster, create, eventually, tenant};
use tessera_proto::v1;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_a_leader_kill_and_its_restart() {
    let mut c = Cluster::start(3, &[]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;

    // Writes through every node: followers forward to the leader.
    let mut acked = Vec::new();
    for i in 0..9u64 {
        let via = i % 3 + 1;
        let id = format!("t{i}");
        create(&c, via, tenant(&id, "resnet50", 10.0)).await;
        acked.push(id);
    }

    c.kill(leader);
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    let new_leader = c.wait_leader(&survivors, T).await;
    assert_ne!(new_leader, leader);
    for i in 9..15u64 {
        let via = survivors[(i % 2) as usize];
        let id = format!("t{i}");
        create(&c, via, tenant(&id, "bert_base", 5.0)).await;
        acked.push(id);
    }
    // A linearizable read through either survivor sees every acknowledged write.
    for s in &survivors {
        let r = c.client(*s).list_tenants(v1::ListRequest { stale: false }).await.unwrap().into_inner();
        let ids: Vec<String> = r.tenants.into_iter().filter_map(|t| t.spec.map(|s| s.id)).collect();
        for id in &acked {
            assert!(ids.contains(id), "node {s} lost acknowledged tenant {id}: {ids:?}");
        }
    }

    // The killed leader restarts from its sled directory and catches up.
    c.spawn(leader);
    c.wait_converged(&[1, 2, 3], T).await;
    let on_restarted = c.tenants_on(leader).await.unwrap();
    for id in &acked {
        assert!(on_restarted.contains(id), "restarted node lost {id}");
    }
    assert_eq!(on_restarted.len(), acked.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_accepts_no_writes_and_everyone_converges_after_healing() {
    let c = Cluster::start(3, &["--allow-fault-injection"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    create(&c, leader, tenant("before", "resnet50", 10.0)).await;

    // Cut the leader off: it is the minority.
    c.isolate(leader).await;
    let majority: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    let minority_write = c
        .client(leader)
        .create_tenant(v1::TenantRequest { spec: Some(tenant("minority", "resnet50", 1.0)), ..Default::default() })
        .await;
    let err = minority_write.expect_err("the minority side accepted a write");
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err:?}");

    let new_leader = c.wait_leader(&majority, T).await;
    for i in 0..5 {
        create(&c, majority[i % 2], tenant(&format!("majority-{i}"), "yolov5s", 3.0)).await;
    }
    // The isolated node still has only what it had.
    let isolated = c.tenants_on(leader).await.unwrap();
    assert!(!isolated.iter().any(|t| t.starts_with("majority")), "{isolated:?}");

    c.heal().await;
    c.wait_converged(&[1, 2, 3], T).await;
    let expected = c.tenants_on(new_leader).await.unwrap();
    assert_eq!(expected.len(), 6, "{expected:?}");
    assert!(!expected.contains(&"minority".to_string()));
    for id in [1, 2, 3] {
        let got = eventually(T, "the healed node to hold the majority's tenants", || async {
            c.tenants_on(id).await.filter(|t| *t == expected)
        })
        .await;
        assert_eq!(got, expected);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_fell_behind_catches_up_from_a_snapshot() {
    // Snapshot every 10 entries and keep no tail, so the log the follower needs is compacted away.
    let mut c = Cluster::start(3, &["--snapshot-every", "10", "--keep-tail", "0"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let follower = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    c.kill(follower);
    let up: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != follower).collect();
    for i in 0..40 {
        create(&c, up[i % 2], tenant(&format!("s{i}"), "mobilenet_v2", 1.0)).await;
    }
    c.spawn(follower);
    c.wait_converged(&[1, 2, 3], T).await;
    let got = c.tenants_on(follower).await.unwrap();
    assert_eq!(got.len(), 40);
    assert!(
        c.log(follower).contains("installed a snapshot from the leader"),
        "the follower caught up without a snapshot:\n{}",
        c.log_tail(follower)
    );
}

fn cli(args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(support::cluster::binary()).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_and_removed_from_the_command_line() {
    let mut c = Cluster::start(3, &[]);
    c.wait_leader(&[1, 2, 3], T).await;
    create(&c, 2, tenant("m0", "resnet50", 1.0)).await;
    let addr4 = c.prepare_joiner(4);
    let endpoints = c.endpoints();

    // Through a follower: it forwards the change to the leader.
    let (ok, out, err) = cli(&["member", "add", "4", &addr4, "--endpoints", &endpoints, "--json"]);
    assert!(ok, "{err}");
    let members: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(members.as_array().unwrap().len(), 4, "{out}");
    c.spawn(4);
    c.wait_converged(&[1, 2, 3, 4], T).await;
    assert_eq!(c.tenants_on(4).await.unwrap(), vec!["m0".to_string()]);
    // The new member takes part in writes.
    create(&c, 4, tenant("m1", "resnet50", 1.0)).await;

    let (ok, _, err) = cli(&["member", "rm", "4", "--endpoints", &endpoints]);
    assert!(ok, "{err}");
    let (ok, out, err) = cli(&["status", "--endpoints", &c.addr(1), "--json"]);
    assert!(ok, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ids: Vec<u64> = status["members"].as_array().unwrap().iter().map(|m| m["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2, 3], "{out}");

    // Bad input is named.
    let (ok, _, err) = cli(&["member", "add", "0", "x:1", "--endpoints", &endpoints]);
    assert!(!ok && err.contains("id"), "{err}");
    let (ok, _, err) = cli(&["serve", "--id", "1", "--listen", "nonsense", "--data-dir", "x"]);
    assert!(!ok && err.contains("listen"), "{err}");
}
