//! The arguments of `replay` (a run, the default command) and `replay capacity`, and the commands themselves.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tessera_core::GpuModel;
use tessera_planner::PlannerConfig;
use tessera_planner::forecast::ForecasterConfig;
use tessera_planner::level2::solver::SolverConfig;
use tessera_planner::round::RoundSettings;
use tessera_sim::executor::LateRequests;

use super::capacity::{self, CapacityResult};
use super::driver::{RateTable, run_policy};
use super::report::Comparison;
use super::{Prepared, ReplayError, RunSpec, Scenario, prepare};
use crate::trace::TraceArgs;

/// The trace replay runs when none is given: the Azure LLM 2023 conversation trace (one hour, shipped in
/// `traces/`).
pub const DEFAULT_TRACE: &str = "traces/azure-llm-2023-conv.csv";

/// Every registered policy, in registry order: what a run compares by default.
pub fn default_policies() -> String {
    tessera_planner::policies::names().join(",")
}

/// Arguments of a replay run.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The trace (format detected from its header; see --format). Default: the shipped Azure LLM 2023
    /// conversation trace, traces/azure-llm-2023-conv.csv (one hour, 19,366 requests).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// How the trace is read, windowed and sampled.
    #[command(flatten)]
    pub trace_args: TraceArgs,
    /// Policies to compare, separated by commas (`replay policies` lists them, ablations included). Every goodput
    /// is also divided by the run's upper bound (docs/evaluation.md).
    #[arg(long, default_value_t = default_policies())]
    pub policy: String,
    /// GPUs of the fleet (nodes of 8), unless --fleet is given.
    #[arg(long, default_value_t = 4)]
    pub gpus: usize,
    /// GPU model of the fleet, unless --fleet is given.
    #[arg(long, default_value = "A100-40GB")]
    pub gpu_model: String,
    /// A fleet file (configs/fleets/*.toml) instead of --gpus and --gpu-model.
    #[arg(long, value_name = "FILE")]
    pub fleet: Option<PathBuf>,
    /// A tenants file (configs/tenants/*.toml): `demand = { trace = "rank:N", scale = k }` takes the N-th most
    /// popular stream of the trace, `poisson_rps` draws Poisson arrivals. Without it, tenants are derived from the
    /// trace, each drawn from --seed: a stream (tenants dealt round the S sampled streams in a seeded order, most
    /// popular first; tenants sharing a stream split it by drawn weights of 0.5-1.5 and draw their own realisation
    /// of it), a model among those that serve on a 2g instance, an SLO of 3-6x its 2g batch-1 latency, and
    /// (probability 0.7) a retraining job every 200 s.
    #[arg(long, value_name = "FILE")]
    pub tenants: Option<PathBuf>,
    /// Derived tenants (without --tenants) [default: 3 per GPU].
    #[arg(long)]
    pub tenants_count: Option<usize>,
    /// Model profiles.
    #[arg(long = "models-dir", alias = "models", default_value = "configs/models", value_name = "DIR")]
    pub models: PathBuf,
    /// Mean inference demand as a fraction of the fleet's compute slices (at each model's best rate per slice
    /// within its SLO). Derived tenants share it in proportion to their stream's rate times their share of it, at most
    /// 4 slices each;
    /// each tenant's arrivals are its stream's, thinned or duplicated by one factor, so the trace's rate curve is
    /// kept. With --tenants, one factor on all trace tenants (default there: the trace's own rates) [default: 0.6].
    #[arg(long)]
    pub load: Option<f64>,
    /// Stop after this much workload time (e.g. 30m, 24h) [default: the whole selected window of the trace].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Planning interval: seconds (`60`) or a duration (`1m`, `90s`), a whole number of slots.
    #[arg(long, value_name = "DURATION", default_value_t = RoundSettings::default().plan_every_s,
          value_parser = crate::trace::args::parse_seconds)]
    pub plan_every: f64,
    /// Planner slot length: seconds (`10`) or a duration (`10s`).
    #[arg(long, value_name = "DURATION", default_value_t = RoundSettings::default().planner.slot_s,
          value_parser = crate::trace::args::parse_seconds)]
    pub slot: f64,
    /// Planner horizon, slots.
    #[arg(long, default_value_t = RoundSettings::default().planner.horizon_slots)]
    pub horizon: usize,
    /// Share of an instance's SLO throughput that plans may use, in (0, 1]: the rest is headroom for bursts inside
    /// a slot (in cluster mode, give `coordinator dev-cluster` the same value).
    #[arg(long, default_value_t = RoundSettings::default().planner.target_utilization)]
    pub target_utilization: f64,
    /// Relative optimality gap at which the planning policies (tessera, migrator) stop a GPU's solve, in [0, 1):
    /// larger plans faster and worse (tessera on 100 GPUs of a synthetic Azure Functions 2019 day: 0.04 planned
    /// 1.8x as fast as 0.01 and lost 4.9 % of the day's goodput; docs/performance.md). The perfect-forecast reference
    /// always solves to 1e-4. In cluster mode, give `coordinator dev-cluster` the same value.
    #[arg(long, default_value_t = RoundSettings::default().planner.solver.mip_rel_gap)]
    pub gap: f64,
    /// Level 1 of every policy but static: fleet (tessera's placement: sticky, memory-aware, demand-balanced), spread
    /// (by demand onto the least-loaded GPU) or round-robin (demand-blind). The same for every policy, so that the
    /// comparison is between the per-GPU policies; vary it to study placement.
    #[arg(long, default_value = "fleet", value_name = "RULE")]
    pub placement: String,
    /// Incremental rounds: a GPU is solved again only when a tenant's forecast leaves its planned mean widened by
    /// this share of the distance to the planned band's edges (or its tenants, a retraining's state, its health or
    /// instances changed, or its plan's horizon ran out); otherwise it keeps its last plan shifted forward. 0 solves
    /// every GPU every round. Tessera and its ablations read it (`tessera-full-rounds` never keeps a plan). In
    /// cluster mode, give `coordinator dev-cluster` the same value.
    #[arg(long, default_value_t = RoundSettings::default().planner.replan_band, value_name = "SHARE")]
    pub replan_band: f64,
    /// Forecaster of every tenant: last, ewma or seasonal (a day of slots).
    #[arg(long, default_value_t = RoundSettings::default().forecaster)]
    pub forecaster: String,
    /// Co-located tenants slow each other down through the L3 TLB model, the same for every policy: off, baseline
    /// (today's TLB) or star (STAR's shared entries). `--tlb` alone is baseline.
    #[arg(long, value_enum, default_value = "off", num_args = 0..=1, default_missing_value = "baseline", value_name = "TLB")]
    pub tlb: super::Tlb,
    /// Plan as if co-located tenants did not slow each other down: every policy's planner gets no interference
    /// table (with `--tlb` on, it gets the TLB model's pairwise slowdowns of the tenants' models by default). The
    /// ablation of TLB-aware planning.
    #[arg(long)]
    pub tlb_blind: bool,
    /// Let tessera and the perfect-forecast reference run a tenant's retraining on its own inference instance:
    /// exclusive (never), priority (Tally's block-level priority) or timeslice (TGS-like). The baselines keep their
    /// published behaviour; the upper bound drops its relaxation that charges retraining for slices.
    #[arg(long, default_value = "exclusive", value_name = "MODE")]
    pub sharing: tessera_core::sharing::Sharing,
    /// Seed of every random choice (trace conventions, scaling, tenants, Poisson arrivals).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write summary.json, timeseries.csv and report.html here.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print summary.json on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Skip the upper bound (docs/evaluation.md): on a fleet-sized day its linear programmes take minutes.
    #[arg(long)]
    pub no_bound: bool,
    /// in-process (planner and simulated fleet in this process, virtual time) or cluster (through a running
    /// coordinator cluster and sim-agents; needs --coordinator).
    #[arg(long, default_value = "in-process")]
    pub mode: String,
    /// Coordinator endpoint for --mode cluster.
    #[arg(long, value_name = "ADDR")]
    pub coordinator: Option<String>,
    /// --mode cluster: the IP address replay's simulated nodes listen on (each on a free port) for the
    /// coordinator's pushes (0.0.0.0 where the coordinator runs on another host or container).
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    pub node_listen: std::net::IpAddr,
    /// --mode cluster: the host name or address the coordinator reaches the simulated nodes at (default: the
    /// --node-listen address).
    #[arg(long, value_name = "HOST")]
    pub node_advertise: Option<String>,
    /// How requests are served: discrete (every request queued, batched and served: exact) or fluid (requests
    /// as counts per --tick, drawn per second around the trace's expectation, served by each tenant's pooled
    /// instances with a queueing correction:
    /// for fleet- and day-sized capacity studies, in process only; see the README for how far it agrees).
    #[arg(long, default_value = "discrete", value_name = "KIND")]
    pub executor: String,
    /// Fluid executor's tick, ms.
    #[arg(long, default_value_t = 100.0, value_name = "MS")]
    pub tick: f64,
    /// Queued requests that can no longer meet their SLO: shed (dropped when a batch starts, as Clockwork and Nexus
    /// do, so that an overload loses only its excess) or serve (served late, in arrival order, as Triton's default
    /// queue does; under overload they hold up the requests behind them). The same for every policy.
    #[arg(long, default_value = "shed", value_name = "RULE")]
    pub late_requests: String,
    /// Also plan inside a window, at the end of any slot whose arrivals leave the bands of the forecasts the current
    /// plan was made with (rates above twice the band's high edge, by at least 5 % of the fleet's forecast rate in
    /// all): the policy reacts to a burst within a slot instead of at the next window. The same for every policy but
    /// the perfect-forecast reference (which sees bursts coming). In cluster mode, start the cluster with `coordinator dev-cluster
    /// --replan-on-burst` too.
    #[arg(long)]
    pub replan_on_burst: bool,
}

