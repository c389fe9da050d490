//! The restricted master LP of column generation ([`crate::level2::cg`]): a small dense revised primal simplex.
//!
//! The master is `max c.x` subject to packing rows `A x <= b` (`b >= 0`) and convexity rows `sum x = 1`, `x >= 0`,
//! with at most a few hundred rows and columns, re-solved after every pricing round with a handful of new columns.
//! HiGHS solved it in about 250 microseconds a call on the Azure Functions 2019 day, almost all of it per-call set-up
//! (matrix checks, row-wise copies, scaling, KKT reports), which made the master LP half of a planning round. This
//! solver keeps what a re-solve needs between calls instead: the basis, its dense inverse and the basic values. A
//! new column enters at zero, so the previous basis stays primal feasible and the next solve starts from it.
//!
//! - Every row has a logical variable: a slack (cost 0) on a packing row, an artificial (cost `-penalty`) on a
//!   convexity row. The logicals are the first basis, so no phase 1 is needed; the artificials leave as soon as
//!   real columns can carry the convexity rows (the big-M method, as the master had with HiGHS).
//! - Dantzig pricing on reduced costs scaled by the column's norm; Harris's two-pass ratio test; Bland's rule
//!   after a run of degenerate pivots (no cycling). The inverse is updated at each pivot and rebuilt every
//!   [`REINVERT_EVERY`] pivots, and at an optimum whose basic values or duals no longer solve their systems to
//!   1e-9, or whose basic values are negative beyond the tolerance (the optimum is then confirmed on the fresh
//!   inverse). A rebuild inverts only the block of the basic
//!   structural columns: basic slacks are unit columns, and most of a master's slacks are basic.
//! - A solve that exceeds its pivot budget, meets a singular basis or fails the final check returns an error: the
//!   caller falls back to HiGHS. Nothing it returns can make a plan or a bound wrong: plans are checked for
//!   feasibility and bounds are Lagrangian bounds, valid at any prices; only the speed of convergence depends on it.

/// Pivots between rebuilds of the basis inverse.
pub const REINVERT_EVERY: usize = 50;

