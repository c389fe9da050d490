//! Where the router learns the routes: the coordinator's `WatchRoutes` stream, or agents' `GetState`.

use std::time::Duration;

use tessera_proto::v1;
use tessera_proto::v1::agent_client::AgentClient;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tokio::sync::watch;
use tonic::transport::{Channel, Endpoint};

use crate::{Routes, Upstream};

/// The metadata key a coordinator names its leader with.
const LEADER_KEY: &str = "tessera-leader";

/// A coordinator or agent address the router cannot make a channel to.
#[derive(Debug, thiserror::Error)]
enum ChannelError {
    /// The address is not `HOST:PORT` or a URL.
    #[error("bad address {address}: {source}")]
    Address { address: String, source: tonic::transport::Error },
    /// The router's certificate files cannot be read.
    #[error("{0}")]
    Certificate(#[from] tessera_auth::AuthError),
    /// The TLS settings are refused.
    #[error("TLS settings for {address}: {source}")]
    Tls { address: String, source: tonic::transport::Error },
}

fn channel(address: &str, tls: Option<&tessera_auth::TlsFiles>) -> Result<Channel, ChannelError> {
    let host = address.strip_prefix("http://").or_else(|| address.strip_prefix("https://")).unwrap_or(address);
    let uri = if tls.is_some() { format!("https://{host}") } else { format!("http://{host}") };
    let mut e = Endpoint::from_shared(uri)
        .map_err(|source| ChannelError::Address { address: address.to_string(), source })?
        .connect_timeout(Duration::from_secs(1))
        .http2_keep_alive_interval(Duration::from_secs(1))
        .keep_alive_timeout(Duration::from_secs(2))
        .keep_alive_while_idle(true);
    if let Some(files) = tls {
        let config = files.client(tessera_auth::COORDINATOR_SERVER_NAME)?;
        e = e.tls_config(config).map_err(|source| ChannelError::Tls { address: address.to_string(), source })?;
    }
    Ok(e.connect_lazy())
}

/// The routes of a `WatchRoutes` message.
pub fn routes_from_wire(r: &v1::Routes) -> Routes {
    r.tenants
        .iter()
        .map(|t| {
            let ups = t
                .endpoints
                .iter()
                .map(|e| Upstream {
                    address: e.address.clone(),
                    node: e.node.clone(),
                    gpu: e.gpu,
                    placement: e.placement.as_ref().map(|p| format!("{}@{}", p.profile, p.start)).unwrap_or_default(),
                    mig_uuid: e.mig_uuid.clone(),
                    role: crate::role_word(e.role).to_string(),
                    state: e.state.clone(),
                })
                .collect();
            (t.tenant.clone(), ups)
        })
        .collect()
}

/// Follows the routes of a coordinator cluster (`endpoints`, any members) until `tx` has no receiver: the stream of
/// one member at a time, moving to the leader a follower names, or to the next member, after a growing pause. The
/// routes are kept while no member answers (the instances keep serving when the coordinators are down).
pub async fn follow_coordinator(
    endpoints: Vec<String>,
    tls: Option<tessera_auth::TlsFiles>,
    tx: watch::Sender<Routes>,
) {
    let mut next: Option<String> = None;
    let mut i = 0usize;
    let mut pause = Duration::from_millis(50);
    while !tx.is_closed() {
        let address = next.take().unwrap_or_else(|| {
            i += 1;
            endpoints[i % endpoints.len()].clone()
        });
        match channel(&address, tls.as_ref()) {
            Err(e) => tracing::warn!("routes: {e}"),
            Ok(ch) => {
                let mut client = CoordinatorApiClient::new(ch);
                match client.watch_routes(v1::RoutesRequest { tenant: String::new() }).await {
                    Ok(stream) => {
                        let mut stream = stream.into_inner();
                        loop {
                            match stream.message().await {
                                Ok(Some(r)) => {
                                    pause = Duration::from_millis(50);
                                    let routes = routes_from_wire(&r);
                                    tx.send_if_modified(|old| {
                                        let changed = *old != routes;
                                        *old = routes;
                                        changed
                                    });
                                }
                                Ok(None) => break,
                                Err(s) => {
                                    next = leader_of(&s);
                                    break;
                                }
                            }
                        }
                    }
                    Err(s) => {
                        next = leader_of(&s);
                        if next.is_none() {
                            tracing::debug!(%address, "routes: {}", s.message());
                        }
                    }
                }
            }
        }
        if next.is_none() {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        } else {
            // Members that name each other (an election) are not a reason to spin.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn leader_of(s: &tonic::Status) -> Option<String> {
    s.metadata().get(LEADER_KEY).and_then(|v| v.to_str().ok()).filter(|v| !v.is_empty()).map(str::to_string)
}

fn host_of(address: &str) -> &str {
    let a = address.strip_prefix("http://").unwrap_or(address);
    a.rsplit_once(':').map_or(a, |(h, _)| h)
}

/// The routes in one agent's state: the endpoints its supervisor reports, on the agent's host.
pub fn routes_from_state(agent: &str, state: &v1::NodeState, into: &mut Routes) {
    for g in &state.gpus {
        for i in &g.instances {
            for e in &i.endpoints {
                into.entry(e.tenant.clone()).or_default().push(Upstream {
                    address: format!("{}:{}", host_of(agent), e.port),
                    node: state.node_id.clone(),
                    gpu: g.index,
                    placement: i.placement.as_ref().map(|p| format!("{}@{}", p.profile, p.start)).unwrap_or_default(),
                    mig_uuid: i.mig_uuid.clone(),
                    role: crate::role_word(e.role).to_string(),
                    state: e.state.clone(),
                });
            }
        }
    }
}

/// How long an agent that stopped answering keeps its routes (its jobs outlive it: an agent restarting does not
/// take its instances out of service), as the coordinator's route TTL.
pub const AGENT_SILENCE: Duration = Duration::from_secs(5);

/// Polls the agents' `GetState` every `interval` until `tx` has no receiver (a cluster without a coordinator). An
/// agent that does not answer keeps its last routes for [`AGENT_SILENCE`], then loses them.
pub async fn poll_agents(agents: Vec<String>, interval: Duration, tx: watch::Sender<Routes>) {
    let mut clients: Vec<Option<AgentClient<Channel>>> = agents.iter().map(|_| None).collect();
    let mut last: Vec<Option<v1::NodeState>> = agents.iter().map(|_| None).collect();
    let mut heard = vec![std::time::Instant::now(); agents.len()];
    while !tx.is_closed() {
        for (k, agent) in agents.iter().enumerate() {
            if clients[k].is_none() {
                clients[k] = channel(agent, None).ok().map(AgentClient::new);
            }
            let Some(c) = clients[k].as_mut() else { continue };
            let answer = tokio::time::timeout(Duration::from_secs(1), c.get_state(v1::GetStateRequest {})).await;
            match answer {
                Ok(Ok(s)) => {
                    last[k] = Some(s.into_inner());
                    heard[k] = std::time::Instant::now();
                }
                _ => {
                    if heard[k].elapsed() > AGENT_SILENCE {
                        last[k] = None;
                    }
                    // A new connection next round (a restarted agent).
                    clients[k] = None;
                }
            }
        }
        let mut routes = Routes::new();
        for (k, state) in last.iter().enumerate() {
            if let Some(s) = state {
                routes_from_state(&agents[k], s, &mut routes);
            }
        }
        tx.send_if_modified(|old| {
            let changed = *old != routes;
            *old = routes;
            changed
        });
        tokio::time::sleep(interval).await;
    }
}
