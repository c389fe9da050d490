//! The Raft log stores: one suite run against both `MemStore` and `SledStore`, then `SledStore`'s durability,
//! locking and corruption handling, and a single-node raft-rs `RawNode` driven on `SledStore` across a restart.

use std::time::Instant;

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, EntryType, HardState, Snapshot, SnapshotMetadata};
use raft::{Config, GetEntriesContext, RawNode, Storage, StorageError};
use tessera_coordinator::storage::{MemStore, RaftStore, SledStore, StoreError};

fn ent(index: u64, term: u64) -> Entry {
    Entry { index, term, data: format!("entry {index}").into_bytes().into(), ..Default::default() }
}

fn ents(indexes: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
    indexes.map(|i| ent(i, term)).collect()
}

fn ctx() -> GetEntriesContext {
    GetEntriesContext::empty(false)
}

fn index_terms(v: &[Entry]) -> Vec<(u64, u64)> {
    v.iter().map(|e| (e.index, e.term)).collect()
}

fn store_err(e: StorageError) -> raft::Error {
    raft::Error::Store(e)
}

fn bounds<S: RaftStore>(s: &S) -> (u64, u64) {
    (s.first_index().unwrap(), s.last_index().unwrap())
}

fn conf(voters: Vec<u64>, learners: Vec<u64>) -> ConfState {
    ConfState::from((voters, learners))
}

fn snapshot(index: u64, term: u64, cs: ConfState, data: &[u8]) -> Snapshot {
    let mut s = Snapshot::default();
    s.set_data(data.to_vec().into());
    let m = s.mut_metadata();
    m.index = index;
    m.term = term;
    m.set_conf_state(cs);
    s
}

// ----- the suite, over any RaftStore ---------------------------------------------------------------------------

fn persist_writes_entries_and_hard_state_together<S: RaftStore>(s: S) {
    let hs = HardState { term: 1, vote: 2, commit: 2, ..Default::default() };
    s.persist(&ents(1..=3, 1), Some(&hs)).unwrap();
    assert_eq!(bounds(&s), (1, 3));
    assert_eq!(s.initial_state().unwrap().hard_state, hs);
    // Entries alone, then the hard state alone, then nothing: each is what the store holds afterwards.
    s.persist(&ents(4..=4, 1), None).unwrap();
    assert_eq!(bounds(&s), (1, 4));
    assert_eq!(s.initial_state().unwrap().hard_state, hs);
    let voted = HardState { term: 2, vote: 3, commit: 3, ..Default::default() };
    s.persist(&[], Some(&voted)).unwrap();
    assert_eq!(s.initial_state().unwrap().hard_state, voted);
    s.persist(&[], None).unwrap();
    assert_eq!(s.initial_state().unwrap().hard_state, voted);
    // A conflicting suffix goes, as with append.
    s.persist(&ents(3..=3, 2), None).unwrap();
    assert_eq!(index_terms(&s.entries(1, 4, None, ctx()).unwrap()), vec![(1, 1), (2, 1), (3, 2)]);
    // A commit-only change is visible at once.
    let committed = HardState { commit: 3, ..voted };
    s.set_commit(&committed).unwrap();
    assert_eq!(s.initial_state().unwrap().hard_state, committed);
}

fn staged_snapshots_are_committed_only_where_they_were_staged<S: RaftStore>(s: S) {
    let cs = conf(vec![1, 2, 3], vec![]);
    s.append(&ents(1..=5, 1)).unwrap();
    s.append(&ents(6..=10, 2)).unwrap();
    // Nothing staged there.
    let err = s.commit_snapshot(7, 2, cs.clone()).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
    assert!(s.latest_snapshot().unwrap().is_none());
    // Staged, but not at that entry's term.
    s.stage_snapshot(7, 1, b"state@7 term 1").unwrap();
    let err = s.commit_snapshot(7, 1, cs.clone()).unwrap_err();
    assert!(matches!(err, StoreError::SnapshotOutOfDate { .. }), "{err:?}");
    assert!(s.latest_snapshot().unwrap().is_none());
    // Staged and committed: the latest snapshot, readable and compactable behind.
    s.stage_snapshot(7, 2, b"state@7").unwrap();
    s.commit_snapshot(7, 2, cs.clone()).unwrap();
    let snap = s.latest_snapshot().unwrap().unwrap();
    assert_eq!((snap.get_metadata().index, snap.get_metadata().term), (7, 2));
    assert_eq!(snap.get_metadata().get_conf_state(), &cs);
    assert_eq!(snap.get_data(), b"state@7");
    s.compact(8).unwrap();
    assert_eq!(bounds(&s), (8, 10));
    // An older one staged later is out of date; beyond the log too.
    s.stage_snapshot(6, 2, b"state@6").unwrap();
    let err = s.commit_snapshot(6, 2, cs.clone()).unwrap_err();
    assert!(matches!(err, StoreError::SnapshotOutOfDate { .. }), "{err:?}");
    s.stage_snapshot(11, 2, b"state@11").unwrap();
    let err = s.commit_snapshot(11, 2, cs).unwrap_err();
    assert!(matches!(err, StoreError::SnapshotBeyondLog { .. }), "{err:?}");
    assert_eq!(s.latest_snapshot().unwrap().unwrap().get_data(), b"state@7");
}

