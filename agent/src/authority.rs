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

use std::sync::Mutex;
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
}

impl Refusal {
    /// The rule's name, for metrics: `stale_term`, `term_too_far`, `not_leader`, `epoch_too_far` or
    /// `unregistered`.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::StaleTerm { .. } => "stale_term",
            Refusal::TermTooFar { .. } => "term_too_far",
            Refusal::NotLeader { .. } => "not_leader",
            Refusal::EpochTooFar { .. } => "epoch_too_far",
            Refusal::Unregistered => "unregistered",
        }
    }
}

/// The agent's knowledge of who leads, and a way to refresh it.
#[derive(Debug)]
pub struct Authority {
    known: Mutex<Option<Leadership>>,
    refresh: Option<mpsc::UnboundedSender<oneshot::Sender<()>>>,
    refresh_timeout: Duration,
}

/// The coordinator client's end of [`Authority::refresh`]: each request asks it to call the coordinators at once
/// and to answer once a call that started after the request has returned.
pub type RefreshRequests = mpsc::UnboundedReceiver<oneshot::Sender<()>>;

impl Authority {
    /// An agent with no coordinator client: pushes are checked for the caller's role only.
    pub fn standalone() -> Authority {
        Authority { known: Mutex::new(None), refresh: None, refresh_timeout: Duration::ZERO }
    }

    /// An agent whose coordinator client learns who leads ([`Authority::learn`]) and serves the returned refresh
    /// requests, waiting at most `refresh_timeout` for one.
    pub fn with_client(refresh_timeout: Duration) -> (Authority, RefreshRequests) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Authority { known: Mutex::new(None), refresh: Some(tx), refresh_timeout }, rx)
    }

    /// Records the coordinators' latest answer.
    pub fn learn(&self, leadership: Leadership) {
        *self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(leadership);
    }

    /// What the coordinators last said.
    pub fn known(&self) -> Option<Leadership> {
        *self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Checks a push at `term` and `epoch` from member `pusher` (`None`: no certificate says which, as without TLS)
    /// against what is known now.
    pub fn check_known(&self, pusher: Option<u64>, term: u64, epoch: u64) -> Result<(), Refusal> {
        match self.known() {
            // Nothing to check against yet: a member (with mutual TLS) waits until the coordinators have answered;
            // without TLS anyone may push anything anyway, and a standalone agent has nobody to ask.
            None if self.refresh.is_some() && pusher.is_some() => Err(Refusal::Unregistered),
            None => Ok(()),
            Some(known) => check(known, pusher, term, epoch),
        }
    }

    /// Checks a push; if what is known refuses it, asks the coordinators again first, and checks once more.
    pub async fn check(&self, pusher: Option<u64>, term: u64, epoch: u64) -> Result<(), Refusal> {
        let first = self.check_known(pusher, term, epoch);
        if first.is_ok() {
            return first;
        }
        self.refresh().await;
        self.check_known(pusher, term, epoch)
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
        assert_eq!(unheard.check(Some(1), 1, 1).await, Err(Refusal::Unregistered));
        assert_eq!(unheard.check(None, 1, 1).await, Ok(()), "without TLS nobody is checked");
    }
}
