//! The in-process virtual-time driver: one policy over one scenario, window by window.
//!
//! Per planning window `[t0, t1)`:
//! 1. Build the [`PlannerInput`] from the executor: every GPU's live layout and assignments, every tenant's
//!    accuracy and retraining progress, and a forecast per tenant from its forecaster (which has seen the measured
//!    rate of every slot before `t0`). Only a policy that sees the truth ([`Policy::sees_truth`]) also gets the true rates of the horizon
//!    (`actual`).
//! 2. Plan, and apply the plan's targets now. Changes the plan schedules later in the window (`upcoming`, a
//!    slot-by-slot policy's later slots) are applied at their times; the next round supersedes the rest.
//! 3. Feed the window's arrivals to the executor in time order and advance it to `t1`. With
//!    [`Scenario::replan_on_burst`], a slot at a time: after a slot whose arrivals leave the bands of the forecasts the
//!    current plan was made with by enough to replan the fleet ([`Rounds::burst_calls_replan`]), the forecasters observe the
//!    window's slots so far and the policy plans again at once, from the executor's state; that plan replaces the
//!    rest of the window's. The slots that call a replan depend only on the trace and the forecasters, so every
//!    policy replans at the same times (except one that sees the truth, which saw every burst coming).
//! 4. Record the window: requests, completions within SLO, goodput, accuracy, reconfigurations, layouts.
//!
//! Cold start: at `t0 = 0` no rate has been measured yet, so every forecaster is primed with each tenant's mean
//! rate over the first window (the rate a tenant declares when it is onboarded); every policy gets the same prior.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tessera_core::catalog::GpuModel;
use tessera_core::fleet::GpuHealth;
use tessera_core::goodput::GoodputLedger;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::{GpuPlan, Role};
use tessera_core::time::SimTime;

use tessera_planner::input::GpuInput;
use tessera_planner::policies;
use tessera_planner::policy::{PlanOutcome, Policy};
use tessera_planner::round::{Rounds, TenantState};
use tessera_sim::executor::metrics::{LatencyHistogram, TenantMetrics};
use tessera_sim::executor::{
    Arrival, Dispatch, Executor, ExecutorConfig, FleetSpec, GpuIndex, Interference, NoInterference, TenantIndex,
    TlbInterference,
};
use tessera_sim::tlb::TlbModel;

use super::arrivals::{ArrivalSource, Arrivals, TickCounts};
use super::{ReplayError, Scenario};

/// Per-tenant arrival rates per slot over the whole run (requests per second), measured from the arrivals
/// themselves: the truth the perfect-forecast reference plans with and the forecasters observe.
#[derive(Debug, Clone, PartialEq)]
pub struct RateTable {
    /// Slot length, ms.
    pub slot_ms: f64,
    /// `rates[tenant][slot]`, requests per second.
    pub rates: Vec<Vec<f64>>,
}

impl RateTable {
    /// Counts every arrival of a fresh source into slots of `slot_ms` over `duration_ms`; with `by_counts`, the
    /// source's counts ([`ArrivalSource::count_until`]: what a fluid run serves).
    pub fn measure(
        arrivals: &dyn Arrivals,
        tenants: usize,
        slot_ms: f64,
        duration_ms: f64,
        by_counts: bool,
    ) -> Result<RateTable, ReplayError> {
        let slots = (duration_ms / slot_ms).ceil() as usize;
        let mut counts = vec![vec![0.0f64; slots]; tenants];
        let mut src = arrivals.open()?;
        let mut buf = Vec::new();
        let mut ticks = TickCounts::default();
        // One slot at a time: the arrivals of a whole run do not fit in memory on a large fleet.
        for s in 0..slots {
            let (from, to) = (s as f64 * slot_ms, ((s + 1) as f64 * slot_ms).min(duration_ms));
            if by_counts {
                ticks.reset(from, to, slot_ms, tenants);
                src.count_until(to, &mut ticks)?;
                for (t, c) in counts.iter_mut().enumerate() {
                    c[s] = ticks.tick(0)[t];
                }
                continue;
            }
            buf.clear();
            src.next_until(to, &mut buf)?;
            for a in &buf {
                let s = ((a.at_ms / slot_ms) as usize).min(slots.saturating_sub(1));
                counts[a.tenant.0 as usize][s] += 1.0;
            }
        }
        let per_s = 1000.0 / slot_ms;
        Ok(RateTable {
            slot_ms,
            rates: counts.into_iter().map(|c| c.into_iter().map(|n| n * per_s).collect()).collect(),
        })
    }

    /// Rates of `tenant` for slots `from..from + n` (zero past the end).
    pub fn window(&self, tenant: usize, from: usize, n: usize) -> Vec<f64> {
        (from..from + n).map(|s| self.rates[tenant].get(s).copied().unwrap_or(0.0)).collect()
    }

