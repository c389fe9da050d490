//! One simulation: the co-located run of a mix, an alone run per tenant, and the report.
//!
//! The co-located run interleaves the tenants' streams (ChaCha8 seeded with the run's seed, tenant `i` chosen with
//! probability `weight_i / sum(weight)`) through private L1/L2 TLBs into one shared L3 TLB and PWC of the requested
//! mode. Each alone run replays tenant `i`'s stream (same seed, as many accesses as it issued co-located) with a
//! baseline L3 and PWC to itself. Slowdown is co-located time over alone time minus one (module doc of
//! [`tlb`](super)). The loop allocates nothing: flat arrays, no maps.

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::private::L1Tlb;
use super::pwc::PageWalkCache;
use super::stream::{StreamGen, mix_seed, tenant_seed};
use super::subentry::{Lookup, SubEntryStats, SubEntryTlb, ratio};
use super::{MAX_TENANTS, TenantStreamSpec, TlbError, TlbMode, TlbParams};

/// What one tenant's accesses did, level by level.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TenantCounts {
    /// Accesses issued.
    pub accesses: u64,
    /// L1 hits.
    pub l1_hits: u64,
    /// L2 hits.
    pub l2_hits: u64,
    /// L3 lookups (L2 misses).
    pub l3_accesses: u64,
    /// L3 hits.
    pub l3_hits: u64,
    /// L3 lookups that found the entry but not the sub-entry.
    pub l3_subentry_misses: u64,
    /// L3 lookups that found no entry.
    pub l3_entry_misses: u64,
    /// L3 lookups that ended on a STAR-shared entry.
    pub l3_shared_lookups: u64,
    /// Page-table levels fetched from memory, summed over walks.
    pub walk_levels: u64,
    /// Cycles spent translating, summed over accesses.
    pub translation_cycles: u64,
}

impl TenantCounts {
    /// L3 hits over L3 lookups (0 without lookups).
    pub fn l3_hit_rate(&self) -> f64 {
        ratio(self.l3_hits, self.l3_accesses)
    }

    /// Time of these accesses, cycles: compute plus translation.
    pub fn cycles(&self, compute_cycles_per_access: f64) -> f64 {
        self.accesses as f64 * compute_cycles_per_access + self.translation_cycles as f64
    }
}

/// One tenant's figures in a co-located set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    /// The stream simulated.
    pub spec: TenantStreamSpec,
    /// Counters of the co-located run.
    pub colocated: TenantCounts,
    /// Counters of the alone run (same stream, baseline L3 to itself).
    pub alone: TenantCounts,
    /// L3 hit rate co-located.
    pub hit_rate: f64,
    /// L3 hit rate alone.
    pub alone_hit_rate: f64,
    /// Time co-located, cycles.
    pub colocated_cycles: f64,
    /// Time alone, cycles.
    pub alone_cycles: f64,
    /// `colocated_cycles / alone_cycles - 1`: 0.4 means 40% slower than alone.
    pub slowdown: f64,
}

impl TenantReport {
    /// The factor to multiply the tenant's latency by (`1 + slowdown`; the executor may clamp it at 1).
    pub fn latency_factor(&self) -> f64 {
        1.0 + self.slowdown
    }
}

/// The figures of one co-located set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TlbReport {
    /// L3 design of the co-located run.
    pub mode: TlbMode,
    /// Seed of the run.
    pub seed: u64,
    /// Accesses of the co-located run (all tenants).
    pub accesses: u64,
    /// Shared L3 hit rate of the co-located run.
    pub hit_rate: f64,
    /// Mean fraction of sub-entries valid in evicted L3 entries; `None` when nothing was evicted.
    pub subentry_utilisation: Option<f64>,
    /// L3 counters of the co-located run.
    pub l3: SubEntryStats,
    /// Mean of the tenants' slowdowns.
    pub mean_slowdown: f64,
    /// Per tenant, in the order given.
    pub tenants: Vec<TenantReport>,
}

impl TlbReport {
    /// Slowdowns in tenant order.
    pub fn slowdowns(&self) -> Vec<f64> {
        self.tenants.iter().map(|t| t.slowdown).collect()
    }

    /// The report with its tenants in another order: `order[i]` is the current index of the new `i`-th tenant.
    pub(crate) fn permuted(&self, order: &[usize]) -> TlbReport {
        TlbReport { tenants: order.iter().map(|&i| self.tenants[i].clone()).collect(), ..self.clone() }
    }
}

/// A tenant's private state during a run.
struct TenantState {
    stream: StreamGen,
    l1: L1Tlb,
    l2: SubEntryTlb,
    counts: TenantCounts,
}

