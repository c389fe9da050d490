//! The restricted master LP of column generation ([`crate::level2::cg`]): a small dense revised primal simplex.
//!
//! The master is `max c.x` subject to packing rows `A x <= b` (`b >= 0`) and convexity rows `sum x = 1`, `x >= 0`,
//! with at most a few hundred rows and columns, re-solved after every pricing round with a handful of new columns.
//! HiGHS solved it in about 250 microseconds a call on the Azure Functions 2019 day, almost all of it per-call set-up
//! (matrix checks, row-wise copies, scaling, KKT reports), which made the master LP half of a planning round. This
//! solver keeps what a re-solve needs between calls instead: the basis, the inverse of its structural block and the
//! basic values. A new column enters at zero, so the previous basis stays primal feasible and the next solve starts
//! from it.
//!
//! - Every row has a logical variable: a slack (cost 0) on a packing row, an artificial (cost `-penalty`) on a
//!   convexity row. The logicals are the first basis, so no phase 1 is needed; the artificials leave as soon as
//!   real columns can carry the convexity rows (the big-M method, as the master had with HiGHS).
//! - **The basis by its structural block.** A basic logical is a unit column, so with the rows `S` the basic
//!   logicals cover and the others (`T`, as many as there are basic structurals), the basis is block-triangular
//!   and everything the simplex needs follows from the inverse `M` of the structurals' `T x T` block: `B^-1 a` is
//!   `M a_T` on the structurals and `a_S - A_S M a_T` on the logicals, and the duals are the logicals' costs on
//!   `S` and `(c_B - y_S A_S) M` on `T`. Masters keep most of their slacks basic (measured on 1,000 GPUs of 4
//!   tenants and 30 slots: 184 rows, 29 basic structurals on average), so a pivot updates a `k x k` matrix where a
//!   dense inverse of the whole basis costs `m x m` (40 times more there). Each of the four kinds of pivot
//!   (structural or logical in, structural or logical out) is a rank-one update of `M`, bordered where `T` gains
//!   a row and reduced where it loses one.
//! - Dantzig pricing on reduced costs scaled by the column's norm; Harris's two-pass ratio test; Bland's rule
//!   after a run of degenerate pivots (no cycling). `M` is updated at each pivot and rebuilt every
//!   [`REINVERT_EVERY`] pivots, and at an optimum whose basic values or duals no longer solve their systems to
//!   1e-9, or whose basic values are negative beyond the tolerance (the optimum is then confirmed on the fresh
//!   inverse).
//! - A solve that exceeds its pivot budget, meets a singular basis or fails the final check returns an error: the
//!   caller falls back to HiGHS. Nothing it returns can make a plan or a bound wrong: plans are checked for
//!   feasibility and bounds are Lagrangian bounds, valid at any prices; only the speed of convergence depends on it.

/// Pivots between rebuilds of `M`, the inverse of the basis's structural block.
pub const REINVERT_EVERY: usize = 50;

/// Relative tolerance on reduced costs (relative to `1 + |c_j|`).
const OPT_TOL: f64 = 1e-9;
/// Primal feasibility tolerance (Harris's ratio test).
const FEAS_TOL: f64 = 1e-9;
/// Smallest pivot element accepted in the ratio test.
const PIVOT_TOL: f64 = 1e-9;
/// Smallest pivot accepted when inverting the basis.
const SINGULAR_TOL: f64 = 1e-11;
/// No index: a row whose logical is not basic, a structural that is not basic.
const NONE: usize = usize::MAX;

/// Why a solve gave up (the caller then solves the master with HiGHS).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MasterError {
    /// More pivots than the budget.
    #[error("master LP: pivot budget exhausted")]
    Budget,
    /// The basis became numerically singular.
    #[error("master LP: singular basis")]
    Singular,
    /// An improving column with no limiting row (cannot happen with convexity rows and non-negative columns).
    #[error("master LP: unbounded")]
    Unbounded,
    /// The optimum found on a fresh inverse is infeasible beyond the tolerance.
    #[error("master LP: optimality check failed")]
    Check,
}

