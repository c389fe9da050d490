//! The replicated state machine: the fleet state of `tessera_core::fleet` plus what the coordinator itself needs
//! replicated (cluster members, workload time, per-GPU plan history).
//!
//! [`CoordState::apply`] is deterministic: every node applies the same [`Op`]s in log order and reaches the same
//! state. A rejected op changes nothing. The whole state serialises to JSON for Raft snapshots.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use tessera_core::fleet::{Command, Event, FleetState, Rejected};
use tessera_core::ids::GpuId;
use tessera_core::plan::GpuPlan;
use tessera_core::time::SimTime;

/// How many committed targets per GPU the history keeps.
pub const HISTORY_PER_GPU: usize = 32;

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
    /// Moves workload time forward (virtual time, driven by replay); an earlier time is ignored.
    Clock {
        /// The new workload time, ms.
        now_ms: u64,
    },
}

/// A Raft entry's payload: the op and who is waiting for its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The node that proposed it (it answers the client once applied).
    pub origin: u64,
    /// The proposer's request number.
    pub request: u64,
    /// The operation.
    pub op: Op,
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
    /// Committed targets per GPU, newest last.
    pub history: BTreeMap<GpuId, VecDeque<HistoryEntry>>,
}

impl CoordState {
    /// Applies one op. A rejected fleet command changes nothing.
    pub fn apply(&mut self, op: Op) -> Result<Outcome, Rejected> {
        match op {
            Op::Fleet { command } => self.apply_command(command).map(Outcome::Event),
            Op::Batch { commands } => Ok(Outcome::Batch(commands.into_iter().map(|c| self.apply_command(c)).collect())),
            Op::Clock { now_ms } => {
                self.clock_ms = self.clock_ms.max(now_ms);
                Ok(Outcome::Clock(self.clock_ms))
            }
        }
    }

    fn apply_command(&mut self, command: Command) -> Result<Event, Rejected> {
        let plan = match &command {
            Command::CommitPlan { plan } => Some(plan.clone()),
            _ => None,
        };
        let event = self.fleet.apply(command)?;
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
    pub fn from_snapshot(data: &[u8]) -> Result<CoordState, String> {
        if data.is_empty() {
            return Ok(CoordState::default());
        }
        serde_json::from_slice(data).map_err(|e| format!("snapshot data: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_never_goes_back_and_snapshots_round_trip() {
        let mut s = CoordState::default();
        assert_eq!(s.apply(Op::Clock { now_ms: 5_000 }).unwrap(), Outcome::Clock(5_000));
        assert_eq!(s.apply(Op::Clock { now_ms: 1_000 }).unwrap(), Outcome::Clock(5_000));
        s.members.insert(4, "127.0.0.1:7004".into());
        let back = CoordState::from_snapshot(&s.to_snapshot()).unwrap();
        assert_eq!(back, s);
        assert!(CoordState::from_snapshot(b"{oops").unwrap_err().contains("snapshot data"));
    }

    #[test]
    fn a_rejected_command_in_a_batch_does_not_stop_the_others() {
        let mut s = CoordState::default();
        let bad = Command::DeleteTenant { id: "nobody".parse().unwrap() };
        let good = Op::Clock { now_ms: 1 };
        let Outcome::Batch(results) = s.apply(Op::Batch { commands: vec![bad.clone(), bad] }).unwrap() else {
            panic!("a batch answers a batch")
        };
        assert!(results.iter().all(Result::is_err));
        assert!(s.apply(good).is_ok());
    }
}
