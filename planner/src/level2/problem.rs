//! The per-GPU planning problem (level 2), shared by every solver and policy.
//!
//! A GPU hosts a few tenants over a horizon of `slots` slots of `slot_s` seconds. In each slot every tenant may hold
//! one **inference** instance and one **retraining** instance (as in MIGRator: at most one placement per
//! task per slot). A tenant's inference instance of profile `p` serves up to `cap[p]` requests per second within its
//! SLO; in a slot where the instance is new it loses the reconfiguration dead time first. A retraining, once started,
//! keeps its instance until its work is done (non-preemptive) and from the next slot on the tenant's requests are
//! served by the new model, with accuracy `acc_new` instead of `acc_old`. The objective is goodput: the sum over
//! tenants and slots of `weight x accuracy x requests served within SLO`, where requests served are
//! `min(arrivals, capacity)` (an expectation over arrival scenarios when a forecast band is given).
//!
//! Retraining choices are enumerated as **options** `(profile, start slot)` whose end follows from the remaining work
//! and the profile's speed: non-preemption holds by construction, and the solvers never need a big-M progress
//! constraint. Horizons longer than 30 slots offer starts every [`GpuProblem::start_step`] slots. Only options that
//! finish before the horizon's last slot earn anything within it, so only those are offered (also offering those
//! that end with the horizon, for their [`TenantTask::tail_value`] alone, was measured: +0.3 % on the Azure Functions
//! 2019 day, -5.2 % on the Azure LLM 2023 code trace); a retraining already running continues on its instance (it
//! is a fixed option starting at slot 0).
//!
//! The dead time of a new instance is `dead_preinit_s` when it can be created and warmed on free slices before the
//! switch (make-before-break) and `dead_cold_s` otherwise; both are capped at one slot (the model does not carry
//! dead time into the next slot). At the level of counts, the new inference instances of a slot can be
//! pre-initialised together when they fit beside everything the previous slot ran ([`Usage`]); the count-level
//! objective picks the best such set ([`GpuProblem::slot_value`]), [`crate::level2::evaluate`] charges placed schedules
//! by their actual slices.

// Model building indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use serde::{Deserialize, Serialize};
use tessera_core::enumerate::ProfileSet;
use tessera_core::ids::TenantId;
use tessera_core::{GpuModel, Layout, Placement, Profile};

/// One arrival scenario: a probability and a rate per slot (requests per second).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scenario {
    /// Probability weight (the scenarios of a tenant sum to 1).
    pub prob: f64,
    /// Arrival rate per slot, requests per second.
    pub rate: Vec<f64>,
}

/// A tenant's retraining task on this GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RetrainTask {
    /// Work left, in 7g-seconds of the reference GPU.
    pub work_s: f64,
    /// Work per second on each of the problem's profiles (0 where the job does not fit).
    pub speed: Vec<f64>,
    /// The instance of a retraining already running: it keeps it (non-preemptive).
    pub running_on: Option<Placement>,
}

/// A tenant as level 2 sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantTask {
    /// The tenant.
    pub id: TenantId,
    /// Objective weight.
    pub weight: f64,
    /// Arrival scenarios (one for a point forecast or the truth).
    pub scenarios: Vec<Scenario>,
    /// Requests per second served within SLO on each of the problem's profiles (0: the model does not fit or
    /// misses the SLO there).
    pub cap: Vec<f64>,
    /// Accuracy of the deployed model.
    pub acc_old: f64,
    /// Accuracy once the pending retraining completes.
    pub acc_new: f64,
    /// Pending retraining, if any.
    pub retrain: Option<RetrainTask>,
    /// Goodput that completing the pending retraining within the horizon earns after it, for the time its
    /// accuracy lasts (a planning value, added to the objective once per completed retraining; the reported
    /// goodput counts the horizon alone). 0 for a policy that values the horizon only.
    #[serde(default)]
    pub tail_value: f64,
    /// The tenant's inference instance now, if it has one on this GPU.
    pub current_inference: Option<Placement>,
    /// Its retraining may run on its inference instance instead ([`tessera_core::sharing`]).
    #[serde(default)]
    pub shared: Option<SharedTask>,
}

