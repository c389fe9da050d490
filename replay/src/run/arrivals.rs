//! Where a run's requests come from: an [`ArrivalSource`] yields every tenant's arrivals in time order, window by
//! window, and an [`Arrivals`] opens a fresh source per policy so that every policy sees the same requests.
//!
//! Two kinds: Poisson tenants (`poisson_rps`, the executor's seeded streams) and trace tenants, which take one
//! stream of a trace each, scaled per tenant ([`Scaler`]).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_sim::executor::{Arrival, PoissonArrivals, TenantIndex};

use super::ReplayError;

/// A run's requests in time order.
pub trait ArrivalSource: Send {
    /// Appends every arrival with `at_ms < until_ms` not returned yet, in time order.
    fn next_until(&mut self, until_ms: f64, out: &mut Vec<Arrival>) -> Result<(), ReplayError>;
}

/// Opens fresh, identical sources: one per policy and one for the truth table.
pub trait Arrivals: Sync {
    /// A source positioned at time zero.
    fn open(&self) -> Result<Box<dyn ArrivalSource>, ReplayError>;
}

/// Merges sorted per-tenant streams into one sorted stream (ties by tenant index).
#[derive(Default)]
struct Merge {
    heap: BinaryHeap<Reverse<(OrdF64, u32)>>,
}

/// A totally ordered finite `f64` for heaps.
#[derive(Debug, Clone, Copy)]
struct OrdF64(f64);
impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Poisson tenants: `(tenant, rate_rps)`, from the run's seed (each tenant its own ChaCha8 stream, as the
/// executor's [`PoissonArrivals`]).
pub struct PoissonSet {
    /// Seed.
    pub seed: u64,
    /// Tenants and their rates.
    pub rates: Vec<(TenantIndex, f64)>,
    /// End of the run, ms.
    pub end_ms: f64,
}

struct PoissonSource {
    streams: Vec<std::iter::Peekable<PoissonArrivals>>,
    merge: Merge,
}

impl Arrivals for PoissonSet {
    fn open(&self) -> Result<Box<dyn ArrivalSource>, ReplayError> {
        let mut streams: Vec<_> = self
            .rates
            .iter()
            .map(|&(t, r)| PoissonArrivals::new(self.seed, t, r, 0.0, self.end_ms).peekable())
            .collect();
        let mut merge = Merge::default();
        for (i, s) in streams.iter_mut().enumerate() {
            if let Some(a) = s.peek() {
                merge.heap.push(Reverse((OrdF64(a.at_ms), i as u32)));
            }
        }
        Ok(Box::new(PoissonSource { streams, merge }))
    }
}

impl ArrivalSource for PoissonSource {
    fn next_until(&mut self, until_ms: f64, out: &mut Vec<Arrival>) -> Result<(), ReplayError> {
        while let Some(&Reverse((OrdF64(t), i))) = self.merge.heap.peek() {
            if t >= until_ms {
                break;
            }
            self.merge.heap.pop();
            let s = &mut self.streams[i as usize];
            out.push(s.next().expect("peeked"));
            if let Some(a) = s.peek() {
                self.merge.heap.push(Reverse((OrdF64(a.at_ms), i)));
            }
        }
        Ok(())
    }
}

/// Spread of the copies a scaled-up stream makes of one request, ms: the time resolution at which a scaled-up
/// trace keeps its rate curve ([`Scaler`]).
pub const SPREAD_MS: f64 = 10_000.0;

/// Per-tenant rate scaling of a trace stream, seeded per tenant: a multiplier `k` keeps each request of the
/// stream `floor(k)` times plus once more with probability `frac(k)` (so `k < 1` thins and keeps the trace's
/// timestamps). The first copy keeps the request's time; the others are spread uniformly over
/// `[t, t + spread_ms)` ([`SPREAD_MS`]). Scaling a 5 req/s trace to 5,000 req/s by stacking 1,000 copies of each
/// request would turn every request into a burst and multiply the trace's burstiness a thousandfold; spread, the
/// scaled stream follows the trace's rate curve at a 10 s resolution and is Poisson-like below it, as the
/// superposition of many more users would be. Output stays in time order: copies wait in a calendar queue
/// ([`Reorder`]) until the trace has passed them.
pub struct Scaler {
    rng: ChaCha8Rng,
    /// The multiplier.
    pub factor: f64,
    /// Spread of the copies, ms.
    pub spread_ms: f64,
}

