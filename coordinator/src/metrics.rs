//! Prometheus / OpenMetrics metrics of the coordinator and the HTTP endpoint that serves them.
//!
//! Every family is named `tessera_coordinator_*`: gauges for the Raft state (`raft_term`, `raft_commit_index`,
//! `raft_applied_index`, `raft_is_leader`, `raft_members`) and the fleet (`tenants`, `gpus`); counters
//! `proposals_total`, `plan_rounds_total{outcome}`, `pushes_total{result}` and `reconfigurations_total`; histogram
//! `plan_round_seconds`. [`Metrics`] is `Send + Sync`: share it as `Arc<Metrics>` and update
//! it from any task; [`serve`] exposes it at `GET /metrics`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

/// Prefix of every metric family name (an underscore separates it from the rest).
pub const PREFIX: &str = "tessera_coordinator";

/// `Content-Type` of [`Metrics::encode`]'s output, as served by [`serve`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `outcome` label of `plan_rounds_total` for a round that produced a plan.
pub const OUTCOME_PLANNED: &str = "planned";
/// `outcome` label of `plan_rounds_total` for a round whose demands could not all be placed.
pub const OUTCOME_INFEASIBLE: &str = "infeasible";
/// `outcome` label of `plan_rounds_total` for a round that failed; also `pushes_total`'s `result` for a failed push.
pub const OUTCOME_ERROR: &str = "error";
/// `result` label of `pushes_total` for a push the agent accepted.
pub const PUSH_OK: &str = "ok";
/// `result` label of `pushes_total` for a push the agent rejected as older than its current epoch.
pub const PUSH_STALE: &str = "stale";

/// Upper bounds (seconds) of the duration histograms' buckets: a 1-2-5 series from 1 ms to 60 s (roughly
/// exponential, about 2.2x per step), plus the implicit `+Inf`.
pub const DURATION_BUCKETS: [f64; 16] =
    [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0];

/// A label set with one label whose value is chosen at run time.
type OneLabel = [(&'static str, String); 1];

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
    pushes: Family<OneLabel, Counter>,
    reconfigurations: Counter,
    plan_round_seconds: Histogram,
    tenants: Gauge,
    gpus: Gauge,
    node_health_changes: Family<OneLabel, Counter>,
    proposals_dropped_late: Counter,
    auth_refusals: Family<OneLabel, Counter>,
    build_info: Family<OneLabel, Gauge>,
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
            pushes: Family::default(),
            reconfigurations: Counter::default(),
            plan_round_seconds: Histogram::new(DURATION_BUCKETS),
            tenants: Gauge::default(),
            gpus: Gauge::default(),
            node_health_changes: Family::default(),
            proposals_dropped_late: Counter::default(),
            auth_refusals: Family::default(),
            build_info: Family::default(),
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
             term_out_of_bounds)",
            metrics.auth_refusals.clone(),
        );
        for kind in ["unauthenticated", "permission_denied", "term_out_of_bounds"] {
            drop(metrics.auth_refusals.get_or_create(&[("kind", kind.to_owned())]));
        }
        registry.register(
            "proposals_dropped_late",
            "Proposals forwarded by a follower that arrived after their deadline and were dropped",
            metrics.proposals_dropped_late.clone(),
        );
        Self { registry, ..metrics }
    }

    /// Sets the Raft gauges: term, commit and applied index, leadership (1/0) and number of voting members.
    pub fn set_raft(&self, term: u64, commit: u64, applied: u64, is_leader: bool, members: usize) {
        self.raft_term.set(saturating_i64(term));
        self.raft_commit_index.set(saturating_i64(commit));
        self.raft_applied_index.set(saturating_i64(applied));
        self.raft_is_leader.set(i64::from(is_leader));
        self.raft_members.set(saturating_i64(members as u64));
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

    /// Counts forwarded proposals dropped because they arrived after their deadline.
    pub fn proposals_dropped_late(&self, n: u64) {
        self.proposals_dropped_late.inc_by(n);
    }

    /// Sets the fleet gauges: number of tenants and of GPUs.
    pub fn set_fleet(&self, tenants: usize, gpus: usize) {
        self.tenants.set(saturating_i64(tenants as u64));
        self.gpus.set(saturating_i64(gpus as u64));
    }

    /// The whole registry in the OpenMetrics text format (ending in `# EOF`), as served with [`CONTENT_TYPE`].
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

fn saturating_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

// Compile-time proof that `Metrics` can be shared across tasks.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Metrics>();
};

/// Serves `metrics` over HTTP/1.1 on `listener` until the listener fails: `GET /metrics` answers the OpenMetrics text
/// ([`CONTENT_TYPE`]); any other path is 404 and other methods on `/metrics` are 405.
pub async fn serve(listener: tokio::net::TcpListener, metrics: Arc<Metrics>) -> std::io::Result<()> {
    axum::serve(listener, router(metrics)).await
}

/// The axum router behind [`serve`], for embedding the endpoint in another server: `/metrics`, `/healthz` (200
/// while the process serves) and `/readyz` (200 once this member knows a leader, so its API can answer; 503 before,
/// and during an election).
pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new()
        .route("/metrics", get(get_metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(get_ready))
        .with_state(metrics)
}

async fn get_ready(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    if metrics.leader_known.load(std::sync::atomic::Ordering::Relaxed) {
        (axum::http::StatusCode::OK, "ready: a leader is known\n")
    } else {
        (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready: no leader known\n")
    }
}

async fn get_metrics(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.encode())
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
            "tessera_coordinator_pushes_total{result=\"ok\"} 2",
            "tessera_coordinator_pushes_total{result=\"stale\"} 1",
            "tessera_coordinator_reconfigurations_total 5",
            "tessera_coordinator_plan_round_seconds_count 3",
            "tessera_coordinator_plan_round_seconds_sum 0.875",
            "# UNIT tessera_coordinator_plan_round_seconds seconds",
            "tessera_coordinator_tenants 12",
            "tessera_coordinator_gpus 8",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(text.contains("tessera_coordinator_plan_round_seconds_bucket{le=\"60.0\"} 3"), "{text}");
        // Label values nobody used yet are reported at 0.
        assert!(text.contains("tessera_coordinator_plan_rounds_total{outcome=\"error\"} 0"), "{text}");
        assert!(text.contains("tessera_coordinator_pushes_total{result=\"error\"} 0"), "{text}");
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
        for family in ["proposals", "plan_rounds", "pushes", "reconfigurations"] {
            assert!(text.contains(&format!("# TYPE tessera_coordinator_{family} counter")), "{family} in:\n{text}");
        }
        assert!(text.contains("# TYPE tessera_coordinator_plan_round_seconds histogram"), "{text}");
    }

    async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
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