fn staged_writes_are_read_back_before_they_are_written<S: RaftStore>(s: S) {
    // The asynchronous half of `persist`: what `stage` records is what raft-rs reads at once, whether or not the
    // store has written it; `write_pending` changes nothing raft-rs reads.
    let hs = HardState { term: 1, vote: 1, commit: 1, ..Default::default() };
    let first = s.stage(ents(1..=3, 1), Some(hs.clone())).unwrap();
    assert_eq!(bounds(&s), (1, 3));
    // The second replaces the first's last entry (a conflicting suffix), before either is written.
    let voted = HardState { term: 2, vote: 3, commit: 2, ..Default::default() };
    let second = s.stage(ents(3..=5, 2), Some(voted.clone())).unwrap();
    let commit_only = s.stage(vec![], Some(HardState { commit: 4, ..voted.clone() })).unwrap();
    assert!(!commit_only.needs_sync(), "a commit index alone does not wait for the disk");
    let read_back = |s: &S| {
        assert_eq!(bounds(s), (1, 5));
        let all = s.entries(1, 6, None, ctx()).unwrap();
        assert_eq!(index_terms(&all), vec![(1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]);
        assert_eq!(s.term(3).unwrap(), 2);
        assert_eq!(s.initial_state().unwrap().hard_state, HardState { commit: 4, ..voted.clone() });
    };
    read_back(&s);
    s.write_pending(&[first, second, commit_only]).unwrap();
    read_back(&s);
}

fn append_read_back<S: RaftStore>(s: S) {
    assert_eq!(bounds(&s), (1, 0));
    assert_eq!(s.entry_count(), 0);
    s.append(&[]).unwrap();
    s.append(&ents(1..=5, 1)).unwrap();
    assert_eq!(bounds(&s), (1, 5));
    assert_eq!(s.entry_count(), 5);
    assert_eq!(s.entries(1, 6, None, ctx()).unwrap(), ents(1..=5, 1));
    assert_eq!(s.entries(2, 4, None, ctx()).unwrap(), ents(2..=3, 1));
    assert_eq!(s.entries(3, 3, None, ctx()).unwrap(), vec![]);
    assert_eq!(s.term(3).unwrap(), 1);
    assert_eq!(s.term(0).unwrap(), 0);

    // max_size cuts exactly like raft::util::limit_size, always returning at least one entry.
    let all = ents(1..=5, 1);
    let one = u64::from(all[0].compute_size());
    for max in [0, one - 1, one, 2 * one, 2 * one + 1, 3 * one, 100 * one, raft::NO_LIMIT] {
        let mut want = all.clone();
        raft::util::limit_size(&mut want, Some(max));
        assert_eq!(s.entries(1, 6, max, ctx()).unwrap(), want, "max_size {max}");
    }
    assert_eq!(s.entries(1, 6, 2 * one, ctx()).unwrap().len(), 2);

    s.append(&ents(6..=7, 2)).unwrap();
    assert_eq!(bounds(&s), (1, 7));
    assert_eq!(s.term(7).unwrap(), 2);
    // A hole after the last index, and non-consecutive entries, are refused and change nothing.
    assert!(matches!(s.append(&ents(9..=9, 2)), Err(StoreError::Discontiguous { expected: 8, got: 9 })));
    assert!(matches!(s.append(&[ent(8, 2), ent(10, 2)]), Err(StoreError::Discontiguous { expected: 9, got: 10 })));
    assert_eq!(bounds(&s), (1, 7));
}

fn conflicting_append_truncates_suffix<S: RaftStore>(s: S) {
    s.append(&ents(1..=5, 1)).unwrap();
    s.append(&ents(3..=4, 2)).unwrap();
    assert_eq!(bounds(&s), (1, 4));
    assert_eq!(s.entry_count(), 4);
    assert_eq!(index_terms(&s.entries(1, 5, None, ctx()).unwrap()), vec![(1, 1), (2, 1), (3, 2), (4, 2)]);
    assert_eq!(s.term(5), Err(store_err(StorageError::Unavailable)));
    // Overwriting from the very first entry, and with a longer tail.
    s.append(&ents(1..=6, 3)).unwrap();
    assert_eq!(index_terms(&s.entries(1, 7, None, ctx()).unwrap()), (1..=6).map(|i| (i, 3)).collect::<Vec<_>>());
    // Appending right after the last index keeps everything.
    s.append(&ents(7..=7, 3)).unwrap();
    assert_eq!(bounds(&s), (1, 7));
}

fn term_and_entries_errors<S: RaftStore>(s: S) {
    s.append(&ents(1..=3, 1)).unwrap();
    assert_eq!(s.term(4), Err(store_err(StorageError::Unavailable)));
    assert_eq!(s.entries(1, 5, None, ctx()), Err(store_err(StorageError::Unavailable)));
    assert_eq!(s.entries(0, 2, None, ctx()), Err(store_err(StorageError::Compacted)));
    s.create_snapshot(2, conf(vec![1], vec![]), b"s".to_vec()).unwrap();
    s.compact(3).unwrap();
    assert_eq!(bounds(&s), (3, 3));
    assert_eq!(s.term(1), Err(store_err(StorageError::Compacted)));
    assert_eq!(s.term(2).unwrap(), 1, "the snapshot index keeps its term");
    assert_eq!(s.entries(2, 4, None, ctx()), Err(store_err(StorageError::Compacted)));
    assert_eq!(s.entries(3, 4, None, ctx()).unwrap(), ents(3..=3, 1));
}

fn create_snapshot_and_compact<S: RaftStore>(s: S) {
    s.append(&ents(1..=5, 1)).unwrap();
    s.append(&ents(6..=10, 2)).unwrap();
    assert!(s.latest_snapshot().unwrap().is_none());
    assert_eq!(s.snapshot(0, 2), Err(store_err(StorageError::SnapshotTemporarilyUnavailable)));
    assert!(matches!(s.compact(2), Err(StoreError::CompactBeyondSnapshot { compact_index: 2, snapshot_index: 0 })));
    assert!(matches!(
        s.create_snapshot(11, ConfState::default(), vec![]),
        Err(StoreError::SnapshotBeyondLog { index: 11, last_index: 10 })
    ));

    let cs = conf(vec![1, 2, 3], vec![4]);
    s.create_snapshot(7, cs.clone(), b"state@7".to_vec()).unwrap();
    let snap = s.latest_snapshot().unwrap().unwrap();
    assert_eq!((snap.get_metadata().index, snap.get_metadata().term), (7, 2));
    assert_eq!(snap.get_metadata().get_conf_state(), &cs);
    assert_eq!(snap.get_data(), b"state@7");
    assert!(matches!(
        s.create_snapshot(7, cs.clone(), vec![]),
        Err(StoreError::SnapshotOutOfDate { index: 7, snapshot_index: 7, .. })
    ));
    // Creating a snapshot does not compact, nor change the stored conf state.
    assert_eq!(bounds(&s), (1, 10));
    assert_eq!(s.initial_state().unwrap().conf_state, ConfState::default());

    assert!(matches!(s.compact(9), Err(StoreError::CompactBeyondSnapshot { compact_index: 9, snapshot_index: 7 })));
    // Keep a tail before the snapshot.
    s.compact(5).unwrap();
    assert_eq!(bounds(&s), (5, 10));
    assert_eq!(s.entry_count(), 6);
    assert_eq!(s.term(4), Err(store_err(StorageError::Compacted)));
    assert_eq!(s.term(5).unwrap(), 1);
    assert_eq!(s.term(7).unwrap(), 2);
    assert_eq!(s.entries(4, 6, None, ctx()), Err(store_err(StorageError::Compacted)));
    assert_eq!(index_terms(&s.entries(5, 7, None, ctx()).unwrap()), vec![(5, 1), (6, 2)]);
    s.compact(3).unwrap(); // no-op
    assert_eq!(bounds(&s), (5, 10));

    // Everything the snapshot covers.
    s.compact(8).unwrap();
    assert_eq!(bounds(&s), (8, 10));
    assert_eq!(s.entry_count(), 3);
    assert_eq!(s.term(7).unwrap(), 2);
    assert_eq!(s.term(6), Err(store_err(StorageError::Compacted)));
    assert_eq!(s.entries(7, 9, None, ctx()), Err(store_err(StorageError::Compacted)));
    assert_eq!(s.entries(8, 11, None, ctx()).unwrap(), ents(8..=10, 2));

    // snapshot(request_index): the stored one if new enough.
    assert_eq!(s.snapshot(0, 2).unwrap(), snap);
    assert_eq!(s.snapshot(7, 2).unwrap(), snap);
    assert_eq!(s.snapshot(8, 2), Err(store_err(StorageError::SnapshotTemporarilyUnavailable)));

    // Entries at or below the snapshot index are ignored by append; the rest truncates the suffix.
    s.append(&[ent(6, 9), ent(7, 9), ent(8, 3)]).unwrap();
    assert_eq!(bounds(&s), (8, 8));
    assert_eq!(s.term(7).unwrap(), 2);
    assert_eq!(s.term(8).unwrap(), 3);
    s.append(&ents(2..=7, 9)).unwrap(); // all covered: no-op
    assert_eq!(bounds(&s), (8, 8));

    // Snapshot the last entry and compact the whole log away.
    s.create_snapshot(8, cs.clone(), b"state@8".to_vec()).unwrap();
    s.compact(9).unwrap();
    assert_eq!(bounds(&s), (9, 8));
    assert_eq!(s.entry_count(), 0);
    assert_eq!(s.term(8).unwrap(), 3);
    assert_eq!(s.term(9), Err(store_err(StorageError::Unavailable)));
    assert_eq!(s.entries(9, 9, None, ctx()).unwrap(), vec![]);
    assert!(matches!(s.append(&ents(10..=10, 3)), Err(StoreError::Discontiguous { expected: 9, got: 10 })));
    s.append(&ents(9..=10, 3)).unwrap();
    assert_eq!(bounds(&s), (9, 10));
    assert_eq!(s.entries(9, 11, None, ctx()).unwrap(), ents(9..=10, 3));
}

fn apply_snapshot_replaces_log<S: RaftStore>(s: S) {
    s.set_conf_state(&conf(vec![1, 2, 3], vec![])).unwrap();
    s.append(&ents(1..=5, 1)).unwrap();
    let mut hs = HardState { term: 1, vote: 2, commit: 3, ..Default::default() };
    s.set_hard_state(&hs).unwrap();

    let cs = conf(vec![1, 2, 4], vec![5]);
    let snap = snapshot(20, 4, cs.clone(), b"state@20");
    s.apply_snapshot(&snap).unwrap();
    assert_eq!(bounds(&s), (21, 20));
    assert_eq!(s.entry_count(), 0);
    assert_eq!(s.term(20).unwrap(), 4);
    assert_eq!(s.term(5), Err(store_err(StorageError::Compacted)));
    assert_eq!(s.entries(5, 6, None, ctx()), Err(store_err(StorageError::Compacted)));
    let state = s.initial_state().unwrap();
    assert_eq!(state.conf_state, cs);
    assert_eq!((state.hard_state.term, state.hard_state.vote, state.hard_state.commit), (4, 2, 20));
    assert_eq!(s.latest_snapshot().unwrap().unwrap(), snap);
    assert_eq!(s.snapshot(20, 3).unwrap(), snap);
    assert_eq!(s.snapshot(21, 3), Err(store_err(StorageError::SnapshotTemporarilyUnavailable)));

    // Older snapshots are refused.
    assert!(matches!(
        s.apply_snapshot(&snapshot(10, 3, cs.clone(), b"old")),
        Err(StoreError::SnapshotOutOfDate { index: 10, first_index: 21, snapshot_index: 20 })
    ));
    // A hard state with a higher term than the snapshot keeps it.
    hs.term = 9;
    hs.commit = 20;
    s.set_hard_state(&hs).unwrap();

    s.append(&ents(21..=22, 9)).unwrap();
    assert_eq!(bounds(&s), (21, 22));
    assert_eq!(s.entries(21, 23, None, ctx()).unwrap(), ents(21..=22, 9));

    s.apply_snapshot(&snapshot(30, 8, cs.clone(), b"state@30")).unwrap();
    let state = s.initial_state().unwrap();
    assert_eq!((state.hard_state.term, state.hard_state.commit), (9, 30));
    assert_eq!(bounds(&s), (31, 30));
}

fn hard_and_conf_state_round_trip<S: RaftStore>(s: S) {
    let state = s.initial_state().unwrap();
    assert!(!state.initialized());
    let hs = HardState { term: 3, vote: 1, commit: 0, ..Default::default() };
    s.set_hard_state(&hs).unwrap();
    s.set_conf_state(&conf(vec![1, 2, 3], vec![])).unwrap();
    let state = s.initial_state().unwrap();
    assert!(state.initialized());
    assert_eq!(state.hard_state, hs);
    assert_eq!(state.conf_state, conf(vec![1, 2, 3], vec![]));
}

macro_rules! both {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn mem() {
                super::$name(tessera_coordinator::storage::MemStore::new());
            }

            #[test]
            fn sled() {
                let dir = tempfile::tempdir().unwrap();
                super::$name(super::open_sled(dir.path()).unwrap());
            }
        }
    )*};
}

