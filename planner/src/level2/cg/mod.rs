//! Level 2 by column generation: the count-level model of [`crate::level2::ilp`] decomposed per tenant
//! (Dantzig-Wolfe), which is what makes a seven-tenant, thirty-slot GPU solve in milliseconds.
//!
//! Tenants interact only through each slot's capacity rows (compute slices, memory slices, instances, per-profile
//! maxima) and the pre-initialisation rows (new instances must fit beside the previous slot). A **column** is one
//! tenant's whole plan over the horizon: its inference profile per slot, which new instances are pre-initialised,
//! and its retraining option. The master LP picks a convex combination of columns per tenant under the shared
//! rows; its bound is far tighter than the compact model's relaxation, because every per-tenant rule
//! (non-preemptive retraining, accuracy after completion, `min(arrivals, capacity)`, dead time) holds inside each
//! column.
//!
//! **Pricing** is exact: for each retraining option (and none) a dynamic programme over slots, with the inference
//! profile as the state, finds the tenant's column of largest reduced cost under the master's dual prices. Columns
//! whose own instances do not fit the GPU are never generated.
//!
//! **Master**: the first LP already holds a feasible plan (tenants by solo value take their best plan in the room
//! the others leave), so its duals mean something from the first round. Per-profile count rows that compute,
//! memory and instance rows already imply are left out (on every catalogued GPU, all of them), and the LP is
//! re-solved by primal simplex, which restarts from the previous basis when columns are added: the planner's own
//! dense simplex ([`crate::level2::master`]), with HiGHS taking over for the rest of a solve where it gives up. Each
//! pricing adds the best column of each of a tenant's best few retraining choices, not just one.
//!
//! **Bound**: at every round `pi.b + sum over tenants of the best reduced cost` is a valid upper bound
//! (Lagrangian); pricing is stabilised by Wentges smoothing (prices between the best-bound duals and the LP's,
//! weight `SMOOTHING`, falling back to the LP's on a mis-price).
//!
//! **Plan**, built every `PRIMAL_EVERY` rounds from the LP's solution: rounding (each tenant keeps its heaviest
//! LP column where it still fits) and an LP-guided greedy (each tenant's retraining choice is the one the LP
//! weighs most, with a variant per split tenant), each followed by single-tenant ascent over the choices the LP
//! uses. Generation stops as soon as a plan is within the configured gap of the bound, or when the LP is within
//! half the gap of it, no column improves, or after [`MAX_ROUNDS`] rounds. If the gap is still open then, the
//! Lagrangian greedy starts (at the LP's duals, the best-bound duals and zero) and any seeds join, and the best
//! plan gets pair moves: two tenants re-plan their inference together by an exact dynamic programme over the
//! pair's profiles, the move that lets one tenant shrink so that another grows. Problems of at most
//! [`COMPACT_LIMIT`] tenant-slots whose gap is still open then settle which tenants retrain, and how, by
//! enumeration (each subset of the tenants that may retrain; each retraining option fixed), each followed by
//! greedy, ascent and pair moves. When a proven optimum is asked for (a gap of at most [`EXACT_GAP`]), those
//! whose gap is still open go to the compact MILP ([`crate::level2::ilp`]), which is exact there; the reported bound is
//! the tighter of the two. At a planning gap (1 %) they do not: the open gap there is the master LP's bound,
//! loosened by fractional retrainings, not the plan (see `docs/performance.md`, "2026-11-25: column generation
//! constants").
//!
//! **Warm start** ([`solve_warm`]): the previous round's plan joins the seeds and its best-bound prices are priced
//! before the first master (a Lagrangian bound valid at any prices, and the stabilisation centre); when that
//! bound already proves the gap, no master LP is solved at all. A **cold start** prices the duals of the per-slot
//! relaxation there instead (each slot planned on its own, tenants on fractional mixes of profiles; one small LP),
//! whose bound is close to the final one from the start.
//!
//! The phases live one to a file, in the order [`solve_warm`] runs them: `start` (the first columns, plans and start
//! prices), `generation` (rounds of master and pricing), `heuristics` (ascent, the LP-guided and Lagrangian greedy
//! plans, the enumeration of retraining choices), `pair_moves` and `fallback` (the compact MILP); beside them
//! `columns` (columns and the master's rows), `pricing` (the pricing programme), `master` (the restricted master LP
//! and its HiGHS fallback) and `state` (what the phases share).
//!
//! Measured figures are in the benchmark's output (`cargo bench -p tessera-planner`) and `docs/performance.md`.
//!
//! HiGHS (the per-slot relaxation, the master's fallback, the compact MILP) is called directly (not through good_lp)
//! because column generation needs row duals and incremental columns, which good_lp does not expose.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

