//! The Raft log's durable storage.
//!
//! [`RaftStore`] is what the Raft node needs from its storage: raft-rs's read side ([`raft::Storage`]) plus the
//! writes a `Ready` asks for (entries, hard state, conf state, snapshots) and log compaction. Two implementations:
//!
//! - [`MemStore`]: in memory, a thin wrapper around raft-rs's [`MemStorage`] plus the latest snapshot's data; for
//!   unit tests of the node.
//! - [`SledStore`]: durable. The entries are in the log's own segment files, `wal/` ([`crate::wal`]: staged in
//!   memory by the raft thread and appended and fdatasynced by the node's persist thread, one write for everything
//!   staged meanwhile, and kept whole in memory for reads); tree
//!   `raft_meta` of a sled database holds `hard_state`, `conf_state` and `snapshot_meta` (protobuf), which change
//!   rarely, and `first_index`, the log's first index after the latest compaction. (In sled, the entries cost
//!   every write a sled sync, which wakes all of sled's I/O threads.) A hard state that changes only the commit
//!   index is written to sled without a sync: raft does not need it durable.
//!   The snapshot's data (the state machine's bytes) is a file outside sled, `snapshots/<index>-<term>.snap`,
//!   written to a temporary name, fsynced and renamed before the metadata names it; older snapshot files are
//!   deleted once a newer one is durable, and leftovers are removed on open. (Kept inside sled, a multi-megabyte
//!   value sharing a tree with the hard state, which changes on every `Ready`, was rewritten with it: a member held
//!   67 to 114 copies of the state.) Every mutating call but [`RaftStore::stage`] is durable when it returns, as
//!   raft requires before messages are sent (what `stage` records is durable once
//!   [`RaftStore::write_pending`] returned): sled writes are followed by [`SledStore::sync`] (sled's flush plus an fdatasync of its log
//!   file). `apply_snapshot` writes the snapshot file first, then the metadata, hard state and conf state in one
//!   sled batch, then restarts the log; after a crash in between, the next open drops the old log where it
//!   contradicts the snapshot (it ends below its index, or has another term there) and keeps it where it agrees.
//!   Stores written before the entries moved out of sled (tree `raft_entries`) or before snapshots did
//!   (`snapshot_data` in `raft_meta`) open as before: the first open moves the entries, the next snapshot the
//!   data. Entries found in sled on a later open (a binary from before the files ran the store after a
//!   downgrade) are the log too, and replace the files.
//!
//! Semantics follow raft-rs's `MemStorage`: the snapshot index acts as the log's dummy entry, so
//! `term(snapshot index)` is the snapshot's term; an empty log has `first_index = snapshot index + 1` and
//! `last_index = snapshot index`; reads below `first_index` fail with [`StorageError::Compacted`] and past
//! `last_index` with [`StorageError::Unavailable`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, Storage, StorageError};

use crate::wal::{self, Wal};

pub use crate::store_error::StoreError;

/// What the Raft node needs to persist besides [`raft::Storage`]'s read side. Implementations are cheap-to-clone
/// handles (an `Arc` inside), so the node can hand one to `RawNode` and keep one for writes. Every write but
/// [`RaftStore::stage`] is durable when it returns.
pub trait RaftStore: Storage + Clone + Send + Sync + 'static {
    /// Appends entries, first truncating any existing entries at or after `entries[0].index` (the conflicting
    /// suffix). Entries at or below the snapshot index are ignored. The first remaining entry must be at most
    /// `last_index + 1` and the entries must be consecutive, else [`StoreError::Discontiguous`]. Durable (fsync) when
    /// it returns: raft requires entries persisted before messages are sent.
    fn append(&self, entries: &[Entry]) -> Result<(), StoreError>;

    /// Stores the hard state durably.
    fn set_hard_state(&self, hs: &HardState) -> Result<(), StoreError>;

    /// What a `Ready` asks to persist, entries (as [`RaftStore::append`]) and hard state, made durable together
    /// (one sync of the log, and one of the hard state only when term or vote change): durable when it returns,
    /// except that a hard state changing only the commit index may be kept as [`RaftStore::set_commit`] keeps it.
    fn persist(&self, entries: &[Entry], hs: Option<&HardState>) -> Result<(), StoreError> {
        if !entries.is_empty() {
            self.append(entries)?;
        }
        if let Some(hs) = hs {
            self.set_hard_state(hs)?;
        }
        Ok(())
    }

    /// The first half of an asynchronous [`RaftStore::persist`]: records `entries` and `hs` where raft-rs reads
    /// them (so the node may go on as if they were appended: raft-rs reads the log back through [`raft::Storage`]
    /// before they are durable) and returns what [`RaftStore::write_pending`] must make durable. Nothing is durable
    /// when it returns; a crash before `write_pending` returned loses it, which raft allows because the node
    /// acknowledges nothing it holds until it is durable (raft-rs's `on_persist_ready`). Calls are made in the log's
    /// order, and their pending writes written in the same order.
    ///
    /// The default, for stores with nothing slow to do, persists at once and leaves nothing pending.
    fn stage(&self, entries: Vec<Entry>, hs: Option<HardState>) -> Result<PendingWrite, StoreError> {
        self.persist(&entries, hs.as_ref())?;
        Ok(PendingWrite::default())
    }

    /// The second half of an asynchronous [`RaftStore::persist`]: makes the writes staged by [`RaftStore::stage`]
    /// durable, in their order, together (one sync of the log for the whole batch, and one of the hard state if any
    /// of them changed term or vote). Runs on another thread than the node's; durable when it returns.
    fn write_pending(&self, batch: &[PendingWrite]) -> Result<(), StoreError> {
        debug_assert!(batch.iter().all(PendingWrite::is_empty), "the default stage leaves nothing pending");
        Ok(())
    }

    /// Stores a hard state that differs from the stored one only by a higher commit index, without waiting for
    /// the disk: raft does not need the commit index durable (a restarted member learns it again from the leader),
    /// and the next durable write carries it. A store that cannot tell keeps it durably.
    fn set_commit(&self, hs: &HardState) -> Result<(), StoreError> {
        self.set_hard_state(hs)
    }

    /// Stores the conf state durably.
    fn set_conf_state(&self, cs: &ConfState) -> Result<(), StoreError>;

    /// Installs a snapshot received from the leader: drops the whole log, records the snapshot (metadata and data)
    /// as the latest, sets the conf state from its metadata and the hard state's term and commit to at least the
    /// snapshot's. Afterwards `first_index = index + 1`, `last_index = index`. Rejects (with
    /// [`StoreError::SnapshotOutOfDate`]) a snapshot below the first index or below the current snapshot. Durable.
    fn apply_snapshot(&self, snap: &Snapshot) -> Result<(), StoreError>;

    /// Records a snapshot this node made of its own state machine at `index` (the applied index), with the term of
    /// that log entry, the given conf state and data. `index` must be greater than the current snapshot index
    /// ([`StoreError::SnapshotOutOfDate`]) and at most the last index ([`StoreError::SnapshotBeyondLog`]). Does not
    /// compact the log: call [`RaftStore::compact`] for that. The stored conf state is left as is. Durable.
    fn create_snapshot(&self, index: u64, conf_state: ConfState, data: Vec<u8>) -> Result<(), StoreError>;

    /// The slow half of [`RaftStore::create_snapshot`], safe to run on another thread while the node goes on:
    /// writes the data of the snapshot at `index` and `term` durably without recording it. Nothing reads it until
    /// [`RaftStore::commit_snapshot`] records it; a staged snapshot that is never committed is discarded by the next
    /// snapshot or the next open.
    fn stage_snapshot(&self, index: u64, term: u64, data: &[u8]) -> Result<(), StoreError>;

    /// Records the snapshot staged at `index` and `term` as the latest, with the given conf state: the other half
    /// of [`RaftStore::create_snapshot`], with its errors, plus [`StoreError::Corrupt`] when nothing was staged
    /// there, and [`StoreError::SnapshotOutOfDate`] when `term` is not the term of that log entry. Durable.
    fn commit_snapshot(&self, index: u64, term: u64, conf_state: ConfState) -> Result<(), StoreError>;

    /// Removes the entries with index `< compact_index`, like `MemStorage::compact`; a `compact_index` at or below
    /// the first index is a no-op. Requires `compact_index <= snapshot index + 1`
    /// ([`StoreError::CompactBeyondSnapshot`]): only what a snapshot covers may go. Safe to call from another
    /// thread than the node's. Need not be durable: entries a crash brings back are still a valid prefix of the
    /// log, which the snapshot covers.
    fn compact(&self, compact_index: u64) -> Result<(), StoreError>;

    /// The latest stored snapshot (metadata and data), created or installed, or `None` if there never was one.
    fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError>;

    /// Number of entries currently held (for tests and metrics).
    fn entry_count(&self) -> u64;
}

