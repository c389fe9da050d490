//! Applying a GPU's plan: which instances stay, which are reassigned, destroyed or created, in what order, and
//! when their work serves (see "Reconfiguration" in the module doc).

use std::collections::BTreeMap;

use tessera_core::invariants;
use tessera_core::layout::Placement;
use tessera_core::plan::{GpuPlan, Role};
use tessera_core::reconfig::ReconfigLatency;
use tessera_core::time::SimTime;

use super::interference::Resident;
use super::metrics::ReconfigSummary;
use super::state::{AfterDrain, Inst, NEVER, PendingCreate, Phase, Work};
use super::{ExecError, Executor};
use crate::device::SimGpu;

/// The device's clock is whole milliseconds: a MIG call made at a fractional time starts at the next one.
fn device_time(ms: f64) -> SimTime {
    SimTime::from_ms(ms.max(0.0).ceil() as u64)
}

impl Executor {
    pub(super) fn device_error(&self, g: usize, error: tessera_agent::backend::BackendError) -> ExecError {
        ExecError::Device { gpu: self.gpus[g].id.clone(), error }
    }

    /// Checks a GPU plan against the core invariants and the tenants the executor knows.
    pub(super) fn validate_plan(&self, g: usize, plan: &GpuPlan) -> Result<(), ExecError> {
        let gpu = &self.gpus[g];
        invariants::check_gpu_plan(&gpu.id, gpu.model, plan)?;
        invariants::assignments_name_known_tenants(&gpu.id, &plan.assignments, |t| self.tenant_ix.contains_key(t))?;
        Ok(())
    }

    /// Takes the plan's retraining epochs (or the tenants' defaults) for the tenants it gives a retraining instance.
    fn take_epochs(&mut self, plan: &GpuPlan) {
        for a in plan.assignments.iter().filter(|a| a.role == Role::Retraining) {
            let t = self.tenant_ix[&a.tenant];
            let Some(r) = &self.tenants[t].retrain else { continue };
            let epochs = plan.retraining_epochs.get(&a.tenant).copied().unwrap_or(r.spec.epochs);
            if epochs != r.epochs {
                self.retrain_sync(t);
                if let Some(r) = &mut self.tenants[t].retrain {
                    r.epochs = epochs;
                }
                self.retrain_reschedule(t);
            }
        }
    }

    /// The target work per placement of a plan, and whether it is to be pre-initialised.
    fn target_work(&self, plan: &GpuPlan) -> BTreeMap<Placement, (Option<Work>, bool)> {
        let mut target: BTreeMap<Placement, (Option<Work>, bool)> =
            plan.layout.placements().iter().map(|&p| (p, (None, false))).collect();
        for a in &plan.assignments {
            let work = Work::exclusive(self.tenant_ix[&a.tenant] as u32, a.role);
            let entry = target.entry(a.placement).or_insert((None, false));
            entry.0 = match entry.0 {
                // The second role of a shared instance (the invariants allow only one tenant's inference and
                // retraining, and only under a sharing mode): the instance runs the inference, sharing.
                Some(_) => Some(Work { role: Role::Inference, share: plan.sharing, ..work }),
                None => Some(work),
            };
            entry.1 |= a.preinit;
        }
        target
    }

