//! Pair moves: two tenants re-plan their inference together, by an exact dynamic programme over the pair's
//! profiles ([`pair_best`]), the move that lets one tenant shrink so that another grows; and the phase that
//! improves the best plan by them ([`improve`]).

use super::columns::{Column, Plan, RowIndex};
use super::pricing::{Pricer, ROOM_EPS};
use super::state::{Context, State};
use crate::level2::problem::GpuProblem;

/// One slot `t > 0` of the pair programme ([`pair_best_on`]) where room checks compare sizes (every catalogued
/// GPU): the same maximum per state as trying every previous state with every pre-initialisation, found by how
/// each tenant enters its state. A tenant with an instance keeps it (one previous state of its own) or switches to
/// it, cold or pre-initialised (from any other); a tenant with none gains nothing whatever it held. So a state is
/// entered with both instances kept from one previous state, with one kept from a row or column of them, and only
/// where neither is kept are all previous states searched: in decreasing order of value, until even the largest
/// gain of such a move cannot beat the best found. `O(states x (na + nb))` per slot instead of `O(states^2)`.
struct PairStep<'a> {
    pair: (&'a Pricer, &'a Pricer),
    /// Each tenant's goodput rows of the slot (in its accuracy regime).
    rows: (&'a [[f64; 3]], &'a [[f64; 3]]),
    /// The programme's values in the previous slot.
    prev: &'a [f64],
    /// Previous states that were reached and whose instances fit the room rows beside the retrainings.
    prev_ok: &'a [bool],
    /// Room rows left beside each previous state's instances and the retrainings (with [`ROOM_EPS`]).
    left: &'a [[f64; 3]],
}

