//! `coordinator`: run a coordinator node (`serve`) or talk to a cluster (`status`, `tenant`, `node`, `gpu`,
//! `plan`, `member`), like etcd and etcdctl: `serve`, the client commands (`client`, one module per group), `certs`
//! and `dev-cluster`, each in its own module.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod certs;
mod client;
mod serve;

use certs::CertsCmd;
use client::fleet::{GpuCmd, MemberCmd, NodeCmd};
use client::plan::{AuditCmd, PlanCmd};
use client::tenant::TenantCmd;
use client::{ClientArgs, report};
use serve::ServeArgs;

/// Exit statuses of every command, printed under `--help` (docs/operations.md has the same table).
const EXIT_CODES: &str = "\
Exit status:
  0  done
  1  failed for another reason (a file that cannot be read or written, an internal error)
  2  usage: unknown flag, missing argument, flags that do not go together
  3  the cluster did not answer in time or has no leader (UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED):
     worth retrying
  4  refused: no or unknown certificate, or a role that may not do this (UNAUTHENTICATED, PERMISSION_DENIED)
  5  not found (NOT_FOUND)
  6  conflict: already exists, a stale --if-revision, not possible in the current state (ALREADY_EXISTS,
     FAILED_PRECONDITION, ABORTED)
  7  invalid input: a bad file, or a request the cluster refuses as invalid (INVALID_ARGUMENT, OUT_OF_RANGE)";

#[derive(Parser)]
#[command(
    name = "coordinator",
    version,
    about = "Tessera's Raft-replicated coordinator and its client",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a coordinator node. Flags override the config file.
    Serve(Box<ServeArgs>),
    /// Cluster status: leader, term, commit index, members (as seen by the first endpoint that answers).
    Status(ClientArgs),
    /// Tenants.
    #[command(subcommand)]
    Tenant(TenantCmd),
    /// Nodes and their GPUs.
    #[command(subcommand)]
    Node(NodeCmd),
    /// GPU health.
    #[command(subcommand)]
    Gpu(GpuCmd),
    /// Plans.
    #[command(subcommand)]
    Plan(PlanCmd),
    /// Cluster membership (Raft configuration changes).
    #[command(subcommand)]
    Member(MemberCmd),
    /// Certificates for mutual TLS.
    #[command(subcommand)]
    Certs(CertsCmd),
    /// The audit log: every admin and operator action (who, what, when, result).
    #[command(subcommand)]
    Audit(AuditCmd),
    /// Start a development cluster (3 replicas in this process, virtual workload clock by default), print its
    /// endpoints and serve until interrupted. `replay --mode cluster --coordinator ADDR` replays through it;
    /// `sim-agent run --coordinator ADDR` adds simulated GPU nodes.
    DevCluster(Box<tessera_coordinator::dev_cluster::DevClusterArgs>),
}

/// Runs a command: each group in its module.
async fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Serve(a) => serve::run(*a).await,
        Cmd::Status(c) => client::fleet::status(c).await,
        Cmd::Tenant(cmd) => client::tenant::run(cmd).await,
        Cmd::Node(cmd) => client::fleet::node(cmd).await,
        Cmd::Gpu(cmd) => client::fleet::gpu(cmd).await,
        Cmd::Plan(cmd) => client::plan::plan(cmd).await,
        Cmd::Audit(cmd) => client::plan::audit(cmd).await,
        Cmd::Member(cmd) => client::fleet::member(cmd).await,
        Cmd::Certs(cmd) => certs::run(cmd).await,
        Cmd::DevCluster(a) => dev_cluster(a).await,
    }
}

/// `coordinator dev-cluster`: 3 replicas in this process until Ctrl-C.
async fn dev_cluster(a: Box<tessera_coordinator::dev_cluster::DevClusterArgs>) -> anyhow::Result<()> {
    let c = tessera_coordinator::dev_cluster::start(&a).await?;
    for (i, e) in c.endpoints.iter().enumerate() {
        println!("coordinator id={} addr={e}", i + 1);
    }
    // replay adopts the cluster's planning settings: the command needs none of them.
    println!("ready: replay --mode cluster --coordinator {} (Ctrl-C stops the cluster)", c.endpoints.join(","));
    tokio::signal::ctrl_c().await?;
    c.stop().await;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let (code, message) = report(&e);
            eprintln!("error: {message}");
            ExitCode::from(code)
        }
    }
}