    /// Mean rate of `tenant` over slots `from..to`.
    pub fn mean(&self, tenant: usize, from: usize, to: usize) -> f64 {
        let v = self.window(tenant, from, to.saturating_sub(from).max(1));
        v.iter().sum::<f64>() / v.len() as f64
    }

    /// Total requests of every tenant.
    pub fn total_requests(&self) -> f64 {
        let per_slot = self.slot_ms / 1000.0;
        self.rates.iter().flatten().map(|r| r * per_slot).sum()
    }
}

/// The arrivals of a run as the upper bound reads them ([`tessera_planner::bound::Demand`]): per tenant and slot,
/// the requests that arrived and those of them within the tenant's SLO (`slo_ms`) of the slot's end. With
/// `fluid_tick_ms`, the source's counts per tick (what a fluid run serves), a tick counted in the tail
/// when it ends within the SLO of the slot's end.
pub fn bound_demand(
    arrivals: &dyn Arrivals,
    slo_ms: &[f64],
    slot_ms: f64,
    duration_ms: f64,
    fluid_tick_ms: Option<f64>,
) -> Result<tessera_planner::bound::Demand, ReplayError> {
    let tenants = slo_ms.len();
    let slots = (duration_ms / slot_ms).ceil() as usize;
    let mut counts = vec![vec![0.0f64; slots]; tenants];
    let mut tail = vec![vec![0.0f64; slots]; tenants];
    let mut src = arrivals.open()?;
    let mut buf = Vec::new();
    let mut ticks = TickCounts::default();
    for s in 0..slots {
        let (from, to) = (s as f64 * slot_ms, ((s + 1) as f64 * slot_ms).min(duration_ms));
        let end = (s + 1) as f64 * slot_ms;
        if let Some(tick_ms) = fluid_tick_ms {
            ticks.reset(from, to, tick_ms, tenants);
            src.count_until(to, &mut ticks)?;
            for k in 0..ticks.ticks() {
                let tick_end = from + (k + 1) as f64 * tick_ms;
                for (t, n) in ticks.tick(k).iter().enumerate() {
                    counts[t][s] += n;
                    if tick_end > end - slo_ms[t] {
                        tail[t][s] += n;
                    }
                }
            }
            continue;
        }
        buf.clear();
        src.next_until(to, &mut buf)?;
        for a in &buf {
            let t = a.tenant.0 as usize;
            let s = ((a.at_ms / slot_ms) as usize).min(slots.saturating_sub(1));
            counts[t][s] += 1.0;
            if a.at_ms >= (s + 1) as f64 * slot_ms - slo_ms[t] {
                tail[t][s] += 1.0;
            }
        }
    }
    Ok(tessera_planner::bound::Demand { slot_ms, duration_ms, arrivals: counts, tail })
}

/// The upper bound on any policy's goodput over `scenario` with `arrivals` ([`tessera_planner::bound`]), at the
/// planner's slot length.
pub fn upper_bound(
    scenario: &Scenario,
    arrivals: &dyn Arrivals,
) -> Result<tessera_planner::bound::UpperBound, ReplayError> {
    let slo: Vec<f64> = scenario.tenants.iter().map(|t| t.slo_ms).collect();
    let demand =
        bound_demand(arrivals, &slo, scenario.planner.slot_s * 1000.0, scenario.duration_ms, scenario.fluid_tick_ms)?;
    let retraining_takes_slices = scenario.planner.sharing.is_exclusive();
    tessera_planner::bound::upper_bound_with(
        &scenario.tenants,
        &scenario.models,
        &scenario.gpus,
        &demand,
        retraining_takes_slices,
    )
    .map_err(|e| ReplayError::Plan(format!("upper bound: {e}")))
}

/// One planning window of one policy's run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowRow {
    /// Start of the window, seconds of workload time.
    pub start_s: f64,
    /// Requests that arrived in the window.
    pub requests: u64,
    /// Requests completed in the window.
    pub completed: u64,
    /// Requests completed within their SLO in the window.
    pub within_slo: u64,
    /// Requests dropped in the window.
    pub dropped: u64,
    /// Goodput of the window (sum of the accuracy of requests served within SLO).
    pub goodput: f64,
    /// Mean accuracy of the requests served in the window (0 when none).
    pub mean_accuracy: f64,
    /// Plans applied in the window that changed something on their GPU (a GPU changed twice counts twice).
    pub reconfigurations: u64,
    /// GPUs that applied at least one such plan in the window.
    #[serde(default)]
    pub reconfigured_gpus: u32,
    /// GPUs holding at least one instance at the window start.
    pub active_gpus: u32,
    /// Wall time of the window's planning round, ms.
    pub plan_ms: f64,
    /// The layout of the first GPUs (at most [`LAYOUT_GPUS`]) after planning, for the report.
    pub layouts: Vec<String>,
    /// The instances of the same GPUs and who works on them, for the report's slice map.
    #[serde(default)]
    pub instances: Vec<Vec<SliceRun>>,
}

