//! Level 2, Tessera's formulation: the goodput MILP over profile counts.
//!
//! The naive model (a binary per task, placement and slot, overlap rows per memory and compute slice, a big-M
//! progress row per retraining) has a weak relaxation and many symmetric optima: seven identical 1g placements,
//! progress that can be spread fractionally. This one removes both sources of weakness:
//!
//! - **Profiles, not placements.** `u[i,p,t]` says tenant `i` serves on a profile-`p` instance in slot `t`. On
//!   every catalogued GPU a count vector fits a valid layout exactly when it uses at most 7 compute slices, 8 memory
//!   slices and 7 instances, each profile within its maximum count ([`GpuProblem::fits`], checked against the
//!   enumeration by a test): four linear rows per slot, no layout variables, no symmetric placements. Placements
//!   are chosen afterwards by [`crate::level2::realize`], which keeps instances in place and checks that a running
//!   retraining can stay put.
//! - **Retraining as options.** `r[i,o]` picks one `(profile, start)` option per tenant; the option's end follows
//!   from the work, so non-preemption is built in and "done by slot t" is the linear sum of the options ending by
//!   `t`.
//! - **Dead time** only for tenants whose profile changes: `c[i,p,t] >= u[i,p,t] - u[i,p,t-1]`, charged
//!   `dead_cold_s`, less `dead_cold_s - dead_preinit_s` for each new instance the binary `pre[i,p,t]` marks as
//!   pre-initialised; the marked instances must fit beside everything the previous slot runs (the same four rows,
//!   on the previous slot's counts plus the marked ones): make-before-break, decided by the solver.
//! - **Accuracy x served** linearised exactly: `w <= s`, `w <= arrivals x done`.
//! - **Forecast band**: one served variable per arrival scenario (low, mean, high), so the plan maximises expected
//!   goodput over the band rather than over a point.
//! - A compute-slice knapsack row per slot (implied, but it tightens the relaxation).
//!
//! The objective is exactly [`Schedule::objective`]: the solvers' value and the schedule's evaluation agree.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use good_lp::{Constraint, Expression, ProblemVariables, Variable, variable};

use crate::level2::problem::{GpuProblem, RetrainOption, Schedule, TenantTask, Usage};
use crate::level2::solver::{MilpResult, SolveError, SolverConfig, maximise};

/// Adds tenant `t`'s goodput in `slot` to `objective`: per arrival scenario, requests served (at most the arrivals
/// and at most `capacity`) at the old accuracy, plus the accuracy gain on the requests served after the retraining
/// is `done` (a 0/1 expression), linearised as `w <= served`, `w <= arrivals x done`. Shared by both MILPs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn goodput_terms(
    vars: &mut ProblemVariables,
    rows: &mut Vec<Constraint>,
    objective: &mut Expression,
    t: &TenantTask,
    slot: usize,
    dt: f64,
    capacity: &Expression,
    done: Option<Expression>,
) {
    for s in &t.scenarios {
        let arrivals = s.rate.get(slot).copied().unwrap_or(0.0) * dt;
        if arrivals <= 0.0 || s.prob <= 0.0 {
            continue;
        }
        let served = vars.add(variable().min(0.0).max(arrivals));
        rows.push(Expression::from(served).leq(capacity.clone()));
        *objective += served * (t.weight * s.prob * t.acc_old);
        if let Some(done) = &done {
            let w = vars.add(variable().min(0.0));
            rows.push(Expression::from(w).leq(served));
            rows.push(Expression::from(w).leq(done.clone() * arrivals));
            *objective += w * (t.weight * s.prob * (t.acc_new - t.acc_old));
        }
    }
}

/// A solved level-2 problem.
#[derive(Debug, Clone)]
pub struct Solved {
    /// The schedule.
    pub schedule: Schedule,
    /// Its objective.
    pub objective: f64,
    /// Best proven bound on the objective.
    pub bound: f64,
    /// Solver outcome.
    pub status: crate::level2::solver::SolveStatus,
}

