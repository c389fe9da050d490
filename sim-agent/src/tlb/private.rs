//! The private L1 TLB of a tenant's instance: fully associative, LRU, one 64 KB page per entry. (The private L2 is a
//! baseline [`SubEntryTlb`](super::subentry::SubEntryTlb).)

/// A page number no access uses (pages are below `2^48`).
const NO_PAGE: u64 = u64::MAX;

/// A fully associative LRU TLB of single 64 KB pages, kept in recency order (most recent first), so a hit moves
/// the page to the front and a miss shifts everything down one place and drops the last (LRU) page.
#[derive(Debug, Clone)]
pub struct L1Tlb {
    pages: Vec<u64>,
}

impl L1Tlb {
    /// An empty TLB of `entries` entries (at least 1).
    pub fn new(entries: u32) -> Self {
        L1Tlb { pages: vec![NO_PAGE; entries.max(1) as usize] }
    }

    /// Looks up 64 KB page number `page`; on a miss replaces the LRU entry. Returns whether it hit.
    #[inline]
    pub fn access(&mut self, page: u64) -> bool {
        let (hit, end) = match self.pages.iter().position(|&p| p == page) {
            Some(i) => (true, i),
            None => (false, self.pages.len() - 1),
        };
        if end > 0 {
            self.pages.copy_within(0..end, 1);
            self.pages[0] = page;
        }
        hit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_replacement() {
        let mut t = L1Tlb::new(2);
        assert!(!t.access(1));
        assert!(!t.access(2));
        assert!(t.access(1)); // 2 is now LRU
        assert!(!t.access(3)); // evicts 2
        assert!(t.access(1));
        assert!(!t.access(2)); // evicts 3
        assert!(!t.access(3));
    }

    #[test]
    fn sixteen_entries_hold_a_cycle_of_sixteen_not_seventeen() {
        let mut t = L1Tlb::new(16);
        let hits = |t: &mut L1Tlb, n: u64| (0..3).flat_map(|_| 0..n).filter(|&p| t.access(p)).count();
        assert_eq!(hits(&mut t, 16), 32);
        let mut t = L1Tlb::new(16);
        assert_eq!(hits(&mut t, 17), 0);
    }
}
