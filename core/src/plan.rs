//! Plans: what the planner decides and the coordinator commits. A plan has an epoch and, per GPU, the target layout,
//! which instance serves which tenant in which role, which instances to pre-initialise, the expected goodput and a
//! short explanation.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{GpuId, TenantId};
use crate::layout::{Layout, Placement};
use crate::sharing::Sharing;
use crate::time::SimTime;

/// What a GPU instance does for its tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Serves the tenant's inference requests.
    Inference,
    /// Runs the tenant's retraining job.
    Retraining,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Inference => "inference",
            Role::Retraining => "retraining",
        })
    }
}

/// One instance's job: `placement` serves `tenant` as `role`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Assignment {
    /// The GPU instance.
    pub placement: Placement,
    /// The tenant it works for.
    pub tenant: TenantId,
    /// What it does.
    pub role: Role,
    /// Create and warm the instance ahead of the switch, so the tenant does not wait for a cold start.
    #[serde(default)]
    pub preinit: bool,
}

impl fmt::Display for Assignment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} -> {} ({})", self.placement, self.tenant, self.role)?;
        if self.preinit {
            f.write_str(" [preinit]")?;
        }
        Ok(())
    }
}

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPlan {
    /// The target layout.
    pub layout: Layout,
    /// Which instance serves whom; instances without an assignment stay idle (or pre-initialised spares).
    pub assignments: Vec<Assignment>,
    /// The goodput the policy expects from this GPU over its horizon (requests within SLO x accuracy).
    pub expected_goodput: f64,
    /// Why the policy chose this layout, for operators.
    pub explanation: String,
    /// Later changes the policy expects within its horizon (informational: the next plan decides).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upcoming: Vec<PlannedChange>,
    /// Retraining configurations the policy chose (epochs per tenant) where they differ from the tenant's
    /// default (`RetrainingSpec::epochs`); Ekya picks them from the Optimus-curve estimate.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub retraining_epochs: BTreeMap<TenantId, f64>,
    /// How an instance assigned both a tenant's inference and its retraining shares them
    /// ([`crate::sharing`]); with [`Sharing::Exclusive`] (the default) every instance serves one role.
    #[serde(default, skip_serializing_if = "Sharing::is_exclusive")]
    pub sharing: Sharing,
}

/// A layout change a plan expects later in its horizon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedChange {
    /// Workload time of the change.
    pub at: SimTime,
    /// The layout from then on.
    pub layout: Layout,
    /// The assignments from then on.
    pub assignments: Vec<Assignment>,
}

/// A committed decision for the fleet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// Monotonic plan number; agents never apply an older epoch after a newer one.
    pub epoch: u64,
    /// Workload time the plan was made for.
    pub made_at: SimTime,
    /// The policy that made it.
    pub policy: String,
    /// Per-GPU targets. GPUs absent from the map keep their current target.
    pub gpus: BTreeMap<GpuId, GpuPlan>,
}

impl Plan {
    /// Sum of the GPUs' expected goodput.
    pub fn expected_goodput(&self) -> f64 {
        self.gpus.values().map(|g| g.expected_goodput).sum()
    }
}