/// What [`RaftStore::stage`] recorded in memory and [`RaftStore::write_pending`] still has to make durable.
#[derive(Debug, Default)]
pub struct PendingWrite {
    /// Entries to append, consecutive, all above the snapshot index (the first may replace earlier ones).
    pub entries: Vec<Entry>,
    /// The hard state to store, if it changed.
    pub hard_state: Option<HardState>,
    /// Whether the hard state changed term or vote: then it must be synced (a commit index alone need not be).
    pub sync_hard_state: bool,
}

impl PendingWrite {
    /// Whether there is nothing to write.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.hard_state.is_none()
    }

    /// Whether writing it waits for the disk (entries, or a new term or vote); a commit index alone does not.
    pub fn needs_sync(&self) -> bool {
        !self.entries.is_empty() || self.sync_hard_state
    }
}

/// `raft::Storage::snapshot`'s answer given the latest stored snapshot: the snapshot if it is at least
/// `request_index`, else `SnapshotTemporarilyUnavailable` (also when there is none: raft treats an empty snapshot as
/// fatal, and only asks after a compaction, which needs a snapshot).
fn snapshot_for_request(latest: Option<Snapshot>, request_index: u64) -> raft::Result<Snapshot> {
    match latest {
        Some(snap) if snap.get_metadata().index >= request_index => Ok(snap),
        _ => Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable)),
    }
}

/// The entries of `entries` above `snapshot_index`, checked to be consecutive and to start at most at
/// `last_index + 1`. `None` if there is nothing to append.
fn entries_to_append(entries: &[Entry], snapshot_index: u64, last_index: u64) -> Result<Option<&[Entry]>, StoreError> {
    let Some(start) = entries.iter().position(|e| e.index > snapshot_index) else {
        return Ok(None);
    };
    let ents = &entries[start..];
    if ents[0].index > last_index + 1 {
        return Err(StoreError::Discontiguous { expected: last_index + 1, got: ents[0].index });
    }
    for pair in ents.windows(2) {
        if pair[1].index != pair[0].index + 1 {
            return Err(StoreError::Discontiguous { expected: pair[0].index + 1, got: pair[1].index });
        }
    }
    Ok(Some(ents))
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().expect("raft store lock poisoned")
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().expect("raft store lock poisoned")
}

// ---------------------------------------------------------------------------------------------------------------
// MemStore
// ---------------------------------------------------------------------------------------------------------------

/// A staged snapshot: index, term and data.
type Staged = (u64, u64, Vec<u8>);

/// In-memory [`RaftStore`] for unit tests of the node: raft-rs's [`MemStorage`] plus the latest snapshot (with its
/// data). Clones share the same storage.
#[derive(Clone, Default)]
pub struct MemStore {
    storage: MemStorage,
    /// The latest snapshot. Its write lock also serializes the mutating calls; it is always taken before the
    /// `MemStorage` lock.
    snapshot: Arc<RwLock<Option<Snapshot>>>,
    /// Snapshot data staged by [`RaftStore::stage_snapshot`] and not committed yet, by index and term.
    staged: Arc<std::sync::Mutex<Option<Staged>>>,
}

impl MemStore {
    /// An empty, uninitialized store (no conf state): a node that joins an existing cluster and waits for a
    /// snapshot.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// A store initialized with the given voters as its conf state, like `MemStorage::new_with_conf_state`: how a
    /// brand-new cluster's members start.
    pub fn new_with_conf_state(voters: Vec<u64>) -> MemStore {
        MemStore {
            storage: MemStorage::new_with_conf_state((voters, Vec::<u64>::new())),
            snapshot: Arc::default(),
            staged: Arc::default(),
        }
    }

