//! Who may push this agent layouts: the coordinators' leader, at its term, with a plan epoch the cluster committed.
//!
//! Mutual TLS says a push comes from *a* coordinator member; it does not say that member leads, nor that the epoch it
//! claims is real. An epoch far in the future freezes a node (every later push is refused as stale), so the agent
//! checks each push against what the coordinators told it in their own answers to its register and heartbeat calls
//! ([`Leadership`]), never against what the push claims:
//!
//! - the push's Raft term is not older than the known leader's, and at most [`MAX_TERM_AHEAD`] newer;
//! - at the known term, the pusher is the known leader (with mutual TLS, its certificate says which member it is);
//! - its epoch is at most [`MAX_EPOCH_AHEAD`] beyond the newest committed plan epoch.
//!
//! Knowledge can lag (a new election, a plan committed since the last heartbeat), so before refusing, the agent asks
//! the coordinators again (a heartbeat at once, [`Authority::refresh`]) and checks once more. The latest answer
//! replaces the previous one, so a bad answer lasts only until the next. An agent without a coordinator client (one
//! that replay drives directly) has nothing to check against and takes any newer epoch from a permitted caller.

use std::sync::Mutex;
use std::time::Duration;

use tessera_proto::v1;
use tokio::sync::{mpsc, oneshot};

/// How many terms beyond the known one a push may be: elections since the last heartbeat.
pub const MAX_TERM_AHEAD: u64 = 16;

/// How many epochs beyond the newest committed one a push may be: plans committed since the answer was read.
pub const MAX_EPOCH_AHEAD: u64 = 64;

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
    /// Too far beyond the known term.
    #[error("a push at term {term}, more than {MAX_TERM_AHEAD} beyond the known term {known}")]
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
    /// An epoch far beyond the committed one.
    #[error("epoch {epoch} is more than {MAX_EPOCH_AHEAD} beyond the newest committed plan epoch {committed}")]
    EpochTooFar {
        /// The push's epoch.
        epoch: u64,
        /// The newest committed epoch known.
        committed: u64,
    },
}

impl Refusal {
    /// The rule's name, for metrics: `stale_term`, `term_too_far`, `not_leader` or `epoch_too_far`.
    pub fn rule(&self) -> &'static str {
        match self {
            Refusal::StaleTerm { .. } => "stale_term",
            Refusal::TermTooFar { .. } => "term_too_far",
            Refusal::NotLeader { .. } => "not_leader",
            Refusal::EpochTooFar { .. } => "epoch_too_far",
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
    if known.term > 0 {
        if term < known.term {
            return Err(Refusal::StaleTerm { term, known: known.term, leader: known.leader_id });
        }
        if term > known.term.saturating_add(MAX_TERM_AHEAD) {
            return Err(Refusal::TermTooFar { term, known: known.term });
        }
        if let Some(pusher) = pusher
            && term == known.term
            && known.leader_id != 0
            && pusher != known.leader_id
        {
            return Err(Refusal::NotLeader { pusher, term, leader: known.leader_id });
        }
    }
    if epoch > known.plan_epoch.saturating_add(MAX_EPOCH_AHEAD) {
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
        assert_eq!(check(KNOWN, Some(2), 5, 100 + MAX_EPOCH_AHEAD), Ok(()), "plans committed since");
        assert_eq!(check(KNOWN, Some(3), 6, 101), Ok(()), "a newer term: an election since");
        assert_eq!(check(KNOWN, None, 5, 90), Ok(()), "without TLS nobody says who pushed");
    }

    #[test]
    fn older_terms_other_members_and_far_terms_or_epochs_are_refused() {
        assert!(matches!(check(KNOWN, Some(2), 4, 100), Err(Refusal::StaleTerm { known: 5, .. })));
        assert!(matches!(check(KNOWN, Some(3), 5, 100), Err(Refusal::NotLeader { pusher: 3, leader: 2, .. })));
        assert!(matches!(check(KNOWN, Some(2), 5 + MAX_TERM_AHEAD + 1, 100), Err(Refusal::TermTooFar { .. })));
        assert!(matches!(check(KNOWN, Some(2), 5, 1 << 63), Err(Refusal::EpochTooFar { committed: 100, .. })));
        assert!(check(KNOWN, Some(2), u64::MAX, u64::MAX).is_err(), "no overflow");
        let unknown_term = Leadership { term: 0, ..KNOWN };
        assert_eq!(check(unknown_term, Some(9), 1, 100), Ok(()));
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
    }
}
