//! Level 1: which tenants share which GPU.
//!
//! Each tenant's **need** is estimated in compute slices ([`need`], the baselines' level 1): the slices its peak
//! forecast (the band's high side) needs at its best requests-per-slice profile, at least its smallest fitting
//! instance, plus the share of a retraining instance its due work needs over the horizon. A GPU offers 7 compute
//! slices and at most 7 instances.
//!
//! [`balanced`] (Tessera's level 1) sizes tenants as level 2 will serve them:
//! - **Inference by instance**: the compute slices of the smallest instance that serves the peak at the planner's
//!   target utilisation (level 2 serves a tenant from one instance per slot, so slices of a larger profile do not
//!   add up to an instance), 7 when none does. The fluid estimate puts two heavy tenants on one GPU as if they
//!   fitted, and level 2 can then serve neither well.
//! - **Retraining by value**: room for a due retraining is reserved only while the fleet has slices left beyond
//!   every tenant's inference, worth-most-per-slice first (weight x accuracy gain x mean forecast rate, per
//!   retraining slice). Reserving for every retraining on an over-committed fleet spreads the reservations thin
//!   and can leave the tenant whose accuracy reaches the most requests without room to retrain.
//!
//! It then places them:
//! 1. **Sticky**: a tenant stays on the GPU that serves it now when that GPU is healthy or draining. An
//!    over-committed GPU (needs above 7 slices) sheds its smallest tenants, but only to GPUs with spare slices for
//!    them: moving costs a cold start, so it is done only where it relieves a GPU without overloading another.
//!    A tenant with no instance now (its GPU's plan left it out) is placed afresh like a new one: it costs nothing
//!    to move, and it finds the GPU with the most room. Keeping it on the GPU of its last plan instead lost 4-6 % of
//!    goodput on 20 minutes of the 100-GPU Azure Functions 2019 day (12:00, seeds 1-2) and planned slower (302
//!    against 240 ms a round, seed 1), although it lets about half of the GPUs start from their last plan whole.
//! 2. **Memory-aware**: a tenant only goes where its model fits an instance (and its retraining fits, when due).
//! 3. **Load-balanced and interference-aware**: the rest, largest need first, go to the healthy GPU that minimises
//!    `load after placing + 7 x (sum of pairwise slowdowns - 1 with the tenants already there)`.
//!
//! [`given`] is the assignment MIGRator assumes (it plans one GPU with a given set of tenants): tenants stay where
//! they are, and new ones are dealt round-robin over the healthy GPUs they fit, by tenant count only.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use tessera_core::fleet::GpuHealth;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::{GpuModel, Profile};

use crate::input::PlannerInput;

pub use crate::input::Placement;

/// The level 1 `input.config.placement` names.
pub fn place(input: &PlannerInput) -> L1 {
    match input.config.placement {
        Placement::Fleet => balanced(input),
        Placement::Spread => spread(input, 7),
        Placement::RoundRobin => given(input),
    }
}

/// Puts every tenant pinned to GPUs ([`tessera_core::tenant::TenantPin::gpus`]) on one of them, after a rule has
/// placed the fleet (every policy's level 1 passes through it in [`crate::policy::plan_fleet`]): one the rule chose stays; otherwise the tenant's current GPU when it is pinned there and keeps
/// its work, else the pinned GPU that takes new work, fits its model and has the least need placed on it (fewer than
/// 7 tenants), the first of equals by id. A tenant none of whose GPUs qualifies is left unplaced, with the reason.
/// A pin overrides the balance: the GPU it lands on may be over-committed, and level 2 then serves what fits.
pub fn honour_pins(input: &PlannerInput, mut l1: L1) -> L1 {
    let current = input.current_gpus();
    for (id, t) in &input.tenants {
        let pin = &t.spec.pin;
        if pin.gpus.is_empty() {
            continue;
        }
        let placed = l1.per_gpu.iter().find(|(_, ts)| ts.contains(id)).map(|(g, _)| g.clone());
        if placed.as_ref().is_some_and(|g| pin.allows(g)) {
            continue;
        }
        if let Some(g) = &placed {
            l1.per_gpu.get_mut(g).expect("found").retain(|x| x != id);
        }
        l1.unplaced.retain(|(x, _)| x != id);
        let here = current.get(id).copied();
        let load =
            |g: &GpuId| -> f64 { l1.per_gpu[g].iter().filter_map(|o| need(input, o, input.gpus[g].model)).sum() };
        let fits = |g: &GpuId| need(input, id, input.gpus[g].model).is_some() && l1.per_gpu[g].len() < 7;
        let target = here.filter(|g| pin.allows(g) && l1.per_gpu.contains_key(*g) && fits(g)).cloned().or_else(|| {
            pin.gpus
                .iter()
                .filter(|g| l1.per_gpu.contains_key(*g) && takes_new_work(input.gpus[*g].health) && fits(g))
                .map(|g| (load(g), g))
                .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(b.1)))
                .map(|(_, g)| g.clone())
        });
        match target {
            Some(g) => {
                // `moved` counts tenants taken off the GPU that served them (where the rule kept them there).
                if placed.is_some() && placed.as_ref() == here && here != Some(&g) {
                    l1.moved += 1;
                }
                let ts = l1.per_gpu.get_mut(&g).expect("tracked");
                ts.push(id.clone());
                ts.sort();
            }
            None => l1.unplaced.push((
                id.clone(),
                format!("pinned to {pin}: none of its GPUs is in the fleet, healthy, with room and fits its model"),
            )),
        }
    }
    l1
}