/// One live GPU instance at a window start: where it sits and what it does.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SliceRun {
    /// First memory slice.
    pub start: u8,
    /// Memory slices it covers.
    pub slices: u8,
    /// The profile's nvidia-smi name (`3g.20gb`).
    pub profile: String,
    /// The tenant it works for; `None` while it is idle or being destroyed.
    pub tenant: Option<String>,
    /// It runs the tenant's retraining (else it serves inference).
    pub retraining: bool,
}

/// What the report keeps of the first GPUs (at most [`LAYOUT_GPUS`]) at a window start: each layout as text, and
/// its instances with their work.
pub(crate) fn gpu_snapshot(
    exec: &Executor,
    gpu_ids: &[(GpuIndex, GpuId)],
    models: &BTreeMap<GpuId, GpuModel>,
) -> (Vec<String>, Vec<Vec<SliceRun>>) {
    let mut layouts = Vec::new();
    let mut instances = Vec::new();
    for (i, id) in gpu_ids.iter().take(LAYOUT_GPUS) {
        let model = models[id];
        let layout = exec.gpu_layout(*i);
        let work = exec.gpu_assignments(*i);
        layouts.push(layout.display_for(model));
        instances.push(
            layout
                .placements()
                .iter()
                .map(|p| {
                    let a = work.iter().find(|a| a.placement == *p);
                    SliceRun {
                        start: p.start,
                        slices: p.memory_mask().count_ones() as u8,
                        profile: model.profile(p.profile).map_or_else(|| p.profile.to_string(), |s| s.name.to_string()),
                        tenant: a.map(|a| a.tenant.to_string()),
                        retraining: a.is_some_and(|a| a.role == Role::Retraining),
                    }
                })
                .collect(),
        );
    }
    (layouts, instances)
}

/// GPUs whose layouts the time series keeps.
pub const LAYOUT_GPUS: usize = 8;

/// Everything one policy's run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRun {
    /// The policy.
    pub policy: String,
    /// All requests of the run.
    pub total: GoodputLedger,
    /// Retrainings completed, all tenants.
    pub retrainings_completed: u64,
    /// Retraining windows that ended without one (the model drifted).
    pub drift_windows: u64,
    /// GPU plans applied that changed something.
    pub reconfigurations: u64,
    /// GPU-hours of GPUs holding at least one instance.
    pub gpu_hours: f64,
    /// Rounds the policy found infeasible (the layouts were kept).
    pub infeasible_rounds: u64,
    /// Median planning-round wall time, ms.
    pub plan_ms_median: f64,
    /// Wall time of the whole run, seconds (planning and simulation).
    pub wall_s: f64,
    /// Rounds a burst called inside a window (`--replan-on-burst`), beyond one per window.
    pub burst_replans: u64,
    /// Per window.
    pub windows: Vec<WindowRow>,
    /// Latency percentiles over every completed request of the run.
    #[serde(default)]
    pub latency_ms: LatencyPercentiles,
    /// Per tenant, in the scenario's order.
    #[serde(default)]
    pub tenants: Vec<TenantRow>,
    /// Latencies of every completed request of the run (the report's CDF).
    #[serde(skip)]
    pub latency: LatencyHistogram,
}

/// The changes that targets schedule strictly inside `(t0, t1)`, as plans to apply at their times, in time order
/// (ties by GPU).
pub(crate) fn upcoming_within<'a>(
    targets: impl Iterator<Item = (&'a GpuId, &'a GpuPlan)>,
    t0: f64,
    t1: f64,
) -> Vec<(f64, GpuId, GpuPlan)> {
    let mut later = Vec::new();
    for (gpu, target) in targets {
        for change in &target.upcoming {
            let at = change.at.as_ms() as f64;
            if at > t0 && at < t1 {
                let step = GpuPlan {
                    layout: change.layout.clone(),
                    assignments: change.assignments.clone(),
                    expected_goodput: 0.0,
                    explanation: String::new(),
                    upcoming: vec![],
                    retraining_epochs: target.retraining_epochs.clone(),
                    sharing: target.sharing,
                };
                later.push((at, gpu.clone(), step));
            }
        }
    }
    later.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    later
}

