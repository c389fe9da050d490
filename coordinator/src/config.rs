//! `coordinator serve --config FILE`: the coordinator's TOML configuration, parsed raw (unknown fields refused)
//! and validated into [`CoordinatorConfig`]. Flags override the file, as etcd's do ([`Overrides`]). Durations are
//! strings (`"100ms"`, `"60s"`); relative paths are relative to the config file; every error names the file (or
//! flag) and the field.
//!
//! ```toml
//! id = 1                                   # required: this node's Raft id (> 0)
//! listen = "127.0.0.1:7001"                # required: gRPC (API, agents, Raft peers)
//! advertise = "127.0.0.1:7001"             # optional: the address peers and clients use (default: listen)
//! peers = "1=127.0.0.1:7001,2=127.0.0.1:7002,3=127.0.0.1:7003"   # the initial cluster, this node included
//! data_dir = "../data/coordinator-1"       # required: sled files (Raft log, snapshots)
//! policy = "tessera"                       # optional: a planner policy name
//! models_dir = "models"                    # optional: model profiles loaded into the state by the leader
//! interference = "interference.json"      # optional: co-location slowdowns every round plans with
//! clock = "wall"                           # wall | virtual (workload time advanced by replay through AdvanceClock)
//! metrics_listen = "127.0.0.1:9101"        # optional: Prometheus /metrics over HTTP
//! otlp_endpoint = "http://127.0.0.1:4317"  # optional: OTLP/gRPC traces (off when absent)
//! call_deadline = "90s"                    # optional: a unary call, its body read included, is answered within it
//!
//! [raft]                                   # optional
//! tick = "100ms"
//! election_ticks = 10
//! heartbeat_ticks = 2
//! snapshot_every = 10000
//! snapshot_log_ratio = 1.0                 # and only once the entries since hold this x the last snapshot's bytes
//! keep_tail = 1000
//! request_timeout = "5s"
//!
//! [planner]                                # optional: tessera_planner::settings::RoundSettings, whose keys
//! plan_every = "60s"                       # are the flags' names (--plan-every, --slot, --horizon...); every
//! slot = "10s"                             # key and its default: `replay --help`, "Planning"
//! horizon_slots = 12
//!
//! insecure = false                         # plaintext beyond loopback needs this (or --insecure)
//!
//! member_pins = "1=sha256:ab12...,2=sha256:cd34..."   # optional: the one certificate each listed member may use
//!                                          # (`coordinator certs fingerprint --cert node-1.pem` prints one)
//!
//! [tls]                                    # optional: mutual TLS on every connection (coordinator certs init)
//! cert = "certs/node-1.pem"
//! key = "certs/node-1.key"
//! ca = "certs/ca.pem"
//!
//! [failure_detection]                      # optional; the leader judges nodes by their heartbeats and pushes
//! enabled = true                           # default: true on the wall clock, false on a virtual one
//! suspect_after = "6s"                     # no heartbeat this long: suspect (keeps its work, gets no new work)
//! fail_after = "15s"                       # no heartbeat this long: failed (its tenants are replanned at once)
//! suspect_push_failures = 3                # this many pushes in a row failed: suspect
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tessera_core::config::{ConfigError, FieldError, from_toml, parse_duration_ms, read_config};
use tessera_planner::settings::{RoundArgs, RoundSettings};

use crate::replica::RaftSettings;

