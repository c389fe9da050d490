//! [`Supervisor`]: the [`Workload`] for real nodes that runs each tenant's jobs on its instances.
//!
//! A tenant's `serve` and `retrain` jobs (`tessera_core::jobs`) come with the targets ([`Workload::set_jobs`]). When
//! the reconcile loop loads work onto an instance, the supervisor starts the tenant's job for that role as a real
//! process (or a container through the Docker or Podman CLI) with the instance's MIG UUID in
//! `CUDA_VISIBLE_DEVICES`, a port it allocated, and its output appended to a log file. Work of a tenant without a job
//! for that role is recorded only (the operator's own system follows the agent's state), as [`crate::workload::
//! Bookkeeping`] does.
//!
//! ## Lifecycle of a job
//! - **Starting**: spawned in its own process group; a monitor thread checks its readiness (HTTP `GET` or a TCP
//!   connection to its port) every [`MONITOR_INTERVAL`]. Until it is ready the instance is not reported serving, no
//!   route sends it requests, and the reconcile loop does not drain the instance it replaces (make-before-break:
//!   `crate::reconcile`).
//! - **Ready**: reported as a ready endpoint (host port, instance, MIG UUID) in the node's state, from which the
//!   coordinator serves the tenant's routes.
//! - **Crashed**: a job that exits while it should run is restarted on the same instance and port after a backoff
//!   that doubles from 1 s up to 30 s and resets once it has been ready for a minute.
//! - **Draining** ([`Workload::drain`]): reported as draining (routes drop it; where another instance on the node
//!   already serves the tenant, the drain waits the settle time so that front ends have stopped sending it requests),
//!   then its drain action (an HTTP
//!   `POST` that answers once in-flight requests have finished, or a signal) with the job's deadline; a retraining
//!   job's checkpoint action; then the stop signal to its process group and, after the grace period, `SIGKILL`.
//!   Only once no process of the group is left does `drain` return, and the reconcile loop still checks the MIG
//!   device's process list before it destroys the instance.
//!
//! A retraining job is never run twice on the node: before a tenant's retraining starts on a new instance, the one
//! running elsewhere on the node is checkpointed and stopped, so the new one resumes from the newest checkpoint.
//!
//! ## Restarts of the agent
//! Every change is written to `jobs.json` in the supervisor's directory (temporary file, sync, rename) before it is
//! acted on. Jobs run in their own process groups, so they outlive an agent that is killed. A restarted agent
//! reads the file and **adopts** every job whose process is still there (same PID and same start time in
//! `/proc/PID/stat`, so a reused PID is not mistaken for it); a job that died meanwhile is restarted. The work the
//! file records is what [`Workload::loaded`] reports, so the reconcile loop does not load it again: nothing is
//! started twice.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tessera_core::ids::{MigUuid, NodeId, TenantId};
use tessera_core::jobs::{ContainerRuntime, JobAction, JobRun, JobSpec, ReadyCheck, Signal, TenantJobs, expand};
use tessera_core::layout::Placement;
use tessera_core::plan::Role;
use tessera_core::reconfig::Work;

use crate::backend::GpuInstance;
use crate::load::LoadSignal;
use crate::workload::{Endpoint, EndpointState, TenantCounters, Workload, WorkloadError, WorkloadMetrics};

/// The supervisor's state file, in its directory.
pub const JOBS_FILE: &str = "jobs.json";
/// How often the monitor looks at every job.
pub const MONITOR_INTERVAL: Duration = Duration::from_millis(100);
/// First restart backoff after a crash.
const BACKOFF_INITIAL: Duration = Duration::from_secs(1);
/// Longest restart backoff.
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// A job ready this long has its backoff reset.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(60);
/// The default [`Supervisor::open`] settle.
pub const DEFAULT_SETTLE: Duration = Duration::from_secs(1);
/// How long a readiness check may take.
const READY_TIMEOUT: Duration = Duration::from_millis(500);

/// Which jobs a node agrees to run. Whoever may write a tenant (an operator) or push a layout (the leader) could
/// otherwise have any program run on every GPU node, as the agent's user: the node's owner lists the programs and
/// images it allows, in the agent's configuration (`[jobs]`). A pattern is a program or image name exactly, or a
/// prefix followed by `*`; `*` allows everything (the simulator's nodes, which exist to run test jobs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobPolicy {
    /// Programs a command job may start (its `argv[0]`, as written in the tenant's spec).
    pub commands: Vec<String>,
    /// Images a container job may run.
    pub images: Vec<String>,
}

impl JobPolicy {
    /// Every program and every image.
    pub fn allow_all() -> JobPolicy {
        JobPolicy { commands: vec!["*".into()], images: vec!["*".into()] }
    }

    /// Whether the policy allows what `run` starts; the error names it and the setting to change.
    pub fn check(&self, run: &JobRun) -> Result<(), Refused> {
        let matches = |patterns: &[String], what: &str| {
            patterns.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => what.starts_with(prefix),
                None => p == what,
            })
        };
        match run {
            JobRun::Command { argv } => {
                let program = argv.first().map(String::as_str).unwrap_or("");
                // `/opt/serving/../../bin/sh` would match `/opt/serving/*` as text.
                if program.split('/').any(|c| c == "..") {
                    return Err(Refused::Climbs { program: program.to_string() });
                }
                if matches(&self.commands, program) {
                    Ok(())
                } else {
                    Err(Refused::Command { program: program.to_string() })
                }
            }
            JobRun::Container { image, .. } => {
                if matches(&self.images, image) {
                    Ok(())
                } else {
                    Err(Refused::Image { image: image.clone() })
                }
            }
        }
    }
}

/// What a node's [`JobPolicy`] refuses to run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A program path that climbs with `..` (`/opt/serving/../../bin/sh` would match `/opt/serving/*` as text).
    #[error("`{program}`: a program path may not climb with `..`")]
    Climbs {
        /// The program.
        program: String,
    },
    /// A program the policy does not list.
    #[error("this node does not run `{program}` (add it to [jobs] allow_commands in its config)")]
    Command {
        /// The program.
        program: String,
    },
    /// An image the policy does not list.
    #[error("this node does not run image `{image}` (add it to [jobs] allow_images in its config)")]
    Image {
        /// The image.
        image: String,
    },
}

