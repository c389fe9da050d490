//! The coordinator client: registers the node, then heartbeats its observed state and workload metrics. When the
//! coordinator is unreachable it retries with exponential backoff (capped) and the node keeps its last layout: the
//! reconcile loop does not depend on the coordinator, only on the targets it already accepted.
//!
//! A heartbeat answered with `registered = false` (the coordinator lost or never had the node) makes the client
//! register again. Backoff has no jitter: the agent never reads a random number generator (runs stay reproducible).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tessera_core::fleet::GpuDescriptor;
use tessera_core::layout::Layout;
use tessera_proto::v1;
use tessera_proto::v1::coordinator_client::CoordinatorClient;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::authority::{Authority, Leadership, RefreshRequests};
use crate::backend::{BackendError, MigBackend};
use crate::reconcile::Reconciler;
use crate::service::node_state_to_wire;

/// How the client talks to the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientOptions {
    /// The coordinator's address (`http://host:port`, or `host:port`), or a cluster's addresses comma-separated: on
    /// a failure the agent moves on to the next.
    pub endpoint: String,
    /// The address the coordinator should use to reach this agent's service.
    pub advertise: String,
    /// Time between heartbeats (the coordinator may ask for another in its register answer).
    pub heartbeat_interval: Duration,
    /// First retry delay after a failure; doubles per failure.
    pub backoff_initial: Duration,
    /// Longest retry delay.
    pub backoff_max: Duration,
    /// Deadline of one call.
    pub rpc_timeout: Duration,
    /// Mutual TLS with the coordinators (this node's certificate; they must present a coordinator's).
    pub tls: Option<tessera_auth::TlsFiles>,
}

pub use crate::metrics::ClientStats;

/// Exponential backoff: `initial`, doubling, at most `max`.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff starting at `initial`, capped at `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff { initial, max, next: initial.min(max) }
    }

    /// The delay before the next retry; the one after is twice as long, up to the cap.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// Back to the initial delay (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial.min(self.max);
    }
}

/// The node's GPUs as it registers them, read from the backend now: those the catalog knows (others cannot take a
/// layout), with the layout they have.
pub fn gpu_descriptors(backend: &dyn MigBackend) -> Result<Vec<GpuDescriptor>, BackendError> {
    let mut out = Vec::new();
    for g in backend.gpus()? {
        let Some(model) = g.model else { continue };
        let mig_enabled = g.mig.is_some_and(|m| m.current);
        let layout = if mig_enabled { backend.layout(g.index)? } else { Layout::empty() };
        // The driver's memory per profile, where it differs from the catalog: the coordinator plans with it.
        let memory_gib = match backend.driver_table(g.index) {
            Ok(Some(t)) => t
                .profiles
                .iter()
                .filter(|p| model.profile(p.profile).is_some_and(|c| (c.memory_gib - p.memory_gib()).abs() > 0.01))
                .map(|p| (p.profile, p.memory_gib()))
                .collect(),
            Ok(None) => Default::default(),
            Err(e) => {
                tracing::warn!(gpu = g.index, "cannot read the driver's MIG table; registering the catalog's: {e}");
                Default::default()
            }
        };
        out.push(GpuDescriptor { index: g.index, model, mig_enabled, layout, memory_gib });
    }
    Ok(out)
}

/// What the client feeds [`Authority`]: the coordinators' answers about who leads, and calls on demand when a push
/// needs checking against a fresh answer.
#[derive(Debug)]
pub struct Learner {
    /// Where answers go.
    pub authority: Arc<Authority>,
    /// Requests for a call now.
    pub refresh: RefreshRequests,
}

enum Step {
    Registered(Option<Duration>),
    Heartbeat { known: bool },
}

