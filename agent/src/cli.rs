//! Command-line conventions shared by Tessera's binaries (`agent`, `sim-agent`, `replay`): `--help` and `--version`
//! print to stdout and exit 0; a usage error is one line on stderr, `error: ...`, and exit code 2. Output goes
//! through [`print_stdout`], so a reader that goes away early (`| head`) ends the output quietly instead of a panic.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

/// Parses the process arguments as `C`, or returns the exit code after printing help, the version or a one-line
/// usage error.
pub fn parse_or_exit<C: Parser>() -> Result<C, ExitCode> {
    match C::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e) if !e.use_stderr() => {
            let _ = print_stdout(&e.to_string());
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {}", one_line::<C>(&e));
            Err(ExitCode::from(2))
        }
    }
}

/// Writes `text` to stdout and flushes it. A closed pipe (the reader exited, as `head` does) is not an error: the
/// rest of the output is dropped quietly, as Unix tools do.
pub fn print_stdout(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r,
    }
}

/// Clap's usage errors span several lines; operators and scripts get one: the message and the arguments it names.
pub fn one_line<C: Parser>(e: &clap::Error) -> String {
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let name = C::command().get_name().to_string();
        return format!("a subcommand is required; see {name} --help");
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
