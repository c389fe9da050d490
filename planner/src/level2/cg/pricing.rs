//! Pricing: for each retraining choice of a tenant, a dynamic programme over slots (the inference profile as the
//! state) finds the tenant's column of largest reduced cost under the master's prices, where given in the room the
//! other tenants leave ([`Pricer`]).

use std::cell::OnceCell;

use super::columns::{Column, RowIndex};
use crate::level2::problem::{GpuProblem, RetrainOption};

/// What one slot of the pricing programme needs besides the rows before it.
struct FreeStep<'a> {
    t: usize,
    regime: usize,
    rt_now: usize,
    rt_prev: usize,
    hold: &'a [f64],
    room: &'a [f64],
    masks: Option<StepMasks<'a>>,
}

impl FreeStep<'_> {
    /// With room limits: whether what the tenant held in the previous slot (profile `q`, `np` = none, beside its
    /// retraining) fits the room rows; true without limits.
    fn held_ok(&self, q: usize) -> bool {
        self.masks.is_none_or(|k| k.held[q])
    }

    /// Whether an instance of `p` (beside the retraining one) fits the slot's usage rows.
    fn usage_ok(&self, p: usize) -> bool {
        self.masks.is_none_or(|k| k.usage[p])
    }

    /// Whether a pre-initialised `p` fits the room rows beside `q` (and the retraining instance).
    fn pre_ok(&self, q: usize, p: usize) -> bool {
        self.masks.is_none_or(|k| match k.pre {
            PreRoom::Table(pre) => pre[q * k.usage.len() + p],
            PreRoom::Size { left, size } => pre_fits(&left, size, q, p),
        })
    }
}

/// How a step checks that a pre-initialised instance fits the room rows beside what the tenant held.
#[derive(Clone, Copy)]
enum PreRoom<'a> {
    /// `pre[q * (np + 1) + p]`: `q` and a pre-initialised `p` fit beside the retraining instance.
    Table(&'a [bool]),
    /// Where no profile has rows of its own (every catalogued GPU): by size, against `left`, the room rows left
    /// beside the retraining instance (with [`ROOM_EPS`]), from the pricer's size table. Checked when asked, since
    /// a step asks for few of the `(np + 1)^2` pairs.
    Size { left: [f64; 3], size: &'a [[f64; 3]] },
}

/// Whether `q` and a pre-initialised `p` fit in `left` by size ([`PreRoom::Size`]).
pub(super) fn pre_fits(left: &[f64; 3], size: &[[f64; 3]], q: usize, p: usize) -> bool {
    (0..3).all(|j| size[p][j] <= left[j] - size[q][j])
}

/// Room checks of one slot under hard limits, indexed by profile (`np` = none), for the retraining instance the
/// tenant holds now and held in the previous slot.
#[derive(Clone, Copy)]
struct StepMasks<'a> {
    /// `usage[p]`: an instance of `p` beside the retraining one fits the slot's usage rows.
    usage: &'a [bool],
    /// `held[q]`: what the tenant held in the previous slot (`q` and its retraining) fits the room rows.
    held: &'a [bool],
    /// Whether a pre-initialised `p` fits beside them.
    pre: PreRoom<'a>,
}

/// [`StepMasks`] of every slot `t` and retraining profile `rt` that the priced choices hold (`w = index[rt]`),
/// flat: `usage` and `held` from `(t * W + w) * m`, and either `pre` from `(t * W + w) * m * m` or (checked by
/// size) `left` at `t * W + w`, with `m = np + 1` and `W` the number of such profiles.
struct RoomTables {
    index: Vec<usize>,
    wanted: usize,
    usage: Vec<bool>,
    held: Vec<bool>,
    pre: Vec<bool>,
    left: Vec<[f64; 3]>,
}

impl RoomTables {
    /// Where the masks of slot `t` with retraining profile `rt` start, in units of `m`.
    fn at(&self, t: usize, rt: usize) -> usize {
        t * self.wanted + self.index[rt]
    }
}

/// Tolerance of room checks against the room other tenants leave (sums of small integers, up to rounding).
pub(super) const ROOM_EPS: f64 = 1e-9;