/// How a tenant's inference instance serves when its retraining runs beside it ([`tessera_core::sharing`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharedTask {
    /// The sharing mode.
    pub mode: tessera_core::sharing::Sharing,
    /// Requests per second within SLO on each profile when shared (0 where the instance does not hold inference
    /// and retraining together, or misses the SLO).
    pub cap: Vec<f64>,
    /// Requests per batch at that capacity, per profile.
    pub batch: Vec<f64>,
    /// Latency of that batch, ms, per profile.
    pub batch_ms: Vec<f64>,
    /// Training within that batch's latency, ms, per profile (time-slice mode).
    pub batch_train_ms: Vec<f64>,
    /// The sharing parameters.
    pub params: tessera_core::sharing::ShareParams,
}

impl SharedTask {
    /// Training's share of a shared instance of profile `p` serving `served` requests in a slot of `slot_s`
    /// seconds ([`tessera_core::sharing::ShareParams::train_share`]: full batches at the shared capacity).
    pub fn train_share(&self, p: usize, served: f64, slot_s: f64) -> f64 {
        let (batch, batch_ms) = (self.batch[p], self.batch_ms[p]);
        if self.cap[p] <= 0.0 || batch <= 0.0 {
            return 0.0;
        }
        let period_ms = slot_s * 1000.0;
        let batches = served / batch;
        let busy_ms = (batches * batch_ms).min(period_ms);
        let in_batch = (batches * self.batch_train_ms[p]).min(busy_ms);
        self.params.train_share(self.mode, period_ms, busy_ms, batches, in_batch)
    }
}

/// A retraining option: run on `profile` (index into [`GpuProblem::profiles`]) from slot `start` (inclusive) to
/// `end` (exclusive); the new model serves from slot `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RetrainOption {
    /// Profile index.
    pub profile: usize,
    /// First slot.
    pub start: usize,
    /// One past the last slot.
    pub end: usize,
}

impl RetrainOption {
    /// Whether the option occupies its instance in `slot`.
    pub fn active(&self, slot: usize) -> bool {
        self.start <= slot && slot < self.end
    }
}

/// Slices and instances in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// Compute slices.
    pub compute: u32,
    /// Memory slices.
    pub memory: u32,
    /// Instances.
    pub instances: u32,
    /// Instances per profile (over the problem's profiles).
    pub counts: Vec<u8>,
}

/// The level-2 problem of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuProblem {
    /// The GPU model.
    pub gpu: GpuModel,
    /// Number of slots.
    pub slots: usize,
    /// Slot length, seconds.
    pub slot_s: f64,
    /// Dead time of an instance created while its slices were in use, seconds.
    pub dead_cold_s: f64,
    /// Dead time of an instance pre-initialised on free slices, seconds.
    pub dead_preinit_s: f64,
    /// The profiles tenants may use, in catalogue order.
    pub profiles: Vec<Profile>,
    /// The tenants.
    pub tenants: Vec<TenantTask>,
    /// The layout on the GPU now (instances of tenants not in the problem are kept out of the plan).
    pub current: Layout,
}

impl GpuProblem {
    /// The profiles of `gpu` that a planner considers: the classic ones and the double-memory 1g.
    pub fn candidate_profiles(gpu: GpuModel) -> Vec<Profile> {
        ProfileSet::WithDoubleMemory.profiles().iter().copied().filter(|p| gpu.profile(*p).is_some()).collect()
    }

    /// Whether instances with these counts (over `profiles`) fit one GPU of model `gpu`.
    ///
    /// On every catalogued GPU the valid layouts' count vectors are exactly the integer points with at most 7
    /// compute slices, at most 8 memory slices, at most 7 instances and each profile within its maximum count:
    /// the placement rules add no further restriction at the level of counts (checked against the enumeration of
    /// every layout by a test). This is what lets level 2 decide counts with four linear rows per slot.
    pub fn fits(gpu: GpuModel, profiles: &[Profile], counts: &[u8]) -> bool {
        let mut compute = 0u32;
        let mut memory = 0u32;
        let mut instances = 0u32;
        for (p, c) in profiles.iter().zip(counts) {
            let c = u32::from(*c);
            if c == 0 {
                continue; // (no catalogue lookup for the profiles not used, most of them in most checks)
            }
            if c > u32::from(gpu.profile(*p).map_or(0, |s| s.max_count)) {
                return false;
            }
            compute += c * u32::from(p.compute_slices());
            memory += c * u32::from(p.memory_slices());
            instances += c;
        }
        compute <= 7 && memory <= 8 && instances <= 7
    }

