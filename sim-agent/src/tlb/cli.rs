//! The `sim-agent tlb` subcommand: simulate one co-located mix and print the figures as a table or as one JSON
//! object.
//!
//! ```text
//! sim-agent tlb --mix streaming,stride,blocked --mode star --slices 3,2,2 [--seed K] [--accesses N] [--json]
//! ```
//!
//! A mix entry is an access pattern (`streaming`, `stride`, `blocked`, `random`, with the calibrated defaults of
//! [`TenantStreamSpec::new`]) or a model name with a default stream ([`model_stream`]).
//!
//! And the `sim-agent interference` subcommand: the planner's pairwise interference table of some models
//! ([`TlbModel::pairwise`]), as the JSON the coordinator's `interference` setting reads:
//!
//! ```text
//! sim-agent interference --models resnet50,bert_base,llama_2_7b --mode baseline [--seed K] [--accesses N]
//! ```

use std::fmt::Write as _;
use std::io::{self, Write};
use std::str::FromStr;

use serde::Serialize;

use super::sim::{TlbReport, simulate};
use super::stream::model_stream;
use super::{AccessPattern, DEFAULT_ACCESSES, TenantStreamSpec, TlbError, TlbMode, TlbModel, TlbParams};

/// One tenant of `--mix`: its label and stream.
#[derive(Debug, Clone, PartialEq)]
pub struct MixEntry {
    /// The word as given (a pattern or model name).
    pub label: String,
    /// Its stream.
    pub spec: TenantStreamSpec,
}

impl FromStr for MixEntry {
    type Err = TlbError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let word = s.trim();
        let spec = match word.parse::<AccessPattern>() {
            Ok(p) => TenantStreamSpec::new(p),
            Err(_) => model_stream(word).ok_or_else(|| TlbError::UnknownPattern(word.to_string()))?,
        };
        Ok(MixEntry { label: word.to_string(), spec })
    }
}

/// Arguments of `sim-agent tlb`.
#[derive(Debug, Clone, clap::Args)]
pub struct TlbArgs {
    /// Comma-separated tenants sharing the L3 TLB: access patterns (streaming, stride, blocked, random) or model
    /// names (e.g. resnet50, bert_base).
    #[arg(long, value_delimiter = ',', required = true)]
    pub mix: Vec<MixEntry>,
    /// TLB design, seed and run length.
    #[command(flatten)]
    pub run: RunOptions,
    /// Compute slices of each tenant's MIG instance, comma-separated (e.g. 3,2,2); 1 each when omitted.
    #[arg(long, value_delimiter = ',')]
    pub slices: Vec<u8>,
    /// Footprint of each tenant, MiB, comma-separated; the pattern's or model's default when omitted.
    #[arg(long, value_delimiter = ',')]
    pub footprint_mib: Vec<u32>,
    /// Compute cycles per access of each tenant, comma-separated; the calibrated default when omitted.
    #[arg(long, value_delimiter = ',')]
    pub compute_cycles: Vec<f64>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Why `sim-agent tlb` failed.
#[derive(Debug, thiserror::Error)]
pub enum TlbCliError {
    /// Bad input (exit code 2).
    #[error(transparent)]
    Input(#[from] TlbError),
    /// Writing the output failed (exit code 1).
    #[error("writing output: {0}")]
    Io(#[from] io::Error),
}

impl TlbCliError {
    /// The process exit code for this error: 2 for bad input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            TlbCliError::Input(_) => 2,
            TlbCliError::Io(_) => 1,
        }
    }
}

/// Labels made unique: a repeated label gets `#2`, `#3`, ...
fn unique_labels(mix: &[MixEntry]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(mix.len());
    for e in mix {
        let seen = mix.iter().take(out.len()).filter(|o| o.label == e.label).count();
        out.push(if seen == 0 { e.label.clone() } else { format!("{}#{}", e.label, seen + 1) });
    }
    out
}

/// Checks that a per-tenant list is empty or has one value per tenant.
fn check_len(flag: &'static str, given: usize, tenants: usize) -> Result<(), TlbError> {
    if given == 0 || given == tenants {
        return Ok(());
    }
    Err(TlbError::InvalidTenant {
        index: given.min(tenants),
        field: flag,
        reason: format!("--{} has {given} values for {tenants} tenants", flag.replace('_', "-")),
    })
}

/// The streams of the arguments, with `--slices`, `--footprint-mib` and `--compute-cycles` applied.
pub fn specs(args: &TlbArgs) -> Result<Vec<TenantStreamSpec>, TlbError> {
    let n = args.mix.len();
    check_len("slices", args.slices.len(), n)?;
    check_len("footprint_mib", args.footprint_mib.len(), n)?;
    check_len("compute_cycles", args.compute_cycles.len(), n)?;
    Ok(args
        .mix
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let mut spec = e.spec;
            if let Some(&g) = args.slices.get(i) {
                spec.slices = g;
            }
            if let Some(&f) = args.footprint_mib.get(i) {
                spec.footprint_mib = f;
            }
            if let Some(&c) = args.compute_cycles.get(i) {
                spec.compute_cycles_per_access = c;
            }
            spec
        })
        .collect())
}

