//! `PlannerInput`: the pure snapshot every policy plans from, and the configuration of a planning round.
//!
//! It serialises to JSON, so the coordinator can dump the input of a round and `replay plan --input FILE`
//! re-plans it offline.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use tessera_core::fleet::GpuHealth;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::model::ModelProfile;
use tessera_core::plan::{Assignment, Role};
use tessera_core::tenant::TenantSpec;
use tessera_core::time::SimTime;
use tessera_core::{GpuModel, Layout, Profile};

use crate::error::InvalidField;
use crate::forecast::Forecast;
use crate::level2::solver::SolverConfig;

/// Settings of a planning round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlannerConfig {
    /// Slot length, seconds.
    pub slot_s: f64,
    /// Slots in the horizon.
    pub horizon_slots: usize,
    /// Dead time of an instance created on slices that were in use (destroy, create, warm up), seconds.
    pub dead_cold_s: f64,
    /// Dead time of an instance pre-initialised on free slices (only the switch), seconds.
    pub dead_preinit_s: f64,
    /// The share of an instance's SLO throughput that plans may use: capacity is planned at this fraction of the
    /// requests per second a profile serves within the SLO at full load, leaving the rest as headroom for bursts
    /// inside a slot that the planner's per-slot rates do not see (queueing there misses the SLO). Every policy
    /// plans on the same capacities (measured: `docs/performance.md`, 2026-11-25, planning constants).
    pub target_utilization: f64,
    /// MILP limits and backend.
    pub solver: SolverConfig,
    /// Level 1 of every policy but `static` ([`Placement`]).
    pub placement: Placement,
    /// Whether tessera and the perfect-forecast reference may run a tenant's retraining on its own inference
    /// instance ([`tessera_core::sharing`]; `priority` is Tally's). The baselines keep their published behaviour.
    pub sharing: tessera_core::sharing::Sharing,
    /// Seed for any randomised choice (ties are broken deterministically without it).
    pub seed: u64,
    /// Incremental rounds: how far a tenant's forecast may move, as a share of the band its GPU's last plan was made
    /// for, before the GPU is solved again (`0`: every GPU is solved every round). A GPU whose tenants' forecasts
    /// all stay within `replan_band` x their planned band (the mean, widened by that share of its distance to the
    /// band's low and high edges), on which no tenant arrived or left, no retraining became due, finished, started
    /// or stalled against the plan, whose health and instances are as planned and whose plan's horizon has not run
    /// out, keeps its last plan shifted forward ([`crate::level2::goodput`]). Policies that warm-start read it
    /// (tessera and its ablations).
    pub replan_band: f64,
}

impl Default for PlannerConfig {
    fn default() -> Self {
        PlannerConfig {
            slot_s: 10.0,
            horizon_slots: 12,
            dead_cold_s: tessera_core::serving::DEAD_COLD_S,
            dead_preinit_s: tessera_core::serving::DEAD_PREINIT_S,
            target_utilization: 0.8,
            solver: SolverConfig::default(),
            placement: Placement::Fleet,
            sharing: tessera_core::sharing::Sharing::Exclusive,
            seed: 0,
            replan_band: 1.0,
        }
    }
}

