//! The per-row formats (Azure Functions 2021, Azure LLM, generic): one request per row. Pass 1 accumulates per-key
//! counts, tokens and durations over the window and measures how far file order strays from arrival order; pass 2
//! streams the rows again through a reorder buffer of that horizon, so arrivals come out sorted with memory bounded
//! by the arrivals within the horizon.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap};

use super::error::{RowError, TraceError};
use super::reader::{BadRows, CsvFile};
use super::row::{Row, RowParser};
use super::{Pass1, Plan, StreamStats, TraceFormat, TraceOptions, TraceScan};
use super::{azure_llm, azure2021, build_scan, finish, generic, key_index};

/// Parses the row `csv` stands on with the adapter of `parser`'s format, then puts it on the synthetic clock where one
/// is asked for.
#[inline]
fn parse_row(parser: &mut RowParser, csv: &CsvFile) -> Result<Row, RowError> {
    let mut row = match parser.format {
        TraceFormat::AzureFunctions2021 => azure2021::parse(csv, parser.group_by, &mut parser.key)?,
        TraceFormat::AzureLlm => azure_llm::parse(csv, parser)?,
        _ => generic::parse(csv, parser)?,
    };
    // Only accepted rows advance the clock, so both passes see the same times.
    if let Some(clock) = &mut parser.synthetic {
        row.t = clock.tick();
        row.order_t = row.t;
    }
    Ok(row)
}

#[derive(Default)]
struct Acc {
    requests: u64,
    tokens: f64,
    duration_sum_s: f64,
    durations: u64,
}

/// Pass 1 of the per-row formats.
pub(crate) fn scan(mut csv: CsvFile, format: TraceFormat, opts: &TraceOptions) -> Result<TraceScan, TraceError> {
    let mut parser = RowParser::new(format, opts, &csv);
    let (ws, we) = (opts.window_start_s, opts.window_end_s());
    let mut bad = BadRows::new(opts.skip_bad_rows);
    let mut acc: HashMap<Box<[u8]>, Acc> = HashMap::new();
    let mut rows = 0u64;
    let mut running_max = f64::NEG_INFINITY;
    // The line that set `running_max`: where a late row's culprit may be (a far-future timestamp).
    let mut max_line = 0u64;
    let mut needed = 0.0f64;
    let mut late_rows = 0u64;
    let mut last_t = ws;
    let mut has_tokens = false;
    let (mut all_tokens, mut all_requests) = (0.0f64, 0u64);
    while csv.next()? {
        rows += 1;
        let row = match parse_row(&mut parser, &csv) {
            Ok(r) => r,
            Err(e) => {
                bad.handle(e)?;
                continue;
            }
        };
        if row.order_t > running_max {
            (running_max, max_line) = (row.order_t, csv.line());
        }
        needed = needed.max(running_max - row.t);
        if row.t < ws || row.t >= we {
            continue;
        }
        if running_max - row.t > opts.max_reorder_s {
            if !opts.skip_bad_rows {
                return Err(late_row(&csv, row.t, running_max, max_line, opts.max_reorder_s).into());
            }
            late_rows += 1;
        }
        last_t = last_t.max(row.t);
        let a = match acc.get_mut(parser.key.as_slice()) {
            Some(a) => a,
            None => acc.entry(parser.key.clone().into_boxed_slice()).or_default(),
        };
        a.requests += 1;
        if let Some(t) = row.tokens {
            has_tokens = true;
            a.tokens += t;
            all_tokens += t;
        }
        if let Some(d) = row.duration_s {
            a.duration_sum_s += d;
            a.durations += 1;
        }
        all_requests += 1;
    }
    let mean_tokens = (has_tokens && all_requests > 0).then(|| all_tokens / all_requests as f64);
    let mut streams: Vec<StreamStats> = acc
        .into_iter()
        .map(|(k, a)| {
            let mut s = StreamStats::new(String::from_utf8_lossy(&k).into_owned(), a.requests);
            if let Some(m) = mean_tokens.filter(|m| *m > 0.0) {
                s.mean_work = a.tokens / a.requests as f64 / m;
            }
            if a.durations > 0 {
                s.mean_duration_ms = Some(a.duration_sum_s / a.durations as f64 * 1000.0);
            }
            s
        })
        .collect();
    // Deterministic before ranking (HashMap order is not).
    streams.sort_by(|a, b| a.key.cmp(&b.key));
    let window_end_s = if we.is_finite() { we } else { last_t };
    let mut p = Pass1 { rows, bad, skipped_rows: 0, window_start_s: ws, window_end_s, streams };
    let (picked, total_requests, total_streams) = finish(&mut p, opts);
    let keys = key_index(&picked);
    let plan = Plan::Rows { keys, origin_ns: parser.origin_ns.unwrap_or(0) };
    let path = csv.path.clone();
    let mut scan = build_scan(path, format, p, picked, total_requests, total_streams, opts, plan);
    scan.mean_tokens = mean_tokens;
    scan.start_timestamp = parser.origin_text.take();
    scan.reorder_needed_s = needed;
    scan.reorder_horizon_s = needed.min(opts.max_reorder_s);
    scan.late_rows = late_rows;
    Ok(scan)
}

