//! The replicated state machine: the fleet state of `tessera_core::fleet` plus what the coordinator itself needs
//! replicated (cluster members, workload time, per-GPU plan history).
//!
//! [`CoordState::apply`] is deterministic: every node applies the same [`Op`]s in log order and reaches the same
//! state. A rejected op changes nothing. The whole state serialises to JSON for Raft snapshots.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};
use tessera_core::fleet::{Command, Event, FleetState, Rejected};
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::plan::GpuPlan;
use tessera_core::time::SimTime;

/// How many committed targets per GPU the history keeps.
pub const HISTORY_PER_GPU: usize = 32;
/// How many client request ids the state remembers to answer a retried write without applying it twice.
pub const REMEMBERED_REQUESTS: usize = 4096;
/// How many audit entries the state keeps (the oldest go first).
pub const AUDIT_KEPT: usize = 10_000;
/// Longest client request id accepted, bytes.
pub const MAX_REQUEST_ID_BYTES: usize = 64;

/// One replicated operation (the payload of a normal Raft entry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// A fleet command (tenants, nodes, GPUs, plans, reports).
    Fleet {
        /// The command.
        command: Command,
    },
    /// Several fleet commands applied in order, each accepted or rejected on its own (agents' reports).
    Batch {
        /// The commands.
        commands: Vec<Command>,
    },
    /// A tenant command applied only if the tenant is still at `revision` (the Raft index of its last create or
    /// update, as a client read it): etcd's compare on `mod_revision`.
    Guarded {
        /// The command.
        command: Command,
        /// The tenant it is conditional on.
        tenant: TenantId,
        /// The revision it must still have.
        revision: u64,
    },
    /// An audited action that is not itself a fleet command (a membership change, a planning round, fault
    /// injection): recorded as given.
    Audit {
        /// The entry (its `index` is set when applied).
        entry: AuditEntry,
    },
    /// Moves workload time forward (virtual time, driven by replay); an earlier time is ignored.
    Clock {
        /// The new workload time, ms.
        now_ms: u64,
    },
    /// Revokes a certificate: every member refuses its calls from the index this is applied at.
    Revoke {
        /// What is known of it.
        certificate: Revocation,
    },
}

/// A revoked certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Revocation {
    /// Its serial number, lowercase hex (as `tessera_auth::Identity::serial`).
    pub serial: String,
    /// Its holder's name (CN), for people reading the list.
    pub name: String,
    /// Its role (OU).
    pub role: String,
    /// The index the revocation was applied at (set when applied).
    pub index: u64,
}

/// Revoked certificates kept at most; a revocation beyond it is not recorded (the service refuses it first).
/// Certificates expire: reissue with a new CA long before a cluster needs this many.
pub const MAX_REVOKED: usize = 10_000;

/// A Raft entry's payload: the op and who is waiting for its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The node that proposed it (it answers the client once applied).
    pub origin: u64,
    /// The proposer's request number.
    pub request: u64,
    /// The operation.
    pub op: Op,
    /// Wall-clock time (Unix ms) after which the proposer no longer waits for it: a leader that receives the
    /// forwarded proposal later drops it instead of appending it (a message parked in a stalled connection must
    /// not be applied after newer acknowledged writes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_ms: Option<u64>,
    /// The client's id for this write: a retry with the same id is answered without applying it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request: Option<String>,
    /// Who asked for it and what it is, when it is an audited action: the entry is recorded with its result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditEntry>,
}

/// One audited admin or operator action: who, what, when, and the result, replicated like everything else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// The log index it was applied at.
    #[serde(default)]
    pub index: u64,
    /// Wall-clock time the receiving member took the request, Unix ms.
    pub at_ms: u64,
    /// Who: `role:name` from the caller's certificate, or `anonymous` without TLS.
    pub who: String,
    /// What: the call and its subject (`create_tenant t1`, `add_member 4 host:7004`).
    pub action: String,
    /// `ok`, or why it was refused.
    #[serde(default)]
    pub result: String,
}

/// What applying an op produced.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// A fleet command was accepted.
    Event(Event),
    /// A batch: each command's result, in order.
    Batch(Vec<Result<Event, Rejected>>),
    /// The clock moved (or not): the workload time after the op.
    Clock(u64),
    /// A retried client write: it was applied at this index already, and is not applied again.
    Duplicate(u64),
    /// A revocation: whether the certificate is now on the list (false when the list is full).
    Revoked(bool),
}

