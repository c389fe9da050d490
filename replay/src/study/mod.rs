//! `replay study FILE...`: scenarios x policies x seeds from a study file, with means and 95 % confidence intervals.
//!
//! A study file (TOML) names its seeds, its policies, the options every scenario shares and its scenarios; each
//! scenario is a set of `replay` options (the flags without `--`: `trace`, `gpus`, `load`, `duration`,
//! `executor`, ...) and the set it belongs to (`tuning` or `evaluation`, see `docs/evaluation.md`). Every
//! (scenario, seed) runs every policy through the same simulator with the same arrivals, as `replay` does, and
//! divides each goodput by the run's upper bound. Writes, per study, `results.md`, `runs.csv` (one row per scenario,
//! seed and policy), `summary.csv` (mean and interval per scenario and policy) and `goodput_over_bound.svg`.
//!
//! A study can also run as N independent jobs (a Slurm array, Kubernetes Jobs, GNU parallel over ssh): `replay study
//! FILE --shard K/N` runs every N-th (scenario, seed) starting at the K-th and writes `part-K-of-N.json` instead of
//! the results; `replay study merge FILE` reads the N parts, checks that they were made from the same study and cover
//! every (scenario, seed) once, and writes the results as one run would, with the same numbers (each (scenario, seed)
//! is deterministic; only planning times differ between machines).
//!
//! Intervals are Student-t 95 % intervals over seeds. Ratios between policies are paired: the ratio is taken per
//! seed, on the same arrivals, then averaged. A set's figure is, per seed, the mean over its scenarios (the geometric
//! mean for ratios, so that one scenario with a large ratio does not stand for the set); the interval is over seeds.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::report::figures::{self, Pen};
use crate::run::ReplayError;
use crate::run::RunArgs;
use crate::run::compare::compare;

pub mod capacity;

/// Arguments of `replay study`.
#[derive(Debug, Clone, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct StudyArgs {
    /// `merge`: combine the parts of a sharded study.
    #[command(subcommand)]
    pub command: Option<StudyCommand>,
    /// Files, output and seeds.
    #[command(flatten)]
    pub options: StudyOptions,
    /// Run only shard K of N (1 <= K <= N): every N-th (scenario, seed) from the K-th, over all FILEs in order.
    /// Writes DIR/<study name>/part-K-of-N.json instead of the results; `replay study merge` combines the parts.
    #[arg(long, value_name = "K/N", value_parser = parse_shard)]
    pub shard: Option<Shard>,
}

/// What `replay study` and `replay study merge` share.
#[derive(Debug, Clone, Args)]
pub struct StudyOptions {
    /// Study files (TOML; `configs/studies/*.toml`).
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Write each study's results into DIR/<study name>/.
    #[arg(long, default_value = "study-out", value_name = "DIR")]
    pub out: PathBuf,
    /// Also write every study's tables into one Markdown file (how `docs/results.md` is made).
    #[arg(long, value_name = "FILE")]
    pub markdown: Option<PathBuf>,
    /// Run only the first N seeds of each study (a quick look; the intervals widen). A sharded study's merge must
    /// be given the same N as its shards.
    #[arg(long, value_name = "N")]
    pub seeds: Option<usize>,
}

/// Subcommands of `replay study`.
#[derive(Debug, Clone, Subcommand)]
pub enum StudyCommand {
    /// Combine the parts written by `replay study FILE... --shard K/N` (K = 1..N) and write the results as one
    /// run of FILE... would.
    Merge(MergeArgs),
}

/// Arguments of `replay study merge`.
#[derive(Debug, Clone, Args)]
pub struct MergeArgs {
    /// Files, output and seeds, as the shards were given them.
    #[command(flatten)]
    pub options: StudyOptions,
    /// Part files, or folders to read every `part-*.json` of (default: DIR/<study name>/ of `--out`).
    #[arg(long, value_name = "PATH", num_args = 1..)]
    pub parts: Vec<PathBuf>,
}

/// One shard of a study: the `k`-th of `n`, counted from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// Which one, 1..=n.
    pub k: usize,
    /// How many.
    pub n: usize,
}

impl Shard {
    /// Whether the job at `index` (counted from 0 over all of a run's studies) is this shard's.
    pub fn owns(&self, index: usize) -> bool {
        index % self.n == self.k - 1
    }

    fn file_name(&self) -> String {
        format!("part-{}-of-{}.json", self.k, self.n)
    }
}

fn parse_shard(s: &str) -> Result<Shard, String> {
    let bad = || format!("{s:?}: expected K/N with 1 <= K <= N (for example 2/8)");
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n) = (k.trim().parse::<usize>().map_err(|_| bad())?, n.trim().parse::<usize>().map_err(|_| bad())?);
    if k == 0 || n == 0 || k > n {
        return Err(bad());
    }
    Ok(Shard { k, n })
}

/// A study file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StudyFile {
    /// Its name (the output folder).
    pub name: String,
    /// What it asks, in a paragraph.
    #[serde(default)]
    pub description: String,
    /// Seeds (at least 2 for an interval; 5 or more to report).
    pub seeds: Vec<u64>,
    /// Policies, as `--policy` takes them.
    pub policies: Vec<String>,
    /// The policy every other is compared with (ratios `baseline / other`); default `tessera`.
    #[serde(default = "default_baseline")]
    pub baseline: String,
    /// Options every scenario shares (a scenario's own win).
    #[serde(default)]
    pub options: toml::Table,
    /// Goals the results are checked against.
    #[serde(default)]
    pub goals: Goals,
    /// The scenarios.
    pub scenario: Vec<toml::Table>,
    /// Scenarios compared with one another: each policy's goodput on one over its goodput on another, per seed.
    #[serde(default)]
    pub compare: Vec<Compare>,
}

/// A comparison of two scenarios that differ in one thing (a TLB design, a planner feature): per policy and seed,
/// goodput on `scenario` over goodput on `against` (the same seed draws the same tenants and arrivals where the
/// two scenarios share the trace and fleet), then the mean and interval over seeds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Compare {
    /// What the ratio measures (a column of the table, e.g. "STAR").
    pub name: String,
    /// The scenario whose goodput is the numerator.
    pub scenario: String,
    /// The scenario whose goodput is the denominator.
    pub against: String,
}

fn default_baseline() -> String {
    "tessera".into()
}

/// Goals: where the baseline must reach.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Goals {
    /// Baseline goodput over the upper bound, at least.
    pub over_bound: Option<f64>,
    /// Baseline goodput over each named policy's, at least.
    #[serde(default)]
    pub ratio: BTreeMap<String, f64>,
}

