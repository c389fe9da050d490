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
//! 5. an unchanged instance whose tenant or role changes gets a `Reassign` step (drain and reload, no MIG call),
//!    scheduled after the make-before-break creates so that the work it displaces can move first.
//!
//! Every intermediate layout is valid (no shared slice, no profile over its count), so the steps can be executed one
//! by one with NVML and a crash between any two leaves a valid GPU.
//!
//! Time model ([`ReconfigLatency`]): MIG calls on one GPU run one after another (destroy `destroy_ms`, create
//! `create_ms`); a created instance then needs `warmup_ms` (CUDA context, model load) before it serves, which
//! overlaps the following steps. A destroy or reassignment of an instance whose work already has a replacement
//! waits until the replacement is warm: that is what make-before-break (the "pre-initialisation" of MIGRator)
//! buys. A tenant role is disrupted from the start of the first destroy or reassignment of one of its instances
//! until its last new instance is warm, or for good (`until_ms: None`) if the target gives it no new instance.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::catalog::GpuModel;
use crate::ids::TenantId;
use crate::layout::{Layout, LayoutError, Placement};
use crate::plan::{Assignment, Role};

/// How long reconfiguration operations take. The defaults are assumptions: the NVIDIA MIG User Guide gives no figure,
/// and MIGRator reports several seconds per reconfiguration on A100 (see `docs/references.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigLatency {
    /// Creating a GI and its CI.
    pub create_ms: u64,
    /// Destroying a CI and its GI.
    pub destroy_ms: u64,
    /// CUDA context and model load on a new instance before it serves. It overlaps later steps; an instance
    /// created ahead of the switch (make-before-break) hides it from its tenant.
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

/// A tenant's job on an instance.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Work {
    /// The tenant.
    pub tenant: TenantId,
    /// Its role there.
    pub role: Role,
}

/// One reconfiguration step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// What to do.
    pub action: StepAction,
    /// On which instance.
    pub placement: Placement,
    /// The work on the instance before the step (destroy, reassign).
    pub before: Vec<Work>,
    /// The work on the instance after the step (create, reassign).
    pub after: Vec<Work>,
    /// When the step starts, ms after the reconfiguration begins.
    pub start_ms: u64,
    /// How long the MIG call takes (0 for a reassignment).
    pub duration_ms: u64,
    /// When the instance serves its new work, for create and reassign steps.
    pub ready_ms: Option<u64>,
}

/// A tenant role's loss of service during a reconfiguration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Disruption {
    /// The tenant.
    pub tenant: TenantId,
    /// The role affected.
    pub role: Role,
    /// From when (ms after the reconfiguration begins) one of its instances is gone.
    pub from_ms: u64,
    /// Until its replacement is warm; `None` when the target gives it no new instance (it loses the instance for
    /// good).
    pub until_ms: Option<u64>,
}

impl Disruption {
    /// Length of the disruption, `None` if permanent.
    pub fn duration_ms(&self) -> Option<u64> {
        self.until_ms.map(|u| u - self.from_ms)
    }
}

/// The ordered steps from one layout to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconfigPlan {
    /// Steps in execution order.
    pub steps: Vec<Step>,
    /// Placements present in both layouts, never touched by a MIG call (a reassigned one is listed here and has a
    /// step).
    pub unchanged: Vec<Placement>,
    /// When the last instance serves, ms after the start.
    pub total_ms: u64,
    /// Tenant roles that lose service, ordered by tenant then role.
    pub disruptions: Vec<Disruption>,
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

    /// The disruption of `tenant` in `role`, if any.
    pub fn disruption(&self, tenant: &TenantId, role: Role) -> Option<&Disruption> {
        self.disruptions.iter().find(|d| &d.tenant == tenant && d.role == role)
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
        assignment: Assignment,
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

/// Builds the step list on a sequential MIG-call timeline.
struct Timeline<'a> {
    latency: &'a ReconfigLatency,
    clock: u64,
    steps: Vec<Step>,
    /// When each tenant role's newest instance so far is warm.
    warm_at: BTreeMap<Work, u64>,
}