both!(
    append_read_back,
    conflicting_append_truncates_suffix,
    term_and_entries_errors,
    create_snapshot_and_compact,
    apply_snapshot_replaces_log,
    hard_and_conf_state_round_trip,
    persist_writes_entries_and_hard_state_together,
    staged_snapshots_are_committed_only_where_they_were_staged,
    staged_writes_are_read_back_before_they_are_written,
);

#[test]
fn mem_new_with_conf_state_is_initialized() {
    let s = MemStore::new_with_conf_state(vec![1, 2, 3]);
    let state = s.initial_state().unwrap();
    assert!(state.initialized());
    assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
    assert_eq!(bounds(&s), (1, 0));
}

// ----- SledStore only ------------------------------------------------------------------------------------------

#[test]
fn sled_reopen_restores_everything() {
    let dir = tempfile::tempdir().unwrap();
    let cs = conf(vec![1, 2, 3], vec![]);
    let hs = HardState { term: 2, vote: 3, commit: 9, ..Default::default() };
    {
        let s = open_sled(dir.path()).unwrap();
        s.set_conf_state(&cs).unwrap();
        s.append(&ents(1..=5, 1)).unwrap();
        s.append(&ents(6..=10, 2)).unwrap();
        s.set_hard_state(&hs).unwrap();
        s.create_snapshot(8, cs.clone(), b"state@8".to_vec()).unwrap();
        s.compact(6).unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(bounds(&s), (6, 10));
    assert_eq!(s.entry_count(), 5);
    let state = s.initial_state().unwrap();
    assert_eq!(state.hard_state, hs);
    assert_eq!(state.conf_state, cs);
    assert_eq!(s.entries(6, 11, None, ctx()).unwrap(), ents(6..=10, 2));
    assert_eq!(s.term(8).unwrap(), 2);
    assert_eq!(s.term(5), Err(store_err(StorageError::Compacted)));
    let snap = s.latest_snapshot().unwrap().unwrap();
    assert_eq!((snap.get_metadata().index, snap.get_metadata().term), (8, 2));
    assert_eq!(snap.get_data(), b"state@8");
    drop(s);

    // After an installed snapshot.
    {
        let s = open_sled(dir.path()).unwrap();
        s.apply_snapshot(&snapshot(50, 5, conf(vec![1, 2], vec![3]), b"state@50")).unwrap();
        s.append(&ents(51..=52, 5)).unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(bounds(&s), (51, 52));
    assert_eq!(s.term(50).unwrap(), 5);
    let state = s.initial_state().unwrap();
    assert_eq!(state.conf_state, conf(vec![1, 2], vec![3]));
    assert_eq!((state.hard_state.term, state.hard_state.commit), (5, 50));
    assert_eq!(s.latest_snapshot().unwrap().unwrap().get_data(), b"state@50");
}

#[test]
fn sled_commit_index_past_the_log_is_lowered_on_open() {
    // `set_commit` does not sync: a crash can recover a commit index whose entries were not durable yet. raft-rs
    // refuses to start on such a hard state; the store lowers it to the last index.
    let dir = tempfile::tempdir().unwrap();
    let hs = HardState { term: 3, vote: 1, commit: 2, ..Default::default() };
    {
        let s = open_sled(dir.path()).unwrap();
        s.persist(&ents(1..=4, 3), Some(&hs)).unwrap();
        s.set_commit(&HardState { commit: 9, ..hs.clone() }).unwrap();
        s.sync(false).unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(bounds(&s), (1, 4));
    assert_eq!(s.initial_state().unwrap().hard_state, HardState { commit: 4, ..hs });
}

#[test]
fn sled_staged_snapshot_survives_only_once_committed() {
    let dir = tempfile::tempdir().unwrap();
    let cs = conf(vec![1], vec![]);
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=6, 1)).unwrap();
        s.stage_snapshot(3, 1, b"state@3").unwrap();
        s.commit_snapshot(3, 1, cs.clone()).unwrap();
        // Staged, never committed (the node stopped while the worker wrote it).
        s.stage_snapshot(5, 1, b"state@5").unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    let snap = s.latest_snapshot().unwrap().unwrap();
    assert_eq!((snap.get_metadata().index, snap.get_data()), (3, &b"state@3"[..]));
    // The leftover is gone: committing it now finds nothing.
    let err = s.commit_snapshot(5, 1, cs).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt(_)), "{err:?}");
}