/// One policy's figures on one (scenario, seed).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Row {
    scenario: usize,
    seed: u64,
    policy: String,
    #[serde(with = "finite_or_null")]
    goodput: f64,
    #[serde(with = "finite_or_null")]
    bound: f64,
    #[serde(with = "finite_or_null")]
    slo_attainment: f64,
    #[serde(with = "finite_or_null")]
    mean_accuracy: f64,
    /// Goodput lost to requests not served within SLO, over the bound ([`GoodputSplit`](crate::report::GoodputSplit)).
    #[serde(with = "finite_or_null", default = "nan")]
    not_within_slo: f64,
    /// Goodput lost to accuracy below the best reachable, over the bound ([`GoodputSplit`](crate::report::GoodputSplit)).
    #[serde(with = "finite_or_null", default = "nan")]
    below_best_accuracy: f64,
    reconfigurations: u64,
    #[serde(with = "finite_or_null")]
    plan_ms: f64,
}

fn nan() -> f64 {
    f64::NAN
}

/// An `f64` in JSON, which has no NaN: a non-finite value is written as `null` and read back as NaN.
mod finite_or_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        if x.is_finite() { s.serialize_f64(*x) } else { s.serialize_none() }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
    }
}

/// A mean and the half-width of its 95 % interval (NaN with fewer than two samples).
#[derive(Debug, Clone, Copy)]
struct Estimate {
    mean: f64,
    half: f64,
    n: usize,
}

impl Estimate {
    fn of(xs: &[f64]) -> Estimate {
        let n = xs.len();
        if n == 0 {
            return Estimate { mean: f64::NAN, half: f64::NAN, n };
        }
        let mean = xs.iter().sum::<f64>() / n as f64;
        if n < 2 {
            return Estimate { mean, half: f64::NAN, n };
        }
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
        Estimate { mean, half: t975(n - 1) * (var / n as f64).sqrt(), n }
    }

    fn show(&self, digits: usize) -> String {
        if self.half.is_nan() {
            format!("{:.*}", digits, self.mean)
        } else {
            format!("{:.*} ± {:.*}", digits, self.mean, digits, self.half)
        }
    }
}

/// The 97.5 % quantile of Student's t with `df` degrees of freedom (two-sided 95 %).
fn t975(df: usize) -> f64 {
    const T: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    T.get(df.max(1) - 1).copied().unwrap_or(1.96)
}

/// A scenario read from a study file.
#[derive(Debug, Clone)]
struct Scenario {
    name: String,
    set: String,
    /// Its trace family ([`FAMILIES`]), where the study file states it.
    family: Option<String>,
    /// The replay flags it stands for (without `--seed` and `--policy`).
    flags: Vec<String>,
    args: RunArgs,
}

#[derive(Parser)]
struct Flags {
    #[command(flatten)]
    run: RunArgs,
}

/// Reads and checks a study file.
pub fn load(path: &Path) -> Result<StudyFile, ReplayError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ReplayError::Usage(format!("{}: cannot read: {e}", path.display())))?;
    parse(&text, path)
}

/// Parses and checks the text of a study file, as [`load`] does with the file it reads; `path` names it in errors.
/// The scenarios' options are checked by [`check`].
pub fn parse(text: &str, path: &Path) -> Result<StudyFile, ReplayError> {
    let study: StudyFile = toml::from_str(text).map_err(|e| ReplayError::Usage(format!("{}: {e}", path.display())))?;
    let bad = |what: String| ReplayError::Usage(format!("{}: {what}", path.display()));
    if study.seeds.is_empty() {
        return Err(bad("seeds: give at least one seed".into()));
    }
    if study.policies.is_empty() {
        return Err(bad("policies: give at least one policy".into()));
    }
    for p in study.policies.iter().chain([&study.baseline]).chain(study.goals.ratio.keys()) {
        tessera_planner::policies::by_name(p).map_err(|e| bad(format!("policies: {e}")))?;
    }
    if !study.policies.contains(&study.baseline) {
        return Err(bad(format!("baseline {:?} is not among the policies", study.baseline)));
    }
    if study.scenario.is_empty() {
        return Err(bad("no [[scenario]]".into()));
    }
    let names: Vec<Option<&str>> = study.scenario.iter().map(|t| t.get("name").and_then(|v| v.as_str())).collect();
    for (i, name) in names.iter().enumerate() {
        if let Some(n) = name
            && names[..i].contains(name)
        {
            return Err(bad(format!("scenario {}: the name {n:?} is taken by an earlier scenario", i + 1)));
        }
    }
    for (i, c) in study.compare.iter().enumerate() {
        for (field, name) in [("scenario", &c.scenario), ("against", &c.against)] {
            if !names.contains(&Some(name.as_str())) {
                return Err(bad(format!("compare {} ({}): {field}: no scenario is named {name:?}", i + 1, c.name)));
            }
        }
        if c.scenario == c.against {
            return Err(bad(format!("compare {} ({}): a scenario is compared with itself", i + 1, c.name)));
        }
    }
    Ok(study)
}

/// Everything `replay study` checks in a study file's text before it runs anything: [`parse`], then every
/// scenario's options as `replay` flags. Returns the study and its number of scenarios.
pub fn check(text: &str, path: &Path) -> Result<(StudyFile, usize), ReplayError> {
    let study = parse(text, path)?;
    let n = scenarios(&study, path)?.len();
    Ok((study, n))
}

/// The flags of a TOML table of options.
fn flags_of(table: &toml::Table, path: &Path, what: &str) -> Result<Vec<String>, ReplayError> {
    let mut out = Vec::new();
    for (k, v) in table {
        if ["seed", "policy", "out", "json", "mode", "coordinator", "no-bound"].contains(&k.as_str()) {
            return Err(ReplayError::Usage(format!(
                "{}: {what}: {k:?} is set by the study, not by a scenario",
                path.display()
            )));
        }
        match v {
            toml::Value::Boolean(true) => out.push(format!("--{k}")),
            toml::Value::Boolean(false) => {}
            toml::Value::String(s) => out.extend([format!("--{k}"), s.clone()]),
            toml::Value::Integer(i) => out.extend([format!("--{k}"), i.to_string()]),
            toml::Value::Float(f) => out.extend([format!("--{k}"), f.to_string()]),
            other => {
                return Err(ReplayError::Usage(format!(
                    "{}: {what}: {k:?} must be a string, number or boolean (got {})",
                    path.display(),
                    other.type_str()
                )));
            }
        }
    }
    Ok(out)
}

