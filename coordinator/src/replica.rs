//! This coordinator's replica of the Raft group: one OS thread owns the raft-rs `RawNode`, drives it with real ticks,
//! applies committed entries to the [`CoordState`], answers the clients waiting on them, serves read indexes, and
//! snapshots the state every `snapshot_every` entries (then compacts the log, keeping a tail so a briefly lagging
//! follower still catches up from entries).
//!
//! **Persistence runs beside the raft thread** (raft-rs's asynchronous ready): the raft thread records each
//! `Ready`'s entries and hard state where raft-rs reads them ([`RaftStore::stage`]) and hands them to a persist
//! thread, which writes everything queued with one write and one fdatasync ([`RaftStore::write_pending`]), sends
//! the messages that waited for those writes, and then reports the newest `Ready` it made durable. Meanwhile the
//! raft thread takes proposals, sends the leader's appends and counts its followers' acknowledgements. **The
//! durability rule:** nothing this member holds is acknowledged before it is durable here. A follower's or
//! candidate's messages that depend on a `Ready` (append and vote answers) are sent only after that `Ready` and
//! every one before it are durable (by the persist thread, which writes them in order); the leader counts itself towards
//! a commit only for entries it has made durable (raft-rs's `on_persist_ready`); and raft-rs hands out committed
//! entries only up to the durable index, so a client is answered only for a write that is committed and durable on
//! a majority, this member included when it is the leader. A `Ready` that installs a snapshot first waits for the
//! persist thread to finish, then is handled in line.
//!
//! Clients talk to it through a cheap, cloneable [`Replica`] handle. Proposals from a follower are forwarded to the
//! leader by raft-rs itself; each entry names its origin node and request number, so the node that proposed it
//! answers its client when it applies the entry, whoever the leader was.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::prelude::{ConfChange, ConfChangeType, ConfState, Entry, EntryType, Message, Snapshot};
use raft::{RawNode, StateRole};
use tessera_core::fleet::Rejected;
use tokio::sync::{oneshot, watch};

use crate::metrics::Metrics;
use crate::state::{AuditEntry, CoordState, Op, Outcome, Proposal};
use crate::storage::{PendingWrite, RaftStore, StoreError};
use crate::transport::Transport;

/// Raft timing and log settings.
#[derive(Debug, Clone)]
pub struct RaftSettings {
    /// This node's id (> 0).
    pub id: u64,
    /// Tick interval.
    pub tick: Duration,
    /// Ticks without a leader's heartbeat before an election (randomised in `[n, 2n)` by raft-rs).
    pub election_ticks: usize,
    /// Ticks between a leader's heartbeats.
    pub heartbeat_ticks: usize,
    /// Applied entries between two snapshots of the state machine, at least.
    pub snapshot_every: u64,
    /// A snapshot also waits until the entries applied since the last one hold this many times its bytes, so that
    /// writing snapshots costs each write the same whatever the state's size (a larger state is snapshotted less
    /// often, and the log holds at most about this many times the state's bytes). 0: `snapshot_every` alone.
    pub snapshot_log_ratio: f64,
    /// Entries kept behind a snapshot when the log is compacted.
    pub keep_tail: u64,
    /// How long a client waits for its proposal or read index.
    pub request_timeout: Duration,
}

