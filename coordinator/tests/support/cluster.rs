//! A real coordinator cluster for tests and benchmarks: each node is a `coordinator serve` process on loopback
//! with its own sled directory; nodes can be SIGKILLed, restarted on their directory, and partitioned through the
//! fault-injection RPC. Waits poll observable state with a deadline, never a fixed sleep.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tessera_proto::v1::raft_client::RaftClient;
use tonic::transport::{Channel, Endpoint};

/// The `coordinator` binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_coordinator"))
}

/// The repository's `configs/` directory.
pub fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

/// A free loopback port (bound, then released for the child to take), below Linux's ephemeral range (32768 up):
/// a port the OS handed out from that range could be taken, before the child binds it, by an outgoing connection
/// (node 1 dialling peers that are not up yet did that once: "Address already in use"). Each test process starts
/// at its own offset, from its pid, and walks up.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let offset = (std::process::id() % 500) * 24;
    loop {
        let port = 20_000 + (offset + NEXT.fetch_add(1, Ordering::Relaxed)) % 12_000;
        let port = u16::try_from(port).expect("20000..32000 fits a port");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Polls `f` until it returns `Some`, or panics after `timeout` naming `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

struct Proc {
    child: Option<Child>,
    metrics: Option<String>,
    addr: String,
    data_dir: PathBuf,
    log: PathBuf,
    extra: Vec<String>,
}

/// A cluster of coordinator processes.
pub struct Cluster {
    /// Scratch directory (sled files, logs).
    pub dir: tempfile::TempDir,
    peers: String,
    nodes: BTreeMap<u64, Proc>,
    common: Vec<String>,
    /// With mutual TLS: the PKI directory (`coordinator certs init`); the test's own clients are `admin`.
    tls: Option<PathBuf>,
}

impl Cluster {
    /// Starts `n` nodes (ids 1..=n) with `common` extra flags each, and waits until each printed its address.
    pub fn start(n: u64, common: &[&str]) -> Cluster {
        Cluster::start_with(n, common, None)
    }

    /// [`Cluster::start`] with mutual TLS from the PKI in `pki` (node `i` presents `node-<i>.pem`).
    pub fn start_tls(n: u64, common: &[&str], pki: &Path) -> Cluster {
        Cluster::start_with(n, common, Some(pki.to_path_buf()))
    }

    fn start_with(n: u64, common: &[&str], tls: Option<PathBuf>) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let addrs: BTreeMap<u64, String> = (1..=n).map(|i| (i, format!("127.0.0.1:{}", free_port()))).collect();
        let peers = addrs.iter().map(|(i, a)| format!("{i}={a}")).collect::<Vec<_>>().join(",");
        let mut c =
            Cluster { dir, peers, nodes: BTreeMap::new(), common: common.iter().map(|s| s.to_string()).collect(), tls };
        for (id, addr) in addrs {
            let data_dir = c.dir.path().join(format!("node-{id}"));
            let log = c.dir.path().join(format!("node-{id}.log"));
            c.nodes.insert(id, Proc { child: None, metrics: None, addr, data_dir, log, extra: vec![] });
            c.spawn(id);
        }
        c
    }

    /// Adds node `id` (not started) that will join with `--join` (after `member add`).
    pub fn prepare_joiner(&mut self, id: u64) -> String {
        let addr = format!("127.0.0.1:{}", free_port());
        let data_dir = self.dir.path().join(format!("node-{id}"));
        let log = self.dir.path().join(format!("node-{id}.log"));
        self.nodes.insert(
            id,
            Proc { child: None, metrics: None, addr: addr.clone(), data_dir, log, extra: vec!["--join".into()] },
        );
        addr
    }

    /// Starts (or restarts) node `id` on its data directory.
    pub fn spawn(&mut self, id: u64) {
        let p = self.nodes.get_mut(&id).unwrap();
        assert!(p.child.is_none(), "node {id} is running");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&p.log).unwrap();
        let mut cmd = Command::new(binary());
        cmd.args(["serve", "--id", &id.to_string(), "--listen", &p.addr, "--peers", &self.peers])
            .arg("--data-dir")
            .arg(&p.data_dir)
            .arg("--models-dir")
            .arg(configs().join("models"))
            .args(&self.common)
            .args(&p.extra)
            .args(self.tls.iter().flat_map(|d| {
                [
                    "--tls-cert".to_string(),
                    d.join(format!("node-{id}.pem")).to_string_lossy().into_owned(),
                    "--tls-key".to_string(),
                    d.join(format!("node-{id}.key")).to_string_lossy().into_owned(),
                    "--tls-ca".to_string(),
                    d.join("ca.pem").to_string_lossy().into_owned(),
                ]
            }))
            .env("RUST_LOG", "info,raft=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        assert!(line.starts_with("coordinator id="), "node {id} did not start: {line:?}\n{}", self.log_tail(id));
        let p = self.nodes.get_mut(&id).unwrap();
        p.child = Some(child);
        p.metrics = line.split_whitespace().find_map(|w| w.strip_prefix("metrics=")).map(str::to_string);
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: u64) {
        let p = self.nodes.get_mut(&id).unwrap();
        if let Some(mut c) = p.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Sends node `id` SIGTERM and waits until it exits; panics if it is still running after `timeout`.
    pub fn terminate(&mut self, id: u64, timeout: Duration) {
        let p = self.nodes.get_mut(&id).unwrap();
        let mut child = p.child.take().expect("node is running");
        let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill -TERM failed");
        let deadline = Instant::now() + timeout;
        while child.try_wait().unwrap().is_none() {
            if Instant::now() >= deadline {
                child.kill().unwrap();
                child.wait().unwrap();
                panic!("node {id} did not stop within {timeout:?} of SIGTERM\n{}", self.log_tail(id));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last lines of node `id`'s log.
    pub fn log_tail(&self, id: u64) -> String {
        let text = std::fs::read_to_string(&self.nodes[&id].log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// Node `id`'s full log.
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(&self.nodes[&id].log).unwrap_or_default()
    }

    /// Node `id`'s address.
    pub fn addr(&self, id: u64) -> String {
        self.nodes[&id].addr.clone()
    }

    /// Node `id`'s Prometheus endpoint (when started with `--metrics-listen`).
    pub fn metrics_addr(&self, id: u64) -> Option<String> {
        self.nodes[&id].metrics.clone()
    }

    /// Every node's address, comma-separated (for `--endpoints`).
    pub fn endpoints(&self) -> String {
        self.nodes.values().map(|p| p.addr.clone()).collect::<Vec<_>>().join(",")
    }

    /// Node `id`'s process id, while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        self.nodes[&id].child.as_ref().map(Child::id)
    }

    /// Node `id`'s data directory.
    pub fn data_dir(&self, id: u64) -> PathBuf {
        self.nodes[&id].data_dir.clone()
    }

    /// Running node ids.
    pub fn running(&self) -> Vec<u64> {
        self.nodes.iter().filter(|(_, p)| p.child.is_some()).map(|(i, _)| *i).collect()
    }

    fn channel(&self, id: u64) -> Channel {
        match &self.tls {
            Some(dir) => self.channel_as(id, Some(&tls_files(dir, "admin"))),
            None => self.channel_as(id, None),
        }
    }

    /// A channel to node `id`, with mutual TLS as `tls`'s identity when given.
    pub fn channel_as(&self, id: u64, tls: Option<&tessera_auth::TlsFiles>) -> Channel {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut e = Endpoint::from_shared(format!("{scheme}://{}", self.addr(id)))
            .unwrap()
            .connect_timeout(Duration::from_millis(500))
            .timeout(Duration::from_secs(10));
        if let Some(t) = tls {
            e = e.tls_config(t.client(tessera_auth::COORDINATOR_SERVER_NAME).unwrap()).unwrap();
        }
        e.connect_lazy()
    }

    /// An API client of node `id`.
    pub fn client(&self, id: u64) -> CoordinatorApiClient<Channel> {
        CoordinatorApiClient::new(self.channel(id))
    }

    /// Node `id`'s status, if it answers.
    pub async fn status(&self, id: u64) -> Option<v1::ClusterStatusResponse> {
        self.client(id).cluster_status(v1::ClusterStatusRequest {}).await.ok().map(|r| r.into_inner())
    }

    /// Waits until every node of `among` answers and names the same leader, itself one of `among`.
    pub async fn wait_leader(&self, among: &[u64], timeout: Duration) -> u64 {
        eventually(timeout, &format!("a leader among {among:?}"), || async {
            let mut leader = None;
            for id in among {
                let s = self.status(*id).await?;
                if s.leader_id == 0 || !among.contains(&s.leader_id) || leader.is_some_and(|l| l != s.leader_id) {
                    return None;
                }
                leader = Some(s.leader_id);
            }
            leader
        })
        .await
    }

    /// Waits until the nodes of `among` have applied the same index (and answer), returning it.
    pub async fn wait_converged(&self, among: &[u64], timeout: Duration) -> u64 {
        eventually(timeout, &format!("{among:?} to apply the same index"), || async {
            let mut index = None;
            for id in among {
                let s = self.status(*id).await?;
                if s.applied_index != s.commit_index || index.is_some_and(|i| i != s.applied_index) {
                    return None;
                }
                index = Some(s.applied_index);
            }
            index
        })
        .await
    }

    /// Cuts node `id` off the others (both directions), through the fault-injection RPC.
    pub async fn isolate(&self, id: u64) {
        let others: Vec<u64> = self.running().into_iter().filter(|o| *o != id).collect();
        RaftClient::new(self.channel(id)).isolate(v1::IsolateRequest { peers: others.clone() }).await.unwrap();
        for o in others {
            RaftClient::new(self.channel(o)).isolate(v1::IsolateRequest { peers: vec![id] }).await.unwrap();
        }
    }

    /// Heals every partition.
    pub async fn heal(&self) {
        for id in self.running() {
            RaftClient::new(self.channel(id)).isolate(v1::IsolateRequest { peers: vec![] }).await.unwrap();
        }
    }

    /// Tenant ids as node `id` has applied them (a local, possibly stale, read).
    pub async fn tenants_on(&self, id: u64) -> Option<Vec<String>> {
        let r = self.client(id).list_tenants(v1::ListRequest { stale: true }).await.ok()?.into_inner();
        Some(r.tenants.into_iter().filter_map(|t| t.spec.map(|s| s.id)).collect())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for p in self.nodes.values_mut() {
            if let Some(mut c) = p.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The certificate, key and CA of identity `name` in a PKI directory written by `coordinator certs init`.
pub fn tls_files(dir: &Path, name: &str) -> tessera_auth::TlsFiles {
    tessera_auth::TlsFiles {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
        ca: dir.join("ca.pem"),
    }
}

/// A Poisson tenant on one of the shipped models.
pub fn tenant(id: &str, model: &str, rate_rps: f64) -> v1::TenantSpec {
    v1::TenantSpec {
        id: id.into(),
        name: id.into(),
        model: model.into(),
        slo_ms: 100.0,
        slo_percentile: 0.99,
        weight: 1.0,
        demand: Some(v1::tenant_spec::Demand::Poisson(v1::PoissonDemand { rate_rps })),
        retraining: None,
        jobs: None,
        pin: None,
    }
}

/// Creates a tenant through node `via`, retrying while the cluster is still electing or loading model profiles.
pub async fn create(cluster: &Cluster, via: u64, spec: v1::TenantSpec) -> u64 {
    let id = spec.id.clone();
    eventually(Duration::from_secs(20), &format!("tenant {id} to be created via node {via}"), || {
        let spec = spec.clone();
        let id = id.clone();
        async move {
            match cluster.client(via).create_tenant(v1::TenantRequest { spec: Some(spec), ..Default::default() }).await
            {
                Ok(r) => Some(r.into_inner().index),
                Err(s) if s.code() == tonic::Code::AlreadyExists => Some(0),
                Err(s)
                    if s.code() == tonic::Code::Unavailable
                        || s.message().contains("unknown model")
                        || s.message().contains("model") && s.code() == tonic::Code::InvalidArgument =>
                {
                    None
                }
                Err(s) => panic!("creating {id} via node {via}: {s:?}"),
            }
        }
    })
    .await
}

/// Simulated nodes hosted in this process (each a real agent with its own gRPC endpoint), registered with a
/// coordinator.
pub struct SimNodes {
    /// The `node=ID addr=HOST:PORT` lines, one per node.
    pub lines: Vec<String>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<Result<(), String>>>,
    _dir: Option<tempfile::TempDir>,
}

impl SimNodes {
    /// Node `i`'s agent address.
    pub fn addr(&self, i: usize) -> String {
        self.lines[i].split_whitespace().find_map(|w| w.strip_prefix("addr=")).unwrap().to_string()
    }

    /// Stops the nodes and checks they ended cleanly.
    pub async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }
}

/// Starts `nodes` simulated nodes of `gpus` A100-40GB each, heartbeating to `coordinator`.
pub async fn start_sim(
    coordinator: &str,
    nodes: u32,
    gpus: u32,
    clock: tessera_sim::node::ClockKind,
    prefix: &str,
) -> SimNodes {
    start_sim_tls(coordinator, nodes, gpus, clock, prefix, None).await
}

/// [`start_sim`] with mutual TLS from a PKI directory (node `ID` presents `ID.pem`).
pub async fn start_sim_tls(
    coordinator: &str,
    nodes: u32,
    gpus: u32,
    clock: tessera_sim::node::ClockKind,
    prefix: &str,
    tls_dir: Option<&Path>,
) -> SimNodes {
    let dir = tempfile::tempdir().unwrap();
    let mut args = sim_args(coordinator, nodes, gpus, prefix, dir.path());
    args.clock = clock;
    args.tls_dir = tls_dir.map(Path::to_path_buf);
    launch(args, Some(dir)).await
}

/// [`start_sim`] whose nodes run their tenants' jobs as real processes (`sim-agent run --jobs`).
pub async fn start_sim_jobs(coordinator: &str, nodes: u32, gpus: u32, prefix: &str) -> SimNodes {
    let dir = tempfile::tempdir().unwrap();
    let mut args = sim_args(coordinator, nodes, gpus, prefix, dir.path());
    args.jobs = true;
    launch(args, Some(dir)).await
}

/// [`start_sim_jobs`] keeping the nodes' state (MIG layouts, jobs) in `state_dir`, so that nodes started again
/// there find what the last ones left.
pub async fn start_sim_jobs_in(coordinator: &str, nodes: u32, gpus: u32, prefix: &str, state_dir: &Path) -> SimNodes {
    let mut args = sim_args(coordinator, nodes, gpus, prefix, state_dir);
    args.jobs = true;
    launch(args, None).await
}

/// `sim-agent run`'s arguments for `nodes` nodes of `gpus` A100-40GB on loopback, on the wall clock, without TLS or
/// jobs, keeping their state in `state_dir`.
fn sim_args(coordinator: &str, nodes: u32, gpus: u32, prefix: &str, state_dir: &Path) -> tessera_sim::node::RunArgs {
    tessera_sim::node::RunArgs {
        nodes,
        gpus_per_node: gpus,
        gpu_model: "A100-40GB".into(),
        listen_base: "127.0.0.1:0".parse().unwrap(),
        advertise_host: None,
        clock: tessera_sim::node::ClockKind::Wall,
        coordinator: Some(coordinator.to_string()),
        state_dir: Some(state_dir.to_path_buf()),
        node_prefix: prefix.into(),
        tls_dir: None,
        insecure: false,
        metrics_listen: None,
        otlp_endpoint: None,
        jobs: false,
    }
}

/// Runs the nodes in this process until [`SimNodes::stop`]; `dir`, where given, lives as long as they do.
async fn launch(args: tessera_sim::node::RunArgs, dir: Option<tempfile::TempDir>) -> SimNodes {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (lines_tx, lines_rx) = tokio::sync::oneshot::channel::<Vec<String>>();
    let task = tokio::spawn(async move {
        let mut sink = Lines(Vec::new(), Some(lines_tx));
        tessera_sim::node::run(args, &mut sink, async {
            let _ = stop_rx.await;
        })
        .await
    });
    let lines = match lines_rx.await {
        Ok(lines) => lines,
        Err(_) => panic!("the simulated nodes did not start: {:?}", task.await),
    };
    SimNodes { lines, stop: Some(stop_tx), task: Some(task), _dir: dir }
}

/// Collects `sim-agent run`'s node lines and hands them over at its first flush.
struct Lines(Vec<u8>, Option<tokio::sync::oneshot::Sender<Vec<String>>>);

impl std::io::Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        if let Some(tx) = self.1.take() {
            let _ = tx.send(String::from_utf8_lossy(&self.0).lines().map(String::from).collect());
        }
        Ok(())
    }
}
