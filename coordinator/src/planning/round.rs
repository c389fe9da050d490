//! One planning round on the leader: what the agents reported (arrival counters and slot rates, folded into each
//! tenant's forecaster), the input a round plans from, the round itself (plan, commit, push, trace) and the burst
//! rule that calls one inside a window.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use tessera_core::fleet::{Command, FleetState, GpuHealth, NodeHealth};
use tessera_core::ids::{GpuId, NodeId, TenantId};
use tessera_core::plan::GpuPlan;
use tessera_core::tenant::DemandSource;
use tessera_core::time::SimTime;
use tessera_planner::input::{GpuInput, PlannerInput};
use tessera_planner::level2::solver::SolveStatus;
use tessera_planner::policy::PlanOutcome;
use tessera_planner::round::{Rounds, TenantState};
use tessera_proto::v1;
use tracing::{Instrument, field::Empty};

use super::{MAX_REPORTED_RPS, Planner, RoundError, UNKNOWN_RATE_RPS, as_i64};
use crate::state::{CoordState, Op};

/// What a round did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RoundResult {
    /// `planned`, `infeasible` or `empty` (no GPU or no tenant).
    pub outcome: String,
    /// The committed epoch (0 when nothing was committed).
    pub epoch: u64,
    /// Planning value: expected goodput, plus what completed retrainings earn beyond the horizon (tessera).
    pub objective: f64,
    /// Bound.
    pub bound: f64,
    /// Relative gap.
    pub gap: f64,
    /// Policy time, ms.
    pub solve_ms: f64,
    /// Why nothing was planned.
    pub reason: String,
    /// Nodes pushed to.
    pub pushed: u32,
    /// Failed pushes.
    pub push_failures: u32,
}

/// The last round's decision for one GPU, for `Explain`.
#[derive(Debug, Clone, Default)]
pub struct GpuDecision {
    /// Solver status.
    pub status: String,
    /// Planning value: expected goodput, plus what completed retrainings earn beyond the horizon (tessera).
    pub objective: f64,
    /// Bound.
    pub bound: f64,
    /// Tenants planned on it.
    pub tenants: usize,
    /// Forecast mean per tenant, rps.
    pub forecasts: BTreeMap<String, f64>,
}

/// What the agents reported about arrivals: cumulative counters per (node, tenant), and per-slot rates.
pub(super) struct Observations {
    /// (workload time ms, cumulative arrivals) per (node, tenant).
    counters: HashMap<(NodeId, TenantId), (u64, u64)>,
    tenants: HashMap<TenantId, TenantObs>,
    /// Each tenant's forecaster, the warm starts of this leader's last committed plan (a hint, not replicated: a
    /// new leader plans its first round cold) and the forecasts of the last round, for the burst rule.
    rounds: Rounds,
}

impl Observations {
    /// Nothing observed yet; forecasts and warm starts kept in `rounds`.
    pub(super) fn new(rounds: Rounds) -> Observations {
        Observations { counters: HashMap::new(), tenants: HashMap::new(), rounds }
    }

    /// Records what `node` reported at `now_ms`: each tenant's arrival counter, and its measured slot rates (finite
    /// ones, clamped to [`MAX_REPORTED_RPS`]) fed to its forecaster; the last of them waits for the burst rule.
    pub(super) fn record(&mut self, node: &NodeId, now_ms: u64, metrics: &[v1::TenantMetrics]) {
        for m in metrics {
            let Ok(t) = TenantId::new(m.tenant.clone()) else { continue };
            self.counters.insert((node.clone(), t.clone()), (now_ms, m.arrivals));
            if !m.slot_rates.is_empty() {
                for r in m.slot_rates.iter().filter(|r| r.is_finite()) {
                    self.rounds.observe(&t, r.clamp(0.0, MAX_REPORTED_RPS));
                }
                let o = self.tenants.entry(t).or_insert_with(|| Planner::fresh_obs(now_ms));
                o.by_slot = true;
                // The burst rule reads what the forecaster was fed: the last finite rate, bounded alike.
                o.unchecked = m.slot_rates.iter().rev().find(|r| r.is_finite()).map(|r| r.clamp(0.0, MAX_REPORTED_RPS));
            }
        }
    }

