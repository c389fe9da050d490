//! `replay run` (the default command): a trace through the planner and the simulated fleet, in process, under
//! virtual time, once per policy, and the comparison.
//!
//! - [`args`]: the run's arguments ([`RunArgs`]), checked into a [`RunSpec`]; [`prepare`] turns it into a
//!   [`Scenario`] and its arrivals.
//! - [`mapping`]: trace streams to tenants (model, SLO, retraining, demand); the documented mapping.
//! - [`arrivals`]: the requests of a run, identical for every policy (trace streams scaled per tenant, Poisson).
//! - [`driver`]: one policy's run in process, window by window: plan, apply, serve, measure.
//! - [`cluster`]: the run through a coordinator cluster, each simulated node a real agent.
//! - [`compare`]: every policy and the upper bound, gathered into a [`compare::Comparison`] (which
//!   [`crate::report`] shows).
//!
//! Determinism: every random choice (trace arrival conventions, scaling, tenant specs, Poisson streams) is drawn
//! from `--seed`; the executor draws nothing and the planner is deterministic, so the same inputs and seed give
//! the same numbers. Policies run one after another (each planning round already uses every core).

pub mod args;
pub mod arrivals;
pub mod cluster;
pub mod compare;
pub mod driver;
pub mod mapping;

pub use args::RunArgs;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_core::GpuModel;
use tessera_core::ids::{GpuId, NodeId};
use tessera_core::model::ModelProfile;
use tessera_core::tenant::{DemandSource, TenantSpec};
use tessera_planner::PlannerConfig;
use tessera_planner::forecast::ForecasterConfig;
use tessera_sim::executor::{Arrival, ExecutorConfig, LateRequests, TenantIndex};

use crate::trace::{self, ArrivalStream, TraceArrival, TraceOptions, TraceScan};
use arrivals::{ArrivalSource, Arrivals, Merged, Noisy, PoissonSet, Reorder, Scaler, TickCounts, TickSpread};
use mapping::Binding;

/// Whether co-located tenants slow each other down through the L3 TLB model (`--tlb`), and with which TLB: the same
/// for every policy of a run, through both executors and cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Tlb {
    /// No interference between co-located tenants.
    #[default]
    Off,
    /// Today's GPUs: one base per L3 TLB entry, 16 sub-entries (`sim-agent tlb --mode baseline`).
    Baseline,
    /// STAR: an entry may hold two bases with 8 sub-entries each (`sim-agent tlb --mode star`).
    Star,
}

impl Tlb {
    /// The TLB the executor simulates, `None` when off.
    pub fn mode(self) -> Option<tessera_sim::tlb::TlbMode> {
        match self {
            Tlb::Off => None,
            Tlb::Baseline => Some(tessera_sim::tlb::TlbMode::Baseline),
            Tlb::Star => Some(tessera_sim::tlb::TlbMode::Star),
        }
    }

    /// Its name, as `--tlb` takes it.
    pub fn name(self) -> &'static str {
        self.mode().map_or("off", tessera_sim::tlb::TlbMode::name)
    }
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    /// Bad arguments or inputs that do not fit together.
    #[error("{0}")]
    Usage(String),
    /// A trace could not be read.
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    /// A configuration file could not be read.
    #[error(transparent)]
    Config(#[from] tessera_core::config::ConfigError),
    /// The planner failed (a bug or bad input; an infeasible round is not an error).
    #[error("planner: {0}")]
    Plan(String),
    /// The simulator refused a call.
    #[error("simulator: {0}")]
    Sim(String),
    /// Writing an output failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The failure.
        source: std::io::Error,
    },
}

impl ReplayError {
    /// Exit status: 2 for bad usage or input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ReplayError::Usage(_) | ReplayError::Trace(_) | ReplayError::Config(_) => 2,
            _ => 1,
        }
    }
}