    pub(super) fn apply_gpu_plan(&mut self, g: usize, plan: &GpuPlan) -> Result<ReconfigSummary, ExecError> {
        self.validate_plan(g, plan)?;
        // Shared instances' training up to now counts at the rates they had.
        self.co_settle_all();
        self.take_epochs(plan);
        self.gpus[g].sharing = plan.sharing;
        let now = self.now;
        let model = self.gpus[g].model;
        let warmup_ms = self.config.latency.warmup_ms as f64;
        let target = self.target_work(plan);
        let mut summary = ReconfigSummary::default();
        // Creates of an earlier plan that have not started are superseded by this one.
        self.gpus[g].pending.clear();

        // 1. Live instances: keep, reassign or destroy. An instance already being destroyed keeps going.
        let mut covered: Vec<Placement> = Vec::new();
        let mut to_switch: Vec<usize> = Vec::new();
        for s in self.gpus[g].insts.clone().into_iter().map(|s| s as usize) {
            let inst = &mut self.insts[s];
            let destroying = inst.after_drain == AfterDrain::Destroy;
            let draining = inst.phase == Phase::Draining;
            match target.get(&inst.placement) {
                Some(_) if destroying && draining => {} // its slices come back later; the target waits for them
                Some(&(work, _)) => {
                    covered.push(inst.placement);
                    let future = match inst.after_drain {
                        AfterDrain::Load(next) => next,
                        AfterDrain::Keep | AfterDrain::Destroy => inst.work,
                    };
                    let same_job = |a: Option<Work>, b: Option<Work>| {
                        a.map(|w| (w.tenant, w.role)) == b.map(|w| (w.tenant, w.role))
                    };
                    if !draining
                        && inst.after_drain == AfterDrain::Keep
                        && inst.work != work
                        && same_job(inst.work, work)
                        && let Some(w) = work
                    {
                        // Retraining starts or stops beside the inference it keeps: no reload.
                        self.reshare(s, w.share);
                        summary.kept += 1;
                        continue;
                    }
                    if future == work {
                        if !draining && inst.work == work {
                            // Cancels a switch-off an earlier plan scheduled and that has not happened yet (a
                            // reassignment to this work already under way is left to complete).
                            inst.after_drain = AfterDrain::Keep;
                            inst.switch_off_at = NEVER;
                            self.reschedule(s);
                        }
                        summary.kept += 1;
                        continue;
                    }
                    summary.reassigned += 1;
                    if draining {
                        inst.after_drain = AfterDrain::Load(work);
                    } else if inst.work.is_none() {
                        let serve_from = now.max(inst.available_ms) + warmup_ms;
                        self.load(s, work, serve_from)?;
                    } else {
                        inst.after_drain = AfterDrain::Load(work);
                        to_switch.push(s);
                    }
                }
                None if destroying => {}
                None => {
                    summary.destroyed += 1;
                    inst.after_drain = AfterDrain::Destroy;
                    if !draining {
                        to_switch.push(s);
                    }
                }
            }
        }

        // 2. Pre-initialised creates on free slices, then cold creates that fit now; the rest wait for slices.
        let leaving: Vec<Option<Work>> = to_switch.iter().map(|&s| self.insts[s].work).collect();
        let mut warm_at: BTreeMap<Work, f64> = BTreeMap::new();
        let mut made: Vec<Placement> = Vec::new();
        let new: Vec<(Placement, Option<Work>, bool)> =
            target.iter().filter(|(p, _)| !covered.contains(p)).map(|(&p, &(w, pre))| (p, w, pre)).collect();
        for &(p, work, _) in new.iter().filter(|(_, w, pre)| *pre && w.is_some()) {
            if self.gpus[g].device.layout().can_add(model, p) {
                let replaces = leaving.contains(&work);
                let switch_ms = if replaces { self.config.switch_ms } else { 0.0 };
                let warm = self.create(g, p, work, switch_ms)?;
                if let Some(w) = work {
                    warm_at.insert(w, warm);
                }
                made.push(p);
                summary.created_preinit += 1;
                self.gpus[g].metrics.preinit_creates += 1;
            } else {
                self.gpus[g].metrics.preinit_not_free += 1;
            }
        }
        for &(p, work, _) in new.iter().filter(|(p, _, _)| !made.contains(p)) {
            summary.created_cold += 1;
            if self.gpus[g].device.layout().can_add(model, p) {
                self.create(g, p, work, 0.0)?;
            } else {
                self.gpus[g].pending.push(PendingCreate { placement: p, work });
            }
        }

        // 3. Switch the leaving work off: when its pre-initialised replacement is warm, else now.
        for s in to_switch {
            let replacement = self.insts[s].work.and_then(|w| warm_at.get(&w).copied());
            match replacement {
                Some(at) if at > now => {
                    self.insts[s].switch_off_at = at;
                    self.reschedule(s);
                }
                _ => self.begin_drain(s)?,
            }
        }
        self.pump_creates(g)?;
        self.recompute_interference(g)?;
        let m = &mut self.gpus[g].metrics;
        m.reassigns += u64::from(summary.reassigned);
        if !summary.is_noop() {
            m.reconfigurations += 1;
            m.reconfigured_at_ms.push(now);
        }
        Ok(summary)
    }