    /// Forgets the warm starts of this leader's last plan (a new leader plans its first round cold).
    pub(super) fn forget_warm_starts(&mut self) {
        self.rounds.forget_warm_starts();
    }
}

/// What a tenant's measured rates have been learnt from (its forecaster is in [`Rounds`]).
struct TenantObs {
    /// Fed from per-slot rates (agents that measure them); the counters are then ignored.
    by_slot: bool,
    /// Total arrivals and the time of the last counter-based observation.
    last_total: u64,
    last_at: u64,
    /// The last slot rate reported and not yet checked for a burst.
    unchecked: Option<f64>,
}

/// Reports GPU `g`'s level-2 solve as a `gpu_solve` span under the round, with the times the planner measured.
#[allow(clippy::too_many_arguments)]
fn trace_gpu_solve(
    round: &tracing::Span,
    input: &PlannerInput,
    g: &tessera_planner::policy::GpuStats,
    outcome: Option<&tessera_planner::policy::GpuOutcome>,
    tenants: &[String],
    forecasts: &BTreeMap<String, f64>,
    target: Option<&GpuPlan>,
    time: &tessera_planner::policy::SolveTime,
) {
    use opentelemetry::{Array, KeyValue, Value};
    let gpu = input.gpus.get(&g.gpu);
    let mut attributes = vec![
        KeyValue::new("tessera.gpu", g.gpu.to_string()),
        KeyValue::new("tessera.gpu.model", gpu.map(|x| x.model.to_string()).unwrap_or_default()),
        KeyValue::new(
            "tessera.tenants",
            Value::Array(Array::String(tenants.iter().map(|t| t.clone().into()).collect())),
        ),
        KeyValue::new(
            "tessera.forecast.mean_rps",
            Value::Array(Array::F64(tenants.iter().map(|t| forecasts.get(t).copied().unwrap_or(0.0)).collect())),
        ),
        KeyValue::new("tessera.tenant.count", g.tenants as i64),
        KeyValue::new("tessera.candidate_profiles", outcome.map_or(0, |o| o.problem.profiles.len()) as i64),
        KeyValue::new("tessera.layout.current", gpu.map(|x| x.layout.to_string()).unwrap_or_default()),
        KeyValue::new("tessera.layout.chosen", target.map(|t| t.layout.to_string()).unwrap_or_default()),
        KeyValue::new("tessera.plan.objective", g.objective),
        KeyValue::new("tessera.plan.bound", g.bound),
        KeyValue::new("tessera.solver.status", format!("{:?}", g.status)),
        KeyValue::new("tessera.explanation", target.map(|t| t.explanation.clone()).unwrap_or_default()),
        // Incremental rounds: whether the GPU kept its last plan, shifted forward, and else why it was solved again.
        KeyValue::new("tessera.plan.kept", g.status == SolveStatus::Shifted),
    ];
    if let Some(why) = g.replanned {
        attributes.push(KeyValue::new("tessera.replan.reason", why.name()));
    }
    crate::telemetry::completed_span(
        round,
        "gpu_solve",
        opentelemetry::trace::SpanKind::Internal,
        (time.started, time.started + time.elapsed),
        attributes,
        opentelemetry::trace::Status::Ok,
    );
}

/// One GPU whose target a round changes: its layout before and after, and the MIG steps between them.
#[derive(Debug, Clone)]
pub struct Change {
    /// The GPU.
    pub gpu: GpuId,
    /// Its previous target's layout (what it reported, when it had no target).
    pub from: String,
    /// The new target's layout.
    pub to: String,
    /// The steps the agent's reconciler takes from the previous target to the new one: the same diff
    /// (`tessera_core::reconfig::diff_assigned`), reassignments included.
    pub steps: usize,
    /// Whether the layout or the assignments change (else only a retraining's configuration or the sharing mode:
    /// pushed, but not counted as a reconfiguration).
    pub reconfigures: bool,
}

/// Placements that differ between two layouts (the step count when a layout does not fit its GPU's model).
fn layout_steps(from: &tessera_core::Layout, to: &tessera_core::Layout) -> usize {
    let a: std::collections::BTreeSet<_> = from.placements().iter().collect();
    let b: std::collections::BTreeSet<_> = to.placements().iter().collect();
    a.symmetric_difference(&b).count()
}

