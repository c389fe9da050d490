//! Evaluates the forecasters of `tessera_planner::forecast` on the traces bundled in `traces/` at the repository root
//! and prints MAE, WAPE and band coverage per series, forecaster and horizon (`--json` for the same as JSON).
//!
//! Series (only complete slots are kept: the last, partial one is dropped):
//! - `azure-llm-2023-{code,conv}`: request arrivals (time of day of `TIMESTAMP`) in 10 s slots, requests/s;
//! - `azure-functions-2021-sample`: invocation arrivals (`end_timestamp - duration`) in 10 s slots, requests/s;
//! - `alibaba-openb-2023-pods`: pod creations (`creation_time`) in 1 h slots, pods/h, starting at the first day
//!   (24 h from time 0) with at least 24 creations: the trace's first 115 days are almost empty.
//!
//! Run with `cargo run -p tessera-planner --example forecast_eval --release [-- --json]`.

use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use tessera_planner::forecast::{ForecastError, ForecasterConfig, evaluate};

/// One series to evaluate and how.
struct Series {
    name: &'static str,
    unit: &'static str,
    slot_s: f64,
    values: Vec<f64>,
    horizons: [usize; 2],
    warmup: usize,
    /// Period in slots for the seasonal forecaster, where one makes sense.
    period: Option<usize>,
}

fn read_trace(file: &str) -> Result<String, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces").join(file);
    std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))
}

/// The values of the named columns, row by row (the bundled traces have no quoted fields).
fn columns<'a>(content: &'a str, names: &[&str]) -> Result<Vec<Vec<&'a str>>, String> {
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

fn num(s: &str) -> Result<f64, String> {
    s.trim().parse().map_err(|e| format!("{s:?}: {e}"))
}

/// Seconds since midnight of a `2023-11-16 18:17:03.9799600` timestamp.
fn time_of_day(ts: &str) -> Result<f64, String> {
    let time = ts.split_whitespace().nth(1).ok_or(format!("no time in {ts:?}"))?;
    let mut parts = time.split(':');
    let mut next = || parts.next().ok_or(format!("bad time {ts:?}")).and_then(num);
    Ok(next()? * 3600.0 + next()? * 60.0 + next()?)
}

/// Counts events per slot of `width` seconds from `start`, complete slots only, divided by `per`.
fn bin(times: &[f64], start: f64, width: f64, per: f64) -> Vec<f64> {
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

fn azure_llm(file: &str) -> Result<Vec<f64>, String> {
    let content = read_trace(file)?;
    let times: Vec<f64> =
        columns(&content, &["TIMESTAMP"])?.iter().map(|r| time_of_day(r[0])).collect::<Result<_, _>>()?;
    let start = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok(bin(&times, start, 10.0, 10.0))
}

fn azure_functions() -> Result<Vec<f64>, String> {
    let content = read_trace("azure-functions-2021-sample.csv")?;
    let times: Vec<f64> = columns(&content, &["end_timestamp", "duration"])?
        .iter()
        .map(|r| Ok((num(r[0])? - num(r[1])?).max(0.0)))
        .collect::<Result<_, String>>()?;
    Ok(bin(&times, 0.0, 10.0, 10.0))
}

fn alibaba_hourly() -> Result<Vec<f64>, String> {
    let content = read_trace("alibaba-openb-2023-pods.csv")?;
    let times: Vec<f64> = columns(&content, &["creation_time"])?.iter().map(|r| num(r[0])).collect::<Result<_, _>>()?;
    let hourly = bin(&times, 0.0, 3600.0, 1.0);
    let first_busy_day = hourly.chunks(24).position(|day| day.iter().sum::<f64>() >= 24.0).unwrap_or(0);
    Ok(hourly[first_busy_day * 24..].to_vec())
}

fn series() -> Result<Vec<Series>, String> {
    let ten_s = |name, values, period| Series {
        name,
        unit: "req/s",
        slot_s: 10.0,
        values,
        horizons: [1, 20],
        warmup: 30,
        period,
    };
    Ok(vec![
        ten_s("azure-llm-2023-code", azure_llm("azure-llm-2023-code.csv")?, None),
        ten_s("azure-llm-2023-conv", azure_llm("azure-llm-2023-conv.csv")?, None),
        // Timer-triggered functions fire every minute: a 6-slot period.
        ten_s("azure-functions-2021-sample", azure_functions()?, Some(6)),
        Series {
            name: "alibaba-openb-2023-pods",
            unit: "pods/h",
            slot_s: 3600.0,
            values: alibaba_hourly()?,
            horizons: [1, 24],
            warmup: 48,
            period: Some(24),
        },
    ])
}

fn configs(period: Option<usize>) -> Vec<ForecasterConfig> {
    let mut configs =
        vec![ForecasterConfig::Last, ForecasterConfig::Ewma { alpha: 0.3 }, ForecasterConfig::Ewma { alpha: 0.1 }];
    if let Some(period_slots) = period {
        configs.push(ForecasterConfig::Seasonal { period_slots, alpha: 0.1, gamma: 0.2 });
    }
    configs
}

fn main() -> ExitCode {
    let as_json = match std::env::args().nth(1).as_deref() {
        None => false,
        Some("--json") => true,
        Some(other) => {
            eprintln!("unknown argument {other:?}; usage: forecast_eval [--json]");
            return ExitCode::from(2);
        }
    };
    let all = match series() {
        Ok(all) => all,
        Err(e) => {
            eprintln!("forecast_eval: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut report = Vec::new();
    for s in &all {
        let mean = s.values.iter().sum::<f64>() / s.values.len().max(1) as f64;
        let mut rows: Vec<(ForecasterConfig, usize, ForecastError)> = Vec::new();
        for &h in &s.horizons {
            for config in configs(s.period) {
                let err = evaluate(&s.values, &config, h, s.warmup);
                rows.push((config, h, err));
            }
        }
        if as_json {
            let results: Vec<_> = rows
                .iter()
                .map(|(c, h, e)| json!({"forecaster": c, "label": c.to_string(), "horizon": h, "error": e}))
                .collect();
            report.push(json!({
                "series": s.name, "unit": s.unit, "slot_s": s.slot_s, "slots": s.values.len(),
                "mean": mean, "warmup": s.warmup, "results": results,
            }));
        } else {
            println!(
                "{}: {} slots of {} s, mean {mean:.2} {}, warmup {}",
                s.name,
                s.values.len(),
                s.slot_s,
                s.unit,
                s.warmup
            );
            println!("  {:<26} {:>3} {:>8} {:>6} {:>6}", "forecaster", "h", "MAE", "WAPE", "cover");
            for (c, h, e) in &rows {
                println!("  {:<26} {h:>3} {:>8.3} {:>6.3} {:>6.3}", c.to_string(), e.mae, e.wape, e.coverage);
            }
        }
    }
    if as_json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("forecast_eval: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