/// Runs the subcommand, writing the table or JSON to `out`.
pub fn run(args: &TlbArgs, out: &mut dyn Write) -> Result<(), TlbCliError> {
    let specs = specs(args)?;
    let report = simulate(&TlbParams::default(), &specs, args.run.mode, args.run.seed, args.run.accesses)?;
    let labels = unique_labels(&args.mix);
    if args.json {
        serde_json::to_writer(&mut *out, &JsonOutput::new(&report, &labels)).map_err(io::Error::from)?;
        writeln!(out)?;
    } else {
        out.write_all(table(&report, &labels).as_bytes())?;
    }
    Ok(())
}

/// Arguments of `sim-agent interference`.
#[derive(Debug, Clone, clap::Args)]
pub struct InterferenceArgs {
    /// Comma-separated model names, each with a default stream (e.g. resnet50,bert_base,llama_2_7b).
    #[arg(long, value_delimiter = ',', required = true)]
    pub models: Vec<String>,
    /// TLB design, seed and run length (of each pair's co-located run).
    #[command(flatten)]
    pub run: RunOptions,
}

/// What `sim-agent tlb` and `sim-agent interference` share: the TLB design, the seed and the run length.
#[derive(Debug, Clone, clap::Args)]
pub struct RunOptions {
    /// L3 TLB design: baseline or star.
    #[arg(long, default_value = "baseline")]
    pub mode: TlbMode,
    /// Seed of the streams and the interleaving.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Interleaved accesses of a co-located run (each alone run replays its tenant's share).
    #[arg(long, default_value_t = DEFAULT_ACCESSES)]
    pub accesses: u64,
}

/// The table `sim-agent interference` prints: the planner's `Interference` (`tessera_planner::input`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InterferenceTable {
    /// How it was made: the command that prints it again.
    pub source: String,
    /// `(victim model, aggressor model, latency multiplier >= 1)`, sorted.
    pub pairs: Vec<(String, String, f64)>,
}

/// The table of the arguments: every model must have a default stream (an unknown name is an error naming it).
pub fn interference_table(args: &InterferenceArgs) -> Result<InterferenceTable, TlbError> {
    if let Some(bad) = args.models.iter().find(|m| model_stream(m).is_none()) {
        return Err(TlbError::UnknownPattern(bad.clone()));
    }
    let mut model = TlbModel::new(TlbParams::default(), args.run.seed, args.run.accesses)?;
    let names: Vec<&str> = args.models.iter().map(String::as_str).collect();
    let pairs = model.pairwise(&names, args.run.mode)?;
    let mut sorted = names.clone();
    sorted.sort_unstable();
    sorted.dedup();
    let source = format!(
        "sim-agent interference --models {} --mode {} --seed {} --accesses {}",
        sorted.join(","),
        args.run.mode.name(),
        args.run.seed,
        args.run.accesses
    );
    Ok(InterferenceTable { source, pairs })
}

/// Runs `sim-agent interference`, writing the table as one JSON object to `out`.
pub fn run_interference(args: &InterferenceArgs, out: &mut dyn Write) -> Result<(), TlbCliError> {
    let table = interference_table(args)?;
    serde_json::to_writer_pretty(&mut *out, &table).map_err(io::Error::from)?;
    writeln!(out)?;
    Ok(())
}