/// Feeds the arrivals before `t1` in time order, applying each scheduled change at its time, and advances the
/// executor to `t1`.
pub(crate) fn feed_window(
    exec: &mut Executor,
    src: &mut dyn ArrivalSource,
    buf: &mut Vec<Arrival>,
    later: &[(f64, GpuId, GpuPlan)],
    t1: f64,
) -> Result<(), ReplayError> {
    buf.clear();
    src.next_until(t1, buf)?;
    let mut fed = 0;
    for (at, gpu, step) in later {
        let upto = fed + buf[fed..].partition_point(|a| a.at_ms < *at);
        exec.arrive_all(&buf[fed..upto]).map_err(|e| ReplayError::Sim(e.to_string()))?;
        fed = upto;
        exec.advance_to(*at).map_err(|e| ReplayError::Sim(e.to_string()))?;
        exec.apply_plan(gpu, step).map_err(|e| ReplayError::Sim(format!("{gpu} at {at} ms: {e}")))?;
    }
    exec.arrive_all(&buf[fed..]).map_err(|e| ReplayError::Sim(e.to_string()))?;
    exec.advance_to(t1).map_err(|e| ReplayError::Sim(e.to_string()))
}

/// Fluid [`feed_window`]: the requests of `counts` (per tick, [`Executor::flow`]) in the ticks that start in
/// `[from, t1)` (the executor is at `from`, a tick boundary), each scheduled change applied at its time (the tick it
/// falls in is split there, its counts shared by length).
pub(crate) fn flow_window(
    exec: &mut Executor,
    counts: &TickCounts,
    from: f64,
    later: &[(f64, GpuId, GpuPlan)],
    t1: f64,
) -> Result<(), ReplayError> {
    let (t0, tick_ms) = (counts.from_ms, counts.tick_ms);
    let first_tick = ((from - t0) / tick_ms).round().max(0.0) as usize;
    let sim = |e: tessera_sim::executor::ExecError| ReplayError::Sim(e.to_string());
    // The window's steps up to each scheduled change go to the executor together ([`Executor::flow_steps`] serves
    // the tenants in parallel between events): a whole tick's counts as they are, a split tick's shared by length.
    enum Step {
        Tick(usize),
        Part(usize),
    }
    let mut parts: Vec<Vec<f64>> = Vec::new();
    let mut steps: Vec<(f64, Step)> = Vec::new();
    let flush = |exec: &mut Executor, steps: &mut Vec<(f64, Step)>, parts: &mut Vec<Vec<f64>>| {
        let batch: Vec<(f64, &[f64])> = steps
            .iter()
            .map(|(to, step)| match *step {
                Step::Tick(k) => (*to, counts.tick(k)),
                Step::Part(i) => (*to, parts[i].as_slice()),
            })
            .collect();
        let done = exec.flow_steps(&batch).map_err(sim);
        steps.clear();
        parts.clear();
        done
    };
    let mut next = later.iter().peekable();
    for k in first_tick..counts.ticks() {
        let a = t0 + k as f64 * tick_ms;
        if a >= t1 {
            break;
        }
        let b = (a + tick_ms).min(t1);
        let row = counts.tick(k);
        let mut from = a;
        while let Some((at, gpu, step)) = next.next_if(|(at, _, _)| *at < b) {
            let at = at.max(from);
            let share = (at - from) / (b - a);
            parts.push(row.iter().map(|n| n * share).collect());
            steps.push((at, Step::Part(parts.len() - 1)));
            flush(exec, &mut steps, &mut parts)?;
            exec.apply_plan(gpu, step).map_err(|e| ReplayError::Sim(format!("{gpu} at {at} ms: {e}")))?;
            from = at;
        }
        if from == a {
            steps.push((b, Step::Tick(k)));
        } else {
            let share = (b - from) / (b - a);
            parts.push(row.iter().map(|n| n * share).collect());
            steps.push((b, Step::Part(parts.len() - 1)));
        }
    }
    flush(exec, &mut steps, &mut parts)?;
    exec.advance_to(t1).map_err(sim)
}

impl WindowRow {
    /// The row of the window starting at `t0` ms from its counters `d`.
    pub(crate) fn new(
        t0: f64,
        d: &Totals,
        active_gpus: u32,
        (reconfigurations, reconfigured_gpus): (u64, u32),
        plan_ms: f64,
        (layouts, instances): (Vec<String>, Vec<Vec<SliceRun>>),
    ) -> WindowRow {
        WindowRow {
            start_s: t0 / 1000.0,
            requests: d.ledger.requests,
            completed: d.ledger.completed,
            within_slo: d.ledger.within_slo,
            dropped: d.ledger.dropped,
            goodput: d.ledger.goodput,
            mean_accuracy: d.ledger.mean_accuracy(),
            reconfigurations,
            reconfigured_gpus,
            active_gpus,
            plan_ms,
            layouts,
            instances,
        }
    }
}