impl Default for RaftSettings {
    fn default() -> Self {
        RaftSettings {
            id: 1,
            tick: Duration::from_millis(100),
            election_ticks: 10,
            heartbeat_ticks: 2,
            snapshot_every: 10_000,
            snapshot_log_ratio: 1.0,
            keep_tail: 1_000,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// Why a request to the node failed.
#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    /// No leader is known (an election is under way, or this node is cut off).
    #[error("no leader is known (election in progress or this node is partitioned); retry")]
    NoLeader,
    /// This node is not the leader and the call must run on the leader.
    #[error("not the leader: the leader is node {id} at {address}")]
    NotLeader {
        /// Leader id.
        id: u64,
        /// Leader address (empty if unknown).
        address: String,
    },
    /// The leader changed while the request waited: it may or may not have been committed.
    #[error("the leader changed while the request was in flight; the outcome is unknown, retry")]
    LeaderChanged,
    /// Not committed (or read index not confirmed) in time: the outcome is unknown.
    #[error("not confirmed within {0:?} (leader change or partition); the outcome is unknown, retry")]
    Timeout(Duration),
    /// The state machine refused the command (nothing changed).
    #[error("{0}")]
    Rejected(Rejected),
    /// Raft refused the request, or its log could not be read.
    #[error("raft: {0}")]
    Raft(#[from] raft::Error),
    /// The node was started with an id that is not among the initial peers (it must join instead).
    #[error("node {id} is not among the initial peers {peers:?}; start it with --join after `member add`")]
    NotAPeer {
        /// This node's id.
        id: u64,
        /// The initial peers' ids.
        peers: Vec<u64>,
    },
    /// One of the node's threads could not be started.
    #[error("cannot start the {what} thread: {source}")]
    Spawn {
        /// Which thread.
        what: &'static str,
        /// What the system said.
        source: std::io::Error,
    },
    /// A committed configuration change could not be decoded.
    #[error("cannot decode the configuration change at index {index}: {source}")]
    ConfChange {
        /// Its log index.
        index: u64,
        /// The decoder's error.
        source: protobuf::ProtobufError,
    },
    /// A snapshot's state could not be decoded.
    #[error("snapshot data: {0}")]
    Snapshot(serde_json::Error),
    /// The thread that makes the log durable has stopped: nothing more can be acknowledged.
    #[error("the persist thread has stopped")]
    PersistStopped,
    /// The durable log failed.
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    /// The node thread is gone.
    #[error("the raft node has stopped")]
    Stopped,
}

/// A point-in-time view of the node's Raft state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// This node.
    pub id: u64,
    /// The leader it knows (0: none).
    pub leader_id: u64,
    /// Current term.
    pub term: u64,
    /// Commit index.
    pub commit: u64,
    /// Applied index.
    pub applied: u64,
    /// Role.
    pub role: StateRole,
    /// Voting members.
    pub voters: Vec<u64>,
}

impl NodeStatus {
    /// The role's lower-case name.
    pub fn role_name(&self) -> &'static str {
        match self.role {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        }
    }
}

type Reply<T> = oneshot::Sender<Result<T, ReplicaError>>;

enum Request {
    Propose {
        op: Box<Op>,
        client_request: Option<String>,
        audit: Option<Box<AuditEntry>>,
        reply: Reply<(u64, Outcome)>,
    },
    ReadIndex {
        reply: Reply<u64>,
    },
    ConfChange {
        change: ConfChange,
        reply: Reply<u64>,
    },
    Step(Vec<Message>),
    /// The snapshot worker wrote the data of the snapshot at `index` (or failed to).
    SnapshotStaged {
        index: u64,
        term: u64,
        conf_state: ConfState,
        result: Result<usize, crate::store_error::StoreError>,
        took: Duration,
    },
    /// The persist thread made more `Ready`s durable (or failed): see [`Durable`].
    Persisted,
}

/// One `Ready`'s writes for the persist thread, and the messages to send once they are durable.
struct PersistJob {
    /// The `Ready`'s number.
    number: u64,
    write: PendingWrite,
    messages: Vec<Message>,
}

/// How far the persist thread got.
#[derive(Default)]
struct Progress {
    /// The newest `Ready` number made durable (its messages sent).
    done: u64,
    /// The error that stopped the thread.
    error: Option<StoreError>,
    /// Peers the thread found unreachable, for raft-rs to hear of.
    unreachable: Vec<u64>,
}

/// The persist thread's [`Progress`], and a signal when it moves.
#[derive(Default)]
struct Durable {
    progress: Mutex<Progress>,
    changed: Condvar,
}

/// `Ready`s the persist thread takes in one batch, at most.
const PERSIST_BATCH: usize = 1024;

/// The persist thread: writes each batch of queued jobs durably with one sync ([`RaftStore::write_pending`]), sends
/// the messages that waited for them (a follower's acknowledgements leave from here, not after a hop back to the
/// raft thread), then records the newest `Ready` number written and wakes the node. After a failed write it writes
/// and sends nothing more: the node stops rather than acknowledge what is not durable.
fn persist_worker<S: RaftStore>(
    store: S,
    jobs: std_mpsc::Receiver<PersistJob>,
    durable: Arc<Durable>,
    transport: Transport,
    node: std_mpsc::Sender<Request>,
) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < PERSIST_BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let number = batch.last().map_or(0, |job| job.number);
        let writes: Vec<PendingWrite> = batch.iter_mut().map(|job| std::mem::take(&mut job.write)).collect();
        let result = store.write_pending(&writes);
        let failed = result.is_err();
        let mut unreachable = Vec::new();
        if !failed {
            for job in batch {
                if !job.messages.is_empty() {
                    unreachable.extend(transport.send(job.messages));
                }
            }
        }
        {
            let mut progress = durable.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match result {
                Ok(()) => progress.done = number,
                Err(e) => progress.error = Some(e),
            }
            progress.unreachable.extend(unreachable);
        }
        durable.changed.notify_all();
        if node.send(Request::Persisted).is_err() || failed {
            return;
        }
    }
}

/// Work for the snapshot thread.
enum SnapshotJob {
    /// Serialise and stage the state as applied at `index`.
    Take { index: u64, term: u64, conf_state: ConfState, state: Box<CoordState> },
    /// Compact the log below this index (a recorded snapshot covers it).
    Compact(u64),
}

/// The snapshot worker: serialises each job's state and stages it in the store (the slow part of a snapshot, off
/// the raft thread), then reports to the node, which records it; then compacts the log behind it when told.
fn snapshot_worker<S: RaftStore>(store: S, jobs: std_mpsc::Receiver<SnapshotJob>, node: std_mpsc::Sender<Request>) {
    for job in jobs {
        match job {
            SnapshotJob::Take { index, term, conf_state, state } => {
                let start = Instant::now();
                let data = state.to_snapshot();
                drop(state);
                let result = store.stage_snapshot(index, term, &data).map(|()| data.len());
                let report = Request::SnapshotStaged { index, term, conf_state, result, took: start.elapsed() };
                if node.send(report).is_err() {
                    return;
                }
            }
            SnapshotJob::Compact(index) => {
                if let Err(e) = store.compact(index) {
                    tracing::error!(index, error = %e, "the log could not be compacted");
                }
            }
        }
    }
}

struct Shared {
    state: RwLock<CoordState>,
    status: watch::Sender<NodeStatus>,
    applied: watch::Sender<u64>,
    members: RwLock<BTreeMap<u64, String>>,
    /// Voters as of the last applied configuration change.
    voters: RwLock<Vec<u64>>,
    /// The serials of the certificates each peer has spoken Raft to this member with (at most
    /// [`MAX_SERIALS_SEEN`] per peer, newest kept): removing a member revokes them.
    serials_seen: Mutex<BTreeMap<u64, VecDeque<String>>>,
}

/// Certificates remembered per peer ([`Replica::saw_certificate`]).
pub const MAX_SERIALS_SEEN: usize = 8;

/// A handle on the Raft node (cheap to clone).
#[derive(Clone)]
pub struct Replica {
    id: u64,
    tx: std_mpsc::Sender<Request>,
    shared: Arc<Shared>,
    timeout: Duration,
    transport: Transport,
}