impl Planner {
    /// Records an agent's arrival counters and measured slot rates (from a heartbeat).
    pub fn observe(&self, node: &NodeId, now_ms: u64, metrics: &[v1::TenantMetrics]) {
        self.observations.lock().expect("observations lock").record(node, now_ms, metrics);
    }

    fn fresh_obs(now_ms: u64) -> TenantObs {
        TenantObs { by_slot: false, last_total: 0, last_at: now_ms, unchecked: None }
    }

    /// Whether the slot rates reported since the last check, for the slot that ended at `now_ms`, leave the bands
    /// of the forecasts the last round was made with by enough to replan the fleet ([`burst_calls_replan`]). Each
    /// reported rate is checked once; before any round, nothing is.
    pub fn burst_left_band(&self, now_ms: u64) -> bool {
        let mut obs = self.observations.lock().expect("observations lock");
        let Some(made_at) = obs.rounds.last_forecasts().map(|p| p.at.as_ms()) else { return false };
        let slot_ms = (self.settings.round.slot.as_millis() as u64).max(1);
        // The slot that ended at `now_ms`, counted from the round's first.
        let k = (now_ms.saturating_sub(made_at) / slot_ms).saturating_sub(1) as usize;
        let rates: HashMap<TenantId, f64> =
            obs.tenants.iter_mut().filter_map(|(t, o)| o.unchecked.take().map(|r| (t.clone(), r))).collect();
        obs.rounds.burst_calls_replan(k, |t| rates.get(t).copied())
    }

    /// The last round's input as JSON, with its epoch.
    pub fn last_input(&self) -> Option<(u64, String)> {
        self.last_input.lock().expect("input lock").clone()
    }

    /// The last round's decision for a GPU on this node.
    pub fn decision(&self, gpu: &GpuId) -> Option<GpuDecision> {
        self.decisions.lock().expect("decisions lock").get(gpu).cloned()
    }

    /// Feeds each active tenant's forecaster what its arrival counters say happened since the last round (unless
    /// its agents report per-slot rates), and primes the forecaster of a tenant nothing was measured for with the
    /// rate it declares (or a nominal one).
    fn advance_forecasts(obs: &mut Observations, state: &CoordState, now_ms: u64, advance: bool) {
        let mut totals: HashMap<TenantId, (u64, u64)> = HashMap::new();
        for ((_, t), (at, count)) in &obs.counters {
            let e = totals.entry(t.clone()).or_default();
            e.0 = e.0.max(*at);
            e.1 += count;
        }
        for spec in state.fleet.active_tenants() {
            let fallback = match &spec.demand {
                DemandSource::Poisson { rate_rps } => *rate_rps,
                DemandSource::Trace { .. } => UNKNOWN_RATE_RPS,
            };
            let seen = totals.get(&spec.id).copied();
            let observed = obs.rounds.observations(&spec.id);
            let o = obs.tenants.entry(spec.id.clone()).or_insert_with(|| Self::fresh_obs(now_ms));
            let mut rate = None;
            if advance && !o.by_slot {
                match seen {
                    // The first counters only set the baseline.
                    Some((at, total)) if observed > 0 && at > o.last_at && total >= o.last_total => {
                        let measured = (total - o.last_total) as f64 / ((at - o.last_at) as f64 / 1000.0);
                        rate = Some(measured.min(MAX_REPORTED_RPS));
                        (o.last_total, o.last_at) = (total, at);
                    }
                    Some((at, total)) => (o.last_total, o.last_at) = (total, at),
                    None => {}
                }
            }
            if let Some(r) = rate {
                obs.rounds.observe(&spec.id, r);
            }
            if observed == 0 {
                // Nothing measured yet: the rate the tenant declares (or a nominal one) primes the forecaster.
                obs.rounds.observe(&spec.id, fallback);
            }
        }
    }

