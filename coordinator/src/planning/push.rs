//! Pushing committed targets to the agents: the channel pool, one `ApplyLayout` per node with the plan epoch, the
//! acknowledgements, the hand-over of a tenant moved between nodes, and the virtual clock's advance.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tessera_core::fleet::NodeHealth;
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::plan::GpuPlan;
use tessera_proto::v1;
use tessera_proto::v1::agent_client::AgentClient;
use tonic::transport::Channel;
use tracing::field::Empty;

use super::{Change, HANDOVER_LIMIT, Planner, as_i64};

/// One node's push: its id, agent address, the newest epoch among its GPUs' targets, and every target by index.
/// One node's push: its id, address, newest target epoch, targets, and the jobs of the tenants they assign.
type NodePush = (NodeId, String, u64, Vec<(u32, GpuPlan)>, Vec<v1::TenantJobs>);

impl Planner {
    /// Notes an agent's report that `gpu` applied the target of `epoch` (the `reconfiguration_seconds` metric).
    pub fn layout_applied(&self, gpu: &GpuId, epoch: u64) {
        self.metrics.layout_applied(&gpu.to_string(), epoch);
    }

    /// A client of node `node`'s agent at `address` (with mutual TLS, the agent must present `node`'s certificate).
    /// Drops the connections to agents, so the next pushes open new ones (after the certificates were reloaded).
    pub fn forget_agent_channels(&self) {
        self.agents.lock().expect("agents lock").clear();
    }

    fn agent(&self, node: &NodeId, address: &str) -> Result<AgentClient<Channel>, String> {
        let key = format!("{node}@{address}");
        let mut agents = self.agents.lock().expect("agents lock");
        if let Some(c) = agents.get(&key) {
            return Ok(c.clone());
        }
        let tls = self.settings.tls.as_ref().map(|f| (f, node.as_str()));
        let channel = crate::net::channel(address, Duration::from_secs(1), Some(self.settings.push_timeout), tls)
            .map_err(|e| format!("agent: {e}"))?;
        let client = AgentClient::new(channel);
        agents.insert(key, client.clone());
        Ok(client)
    }

    /// The tenants of the targets this leader last pushed `node` (empty when none): the work it still runs while a
    /// push that moves it elsewhere waits for the new home.
    pub fn pushed_tenants(&self, node: &NodeId) -> Vec<TenantId> {
        self.pushed.lock().expect("pushed lock").get(node).cloned().unwrap_or_default()
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
        let mut pending: Vec<_> = {
            let acked = self.acked.lock().expect("acked lock");
            work.into_iter().filter(|(node, _, epoch, _, _)| acked.get(node).is_none_or(|a| a < epoch)).collect()
        };
        // A node that would stop serving a tenant whose new home is another node waits (its push is retried every
        // half second) until that home reports the tenant ready: a move between nodes is make-before-break too.
        let leaving: HashMap<NodeId, Vec<TenantId>> = self.node.read(|s| {
            pending.iter().map(|(node, ..)| (node.clone(), crate::routes::moves_away(&s.fleet, node))).collect()
        });
        {
            let mut handovers = self.handovers.lock().expect("handovers lock");
            // A node with nothing to push waits for nothing: a later wait starts its clock afresh.
            handovers.retain(|n, _| pending.iter().any(|(node, ..)| node == n));
            pending.retain(|(node, _, epoch, _, _)| {
                let waiting: Vec<&TenantId> = leaving
                    .get(node)
                    .into_iter()
                    .flatten()
                    .filter(|t| !self.routes.ready_elsewhere(t, node))
                    .collect();
                if waiting.is_empty() {
                    handovers.remove(node);
                    return true;
                }
                let since = *handovers.entry(node.clone()).or_insert_with(|| {
                    tracing::info!(%node, epoch, ?waiting, "push waits for the tenants' new home to be ready");
                    Instant::now()
                });
                if since.elapsed() > HANDOVER_LIMIT {
                    tracing::warn!(%node, epoch, ?waiting, "new home not ready after {HANDOVER_LIMIT:?}; pushing anyway");
                    return true;
                }
                false
            });
        }
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
            let client = self.agent(&node, &address);
            let mut tenants: Vec<TenantId> =
                targets.iter().flat_map(|(_, t)| t.assignments.iter().map(|a| a.tenant.clone())).collect();
            tenants.sort();
            tenants.dedup();
            // From now on the node speaks only for the tenants of this push; those it is losing leave the routes
            // before the node drains them (their new home is ready), not a heartbeat after.
            self.pushed.lock().expect("pushed lock").insert(node.clone(), tenants);
            if let Some(gone) = leaving.get(&node).filter(|g| !g.is_empty()) {
                self.routes.withdraw(&node, gone);
            }
            let timeout = self.settings.push_timeout;
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
                        Ok(Err(s)) => Err(format!("{}: {}", s.code(), s.message())),
                        Err(_) => Err(format!("no answer within {timeout:?}")),
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
            self.detector.pushed(&node, result.as_ref().map(drop).map_err(String::as_str));
            match result {
                Ok(r) => {
                    ok += 1;
                    // A stale answer means the agent already holds a newer epoch (from a newer plan): done.
                    let acked = if r.status == v1::ApplyStatus::Stale as i32 { r.epoch.max(epoch) } else { epoch };
                    self.acked.lock().expect("acked lock").insert(node, acked);
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
            let client = self.agent(&node, &address);
            async move {
                let mut c = client?;
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
