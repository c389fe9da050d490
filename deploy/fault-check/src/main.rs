//! `fault-check`: a concurrent client workload against a Tessera coordinator cluster, for fault tests
//! (`deploy/fault-test.sh` runs it while it kills, partitions and restarts the cluster's containers).
//!
//! Several clients run for `--duration`, each one operation at a time through the coordinator's own client (which
//! fails over between `--endpoints` and follows leader hints):
//! - **writes**: set tenant `lin-K`'s SLO to a value no other write uses (`100 ms + id / 1000`);
//! - **reads**: read tenant `lin-K` (a linearizable read through the leader);
//! - **creates**: create a tenant of its own (`c<client>-<n>`), to count acknowledged writes that are lost.
//!
//! Every invocation and every answer is recorded in one real-time order. An operation that fails without a
//! definite answer (a timeout, a lost connection) may or may not have taken effect: it stays in flight for ever and
//! its client goes on as a new process, as in Jepsen's model. Then:
//! - **linearizable**: each key's history (a register) is checked by `stateright`'s `LinearizabilityTester`
//!   (linearizability is local, so keys are checked one by one);
//! - **lost**: acknowledged creates missing from a final linearizable listing;
//! - **max_unavailable_s**: the longest time in which no operation of any client succeeded.
//!
//! Prints `ops=N indeterminate=N lost=N linearizable=yes|no max_unavailable_s=X` as its last line (and `--history
//! FILE` writes the history as JSON lines); exits 0 when the history is linearizable and nothing was lost.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::json;
use stateright::semantics::register::{Register, RegisterOp, RegisterRet};
use stateright::semantics::{ConsistencyTester, LinearizabilityTester};
use tessera_coordinator::client::Client;
use tessera_proto::v1;
use tonic::Code;

#[derive(Parser)]
#[command(name = "fault-check", version, about = "A concurrent client history against a Tessera cluster, checked")]
struct Cli {
    /// Coordinator endpoints, HOST:PORT,...
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
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
    /// Write the history here, one JSON object a line.
    #[arg(long)]
    history: Option<PathBuf>,
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
    }
}

fn key_id(k: u32) -> String {
    format!("lin-{k}")
}

/// Creates the register tenants (value 0), retrying while the cluster elects a leader or loads its models.
async fn setup(client: &Client, keys: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    for k in 0..keys {
        loop {
            let req = v1::TenantRequest { spec: Some(spec(&key_id(k), slo_of(0))) };
            match client.call(|mut x| { let req = req.clone(); async move { x.update_tenant(req).await } }).await {
                Ok(_) => break,
                Err(s) if s.code() == Code::NotFound => {
                    match client
                        .call(|mut x| { let req = req.clone(); async move { x.create_tenant(req).await } })
                        .await
                    {
                        Ok(_) => break,
                        Err(s) if Instant::now() > deadline => anyhow::bail!("cannot create {}: {s}", key_id(k)),
                        Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                    }
                }
                Err(s) if Instant::now() > deadline => anyhow::bail!("cannot set {}: {s}", key_id(k)),
                Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
            }
        }
    }
    Ok(())
}

struct ClientRun {
    acked_creates: Vec<String>,
}

async fn run_client(cli: Arc<Cli>, rec: Arc<Recorder>, c: u32, deadline: Instant) -> ClientRun {
    let client = Client::new(&cli.endpoints, *cli.timeout);
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
            let req = v1::TenantRequest { spec: Some(spec(&key_id(key), slo_of(value))) };
            match client.call(|mut x| { let req = req.clone(); async move { x.update_tenant(req).await } }).await {
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
            let req = v1::TenantIdRequest { id: key_id(key) };
            match client.call(|mut x| { let req = req.clone(); async move { x.get_tenant(req).await } }).await {
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
            let req = v1::TenantRequest { spec: Some(spec(&id, 150.0)) };
            match client.call(|mut x| { let req = req.clone(); async move { x.create_tenant(req).await } }).await {
                // A retried create that had taken effect answers AlreadyExists.
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

/// Whether every key's history is linearizable as a register starting at 0.
fn linearizable(events: &[Event], keys: u32) -> Result<bool, String> {
    for k in 0..keys {
        let mut tester = LinearizabilityTester::new(Register(0u64));
        for e in events.iter().filter(|e| e.key == Some(k)) {
            match &e.kind {
                Kind::Invoke(Op::Write(v)) => tester.on_invoke(e.process, RegisterOp::Write(*v)).map(|_| ())?,
                Kind::Invoke(Op::Read) => tester.on_invoke(e.process, RegisterOp::Read).map(|_| ())?,
                Kind::Invoke(Op::Create(_)) => {}
                Kind::Ok(Some(v)) => tester.on_return(e.process, RegisterRet::ReadOk(*v)).map(|_| ())?,
                Kind::Ok(None) => tester.on_return(e.process, RegisterRet::WriteOk).map(|_| ())?,
                Kind::Unknown(_) => {}
            }
        }
        if tester.serialized_history().is_none() {
            eprintln!("fault-check: the history of {} is not linearizable", key_id(k));
            return Ok(false);
        }
    }
    Ok(true)
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
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
    let cli = Arc::new(cli);
    let client = Client::new(&cli.endpoints, *cli.timeout);
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
            let kind = format!("{:?}", e.kind);
            writeln!(f, "{}", json!({"at_ms": e.at_ms, "process": e.process, "key": e.key, "event": kind}))?;
        }
        f.flush()?;
    }
    let ops = events.iter().filter(|e| matches!(e.kind, Kind::Invoke(_))).count();
    let indeterminate = events.iter().filter(|e| matches!(e.kind, Kind::Unknown(_))).count();
    // The search recurses once per operation of a key: give it a deep stack.
    let keys = cli.keys;
    let checked = std::thread::Builder::new()
        .stack_size(1 << 30)
        .spawn(move || linearizable(&events, keys))?
        .join()
        .map_err(|_| anyhow::anyhow!("the linearizability check panicked"))?
        .map_err(|e| anyhow::anyhow!("malformed history: {e}"))?;
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
    fn register_values_round_trip_through_the_slo() {
        for v in [0, 1, 999, 123_456, 4_000_000] {
            assert_eq!(value_of(slo_of(v)), v);
        }
    }
}
