//! A set-associative TLB whose entries cover a 1 MB range with 16 sub-entries of 64 KB: the private L2 TLBs and the
//! shared L3 TLB, in the baseline design or with STAR's two bases per entry. The hit / sub-entry miss / entry miss
//! semantics and the STAR rules are in the [module doc](super).
//!
//! Storage is one flat array of ways (set-major), each with two tags and two 16-bit sub-entry masks; a lookup scans
//! the set's ways and allocates nothing.

use serde::{Deserialize, Serialize};

use super::params::sets;
use super::{PAGE_SHIFT, RANGE_SHIFT, STAR_SLOTS_PER_BASE, SUB_ENTRIES, TlbError, TlbMode};

/// Tag of an unused base slot. Real tags never equal it (address-space ids stay below `0x8000`).
const INVALID: u64 = u64::MAX;
/// Bits of a tag that hold the base; the address-space id sits above them.
const ASID_SHIFT: u32 = 48;
/// log2 of the pages per range.
const SUB_SHIFT: u32 = RANGE_SHIFT - PAGE_SHIFT;

/// What one lookup found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lookup {
    /// The range's entry was present with the page's sub-entry valid.
    Hit {
        /// The entry held two bases (STAR), so the lookup took the longer latency.
        shared: bool,
    },
    /// The range's entry was present but the page's sub-entry was not valid; it is now filled.
    SubEntryMiss {
        /// The entry held two bases (STAR) at lookup time.
        shared: bool,
    },
    /// No entry held the range; one was allocated (or a STAR entry shared) with this page's sub-entry valid.
    EntryMiss,
}

impl Lookup {
    /// Whether the translation was found.
    pub fn is_hit(self) -> bool {
        matches!(self, Lookup::Hit { .. })
    }

    /// Whether the lookup ended on a STAR-shared entry.
    pub fn shared(self) -> bool {
        matches!(self, Lookup::Hit { shared: true } | Lookup::SubEntryMiss { shared: true })
    }
}

/// Event counters of one TLB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SubEntryStats {
    /// Lookups.
    pub accesses: u64,
    /// Hits (entry present, sub-entry valid).
    pub hits: u64,
    /// Hits on a shared entry (a subset of `hits`).
    pub shared_hits: u64,
    /// Lookups that found the entry but not the sub-entry.
    pub subentry_misses: u64,
    /// Lookups that found no entry for the range.
    pub entry_misses: u64,
    /// Whole entries evicted to make room (LRU).
    pub evictions: u64,
    /// Valid sub-entries the evicted entries held at eviction, summed (both bases of a shared entry).
    pub evicted_subentries: u64,
    /// Evicted entries that were shared by two bases (a subset of `evictions`).
    pub evicted_shared: u64,
    /// Entry misses served by adding the base to an existing entry (STAR).
    pub shares: u64,
    /// Shared entries that went back to exclusive because one base filled its 8 slots (STAR).
    pub reverts: u64,
    /// Valid sub-entries of the bases dropped by reverts, summed.
    pub reverted_subentries: u64,
}

impl SubEntryStats {
    /// Hits over lookups (0 without lookups).
    pub fn hit_rate(&self) -> f64 {
        ratio(self.hits, self.accesses)
    }

    /// Mean fraction of the 16 sub-entries valid in evicted entries; `None` before the first eviction.
    pub fn subentry_utilisation(&self) -> Option<f64> {
        (self.evictions > 0).then(|| self.evicted_subentries as f64 / (self.evictions as f64 * f64::from(SUB_ENTRIES)))
    }
}

/// `num / den`, 0 when `den` is 0.
pub(crate) fn ratio(num: u64, den: u64) -> f64 {
    if den == 0 { 0.0 } else { num as f64 / den as f64 }
}

/// One way: up to two bases (the second only under STAR), their valid sub-entries and the last use.
#[derive(Debug, Clone, Copy)]
struct Way {
    tags: [u64; 2],
    masks: [u16; 2],
    last_use: u64,
}

const EMPTY: Way = Way { tags: [INVALID, INVALID], masks: [0, 0], last_use: 0 };

/// One base held by an entry, as seen by [`SubEntryTlb::set_contents`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ResidentBase {
    /// Address-space id of the owner.
    pub asid: u16,
    /// The 1 MB range number (virtual address >> 20).
    pub base: u64,
    /// Valid sub-entries: bit `i` is page `i` of the range.
    pub subentries: u16,
}