impl PairStep<'_> {
    /// Fills `here` (each state's best value, `NEG_INFINITY` where it cannot be entered) and `from` (the previous
    /// state and the two pre-initialisations); `usage_ok(xa, xb)`: whether instances of the two profiles fit the
    /// slot's usage rows beside the retrainings; `order` is scratch.
    fn run(
        &self,
        usage_ok: impl Fn(usize, usize) -> bool,
        order: &mut Vec<usize>,
        here: &mut [f64],
        from: &mut [(usize, bool, bool)],
    ) {
        let (pa, pbr) = self.pair;
        let (na, nb) = (pa.usable.len() + 1, pbr.usable.len() + 1);
        let none = pa.np;
        let (prev, left) = (self.prev, self.left);
        order.clear();
        order.extend((0..na * nb).filter(|k| self.prev_ok[*k]));
        order.sort_by(|x, y| prev[*y].total_cmp(&prev[*x]).then(x.cmp(y)));
        let fits = |k: usize, p: usize, q: usize| (0..3).all(|j| pa.size[p][j] + pa.size[q][j] <= left[k][j]);
        // A tenant's gains entering state `s`: kept, switched cold, switched pre-initialised (only where that
        // earns more than cold); nothing for no instance.
        let gains = |rows: &[[f64; 3]], s: usize| -> (f64, f64, Option<f64>) {
            if s == 0 {
                (0.0, 0.0, None)
            } else {
                let r = &rows[s - 1];
                (r[0], r[2], (r[1] > r[2]).then_some(r[1]))
            }
        };
        for sa in 0..na {
            for sb in 0..nb {
                let at = sa * nb + sb;
                here[at] = f64::NEG_INFINITY;
                let (xa, xb) = (pa.state_profile[sa], pbr.state_profile[sb]);
                if !usage_ok(xa, xb) {
                    continue;
                }
                let (keep_a, cold_a, warm_a) = gains(self.rows.0, sa);
                let (keep_b, cold_b, warm_b) = gains(self.rows.1, sb);
                let mut best = (f64::NEG_INFINITY, (0, false, false));
                // The plain programme tries previous states in index order, each with its pre-initialisations in
                // the order none, `a`, `b`, both, and a move replaces the best so far where it earns more by
                // 1e-12. Here, among moves within 1e-12 of each other the first in that order wins: the same
                // choice, exact ties included (they are common), except on a chain of near-ties spanning more than
                // 1e-12, where the two rules can pick different moves of the same value to that tolerance.
                let offer = |best: &mut (f64, (usize, bool, bool)), v: f64, k: usize, pre_a: bool, pre_b: bool| {
                    let rank = |(k, a, b): (usize, bool, bool)| 4 * k + usize::from(a) + 2 * usize::from(b);
                    if v > best.0 + 1e-12 || (v >= best.0 - 1e-12 && rank((k, pre_a, pre_b)) < rank(best.1)) {
                        *best = (v, (k, pre_a, pre_b));
                    }
                };
                // A switching tenant's gain from previous state `k`: pre-initialised where it pays and fits beside
                // what `k` holds (and the other tenant's pre-initialised instance, if any), else cold.
                if sa > 0 {
                    // `a` keeps its instance: the previous states of row `sa`.
                    for kb in 0..nb {
                        let k = sa * nb + kb;
                        if !self.prev_ok[k] {
                            continue;
                        }
                        let base = prev[k] + keep_a;
                        if sb == 0 || kb == sb {
                            offer(&mut best, base + keep_b, k, false, false);
                        } else {
                            match warm_b.filter(|_| fits(k, none, xb)) {
                                Some(w) => offer(&mut best, base + w, k, false, true),
                                None => offer(&mut best, base + cold_b, k, false, false),
                            }
                        }
                    }
                }
                if sb > 0 {
                    // `b` keeps its instance: the previous states of column `sb` (those of row `sa` are done).
                    for ka in (0..na).filter(|ka| sa == 0 || *ka != sa) {
                        let k = ka * nb + sb;
                        if !self.prev_ok[k] {
                            continue;
                        }
                        if sa == 0 {
                            offer(&mut best, prev[k] + keep_b, k, false, false);
                        } else {
                            match warm_a.filter(|_| fits(k, xa, none)) {
                                Some(w) => offer(&mut best, prev[k] + w + keep_b, k, true, false),
                                None => offer(&mut best, prev[k] + cold_a + keep_b, k, false, false),
                            }
                        }
                    }
                }
                // Neither keeps: every other previous state, largest value first.
                let most = warm_a.map_or(cold_a, |w| w.max(cold_a)) + warm_b.map_or(cold_b, |w| w.max(cold_b));
                for &k in order.iter() {
                    let base = prev[k];
                    if base + most + 1e-9 * (1.0 + base.abs() + most.abs()) <= best.0 + 1e-12 {
                        break;
                    }
                    let (ka, kb) = (k / nb, k % nb);
                    if (sa > 0 && ka == sa) || (sb > 0 && kb == sb) {
                        continue;
                    }
                    // Gain order as in the plain programme's combinations: cold, a pre-initialised, b, both.
                    offer(&mut best, base + cold_a + cold_b, k, false, false);
                    if let Some(w) = warm_a.filter(|_| fits(k, xa, none)) {
                        offer(&mut best, base + w + cold_b, k, true, false);
                    }
                    if let Some(w) = warm_b.filter(|_| fits(k, none, xb)) {
                        offer(&mut best, base + cold_a + w, k, false, true);
                    }
                    if let (Some(wa), Some(wb)) = (warm_a, warm_b)
                        && fits(k, xa, xb)
                    {
                        offer(&mut best, base + wa + wb, k, true, true);
                    }
                }
                (here[at], from[at]) = best;
            }
        }
    }
}

/// Tenants `a` and `b` re-plan their inference together (exact dynamic programme over the pair's profiles), their
/// retraining options fixed as in `ca` and `cb`, in the room `rem` the other tenants leave. The move single-tenant
/// ascent cannot make: one tenant shrinks so that the other grows. Returns the pair's best columns.
fn pair_best(
    pb: &GpuProblem,
    l: &RowIndex,
    pa: &Pricer,
    pbr: &Pricer,
    ca: &Column,
    cb: &Column,
    rem: &[f64],
) -> Option<(Column, Column)> {
    pair_best_on(pb, l, (pa, pbr), (ca, cb), rem, true)
}

