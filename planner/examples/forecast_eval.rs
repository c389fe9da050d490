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

use std::process::ExitCode;

#[path = "../tests/common/bundled_traces.rs"]
mod bundled_traces;

use bundled_traces::{alibaba_hourly, azure_functions, azure_llm};
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
