//! `standin`: stand-in workloads that behave like a tenant's jobs on a MIG instance, without a GPU, for testing
//! the agent's job supervisor with real processes. Thin: parses arguments and calls [`tessera_sim::standin`].

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tessera_sim::standin::retrain::{self, RetrainArgs};
use tessera_sim::standin::serve::{self, ServeArgs};

#[derive(Parser)]
#[command(name = "standin", version, about = "Stand-in workloads for testing Tessera's job supervisor")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A stand-in inference server: ready after a warm-up, serves POST /infer after a latency, drains on POST
    /// /drain or SIGTERM. Prints `standin serve listening on ADDR` once bound.
    Serve(ServeArgs),
    /// A stand-in retraining job: advances in 7g GPU-seconds, checkpoints atomically on SIGUSR1, SIGTERM,
    /// periodically and when done, and resumes from its checkpoint. Prints `standin retrain started at 0` or
    /// `standin retrain resumed from P`, then `checkpoint progress=P` per checkpoint.
    Retrain(RetrainArgs),
}

fn main() -> ExitCode {
    let cli = match tessera_sim::agent::cli::parse_or_exit::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let result = match &cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Retrain(args) => retrain::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
