//! Prometheus / OpenMetrics metrics of the coordinator and the HTTP endpoint that serves them.
//!
//! Every family is named `tessera_coordinator_*`: gauges for the Raft state (`raft_term`, `raft_commit_index`,
//! `raft_applied_index`, `raft_is_leader`, `raft_members`), the fleet (`tenants`, `gpus`) and the last planning round
//! (`plan_epoch`, `plan_objective`, `plan_bound`, `plan_gap`); per GPU (labels `gpu`, `model`), read from the
//! replicated state when scraped: `gpu_applied_epoch`, `gpu_target_epoch`, `gpu_instances{profile}` (applied) and
//! `gpu_drift_instances` (instances the applied layout has and the target has not, or the reverse); counters
//! `proposals_total`, `plan_rounds_total{outcome}`, `plan_gpu_solves_total{outcome}` (per GPU and round: `kept`
//! its last plan, `solved` with none to keep, or the reason incremental rounds solved it again, as
//! `tessera_planner::level2::goodput::Replan::name` spells it), `pushes_total{result}`, `reconfigurations_total` and
//! `writes_resent_total` (client writes resent with a request id already applied, answered once); histograms
//! `plan_round_seconds` and `reconfiguration_seconds` (from the push of a GPU's new target to the agent's report that
//! it is applied, as the leader sees it: heartbeats make it up to one heartbeat interval long). [`Metrics`] is
//! `Send + Sync`: share it as `Arc<Metrics>` and update it from any task; [`serve`] exposes it at `GET /metrics`
//! with `/healthz` and `/readyz` (`tessera-metrics`).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::Router;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};
use tessera_metrics::gauge_i64;
use tessera_planner::level2::goodput::Replan;

/// Prefix of every metric family name (an underscore separates it from the rest).
pub const PREFIX: &str = "tessera_coordinator";

/// `Content-Type` of [`Metrics::encode`]'s output (what [`serve`] answers a scraper that asks for OpenMetrics).
pub const CONTENT_TYPE: &str = tessera_metrics::OPENMETRICS;

/// `outcome` label of `plan_rounds_total` for a round that produced a plan.
pub const OUTCOME_PLANNED: &str = "planned";
/// `outcome` label of `plan_rounds_total` for a round whose demands could not all be placed.
pub const OUTCOME_INFEASIBLE: &str = "infeasible";
/// `outcome` label of `plan_rounds_total` for a round that failed; also `pushes_total`'s `result` for a failed push.
pub const OUTCOME_ERROR: &str = "error";
/// `outcome` label of `plan_gpu_solves_total` for a GPU that kept its last plan, shifted forward.
pub const SOLVE_KEPT: &str = "kept";
/// `outcome` label of `plan_gpu_solves_total` for a GPU solved with no plan to keep.
pub const SOLVE_SOLVED: &str = "solved";
/// `result` label of `pushes_total` for a push the agent accepted.
pub const PUSH_OK: &str = "ok";
/// `result` label of `pushes_total` for a push the agent rejected as older than its current epoch.
pub const PUSH_STALE: &str = "stale";
/// The `auth_refusals` kind of a heartbeat's counters for a tenant not placed on the agent's node.
pub const FOREIGN_TENANT: &str = "foreign_tenant";

/// Upper bounds (seconds) of the duration histograms' buckets: a 1-2-5 series from 1 ms to 60 s (roughly
/// exponential, about 2.2x per step), plus the implicit `+Inf`.
pub const DURATION_BUCKETS: [f64; 16] =
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0];

