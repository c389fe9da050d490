//! `coordinator serve`: the flags, over the config file, and the node they start.

use std::path::PathBuf;

use clap::Args;
use tessera_coordinator::config::{CoordinatorConfig, Overrides};
use tessera_planner::settings::RoundArgs;

#[derive(Args)]
pub(crate) struct ServeArgs {
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
    /// The interference table to plan with: a JSON file as `sim-agent interference` prints it (`interference`).
    #[arg(long, value_name = "FILE")]
    interference: Option<String>,
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
    /// The planning settings (`[planner]`): each flag overrides its key.
    #[command(flatten)]
    round: RoundArgs,
    /// Accept the test-only partition RPC (only in builds with the `fault-injection` feature).
    #[cfg(feature = "fault-injection")]
    #[arg(long, hide = true)]
    allow_fault_injection: bool,
}

/// How a client command prints its answer.
/// Runs a coordinator node until SIGINT or SIGTERM.
pub(crate) async fn run(a: ServeArgs) -> anyhow::Result<()> {
    let over = Overrides {
        id: a.id,
        listen: a.listen,
        advertise: a.advertise,
        peers: a.peers,
        data_dir: a.data_dir,
        policy: a.policy,
        round: a.round,
        models_dir: a.models_dir,
        clock: a.clock,
        metrics_listen: a.metrics_listen,
        otlp_endpoint: a.otlp_endpoint,
        election_ticks: a.election_ticks,
        snapshot_every: a.snapshot_every,
        snapshot_log_ratio: a.snapshot_log_ratio,
        keep_tail: a.keep_tail,
        suspect_after: a.suspect_after,
        fail_after: a.fail_after,
        no_failure_detection: a.no_failure_detection,
        interference: a.interference,
        tls: tessera_auth::TlsFiles::from_flags(a.tls_cert, a.tls_key, a.tls_ca).map_err(|e| anyhow::anyhow!(e))?,
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
