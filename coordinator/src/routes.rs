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

use tessera_core::fleet::FleetState;
use tessera_core::ids::{NodeId, TenantId};
use tessera_core::plan::{Assignment, Role};
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

    /// Drops `node`'s endpoints of `tenants` at once (the leader is about to push the node a layout without them):
    /// front ends stop sending them requests before the node drains them, rather than a heartbeat later.
    pub fn withdraw(&self, node: &NodeId, tenants: &[TenantId]) {
        let mut nodes = self.nodes.lock().expect("routes lock");
        let Some(n) = nodes.get_mut(node) else { return };
        let before = n.endpoints.len();
        n.endpoints.retain(|(t, _)| !tenants.contains(t));
        let changed = n.endpoints.len() != before;
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

    /// Whether `tenant` has a ready inference endpoint on a node other than `node`.
    pub fn ready_elsewhere(&self, tenant: &TenantId, node: &NodeId) -> bool {
        self.expire();
        let nodes = self.nodes.lock().expect("routes lock");
        nodes.iter().filter(|(n, _)| *n != node).any(|(_, r)| {
            r.endpoints.iter().any(|(t, e)| t == tenant && e.state == "ready" && e.role == v1::Role::Inference as i32)
        })
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

/// The tenants a push to `node` would stop serving there (inference in the node's applied layout, none in its
/// targets) while the committed targets serve them on another node: with a `serve` job, such a push waits until the
/// new home has a ready endpoint ([`RouteTable::ready_elsewhere`]), so that a move between nodes is make-before-break
/// as a move within one is.
pub fn moves_away(fleet: &FleetState, node: &NodeId) -> Vec<TenantId> {
    let inference = |a: &&Assignment| a.role == Role::Inference;
    let on = || fleet.gpus.iter().filter(|(id, _)| &id.node == node).map(|(_, g)| g);
    let targeted_here: Vec<&TenantId> = on()
        .flat_map(|g| g.target.iter().flat_map(|t| t.assignments.iter().filter(inference)))
        .map(|a| &a.tenant)
        .collect();
    let mut out: Vec<TenantId> = on()
        .flat_map(|g| g.applied_assignments.iter().filter(inference))
        .map(|a| &a.tenant)
        .filter(|t| !targeted_here.contains(t))
        .filter(|t| fleet.tenants.get(*t).is_some_and(|spec| spec.jobs.serve.is_some()))
        .filter(|t| {
            fleet.gpus.iter().any(|(id, g)| {
                &id.node != node
                    && g.target
                        .as_ref()
                        .is_some_and(|p| p.assignments.iter().filter(inference).any(|a| &a.tenant == *t))
            })
        })
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
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
    fn a_node_losing_a_tenant_to_another_node_waits_for_its_new_home() {
        use tessera_core::catalog::GpuModel;
        use tessera_core::fleet::{GpuHealth, GpuState};
        use tessera_core::ids::GpuId;
        use tessera_core::plan::GpuPlan;
        let a = TenantId::new("a").unwrap();
        let (n0, n1) = (NodeId::new("n0").unwrap(), NodeId::new("n1").unwrap());
        let assign = |p: &str| Assignment {
            placement: p.parse().unwrap(),
            tenant: a.clone(),
            role: Role::Inference,
            preinit: false,
        };
        let plan = |layout: &str, assignments: Vec<Assignment>| GpuPlan {
            layout: layout.parse().unwrap(),
            assignments,
            expected_goodput: 0.0,
            explanation: String::new(),
            upcoming: vec![],
            retraining_epochs: BTreeMap::new(),
            sharing: Default::default(),
        };
        let gpu = |applied: Vec<Assignment>, target: GpuPlan| GpuState {
            model: GpuModel::A100_40GB,
            health: GpuHealth::Healthy,
            mig_enabled: true,
            applied: target.layout.clone(),
            applied_assignments: applied,
            applied_epoch: 1,
            target: Some(target),
            target_epoch: 2,
            memory_gib: BTreeMap::new(),
        };
        let mut fleet = FleetState::default();
        let mut spec: tessera_core::tenant::TenantSpec = serde_json::from_value(serde_json::json!({
            "id": "a", "name": "a", "model": "m", "slo_ms": 10.0, "slo_percentile": 99.0, "weight": 1.0,
            "demand": {"poisson": {"rate_rps": 1.0}}, "retraining": null
        }))
        .unwrap();
        fleet.gpus.insert(GpuId::new(n0.clone(), 0), gpu(vec![assign("3g@0")], plan("-", vec![])));
        fleet.gpus.insert(GpuId::new(n1.clone(), 0), gpu(vec![], plan("2g@0", vec![assign("2g@0")])));
        // Without a serve job there is no endpoint to wait for.
        fleet.tenants.insert(a.clone(), spec.clone());
        assert!(moves_away(&fleet, &n0).is_empty());
        spec.jobs.serve = Some(tessera_core::jobs::JobSpec::command(["s"]));
        fleet.tenants.insert(a.clone(), spec);
        assert_eq!(moves_away(&fleet, &n0), vec![a.clone()]);
        assert!(moves_away(&fleet, &n1).is_empty(), "the new home gains the tenant; it is pushed at once");
        // The old home waits until the new one reports the tenant ready.
        let t = RouteTable::default();
        assert!(!t.ready_elsewhere(&a, &n0));
        t.heard(&n1, "10.0.0.6:7000", &state("a", 9001, "starting"), std::slice::from_ref(&a));
        assert!(!t.ready_elsewhere(&a, &n0));
        t.heard(&n1, "10.0.0.6:7000", &state("a", 9001, "ready"), std::slice::from_ref(&a));
        assert!(t.ready_elsewhere(&a, &n0));
        assert!(!t.ready_elsewhere(&a, &n1));
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

    #[test]
    fn withdrawn_endpoints_leave_the_routes_at_once() {
        let t = RouteTable::default();
        let node = NodeId::new("n").unwrap();
        let a = TenantId::new("a").unwrap();
        t.heard(&node, "10.0.0.5:7000", &state("a", 9001, "ready"), std::slice::from_ref(&a));
        let before = t.snapshot(None, 1).version;
        t.withdraw(&node, &[TenantId::new("other").unwrap()]);
        assert_eq!(t.snapshot(None, 1).version, before, "nothing of that tenant: nothing changes");
        t.withdraw(&node, std::slice::from_ref(&a));
        let r = t.snapshot(None, 1);
        assert!(r.tenants.is_empty(), "{r:?}");
        assert_eq!(r.version, before + 1, "watchers hear of it");
    }
}
