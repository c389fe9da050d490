//! Pass 2: [`ArrivalStream`], the sampled streams' arrivals in time order, window by window.
//!
//! Three sources, by format: the per-row reorder buffer (`rows`), per-minute counts placed minute by minute (Azure
//! 2019), and per-stream sorted points merged through a heap (Alibaba pods, Azure 2019 `poisson-fit`). All three
//! produce trace times; this module applies rate scaling (per stream, seeded) and the window and time transforms.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rand_chacha::ChaCha8Rng;

use super::conventions::{CountsToArrivals, RateScaler, SortedUniforms, place_in_minute, purpose, stream_rng};
use super::error::TraceError;
use super::rows::{Pending, RowSource};
use super::{Plan, TraceArrival, TraceScan, azure2019};

enum Source {
    Rows(Box<RowSource>),
    Minutes(MinuteSource),
    Intervals(IntervalSource),
}

/// The arrivals of a scan's sampled streams, in time order (pass 2). Made by [`TraceScan::arrivals`].
pub struct ArrivalStream {
    source: Source,
    rate: RateScaler,
    rate_rngs: Vec<ChaCha8Rng>,
    window_start_s: f64,
    time_scale: f64,
    scratch: Vec<Pending>,
    held: Vec<Pending>,
    emitted: u64,
    bad_rows: u64,
    /// No arrival at or after this time (seconds from the window start, after time scaling) is read.
    end_s: f64,
}

impl ArrivalStream {
    pub(crate) fn open(scan: &TraceScan, rate_scale: f64, end_s: f64) -> Result<ArrivalStream, TraceError> {
        let opts = &scan.opts;
        let (source, bad_rows) = match &scan.plan {
            Plan::Rows { .. } => {
                let end = scan.window_start_s + end_s / opts.time_scale;
                (Source::Rows(Box::new(RowSource::open(scan, end)?)), 0)
            }
            Plan::Minutes { first_minute, .. } => {
                let (counts, bad) = azure2019::load_counts(scan)?;
                let rngs = scan.streams.iter().map(|s| stream_rng(opts.seed, &s.key, purpose::MINUTES)).collect();
                let source = MinuteSource {
                    counts,
                    rngs,
                    first_minute: *first_minute,
                    next: 0,
                    method: opts.counts_to_arrivals,
                    shift: opts.random_shift,
                    pending: VecDeque::new(),
                    buf: Vec::new(),
                    minute: Vec::new(),
                };
                (Source::Minutes(source), bad.count)
            }
            Plan::Intervals { spans } => {
                let mut rngs: Vec<ChaCha8Rng> =
                    scan.streams.iter().map(|s| stream_rng(opts.seed, &s.key, purpose::POINTS)).collect();
                let mut gens: Vec<SortedUniforms> =
                    spans.iter().map(|&(lo, hi, n)| SortedUniforms::new(lo, hi, n)).collect();
                let mut heap = BinaryHeap::with_capacity(gens.len());
                for (i, g) in gens.iter_mut().enumerate() {
                    if let Some(t) = g.next(&mut rngs[i]) {
                        heap.push(Reverse(Pending { t, seq: i as u64, stream: i as u32, work: 1.0 }));
                    }
                }
                (Source::Intervals(IntervalSource { gens, rngs, heap }), 0)
            }
        };
        let rate_rngs = scan.streams.iter().map(|s| stream_rng(opts.seed, &s.key, purpose::RATE)).collect();
        Ok(ArrivalStream {
            source,
            rate: RateScaler::new(rate_scale),
            rate_rngs,
            window_start_s: scan.window_start_s,
            time_scale: opts.time_scale,
            scratch: Vec::new(),
            held: Vec::new(),
            emitted: 0,
            bad_rows,
            end_s,
        })
    }

