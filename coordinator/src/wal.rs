//! The Raft log's entries on disk: a write-ahead log of numbered segment files, appended and fdatasynced by the
//! caller's thread (the node's persist thread), one `write` and one `fdatasync` per append, which may carry several
//! `Ready`s' entries (and a few fsyncs more when a segment is full and the next one starts).
//!
//! This is the layout etcd's WAL uses, cut down to what [`crate::storage::SledStore`] needs from it: the hard state,
//! conf state and snapshot metadata stay in sled, which is written rarely; only the entries, written on every
//! `Ready`, live here. (In sled, each sync handed the write to sled's I/O thread pool, whose queue wakes all of its
//! threads per job: about 128 context switches per acknowledged write at one write in flight.)
//!
//! - Directory `wal/` holds segments `<seq>.wal` (`seq` as 20 decimal digits, consecutive: a missing one is
//!   corruption). The last segment is the active one; a new one is started once it holds [`SEGMENT_BYTES`].
//! - A segment is a sequence of records `[len: u32 LE][crc32: u32 LE][kind: u8][payload]`, where `len` counts the
//!   kind byte and the payload and the CRC (crc32, IEEE) covers both. Kind 1 is an entry (protobuf [`Entry`]); kind
//!   2 is the segment's header, always its first record: the index the log continues at (0: anywhere) and whether
//!   the log restarts there (an installed snapshot dropped everything before it).
//! - An entry whose index is at or below the last one replaces it and drops everything after it (raft's conflicting
//!   suffix); an entry past `last + 1` is a hole, and corruption.
//! - A segment is created under a temporary name with its header, fsynced and renamed, so every `.wal` file has a
//!   whole header. A crash can leave the active segment's last write torn: opening cuts the segment there, since
//!   that write never returned. A record counts as torn as etcd's WAL decides: it runs past the end of the file, the
//!   file is zeros from there on, a 512-byte sector of it reads as zeros, or it fails its CRC as the file's last
//!   record. Any other damage, and any in an older segment, is corruption, reported with the file and offset.
//! - Compaction deletes whole segments, oldest first, up to the first that holds an entry at or above the first index
//!   kept, never the active one. Segments a cut-short deletion left before a gap are left out on open.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use protobuf::Message as _;
use raft::prelude::Entry;

use crate::store_error::StoreError;

/// The size at which the active segment is closed and a new one started (as etcd's).
pub const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;

/// Record kinds.
const KIND_ENTRY: u8 = 1;
const KIND_HEADER: u8 = 2;
/// Bytes before a record's kind: length and CRC.
const FRAME: usize = 8;
/// The largest record accepted on reading: anything longer is a torn or corrupt length.
const MAX_RECORD: usize = 1 << 30;

/// A segment file: its sequence number and the highest index of the entries in it that are still in the log (0 if
/// none).
#[derive(Debug)]
struct Segment {
    seq: u64,
    max_index: u64,
}

/// The log's segments and the active one's open file. Not synchronized: the store holds it behind a mutex.
#[derive(Debug)]
pub struct Wal {
    dir: PathBuf,
    /// Oldest first; never empty; the last is the active one.
    segments: Vec<Segment>,
    /// Segments found before a gap on open, to delete with the next compaction.
    leftovers: Vec<u64>,
    active: File,
    active_bytes: u64,
    segment_bytes: u64,
    buf: Vec<u8>,
}

fn io_error(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io { what, path, source }
}

fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_error("cannot fsync directory", dir))
}

fn segment_name(seq: u64) -> String {
    format!("{seq:020}.wal")
}

/// Appends one record to `buf`.
fn put_record(buf: &mut Vec<u8>, kind: u8, payload: &[u8]) {
    let len = u32::try_from(payload.len() + 1).expect("a record under 4 GiB");
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(payload);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&crc.finalize().to_le_bytes());
    buf.push(kind);
    buf.extend_from_slice(payload);
}