impl Replica {
    /// Starts the node thread over `store`.
    ///
    /// `peers` are the initial cluster's members and addresses. On an empty store, a node listed in `peers`
    /// bootstraps the cluster's first configuration (every node of a new cluster does the same, as in etcd);
    /// with `join` set it starts empty and waits for the leader, after an operator added it as a member.
    pub fn start<S: RaftStore>(
        settings: RaftSettings,
        store: S,
        peers: BTreeMap<u64, String>,
        join: bool,
        transport: Transport,
        metrics: Arc<Metrics>,
    ) -> Result<Replica, ReplicaError> {
        let initial = raft::Storage::initial_state(&store)?;
        let mut snapshot = store.latest_snapshot()?;
        if !initial.initialized() && snapshot.is_none() && !join {
            if !peers.contains_key(&settings.id) {
                return Err(ReplicaError::NotAPeer { id: settings.id, peers: peers.keys().copied().collect() });
            }
            // As raft-rs's MemStorage::initialize_with_conf_state: a snapshot at index 1 holding the first
            // configuration, so followers that start later catch up from it.
            let mut snap = Snapshot::default();
            snap.mut_metadata().index = 1;
            snap.mut_metadata().term = 1;
            *snap.mut_metadata().mut_conf_state() = ConfState::from((peers.keys().copied(), Vec::<u64>::new()));
            snap.data = CoordState::default().to_snapshot().into();
            store.apply_snapshot(&snap)?;
            snapshot = Some(snap);
        }
        let (state, applied) = match &snapshot {
            Some(s) => (CoordState::from_snapshot(&s.data).map_err(ReplicaError::Snapshot)?, s.get_metadata().index),
            None => (CoordState::default(), 0),
        };
        let config = raft::Config {
            id: settings.id,
            election_tick: settings.election_ticks,
            heartbeat_tick: settings.heartbeat_ticks,
            applied,
            max_size_per_msg: 4 * 1024 * 1024,
            max_inflight_msgs: 256,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        config.validate()?;
        let logger = slog::Logger::root(crate::logging::SlogToTracing, slog::o!());
        let raw = RawNode::new(&config, store.clone(), &logger)?;

        let mut members = peers.clone();
        members.extend(state.members.iter().map(|(k, v)| (*k, v.clone())));
        for (id, addr) in &members {
            transport.set_address(*id, addr);
        }
        let status = NodeStatus {
            id: settings.id,
            leader_id: 0,
            term: raw.raft.term,
            commit: raw.raft.raft_log.committed,
            applied,
            role: raw.raft.state,
            voters: raw.raft.prs().conf().voters().ids().iter().collect(),
        };
        let voters: Vec<u64> = raw.raft.prs().conf().voters().ids().iter().collect();
        let shared = Arc::new(Shared {
            voters: RwLock::new(voters),
            state: RwLock::new(state),
            status: watch::Sender::new(status),
            applied: watch::Sender::new(applied),
            members: RwLock::new(members),
            serials_seen: Mutex::default(),
        });
        let (tx, rx) = std_mpsc::channel();
        let (jobs, job_rx) = std_mpsc::channel();
        {
            let (store, tx) = (store.clone(), tx.clone());
            std::thread::Builder::new()
                .name(format!("snapshot-{}", settings.id))
                .spawn(move || snapshot_worker(store, job_rx, tx))
                .map_err(|source| ReplicaError::Spawn { what: "snapshot", source })?;
        }
        let durable = Arc::new(Durable::default());
        let (persist_jobs, persist_rx) = std_mpsc::channel();
        {
            let (store, tx, durable, transport) = (store.clone(), tx.clone(), Arc::clone(&durable), transport.clone());
            std::thread::Builder::new()
                .name(format!("persist-{}", settings.id))
                .spawn(move || persist_worker(store, persist_rx, durable, transport, tx))
                .map_err(|source| ReplicaError::Spawn { what: "persist", source })?;
        }
        let conf_state = raw.raft.prs().conf().to_conf_state();
        let mut driver = Driver {
            raw,
            store,
            settings: settings.clone(),
            transport: transport.clone(),
            shared: Arc::clone(&shared),
            metrics,
            proposals: HashMap::new(),
            reads: HashMap::new(),
            waiting_reads: Vec::new(),
            conf_changes: HashMap::new(),
            // Unique across restarts: an entry this member proposed in an earlier life, applied after it restarted,
            // must not be taken for (and answer) a request of this one.
            next_request: wall_ms() << 16,
            applied,
            last_snapshot: applied,
            conf_state,
            force_snapshot: false,
            snapshot_jobs: jobs,
            snapshotting: false,
            snapshot_bytes: snapshot.as_ref().map_or(0, |s| s.data.len() as u64),
            log_bytes: 0,
            last_leader: 0,
            persist_jobs,
            durable,
            submitted: 0,
            persisted: 0,
        };
        std::thread::Builder::new()
            .name(format!("raft-{}", settings.id))
            .spawn(move || driver.run(rx))
            .map_err(|source| ReplicaError::Spawn { what: "raft", source })?;
        Ok(Replica { id: settings.id, tx, shared, timeout: settings.request_timeout, transport })
    }

    /// This node's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Replicates `op`; answers once this node applied it, with its log index and outcome.
    pub async fn propose(&self, op: Op) -> Result<(u64, Outcome), ReplicaError> {
        self.propose_request(op, None, None).await
    }

    /// [`Replica::propose`] for a client write with its request id: a retry with the same id that finds the first
    /// attempt applied answers [`Outcome::Duplicate`] instead of applying it again.
    /// With `audit`, the action is recorded in the replicated audit log with its result.
    pub async fn propose_request(
        &self,
        op: Op,
        client_request: Option<String>,
        audit: Option<AuditEntry>,
    ) -> Result<(u64, Outcome), ReplicaError> {
        let (reply, rx) = oneshot::channel();
        let (op, audit) = (Box::new(op), audit.map(Box::new));
        self.tx.send(Request::Propose { op, client_request, audit, reply }).map_err(|_| ReplicaError::Stopped)?;
        self.wait(rx).await
    }

    /// Confirms with the leader (read index) that this node's state is current and waits until it has applied
    /// that far; returns the index.
    pub async fn read_index(&self) -> Result<u64, ReplicaError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::ReadIndex { reply }).map_err(|_| ReplicaError::Stopped)?;
        let index = self.wait(rx).await?;
        self.wait_applied(index).await?;
        Ok(index)
    }

    /// A linearizable read: [`Replica::read_index`], then `f` over the state.
    pub async fn read_current<R>(&self, f: impl FnOnce(&CoordState) -> R) -> Result<R, ReplicaError> {
        self.read_index().await?;
        Ok(self.read(f))
    }

    /// A read of this node's applied state (may be behind the leader).
    pub fn read<R>(&self, f: impl FnOnce(&CoordState) -> R) -> R {
        f(&self.shared.state.read().expect("state lock"))
    }

    /// Adds a voting member at `address`; answers once the change is applied here.
    pub async fn add_member(&self, id: u64, address: &str) -> Result<u64, ReplicaError> {
        let mut change = ConfChange::default();
        change.set_change_type(ConfChangeType::AddNode);
        change.node_id = id;
        change.context = address.as_bytes().to_vec().into();
        self.conf_change(change).await
    }

    /// Removes a member; answers once the change is applied here.
    pub async fn remove_member(&self, id: u64) -> Result<u64, ReplicaError> {
        let mut change = ConfChange::default();
        change.set_change_type(ConfChangeType::RemoveNode);
        change.node_id = id;
        self.conf_change(change).await
    }

    async fn conf_change(&self, change: ConfChange) -> Result<u64, ReplicaError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request::ConfChange { change, reply }).map_err(|_| ReplicaError::Stopped)?;
        self.wait(rx).await
    }

    /// Hands messages received from a peer to the node.
    pub fn step(&self, messages: Vec<Message>) -> Result<(), ReplicaError> {
        self.tx.send(Request::Step(messages)).map_err(|_| ReplicaError::Stopped)
    }

    /// The current status.
    pub fn status(&self) -> NodeStatus {
        self.shared.status.borrow().clone()
    }

    /// Status updates: a change is signalled when the leader, term, role or voters change; the commit and applied
    /// indexes are current whenever the status is read, but do not signal (use [`Replica::watch_applied`]).
    pub fn watch_status(&self) -> watch::Receiver<NodeStatus> {
        self.shared.status.subscribe()
    }

    /// Applied-index updates.
    pub fn watch_applied(&self) -> watch::Receiver<u64> {
        self.shared.applied.subscribe()
    }

    /// Members with their addresses (this node's included).
    pub fn members(&self) -> BTreeMap<u64, String> {
        let mut m = self.shared.members.read().expect("members lock").clone();
        m.insert(self.id, self.transport.own_address().to_string());
        let voters = self.shared.voters.read().expect("voters lock").clone();
        m.retain(|id, _| voters.contains(id));
        m
    }

    /// Whether `id` is this member or a peer of the current configuration (the configured peers, then every
    /// committed membership change): the members whose certificates may speak Raft and act as coordinators.
    pub fn is_member(&self, id: u64) -> bool {
        id == self.id || self.shared.members.read().expect("members lock").contains_key(&id)
    }

    /// Whether the certificate with serial `serial` (as `tessera_auth::normalize_serial` writes it) is revoked.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.shared.state.read().expect("state lock").revoked.contains_key(serial)
    }

    /// The revocation list as agents get it: `None` when `known` (the index of the caller's copy) is current,
    /// otherwise the list's index (that of its newest revocation; 0 when nothing is revoked) and every serial.
    pub fn revocations_unless(&self, known: Option<u64>) -> Option<(u64, Vec<String>)> {
        let state = self.shared.state.read().expect("state lock");
        let index = state.revoked.values().map(|r| r.index).max().unwrap_or(0);
        (known != Some(index)).then(|| (index, state.revoked.keys().cloned().collect()))
    }

    /// Records that member `id` spoke Raft to this member with the certificate whose serial is `serial`.
    pub fn saw_certificate(&self, id: u64, serial: &str) {
        let mut seen = self.shared.serials_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let serials = seen.entry(id).or_default();
        if serials.back().is_some_and(|s| s == serial) {
            return;
        }
        serials.retain(|s| s != serial);
        serials.push_back(serial.to_string());
        while serials.len() > MAX_SERIALS_SEEN {
            serials.pop_front();
        }
    }

    /// The serials of the certificates member `id` has spoken Raft to this member with since it started, oldest
    /// first.
    pub fn certificates_seen(&self, id: u64) -> Vec<String> {
        let seen = self.shared.serials_seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.get(&id).map(|s| s.iter().cloned().collect()).unwrap_or_default()
    }

    /// The ids [`Replica::is_member`] accepts, in order.
    pub fn members_known(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.shared.members.read().expect("members lock").keys().copied().collect();
        ids.push(self.id);
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The leader's address, if a leader is known.
    pub fn leader(&self) -> Option<(u64, String)> {
        let id = self.status().leader_id;
        if id == 0 {
            return None;
        }
        if id == self.id {
            return Some((id, self.transport.own_address().to_string()));
        }
        let addr = self.shared.members.read().expect("members lock").get(&id).cloned().unwrap_or_default();
        Some((id, addr))
    }

    /// The error to answer for a call that must run on the leader, or `None` when this node leads.
    pub fn not_leader(&self) -> Option<ReplicaError> {
        match self.leader() {
            Some((id, _)) if id == self.id => None,
            Some((id, address)) => Some(ReplicaError::NotLeader { id, address }),
            None => Some(ReplicaError::NoLeader),
        }
    }

    /// The transport (peer addresses, partition hook).
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    async fn wait<T>(&self, rx: oneshot::Receiver<Result<T, ReplicaError>>) -> Result<T, ReplicaError> {
        match tokio::time::timeout(self.timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(ReplicaError::Stopped),
            Err(_) => Err(ReplicaError::Timeout(self.timeout)),
        }
    }

    /// Waits until this node has applied `index`.
    pub async fn wait_applied(&self, index: u64) -> Result<(), ReplicaError> {
        let mut rx = self.shared.applied.subscribe();
        let wait = rx.wait_for(|a| *a >= index);
        match tokio::time::timeout(self.timeout, wait).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) => Err(ReplicaError::Stopped),
            Err(_) => Err(ReplicaError::Timeout(self.timeout)),
        }
    }
}

