//! The `Policy` trait and the fleet driver every policy shares: level 1 decides who
//! shares which GPU, then level 2 solves every GPU in parallel (rayon) and the results become a [`Plan`].

use std::collections::BTreeMap;

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::{GpuPlan, Plan, PlannedChange};
use tessera_core::serving::Dispatch;
use tessera_core::time::SimTime;

use crate::assign::L1;
use crate::error::InvalidField;
use crate::input::{PlannerInput, WarmStart};
use crate::level2::evaluate;
pub use crate::level2::outcome::GpuOutcome;
use crate::level2::shared::SharedSolves;
use crate::level2::solver::{SolveError, SolveStatus, relative_gap};

/// What a planning round produced.
#[derive(Debug, Clone)]
pub enum PlanOutcome {
    /// A plan.
    Planned(Box<PlanReport>),
    /// Nothing can be planned; the reason says why (an outcome, not an error).
    Infeasible {
        /// Why.
        reason: String,
    },
}

impl PlanOutcome {
    /// The report, if planned.
    pub fn report(&self) -> Option<&PlanReport> {
        match self {
            PlanOutcome::Planned(r) => Some(r),
            PlanOutcome::Infeasible { .. } => None,
        }
    }
}

/// A plan with the figures behind it.
#[derive(Debug, Clone)]
pub struct PlanReport {
    /// The plan.
    pub plan: Plan,
    /// Solver figures.
    pub stats: PlanStats,
    /// Each GPU's level-2 problem and placed schedule over the whole horizon.
    pub outcomes: BTreeMap<GpuId, GpuOutcome>,
    /// When each GPU's level-2 solve ran (wall clock; for traces, never for results, which must not depend on it).
    pub solve_times: BTreeMap<GpuId, SolveTime>,
}

/// When one level-2 solve started and how long it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SolveTime {
    /// Wall-clock start.
    pub started: std::time::SystemTime,
    /// Its duration (monotonic clock).
    pub elapsed: std::time::Duration,
}

impl PlanReport {
    /// The plan's goodput over the horizon under the true arrivals of `input` (the forecast mean where the input
    /// has no truth): how replay and the tests compare policies on the same input.
    pub fn goodput_under_truth(&self, input: &PlannerInput) -> f64 {
        self.outcomes.values().map(|o| evaluate::under_truth(input, &o.problem, &o.placed)).sum()
    }

    /// Each GPU's warm start for the next round ([`GpuInput::warm`](crate::input::GpuInput::warm)), where the
    /// policy gives one.
    pub fn warm_starts(&self) -> BTreeMap<GpuId, WarmStart> {
        self.outcomes.iter().filter_map(|(g, o)| o.warm.clone().map(|w| (g.clone(), w))).collect()
    }
}

/// Figures of one GPU's level-2 solve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStats {
    /// The GPU.
    pub gpu: GpuId,
    /// Tenants planned on it.
    pub tenants: usize,
    /// How the solve ended.
    pub status: SolveStatus,
    /// The placed plan's planning value: its expected goodput, plus what the retrainings it completes earn beyond
    /// the horizon where the policy counts that ([`crate::level2::evaluate::goodput_and_tail`]; tessera and perfect-forecast).
    pub objective: f64,
    /// Proven upper bound on the planning value of any plan for these tenants on this GPU.
    pub bound: f64,
    /// Why incremental rounds solved it again rather than keep its last plan, where it had one to keep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replanned: Option<crate::level2::outcome::Replan>,
}

/// Figures of a planning round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanStats {
    /// Planning value of the plan (sum over GPUs, see [`GpuStats::objective`]).
    pub objective: f64,
    /// Sum of the per-GPU bounds.
    pub bound: f64,
    /// Relative gap between the two.
    pub gap: f64,
    /// Per GPU.
    pub gpus: Vec<GpuStats>,
    /// Tenants level 1 could not place, with the reason.
    pub unplaced: Vec<(TenantId, String)>,
    /// Tenants level 1 moved.
    pub moved: usize,
    /// Column-generation solves the round asked for, where the policy shares them ([`plan_fleet_shared`]; 0
    /// otherwise).
    #[serde(default)]
    pub solves: usize,
    /// Of those, how many another GPU's solve of the same inputs answered ([`SharedSolves`]).
    #[serde(default)]
    pub shared_solves: usize,
}

