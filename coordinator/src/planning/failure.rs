//! The leader's failure detector: what it saw of each node lately (heartbeats, pushes), and the verdicts that change
//! a node's health. The planner commits them through Raft (`Planner::check_health`), so a new leader plans with
//! them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_core::fleet::NodeHealth;
use tessera_core::ids::NodeId;

/// When the leader's failure detector changes a node's health.
#[derive(Debug, Clone, PartialEq)]
pub struct FailureDetection {
    /// No heartbeat for this long: suspect.
    pub suspect_after: Duration,
    /// No heartbeat for this long: failed.
    pub fail_after: Duration,
    /// This many pushes to the node failed in a row: suspect.
    pub suspect_push_failures: u32,
}

/// What the leader saw of a node lately (not replicated).
#[derive(Debug, Clone)]
struct Liveness {
    /// The last heartbeat (or when this leader started watching).
    last_seen: Instant,
    /// Pushes that failed in a row, and the last error.
    push_failures: u32,
    last_push_error: String,
}

/// The verdict on a node given what the leader saw; `None` keeps its health. A failed node stays failed until it
/// heartbeats again; failed pushes alone make a node suspect, never failed (its agent may still be serving).
fn verdict(fd: &FailureDetection, now: Instant, seen: &Liveness, health: NodeHealth) -> Option<(NodeHealth, String)> {
    let silent = now.saturating_duration_since(seen.last_seen);
    let (want, reason) = if silent >= fd.fail_after {
        (
            NodeHealth::Failed,
            format!(
                "no heartbeat for {:.1} s (fail_after {})",
                silent.as_secs_f64(),
                humantime::format_duration(fd.fail_after)
            ),
        )
    } else if silent >= fd.suspect_after {
        (
            NodeHealth::Suspect,
            format!(
                "no heartbeat for {:.1} s (suspect_after {})",
                silent.as_secs_f64(),
                humantime::format_duration(fd.suspect_after)
            ),
        )
    } else if health != NodeHealth::Failed && seen.push_failures >= fd.suspect_push_failures {
        (NodeHealth::Suspect, format!("{} pushes in a row failed: {}", seen.push_failures, seen.last_push_error))
    } else {
        (NodeHealth::Healthy, "heartbeating again".to_string())
    };
    let keep = want == health || (health == NodeHealth::Failed && want == NodeHealth::Suspect);
    (!keep).then_some((want, reason))
}

/// What this leader saw of each node lately. Not replicated: a new leader gives every node a fresh grace period.
#[derive(Debug, Default)]
pub(super) struct FailureDetector {
    liveness: Mutex<HashMap<NodeId, Liveness>>,
}

impl FailureDetector {
    /// A heartbeat from `node`, now.
    pub(super) fn saw(&self, node: &NodeId) {
        self.saw_at(node, Instant::now());
    }

    /// A heartbeat from `node` at `now`.
    fn saw_at(&self, node: &NodeId, now: Instant) {
        let mut live = self.liveness.lock().expect("liveness lock");
        let l = live.entry(node.clone()).or_insert_with(|| Liveness {
            last_seen: now,
            push_failures: 0,
            last_push_error: String::new(),
        });
        l.last_seen = now;
    }

    /// A push to `node` succeeded (`Ok`) or failed with this error.
    pub(super) fn pushed<E: std::fmt::Display>(&self, node: &NodeId, result: Result<(), E>) {
        let mut live = self.liveness.lock().expect("liveness lock");
        if let Some(l) = live.get_mut(node) {
            match result {
                Ok(()) => l.push_failures = 0,
                Err(e) => {
                    l.push_failures += 1;
                    l.last_push_error = e.to_string();
                }
            }
        }
    }

    /// The verdicts on `nodes` (each with its replicated health) at `now`: those whose health changes, with why.
    /// Forgets nodes no longer in the fleet; one not heard of yet gets a grace period from now.
    pub(super) fn verdicts(
        &self,
        fd: &FailureDetection,
        nodes: &[(NodeId, NodeHealth)],
        now: Instant,
    ) -> Vec<(NodeId, NodeHealth, String)> {
        let mut live = self.liveness.lock().expect("liveness lock");
        live.retain(|id, _| nodes.iter().any(|(n, _)| n == id));
        nodes
            .iter()
            .filter_map(|(id, health)| {
                let seen = live.entry(id.clone()).or_insert_with(|| Liveness {
                    last_seen: now,
                    push_failures: 0,
                    last_push_error: String::new(),
                });
                let (h, why) = verdict(fd, now, seen, *health)?;
                if *health == NodeHealth::Failed {
                    seen.push_failures = 0;
                }
                Some((id.clone(), h, why))
            })
            .collect()
    }

    /// Forgets everything seen (on losing or gaining leadership).
    pub(super) fn clear(&self) {
        self.liveness.lock().expect("liveness lock").clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str) -> NodeId {
        NodeId::new(name).expect("valid node id")
    }

    /// Silence makes a node suspect, then failed; failed pushes make it suspect only; a heartbeat makes it healthy
    /// again; nodes gone from the fleet are forgotten.
    #[test]
    fn verdicts_follow_silence_and_failed_pushes() {
        let fd = FailureDetection {
            suspect_after: Duration::from_secs(3),
            fail_after: Duration::from_secs(10),
            suspect_push_failures: 2,
        };
        let d = FailureDetector::default();
        let (a, b) = (node("a"), node("b"));
        let t0 = Instant::now();
        let fleet = |ha, hb| vec![(a.clone(), ha), (b.clone(), hb)];
        use NodeHealth::{Failed, Healthy, Suspect};
        assert!(d.verdicts(&fd, &fleet(Healthy, Healthy), t0).is_empty(), "a grace period from the first look");
        let at = |s| t0 + Duration::from_secs(s);
        let health = |v: Vec<(NodeId, NodeHealth, String)>| v.into_iter().map(|(n, h, _)| (n, h)).collect::<Vec<_>>();
        d.saw_at(&a, at(2));
        assert_eq!(health(d.verdicts(&fd, &fleet(Healthy, Healthy), at(4))), vec![(b.clone(), Suspect)]);
        assert_eq!(
            health(d.verdicts(&fd, &fleet(Healthy, Suspect), at(11))),
            vec![(a.clone(), Suspect), (b.clone(), Failed)]
        );
        d.saw_at(&a, at(12));
        assert_eq!(health(d.verdicts(&fd, &fleet(Suspect, Failed), at(12))), vec![(a.clone(), Healthy)]);
        d.pushed(&a, Err("refused"));
        d.pushed(&a, Err("refused again"));
        let v = d.verdicts(&fd, &[(a.clone(), Healthy)], at(12));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].1, Suspect);
        assert!(v[0].2.contains("refused again"), "{}", v[0].2);
        d.pushed(&a, Ok::<(), &str>(()));
        assert!(d.verdicts(&fd, &[(a.clone(), Healthy)], at(12)).is_empty());
        assert!(!d.liveness.lock().expect("liveness lock").contains_key(&b), "b left the fleet");
    }
}