/// A label set with one label whose value is chosen at run time.
type OneLabel = [(&'static str, String); 1];
/// `gpu` and `model`.
type GpuLabels = [(&'static str, String); 2];
/// `gpu`, `model` and `profile`.
type ProfileLabels = [(&'static str, String); 3];

/// One GPU as the per-GPU families report it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuGauges {
    /// `NODE/INDEX`.
    pub gpu: String,
    /// The model's short name.
    pub model: String,
    /// The epoch of the layout the agent last reported applied.
    pub applied_epoch: u64,
    /// The epoch of the committed target (0 without one).
    pub target_epoch: u64,
    /// Applied instances by profile short name.
    pub instances: BTreeMap<String, usize>,
    /// Instances in the applied layout and not in the target, or the reverse (0 without a target).
    pub drift_instances: usize,
}

/// Where the per-GPU families come from at scrape time.
struct GpuSource(Box<dyn Fn() -> Vec<GpuGauges> + Send + Sync>);

impl std::fmt::Debug for GpuSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GpuSource")
    }
}

/// The coordinator's metrics registry. Cheap to update from many tasks (atomics throughout); encode it with
/// [`Metrics::encode`] or serve it with [`serve`].
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    raft_term: Gauge,
    raft_commit_index: Gauge,
    raft_applied_index: Gauge,
    raft_is_leader: Gauge,
    raft_members: Gauge,
    proposals: Counter,
    plan_rounds: Family<OneLabel, Counter>,
    plan_gpu_solves: Family<OneLabel, Counter>,
    pushes: Family<OneLabel, Counter>,
    reconfigurations: Counter,
    plan_round_seconds: Histogram,
    tenants: Gauge,
    gpus: Gauge,
    node_health_changes: Family<OneLabel, Counter>,
    proposals_dropped_late: Counter,
    writes_resent: Counter,
    auth_refusals: Family<OneLabel, Counter>,
    build_info: Family<OneLabel, Gauge>,
    plan_epoch: Gauge,
    plan_objective: Gauge<f64, AtomicU64>,
    plan_bound: Gauge<f64, AtomicU64>,
    plan_gap: Gauge<f64, AtomicU64>,
    reconfiguration_seconds: Histogram,
    gpu_applied_epoch: Family<GpuLabels, Gauge>,
    gpu_target_epoch: Family<GpuLabels, Gauge>,
    gpu_drift_instances: Family<GpuLabels, Gauge>,
    gpu_instances: Family<ProfileLabels, Gauge>,
    gpu_source: OnceLock<GpuSource>,
    /// Per GPU, the target epoch last pushed and when, until the agent reports it applied.
    pushed: Mutex<HashMap<String, (u64, Instant)>>,
    leader_known: std::sync::atomic::AtomicBool,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every family registered and at zero.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let metrics = Self {
            raft_term: Gauge::default(),
            raft_commit_index: Gauge::default(),
            raft_applied_index: Gauge::default(),
            raft_is_leader: Gauge::default(),
            raft_members: Gauge::default(),
            proposals: Counter::default(),
            plan_rounds: Family::default(),
            plan_gpu_solves: Family::default(),
            pushes: Family::default(),
            reconfigurations: Counter::default(),
            plan_round_seconds: Histogram::new(DURATION_BUCKETS),
            tenants: Gauge::default(),
            gpus: Gauge::default(),
            node_health_changes: Family::default(),
            proposals_dropped_late: Counter::default(),
            writes_resent: Counter::default(),
            auth_refusals: Family::default(),
            build_info: Family::default(),
            plan_epoch: Gauge::default(),
            plan_objective: Gauge::default(),
            plan_bound: Gauge::default(),
            plan_gap: Gauge::default(),
            reconfiguration_seconds: Histogram::new(DURATION_BUCKETS),
            gpu_applied_epoch: Family::default(),
            gpu_target_epoch: Family::default(),
            gpu_drift_instances: Family::default(),
            gpu_instances: Family::default(),
            gpu_source: OnceLock::new(),
            pushed: Mutex::new(HashMap::new()),
            leader_known: std::sync::atomic::AtomicBool::new(false),
            registry: Registry::default(),
        };
        registry.register("build_info", "1, labelled with the coordinator's version", metrics.build_info.clone());
        metrics.build_info.get_or_create(&[("version", env!("CARGO_PKG_VERSION").to_owned())]).set(1);
        registry.register("raft_term", "Current Raft term of this node", metrics.raft_term.clone());
        registry.register(
            "raft_commit_index",
            "Highest Raft log index known to be committed",
            metrics.raft_commit_index.clone(),
        );
        registry.register(
            "raft_applied_index",
            "Highest Raft log index applied to the state machine",
            metrics.raft_applied_index.clone(),
        );
        registry.register(
            "raft_is_leader",
            "1 if this node is the Raft leader, else 0",
            metrics.raft_is_leader.clone(),
        );
        registry.register("raft_members", "Voters in the current Raft configuration", metrics.raft_members.clone());
        // Counters get the `_total` suffix from the OpenMetrics encoder.
        registry.register("proposals", "Commands proposed to Raft by this node", metrics.proposals.clone());
        registry.register(
            "plan_rounds",
            "Planning rounds run by this node as leader, by outcome (planned, infeasible, error)",
            metrics.plan_rounds.clone(),
        );
        registry.register(
            "plan_gpu_solves",
            "GPUs planned in this node's rounds as leader, by outcome: kept (its last plan, shifted forward), solved \
             (no plan to keep) or the reason incremental rounds solved it again",
            metrics.plan_gpu_solves.clone(),
        );
        registry.register("pushes", "Layout pushes to agents, by result (ok, error, stale)", metrics.pushes.clone());
        registry.register(
            "reconfigurations",
            "MIG reconfigurations (GPUs whose layout changed) in plans this node pushed",
            metrics.reconfigurations.clone(),
        );
        registry.register_with_unit(
            "plan_round",
            "Wall time of one planning round (input, policy, commit and push)",
            Unit::Seconds,
            metrics.plan_round_seconds.clone(),
        );
        // Known label values start at 0, so every series exists from the first scrape (and `rate()` sees it start).
        for outcome in [OUTCOME_PLANNED, OUTCOME_INFEASIBLE, OUTCOME_ERROR] {
            drop(metrics.plan_rounds.get_or_create(&[("outcome", outcome.to_owned())]));
        }
        let solves = [SOLVE_KEPT, SOLVE_SOLVED].into_iter().chain(Replan::ALL.iter().map(|r| r.name()));
        for outcome in solves {
            drop(metrics.plan_gpu_solves.get_or_create(&[("outcome", outcome.to_owned())]));
        }
        for result in [PUSH_OK, OUTCOME_ERROR, PUSH_STALE] {
            drop(metrics.pushes.get_or_create(&[("result", result.to_owned())]));
        }
        registry.register("tenants", "Tenants in the replicated state", metrics.tenants.clone());
        registry.register("gpus", "GPUs in the replicated fleet state", metrics.gpus.clone());
        registry.register(
            "node_health_changes",
            "Node health verdicts this node committed as leader, by new health (healthy, suspect, failed)",
            metrics.node_health_changes.clone(),
        );
        for health in ["healthy", "suspect", "failed"] {
            drop(metrics.node_health_changes.get_or_create(&[("health", health.to_owned())]));
        }
        registry.register(
            "auth_refusals",
            "Calls refused by mutual TLS checks or bounds, by kind (unauthenticated, permission_denied, \
             term_out_of_bounds, foreign_tenant: a heartbeat's counters for a tenant not placed on its node)",
            metrics.auth_refusals.clone(),
        );
        for kind in ["unauthenticated", "permission_denied", "term_out_of_bounds", FOREIGN_TENANT] {
            drop(metrics.auth_refusals.get_or_create(&[("kind", kind.to_owned())]));
        }
        registry.register(
            "proposals_dropped_late",
            "Proposals forwarded by a follower that arrived after their deadline and were dropped",
            metrics.proposals_dropped_late.clone(),
        );
        registry.register(
            "writes_resent",
            "Client writes resent with a request id this cluster had applied: answered, not applied again",
            metrics.writes_resent.clone(),
        );
        registry.register(
            "plan_epoch",
            "Epoch of the last plan this node committed as leader",
            metrics.plan_epoch.clone(),
        );
        registry.register(
            "plan_objective",
            "Planning value of the last round this node ran as leader (expected goodput plus retraining value)",
            metrics.plan_objective.clone(),
        );
        registry.register("plan_bound", "Proven upper bound on that round's objective", metrics.plan_bound.clone());
        registry.register(
            "plan_gap",
            "Relative gap between that round's objective and bound",
            metrics.plan_gap.clone(),
        );
        registry.register_with_unit(
            "reconfiguration",
            "Time from pushing a GPU's new target to the agent's report that it is applied (heartbeat granularity)",
            Unit::Seconds,
            metrics.reconfiguration_seconds.clone(),
        );
        registry.register(
            "gpu_applied_epoch",
            "Epoch of the layout the GPU's agent last reported applied",
            metrics.gpu_applied_epoch.clone(),
        );
        registry.register("gpu_target_epoch", "Epoch of the GPU's committed target", metrics.gpu_target_epoch.clone());
        registry.register(
            "gpu_drift_instances",
            "Instances in the applied layout and not in the target, or the reverse",
            metrics.gpu_drift_instances.clone(),
        );
        registry.register("gpu_instances", "Applied GPU instances, by profile", metrics.gpu_instances.clone());
        Self { registry, ..metrics }
    }

    /// Where the per-GPU families are read from when scraped (the server passes a read of the replicated state);
    /// only the first call counts.
    pub fn set_gpu_source(&self, source: impl Fn() -> Vec<GpuGauges> + Send + Sync + 'static) {
        let _ = self.gpu_source.set(GpuSource(Box::new(source)));
    }

    /// Records a committed round: its epoch, objective, bound and gap.
    pub fn set_round(&self, epoch: u64, objective: f64, bound: f64, gap: f64) {
        self.plan_epoch.set(gauge_i64(epoch));
        self.plan_objective.set(objective);
        self.plan_bound.set(bound);
        self.plan_gap.set(gap);
    }

    /// Notes that GPU `gpu`'s target of `epoch` was pushed now (a GPU already waiting keeps its first push time).
    pub fn target_pushed(&self, gpu: &str, epoch: u64) {
        let mut pushed = self.pushed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match pushed.get(gpu) {
            Some((e, _)) if *e >= epoch => {}
            _ => {
                pushed.insert(gpu.to_string(), (epoch, Instant::now()));
            }
        }
    }

    /// Notes the agent's report that GPU `gpu` applied `epoch`: observes `reconfiguration_seconds` if that is the
    /// epoch pushed (or a newer one).
    pub fn layout_applied(&self, gpu: &str, epoch: u64) {
        let mut pushed = self.pushed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((e, at)) = pushed.get(gpu).copied()
            && epoch >= e
        {
            pushed.remove(gpu);
            self.reconfiguration_seconds.observe(at.elapsed().as_secs_f64());
        }
    }

    fn refresh_gpus(&self) {
        let Some(source) = self.gpu_source.get() else { return };
        let gpus = (source.0)();
        self.gpu_applied_epoch.clear();
        self.gpu_target_epoch.clear();
        self.gpu_drift_instances.clear();
        self.gpu_instances.clear();
        for g in gpus {
            let labels = [("gpu", g.gpu.clone()), ("model", g.model.clone())];
            self.gpu_applied_epoch.get_or_create(&labels).set(gauge_i64(g.applied_epoch));
            self.gpu_target_epoch.get_or_create(&labels).set(gauge_i64(g.target_epoch));
            self.gpu_drift_instances.get_or_create(&labels).set(gauge_i64(g.drift_instances as u64));
            for (profile, n) in &g.instances {
                let labels = [("gpu", g.gpu.clone()), ("model", g.model.clone()), ("profile", profile.clone())];
                self.gpu_instances.get_or_create(&labels).set(gauge_i64(*n as u64));
            }
        }
    }

    /// Sets the Raft gauges: term, commit and applied index, leadership (1/0) and number of voting members.
    pub fn set_raft(&self, term: u64, commit: u64, applied: u64, is_leader: bool, members: usize) {
        self.raft_term.set(gauge_i64(term));
        self.raft_commit_index.set(gauge_i64(commit));
        self.raft_applied_index.set(gauge_i64(applied));
        self.raft_is_leader.set(i64::from(is_leader));
        self.raft_members.set(gauge_i64(members as u64));
    }

    /// Records whether this member knows a leader (what `/readyz` answers).
    pub fn set_leader_known(&self, known: bool) {
        self.leader_known.store(known, std::sync::atomic::Ordering::Relaxed);
    }

    /// Counts one planning round with `outcome` (normally [`OUTCOME_PLANNED`], [`OUTCOME_INFEASIBLE`] or
    /// [`OUTCOME_ERROR`]) and records its duration in `plan_round_seconds`.
    pub fn observe_round(&self, outcome: &str, secs: f64) {
        self.plan_rounds.get_or_create(&[("outcome", outcome.to_owned())]).inc();
        self.plan_round_seconds.observe(secs);
    }

    /// Counts one GPU of a planning round: [`SOLVE_KEPT`] where it kept its last plan, the reason where incremental
    /// rounds solved it again, else [`SOLVE_SOLVED`].
    pub fn observe_gpu_solve(&self, kept: bool, replanned: Option<Replan>) {
        let outcome = match (kept, replanned) {
            (true, _) => SOLVE_KEPT,
            (false, Some(why)) => why.name(),
            (false, None) => SOLVE_SOLVED,
        };
        self.plan_gpu_solves.get_or_create(&[("outcome", outcome.to_owned())]).inc();
    }

    /// Counts one layout push with `result` (normally [`PUSH_OK`], [`OUTCOME_ERROR`] or [`PUSH_STALE`]).
    pub fn push(&self, result: &str) {
        self.pushes.get_or_create(&[("result", result.to_owned())]).inc();
    }

    /// Counts one command proposed to Raft.
    pub fn proposal(&self) {
        self.proposals.inc();
    }

    /// Adds `n` MIG reconfigurations.
    pub fn reconfigurations(&self, n: u64) {
        self.reconfigurations.inc_by(n);
    }

    /// Counts one node health verdict (`healthy`, `suspect`, `failed`).
    pub fn node_health(&self, health: &str) {
        self.node_health_changes.get_or_create(&[("health", health.to_owned())]).inc();
    }

    /// Counts one call refused by the TLS checks (`unauthenticated` or `permission_denied`).
    pub fn auth_refusal(&self, kind: &str) {
        self.auth_refusals.get_or_create(&[("kind", kind.to_owned())]).inc();
    }

    /// Counts `n` refusals of kind `kind` (see `auth_refusals`).
    pub fn auth_refusals(&self, kind: &str, n: u64) {
        self.auth_refusals.get_or_create(&[("kind", kind.to_owned())]).inc_by(n);
    }

    /// Counts forwarded proposals dropped because they arrived after their deadline.
    pub fn proposals_dropped_late(&self, n: u64) {
        self.proposals_dropped_late.inc_by(n);
    }

    /// Counts one client write resent with a request id already applied (answered without applying it again).
    pub fn write_resent(&self) {
        self.writes_resent.inc();
    }

    /// Sets the fleet gauges: number of tenants and of GPUs.
    pub fn set_fleet(&self, tenants: usize, gpus: usize) {
        self.tenants.set(gauge_i64(tenants as u64));
        self.gpus.set(gauge_i64(gpus as u64));
    }

    /// The whole registry in the OpenMetrics text format (ending in `# EOF`), the per-GPU families read afresh.
    pub fn encode(&self) -> String {
        self.refresh_gpus();
        tessera_metrics::encode(&self.registry)
    }
}

impl tessera_metrics::Exposition for Metrics {
    fn openmetrics(&self) -> String {
        self.encode()
    }

    fn ready(&self) -> Result<(), tessera_metrics::NotReady> {
        if self.leader_known.load(std::sync::atomic::Ordering::Relaxed) {
            Ok(())
        } else {
            Err("no leader known".into())
        }
    }
}

/// The per-GPU families' values for every GPU of `fleet`.
pub fn gpu_gauges(fleet: &tessera_core::fleet::FleetState) -> Vec<GpuGauges> {
    fleet
        .gpus
        .iter()
        .map(|(id, g)| {
            let drift_instances = g.target.as_ref().map_or(0, |t| {
                let missing = t.layout.placements().iter().filter(|p| !g.applied.contains(**p)).count();
                let extra = g.applied.placements().iter().filter(|p| !t.layout.contains(**p)).count();
                missing + extra
            });
            GpuGauges {
                gpu: id.to_string(),
                model: g.model.to_string(),
                applied_epoch: g.applied_epoch,
                target_epoch: g.target_epoch,
                instances: g
                    .applied
                    .profile_counts()
                    .into_iter()
                    .map(|(p, n)| (p.short_name().to_string(), n))
                    .collect(),
                drift_instances,
            }
        })
        .collect()
}

// Compile-time proof that `Metrics` can be shared across tasks.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Metrics>();
};