/// An instance's dead time in a slot, s: kept (0), pre-initialised (1), started cold (2).
fn dead_times(pb: &GpuProblem) -> [f64; 3] {
    [0.0, pb.dead_preinit_s, pb.dead_cold_s]
}

/// A tenant's goodput per regime, slot and usable profile, one flat buffer (the pricing programme reads it in its
/// innermost loops).
pub(super) struct SlotValues {
    slots: usize,
    usable: usize,
    /// `rows[(regime * slots + t) * usable + k]`.
    rows: Vec<[f64; 3]>,
}

impl SlotValues {
    /// The rows of slot `t` in accuracy regime `regime`, one per usable profile.
    pub(super) fn at(&self, regime: usize, t: usize) -> &[[f64; 3]] {
        &self.rows[(regime * self.slots + t) * self.usable..][..self.usable]
    }
}

/// Per-tenant data for pricing that does not depend on the duals, computed once per solve.
pub(super) struct Pricer {
    tenant: usize,
    /// Profiles the tenant can serve on.
    pub(super) usable: Vec<usize>,
    /// `usable_index[p]`: where profile `p` is in `usable`, if it is.
    pub(super) usable_index: Vec<Option<usize>>,
    /// The profile of each state of the pricing programme: `np` (none) for state 0, `usable[s - 1]` for state `s`.
    pub(super) state_profile: Vec<usize>,
    /// `value.at(regime, t)[k][dead]`: goodput in slot `t` on `usable[k]` with accuracy regime 0 (old) or 1 (new)
    /// and dead time 0 (kept), 1 (pre-initialised), 2 (cold).
    pub(super) value: SlotValues,
    /// `fit[a][b][c]` over profile indices with `np` meaning none: whether the three instances fit together.
    fit: Vec<bool>,
    pub(super) np: usize,
    /// Retraining choices (`None`: no retraining).
    pub(super) choices: Vec<Option<RetrainOption>>,
    /// The profile of the tenant's inference instance now, if it has one.
    pub(super) current: Option<usize>,
    /// `size[p]`: compute slices, memory slices and instances of profile `p` (zero for `np`, none).
    pub(super) size: Vec<[f64; 3]>,
}

impl Pricer {
    /// Whether each three instances (profile indices, `np` = none) fit the GPU together, flat as [`Pricer::fits`]
    /// reads it: the same for every tenant of `pb`.
    pub(super) fn fit_table(pb: &GpuProblem) -> Vec<bool> {
        let np = pb.profiles.len();
        let m = np + 1;
        let mut fit = vec![false; m * m * m];
        let mut counts = vec![0u8; np];
        for a in 0..m {
            for b in 0..m {
                for c in 0..m {
                    counts.iter_mut().for_each(|n| *n = 0);
                    for x in [a, b, c] {
                        if x < np {
                            counts[x] += 1;
                        }
                    }
                    fit[(a * m + b) * m + c] = pb.counts_feasible(&counts);
                }
            }
        }
        fit
    }

    /// A column of this tenant with its value: its goodput, read from the pricer's goodput table (computed for a
    /// profile the tenant cannot use), plus its retraining's tail value ([`GpuProblem::tail_value`]).
    pub(super) fn column(
        &self,
        pb: &GpuProblem,
        inference: Vec<Option<usize>>,
        pre: Vec<bool>,
        retrain: Option<RetrainOption>,
    ) -> Column {
        let mut v = pb.tail_value(self.tenant, retrain);
        let mut prev = self.current;
        for t in 0..pb.slots {
            if let Some(p) = inference[t] {
                let regime = usize::from(retrain.is_some_and(|o| o.end <= t));
                let dead = if prev == Some(p) {
                    0
                } else if pre[t] {
                    1
                } else {
                    2
                };
                v += match self.usable_index[p] {
                    Some(k) => self.value.at(regime, t)[k][dead],
                    None => {
                        let t_ = &pb.tenants[self.tenant];
                        let acc = if regime == 1 { t_.acc_new } else { t_.acc_old };
                        pb.tenant_value(self.tenant, t, p, dead_times(pb)[dead], acc)
                    }
                };
            }
            prev = inference[t];
        }
        Column { tenant: self.tenant, inference, pre, retrain, value: v, coefficients: OnceCell::new() }
    }

