//! `fault-check`: a concurrent client workload against a Tessera coordinator cluster, for fault tests
//! (`deploy/fault-test.sh` runs it while it kills, partitions and restarts the cluster's containers).
//!
//! Several clients run for `--duration`, each one operation at a time through the coordinator's own client (which
//! fails over between `--endpoints` and follows leader hints):
//! - **writes**: set tenant `lin-K`'s SLO to a value no other write uses (`100 ms + id / 1000`);
//! - **reads**: read tenant `lin-K` (a linearizable read through the leader);
//! - **creates**: create a tenant of its own (`c<client>-<n>`), to count acknowledged writes that are lost.
//!
//! Each write and create carries a request id of its own ([`Client::request`]), as every client that retries must:
//! the client resends a call whose answer was lost (a leader killed after it committed, a leader change while the
//! write waited), and the cluster applies a request id once. Without it the resend can apply the same value a
//! second time, after another client's write, and no single point of the operation explains the reads around both.
//!
//! Every invocation and every answer is recorded in one real-time order. An operation that fails without a
//! definite answer (a timeout, a lost connection) may or may not have taken effect: it stays in flight for ever and
//! its client goes on as a new process, as in Jepsen's model. Then:
//! - **linearizable**: each key's history (a register) is checked by the Wing & Gong search with Lowe's memoisation
//!   (`todc-utils`' `WGLChecker`)
//!   (linearizability is local, so keys are checked one by one);
//! - **lost**: acknowledged creates missing from a final linearizable listing;
//! - **max_unavailable_s**: the longest time in which no operation of any client succeeded.
//!
//! Prints `ops=N indeterminate=N lost=N linearizable=yes|no max_unavailable_s=X` as its last line (and `--history
//! FILE` writes the history as JSON lines); exits 0 when the history is linearizable and nothing was lost.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use tessera_coordinator::client::Client;
use tessera_proto::v1;
use todc_utils::linearizability::WGLChecker;
use todc_utils::linearizability::history::{Action, History};
use todc_utils::specifications::Specification;
use tonic::Code;

#[derive(Parser)]
#[command(name = "fault-check", version, about = "A concurrent client history against a Tessera cluster, checked")]
struct Cli {
    /// Coordinator endpoints, HOST:PORT,...
    #[arg(long, value_delimiter = ',', required_unless_present = "check")]
    endpoints: Vec<String>,
    /// Check a history written by --history instead of running clients.
    #[arg(long, value_name = "FILE")]
    check: Option<PathBuf>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: u32,
    /// Registers (tenants `lin-0` ...) the clients write and read.
    #[arg(long, default_value_t = 4)]
    keys: u32,
    /// How long the clients run.
    #[arg(long, default_value = "60s")]
    duration: humantime::Duration,
    /// Pause between two operations of one client.
    #[arg(long, default_value = "50ms")]
    pace: humantime::Duration,
    /// Deadline of one call.
    #[arg(long, default_value = "3s")]
    timeout: humantime::Duration,
    /// Seeds the clients' choice of operations.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Longest time the linearizability check may search.
    #[arg(long, default_value = "120s")]
    check_timeout: humantime::Duration,
    /// Write the history here, one JSON object a line.
    #[arg(long)]
    history: Option<PathBuf>,
    /// This client's certificate (mutual TLS; an operator's or admin's), with --tls-key and --tls-ca.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The CA that signs the coordinators' certificates.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
}

impl Cli {
    /// A client of the cluster, with mutual TLS when the flags ask for it.
    fn client(&self) -> Client {
        let tls = tessera_auth::TlsFiles::from_flags(self.tls_cert.clone(), self.tls_key.clone(), self.tls_ca.clone())
            .expect("checked in run");
        Client::new(&self.endpoints, *self.timeout).with_tls(tls)
    }
}