fn header_payload(next_index: u64, reset: bool) -> [u8; 9] {
    let mut p = [0u8; 9];
    p[..8].copy_from_slice(&next_index.to_le_bytes());
    p[8] = u8::from(reset);
    p
}

/// One record read back: kind and payload, or why the bytes at `offset` are not a whole, intact record, and whether
/// they look like a write a crash cut short (after etcd's rule: the record runs past the end of the file, or the
/// file is zeros from inside it to its end, or a 512-byte sector of the record reads as zeros, or it fails its CRC
/// as the file's last record) rather than damage to data once written whole.
enum Read<'a> {
    Record { kind: u8, payload: &'a [u8], next: usize },
    End,
    Bad { why: String, torn: bool },
}

/// The sector size of the torn-write rule.
const SECTOR: usize = 512;

fn read_record(bytes: &[u8], offset: usize) -> Read<'_> {
    let rest = &bytes[offset..];
    if rest.is_empty() {
        return Read::End;
    }
    let zeros = |b: &[u8]| b.iter().all(|&x| x == 0);
    if rest.len() < FRAME + 1 {
        return Read::Bad { why: format!("{} bytes, too short for a record", rest.len()), torn: true };
    }
    let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
    let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
    if len == 0 || len > MAX_RECORD {
        return Read::Bad { why: format!("record length {len} is out of range"), torn: zeros(rest) };
    }
    if rest.len() < FRAME + len {
        return Read::Bad { why: format!("record of {len} bytes but {} remain", rest.len() - FRAME), torn: true };
    }
    let body = &rest[FRAME..FRAME + len];
    if crc32fast::hash(body) != crc {
        let end = offset + FRAME + len;
        let zero_sector = (offset.div_ceil(SECTOR) * SECTOR..end)
            .step_by(SECTOR)
            .any(|start| start + SECTOR <= end && zeros(&bytes[start..start + SECTOR]));
        // Where the zeros that end the file begin: a write cut short after the file grew reads as zeros to its end.
        let trailing_zeros = bytes.len() - bytes.iter().rev().take_while(|&&b| b == 0).count();
        let torn = end == bytes.len() || zero_sector || trailing_zeros < end;
        return Read::Bad { why: "checksum mismatch".to_string(), torn };
    }
    Read::Record { kind: body[0], payload: &body[1..], next: offset + FRAME + len }
}

/// A record whose entry leaves a hole after the entries read before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("entry {index} follows entry {last}: entries {} to {} are missing", last + 1, index - 1)]
struct Hole {
    /// The entry's index.
    index: u64,
    /// The last index read before it.
    last: u64,
}

/// Applies one entry to the replayed log, as an append does: a conflicting suffix goes, a hole is an error.
fn replay_entry(log: &mut VecDeque<Entry>, entry: Entry) -> Result<(), Hole> {
    if let Some(last) = log.back().map(|e| e.index) {
        if entry.index > last + 1 {
            return Err(Hole { index: entry.index, last });
        }
        let first = log.front().map_or(entry.index, |e| e.index);
        if entry.index < first {
            log.clear();
        } else {
            log.truncate(usize::try_from(entry.index - first).expect("log length fits usize"));
        }
    }
    log.push_back(entry);
    Ok(())
}

impl Wal {
    /// Whether a log exists in `dir` (its `wal/` directory).
    pub fn exists(dir: &Path) -> bool {
        dir.is_dir()
    }

