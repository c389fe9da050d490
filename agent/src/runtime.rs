//! The agent runtime: the reconcile loop task, the gRPC server and the coordinator client over one
//! [`Reconciler`] (binaries call [`run`] with a bound listener and a shutdown future; tests bind port 0 and run the
//! real thing in-process).
//!
//! The reconcile loop runs a pass ([`Reconciler::reconcile`], on the blocking pool: backend calls block) when woken
//! (a target accepted, workload time advanced) and every `resync_interval` otherwise, so changes made behind the
//! agent's back are repaired; a pass that waits for a warm-up or failed is retried after `retry_interval`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tessera_auth::{Auth, ServerTls, TlsFiles};

use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio_stream::wrappers::TcpListenerStream;

use crate::authority::Authority;
use crate::coordinator::{self, ClientOptions, ClientStats};
use crate::metrics::SharedMetrics;
use crate::reconcile::Reconciler;
use crate::service::AgentService;

/// Requests one connection to the agent may have in flight at once.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 64;
/// HTTP/2 streams one connection to the agent may have open at once.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 32;
/// How often an idle connection is pinged, and how long a ping may go unanswered before it is closed.
pub const KEEPALIVE: Duration = Duration::from_secs(20);
/// How long a call to the agent may take, its body read included: a push is checked, saved and answered well
/// within it (a body sent all but its last byte is dropped then).
pub const UNARY_DEADLINE: Duration = Duration::from_secs(30);

/// How the runtime paces itself and whom it reports to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Time between passes when nothing wakes the loop.
    pub resync_interval: Duration,
    /// Time before the next pass after one that waits for a warm-up or failed.
    pub retry_interval: Duration,
    /// The coordinator to register with, if any.
    pub coordinator: Option<ClientOptions>,
    /// Mutual TLS for the Agent service (this node's certificate; only coordinator members may push) and the
    /// coordinator client; `None`: plaintext.
    pub tls: Option<TlsFiles>,
    /// Where the agent's metrics go (one registry for every agent of a process), if anywhere.
    pub metrics: Option<SharedMetrics>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        RuntimeOptions {
            resync_interval: Duration::from_secs(5),
            retry_interval: Duration::from_millis(200),
            coordinator: None,
            tls: None,
            metrics: None,
        }
    }
}

/// The server could not run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The TLS files could not be used.
    #[error("TLS: {0}")]
    Tls(String),
    /// The gRPC server failed.
    #[error("gRPC server on {addr}: {source}")]
    Serve {
        /// The address it listened on.
        addr: String,
        /// The error.
        source: tonic::transport::Error,
    },
}

/// Handles to a running agent.
#[derive(Clone)]
pub struct Handles {
    /// The reconciler.
    pub reconciler: Arc<Reconciler>,
    /// Wakes the reconcile loop.
    pub wake: Arc<Notify>,
    /// The coordinator client's counters.
    pub client: Arc<ClientStats>,
    /// Mutual TLS for the service.
    pub tls: Option<TlsFiles>,
    /// Who may push layouts, as the coordinators said.
    pub authority: Arc<Authority>,
    /// The process's agent metrics, if kept.
    pub metrics: Option<SharedMetrics>,
}

