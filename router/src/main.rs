//! `router`: Tessera's front end. Thin: parses arguments, starts a route source and serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use tessera_router::proxy::Router;
use tessera_router::{Routes, source};

/// Follows each tenant's routes and sends `http://ROUTER/t/TENANT/PATH` to one of its ready instances.
#[derive(Parser)]
#[command(name = "router", version)]
struct Cli {
    /// Where clients connect.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Coordinators to follow the routes of (comma-separated, any members).
    #[arg(long, value_delimiter = ',', required_unless_present = "agents", conflicts_with = "agents")]
    coordinator: Vec<String>,
    /// Without a coordinator: agents (HOST:PORT, comma-separated) whose state to poll for their jobs' endpoints.
    #[arg(long, value_delimiter = ',')]
    agents: Vec<String>,
    /// How often agents are polled.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// How long a request waits for a ready instance of its tenant before it is dropped (503).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// Mutual TLS to the coordinators: this router's certificate (a reader's is enough).
    #[arg(long)]
    tls_cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long)]
    tls_key: Option<PathBuf>,
    /// The cluster's CA certificate.
    #[arg(long)]
    tls_ca: Option<PathBuf>,
}

async fn run(cli: Cli) -> Result<(), String> {
    let tls = tessera_auth::TlsFiles::from_flags(cli.tls_cert, cli.tls_key, cli.tls_ca).map_err(|e| e.to_string())?;
    let (tx, rx) = tokio::sync::watch::channel(Routes::new());
    if cli.agents.is_empty() {
        tokio::spawn(source::follow_coordinator(cli.coordinator, tls, tx));
    } else {
        tokio::spawn(source::poll_agents(cli.agents, cli.poll, tx));
    }
    let listener =
        tokio::net::TcpListener::bind(cli.listen).await.map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("router listening on {addr}");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let shutdown = async {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => return,
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    Router::new(rx, cli.hold).serve(listener, shutdown).await;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