#[test]
fn sled_a_staged_write_is_durable_only_once_written() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HardState { term: 1, vote: 1, commit: 2, ..Default::default() };
    {
        let s = open_sled(dir.path()).unwrap();
        let w = s.stage(ents(1..=3, 1), Some(hs.clone())).unwrap();
        assert!(w.needs_sync() && w.sync_hard_state);
        s.write_pending(&[w]).unwrap();
        // Staged, never written: the node stopped before its persist thread wrote it.
        let _lost = s.stage(ents(4..=6, 2), Some(HardState { term: 2, vote: 2, commit: 3, ..Default::default() }));
        assert_eq!(bounds(&s), (1, 6));
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(bounds(&s), (1, 3));
    assert_eq!(s.initial_state().unwrap().hard_state, hs);

    // Several staged writes made durable as one batch, the later replacing the end of the earlier.
    let voted = HardState { term: 3, vote: 2, commit: 3, ..Default::default() };
    let batch = [
        s.stage(ents(3..=4, 2), None).unwrap(),
        s.stage(ents(4..=5, 3), Some(voted.clone())).unwrap(),
        s.stage(vec![], Some(HardState { commit: 4, ..voted.clone() })).unwrap(),
    ];
    s.write_pending(&batch).unwrap();
    drop(s);
    let s = open_sled(dir.path()).unwrap();
    let all = s.entries(1, 6, None, ctx()).unwrap();
    assert_eq!(index_terms(&all), vec![(1, 1), (2, 1), (3, 2), (4, 3), (5, 3)]);
    assert_eq!(s.initial_state().unwrap().hard_state, HardState { commit: 4, ..voted });
}

