//! `sim-agent`: the simulated backend's command line. Thin: parses arguments and calls the library. Each
//! subcommand is one variant of [`Command`] whose arguments live in the library module that runs it.

use std::io::Write;
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use tessera_sim::tlb::cli::{self as tlb_cli, TlbArgs};

#[derive(Parser)]
#[command(name = "sim-agent", version, about = "Tessera's simulated MIG/TLB backend")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate the shared L3 TLB (baseline or STAR) for a co-located mix: hit rates, sub-entry utilisation and
    /// per-tenant slowdown against running alone.
    Tlb(TlbArgs),
}

/// A clap usage error as one line: the message and the arguments it names, without the usage and help hints.
fn one_line(e: &clap::Error) -> String {
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        return "a subcommand is required (tlb); see sim-agent --help".to_string();
    }
    let text = e.to_string();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .collect();
    lines.join(" ").trim_start_matches("error: ").to_string()
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help and --version.
            print!("{e}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            return ExitCode::from(2);
        }
    };
    match cli.command {
        Command::Tlb(args) => {
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            match tlb_cli::run(&args, &mut out).and_then(|()| out.flush().map_err(Into::into)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }
    }
}