    fn snapshot_index_term(snap: &Option<Snapshot>) -> (u64, u64) {
        snap.as_ref().map_or((0, 0), |s| (s.get_metadata().index, s.get_metadata().term))
    }
}

impl fmt::Debug for MemStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (snapshot_index, _) = MemStore::snapshot_index_term(&read(&self.snapshot));
        f.debug_struct("MemStore")
            .field("first_index", &self.storage.first_index().ok())
            .field("last_index", &self.storage.last_index().ok())
            .field("snapshot_index", &snapshot_index)
            .finish()
    }
}

impl Storage for MemStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.storage.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.storage.first_index()? {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.storage.last_index()? + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        if low >= high {
            return Ok(Vec::new());
        }
        self.storage.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let (snapshot_index, snapshot_term) = MemStore::snapshot_index_term(&read(&self.snapshot));
        if idx == snapshot_index {
            return Ok(snapshot_term);
        }
        if idx < self.storage.first_index()? {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.storage.last_index()? {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        self.storage.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.storage.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.storage.last_index()
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        snapshot_for_request(read(&self.snapshot).clone(), request_index)
    }
}

impl RaftStore for MemStore {
    fn append(&self, entries: &[Entry]) -> Result<(), StoreError> {
        let snap = write(&self.snapshot);
        let (snapshot_index, _) = MemStore::snapshot_index_term(&snap);
        let last_index = self.storage.last_index().map_err(StoreError::Raft)?;
        if let Some(ents) = entries_to_append(entries, snapshot_index, last_index)? {
            self.storage.wl().append(ents).map_err(StoreError::Raft)?;
        }
        Ok(())
    }

    fn set_hard_state(&self, hs: &HardState) -> Result<(), StoreError> {
        let _snap = write(&self.snapshot);
        self.storage.wl().set_hardstate(hs.clone());
        Ok(())
    }

    fn set_conf_state(&self, cs: &ConfState) -> Result<(), StoreError> {
        let _snap = write(&self.snapshot);
        self.storage.wl().set_conf_state(cs.clone());
        Ok(())
    }

    fn apply_snapshot(&self, snap: &Snapshot) -> Result<(), StoreError> {
        let mut latest = write(&self.snapshot);
        let (snapshot_index, _) = MemStore::snapshot_index_term(&latest);
        let first_index = self.storage.first_index().map_err(StoreError::Raft)?;
        let index = snap.get_metadata().index;
        if index < first_index || index < snapshot_index {
            return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
        }
        let mut core = self.storage.wl();
        let commit = core.hard_state().commit;
        core.apply_snapshot(snap.clone()).map_err(StoreError::Raft)?;
        core.mut_hard_state().commit = commit.max(index);
        *latest = Some(snap.clone());
        Ok(())
    }

    fn create_snapshot(&self, index: u64, conf_state: ConfState, data: Vec<u8>) -> Result<(), StoreError> {
        let term = {
            let latest = read(&self.snapshot);
            let (snapshot_index, _) = MemStore::snapshot_index_term(&latest);
            let first_index = self.storage.first_index().map_err(StoreError::Raft)?;
            let last_index = self.storage.last_index().map_err(StoreError::Raft)?;
            if index <= snapshot_index {
                return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
            }
            if index > last_index {
                return Err(StoreError::SnapshotBeyondLog { index, last_index });
            }
            self.storage.term(index).map_err(StoreError::Raft)?
        };
        self.stage_snapshot(index, term, &data)?;
        self.commit_snapshot(index, term, conf_state)
    }

    fn stage_snapshot(&self, index: u64, term: u64, data: &[u8]) -> Result<(), StoreError> {
        *self.staged.lock().expect("staged lock") = Some((index, term, data.to_vec()));
        Ok(())
    }

    fn commit_snapshot(&self, index: u64, term: u64, conf_state: ConfState) -> Result<(), StoreError> {
        let mut latest = write(&self.snapshot);
        let (snapshot_index, _) = MemStore::snapshot_index_term(&latest);
        let first_index = self.storage.first_index().map_err(StoreError::Raft)?;
        let last_index = self.storage.last_index().map_err(StoreError::Raft)?;
        if index <= snapshot_index || index < first_index {
            return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
        }
        if index > last_index {
            return Err(StoreError::SnapshotBeyondLog { index, last_index });
        }
        if self.storage.term(index).map_err(StoreError::Raft)? != term {
            return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
        }
        let data = match self.staged.lock().expect("staged lock").take() {
            Some((i, t, data)) if (i, t) == (index, term) => data,
            _ => return Err(StoreError::Corrupt(format!("no snapshot staged at index {index}, term {term}"))),
        };
        let mut snap = Snapshot::default();
        snap.set_data(data.into());
        let meta = snap.mut_metadata();
        meta.index = index;
        meta.term = term;
        meta.set_conf_state(conf_state);
        *latest = Some(snap);
        Ok(())
    }

    fn compact(&self, compact_index: u64) -> Result<(), StoreError> {
        let latest = write(&self.snapshot);
        let (snapshot_index, _) = MemStore::snapshot_index_term(&latest);
        let first_index = self.storage.first_index().map_err(StoreError::Raft)?;
        if compact_index <= first_index {
            return Ok(());
        }
        if compact_index > snapshot_index + 1 {
            return Err(StoreError::CompactBeyondSnapshot { compact_index, snapshot_index });
        }
        if compact_index <= snapshot_index {
            // Entries from `compact_index` through the snapshot index stay, so `MemStorage::compact` keeps a
            // non-empty log and its offsets right.
            return self.storage.wl().compact(compact_index).map_err(StoreError::Raft);
        }
        // Everything through the snapshot index goes. `MemStorage::compact` would leave its own (older) snapshot
        // metadata behind, making `first_index` wrong once the log is empty; re-base it on the snapshot instead,
        // keeping hard state, conf state and the entries after the snapshot.
        let last_index = self.storage.last_index().map_err(StoreError::Raft)?;
        let tail = if last_index > snapshot_index {
            self.storage
                .entries(snapshot_index + 1, last_index + 1, None, GetEntriesContext::empty(false))
                .map_err(StoreError::Raft)?
        } else {
            Vec::new()
        };
        let Some(snap) = latest.as_ref() else {
            return Err(StoreError::CompactBeyondSnapshot { compact_index, snapshot_index });
        };
        let mut base = Snapshot::default();
        base.set_metadata(snap.get_metadata().clone());
        // Writers are serialized by `latest`'s lock, so the state read here is still current under `wl()`.
        let RaftState { hard_state, conf_state } = self.storage.initial_state().map_err(StoreError::Raft)?;
        let mut core = self.storage.wl();
        core.apply_snapshot(base).map_err(StoreError::Raft)?;
        core.set_hardstate(hard_state);
        core.set_conf_state(conf_state);
        core.append(&tail).map_err(StoreError::Raft)?;
        Ok(())
    }

    fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        Ok(read(&self.snapshot).clone())
    }

    fn entry_count(&self) -> u64 {
        let first = self.storage.first_index().unwrap_or(1);
        let last = self.storage.last_index().unwrap_or(0);
        (last + 1).saturating_sub(first)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// SledStore
// ---------------------------------------------------------------------------------------------------------------

const ENTRIES_TREE: &str = "raft_entries";
const META_TREE: &str = "raft_meta";
const KEY_HARD_STATE: &str = "hard_state";
const KEY_CONF_STATE: &str = "conf_state";
const KEY_SNAPSHOT_META: &str = "snapshot_meta";
/// The first index of the log after the latest compaction (8 bytes, big-endian), written without a sync.
const KEY_FIRST_INDEX: &str = "first_index";
/// The key snapshot data had inside sled before it moved to files (read for stores written then, removed by the
/// next snapshot).
const KEY_SNAPSHOT_DATA: &str = "snapshot_data";
/// The directory of snapshot files, inside the store's directory.
const SNAPSHOT_DIR: &str = "snapshots";
/// The directory of the log's segment files ([`crate::wal`]), inside the store's directory.
const WAL_DIR: &str = "wal";

/// The file name of the snapshot at `index` and `term`.
fn snapshot_file_name(index: u64, term: u64) -> String {
    format!("{index:020}-{term:020}.snap")
}

/// Writes `data` as the snapshot file at `index` and `term` in `dir`, durably: a temporary file, fsynced, renamed,
/// and the directory fsynced.
fn write_snapshot_file(dir: &Path, index: u64, term: u64, data: &[u8]) -> Result<(), StoreError> {
    use std::io::Write;
    std::fs::create_dir_all(dir).map_err(io_error("cannot create snapshot directory", dir))?;
    let path = dir.join(snapshot_file_name(index, term));
    let tmp = dir.join(format!("{}.tmp", snapshot_file_name(index, term)));
    let mut f = std::fs::File::create(&tmp).map_err(io_error("cannot create", &tmp))?;
    f.write_all(data).map_err(io_error("cannot write", &tmp))?;
    f.sync_all().map_err(io_error("cannot fsync", &tmp))?;
    drop(f);
    std::fs::rename(&tmp, &path).map_err(io_error("cannot rename into place", &path))?;
    sync_path(dir)
}

/// Deletes every file in the snapshot directory but `keep` (older snapshots, and temporary files a crash left).
fn remove_other_snapshots(dir: &Path, keep: Option<&str>) -> Result<(), StoreError> {
    let files = match std::fs::read_dir(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("cannot list", dir)(e)),
    };
    let mut removed = false;
    for file in files {
        let path = file.map_err(io_error("cannot list", dir))?.path();
        if path.file_name().and_then(|n| n.to_str()) != keep {
            std::fs::remove_file(&path).map_err(io_error("cannot remove old snapshot", &path))?;
            removed = true;
        }
    }
    if removed {
        sync_path(dir)?;
    }
    Ok(())
}

fn encode<M: protobuf::Message>(what: &'static str, msg: &M) -> Result<Vec<u8>, StoreError> {
    msg.write_to_bytes().map_err(|source| StoreError::Encode { what, source })
}

fn decode<M: protobuf::Message>(tree: &str, key: &str, bytes: &[u8]) -> Result<M, StoreError> {
    M::parse_from_bytes(bytes).map_err(|e| StoreError::Corrupt(format!("tree {tree}, key {key}: cannot decode: {e}")))
}

/// Decodes one `raft_entries` record, checking that the key is an 8-byte index equal to the entry's own index.
fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry, StoreError> {
    let Ok(raw) = <[u8; 8]>::try_from(key) else {
        return Err(StoreError::Corrupt(format!("tree {ENTRIES_TREE}, key {key:02x?}: key is not an 8-byte index")));
    };
    let index = u64::from_be_bytes(raw);
    let entry: Entry = decode(ENTRIES_TREE, &format!("{index} ({})", hex(&raw)), value)?;
    if entry.index != index {
        return Err(StoreError::Corrupt(format!(
            "tree {ENTRIES_TREE}, key {index} ({}): holds the entry of index {}",
            hex(&raw),
            entry.index
        )));
    }
    Ok(entry)
}

/// Reads the whole log of a store written before the entries moved out of sled (tree `raft_entries`): every value
/// must decode under its own index, and the indexes must be consecutive.
fn read_legacy_log(entries: &sled::Tree) -> Result<Vec<Entry>, StoreError> {
    let mut log: Vec<Entry> = Vec::new();
    for item in entries.iter() {
        let (key, value) = item?;
        let entry = decode_entry(&key, &value)?;
        if let Some(last) = log.last().map(|e| e.index)
            && entry.index != last + 1
        {
            return Err(StoreError::Corrupt(format!(
                "tree {ENTRIES_TREE}: entries {} to {} are missing",
                last + 1,
                entry.index - 1
            )));
        }
        log.push(entry);
    }
    Ok(log)
}

/// Maps an I/O error on `path` to [`StoreError::Io`].
fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { what, path, source }
}

/// fsyncs a directory, making the entries created in it durable.
fn sync_path(dir: &Path) -> Result<(), StoreError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("cannot fsync directory", dir))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What `SledStore` keeps in memory: the log's bounds, the small metadata mirrored from sled, and the log's entries.
#[derive(Debug, Clone, Default)]
struct Cache {
    /// `snapshot index + 1` when the log is empty.
    first_index: u64,
    /// `snapshot index` when the log is empty.
    last_index: u64,
    /// Metadata of the latest snapshot, if any.
    snapshot: Option<SnapshotMetadata>,
    hard_state: HardState,
    conf_state: ConfState,
    /// The log's entries, `first_index` to `last_index`. Kept whole in memory, as etcd keeps its unsnapshotted log:
    /// snapshots and compaction bound it, and no read goes to the disk.
    log: std::collections::VecDeque<Entry>,
}