pub use crate::planning::ClockMode;

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// Raft settings (id included).
    pub raft: RaftSettings,
    /// Where the gRPC server listens.
    pub listen: SocketAddr,
    /// The address peers, agents and clients use.
    pub advertise: String,
    /// The initial cluster.
    pub peers: BTreeMap<u64, String>,
    /// Start empty and wait to be added as a member (no bootstrap).
    pub join: bool,
    /// sled files.
    pub data_dir: PathBuf,
    /// Planner policy.
    pub policy: String,
    /// How rounds plan (`[planner]`).
    pub round: RoundSettings,
    /// Model profiles to load.
    pub models_dir: Option<PathBuf>,
    /// Workload clock.
    pub clock: ClockMode,
    /// Prometheus endpoint.
    pub metrics_listen: Option<SocketAddr>,
    /// OTLP endpoint.
    pub otlp_endpoint: Option<String>,
    /// Accept the test-only partition RPC.
    pub allow_fault_injection: bool,
    /// The leader's failure detector (`None`: off).
    pub failure_detection: Option<crate::planning::FailureDetection>,
    /// The interference table every round is planned with (`interference`, a JSON file as `sim-agent
    /// interference` prints it; `None`: plan as if co-located tenants did not slow each other down).
    pub interference: Option<tessera_planner::input::Interference>,
    /// Mutual TLS (`None`: plaintext, every caller may do everything).
    pub tls: Option<tessera_auth::TlsFiles>,
    /// Pinned member certificates: a member id listed here is believed only with the certificate of this
    /// fingerprint ([`tessera_auth::fingerprint_of`]); members not listed, with any the CA issued to their name.
    pub member_pins: BTreeMap<u64, String>,
    /// How long a unary call may take, its body read included ([`crate::limits::UNARY_DEADLINE`] by default).
    pub call_deadline: Duration,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    id: Option<u64>,
    listen: Option<String>,
    advertise: Option<String>,
    peers: Option<String>,
    data_dir: Option<String>,
    policy: Option<String>,
    models_dir: Option<String>,
    interference: Option<String>,
    clock: Option<String>,
    /// Refused with a pointer to `[planner]`, where it moved.
    plan_every: Option<serde::de::IgnoredAny>,
    metrics_listen: Option<String>,
    otlp_endpoint: Option<String>,
    #[serde(default)]
    raft: RawRaft,
    #[serde(default)]
    planner: RoundSettings,
    #[serde(default)]
    failure_detection: RawFailureDetection,
    tls: Option<tessera_auth::TlsFiles>,
    member_pins: Option<String>,
    call_deadline: Option<String>,
    insecure: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawFailureDetection {
    enabled: Option<bool>,
    suspect_after: Option<String>,
    fail_after: Option<String>,
    suspect_push_failures: Option<u32>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawRaft {
    tick: Option<String>,
    election_ticks: Option<usize>,
    heartbeat_ticks: Option<usize>,
    snapshot_every: Option<u64>,
    snapshot_log_ratio: Option<f64>,
    keep_tail: Option<u64>,
    request_timeout: Option<String>,
}

/// Command-line values that override the file (each `None` keeps the file's value).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `--id`.
    pub id: Option<u64>,
    /// `--listen`.
    pub listen: Option<String>,
    /// `--advertise`.
    pub advertise: Option<String>,
    /// `--peers`.
    pub peers: Option<String>,
    /// `--data-dir`.
    pub data_dir: Option<String>,
    /// `--policy`.
    pub policy: Option<String>,
    /// The planning flags (`--plan-every`, `--slot`, ...): each overrides its `[planner]` key.
    pub round: RoundArgs,
    /// `--models-dir`.
    pub models_dir: Option<String>,
    /// `--clock`.
    pub clock: Option<String>,
    /// `--metrics-listen`.
    pub metrics_listen: Option<String>,
    /// `--otlp-endpoint`.
    pub otlp_endpoint: Option<String>,
    /// `--election-ticks`.
    pub election_ticks: Option<usize>,
    /// `--snapshot-every`.
    pub snapshot_every: Option<u64>,
    /// `--snapshot-log-ratio`.
    pub snapshot_log_ratio: Option<f64>,
    /// `--keep-tail`.
    pub keep_tail: Option<u64>,
    /// `--suspect-after`.
    pub suspect_after: Option<String>,
    /// `--fail-after`.
    pub fail_after: Option<String>,
    /// `--no-failure-detection` (true when given).
    pub no_failure_detection: bool,
    /// `--interference`: the interference table's JSON file.
    pub interference: Option<String>,
    /// `--tls-cert`, `--tls-key`, `--tls-ca` (all three, or none: the file's `[tls]`).
    pub tls: Option<tessera_auth::TlsFiles>,
    /// `--member-pins`.
    pub member_pins: Option<String>,
    /// `--call-deadline`.
    pub call_deadline: Option<String>,
    /// `--insecure` (true when given): plaintext beyond loopback.
    pub insecure: bool,
    /// `--join`.
    pub join: bool,
    /// `--allow-fault-injection`.
    pub allow_fault_injection: bool,
}

