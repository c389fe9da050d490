//! Raft messages between coordinators over tonic: one sender task per peer drains a bounded queue into batches
//! sent on one long-lived `Raft.StepStream` call (no answer per batch, so batches follow each other without waiting;
//! raft tolerates lost messages, so a full queue or a stream that ends drops what it held, a new stream opens after
//! a short backoff, and the protocol retransmits); the server side checks each batch and hands it to the node.
//!
//! A test-only partition switch ([`Transport::set_blocked`], exposed over gRPC only when the node runs with
//! `--allow-fault-injection`) drops every message to and from the listed peers, which is how the partition tests cut a
//! node off without touching the network.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::prelude::{Message, MessageType};
use tessera_proto::v1;
use tessera_proto::v1::raft_client::RaftClient;
use tokio::sync::mpsc;
use tonic::transport::Channel;

/// Messages queued per peer before new ones are dropped.
const QUEUE: usize = 4096;
/// Messages per batch (one `StepStream` message) at most.
const BATCH: usize = 512;
/// Batches waiting for a peer's stream (beyond them the sender waits, and the per-peer queue fills up).
const STREAM_QUEUE: usize = 64;
/// Largest message a peer may send (snapshots travel as one message).
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024 * 1024;
/// How far beyond a member's own term a Raft message's term may be at first sight. Terms grow by one per election,
/// and pre-vote keeps a cut-off member from raising its own, so a real peer is rarely this far ahead; a forged term
/// of 10^12 would otherwise move the whole cluster to it at once, and one near 2^64 would leave no terms to elect in.
pub const MAX_TERM_STEP: u64 = 10_000;
/// How much further, per second, a peer that keeps sending a term beyond [`MAX_TERM_STEP`] is believed
/// ([`TermGuard`]): a member left far behind (a forged message pushed some members' terms ahead) catches up by
/// itself, 40,000 terms in 4 s, while exhausting the 2^64 terms would take some 58 million years.
pub const TERM_STEP_PER_SECOND: u64 = 10_000;
/// A peer insists on a term when its refused messages come less than this apart; a longer silence starts afresh.
pub const INSIST_GAP: Duration = Duration::from_secs(10);
/// Peers whose insistence a [`TermGuard`] tracks at most (members are few; the oldest is forgotten beyond this).
const INSISTING_PEERS: usize = 64;

/// Which terms beyond its own a member believes, per peer: up to [`MAX_TERM_STEP`] ahead at once, and
/// [`TERM_STEP_PER_SECOND`] more for each second a peer has kept sending a term beyond that. Nothing of it is
/// persisted, so no message can leave a member refusing its peers for good: a legitimate leader, or a quorum that
/// moved on, is always believed within (gap - [`MAX_TERM_STEP`]) / [`TERM_STEP_PER_SECOND`] seconds.
#[derive(Debug, Default)]
pub struct TermGuard {
    /// Per peer: when it started insisting, and its last refused message.
    insisting: Mutex<HashMap<u64, (Instant, Instant)>>,
}

impl TermGuard {
    /// Whether a batch from `peer` carrying `term` (its highest) may be stepped by a member at `own_term`, at `now`;
    /// `Err` carries how far ahead the peer is believed at the moment.
    pub fn admit(&self, peer: u64, term: u64, own_term: u64, now: Instant) -> Result<(), u64> {
        let mut insisting = self.insisting.lock().expect("term guard lock");
        if term <= own_term.saturating_add(MAX_TERM_STEP) {
            insisting.remove(&peer);
            return Ok(());
        }
        if !insisting.contains_key(&peer)
            && insisting.len() >= INSISTING_PEERS
            && let Some(oldest) = insisting.iter().min_by_key(|(_, (_, last))| *last).map(|(p, _)| *p)
        {
            insisting.remove(&oldest);
        }
        let (since, last) = insisting.entry(peer).or_insert((now, now));
        if now.saturating_duration_since(*last) > INSIST_GAP {
            *since = now;
        }
        *last = now;
        let seconds = now.saturating_duration_since(*since).as_secs();
        let allowance = MAX_TERM_STEP.saturating_add(TERM_STEP_PER_SECOND.saturating_mul(seconds));
        if term <= own_term.saturating_add(allowance) {
            insisting.remove(&peer);
            Ok(())
        } else {
            Err(allowance)
        }
    }
}