struct Driver<S: RaftStore> {
    raw: RawNode<S>,
    store: S,
    settings: RaftSettings,
    transport: Transport,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    proposals: HashMap<u64, PendingProposal>,
    reads: HashMap<u64, Reply<u64>>,
    /// Confirmed read indexes waiting for the state machine to catch up.
    waiting_reads: Vec<(u64, Reply<u64>)>,
    conf_changes: HashMap<u64, Reply<u64>>,
    next_request: u64,
    applied: u64,
    last_snapshot: u64,
    conf_state: ConfState,
    /// Snapshot at the end of this batch: a configuration changed, and a member added later must receive a
    /// snapshot whose configuration includes it (raft-rs ignores one that does not).
    force_snapshot: bool,
    /// Jobs for the snapshot worker.
    snapshot_jobs: std_mpsc::Sender<SnapshotJob>,
    /// Whether the worker is writing a snapshot (one at a time).
    snapshotting: bool,
    /// Bytes of the latest snapshot's data.
    snapshot_bytes: u64,
    /// Bytes of the entries applied since the latest snapshot was taken.
    log_bytes: u64,
    /// The leader as of the last status update (0: none).
    last_leader: u64,
    /// Jobs for the persist thread.
    persist_jobs: std_mpsc::Sender<PersistJob>,
    /// The persist thread's progress.
    durable: Arc<Durable>,
    /// The newest `Ready` number handed to the persist thread.
    submitted: u64,
    /// The newest `Ready` number known durable (raft-rs told with `on_persist_ready`).
    persisted: u64,
}

