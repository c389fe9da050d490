//! Tessera's Raft against etcd, driven by one client (`cargo bench -p tessera-coordinator --bench versus_etcd`).
//!
//! Starts a 3-member etcd cluster and a 3-node Tessera cluster on loopback, each member on its own data directory
//! with fsync on (etcd's default; Tessera's store syncs each `Ready` before it answers), and drives both with the same
//! Rust gRPC client: HTTP/2 connections to the leader with N requests in flight (one connection per 64 of them, the
//! most streams Tessera's server allows on one), each worker sending its next write as soon as the previous one is
//! answered. A write is etcd's `KV/Put` of a tenant's protobuf spec under
//! `tenants/<id>`, and Tessera's `UpdateTenant` of the same spec; both cycle over 100 tenants.
//!
//! - `throughput`: for each concurrency (1, 16, 256), runs of a fixed duration alternating between the systems (which
//!   one goes first alternates too). Prints writes/s (median of the runs), p50 and p99 latency (over every write of
//!   every run), the server CPU per write (user plus system time of all three members, over the runs) and the
//!   client's (this process: the cost of the load itself, which shares the cores with the servers).
//! - `growth`: the same at 1 and 256 in flight after loading 0, 10 k and 100 k tenants (etcd: keys) through the same
//!   client, then the data directories' sizes.
//! - `failover`: SIGKILL the leader, write through a survivor until a write is acknowledged, restart the member,
//!   repeat; the median time from the kill to the acknowledgement.
//!
//! etcd is `ETCD_BIN` or `etcd` on `PATH` (Debian: `apt-get install etcd-server`, 3.4); without it the benchmark
//! says so and measures Tessera alone. Environment: `BENCH_SECS` (5, per run), `BENCH_RUNS` (3),
//! `BENCH_CONCURRENCY` (`1,16,256`), `BENCH_GROWTH` (`0,10000,100000`), `BENCH_FAILOVERS` (5), `BENCH_ONLY`
//! (`throughput`, `growth` or `failover`), `BENCH_TESSERA_ARGS` (more `coordinator serve` flags, such as
//! `--snapshot-log-ratio 0`), `BENCH_MARKDOWN` (a file whose `raft-vs-etcd` section the results replace, relative
//! to the repository root: `docs/results.md`). Figures from a shared 2-core machine: compare medians and ratios, and
//! mind that client and servers share the cores.

#[path = "../tests/support/cluster.rs"]
#[allow(dead_code)]
mod cluster;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cluster::{Cluster, eventually, free_port, tenant};
use prost::Message as _;
use tessera_coordinator::server::MAX_STREAMS_PER_CONNECTION;
use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};

/// The few etcd v3 messages the benchmark sends, field numbers from etcd's `etcdserverpb/rpc.proto` (API v3).
mod etcdpb {
    /// `etcdserverpb.PutRequest` (key and value only).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutRequest {
        #[prost(bytes = "vec", tag = "1")]
        pub key: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub value: Vec<u8>,
    }
    /// `etcdserverpb.ResponseHeader`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResponseHeader {
        #[prost(uint64, tag = "1")]
        pub cluster_id: u64,
        #[prost(uint64, tag = "2")]
        pub member_id: u64,
        #[prost(int64, tag = "3")]
        pub revision: i64,
        #[prost(uint64, tag = "4")]
        pub raft_term: u64,
    }
    /// `etcdserverpb.PutResponse` (header only).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PutResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
    }
    /// `etcdserverpb.StatusRequest`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusRequest {}
    /// `etcdserverpb.StatusResponse` (the fields read here).
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct StatusResponse {
        #[prost(message, optional, tag = "1")]
        pub header: Option<ResponseHeader>,
        #[prost(string, tag = "2")]
        pub version: String,
        #[prost(int64, tag = "3")]
        pub db_size: i64,
        #[prost(uint64, tag = "4")]
        pub leader: u64,
    }
}

