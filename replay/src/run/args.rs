//! The arguments of a run (`replay`, the default command; also under `replay capacity` and in studies' scenarios),
//! checked into a [`RunSpec`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use tessera_core::GpuModel;
use tessera_planner::settings::{RoundArgs, RoundSettings, seconds};
use tessera_sim::executor::LateRequests;

use super::{ReplayError, RunSpec};
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
    /// Co-located tenants slow each other down through the L3 TLB model, the same for every policy: off, baseline
    /// (today's TLB) or star (STAR's shared entries). `--tlb` alone is baseline.
    #[arg(long, value_enum, default_value = "off", num_args = 0..=1, default_missing_value = "baseline", value_name = "TLB")]
    pub tlb: super::Tlb,
    /// Plan as if co-located tenants did not slow each other down: every policy's planner gets no interference
    /// table (with `--tlb` on, it gets the TLB model's pairwise slowdowns of the tenants' models by default). The
    /// ablation of TLB-aware planning.
    #[arg(long)]
    pub tlb_blind: bool,
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
    /// The planning settings, the same for every policy (in cluster mode, the cluster's: given here, they must
    /// match it).
    #[command(flatten)]
    pub round: RoundArgs,
}

impl RunArgs {
    /// The run these arguments ask for, checked, with the planning settings' defaults under the flags.
    pub fn spec(&self) -> Result<RunSpec, ReplayError> {
        self.spec_over(&RoundSettings::default())
    }

    /// The run these arguments ask for, checked, with `base` under the planning flags (in cluster mode, the
    /// cluster's settings).
    pub fn spec_over(&self, base: &RoundSettings) -> Result<RunSpec, ReplayError> {
        let round = self.round.apply(base);
        round.validate().map_err(|e| ReplayError::Usage(format!("--{}: {}", flag_of(&e.field), e.problem)))?;
        let slot = seconds(round.slot);
        let plan_every = round.plan_every_s();
        self.check_mode()?;
        // Slots (the truth table, the bound, burst replans) start on tick boundaries, and so do the cells of the
        // counts' Poisson noise (to rounding: 4.35 s is 4349.999... ms).
        let ticks_per_slot = slot * 1000.0 / self.tick;
        if self.executor == "fluid"
            && self.tick > 0.0
            && ((ticks_per_slot - ticks_per_slot.round()) * self.tick).abs() > 1e-6
        {
            return Err(ReplayError::Usage(format!(
                "--executor fluid: --tick ({} ms) must divide --slot ({slot} s)",
                self.tick
            )));
        }
        let fluid_tick_ms = match self.executor.as_str() {
            "discrete" => None,
            "fluid" if !(self.tick.is_finite() && self.tick > 0.0) => {
                return Err(ReplayError::Usage(format!("--tick must be > 0 ms (got {})", self.tick)));
            }
            // Ticks start at multiples of the tick from time zero: every window must start on one.
            "fluid" if ((plan_every * 1000.0 / self.tick).fract() * self.tick).abs() > 1e-6 => {
                return Err(ReplayError::Usage(format!(
                    "--tick ({} ms) must divide --plan-every ({plan_every} s)",
                    self.tick
                )));
            }
            "fluid" => Some(self.tick),
            other => return Err(ReplayError::Usage(format!("--executor: expected discrete or fluid, got {other:?}"))),
        };
        let gpu_model = GpuModel::lookup(&self.gpu_model)
            .ok_or_else(|| ReplayError::Usage(format!("--gpu-model: unknown GPU model {:?}", self.gpu_model)))?;
        let forecaster = round.forecaster_config().map_err(|e| ReplayError::Usage(format!("--forecaster: {e}")))?;
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
            plan_every_s: plan_every,
            planner: round.planner_config(),
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
            replan_on_burst: round.replan_on_burst,
            seed: self.seed,
        })
    }

    /// Checks what needs no planning settings: the mode and what it allows (before a cluster is asked for them).
    pub fn check_mode(&self) -> Result<(), ReplayError> {
        match self.mode.as_str() {
            "in-process" => {}
            "cluster" if self.coordinator.is_none() => {
                return Err(ReplayError::Usage(
                    "--mode cluster needs --coordinator ADDR (start a local cluster with `coordinator dev-cluster`)"
                        .into(),
                ));
            }
            "cluster" => {}
            other => return Err(ReplayError::Usage(format!("--mode: expected in-process or cluster, got {other:?}"))),
        }
        if self.mode == "cluster" && self.executor == "fluid" {
            return Err(ReplayError::Usage(
                "--executor fluid runs in process only (sim-agents serve every request)".into(),
            ));
        }
        Ok(())
    }

    /// The policies asked for, in order.
    pub fn policies(&self) -> Vec<String> {
        self.policy.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect()
    }
}

/// The flag of a planning setting's key (`horizon_slots` is `--horizon`).
fn flag_of(key: &str) -> String {
    match key {
        "horizon_slots" => "horizon".into(),
        other => other.replace('_', "-"),
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