    /// Creates a log in `dir` holding `entries` (consecutive), durably: written under `<dir>.tmp` and renamed, so a
    /// crash leaves either the old state or the whole new log. A log already in `dir` is replaced: it is renamed to
    /// `<dir>.old` first and deleted once the new one is in place ([`Wal::remove_replaced`] deletes one a crash
    /// left behind).
    pub fn create(dir: &Path, entries: &[Entry], segment_bytes: u64) -> Result<(), StoreError> {
        let parent = dir.parent().expect("the log's directory has a parent");
        let tmp = dir.with_extension("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(io_error("cannot remove", &tmp))?;
        }
        std::fs::create_dir_all(&tmp).map_err(io_error("cannot create", &tmp))?;
        let mut wal = Wal::start(&tmp, segment_bytes)?;
        if !entries.is_empty() {
            wal.append(entries)?;
        }
        drop(wal);
        let replaced = dir.exists();
        if replaced {
            Wal::remove_replaced(dir)?;
            let old = dir.with_extension("old");
            std::fs::rename(dir, &old).map_err(io_error("cannot move aside", dir))?;
        }
        std::fs::rename(&tmp, dir).map_err(io_error("cannot rename into place", dir))?;
        sync_dir(parent)?;
        if replaced {
            Wal::remove_replaced(dir)?;
        }
        Ok(())
    }