impl<S: RaftStore> Driver<S> {
    fn run(&mut self, rx: std_mpsc::Receiver<Request>) {
        let mut next_tick = Instant::now() + self.settings.tick;
        let mut ticks = 0u64;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(req) => {
                    self.handle(req);
                    for _ in 0..4096 {
                        match rx.try_recv() {
                            Ok(req) => self.handle(req),
                            Err(_) => break,
                        }
                    }
                }
                Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
            }
            let now = Instant::now();
            if now >= next_tick {
                self.raw.tick();
                ticks += 1;
                next_tick += self.settings.tick;
                if next_tick < now {
                    next_tick = now + self.settings.tick;
                }
                if ticks.is_multiple_of(50) {
                    self.proposals.retain(|_, p| !p.reply.is_closed());
                    self.reads.retain(|_, r| !r.is_closed());
                    self.conf_changes.retain(|_, r| !r.is_closed());
                }
            }
            if let Err(e) = self.collect_persisted(false) {
                tracing::error!(error = %e, "raft storage failed; the node stops");
                return;
            }
            if self.raw.has_ready()
                && let Err(e) = self.on_ready()
            {
                // The log could not be persisted: stop rather than acknowledge what is not durable.
                tracing::error!(error = %e, "raft storage failed; the node stops");
                return;
            }
            self.publish_status();
        }
    }

    fn request_id(&mut self) -> u64 {
        let id = self.next_request;
        self.next_request += 1;
        id
    }

    fn handle(&mut self, req: Request) {
        match req {
            Request::Propose { op, client_request, audit, reply } => {
                if self.raw.raft.leader_id == 0 {
                    let _ = reply.send(Err(ReplicaError::NoLeader));
                    return;
                }
                let request = self.request_id();
                // The proposer stops waiting after the request timeout; a leader that receives the proposal later
                // (forwarded through a connection that stalled) drops it rather than apply it after newer writes.
                let deadline_ms = wall_ms() + self.settings.request_timeout.as_millis() as u64;
                let proposal = Proposal {
                    origin: self.settings.id,
                    request,
                    op: *op,
                    deadline_ms: Some(deadline_ms),
                    client_request,
                    audit: audit.map(|a| *a),
                };
                let data = serde_json::to_vec(&proposal).expect("proposals serialise");
                match self.raw.propose(own_context(self.settings.id, request), data.clone()) {
                    Ok(()) => {
                        self.metrics.proposal();
                        self.proposals.insert(request, PendingProposal { reply, data, proposal: Some(proposal) });
                    }
                    Err(e) => {
                        let _ = reply.send(Err(self.refusal(e)));
                    }
                }
            }
            Request::ReadIndex { reply } => {
                if self.raw.raft.leader_id == 0 {
                    let _ = reply.send(Err(ReplicaError::NoLeader));
                    return;
                }
                let request = self.request_id();
                self.reads.insert(request, reply);
                self.raw.read_index(request.to_be_bytes().to_vec());
            }
            Request::ConfChange { change, reply } => {
                if self.raw.raft.state != StateRole::Leader {
                    let _ = reply.send(Err(self.not_leader()));
                    return;
                }
                let request = self.request_id();
                match self.raw.propose_conf_change(request.to_be_bytes().to_vec(), change) {
                    Ok(()) => {
                        self.conf_changes.insert(request, reply);
                    }
                    Err(e) => {
                        let _ = reply.send(Err(self.refusal(e)));
                    }
                }
            }
            Request::SnapshotStaged { index, term, conf_state, result, took } => {
                self.snapshotting = false;
                if let Err(e) = self.record_snapshot(index, term, conf_state, result, took) {
                    tracing::error!(index, error = %e, "the snapshot could not be recorded; the log is not compacted");
                }
            }
            // Read in `collect_persisted`, once per pass of the loop.
            Request::Persisted => {}
            Request::Step(messages) => {
                for m in messages {
                    if self.transport.is_blocked(m.from) {
                        continue;
                    }
                    if let Err(e) = self.raw.step(m) {
                        tracing::trace!(error = %e, "raft step refused a message");
                    }
                }
            }
        }
    }

    fn not_leader(&self) -> ReplicaError {
        let id = self.raw.raft.leader_id;
        if id == 0 {
            return ReplicaError::NoLeader;
        }
        let address = self.shared.members.read().expect("members lock").get(&id).cloned().unwrap_or_default();
        ReplicaError::NotLeader { id, address }
    }

    fn refusal(&self, e: raft::Error) -> ReplicaError {
        match e {
            raft::Error::ProposalDropped => self.not_leader(),
            other => ReplicaError::Raft(other),
        }
    }

    fn send(&mut self, messages: Vec<Message>) {
        if messages.is_empty() {
            return;
        }
        for peer in self.transport.send(messages) {
            self.raw.report_unreachable(peer);
        }
    }

    /// Tells raft-rs how far the persist thread got (and which peers it found unreachable), first waiting until it
    /// has made every `Ready` handed to it durable if `wait`; fails if the persist thread failed.
    fn collect_persisted(&mut self, wait: bool) -> Result<(), ReplicaError> {
        if self.submitted <= self.persisted {
            return Ok(());
        }
        let (done, unreachable) = {
            let mut progress = self.durable.progress.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            while wait && progress.error.is_none() && progress.done < self.submitted {
                progress = self.durable.changed.wait(progress).unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if let Some(e) = progress.error.take() {
                return Err(e.into());
            }
            (progress.done, std::mem::take(&mut progress.unreachable))
        };
        for peer in unreachable {
            self.raw.report_unreachable(peer);
        }
        self.mark_persisted(done);
        Ok(())
    }

    /// Records that every `Ready` up to `number` is durable (the persist thread sent their messages).
    fn mark_persisted(&mut self, number: u64) {
        if number <= self.persisted {
            return;
        }
        self.persisted = number;
        self.raw.on_persist_ready(number);
    }

    /// Handles a `Ready`: sends the leader's messages at once, applies what is committed, records the entries and
    /// hard state where raft-rs reads them and hands their durable write to the persist thread; the messages that
    /// must follow persistence wait for it (module docs). A `Ready` with a snapshot waits for the persist thread and
    /// is handled in line ([`Driver::on_ready_in_line`]).
    fn on_ready(&mut self) -> Result<(), ReplicaError> {
        if self.raw.snap().is_some_and(|s| !s.is_empty()) {
            self.collect_persisted(true)?;
            return self.on_ready_in_line();
        }
        let mut ready = self.raw.ready();
        if !ready.messages().is_empty() {
            let m = ready.take_messages();
            self.send(m);
        }
        let committed = ready.take_committed_entries();
        self.apply(committed)?;
        for rs in ready.take_read_states() {
            self.read_confirmed(&rs.request_ctx, rs.index);
        }
        let write = self.store.stage(ready.take_entries(), ready.hs().cloned())?;
        let persisted_messages = ready.take_persisted_messages();
        let number = ready.number();
        self.raw.advance_append_async(ready);
        if self.submitted <= self.persisted && !write.needs_sync() {
            // Nothing queued before it and nothing to wait for: a commit index alone is written here, unsynced.
            if !write.is_empty() {
                self.store.write_pending(std::slice::from_ref(&write))?;
            }
            self.mark_persisted(number);
            self.send(persisted_messages);
        } else {
            self.submitted = number;
            let job = PersistJob { number, write, messages: persisted_messages };
            if self.persist_jobs.send(job).is_err() {
                return Err(ReplicaError::PersistStopped);
            }
        }
        self.raw.advance_apply();
        self.maybe_snapshot()?;
        Ok(())
    }

    /// Handles a `Ready` wholly on the raft thread, persisting before it advances: for a snapshot from the leader,
    /// once everything queued before it is durable.
    fn on_ready_in_line(&mut self) -> Result<(), ReplicaError> {
        let mut ready = self.raw.ready();
        if !ready.messages().is_empty() {
            let m = ready.take_messages();
            self.send(m);
        }
        if !ready.snapshot().is_empty() {
            let snap = ready.snapshot().clone();
            self.store.apply_snapshot(&snap)?;
            self.install(&snap)?;
        }
        let committed = ready.take_committed_entries();
        self.apply(committed)?;
        // Entries and hard state, durable together: one sync of the log per Ready (and of the hard state when term
        // or vote change).
        if !ready.entries().is_empty() || ready.hs().is_some() {
            self.store.persist(ready.entries(), ready.hs())?;
        }
        for rs in ready.take_read_states() {
            self.read_confirmed(&rs.request_ctx, rs.index);
        }
        if !ready.persisted_messages().is_empty() {
            let m = ready.take_persisted_messages();
            self.send(m);
        }
        let number = ready.number();
        let mut light = self.raw.advance(ready);
        // `advance` told raft-rs that every `Ready` up to this one is durable.
        self.persisted = number;
        if let Some(commit) = light.commit_index() {
            // Only the commit index moved: raft does not need it durable, so this write does not wait for the disk.
            let mut hs = self.raw.raft.hard_state();
            hs.commit = commit;
            self.store.set_commit(&hs)?;
        }
        let m = light.take_messages();
        self.send(m);
        let committed = light.take_committed_entries();
        self.apply(committed)?;
        self.raw.advance_apply();
        self.maybe_snapshot()?;
        Ok(())
    }

    fn read_confirmed(&mut self, ctx: &[u8], index: u64) {
        let Ok(bytes) = <[u8; 8]>::try_from(ctx) else { return };
        if let Some(reply) = self.reads.remove(&u64::from_be_bytes(bytes)) {
            if self.applied >= index {
                let _ = reply.send(Ok(index));
            } else {
                self.waiting_reads.push((index, reply));
            }
        }
    }

    fn install(&mut self, snap: &Snapshot) -> Result<(), ReplicaError> {
        let meta = snap.get_metadata();
        let state = CoordState::from_snapshot(&snap.data).map_err(ReplicaError::Snapshot)?;
        {
            let mut members = self.shared.members.write().expect("members lock");
            for (id, addr) in &state.members {
                members.insert(*id, addr.clone());
                self.transport.set_address(*id, addr);
            }
        }
        *self.shared.state.write().expect("state lock") = state;
        self.applied = meta.index;
        self.last_snapshot = meta.index;
        self.snapshot_bytes = snap.data.len() as u64;
        self.log_bytes = 0;
        self.conf_state = meta.get_conf_state().clone();
        *self.shared.voters.write().expect("voters lock") = self.conf_state.voters.clone();
        self.shared.applied.send_replace(self.applied);
        tracing::info!(index = meta.index, term = meta.term, "installed a snapshot from the leader");
        Ok(())
    }

    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), ReplicaError> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut answers = Vec::new();
        {
            let mut state = self.shared.state.write().expect("state lock");
            for entry in entries {
                if entry.index <= self.applied {
                    continue;
                }
                self.applied = entry.index;
                self.log_bytes += entry.data.len() as u64;
                match entry.get_entry_type() {
                    EntryType::EntryNormal if entry.data.is_empty() => {}
                    EntryType::EntryNormal => {
                        // This member's own proposal, still in memory: the same bytes decode to the same value.
                        let own = parse_own_context(&entry.context)
                            .filter(|(origin, _)| *origin == self.settings.id)
                            .and_then(|(_, request)| self.proposals.get_mut(&request))
                            .filter(|pending| pending.data[..] == entry.data[..])
                            .and_then(|pending| pending.proposal.take());
                        let decoded = match own {
                            Some(p) => Ok(p),
                            None => serde_json::from_slice::<Proposal>(&entry.data),
                        };
                        let proposal = match decoded {
                            Ok(p) => p,
                            Err(e) => {
                                tracing::error!(index = entry.index, error = %e, "undecodable log entry skipped");
                                continue;
                            }
                        };
                        let (origin, request) = (proposal.origin, proposal.request);
                        let result = state.apply_proposal(entry.index, proposal).map(|o| (entry.index, o));
                        if origin == self.settings.id {
                            if let Ok((_, Outcome::Duplicate(at))) = result {
                                self.metrics.write_resent();
                                tracing::info!(
                                    index = entry.index,
                                    applied_at = at,
                                    "a client resent a write applied before: answered, not applied again"
                                );
                            }
                            answers.push((request, result));
                        }
                    }
                    EntryType::EntryConfChange => {
                        let mut cc = ConfChange::default();
                        cc.merge_from_bytes(&entry.data)
                            .map_err(|source| ReplicaError::ConfChange { index: entry.index, source })?;
                        let cs = self.raw.apply_conf_change(&cc)?;
                        self.store.set_conf_state(&cs)?;
                        *self.shared.voters.write().expect("voters lock") = cs.voters.clone();
                        self.conf_state = cs;
                        self.force_snapshot = true;
                        let address = String::from_utf8_lossy(&cc.context).to_string();
                        match cc.get_change_type() {
                            ConfChangeType::AddNode | ConfChangeType::AddLearnerNode => {
                                if !address.is_empty() {
                                    state.members.insert(cc.node_id, address.clone());
                                    self.shared
                                        .members
                                        .write()
                                        .expect("members lock")
                                        .insert(cc.node_id, address.clone());
                                    self.transport.set_address(cc.node_id, &address);
                                }
                            }
                            ConfChangeType::RemoveNode => {
                                state.members.remove(&cc.node_id);
                                self.shared.members.write().expect("members lock").remove(&cc.node_id);
                                self.transport.remove(cc.node_id);
                            }
                        }
                        tracing::info!(node = cc.node_id, change = ?cc.get_change_type(), %address, "membership changed");
                        if let Ok(bytes) = <[u8; 8]>::try_from(&entry.context[..])
                            && let Some(reply) = self.conf_changes.remove(&u64::from_be_bytes(bytes))
                        {
                            let _ = reply.send(Ok(entry.index));
                        }
                    }
                    EntryType::EntryConfChangeV2 => {
                        tracing::warn!(index = entry.index, "conf change v2 entries are not used; skipped");
                    }
                }
            }
        }
        self.shared.applied.send_replace(self.applied);
        for (request, result) in answers {
            if let Some(pending) = self.proposals.remove(&request) {
                let _ = pending.reply.send(result.map_err(ReplicaError::Rejected));
            }
        }
        let applied = self.applied;
        let (ready, waiting): (Vec<_>, Vec<_>) = self.waiting_reads.drain(..).partition(|(i, _)| *i <= applied);
        self.waiting_reads = waiting;
        for (index, reply) in ready {
            let _ = reply.send(Ok(index));
        }
        Ok(())
    }

    /// Hands a snapshot of the state at the applied index to the worker when one is due (every `snapshot_every`
    /// entries, or after a configuration change) and none is in flight. The raft thread only clones the state;
    /// serialising and writing it happen on the worker, and [`Driver::record_snapshot`] finishes the job.
    fn maybe_snapshot(&mut self) -> Result<(), ReplicaError> {
        if self.snapshotting {
            return Ok(());
        }
        let due = self.applied >= self.last_snapshot + self.settings.snapshot_every
            && self.log_bytes as f64 >= self.settings.snapshot_log_ratio * self.snapshot_bytes as f64;
        if !(due || self.force_snapshot && self.applied > self.last_snapshot) {
            return Ok(());
        }
        self.force_snapshot = false;
        self.log_bytes = 0;
        let term = self.raw.raft.raft_log.term(self.applied)?;
        let start = Instant::now();
        let state = Box::new(self.shared.state.read().expect("state lock").clone());
        let cloned = start.elapsed();
        let job = SnapshotJob::Take { index: self.applied, term, conf_state: self.conf_state.clone(), state };
        if let Err(std_mpsc::SendError(SnapshotJob::Take { index, conf_state, state, .. })) =
            self.snapshot_jobs.send(job)
        {
            // The worker is gone (it only stops with the node): snapshot here.
            let data = state.to_snapshot();
            self.snapshot_bytes = data.len() as u64;
            self.store.create_snapshot(index, conf_state, data)?;
            self.last_snapshot = index;
            return self.compact_after(index);
        }
        tracing::debug!(index = self.applied, clone_ms = cloned.as_secs_f64() * 1e3, "snapshot handed to the worker");
        self.snapshotting = true;
        self.last_snapshot = self.applied;
        Ok(())
    }

    /// Records a snapshot the worker staged and compacts the log behind it. A snapshot the node has meanwhile
    /// moved past (one installed from the leader) is dropped; a failed write is retried after `snapshot_every`
    /// more entries.
    fn record_snapshot(
        &mut self,
        index: u64,
        term: u64,
        conf_state: ConfState,
        result: Result<usize, crate::store_error::StoreError>,
        took: Duration,
    ) -> Result<(), ReplicaError> {
        let bytes = match result {
            Ok(b) => {
                self.snapshot_bytes = b as u64;
                b
            }
            Err(e) => {
                tracing::warn!(index, error = %e, "the snapshot could not be written; retried later");
                return Ok(());
            }
        };
        match self.store.commit_snapshot(index, term, conf_state) {
            Ok(()) => {}
            Err(StoreError::SnapshotOutOfDate { .. }) => {
                tracing::debug!(index, "a snapshot the node has moved past is dropped");
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        }
        tracing::debug!(index, bytes, write_ms = took.as_secs_f64() * 1e3, "snapshot taken");
        self.compact_after(index)
    }

    /// Compacts the log behind a snapshot at `index`, keeping `keep_tail` entries: on the snapshot thread, or here
    /// if it is gone.
    fn compact_after(&mut self, index: u64) -> Result<(), ReplicaError> {
        let first = raft::Storage::first_index(&self.store)?;
        let compact_to = (index + 1).saturating_sub(self.settings.keep_tail);
        if compact_to > first && self.snapshot_jobs.send(SnapshotJob::Compact(compact_to)).is_err() {
            self.store.compact(compact_to)?;
        }
        Ok(())
    }

    fn publish_status(&mut self) {
        let leader = self.raw.raft.leader_id;
        if leader != self.last_leader {
            // Requests forwarded to (or accepted by) the old leader may be lost with it: answer them now, so
            // clients retry against the new leader instead of waiting out their deadline.
            if self.last_leader != 0 {
                for (_, p) in self.proposals.drain() {
                    let _ = p.reply.send(Err(ReplicaError::LeaderChanged));
                }
                for (_, r) in self.reads.drain() {
                    let _ = r.send(Err(ReplicaError::LeaderChanged));
                }
                for (_, r) in self.conf_changes.drain() {
                    let _ = r.send(Err(ReplicaError::LeaderChanged));
                }
            }
            self.last_leader = leader;
        }
        let raft = &self.raw.raft;
        let status = NodeStatus {
            id: self.settings.id,
            leader_id: raft.leader_id,
            term: raft.term,
            commit: raft.raft_log.committed,
            applied: self.applied,
            role: raft.state,
            voters: raft.prs().conf().voters().ids().iter().collect(),
        };
        let members = status.voters.len();
        self.metrics.set_raft(status.term, status.commit, status.applied, status.role == StateRole::Leader, members);
        self.metrics.set_leader_known(status.leader_id != 0);
        // Watchers hear of changes of leader, term, role and voters only: the commit and applied indexes move with
        // every write, and waking every watcher (the planning loop on each member) per write cost each write a
        // task switch and, on the leader, a health check and a push pass. They are updated all the same.
        self.shared.status.send_if_modified(|s| {
            let notify = (s.leader_id, s.term, s.role, &s.voters)
                != (status.leader_id, status.term, status.role, &status.voters);
            *s = status;
            notify
        });
    }
}

/// A proposal this member made, waiting to be applied.
struct PendingProposal {
    /// Who waits for its outcome.
    reply: Reply<(u64, Outcome)>,
    /// The entry's data as proposed.
    data: Vec<u8>,
    /// The proposal itself, taken when the entry is applied here (instead of decoding `data` again).
    proposal: Option<Proposal>,
}

/// An entry's context naming the member that proposed it and its request number (16 bytes, big-endian): lets the
/// proposer find its own proposal when it applies the entry.
fn own_context(origin: u64, request: u64) -> Vec<u8> {
    let mut context = Vec::with_capacity(16);
    context.extend_from_slice(&origin.to_be_bytes());
    context.extend_from_slice(&request.to_be_bytes());
    context
}

/// The origin and request number of [`own_context`]'s context; `None` for any other (entries from older builds
/// have none).
fn parse_own_context(context: &[u8]) -> Option<(u64, u64)> {
    let bytes: [u8; 16] = context.try_into().ok()?;
    let (origin, request) = bytes.split_at(8);
    Some((u64::from_be_bytes(origin.try_into().ok()?), u64::from_be_bytes(request.try_into().ok()?)))
}

/// Wall-clock time, Unix ms (proposal deadlines).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
