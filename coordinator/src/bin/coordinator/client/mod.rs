//! The client commands (`status`, `tenant`, `node`, `gpu`, `plan`, `audit`, `member`), like etcdctl: what they
//! share (endpoints, output, TLS, exit statuses), and one module per group.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use tessera_coordinator::client::Client;
use tessera_proto::v1;

pub(crate) mod fleet;
pub(crate) mod plan;
pub(crate) mod tenant;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    /// Text for people.
    Table,
    /// JSON for scripts.
    Json,
}

#[derive(Args, Clone)]
pub(crate) struct ClientArgs {
    /// Coordinator endpoints, HOST:PORT,...
    #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:7001", env = "TESSERA_ENDPOINTS")]
    pub(crate) endpoints: Vec<String>,
    /// Output format.
    #[arg(short = 'w', long = "output", value_enum, default_value_t = Output::Table, env = "TESSERA_OUTPUT")]
    pub(crate) output: Output,
    /// Same as `-w json`.
    #[arg(long)]
    pub(crate) json: bool,
    /// Per-call deadline.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
    /// This client's certificate (mutual TLS; its subject's OU is the role: admin, operator or reader).
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_CERT")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The certificate's private key.
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_KEY")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The CA that signed the coordinators' certificates.
    #[arg(long, value_name = "FILE", env = "TESSERA_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
}

impl ClientArgs {
    /// Whether the answer is printed as JSON (`-w json` or `--json`).
    pub(crate) fn json(&self) -> bool {
        self.json || self.output == Output::Json
    }
}

/// A failed command with its exit status (the table under `--help`) and one-line message.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    /// Flags that do not go together: exit status 2.
    pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
        Failure { code: 2, message: message.into() }.into()
    }

    /// A bad input file or value: exit status 7.
    pub(crate) fn input(message: impl Into<String>) -> anyhow::Error {
        Failure { code: 7, message: message.into() }.into()
    }

    /// The cluster's answer about `object` (left out where the message already starts with it).
    pub(crate) fn status(object: &str, s: &tonic::Status) -> anyhow::Error {
        let message = if s.message().starts_with(object) {
            format!("{} ({})", s.message().trim(), status_kind(s.code()))
        } else {
            format!("{object}: {}", status_text(s))
        };
        Failure { code: exit_status(s.code()), message }.into()
    }
}

/// The exit status for a gRPC status code (the table under `--help`).
pub(crate) fn exit_status(code: tonic::Code) -> u8 {
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
pub(crate) fn status_text(s: &tonic::Status) -> String {
    let what = status_kind(s.code());
    let message = s.message().trim();
    if message.is_empty() { what.to_string() } else { format!("{what}: {message}") }
}

/// A gRPC status code in a few words.
pub(crate) fn status_kind(code: tonic::Code) -> &'static str {
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
pub(crate) fn report(e: &anyhow::Error) -> (u8, String) {
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

pub(crate) fn client(c: &ClientArgs) -> anyhow::Result<Client> {
    let tls = tessera_auth::TlsFiles::from_flags(c.tls_cert.clone(), c.tls_key.clone(), c.tls_ca.clone())
        .map_err(|e| Failure::usage(e.to_string()))?;
    Ok(Client::new(&c.endpoints, c.timeout).with_tls(tls))
}

/// Prints a client command's answer (a closed pipe ends the output quietly: `coordinator node list | head`).
pub(crate) fn print(json_mode: bool, value: serde_json::Value, text: String) {
    let text = if json_mode { serde_json::to_string_pretty(&value).expect("json") } else { text };
    out(&text);
}

/// Writes a line to stdout; a reader that went away (a closed pipe) is not an error: the output ends quietly.
pub(crate) fn out(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => eprintln!("error: cannot write to stdout: {e}"),
        _ => {}
    }
}

pub(crate) fn tenant_json(t: &v1::TenantResponse) -> serde_json::Value {
    let spec = t.spec.clone().and_then(|s| tessera_core::tenant::TenantSpec::try_from(s).ok());
    json!({ "spec": spec, "retiring": t.retiring, "revision": t.revision })
}

/// What the planner makes of a GPU: a GPU on a failed node is failed, and a healthy one on a suspect node keeps its
/// work and gets none new, as a draining one does. The GPU's own health is `gpu_health` in `node list --json`.
pub(crate) fn effective_gpu_health(node: &str, gpu: &str) -> String {
    match (node, gpu) {
        ("failed", _) => "failed (node)".into(),
        ("suspect", "healthy") => "suspect (node)".into(),
        _ => gpu.into(),
    }
}

pub(crate) fn members_json(m: &[v1::Member]) -> serde_json::Value {
    m.iter().map(|m| json!({ "id": m.id, "address": m.address })).collect()
}