/// The outcome of level 1.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct L1 {
    /// Tenants per GPU (every planned GPU appears, possibly with none).
    pub per_gpu: BTreeMap<GpuId, Vec<TenantId>>,
    /// Tenants that could not be placed, with the reason.
    pub unplaced: Vec<(TenantId, String)>,
    /// Tenants moved off the GPU that served them.
    pub moved: usize,
}

/// Compute slices `tenant` needs on a `gpu` (`None` when its model fits no instance there).
pub fn need(input: &PlannerInput, tenant: &TenantId, gpu: GpuModel) -> Option<f64> {
    let t = &input.tenants[tenant];
    let model = &input.models[&t.spec.model];
    if let Some(p) = t.spec.pin.profile {
        let slices = f64::from(pinned_slices(input, tenant, gpu, p)?);
        return Some((slices + retraining_slices(input, tenant, gpu)?).min(7.0));
    }
    let smallest = model.smallest_inference_profile(gpu)?;
    let per_slice = model.best_rps_per_slice_on(gpu, t.spec.slo_ms);
    if per_slice <= 0.0 {
        return None;
    }
    let peak = t.forecast.high.iter().copied().fold(0.0, f64::max);
    let slices = (peak / per_slice).max(f64::from(smallest.compute_slices()));
    Some((slices + retraining_slices(input, tenant, gpu)?).min(7.0))
}

/// Compute slices of a retraining instance the tenant's due work needs over the horizon (0 when none is due;
/// `None` when its retraining fits no instance of a `gpu`).
fn retraining_slices(input: &PlannerInput, tenant: &TenantId, gpu: GpuModel) -> Option<f64> {
    let t = &input.tenants[tenant];
    let left = t.retraining_left_s();
    if left <= 0.0 {
        return Some(0.0);
    }
    let model = &input.models[&t.spec.model];
    if !gpu.spec().profiles.iter().any(|p| model.fits_training(p)) {
        return None;
    }
    let horizon_s = input.config.slot_s * input.config.horizon_slots as f64;
    Some((7.0 * left / horizon_s.max(1.0)).clamp(1.0, 7.0))
}

/// Tessera's sizing of a tenant on a `gpu`: [`inference_slices`], plus [`retraining_slices`] when its retraining
/// is in `budgeted`.
fn sized(input: &PlannerInput, budgeted: &BTreeSet<TenantId>, tenant: &TenantId, gpu: GpuModel) -> Option<f64> {
    let inference = inference_slices(input, tenant, gpu)?;
    let retraining = retraining_slices(input, tenant, gpu)?;
    Some((inference + if budgeted.contains(tenant) { retraining } else { 0.0 }).min(7.0))
}

/// The due retrainings level 1 reserves room for. All of them when the slices of the GPUs that keep work (healthy or
/// draining) hold every tenant's inference and every retraining; otherwise, when the fleet is over-committed, the
/// running ones first (level 2 cannot stop them), then those worth most per slice (weight x accuracy gain x mean
/// forecast rate, per retraining slice) while the room left by inference lasts. On a mixed fleet each tenant counts
/// at its size on the GPU model where it is smallest.
///
/// Reserving room for a retraining that cannot all happen only packs heavy tenants together: a GPU then serves
/// their inference with nothing left to retrain the one whose accuracy reaches the most requests.
pub fn retraining_budget(input: &PlannerInput) -> BTreeSet<TenantId> {
    let working: Vec<GpuModel> = input.gpus.values().filter(|g| keeps_work(g.health)).map(|g| g.model).collect();
    let models = distinct(working.iter().copied());
    let smallest = |f: &dyn Fn(GpuModel) -> Option<f64>| models.iter().filter_map(|g| f(*g)).reduce(f64::min);
    let mut room = 7.0 * working.len() as f64;
    let mut due: Vec<(f64, f64, TenantId)> = Vec::new();
    let current = input.current_gpus();
    for (id, t) in &input.tenants {
        // A tenant that fits nowhere takes no room.
        let Some(inference) = smallest(&|g| inference_slices(input, id, g)) else { continue };
        room -= inference;
        let Some(r) = smallest(&|g| retraining_slices(input, id, g)).filter(|r| *r > 0.0) else { continue };
        // A running retraining keeps its instance (level 2 cannot stop it): its room is reserved first.
        let running = current
            .get(id)
            .is_some_and(|g| input.gpus[g].instance_of(id, tessera_core::plan::Role::Retraining).is_some());
        let rate = t.forecast.mean.iter().sum::<f64>() / t.forecast.mean.len().max(1) as f64;
        let gain = t.spec.weight * (t.accuracy_after_retraining() - t.accuracy).max(0.0) * rate;
        due.push((if running { f64::INFINITY } else { gain / r }, r, id.clone()));
    }
    due.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.2.cmp(&b.2)));
    let total: f64 = due.iter().map(|d| d.1).sum();
    let mut out = BTreeSet::new();
    for (_, r, id) in due {
        if total <= room + 1e-9 || r <= room + 1e-9 {
            room -= r;
            out.insert(id);
        }
    }
    out
}

