//! Simulated nodes: each a real agent (reconcile loop, gRPC `Agent` service, coordinator client from
//! `tessera-agent`) over simulated GPUs, many in one process (`sim-agent run`).
//!
//! ```text
//! sim-agent run --nodes 4 --gpus-per-node 8 --gpu-model A100-40GB [--listen-base 127.0.0.1:0]
//!               [--clock wall|virtual] [--coordinator ADDR] [--state-dir DIR]
//! ```
//!
//! On start it prints one line per node on stdout, `node=<id> addr=<host:port>`, then serves until interrupted.
//! With a listen port of 0 every node gets a free port; with port P node i listens on P + i.
//!
//! ## Parts
//! - [`PersistentSim`]: the node's [`SimBackend`] behind the agent's `MigBackend`, writing the simulated hardware
//!   (MIG mode and instances of every GPU) to `sim-gpus.json` in the node's directory after every change, so a
//!   `sim-agent` restarted over the same `--state-dir` finds its GPUs as it left them, as a restarted agent finds
//!   real ones. The state is written when the simulated driver has acted, before the call's latency has passed, so
//!   a process killed during a create finds the instance there. Restored instances keep their placements; NVML ids
//!   are drawn again (lowest free per size class), so an id can differ after a restart where ids had holes.
//! - [`SimWorkload`]: the agent's `Workload` for a simulated node. It tracks which work is loaded on which
//!   instance, marks loaded instances busy on the simulated GPU (so destroying one that was not drained fails
//!   with `NVML_ERROR_IN_USE`), warms work up in `warmup_ms` of workload time, checkpoints retraining progress
//!   on drain (progress: 7g GPU-seconds, an instance of g compute slices adding g/7 per second), and counts
//!   requests delivered by the `Arrive` RPC: served when the tenant has a warm inference instance, dropped
//!   otherwise. It does not model latency or queues (those are the workload executor's, `crate::executor`, used by
//!   replay in-process); its queue lengths are always 0.
//! - Workload time is the wall clock (`--clock wall`) or a [`VirtualClock`] moved by the `AdvanceClock` RPC
//!   (`--clock virtual`, for replay); simulated MIG latencies follow it.
//!
//! What it does not do: simulate GPU failures or resets (the device module can; nothing drives them here).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};
use tessera_agent::backend::{BackendError, GpuInfo, GpuInstance, InstanceId, MigBackend, MigMode};
use tessera_agent::coordinator::ClientOptions;
use tessera_agent::reconcile::{ReconcileError, Reconciler};
use tessera_agent::runtime::{self, RuntimeOptions};
use tessera_agent::workload::{TenantCounters, Workload, WorkloadError, WorkloadMetrics};
use tessera_core::catalog::GpuModel;
use tessera_core::ids::{MigUuid, NodeId, TenantId};
use tessera_core::layout::Placement;
use tessera_core::plan::Role;
use tessera_core::reconfig::{ReconfigLatency, Work};
use tessera_core::time::SimTime;

use crate::device::{Clock, SimBackend, SimGpu, VirtualClock, WallClock};

/// The file a node's simulated hardware is kept in.
pub const SIM_STATE_FILE: &str = "sim-gpus.json";

/// The file a node appends its MIG changes to, one JSON object a line (see [`MigChangeLog`]).
pub const MIG_CHANGES_FILE: &str = "mig-changes.jsonl";

/// An append-only record of the instances each reconcile step created and destroyed, with the target the agent
/// worked towards, so that a fault test can check from outside that the agent never touched an instance its target
/// keeps: `{"gpu", "epoch", "created": [...], "destroyed": [...], "kept_destroyed": [...]}`, where `kept_destroyed`
/// lists destroyed placements that the target has (there should never be any). Read in the node's directory; it
/// survives restarts, like the simulated hardware.
pub struct MigChangeLog {
    file: Mutex<std::fs::File>,
    /// Per GPU, the placements seen after the last step.
    seen: Mutex<BTreeMap<u32, Vec<Placement>>>,
}

impl MigChangeLog {
    /// Opens (appending) the log at `path`, starting from the instances `sim` has now.
    pub fn open(path: &Path, sim: &SimBackend) -> Result<MigChangeLog, NodeError> {
        let io = |e: std::io::Error| NodeError::Io { path: path.to_path_buf(), message: format!("cannot open: {e}") };
        let file = std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(io)?;
        let mut seen = BTreeMap::new();
        for g in sim.gpus().unwrap_or_default() {
            let placements =
                sim.instances(g.index).map(|v| v.iter().map(|i| i.placement).collect()).unwrap_or_default();
            seen.insert(g.index, placements);
        }
        Ok(MigChangeLog { file: Mutex::new(file), seen: Mutex::new(seen) })
    }