impl Timeline<'_> {
    fn push(&mut self, action: StepAction, placement: Placement, before: Vec<Work>, after: Vec<Work>) {
        let duration_ms = match action {
            StepAction::Create => self.latency.create_ms,
            StepAction::Destroy => self.latency.destroy_ms,
            StepAction::Reassign => 0,
        };
        // Taking work away waits for that work's replacement, if one was made before.
        let start_ms = before.iter().filter_map(|w| self.warm_at.get(w)).fold(self.clock, |t, &w| t.max(w));
        self.clock = start_ms + duration_ms;
        let ready_ms = (action != StepAction::Destroy).then_some(self.clock + self.latency.warmup_ms);
        if let Some(ready) = ready_ms {
            for w in &after {
                self.warm_at.insert(w.clone(), ready);
            }
        }
        self.steps.push(Step { action, placement, before, after, start_ms, duration_ms, ready_ms });
    }
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
    let work = |m: &BTreeMap<Placement, Vec<Work>>, p: Placement| m.get(&p).cloned().unwrap_or_default();

    let unchanged: Vec<Placement> = current.placements().iter().copied().filter(|p| target.contains(*p)).collect();
    let mut creates: Vec<Placement> = target.placements().iter().copied().filter(|p| !current.contains(*p)).collect();
    let mut destroys: Vec<Placement> = current.placements().iter().copied().filter(|p| !target.contains(*p)).collect();
    let mut reassigns: Vec<Placement> =
        unchanged.iter().copied().filter(|&p| work(&work_before, p) != work(&work_after, p)).collect();

    let mut state = current.clone();
    let mut t = Timeline { latency, clock: 0, steps: Vec::new(), warm_at: BTreeMap::new() };
    while !creates.is_empty() || !destroys.is_empty() || !reassigns.is_empty() {
        // Make before break: every create whose slices are free goes now.
        let (ready, blocked): (Vec<Placement>, Vec<Placement>) =
            creates.iter().partition(|&&c| state.can_add(model, c));
        if !ready.is_empty() {
            for c in ready {
                state.insert(c);
                t.push(StepAction::Create, c, vec![], work(&work_after, c));
            }
            creates = blocked;
        } else if !reassigns.is_empty() {
            // After the free-slice creates, so displaced work already has somewhere to go.
            for p in std::mem::take(&mut reassigns) {
                t.push(StepAction::Reassign, p, work(&work_before, p), work(&work_after, p));
            }
        } else {
            let d = pick_destroy(model, &state, &destroys, &creates);
            destroys.retain(|&x| x != d);
            state.remove(d);
            t.push(StepAction::Destroy, d, work(&work_before, d), vec![]);
        }
    }
    debug_assert_eq!(&state, target);

    let steps = t.steps;
    let total_ms = steps.iter().map(|s| s.ready_ms.unwrap_or(s.start_ms + s.duration_ms)).max().unwrap_or(0);
    let disruptions = disruptions(&steps);
    Ok(ReconfigPlan { steps, unchanged, total_ms, disruptions })
}