/// Compute slices of the smallest instance of a `gpu` that serves the tenant's peak forecast within its SLO at the
/// planner's target utilisation (level 2 serves a tenant from one instance per slot), 7 when none does; `None`
/// when its model fits no instance there or no instance meets its SLO.
pub fn inference_slices(input: &PlannerInput, tenant: &TenantId, gpu: GpuModel) -> Option<f64> {
    let t = &input.tenants[tenant];
    if let Some(p) = t.spec.pin.profile {
        return pinned_slices(input, tenant, gpu, p).map(f64::from);
    }
    let model = &input.models[&t.spec.model];
    let peak = t.forecast.high.iter().copied().fold(0.0, f64::max);
    let mut any = false;
    let mut serving: Option<u8> = None;
    for p in gpu.spec().profiles.iter().filter(|p| p.profile != Profile::G1Me && model.fits_inference(p)) {
        let Some(c) = model.slo_capacity_on(gpu, p.profile, t.spec.slo_ms, 1.0) else { continue };
        any = true;
        let g = p.profile.compute_slices();
        if c.rps * input.config.target_utilization >= peak && serving.is_none_or(|s| g < s) {
            serving = Some(g);
        }
    }
    any.then(|| f64::from(serving.unwrap_or(7)))
}

/// Compute slices of the profile a tenant's inference is pinned to, on a `gpu`: `None` where the GPU has no such
/// profile or its model does not fit it.
fn pinned_slices(input: &PlannerInput, tenant: &TenantId, gpu: GpuModel, profile: Profile) -> Option<u8> {
    let model = &input.models[&input.tenants[tenant].spec.model];
    gpu.spec()
        .profiles
        .iter()
        .find(|p| p.profile == profile && model.fits_inference(p))
        .map(|p| p.profile.compute_slices())
}

/// The distinct GPU models of `models`, in order.
fn distinct(models: impl Iterator<Item = GpuModel>) -> Vec<GpuModel> {
    let mut out: Vec<GpuModel> = models.collect();
    out.sort();
    out.dedup();
    out
}

/// A tenant's size on every GPU model of the fleet, computed once: level 1 asks for each tenant and GPU many times
/// (on a 1,000-GPU fleet, millions of times).
struct Sizes<'a> {
    models: Vec<GpuModel>,
    by_tenant: std::collections::HashMap<&'a TenantId, Vec<Option<f64>>>,
}

