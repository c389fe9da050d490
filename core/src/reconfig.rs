//! Layout diffs as ordered reconfiguration steps.
//!
//! [`diff`] turns the current layout of a GPU (and who uses each instance) into the target layout with the fewest
//! disruptions a per-instance reconfiguration allows:
//!
//! 1. placements in both layouts are never touched;
//! 2. **make before break**: a target instance whose slices are free is created before anything is destroyed, so it
//!    can warm up while the old instances still serve;
//! 3. otherwise the instance to destroy next is the one that lets the most pending creates proceed (ties: the one
//!    in the way of the most creates, then start order), and each create runs as soon as its slices are free;
//! 4. instances that nothing in the target needs are destroyed last, so they serve as long as possible;
//! 5. an unchanged instance whose tenant or role changes gets a `Reassign` step (drain and reload, no MIG call).
//!
//! Every intermediate layout is valid (no shared slice, no profile over its count), so the steps can be executed one
//! by one with NVML and a crash between any two leaves a valid GPU.
//!
//! Time model ([`ReconfigLatency`]): MIG calls on one GPU run one after another (destroy `destroy_ms`, create
//! `create_ms`); a created instance then needs `warmup_ms` (CUDA context, model load) before it serves, which
//! overlaps the following steps. The destroy of an instance whose work already has a replacement waits until the
//! replacement is warm (that is what make-before-break buys). A tenant is disrupted from the start of the first
//! destroy of one of its instances until its last new instance is warm; with make-before-break that is never.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::catalog::GpuModel;
use crate::ids::TenantId;
use crate::layout::{Layout, LayoutError, Placement};
use crate::plan::{Assignment, Role};

/// How long reconfiguration operations take. Defaults are from `shared/reference/mig.md` section 5 (no vendor
/// figure exists; MIGRator reports several seconds per reconfiguration on A100).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigLatency {
    /// Creating a GI and its CI.
    pub create_ms: u64,
    /// Destroying a CI and its GI.
    pub destroy_ms: u64,
    /// CUDA context and model load on a new instance before it serves; hidden when the instance is
    /// pre-initialised.
    pub warmup_ms: u64,
}

impl Default for ReconfigLatency {
    fn default() -> Self {
        ReconfigLatency { create_ms: 1000, destroy_ms: 500, warmup_ms: 4000 }
    }
}

/// What a step does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAction {
    /// Drain the instance's work, then destroy its CI and GI.
    Destroy,
    /// Create the GI at the placement and its CI.
    Create,
    /// Keep the instance; drain it and load another tenant's or role's work.
    Reassign,
}

impl fmt::Display for StepAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StepAction::Destroy => "destroy",
            StepAction::Create => "create",
            StepAction::Reassign => "reassign",
        })
    }
}

/// One reconfiguration step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// What to do.
    pub action: StepAction,
    /// On which instance.
    pub placement: Placement,
    /// The work on the instance before the step (destroy, reassign).
    pub before: Vec<(TenantId, Role)>,
    /// The work on the instance after the step (create, reassign).
    pub after: Vec<(TenantId, Role)>,
    /// When the step starts, ms after the reconfiguration begins.
    pub start_ms: u64,
    /// How long the MIG call takes (0 for a reassignment).
    pub duration_ms: u64,
    /// When the instance serves its new work, for create and reassign steps.
    pub ready_ms: Option<u64>,
}

/// A tenant's loss of service during a reconfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disruption {
    /// The role affected.
    pub role: Role,
    /// From when (ms after the reconfiguration begins) one of its instances is gone.
    pub from_ms: u64,
    /// Until when (its replacement is warm, or the end of the reconfiguration).
    pub until_ms: u64,
}

impl Disruption {
    /// Length of the disruption.
    pub fn duration_ms(&self) -> u64 {
        self.until_ms - self.from_ms
    }
}

/// The ordered steps from one layout to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigPlan {
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// Placements present in both layouts, never touched (a reassigned one is listed here and has a step).
    pub unchanged: Vec<Placement>,
    /// When the last instance serves, ms after the start.
    pub total_ms: u64,
    /// Tenants that lose service, by tenant and role.
    pub disruptions: BTreeMap<(TenantId, Role), Disruption>,
}