fn work_map(
    which: &'static str,
    layout: &Layout,
    work: &[Assignment],
) -> Result<BTreeMap<Placement, Vec<Work>>, DiffError> {
    let mut m: BTreeMap<Placement, Vec<Work>> = BTreeMap::new();
    for a in work {
        if !layout.contains(a.placement) {
            return Err(DiffError::StrayAssignment { which, assignment: a.clone() });
        }
        m.entry(a.placement).or_default().push(Work { tenant: a.tenant.clone(), role: a.role });
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

fn disruptions(steps: &[Step]) -> Vec<Disruption> {
    // Per tenant role: when it first lost an instance, and when its last new instance became warm.
    let mut lost: BTreeMap<&Work, u64> = BTreeMap::new();
    let mut gained: BTreeMap<&Work, u64> = BTreeMap::new();
    for s in steps {
        for w in &s.before {
            if !s.after.contains(w) {
                lost.entry(w).or_insert(s.start_ms);
            }
        }
        if let Some(ready) = s.ready_ms {
            for w in &s.after {
                let e = gained.entry(w).or_insert(ready);
                *e = (*e).max(ready);
            }
        }
    }
    lost.into_iter()
        .filter_map(|(w, from_ms)| {
            let until_ms = gained.get(w).copied();
            let disrupted = until_ms.is_none_or(|u| u > from_ms);
            disrupted.then(|| Disruption { tenant: w.tenant.clone(), role: w.role, from_ms, until_ms })
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

    /// `placement` serving `t` as `role`.
    fn job(placement: &str, t: &str, role: Role) -> Assignment {
        Assignment { placement: placement.parse().unwrap(), tenant: tenant(t), role, preinit: false }
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
        let a = |p: &str, t: &str| job(p, t, Role::Inference);
        let current = [a("3g@0", "alice"), a("3g@4", "bob")];
        let target = [a("3g@0", "alice"), a("2g@4", "bob"), a("1g@6", "carol")];
        let plan =
            diff_assigned(m, &l("3g@0 3g@4"), &current, &l("3g@0 2g@4 1g@6"), &target, &ReconfigLatency::default())
                .unwrap();
        let disrupted: Vec<&str> = plan.disruptions.iter().map(|d| d.tenant.as_str()).collect();
        assert_eq!(disrupted, ["bob"]);
        let d = plan.disruption(&tenant("bob"), Role::Inference).unwrap();
        // bob's 3g@4 goes at 0; 2g@4 is created at 500..1500 and warm at 5500.
        assert_eq!((d.from_ms, d.until_ms), (0, Some(5500)));
        // The plan is JSON for operators and the wire.
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<ReconfigPlan>(&json).unwrap(), plan);
    }

    #[test]
    fn make_before_break_hides_the_warm_up() {
        let m = GpuModel::A100_40GB;
        let a = |p: &str| job(p, "t", Role::Inference);
        // The new 3g@4 is on free slices: created and warmed while 3g@0 still serves; then 3g@0 goes away.
        let plan =
            diff_assigned(m, &l("3g@0"), &[a("3g@0")], &l("3g@4"), &[a("3g@4")], &ReconfigLatency::default()).unwrap();
        assert_eq!(plan.steps[0].action, StepAction::Create);
        // The destroy waits until the replacement is warm (1000 + 4000): no disruption at all.
        assert_eq!(plan.disruption(&tenant("t"), Role::Inference), None);
        assert_eq!((plan.steps[1].action, plan.steps[1].start_ms), (StepAction::Destroy, 5000));
        assert_eq!(plan.total_ms, 5500);
    }

    #[test]
    fn a_reassignment_waits_for_the_displaced_work_to_move() {
        let m = GpuModel::A100_40GB;
        let a = |p: &str, t: &str| job(p, t, Role::Inference);
        // x moves from 3g@0 to the new 3g@4; y takes over 3g@0.
        let plan = diff_assigned(
            m,
            &l("3g@0"),
            &[a("3g@0", "x")],
            &l("3g@0 3g@4"),
            &[a("3g@0", "y"), a("3g@4", "x")],
            &ReconfigLatency::default(),
        )
        .unwrap();
        let order: Vec<String> = plan.steps.iter().map(|s| format!("{} {}", s.action, s.placement)).collect();
        assert_eq!(order, ["create 3g@4", "reassign 3g@0"]);
        assert_eq!(plan.steps[1].start_ms, 5000, "reassign waits for x's new instance to be warm");
        assert_eq!(plan.disruption(&tenant("x"), Role::Inference), None);
    }

    #[test]
    fn a_tenant_without_a_new_instance_loses_it_for_good() {
        let m = GpuModel::A100_40GB;
        let a = job("3g@4", "gone", Role::Inference);
        let plan = diff_assigned(m, &l("3g@0 3g@4"), &[a], &l("3g@0"), &[], &ReconfigLatency::default()).unwrap();
        let d = plan.disruption(&tenant("gone"), Role::Inference).unwrap();
        assert_eq!((d.from_ms, d.until_ms, d.duration_ms()), (0, None, None));
    }

    #[test]
    fn reassignment_keeps_the_instance() {
        let m = GpuModel::H100_80GB;
        let a = |t: &str, r| job("7g@0", t, r);
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
        let stray = job("1g@0", "t", Role::Inference);
        let e = diff_assigned(m, &l("7g@0"), &[stray], &l("7g@0"), &[], &ReconfigLatency::default()).unwrap_err();
        assert!(matches!(e, DiffError::StrayAssignment { which: "current", .. }));
        assert_eq!(
            e.to_string(),
            "assignment 1g@0 -> t (inference) names a placement that is not in the current layout"
        );
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

        /// Tenants drawn from a small shared pool: a tenant role whose instances and work are all kept is never
        /// disrupted and appears in no step; every disrupted role lost an instance or its work on one; a
        /// disruption ends when the role's last new instance is warm, or never if it has none.
        #[test]
        fn disruptions_are_exactly_the_roles_that_lose_an_instance(
            i in 0usize..10_000,
            j in 0usize..10_000,
            owners in prop::collection::vec((0usize..3, prop::bool::ANY), 14),
        ) {
            let all = layouts();
            let (from, to) = (&all[i % all.len()], &all[j % all.len()]);
            let m = GpuModel::A100_40GB;
            let assign = |layout: &Layout, offset: usize| -> Vec<Assignment> {
                layout
                    .placements()
                    .iter()
                    .enumerate()
                    .map(|(k, &p)| {
                        let (t, train) = owners[(k + offset) % owners.len()];
                        let role = if train { Role::Retraining } else { Role::Inference };
                        Assignment { placement: p, tenant: tenant(&format!("t{t}")), role, preinit: false }
                    })
                    .collect()
            };
            let before = assign(from, 0);
            let after = assign(to, 7);
            let plan = diff_assigned(m, from, &before, to, &after, &ReconfigLatency::default()).unwrap();
            prop_assert_eq!(apply_steps(m, from, &plan.steps), Ok(to.clone()));
            let key = |a: &Assignment| Work { tenant: a.tenant.clone(), role: a.role };
            let lost_something = |w: &Work| before.iter().any(|a| &key(a) == w && !after.contains(a));
            for d in &plan.disruptions {
                let w = Work { tenant: d.tenant.clone(), role: d.role };
                prop_assert!(lost_something(&w), "{:?} disrupted without losing anything", w);
                let gains: Vec<u64> = plan.steps.iter()
                    .filter(|s| s.after.contains(&w))
                    .filter_map(|s| s.ready_ms)
                    .collect();
                prop_assert_eq!(d.until_ms, gains.iter().copied().max(), "{:?}", d);
                prop_assert!(d.until_ms.is_none_or(|u| u > d.from_ms));
            }
            for a in &before {
                let w = key(a);
                let kept = before.iter().filter(|b| key(b) == w).all(|b| after.contains(b))
                    && after.iter().filter(|b| key(b) == w).all(|b| before.contains(b));
                if kept {
                    prop_assert!(plan.disruption(&w.tenant, w.role).is_none());
                    prop_assert!(plan.steps.iter().all(|s| !s.before.contains(&w) && !s.after.contains(&w)));
                }
            }
        }
    }
}