#[test]
fn sled_second_open_is_locked() {
    let dir = tempfile::tempdir().unwrap();
    let first = open_sled(dir.path()).unwrap();
    let err = SledStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
    assert!(err.to_string().contains("already open"), "{err}");
    drop(first);
    open_sled(dir.path()).unwrap();
}

#[test]
fn sled_open_creates_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a/b/raft");
    let s = open_sled(&path).unwrap();
    assert!(path.is_dir());
    assert_eq!(bounds(&s), (1, 0));
}

fn expect_corrupt(result: Result<SledStore, StoreError>, needles: &[&str]) {
    match result {
        Err(StoreError::Corrupt(msg)) => {
            for n in needles {
                assert!(msg.contains(n), "{msg:?} should name {n:?}");
            }
        }
        other => panic!("expected StoreError::Corrupt, got {other:?}"),
    }
}

#[test]
fn sled_reads_agree_through_truncations_compaction_and_reopen() {
    // The log is kept in memory and replayed from its files on open: both agree through truncations near the end
    // and far back, compaction over many segments and a reopen.
    let dir = tempfile::tempdir().unwrap();
    let expect = |s: &SledStore, low: u64, high: u64, want: Vec<(u64, u64)>| {
        assert_eq!(index_terms(&s.entries(low, high, None, ctx()).unwrap()), want, "entries({low}, {high})");
        for (i, t) in want {
            assert_eq!(s.term(i).unwrap(), t, "term({i})");
        }
    };
    let pairs = |r: std::ops::RangeInclusive<u64>, t: u64| r.map(|i| (i, t)).collect::<Vec<_>>();
    let open = |path: &std::path::Path| open_sled_segments(path, 16 * 1024);
    {
        let s = open(dir.path()).unwrap();
        s.append(&ents(1..=6000, 1)).unwrap();
        s.append(&ents(5000..=5100, 2)).unwrap();
        assert_eq!(bounds(&s), (1, 5100));
        expect(&s, 900, 5101, [pairs(900..=4999, 1), pairs(5000..=5100, 2)].concat());
        expect(&s, 5050, 5060, pairs(5050..=5059, 2));
        for i in 5101..=5400 {
            s.append(&ents(i..=i, 2)).unwrap();
        }
        s.append(&ents(50..=60, 3)).unwrap();
        assert_eq!(bounds(&s), (1, 60));
        expect(&s, 40, 61, [pairs(40..=49, 1), pairs(50..=60, 3)].concat());
        for i in 61..=2000 {
            s.append(&ents(i..=i, 3)).unwrap();
        }
        let before = segments(dir.path());
        s.create_snapshot(1500, ConfState::default(), b"state@1500".to_vec()).unwrap();
        s.compact(1501).unwrap();
        let after = segments(dir.path());
        assert!(after < before, "compaction kept {after} of {before} segments");
        assert_eq!(s.term(1500).unwrap(), 3);
        assert_eq!(s.entries(1400, 1600, None, ctx()), Err(store_err(StorageError::Compacted)));
        expect(&s, 1501, 2001, pairs(1501..=2000, 3));
    }
    let s = open(dir.path()).unwrap();
    // Entries below the compaction that a segment still holds are not brought back.
    assert_eq!(bounds(&s), (1501, 2000));
    expect(&s, 1501, 2001, pairs(1501..=2000, 3));
}

/// The log's segment files under a store's directory, oldest first.
fn segment_files(store: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(store.join("wal")).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
}

/// How many segment files a store's log has.
fn segments(store: &std::path::Path) -> usize {
    segment_files(store).len()
}

/// The last segment file under a store's directory.
fn last_segment(store: &std::path::Path) -> std::path::PathBuf {
    segment_files(store).pop().unwrap()
}

#[test]
fn sled_a_torn_append_loses_only_itself() {
    // A crash during an append leaves part of its record: the write never returned, so raft never counted it.
    // Open cuts it and keeps everything before it; later appends go on from there.
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=5, 1)).unwrap();
        s.append(&ents(6..=6, 1)).unwrap();
    }
    let seg = last_segment(dir.path());
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        assert_eq!(bounds(&s), (1, 5));
        s.append(&ents(6..=7, 2)).unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(
        index_terms(&s.entries(1, 8, None, ctx()).unwrap()),
        [(1, 1), (2, 1), (3, 1), (4, 1), (5, 1), (6, 2), (7, 2)]
    );
}

#[test]
fn sled_a_damaged_record_before_the_end_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled_segments(dir.path(), 1024).unwrap();
        for i in 1..=100 {
            s.append(&ents(i..=i, 1)).unwrap();
        }
    }
    let files = segment_files(dir.path());
    assert!(files.len() > 2);
    let mut bytes = std::fs::read(&files[1]).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x40;
    std::fs::write(&files[1], &bytes).unwrap();
    let name = files[1].file_name().unwrap().to_str().unwrap().to_string();
    expect_corrupt(open_sled_segments(dir.path(), 1024), &[&name, "offset"]);
}

#[test]
fn sled_a_segment_lost_from_the_live_log_is_corrupt_and_nothing_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled_segments(dir.path(), 1024).unwrap();
        for i in 1..=300 {
            s.append(&ents(i..=i, 1)).unwrap();
        }
    }
    let files = segment_files(dir.path());
    assert!(files.len() > 3);
    std::fs::remove_file(&files[1]).unwrap();
    expect_corrupt(open_sled_segments(dir.path(), 1024), &["hole after snapshot index 0"]);
    // The segment before the gap is still there, for an operator to look at.
    assert!(files[0].exists());
}