/// Why a job could not be started, stopped, drained, checkpointed or read, or its state not saved.
#[derive(Debug, thiserror::Error)]
pub enum JobFailure {
    /// The job's templates do not expand.
    #[error(transparent)]
    Template(#[from] tessera_core::jobs::TemplateError),
    /// A file of the supervisor's (its state, a job's log) cannot be written.
    #[error("{}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The job state does not serialise.
    #[error("the job state: {0}")]
    State(#[from] serde_json::Error),
    /// The program could not be started.
    #[error("cannot start `{program}`: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The instance is no longer there.
    #[error("no such instance")]
    NoInstance,
    /// The instance's MIG UUID could not be read, so nothing can be pinned to it.
    #[error("the instance has no MIG UUID the agent could read; no job can run on it")]
    NoUuid,
    /// The job's process group outlived SIGKILL.
    #[error("process group {0} survived SIGKILL for 10 s")]
    Unkillable(u32),
    /// The job's port could not be talked to.
    #[error("{addr}: {source}")]
    Connection {
        /// Its address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The job's port answered something other than HTTP.
    #[error("{0}: not an HTTP answer")]
    NotHttp(SocketAddr),
    /// The job answered an action or a read with a status other than 2xx.
    #[error("{method} {path} answered {status}")]
    Status {
        /// The method.
        method: &'static str,
        /// The path.
        path: String,
        /// The status code.
        status: u16,
    },
}

/// Why the supervisor could not start.
#[derive(Debug, thiserror::Error)]
pub enum SupervisorError {
    /// The directory or the state file could not be used.
    #[error("{}: {message}", path.display())]
    Io {
        /// The path.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
}

/// One job as the state file records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct JobRecord {
    tenant: TenantId,
    role: Role,
    port: u16,
    /// The process (and process group) id, 0 while not running.
    pid: u32,
    /// The process's start time (`/proc/PID/stat` field 22), to recognise it after an agent restart.
    start_ticks: u64,
    state: EndpointState,
    /// The job as started (re-expanded from the spec at each start).
    spec: JobSpec,
    restarts: u32,
    log: PathBuf,
    /// A value unique to this job, in its environment (`TESSERA_JOB_ID`) and saved before it starts: a job whose
    /// PID was not saved (the agent killed right after the start) is still found and adopted, not started twice.
    #[serde(default)]
    token: String,
}

/// One instance's work and jobs as the state file records them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SlotRecord {
    gpu: u32,
    placement: Placement,
    uuid: Option<MigUuid>,
    work: Vec<Work>,
    jobs: Vec<JobRecord>,
}

/// What the process owns of a running job (not persisted).
#[derive(Debug, Default)]
struct Live {
    /// The child, when this agent started it (reaped by the monitor); adopted jobs have none.
    child: Option<Child>,
    /// When a crashed job is due to restart.
    restart_at: Option<Instant>,
    /// The current backoff.
    backoff: Option<Duration>,
    /// When it last became ready.
    ready_since: Option<Instant>,
    /// Set while `drain` stops it: an exit is not a crash.
    stopping: bool,
}

#[derive(Debug, Default)]
struct Inner {
    specs: BTreeMap<TenantId, TenantJobs>,
    slots: BTreeMap<(u32, Placement), SlotRecord>,
    live: BTreeMap<(u32, Placement, TenantId, Role), Live>,
}

/// The job supervisor: see the [module documentation](self).
pub struct Supervisor {
    node: NodeId,
    dir: PathBuf,
    settle: Duration,
    policy: JobPolicy,
    inner: Mutex<Inner>,
    origin: Instant,
    load: Option<Arc<LoadSignal>>,
    /// Requests counted by the serve jobs themselves (their `metrics`), read every [`SCRAPE_INTERVAL`].
    job_load: LoadSignal,
    last_scrape: Mutex<Option<Instant>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// How often the serve jobs' request counters are read.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
/// Longest metrics answer read from a job.
const MAX_METRICS_BYTES: usize = 1 << 20;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Supervisor {
    /// Whether job `j` of the instance at `slot` serves: started, ready, and ready for the settle time (front ends
    /// have learnt its endpoint).
    fn serving(&self, inner: &Inner, slot: (u32, Placement), j: &JobRecord) -> bool {
        let key = (slot.0, slot.1, j.tenant.clone(), j.role);
        let settled = inner.live.get(&key).and_then(|l| l.ready_since).is_some_and(|t| t.elapsed() >= self.settle);
        j.state == EndpointState::Ready && j.pid != 0 && settled
    }

    /// Opens the supervisor of node `node` with its state and logs in `dir` (created if needed), adopting the jobs a
    /// previous agent left running, and starts its monitor thread. `load` supplies request counters, as for
    /// [`crate::workload::Bookkeeping`].
    ///
    /// `settle` is how long a job must have been ready before its instance counts as serving ([`Workload::ready`]):
    /// its endpoint is reported ready at once, and the settle gives front ends time to learn it (a heartbeat and a
    /// route update) before make-before-break drains the instance it replaces. [`DEFAULT_SETTLE`] suits a heartbeat
    /// of 0.5 s; give a little more than the heartbeat interval. `policy` says which programs and images it runs.
    pub fn open(
        node: NodeId,
        dir: &Path,
        load: Option<Arc<LoadSignal>>,
        settle: Duration,
        policy: JobPolicy,
    ) -> Result<Arc<Supervisor>, SupervisorError> {
        let io =
            |path: &Path, e: std::io::Error| SupervisorError::Io { path: path.to_path_buf(), message: e.to_string() };
        std::fs::create_dir_all(dir.join("logs")).map_err(|e| io(dir, e))?;
        let file = dir.join(JOBS_FILE);
        let slots: Vec<SlotRecord> = match std::fs::read_to_string(&file) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| SupervisorError::Io {
                path: file.clone(),
                message: format!("not a job state file: {e} (move it away to start without jobs)"),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io(&file, e)),
        };
        let mut inner = Inner::default();
        for mut slot in slots {
            for job in &mut slot.jobs {
                let key = (slot.gpu, slot.placement, job.tenant.clone(), job.role);
                let mut alive = job.pid != 0 && start_ticks(job.pid) == Some(job.start_ticks);
                if !alive && !job.token.is_empty() {
                    // Started, but its PID was not saved: found by its token.
                    if let Some(pid) = crate::procs::processes_with_env("TESSERA_JOB_ID", &job.token).first() {
                        job.pid = *pid;
                        job.start_ticks = start_ticks(*pid).unwrap_or(0);
                        alive = job.start_ticks != 0;
                    }
                }
                let mut live = Live::default();
                if alive {
                    tracing::info!(node = %node, tenant = %job.tenant, role = ?job.role, pid = job.pid,
                        placement = %slot.placement, "adopted a running job");
                    if job.state == EndpointState::Ready {
                        live.ready_since = Some(Instant::now());
                    }
                    // A drain the agent did not finish: the job serves again until the reconcile loop, which
                    // recomputes what to drain, drains it again (drains are idempotent).
                    if job.state == EndpointState::Draining {
                        job.state = EndpointState::Starting;
                    }
                } else {
                    tracing::warn!(node = %node, tenant = %job.tenant, role = ?job.role, placement = %slot.placement,
                        "a job died while the agent was away; restarting it");
                    job.pid = 0;
                    job.state = EndpointState::Starting;
                    live.restart_at = Some(Instant::now());
                }
                inner.live.insert(key, live);
            }
            inner.slots.insert((slot.gpu, slot.placement), slot);
        }
        let sup = Arc::new(Supervisor {
            node,
            dir: dir.to_path_buf(),
            settle,
            policy,
            inner: Mutex::new(inner),
            origin: Instant::now(),
            load,
            job_load: LoadSignal::default(),
            last_scrape: Mutex::new(None),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        });
        sup.save(&lock(&sup.inner)).map_err(|e| SupervisorError::Io { path: file, message: e.to_string() })?;
        let weak = Arc::downgrade(&sup);
        let stop = sup.stop.clone();
        std::thread::Builder::new()
            .name("tessera-supervisor".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Some(sup) = weak.upgrade() else { return };
                    sup.monitor_once();
                    drop(sup);
                    std::thread::sleep(MONITOR_INTERVAL);
                }
            })
            .map_err(|e| io(dir, e))?;
        Ok(sup)
    }

