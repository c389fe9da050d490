//! The agent's Prometheus metrics, served with `/healthz` and `/readyz` by `tessera-metrics` (`metrics_listen` in
//! the agent's config, `--metrics-listen` on `sim-agent run`). One [`AgentMetrics`] serves every agent of a process
//! (a `sim-agent run` hosts many), each series labelled with its `node`:
//!
//! - counters `reconcile_passes_total{node,result}` (`converged`, `waiting`, `error`), `mig_steps_total{node}`
//!   (instances created, destroyed or reassigned), `pushes_total{node,result}` (`accepted`, `stale`, `refused`) and
//!   `push_refusals_total{node,rule}` (why a push was refused: the `Refusal` rules of `authority.rs`);
//! - histograms `reconcile_pass_seconds` and `reconfiguration_seconds` (from accepting a plan epoch to the pass that
//!   has every GPU in place);
//! - read from each reconciler when scraped: `desired_epoch{node}`, `applied_epoch{node}`,
//!   `coordinator_registered{node}`, `gpu_converged{node,gpu,model}` and `gpu_instances{node,gpu,model,profile}`;
//! - `build_info{version}`.
//!
//! `/readyz` answers 200 once every agent that reports to a coordinator is registered with it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::reconcile::{PassReport, Reconciler};

/// What the agent's client of the coordinators has done, for status, metrics and tests.
#[derive(Debug, Default)]
pub struct ClientStats {
    pub(crate) registered: AtomicBool,
    pub(crate) registrations: AtomicU64,
    pub(crate) heartbeats: AtomicU64,
    pub(crate) failures: AtomicU64,
}

impl ClientStats {
    /// Whether the last register or heartbeat succeeded with the node known to the coordinator.
    pub fn registered(&self) -> bool {
        self.registered.load(Ordering::SeqCst)
    }

    /// Successful registrations.
    pub fn registrations(&self) -> u64 {
        self.registrations.load(Ordering::SeqCst)
    }

    /// Successful heartbeats.
    pub fn heartbeats(&self) -> u64 {
        self.heartbeats.load(Ordering::SeqCst)
    }

    /// Failed calls (unreachable coordinator, errors).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::SeqCst)
    }
}

/// Prefix of every family name.
pub const PREFIX: &str = "tessera_agent";

/// Bucket bounds (seconds) of the duration histograms: 1 ms to 5 min.
pub const DURATION_BUCKETS: [f64; 17] =
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0, 300.0];

type Labels = Vec<(&'static str, String)>;

/// One agent of the process, read when scraped.
struct Agent {
    reconciler: Arc<Reconciler>,
    client: Option<Arc<ClientStats>>,
}

/// The metrics of every agent in the process.
pub struct AgentMetrics {
    registry: Registry,
    reconcile_passes: Family<Labels, Counter>,
    mig_steps: Family<Labels, Counter>,
    pushes: Family<Labels, Counter>,
    push_refusals: Family<Labels, Counter>,
    reconcile_pass_seconds: Histogram,
    reconfiguration_seconds: Histogram,
    desired_epoch: Family<Labels, Gauge>,
    applied_epoch: Family<Labels, Gauge>,
    coordinator_registered: Family<Labels, Gauge>,
    gpu_converged: Family<Labels, Gauge>,
    gpu_instances: Family<Labels, Gauge>,
    agents: Mutex<Vec<Agent>>,
    /// Per node: the newest epoch accepted and when, until a pass has it in place.
    accepted: Mutex<HashMap<String, (u64, Instant)>>,
}

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentMetrics").finish_non_exhaustive()
    }
}

