//! Stand-in workloads: small programs that behave like a tenant's jobs on a MIG instance, without a GPU.
//!
//! The agent's job supervisor starts, probes, drains, signals and restarts the processes of a tenant's inference
//! server and retraining job when a layout changes. Testing it against the simulator's virtual workloads would not
//! exercise any of that, so the `standin` binary provides real processes with the behaviour that matters to the
//! supervisor, and nothing else:
//!
//! - [`serve`] (`standin serve`) models an inference server such as Triton or vLLM: it binds its port at once but
//!   reports ready on `GET /ready` only after a warm-up (loading weights), answers `POST /infer` after the model's
//!   latency on its instance, and drains on `POST /drain` (refuses new requests, answers once the ones in flight
//!   are done) or on SIGTERM.
//! - [`retrain`] (`standin retrain`) models a retraining job: it advances its progress in 7g GPU-seconds at its
//!   instance's speed, writes an atomic checkpoint on SIGUSR1, on SIGTERM, periodically and on completion, and
//!   resumes from its checkpoint when restarted (possibly on an instance of another size).
//!
//! Both print one line on stdout when they are set up (signal handlers installed, port bound), so a test or a
//! supervisor can wait for it before it signals them. Bad arguments exit with code 2, other failures with 1.

pub mod retrain;
pub mod serve;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_core::config::ConfigError;
use tessera_core::jobs::{JobAction, JobMetrics, JobSpec, ReadyCheck};

/// `standin serve` at `binary` as a tenant's serve job, as the tests run it: warm after 700 ms, 5 ms a request,
/// ready on `GET /ready`, drained by `POST /drain` (10 s deadline), its requests counted by
/// `standin_requests_total` on `/metrics`, 5 s of grace after SIGTERM, and named after its instance.
pub fn serve_job(binary: &Path) -> JobSpec {
    let mut serve = JobSpec::command([
        &*binary.to_string_lossy(),
        "serve",
        "--listen",
        "127.0.0.1:{port}",
        "--warmup-ms",
        "700",
        "--latency-ms",
        "5",
        "--name",
        "{node}/{gpu}/{placement}",
    ]);
    serve.ready = Some(ReadyCheck::Http { path: "/ready".into() });
    serve.drain = Some(JobAction::Http { path: "/drain".into() });
    serve.drain_deadline_ms = 10_000;
    serve.metrics =
        Some(JobMetrics { path: "/metrics".into(), counter: "standin_requests_total".into(), labels: BTreeMap::new() });
    serve.grace_ms = 5_000;
    serve
}

/// A stand-in that cannot start or cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum StandinError {
    /// Bad command-line arguments (exit code 2).
    #[error("{0}")]
    Usage(String),
    /// A model profile that cannot be used (exit code 2).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A checkpoint that exists but cannot be read or used, never silently replaced (exit code 1).
    #[error("checkpoint {}: {message}", path.display())]
    Checkpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// An I/O failure: binding the port, writing a checkpoint or stdout (exit code 1).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The failure.
        source: std::io::Error,
    },
}

impl StandinError {
    /// The process exit code: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            StandinError::Usage(_) | StandinError::Config(_) => 2,
            StandinError::Checkpoint { .. } | StandinError::Io { .. } => 1,
        }
    }

    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StandinError {
        let context = context.into();
        move |source| StandinError::Io { context, source }
    }
}

/// Writes one line to stdout and flushes it, so a reader of a pipe sees it at once.
fn say(line: &str) -> Result<(), StandinError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).map_err(StandinError::io("writing stdout"))
}

/// A current-thread Tokio runtime: a stand-in is one small process and needs no more.
fn runtime() -> Result<tokio::runtime::Runtime, StandinError> {
    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(StandinError::io("starting the runtime"))
}

/// The signals a stand-in reacts to, installed when it is created (before the stand-in announces itself, so that
/// a signal sent after the announcement is never lost to the default action). The two kinds are separate fields so
/// that one loop can wait on both.
struct Signals {
    /// SIGTERM or SIGINT: stop.
    stop: StopSignal,
    /// SIGUSR1: checkpoint.
    user1: UserSignal,
}

impl Signals {
    /// Installs the handlers; must be called inside the runtime.
    fn install() -> Result<Signals, StandinError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let install = |kind: SignalKind, name: &str| {
                signal(kind).map_err(StandinError::io(format!("installing a {name} handler")))
            };
            Ok(Signals {
                stop: StopSignal {
                    terminate: install(SignalKind::terminate(), "SIGTERM")?,
                    interrupt: install(SignalKind::interrupt(), "SIGINT")?,
                },
                user1: UserSignal { user1: install(SignalKind::user_defined1(), "SIGUSR1")? },
            })
        }
        #[cfg(not(unix))]
        Ok(Signals { stop: StopSignal {}, user1: UserSignal {} })
    }
}

/// SIGTERM or SIGINT (Ctrl-C where there are no Unix signals).
struct StopSignal {
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
}

impl StopSignal {
    /// Resolves on the next SIGTERM or SIGINT.
    async fn recv(&mut self) {
        #[cfg(unix)]
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// SIGUSR1 (never where there are no Unix signals).
struct UserSignal {
    #[cfg(unix)]
    user1: tokio::signal::unix::Signal,
}

impl UserSignal {
    /// Resolves on the next SIGUSR1.
    async fn recv(&mut self) {
        #[cfg(unix)]
        self.user1.recv().await;
        #[cfg(not(unix))]
        std::future::pending::<()>().await;
    }
}