/// [`pair_best`], with or without its shortcuts (pre-initialisation only where it pays, and where room checks compare
/// sizes, each slot after the first entered by [`PairStep`]), which leave the result as it is (tested).
pub(super) fn pair_best_on(
    pb: &GpuProblem,
    l: &RowIndex,
    (pa, pbr): (&Pricer, &Pricer),
    (ca, cb): (&Column, &Column),
    rem: &[f64],
    shortcuts: bool,
) -> Option<(Column, Column)> {
    let none = pa.np;
    let (na, nb) = (pa.usable.len() + 1, pbr.usable.len() + 1);
    let prof = |pr: &Pricer, s: usize| pr.state_profile[s];
    let rt = |c: &Column, t: usize| c.retrain.filter(|o| o.active(t)).map_or(none, |o| o.profile);
    let regime = |c: &Column, t: usize| usize::from(c.retrain.is_some_and(|o| o.end <= t));
    let states = na * nb;
    let mut value = vec![f64::NEG_INFINITY; pb.slots * states];
    let mut from = vec![(0usize, false, false); pb.slots * states];
    // Gain of one tenant entering profile state `s` from profile `prev`, with or without pre-initialisation, from
    // its goodput rows of the slot.
    let gain = |pr: &Pricer, rows: &[[f64; 3]], s: usize, prev: usize, pre: bool| -> f64 {
        if s == 0 {
            return 0.0;
        }
        let row = &rows[s - 1];
        if prev == pr.usable[s - 1] {
            row[0]
        } else if pre {
            row[1]
        } else {
            row[2]
        }
    };
    // Per slot: which previous states were reached and still fit the room rows beside the retrainings, and (where
    // no profile has rows of its own, as on every catalogued GPU) the room rows they leave, so that a
    // pre-initialisation's check compares sizes (the rows hold small integers, so this is the same test).
    let mut prev_ok = vec![false; states];
    let mut left = vec![[0.0f64; 3]; states];
    // The previous states that can be left, with their two profiles (where the plain loop below runs).
    let mut open: Vec<(usize, usize, usize)> = Vec::with_capacity(states);
    let by_size = shortcuts && !l.any_own;
    let mut order: Vec<usize> = Vec::with_capacity(states);
    let size = |p: usize| pa.size[p];
    for t in 0..pb.slots {
        let (ra, rb) = (rt(ca, t), rt(cb, t));
        let (ra_prev, rb_prev) = if t > 0 { (rt(ca, t - 1), rt(cb, t - 1)) } else { (none, none) };
        let (ga, gb) = (regime(ca, t), regime(cb, t));
        let (rows_a, rows_b) = (pa.value.at(ga, t), pbr.value.at(gb, t));
        if t > 0 {
            for (k, ok) in prev_ok.iter_mut().enumerate() {
                let (held_a, held_b) = (prof(pa, k / nb), prof(pbr, k % nb));
                *ok = value[(t - 1) * states + k] > f64::NEG_INFINITY
                    && pa.room_for_all(l, rem, l.room(t), &[held_a, ra_prev, held_b, rb_prev]);
                if by_size {
                    let base = l.room(t);
                    left[k] = std::array::from_fn(|j| {
                        rem[base + j] + ROOM_EPS
                            - (size(held_a)[j] + size(ra_prev)[j] + size(held_b)[j] + size(rb_prev)[j])
                    });
                }
            }
            if by_size {
                let (done, rest) = value.split_at_mut(t * states);
                let step = PairStep {
                    pair: (pa, pbr),
                    rows: (rows_a, rows_b),
                    prev: &done[(t - 1) * states..],
                    prev_ok: &prev_ok,
                    left: &left,
                };
                let usage_ok = |xa: usize, xb: usize| pa.room_for_all(l, rem, l.usage(t), &[xa, ra, xb, rb]);
                step.run(usage_ok, &mut order, &mut rest[..states], &mut from[t * states..][..states]);
                continue;
            }
            open.clear();
            open.extend((0..states).filter(|k| prev_ok[*k]).map(|k| (k, prof(pa, k / nb), prof(pbr, k % nb))));
        } else {
            // Slot 0 has one previous state: what the tenants hold now.
            open.clear();
            open.push((0, none, none));
        }
        // Slot 0, and every slot of the plain programme (the tests' reference, and any GPU whose profiles have
        // rows of their own): every previous state with every pre-initialisation that can be made.
        for sa in 0..na {
            for sb in 0..nb {
                let (xa, xb) = (prof(pa, sa), prof(pbr, sb));
                if !pa.room_for_all(l, rem, l.usage(t), &[xa, ra, xb, rb]) {
                    continue;
                }
                let here = t * states + sa * nb + sb;
                // Pre-initialising a tenant's new instance can only win where it earns more than a cold start.
                let pre_pays = |rows: &[[f64; 3]], s: usize| s > 0 && rows[s - 1][1] > rows[s - 1][2];
                let (pays_a, pays_b) = (!shortcuts || pre_pays(rows_a, sa), !shortcuts || pre_pays(rows_b, sb));
                for &(k, held_a, held_b) in &open {
                    let (ps, base, prev_a, prev_b) = if t == 0 {
                        (usize::MAX, 0.0, pa.current.unwrap_or(none), pbr.current.unwrap_or(none))
                    } else {
                        (k, value[(t - 1) * states + k], held_a, held_b)
                    };
                    let new_a = xa != none && xa != prev_a;
                    let new_b = xb != none && xb != prev_b;
                    for (pre_a, pre_b) in [(false, false), (true, false), (false, true), (true, true)] {
                        if (pre_a && !(new_a && pays_a)) || (pre_b && !(new_b && pays_b)) {
                            continue;
                        }
                        if pre_a || pre_b {
                            let items = [
                                held_a,
                                ra_prev,
                                held_b,
                                rb_prev,
                                if pre_a { xa } else { none },
                                if pre_b { xb } else { none },
                            ];
                            if !pa.room_for_all(l, rem, l.room(t), &items) {
                                continue;
                            }
                        }
                        let v = base + gain(pa, rows_a, sa, prev_a, pre_a) + gain(pbr, rows_b, sb, prev_b, pre_b);
                        if v > value[here] + 1e-12 {
                            value[here] = v;
                            from[here] = (ps, pre_a, pre_b);
                        }
                    }
                }
            }
        }
    }
    let last = (pb.slots - 1) * states;
    let (mut s, _) = (0..states)
        .map(|s| (s, value[last + s]))
        .filter(|(_, v)| *v > f64::NEG_INFINITY)
        .max_by(|x, y| x.1.total_cmp(&y.1).then(y.0.cmp(&x.0)))?;
    let (mut inf_a, mut inf_b) = (vec![None; pb.slots], vec![None; pb.slots]);
    let (mut pre_a, mut pre_b) = (vec![false; pb.slots], vec![false; pb.slots]);
    for t in (0..pb.slots).rev() {
        let (sa, sb) = (s / nb, s % nb);
        inf_a[t] = (sa > 0).then(|| pa.usable[sa - 1]);
        inf_b[t] = (sb > 0).then(|| pbr.usable[sb - 1]);
        (s, pre_a[t], pre_b[t]) = from[t * states + s];
    }
    Some((pa.column(pb, inf_a, pre_a, ca.retrain), pbr.column(pb, inf_b, pre_b, cb.retrain)))
}