    /// The directory of its state file and logs.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The PIDs of every job process it runs (for tests and operators).
    pub fn pids(&self) -> Vec<u32> {
        lock(&self.inner).slots.values().flat_map(|s| s.jobs.iter().map(|j| j.pid)).filter(|p| *p != 0).collect()
    }

    fn save(&self, inner: &Inner) -> Result<(), JobFailure> {
        let slots: Vec<&SlotRecord> = inner.slots.values().collect();
        let text = serde_json::to_string_pretty(&slots)?;
        let path = self.dir.join(JOBS_FILE);
        let tmp = self.dir.join(format!("{JOBS_FILE}.tmp"));
        let file = |path: &Path, source| JobFailure::File { path: path.to_path_buf(), source };
        let mut f = std::fs::File::create(&tmp).map_err(|e| file(&tmp, e))?;
        f.write_all(text.as_bytes()).and_then(|()| f.sync_all()).map_err(|e| file(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| file(&path, e))
    }

    fn save_or_log(&self, inner: &Inner) {
        if let Err(e) = self.save(inner) {
            tracing::error!(node = %self.node, "cannot save the job state: {e}");
        }
    }

    /// The template variables of a job on an instance.
    fn vars(
        &self,
        gpu: u32,
        slot: &SlotRecord,
        tenant: &TenantId,
        role: Role,
        port: u16,
    ) -> BTreeMap<&'static str, String> {
        let mut v = BTreeMap::new();
        v.insert("tenant", tenant.to_string());
        v.insert("role", role_word(role).to_string());
        v.insert("node", self.node.to_string());
        v.insert("gpu", gpu.to_string());
        v.insert("profile", slot.placement.profile.to_string());
        v.insert("placement", slot.placement.to_string());
        v.insert("mig_uuid", slot.uuid.map(|u| u.to_string()).unwrap_or_default());
        v.insert("port", port.to_string());
        v
    }

    /// Expands a job's templates for one instance.
    fn expanded(&self, spec: &JobSpec, vars: &mut BTreeMap<&'static str, String>) -> Result<JobSpec, JobFailure> {
        let mut out = spec.clone();
        let resume = match &spec.resume_path {
            Some(p) => expand(p, vars)?,
            None => String::new(),
        };
        vars.insert("checkpoint", resume.clone());
        out.resume_path = (!resume.is_empty()).then_some(resume);
        out.run = match &spec.run {
            JobRun::Command { argv } => {
                JobRun::Command { argv: argv.iter().map(|a| expand(a, vars)).collect::<Result<_, _>>()? }
            }
            JobRun::Container { image, args, runtime } => JobRun::Container {
                image: expand(image, vars)?,
                args: args.iter().map(|a| expand(a, vars)).collect::<Result<_, _>>()?,
                runtime: *runtime,
            },
        };
        out.env = spec.env.iter().map(|(k, v)| Ok((k.clone(), expand(v, vars)?))).collect::<Result<_, JobFailure>>()?;
        Ok(out)
    }

    /// Spawns `job` (already expanded) on `uuid`; returns the child.
    fn spawn(&self, job: &JobRecord, uuid: MigUuid, container_name: &str) -> Result<Child, JobFailure> {
        let argv = command_line(&job.spec, uuid, container_name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&job.log)
            .map_err(|source| JobFailure::File { path: job.log.clone(), source })?;
        let err = log.try_clone().map_err(|source| JobFailure::File { path: job.log.clone(), source })?;
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .envs(&job.spec.env)
            .env("CUDA_VISIBLE_DEVICES", uuid.to_string())
            .env("TESSERA_TENANT", job.tenant.as_str())
            .env("TESSERA_PORT", job.port.to_string())
            .env("TESSERA_JOB_ID", &job.token)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        // Its own process group: stopped as a group, and it outlives an agent that is killed.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        cmd.spawn().map_err(|source| JobFailure::Spawn { program: argv[0].clone(), source })
    }