impl ReconfigPlan {
    /// Whether the plan changes nothing.
    pub fn is_noop(&self) -> bool {
        self.steps.is_empty()
    }

    /// Number of MIG calls (creates and destroys).
    pub fn mig_operations(&self) -> usize {
        self.steps.iter().filter(|s| s.action != StepAction::Reassign).count()
    }
}

/// Why a diff cannot be computed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DiffError {
    /// The current layout is not valid.
    #[error("current layout is invalid: {0}")]
    InvalidCurrent(LayoutError),
    /// The target layout is not valid.
    #[error("target layout is invalid: {0}")]
    InvalidTarget(LayoutError),
    /// An assignment names a placement that is not in its layout.
    #[error("assignment {assignment} names a placement that is not in the {which} layout")]
    StrayAssignment {
        /// `current` or `target`.
        which: &'static str,
        /// The assignment.
        assignment: String,
    },
}

/// The steps from `current` to `target` with nobody's work attached (see [`diff_assigned`]).
pub fn diff(
    model: GpuModel,
    current: &Layout,
    target: &Layout,
    latency: &ReconfigLatency,
) -> Result<ReconfigPlan, DiffError> {
    diff_assigned(model, current, &[], target, &[], latency)
}

/// The steps from `current` (whose instances do `current_work`) to `target` (doing `target_work`).
pub fn diff_assigned(
    model: GpuModel,
    current: &Layout,
    current_work: &[Assignment],
    target: &Layout,
    target_work: &[Assignment],
    latency: &ReconfigLatency,
) -> Result<ReconfigPlan, DiffError> {
    current.validate(model).map_err(DiffError::InvalidCurrent)?;
    target.validate(model).map_err(DiffError::InvalidTarget)?;
    let work_before = work_map("current", current, current_work)?;
    let work_after = work_map("target", target, target_work)?;
    let work = |m: &BTreeMap<Placement, Vec<(TenantId, Role)>>, p: Placement| m.get(&p).cloned().unwrap_or_default();

    let unchanged: Vec<Placement> = current.placements().iter().copied().filter(|p| target.contains(*p)).collect();
    let mut creates: Vec<Placement> = target.placements().iter().copied().filter(|p| !current.contains(*p)).collect();
    let mut destroys: Vec<Placement> = current.placements().iter().copied().filter(|p| !target.contains(*p)).collect();

    let mut state = current.clone();
    let mut clock = 0u64;
    let mut steps = Vec::new();
    // When each tenant-role's newest instance so far is warm.
    let mut warm_at: BTreeMap<(TenantId, Role), u64> = BTreeMap::new();
    let mut push = |action,
                    placement,
                    before: Vec<(TenantId, Role)>,
                    after: Vec<(TenantId, Role)>,
                    clock: &mut u64,
                    duration_ms: u64,
                    warm: bool| {
        // A destroy waits for the replacement of its work, if one was made before it.
        let start_ms = before.iter().filter_map(|k| warm_at.get(k)).fold(*clock, |t, &w| t.max(w));
        *clock = start_ms + duration_ms;
        if warm {
            for k in &after {
                warm_at.insert(k.clone(), *clock + latency.warmup_ms);
            }
        }
        steps.push(Step {
            action,
            placement,
            before,
            after,
            start_ms,
            duration_ms,
            ready_ms: warm.then_some(*clock + latency.warmup_ms),
        });
    };

    // Reassignments of kept instances need no MIG call: do them first, they are independent of the rest.
    for &p in &unchanged {
        let (b, a) = (work(&work_before, p), work(&work_after, p));
        if b != a {
            push(StepAction::Reassign, p, b, a, &mut clock, 0, true);
        }
    }

    while !creates.is_empty() || !destroys.is_empty() {
        // Make before break: every create whose slices are free goes now.
        let (ready, blocked): (Vec<Placement>, Vec<Placement>) =
            creates.iter().partition(|&&c| state.can_add(model, c));
        if !ready.is_empty() {
            for c in ready {
                state.insert(c);
                push(StepAction::Create, c, vec![], work(&work_after, c), &mut clock, latency.create_ms, true);
            }
            creates = blocked;
            continue;
        }
        let d = pick_destroy(model, &state, &destroys, &creates);
        destroys.retain(|&x| x != d);
        state.remove(d);
        push(StepAction::Destroy, d, work(&work_before, d), vec![], &mut clock, latency.destroy_ms, false);
    }
    debug_assert_eq!(&state, target);

    let total_ms = steps.iter().map(|s| s.ready_ms.unwrap_or(s.start_ms + s.duration_ms)).max().unwrap_or(0);
    let disruptions = disruptions(&steps, total_ms);
    Ok(ReconfigPlan { steps, unchanged, total_ms, disruptions })
}