/// An entry of an `ID=VALUE,...` list (`--peers`, `--member-pins`) that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {index} `{entry}`: {problem}")]
pub struct ListEntryError {
    /// The entry's position, from 1.
    pub index: usize,
    /// The entry as written.
    pub entry: String,
    /// What is wrong with it.
    pub problem: String,
}

/// The non-empty entries of an `ID=VALUE,...` list, each with its position (from 1), its text, its id (a number
/// above 0) and its value; `shape` names the expected form in errors (`ID=HOST:PORT`).
fn id_entries<'a>(
    text: &'a str,
    shape: &'a str,
) -> impl Iterator<Item = Result<(usize, &'a str, u64, &'a str), ListEntryError>> + 'a {
    text.split(',').map(str::trim).filter(|p| !p.is_empty()).enumerate().map(move |(i, part)| {
        let bad = |problem: String| ListEntryError { index: i + 1, entry: part.to_string(), problem };
        let (id, value) = part.split_once('=').ok_or_else(|| bad(format!("not {shape}")))?;
        let id = id
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|id| *id > 0)
            .ok_or_else(|| bad("the member id must be a number above 0".into()))?;
        Ok((i + 1, part, id, value))
    })
}

/// Parses `1=sha256:HEX,2=sha256:HEX` (fingerprints as [`tessera_auth::normalize_fingerprint`] reads them).
pub fn parse_member_pins(text: &str) -> Result<BTreeMap<u64, String>, ListEntryError> {
    let mut pins = BTreeMap::new();
    for entry in id_entries(text, "ID=FINGERPRINT") {
        let (index, part, id, fp) = entry?;
        let bad = |problem: &str| ListEntryError { index, entry: part.to_string(), problem: problem.to_string() };
        let fp = tessera_auth::normalize_fingerprint(fp)
            .ok_or_else(|| bad("the fingerprint must be sha256:HEX (64 hex digits; certs fingerprint)"))?;
        if pins.insert(id, fp).is_some() {
            return Err(bad(&format!("member {id} is pinned twice")));
        }
    }
    Ok(pins)
}

/// Parses `1=host:port,2=host:port`.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>, ListEntryError> {
    let mut peers = BTreeMap::new();
    for entry in id_entries(text, "ID=HOST:PORT") {
        let (index, part, id, addr) = entry?;
        let bad = |problem: &str| ListEntryError { index, entry: part.to_string(), problem: problem.to_string() };
        let addr = addr.trim();
        if !addr.contains(':') {
            return Err(bad("the address must be HOST:PORT"));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(bad(&format!("member {id} appears twice")));
        }
    }
    Ok(peers)
}

/// The largest interference table file read (100 models, every ordered pair, is about 1 MB).
pub const MAX_INTERFERENCE_BYTES: u64 = 4 << 20;

/// An interference table file that cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum InterferenceFileError {
    /// It cannot be read.
    #[error("{}: {source}", file.display())]
    Read {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// It is larger than [`MAX_INTERFERENCE_BYTES`].
    #[error("{}: larger than {MAX_INTERFERENCE_BYTES} bytes", file.display())]
    TooLarge {
        /// The file.
        file: PathBuf,
    },
    /// It is not a table's JSON (the message has the line and column).
    #[error("{}: {source}", file.display())]
    Json {
        /// The file.
        file: PathBuf,
        /// Why.
        source: serde_json::Error,
    },
    /// A pair is out of range.
    #[error("{}: {source}", file.display())]
    Invalid {
        /// The file.
        file: PathBuf,
        /// Which pair, and why.
        source: tessera_planner::error::InvalidField,
    },
}

/// Reads and checks an interference table.
fn load_interference(file: &Path) -> Result<tessera_planner::input::Interference, InterferenceFileError> {
    use std::io::Read as _;
    let read = |source| InterferenceFileError::Read { file: file.to_path_buf(), source };
    let f = std::fs::File::open(file).map_err(read)?;
    let mut text = String::new();
    f.take(MAX_INTERFERENCE_BYTES + 1).read_to_string(&mut text).map_err(read)?;
    if text.len() as u64 > MAX_INTERFERENCE_BYTES {
        return Err(InterferenceFileError::TooLarge { file: file.to_path_buf() });
    }
    let table: tessera_planner::input::Interference = serde_json::from_str(&text)
        .map_err(|source| InterferenceFileError::Json { file: file.to_path_buf(), source })?;
    table.validate().map_err(|source| InterferenceFileError::Invalid { file: file.to_path_buf(), source })?;
    Ok(table)
}

