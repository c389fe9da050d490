//! Invariants as code: one function each, with why it must hold. The state machine checks them before accepting a
//! command (and with `debug_assert!` after applying one); the simulator checks them every step.

use std::collections::BTreeMap;

use crate::catalog::GpuModel;
use crate::ids::{GpuId, TenantId};
use crate::layout::{Layout, LayoutError, Placement};
use crate::plan::{Assignment, GpuPlan, Role};
use crate::sharing::Sharing;

/// A broken invariant.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Violation {
    /// A layout breaks the placement rules of its GPU model.
    #[error("{gpu}: layout `{layout}` is invalid on {model}: {error}")]
    InvalidLayout {
        /// The GPU.
        gpu: GpuId,
        /// The layout.
        layout: Layout,
        /// The GPU model.
        model: GpuModel,
        /// What is wrong.
        error: LayoutError,
    },
    /// Two instances share a slice.
    #[error("{gpu}: {error}")]
    SliceUsedTwice {
        /// The GPU.
        gpu: GpuId,
        /// The overlap.
        error: LayoutError,
    },
    /// An assignment names an instance that is not in the layout.
    #[error("{gpu}: {tenant} is assigned to {placement}, which is not in the layout")]
    AssignmentOutsideLayout {
        /// The GPU.
        gpu: GpuId,
        /// The tenant.
        tenant: TenantId,
        /// The placement.
        placement: Placement,
    },
    /// An instance serves more than one tenant role (beyond what the GPU's sharing mode allows).
    #[error("{gpu}: {placement} is assigned {count} times ({allowed})")]
    InstanceSharedByRoles {
        /// The GPU.
        gpu: GpuId,
        /// The placement.
        placement: Placement,
        /// How many assignments it has.
        count: usize,
        /// What the sharing mode allows.
        allowed: &'static str,
    },
    /// An assignment names a tenant the fleet does not know.
    #[error("{gpu}: assigned tenant {tenant} does not exist")]
    UnknownTenant {
        /// The GPU.
        gpu: GpuId,
        /// The tenant.
        tenant: TenantId,
    },
    /// A plan epoch went backwards.
    #[error("plan epoch {next} does not follow {previous} (epochs must increase)")]
    EpochWentBack {
        /// The last committed epoch.
        previous: u64,
        /// The offending epoch.
        next: u64,
    },
}

/// A GPU's layout must obey its model's placement rules: an agent asked to create anything else would fail half-way
/// and leave the GPU in a state nobody planned.
pub fn layout_valid_for_model(gpu: &GpuId, model: GpuModel, layout: &Layout) -> Result<(), Violation> {
    layout.validate(model).map_err(|error| Violation::InvalidLayout {
        gpu: gpu.clone(),
        layout: layout.clone(),
        model,
        error,
    })
}

/// No memory or compute slice may belong to two instances: the hardware cannot give one slice to two instances,
/// and isolation (the reason for MIG) would be void if the model believed it could.
pub fn no_slice_used_twice(gpu: &GpuId, layout: &Layout) -> Result<(), Violation> {
    match layout.first_overlap() {
        Some(error) => Err(Violation::SliceUsedTwice { gpu: gpu.clone(), error }),
        None => Ok(()),
    }
}

/// Each instance serves at most one tenant role, and only instances of the layout are assigned: two jobs on one
/// instance would share its SMs and memory without the planner having accounted for it. The one exception is the
/// state [`crate::sharing`] models: under [`Sharing::Timeslice`] or [`Sharing::Priority`] an instance may serve
/// one tenant's inference *and* its retraining (two assignments, same tenant, one of each role), since the
/// planner then plans the inference with the shared latency and the retraining with the share left to it.
pub fn placement_serves_at_most_one_role(
    gpu: &GpuId,
    layout: &Layout,
    assignments: &[Assignment],
    sharing: Sharing,
) -> Result<(), Violation> {
    let mut uses: BTreeMap<Placement, Vec<&Assignment>> = BTreeMap::new();
    for a in assignments {
        if !layout.contains(a.placement) {
            return Err(Violation::AssignmentOutsideLayout {
                gpu: gpu.clone(),
                tenant: a.tenant.clone(),
                placement: a.placement,
            });
        }
        uses.entry(a.placement).or_default().push(a);
    }
    let allowed = match sharing {
        Sharing::Exclusive => "at most one tenant role per instance",
        Sharing::Timeslice | Sharing::Priority => {
            "at most one tenant role per instance, or one tenant's inference and retraining when shared"
        }
    };
    for (placement, on) in uses {
        let shared_pair = on.len() == 2
            && on[0].tenant == on[1].tenant
            && on[0].role != on[1].role
            && on.iter().any(|a| a.role == Role::Inference);
        let allowed_pair = shared_pair && !sharing.is_exclusive();
        if on.len() > 1 && !allowed_pair {
            return Err(Violation::InstanceSharedByRoles { gpu: gpu.clone(), placement, count: on.len(), allowed });
        }
    }
    Ok(())
}

/// Plan epochs strictly increase: agents apply a target only if its epoch is newer than what they have, so an
/// epoch reused or going back would let a stale plan override a newer one.
pub fn plan_epochs_never_decrease(previous: u64, next: u64) -> Result<(), Violation> {
    if next > previous { Ok(()) } else { Err(Violation::EpochWentBack { previous, next }) }
}