fn work_map(
    which: &'static str,
    layout: &Layout,
    work: &[Assignment],
) -> Result<BTreeMap<Placement, Vec<(TenantId, Role)>>, DiffError> {
    let mut m: BTreeMap<Placement, Vec<(TenantId, Role)>> = BTreeMap::new();
    for a in work {
        if !layout.contains(a.placement) {
            return Err(DiffError::StrayAssignment { which, assignment: a.to_string() });
        }
        m.entry(a.placement).or_default().push((a.tenant.clone(), a.role));
    }
    for v in m.values_mut() {
        v.sort();
    }
    Ok(m)
}

/// The destroy that unblocks the most pending creates; ties broken by how many creates it is in the way of (so
/// destroys nothing needs go last), then by start order.
fn pick_destroy(model: GpuModel, state: &Layout, destroys: &[Placement], creates: &[Placement]) -> Placement {
    let score = |d: Placement| {
        let mut without = state.clone();
        without.remove(d);
        let unblocked = creates.iter().filter(|&&c| without.can_add(model, c)).count();
        let in_way = creates.iter().filter(|&&c| c.conflicts_with(d) || c.profile == d.profile).count();
        (unblocked, in_way)
    };
    let mut best = destroys[0];
    let mut best_score = score(best);
    for &d in &destroys[1..] {
        let s = score(d);
        if s > best_score {
            best = d;
            best_score = s;
        }
    }
    best
}

fn disruptions(steps: &[Step], total_ms: u64) -> BTreeMap<(TenantId, Role), Disruption> {
    // Per tenant-role: when it first lost an instance, and when its last new instance became warm.
    let mut lost: BTreeMap<(TenantId, Role), u64> = BTreeMap::new();
    let mut gained: BTreeMap<(TenantId, Role), u64> = BTreeMap::new();
    for s in steps {
        for k in &s.before {
            lost.entry(k.clone()).or_insert(s.start_ms);
        }
        if let Some(ready) = s.ready_ms {
            for k in &s.after {
                let e = gained.entry(k.clone()).or_insert(ready);
                *e = (*e).max(ready);
            }
        }
    }
    lost.into_iter()
        .filter_map(|(key, from_ms)| {
            let until_ms = gained.get(&key).copied().unwrap_or(total_ms.max(from_ms));
            (until_ms > from_ms).then(|| (key.clone(), Disruption { role: key.1, from_ms, until_ms }))
        })
        .collect()
}

