//! `agent run --config FILE`: the agent's TOML configuration, parsed raw (unknown fields rejected) and then
//! validated into [`AgentConfig`]. Durations are strings (`"500ms"`, `"5s"`); defaults live here; every
//! error names the file and the field.
//!
//! ```toml
//! node_id = "gpu-0"               # required
//! listen = "0.0.0.0:50051"         # required: where the Agent service listens
//! advertise = "gpu-0:50051"       # optional: the address the coordinator uses (default: listen)
//! data_dir = "data/agent"          # required: the state file lives here (relative to the config file)
//! backend = "nvml"                 # nvml (the only backend of the `agent` binary; sim-agent hosts simulated nodes)
//! resync_interval = "5s"           # optional
//! retry_interval = "200ms"         # optional
//!
//! insecure = false                 # listening beyond loopback needs [tls], or this set to true
//!
//! [tls]                            # optional: mutual TLS (coordinator certs init --agent <node_id>)
//! cert = "certs/gpu-0.pem"        # this node's certificate: its CN must be the node id
//! key = "certs/gpu-0.key"
//! ca = "certs/ca.pem"
//!
//! [coordinator]                    # optional: without it the agent only serves its API
//! address = "coordinator-1:7000"   # or every node of the cluster: "c1:7000,c2:7000,c3:7000"
//! heartbeat_interval = "2s"        # optional
//! backoff_initial = "200ms"        # optional
//! backoff_max = "10s"              # optional
//! rpc_timeout = "2s"               # optional
//!
//! metrics_listen = "0.0.0.0:9102"  # optional (top level): /metrics, /healthz, /readyz
//! otlp_endpoint = "http://127.0.0.1:4317"  # optional (top level): OTLP/gRPC traces (off when absent)
//!
//! [jobs]                           # optional: what tenants' jobs may run here (supervisor.rs); none without it
//! allow_commands = ["tritonserver", "/opt/serving/*"]   # argv[0] exactly, or a prefix and `*`
//! allow_images = ["nvcr.io/nvidia/*"]                    # container images, the same way
//!
//! [load]                           # optional: the serving stack's request counters (load.rs); enables ReportLoad
//! interval = "10s"                 # optional: how often each endpoint is read
//! [[load.scrape]]                  # any number
//! tenant = "vision"
//! url = "http://127.0.0.1:8002/metrics"
//! metric = "nv_inference_request_success"   # Triton; vLLM: "vllm:request_success_total"
//! labels = { model = "resnet50" }  # optional: only samples with these labels count
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tessera_core::config::{ConfigError, FieldError, parse_duration_ms};
use tessera_core::ids::{NodeId, TenantId};

use crate::coordinator::ClientOptions;
use crate::load::{LoadOptions, ScrapeSource};
use crate::runtime::RuntimeOptions;

/// Default time between reconcile passes when nothing wakes the loop.
pub const DEFAULT_RESYNC_INTERVAL: &str = "5s";
/// Default time before retrying a pass that failed or waits for a warm-up.
pub const DEFAULT_RETRY_INTERVAL: &str = "200ms";
/// Default time between two reads of a load endpoint.
pub const DEFAULT_LOAD_INTERVAL: &str = "10s";
/// Default time between heartbeats.
pub const DEFAULT_HEARTBEAT_INTERVAL: &str = "2s";
/// Default first retry delay when the coordinator is unreachable.
pub const DEFAULT_BACKOFF_INITIAL: &str = "200ms";
/// Default longest retry delay.
pub const DEFAULT_BACKOFF_MAX: &str = "10s";
/// Default deadline of one coordinator call.
pub const DEFAULT_RPC_TIMEOUT: &str = "2s";

/// Which MIG backend drives the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// NVML (feature `nvml`).
    Nvml,
}

/// A backend name the agent binary does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend `{0}` (the agent binary has `nvml`; simulated nodes run under `sim-agent run`)")]
pub struct UnknownBackend(pub String);