impl RunArgs {
    /// The run these arguments ask for, checked.
    pub fn spec(&self) -> Result<RunSpec, ReplayError> {
        match self.mode.as_str() {
            "in-process" => {}
            "cluster" if self.coordinator.is_none() => {
                return Err(ReplayError::Usage(
                    "--mode cluster needs --coordinator ADDR (start a local cluster with `coordinator dev-cluster`)"
                        .into(),
                ));
            }
            // The coordinator's planning loop runs the fleet placement; another would make the modes differ.
            "cluster" if self.placement != "fleet" => {
                return Err(ReplayError::Usage(
                    "--placement: a coordinator cluster plans with the fleet placement; other placements run in \
                     process only"
                        .into(),
                ));
            }
            "cluster" => {}
            other => return Err(ReplayError::Usage(format!("--mode: expected in-process or cluster, got {other:?}"))),
        }
        // Slots (the truth table, the bound, burst replans) start on tick boundaries, and so do the cells of the
        // counts' Poisson noise (to rounding: 4.35 s is 4349.999... ms).
        let ticks_per_slot = self.slot * 1000.0 / self.tick;
        if self.executor == "fluid"
            && self.tick > 0.0
            && ((ticks_per_slot - ticks_per_slot.round()) * self.tick).abs() > 1e-6
        {
            return Err(ReplayError::Usage(format!(
                "--executor fluid: --tick ({} ms) must divide --slot ({} s)",
                self.tick, self.slot
            )));
        }
        let fluid_tick_ms = match self.executor.as_str() {
            "discrete" => None,
            "fluid" if self.mode == "cluster" => {
                return Err(ReplayError::Usage(
                    "--executor fluid runs in process only (sim-agents serve every request)".into(),
                ));
            }
            "fluid" if !(self.tick.is_finite() && self.tick > 0.0) => {
                return Err(ReplayError::Usage(format!("--tick must be > 0 ms (got {})", self.tick)));
            }
            // Ticks start at multiples of the tick from time zero: every window must start on one.
            "fluid" if ((self.plan_every * 1000.0 / self.tick).fract() * self.tick).abs() > 1e-6 => {
                return Err(ReplayError::Usage(format!(
                    "--tick ({} ms) must divide --plan-every ({} s)",
                    self.tick, self.plan_every
                )));
            }
            "fluid" => Some(self.tick),
            other => return Err(ReplayError::Usage(format!("--executor: expected discrete or fluid, got {other:?}"))),
        };
        let gpu_model = GpuModel::lookup(&self.gpu_model)
            .ok_or_else(|| ReplayError::Usage(format!("--gpu-model: unknown GPU model {:?}", self.gpu_model)))?;
        if !(0.0..1.0).contains(&self.gap) {
            return Err(ReplayError::Usage(format!("--gap must be in [0, 1) (got {})", self.gap)));
        }
        let defaults = PlannerConfig::default();
        let forecaster = ForecasterConfig::from_name(&self.forecaster, self.slot)
            .map_err(|e| ReplayError::Usage(format!("--forecaster: {e}")))?;
        for p in self.policies() {
            tessera_planner::policies::by_name(&p).map_err(|e| ReplayError::Usage(format!("--policy: {e}")))?;
        }
        let trace = match &self.trace {
            Some(t) => t.clone(),
            None => default_trace(),
        };
        Ok(RunSpec {
            trace,
            trace_options: self.trace_args.options(self.seed)?,
            rate_scale: self.trace_args.rate_scale,
            tenants_file: self.tenants.clone(),
            tenants_count: self.tenants_count,
            fleet: self.fleet.clone(),
            gpus: self.gpus,
            gpu_model,
            models_dir: self.models.clone(),
            load: self.load,
            duration_s: self.duration.map(|d| d.as_secs_f64()),
            window_s: self.plan_every,
            planner: PlannerConfig {
                slot_s: self.slot,
                horizon_slots: self.horizon,
                target_utilization: self.target_utilization,
                solver: SolverConfig { mip_rel_gap: self.gap, ..defaults.solver },
                placement: self.placement.parse().map_err(|e| ReplayError::Usage(format!("--placement: {e}")))?,
                sharing: self.sharing,
                replan_band: self.replan_band,
                ..defaults
            },
            forecaster,
            tlb: self.tlb,
            tlb_blind: self.tlb_blind,
            fluid_tick_ms,
            late: match self.late_requests.as_str() {
                "serve" => LateRequests::Serve,
                "shed" => LateRequests::Shed,
                other => {
                    return Err(ReplayError::Usage(format!("--late-requests: expected serve or shed, got {other:?}")));
                }
            },
            replan_on_burst: self.replan_on_burst,
            seed: self.seed,
        })
    }