async fn call(
    client: &mut CoordinatorClient<Channel>,
    reconciler: &Arc<Reconciler>,
    options: &ClientOptions,
    registered: bool,
    authority: &Authority,
) -> Result<Step, tonic::Status> {
    let node_id = reconciler.node().to_string();
    let r = reconciler.clone();
    let blocking_failed = |e: tokio::task::JoinError| tonic::Status::internal(format!("agent task failed: {e}"));
    if registered {
        let status = tokio::task::spawn_blocking(move || r.status()).await.map_err(blocking_failed)?;
        let req = v1::HeartbeatRequest {
            state: Some(node_state_to_wire(&status, &node_id)),
            revocations_index: authority.revocations_index(),
        };
        let resp = client.heartbeat(req).await?.into_inner();
        if let Some(l) = &resp.leadership {
            learn(authority, l);
        }
        Ok(Step::Heartbeat { known: resp.registered })
    } else {
        let gpus = tokio::task::spawn_blocking(move || gpu_descriptors(r.backend().as_ref()))
            .await
            .map_err(blocking_failed)?
            .map_err(|e| tonic::Status::unavailable(format!("cannot read the GPUs: {e}")))?;
        let req = v1::RegisterRequest {
            node_id,
            address: options.advertise.clone(),
            gpus: gpus.iter().map(Into::into).collect(),
        };
        let resp = client.register(req).await?.into_inner();
        if let Some(l) = &resp.leadership {
            learn(authority, l);
        }
        Ok(Step::Registered(
            (resp.heartbeat_interval_ms > 0).then(|| Duration::from_millis(resp.heartbeat_interval_ms)),
        ))
    }
}

/// Asks every member who leads, at once, each within `timeout`: the answers of those that answered.
async fn ask_every_member(
    clients: &[(String, CoordinatorClient<Channel>)],
    node_id: &str,
    timeout: Duration,
) -> Vec<Leadership> {
    let mut asked = tokio::task::JoinSet::new();
    for (address, client) in clients {
        let (address, mut client) = (address.clone(), client.clone());
        let req = v1::LeadershipRequest { node_id: node_id.to_string() };
        asked.spawn(async move {
            match tokio::time::timeout(timeout, client.get_leadership(req)).await {
                Ok(Ok(answer)) => Some(Leadership::from(&answer.into_inner())),
                Ok(Err(e)) => {
                    tracing::debug!(%address, "no leadership answer: {}: {}", e.code(), e.message());
                    None
                }
                Err(_) => None,
            }
        });
    }
    asked.join_all().await.into_iter().flatten().collect()
}

/// Records what an answer says about who leads, and the revocation list it carries, if any.
fn learn(authority: &Authority, l: &v1::Leadership) {
    authority.learn(Leadership::from(l));
    if let Some(list) = &l.revocations
        && let Err(e) = authority.learn_revocations(list)
    {
        tracing::warn!("{e}; keeping the list held");
    }
}

/// A coordinator address that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// No address at all.
    #[error("no coordinator address given")]
    None,
    /// An address that does not make an endpoint, or whose TLS settings are refused.
    #[error("coordinator address `{address}`: {message}")]
    Bad {
        /// The address.
        address: String,
        /// Why.
        message: String,
    },
}

/// A client for each coordinator address (one, or a cluster's, comma-separated: any member serves an agent, and a
/// failing one makes the agent move on to the next).
fn connect_all(options: &ClientOptions) -> Result<Vec<(String, CoordinatorClient<Channel>)>, AddressError> {
    let mut clients = Vec::new();
    for address in options.endpoint.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let host = address.split_once("://").map_or(address, |(_, h)| h);
        let uri = if options.tls.is_some() { format!("https://{host}") } else { format!("http://{host}") };
        let endpoint = Endpoint::from_shared(uri).map_err(|e| e.to_string()).and_then(|e| match &options.tls {
            None => Ok(e),
            Some(t) => t
                .client(tessera_auth::COORDINATOR_SERVER_NAME)
                .map_err(|e| e.to_string())
                .and_then(|c| e.tls_config(c).map_err(|e| e.to_string())),
        });
        let e = endpoint.map_err(|message| AddressError::Bad { address: address.to_string(), message })?;
        clients.push((
            address.to_string(),
            CoordinatorClient::new(e.connect_timeout(options.rpc_timeout).timeout(options.rpc_timeout).connect_lazy()),
        ));
    }
    if clients.is_empty() {
        return Err(AddressError::None);
    }
    Ok(clients)
}