fn scenarios(study: &StudyFile, path: &Path) -> Result<Vec<Scenario>, ReplayError> {
    let mut out = Vec::new();
    for (i, table) in study.scenario.iter().enumerate() {
        let mut table = table.clone();
        let take = |t: &mut toml::Table, key: &str| -> Result<String, ReplayError> {
            match t.remove(key) {
                Some(toml::Value::String(s)) => Ok(s),
                _ => Err(ReplayError::Usage(format!(
                    "{}: scenario {}: {key} (a string) is required",
                    path.display(),
                    i + 1
                ))),
            }
        };
        let name = take(&mut table, "name")?;
        let set = take(&mut table, "set")?;
        if set != "tuning" && set != "evaluation" {
            return Err(ReplayError::Usage(format!(
                "{}: scenario {name}: set must be tuning or evaluation (got {set:?})",
                path.display()
            )));
        }
        let family = match table.remove("family") {
            None => None,
            Some(toml::Value::String(f)) if FAMILIES.contains(&f.as_str()) => Some(f),
            Some(other) => {
                return Err(ReplayError::Usage(format!(
                    "{}: scenario {name}: family must be one of {} (got {other})",
                    path.display(),
                    FAMILIES.join(", ")
                )));
            }
        };
        let what = format!("scenario {name}");
        let mut merged = study.options.clone();
        merged.extend(table);
        let flags = flags_of(&merged, path, &what)?;
        let argv = std::iter::once("replay".to_string()).chain(flags.iter().cloned());
        let args = Flags::try_parse_from(argv)
            .map_err(|e| ReplayError::Usage(format!("{}: {what}: {}", path.display(), e.to_string().trim())))?
            .run;
        args.spec().map_err(|e| ReplayError::Usage(format!("{}: {what}: {e}", path.display())))?;
        out.push(Scenario { name, set, family, flags, args });
    }
    Ok(out)
}

/// A study run to its end: its rows and how long they took.
struct Done {
    path: PathBuf,
    study: StudyFile,
    sc: Vec<Scenario>,
    rows: Vec<Row>,
    timing: Timing,
}

/// How long a study's runs took.
#[derive(Debug, Clone, Copy)]
enum Timing {
    /// In one process: wall-clock seconds.
    One(f64),
    /// In `n` shards: the longest shard's seconds and the sum over shards.
    Shards { n: usize, longest: f64, total: f64 },
}

impl Timing {
    fn show(&self) -> String {
        match *self {
            Timing::One(wall) => format!("{wall:.0} s on this machine"),
            Timing::Shards { n, longest, total } => {
                format!("in {n} shards, the longest {longest:.0} s, {total:.0} s together")
            }
        }
    }
}

/// The format of a part file (`part-K-of-N.json`).
const PART_SCHEMA: u32 = 2;

/// What one shard of a study ran: enough of the study to check that all parts agree, and its rows.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Part {
    /// [`PART_SCHEMA`].
    schema_version: u32,
    /// The `replay` version that ran it.
    tool: String,
    /// The study's name.
    study: String,
    /// Which shard.
    shard: Shard,
    /// The study's seeds (after `--seeds`).
    seeds: Vec<u64>,
    /// The study's policies and baseline.
    policies: Vec<String>,
    baseline: String,
    /// The study's scenarios, as flags.
    scenarios: Vec<PartScenario>,
    /// The (scenario, seed) jobs this shard ran.
    jobs: Vec<(usize, u64)>,
    /// Wall-clock seconds the shard took.
    wall_s: f64,
    /// Its rows, in the order one run would have them.
    rows: Vec<Row>,
}

/// A scenario as a part file records it.
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PartScenario {
    name: String,
    set: String,
    #[serde(default)]
    family: Option<String>,
    flags: Vec<String>,
}

fn part_scenarios(sc: &[Scenario]) -> Vec<PartScenario> {
    sc.iter()
        .map(|s| PartScenario {
            name: s.name.clone(),
            set: s.set.clone(),
            family: s.family.clone(),
            flags: s.flags.clone(),
        })
        .collect()
}

/// Every (scenario, seed) of a study, in the order its rows are reported.
fn jobs(study: &StudyFile, scenarios: usize) -> Vec<(usize, u64)> {
    (0..scenarios).flat_map(|i| study.seeds.iter().map(move |s| (i, *s))).collect()
}

/// Reads and checks every study file (all of them before anything runs), with `--seeds` applied.
fn load_all(o: &StudyOptions) -> Result<Vec<(PathBuf, StudyFile, Vec<Scenario>)>, ReplayError> {
    let mut loaded = Vec::new();
    for f in &o.files {
        let mut study = load(f)?;
        let sc = scenarios(&study, f)?;
        if let Some(n) = o.seeds {
            study.seeds.truncate(n.max(1));
        }
        loaded.push((f.clone(), study, sc));
    }
    Ok(loaded)
}

/// `replay study`: runs every study file, writes its results, and returns the Markdown of all of them. With
/// `--shard K/N`, runs that shard's part of every study, writes each part, and returns a line per part.
pub fn run(args: &StudyArgs) -> Result<String, ReplayError> {
    if let Some(StudyCommand::Merge(m)) = &args.command {
        return merge(m);
    }
    let o = &args.options;
    let mut done = Vec::new();
    let mut written = String::new();
    // Jobs are numbered over all files in order, so that N shards share a run of several small studies evenly.
    let mut first_job = 0;
    for (path, study, sc) in load_all(o)? {
        let all = jobs(&study, sc.len());
        let mine: Vec<(usize, u64)> = (0..all.len())
            .filter(|j| args.shard.is_none_or(|shard| shard.owns(first_job + j)))
            .map(|j| all[j])
            .collect();
        first_job += all.len();
        let started = Instant::now();
        let rows = run_study(&study, &sc, &path, &mine)?;
        let wall = started.elapsed().as_secs_f64();
        let Some(shard) = args.shard else {
            done.push(Done { path, study, sc, rows, timing: Timing::One(wall) });
            continue;
        };
        let part = Part {
            schema_version: PART_SCHEMA,
            tool: env!("CARGO_PKG_VERSION").to_string(),
            study: study.name.clone(),
            shard,
            seeds: study.seeds.clone(),
            policies: study.policies.clone(),
            baseline: study.baseline.clone(),
            scenarios: part_scenarios(&sc),
            jobs: mine,
            wall_s: wall,
            rows,
        };
        let dir = o.out.join(&study.name);
        std::fs::create_dir_all(&dir).map_err(|source| ReplayError::Io { path: dir.clone(), source })?;
        let file = dir.join(shard.file_name());
        let json = serde_json::to_string_pretty(&part).expect("a part serialises");
        write(&file, &(json + "\n"))?;
        crate::note(format_args!(
            "study {} shard {}/{}: {} of {} runs in {wall:.0} s; wrote {}",
            study.name,
            shard.k,
            shard.n,
            part.jobs.len(),
            all.len(),
            file.display()
        ));
        let _ = writeln!(written, "{}", file.display());
    }
    if args.shard.is_some() { Ok(written) } else { finish(o, done) }
}

/// `replay study merge`: reads every study's parts, checks them, and writes the results as one run would.
fn merge(m: &MergeArgs) -> Result<String, ReplayError> {
    let o = &m.options;
    let mut done = Vec::new();
    for (path, study, sc) in load_all(o)? {
        let sources = if m.parts.is_empty() { vec![o.out.join(&study.name)] } else { m.parts.clone() };
        let parts = read_parts(&sources, &study.name)?;
        let (rows, timing) = combine(&study, &sc, &path, parts)?;
        done.push(Done { path, study, sc, rows, timing });
    }
    finish(o, done)
}