impl PolicyRun {
    /// A run's totals from the executor's final counters, its GPU time, infeasible rounds and round times.
    pub(crate) fn finish(
        policy: &str,
        end: &Totals,
        gpu_ms: f64,
        infeasible_rounds: u64,
        plan_ms: &[f64],
        started: Instant,
        windows: Vec<WindowRow>,
    ) -> PolicyRun {
        let mut sorted = plan_ms.to_vec();
        sorted.sort_by(f64::total_cmp);
        PolicyRun {
            policy: policy.to_string(),
            total: end.ledger,
            retrainings_completed: end.retrainings,
            drift_windows: end.drifts,
            reconfigurations: end.reconfigurations,
            gpu_hours: gpu_ms / 3_600_000.0,
            infeasible_rounds,
            plan_ms_median: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
            wall_s: started.elapsed().as_secs_f64(),
            burst_replans: 0,
            windows,
            latency_ms: LatencyPercentiles::of(&end.latency),
            tenants: end.tenants.clone(),
            latency: end.latency.clone(),
        }
    }
}

/// Builds the executor for `scenario`, spreading each tenant's requests over its instances by `dispatch` (the
/// policy's, [`Policy::dispatch`]).
pub(crate) fn executor_for(scenario: &Scenario, dispatch: Dispatch) -> Result<Executor, ReplayError> {
    let config = ExecutorConfig { seed: scenario.seed, dispatch, ..scenario.executor.clone() };
    let fleet =
        FleetSpec { models: scenario.models.clone(), tenants: scenario.tenants.clone(), gpus: scenario.gpus.clone() };
    let interference: Box<dyn Interference> = match scenario.tlb.mode() {
        Some(mode) => Box::new(TlbInterference::new(TlbModel::with_seed(scenario.seed), mode)),
        None => Box::new(NoInterference),
    };
    Executor::new(config, fleet, interference).map_err(|e| ReplayError::Sim(e.to_string()))
}

