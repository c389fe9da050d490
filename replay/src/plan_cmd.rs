//! `replay plan`: planning rounds on generated or dumped inputs, timed, for sizing the planner.
//!
//! Each round runs the whole policy (level 1 and every level-2 solve, in parallel) on the same input; the median
//! wall time over `repeat` rounds is reported with the plan's planning value (objective: expected goodput over the
//! horizon, plus what completed retrainings earn beyond it where the policy counts that), the sum of the per-GPU
//! bounds and the relative gap between them.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;
use tessera_core::model::ModelProfile;
use tessera_planner::PlannerInput;
use tessera_planner::by_name;
use tessera_planner::level2::solver::SolveStatus;
use tessera_planner::policy::PlanOutcome;

/// The figures of one policy over `repeat` rounds.
#[derive(Debug, Clone, Serialize)]
pub struct PlanRun {
    /// Policy name.
    pub policy: String,
    /// GPUs in the input.
    pub gpus: usize,
    /// Tenants in the input.
    pub tenants: usize,
    /// Slots in the horizon.
    pub slots: usize,
    /// Rounds run.
    pub rounds: usize,
    /// Median wall time of a round, ms (level 1 and all level-2 solves).
    pub solve_ms: f64,
    /// Every round's wall time, ms.
    pub solve_ms_all: Vec<f64>,
    /// With `--warm N`: rounds follow one another N slots apart, each warm-started from the one before; the first
    /// (cold) round's time, ms, which `solve_ms` leaves out.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cold_ms: Option<f64>,
    /// With `--warm N`: N.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warm_slots: Option<usize>,
    /// Planning value of the plan: expected goodput over the horizon (requests within SLO x accuracy), plus what
    /// the retrainings it completes earn beyond it where the policy counts that (tessera, perfect-forecast).
    pub objective: f64,
    /// Sum of the per-GPU upper bounds.
    pub bound: f64,
    /// Relative gap `(bound - objective) / bound`.
    pub gap: f64,
    /// Per-GPU solve outcomes of the last round, counted.
    pub statuses: BTreeMap<String, usize>,
    /// GPUs that kept their last plan shifted forward (incremental rounds), in each round `solve_ms_all` times.
    pub kept_all: Vec<usize>,
    /// Over the rounds `solve_ms_all` times, why GPUs that could have kept their last plan were solved again.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub replanned: BTreeMap<String, usize>,
    /// Column-generation solves of the last round (0 for policies that do not solve by column generation).
    pub cg_solves: usize,
    /// Of those, how many another GPU's solve of the same inputs answered (GPUs the same up to the tenants' names).
    pub shared_solves: usize,
    /// Tenants level 1 could not place.
    pub unplaced: usize,
    /// Set when the policy found the input infeasible.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub infeasible: Option<String>,
}

/// Reads a dumped `PlannerInput` (JSON), naming the file, line, column and field of a problem.
pub fn read_input(path: &Path) -> anyhow::Result<PlannerInput> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    let input: PlannerInput = serde_path_to_error::deserialize(de).map_err(|e| {
        let inner = e.inner();
        anyhow::anyhow!("{}:{}:{}: field `{}`: {}", path.display(), inner.line(), inner.column(), e.path(), inner)
    })?;
    input.validate().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(input)
}