    /// Builds the round's input from the state ([`Rounds::input`]).
    pub fn build_input(&self, state: &CoordState, now_ms: u64, advance_forecasts: bool) -> PlannerInput {
        let mut obs = self.observations.lock().expect("observations lock");
        Self::advance_forecasts(&mut obs, state, now_ms, advance_forecasts);
        let fleet: &FleetState = &state.fleet;
        let node_health = |id: &GpuId| fleet.nodes.get(&id.node).map_or(NodeHealth::Failed, |n| n.health);
        let usable = |id: &GpuId, g: &tessera_core::fleet::GpuState| {
            g.mig_enabled && g.health != GpuHealth::Failed && node_health(id) != NodeHealth::Failed
        };
        let gpus = fleet.gpus.iter().filter(|(id, g)| usable(id, g)).map(|(id, g)| {
            // A suspect node keeps its work and gets none new, as a draining GPU.
            let health = if node_health(id) == NodeHealth::Suspect && g.health == GpuHealth::Healthy {
                GpuHealth::Draining
            } else {
                g.health
            };
            let input = GpuInput {
                model: g.model,
                health,
                layout: g.applied.clone(),
                assignments: g.applied_assignments.clone(),
                warm: None,
                // The node's driver's memory figures, where it reported any at registration.
                memory_gib: g.memory_gib.clone(),
            };
            (id.clone(), input)
        });
        let tenants = fleet.active_tenants().map(|spec| {
            let status = fleet.tenant_status.get(&spec.id);
            let done = status.map_or(0.0, |s| s.retraining_done_gpu_s);
            let due = status
                .and_then(|s| s.retraining_due)
                .unwrap_or_else(|| spec.retraining.as_ref().is_some_and(|r| done < r.work_gpu_s));
            TenantState {
                spec: spec.clone(),
                actual: None,
                accuracy: status.map_or_else(|| spec.initial_accuracy(), |s| s.accuracy),
                retraining_due: due,
                retraining_done_gpu_s: done,
                retraining_epochs: fleet.retraining_epochs(&spec.id),
            }
        });
        let config = self.config.clone();
        let epoch = fleet.plan_epoch + 1;
        let models = fleet.models.clone();
        obs.rounds.input(epoch, SimTime::from_ms(now_ms), config, models, gpus, tenants, UNKNOWN_RATE_RPS)
    }

    /// Runs one planning round on the leader: plan, commit, push.
    pub async fn round(self: &Arc<Self>, trigger: &'static str) -> Result<RoundResult, RoundError> {
        let _one_at_a_time = self.round.lock().await;
        let started = Instant::now();
        if let Some(e) = self.node.not_leader() {
            return Err(e.into());
        }
        self.node.read_index().await?;
        let now_ms = self.now_ms();
        let (input, old_targets) = self.node.read(|s| {
            let targets: BTreeMap<GpuId, Option<GpuPlan>> =
                s.fleet.gpus.iter().map(|(id, g)| (id.clone(), g.target.clone())).collect();
            (self.build_input(s, now_ms, true), targets)
        });
        let span = tracing::info_span!(
            "planning_round",
            tessera.round.trigger = trigger,
            tessera.policy = %self.settings.policy,
            tessera.plan.epoch = as_i64(input.epoch),
            tessera.workload_time_ms = as_i64(now_ms),
            tessera.gpu.count = input.gpus.len() as i64,
            tessera.tenant.count = input.tenants.len() as i64,
            tessera.round.outcome = Empty,
            tessera.plan.objective = Empty,
            tessera.plan.bound = Empty,
            tessera.plan.gap = Empty,
            tessera.plan.solve_ms = Empty,
            tessera.push.ok = Empty,
            tessera.push.failed = Empty,
            otel.status_code = Empty,
            otel.status_description = Empty,
        );
        let result = self.round_in(input, old_targets, &span).instrument(span.clone()).await;
        crate::telemetry::record_status(&span, &result);
        match &result {
            Ok(r) => {
                span.record("tessera.round.outcome", r.outcome.as_str());
                self.metrics.observe_round(&r.outcome, started.elapsed().as_secs_f64());
                if r.epoch > 0 {
                    self.metrics.set_round(r.epoch, r.objective, r.bound, r.gap);
                }
            }
            Err(e) => {
                span.record("tessera.round.outcome", "error");
                tracing::warn!(parent: &span, error = %e, "planning round failed");
                self.metrics.observe_round("error", started.elapsed().as_secs_f64());
            }
        }
        result
    }

