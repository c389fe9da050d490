//! Reconfigurations planned by the coordinator, under load, with real work on the instances: a 3-member cluster, two
//! simulated nodes of two A100s whose agents run the tenant's `standin` server as a real process, and the router
//! following the cluster's routes. A steady 40 requests/s go through the router while the operator's pin
//! (`TenantPin`) makes the planner grow the tenant, shrink it, move it to another GPU, to another node, grow it
//! where the new instance needs the old one's slices, and move it back while the nodes stop and start again (the
//! agents are in this process: `sim-agent/tests/jobs_process.rs` kills a `sim-agent` process with SIGKILL).
//!
//! What it checks after every step:
//! - where the new instance had free slices (make-before-break), no request failed, was held or was dropped;
//! - where it did not, the requests that found no instance are the router's counted drops and every other one
//!   succeeded;
//! - no process is left on an instance that no longer serves, and the tenant runs exactly one server, on the
//!   instance its route names (nothing started twice), also after the restart.
//!
//! Needs the `standin` binary next to `coordinator` (built by `cargo test --workspace`, or
//! `cargo build -p tessera-sim --bin standin`). Waits are on state with deadlines, never fixed sleeps.

mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::cluster::{Cluster, create, eventually, start_sim_jobs_in, tenant};
use tessera_core::Placement;
use tessera_proto::v1;
use tessera_router::proxy::{Router, TenantStats};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(90);
const TENANT: &str = "moves-web";
/// Requests per second through the router.
const RATE: u64 = 40;

/// The stand-in inference server, built beside the coordinator.
fn standin() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_BIN_EXE_coordinator")).with_file_name("standin");
    assert!(
        path.exists(),
        "{} is missing: run the workspace's tests (cargo test --workspace) or cargo build -p tessera-sim --bin standin",
        path.display()
    );
    path
}

/// The tenant's server processes, with the MIG device each was given.
fn servers() -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
            vars.contains(&format!("TESSERA_TENANT={TENANT}").as_bytes()).then_some(())?;
            let device = vars.iter().find_map(|v| v.strip_prefix(b"CUDA_VISIBLE_DEVICES="))?;
            Some((pid, String::from_utf8_lossy(device).into_owned()))
        })
        .collect()
}

fn kill_servers() {
    for (pid, _) in servers() {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
}

/// One request's outcome: the HTTP status (0 when the connection failed) and the instance that answered.
#[derive(Debug, Clone)]
struct Outcome {
    status: u16,
    upstream: String,
    /// The answer's body, for the ones that failed.
    why: String,
}

async fn request(router: std::net::SocketAddr) -> Outcome {
    let failed = Outcome { status: 0, upstream: String::new(), why: "no connection to the router".into() };
    let Ok(mut s) = tokio::net::TcpStream::connect(router).await else { return failed };
    let head = format!("POST /t/{TENANT}/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx");
    if s.write_all(head.as_bytes()).await.is_err() {
        return failed;
    }
    let mut out = Vec::new();
    if s.read_to_end(&mut out).await.is_err() {
        return failed;
    }
    let text = String::from_utf8_lossy(&out);
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let upstream = text
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("x-tessera-upstream")))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_default();
    let why = if (200..300).contains(&status) {
        String::new()
    } else {
        text.split_once("\r\n\r\n").map(|(_, b)| b.trim().to_string()).unwrap_or_default()
    };
    Outcome { status, upstream, why }
}

/// Sends `RATE` requests a second through the router until stopped, recording each outcome.
fn load(router: std::net::SocketAddr, stop: Arc<AtomicBool>) -> Arc<Mutex<Vec<Outcome>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = out.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let sink = sink.clone();
            tokio::spawn(async move {
                let o = request(router).await;
                sink.lock().unwrap().push(o);
            });
        }
    });
    out
}

/// What one step did to the requests.
#[derive(Debug, Default)]
struct StepReport {
    requests: usize,
    /// Not 2xx, other than the router's counted drops.
    failed: usize,
    dropped: u64,
    held: u64,
    /// Each failure's status and answer, with its count.
    failures: std::collections::BTreeMap<(u16, String), usize>,
}

/// The tenant's one ready endpoint, when its route holds exactly that (nothing starting or draining beside it).
async fn settled(c: &Cluster, leader: u64) -> Option<v1::RouteEndpoint> {
    let r = c.client(leader).get_routes(v1::RoutesRequest { tenant: TENANT.into() }).await.ok()?.into_inner();
    let eps = &r.tenants.first()?.endpoints;
    match eps.as_slice() {
        [one] if one.state == "ready" => Some(one.clone()),
        _ => None,
    }
}

