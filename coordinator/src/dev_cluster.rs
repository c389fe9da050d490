//! A development cluster: several coordinator replicas in one process, each with its own sled directory, gRPC
//! server and Raft transport over loopback, for trying Tessera out and for driving it from replay
//! (`replay --mode cluster`) and from tests. Started by `coordinator dev-cluster`; simulated GPU nodes join it with
//! `sim-agent run --coordinator ADDR`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tessera_planner::settings::RoundArgs;
use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;

use crate::config::{CoordinatorConfig, Overrides};

/// `coordinator dev-cluster`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct DevClusterArgs {
    /// Coordinator nodes.
    #[arg(long, default_value_t = 3)]
    pub coordinators: u64,
    /// Address of coordinator 1; coordinator i listens on the next ports (port 0: free ports).
    #[arg(long, default_value = "127.0.0.1:7001")]
    pub listen_base: std::net::SocketAddr,
    /// Where the coordinators keep their sled files (default: a new temporary directory, removed on exit).
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<std::path::PathBuf>,
    /// Planner policy of the cluster.
    #[arg(long, default_value = tessera_planner::policies::DEFAULT_POLICY)]
    pub policy: String,
    /// The interference table to plan with, as `sim-agent interference` prints it (give `replay --mode cluster` a
    /// matching --tlb; replay in-process computes the same table from the TLB model).
    #[arg(long, value_name = "FILE")]
    pub interference: Option<std::path::PathBuf>,
    /// Workload clock: virtual (replay drives it) or wall.
    #[arg(long, default_value = "virtual")]
    pub clock: String,
    /// Model profiles.
    #[arg(long, default_value = "configs/models", value_name = "DIR")]
    pub models: std::path::PathBuf,
    /// OTLP endpoint for the coordinators' traces.
    #[arg(long)]
    pub otlp_endpoint: Option<String>,
    /// The planning settings of every replica (`replay --mode cluster` adopts them: `coordinator status` shows them).
    #[command(flatten)]
    pub round: RoundArgs,
}

/// A development cluster started by [`start`].
pub struct DevCluster {
    /// Coordinator addresses, in id order.
    pub endpoints: Vec<String>,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _tmp: Option<tempfile::TempDir>,
}

impl DevCluster {
    /// Stops every node and waits for them.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

/// Starts `args.coordinators` coordinator replicas in this process (each with its own sled directory and gRPC
/// server) and waits for a leader.
pub async fn start(args: &DevClusterArgs) -> anyhow::Result<DevCluster> {
    if args.coordinators == 0 {
        anyhow::bail!("--coordinators: must be at least 1");
    }
    let (tmp, dir) = match &args.data_dir {
        Some(d) => (None, d.clone()),
        None => {
            let t = tempfile::tempdir().map_err(|e| anyhow::anyhow!("cannot make a temporary directory: {e}"))?;
            let p = t.path().to_path_buf();
            (Some(t), p)
        }
    };
    // Every replica's listener is bound (and held) before any replica starts: a port chosen and released here could
    // otherwise be taken by a replica's outgoing connection to a peer that is not listening yet.
    let mut addrs = BTreeMap::new();
    let mut listeners = BTreeMap::new();
    for i in 0..args.coordinators {
        let mut a = args.listen_base;
        if a.port() != 0 {
            a.set_port(a.port() + i as u16);
        }
        let l =
            std::net::TcpListener::bind(a).map_err(|e| anyhow::anyhow!("--listen-base: cannot listen on {a}: {e}"))?;
        l.set_nonblocking(true)?;
        addrs.insert(i + 1, l.local_addr()?.to_string());
        listeners.insert(i + 1, l);
    }
    let peers = addrs.iter().map(|(i, a)| format!("{i}={a}")).collect::<Vec<_>>().join(",");
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let mut tasks = Vec::new();
    for (id, addr) in &addrs {
        let over = Overrides {
            id: Some(*id),
            listen: Some(addr.clone()),
            peers: Some(peers.clone()),
            data_dir: Some(dir.join(format!("coordinator-{id}")).to_string_lossy().into_owned()),
            policy: Some(args.policy.clone()),
            round: args.round.clone(),
            models_dir: Some(args.models.to_string_lossy().into_owned()),
            clock: Some(args.clock.clone()),
            otlp_endpoint: args.otlp_endpoint.clone(),
            interference: args.interference.as_ref().map(|p| p.to_string_lossy().into_owned()),
            ..Overrides::default()
        };
        let config = CoordinatorConfig::load(None, &over).map_err(|e| anyhow::anyhow!("{e}"))?;
        let listener = tokio::net::TcpListener::from_std(listeners.remove(id).expect("one listener per replica"))?;
        let mut stop = stop_rx.clone();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        tasks.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            let r = crate::server::serve_on(config, listener, shutdown, move |_, a, _| {
                let _ = ready_tx.send(a);
            })
            .await;
            if let Err(e) = r {
                eprintln!("coordinator dev-cluster: replica stopped: {e:#}");
            }
        }));
        ready_rx.await.map_err(|_| anyhow::anyhow!("coordinator {id} did not start (see above)"))?;
    }
    let endpoints: Vec<String> = addrs.values().cloned().collect();
    // Wait for a leader (its model profiles are loaded right after it is elected).
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", endpoints[0]))?.connect().await?;
    let mut api = CoordinatorApiClient::new(channel);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = api
            .cluster_status(v1::ClusterStatusRequest {})
            .await
            .map_err(|s| anyhow::anyhow!("status: {}", s.message()))?;
        if s.get_ref().leader_id != 0 {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!("no coordinator leader within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(DevCluster { endpoints, stop, tasks, _tmp: tmp })
}