/// What one run simulates: the same for every policy.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// A label for reports (the trace's file name, or "poisson").
    pub name: String,
    /// Model profiles by name.
    pub models: BTreeMap<String, ModelProfile>,
    /// The fleet.
    pub gpus: BTreeMap<GpuId, GpuModel>,
    /// Tenants, in id order (the executor's numbering).
    pub tenants: Vec<TenantSpec>,
    /// Length of the run, ms.
    pub duration_ms: f64,
    /// Planning interval, seconds (a multiple of the planner's slot).
    pub plan_every_s: f64,
    /// Planner settings (slot length, horizon, solver).
    pub planner: PlannerConfig,
    /// Forecaster of every tenant.
    pub forecaster: ForecasterConfig,
    /// Executor settings (the dispatch rule is set per policy).
    pub executor: ExecutorConfig,
    /// Whether co-location slows tenants down through the L3 TLB model, and with which TLB.
    pub tlb: Tlb,
    /// What every policy's planner is told of that slowdown: the TLB model's pairwise table of the tenants' models
    /// ([`tessera_sim::tlb::TlbModel::pairwise`], same TLB, same seed), or `None` with the TLB off or with
    /// `--tlb-blind`.
    pub interference: Option<tessera_planner::input::Interference>,
    /// Fluid serving with ticks of this many ms ([`Executor::flow`](tessera_sim::executor::Executor::flow):
    /// requests as counts per tick, drawn around the trace's expectation); `None`: every request simulated.
    pub fluid_tick_ms: Option<f64>,
    /// Plan inside a window too, at the end of a slot whose arrivals left the bands of the forecasts the current plan
    /// was made with by enough to replan the fleet
    /// ([`burst_calls_replan`](tessera_planner::forecast::burst_calls_replan)).
    pub replan_on_burst: bool,
    /// Seed of every random choice.
    pub seed: u64,
}

/// What a user asks for (the command line, parsed).
#[derive(Debug, Clone)]
pub struct RunSpec {
    /// The trace.
    pub trace: PathBuf,
    /// How to read and sample it.
    pub trace_options: TraceOptions,
    /// The trace's own rate scaling (`--rate-scale`), before the per-tenant factors.
    pub rate_scale: f64,
    /// Tenants file; `None`: derived from the trace.
    pub tenants_file: Option<PathBuf>,
    /// Derived tenants; `None`: 3 per GPU.
    pub tenants_count: Option<usize>,
    /// Fleet file; `None`: `gpus` x `gpu_model` in nodes of 8.
    pub fleet: Option<PathBuf>,
    /// GPUs (without a fleet file).
    pub gpus: usize,
    /// GPU model (without a fleet file).
    pub gpu_model: GpuModel,
    /// Model profiles directory.
    pub models_dir: PathBuf,
    /// Mean demand as a fraction of the fleet's compute slices; `None` with a tenants file keeps the trace's rates.
    pub load: Option<f64>,
    /// Stop after this much workload time, seconds (`None`: the whole selected window of the trace).
    pub duration_s: Option<f64>,
    /// Planning interval, seconds.
    pub plan_every_s: f64,
    /// Planner settings.
    pub planner: PlannerConfig,
    /// Forecaster.
    pub forecaster: ForecasterConfig,
    /// TLB interference, and with which TLB.
    pub tlb: Tlb,
    /// Plan without the interference table (`--tlb-blind`): the ablation of TLB-aware planning.
    pub tlb_blind: bool,
    /// Fluid serving's tick, ms (`None`: every request simulated).
    pub fluid_tick_ms: Option<f64>,
    /// Queued requests that can no longer meet their SLO: served late or shed.
    pub late: LateRequests,
    /// Plan inside a window too, after a slot whose arrivals left the forecast's band (`--replan-on-burst`).
    pub replan_on_burst: bool,
    /// Seed.
    pub seed: u64,
}

/// The fleet of `n` GPUs of `model`, in nodes of 8.
pub fn uniform_fleet(n: usize, model: GpuModel) -> BTreeMap<GpuId, GpuModel> {
    (0..n)
        .map(|g| {
            let node = NodeId::new(format!("node-{:03}", g / 8)).expect("valid node id");
            (GpuId::new(node, (g % 8) as u32), model)
        })
        .collect()
}

/// A scenario ready to run: what to simulate and where its requests come from.
pub struct Prepared {
    /// What to simulate.
    pub scenario: Scenario,
    /// The requests.
    pub arrivals: Box<dyn Arrivals>,
    /// The trace as scanned (rows, bad rows, streams).
    pub scan: TraceScan,
    /// Per tenant: its stream key and mean rate (requests per second) after scaling; Poisson tenants say so.
    pub tenant_sources: Vec<(String, f64)>,
    /// Trace streams whose part replayed is more than [`MAX_BURST`] times denser than their window's mean, with how
    /// many times: their tenants' factors were cut to `MAX_BURST` times that mean.
    pub capped_streams: Vec<(String, f64)>,
}

