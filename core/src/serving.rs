//! How requests reach a tenant's inference instances: the rules the planner (which sizes instances) and the
//! simulator (which serves the requests) must agree on, and that a policy declares for the serving stack.

use serde::{Deserialize, Serialize};

/// A request waits at most this share of its SLO for its batch to fill. An assumption (PARIS sizes partitions for
/// a batch-size distribution but gives no batching window as a number); the simulator's default batching timeout
/// and PARIS's batch distribution both use it.
pub const BATCH_WINDOW_OF_SLO: f64 = 0.25;

/// Dead time of an instance that was created (pre-initialised) before its role starts, seconds: the model is
/// already loaded, only the switch is lost. The planner charges it and the simulator's default switch time is it.
pub const DEAD_PREINIT_S: f64 = 1.0;

/// Dead time of an instance created cold for its role, seconds: creation, context set-up and model load.
pub const DEAD_COLD_S: f64 = 6.0;

/// How a request picks one of its tenant's serving inference instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dispatch {
    /// The instance where it would finish first (join the least loaded).
    #[default]
    EarliestFinish,
    /// ELSA (PARIS's dispatcher): the smallest instance whose estimated finish meets the request's deadline,
    /// else the one that finishes first.
    Elsa,
}