/// The `--json` object.
#[derive(Serialize)]
struct JsonOutput<'a> {
    mode: TlbMode,
    seed: u64,
    accesses: u64,
    hit_rate: f64,
    subentry_utilisation: Option<f64>,
    mean_slowdown: f64,
    slowdown: serde_json::Map<String, serde_json::Value>,
    tenant_hit_rate: serde_json::Map<String, serde_json::Value>,
    tenants: Vec<JsonTenant<'a>>,
}

#[derive(Serialize)]
struct JsonTenant<'a> {
    name: &'a str,
    pattern: AccessPattern,
    slices: u8,
    footprint_mib: u32,
    accesses: u64,
    l3_accesses: u64,
    hit_rate: f64,
    alone_hit_rate: f64,
    slowdown: f64,
}

impl<'a> JsonOutput<'a> {
    fn new(r: &TlbReport, labels: &'a [String]) -> Self {
        let by_label = |f: &dyn Fn(usize) -> f64| {
            labels.iter().enumerate().map(|(i, l)| (l.clone(), serde_json::Value::from(f(i)))).collect()
        };
        JsonOutput {
            mode: r.mode,
            seed: r.seed,
            accesses: r.accesses,
            hit_rate: r.hit_rate,
            subentry_utilisation: r.subentry_utilisation,
            mean_slowdown: r.mean_slowdown,
            slowdown: by_label(&|i| r.tenants[i].slowdown),
            tenant_hit_rate: by_label(&|i| r.tenants[i].hit_rate),
            tenants: r
                .tenants
                .iter()
                .zip(labels)
                .map(|(t, name)| JsonTenant {
                    name,
                    pattern: t.spec.pattern,
                    slices: t.spec.slices,
                    footprint_mib: t.spec.footprint_mib,
                    accesses: t.colocated.accesses,
                    l3_accesses: t.colocated.l3_accesses,
                    hit_rate: t.hit_rate,
                    alone_hit_rate: t.alone_hit_rate,
                    slowdown: t.slowdown,
                })
                .collect(),
        }
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The readable table.
pub fn table(r: &TlbReport, labels: &[String]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "L3 TLB model: mode {}, seed {}, {} co-located accesses", r.mode, r.seed, r.accesses);
    let width = labels.iter().map(String::len).max().unwrap_or(0).max("tenant".len());
    let _ = writeln!(
        s,
        "{:<width$}  {:<9}  {:>6}  {:>9}  {:>10}  {:>12}  {:>11}  {:>8}",
        "tenant", "pattern", "slices", "footprint", "L3 lookups", "L3 hit alone", "L3 hit co-l", "slowdown"
    );
    for (t, label) in r.tenants.iter().zip(labels) {
        let _ = writeln!(
            s,
            "{:<width$}  {:<9}  {:>6}  {:>5} MiB  {:>10}  {:>12}  {:>11}  {:>8}",
            label,
            t.spec.pattern.name(),
            format!("{}g", t.spec.slices),
            t.spec.footprint_mib,
            t.colocated.l3_accesses,
            pct(t.alone_hit_rate),
            pct(t.hit_rate),
            pct(t.slowdown),
        );
    }
    let util = r.subentry_utilisation.map_or_else(|| "n/a (no evictions)".to_string(), pct);
    let _ = writeln!(s, "L3 hit rate:                          {}", pct(r.hit_rate));
    let _ = writeln!(s, "sub-entry utilisation at eviction:    {util}");
    let _ = writeln!(s, "mean slowdown vs alone (baseline L3): {}", pct(r.mean_slowdown));
    if r.mode == TlbMode::Star {
        let _ = writeln!(s, "STAR: {} shared allocations, {} reverts to exclusive", r.l3.shares, r.l3.reverts);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_unique() {
        let mix: Vec<MixEntry> = ["stride", "blocked", "stride", "stride"].iter().map(|w| w.parse().unwrap()).collect();
        assert_eq!(unique_labels(&mix), vec!["stride", "blocked", "stride#2", "stride#3"]);
    }

    #[test]
    fn models_and_patterns_parse_and_junk_does_not() {
        assert_eq!("resnet50".parse::<MixEntry>().unwrap().spec.pattern, AccessPattern::Blocked);
        assert_eq!(" random ".parse::<MixEntry>().unwrap().label, "random");
        assert!(matches!("zigzag".parse::<MixEntry>(), Err(TlbError::UnknownPattern(_))));
    }
}