/// Every part of study `name` in `sources` (part files, or folders of them).
fn read_parts(sources: &[PathBuf], name: &str) -> Result<Vec<(PathBuf, Part)>, ReplayError> {
    let mut files = Vec::new();
    for src in sources {
        if src.is_dir() {
            let entries = std::fs::read_dir(src).map_err(|source| ReplayError::Io { path: src.clone(), source })?;
            let mut found: Vec<PathBuf> = entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let f = p.file_name().and_then(|f| f.to_str()).unwrap_or("");
                    f.starts_with("part-") && f.ends_with(".json")
                })
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(src.clone());
        }
    }
    let mut parts = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f)
            .map_err(|e| ReplayError::Usage(format!("{}: cannot read a study part: {e}", f.display())))?;
        let part: Part = serde_json::from_str(&text)
            .map_err(|e| ReplayError::Usage(format!("{}: not a study part: {e}", f.display())))?;
        if part.schema_version != PART_SCHEMA {
            return Err(ReplayError::Usage(format!(
                "{}: schema_version {} (this replay reads {PART_SCHEMA})",
                f.display(),
                part.schema_version
            )));
        }
        if part.study == name {
            parts.push((f, part));
        }
    }
    if parts.is_empty() {
        let places: Vec<String> = sources.iter().map(|p| p.display().to_string()).collect();
        return Err(ReplayError::Usage(format!(
            "no part of study {name} in {}: run `replay study FILE --shard K/N` for K = 1..N first",
            places.join(", ")
        )));
    }
    Ok(parts)
}

/// Checks that `parts` are the N shards of `study` as given, each once, covering every (scenario, seed) once, and
/// returns their rows in the order one run would have them.
fn combine(
    study: &StudyFile,
    sc: &[Scenario],
    path: &Path,
    mut parts: Vec<(PathBuf, Part)>,
) -> Result<(Vec<Row>, Timing), ReplayError> {
    let bad = |f: &Path, what: String| ReplayError::Usage(format!("{}: {what}", f.display()));
    parts.sort_by_key(|(_, p)| p.shard.k);
    let (first_file, first) = &parts[0];
    let n = first.shard.n;
    let scenarios = part_scenarios(sc);
    for (f, p) in &parts {
        if p.shard.n != n {
            let what = format!("shard {}/{}, but {} is one of {n}", p.shard.k, p.shard.n, first_file.display());
            return Err(bad(f, what));
        }
        if p.tool != env!("CARGO_PKG_VERSION") {
            let what = format!("made by replay {}; this is replay {}", p.tool, env!("CARGO_PKG_VERSION"));
            return Err(bad(f, what));
        }
        if p.seeds != study.seeds {
            let what = format!(
                "made with seeds {:?}, but {} has {:?} here: give merge the --seeds the shards had",
                p.seeds,
                path.display(),
                study.seeds
            );
            return Err(bad(f, what));
        }
        if p.policies != study.policies || p.baseline != study.baseline || p.scenarios != scenarios {
            let what = format!("made from another version of {} (its policies or scenarios differ)", path.display());
            return Err(bad(f, what));
        }
    }
    for w in parts.windows(2) {
        if w[0].1.shard.k == w[1].1.shard.k {
            return Err(bad(&w[1].0, format!("shard {}/{n} again (also {})", w[1].1.shard.k, w[0].0.display())));
        }
    }
    let have: Vec<usize> = parts.iter().map(|(_, p)| p.shard.k).collect();
    let missing: Vec<String> = (1..=n).filter(|k| !have.contains(k)).map(|k| format!("{k}/{n}")).collect();
    if !missing.is_empty() {
        return Err(ReplayError::Usage(format!(
            "study {}: shard(s) {} missing (found {} of {n} parts)",
            study.name,
            missing.join(", "),
            parts.len()
        )));
    }
    let order: BTreeMap<(usize, u64), usize> =
        jobs(study, sc.len()).into_iter().enumerate().map(|(j, x)| (x, j)).collect();
    let mut owner: BTreeMap<(usize, u64), &Path> = BTreeMap::new();
    for (f, p) in &parts {
        for job in &p.jobs {
            let Some(s) = sc.get(job.0).filter(|_| order.contains_key(job)) else {
                return Err(bad(
                    f,
                    format!("ran scenario {} seed {}, which the study does not have", job.0 + 1, job.1),
                ));
            };
            if let Some(other) = owner.insert(*job, f) {
                return Err(bad(f, format!("scenario {} seed {} is also in {}", s.name, job.1, other.display())));
            }
        }
        if let Some(r) = p.rows.iter().find(|r| !p.jobs.contains(&(r.scenario, r.seed))) {
            return Err(bad(f, format!("has a row for scenario {} seed {} it did not run", r.scenario + 1, r.seed)));
        }
        // Each job it ran has one row per policy: a truncated or edited part would average tables over fewer seeds.
        for job in &p.jobs {
            let mut policies: Vec<&str> =
                p.rows.iter().filter(|r| (r.scenario, r.seed) == *job).map(|r| r.policy.as_str()).collect();
            policies.sort_unstable();
            let mut want: Vec<&str> = study.policies.iter().map(String::as_str).collect();
            want.sort_unstable();
            if policies != want {
                let what = format!(
                    "scenario {} seed {} has rows for {policies:?}, not one for each of {:?}",
                    sc[job.0].name, job.1, study.policies
                );
                return Err(bad(f, what));
            }
        }
    }
    if let Some((i, seed)) = order.keys().find(|j| !owner.contains_key(j)) {
        return Err(ReplayError::Usage(format!(
            "study {}: no part ran scenario {} seed {seed}",
            study.name, sc[*i].name
        )));
    }
    let longest = parts.iter().map(|(_, p)| p.wall_s).fold(0.0, f64::max);
    let total = parts.iter().map(|(_, p)| p.wall_s).sum();
    let mut rows: Vec<Row> = parts.into_iter().flat_map(|(_, p)| p.rows).collect();
    // Stable: a job's rows keep the order its shard wrote them in.
    rows.sort_by_key(|r| order[&(r.scenario, r.seed)]);
    Ok((rows, Timing::Shards { n, longest, total }))
}

