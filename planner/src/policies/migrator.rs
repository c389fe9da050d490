//! `migrator`: the MIGRator goodput ILP (arXiv 2407.13126) as its paper describes it
//! (summarised in `docs/references.md`), one GPU at a time, with the tenants-to-GPU assignment given ([`crate::assign::given`]).
//!
//! Variables per slot: a binary per (task, placement) for each tenant's inference and retraining task; a binary
//! "done" per tenant; served requests. Constraints: placements used in a slot do not overlap on any memory or
//! compute slice; at most one placement per task per slot; the memory of the model fits the placement (only
//! fitting placements get a variable); retraining is non-preemptive (once started it keeps its placement until
//! done, and starts at most once); `done[i,t] <= progress before t / W_i`; a task whose placement changes loses the
//! dead time `R` of that slot (`served <= cap x (dt - R y)`). The objective is `sum acc x served`, with
//! `acc = a_old + (a_new - a_old) done` linearised as `z <= served`, `z <= M done`.
//!
//! `R` is the pre-initialised dead time: MIGRator pre-initialises target instances. Arrivals are the forecast
//! mean (MIGRator predicts arrivals about 200 s ahead; it has no band). The solve runs under the same time limit
//! and gap as every policy; a time-limited solve uses its incumbent, as MIGRator would have to.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use good_lp::{Constraint, Expression, ProblemVariables, Variable, variable};
use tessera_core::Placement;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::{Assignment, Role};

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::ilp::goodput_terms;
use crate::level2::problem::GpuProblem;
use crate::level2::realize::{Placed, from_assignments};
use crate::level2::solver::{SolveError, SolveStatus, SolverConfig, maximise};
use crate::policy::{GpuOutcome, PlanError, PlanOutcome, Policy, plan_fleet};

/// The MIGRator policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrator;

impl Policy for Migrator {
    fn name(&self) -> &'static str {
        "migrator"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let l1 = assign::given(input);
        plan_fleet(self.name(), input, l1, |gpu, tenants| level2(input, gpu, tenants))
    }
}

fn level2(input: &PlannerInput, gpu: &GpuId, tenants: &[TenantId]) -> Result<Option<GpuOutcome>, SolveError> {
    if tenants.is_empty() {
        return Ok(None);
    }
    let problem = gpu_problem(input, gpu, tenants, Arrivals::Point);
    let s = solve(&problem, &input.config.solver)?;
    Ok(Some(GpuOutcome::new(problem, s.placed, s.bound, s.status, "MIGRator placement ILP".into())))
}

/// A solved MIGRator ILP.
#[derive(Debug, Clone)]
pub struct MigratorSolution {
    /// The placed schedule.
    pub placed: Placed,
    /// The ILP's objective (its own accounting: dead time on every placement change).
    pub objective: f64,
    /// The solver's bound.
    pub bound: f64,
    /// How the solve ended.
    pub status: SolveStatus,
}