/// What the benchmark found, as Markdown, for `BENCH_MARKDOWN`.
static REPORT: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());
/// The version the etcd members reported.
static ETCD_VERSION: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// Prints a line and keeps it for the report.
macro_rules! report {
    ($($arg:tt)*) => {{
        let line = format!($($arg)*);
        println!("{line}");
        let mut r = REPORT.lock().unwrap();
        r.push_str(&line);
        r.push('\n');
    }};
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name).unwrap_or_else(|_| default.into()).split(',').filter_map(|s| s.trim().parse().ok()).collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The `p` quantile (0..1) of sorted values, nearest rank.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

const MODELS: [&str; 4] = ["resnet50", "bert_base", "mobilenet_v2", "yolov5s"];
/// Tenants (keys) the throughput runs cycle over.
const HOT_KEYS: usize = 100;

/// The same connection settings for both systems.
fn channel(addr: &str) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(5))
        .connect_lazy()
}

async fn unary<Req, Resp>(ch: Channel, path: &'static str, req: Req) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    grpc.unary(tonic::Request::new(req), PathAndQuery::from_static(path), tonic_prost::ProstCodec::default())
        .await
        .map(tonic::Response::into_inner)
}

// ---------------------------------------------------------------------------------------------------------------
// etcd
// ---------------------------------------------------------------------------------------------------------------

struct EtcdMember {
    name: String,
    client: String,
    peer: String,
    data_dir: PathBuf,
    child: Option<Child>,
}

/// A 3-member etcd cluster of real processes.
struct Etcd {
    bin: PathBuf,
    dir: tempfile::TempDir,
    initial: String,
    members: Vec<EtcdMember>,
}

