//! # Sharing one MIG instance between a tenant's inference and its retraining
//!
//! MIG isolates instances from one another; inside one instance, two processes share its SMs the way they would
//! share a whole GPU. This module simulates a tenant's inference server and its best-effort retraining job on one
//! instance under three sharing modes, and measures what each costs inference at the tail and what it leaves
//! training. It reproduces the comparison of Tally (Zhao, Jayarajan, Pekhimenko, ASPLOS 2025; summarised in
//! `docs/references.md`): block-level priority against TGS-like time-slicing.
//!
//! ## The workload
//! - **Inference**: Poisson arrivals at `load` x the instance's batch-1 throughput (one request per batch-1
//!   latency, [`ModelProfile::latency_on`]: alone and unbatched, inference would keep the instance busy `load` of
//!   the time, as in Tally's single-request serving at 50 % load); a dynamic-batching server takes everything
//!   queued (up to the model's `max_batch`) whenever it may run, and a batch of `b` takes `latency_on(gpu, profile, b)` of
//!   instance time, run as [`ShareParams::inference_kernels`] equal kernels. A request's latency is its completion
//!   time minus its arrival.
//! - **Training**: always has work (a retraining job streams kernels back to back); kernel durations are log-normal
//!   ([`ShareParams::train_kernel_median_ms`], [`ShareParams::train_kernel_sigma`]). Its throughput is the share of
//!   instance time its kernels run, times its own efficiency in the mode: 1 is the training job alone on the
//!   instance. In work units, the training model's [`ModelProfile::training_speed_on`] times that share.
//!
//! ## The modes
//! - **exclusive** (today's Tessera): the instance runs inference only; training gets nothing here (it needs an
//!   instance of its own).
//! - **timeslice** (TGS-like, time-sliced contexts): one context runs at a time. While both have work they alternate
//!   slices of [`ShareParams::timeslice_ms`]; a slice ends at the first kernel boundary of its holder after it
//!   expires (training yields only at kernel boundaries; inference's batch is paused at one), and every switch
//!   costs [`ShareParams::switch_ms`]. A context alone keeps the instance, so a request arriving while training
//!   runs waits for the rest of training's slice and its kernel in flight, and a batch longer than a slice is
//!   interrupted by training's slices. Nothing here is fitted to TGS's published overhead.
//! - **priority** (Tally): inference kernels launch at once; a running training kernel is preempted at thread-block
//!   granularity, so inference waits for the blocks in flight: a uniform share of
//!   [`ShareParams::preempt_bound_ms`], Tally's bound on the estimated preemption latency. Training launches only
//!   after [`ShareParams::idle_before_train_ms`] of inference idleness (Tally's rule) and runs transformed kernels
//!   (sliced or persistent thread blocks) at [`ShareParams::transform_efficiency`] of their speed.
//!
//! The priority mode's overhead comes from the preemption wait alone (bounded by a fraction of a millisecond);
//! the time-slice mode's from slices (milliseconds) and non-preemptible kernels. Neither models memory-bandwidth or
//! cache contention between the two jobs, so both are lower bounds on the interference real hardware shows.
//!
//! Parameters marked \[I\] are assumptions; the rest cite Tally.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use tessera_core::model::ModelProfile;
use tessera_core::{GpuModel, Profile};

/// Parameters of the sharing model, shared with the executors and the planner.
pub use tessera_core::sharing::ShareParams;
/// How the two jobs share the instance (the core type; the command line's `--mode`).
pub use tessera_core::sharing::Sharing as ShareMode;

/// What one instance shares: the GPU, the profile, the two models and the inference load.
#[derive(Debug, Clone)]
pub struct ShareSetup<'a> {
    /// The GPU model.
    pub gpu: GpuModel,
    /// The instance's profile.
    pub profile: Profile,
    /// The inference model.
    pub inference: &'a ModelProfile,
    /// The retraining model.
    pub training: &'a ModelProfile,
    /// Inference arrival rate as a share of the instance's batch-1 throughput, in (0, 1).
    pub load: f64,
    /// Simulated time, seconds (at most [`MAX_DURATION_S`]).
    pub duration_s: f64,
    /// Seed of the arrivals and the training kernels.
    pub seed: u64,
}

/// The longest run simulated, seconds (arrival times are kept in memory: an hour at a 0.5 ms batch-1 latency is
/// 3.6 M requests).
pub const MAX_DURATION_S: f64 = 3600.0;