/// Runs `policy` over `scenario` with `arrivals`; `truth` is the run's [`RateTable`] at the planner's slot length.
/// `progress` is called after each window with (windows done, windows in all).
pub fn run_policy(
    scenario: &Scenario,
    policy_name: &str,
    arrivals: &dyn Arrivals,
    truth: &RateTable,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PolicyRun, ReplayError> {
    let started = Instant::now();
    let policy = policies::by_name(policy_name).map_err(|e| ReplayError::Usage(e.to_string()))?;
    let mut exec = executor_for(scenario, policy.dispatch())?;
    let tenant_ids: Vec<TenantId> = scenario.tenants.iter().map(|t| t.id.clone()).collect();
    // The executor numbers tenants in id order; map ours to its.
    let exec_index: Vec<TenantIndex> =
        tenant_ids.iter().map(|id| exec.tenant_index(id).expect("tenant is in the executor")).collect();
    let gpu_ids: Vec<(GpuIndex, GpuId)> = exec.gpu_ids().map(|(i, g)| (i, g.clone())).collect();

    let slot_ms = scenario.planner.slot_s * 1000.0;
    let window_ms = scenario.plan_every_s * 1000.0;
    let slots_per_window = (window_ms / slot_ms).round() as usize;
    let horizon = scenario.planner.horizon_slots;
    let windows = (scenario.duration_ms / window_ms).ceil() as usize;

    // Forecasters, warm starts and the burst rule's forecasts, as the coordinator's leader keeps them.
    let mut rounds = Rounds::new(scenario.forecaster.clone());
    rounds.set_interference(scenario.interference.clone());
    for (i, id) in tenant_ids.iter().enumerate() {
        rounds.observe(id, truth.mean(i, 0, slots_per_window));
    }

    let index = tenant_ids.iter().enumerate().map(|(i, id)| (id.clone(), i)).collect();
    let ctx = RoundContext {
        scenario,
        tenant_ids: &tenant_ids,
        index,
        exec_index: &exec_index,
        gpu_ids: &gpu_ids,
        truth,
        horizon,
    };
    let mut src = arrivals.open()?;
    let mut buf: Vec<Arrival> = Vec::new();
    let mut rows = Vec::with_capacity(windows);
    let mut plan_ms = Vec::with_capacity(windows);
    let mut infeasible = 0;
    let mut epoch = 1u64;
    let mut replans = 0u64;
    // A policy that sees the truth saw every burst coming: it plans once per window.
    let reacts = scenario.replan_on_burst && policy.replans_on_bursts();
    let mut gpu_ms = 0.0;
    let mut prev = Totals::read(&exec, &gpu_ids);
    let window_end = |w: usize| ((w + 1) as f64 * window_ms).min(scenario.duration_ms);
    std::thread::scope(|scope| -> Result<PolicyRun, ReplayError> {
        // A fluid run reads the trace on a thread of its own, a window ahead: the counts of window w + 1 are ready
        // when window w has been planned and served (its buffers come back to be refilled).
        let mut reader = scenario.fluid_tick_ms.map(|tick| {
            let (ready, counted) = mpsc::sync_channel::<Result<TickCounts, ReplayError>>(1);
            let (recycle, spare) = mpsc::channel::<TickCounts>();
            let tenants = tenant_ids.len();
            let mut src = std::mem::replace(&mut src, Box::new(NoArrivals));
            scope.spawn(move || {
                for w in 0..windows {
                    let mut counts = spare.try_recv().unwrap_or_default();
                    counts.reset(w as f64 * window_ms, window_end(w), tick, tenants);
                    let read = src.count_until(window_end(w), &mut counts).map(|()| counts);
                    let failed = read.is_err();
                    if ready.send(read).is_err() || failed {
                        break;
                    }
                }
            });
            (counted, recycle)
        });
        for w in 0..windows {
            let t0 = w as f64 * window_ms;
            let t1 = window_end(w);
            let first_slot = w * slots_per_window;
            let round = ctx.plan(policy.as_ref(), &mut exec, &mut rounds, epoch, t0, first_slot, t1)?;
            epoch += 1;
            plan_ms.push(round.ms);
            // Planning time in the window: its round and any burst replans.
            let mut round_ms = round.ms;
            infeasible += u64::from(round.infeasible);
            let mut later = round.later;
            // The first slot of the plan in force: the burst rule counts slots from it.
            let mut planned = first_slot;
            // Slots observed by the forecasters so far (a replan inside the window observes the slots before it).
            let mut observed = first_slot;
            let active = gpu_ids.iter().filter(|(i, _)| !exec.gpu_layout(*i).is_empty()).count() as u32;
            let layouts = gpu_snapshot(&exec, &gpu_ids, &scenario.gpus);

            let counts = match &mut reader {
                Some((counted, _)) => {
                    Some(counted.recv().map_err(|_| ReplayError::Sim("the trace reader stopped".into()))??)
                }
                None => None,
            };
            // Served a slot at a time when a burst may call a replan, else the whole window at once.
            let steps: Vec<(usize, f64)> = if reacts {
                (first_slot..first_slot + slots_per_window)
                    .map(|s| (s, ((s + 1) as f64 * slot_ms).min(t1)))
                    .filter(|(s, _)| (*s as f64) * slot_ms < t1)
                    .collect()
            } else {
                vec![(first_slot + slots_per_window - 1, t1)]
            };
            let mut from = t0;
            for (slot, until) in steps {
                let due = later.partition_point(|(at, _, _)| *at < until);
                let now: Vec<_> = later.drain(..due).collect();
                match &counts {
                    Some(counts) => flow_window(&mut exec, counts, from, &now, until)?,
                    None => feed_window(&mut exec, src.as_mut(), &mut buf, &now, until)?,
                }
                from = until;
                if until < t1 && burst_left_band(&rounds, &ctx, slot, planned) {
                    observe(&mut rounds, &tenant_ids, truth, observed..slot + 1);
                    observed = slot + 1;
                    let round = ctx.plan(policy.as_ref(), &mut exec, &mut rounds, epoch, until, slot + 1, t1)?;
                    epoch += 1;
                    replans += 1;
                    plan_ms.push(round.ms);
                    round_ms += round.ms;
                    infeasible += u64::from(round.infeasible);
                    later = round.later;
                    planned = slot + 1;
                }
            }
            if let (Some((_, recycle)), Some(counts)) = (&reader, counts) {
                // The reader may be done; then the buffer is simply dropped.
                let _ = recycle.send(counts);
            }
            let end = (first_slot + slots_per_window).min(((t1 / slot_ms).ceil()) as usize);
            observe(&mut rounds, &tenant_ids, truth, observed..end);
            gpu_ms += f64::from(active) * (t1 - t0);
            let now = Totals::read(&exec, &gpu_ids);
            let d = now.since(&prev);
            let changed = reconfigured_in(&exec, &gpu_ids, t0, t1);
            rows.push(WindowRow::new(t0, &d, active, changed, round_ms, layouts));
            prev = now;
            progress(w + 1, windows);
        }
        let end = Totals::read(&exec, &gpu_ids);
        let mut run = PolicyRun::finish(policy_name, &end, gpu_ms, infeasible, &plan_ms, started, rows);
        run.burst_replans = replans;
        Ok(run)
    })
}

/// A slot's arrivals leave the bands of the forecasts the current plan was made with by enough to replan the fleet
/// ([`Rounds::burst_calls_replan`]). `first` is the plan's first slot.
fn burst_left_band(rounds: &Rounds, ctx: &RoundContext, slot: usize, first: usize) -> bool {
    rounds.burst_calls_replan(slot.saturating_sub(first), |t| {
        ctx.index.get(t).and_then(|i| ctx.truth.rates[*i].get(slot).copied())
    })
}

/// Every tenant's forecaster observes the measured rates of `slots`, in order.
fn observe(rounds: &mut Rounds, tenant_ids: &[TenantId], truth: &RateTable, slots: std::ops::Range<usize>) {
    for (i, id) in tenant_ids.iter().enumerate() {
        for s in slots.clone() {
            rounds.observe(id, truth.rates[i].get(s).copied().unwrap_or(0.0));
        }
    }
}

/// What a planning round reads besides the executor and the planner's memory ([`Rounds`]).
struct RoundContext<'a> {
    scenario: &'a Scenario,
    tenant_ids: &'a [TenantId],
    /// Each tenant's position in `tenant_ids` (and in the truth's rates).
    index: std::collections::BTreeMap<TenantId, usize>,
    exec_index: &'a [TenantIndex],
    gpu_ids: &'a [(GpuIndex, GpuId)],
    truth: &'a RateTable,
    horizon: usize,
}

