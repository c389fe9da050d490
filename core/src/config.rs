//! Configuration files: parsed raw, then validated into the types the program uses.
//!
//! Unknown fields are rejected; durations are written as strings (`"50ms"`, `"200s"`); defaults live here and only
//! here; every error names the file and the field (and, for syntax errors, the line and column).
//!
//! | file | type | parser |
//! |---|---|---|
//! | `configs/models/*.toml` | [`ModelProfile`] | [`parse_model_profile`] |
//! | `configs/tenants/*.toml` (`[[tenant]]` tables) | `Vec<`[`TenantSpec`]`>` | [`parse_tenants`] |
//! | `configs/fleets/*.toml` (`[[node]]` tables) | [`FleetSpec`] | [`parse_fleet`] |
//! | `configs/mig-parted/*.yaml` | mig-parted | [`crate::migparted::parse`] |

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::accuracy::{Drift, OptimusCurve};
use crate::catalog::{GpuModel, Profile};
use crate::ids::{GpuId, NodeId, TenantId};
use crate::jobs::{ContainerRuntime, JobAction, JobMetrics, JobRun, JobSpec, ReadyCheck, Signal, TenantJobs};
use crate::model::{INSTANCE_SIZES, LatencyModel, ModelProfile, TrainingSpeed};
use crate::tenant::{DemandSource, RetrainingSpec, TenantPin, TenantSpec};

/// Default percentile of a tenant's latency SLO.
pub const DEFAULT_SLO_PERCENTILE: f64 = 99.0;
/// Default tenant weight.
pub const DEFAULT_WEIGHT: f64 = 1.0;
/// Default retraining window (Ekya and MIGRator use 200 s).
pub const DEFAULT_RETRAINING_WINDOW: &str = "200s";

/// A field that fails validation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct FieldError {
    /// Dotted path of the field (`tenant[1].retraining.floor`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }

    fn within(self, prefix: &str) -> FieldError {
        FieldError { field: format!("{prefix}.{}", self.field), message: self.message }
    }
}

/// A configuration file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line and column, for syntax errors.
    pub position: Option<(usize, usize)>,
    /// Dotted path of the field, when known.
    pub field: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some((line, col)) = self.position {
            write!(f, ":{line}:{col}")?;
        }
        if let Some(field) = &self.field {
            write!(f, ": field `{field}`")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    fn field(file: &Path, e: FieldError) -> ConfigError {
        ConfigError { file: file.to_path_buf(), position: None, field: Some(e.field), message: e.message }
    }

    fn io(file: &Path, e: &std::io::Error) -> ConfigError {
        ConfigError { file: file.to_path_buf(), position: None, field: None, message: format!("cannot read: {e}") }
    }
}

/// Deserialises TOML, mapping errors to the file, position and field path.
pub fn from_toml<'de, T: Deserialize<'de>>(text: &'de str, file: &Path) -> Result<T, ConfigError> {
    let position = |span: Option<std::ops::Range<usize>>| {
        span.map(|s| {
            let before = &text[..s.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            (line, col)
        })
    };
    let de = toml::Deserializer::parse(text).map_err(|e| ConfigError {
        file: file.to_path_buf(),
        position: position(e.span()),
        field: None,
        message: e.message().trim().to_string(),
    })?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        ConfigError {
            file: file.to_path_buf(),
            position: position(inner.span()),
            field: (path != ".").then_some(path),
            message: inner.message().trim().to_string(),
        }
    })
}

/// Reads a configuration file; a failure is a [`ConfigError`] naming the file.
pub fn read_config(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError::io(path, &e))
}

/// Parses a duration written as a string (`"50ms"`, `"2s"`, `"1m 30s"`) into milliseconds.
pub fn parse_duration_ms(field: &str, text: &str) -> Result<u64, FieldError> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| FieldError::new(field, format!("`{text}` is not a duration like \"50ms\" or \"200s\" ({e})")))?;
    if !d.is_zero() && d.as_millis() == 0 {
        return Err(FieldError::new(field, format!("`{text}` is shorter than the 1 ms resolution")));
    }
    u64::try_from(d.as_millis()).map_err(|_| FieldError::new(field, format!("`{text}` is too long")))
}

fn check(field: &str, ok: bool, message: impl FnOnce() -> String) -> Result<(), FieldError> {
    if ok { Ok(()) } else { Err(FieldError::new(field, message())) }
}

fn positive(field: &str, v: f64) -> Result<(), FieldError> {
    check(field, v.is_finite() && v > 0.0, || format!("must be a positive number, got {v}"))
}

fn in_range(field: &str, v: f64, lo: f64, hi: f64, lo_open: bool) -> Result<(), FieldError> {
    let ok = v.is_finite() && (if lo_open { v > lo } else { v >= lo }) && v <= hi;
    check(field, ok, || format!("must be in {}{lo}, {hi}], got {v}", if lo_open { "(" } else { "[" }))
}

fn check_name(field: &str, name: &str) -> Result<(), FieldError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    check(field, ok, || format!("`{name}` must be 1 to 64 characters of a-z, 0-9, `_` and `-`"))
}

