//! Where a synthetic fleet round's level-2 time goes: GPUs grouped by tenant count and solve status, and how much
//! of the summed solve time the slowest GPUs take (a flat profile calls for a cheaper solve everywhere, a steep
//! one for a budget on the few).
//!
//! Run: `cargo run --release -p tessera-planner --example fleet_round -- GPUS TENANTS SLOTS SEED [ARCHETYPES]`
//! (for example `1000 4000 30 1`, issue 43's cold round; with ARCHETYPES, tenants come in that many kinds, as
//! [`tessera_planner::synthetic::input_with_archetypes`] draws them, and GPUs of the same inputs share a solve). It also times level 1 on its own (the fleet placement,
//! serial) and prints the process's peak resident memory where Linux reports it, so that runs at several sizes show
//! how a round grows. The solve times are wall clock, for reading, never for results.

use std::collections::BTreeMap;
use std::path::Path;

use tessera_core::GpuModel;
use tessera_planner::PlannerConfig;
use tessera_planner::policies::by_name;
use tessera_planner::policy::PlanOutcome;
use tessera_planner::synthetic::{SyntheticSpec, input_with_archetypes as synthetic};

fn main() -> Result<(), String> {
    let usage = "usage: fleet_round GPUS TENANTS SLOTS SEED [ARCHETYPES]";
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse::<u64>().map_err(|e| format!("{a:?}: {e} ({usage})")))
        .collect::<Result<_, _>>()?;
    let (gpus, tenants, slots, seed, archetypes) = match args[..] {
        [gpus, tenants, slots, seed] => (gpus, tenants, slots, seed, 0),
        [gpus, tenants, slots, seed, archetypes] => (gpus, tenants, slots, seed, archetypes),
        _ => return Err(usage.into()),
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    let models = tessera_core::config::load_model_dir(&dir).map_err(|e| e.to_string())?;
    let spec = SyntheticSpec {
        gpus: gpus as usize,
        tenants: tenants as usize,
        slots: slots as usize,
        gpu_model: GpuModel::A100_40GB,
        seed,
    };
    let input = synthetic(&spec, archetypes as usize, &models, PlannerConfig::default());
    let (l1, level1) = seconds(|| tessera_planner::assign::place(&input));
    let (outcome, round) =
        seconds(|| by_name("tessera").map_err(|e| e.to_string())?.plan(&input).map_err(|e| e.to_string()));
    let outcome = outcome?;
    let PlanOutcome::Planned(report) = outcome else { return Err("the round is infeasible".into()) };
    println!(
        "round {round:.2} s wall; level 1 alone {:.3} s ({} tenants placed on {} GPUs, {} unplaced); peak memory {}",
        level1,
        l1.per_gpu.values().map(Vec::len).sum::<usize>(),
        l1.per_gpu.values().filter(|t| !t.is_empty()).count(),
        l1.unplaced.len(),
        peak_memory().unwrap_or_else(|| "not reported here".into())
    );
    let mut rows: Vec<(f64, usize, String)> = report
        .outcomes
        .iter()
        .map(|(gpu, o)| {
            let ms = report.solve_times.get(gpu).map_or(0.0, |t| t.elapsed.as_secs_f64() * 1e3);
            (ms, o.problem.tenants.len(), format!("{:?}", o.status))
        })
        .collect();
    rows.sort_by(|a, b| b.0.total_cmp(&a.0));
    let total: f64 = rows.iter().map(|r| r.0).sum();
    println!(
        "{} GPUs: level-2 solves sum to {:.2} s; {} column-generation solves, {} of them shared; objective {:.1}, \
         bound {:.1}, gap {:.3} %",
        rows.len(),
        total / 1e3,
        report.stats.solves,
        report.stats.shared_solves,
        report.stats.objective,
        report.stats.bound,
        100.0 * report.stats.gap
    );
    let mut groups: BTreeMap<(usize, &str), (usize, f64)> = BTreeMap::new();
    for (ms, n, status) in &rows {
        let g = groups.entry((*n, status.as_str())).or_default();
        g.0 += 1;
        g.1 += ms;
    }
    for ((n, status), (count, ms)) in groups {
        println!("  {n} tenants, {status}: {count} GPUs, {:.2} s, {:.1} ms each", ms / 1e3, ms / count as f64);
    }
    let mut sum = 0.0;
    for (i, (ms, _, _)) in rows.iter().enumerate() {
        sum += ms;
        if [1, 10, 100, 500].contains(&(i + 1)) {
            println!("  slowest {}: {:.1} % of the time (the last of them {ms:.1} ms)", i + 1, 100.0 * sum / total);
        }
    }
    Ok(())
}

/// The process's peak resident set (`VmHWM` of `/proc/self/status`), where Linux reports it.
fn peak_memory() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kb: f64 =
        status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(format!("{:.0} MiB", kb / 1024.0))
}

/// Runs `f` and says how many seconds it took: an example's wall clock, which the planner itself never reads.
#[allow(clippy::disallowed_methods)]
fn seconds<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let started = std::time::Instant::now();
    let out = f();
    (out, started.elapsed().as_secs_f64())
}
