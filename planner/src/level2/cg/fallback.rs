//! The finish: the best plan the heuristics found, or, where a proven optimum is asked for on a problem as small as
//! [`COMPACT_LIMIT`] and the heuristics leave the gap open (or found no plan), HiGHS on the compact MILP
//! ([`crate::level2::ilp`]), which is exact there; the bound reported is then the tighter of the two.

use super::columns::Plan;
use super::state::Context;
use super::{COMPACT_LIMIT, EXACT_GAP};
use crate::level2::ilp::{self, Solved};
use crate::level2::solver::{SolveError, SolveStatus};

/// The solve's result from the best plan `incumbent` and the bound, falling back to the compact MILP as the module
/// doc says.
pub(super) fn finish(cx: &Context, incumbent: Option<(f64, Plan)>, bound: f64) -> Result<Solved, SolveError> {
    let (pb, n, config) = (cx.pb, cx.n, cx.config);
    let picked = incumbent.and_then(|(_, s)| cx.to_schedule(&s)).filter(|s| s.feasible(pb));
    let heuristic = picked.map(|schedule| {
        let objective = schedule.objective(pb);
        let bound = bound.max(objective);
        Solved { schedule, objective, bound, status: SolveStatus::from_gap(objective, bound, config.mip_rel_gap) }
    });
    let solved = match heuristic {
        Some(s)
            if s.status != SolveStatus::Budget || n * pb.slots > COMPACT_LIMIT || config.mip_rel_gap > EXACT_GAP =>
        {
            s
        }
        other => {
            let compact = ilp::solve(pb, config)?;
            let bound = compact.bound.min(other.as_ref().map_or(f64::INFINITY, |s| s.bound));
            let best = match other {
                Some(s) if s.objective >= compact.objective => s,
                _ => compact,
            };
            let bound = bound.max(best.objective);
            Solved { bound, status: SolveStatus::from_gap(best.objective, bound, config.mip_rel_gap), ..best }
        }
    };
    Ok(solved)
}