// ---------------------------------------------------------------------------------------------------------------
// Model profiles

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    #[serde(default)]
    description: String,
    inference_memory_gib: f64,
    training_memory_gib: f64,
    max_batch: u32,
    latency: RawLatency,
    training: RawTraining,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLatency {
    base_ms: Option<f64>,
    alpha: Option<f64>,
    beta: Option<f64>,
    point: Option<Vec<RawLatencyPoint>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLatencyPoint {
    g: u8,
    batch: u32,
    ms: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTraining {
    speed_exponent: Option<f64>,
    point: Option<Vec<RawSpeedPoint>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpeedPoint {
    g: u8,
    speed: f64,
}

impl RawModel {
    fn validate(self) -> Result<ModelProfile, FieldError> {
        let latency = match (self.latency.base_ms, self.latency.alpha, self.latency.beta, self.latency.point) {
            (Some(base_ms), Some(alpha), Some(beta), None) => LatencyModel::Parametric { base_ms, alpha, beta },
            (None, None, None, Some(points)) => {
                let mut table: BTreeMap<u8, Vec<(u32, f64)>> = BTreeMap::new();
                for (i, p) in points.iter().enumerate() {
                    let at = |f: &str| format!("latency.point[{i}].{f}");
                    check(&at("g"), INSTANCE_SIZES.contains(&p.g), || {
                        format!("{} is not an instance size (1, 2, 3, 4 or 7)", p.g)
                    })?;
                    check(&at("batch"), p.batch >= 1, || "must be at least 1".into())?;
                    positive(&at("ms"), p.ms)?;
                }
                for p in points {
                    table.entry(p.g).or_default().push((p.batch, p.ms));
                }
                for v in table.values_mut() {
                    v.sort_by_key(|(b, _)| *b);
                }
                LatencyModel::Table { points: table }
            }
            _ => {
                return Err(FieldError::new(
                    "latency",
                    "give either all of base_ms, alpha and beta, or a table of [[latency.point]] (g, batch, ms)",
                ));
            }
        };
        let training = match (self.training.speed_exponent, self.training.point) {
            (Some(e), None) => TrainingSpeed::Exponent(e),
            (None, Some(points)) => {
                for (i, p) in points.iter().enumerate() {
                    check(&format!("training.point[{i}].g"), INSTANCE_SIZES.contains(&p.g), || {
                        format!("{} is not an instance size (1, 2, 3, 4 or 7)", p.g)
                    })?;
                }
                TrainingSpeed::Table(points.into_iter().map(|p| (p.g, p.speed)).collect())
            }
            _ => {
                return Err(FieldError::new(
                    "training",
                    "give either speed_exponent or a table of [[training.point]] (g, speed)",
                ));
            }
        };
        let profile = ModelProfile {
            name: self.name,
            description: self.description,
            inference_memory_gib: self.inference_memory_gib,
            training_memory_gib: self.training_memory_gib,
            max_batch: self.max_batch,
            latency,
            training,
        };
        validate_model_profile(&profile)?;
        Ok(profile)
    }
}

/// Checks a model profile's values (used for files and for profiles arriving through the API).
pub fn validate_model_profile(p: &ModelProfile) -> Result<(), FieldError> {
    check_name("name", &p.name)?;
    positive("inference_memory_gib", p.inference_memory_gib)?;
    positive("training_memory_gib", p.training_memory_gib)?;
    check("max_batch", p.max_batch >= 1, || "must be at least 1".into())?;
    match &p.latency {
        LatencyModel::Parametric { base_ms, alpha, beta } => {
            positive("latency.base_ms", *base_ms)?;
            in_range("latency.alpha", *alpha, 0.0, 1.5, true)?;
            in_range("latency.beta", *beta, 0.0, 10.0, false)?;
        }
        LatencyModel::Table { points } => {
            for g in points.keys() {
                check("latency.point.g", INSTANCE_SIZES.contains(g), || {
                    format!("{g} is not an instance size (1, 2, 3, 4 or 7)")
                })?;
            }
            for g in INSTANCE_SIZES {
                let pts = points.get(&g).map_or(&[][..], Vec::as_slice);
                check("latency.point", !pts.is_empty(), || format!("no point for g = {g}"))?;
                for w in pts.windows(2) {
                    check("latency.point.batch", w[0].0 < w[1].0, || format!("g = {g} has batch {} twice", w[0].0))?;
                    check("latency.point.ms", w[0].1 <= w[1].1, || {
                        format!(
                            "g = {g}: latency falls from {} ms at batch {} to {} ms at batch {}",
                            w[0].1, w[0].0, w[1].1, w[1].0
                        )
                    })?;
                }
                for (b, ms) in pts {
                    check("latency.point.batch", *b >= 1, || format!("g = {g}: batch must be at least 1"))?;
                    positive("latency.point.ms", *ms)?;
                }
            }
        }
    }
    if let LatencyModel::Table { points } = &p.latency {
        // A bigger instance is never slower at the same batch.
        for w in INSTANCE_SIZES.windows(2) {
            let (small, big) = (&points[&w[0]], &points[&w[1]]);
            for (b, ms_big) in big {
                if let Some((_, ms_small)) = small.iter().find(|(bs, _)| bs == b) {
                    check("latency.point.ms", ms_small >= ms_big, || {
                        format!("batch {b}: {}g ({ms_big} ms) is slower than {}g ({ms_small} ms)", w[1], w[0])
                    })?;
                }
            }
        }
    }
    match &p.training {
        TrainingSpeed::Exponent(e) => in_range("training.speed_exponent", *e, 0.0, 1.5, true)?,
        TrainingSpeed::Table(t) => {
            for g in INSTANCE_SIZES {
                let s = t.get(&g).ok_or_else(|| FieldError::new("training.point", format!("no point for g = {g}")))?;
                positive("training.point.speed", *s)?;
            }
            check("training.point.speed", (t[&7] - 1.0).abs() < 1e-9, || {
                format!("speeds are relative to a full 7g instance, so g = 7 must be 1, got {}", t[&7])
            })?;
            for g in t.keys() {
                check("training.point.g", INSTANCE_SIZES.contains(g), || {
                    format!("{g} is not an instance size (1, 2, 3, 4 or 7)")
                })?;
            }
        }
    }
    Ok(())
}

/// Parses a model profile; `file` names the source in errors.
pub fn parse_model_profile(text: &str, file: &Path) -> Result<ModelProfile, ConfigError> {
    let raw: RawModel = from_toml(text, file)?;
    raw.validate().map_err(|e| ConfigError::field(file, e))
}

/// Reads and parses a model profile file.
pub fn load_model_profile(path: &Path) -> Result<ModelProfile, ConfigError> {
    parse_model_profile(&read_config(path)?, path)
}

/// Reads every `*.toml` model profile in `dir`, by name. Two files with the same `name` are an error.
pub fn load_model_dir(dir: &Path) -> Result<BTreeMap<String, ModelProfile>, ConfigError> {
    let mut out = BTreeMap::new();
    for path in toml_files(dir)? {
        let m = load_model_profile(&path)?;
        if out.contains_key(&m.name) {
            return Err(ConfigError::field(
                &path,
                FieldError::new("name", format!("`{}` is defined twice in {}", m.name, dir.display())),
            ));
        }
        out.insert(m.name.clone(), m);
    }
    Ok(out)
}

/// The `*.toml` files of a directory, sorted.
pub fn toml_files(dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| ConfigError::io(dir, &e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    v.sort();
    Ok(v)
}

// ---------------------------------------------------------------------------------------------------------------
// Tenants

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenantsFile {
    tenant: Vec<RawTenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTenant {
    id: String,
    name: Option<String>,
    model: String,
    slo: String,
    slo_percentile: Option<f64>,
    weight: Option<f64>,
    demand: RawDemand,
    retraining: Option<RawRetraining>,
    serve: Option<RawJob>,
    retrain: Option<RawJob>,
    pin: Option<RawPin>,
}

/// `[tenant.pin]`: see [`TenantPin`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    #[serde(default)]
    gpus: Vec<String>,
    profile: Option<String>,
}

impl RawPin {
    fn validate(self) -> Result<TenantPin, FieldError> {
        let mut gpus = Vec::with_capacity(self.gpus.len());
        for (i, g) in self.gpus.iter().enumerate() {
            let id = g.parse::<GpuId>().map_err(|e| FieldError::new(format!("pin.gpus[{i}]"), e.to_string()))?;
            gpus.push(id);
        }
        let profile = self
            .profile
            .map(|p| p.parse::<Profile>().map_err(|e| FieldError::new("pin.profile", e.to_string())))
            .transpose()?;
        Ok(TenantPin { gpus, profile })
    }
}

/// `[tenant.serve]` / `[tenant.retrain]`: see `crate::jobs`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    command: Option<Vec<String>>,
    image: Option<String>,
    args: Option<Vec<String>>,
    runtime: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    ready: Option<RawReady>,
    drain: Option<RawAction>,
    stop: Option<RawStop>,
    checkpoint: Option<RawAction>,
    resume_path: Option<String>,
    metrics: Option<RawJobMetrics>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJobMetrics {
    path: Option<String>,
    counter: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReady {
    http: Option<String>,
    tcp: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAction {
    http: Option<String>,
    signal: Option<String>,
    deadline: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStop {
    signal: Option<String>,
    grace: Option<String>,
}

impl RawAction {
    fn action(&self, field: &str) -> Result<Option<JobAction>, FieldError> {
        match (&self.http, &self.signal) {
            (None, None) => Ok(None),
            (Some(path), None) => Ok(Some(JobAction::Http { path: path.clone() })),
            (None, Some(sig)) => Ok(Some(JobAction::Signal {
                signal: sig.parse().map_err(|m: String| FieldError::new(format!("{field}.signal"), m))?,
            })),
            (Some(_), Some(_)) => Err(FieldError::new(field, "give `http` or `signal`, not both")),
        }
    }
}

impl RawJob {
    fn validate(self, field: &str) -> Result<JobSpec, FieldError> {
        let f = |rest: &str| format!("{field}.{rest}");
        let run = match (self.command, self.image) {
            (Some(argv), None) => {
                check(&f("args"), self.args.is_none(), || "only applies to a container `image`".into())?;
                check(&f("runtime"), self.runtime.is_none(), || "only applies to a container `image`".into())?;
                JobRun::Command { argv }
            }
            (None, Some(image)) => JobRun::Container {
                image,
                args: self.args.unwrap_or_default(),
                runtime: match self.runtime {
                    None => ContainerRuntime::Docker,
                    Some(r) => r.parse().map_err(|m: String| FieldError::new(f("runtime"), m))?,
                },
            },
            _ => return Err(FieldError::new(field, "give exactly one of `command` or `image`")),
        };
        let ready = match self.ready {
            None => None,
            Some(RawReady { http: Some(path), tcp: None | Some(false) }) => Some(ReadyCheck::Http { path }),
            Some(RawReady { http: None, tcp: Some(true) }) => Some(ReadyCheck::Tcp),
            Some(RawReady { http: None, tcp: None | Some(false) }) => None,
            Some(_) => return Err(FieldError::new(f("ready"), "give `http = \"/path\"` or `tcp = true`, not both")),
        };
        let drain = match &self.drain {
            Some(d) => d.action(&f("drain"))?,
            None => None,
        };
        let drain_deadline_ms = match self.drain.as_ref().and_then(|d| d.deadline.as_deref()) {
            Some(t) => parse_duration_ms(&f("drain.deadline"), t)?,
            None => crate::jobs::DEFAULT_DRAIN_DEADLINE_MS,
        };
        let checkpoint = match &self.checkpoint {
            Some(c) => {
                check(&f("checkpoint.deadline"), c.deadline.is_none(), || {
                    "a checkpoint waits for the job's stop (`stop.grace`), not a deadline of its own".into()
                })?;
                c.action(&f("checkpoint"))?
            }
            None => None,
        };
        let (stop_signal, grace_ms) = match self.stop {
            None => (Signal::Term, crate::jobs::DEFAULT_GRACE_MS),
            Some(s) => (
                match s.signal {
                    Some(sig) => sig.parse().map_err(|m: String| FieldError::new(f("stop.signal"), m))?,
                    None => Signal::Term,
                },
                match s.grace {
                    Some(g) => parse_duration_ms(&f("stop.grace"), &g)?,
                    None => crate::jobs::DEFAULT_GRACE_MS,
                },
            ),
        };
        Ok(JobSpec {
            run,
            env: self.env,
            ready,
            drain,
            drain_deadline_ms,
            stop_signal,
            grace_ms,
            checkpoint,
            resume_path: self.resume_path,
            metrics: self.metrics.map(|m| JobMetrics {
                path: m.path.unwrap_or_else(|| "/metrics".into()),
                counter: m.counter,
                labels: m.labels,
            }),
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDemand {
    poisson_rps: Option<f64>,
    trace: Option<String>,
    scale: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetraining {
    window: Option<String>,
    work_gpu_s: f64,
    epochs: f64,
    initial_accuracy: f64,
    curve: RawCurve,
    drift_per_window: f64,
    floor: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCurve {
    b0: f64,
    b1: f64,
    b2: f64,
}

impl RawTenant {
    fn validate(self) -> Result<TenantSpec, FieldError> {
        let id = TenantId::new(&self.id).map_err(|e| FieldError::new("id", e.to_string()))?;
        let demand = match (self.demand.poisson_rps, self.demand.trace) {
            (Some(rate_rps), None) => {
                check("demand.scale", self.demand.scale.is_none(), || "only applies to `trace` demand".into())?;
                DemandSource::Poisson { rate_rps }
            }
            (None, Some(selector)) => DemandSource::Trace { selector, scale: self.demand.scale.unwrap_or(1.0) },
            _ => return Err(FieldError::new("demand", "give exactly one of `poisson_rps` or `trace`")),
        };
        let retraining = match self.retraining {
            None => None,
            Some(r) => Some(RetrainingSpec {
                window_ms: parse_duration_ms(
                    "retraining.window",
                    r.window.as_deref().unwrap_or(DEFAULT_RETRAINING_WINDOW),
                )?,
                work_gpu_s: r.work_gpu_s,
                epochs: r.epochs,
                curve: OptimusCurve { b0: r.curve.b0, b1: r.curve.b1, b2: r.curve.b2 },
                initial_accuracy: r.initial_accuracy,
                drift: Drift { per_window: r.drift_per_window, floor: r.floor },
            }),
        };
        let jobs = TenantJobs {
            serve: self.serve.map(|j| j.validate("serve")).transpose()?,
            retrain: self.retrain.map(|j| j.validate("retrain")).transpose()?,
        };
        let pin = self.pin.map(RawPin::validate).transpose()?.unwrap_or_default();
        let spec = TenantSpec {
            jobs,
            pin,
            name: self.name.unwrap_or_else(|| self.id.clone()),
            id,
            model: self.model,
            slo_ms: parse_duration_ms("slo", &self.slo)? as f64,
            slo_percentile: self.slo_percentile.unwrap_or(DEFAULT_SLO_PERCENTILE),
            weight: self.weight.unwrap_or(DEFAULT_WEIGHT),
            demand,
            retraining,
        };
        validate_tenant(&spec)?;
        Ok(spec)
    }
}

/// Checks a tenant's values (used for files and for tenants arriving through the API). Whether its model exists
/// is the fleet state's check.
pub fn validate_tenant(t: &TenantSpec) -> Result<(), FieldError> {
    check("name", t.name.len() <= MAX_TENANT_NAME_BYTES && !t.name.chars().any(char::is_control), || {
        format!("must be at most {MAX_TENANT_NAME_BYTES} bytes without control characters, got {} bytes", t.name.len())
    })?;
    check_name("model", &t.model)?;
    positive("slo", t.slo_ms)?;
    in_range("slo_percentile", t.slo_percentile, 0.0, 100.0, true)?;
    positive("weight", t.weight)?;
    match &t.demand {
        DemandSource::Poisson { rate_rps } => {
            check("demand.poisson_rps", rate_rps.is_finite() && *rate_rps >= 0.0, || {
                format!("must be a non-negative rate, got {rate_rps}")
            })?;
        }
        DemandSource::Trace { selector, scale } => {
            validate_trace_selector(selector).map_err(|m| FieldError::new("demand.trace", m.to_string()))?;
            positive("demand.scale", *scale)?;
        }
    }
    if let Some(r) = &t.retraining {
        check("retraining.window", r.window_ms > 0, || "must be longer than zero".into())?;
        positive("retraining.work_gpu_s", r.work_gpu_s)?;
        positive("retraining.epochs", r.epochs)?;
        positive("retraining.curve.b0", r.curve.b0)?;
        positive("retraining.curve.b1", r.curve.b1)?;
        in_range("retraining.curve.b2", r.curve.b2, 0.0, 1.0, false)?;
        let after = r.accuracy_after(r.epochs);
        check("retraining.curve", after > 0.0, || {
            format!("gives accuracy {after:.3} after {} epochs; it must be above 0", r.epochs)
        })?;
        in_range("retraining.drift_per_window", r.drift.per_window, 0.0, 1.0, false)?;
        in_range("retraining.floor", r.drift.floor, 0.0, 1.0, false)?;
        in_range("retraining.initial_accuracy", r.initial_accuracy, 0.0, 1.0, true)?;
        check("retraining.initial_accuracy", r.initial_accuracy >= r.drift.floor, || {
            format!("{} is below the floor {}", r.initial_accuracy, r.drift.floor)
        })?;
    }
    t.jobs.validate().map_err(|e| FieldError::new(e.field, e.message))?;
    validate_pin(&t.pin)
}

/// Checks a tenant's pin: at most [`TenantPin::MAX_GPUS`] GPUs, none twice, and a profile the planner places
/// (`1g+me` is not one: level 2 plans the classic profiles and `1g.2x`).
fn validate_pin(pin: &TenantPin) -> Result<(), FieldError> {
    check("pin.gpus", pin.gpus.len() <= TenantPin::MAX_GPUS, || {
        format!("names {} GPUs; at most {} may be given", pin.gpus.len(), TenantPin::MAX_GPUS)
    })?;
    let mut seen = BTreeSet::new();
    for g in &pin.gpus {
        check("pin.gpus", seen.insert(g), || format!("names {g} twice"))?;
    }
    if let Some(p) = pin.profile {
        check("pin.profile", p != Profile::G1Me, || {
            "1g+me is not planned (level 2 places 1g, 1g.2x, 2g, 3g, 4g and 7g instances)".into()
        })?;
    }
    Ok(())
}

/// Longest tenant display name accepted, bytes.
pub const MAX_TENANT_NAME_BYTES: usize = 256;
/// Longest trace selector accepted, bytes.
pub const MAX_TRACE_SELECTOR_BYTES: usize = 128;

/// Checks a trace selector: `rank:N` with N >= 1 (the N-th most popular stream), or a stream key (an application or
/// function hash: 1 to [`MAX_TRACE_SELECTOR_BYTES`] characters of `A-Z a-z 0-9 _ - .`, not `.` or `..`). A selector
/// names a stream inside a trace, never a file, so path separators are refused.
pub fn validate_trace_selector(selector: &str) -> Result<(), BadSelector> {
    if selector.is_empty() || selector.len() > MAX_TRACE_SELECTOR_BYTES {
        return Err(BadSelector::Length(selector.len()));
    }
    if let Some(n) = selector.strip_prefix("rank:") {
        return match n.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(()),
            _ => Err(BadSelector::Rank(selector.to_string())),
        };
    }
    let ok = selector != "."
        && selector != ".."
        && selector.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.');
    if ok { Ok(()) } else { Err(BadSelector::Key(selector.to_string())) }
}

/// A trace selector that names no stream ([`validate_trace_selector`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadSelector {
    /// Empty or longer than [`MAX_TRACE_SELECTOR_BYTES`].
    #[error("must be 1 to {MAX_TRACE_SELECTOR_BYTES} bytes (\"rank:N\" or a stream key), got {0} bytes")]
    Length(usize),
    /// `rank:` without a rank of at least 1.
    #[error("{0:?}: expected \"rank:N\" with N >= 1 (the N-th most popular stream)")]
    Rank(String),
    /// Neither a rank nor a stream key.
    #[error(
        "{0:?} is neither \"rank:N\" nor a stream key (letters, digits, `_`, `-`, `.`; a selector names a stream in \
         the trace, not a file)"
    )]
    Key(String),
}

/// Parses a tenants file (`[[tenant]]` tables). Ids must be unique.
pub fn parse_tenants(text: &str, file: &Path) -> Result<Vec<TenantSpec>, ConfigError> {
    let raw: RawTenantsFile = from_toml(text, file)?;
    let mut seen = BTreeSet::new();
    raw.tenant
        .into_iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("tenant[{i}]");
            let spec = t.validate().map_err(|e| ConfigError::field(file, e.within(&at)))?;
            if !seen.insert(spec.id.clone()) {
                return Err(ConfigError::field(
                    file,
                    FieldError::new(format!("{at}.id"), format!("`{}` is used twice", spec.id)),
                ));
            }
            Ok(spec)
        })
        .collect()
}

/// Reads and parses a tenants file.
pub fn load_tenants(path: &Path) -> Result<Vec<TenantSpec>, ConfigError> {
    parse_tenants(&read_config(path)?, path)
}

// ---------------------------------------------------------------------------------------------------------------
// Fleets

/// A fleet description: nodes and their GPUs.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetSpec {
    /// Name.
    pub name: String,
    /// What it is.
    pub description: String,
    /// Nodes in id order.
    pub nodes: Vec<NodeSpec>,
}

impl FleetSpec {
    /// Total GPUs.
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().map(|n| n.gpus.len()).sum()
    }
}

/// One node of a fleet.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeSpec {
    /// Id.
    pub id: NodeId,
    /// Agent address, if fixed.
    pub address: Option<String>,
    /// GPU models by device index.
    pub gpus: Vec<GpuModel>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleet {
    name: String,
    #[serde(default)]
    description: String,
    node: Vec<RawNodeGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeGroup {
    id: String,
    count: Option<u32>,
    address: Option<String>,
    gpus: Vec<RawGpuGroup>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGpuGroup {
    model: String,
    count: u32,
}

impl RawFleet {
    fn validate(self) -> Result<FleetSpec, FieldError> {
        check("name", !self.name.trim().is_empty(), || "must not be empty".into())?;
        check("node", !self.node.is_empty(), || "a fleet needs at least one [[node]]".into())?;
        let mut nodes = Vec::new();
        let mut seen = BTreeSet::new();
        let mut fleet_gpus = 0usize;
        for (i, g) in self.node.into_iter().enumerate() {
            let at = format!("node[{i}]");
            let count = g.count.unwrap_or(1);
            check(&format!("{at}.count"), count >= 1, || "must be at least 1".into())?;
            check(&format!("{at}.address"), g.address.is_none() || count == 1, || {
                "a fixed address only fits a single node (count = 1)".into()
            })?;
            check(&format!("{at}.gpus"), !g.gpus.is_empty(), || "a node needs at least one GPU".into())?;
            let mut gpus = Vec::new();
            for (j, gg) in g.gpus.iter().enumerate() {
                let model: GpuModel = gg.model.parse().map_err(|e: crate::catalog::UnknownGpuModel| {
                    FieldError::new(format!("{at}.gpus[{j}].model"), e.to_string())
                })?;
                check(&format!("{at}.gpus[{j}].count"), gg.count >= 1, || "must be at least 1".into())?;
                check(&format!("{at}.gpus[{j}].count"), gpus.len() + gg.count as usize <= MAX_GPUS_PER_NODE, || {
                    format!("a node has at most {MAX_GPUS_PER_NODE} GPUs")
                })?;
                gpus.extend(std::iter::repeat_n(model, gg.count as usize));
            }
            fleet_gpus += count as usize * gpus.len();
            check(&format!("{at}.count"), fleet_gpus <= MAX_FLEET_GPUS, || {
                format!("a fleet has at most {MAX_FLEET_GPUS} GPUs, and this group brings it to {fleet_gpus}")
            })?;
            for k in 1..=count {
                let id = if count == 1 && g.count.is_none() { g.id.clone() } else { format!("{}-{k}", g.id) };
                let id = NodeId::new(&id).map_err(|e| FieldError::new(format!("{at}.id"), e.to_string()))?;
                check(&format!("{at}.id"), seen.insert(id.clone()), || format!("node `{id}` is defined twice"))?;
                nodes.push(NodeSpec { id, address: g.address.clone(), gpus: gpus.clone() });
            }
        }
        Ok(FleetSpec { name: self.name, description: self.description, nodes })
    }
}

/// Most GPUs on one node of a fleet file (as many as a node may register with the coordinator).
pub const MAX_GPUS_PER_NODE: usize = 64;
/// Most GPUs in a fleet file.
pub const MAX_FLEET_GPUS: usize = 100_000;

/// Parses a fleet file. A `[[node]]` with `count = N` stands for N nodes named `<id>-1` .. `<id>-N`; a node has at
/// most [`MAX_GPUS_PER_NODE`] GPUs and the fleet at most [`MAX_FLEET_GPUS`].
pub fn parse_fleet(text: &str, file: &Path) -> Result<FleetSpec, ConfigError> {
    let raw: RawFleet = from_toml(text, file)?;
    raw.validate().map_err(|e| ConfigError::field(file, e))
}

/// Reads and parses a fleet file.
pub fn load_fleet(path: &Path) -> Result<FleetSpec, ConfigError> {
    parse_fleet(&read_config(path)?, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MODEL: &str = r#"
name = "resnet50"
inference_memory_gib = 1.5
training_memory_gib = 9.0
max_batch = 32
[latency]
base_ms = 1.2
alpha = 0.9
beta = 0.08
[training]
speed_exponent = 0.9
"#;

    fn f() -> &'static Path {
        Path::new("configs/models/resnet50.toml")
    }

    #[test]
    fn model_profile_parses() {
        let m = parse_model_profile(MODEL, f()).unwrap();
        assert_eq!(m.name, "resnet50");
        assert_eq!(m.latency, LatencyModel::Parametric { base_ms: 1.2, alpha: 0.9, beta: 0.08 });
    }

    #[test]
    fn unknown_fields_are_rejected_with_file_position_and_field() {
        let text = MODEL.replace("beta = 0.08", "beta = 0.08\ngamma = 1");
        let e = parse_model_profile(&text, f()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("latency.gamma"));
        assert!(e.message.contains("unknown field `gamma`"), "{e}");
        assert_eq!(e.position.map(|p| p.0), Some(10), "{e}");
        assert!(
            e.to_string()
                .starts_with("configs/models/resnet50.toml:10:1: field `latency.gamma`: unknown field `gamma`"),
            "{e}"
        );
    }

    #[test]
    fn wrong_types_and_values_name_the_field() {
        let e = parse_model_profile(&MODEL.replace("alpha = 0.9", "alpha = \"high\""), f()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("latency.alpha"), "{e}");
        let e = parse_model_profile(&MODEL.replace("alpha = 0.9", "alpha = 3.0"), f()).unwrap_err();
        assert_eq!(e.to_string(), "configs/models/resnet50.toml: field `latency.alpha`: must be in (0, 1.5], got 3");
        let e = parse_model_profile(&MODEL.replace("beta = 0.08\n", ""), f()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("latency"), "{e}");
        let e = parse_model_profile("name = [", f()).unwrap_err();
        assert!(e.position.is_some(), "{e}");
    }

    #[test]
    fn latency_tables_must_cover_every_instance_size() {
        let mut text = MODEL.replace("base_ms = 1.2\nalpha = 0.9\nbeta = 0.08\n", "");
        for g in [1, 2, 3, 4] {
            text.push_str(&format!("[[latency.point]]\ng = {g}\nbatch = 1\nms = {}\n", 10 / g));
        }
        let e = parse_model_profile(&text, f()).unwrap_err();
        assert_eq!(e.to_string(), "configs/models/resnet50.toml: field `latency.point`: no point for g = 7");
        text.push_str("[[latency.point]]\ng = 7\nbatch = 1\nms = 1.0\n");
        assert!(parse_model_profile(&text, f()).is_ok());
        let bad_g = text.replace("g = 4\n", "g = 5\n");
        let e = parse_model_profile(&bad_g, f()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "configs/models/resnet50.toml: field `latency.point[3].g`: 5 is not an instance size (1, 2, 3, 4 or 7)"
        );
        let slower_7g = text.replace("g = 7\nbatch = 1\nms = 1.0", "g = 7\nbatch = 1\nms = 4.0");
        let e = parse_model_profile(&slower_7g, f()).unwrap_err();
        assert!(e.message.contains("batch 1: 7g (4 ms) is slower than 4g (2 ms)"), "{e}");
        text.push_str("[[latency.point]]\ng = 7\nbatch = 8\nms = 0.5\n");
        let e = parse_model_profile(&text, f()).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("latency.point.ms"), "{e}");
        assert!(e.message.contains("latency falls from 1 ms at batch 1 to 0.5 ms at batch 8"), "{e}");
    }

    const TENANTS: &str = r#"
[[tenant]]
id = "cam-1"
model = "resnet50"
slo = "50ms"
demand = { poisson_rps = 200.0 }
[tenant.retraining]
window = "200s"
work_gpu_s = 60.0
epochs = 5
initial_accuracy = 0.7
curve = { b0 = 0.8, b1 = 2.0, b2 = 0.05 }
drift_per_window = 0.02
floor = 0.5

[[tenant]]
id = "chat"
model = "llama"
slo = "2s"
weight = 2
demand = { trace = "rank:1", scale = 0.5 }
"#;

    #[test]
    fn tenants_parse_with_defaults() {
        let t = parse_tenants(TENANTS, Path::new("t.toml")).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!((t[0].slo_ms, t[0].slo_percentile, t[0].weight), (50.0, 99.0, 1.0));
        assert_eq!(t[0].retraining.as_ref().map(|r| r.window_ms), Some(200_000));
        assert_eq!(t[1].demand, DemandSource::Trace { selector: "rank:1".into(), scale: 0.5 });
        assert_eq!(t[1].name, "chat");
        assert_eq!(t[1].initial_accuracy(), 1.0);
    }

    #[test]
    fn tenant_errors_name_the_tenant_and_field() {
        let e = parse_tenants(&TENANTS.replace("floor = 0.5", "floor = 0.9"), Path::new("t.toml")).unwrap_err();
        assert_eq!(e.to_string(), "t.toml: field `tenant[0].retraining.initial_accuracy`: 0.7 is below the floor 0.9");
        let e = parse_tenants(&TENANTS.replace("slo = \"2s\"", "slo = \"soon\""), Path::new("t.toml")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tenant[1].slo"), "{e}");
        let e = parse_tenants(&TENANTS.replace("slo = \"2s\"", "slo = \"500us\""), Path::new("t.toml")).unwrap_err();
        assert_eq!(e.message, "`500us` is shorter than the 1 ms resolution");
        let e = parse_tenants(&TENANTS.replace("\"chat\"", "\"chat room\""), Path::new("t.toml")).unwrap_err();
        assert!(e.message.contains("`chat room`"), "{e}");
        let e = parse_tenants(&TENANTS.replace("\"chat\"", "\"cam-1\""), Path::new("t.toml")).unwrap_err();
        assert_eq!(e.to_string(), "t.toml: field `tenant[1].id`: `cam-1` is used twice");
        let e = parse_tenants(&TENANTS.replace("{ poisson_rps = 200.0 }", "{ }"), Path::new("t.toml")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tenant[0].demand"), "{e}");
        let e = parse_tenants(&TENANTS.replace("slo = \"50ms\"", "slo = \"50ms\"\nsla = 1"), Path::new("t.toml"))
            .unwrap_err();
        assert!(e.message.contains("unknown field `sla`"), "{e}");
        assert_eq!(e.position.map(|p| p.0), Some(6), "{e}");
        let e = parse_tenants(&TENANTS.replace("\"rank:1\"", "\"rank:0\""), Path::new("t.toml")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tenant[1].demand.trace"), "{e}");
        assert!(e.message.contains("N >= 1"), "{e}");
    }

    #[test]
    fn jobs_parse_and_their_errors_name_the_tenant_and_field() {
        let jobs = r#"
[tenant.serve]
command = ["server", "--port", "{port}", "--device", "{mig_uuid}"]
ready = { http = "/ready" }
drain = { http = "/drain", deadline = "20s" }
stop = { signal = "SIGINT", grace = "3s" }
metrics = { counter = "nv_inference_request_success", labels = { model = "resnet50" } }
[tenant.retrain]
image = "registry.example/train:1"
args = ["--resume", "{checkpoint}"]
runtime = "podman"
checkpoint = { signal = "USR1" }
resume_path = "/ckpt/{tenant}.pt"
"#;
        let text = TENANTS.replace("floor = 0.5\n", &format!("floor = 0.5\n{jobs}"));
        // The jobs tables land on the first tenant, after its retraining table.
        let t = parse_tenants(&text, Path::new("t.toml")).unwrap();
        let serve = t[0].jobs.serve.as_ref().unwrap();
        assert_eq!(serve.ready, Some(ReadyCheck::Http { path: "/ready".into() }));
        assert_eq!((serve.drain_deadline_ms, serve.stop_signal, serve.grace_ms), (20_000, Signal::Int, 3_000));
        assert_eq!(serve.metrics.as_ref().map(|m| (m.path.as_str(), m.labels.len())), Some(("/metrics", 1)));
        let retrain = t[0].jobs.retrain.as_ref().unwrap();
        assert!(matches!(&retrain.run, JobRun::Container { runtime: ContainerRuntime::Podman, .. }));
        assert_eq!(retrain.checkpoint, Some(JobAction::Signal { signal: Signal::Usr1 }));
        assert!(t[1].jobs.is_empty());
        let bad = |from: &str, to: &str| parse_tenants(&text.replacen(from, to, 1), Path::new("t.toml")).unwrap_err();
        let e = bad("{mig_uuid}", "{mig}");
        assert_eq!(e.field.as_deref(), Some("tenant[0].serve.argv[4]"), "{e}");
        assert!(e.message.contains("unknown template variable `{mig}`"), "{e}");
        let e = bad("SIGINT", "SIGSTOP");
        assert_eq!(e.field.as_deref(), Some("tenant[0].serve.stop.signal"), "{e}");
        let e = bad("grace = \"3s\"", "grace = \"2h\"");
        assert_eq!(e.field.as_deref(), Some("tenant[0].serve.stop.grace"), "{e}");
        let e = bad("ready = { http = \"/ready\" }", "ready = { http = \"ready\" }");
        assert_eq!(e.field.as_deref(), Some("tenant[0].serve.ready.http"), "{e}");
        let e = bad("runtime = \"podman\"", "runtime = \"lxc\"");
        assert_eq!(e.field.as_deref(), Some("tenant[0].retrain.runtime"), "{e}");
        let e = bad("image = \"registry.example/train:1\"", "command = [\"t\"]\nimage = \"i\"");
        assert_eq!(e.field.as_deref(), Some("tenant[0].retrain"), "{e}");
        let e = bad("[tenant.serve]", "[tenant.serve]\nenv = { CUDA_VISIBLE_DEVICES = \"0\" }");
        assert_eq!(e.field.as_deref(), Some("tenant[0].serve.env.CUDA_VISIBLE_DEVICES"), "{e}");
        let e = bad("[tenant.serve]", "[tenant.serve]\nchecpoint = 1");
        assert!(e.message.contains("unknown field `checpoint`"), "{e}");
    }

    #[test]
    fn pins_parse_and_their_errors_name_the_field() {
        let with = |pin: &str| TENANTS.replace("floor = 0.5\n", &format!("floor = 0.5\n[tenant.pin]\n{pin}\n"));
        let t =
            parse_tenants(&with("gpus = [\"node-1/0\", \"node-2/3\"]\nprofile = \"3g\""), Path::new("t.toml")).unwrap();
        assert_eq!(t[0].pin.gpus.len(), 2);
        assert_eq!(t[0].pin.profile, Some(crate::Profile::G3));
        assert_eq!(t[0].pin.to_string(), "node-1/0,node-2/3 as 3g");
        assert!(t[1].pin.is_empty());
        let bad = |pin: &str| parse_tenants(&with(pin), Path::new("t.toml")).unwrap_err();
        let e = bad("gpus = [\"node-1/0\", \"node-1\"]");
        assert_eq!(e.field.as_deref(), Some("tenant[0].pin.gpus[1]"), "{e}");
        let e = bad("gpus = [\"node-1/0\", \"node-1/0\"]");
        assert_eq!(e.field.as_deref(), Some("tenant[0].pin.gpus"), "{e}");
        assert!(e.message.contains("twice"), "{e}");
        let e = bad("profile = \"5g\"");
        assert_eq!(e.field.as_deref(), Some("tenant[0].pin.profile"), "{e}");
        let e = bad("profile = \"1g+me\"");
        assert_eq!(e.field.as_deref(), Some("tenant[0].pin.profile"), "{e}");
        let e = bad("gpu = [\"node-1/0\"]");
        assert!(e.message.contains("unknown field `gpu`"), "{e}");
    }

    #[test]
    fn trace_selectors_name_a_stream_never_a_file_and_names_are_bounded() {
        for ok in ["rank:1", "rank:40", "9c4f1e.fn-2_a"] {
            validate_trace_selector(ok).unwrap();
        }
        for bad in ["", "rank:0", "rank:-1", "rank:x", "../../etc/passwd", "/etc/passwd", "..", "a b", "a\u{0}"] {
            let e = validate_trace_selector(bad).unwrap_err().to_string();
            assert!(e.contains("rank:N") || e.contains("bytes"), "{bad:?}: {e}");
        }
        let long = "a".repeat(MAX_TRACE_SELECTOR_BYTES + 1);
        assert_eq!(validate_trace_selector(&long), Err(BadSelector::Length(MAX_TRACE_SELECTOR_BYTES + 1)));
        let long = format!("name = \"{}\"", "x".repeat(MAX_TENANT_NAME_BYTES + 1));
        let text = TENANTS.replacen("[[tenant]]", &format!("[[tenant]]\n{long}"), 1);
        let e = parse_tenants(&text, Path::new("t.toml")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("tenant[0].name"), "{e}");
    }

    #[test]
    fn fleets_expand_node_groups() {
        let text = r#"
name = "lab"
[[node]]
id = "big"
address = "127.0.0.1:7001"
gpus = [{ model = "H100-80GB", count = 2 }, { model = "a100-40gb", count = 1 }]
[[node]]
id = "rack"
count = 3
gpus = [{ model = "NVIDIA A100-SXM4-40GB", count = 8 }]
"#;
        let fleet = parse_fleet(text, Path::new("f.toml")).unwrap();
        let ids: Vec<&str> = fleet.nodes.iter().map(|n| n.id.as_str()).collect();
        assert_eq!(ids, ["big", "rack-1", "rack-2", "rack-3"]);
        assert_eq!(fleet.nodes[0].gpus, vec![GpuModel::H100_80GB, GpuModel::H100_80GB, GpuModel::A100_40GB]);
        assert_eq!(fleet.gpu_count(), 27);
        // Sizes are bounded before anything is built.
        let huge = |node_count: u64, gpus: u64| {
            format!(
                "name = \"x\"\n[[node]]\nid = \"n\"\ncount = {node_count}\ngpus = [{{ model = \"H100-80GB\", count = {gpus} }}]\n"
            )
        };
        let e = parse_fleet(&huge(1, 4_000_000_000), Path::new("f.toml")).unwrap_err().to_string();
        assert!(e.contains("node[0].gpus[0].count") && e.contains("at most 64 GPUs"), "{e}");
        let e = parse_fleet(&huge(4_000_000_000, 8), Path::new("f.toml")).unwrap_err().to_string();
        assert!(e.contains("node[0].count") && e.contains("at most 100000 GPUs"), "{e}");
        assert_eq!(parse_fleet(&huge(12_500, 8), Path::new("f.toml")).unwrap().gpu_count(), 100_000);
        let e = parse_fleet(&text.replace("a100-40gb", "V100"), Path::new("f.toml")).unwrap_err();
        assert!(e.to_string().starts_with("f.toml: field `node[0].gpus[1].model`: unknown GPU model `V100`"), "{e}");
    }
}
