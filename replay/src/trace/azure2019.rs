//! Azure Functions 2019 (Shahrad et al., ATC 2020): `HashOwner,HashApp,HashFunction,Trigger,1,...,1440`, the
//! invocations of each function in each minute of one day (recorded when the invocation finishes; read here as
//! arrivals in that minute). Companion files joined by hash when present: `function_durations_percentiles.anon.dNN.csv`
//! (`Average` ms, weighted by `Count`, per function) and `app_memory_percentiles.anon.dNN.csv` (`AverageAllocatedMb`
//! per app).
//!
//! Rows are wide (1,444 fields), so pass 1 keeps one total per stream; once the sample is known, pass 2 reads the
//! file again and keeps the window's counts of the sampled streams only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::error::{RowError, TraceError};
use super::reader::{BadRows, CsvFile, parse_u64, shown};
use super::{
    CountsToArrivals, GroupBy, Join, Pass1, Plan, StreamStats, TraceFormat, TraceOptions, TraceScan, build_scan,
    finish, key_index,
};

/// Conventional file-name prefixes (`PREFIX.dNN.csv`).
pub(crate) const INVOCATIONS_PREFIX: &str = "invocations_per_function_md.anon";
pub(crate) const DURATIONS_PREFIX: &str = "function_durations_percentiles.anon";
pub(crate) const MEMORY_PREFIX: &str = "app_memory_percentiles.anon";

/// The durations file header.
pub(crate) const DURATIONS_HEADER: [&str; 14] = [
    "HashOwner",
    "HashApp",
    "HashFunction",
    "Average",
    "Count",
    "Minimum",
    "Maximum",
    "percentile_Average_0",
    "percentile_Average_1",
    "percentile_Average_25",
    "percentile_Average_50",
    "percentile_Average_75",
    "percentile_Average_99",
    "percentile_Average_100",
];

/// The memory file header.
pub(crate) const MEMORY_HEADER: [&str; 12] = [
    "HashOwner",
    "HashApp",
    "SampleCount",
    "AverageAllocatedMb",
    "AverageAllocatedMb_pct1",
    "AverageAllocatedMb_pct5",
    "AverageAllocatedMb_pct25",
    "AverageAllocatedMb_pct50",
    "AverageAllocatedMb_pct75",
    "AverageAllocatedMb_pct95",
    "AverageAllocatedMb_pct99",
    "AverageAllocatedMb_pct100",
];

/// Writes the group key of `(owner, app, function)` into `key`.
fn group_key(key: &mut Vec<u8>, group_by: GroupBy, owner: &[u8], app: Option<&[u8]>, func: Option<&[u8]>) {
    key.clear();
    key.extend_from_slice(owner);
    if group_by != GroupBy::Owner
        && let Some(app) = app
    {
        key.push(b'/');
        key.extend_from_slice(app);
        if group_by == GroupBy::Function
            && let Some(func) = func
        {
            key.push(b'/');
            key.extend_from_slice(func);
        }
    }
}

/// Validates one invocations row (every count) and writes its group key; returns the window's total.
fn parse_row(csv: &CsvFile, group_by: GroupBy, key: &mut Vec<u8>, window: (usize, usize)) -> Result<u64, RowError> {
    let columns = csv.header.len();
    csv.check_len(columns)?;
    let owner = csv.key(0)?;
    let app = csv.key(1)?;
    let func = csv.key(2)?;
    let mut total = 0u64;
    for (m, field) in csv.rec.iter().enumerate().skip(4) {
        let v = parse_u64(field)
            .filter(|v| *v <= u64::from(u32::MAX))
            .ok_or_else(|| csv.err(m, format!("expected an invocation count, found {}", shown(field))))?;
        let minute = m - 4;
        if minute >= window.0 && minute < window.1 {
            total += v;
        }
    }
    group_key(key, group_by, owner, Some(app), Some(func));
    Ok(total)
}

/// The window as minute indices `[first, end)`: the minutes whose start lies in `[start, start + duration)`.
fn window_minutes(opts: &TraceOptions, minutes: usize) -> (usize, usize) {
    let first = ((opts.window_start_s / 60.0).ceil() as usize).min(minutes);
    let end = match opts.window_duration_s {
        Some(d) => (((opts.window_start_s + d) / 60.0).ceil() as usize).min(minutes),
        None => minutes,
    };
    (first, end.max(first))
}

