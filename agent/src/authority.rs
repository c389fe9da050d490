//! Who may push this agent layouts: the coordinators' leader, at its term, with a plan epoch the cluster committed.
//!
//! Mutual TLS says a push comes from *a* coordinator member; it does not say that member leads, nor that the epoch it
//! claims is real. An epoch far in the future freezes a node (every later push is refused as stale), so the agent
//! checks each push against what the coordinators told it in their own answers to its register and heartbeat calls
//! ([`Leadership`]), never against what the push claims:
//!
//! - the push's Raft term is the known leader's term;
//! - the pusher is the known leader (with mutual TLS, its certificate says which member it is);
//! - its epoch is one the cluster committed: at most the newest committed plan epoch (the leader commits a plan
//!   before it pushes it).
//!
//! Nothing is taken on the push's word: a member that claims a newer term or a newer epoch is believed only once
//! the coordinators say so. Knowledge can lag (a new election, a plan committed since the last heartbeat), so before
//! refusing, the agent asks the coordinators again (a heartbeat at once, [`Authority::refresh`], which a follower
//! forwards to the leader) and checks once more; a refused push from the real leader is sent again by its retry. An
//! agent with a coordinator client that has not heard from the coordinators yet (not registered) takes no push from
//! a member (with mutual TLS; without it, anyone may push anything anyway). The
//! latest answer replaces the previous one, so a bad answer lasts only until the next. An agent without a
//! coordinator client (one that replay drives directly) has nothing to check against and takes any newer epoch from
//! a permitted caller.
//!
//! **A majority, not one member.** A heartbeat goes to one member at a time, and a member's certificate (a
//! compromised member) answering it could name itself the leader at a made-up term and epoch. So an agent with mutual
//! TLS and two or more coordinator addresses ([`Authority::with_quorum`]) believes only what a majority of them say:
//! each answers [`v1::Leadership`] for itself (`GetLeadership`, never forwarded), a leader and term count once a
//! majority of the addresses name them, and the committed epoch is the one that many of them reached (the majority's
//! lowest, so at least one honest member has committed it). A single lying member then moves nothing; give the agent
//! every member's address.
//!
//! The same answers carry the cluster's revocation list ([`Revocations`]) when the agent's copy is not current: a
//! revoked certificate (a retired member's, say) fails its TLS handshake with the agent and is refused on a
//! connection opened before, as it is by the coordinators. An agent that has not heard the list yet (just started)
//! takes no member's push anyway.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, RwLock};
use std::time::Duration;

use tessera_proto::v1;
use tokio::sync::{mpsc, oneshot};

/// What the coordinators last said about who leads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Leadership {
    /// The leader's member id (0: none known).
    pub leader_id: u64,
    /// Its Raft term.
    pub term: u64,
    /// The newest committed plan epoch.
    pub plan_epoch: u64,
}

impl From<&v1::Leadership> for Leadership {
    fn from(l: &v1::Leadership) -> Leadership {
        Leadership { leader_id: l.leader_id, term: l.term, plan_epoch: l.plan_epoch }
    }
}

/// Why a push was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// From an older term than the known leader's.
    #[error("a push at term {term}, but member {leader} leads term {known}")]
    StaleTerm {
        /// The push's term.
        term: u64,
        /// The known term.
        known: u64,
        /// The known leader.
        leader: u64,
    },
    /// Beyond the term the coordinators name.
    #[error("a push at term {term}, beyond the known term {known}")]
    TermTooFar {
        /// The push's term.
        term: u64,
        /// The known term.
        known: u64,
    },
    /// From a member that does not lead the term.
    #[error("member {pusher} pushed at term {term}, which member {leader} leads")]
    NotLeader {
        /// Who pushed.
        pusher: u64,
        /// The term.
        term: u64,
        /// Who leads it.
        leader: u64,
    },
    /// An epoch beyond the committed one.
    #[error("epoch {epoch} is beyond the newest committed plan epoch {committed}")]
    EpochTooFar {
        /// The push's epoch.
        epoch: u64,
        /// The newest committed epoch known.
        committed: u64,
    },
    /// The coordinators have not said who leads yet (the agent has not registered).
    #[error("the coordinators have not said who leads yet (this agent has not registered)")]
    Unregistered,
    /// No majority of the coordinators named the same leader and term.
    #[error("no majority of the {members} coordinators named the same leader and term")]
    NoQuorum {
        /// The coordinators asked.
        members: usize,
    },
}