/// One entry of a GPU's plan history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Plan epoch.
    pub epoch: u64,
    /// Workload time the plan was made for.
    pub made_at: SimTime,
    /// Policy.
    pub policy: String,
    /// The GPU's target.
    pub plan: GpuPlan,
}

/// The last [`REMEMBERED_REQUESTS`] client request ids with the index each was applied at, oldest first, and the
/// same by id, so that a write's check for a retry costs one lookup rather than a scan of thousands of ids on every
/// member. Serialised as the list alone (the form snapshots have always had); the lookup is rebuilt on reading.
#[derive(Debug, Clone, Default)]
pub struct RequestLog {
    order: VecDeque<(String, u64)>,
    by_id: HashMap<String, u64>,
}

impl RequestLog {
    /// The index request `id` was applied at, if it is remembered.
    pub fn applied_at(&self, id: &str) -> Option<u64> {
        self.by_id.get(id).copied()
    }

    /// Remembers request `id`, applied at `index` (not already remembered), forgetting the oldest beyond
    /// [`REMEMBERED_REQUESTS`].
    pub fn remember(&mut self, id: String, index: u64) {
        self.by_id.insert(id.clone(), index);
        self.order.push_back((id, index));
        while self.order.len() > REMEMBERED_REQUESTS {
            if let Some((old, at)) = self.order.pop_front()
                && self.by_id.get(&old) == Some(&at)
            {
                self.by_id.remove(&old);
            }
        }
    }

    /// How many ids are remembered.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

impl PartialEq for RequestLog {
    fn eq(&self, other: &Self) -> bool {
        self.order == other.order
    }
}

impl Serialize for RequestLog {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.order.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for RequestLog {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let order = VecDeque::<(String, u64)>::deserialize(deserializer)?;
        let by_id = order.iter().cloned().collect();
        Ok(RequestLog { order, by_id })
    }
}

/// Everything the coordinator replicates.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CoordState {
    /// Tenants, nodes, GPUs, committed plan.
    pub fleet: FleetState,
    /// Coordinator members added or removed at run time, with their addresses (the initial peers come from the
    /// configuration).
    pub members: BTreeMap<u64, String>,
    /// Workload time, ms (virtual clock mode).
    pub clock_ms: u64,
    /// Revoked certificates by serial.
    #[serde(default)]
    pub revoked: BTreeMap<String, Revocation>,
    /// Committed targets per GPU, newest last.
    pub history: BTreeMap<GpuId, VecDeque<HistoryEntry>>,
    /// Each tenant's revision: the index of its last create or update.
    #[serde(default)]
    pub tenant_revisions: BTreeMap<TenantId, u64>,
    /// The last [`REMEMBERED_REQUESTS`] client request ids with the index each was applied at.
    #[serde(default)]
    pub requests: RequestLog,
    /// The last [`AUDIT_KEPT`] audited actions, oldest first.
    #[serde(default)]
    pub audit: VecDeque<AuditEntry>,
}

impl CoordState {
    /// Applies a committed proposal at log `index`: a client request id seen before answers
    /// [`Outcome::Duplicate`] and changes nothing; otherwise [`CoordState::apply`].
    pub fn apply_proposal(&mut self, index: u64, proposal: Proposal) -> Result<Outcome, Rejected> {
        if let Some(id) = &proposal.client_request
            && let Some(at) = self.requests.applied_at(id)
        {
            return Ok(Outcome::Duplicate(at));
        }
        let result = self.apply(index, proposal.op);
        if let Some(mut entry) = proposal.audit {
            entry.result = match &result {
                Ok(_) => "ok".into(),
                Err(e) => e.to_string(),
            };
            self.record(index, entry);
        }
        if let (Ok(_), Some(id)) = (&result, proposal.client_request) {
            self.requests.remember(id, index);
        }
        result
    }

    /// Applies one op at log `index`. A rejected fleet command changes nothing.
    pub fn apply(&mut self, index: u64, op: Op) -> Result<Outcome, Rejected> {
        match op {
            Op::Fleet { command } => self.apply_command(index, command).map(Outcome::Event),
            Op::Guarded { command, tenant, revision } => {
                let actual = self.tenant_revisions.get(&tenant).copied().unwrap_or(0);
                if actual != revision {
                    return Err(Rejected::RevisionMismatch { tenant, expected: revision, actual });
                }
                self.apply_command(index, command).map(Outcome::Event)
            }
            Op::Batch { commands } => {
                Ok(Outcome::Batch(commands.into_iter().map(|c| self.apply_command(index, c)).collect()))
            }
            Op::Clock { now_ms } => {
                self.clock_ms = self.clock_ms.max(now_ms);
                Ok(Outcome::Clock(self.clock_ms))
            }
            Op::Audit { entry } => {
                self.record(index, entry);
                Ok(Outcome::Clock(self.clock_ms))
            }
            Op::Revoke { mut certificate } => {
                if self.revoked.len() >= MAX_REVOKED && !self.revoked.contains_key(&certificate.serial) {
                    return Ok(Outcome::Revoked(false));
                }
                certificate.index = index;
                self.revoked.entry(certificate.serial.clone()).or_insert(certificate);
                Ok(Outcome::Revoked(true))
            }
        }
    }