/// Solves the placement-level MIGRator ILP.
pub fn solve(pb: &GpuProblem, config: &SolverConfig) -> Result<MigratorSolution, SolveError> {
    let n = pb.tenants.len();
    let dt = pb.slot_s;
    let r_dead = pb.dead_preinit_s.min(dt);
    let placements: Vec<(Placement, usize)> = Placement::all_for(&pb.profiles)
        .into_iter()
        .filter(|p| pb.gpu.profile(p.profile).is_some())
        .map(|p| (p, pb.profile_index(p.profile).expect("from the problem's profiles")))
        .collect();
    let mut vars = ProblemVariables::new();
    let mut rows: Vec<Constraint> = Vec::new();
    let mut objective = Expression::from(0.0);
    // xi[i][q][t], xr[i][q][t]
    let mut xi: Vec<Vec<Vec<Option<Variable>>>> = vec![vec![vec![None; pb.slots]; placements.len()]; n];
    let mut xr: Vec<Vec<Vec<Option<Variable>>>> = vec![vec![vec![None; pb.slots]; placements.len()]; n];
    let mut done: Vec<Vec<Option<Variable>>> = vec![vec![None; pb.slots]; n];
    for (i, t) in pb.tenants.iter().enumerate() {
        for (q, (_, p)) in placements.iter().enumerate() {
            for slot in 0..pb.slots {
                if t.cap[*p] > 0.0 {
                    xi[i][q][slot] = Some(vars.add(variable().binary()));
                }
                if t.retrain.as_ref().is_some_and(|r| r.speed[*p] > 0.0) {
                    xr[i][q][slot] = Some(vars.add(variable().binary()));
                }
            }
        }
        if t.retrain.is_some() && t.acc_new > t.acc_old {
            for d in done[i].iter_mut() {
                *d = Some(vars.add(variable().binary()));
            }
        }
    }
    let each = |x: &Vec<Vec<Vec<Option<Variable>>>>, i: usize, slot: usize| -> Vec<(usize, Variable)> {
        (0..placements.len()).filter_map(|q| x[i][q][slot].map(|v| (q, v))).collect()
    };
    for slot in 0..pb.slots {
        // No slice used twice.
        for bit in 0..8u8 {
            for compute in [false, true] {
                let mut used = Expression::from(0.0);
                let mut any = false;
                for (q, (pl, _)) in placements.iter().enumerate() {
                    let mask = if compute { pl.compute_mask() } else { pl.memory_mask() };
                    if mask & (1 << bit) == 0 {
                        continue;
                    }
                    for i in 0..n {
                        for v in [xi[i][q][slot], xr[i][q][slot]].into_iter().flatten() {
                            used += v;
                            any = true;
                        }
                    }
                }
                if any {
                    rows.push(used.leq(1.0));
                }
            }
        }
        for i in 0..n {
            for x in [&xi, &xr] {
                let one: Expression = each(x, i, slot).into_iter().map(|(_, v)| Expression::from(v)).sum();
                rows.push(one.leq(1.0));
            }
        }
    }
    for (i, t) in pb.tenants.iter().enumerate() {
        // Retraining: progress, non-preemption, a single start.
        if let Some(r) = &t.retrain {
            let running = r.running_on.and_then(|pl| placements.iter().position(|(p, _)| *p == pl));
            let mut starts = Expression::from(0.0);
            for slot in 0..pb.slots {
                for (q, v) in each(&xr, i, slot) {
                    let before: Expression = if slot == 0 {
                        Expression::from(if running == Some(q) { 1.0 } else { 0.0 })
                    } else {
                        xr[i][q][slot - 1].map_or(Expression::from(0.0), Expression::from)
                    };
                    let st = vars.add(variable().min(0.0).max(1.0));
                    rows.push((Expression::from(v) - before.clone()).leq(st));
                    starts += st;
                    // Keep the placement until done.
                    let d: Expression = done[i][slot].map_or(Expression::from(0.0), Expression::from);
                    rows.push((before - d).leq(v));
                }
                if let Some(d) = done[i][slot] {
                    let progress: Expression =
                        (0..slot).flat_map(|s| each(&xr, i, s)).map(|(q, v)| v * (r.speed[placements[q].1] * dt)).sum();
                    rows.push((Expression::from(d) * r.work_s.max(1e-9)).leq(progress));
                }
            }
            rows.push(starts.leq(1.0));
        }
        // Inference: dead time on change, served, accuracy.
        let current = t.current_inference.and_then(|pl| placements.iter().position(|(p, _)| *p == pl));
        for slot in 0..pb.slots {
            let mut capacity = Expression::from(0.0);
            for (q, v) in each(&xi, i, slot) {
                let cap = t.cap[placements[q].1];
                capacity += v * (cap * dt);
                if r_dead > 0.0 {
                    let y = vars.add(variable().min(0.0).max(1.0));
                    let before: Expression = if slot == 0 {
                        Expression::from(if current == Some(q) { 1.0 } else { 0.0 })
                    } else {
                        xi[i][q][slot - 1].map_or(Expression::from(0.0), Expression::from)
                    };
                    rows.push((Expression::from(v) - before).leq(y));
                    capacity -= y * (cap * r_dead);
                }
            }
            let retrained = done[i][slot].map(Expression::from);
            goodput_terms(&mut vars, &mut rows, &mut objective, t, slot, dt, &capacity, retrained);
        }
    }
    let result = maximise(vars, objective, rows, config)?;
    let on = |v: Option<Variable>| v.is_some_and(|v| result.values.get(&v).copied().unwrap_or(0.0) > 0.5);
    let mut slots: Vec<Vec<Assignment>> = vec![Vec::new(); pb.slots];
    for (i, t) in pb.tenants.iter().enumerate() {
        let mut progress = 0.0;
        let work = t.retrain.as_ref().map_or(0.0, |r| r.work_s);
        for (slot, row) in slots.iter_mut().enumerate() {
            for (q, (pl, p)) in placements.iter().enumerate() {
                if on(xi[i][q][slot]) {
                    row.push(Assignment {
                        placement: *pl,
                        tenant: t.id.clone(),
                        role: Role::Inference,
                        preinit: false,
                    });
                }
                if on(xr[i][q][slot]) && progress < work - 1e-9 {
                    progress += t.retrain.as_ref().map_or(0.0, |r| r.speed[*p] * dt);
                    row.push(Assignment {
                        placement: *pl,
                        tenant: t.id.clone(),
                        role: Role::Retraining,
                        preinit: false,
                    });
                }
            }
        }
    }
    Ok(MigratorSolution {
        placed: from_assignments(pb, slots),
        objective: result.objective,
        bound: result.bound,
        status: result.status,
    })
}