/// Pass 1.
pub(crate) fn scan(mut csv: CsvFile, opts: &TraceOptions) -> Result<TraceScan, TraceError> {
    let minutes = csv.header.len() - 4;
    let (first, end) = window_minutes(opts, minutes);
    let mut bad = BadRows::new(opts.skip_bad_rows);
    let mut acc: HashMap<Box<[u8]>, (u64, String)> = HashMap::new();
    let mut key = Vec::with_capacity(200);
    let mut rows = 0u64;
    while csv.next()? {
        rows += 1;
        let total = match parse_row(&csv, opts.group_by, &mut key, (first, end)) {
            Ok(t) => t,
            Err(e) => {
                bad.handle(e)?;
                continue;
            }
        };
        if total == 0 {
            continue;
        }
        let trigger = csv.field(3).trim_ascii();
        match acc.get_mut(key.as_slice()) {
            Some((n, label)) => {
                *n += total;
                if label.as_bytes() != trigger {
                    *label = "mixed".to_string();
                }
            }
            None => {
                acc.insert(key.clone().into_boxed_slice(), (total, String::from_utf8_lossy(trigger).into_owned()));
            }
        }
    }
    let mut streams: Vec<StreamStats> = acc
        .into_iter()
        .map(|(k, (n, label))| {
            let mut s = StreamStats::new(String::from_utf8_lossy(&k).into_owned(), n);
            s.label = Some(label);
            s
        })
        .collect();
    streams.sort_by(|a, b| a.key.cmp(&b.key));
    let (ws, we) = (first as f64 * 60.0, end as f64 * 60.0);
    let mut p = Pass1 { rows, bad, skipped_rows: 0, window_start_s: ws, window_end_s: we, streams };
    let (mut picked, total_requests, total_streams) = finish(&mut p, opts);
    let join = join(&csv.path, &mut picked, opts, &mut p.bad)?;
    let plan = if opts.counts_to_arrivals == CountsToArrivals::PoissonFit {
        Plan::Intervals { spans: picked.iter().map(|s| (ws, we, s.requests)).collect() }
    } else {
        Plan::Minutes { keys: key_index(&picked), first_minute: first, minutes: end - first, columns: minutes + 4 }
    };
    let path = csv.path.clone();
    let mut scan =
        build_scan(path, TraceFormat::AzureFunctions2019, p, picked, total_requests, total_streams, opts, plan);
    scan.join = Some(join);
    Ok(scan)
}

/// Pass 2 (minute conventions): the window's counts of each sampled stream, `counts[stream][minute - first]`.
pub(crate) fn load_counts(scan: &TraceScan) -> Result<(Vec<Vec<u32>>, BadRows), TraceError> {
    let Plan::Minutes { keys, first_minute, minutes, columns } = &scan.plan else {
        unreachable!("minute counts on a non-minute plan")
    };
    let mut csv = CsvFile::open(&scan.path)?;
    if csv.header.len() != *columns {
        return Err(TraceError::io(&scan.path, std::io::Error::other("the trace changed between the two passes")));
    }
    let window = (*first_minute, first_minute + minutes);
    let mut counts = vec![vec![0u32; *minutes]; scan.streams.len()];
    let mut bad = BadRows::new(scan.opts.skip_bad_rows);
    let mut key = Vec::with_capacity(200);
    while csv.next()? {
        match parse_row(&csv, scan.opts.group_by, &mut key, window) {
            Ok(_) => {}
            Err(e) => {
                bad.handle(e)?;
                continue;
            }
        }
        let Some(&s) = keys.get(key.as_slice()) else { continue };
        let dst = &mut counts[s as usize];
        for (i, field) in csv.rec.iter().skip(4 + window.0).take(*minutes).enumerate() {
            // Validated by parse_row.
            let v = parse_u64(field).unwrap_or(0) as u32;
            dst[i] = dst[i].saturating_add(v);
        }
    }
    Ok((counts, bad))
}

/// `PREFIX.dNN.csv` beside `trace` when `trace` is named `*.dNN.csv`.
pub(crate) fn sibling(trace: &Path, prefix: &str) -> Option<PathBuf> {
    let name = trace.file_name()?.to_str()?;
    let stem = name.strip_suffix(".csv")?;
    let (_, tag) = stem.rsplit_once('.')?;
    let digits = tag.strip_prefix('d')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(trace.with_file_name(format!("{prefix}.{tag}.csv")))
}

/// The companion file to read: the one given (must exist), or the conventional sibling when it exists.
fn companion(trace: &Path, given: &Option<PathBuf>, prefix: &str) -> Option<PathBuf> {
    match given {
        Some(p) => Some(p.clone()),
        None => sibling(trace, prefix).filter(|p| p.is_file()),
    }
}

fn column(csv: &CsvFile, name: &str, expected: &[&str]) -> Result<usize, TraceError> {
    csv.header.iter().position(|h| h == name).ok_or_else(|| TraceError::UnknownHeader {
        path: csv.path.clone(),
        header: csv.header.join(","),
        known: expected.join(","),
    })
}