    /// Tenant `i`'s pricer, with `fit` from [`Pricer::fit_table`].
    pub(super) fn new(pb: &GpuProblem, i: usize, fit: Vec<bool>) -> Pricer {
        let t_ = &pb.tenants[i];
        let np = pb.profiles.len();
        let usable: Vec<usize> = (0..np).filter(|p| t_.cap[*p] > 0.0).collect();
        let mut value = SlotValues { slots: pb.slots, usable: usable.len(), rows: Vec::new() };
        for acc in [t_.acc_old, t_.acc_new] {
            for t in 0..pb.slots {
                value
                    .rows
                    .extend(usable.iter().map(|p| dead_times(pb).map(|dead| pb.tenant_value(i, t, *p, dead, acc))));
            }
        }
        let m = np + 1;
        let options = pb.retrain_options(i);
        let forced = t_.retrain.as_ref().is_some_and(|r| r.running_on.is_some()) && !options.is_empty();
        // No retraining first: its dynamic programme is the shared prefix of every option's (before the option
        // starts, a tenant's slots look the same).
        let mut choices: Vec<Option<RetrainOption>> = if forced { Vec::new() } else { vec![None] };
        // Latest start first: an option's run overwrites the programme's rows from its start on, so every later
        // (earlier-starting) option still finds the no-retraining rows before its own start intact.
        let mut options = options;
        options.sort_by(|a, b| b.start.cmp(&a.start).then(a.profile.cmp(&b.profile)));
        choices.extend(options.into_iter().map(Some));
        let current = t_.current_inference.and_then(|pl| pb.profile_index(pl.profile));
        let size =
            (0..m)
                .map(|p| {
                    if p < np {
                        [f64::from(pb.compute_slices(p)), f64::from(pb.memory_slices(p)), 1.0]
                    } else {
                        [0.0; 3]
                    }
                })
                .collect();
        let mut usable_index = vec![None; np];
        for (k, &p) in usable.iter().enumerate() {
            usable_index[p] = Some(k);
        }
        let state_profile = std::iter::once(np).chain(usable.iter().copied()).collect();
        Pricer { tenant: i, usable, usable_index, state_profile, value, fit, np, choices, current, size }
    }

    /// Price of one instance of `p` in the block of rows at `base`, from the pricer's size table.
    fn price_at(&self, l: &RowIndex, y: &[f64], base: usize, p: usize) -> f64 {
        let s = &self.size[p];
        y[base] * s[0] + y[base + 1] * s[1] + y[base + 2] * s[2] + l.own[p].map_or(0.0, |own| y[base + own])
    }

    pub(super) fn fits(&self, a: usize, b: usize, c: usize) -> bool {
        let m = self.np + 1;
        self.fit[(a * m + b) * m + c]
    }

    /// `fits(a, b, c)` for every `c`, indexed by `c` (the table is symmetric: `fits(c, b, a)` too).
    pub(super) fn fit_row(&self, a: usize, b: usize) -> &[bool] {
        let m = self.np + 1;
        &self.fit[(a * m + b) * m..][..m]
    }

    /// Whether instances of `items` (profile indices, `np` = none) fit the remaining room of the row block at
    /// `base`.
    fn room_for(&self, l: &RowIndex, rem: &[f64], base: usize, items: [usize; 3]) -> bool {
        self.room_for_all(l, rem, base, &items)
    }

    /// Whether instances of `items` (profile indices, `np` = none) fit `rem` in the row block at `base`.
    pub(super) fn room_for_all(&self, l: &RowIndex, rem: &[f64], base: usize, items: &[usize]) -> bool {
        let mut used = [0.0f64; 3];
        for &p in items {
            let s = &self.size[p];
            used[0] += s[0];
            used[1] += s[1];
            used[2] += s[2];
        }
        let eps = ROOM_EPS;
        if !(used[0] <= rem[base] + eps && used[1] <= rem[base + 1] + eps && used[2] <= rem[base + 2] + eps) {
            return false;
        }
        if !l.any_own {
            return true;
        }
        let mut per = [0.0f64; 8];
        for &p in items {
            if p < self.np {
                per[p] += 1.0;
            }
        }
        items.iter().all(|p| *p >= self.np || l.own[*p].is_none_or(|own| per[*p] <= rem[base + own] + eps))
    }