/// Reads the models, the fleet, the trace (pass 1) and the tenants, and maps them (see [`mapping`]).
pub fn prepare(spec: &RunSpec) -> Result<Prepared, ReplayError> {
    if !(spec.plan_every_s > 0.0 && spec.planner.slot_s > 0.0) {
        return Err(ReplayError::Usage("--window and --slot must be > 0".into()));
    }
    let ratio = spec.plan_every_s / spec.planner.slot_s;
    if (ratio - ratio.round()).abs() > 1e-9 || ratio.round() < 1.0 {
        return Err(ReplayError::Usage(format!(
            "--window ({} s) must be a whole number of --slot ({} s)",
            spec.plan_every_s, spec.planner.slot_s
        )));
    }
    spec.planner.validate().map_err(|e| ReplayError::Usage(e.to_string()))?;
    spec.forecaster.validate().map_err(|e| ReplayError::Usage(format!("forecaster: {e}")))?;
    if let Some(l) = spec.load
        && !(l.is_finite() && l > 0.0)
    {
        return Err(ReplayError::Usage(format!("--load must be > 0 (got {l})")));
    }
    let models = tessera_core::config::load_model_dir(&spec.models_dir)?;
    let gpus = match &spec.fleet {
        Some(f) => {
            let fleet = tessera_core::config::load_fleet(f)?;
            let mut out = BTreeMap::new();
            for node in &fleet.nodes {
                for (i, m) in node.gpus.iter().enumerate() {
                    out.insert(GpuId::new(node.id.clone(), i as u32), *m);
                }
            }
            out
        }
        None => {
            if spec.gpus == 0 {
                return Err(ReplayError::Usage("--gpus must be at least 1".into()));
            }
            uniform_fleet(spec.gpus, spec.gpu_model)
        }
    };
    let main_model = *gpus.values().next().expect("a fleet has a GPU");
    // Every MIG-capable GPU has 7 compute slices.
    let fleet_slices = 7.0 * gpus.len() as f64;

    if let Some(d) = spec.duration_s
        && !(d.is_finite() && d > 0.0)
    {
        return Err(ReplayError::Usage(format!("--duration must be > 0 (got {d} s)")));
    }
    let scan = trace::scan(&spec.trace, &spec.trace_options)?;
    let rates: Vec<f64> = scan.streams.iter().map(|s| s.mean_rate_rps * spec.rate_scale).collect();
    if scan.streams.is_empty() {
        return Err(ReplayError::Usage(format!("{}: no stream in the selected window", spec.trace.display())));
    }
    let mut duration_s = scan.duration_s;
    if let Some(d) = spec.duration_s {
        duration_s = duration_s.min(d);
    }
    if duration_s <= 0.0 {
        return Err(ReplayError::Usage(format!("{}: the selected window is empty", spec.trace.display())));
    }

    let mut bindings: Vec<Binding> = match &spec.tenants_file {
        None => derived(spec, &scan, &rates, &models, main_model, fleet_slices)?,
        Some(f) => given(spec, f, &scan, &rates, &models, main_model, fleet_slices)?,
    };
    bindings.sort_by(|a, b| a.spec.id.cmp(&b.spec.id));
    for b in &bindings {
        if !models.contains_key(&b.spec.model) {
            return Err(ReplayError::Usage(format!(
                "tenant {}: model {:?} is not in {} (known: {})",
                b.spec.id,
                b.spec.model,
                spec.models_dir.display(),
                models.keys().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
    }

    let mut capped_streams = Vec::new();
    if duration_s < scan.duration_s {
        let bursts = bursts(&scan, duration_s, spec.plan_every_s)?;
        for b in &mut bindings {
            if let Some((s, k)) = &mut b.stream
                && bursts[*s] > MAX_BURST
            {
                *k *= MAX_BURST / bursts[*s];
                if !capped_streams.iter().any(|(key, _)| *key == scan.streams[*s].key) {
                    capped_streams.push((scan.streams[*s].key.clone(), bursts[*s]));
                }
            }
        }
    }

    let duration_ms = duration_s * 1000.0;
    let mut parts: Vec<Box<dyn Arrivals>> = Vec::new();
    let traced: Vec<(TenantIndex, usize, f64)> =
        bindings.iter().enumerate().filter_map(|(i, b)| b.stream.map(|(s, k)| (TenantIndex(i as u32), s, k))).collect();
    let tenant_sources = bindings
        .iter()
        .map(|b| match (b.stream, &b.spec.demand) {
            (Some((s, k)), _) => (scan.streams[s].key.clone(), rates[s] * k),
            (None, DemandSource::Poisson { rate_rps }) => ("poisson".to_string(), *rate_rps),
            (None, _) => ("-".to_string(), 0.0),
        })
        .collect();
    if !traced.is_empty() {
        parts.push(Box::new(TraceArrivals {
            scan: scan.clone(),
            rate_scale: spec.rate_scale,
            tenants: traced,
            seed: spec.seed,
            end_ms: duration_ms,
        }));
    }
    let poisson: Vec<(TenantIndex, f64)> = bindings
        .iter()
        .enumerate()
        .filter_map(|(i, b)| match (&b.stream, &b.spec.demand) {
            (None, DemandSource::Poisson { rate_rps }) => Some((TenantIndex(i as u32), *rate_rps)),
            _ => None,
        })
        .collect();
    if !poisson.is_empty() {
        parts.push(Box::new(PoissonSet { seed: spec.seed, rates: poisson, end_ms: duration_ms }));
    }
    let interference = if spec.tlb_blind {
        None
    } else {
        planner_interference(spec.tlb, bindings.iter().map(|b| b.spec.model.as_str()), spec.seed)?
    };
    let scenario = Scenario {
        name: spec.trace.file_name().map_or_else(|| "trace".into(), |n| n.to_string_lossy().into_owned()),
        models,
        gpus,
        tenants: bindings.into_iter().map(|b| b.spec).collect(),
        duration_ms,
        plan_every_s: spec.plan_every_s,
        planner: spec.planner.clone(),
        forecaster: spec.forecaster.clone(),
        executor: ExecutorConfig { late: spec.late, ..ExecutorConfig::default() },
        interference,
        tlb: spec.tlb,
        fluid_tick_ms: spec.fluid_tick_ms,
        replan_on_burst: spec.replan_on_burst,
        seed: spec.seed,
    };
    let merged: Box<dyn Arrivals> = Box::new(Merged { parts });
    // A fluid run serves counts: drawn around the expectation, as the discrete executor's requests are.
    let arrivals = match spec.fluid_tick_ms {
        Some(tick_ms) => Box::new(Noisy {
            inner: merged,
            seed: spec.seed,
            tenants: scenario.tenants.len(),
            tick_ms,
            cell_ms: Noisy::cell_for(tick_ms, spec.planner.slot_s * 1000.0, spec.plan_every_s * 1000.0),
        }),
        None => merged,
    };
    Ok(Prepared { scenario, arrivals, scan, tenant_sources, capped_streams })
}

/// The interference table the planners of a run with `tlb` get: the TLB model's pairwise slowdowns of `models`
/// with the simulator's TLB and seed (`None` with the TLB off).
pub fn planner_interference<'a>(
    tlb: Tlb,
    models: impl IntoIterator<Item = &'a str>,
    seed: u64,
) -> Result<Option<tessera_planner::input::Interference>, ReplayError> {
    let Some(mode) = tlb.mode() else { return Ok(None) };
    let models: Vec<&str> = models.into_iter().collect();
    let pairs = tessera_sim::tlb::TlbModel::with_seed(seed)
        .pairwise(&models, mode)
        .map_err(|e| ReplayError::Sim(format!("interference table: {e}")))?;
    let source = format!("replay: the TLB model's pairwise table, --tlb {}, seed {seed}", tlb.name());
    Ok(Some(tessera_planner::input::Interference { source: Some(source), pairs }))
}

/// The most a trace stream may be denser over a run than over its trace window: a tenant's requests in a run are at
/// most 10 times its mean rate (as mapped) times the run's length.
///
/// The streams' rates, and with them the factors that scale each stream to its tenant's rate ([`Scaler`]), are
/// measured over the trace window selected (`--window-start`, `--window-duration`), of which a shorter `--duration`
/// replays the start. A start denser than the window's mean replays denser, as the trace is; but measured over a
/// window that goes on past a long gap, a stream's factor grows with the gap, and the requests before the gap become
/// `rate x gap` copies, all inside the run: for one minute replayed of a generic trace with a 10^5 s gap, 93 M
/// requests and a 4.5 GB peak (a `1e308` timestamp, before it was refused, took every byte there was). A stream whose
/// part replayed is more than `MAX_BURST` times denser than its window's mean has its tenants' factors cut to
/// `MAX_BURST` times that mean, which bounds a run's requests, and the memory its copies take, by the run's length
/// times its rate, whatever the file holds; [`Prepared::capped_streams`] names them. The runs the documentation
/// makes of the shipped traces are at most 1.25 times as dense (the first 30 minutes of the Azure LLM code trace;
/// its first 4 to 10 minutes, 0.96 to 1.01; the Alibaba pods up in the first 30 of 149 days, 1.03), so none is cut.
pub const MAX_BURST: f64 = 10.0;

/// Per sampled stream: its requests in the first `duration_s` of the window (after time scaling) over those its mean
/// rate over the whole window gives there. Reads the trace's part replayed once, `step_s` at a time.
fn bursts(scan: &TraceScan, duration_s: f64, step_s: f64) -> Result<Vec<f64>, ReplayError> {
    let mut counts = vec![0u64; scan.streams.len()];
    let mut stream = scan.arrivals_before(1.0, duration_s)?;
    let mut buf = Vec::new();
    let mut until = 0.0;
    while until < duration_s {
        until = (until + step_s).min(duration_s);
        buf.clear();
        stream.next_window(until, &mut buf)?;
        for a in &buf {
            counts[a.stream as usize] += 1;
        }
    }
    Ok(scan
        .streams
        .iter()
        .zip(counts)
        .map(|(s, n)| {
            let expected = s.mean_rate_rps * duration_s;
            if expected > 0.0 { n as f64 / expected } else { 0.0 }
        })
        .collect())
}

/// Derived tenants (see [`mapping`]).
fn derived(
    spec: &RunSpec,
    scan: &TraceScan,
    rates: &[f64],
    models: &BTreeMap<String, ModelProfile>,
    gpu: GpuModel,
    fleet_slices: f64,
) -> Result<Vec<Binding>, ReplayError> {
    let usable = mapping::usable_models(models, gpu);
    if usable.is_empty() {
        return Err(ReplayError::Usage(format!(
            "no model in {} serves on a 2g instance of {gpu}",
            spec.models_dir.display()
        )));
    }
    let n = spec.tenants_count.unwrap_or(3 * (fleet_slices / 7.0).round().max(1.0) as usize);
    if n == 0 {
        return Err(ReplayError::Usage("--tenants-count must be at least 1".into()));
    }
    let keys: Vec<&str> = scan.streams.iter().map(|s| s.key.as_str()).collect();
    let tenants = mapping::derived_tenants(n, &keys, &usable, gpu, spec.seed);
    let mut shares = vec![0.0f64; keys.len()];
    for d in &tenants {
        shares[d.stream] += d.share;
    }
    let weights: Vec<f64> = tenants.iter().map(|d| rates[d.stream] * d.share / shares[d.stream]).collect();
    let load = spec.load.unwrap_or(0.6);
    let demand = mapping::capped_shares(&weights, load * fleet_slices, mapping::MAX_TENANT_SLICES);
    Ok(tenants
        .into_iter()
        .zip(demand)
        .map(|(d, demand)| {
            let target_rps = demand / mapping::slices_per_rps(models, &d.spec, gpu);
            let raw = rates[d.stream].max(1e-12);
            Binding { spec: d.spec, stream: Some((d.stream, target_rps / raw)) }
        })
        .collect())
}

/// Tenants from a file (see [`mapping`]).
fn given(
    spec: &RunSpec,
    file: &Path,
    scan: &TraceScan,
    rates: &[f64],
    models: &BTreeMap<String, ModelProfile>,
    gpu: GpuModel,
    fleet_slices: f64,
) -> Result<Vec<Binding>, ReplayError> {
    let tenants = tessera_core::config::load_tenants(file)?;
    let mut out = Vec::with_capacity(tenants.len());
    for t in tenants {
        if !models.contains_key(&t.model) {
            return Err(ReplayError::Usage(format!(
                "{}: tenant {}: model {:?} is not in {}",
                file.display(),
                t.id,
                t.model,
                spec.models_dir.display()
            )));
        }
        let stream = match &t.demand {
            DemandSource::Trace { selector, scale } => {
                Some((mapping::rank_of(&t.id, selector, scan.streams.len())?, *scale))
            }
            DemandSource::Poisson { .. } => None,
        };
        out.push(Binding { spec: t, stream });
    }
    if let Some(load) = spec.load {
        let traced_slices: f64 = out
            .iter()
            .filter_map(|b| b.stream.map(|(s, k)| rates[s] * k * mapping::slices_per_rps(models, &b.spec, gpu)))
            .sum();
        if traced_slices > 0.0 {
            let factor = load * fleet_slices / traced_slices;
            for b in &mut out {
                if let Some((_, k)) = &mut b.stream {
                    *k *= factor;
                }
            }
        }
    }
    Ok(out)
}

/// Trace tenants: each takes its stream's arrivals times its factor ([`Scaler`]).
struct TraceArrivals {
    scan: TraceScan,
    rate_scale: f64,
    /// `(tenant, stream, factor)`.
    tenants: Vec<(TenantIndex, usize, f64)>,
    seed: u64,
    end_ms: f64,
}

impl Arrivals for TraceArrivals {
    fn open(&self) -> Result<Box<dyn ArrivalSource>, ReplayError> {
        // `--rate-scale` goes through the same per-tenant [`Scaler`] as the mapping's factors (the trace module's
        // own rate scaling stacks copies at one instant, which multiplies burstiness).
        // Cut at the run's end: rows after it are never read into memory.
        let stream = self.scan.arrivals_before(1.0, self.end_ms / 1000.0)?;
        let mut by_stream: Vec<Vec<(TenantIndex, Scaler)>> = (0..self.scan.streams.len()).map(|_| Vec::new()).collect();
        for &(t, s, k) in &self.tenants {
            by_stream[s].push((t, Scaler::new(self.seed, t, k * self.rate_scale, arrivals::SPREAD_MS)));
        }
        Ok(Box::new(TraceSource {
            stream,
            by_stream,
            raw: Vec::new(),
            copies: Vec::new(),
            reorder: Reorder::default(),
            end_ms: self.end_ms,
            spread: None,
        }))
    }
}

struct TraceSource {
    stream: ArrivalStream,
    by_stream: Vec<Vec<(TenantIndex, Scaler)>>,
    raw: Vec<TraceArrival>,
    copies: Vec<f64>,
    reorder: Reorder,
    end_ms: f64,
    /// Fluid runs: the expected counts ahead of those emitted.
    spread: Option<TickSpread>,
}

impl ArrivalSource for TraceSource {
    /// Expected counts without drawing copies: a request scaled by `k` is `min(k, 1)` at its time (the copy that
    /// keeps it, or the chance of keeping it) and `k - 1` spread uniformly over the next [`arrivals::SPREAD_MS`],
    /// the [`Scaler`]'s expectation.
    fn count_until(&mut self, until_ms: f64, counts: &mut TickCounts) -> Result<(), ReplayError> {
        let tick = counts.tick_ms;
        let spread = self.spread.get_or_insert_with(|| TickSpread::new(tick, counts.tenants));
        self.raw.clear();
        self.stream.next_window(until_ms / 1000.0, &mut self.raw)?;
        for a in &self.raw {
            let t_ms = a.time_s * 1000.0;
            if t_ms >= self.end_ms {
                continue;
            }
            for (tenant, scaler) in &self.by_stream[a.stream as usize] {
                let (t, k) = (tenant.0 as usize, scaler.factor);
                spread.point(t, t_ms, k.min(1.0));
                if k > 1.0 {
                    // Copies spread past the end of the run are not part of it.
                    let end = (t_ms + scaler.spread_ms).min(self.end_ms);
                    spread.uniform(t, t_ms, end, (k - 1.0) * (end - t_ms) / scaler.spread_ms);
                }
            }
        }
        spread.emit(until_ms, counts);
        Ok(())
    }

    fn next_until(&mut self, until_ms: f64, out: &mut Vec<Arrival>) -> Result<(), ReplayError> {
        self.raw.clear();
        self.stream.next_window(until_ms / 1000.0, &mut self.raw)?;
        for a in &self.raw {
            let t_ms = a.time_s * 1000.0;
            if t_ms >= self.end_ms {
                // Every copy is at or after its request: none would be part of the run.
                continue;
            }
            for (tenant, scaler) in &mut self.by_stream[a.stream as usize] {
                self.copies.clear();
                scaler.copies(t_ms, &mut self.copies);
                for &c in &self.copies {
                    if c < self.end_ms {
                        self.reorder.push(Arrival { at_ms: c, tenant: *tenant });
                    }
                }
            }
        }
        self.reorder.release(until_ms, out);
        Ok(())
    }
}
