//! The page-walk cache (PWC) and the cost of a walk.
//!
//! The page table has 4 levels. A level-1 entry maps 512 GB, a level-2 entry 1 GB, a level-3 entry 2 MB (it points
//! to a leaf table of 32 PTEs for 64 KB pages). The PWC caches level 1-3 entries, tagged by (address space, level,
//! virtual prefix), in a set-associative LRU array shared by all tenants. A walk probes level 3, then 2, then 1, and
//! fetches from memory only the levels below the deepest one it found, always including the leaf:
//!
//! | deepest cached level | levels fetched | cycles at 100 per level |
//! |---|---|---|
//! | 3 | 1 (leaf) | 100 |
//! | 2 | 2 | 200 |
//! | 1 | 3 | 300 |
//! | none | 4 | 400 |
//!
//! The fetched upper-level entries are inserted, so the next walk in the same 2 MB region costs one level. The
//! paper's 8 parallel walkers are not modelled as a queue: every walk gets a walker at once \[I\].

use super::params::sets;
use super::{PAGE_SHIFT, TlbError};

/// Levels of the page table.
pub const WALK_LEVELS: u32 = 4;

/// log2 of the bytes a level-1, -2 and -3 entry maps, indexed by level - 1.
const LEVEL_SPAN_SHIFT: [u32; 3] = [39, 30, 21];
/// A key no lookup uses.
const NO_KEY: u64 = u64::MAX;

/// The shared page-walk cache.
#[derive(Debug, Clone)]
pub struct PageWalkCache {
    keys: Vec<u64>,
    last_use: Vec<u64>,
    ways: usize,
    set_mask: u64,
    clock: u64,
}

impl PageWalkCache {
    /// An empty cache of `entries` entries in `ways` ways (a power-of-two number of sets).
    pub fn new(entries: u32, ways: u32) -> Result<Self, TlbError> {
        let sets = sets("pwc_ways", entries, ways)?;
        Ok(PageWalkCache {
            keys: vec![NO_KEY; entries as usize],
            last_use: vec![0; entries as usize],
            ways: ways as usize,
            set_mask: u64::from(sets) - 1,
            clock: 0,
        })
    }

    /// Walks the translation of 64 KB page number `page` of address space `asid` and returns how many levels were
    /// fetched from memory (1 to [`WALK_LEVELS`]); updates the cache.
    #[inline]
    pub fn walk(&mut self, asid: u16, page: u64) -> u32 {
        self.clock += 1;
        let keys = [1u32, 2, 3].map(|level| Self::key(asid, level, page));
        // Deepest cached level: 3, 2, 1 or none (0).
        let mut cached = 0u32;
        for level in (1..=3u32).rev() {
            if self.probe(keys[level as usize - 1]) {
                cached = level;
                break;
            }
        }
        for level in cached + 1..=3 {
            self.insert(keys[level as usize - 1]);
        }
        WALK_LEVELS - cached
    }

    /// Tag of the level-`level` entry covering `page`.
    fn key(asid: u16, level: u32, page: u64) -> u64 {
        let prefix = page >> (LEVEL_SPAN_SHIFT[level as usize - 1] - PAGE_SHIFT);
        (u64::from(asid) << 48) | (u64::from(level) << 45) | prefix
    }

    fn set_start(&self, key: u64) -> usize {
        // Fibonacci hashing spreads neighbouring prefixes and levels over the sets.
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        (h & self.set_mask) as usize * self.ways
    }

    fn probe(&mut self, key: u64) -> bool {
        let start = self.set_start(key);
        for i in start..start + self.ways {
            if self.keys[i] == key {
                self.last_use[i] = self.clock;
                return true;
            }
        }
        false
    }

    fn insert(&mut self, key: u64) {
        let start = self.set_start(key);
        let mut victim = start;
        for i in start..start + self.ways {
            if self.keys[i] == NO_KEY {
                victim = i;
                break;
            }
            if self.last_use[i] < self.last_use[victim] {
                victim = i;
            }
        }
        self.keys[victim] = key;
        self.last_use[victim] = self.clock;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walk_costs_shrink_as_upper_levels_are_cached() {
        let mut pwc = PageWalkCache::new(128, 8).unwrap();
        // First walk: nothing cached.
        assert_eq!(pwc.walk(0, 0), 4);
        // Same 2 MB region (32 pages of 64 KB): leaf only.
        assert_eq!(pwc.walk(0, 31), 1);
        // Next 2 MB region, same 1 GB: level 2 cached, fetch level 3 and the leaf.
        assert_eq!(pwc.walk(0, 32), 2);
        // Next 1 GB, same 512 GB: level 1 cached.
        assert_eq!(pwc.walk(0, 1 << 14), 3);
        // Another address space shares nothing.
        assert_eq!(pwc.walk(1, 0), 4);
    }

    #[test]
    fn a_one_entry_cache_keeps_only_the_last_level_three_entry() {
        let mut pwc = PageWalkCache::new(1, 1).unwrap();
        assert_eq!(pwc.walk(0, 0), 4);
        // Level 3 was inserted last and evicted levels 1 and 2.
        assert_eq!(pwc.walk(0, 1), 1);
        assert_eq!(pwc.walk(0, 32), 4);
    }
}