/// Writes each study's results and figures (and `--markdown`), and returns the Markdown of all of them.
fn finish(o: &StudyOptions, done: Vec<Done>) -> Result<String, ReplayError> {
    let mut markdown = String::new();
    for Done { path, study, sc, rows, timing } in done {
        let dir = o.out.join(&study.name);
        std::fs::create_dir_all(&dir).map_err(|source| ReplayError::Io { path: dir.clone(), source })?;
        let md = render(&study, &sc, &rows, &path, o, timing, "");
        write(&dir.join("results.md"), &md)?;
        write(&dir.join("runs.csv"), &runs_csv(&sc, &rows))?;
        write(&dir.join("summary.csv"), &summary_csv(&study, &sc, &rows))?;
        let mut svgs = vec![(PER_SCENARIO_SVG.to_string(), plot(&study, &sc, &rows)?)];
        for set in SETS {
            let members: Vec<usize> = (0..sc.len()).filter(|&i| sc[i].set == set).collect();
            if !members.is_empty() {
                svgs.push((set_svg(set), set_plot(&study, set, &members, &rows)?));
            }
        }
        for (name, svg) in &svgs {
            write(&dir.join(name), svg)?;
        }
        crate::note(format_args!(
            "study {}: {} runs {}; wrote {}",
            study.name,
            rows.len(),
            timing.show(),
            dir.display()
        ));
        // With --markdown, the figures also go beside that file, under figures/<study>/, and it links them there;
        // else what is printed is the study's results.md.
        match &o.markdown {
            Some(f) => {
                let figs = f.parent().unwrap_or(Path::new("")).join("figures").join(&study.name);
                std::fs::create_dir_all(&figs).map_err(|source| ReplayError::Io { path: figs.clone(), source })?;
                for (name, svg) in &svgs {
                    write(&figs.join(name), svg)?;
                }
                let prefix = format!("figures/{}/", study.name);
                markdown.push_str(&render(&study, &sc, &rows, &path, o, timing, &prefix));
            }
            None => markdown.push_str(&md),
        }
        markdown.push('\n');
    }
    if let Some(f) = &o.markdown {
        let files: Vec<String> = o.files.iter().map(|f| f.display().to_string()).collect();
        let header = format!(
            "# Results\n\nMade by `replay study {}{}` on the release build (2 shared cores); do not edit by hand. The \
             protocol, the upper bound and how to read these tables: [evaluation.md](evaluation.md).\n\n",
            files.join(" "),
            o.seeds.map_or(String::new(), |n| format!(" --seeds {n}")),
        );
        // Sections other commands wrote into the same file (the coordinator's benchmark against etcd) stay.
        let kept = std::fs::read_to_string(f).map(|old| kept_sections(&old)).unwrap_or_default();
        write(f, &(header + &markdown + &kept))?;
    }
    Ok(markdown)
}

/// The sections of a results file that other commands own, each from a line `<!-- begin section: NAME -->` to
/// its `<!-- end section: NAME -->`, in order, each followed by a blank line; a section without its end is left out.
pub fn kept_sections(old: &str) -> String {
    let mut kept = String::new();
    let mut rest = old;
    while let Some(start) = rest.find("<!-- begin section: ") {
        let after = &rest[start..];
        let Some(name_end) = after.find(" -->") else { break };
        let name = &after["<!-- begin section: ".len()..name_end];
        let end_marker = format!("<!-- end section: {name} -->");
        let Some(end) = after.find(&end_marker) else { break };
        kept.push_str(&after[..end + end_marker.len()]);
        kept.push_str("\n\n");
        rest = &after[end + end_marker.len()..];
    }
    kept
}

fn write(path: &Path, text: &str) -> Result<(), ReplayError> {
    std::fs::write(path, text).map_err(|source| ReplayError::Io { path: path.to_path_buf(), source })
}

/// The (scenario, seed) `jobs`, as many at a time as there are cores; rows in the order of `jobs`.
fn run_study(study: &StudyFile, sc: &[Scenario], path: &Path, jobs: &[(usize, u64)]) -> Result<Vec<Row>, ReplayError> {
    let total = jobs.len();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<Result<Vec<Row>, ReplayError>> = jobs
        .par_iter()
        .map(|&(i, seed)| {
            let mut args = sc[i].args.clone();
            args.seed = seed;
            args.policy = study.policies.join(",");
            args.out = None;
            let (cmp, _) = compare(&args, true).map_err(|e| {
                ReplayError::Usage(format!("{}: scenario {} seed {seed}: {e}", path.display(), sc[i].name))
            })?;
            let k = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            crate::note(format_args!(
                "study {}: {} seed {seed} done ({k}/{total}, {:.0} s)",
                study.name,
                sc[i].name,
                started.elapsed().as_secs_f64()
            ));
            let bound = cmp.upper_bound.as_ref().map_or(f64::NAN, |b| b.goodput);
            if bound <= 0.0 {
                // Nothing could be served: no policy has a share of the bound (it used to count as 1).
                return Err(ReplayError::Usage(format!(
                    "{}: scenario {} seed {seed}: the upper bound is 0 (no request of the window could be served): \
                     check the trace's window and the load",
                    path.display(),
                    sc[i].name
                )));
            }
            Ok(cmp
                .runs
                .iter()
                .map(|r| {
                    let split = cmp.split(r).map(|sp| sp.over(bound));
                    Row {
                        scenario: i,
                        seed,
                        policy: r.policy.clone(),
                        goodput: r.total.goodput,
                        bound,
                        slo_attainment: r.total.slo_attainment(),
                        mean_accuracy: r.total.mean_accuracy(),
                        not_within_slo: split.map_or(f64::NAN, |s| s.0),
                        below_best_accuracy: split.map_or(f64::NAN, |s| s.1),
                        reconfigurations: r.reconfigurations,
                        plan_ms: r.plan_ms_median,
                    }
                })
                .collect())
        })
        .collect();
    let mut rows = Vec::new();
    for r in results {
        rows.extend(r?);
    }
    Ok(rows)
}

/// `goodput / bound` (rows with a bound of 0 are refused when they are made; NaN, never 1, if one got here).
fn over_bound(r: &Row) -> f64 {
    if r.bound > 0.0 { r.goodput / r.bound } else { f64::NAN }
}

/// `f` of `policy`'s rows on scenario `i`, by seed.
fn by_seed(rows: &[Row], i: usize, policy: &str, f: impl Fn(&Row) -> f64) -> BTreeMap<u64, f64> {
    rows.iter().filter(|r| r.scenario == i && r.policy == policy).map(|r| (r.seed, f(r))).collect()
}

/// Per seed, `baseline / policy` goodput on scenario `i`.
fn ratios(rows: &[Row], i: usize, baseline: &str, policy: &str) -> BTreeMap<u64, f64> {
    let base = by_seed(rows, i, baseline, |r| r.goodput);
    let other = by_seed(rows, i, policy, |r| r.goodput);
    base.iter().filter_map(|(s, b)| other.get(s).filter(|o| **o > 0.0).map(|o| (*s, b / o))).collect()
}

/// Per seed, `policy`'s goodput on scenario `i` over its goodput on scenario `j`.
fn across(rows: &[Row], i: usize, j: usize, policy: &str) -> BTreeMap<u64, f64> {
    let num = by_seed(rows, i, policy, |r| r.goodput);
    let den = by_seed(rows, j, policy, |r| r.goodput);
    num.iter().filter_map(|(s, n)| den.get(s).filter(|d| **d > 0.0).map(|d| (*s, n / d))).collect()
}

