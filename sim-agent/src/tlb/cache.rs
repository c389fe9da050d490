//! [`TlbModel`]: the entry point for the workload executor. It owns the parameters, the seed and the run length,
//! and caches one report per (mix, mode), so a replay that meets the same co-located set again pays nothing.
//!
//! A mix is an unordered set of tenant streams (a stream carries its instance size, so the layout is part of the
//! key): the model simulates the streams in a canonical order (sorted by their parameters) and hands back the
//! report with tenants in the caller's order. The same set in any order therefore gets the same numbers.

use std::collections::HashMap;
use std::sync::Arc;

use super::sim::{TlbReport, simulate};
use super::stream::SpecKey;
use super::{DEFAULT_ACCESSES, TenantStreamSpec, TlbError, TlbMode, TlbParams};

/// Cache key: the canonically ordered mix and the mode (seed, length and parameters belong to the model).
type MixKey = (Vec<SpecKey>, TlbMode);

/// The cached TLB interference model.
#[derive(Debug, Clone)]
pub struct TlbModel {
    params: TlbParams,
    seed: u64,
    accesses: u64,
    reports: HashMap<MixKey, Arc<TlbReport>>,
}

impl TlbModel {
    /// A model with explicit parameters, seed and co-located run length (accesses per simulation).
    pub fn new(params: TlbParams, seed: u64, accesses: u64) -> Result<Self, TlbError> {
        params.validate()?;
        if accesses == 0 {
            return Err(TlbError::NoAccesses);
        }
        Ok(TlbModel { params, seed, accesses, reports: HashMap::new() })
    }

    /// The paper's hierarchy ([`TlbParams::default`]) and [`DEFAULT_ACCESSES`] accesses per simulation.
    pub fn with_seed(seed: u64) -> Self {
        TlbModel { params: TlbParams::default(), seed, accesses: DEFAULT_ACCESSES, reports: HashMap::new() }
    }

    /// The hierarchy simulated.
    pub fn params(&self) -> &TlbParams {
        &self.params
    }

    /// The seed of every simulation.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Co-located accesses per simulation.
    pub fn accesses(&self) -> u64 {
        self.accesses
    }

    /// Number of cached reports.
    pub fn len(&self) -> usize {
        self.reports.len()
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.reports.is_empty()
    }

    /// Forgets every cached report.
    pub fn clear(&mut self) {
        self.reports.clear();
    }

    /// The report of `tenants` sharing one GPU's L3 TLB in `mode`, tenants in the order given: per-tenant
    /// slowdown (`report.tenants[i].slowdown`, or [`TlbReport::slowdowns`]) and hit rates, overall hit rate and
    /// sub-entry utilisation. Simulated on the first request for this set and mode, then served from the cache.
    pub fn slowdowns(&mut self, tenants: &[TenantStreamSpec], mode: TlbMode) -> Result<Arc<TlbReport>, TlbError> {
        let mut order: Vec<usize> = (0..tenants.len()).collect();
        order.sort_by_key(|&i| tenants[i].key());
        let key: MixKey = (order.iter().map(|&i| tenants[i].key()).collect(), mode);
        let canonical = match self.reports.get(&key) {
            Some(report) => Arc::clone(report),
            None => {
                let sorted: Vec<TenantStreamSpec> = order.iter().map(|&i| tenants[i]).collect();
                let report = Arc::new(simulate(&self.params, &sorted, mode, self.seed, self.accesses)?);
                self.reports.insert(key, Arc::clone(&report));
                report
            }
        };
        if order.iter().enumerate().all(|(pos, &i)| pos == i) {
            return Ok(canonical);
        }
        // Canonical position of each caller tenant: caller i sits at position p where order[p] == i.
        let mut position = vec![0; order.len()];
        for (p, &i) in order.iter().enumerate() {
            position[i] = p;
        }
        Ok(Arc::new(canonical.permuted(&position)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlb::AccessPattern;

    #[test]
    fn cached_and_order_independent() {
        let mut m = TlbModel::new(TlbParams::default(), 5, 50_000).unwrap();
        let a = TenantStreamSpec::new(AccessPattern::Stride).with_slices(3);
        let b = TenantStreamSpec::new(AccessPattern::Streaming).with_slices(2);
        let ab = m.slowdowns(&[a, b], TlbMode::Baseline).unwrap();
        assert_eq!(m.len(), 1);
        let again = m.slowdowns(&[a, b], TlbMode::Baseline).unwrap();
        assert!(Arc::ptr_eq(&ab, &again) || ab == again);
        let ba = m.slowdowns(&[b, a], TlbMode::Baseline).unwrap();
        assert_eq!(m.len(), 1);
        assert_eq!(ab.tenants[0], ba.tenants[1]);
        assert_eq!(ab.tenants[1], ba.tenants[0]);
        assert_eq!(ba.tenants[0].spec, b);
        m.slowdowns(&[a, b], TlbMode::Star).unwrap();
        assert_eq!(m.len(), 2);
    }
}
