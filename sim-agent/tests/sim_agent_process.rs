//! `sim-agent run` as a process: layouts applied over gRPC, the states it reports, unchanged instances serving
//! throughout a reconfiguration, a kill in the middle of a reconfiguration and a restart over the same state
//! directory, and the coordinator client (a test coordinator, a real tonic server here, records registrations and
//! heartbeats; an unreachable coordinator does not disturb the layout).
//!
//! Built as a test of `tessera-sim` (see its Cargo.toml) so that Cargo builds the `sim-agent` binary for it. Every
//! wait is on state with a deadline, never a fixed sleep. Workload time is the wall clock, so MIG calls take their
//! simulated time (create 1 s, destroy 0.5 s): that is what leaves a reconfiguration in progress to kill.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tessera_core::ids::TenantId;
use tessera_core::plan::{Assignment, GpuPlan, Role};
use tessera_proto::v1;
use tessera_proto::v1::agent_client::AgentClient;
use tonic::transport::Channel;

const DEADLINE: Duration = Duration::from_secs(60);

/// A running `sim-agent run`, killed when dropped.
struct SimAgent {
    child: Child,
    nodes: BTreeMap<String, String>,
    /// Where `--metrics-listen` serves, when asked for.
    metrics: Option<String>,
}

impl SimAgent {
    fn start(nodes: u32, gpus: u32, state_dir: &Path, coordinator: Option<&str>) -> Result<SimAgent> {
        SimAgent::launch(nodes, gpus, state_dir, coordinator, false)
    }

    fn launch(nodes: u32, gpus: u32, state_dir: &Path, coordinator: Option<&str>, metrics: bool) -> Result<SimAgent> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_sim-agent"));
        cmd.args(["run", "--nodes", &nodes.to_string(), "--gpus-per-node", &gpus.to_string()])
            .args(["--gpu-model", "A100-40GB", "--listen-base", "127.0.0.1:0", "--clock", "wall"])
            .arg("--state-dir")
            .arg(state_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(c) = coordinator {
            cmd.args(["--coordinator", c]);
        }
        if metrics {
            cmd.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        let mut child = cmd.spawn().context("cannot start sim-agent")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut agent = SimAgent { child, nodes: BTreeMap::new(), metrics: None };
        let until = Instant::now() + DEADLINE;
        while agent.nodes.len() < nodes as usize {
            let left = until.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).context("sim-agent did not print its node addresses")?;
            if let Some(m) = line.strip_prefix("metrics=") {
                agent.metrics = Some(m.to_string());
                continue;
            }
            let mut id = None;
            let mut addr = None;
            for word in line.split_whitespace() {
                match word.split_once('=') {
                    Some(("node", v)) => id = Some(v.to_string()),
                    Some(("addr", v)) => addr = Some(v.to_string()),
                    _ => bail!("unexpected line on stdout: {line}"),
                }
            }
            agent.nodes.insert(id.context("no node=")?, addr.context("no addr=")?);
        }
        Ok(agent)
    }