    /// Starts (or restarts) the job `key` of `slot`; the caller holds the lock and saves.
    fn start_job(&self, inner: &mut Inner, slot_key: (u32, Placement), index: usize) -> Result<(), JobFailure> {
        let slot = inner.slots.get_mut(&slot_key).ok_or(JobFailure::NoInstance)?;
        let uuid = slot.uuid.ok_or(JobFailure::NoUuid)?;
        let job = &mut slot.jobs[index];
        let name = container_name(&self.node, slot_key.0, slot_key.1, &job.tenant, job.role);
        // A container left by a crash would hold the name (and the instance).
        remove_container(&job.spec.run, &name);
        let child = self.spawn(job, uuid, &name)?;
        job.pid = child.id();
        job.start_ticks = start_ticks(job.pid).unwrap_or(0);
        job.state = if job.spec.ready.is_some() { EndpointState::Starting } else { EndpointState::Ready };
        tracing::info!(node = %self.node, tenant = %job.tenant, role = ?job.role, pid = job.pid, port = job.port,
            gpu = slot_key.0, placement = %slot_key.1, mig_uuid = %uuid, "job started");
        let key = (slot_key.0, slot_key.1, job.tenant.clone(), job.role);
        let ready = job.state == EndpointState::Ready;
        let live = inner.live.entry(key).or_default();
        live.child = Some(child);
        live.restart_at = None;
        live.stopping = false;
        live.ready_since = ready.then(Instant::now);
        Ok(())
    }

    /// Reads the request counters of the serve jobs that have `metrics`, at most every [`SCRAPE_INTERVAL`]; each
    /// instance's job is a source of its own (a restarted job's counter starting again is seen as a restart).
    fn scrape_jobs(&self) {
        {
            let mut last = lock(&self.last_scrape);
            if last.is_some_and(|t| t.elapsed() < SCRAPE_INTERVAL) {
                return;
            }
            *last = Some(Instant::now());
        }
        let targets: Vec<(TenantId, String, u16, tessera_core::jobs::JobMetrics)> = lock(&self.inner)
            .slots
            .iter()
            .flat_map(|((g, p), s)| {
                s.jobs.iter().filter(|j| j.pid != 0 && j.state != EndpointState::Starting).filter_map(move |j| {
                    j.spec.metrics.clone().map(|m| (j.tenant.clone(), format!("job:{g}/{p}"), j.port, m))
                })
            })
            .collect();
        for (tenant, source, port, m) in targets {
            match http_get_body(port, &m.path, READY_TIMEOUT)
                .map_err(|e| e.to_string())
                .and_then(|text| crate::load::counter_value(&text, &m.counter, &m.labels).map_err(|e| e.to_string()))
            {
                Ok(v) => self.job_load.observe(&tenant, &source, v),
                Err(e) => tracing::debug!(node = %self.node, %tenant, %source, "cannot read the job's counter: {e}"),
            }
        }
    }

    /// One look at every job: reap exits, restart crashed jobs when due, check readiness of starting ones.
    fn monitor_once(&self) {
        self.scrape_jobs();
        let mut checks = Vec::new();
        {
            let mut inner = lock(&self.inner);
            let mut changed = false;
            let keys: Vec<(u32, Placement)> = inner.slots.keys().copied().collect();
            for slot_key in keys {
                let n = inner.slots[&slot_key].jobs.len();
                for i in 0..n {
                    let job = inner.slots[&slot_key].jobs[i].clone();
                    let key = (slot_key.0, slot_key.1, job.tenant.clone(), job.role);
                    let live = inner.live.entry(key.clone()).or_default();
                    if live.stopping {
                        continue; // `stop_job` owns it now (and reaps it).
                    }
                    let exited = match &mut live.child {
                        Some(c) => matches!(c.try_wait(), Ok(Some(_))),
                        None => job.pid != 0 && start_ticks(job.pid) != Some(job.start_ticks),
                    };
                    if exited && job.pid != 0 {
                        live.child = None;
                        // What the leader left in its group (workers) goes with it before a restart.
                        signal_group(job.pid, Signal::Kill);
                        let stopping = live.stopping;
                        let slot = inner.slots.get_mut(&slot_key).expect("slot");
                        slot.jobs[i].pid = 0;
                        changed = true;
                        if !stopping && job.state != EndpointState::Draining {
                            let live = inner.live.get_mut(&key).expect("live");
                            let backoff = match (live.backoff, live.ready_since) {
                                (Some(_), Some(t)) if t.elapsed() >= BACKOFF_RESET_AFTER => BACKOFF_INITIAL,
                                (Some(b), _) => (b * 2).min(BACKOFF_MAX),
                                (None, _) => BACKOFF_INITIAL,
                            };
                            live.backoff = Some(backoff);
                            live.restart_at = Some(Instant::now() + backoff);
                            live.ready_since = None;
                            let slot = inner.slots.get_mut(&slot_key).expect("slot");
                            slot.jobs[i].state = EndpointState::Starting;
                            slot.jobs[i].restarts += 1;
                            tracing::warn!(node = %self.node, tenant = %job.tenant, role = ?job.role,
                                placement = %slot_key.1, ?backoff, "job exited; restarting after a backoff (log: {})",
                                job.log.display());
                        }
                        continue;
                    }
                    let live = inner.live.get_mut(&key).expect("live");
                    if job.pid == 0 && live.restart_at.is_some_and(|t| t <= Instant::now()) && !live.stopping {
                        if let Err(e) = self.start_job(&mut inner, slot_key, i) {
                            tracing::error!(node = %self.node, tenant = %job.tenant, "cannot restart a job: {e}");
                            let live = inner.live.get_mut(&key).expect("live");
                            live.restart_at = Some(Instant::now() + live.backoff.unwrap_or(BACKOFF_INITIAL));
                        }
                        changed = true;
                        continue;
                    }
                    if job.pid != 0
                        && job.state == EndpointState::Starting
                        && let Some(check) = &job.spec.ready
                    {
                        checks.push((slot_key, i, job.pid, job.port, check.clone()));
                    }
                }
            }
            if changed {
                self.save_or_log(&inner);
            }
        }
        // Readiness checks without the lock (they touch the network).
        let ready: Vec<_> = checks.into_iter().filter(|(_, _, _, port, check)| is_ready(*port, check)).collect();
        if ready.is_empty() {
            return;
        }
        let mut inner = lock(&self.inner);
        let mut changed = false;
        for (slot_key, i, pid, _, _) in ready {
            let Some(slot) = inner.slots.get_mut(&slot_key) else { continue };
            let Some(job) = slot.jobs.get_mut(i) else { continue };
            if job.pid == pid && job.state == EndpointState::Starting {
                job.state = EndpointState::Ready;
                let key = (slot_key.0, slot_key.1, job.tenant.clone(), job.role);
                tracing::info!(node = %self.node, tenant = %job.tenant, role = ?job.role, port = job.port,
                    placement = %slot_key.1, "job ready");
                inner.live.entry(key).or_default().ready_since = Some(Instant::now());
                changed = true;
            }
        }
        if changed {
            self.save_or_log(&inner);
        }
    }