struct Peer {
    address: String,
    queue: mpsc::Sender<Message>,
}

/// The sending side of the Raft transport, shared by the node thread and the gRPC server.
#[derive(Clone)]
pub struct Transport {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    own_address: String,
    tls: Option<tessera_auth::TlsFiles>,
    runtime: tokio::runtime::Handle,
    peers: Mutex<BTreeMap<u64, Peer>>,
    blocked: RwLock<BTreeSet<u64>>,
}

impl Transport {
    /// A transport for node `id` listening on `own_address`; sender tasks run on `runtime`. With `tls`, each peer
    /// `j` is reached over mutual TLS and must present the certificate of `node-<j>`.
    pub fn new(
        id: u64,
        own_address: String,
        runtime: tokio::runtime::Handle,
        tls: Option<tessera_auth::TlsFiles>,
    ) -> Transport {
        Transport {
            inner: Arc::new(Inner {
                id,
                own_address,
                tls,
                runtime,
                peers: Mutex::new(BTreeMap::new()),
                blocked: RwLock::new(BTreeSet::new()),
            }),
        }
    }

    /// Records (or changes) a peer's address; the next message to it goes there.
    pub fn set_address(&self, id: u64, address: &str) {
        if id == self.inner.id || address.is_empty() {
            return;
        }
        let mut peers = self.inner.peers.lock().expect("peers lock");
        if peers.get(&id).is_some_and(|p| p.address == address) {
            return;
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        let endpoint = format!("http://{address}");
        let inner = Arc::clone(&self.inner);
        self.inner.runtime.spawn(send_loop(inner, id, endpoint, rx));
        peers.insert(id, Peer { address: address.to_string(), queue: tx });
    }

    /// Opens new connections to every peer (after this node's certificates were reloaded, so peers see the new
    /// one); what was queued on the old ones is dropped, and Raft sends it again.
    pub fn renew_channels(&self) {
        let mut peers = self.inner.peers.lock().expect("peers lock");
        for (id, peer) in peers.iter_mut() {
            let (tx, rx) = mpsc::channel(QUEUE);
            let endpoint = format!("http://{}", peer.address);
            self.inner.runtime.spawn(send_loop(Arc::clone(&self.inner), *id, endpoint, rx));
            peer.queue = tx;
        }
    }

    /// Forgets a peer (removed from the cluster); its sender task ends.
    pub fn remove(&self, id: u64) {
        self.inner.peers.lock().expect("peers lock").remove(&id);
    }

    /// The known peer addresses.
    pub fn addresses(&self) -> BTreeMap<u64, String> {
        self.inner.peers.lock().expect("peers lock").iter().map(|(k, p)| (*k, p.address.clone())).collect()
    }

    /// This node's address as peers know it.
    pub fn own_address(&self) -> &str {
        &self.inner.own_address
    }

    /// Queues messages for their peers; returns the ids of peers whose queue was full or who are unknown.
    pub fn send(&self, messages: Vec<Message>) -> Vec<u64> {
        let mut unreachable = Vec::new();
        let blocked = self.inner.blocked.read().expect("blocked lock").clone();
        let peers = self.inner.peers.lock().expect("peers lock");
        for m in messages {
            if blocked.contains(&m.to) {
                continue;
            }
            match peers.get(&m.to) {
                Some(p) => {
                    let to = m.to;
                    if p.queue.try_send(m).is_err() {
                        unreachable.push(to);
                    }
                }
                None => unreachable.push(m.to),
            }
        }
        unreachable
    }

    /// Test hook: drop every message to and from these peers (empty: heal).
    pub fn set_blocked(&self, peers: BTreeSet<u64>) {
        *self.inner.blocked.write().expect("blocked lock") = peers;
    }

    /// Whether messages from `peer` are dropped.
    pub fn is_blocked(&self, peer: u64) -> bool {
        self.inner.blocked.read().expect("blocked lock").contains(&peer)
    }

    /// The highest term among `messages` (0 for none).
    pub fn highest_term(messages: &[Message]) -> u64 {
        messages.iter().map(|m| m.term).max().unwrap_or(0)
    }

    /// Removes forwarded proposals (the entries of `MsgPropose` messages) whose proposer's deadline has passed by
    /// `now_ms`, and the messages left empty; returns how many proposals were dropped. A follower forwards a
    /// client's write to the leader as such a message; if it arrives after the proposer gave up (it sat in a stalled
    /// connection until a partition healed), appending it would apply an old write after newer acknowledged ones.
    pub fn drop_expired_proposals(messages: &mut Vec<Message>, now_ms: u64) -> usize {
        let mut dropped = 0;
        for m in messages.iter_mut().filter(|m| m.get_msg_type() == MessageType::MsgPropose) {
            let before = m.entries.len();
            m.entries.retain(|e| !proposal_expired(&e.data, now_ms));
            dropped += before - m.entries.len();
        }
        messages.retain(|m| m.get_msg_type() != MessageType::MsgPropose || !m.entries.is_empty());
        dropped
    }

    /// Decodes a batch received from a peer.
    pub fn decode(batch: &v1::RaftBatch) -> Result<Vec<Message>, BadMessage> {
        batch
            .messages
            .iter()
            .enumerate()
            .map(|(index, b)| Message::parse_from_bytes(b).map_err(|e| BadMessage { index, problem: e.to_string() }))
            .collect()
    }
}

/// A message of a peer's batch that does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("messages[{index}]: {problem}")]
pub struct BadMessage {
    /// Its position in the batch.
    pub index: usize,
    /// Why it does not decode.
    pub problem: String,
}

async fn send_loop(inner: Arc<Inner>, peer: u64, endpoint: String, mut rx: mpsc::Receiver<Message>) {
    let server_name = format!("node-{peer}");
    let tls = inner.tls.as_ref().map(|f| (f, server_name.as_str()));
    // No deadline per call: the stream lives as long as the connection, and the channel's keepalive closes a dead
    // one (`crate::net`).
    let channel: Channel = match crate::net::channel(&endpoint, Duration::from_secs(1), None, tls) {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(peer, %endpoint, error = %e, "bad peer address");
            return;
        }
    };
    let client = RaftClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut stream: Option<Stream> = None;
    let mut failures = 0u32;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        let messages = batch.iter().filter_map(|m| m.write_to_bytes().ok()).collect();
        // `from_address` stays empty: no receiver reads it (a peer's address is configuration's or membership's).
        let req = v1::RaftBatch { from: inner.id, from_address: String::new(), messages };
        let open = match stream.take() {
            Some(s) if !s.batches.is_closed() => s,
            ended => {
                if let Some(s) = ended {
                    // The stream ended (the peer refused a batch, restarted, or the connection died): what it
                    // carried may be lost, and raft sends it again. Back off a little if streams keep failing.
                    failures = if s.opened.elapsed() > Duration::from_secs(1) { 1 } else { failures + 1 };
                    if failures == 1 || failures.is_power_of_two() {
                        tracing::debug!(peer, failures, "raft stream to the peer ended; reopening");
                    }
                    while rx.try_recv().is_ok() {}
                    tokio::time::sleep(Duration::from_millis(20 * u64::from(failures.min(10)))).await;
                }
                Stream::open(&client)
            }
        };
        // A send into a stream that already ended is lost like any other; the next batch then backs off and
        // reopens (above).
        let _ = open.batches.send(req).await;
        stream = Some(open);
    }
}