// ----- stores written before the entries moved out of sled ---------------------------------------------------------

/// Writes sled's side of a store as a binary from before the entries moved out of sled left it: entries in tree
/// `raft_entries` (index as 8 big-endian bytes, protobuf value) and the given `raft_meta` keys. It does not touch a
/// `wal/` directory: on a fresh directory that is a store from before the move, beside an existing log a store
/// that an older binary ran after a downgrade.
fn legacy_store(path: &std::path::Path, entries: &[(u64, Vec<u8>)], meta: &[(&str, Vec<u8>)]) {
    let db = raw_sled(path);
    let tree = db.open_tree("raft_entries").unwrap();
    for (index, value) in entries {
        tree.insert(index.to_be_bytes(), value.clone()).unwrap();
    }
    let tree = db.open_tree("raft_meta").unwrap();
    for (key, value) in meta {
        tree.insert(key.as_bytes(), value.clone()).unwrap();
    }
    db.flush().unwrap();
}

/// Opens the sled database at `path` itself, waiting as [`open_sled`] does for an earlier handle's lock.
fn raw_sled(path: &std::path::Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match sled::Config::new().path(path).open() {
            Ok(db) => return db,
            Err(e) if std::time::Instant::now() < deadline && e.to_string().contains("could not acquire lock") => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("cannot open sled at {}: {e}", path.display()),
        }
    }
}

fn encoded(r: std::ops::RangeInclusive<u64>, term: u64) -> Vec<(u64, Vec<u8>)> {
    r.map(|i| (i, ent(i, term).write_to_bytes().unwrap())).collect()
}

#[test]
fn sled_a_legacy_log_moves_to_its_own_files() {
    let dir = tempfile::tempdir().unwrap();
    let hs = HardState { term: 2, vote: 1, commit: 7, ..Default::default() };
    let cs = conf(vec![1, 2, 3], vec![]);
    legacy_store(
        dir.path(),
        &[encoded(1..=5, 1), encoded(6..=10, 2)].concat(),
        &[("hard_state", hs.write_to_bytes().unwrap()), ("conf_state", cs.write_to_bytes().unwrap())],
    );
    for _ in 0..2 {
        let s = open_sled(dir.path()).unwrap();
        assert_eq!(bounds(&s), (1, 10));
        assert_eq!(s.entries(1, 11, None, ctx()).unwrap(), [ents(1..=5, 1), ents(6..=10, 2)].concat());
        let state = s.initial_state().unwrap();
        assert_eq!((state.hard_state, state.conf_state), (hs.clone(), cs.clone()));
        // sled's copy is gone once the files hold the log.
        assert!(s.db().open_tree("raft_entries").unwrap().is_empty());
        assert!(dir.path().join("wal").is_dir());
    }
}

#[test]
fn sled_entries_a_downgraded_binary_wrote_to_sled_replace_the_stale_files() {
    // A store on the log's files (1 to 7 at term 1, a snapshot at 5), then opened by a binary from before them,
    // which knows only tree `raft_entries`: it wrote 6 to 9 at term 2 there. On the next upgrade sled's copy is the
    // log: the files' 6 and 7 are stale, and nothing the older binary acknowledged is lost.
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=7, 1)).unwrap();
        s.create_snapshot(5, conf(vec![1, 2, 3], vec![]), b"state@5".to_vec()).unwrap();
        s.compact(6).unwrap();
    }
    let hs = HardState { term: 2, vote: 2, commit: 9, ..Default::default() };
    legacy_store(dir.path(), &encoded(6..=9, 2), &[("hard_state", hs.write_to_bytes().unwrap())]);
    for _ in 0..2 {
        let s = open_sled(dir.path()).unwrap();
        assert_eq!(bounds(&s), (6, 9));
        assert_eq!(s.entries(6, 10, None, ctx()).unwrap(), ents(6..=9, 2));
        assert_eq!(s.initial_state().unwrap().hard_state, hs);
        assert!(s.db().open_tree("raft_entries").unwrap().is_empty());
        assert!(dir.path().join("wal").is_dir() && !dir.path().join("wal.old").exists());
    }
}

#[test]
fn sled_a_log_replacement_cut_short_is_finished_on_open() {
    // Replacing the files moves the old log aside to `wal.old`, renames the new one into place, then deletes the
    // old one. A crash after the move aside leaves no `wal/` and sled's entries (moved again on open); a crash
    // before the deletion leaves `wal.old` beside the new log (deleted on open).
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=3, 1)).unwrap();
    }
    std::fs::rename(dir.path().join("wal"), dir.path().join("wal.old")).unwrap();
    legacy_store(dir.path(), &encoded(1..=4, 2), &[]);
    {
        let s = open_sled(dir.path()).unwrap();
        assert_eq!(s.entries(1, 5, None, ctx()).unwrap(), ents(1..=4, 2));
        assert!(!dir.path().join("wal.old").exists());
    }
    std::fs::create_dir(dir.path().join("wal.old")).unwrap();
    std::fs::write(dir.path().join("wal.old").join("00000000000000000000.wal"), b"stale").unwrap();
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(s.entries(1, 5, None, ctx()).unwrap(), ents(1..=4, 2));
    assert!(!dir.path().join("wal.old").exists());
}

#[test]
fn sled_a_legacy_corrupt_entry_is_reported_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = encoded(1..=4, 1);
    entries[1].1 = vec![0xff; 4];
    legacy_store(dir.path(), &entries, &[]);
    expect_corrupt(open_sled(dir.path()), &["raft_entries", "key 2", "cannot decode"]);
    // Nothing was moved or dropped: the same error again, and sled still holds all four.
    expect_corrupt(open_sled(dir.path()), &["raft_entries", "key 2", "cannot decode"]);
    assert!(!dir.path().join("wal").exists());
    assert_eq!(raw_sled(dir.path()).open_tree("raft_entries").unwrap().len(), 4);
}

