//! `migrator`: MIGRator's per-GPU goodput ILP (arXiv 2407.13126) as its paper describes it (summarised in
//! `docs/references.md`), solved to the same gap as tessera by the best solver the build has.
//!
//! **The model.** Slots of the planner's length over MIGRator's lookahead ([`LOOKAHEAD_S`], about 200 s: the paper
//! predicts arrivals that far ahead; the forecast's last slot is held beyond the round's horizon, which is what the
//! flat `last` and `ewma` forecasters predict there). Per slot, a placement per task (each tenant's inference and
//! retraining) that does not overlap any other on a memory or compute slice; the model fits the placement;
//! retraining is non-preemptive and completes when its work is done; a task whose instance changes loses the
//! pre-initialised dead time `R` of that slot (MIGRator pre-initialises target instances); served requests at most
//! the forecast mean (MIGRator has no band) and the SLO capacity of the instance, at the planner's target utilisation
//! like every policy. The objective is the horizon's goodput, `sum acc x served`, with `acc` the new model's accuracy
//! once the retraining is done.
//!
//! **The solver.** The placement-level ILP written exactly as above is [`solve`]; HiGHS cannot close it within any
//! budget a planning round has (on `replay plan --synthetic --gpus 1 --tenants 7 --slots 30 --seed 11` it stopped at
//! gap 0.93 after 10 s), and a wall-clock limit makes its plan depend on the machine's load. So level 2 solves the
//! same model in tessera's exact reformulation ([`crate::level2::ilp`], [`crate::level2::cg`]): profile counts
//! against maximal count vectors instead of per-slice overlap rows (every count vector inside a maximal one has a
//! placement, [`crate::level2::realize`]), retraining as enumerated non-preemptive options instead of big-M
//! progress, and reconfiguration charged closer to what the simulator charges (a changed tenant pays the
//! pre-initialised dead time where free slices leave room to pre-initialise its new instance; the ILP charges every
//! placement change the pre-initialised dead time). Column generation proves its gap, deterministically; a property
//! test checks on small problems that the reformulation's optimum is at least the ILP's plan evaluated as the
//! simulator charges it. What MIGRator does not have stays off: no forecast band, no accuracy credited beyond
//! the horizon, no warm start ([`Features::NONE`]).
//!
//! **Level 1.** MIGRator plans one GPU with its tenants given. Like every per-GPU policy it gets the fleet's level 1
//! that `--placement` names ([`assign::place`]; tessera's by default). Like every policy but the perfect-forecast
//! reference, it re-plans on bursts when the run asks for that (the paper re-solves on forecast errors).

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use good_lp::{Constraint, Expression, ProblemVariables, Variable, variable};
use tessera_core::Placement;
use tessera_core::plan::{Assignment, Role};

use crate::assign;
use crate::input::PlannerInput;
use crate::level2::build::Arrivals;
use crate::level2::goodput::{self, Features};
use crate::level2::ilp::goodput_terms;
use crate::level2::problem::GpuProblem;
use crate::level2::realize::{Placed, from_assignments};
use crate::level2::solver::{SolveError, SolveStatus, SolverConfig, maximise};
use crate::policy::{PlanError, PlanOutcome, Policy, plan_fleet_shared};

/// How far ahead MIGRator plans, seconds.
pub const LOOKAHEAD_S: f64 = 200.0;

/// The MIGRator policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Migrator;

/// `input` with the horizon stretched to [`LOOKAHEAD_S`] (never shortened).
pub fn lookahead(input: &PlannerInput) -> PlannerInput {
    let mut ahead = input.clone();
    let slots = (LOOKAHEAD_S / input.config.slot_s).ceil() as usize;
    ahead.config.horizon_slots = input.config.horizon_slots.max(slots);
    ahead
}

impl Policy for Migrator {
    fn name(&self) -> &'static str {
        "migrator"
    }

    fn plan(&self, input: &PlannerInput) -> Result<PlanOutcome, PlanError> {
        let ahead = lookahead(input);
        let l1 = assign::place(&ahead);
        plan_fleet_shared(self.name(), &ahead, l1, |gpu, tenants, shared| {
            goodput::solve_with(&ahead, gpu, tenants, Arrivals::Point, &ahead.config.solver, shared, Features::NONE)
        })
    }
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