fn field(f: &str, m: impl Into<String>) -> FieldError {
    FieldError { field: f.into(), message: m.into() }
}

fn duration(name: &str, value: Option<&str>, default: &str) -> Result<Duration, FieldError> {
    let ms = parse_duration_ms(name, value.unwrap_or(default))?;
    if ms == 0 {
        return Err(field(name, "must be longer than 0"));
    }
    Ok(Duration::from_millis(ms))
}

impl CoordinatorConfig {
    /// Loads `file` (when given) and applies `over`. Errors name the file and field (or the flag).
    pub fn load(file: Option<&Path>, over: &Overrides) -> Result<CoordinatorConfig, ConfigError> {
        match file {
            Some(path) => CoordinatorConfig::parse(&read_config(path)?, path, over),
            None => validate(RawConfig::default(), Path::new(""), over).map_err(|e| ConfigError {
                file: PathBuf::from("(command line)"),
                position: None,
                field: Some(e.field),
                message: e.message,
            }),
        }
    }

    /// Parses the text of a configuration file and applies `over`, as [`CoordinatorConfig::load`] does with the
    /// file it reads: `file` names it in errors, and relative paths in it are resolved against its directory.
    pub fn parse(text: &str, file: &Path, over: &Overrides) -> Result<CoordinatorConfig, ConfigError> {
        let raw: RawConfig = from_toml(text, file)?;
        let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
        validate(raw, &base, over).map_err(|e| ConfigError {
            file: file.to_path_buf(),
            position: None,
            field: Some(e.field),
            message: e.message,
        })
    }
}