    async fn round_in(
        self: &Arc<Self>,
        input: PlannerInput,
        old_targets: BTreeMap<GpuId, Option<GpuPlan>>,
        span: &tracing::Span,
    ) -> Result<RoundResult, RoundError> {
        *self.last_input.lock().expect("input lock") =
            Some((input.epoch, serde_json::to_string_pretty(&input).expect("planner input serialises")));
        // Burst checks compare with this round's forecasts (kept by `Rounds::input`) until the next round; rates
        // reported before it are not checked against it.
        self.observations.lock().expect("observations lock").tenants.values_mut().for_each(|o| o.unchecked = None);
        if input.gpus.is_empty() || input.tenants.is_empty() {
            return Ok(RoundResult {
                outcome: "empty".into(),
                reason: format!("{} GPUs and {} tenants: nothing to plan", input.gpus.len(), input.tenants.len()),
                ..Default::default()
            });
        }
        let started = Instant::now();
        let me = Arc::clone(self);
        let input = Arc::new(input);
        let planned_input = Arc::clone(&input);
        let outcome = tokio::task::spawn_blocking(move || me.policy.plan(&planned_input))
            .await
            .map_err(RoundError::Panicked)??;
        let solve_ms = started.elapsed().as_secs_f64() * 1000.0;
        span.record("tessera.plan.solve_ms", solve_ms);
        let report = match outcome {
            PlanOutcome::Infeasible { reason } => {
                return Ok(RoundResult { outcome: "infeasible".into(), solve_ms, reason, ..Default::default() });
            }
            PlanOutcome::Planned(report) => report,
        };
        let stats = &report.stats;
        span.record("tessera.plan.objective", stats.objective);
        span.record("tessera.plan.bound", stats.bound);
        span.record("tessera.plan.gap", stats.gap);
        let mut decisions = BTreeMap::new();
        for g in &stats.gpus {
            let outcome = report.outcomes.get(&g.gpu);
            let tenants: Vec<String> =
                outcome.map(|o| o.problem.tenants.iter().map(|t| t.id.to_string()).collect()).unwrap_or_default();
            let forecasts: BTreeMap<String, f64> = tenants
                .iter()
                .filter_map(|t| {
                    let id = TenantId::new(t.clone()).ok()?;
                    let f = &input.tenants.get(&id)?.forecast;
                    Some((t.clone(), f.mean.iter().sum::<f64>() / f.mean.len().max(1) as f64))
                })
                .collect();
            self.metrics.observe_gpu_solve(g.status == SolveStatus::Shifted, g.replanned);
            if let Some(time) = report.solve_times.get(&g.gpu) {
                trace_gpu_solve(span, &input, g, outcome, &tenants, &forecasts, report.plan.gpus.get(&g.gpu), time);
            }
            decisions.insert(
                g.gpu.clone(),
                GpuDecision {
                    status: format!("{:?}", g.status),
                    objective: g.objective,
                    bound: g.bound,
                    tenants: g.tenants,
                    forecasts,
                },
            );
        }
        *self.decisions.lock().expect("decisions lock") = decisions;
        let mut plan = report.plan.clone();
        // GPUs out of the round (failed, or on a failed node) that still hold work are emptied in the same commit,
        // so their tenants are never assigned twice and their agents clear them if they come back.
        let emptied: Vec<GpuId> = self.node.read(|s| {
            s.fleet
                .gpus
                .iter()
                .filter(|(id, g)| {
                    let failed = g.health == GpuHealth::Failed
                        || s.fleet.nodes.get(&id.node).is_some_and(|n| n.health == NodeHealth::Failed);
                    failed && g.target.as_ref().is_some_and(|t| !t.layout.is_empty() || !t.assignments.is_empty())
                })
                .map(|(id, _)| id.clone())
                .collect()
        });
        for id in emptied {
            plan.gpus.entry(id).or_insert_with(|| GpuPlan {
                layout: tessera_core::Layout::default(),
                assignments: Vec::new(),
                expected_goodput: 0.0,
                explanation: "emptied: the GPU or its node failed".into(),
                upcoming: Vec::new(),
                retraining_epochs: BTreeMap::new(),
                sharing: Default::default(),
            });
        }
        let epoch = plan.epoch;
        let changed: Vec<Change> = plan
            .gpus
            .iter()
            .filter_map(|(id, t)| {
                let before = old_targets.get(id).cloned().flatten();
                let same_work = |b: &GpuPlan| b.layout == t.layout && b.assignments == t.assignments;
                if before.as_ref().is_some_and(|b| {
                    // A plan that changes only a retraining's configuration (its epochs) or the sharing mode is
                    // pushed too: the agent runs its retraining at the epochs of the latest plan it took, as the
                    // in-process executor does.
                    same_work(b) && b.retraining_epochs == t.retraining_epochs && b.sharing == t.sharing
                }) {
                    return None;
                }
                let reconfigures = !before.as_ref().is_some_and(same_work);
                // Without an earlier target, the agent starts from the layout it reported, running nothing of ours.
                let (from, work) = match before {
                    Some(b) => (b.layout, b.assignments),
                    None => (input.gpus.get(id).map(|g| g.layout.clone()).unwrap_or_default(), Vec::new()),
                };
                let steps = input.gpus.get(id).map_or_else(
                    || layout_steps(&from, &t.layout),
                    |g| {
                        let latency = tessera_core::reconfig::ReconfigLatency::default();
                        tessera_core::reconfig::diff_assigned(
                            g.model,
                            &from,
                            &work,
                            &t.layout,
                            &t.assignments,
                            &latency,
                        )
                        .map_or_else(|_| layout_steps(&from, &t.layout), |p| p.steps.len())
                    },
                );
                Some(Change { gpu: id.clone(), from: from.to_string(), to: t.layout.to_string(), steps, reconfigures })
            })
            .collect();
        self.node.propose(Op::Fleet { command: Command::CommitPlan { plan } }).await?;
        self.observations.lock().expect("observations lock").rounds.planned(Some(&report));
        for Change { gpu, .. } in &changed {
            self.metrics.target_pushed(&gpu.to_string(), epoch);
        }
        let (pushed, push_failures) = self.push_all(Some(span), &changed).await;
        span.record("tessera.push.ok", i64::from(pushed));
        span.record("tessera.push.failed", i64::from(push_failures));
        self.metrics.reconfigurations(changed.iter().filter(|c| c.reconfigures).count() as u64);
        Ok(RoundResult {
            outcome: "planned".into(),
            epoch,
            objective: stats.objective,
            bound: stats.bound,
            gap: stats.gap,
            solve_ms,
            reason: String::new(),
            pushed,
            push_failures,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_planner::forecast::ForecasterConfig;

    fn report(tenant: &str, arrivals: u64, slot_rates: Vec<f64>) -> v1::TenantMetrics {
        v1::TenantMetrics { tenant: tenant.into(), arrivals, slot_rates, ..Default::default() }
    }

    #[test]
    fn reports_feed_the_forecasters_within_bounds_and_wait_for_the_burst_rule() {
        let mut obs = Observations::new(Rounds::new(ForecasterConfig::from_name("ewma", 10.0).unwrap()));
        let node = NodeId::new("n1").unwrap();
        let (a, b) = (TenantId::new("a").unwrap(), TenantId::new("b").unwrap());
        obs.record(
            &node,
            10_000,
            &[report("a", 50, vec![4.0, f64::NAN, 1e12]), report("b", 7, vec![]), report("", 1, vec![1.0])],
        );
        // Finite rates only, a forged one clamped; a tenant that sends counters alone waits for them to be read.
        assert_eq!((obs.rounds.observations(&a), obs.rounds.observations(&b)), (2, 0));
        assert_eq!(obs.counters[&(node.clone(), a.clone())], (10_000, 50));
        assert_eq!(obs.counters[&(node.clone(), b.clone())], (10_000, 7));
        assert!(obs.tenants[&a].by_slot && !obs.tenants.contains_key(&b));
        assert_eq!(obs.tenants[&a].unchecked, Some(MAX_REPORTED_RPS), "the burst rule sees the bounded rate");
        obs.record(&node, 20_000, &[report("a", 60, vec![3.0, f64::INFINITY])]);
        assert_eq!(obs.tenants[&a].unchecked, Some(3.0), "the last finite rate");
        assert_eq!(obs.counters.len(), 2, "a report without a valid tenant id is dropped");
    }

    #[test]
    fn a_change_counts_the_placements_that_differ() {
        let layout = |text: &str| text.parse::<tessera_core::Layout>().unwrap();
        assert_eq!(layout_steps(&layout("3g@0 2g@4 1g@6"), &layout("3g@0 2g@4 1g@6")), 0);
        assert_eq!(layout_steps(&layout("3g@0 2g@4 1g@6"), &layout("3g@0 3g@4")), 3);
        assert_eq!(layout_steps(&layout(""), &layout("7g@0")), 1);
    }
}