impl Refusal {
    /// The rule's name, for metrics: `stale_term`, `term_too_far`, `not_leader`, `epoch_too_far`,
    /// `unregistered` or `no_quorum`.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::StaleTerm { .. } => "stale_term",
            Refusal::TermTooFar { .. } => "term_too_far",
            Refusal::NotLeader { .. } => "not_leader",
            Refusal::EpochTooFar { .. } => "epoch_too_far",
            Refusal::Unregistered => "unregistered",
            Refusal::NoQuorum { .. } => "no_quorum",
        }
    }
}

/// Most serials a revocation list may name (the coordinators keep at most 10,000).
pub const MAX_REVOKED: usize = 10_000;
/// Longest serial number, in hex digits (X.509 serials are at most 20 bytes).
pub const MAX_SERIAL_HEX: usize = 64;

/// The cluster's revocation list, as the coordinators last sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revocations {
    /// The Raft index of its newest revocation (0: nothing revoked, or no list heard).
    pub index: u64,
    /// The revoked serials, lowercase hex.
    pub serials: HashSet<String>,
}

/// A revocation list the agent would not take (it keeps the one it has).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadRevocations {
    /// More serials than [`MAX_REVOKED`].
    #[error("the revocation list names {0} serials, beyond {MAX_REVOKED}")]
    TooMany(usize),
    /// A serial that is not 1 to [`MAX_SERIAL_HEX`] hex digits.
    #[error("the revocation list's serial {0:?} is not 1 to {MAX_SERIAL_HEX} hex digits")]
    Serial(String),
}

impl Revocations {
    /// The list a coordinator sent, checked for size and form; serials are kept as [`tessera_auth`] writes them.
    pub fn from_wire(list: &v1::RevocationList) -> Result<Revocations, BadRevocations> {
        if list.serials.len() > MAX_REVOKED {
            return Err(BadRevocations::TooMany(list.serials.len()));
        }
        let serials = list
            .serials
            .iter()
            .map(|s| {
                let ok = !s.is_empty() && s.len() <= MAX_SERIAL_HEX && s.bytes().all(|b| b.is_ascii_hexdigit());
                if ok { Ok(s.to_ascii_lowercase()) } else { Err(BadRevocations::Serial(s.chars().take(80).collect())) }
            })
            .collect::<Result<HashSet<_>, _>>()?;
        Ok(Revocations { index: list.index, serials })
    }
}

/// The agent's knowledge of who leads, and a way to refresh it.
#[derive(Debug)]
pub struct Authority {
    known: Mutex<Option<Leadership>>,
    revoked: RwLock<Revocations>,
    /// With [`Authority::with_quorum`]: how many coordinators were asked, and whether one has answered a register
    /// or heartbeat call yet.
    quorum: Option<(usize, AtomicBool)>,
    refresh: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
    refresh_timeout: Duration,
}

/// The coordinator client's end of [`Authority::refresh`]: each request asks it to call the coordinators at once
/// and to answer once a call that started after the request has returned.
pub type RefreshRequests = mpsc::UnboundedReceiver<oneshot::Sender<()>>;

impl Authority {
    /// An agent with no coordinator client: pushes are checked for the caller's role only.
    pub fn standalone() -> Authority {
        Authority {
            known: Mutex::new(None),
            revoked: RwLock::default(),
            quorum: None,
            refresh: None,
            refresh_timeout: Duration::ZERO,
        }
    }

    /// An agent whose coordinator client learns who leads ([`Authority::learn`]) and serves the returned refresh
    /// requests, waiting at most `refresh_timeout` for one.
    pub fn with_client(refresh_timeout: Duration) -> (Authority, RefreshRequests) {
        let (tx, rx) = mpsc::unbounded_channel();
        let authority = Authority {
            known: Mutex::new(None),
            revoked: RwLock::default(),
            quorum: None,
            refresh: Some(tx),
            refresh_timeout,
        };
        (authority, rx)
    }

    /// Believes who leads only when a majority of `members` coordinators say so ([`Authority::confirm`]): a
    /// register or heartbeat answer then only says the agent was heard (see "A majority, not one member" in the
    /// module documentation). One member is its own majority.
    pub fn with_quorum(mut self, members: usize) -> Authority {
        self.quorum = Some((members.max(1), AtomicBool::new(false)));
        self
    }

    /// How many coordinators [`Authority::confirm`] counts answers from (`None`: one answer is believed).
    pub fn quorum_of(&self) -> Option<usize> {
        self.quorum.as_ref().map(|(n, _)| *n)
    }