fn placement(e: &v1::RouteEndpoint) -> Placement {
    Placement::try_from(e.placement.clone().expect("an endpoint names its instance")).expect("a valid placement")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordinator_reconfigures_a_served_tenant_without_losing_requests() {
    kill_servers();
    let standin = standin();
    let c = Cluster::start(3, &["--plan-every", "1s"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let state = tempfile::tempdir().unwrap();
    let mut sim = start_sim_jobs_in(&c.addr(leader), 2, 2, "mv", state.path()).await;

    // The tenant serves with the stand-in: ready after a warm-up, 5 ms a request, drains what it has in flight, and
    // counts its requests (the agent reports them as the tenant's arrivals). Pinned to a 1g on mv-0's GPU 0.
    let mut spec = tenant(TENANT, "resnet50", 20.0);
    let serve = v1::JobSpec::from(&tessera_sim::standin::serve_job(&standin));
    spec.jobs = Some(v1::TenantJobs { tenant: TENANT.into(), serve: Some(serve), retrain: None });
    let pin = |gpu: &str, profile: &str| v1::TenantPin { gpus: vec![gpu.into()], profile: profile.into() };
    spec.pin = Some(pin("mv-0/0", "1g"));
    create(&c, leader, spec.clone()).await;

    // The router follows the cluster; a request waits at most 1 s for a ready instance.
    let (tx, rx) = tokio::sync::watch::channel(tessera_router::Routes::new());
    let members: Vec<String> = [1, 2, 3].map(|i| c.addr(i)).to_vec();
    tokio::spawn(tessera_router::source::follow_coordinator(members, None, tx));
    let router = Router::new(rx, Duration::from_secs(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let router_addr = listener.local_addr().unwrap();
    tokio::spawn(router.clone().serve(listener, std::future::pending()));

    let mut at = eventually(T, "the tenant served on mv-0/0 as 1g", || async {
        settled(&c, leader)
            .await
            .filter(|e| e.node == "mv-0" && e.gpu == 0 && placement(e).profile.short_name() == "1g")
    })
    .await;
    let stop = Arc::new(AtomicBool::new(false));
    let outcomes = load(router_addr, stop.clone());
    eventually(T, "a request served through the router", || async {
        outcomes.lock().unwrap().iter().any(|o| o.status == 200).then_some(())
    })
    .await;
    let mut mark = outcomes.lock().unwrap().len();
    let mut stats = router.stats().get(TENANT).cloned().unwrap_or_default();
    let mut seen_devices: BTreeSet<String> = BTreeSet::from([at.mig_uuid.clone()]);

    // Each step pins the tenant somewhere else; the planner moves it there on its next round.
    let steps = [
        ("grow 1g -> 3g on mv-0/0", "mv-0", 0, "3g"),
        ("shrink 3g -> 2g on mv-0/0", "mv-0", 0, "2g"),
        ("move to another GPU, mv-0/1", "mv-0", 1, "2g"),
        ("move to another node, mv-1/0", "mv-1", 0, "2g"),
        ("grow 2g -> 7g on mv-1/0", "mv-1", 0, "7g"),
    ];
    let mut make_before_break = 0;
    for (name, node, gpu, profile) in steps {
        pin_with_cli(&c, &format!("{node}/{gpu}"), profile);
        let next = eventually(T, name, || async {
            settled(&c, leader)
                .await
                .filter(|e| e.node == node && e.gpu == gpu && placement(e).profile.short_name() == profile)
        })
        .await;
        // The new instance had free slices when it is on another GPU or does not overlap the old one.
        let free = (at.node.as_str(), at.gpu) != (node, gpu) || !placement(&at).conflicts_with(placement(&next));
        // Every request sent up to now has landed, and the old instance has no process left.
        let (r, len, now) = step(&outcomes, &router, mark, &stats).await;
        (mark, stats) = (len, now);
        eprintln!("{name}: {} -> {}: {r:?} (free slices: {free})", at.address, next.address);
        assert!(r.requests > 0, "{name}: the load generator stopped");
        assert_eq!(r.failed, 0, "{name}: failed requests: {r:?}");
        assert!(r.failures.keys().all(|(status, why)| *status == 503 && why.starts_with("no ready instance")), "{r:?}");
        if free {
            make_before_break += 1;
            assert_eq!((r.dropped, r.held), (0, 0), "{name}: make-before-break must not hold or drop: {r:?}");
        }
        seen_devices.insert(next.mig_uuid.clone());
        one_server_on(&next, &seen_devices, name).await;
        at = next;
    }
    assert!(make_before_break >= 4, "{make_before_break} of 5 steps had free slices");

    // Back to mv-0/0 as 1g; the nodes stop once the new server is starting, and start again over their state.
    pin_with_cli(&c, "mv-0/0", "1g");
    eventually(T, "a server starting on mv-0/0", || async {
        servers().iter().any(|(_, d)| !seen_devices.contains(d)).then_some(())
    })
    .await;
    sim.stop().await;
    sim = start_sim_jobs_in(&c.addr(leader), 2, 2, "mv", state.path()).await;
    let next = eventually(T, "the tenant served on mv-0/0 as 1g after the restart", || async {
        settled(&c, leader)
            .await
            .filter(|e| e.node == "mv-0" && e.gpu == 0 && placement(e).profile.short_name() == "1g")
    })
    .await;
    let (r, _, _) = step(&outcomes, &router, mark, &stats).await;
    eprintln!("nodes stopped and restarted mid-reconfiguration: {} -> {}: {r:?}", at.address, next.address);
    assert_eq!(r.failed, 0, "after the restart: {r:?}");
    seen_devices.insert(next.mig_uuid.clone());
    one_server_on(&next, &seen_devices, "after the restart").await;

    stop.store(true, Ordering::Relaxed);
    let all = outcomes.lock().unwrap().clone();
    let upstreams: BTreeSet<&str> = all.iter().map(|o| o.upstream.as_str()).filter(|u| !u.is_empty()).collect();
    eprintln!(
        "{} requests, {} instances served them, router: {:?}",
        all.len(),
        upstreams.len(),
        router.stats().get(TENANT)
    );
    assert!(upstreams.len() >= 6, "every reconfiguration moved the traffic: {upstreams:?}");
    sim.stop().await;
    kill_servers();
}

/// Waits for the requests in flight to land and sums up a step since `from`.
async fn step(
    outcomes: &Arc<Mutex<Vec<Outcome>>>,
    router: &Router,
    from: usize,
    before: &TenantStats,
) -> (StepReport, usize, TenantStats) {
    // A request takes 5 ms at the server and waits at most 1 s at the router: sent before this mark, it has landed
    // within 2 s.
    let sent = outcomes.lock().unwrap().len() + 2 * RATE as usize;
    eventually(T, "the requests in flight to land", || async {
        (outcomes.lock().unwrap().len() >= sent).then_some(())
    })
    .await;
    let all = outcomes.lock().unwrap().clone();
    let now = router.stats().get(TENANT).cloned().unwrap_or_default();
    let part = &all[from..];
    let dropped = now.dropped - before.dropped;
    let non_ok = part.iter().filter(|o| !(200..300).contains(&o.status)).count();
    let mut failures = std::collections::BTreeMap::new();
    for o in part.iter().filter(|o| !(200..300).contains(&o.status)) {
        *failures.entry((o.status, o.why.clone())).or_default() += 1;
    }
    let report = StepReport {
        failures,
        requests: part.len(),
        failed: non_ok.saturating_sub(dropped as usize),
        dropped,
        held: now.held - before.held,
    };
    (report, all.len(), now)
}

/// Pins the tenant with the operator's command, `coordinator tenant pin`, as the cluster's admin would, and checks
/// that `tenant list` shows the pin.
fn pin_with_cli(c: &Cluster, gpu: &str, profile: &str) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(support::cluster::binary())
            .args(args)
            .args(["--endpoints", &c.endpoints()])
            .output()
            .unwrap();
        assert!(out.status.success(), "coordinator {args:?}: {out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let said = run(&["tenant", "pin", TENANT, "--gpu", gpu, "--profile", profile]);
    assert!(said.contains(&format!("pinned to {gpu} as {profile}")), "{said}");
    let list = run(&["tenant", "list"]);
    assert!(
        list.lines().any(|l| l.starts_with(TENANT) && l.contains(&format!("pinned to {gpu} as {profile}"))),
        "{list}"
    );
}

/// Exactly one server runs for the tenant, on the instance its route names, and no process at all (the tenant's or
/// any other, such as a child the server left behind) names an instance it left.
async fn one_server_on(e: &v1::RouteEndpoint, seen: &BTreeSet<String>, name: &str) {
    eventually(T, &format!("{name}: one server, on {}", e.mig_uuid), || async {
        let s = servers();
        (s.len() == 1 && s[0].1 == e.mig_uuid).then_some(())
    })
    .await;
    for device in seen.iter().filter(|d| **d != e.mig_uuid) {
        let uuid: tessera_core::ids::MigUuid = device.parse().expect("a MIG UUID");
        let left = tessera_agent::procs::processes_using(&uuid);
        assert!(left.is_empty(), "{name}: processes {left:?} are left on {device}");
    }
}