/// Why a sharing run cannot be simulated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShareError {
    /// A setting out of range.
    #[error("{field}: {reason}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

/// One mode's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShareReport {
    /// The mode.
    pub mode: ShareMode,
    /// Requests served.
    pub requests: u64,
    /// Median inference latency, ms.
    pub p50_ms: f64,
    /// 99th-percentile inference latency, ms.
    pub p99_ms: f64,
    /// 99th-percentile inference latency of the same arrivals alone on the instance (exclusive), ms.
    pub alone_p99_ms: f64,
    /// `p99_ms / alone_p99_ms - 1`.
    pub p99_overhead: f64,
    /// Training throughput relative to the training job alone on the instance (1 = alone).
    pub train_share: f64,
    /// Training work per second: the training model's speed on the instance (7g GPU-seconds per second) times
    /// `train_share`.
    pub train_throughput: f64,
    /// Share of instance time inference kernels ran.
    pub inference_busy: f64,
    /// Tally's system throughput: inference's (requests completed within the run over requests that arrived in
    /// it) plus training's (`train_share`), each relative to the job alone.
    pub system_throughput: f64,
}

impl ShareSetup<'_> {
    fn check(&self, mode: ShareMode, p: &ShareParams) -> Result<(), ShareError> {
        let bad = |field, reason: String| Err(ShareError::Invalid { field, reason });
        if !(self.load > 0.0 && self.load < 1.0) {
            return bad("load", format!("{} is not in (0, 1)", self.load));
        }
        if !(self.duration_s > 0.0 && self.duration_s <= MAX_DURATION_S) {
            return bad("duration", format!("{} s is not in (0, {MAX_DURATION_S}]", self.duration_s));
        }
        let Some(spec) = self.gpu.profile(self.profile) else {
            return bad("profile", format!("{} does not exist on {}", self.profile, self.gpu));
        };
        if !self.inference.fits_inference(spec) {
            return bad("profile", format!("{} does not fit {} inference", self.profile, self.inference.name));
        }
        let both = self.inference.inference_memory_gib + self.training.training_memory_gib;
        if mode != ShareMode::Exclusive && both > spec.memory_gib {
            return bad(
                "profile",
                format!(
                    "{} ({} GiB) does not hold {} inference and {} retraining together ({both} GiB)",
                    self.profile, spec.memory_gib, self.inference.name, self.training.name
                ),
            );
        }
        p.validate().map_err(|e| ShareError::Invalid { field: e.field, reason: e.reason })?;
        Ok(())
    }

    fn batch_ms(&self, b: u32) -> f64 {
        self.inference.latency_on(self.gpu, self.profile, b)
    }

    /// Arrival times, ms, Poisson at `load` x the batch-1 throughput.
    fn arrivals(&self) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let rate = self.load / self.batch_ms(1);
        let end = self.duration_s * 1000.0;
        let mut t = 0.0;
        let mut out = Vec::new();
        loop {
            t += -(1.0 - rng.random::<f64>()).ln() / rate;
            if t >= end {
                return out;
            }
            out.push(t);
        }
    }
}

/// Training kernel durations, ms: log-normal, from their own seeded stream.
struct TrainKernels {
    rng: ChaCha8Rng,
    median: f64,
    sigma: f64,
}

impl TrainKernels {
    fn new(seed: u64, p: &ShareParams) -> Self {
        TrainKernels {
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7261_696e_6b65_726e),
            median: p.train_kernel_median_ms,
            sigma: p.train_kernel_sigma,
        }
    }

    fn next(&mut self) -> f64 {
        // Box-Muller: one standard normal from two uniforms.
        let (u1, u2) = (1.0 - self.rng.random::<f64>(), self.rng.random::<f64>());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        self.median * (self.sigma * z).exp()
    }
}

/// An inference batch in progress: its requests' arrival times and its kernels left.
struct Batch {
    arrivals: Vec<f64>,
    kernels_left: u32,
    kernel_ms: f64,
}

/// The requests waiting and served, and inference's busy time.
struct Server<'a> {
    setup: &'a ShareSetup<'a>,
    kernels: u32,
    arrivals: &'a [f64],
    next: usize,
    queue: std::collections::VecDeque<f64>,
    latencies: Vec<f64>,
    /// Requests completed by this time (the end of the run), counted in `completed`.
    horizon_ms: f64,
    completed: u64,
    busy_ms: f64,
}