    /// Takes the answers the coordinators gave to `GetLeadership` (one per member that answered): if a majority of
    /// the members name the same leader and term, that is who leads, with the epoch that majority has reached.
    /// Returns what it believes now.
    pub fn confirm(&self, answers: &[Leadership]) -> Option<Leadership> {
        let Some((members, _)) = &self.quorum else { return self.known() };
        let majority = members / 2 + 1;
        let agreed = answers.iter().filter(|a| a.leader_id != 0 && a.term != 0).find_map(|a| {
            let mut epochs: Vec<u64> = answers
                .iter()
                .filter(|b| (b.leader_id, b.term) == (a.leader_id, a.term))
                .map(|b| b.plan_epoch)
                .collect();
            (epochs.len() >= majority).then(|| {
                epochs.sort_unstable_by(|x, y| y.cmp(x));
                Leadership { plan_epoch: epochs[majority - 1], ..*a }
            })
        });
        let mut known = self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if agreed.is_some() {
            *known = agreed;
        }
        *known
    }

    /// Records the coordinators' latest answer to a register or heartbeat call (with a quorum, only that they heard
    /// the agent: who leads comes from [`Authority::confirm`]).
    pub fn learn(&self, leadership: Leadership) {
        match &self.quorum {
            Some((_, heard)) => heard.store(true, Ordering::SeqCst),
            None => *self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(leadership),
        }
    }

    /// Records the revocation list the coordinators sent (an answer without one means the copy held is current).
    /// A list beyond the bounds is refused, and the one held kept.
    pub fn learn_revocations(&self, list: &v1::RevocationList) -> Result<(), BadRevocations> {
        let list = Revocations::from_wire(list)?;
        let mut held = self.revoked.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *held != list {
            tracing::info!(index = list.index, revoked = list.serials.len(), "learned the revocation list");
            *held = list;
        }
        Ok(())
    }

    /// The index of the revocation list held (0: none), which heartbeats send so that the list comes only when it
    /// changed.
    pub fn revocations_index(&self) -> u64 {
        self.revoked.read().unwrap_or_else(std::sync::PoisonError::into_inner).index
    }

    /// Whether the certificate with serial `serial` (lowercase hex, as [`tessera_auth::Identity`] has it) is revoked.
    pub fn is_revoked(&self, serial: &str) -> bool {
        self.revoked.read().unwrap_or_else(std::sync::PoisonError::into_inner).serials.contains(serial)
    }

    /// What the coordinators last said.
    pub fn known(&self) -> Option<Leadership> {
        *self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks a push at `term` and `epoch` from member `pusher` (`None`: no certificate says which, as without TLS)
    /// against what is known now.
    pub fn check_known(&self, pusher: Option<u64>, term: u64, epoch: u64) -> Result<(), Refusal> {
        if let (Some((members, heard)), Some(_)) = (&self.quorum, pusher) {
            if !heard.load(Ordering::SeqCst) {
                return Err(Refusal::Unregistered);
            }
            return match self.known() {
                None => Err(Refusal::NoQuorum { members: *members }),
                Some(known) => check(known, pusher, term, epoch),
            };
        }
        match self.known() {
            // Nothing to check against yet: a member (with mutual TLS) waits until the coordinators have answered;
            // without TLS anyone may push anything anyway, and a standalone agent has nobody to ask.
            None if self.refresh.is_some() && pusher.is_some() => Err(Refusal::Unregistered),
            None => Ok(()),
            Some(known) => check(known, pusher, term, epoch),
        }
    }

    /// Checks a push; if what is known refuses it, asks the coordinators again first, and checks once more. With a
    /// quorum, a refusal that the followers' catching up may lift (an epoch the leader committed a moment ago, a
    /// majority not yet agreed after an election) is asked about a few times more, within the refresh timeout.
    pub async fn check(&self, pusher: Option<u64>, term: u64, epoch: u64) -> Result<(), Refusal> {
        let mut outcome = self.check_known(pusher, term, epoch);
        let started = tokio::time::Instant::now();
        for attempt in 0u32..5 {
            if outcome.is_ok() {
                break;
            }
            if attempt > 0 {
                let may_lift = matches!(outcome, Err(Refusal::EpochTooFar { .. } | Refusal::NoQuorum { .. }));
                if self.quorum.is_none() || !may_lift || started.elapsed() >= self.refresh_timeout {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20) * attempt).await;
            }
            self.refresh().await;
            outcome = self.check_known(pusher, term, epoch);
        }
        outcome
    }

