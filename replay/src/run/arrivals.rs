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

    /// Adds every tenant's requests in each tick of `counts` (which ends at `until_ms`), not returned yet, as
    /// counts: for fluid runs ([`Executor::flow`](tessera_sim::executor::Executor::flow)). A source that can
    /// give its expected counts without drawing each request does (trace tenants, Poisson tenants); by default
    /// the requests are drawn and counted. A source is read either by requests or by counts, not both.
    fn count_until(&mut self, until_ms: f64, counts: &mut TickCounts) -> Result<(), ReplayError> {
        let mut buf = Vec::new();
        self.next_until(until_ms, &mut buf)?;
        for a in &buf {
            counts.add(a.tenant.0 as usize, a.at_ms, 1.0);
        }
        Ok(())
    }
}

/// Requests per tenant per tick over `[from_ms, from_ms + ticks x tick_ms)` (the last tick may be cut short by
/// the end of a window), for fluid runs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TickCounts {
    /// Start of the first tick, ms.
    pub from_ms: f64,
    /// Tick length, ms.
    pub tick_ms: f64,
    /// Tenants (columns).
    pub tenants: usize,
    /// `counts[k * tenants + t]`: requests of tenant `t` in tick `k`.
    pub counts: Vec<f64>,
}

impl TickCounts {
    /// Zero counts for `tenants` over the ticks of `tick_ms` that cover `[from_ms, until_ms)`.
    pub fn reset(&mut self, from_ms: f64, until_ms: f64, tick_ms: f64, tenants: usize) {
        // To rounding: 8.05 s is 8050.000000000001 ms, 161 ticks of 50 ms, not 162.
        let ticks = ((until_ms - from_ms) / tick_ms - 1e-9).ceil().max(0.0) as usize;
        self.from_ms = from_ms;
        self.tick_ms = tick_ms;
        self.tenants = tenants;
        self.counts.clear();
        self.counts.resize(ticks * tenants, 0.0);
    }

    /// Ticks held.
    pub fn ticks(&self) -> usize {
        self.counts.len().checked_div(self.tenants).unwrap_or(0)
    }

    /// Tick `k`'s counts, by tenant.
    pub fn tick(&self, k: usize) -> &[f64] {
        &self.counts[k * self.tenants..(k + 1) * self.tenants]
    }

    /// Adds `n` requests of `tenant` at `at_ms` (clamped into the ticks held).
    pub fn add(&mut self, tenant: usize, at_ms: f64, n: f64) {
        let ticks = self.ticks();
        if ticks == 0 {
            return;
        }
        let k = (((at_ms - self.from_ms) / self.tick_ms).floor().max(0.0) as usize).min(ticks - 1);
        self.counts[k * self.tenants + tenant] += n;
    }

    /// Requests of every tenant in every tick.
    pub fn total(&self) -> f64 {
        self.counts.iter().sum()
    }
}

/// Expected requests per tick, ahead of the ticks emitted so far: point masses and uniform spreads (a scaled-up
/// trace request's copies) accumulate here until their ticks are emitted into a [`TickCounts`]. Spreads are kept as
/// partial end ticks plus a difference array of the per-tick mass in between, so one costs O(1) however long.
#[derive(Debug, Default)]
pub struct TickSpread {
    tick_ms: f64,
    tenants: usize,
    /// Tick number of the front row.
    base: i64,
    /// Per tick, per tenant: mass placed directly in the tick.
    direct: std::collections::VecDeque<Vec<f64>>,
    /// Per tick, per tenant: change of the spread mass per tick from this tick on.
    diff: std::collections::VecDeque<Vec<f64>>,
    /// Per tenant: spread mass per tick at the front row (before its `diff`).
    running: Vec<f64>,
    /// Emitted rows, zeroed, kept for their allocations.
    spare: Vec<Vec<f64>>,
}

impl TickSpread {
    /// Empty, for `tenants` with ticks of `tick_ms` from time zero.
    pub fn new(tick_ms: f64, tenants: usize) -> TickSpread {
        TickSpread { tick_ms, tenants, running: vec![0.0; tenants], ..TickSpread::default() }
    }

    /// The row of tick `k` (a tick already emitted maps to the front row).
    fn row(&mut self, k: i64) -> usize {
        let i = usize::try_from(k - self.base).unwrap_or(0);
        while self.direct.len() <= i {
            let mut fresh = || self.spare.pop().unwrap_or_else(|| vec![0.0; self.tenants]);
            let (a, b) = (fresh(), fresh());
            self.direct.push_back(a);
            self.diff.push_back(b);
        }
        i
    }

    fn tick_of(&self, at_ms: f64) -> i64 {
        (at_ms / self.tick_ms).floor() as i64
    }