/// A restricted master LP, kept solved between column additions.
#[derive(Debug, Clone)]
pub struct MasterLp {
    m: usize,
    b: Vec<f64>,
    /// Costs of every variable: the `m` logicals, then the structural columns.
    cost: Vec<f64>,
    /// Structural columns, sparse: `(row, coefficient)` in `entries[start[j]..start[j + 1]]`.
    entries: Vec<(usize, f64)>,
    start: Vec<usize>,
    /// The same entries by row: `(structural index, coefficient)` in the order the columns joined.
    by_row: Vec<Vec<(usize, f64)>>,
    /// `1 / sqrt(1 + |a_j|^2)` per variable, the pricing scale.
    scale: Vec<f64>,
    /// The basic variable of each basis position.
    basis: Vec<usize>,
    /// Whether each variable is basic.
    basic: Vec<bool>,
    /// Per row: the basis position of its logical where that is basic (the row is in `S`), else [`NONE`].
    covered: Vec<usize>,
    /// The rows `T` whose logical is not basic, in the order of `M`'s columns.
    free: Vec<usize>,
    /// Per row: its index in `free`, or [`NONE`].
    local: Vec<usize>,
    /// The basis positions that hold structurals, in the order of `M`'s rows.
    slots: Vec<usize>,
    /// Per structural: its index in `slots` where it is basic, or [`NONE`].
    var_slot: Vec<usize>,
    /// `M`, the inverse of the basic structurals' block on the rows `T`, column-major with stride `m`:
    /// `minv[a * m + c]` is `M[c][a]`, for structural `slots[c]` and row `free[a]`. It holds the columns in use
    /// (grown as `T` grows), not `m x m`.
    minv: Vec<f64>,
    /// Values of the basic variables, by basis position.
    xb: Vec<f64>,
    /// Row duals `c_B B^-1`, kept by the last solve.
    y: Vec<f64>,
    since_invert: usize,
    /// Variables below this index had no improving reduced cost at the last optimum: until a pivot changes the
    /// duals, only the columns added since then can enter.
    priced: usize,
}

impl MasterLp {
    /// An LP over `b.len()` rows, none of them with a column yet: row `r` is a convexity row (`= b[r]`, with an
    /// artificial of cost `-penalty`) where `equality[r]`, otherwise a packing row (`<= b[r]`).
    ///
    /// # Panics
    /// If `equality` and `b` differ in length or a right-hand side is negative or not finite.
    pub fn new(b: Vec<f64>, equality: &[bool], penalty: f64) -> MasterLp {
        assert_eq!(b.len(), equality.len(), "one equality flag per row");
        assert!(b.iter().all(|v| v.is_finite() && *v >= 0.0), "right-hand sides must be finite and >= 0");
        let m = b.len();
        let cost: Vec<f64> = equality.iter().map(|&e| if e { -penalty } else { 0.0 }).collect();
        MasterLp {
            m,
            xb: b.clone(),
            b,
            cost,
            entries: Vec::new(),
            start: vec![0],
            by_row: vec![Vec::new(); m],
            scale: vec![std::f64::consts::FRAC_1_SQRT_2; m],
            basis: (0..m).collect(),
            basic: vec![true; m],
            covered: (0..m).collect(),
            free: Vec::new(),
            local: vec![NONE; m],
            slots: Vec::new(),
            var_slot: Vec::new(),
            minv: Vec::new(),
            y: vec![0.0; m],
            since_invert: 0,
            priced: 0,
        }
    }

    /// Structural columns added so far.
    pub fn columns(&self) -> usize {
        self.start.len() - 1
    }

    /// Adds a structural column of cost `cost` with the given `(row, coefficient)` entries (rows distinct and in
    /// range), nonbasic at zero: the current basis stays feasible. Returns its index among the structurals.
    ///
    /// # Panics
    /// If a row is out of range.
    pub fn add_column(&mut self, cost: f64, entries: &[(usize, f64)]) -> usize {
        assert!(entries.iter().all(|(r, _)| *r < self.m), "row out of range");
        let norm: f64 = entries.iter().map(|(_, v)| v * v).sum();
        self.entries.extend_from_slice(entries);
        self.start.push(self.entries.len());
        let j = self.start.len() - 2;
        for &(r, v) in entries {
            self.by_row[r].push((j, v));
        }
        self.cost.push(cost);
        self.scale.push(1.0 / (1.0 + norm).sqrt());
        self.basic.push(false);
        self.var_slot.push(NONE);
        self.columns() - 1
    }

    /// Row duals of the last optimum (`>= 0` on packing rows): the objective's rate of change per unit of each
    /// row's right-hand side.
    pub fn duals(&self) -> &[f64] {
        &self.y
    }

    /// The objective at the current basis.
    pub fn objective(&self) -> f64 {
        self.basis.iter().zip(&self.xb).map(|(&v, x)| self.cost[v] * x).sum()
    }

    /// Values of the structural columns at the current basis.
    pub fn primal(&self) -> Vec<f64> {
        let mut x = vec![0.0; self.columns()];
        for (&v, &xv) in self.basis.iter().zip(&self.xb) {
            if v >= self.m {
                x[v - self.m] = xv.max(0.0);
            }
        }
        x
    }

