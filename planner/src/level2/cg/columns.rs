//! Columns and the master's rows: a [`Column`] is one tenant's plan over the horizon, [`Columns`] the master's
//! columns, [`RowIndex`] the layout of its rows.

use std::cell::OnceCell;

use crate::level2::problem::{GpuProblem, RetrainOption, Usage};

/// One tenant's plan over the horizon.
#[derive(Debug, Clone)]
pub(super) struct Column {
    /// The tenant whose plan it is.
    pub(super) tenant: usize,
    /// Its inference profile per slot (`None`: no instance).
    pub(super) inference: Vec<Option<usize>>,
    /// Per slot, whether the slot's new inference instance is pre-initialised.
    pub(super) pre: Vec<bool>,
    /// Its retraining option (`None`: no retraining).
    pub(super) retrain: Option<RetrainOption>,
    /// Its goodput plus its retraining's tail value.
    pub(super) value: f64,
    /// Its coefficients in the master's rows, computed once ([`Column::rows`]).
    pub(super) coefficients: OnceCell<Vec<(usize, f64)>>,
}

impl PartialEq for Column {
    fn eq(&self, other: &Self) -> bool {
        self.tenant == other.tenant
            && self.retrain == other.retrain
            && self.inference == other.inference
            && self.pre == other.pre
    }
}

/// The master's columns, in the order they joined it, with an index by content: a column priced again is
/// recognised by hash instead of by comparing it with every column.
#[derive(Default)]
pub(super) struct Columns {
    list: Vec<Column>,
    by_hash: std::collections::HashMap<u64, Vec<usize>>,
}

impl Columns {
    fn key(c: &Column) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::hash::DefaultHasher::new();
        (c.tenant, &c.inference, &c.pre, c.retrain).hash(&mut h);
        h.finish()
    }

    /// Adds `c` unless an equal column is already there; whether it was added.
    pub(super) fn insert(&mut self, c: Column) -> bool {
        let same = self.by_hash.entry(Columns::key(&c)).or_default();
        if same.iter().any(|&k| self.list[k] == c) {
            return false;
        }
        same.push(self.list.len());
        self.list.push(c);
        true
    }

    /// The column added last.
    pub(super) fn last(&self) -> &Column {
        self.list.last().expect("a column was just added")
    }
}

impl std::ops::Deref for Columns {
    type Target = [Column];
    fn deref(&self) -> &[Column] {
        &self.list
    }
}

/// Row layout: per slot `K` usage rows then `K` room rows; then one convexity row per tenant. A block of `K` rows
/// is compute slices, memory slices, instances, then one row per profile whose maximum count the first three do
/// not already imply (on the catalogued GPUs, none: the master LP has a third of the rows it would otherwise).
pub(super) struct RowIndex {
    /// Rows in a block.
    pub(super) k: usize,
    slots: usize,
    /// Offset of profile `p`'s own row within a block, where it has one.
    pub(super) own: Vec<Option<usize>>,
    /// Whether any profile has its own row.
    pub(super) any_own: bool,
}

impl RowIndex {
    /// The layout of `pb`'s master rows.
    pub(super) fn new(pb: &GpuProblem) -> RowIndex {
        let mut k = 3;
        let own: Vec<Option<usize>> = (0..pb.profiles.len())
            .map(|p| {
                let beyond = u32::from(pb.max_count(p)) + 1;
                let implied = u32::from(pb.compute_slices(p)) * beyond > 7
                    || u32::from(pb.memory_slices(p)) * beyond > 8
                    || beyond > 7;
                (!implied).then(|| {
                    k += 1;
                    k - 1
                })
            })
            .collect();
        let any_own = own.iter().any(Option::is_some);
        RowIndex { k, slots: pb.slots, own, any_own }
    }

    /// The first of slot `t`'s usage rows.
    pub(super) fn usage(&self, t: usize) -> usize {
        t * 2 * self.k
    }
    /// The first of slot `t`'s room rows (pre-initialisation beside what the previous slot holds).
    pub(super) fn room(&self, t: usize) -> usize {
        t * 2 * self.k + self.k
    }
    /// Tenant `i`'s convexity row (`convex(0)`: the number of capacity rows).
    pub(super) fn convex(&self, i: usize) -> usize {
        self.slots * 2 * self.k + i
    }
}

/// Adds `profile`'s use of a block of `K` rows starting at `base` to the dense row sums `dense`.
fn block(pb: &GpuProblem, l: &RowIndex, base: usize, p: usize, dense: &mut [f64]) {
    dense[base] += f64::from(pb.compute_slices(p));
    dense[base + 1] += f64::from(pb.memory_slices(p));
    dense[base + 2] += 1.0;
    if let Some(own) = l.own[p] {
        dense[base + own] += 1.0;
    }
}

impl Column {
    /// Profiles this column holds in slot `t` (inference, retraining).
    fn held(&self, t: usize) -> impl Iterator<Item = usize> + '_ {
        self.inference[t].into_iter().chain(self.retrain.filter(|o| o.active(t)).map(|o| o.profile))
    }

    /// Its coefficients in the master's rows, in row order, the convexity row last.
    pub(super) fn rows(&self, pb: &GpuProblem, l: &RowIndex) -> &[(usize, f64)] {
        self.coefficients.get_or_init(|| self.compute_rows(pb, l))
    }

    fn compute_rows(&self, pb: &GpuProblem, l: &RowIndex) -> Vec<(usize, f64)> {
        // Summed densely over the capacity rows (a row can be hit by inference, retraining and pre-initialisation),
        // then listed in row order.
        let mut dense = vec![0.0; l.convex(0)];
        for t in 0..pb.slots {
            for p in self.held(t) {
                block(pb, l, l.usage(t), p, &mut dense);
                if t + 1 < pb.slots {
                    block(pb, l, l.room(t + 1), p, &mut dense);
                }
            }
            if self.pre[t]
                && let Some(p) = self.inference[t]
            {
                block(pb, l, l.room(t), p, &mut dense);
            }
        }
        let mut merged: Vec<(usize, f64)> = Vec::with_capacity(dense.iter().filter(|c| **c != 0.0).count() + 1);
        merged.extend(dense.iter().enumerate().filter(|(_, c)| **c != 0.0).map(|(r, c)| (r, *c)));
        merged.push((l.convex(self.tenant), 1.0));
        merged
    }
}

/// The capacity rows' limits: a whole GPU in every row, less what runs now in slot 0's room rows.
pub(super) fn row_limits(pb: &GpuProblem, l: &RowIndex, base: &Usage) -> Vec<f64> {
    let mut limits = Vec::with_capacity(pb.slots * 2 * l.k + pb.tenants.len());
    for t in 0..pb.slots {
        for room in [false, true] {
            let used = if room && t == 0 {
                base.clone()
            } else {
                Usage { compute: 0, memory: 0, instances: 0, counts: vec![0; pb.profiles.len()] }
            };
            limits.push(7.0 - f64::from(used.compute));
            limits.push(8.0 - f64::from(used.memory));
            limits.push(7.0 - f64::from(used.instances));
            for p in 0..pb.profiles.len() {
                if l.own[p].is_some() {
                    limits.push(f64::from(pb.max_count(p)) - f64::from(used.counts[p]));
                }
            }
        }
    }
    limits
}

/// A plan: one column per tenant, `None` where a tenant has none yet (or none fits).
pub(super) type Plan = Vec<Option<Column>>;