impl Etcd {
    fn find() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("ETCD_BIN") {
            return Some(PathBuf::from(p)).filter(|p| p.is_file());
        }
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join("etcd")).find(|p| p.is_file())
    }

    fn start(bin: PathBuf, n: usize) -> Etcd {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<EtcdMember> = (1..=n)
            .map(|i| EtcdMember {
                name: format!("e{i}"),
                client: format!("127.0.0.1:{}", free_port()),
                peer: format!("127.0.0.1:{}", free_port()),
                data_dir: dir.path().join(format!("e{i}")),
                child: None,
            })
            .collect();
        let initial = members.iter().map(|m| format!("{}=http://{}", m.name, m.peer)).collect::<Vec<_>>().join(",");
        let mut e = Etcd { bin, dir, initial, members };
        for i in 0..n {
            e.spawn(i);
        }
        e
    }

    fn spawn(&mut self, i: usize) {
        let m = &self.members[i];
        let log = std::fs::File::create(self.dir.path().join(format!("{}.log", m.name))).unwrap();
        let child = Command::new(&self.bin)
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data_dir)
            .args(["--listen-client-urls", &format!("http://{}", m.client)])
            .args(["--advertise-client-urls", &format!("http://{}", m.client)])
            .args(["--listen-peer-urls", &format!("http://{}", m.peer)])
            .args(["--initial-advertise-peer-urls", &format!("http://{}", m.peer)])
            .args(["--initial-cluster", &self.initial, "--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "tessera-bench", "--logger", "zap", "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.members[i].child = Some(child);
    }

    fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    async fn status(&self, i: usize) -> Option<etcdpb::StatusResponse> {
        let ch = channel(&self.members[i].client);
        unary(ch, "/etcdserverpb.Maintenance/Status", etcdpb::StatusRequest {}).await.ok()
    }

    /// Waits until every running member answers and names the same leader; returns the leader's position.
    async fn wait_leader(&self) -> usize {
        eventually(Duration::from_secs(30), "an etcd leader", || async {
            let mut leader = None;
            let mut position = None;
            for (i, m) in self.members.iter().enumerate() {
                if m.child.is_none() {
                    continue;
                }
                let s = self.status(i).await?;
                if s.leader == 0 || leader.is_some_and(|l| l != s.leader) {
                    return None;
                }
                leader = Some(s.leader);
                if s.header.as_ref()?.member_id == s.leader {
                    position = Some(i);
                }
            }
            position
        })
        .await
    }

    fn pids(&self) -> Vec<u32> {
        self.members.iter().filter_map(|m| m.child.as_ref().map(Child::id)).collect()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------------------------------

/// One system's write, through the shared client code.
#[derive(Clone)]
enum Writer {
    Etcd(Channel),
    Tessera(CoordinatorApiClient<Channel>),
}

impl Writer {
    fn etcd(addr: &str) -> Writer {
        Writer::Etcd(channel(addr))
    }

    fn tessera(addr: &str) -> Writer {
        Writer::Tessera(CoordinatorApiClient::new(channel(addr)))
    }

    /// Writes tenant `id`'s spec; `create` for a tenant Tessera does not hold yet (etcd's put is the same call).
    async fn put(&mut self, spec: v1::TenantSpec, create: bool) -> Result<(), tonic::Status> {
        match self {
            Writer::Etcd(ch) => {
                let req = etcdpb::PutRequest {
                    key: format!("tenants/{}", spec.id).into_bytes(),
                    value: spec.encode_to_vec(),
                };
                unary::<_, etcdpb::PutResponse>(ch.clone(), "/etcdserverpb.KV/Put", req).await.map(|_| ())
            }
            Writer::Tessera(client) => {
                let req = v1::TenantRequest { spec: Some(spec), ..Default::default() };
                if create { client.create_tenant(req).await } else { client.update_tenant(req).await }.map(|_| ())
            }
        }
    }
}

/// What one run measured.
#[derive(Default)]
struct Run {
    latencies_ms: Vec<f64>,
    errors: usize,
    secs: f64,
    cpu_secs: f64,
    client_cpu_secs: f64,
}

/// One system's runs at one concurrency, together.
#[derive(Default)]
struct Totals {
    rates: Vec<f64>,
    latencies_ms: Vec<f64>,
    errors: usize,
    cpu_secs: f64,
    client_cpu_secs: f64,
    acknowledged: usize,
}

impl Totals {
    fn add(&mut self, run: Run) {
        let ok = run.latencies_ms.len();
        self.rates.push(ok as f64 / run.secs);
        self.latencies_ms.extend(run.latencies_ms);
        self.errors += run.errors;
        self.cpu_secs += run.cpu_secs;
        self.client_cpu_secs += run.client_cpu_secs;
        self.acknowledged += ok;
    }
}

/// Which writes a run sends.
#[derive(Clone, Copy)]
enum Load {
    /// Updates of the hot tenants for this long.
    For(Duration),
    /// Creates tenants `prefix-from..prefix-to`.
    Create { from: usize, to: usize },
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok()?.trim().parse().ok())
        .unwrap_or(100.0)
}

/// User plus system CPU seconds of the processes.
fn cpu_secs(pids: &[u32]) -> f64 {
    let ticks: u64 = pids
        .iter()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // Fields after the command (which may hold spaces) start after the last ')'.
            let rest = &stat[stat.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    ticks as f64 / clock_ticks()
}

/// Connections for `inflight` requests in flight, each made by `connect`: as many as Tessera's server allows
/// streams on one ([`MAX_STREAMS_PER_CONNECTION`]) per connection, as a client with more to send opens more
/// connections and etcd's own benchmark tool spreads its clients over `--conns`. Both systems get the same
/// connections.
fn writers(inflight: usize, connect: impl Fn() -> Writer) -> Vec<Writer> {
    (0..inflight.div_ceil(MAX_STREAMS_PER_CONNECTION as usize).max(1)).map(|_| connect()).collect()
}

/// Drives `inflight` workers spread evenly over `writers`' connections.
async fn drive(writers: Vec<Writer>, inflight: usize, load: Load, prefix: &str, pids: &[u32]) -> Run {
    let next = Arc::new(AtomicUsize::new(0));
    let cpu0 = cpu_secs(pids);
    let client0 = cpu_secs(&[std::process::id()]);
    let start = Instant::now();
    let tasks: Vec<_> = (0..inflight)
        .map(|w| {
            let mut writer = writers[w % writers.len()].clone();
            let next = next.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0;
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    let (id, create) = match load {
                        Load::For(d) if start.elapsed() >= d => break,
                        Load::For(_) => (format!("{prefix}{}", k % HOT_KEYS), false),
                        Load::Create { from, to } if from + k >= to => break,
                        Load::Create { from, .. } => (format!("{prefix}{}", from + k), true),
                    };
                    let spec = tenant(&id, MODELS[k % MODELS.len()], 10.0 + (k % 1000) as f64 / 100.0);
                    let t0 = Instant::now();
                    match writer.put(spec, create).await {
                        Ok(()) => lat.push(t0.elapsed().as_secs_f64() * 1000.0),
                        Err(e) => {
                            if errors == 0 {
                                eprintln!("{prefix}: a write failed ({} in flight): {}", inflight, e.message());
                            }
                            errors += 1;
                        }
                    }
                }
                (lat, errors)
            })
        })
        .collect();
    let mut run = Run::default();
    for t in tasks {
        let (lat, errors) = t.await.unwrap();
        run.latencies_ms.extend(lat);
        run.errors += errors;
    }
    run.secs = start.elapsed().as_secs_f64();
    run.cpu_secs = cpu_secs(pids) - cpu0;
    run.client_cpu_secs = cpu_secs(&[std::process::id()]) - client0;
    run
}