/// One valid entry, as seen by [`SubEntryTlb::set_contents`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResidentEntry {
    /// The way within the set.
    pub way: usize,
    /// One base, or two when STAR shares the entry.
    pub bases: Vec<ResidentBase>,
    /// Logical time of the last use (larger is more recent).
    pub last_use: u64,
}

/// A set-associative, LRU, sub-entry TLB (an L2, or the L3 in baseline or STAR mode).
#[derive(Debug, Clone)]
pub struct SubEntryTlb {
    mode: TlbMode,
    ways: usize,
    set_mask: u64,
    entries: Vec<Way>,
    clock: u64,
    stats: SubEntryStats,
}

impl SubEntryTlb {
    /// An empty TLB of `entries` entries in `ways` ways (the number of sets must be a power of two).
    pub fn new(entries: u32, ways: u32, mode: TlbMode) -> Result<Self, TlbError> {
        let sets = u64::from(sets("ways", entries, ways)?);
        Ok(SubEntryTlb {
            mode,
            ways: ways as usize,
            set_mask: sets - 1,
            entries: vec![EMPTY; entries as usize],
            clock: 0,
            stats: SubEntryStats::default(),
        })
    }

    /// The design.
    pub fn mode(&self) -> TlbMode {
        self.mode
    }

    /// Number of sets.
    pub fn sets(&self) -> usize {
        self.set_mask as usize + 1
    }

    /// The counters so far.
    pub fn stats(&self) -> &SubEntryStats {
        &self.stats
    }

    /// The set a 64 KB page number maps to (its range number modulo the number of sets).
    pub fn set_of_page(&self, page: u64) -> usize {
        ((page >> SUB_SHIFT) & self.set_mask) as usize
    }

    /// Looks up 64 KB page number `page` (virtual address >> 16) of address space `asid`, fills on a miss, and
    /// says what happened. `asid` must be below `0x8000` and `page` below `2^48`.
    #[inline]
    pub fn access(&mut self, asid: u16, page: u64) -> Lookup {
        debug_assert!(asid < 0x8000 && page < (1 << ASID_SHIFT));
        let base = page >> SUB_SHIFT;
        let bit = 1u16 << (page & u64::from(SUB_ENTRIES - 1));
        let tag = (u64::from(asid) << ASID_SHIFT) | base;
        self.clock += 1;
        let now = self.clock;
        self.stats.accesses += 1;
        let start = (base & self.set_mask) as usize * self.ways;
        for way in &mut self.entries[start..start + self.ways] {
            let half = if way.tags[0] == tag {
                0
            } else if way.tags[1] == tag {
                1
            } else {
                continue;
            };
            way.last_use = now;
            let shared = way.tags[1] != INVALID;
            if way.masks[half] & bit != 0 {
                self.stats.hits += 1;
                self.stats.shared_hits += u64::from(shared);
                return Lookup::Hit { shared };
            }
            way.masks[half] |= bit;
            self.stats.subentry_misses += 1;
            if shared && way.masks[half].count_ones() >= STAR_SLOTS_PER_BASE {
                // One base filled its 8 slots: drop the other, the entry is exclusive again.
                let other = 1 - half;
                self.stats.reverts += 1;
                self.stats.reverted_subentries += u64::from(way.masks[other].count_ones());
                *way = Way { tags: [tag, INVALID], masks: [way.masks[half], 0], last_use: now };
            }
            return Lookup::SubEntryMiss { shared };
        }
        self.stats.entry_misses += 1;
        self.allocate(start, tag, asid, bit, now);
        Lookup::EntryMiss
    }

    /// Places a new base in the set starting at `start`: an invalid way, else (STAR) a sparse single-base entry,
    /// else the LRU way.
    fn allocate(&mut self, start: usize, tag: u64, asid: u16, bit: u16, now: u64) {
        let set = &mut self.entries[start..start + self.ways];
        // Invalid ways have `last_use` 0 and every used way a later time, so the first minimum is the first
        // invalid way if there is one, else the LRU way.
        let (mut victim, mut oldest) = (0, u64::MAX);
        for (i, w) in set.iter().enumerate() {
            if w.last_use < oldest {
                (victim, oldest) = (i, w.last_use);
            }
        }
        let fresh = Way { tags: [tag, INVALID], masks: [bit, 0], last_use: now };
        if set[victim].tags[0] == INVALID {
            set[victim] = fresh;
            return;
        }
        if self.mode == TlbMode::Star {
            // Key: (other address space, last use); the smallest wins: same process first, then LRU.
            let mut best: Option<((bool, u64), usize)> = None;
            for (i, w) in set.iter().enumerate() {
                if w.tags[1] == INVALID && w.masks[0].count_ones() < STAR_SLOTS_PER_BASE {
                    let key = ((w.tags[0] >> ASID_SHIFT) != u64::from(asid), w.last_use);
                    if best.is_none_or(|(k, _)| key < k) {
                        best = Some((key, i));
                    }
                }
            }
            if let Some((_, i)) = best {
                let way = &mut set[i];
                way.tags[1] = tag;
                way.masks[1] = bit;
                way.last_use = now;
                self.stats.shares += 1;
                return;
            }
        }
        let old = set[victim];
        self.stats.evictions += 1;
        self.stats.evicted_subentries += u64::from(old.masks[0].count_ones() + old.masks[1].count_ones());
        self.stats.evicted_shared += u64::from(old.tags[1] != INVALID);
        set[victim] = fresh;
    }