    /// Entries of variable `j` (a logical is its unit row).
    fn column(&self, j: usize) -> ColumnRef<'_> {
        if j < self.m {
            ColumnRef::Unit(j)
        } else {
            ColumnRef::Sparse(&self.entries[self.start[j - self.m]..self.start[j - self.m + 1]])
        }
    }

    fn dot_y(&self, j: usize) -> f64 {
        match self.column(j) {
            ColumnRef::Unit(r) => self.y[r],
            ColumnRef::Sparse(e) => e.iter().map(|&(r, v)| self.y[r] * v).sum(),
        }
    }

    /// The duals `y B = c_B`: a covered row's is its logical's cost; the rows `T` get `(c_B - y_S A_S) M`.
    fn compute_duals(&mut self) {
        let m = self.m;
        for r in 0..m {
            self.y[r] = if self.covered[r] == NONE { 0.0 } else { self.cost[r] };
        }
        let k = self.slots.len();
        // Only basic artificials give a covered row a dual; once they have left, `g` is the structurals' costs.
        let artificials = (0..m).any(|r| self.covered[r] != NONE && self.y[r] != 0.0);
        let mut g = vec![0.0; k];
        for (c, gc) in g.iter_mut().enumerate() {
            let j = self.basis[self.slots[c]] - m;
            let mut v = self.cost[j + m];
            if artificials {
                for &(r, a) in &self.entries[self.start[j]..self.start[j + 1]] {
                    if self.covered[r] != NONE {
                        v -= self.y[r] * a;
                    }
                }
            }
            *gc = v;
        }
        for (a, &r) in self.free.iter().enumerate() {
            self.y[r] = g.iter().zip(&self.minv[a * m..a * m + k]).map(|(g, mv)| g * mv).sum();
        }
    }

    /// Rebuilds `M` (the inverse of the basic structurals' block on the rows `T`, by Gauss-Jordan with partial
    /// pivoting) and the basic values, with `S`, `T` and the structurals in canonical order.
    fn invert(&mut self) -> Result<(), MasterError> {
        let m = self.m;
        self.covered.iter_mut().for_each(|v| *v = NONE);
        self.var_slot.iter_mut().for_each(|v| *v = NONE);
        self.local.iter_mut().for_each(|v| *v = NONE);
        self.slots.clear();
        for (i, &v) in self.basis.iter().enumerate() {
            if v < m {
                self.covered[v] = i;
            } else {
                self.var_slot[v - m] = self.slots.len();
                self.slots.push(i);
            }
        }
        self.free.clear();
        for r in 0..m {
            if self.covered[r] == NONE {
                self.local[r] = self.free.len();
                self.free.push(r);
            }
        }
        let k = self.slots.len();
        debug_assert_eq!(k, self.free.len(), "each basic logical covers its own row");
        let mut a = vec![0.0; k * k];
        for (c, &pos) in self.slots.iter().enumerate() {
            if let ColumnRef::Sparse(e) = self.column(self.basis[pos]) {
                for &(r, v) in e {
                    if self.local[r] != NONE {
                        a[self.local[r] * k + c] = v;
                    }
                }
            }
        }
        let inv = gauss_jordan(&mut a, k)?;
        if self.minv.len() < k * m {
            self.minv.resize(k * m, 0.0);
        }
        for c in 0..k {
            for a in 0..k {
                self.minv[a * m + c] = inv[c * k + a];
            }
        }
        // Basic values: M b_T on the structurals, then b_S - A_S x on the logicals.
        for (c, &pos) in self.slots.iter().enumerate() {
            self.xb[pos] = self.free.iter().enumerate().map(|(a, &r)| self.minv[a * m + c] * self.b[r]).sum();
        }
        for r in 0..m {
            if self.covered[r] != NONE {
                self.xb[self.covered[r]] = self.b[r];
            }
        }
        for &pos in &self.slots {
            let (j, x) = (self.basis[pos] - m, self.xb[pos]);
            for &(r, v) in &self.entries[self.start[j]..self.start[j + 1]] {
                if self.covered[r] != NONE {
                    self.xb[self.covered[r]] -= v * x;
                }
            }
        }
        self.since_invert = 0;
        Ok(())
    }

    /// Whether the basic values and the duals still solve their systems (`B x_B = b`, `y B = c_B`) to within
    /// 1e-9 relative: the updated inverse has not drifted.
    fn accurate(&self) -> bool {
        let mut r = self.b.clone();
        for (&v, &x) in self.basis.iter().zip(&self.xb) {
            match self.column(v) {
                ColumnRef::Unit(row) => r[row] -= x,
                ColumnRef::Sparse(e) => e.iter().for_each(|&(row, c)| r[row] -= c * x),
            }
        }
        let bmax = self.b.iter().fold(1.0f64, |a, v| a.max(v.abs()));
        if r.iter().any(|v| v.abs() > 1e-9 * bmax) {
            return false;
        }
        let cmax = self.basis.iter().fold(1.0f64, |a, &v| a.max(self.cost[v].abs()));
        self.basis.iter().all(|&v| (self.dot_y(v) - self.cost[v]).abs() <= 1e-9 * cmax)
    }

    /// `w = B^-1 a_j`, by basis position; `wb` gets its structurals' part `M a_T`, by index in `slots`. The
    /// logicals' part `a_S - A_S M a_T` is summed by row in `wr` (every row, those of `T` too, whose sums are not
    /// read: the inner loop then needs no test of which rows are covered).
    fn ftran(&self, j: usize, w: &mut [f64], wb: &mut [f64], wr: &mut [f64]) {
        let (m, k) = (self.m, self.slots.len());
        wb[..k].iter_mut().for_each(|v| *v = 0.0);
        wr.iter_mut().for_each(|v| *v = 0.0);
        match self.column(j) {
            ColumnRef::Unit(r) if self.covered[r] != NONE => {
                w.iter_mut().for_each(|v| *v = 0.0);
                w[self.covered[r]] = 1.0;
                return;
            }
            ColumnRef::Unit(r) => wb[..k].copy_from_slice(&self.minv[self.local[r] * m..self.local[r] * m + k]),
            ColumnRef::Sparse(e) => {
                for &(r, v) in e {
                    wr[r] = v;
                    if self.local[r] != NONE {
                        let col = &self.minv[self.local[r] * m..self.local[r] * m + k];
                        wb[..k].iter_mut().zip(col).for_each(|(x, mv)| *x += v * mv);
                    }
                }
            }
        }
        for (c, &pos) in self.slots.iter().enumerate() {
            let x = wb[c];
            if x == 0.0 {
                continue;
            }
            let jc = self.basis[pos] - m;
            for &(r, v) in &self.entries[self.start[jc]..self.start[jc + 1]] {
                wr[r] -= v * x;
            }
        }
        for (wi, &var) in w.iter_mut().zip(&self.basis) {
            *wi = if var < m { wr[var] } else { wb[self.var_slot[var - m]] };
        }
    }

    /// `z = v M` for row `r`'s entries `v` in the basic structurals (`v[c]` of structural `slots[c]`).
    fn row_times_minv(&self, r: usize, z: &mut [f64]) {
        let (m, k) = (self.m, self.slots.len());
        let v: Vec<(usize, f64)> = self.by_row[r]
            .iter()
            .filter(|(j, v)| self.var_slot[*j] != NONE && *v != 0.0)
            .map(|&(j, v)| (self.var_slot[j], v))
            .collect();
        for (a, za) in z[..k].iter_mut().enumerate() {
            let col = &self.minv[a * m..a * m + k];
            *za = v.iter().map(|&(c, vc)| vc * col[c]).sum();
        }
    }

    /// Updates `M` and the index sets for entering variable `q` replacing basis position `p`, where `wb` is the
    /// structurals' part of `B^-1 a_q` and `pivot` its entry at `p`.
    fn update(&mut self, q: usize, p: usize, wb: &[f64], pivot: f64) {
        let (m, k) = (self.m, self.slots.len());
        let out = self.basis[p];
        if q >= m && out >= m {
            // A structural replaces a structural: M's column of T is unchanged, one of its structurals changes.
            let c0 = self.var_slot[out - m];
            self.var_slot[out - m] = NONE;
            self.var_slot[q - m] = c0;
            for a in 0..k {
                let col = &mut self.minv[a * m..a * m + k];
                let t = col[c0] / pivot;
                col.iter_mut().zip(wb).for_each(|(x, w)| *x -= w * t);
                col[c0] = t;
            }
        } else if q >= m {
            // A structural replaces the logical of row `out`: T gains that row, the block is bordered. With
            // `v` the row's entries in the structurals, `z = v M` and `s = pivot`, the new inverse is
            // `[[M + wb z / s, -wb / s], [-z / s, 1 / s]]`.
            let r = out;
            if self.minv.len() < (k + 1) * m {
                self.minv.resize((k + 1) * m, 0.0);
            }
            let mut z = vec![0.0; k];
            self.row_times_minv(r, &mut z);
            for (a, za) in z.iter().enumerate() {
                let f = za / pivot;
                let col = &mut self.minv[a * m..a * m + k + 1];
                col[..k].iter_mut().zip(wb).for_each(|(x, w)| *x += w * f);
                col[k] = -f;
            }
            let col = &mut self.minv[k * m..k * m + k + 1];
            col[..k].iter_mut().zip(wb).for_each(|(x, w)| *x = -w / pivot);
            col[k] = 1.0 / pivot;
            self.covered[r] = NONE;
            self.local[r] = k;
            self.free.push(r);
            self.var_slot[q - m] = k;
            self.slots.push(p);
        } else if out >= m {
            // The logical of a row of T replaces a structural: T loses the row and the block a column, and the
            // inverse of what is left is `M - M[:, a0] M[c0, :] / M[c0][a0]` without row c0 and column a0.
            let (r, c0) = (q, self.var_slot[out - m]);
            let a0 = self.local[r];
            for a in 0..k {
                let col = &mut self.minv[a * m..a * m + k];
                let f = col[c0] / pivot;
                col.iter_mut().zip(wb).for_each(|(x, w)| *x -= w * f);
            }
            let last = k - 1;
            if a0 != last {
                self.minv.copy_within(last * m..last * m + k, a0 * m);
            }
            if c0 != last {
                for a in 0..last {
                    self.minv[a * m + c0] = self.minv[a * m + last];
                }
            }
            self.free.swap_remove(a0);
            if a0 < self.free.len() {
                self.local[self.free[a0]] = a0;
            }
            self.local[r] = NONE;
            self.covered[r] = p;
            self.slots.swap_remove(c0);
            self.var_slot[out - m] = NONE;
            if c0 < self.slots.len() {
                self.var_slot[self.basis[self.slots[c0]] - m] = c0;
            }
        } else {
            // The logical of a row of T replaces the logical of row `out`, which joins T in its place: a rank-one
            // change of one row of the block. With `v` the new row's entries, `z = v M` and `h = M[:, a0]`,
            // the new inverse is `M - h (z - e_a0) / z[a0]`.
            let (r, s_row) = (q, out);
            let a0 = self.local[r];
            let mut z = vec![0.0; k];
            self.row_times_minv(s_row, &mut z);
            let den = z[a0];
            for (a, za) in z.iter().enumerate() {
                let f = (za - if a == a0 { 1.0 } else { 0.0 }) / den;
                let col = &mut self.minv[a * m..a * m + k];
                col.iter_mut().zip(wb).for_each(|(x, w)| *x -= w * f);
            }
            self.covered[s_row] = NONE;
            self.covered[r] = p;
            self.free[a0] = s_row;
            self.local[s_row] = a0;
            self.local[r] = NONE;
        }
    }

    /// The entering variable among those from `from` on: the largest scaled reduced cost, or under Bland's rule
    /// the first improving one. The structurals' `y a_j` are summed by row over the rows whose dual is not zero
    /// (those of `T` and of basic artificials: most of a master's rows have a basic slack and a zero dual), into
    /// `dots`.
    fn choose_entering(&self, bland: bool, from: usize, dots: &mut Vec<f64>) -> Option<(usize, f64)> {
        let (m, n) = (self.m, self.cost.len());
        let first = from.max(m) - m;
        dots.clear();
        dots.resize(n - m, 0.0);
        for (r, &yr) in self.y.iter().enumerate() {
            if yr == 0.0 {
                continue;
            }
            let row = &self.by_row[r];
            let at = row.partition_point(|(j, _)| *j < first);
            for &(j, v) in &row[at..] {
                dots[j] += yr * v;
            }
        }
        let mut best: Option<(usize, f64, f64)> = None;
        let dot = |j: usize| if j < m { self.y[j] } else { dots[j - m] };
        for j in from..n {
            if self.basic[j] {
                continue;
            }
            let d = self.cost[j] - dot(j);
            if d <= OPT_TOL * (1.0 + self.cost[j].abs()) {
                continue;
            }
            if bland {
                return Some((j, d));
            }
            let score = d * self.scale[j];
            if best.is_none_or(|(_, _, s)| score > s) {
                best = Some((j, d, score));
            }
        }
        best.map(|(j, d, _)| (j, d))
    }

    /// Solves from the current basis, with at most `max_pivots` pivots.
    ///
    /// # Errors
    /// [`MasterError`] where it gives up; the LP is then left in an unspecified (but valid) basis.
    pub fn solve(&mut self, max_pivots: usize) -> Result<(), MasterError> {
        let m = self.m;
        let mut w = vec![0.0; m];
        let mut wb = vec![0.0; m];
        let mut wr = vec![0.0; m];
        let mut dots = Vec::new();
        let mut pivots = 0;
        let mut degenerate = 0;
        // Until the first pivot the duals are those of the last optimum, at which no earlier variable improved:
        // only the columns added since can enter.
        let mut from = std::mem::take(&mut self.priced);
        self.compute_duals();
        loop {
            if self.since_invert >= REINVERT_EVERY {
                self.invert()?;
                self.compute_duals();
            }
            let bland = degenerate > m.max(10);
            let Some((q, d)) = self.choose_entering(bland, from, &mut dots) else {
                let fresh = self.since_invert == 0;
                let feasible = self.xb.iter().all(|x| *x >= -1e-7);
                if feasible && (fresh || self.accurate()) {
                    self.priced = self.cost.len();
                    return Ok(());
                }
                from = 0;
                if fresh {
                    return Err(MasterError::Check);
                }
                // The updated inverse has drifted: confirm the optimum on a fresh one.
                self.invert()?;
                self.compute_duals();
                continue;
            };
            if pivots >= max_pivots {
                return Err(MasterError::Budget);
            }
            from = 0;
            self.ftran(q, &mut w, &mut wb, &mut wr);
            // Harris: the largest step any row allows within the feasibility tolerance, then the largest pivot
            // among the rows that block within it (Bland: the lowest variable index among the tightest).
            let mut theta_max = f64::INFINITY;
            for (wi, xi) in w.iter().zip(&self.xb) {
                if *wi > PIVOT_TOL {
                    theta_max = theta_max.min((xi.max(0.0) + FEAS_TOL) / wi);
                }
            }
            if !theta_max.is_finite() {
                return Err(MasterError::Unbounded);
            }
            let mut leave: Option<usize> = None;
            for i in 0..m {
                if w[i] > PIVOT_TOL && self.xb[i].max(0.0) / w[i] <= theta_max {
                    let better = match leave {
                        None => true,
                        Some(p) if bland => {
                            let (ri, rp) = (self.xb[i].max(0.0) / w[i], self.xb[p].max(0.0) / w[p]);
                            ri < rp - 1e-12 || (ri <= rp + 1e-12 && self.basis[i] < self.basis[p])
                        }
                        Some(p) => w[i] > w[p],
                    };
                    if better {
                        leave = Some(i);
                    }
                }
            }
            let p = leave.ok_or(MasterError::Unbounded)?;
            let theta = self.xb[p].max(0.0) / w[p];
            if theta * d <= 1e-12 * (1.0 + self.objective().abs()) {
                degenerate += 1;
            } else {
                degenerate = 0;
            }
            // Update the basic values, M and the duals.
            for (i, (xi, wi)) in self.xb.iter_mut().zip(&w).enumerate() {
                if i != p {
                    *xi -= theta * wi;
                }
            }
            self.xb[p] = theta;
            self.update(q, p, &wb, w[p]);
            let out = self.basis[p];
            self.basic[out] = false;
            self.basic[q] = true;
            self.basis[p] = q;
            self.compute_duals();
            self.since_invert += 1;
            pivots += 1;
        }
    }
}