mod columns;
mod fallback;
mod generation;
mod heuristics;
mod master;
mod pair_moves;
mod pricing;
mod start;
mod state;
#[cfg(test)]
mod tests;

use crate::level2::ilp::Solved;
use crate::level2::problem::{GpuProblem, Schedule};
use crate::level2::solver::{SolveError, SolverConfig};
use master::MASTER_PIVOTS;
use state::Context;

/// Column-generation rounds at the root: enough for the bound to settle, and a cap on time where it tails off.
pub const MAX_ROUNDS: usize = 40;

/// Largest problem (tenant-slots) whose open exact solve goes to the compact MILP: beyond it HiGHS is too slow to help.
pub const COMPACT_LIMIT: usize = 18;

/// Configured gaps at or below this ask for a proven optimum, and only they send small problems to the compact MILP.
pub const EXACT_GAP: f64 = 1e-4;

/// Solves `pb` by column generation and a Lagrangian heuristic, with the compact MILP for small problems (see the
/// module doc).
pub fn solve(pb: &GpuProblem, config: &SolverConfig) -> Result<Solved, SolveError> {
    solve_seeded(pb, config, &[])
}

/// [`solve`], with feasible schedules from elsewhere (rule-based allocations) as further starts for the local
/// search: the result is never worse, on the count-level objective, than the best seed improved by ascent.
pub fn solve_seeded(pb: &GpuProblem, config: &SolverConfig, seeds: &[Schedule]) -> Result<Solved, SolveError> {
    solve_warm(pb, config, seeds, None).map(|w| w.solved)
}

/// What [`solve_warm`] found, with what the next round may start from.
#[derive(Debug, Clone)]
pub struct WarmSolved {
    /// The plan, its value and its bound.
    pub solved: Solved,
    /// The prices of the best bound, per slot: one per usage row (compute slices, memory slices, instances, then
    /// any per-profile rows) and one per pre-initialisation room row, in that order: the marginal planning value of
    /// one more unit of each in that slot.
    pub prices: Vec<Vec<f64>>,
    /// Column-generation rounds (master LP solves) it took.
    pub rounds: usize,
}

/// [`solve_seeded`], warm-started: `prices` (per slot, as [`WarmSolved::prices`] gives them, from the previous
/// round shifted to this one's slots) are priced first, so that the bound starts where the last round's ended, and
/// they centre the stabilisation. Prices of the wrong shape are ignored; a warm start changes how fast the gap
/// closes, never what counts as a plan or a bound.
pub fn solve_warm(
    pb: &GpuProblem,
    config: &SolverConfig,
    seeds: &[Schedule],
    prices: Option<&[Vec<f64>]>,
) -> Result<WarmSolved, SolveError> {
    solve_warm_on(pb, config, seeds, prices, MASTER_PIVOTS)
}

/// A valid upper bound on `pb`'s planning value: the Lagrangian bound at capacity `prices` (per slot, as
/// [`WarmSolved::prices`] gives them). `None` where the prices do not fit `pb`'s rows. One pricing of every
/// tenant, no master: what incremental rounds bound a kept plan with.
pub fn bound_at(pb: &GpuProblem, config: &SolverConfig, prices: &[Vec<f64>]) -> Option<f64> {
    let cx = Context::new(pb, config);
    let k = 2 * cx.l.k;
    if prices.len() != pb.slots || prices.iter().any(|s| s.len() != k || s.iter().any(|v| !v.is_finite())) {
        return None;
    }
    let pi: Vec<f64> = prices.iter().flatten().map(|v| v.max(0.0)).collect();
    Some(cx.lagrangian_at(&pi).0)
}

/// [`solve_warm`], with `master_pivots` pivots per master solve before HiGHS takes over (tests of the fallback): the
/// phases in order (see the module doc).
fn solve_warm_on(
    pb: &GpuProblem,
    config: &SolverConfig,
    seeds: &[Schedule],
    prices: Option<&[Vec<f64>]>,
    master_pivots: usize,
) -> Result<WarmSolved, SolveError> {
    let cx = Context::new(pb, config);
    let mut st = start::first_plans(&cx, seeds, master_pivots);
    start::price_start(&cx, &mut st, prices);
    generation::generate(&cx, &mut st)?;
    heuristics::lagrangian_greedy(&cx, &mut st);
    pair_moves::improve(&cx, &mut st);
    heuristics::enumerate_retraining(&cx, &mut st);
    let solved = fallback::finish(&cx, st.incumbent, st.bound)?;
    let prices = st.center.chunks(2 * cx.l.k).map(<[f64]>::to_vec).collect();
    Ok(WarmSolved { solved, prices, rounds: st.rounds })
}
