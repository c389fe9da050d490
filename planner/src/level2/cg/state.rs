//! What the phases share: the problem's fixed data ([`Context`], read by every phase) and the search's state
//! ([`State`], passed from phase to phase).

use super::columns::{Column, Columns, Plan, RowIndex, row_limits};
use super::master::Master;
use super::pricing::Pricer;
use crate::level2::problem::{GpuProblem, Schedule};
use crate::level2::solver::{SolverConfig, relative_gap};

/// What every phase reads and none changes: the problem, the master's rows and limits, and each tenant's pricer.
pub(super) struct Context<'a> {
    /// The GPU's problem.
    pub(super) pb: &'a GpuProblem,
    /// The solve's settings.
    pub(super) config: &'a SolverConfig,
    /// Tenants.
    pub(super) n: usize,
    /// The master's row layout.
    pub(super) l: RowIndex,
    /// Each capacity row's limit (none below zero).
    pub(super) b: Vec<f64>,
    /// Capacity rows, which come before the convexity rows.
    pub(super) ncap: usize,
    /// Each tenant's pricer.
    pub(super) pricers: Vec<Pricer>,
    /// Zero prices on every row, the convexity rows too.
    pub(super) zero: Vec<f64>,
}

impl<'a> Context<'a> {
    /// `pb`'s rows, limits and pricers.
    pub(super) fn new(pb: &'a GpuProblem, config: &'a SolverConfig) -> Context<'a> {
        let n = pb.tenants.len();
        let l = RowIndex::new(pb);
        let limits = row_limits(pb, &l, &pb.current_usage());
        let fit = Pricer::fit_table(pb);
        let pricers: Vec<Pricer> = (0..n).map(|i| Pricer::new(pb, i, fit.clone())).collect();
        let zero = vec![0.0; limits.len() + n];
        let ncap = l.convex(0);
        let b: Vec<f64> = limits.iter().map(|v| v.max(0.0)).collect();
        Context { pb, config, n, l, b, ncap, pricers, zero }
    }

    /// The room the columns of `chosen` leave in every capacity row, all but tenant `skip`'s.
    pub(super) fn room_left(&self, chosen: &[Option<Column>], skip: usize) -> Vec<f64> {
        let mut rem = self.b.clone();
        for (j, c) in chosen.iter().enumerate() {
            if j == skip {
                continue;
            }
            for &(r, v) in c.iter().flat_map(|c| c.rows(self.pb, &self.l)) {
                if r < self.ncap {
                    rem[r] -= v;
                }
            }
        }
        rem
    }

    /// The schedule of a plan with a column for every tenant.
    pub(super) fn to_schedule(&self, chosen: &[Option<Column>]) -> Option<Schedule> {
        let pb = self.pb;
        let mut schedule = Schedule::empty(pb.slots, self.n);
        for (i, c) in chosen.iter().enumerate() {
            let c = c.as_ref()?;
            for t in 0..pb.slots {
                schedule.inference[t][i] = c.inference[t];
            }
            schedule.retrain[i] = c.retrain;
        }
        Some(schedule)
    }

    /// A plan's value on the count-level objective: `NEG_INFINITY` where it is not a feasible schedule.
    pub(super) fn value_of(&self, chosen: &[Option<Column>]) -> f64 {
        self.to_schedule(chosen).filter(|s| s.feasible(self.pb)).map_or(f64::NEG_INFINITY, |s| s.objective(self.pb))
    }
}

/// What the phases build on: the master and its columns, the bound and its prices, the best plan.
pub(super) struct State {
    /// The master's columns, in the order they joined it.
    pub(super) columns: Columns,
    /// The restricted master LP over them.
    pub(super) master: Master,
    /// The best bound so far.
    pub(super) bound: f64,
    /// The capacity prices of the best Lagrangian bound: the stabilisation centre, and the prices a warm start
    /// carries to the next round.
    pub(super) center: Vec<f64>,
    /// The best plan so far, with its value.
    pub(super) incumbent: Option<(f64, Plan)>,
    /// Tenants with a plan of their own on the empty GPU, in decreasing order of its value (ties by index).
    pub(super) solo_order: Vec<(usize, f64)>,
    /// The seeds' plans.
    pub(super) seed_plans: Vec<Plan>,
    /// Column-generation rounds (master LP solves).
    pub(super) rounds: usize,
    /// The last master LP's column values (empty before the first).
    pub(super) x_root: Vec<f64>,
    /// The last master LP's capacity duals, zero on the convexity rows (zero before the first).
    pub(super) duals: Vec<f64>,
}

impl State {
    /// Makes `plan` the incumbent where it is feasible and better.
    pub(super) fn consider(&mut self, cx: &Context, plan: Plan) {
        let v = cx.value_of(&plan);
        if v > f64::NEG_INFINITY && self.incumbent.as_ref().is_none_or(|(best, _)| v > *best) {
            self.incumbent = Some((v, plan));
        }
    }

    /// Whether the best plan is within the configured gap of the bound.
    pub(super) fn gap_closed(&self, cx: &Context) -> bool {
        within_gap(&self.incumbent, self.bound, cx.config.mip_rel_gap)
    }
}

/// Whether the best plan is within `gap` of `bound`.
fn within_gap(incumbent: &Option<(f64, Plan)>, bound: f64, gap: f64) -> bool {
    incumbent.as_ref().is_some_and(|(v, _)| relative_gap(*v, bound) <= gap)
}