    /// Drains and stops one job (see "Lifecycle" in the module doc). Called without the lock held.
    fn stop_job(&self, slot_key: (u32, Placement), tenant: &TenantId, role: Role) -> Result<(), JobFailure> {
        let key = (slot_key.0, slot_key.1, tenant.clone(), role);
        let job = {
            let mut inner = lock(&self.inner);
            let Some(slot) = inner.slots.get_mut(&slot_key) else { return Ok(()) };
            let Some(job) = slot.jobs.iter_mut().find(|j| &j.tenant == tenant && j.role == role) else {
                return Ok(());
            };
            job.state = EndpointState::Draining;
            let job = job.clone();
            inner.live.entry(key.clone()).or_default().stopping = true;
            self.save_or_log(&inner);
            job
        };
        if job.pid != 0 {
            let deadline = Duration::from_millis(job.spec.drain_deadline_ms);
            if let Some(action) = &job.spec.drain {
                tracing::info!(node = %self.node, tenant = %tenant, placement = %slot_key.1, "draining a job");
                if let Err(e) = act(job.pid, job.port, action, deadline) {
                    tracing::warn!(node = %self.node, tenant = %tenant, "drain action failed: {e}; stopping it anyway");
                }
            }
            if let Some(action) = &job.spec.checkpoint
                && let Err(e) = act(job.pid, job.port, action, deadline)
            {
                tracing::warn!(node = %self.node, tenant = %tenant, "checkpoint action failed: {e}");
            }
            let grace = Duration::from_millis(job.spec.grace_ms);
            signal_group(job.pid, job.spec.stop_signal);
            if !self.wait_gone(&key, job.pid, grace) {
                tracing::warn!(node = %self.node, tenant = %tenant, pid = job.pid, ?grace,
                    "job still running after its grace period; killing its process group");
                signal_group(job.pid, Signal::Kill);
                if !self.wait_gone(&key, job.pid, Duration::from_secs(10)) {
                    return Err(JobFailure::Unkillable(job.pid));
                }
            }
        }
        // A container runs under the runtime's shim, outside the CLI's process group: it is removed by name.
        remove_container(&job.spec.run, &container_name(&self.node, slot_key.0, slot_key.1, tenant, role));
        let mut inner = lock(&self.inner);
        if let Some(slot) = inner.slots.get_mut(&slot_key) {
            slot.jobs.retain(|j| !(&j.tenant == tenant && j.role == role));
        }
        inner.live.remove(&key);
        self.save_or_log(&inner);
        Ok(())
    }