impl Cache {
    /// The entry at `index`, if the log holds it.
    fn entry(&self, index: u64) -> Option<&Entry> {
        self.log.get(usize::try_from(index.checked_sub(self.first_index)?).ok()?)
    }

    /// Records entries appended from index `ents[0].index` on (consecutive, at most `last_index + 1`, at least
    /// `first_index`): what they overwrite goes first.
    fn remember(&mut self, ents: &[Entry]) {
        let keep = usize::try_from(ents[0].index - self.first_index).expect("log length fits usize");
        self.log.truncate(keep);
        self.log.extend(ents.iter().cloned());
        self.last_index = ents[ents.len() - 1].index;
    }

    fn snapshot_index(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |m| m.index)
    }

    fn snapshot_term(&self) -> u64 {
        self.snapshot.as_ref().map_or(0, |m| m.term)
    }
}

struct SledInner {
    db: sled::Db,
    meta: sled::Tree,
    /// The database directory.
    dir: PathBuf,
    /// sled's log file (`<dir>/db`), opened to fdatasync it after each flush.
    log_file: std::fs::File,
    /// Mutating calls hold the write lock from their first read to after the flush, so they are serialized; but
    /// `compact` deletes the log's segments after releasing it, and `stage_snapshot` writes its file without it.
    cache: RwLock<Cache>,
    /// The entries' own log. Taken after `cache`'s write lock, never before it.
    wal: std::sync::Mutex<Wal>,
}

/// Durable [`RaftStore`]: the entries in their own segment files ([`crate::wal`]), the rest in a sled database
/// (layout in the module docs). Clones share the same store.
#[derive(Clone)]
pub struct SledStore {
    inner: Arc<SledInner>,
}

impl fmt::Debug for SledStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cache = read(&self.inner.cache);
        f.debug_struct("SledStore")
            .field("first_index", &cache.first_index)
            .field("last_index", &cache.last_index)
            .field("snapshot_index", &cache.snapshot_index())
            .field("hard_state", &cache.hard_state)
            .finish()
    }
}

impl SledStore {
    /// Opens (creating it if needed) the sled database in directory `dir` and loads the Raft state from it.
    ///
    /// Fails with [`StoreError::Locked`] if the database is already open (sled holds an exclusive lock on its
    /// files), and with [`StoreError::Corrupt`] if a stored value cannot be decoded or the log has holes.
    ///
    /// Entries that contradict the snapshot (all below its index, or a different term at its index: a log from
    /// before an installed snapshot) are removed on open. A store written before the entries moved out of sled
    /// (tree `raft_entries`) has them moved to the log's files on its first open.
    pub fn open(dir: &Path) -> Result<SledStore, StoreError> {
        SledStore::open_with_segment_bytes(dir, wal::SEGMENT_BYTES)
    }

    /// [`SledStore::open`], with the log's segments closed at `segment_bytes` instead of [`wal::SEGMENT_BYTES`]
    /// (for tests of compaction over many segments).
    pub fn open_with_segment_bytes(dir: &Path, segment_bytes: u64) -> Result<SledStore, StoreError> {
        std::fs::create_dir_all(dir).map_err(io_error("cannot create raft store directory", dir))?;
        let db = sled::Config::new().path(dir).open().map_err(|e| match e {
            sled::Error::Io(source) if source.to_string().contains("could not acquire lock") => {
                StoreError::Locked { path: dir.to_path_buf(), source }
            }
            other => StoreError::Sled(other),
        })?;
        let log_path = dir.join("db");
        let log_file = std::fs::File::open(&log_path).map_err(io_error("cannot open sled log file", &log_path))?;
        // Make the directory entries sled may just have created durable too.
        sync_path(dir)?;
        SledStore::load(db, dir.to_path_buf(), log_file, segment_bytes)
    }

