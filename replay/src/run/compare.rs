//! A run: every policy of the arguments through the same scenario (in process, or one through a coordinator
//! cluster), and the upper bound, gathered into a [`Comparison`].

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::Value;
use tessera_planner::bound::UpperBound;

use super::args::RunArgs;
use super::driver::{PolicyRun, RateTable, run_policy};
use super::{Prepared, ReplayError, Scenario, prepare};

/// The comparison of a run's policies.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The trace's file name.
    pub trace: String,
    /// The seed.
    pub seed: u64,
    /// Per policy, in the order run.
    pub runs: Vec<PolicyRun>,
    /// The upper bound on any policy's goodput over the run ([`tessera_planner::bound`]).
    pub upper_bound: Option<UpperBound>,
    /// What reproduces the run: the trace's path and how it was read, the fleet, the tenants, the load and the
    /// planner settings as the command line gave them (`summary.json`'s `reproduce`).
    pub reproduce: Value,
    /// The scenario's tenant ids, in the bound's tenant order ([`UpperBound::accuracy`]).
    #[serde(skip)]
    pub tenant_ids: Vec<String>,
}

pub(crate) fn bar(len: u64, prefix: String) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{prefix:>9} [{bar:40}] {pos}/{len} windows {elapsed_precise} (eta {eta})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(prefix);
    pb
}

/// A one-paragraph description of what is about to run (stderr).
pub(crate) fn describe(p: &Prepared) -> String {
    let s = &p.scenario;
    let total_rps: f64 = p.tenant_sources.iter().map(|t| t.1).sum();
    format!(
        "replay: {} ({}, {} rows{}, {} stream(s) sampled); {} GPUs, {} tenants, {:.0} s of workload time, {:.1} req/s \
         after scaling{}; planning every {} s over {} slots of {} s; seed {}",
        p.scan.path.display(),
        p.scan.format,
        p.scan.rows,
        if p.scan.bad_rows > 0 { format!(", {} bad rows skipped", p.scan.bad_rows) } else { String::new() }
            + &if p.scan.late_rows > 0 {
                format!(
                    ", {} rows out of order by more than --max-reorder {} s (by up to {:.0} s): any of them whose \
                     time was replayed already is replayed late; sort the file or raise --max-reorder",
                    p.scan.late_rows, p.scan.reorder_horizon_s, p.scan.reorder_needed_s
                )
            } else {
                String::new()
            },
        p.scan.streams.len(),
        s.gpus.len(),
        s.tenants.len(),
        s.duration_ms / 1000.0,
        total_rps,
        match p.capped_streams.iter().max_by(|a, b| a.1.total_cmp(&b.1)) {
            Some((key, burst)) => format!(
                " ({} stream(s) cut to {}x their window's mean rate, the densest {key} at {burst:.0}x)",
                p.capped_streams.len(),
                super::MAX_BURST
            ),
            None => String::new(),
        },
        s.plan_every_s,
        s.planner.horizon_slots,
        s.planner.slot_s,
        s.seed
    )
}