    fn record(&mut self, index: u64, mut entry: AuditEntry) {
        entry.index = index;
        self.audit.push_back(entry);
        while self.audit.len() > AUDIT_KEPT {
            self.audit.pop_front();
        }
    }

    fn apply_command(&mut self, index: u64, command: Command) -> Result<Event, Rejected> {
        let plan = match &command {
            Command::CommitPlan { plan } => Some(plan.clone()),
            _ => None,
        };
        let event = self.fleet.apply(command)?;
        match &event {
            Event::TenantCreated { id } | Event::TenantUpdated { id } => {
                self.tenant_revisions.insert(id.clone(), index);
            }
            Event::TenantDeleted { id } => {
                self.tenant_revisions.remove(id);
            }
            Event::PlanCommitted { tenants_removed, .. } => {
                for t in tenants_removed {
                    self.tenant_revisions.remove(t);
                }
            }
            _ => {}
        }
        if let Some(plan) = plan {
            for (gpu, target) in plan.gpus {
                let h = self.history.entry(gpu).or_default();
                h.push_back(HistoryEntry {
                    epoch: plan.epoch,
                    made_at: plan.made_at,
                    policy: plan.policy.clone(),
                    plan: target,
                });
                while h.len() > HISTORY_PER_GPU {
                    h.pop_front();
                }
            }
            // GPUs that left the fleet take their history with them.
            let fleet = &self.fleet;
            self.history.retain(|g, _| fleet.gpus.contains_key(g));
        }
        Ok(event)
    }

