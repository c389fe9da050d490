//! Where each tenant is served now: the endpoints of its supervised jobs, as the agents report them in their
//! heartbeats (host from the node's registered address, port, GPU, instance, MIG UUID, state), served by
//! `GetRoutes` and `WatchRoutes` so that a front end (the `router` binary, or nginx fed by it) sends requests only to
//! ready instances.
//!
//! Routes are the leader's soft state, not replicated: every agent heartbeats the leader, so a new leader knows every
//! node's endpoints one heartbeat after it is elected, and a replicated copy would cost a Raft write per readiness
//! change. What an agent reports is believed only for the tenants the committed targets place on its node (an agent
//! speaks for its own work), on its own registered host, and bounded in number. A node silent for [`ROUTE_TTL`]
//! loses its routes.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_core::ids::{NodeId, TenantId};
use tessera_proto::v1;
use tokio::sync::watch;

/// A node not heard from for this long has no routes.
pub const ROUTE_TTL: Duration = Duration::from_secs(5);
/// Most endpoints one node may report.
pub const MAX_ENDPOINTS_PER_NODE: usize = 1024;

#[derive(Debug)]
struct NodeRoutes {
    heard: Instant,
    endpoints: Vec<(TenantId, v1::RouteEndpoint)>,
}

/// The route table: see the [module documentation](self).
#[derive(Debug)]
pub struct RouteTable {
    nodes: Mutex<BTreeMap<NodeId, NodeRoutes>>,
    version: watch::Sender<u64>,
}

impl Default for RouteTable {
    fn default() -> Self {
        RouteTable { nodes: Mutex::new(BTreeMap::new()), version: watch::channel(0).0 }
    }
}

fn host_of(address: &str) -> &str {
    let a = address.strip_prefix("http://").or_else(|| address.strip_prefix("https://")).unwrap_or(address);
    match a.rsplit_once(':') {
        Some((h, _)) => h,
        None => a,
    }
}

impl RouteTable {
    /// Takes node `node`'s heartbeat `state`: its endpoints replace the node's previous ones. `address` is the
    /// node's registered address (its host is the endpoints' host); `placed` are the tenants the committed targets
    /// place on the node: endpoints of other tenants are ignored.
    pub fn heard(&self, node: &NodeId, address: &str, state: &v1::NodeState, placed: &[TenantId]) {
        let host = host_of(address);
        let mut endpoints = Vec::new();
        'gpus: for g in &state.gpus {
            for i in &g.instances {
                for e in &i.endpoints {
                    if endpoints.len() >= MAX_ENDPOINTS_PER_NODE {
                        tracing::warn!(%node, "more than {MAX_ENDPOINTS_PER_NODE} endpoints reported; the rest ignored");
                        break 'gpus;
                    }
                    let Ok(tenant) = TenantId::new(e.tenant.clone()) else { continue };
                    let port = u16::try_from(e.port).unwrap_or(0);
                    if port == 0
                        || !placed.contains(&tenant)
                        || !matches!(e.state.as_str(), "starting" | "ready" | "draining")
                    {
                        continue;
                    }
                    endpoints.push((
                        tenant,
                        v1::RouteEndpoint {
                            node: node.to_string(),
                            address: format!("{host}:{port}"),
                            gpu: g.index,
                            placement: i.placement.clone(),
                            mig_uuid: i.mig_uuid.chars().take(64).collect(),
                            role: e.role,
                            state: e.state.clone(),
                        },
                    ));
                }
            }
        }
        let mut nodes = self.nodes.lock().expect("routes lock");
        let changed = nodes.get(node).is_none_or(|n| n.endpoints != endpoints);
        nodes.insert(node.clone(), NodeRoutes { heard: Instant::now(), endpoints });
        drop(nodes);
        if changed {
            self.version.send_modify(|v| *v += 1);
        }
    }

    /// Drops routes of nodes not heard from for [`ROUTE_TTL`]; true when some were dropped.
    fn expire(&self) -> bool {
        let mut nodes = self.nodes.lock().expect("routes lock");
        let before = nodes.len();
        nodes.retain(|_, n| n.heard.elapsed() < ROUTE_TTL);
        let dropped = nodes.len() != before;
        drop(nodes);
        if dropped {
            self.version.send_modify(|v| *v += 1);
        }
        dropped
    }

    /// The routes now, of `tenant` only when given.
    pub fn snapshot(&self, tenant: Option<&TenantId>, leader_id: u64) -> v1::Routes {
        self.expire();
        let nodes = self.nodes.lock().expect("routes lock");
        let mut by_tenant: BTreeMap<&TenantId, Vec<v1::RouteEndpoint>> = BTreeMap::new();
        for n in nodes.values() {
            for (t, e) in &n.endpoints {
                if tenant.is_none_or(|x| x == t) {
                    by_tenant.entry(t).or_default().push(e.clone());
                }
            }
        }
        v1::Routes {
            version: *self.version.borrow(),
            tenants: by_tenant
                .into_iter()
                .map(|(t, endpoints)| v1::TenantRoute { tenant: t.to_string(), endpoints })
                .collect(),
            leader_id,
        }
    }

    /// Waits until the routes change, or `timeout` passes (expiries are noticed then).
    pub async fn changed(&self, seen: u64, timeout: Duration) {
        let mut rx = self.version.subscribe();
        if *rx.borrow() != seen {
            return;
        }
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v != seen)).await;
        self.expire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(tenant: &str, port: u32, st: &str) -> v1::NodeState {
        v1::NodeState {
            node_id: "n".into(),
            gpus: vec![v1::GpuState {
                index: 1,
                instances: vec![v1::Instance {
                    placement: Some(v1::Placement { profile: "3g".into(), start: 4 }),
                    mig_uuid: "MIG-1".into(),
                    endpoints: vec![v1::Endpoint { tenant: tenant.into(), role: 1, port, state: st.into() }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn endpoints_come_from_heartbeats_of_nodes_that_host_the_tenant() {
        let t = RouteTable::default();
        let node = NodeId::new("n").unwrap();
        let a = TenantId::new("a").unwrap();
        t.heard(&node, "10.0.0.5:7000", &state("a", 9001, "ready"), std::slice::from_ref(&a));
        let r = t.snapshot(None, 1);
        assert_eq!(r.version, 1);
        assert_eq!(r.tenants.len(), 1);
        let e = &r.tenants[0].endpoints[0];
        assert_eq!((e.address.as_str(), e.gpu, e.state.as_str()), ("10.0.0.5:9001", 1, "ready"));
        // The same report again changes nothing; a new state does.
        t.heard(&node, "10.0.0.5:7000", &state("a", 9001, "ready"), std::slice::from_ref(&a));
        assert_eq!(t.snapshot(None, 1).version, 1);
        t.heard(&node, "10.0.0.5:7000", &state("a", 9001, "draining"), std::slice::from_ref(&a));
        assert_eq!(t.snapshot(None, 1).version, 2);
        // A tenant the node does not host, a port 0 or an unknown state are not believed.
        t.heard(&node, "10.0.0.5:7000", &state("b", 9002, "ready"), std::slice::from_ref(&a));
        t.heard(&node, "10.0.0.5:7000", &state("a", 0, "ready"), std::slice::from_ref(&a));
        assert!(t.snapshot(None, 1).tenants.is_empty());
        t.heard(&node, "10.0.0.5:7000", &state("a", 9001, "weird"), std::slice::from_ref(&a));
        assert!(t.snapshot(Some(&a), 1).tenants.is_empty());
    }
}