async fn reconcile_loop(
    reconciler: Arc<Reconciler>,
    wake: Arc<Notify>,
    options: RuntimeOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let r = reconciler.clone();
        let started = std::time::Instant::now();
        let pass = tokio::task::spawn_blocking(move || r.reconcile()).await;
        if let Some(m) = &options.metrics {
            let report = match &pass {
                Ok(Ok(report)) => Ok(report),
                _ => Err(()),
            };
            m.0.pass(reconciler.node().as_str(), started.elapsed().as_secs_f64(), report, reconciler.applied_epoch());
        }
        let wait = match pass {
            Ok(Ok(report)) if report.errors.is_empty() && !report.waiting => options.resync_interval,
            Ok(Ok(report)) => {
                for (gpu, e) in &report.errors {
                    tracing::warn!(node = %reconciler.node(), gpu, "reconcile: {e}");
                }
                options.retry_interval
            }
            Ok(Err(e)) => {
                tracing::warn!(node = %reconciler.node(), "reconcile: {e}");
                options.retry_interval
            }
            Err(e) => {
                tracing::error!(node = %reconciler.node(), "reconcile pass panicked: {e}; the next pass starts over");
                options.retry_interval
            }
        };
        tokio::select! {
            () = wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

/// Starts the reconcile loop and the coordinator client for `reconciler` and returns their handles; they stop when
/// `shutdown` turns true. Used by [`run`] and by hosts that serve several agents ([`serve`] each).
pub fn start(
    reconciler: Arc<Reconciler>,
    options: &RuntimeOptions,
    shutdown: watch::Receiver<bool>,
) -> (Handles, Vec<tokio::task::JoinHandle<()>>) {
    let wake = Arc::new(Notify::new());
    let client = Arc::new(ClientStats::default());
    let mut tasks =
        vec![tokio::spawn(reconcile_loop(reconciler.clone(), wake.clone(), options.clone(), shutdown.clone()))];
    let authority = match &options.coordinator {
        Some(c) => {
            let mut c = c.clone();
            c.tls = c.tls.or_else(|| options.tls.clone());
            let (mut authority, refresh) = Authority::with_client(c.rpc_timeout);
            // With identities, who leads is what a majority of the members say (a member's certificate could lie).
            let members = c.endpoint.split(',').filter(|a| !a.trim().is_empty()).count();
            if c.tls.is_some() && members > 1 {
                authority = authority.with_quorum(members);
            }
            let authority = Arc::new(authority);
            let learner = coordinator::Learner { authority: authority.clone(), refresh };
            tasks.push(tokio::spawn(coordinator::run(c, reconciler.clone(), client.clone(), learner, shutdown)));
            authority
        }
        None => Arc::new(Authority::standalone()),
    };
    if let Some(m) = &options.metrics {
        m.0.add(reconciler.clone(), options.coordinator.is_some().then(|| client.clone()));
    }
    (Handles { reconciler, wake, client, tls: options.tls.clone(), authority, metrics: options.metrics.clone() }, tasks)
}

/// Serves the `Agent` service for `handles` on `listener` until `shutdown` completes.
pub async fn serve(
    handles: &Handles,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let addr = listener.local_addr().map_or_else(|_| "?".to_string(), |a: SocketAddr| a.to_string());
    let auth = if handles.tls.is_some() {
        // A certificate the cluster revoked (a retired member's) is refused on every call, as the coordinators
        // refuse it.
        let authority = handles.authority.clone();
        Auth::mutual_tls().gate(Arc::new(move |who| {
            if authority.is_revoked(&who.serial) {
                Err(format!("its certificate (serial {}) was revoked (coordinator certs revoked)", who.serial))
            } else {
                Ok(())
            }
        }))
    } else {
        Auth::insecure()
    };
    let service = AgentService::new(handles.reconciler.clone(), handles.wake.clone())
        .with_auth(auth)
        .with_authority(handles.authority.clone())
        .with_metrics(handles.metrics.clone())
        .into_server();
    // Bounded like the coordinator's: a push is small (tonic's 4 MiB decoding limit), one connection holds few
    // streams and requests, a call is answered within a deadline (its body read included), and a dead connection
    // is closed.
    let router = tonic::transport::Server::builder()
        .concurrency_limit_per_connection(MAX_IN_FLIGHT_PER_CONNECTION)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_keepalive_interval(Some(KEEPALIVE))
        .http2_keepalive_timeout(Some(KEEPALIVE))
        .layer(tessera_auth::deadline::UnaryDeadline { limit: UNARY_DEADLINE, long_lived: &[] })
        .add_service(service);
    match &handles.tls {
        Some(files) => {
            // Certificates are reloaded on SIGHUP or when their files change: new connections get the new one. A
            // revoked certificate fails its handshake; one identity holds at most
            // `tessera_auth::reload::MAX_CONNECTIONS_PER_IDENTITY` connections.
            let tls = ServerTls::new(files.clone()).map_err(|e| RuntimeError::Tls(e.to_string()))?;
            let authority = handles.authority.clone();
            tls.set_revoked(Arc::new(move |serial| authority.is_revoked(serial)));
            let watch = tls.watch(|| {});
            let incoming = tessera_auth::incoming_admitted(listener, tls, tessera_auth::Admission::default());
            let served = router.serve_with_incoming_shutdown(incoming, shutdown).await;
            watch.abort();
            served
        }
        None => {
            // `systemctl reload` sends SIGHUP: without certificates there is nothing to reload, and it must not stop
            // the agent.
            #[cfg(unix)]
            let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok().map(|mut hup| {
                tokio::spawn(async move {
                    while hup.recv().await.is_some() {
                        tracing::info!("SIGHUP: no TLS certificates to reload");
                    }
                })
            });
            let served = router.serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown).await;
            #[cfg(unix)]
            if let Some(h) = hup {
                h.abort();
            }
            served
        }
    }
    .map_err(|source| RuntimeError::Serve { addr, source })
}

/// Runs one agent: reconcile loop, coordinator client and gRPC server on `listener`, until `shutdown` completes.
pub async fn run(
    reconciler: Arc<Reconciler>,
    listener: TcpListener,
    options: RuntimeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), RuntimeError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let (handles, tasks) = start(reconciler, &options, stop_rx);
    let result = serve(&handles, listener, shutdown).await;
    let _ = stop_tx.send(true);
    for t in tasks {
        let _ = t.await;
    }
    result
}