    /// Creates the plan's instances at once, warm and serving now (the state a run starts from). The GPU must
    /// have no instance.
    pub(super) fn install_gpu_plan(&mut self, g: usize, plan: &GpuPlan) -> Result<(), ExecError> {
        self.validate_plan(g, plan)?;
        let instances = self.gpus[g].device.layout().len();
        if instances > 0 || !self.gpus[g].pending.is_empty() {
            return Err(ExecError::NotEmpty { gpu: self.gpus[g].id.clone(), instances });
        }
        self.take_epochs(plan);
        self.gpus[g].sharing = plan.sharing;
        let (index, model) = (self.gpus[g].id.index, self.gpus[g].model);
        let instant = ReconfigLatency { create_ms: 0, destroy_ms: 0, warmup_ms: 0 };
        self.gpus[g].device = SimGpu::new(index, model).with_latency(instant);
        for (p, (work, _)) in self.target_work(plan) {
            self.create(g, p, work, 0.0)?;
        }
        let device = std::mem::replace(&mut self.gpus[g].device, SimGpu::new(index, model));
        self.gpus[g].device = device.with_latency(self.config.latency);
        for k in 0..self.gpus[g].insts.len() {
            let s = self.gpus[g].insts[k] as usize;
            if self.insts[s].phase == Phase::Loading {
                self.insts[s].serve_from = self.now;
                self.step_instance(s)?;
            }
        }
        Ok(())
    }

    /// Issues the waiting creates whose slices are free, in plan order.
    fn pump_creates(&mut self, g: usize) -> Result<(), ExecError> {
        let model = self.gpus[g].model;
        let mut k = 0;
        while k < self.gpus[g].pending.len() {
            let pc = self.gpus[g].pending[k];
            if self.gpus[g].device.layout().can_add(model, pc.placement) {
                self.gpus[g].pending.remove(k);
                self.create(g, pc.placement, pc.work, 0.0)?;
            } else {
                k += 1;
            }
        }
        Ok(())
    }

    /// Creates an instance now (the device queues the call behind earlier ones) with `work` loaded at creation:
    /// it serves when warm, plus `extra_ms`. Returns when it is warm, ms.
    fn create(&mut self, g: usize, placement: Placement, work: Option<Work>, extra_ms: f64) -> Result<f64, ExecError> {
        let created =
            self.gpus[g].device.create(device_time(self.now), placement).map_err(|e| self.device_error(g, e))?;
        let available_ms = created.available_at.as_ms() as f64;
        let warm_ms = created.warm_at.as_ms() as f64;
        let s = match self.free_slots.pop() {
            Some(s) => {
                self.insts[s as usize].reuse(g as u32, placement, created.id, available_ms);
                s as usize
            }
            None => {
                self.insts.push(Inst::new(g as u32, placement, created.id, available_ms));
                self.insts.len() - 1
            }
        };
        let gpu = &mut self.gpus[g];
        let at = gpu.insts.partition_point(|&x| self.insts[x as usize].placement < placement);
        gpu.insts.insert(at, s as u32);
        gpu.metrics.creates += 1;
        self.load(s, work, warm_ms + extra_ms)?;
        self.recompute_interference(g)?;
        Ok(warm_ms)
    }

    /// Loads `work` (or none) on an instance; it serves from `serve_from`.
    pub(super) fn load(&mut self, s: usize, work: Option<Work>, serve_from: f64) -> Result<(), ExecError> {
        let inst = &mut self.insts[s];
        inst.work = work;
        inst.after_drain = AfterDrain::Keep;
        inst.switch_off_at = NEVER;
        inst.phase = if work.is_some() { Phase::Loading } else { Phase::Idle };
        inst.serve_from = serve_from;
        let (g, id) = (inst.gpu as usize, inst.device_id);
        self.gpus[g].device.set_busy(id, work.is_some()).map_err(|e| self.device_error(g, e))?;
        self.prepare(s);
        self.reschedule(s);
        Ok(())
    }