#[test]
fn sled_a_legacy_entry_under_the_wrong_key_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = encoded(1..=3, 1);
    entries[2].1 = ent(2, 1).write_to_bytes().unwrap();
    legacy_store(dir.path(), &entries, &[]);
    expect_corrupt(open_sled(dir.path()), &["raft_entries", "key 3", "index 2"]);
}

#[test]
fn sled_a_legacy_hole_in_the_log_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let mut entries = encoded(1..=4, 1);
    entries.remove(1);
    legacy_store(dir.path(), &entries, &[]);
    expect_corrupt(open_sled(dir.path()), &["raft_entries", "entries 2 to 2 are missing"]);
}

#[test]
fn sled_corrupt_meta_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.set_hard_state(&HardState::default()).unwrap();
        s.db().open_tree("raft_meta").unwrap().insert("hard_state", &[0xff_u8; 3]).unwrap();
        s.db().flush().unwrap();
    }
    expect_corrupt(open_sled(dir.path()), &["raft_meta", "hard_state"]);

    // The first index after a compaction, read only where the log has entries.
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=3, 1)).unwrap();
        s.db().open_tree("raft_meta").unwrap().insert("first_index", &[1_u8, 2, 3]).unwrap();
        s.db().flush().unwrap();
    }
    expect_corrupt(open_sled(dir.path()), &["raft_meta", "first_index", "8-byte"]);
}

#[test]
fn sled_log_older_than_snapshot_is_dropped_on_open() {
    // As if a snapshot's metadata had been written without its log being cleared: the stale log goes on open.
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=5, 1)).unwrap();
        let meta = s.db().open_tree("raft_meta").unwrap();
        // Entry 4 has term 1: a different history.
        let m = SnapshotMetadata { index: 4, term: 3, ..Default::default() };
        meta.insert("snapshot_meta", m.write_to_bytes().unwrap()).unwrap();
        meta.insert("snapshot_data", b"x".to_vec()).unwrap();
        s.db().flush().unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(bounds(&s), (5, 4));
    assert_eq!(s.term(4).unwrap(), 3);
    assert_eq!(s.entry_count(), 0);
}

#[test]
fn sled_shares_its_db() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.db().open_tree("fleet").unwrap().insert("k", "v").unwrap();
        s.sync(false).unwrap();
        s.append(&ents(1..=2, 1)).unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(bounds(&s), (1, 2));
    assert_eq!(s.db().open_tree("fleet").unwrap().get("k").unwrap().unwrap(), b"v");
}

#[test]
fn sled_large_snapshot_round_trips() {
    // Over sled's blob threshold (about 128 KiB), so the data lives in a blob file that `sync(true)` covers.
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let dir = tempfile::tempdir().unwrap();
    {
        let s = open_sled(dir.path()).unwrap();
        s.append(&ents(1..=3, 1)).unwrap();
        s.create_snapshot(2, conf(vec![1], vec![]), data.clone()).unwrap();
        s.compact(3).unwrap();
    }
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(s.latest_snapshot().unwrap().unwrap().get_data(), &data[..]);
    s.apply_snapshot(&snapshot(10, 2, conf(vec![1], vec![]), &data[..500_000])).unwrap();
    drop(s);
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(s.latest_snapshot().unwrap().unwrap().get_data(), &data[..500_000]);
    assert_eq!(bounds(&s), (11, 10));
}

// ----- raft-rs on SledStore --------------------------------------------------------------------------------------

/// Drives a single-voter node until it has nothing ready, persisting as raft requires and applying normal entries'
/// data to `applied`.
fn drive<S: RaftStore>(node: &mut RawNode<S>, store: &S, applied: &mut Vec<String>) {
    let apply = |entries: Vec<Entry>, applied: &mut Vec<String>| {
        for e in entries {
            if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
                applied.push(String::from_utf8(e.data.to_vec()).unwrap());
            }
        }
    };
    while node.has_ready() {
        let mut rd = node.ready();
        assert!(rd.messages().is_empty());
        if !rd.snapshot().is_empty() {
            store.apply_snapshot(rd.snapshot()).unwrap();
        }
        apply(rd.take_committed_entries(), applied);
        store.append(rd.entries()).unwrap();
        if let Some(hs) = rd.hs() {
            store.set_hard_state(hs).unwrap();
        }
        assert!(rd.persisted_messages().is_empty());
        let mut light = node.advance(rd);
        if let Some(commit) = light.commit_index() {
            let mut hs = store.initial_state().unwrap().hard_state;
            hs.commit = commit;
            store.set_hard_state(&hs).unwrap();
        }
        apply(light.take_committed_entries(), applied);
        node.advance_apply();
    }
}

fn config(applied: u64) -> Config {
    let mut c = Config::new(1);
    c.applied = applied;
    c.validate().unwrap();
    c
}

