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

    /// The planner's interference table of `models` in `mode`: for every ordered pair of models with a default
    /// stream ([`TenantStreamSpec::for_model`]), the same model twice included, the latency factor (`1 +
    /// slowdown`, at least 1) of the first when it shares the GPU's L3 TLB with the second. Each pair runs as two
    /// instances of [`PAIR_SLICES`] slices each; with equal slices only the two streams' rates set the interleaving,
    /// so the factor stands for any two instances of one size. A model twice gets the mean of its two streams
    /// (two seeds). Models without a stream are left out (the executor gives them no slowdown either); names are
    /// deduplicated and sorted, so the table does not depend on the order given.
    pub fn pairwise(&mut self, models: &[&str], mode: TlbMode) -> Result<Vec<(String, String, f64)>, TlbError> {
        let mut named: Vec<(&str, TenantStreamSpec)> = models
            .iter()
            .filter_map(|m| TenantStreamSpec::for_model(m).map(|s| (*m, s.with_slices(PAIR_SLICES))))
            .collect();
        named.sort_by(|a, b| a.0.cmp(b.0));
        named.dedup_by(|a, b| a.0 == b.0);
        let mut out = Vec::with_capacity(named.len() * named.len());
        for (i, (a, sa)) in named.iter().enumerate() {
            for (b, sb) in &named[i..] {
                let r = self.slowdowns(&[*sa, *sb], mode)?;
                let (fa, fb) = (r.tenants[0].latency_factor().max(1.0), r.tenants[1].latency_factor().max(1.0));
                if a == b {
                    out.push((a.to_string(), a.to_string(), (fa + fb) / 2.0));
                } else {
                    out.push((a.to_string(), b.to_string(), fa));
                    out.push((b.to_string(), a.to_string(), fb));
                }
            }
        }
        out.sort_by(|x, y| (&x.0, &x.1).cmp(&(&y.0, &y.1)));
        Ok(out)
    }
}

/// Compute slices of each of the two instances [`TlbModel::pairwise`] simulates.
pub const PAIR_SLICES: u8 = 3;

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

    #[test]
    fn pairwise_covers_every_ordered_pair_once_whatever_the_order() {
        let mut m = TlbModel::new(TlbParams::default(), 5, 50_000).unwrap();
        let t = m.pairwise(&["resnet50", "bert_base", "no_such_model", "resnet50"], TlbMode::Baseline).unwrap();
        let pairs: Vec<(&str, &str)> = t.iter().map(|(v, a, _)| (v.as_str(), a.as_str())).collect();
        assert_eq!(
            pairs,
            [
                ("bert_base", "bert_base"),
                ("bert_base", "resnet50"),
                ("resnet50", "bert_base"),
                ("resnet50", "resnet50")
            ]
        );
        assert!(t.iter().all(|(_, _, f)| f.is_finite() && *f >= 1.0), "{t:?}");
        // The same pair simulated directly gives the same factors.
        let (r, b) =
            (TenantStreamSpec::for_model("resnet50").unwrap(), TenantStreamSpec::for_model("bert_base").unwrap());
        let direct = m.slowdowns(&[r.with_slices(PAIR_SLICES), b.with_slices(PAIR_SLICES)], TlbMode::Baseline).unwrap();
        assert_eq!(t[2].2, direct.tenants[0].latency_factor().max(1.0));
        assert_eq!(t[1].2, direct.tenants[1].latency_factor().max(1.0));
        let again = m.pairwise(&["bert_base", "resnet50"], TlbMode::Baseline).unwrap();
        assert_eq!(t, again);
    }
}
