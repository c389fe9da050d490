//! `replay capacity`: the fewest GPUs on which each policy meets an SLO-attainment target.
//!
//! The demand is fixed first: tenants and their arrivals are mapped once for the reference fleet (`--gpus`, with
//! `--load` relative to it), then only the number of GPUs changes. Attainment grows with GPUs (not strictly: a
//! policy may do worse with one GPU more), so the search doubles until the target is met, then bisects between the
//! last miss and the first hit; the result is the smallest count found meeting it, and every count tried is
//! reported.

use std::io::Write;

use clap::Args;
use serde::Serialize;

use crate::run::compare::describe;
use crate::run::driver::{PolicyRun, RateTable, run_policy};
use crate::run::{Prepared, ReplayError, RunArgs, prepare, uniform_fleet};

/// One policy's search.
#[derive(Debug, Clone, Serialize)]
pub struct CapacityResult {
    /// The policy.
    pub policy: String,
    /// Fewest GPUs found meeting the target (`None`: not met within `max_gpus`).
    pub gpus: Option<usize>,
    /// Every count tried: (GPUs, SLO attainment, goodput).
    pub tried: Vec<(usize, f64, f64)>,
}

/// Searches `1..=max_gpus` for each policy (see the module documentation).
pub fn search(
    prepared: &Prepared,
    policies: &[String],
    target_slo: f64,
    max_gpus: usize,
    progress: &(dyn Fn(&str, usize) + Sync),
) -> Result<Vec<CapacityResult>, ReplayError> {
    if !(0.0..=1.0).contains(&target_slo) {
        return Err(ReplayError::Usage(format!("--target-slo must be in [0, 1] (got {target_slo})")));
    }
    let model = *prepared.scenario.gpus.values().next().expect("a fleet has a GPU");
    let truth = RateTable::measure(
        prepared.arrivals.as_ref(),
        prepared.scenario.tenants.len(),
        prepared.scenario.planner.slot_s * 1000.0,
        prepared.scenario.duration_ms,
        prepared.scenario.fluid_tick_ms.is_some(),
    )?;
    let mut out = Vec::new();
    for policy in policies {
        let mut tried: Vec<(usize, f64, f64)> = Vec::new();
        let mut eval = |n: usize| -> Result<bool, ReplayError> {
            if let Some(&(_, att, _)) = tried.iter().find(|t| t.0 == n) {
                return Ok(att >= target_slo);
            }
            progress(policy, n);
            let mut scenario = prepared.scenario.clone();
            scenario.gpus = uniform_fleet(n, model);
            let run: PolicyRun = run_policy(&scenario, policy, prepared.arrivals.as_ref(), &truth, &|_, _| {})?;
            let att = run.total.slo_attainment();
            tried.push((n, att, run.total.goodput));
            Ok(att >= target_slo)
        };
        let mut lo = 0; // largest count known to miss
        let mut hi = None; // smallest count known to meet
        let mut n = 1;
        while n <= max_gpus {
            if eval(n)? {
                hi = Some(n);
                break;
            }
            lo = n;
            n = if n * 2 > max_gpus && n < max_gpus { max_gpus } else { n * 2 };
        }
        if let Some(mut h) = hi {
            while h - lo > 1 {
                let mid = lo + (h - lo) / 2;
                if eval(mid)? { h = mid } else { lo = mid }
            }
            hi = Some(h);
        }
        tried.sort_by_key(|t| t.0);
        out.push(CapacityResult { policy: policy.clone(), gpus: hi, tried });
    }
    Ok(out)
}

/// Arguments of `replay capacity`.
#[derive(Debug, Clone, Args)]
pub struct CapacityArgs {
    /// The run: the demand is mapped once for the reference fleet (--gpus, --load), then the GPU count varies.
    #[command(flatten)]
    pub run: RunArgs,
    /// SLO attainment to meet (fraction of requests completed within their SLO).
    #[arg(long, default_value_t = 0.99)]
    pub target_slo: f64,
    /// Largest fleet to try.
    #[arg(long, default_value_t = 64)]
    pub max_gpus: usize,
}

/// `replay capacity`: prints, per policy, the fewest GPUs meeting the target and every count tried.
pub fn capacity(args: &CapacityArgs, out: &mut dyn Write) -> Result<Vec<CapacityResult>, ReplayError> {
    let spec = args.run.spec()?;
    let prepared = prepare(&spec)?;
    crate::note(format_args!("{}", describe(&prepared)));
    let results = search(&prepared, &args.run.policies(), args.target_slo, args.max_gpus, &|p, n| {
        crate::note(format_args!("capacity: {p} on {n} GPU(s)"))
    })?;
    let text = if args.run.json {
        format!("{}\n", serde_json::to_string_pretty(&results).expect("serialisable"))
    } else {
        let mut s = format!("{:<9} {:>6}  tried (GPUs: SLO attainment)\n", "policy", "gpus");
        for r in &results {
            let tried: Vec<String> = r.tried.iter().map(|(n, a, _)| format!("{n}: {a:.4}")).collect();
            s += &format!(
                "{:<9} {:>6}  {}\n",
                r.policy,
                r.gpus.map_or(format!(">{}", args.max_gpus), |n| n.to_string()),
                tried.join(", ")
            );
        }
        s
    };
    out.write_all(text.as_bytes()).map_err(|source| ReplayError::Io { path: "stdout".into(), source })?;
    Ok(results)
}