#[test]
fn raft_node_runs_on_sled_across_restart() {
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let dir = tempfile::tempdir().unwrap();
    let snapshot_index;
    {
        let store = open_sled(dir.path()).unwrap();
        store.set_conf_state(&conf(vec![1], vec![])).unwrap();
        let mut node = RawNode::new(&config(0), store.clone(), &logger).unwrap();
        node.campaign().unwrap();
        let mut applied = Vec::new();
        drive(&mut node, &store, &mut applied);
        for p in ["a", "b", "c"] {
            node.propose(vec![], p.as_bytes().to_vec()).unwrap();
            drive(&mut node, &store, &mut applied);
        }
        assert_eq!(applied, ["a", "b", "c"]);
        // Snapshot after "b" (index 3: the leader's empty entry is 1), compact what it covers, then one more.
        snapshot_index = 3;
        store.create_snapshot(snapshot_index, conf(vec![1], vec![]), b"a,b".to_vec()).unwrap();
        store.compact(snapshot_index + 1).unwrap();
        node.propose(vec![], b"d".to_vec()).unwrap();
        drive(&mut node, &store, &mut applied);
        assert_eq!(applied, ["a", "b", "c", "d"]);
        assert_eq!(bounds(&store), (4, 5));
    }

    // Restart: restore the state machine from the snapshot, replay the committed entries after it.
    let store = open_sled(dir.path()).unwrap();
    let snap = store.latest_snapshot().unwrap().unwrap();
    assert_eq!(snap.get_metadata().index, snapshot_index);
    let mut applied: Vec<String> =
        String::from_utf8(snap.get_data().to_vec()).unwrap().split(',').map(String::from).collect();
    let mut node = RawNode::new(&config(snapshot_index), store.clone(), &logger).unwrap();
    drive(&mut node, &store, &mut applied);
    assert_eq!(applied, ["a", "b", "c", "d"]);
    node.campaign().unwrap();
    drive(&mut node, &store, &mut applied);
    node.propose(vec![], b"e".to_vec()).unwrap();
    drive(&mut node, &store, &mut applied);
    assert_eq!(applied, ["a", "b", "c", "d", "e"]);
    assert_eq!(node.raft.term, 2);
    assert_eq!(store.initial_state().unwrap().hard_state.commit, store.last_index().unwrap());
}

// ----- fsync cost ---------------------------------------------------------------------------------------------------

/// Not a check: prints what appends with flush cost here. `cargo test --test storage -- --ignored --nocapture`.
#[test]
#[ignore]
fn sled_append_flush_cost() {
    let payload = vec![7u8; 256];
    let mk = |index: u64| {
        let mut e = ent(index, 1);
        e.data = payload.clone().into();
        e
    };
    let dir = tempfile::tempdir().unwrap();
    let s = open_sled(dir.path()).unwrap();
    let t = Instant::now();
    for i in 1..=1000 {
        s.append(&[mk(i)]).unwrap();
    }
    let single = t.elapsed();
    let t = Instant::now();
    for b in 0..10u64 {
        let batch: Vec<Entry> = (1..=100).map(|i| mk(1000 + b * 100 + i)).collect();
        s.append(&batch).unwrap();
    }
    let batched = t.elapsed();
    let t = Instant::now();
    let mut hs = HardState::default();
    for i in 1..=1000 {
        hs.commit = i;
        s.set_hard_state(&hs).unwrap();
    }
    let hard = t.elapsed();
    println!(
        "store in {}: 1000 x 1-entry appends {:?} ({:?}/append); 10 x 100-entry appends {:?} ({:?}/append); \
         1000 x set_hard_state {:?}",
        dir.path().display(),
        single,
        single / 1000,
        batched,
        batched / 10,
        hard
    );
}

/// Opens a sled store, waiting while an earlier handle in this process still holds the directory's lock: sled
/// releases it from a background thread after the last handle is dropped.
fn open_sled(path: &std::path::Path) -> Result<SledStore, tessera_coordinator::storage::StoreError> {
    open_sled_segments(path, tessera_coordinator::wal::SEGMENT_BYTES)
}

/// [`open_sled`] with the log's segments closed at `segment_bytes`.
fn open_sled_segments(
    path: &std::path::Path,
    segment_bytes: u64,
) -> Result<SledStore, tessera_coordinator::storage::StoreError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match SledStore::open_with_segment_bytes(path, segment_bytes) {
            Err(tessera_coordinator::storage::StoreError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return other,
        }
    }
}

#[test]
fn sled_disk_stays_bounded_over_many_snapshots_and_leftovers_go_on_open() {
    // 40 snapshots of 2 MB, each after entries and many hard-state writes (one per Ready in a running node): the
    // store keeps one snapshot, so its size stays near one snapshot plus sled's log, whatever the count. (With the
    // data inside sled, this store grew to 18.0 MB.)
    let data: Vec<u8> = (0..2_000_000u32).map(|i| (i % 251) as u8).collect();
    let dir = tempfile::tempdir().unwrap();
    let s = open_sled(dir.path()).unwrap();
    let mut hs = HardState::default();
    let mut peak = 0;
    for round in 1..=40u64 {
        s.append(&ents((round - 1) * 10 + 1..=round * 10, 1)).unwrap();
        for _ in 0..20 {
            hs.commit = round * 10;
            s.set_hard_state(&hs).unwrap();
        }
        s.create_snapshot(round * 10, conf(vec![1], vec![]), data.clone()).unwrap();
        s.compact(round * 10).unwrap();
        peak = peak.max(dir_bytes(dir.path()));
    }
    let bound = 2 * data.len() as u64 + 8 * 1024 * 1024;
    println!("store on disk after 40 snapshots of 2 MB: {} bytes now, {peak} at most", dir_bytes(dir.path()));
    assert!(peak < bound, "the store grew to {peak} bytes (bound {bound})");
    assert_eq!(s.disk_bytes(), dir_bytes(dir.path()));
    let snaps = dir.path().join("snapshots");
    assert_eq!(std::fs::read_dir(&snaps).unwrap().count(), 1);
    drop(s);

    // A crash between writing a snapshot file and recording it leaves a file (or a temporary one) behind: the
    // next open removes it and keeps the recorded snapshot.
    std::fs::write(snaps.join("00000000000000009999-00000000000000000001.snap"), b"orphan").unwrap();
    std::fs::write(snaps.join("x.snap.tmp"), b"half").unwrap();
    let s = open_sled(dir.path()).unwrap();
    assert_eq!(s.latest_snapshot().unwrap().unwrap().get_data(), &data[..]);
    assert_eq!(std::fs::read_dir(&snaps).unwrap().count(), 1);
    drop(s);

    // The recorded snapshot's file missing is corruption, named.
    for f in std::fs::read_dir(&snaps).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    expect_corrupt(open_sled(dir.path()), &["snapshot_meta", "missing"]);
}

/// Bytes of the files under `path`.
fn dir_bytes(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() { dir_bytes(&e.path()) } else { m.len() }
        })
        .sum()
}
