//! Pushing committed targets to the agents: the [`Pusher`] (the channel pool, what each node acknowledged, what it
//! was last pushed, the hand-overs it waits for) and the planner's `push_all`, one `ApplyLayout` per node with the
//! plan epoch; and the virtual clock's advance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_core::fleet::NodeHealth;
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::plan::GpuPlan;
use tessera_proto::v1;
use tessera_proto::v1::agent_client::AgentClient;
use tonic::transport::Channel;
use tracing::field::Empty;

use super::{Change, HANDOVER_LIMIT, Planner, as_i64};

/// One node's push: its id, agent address, the newest epoch among its GPUs' targets, every target by index, and the
/// jobs of the tenants they assign.
type NodePush = (NodeId, String, u64, Vec<(u32, GpuPlan)>, Vec<v1::TenantJobs>);

/// A push that could not be made or was not taken.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// No channel to the agent's address.
    #[error("agent: {0}")]
    Channel(#[from] crate::net::ChannelError),
    /// The agent answered with an error status.
    #[error("{code}: {message}")]
    Refused {
        /// The status code.
        code: tonic::Code,
        /// Its message.
        message: String,
    },
    /// No answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// The leader's side of its pushes: a channel per agent, the epoch each node acknowledged, the tenants each node was
/// last pushed (it runs them until its next push), and since when a node's push waits for a tenant's new home on
/// another node. Forgotten on a change of leadership ([`Pusher::reset`]).
pub(super) struct Pusher {
    /// Deadline of one push.
    timeout: Duration,
    /// This member's certificate for mutual TLS with agents (`None`: plaintext).
    tls: Option<tessera_auth::TlsFiles>,
    /// Per `node@address`: a client of its agent.
    agents: Mutex<HashMap<String, AgentClient<Channel>>>,
    /// Per node: the epoch it acknowledged from this leader.
    acked: Mutex<HashMap<NodeId, u64>>,
    /// Per node: the tenants of the targets this leader last pushed it, which it runs until its next push.
    pushed: Mutex<HashMap<NodeId, Vec<TenantId>>>,
    /// Per node: since when its push waits for a tenant's new home on another node to be ready (whatever the epoch:
    /// a newer plan does not restart the clock).
    handovers: Mutex<HashMap<NodeId, Instant>>,
}

impl Pusher {
    /// A pusher whose pushes wait at most `timeout`, with `tls` towards the agents.
    pub(super) fn new(timeout: Duration, tls: Option<tessera_auth::TlsFiles>) -> Pusher {
        Pusher {
            timeout,
            tls,
            agents: Mutex::default(),
            acked: Mutex::default(),
            pushed: Mutex::default(),
            handovers: Mutex::default(),
        }
    }

    /// A client of node `node`'s agent at `address` (with mutual TLS, the agent must present `node`'s certificate).
    fn agent(&self, node: &NodeId, address: &str) -> Result<AgentClient<Channel>, PushError> {
        let key = format!("{node}@{address}");
        let mut agents = self.agents.lock().expect("agents lock");
        if let Some(c) = agents.get(&key) {
            return Ok(c.clone());
        }
        let tls = self.tls.as_ref().map(|f| (f, node.as_str()));
        let channel = crate::net::channel(address, Duration::from_secs(1), Some(self.timeout), tls)?;
        let client = AgentClient::new(channel);
        agents.insert(key, client.clone());
        Ok(client)
    }

    /// Drops the channels, so the next pushes open new ones.
    fn forget_channels(&self) {
        self.agents.lock().expect("agents lock").clear();
    }

    /// Forgets what every node acknowledged and was pushed (on losing or gaining leadership).
    pub(super) fn reset(&self) {
        self.acked.lock().expect("acked lock").clear();
        self.pushed.lock().expect("pushed lock").clear();
    }

    /// The pushes of `work` that a node has not acknowledged (an epoch newer than the one it took).
    fn unacknowledged(&self, work: Vec<NodePush>) -> Vec<NodePush> {
        let acked = self.acked.lock().expect("acked lock");
        work.into_iter().filter(|(node, _, epoch, _, _)| acked.get(node).is_none_or(|a| a < epoch)).collect()
    }

    /// Holds back, as of `now`, the pushes that would take a tenant from a node (`leaving`) before its new home on
    /// another node is ready (`ready_elsewhere(tenant, node)`): a move between nodes is make-before-break too. A
    /// node waits at most [`HANDOVER_LIMIT`] from its first held push; one with nothing to push waits for nothing.
    fn hold_for_handovers(
        &self,
        pending: &mut Vec<NodePush>,
        leaving: &HashMap<NodeId, Vec<TenantId>>,
        ready_elsewhere: impl Fn(&TenantId, &NodeId) -> bool,
        now: Instant,
    ) {
        let mut handovers = self.handovers.lock().expect("handovers lock");
        handovers.retain(|n, _| pending.iter().any(|(node, ..)| node == n));
        pending.retain(|(node, _, epoch, _, _)| {
            let waiting: Vec<&TenantId> =
                leaving.get(node).into_iter().flatten().filter(|t| !ready_elsewhere(t, node)).collect();
            if waiting.is_empty() {
                handovers.remove(node);
                return true;
            }
            let since = *handovers.entry(node.clone()).or_insert_with(|| {
                tracing::info!(%node, epoch, ?waiting, "push waits for the tenants' new home to be ready");
                now
            });
            if now.duration_since(since) > HANDOVER_LIMIT {
                tracing::warn!(%node, epoch, ?waiting, "new home not ready after {HANDOVER_LIMIT:?}; pushing anyway");
                return true;
            }
            false
        });
    }

    /// Notes that `node` is being pushed targets assigning `tenants`: from now on it speaks only for them.
    fn sending(&self, node: &NodeId, mut tenants: Vec<TenantId>) {
        tenants.sort();
        tenants.dedup();
        self.pushed.lock().expect("pushed lock").insert(node.clone(), tenants);
    }

    /// Notes the agent's answer to the push of `epoch`: a stale answer means it already holds a newer epoch (from a
    /// newer plan), which counts as acknowledged too.
    fn acknowledged(&self, node: NodeId, epoch: u64, answer: &v1::ApplyLayoutResponse) {
        let acked = if answer.status == v1::ApplyStatus::Stale as i32 { answer.epoch.max(epoch) } else { epoch };
        self.acked.lock().expect("acked lock").insert(node, acked);
    }

    /// The tenants of the targets last pushed to `node` (empty when none).
    fn pushed_tenants(&self, node: &NodeId) -> Vec<TenantId> {
        self.pushed.lock().expect("pushed lock").get(node).cloned().unwrap_or_default()
    }
}

impl Planner {
    /// Notes an agent's report that `gpu` applied the target of `epoch` (the `reconfiguration_seconds` metric).
    pub fn layout_applied(&self, gpu: &GpuId, epoch: u64) {
        self.metrics.layout_applied(&gpu.to_string(), epoch);
    }

    /// Drops the connections to agents, so the next pushes open new ones (after the certificates were reloaded).
    pub fn forget_agent_channels(&self) {
        self.pusher.forget_channels();
    }

    /// The tenants of the targets this leader last pushed `node` (empty when none): the work it still runs while a
    /// push that moves it elsewhere waits for the new home.
    pub fn pushed_tenants(&self, node: &NodeId) -> Vec<TenantId> {
        self.pusher.pushed_tenants(node)
    }

    /// Pushes every node whose committed targets it has not acknowledged; returns (pushed, failed).
    /// `changed` lists the GPUs whose layout this round changes. Within a `round`, each push is a client span
    /// `tessera.v1.Agent/ApplyLayout` whose trace context travels in the call's metadata.
    pub async fn push_all(&self, round: Option<&tracing::Span>, changed: &[Change]) -> (u32, u32) {
        if self.node.not_leader().is_some() {
            return (0, 0);
        }
        // Per node: its address, the newest epoch among its GPUs' targets, and all its targets.
        let work: Vec<NodePush> = self.node.read(|s| {
            s.fleet
                .nodes
                .iter()
                // A failed node is not pushed to; it gets its target when it heartbeats again.
                .filter(|(_, n)| n.health != NodeHealth::Failed)
                .filter_map(|(node, n)| {
                    let mut epoch = 0;
                    let mut targets = Vec::new();
                    for idx in &n.gpus {
                        let g = s.fleet.gpus.get(&GpuId::new(node.clone(), *idx))?;
                        if let Some(t) = &g.target {
                            epoch = epoch.max(g.target_epoch);
                            targets.push((*idx, t.clone()));
                        }
                    }
                    // The jobs of the tenants placed here travel with the targets, so the node's supervisor can run
                    // them (a tenant without jobs is bookkeeping only).
                    let tenants: std::collections::BTreeSet<&tessera_core::ids::TenantId> =
                        targets.iter().flat_map(|(_, t)| t.assignments.iter().map(|a| &a.tenant)).collect();
                    let jobs = tenants
                        .into_iter()
                        .filter_map(|t| s.fleet.tenants.get(t).map(|spec| (t, spec)))
                        .filter(|(_, spec)| !spec.jobs.is_empty())
                        .map(|(t, spec)| v1::TenantJobs { tenant: t.to_string(), ..(&spec.jobs).into() })
                        .collect();
                    (!targets.is_empty()).then(|| (node.clone(), n.address.clone(), epoch, targets, jobs))
                })
                .collect()
        });
        let mut pending = self.pusher.unacknowledged(work);
        // A node that would stop serving a tenant whose new home is another node waits (its push is retried every
        // half second) until that home reports the tenant ready.
        let leaving: HashMap<NodeId, Vec<TenantId>> = self.node.read(|s| {
            pending.iter().map(|(node, ..)| (node.clone(), crate::routes::moves_away(&s.fleet, node))).collect()
        });
        self.pusher.hold_for_handovers(
            &mut pending,
            &leaving,
            |t, node| self.routes.ready_elsewhere(t, node),
            Instant::now(),
        );
        let mut calls = Vec::new();
        for (node, address, epoch, targets, jobs) in pending {
            let span = match round {
                Some(parent) => {
                    let here: Vec<&Change> = changed.iter().filter(|c| c.gpu.node == node).collect();
                    let span = tracing::info_span!(
                        parent: parent, "tessera.v1.Agent/ApplyLayout",
                        otel.kind = "client",
                        rpc.system = "grpc",
                        rpc.service = "tessera.v1.Agent",
                        rpc.method = "ApplyLayout",
                        server.address = %server_host(&address),
                        server.port = server_port(&address),
                        tessera.node = %node,
                        tessera.plan.epoch = as_i64(epoch),
                        tessera.reconfiguration.steps = here.iter().map(|c| c.steps as i64).sum::<i64>(),
                        tessera.push.result = Empty,
                        otel.status_code = Empty,
                        otel.status_description = Empty,
                    );
                    use crate::telemetry::OpenTelemetrySpanExt as _;
                    let strings = |f: &dyn Fn(&Change) -> String| {
                        opentelemetry::Value::Array(opentelemetry::Array::String(
                            here.iter().map(|c| f(c).into()).collect(),
                        ))
                    };
                    span.set_attribute(
                        "tessera.gpus",
                        opentelemetry::Value::Array(opentelemetry::Array::I64(
                            here.iter().map(|c| i64::from(c.gpu.index)).collect(),
                        )),
                    );
                    span.set_attribute("tessera.layouts.from", strings(&|c| c.from.clone()));
                    span.set_attribute("tessera.layouts.to", strings(&|c| c.to.clone()));
                    span
                }
                None => tracing::Span::none(),
            };
            let client = self.pusher.agent(&node, &address);
            // From now on the node speaks only for the tenants of this push; those it is losing leave the routes
            // before the node drains them (their new home is ready), not a heartbeat after.
            self.pusher.sending(
                &node,
                targets.iter().flat_map(|(_, t)| t.assignments.iter().map(|a| a.tenant.clone())).collect(),
            );
            if let Some(gone) = leaving.get(&node).filter(|g| !g.is_empty()) {
                self.routes.withdraw(&node, gone);
            }
            let timeout = self.pusher.timeout;
            let term = self.node.status().term;
            calls.push(async move {
                let mut req = tonic::Request::new(v1::ApplyLayoutRequest {
                    epoch,
                    term,
                    jobs,
                    targets: targets
                        .iter()
                        .map(|(idx, plan)| v1::GpuTarget { gpu: *idx, plan: Some(plan.into()) })
                        .collect(),
                });
                crate::telemetry::inject_context(&span, req.metadata_mut());
                let result = match client {
                    Err(e) => Err(e),
                    Ok(mut c) => match tokio::time::timeout(timeout, c.apply_layout(req)).await {
                        Ok(Ok(r)) => Ok(r.into_inner()),
                        Ok(Err(s)) => Err(PushError::Refused { code: s.code(), message: s.message().to_string() }),
                        Err(_) => Err(PushError::Timeout(timeout)),
                    },
                };
                (node, epoch, result, span)
            });
        }
        let results = futures::future::join_all(calls).await;
        let (mut ok, mut failed) = (0, 0);
        for (node, epoch, result, span) in results {
            let label = match &result {
                Ok(r) if r.status == v1::ApplyStatus::Stale as i32 => "stale",
                Ok(_) => "ok",
                Err(_) => "error",
            };
            span.record("tessera.push.result", label);
            crate::telemetry::record_status(&span, &result);
            drop(span);
            self.metrics.push(label);
            self.detector.pushed(&node, result.as_ref().map(drop));
            match result {
                Ok(r) => {
                    ok += 1;
                    self.pusher.acknowledged(node, epoch, &r);
                }
                Err(e) => {
                    failed += 1;
                    tracing::warn!(%node, epoch, error = %e, "push to agent failed; retried by the pusher");
                }
            }
        }
        (ok, failed)
    }

    /// Moves every agent's virtual workload clock to `now_ms` (nodes on the wall clock refuse; that is logged).
    pub async fn advance_agents(&self, now_ms: u64) {
        let addresses: Vec<(NodeId, String)> =
            self.node.read(|s| s.fleet.nodes.iter().map(|(id, n)| (id.clone(), n.address.clone())).collect());
        let calls = addresses.into_iter().map(|(node, address)| {
            let client = self.pusher.agent(&node, &address);
            async move {
                let mut c = client.map_err(|e| e.to_string())?;
                c.advance_clock(v1::AdvanceClockRequest { to_ms: now_ms })
                    .await
                    .map_err(|s| format!("{address}: {}: {}", s.code(), s.message()))
            }
        });
        for r in futures::future::join_all(calls).await {
            if let Err(e) = r {
                tracing::warn!(error = %e, "could not advance an agent's clock");
            }
        }
    }
}

/// The host of an agent's address (`host:port`, `http://host:port` or `[v6]:port`), as OpenTelemetry's
/// `server.address` wants it (the port goes to `server.port`).
fn server_host(address: &str) -> &str {
    let a = address.split_once("://").map_or(address, |(_, rest)| rest);
    let host = a.rsplit_once(':').filter(|(_, p)| p.parse::<u16>().is_ok()).map_or(a, |(h, _)| h);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The port of an agent's address (0 when it names none).
fn server_port(address: &str) -> i64 {
    address.rsplit_once(':').and_then(|(_, p)| p.trim_end_matches('/').parse::<u16>().ok()).map_or(0, i64::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeId {
        NodeId::new(name).unwrap()
    }

    fn push(name: &str, epoch: u64) -> NodePush {
        (node(name), format!("{name}:7100"), epoch, Vec::new(), Vec::new())
    }

    fn names(pushes: &[NodePush]) -> Vec<String> {
        pushes.iter().map(|(n, ..)| n.to_string()).collect()
    }

    fn answer(status: v1::ApplyStatus, epoch: u64) -> v1::ApplyLayoutResponse {
        v1::ApplyLayoutResponse { status: status as i32, epoch }
    }

    #[test]
    fn a_node_is_pushed_until_it_acknowledges_the_newest_epoch() {
        let p = Pusher::new(Duration::from_secs(5), None);
        assert_eq!(names(&p.unacknowledged(vec![push("a", 3), push("b", 3)])), ["a", "b"]);
        p.acknowledged(node("a"), 3, &answer(v1::ApplyStatus::Accepted, 3));
        assert_eq!(names(&p.unacknowledged(vec![push("a", 3), push("b", 3)])), ["b"]);
        assert_eq!(names(&p.unacknowledged(vec![push("a", 4)])), ["a"], "a newer epoch is owed again");
        // A stale answer: the agent holds a newer epoch already, which counts as taken.
        p.acknowledged(node("b"), 3, &answer(v1::ApplyStatus::Stale, 7));
        assert!(p.unacknowledged(vec![push("b", 6), push("b", 7)]).is_empty());
        p.reset();
        assert_eq!(names(&p.unacknowledged(vec![push("a", 3)])), ["a"], "a new leader knows nothing acknowledged");
    }

    #[test]
    fn a_node_speaks_for_the_tenants_it_was_last_pushed() {
        let p = Pusher::new(Duration::from_secs(5), None);
        assert!(p.pushed_tenants(&node("a")).is_empty());
        let t = |n: &str| TenantId::new(n).unwrap();
        p.sending(&node("a"), vec![t("y"), t("x"), t("y")]);
        assert_eq!(p.pushed_tenants(&node("a")), [t("x"), t("y")]);
        p.sending(&node("a"), vec![t("z")]);
        assert_eq!(p.pushed_tenants(&node("a")), [t("z")]);
        p.reset();
        assert!(p.pushed_tenants(&node("a")).is_empty());
    }

    #[test]
    fn a_push_that_moves_a_tenant_away_waits_for_its_new_home_at_most_the_limit() {
        let p = Pusher::new(Duration::from_secs(5), None);
        let moved = TenantId::new("t").unwrap();
        let leaving = HashMap::from([(node("a"), vec![moved.clone()])]);
        let start = Instant::now();
        let mut pending = vec![push("a", 2), push("b", 2)];
        p.hold_for_handovers(&mut pending, &leaving, |_, _| false, start);
        assert_eq!(names(&pending), ["b"], "a waits, b has nothing to hand over");
        // Still not ready just before the limit, from the first wait (a newer epoch does not restart the clock).
        let mut pending = vec![push("a", 3)];
        p.hold_for_handovers(&mut pending, &leaving, |_, _| false, start + HANDOVER_LIMIT);
        assert!(pending.is_empty());
        let mut pending = vec![push("a", 3)];
        p.hold_for_handovers(&mut pending, &leaving, |_, _| false, start + HANDOVER_LIMIT + Duration::from_secs(1));
        assert_eq!(names(&pending), ["a"], "past the limit the push goes anyway");
        // Once the new home is ready the push goes at once, and a later wait starts its clock afresh.
        let later = start + Duration::from_secs(1000);
        let mut pending = vec![push("a", 4)];
        p.hold_for_handovers(&mut pending, &leaving, |t, n| t == &moved && n == &node("a"), later);
        assert_eq!(names(&pending), ["a"]);
        let mut pending = vec![push("a", 5)];
        p.hold_for_handovers(&mut pending, &leaving, |_, _| false, later + Duration::from_secs(1));
        assert!(pending.is_empty(), "a fresh wait");
    }
}