    /// One slot of the pricing programme without room limits (`t > 0`): for each state, staying, switching cold
    /// from the best other state, or switching pre-initialised from the best other state it fits beside. Equal to
    /// the general step (the same maximum), in `O(states)` per state with the row lookups hoisted.
    fn step_free(&self, st: FreeStep<'_>, prev: &[f64], here: &mut [f64], from: &mut [(usize, bool)]) {
        let none = self.np;
        let states = prev.len();
        let profile = &self.state_profile[..states];
        let (held_ok, usage_ok, pre_ok) = (|q| st.held_ok(q), |p| st.usage_ok(p), |q, p| st.pre_ok(q, p));
        // `fits(p, rt_now, none)`, by the table's symmetry one row indexed by `p`.
        let fits_now = self.fit_row(none, st.rt_now);
        let rows = self.value.at(st.regime, st.t);
        let (mut b1, mut b2) = (usize::MAX, usize::MAX);
        for ps in 0..states {
            let v = prev[ps];
            if v == f64::NEG_INFINITY || !held_ok(profile[ps]) {
                continue;
            }
            if b1 == usize::MAX || v > prev[b1] + 1e-12 {
                b2 = b1;
                b1 = ps;
            } else if b2 == usize::MAX || v > prev[b2] + 1e-12 {
                b2 = ps;
            }
        }
        for s in 0..states {
            here[s] = f64::NEG_INFINITY;
            let p = profile[s];
            if !fits_now[p] || b1 == usize::MAX || !usage_ok(p) {
                continue;
            }
            if p == none {
                here[s] = prev[b1];
                from[s] = (b1, false);
                continue;
            }
            let row = &rows[s - 1];
            let h = st.hold[p];
            let mut best = f64::NEG_INFINITY;
            let mut arg = (0, false);
            if prev[s] > f64::NEG_INFINITY && held_ok(p) {
                best = prev[s] + row[0] - h;
                arg = (s, false);
            }
            let cold = row[2] - h;
            let other = if b1 != s { b1 } else { b2 };
            if other != usize::MAX && prev[other] + cold > best + 1e-12 {
                best = prev[other] + cold;
                arg = (other, false);
            }
            let warm = row[1] - st.room[p] - h;
            // `fits(q, rt_prev, p)` for every previous profile `q`, indexed by `q`.
            let fits_beside = self.fit_row(p, st.rt_prev);
            let beside = |ps: usize| fits_beside[profile[ps]] && pre_ok(profile[ps], p);
            if warm > cold && other != usize::MAX && beside(other) {
                // The best other state is the best one to switch from pre-initialised, where the new instance fits
                // beside it (as it mostly does); only where it does not are the others searched.
                if prev[other] + warm > best + 1e-12 {
                    best = prev[other] + warm;
                    arg = (other, true);
                }
            } else if warm > cold {
                for ps in 0..states {
                    if ps != s
                        && prev[ps] > f64::NEG_INFINITY
                        && prev[ps] + warm > best + 1e-12
                        && held_ok(profile[ps])
                        && beside(ps)
                    {
                        best = prev[ps] + warm;
                        arg = (ps, true);
                    }
                }
            }
            here[s] = best;
            from[s] = arg;
        }
    }