/// Relative tolerance on reduced costs (relative to `1 + |c_j|`).
const OPT_TOL: f64 = 1e-9;
/// Primal feasibility tolerance (Harris's ratio test).
const FEAS_TOL: f64 = 1e-9;
/// Smallest pivot element accepted in the ratio test.
const PIVOT_TOL: f64 = 1e-9;
/// Smallest pivot accepted when inverting the basis.
const SINGULAR_TOL: f64 = 1e-11;

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
    /// `1 / sqrt(1 + |a_j|^2)` per variable, the pricing scale.
    scale: Vec<f64>,
    /// The basic variable of each basis position.
    basis: Vec<usize>,
    /// Whether each variable is basic.
    basic: Vec<bool>,
    /// Dense basis inverse, row-major `m x m`.
    binv: Vec<f64>,
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
        let mut binv = vec![0.0; m * m];
        for i in 0..m {
            binv[i * m + i] = 1.0;
        }
        MasterLp {
            m,
            xb: b.clone(),
            b,
            cost,
            entries: Vec::new(),
            start: vec![0],
            scale: vec![std::f64::consts::FRAC_1_SQRT_2; m],
            basis: (0..m).collect(),
            basic: vec![true; m],
            binv,
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
        self.cost.push(cost);
        self.scale.push(1.0 / (1.0 + norm).sqrt());
        self.basic.push(false);
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

    fn compute_duals(&mut self) {
        let m = self.m;
        self.y.iter_mut().for_each(|v| *v = 0.0);
        for (i, &v) in self.basis.iter().enumerate() {
            let c = self.cost[v];
            if c != 0.0 {
                for (yj, bij) in self.y.iter_mut().zip(&self.binv[i * m..(i + 1) * m]) {
                    *yj += c * bij;
                }
            }
        }
    }

    /// Rebuilds the inverse of the basis and the basic values. A basic logical is a unit column, so with the rows
    /// it covers (`S`) and the others (`T`, as many as there are basic structurals) the basis is block-triangular:
    /// only the structurals' `T x T` block is inverted (Gauss-Jordan with partial pivoting), and each logical's row
    /// of the inverse follows from it. Masters keep most of their slacks basic, so this is far cheaper than
    /// inverting the whole `m x m` basis.
    fn invert(&mut self) -> Result<(), MasterError> {
        let m = self.m;
        // covered[r]: the basis position of the logical of row r, where it is basic.
        let mut covered = vec![usize::MAX; m];
        let mut structural = Vec::new();
        for (i, &v) in self.basis.iter().enumerate() {
            if v < m {
                covered[v] = i;
            } else {
                structural.push(i);
            }
        }
        let free: Vec<usize> = (0..m).filter(|r| covered[*r] == usize::MAX).collect();
        let k = structural.len();
        debug_assert_eq!(k, free.len(), "each basic logical covers its own row");
        let mut local = vec![usize::MAX; m];
        for (a, &r) in free.iter().enumerate() {
            local[r] = a;
        }
        let mut a = vec![0.0; k * k];
        for (c, &pos) in structural.iter().enumerate() {
            if let ColumnRef::Sparse(e) = self.column(self.basis[pos]) {
                for &(r, v) in e {
                    if local[r] != usize::MAX {
                        a[local[r] * k + c] = v;
                    }
                }
            }
        }
        let inv = gauss_jordan(&mut a, k)?;
        // A structural's row: its row of the block's inverse, on the rows T.
        self.binv.iter_mut().for_each(|v| *v = 0.0);
        for (c, &pos) in structural.iter().enumerate() {
            let row = &mut self.binv[pos * m..(pos + 1) * m];
            for (a_row, &r) in free.iter().enumerate() {
                row[r] = inv[c * k + a_row];
            }
        }
        // A logical's row (it covers row r): e_r minus the structurals' rows weighted by their entries in row r.
        for (r, &i) in covered.iter().enumerate() {
            if i != usize::MAX {
                self.binv[i * m + r] = 1.0;
            }
        }
        let mut tmp = vec![0.0; k];
        for &pos in &structural {
            let j = self.basis[pos] - m;
            for (t, &r) in tmp.iter_mut().zip(&free) {
                *t = self.binv[pos * m + r];
            }
            for &(r, v) in &self.entries[self.start[j]..self.start[j + 1]] {
                let i = covered[r];
                if i == usize::MAX {
                    continue;
                }
                let row = &mut self.binv[i * m..(i + 1) * m];
                for (t, &fr) in tmp.iter().zip(&free) {
                    row[fr] -= v * t;
                }
            }
        }
        for i in 0..m {
            let row = &self.binv[i * m..(i + 1) * m];
            self.xb[i] = row.iter().zip(&self.b).map(|(r, b)| r * b).sum();
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

    /// `B^-1 a_j`.
    fn ftran(&self, j: usize, w: &mut [f64]) {
        let m = self.m;
        match self.column(j) {
            ColumnRef::Unit(r) => (0..m).for_each(|i| w[i] = self.binv[i * m + r]),
            ColumnRef::Sparse(e) => {
                // Four rows at a time: four independent sums instead of one chain of dependent additions (each
                // row's sum still adds its terms in entry order, from -0.0 as `Iterator::sum` does: the same bits).
                let mut chunks = w.chunks_exact_mut(4);
                let mut i = 0;
                for wi in &mut chunks {
                    let rows = &self.binv[i * m..(i + 4) * m];
                    let (r0, rest) = rows.split_at(m);
                    let (r1, rest) = rest.split_at(m);
                    let (r2, r3) = rest.split_at(m);
                    let mut acc = [-0.0f64; 4];
                    for &(r, v) in e {
                        acc[0] += r0[r] * v;
                        acc[1] += r1[r] * v;
                        acc[2] += r2[r] * v;
                        acc[3] += r3[r] * v;
                    }
                    wi.copy_from_slice(&acc);
                    i += 4;
                }
                for wi in chunks.into_remainder() {
                    let row = &self.binv[i * m..(i + 1) * m];
                    *wi = e.iter().map(|&(r, v)| row[r] * v).sum();
                    i += 1;
                }
            }
        }
    }

    /// The entering variable among those from `from` on: the largest scaled reduced cost, or under Bland's rule
    /// the first improving one. Structurals are priced four at a time ([`MasterLp::dot_y4`]), the last few one by one.
    fn choose_entering(&self, bland: bool, from: usize) -> Option<(usize, f64)> {
        let mut best: Option<(usize, f64, f64)> = None;
        // Whether `j`, whose column's dot product with the duals is `dot`, ends the search (Bland's rule).
        let mut consider = |j: usize, dot: f64| -> bool {
            let d = self.cost[j] - dot;
            if d <= OPT_TOL * (1.0 + self.cost[j].abs()) {
                return false;
            }
            if bland {
                best = Some((j, d, 0.0));
                return true;
            }
            let score = d * self.scale[j];
            if best.is_none_or(|(_, _, s)| score > s) {
                best = Some((j, d, score));
            }
            false
        };
        let n = self.cost.len();
        for j in from..self.m.min(n) {
            if !self.basic[j] && consider(j, self.y[j]) {
                return best.map(|(j, d, _)| (j, d));
            }
        }
        let mut batch = [0usize; 4];
        let mut held = 0;
        for j in from.max(self.m)..n {
            if self.basic[j] {
                continue;
            }
            batch[held] = j;
            held += 1;
            if held == 4 {
                held = 0;
                let dots = self.dot_y4(batch);
                if batch.iter().zip(dots).any(|(&j, dot)| consider(j, dot)) {
                    return best.map(|(j, d, _)| (j, d));
                }
            }
        }
        for &j in &batch[..held] {
            if consider(j, self.dot_y(j)) {
                break;
            }
        }
        best.map(|(j, d, _)| (j, d))
    }

    /// [`MasterLp::dot_y`] of four structurals at once: four independent sums (each still adds its column's terms
    /// in entry order, from -0.0 as `Iterator::sum` does: the same bits as four calls).
    fn dot_y4(&self, js: [usize; 4]) -> [f64; 4] {
        let e = js.map(|j| &self.entries[self.start[j - self.m]..self.start[j - self.m + 1]]);
        let common = e.iter().map(|c| c.len()).min().unwrap_or(0);
        let y = &self.y;
        let mut acc = [-0.0f64; 4];
        for (((a, b), c), d) in e[0].iter().zip(e[1]).zip(e[2]).zip(e[3]) {
            acc[0] += y[a.0] * a.1;
            acc[1] += y[b.0] * b.1;
            acc[2] += y[c.0] * c.1;
            acc[3] += y[d.0] * d.1;
        }
        for k in 0..4 {
            for &(r, v) in &e[k][common..] {
                acc[k] += y[r] * v;
            }
        }
        acc
    }

    /// Solves from the current basis, with at most `max_pivots` pivots.
    ///
    /// # Errors
    /// [`MasterError`] where it gives up; the LP is then left in an unspecified (but valid) basis.
    pub fn solve(&mut self, max_pivots: usize) -> Result<(), MasterError> {
        let m = self.m;
        let mut w = vec![0.0; m];
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
            let Some((q, d)) = self.choose_entering(bland, from) else {
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
            self.ftran(q, &mut w);
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
            // Update the basic values, the inverse (eliminate column q's direction) and the duals.
            for (i, (xi, wi)) in self.xb.iter_mut().zip(&w).enumerate() {
                if i != p {
                    *xi -= theta * wi;
                }
            }
            self.xb[p] = theta;
            let wp = w[p];
            let (before, rest) = self.binv.split_at_mut(p * m);
            let (prow, after) = rest.split_at_mut(m);
            prow.iter_mut().for_each(|v| *v /= wp);
            for (i, row) in before.chunks_exact_mut(m).enumerate() {
                let f = w[i];
                if f != 0.0 {
                    row.iter_mut().zip(prow.iter()).for_each(|(r, pv)| *r -= f * pv);
                }
            }
            for (k, row) in after.chunks_exact_mut(m).enumerate() {
                let f = w[p + 1 + k];
                if f != 0.0 {
                    row.iter_mut().zip(prow.iter()).for_each(|(r, pv)| *r -= f * pv);
                }
            }
            // y' = y + d * (row p of the new inverse).
            for (yj, pv) in self.y.iter_mut().zip(prow.iter()) {
                *yj += d * pv;
            }
            let out = self.basis[p];
            self.basic[out] = false;
            self.basic[q] = true;
            self.basis[p] = q;
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
                let i = rng.random_range(0..n);
                let mut e: Vec<(usize, f64)> = Vec::new();
                for r in 0..k {
                    if rng.random_bool(0.4) {
                        e.push((r, f64::from(rng.random_range(1..5u8))));
                    }
                }
                let value = e.iter().map(|(_, v)| v).sum::<f64>() * rng.random_range(10.0..1000.0);
                e.push((k + i, 1.0));
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

    /// The interleaved sums of `ftran` and `dot_y4` give the bits of the plain entry-order sums they replace.
    #[test]
    fn interleaved_sums_match_the_plain_sums_bit_for_bit() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for m in [1, 3, 4, 5, 9, 75] {
            let b = vec![1.0; m];
            let mut lp = MasterLp::new(b, &vec![false; m], 1e9);
            for _ in 0..9 {
                let mut e: Vec<(usize, f64)> = Vec::new();
                for r in 0..m {
                    if rng.random_bool(0.5) {
                        e.push((r, if rng.random_bool(0.2) { -0.0 } else { rng.random_range(-3.0..3.0) }));
                    }
                }
                lp.add_column(1.0, &e);
            }
            let small = |rng: &mut rand::rngs::StdRng| match rng.random_range(0..4) {
                0 => 0.0,
                1 => -0.0,
                _ => rng.random_range(-1e3..1e3) * 1e-3f64.powi(rng.random_range(0..4)),
            };
            lp.binv = (0..m * m).map(|_| small(&mut rng)).collect();
            lp.y = (0..m).map(|_| small(&mut rng)).collect();
            let mut w = vec![0.0; m];
            for j in 0..lp.cost.len() {
                lp.ftran(j, &mut w);
                for (i, wi) in w.iter().enumerate() {
                    let row = &lp.binv[i * m..(i + 1) * m];
                    let plain: f64 = match lp.column(j) {
                        ColumnRef::Unit(r) => row[r],
                        ColumnRef::Sparse(e) => e.iter().map(|&(r, v)| row[r] * v).sum(),
                    };
                    assert_eq!(wi.to_bits(), plain.to_bits(), "m {m}, column {j}, row {i}");
                }
            }
            for first in m..lp.cost.len() - 3 {
                let js = [first, first + 1, first + 2, first + 3];
                for (j, dot) in js.iter().zip(lp.dot_y4(js)) {
                    assert_eq!(dot.to_bits(), lp.dot_y(*j).to_bits(), "m {m}, column {j}");
                }
            }
        }
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