/// A bug or bad input (an infeasible plan is a [`PlanOutcome`], not an error).
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The input is inconsistent.
    #[error("bad planner input: {0}")]
    BadInput(#[from] InvalidField),
    /// A solver failed on a GPU.
    #[error("GPU {gpu}: {source}")]
    Solver {
        /// The GPU.
        gpu: GpuId,
        /// The failure.
        source: SolveError,
    },
}

/// A placement policy: how it plans a round, and what the mechanism around it (replay, the coordinator, the
/// simulator and the serving stack) must know about it. Callers ask these methods, never the policy's name.
pub trait Policy: Send + Sync {
    /// Its name (`--policy NAME`).
    fn name(&self) -> &'static str;

    /// Plans a round.
    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError>;

    /// How a tenant's requests are spread over its serving instances under this policy's plans.
    fn dispatch(&self) -> Dispatch {
        Dispatch::EarliestFinish
    }

    /// Whether the policy plans with the true future arrival rates ([`TenantInput::actual`]): a reference, not a
    /// policy anyone can deploy. Its callers fill `actual` in; for the others it stays empty.
    ///
    /// [`TenantInput::actual`]: crate::input::TenantInput::actual
    fn sees_truth(&self) -> bool {
        false
    }

    /// Whether the policy plans again, inside a window, when a slot's arrivals leave the bands of the forecasts
    /// its plan was made with ([`crate::forecast::burst_calls_replan`]). One that sees the truth saw the burst
    /// coming, and does not.
    fn replans_on_bursts(&self) -> bool {
        !self.sees_truth()
    }
}

/// Runs `f` and says when it started and how long it ran. The one place the planner reads a clock: for
/// [`PlanReport::solve_times`], which traces report and nothing planned depends on (planning time is the input's
/// `SimTime`).
#[allow(clippy::disallowed_methods)]
fn timed<T>(f: impl FnOnce() -> T) -> (T, SolveTime) {
    let started = std::time::SystemTime::now();
    let clock = std::time::Instant::now();
    let out = f();
    (out, SolveTime { started, elapsed: clock.elapsed() })
}

/// [`plan_fleet`] for a `level2` that solves through a [`SharedSolves`]: one for the round, whose counts the
/// round's [`PlanStats`] report.
pub fn plan_fleet_shared(
    policy: &str,
    input: &PlannerInput,
    l1: L1,
    level2: impl Fn(&GpuId, &[TenantId], &SharedSolves) -> Result<Option<GpuOutcome>, SolveError> + Sync,
) -> Result<PlanOutcome, PlanError> {
    let shared = SharedSolves::default();
    let mut outcome = plan_fleet(policy, input, l1, |gpu, tenants| level2(gpu, tenants, &shared))?;
    if let PlanOutcome::Planned(report) = &mut outcome {
        (report.stats.solves, report.stats.shared_solves) = shared.counts();
    }
    Ok(outcome)
}