/// The inverse of the `k x k` row-major matrix `a` (destroyed) by Gauss-Jordan elimination with partial pivoting.
fn gauss_jordan(a: &mut [f64], k: usize) -> Result<Vec<f64>, MasterError> {
    let mut inv = vec![0.0; k * k];
    for i in 0..k {
        inv[i * k + i] = 1.0;
    }
    for col in 0..k {
        let (p, big) =
            (col..k).map(|r| (r, a[r * k + col].abs())).fold((col, -1.0), |acc, x| if x.1 > acc.1 { x } else { acc });
        if big < SINGULAR_TOL {
            return Err(MasterError::Singular);
        }
        if p != col {
            for j in 0..k {
                a.swap(p * k + j, col * k + j);
                inv.swap(p * k + j, col * k + j);
            }
        }
        let d = 1.0 / a[col * k + col];
        for j in 0..k {
            a[col * k + j] *= d;
            inv[col * k + j] *= d;
        }
        for r in 0..k {
            let f = a[r * k + col];
            if r == col || f == 0.0 {
                continue;
            }
            for j in 0..k {
                a[r * k + j] -= f * a[col * k + j];
                inv[r * k + j] -= f * inv[col * k + j];
            }
        }
    }
    Ok(inv)
}

/// A variable's column.
enum ColumnRef<'a> {
    /// A logical: the unit vector of its row.
    Unit(usize),
    /// A structural's entries.
    Sparse(&'a [(usize, f64)]),
}