impl PlannerConfig {
    /// Checks the settings, naming the bad field.
    pub fn validate(&self) -> Result<(), InvalidField> {
        if !(self.slot_s.is_finite() && self.slot_s > 0.0) {
            return Err(InvalidField::new("config.slot_s", format!("must be > 0 (got {})", self.slot_s)));
        }
        if self.horizon_slots == 0 || self.horizon_slots > 10_000 {
            return Err(InvalidField::new(
                "config.horizon_slots",
                format!("must be in 1..=10000 (got {})", self.horizon_slots),
            ));
        }
        for (name, v) in [("dead_cold_s", self.dead_cold_s), ("dead_preinit_s", self.dead_preinit_s)] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(InvalidField::new(format!("config.{name}"), format!("must be >= 0 (got {v})")));
            }
        }
        if !(self.target_utilization > 0.0 && self.target_utilization <= 1.0) {
            return Err(InvalidField::new(
                "config.target_utilization",
                format!("must be in (0, 1] (got {})", self.target_utilization),
            ));
        }
        if !(self.replan_band.is_finite() && (0.0..=100.0).contains(&self.replan_band)) {
            return Err(InvalidField::new(
                "config.replan_band",
                format!("must be in [0, 100] (got {})", self.replan_band),
            ));
        }
        if !(self.solver.time_limit_s.is_finite() && self.solver.time_limit_s > 0.0) {
            return Err(InvalidField::new(
                "config.solver.time_limit_s",
                format!("must be > 0 (got {})", self.solver.time_limit_s),
            ));
        }
        if !(0.0..1.0).contains(&self.solver.mip_rel_gap) {
            return Err(InvalidField::new(
                "config.solver.mip_rel_gap",
                format!("must be in [0, 1) (got {})", self.solver.mip_rel_gap),
            ));
        }
        Ok(())
    }
}

/// A GPU as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInput {
    /// Model.
    pub model: GpuModel,
    /// Health: only healthy GPUs take new work; draining ones keep what they have.
    pub health: GpuHealth,
    /// The layout applied now.
    pub layout: Layout,
    /// Who works on which instance now.
    #[serde(default)]
    pub assignments: Vec<Assignment>,
    /// The previous round's level-2 result on this GPU, for policies that warm-start from it (tessera).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<WarmStart>,
    /// Each profile's memory as this GPU's driver reports it, GiB, where it differs from the catalog (empty: the
    /// catalog's): level 2 decides what fits an instance with it ([`GpuInput::profile_spec`]).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub memory_gib: std::collections::BTreeMap<tessera_core::Profile, f64>,
}

/// A GPU's level-2 result from a previous round, which the next round shifts onto its own slots: its plan is a
/// start for the search and its prices a start for the bound. Planning from it is no less exact: the plan is
/// only a candidate (checked and improved under this round's problem), the prices only a first Lagrangian bound
/// (valid at any prices), and a warm start that does not fit (other tenants, another slot length, a retraining
/// that is no longer an option) is used as far as it fits. Replay and the coordinator's leader pass each GPU the
/// one its last plan produced ([`crate::PlanReport::warm_starts`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmStart {
    /// Workload time of its slot 0.
    pub at: SimTime,
    /// Its slot length, seconds.
    pub slot_s: f64,
    /// Each tenant's plan.
    pub tenants: Vec<WarmTenant>,
    /// Per slot, the prices of the GPU's capacity rows at the best bound (see
    /// [`crate::level2::cg::WarmSolved::prices`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prices: Vec<Vec<f64>>,
    /// The GPU's health when the plan was made (incremental rounds solve a GPU whose health changed again).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<GpuHealth>,
}

/// One tenant's part of a [`WarmStart`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmTenant {
    /// The tenant.
    pub id: TenantId,
    /// Its inference profile per slot.
    pub inference: Vec<Option<Profile>>,
    /// Its retraining: profile, first slot and the slot after the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retraining: Option<(Profile, usize, usize)>,
    /// What the tenant's plan was made for, where the policy plans incrementally ([`PlannerConfig::replan_band`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_for: Option<PlannedFor>,
}

/// What one tenant's part of a plan was made for: the inputs that, moved beyond the band, call a new solve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannedFor {
    /// The forecast over the plan's slots.
    pub forecast: Forecast,
    /// Whether a retraining was due.
    pub retraining_due: bool,
    /// The epochs of that retraining, where a plan had chosen them ([`TenantInput::retraining_epochs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retraining_epochs: Option<f64>,
}

