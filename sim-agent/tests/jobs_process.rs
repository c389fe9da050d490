//! Real work on reconfigured instances: `sim-agent run --jobs` (two nodes of two simulated A100s, the agent's job
//! supervisor running `standin` servers and retraining jobs as real processes), the router following the agents'
//! endpoints, and a steady stream of requests through the router while one tenant is grown, shrunk, moved to another
//! GPU, to another node, reconfigured without free slices, and moved again while the agent is killed and restarted.
//!
//! What it checks, after every step:
//! - where the target had free slices (make-before-break), no request failed, was refused or was held;
//! - where it had none (the new instance needs the old one's slices), the requests that found no instance are the
//!   router's counted drops, and every other request succeeded;
//! - retraining progress, read from the checkpoint file, never goes back;
//! - no process is left on an instance that no longer exists, and the tenant runs exactly one server and one
//!   retraining job (nothing started twice), also after the agent restarted mid-reconfiguration;
//! - a server that crashes is restarted on its instance and serves again.
//!
//! Built as a test of `tessera-sim` (see its Cargo.toml) for the `sim-agent` and `standin` binaries. Waits are on
//! state with deadlines, never fixed sleeps.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tessera_core::ids::{MigUuid, TenantId};
use tessera_core::jobs::{JobAction, JobSpec, Signal, TenantJobs};
use tessera_core::plan::{Assignment, GpuPlan, Role};
use tessera_proto::v1;
use tessera_proto::v1::agent_client::AgentClient;
use tessera_router::proxy::Router;
use tonic::transport::Channel;

const TENANT: &str = "jobs-e2e";
const DEADLINE: Duration = Duration::from_secs(60);
/// Requests per second the load generator sends.
const RATE: u64 = 40;

struct SimAgent {
    child: Child,
}