impl<'a> Sizes<'a> {
    fn new(input: &'a PlannerInput, size: impl Fn(&TenantId, GpuModel) -> Option<f64>) -> Sizes<'a> {
        let models = distinct(input.gpus.values().map(|g| g.model));
        let by_tenant = input.tenants.keys().map(|id| (id, models.iter().map(|m| size(id, *m)).collect())).collect();
        Sizes { models, by_tenant }
    }

    /// Where `gpu` is among the models sizes are kept for.
    fn model_index(&self, gpu: GpuModel) -> Option<usize> {
        self.models.iter().position(|m| *m == gpu)
    }

    /// The tenant's sizes, by [`Sizes::model_index`].
    fn of(&self, tenant: &TenantId) -> Option<&[Option<f64>]> {
        self.by_tenant.get(tenant).map(Vec::as_slice)
    }

    fn get(&self, tenant: &TenantId, gpu: GpuModel) -> Option<f64> {
        self.of(tenant)?[self.model_index(gpu)?]
    }
}

fn takes_new_work(health: GpuHealth) -> bool {
    health == GpuHealth::Healthy
}

fn keeps_work(health: GpuHealth) -> bool {
    matches!(health, GpuHealth::Healthy | GpuHealth::Draining)
}

/// The tenants whose retraining runs now, on a GPU that keeps its work, with work left: each holds an instance for it
/// that level 2 cannot take back. A retraining instance of one that has finished (still in the last plan) or on a
/// failed GPU holds nothing.
fn running_retrainings(input: &PlannerInput) -> HashSet<&TenantId> {
    input
        .gpus
        .values()
        .filter(|g| keeps_work(g.health))
        .flat_map(|g| g.assignments.iter())
        .filter(|a| a.role == tessera_core::plan::Role::Retraining)
        .filter(|a| input.tenants.get(&a.tenant).is_some_and(|t| t.retraining_left_s() > 0.0))
        .map(|a| &a.tenant)
        .collect()
}

/// The instances a tenant holds for certain over the horizon, which a GPU's 7 must hold: its inference instance, and
/// its retraining's while one runs. A due retraining that has not started holds none: level 2 shares a GPU's
/// instances between inference and retraining slot by slot, and its room is reserved by compute slices
/// ([`retraining_budget`]). Counting it as a second instance for the whole horizon left tenants that fit with no
/// GPU at all: 3 of 7 on one A100 (`replay plan --synthetic --gpus 1 --tenants 7 --seed 11`), each worth a seventh
/// of the goodput.
fn instances(running: &HashSet<&TenantId>, tenant: &TenantId) -> usize {
    1 + usize::from(running.contains(tenant))
}

/// Tolerance of the placement's comparison of scores, so that ties (to rounding) go to the first GPU by position:
/// without an interference table, the first GPU within it of the least score ([`LoadIndex::least_loaded`]); with
/// one, the scan of the fleet replaces its best only with a GPU better by more than it.
const SCORE_TOLERANCE: f64 = 1e-12;

/// Room a GPU's compute slices may exceed 7 by, to rounding.
const SLICE_TOLERANCE: f64 = 1e-9;

/// The loads of the GPUs that take new work, by position, for level 1's two searches: the first GPU with room for a
/// tenant ([`LoadIndex::first_fit`]) and the least loaded after placing it ([`LoadIndex::least_loaded`]). One
/// segment tree over positions per GPU model, each node holding, for every instance count 0 to 7, the fewest compute
/// slices of a GPU below it with that count (infinity where none has). A search descends to the first position
/// whose slices pass a test that only gets harder as slices grow, so both answer in `O(8 log GPUs)` per model.
struct LoadIndex {
    /// Leaves per tree (a power of two, at least the GPUs).
    leaves: usize,
    /// Per model: `2 * leaves` nodes, the root at 1 and the leaf of position `o` at `leaves + o`.
    trees: Vec<Vec<[f64; 8]>>,
}

impl LoadIndex {
    /// No GPU takes work yet: `models` GPU models, `gpus` positions.
    fn new(models: usize, gpus: usize) -> LoadIndex {
        let leaves = gpus.next_power_of_two().max(1);
        LoadIndex { leaves, trees: vec![vec![[f64::INFINITY; 8]; 2 * leaves]; models] }
    }

    /// GPU `o` is of model `model` (`None`: it takes no new work) and holds `(slices, instances)`. Slices are
    /// finite (sums of needs of at most 7 each).
    fn set(&mut self, o: usize, model: Option<usize>, (slices, count): (f64, usize)) {
        debug_assert!(slices.is_finite(), "GPU {o} holds {slices} slices");
        for (m, tree) in self.trees.iter_mut().enumerate() {
            let mut leaf = [f64::INFINITY; 8];
            if model == Some(m) && count < 8 {
                leaf[count] = slices;
            }
            let mut at = self.leaves + o;
            if tree[at] == leaf {
                continue;
            }
            tree[at] = leaf;
            while at > 1 {
                at /= 2;
                tree[at] = std::array::from_fn(|c| tree[2 * at][c].min(tree[2 * at + 1][c]));
            }
        }
    }

    /// The fewest slices under `node` of model `m` among GPUs with room for `k` more instances.
    fn fewest(&self, m: usize, node: usize, k: usize) -> f64 {
        self.trees[m][node][..8usize.saturating_sub(k)].iter().copied().fold(f64::INFINITY, f64::min)
    }

    /// The first position at or after `from` of model `m` with room for `k` more instances whose slices pass
    /// `test` (which must fail for more slices where it fails for fewer).
    fn first(&self, m: usize, from: usize, k: usize, test: impl Fn(f64) -> bool) -> Option<usize> {
        let passes = |node: usize| {
            let s = self.fewest(m, node, k);
            s < f64::INFINITY && test(s)
        };
        if from >= self.leaves {
            return None;
        }
        // From the leaf at `from`, the subtrees to its right in order: where one fails, climb while it is a right
        // child, then step to its right sibling (past the root's right child, nothing is left).
        let mut at = self.leaves + from;
        while !passes(at) {
            while at % 2 == 1 {
                at /= 2;
                if at == 0 {
                    return None;
                }
            }
            at += 1;
        }
        while at < self.leaves {
            at = if passes(2 * at) { 2 * at } else { 2 * at + 1 };
        }
        Some(at - self.leaves)
    }