impl TenantState {
    fn new(params: &TlbParams, spec: &TenantStreamSpec, asid: u16, seed: u64) -> Result<Self, TlbError> {
        Ok(TenantState {
            stream: StreamGen::new(spec, asid, seed),
            l1: L1Tlb::new(params.l1_entries),
            l2: SubEntryTlb::new(params.l2_entries, params.l2_ways, TlbMode::Baseline)?,
            counts: TenantCounts::default(),
        })
    }
}

/// The shared part of the hierarchy.
struct Shared {
    l3: SubEntryTlb,
    pwc: PageWalkCache,
}

impl Shared {
    fn new(params: &TlbParams, mode: TlbMode) -> Result<Self, TlbError> {
        Ok(Shared {
            l3: SubEntryTlb::new(params.l3_entries, params.l3_ways, mode)?,
            pwc: PageWalkCache::new(params.pwc_entries, params.pwc_ways)?,
        })
    }
}

/// Cycle costs flattened for the loop.
#[derive(Clone, Copy)]
struct Costs {
    l1: u64,
    l2: u64,
    l3: u64,
    l3_shared: u64,
    walk_level: u64,
}

impl Costs {
    fn new(p: &TlbParams) -> Self {
        Costs {
            l1: u64::from(p.l1_hit_cycles),
            l2: u64::from(p.l1_hit_cycles + p.l2_hit_cycles),
            l3: u64::from(p.l1_hit_cycles + p.l2_hit_cycles + p.l3_hit_cycles),
            l3_shared: u64::from(p.l1_hit_cycles + p.l2_hit_cycles + p.l3_shared_hit_cycles),
            walk_level: u64::from(p.walk_level_cycles),
        }
    }
}

/// One access of tenant `asid`: through its L1 and L2, then the shared L3 and, on a miss, a walk.
#[inline]
fn step(t: &mut TenantState, asid: u16, shared: &mut Shared, costs: Costs) {
    let page = t.stream.next_page();
    let c = &mut t.counts;
    c.accesses += 1;
    if t.l1.access(page) {
        c.l1_hits += 1;
        c.translation_cycles += costs.l1;
        return;
    }
    if t.l2.access(0, page).is_hit() {
        c.l2_hits += 1;
        c.translation_cycles += costs.l2;
        return;
    }
    c.l3_accesses += 1;
    let lookup = shared.l3.access(asid, page);
    let (base, is_shared) = if lookup.shared() { (costs.l3_shared, 1) } else { (costs.l3, 0) };
    c.l3_shared_lookups += is_shared;
    match lookup {
        Lookup::Hit { .. } => {
            c.l3_hits += 1;
            c.translation_cycles += base;
        }
        Lookup::SubEntryMiss { .. } | Lookup::EntryMiss => {
            if matches!(lookup, Lookup::EntryMiss) {
                c.l3_entry_misses += 1;
            } else {
                c.l3_subentry_misses += 1;
            }
            let levels = u64::from(shared.pwc.walk(asid, page));
            c.walk_levels += levels;
            c.translation_cycles += base + levels * costs.walk_level;
        }
    }
}

/// Issue thresholds: tenant `i` is picked when a uniform `u32` is below `thresholds[i]` and not below the previous
/// one; the last threshold is open-ended.
fn thresholds(tenants: &[TenantStreamSpec]) -> Vec<u64> {
    let total: f64 = tenants.iter().map(TenantStreamSpec::weight).sum();
    let mut acc = 0.0;
    let mut out: Vec<u64> = tenants
        .iter()
        .map(|t| {
            acc += t.weight();
            ((acc / total) * 4_294_967_296.0).round() as u64
        })
        .collect();
    if let Some(last) = out.last_mut() {
        *last = u64::MAX;
    }
    out
}

/// Runs the co-located set, returning the tenants' states and the shared L3's counters.
fn run_colocated(
    params: &TlbParams,
    tenants: &[TenantStreamSpec],
    mode: TlbMode,
    seed: u64,
    accesses: u64,
) -> Result<(Vec<TenantCounts>, SubEntryStats), TlbError> {
    let costs = Costs::new(params);
    let mut shared = Shared::new(params, mode)?;
    let mut states = tenants
        .iter()
        .enumerate()
        .map(|(i, spec)| TenantState::new(params, spec, i as u16, tenant_seed(seed, i)))
        .collect::<Result<Vec<_>, _>>()?;
    let thresholds = thresholds(tenants);
    let mut rng = ChaCha8Rng::seed_from_u64(mix_seed(seed));
    for _ in 0..accesses {
        let u = u64::from(rng.next_u32());
        let mut i = 0;
        while u >= thresholds[i] {
            i += 1;
        }
        step(&mut states[i], i as u16, &mut shared, costs);
    }
    Ok((states.into_iter().map(|s| s.counts).collect(), *shared.l3.stats()))
}