    /// `n` requests of `tenant` at `at_ms`.
    pub fn point(&mut self, tenant: usize, at_ms: f64, n: f64) {
        let i = self.row(self.tick_of(at_ms));
        self.direct[i][tenant] += n;
    }

    /// `n` requests of `tenant` spread uniformly over `[from_ms, to_ms)`.
    pub fn uniform(&mut self, tenant: usize, from_ms: f64, to_ms: f64, n: f64) {
        let (k0, k1) = (self.tick_of(from_ms), self.tick_of(to_ms));
        if k0 == k1 || to_ms <= from_ms {
            return self.point(tenant, from_ms, n);
        }
        let per_ms = n / (to_ms - from_ms);
        let tick = self.tick_ms;
        let first = self.row(k0);
        let last = self.row(k1);
        self.direct[first][tenant] += per_ms * ((k0 + 1) as f64 * tick - from_ms);
        self.direct[last][tenant] += per_ms * (to_ms - k1 as f64 * tick);
        if k1 > k0 + 1 {
            self.diff[first + 1][tenant] += per_ms * tick;
            self.diff[last][tenant] -= per_ms * tick;
        }
    }

    /// Moves the mass of every tick that starts before `until_ms` into `out` (whose ticks must be this one's,
    /// from `out.from_ms`); mass in ticks before `out.from_ms` joins its first tick.
    pub fn emit(&mut self, until_ms: f64, out: &mut TickCounts) {
        while !self.direct.is_empty() && (self.base as f64) * self.tick_ms < until_ms {
            let direct = self.direct.pop_front().expect("not empty");
            let diff = self.diff.pop_front().expect("rows pair up");
            let at = self.base as f64 * self.tick_ms;
            for t in 0..self.tenants {
                self.running[t] += diff[t];
                // The running sum's rounding can leave a spread's end a hair below zero.
                let n = (direct[t] + self.running[t]).max(0.0);
                if n > 1e-9 {
                    out.add(t, at, n);
                }
            }
            self.base += 1;
            for mut row in [direct, diff] {
                row.fill(0.0);
                self.spare.push(row);
            }
        }
        if self.direct.is_empty() {
            // Nothing ahead: the next row starts wherever the next mass lands.
            self.base = self.tick_of(until_ms).max(self.base);
        }
    }
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
    rates: Vec<(TenantIndex, f64)>,
    end_ms: f64,
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
        Ok(Box::new(PoissonSource { streams, merge, rates: self.rates.clone(), end_ms: self.end_ms }))
    }
}

impl ArrivalSource for PoissonSource {
    fn count_until(&mut self, until_ms: f64, counts: &mut TickCounts) -> Result<(), ReplayError> {
        // Expected counts: each tick's overlap with [0, end) times the rate.
        for k in 0..counts.ticks() {
            let a = counts.from_ms + k as f64 * counts.tick_ms;
            let b = (a + counts.tick_ms).min(until_ms).min(self.end_ms);
            if b > a {
                for &(t, r) in &self.rates {
                    counts.add(t.0 as usize, a, r * (b - a) / 1000.0);
                }
            }
        }
        Ok(())
    }

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
///
/// Memory: a factor is cut where the part of a stream a run replays is much denser than the stream's mean over its
/// trace window ([`MAX_BURST`](super::MAX_BURST)), so a run's copies add up to at most 10 times its rate times its
/// length, whatever gaps the file has; the queue, which holds a steady stream's copies of the current window and
/// the next [`SPREAD_MS`], never holds more than that.
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
    fn count_until(&mut self, until_ms: f64, counts: &mut TickCounts) -> Result<(), ReplayError> {
        for p in &mut self.parts {
            p.count_until(until_ms, counts)?;
        }
        Ok(())
    }

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

/// Poisson noise around another source's expected counts, for fluid runs: the requests a fluid run serves are drawn,
/// as the discrete executor's are, rather than the trace's expectation served exactly.
///
/// Each tenant's expected requests in each cell of `cell_ms` (a whole number of `tick_ms` ticks, both from time
/// zero) are replaced by a Poisson draw with that mean and spread over the cell's ticks as the expectation was. A
/// draw depends only on the seed, the tenant and the cell (the tenant's ChaCha8 stream, positioned at the cell), so
/// every source opened gives the same counts however its reader cuts the run, provided each call ends on a cell
/// boundary (or at the run's end): the truth table, the upper bound and every policy see the same requests.
pub struct Noisy {
    /// The expected counts.
    pub inner: Box<dyn Arrivals>,
    /// Seed.
    pub seed: u64,
    /// Tenants.
    pub tenants: usize,
    /// Resolution at which the inner source is read, ms (the fluid tick).
    pub tick_ms: f64,
    /// Cell of one draw, ms (a multiple of `tick_ms`).
    pub cell_ms: f64,
}

impl Noisy {
    /// The cell for a fluid tick of `tick_ms` whose draws every reader's calls end on: the largest multiple of the
    /// tick up to a second that divides `slot_ms` and `window_ms` (the tick itself if none does).
    pub fn cell_for(tick_ms: f64, slot_ms: f64, window_ms: f64) -> f64 {
        let divides = |c: f64, x: f64| ((x / c).round() * c - x).abs() < 1e-6;
        let most = (1000.0 / tick_ms).floor().max(1.0) as u64;
        (1..=most)
            .rev()
            .map(|m| m as f64 * tick_ms)
            .find(|&c| divides(c, slot_ms) && divides(c, window_ms))
            .unwrap_or(tick_ms)
    }
}

/// ChaCha8 words set aside for one cell's draw (a Poisson draw takes a handful).
const WORDS_PER_CELL: u128 = 1 << 16;

impl Arrivals for Noisy {
    fn open(&self) -> Result<Box<dyn ArrivalSource>, ReplayError> {
        let rngs = (0..self.tenants)
            .map(|t| {
                let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ 0x006e_6f69_7365);
                rng.set_stream(t as u64);
                rng
            })
            .collect();
        Ok(Box::new(NoisySource {
            inner: self.inner.open()?,
            rngs,
            fine: TickCounts::default(),
            tick_ms: self.tick_ms,
            cell_ms: self.cell_ms,
        }))
    }
}

