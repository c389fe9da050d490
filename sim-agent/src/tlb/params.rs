//! Geometry and latencies of the modelled translation hierarchy. The defaults are the STAR paper's modelled GPU
//! (Li et al., MICRO 2024, arXiv 2404.18361): L1 16 entries (1 cycle), L2 128 entries 8-way
//! (10 cycles), L3 1024 entries 8-way (40 cycles, 50 on a shared STAR entry), 100 cycles per page-walk level and a
//! 128-entry page-walk cache. Page (64 KB), range (1 MB) and sub-entry count (16) are fixed constants of the module,
//! not parameters, because an entry's valid sub-entries are kept in a 16-bit mask.

use serde::{Deserialize, Serialize};

use super::TlbError;

/// Sizes and latencies of the hierarchy. Cycle counts are GPU core cycles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlbParams {
    /// Entries of each private L1 TLB (fully associative, one 64 KB page each).
    pub l1_entries: u32,
    /// L1 lookup latency.
    pub l1_hit_cycles: u32,
    /// Entries of each private L2 TLB.
    pub l2_entries: u32,
    /// Associativity of the L2 TLB (entries / ways sets, a power of two).
    pub l2_ways: u32,
    /// L2 lookup latency.
    pub l2_hit_cycles: u32,
    /// Entries of the shared L3 TLB.
    pub l3_entries: u32,
    /// Associativity of the L3 TLB (entries / ways sets, a power of two).
    pub l3_ways: u32,
    /// L3 lookup latency on an exclusive entry or a miss.
    pub l3_hit_cycles: u32,
    /// L3 lookup latency when the matching entry is shared by two bases (STAR).
    pub l3_shared_hit_cycles: u32,
    /// Latency of one page-table level fetched from memory during a walk (4 levels).
    pub walk_level_cycles: u32,
    /// Entries of the shared page-walk cache.
    pub pwc_entries: u32,
    /// Associativity of the page-walk cache (entries / ways sets, a power of two).
    pub pwc_ways: u32,
}

impl Default for TlbParams {
    fn default() -> Self {
        TlbParams {
            l1_entries: 16,
            l1_hit_cycles: 1,
            l2_entries: 128,
            l2_ways: 8,
            l2_hit_cycles: 10,
            l3_entries: 1024,
            l3_ways: 8,
            l3_hit_cycles: 40,
            l3_shared_hit_cycles: 50,
            walk_level_cycles: 100,
            pwc_entries: 128,
            pwc_ways: 8,
        }
    }
}

impl TlbParams {
    /// Checks sizes: every structure non-empty, ways dividing entries into a power-of-two number of sets, the L1
    /// small enough to scan (at most 64 entries).
    pub fn validate(&self) -> Result<(), TlbError> {
        let bad = |field: &'static str, reason: String| Err(TlbError::InvalidParams { field, reason });
        if self.l1_entries == 0 || self.l1_entries > 64 {
            return bad("l1_entries", format!("{} is not in 1..=64", self.l1_entries));
        }
        sets("l2_ways", self.l2_entries, self.l2_ways)?;
        sets("l3_ways", self.l3_entries, self.l3_ways)?;
        sets("pwc_ways", self.pwc_entries, self.pwc_ways)?;
        Ok(())
    }
}

/// Number of sets of a set-associative structure of `entries` entries in `ways` ways, which must be a power of two;
/// `field` names the parameter in the error.
pub fn sets(field: &'static str, entries: u32, ways: u32) -> Result<u32, TlbError> {
    if entries == 0 || ways == 0 || !entries.is_multiple_of(ways) || !(entries / ways).is_power_of_two() {
        return Err(TlbError::InvalidParams {
            field,
            reason: format!("{entries} entries in {ways} ways is not a power-of-two number of sets"),
        });
    }
    Ok(entries / ways)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_geometry_is_named() {
        assert!(TlbParams::default().validate().is_ok());
        let p = TlbParams { l3_ways: 3, ..TlbParams::default() };
        assert!(matches!(p.validate(), Err(TlbError::InvalidParams { field: "l3_ways", .. })));
        let p = TlbParams { l1_entries: 0, ..TlbParams::default() };
        assert!(matches!(p.validate(), Err(TlbError::InvalidParams { field: "l1_entries", .. })));
    }
}