    /// Deletes `<dir>.old`, a log [`Wal::create`] replaced, if a crash left it behind.
    pub fn remove_replaced(dir: &Path) -> Result<(), StoreError> {
        let old = dir.with_extension("old");
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(io_error("cannot remove", &old))?;
            sync_dir(dir.parent().expect("the log's directory has a parent"))?;
        }
        Ok(())
    }

    /// A new log in the empty directory `dir`: one segment with a header that lets it start anywhere.
    fn start(dir: &Path, segment_bytes: u64) -> Result<Wal, StoreError> {
        let (active, active_bytes) = Wal::new_segment(dir, 0, 0, false)?;
        Ok(Wal {
            dir: dir.to_path_buf(),
            segments: vec![Segment { seq: 0, max_index: 0 }],
            leftovers: Vec::new(),
            active,
            active_bytes,
            segment_bytes,
            buf: Vec::new(),
        })
    }

    /// Writes segment `seq` with its header (under a temporary name, fsynced, renamed, directory fsynced) and
    /// opens it for appending.
    fn new_segment(dir: &Path, seq: u64, next_index: u64, reset: bool) -> Result<(File, u64), StoreError> {
        let path = dir.join(segment_name(seq));
        let tmp = dir.join(format!("{}.tmp", segment_name(seq)));
        let mut header = Vec::new();
        put_record(&mut header, KIND_HEADER, &header_payload(next_index, reset));
        let mut f = File::create(&tmp).map_err(io_error("cannot create", &tmp))?;
        f.write_all(&header).map_err(io_error("cannot write", &tmp))?;
        f.sync_all().map_err(io_error("cannot fsync", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io_error("cannot rename into place", &path))?;
        sync_dir(dir)?;
        let f = OpenOptions::new().append(true).open(&path).map_err(io_error("cannot open", &path))?;
        Ok((f, header.len() as u64))
    }

    /// Opens the log in `dir` and replays it: the entries it holds, consecutive. Cuts a torn last record of the
    /// active segment; reports anything else that does not read back as [`StoreError::Corrupt`], naming the file
    /// and offset.
    pub fn open(dir: &Path, segment_bytes: u64) -> Result<(Wal, VecDeque<Entry>), StoreError> {
        let mut seqs = Vec::new();
        for item in std::fs::read_dir(dir).map_err(io_error("cannot list", dir))? {
            let path = item.map_err(io_error("cannot list", dir))?.path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if name.ends_with(".tmp") {
                // A segment a crash left before it was renamed into place: it never held an entry.
                std::fs::remove_file(&path).map_err(io_error("cannot remove", &path))?;
                continue;
            }
            match name.strip_suffix(".wal").and_then(|s| s.parse::<u64>().ok()) {
                Some(seq) if name == segment_name(seq) => seqs.push(seq),
                _ => return Err(StoreError::Corrupt(format!("{}: not a log segment", path.display()))),
            }
        }
        seqs.sort_unstable();
        if seqs.is_empty() {
            return Ok((Wal::start(dir, segment_bytes)?, VecDeque::new()));
        }
        // Segments are deleted oldest first (compaction a prefix, a reset all but the newest), so segments before
        // a gap are ones whose deletion was cut short (a crash, or a compaction racing a reset): they are left
        // out, and deleted by the next compaction. Were a segment lost from the middle of the live log instead,
        // the log would begin after its snapshot, which `SledStore` reports as corruption, with nothing deleted.
        let after_gap = seqs.windows(2).rposition(|pair| pair[1] != pair[0] + 1).map_or(0, |i| i + 1);
        let leftovers: Vec<u64> = seqs.drain(..after_gap).collect();
        if !leftovers.is_empty() {
            tracing::warn!(dir = %dir.display(), ?leftovers, "raft log: segments before a gap left out (deleted once compacted)");
        }
        let mut log = VecDeque::new();
        let mut segments = Vec::with_capacity(seqs.len());
        let mut active_bytes = 0;
        for (i, &seq) in seqs.iter().enumerate() {
            let path = dir.join(segment_name(seq));
            let last = i + 1 == seqs.len();
            let bytes = std::fs::read(&path).map_err(io_error("cannot read", &path))?;
            let corrupt =
                |offset: usize, why: &str| StoreError::Corrupt(format!("{}, offset {offset}: {why}", path.display()));
            let mut offset = 0;
            let mut max_index = 0;
            loop {
                match read_record(&bytes, offset) {
                    Read::End => break,
                    Read::Bad { why, torn: true } if last && offset > 0 => {
                        // The write of this record never returned: cut it.
                        tracing::warn!(file = %path.display(), offset, why, "raft log: torn last record cut");
                        let f = OpenOptions::new().write(true).open(&path).map_err(io_error("cannot open", &path))?;
                        f.set_len(offset as u64).map_err(io_error("cannot truncate", &path))?;
                        f.sync_all().map_err(io_error("cannot fsync", &path))?;
                        break;
                    }
                    Read::Bad { why, .. } => return Err(corrupt(offset, &why)),
                    Read::Record { kind, payload, next } => {
                        match (kind, offset) {
                            (KIND_HEADER, 0) if payload.len() != 9 => {
                                return Err(corrupt(0, &format!("a header of {} bytes, not 9", payload.len())));
                            }
                            (KIND_HEADER, 0) => {
                                let next_index = u64::from_le_bytes(payload[..8].try_into().expect("8 bytes"));
                                if payload[8] != 0 {
                                    log.clear();
                                    // Nothing before a restart is in the log any more.
                                    supersede(&mut segments, 0);
                                } else if let Some(prev) = log.back().map(|e: &Entry| e.index)
                                    && next_index != 0
                                    && next_index != prev + 1
                                {
                                    return Err(corrupt(
                                        offset,
                                        &format!(
                                            "the segment starts at index {next_index}, the log before it ends at {prev}"
                                        ),
                                    ));
                                }
                            }
                            (_, 0) => return Err(corrupt(0, "the segment does not start with its header")),
                            (KIND_HEADER, _) => {
                                return Err(corrupt(offset, "a header record after the segment's start"));
                            }
                            (KIND_ENTRY, _) => {
                                let entry = Entry::parse_from_bytes(payload)
                                    .map_err(|e| corrupt(offset, &format!("cannot decode the entry: {e}")))?;
                                if entry.index == 0 {
                                    return Err(corrupt(offset, "an entry of index 0"));
                                }
                                if log.back().is_some_and(|e: &Entry| entry.index <= e.index) {
                                    supersede(&mut segments, entry.index);
                                    max_index = max_index.min(entry.index - 1);
                                }
                                max_index = max_index.max(entry.index);
                                replay_entry(&mut log, entry).map_err(|hole| corrupt(offset, &hole.to_string()))?;
                            }
                            (kind, _) => return Err(corrupt(offset, &format!("unknown record kind {kind}"))),
                        }
                        offset = next;
                    }
                }
            }
            if offset == 0 {
                // Segments are renamed into place with their header written and synced: an empty one is damage.
                return Err(corrupt(0, "an empty segment, without its header"));
            }
            if last {
                active_bytes = offset as u64;
            }
            segments.push(Segment { seq, max_index });
        }
        let path = dir.join(segment_name(segments.last().expect("segments").seq));
        let active = OpenOptions::new().append(true).open(&path).map_err(io_error("cannot open", &path))?;
        Ok((
            Wal { dir: dir.to_path_buf(), segments, leftovers, active, active_bytes, segment_bytes, buf: Vec::new() },
            log,
        ))
    }

    fn active_path(&self) -> PathBuf {
        self.dir.join(segment_name(self.segments.last().expect("segments").seq))
    }

    /// Appends `entries` (consecutive, non-empty; the first may replace earlier ones) and makes them durable: one
    /// write and one fdatasync. Starts a new segment afterwards if the active one is full.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), StoreError> {
        self.append_runs(&[entries])
    }

    /// Appends several runs of entries in order, each as [`Wal::append`] would (a run may replace the end of the
    /// ones before it), with one write and one fdatasync for all of them.
    pub fn append_runs(&mut self, runs: &[&[Entry]]) -> Result<(), StoreError> {
        self.buf.clear();
        for entry in runs.iter().flat_map(|run| run.iter()) {
            let payload = entry.write_to_bytes().map_err(|source| StoreError::Encode { what: "Entry", source })?;
            put_record(&mut self.buf, KIND_ENTRY, &payload);
        }
        let path = self.active_path();
        self.active.write_all(&self.buf).map_err(io_error("cannot write", &path))?;
        self.active.sync_data().map_err(io_error("cannot fdatasync", &path))?;
        self.active_bytes += self.buf.len() as u64;
        let mut last = 0;
        for run in runs.iter().filter(|run| !run.is_empty()) {
            last = run[run.len() - 1].index;
            supersede(&mut self.segments, run[0].index);
            let segment = self.segments.last_mut().expect("segments");
            segment.max_index = segment.max_index.max(last);
        }
        if self.active_bytes >= self.segment_bytes {
            self.rotate(last + 1, false)?;
        }
        Ok(())
    }

    /// Starts the next segment, continuing at `next_index`, or restarting the log there if `reset`.
    fn rotate(&mut self, next_index: u64, reset: bool) -> Result<(), StoreError> {
        let seq = self.segments.last().expect("segments").seq + 1;
        let (active, bytes) = Wal::new_segment(&self.dir, seq, next_index, reset)?;
        self.active = active;
        self.active_bytes = bytes;
        self.segments.push(Segment { seq, max_index: 0 });
        Ok(())
    }

    /// Drops every entry durably, the log continuing at `next_index` (an installed snapshot): a new segment whose
    /// header restarts the log, then the older segments are deleted (a crash before that leaves them, and the
    /// header still discards them).
    pub fn reset(&mut self, next_index: u64) -> Result<(), StoreError> {
        self.rotate(next_index, true)?;
        let mut old = std::mem::take(&mut self.leftovers);
        old.extend(self.segments.drain(..self.segments.len() - 1).map(|s| s.seq));
        remove_segments(&self.dir, &old)
    }

    /// Takes out of the log the oldest segments up to the first that holds an entry at or above `first_index`
    /// (never the active one), and any left out on open, for the caller to delete with [`remove_segments`] without
    /// holding the log. Entries below `first_index` in the
    /// segments that stay are still replayed on open: a valid prefix of the log.
    pub fn compactable(&mut self, first_index: u64) -> Vec<u64> {
        let keep_from = self.segments[..self.segments.len() - 1]
            .iter()
            .position(|s| s.max_index >= first_index)
            .unwrap_or(self.segments.len() - 1);
        let mut gone = std::mem::take(&mut self.leftovers);
        gone.extend(self.segments.drain(..keep_from).map(|s| s.seq));
        gone
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// Records that the log continues at `index`: what the segments hold from there on is superseded, so it does not
/// keep them from compaction.
fn supersede(segments: &mut [Segment], index: u64) {
    for s in segments {
        s.max_index = s.max_index.min(index.saturating_sub(1));
    }
}

/// Deletes segments `seqs` from `dir`, oldest first. Not synced: a segment a crash brings back holds entries a
/// snapshot covers, or ones a later header discards.
pub fn remove_segments(dir: &Path, seqs: &[u64]) -> Result<(), StoreError> {
    for &seq in seqs {
        let path = dir.join(segment_name(seq));
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_error("cannot remove log segment", &path)(e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ent(index: u64, term: u64) -> Entry {
        Entry { index, term, data: vec![index as u8; 40].into(), ..Default::default() }
    }

    fn ents(r: std::ops::RangeInclusive<u64>, term: u64) -> Vec<Entry> {
        r.map(|i| ent(i, term)).collect()
    }

    fn pairs(log: &VecDeque<Entry>) -> Vec<(u64, u64)> {
        log.iter().map(|e| (e.index, e.term)).collect()
    }

    #[test]
    fn replays_appends_with_conflicts_across_segments() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        Wal::create(&dir, &ents(1..=3, 1), 300).unwrap();
        let (mut wal, log) = Wal::open(&dir, 300).unwrap();
        assert_eq!(pairs(&log), vec![(1, 1), (2, 1), (3, 1)]);
        wal.append(&ents(4..=9, 1)).unwrap();
        wal.append(&ents(5..=6, 2)).unwrap();
        wal.append(&ents(7..=12, 2)).unwrap();
        assert!(wal.segment_count() > 2, "{}", wal.segment_count());
        drop(wal);
        let (wal, log) = Wal::open(&dir, 300).unwrap();
        let want: Vec<(u64, u64)> = (1..=12).map(|i| (i, if i < 5 { 1 } else { 2 })).collect();
        assert_eq!(pairs(&log), want);
        assert!(wal.segment_count() > 2);
    }

    #[test]
    fn compaction_keeps_every_segment_with_a_live_entry() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        Wal::create(&dir, &[], 200).unwrap();
        let (mut wal, _) = Wal::open(&dir, 200).unwrap();
        for i in 1..=40 {
            wal.append(&[ent(i, 1)]).unwrap();
        }
        let before = wal.segment_count();
        let gone = wal.compactable(30);
        remove_segments(&dir, &gone).unwrap();
        assert!(!gone.is_empty() && wal.segment_count() < before);
        drop(wal);
        let (wal, log) = Wal::open(&dir, 200).unwrap();
        assert!(log.front().unwrap().index <= 30 && log.back().unwrap().index == 40, "{:?}", pairs(&log));
        assert_eq!(wal.segment_count(), before - gone.len());
        // Compacting past everything keeps the active segment.
        let mut wal = wal;
        let gone = wal.compactable(1000);
        remove_segments(&dir, &gone).unwrap();
        assert_eq!(wal.segment_count(), 1);
    }

    #[test]
    fn a_reset_discards_older_segments_even_if_they_remain() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        Wal::create(&dir, &ents(1..=5, 1), 1 << 20).unwrap();
        let (mut wal, _) = Wal::open(&dir, 1 << 20).unwrap();
        // A reset whose deletion of the old segment did not happen (a crash): the header still restarts the log.
        wal.rotate(51, true).unwrap();
        wal.append(&ents(51..=52, 5)).unwrap();
        drop(wal);
        let (mut wal, log) = Wal::open(&dir, 1 << 20).unwrap();
        assert_eq!(pairs(&log), vec![(51, 5), (52, 5)]);
        wal.reset(100).unwrap();
        assert_eq!(wal.segment_count(), 1);
        drop(wal);
        let (_, log) = Wal::open(&dir, 1 << 20).unwrap();
        assert!(log.is_empty());
    }

    #[test]
    fn a_torn_last_record_is_cut_and_an_older_one_is_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        Wal::create(&dir, &ents(1..=4, 1), 1 << 20).unwrap();
        let seg = dir.join(segment_name(0));
        let len = std::fs::metadata(&seg).unwrap().len();
        // Half of the last record, as a crash during its write leaves it.
        let f = OpenOptions::new().write(true).open(&seg).unwrap();
        f.set_len(len - 20).unwrap();
        drop(f);
        let (mut wal, log) = Wal::open(&dir, 1 << 20).unwrap();
        assert_eq!(pairs(&log), vec![(1, 1), (2, 1), (3, 1)]);
        // The cut is durable and appends go on after it.
        wal.append(&ents(4..=5, 2)).unwrap();
        drop(wal);
        let (_, log) = Wal::open(&dir, 1 << 20).unwrap();
        assert_eq!(pairs(&log), vec![(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]);
        // A flipped bit in a record of the last segment with records after it is damage, not a torn write.
        {
            let (mut wal, _) = Wal::open(&dir, 1 << 20).unwrap();
            wal.append(&ents(6..=7, 2)).unwrap();
        }
        let good = std::fs::read(&seg).unwrap();
        let mut bytes = good.clone();
        bytes[30] ^= 0x01;
        std::fs::write(&seg, &bytes).unwrap();
        let err = Wal::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("checksum"), "{err}");
        // Zeros to the end of the file (a write cut short where the file had grown) are torn: cut.
        let mut bytes = good.clone();
        let cut_at = bytes.len() - 60;
        bytes[cut_at..].fill(0);
        std::fs::write(&seg, &bytes).unwrap();
        let (mut wal, log) = Wal::open(&dir, 1 << 20).unwrap();
        assert!(log.back().unwrap().index < 7, "{:?}", pairs(&log));
        assert_eq!(std::fs::metadata(&seg).unwrap().len() as usize, {
            // The cut lands on a record boundary at or before the zeros.
            let mut end = 0;
            while let Read::Record { next, .. } = read_record(&bytes, end) {
                end = next;
            }
            end
        });
        // A flipped bit in a segment that is no longer the last is not a torn write.
        wal.rotate(6, false).unwrap();
        wal.append(&ents(6..=6, 2)).unwrap();
        drop(wal);
        let mut bytes = std::fs::read(&seg).unwrap();
        let at = bytes.len() - 3;
        bytes[at] ^= 0x10;
        std::fs::write(&seg, &bytes).unwrap();
        let err = Wal::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(err.contains(&segment_name(0)) && err.contains("offset") && err.contains("checksum"), "{err}");
    }

    #[test]
    fn missing_segments_and_holes_are_corruption() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("wal");
        Wal::create(&dir, &[], 150).unwrap();
        let (mut wal, _) = Wal::open(&dir, 150).unwrap();
        for i in 1..=12 {
            wal.append(&[ent(i, 1)]).unwrap();
        }
        assert!(wal.segment_count() >= 3);
        drop(wal);
        // Segments before a gap are left out (a deletion cut short), and go with the next compaction.
        let (_, before) = Wal::open(&dir, 150).unwrap();
        std::fs::remove_file(dir.join(segment_name(1))).unwrap();
        let (mut wal, log) = Wal::open(&dir, 150).unwrap();
        assert!(log.front().unwrap().index > before.front().unwrap().index);
        assert_eq!(log.back().unwrap().index, 12);
        assert!(dir.join(segment_name(0)).exists());
        let gone = wal.compactable(1);
        assert_eq!(gone, vec![0]);

        // An empty segment (no header) is damage, not a log to append to (found by the fuzz target `raft_log`).
        let dir = tmp.path().join("empty");
        Wal::create(&dir, &ents(1..=2, 1), 1 << 20).unwrap();
        std::fs::write(dir.join(segment_name(0)), b"").unwrap();
        let err = Wal::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("an empty segment"), "{err}");

        let dir = tmp.path().join("holes");
        Wal::create(&dir, &ents(1..=2, 1), 1 << 20).unwrap();
        let (mut wal, _) = Wal::open(&dir, 1 << 20).unwrap();
        wal.append(&ents(5..=5, 1)).unwrap();
        drop(wal);
        let err = Wal::open(&dir, 1 << 20).unwrap_err().to_string();
        assert!(err.contains("entries 3 to 4 are missing") && err.contains("offset"), "{err}");
    }
}