/// Runs every policy of `args` (and the upper bound) and returns the comparison with the scenario it ran; `quiet`
/// prints nothing on stderr (studies run many at once).
pub fn compare(args: &RunArgs, quiet: bool) -> Result<(Comparison, Scenario), ReplayError> {
    args.check_mode()?;
    let cluster = match (args.mode.as_str(), &args.coordinator) {
        ("cluster", Some(endpoint)) => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .map_err(|e| ReplayError::Sim(format!("cannot start the runtime: {e}")))?;
            let (policy, settings) = runtime.block_on(super::cluster::cluster_settings(endpoint))?;
            Some((runtime, endpoint, policy, settings))
        }
        _ => None,
    };
    let spec = match &cluster {
        // The cluster's settings, which the flags given may only repeat.
        Some((_, _, _, theirs)) => {
            let differ = args.round.apply(theirs).differences(theirs);
            if !differ.is_empty() {
                return Err(ReplayError::Usage(format!(
                    "--mode cluster: the cluster plans otherwise: {} (asked here (the cluster's)); drop the flags to \
                     adopt the cluster's settings, or start the cluster with them",
                    differ.join(", ")
                )));
            }
            args.spec_over(theirs)?
        }
        None => args.spec()?,
    };
    let mut prepared = prepare(&spec)?;
    if args.mode == "cluster" {
        // The coordinator plans with its own `interference` table; replay's would plan nothing.
        prepared.scenario.interference = None;
    }
    if !quiet {
        crate::note(format_args!("{}", describe(&prepared)));
    }
    let bar = |len: u64, prefix: String| if quiet { ProgressBar::hidden() } else { bar(len, prefix) };
    let scenario = &prepared.scenario;
    let truth = RateTable::measure(
        prepared.arrivals.as_ref(),
        scenario.tenants.len(),
        scenario.planner.slot_s * 1000.0,
        scenario.duration_ms,
        scenario.fluid_tick_ms.is_some(),
    )?;
    let mut runs = Vec::new();
    if let Some((runtime, endpoint, policy, _)) = &cluster {
        if !quiet {
            crate::note(format_args!("the cluster plans with {policy}"));
        }
        let pb = bar((scenario.duration_ms / 1000.0 / scenario.plan_every_s).ceil() as u64, "cluster".into());
        let r = runtime.block_on(super::cluster::run_cluster(
            scenario,
            prepared.arrivals.as_ref(),
            &truth,
            endpoint,
            &super::cluster::NodeAddresses { listen: args.node_listen, advertise: args.node_advertise.clone() },
            &|done, _| pb.set_position(done as u64),
        ));
        pb.finish_and_clear();
        runs.push(r?);
    }
    for policy in args.policies().into_iter().filter(|_| args.mode != "cluster") {
        let pb = bar((scenario.duration_ms / 1000.0 / scenario.plan_every_s).ceil() as u64, policy.clone());
        let r =
            run_policy(scenario, &policy, prepared.arrivals.as_ref(), &truth, &|done, _| pb.set_position(done as u64));
        pb.finish_and_clear();
        runs.push(r?);
    }
    let upper_bound = match args.no_bound {
        true => None,
        false => Some(super::driver::upper_bound(scenario, prepared.arrivals.as_ref())?),
    };
    let reproduce = reproduce(&spec);
    let cmp = Comparison {
        trace: scenario.name.clone(),
        seed: spec.seed,
        runs,
        upper_bound,
        reproduce,
        tenant_ids: scenario.tenants.iter().map(|t| t.id.to_string()).collect(),
    };
    Ok((cmp, prepared.scenario))
}

/// What reproduces a run, as `summary.json` records it.
fn reproduce(spec: &super::RunSpec) -> serde_json::Value {
    let path = |p: &std::path::Path| p.display().to_string();
    let o = &spec.trace_options;
    serde_json::json!({
        "trace_path": path(&spec.trace),
        "trace_format": o.format.map(|f| f.to_string()),
        "window_start_s": o.window_start_s,
        "window_duration_s": o.window_duration_s,
        "sample": o.sample.to_string(),
        "group_by": o.group_by.to_string(),
        "counts_to_arrivals": o.counts_to_arrivals.to_string(),
        "time_scale": o.time_scale,
        "rate_scale": spec.rate_scale,
        "tenants_file": spec.tenants_file.as_deref().map(path),
        "tenants_count": spec.tenants_count,
        "fleet_file": spec.fleet.as_deref().map(path),
        "gpus": spec.gpus,
        "gpu_model": spec.gpu_model.to_string(),
        "models_dir": path(&spec.models_dir),
        "load": spec.load,
        "duration_s": spec.duration_s,
        "plan_every_s": spec.plan_every_s,
        "slot_s": spec.planner.slot_s,
        "horizon_slots": spec.planner.horizon_slots,
        "target_utilization": spec.planner.target_utilization,
        "gap": spec.planner.solver.mip_rel_gap,
        "replan_band": spec.planner.replan_band,
        "forecaster": spec.forecaster.to_string(),
        "tlb": spec.tlb.name(),
        "tlb_blind": spec.tlb_blind,
        "sharing": spec.planner.sharing,
        "fluid_tick_ms": spec.fluid_tick_ms,
        "late_requests": spec.late,
        "replan_on_burst": spec.replan_on_burst,
        "seed": spec.seed,
    })
}