/// Every per-GPU invariant of a plan for a GPU of `model`. A tenant may hold several inference instances on one
/// GPU (PARIS plans heterogeneous partitions per model; requests are dispatched among them).
pub fn check_gpu_plan(gpu: &GpuId, model: GpuModel, plan: &GpuPlan) -> Result<(), Violation> {
    for p in plan.layout.placements() {
        // A start the driver refuses makes the overlap check meaningless: report it first.
        p.check_start().map_err(|error| Violation::InvalidLayout {
            gpu: gpu.clone(),
            layout: plan.layout.clone(),
            model,
            error,
        })?;
    }
    no_slice_used_twice(gpu, &plan.layout)?;
    layout_valid_for_model(gpu, model, &plan.layout)?;
    placement_serves_at_most_one_role(gpu, &plan.layout, &plan.assignments, plan.sharing)
}

/// Every assignment of a committed target names a tenant the fleet knows: an agent told to serve a tenant that no
/// longer exists has no model to load, and the planner's accounting would count work nobody asked for. Deleting an
/// assigned tenant therefore retires it until a plan without it is committed.
pub fn assignments_name_known_tenants<'a>(
    gpu: &GpuId,
    assignments: &[Assignment],
    known: impl Fn(&TenantId) -> bool + 'a,
) -> Result<(), Violation> {
    match assignments.iter().find(|a| !known(&a.tenant)) {
        Some(a) => Err(Violation::UnknownTenant { gpu: gpu.clone(), tenant: a.tenant.clone() }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Role;

    fn gpu() -> GpuId {
        "n/0".parse().unwrap()
    }

    fn plan(layout: &str, assignments: &[(&str, &str, Role)]) -> GpuPlan {
        GpuPlan {
            layout: layout.parse().unwrap(),
            assignments: assignments
                .iter()
                .map(|(p, t, r)| Assignment {
                    placement: p.parse().unwrap(),
                    tenant: TenantId::new(*t).unwrap(),
                    role: *r,
                    preinit: false,
                })
                .collect(),
            expected_goodput: 0.0,
            explanation: String::new(),
            upcoming: Vec::new(),
            retraining_epochs: Default::default(),
            sharing: Sharing::Exclusive,
        }
    }

    #[test]
    fn each_invariant_catches_its_violation() {
        let m = GpuModel::A100_40GB;
        let ok = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference), ("3g@4", "a", Role::Retraining)]);
        assert_eq!(check_gpu_plan(&gpu(), m, &ok), Ok(()));

        let e = check_gpu_plan(&gpu(), m, &plan("3g@0 2g@2", &[])).unwrap_err();
        assert!(matches!(e, Violation::SliceUsedTwice { .. }), "{e}");
        let e = check_gpu_plan(&gpu(), m, &plan("3g@2", &[])).unwrap_err();
        assert!(matches!(e, Violation::InvalidLayout { .. }), "{e}");
        let e = check_gpu_plan(&gpu(), m, &plan("3g@0", &[("3g@4", "a", Role::Inference)])).unwrap_err();
        assert!(matches!(e, Violation::AssignmentOutsideLayout { .. }), "{e}");
        let shared = plan("3g@0", &[("3g@0", "a", Role::Inference), ("3g@0", "b", Role::Inference)]);
        let e = check_gpu_plan(&gpu(), m, &shared).unwrap_err();
        assert_eq!(e.to_string(), "n/0: 3g@0 is assigned 2 times (at most one tenant role per instance)");
        // Several inference instances of one tenant on a GPU are allowed (PARIS's heterogeneous partitions).
        let twice = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference), ("3g@4", "a", Role::Inference)]);
        assert_eq!(check_gpu_plan(&gpu(), m, &twice), Ok(()));
        assert!(plan_epochs_never_decrease(3, 3).is_err());
    }

    #[test]
    fn only_a_sharing_mode_lets_one_tenant_infer_and_retrain_on_one_instance() {
        let m = GpuModel::A100_40GB;
        let both = plan("3g@0", &[("3g@0", "a", Role::Inference), ("3g@0", "a", Role::Retraining)]);
        let e = check_gpu_plan(&gpu(), m, &both).unwrap_err();
        assert_eq!(e.to_string(), "n/0: 3g@0 is assigned 2 times (at most one tenant role per instance)");
        for mode in [Sharing::Timeslice, Sharing::Priority] {
            let shared = GpuPlan { sharing: mode, ..both.clone() };
            assert_eq!(check_gpu_plan(&gpu(), m, &shared), Ok(()), "{mode}");
            // Never two tenants, two inference roles or three assignments, whatever the mode.
            for bad in [
                plan("3g@0", &[("3g@0", "a", Role::Inference), ("3g@0", "b", Role::Retraining)]),
                plan("3g@0", &[("3g@0", "a", Role::Inference), ("3g@0", "a", Role::Inference)]),
                plan("3g@0", &[("3g@0", "a", Role::Retraining), ("3g@0", "a", Role::Retraining)]),
                plan(
                    "3g@0",
                    &[("3g@0", "a", Role::Inference), ("3g@0", "a", Role::Retraining), ("3g@0", "a", Role::Inference)],
                ),
            ] {
                let bad = GpuPlan { sharing: mode, ..bad };
                let e = check_gpu_plan(&gpu(), m, &bad).unwrap_err();
                assert!(matches!(e, Violation::InstanceSharedByRoles { .. }), "{mode}: {e}");
            }
        }
        assert!(plan_epochs_never_decrease(3, 4).is_ok());
    }
}