impl<'a> Server<'a> {
    fn new(setup: &'a ShareSetup<'a>, arrivals: &'a [f64], kernels: u32) -> Self {
        Server {
            setup,
            kernels,
            arrivals,
            next: 0,
            queue: Default::default(),
            latencies: Vec::with_capacity(arrivals.len()),
            horizon_ms: setup.duration_s * 1000.0,
            completed: 0,
            busy_ms: 0.0,
        }
    }

    /// Moves every arrival up to `t` into the queue.
    fn admit(&mut self, t: f64) {
        while self.next < self.arrivals.len() && self.arrivals[self.next] <= t {
            self.queue.push_back(self.arrivals[self.next]);
            self.next += 1;
        }
    }

    /// The next arrival after everything admitted (`None`: no more).
    fn next_arrival(&self) -> Option<f64> {
        self.arrivals.get(self.next).copied()
    }

    fn done(&self) -> bool {
        self.next >= self.arrivals.len() && self.queue.is_empty()
    }

    /// A batch of what is queued at `t` (up to the model's largest batch); `None` with nothing queued.
    fn take_batch(&mut self, t: f64) -> Option<Batch> {
        self.admit(t);
        if self.queue.is_empty() {
            return None;
        }
        let b = self.queue.len().min(self.setup.inference.max_batch.max(1) as usize);
        let arrivals: Vec<f64> = self.queue.drain(..b).collect();
        let total = self.setup.batch_ms(b as u32);
        Some(Batch { arrivals, kernels_left: self.kernels, kernel_ms: total / f64::from(self.kernels) })
    }