impl Scaler {
    /// The scaler of tenant `tenant` for `seed`.
    pub fn new(seed: u64, tenant: TenantIndex, factor: f64, spread_ms: f64) -> Scaler {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7265_706c_6179);
        rng.set_stream(u64::from(tenant.0));
        Scaler { rng, factor, spread_ms }
    }

    /// Times of the copies of a request at `t_ms`: the first (if kept) is `t_ms` itself.
    pub fn copies(&mut self, t_ms: f64, out: &mut Vec<f64>) {
        let whole = self.factor.floor();
        let mut n = whole as u64;
        let frac = self.factor - whole;
        if frac > 0.0 && self.rng.random_bool(frac.min(1.0)) {
            n += 1;
        }
        for c in 0..n {
            out.push(if c == 0 { t_ms } else { t_ms + self.rng.random::<f64>() * self.spread_ms });
        }
    }
}

/// Width of a [`Reorder`] bucket, ms.
const BUCKET_MS: f64 = 10.0;

/// Reorders scaled copies: holds arrivals until the input has passed them.
///
/// A calendar queue: held arrivals wait in buckets of 10 ms (`BUCKET_MS`) by time, and a release sorts only the buckets
/// it empties (and the one it cuts). A scaled-up stream holds about `rate x SPREAD_MS` copies at any time (360,000
/// at the default scenario's 36,000 requests per second); a binary heap of that size spent nearly all of a replay's
/// time in its pops, where a bucket of a few hundred copies sorts from cache. The order out is the heap's: by time,
/// then tenant index.
#[derive(Default)]
pub struct Reorder {
    /// Bucket number of `buckets[0]`.
    base: i64,
    buckets: std::collections::VecDeque<Vec<(f64, u32)>>,
    /// Emptied buckets, kept for their allocations.
    spare: Vec<Vec<(f64, u32)>>,
    held: usize,
}

impl Reorder {
    /// Holds an arrival.
    pub fn push(&mut self, a: Arrival) {
        debug_assert!(a.at_ms.is_finite(), "arrival time {}", a.at_ms);
        let bucket = (a.at_ms / BUCKET_MS).floor() as i64;
        if self.buckets.is_empty() {
            self.base = bucket;
        }
        // An arrival before the first bucket joins it: that bucket is sorted whole before anything leaves it.
        let k = usize::try_from(bucket - self.base).unwrap_or(0);
        while self.buckets.len() <= k {
            let fresh = self.spare.pop().unwrap_or_default();
            self.buckets.push_back(fresh);
        }
        self.buckets[k].push((a.at_ms, a.tenant.0));
        self.held += 1;
    }

    /// Moves every held arrival before `before_ms` to `out`, in time order.
    pub fn release(&mut self, before_ms: f64, out: &mut Vec<Arrival>) {
        while let Some(front) = self.buckets.front_mut() {
            if !front.is_empty() {
                // Equal (time, tenant) pairs are interchangeable, so an unstable sort gives the heap's order.
                front.sort_unstable_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
                let cut = front.partition_point(|x| x.0 < before_ms);
                out.extend(front.drain(..cut).map(|(t, tenant)| Arrival { at_ms: t, tenant: TenantIndex(tenant) }));
                self.held -= cut;
            }
            if !front.is_empty() || (self.base + 1) as f64 * BUCKET_MS > before_ms {
                break;
            }
            let empty = self.buckets.pop_front().expect("front exists");
            self.spare.push(empty);
            self.base += 1;
        }
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.held == 0
    }
}

/// Several sources merged in time order (for example trace tenants and Poisson tenants in one run).
pub struct Merged {
    /// The parts.
    pub parts: Vec<Box<dyn Arrivals>>,
}

impl Arrivals for Merged {
    fn open(&self) -> Result<Box<dyn ArrivalSource>, ReplayError> {
        let parts = self.parts.iter().map(|p| p.open()).collect::<Result<Vec<_>, _>>()?;
        Ok(Box::new(MergedSource { parts, buf: Vec::new(), reorder: Reorder::default() }))
    }
}

struct MergedSource {
    parts: Vec<Box<dyn ArrivalSource>>,
    buf: Vec<Arrival>,
    reorder: Reorder,
}