    /// Loads the Raft state: the metadata from tree `raft_meta`, the entries from the log's files (moved there
    /// first from tree `raft_entries` if the store predates them).
    fn load(db: sled::Db, dir: PathBuf, log_file: std::fs::File, segment_bytes: u64) -> Result<SledStore, StoreError> {
        let entries = db.open_tree(ENTRIES_TREE)?;
        let meta = db.open_tree(META_TREE)?;

        let get = |key: &str| meta.get(key.as_bytes());
        let hard_state: HardState = match get(KEY_HARD_STATE)? {
            Some(v) => decode(META_TREE, KEY_HARD_STATE, &v)?,
            None => HardState::default(),
        };
        let conf_state: ConfState = match get(KEY_CONF_STATE)? {
            Some(v) => decode(META_TREE, KEY_CONF_STATE, &v)?,
            None => ConfState::default(),
        };
        let snapshots = dir.join(SNAPSHOT_DIR);
        let snapshot: Option<SnapshotMetadata> = match (get(KEY_SNAPSHOT_META)?, get(KEY_SNAPSHOT_DATA)?) {
            (Some(v), legacy) => {
                let m: SnapshotMetadata = decode(META_TREE, KEY_SNAPSHOT_META, &v)?;
                let name = snapshot_file_name(m.index, m.term);
                if legacy.is_none() && !snapshots.join(&name).is_file() {
                    return Err(StoreError::Corrupt(format!(
                        "tree {META_TREE}: key {KEY_SNAPSHOT_META} names snapshot {} at index {} but {} is missing",
                        name,
                        m.index,
                        snapshots.join(&name).display()
                    )));
                }
                // Older snapshots and temporary files a crash left behind.
                remove_other_snapshots(&snapshots, legacy.is_none().then_some(name.as_str()))?;
                Some(m)
            }
            (None, None) => {
                remove_other_snapshots(&snapshots, None)?;
                None
            }
            (None, Some(_)) => {
                return Err(StoreError::Corrupt(format!(
                    "tree {META_TREE}: key {KEY_SNAPSHOT_DATA} present but {KEY_SNAPSHOT_META} missing"
                )));
            }
        };
        let (snapshot_index, snapshot_term) = snapshot.as_ref().map_or((0, 0), |m| (m.index, m.term));

        let wal_dir = dir.join(WAL_DIR);
        // Entries in sled are the log wherever they are found: a store that predates the log's files, a move cut
        // short after its rename (the files then hold the same entries), or a store that a binary from before the
        // files wrote to after a downgrade (the files are then stale: sled's copy has entries they lack). They move
        // to the log's files, which appear whole or not at all, replacing any there; sled's copy goes after that.
        if !entries.is_empty() || !Wal::exists(&wal_dir) {
            let legacy = read_legacy_log(&entries)?;
            Wal::create(&wal_dir, &legacy, segment_bytes)?;
            if !legacy.is_empty() {
                tracing::info!(entries = legacy.len(), "raft store: the log moved from sled to its own files");
            }
        }
        Wal::remove_replaced(&wal_dir)?;
        if !entries.is_empty() {
            entries.clear()?;
            db.flush()?;
            log_file.sync_data().map_err(io_error("cannot fdatasync", &dir.join("db")))?;
        }
        let (mut wal, log) = Wal::open(&wal_dir, segment_bytes)?;

        let mut cache = Cache {
            first_index: snapshot_index + 1,
            last_index: snapshot_index,
            snapshot,
            hard_state,
            conf_state,
            log: std::collections::VecDeque::new(),
        };
        if let (Some(front), Some(back)) = (log.front(), log.back()) {
            let (first, last) = (front.index, back.index);
            let term_at_snapshot =
                snapshot_index.checked_sub(first).and_then(|i| log.get(usize::try_from(i).ok()?)).map(|e| e.term);
            let stale = cache.snapshot.is_some()
                && (last < snapshot_index || term_at_snapshot.is_some_and(|t| t != snapshot_term));
            if stale {
                // Left over from before an installed snapshot (a crash between recording the snapshot and dropping
                // the log): the snapshot supersedes it.
                wal.reset(snapshot_index + 1)?;
            } else if first > snapshot_index + 1 {
                return Err(StoreError::Corrupt(format!(
                    "raft log {}: first entry {first} leaves a hole after snapshot index {snapshot_index}",
                    wal_dir.display()
                )));
            } else {
                // Compaction deletes whole segments: the entries below the last compaction's first index that a
                // segment still holds go again (the index is written without a sync; an older one keeps more).
                let compacted = match get(KEY_FIRST_INDEX)? {
                    Some(v) => match <[u8; 8]>::try_from(&v[..]) {
                        Ok(raw) => u64::from_be_bytes(raw),
                        Err(_) => {
                            return Err(StoreError::Corrupt(format!(
                                "tree {META_TREE}, key {KEY_FIRST_INDEX}: not an 8-byte index"
                            )));
                        }
                    },
                    None => 0,
                };
                let new_first = compacted.clamp(first, snapshot_index + 1);
                let mut log = log;
                log.drain(..usize::try_from(new_first - first).expect("log length fits usize"));
                cache.first_index = new_first;
                cache.last_index = last;
                cache.log = log;
            }
        }
        if cache.hard_state.commit > cache.last_index {
            // A commit index is written without a sync (`set_commit`) and may be recovered without the entries it
            // counted if they were not durable yet; raft refuses to start on such a hard state. The commit index
            // need not be durable: the leader tells it again.
            tracing::warn!(
                commit = cache.hard_state.commit,
                last_index = cache.last_index,
                "raft store: the stored commit index is past the log; lowered to its last index"
            );
            cache.hard_state.commit = cache.last_index;
        }
        Ok(SledStore {
            inner: Arc::new(SledInner {
                db,
                meta,
                dir,
                log_file,
                cache: RwLock::new(cache),
                wal: std::sync::Mutex::new(wal),
            }),
        })
    }

    /// The sled database, for the coordinator's own trees (do not touch `raft_entries` and `raft_meta`). Its
    /// `flush` is not an fsync on Linux (see [`SledStore::sync`]).
    pub fn db(&self) -> &sled::Db {
        &self.inner.db
    }

    /// Makes everything written to the database so far durable, the coordinator's own trees included: sled's
    /// `flush`, then an fdatasync of sled's log file. sled 0.34 flushes with `sync_file_range` on Linux, which
    /// flushes neither the device's write cache nor the file's metadata (sled issue #1452), so its `flush` alone
    /// does not survive a power loss. With `blobs`, also syncs the files sled keeps large values in (over about
    /// 128 KiB, such as snapshot data), which sled writes without any sync.
    pub fn sync(&self, blobs: bool) -> Result<(), StoreError> {
        self.inner.db.flush()?;
        let log_path = || self.inner.dir.join("db");
        self.inner.log_file.sync_data().map_err(io_error("cannot fdatasync", &log_path()))?;
        if blobs {
            let dir = self.inner.dir.join("blobs");
            match std::fs::read_dir(&dir) {
                Ok(files) => {
                    for file in files {
                        let path = file.map_err(io_error("cannot list", &dir))?.path();
                        match std::fs::File::open(&path) {
                            Ok(f) => f.sync_data().map_err(io_error("cannot fdatasync", &path))?,
                            // sled garbage-collects old blobs concurrently.
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(io_error("cannot open", &path)(e)),
                        }
                    }
                    sync_path(&dir)?;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_error("cannot list", &dir)(e)),
            }
        }
        Ok(())
    }

    fn snapshot_dir(&self) -> PathBuf {
        self.inner.dir.join(SNAPSHOT_DIR)
    }

    /// Bytes the store occupies on disk: the log's segments, sled's files and the snapshot files.
    pub fn disk_bytes(&self) -> u64 {
        fn size(path: &Path) -> u64 {
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.is_dir() => std::fs::read_dir(path)
                    .map(|d| d.filter_map(Result::ok).map(|e| size(&e.path())).sum())
                    .unwrap_or(0),
                Ok(m) => m.len(),
                Err(_) => 0,
            }
        }
        size(&self.inner.dir)
    }

    /// The term of the entry at `index`, which the caller checked is in the log.
    fn term_in_log(cache: &Cache, index: u64) -> Result<u64, StoreError> {
        match cache.entry(index) {
            Some(e) => Ok(e.term),
            None => Err(StoreError::Corrupt(format!(
                "raft log: entry {index} is missing from {} to {}",
                cache.first_index, cache.last_index
            ))),
        }
    }

    fn read_snapshot(&self, cache: &Cache) -> Result<Option<Snapshot>, StoreError> {
        let Some(meta) = cache.snapshot.as_ref() else {
            return Ok(None);
        };
        let data = match self.inner.meta.get(KEY_SNAPSHOT_DATA.as_bytes())? {
            Some(legacy) => legacy.to_vec(),
            None => {
                let path = self.snapshot_dir().join(snapshot_file_name(meta.index, meta.term));
                std::fs::read(&path).map_err(io_error("cannot read snapshot", &path))?
            }
        };
        let mut snap = Snapshot::default();
        snap.set_metadata(meta.clone());
        snap.set_data(data.into());
        Ok(Some(snap))
    }
}