fn validate(raw: RawConfig, base: &Path, over: &Overrides) -> Result<CoordinatorConfig, FieldError> {
    let id = over.id.or(raw.id).ok_or_else(|| field("id", "is required (--id or `id = N`)"))?;
    if id == 0 {
        return Err(field("id", "must be > 0"));
    }
    let listen_text = over.listen.clone().or(raw.listen).ok_or_else(|| field("listen", "is required"))?;
    let listen: SocketAddr =
        listen_text.parse().map_err(|e| field("listen", format!("`{listen_text}` is not IP:PORT ({e})")))?;
    let advertise = over.advertise.clone().or(raw.advertise).unwrap_or_else(|| listen.to_string());
    let peers_text = over.peers.clone().or(raw.peers).unwrap_or_else(|| format!("{id}={advertise}"));
    let peers = parse_peers(&peers_text).map_err(|m| field("peers", m.to_string()))?;
    if !over.join && !peers.contains_key(&id) {
        return Err(field(
            "peers",
            format!("must list this node (id {id}) unless it joins an existing cluster (--join)"),
        ));
    }
    // A path from the command line is relative to the working directory; from the file, to the file.
    let path = |flag: &Option<String>, file: Option<String>| match (flag, file) {
        (Some(p), _) => Some(PathBuf::from(p)),
        (None, Some(p)) => Some(base.join(p)),
        (None, None) => None,
    };
    let data_dir = path(&over.data_dir, raw.data_dir).ok_or_else(|| field("data_dir", "is required"))?;
    let models_dir = path(&over.models_dir, raw.models_dir);
    if raw.plan_every.is_some() {
        return Err(field("plan_every", "moved to [planner] (`[planner]` then `plan_every = \"60s\"`)"));
    }
    let policy =
        over.policy.clone().or(raw.policy).unwrap_or_else(|| tessera_planner::policies::DEFAULT_POLICY.to_string());
    let planner = tessera_planner::policies::by_name(&policy).map_err(|m| field("policy", m.to_string()))?;
    if planner.sees_truth() {
        return Err(field(
            "policy",
            format!("`{policy}` plans with the true future arrival rates, which a running cluster does not have"),
        ));
    }
    let clock = match over.clock.clone().or(raw.clock).as_deref().unwrap_or("wall") {
        "wall" => ClockMode::Wall,
        "virtual" => ClockMode::Virtual,
        other => return Err(field("clock", format!("`{other}` is not wall or virtual"))),
    };
    // The file's [planner] table, then the flags; every default is RoundSettings' (the same as replay's).
    let round = over.round.apply(&raw.planner);
    round.validate().map_err(|e| field(&format!("planner.{}", e.field), e.problem))?;
    let metrics_listen = match over.metrics_listen.clone().or(raw.metrics_listen) {
        Some(m) => Some(m.parse().map_err(|e| field("metrics_listen", format!("`{m}` is not IP:PORT ({e})")))?),
        None => None,
    };
    let otlp_endpoint = over.otlp_endpoint.clone().or(raw.otlp_endpoint).filter(|s| !s.trim().is_empty());
    if let Some(e) = &otlp_endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(field("otlp_endpoint", format!("`{e}` must start with http:// or https://")));
    }
    let r = raw.raft;
    let defaults = RaftSettings::default();
    let raft = RaftSettings {
        id,
        tick: duration("raft.tick", r.tick.as_deref(), "100ms")?,
        election_ticks: over.election_ticks.or(r.election_ticks).unwrap_or(defaults.election_ticks),
        heartbeat_ticks: r.heartbeat_ticks.unwrap_or(defaults.heartbeat_ticks),
        snapshot_every: over.snapshot_every.or(r.snapshot_every).unwrap_or(defaults.snapshot_every),
        snapshot_log_ratio: over.snapshot_log_ratio.or(r.snapshot_log_ratio).unwrap_or(defaults.snapshot_log_ratio),
        keep_tail: over.keep_tail.or(r.keep_tail).unwrap_or(defaults.keep_tail),
        request_timeout: duration("raft.request_timeout", r.request_timeout.as_deref(), "5s")?,
    };
    if raft.heartbeat_ticks == 0 || raft.election_ticks <= raft.heartbeat_ticks {
        return Err(field("raft.election_ticks", "must be greater than raft.heartbeat_ticks (> 0)"));
    }
    if raft.snapshot_every == 0 {
        return Err(field("raft.snapshot_every", "must be > 0"));
    }
    if !(raft.snapshot_log_ratio.is_finite() && (0.0..=1000.0).contains(&raft.snapshot_log_ratio)) {
        return Err(field(
            "raft.snapshot_log_ratio",
            "must be a number in [0, 1000] (0: snapshot_every alone decides)",
        ));
    }
    let interference = match path(&over.interference, raw.interference) {
        Some(file) => Some(load_interference(&file).map_err(|e| field("interference", e.to_string()))?),
        None => None,
    };
    let fd = raw.failure_detection;
    let detect = !over.no_failure_detection && fd.enabled.unwrap_or(clock == ClockMode::Wall);
    let suspect_after = duration(
        "failure_detection.suspect_after",
        over.suspect_after.as_deref().or(fd.suspect_after.as_deref()),
        "6s",
    )?;
    let fail_after =
        duration("failure_detection.fail_after", over.fail_after.as_deref().or(fd.fail_after.as_deref()), "15s")?;
    if fail_after <= suspect_after {
        return Err(field("failure_detection.fail_after", "must be longer than failure_detection.suspect_after"));
    }
    let suspect_push_failures = fd.suspect_push_failures.unwrap_or(3);
    if suspect_push_failures == 0 {
        return Err(field("failure_detection.suspect_push_failures", "must be at least 1"));
    }
    let tls = match (&over.tls, raw.tls) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(t)) => Some(t.relative_to(base)),
        (None, None) => None,
    };
    // A coordinator reachable beyond this host decides what runs on every GPU: it must check who calls.
    if !listen.ip().is_loopback() && tls.is_none() && !over.insecure && raw.insecure != Some(true) {
        return Err(field(
            "tls",
            format!(
                "listening on {listen} without TLS would let anyone who reaches it reconfigure the fleet; give \
                 --tls-cert/--tls-key/--tls-ca (or [tls]; `coordinator certs init` makes them) or --insecure"
            ),
        ));
    }
    let member_pins = match over.member_pins.as_deref().or(raw.member_pins.as_deref()) {
        Some(text) => parse_member_pins(text).map_err(|m| field("member_pins", m.to_string()))?,
        None => BTreeMap::new(),
    };
    if !member_pins.is_empty() && tls.is_none() {
        return Err(field(
            "member_pins",
            "pins certificates, so it needs TLS (--tls-cert/--tls-key/--tls-ca or [tls])",
        ));
    }
    let call_deadline = match over.call_deadline.as_deref().or(raw.call_deadline.as_deref()) {
        Some(d) => duration("call_deadline", Some(d), "")?,
        None => crate::limits::UNARY_DEADLINE,
    };
    let failure_detection =
        detect.then_some(crate::planning::FailureDetection { suspect_after, fail_after, suspect_push_failures });
    Ok(CoordinatorConfig {
        round,
        raft,
        listen,
        advertise,
        peers,
        join: over.join,
        data_dir,
        policy,
        models_dir,
        clock,
        metrics_listen,
        otlp_endpoint,
        allow_fault_injection: over.allow_fault_injection,
        failure_detection,
        interference,
        tls,
        member_pins,
        call_deadline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(f: impl FnOnce(&mut RoundArgs)) -> Overrides {
        let mut round = RoundArgs::default();
        f(&mut round);
        Overrides { round, ..Default::default() }
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/coordinator.toml");
        let c = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.peers.len(), 3);
        assert!(c.models_dir.unwrap().join("resnet50.toml").exists());
    }

    #[test]
    fn peers_parse_and_name_the_bad_entry() {
        let p = parse_peers("1=127.0.0.1:7001, 2=127.0.0.1:7002").unwrap();
        assert_eq!(p[&2], "127.0.0.1:7002");
        assert_eq!(parse_peers("1=a:1,x=b:2").unwrap_err().index, 2);
        assert!(parse_peers("1=a:1,1=b:2").unwrap_err().problem.contains("twice"));
        assert!(parse_peers("1=nohost").unwrap_err().problem.contains("HOST:PORT"));
    }

    #[test]
    fn member_pins_parse_and_name_the_bad_entry() {
        let fp = format!("sha256:{}", "ab".repeat(32));
        let p = parse_member_pins(&format!("1={fp}, 3=SHA256:{}", "CD".repeat(32))).unwrap();
        assert_eq!(p[&1], fp);
        assert_eq!(p[&3], format!("sha256:{}", "cd".repeat(32)));
        assert!(parse_member_pins(&format!("1={fp},2=sha256:12")).unwrap_err().index == 2);
        assert!(parse_member_pins(&format!("0={fp}")).unwrap_err().problem.contains("above 0"));
        assert!(parse_member_pins(&format!("1={fp},1={fp}")).unwrap_err().problem.contains("twice"));
        assert!(parse_member_pins("1").unwrap_err().problem.contains("ID=FINGERPRINT"));
    }

    #[test]
    fn flags_override_the_file_and_errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("coordinator.toml");
        std::fs::write(
            &file,
            "id = 1\nlisten = \"127.0.0.1:7001\"\npeers = \"1=127.0.0.1:7001,2=127.0.0.1:7002\"\ndata_dir = \"d1\"\n",
        )
        .unwrap();
        let c = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.data_dir, dir.path().join("d1"));
        assert_eq!(c.policy, "tessera");
        let over = Overrides {
            id: Some(2),
            listen: Some("127.0.0.1:7002".into()),
            policy: Some("static".into()),
            ..Default::default()
        };
        let c = CoordinatorConfig::load(Some(&file), &over).unwrap();
        assert_eq!((c.raft.id, c.policy.as_str(), c.advertise.as_str()), (2, "static", "127.0.0.1:7002"));
        assert_eq!(c.round, RoundSettings::default());
        let over = round(|r| r.target_utilization = Some(0.9));
        assert_eq!(CoordinatorConfig::load(Some(&file), &over).unwrap().round.target_utilization, 0.9);
        let over = round(|r| r.target_utilization = Some(1.5));
        let e = CoordinatorConfig::load(Some(&file), &over).unwrap_err().to_string();
        assert!(e.contains("planner.target_utilization"), "{e}");
        let over = round(|r| r.gap = Some(0.04));
        assert_eq!(CoordinatorConfig::load(Some(&file), &over).unwrap().round.gap, 0.04);
        let over = round(|r| r.gap = Some(1.0));
        let e = CoordinatorConfig::load(Some(&file), &over).unwrap_err().to_string();
        assert!(e.contains("planner.gap"), "{e}");
        let over = round(|r| r.replan_band = Some(0.0));
        assert_eq!(CoordinatorConfig::load(Some(&file), &over).unwrap().round.replan_band, 0.0);
        for bad in [-1.0, f64::NAN, 101.0] {
            let over = round(|r| r.replan_band = Some(bad));
            let e = CoordinatorConfig::load(Some(&file), &over).unwrap_err().to_string();
            assert!(e.contains("planner.replan_band"), "{e}");
        }
        let text = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, format!("{text}[planner]\nreplan_band = 2.5\n")).unwrap();
        assert_eq!(CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap().round.replan_band, 2.5);
        std::fs::write(&file, format!("{text}[planner]\ngap = 0.02\n")).unwrap();
        assert_eq!(CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap().round.gap, 0.02);
        assert!(!c.round.replan_on_burst);
        std::fs::write(&file, format!("{text}[planner]\nreplan_on_burst = true\n")).unwrap();
        assert!(CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap().round.replan_on_burst);
        std::fs::write(&file, format!("{text}[planner]\nreplan_on_burst = 1\n")).unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("replan_on_burst"), "{e}");
        std::fs::write(&file, &text).unwrap();
        let over = round(|r| r.replan_on_burst = true);
        assert!(CoordinatorConfig::load(Some(&file), &over).unwrap().round.replan_on_burst);
        // The window moved into [planner]: the old place is refused with a pointer.
        std::fs::write(&file, format!("{text}plan_every = \"30s\"\n")).unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("plan_every") && e.contains("[planner]"), "{e}");
        std::fs::write(&file, format!("{text}[planner]\nplan_every = \"30s\"\nslot = \"5s\"\n")).unwrap();
        let c = CoordinatorConfig::load(Some(&file), &round(|r| r.slot = Some(Duration::from_secs(6)))).unwrap();
        assert_eq!((c.round.plan_every, c.round.slot), (Duration::from_secs(30), Duration::from_secs(6)));
        std::fs::write(&file, &text).unwrap();

        let over = Overrides { policy: Some("nope".into()), ..Default::default() };
        let e = CoordinatorConfig::load(Some(&file), &over).unwrap_err().to_string();
        assert!(e.contains("coordinator.toml") && e.contains("policy"), "{e}");
        std::fs::write(&file, "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\n[raft]\ntick = 5\n").unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("raft.tick"), "{e}");
        std::fs::write(&file, "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\nbogus = 1\n").unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn the_call_deadline_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let base = "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\n";
        std::fs::write(&file, base).unwrap();
        let c = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.call_deadline, crate::limits::UNARY_DEADLINE);
        std::fs::write(&file, format!("{base}call_deadline = \"2s\"\n")).unwrap();
        assert_eq!(CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap().call_deadline.as_secs(), 2);
        let over = Overrides { call_deadline: Some("500ms".into()), ..Default::default() };
        assert_eq!(CoordinatorConfig::load(Some(&file), &over).unwrap().call_deadline.as_millis(), 500);
        std::fs::write(&file, format!("{base}call_deadline = \"0s\"\n")).unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("call_deadline"), "{e}");
    }

    #[test]
    fn the_sharing_mode_is_read_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let base = "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\n[planner]\n";
        std::fs::write(&file, format!("{base}sharing = \"priority\"\n")).unwrap();
        let c = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.round.sharing, tessera_core::sharing::Sharing::Priority);
        std::fs::write(&file, base).unwrap();
        let c = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap();
        assert_eq!(c.round.sharing, tessera_core::sharing::Sharing::Exclusive);
        std::fs::write(&file, format!("{base}sharing = \"tally\"\n")).unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("planner.sharing") && e.contains("tally"), "{e}");
    }

    #[test]
    fn the_interference_table_is_read_relative_to_the_file_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let base = "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\ninterference = \"x.json\"\n";
        std::fs::write(&file, base).unwrap();
        let table = dir.path().join("x.json");
        std::fs::write(&table, r#"{"source": "test", "pairs": [["a", "b", 1.5], ["b", "a", 1.2]]}"#).unwrap();
        let c = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap();
        let x = c.interference.unwrap();
        assert_eq!((x.slowdown("a", "b"), x.slowdown("b", "a"), x.slowdown("a", "c")), (1.5, 1.2, 1.0));
        let none = "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\n";
        std::fs::write(&file, none).unwrap();
        assert!(CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap().interference.is_none());
        std::fs::write(&file, base).unwrap();
        // Each bad table is refused naming the field and the file (and the pair or the JSON line).
        for (text, says) in [
            (r#"{"pairs": [["a", "b", 0.5]]}"#, "pairs[0]"),
            (r#"{"pairs": [["a", "b", 1.5], ["a", "b", 1.6]]}"#, "given twice"),
            (r#"{"pairs": [["", "b", 1.5]]}"#, "empty"),
            ("{\"pairs\": [\n[\"a\", \"b\"]]}", "line 2"),
            (r#"{"pairs": [], "extra": 1}"#, "extra"),
        ] {
            std::fs::write(&table, text).unwrap();
            let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
            assert!(e.contains("field `interference`") && e.contains("x.json") && e.contains(says), "{text}: {e}");
        }
        std::fs::remove_file(&table).unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("field `interference`") && e.contains("x.json"), "{e}");
    }

    #[test]
    fn plaintext_beyond_loopback_needs_insecure() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "id = 1\nlisten = \"0.0.0.0:7001\"\ndata_dir = \"d\"\n").unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("field `tls`") && e.contains("--insecure"), "{e}");
        let over = Overrides { insecure: true, ..Default::default() };
        assert!(CoordinatorConfig::load(Some(&file), &over).unwrap().tls.is_none());
        let over = Overrides {
            tls: Some(tessera_auth::TlsFiles { cert: "c".into(), key: "k".into(), ca: "a".into() }),
            ..Default::default()
        };
        assert!(CoordinatorConfig::load(Some(&file), &over).unwrap().tls.is_some());
    }

    #[test]
    fn failure_detection_defaults_by_clock_and_its_thresholds_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let base = "id = 1\nlisten = \"127.0.0.1:7001\"\ndata_dir = \"d\"\n";
        std::fs::write(&file, base).unwrap();
        let fd = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap().failure_detection.unwrap();
        assert_eq!(
            (fd.suspect_after, fd.fail_after, fd.suspect_push_failures),
            (Duration::from_secs(6), Duration::from_secs(15), 3)
        );
        let virt = Overrides { clock: Some("virtual".into()), ..Default::default() };
        assert!(CoordinatorConfig::load(Some(&file), &virt).unwrap().failure_detection.is_none());
        let off = Overrides { no_failure_detection: true, ..Default::default() };
        assert!(CoordinatorConfig::load(Some(&file), &off).unwrap().failure_detection.is_none());
        std::fs::write(
            &file,
            format!("{base}[failure_detection]\nenabled = true\nsuspect_after = \"1s\"\nfail_after = \"3s\"\n"),
        )
        .unwrap();
        let fd = CoordinatorConfig::load(Some(&file), &virt).unwrap().failure_detection.unwrap();
        assert_eq!((fd.suspect_after, fd.fail_after), (Duration::from_secs(1), Duration::from_secs(3)));
        let over = Overrides { fail_after: Some("500ms".into()), ..Default::default() };
        let e = CoordinatorConfig::load(Some(&file), &over).unwrap_err().to_string();
        assert!(e.contains("failure_detection.fail_after") && e.contains("longer than"), "{e}");
        std::fs::write(&file, format!("{base}[failure_detection]\nsuspect_push_failures = 0\n")).unwrap();
        let e = CoordinatorConfig::load(Some(&file), &Overrides::default()).unwrap_err().to_string();
        assert!(e.contains("failure_detection.suspect_push_failures"), "{e}");
    }
}