    /// Serialises the state for a Raft snapshot.
    pub fn to_snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("the coordinator state serialises")
    }

    /// Restores a state from snapshot data.
    ///
    /// # Errors
    /// The data is not a state this build can read.
    pub fn from_snapshot(data: &[u8]) -> Result<CoordState, serde_json::Error> {
        if data.is_empty() {
            return Ok(CoordState::default());
        }
        serde_json::from_slice(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revocations_are_kept_once_and_bounded() {
        let mut s = CoordState::default();
        let cert =
            |serial: &str| Revocation { serial: serial.into(), name: "op2".into(), role: "operator".into(), index: 0 };
        assert_eq!(s.apply(3, Op::Revoke { certificate: cert("1a") }).unwrap(), Outcome::Revoked(true));
        assert_eq!(s.apply(4, Op::Revoke { certificate: cert("1a") }).unwrap(), Outcome::Revoked(true));
        assert_eq!(s.revoked["1a"].index, 3, "revoked once, at the first index");
        for i in 1..MAX_REVOKED {
            s.apply(10, Op::Revoke { certificate: cert(&format!("{i:x}00")) }).unwrap();
        }
        assert_eq!(s.revoked.len(), MAX_REVOKED);
        assert_eq!(s.apply(11, Op::Revoke { certificate: cert("ffff") }).unwrap(), Outcome::Revoked(false));
        let back = CoordState::from_snapshot(&s.to_snapshot()).unwrap();
        assert_eq!(back.revoked, s.revoked, "the list travels in snapshots");
    }

    #[test]
    fn clock_never_goes_back_and_snapshots_round_trip() {
        let mut s = CoordState::default();
        assert_eq!(s.apply(1, Op::Clock { now_ms: 5_000 }).unwrap(), Outcome::Clock(5_000));
        assert_eq!(s.apply(2, Op::Clock { now_ms: 1_000 }).unwrap(), Outcome::Clock(5_000));
        s.members.insert(4, "127.0.0.1:7004".into());
        let back = CoordState::from_snapshot(&s.to_snapshot()).unwrap();
        assert_eq!(back, s);
        let e = CoordState::from_snapshot(b"{oops").unwrap_err();
        assert!(e.is_syntax() || e.is_eof(), "{e}");
    }

    #[test]
    fn a_rejected_command_in_a_batch_does_not_stop_the_others() {
        let mut s = CoordState::default();
        let bad = Command::DeleteTenant { id: "nobody".parse().unwrap() };
        let good = Op::Clock { now_ms: 1 };
        let Outcome::Batch(results) = s.apply(1, Op::Batch { commands: vec![bad.clone(), bad] }).unwrap() else {
            panic!("a batch answers a batch")
        };
        assert!(results.iter().all(Result::is_err));
        assert!(s.apply(2, good).is_ok());
    }

    fn model() -> tessera_core::model::ModelProfile {
        tessera_core::model::ModelProfile {
            name: "m".into(),
            description: String::new(),
            inference_memory_gib: 1.0,
            training_memory_gib: 2.0,
            max_batch: 8,
            latency: tessera_core::model::LatencyModel::Parametric { base_ms: 2.0, alpha: 0.8, beta: 0.1 },
            training: tessera_core::model::TrainingSpeed::Exponent(0.9),
        }
    }

    fn spec(slo_ms: f64) -> tessera_core::tenant::TenantSpec {
        tessera_core::tenant::TenantSpec {
            jobs: Default::default(),
            pin: Default::default(),
            id: TenantId::new("t").unwrap(),
            name: "t".into(),
            model: "m".into(),
            slo_ms,
            slo_percentile: 99.0,
            weight: 1.0,
            demand: tessera_core::tenant::DemandSource::Poisson { rate_rps: 1.0 },
            retraining: None,
        }
    }

    fn proposal(op: Op, client_request: Option<&str>) -> Proposal {
        Proposal {
            origin: 1,
            request: 0,
            op,
            deadline_ms: None,
            client_request: client_request.map(Into::into),
            audit: None,
        }
    }

    #[test]
    fn a_conditional_update_loses_to_a_newer_write_and_a_retried_request_applies_once() {
        let mut s = CoordState::default();
        s.apply(1, Op::Fleet { command: Command::PutModel { profile: model() } }).unwrap();
        s.apply(2, Op::Fleet { command: Command::CreateTenant { spec: spec(111.0) } }).unwrap();
        let t = TenantId::new("t").unwrap();
        assert_eq!(s.tenant_revisions[&t], 2);
        // Two clients read revision 2; the first update wins, the late one is refused and changes nothing.
        let update =
            |slo| Op::Guarded { command: Command::UpdateTenant { spec: spec(slo) }, tenant: t.clone(), revision: 2 };
        s.apply(3, update(222.0)).unwrap();
        assert_eq!(s.tenant_revisions[&t], 3);
        let before = s.clone();
        let e = s.apply(4, update(111.0)).unwrap_err();
        assert_eq!(e.to_string(), "tenant t is at revision 3, not 2: it changed since it was read");
        assert_eq!(s, before);
        assert_eq!(s.fleet.tenants[&t].slo_ms, 222.0);

        // A write retried with the same request id is applied once; the retry answers where it was applied.
        let write = || proposal(Op::Fleet { command: Command::UpdateTenant { spec: spec(333.0) } }, Some("req-1"));
        assert!(matches!(s.apply_proposal(5, write()), Ok(Outcome::Event(_))));
        assert_eq!(s.apply_proposal(6, write()), Ok(Outcome::Duplicate(5)));
        assert_eq!(s.tenant_revisions[&t], 5);
        // The memory of request ids is bounded.
        for i in 0..REMEMBERED_REQUESTS + 10 {
            s.apply_proposal(7 + i as u64, proposal(Op::Clock { now_ms: 0 }, Some(&format!("c{i}")))).unwrap();
        }
        assert_eq!(s.requests.len(), REMEMBERED_REQUESTS);
        assert!(matches!(s.apply_proposal(99_999, write()), Ok(Outcome::Event(_))));
        let mut back = CoordState::from_snapshot(&s.to_snapshot()).unwrap();
        assert_eq!(back, s);
        // A snapshot remembers the ids: a retry after a restart is still answered, not applied again.
        let last = format!("c{}", REMEMBERED_REQUESTS + 9);
        assert_eq!(
            back.apply_proposal(100_000, proposal(Op::Clock { now_ms: 0 }, Some(&last))),
            Ok(Outcome::Duplicate(7 + REMEMBERED_REQUESTS as u64 + 9))
        );
        assert_eq!(back.apply_proposal(100_001, proposal(Op::Clock { now_ms: 0 }, Some("c0"))), Ok(Outcome::Clock(0)));
        // Deleting the tenant forgets its revision.
        s.apply(100_000, Op::Fleet { command: Command::DeleteTenant { id: t.clone() } }).unwrap();
        assert!(!s.tenant_revisions.contains_key(&t));
    }
}
