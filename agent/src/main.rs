//! `agent`: the Tessera node agent's command line. Thin: parses arguments and calls the library.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use tessera_agent::backend::MigBackend;
use tessera_agent::config::{BackendKind, load_agent_config};
use tessera_agent::mig_tools::{self, LayoutsOptions, MigToolError};
use tessera_agent::reconcile::Reconciler;
use tessera_agent::runtime;
use tessera_agent::supervisor::Supervisor;
use tessera_core::reconfig::ReconfigLatency;

#[derive(Parser)]
#[command(name = "agent", version, about = "Tessera node agent and MIG tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the node agent: reconcile loop, gRPC service and coordinator client over the node's GPUs.
    Run(RunArgs),
    /// Inspect the MIG model: profiles, valid layouts, reconfiguration steps, mig-parted files. No GPU needed.
    #[command(subcommand)]
    Mig(Mig),
}

#[derive(Subcommand)]
enum Mig {
    /// Print the GPU-instance profiles of a GPU model.
    Profiles {
        #[command(flatten)]
        gpu: Gpu,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print every valid layout (one per line as `profile@start ...`), or their number.
    Layouts {
        #[command(flatten)]
        gpu: Gpu,
        /// Only maximal layouts (nothing more fits).
        #[arg(long)]
        maximal: bool,
        /// Include the double-memory 1g profile (`1g.2x`, e.g. 1g.10gb on A100-40GB).
        #[arg(long)]
        with_double_memory: bool,
        /// Include every profile, also the media-extension 1g (`1g+me`).
        #[arg(long, conflicts_with = "with_double_memory")]
        all_profiles: bool,
        /// Print how many layouts and profile multisets there are instead of the layouts.
        #[arg(long)]
        count: bool,
        /// Write profiles with the model's nvidia-smi names (`3g.20gb@4`).
        #[arg(long)]
        nvidia_names: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Check a layout, e.g. "4g@0 2g@4 1g@6", and show its slice map.
    Validate {
        #[command(flatten)]
        gpu: Gpu,
        /// The layout.
        layout: String,
    },
    /// Print the ordered steps that turn one layout into another.
    Diff {
        #[command(flatten)]
        gpu: Gpu,
        /// Current layout, e.g. "3g@0 3g@4" ("-" for none).
        #[arg(long)]
        from: String,
        /// Target layout, e.g. "4g@0 2g@4 1g@6".
        #[arg(long)]
        to: String,
        /// Seconds to create a GPU instance and its compute instance.
        #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
        create_s: f64,
        /// Seconds to destroy one.
        #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
        destroy_s: f64,
        /// Seconds from creation until the instance serves (context and model load).
        #[arg(long, default_value_t = 4.0, allow_negative_numbers = true)]
        warmup_s: f64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Read a mig-parted config file and print each configuration with explicit placements.
    Import {
        #[command(flatten)]
        gpu: Gpu,
        /// The mig-parted YAML file.
        #[arg(long)]
        file: String,
        /// Only this configuration (default: all).
        #[arg(long)]
        config: Option<String>,
    },
    /// Read every GPU's profile table from the driver (read-only: nothing is changed) and print it as JSON with
    /// its differences from the catalog (`agent mig profiles`). Needs the `nvml` feature and a driver.
    Probe {
        /// The MIG backend (`nvml`).
        #[arg(long, default_value = "nvml")]
        backend: String,
    },
    /// Write a mig-parted config file that applies a layout to all devices.
    Export {
        #[command(flatten)]
        gpu: Gpu,
        /// The layout.
        #[arg(long)]
        layout: String,
        /// The configuration's name.
        #[arg(long, default_value = "tessera")]
        name: String,
    },
}

#[derive(Args)]
struct RunArgs {
    /// The agent's configuration (see configs/agent.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The MIG backend, overriding the configuration's (`nvml`).
    #[arg(long)]
    backend: Option<String>,
}

#[derive(Args)]
struct Gpu {
    /// GPU model: A100-40GB, A100-80GB, H100-80GB, H200-141GB, B200-180GB (or an nvidia-smi name).
    #[arg(long = "gpu", value_name = "MODEL")]
    model: String,
}

fn seconds_to_ms(flag: &str, s: f64) -> Result<u64, String> {
    if s.is_finite() && s >= 0.0 {
        Ok((s * 1000.0).round() as u64)
    } else {
        Err(format!("{flag}: {s} is not a duration in seconds"))
    }
}

/// Loads the MIG backend. NVML is initialised first, so that a node without a driver is told so before anything
/// else is read.
fn backend(kind: BackendKind) -> Result<Arc<dyn MigBackend>, String> {
    match kind {
        #[cfg(feature = "nvml")]
        BackendKind::Nvml => match tessera_agent::nvml::NvmlBackend::init() {
            Ok(b) => Ok(Arc::new(b)),
            Err(e) => Err(e.to_string()),
        },
        #[cfg(not(feature = "nvml"))]
        BackendKind::Nvml => Err("NVML could not be loaded: this agent was built without the `nvml` feature \
                                  (cargo build -p tessera-agent --features nvml)"
            .to_string()),
    }
}

fn run_agent(args: RunArgs) -> Result<(), String> {
    let config = args.config.as_deref().map(load_agent_config).transpose().map_err(|e| e.to_string())?;
    let kind: BackendKind = match (&args.backend, &config) {
        (Some(b), _) => b.parse().map_err(|e| format!("--backend: {e}"))?,
        (None, Some(c)) => c.backend,
        (None, None) => BackendKind::Nvml,
    };
    let backend = backend(kind)?;
    let config = config.ok_or("--config is required (see configs/agent.toml)")?;
    let service = tessera_telemetry::Service::new("tessera-agent", &config.node_id);
    let telemetry =
        tessera_telemetry::init(config.otlp_endpoint.as_deref(), &service, tessera_telemetry::LevelFilter::INFO)
            .map_err(|e| format!("tracing: {e:#}"))?;
    // The driver is the source of truth for the GPU: every difference from the built-in catalog is logged.
    match mig_tools::probe(backend.as_ref()) {
        Ok(gpus) => {
            for g in gpus {
                for d in &g.differences {
                    tracing::warn!(gpu = g.index, name = %g.name, "the driver's MIG table differs from the catalog: {d}");
                }
                if let Some(e) = &g.error {
                    tracing::warn!(gpu = g.index, "cannot read the driver's MIG table: {e}");
                }
            }
        }
        Err(e) => tracing::warn!("cannot read the driver's MIG tables: {e}"),
    }
    // The serving stack's request counters ([load]): scraped, and taken from ReportLoad.
    let load = config.load.as_ref().map(|_| Arc::new(tessera_agent::load::LoadSignal::default()));
    // Tenants with jobs get them run on their instances; the others are recorded only (bookkeeping).
    // A new job's instance counts as serving once front ends could have learned its endpoint: a heartbeat later.
    let settle = config.runtime.coordinator.as_ref().map_or(tessera_agent::supervisor::DEFAULT_SETTLE, |c| {
        c.heartbeat_interval + std::time::Duration::from_millis(500)
    });
    let workload = Supervisor::open(
        config.node_id.clone(),
        &config.data_dir.join("jobs"),
        load.clone(),
        settle,
        config.jobs.clone(),
    )
    .map_err(|e| e.to_string())?;
    let reconciler =
        Reconciler::new(config.node_id.clone(), backend, workload, &config.data_dir).map_err(|e| e.to_string())?;
    let runtime = tokio::runtime::Runtime::new().map_err(|e| format!("cannot start the async runtime: {e}"))?;
    let result = runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        tracing::info!(node = %config.node_id, %addr, "agent serving");
        let mut options = config.runtime;
        let (_stop_load, stop_rx) = tokio::sync::watch::channel(false);
        if let (Some(signal), Some(load)) = (load, config.load)
            && !load.sources.is_empty()
        {
            tracing::info!(sources = load.sources.len(), interval = ?load.interval, "reading load endpoints");
            tokio::spawn(tessera_agent::load::scrape_loop(load, signal, stop_rx));
        }
        if let Some(at) = config.metrics_listen {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| format!("cannot listen on {at} for /metrics: {e}"))?;
            let metrics = Arc::new(tessera_agent::metrics::AgentMetrics::new());
            options.metrics = Some(tessera_agent::metrics::SharedMetrics(metrics.clone()));
            tracing::info!(addr = %l.local_addr().map_err(|e| e.to_string())?, "serving /metrics");
            tokio::spawn(async move {
                if let Err(e) = tessera_metrics::serve(l, metrics).await {
                    tracing::error!(error = %e, "the /metrics server stopped");
                }
            });
        }
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        runtime::run(Arc::new(reconciler), listener, options, shutdown).await.map_err(|e| e.to_string())
    });
    if let Some(t) = telemetry {
        t.shutdown();
    }
    result
}