impl WarmStart {
    /// Checks the shape (every tenant and the prices cover the same slots), naming the first problem.
    pub fn validate(&self) -> Result<(), InvalidField> {
        if !(self.slot_s.is_finite() && self.slot_s > 0.0) {
            return Err(InvalidField::new("slot_s", format!("must be > 0 (got {})", self.slot_s)));
        }
        let slots = self.tenants.first().map_or(self.prices.len(), |t| t.inference.len());
        if let Some(t) = self.tenants.iter().find(|t| t.inference.len() != slots) {
            return Err(InvalidField::new(
                format!("tenants.{}.inference", t.id),
                format!("has {} slots, not {slots}", t.inference.len()),
            ));
        }
        if !self.prices.is_empty() && self.prices.len() != slots {
            return Err(InvalidField::new("prices", format!("has {} slots, not {slots}", self.prices.len())));
        }
        if self.prices.iter().flatten().any(|v| !v.is_finite()) {
            return Err(InvalidField::new("prices", "must be finite"));
        }
        for t in &self.tenants {
            let Some(p) = &t.planned_for else { continue };
            let f = &p.forecast;
            if f.mean.len() != slots || f.low.len() != slots || f.high.len() != slots {
                return Err(InvalidField::new(
                    format!("tenants.{}.planned_for.forecast", t.id),
                    format!("does not cover the {slots} slots"),
                ));
            }
            if f.mean.iter().chain(&f.low).chain(&f.high).any(|v| !v.is_finite()) {
                return Err(InvalidField::new(
                    format!("tenants.{}.planned_for.forecast", t.id),
                    "rates must be finite",
                ));
            }
        }
        Ok(())
    }
}

impl GpuInput {
    /// What this GPU says about `profile`: the catalog's entry, with the driver's memory where the node reported it.
    pub fn profile_spec(&self, profile: tessera_core::Profile) -> Option<tessera_core::catalog::ProfileSpec> {
        let mut spec = *self.model.profile(profile)?;
        if let Some(gib) = self.memory_gib.get(&profile) {
            spec.memory_gib = *gib;
        }
        Some(spec)
    }

    /// The tenant's instance in `role` here, if any.
    pub fn instance_of(&self, tenant: &TenantId, role: Role) -> Option<&Assignment> {
        self.assignments.iter().find(|a| &a.tenant == tenant && a.role == role)
    }
}

/// A tenant as the planner sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantInput {
    /// The spec.
    pub spec: TenantSpec,
    /// Forecast arrival rate per slot of the horizon, with its band.
    pub forecast: Forecast,
    /// The true future arrival rate per slot: only the `perfect-forecast` reference reads it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual: Option<Vec<f64>>,
    /// Accuracy of the model serving now.
    pub accuracy: f64,
    /// Whether a retraining is due in this window (fresh data arrived and it has not completed yet).
    #[serde(default)]
    pub retraining_due: bool,
    /// Work already done on the due retraining, 7g GPU-seconds.
    #[serde(default)]
    pub retraining_done_gpu_s: f64,
    /// Epochs of the due retraining, as the latest plan that gave the tenant a retraining instance chose them
    /// (`GpuPlan::retraining_epochs`); `None`: the spec's default. Its work and the accuracy it reaches follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retraining_epochs: Option<f64>,
}

impl TenantInput {
    /// Epochs of the due retraining ([`TenantInput::retraining_epochs`], else the spec's; 0 without retraining).
    pub fn epochs(&self) -> f64 {
        self.spec.retraining.as_ref().map_or(0.0, |r| self.retraining_epochs.unwrap_or(r.epochs))
    }

    /// Work left on the due retraining at its epochs (0 when none is due).
    pub fn retraining_left_s(&self) -> f64 {
        match (&self.spec.retraining, self.retraining_due) {
            (Some(r), true) => (r.work_for_epochs(self.epochs()) - self.retraining_done_gpu_s).max(0.0),
            _ => 0.0,
        }
    }

    /// Accuracy once the due retraining completes, at its epochs.
    pub fn accuracy_after_retraining(&self) -> f64 {
        self.spec.retraining.as_ref().map_or(self.accuracy, |r| r.accuracy_after(self.epochs()))
    }
}

/// Slowdown of a tenant's model when co-located with another model on one GPU (shared L3 TLB and memory
/// system), as measured by the TLB model (`sim-agent interference`) or on hardware. Missing pairs mean no slowdown.
///
/// Level 1 of tessera keeps tenants that slow each other down apart, level 2 plans each tenant with its largest
/// slowdown against the tenants it shares the GPU with, and PARIS sizes its instances with the same factors.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interference {
    /// How the table was made (free text, for the record: e.g. the command that printed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// `(victim model, aggressor model, latency multiplier >= 1)`.
    pub pairs: Vec<(String, String, f64)>,
}

