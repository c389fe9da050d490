//! `sim-agent`: the simulated backend's command line. Thin: parses arguments and calls the library. Each
//! subcommand is one variant of [`Command`] whose arguments live in the library module that runs it.

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_sim::node::{self, RunArgs};
use tessera_sim::share::{self, ShareArgs};
use tessera_sim::tlb::cli::{self as tlb_cli, InterferenceArgs, TlbArgs};

#[derive(Parser)]
#[command(name = "sim-agent", version, about = "Tessera's simulated MIG/TLB backend")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Host simulated nodes, each a real agent with its own gRPC endpoint over simulated GPUs. Prints one line per
    /// node, `node=<id> addr=<host:port>`, then serves until interrupted.
    Run(RunArgs),
    /// Simulate the shared L3 TLB (baseline or STAR) for a co-located mix: hit rates, sub-entry utilisation and
    /// per-tenant slowdown against running alone.
    Tlb(TlbArgs),
    /// Print the planner's pairwise interference table of some models from the TLB model, as JSON (the
    /// coordinator's `interference` setting): each model's latency factor next to each other one.
    Interference(InterferenceArgs),
    /// Simulate a tenant's inference and retraining sharing one MIG instance (exclusive, TGS-like timeslice or
    /// Tally-like priority): inference p99 and its overhead against running alone, and training throughput.
    Share(ShareArgs),
}

fn main() -> ExitCode {
    let cli = match tessera_agent::cli::parse_or_exit::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    match cli.command {
        Command::Run(args) => run_nodes(args),
        Command::Tlb(args) => print_with(|out| tlb_cli::run(&args, out)),
        Command::Interference(args) => print_with(|out| tlb_cli::run_interference(&args, out)),
        Command::Share(args) => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match share::run_cli(&args, &mut out).and_then(|()| out.flush().map_err(Into::into)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
    }
}

/// Runs a printing subcommand on stdout; its error goes to stderr with its exit code.
fn print_with(run: impl FnOnce(&mut dyn Write) -> Result<(), tlb_cli::TlbCliError>) -> ExitCode {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match run(&mut out).and_then(|()| out.flush().map_err(Into::into)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run_nodes(args: RunArgs) -> ExitCode {
    // One process, many nodes: each node's spans go out under its own `service.instance.id`.
    let service = tessera_telemetry::Service::new("tessera-sim-agent", &args.node_prefix).hosting("tessera.node");
    let warn = tessera_telemetry::LevelFilter::WARN;
    let telemetry = match tessera_telemetry::init(args.otlp_endpoint.as_deref(), &service, warn) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: tracing: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let mut stdout = std::io::stdout();
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        node::run(args, &mut stdout, shutdown).await
    });
    if let Some(t) = telemetry {
        t.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