/// Runs `level2` on every GPU of `l1` in parallel and assembles the plan.
pub fn plan_fleet(
    policy: &str,
    input: &PlannerInput,
    l1: L1,
    level2: impl Fn(&GpuId, &[TenantId]) -> Result<Option<GpuOutcome>, SolveError> + Sync,
) -> Result<PlanOutcome, PlanError> {
    input.validate()?;
    // Whatever the policy's level 1, the operators' pins hold.
    let l1 = crate::assign::honour_pins(input, l1);
    if !input.tenants.is_empty() && l1.unplaced.len() == input.tenants.len() {
        let reasons: Vec<String> = l1.unplaced.iter().take(5).map(|(t, r)| format!("{t}: {r}")).collect();
        return Ok(PlanOutcome::Infeasible {
            reason: format!(
                "no tenant can be placed ({}{})",
                reasons.join("; "),
                if l1.unplaced.len() > 5 { "; ..." } else { "" }
            ),
        });
    }
    let work: Vec<(&GpuId, &Vec<TenantId>)> = l1.per_gpu.iter().collect();
    type Solved = (GpuId, Option<GpuOutcome>, SolveTime);
    let results: Vec<Result<Solved, PlanError>> = work
        .par_iter()
        .map(|(gpu, tenants)| {
            let (outcome, time) = timed(|| level2(gpu, tenants));
            outcome
                .map(|o| ((*gpu).clone(), o, time))
                .map_err(|source| PlanError::Solver { gpu: (*gpu).clone(), source })
        })
        .collect();
    let mut gpus = BTreeMap::new();
    let mut outcomes = BTreeMap::new();
    let mut solve_times = BTreeMap::new();
    let mut stats = Vec::new();
    let slot_ms = (input.config.slot_s * 1000.0).round() as u64;
    for r in results {
        let (gpu, outcome, time) = r?;
        solve_times.insert(gpu.clone(), time);
        let Some(o) = outcome else {
            gpus.insert(
                gpu.clone(),
                GpuPlan {
                    layout: Default::default(),
                    assignments: vec![],
                    expected_goodput: 0.0,
                    explanation: format!("{policy}: no tenants"),
                    upcoming: vec![],
                    retraining_epochs: BTreeMap::new(),
                    sharing: Default::default(),
                },
            );
            continue;
        };
        // The solver's bound is on the planning value: the horizon's goodput plus what completed retrainings earn
        // beyond it (0 for policies that count the horizon alone).
        let (objective, tail) = evaluate::goodput_and_tail(&o.problem, &o.placed);
        let value = objective + tail;
        let bound = o.bound.max(value);
        let upcoming: Vec<PlannedChange> = (1..o.placed.slots.len())
            .filter(|t| o.placed.slots[*t] != o.placed.slots[*t - 1])
            .map(|t| PlannedChange {
                at: SimTime::from_ms(input.now.as_ms() + t as u64 * slot_ms),
                layout: o.layout(t),
                assignments: o.placed.slots[t].clone(),
            })
            .collect();
        let first = o.placed.slots.first().cloned().unwrap_or_default();
        let layout = o.layout(0);
        let explanation = format!(
            "{policy}: {} tenant(s); layout {}; {}; expected goodput {:.1}{} (bound {:.1}, gap {:.2}%, {:?}){}",
            o.problem.tenants.len(),
            layout.display_for(o.problem.gpu),
            o.note,
            objective,
            if tail > 0.0 { format!(" and {tail:.1} beyond the horizon") } else { String::new() },
            bound,
            100.0 * relative_gap(value, bound),
            o.status,
            if upcoming.is_empty() { String::new() } else { format!("; {} later change(s) expected", upcoming.len()) },
        );
        stats.push(GpuStats {
            gpu: gpu.clone(),
            tenants: o.problem.tenants.len(),
            status: o.status,
            objective: value,
            bound,
            replanned: o.replanned,
        });
        gpus.insert(
            gpu.clone(),
            GpuPlan {
                layout,
                assignments: first,
                expected_goodput: objective,
                explanation,
                upcoming,
                retraining_epochs: o.retraining_epochs.clone(),
                sharing: o.sharing,
            },
        );
        outcomes.insert(gpu, o);
    }
    let objective: f64 = stats.iter().map(|s| s.objective).sum();
    let bound: f64 = stats.iter().map(|s| s.bound).sum();
    let plan = Plan { epoch: input.epoch, made_at: input.now, policy: policy.to_string(), gpus };
    Ok(PlanOutcome::Planned(Box::new(PlanReport {
        plan,
        stats: PlanStats {
            objective,
            bound,
            gap: relative_gap(objective, bound),
            gpus: stats,
            unplaced: l1.unplaced,
            moved: l1.moved,
            solves: 0,
            shared_solves: 0,
        },
        outcomes,
        solve_times,
    })))
}