    /// Asks the coordinator client to call the coordinators now and waits (bounded) for its answer.
    pub async fn refresh(&self) {
        let Some(tx) = &self.refresh else { return };
        let (done, wait) = oneshot::channel();
        if tx.send(done).is_ok() {
            let _ = tokio::time::timeout(self.refresh_timeout, wait).await;
        }
    }
}

/// The rules of the [module documentation](self) for one push against `known`.
pub fn check(known: Leadership, pusher: Option<u64>, term: u64, epoch: u64) -> Result<(), Refusal> {
    if known.term == 0 || known.leader_id == 0 {
        // An answer given during an election names no leader: no member's push is believed until one does.
        if pusher.is_some() {
            return Err(Refusal::Unregistered);
        }
    } else {
        if term < known.term {
            return Err(Refusal::StaleTerm { term, known: known.term, leader: known.leader_id });
        }
        if term > known.term {
            return Err(Refusal::TermTooFar { term, known: known.term });
        }
        if let Some(pusher) = pusher
            && pusher != known.leader_id
        {
            return Err(Refusal::NotLeader { pusher, term, leader: known.leader_id });
        }
    }
    if epoch > known.plan_epoch {
        return Err(Refusal::EpochTooFar { epoch, committed: known.plan_epoch });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: Leadership = Leadership { leader_id: 2, term: 5, plan_epoch: 100 };

    #[test]
    fn the_known_leader_at_its_term_with_a_committed_epoch_is_accepted() {
        assert_eq!(check(KNOWN, Some(2), 5, 100), Ok(()));
        assert_eq!(check(KNOWN, Some(2), 5, 90), Ok(()), "an older plan (stale, and refused as such later)");
        assert_eq!(check(KNOWN, None, 5, 90), Ok(()), "without TLS nobody says who pushed");
    }

    #[test]
    fn nothing_is_taken_on_the_pushs_word() {
        assert!(matches!(check(KNOWN, Some(2), 4, 100), Err(Refusal::StaleTerm { known: 5, .. })));
        assert!(matches!(check(KNOWN, Some(3), 5, 100), Err(Refusal::NotLeader { pusher: 3, leader: 2, .. })));
        // A member claiming the next term, with an epoch the cluster has not committed: both refused (this push
        // once wiped a GPU and froze the node until the committed epoch caught up).
        assert!(matches!(check(KNOWN, Some(3), 6, 100), Err(Refusal::TermTooFar { known: 5, .. })));
        assert!(matches!(check(KNOWN, Some(2), 5, 101), Err(Refusal::EpochTooFar { committed: 100, .. })));
        assert!(matches!(check(KNOWN, Some(2), 5, 1 << 63), Err(Refusal::EpochTooFar { committed: 100, .. })));
        assert!(check(KNOWN, Some(2), u64::MAX, u64::MAX).is_err(), "no overflow");
        let no_leader = Leadership { leader_id: 0, ..KNOWN };
        assert_eq!(check(no_leader, Some(9), 5, 100), Err(Refusal::Unregistered));
    }

    #[tokio::test]
    async fn a_refused_push_is_checked_again_after_asking_the_coordinators() {
        let (authority, mut requests) = Authority::with_client(Duration::from_secs(5));
        authority.learn(KNOWN);
        let authority = std::sync::Arc::new(authority);
        // The coordinator client: a fresh answer says member 3 leads term 6 with epoch 300 committed.
        let client = {
            let authority = authority.clone();
            tokio::spawn(async move {
                let done = requests.recv().await.unwrap();
                authority.learn(Leadership { leader_id: 3, term: 6, plan_epoch: 300 });
                done.send(()).unwrap();
            })
        };
        assert_eq!(authority.check(Some(3), 6, 300).await, Ok(()));
        client.await.unwrap();
        assert!(authority.check(Some(2), 5, 200).await.is_err(), "the old leader now is stale");
        assert_eq!(Authority::standalone().check(Some(1), 1, 1 << 63).await, Ok(()));
        // An agent with a client that has heard nothing yet takes nothing (after asking, with nobody answering).
        let (unheard, _requests) = Authority::with_client(Duration::from_millis(10));
        assert!(!unheard.is_revoked("1a") && unheard.revocations_index() == 0);
        assert_eq!(unheard.check(Some(1), 1, 1).await, Err(Refusal::Unregistered));
        assert_eq!(unheard.check(None, 1, 1).await, Ok(()), "without TLS nobody is checked");
    }

    #[test]
    fn with_a_quorum_one_member_cannot_say_who_leads() {
        let (authority, _requests) = Authority::with_client(Duration::from_millis(10));
        let authority = authority.with_quorum(3);
        let honest = Leadership { leader_id: 1, term: 5, plan_epoch: 10 };
        let liar = Leadership { leader_id: 3, term: 99, plan_epoch: 1 << 40 };
        // Nothing before a register or heartbeat answer; a lying answer to one says only that the agent was heard.
        assert_eq!(authority.check_known(Some(3), 99, 1), Err(Refusal::Unregistered));
        authority.learn(liar);
        assert_eq!(authority.check_known(Some(3), 99, 1), Err(Refusal::NoQuorum { members: 3 }));
        // The liar alone, or with one honest member: no majority names it.
        assert_eq!(authority.confirm(&[liar]), None);
        assert_eq!(authority.confirm(&[liar, honest]), None);
        // Two honest members out of three: their leader, at the lower of their epochs (a follower lags).
        let lagging = Leadership { plan_epoch: 9, ..honest };
        assert_eq!(authority.confirm(&[liar, honest, lagging]), Some(lagging));
        assert!(matches!(authority.check_known(Some(1), 5, 10), Err(Refusal::EpochTooFar { committed: 9, .. })));
        assert_eq!(authority.confirm(&[honest, liar, honest]), Some(honest));
        assert_eq!(authority.check_known(Some(1), 5, 10), Ok(()));
        assert!(matches!(authority.check_known(Some(3), 99, 1 << 40), Err(Refusal::TermTooFar { .. })));
        // The liar agreeing on the leader cannot raise the epoch beyond what an honest member reached.
        let inflated = Leadership { plan_epoch: 1 << 40, ..honest };
        assert_eq!(authority.confirm(&[inflated, honest, lagging]), Some(honest));
        // No majority now (an election): what was believed stays.
        assert_eq!(authority.confirm(&[liar, Leadership { leader_id: 0, term: 6, plan_epoch: 10 }]), Some(honest));
        // One member is its own majority.
        let single = Authority::standalone().with_quorum(1);
        assert_eq!(single.confirm(&[honest]), Some(honest));
    }

    #[tokio::test]
    async fn with_a_quorum_a_refusal_the_followers_may_lift_is_asked_again() {
        let (authority, mut requests) = Authority::with_client(Duration::from_secs(5));
        let authority = std::sync::Arc::new(authority.with_quorum(3));
        authority.learn(Leadership::default());
        let honest = Leadership { leader_id: 1, term: 5, plan_epoch: 10 };
        // The followers reach epoch 10 on the third asking.
        let client = {
            let authority = authority.clone();
            tokio::spawn(async move {
                for epoch in [8, 9, 10] {
                    let done = requests.recv().await.unwrap();
                    let lagging = Leadership { plan_epoch: epoch, ..honest };
                    authority.confirm(&[honest, lagging, lagging]);
                    done.send(()).unwrap();
                }
            })
        };
        assert_eq!(authority.check(Some(1), 5, 10).await, Ok(()));
        client.await.unwrap();
    }

    #[test]
    fn the_revocation_list_is_replaced_by_each_one_sent_and_bounded() {
        let authority = Authority::standalone();
        let list = |index, serials: &[&str]| v1::RevocationList {
            index,
            serials: serials.iter().map(|s| s.to_string()).collect(),
        };
        authority.learn_revocations(&list(7, &["1A", "2b"])).unwrap();
        assert!(authority.is_revoked("1a") && authority.is_revoked("2b") && !authority.is_revoked("3c"));
        assert_eq!(authority.revocations_index(), 7);
        // A malformed or oversized list is refused whole, and the one held kept.
        let e = authority.learn_revocations(&list(9, &["1a", "not hex"])).unwrap_err();
        assert!(e.to_string().contains("\"not hex\""), "{e}");
        let many: Vec<String> = (0..=MAX_REVOKED).map(|i| format!("{i:x}")).collect();
        let e = authority.learn_revocations(&v1::RevocationList { index: 9, serials: many }).unwrap_err();
        assert_eq!(e, BadRevocations::TooMany(MAX_REVOKED + 1));
        assert!(authority.learn_revocations(&list(9, &[&"f".repeat(MAX_SERIAL_HEX + 1)])).is_err());
        assert_eq!(authority.revocations_index(), 7, "kept");
        // The next list replaces it (a coordinator's list is the whole list).
        authority.learn_revocations(&list(8, &["3c"])).unwrap();
        assert!(!authority.is_revoked("1a") && authority.is_revoked("3c"));
    }
}