impl SimAgent {
    fn start(state_dir: &Path, base: u16) -> Result<SimAgent> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sim-agent"))
            .args(["run", "--nodes", "2", "--gpus-per-node", "2", "--gpu-model", "A100-40GB", "--jobs"])
            .args(["--listen-base", &format!("127.0.0.1:{base}")])
            .arg("--state-dir")
            .arg(state_dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("cannot start sim-agent")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        for _ in 0..2 {
            let line = rx.recv_timeout(DEADLINE).context("sim-agent did not print its nodes")?;
            if !line.starts_with("node=") {
                bail!("unexpected line: {line}");
            }
        }
        Ok(SimAgent { child })
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for SimAgent {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Two consecutive free ports (node-0 and node-1).
fn free_base_port() -> u16 {
    loop {
        let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

fn jobs(ckpt: &Path) -> TenantJobs {
    let standin = env!("CARGO_BIN_EXE_standin");
    let serve = tessera_sim::standin::serve_job(Path::new(standin));
    let mut retrain = JobSpec::command([
        standin,
        "retrain",
        "--checkpoint",
        "{checkpoint}",
        "--work-gpu-s",
        "1000000",
        "--profile",
        "{profile}",
        "--checkpoint-every-s",
        "0.5",
    ]);
    retrain.checkpoint = Some(JobAction::Signal { signal: Signal::Usr1 });
    retrain.resume_path = Some(ckpt.join("{tenant}.json").to_string_lossy().into_owned());
    retrain.grace_ms = 5_000;
    TenantJobs { serve: Some(serve), retrain: Some(retrain) }
}

fn plan(layout: &str, assignments: &[(&str, Role)]) -> v1::GpuPlan {
    let p = GpuPlan {
        layout: layout.parse().unwrap(),
        assignments: assignments
            .iter()
            .map(|(p, role)| Assignment {
                placement: p.parse().unwrap(),
                tenant: TenantId::new(TENANT).unwrap(),
                role: *role,
                preinit: false,
            })
            .collect(),
        expected_goodput: 1.0,
        explanation: "test".into(),
        upcoming: vec![],
        retraining_epochs: BTreeMap::new(),
        sharing: Default::default(),
    };
    (&p).into()
}

struct Cluster {
    base: u16,
    ckpt: PathBuf,
    clients: BTreeMap<u32, AgentClient<Channel>>,
}

impl Cluster {
    async fn connect(&mut self) -> Result<()> {
        self.clients.clear();
        for n in 0..2u32 {
            let addr = format!("http://127.0.0.1:{}", self.base + n as u16);
            self.clients.insert(n, AgentClient::connect(addr).await?);
        }
        Ok(())
    }

    async fn push(&mut self, node: u32, epoch: u64, targets: Vec<(u32, v1::GpuPlan)>) -> Result<()> {
        let mut wire = v1::TenantJobs::from(&jobs(&self.ckpt));
        wire.tenant = TENANT.into();
        let req = v1::ApplyLayoutRequest {
            epoch,
            term: 0,
            targets: targets.into_iter().map(|(gpu, plan)| v1::GpuTarget { gpu, plan: Some(plan) }).collect(),
            jobs: vec![wire],
        };
        let r = self.clients.get_mut(&node).context("node")?.apply_layout(req).await?.into_inner();
        if r.status != v1::ApplyStatus::Accepted as i32 {
            bail!("epoch {epoch} not accepted on node-{node}: {r:?}");
        }
        Ok(())
    }

    async fn state(&mut self, node: u32) -> Result<v1::NodeState> {
        Ok(self.clients.get_mut(&node).context("node")?.get_state(v1::GetStateRequest {}).await?.into_inner())
    }

    /// Waits until node `node` has applied `epoch` (every target converged), with the tenant's jobs ready.
    async fn converged(&mut self, node: u32, epoch: u64) -> Result<v1::NodeState> {
        let until = Instant::now() + DEADLINE;
        loop {
            if let Ok(s) = self.state(node).await {
                let ready =
                    s.gpus.iter().flat_map(|g| &g.instances).flat_map(|i| &i.endpoints).all(|e| e.state == "ready");
                if s.applied_epoch >= epoch && ready {
                    return Ok(s);
                }
                if Instant::now() > until {
                    bail!("node-{node} did not apply epoch {epoch}: {s:#?}");
                }
            } else if Instant::now() > until {
                bail!("node-{node} does not answer");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every instance's MIG UUID on both nodes.
    async fn uuids(&mut self) -> Result<BTreeSet<MigUuid>> {
        let mut out = BTreeSet::new();
        for n in 0..2 {
            for g in self.state(n).await?.gpus {
                for i in g.instances {
                    out.insert(i.mig_uuid.parse()?);
                }
            }
        }
        Ok(out)
    }
}

/// The PIDs of processes whose environment says they are this test's tenant's jobs, by role.
fn job_processes() -> BTreeMap<String, Vec<u32>> {
    let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
        let vars: Vec<&[u8]> = env.split(|b| *b == 0).collect();
        if !vars.contains(&format!("TESSERA_TENANT={TENANT}").as_bytes()) {
            continue;
        }
        let cmd = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let role = if cmd.contains("\0serve\0") { "serve" } else { "retrain" };
        out.entry(role.to_string()).or_default().push(pid);
    }
    out
}

fn kill_leftovers() {
    for pids in job_processes().values() {
        for pid in pids {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
        }
    }
}

#[derive(Debug, Clone)]
struct Outcome {
    status: u16,
    upstream: String,
}

/// Sends `RATE` requests a second through the router until stopped; each outcome is recorded.
fn load(router: std::net::SocketAddr, stop: Arc<std::sync::atomic::AtomicBool>) -> Arc<Mutex<Vec<Outcome>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let sink = out.clone();
    tokio::spawn(async move {
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<http_body_util::Full<bytes::Bytes>>();
        let mut tick = tokio::time::interval(Duration::from_millis(1000 / RATE));
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            tick.tick().await;
            let client = client.clone();
            let sink = sink.clone();
            tokio::spawn(async move {
                let req = hyper::Request::post(format!("http://{router}/t/{TENANT}/infer"))
                    .body(http_body_util::Full::new(bytes::Bytes::from_static(b"x")))
                    .unwrap();
                let outcome = match client.request(req).await {
                    Ok(r) => Outcome {
                        status: r.status().as_u16(),
                        upstream: r
                            .headers()
                            .get("x-tessera-upstream")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string(),
                    },
                    Err(_) => Outcome { status: 0, upstream: String::new() },
                };
                sink.lock().unwrap().push(outcome);
            });
        }
    });
    out
}

/// The checkpoint's progress now (0 before the first checkpoint).
fn progress(ckpt: &Path) -> f64 {
    std::fs::read_to_string(ckpt.join(format!("{TENANT}.json")))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["progress"].as_f64())
        .unwrap_or(0.0)
}

/// What one step did to the requests: failures (not 2xx, other than counted drops), drops and holds by the router.
#[derive(Debug, Default)]
struct StepReport {
    requests: usize,
    failed: usize,
    dropped: u64,
    held: u64,
}

async fn step_report(
    outcomes: &Arc<Mutex<Vec<Outcome>>>,
    router: &Router,
    from: usize,
    before: &tessera_router::proxy::TenantStats,
) -> (StepReport, usize, tessera_router::proxy::TenantStats) {
    // Let requests in flight land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let all = outcomes.lock().unwrap().clone();
    let now = router.stats().get(TENANT).cloned().unwrap_or_default();
    let part = &all[from..];
    let dropped = now.dropped - before.dropped;
    let non_ok = part.iter().filter(|o| !(200..300).contains(&o.status)).count();
    let report = StepReport {
        requests: part.len(),
        failed: non_ok.saturating_sub(dropped as usize),
        dropped,
        held: now.held - before.held,
    };
    (report, all.len(), now)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_keeps_being_served_while_its_instances_are_reconfigured() -> Result<()> {
    kill_leftovers();
    let dir = tempfile::tempdir()?;
    let ckpt = dir.path().join("ckpt");
    std::fs::create_dir_all(&ckpt)?;
    let base = free_base_port();
    let mut agent = SimAgent::start(&dir.path().join("state"), base)?;
    let mut c = Cluster { base, ckpt: ckpt.clone(), clients: BTreeMap::new() };
    c.connect().await?;

    // The router follows both agents' endpoints; a request waits at most 1 s for a ready instance.
    let (tx, rx) = tokio::sync::watch::channel(tessera_router::Routes::new());
    let agents = vec![format!("127.0.0.1:{base}"), format!("127.0.0.1:{}", base + 1)];
    tokio::spawn(tessera_router::source::poll_agents(agents, Duration::from_millis(50), tx));
    let router = Router::new(rx, Duration::from_secs(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let router_addr = listener.local_addr()?;
    tokio::spawn(router.clone().serve(listener, std::future::pending()));

    use Role::{Inference as I, Retraining as R};
    // 1. Serve on node-0 GPU 0 (1g), retrain on node-0 GPU 1 (3g).
    c.push(0, 1, vec![(0, plan("1g@0", &[("1g@0", I)])), (1, plan("3g@0", &[("3g@0", R)]))]).await?;
    c.converged(0, 1).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let outcomes = load(router_addr, stop.clone());
    let until = Instant::now() + DEADLINE;
    while !outcomes.lock().unwrap().iter().any(|o| o.status == 200) {
        assert!(Instant::now() < until, "no request served through the router");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut mark = outcomes.lock().unwrap().len();
    let mut stats = router.stats().get(TENANT).cloned().unwrap_or_default();
    let mut progress_seen = vec![progress(&ckpt)];
    let mut known_uuids = c.uuids().await?;
    let mut reports = Vec::new();

    // Each step: (name, node pushes, free slices?); an epoch per push.
    type Push = (u32, Vec<(u32, v1::GpuPlan)>);
    let steps: Vec<(&str, Vec<Push>, bool)> = vec![
        ("grow 1g -> 3g on GPU 0", vec![(0, vec![(0, plan("3g@4", &[("3g@4", I)]))])], true),
        ("shrink 3g -> 2g on GPU 0", vec![(0, vec![(0, plan("2g@0", &[("2g@0", I)]))])], true),
        (
            "move to GPU 1, retraining moves to GPU 0",
            vec![(0, vec![(0, plan("4g@0", &[("4g@0", R)])), (1, plan("3g@0 2g@4", &[("2g@4", I)]))])],
            true,
        ),
        ("move to node-1", vec![(1, vec![(0, plan("2g@0", &[("2g@0", I)]))]), (0, vec![(1, plan("-", &[]))])], true),
        ("grow in place 2g -> 7g (no free slices)", vec![(1, vec![(0, plan("7g@0", &[("7g@0", I)]))])], false),
    ];
    let mut epoch = 1;
    for (name, pushes, free) in steps {
        for (node, targets) in pushes {
            epoch += 1;
            c.push(node, epoch, targets).await?;
            c.converged(node, epoch).await?;
            // Routes follow within a poll: a step that moves away from a node waits for the new home first.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (r, len, now) = step_report(&outcomes, &router, mark, &stats).await;
        mark = len;
        stats = now;
        eprintln!("{name}: {r:?}");
        assert_eq!(r.failed, 0, "{name}: failed requests: {r:?}");
        if free {
            assert_eq!((r.dropped, r.held), (0, 0), "{name}: make-before-break must not hold or drop: {r:?}");
        }
        assert!(r.requests > 0, "{name}: the load generator stopped");
        // No process on an instance that is gone; exactly one server and one retraining job.
        let live = c.uuids().await?;
        for gone in known_uuids.difference(&live) {
            assert!(tessera_agent::procs::processes_using(gone).is_empty(), "{name}: processes left on {gone}");
        }
        known_uuids.extend(live);
        let procs = job_processes();
        assert_eq!(procs.get("serve").map(Vec::len), Some(1), "{name}: {procs:?}");
        assert_eq!(procs.get("retrain").map(Vec::len), Some(1), "{name}: {procs:?}");
        let p = progress(&ckpt);
        assert!(p >= *progress_seen.last().unwrap(), "{name}: retraining went back from {progress_seen:?} to {p}");
        progress_seen.push(p);
        reports.push((name, r));
    }

    // Kill the agent in the middle of a reconfiguration (serving moves back to node-1's GPU 1, retraining to
    // node-1's GPU 0), restart it over the same state: the jobs survive the agent, are adopted, nothing starts twice.
    epoch += 1;
    c.push(1, epoch, vec![(0, plan("3g@0", &[("3g@0", R)])), (1, plan("4g@0", &[("4g@0", I)]))]).await?;
    let before_kill = job_processes();
    agent.kill();
    let survivors = job_processes();
    assert!(!survivors.is_empty(), "jobs run in their own process groups and outlive the agent: {before_kill:?}");
    agent = SimAgent::start(&dir.path().join("state"), base)?;
    c.connect().await?;
    epoch += 1;
    // Node-0 gives up the retraining once node-1 holds the target (a coordinator pushes both).
    c.push(0, epoch, vec![(0, plan("-", &[]))]).await?;
    c.converged(1, epoch - 1).await?;
    c.converged(0, epoch).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (r, len, now) = step_report(&outcomes, &router, mark, &stats).await;
    (mark, stats) = (len, now);
    eprintln!("agent killed and restarted mid-reconfiguration: {r:?}");
    assert_eq!(r.failed, 0, "after the restart: {r:?}");

    // A server that crashes is restarted on its instance and port, and serves again.
    let crashed = job_processes()["serve"][0];
    Command::new("kill").args(["-KILL", &crashed.to_string()]).status()?;
    let until = Instant::now() + DEADLINE;
    loop {
        let now = job_processes();
        if now.get("serve").is_some_and(|p| p.len() == 1 && p[0] != crashed) {
            break;
        }
        assert!(Instant::now() < until, "the crashed server was not restarted: {now:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.converged(1, epoch - 1).await?;
    let served_before = outcomes.lock().unwrap().iter().filter(|o| o.status == 200).count();
    let until = Instant::now() + DEADLINE;
    while outcomes.lock().unwrap().iter().filter(|o| o.status == 200).count() < served_before + RATE as usize {
        assert!(Instant::now() < until, "no request served after the server's restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (r, _, _) = step_report(&outcomes, &router, mark, &stats).await;
    eprintln!("server crashed and restarted by the supervisor: {r:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // The supervisor read the servers' own request counters: node-1 reports the tenant's arrivals from them (what a
    // server served before its first reading is its baseline, so the count is below the requests sent).
    let arrivals =
        c.state(1).await?.metrics.unwrap_or_default().tenants.iter().find(|t| t.tenant == TENANT).map(|t| t.arrivals);
    eprintln!("node-1 reports {arrivals:?} arrivals counted by the jobs");
    assert!(arrivals.is_some_and(|n| n > 0), "{arrivals:?}");
    // A crash loses what the server had in flight (the router does not resend a request that may have run): at
    // 40 rps and 5 ms a request, one or two.
    assert!(r.failed <= 2, "after the crash: {r:?}");
    let procs = job_processes();
    assert_eq!(procs.get("serve").map(Vec::len), Some(1), "{procs:?}");
    assert_eq!(procs.get("retrain").map(Vec::len), Some(1), "{procs:?}");
    let live = c.uuids().await?;
    for gone in known_uuids.difference(&live) {
        assert!(tessera_agent::procs::processes_using(gone).is_empty(), "processes left on {gone}");
    }
    let p = progress(&ckpt);
    assert!(p >= *progress_seen.last().unwrap(), "retraining went back: {progress_seen:?} then {p}");
    let all = outcomes.lock().unwrap().clone();
    let servers: BTreeSet<&str> = all.iter().map(|o| o.upstream.as_str()).filter(|u| !u.is_empty()).collect();
    eprintln!(
        "{} requests, {} instances served them, router: {:?}; retraining progress {progress_seen:?}",
        all.len(),
        servers.len(),
        router.stats().get(TENANT)
    );
    assert!(servers.len() >= 6, "every reconfiguration moved the traffic: {servers:?}");
    drop(agent);
    kill_leftovers();
    Ok(())
}
