//! Unit tests of column generation: the master's HiGHS fallback, pricing, the fit table, columns' values, pair
//! moves and room masks.

use std::path::Path;

use tessera_core::catalog::GpuModel;
use tessera_core::ids::TenantId;
use tessera_core::layout::Placement;

use super::columns::{Column, RowIndex};
use super::pair_moves::pair_best_on;
use super::pricing::{Pricer, pre_fits};
use crate::PlannerConfig;
use crate::level2::build::{Arrivals, gpu_problem};
use crate::level2::problem::GpuProblem;
use crate::level2::solver::{SolveStatus, SolverConfig};
use crate::synthetic::{SyntheticSpec, input};

/// A uniform draw in `[0, 1)` per call (xorshift64 from `seed`), for randomised checks.
fn uniform_from(mut rng: u64) -> impl FnMut() -> f64 {
    move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A synthetic GPU's level-2 problem (the shipped model profiles), as the benchmark builds it.
fn synthetic_gpu(tenants: usize, slots: usize, gpu_model: GpuModel, seed: u64) -> GpuProblem {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    let models = tessera_core::config::load_model_dir(&dir).expect("shipped model profiles load");
    let spec = SyntheticSpec { gpus: 1, tenants, slots, gpu_model, seed };
    let inp = input(&spec, &models, PlannerConfig::default());
    let gpu = inp.gpus.keys().next().expect("one GPU").clone();
    let ids: Vec<TenantId> = inp.tenants.keys().cloned().collect();
    gpu_problem(&inp, &gpu, &ids, Arrivals::Band)
}

/// Where the dense simplex gives up (here: a budget of 30 pivots a solve, exhausted in the first rounds), HiGHS
/// takes the master over and column generation goes on: on 7 x 30 benchmark GPUs the plan is as good as with
/// the dense simplex throughout, within the gap, and both prove it.
#[test]
fn highs_takes_the_master_over_where_the_simplex_gives_up() {
    for seed in 1..=3 {
        let pb = synthetic_gpu(7, 30, GpuModel::A100_40GB, seed);
        let config = SolverConfig::default();
        let own = super::solve_warm_on(&pb, &config, &[], None, super::MASTER_PIVOTS).expect("solves").solved;
        let fallback = super::solve_warm_on(&pb, &config, &[], None, 30).expect("solves").solved;
        for s in [&own, &fallback] {
            assert!(s.schedule.feasible(&pb));
            assert!(s.bound >= s.objective * (1.0 - 1e-9), "seed {seed}: bound {} < {}", s.bound, s.objective);
            assert_ne!(s.status, SolveStatus::Budget, "seed {seed}: {} under {}", s.objective, s.bound);
        }
        let gap = config.mip_rel_gap;
        assert!(
            fallback.objective >= own.objective * (1.0 - gap),
            "seed {seed}: {} vs {}",
            fallback.objective,
            own.objective
        );
        assert!(
            own.objective >= fallback.objective * (1.0 - gap),
            "seed {seed}: {} vs {}",
            own.objective,
            fallback.objective
        );
    }
}

/// A master LP stopped by the wall-clock limit (a machine starved of CPU) ends column generation, not the
/// solve: the GPU still gets a feasible plan, reported as a budget stop under a bound at least its value.
#[test]
fn a_master_lp_out_of_time_still_gives_a_plan() {
    let pb = synthetic_gpu(7, 30, GpuModel::A100_40GB, 1);
    let config = SolverConfig { time_limit_s: 1e-9, ..SolverConfig::default() };
    // The dense simplex has no clock: with no pivots it gives up at once and HiGHS, out of time, takes over.
    let s = super::solve_warm_on(&pb, &config, &[], None, 0).expect("a plan despite the time limit").solved;
    assert!(s.schedule.feasible(&pb));
    assert!(s.objective > 0.0 && s.bound >= s.objective, "objective {} bound {}", s.objective, s.bound);
    assert_eq!(s.status, SolveStatus::Budget);
}

/// Pricing all of a tenant's retraining choices at once (options that end before the horizon share one
/// backward programme over the slots after their end) finds, for each choice, the column and reduced cost
/// that pricing that choice alone (one forward programme over the whole horizon) finds; and each column's
/// reduced cost, recomputed from its goodput and rows, is the one reported. Over random prices, with and
/// without room limits.
#[test]
fn the_shared_suffix_prices_every_retraining_choice_as_its_own_programme() {
    let mut uniform = uniform_from(0x2545_f491_4f6c_dd1du64);
    let mut shared = 0;
    for (tenants, slots, gpu_model, seed) in
        [(3, 12, GpuModel::A100_40GB, 1), (7, 12, GpuModel::H100_80GB, 2), (5, 30, GpuModel::A100_40GB, 3)]
    {
        let pb = synthetic_gpu(tenants, slots, gpu_model, seed);
        let l = RowIndex::new(&pb);
        let ncap = l.convex(0);
        let fit = Pricer::fit_table(&pb);
        for i in 0..tenants {
            let pricer = Pricer::new(&pb, i, fit.clone());
            shared += usize::from(pricer.choices.iter().flatten().filter(|o| o.end < slots).count() >= 2);
            for trial in 0..6 {
                let scale = pb.tenants[i].weight * [0.0, 1.0, 30.0][trial % 3];
                let mut y: Vec<f64> = (0..ncap).map(|_| scale * uniform() * uniform()).collect();
                y.extend(std::iter::repeat_n(0.0, tenants));
                let rem: Vec<f64> = (0..ncap).map(|r| (8.0 * uniform()).floor() - f64::from(r % 7 == 0)).collect();
                let rem = (trial >= 3).then_some(&rem[..]);
                let all = pricer.price_choices(&pb, &l, &y, rem, pricer.choices.len(), &pricer.choices);
                // Fewer kept: the same best values (choices that cannot reach them are skipped unpriced).
                for keep in 1..=3 {
                    let top = pricer.price_choices(&pb, &l, &y, rem, keep, &pricer.choices);
                    assert_eq!(top.len(), all.len().min(keep), "tenant {i}, keep {keep}");
                    for ((_, a), (_, b)) in top.iter().zip(&all) {
                        assert!((a - b).abs() <= 1e-9 * (1.0 + b.abs()), "tenant {i}, keep {keep}: {a} against {b}");
                    }
                }
                for o in &pricer.choices {
                    let alone = pricer.price_choices(&pb, &l, &y, rem, 1, &[*o]).into_iter().next();
                    let together = all.iter().find(|(c, _)| c.retrain == *o);
                    match (alone, together) {
                        (None, None) => {}
                        (Some((_, a)), Some((c, b))) => {
                            let tol = 1e-9 * (1.0 + a.abs());
                            assert!((a - b).abs() <= tol, "tenant {i}, {o:?}: alone {a}, together {b}");
                            let rc = c.value
                                - c.rows(&pb, &l)
                                    .iter()
                                    .map(|(r, v)| if *r < ncap { y[*r] * v } else { 0.0 })
                                    .sum::<f64>();
                            assert!((rc - b).abs() <= tol, "tenant {i}, {o:?}: recomputed {rc}, reported {b}");
                            if let Some(rem) = rem {
                                assert!(c.rows(&pb, &l).iter().all(|(r, v)| *r >= ncap || *v <= rem[*r] + 1e-9));
                            }
                        }
                        (a, b) => {
                            panic!("tenant {i}, {o:?}: alone {:?}, together {:?}", a.map(|x| x.1), b.map(|x| x.1))
                        }
                    }
                }
            }
        }
    }
    assert!(shared > 0, "some tenants have several options that end before the horizon");
}

/// Whether three instances fit together does not depend on their order, as the pricing programme's row reads
/// of the fit table assume.
#[test]
fn the_fit_table_reads_the_same_in_any_order() {
    // The pricing programme reads `fits(q, rt, p)` for every `q` as the row `fit_row(p, rt)`.
    for gpu_model in [GpuModel::A100_40GB, GpuModel::H100_80GB] {
        let pb = synthetic_gpu(2, 4, gpu_model, 1);
        let pricer = Pricer::new(&pb, 0, Pricer::fit_table(&pb));
        let m = pb.profiles.len() + 1;
        let (mut fit, mut unfit) = (0, 0);
        for a in 0..m {
            for b in 0..m {
                for c in 0..m {
                    let f = pricer.fits(a, b, c);
                    assert_eq!(pricer.fit_row(c, b)[a], f, "{gpu_model:?}: {a} {b} {c}");
                    for (x, y, z) in [(a, c, b), (b, a, c), (b, c, a), (c, a, b)] {
                        assert_eq!(pricer.fits(x, y, z), f, "{gpu_model:?}: {a} {b} {c}");
                    }
                    if f {
                        fit += 1;
                    } else {
                        unfit += 1;
                    }
                }
            }
        }
        assert!(fit > 0 && unfit > 0, "{fit} triples fit, {unfit} do not");
    }
}

/// A column's value computed slot by slot from the problem: its goodput, plus its retraining's tail value.
fn column_value(pb: &GpuProblem, c: &Column) -> f64 {
    let t_ = &pb.tenants[c.tenant];
    let mut prev = t_.current_inference.and_then(|pl| pb.profile_index(pl.profile));
    let mut v = pb.tail_value(c.tenant, c.retrain);
    for t in 0..pb.slots {
        let acc = if c.retrain.is_some_and(|o| o.end <= t) { t_.acc_new } else { t_.acc_old };
        if let Some(p) = c.inference[t] {
            let dead = if prev == Some(p) {
                0.0
            } else if c.pre[t] {
                pb.dead_preinit_s
            } else {
                pb.dead_cold_s
            };
            v += pb.tenant_value(c.tenant, t, p, dead, acc);
        }
        prev = c.inference[t];
    }
    v
}

/// A column built by a pricer takes its value from the pricer's goodput table: the same bits as computing each
/// slot's goodput directly, for any profiles, pre-initialisations and retraining choice.
#[test]
fn a_pricers_columns_have_the_value_column_value_computes() {
    let mut uniform = uniform_from(0x2545_f491_4f6c_dd1du64);
    let (mut checked, mut unusable, mut retraining) = (0, 0, 0);
    for (tenants, slots, gpu_model, seed) in [(3, 8, GpuModel::A100_40GB, 1), (4, 12, GpuModel::H100_80GB, 2)] {
        let mut pb = synthetic_gpu(tenants, slots, gpu_model, seed);
        let np = pb.profiles.len();
        // Some tenants hold an instance now (keeping it has no dead time).
        for (i, t) in pb.tenants.iter_mut().enumerate() {
            t.current_inference = (i % 2 == 0).then(|| Placement::new(pb.profiles[i % np], 0));
        }
        let fit = Pricer::fit_table(&pb);
        for i in 0..tenants {
            let pricer = Pricer::new(&pb, i, fit.clone());
            for _ in 0..40 {
                // Any profile in any slot, usable or not, pre-initialised or not, with any retraining choice.
                let inference: Vec<Option<usize>> =
                    (0..slots).map(|_| (uniform() < 0.8).then(|| (uniform() * np as f64) as usize % np)).collect();
                let pre: Vec<bool> = (0..slots).map(|_| uniform() < 0.3).collect();
                let o = pricer.choices[(uniform() * pricer.choices.len() as f64) as usize % pricer.choices.len()];
                unusable += usize::from(inference.iter().flatten().any(|p| pricer.usable_index[*p].is_none()));
                retraining += usize::from(o.is_some());
                let column = pricer.column(&pb, inference, pre, o);
                let computed = column_value(&pb, &column);
                assert_eq!(column.value.to_bits(), computed.to_bits(), "tenant {i}, {column:?}");
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 7 * 40);
    assert!(unusable > 0 && retraining > 0, "{unusable} with unusable profiles, {retraining} retraining");
}

/// Pair moves with their shortcuts (pre-initialisation only where it pays, each slot's states entered by how
/// each tenant enters its own: [`PairStep`]) find the very columns the plain programme finds, for random
/// retraining choices, rooms and GPUs. The synthetic tenants often earn the same on two profiles, so moves tie
/// exactly and the tie-break is tested too (breaking ties by a different order of previous states fails it).
#[test]
fn pair_moves_with_shortcuts_find_what_the_plain_programme_finds() {
    let mut uniform = uniform_from(0x9e37_79b9_7f4a_7c15u64);
    let (mut found, mut pre) = (0, 0);
    for (tenants, slots, gpu_model, seed) in [
        (3, 8, GpuModel::A100_40GB, 1),
        (4, 8, GpuModel::H100_80GB, 2),
        (3, 12, GpuModel::H100_80GB, 3),
        (3, 12, GpuModel::A100_40GB, 4),
        (4, 6, GpuModel::H100_80GB, 5),
        (2, 12, GpuModel::H100_80GB, 6),
    ] {
        let pb = synthetic_gpu(tenants, slots, gpu_model, seed);
        let l = RowIndex::new(&pb);
        let ncap = l.convex(0);
        let fit = Pricer::fit_table(&pb);
        let pricers: Vec<Pricer> = (0..tenants).map(|i| Pricer::new(&pb, i, fit.clone())).collect();
        for trial in 0..8 {
            // Each tenant's column: its best at random prices, with a random one of its retraining choices.
            let mut y: Vec<f64> = (0..ncap).map(|_| pb.tenants[0].weight * 10.0 * uniform()).collect();
            y.extend(std::iter::repeat_n(0.0, tenants));
            let columns: Vec<_> = pricers
                .iter()
                .map(|p| {
                    let all = p.price_choices(&pb, &l, &y, None, p.choices.len(), &p.choices);
                    all[(uniform() * all.len() as f64) as usize % all.len()].0.clone()
                })
                .collect();
            // Room the others leave: a whole GPU, or random and sometimes exceeded.
            let rem: Vec<f64> = (0..ncap)
                .map(|r| if trial % 2 == 0 { [7.0, 8.0, 7.0][r % 3] } else { (9.0 * uniform()).floor() - 1.0 })
                .collect();
            for a in 0..tenants {
                for b in a + 1..tenants {
                    let (pair, cols) = ((&pricers[a], &pricers[b]), (&columns[a], &columns[b]));
                    let fast = pair_best_on(&pb, &l, pair, cols, &rem, true);
                    let plain = pair_best_on(&pb, &l, pair, cols, &rem, false);
                    assert_eq!(fast, plain, "{gpu_model:?}, trial {trial}, tenants {a} and {b}");
                    if let Some((ca, cb)) = fast {
                        found += 1;
                        pre += usize::from(ca.pre.iter().chain(&cb.pre).any(|p| *p));
                    }
                }
            }
        }
    }
    assert!(found > 20 && pre > 0, "{found} pair plans, {pre} with a pre-initialisation");
}

/// The room masks by size (what pricing uses on catalogued GPUs) equal those by a room check per entry, for
/// every slot, retraining profile and room left, tight or exceeded.
#[test]
fn room_masks_by_size_match_the_room_checks() {
    for gpu_model in [GpuModel::A100_40GB, GpuModel::H100_80GB] {
        let pb = synthetic_gpu(3, 4, gpu_model, 3);
        let l = RowIndex::new(&pb);
        assert!(!l.any_own, "catalogued GPUs have no per-profile rows");
        let pricer = Pricer::new(&pb, 0, Pricer::fit_table(&pb));
        let m = pricer.np + 1;
        for pattern in 0..9 {
            // Room left in each row, from exceeded (-1) to a whole GPU (8).
            let rem: Vec<f64> = (0..l.convex(0)).map(|r| ((r * 5 + pattern * 3) % 10) as f64 - 1.0).collect();
            for t in 0..pb.slots {
                for rt in 0..m {
                    let mut by_size = (vec![false; m], vec![false; m], vec![false; m * m]);
                    let mut checked = by_size.clone();
                    let left = pricer
                        .room_masks(&l, &rem, t, rt, true, (&mut by_size.0, &mut by_size.1, &mut []))
                        .expect("by size, the room left comes back");
                    for (at, pre) in by_size.2.iter_mut().enumerate() {
                        *pre = pre_fits(&left, &pricer.size, at / m, at % m);
                    }
                    let none =
                        pricer.room_masks(&l, &rem, t, rt, false, (&mut checked.0, &mut checked.1, &mut checked.2));
                    assert_eq!(none, None, "room checks fill the table");
                    assert_eq!(by_size, checked, "{gpu_model:?}, slot {t}, retraining {rt}, room {rem:?}");
                }
            }
        }
    }
}