fn run(cmd: Mig) -> Result<String, String> {
    let e = |e: MigToolError| e.to_string();
    Ok(match cmd {
        Mig::Profiles { gpu, json } => mig_tools::profiles(mig_tools::gpu_model(&gpu.model).map_err(e)?, json),
        Mig::Layouts { gpu, maximal, with_double_memory, all_profiles, count, nvidia_names, json } => {
            let model = mig_tools::gpu_model(&gpu.model).map_err(e)?;
            mig_tools::layouts(
                model,
                LayoutsOptions { maximal, with_double_memory, all_profiles, count, nvidia_names, json },
            )
        }
        Mig::Validate { gpu, layout } => {
            let model = mig_tools::gpu_model(&gpu.model).map_err(e)?;
            mig_tools::validate(model, &mig_tools::layout_arg("layout", &layout, model).map_err(e)?)
        }
        Mig::Diff { gpu, from, to, create_s, destroy_s, warmup_s, json } => {
            let model = mig_tools::gpu_model(&gpu.model).map_err(e)?;
            let from = mig_tools::layout_arg("--from", &from, model).map_err(e)?;
            let to = mig_tools::layout_arg("--to", &to, model).map_err(e)?;
            let latency = ReconfigLatency {
                create_ms: seconds_to_ms("--create-s", create_s)?,
                destroy_ms: seconds_to_ms("--destroy-s", destroy_s)?,
                warmup_ms: seconds_to_ms("--warmup-s", warmup_s)?,
            };
            mig_tools::diff_text(model, &from, &to, &latency, json).map_err(e)?
        }
        Mig::Import { gpu, file, config } => {
            let model = mig_tools::gpu_model(&gpu.model).map_err(e)?;
            mig_tools::import(model, &file, config.as_deref()).map_err(e)?
        }
        Mig::Probe { backend: kind } => {
            let kind: BackendKind = kind.parse().map_err(|e| format!("--backend: {e}"))?;
            let gpus = mig_tools::probe(backend(kind)?.as_ref()).map_err(|e| e.to_string())?;
            mig_tools::probe_json(&gpus)
        }
        Mig::Export { gpu, layout, name } => {
            let model = mig_tools::gpu_model(&gpu.model).map_err(e)?;
            mig_tools::export(model, &mig_tools::layout_arg("--layout", &layout, model).map_err(e)?, &name)
        }
    })
}

fn main() -> ExitCode {
    let cli = match tessera_agent::cli::parse_or_exit::<Cli>() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let cmd = match cli.command {
        Command::Mig(cmd) => cmd,
        Command::Run(args) => {
            return match run_agent(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(msg) => {
                    eprintln!("error: {msg}");
                    ExitCode::FAILURE
                }
            };
        }
    };
    match run(cmd) {
        Ok(out) => match tessera_agent::cli::print_stdout(&out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: cannot write to stdout: {e}");
                ExitCode::FAILURE
            }
        },
        Err(msg) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
    }
}