    /// One slot `t > 0` of the pricing programme run backwards: `here[q]`, the best value of slots `t..` for a
    /// tenant in state `q` in slot `t - 1`, from `next[s]`, the best value of slots `t + 1..` in state `s` at
    /// `t`; `to[q]` is the state it moves to (and whether pre-initialised). The same moves and room checks as
    /// [`Pricer::step_free`], so that a forward run up to any slot joined with this one's values after it finds
    /// the same optimum as a forward run over the whole horizon.
    fn step_back(&self, st: FreeStep<'_>, next: &[f64], here: &mut [f64], to: &mut [(usize, bool)]) {
        let none = self.np;
        let states = next.len();
        let profile = &self.state_profile[..states];
        let (held_ok, usage_ok, pre_ok) = (|q| st.held_ok(q), |p| st.usage_ok(p), |q, p| st.pre_ok(q, p));
        let fits_now = self.fit_row(none, st.rt_now);
        let rows = self.value.at(st.regime, st.t);
        for q in 0..states {
            here[q] = f64::NEG_INFINITY;
            let prev_p = profile[q];
            if !held_ok(prev_p) {
                continue;
            }
            // `fits(prev_p, rt_prev, p)` for every `p`, indexed by `p`.
            let fits_beside = self.fit_row(prev_p, st.rt_prev);
            let mut best = f64::NEG_INFINITY;
            let mut arg = (0, false);
            for s in 0..states {
                let p = profile[s];
                if next[s] == f64::NEG_INFINITY || !fits_now[p] || !usage_ok(p) {
                    continue;
                }
                let (gain, pre) = if p == none {
                    (0.0, false)
                } else {
                    let row = &rows[s - 1];
                    let h = st.hold[p];
                    if s == q {
                        (row[0] - h, false)
                    } else {
                        let (cold, warm) = (row[2] - h, row[1] - st.room[p] - h);
                        if warm > cold && fits_beside[p] && pre_ok(prev_p, p) { (warm, true) } else { (cold, false) }
                    }
                };
                if next[s] + gain > best + 1e-12 {
                    best = next[s] + gain;
                    arg = (s, pre);
                }
            }
            here[q] = best;
            to[q] = arg;
        }
    }

    /// [`StepMasks`] of slot `t` beside retraining profile `rt` (`np`: none), in the room `rem` leaves: `usage[p]`
    /// and `held[p]` (an instance of `p` fits the usage, room rows), `pre[q * m + p]` (`q` and a pre-initialised
    /// `p` fit the room rows). `by_size` (valid where no profile has its own rows, as on every catalogued GPU)
    /// compares sizes with what is left beside the retraining instance instead of checking each entry's room, and
    /// returns what is left in the room rows ([`PreRoom::Size`]), leaving `pre` untouched; otherwise it fills `pre`
    /// and returns `None`.
    pub(super) fn room_masks(
        &self,
        l: &RowIndex,
        rem: &[f64],
        t: usize,
        rt: usize,
        by_size: bool,
        (usage, held, pre): (&mut [bool], &mut [bool], &mut [bool]),
    ) -> Option<[f64; 3]> {
        let none = self.np;
        let m = none + 1;
        if by_size {
            let size = &self.size;
            let left = |base: usize| -> [f64; 3] { std::array::from_fn(|j| rem[base + j] - size[rt][j] + ROOM_EPS) };
            let within = |r: &[f64; 3], p: usize| (0..3).all(|j| size[p][j] <= r[j]);
            let (in_usage, in_room) = (left(l.usage(t)), left(l.room(t)));
            for q in 0..m {
                usage[q] = within(&in_usage, q);
                held[q] = within(&in_room, q);
            }
            return Some(in_room);
        }
        for p in 0..m {
            usage[p] = self.room_for(l, rem, l.usage(t), [p, rt, none]);
            held[p] = self.room_for(l, rem, l.room(t), [p, rt, none]);
        }
        for q in 0..m * m {
            pre[q] = self.room_for(l, rem, l.room(t), [q / m, rt, q % m]);
        }
        None
    }

    /// The best column under capacity duals `y` (convexity duals excluded) and its value `c - y.a`. With `rem`
    /// (the room the other tenants leave in every row), only columns that fit it are considered.
    pub(super) fn price(&self, pb: &GpuProblem, l: &RowIndex, y: &[f64]) -> (Column, f64) {
        self.price_within(pb, l, y, None).expect("without limits a tenant can always do nothing")
    }