impl Default for AgentMetrics {
    fn default() -> Self {
        Self::new()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn node_label(node: &str) -> Labels {
    vec![("node", node.to_string())]
}

impl AgentMetrics {
    /// A registry with every family registered.
    pub fn new() -> AgentMetrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let m = AgentMetrics {
            registry: Registry::default(),
            reconcile_passes: Family::default(),
            mig_steps: Family::default(),
            pushes: Family::default(),
            push_refusals: Family::default(),
            reconcile_pass_seconds: Histogram::new(DURATION_BUCKETS),
            reconfiguration_seconds: Histogram::new(DURATION_BUCKETS),
            desired_epoch: Family::default(),
            applied_epoch: Family::default(),
            coordinator_registered: Family::default(),
            gpu_converged: Family::default(),
            gpu_instances: Family::default(),
            agents: Mutex::new(Vec::new()),
            accepted: Mutex::new(HashMap::new()),
        };
        let build_info: Family<Labels, Gauge> = Family::default();
        build_info.get_or_create(&vec![("version", env!("CARGO_PKG_VERSION").to_string())]).set(1);
        registry.register("build_info", "1, labelled with the agent's version", build_info);
        registry.register(
            "reconcile_passes",
            "Reconcile passes, by result (converged, waiting, error)",
            m.reconcile_passes.clone(),
        );
        registry.register("mig_steps", "GPU instances created, destroyed or reassigned", m.mig_steps.clone());
        registry.register("pushes", "Layout pushes received, by result (accepted, stale, refused)", m.pushes.clone());
        registry.register(
            "push_refusals",
            "Pushes refused because of who sent them or what they claim, by rule",
            m.push_refusals.clone(),
        );
        registry.register_with_unit(
            "reconcile_pass",
            "Wall time of one reconcile pass over the node's GPUs",
            Unit::Seconds,
            m.reconcile_pass_seconds.clone(),
        );
        registry.register_with_unit(
            "reconfiguration",
            "Time from accepting a plan epoch to the pass that has every GPU of the node in place",
            Unit::Seconds,
            m.reconfiguration_seconds.clone(),
        );
        registry.register("desired_epoch", "Newest plan epoch accepted", m.desired_epoch.clone());
        registry.register("applied_epoch", "Newest plan epoch with every GPU in place", m.applied_epoch.clone());
        registry.register(
            "coordinator_registered",
            "1 while the agent is registered with a coordinator, else 0",
            m.coordinator_registered.clone(),
        );
        registry.register(
            "gpu_converged",
            "1 when the GPU's instances and their work equal its target (or it has none), else 0",
            m.gpu_converged.clone(),
        );
        registry.register("gpu_instances", "GPU instances on the GPU, by profile", m.gpu_instances.clone());
        AgentMetrics { registry, ..m }
    }

    /// Adds an agent to the scrape-time families; `client` when it reports to a coordinator.
    pub fn add(&self, reconciler: Arc<Reconciler>, client: Option<Arc<ClientStats>>) {
        let node = reconciler.node().to_string();
        for result in ["converged", "waiting", "error"] {
            drop(self.reconcile_passes.get_or_create(&vec![("node", node.clone()), ("result", result.to_string())]));
        }
        for result in ["accepted", "stale", "refused"] {
            drop(self.pushes.get_or_create(&vec![("node", node.clone()), ("result", result.to_string())]));
        }
        drop(self.mig_steps.get_or_create(&node_label(&node)));
        lock(&self.agents).push(Agent { reconciler, client });
    }

    /// Records one reconcile pass of `node` that took `secs`.
    pub fn pass(&self, node: &str, secs: f64, report: Result<&PassReport, ()>, applied_epoch: u64) {
        self.reconcile_pass_seconds.observe(secs);
        let result = match report {
            Ok(r) if r.errors.is_empty() && !r.waiting => "converged",
            Ok(r) if r.errors.is_empty() => "waiting",
            _ => "error",
        };
        self.reconcile_passes.get_or_create(&vec![("node", node.to_string()), ("result", result.to_string())]).inc();
        if let Ok(r) = report {
            self.mig_steps.get_or_create(&node_label(node)).inc_by(r.steps);
        }
        let mut accepted = lock(&self.accepted);
        if let Some((epoch, at)) = accepted.get(node).copied()
            && applied_epoch >= epoch
        {
            accepted.remove(node);
            self.reconfiguration_seconds.observe(at.elapsed().as_secs_f64());
        }
    }

    /// Records a push to `node`: accepted (with its epoch), `stale`, or refused by `rule`.
    pub fn push(&self, node: &str, outcome: PushOutcome<'_>) {
        let result = match outcome {
            PushOutcome::Accepted { epoch } => {
                let mut accepted = lock(&self.accepted);
                if accepted.get(node).is_none_or(|(e, _)| *e < epoch) {
                    accepted.entry(node.to_string()).or_insert((epoch, Instant::now())).0 = epoch;
                }
                "accepted"
            }
            PushOutcome::Stale => "stale",
            PushOutcome::Refused { rule } => {
                self.push_refusals.get_or_create(&vec![("node", node.to_string()), ("rule", rule.to_string())]).inc();
                "refused"
            }
        };
        self.pushes.get_or_create(&vec![("node", node.to_string()), ("result", result.to_string())]).inc();
    }

    fn refresh(&self) {
        self.desired_epoch.clear();
        self.applied_epoch.clear();
        self.coordinator_registered.clear();
        self.gpu_converged.clear();
        self.gpu_instances.clear();
        for a in lock(&self.agents).iter() {
            let node = a.reconciler.node().to_string();
            let status = a.reconciler.status();
            self.desired_epoch.get_or_create(&node_label(&node)).set(tessera_metrics::gauge_i64(status.epoch));
            self.applied_epoch.get_or_create(&node_label(&node)).set(tessera_metrics::gauge_i64(status.applied_epoch));
            if let Some(c) = &a.client {
                self.coordinator_registered.get_or_create(&node_label(&node)).set(i64::from(c.registered()));
            }
            for (index, g) in &status.gpus {
                let model = g.info.model.map_or_else(|| g.info.name.clone(), |m| m.to_string());
                let labels = vec![("node", node.clone()), ("gpu", index.to_string()), ("model", model.clone())];
                self.gpu_converged.get_or_create(&labels).set(i64::from(g.converged));
                let mut by_profile: BTreeMap<&'static str, i64> = BTreeMap::new();
                for i in &g.instances {
                    *by_profile.entry(i.instance.placement.profile.short_name()).or_insert(0) += 1;
                }
                for (profile, n) in by_profile {
                    let mut labels = labels.clone();
                    labels.push(("profile", profile.to_string()));
                    self.gpu_instances.get_or_create(&labels).set(n);
                }
            }
        }
    }
}

/// What became of a push.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushOutcome<'a> {
    /// Accepted as the new desired state.
    Accepted {
        /// Its epoch.
        epoch: u64,
    },
    /// Older than the desired state.
    Stale,
    /// Refused by an authority rule.
    Refused {
        /// The rule.
        rule: &'a str,
    },
}

impl tessera_metrics::Exposition for AgentMetrics {
    fn openmetrics(&self) -> String {
        self.refresh();
        tessera_metrics::encode(&self.registry)
    }

    fn ready(&self) -> Result<(), tessera_metrics::NotReady> {
        let agents = lock(&self.agents);
        if agents.is_empty() {
            return Err("no agent started yet".into());
        }
        let waiting: Vec<String> = agents
            .iter()
            .filter(|a| a.client.as_ref().is_some_and(|c| !c.registered()))
            .map(|a| a.reconciler.node().to_string())
            .collect();
        if waiting.is_empty() {
            Ok(())
        } else {
            Err(format!("not registered with a coordinator: {}", waiting.join(", ")).into())
        }
    }
}

/// One [`AgentMetrics`] shared by the runtimes of a process (compared by identity).
#[derive(Clone, Debug)]
pub struct SharedMetrics(pub Arc<AgentMetrics>);

impl PartialEq for SharedMetrics {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedMetrics {}
