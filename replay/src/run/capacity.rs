//! `replay capacity`: the fewest GPUs on which each policy meets an SLO-attainment target.
//!
//! The demand is fixed first: tenants and their arrivals are mapped once for the reference fleet (`--gpus`, with
//! `--load` relative to it), then only the number of GPUs changes. Attainment grows with GPUs (not strictly: a
//! policy may do worse with one GPU more), so the search doubles until the target is met, then bisects between the
//! last miss and the first hit; the result is the smallest count found meeting it, and every count tried is
//! reported.

use serde::Serialize;

use super::driver::{PolicyRun, RateTable, run_policy};
use super::{Prepared, ReplayError, uniform_fleet};

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