impl Storage for SledStore {
    fn initial_state(&self) -> raft::Result<RaftState> {
        let cache = read(&self.inner.cache);
        Ok(RaftState::new(cache.hard_state.clone(), cache.conf_state.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        let max_size = max_size.into();
        let cache = read(&self.inner.cache);
        if low < cache.first_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > cache.last_index + 1 {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        if low >= high {
            return Ok(Vec::new());
        }
        // Same cut as raft::util::limit_size: the first entry always, then while the running size fits.
        let mut out = Vec::with_capacity(usize::try_from((high - low).min(1024)).unwrap_or(1024));
        let mut size = 0u64;
        for index in low..high {
            let entry = cache.entry(index).ok_or_else(|| {
                StoreError::Corrupt(format!("raft log: entry {index} is missing from {low} to {high}"))
            })?;
            if let Some(max) = max_size {
                size += u64::from(protobuf::Message::compute_size(entry));
                if !out.is_empty() && size > max {
                    break;
                }
            }
            out.push(entry.clone());
        }
        Ok(out)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        let cache = read(&self.inner.cache);
        if idx == cache.snapshot_index() {
            return Ok(cache.snapshot_term());
        }
        if idx < cache.first_index {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > cache.last_index {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(SledStore::term_in_log(&cache, idx)?)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(read(&self.inner.cache).first_index)
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(read(&self.inner.cache).last_index)
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        let cache = read(&self.inner.cache);
        snapshot_for_request(self.read_snapshot(&cache)?, request_index)
    }
}

impl RaftStore for SledStore {
    fn append(&self, entries: &[Entry]) -> Result<(), StoreError> {
        self.persist(entries, None)
    }

    fn set_hard_state(&self, hs: &HardState) -> Result<(), StoreError> {
        self.persist(&[], Some(hs))
    }

    fn persist(&self, entries: &[Entry], hs: Option<&HardState>) -> Result<(), StoreError> {
        let pending = self.stage(entries.to_vec(), hs.cloned())?;
        self.write_pending(std::slice::from_ref(&pending))
    }

    fn stage(&self, mut entries: Vec<Entry>, hs: Option<HardState>) -> Result<PendingWrite, StoreError> {
        let mut cache = write(&self.inner.cache);
        let kept = entries_to_append(&entries, cache.snapshot_index(), cache.last_index)?.map_or(0, <[Entry]>::len);
        entries.drain(..entries.len() - kept);
        // first_index is unchanged: the new entries start at or after it (an empty log's first index is snapshot
        // index + 1, the only place they may start then).
        if !entries.is_empty() {
            cache.remember(&entries);
        }
        let sync_hard_state = hs.as_ref().is_some_and(|hs| {
            let old = &cache.hard_state;
            hs.term != old.term || hs.vote != old.vote
        });
        if let Some(hs) = &hs {
            cache.hard_state = hs.clone();
        }
        Ok(PendingWrite { entries, hard_state: hs, sync_hard_state })
    }

    fn write_pending(&self, batch: &[PendingWrite]) -> Result<(), StoreError> {
        let runs: Vec<&[Entry]> = batch.iter().filter(|w| !w.entries.is_empty()).map(|w| &w.entries[..]).collect();
        // The entries first: a crash after them leaves them without the hard state, never a commit index beyond
        // them (`load` clamps one anyway).
        if !runs.is_empty() {
            self.inner.wal.lock().expect("raft log lock poisoned").append_runs(&runs)?;
        }
        // The newest hard state carries every earlier one's term and vote. Raft needs term and vote durable before
        // it answers; a hard state that only moved its commit index waits for sled's next flush (see `set_commit`).
        if let Some(hs) = batch.iter().rev().find_map(|w| w.hard_state.as_ref()) {
            self.inner.meta.insert(KEY_HARD_STATE.as_bytes(), encode("HardState", hs)?)?;
            if batch.iter().any(|w| w.sync_hard_state) {
                self.sync(false)?;
            }
        }
        Ok(())
    }

    fn set_commit(&self, hs: &HardState) -> Result<(), StoreError> {
        let mut cache = write(&self.inner.cache);
        // sled flushes on its own within `flush_every_ms`; the next `persist` syncs it with everything else.
        self.inner.meta.insert(KEY_HARD_STATE.as_bytes(), encode("HardState", hs)?)?;
        cache.hard_state = hs.clone();
        Ok(())
    }

    fn set_conf_state(&self, cs: &ConfState) -> Result<(), StoreError> {
        let mut cache = write(&self.inner.cache);
        self.inner.meta.insert(KEY_CONF_STATE.as_bytes(), encode("ConfState", cs)?)?;
        self.sync(false)?;
        cache.conf_state = cs.clone();
        Ok(())
    }

    fn apply_snapshot(&self, snap: &Snapshot) -> Result<(), StoreError> {
        let mut cache = write(&self.inner.cache);
        let meta = snap.get_metadata();
        let index = meta.index;
        let (first_index, snapshot_index) = (cache.first_index, cache.snapshot_index());
        if index < first_index || index < snapshot_index {
            return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
        }
        let mut hard_state = cache.hard_state.clone();
        hard_state.term = hard_state.term.max(meta.term);
        hard_state.commit = hard_state.commit.max(index);
        let conf_state = meta.get_conf_state().clone();

        // The data first (durable on its own), then the metadata that names it.
        write_snapshot_file(&self.snapshot_dir(), index, meta.term, snap.get_data())?;
        let mut meta_batch = sled::Batch::default();
        meta_batch.insert(KEY_SNAPSHOT_META.as_bytes(), encode("SnapshotMetadata", meta)?);
        meta_batch.remove(KEY_SNAPSHOT_DATA.as_bytes());
        meta_batch.insert(KEY_HARD_STATE.as_bytes(), encode("HardState", &hard_state)?);
        meta_batch.insert(KEY_CONF_STATE.as_bytes(), encode("ConfState", &conf_state)?);
        self.inner.meta.apply_batch(meta_batch)?;
        self.sync(false)?;
        // Then the log goes. After a crash before this, `load` drops the old log where it contradicts the snapshot.
        self.inner.wal.lock().expect("raft log lock poisoned").reset(index + 1)?;
        remove_other_snapshots(&self.snapshot_dir(), Some(&snapshot_file_name(index, meta.term)))?;

        cache.first_index = index + 1;
        cache.last_index = index;
        cache.log.clear();
        cache.snapshot = Some(meta.clone());
        cache.hard_state = hard_state;
        cache.conf_state = conf_state;
        Ok(())
    }

    fn create_snapshot(&self, index: u64, conf_state: ConfState, data: Vec<u8>) -> Result<(), StoreError> {
        let term = {
            let cache = read(&self.inner.cache);
            let (first_index, snapshot_index, last_index) =
                (cache.first_index, cache.snapshot_index(), cache.last_index);
            if index <= snapshot_index {
                return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
            }
            if index > last_index {
                return Err(StoreError::SnapshotBeyondLog { index, last_index });
            }
            // first_index <= snapshot_index + 1 <= index <= last_index: the entry is in the log.
            SledStore::term_in_log(&cache, index)?
        };
        self.stage_snapshot(index, term, &data)?;
        self.commit_snapshot(index, term, conf_state)
    }

    fn stage_snapshot(&self, index: u64, term: u64, data: &[u8]) -> Result<(), StoreError> {
        write_snapshot_file(&self.snapshot_dir(), index, term, data)
    }

    fn commit_snapshot(&self, index: u64, term: u64, conf_state: ConfState) -> Result<(), StoreError> {
        let mut cache = write(&self.inner.cache);
        let (first_index, snapshot_index, last_index) = (cache.first_index, cache.snapshot_index(), cache.last_index);
        if index <= snapshot_index || index < first_index {
            return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
        }
        if index > last_index {
            return Err(StoreError::SnapshotBeyondLog { index, last_index });
        }
        // first_index <= index <= last_index: the entry is in the log.
        if SledStore::term_in_log(&cache, index)? != term {
            return Err(StoreError::SnapshotOutOfDate { index, first_index, snapshot_index });
        }
        let name = snapshot_file_name(index, term);
        if !self.snapshot_dir().join(&name).is_file() {
            return Err(StoreError::Corrupt(format!("no snapshot staged at index {index}, term {term} ({name})")));
        }
        let meta = SnapshotMetadata {
            index,
            term,
            conf_state: protobuf::SingularPtrField::some(conf_state),
            ..Default::default()
        };
        let mut batch = sled::Batch::default();
        batch.insert(KEY_SNAPSHOT_META.as_bytes(), encode("SnapshotMetadata", &meta)?);
        batch.remove(KEY_SNAPSHOT_DATA.as_bytes());
        self.inner.meta.apply_batch(batch)?;
        self.sync(false)?;
        // Only now, with the newer snapshot durable, does the older one go.
        remove_other_snapshots(&self.snapshot_dir(), Some(&name))?;
        cache.snapshot = Some(meta);
        Ok(())
    }

    fn compact(&self, compact_index: u64) -> Result<(), StoreError> {
        let segments = {
            let mut cache = write(&self.inner.cache);
            if compact_index <= cache.first_index {
                return Ok(());
            }
            let snapshot_index = cache.snapshot_index();
            if compact_index > snapshot_index + 1 {
                return Err(StoreError::CompactBeyondSnapshot { compact_index, snapshot_index });
            }
            // snapshot_index <= last_index, so compact_index <= last_index + 1 and the bounds stay consistent.
            let drop = usize::try_from(compact_index - cache.first_index).expect("log length fits usize");
            let drop = drop.min(cache.log.len());
            cache.log.drain(..drop);
            cache.first_index = compact_index;
            // For the next open, which finds the entries of the segments that stay: no sync needed.
            self.inner.meta.insert(KEY_FIRST_INDEX.as_bytes(), &compact_index.to_be_bytes())?;
            self.inner.wal.lock().expect("raft log lock poisoned").compactable(compact_index)
        };
        // Nothing reads below the first index any more, so the segments go without holding the locks (the node's
        // writes go on meanwhile) and without a sync: entries a crash brings back are a valid prefix of the log,
        // which `load` keeps (or drops, with the log, when a snapshot superseded it).
        wal::remove_segments(&self.inner.dir.join(WAL_DIR), &segments)
    }

    fn latest_snapshot(&self) -> Result<Option<Snapshot>, StoreError> {
        let cache = read(&self.inner.cache);
        self.read_snapshot(&cache)
    }

    fn entry_count(&self) -> u64 {
        let cache = read(&self.inner.cache);
        (cache.last_index + 1).saturating_sub(cache.first_index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_entry_checks_key_and_index() {
        let e = Entry { index: 7, term: 2, ..Default::default() };
        let bytes = encode("Entry", &e).unwrap();
        assert_eq!(decode_entry(&7u64.to_be_bytes(), &bytes).unwrap(), e);
        let err = decode_entry(&8u64.to_be_bytes(), &bytes).unwrap_err().to_string();
        assert!(err.contains("raft_entries") && err.contains("key 8"), "{err}");
        let err = decode_entry(b"abc", &bytes).unwrap_err().to_string();
        assert!(err.contains("not an 8-byte index"), "{err}");
        let err = decode_entry(&9u64.to_be_bytes(), &[0xff; 4]).unwrap_err().to_string();
        assert!(err.contains("key 9") && err.contains("cannot decode"), "{err}");
    }

    #[test]
    fn store_errors_become_raft_errors() {
        let e: raft::Error = StoreError::Raft(raft::Error::Store(StorageError::Compacted)).into();
        assert_eq!(e, raft::Error::Store(StorageError::Compacted));
        let e: raft::Error = StoreError::Corrupt("x".into()).into();
        assert!(matches!(e, raft::Error::Store(StorageError::Other(_))));
    }

    #[test]
    fn no_snapshot_is_temporarily_unavailable() {
        assert_eq!(
            snapshot_for_request(None, 0).unwrap_err(),
            raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable)
        );
    }
}