/// The model every register tenant uses.
const MODEL: &str = "mobilenet_v2";
/// A register's value `v` is the SLO `BASE_SLO_MS + v / 1000` ms.
const BASE_SLO_MS: f64 = 100.0;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Write(u64),
    Read,
    Create(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Kind {
    Invoke(Op),
    /// A definite answer: the value read, or none for a write or create.
    Ok(Option<u64>),
    /// No definite answer: the operation stays in flight.
    Unknown(String),
}

#[derive(Debug, Clone)]
struct Event {
    at_ms: f64,
    process: u64,
    key: Option<u32>,
    kind: Kind,
}

struct Recorder {
    start: Instant,
    events: Mutex<Vec<Option<Event>>>,
    last_success: Mutex<(Instant, Duration)>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Recorder {
    fn record(&self, process: u64, key: Option<u32>, kind: Kind) -> usize {
        let mut events = lock(&self.events);
        let at_ms = self.start.elapsed().as_secs_f64() * 1000.0;
        events.push(Some(Event { at_ms, process, key, kind }));
        events.len() - 1
    }

    /// Drops an invocation that constrains nothing (a read without an answer).
    fn void(&self, index: usize) {
        lock(&self.events)[index] = None;
    }

    fn succeeded(&self) {
        let now = Instant::now();
        let mut s = lock(&self.last_success);
        let gap = now - s.0;
        s.1 = s.1.max(gap);
        s.0 = now;
    }
}

fn slo_of(value: u64) -> f64 {
    BASE_SLO_MS + value as f64 / 1000.0
}

fn value_of(slo_ms: f64) -> u64 {
    ((slo_ms - BASE_SLO_MS) * 1000.0).round().max(0.0) as u64
}

fn spec(id: &str, slo_ms: f64) -> v1::TenantSpec {
    v1::TenantSpec {
        id: id.into(),
        name: id.into(),
        model: MODEL.into(),
        slo_ms,
        slo_percentile: 0.99,
        weight: 1.0,
        demand: Some(v1::tenant_spec::Demand::Poisson(v1::PoissonDemand { rate_rps: 1.0 })),
        retraining: None,
        jobs: None,
        pin: None,
    }
}

fn key_id(k: u32) -> String {
    format!("lin-{k}")
}

/// Sets register `k` to 0: updates its tenant, or creates it where it does not exist yet.
async fn reset(client: &Client, k: u32) -> Result<(), tonic::Status> {
    let req = v1::TenantRequest { spec: Some(spec(&key_id(k), slo_of(0))), ..Default::default() };
    let id = Client::new_request_id();
    let update = client
        .call(|mut x| {
            let req = Client::request(req.clone(), &id);
            async move { x.update_tenant(req).await }
        })
        .await;
    let id = Client::new_request_id();
    match update {
        Err(s) if s.code() == Code::NotFound => client
            .call(|mut x| {
                let req = Client::request(req.clone(), &id);
                async move { x.create_tenant(req).await }
            })
            .await
            .map(|_| ()),
        other => other.map(|_| ()),
    }
}

/// Sets every register to 0, retrying while the cluster elects a leader or loads its models.
async fn setup(client: &Client, keys: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    for k in 0..keys {
        while let Err(s) = reset(client, k).await {
            anyhow::ensure!(Instant::now() < deadline, "cannot set {}: {s}", key_id(k));
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    Ok(())
}

struct ClientRun {
    acked_creates: Vec<String>,
}

async fn run_client(cli: Arc<Cli>, rec: Arc<Recorder>, c: u32, deadline: Instant) -> ClientRun {
    let client = cli.client();
    let mut rng = ChaCha8Rng::seed_from_u64(cli.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(c)));
    let mut generation = 0u64;
    let mut seq = 0u64;
    let mut acked_creates = Vec::new();
    while Instant::now() < deadline {
        let process = u64::from(c) * 1_000_000 + generation;
        let key = rng.random_range(0..cli.keys);
        let choice = rng.random_range(0..10);
        seq += 1;
        if choice < 5 {
            // A value no other write uses.
            let value = seq * u64::from(cli.clients) + u64::from(c) + 1;
            rec.record(process, Some(key), Kind::Invoke(Op::Write(value)));
            let req = v1::TenantRequest { spec: Some(spec(&key_id(key), slo_of(value))), ..Default::default() };
            // Resent after a lost answer, applied once.
            let request = Client::new_request_id();
            match client
                .call(|mut x| {
                    let req = Client::request(req.clone(), &request);
                    async move { x.update_tenant(req).await }
                })
                .await
            {
                Ok(_) => {
                    rec.record(process, Some(key), Kind::Ok(None));
                    rec.succeeded();
                }
                Err(s) => {
                    rec.record(process, Some(key), Kind::Unknown(s.to_string()));
                    generation += 1;
                }
            }
        } else if choice < 9 {
            let at = rec.record(process, Some(key), Kind::Invoke(Op::Read));
            let req = v1::TenantIdRequest { id: key_id(key), ..Default::default() };
            match client
                .call(|mut x| {
                    let req = req.clone();
                    async move { x.get_tenant(req).await }
                })
                .await
            {
                Ok(r) => {
                    let value = r.spec.map_or(0, |s| value_of(s.slo_ms));
                    rec.record(process, Some(key), Kind::Ok(Some(value)));
                    rec.succeeded();
                }
                Err(_) => rec.void(at),
            }
        } else {
            let id = format!("c{c}-{seq}");
            rec.record(process, None, Kind::Invoke(Op::Create(id.clone())));
            let req = v1::TenantRequest { spec: Some(spec(&id, 150.0)), ..Default::default() };
            let request = Client::new_request_id();
            match client
                .call(|mut x| {
                    let req = Client::request(req.clone(), &request);
                    async move { x.create_tenant(req).await }
                })
                .await
            {
                // A resent create answers as its first send did; one the cluster no longer remembers (past its
                // window of request ids) answers AlreadyExists, and it took effect all the same.
                Ok(_) => {
                    rec.record(process, None, Kind::Ok(None));
                    rec.succeeded();
                    acked_creates.push(id);
                }
                Err(s) if s.code() == Code::AlreadyExists => {
                    rec.record(process, None, Kind::Ok(None));
                    rec.succeeded();
                    acked_creates.push(id);
                }
                Err(s) => {
                    rec.record(process, None, Kind::Unknown(s.to_string()));
                    generation += 1;
                }
            }
        }
        tokio::time::sleep(*cli.pace).await;
    }
    ClientRun { acked_creates }
}

/// A register operation as the checker sees it: a read with the value it returned, or a write.
#[derive(Debug, Clone, Copy, PartialEq)]
enum RegisterOp {
    Read(Option<u64>),
    Write(u64),
}

/// The register every `lin-K` tenant is: starts at 0, a read returns the last value written.
struct RegisterSpec;

impl Specification for RegisterSpec {
    type State = u64;
    type Operation = RegisterOp;

    fn init() -> u64 {
        0
    }

    fn apply(op: &RegisterOp, state: &u64) -> (bool, u64) {
        match *op {
            RegisterOp::Read(v) => (v == Some(*state), *state),
            RegisterOp::Write(v) => (true, v),
        }
    }
}

/// One key's history for the checker: (process, call or response), in real-time order.
type RegisterHistory = Vec<(usize, Action<RegisterOp>)>;

/// Each key's history as complete operations (every call has its response), for the Wing & Gong checker with Lowe's
/// memoisation (`todc-utils`), which needs complete histories and whose search stays small on them.
///
/// Operations without a definite answer are made complete without changing the verdict (values written are unique):
/// - a read without an answer constrains nothing: left out (the recorder already voids them);
/// - a write without an answer whose value no read returned, if it took effect, was overwritten before any read, so
///   a linearization with it stays one without it and one without it needs nothing from it: left out;
/// - a write without an answer whose value a read returned did take effect, before the first such read returned:
///   it gets a response just before that read's response (just after its own call, where the read came first, which
///   no linearization allows).
///
/// An answer without a call, or a call while the process has one in flight, is a
/// malformed history.
fn register_histories(events: &[Event], keys: u32) -> Result<Vec<RegisterHistory>, String> {
    // Each call with the index of its definite answer, if any.
    let mut pending: BTreeMap<u64, usize> = BTreeMap::new();
    let mut calls: Vec<(usize, Option<usize>)> = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match &e.kind {
            Kind::Invoke(_) => {
                if pending.insert(e.process, i).is_some() {
                    return Err(format!("event {}: process {} calls with a call in flight", i + 1, e.process));
                }
            }
            Kind::Ok(_) | Kind::Unknown(_) => {
                let Some(call) = pending.remove(&e.process) else {
                    return Err(format!("event {}: process {} answers without a call", i + 1, e.process));
                };
                calls.push((call, matches!(e.kind, Kind::Ok(_)).then_some(i)));
            }
        }
    }
    // A history cut short: what was in flight has no definite answer.
    calls.extend(pending.into_values().map(|call| (call, None)));

    let mut first_read: BTreeMap<(u32, u64), usize> = BTreeMap::new();
    for &(call, answer) in &calls {
        if let (Some(k), Some(a)) = (events[call].key, answer)
            && let Kind::Ok(Some(v)) = events[a].kind
        {
            let at = first_read.entry((k, v)).or_insert(a);
            *at = (*at).min(a);
        }
    }

    // Entries sorted by (event index, rank): a synthetic response (rank 0) goes just before the event it is placed
    // at (rank 1), or just after a call (rank 2).
    type Placed = ((usize, u8), usize, Action<RegisterOp>);
    let mut per_key: Vec<Vec<Placed>> = vec![Vec::new(); keys as usize];
    for &(call, answer) in &calls {
        let e = &events[call];
        let Some(k) = e.key else { continue };
        let entries =
            per_key.get_mut(k as usize).ok_or_else(|| format!("event {}: key {k} beyond the {keys} keys", call + 1))?;
        let (op, response) = match (&e.kind, answer) {
            (Kind::Invoke(Op::Read), Some(a)) => match events[a].kind {
                Kind::Ok(Some(v)) => (RegisterOp::Read(None), ((a, 1), RegisterOp::Read(Some(v)))),
                _ => return Err(format!("event {}: a read answered without a value", a + 1)),
            },
            (Kind::Invoke(Op::Write(v)), Some(a)) => (RegisterOp::Write(*v), ((a, 1), RegisterOp::Write(*v))),
            (Kind::Invoke(Op::Write(v)), None) => match first_read.get(&(k, *v)) {
                Some(&r) if r > call => (RegisterOp::Write(*v), ((r, 0), RegisterOp::Write(*v))),
                Some(_) => (RegisterOp::Write(*v), ((call, 2), RegisterOp::Write(*v))),
                None => continue,
            },
            _ => continue,
        };
        // Each operation is its own process: real-time order is all linearizability asks of a process's operations,
        // and a process that lost an answer must not have its later calls paired with a made-up response.
        let process = entries.len() / 2;
        entries.push(((call, 1), process, Action::Call(op)));
        entries.push((response.0, process, Action::Response(response.1)));
    }
    Ok(per_key
        .into_iter()
        .map(|mut entries| {
            entries.sort_by_key(|(at, _, _)| *at);
            entries.into_iter().map(|(_, p, action)| (p, action)).collect()
        })
        .collect())
}

/// Whether every key's history is linearizable as a register starting at 0 (linearizability is local, so keys are
/// checked one by one).
fn linearizable(events: &[Event], keys: u32) -> Result<bool, String> {
    for (k, actions) in register_histories(events, keys)?.into_iter().enumerate() {
        if !register_linearizable(actions) {
            eprintln!("fault-check: the history of {} is not linearizable", key_id(k as u32));
            for line in witness(events, keys, k as u32) {
                eprintln!("fault-check: {line}");
            }
            return Ok(false);
        }
    }
    Ok(true)
}

fn register_linearizable(actions: RegisterHistory) -> bool {
    actions.is_empty() || WGLChecker::<RegisterSpec>::is_linearizable(History::from_actions(actions))
}

/// How many of a key's last events [`witness`] shows.
const WITNESS_EVENTS: usize = 24;

/// Where key `k`'s history stops being linearizable, for people: the shortest prefix of the history that is not
/// (found by bisection; a prefix of a linearizable history is linearizable, what was in flight at its end counting
/// as unanswered), then the key's last [`WITNESS_EVENTS`] events up to there and the calls of the writes whose values
/// those events read. Each line is `event N at T ms: process P key K: WHAT`.
fn witness(events: &[Event], keys: u32, k: u32) -> Vec<String> {
    let bad = |n: usize| {
        register_histories(&events[..n], keys)
            .map(|h| h.into_iter().nth(k as usize).is_some_and(|a| !register_linearizable(a)))
            .unwrap_or(false)
    };
    let (mut good, mut end) = (0, events.len());
    if !bad(end) {
        return Vec::new();
    }
    while end - good > 1 {
        let mid = good + (end - good) / 2;
        if bad(mid) { end = mid } else { good = mid }
    }
    let mine: Vec<usize> = (0..end).filter(|&i| events[i].key == Some(k)).collect();
    let shown = &mine[mine.len().saturating_sub(WITNESS_EVENTS)..];
    let read: BTreeSet<u64> =
        shown.iter().filter_map(|&i| if let Kind::Ok(Some(v)) = events[i].kind { Some(v) } else { None }).collect();
    let mut lines: BTreeSet<usize> = shown.iter().copied().collect();
    lines.extend(mine.iter().filter(|&&i| matches!(events[i].kind, Kind::Invoke(Op::Write(v)) if read.contains(&v))));
    let mut out = vec![format!(
        "{} stops being linearizable at event {end} ({:.1} ms); its last events, and the calls of the writes they read:",
        key_id(k),
        events[end - 1].at_ms
    )];
    out.extend(lines.into_iter().map(|i| {
        let e = &events[i];
        format!("event {} at {:.1} ms: process {} key {}: {:?}", i + 1, e.at_ms, e.process, k, e.kind)
    }));
    out
}

/// One history event as a JSON object: `{"at_ms", "process", "key", "type": "invoke"|"ok"|"unknown", ...}` with
/// `op` and `value` for invocations, `value` for reads' answers and `error` for unknown outcomes.
fn event_json(e: &Event) -> serde_json::Value {
    let mut v = json!({"at_ms": e.at_ms, "process": e.process, "key": e.key});
    let extra = match &e.kind {
        Kind::Invoke(Op::Write(x)) => json!({"type": "invoke", "op": "write", "value": x}),
        Kind::Invoke(Op::Read) => json!({"type": "invoke", "op": "read"}),
        Kind::Invoke(Op::Create(id)) => json!({"type": "invoke", "op": "create", "tenant": id}),
        Kind::Ok(x) => json!({"type": "ok", "value": x}),
        Kind::Unknown(error) => json!({"type": "unknown", "error": error}),
    };
    if let (Some(o), Some(x)) = (v.as_object_mut(), extra.as_object()) {
        o.extend(x.clone());
    }
    v
}

/// Reads a history written by `--history`; `FILE:LINE` names a malformed line.
fn read_history(path: &std::path::Path) -> anyhow::Result<Vec<Event>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut events = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |what: &str| anyhow::anyhow!("{}:{}: {what}", path.display(), n + 1);
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(&e.to_string()))?;
        let num =
            |k: &str| v.get(k).and_then(serde_json::Value::as_u64).ok_or_else(|| bad(&format!("`{k}`: a number")));
        let kind = match (v.get("type").and_then(|t| t.as_str()), v.get("op").and_then(|o| o.as_str())) {
            (Some("invoke"), Some("write")) => Kind::Invoke(Op::Write(num("value")?)),
            (Some("invoke"), Some("read")) => Kind::Invoke(Op::Read),
            (Some("invoke"), Some("create")) => {
                Kind::Invoke(Op::Create(v.get("tenant").and_then(|t| t.as_str()).unwrap_or_default().to_string()))
            }
            (Some("ok"), _) => Kind::Ok(v.get("value").and_then(serde_json::Value::as_u64)),
            (Some("unknown"), _) => {
                Kind::Unknown(v.get("error").and_then(|t| t.as_str()).unwrap_or_default().to_string())
            }
            _ => return Err(bad("`type`: invoke (with `op` write, read or create), ok or unknown")),
        };
        let key = v.get("key").and_then(serde_json::Value::as_u64).map(|k| k as u32);
        let at_ms = v.get("at_ms").and_then(serde_json::Value::as_f64).unwrap_or(0.0);
        events.push(Event { at_ms, process: num("process")?, key, kind });
    }
    Ok(events)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Some(path) = &cli.check {
        let checked = read_history(path).and_then(|events| {
            let keys = events.iter().filter_map(|e| e.key).max().map_or(0, |k| k + 1);
            linearizable(&events, keys).map_err(|e| anyhow::anyhow!("{}: malformed history: {e}", path.display()))
        });
        return match checked {
            Ok(ok) => {
                println!("linearizable={}", if ok { "yes" } else { "no" });
                if ok { std::process::ExitCode::SUCCESS } else { std::process::ExitCode::FAILURE }
            }
            Err(e) => {
                eprintln!("fault-check: {e:#}");
                std::process::ExitCode::from(2)
            }
        };
    }
    match run(cli) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("fault-check: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    anyhow::ensure!(cli.clients > 0 && cli.keys > 0, "--clients and --keys must be at least 1");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    tessera_auth::TlsFiles::from_flags(cli.tls_cert.clone(), cli.tls_key.clone(), cli.tls_ca.clone())
        .map_err(|e| anyhow::anyhow!(e))?;
    let cli = Arc::new(cli);
    let client = cli.client();
    runtime.block_on(setup(&client, cli.keys))?;
    let rec = Arc::new(Recorder {
        start: Instant::now(),
        events: Mutex::new(Vec::new()),
        last_success: Mutex::new((Instant::now(), Duration::ZERO)),
    });
    let deadline = Instant::now() + *cli.duration;
    let runs = runtime.block_on(async {
        let tasks: Vec<_> = (0..cli.clients)
            .map(|c| tokio::spawn(run_client(Arc::clone(&cli), Arc::clone(&rec), c, deadline)))
            .collect();
        let mut runs = Vec::new();
        for t in tasks {
            runs.push(t.await?);
        }
        anyhow::Ok(runs)
    })?;

    // Lost: acknowledged creates missing from a linearizable listing, once the cluster answers again.
    let listed: BTreeSet<String> = runtime.block_on(async {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            match client.call(|mut x| async move { x.list_tenants(v1::ListRequest { stale: false }).await }).await {
                Ok(r) => break Ok(r.tenants.into_iter().filter_map(|t| t.spec.map(|s| s.id)).collect()),
                Err(s) if Instant::now() > until => break Err(anyhow::anyhow!("cannot list the tenants: {s}")),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    })?;
    let acked: Vec<&String> = runs.iter().flat_map(|r| &r.acked_creates).collect();
    let lost = acked.iter().filter(|id| !listed.contains(**id)).count();

    let events: Vec<Event> = lock(&rec.events).iter().flatten().cloned().collect();
    if let Some(path) = &cli.history {
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| format!("--history {}", path.display()))?,
        );
        for e in &events {
            writeln!(f, "{}", event_json(e))?;
        }
        f.flush()?;
    }
    let ops = events.iter().filter(|e| matches!(e.kind, Kind::Invoke(_))).count();
    let indeterminate = events.iter().filter(|e| matches!(e.kind, Kind::Unknown(_))).count();
    let keys = cli.keys;
    // The search is exponential in the worst case: bounded by --check-timeout.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new().spawn(move || {
        let _ = tx.send(linearizable(&events, keys));
    })?;
    let checked = match rx.recv_timeout(*cli.check_timeout) {
        Ok(r) => r.map_err(|e| anyhow::anyhow!("malformed history: {e}"))?,
        Err(_) => {
            println!(
                "ops={ops} indeterminate={indeterminate} acked_creates={} lost={lost} linearizable=unknown \
                 max_unavailable_s=?",
                acked.len()
            );
            anyhow::bail!("the linearizability check did not finish within {}", cli.check_timeout);
        }
    };
    let max_unavailable_s = {
        let s = lock(&rec.last_success);
        // The time from the last success to the end counts too.
        s.1.max(deadline.saturating_duration_since(s.0)).as_secs_f64()
    };
    println!(
        "ops={ops} indeterminate={indeterminate} acked_creates={} lost={lost} linearizable={} max_unavailable_s={max_unavailable_s:.1}",
        acked.len(),
        if checked { "yes" } else { "no" },
    );
    Ok(checked && lost == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(process: u64, kind: Kind) -> Event {
        Event { at_ms: 0.0, process, key: Some(0), kind }
    }

    #[test]
    fn a_read_of_an_overwritten_value_after_the_overwrite_returned_is_not_linearizable() {
        // p1 writes 1, then p2 writes 2 (both acknowledged), then p1 reads 1: stale.
        let stale = vec![
            ev(1, Kind::Invoke(Op::Write(1))),
            ev(1, Kind::Ok(None)),
            ev(2, Kind::Invoke(Op::Write(2))),
            ev(2, Kind::Ok(None)),
            ev(1, Kind::Invoke(Op::Read)),
            ev(1, Kind::Ok(Some(1))),
        ];
        assert!(!linearizable(&stale, 1).unwrap());
        // The same read concurrent with the second write may see either value.
        let concurrent = vec![
            ev(1, Kind::Invoke(Op::Write(1))),
            ev(1, Kind::Ok(None)),
            ev(2, Kind::Invoke(Op::Write(2))),
            ev(1, Kind::Invoke(Op::Read)),
            ev(1, Kind::Ok(Some(1))),
            ev(2, Kind::Ok(None)),
        ];
        assert!(linearizable(&concurrent, 1).unwrap());
    }

    #[test]
    fn a_write_without_an_answer_may_or_may_not_have_happened() {
        let applied = vec![
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(7))),
        ];
        assert!(linearizable(&applied, 1).unwrap());
        let not_applied = vec![
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(0))),
        ];
        assert!(linearizable(&not_applied, 1).unwrap());
    }

    #[test]
    fn unanswered_writes_nobody_read_are_left_out_and_read_ones_kept() {
        let events = vec![
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
            ev(2, Kind::Invoke(Op::Write(8))),
            ev(2, Kind::Unknown("deadline".into())),
            ev(3, Kind::Invoke(Op::Read)),
            ev(3, Kind::Ok(Some(8))),
            ev(4, Kind::Invoke(Op::Write(9))),
            ev(4, Kind::Ok(None)),
        ];
        let h = register_histories(&events, 1).unwrap();
        let ops: Vec<_> = h[0].iter().map(|(p, a)| (*p, a.clone())).collect();
        // Write 7 is gone; write 8 ends just before the read that returned it.
        assert_eq!(
            ops,
            vec![
                (0, Action::Call(RegisterOp::Write(8))),
                (1, Action::Call(RegisterOp::Read(None))),
                (0, Action::Response(RegisterOp::Write(8))),
                (1, Action::Response(RegisterOp::Read(Some(8)))),
                (2, Action::Call(RegisterOp::Write(9))),
                (2, Action::Response(RegisterOp::Write(9))),
            ]
        );
        assert!(linearizable(&events, 1).unwrap());
    }

    #[test]
    fn an_unanswered_write_may_take_effect_until_its_value_is_first_read() {
        // Read 0 after the write lost its answer, then 7: the write took effect between the two reads.
        let late = vec![
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(0))),
            ev(3, Kind::Invoke(Op::Read)),
            ev(3, Kind::Ok(Some(7))),
        ];
        assert!(linearizable(&late, 1).unwrap());
        // A value read before anyone wrote it.
        let prescient = vec![
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(7))),
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
        ];
        assert!(!linearizable(&prescient, 1).unwrap());
        // Once an acknowledged write overwrote it, the lost write's value cannot come back.
        let resurrected = vec![
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(7))),
            ev(3, Kind::Invoke(Op::Write(9))),
            ev(3, Kind::Ok(None)),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(7))),
        ];
        assert!(!linearizable(&resurrected, 1).unwrap());
    }

    #[test]
    fn the_witness_ends_where_the_history_stops_being_linearizable() {
        // Write 1 is read, write 2 is acknowledged, then 1 is read again: the resend of a write applied twice.
        let mut events = vec![
            ev(1, Kind::Invoke(Op::Write(1))),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(1))),
            ev(3, Kind::Invoke(Op::Write(2))),
            ev(3, Kind::Ok(None)),
            ev(2, Kind::Invoke(Op::Read)),
            ev(2, Kind::Ok(Some(1))),
            ev(1, Kind::Ok(None)),
        ];
        for p in 10..40 {
            events.push(ev(p, Kind::Invoke(Op::Read)));
            events.push(ev(p, Kind::Ok(Some(1))));
        }
        assert!(!linearizable(&events, 1).unwrap());
        let lines = witness(&events, 1, 0);
        assert!(lines[0].starts_with("lin-0 stops being linearizable at event 7 "), "{lines:?}");
        // Event 7 is the second read of 1; the write of 1 is shown as the call whose value was read.
        assert_eq!(lines.len(), 1 + 7, "{lines:?}");
        assert!(lines[1].starts_with("event 1 at 0.0 ms: process 1 key 0: Invoke(Write(1))"), "{lines:?}");
        assert!(lines[7].ends_with("Ok(Some(1))"), "{lines:?}");
        assert!(witness(&events[..6], 1, 0).is_empty());
    }

    #[test]
    fn a_malformed_history_is_an_error_naming_the_event() {
        let answer_first = vec![ev(1, Kind::Ok(None))];
        assert_eq!(linearizable(&answer_first, 1).unwrap_err(), "event 1: process 1 answers without a call");
        let twice = vec![ev(1, Kind::Invoke(Op::Read)), ev(1, Kind::Invoke(Op::Read))];
        assert_eq!(linearizable(&twice, 1).unwrap_err(), "event 2: process 1 calls with a call in flight");
    }

    /// A long, concurrent, linearizable history with lost answers, as a register run by `clients` processes would
    /// record it: each operation takes effect at a random point between its call and its answer.
    fn simulated_history(seed: u64, clients: u64, steps: usize) -> Vec<Event> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut register = 0u64;
        let mut next_value = 0u64;
        // Per client: its process, and its operation in flight with the result once it took effect.
        type InFlight = Option<(Op, Option<Option<u64>>)>;
        let mut state: Vec<(u64, InFlight)> = (0..clients).map(|c| (c, None)).collect();
        let mut events = Vec::new();
        for _ in 0..steps {
            let c = rng.random_range(0..clients) as usize;
            let (process, slot) = &mut state[c];
            match slot.take() {
                None => {
                    let op = if rng.random_bool(0.5) {
                        next_value += 1;
                        Op::Write(next_value)
                    } else {
                        Op::Read
                    };
                    events.push(ev(*process, Kind::Invoke(op.clone())));
                    *slot = Some((op, None));
                }
                Some((op, None)) => {
                    let result = match op {
                        Op::Write(v) => {
                            register = v;
                            None
                        }
                        _ => Some(register),
                    };
                    *slot = Some((op, Some(result)));
                }
                Some((op, Some(result))) => {
                    if matches!(op, Op::Write(_)) && rng.random_bool(0.05) {
                        events.push(ev(*process, Kind::Unknown("deadline".into())));
                        *process += clients;
                    } else {
                        events.push(ev(*process, Kind::Ok(result)));
                    }
                }
            }
        }
        events
    }

    #[test]
    fn long_concurrent_histories_with_lost_answers_are_checked_and_found_linearizable() {
        for seed in 0..4 {
            let events = simulated_history(seed, 8, 12_000);
            let lost = events.iter().filter(|e| matches!(e.kind, Kind::Unknown(_))).count();
            assert!(lost > 20, "seed {seed}: only {lost} lost answers");
            assert!(linearizable(&events, 1).unwrap(), "seed {seed}");
        }
    }

    #[test]
    fn a_history_round_trips_through_its_file_and_bad_lines_are_named() {
        let events = vec![
            ev(1, Kind::Invoke(Op::Write(7))),
            ev(1, Kind::Unknown("deadline".into())),
            Event { at_ms: 2.5, process: 2, key: None, kind: Kind::Invoke(Op::Create("c1-2".into())) },
            ev(2, Kind::Ok(None)),
            ev(3, Kind::Invoke(Op::Read)),
            ev(3, Kind::Ok(Some(7))),
        ];
        let dir = std::env::temp_dir().join(format!("fault-check-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("history.jsonl");
        let text: String = events.iter().map(|e| format!("{}\n", event_json(e))).collect();
        std::fs::write(&path, text).unwrap();
        let back = read_history(&path).unwrap();
        assert_eq!(back.len(), events.len());
        for (a, b) in back.iter().zip(&events) {
            assert_eq!((a.process, a.key, &a.kind, a.at_ms), (b.process, b.key, &b.kind, b.at_ms));
        }
        std::fs::write(&path, "{\"process\": 1, \"type\": \"invoke\", \"op\": \"write\"}\n").unwrap();
        let e = read_history(&path).unwrap_err().to_string();
        assert!(e.ends_with("history.jsonl:1: `value`: a number"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn register_values_round_trip_through_the_slo() {
        for v in [0, 1, 999, 123_456, 4_000_000] {
            assert_eq!(value_of(slo_of(v)), v);
        }
    }
}
