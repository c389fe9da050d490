//! `coordinator`: run a coordinator node (`serve`) or talk to a cluster (`status`, `tenant`, `node`, `gpu`,
//! `plan`, `member`), like etcd and etcdctl.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use serde_json::json;
use tessera_coordinator::client::{Client, Retry, assignments_text, layout_text};
use tessera_coordinator::config::{CoordinatorConfig, Overrides};
use tessera_proto::v1;

/// Exit statuses of every command, printed under `--help` (docs/operations.md has the same table).
const EXIT_CODES: &str = "\
Exit status:
  0  done
  1  failed for another reason (a file that cannot be read or written, an internal error)
  2  usage: unknown flag, missing argument, flags that do not go together
  3  the cluster did not answer in time or has no leader (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED):
     worth retrying
  4  refused: no or unknown certificate, or a role that may not do this (UNAUTHENTICATED, PERMISSION_DENIED)
  5  not found (NOT_FOUND)
  6  conflict: already exists, a stale --if-revision, not possible in the current state (ALREADY_EXISTS,
     FAILED_PRECONDITION, ABORTED)
  7  invalid input: a bad file, or a request the cluster refuses as invalid (INVALID_ARGUMENT, OUT_OF_RANGE)";

#[derive(Parser)]
#[command(
    name = "coordinator",
    version,
    about = "Tessera's Raft-replicated coordinator and its client",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a coordinator node. Flags override the config file.
    Serve(Box<ServeArgs>),
    /// Cluster status: leader, term, commit index, members (as seen by the first endpoint that answers).
    Status(ClientArgs),
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Nodes and their GPUs.
    #[command(subcommand)]
    Node(NodeCmd),
    /// GPU health.
    #[command(subcommand)]
    Gpu(GpuCmd),
    /// Plans.
    #[command(subcommand)]
    Plan(PlanCmd),
    /// Cluster membership (Raft configuration changes).
    #[command(subcommand)]
    Member(MemberCmd),
    /// Certificates for mutual TLS.
    #[command(subcommand)]
    Certs(CertsCmd),
    /// The audit log: every admin and operator action (who, what, when, result).
    #[command(subcommand)]
    Audit(AuditCmd),
    /// Start a development cluster (3 replicas in this process, virtual workload clock by default), print its
    /// endpoints and serve until interrupted. `replay --mode cluster --coordinator ADDR` replays through it;
    /// `sim-agent run --coordinator ADDR` adds simulated GPU nodes.
    DevCluster(Box<tessera_coordinator::dev_cluster::DevClusterArgs>),
}

#[derive(Args)]
struct ServeArgs {
    /// TOML configuration (see configs/coordinator.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// This node's Raft id.
    #[arg(long)]
    id: Option<u64>,
    /// gRPC listen address (IP:PORT).
    #[arg(long)]
    listen: Option<String>,
    /// Address peers, agents and clients use (default: --listen).
    #[arg(long)]
    advertise: Option<String>,
    /// The initial cluster: 1=HOST:PORT,2=HOST:PORT,3=HOST:PORT.
    #[arg(long)]
    peers: Option<String>,
    /// sled files.
    #[arg(long)]
    data_dir: Option<String>,
    /// Planner policy (tessera, migrator, paris, ekya, astraea, static; `replay policies` describes them).
    #[arg(long)]
    policy: Option<String>,
    /// Model profiles to load into the state.
    #[arg(long)]
    models_dir: Option<String>,
    /// wall | virtual.
    #[arg(long)]
    clock: Option<String>,
    /// Planning window (e.g. 60s).
    #[arg(long)]
    plan_every: Option<String>,
    /// Prometheus /metrics listen address.
    #[arg(long)]
    metrics_listen: Option<String>,
    /// OTLP/gRPC endpoint for traces (e.g. http://127.0.0.1:4317); off when absent.
    #[arg(long)]
    otlp_endpoint: Option<String>,
    /// Raft election timeout in ticks.
    #[arg(long)]
    election_ticks: Option<usize>,
    /// Applied entries between snapshots.
    #[arg(long)]
    snapshot_every: Option<u64>,
    /// Planner slot length (e.g. 10s).
    #[arg(long)]
    slot: Option<String>,
    /// Slots in the planning horizon (`--horizon-slots` is accepted too).
    #[arg(long = "horizon", alias = "horizon-slots", value_name = "SLOTS")]
    horizon_slots: Option<usize>,
    /// Share of an instance's SLO throughput plans use, in (0, 1] (default 0.8).
    #[arg(long)]
    target_utilization: Option<f64>,
    /// Relative optimality gap at which each GPU's solve stops, in [0, 1) (default 0.01).
    #[arg(long)]
    gap: Option<f64>,
    /// Incremental rounds: a GPU is solved again once a tenant's forecast leaves this share of the band its last
    /// plan was made for (or its tenants, health, instances or retraining changed, or the plan's horizon ran out);
    /// 0 solves every GPU every round (default: the planner's, as replay's --replan-band).
    #[arg(long, value_name = "SHARE")]
    replan_band: Option<f64>,
    /// Forecaster of every tenant: last, ewma or seasonal.
    #[arg(long)]
    forecaster: Option<String>,
    /// On a virtual clock, also plan inside a window when the reported slot rates leave the bands of the forecasts
    /// the last plan was made with, by 5 % of the fleet's forecast rate in all (replay's --replan-on-burst).
    #[arg(long)]
    replan_on_burst: bool,
    /// Log entries kept behind a snapshot when the log is compacted.
    #[arg(long)]
    keep_tail: Option<u64>,
    /// Snapshot only once the entries applied since the last snapshot hold this many times its bytes (0: every
    /// --snapshot-every entries, whatever the state's size).
    #[arg(long)]
    snapshot_log_ratio: Option<f64>,
    /// A node silent this long is suspect: it keeps its work and gets none new (e.g. 6s).
    #[arg(long)]
    suspect_after: Option<String>,
    /// A node silent this long is failed: its GPUs are emptied and its tenants replanned at once (e.g. 15s).
    #[arg(long)]
    fail_after: Option<String>,
    /// Turn the failure detector off (it is on by default on the wall clock).
    #[arg(long)]
    no_failure_detection: bool,
    /// The interference table to plan with: a JSON file as `sim-agent interference` prints it
    /// (`planner.interference`).
    #[arg(long, value_name = "FILE")]
    interference: Option<String>,
    /// Let tessera run a tenant's retraining on its own inference instance: exclusive (default) or priority
    /// (Tally's block-level priority; `planner.sharing`).
    #[arg(long, value_name = "MODE")]
    sharing: Option<String>,
    /// This member's certificate (`coordinator certs init` writes node-N.pem): mutual TLS on every connection.
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// The cluster's CA certificate.
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Pinned member certificates, `1=sha256:HEX,2=sha256:HEX` (`coordinator certs fingerprint` prints one): a
    /// member whose id is pinned is believed only with exactly that certificate, whatever else the CA issued.
    #[arg(long, value_name = "ID=FINGERPRINT,...")]
    member_pins: Option<String>,
    /// How long a unary call may take, its body read included: one not answered by then ends with
    /// `DEADLINE_EXCEEDED`, which drops a half-sent body (default 90s; `call_deadline` in the file).
    #[arg(long, value_name = "DURATION")]
    call_deadline: Option<String>,
    /// Serve plaintext on an address beyond loopback (local development only: anyone who reaches the port may
    /// do anything).
    #[arg(long)]
    insecure: bool,
    /// Join an existing cluster (after `member add`) instead of bootstrapping.
    #[arg(long)]
    join: bool,
    /// Accept the test-only partition RPC (only in builds with the `fault-injection` feature).
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    allow_fault_injection: bool,
}