impl std::str::FromStr for BackendKind {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, UnknownBackend> {
        match s {
            "nvml" => Ok(BackendKind::Nvml),
            other => Err(UnknownBackend(other.to_string())),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    node_id: String,
    listen: String,
    advertise: Option<String>,
    data_dir: String,
    backend: Option<String>,
    resync_interval: Option<String>,
    retry_interval: Option<String>,
    coordinator: Option<RawCoordinator>,
    tls: Option<tessera_auth::TlsFiles>,
    insecure: Option<bool>,
    metrics_listen: Option<String>,
    otlp_endpoint: Option<String>,
    load: Option<RawLoad>,
    jobs: Option<RawJobs>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJobs {
    #[serde(default)]
    allow_commands: Vec<String>,
    #[serde(default)]
    allow_images: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    interval: Option<String>,
    #[serde(default)]
    scrape: Vec<RawScrape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScrape {
    tenant: String,
    url: String,
    metric: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCoordinator {
    address: String,
    heartbeat_interval: Option<String>,
    backoff_initial: Option<String>,
    backoff_max: Option<String>,
    rpc_timeout: Option<String>,
}

/// A validated agent configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The node's id.
    pub node_id: NodeId,
    /// Where the Agent service listens.
    pub listen: SocketAddr,
    /// The address the coordinator uses to reach the agent.
    pub advertise: String,
    /// The data directory (resolved against the config file's directory when relative).
    pub data_dir: PathBuf,
    /// The MIG backend.
    pub backend: BackendKind,
    /// Loop pacing and the coordinator client.
    pub runtime: RuntimeOptions,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (plain HTTP), if anywhere.
    pub metrics_listen: Option<SocketAddr>,
    /// Where spans go (OTLP/gRPC, `http://` or `https://`), if anywhere.
    pub otlp_endpoint: Option<String>,
    /// The serving stack's request counters (`[load]`): scraped endpoints, and `ReportLoad` accepted.
    pub load: Option<LoadOptions>,
    /// The programs and images tenants' jobs may run here (`[jobs]`); none without that section.
    pub jobs: crate::supervisor::JobPolicy,
}

fn duration(field: &str, value: Option<&str>, default: &str) -> Result<Duration, FieldError> {
    let ms = parse_duration_ms(field, value.unwrap_or(default))?;
    if ms == 0 {
        return Err(FieldError { field: field.into(), message: "must be longer than 0".into() });
    }
    Ok(Duration::from_millis(ms))
}

fn validate(raw: RawConfig, base: &Path) -> Result<AgentConfig, FieldError> {
    let field = |f: &str, m: String| FieldError { field: f.into(), message: m };
    let node_id = NodeId::new(raw.node_id.clone()).map_err(|e| field("node_id", e.to_string()))?;
    let listen: SocketAddr = raw
        .listen
        .parse()
        .map_err(|e| field("listen", format!("`{}` is not host:port with an IP ({e})", raw.listen)))?;
    // An agent reconfigures GPUs under running services: reachable beyond this host, it must check who pushes.
    if !listen.ip().is_loopback() && raw.tls.is_none() && raw.insecure != Some(true) {
        return Err(field(
            "tls",
            format!(
                "listening on {listen} without [tls] would let anyone who reaches it reconfigure the GPUs; add [tls] \
                 (certificates from `coordinator certs init --agent {}`) or set insecure = true",
                raw.node_id
            ),
        ));
    }
    let advertise = raw.advertise.unwrap_or_else(|| listen.to_string());
    if advertise.trim().is_empty() {
        return Err(field("advertise", "must not be empty".into()));
    }
    if raw.data_dir.trim().is_empty() {
        return Err(field("data_dir", "must not be empty".into()));
    }
    let data_dir = base.join(&raw.data_dir);
    let backend = raw
        .backend
        .as_deref()
        .unwrap_or("nvml")
        .parse()
        .map_err(|m: UnknownBackend| field("backend", m.to_string()))?;
    let coordinator = match raw.coordinator {
        None => None,
        Some(c) => {
            if c.address.trim().is_empty() {
                return Err(field("coordinator.address", "must not be empty".into()));
            }
            let backoff_initial =
                duration("coordinator.backoff_initial", c.backoff_initial.as_deref(), DEFAULT_BACKOFF_INITIAL)?;
            let backoff_max = duration("coordinator.backoff_max", c.backoff_max.as_deref(), DEFAULT_BACKOFF_MAX)?;
            if backoff_max < backoff_initial {
                return Err(field("coordinator.backoff_max", "must not be shorter than backoff_initial".into()));
            }
            Some(ClientOptions {
                endpoint: c.address,
                advertise: advertise.clone(),
                heartbeat_interval: duration(
                    "coordinator.heartbeat_interval",
                    c.heartbeat_interval.as_deref(),
                    DEFAULT_HEARTBEAT_INTERVAL,
                )?,
                backoff_initial,
                backoff_max,
                rpc_timeout: duration("coordinator.rpc_timeout", c.rpc_timeout.as_deref(), DEFAULT_RPC_TIMEOUT)?,
                tls: None,
            })
        }
    };
    let metrics_listen = raw
        .metrics_listen
        .as_deref()
        .map(|m| {
            m.parse::<SocketAddr>()
                .map_err(|e| field("metrics_listen", format!("`{m}` is not host:port with an IP ({e})")))
        })
        .transpose()?;
    let otlp_endpoint = raw.otlp_endpoint.filter(|e| !e.trim().is_empty());
    if let Some(e) = &otlp_endpoint
        && !(e.starts_with("http://") || e.starts_with("https://"))
    {
        return Err(field("otlp_endpoint", format!("`{e}` must start with http:// or https://")));
    }
    let load = match raw.load {
        None => None,
        Some(l) => {
            let mut sources = Vec::new();
            for (i, s) in l.scrape.into_iter().enumerate() {
                let at = |f: &str| format!("load.scrape[{i}].{f}");
                let tenant = TenantId::new(s.tenant).map_err(|e| field(&at("tenant"), e.to_string()))?;
                let uri: Result<tonic::codegen::http::Uri, _> = s.url.parse();
                if !s.url.starts_with("http://") || uri.is_err() {
                    return Err(field(&at("url"), format!("`{}` is not an http://HOST:PORT/PATH URL", s.url)));
                }
                if s.metric.is_empty() {
                    return Err(field(&at("metric"), "the counter's name is required".into()));
                }
                sources.push(ScrapeSource { tenant, url: s.url, metric: s.metric, labels: s.labels });
            }
            Some(LoadOptions {
                interval: duration("load.interval", l.interval.as_deref(), DEFAULT_LOAD_INTERVAL)?,
                sources,
            })
        }
    };
    Ok(AgentConfig {
        node_id,
        listen,
        advertise,
        data_dir,
        backend,
        metrics_listen,
        otlp_endpoint,
        load,
        jobs: match raw.jobs {
            None => crate::supervisor::JobPolicy::default(),
            Some(j) => {
                for (k, p) in j.allow_commands.iter().chain(&j.allow_images).enumerate() {
                    if p.trim().is_empty() {
                        return Err(FieldError { field: format!("jobs.allow[{k}]"), message: "is empty".into() });
                    }
                }
                crate::supervisor::JobPolicy { commands: j.allow_commands, images: j.allow_images }
            }
        },
        runtime: RuntimeOptions {
            resync_interval: duration("resync_interval", raw.resync_interval.as_deref(), DEFAULT_RESYNC_INTERVAL)?,
            retry_interval: duration("retry_interval", raw.retry_interval.as_deref(), DEFAULT_RETRY_INTERVAL)?,
            coordinator,
            tls: raw.tls.map(|t| t.relative_to(base)),
            metrics: None,
        },
    })
}

/// Parses an agent configuration; `file` names it in errors and relative `data_dir`s are resolved against its
/// directory.
pub fn parse_agent_config(text: &str, file: &Path) -> Result<AgentConfig, ConfigError> {
    let err = |position, field, message| ConfigError { file: file.to_path_buf(), position, field, message };
    let de = toml::Deserializer::parse(text).map_err(|e| err(None, None, e.message().trim().to_string()))?;
    let raw: RawConfig = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        err(None, (path != ".").then_some(path), e.into_inner().message().trim().to_string())
    })?;
    let base = file.parent().unwrap_or(Path::new("."));
    validate(raw, base).map_err(|e| err(None, Some(e.field), e.message))
}

/// Reads and parses an agent configuration file.
pub fn load_agent_config(path: &Path) -> Result<AgentConfig, ConfigError> {
    parse_agent_config(&tessera_core::config::read_config(path)?, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<AgentConfig, String> {
        parse_agent_config(text, Path::new("conf/agent.toml")).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_fill_what_is_left_out() {
        let c = parse("node_id = \"n1\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"d\"\n").unwrap();
        assert_eq!(c.data_dir, Path::new("conf").join("d"));
        assert_eq!(c.backend, BackendKind::Nvml);
        assert_eq!(c.advertise, "127.0.0.1:0");
        assert_eq!(c.runtime.resync_interval, Duration::from_secs(5));
        assert!(c.runtime.coordinator.is_none());
    }

    #[test]
    fn errors_name_the_file_and_the_field() {
        let base = "node_id = \"n1\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"d\"\n";
        let e = parse(&format!("{base}colour = \"red\"\n")).unwrap_err();
        assert!(e.starts_with("conf/agent.toml") && e.contains("colour"), "{e}");
        let e = parse(&format!("{base}backend = \"sim\"\n")).unwrap_err();
        assert!(e.contains("field `backend`") && e.contains("unknown backend `sim`"), "{e}");
        let e = parse(&format!("{base}[coordinator]\naddress = \"c:1\"\nheartbeat_interval = \"soon\"\n")).unwrap_err();
        assert!(e.contains("field `coordinator.heartbeat_interval`"), "{e}");
        let e = parse("node_id = \"bad id\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"d\"\n").unwrap_err();
        assert!(e.contains("field `node_id`"), "{e}");
        let e = parse("node_id = \"n\"\nlisten = \"localhost\"\ndata_dir = \"d\"\n").unwrap_err();
        assert!(e.contains("field `listen`"), "{e}");
        let e = parse("node_id = \"n\"\nlisten = \"0.0.0.0:1\"\ndata_dir = \"d\"\n").unwrap_err();
        assert!(e.contains("field `tls`") && e.contains("insecure = true"), "{e}");
        parse("node_id = \"n\"\nlisten = \"0.0.0.0:1\"\ndata_dir = \"d\"\ninsecure = true\n").unwrap();
        parse("node_id = \"n\"\nlisten = \"127.0.0.1:1\"\ndata_dir = \"d\"\n").unwrap();
        let e = parse(&format!("{base}metrics_listen = \"localhost:9\"\n")).unwrap_err();
        assert!(e.contains("field `metrics_listen`"), "{e}");
        let e = parse(&format!("{base}otlp_endpoint = \"collector:4317\"\n")).unwrap_err();
        assert!(e.contains("field `otlp_endpoint`") && e.contains("http://"), "{e}");
        let c = parse(&format!("{base}otlp_endpoint = \"http://collector:4317\"\n")).unwrap();
        assert_eq!(c.otlp_endpoint.as_deref(), Some("http://collector:4317"));
        let scrape = |extra: &str| {
            format!(
                "{base}[load]\n[[load.scrape]]\ntenant = \"t\"\nurl = \"http://h:1/metrics\"\nmetric = \"m\"\n{extra}"
            )
        };
        let e = parse(&scrape("").replace("http://h:1/metrics", "https://h/metrics")).unwrap_err();
        assert!(e.contains("field `load.scrape[0].url`") && e.contains("http://HOST:PORT/PATH"), "{e}");
        let e = parse(&scrape("").replace("\"t\"", "\"bad tenant\"")).unwrap_err();
        assert!(e.contains("field `load.scrape[0].tenant`"), "{e}");
        let e = parse(&scrape("colour = 1\n")).unwrap_err();
        assert!(e.contains("colour"), "{e}");
        let e = parse(&format!("{base}[load]\ninterval = \"0s\"\n")).unwrap_err();
        assert!(e.contains("field `load.interval`"), "{e}");
    }

    #[test]
    fn a_load_section_lists_its_endpoints() {
        let text = "node_id = \"n1\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"d\"\n[load]\n[[load.scrape]]\n\
                    tenant = \"chat\"\nurl = \"http://127.0.0.1:8000/metrics\"\nmetric = \"vllm:request_success_total\"\n\
                    labels = { model_name = \"llama\" }\n";
        let load = parse(text).unwrap().load.unwrap();
        assert_eq!(load.interval, Duration::from_secs(10));
        assert_eq!(load.sources.len(), 1);
        assert_eq!(load.sources[0].metric, "vllm:request_success_total");
        assert_eq!(load.sources[0].labels["model_name"], "llama");
        assert!(parse("node_id = \"n1\"\nlisten = \"127.0.0.1:0\"\ndata_dir = \"d\"\n").unwrap().load.is_none());
    }

    #[test]
    fn the_shipped_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/agent.toml");
        let c = load_agent_config(&path).unwrap_or_else(|e| panic!("{e}"));
        assert!(c.runtime.coordinator.is_some(), "the example shows the coordinator section");
        assert!(c.runtime.tls.is_some(), "the example runs with mutual TLS");
    }
}