/// One planning round's result as the driver uses it.
struct Round {
    /// Wall time of the policy's `plan`, ms.
    ms: f64,
    /// The policy found the round infeasible (the layouts were kept).
    infeasible: bool,
    /// Changes the plan schedules before the window ends, in time order.
    later: Vec<(f64, GpuId, GpuPlan)>,
}

impl RoundContext<'_> {
    /// Plans at `now_ms` (the start of slot `first_slot`) from the executor's state and the forecasters, and
    /// applies the plan's targets; the window ends at `t1`.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &self,
        policy: &dyn Policy,
        exec: &mut Executor,
        rounds: &mut Rounds,
        epoch: u64,
        now_ms: f64,
        first_slot: usize,
        t1: f64,
    ) -> Result<Round, ReplayError> {
        let scenario = self.scenario;
        // Tenants on a retraining instance now: their retraining runs at the epochs its plan chose.
        let retraining: std::collections::BTreeSet<TenantId> = self
            .gpu_ids
            .iter()
            .flat_map(|(i, _)| exec.gpu_assignments(*i))
            .filter(|a| a.role == Role::Retraining)
            .map(|a| a.tenant)
            .collect();
        let gpus = self.gpu_ids.iter().map(|(i, id)| {
            let g = GpuInput {
                model: scenario.gpus[id],
                health: GpuHealth::Healthy,
                layout: exec.gpu_layout(*i),
                assignments: exec.gpu_assignments(*i),
                warm: None,
                memory_gib: Default::default(),
            };
            (id.clone(), g)
        });
        let tenants = self.tenant_ids.iter().enumerate().map(|(i, _)| {
            let st = exec.tenant_state(self.exec_index[i]);
            TenantState {
                spec: scenario.tenants[i].clone(),
                actual: policy.sees_truth().then(|| self.truth.window(i, first_slot, self.horizon)),
                accuracy: st.accuracy,
                retraining_due: st.retraining_due,
                retraining_done_gpu_s: st.retraining_done_gpu_s,
                // The configuration of the retraining under way on a retraining instance, where its plan chose other
                // than the default (as the coordinator reads it from its targets).
                retraining_epochs: scenario.tenants[i].retraining.as_ref().and_then(|r| {
                    (retraining.contains(&self.tenant_ids[i]) && st.retraining_epochs != r.epochs)
                        .then_some(st.retraining_epochs)
                }),
            }
        });
        let input = rounds.input(
            epoch,
            SimTime::from_ms(now_ms.round() as u64),
            tessera_planner::PlannerConfig { seed: scenario.seed, ..scenario.planner.clone() },
            scenario.models.clone(),
            gpus,
            tenants,
            0.0,
        );
        let at = |e: String| format!("round {epoch} at {:.0} s: {e}", now_ms / 1000.0);
        let plan_start = Instant::now();
        let outcome = policy.plan(&input).map_err(|e| ReplayError::Plan(at(e.to_string())))?;
        let ms = plan_start.elapsed().as_secs_f64() * 1000.0;
        rounds.planned(outcome.report());
        let mut round = Round { ms, infeasible: false, later: Vec::new() };
        match outcome {
            PlanOutcome::Planned(report) => {
                let plan = &report.plan;
                exec.apply(plan).map_err(|e| ReplayError::Sim(at(format!("applying the plan: {e}"))))?;
                round.later = upcoming_within(plan.gpus.iter(), now_ms, t1);
            }
            PlanOutcome::Infeasible { .. } => round.infeasible = true,
        }
        Ok(round)
    }
}

/// The source a fluid run's driver keeps once its trace has moved to the reader thread: nothing arrives.
struct NoArrivals;