    /// Computes the instance's batch cap and latency table (inference) or speed (retraining) from its work, its
    /// profile on its GPU model and its interference factor.
    pub(super) fn prepare(&mut self, s: usize) {
        let inst = &mut self.insts[s];
        let Some(w) = inst.work else { return };
        let tenant = &self.tenants[w.tenant as usize];
        let model = &self.models[tenant.model];
        let (gpu, profile, slowdown) = (self.gpus[inst.gpu as usize].model, inst.placement.profile, inst.slowdown);
        match w.role {
            Role::Inference => {
                // Alone on the instance, and as served (stretched when it shares with the tenant's retraining).
                let alone = |b: u32| model.latency_on(gpu, profile, b) * slowdown;
                let share = &self.config.share;
                let latency = |b: u32| share.batch_latency_ms(w.share, alone(b));
                let max_batch = model.max_batch.max(1);
                let cap = match self.config.batch_cap {
                    super::BatchCap::MaxBatch => max_batch,
                    super::BatchCap::SloAdmissible => {
                        (1..=max_batch).take_while(|&b| 2.0 * latency(b) <= tenant.spec.slo_ms).last().unwrap_or(1)
                    }
                };
                inst.cap = cap;
                inst.lat.clear();
                inst.lat.extend((1..=cap).map(latency));
                inst.co_lat.clear();
                if w.co_trains() {
                    inst.co_lat.extend((1..=cap).map(|b| share.batch_train_ms(w.share, alone(b))));
                    inst.speed = model.training_speed_on(gpu, profile) / slowdown;
                }
                self.serving_epoch += 1;
                inst.timeout_ms = tenant.timeout_ms;
            }
            Role::Retraining => inst.speed = model.training_speed_on(gpu, profile) / slowdown,
        }
    }

    /// The instance has drained: destroy it (then issue the creates its slices unblock) or load its next work.
    pub(super) fn finish_drain(&mut self, s: usize) -> Result<(), ExecError> {
        let (g, id) = (self.insts[s].gpu as usize, self.insts[s].device_id);
        match self.insts[s].after_drain {
            AfterDrain::Destroy => {
                let now = device_time(self.now);
                let device = &mut self.gpus[g].device;
                device.set_busy(id, false).map_err(|e| self.device_error(g, e))?;
                self.gpus[g].device.destroy(now, id).map_err(|e| self.device_error(g, e))?;
                let gpu = &mut self.gpus[g];
                gpu.metrics.destroys += 1;
                gpu.insts.retain(|&x| x as usize != s);
                let inst = &mut self.insts[s];
                inst.alive = false;
                inst.generation = inst.generation.wrapping_add(1);
                inst.work = None;
                inst.queue.clear();
                self.free_slots.push(s as u32);
                self.recompute_interference(g)?;
                self.pump_creates(g)
            }
            AfterDrain::Load(work) => {
                let serve_from = self.now.max(self.insts[s].available_ms) + self.config.latency.warmup_ms as f64;
                self.load(s, work, serve_from)?;
                self.recompute_interference(g)
            }
            AfterDrain::Keep => {
                // Switched off without a plan for it: it keeps its slices, without work.
                self.load(s, None, NEVER)?;
                self.recompute_interference(g)
            }
        }
    }

    /// Asks the interference model for the factors of the GPU's instances with work, and updates latency tables
    /// and retraining speeds that changed. Batches in service keep their latency.
    pub(super) fn recompute_interference(&mut self, g: usize) -> Result<(), ExecError> {
        let slots: Vec<usize> =
            self.gpus[g].insts.iter().map(|&s| s as usize).filter(|&s| self.insts[s].work.is_some()).collect();
        let residents: Vec<Resident<'_>> = slots
            .iter()
            .filter_map(|&s| {
                let inst = &self.insts[s];
                let w = inst.work?;
                let spec = &self.tenants[w.tenant as usize].spec;
                Some(Resident { tenant: &spec.id, model: &spec.model, profile: inst.placement.profile, role: w.role })
            })
            .collect();
        let mut factors = std::mem::take(&mut self.factors);
        let result = self.interference.factors(self.gpus[g].model, &residents, &mut factors);
        drop(residents);
        if let Err(e) = result {
            self.factors = factors;
            return Err(e.into());
        }
        for (k, &s) in slots.iter().enumerate() {
            let f = factors.get(k).copied().unwrap_or(1.0).max(1.0);
            if f == self.insts[s].slowdown {
                continue;
            }
            let inst = &self.insts[s];
            let running = inst.phase == Phase::Serving && inst.work.is_some_and(|w| w.role == Role::Retraining);
            let co = inst.phase == Phase::Serving && inst.work.is_some_and(|w| w.co_trains());
            let (t, old_speed) = (inst.work.map_or(0, |w| w.tenant as usize), inst.speed);
            if running {
                self.retrain_remove(t, old_speed);
            }
            if co {
                self.co_stop(s);
            }
            self.insts[s].slowdown = f;
            self.prepare(s);
            if running {
                let speed = self.insts[s].speed;
                self.retrain_add(t, speed);
            }
            if co {
                self.co_start(s);
            }
        }
        self.factors = factors;
        Ok(())
    }
}