    /// The step observer: records what changed on `gpu` since its last step, if anything did.
    pub fn observe(&self, gpu: u32, status: &tessera_agent::reconcile::GpuStatus) {
        let now: Vec<Placement> = status.instances.iter().map(|i| i.instance.placement).collect();
        let before = lock(&self.seen).insert(gpu, now.clone()).unwrap_or_default();
        let created: Vec<String> = now.iter().filter(|p| !before.contains(p)).map(ToString::to_string).collect();
        let destroyed: Vec<Placement> = before.iter().filter(|p| !now.contains(p)).copied().collect();
        if created.is_empty() && destroyed.is_empty() {
            return;
        }
        let target = status.target.as_ref();
        let kept: Vec<String> = destroyed
            .iter()
            .filter(|p| target.is_some_and(|t| t.plan.layout.placements().contains(p)))
            .map(ToString::to_string)
            .collect();
        let line = serde_json::json!({
            "gpu": gpu,
            "epoch": target.map_or(0, |t| t.epoch),
            "created": created,
            "destroyed": destroyed.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "kept_destroyed": kept,
        });
        if let Err(e) = writeln!(lock(&self.file), "{line}") {
            tracing::warn!(error = %e, "cannot append to {MIG_CHANGES_FILE}");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Workload time of a node.
#[derive(Clone)]
pub enum NodeClock {
    /// The wall clock.
    Wall(Arc<WallClock>),
    /// Virtual time, moved by the `AdvanceClock` RPC.
    Virtual(Arc<VirtualClock>),
}

impl NodeClock {
    /// A new clock of the kind: the wall clock reading 0 now, or virtual time 0.
    pub fn new(kind: ClockKind) -> NodeClock {
        match kind {
            ClockKind::Wall => NodeClock::Wall(Arc::new(WallClock::new())),
            ClockKind::Virtual => NodeClock::Virtual(Arc::new(VirtualClock::new(SimTime::ZERO))),
        }
    }

    /// As the device's clock trait.
    pub fn as_clock(&self) -> Arc<dyn Clock> {
        match self {
            NodeClock::Wall(c) => c.clone(),
            NodeClock::Virtual(c) => c.clone(),
        }
    }
}

/// `--clock`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockKind {
    /// Workload time follows the wall clock.
    Wall,
    /// Workload time moves only through the AdvanceClock RPC.
    Virtual,
}

/// The simulated hardware of a node as written to [`SIM_STATE_FILE`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedGpu {
    index: u32,
    model: GpuModel,
    mig: MigMode,
    instances: Vec<(InstanceId, Placement)>,
    /// The instances' MIG UUIDs (absent in files written before UUIDs were simulated: new ones are drawn).
    #[serde(default)]
    uuids: Vec<(InstanceId, MigUuid)>,
    /// UUIDs drawn so far, so that a restored GPU draws new ones.
    #[serde(default)]
    uuids_drawn: u64,
}

/// Why a node's simulated hardware could not be restored or saved.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// An I/O error.
    #[error("{}: {message}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The saved hardware does not match the command line, or cannot be rebuilt.
    #[error("{}: {message}", path.display())]
    Restore {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The agent could not start.
    #[error(transparent)]
    Agent(#[from] ReconcileError),
}

/// A node's simulated GPUs, persisted after every change: see the [module documentation](self).
pub struct PersistentSim {
    sim: Arc<SimBackend>,
    file: Option<PathBuf>,
    save_lock: Mutex<()>,
}

impl PersistentSim {
    /// `gpus` GPUs of `model` on `clock`; with `dir`, restored from (and saved to) its [`SIM_STATE_FILE`].
    /// `uuid_seed` seeds the instances' MIG UUIDs (give each node its own, e.g. [`uuid_seed`] of its id).
    pub fn open(
        gpus: u32,
        model: GpuModel,
        clock: Arc<dyn Clock>,
        dir: Option<&Path>,
        uuid_seed: u64,
    ) -> Result<PersistentSim, NodeError> {
        let file = dir.map(|d| d.join(SIM_STATE_FILE));
        let saved: Option<Vec<SavedGpu>> = match &file {
            Some(path) if path.exists() => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| NodeError::Io { path: path.clone(), message: format!("cannot read: {e}") })?;
                Some(serde_json::from_str(&text).map_err(|e| NodeError::Restore {
                    path: path.clone(),
                    message: format!("not a simulated-hardware file: {e}"),
                })?)
            }
            _ => None,
        };
        let devices = match saved {
            None => (0..gpus).map(|i| SimGpu::new(i, model).with_uuid_seed(gpu_seed(uuid_seed, i))).collect(),
            Some(saved) => {
                let path = file.clone().unwrap_or_default();
                let restore = |message: String| NodeError::Restore { path: path.clone(), message };
                if saved.len() != gpus as usize || saved.iter().any(|g| g.model != model) {
                    return Err(restore(format!(
                        "it holds {} GPU(s) of {:?}, the command line asks for {gpus} {model}; use another --state-dir",
                        saved.len(),
                        saved.iter().map(|g| g.model.to_string()).collect::<Vec<_>>()
                    )));
                }
                saved
                    .iter()
                    .map(|g| restore_gpu(g, gpu_seed(uuid_seed, g.index)).map_err(|e| restore(e.to_string())))
                    .collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(PersistentSim { sim: Arc::new(SimBackend::new(devices, clock)), file, save_lock: Mutex::new(()) })
    }

    /// The simulated backend.
    pub fn sim(&self) -> &Arc<SimBackend> {
        &self.sim
    }

    fn save(&self) -> Result<(), BackendError> {
        let Some(path) = &self.file else { return Ok(()) };
        let _guard = lock(&self.save_lock);
        let mut saved = Vec::new();
        for info in self.sim.gpus()? {
            let Some(model) = info.model else { continue };
            let (instances, uuids, uuids_drawn) = self.sim.with_gpu(info.index, |g| {
                (
                    g.instances().map(|i| (i.id, i.placement)).collect(),
                    g.instances().map(|i| (i.id, i.uuid)).collect(),
                    g.uuids_drawn(),
                )
            })?;
            saved.push(SavedGpu {
                index: info.index,
                model,
                mig: info.mig.unwrap_or(MigMode::DISABLED),
                instances,
                uuids,
                uuids_drawn,
            });
        }
        let driver = |detail: String| BackendError::Driver {
            gpu: 0,
            operation: tessera_agent::backend::Operation::ListInstances,
            detail: format!("{}: {detail}", path.display()),
        };
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(&saved).map_err(|e| driver(e.to_string()))?;
        std::fs::write(&tmp, text).map_err(|e| driver(format!("cannot write: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| driver(format!("cannot rename: {e}")))
    }
}

/// A node's UUID seed from its id (FNV-1a), so that nodes of one fleet draw distinct MIG UUIDs.
pub fn uuid_seed(node: &NodeId) -> u64 {
    node.as_str().bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The seed of GPU `index` of a node seeded `seed`.
fn gpu_seed(seed: u64, index: u32) -> u64 {
    seed ^ u64::from(index).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// A saved GPU the simulator refuses to rebuild.
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    /// An instance of the saved layout cannot be created.
    #[error("GPU {gpu}: cannot restore {id} at {placement}: {source}")]
    Instance {
        /// The GPU's index.
        gpu: u32,
        /// The instance's id.
        id: String,
        /// Its placement.
        placement: String,
        /// Why.
        source: BackendError,
    },
    /// The pending MIG mode cannot be set again.
    #[error("GPU {gpu}: cannot restore the MIG mode: {source}")]
    Mode {
        /// The GPU's index.
        gpu: u32,
        /// Why.
        source: BackendError,
    },
}

/// Rebuilds a GPU from its saved state: instances recreated in id order (with their UUIDs), without charging MIG
/// latency.
fn restore_gpu(g: &SavedGpu, seed: u64) -> Result<SimGpu, RestoreError> {
    let zero = ReconfigLatency { create_ms: 0, destroy_ms: 0, warmup_ms: 0 };
    let gpu = if g.mig.current { SimGpu::new(g.index, g.model) } else { SimGpu::mig_disabled(g.index, g.model) };
    let mut gpu = gpu.with_uuid_seed(seed);
    let latency = gpu.latency();
    gpu = gpu.with_latency(zero);
    let mut instances = g.instances.clone();
    instances.sort();
    for (id, p) in instances {
        gpu.create(SimTime::ZERO, p).map_err(|source| RestoreError::Instance {
            gpu: g.index,
            id: id.to_string(),
            placement: p.to_string(),
            source,
        })?;
    }
    gpu.restore_uuids(g.uuids_drawn, &g.uuids);
    if g.mig.pending != g.mig.current {
        gpu.set_driver_client(true);
        gpu.set_mig_mode(g.mig.pending).map_err(|source| RestoreError::Mode { gpu: g.index, source })?;
        gpu.set_driver_client(false);
    }
    Ok(gpu.with_latency(latency))
}

impl MigBackend for PersistentSim {
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.sim.gpus()
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, BackendError> {
        self.sim.instances(gpu)
    }

    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<GpuInstance, BackendError> {
        // As SimBackend::create_instance, with the state saved once the simulated driver has acted.
        let result = self.sim.with_gpu_mut(gpu, |g, now| g.create(now, placement))?;
        self.save()?;
        let created = result?;
        self.sim.clock().wait_until(created.available_at);
        Ok(created.as_gpu_instance())
    }

    fn destroy_instance(&self, gpu: u32, instance: InstanceId) -> Result<(), BackendError> {
        // As the driver: an instance that host processes run on (see `tessera_agent::procs`) is in use.
        if let Some(found) = self.sim.with_gpu(gpu, |g| g.instance(instance).copied())?
            && !tessera_agent::procs::processes_using(&found.uuid).is_empty()
        {
            return Err(BackendError::InUse { gpu, instance, placement: found.placement });
        }
        let result = self.sim.with_gpu_mut(gpu, |g, now| g.destroy(now, instance))?;
        self.save()?;
        let timing = result?;
        self.sim.clock().wait_until(timing.done_at);
        Ok(())
    }

    fn processes(&self, gpu: u32, instance: &GpuInstance) -> Result<Vec<u32>, BackendError> {
        let uuid = self.sim.with_gpu(gpu, |g| g.instance(instance.id).map(|i| i.uuid))?;
        Ok(uuid.map(|u| tessera_agent::procs::processes_using(&u)).unwrap_or_default())
    }

    fn driver_table(&self, gpu: u32) -> Result<Option<tessera_core::driver::DriverTable>, BackendError> {
        self.sim.driver_table(gpu)
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode, BackendError> {
        let result = self.sim.set_mig_mode(gpu, enabled);
        self.save()?;
        result
    }
}

#[derive(Debug, Clone)]
struct Loaded {
    work: Vec<Work>,
    /// When the work serves: loaded time plus the GPU's warm-up.
    warm_at: SimTime,
    compute_slices: u8,
}

#[derive(Debug, Default)]
struct Tracker {
    loaded: BTreeMap<(u32, Placement), Loaded>,
    counters: BTreeMap<TenantId, TenantCounters>,
    /// Retraining progress checkpointed by drains, 7g GPU-seconds.
    checkpoint_gpu_s: BTreeMap<TenantId, f64>,
}

/// The workload tracker of a simulated node: see the [module documentation](self).
pub struct SimWorkload {
    sim: Arc<SimBackend>,
    clock: NodeClock,
    state: Mutex<Tracker>,
}

impl SimWorkload {
    /// A tracker over the node's simulated GPUs and clock.
    pub fn new(sim: Arc<SimBackend>, clock: NodeClock) -> SimWorkload {
        SimWorkload { sim, clock, state: Mutex::new(Tracker::default()) }
    }

    fn now(&self) -> SimTime {
        self.clock.as_clock().now()
    }

    /// 7g GPU-seconds an instance's retraining has done since it became warm, up to `now`.
    fn running_gpu_s(l: &Loaded, now: SimTime) -> f64 {
        let ms = now.saturating_since(l.warm_at);
        ms as f64 / 1000.0 * f64::from(l.compute_slices) / 7.0
    }
}

impl Workload for SimWorkload {
    fn loaded(&self, gpu: u32) -> BTreeMap<Placement, Vec<Work>> {
        lock(&self.state)
            .loaded
            .iter()
            .filter(|((g, _), _)| *g == gpu)
            .map(|((_, p), l)| (*p, l.work.clone()))
            .collect()
    }

    fn load(&self, gpu: u32, instance: &GpuInstance, work: &[Work]) -> Result<(), WorkloadError> {
        let err = |message: String| WorkloadError::Instance { gpu, placement: instance.placement, message };
        let (available_at, warmup_ms) = self
            .sim
            .with_gpu(gpu, |g| g.instance(instance.id).map(|i| (i.available_at, g.latency().warmup_ms)))
            .map_err(|e| err(e.to_string()))?
            .ok_or_else(|| err(format!("{} does not exist", instance.id)))?;
        self.sim.set_busy(gpu, instance.id, !work.is_empty()).map_err(|e| err(e.to_string()))?;
        let mut state = lock(&self.state);
        if work.is_empty() {
            state.loaded.remove(&(gpu, instance.placement));
            return Ok(());
        }
        let warm_at = self.now().max(available_at) + warmup_ms;
        let compute_slices = instance.placement.profile.compute_slices();
        state.loaded.insert((gpu, instance.placement), Loaded { work: work.to_vec(), warm_at, compute_slices });
        Ok(())
    }

    fn drain(&self, gpu: u32, instance: &GpuInstance) -> Result<(), WorkloadError> {
        let now = self.now();
        let mut state = lock(&self.state);
        // Stop routing: the instance leaves the tracker at once, so no request is sent to it. Requests are served
        // on arrival here, so none is in flight; retraining progress is checkpointed for the tenant.
        if let Some(l) = state.loaded.remove(&(gpu, instance.placement)) {
            for w in l.work.iter().filter(|w| w.role == Role::Retraining) {
                *state.checkpoint_gpu_s.entry(w.tenant.clone()).or_default() += Self::running_gpu_s(&l, now);
            }
        }
        drop(state);
        match self.sim.set_busy(gpu, instance.id, false) {
            Ok(()) | Err(BackendError::NotFound { .. }) => Ok(()),
            Err(e) => Err(WorkloadError::Instance { gpu, placement: instance.placement, message: e.to_string() }),
        }
    }

    fn ready(&self, gpu: u32, placement: Placement) -> bool {
        let now = self.now();
        lock(&self.state).loaded.get(&(gpu, placement)).is_some_and(|l| l.warm_at <= now)
    }

    fn retain(&self, gpu: u32, live: &[Placement]) {
        lock(&self.state).loaded.retain(|(g, p), _| *g != gpu || live.contains(p));
    }

    fn metrics(&self) -> WorkloadMetrics {
        let now = self.now();
        let state = lock(&self.state);
        let mut tenants = state.counters.clone();
        for (t, gpu_s) in &state.checkpoint_gpu_s {
            tenants.entry(t.clone()).or_default().retraining_done_gpu_s += gpu_s;
        }
        for l in state.loaded.values() {
            for w in &l.work {
                let c = tenants.entry(w.tenant.clone()).or_default();
                match w.role {
                    Role::Inference if l.warm_at <= now => c.serving_instances += 1,
                    Role::Inference => {}
                    Role::Retraining => {
                        c.retraining_instances += 1;
                        c.retraining_done_gpu_s += Self::running_gpu_s(l, now);
                    }
                }
            }
        }
        WorkloadMetrics { now_ms: now.as_ms(), tenants }
    }

    fn now_ms(&self) -> u64 {
        self.now().as_ms()
    }

    fn advance_to(&self, to_ms: u64) -> Result<u64, WorkloadError> {
        match &self.clock {
            NodeClock::Virtual(c) => Ok(c.advance_to(SimTime::from_ms(to_ms)).as_ms()),
            NodeClock::Wall(_) => Err(WorkloadError::WallClock),
        }
    }

    fn arrive(&self, tenant: &TenantId, count: u64) -> Result<(), WorkloadError> {
        let now = self.now();
        let mut state = lock(&self.state);
        let serving = state
            .loaded
            .values()
            .any(|l| l.warm_at <= now && l.work.iter().any(|w| &w.tenant == tenant && w.role == Role::Inference));
        let c = state.counters.entry(tenant.clone()).or_default();
        c.arrivals += count;
        if serving {
            c.served_within_slo += count;
        } else {
            c.dropped += count;
        }
        Ok(())
    }
}

/// `sim-agent run`'s arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// How many simulated nodes (each a real agent with its own gRPC endpoint).
    #[arg(long, default_value_t = 1)]
    pub nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: u32,
    /// GPU model of every GPU: A100-40GB, A100-80GB, H100-80GB, H200-141GB, B200-180GB.
    #[arg(long, default_value = "A100-40GB")]
    pub gpu_model: String,
    /// Address of the first node; port 0 gives every node a free port, port P gives node i port P + i.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen_base: SocketAddr,
    /// The host name or address the coordinator reaches the nodes at (each node registers `HOST:PORT` with its
    /// own port); default: the address each node listens on. Needed when listening on 0.0.0.0 (a container).
    #[arg(long, value_name = "HOST")]
    pub advertise_host: Option<String>,
    /// Workload time: the wall clock, or virtual time moved by the AdvanceClock RPC.
    #[arg(long, value_enum, default_value_t = ClockKind::Wall)]
    pub clock: ClockKind,
    /// The coordinator each node registers with and heartbeats to (a cluster's addresses comma-separated: a node
    /// moves on to the next when one fails).
    #[arg(long)]
    pub coordinator: Option<String>,
    /// Where each node keeps its agent state and simulated hardware (`DIR/node-<i>/`); a restart over the same
    /// directory resumes. Default: a new directory under the system's temporary directory.
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Node ids are `<prefix>-<i>`.
    #[arg(long, default_value = "node")]
    pub node_prefix: String,
    /// Mutual TLS from a PKI directory (`coordinator certs init --agent <node-id>`): node `ID` presents
    /// `DIR/ID.pem` and `DIR/ID.key`, trusts `DIR/ca.pem`, and accepts pushes only from coordinator members.
    #[arg(long, value_name = "DIR")]
    pub tls_dir: Option<PathBuf>,
    /// Serve plaintext on an address beyond loopback (anyone who reaches the ports may push layouts).
    #[arg(long)]
    pub insecure: bool,
    /// Serve every node's agent metrics, `/healthz` and `/readyz` here (plain HTTP; series labelled by node).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics_listen: Option<SocketAddr>,
    /// Send every node's spans (reconcile passes, MIG steps) to this OTLP/gRPC collector (`http://HOST:PORT`).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Run the tenants' `serve` and `retrain` jobs as real processes on the simulated instances (the agent's job
    /// supervisor, as on a real node; `standin` is a job to test with) instead of the simulated workload tracker.
    /// Needs the wall clock.
    #[arg(long)]
    pub jobs: bool,
}

/// One simulated node, ready to serve.
pub struct SimNode {
    /// The node's id.
    pub id: NodeId,
    /// Its reconciler (over [`PersistentSim`] and [`SimWorkload`]).
    pub reconciler: Arc<Reconciler>,
    /// Its simulated hardware.
    pub sim: Arc<SimBackend>,
}

impl SimNode {
    /// Builds node `id` with `gpus` GPUs of `model`, its state in `dir` (restored if present).
    pub fn open(id: NodeId, gpus: u32, model: GpuModel, clock: NodeClock, dir: &Path) -> Result<SimNode, NodeError> {
        SimNode::open_with(id, gpus, model, clock, dir, false)
    }

    /// [`SimNode::open`], and with `jobs` the node runs its tenants' jobs as real processes on the simulated
    /// instances through the agent's [`Supervisor`](tessera_agent::supervisor::Supervisor) (state and logs in
    /// `dir/jobs/`), instead of the [`SimWorkload`] tracker. Its simulated driver then counts the processes that
    /// name an instance's MIG UUID as attached to it.
    pub fn open_with(
        id: NodeId,
        gpus: u32,
        model: GpuModel,
        clock: NodeClock,
        dir: &Path,
        jobs: bool,
    ) -> Result<SimNode, NodeError> {
        std::fs::create_dir_all(dir)
            .map_err(|e| NodeError::Io { path: dir.to_path_buf(), message: format!("cannot create: {e}") })?;
        let backend = Arc::new(PersistentSim::open(gpus, model, clock.as_clock(), Some(dir), uuid_seed(&id))?);
        let sim = backend.sim().clone();
        let workload: Arc<dyn Workload> = if jobs {
            // A simulated node exists to run test jobs: it allows every program.
            use tessera_agent::supervisor::{DEFAULT_SETTLE, JobPolicy, Supervisor};
            Supervisor::open(id.clone(), &dir.join("jobs"), None, DEFAULT_SETTLE, JobPolicy::allow_all())
                .map_err(|e| NodeError::Io { path: dir.join("jobs"), message: e.to_string() })?
        } else {
            Arc::new(SimWorkload::new(sim.clone(), clock))
        };
        let log = MigChangeLog::open(&dir.join(MIG_CHANGES_FILE), &sim)?;
        let reconciler = Reconciler::new(id.clone(), backend, workload, dir)?
            .with_observer(Box::new(move |gpu, status| log.observe(gpu, status)));
        Ok(SimNode { id, reconciler: Arc::new(reconciler), sim })
    }
}

fn default_state_dir() -> PathBuf {
    let stamp = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    std::env::temp_dir().join(format!("tessera-sim-{}-{stamp}", std::process::id()))
}

/// Runs `sim-agent run`: builds the nodes, binds their listeners, writes one `node=<id> addr=<addr>` line per node
/// to `out`, and serves until `shutdown` completes.
pub async fn run(
    args: RunArgs,
    out: &mut (dyn Write + Send),
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    let model: GpuModel = args.gpu_model.parse().map_err(|e| format!("--gpu-model: {e}"))?;
    if args.nodes == 0 {
        return Err("--nodes: must be at least 1".into());
    }
    if args.gpus_per_node == 0 {
        return Err("--gpus-per-node: must be at least 1".into());
    }
    if args.jobs && args.clock != ClockKind::Wall {
        return Err("--jobs: real processes run on the wall clock; drop --clock virtual".into());
    }
    if !args.listen_base.ip().is_loopback() && args.tls_dir.is_none() && !args.insecure {
        return Err(format!(
            "--listen-base {}: serving beyond loopback without --tls-dir would let anyone who reaches the ports push \
             layouts; give --tls-dir (coordinator certs init) or --insecure",
            args.listen_base
        ));
    }
    let state_dir = args.state_dir.clone().unwrap_or_else(default_state_dir);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    let mut tasks = Vec::new();
    let mut metrics_server = None;
    let metrics = match args.metrics_listen {
        None => None,
        Some(at) => {
            let l = tokio::net::TcpListener::bind(at)
                .await
                .map_err(|e| format!("--metrics-listen: cannot listen on {at}: {e}"))?;
            let local = l.local_addr().map_err(|e| e.to_string())?;
            let metrics = Arc::new(tessera_agent::metrics::AgentMetrics::new());
            let served = Arc::clone(&metrics);
            metrics_server = Some(tokio::spawn(async move {
                if let Err(e) = tessera_metrics::serve(l, served).await {
                    tracing::error!(error = %e, "the /metrics server stopped");
                }
            }));
            writeln!(out, "metrics={local}").map_err(|e| format!("cannot write to stdout: {e}"))?;
            Some(tessera_agent::metrics::SharedMetrics(metrics))
        }
    };
    for i in 0..args.nodes {
        let id = NodeId::new(format!("{}-{i}", args.node_prefix)).map_err(|e| format!("--node-prefix: {e}"))?;
        let dir = state_dir.join(id.as_str());
        let node =
            SimNode::open_with(id.clone(), args.gpus_per_node, model, NodeClock::new(args.clock), &dir, args.jobs)
                .map_err(|e| e.to_string())?;
        let mut addr = args.listen_base;
        if addr.port() != 0 {
            let port = u32::from(addr.port()) + i;
            addr.set_port(
                u16::try_from(port).map_err(|_| format!("--listen-base: port {port} for {id} is too large"))?,
            );
        }
        let listener =
            tokio::net::TcpListener::bind(addr).await.map_err(|e| format!("{id}: cannot listen on {addr}: {e}"))?;
        let local = listener.local_addr().map_err(|e| e.to_string())?;
        let options = RuntimeOptions {
            coordinator: args.coordinator.as_ref().map(|c| ClientOptions {
                endpoint: c.clone(),
                advertise: match &args.advertise_host {
                    Some(host) => format!("{host}:{}", local.port()),
                    None => local.to_string(),
                },
                heartbeat_interval: std::time::Duration::from_millis(500),
                backoff_initial: std::time::Duration::from_millis(100),
                backoff_max: std::time::Duration::from_secs(5),
                rpc_timeout: std::time::Duration::from_secs(2),
                tls: None,
            }),
            tls: args.tls_dir.as_ref().map(|d| tessera_auth::TlsFiles {
                cert: d.join(format!("{id}.pem")),
                key: d.join(format!("{id}.key")),
                ca: d.join("ca.pem"),
            }),
            metrics: metrics.clone(),
            ..RuntimeOptions::default()
        };
        let (handles, node_tasks) = runtime::start(node.reconciler.clone(), &options, stop_rx.clone());
        tasks.extend(node_tasks);
        let mut stop = stop_rx.clone();
        servers.push(tokio::spawn(async move {
            let shutdown = async move {
                let _ = stop.wait_for(|s| *s).await;
            };
            if let Err(e) = runtime::serve(&handles, listener, shutdown).await {
                tracing::error!("{e}");
            }
        }));
        writeln!(out, "node={id} addr={local}").map_err(|e| format!("cannot write to stdout: {e}"))?;
    }
    out.flush().map_err(|e| format!("cannot write to stdout: {e}"))?;
    shutdown.await;
    let _ = stop_tx.send(true);
    for t in servers.into_iter().chain(tasks) {
        let _ = t.await;
    }
    if let Some(m) = metrics_server {
        m.abort();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_core::plan::{Assignment, GpuPlan};

    fn plan(layout: &str, assignments: Vec<Assignment>) -> GpuPlan {
        GpuPlan {
            layout: layout.parse().unwrap(),
            assignments,
            expected_goodput: 0.0,
            explanation: String::new(),
            upcoming: vec![],
            retraining_epochs: BTreeMap::new(),
            sharing: Default::default(),
        }
    }

    fn a(p: &str, t: &str, role: Role) -> Assignment {
        Assignment { placement: p.parse().unwrap(), tenant: TenantId::new(t).unwrap(), role, preinit: false }
    }

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tessera-node-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_node_reconciles_over_the_simulator_and_its_hardware_survives_a_restart() {
        let dir = tmp("restart");
        let clock = NodeClock::new(ClockKind::Virtual);
        let node = SimNode::open(NodeId::new("n0").unwrap(), 2, GpuModel::A100_40GB, clock.clone(), &dir).unwrap();
        let first = plan("3g@0 3g@4", vec![a("3g@0", "a", Role::Inference), a("3g@4", "b", Role::Retraining)]);
        node.reconciler.accept(1, BTreeMap::from([(1, first)])).unwrap();
        assert!(node.reconciler.reconcile().unwrap().converged);
        // Loaded instances are busy on the simulated GPU: destroying one without a drain is refused.
        let id = node.sim.instances(1).unwrap()[0].id;
        assert!(matches!(node.sim.destroy_instance(1, id), Err(BackendError::InUse { .. })));
        // Retraining progresses with workload time once warm, and arrivals are served by a warm instance. Under the
        // virtual clock the two creates run at 0-1 s and 1-2 s, so 3g@4 is warm at 2 s + 4 s of warm-up.
        let w = node.reconciler.workload().clone();
        let b = TenantId::new("b").unwrap();
        w.arrive(&TenantId::new("a").unwrap(), 3).unwrap();
        w.advance_to(14_000).unwrap();
        w.arrive(&TenantId::new("a").unwrap(), 2).unwrap();
        let m = w.metrics();
        let ca = &m.tenants[&TenantId::new("a").unwrap()];
        assert_eq!((ca.arrivals, ca.served_within_slo, ca.dropped), (5, 2, 3));
        let done = m.tenants[&b].retraining_done_gpu_s;
        assert!((done - (14.0 - 6.0) * 3.0 / 7.0).abs() < 1e-9, "{done}");
        // Moving the retraining checkpoints its progress.
        let second = plan("7g@0", vec![a("7g@0", "b", Role::Retraining)]);
        node.reconciler.accept(2, BTreeMap::from([(1, second)])).unwrap();
        assert!(node.reconciler.reconcile().unwrap().converged);
        assert!((w.metrics().tenants[&b].retraining_done_gpu_s - done).abs() < 1e-9);
        // Every MIG change is in the node's change log, with the epoch it worked towards; none destroyed an
        // instance its target keeps.
        let log = std::fs::read_to_string(dir.join(MIG_CHANGES_FILE)).unwrap();
        let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let list = |l: &serde_json::Value, k: &str| -> Vec<String> {
            l[k].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
        };
        let created: Vec<String> = lines.iter().flat_map(|l| list(l, "created")).collect();
        let mut destroyed: Vec<String> = lines.iter().flat_map(|l| list(l, "destroyed")).collect();
        destroyed.sort();
        assert_eq!(created, ["3g@0", "3g@4", "7g@0"], "{log}");
        assert_eq!(destroyed, ["3g@0", "3g@4"], "{log}");
        assert!(lines.iter().all(|l| list(l, "kept_destroyed").is_empty()), "{log}");
        let epochs: Vec<u64> = lines.iter().map(|l| l["epoch"].as_u64().unwrap()).collect();
        assert_eq!(epochs.first(), Some(&1));
        assert_eq!(epochs.last(), Some(&2));
        drop(node);
        // A new process over the same directory finds the GPUs and the target as they were.
        let again = SimNode::open(NodeId::new("n0").unwrap(), 2, GpuModel::A100_40GB, clock, &dir).unwrap();
        assert_eq!(again.sim.layout(1).unwrap().to_string(), "7g@0");
        assert_eq!(again.reconciler.desired().epoch, 2);
        let report = again.reconciler.reconcile().unwrap();
        assert!(report.converged, "{report:?}");
        assert_eq!(report.steps, 1, "only the work is loaded again (reassign), no MIG call");
        let wrong =
            SimNode::open(NodeId::new("n0").unwrap(), 3, GpuModel::A100_40GB, NodeClock::new(ClockKind::Wall), &dir);
        assert!(matches!(wrong, Err(NodeError::Restore { .. })));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_wall_clock_cannot_be_advanced() {
        let dir = tmp("wall");
        let node =
            SimNode::open(NodeId::new("n1").unwrap(), 1, GpuModel::H100_80GB, NodeClock::new(ClockKind::Wall), &dir)
                .unwrap();
        assert_eq!(node.reconciler.workload().advance_to(5), Err(WorkloadError::WallClock));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
