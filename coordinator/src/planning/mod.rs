//! The leader's planning loop: per window, snapshot the replicated state, build the [`PlannerInput`] (forecasts
//! from the arrivals agents report), run the configured policy, propose the plan, and once it is committed push each
//! node its GPUs' targets with the plan epoch. A pusher re-sends committed targets to agents that have not
//! acknowledged them (a new leader does so once for every node), so an agent converges to the newest committed
//! plan and never receives an older epoch after a newer one from this leader (agents refuse older epochs anyway).
//!
//! The leader also judges the nodes ([`FailureDetection`]): a node whose heartbeats stop, or whose pushes keep
//! failing, becomes suspect (it keeps its work and gets none new); one silent past `fail_after` becomes failed, and a
//! round runs at once that empties its GPUs and serves its tenants elsewhere. Verdicts are replicated
//! (`SetNodeHealth`), so a new leader plans with them; it gives every node a fresh grace period, since heartbeats
//! seen by the old leader are not replicated. A failed node that heartbeats again is healthy again: the pusher sends
//! it its (empty) target and later rounds may give it work.
//!
//! Each round is a `planning_round` span, with a `gpu_solve` child per GPU and a `reconfiguration` child per GPU
//! whose layout changes, carrying what an operator needs to see why a layout changed.
//!
//! This file holds the settings and the loop; `round.rs` the round (what agents reported, the input, plan, commit,
//! push and trace, the burst rule); `failure.rs` the failure detector's state and verdicts; `push.rs` the pusher
//! (channels, epochs, acknowledgements, hand-overs). Each has its tests beside it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tessera_core::fleet::{Command, NodeHealth};
use tessera_core::ids::{GpuId, NodeId};
use tessera_core::time::SimTime;
use tessera_planner::input::PlannerConfig;
use tessera_planner::policy::{PlanError, Policy};
use tessera_planner::round::Rounds;
use tessera_planner::settings::RoundSettings;

use crate::metrics::Metrics;
use crate::replica::{Replica, ReplicaError};
use crate::state::Op;

mod failure;
mod push;
mod round;

pub use failure::FailureDetection;
use failure::FailureDetector;
pub use push::PushError;
use push::Pusher;
use round::{Change, Observations};
pub use round::{GpuDecision, RoundResult};

/// Rate assumed for a tenant nobody has reported arrivals for and whose demand names no rate.
const UNKNOWN_RATE_RPS: f64 = 1.0;

/// How workload time advances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockMode {
    /// The wall clock; the leader plans every `plan_every`.
    Wall,
    /// Virtual: replay moves it with `AdvanceClock`, and a round runs when a window boundary passes.
    Virtual,
}