/// The error of a row (the current one of `csv`, at trace time `t`) out of order by more than `--max-reorder`
/// behind the latest time read before it (`latest`, on line `latest_line`): either line may be the wrong one, so it
/// names both.
fn late_row(csv: &CsvFile, t: f64, latest: f64, latest_line: u64, max_reorder_s: f64) -> RowError {
    RowError {
        path: csv.path.clone(),
        line: csv.line(),
        column: None,
        message: format!(
            "time {t} s is {:.0} s before the time {latest} s of line {latest_line}, more out of order than \
             --max-reorder {max_reorder_s} s allows: correct whichever of the two lines is wrong, sort the file, \
             raise --max-reorder, or pass --skip-bad-rows to replay such rows late (counted and reported)",
            latest - t
        ),
    }
}

/// An arrival waiting in a reorder buffer, ordered by time then by file order.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub t: f64,
    pub seq: u64,
    pub stream: u32,
    pub work: f64,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        self.t.total_cmp(&other.t).then(self.seq.cmp(&other.seq))
    }
}

/// Pass 2 of the per-row formats: the file streamed through the reorder buffer.
pub(crate) struct RowSource {
    csv: CsvFile,
    parser: RowParser,
    keys: HashMap<Box<[u8]>, u32>,
    heap: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    running_max: f64,
    /// How far reading has got, for deciding when to stop: the latest time read among rows that can matter to the
    /// window (`running_max` without the rows beyond the window's end and horizon: one such row, out of order far
    /// beyond the horizon, once stopped the reading for good and lost the whole window).
    frontier: f64,
    horizon: f64,
    needed: f64,
    done: bool,
    window: (f64, f64),
    mean_tokens: Option<f64>,
    last_emitted: f64,
    pub late_rows: u64,
    pub bad: BadRows,
    pub max_buffered: usize,
}

impl RowSource {
    /// Pass 2 over the scan's window cut at `end` (trace seconds): rows at or after it are skipped, and reading
    /// stops once every later row must be.
    pub fn open(scan: &TraceScan, end: f64) -> Result<RowSource, TraceError> {
        let Plan::Rows { keys, origin_ns } = &scan.plan else { unreachable!("row source on a non-row plan") };
        let csv = CsvFile::open(&scan.path)?;
        let mut parser = RowParser::new(scan.format, &scan.opts, &csv);
        parser.origin_ns = Some(*origin_ns);
        let window = (scan.opts.window_start_s, scan.opts.window_end_s().min(end));
        Ok(RowSource {
            csv,
            parser,
            keys: keys.clone(),
            heap: BinaryHeap::new(),
            seq: 0,
            running_max: f64::NEG_INFINITY,
            frontier: f64::NEG_INFINITY,
            horizon: scan.reorder_horizon_s,
            needed: scan.reorder_needed_s,
            done: false,
            window,
            mean_tokens: scan.mean_tokens.filter(|m| *m > 0.0),
            last_emitted: f64::NEG_INFINITY,
            late_rows: 0,
            bad: BadRows::new(scan.opts.skip_bad_rows),
            max_buffered: 0,
        })
    }

    /// Appends every arrival with trace time `< until` not yet returned, sorted.
    pub fn fill(&mut self, until: f64, out: &mut Vec<Pending>) -> Result<(), TraceError> {
        while !self.done && self.frontier - self.horizon < until {
            if !self.csv.next()? {
                self.done = true;
                break;
            }
            let row = match parse_row(&mut self.parser, &self.csv) {
                Ok(r) => r,
                Err(e) => {
                    self.bad.handle(e)?;
                    continue;
                }
            };
            self.running_max = self.running_max.max(row.order_t);
            // A row beyond the window (and its horizon) cannot hold back a row of the window: it does not move the
            // frontier, or one far-off timestamp would stop the reading of every row after it.
            if row.order_t < self.window.1 + self.horizon {
                self.frontier = self.frontier.max(row.order_t);
            }
            if self.running_max - self.needed >= self.window.1 {
                // Every later row arrives at or after the window's end (pass 1 measured how late rows come).
                self.done = true;
            }
            if row.t < self.window.0 || row.t >= self.window.1 {
                continue;
            }
            let Some(&stream) = self.keys.get(self.parser.key.as_slice()) else { continue };
            let work = match (row.tokens, self.mean_tokens) {
                (Some(t), Some(m)) => t / m,
                _ => 1.0,
            };
            self.heap.push(Reverse(Pending { t: row.t, seq: self.seq, stream, work }));
            self.seq += 1;
            self.max_buffered = self.max_buffered.max(self.heap.len());
        }
        while let Some(Reverse(p)) = self.heap.peek() {
            if p.t >= until {
                break;
            }
            let mut p = *p;
            self.heap.pop();
            if p.t < self.last_emitted {
                // Later than the reorder horizon allowed (capped by max_reorder_s): emitted now, counted.
                self.late_rows += 1;
                p.t = self.last_emitted;
            }
            self.last_emitted = p.t;
            out.push(p);
        }
        Ok(())
    }
}