#[cfg(test)]
mod tests {
    use super::*;
    use highs::{ColProblem, HighsModelStatus, Sense};
    use rand::{Rng, SeedableRng};

    /// A random column of a random tenant (of `n`, after `k` packing rows): each packing row with probability
    /// `density`, coefficients 1 to `largest`, worth their sum times 10 to `worth`, and the tenant's convexity row.
    fn random_column(
        rng: &mut rand::rngs::StdRng,
        (k, n): (usize, usize),
        density: f64,
        largest: u8,
        worth: f64,
    ) -> (f64, Vec<(usize, f64)>) {
        let i = rng.random_range(0..n);
        let mut e: Vec<(usize, f64)> = Vec::new();
        for r in 0..k {
            if rng.random_bool(density) {
                e.push((r, f64::from(rng.random_range(1..=largest))));
            }
        }
        let value = e.iter().map(|(_, v)| v).sum::<f64>() * rng.random_range(10.0..worth);
        e.push((k + i, 1.0));
        (value, e)
    }

    /// A random master like column generation's: `k` packing rows with small integer coefficients, `n` convexity
    /// rows, each column in one convexity row; columns added in batches, re-solved after each.
    fn random_master(seed: u64, k: usize, n: usize, batches: usize, per: usize) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let b: Vec<f64> = (0..k).map(|_| f64::from(rng.random_range(0..8u8))).chain((0..n).map(|_| 1.0)).collect();
        let eq: Vec<bool> = (0..k + n).map(|r| r >= k).collect();
        let mut lp = MasterLp::new(b.clone(), &eq, 1e9);
        let mut cols: Vec<(f64, Vec<(usize, f64)>)> = Vec::new();
        // An empty column per tenant, as "nothing" is in the masters column generation builds.
        for i in 0..n {
            cols.push((0.0, vec![(k + i, 1.0)]));
            lp.add_column(0.0, &[(k + i, 1.0)]);
        }
        for _ in 0..batches {
            for _ in 0..per {
                let (value, e) = random_column(&mut rng, (k, n), 0.4, 4, 1000.0);
                lp.add_column(value, &e);
                cols.push((value, e));
            }
            lp.solve(100_000).unwrap();
            // The same LP through HiGHS.
            let mut pr = ColProblem::new();
            let rows: Vec<_> =
                b.iter().zip(&eq).map(|(&v, &e)| if e { pr.add_row(v..=v) } else { pr.add_row(..=v) }).collect();
            for (c, e) in &cols {
                pr.add_column(*c, 0.0.., e.iter().map(|&(r, v)| (rows[r], v)));
            }
            let mut model = pr.optimise(Sense::Maximise);
            model.make_quiet();
            let solved = model.solve();
            assert_eq!(solved.status(), HighsModelStatus::Optimal);
            let want = solved.objective_value();
            let got = lp.objective();
            // Within the tolerances of both solvers: relative to the objective and to the largest column value.
            let cmax = cols.iter().fold(0.0f64, |a, (c, _)| a.max(c.abs()));
            let tol = 1e-6 * (1.0 + want.abs()) + 1e-8 * cmax;
            assert!((got - want).abs() <= tol, "seed {seed}: {got} vs HiGHS {want}");
            // Duals: non-negative on packing rows, no column with a positive reduced cost, and the dual objective
            // equals the primal one (strong duality).
            let y = lp.duals();
            assert!(y[..k].iter().all(|v| *v >= -1e-7), "seed {seed}: negative packing dual");
            for (c, e) in &cols {
                let rc = c - e.iter().map(|&(r, v)| y[r] * v).sum::<f64>();
                assert!(rc <= 1e-6 * (1.0 + c.abs()), "seed {seed}: reduced cost {rc}");
            }
            let dual_obj: f64 = y.iter().zip(&b).map(|(y, b)| y * b).sum();
            assert!((dual_obj - got).abs() <= tol, "seed {seed}: dual {dual_obj} vs {got}");
            // Primal: feasible, and worth the objective.
            let x = lp.primal();
            let mut used = vec![0.0; k + n];
            let mut value = 0.0;
            for ((c, e), xv) in cols.iter().zip(&x) {
                value += c * xv;
                e.iter().for_each(|&(r, v)| used[r] += v * xv);
            }
            assert!((value - got).abs() <= tol, "seed {seed}: x worth {value} vs {got}");
            for r in 0..k + n {
                if eq[r] {
                    assert!((used[r] - b[r]).abs() <= 1e-7, "seed {seed}: convexity row {r} at {}", used[r]);
                } else {
                    assert!(used[r] <= b[r] + 1e-7, "seed {seed}: row {r} at {} > {}", used[r], b[r]);
                }
            }
        }
    }

    #[test]
    fn matches_highs_on_random_masters() {
        for seed in 0..40 {
            random_master(seed, 72, 5, 6, 20);
        }
        for seed in 40..50 {
            random_master(seed, 180, 7, 4, 40);
        }
    }

    /// Pivot by pivot, the updated block inverse, basic values and duals agree with those rebuilt from scratch,
    /// through every kind of pivot (structurals and logicals entering and leaving, the block growing and
    /// shrinking).
    #[test]
    fn updates_agree_with_a_fresh_inverse_at_every_pivot() {
        let mut kinds = [0usize; 4];
        for seed in 0..30 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (k, n) = (24, 4);
            let b: Vec<f64> = (0..k).map(|_| f64::from(rng.random_range(0..6u8))).chain((0..n).map(|_| 1.0)).collect();
            let eq: Vec<bool> = (0..k + n).map(|r| r >= k).collect();
            let mut lp = MasterLp::new(b, &eq, 1e9);
            for i in 0..n {
                lp.add_column(0.0, &[(k + i, 1.0)]);
            }
            for _batch in 0..5 {
                for _ in 0..25 {
                    let (value, e) = random_column(&mut rng, (k, n), 0.3, 3, 100.0);
                    lp.add_column(value, &e);
                }
                loop {
                    let before = lp.basis.clone();
                    let done = match lp.solve(1) {
                        Ok(()) => true,
                        Err(MasterError::Budget) => false,
                        Err(e) => panic!("seed {seed}: {e}"),
                    };
                    if let Some(p) = (0..lp.m).find(|&p| before[p] != lp.basis[p]) {
                        kinds[usize::from(before[p] >= lp.m) * 2 + usize::from(lp.basis[p] >= lp.m)] += 1;
                    }
                    for (c, &pos) in lp.slots.iter().enumerate() {
                        assert_eq!(lp.var_slot[lp.basis[pos] - lp.m], c, "seed {seed}: structural of slot {c}");
                    }
                    assert_eq!(lp.var_slot.iter().filter(|v| **v != NONE).count(), lp.slots.len());
                    let mut fresh = lp.clone();
                    fresh.invert().unwrap();
                    fresh.compute_duals();
                    let scale = 1e-7;
                    for (x, f) in lp.xb.iter().zip(&fresh.xb) {
                        assert!((x - f).abs() <= scale * (1.0 + f.abs()), "seed {seed}: basic value {x} vs {f}");
                    }
                    for (x, f) in lp.y.iter().zip(&fresh.y) {
                        assert!((x - f).abs() <= scale * (1.0 + f.abs()), "seed {seed}: dual {x} vs {f}");
                    }
                    let (mut w, mut wb, mut fw, mut fwb) =
                        (vec![0.0; lp.m], vec![0.0; lp.m], vec![0.0; lp.m], vec![0.0; lp.m]);
                    let mut wr = vec![0.0; lp.m];
                    for j in 0..lp.cost.len() {
                        lp.ftran(j, &mut w, &mut wb, &mut wr);
                        // B w = a_j.
                        let mut residual = vec![0.0; lp.m];
                        match lp.column(j) {
                            ColumnRef::Unit(r) => residual[r] -= 1.0,
                            ColumnRef::Sparse(e) => e.iter().for_each(|&(r, v)| residual[r] -= v),
                        }
                        for (&var, &x) in lp.basis.iter().zip(&w) {
                            match lp.column(var) {
                                ColumnRef::Unit(r) => residual[r] += x,
                                ColumnRef::Sparse(e) => e.iter().for_each(|&(r, v)| residual[r] += v * x),
                            }
                        }
                        assert!(residual.iter().all(|v| v.abs() <= 1e-7), "seed {seed}: B B^-1 a_{j} != a_{j}");
                        fresh.ftran(j, &mut fw, &mut fwb, &mut wr);
                        for (x, f) in w.iter().zip(&fw) {
                            assert!((x - f).abs() <= scale * (1.0 + f.abs()), "seed {seed}: B^-1 a_{j}: {x} vs {f}");
                        }
                    }
                    if done {
                        break;
                    }
                }
            }
        }
        // Structural in for a logical, logical in for a structural, and the swaps of like for like all happened.
        assert!(
            kinds.iter().all(|c| *c > 0),
            "pivot kinds seen (logical>logical, logical>structural, structural>logical, structural>structural): {kinds:?}"
        );
    }

    #[test]
    fn degenerate_masters_terminate() {
        // Every packing row at zero: every pivot is degenerate, only the empty columns can carry the convexity rows.
        let k = 20;
        let n = 3;
        let b: Vec<f64> = std::iter::repeat_n(0.0, k).chain(std::iter::repeat_n(1.0, n)).collect();
        let eq: Vec<bool> = (0..k + n).map(|r| r >= k).collect();
        let mut lp = MasterLp::new(b, &eq, 1e9);
        for i in 0..n {
            lp.add_column(0.0, &[(k + i, 1.0)]);
            for r in 0..k {
                lp.add_column(10.0 + r as f64, &[(r, 1.0), ((r + 1) % k, 2.0), (k + i, 1.0)]);
            }
        }
        lp.solve(10_000).unwrap();
        assert!(lp.objective().abs() < 1e-9);
        assert!(lp.primal().iter().all(|x| *x >= 0.0));
    }

    #[test]
    fn gives_up_on_the_pivot_budget() {
        let b = vec![4.0, 1.0];
        let mut lp = MasterLp::new(b, &[false, true], 1e9);
        lp.add_column(3.0, &[(0, 2.0), (1, 1.0)]);
        assert_eq!(lp.solve(0), Err(MasterError::Budget));
        lp.solve(10).unwrap();
        assert!((lp.objective() - 3.0).abs() < 1e-12);
        assert_eq!(lp.primal(), vec![1.0]);
        assert!((lp.duals()[1] - 3.0).abs() < 1e-12);
    }
}