    /// The first GPU other than `skip`, by position, that takes new work and has room for `k` more instances and
    /// for the tenant's slices there (`need[m]` on model `m`; `None`: it fits no instance of that model).
    fn first_fit(&self, need: &[Option<f64>], k: usize, skip: usize) -> Option<usize> {
        let fits = |n: f64| move |s: f64| s + n <= 7.0 + SLICE_TOLERANCE;
        need.iter()
            .enumerate()
            .filter_map(|(m, n)| n.map(|n| (m, n)))
            .filter_map(|(m, n)| match self.first(m, 0, k, fits(n)) {
                Some(o) if o == skip => self.first(m, o + 1, k, fits(n)),
                other => other,
            })
            .min()
    }

    /// The GPU that takes new work, has room for `k` more instances and is the least loaded after placing the
    /// tenant there (`need[m]` on model `m`): its slices plus the tenant's, at least zero. Of those within
    /// [`SCORE_TOLERANCE`] of the least, the first by position. The scan of the fleet this replaces kept its best
    /// until a GPU beat it by more than the tolerance, which picks the same GPU unless two scores differ by between
    /// one and two tolerances: loads are sums of a few needs, so they tie exactly or to their last bits, or almost
    /// always differ by far more (a retraining's share of a GPU can be any number, so it is unlikely, not
    /// impossible).
    fn least_loaded(&self, need: &[Option<f64>], k: usize) -> Option<usize> {
        let sized = || need.iter().enumerate().filter_map(|(m, n)| n.map(|n| (m, n)));
        let score = |s: f64, n: f64| (s + n).max(0.0);
        let least = sized()
            .map(|(m, n)| score(self.fewest(m, 1, k), n))
            .filter(|s| *s < f64::INFINITY)
            .fold(f64::INFINITY, f64::min);
        if least == f64::INFINITY {
            return None;
        }
        sized().filter_map(|(m, n)| self.first(m, 0, k, |s| score(s, n) <= least + SCORE_TOLERANCE)).min()
    }
}

/// Tessera's level 1 (see the module doc).
pub fn balanced(input: &PlannerInput) -> L1 {
    let budgeted = retraining_budget(input);
    let running = running_retrainings(input);
    let sizes = Sizes::new(input, |id, gpu| sized(input, &budgeted, id, gpu));
    let mut out = L1::default();
    let mut load: BTreeMap<GpuId, (f64, usize)> = BTreeMap::new();
    for (id, g) in &input.gpus {
        if keeps_work(g.health) {
            out.per_gpu.insert(id.clone(), Vec::new());
            load.insert(id.clone(), (0.0, 0));
        }
    }
    let mut homeless: Vec<(TenantId, f64)> = Vec::new();
    // 1. Sticky.
    let mut by_gpu: BTreeMap<GpuId, Vec<(TenantId, f64)>> = BTreeMap::new();
    let current = input.current_gpus();
    for id in input.tenants.keys() {
        match current.get(id).copied().filter(|g| load.contains_key(*g)) {
            Some(g) => match sizes.get(id, input.gpus[g].model) {
                Some(n) => by_gpu.entry(g.clone()).or_default().push((id.clone(), n)),
                None => homeless.push((id.clone(), 0.0)),
            },
            None => homeless.push((id.clone(), 0.0)),
        }
    }
    for (g, mut ts) in by_gpu {
        // Keep everyone the GPU can hold by instance count; the smallest needs leave first when it cannot.
        ts.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let (mut slices, mut count) = (0.0, 0);
        for (id, n) in ts {
            let k = instances(&running, &id);
            if count + k <= 7 {
                slices += n;
                count += k;
                out.per_gpu.get_mut(&g).expect("tracked").push(id);
            } else {
                out.moved += 1;
                homeless.push((id, 0.0));
            }
        }
        load.insert(g, (slices, count));
    }
    // The GPUs that keep work, in order, with what the loops below read of them by position: a scan of the fleet
    // per tenant then reads arrays instead of looking GPUs and sizes up by name.
    let gpus: Vec<GpuId> = load.keys().cloned().collect();
    let mut loads: Vec<(f64, usize)> = load.values().copied().collect();
    let takes: Vec<bool> = gpus.iter().map(|g| takes_new_work(input.gpus[g].health)).collect();
    let model_at: &[Option<usize>] = &gpus.iter().map(|g| sizes.model_index(input.gpus[g].model)).collect::<Vec<_>>();
    // A tenant's need on the GPU at each position, its sizes looked up once.
    let need_at = |id: &TenantId| {
        let of = sizes.of(id);
        move |o: usize| of.and_then(|v| model_at[o].and_then(|k| v[k]))
    };
    // Both searches below are for the first GPU, by position, that passes a test on its slices: the index answers
    // them in `O(log GPUs)` where a scan of the fleet per tenant made level 1 quadratic (1.6 s of a 10,000-GPU round).
    // With an interference table the placement still scans (its penalty depends on who is on each GPU).
    let mut index = LoadIndex::new(sizes.models.len(), gpus.len());
    for o in 0..gpus.len() {
        index.set(o, model_at[o].filter(|_| takes[o]), loads[o]);
    }
    // Relieve over-committed GPUs: move their smallest tenants to GPUs with spare slices, only where they fit.
    for gi in 0..gpus.len() {
        let g = &gpus[gi];
        loop {
            let (slices, _) = loads[gi];
            if slices <= 7.0 + SLICE_TOLERANCE {
                break;
            }
            let mut tenants: Vec<(TenantId, f64)> =
                out.per_gpu[g].iter().filter_map(|t| need_at(t)(gi).map(|n| (t.clone(), n))).collect();
            tenants.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
            let mut moved = false;
            for (t, n_here) in tenants {
                let k = instances(&running, &t);
                let need = need_at(&t);
                // The first other GPU, by position, that takes new work and has room for the tenant's instances
                // and slices.
                let target = index.first_fit(sizes.of(&t).unwrap_or(&[]), k, gi);
                if let Some(o) = target {
                    let n = need(o).expect("checked");
                    out.per_gpu.get_mut(g).expect("tracked").retain(|x| x != &t);
                    out.per_gpu.get_mut(&gpus[o]).expect("tracked").push(t);
                    loads[gi].0 -= n_here;
                    loads[gi].1 -= k;
                    loads[o].0 += n;
                    loads[o].1 += k;
                    index.set(gi, model_at[gi].filter(|_| takes[gi]), loads[gi]);
                    index.set(o, model_at[o].filter(|_| takes[o]), loads[o]);
                    out.moved += 1;
                    moved = true;
                    break;
                }
            }
            if !moved {
                break;
            }
        }
    }
    // 2-3. Place the rest, largest need first (on any GPU model of the fleet).
    for h in &mut homeless {
        h.1 = sizes.of(&h.0).map_or(0.0, |v| v.iter().flatten().copied().fold(0.0, f64::max));
    }
    homeless.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (id, _) in homeless {
        let k = instances(&running, &id);
        let model = &input.tenants[&id].spec.model;
        let need = need_at(&id);
        let best: Option<(usize, f64)> = match &input.interference {
            // Without an interference table a GPU's score is its load after placing alone: the index finds it.
            None => index.least_loaded(sizes.of(&id).unwrap_or(&[]), k).map(|o| (o, need(o).expect("sized"))),
            // With one, the penalty depends on the tenants already on each GPU: a scan of the fleet.
            Some(x) => {
                let mut best: Option<(f64, usize, f64)> = None;
                for (o, (slices, count)) in loads.iter().enumerate() {
                    if !takes[o] || count + k > 7 {
                        continue;
                    }
                    let Some(n) = need(o) else { continue };
                    let penalty: f64 = out.per_gpu[&gpus[o]]
                        .iter()
                        .map(|other| {
                            let other = &input.tenants[other].spec.model;
                            (x.slowdown(model, other) - 1.0) + (x.slowdown(other, model) - 1.0)
                        })
                        .sum();
                    let score = (slices + n).max(0.0) + 7.0 * penalty;
                    if best.as_ref().is_none_or(|(s, _, _)| score < *s - SCORE_TOLERANCE) {
                        best = Some((score, o, n));
                    }
                }
                best.map(|(_, o, n)| (o, n))
            }
        };
        match best {
            Some((o, n)) => {
                loads[o].0 += n;
                loads[o].1 += k;
                index.set(o, model_at[o].filter(|_| takes[o]), loads[o]);
                out.per_gpu.get_mut(&gpus[o]).expect("tracked").push(id);
            }
            None => {
                let reason = if input.gpus.values().any(|g| sizes.get(&id, g.model).is_some()) {
                    "no healthy GPU has room for another instance".to_string()
                } else {
                    format!("model {model} fits no instance of any GPU in the fleet (or cannot meet its SLO)")
                };
                out.unplaced.push((id, reason));
            }
        }
    }
    for v in out.per_gpu.values_mut() {
        v.sort();
    }
    out
}

/// MIGRator's given assignment (see the module doc).
pub fn given(input: &PlannerInput) -> L1 {
    let sizes = Sizes::new(input, |id, gpu| need(input, id, gpu));
    let running = running_retrainings(input);
    let need = |_: &PlannerInput, id: &TenantId, gpu: GpuModel| sizes.get(id, gpu);
    let mut out = L1::default();
    let mut count: BTreeMap<GpuId, usize> = BTreeMap::new();
    for (id, g) in &input.gpus {
        if keeps_work(g.health) {
            out.per_gpu.insert(id.clone(), Vec::new());
            count.insert(id.clone(), 0);
        }
    }
    let mut new = Vec::new();
    let current = input.current_gpus();
    for id in input.tenants.keys() {
        match current.get(id).copied().filter(|g| count.contains_key(*g)) {
            Some(g) if need(input, id, input.gpus[g].model).is_some() => {
                *count.get_mut(g).expect("tracked") += instances(&running, id);
                out.per_gpu.get_mut(g).expect("tracked").push(id.clone());
            }
            _ => new.push(id.clone()),
        }
    }
    for id in new {
        let k = instances(&running, &id);
        let pick = count
            .iter()
            .filter(|(g, c)| {
                takes_new_work(input.gpus[*g].health)
                    && **c + k <= 7
                    && need(input, &id, input.gpus[*g].model).is_some()
            })
            .min_by_key(|(g, c)| (**c, (*g).clone()))
            .map(|(g, _)| g.clone());
        match pick {
            Some(g) => {
                *count.get_mut(&g).expect("tracked") += k;
                out.per_gpu.get_mut(&g).expect("tracked").push(id);
            }
            None => out.unplaced.push((id, "no healthy GPU it fits has room".into())),
        }
    }
    out
}

/// The level 1 of the baselines (`static`, `paris`, `ekya`, `astraea`): none of the published systems places
/// tenants across a fleet, so each gets the plain version a fleet operator would run in front of it. Tenants stay
/// on the healthy or draining GPU that serves them while it holds fewer than `per_gpu` of them; the rest, largest
/// need first, go to the healthy GPU with the least need placed so far among those with room that their model
/// fits. No interference awareness and no shedding of over-committed GPUs (those are Tessera's).
pub fn spread(input: &PlannerInput, per_gpu: usize) -> L1 {
    let sizes = Sizes::new(input, |id, gpu| need(input, id, gpu));
    let need = |_: &PlannerInput, id: &TenantId, gpu: GpuModel| sizes.get(id, gpu);
    let mut out = L1::default();
    let mut load: BTreeMap<GpuId, f64> = BTreeMap::new();
    for (id, g) in &input.gpus {
        if keeps_work(g.health) {
            out.per_gpu.insert(id.clone(), Vec::new());
            load.insert(id.clone(), 0.0);
        }
    }
    let mut rest: Vec<(TenantId, f64)> = Vec::new();
    let current = input.current_gpus();
    for id in input.tenants.keys() {
        let here = current.get(id).copied().filter(|g| load.contains_key(*g)).cloned();
        match here.and_then(|g| need(input, id, input.gpus[&g].model).map(|n| (g, n))) {
            Some((g, n)) if out.per_gpu[&g].len() < per_gpu => {
                *load.get_mut(&g).expect("tracked") += n;
                out.per_gpu.get_mut(&g).expect("tracked").push(id.clone());
            }
            Some(_) => {
                out.moved += 1;
                rest.push((id.clone(), 0.0));
            }
            None => rest.push((id.clone(), 0.0)),
        }
    }
    for r in &mut rest {
        r.1 = input.gpus.values().filter_map(|g| need(input, &r.0, g.model)).fold(0.0, f64::max);
    }
    rest.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    for (id, _) in rest {
        let pick = load
            .iter()
            .filter(|(g, _)| takes_new_work(input.gpus[*g].health) && out.per_gpu[*g].len() < per_gpu)
            .filter_map(|(g, l)| need(input, &id, input.gpus[g].model).map(|n| (g.clone(), *l, n)))
            .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
        match pick {
            Some((g, _, n)) => {
                *load.get_mut(&g).expect("tracked") += n;
                out.per_gpu.get_mut(&g).expect("tracked").push(id);
            }
            None => {
                let reason = if input.gpus.values().any(|g| need(input, &id, g.model).is_some()) {
                    format!("every healthy GPU it fits already hosts {per_gpu} tenants")
                } else {
                    format!("model {} fits no instance of any GPU in the fleet", input.tenants[&id].spec.model)
                };
                out.unplaced.push((id, reason));
            }
        }
    }
    for v in out.per_gpu.values_mut() {
        v.sort();
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::{LoadIndex, balanced};
    use crate::input::Interference;
    use crate::synthetic::{SyntheticSpec, input as synthetic, next_round};

    /// One GPU as the scans of the fleet see it: its model where it takes new work, its slices and instances.
    type Gpu = (Option<usize>, f64, usize);

    /// The scan `first_fit` replaces: the first other GPU by position with room.
    fn scan_first_fit(gpus: &[Gpu], need: &[Option<f64>], k: usize, skip: usize) -> Option<usize> {
        (0..gpus.len()).filter(|o| *o != skip).find(|o| {
            let (model, s, c) = gpus[*o];
            c + k <= 7 && model.and_then(|m| need[m]).is_some_and(|n| s + n <= 7.0 + 1e-9)
        })
    }

    /// The scan `least_loaded` replaces: the best score so far, replaced only by one better by the tolerance.
    fn scan_least_loaded(gpus: &[Gpu], need: &[Option<f64>], k: usize) -> Option<usize> {
        let mut best: Option<(f64, usize)> = None;
        for (o, &(model, s, c)) in gpus.iter().enumerate() {
            if c + k > 7 {
                continue;
            }
            let Some(n) = model.and_then(|m| need[m]) else { continue };
            let score = (s + n).max(0.0);
            if best.is_none_or(|(b, _)| score < b - 1e-12) {
                best = Some((score, o));
            }
        }
        best.map(|(_, o)| o)
    }

    /// Slices as level 1 adds them up: sums of a few needs in varying order, so that equal loads often differ in
    /// their last bits, and many GPUs tie exactly.
    fn slices(rng: &mut ChaCha8Rng) -> f64 {
        const NEEDS: [f64; 6] = [1.0, 2.0, 7.0 / 3.0, 0.1, 0.7, 3.0];
        (0..rng.random_range(0..5)).map(|_| NEEDS[rng.random_range(0..NEEDS.len())]).sum()
    }

    #[test]
    fn the_index_finds_what_the_scans_of_the_fleet_find() {
        let mut rng = ChaCha8Rng::seed_from_u64(43);
        let mut queries = [0usize; 2];
        for _ in 0..300 {
            let (n_gpus, models) = (rng.random_range(1..80), rng.random_range(1..4));
            let mut gpus: Vec<Gpu> = Vec::new();
            let mut index = LoadIndex::new(models, n_gpus);
            for o in 0..n_gpus {
                let model = (rng.random_range(0..10) > 0).then(|| rng.random_range(0..models));
                let gpu = (model, slices(&mut rng), rng.random_range(0..8));
                index.set(o, gpu.0, (gpu.1, gpu.2));
                gpus.push(gpu);
            }
            for _ in 0..60 {
                // A GPU's load changes, as a placement or a move changes it.
                let o = rng.random_range(0..n_gpus);
                gpus[o].1 = slices(&mut rng);
                gpus[o].2 = rng.random_range(0..8);
                index.set(o, gpus[o].0, (gpus[o].1, gpus[o].2));
                let need: Vec<Option<f64>> =
                    (0..models).map(|_| (rng.random_range(0..5) > 0).then(|| slices(&mut rng))).collect();
                let k = rng.random_range(1..3);
                let skip = rng.random_range(0..n_gpus);
                let fit = index.first_fit(&need, k, skip);
                assert_eq!(fit, scan_first_fit(&gpus, &need, k, skip), "first fit: {gpus:?} {need:?} k={k}");
                let least = index.least_loaded(&need, k);
                assert_eq!(least, scan_least_loaded(&gpus, &need, k), "least loaded: {gpus:?} {need:?} k={k}");
                queries[0] += usize::from(fit.is_some());
                queries[1] += usize::from(least.is_some());
            }
        }
        // Both searches found GPUs often, not just nothing.
        assert!(queries.iter().all(|q| *q > 3_000), "{queries:?}");
    }

    /// Level 1 as a whole, through the index, against the scan it replaced: an interference table of no pairs
    /// slows no one down, so its placement scores every GPU as the index does, and scans the fleet.
    #[test]
    fn level_1_places_as_the_scan_of_the_fleet_did() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
        let models = tessera_core::config::load_model_dir(&dir).expect("shipped model profiles load");
        let (mut compared, mut moved) = (0, 0);
        for (gpus, tenants, seed) in [(40, 160, 1), (25, 180, 2), (60, 150, 3)] {
            let spec = SyntheticSpec { gpus, tenants, slots: 12, gpu_model: tessera_core::GpuModel::A100_40GB, seed };
            let mut input = synthetic(&spec, &models, crate::PlannerConfig::default());
            for round in 0..3 {
                let mut scanned = input.clone();
                scanned.interference = Some(Interference::default());
                let placed = balanced(&input);
                assert_eq!(placed, balanced(&scanned), "{gpus} GPUs, {tenants} tenants, seed {seed}, round {round}");
                compared += placed.per_gpu.values().map(Vec::len).sum::<usize>();
                moved += placed.moved;
                // The next round starts from a plan: sticky tenants, over-committed GPUs to relieve, tenants the
                // plan left without an instance to place afresh.
                let crate::PlanOutcome::Planned(report) =
                    crate::by_name("tessera").expect("known").plan(&input).expect("plans")
                else {
                    panic!("the synthetic round is infeasible")
                };
                input = next_round(&input, &report.outcomes, 6, seed);
                // The tenants of every other GPU grow by 60 % and the others shrink tenfold: those GPUs become
                // over-committed, the others have room, and level 1 relieves the one onto the other.
                let hot: std::collections::BTreeSet<_> = input.gpus.keys().step_by(2).cloned().collect();
                let on = input.current_gpus().into_iter().map(|(t, g)| (t.clone(), g.clone())).collect::<Vec<_>>();
                for (t, g) in on {
                    let f = &mut input.tenants.get_mut(&t).expect("known").forecast;
                    let factor = if hot.contains(&g) { 1.6 } else { 0.1 };
                    for v in f.mean.iter_mut().chain(f.low.iter_mut()).chain(f.high.iter_mut()) {
                        *v *= factor;
                    }
                }
            }
        }
        assert!(compared > 1_000 && moved > 20, "{compared} placed, {moved} moved");
    }
}
