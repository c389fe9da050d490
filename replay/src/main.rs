//! `replay`: Tessera's replay and planning tool. Thin: parses arguments and calls the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tessera_core::GpuModel;
use tessera_planner::PlannerConfig;
use tessera_planner::synthetic::SyntheticSpec;
use tessera_replay::run::ReplayError;
use tessera_replay::run::RunArgs;
use tessera_replay::study::capacity::{self, CapacityArgs};
use tessera_replay::{note, plan_cmd};
use tessera_replay::{report, study as run_study};

#[derive(Parser)]
#[command(
    name = "replay",
    version,
    about = "Tessera replay: traces through planner and simulated fleet; planner sizing"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Without a subcommand: replay a trace through every policy (see the options below).
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run planning rounds on a generated (`--synthetic`) or dumped (`--input`) planner input and print solve
    /// time (median over `--repeat` rounds, level 1 and every level-2 solve), objective, bound and gap.
    Plan(Box<PlanArgs>),
    /// The fewest GPUs on which each policy meets an SLO-attainment target (`--target-slo`), for the demand the
    /// run options map from the trace.
    Capacity(Box<CapacityArgs>),
    /// Write a synthetic Azure Functions 2019 day (invocations, durations and memory files, in the trace's exact
    /// schema: heavy-tailed popularity, a diurnal curve, periodic timers) into a folder, for `--trace`.
    SynthAzure2019(SynthArgs),
    /// Run study files (scenarios x policies x seeds; `configs/studies/*.toml`) and write tables with 95 %
    /// confidence intervals, CSV and plots (see docs/evaluation.md).
    Study(run_study::StudyArgs),
    /// List the policies `--policy` accepts, one per line with what each plans.
    Policies,
}

#[derive(Args)]
struct SynthArgs {
    /// Folder to write the three files into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Functions (rows of the invocations file).
    #[arg(long, default_value_t = 500)]
    functions: usize,
    /// Expected invocations over the day, all functions together.
    #[arg(long, default_value_t = 5_000_000)]
    invocations: u64,
    /// Day number in the file names (dNN).
    #[arg(long, default_value_t = 1)]
    day: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn synth(a: SynthArgs) -> anyhow::Result<String> {
    std::fs::create_dir_all(&a.out).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", a.out.display()))?;
    let spec = tessera_replay::trace::SyntheticDaySpec {
        day: a.day,
        functions: a.functions,
        total_invocations: a.invocations,
        seed: a.seed,
        ..Default::default()
    };
    let files = tessera_replay::trace::generate_azure_functions_2019_day(&a.out, &spec)?;
    Ok(files.iter().map(|f| format!("{}\n", f.display())).collect())
}

#[derive(Args)]
struct PlanArgs {
    /// Generate the input (see --gpus, --tenants, --slots, --gpu-model, --seed).
    #[arg(long, conflicts_with = "input", required_unless_present = "input")]
    synthetic: bool,
    /// Re-plan a dumped PlannerInput (JSON, as the coordinator dumps it).
    #[arg(long, value_name = "FILE")]
    input: Option<PathBuf>,
    /// GPUs of the synthetic fleet.
    #[arg(long, default_value_t = 1)]
    gpus: usize,
    /// Tenants of the synthetic fleet.
    #[arg(long, default_value_t = 3)]
    tenants: usize,
    /// Slots in the horizon.
    #[arg(long, default_value_t = 30)]
    slots: usize,
    /// Slot length, seconds.
    #[arg(long, default_value_t = 10.0)]
    slot_s: f64,
    /// GPU model of the synthetic fleet.
    #[arg(long, default_value = "A100-40GB")]
    gpu_model: String,
    /// Policy, or several separated by commas (`replay policies` lists them).
    #[arg(long, default_value = "tessera")]
    policy: String,
    /// Seed of the synthetic input.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Tenants of the synthetic fleet come in this many kinds (the same model, SLO, demand, forecast and
    /// retraining within a kind, as replicas of one service); 0: every tenant its own.
    #[arg(long, default_value_t = 0, value_name = "N")]
    archetypes: usize,
    /// Rounds to time.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Time consecutive rounds N slots apart instead of the same round: each round runs what the previous plan put
    /// on the GPUs N slots on, with forecasts moved on and revised, warm-started from the previous plan. The first
    /// round is cold and reported apart (cold_ms); solve_ms is the median of the warm ones.
    #[arg(long, value_name = "N", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    warm: Option<usize>,
    /// MILP backend: highs or microlp [default: highs, or the input's].
    #[arg(long)]
    solver: Option<String>,
    /// Wall-clock safety limit per MILP solve, seconds [default: 10, or the input's].
    #[arg(long)]
    time_limit: Option<f64>,
    /// Relative gap at which a MILP solve may stop [default: 0.01, or the input's].
    #[arg(long)]
    gap: Option<f64>,
    /// Branch-and-bound nodes per MILP solve, the deterministic budget [default: 500, or the input's].
    #[arg(long)]
    max_nodes: Option<u64>,
    /// Incremental rounds: the share of the planned forecast band a forecast may move before its GPU is solved
    /// again (`PlannerConfig::replan_band`; 0 solves every GPU every round) [default: the planner's, or the input's].
    #[arg(long, value_name = "SHARE")]
    replan_band: Option<f64>,
    /// Model profiles for the synthetic input.
    #[arg(long = "models-dir", alias = "models", default_value = "configs/models", value_name = "DIR")]
    models: PathBuf,
    /// Write the planner input used to FILE (JSON), for `--input` later.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    /// Print JSON: one object for one policy, `{"runs": [...]}` for several.
    #[arg(long)]
    json: bool,
}

fn plan(a: PlanArgs) -> anyhow::Result<String> {
    let mut input = match &a.input {
        Some(path) => plan_cmd::read_input(path)?,
        None => {
            let gpu_model = GpuModel::lookup(&a.gpu_model)
                .ok_or_else(|| anyhow::anyhow!("--gpu-model: unknown GPU model {:?}", a.gpu_model))?;
            let models = plan_cmd::read_models(&a.models)?;
            let spec = SyntheticSpec { gpus: a.gpus, tenants: a.tenants, slots: a.slots, gpu_model, seed: a.seed };
            tessera_planner::synthetic::input_with_archetypes(
                &spec,
                a.archetypes,
                &models,
                PlannerConfig { slot_s: a.slot_s, ..PlannerConfig::default() },
            )
        }
    };
    if let Some(s) = &a.solver {
        input.config.solver.backend = s.parse().map_err(|e: String| anyhow::anyhow!("--solver: {e}"))?;
    }
    if let Some(t) = a.time_limit {
        input.config.solver.time_limit_s = t;
    }
    if let Some(g) = a.gap {
        input.config.solver.mip_rel_gap = g;
    }
    if let Some(n) = a.max_nodes {
        input.config.solver.max_nodes = n;
    }
    if let Some(b) = a.replan_band {
        input.config.replan_band = b;
    }
    input.config.validate().map_err(|e| anyhow::anyhow!(e))?;
    if let Some(path) = &a.dump {
        let text = serde_json::to_string_pretty(&input)?;
        std::fs::write(path, text).map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
    }
    let mut runs = Vec::new();
    for policy in a.policy.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        runs.push(plan_cmd::run(policy, &input, a.repeat, a.warm)?);
    }
    if a.json {
        let value = if runs.len() == 1 { serde_json::to_value(&runs[0])? } else { serde_json::json!({ "runs": runs }) };
        Ok(format!("{value}\n"))
    } else {
        Ok(plan_cmd::table(&runs))
    }
}

