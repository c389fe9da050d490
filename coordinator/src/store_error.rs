//! The durable log's errors, shared by the store ([`crate::storage`]) and the files under it ([`crate::wal`]).

use std::path::PathBuf;

use raft::StorageError;

/// Errors of the durable log.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sled failed (I/O error, corruption detected by sled itself, ...).
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// A file-system call on the store's directory or files failed (creating the directory, syncing a file).
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// What the file system said.
        source: std::io::Error,
    },
    /// Another handle (this process or another) has the sled database open; sled holds an exclusive file lock.
    #[error("raft store at {path} is already open elsewhere (sled's file lock is held): {source}")]
    Locked {
        /// The database directory.
        path: PathBuf,
        /// sled's error.
        source: std::io::Error,
    },
    /// A stored value or key could not be decoded or contradicts the rest of the store; the message names the tree
    /// and key, or the log's file and offset.
    #[error("corrupt raft store: {0}")]
    Corrupt(String),
    /// A protobuf message could not be encoded.
    #[error("cannot encode {what}: {source}")]
    Encode {
        /// Which message.
        what: &'static str,
        /// The encoder's error.
        source: protobuf::ProtobufError,
    },
    /// Appended entries would leave a hole in the log (or are not consecutive among themselves).
    #[error("raft log must be contiguous: expected entry index {expected}, got {got}")]
    Discontiguous {
        /// The index the next entry needed to have.
        expected: u64,
        /// The index it had.
        got: u64,
    },
    /// A snapshot older than what the store already covers.
    #[error("snapshot at index {index} is out of date (first index {first_index}, snapshot index {snapshot_index})")]
    SnapshotOutOfDate {
        /// The rejected snapshot's index.
        index: u64,
        /// The store's first log index.
        first_index: u64,
        /// The store's current snapshot index.
        snapshot_index: u64,
    },
    /// `create_snapshot` at an index the log does not hold yet.
    #[error("cannot snapshot at index {index}: last log index is {last_index}")]
    SnapshotBeyondLog {
        /// The requested index.
        index: u64,
        /// The store's last log index.
        last_index: u64,
    },
    /// `compact` past what the latest snapshot covers.
    #[error("cannot compact to {compact_index}: entries after snapshot index {snapshot_index} are not covered")]
    CompactBeyondSnapshot {
        /// The requested compact index (first index to keep).
        compact_index: u64,
        /// The store's snapshot index.
        snapshot_index: u64,
    },
    /// An error raft-rs's own storage returned.
    #[error("raft storage: {0}")]
    Raft(raft::Error),
}

impl From<StoreError> for raft::Error {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Raft(e) => e,
            other => raft::Error::Store(StorageError::Other(Box::new(other))),
        }
    }
}
