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
async fn acknowledged_writes_survive_every_member_killed_at_once_under_load() {
    // The durability rule of asynchronous persistence: a write is acknowledged only once it is durable on a
    // majority (and on the leader). Kill every member while 16 writers keep writes in flight through the leader,
    // restart them all from their files: every acknowledged write is there.
    let mut c = Cluster::start(3, &[]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    // The first write waits (with retries) until the members have loaded the model profiles.
    create(&c, leader, tenant("first", "resnet50", 1.0)).await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(vec!["first".to_string()]));
    let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..16 {
        let (mut client, acked, killed) = (c.client(leader), acked.clone(), killed.clone());
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let id = format!("w{w}-{i}");
                let request = v1::TenantRequest { spec: Some(tenant(&id, "resnet50", 1.0)), ..Default::default() };
                match client.create_tenant(request).await {
                    Ok(_) => acked.lock().unwrap().push(id),
                    // Once the members are killed every write fails; before, a failure (a busy moment) is retried
                    // under the next id.
                    Err(_) if killed.load(std::sync::atomic::Ordering::SeqCst) => return,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        }));
    }
    eventually(Duration::from_secs(60), "200 acknowledged writes", || {
        let n = acked.lock().unwrap().len();
        async move { (n >= 200).then_some(()) }
    })
    .await;
    killed.store(true, std::sync::atomic::Ordering::SeqCst);
    for id in [1, 2, 3] {
        c.kill(id);
    }
    for w in writers {
        w.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    for id in [1, 2, 3] {
        c.spawn(id);
    }
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let ids = eventually(T, "a linearizable read after the restart", || {
        let mut client = c.client(leader);
        async move {
            let r = client.list_tenants(v1::ListRequest { stale: false }).await.ok()?.into_inner();
            Some(r.tenants.into_iter().filter_map(|t| t.spec.map(|s| s.id)).collect::<std::collections::BTreeSet<_>>())
        }
    })
    .await;
    let lost: Vec<&String> = acked.iter().filter(|id| !ids.contains(*id)).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged writes lost: {lost:?}", lost.len(), acked.len());
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
async fn members_stop_promptly_on_sigterm_while_peers_stream_to_them() {
    // Peers keep a Raft stream open to every member; a graceful shutdown must end them rather than wait for them
    // (it waited until systemd's or docker's SIGKILL before).
    let mut c = Cluster::start(3, &[]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    create(&c, leader, tenant("before", "resnet50", 1.0)).await;
    let follower = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    c.terminate(follower, Duration::from_secs(5));
    c.terminate(leader, Duration::from_secs(5));
    c.spawn(follower);
    c.spawn(leader);
    c.wait_converged(&[1, 2, 3], T).await;
    let via = c.wait_leader(&[1, 2, 3], T).await;
    create(&c, via, tenant("after", "resnet50", 1.0)).await;
    for id in [1, 2, 3] {
        let tenants =
            eventually(T, "both tenants on every member", || async { c.tenants_on(id).await.filter(|t| t.len() == 2) })
                .await;
        assert_eq!(tenants, vec!["after".to_string(), "before".to_string()]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_fell_behind_catches_up_from_a_snapshot() {
    // Snapshot every 10 entries, whatever their size, and keep no tail, so the log the follower needs is compacted
    // away.
    let mut c = Cluster::start(3, &["--snapshot-every", "10", "--snapshot-log-ratio", "0", "--keep-tail", "0"]);
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
    let (code, out, err) = cli_status(args);
    (code == 0, out, err)
}

/// The exit status, stdout and stderr of a CLI command.
fn cli_status(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(support::cluster::binary()).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_are_added_and_removed_from_the_command_line() {
    let mut c = Cluster::start(3, &["--slot", "5s", "--horizon", "6"]);
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
    // Each node says what it plans with: its policy and its [planner] settings, flags over defaults.
    assert_eq!((status["policy"].as_str(), status["planner"]["slot"].as_str()), (Some("tessera"), Some("5s")), "{out}");
    assert_eq!(
        (status["planner"]["horizon_slots"].as_u64(), status["planner"]["plan_every"].as_str()),
        (Some(6), Some("1m"))
    );
    let (ok, out, err) = cli(&["status", "--endpoints", &c.addr(2)]);
    assert!(ok && out.contains("policy tessera") && out.contains("slot = \"5s\""), "{out}{err}");

    // Bad input is named, and exits with 7; a cluster that does not answer with 3.
    let (code, _, err) = cli_status(&["member", "add", "0", "x:1", "--endpoints", &endpoints]);
    assert!(code == 7 && err.contains("id"), "{code}: {err}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let (code, _, err) = cli_status(&["status", "--endpoints", &closed, "--timeout", "1s"]);
    assert!(code == 3, "{code}: {err}");
    let (ok, _, err) = cli(&["serve", "--id", "1", "--listen", "nonsense", "--data-dir", "x"]);
    assert!(!ok && err.contains("listen"), "{err}");
}

/// Clients ride out an election: right after the leader is SIGKILLed, CLI writes through all endpoints (the dead
/// leader first) succeed by retrying across endpoints until their timeout, each applied once; a conditional update
/// made from a stale revision is refused and changes nothing; bad tenants are refused with the field named; and a
/// reader that closes the pipe early gets no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_rides_out_an_election_and_conditional_updates_lose_to_newer_writes() {
    let mut c = Cluster::start(3, &[]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, id: &str, slo: &str, trace: Option<&str>| {
        let path = dir.path().join(name);
        let demand = match trace {
            Some(t) => format!("{{ trace = \"{t}\", scale = 1.0 }}"),
            None => "{ poisson_rps = 1.0 }".into(),
        };
        std::fs::write(
            &path,
            format!("[[tenant]]\nid = \"{id}\"\nmodel = \"resnet50\"\nslo = \"{slo}\"\ndemand = {demand}\n"),
        )
        .unwrap();
        path.to_string_lossy().into_owned()
    };
    create(&c, leader, tenant("warm", "resnet50", 1.0)).await;
    // Every endpoint, the leader's first.
    let mut order = vec![c.addr(leader)];
    order.extend([1, 2, 3].into_iter().filter(|i| *i != leader).map(|i| c.addr(i)));
    let endpoints = order.join(",");

    c.kill(leader);
    for i in 0..5 {
        let f = file(&format!("e{i}.toml"), &format!("e{i}"), "100ms", None);
        let (ok, _, err) = cli(&["tenant", "add", "--file", &f, "--endpoints", &endpoints, "--timeout", "20s"]);
        assert!(ok, "write {i} during the election failed: {err}");
    }
    let (ok, out, err) = cli(&["tenant", "list", "--endpoints", &endpoints, "--json"]);
    assert!(ok, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 6, "{out}");

    // Conditional updates: read the revision, update with it; a second update from the same (now stale) revision
    // is refused and the newer value stays.
    let (ok, out, err) = cli(&["tenant", "get", "e0", "--endpoints", &endpoints, "--json"]);
    assert!(ok, "{err}");
    let revision = serde_json::from_str::<serde_json::Value>(&out).unwrap()["revision"].as_u64().unwrap();
    assert!(revision > 0, "{out}");
    let newer = file("newer.toml", "e0", "222ms", None);
    let late = file("late.toml", "e0", "111ms", None);
    let rev = revision.to_string();
    let (ok, _, err) =
        cli(&["tenant", "add", "--update", "--if-revision", &rev, "--file", &newer, "--endpoints", &endpoints]);
    assert!(ok, "{err}");
    // A conflict exits with 6 and one line naming the tenant (no gRPC status dump).
    let (code, _, err) =
        cli_status(&["tenant", "add", "--update", "--if-revision", &rev, "--file", &late, "--endpoints", &endpoints]);
    assert!(code == 6 && err.contains(&format!("not {revision}")), "{code}: {err}");
    assert!(
        err.starts_with("error: tenant e0 is at revision ")
            && err.ends_with(&format!(", not {revision}: it changed since it was read (conflict)\n"))
            && err.lines().count() == 1,
        "{err}"
    );
    let (_, out, _) = cli(&["tenant", "get", "e0", "--endpoints", &endpoints, "-w", "json"]);
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(got["spec"]["slo_ms"].as_f64(), Some(222.0), "{out}");
    let (code, _, err) = cli_status(&["tenant", "rm", "e0", "--if-revision", &rev, "--endpoints", &endpoints]);
    assert!(code == 6 && err.contains("revision"), "{code}: {err}");

    // A write resent with its request id after its answer was lost (as `Client::call` resends it) is applied once:
    // resent after another client's write, it answers and the other write's value stays, so no read can see the
    // first value come back.
    let now = c.wait_leader(&c.running(), T).await;
    let slo = |ms: f64| {
        let mut spec = tenant("e1", "resnet50", 1.0);
        spec.slo_ms = ms;
        v1::TenantRequest { spec: Some(spec), ..Default::default() }
    };
    let id = tessera_coordinator::client::Client::new_request_id();
    let resend = || tessera_coordinator::client::Client::request(slo(300.0), &id);
    c.client(now).update_tenant(resend()).await.unwrap();
    c.client(now).update_tenant(slo(400.0)).await.unwrap();
    let again = c.client(now).update_tenant(resend()).await.unwrap().into_inner();
    assert_eq!(again.spec.map(|s| s.slo_ms), Some(400.0), "the resend answers with the state it finds");
    let got = c
        .client(now)
        .get_tenant(v1::TenantIdRequest { id: "e1".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.spec.map(|s| s.slo_ms), Some(400.0));
    let (code, _, err) = cli_status(&["tenant", "get", "nobody", "--endpoints", &endpoints]);
    assert!(code == 5 && err.starts_with("error: not found: "), "{code}: {err}");
    let (code, _, err) = cli_status(&["tenant", "rm", "a", "b", "--if-revision", "1", "--endpoints", &endpoints]);
    assert!(code == 2 && err.contains("--if-revision needs exactly one tenant id"), "{code}: {err}");

    // The API validates tenants as replay does (a selector is a stream, not a file) and bounds every field and
    // the request itself.
    let via = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    for bad in ["rank:0", "../../etc/passwd"] {
        let mut spec = tenant("bad", "resnet50", 1.0);
        spec.demand = Some(v1::tenant_spec::Demand::Trace(v1::TraceDemand { selector: bad.into(), scale: 1.0 }));
        let e = c.client(via).create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await;
        let e = e.unwrap_err();
        assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("demand.trace"), "{bad}: {e:?}");
        let f = file("bad.toml", "bad", "100ms", Some(bad));
        let (ok, _, err) = cli(&["tenant", "add", "--file", &f, "--endpoints", &endpoints]);
        assert!(!ok && err.contains("demand.trace"), "{bad}: {err}");
    }
    let mut spec = tenant("big", "resnet50", 1.0);
    spec.name = "x".repeat(300);
    let e = c.client(via).create_tenant(v1::TenantRequest { spec: Some(spec.clone()), ..Default::default() }).await;
    assert!(e.unwrap_err().message().contains("spec.name"));
    spec.name = "x".repeat(8 << 20);
    let e = c.client(via).create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await;
    let e = e.unwrap_err();
    assert_eq!(e.code(), tonic::Code::OutOfRange, "{e:?}");
    let (ok, _, err) = cli(&["tenant", "list", "--endpoints", &endpoints]);
    assert!(ok, "the cluster still answers after an oversized request: {err}");

    // A reader that goes away early (`| head -1`) ends the output quietly.
    let mut child = std::process::Command::new(support::cluster::binary())
        .args(["tenant", "list", "--endpoints", &endpoints])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("panicked"), "{:?}: {stderr}", out.status);
}