    /// Runs one kernel of `batch` from `t`; returns the time it ends and records the batch when it completes.
    fn run_kernel(&mut self, batch: &mut Batch, t: f64) -> f64 {
        let end = t + batch.kernel_ms;
        self.busy_ms += batch.kernel_ms;
        batch.kernels_left -= 1;
        if batch.kernels_left == 0 {
            self.latencies.extend(batch.arrivals.iter().map(|a| end - a));
            if end <= self.horizon_ms {
                self.completed += batch.arrivals.len() as u64;
            }
        }
        end
    }
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Simulates `mode` (and, for its overhead, `exclusive` on the same arrivals) and reports both.
pub fn simulate(setup: &ShareSetup<'_>, mode: ShareMode, p: &ShareParams) -> Result<ShareReport, ShareError> {
    setup.check(mode, p)?;
    let arrivals = setup.arrivals();
    if arrivals.is_empty() {
        return Err(ShareError::Invalid {
            field: "duration",
            reason: format!("no request arrives in {} s at load {}: run longer", setup.duration_s, setup.load),
        });
    }
    let alone = run(setup, &arrivals, ShareMode::Exclusive, p);
    let (latencies, busy, train_ms, completed) =
        if mode == ShareMode::Exclusive { alone.clone() } else { run(setup, &arrivals, mode, p) };
    let mut sorted = latencies;
    sorted.sort_by(f64::total_cmp);
    let mut alone_sorted = alone.0;
    alone_sorted.sort_by(f64::total_cmp);
    let span = setup.duration_s * 1000.0;
    let (p99, alone_p99) = (quantile(&sorted, 0.99), quantile(&alone_sorted, 0.99));
    let train_share = train_ms / span;
    Ok(ShareReport {
        mode,
        requests: sorted.len() as u64,
        p50_ms: quantile(&sorted, 0.5),
        p99_ms: p99,
        alone_p99_ms: alone_p99,
        p99_overhead: p99 / alone_p99 - 1.0,
        train_share,
        train_throughput: train_share * setup.training.training_speed_on(setup.gpu, setup.profile),
        inference_busy: busy / span,
        system_throughput: completed as f64 / arrivals.len().max(1) as f64 + train_share,
    })
}

/// One mode on `arrivals`: (latencies, inference busy ms, productive training ms (scaled by the mode's efficiency),
/// requests completed within the run).
fn run(setup: &ShareSetup<'_>, arrivals: &[f64], mode: ShareMode, p: &ShareParams) -> (Vec<f64>, f64, f64, u64) {
    let mut s = Server::new(setup, arrivals, p.inference_kernels);
    let mut train = TrainKernels::new(setup.seed, p);
    let end = setup.duration_s * 1000.0;
    let mut t = 0.0;
    let mut train_ms = 0.0;
    match mode {
        ShareMode::Exclusive => {
            while !s.done() {
                match s.take_batch(t) {
                    Some(mut b) => {
                        while b.kernels_left > 0 {
                            t = s.run_kernel(&mut b, t);
                        }
                    }
                    None => t = s.next_arrival().map_or(t, |a| a.max(t)),
                }
            }
        }
        ShareMode::Timeslice => {
            // Training holds the instance whenever inference has nothing to do; `slice_start` is when the holder
            // got it. A paused batch resumes at inference's next slice.
            let mut paused: Option<Batch> = None;
            let mut train_slice_start = 0.0;
            while !s.done() || paused.is_some() {
                // Training's turn: kernels until inference waits and training's slice is over.
                loop {
                    s.admit(t);
                    let waiting = paused.is_some() || !s.queue.is_empty();
                    if waiting && t - train_slice_start >= p.timeslice_ms {
                        break;
                    }
                    if !waiting && s.next_arrival().is_none() {
                        break;
                    }
                    let k = train.next();
                    if t < end {
                        train_ms += k.min(end - t);
                    }
                    t += k;
                }
                if s.done() && paused.is_none() {
                    break;
                }
                // Inference's turn: kernels until nothing is left or its slice is over (then training's, at once:
                // training always has work).
                t += p.switch_ms;
                let slice_start = t;
                loop {
                    let mut batch = match paused.take() {
                        Some(b) => b,
                        None => match s.take_batch(t) {
                            Some(b) => b,
                            None => break,
                        },
                    };
                    while batch.kernels_left > 0 && t - slice_start < p.timeslice_ms {
                        t = s.run_kernel(&mut batch, t);
                    }
                    if batch.kernels_left > 0 {
                        paused = Some(batch);
                        break;
                    }
                    if t - slice_start >= p.timeslice_ms {
                        break;
                    }
                }
                t += p.switch_ms;
                train_slice_start = t;
            }
        }
        ShareMode::Priority => {
            // Between batches: training runs from `idle + idle_before_train_ms` until the next arrival, which waits
            // for the training blocks in flight (uniform in [0, preempt_bound_ms)) when training was running.
            let mut rng = ChaCha8Rng::seed_from_u64(setup.seed ^ 0x7072_6565_6d70_7421);
            while !s.done() {
                match s.take_batch(t) {
                    Some(mut b) => {
                        while b.kernels_left > 0 {
                            t = s.run_kernel(&mut b, t);
                        }
                    }
                    None => {
                        let Some(a) = s.next_arrival() else { break };
                        let train_from = t + p.idle_before_train_ms;
                        if a > train_from {
                            let stop = a.min(end);
                            if stop > train_from {
                                train_ms += (stop - train_from) * p.transform_efficiency;
                            }
                            t = a + rng.random::<f64>() * p.preempt_bound_ms;
                        } else {
                            t = a.max(t);
                        }
                    }
                }
            }
            if t < end {
                train_ms += (end - t - p.idle_before_train_ms).max(0.0) * p.transform_efficiency;
            }
        }
    }
    if mode == ShareMode::Timeslice && t < end {
        train_ms += end - t;
    }
    (s.latencies, s.busy_ms, train_ms, s.completed)
}

/// Arguments of `sim-agent share`.
#[derive(Debug, Clone, clap::Args)]
pub struct ShareArgs {
    /// How inference and retraining share the instance: exclusive, timeslice or priority.
    #[arg(long)]
    pub mode: ShareMode,
    /// The inference model (a profile in --models).
    #[arg(long)]
    pub model: String,
    /// The retraining model (a profile in --models).
    #[arg(long)]
    pub train_model: String,
    /// Inference arrival rate as a share of the instance's batch-1 throughput, in (0, 1).
    #[arg(long, default_value_t = 0.5)]
    pub load: f64,
    /// Seed of the arrivals and the training kernels.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// GPU model.
    #[arg(long, default_value = "A100-40GB")]
    pub gpu_model: GpuModel,
    /// The instance's profile (1g, 1g.2x, 2g, 3g, 4g, 7g); default the smallest that holds both models' memory.
    #[arg(long)]
    pub profile: Option<Profile>,
    /// Simulated seconds.
    #[arg(long, default_value_t = 60.0)]
    pub duration: f64,
    /// Time slice of the timeslice mode, ms.
    #[arg(long, default_value_t = ShareParams::default().timeslice_ms)]
    pub timeslice_ms: f64,
    /// Model profiles directory.
    #[arg(long, default_value = "configs/models", value_name = "DIR")]
    pub models: std::path::PathBuf,
    /// Print one JSON object instead of a line.
    #[arg(long)]
    pub json: bool,
}

/// Why `sim-agent share` failed.
#[derive(Debug, thiserror::Error)]
pub enum ShareCliError {
    /// Bad input (exit code 2).
    #[error("{0}")]
    Input(String),
    /// Writing the output failed (exit code 1).
    #[error("writing output: {0}")]
    Io(#[from] std::io::Error),
}

impl ShareCliError {
    /// The process exit code: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ShareCliError::Input(_) => 2,
            ShareCliError::Io(_) => 1,
        }
    }
}

