//! Column generation: rounds of the master LP and pricing at Wentges-smoothed prices, with the Lagrangian bound
//! at every round and LP-guided plans every [`PRIMAL_EVERY`] rounds.

use super::MAX_ROUNDS;
use super::columns::Column;
use super::master::MasterSolution;
use super::state::{Context, State};
use crate::level2::solver::{SolveError, relative_gap};

/// Wentges smoothing weight on the best-bound duals, against the LP's: heavy smoothing converges in fewer rounds.
const SMOOTHING: f64 = 0.8;

/// Rounds between LP-guided plans during column generation (each may prove the gap and end generation early).
const PRIMAL_EVERY: usize = 3;

/// Columns a tenant's pricing may add per round: the best of each of its best retraining choices.
const COLUMNS_PER_PRICING: usize = 4;

impl Context<'_> {
    /// The Lagrangian bound at capacity prices `pi` (`pi.b` plus each tenant's best reduced cost), with each
    /// tenant's best columns at those prices.
    pub(super) fn lagrangian_at(&self, pi: &[f64]) -> (f64, Vec<Column>) {
        let mut y = pi.to_vec();
        y.extend(std::iter::repeat_n(0.0, self.n));
        let mut lagrangian: f64 = pi.iter().zip(&self.b).map(|(p, b)| p * b).sum();
        let mut priced = Vec::new();
        for i in 0..self.n {
            let top = self.pricers[i].price_top(self.pb, &self.l, &y, None, COLUMNS_PER_PRICING);
            lagrangian += top.first().map_or(0.0, |(_, best)| *best);
            priced.extend(top.into_iter().map(|(c, _)| c));
        }
        (lagrangian, priced)
    }
}

/// Column generation. Every `PRIMAL_EVERY` rounds the LP-guided plan is built; generation stops once the best plan
/// is within the configured gap of the bound, when the LP is within half that gap of it, when no column improves,
/// or after `MAX_ROUNDS` rounds. `Err` only where HiGHS fails on the master.
pub(super) fn generate(cx: &Context, st: &mut State) -> Result<(), SolveError> {
    let (pb, l, n, ncap, config) = (cx.pb, &cx.l, cx.n, cx.ncap, cx.config);
    let target = (config.mip_rel_gap * 0.5).max(1e-6);
    // A warm start may close the gap before any master is solved.
    while !st.gap_closed(cx) {
        st.rounds += 1;
        // The wall-clock safety net (`SolverConfig::time_limit_s`, on HiGHS: a machine starved of CPU, a paused
        // process) stops generation where it is. The incumbent and the bound (valid at any prices) stand, and the
        // heuristics after it still run, so the GPU gets a plan marked as a budget stop rather than none.
        let Some(MasterSolution { objective: lp, duals: y_lp, x }) =
            st.master.solve(pb, l, &cx.b, &st.columns, config)?
        else {
            break;
        };
        let pi_lp: Vec<f64> = y_lp[..ncap].iter().map(|v| v.max(0.0)).collect();
        let mut added = 0;
        // Wentges smoothing: price between the best-bound duals and the LP's; on a mis-price, price at the LP's
        // duals, which is exact.
        for alpha in [SMOOTHING, 0.0] {
            let pi: Vec<f64> = st.center.iter().zip(&pi_lp).map(|(c, p)| alpha * c + (1.0 - alpha) * p).collect();
            let (lagrangian, priced) = cx.lagrangian_at(&pi);
            for col in priced {
                let rc_lp = col.value
                    - col
                        .rows(pb, l)
                        .iter()
                        .map(|(r, v)| if *r < ncap { pi_lp[*r] * v } else { y_lp[*r] * v })
                        .sum::<f64>();
                if rc_lp > 1e-7 * (1.0 + col.value.abs()) && st.columns.insert(col) {
                    st.master.add(pb, l, st.columns.last());
                    added += 1;
                }
            }
            if lagrangian < st.bound {
                st.bound = lagrangian;
                st.center = pi;
            }
            if added > 0 {
                break;
            }
        }
        st.bound = st.bound.max(lp);
        st.duals = pi_lp.iter().copied().chain(std::iter::repeat_n(0.0, n)).collect::<Vec<f64>>();
        let stop = added == 0 || relative_gap(lp, st.bound) <= target || st.rounds >= MAX_ROUNDS;
        if stop || st.rounds.is_multiple_of(PRIMAL_EVERY) {
            for plan in cx.lp_guided(&st.columns[..x.len()], &x, &st.duals) {
                st.consider(cx, plan);
            }
        }
        st.x_root = x;
        if stop {
            break;
        }
    }
    Ok(())
}