    async fn client(&self, node: &str) -> Result<AgentClient<Channel>> {
        let addr = self.nodes.get(node).with_context(|| format!("no node {node}"))?;
        Ok(AgentClient::connect(format!("http://{addr}")).await?)
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

fn a(p: &str, tenant: &str, role: Role) -> Assignment {
    Assignment { placement: p.parse().unwrap(), tenant: TenantId::new(tenant).unwrap(), role, preinit: false }
}

fn plan(layout: &str, assignments: Vec<Assignment>) -> v1::GpuPlan {
    let p = GpuPlan {
        layout: layout.parse().unwrap(),
        assignments,
        expected_goodput: 1.0,
        explanation: "test".into(),
        upcoming: vec![],
        retraining_epochs: BTreeMap::new(),
        sharing: Default::default(),
    };
    (&p).into()
}

async fn apply(c: &mut AgentClient<Channel>, epoch: u64, gpu: u32, p: v1::GpuPlan) -> Result<v1::ApplyStatus> {
    let req =
        v1::ApplyLayoutRequest { epoch, targets: vec![v1::GpuTarget { gpu, plan: Some(p) }], term: 0, jobs: vec![] };
    let resp = c.apply_layout(req).await?.into_inner();
    Ok(resp.status())
}

async fn state(c: &mut AgentClient<Channel>) -> Result<v1::NodeState> {
    Ok(c.get_state(v1::GetStateRequest {}).await?.into_inner())
}

/// Polls the node's state until `done` holds (checking `always` on every state seen), or fails at the deadline.
async fn wait_state(
    c: &mut AgentClient<Channel>,
    what: &str,
    mut always: impl FnMut(&v1::NodeState) -> Result<()>,
    done: impl Fn(&v1::NodeState) -> bool,
) -> Result<v1::NodeState> {
    let until = Instant::now() + DEADLINE;
    loop {
        let s = state(c).await?;
        always(&s)?;
        if done(&s) {
            return Ok(s);
        }
        if Instant::now() > until {
            bail!("timed out waiting for {what}; last state: {s:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn layout(s: &v1::NodeState, gpu: u32) -> String {
    let Some(g) = s.gpus.iter().find(|g| g.index == gpu) else { return "?".into() };
    let l: tessera_core::layout::Layout = g
        .instances
        .iter()
        .map(|i| tessera_core::layout::Placement::try_from(i.placement.clone().unwrap()).unwrap())
        .collect();
    l.to_string()
}

fn instance<'a>(s: &'a v1::NodeState, gpu: u32, placement: &str) -> Option<&'a v1::Instance> {
    let want: tessera_core::layout::Placement = placement.parse().unwrap();
    s.gpus
        .iter()
        .find(|g| g.index == gpu)?
        .instances
        .iter()
        .find(|i| i.placement.clone().and_then(|p| tessera_core::layout::Placement::try_from(p).ok()) == Some(want))
}

fn converged(s: &v1::NodeState, epoch: u64) -> bool {
    s.applied_epoch >= epoch && s.gpus.iter().all(|g| g.converged)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_01_layouts_apply_over_grpc_and_unchanged_instances_keep_serving() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let agent = SimAgent::launch(2, 2, dir.path(), None, true)?;
    assert_eq!(agent.nodes.keys().cloned().collect::<Vec<_>>(), ["node-0", "node-1"]);
    let mut c = agent.client("node-0").await?;
    let first = plan(
        "3g@0 2g@4 1g@6",
        vec![
            a("3g@0", "resnet", Role::Inference),
            a("2g@4", "bert", Role::Inference),
            a("1g@6", "bert", Role::Retraining),
        ],
    );
    assert_eq!(apply(&mut c, 1, 0, first.clone()).await?, v1::ApplyStatus::Accepted);
    let s = wait_state(
        &mut c,
        "epoch 1, warm",
        |_| Ok(()),
        |s| converged(s, 1) && instance(s, 0, "3g@0").is_some_and(|i| i.serving),
    )
    .await?;
    assert_eq!(layout(&s, 0), "3g@0 2g@4 1g@6");
    assert_eq!(layout(&s, 1), "-", "GPU 1 has no target and stays empty");
    let kept = instance(&s, 0, "3g@0").context("3g@0")?.clone();
    assert_eq!(kept.work.len(), 1);

    // Epoch 2 replaces 2g@4 and 1g@6 by 3g@4; 3g@0 must keep its instance and serve in every state we see.
    let second = plan("3g@0 3g@4", vec![a("3g@0", "resnet", Role::Inference), a("3g@4", "bert", Role::Inference)]);
    assert_eq!(apply(&mut c, 2, 0, second.clone()).await?, v1::ApplyStatus::Accepted);
    let mut seen_in_between = 0;
    let s = wait_state(
        &mut c,
        "epoch 2",
        |s| {
            let i = instance(s, 0, "3g@0").context("3g@0 vanished during the reconfiguration")?;
            if i.id != kept.id || !i.serving || i.work != kept.work {
                bail!("3g@0 changed during the reconfiguration: {i:?}, was {kept:?}");
            }
            let l = layout(s, 0);
            if l != "3g@0 2g@4 1g@6" && l != "3g@0 3g@4" {
                seen_in_between += 1;
            }
            Ok(())
        },
        |s| converged(s, 2),
    )
    .await?;
    assert_eq!(layout(&s, 0), "3g@0 3g@4");
    assert!(seen_in_between > 0, "the intermediate states were reported");
    let g0 = s.gpus.iter().find(|g| g.index == 0).unwrap();
    assert_eq!(g0.desired_epoch, 2);
    assert_eq!(g0.desired.as_ref().and_then(|d| d.layout.clone()), second.layout.clone());

    // Stale and repeated epochs change nothing; a bad target is refused naming its field.
    assert_eq!(apply(&mut c, 1, 0, first).await?, v1::ApplyStatus::Stale);
    assert_eq!(apply(&mut c, 2, 0, second).await?, v1::ApplyStatus::AlreadyAccepted);
    let bad = plan("3g@0", vec![]);
    let mut bad_wire = bad.clone();
    bad_wire.layout.as_mut().unwrap().placements[0].profile = "5g".into();
    let e = apply(&mut c, 3, 0, bad_wire).await.unwrap_err();
    assert!(e.to_string().contains("targets[0].plan.layout.placements[0].profile"), "{e}");
    let overlap = plan("3g@0 4g@0", vec![]);
    let e = apply(&mut c, 3, 0, overlap).await.unwrap_err();
    assert!(e.to_string().contains("invalid target"), "{e}");
    let s = state(&mut c).await?;
    assert_eq!((s.epoch, layout(&s, 0).as_str()), (2, "3g@0 3g@4"));

    // Requests to the node's workload are counted; the other node was never touched.
    let arrive = v1::ArriveRequest { arrivals: vec![v1::TenantArrivals { tenant: "resnet".into(), count: 5 }] };
    c.arrive(arrive).await?;
    let s = state(&mut c).await?;
    let m = s.metrics.context("metrics")?;
    let resnet = m.tenants.iter().find(|t| t.tenant == "resnet").context("resnet metrics")?;
    assert_eq!((resnet.arrivals, resnet.served_within_slo, resnet.dropped), (5, 5, 0));
    let e = c.advance_clock(v1::AdvanceClockRequest { to_ms: 10 }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "the wall clock cannot be advanced");
    let mut other = agent.client("node-1").await?;
    let s = state(&mut other).await?;
    assert_eq!((s.epoch, s.steps), (0, 0));

    // The agents' metrics, labelled by node, in the Prometheus text format.
    let addr = agent.metrics.clone().context("no metrics= line")?;
    let body = http_get(&addr, "/metrics").await?;
    for line in [
        "tessera_agent_pushes_total{node=\"node-0\",result=\"accepted\"} 2",
        "tessera_agent_pushes_total{node=\"node-0\",result=\"stale\"} 1",
        "tessera_agent_pushes_total{node=\"node-1\",result=\"accepted\"} 0",
        "tessera_agent_applied_epoch{node=\"node-0\"} 2",
        "tessera_agent_gpu_instances{node=\"node-0\",gpu=\"0\",model=\"A100-40GB\",profile=\"3g\"} 2",
        "tessera_agent_gpu_converged{node=\"node-1\",gpu=\"1\",model=\"A100-40GB\"} 1",
        // Epochs 1 and 2 of node-0, each from its acceptance to the pass that had it in place.
        "tessera_agent_reconfiguration_seconds_count 2",
    ] {
        assert!(body.lines().any(|l| l == line), "missing {line:?} in:\n{body}");
    }
    let steps = body
        .lines()
        .find_map(|l| l.strip_prefix("tessera_agent_mig_steps_total{node=\"node-0\"} "))
        .context("mig_steps_total")?;
    assert!(steps.parse::<u64>()? >= 5, "{steps}");
    if let Some(r) = tessera_metrics::promtool_check(&body) {
        r.map_err(anyhow::Error::msg)?;
    }
    assert!(http_get(&addr, "/readyz").await?.is_empty(), "standalone agents are ready");
    Ok(())
}

/// The body of `GET path` at `addr`; an error unless the answer is 200.
async fn http_get(addr: &str, path: &str) -> Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let (head, body) = out.split_once("\r\n\r\n").context("no header/body separator")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {head}");
    }
    Ok(if path == "/readyz" { String::new() } else { body.to_string() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_02_a_kill_in_the_middle_of_a_reconfiguration_converges_after_a_restart() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut agent = SimAgent::start(1, 1, dir.path(), None)?;
    let mut c = agent.client("node-0").await?;
    let first = plan("3g@0 3g@4", vec![a("3g@0", "a", Role::Inference), a("3g@4", "b", Role::Inference)]);
    apply(&mut c, 1, 0, first.clone()).await?;
    let s = wait_state(&mut c, "epoch 1", |_| Ok(()), |s| converged(s, 1)).await?;
    let steps_before = s.steps;
    // Seven steps (two drains and destroys, four creates and loads), about five seconds of simulated MIG calls.
    let second = plan(
        "2g@0 2g@2 2g@4 1g@6",
        vec![a("2g@0", "a", Role::Inference), a("2g@4", "b", Role::Inference), a("1g@6", "b", Role::Retraining)],
    );
    apply(&mut c, 2, 0, second.clone()).await?;
    wait_state(&mut c, "the reconfiguration under way", |_| Ok(()), |s| s.steps >= steps_before + 2).await?;
    agent.kill();
    assert!(state(&mut c).await.is_err(), "the process is gone");

    let agent = SimAgent::start(1, 1, dir.path(), None)?;
    let mut c = agent.client("node-0").await?;
    // The restarted agent resumes its accepted target by itself, from whatever the hardware holds.
    let s = wait_state(&mut c, "convergence after the restart", |_| Ok(()), |s| converged(s, 2)).await?;
    assert_eq!(layout(&s, 0), "2g@0 2g@2 2g@4 1g@6");
    let works: Vec<usize> =
        ["2g@0", "2g@2", "2g@4", "1g@6"].iter().map(|p| instance(&s, 0, p).map_or(9, |i| i.work.len())).collect();
    assert_eq!(works, [1, 0, 1, 1], "work loaded again where planned, none on the spare");
    assert_eq!(apply(&mut c, 1, 0, first).await?, v1::ApplyStatus::Stale, "the epoch survived the kill");
    assert_eq!(apply(&mut c, 2, 0, second).await?, v1::ApplyStatus::AlreadyAccepted);
    Ok(())
}

/// What the test coordinator received.
#[derive(Default)]
struct Recorded {
    registrations: Vec<v1::RegisterRequest>,
    heartbeats: Vec<v1::NodeState>,
}

#[derive(Clone, Default)]
struct TestCoordinator(Arc<Mutex<Recorded>>);

#[tonic::async_trait]
impl v1::coordinator_server::Coordinator for TestCoordinator {
    async fn register(
        &self,
        request: tonic::Request<v1::RegisterRequest>,
    ) -> Result<tonic::Response<v1::RegisterResponse>, tonic::Status> {
        self.0.lock().unwrap().registrations.push(request.into_inner());
        Ok(tonic::Response::new(v1::RegisterResponse { heartbeat_interval_ms: 100, leadership: None }))
    }

    async fn heartbeat(
        &self,
        request: tonic::Request<v1::HeartbeatRequest>,
    ) -> Result<tonic::Response<v1::HeartbeatResponse>, tonic::Status> {
        let mut r = self.0.lock().unwrap();
        let state = request.into_inner().state.unwrap_or_default();
        let known = r.registrations.iter().any(|g| g.node_id == state.node_id);
        r.heartbeats.push(state);
        Ok(tonic::Response::new(v1::HeartbeatResponse { registered: known, leadership: None }))
    }

    async fn get_leadership(
        &self,
        _: tonic::Request<v1::LeadershipRequest>,
    ) -> Result<tonic::Response<v1::Leadership>, tonic::Status> {
        Err(tonic::Status::unimplemented("this test coordinator names no leader"))
    }
}

async fn wait_recorded(rec: &TestCoordinator, what: &str, done: impl Fn(&Recorded) -> bool) -> Result<()> {
    let until = Instant::now() + DEADLINE;
    while !done(&rec.0.lock().unwrap()) {
        if Instant::now() > until {
            let r = rec.0.lock().unwrap();
            bail!(
                "timed out waiting for {what}; registrations: {:?}; last heartbeat: {:?}",
                r.registrations,
                r.heartbeats.last()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_03_nodes_register_and_heartbeat_and_keep_their_layout_while_the_coordinator_is_away() -> Result<()> {
    // The coordinator's port is taken now (so nobody else gets it) but answered only later: until then calls
    // time out and the agents back off.
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let coord_addr = std_listener.local_addr()?;
    let dir = tempfile::tempdir()?;
    let agent = SimAgent::start(2, 1, dir.path(), Some(&coord_addr.to_string()))?;
    let mut c = agent.client("node-1").await?;
    apply(&mut c, 1, 0, plan("7g@0", vec![a("7g@0", "llm", Role::Inference)])).await?;
    wait_state(&mut c, "epoch 1 without a coordinator", |_| Ok(()), |s| converged(s, 1)).await?;

    let rec = TestCoordinator::default();
    std_listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(std_listener)?;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(v1::coordinator_server::CoordinatorServer::new(rec.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    // A registration queued on the port before it was answered may be the one served (with the layout of then);
    // the heartbeats that follow carry the current state.
    wait_recorded(&rec, "both nodes registered with their GPU", |r| {
        ["node-0", "node-1"].iter().all(|n| {
            r.registrations.iter().any(|g| &g.node_id == n && g.gpus.len() == 1 && g.gpus[0].model == "A100-40GB")
        })
    })
    .await?;
    {
        let r = rec.0.lock().unwrap();
        let n1 = r.registrations.iter().rfind(|g| g.node_id == "node-1").unwrap();
        assert_eq!(&n1.address, agent.nodes.get("node-1").unwrap(), "the address the node serves on");
    }
    // Heartbeats carry the observed layout and the workload metrics.
    wait_recorded(&rec, "a heartbeat of node-1 with its layout", |r| {
        r.heartbeats.iter().any(|h| {
            h.node_id == "node-1"
                && h.applied_epoch == 1
                && h.gpus.first().is_some_and(|g| g.instances.len() == 1 && g.instances[0].work.len() == 1)
                && h.metrics
                    .as_ref()
                    .is_some_and(|m| m.tenants.iter().any(|t| t.tenant == "llm" && t.serving_instances == 1))
        })
    })
    .await?;
    server.abort();
    let s = state(&mut c).await?;
    assert_eq!(layout(&s, 0), "7g@0");
    Ok(())
}