/// How a client command prints its answer.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    /// Text for people.
    Table,
    /// JSON for scripts.
    Json,
}

#[derive(Args, Clone)]
struct ClientArgs {
    /// Coordinator endpoints, HOST:PORT,...
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7001", env = "TESSERA_ENDPOINTS")]
    endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'w', long = "output", value_enum, default_value_t = Output::Table, env = "TESSERA_OUTPUT")]
    output: Output,
    /// Same as `-w json`.
    #[arg(long)]
    json: bool,
    /// Per-call deadline.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// This client's certificate (mutual TLS; its subject's OU is the role: admin, operator or reader).
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key.
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_KEY")]
    tls_key: Option<PathBuf>,
    /// The CA that signed the coordinators' certificates.
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_CA")]
    tls_ca: Option<PathBuf>,
}

#[derive(Subcommand)]
enum TenantCmd {
    /// Create the tenants of a TOML file (configs/tenants format), or replace them with --update.
    Add {
        /// Tenants file.
        #[arg(long)]
        file: PathBuf,
        /// Replace existing tenants instead of creating.
        #[arg(long)]
        update: bool,
        /// With --update and a file of one tenant: replace it only if its revision is still N (the `revision` that
        /// `tenant get` printed), so that a concurrent or late update is not overwritten.
        #[arg(long, value_name = "N", requires = "update")]
        if_revision: Option<u64>,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// List tenants.
    List {
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Show one tenant.
    Get {
        /// Tenant id.
        id: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Pin a tenant to GPUs and/or an inference profile, or clear its pin; the next planning round moves it
    /// (make-before-break where the target GPU has room).
    Pin {
        /// Tenant id.
        id: String,
        /// A GPU it may run on (`node/index`); repeat for several. None: any GPU.
        #[arg(long = "gpu", value_name = "NODE/INDEX")]
        gpus: Vec<String>,
        /// The one profile its inference instance may have (1g, 1g.2x, 2g, 3g, 4g, 7g).
        #[arg(long)]
        profile: Option<String>,
        /// Remove the pin: the planner decides again.
        #[arg(long, conflicts_with_all = ["gpus", "profile"])]
        clear: bool,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Delete tenants.
    Rm {
        /// Tenant ids.
        #[arg(required = true)]
        ids: Vec<String>,
        /// With one id: delete only if the tenant's revision is still N.
        #[arg(long, value_name = "N")]
        if_revision: Option<u64>,
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
enum AuditCmd {
    /// List the recorded actions, oldest first.
    List {
        /// Read this member's own copy (may lag the leader) instead of a linearizable read.
        #[arg(long)]
        stale: bool,
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
enum CertsCmd {
    /// Write a development PKI: DIR/ca.pem (and ca.key), and NAME.pem and NAME.key for node-1..node-N
    /// (coordinators), the agents, and the clients admin, operator and reader.
    Init {
        /// Directory to write to.
        #[arg(long)]
        out: PathBuf,
        /// Coordinator members (node-1..node-N).
        #[arg(long, default_value_t = 3)]
        nodes: u32,
        /// Agents agent-1..agent-N (an agent's certificate names the node id it may speak for).
        #[arg(long, default_value_t = 0)]
        agents: u32,
        /// Further agent names (node ids), e.g. --agent node-a-0.
        #[arg(long = "agent", value_name = "NODE_ID")]
        agent_names: Vec<String>,
        /// Further host names the coordinators and agents are reached at (each certificate also names itself,
        /// localhost and 127.0.0.1).
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        /// How long each certificate lasts (short, so that a stolen key stops working by itself; rotate with
        /// `certs issue`). The CA lasts 1,095 days.
        #[arg(long, default_value_t = tessera_auth::CERT_LIFETIME_DAYS)]
        days: u32,
    },
    /// Issue a new key and certificate for one identity with the CA that `certs init` wrote to DIR: to rotate a
    /// certificate (servers reload theirs on SIGHUP or when the files change) or to add an agent or client.
    Issue {
        /// The PKI directory (holds ca.pem and ca.key); NAME.pem and NAME.key are written there.
        #[arg(long)]
        dir: PathBuf,
        /// The identity: node-N for coordinator member N, a node id for an agent, any name for a client.
        #[arg(long)]
        name: String,
        /// coordinator, agent, admin, operator or reader.
        #[arg(long)]
        role: String,
        /// Further host names a coordinator or agent is reached at.
        #[arg(long = "host", value_name = "NAME")]
        hosts: Vec<String>,
        /// How long the certificate lasts.
        #[arg(long, default_value_t = tessera_auth::CERT_LIFETIME_DAYS)]
        days: u32,
    },
    /// Print a certificate's fingerprint (`sha256:HEX`), as `member_pins` takes it.
    Fingerprint {
        /// The certificate (PEM).
        #[arg(long, value_name = "FILE")]
        cert: PathBuf,
    },
    /// Revoke a certificate on a running cluster (admin): every member refuses its calls, Raft included, from then
    /// on. Give the certificate's PEM file, or its serial number (hex, as `openssl x509 -serial` prints it).
    Revoke {
        /// The certificate to revoke.
        #[arg(long, value_name = "FILE", required_unless_present = "serial", conflicts_with = "serial")]
        cert: Option<PathBuf>,
        /// Its serial number instead.
        #[arg(long, value_name = "HEX")]
        serial: Option<String>,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// The certificates revoked on a running cluster.
    Revoked {
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
enum NodeCmd {
    /// List nodes and GPUs.
    List {
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
enum GpuCmd {
    /// Drain a GPU (NODE/INDEX): it keeps its work and gets none new.
    Drain {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Mark a drained GPU healthy again.
    Undrain {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
enum PlanCmd {
    /// The committed plan.
    Show {
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Why a GPU has its layout.
    Explain {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// A GPU's committed targets, newest first.
    History {
        /// GPU id.
        gpu: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Run a planning round now.
    Trigger {
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Print the last round's PlannerInput as JSON (re-plan it with `replay plan --input FILE`).
    DumpInput {
        #[command(flatten)]
        c: ClientArgs,
    },
}

#[derive(Subcommand)]
enum MemberCmd {
    /// Add a voting member; then start it with `serve --join`.
    Add {
        /// Its Raft id.
        id: u64,
        /// Its address, HOST:PORT.
        address: String,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// Remove a member.
    Rm {
        /// Its Raft id.
        id: u64,
        #[command(flatten)]
        c: ClientArgs,
    },
    /// List members.
    List {
        #[command(flatten)]
        c: ClientArgs,
    },
}

impl ClientArgs {
    /// Whether the answer is printed as JSON (`-w json` or `--json`).
    fn json(&self) -> bool {
        self.json || self.output == Output::Json
    }
}

/// A failed command with its exit status (see [`EXIT_CODES`]) and one-line message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Flags that do not go together: exit status 2.
    fn usage(message: impl Into<String>) -> anyhow::Error {
        Failure { code: 2, message: message.into() }.into()
    }

    /// A bad input file or value: exit status 7.
    fn input(message: impl Into<String>) -> anyhow::Error {
        Failure { code: 7, message: message.into() }.into()
    }

    /// The cluster's answer about `object` (left out where the message already starts with it).
    fn status(object: &str, s: &tonic::Status) -> anyhow::Error {
        let message = if s.message().starts_with(object) {
            format!("{} ({})", s.message().trim(), status_kind(s.code()))
        } else {
            format!("{object}: {}", status_text(s))
        };
        Failure { code: exit_status(s.code()), message }.into()
    }
}

/// The exit status for a gRPC status code (see [`EXIT_CODES`]).
fn exit_status(code: tonic::Code) -> u8 {
    use tonic::Code;
    match code {
        Code::Ok => 0,
        Code::Unavailable | Code::DeadlineExceeded | Code::ResourceExhausted | Code::Cancelled => 3,
        Code::Unauthenticated | Code::PermissionDenied => 4,
        Code::NotFound => 5,
        Code::AlreadyExists | Code::FailedPrecondition | Code::Aborted => 6,
        Code::InvalidArgument | Code::OutOfRange => 7,
        Code::Unknown | Code::Internal | Code::Unimplemented | Code::DataLoss => 1,
    }
}

/// A cluster's answer on one line: `permission denied: role reader may not ...`, not tonic's `code: '...'` dump.
fn status_text(s: &tonic::Status) -> String {
    let what = status_kind(s.code());
    let message = s.message().trim();
    if message.is_empty() { what.to_string() } else { format!("{what}: {message}") }
}

/// A gRPC status code in a few words.
fn status_kind(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "ok",
        Code::Cancelled => "cancelled",
        Code::Unknown => "failed",
        Code::InvalidArgument => "invalid",
        Code::DeadlineExceeded => "no answer in time",
        Code::NotFound => "not found",
        Code::AlreadyExists => "already exists",
        Code::PermissionDenied => "permission denied",
        Code::ResourceExhausted => "too busy",
        Code::FailedPrecondition => "conflict",
        Code::Aborted => "conflict",
        Code::OutOfRange => "out of range",
        Code::Unimplemented => "not supported by this coordinator",
        Code::Internal => "internal error",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data loss",
        Code::Unauthenticated => "not authenticated",
    }
}

/// A failed command's exit status and one-line message.
fn report(e: &anyhow::Error) -> (u8, String) {
    if let Some(f) = e.downcast_ref::<Failure>() {
        return (f.code, f.message.clone());
    }
    let mut parts = Vec::new();
    for cause in e.chain() {
        if let Some(s) = cause.downcast_ref::<tonic::Status>() {
            parts.push(status_text(s));
            return (exit_status(s.code()), parts.join(": "));
        }
        parts.push(cause.to_string());
    }
    (1, format!("{e:#}"))
}

fn client(c: &ClientArgs) -> anyhow::Result<Client> {
    let tls = tessera_auth::TlsFiles::from_flags(c.tls_cert.clone(), c.tls_key.clone(), c.tls_ca.clone())
        .map_err(Failure::usage)?;
    Ok(Client::new(&c.endpoints, c.timeout).with_tls(tls))
}

/// Prints a client command's answer (a closed pipe ends the output quietly: `coordinator node list | head`).
fn print(json_mode: bool, value: serde_json::Value, text: String) {
    let text = if json_mode { serde_json::to_string_pretty(&value).expect("json") } else { text };
    out(&text);
}

/// Writes a line to stdout; a reader that went away (a closed pipe) is not an error: the output ends quietly.
fn out(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => eprintln!("error: cannot write to stdout: {e}"),
        _ => {}
    }
}

fn tenant_json(t: &v1::TenantResponse) -> serde_json::Value {
    let spec = t.spec.clone().and_then(|s| tessera_core::tenant::TenantSpec::try_from(s).ok());
    json!({ "spec": spec, "retiring": t.retiring, "revision": t.revision })
}

/// What the planner makes of a GPU: a GPU on a failed node is failed, and a healthy one on a suspect node keeps its
/// work and gets none new, as a draining one does. The GPU's own health is `gpu_health` in `node list --json`.
fn effective_gpu_health(node: &str, gpu: &str) -> String {
    match (node, gpu) {
        ("failed", _) => "failed (node)".into(),
        ("suspect", "healthy") => "suspect (node)".into(),
        _ => gpu.into(),
    }
}

fn members_json(m: &[v1::Member]) -> serde_json::Value {
    m.iter().map(|m| json!({ "id": m.id, "address": m.address })).collect()
}

async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Serve(a) => {
            let over = Overrides {
                id: a.id,
                listen: a.listen,
                advertise: a.advertise,
                peers: a.peers,
                data_dir: a.data_dir,
                policy: a.policy,
                models_dir: a.models_dir,
                clock: a.clock,
                plan_every: a.plan_every,
                metrics_listen: a.metrics_listen,
                otlp_endpoint: a.otlp_endpoint,
                election_ticks: a.election_ticks,
                snapshot_every: a.snapshot_every,
                snapshot_log_ratio: a.snapshot_log_ratio,
                keep_tail: a.keep_tail,
                forecaster: a.forecaster,
                slot: a.slot,
                horizon_slots: a.horizon_slots,
                target_utilization: a.target_utilization,
                gap: a.gap,
                replan_band: a.replan_band,
                replan_on_burst: a.replan_on_burst,
                suspect_after: a.suspect_after,
                fail_after: a.fail_after,
                no_failure_detection: a.no_failure_detection,
                interference: a.interference,
                sharing: a.sharing,
                tls: tessera_auth::TlsFiles::from_flags(a.tls_cert, a.tls_key, a.tls_ca)
                    .map_err(|e| anyhow::anyhow!(e))?,
                member_pins: a.member_pins,
                call_deadline: a.call_deadline,
                insecure: a.insecure,
                join: a.join,
                #[cfg(feature = "fault-injection")]
                allow_fault_injection: a.allow_fault_injection,
                #[cfg(not(feature = "fault-injection"))]
                allow_fault_injection: false,
            };
            let config = CoordinatorConfig::load(a.config.as_deref(), &over).map_err(|e| anyhow::anyhow!("{e}"))?;
            let telemetry = tessera_coordinator::telemetry::init(
                config.otlp_endpoint.as_deref(),
                &tessera_coordinator::telemetry::Service::new("tessera-coordinator", config.raft.id),
                tessera_coordinator::telemetry::LevelFilter::INFO,
            )?;
            let result = tessera_coordinator::server::serve(config).await;
            if let Some(t) = telemetry {
                t.shutdown();
            }
            result
        }
        Cmd::Status(c) => {
            let s =
                client(&c)?.call(|mut x| async move { x.cluster_status(v1::ClusterStatusRequest {}).await }).await?;
            let members: Vec<String> = s.members.iter().map(|m| format!("{}={}", m.id, m.address)).collect();
            print(
                c.json(),
                json!({
                    "id": s.id, "role": s.role, "leader_id": s.leader_id, "leader_address": s.leader_address,
                    "term": s.term, "commit_index": s.commit_index, "applied_index": s.applied_index,
                    "members": members_json(&s.members), "workload_time_ms": s.workload_time_ms, "plan_epoch": s.plan_epoch,
                }),
                format!(
                    "node {} ({})\nleader: {} at {}\nterm {}  commit {}  applied {}\nmembers: {}\nplan epoch {}  workload time {} ms",
                    s.id,
                    s.role,
                    s.leader_id,
                    s.leader_address,
                    s.term,
                    s.commit_index,
                    s.applied_index,
                    members.join(", "),
                    s.plan_epoch,
                    s.workload_time_ms
                ),
            );
            Ok(())
        }
        Cmd::Tenant(TenantCmd::Add { file, update, if_revision, c }) => {
            let specs = tessera_core::config::load_tenants(&file).map_err(|e| Failure::input(e.to_string()))?;
            if if_revision.is_some() && specs.len() != 1 {
                return Err(Failure::usage(format!(
                    "--if-revision needs a file of exactly one tenant; {} has {}",
                    file.display(),
                    specs.len()
                )));
            }
            let cl = client(&c)?;
            let mut out = Vec::new();
            for spec in &specs {
                let req = v1::TenantRequest { spec: Some(spec.into()), if_revision: if_revision.unwrap_or(0) };
                // One id per write, reused by every retry: the cluster applies it once.
                let id = Client::new_request_id();
                let r = if update {
                    cl.call(|mut x| {
                        let req = Client::request(req.clone(), &id);
                        async move { x.update_tenant(req).await }
                    })
                    .await
                } else {
                    cl.call(|mut x| {
                        let req = Client::request(req.clone(), &id);
                        async move { x.create_tenant(req).await }
                    })
                    .await
                }
                .map_err(|s| Failure::status(&format!("tenant {}", spec.id), &s))?;
                out.push((spec.id.to_string(), r.index));
            }
            print(
                c.json(),
                json!(out.iter().map(|(id, i)| json!({"id": id, "index": i})).collect::<Vec<_>>()),
                out.iter()
                    .map(|(id, i)| format!("{} tenant {id} (index {i})", if update { "updated" } else { "created" }))
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
            Ok(())
        }
        Cmd::Tenant(TenantCmd::List { c }) => {
            let r =
                client(&c)?.call(|mut x| async move { x.list_tenants(v1::ListRequest { stale: false }).await }).await?;
            let lines: Vec<String> = r
                .tenants
                .iter()
                .filter_map(|t| {
                    let s = t.spec.as_ref()?;
                    let pin = s.pin.clone().and_then(|p| tessera_core::tenant::TenantPin::try_from(p).ok());
                    Some(format!(
                        "{:<20} {:<14} slo {:>6.1} ms{}{}",
                        s.id,
                        s.model,
                        s.slo_ms,
                        pin.map(|p| format!("  pinned to {p}")).unwrap_or_default(),
                        if t.retiring { "  (retiring)" } else { "" }
                    ))
                })
                .collect();
            print(
                c.json(),
                r.tenants.iter().map(tenant_json).collect(),
                if lines.is_empty() { "(no tenants)".into() } else { lines.join("\n") },
            );
            Ok(())
        }
        Cmd::Tenant(TenantCmd::Get { id, c }) => {
            let r = client(&c)?
                .call(|mut x| {
                    let id = id.clone();
                    async move { x.get_tenant(v1::TenantIdRequest { id, ..Default::default() }).await }
                })
                .await?;
            let j = tenant_json(&r);
            print(c.json(), j.clone(), serde_json::to_string_pretty(&j)?);
            Ok(())
        }
        Cmd::Tenant(TenantCmd::Pin { id, gpus, profile, clear, c }) => {
            if !clear && gpus.is_empty() && profile.is_none() {
                return Err(Failure::usage("give --gpu, --profile or --clear"));
            }
            let pin = v1::TenantPin { gpus, profile: profile.unwrap_or_default() };
            // Checked here for a clear message; the cluster checks again.
            let parsed = tessera_core::tenant::TenantPin::try_from(pin.clone())
                .map_err(|e| Failure::usage(format!("pin.{}: {}", e.field, e.message)))?;
            let cl = client(&c)?;
            let current = cl
                .call(|mut x| {
                    let id = id.clone();
                    async move { x.get_tenant(v1::TenantIdRequest { id, ..Default::default() }).await }
                })
                .await
                .map_err(|s| Failure::status(&format!("tenant {id}"), &s))?;
            let mut spec = current.spec.ok_or_else(|| anyhow::anyhow!("tenant {id}: the answer has no spec"))?;
            spec.pin = (!clear).then_some(pin);
            // Only over the revision read: a concurrent update is not overwritten.
            let req = v1::TenantRequest { spec: Some(spec), if_revision: current.revision };
            let request = Client::new_request_id();
            let r = cl
                .call(|mut x| {
                    let req = Client::request(req.clone(), &request);
                    async move { x.update_tenant(req).await }
                })
                .await
                .map_err(|s| Failure::status(&format!("tenant {id}"), &s))?;
            let shown = if clear { "-".to_string() } else { parsed.to_string() };
            print(
                c.json(),
                json!({"id": id, "pin": if clear { None } else { Some(&parsed) }, "index": r.index}),
                format!("tenant {id} pinned to {shown} (index {})", r.index),
            );
            Ok(())
        }
        Cmd::Tenant(TenantCmd::Rm { ids, if_revision, c }) => {
            if if_revision.is_some() && ids.len() != 1 {
                return Err(Failure::usage(format!("--if-revision needs exactly one tenant id, got {}", ids.len())));
            }
            let cl = client(&c)?;
            let mut out = Vec::new();
            for id in ids {
                let request = Client::new_request_id();
                let r = cl
                    .call(|mut x| {
                        let msg = v1::TenantIdRequest { id: id.clone(), if_revision: if_revision.unwrap_or(0) };
                        let req = Client::request(msg, &request);
                        async move { x.delete_tenant(req).await }
                    })
                    .await
                    .map_err(|s| Failure::status(&format!("tenant {id}"), &s))?;
                out.push((id, r.retiring));
            }
            print(
                c.json(),
                json!(out.iter().map(|(id, r)| json!({"id": id, "retiring": r})).collect::<Vec<_>>()),
                out.iter()
                    .map(|(id, r)| {
                        if *r {
                            format!("tenant {id} retiring (removed by the next plan)")
                        } else {
                            format!("tenant {id} deleted")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join("\n"),
            );
            Ok(())
        }
        Cmd::Node(NodeCmd::List { c }) => {
            let r =
                client(&c)?.call(|mut x| async move { x.list_nodes(v1::ListRequest { stale: false }).await }).await?;
            let mut lines = Vec::new();
            let mut js = Vec::new();
            for n in &r.nodes {
                let why = if n.health_reason.is_empty() { String::new() } else { format!(" ({})", n.health_reason) };
                lines.push(format!("{} at {}  {}{why}", n.id, n.address, n.health));
                let mut gj = Vec::new();
                for g in &n.gpus {
                    let health = effective_gpu_health(&n.health, &g.health);
                    lines.push(format!(
                        "  {} {} {}  applied [{}] epoch {}  target [{}] epoch {}",
                        g.id,
                        g.model,
                        health,
                        layout_text(&g.applied),
                        g.applied_epoch,
                        layout_text(&g.target.as_ref().and_then(|t| t.layout.clone())),
                        g.target_epoch
                    ));
                    gj.push(json!({
                        "id": g.id, "model": g.model, "health": health, "gpu_health": g.health, "applied": layout_text(&g.applied),
                        "applied_epoch": g.applied_epoch, "applied_assignments": assignments_text(&g.applied_assignments),
                        "target": layout_text(&g.target.as_ref().and_then(|t| t.layout.clone())), "target_epoch": g.target_epoch,
                    }));
                }
                js.push(json!({
                    "id": n.id, "address": n.address, "health": n.health, "health_reason": n.health_reason,
                    "health_since_ms": n.health_since_ms, "gpus": gj,
                }));
            }
            print(c.json(), json!(js), if lines.is_empty() { "(no nodes)".into() } else { lines.join("\n") });
            Ok(())
        }
        Cmd::Gpu(cmd) => {
            let (gpu, drain, c) = match cmd {
                GpuCmd::Drain { gpu, c } => (gpu, true, c),
                GpuCmd::Undrain { gpu, c } => (gpu, false, c),
            };
            // Resent after a lost answer, applied once: a late resend cannot undo another operator's newer call.
            let request = Client::new_request_id();
            let r = client(&c)?
                .call(|mut x| {
                    let req = Client::request(v1::DrainGpuRequest { gpu: gpu.clone(), drain }, &request);
                    async move { x.drain_gpu(req).await }
                })
                .await?;
            print(
                c.json(),
                json!({"gpu": gpu, "draining": drain, "index": r.index}),
                format!("{gpu} {}", if drain { "draining" } else { "healthy" }),
            );
            Ok(())
        }
        Cmd::Plan(PlanCmd::Show { c }) => {
            let r = client(&c)?.call(|mut x| async move { x.get_plan(v1::ListRequest { stale: false }).await }).await?;
            let mut lines = vec![format!(
                "epoch {}  policy {}  made at {} ms  expected goodput {:.1}",
                r.epoch, r.policy, r.made_at_ms, r.expected_goodput
            )];
            let mut gj = Vec::new();
            for g in &r.gpus {
                let p = g.plan.clone().unwrap_or_default();
                lines.push(format!("  {}: [{}]  {}", g.gpu, layout_text(&p.layout), assignments_text(&p.assignments)));
                gj.push(json!({"gpu": g.gpu, "layout": layout_text(&p.layout), "assignments": assignments_text(&p.assignments), "expected_goodput": p.expected_goodput, "explanation": p.explanation}));
            }
            print(
                c.json(),
                json!({"epoch": r.epoch, "policy": r.policy, "made_at_ms": r.made_at_ms, "expected_goodput": r.expected_goodput, "gpus": gj}),
                lines.join("\n"),
            );
            Ok(())
        }
        Cmd::Plan(PlanCmd::Explain { gpu, c }) => {
            let r = client(&c)?
                .call(|mut x| {
                    let gpu = gpu.clone();
                    async move { x.explain(v1::GpuRequest { gpu, stale: false }).await }
                })
                .await?;
            let p = r.plan.clone().unwrap_or_default();
            let forecasts: Vec<String> = r.forecasts.iter().map(|(k, v)| format!("{k}={v:.1} rps")).collect();
            print(
                c.json(),
                json!({"gpu": r.gpu, "epoch": r.epoch, "policy": r.policy, "explanation": r.explanation, "layout": layout_text(&p.layout),
                       "assignments": assignments_text(&p.assignments), "status": r.status, "objective": r.objective, "bound": r.bound,
                       "tenants": r.tenants, "forecasts": r.forecasts}),
                format!(
                    "{} at epoch {} ({})\nlayout [{}]  {}\n{}\nsolver: {} objective {:.2} bound {:.2}, {} tenants; forecasts {}",
                    r.gpu,
                    r.epoch,
                    r.policy,
                    layout_text(&p.layout),
                    assignments_text(&p.assignments),
                    r.explanation,
                    if r.status.is_empty() { "(not solved on this leader)" } else { &r.status },
                    r.objective,
                    r.bound,
                    r.tenants,
                    forecasts.join(", ")
                ),
            );
            Ok(())
        }
        Cmd::Plan(PlanCmd::History { gpu, c }) => {
            let r = client(&c)?
                .call(|mut x| {
                    let gpu = gpu.clone();
                    async move { x.plan_history(v1::GpuRequest { gpu, stale: false }).await }
                })
                .await?;
            let lines: Vec<String> = r
                .entries
                .iter()
                .map(|e| {
                    let p = e.plan.clone().unwrap_or_default();
                    format!(
                        "epoch {:>5}  {:>10} ms  {:<8} [{}]  {}",
                        e.epoch,
                        e.made_at_ms,
                        e.policy,
                        layout_text(&p.layout),
                        assignments_text(&p.assignments)
                    )
                })
                .collect();
            let js: Vec<_> = r
                .entries
                .iter()
                .map(|e| {
                    let p = e.plan.clone().unwrap_or_default();
                    json!({"epoch": e.epoch, "made_at_ms": e.made_at_ms, "policy": e.policy, "layout": layout_text(&p.layout), "assignments": assignments_text(&p.assignments)})
                })
                .collect();
            print(
                c.json(),
                json!(js),
                if lines.is_empty() { "(no committed target)".into() } else { lines.join("\n") },
            );
            Ok(())
        }
        Cmd::Plan(PlanCmd::Trigger { c }) => {
            let r = client(&c)?
                .call_with(Retry::Once, |mut x| async move { x.trigger_plan(v1::TriggerPlanRequest {}).await })
                .await?;
            print(
                c.json(),
                json!({"outcome": r.outcome, "epoch": r.epoch, "objective": r.objective, "bound": r.bound, "gap": r.gap,
                       "solve_ms": r.solve_ms, "reason": r.reason, "pushed": r.pushed, "push_failures": r.push_failures}),
                format!(
                    "{} epoch {}: objective {:.2} bound {:.2} gap {:.4} in {:.0} ms; pushed {} ({} failed){}",
                    r.outcome,
                    r.epoch,
                    r.objective,
                    r.bound,
                    r.gap,
                    r.solve_ms,
                    r.pushed,
                    r.push_failures,
                    if r.reason.is_empty() { String::new() } else { format!("\n{}", r.reason) }
                ),
            );
            Ok(())
        }
        Cmd::Plan(PlanCmd::DumpInput { c }) => {
            let r = client(&c)?
                .call(|mut x| async move { x.dump_planner_input(v1::ListRequest { stale: false }).await })
                .await?;
            out(&r.json);
            Ok(())
        }
        Cmd::Audit(AuditCmd::List { stale, c }) => {
            let r = client(&c)?.call(|mut x| async move { x.list_audit(v1::ListRequest { stale }).await }).await?;
            let lines: Vec<String> = r
                .entries
                .iter()
                .map(|e| format!("{:>8}  {}  {:<20} {}  -> {}", e.index, e.at_ms, e.who, e.action, e.result))
                .collect();
            let js: Vec<_> = r
                .entries
                .iter()
                .map(|e| json!({"index": e.index, "at_ms": e.at_ms, "who": e.who, "action": e.action, "result": e.result}))
                .collect();
            print(c.json(), json!(js), if lines.is_empty() { "(no audited actions)".into() } else { lines.join("\n") });
            Ok(())
        }
        Cmd::Certs(CertsCmd::Init { out: dir, nodes, agents, agent_names, hosts, days }) => {
            let mut names: Vec<String> = (1..=agents).map(|i| format!("agent-{i}")).collect();
            names.extend(agent_names);
            let pki = tessera_auth::init_pki(&dir, nodes, &names, &hosts, days).map_err(|e| anyhow::anyhow!("{e}"))?;
            let mut lines = vec![format!("CA: {}", pki.ca.display())];
            lines.extend(pki.identities.iter().map(|(n, c, k)| format!("{n}: {} {}", c.display(), k.display())));
            out(&lines.join("\n"));
            Ok(())
        }
        Cmd::Certs(CertsCmd::Issue { dir, name, role, hosts, days }) => {
            let role = tessera_auth::Role::parse(&role).ok_or_else(|| {
                Failure::usage(format!("--role `{role}`: one of coordinator, agent, admin, operator, reader"))
            })?;
            if role == tessera_auth::Role::Coordinator
                && name.strip_prefix("node-").and_then(|i| i.parse::<u64>().ok()).is_none_or(|i| i == 0)
            {
                return Err(Failure::usage(format!("--name `{name}`: a coordinator is node-N, N its member id")));
            }
            let (cert, key) =
                tessera_auth::issue(&dir, &name, role, &hosts, days).map_err(|e| anyhow::anyhow!("{e}"))?;
            out(&format!("{name}: {} {}", cert.display(), key.display()));
            Ok(())
        }
        Cmd::Certs(CertsCmd::Fingerprint { cert }) => {
            let who = tessera_auth::Identity::from_pem_file(&cert).map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("{}", who.fingerprint);
            Ok(())
        }
        Cmd::Certs(CertsCmd::Revoke { cert, serial, c }) => {
            let (serial, name, role) = match (cert, serial) {
                (Some(path), _) => {
                    let who =
                        tessera_auth::Identity::from_pem_file(&path).map_err(|e| Failure::usage(e.to_string()))?;
                    (who.serial, who.name, who.role.name().to_string())
                }
                (None, Some(serial)) => (serial, String::new(), String::new()),
                (None, None) => return Err(Failure::usage("--cert or --serial is required")),
            };
            let request = v1::RevokeCertificateRequest { serial: serial.clone(), name: name.clone(), role };
            let r = client(&c)?
                .call_with(Retry::Once, |mut x| {
                    let request = request.clone();
                    async move { x.revoke_certificate(request).await }
                })
                .await?;
            print(
                c.json(),
                json!({"serial": serial, "name": name, "index": r.index}),
                format!("revoked {serial} {name} at index {}", r.index),
            );
            Ok(())
        }
        Cmd::Certs(CertsCmd::Revoked { c }) => {
            let r =
                client(&c)?.call(|mut x| async move { x.list_revoked(v1::ListRequest { stale: false }).await }).await?;
            let lines: Vec<String> =
                r.certificates.iter().map(|c| format!("{:>8}  {}  {} {}", c.index, c.serial, c.role, c.name)).collect();
            let js: Vec<_> = r
                .certificates
                .iter()
                .map(|c| json!({"serial": c.serial, "name": c.name, "role": c.role, "index": c.index}))
                .collect();
            print(c.json(), json!(js), if lines.is_empty() { "(none revoked)".into() } else { lines.join("\n") });
            Ok(())
        }
        Cmd::DevCluster(a) => {
            let c = tessera_coordinator::dev_cluster::start(&a).await?;
            for (i, e) in c.endpoints.iter().enumerate() {
                println!("coordinator id={} addr={e}", i + 1);
            }
            println!(
                "ready: replay --mode cluster --coordinator {} --plan-every {}{} (Ctrl-C stops the cluster)",
                c.endpoints.join(","),
                a.plan_every,
                if a.replan_on_burst { " --replan-on-burst" } else { "" }
            );
            tokio::signal::ctrl_c().await?;
            c.stop().await;
            Ok(())
        }
        Cmd::Member(cmd) => {
            let (r, c) = match cmd {
                MemberCmd::Add { id, address, c } => (
                    client(&c)?
                        .call_with(Retry::Once, |mut x| {
                            let address = address.clone();
                            async move { x.add_member(v1::AddMemberRequest { id, address }).await }
                        })
                        .await?
                        .members,
                    c,
                ),
                MemberCmd::Rm { id, c } => (
                    client(&c)?
                        .call_with(
                            Retry::Once,
                            |mut x| async move { x.remove_member(v1::RemoveMemberRequest { id }).await },
                        )
                        .await?
                        .members,
                    c,
                ),
                MemberCmd::List { c } => (
                    client(&c)?
                        .call(|mut x| async move { x.cluster_status(v1::ClusterStatusRequest {}).await })
                        .await?
                        .members,
                    c,
                ),
            };
            print(
                c.json(),
                members_json(&r),
                r.iter().map(|m| format!("{} {}", m.id, m.address)).collect::<Vec<_>>().join("\n"),
            );
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let (code, message) = report(&e);
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}