    /// Waits up to `limit` for every process of group `pid` to be gone, reaping the child if this agent owns it.
    fn wait_gone(&self, key: &(u32, Placement, TenantId, Role), pid: u32, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        loop {
            if let Some(child) = lock(&self.inner).live.get_mut(key).and_then(|l| l.child.as_mut()) {
                let _ = child.try_wait();
            }
            if !group_alive(pid) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The slots holding `tenant`'s retraining job elsewhere on the node than `except`.
    fn retraining_elsewhere(&self, tenant: &TenantId, except: (u32, Placement)) -> Vec<(u32, Placement)> {
        lock(&self.inner)
            .slots
            .iter()
            .filter(|(k, s)| {
                // Also one in crash backoff (pid 0): it would be restarted beside the new one.
                **k != except && s.jobs.iter().any(|j| &j.tenant == tenant && j.role == Role::Retraining)
            })
            .map(|(k, _)| *k)
            .collect()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Workload for Supervisor {
    fn loaded(&self, gpu: u32) -> BTreeMap<Placement, Vec<Work>> {
        lock(&self.inner).slots.iter().filter(|((g, _), _)| *g == gpu).map(|((_, p), s)| (*p, s.work.clone())).collect()
    }

    fn load(&self, gpu: u32, instance: &GpuInstance, work: &[Work]) -> Result<(), WorkloadError> {
        let slot_key = (gpu, instance.placement);
        let err = |message: String| WorkloadError::Instance { gpu, placement: instance.placement, message };
        if work.is_empty() {
            self.drain(gpu, instance)?;
            return Ok(());
        }
        // A tenant's retraining runs once on the node: the one elsewhere checkpoints and stops first.
        for w in work.iter().filter(|w| w.role == Role::Retraining) {
            for other in self.retraining_elsewhere(&w.tenant, slot_key) {
                tracing::info!(node = %self.node, tenant = %w.tenant, from = %other.1, to = %instance.placement,
                    "retraining moves: checkpointing and stopping the running job first");
                self.stop_job(other, &w.tenant, Role::Retraining).map_err(|e| err(e.to_string()))?;
            }
        }
        let mut inner = lock(&self.inner);
        let existing: Vec<(TenantId, Role)> = inner
            .slots
            .get(&slot_key)
            .map(|s| s.jobs.iter().map(|j| (j.tenant.clone(), j.role)).collect())
            .unwrap_or_default();
        let probe = SlotRecord { gpu, placement: instance.placement, uuid: instance.uuid, work: vec![], jobs: vec![] };
        // Every new job is prepared (allowed, expanded, given a port) before anything changes: a load that fails
        // here leaves the instance as it was, and the next pass tries again.
        let mut new_jobs = Vec::new();
        for w in work {
            let spec = inner.specs.get(&w.tenant).and_then(|j| match w.role {
                Role::Inference => j.serve.as_ref(),
                Role::Retraining => j.retrain.as_ref(),
            });
            let Some(spec) = spec else { continue };
            if existing.iter().any(|(t, r)| *t == w.tenant && *r == w.role) {
                continue; // Already running here (adopted after a restart, or loaded twice): not started again.
            }
            let port = free_port().map_err(|e| err(format!("cannot allocate a port: {e}")))?;
            let mut vars = self.vars(gpu, &probe, &w.tenant, w.role, port);
            let expanded = self.expanded(spec, &mut vars).map_err(|e| err(format!("{}: {e}", w.tenant)))?;
            // The policy judges what would run, after templates (a template cannot smuggle a path in).
            self.policy.check(&expanded.run).map_err(|e| err(format!("tenant {}: {e}", w.tenant)))?;
            let log = self.dir.join("logs").join(format!(
                "{}.{}.gpu{gpu}.{}.log",
                w.tenant,
                role_word(w.role),
                instance.placement.to_string().replace('@', "-at-")
            ));
            let token = format!(
                "{}-{gpu}-{}-{}-{}-{}",
                self.node,
                instance.placement.to_string().replace('@', "-"),
                w.tenant,
                role_word(w.role),
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos())
            );
            new_jobs.push(JobRecord {
                tenant: w.tenant.clone(),
                role: w.role,
                port,
                pid: 0,
                start_ticks: 0,
                state: EndpointState::Starting,
                spec: expanded,
                restarts: 0,
                log,
                token,
            });
        }
        let slot = inner.slots.entry(slot_key).or_insert(probe);
        slot.uuid = instance.uuid.or(slot.uuid);
        slot.work = work.to_vec();
        let first = slot.jobs.len();
        slot.jobs.extend(new_jobs);
        let to_start: Vec<usize> = (first..slot.jobs.len()).collect();
        // Jobs of work no longer on this instance stop (a reassignment drains first, so this is a safety net).
        let stale: Vec<(TenantId, Role)> = slot
            .jobs
            .iter()
            .filter(|j| !work.iter().any(|w| w.tenant == j.tenant && w.role == j.role))
            .map(|j| (j.tenant.clone(), j.role))
            .collect();
        // Recorded before anything starts, so a restarted agent knows of every process it may find.
        self.save(&inner).map_err(|e| err(e.to_string()))?;
        let mut failed = None;
        for i in to_start {
            if let Err(e) = self.start_job(&mut inner, slot_key, i) {
                // Kept: the monitor retries it with backoff, and the instance is not reported serving meanwhile.
                let job = inner.slots[&slot_key].jobs[i].clone();
                let live = inner.live.entry((gpu, instance.placement, job.tenant.clone(), job.role)).or_default();
                live.backoff = Some(BACKOFF_INITIAL);
                live.restart_at = Some(Instant::now() + BACKOFF_INITIAL);
                failed.get_or_insert(format!("{}: {e}", job.tenant));
            }
        }
        self.save(&inner).map_err(|e| err(e.to_string()))?;
        if let Some(e) = failed {
            return Err(err(e));
        }
        drop(inner);
        for (tenant, role) in stale {
            self.stop_job(slot_key, &tenant, role).map_err(|e| err(e.to_string()))?;
        }
        Ok(())
    }

    fn drain(&self, gpu: u32, instance: &GpuInstance) -> Result<(), WorkloadError> {
        let slot_key = (gpu, instance.placement);
        let err = |message: String| WorkloadError::Instance { gpu, placement: instance.placement, message };
        // Routes first: every job of the instance is marked draining (and saved) before any drain action, so the
        // next report unroutes the whole instance at once.
        let (jobs, handed_over): (Vec<(TenantId, Role)>, bool) = {
            let mut inner = lock(&self.inner);
            // A ready server whose tenant another settled server on this node already serves (make-before-break):
            // its requests have somewhere to go.
            let handed_over = inner.slots.get(&slot_key).is_some_and(|slot| {
                slot.jobs.iter().any(|j| {
                    j.role == Role::Inference
                        && j.state == EndpointState::Ready
                        && inner.slots.iter().filter(|(k, _)| **k != slot_key).any(|(k, other)| {
                            other.jobs.iter().any(|o| {
                                o.tenant == j.tenant && o.role == Role::Inference && self.serving(&inner, *k, o)
                            })
                        })
                })
            });
            let Some(slot) = inner.slots.get_mut(&slot_key) else { return Ok(()) };
            for j in &mut slot.jobs {
                j.state = EndpointState::Draining;
            }
            let jobs = slot.jobs.iter().map(|j| (j.tenant.clone(), j.role)).collect();
            self.save(&inner).map_err(|e| err(e.to_string()))?;
            (jobs, handed_over)
        };
        if handed_over {
            // Out of the routes before the drain: front ends learn that the instance is draining (a heartbeat) and
            // stop sending it requests, so none finds it refusing or its connections closing. Where no other
            // instance serves the tenant (the new one needs these slices), waiting would only lengthen the gap.
            std::thread::sleep(self.settle);
        }
        for (tenant, role) in jobs {
            self.stop_job(slot_key, &tenant, role).map_err(|e| err(e.to_string()))?;
        }
        let mut inner = lock(&self.inner);
        inner.slots.remove(&slot_key);
        self.save(&inner).map_err(|e| err(e.to_string()))
    }

    fn ready(&self, gpu: u32, placement: Placement) -> bool {
        let inner = lock(&self.inner);
        inner
            .slots
            .get(&(gpu, placement))
            .is_some_and(|s| s.jobs.iter().all(|j| self.serving(&inner, (gpu, placement), j)))
    }

    fn make_before_break(&self) -> bool {
        true
    }

    fn set_jobs(&self, jobs: &BTreeMap<TenantId, TenantJobs>) {
        lock(&self.inner).specs = jobs.clone();
    }

    fn runs_tenant(&self, tenant: &TenantId) -> bool {
        lock(&self.inner).slots.values().any(|s| s.work.iter().any(|w| &w.tenant == tenant))
    }

    fn endpoints(&self, gpu: u32) -> BTreeMap<Placement, Vec<Endpoint>> {
        lock(&self.inner)
            .slots
            .iter()
            .filter(|((g, _), _)| *g == gpu)
            .map(|((_, p), s)| {
                let e = s
                    .jobs
                    .iter()
                    .map(|j| Endpoint {
                        tenant: j.tenant.clone(),
                        role: j.role,
                        port: j.port,
                        state: if j.pid == 0 && j.state == EndpointState::Ready {
                            EndpointState::Starting
                        } else {
                            j.state
                        },
                    })
                    .collect();
                (*p, e)
            })
            .collect()
    }

    fn retain(&self, gpu: u32, live: &[Placement]) {
        let gone: Vec<(u32, Placement)> =
            lock(&self.inner).slots.keys().filter(|(g, p)| *g == gpu && !live.contains(p)).copied().collect();
        for key in gone {
            tracing::warn!(node = %self.node, gpu, placement = %key.1, "instance vanished; stopping its jobs");
            let jobs: Vec<(TenantId, Role)> =
                lock(&self.inner).slots[&key].jobs.iter().map(|j| (j.tenant.clone(), j.role)).collect();
            for (t, r) in jobs {
                if let Err(e) = self.stop_job(key, &t, r) {
                    tracing::error!(node = %self.node, tenant = %t, "{e}");
                }
            }
            let mut inner = lock(&self.inner);
            inner.slots.remove(&key);
            self.save_or_log(&inner);
        }
    }

    fn metrics(&self) -> WorkloadMetrics {
        let mut tenants: BTreeMap<TenantId, TenantCounters> = BTreeMap::new();
        for s in lock(&self.inner).slots.values() {
            for w in &s.work {
                let job = s.jobs.iter().find(|j| j.tenant == w.tenant && j.role == w.role);
                let running = job.is_none_or(|j| j.state == EndpointState::Ready && j.pid != 0);
                let c = tenants.entry(w.tenant.clone()).or_default();
                match w.role {
                    Role::Inference if running => c.serving_instances += 1,
                    Role::Inference => {}
                    Role::Retraining => c.retraining_instances += 1,
                }
            }
        }
        crate::workload::add_load_arrivals(self.load.as_deref(), &mut tenants);
        // Requests the jobs counted themselves add to those of the serving stack's own signal.
        for (tenant, n) in self.job_load.arrivals() {
            tenants.entry(tenant).or_default().arrivals += n;
        }
        WorkloadMetrics { now_ms: self.now_ms(), tenants }
    }

    fn now_ms(&self) -> u64 {
        crate::workload::wall_ms_since(self.origin)
    }

    fn report_load(&self, source: &str, tenant: &TenantId, requests_total: u64) -> Result<(), WorkloadError> {
        crate::workload::report_into(self.load.as_deref(), source, tenant, requests_total)
    }
}

/// `serve` or `retrain`.
pub fn role_word(role: Role) -> &'static str {
    match role {
        Role::Inference => "serve",
        Role::Retraining => "retrain",
    }
}

/// A container's name: unique per node, instance, tenant and role.
fn container_name(node: &NodeId, gpu: u32, placement: Placement, tenant: &TenantId, role: Role) -> String {
    format!("tessera-{node}-{gpu}-{}-{tenant}-{}", placement.to_string().replace('@', "-"), role_word(role))
}

/// The command line that runs an (expanded) job on the instance `uuid`: its argv, or the container CLI's.
pub fn command_line(spec: &JobSpec, uuid: MigUuid, container_name: &str) -> Vec<String> {
    match &spec.run {
        JobRun::Command { argv } => argv.clone(),
        JobRun::Container { image, args, runtime } => {
            let (cli, gpu) = match runtime {
                // Docker's NVIDIA runtime takes a MIG device by UUID; Podman takes the CDI name the NVIDIA
                // Container Toolkit generates for it.
                ContainerRuntime::Docker => ("docker", vec!["--gpus".to_string(), format!("device={uuid}")]),
                ContainerRuntime::Podman => ("podman", vec!["--device".to_string(), format!("nvidia.com/gpu={uuid}")]),
            };
            let mut v = vec![cli.to_string(), "run".into(), "--rm".into(), "--init".into(), "--name".into()];
            v.push(container_name.to_string());
            v.push("--network=host".into());
            v.extend(gpu);
            for (k, val) in &spec.env {
                v.push("-e".into());
                v.push(format!("{k}={val}"));
            }
            v.push("-e".into());
            v.push(format!("NVIDIA_VISIBLE_DEVICES={uuid}"));
            v.push(image.clone());
            v.extend(args.iter().cloned());
            v
        }
    }
}

/// Removes a container job's container by name (`docker rm -f`, `podman rm -f`); nothing for a command job. A
/// container that is not there is no error.
fn remove_container(run: &JobRun, name: &str) {
    let JobRun::Container { runtime, .. } = run else { return };
    let cli = match runtime {
        ContainerRuntime::Docker => "docker",
        ContainerRuntime::Podman => "podman",
    };
    match Command::new(cli)
        .args(["rm", "-f", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) => tracing::warn!(container = name, "cannot run `{cli} rm -f`: {e}"),
    }
}

/// A free TCP port on the loopback interface, as the kernel hands it out.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The start time of process `pid` in clock ticks since boot (`/proc/PID/stat` field 22), `None` when there is no
/// such process (or it is a zombie).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: fields count from after its `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

fn rustix_signal(s: Signal) -> rustix::process::Signal {
    use rustix::process::Signal as S;
    match s {
        Signal::Term => S::TERM,
        Signal::Int => S::INT,
        Signal::Hup => S::HUP,
        Signal::Quit => S::QUIT,
        Signal::Usr1 => S::USR1,
        Signal::Usr2 => S::USR2,
        Signal::Kill => S::KILL,
    }
}

/// Sends `signal` to process group `pgid` (ignoring a group that is already gone).
fn signal_group(pgid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pgid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, rustix_signal(signal));
    }
}