/// Serves `metrics` over HTTP/1.1 on `listener` until the listener fails: `GET /metrics` (OpenMetrics for a scraper
/// that asks for it, the Prometheus text format otherwise), `/healthz` (200 while the process serves) and `/readyz`
/// (200 once this member knows a leader, so its API can answer; 503 before, and during an election).
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) -> std::io::Result<()> {
    tessera_metrics::serve(listener, metrics).await
}

/// The router behind [`serve`], for embedding the endpoints in another server.
pub fn router(metrics: Arc<Metrics>) -> Router {
    tessera_metrics::router(metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn updated() -> Metrics {
        let m = Metrics::new();
        m.set_raft(7, 42, 41, true, 3);
        m.observe_round(OUTCOME_PLANNED, 0.25);
        m.observe_round(OUTCOME_PLANNED, 0.5);
        m.observe_round(OUTCOME_INFEASIBLE, 0.125);
        m.push(PUSH_OK);
        m.push(PUSH_OK);
        m.push(PUSH_STALE);
        m.proposal();
        m.reconfigurations(5);
        m.set_fleet(12, 8);
        m.set_round(9, 41.5, 42.0, 0.012);
        m.observe_gpu_solve(true, None);
        m.observe_gpu_solve(true, None);
        m.observe_gpu_solve(false, Some(Replan::Forecast));
        m.observe_gpu_solve(false, None);
        m.set_gpu_source(|| {
            vec![GpuGauges {
                gpu: "node-0/0".into(),
                model: "A100-40GB".into(),
                applied_epoch: 8,
                target_epoch: 9,
                instances: BTreeMap::from([("1g".to_string(), 2), ("3g".to_string(), 1)]),
                drift_instances: 2,
            }]
        });
        m.target_pushed("node-0/0", 9);
        m.target_pushed("node-0/0", 9);
        m.layout_applied("node-0/0", 8);
        m.layout_applied("node-0/0", 9);
        m.layout_applied("node-0/0", 9);
        m
    }

    #[test]
    fn encode_reports_updates() {
        let text = updated().encode();
        for line in [
            "tessera_coordinator_raft_term 7",
            "tessera_coordinator_raft_commit_index 42",
            "tessera_coordinator_raft_applied_index 41",
            "tessera_coordinator_raft_is_leader 1",
            "tessera_coordinator_raft_members 3",
            "tessera_coordinator_proposals_total 1",
            "tessera_coordinator_plan_rounds_total{outcome=\"planned\"} 2",
            "tessera_coordinator_plan_rounds_total{outcome=\"infeasible\"} 1",
            "tessera_coordinator_plan_gpu_solves_total{outcome=\"kept\"} 2",
            "tessera_coordinator_plan_gpu_solves_total{outcome=\"forecast\"} 1",
            "tessera_coordinator_plan_gpu_solves_total{outcome=\"solved\"} 1",
            "tessera_coordinator_plan_gpu_solves_total{outcome=\"health\"} 0",
            "tessera_coordinator_pushes_total{result=\"ok\"} 2",
            "tessera_coordinator_pushes_total{result=\"stale\"} 1",
            "tessera_coordinator_reconfigurations_total 5",
            "tessera_coordinator_plan_round_seconds_count 3",
            "tessera_coordinator_plan_round_seconds_sum 0.875",
            "# UNIT tessera_coordinator_plan_round_seconds seconds",
            "tessera_coordinator_tenants 12",
            "tessera_coordinator_gpus 8",
            "tessera_coordinator_plan_epoch 9",
            "tessera_coordinator_plan_objective 41.5",
            "tessera_coordinator_plan_gap 0.012",
            "tessera_coordinator_gpu_applied_epoch{gpu=\"node-0/0\",model=\"A100-40GB\"} 8",
            "tessera_coordinator_gpu_target_epoch{gpu=\"node-0/0\",model=\"A100-40GB\"} 9",
            "tessera_coordinator_gpu_drift_instances{gpu=\"node-0/0\",model=\"A100-40GB\"} 2",
            "tessera_coordinator_gpu_instances{gpu=\"node-0/0\",model=\"A100-40GB\",profile=\"3g\"} 1",
            // One push of epoch 9, reported applied once (the report of epoch 8 and the repeat do not count).
            "tessera_coordinator_reconfiguration_seconds_count 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("tessera_coordinator_plan_round_seconds_bucket{le=\"60.0\"} 3"), "{text}");
        // Label values nobody used yet are reported at 0.
        assert!(text.contains("tessera_coordinator_plan_rounds_total{outcome=\"error\"} 0"), "{text}");
        assert!(text.contains("tessera_coordinator_pushes_total{result=\"error\"} 0"), "{text}");
        // What Prometheus' own linter says of the text format (when CI provides promtool).
        if let Some(r) = tessera_metrics::promtool_check(&tessera_metrics::to_prometheus_text(&text)) {
            r.unwrap();
        }
    }

    #[test]
    fn fresh_registry_has_all_families_at_zero() {
        let text = Metrics::default().encode();
        for name in [
            "raft_term",
            "raft_commit_index",
            "raft_applied_index",
            "raft_is_leader",
            "raft_members",
            "tenants",
            "gpus",
        ] {
            let line = format!("tessera_coordinator_{name} 0");
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        for family in ["proposals", "plan_rounds", "plan_gpu_solves", "pushes", "reconfigurations", "writes_resent"] {
            assert!(text.contains(&format!("# TYPE tessera_coordinator_{family} counter")), "{family} in:\n{text}");
        }
        assert!(text.contains("# TYPE tessera_coordinator_plan_round_seconds histogram"), "{text}");
    }

    async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: application/openmetrics-text\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(updated());
        let server = tokio::spawn(serve(listener, Arc::clone(&metrics)));

        let response = http_get(addr, "/metrics").await;
        let (head, body) = response.split_once("\r\n\r\n").expect("no header/body separator");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.lines().any(|l| l.eq_ignore_ascii_case(&format!("content-type: {CONTENT_TYPE}"))), "{head}");
        assert!(body.contains("tessera_coordinator_raft_term 7"), "{body}");
        assert!(body.contains("tessera_coordinator_pushes_total{result=\"ok\"} 2"), "{body}");

        // Updates after the server started show up in the next scrape.
        metrics.proposal();
        let response = http_get(addr, "/metrics").await;
        assert!(response.contains("tessera_coordinator_proposals_total 2"), "{response}");

        let response = http_get(addr, "/nope").await;
        assert!(response.starts_with("HTTP/1.1 404"), "{response}");

        // Liveness always; readiness once a leader is known.
        assert!(http_get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        metrics.set_leader_known(true);
        assert!(http_get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        let body = http_get(addr, "/metrics").await;
        let version = env!("CARGO_PKG_VERSION");
        assert!(body.contains(&format!("tessera_coordinator_build_info{{version=\"{version}\"}} 1")), "{body}");

        server.abort();
    }
}