    /// The valid entries of set `set`, in way order (for tests and inspection; allocates).
    pub fn set_contents(&self, set: usize) -> Vec<ResidentEntry> {
        let start = set * self.ways;
        self.entries[start..start + self.ways]
            .iter()
            .enumerate()
            .filter(|(_, w)| w.tags[0] != INVALID)
            .map(|(i, w)| ResidentEntry {
                way: i,
                bases: (0..2)
                    .filter(|&h| w.tags[h] != INVALID)
                    .map(|h| ResidentBase {
                        asid: (w.tags[h] >> ASID_SHIFT) as u16,
                        base: w.tags[h] & ((1 << ASID_SHIFT) - 1),
                        subentries: w.masks[h],
                    })
                    .collect(),
                last_use: w.last_use,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Page number of sub-page `sub` of range `base`.
    fn page(base: u64, sub: u64) -> u64 {
        (base << SUB_SHIFT) | sub
    }

    #[test]
    fn one_range_sixteen_pages_then_again() {
        let mut t = SubEntryTlb::new(1024, 8, TlbMode::Baseline).unwrap();
        assert_eq!(t.access(0, page(5, 0)), Lookup::EntryMiss);
        for sub in 1..16 {
            assert_eq!(t.access(0, page(5, sub)), Lookup::SubEntryMiss { shared: false });
        }
        for sub in 0..16 {
            assert_eq!(t.access(0, page(5, sub)), Lookup::Hit { shared: false });
        }
        let s = t.stats();
        assert_eq!((s.accesses, s.hits, s.subentry_misses, s.entry_misses, s.evictions), (32, 16, 15, 1, 0));
        assert_eq!(s.subentry_utilisation(), None);
    }

    #[test]
    fn address_spaces_do_not_hit_each_other() {
        let mut t = SubEntryTlb::new(16, 8, TlbMode::Baseline).unwrap();
        assert_eq!(t.access(1, page(3, 2)), Lookup::EntryMiss);
        assert_eq!(t.access(2, page(3, 2)), Lookup::EntryMiss);
        assert_eq!(t.access(1, page(3, 2)), Lookup::Hit { shared: false });
        assert_eq!(t.set_contents(t.set_of_page(page(3, 2))).len(), 2);
    }

    #[test]
    fn star_lru_candidate_and_same_process_preference() {
        // One set of 2 ways; fill both with sparse bases of asid 1 (older) and asid 2 (newer).
        let mut t = SubEntryTlb::new(2, 2, TlbMode::Star).unwrap();
        t.access(1, page(0, 0));
        t.access(2, page(1, 0));
        // asid 2 needs a new base: prefers its own entry (base 1) although base 0 is LRU.
        assert_eq!(t.access(2, page(2, 0)), Lookup::EntryMiss);
        let set = t.set_contents(0);
        assert_eq!(set[1].bases.len(), 2);
        assert_eq!(set[1].bases[1].base, 2);
        // asid 3 has no entry of its own: takes the LRU sparse single-base entry (base 0, way 0).
        assert_eq!(t.access(3, page(3, 0)), Lookup::EntryMiss);
        let set = t.set_contents(0);
        assert_eq!(set[0].bases.iter().map(|b| b.base).collect::<Vec<_>>(), vec![0, 3]);
        // Both ways are shared now: the next new base evicts the LRU way (way 1, used before way 0).
        assert_eq!(t.access(4, page(4, 0)), Lookup::EntryMiss);
        let s = t.stats();
        assert_eq!((s.shares, s.evictions, s.evicted_shared, s.evicted_subentries), (2, 1, 1, 2));
    }
}
