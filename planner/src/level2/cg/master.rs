//! The restricted master LP: the planner's own dense simplex ([`MasterLp`]), kept solved between rounds, with
//! HiGHS taking over for the rest of a solve where it gives up; and the HiGHS options every model of a solve uses.

use highs::{ColProblem, HighsModelStatus, Model, Row, Sense};

use super::columns::{Column, RowIndex};
use crate::level2::master::MasterLp;
use crate::level2::problem::GpuProblem;
use crate::level2::solver::{SolveError, SolverConfig};

/// Pivots one master solve may take before it gives up and HiGHS takes over.
pub(super) const MASTER_PIVOTS: usize = 20_000;

/// Big-M cost of each convexity row's artificial, which keeps the master feasible where the first columns clash.
const ARTIFICIAL_PENALTY: f64 = 1e9;

/// One master solve: its objective, row duals and column values (in the order the columns were added).
pub(super) struct MasterSolution {
    /// The LP's objective.
    pub(super) objective: f64,
    /// Its row duals, capacity rows then convexity rows.
    pub(super) duals: Vec<f64>,
    /// Its column values.
    pub(super) x: Vec<f64>,
}

/// The restricted master LP: [`MasterLp`] (a dense simplex kept solved between rounds), or HiGHS from the round
/// it gives up in (a pivot budget, a singular basis or a failed check: counted, none in 18,000 GPU solves of the
/// Azure Functions 2019 day's first three hours, 4,000 of 1,000-GPU rounds or 30-slot fleet rounds, but a numerical
/// corner must not end the plan).
pub(super) enum Master {
    /// The dense simplex, and its pivot budget per solve.
    Own(Box<MasterLp>, usize),
    /// HiGHS, with its rows; the model is taken out while it solves.
    Highs(Option<Model>, Vec<Row>),
}

impl Master {
    /// The master over capacity rows `b` and a convexity row per tenant: the dense simplex with `pivots` per
    /// solve, or with `None` HiGHS.
    pub(super) fn new(pb: &GpuProblem, l: &RowIndex, b: &[f64], pivots: Option<usize>) -> Master {
        let n = pb.tenants.len();
        let Some(pivots) = pivots else {
            let mut problem = ColProblem::new();
            let mut rows: Vec<Row> = b.iter().map(|lim| problem.add_row(..=*lim)).collect();
            rows.extend((0..n).map(|_| problem.add_row(1.0..=1.0)));
            let mut model = problem.optimise(Sense::Maximise);
            for i in 0..n {
                model.add_col(-ARTIFICIAL_PENALTY, 0.0.., [(rows[l.convex(i)], 1.0)]);
            }
            return Master::Highs(Some(model), rows);
        };
        let rhs: Vec<f64> = b.iter().copied().chain(std::iter::repeat_n(1.0, n)).collect();
        let equality: Vec<bool> = (0..rhs.len()).map(|r| r >= b.len()).collect();
        Master::Own(Box::new(MasterLp::new(rhs, &equality, ARTIFICIAL_PENALTY)), pivots)
    }

    /// Adds column `c`.
    pub(super) fn add(&mut self, pb: &GpuProblem, l: &RowIndex, c: &Column) {
        match self {
            Master::Own(lp, _) => {
                lp.add_column(c.value, c.rows(pb, l));
            }
            Master::Highs(model, rows) => {
                let model = model.as_mut().expect("the master is put back after every solve");
                model.add_col(c.value, 0.0.., c.rows(pb, l).iter().map(|&(r, v)| (rows[r], v)));
            }
        }
    }

    /// Solves the master over capacity rows `b` and `columns` (all of them added): `None` where HiGHS reached the
    /// time limit.
    pub(super) fn solve(
        &mut self,
        pb: &GpuProblem,
        l: &RowIndex,
        b: &[f64],
        columns: &[Column],
        config: &SolverConfig,
    ) -> Result<Option<MasterSolution>, SolveError> {
        if let Master::Own(lp, pivots) = self {
            if lp.solve(*pivots).is_ok() {
                return Ok(Some(MasterSolution {
                    objective: lp.objective(),
                    duals: lp.duals().to_vec(),
                    x: lp.primal(),
                }));
            }
            *self = Master::new(pb, l, b, None);
            for c in columns {
                self.add(pb, l, c);
            }
        }
        let Master::Highs(model, _) = self else { unreachable!("the dense simplex returned above") };
        let mut m = model.take().expect("the master is put back after every solve");
        quiet(&mut m, config, config.time_limit_s);
        let solved = m.try_solve().map_err(|e| SolveError(format!("HiGHS master LP: {e:?}")))?;
        match solved.status() {
            HighsModelStatus::Optimal => {}
            HighsModelStatus::ReachedTimeLimit => return Ok(None),
            other => return Err(SolveError(format!("HiGHS master LP ended with {other:?}"))),
        }
        let n = pb.tenants.len();
        let solution = solved.get_solution();
        let out = MasterSolution {
            objective: solved.objective_value(),
            duals: solution.dual_rows().to_vec(),
            x: solution.columns()[n..].to_vec(),
        };
        *model = Some(Model::from(solved));
        Ok(Some(out))
    }
}

/// Quiet, single-threaded and seeded (the same plan every time), with the wall-clock safety net `time_s`.
pub(super) fn deterministic(model: &mut Model, time_s: f64) {
    model.make_quiet();
    model.set_option("threads", 1);
    model.set_option("random_seed", 0);
    model.set_option("time_limit", time_s.max(1e-9));
}

/// [`deterministic`], with the MILP limits of `config` and the options that suit a master re-solved as columns join.
fn quiet(model: &mut Model, config: &SolverConfig, time_s: f64) {
    deterministic(model, time_s);
    model.set_option("mip_rel_gap", config.mip_rel_gap.max(0.0));
    model.set_option("mip_max_nodes", i32::try_from(config.max_nodes).unwrap_or(i32::MAX));
    // Primal simplex: adding columns keeps the previous basis primal feasible, so each round re-starts from it
    // (measured: about 30 % less LP time per round than HiGHS's default dual simplex, and fewer rounds).
    model.set_option("simplex_strategy", 4);
    // No presolve: the master is small and re-solved from its previous basis, where presolve only costs time
    // (measured on 100-GPU rounds: 10-40 % less planning time, warm and cold).
    model.set_option("presolve", "off");
    // No solution-error probe at each rebuild (a test solve with the factorisation; HiGHS then refactors only
    // where it has a reason to): measured on 100-GPU replay rounds, about 4 % less planning time, the same plans.
    model.set_option("rebuild_refactor_solution_error_tolerance", 0.0);
}
