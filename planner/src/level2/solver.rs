//! Running a mixed-integer programme built with good_lp: backend choice, time limit and gap, status, bound.
//!
//! Two backends, chosen by measurement (see the crate's benchmark and the planner's closing notes):
//! - **HiGHS** (default): models are built with good_lp and handed to HiGHS through `highs::Model`, so that the
//!   solver's dual bound and gap can be read back (good_lp's own solution type does not expose them). One thread,
//!   quiet, with the configured time limit and relative gap.
//! - **microlp** (pure Rust fallback): proves optimality on small models only; its bound is known only when it
//!   reports an optimum.
//!
//! A solve that stops on its budget (nodes, the deterministic limit, or the wall-clock safety net) still returns its
//! incumbent; the status says so (`Budget`), and callers decide. HiGHS runs on one thread with a fixed random
//! seed, so a node-limited solve is reproducible.

use good_lp::solvers::microlp::microlp;
use std::collections::HashMap;

use good_lp::{
    Constraint, Expression, ProblemVariables, ResolutionError, Solution, SolutionStatus, SolverModel, Variable,
    WithTimeLimit,
};
use highs::HighsModelStatus;
use serde::{Deserialize, Serialize};

/// Which MILP backend solves level-2 models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// HiGHS (C++, compiled from source by `highs-sys`).
    #[default]
    Highs,
    /// microlp (pure Rust).
    Microlp,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "highs" => Ok(Backend::Highs),
            "microlp" => Ok(Backend::Microlp),
            other => Err(format!("unknown solver backend {other:?} (expected highs or microlp)")),
        }
    }
}

/// Limits for one solve.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SolverConfig {
    /// The backend.
    pub backend: Backend,
    /// Wall-clock limit per solve, seconds.
    pub time_limit_s: f64,
    /// Relative optimality gap at which the solver may stop (default 1 %).
    pub mip_rel_gap: f64,
    /// Branch-and-bound nodes per MILP solve: the budget that binds in practice. Unlike the time limit it does not
    /// depend on the machine's speed or load, so a budget-limited solve still gives the same plan every time.
    pub max_nodes: u64,
}

impl Default for SolverConfig {
    fn default() -> Self {
        SolverConfig { backend: Backend::Highs, time_limit_s: 10.0, mip_rel_gap: 0.01, max_nodes: 500 }
    }
}

/// How a solve ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SolveStatus {
    /// Proven optimal (within the solver's default tolerance).
    Optimal,
    /// Stopped at the configured gap.
    GapLimit,
    /// Stopped on a budget (wall clock, branch-and-bound nodes, or column-generation rounds) above the gap, with a
    /// feasible incumbent.
    Budget,
    /// A rule-based policy decided (the baselines): nothing was optimised, so there is no bound and no gap.
    Rule,
    /// Incremental rounds kept the GPU's last plan, shifted forward, since nothing it depends on moved beyond the
    /// band ([`crate::input::PlannerConfig::replan_band`]); its bound is the Lagrangian bound at the last plan's
    /// prices, a proven one.
    Shifted,
}

impl SolveStatus {
    /// The status of an incumbent `objective` against a proven `bound` when the allowed gap is `gap_limit`.
    pub fn from_gap(objective: f64, bound: f64, gap_limit: f64) -> SolveStatus {
        let gap = relative_gap(objective, bound);
        if gap <= 1e-9 {
            SolveStatus::Optimal
        } else if gap <= gap_limit + 1e-9 {
            SolveStatus::GapLimit
        } else {
            SolveStatus::Budget
        }
    }
}

/// The result of one MILP solve.
#[derive(Debug, Clone)]
pub struct MilpResult {
    /// Values of the variables.
    pub values: HashMap<Variable, f64>,
    /// Objective of the incumbent.
    pub objective: f64,
    /// Best proven upper bound (maximisation); `f64::INFINITY` when the backend cannot tell.
    pub bound: f64,
    /// How it ended.
    pub status: SolveStatus,
}

