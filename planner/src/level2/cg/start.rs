//! The start: the first columns (each tenant's nothing and its best plan on the empty GPU), a first plan and the
//! seeds' plans in the first master, and the prices priced before it (a warm start's, or the per-slot
//! relaxation's).

use highs::{ColProblem, HighsModelStatus, Row, Sense};

use super::columns::{Columns, Plan, RowIndex};
use super::master::{Master, deterministic};
use super::pricing::Pricer;
use super::state::{Context, State};
use crate::level2::problem::{GpuProblem, Schedule};
use crate::level2::solver::SolverConfig;

/// The first columns, plans and master: each tenant's nothing and its best plan on the empty GPU; a first plan
/// (tenants by solo value take their best plan in the room the others leave) and the seeds' plans, which join the
/// master and are the first incumbents. The bound starts at the tenants' solo values, summed.
pub(super) fn first_plans(cx: &Context, seeds: &[Schedule], master_pivots: usize) -> State {
    let (pb, l, n, pricers, zero) = (cx.pb, &cx.l, cx.n, &cx.pricers, &cx.zero);
    // Start from "nothing" for every tenant, plus each tenant's best plan on an empty GPU.
    let mut columns = Columns::default();
    let mut solo_bound = 0.0;
    for i in 0..n {
        if pricers[i].choices.contains(&None) {
            columns.insert(pricers[i].column(pb, vec![None; pb.slots], vec![false; pb.slots], None));
        }
        let (col, solo) = pricers[i].price(pb, l, zero);
        solo_bound += solo;
        columns.insert(col);
    }
    // A feasible plan's columns in the first master, so that its LP starts from a plan rather than from nothing:
    // tenants in order of their solo value take their best plan in the room the others leave.
    let mut solo_order: Vec<(usize, f64)> =
        columns.iter().filter(|c| c.inference.iter().any(Option::is_some)).map(|c| (c.tenant, c.value)).collect();
    solo_order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut first_plan: Plan = vec![None; n];
    for &(i, _) in &solo_order {
        let rem = cx.room_left(&first_plan, i);
        first_plan[i] = pricers[i].price_within(pb, l, zero, Some(&rem)).map(|(c, _)| c);
    }
    // The seeds' plans (each tenant's row of a feasible schedule is a column; cold starts, which the rows always
    // admit) join it: a rule-based allocation shares the GPU where the greedy lets one tenant take it all.
    let seed_plans: Vec<Plan> = seeds
        .iter()
        .filter(|s| s.feasible(pb) && s.inference.len() == pb.slots)
        .map(|seed| {
            (0..n)
                .map(|i| {
                    let inference = (0..pb.slots).map(|t| seed.inference[t][i]).collect();
                    Some(pricers[i].column(pb, inference, vec![false; pb.slots], seed.retrain[i]))
                })
                .collect()
        })
        .collect();
    for c in first_plan.iter().chain(seed_plans.iter().flatten()).flatten() {
        columns.insert(c.clone());
    }
    let mut master = Master::new(pb, l, &cx.b, Some(master_pivots));
    for c in columns.iter() {
        master.add(pb, l, c);
    }
    let mut st = State {
        columns,
        master,
        bound: solo_bound,
        center: vec![0.0; cx.ncap],
        incumbent: None,
        solo_order,
        seed_plans,
        rounds: 0,
        x_root: Vec::new(),
        duals: zero.clone(),
    };
    st.consider(cx, first_plan);
    for plan in st.seed_plans.clone() {
        st.consider(cx, plan);
    }
    st
}