    /// The policies asked for, in order.
    pub fn policies(&self) -> Vec<String> {
        self.policy.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect()
    }
}

/// The shipped default trace: `traces/...` under the working directory, else beside this crate's sources (so
/// `cargo run` works from any folder of the checkout).
fn default_trace() -> PathBuf {
    let here = PathBuf::from(DEFAULT_TRACE);
    if here.exists() {
        return here;
    }
    let beside = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DEFAULT_TRACE);
    if beside.exists() { beside } else { here }
}

fn bar(len: u64, prefix: String) -> ProgressBar {
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
fn describe(p: &Prepared) -> String {
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
        s.window_s,
        s.planner.horizon_slots,
        s.planner.slot_s,
        s.seed
    )
}

/// Runs every policy of `args` (and the upper bound) and returns the comparison with the scenario it ran; `quiet`
/// prints nothing on stderr (studies run many at once).
pub fn compare(args: &RunArgs, quiet: bool) -> Result<(Comparison, Scenario), ReplayError> {
    let spec = args.spec()?;
    let mut prepared = prepare(&spec)?;
    if args.mode == "cluster" {
        // The coordinator plans with its own `planner.interference`; replay's table would plan nothing.
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
    if let (true, Some(endpoint)) = (args.mode == "cluster", &args.coordinator) {
        let pb = bar((scenario.duration_ms / 1000.0 / scenario.window_s).ceil() as u64, "cluster".into());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| ReplayError::Sim(format!("cannot start the runtime: {e}")))?;
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
        let pb = bar((scenario.duration_ms / 1000.0 / scenario.window_s).ceil() as u64, policy.clone());
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
        "plan_every_s": spec.window_s,
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

/// `replay [--trace FILE] ...`: runs every policy, prints the table (or JSON), writes `--out`.
pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<Comparison, ReplayError> {
    let (cmp, scenario) = compare(args, false)?;
    let scenario = &scenario;
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&cmp.summary(scenario)).expect("JSON values serialise"))
    } else {
        cmp.table()
    };
    out.write_all(text.as_bytes()).map_err(|source| ReplayError::Io { path: "stdout".into(), source })?;
    if let Some(dir) = &args.out {
        cmp.write(dir, scenario)?;
        crate::note(format_args!("replay: wrote {}/summary.json, timeseries.csv and report.html", dir.display()));
    }
    Ok(cmp)
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
    let results = capacity::search(&prepared, &args.run.policies(), args.target_slo, args.max_gpus, &|p, n| {
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