/// A solve that produced no incumbent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("MILP solve failed: {0}")]
pub struct SolveError(pub String);

/// Maximises `objective` over `vars` subject to `constraints`.
pub fn maximise(
    vars: ProblemVariables,
    objective: Expression,
    constraints: Vec<Constraint>,
    config: &SolverConfig,
) -> Result<MilpResult, SolveError> {
    let order: Vec<Variable> = vars.iter_variables_with_def().map(|(v, _)| v).collect();
    match config.backend {
        Backend::Highs => {
            let mut problem = vars.maximise(objective.clone()).using(good_lp::solvers::highs::highs);
            for c in constraints {
                problem.add_constraint(c);
            }
            let mut model = problem.try_into_inner().map_err(|e| SolveError(e.to_string()))?;
            model.make_quiet();
            model.set_option("time_limit", config.time_limit_s.max(0.001));
            model.set_option("mip_rel_gap", config.mip_rel_gap.max(0.0));
            model.set_option("threads", 1);
            model.set_option("random_seed", 0);
            model.set_option("mip_max_nodes", i32::try_from(config.max_nodes).unwrap_or(i32::MAX));
            let solved = model.try_solve().map_err(|e| SolveError(format!("{e:?}")))?;
            let status = match solved.status() {
                HighsModelStatus::Optimal => {
                    let gap = solved.mip_gap();
                    if gap.is_finite() && gap > 1e-6 { SolveStatus::GapLimit } else { SolveStatus::Optimal }
                }
                HighsModelStatus::ReachedTimeLimit
                | HighsModelStatus::ReachedIterationLimit
                | HighsModelStatus::ReachedSolutionLimit => SolveStatus::Budget,
                other => return Err(SolveError(format!("HiGHS ended with {other:?}"))),
            };
            if solved.primal_solution_status() != highs::HighsSolutionStatus::Feasible {
                return Err(SolveError("HiGHS found no feasible solution within its limits".into()));
            }
            let columns = solved.get_solution().columns().to_vec();
            let values: HashMap<Variable, f64> = order.iter().copied().zip(columns).collect();
            let objective_value = values.eval(&objective);
            let bound = solved
                .double_info_value(c"mip_dual_bound")
                .ok()
                .filter(|b| b.is_finite())
                .unwrap_or(if status == SolveStatus::Optimal { objective_value } else { f64::INFINITY });
            // HiGHS reports its bound on the presolved model; never report a bound below the incumbent.
            Ok(MilpResult { values, objective: objective_value, bound: bound.max(objective_value), status })
        }
        Backend::Microlp => {
            let mut problem = vars.maximise(objective.clone()).using(microlp).with_time_limit(config.time_limit_s);
            for c in constraints {
                problem.add_constraint(c);
            }
            let solution = problem.solve().map_err(|e: ResolutionError| SolveError(e.to_string()))?;
            let status = match solution.status() {
                SolutionStatus::Optimal => SolveStatus::Optimal,
                SolutionStatus::GapLimit => SolveStatus::GapLimit,
                SolutionStatus::TimeLimit => SolveStatus::Budget,
            };
            let values: HashMap<Variable, f64> = order.iter().map(|v| (*v, solution.value(*v))).collect();
            let objective_value = solution.eval(&objective);
            let bound = if status == SolveStatus::Optimal { objective_value } else { f64::INFINITY };
            Ok(MilpResult { values, objective: objective_value, bound, status })
        }
    }
}

/// Relative gap `(bound - objective) / max(|bound|, tiny)`, 0 when proven optimal, infinite when unknown.
pub fn relative_gap(objective: f64, bound: f64) -> f64 {
    if !bound.is_finite() {
        return f64::INFINITY;
    }
    ((bound - objective) / bound.abs().max(1e-9)).max(0.0)
}