/// Loads the model profiles of `dir`.
pub fn read_models(dir: &Path) -> anyhow::Result<BTreeMap<String, ModelProfile>> {
    tessera_core::config::load_model_dir(dir).map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs `policy` `repeat` times on `input`; with `warm = Some(n)`, on a chain of rounds `n` slots apart, each
/// warm-started from the one before ([`tessera_planner::synthetic::next_round`]), the first cold and timed apart.
pub fn run(policy: &str, input: &PlannerInput, repeat: usize, warm: Option<usize>) -> anyhow::Result<PlanRun> {
    if warm.is_some() && repeat < 2 {
        anyhow::bail!("--warm needs --repeat of at least 2 (the first round is cold)");
    }
    let p = by_name(policy).map_err(|e| anyhow::anyhow!(e))?;
    let mut times = Vec::with_capacity(repeat.max(1));
    let mut kept_all = Vec::with_capacity(repeat.max(1));
    let mut replanned: BTreeMap<String, usize> = BTreeMap::new();
    let mut last = None;
    let mut cold_ms = None;
    let mut round = input.clone();
    for _ in 0..repeat.max(1) {
        if let (Some(n), Some(PlanOutcome::Planned(report))) = (warm, &last) {
            round = tessera_planner::synthetic::next_round(&round, &report.outcomes, n, round.config.seed);
        }
        let started = Instant::now();
        let outcome = p.plan(&round)?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if warm.is_some() && cold_ms.is_none() {
            cold_ms = Some(ms);
        } else {
            times.push(ms);
            let gpus = match &outcome {
                PlanOutcome::Planned(r) => r.stats.gpus.as_slice(),
                PlanOutcome::Infeasible { .. } => &[],
            };
            kept_all.push(gpus.iter().filter(|g| g.status == SolveStatus::Shifted).count());
            for why in gpus.iter().filter_map(|g| g.replanned) {
                *replanned.entry(why.name().to_string()).or_default() += 1;
            }
        }
        last = Some(outcome);
    }
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    let mut run = PlanRun {
        policy: policy.to_string(),
        gpus: input.gpus.len(),
        tenants: input.tenants.len(),
        slots: input.config.horizon_slots,
        rounds: times.len(),
        solve_ms: median,
        solve_ms_all: times,
        cold_ms,
        warm_slots: warm,
        objective: 0.0,
        bound: 0.0,
        gap: 0.0,
        statuses: BTreeMap::new(),
        kept_all,
        replanned,
        cg_solves: 0,
        shared_solves: 0,
        unplaced: 0,
        infeasible: None,
    };
    match last.expect("at least one round") {
        PlanOutcome::Planned(report) => {
            run.objective = report.stats.objective;
            run.bound = report.stats.bound;
            run.gap = report.stats.gap;
            run.unplaced = report.stats.unplaced.len();
            (run.cg_solves, run.shared_solves) = (report.stats.solves, report.stats.shared_solves);
            for g in &report.stats.gpus {
                *run.statuses.entry(status_name(g.status).into()).or_default() += 1;
            }
        }
        PlanOutcome::Infeasible { reason } => run.infeasible = Some(reason),
    }
    Ok(run)
}

fn status_name(s: SolveStatus) -> &'static str {
    match s {
        SolveStatus::Optimal => "optimal",
        SolveStatus::GapLimit => "gap_limit",
        SolveStatus::Budget => "budget",
        SolveStatus::Rule => "rule",
        SolveStatus::Shifted => "shifted",
    }
}

/// A fixed-width table of runs.
pub fn table(runs: &[PlanRun]) -> String {
    let mut out = format!(
        "{:<9} {:>6} {:>8} {:>6} {:>8} {:>12} {:>14} {:>14} {:>8}  {}\n",
        "policy", "gpus", "tenants", "slots", "rounds", "solve_ms", "objective", "bound", "gap", "solves"
    );
    for r in runs {
        let statuses: Vec<String> = r.statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!(
            "{:<9} {:>6} {:>8} {:>6} {:>8} {:>12.1} {:>14.1} {:>14.1} {:>7.3}%  {}{}{}{}\n",
            r.policy,
            r.gpus,
            r.tenants,
            r.slots,
            r.rounds,
            r.solve_ms,
            r.objective,
            r.bound,
            100.0 * r.gap,
            statuses.join(" "),
            if r.shared_solves > 0 {
                format!(" ({} of {} solves shared)", r.shared_solves, r.cg_solves)
            } else {
                String::new()
            },
            r.cold_ms
                .map(|c| format!(
                    " (warm rounds {} slots apart; the cold first took {c:.1} ms)",
                    r.warm_slots.unwrap_or(0)
                ))
                .unwrap_or_default(),
            r.infeasible.as_ref().map(|i| format!(" infeasible: {i}")).unwrap_or_default(),
        ));
    }
    out
}
