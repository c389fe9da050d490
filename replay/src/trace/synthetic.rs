//! A synthetic Azure Functions 2019 day, written in exactly the public schema (invocations, durations and memory
//! files, `dNN` naming), for studies and tests where the real day files (about 46,000 functions, 900 M invocations)
//! are not at hand.
//!
//! The model follows the shape Shahrad et al. (ATC 2020) report: popularity is heavy-tailed (function of popularity
//! rank `r` gets a daily share proportional to `1 / (r + 1)^s`, so a few functions take most invocations); non-timer
//! functions follow a diurnal curve `1 + A sin(2 pi (minute / 1440 - 0.25 - phase))` with Poisson counts per minute;
//! timer functions fire periodically (every 1, 5, 10, 15, 30 or 60 minutes, a fixed count per fire); triggers are
//! drawn with the paper's mix (http most common, then queue, timer, event, orchestration, storage, others);
//! durations are log-normal per function, memory log-normal per app. Everything is drawn from one seeded generator.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rand_distr::{Distribution, LogNormal, Poisson};

use super::azure2019::{DURATIONS_HEADER, DURATIONS_PREFIX, INVOCATIONS_PREFIX, MEMORY_HEADER, MEMORY_PREFIX};
use super::error::TraceError;

/// What to generate.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticDaySpec {
    /// The day number in the file names (`dNN`), 1..=99.
    pub day: u32,
    /// Functions to generate (rows of the invocations file, less any that draw no invocation).
    pub functions: usize,
    /// Expected invocations over the day, all functions together.
    pub total_invocations: u64,
    /// Popularity exponent `s` (share of rank `r` proportional to `1 / (r + 1)^s`); above 1 is heavier-tailed.
    pub popularity_exponent: f64,
    /// Amplitude `A` of the diurnal curve, in `[0, 1]`.
    pub diurnal_amplitude: f64,
    /// Fraction of functions with a timer trigger, in `[0, 1]`.
    pub timer_fraction: f64,
    /// Seed of every draw.
    pub seed: u64,
}

impl Default for SyntheticDaySpec {
    fn default() -> SyntheticDaySpec {
        SyntheticDaySpec {
            day: 1,
            functions: 500,
            total_invocations: 5_000_000,
            popularity_exponent: 1.2,
            diurnal_amplitude: 0.6,
            timer_fraction: 0.15,
            seed: 1,
        }
    }
}

/// What [`generate_azure_functions_2019_day_report`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticDay {
    /// `invocations_per_function_md.anon.dNN.csv`.
    pub invocations_path: PathBuf,
    /// `function_durations_percentiles.anon.dNN.csv`.
    pub durations_path: PathBuf,
    /// `app_memory_percentiles.anon.dNN.csv`.
    pub memory_path: PathBuf,
    /// Rows of the invocations file (functions with at least one invocation).
    pub functions: usize,
    /// Distinct apps among them.
    pub apps: usize,
    /// Distinct owners among them.
    pub owners: usize,
    /// Invocations written, all functions and minutes together.
    pub total_invocations: u64,
    /// Invocations written per minute of the day (1440 entries).
    pub minute_totals: Vec<u64>,
    /// Each written function's `HashOwner/HashApp/HashFunction` key and daily total, in file order.
    pub function_totals: Vec<(String, u64)>,
}

/// Writes a synthetic day into `dir` (created if missing) and returns the three files' paths (invocations,
/// durations, memory).
pub fn generate_azure_functions_2019_day(dir: &Path, spec: &SyntheticDaySpec) -> Result<Vec<PathBuf>, TraceError> {
    let day = generate_azure_functions_2019_day_report(dir, spec)?;
    Ok(vec![day.invocations_path, day.durations_path, day.memory_path])
}

const TRIGGERS: [(&str, f64); 6] =
    [("http", 0.55), ("queue", 0.16), ("event", 0.10), ("orchestration", 0.09), ("storage", 0.05), ("others", 0.05)];
const TIMER_PERIODS_MIN: [usize; 6] = [1, 5, 10, 15, 30, 60];
const MINUTES: usize = 1440;

struct Function {
    owner: usize,
    app: usize,
    hash: String,
    trigger: &'static str,
}