/// Registers and heartbeats until `shutdown` turns true. Never returns an error: an unreachable or failing
/// coordinator is retried with backoff.
pub async fn run(
    options: ClientOptions,
    reconciler: Arc<Reconciler>,
    stats: Arc<ClientStats>,
    learner: Learner,
    mut shutdown: watch::Receiver<bool>,
) {
    let Learner { authority, mut refresh } = learner;
    // Refresh requests waiting for the next call to start.
    let mut waiting = Vec::new();
    let mut clients = match connect_all(&options) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("{e}; not reporting");
            return;
        }
    };
    // Rotated certificates (new files) are used from the next call on: the connections are opened again.
    let mut stamped = options.tls.as_ref().map(tessera_auth::TlsFiles::stamps);
    let mut current = 0;
    let mut backoff = Backoff::new(options.backoff_initial, options.backoff_max);
    let mut interval = options.heartbeat_interval;
    let mut registered = false;
    loop {
        if let Some(files) = &options.tls {
            let stamp = files.stamps();
            if stamped.as_ref() != Some(&stamp) {
                match connect_all(&options) {
                    Ok(c) => {
                        tracing::info!(node = %reconciler.node(), "TLS files changed; reconnecting to the coordinators");
                        clients = c;
                        current = 0;
                    }
                    Err(e) => tracing::error!("{e}; keeping the connections in use"),
                }
                stamped = Some(stamp);
            }
        }
        let address = clients[current].0.clone();
        // Requests made before this call starts are answered when it returns.
        while let Ok(r) = refresh.try_recv() {
            waiting.push(r);
        }
        let answering = std::mem::take(&mut waiting);
        if !answering.is_empty() && authority.quorum_of().is_some() {
            // A push waits to be checked: ask every member who leads.
            let answers = ask_every_member(&clients, reconciler.node().as_str(), options.rpc_timeout).await;
            authority.confirm(&answers);
        }
        let client = &mut clients[current].1;
        let outcome = call(client, &reconciler, &options, registered, &authority).await;
        for r in answering {
            let _ = r.send(());
        }
        let wait = match outcome {
            Ok(Step::Registered(asked)) => {
                registered = true;
                stats.registered.store(true, Ordering::SeqCst);
                stats.registrations.fetch_add(1, Ordering::SeqCst);
                interval = asked.unwrap_or(options.heartbeat_interval);
                backoff.reset();
                tracing::info!(node = %reconciler.node(), "registered with the coordinator");
                // The first heartbeat follows at once, with the full state.
                Duration::ZERO
            }
            Ok(Step::Heartbeat { known: true }) => {
                stats.heartbeats.fetch_add(1, Ordering::SeqCst);
                backoff.reset();
                interval
            }
            Ok(Step::Heartbeat { known: false }) => {
                registered = false;
                stats.registered.store(false, Ordering::SeqCst);
                tracing::info!(node = %reconciler.node(), "the coordinator does not know this node; registering again");
                Duration::ZERO
            }
            Err(e) => {
                stats.failures.fetch_add(1, Ordering::SeqCst);
                let delay = backoff.next_delay();
                tracing::warn!(
                    node = %reconciler.node(),
                    "coordinator {address} unreachable or failing ({}: {}); keeping the current layout, retrying in \
                     {delay:?}",
                    e.code(),
                    e.message()
                );
                current = (current + 1) % clients.len();
                delay
            }
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            // A push to check: call at once.
            Some(r) = refresh.recv() => waiting.push(r),
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let d: Vec<u128> = (0..4).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(d, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
    }
}