/// The most pairs an [`Interference`] table may hold (100 models, every ordered pair).
pub const MAX_INTERFERENCE_PAIRS: usize = 10_000;

/// The largest latency multiplier an [`Interference`] table may give (a tenant 100 times slower is a measurement
/// error, not a co-location).
pub const MAX_SLOWDOWN: f64 = 100.0;

impl Interference {
    /// The multiplier on `victim`'s latency when it shares a GPU with `aggressor`.
    pub fn slowdown(&self, victim: &str, aggressor: &str) -> f64 {
        self.pairs.iter().find(|(v, a, _)| v == victim && a == aggressor).map_or(1.0, |(_, _, s)| s.max(1.0))
    }

    /// Checks the table, naming the first bad pair (`pairs[i]`): at most [`MAX_INTERFERENCE_PAIRS`] pairs, model
    /// names not empty, each ordered pair once, multipliers finite and in `[1, MAX_SLOWDOWN]`.
    pub fn validate(&self) -> Result<(), InvalidField> {
        if self.pairs.len() > MAX_INTERFERENCE_PAIRS {
            return Err(InvalidField::new(
                "pairs",
                format!("{} pairs, at most {MAX_INTERFERENCE_PAIRS}", self.pairs.len()),
            ));
        }
        let mut seen = std::collections::HashSet::with_capacity(self.pairs.len());
        for (i, (v, a, s)) in self.pairs.iter().enumerate() {
            if v.is_empty() || a.is_empty() {
                return Err(InvalidField::new(format!("pairs[{i}]"), "a model name is empty"));
            }
            if !(s.is_finite() && (1.0..=MAX_SLOWDOWN).contains(s)) {
                return Err(InvalidField::new(
                    format!("pairs[{i}]"),
                    format!("multiplier {s} of {v} next to {a} is not in [1, {MAX_SLOWDOWN}]"),
                ));
            }
            if !seen.insert((v.as_str(), a.as_str())) {
                return Err(InvalidField::new(format!("pairs[{i}]"), format!("{v} next to {a} is given twice")));
            }
        }
        Ok(())
    }
}

/// Everything a policy may look at.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlannerInput {
    /// The epoch the plan will carry.
    pub epoch: u64,
    /// Workload time of the round.
    pub now: SimTime,
    /// Round settings.
    #[serde(default)]
    pub config: PlannerConfig,
    /// Model profiles by name.
    pub models: BTreeMap<String, ModelProfile>,
    /// The fleet.
    pub gpus: BTreeMap<GpuId, GpuInput>,
    /// Active tenants.
    pub tenants: BTreeMap<TenantId, TenantInput>,
    /// Pairwise interference, when known.
    #[serde(default)]
    pub interference: Option<Interference>,
}

