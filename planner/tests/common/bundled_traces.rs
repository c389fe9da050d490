//! Loaders for the traces bundled in `traces/` at the repository root, as arrival-rate series: shared by the
//! forecast evaluation example and the forecast tests (`#[path]`-included by both).

use std::path::PathBuf;

/// The content of a bundled trace.
pub fn read_trace(file: &str) -> Result<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces").join(file);
    std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// The values of the named columns, row by row (the bundled traces have no quoted fields).
pub fn columns<'a>(content: &'a str, names: &[&str]) -> Result<Vec<Vec<&'a str>>, String> {
    let mut lines = content.lines();
    let header: Vec<&str> = lines.next().ok_or("empty file")?.split(',').collect();
    let idx: Vec<usize> = names
        .iter()
        .map(|n| header.iter().position(|h| h.trim() == *n).ok_or(format!("no column {n}")))
        .collect::<Result<_, _>>()?;
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let fields: Vec<&str> = l.split(',').collect();
            idx.iter().map(|&i| fields.get(i).copied().ok_or(format!("short row: {l}"))).collect()
        })
        .collect()
}

/// A number field.
pub fn num(s: &str) -> Result<f64, String> {
    s.trim().parse().map_err(|e| format!("{s:?}: {e}"))
}

/// Seconds since midnight of a `2023-11-16 18:17:03.9799600` timestamp.
pub fn time_of_day(ts: &str) -> Result<f64, String> {
    let time = ts.split_whitespace().nth(1).ok_or(format!("no time in {ts:?}"))?;
    let mut parts = time.split(':');
    let mut next = || parts.next().ok_or(format!("bad time {ts:?}")).and_then(num);
    Ok(next()? * 3600.0 + next()? * 60.0 + next()?)
}

/// Counts events per slot of `width` seconds from `start`, complete slots only, divided by `per`.
pub fn bin(times: &[f64], start: f64, width: f64, per: f64) -> Vec<f64> {
    let end = times.iter().copied().fold(start, f64::max);
    let slots = ((end - start) / width).floor() as usize;
    let mut counts = vec![0.0; slots];
    for &t in times {
        let slot = ((t - start) / width).floor();
        if slot >= 0.0 && (slot as usize) < slots {
            counts[slot as usize] += 1.0;
        }
    }
    counts.iter().map(|c| c / per).collect()
}

/// Requests/s of an Azure LLM 2023 trace in 10 s slots.
pub fn azure_llm(file: &str) -> Result<Vec<f64>, String> {
    let content = read_trace(file)?;
    let times: Vec<f64> =
        columns(&content, &["TIMESTAMP"])?.iter().map(|r| time_of_day(r[0])).collect::<Result<_, _>>()?;
    let start = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(bin(&times, start, 10.0, 10.0))
}

/// Invocations/s of the Azure Functions 2021 sample in 10 s slots.
pub fn azure_functions() -> Result<Vec<f64>, String> {
    let content = read_trace("azure-functions-2021-sample.csv")?;
    let times: Vec<f64> = columns(&content, &["end_timestamp", "duration"])?
        .iter()
        .map(|r| Ok((num(r[0])? - num(r[1])?).max(0.0)))
        .collect::<Result<_, String>>()?;
    Ok(bin(&times, 0.0, 10.0, 10.0))
}

/// Hourly pod creations of the Alibaba trace from the first day (24 h from time 0) with at least 24 of them.
pub fn alibaba_hourly() -> Result<Vec<f64>, String> {
    let content = read_trace("alibaba-openb-2023-pods.csv")?;
    let times: Vec<f64> = columns(&content, &["creation_time"])?.iter().map(|r| num(r[0])).collect::<Result<_, _>>()?;
    let hourly = bin(&times, 0.0, 3600.0, 1.0);
    let first_busy_day = hourly.chunks(24).position(|day| day.iter().sum::<f64>() >= 24.0).unwrap_or(0);
    Ok(hourly[first_busy_day * 24..].to_vec())
}