/// The two systems under test.
struct Systems {
    etcd: Option<(Etcd, usize)>,
    tessera: (Cluster, u64),
}

impl Systems {
    async fn start() -> Systems {
        let etcd = match Etcd::find() {
            Some(bin) => {
                let e = Etcd::start(bin, 3);
                let leader = e.wait_leader().await;
                if let Some(st) = e.status(leader).await {
                    *ETCD_VERSION.lock().unwrap() = st.version;
                }
                Some((e, leader))
            }
            None => {
                println!("etcd not found (ETCD_BIN or PATH; Debian: apt-get install etcd-server): Tessera alone");
                None
            }
        };
        let extra = std::env::var("BENCH_TESSERA_ARGS").unwrap_or_default();
        let c = Cluster::start(3, &extra.split_whitespace().collect::<Vec<_>>());
        let leader = c.wait_leader(&[1, 2, 3], Duration::from_secs(30)).await;
        // The first tenant waits (with retries) until the members have loaded the model profiles.
        cluster::create(&c, leader, tenant("hot0", MODELS[0], 10.0)).await;
        let s = Systems { etcd, tessera: (c, leader) };
        // The hot tenants, in both.
        for name in s.names() {
            let run = s.drive(name, 16, Load::Create { from: 1, to: HOT_KEYS }, "hot").await;
            assert_eq!(run.errors, 0, "{name}: creating the hot tenants failed");
        }
        s
    }