/// mimalloc: planning rounds allocate many small vectors from every worker thread at once; measured on an hour of
/// 100 GPUs (fluid executor), about 5 % less planning and wall time than the system allocator, same numbers.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match tessera_sim::agent::cli::parse_or_exit::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match cli.command {
        Some(Command::Plan(a)) => plan(*a),
        Some(Command::SynthAzure2019(a)) => synth(a),
        Some(Command::Policies) => Ok(format!("{}\n", tessera_planner::policies::help())),
        Some(Command::Study(a)) => {
            return replay_cmd(|out| {
                let md = run_study::run(&a)?;
                out.write_all(md.as_bytes()).map_err(|source| ReplayError::Io { path: "stdout".into(), source })
            });
        }
        Some(Command::Capacity(a)) => return replay_cmd(|out| capacity::capacity(&a, out).map(drop)),
        None => return replay_cmd(|out| report::run(&cli.run, out).map(drop)),
    };
    match result {
        Ok(out) => print_stdout(&out),
        Err(e) => {
            note(format_args!("error: {e:#}"));
            ExitCode::from(2)
        }
    }
}

/// Runs a replay command, printing its output on stdout and errors as one line on stderr.
fn replay_cmd(f: impl FnOnce(&mut dyn Write) -> Result<(), ReplayError>) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result =
        f(&mut out).and_then(|()| out.flush().map_err(|source| ReplayError::Io { path: "stdout".into(), source }));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`replay ... | head`): it wanted no more, as a SIGPIPE's default action would say.
        Err(ReplayError::Io { path, source }) if path.as_os_str() == "stdout" && closed(&source) => ExitCode::SUCCESS,
        Err(e) => {
            note(format_args!("error: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}

/// Writes `text` to stdout ([`tessera_sim::agent::cli::print_stdout`]: a closed pipe, `replay --help | head -1`,
/// ends the output quietly with success instead of `print!`'s panic); any other failure is a message and code 1.
fn print_stdout(text: &str) -> ExitCode {
    match tessera_sim::agent::cli::print_stdout(text) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            note(format_args!("error: stdout: {e}"));
            ExitCode::from(1)
        }
    }
}

/// Whether a write failed because the reader closed the pipe.
fn closed(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}