/// The scenario comparisons of a study: per compare, its scenarios' indices.
fn comparisons<'a>(study: &'a StudyFile, sc: &[Scenario]) -> Vec<(&'a Compare, usize, usize)> {
    let index = |name: &str| sc.iter().position(|s| s.name == name).expect("checked by parse");
    study.compare.iter().map(|c| (c, index(&c.scenario), index(&c.against))).collect()
}

/// Per seed, the mean over `scenarios` of `per(i)` (seeds missing in any scenario are left out).
fn set_mean(scenarios: &[usize], per: impl Fn(usize) -> BTreeMap<u64, f64>) -> Vec<f64> {
    let maps: Vec<BTreeMap<u64, f64>> = scenarios.iter().map(|&i| per(i)).collect();
    let Some(first) = maps.first() else { return Vec::new() };
    first
        .keys()
        .filter(|s| maps.iter().all(|m| m.contains_key(s)))
        .map(|s| maps.iter().map(|m| m[s]).sum::<f64>() / maps.len() as f64)
        .collect()
}

/// Per seed, the geometric mean over `scenarios` of the ratios `per(i)`.
fn set_geomean(scenarios: &[usize], per: impl Fn(usize) -> BTreeMap<u64, f64>) -> Vec<f64> {
    let logs = |i: usize| per(i).into_iter().filter(|(_, r)| *r > 0.0).map(|(s, r)| (s, r.ln())).collect();
    set_mean(scenarios, logs).into_iter().map(f64::exp).collect()
}

/// The sets a scenario may belong to, in the order reported.
const SETS: [&str; 2] = ["evaluation", "tuning"];

/// Trace families a scenario may belong to (`family` in a study file): each set's table is repeated per family, so
/// that one extreme scenario cannot carry a set's mean. `docs/evaluation.md` says how a trace is classed.
const FAMILIES: [&str; 3] = ["steady", "diurnal", "bursty"];

/// The figure of goodput over the bound per scenario.
const PER_SCENARIO_SVG: &str = "goodput_over_bound.svg";

/// The figure of a set's goodput over the bound.
fn set_svg(set: &str) -> String {
    format!("{set}_over_bound.svg")
}

/// A study's Markdown; its figures are linked as `figs` + file name.
fn render(
    study: &StudyFile,
    sc: &[Scenario],
    rows: &[Row],
    path: &Path,
    o: &StudyOptions,
    timing: Timing,
    figs: &str,
) -> String {
    let mut md = String::new();
    let seeds = study.seeds.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    let _ = writeln!(md, "## Study: {}\n", study.name);
    if !study.description.is_empty() {
        let _ = writeln!(md, "{}\n", study.description.trim());
    }
    let _ = writeln!(
        md,
        "Made by `replay study {}`{} ({} scenario(s) x {} seed(s) [{seeds}] x {} policies, {}). \
         Means over seeds with 95 % Student-t intervals; goodput is divided by each run's upper bound \
         (`docs/evaluation.md`); ratios are paired per seed.\n",
        path.display(),
        o.seeds.map_or(String::new(), |n| format!(" --seeds {n}")),
        sc.len(),
        study.seeds.len(),
        study.policies.len(),
        timing.show(),
    );
    for set in SETS {
        let members: Vec<usize> = (0..sc.len()).filter(|&i| sc[i].set == set).collect();
        if members.is_empty() {
            continue;
        }
        let _ = writeln!(
            md,
            "### {} set: over its {} scenario(s)\n\nGoodput / bound is the mean over the scenarios, the ratio their \
             geometric mean (per seed, then over seeds). Not within SLO and below best accuracy are where the rest of \
             the goodput goes, as shares of the bound: requests not served within SLO and accuracy below the best \
             reachable (they add up with goodput to the ceiling, docs/evaluation.md).\n",
            capitalise(set),
            members.len()
        );
        let _ = writeln!(
            md,
            "| policy | goodput / bound | {} / policy | not within SLO | below best accuracy |",
            study.baseline
        );
        let _ = writeln!(md, "|---|---|---|---|---|");
        set_rows(&mut md, study, rows, &members);
        for family in FAMILIES {
            let of: Vec<usize> = members.iter().copied().filter(|&i| sc[i].family.as_deref() == Some(family)).collect();
            if of.is_empty() || of.len() == members.len() {
                continue;
            }
            let names: Vec<&str> = of.iter().map(|&i| sc[i].name.as_str()).collect();
            let _ = writeln!(
                md,
                "\n{} traces of the {set} set ({}):\n\n| policy | goodput / bound | {} / policy | not within SLO | \
                 below best accuracy |\n|---|---|---|---|---|",
                capitalise(family),
                names.join(", "),
                study.baseline
            );
            set_rows(&mut md, study, rows, &of);
        }
        let _ =
            writeln!(md, "\n![{} set: goodput / upper bound per policy]({figs}{})\n", capitalise(set), set_svg(set));
        if set == "evaluation" && (study.goals.over_bound.is_some() || !study.goals.ratio.is_empty()) {
            let _ = writeln!(md, "Goals on the evaluation set:\n");
            let _ = writeln!(md, "| goal | target | measured | met |");
            let _ = writeln!(md, "|---|---|---|---|");
            if let Some(g) = study.goals.over_bound {
                let e = Estimate::of(&set_mean(&members, |i| by_seed(rows, i, &study.baseline, over_bound)));
                let _ = writeln!(
                    md,
                    "| {} / upper bound | >= {g:.2} | {} | {} |",
                    study.baseline,
                    e.show(3),
                    met(e.mean, g)
                );
            }
            for (p, g) in &study.goals.ratio {
                if !study.policies.contains(p) {
                    continue;
                }
                let e = Estimate::of(&set_geomean(&members, |i| ratios(rows, i, &study.baseline, p)));
                let _ = writeln!(md, "| {} / {p} | >= {g:.2} | {} | {} |", study.baseline, e.show(3), met(e.mean, *g));
            }
            md.push('\n');
        }
    }
    let compared = comparisons(study, sc);
    if !compared.is_empty() {
        let _ = writeln!(
            md,
            "### Scenarios compared\n\nEach policy's goodput on one scenario over its goodput on another, paired per \
             seed (same tenants and arrivals), mean over seeds.\n"
        );
        for (c, i, j) in &compared {
            let _ = writeln!(md, "- **{}**: `{}` / `{}`", c.name, sc[*i].name, sc[*j].name);
        }
        md.push('\n');
        let head: Vec<String> = compared.iter().map(|(c, _, _)| c.name.clone()).collect();
        let _ = writeln!(md, "| policy | {} |", head.join(" | "));
        let _ = writeln!(md, "|---|{}", "---|".repeat(head.len()));
        for p in &study.policies {
            let cells: Vec<String> = compared
                .iter()
                .map(|(_, i, j)| Estimate::of(&across(rows, *i, *j, p).into_values().collect::<Vec<_>>()).show(3))
                .collect();
            let _ = writeln!(md, "| {p} | {} |", cells.join(" | "));
        }
        md.push('\n');
    }
    let _ = writeln!(md, "![Goodput / upper bound per scenario and policy]({figs}{PER_SCENARIO_SVG})\n");
    for (i, s) in sc.iter().enumerate() {
        let _ = writeln!(md, "### {} ({} set)\n", s.name, s.set);
        let _ = writeln!(md, "`replay {}` (seeds as above)\n", s.flags.join(" "));
        let _ = writeln!(
            md,
            "| policy | goodput / bound | {} / policy | not within SLO | below best accuracy | SLO attainment | mean \
             accuracy | reconfigurations |",
            study.baseline
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
        for p in &study.policies {
            let col = |f: fn(&Row) -> f64| Estimate::of(&by_seed(rows, i, p, f).into_values().collect::<Vec<_>>());
            let ratio = if *p == study.baseline {
                "-".to_string()
            } else {
                Estimate::of(&ratios(rows, i, &study.baseline, p).into_values().collect::<Vec<_>>()).show(3)
            };
            let _ = writeln!(
                md,
                "| {p} | {} | {ratio} | {} | {} | {} | {} | {} |",
                col(over_bound).show(3),
                col(|r| r.not_within_slo).show(3),
                col(|r| r.below_best_accuracy).show(3),
                col(|r| r.slo_attainment).show(3),
                col(|r| r.mean_accuracy).show(3),
                col(|r| r.reconfigurations as f64).show(0),
            );
        }
        let bound = Estimate::of(&by_seed(rows, i, &study.baseline, |r| r.bound).into_values().collect::<Vec<_>>());
        let _ = writeln!(md, "\nUpper bound: {} (goodput units).\n", bound.show(0));
    }
    md
}

/// One row per policy over the scenarios `members`: goodput / bound (mean over the scenarios), the baseline's ratio
/// (their geometric mean) and the two losses of the goodput split, each per seed and then over seeds.
fn set_rows(md: &mut String, study: &StudyFile, rows: &[Row], members: &[usize]) {
    for p in &study.policies {
        let mean = |f: fn(&Row) -> f64| Estimate::of(&set_mean(members, |i| by_seed(rows, i, p, f))).show(3);
        let ratio = if *p == study.baseline {
            "-".to_string()
        } else {
            Estimate::of(&set_geomean(members, |i| ratios(rows, i, &study.baseline, p))).show(3)
        };
        let _ = writeln!(
            md,
            "| {p} | {} | {ratio} | {} | {} |",
            mean(over_bound),
            mean(|r| r.not_within_slo),
            mean(|r| r.below_best_accuracy)
        );
    }
}

fn met(value: f64, goal: f64) -> String {
    if value >= goal { "yes".into() } else { format!("no: short by {:.3}", goal - value) }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map_or(String::new(), |f| f.to_uppercase().collect::<String>() + c.as_str())
}

fn runs_csv(sc: &[Scenario], rows: &[Row]) -> String {
    let mut s = String::from(
        "scenario,set,seed,policy,goodput,upper_bound,goodput_over_bound,slo_attainment,mean_accuracy,not_within_slo,below_best_accuracy,reconfigurations,plan_ms_median\n",
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{},{},{},{},{:.3},{:.3},{:.6},{:.6},{:.6},{:.6},{:.6},{},{:.2}",
            sc[r.scenario].name,
            sc[r.scenario].set,
            r.seed,
            r.policy,
            r.goodput,
            r.bound,
            over_bound(r),
            r.slo_attainment,
            r.mean_accuracy,
            r.not_within_slo,
            r.below_best_accuracy,
            r.reconfigurations,
            r.plan_ms
        );
    }
    s
}