/// Whether any process of group `pgid` is left.
fn group_alive(pgid: u32) -> bool {
    i32::try_from(pgid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .is_some_and(|pid| rustix::process::test_kill_process_group(pid).is_ok())
}

/// Runs a drain or checkpoint action on a job: an HTTP `POST` to its port (answered within `deadline`), or a signal.
fn act(pgid: u32, port: u16, action: &JobAction, deadline: Duration) -> Result<(), JobFailure> {
    match action {
        JobAction::Signal { signal } => {
            signal_group(pgid, *signal);
            Ok(())
        }
        JobAction::Http { path } => {
            let status = http(
                port,
                "POST",
                &format!("{path}{}deadline_ms={}", if path.contains('?') { '&' } else { '?' }, deadline.as_millis()),
                deadline,
            )?;
            if (200..300).contains(&status) {
                Ok(())
            } else {
                Err(JobFailure::Status { method: "POST", path: path.clone(), status })
            }
        }
    }
}

/// Whether a job on `port` passes its readiness check.
fn is_ready(port: u16, check: &ReadyCheck) -> bool {
    match check {
        ReadyCheck::Tcp => TcpStream::connect_timeout(&SocketAddr::from(([127, 0, 0, 1], port)), READY_TIMEOUT).is_ok(),
        ReadyCheck::Http { path } => http(port, "GET", path, READY_TIMEOUT).is_ok_and(|s| (200..300).contains(&s)),
    }
}

/// `GET http://127.0.0.1:{port}{path}` over HTTP/1.0 (so the answer is not chunked); the body of a 2xx answer, at
/// most [`MAX_METRICS_BYTES`].
fn http_get_body(port: u16, path: &str, timeout: Duration) -> Result<String, JobFailure> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let io = |source| JobFailure::Connection { addr, source };
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).and_then(|()| s.set_write_timeout(Some(timeout))).map_err(io)?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n").map_err(io)?;
    let mut raw = Vec::new();
    s.take(MAX_METRICS_BYTES as u64).read_to_end(&mut raw).map_err(io)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(JobFailure::NotHttp(addr))?;
    let status: u16 = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    if !(200..300).contains(&status) {
        return Err(JobFailure::Status { method: "GET", path: path.to_string(), status });
    }
    Ok(body.to_string())
}