    fn names(&self) -> Vec<&'static str> {
        if self.etcd.is_some() { vec!["etcd", "tessera"] } else { vec!["tessera"] }
    }

    async fn drive(&self, name: &str, inflight: usize, load: Load, prefix: &str) -> Run {
        match name {
            "etcd" => {
                let (e, leader) = self.etcd.as_ref().unwrap();
                let writers = writers(inflight, || Writer::etcd(&e.members[*leader].client));
                drive(writers, inflight, load, prefix, &e.pids()).await
            }
            _ => {
                let (c, leader) = &self.tessera;
                let pids: Vec<u32> = [1, 2, 3].iter().filter_map(|i| c.pid(*i)).collect();
                let writers = writers(inflight, || Writer::tessera(&c.addr(*leader)));
                drive(writers, inflight, load, prefix, &pids).await
            }
        }
    }

    /// Alternating timed runs at each concurrency; prints one table row per system and concurrency.
    async fn table(&self, label: &str, concurrency: &[usize], runs: usize, secs: u64) {
        for &inflight in concurrency {
            let names = self.names();
            let mut all: Vec<Totals> = names.iter().map(|_| Totals::default()).collect();
            for r in 0..runs {
                let order: Vec<usize> =
                    if r % 2 == 0 { (0..names.len()).collect() } else { (0..names.len()).rev().collect() };
                for s in order {
                    let run = self.drive(names[s], inflight, Load::For(Duration::from_secs(secs)), "hot").await;
                    all[s].add(run);
                }
            }
            for (s, t) in all.iter_mut().enumerate() {
                t.latencies_ms.sort_by(f64::total_cmp);
                report!(
                    "| {label} | {inflight} | {} | {:.0} | {:.1} | {:.1} | {:.3} | {:.3} | {} |",
                    names[s],
                    median(&mut t.rates),
                    quantile(&t.latencies_ms, 0.5),
                    quantile(&t.latencies_ms, 0.99),
                    t.cpu_secs * 1000.0 / t.acknowledged.max(1) as f64,
                    t.client_cpu_secs * 1000.0 / t.acknowledged.max(1) as f64,
                    t.errors,
                );
            }
        }
    }

    fn data_bytes(&self, name: &str) -> u64 {
        match name {
            "etcd" => self.etcd.as_ref().map_or(0, |(e, _)| e.members.iter().map(|m| dir_bytes(&m.data_dir)).sum()),
            _ => [1, 2, 3].iter().map(|i| dir_bytes(&self.tessera.0.data_dir(*i))).sum(),
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .filter_map(Result::ok)
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

const HEADER: &str = "| state | in flight | system | writes/s (median) | p50 ms | p99 ms | server CPU ms/write | client CPU ms/write | errors |\n\
                      |---|---|---|---|---|---|---|---|---|";

async fn throughput(runs: usize, secs: u64) {
    let s = Systems::start().await;
    report!("\n### Throughput\n\n{runs} alternating runs of {secs} s at each concurrency, updates of 100 tenants.\n");
    report!("{HEADER}");
    s.table("100 tenants", &env_list("BENCH_CONCURRENCY", "1,16,256"), runs, secs).await;
}

async fn growth(runs: usize, secs: u64) {
    let s = Systems::start().await;
    report!(
        "\n### Growth\n\nTenants created through the same client (256 in flight), then {runs} alternating runs of {secs} s \
         updating 100 of them.\n"
    );
    report!("{HEADER}");
    let mut loaded = 0;
    let mut sizes_at = Vec::new();
    for target in env_list("BENCH_GROWTH", "0,10000,100000") {
        if target > loaded {
            for name in s.names() {
                let start = Instant::now();
                let run = s.drive(name, 256, Load::Create { from: loaded, to: target }, "g").await;
                eprintln!(
                    "growth: {name}: {} tenants loaded in {:.1} s ({} errors)",
                    target - loaded,
                    start.elapsed().as_secs_f64(),
                    run.errors
                );
            }
            loaded = target;
        }
        s.table(&format!("{} tenants", loaded + HOT_KEYS), &[1, 256], runs, secs).await;
        let sizes: Vec<String> =
            s.names().iter().map(|n| format!("{n} {:.1} MB", s.data_bytes(n) as f64 / 1e6)).collect();
        sizes_at.push(format!("{} tenants: {}", loaded + HOT_KEYS, sizes.join(", ")));
    }
    report!("\nData directories of the three members together, at {}.", sizes_at.join("; "));
}

/// How long one write may take during a failover before the client gives up on it and tries again.
const ATTEMPT: Duration = Duration::from_millis(250);

/// Kills the leader, writes through the first survivor until acknowledged; milliseconds.
async fn failover(n: usize) {
    let mut s = Systems::start().await;
    let mut times: Vec<(&str, Vec<f64>)> = s.names().into_iter().map(|n| (n, Vec::new())).collect();
    for round in 0..n {
        for (name, times) in &mut times {
            // The leader's position (etcd) or id (Tessera), and a writer to a survivor.
            let (killed, mut writer) = if *name == "etcd" {
                let (e, _) = s.etcd.as_mut().unwrap();
                let leader = e.wait_leader().await;
                (leader, Writer::etcd(&e.members[(leader + 1) % e.members.len()].client))
            } else {
                let (c, _) = &s.tessera;
                let leader = c.wait_leader(&[1, 2, 3], Duration::from_secs(30)).await;
                (leader as usize, Writer::tessera(&c.addr(leader % 3 + 1)))
            };
            let start = Instant::now();
            if *name == "etcd" {
                s.etcd.as_mut().unwrap().0.kill(killed);
            } else {
                s.tessera.0.kill(killed as u64);
            }
            let id = format!("failover-{round}");
            // The same retry for both: each attempt may take ATTEMPT (etcd holds a write while it has no leader,
            // Tessera refuses it at once), then the next follows 10 ms later.
            loop {
                let spec = tenant(&id, "resnet50", 1.0);
                match tokio::time::timeout(ATTEMPT, writer.put(spec, true)).await {
                    Ok(Ok(())) => break,
                    Ok(Err(st)) if st.code() == tonic::Code::AlreadyExists => break,
                    _ => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            println!("failover: {name} round {round}: a write was acknowledged {ms:.0} ms after the leader's SIGKILL");
            times.push(ms);
            if *name == "etcd" {
                let (e, _) = s.etcd.as_mut().unwrap();
                e.spawn(killed);
                e.wait_leader().await;
            } else {
                let (c, _) = &mut s.tessera;
                c.spawn(killed as u64);
                c.wait_converged(&[1, 2, 3], Duration::from_secs(30)).await;
            }
        }
    }
    report!(
        "\n### Failover\n\nSIGKILL of the leader to the first write a survivor acknowledged, {n} rounds each; the \
         client gives each attempt {} ms, then tries again 10 ms later.\n",
        ATTEMPT.as_millis()
    );
    report!("| system | median ms | rounds (ms) |\n|---|---|---|");
    for (name, t) in &mut times {
        let rounds: Vec<String> = t.iter().map(|ms| format!("{ms:.0}")).collect();
        report!("| {name} | {:.0} | {} |", median(t), rounds.join(", "));
    }
}

/// Replaces (or appends) this benchmark's section in the Markdown file `path` (relative: to the repository root).
fn write_markdown(path: &str, etcd_version: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    let begin = "<!-- begin section: raft-vs-etcd -->";
    let end = "<!-- end section: raft-vs-etcd -->";
    let command = "BENCH_MARKDOWN=docs/results.md scripts/cargo bench -p tessera-coordinator --bench versus_etcd";
    let section = format!(
        "{begin}\n## Coordinator: Raft against etcd\n\nMade by `{command}` on 2 shared cores, which the client and \
         all six servers share (compare ratios; `docs/performance.md` has the history). Three members on loopback \
         each, fsync on, etcd {etcd_version}; one Rust gRPC client drives both (one connection to the leader per 64 requests in flight, N \
         requests in flight): etcd's `KV/Put` of a tenant's spec, Tessera's `UpdateTenant` of the same spec. \
         Server CPU is the three members' user and system time per acknowledged write; client CPU is the \
         benchmark's own, the load's cost, taken from the same two cores.\n{}{end}\n",
        REPORT.lock().unwrap()
    );
    let old = std::fs::read_to_string(&path).unwrap_or_default();
    let text = match (old.find(begin), old.find(end)) {
        (Some(b), Some(e)) if e > b => {
            format!("{}{section}{}", &old[..b], old[e + end.len()..].trim_start_matches('\n'))
        }
        _ => format!("{}\n{section}", old.trim_end_matches('\n').to_string() + "\n"),
    };
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
    println!("wrote the section into {}", path.display());
}

fn main() {
    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (runs, secs) = (env("BENCH_RUNS", 3), env("BENCH_SECS", 5) as u64);
    println!("Tessera against etcd, one client (a shared 2-core machine: compare medians and ratios, not absolutes)");
    rt.block_on(async {
        if only.is_empty() || only == "throughput" {
            throughput(runs, secs).await;
        }
        if only.is_empty() || only == "growth" {
            growth(runs, secs).await;
        }
        if only.is_empty() || only == "failover" {
            failover(env("BENCH_FAILOVERS", 5)).await;
        }
    });
    if let Ok(path) = std::env::var("BENCH_MARKDOWN") {
        write_markdown(&path, &ETCD_VERSION.lock().unwrap());
    }
}