fn summary_csv(study: &StudyFile, sc: &[Scenario], rows: &[Row]) -> String {
    let mut s = String::from("scenario,set,policy,seeds,goodput_over_bound,ci95,baseline_over_policy,ci95\n");
    for (i, scen) in sc.iter().enumerate() {
        for p in &study.policies {
            let ob = Estimate::of(&by_seed(rows, i, p, over_bound).into_values().collect::<Vec<_>>());
            let ratio = Estimate::of(&ratios(rows, i, &study.baseline, p).into_values().collect::<Vec<_>>());
            let _ = writeln!(
                s,
                "{},{},{p},{},{:.6},{:.6},{:.6},{:.6}",
                scen.name, scen.set, ob.n, ob.mean, ob.half, ratio.mean, ratio.half
            );
        }
    }
    s
}

/// The policies with the study's policy of interest (its baseline, the numerator of every ratio) first, and the pen
/// each is drawn with (highlighted for the baseline).
fn pens(study: &StudyFile) -> Vec<(&str, Pen)> {
    let mut order: Vec<&str> = study.policies.iter().map(String::as_str).collect();
    if let Some(k) = order.iter().position(|p| *p == study.baseline) {
        let b = order.remove(k);
        order.insert(0, b);
    }
    order.iter().enumerate().map(|(k, p)| (*p, Pen::of(k))).collect()
}

/// A set's goodput over the bound per policy: mean over its scenarios (per seed, then over seeds), with the 95 %
/// interval as a whisker.
fn set_plot(study: &StudyFile, set: &str, members: &[usize], rows: &[Row]) -> Result<String, ReplayError> {
    let pens = pens(study);
    let bars: Vec<(&str, f64, Option<f64>, Pen)> = pens
        .iter()
        .map(|&(p, pen)| {
            let e = Estimate::of(&set_mean(members, |i| by_seed(rows, i, p, over_bound)));
            (p, e.mean, Some(e.half), pen)
        })
        .collect();
    figures::bars(
        &format!("study {} {set} set", study.name),
        &format!(
            "goodput / upper bound, {set} set (mean over {} scenario(s), 95 % interval over seeds)",
            members.len()
        ),
        0.0..bars.iter().map(|b| b.1 + b.2.filter(|h| h.is_finite()).unwrap_or(0.0)).fold(1.0_f64, f64::max),
        &bars,
        (1000, 90 + 46 * bars.len() as u32),
    )
}