/// One open `StepStream` call to a peer: batches go into `batches`; the call ends (and `batches` closes) when the
/// peer refuses one or the connection dies.
struct Stream {
    batches: mpsc::Sender<v1::RaftBatch>,
    opened: std::time::Instant,
}

impl Stream {
    fn open(client: &RaftClient<Channel>) -> Stream {
        let (batches, outgoing) = mpsc::channel(STREAM_QUEUE);
        let mut client = client.clone();
        tokio::spawn(async move {
            if let Err(status) = client.step_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing)).await {
                tracing::trace!(code = ?status.code(), message = status.message(), "raft stream ended");
            }
        });
        Stream { batches, opened: std::time::Instant::now() }
    }
}

/// Whether a proposal's data carries a deadline before `now_ms` (undecodable data is left for the state machine,
/// which skips it).
fn proposal_expired(data: &[u8], now_ms: u64) -> bool {
    #[derive(serde::Deserialize)]
    struct Deadline {
        #[serde(default)]
        deadline_ms: Option<u64>,
    }
    serde_json::from_slice::<Deadline>(data).ok().and_then(|d| d.deadline_ms).is_some_and(|d| d < now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Op, Proposal};
    use raft::prelude::Entry;

    fn propose(deadlines: &[Option<u64>]) -> Message {
        let mut m = Message::default();
        m.set_msg_type(MessageType::MsgPropose);
        for d in deadlines {
            let p = Proposal {
                origin: 2,
                request: 1,
                op: Op::Clock { now_ms: 1 },
                deadline_ms: *d,
                client_request: None,
                audit: None,
            };
            m.entries.push(Entry { data: serde_json::to_vec(&p).unwrap().into(), ..Default::default() });
        }
        m
    }

    #[test]
    fn late_forwarded_proposals_are_dropped_and_everything_else_passes() {
        let mut heartbeat = Message::default();
        heartbeat.set_msg_type(MessageType::MsgHeartbeat);
        let mut messages =
            vec![propose(&[Some(900), Some(1_100), None]), propose(&[Some(999)]), heartbeat, propose(&[Some(1_000)])];
        assert_eq!(Transport::drop_expired_proposals(&mut messages, 1_000), 2);
        assert_eq!(messages.len(), 3, "the message left empty goes, the heartbeat stays");
        assert_eq!(messages[0].entries.len(), 2);
        assert_eq!(messages[1].get_msg_type(), MessageType::MsgHeartbeat);
        assert_eq!(messages[2].entries.len(), 1, "a deadline not yet passed is kept");
    }

    #[test]
    fn terms_far_ahead_are_refused_until_their_peer_has_insisted_long_enough() {
        let at = |term: u64| Message { term, ..Default::default() };
        assert_eq!(Transport::highest_term(&[at(8), at(1_000_000_000_000), at(9)]), 1_000_000_000_000);
        let guard = TermGuard::default();
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        assert_eq!(guard.admit(2, 7 + MAX_TERM_STEP, 7, t0), Ok(()));
        assert_eq!(guard.admit(2, 1_000_000_000_000, 7, t0), Err(MAX_TERM_STEP), "a forged term, at once");
        // A member 45,000 terms behind its peers believes them once they have insisted for 4 s...
        let ahead = 7 + 45_000;
        assert!(guard.admit(3, ahead, 7, t0).is_err());
        assert!(guard.admit(3, ahead, 7, s(2)).is_err());
        assert_eq!(guard.admit(3, ahead, 7, s(4)), Ok(()));
        // ... counted from when they started, unless they fell silent in between.
        assert!(guard.admit(3, ahead + 40_000, ahead, s(5)).is_err());
        assert!(guard.admit(3, ahead + 40_000, ahead, s(5) + INSIST_GAP + Duration::from_secs(1)).is_err());
        // A term in bounds clears a peer's insistence; the other peer's runs on.
        assert_eq!(guard.admit(2, 8, 7, s(6)), Ok(()));
        assert_eq!(guard.admit(2, 1_000_000_000_000, 7, s(7)), Err(MAX_TERM_STEP));
        // No overflow at the top of the range.
        assert_eq!(guard.admit(4, u64::MAX, u64::MAX - 1, t0), Ok(()));
        assert!(guard.admit(5, u64::MAX, 0, s(1_000_000)).is_err());
    }
}