/// Why a planning round produced no plan.
#[derive(Debug, thiserror::Error)]
pub enum RoundError {
    /// Reading or writing the replicated state failed (not the leader, no quorum, ...).
    #[error(transparent)]
    Replica(#[from] ReplicaError),
    /// The policy failed: bad input or a solver error.
    #[error("planner: {0}")]
    Plan(#[from] PlanError),
    /// The policy panicked.
    #[error("the planner panicked: {0}")]
    Panicked(tokio::task::JoinError),
}

/// What the leader plans with: the policy, how rounds plan, the interference table, and what is the
/// coordinator's own (its clock, its pushes, its failure detector and its certificate).
#[derive(Debug, Clone)]
pub struct PlanningSettings {
    /// Policy name.
    pub policy: String,
    /// How rounds plan (window, slots, horizon, forecaster, gap...), as replay plans.
    pub round: RoundSettings,
    /// The interference table every round is planned with (`None`: none).
    pub interference: Option<tessera_planner::input::Interference>,
    /// Workload clock.
    pub clock: ClockMode,
    /// Deadline of one push to an agent.
    pub push_timeout: Duration,
    /// The failure detector (`None`: off).
    pub failure_detection: Option<FailureDetection>,
    /// This member's certificate for mutual TLS with agents (`None`: plaintext).
    pub tls: Option<tessera_auth::TlsFiles>,
}

/// Planning settings a planner cannot start with.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// No policy has the name.
    #[error(transparent)]
    Policy(#[from] tessera_planner::error::UnknownPolicy),
    /// A round setting is out of range.
    #[error("planner.{0}")]
    Round(#[from] tessera_planner::error::InvalidField),
}

/// The highest request rate an agent's report is believed to show for one tenant (requests/s): a rate, measured or
/// derived from counters, beyond it counts as this much. A coarse sanity bound (a forged counter once made a tenant's
/// forecast 657,000 rps); the agent's certificate, and the placement check of heartbeats, are the finer defence.
pub const MAX_REPORTED_RPS: f64 = 100_000.0;

/// The planning loop's state on this node (only the leader plans).
pub struct Planner {
    node: Replica,
    policy: Box<dyn Policy>,
    settings: PlanningSettings,
    /// What every round plans with (`settings.round`'s).
    config: PlannerConfig,
    metrics: Arc<Metrics>,
    round: tokio::sync::Mutex<()>,
    observations: Mutex<Observations>,
    last_input: Mutex<Option<(u64, String)>>,
    decisions: Mutex<BTreeMap<GpuId, GpuDecision>>,
    /// Per node: heartbeats and pushes this leader saw, and its verdicts.
    detector: FailureDetector,
    /// Channels to the agents, and what each node acknowledged and was pushed.
    pusher: Pusher,
    /// Where tenants are served now (from the agents' heartbeats).
    routes: Arc<crate::routes::RouteTable>,
}

/// Longest a push waits for the new home of a tenant it moves away (then the move is break-before-make).
pub const HANDOVER_LIMIT: Duration = Duration::from_secs(120);

/// Workload time now on the wall clock.
fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Planner {
    /// A planner over `node` (the policy name is checked by the configuration).
    pub fn new(
        node: Replica,
        settings: PlanningSettings,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Planner>, SettingsError> {
        let policy = tessera_planner::policies::by_name(&settings.policy)?;
        settings.round.validate()?;
        let mut rounds = Rounds::new(settings.round.forecaster_config()?);
        rounds.set_interference(settings.interference.clone());
        let config = settings.round.planner_config();
        let pusher = Pusher::new(settings.push_timeout, settings.tls.clone());
        Ok(Arc::new(Planner {
            node,
            policy,
            settings,
            config,
            metrics,
            round: tokio::sync::Mutex::new(()),
            observations: Mutex::new(Observations::new(rounds)),
            last_input: Mutex::new(None),
            decisions: Mutex::new(BTreeMap::new()),
            detector: FailureDetector::default(),
            pusher,
            routes: Arc::default(),
        }))
    }

    /// Where tenants are served now (the agents' endpoints), for `GetRoutes` and for ordering moves between nodes.
    pub fn routes(&self) -> &Arc<crate::routes::RouteTable> {
        &self.routes
    }

    /// The workload time now: the replicated virtual clock, or the wall clock.
    pub fn now_ms(&self) -> u64 {
        match self.settings.clock {
            ClockMode::Virtual => self.node.read(|s| s.clock_ms),
            ClockMode::Wall => wall_ms(),
        }
    }

    /// Settings.
    pub fn settings(&self) -> &PlanningSettings {
        &self.settings
    }

    /// Counts `n` refused reports of kind `kind` (`auth_refusals`).
    pub fn refused(&self, kind: &str, n: u64) {
        self.metrics.auth_refusals(kind, n);
    }

    /// Records a heartbeat from `node` (the leader answers every heartbeat; followers forward them).
    pub fn saw(&self, node: &NodeId) {
        self.detector.saw(node);
    }

    /// The failure detector's pass: commits a verdict for every node whose health changes, and plans at once when a
    /// node failed. Returns the verdicts committed.
    pub async fn check_health(self: &Arc<Self>) -> Vec<(NodeId, NodeHealth)> {
        let Some(fd) = &self.settings.failure_detection else { return Vec::new() };
        let now = Instant::now();
        let nodes: Vec<(NodeId, NodeHealth)> =
            self.node.read(|s| s.fleet.nodes.iter().map(|(id, n)| (id.clone(), n.health)).collect());
        let verdicts = self.detector.verdicts(fd, &nodes, now);
        let at = SimTime::from_ms(self.now_ms());
        let mut committed = Vec::new();
        for (node, health, reason) in verdicts {
            let command = Command::SetNodeHealth { node: node.clone(), health, reason: reason.clone(), at };
            match self.node.propose(Op::Fleet { command }).await {
                Ok(_) => {
                    self.metrics.node_health(health.name());
                    if health == NodeHealth::Healthy {
                        tracing::info!(%node, %reason, "node healthy");
                    } else {
                        tracing::warn!(%node, health = health.name(), %reason, "node health changed");
                    }
                    committed.push((node, health));
                }
                Err(e) => tracing::warn!(%node, error = %e, "could not commit a node health verdict"),
            }
        }
        if committed.iter().any(|(_, h)| *h == NodeHealth::Failed)
            && let Err(e) = self.round("node-failed").await
        {
            tracing::warn!(error = %e, "replanning after a node failure failed; the next window retries");
        }
        committed
    }

    /// Forgets which nodes acknowledged what, and the warm starts (on losing or gaining leadership).
    pub fn reset_pushes(&self) {
        self.pusher.reset();
        // Heartbeats are not replicated: a new leader gives every node a fresh grace period.
        self.detector.clear();
        self.observations.lock().expect("observations lock").forget_warm_starts();
    }

    /// The leader's background duties: load model profiles, plan every window (wall clock), re-push
    /// unacknowledged targets. Runs until the process ends.
    pub async fn run(self: Arc<Self>, models: BTreeMap<String, tessera_core::model::ModelProfile>) {
        let mut status = self.node.watch_status();
        let mut was_leader = false;
        let mut next_round = Instant::now() + self.settings.round.plan_every;
        let mut tick = tokio::time::interval(Duration::from_millis(500));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = status.changed() => if changed.is_err() { return },
            }
            let leader = self.node.not_leader().is_none();
            if leader && !was_leader {
                tracing::info!(id = self.node.id(), "became leader: resuming from the last committed plan");
                self.reset_pushes();
                self.load_models(&models).await;
                next_round = Instant::now() + self.settings.round.plan_every;
            }
            if !leader && was_leader {
                self.reset_pushes();
            }
            was_leader = leader;
            if !leader {
                continue;
            }
            self.check_health().await;
            if self.settings.clock == ClockMode::Wall && Instant::now() >= next_round {
                next_round = Instant::now() + self.settings.round.plan_every;
                if let Err(e) = self.round("window").await {
                    tracing::warn!(error = %e, "scheduled planning round failed");
                }
            } else {
                self.push_all(None, &[]).await;
            }
        }
    }

    async fn load_models(&self, models: &BTreeMap<String, tessera_core::model::ModelProfile>) {
        let missing: Vec<_> =
            self.node.read(|s| models.values().filter(|m| s.fleet.models.get(&m.name) != Some(m)).cloned().collect());
        for profile in missing {
            let name = profile.name.clone();
            if let Err(e) = self.node.propose(Op::Fleet { command: Command::PutModel { profile } }).await {
                tracing::warn!(model = %name, error = %e, "could not load a model profile");
            }
        }
    }
}

/// `v` as an OpenTelemetry integer attribute (`tracing` sends `u64` fields as strings); saturates.
fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}