/// Joins durations and memory onto the sampled streams.
fn join(trace: &Path, streams: &mut [StreamStats], opts: &TraceOptions, bad: &mut BadRows) -> Result<Join, TraceError> {
    let mut join = Join::default();
    let index = key_index(streams);
    let mut key = Vec::with_capacity(200);
    if let Some(path) = companion(trace, &opts.durations_path, DURATIONS_PREFIX) {
        let mut csv = CsvFile::open(&path)?;
        if csv.header.get(..3) != Some(&DURATIONS_HEADER[..3].iter().map(|s| s.to_string()).collect::<Vec<_>>()[..]) {
            return Err(TraceError::UnknownHeader {
                path,
                header: csv.header.join(","),
                known: format!("durations file ({})", DURATIONS_HEADER.join(",")),
            });
        }
        let avg_col = column(&csv, "Average", &DURATIONS_HEADER)?;
        let count_col = column(&csv, "Count", &DURATIONS_HEADER)?;
        let mut sums = vec![(0.0f64, 0.0f64); streams.len()];
        while csv.next()? {
            let row = (|| -> Result<Option<(usize, f64, f64)>, RowError> {
                csv.check_len(csv.header.len())?;
                let (o, a, f) = (csv.key(0)?, csv.key(1)?, csv.key(2)?);
                let avg = csv.opt_f64(avg_col)?;
                let count = csv.opt_f64(count_col)?;
                group_key(&mut key, opts.group_by, o, Some(a), Some(f));
                let Some(&s) = index.get(key.as_slice()) else { return Ok(None) };
                // Negative or missing averages occur in the real data: unknown, not an error.
                let Some(avg) = avg.filter(|v| *v >= 0.0) else { return Ok(None) };
                let weight = count.filter(|c| *c > 0.0).unwrap_or(1.0);
                Ok(Some((s as usize, avg, weight)))
            })();
            match row {
                Ok(Some((s, avg, w))) => {
                    sums[s].0 += avg * w;
                    sums[s].1 += w;
                }
                Ok(None) => {}
                Err(e) => bad.handle(e)?,
            }
        }
        for (s, (sum, w)) in streams.iter_mut().zip(sums) {
            if w > 0.0 {
                s.mean_duration_ms = Some(sum / w);
                join.streams_with_duration += 1;
            }
        }
        join.durations_path = Some(path);
    }
    if let Some(path) = companion(trace, &opts.memory_path, MEMORY_PREFIX) {
        let mut csv = CsvFile::open(&path)?;
        if csv.header.get(..2) != Some(&["HashOwner".to_string(), "HashApp".to_string()][..]) {
            return Err(TraceError::UnknownHeader {
                path,
                header: csv.header.join(","),
                known: format!("memory file ({})", MEMORY_HEADER.join(",")),
            });
        }
        let mem_col = column(&csv, "AverageAllocatedMb", &MEMORY_HEADER)?;
        // Function streams take their app's memory: app key -> the sampled functions of that app.
        let mut by_app: HashMap<Box<[u8]>, Vec<usize>> = HashMap::new();
        for (i, s) in streams.iter().enumerate() {
            let app_key = match opts.group_by {
                GroupBy::Function => s.key.rsplit_once('/').map_or(s.key.as_str(), |(app, _)| app),
                _ => s.key.as_str(),
            };
            by_app.entry(app_key.as_bytes().to_vec().into_boxed_slice()).or_default().push(i);
        }
        let mut mem: Vec<Option<f64>> = vec![None; streams.len()];
        while csv.next()? {
            let row = (|| -> Result<Option<f64>, RowError> {
                csv.check_len(csv.header.len())?;
                let (o, a) = (csv.key(0)?, csv.key(1)?);
                let v = csv.opt_f64(mem_col)?;
                let level = if opts.group_by == GroupBy::Owner { GroupBy::Owner } else { GroupBy::App };
                group_key(&mut key, level, o, Some(a), None);
                Ok(v.filter(|v| *v >= 0.0))
            })();
            match row {
                Ok(Some(v)) => {
                    if let Some(targets) = by_app.get(key.as_slice()) {
                        for &i in targets {
                            // An owner sums its apps' memory; an app or function takes its app's.
                            *mem[i].get_or_insert(0.0) += v;
                        }
                    }
                }
                Ok(None) => {}
                Err(e) => bad.handle(e)?,
            }
        }
        for (s, m) in streams.iter_mut().zip(mem) {
            if m.is_some() {
                s.memory_mb = m;
                join.streams_with_memory += 1;
            }
        }
        join.memory_path = Some(path);
    }
    Ok(join)
}