impl PlannerInput {
    /// Checks references and shapes, naming the first problem (a bad input is an error, not an infeasible plan).
    pub fn validate(&self) -> Result<(), InvalidField> {
        self.config.validate()?;
        if let Some(x) = &self.interference {
            x.validate().map_err(|e| e.within("interference"))?;
        }
        for (id, t) in &self.tenants {
            if !self.models.contains_key(&t.spec.model) {
                return Err(InvalidField::new(
                    format!("tenants.{id}.spec.model"),
                    format!("unknown model {:?}", t.spec.model),
                ));
            }
            if &t.spec.id != id {
                return Err(InvalidField::new(
                    format!("tenants.{id}.spec.id"),
                    format!("{} does not match its key", t.spec.id),
                ));
            }
            let f = &t.forecast;
            if f.mean.len() != f.low.len() || f.mean.len() != f.high.len() {
                return Err(InvalidField::new(format!("tenants.{id}.forecast"), "mean, low and high differ in length"));
            }
            let bad = |v: &[f64]| v.iter().any(|x| !x.is_finite() || *x < 0.0);
            if bad(&f.mean) || bad(&f.low) || bad(&f.high) {
                return Err(InvalidField::new(format!("tenants.{id}.forecast"), "rates must be finite and >= 0"));
            }
            if let Some(a) = &t.actual
                && bad(a)
            {
                return Err(InvalidField::new(format!("tenants.{id}.actual"), "rates must be finite and >= 0"));
            }
            if !(0.0..=1.0).contains(&t.accuracy) {
                return Err(InvalidField::new(
                    format!("tenants.{id}.accuracy"),
                    format!("must be in [0, 1] (got {})", t.accuracy),
                ));
            }
            if let Some(e) = t.retraining_epochs
                && !(e.is_finite() && e > 0.0)
            {
                return Err(InvalidField::new(
                    format!("tenants.{id}.retraining_epochs"),
                    format!("must be finite and > 0 (got {e})"),
                ));
            }
        }
        for (gpu, g) in &self.gpus {
            g.layout.validate(g.model).map_err(|e| InvalidField::new(format!("gpus.{gpu}.layout"), e.to_string()))?;
            if let Some(w) = &g.warm {
                w.validate().map_err(|e| e.within(&format!("gpus.{gpu}.warm")))?;
            }
            for a in &g.assignments {
                if !g.layout.contains(a.placement) {
                    return Err(InvalidField::new(
                        format!("gpus.{gpu}.assignments"),
                        format!("{a} is not in the layout"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Tenant `id`'s current GPU: where its inference (else its retraining) instance is.
    pub fn current_gpu(&self, id: &TenantId) -> Option<&GpuId> {
        let find = |role| self.gpus.iter().find(|(_, g)| g.instance_of(id, role).is_some()).map(|(k, _)| k);
        find(Role::Inference).or_else(|| find(Role::Retraining))
    }

    /// [`PlannerInput::current_gpu`] of every tenant that has one, in one pass over the GPUs (level 1 asks for
    /// each tenant; asking [`PlannerInput::current_gpu`] each time scans the whole fleet per tenant).
    pub fn current_gpus(&self) -> HashMap<&TenantId, &GpuId> {
        let mut inference: HashMap<&TenantId, &GpuId> = HashMap::new();
        let mut retraining: HashMap<&TenantId, &GpuId> = HashMap::new();
        for (gpu, g) in &self.gpus {
            for a in &g.assignments {
                let by_role = if a.role == Role::Inference { &mut inference } else { &mut retraining };
                by_role.entry(&a.tenant).or_insert(gpu);
            }
        }
        for (t, g) in retraining {
            inference.entry(t).or_insert(g);
        }
        inference
    }
}

/// Which level 1 the policies that plan one GPU at a time (MIGRator, PARIS+ELSA, Ekya, Astraea) run in front of
/// their per-GPU level 2, and tessera's own. None of the published per-GPU systems places tenants across a fleet, so
/// by default every policy gets tessera's fleet level 1: the comparison is then between level-2 policies. The
/// others are there for studies that vary the placement on purpose (`--placement`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Placement {
    /// [`crate::assign::balanced`]: sticky, memory-aware, demand-balanced, interference-aware.
    #[default]
    Fleet,
    /// [`crate::assign::spread`] with at most 7 tenants a GPU: sticky, largest need first onto the least-loaded GPU.
    Spread,
    /// [`crate::assign::given`]: sticky, new tenants round-robin by instance count, demand-blind.
    RoundRobin,
}

impl Placement {
    /// Every rule, by its name.
    pub const ALL: [(&'static str, Placement); 3] =
        [("fleet", Placement::Fleet), ("spread", Placement::Spread), ("round-robin", Placement::RoundRobin)];

    /// Its name.
    pub fn name(self) -> &'static str {
        Self::ALL.iter().find(|(_, p)| *p == self).map_or("fleet", |(n, _)| n)
    }
}

impl std::str::FromStr for Placement {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, p)| *p)
            .ok_or_else(|| format!("unknown placement {s:?} (expected {})", Self::ALL.map(|(n, _)| n).join(", ")))
    }
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