/// Goodput over the bound per scenario and policy, with the 95 % interval as a whisker; the study's baseline is the
/// saturated bar of each group.
fn plot(study: &StudyFile, sc: &[Scenario], rows: &[Row]) -> Result<String, ReplayError> {
    let mut out = String::new();
    let draw = |e: String| ReplayError::Usage(format!("plot of study {}: {e}", study.name));
    let pens = pens(study);
    let estimate = |i: usize, p: &str| Estimate::of(&by_seed(rows, i, p, over_bound).into_values().collect::<Vec<_>>());
    let top = (0..sc.len())
        .flat_map(|i| pens.iter().map(move |&(p, _)| (i, p)))
        .map(|(i, p)| estimate(i, p))
        .map(|e| if e.half.is_finite() { e.mean + e.half } else { e.mean })
        .filter(|v| v.is_finite())
        .fold(1.0_f64, f64::max)
        + 0.02;
    {
        let n = pens.len().max(1) as f64;
        let width = (120 + 200 * sc.len() as u32).max(1000);
        let root = SVGBackend::with_string(&mut out, (width, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(e.to_string()))?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .margin_top(56)
            .x_label_area_size(64)
            .y_label_area_size(90)
            // Room above 1 for a whisker that passes it.
            .build_cartesian_2d(0.0..sc.len().max(1) as f64, 0.0..top)
            .map_err(|e| draw(e.to_string()))?;
        let names: Vec<String> = sc.iter().map(|s| s.name.clone()).collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .x_labels(2 * sc.len() + 1)
            .x_label_formatter(&|x| {
                let k = x - 0.5;
                if (k - k.round()).abs() < 1e-6 && k >= 0.0 {
                    names.get(k.round() as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("goodput / upper bound")
            .y_label_formatter(&|&y| figures::axis_number(y))
            .label_style((figures::FONT, figures::TICK))
            .axis_desc_style((figures::FONT, figures::AXIS))
            .draw()
            .map_err(|e| draw(e.to_string()))?;
        for (k, &(p, pen)) in pens.iter().enumerate() {
            let mut bars = Vec::new();
            let mut whiskers = Vec::new();
            for i in 0..sc.len() {
                let e = estimate(i, p);
                let x0 = i as f64 + 0.08 + 0.84 * k as f64 / n;
                let x1 = x0 + 0.84 / n * 0.85;
                bars.push(Rectangle::new([(x0, 0.0), (x1, e.mean.max(0.0))], pen.fill()));
                if e.half.is_finite() {
                    let xm = (x0 + x1) / 2.0;
                    let cap = (x1 - x0) * 0.3;
                    let (a, b) = (e.mean - e.half, e.mean + e.half);
                    let style = BLACK.stroke_width(2);
                    whiskers.push(PathElement::new(vec![(xm, a), (xm, b)], style));
                    whiskers.push(PathElement::new(vec![(xm - cap, a), (xm + cap, a)], style));
                    whiskers.push(PathElement::new(vec![(xm - cap, b), (xm + cap, b)], style));
                }
            }
            chart.draw_series(bars).map_err(|e| draw(e.to_string()))?;
            chart.draw_series(whiskers).map_err(|e| draw(e.to_string()))?;
        }
        // The legend in a row above the plot, where it hides no bar.
        let mut x = 110;
        for &(p, pen) in &pens {
            let swatch = Rectangle::new([(x, 18), (x + 16, 34)], pen.fill());
            root.draw(&swatch).map_err(|e| draw(e.to_string()))?;
            let font = (figures::FONT, figures::AXIS).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center));
            root.draw(&Text::new(p.to_string(), (x + 22, 26), font)).map_err(|e| draw(e.to_string()))?;
            x += 48 + 11 * p.chars().count() as i32;
        }
        root.present().map_err(|e| draw(e.to_string()))?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_other_commands_own_are_kept_and_nothing_else() {
        let old = "# Results\n\nold study tables\n<!-- begin section: raft -->\n## Raft\n| a |\n<!-- end section: raft -->\n\
                   more\n<!-- begin section: x -->\nno end\n";
        assert_eq!(kept_sections(old), "<!-- begin section: raft -->\n## Raft\n| a |\n<!-- end section: raft -->\n\n");
        assert_eq!(kept_sections("# Results\nno sections\n"), "");
    }

    #[test]
    fn every_shipped_study_loads() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/studies");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let study = load(&path).unwrap_or_else(|e| panic!("{e}"));
            let sc = scenarios(&study, &path).unwrap_or_else(|e| panic!("{e}"));
            assert!(study.seeds.len() >= 5, "{}: report over at least 5 seeds", path.display());
            assert!(!sc.is_empty());
            n += 1;
        }
        assert!(n >= 3, "the evaluation, tuning and ablation studies");
    }

    #[test]
    fn intervals_follow_student_t() {
        let e = Estimate::of(&[1.0, 2.0, 3.0, 4.0, 5.0]);
        assert!((e.mean - 3.0).abs() < 1e-12);
        // s = sqrt(2.5), t(4) = 2.776: half-width 2.776 * sqrt(2.5 / 5).
        assert!((e.half - 2.776 * (0.5f64).sqrt()).abs() < 1e-9);
        assert!(Estimate::of(&[1.0]).half.is_nan());
        assert_eq!(t975(1000), 1.96);
    }

    #[test]
    fn a_set_mean_pairs_seeds_across_scenarios() {
        let a = BTreeMap::from([(1, 1.0), (2, 3.0)]);
        let b = BTreeMap::from([(1, 3.0), (3, 5.0)]);
        let v = set_mean(&[0, 1], |i| if i == 0 { a.clone() } else { b.clone() });
        assert_eq!(v, vec![2.0]);
        let g = set_geomean(&[0, 1], |i| BTreeMap::from([(1, if i == 0 { 1.0 } else { 4.0 })]));
        assert!((g[0] - 2.0).abs() < 1e-12);
    }

    #[test]
    fn scenario_comparisons_pair_seeds_and_name_unknown_scenarios() {
        let row = |scenario, seed, goodput| Row {
            scenario,
            seed,
            policy: "static".into(),
            goodput,
            bound: 10.0,
            slo_attainment: 1.0,
            mean_accuracy: 1.0,
            not_within_slo: 0.0,
            below_best_accuracy: 0.0,
            reconfigurations: 0,
            plan_ms: 0.0,
        };
        // Seed 3 ran only on scenario 0, seed 2 has no goodput on scenario 1: neither is a pair.
        let rows = [row(0, 1, 6.0), row(1, 1, 4.0), row(0, 2, 5.0), row(1, 2, 0.0), row(0, 3, 9.0)];
        assert_eq!(across(&rows, 0, 1, "static"), BTreeMap::from([(1, 1.5)]));
        assert!(across(&rows, 0, 1, "tessera").is_empty());

        let text = |against: &str| {
            format!(
                "name = \"c\"\nseeds = [1, 2]\npolicies = [\"tessera\"]\n[[scenario]]\nname = \"a\"\nset = \"evaluation\"\n\
                 [[scenario]]\nname = \"b\"\nset = \"evaluation\"\n[[compare]]\nname = \"X\"\nscenario = \"a\"\n\
                 against = \"{against}\"\n"
            )
        };
        let study = parse(&text("b"), Path::new("c.toml")).unwrap();
        assert_eq!((study.compare[0].scenario.as_str(), study.compare[0].against.as_str()), ("a", "b"));
        let e = parse(&text("z"), Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("c.toml") && e.contains("compare 1 (X): against") && e.contains("\"z\""), "{e}");
        let e = parse(&text("a"), Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("with itself"), "{e}");
        let twice = text("b").replace("name = \"b\"", "name = \"a\"");
        let e = parse(&twice, Path::new("c.toml")).unwrap_err().to_string();
        assert!(e.contains("scenario 2") && e.contains("taken"), "{e}");
    }
}