impl ArrivalSource for NoArrivals {
    fn next_until(&mut self, _until_ms: f64, _out: &mut Vec<Arrival>) -> Result<(), ReplayError> {
        Ok(())
    }

    fn count_until(&mut self, _until_ms: f64, _counts: &mut TickCounts) -> Result<(), ReplayError> {
        Ok(())
    }
}

/// The plans applied from `t0` (included) to `t1` ms that changed something on one of `gpus`, and how many of the
/// GPUs applied at least one: each change is counted in the window in which its GPU applied it.
pub(crate) fn reconfigured_in(exec: &Executor, gpus: &[(GpuIndex, GpuId)], t0: f64, t1: f64) -> (u64, u32) {
    let mut changes = 0;
    let mut touched = 0;
    for (g, _) in gpus {
        // In the order applied, so two binary searches find the window's changes.
        let at = &exec.gpu_metrics(*g).reconfigured_at_ms;
        let n = at.partition_point(|t| *t < t1) - at.partition_point(|t| *t < t0);
        changes += n as u64;
        touched += u32::from(n > 0);
    }
    (changes, touched)
}

/// Cumulative counters read off the executor.
#[derive(Debug, Clone, Default)]
pub(crate) struct Totals {
    pub(crate) ledger: GoodputLedger,
    pub(crate) reconfigurations: u64,
    pub(crate) retrainings: u64,
    pub(crate) drifts: u64,
    /// Latencies of every completed request since the start (not kept by [`Totals::since`]).
    pub(crate) latency: LatencyHistogram,
    /// Per tenant since the start (not kept by [`Totals::since`]).
    pub(crate) tenants: Vec<TenantRow>,
}

impl Totals {
    pub(crate) fn read(exec: &Executor, gpus: &[(GpuIndex, GpuId)]) -> Totals {
        let mut t = Totals::default();
        for (i, _) in exec.tenant_ids() {
            let m = exec.tenant_metrics(i);
            t.ledger += m.ledger;
            t.retrainings += m.retrainings_completed;
            t.drifts += m.drift_windows;
            t.latency.merge(&m.latency);
        }
        t.tenants = exec.tenant_ids().map(|(i, id)| TenantRow::new(id, exec.tenant_metrics(i))).collect();
        t.reconfigurations = gpus.iter().map(|(g, _)| exec.gpu_metrics(*g).reconfigurations).sum();
        t
    }

    pub(crate) fn since(&self, earlier: &Totals) -> Totals {
        let (a, b) = (&self.ledger, &earlier.ledger);
        Totals {
            ledger: GoodputLedger {
                requests: a.requests - b.requests,
                completed: a.completed - b.completed,
                within_slo: a.within_slo - b.within_slo,
                dropped: a.dropped - b.dropped,
                goodput: a.goodput - b.goodput,
                accuracy_sum: a.accuracy_sum - b.accuracy_sum,
            },
            reconfigurations: self.reconfigurations - earlier.reconfigurations,
            retrainings: self.retrainings - earlier.retrainings,
            drifts: self.drifts - earlier.drifts,
            ..Totals::default()
        }
    }
}

/// Latency percentiles of completed requests, ms (upper edges of the simulator's histogram buckets, about 12 %
/// resolution); `None` when nothing completed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LatencyPercentiles {
    /// Median.
    pub p50: Option<f64>,
    /// 90th percentile.
    pub p90: Option<f64>,
    /// 99th percentile.
    pub p99: Option<f64>,
    /// 99.9th percentile.
    pub p999: Option<f64>,
}

impl LatencyPercentiles {
    /// The percentiles of `h`.
    pub fn of(h: &LatencyHistogram) -> LatencyPercentiles {
        LatencyPercentiles {
            p50: h.quantile_ms(0.5),
            p90: h.quantile_ms(0.9),
            p99: h.quantile_ms(0.99),
            p999: h.quantile_ms(0.999),
        }
    }
}

/// One tenant's part of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantRow {
    /// The tenant.
    pub tenant: String,
    /// Its requests: arrivals, completions, within SLO, drops, goodput.
    pub ledger: GoodputLedger,
    /// Its latency percentiles.
    pub latency_ms: LatencyPercentiles,
    /// Retrainings completed.
    pub retrainings_completed: u64,
    /// Latencies of its completed requests (the report's CDF).
    #[serde(skip)]
    pub latency: LatencyHistogram,
}

impl TenantRow {
    fn new(id: &TenantId, m: &TenantMetrics) -> TenantRow {
        TenantRow {
            tenant: id.to_string(),
            ledger: m.ledger,
            latency_ms: LatencyPercentiles::of(&m.latency),
            retrainings_completed: m.retrainings_completed,
            latency: m.latency.clone(),
        }
    }
}