impl Context<'_> {
    /// Pair moves on `chosen`: each pair of tenants in turn takes the pair's best columns in the room the others
    /// leave, where they earn more than the two it has; whether any did.
    pub(super) fn pair_ascend(&self, chosen: &mut Plan) -> bool {
        let (pb, l, ncap) = (self.pb, &self.l, self.ncap);
        let mut improved = false;
        for a in 0..self.n {
            for bt in a + 1..self.n {
                let (Some(ca), Some(cb)) = (chosen[a].clone(), chosen[bt].clone()) else { continue };
                let mut rem = self.room_left(chosen, a);
                for &(r, v) in cb.rows(pb, l) {
                    if r < ncap {
                        rem[r] += v;
                    }
                }
                if let Some((na, nb)) = pair_best(pb, l, &self.pricers[a], &self.pricers[bt], &ca, &cb, &rem)
                    && na.value + nb.value > ca.value + cb.value + 1e-9 * (1.0 + (ca.value + cb.value).abs())
                {
                    chosen[a] = Some(na);
                    chosen[bt] = Some(nb);
                    improved = true;
                }
            }
        }
        improved
    }
}

/// Pair moves and full ascent on the best plan, while it improves and the gap is open (at most four times).
pub(super) fn improve(cx: &Context, st: &mut State) {
    for _ in 0..4 {
        if st.gap_closed(cx) {
            break;
        }
        let Some((before, best)) = st.incumbent.as_ref() else { break };
        let (before, mut trial) = (*before, best.clone());
        cx.pair_ascend(&mut trial);
        cx.ascend(&mut trial, None);
        st.consider(cx, trial);
        if st.incumbent.as_ref().is_none_or(|(v, _)| *v <= before) {
            break;
        }
    }
}