impl ArrivalSource for MergedSource {
    fn next_until(&mut self, until_ms: f64, out: &mut Vec<Arrival>) -> Result<(), ReplayError> {
        if self.parts.len() == 1 {
            return self.parts[0].next_until(until_ms, out);
        }
        for p in &mut self.parts {
            self.buf.clear();
            p.next_until(until_ms, &mut self.buf)?;
            for a in self.buf.drain(..) {
                self.reorder.push(a);
            }
        }
        self.reorder.release(until_ms, out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_set_is_sorted_deterministic_and_near_its_rate() {
        let set =
            PoissonSet { seed: 3, rates: vec![(TenantIndex(0), 50.0), (TenantIndex(1), 20.0)], end_ms: 100_000.0 };
        let mut a = Vec::new();
        let mut s = set.open().unwrap();
        s.next_until(40_000.0, &mut a).unwrap();
        let first = a.len();
        s.next_until(100_000.0, &mut a).unwrap();
        assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(a[..first].iter().all(|x| x.at_ms < 40_000.0));
        let n0 = a.iter().filter(|x| x.tenant.0 == 0).count() as f64;
        assert!((n0 / 100.0 - 50.0).abs() < 5.0, "{n0}");
        let mut b = Vec::new();
        set.open().unwrap().next_until(100_000.0, &mut b).unwrap();
        assert_eq!(a, b);
    }

    /// The calendar queue releases exactly what a binary heap would, in the heap's order, however the releases cut
    /// its buckets, with arrivals pushed late (before the first bucket) and ties on time between tenants.
    #[test]
    fn reorder_releases_in_the_order_of_a_heap() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut calendar = Reorder::default();
        let mut heap: BinaryHeap<Reverse<(OrdF64, u32)>> = BinaryHeap::new();
        let (mut got, mut want) = (Vec::new(), Vec::new());
        let mut t = 0.0;
        for step in 0..2_000 {
            t += rng.random::<f64>() * 7.0;
            for _ in 0..rng.random_range(0..6) {
                // Copies spread ahead of the input, some on a shared time, some behind what was released.
                let at = match rng.random_range(0..4) {
                    0 => (t / 5.0).floor() * 5.0,
                    1 => (t - 30.0).max(0.0),
                    _ => t + rng.random::<f64>() * 100.0,
                };
                let tenant = rng.random_range(0..3);
                calendar.push(Arrival { at_ms: at, tenant: TenantIndex(tenant) });
                heap.push(Reverse((OrdF64(at), tenant)));
            }
            if step % 3 == 0 {
                let before = t + rng.random::<f64>() * 3.0 - 1.0;
                calendar.release(before, &mut got);
                while let Some(&Reverse((OrdF64(at), tenant))) = heap.peek() {
                    if at >= before {
                        break;
                    }
                    heap.pop();
                    want.push(Arrival { at_ms: at, tenant: TenantIndex(tenant) });
                }
                assert_eq!(got, want, "after release at {before}");
            }
        }
        calendar.release(f64::INFINITY, &mut got);
        want.extend(
            std::iter::from_fn(|| heap.pop())
                .map(|Reverse((OrdF64(at), t))| Arrival { at_ms: at, tenant: TenantIndex(t) }),
        );
        assert_eq!(got, want);
        assert!(calendar.is_empty());
        assert!(got.len() > 3_000);
    }

    #[test]
    fn scaler_keeps_the_mean_and_the_first_copy_at_the_original_time() {
        let mut s = Scaler::new(1, TenantIndex(0), 2.5, 100.0);
        let mut out = Vec::new();
        for i in 0..10_000 {
            s.copies(f64::from(i) * 1000.0, &mut out);
        }
        let mean = out.len() as f64 / 10_000.0;
        assert!((mean - 2.5).abs() < 0.05, "{mean}");
        assert_eq!(out[0], 0.0);
        let mut thin = Scaler::new(1, TenantIndex(0), 0.25, 100.0);
        let mut kept = Vec::new();
        for i in 0..10_000 {
            thin.copies(f64::from(i), &mut kept);
        }
        assert!((kept.len() as f64 / 10_000.0 - 0.25).abs() < 0.02);
        assert!(kept.iter().all(|t| t.fract() == 0.0), "thinning keeps original times");
    }
}