struct NoisySource {
    inner: Box<dyn ArrivalSource>,
    rngs: Vec<ChaCha8Rng>,
    fine: TickCounts,
    tick_ms: f64,
    cell_ms: f64,
}

impl ArrivalSource for NoisySource {
    /// Requests one by one are drawn already (the scaling of trace streams, Poisson tenants).
    fn next_until(&mut self, until_ms: f64, out: &mut Vec<Arrival>) -> Result<(), ReplayError> {
        self.inner.next_until(until_ms, out)
    }

    fn count_until(&mut self, until_ms: f64, counts: &mut TickCounts) -> Result<(), ReplayError> {
        let tenants = counts.tenants;
        debug_assert_eq!(tenants, self.rngs.len(), "a noisy source draws for the tenants it was opened for");
        self.fine.reset(counts.from_ms, until_ms, self.tick_ms, tenants);
        self.inner.count_until(until_ms, &mut self.fine)?;
        let ticks = self.fine.ticks();
        // The cell of tick `j`, counted from time zero (to rounding: a tick starts on a cell boundary or inside it).
        let cell_of = |j: usize| ((self.fine.from_ms + j as f64 * self.tick_ms) / self.cell_ms + 1e-9).floor() as u64;
        let mut k = 0;
        while k < ticks {
            let cell = cell_of(k);
            let mut end = k + 1;
            while end < ticks && cell_of(end) == cell {
                end += 1;
            }
            for (t, rng) in self.rngs.iter_mut().enumerate().take(tenants) {
                let at = |j: usize| j * tenants + t;
                let mean: f64 = (k..end).map(|j| self.fine.counts[at(j)]).sum();
                if mean.is_nan() || mean <= 0.0 {
                    continue;
                }
                rng.set_word_pos(u128::from(cell) * WORDS_PER_CELL);
                let drawn: f64 = rand_distr::Poisson::new(mean).map_or(mean, |p| rng.sample(p));
                let factor = drawn / mean;
                for j in k..end {
                    let n = self.fine.counts[at(j)];
                    if n > 0.0 {
                        counts.add(t, self.fine.from_ms + j as f64 * self.tick_ms, n * factor);
                    }
                }
            }
            k = end;
        }
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

    /// Points and spreads land in the ticks they overlap, in proportion, across emits that cut through them;
    /// nothing is lost or invented.
    #[test]
    fn tick_spread_puts_each_mass_in_the_ticks_it_covers() {
        let mut spread = TickSpread::new(100.0, 2);
        spread.point(0, 250.0, 3.0);
        // 10 over [150, 650): 1 per 5 ms... 2 per 10 ms: ticks 1 (half), 2-5 (whole), 6 (half).
        spread.uniform(1, 150.0, 650.0, 10.0);
        spread.uniform(0, 420.0, 440.0, 1.0); // inside one tick
        let mut got = TickCounts::default();
        got.reset(0.0, 400.0, 100.0, 2);
        spread.emit(400.0, &mut got);
        assert_eq!(got.tick(0), &[0.0, 0.0]);
        assert_eq!(got.tick(1), &[0.0, 1.0]);
        assert_eq!(got.tick(2), &[3.0, 2.0]);
        assert_eq!(got.tick(3), &[0.0, 2.0]);
        let mut rest = TickCounts::default();
        rest.reset(400.0, 1000.0, 100.0, 2);
        spread.emit(1000.0, &mut rest);
        let col = |t: usize| (0..rest.ticks()).map(|k| rest.tick(k)[t]).collect::<Vec<_>>();
        assert_eq!(col(1), vec![2.0, 2.0, 1.0, 0.0, 0.0, 0.0]);
        assert_eq!(col(0), vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(got.total() + rest.total(), 14.0);
        // Later masses after an empty stretch start where they land.
        spread.point(1, 5_050.0, 1.0);
        let mut late = TickCounts::default();
        late.reset(5_000.0, 5_100.0, 100.0, 2);
        spread.emit(5_100.0, &mut late);
        assert_eq!(late.tick(0), &[0.0, 1.0]);
    }

    /// Expected counts of a Poisson set are its rates over each tick's overlap with the run.
    #[test]
    fn poisson_counts_are_expected_counts() {
        let set = PoissonSet { seed: 3, rates: vec![(TenantIndex(1), 50.0)], end_ms: 250.0 };
        let mut c = TickCounts::default();
        c.reset(0.0, 300.0, 100.0, 2);
        set.open().unwrap().count_until(300.0, &mut c).unwrap();
        assert_eq!(c.tick(0), &[0.0, 5.0]);
        assert_eq!(c.tick(2), &[0.0, 2.5]);
        // The default: drawn requests, counted.
        struct Drawn(Box<dyn ArrivalSource>);
        impl ArrivalSource for Drawn {
            fn next_until(&mut self, until_ms: f64, out: &mut Vec<Arrival>) -> Result<(), ReplayError> {
                self.0.next_until(until_ms, out)
            }
        }
        let set = PoissonSet { seed: 3, rates: vec![(TenantIndex(0), 500.0)], end_ms: 10_000.0 };
        let mut drawn = Drawn(set.open().unwrap());
        c.reset(0.0, 10_000.0, 1_000.0, 2);
        drawn.count_until(10_000.0, &mut c).unwrap();
        let mut all = Vec::new();
        set.open().unwrap().next_until(10_000.0, &mut all).unwrap();
        assert_eq!(c.total(), all.len() as f64);
        assert!((c.total() - 5_000.0).abs() < 250.0);
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

    #[test]
    fn noisy_counts_are_drawn_the_same_however_the_reader_cuts_them() {
        let noisy = |seed| Noisy {
            inner: Box::new(PoissonSet {
                seed: 1,
                rates: vec![(TenantIndex(0), 40.0), (TenantIndex(1), 2.0)],
                end_ms: 60_000.0,
            }),
            seed,
            tenants: 2,
            tick_ms: 100.0,
            cell_ms: Noisy::cell_for(100.0, 10_000.0, 30_000.0),
        };
        assert_eq!(Noisy::cell_for(100.0, 10_000.0, 30_000.0), 1_000.0);
        assert_eq!(Noisy::cell_for(300.0, 2_100.0, 4_200.0), 300.0);
        // Per slot (the truth table's cut) and per window at the tick (a policy's): the same totals per slot.
        let per = |seed, cut_ms: f64, tick_ms: f64| {
            let mut src = noisy(seed).open().unwrap();
            let mut slots = vec![[0.0f64; 2]; 6];
            let mut c = TickCounts::default();
            let mut from = 0.0;
            while from < 60_000.0 {
                let to = (from + cut_ms).min(60_000.0);
                c.reset(from, to, tick_ms, 2);
                src.count_until(to, &mut c).unwrap();
                for k in 0..c.ticks() {
                    let slot = ((from + k as f64 * tick_ms) / 10_000.0) as usize;
                    for (sum, n) in slots[slot].iter_mut().zip(c.tick(k)) {
                        *sum += n;
                    }
                }
                from = to;
            }
            slots
        };
        let by_slot = per(7, 10_000.0, 10_000.0);
        let by_window = per(7, 30_000.0, 100.0);
        for (a, b) in by_slot.iter().zip(&by_window) {
            for t in 0..2 {
                assert!((a[t] - b[t]).abs() < 1e-6, "{by_slot:?} vs {by_window:?}");
            }
        }
        // Whole requests per cell, near the mean, and another seed draws others.
        let total: f64 = by_slot.iter().map(|s| s[0]).sum();
        assert!((total - 2_400.0).abs() < 250.0, "{total}");
        assert!(by_slot.iter().flatten().all(|n| (n - n.round()).abs() < 1e-6), "{by_slot:?}");
        assert_ne!(by_slot, per(8, 10_000.0, 10_000.0));
    }
}