    /// Whether `counts` (over the problem's profiles) fits the GPU.
    pub fn counts_feasible(&self, counts: &[u8]) -> bool {
        Self::fits(self.gpu, &self.profiles, counts)
    }

    /// What the current layout uses.
    pub fn current_usage(&self) -> Usage {
        Usage {
            compute: u32::from(self.current.compute_slices_used()),
            memory: self.current.memory_mask().count_ones(),
            instances: self.current.len() as u32,
            counts: self.profiles.iter().map(|p| self.current.count(*p) as u8).collect(),
        }
    }

    /// What instances with `counts` (over the problem's profiles) use.
    pub fn usage_of(&self, counts: &[u8]) -> Usage {
        let mut u = Usage { compute: 0, memory: 0, instances: 0, counts: counts.to_vec() };
        for (p, c) in counts.iter().enumerate() {
            let c = u32::from(*c);
            u.compute += c * u32::from(self.compute_slices(p));
            u.memory += c * u32::from(self.memory_slices(p));
            u.instances += c;
        }
        u
    }

    /// Whether new instances of these profiles fit beside `before` (so they can be pre-initialised).
    pub fn fits_beside(&self, before: &Usage, new: impl IntoIterator<Item = usize>) -> bool {
        let mut u = before.clone();
        for p in new {
            u.compute += u32::from(self.compute_slices(p));
            u.memory += u32::from(self.memory_slices(p));
            u.instances += 1;
            u.counts[p] += 1;
        }
        u.compute <= 7
            && u.memory <= 8
            && u.instances <= 7
            && u.counts.iter().enumerate().all(|(p, c)| *c <= self.max_count(p))
    }

    /// What retraining option `o` of tenant `i` earns beyond the horizon ([`TenantTask::tail_value`] when it
    /// completes within the horizon).
    pub fn tail_value(&self, i: usize, o: Option<RetrainOption>) -> f64 {
        o.filter(|o| o.end <= self.slots).map_or(0.0, |_| self.tenants[i].tail_value)
    }

    /// Goodput of tenant `i` in `slot` on profile `p` after `dead` seconds of dead time, at accuracy `acc`.
    pub fn tenant_value(&self, i: usize, slot: usize, p: usize, dead: f64, acc: f64) -> f64 {
        let t = &self.tenants[i];
        let capacity = t.cap[p] * (self.slot_s - dead.min(self.slot_s));
        t.scenarios
            .iter()
            .map(|s| t.weight * s.prob * acc * (s.rate.get(slot).copied().unwrap_or(0.0) * self.slot_s).min(capacity))
            .sum()
    }

    /// Goodput of `slot` when tenants move from inference profiles `prev` to `cur`, the previous slot used
    /// `before`, and `done(i)` says whether tenant `i`'s retraining has completed. New instances are
    /// pre-initialised as a group that fits beside `before`, the best such group (exhaustively: at most seven).
    pub fn slot_value(
        &self,
        slot: usize,
        prev: &[Option<usize>],
        cur: &[Option<usize>],
        before: &Usage,
        done: impl Fn(usize) -> bool,
    ) -> f64 {
        let acc = |i: usize| if done(i) { self.tenants[i].acc_new } else { self.tenants[i].acc_old };
        let mut base = 0.0;
        let mut fresh: Vec<(usize, usize, f64)> = Vec::new();
        for (i, c) in cur.iter().enumerate() {
            let Some(p) = *c else { continue };
            if prev[i] == Some(p) {
                base += self.tenant_value(i, slot, p, 0.0, acc(i));
            } else {
                let cold = self.tenant_value(i, slot, p, self.dead_cold_s, acc(i));
                let warm = self.tenant_value(i, slot, p, self.dead_preinit_s, acc(i));
                base += cold;
                fresh.push((i, p, warm - cold));
            }
        }
        let mut best = 0.0f64;
        for mask in 1u32..(1 << fresh.len()) {
            let chosen = fresh.iter().enumerate().filter(|(k, _)| mask & (1 << k) != 0);
            let gain: f64 = chosen.clone().map(|(_, f)| f.2).sum();
            if gain > best && self.fits_beside(before, chosen.map(|(_, f)| f.1)) {
                best = gain;
            }
        }
        base + best
    }