/// The smallest profile of `gpu` (fewest compute slices, then least memory) whose memory holds `a`'s inference and
/// `b`'s retraining together.
pub fn smallest_shared_profile(gpu: GpuModel, a: &ModelProfile, b: &ModelProfile) -> Option<Profile> {
    let need = a.inference_memory_gib + b.training_memory_gib;
    gpu.spec()
        .profiles
        .iter()
        .filter(|p| p.profile != Profile::G1Me && p.memory_gib >= need)
        .min_by(|x, y| {
            x.profile.compute_slices().cmp(&y.profile.compute_slices()).then(x.memory_gib.total_cmp(&y.memory_gib))
        })
        .map(|p| p.profile)
}

/// Runs `sim-agent share`, writing a line or one JSON object to `out`.
pub fn run_cli(args: &ShareArgs, out: &mut dyn std::io::Write) -> Result<(), ShareCliError> {
    let models = tessera_core::config::load_model_dir(&args.models).map_err(|e| ShareCliError::Input(e.to_string()))?;
    let get = |flag: &str, name: &str| {
        models.get(name).ok_or_else(|| {
            let known = models.keys().cloned().collect::<Vec<_>>().join(", ");
            ShareCliError::Input(format!("--{flag}: no model profile {name:?} in {} ({known})", args.models.display()))
        })
    };
    let (inference, training) = (get("model", &args.model)?, get("train-model", &args.train_model)?);
    let profile = match args.profile {
        Some(p) => p,
        None => smallest_shared_profile(args.gpu_model, inference, training).ok_or_else(|| {
            ShareCliError::Input(format!(
                "no profile of {} holds {} inference and {} retraining together",
                args.gpu_model, inference.name, training.name
            ))
        })?,
    };
    let setup = ShareSetup {
        gpu: args.gpu_model,
        profile,
        inference,
        training,
        load: args.load,
        duration_s: args.duration,
        seed: args.seed,
    };
    let params = ShareParams { timeslice_ms: args.timeslice_ms, ..ShareParams::default() };
    let r = simulate(&setup, args.mode, &params).map_err(|e| {
        let ShareError::Invalid { field, reason } = e;
        // The settings with a flag are named by it; the others are the library's parameters.
        match field {
            "load" | "duration" | "profile" | "timeslice_ms" => {
                ShareCliError::Input(format!("--{}: {reason}", field.replace('_', "-")))
            }
            _ => ShareCliError::Input(format!("sharing parameter {field}: {reason}")),
        }
    })?;
    if args.json {
        let v = serde_json::json!({
            "mode": r.mode,
            "model": inference.name,
            "train_model": training.name,
            "gpu_model": args.gpu_model.to_string(),
            "profile": profile.to_string(),
            "load": args.load,
            "seed": args.seed,
            "duration_s": args.duration,
            "requests": r.requests,
            "p50_ms": r.p50_ms,
            "p99_ms": r.p99_ms,
            "alone_p99_ms": r.alone_p99_ms,
            "p99_overhead": r.p99_overhead,
            "train_share": r.train_share,
            "train_throughput": r.train_throughput,
            "inference_busy": r.inference_busy,
            "system_throughput": r.system_throughput,
            "params": params,
        });
        serde_json::to_writer(&mut *out, &v).map_err(std::io::Error::from)?;
        writeln!(out)?;
    } else {
        writeln!(
            out,
            "{} {} + {} on {} {}: p99 {:.3} ms (alone {:.3} ms, overhead {:.1} %), p50 {:.3} ms, training {:.3} of \
             alone ({:.4} work/s), inference busy {:.1} %, system throughput {:.3}",
            r.mode.name(),
            inference.name,
            training.name,
            args.gpu_model,
            profile,
            r.p99_ms,
            r.alone_p99_ms,
            100.0 * r.p99_overhead,
            r.p50_ms,
            r.train_share,
            r.train_throughput,
            100.0 * r.inference_busy,
            r.system_throughput
        )?;
    }
    Ok(())
}