/// Solves `pb` with the count-level formulation.
pub fn solve(pb: &GpuProblem, config: &SolverConfig) -> Result<Solved, SolveError> {
    let n = pb.tenants.len();
    let np = pb.profiles.len();
    let dt = pb.slot_s;
    let cold = pb.dead_cold_s.min(dt);
    let warm = pb.dead_preinit_s.min(cold);
    let mut vars = ProblemVariables::new();
    let mut rows: Vec<Constraint> = Vec::new();
    let mut objective = Expression::from(0.0);

    // u[i][p][t]
    let mut u: Vec<Vec<Vec<Option<Variable>>>> = vec![vec![vec![None; pb.slots]; np]; n];
    for (i, t) in pb.tenants.iter().enumerate() {
        for p in 0..np {
            if t.cap[p] > 0.0 {
                for slot in 0..pb.slots {
                    u[i][p][slot] = Some(vars.add(variable().binary()));
                }
            }
        }
    }
    // r[i][o]
    let options: Vec<Vec<RetrainOption>> = (0..n).map(|i| pb.retrain_options(i)).collect();
    let r: Vec<Vec<Variable>> =
        options.iter().map(|os| os.iter().map(|_| vars.add(variable().binary())).collect()).collect();

    for (i, t) in pb.tenants.iter().enumerate() {
        for slot in 0..pb.slots {
            let one: Expression = (0..np).filter_map(|p| u[i][p][slot]).map(Expression::from).sum();
            rows.push(one.leq(1.0));
        }
        if !r[i].is_empty() {
            let pick: Expression = r[i].iter().copied().map(Expression::from).sum();
            let forced = t.retrain.as_ref().is_some_and(|x| x.running_on.is_some());
            rows.push(if forced { pick.eq(1.0) } else { pick.leq(1.0) });
        }
        for (k, o) in options[i].iter().enumerate() {
            objective += r[i][k] * pb.tail_value(i, Some(*o));
        }
    }

    // Instances of each profile per slot (inference and retraining).
    let count: Vec<Vec<Expression>> = (0..pb.slots)
        .map(|slot| {
            (0..np)
                .map(|p| {
                    let mut used = Expression::from(0.0);
                    for i in 0..n {
                        if let Some(v) = u[i][p][slot] {
                            used += v;
                        }
                        for (o, opt) in options[i].iter().enumerate() {
                            if opt.profile == p && opt.active(slot) {
                                used += r[i][o];
                            }
                        }
                    }
                    used
                })
                .collect()
        })
        .collect();
    let fits_rows = |rows: &mut Vec<Constraint>, counts: &[Expression], base: &Usage| {
        let mut compute = Expression::from(f64::from(base.compute));
        let mut memory = Expression::from(f64::from(base.memory));
        let mut instances = Expression::from(f64::from(base.instances));
        for (p, c) in counts.iter().enumerate() {
            compute += c.clone() * f64::from(pb.compute_slices(p));
            memory += c.clone() * f64::from(pb.memory_slices(p));
            instances += c.clone();
            rows.push((c.clone() + f64::from(base.counts[p])).leq(f64::from(pb.max_count(p))));
        }
        rows.push(compute.leq(7.0));
        rows.push(memory.leq(8.0));
        rows.push(instances.leq(7.0));
    };
    let nothing = Usage { compute: 0, memory: 0, instances: 0, counts: vec![0; np] };
    for counts in &count {
        fits_rows(&mut rows, counts, &nothing);
    }

    // Dead time: c >= u - u_prev; pre-initialised instances fit beside the previous slot.
    let current_usage = pb.current_usage();
    let mut charge: Vec<Vec<Expression>> = vec![vec![Expression::from(0.0); pb.slots]; n];
    if cold > 0.0 {
        for slot in 0..pb.slots {
            let mut marked: Vec<Expression> = vec![Expression::from(0.0); np];
            for (i, t) in pb.tenants.iter().enumerate() {
                let current = t.current_inference.and_then(|pl| pb.profile_index(pl.profile));
                for p in 0..np {
                    let Some(v) = u[i][p][slot] else { continue };
                    let before: Expression = if slot == 0 {
                        Expression::from(if current == Some(p) { 1.0 } else { 0.0 })
                    } else {
                        Expression::from(u[i][p][slot - 1].expect("same profile set every slot"))
                    };
                    let c = vars.add(variable().min(0.0).max(1.0));
                    rows.push((Expression::from(v) - before).leq(c));
                    charge[i][slot] += c * (t.cap[p] * cold);
                    if warm < cold {
                        let pre = vars.add(variable().binary());
                        rows.push(Expression::from(pre).leq(c));
                        rows.push(Expression::from(pre).leq(v));
                        charge[i][slot] -= pre * (t.cap[p] * (cold - warm));
                        marked[p] += pre;
                    }
                }
            }
            if warm < cold {
                if slot == 0 {
                    fits_rows(&mut rows, &marked, &current_usage);
                } else {
                    let beside: Vec<Expression> =
                        (0..np).map(|p| marked[p].clone() + count[slot - 1][p].clone()).collect();
                    fits_rows(&mut rows, &beside, &nothing);
                }
            }
        }
    }

    // Served requests and accuracy.
    for (i, t) in pb.tenants.iter().enumerate() {
        for slot in 0..pb.slots {
            let mut capacity = Expression::from(0.0);
            for p in 0..np {
                if let Some(v) = u[i][p][slot] {
                    capacity += v * (t.cap[p] * dt);
                }
            }
            capacity -= charge[i][slot].clone();
            let done: Expression = options[i]
                .iter()
                .enumerate()
                .filter(|(_, o)| o.end <= slot)
                .map(|(k, _)| Expression::from(r[i][k]))
                .sum();
            let retrained = (t.acc_new > t.acc_old && options[i].iter().any(|o| o.end <= slot)).then_some(done);
            goodput_terms(&mut vars, &mut rows, &mut objective, t, slot, dt, &capacity, retrained);
        }
    }

    let result: MilpResult = maximise(vars, objective, rows, config)?;
    let on = |v: &Variable| result.values.get(v).copied().unwrap_or(0.0) > 0.5;
    let mut schedule = Schedule::empty(pb.slots, n);
    for i in 0..n {
        for slot in 0..pb.slots {
            schedule.inference[slot][i] = (0..np).find(|p| u[i][*p][slot].as_ref().is_some_and(on));
        }
        schedule.retrain[i] = r[i].iter().position(on).map(|k| options[i][k]);
    }
    let objective = schedule.objective(pb);
    Ok(Solved { schedule, objective, bound: result.bound.max(objective), status: result.status })
}