    /// Memory slices of profile index `p`.
    pub fn memory_slices(&self, p: usize) -> u8 {
        self.profiles[p].memory_slices()
    }

    /// Maximum count of profile index `p` on the GPU.
    pub fn max_count(&self, p: usize) -> u8 {
        self.gpu.profile(self.profiles[p]).map_or(0, |s| s.max_count)
    }

    /// Index of `profile` in [`GpuProblem::profiles`].
    pub fn profile_index(&self, profile: Profile) -> Option<usize> {
        self.profiles.iter().position(|p| *p == profile)
    }

    /// Compute slices of profile index `p`.
    pub fn compute_slices(&self, p: usize) -> u8 {
        self.profiles[p].compute_slices()
    }

    /// The retraining options of tenant `i`: every (profile, start) that finishes within the horizon, or the
    /// running job's fixed option. Empty when the tenant has nothing to retrain or retraining would not help.
    pub fn retrain_options(&self, i: usize) -> Vec<RetrainOption> {
        let t = &self.tenants[i];
        let Some(r) = &t.retrain else { return Vec::new() };
        if let Some(running) = r.running_on {
            let Some(p) = self.profile_index(running.profile) else { return Vec::new() };
            let end = self.slots_needed(r, p).map_or(usize::MAX, |d| d);
            return vec![RetrainOption { profile: p, start: 0, end: end.min(self.slots + 1) }];
        }
        if t.acc_new <= t.acc_old {
            return Vec::new();
        }
        let mut out = Vec::new();
        let step = self.start_step();
        for p in 0..self.profiles.len() {
            let Some(d) = self.slots_needed(r, p) else { continue };
            for start in (0..self.slots).step_by(step) {
                if start + d < self.slots {
                    out.push(RetrainOption { profile: p, start, end: start + d });
                }
            }
        }
        out
    }

    /// Retraining may start every this many slots: every slot up to 30 slots, then spaced so that about 30 start
    /// times cover the horizon (a 200-slot horizon starts retraining every 7 slots).
    pub fn start_step(&self) -> usize {
        self.slots.div_ceil(30).max(1)
    }

    /// Slots a retraining needs on profile index `p` (at least one), `None` where it cannot run.
    fn slots_needed(&self, r: &RetrainTask, p: usize) -> Option<usize> {
        let speed = r.speed.get(p).copied().unwrap_or(0.0);
        if speed <= 0.0 {
            return None;
        }
        let slots = (r.work_s / (speed * self.slot_s) - 1e-9).ceil().max(1.0);
        (slots < 1e6).then_some(slots as usize)
    }

    /// Drops profiles no tenant can use (smaller models, same optimum). Instances of dropped profiles in the
    /// current layout still count against pre-initialisation room through [`GpuProblem::current_usage`].
    pub fn prune_profiles(&mut self) {
        let used: Vec<bool> = (0..self.profiles.len())
            .map(|p| {
                self.tenants.iter().any(|t| {
                    t.cap[p] > 0.0
                        || t.retrain.as_ref().is_some_and(|r| {
                            r.speed[p] > 0.0 || r.running_on.is_some_and(|pl| pl.profile == self.profiles[p])
                        })
                })
            })
            .collect();
        if used.iter().all(|u| *u) {
            return;
        }
        let keep: Vec<usize> = (0..self.profiles.len()).filter(|p| used[*p]).collect();
        self.profiles = keep.iter().map(|p| self.profiles[*p]).collect();
        for t in &mut self.tenants {
            t.cap = keep.iter().map(|p| t.cap[*p]).collect();
            if let Some(sh) = &mut t.shared {
                sh.cap = keep.iter().map(|p| sh.cap[*p]).collect();
                sh.batch = keep.iter().map(|p| sh.batch[*p]).collect();
                sh.batch_ms = keep.iter().map(|p| sh.batch_ms[*p]).collect();
                sh.batch_train_ms = keep.iter().map(|p| sh.batch_train_ms[*p]).collect();
            }
            if let Some(r) = &mut t.retrain {
                r.speed = keep.iter().map(|p| r.speed[*p]).collect();
            }
        }
    }
}