    /// Appends to `out`, in time order, every arrival with `time_s < until_s` not yet returned. Times are seconds
    /// from the window start, after time scaling.
    pub fn next_window(&mut self, until_s: f64, out: &mut Vec<TraceArrival>) -> Result<(), TraceError> {
        let until_s = until_s.min(self.end_s);
        let until = self.window_start_s + until_s / self.time_scale;
        self.scratch.clear();
        // Arrivals held back last time (their scaled time rounded onto the bound) come first.
        self.scratch.append(&mut self.held);
        match &mut self.source {
            Source::Rows(r) => r.fill(until, &mut self.scratch)?,
            Source::Minutes(m) => m.fill(until, &mut self.scratch),
            Source::Intervals(i) => i.fill(until, &mut self.scratch),
        }
        for p in &self.scratch {
            let time_s = (p.t - self.window_start_s) * self.time_scale;
            if time_s >= until_s {
                self.held.push(*p);
                continue;
            }
            let copies = self.rate.copies(&mut self.rate_rngs[p.stream as usize]);
            for _ in 0..copies {
                out.push(TraceArrival { stream: p.stream, time_s, work: p.work });
            }
            self.emitted += u64::from(copies);
        }
        Ok(())
    }

    /// Reads to the end and returns every remaining arrival (for small traces and tests).
    pub fn collect_all(mut self) -> Result<Vec<TraceArrival>, TraceError> {
        let mut out = Vec::new();
        self.next_window(f64::INFINITY, &mut out)?;
        Ok(out)
    }

    /// Arrivals returned so far (after rate scaling).
    pub fn emitted(&self) -> u64 {
        self.emitted
    }

    /// Per-row formats: rows that arrived later than the capped reorder horizon allowed (emitted at the current
    /// time instead of their own). Always 0 when `TraceScan::reorder_needed_s <= max_reorder_s`.
    pub fn late_rows(&self) -> u64 {
        match &self.source {
            Source::Rows(r) => r.late_rows,
            _ => 0,
        }
    }

    /// Malformed rows skipped so far in this pass.
    pub fn bad_rows(&self) -> u64 {
        match &self.source {
            Source::Rows(r) => r.bad.count,
            _ => self.bad_rows,
        }
    }

    /// Per-row formats: the most arrivals the reorder buffer held at once.
    pub fn max_buffered(&self) -> usize {
        match &self.source {
            Source::Rows(r) => r.max_buffered,
            _ => 0,
        }
    }
}

/// Azure 2019 minute conventions: each sampled stream's counts placed minute by minute; each minute's arrivals
/// stay inside it, so minutes come out in order after one sort each.
struct MinuteSource {
    counts: Vec<Vec<u32>>,
    rngs: Vec<ChaCha8Rng>,
    first_minute: usize,
    next: usize,
    method: CountsToArrivals,
    shift: bool,
    pending: VecDeque<Pending>,
    buf: Vec<f64>,
    minute: Vec<Pending>,
}

impl MinuteSource {
    fn fill(&mut self, until: f64, out: &mut Vec<Pending>) {
        let minutes = self.counts.first().map_or(0, Vec::len);
        while self.next < minutes && ((self.first_minute + self.next) as f64) * 60.0 < until {
            let base = (self.first_minute + self.next) as f64 * 60.0;
            self.minute.clear();
            for (s, counts) in self.counts.iter().enumerate() {
                self.buf.clear();
                place_in_minute(self.method, self.shift, counts[self.next], &mut self.rngs[s], &mut self.buf);
                self.minute.extend(self.buf.iter().map(|&t| Pending {
                    t: base + t,
                    seq: s as u64,
                    stream: s as u32,
                    work: 1.0,
                }));
            }
            self.minute.sort_unstable();
            self.pending.extend(self.minute.drain(..));
            self.next += 1;
        }
        while let Some(p) = self.pending.front() {
            if p.t >= until {
                break;
            }
            out.push(*p);
            self.pending.pop_front();
        }
    }
}

/// Streams of sorted points merged through a heap (one entry per stream).
struct IntervalSource {
    gens: Vec<SortedUniforms>,
    rngs: Vec<ChaCha8Rng>,
    heap: BinaryHeap<Reverse<Pending>>,
}

impl IntervalSource {
    fn fill(&mut self, until: f64, out: &mut Vec<Pending>) {
        while let Some(Reverse(p)) = self.heap.peek() {
            if p.t >= until {
                break;
            }
            let p = *p;
            self.heap.pop();
            out.push(p);
            let s = p.stream as usize;
            if let Some(t) = self.gens[s].next(&mut self.rngs[s]) {
                self.heap.push(Reverse(Pending { t, ..p }));
            }
        }
    }
}
