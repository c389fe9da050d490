//! The forecasters on the bundled real traces (`traces/` at the repository root): the seasonal forecaster must beat
//! EWMA on the daily pattern of Alibaba pod creations, and the EWMA band must cover a sensible share of the Azure LLM
//! conversation arrivals. The parsing mirrors `examples/forecast_eval.rs` (kept small on purpose).

use std::path::PathBuf;

use tessera_planner::forecast::{ForecastError, ForecasterConfig, evaluate};

fn read_trace(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../traces").join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The values of one named column (the bundled traces have no quoted fields).
fn column<'a>(content: &'a str, name: &str) -> Vec<&'a str> {
    let mut lines = content.lines();
    let header = lines.next().expect("header");
    let idx = header.split(',').position(|h| h.trim() == name).unwrap_or_else(|| panic!("no column {name}"));
    lines.filter(|l| !l.trim().is_empty()).map(|l| l.split(',').nth(idx).expect("short row")).collect()
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

/// Hourly pod creations from the first day (24 h from time 0) with at least 24 of them.
fn alibaba_hourly() -> Vec<f64> {
    let content = read_trace("alibaba-openb-2023-pods.csv");
    let times: Vec<f64> = column(&content, "creation_time").iter().map(|s| s.trim().parse().unwrap()).collect();
    let hourly = bin(&times, 0.0, 3600.0, 1.0);
    let first_busy_day = hourly.chunks(24).position(|day| day.iter().sum::<f64>() >= 24.0).unwrap();
    hourly[first_busy_day * 24..].to_vec()
}

/// Seconds since midnight of a `2023-11-16 18:17:03.9799600` timestamp.
fn time_of_day(ts: &str) -> f64 {
    let time = ts.split_whitespace().nth(1).expect("time of day");
    time.split(':').map(|p| p.parse::<f64>().unwrap()).fold(0.0, |acc, v| acc * 60.0 + v)
}

/// Requests/s of the Azure LLM conversation trace in 10 s slots.
fn azure_conv_10s() -> Vec<f64> {
    let content = read_trace("azure-llm-2023-conv.csv");
    let times: Vec<f64> = column(&content, "TIMESTAMP").iter().map(|s| time_of_day(s)).collect();
    let start = times.iter().copied().fold(f64::INFINITY, f64::min);
    bin(&times, start, 10.0, 10.0)
}

#[test]
fn traces_parse_into_plausible_series() {
    let hourly = alibaba_hourly();
    // 8,152 pods over ~149 days, most of them in the last ~35.
    assert!((700..=900).contains(&hourly.len()), "{}", hourly.len());
    assert!(hourly.iter().sum::<f64>() > 7500.0);
    let conv = azure_conv_10s();
    // 19,366 requests in just under an hour.
    assert!((340..=360).contains(&conv.len()), "{}", conv.len());
    let mean = conv.iter().sum::<f64>() / conv.len() as f64;
    assert!((5.0..6.0).contains(&mean), "{mean}");
}

#[test]
fn seasonal_beats_ewma_a_day_ahead_on_alibaba_pod_creations() {
    let hourly = alibaba_hourly();
    let seasonal = ForecasterConfig::Seasonal { period_slots: 24, alpha: 0.1, gamma: 0.2 };
    let s: ForecastError = evaluate(&hourly, &seasonal, 24, 48);
    for alpha in [0.1, 0.3] {
        let e = evaluate(&hourly, &ForecasterConfig::Ewma { alpha }, 24, 48);
        assert_eq!(s.points, e.points);
        // Measured: 0.47 against 0.55 (alpha 0.1) and 0.59 (alpha 0.3).
        assert!(s.wape < 0.9 * e.wape, "seasonal {s:?} vs ewma a={alpha} {e:?}");
    }
    let last = evaluate(&hourly, &ForecasterConfig::Last, 24, 48);
    assert!(s.wape < 0.75 * last.wape, "seasonal {s:?} vs last {last:?}");
}

#[test]
fn ewma_band_covers_most_azure_conv_arrivals_one_slot_ahead() {
    let conv = azure_conv_10s();
    let e = evaluate(&conv, &ForecasterConfig::Ewma { alpha: 0.3 }, 1, 30);
    assert!(e.points > 300, "{e:?}");
    assert!((0.5..=1.0).contains(&e.coverage), "{e:?}");
}