/// Applies `steps` to `layout`, checking that every intermediate layout is valid on `model`. Returns the final
/// layout, or the first invalid one's error with the step index.
pub fn apply_steps(model: GpuModel, layout: &Layout, steps: &[Step]) -> Result<Layout, (usize, LayoutError)> {
    let mut state = layout.clone();
    for (i, s) in steps.iter().enumerate() {
        match s.action {
            StepAction::Create => state.insert(s.placement),
            StepAction::Destroy => {
                state.remove(s.placement);
            }
            StepAction::Reassign => {}
        }
        state.validate(model).map_err(|e| (i, e))?;
    }
    Ok(state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enumerate::{ProfileSet, all_layouts};
    use proptest::prelude::*;

    fn l(s: &str) -> Layout {
        s.parse().unwrap()
    }

    fn tenant(s: &str) -> TenantId {
        TenantId::new(s).unwrap()
    }

    #[test]
    fn unchanged_placements_are_untouched_and_free_slices_are_used_first() {
        let m = GpuModel::A100_40GB;
        let plan = diff(m, &l("3g@0 1g@4"), &l("3g@0 2g@4 1g@6"), &ReconfigLatency::default()).unwrap();
        let steps: Vec<String> = plan.steps.iter().map(|s| format!("{} {}", s.action, s.placement)).collect();
        // 1g@6 goes on free slices first (make before break), then 1g@4 makes room for 2g@4.
        assert_eq!(steps, ["create 1g@6", "destroy 1g@4", "create 2g@4"]);
        assert_eq!(plan.unchanged, vec!["3g@0".parse().unwrap()]);
    }

    #[test]
    fn destroy_before_create_where_slices_conflict() {
        let m = GpuModel::A100_40GB;
        let plan = diff(m, &l("3g@0 3g@4"), &l("4g@0 2g@4 1g@6"), &ReconfigLatency::default()).unwrap();
        let steps: Vec<String> = plan.steps.iter().map(|s| format!("{} {}", s.action, s.placement)).collect();
        // Destroying 3g@4 first unblocks two creates (2g@4, 1g@6); 3g@0 serves until 4g@0 needs its slices.
        assert_eq!(steps, ["destroy 3g@4", "create 2g@4", "create 1g@6", "destroy 3g@0", "create 4g@0"]);
        assert_eq!(plan.total_ms, 500 + 1000 + 500 + 1000 + 1000 + 4000);
    }

    #[test]
    fn disruptions_name_only_the_tenants_whose_instances_change() {
        let m = GpuModel::A100_40GB;
        let a = |p: &str, t: &str| Assignment {
            placement: p.parse().unwrap(),
            tenant: tenant(t),
            role: Role::Inference,
            preinit: false,
        };
        let current = [a("3g@0", "alice"), a("3g@4", "bob")];
        let target = [a("3g@0", "alice"), a("2g@4", "bob"), a("1g@6", "carol")];
        let plan =
            diff_assigned(m, &l("3g@0 3g@4"), &current, &l("3g@0 2g@4 1g@6"), &target, &ReconfigLatency::default())
                .unwrap();
        let disrupted: Vec<&str> = plan.disruptions.keys().map(|(t, _)| t.as_str()).collect();
        assert_eq!(disrupted, ["bob"]);
        let d = plan.disruptions[&(tenant("bob"), Role::Inference)];
        // bob's 3g@4 goes at 0; 2g@4 is created at 500..1500 and warm at 5500.
        assert_eq!((d.from_ms, d.until_ms), (0, 5500));
    }

    #[test]
    fn make_before_break_hides_the_warm_up() {
        let m = GpuModel::A100_40GB;
        let a = |p: &str| Assignment {
            placement: p.parse().unwrap(),
            tenant: tenant("t"),
            role: Role::Inference,
            preinit: true,
        };
        // The new 3g@4 is on free slices: created and warmed while 3g@0 still serves; then 3g@0 goes away.
        let plan =
            diff_assigned(m, &l("3g@0"), &[a("3g@0")], &l("3g@4"), &[a("3g@4")], &ReconfigLatency::default()).unwrap();
        assert_eq!(plan.steps[0].action, StepAction::Create);
        let d = plan.disruptions.get(&(tenant("t"), Role::Inference));
        // The destroy waits until the replacement is warm (1000 + 4000): no disruption at all.
        assert_eq!(d, None);
        assert_eq!((plan.steps[1].action, plan.steps[1].start_ms), (StepAction::Destroy, 5000));
        assert_eq!(plan.total_ms, 5500);
    }

    #[test]
    fn reassignment_keeps_the_instance() {
        let m = GpuModel::H100_80GB;
        let a =
            |t: &str, r| Assignment { placement: "7g@0".parse().unwrap(), tenant: tenant(t), role: r, preinit: false };
        let plan = diff_assigned(
            m,
            &l("7g@0"),
            &[a("x", Role::Inference)],
            &l("7g@0"),
            &[a("x", Role::Retraining)],
            &ReconfigLatency::default(),
        )
        .unwrap();
        assert_eq!(plan.mig_operations(), 0);
        assert_eq!(plan.steps.len(), 1);
        assert_eq!(plan.steps[0].action, StepAction::Reassign);
    }

    #[test]
    fn invalid_inputs_are_refused() {
        let m = GpuModel::A100_40GB;
        let e = diff(m, &l("3g@0"), &l("3g@0 2g@2"), &ReconfigLatency::default()).unwrap_err();
        assert_eq!(e.to_string(), "target layout is invalid: 3g@0 and 2g@2 both use memory slice 2");
        let stray = Assignment {
            placement: "1g@0".parse().unwrap(),
            tenant: tenant("t"),
            role: Role::Inference,
            preinit: false,
        };
        let e = diff_assigned(m, &l("7g@0"), &[stray], &l("7g@0"), &[], &ReconfigLatency::default()).unwrap_err();
        assert!(matches!(e, DiffError::StrayAssignment { which: "current", .. }));
    }

    #[test]
    fn the_media_extension_count_is_respected_in_between() {
        // Two 1g+me at different starts never coexist: the old one must go first.
        let m = GpuModel::H100_80GB;
        let plan = diff(m, &l("1g+me@0"), &l("1g+me@3"), &ReconfigLatency::default()).unwrap();
        assert_eq!(plan.steps[0].action, StepAction::Destroy);
        assert_eq!(apply_steps(m, &l("1g+me@0"), &plan.steps), Ok(l("1g+me@3")));
    }

    fn layouts() -> Vec<Layout> {
        let mut v = all_layouts(GpuModel::A100_40GB, ProfileSet::All);
        v.push(Layout::empty());
        v
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Applying the steps to `current` always yields `target` and never passes through an invalid layout.
        #[test]
        fn steps_reach_the_target_through_valid_layouts(i in 0usize..10_000, j in 0usize..10_000) {
            let all = layouts();
            let (from, to) = (&all[i % all.len()], &all[j % all.len()]);
            let m = GpuModel::A100_40GB;
            let plan = diff(m, from, to, &ReconfigLatency::default()).unwrap();
            prop_assert_eq!(apply_steps(m, from, &plan.steps), Ok(to.clone()), "{} -> {}", from, to);
            // Only what differs is touched.
            for s in &plan.steps {
                prop_assert!(!(from.contains(s.placement) && to.contains(s.placement)));
            }
            let changed = from.placements().iter().filter(|p| !to.contains(**p)).count()
                + to.placements().iter().filter(|p| !from.contains(**p)).count();
            prop_assert_eq!(plan.mig_operations(), changed);
        }

        /// With a tenant on every instance: only tenants whose instance goes away are disrupted, and tenants on
        /// unchanged instances appear in no step.
        #[test]
        fn only_tenants_of_removed_instances_are_disrupted(i in 0usize..10_000, j in 0usize..10_000) {
            let all = layouts();
            let (from, to) = (&all[i % all.len()], &all[j % all.len()]);
            let m = GpuModel::A100_40GB;
            let who = |p: Placement| Assignment {
                placement: p,
                tenant: tenant(&format!("t{}-{}", p.profile.nvidia_id(), p.start)),
                role: Role::Inference,
                preinit: false,
            };
            let before: Vec<Assignment> = from.placements().iter().map(|&p| who(p)).collect();
            let after: Vec<Assignment> = to.placements().iter().map(|&p| who(p)).collect();
            let plan = diff_assigned(m, from, &before, to, &after, &ReconfigLatency::default()).unwrap();
            for (t, _) in plan.disruptions.keys() {
                prop_assert!(
                    before.iter().any(|a| &a.tenant == t && !to.contains(a.placement)),
                    "{} disrupted but its instance stays", t
                );
            }
            for a in before.iter().filter(|a| to.contains(a.placement)) {
                prop_assert!(plan.steps.iter().all(|s| s.before.iter().chain(&s.after).all(|(t, _)| t != &a.tenant)));
            }
            prop_assert!(plan.steps.iter().all(|s| s.action != StepAction::Reassign));
        }
    }
}