    pub(super) fn price_within(
        &self,
        pb: &GpuProblem,
        l: &RowIndex,
        y: &[f64],
        rem: Option<&[f64]>,
    ) -> Option<(Column, f64)> {
        self.price_top(pb, l, y, rem, 1).into_iter().next()
    }

    /// The `keep` best columns (each the best of its retraining choice) and their values `c - y.a`, best first.
    pub(super) fn price_top(
        &self,
        pb: &GpuProblem,
        l: &RowIndex,
        y: &[f64],
        rem: Option<&[f64]>,
        keep: usize,
    ) -> Vec<(Column, f64)> {
        self.price_choices(pb, l, y, rem, keep, &self.choices)
    }

    /// [`Pricer::price_top`] over the given retraining choices only.
    pub(super) fn price_choices(
        &self,
        pb: &GpuProblem,
        l: &RowIndex,
        y: &[f64],
        rem: Option<&[f64]>,
        keep: usize,
        choices: &[Option<RetrainOption>],
    ) -> Vec<(Column, f64)> {
        let np = self.np;
        let none = np;
        let slots = pb.slots;
        // Flat per slot (`t * np + p`): room[..]: price of the room rows at t; hold[..]: usage rows at t and room
        // rows at t+1.
        let mut room = vec![0.0; slots * np];
        for t in 0..slots {
            for p in 0..np {
                room[t * np + p] = self.price_at(l, y, l.room(t), p);
            }
        }
        let mut hold = vec![0.0; slots * np];
        for t in 0..slots {
            for p in 0..np {
                hold[t * np + p] =
                    self.price_at(l, y, l.usage(t), p) + if t + 1 < slots { room[(t + 1) * np + p] } else { 0.0 };
            }
        }
        let hold_at = |t: usize| &hold[t * np..][..np];
        let room_at = |t: usize| &room[t * np..][..np];
        let states = self.usable.len() + 1;
        let profile_of = |s: usize| self.state_profile[s];
        let m = np + 1;
        let tables = rem.map(|rem| {
            // Only the retraining profiles these choices hold (and none) are ever looked up.
            let mut index = vec![usize::MAX; m];
            let mut wanted = 0;
            for rt in 0..m {
                if rt == none || choices.iter().flatten().any(|o| o.profile == rt) {
                    index[rt] = wanted;
                    wanted += 1;
                }
            }
            let by_size = !l.any_own;
            let mut k = RoomTables {
                index,
                wanted,
                usage: vec![false; slots * wanted * m],
                held: vec![false; slots * wanted * m],
                pre: if by_size { Vec::new() } else { vec![false; slots * wanted * m * m] },
                left: vec![[0.0; 3]; if by_size { slots * wanted } else { 0 }],
            };
            for t in 0..slots {
                for rt in (0..m).filter(|rt| k.index[*rt] != usize::MAX) {
                    let at = k.at(t, rt);
                    let pre: &mut [bool] = if by_size { &mut [] } else { &mut k.pre[at * m * m..][..m * m] };
                    let masks = (&mut k.usage[at * m..][..m], &mut k.held[at * m..][..m], pre);
                    if let Some(left) = self.room_masks(l, rem, t, rt, by_size, masks) {
                        k.left[at] = left;
                    }
                }
            }
            k
        });
        let mut best: Vec<(f64, Column)> = Vec::with_capacity(keep + 1);
        // Flat per slot (`t * states + s`): the programme's values and the move into each state.
        let mut value = vec![f64::NEG_INFINITY; slots * states];
        let mut from = vec![(0usize, false); slots * states];
        let masks_at = |t: usize, rt_now: usize, rt_prev: usize| {
            tables.as_ref().map(|k| StepMasks {
                usage: &k.usage[k.at(t, rt_now) * m..][..m],
                held: &k.held[k.at(t, rt_prev) * m..][..m],
                pre: if !l.any_own {
                    PreRoom::Size { left: k.left[k.at(t, rt_prev)], size: &self.size }
                } else {
                    PreRoom::Table(&k.pre[k.at(t, rt_prev) * m * m..][..m * m])
                },
            })
        };
        // Slots after a retraining has ended look the same for every option that ends before the horizon (new
        // accuracy, no retraining instance): one backward programme over them serves all such options, whose
        // forward runs then stop at their end slot. `tail[t * states + q]` is the best value of slots `t..` for a
        // tenant in state `q` in slot `t - 1` (zero at the horizon), `to[t * states + q]` its move in slot `t`.
        let ending = || choices.iter().flatten().filter(|o| o.end < slots);
        let suffix = (ending().count() >= 2).then(|| {
            let mut tail = vec![f64::NEG_INFINITY; (slots + 1) * states];
            let mut to = vec![(0usize, false); slots * states];
            tail[slots * states..].fill(0.0);
            let first = ending().map(|o| o.end + 1).min().unwrap_or(slots);
            for t in (first..slots).rev() {
                let (head, rest) = tail.split_at_mut((t + 1) * states);
                let st = FreeStep {
                    t,
                    regime: 1,
                    rt_now: none,
                    rt_prev: none,
                    hold: hold_at(t),
                    room: room_at(t),
                    masks: masks_at(t, none, none),
                };
                self.step_back(st, &rest[..states], &mut head[t * states..], &mut to[t * states..][..states]);
            }
            (tail, to)
        });
        // `gain[(t * m + rt) * 2 + regime]`: the most one slot can add to the programme's value, beside retraining
        // profile `rt` (`np`: none): any move into any state that fits beside it, or nothing. A choice whose
        // forward run cannot beat the `keep` best found so far, even at these gains, is skipped (its run would
        // be rejected: the same result, without the run).
        let gain = (choices.len() > keep).then(|| {
            let mut gain = vec![0.0f64; slots * m * 2];
            let held: Vec<usize> =
                (0..m).filter(|rt| *rt == none || choices.iter().flatten().any(|o| o.profile == *rt)).collect();
            for t in 0..slots {
                for &rt in &held {
                    let usage = masks_at(t, rt, rt).map(|k| k.usage);
                    let fits_now = self.fit_row(none, rt);
                    for regime in 0..2 {
                        let mut g = 0.0f64;
                        for (k, row) in self.value.at(regime, t).iter().enumerate() {
                            let p = self.usable[k];
                            if fits_now[p] && usage.is_none_or(|u| u[p]) {
                                g = g.max(row[0].max(row[1] - room_at(t)[p]).max(row[2]) - hold_at(t)[p]);
                            }
                        }
                        gain[(t * m + rt) * 2 + regime] = g;
                    }
                }
            }
            gain
        });
        for o in choices {
            let rt_cost: f64 = o.map_or(0.0, |o| (o.start..o.end.min(slots)).map(|t| hold_at(t)[o.profile]).sum());
            let rt_at = |t: usize| o.filter(|o| o.active(t)).map_or(none, |o| o.profile);
            // Rows before the option starts are those of the no-retraining run, still in place.
            let first = if choices.first() == Some(&None) { o.map_or(0, |o| o.start) } else { 0 };
            // The last slot of the forward run: the option's end slot where the shared suffix takes over.
            let stop = match (&suffix, o) {
                (Some(_), Some(o)) if o.end < slots => o.end,
                _ => slots - 1,
            };
            let tail = suffix.as_ref().filter(|_| stop + 1 < slots);
            if best.len() >= keep
                && let (Some((worst, _)), Some(gain)) = (best.last(), &gain)
            {
                let before = if first == 0 {
                    0.0
                } else {
                    value[(first - 1) * states..][..states].iter().copied().fold(f64::NEG_INFINITY, f64::max)
                };
                let after = tail.map_or(0.0, |(tail, _)| {
                    tail[(stop + 1) * states..][..states].iter().copied().fold(f64::NEG_INFINITY, f64::max)
                });
                let mut within = 0.0;
                let mut scale = before.abs() + after.abs() + rt_cost.abs();
                for t in first..=stop {
                    let g = gain[(t * m + rt_at(t)) * 2 + usize::from(o.is_some_and(|o| o.end <= t))];
                    within += g;
                    scale += g.abs();
                }
                let tail_value = pb.tail_value(self.tenant, *o);
                let most = before + within + after - rt_cost + tail_value;
                if most + 1e-9 * (1.0 + scale + tail_value.abs()) <= *worst {
                    continue;
                }
            }
            if first == 0 {
                // Slot 0: from what the tenant holds now, which the room rows already count.
                let rt_now = rt_at(0);
                let regime = usize::from(o.is_some_and(|o| o.end == 0));
                let prev_p = self.current.unwrap_or(none);
                for s in 0..states {
                    value[s] = f64::NEG_INFINITY;
                    let p = profile_of(s);
                    if !self.fits(p, rt_now, none)
                        || rem.is_some_and(|rem| !self.room_for(l, rem, l.usage(0), [p, rt_now, none]))
                    {
                        continue;
                    }
                    let (gain, pre) = if p == none {
                        (0.0, false)
                    } else {
                        let row = &self.value.at(regime, 0)[s - 1];
                        let h = hold_at(0)[p];
                        if prev_p == p {
                            (row[0] - h, false)
                        } else {
                            let (cold, warm) = (row[2], row[1] - room_at(0)[p]);
                            let can_pre = rem.is_none_or(|rem| self.room_for(l, rem, l.room(0), [none, none, p]));
                            if can_pre && warm > cold { (warm - h, true) } else { (cold - h, false) }
                        }
                    };
                    value[s] = gain;
                    from[s] = (0, pre);
                }
            }
            for t in first.max(1)..=stop {
                let regime = usize::from(o.is_some_and(|o| o.end <= t));
                let (rt_now, rt_prev) = (rt_at(t), rt_at(t - 1));
                let (done, rest) = value.split_at_mut(t * states);
                let st = FreeStep {
                    t,
                    regime,
                    rt_now,
                    rt_prev,
                    hold: hold_at(t),
                    room: room_at(t),
                    masks: masks_at(t, rt_now, rt_prev),
                };
                self.step_free(st, &done[(t - 1) * states..], &mut rest[..states], &mut from[t * states..][..states]);
            }
            let Some((mut s, total)) = value[stop * states..][..states]
                .iter()
                .copied()
                .enumerate()
                .map(|(q, v)| (q, v + tail.map_or(0.0, |(tail, _)| tail[(stop + 1) * states + q])))
                .filter(|(_, v)| *v > f64::NEG_INFINITY)
                .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.cmp(&a.0)))
            else {
                continue;
            };
            let reduced = total - rt_cost + pb.tail_value(self.tenant, *o);
            if best.len() >= keep && best.last().is_some_and(|(b, _)| *b >= reduced - 1e-12) {
                continue;
            }
            let mut inference = vec![None; slots];
            let mut pre = vec![false; slots];
            if let Some((_, to)) = tail {
                let mut q = s;
                for t in stop + 1..slots {
                    (q, pre[t]) = to[t * states + q];
                    inference[t] = (q > 0).then(|| self.usable[q - 1]);
                }
            }
            for t in (0..=stop).rev() {
                inference[t] = (s > 0).then(|| self.usable[s - 1]);
                let (ps, was_pre) = from[t * states + s];
                pre[t] = was_pre;
                if t > 0 {
                    s = ps;
                }
            }
            let col = self.column(pb, inference, pre, *o);
            let at = best.partition_point(|(b, _)| *b >= reduced);
            best.insert(at, (reduced, col));
            best.truncate(keep);
        }
        best.into_iter().map(|(reduced, col)| (col, reduced)).collect()
    }
}

/// Orders retraining choices as the pricing programme needs them: no retraining first, then latest start first.
pub(super) fn sort_choices(choices: &mut [Option<RetrainOption>]) {
    choices.sort_by(|a, b| match (a, b) {
        (None, None) => std::cmp::Ordering::Equal,
        (None, Some(_)) => std::cmp::Ordering::Less,
        (Some(_), None) => std::cmp::Ordering::Greater,
        (Some(a), Some(b)) => b.start.cmp(&a.start).then(a.profile.cmp(&b.profile)).then(a.end.cmp(&b.end)),
    });
}