fn io(p: &Path) -> impl FnOnce(std::io::Error) -> TraceError + '_ {
    move |e| TraceError::io(p, e)
}

fn hash(rng: &mut ChaCha8Rng) -> String {
    (0..4).map(|_| format!("{:016x}", rng.random::<u64>())).collect()
}

/// Writes a synthetic day into `dir` and reports what it wrote (totals included).
pub fn generate_azure_functions_2019_day_report(
    dir: &Path,
    spec: &SyntheticDaySpec,
) -> Result<SyntheticDay, TraceError> {
    let invalid = |what: &'static str, v: String, why: &str| Err(TraceError::invalid(what, v, why));
    if !(1..=99).contains(&spec.day) {
        return invalid("day", spec.day.to_string(), "must be in 1..=99");
    }
    if spec.functions == 0 {
        return invalid("functions", "0".into(), "must be positive");
    }
    if !(spec.popularity_exponent.is_finite() && spec.popularity_exponent >= 0.0) {
        return invalid("popularity_exponent", spec.popularity_exponent.to_string(), "must be >= 0");
    }
    if !(0.0..=1.0).contains(&spec.diurnal_amplitude) || !(0.0..=1.0).contains(&spec.timer_fraction) {
        return invalid(
            "diurnal_amplitude / timer_fraction",
            format!("{}/{}", spec.diurnal_amplitude, spec.timer_fraction),
            "must be in [0, 1]",
        );
    }
    std::fs::create_dir_all(dir).map_err(|e| TraceError::io(dir, e))?;
    let mut rng = ChaCha8Rng::seed_from_u64(spec.seed);

    // Hierarchy: owners with 1-3 apps, apps with 1-4 functions.
    let mut owner_hashes = Vec::new();
    let mut app_hashes: Vec<(usize, String)> = Vec::new();
    let mut functions = Vec::with_capacity(spec.functions);
    while functions.len() < spec.functions {
        owner_hashes.push(hash(&mut rng));
        let owner = owner_hashes.len() - 1;
        for _ in 0..rng.random_range(1..=3) {
            app_hashes.push((owner, hash(&mut rng)));
            let app = app_hashes.len() - 1;
            for _ in 0..rng.random_range(1..=4) {
                if functions.len() == spec.functions {
                    break;
                }
                let trigger = if rng.random::<f64>() < spec.timer_fraction {
                    "timer"
                } else {
                    let mut u = rng.random::<f64>();
                    TRIGGERS
                        .iter()
                        .find(|(_, p)| {
                            u -= p;
                            u < 0.0
                        })
                        .map_or("others", |(t, _)| t)
                };
                functions.push(Function { owner, app, hash: hash(&mut rng), trigger });
            }
        }
    }
    // Popularity: a random permutation of ranks, Zipf-like shares.
    let mut ranks: Vec<usize> = (0..functions.len()).collect();
    for i in (1..ranks.len()).rev() {
        ranks.swap(i, rng.random_range(0..=i));
    }
    let weights: Vec<f64> = ranks.iter().map(|&r| 1.0 / ((r + 1) as f64).powf(spec.popularity_exponent)).collect();
    let weight_sum: f64 = weights.iter().sum();

    let tag = format!("d{:02}", spec.day);
    let invocations_path = dir.join(format!("{INVOCATIONS_PREFIX}.{tag}.csv"));
    let durations_path = dir.join(format!("{DURATIONS_PREFIX}.{tag}.csv"));
    let memory_path = dir.join(format!("{MEMORY_PREFIX}.{tag}.csv"));
    let create =
        |p: &Path| File::create(p).map(|f| BufWriter::with_capacity(1 << 20, f)).map_err(|e| TraceError::io(p, e));
    let mut inv = create(&invocations_path)?;
    let mut dur = create(&durations_path)?;
    let mut mem = create(&memory_path)?;

    let mut header = String::from("HashOwner,HashApp,HashFunction,Trigger");
    for m in 1..=MINUTES {
        header.push_str(&format!(",{m}"));
    }
    writeln!(inv, "{header}").map_err(io(&invocations_path))?;
    writeln!(dur, "{}", DURATIONS_HEADER.join(",")).map_err(io(&durations_path))?;
    writeln!(mem, "{}", MEMORY_HEADER.join(",")).map_err(io(&memory_path))?;

    let duration_ms = LogNormal::new(300f64.ln(), 1.5).expect("valid log-normal");
    let memory_mb = LogNormal::new(150f64.ln(), 0.6).expect("valid log-normal");
    let mut minute_totals = vec![0u64; MINUTES];
    let mut function_totals = Vec::new();
    let mut apps_written = vec![false; app_hashes.len()];
    let mut owners_written = vec![false; owner_hashes.len()];
    let mut counts = vec![0u64; MINUTES];
    let mut line = String::with_capacity(8 * MINUTES);
    for (f, w) in functions.iter().zip(&weights) {
        let expected = spec.total_invocations as f64 * w / weight_sum;
        counts.iter_mut().for_each(|c| *c = 0);
        if f.trigger == "timer" {
            // The shortest period whose per-fire count is at least one, capped at hourly.
            let period =
                TIMER_PERIODS_MIN.iter().copied().find(|&p| expected * p as f64 / MINUTES as f64 >= 1.0).unwrap_or(60);
            let per_fire = (expected * period as f64 / MINUTES as f64).round().max(1.0) as u64;
            let offset = rng.random_range(0..period);
            for m in (offset..MINUTES).step_by(period) {
                counts[m] = per_fire;
            }
        } else {
            let phase = rng.random_range(-1.0..1.0) / 24.0;
            for (m, c) in counts.iter_mut().enumerate() {
                let x = m as f64 / MINUTES as f64 - 0.25 - phase;
                let mean =
                    expected / MINUTES as f64 * (1.0 + spec.diurnal_amplitude * (2.0 * std::f64::consts::PI * x).sin());
                if mean > 0.0 {
                    *c = Poisson::new(mean).map(|p| p.sample(&mut rng) as u64).unwrap_or(0);
                }
            }
        }
        let total: u64 = counts.iter().sum();
        if total == 0 {
            continue;
        }
        let (owner, app) = (&owner_hashes[f.owner], &app_hashes[f.app].1);
        line.clear();
        line.push_str(&format!("{owner},{app},{},{}", f.hash, f.trigger));
        for (m, c) in counts.iter().enumerate() {
            line.push(',');
            line.push_str(&c.to_string());
            minute_totals[m] += c;
        }
        writeln!(inv, "{line}").map_err(io(&invocations_path))?;
        function_totals.push((format!("{owner}/{app}/{}", f.hash), total));
        apps_written[f.app] = true;
        owners_written[f.owner] = true;

        let avg: f64 = duration_ms.sample(&mut rng);
        let pct = [0.2, 0.3, 0.7, 0.95, 1.2, 3.0, 5.0].map(|k| (avg * k).round());
        writeln!(
            dur,
            "{owner},{app},{},{},{total},{},{},{},{},{},{},{},{},{}",
            f.hash,
            avg.round(),
            pct[0],
            pct[6] * 2.0,
            pct[0],
            pct[1],
            pct[2],
            pct[3],
            pct[4],
            pct[5],
            pct[6]
        )
        .map_err(io(&durations_path))?;
    }
    for (a, (owner, app)) in app_hashes.iter().enumerate() {
        if !apps_written[a] {
            continue;
        }
        let avg: f64 = memory_mb.sample(&mut rng);
        let pct = [0.6, 0.7, 0.85, 1.0, 1.1, 1.3, 1.5, 1.8].map(|k| (avg * k).round());
        let samples = rng.random_range(10..5000);
        writeln!(
            mem,
            "{},{app},{samples},{},{},{},{},{},{},{},{},{}",
            owner_hashes[*owner],
            avg.round(),
            pct[0],
            pct[1],
            pct[2],
            pct[3],
            pct[4],
            pct[5],
            pct[6],
            pct[7]
        )
        .map_err(io(&memory_path))?;
    }
    inv.flush().map_err(io(&invocations_path))?;
    dur.flush().map_err(io(&durations_path))?;
    mem.flush().map_err(io(&memory_path))?;
    Ok(SyntheticDay {
        invocations_path,
        durations_path,
        memory_path,
        functions: function_totals.len(),
        apps: apps_written.iter().filter(|w| **w).count(),
        owners: owners_written.iter().filter(|w| **w).count(),
        total_invocations: minute_totals.iter().sum(),
        minute_totals,
        function_totals,
    })
}