/// Runs tenant `index` of a mix alone for `accesses` accesses with a baseline L3.
fn run_alone(
    params: &TlbParams,
    spec: &TenantStreamSpec,
    index: usize,
    seed: u64,
    accesses: u64,
) -> Result<TenantCounts, TlbError> {
    let costs = Costs::new(params);
    let mut shared = Shared::new(params, TlbMode::Baseline)?;
    let mut state = TenantState::new(params, spec, index as u16, tenant_seed(seed, index))?;
    for _ in 0..accesses {
        step(&mut state, index as u16, &mut shared, costs);
    }
    Ok(state.counts)
}

/// Simulates `tenants` sharing one L3 TLB in `mode` for `accesses` interleaved accesses, then each tenant alone,
/// and reports hit rates, sub-entry utilisation and slowdowns. Deterministic in `seed`; the numbers depend on the
/// tenants' order (tenant `i` has address space `i` and stream seed `i`). Costs about `2 x accesses` TLB accesses.
pub fn simulate(
    params: &TlbParams,
    tenants: &[TenantStreamSpec],
    mode: TlbMode,
    seed: u64,
    accesses: u64,
) -> Result<TlbReport, TlbError> {
    params.validate()?;
    if tenants.is_empty() || tenants.len() > MAX_TENANTS {
        return Err(TlbError::TenantCount { got: tenants.len(), max: MAX_TENANTS });
    }
    for (i, t) in tenants.iter().enumerate() {
        t.validate(i)?;
    }
    if accesses == 0 {
        return Err(TlbError::NoAccesses);
    }
    let (colocated, l3) = run_colocated(params, tenants, mode, seed, accesses)?;
    let mut reports = Vec::with_capacity(tenants.len());
    for (i, (spec, co)) in tenants.iter().zip(colocated).enumerate() {
        let alone = run_alone(params, spec, i, seed, co.accesses)?;
        let colocated_cycles = co.cycles(spec.compute_cycles_per_access);
        let alone_cycles = alone.cycles(spec.compute_cycles_per_access);
        let slowdown = if alone_cycles > 0.0 { colocated_cycles / alone_cycles - 1.0 } else { 0.0 };
        reports.push(TenantReport {
            spec: *spec,
            colocated: co,
            alone,
            hit_rate: co.l3_hit_rate(),
            alone_hit_rate: alone.l3_hit_rate(),
            colocated_cycles,
            alone_cycles,
            slowdown,
        });
    }
    let mean_slowdown = reports.iter().map(|t| t.slowdown).sum::<f64>() / reports.len() as f64;
    Ok(TlbReport {
        mode,
        seed,
        accesses,
        hit_rate: l3.hit_rate(),
        subentry_utilisation: l3.subentry_utilisation(),
        l3,
        mean_slowdown,
        tenants: reports,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tlb::AccessPattern;

    #[test]
    fn thresholds_follow_weights() {
        let t = thresholds(&[
            TenantStreamSpec::new(AccessPattern::Stride).with_slices(3),
            TenantStreamSpec::new(AccessPattern::Stride).with_slices(1),
        ]);
        assert_eq!(t, vec![3 << 30, u64::MAX]);
    }

    #[test]
    fn a_tenant_alone_is_not_slowed_down_in_baseline() {
        let spec = [TenantStreamSpec::new(AccessPattern::Random)];
        let r = simulate(&TlbParams::default(), &spec, TlbMode::Baseline, 3, 100_000).unwrap();
        assert_eq!(r.tenants[0].colocated, r.tenants[0].alone);
        assert_eq!(r.tenants[0].slowdown, 0.0);
    }

    #[test]
    fn bad_requests_are_errors() {
        let p = TlbParams::default();
        let ok = [TenantStreamSpec::new(AccessPattern::Stride)];
        assert!(matches!(simulate(&p, &[], TlbMode::Star, 1, 10), Err(TlbError::TenantCount { got: 0, .. })));
        assert!(matches!(simulate(&p, &ok, TlbMode::Star, 1, 0), Err(TlbError::NoAccesses)));
        let bad = [ok[0], ok[0].with_rate(0.0)];
        assert!(matches!(simulate(&p, &bad, TlbMode::Star, 1, 10), Err(TlbError::InvalidTenant { index: 1, .. })));
    }
}