/// Start prices, before the first master: a warm start's `prices`, or without them (or with prices of the wrong
/// shape) the per-slot relaxation's ([`slot_prices`]). Their columns join the master, and where their Lagrangian
/// bound is the best so far it becomes the bound and they the stabilisation centre.
pub(super) fn price_start(cx: &Context, st: &mut State, prices: Option<&[Vec<f64>]>) {
    let (pb, l) = (cx.pb, &cx.l);
    // (A warm start does not price the relaxation as well: measured on 20 minutes of the Azure Functions 2019 day
    // on 100 GPUs, that made rounds slower and lost 0.3-1.7 % of goodput on each of six seeds, its tighter bounds
    // ending solves sooner on worse plans.)
    let start: Option<Vec<f64>> = prices
        .filter(|p| p.len() == pb.slots && p.iter().all(|s| s.len() == 2 * l.k && s.iter().all(|v| v.is_finite())))
        .map(|p| p.iter().flatten().map(|v| v.max(0.0)).collect())
        .or_else(|| slot_prices(pb, l, &cx.pricers, &cx.b, cx.config));
    if let Some(w) = start {
        let (lagrangian, priced) = cx.lagrangian_at(&w);
        for col in priced {
            if st.columns.insert(col) {
                st.master.add(pb, l, st.columns.last());
            }
        }
        if lagrangian < st.bound {
            st.bound = lagrangian;
            st.center = w;
        }
    }
}

/// Capacity prices for a cold start: the duals of the usage rows (compute slices, memory slices, instances) of the
/// per-slot relaxation, in which every slot is planned on its own and each tenant serves it on a fractional mix of
/// the profiles it can use, at its current accuracy, with no reconfiguration; a retraining under way keeps its
/// instance, and other retraining is left out. Any prices give a valid Lagrangian bound; these make a good one at
/// once, where smoothing from zero prices takes the bound a dozen rounds to reach it: on the benchmark's GPUs
/// (one LP of a few milliseconds) the first bound is within 0.1 % of the one column generation ends on, and cold
/// 7-tenant, 30-slot solves take about half the time. Rows a profile has of its own are priced at zero. `None`
/// where HiGHS does not find the relaxation's optimum (a cold start then starts from zero prices, as before).
fn slot_prices(
    pb: &GpuProblem,
    l: &RowIndex,
    pricers: &[Pricer],
    b: &[f64],
    config: &SolverConfig,
) -> Option<Vec<f64>> {
    // Room left in each slot's usage rows once the retraining under way is placed.
    let mut room: Vec<[f64; 3]> = (0..pb.slots).map(|t| std::array::from_fn(|j| b[l.usage(t) + j])).collect();
    for pr in pricers.iter().filter(|pr| !pr.choices.contains(&None)) {
        if let [Some(o)] = pr.choices[..] {
            for t in (o.start..o.end).take_while(|t| *t < pb.slots) {
                (0..3).for_each(|j| room[t][j] -= pr.size[o.profile][j]);
            }
        }
    }
    let mut problem = ColProblem::new();
    let usage: Vec<Row> = room.iter().flat_map(|r| r.map(|v| problem.add_row(..=v.max(0.0)))).collect();
    for t in 0..pb.slots {
        for pr in pricers {
            let one = problem.add_row(..=1.0);
            for (k, &p) in pr.usable.iter().enumerate() {
                let s = &pr.size[p];
                let entries = [(usage[3 * t], s[0]), (usage[3 * t + 1], s[1]), (usage[3 * t + 2], s[2]), (one, 1.0)];
                problem.add_column(pr.value.at(0, t)[k][0], 0.0.., entries);
            }
        }
    }
    let mut model = problem.optimise(Sense::Maximise);
    deterministic(&mut model, config.time_limit_s);
    // Dual simplex without presolve (measured: the fastest, and its duals centre better than primal simplex's on
    // this degenerate LP: 62 against 108 ms on the 7 x 30 benchmark GPU).
    model.set_option("presolve", "off");
    model.set_option("simplex_strategy", 1);
    let solved = model.try_solve().ok()?;
    if solved.status() != HighsModelStatus::Optimal {
        return None;
    }
    let duals = solved.get_solution().dual_rows()[..3 * pb.slots].to_vec();
    let mut w = vec![0.0; l.convex(0)];
    for t in 0..pb.slots {
        for j in 0..3 {
            w[l.usage(t) + j] = duals[3 * t + j].max(0.0);
        }
    }
    Some(w)
}