/// A count-level schedule: per slot, each tenant's inference profile (index), and each tenant's retraining option.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Schedule {
    /// `inference[t][i]`: tenant `i`'s inference profile in slot `t`.
    pub inference: Vec<Vec<Option<usize>>>,
    /// Tenant `i`'s retraining option.
    pub retrain: Vec<Option<RetrainOption>>,
}

impl Schedule {
    /// An empty schedule (nothing runs).
    pub fn empty(slots: usize, tenants: usize) -> Schedule {
        Schedule { inference: vec![vec![None; tenants]; slots], retrain: vec![None; tenants] }
    }

    /// Profile counts of slot `t` over `profiles` profiles.
    pub fn counts(&self, t: usize, profiles: usize) -> Vec<u8> {
        let mut c = vec![0u8; profiles];
        for p in self.inference[t].iter().flatten() {
            c[*p] += 1;
        }
        for o in self.retrain.iter().flatten() {
            if o.active(t) {
                c[o.profile] += 1;
            }
        }
        c
    }

    /// The count-level objective of this schedule (see [`GpuProblem::slot_value`]), with the tail value of the
    /// retrainings it completes ([`GpuProblem::tail_value`]).
    pub fn objective(&self, pb: &GpuProblem) -> f64 {
        let mut total: f64 = self.retrain.iter().enumerate().map(|(i, o)| pb.tail_value(i, *o)).sum();
        let mut prev: Vec<Option<usize>> =
            pb.tenants.iter().map(|t| t.current_inference.and_then(|pl| pb.profile_index(pl.profile))).collect();
        let mut before = pb.current_usage();
        for slot in 0..pb.slots {
            let cur = &self.inference[slot];
            total += pb.slot_value(slot, &prev, cur, &before, |i| self.retrain[i].is_some_and(|o| o.end <= slot));
            prev = cur.clone();
            before = pb.usage_of(&self.counts(slot, pb.profiles.len()));
        }
        total
    }

    /// Whether every slot's counts fit a valid layout and every tenant uses only profiles it can use.
    pub fn feasible(&self, pb: &GpuProblem) -> bool {
        (0..pb.slots).all(|t| pb.counts_feasible(&self.counts(t, pb.profiles.len())))
            && self
                .inference
                .iter()
                .all(|row| row.iter().enumerate().all(|(i, p)| p.is_none_or(|p| pb.tenants[i].cap[p] > 0.0)))
    }
}

/// Mean forecast demand of tenant `i` over the horizon, requests per second.
pub fn mean_demand(pb: &GpuProblem, i: usize) -> f64 {
    let t = &pb.tenants[i];
    let total: f64 = t.scenarios.iter().map(|s| s.prob * s.rate.iter().sum::<f64>()).sum();
    total / pb.slots.max(1) as f64
}

/// "retrain a on 2g (slots 0-4)" for each retraining the schedule starts, or "no retraining".
pub fn describe_retraining(pb: &GpuProblem, schedule: &Schedule) -> String {
    let parts: Vec<String> = schedule
        .retrain
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            o.map(|o| {
                format!(
                    "retrain {} on {} (slots {}-{})",
                    pb.tenants[i].id,
                    pb.profiles[o.profile],
                    o.start,
                    o.end.saturating_sub(1)
                )
            })
        })
        .collect();
    if parts.is_empty() { "no retraining".into() } else { parts.join(", ") }
}