/// One HTTP/1.1 request without a body to `127.0.0.1:port`; returns the status code.
fn http(port: u16, method: &str, path: &str, timeout: Duration) -> Result<u16, JobFailure> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let io = |source| JobFailure::Connection { addr, source };
    let timeout = timeout.max(Duration::from_millis(50));
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).and_then(|()| s.set_write_timeout(Some(timeout))).map_err(io)?;
    write!(s, "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .map_err(io)?;
    let mut head = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) => return Err(io(e)),
        }
    }
    let line = String::from_utf8_lossy(&head[..n]);
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or(JobFailure::NotHttp(addr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_run_on_their_instance_through_the_cli() {
        let uuid: MigUuid = "MIG-b5d6a3c0-1f2e-4d4c-9b8a-0123456789ab".parse().unwrap();
        let mut spec = JobSpec::command(["x"]);
        spec.run = JobRun::Container {
            image: "nvcr.io/nvidia/tritonserver:24.05-py3".into(),
            args: vec!["tritonserver".into(), "--http-port=9000".into()],
            runtime: ContainerRuntime::Docker,
        };
        spec.env.insert("A".into(), "1".into());
        let v = command_line(&spec, uuid, "tessera-n-0-3g-4-t-serve");
        assert_eq!(
            v.join(" "),
            "docker run --rm --init --name tessera-n-0-3g-4-t-serve --network=host --gpus \
             device=MIG-b5d6a3c0-1f2e-4d4c-9b8a-0123456789ab -e A=1 -e \
             NVIDIA_VISIBLE_DEVICES=MIG-b5d6a3c0-1f2e-4d4c-9b8a-0123456789ab nvcr.io/nvidia/tritonserver:24.05-py3 \
             tritonserver --http-port=9000"
        );
        if let JobRun::Container { runtime, .. } = &mut spec.run {
            *runtime = ContainerRuntime::Podman;
        }
        assert!(command_line(&spec, uuid, "n").join(" ").contains("--device nvidia.com/gpu=MIG-b5d6a3c0"));
    }

    #[test]
    fn a_node_runs_only_the_programs_and_images_it_allows() {
        let policy = JobPolicy { commands: vec!["tritonserver".into(), "/opt/serving/*".into()], images: vec![] };
        assert_eq!(policy.check(&JobRun::Command { argv: vec!["tritonserver".into()] }), Ok(()));
        assert_eq!(policy.check(&JobRun::Command { argv: vec!["/opt/serving/vllm".into()] }), Ok(()));
        let climb = JobRun::Command { argv: vec!["/opt/serving/../../bin/sh".into()] };
        assert!(policy.check(&climb).unwrap_err().to_string().contains("`..`"));
        let e = policy.check(&JobRun::Command { argv: vec!["/bin/sh".into(), "-c".into()] }).unwrap_err().to_string();
        assert!(e.contains("`/bin/sh`") && e.contains("allow_commands"), "{e}");
        let image = JobRun::Container { image: "evil:1".into(), args: vec![], runtime: ContainerRuntime::Docker };
        assert!(policy.check(&image).unwrap_err().to_string().contains("allow_images"));
        assert_eq!(JobPolicy::allow_all().check(&image), Ok(()));
        assert!(JobPolicy::default().check(&JobRun::Command { argv: vec!["x".into()] }).is_err());
    }

    #[test]
    fn a_process_start_time_is_read_and_a_missing_process_has_none() {
        let me = std::process::id();
        assert!(start_ticks(me).is_some());
        assert_eq!(start_ticks(u32::MAX - 1), None);
    }
}
