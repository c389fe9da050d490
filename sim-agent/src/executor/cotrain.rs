//! Retraining beside inference on one shared instance ([`tessera_core::sharing`]).
//!
//! A shared instance serves its tenant's inference like any inference instance (its latency table is the shared
//! one: [`ShareParams::batch_latency_ms`](tessera_core::sharing::ShareParams::batch_latency_ms)) and adds to its
//! tenant's retraining speed. How much depends on how busy inference kept it, which is known only afterwards: the
//! instance counts its batches (discrete serving) or its tenant counts the pool's busy time (fluid serving), and at
//! every settlement (each [`Executor::advance_to`], fluid step, plan, drain and retraining event) the period's
//! training is recomputed with [`ShareParams::train_share`](tessera_core::sharing::ShareParams::train_share), the
//! difference from what the instance contributed at its running rate is credited (or taken back), and that share
//! becomes the rate until the next settlement.

use tessera_core::sharing::Sharing;

use super::Executor;
use super::state::{CoTrain, Phase};

impl Executor {
    /// A shared instance starts serving: its retraining joins its tenant's at the rate of an idle instance.
    pub(super) fn co_start(&mut self, s: usize) {
        let now = self.now;
        let Some(w) = self.insts[s].work.filter(|w| w.co_trains()) else { return };
        let t = w.tenant as usize;
        let rate = self.insts[s].speed * self.config.share.train_share(w.share, 1.0, 0.0, 0.0, 0.0);
        self.insts[s].co = CoTrain { rate, since: now, ..CoTrain::default() };
        self.tenants[t].co_insts += 1;
        self.retrain_add(t, rate);
    }

    /// A shared instance stops serving (drain, reassignment): its period is settled and its retraining leaves
    /// its tenant's (progress is kept, as for a retraining instance).
    pub(super) fn co_stop(&mut self, s: usize) {
        let Some(w) = self.insts[s].work.filter(|w| w.co_trains()) else { return };
        let t = w.tenant as usize;
        self.co_settle(t, false);
        let rate = std::mem::take(&mut self.insts[s].co.rate);
        self.tenants[t].co_insts = self.tenants[t].co_insts.saturating_sub(1);
        self.retrain_remove(t, rate);
    }

    /// Settles every tenant with a serving shared instance (see the module documentation).
    pub(super) fn co_settle_all(&mut self) {
        for t in 0..self.tenants.len() {
            if self.tenants[t].co_insts > 0 {
                self.co_settle(t, true);
            }
        }
    }

    /// Settles tenant `t`'s shared instances up to now: credits the difference between the training each did
    /// and what it contributed at its rate, and makes that share its rate. `reschedule`: re-estimate the
    /// retraining's completion (a retraining event being handled does that itself).
    pub(super) fn co_settle(&mut self, t: usize, reschedule: bool) {
        let now = self.now;
        if self.tenants[t].co_insts == 0 {
            return;
        }
        self.retrain_sync(t);
        let due = self.tenants[t].retrain.as_ref().is_some_and(|r| r.due);
        // Fluid serving's pooled busy time: every instance of the pool is busy the same share of the time.
        let fluid_busy = std::mem::take(&mut self.tenants[t].fluid.pool_busy_ms);
        let share_params = &self.config.share;
        let mut delta_gpu_s = 0.0;
        let mut delta_rate = 0.0;
        for k in 0..self.tenants[t].serving.len() {
            let s = self.tenants[t].serving[k] as usize;
            let inst = &mut self.insts[s];
            let Some(w) = inst.work.filter(|w| w.co_trains()) else { continue };
            if inst.phase != Phase::Serving {
                continue;
            }
            let period = now - inst.co.since;
            if period <= 0.0 {
                continue;
            }
            let (mut busy, mut batches, mut in_batch) = (inst.co.busy_ms, inst.co.batches, inst.co.in_batch_ms);
            if fluid_busy > 0.0 {
                let full = inst.cap as usize - 1;
                let n = fluid_busy / inst.lat[full];
                busy += fluid_busy;
                batches += n;
                in_batch += n * inst.co_lat.get(full).copied().unwrap_or(0.0);
            }
            let busy = busy.min(period);
            let in_batch = in_batch.min(busy);
            let share = share_params.train_share(w.share, period, busy, batches, in_batch);
            let actual = inst.speed * share;
            delta_gpu_s += (actual - inst.co.rate) * period / 1000.0;
            delta_rate += actual - inst.co.rate;
            let m = &mut self.tenants[t].metrics.shared;
            m.serving_ms += period;
            m.inference_ms += busy - in_batch;
            m.train_ms += share * period;
            m.train_gpu_s += if due { actual * period / 1000.0 } else { 0.0 };
            inst.co = CoTrain { rate: actual, since: now, ..CoTrain::default() };
        }
        if let Some(r) = &mut self.tenants[t].retrain {
            if r.due {
                r.done_gpu_s = (r.done_gpu_s + delta_gpu_s).max(0.0);
            }
            r.speed = if r.running == 0 { 0.0 } else { (r.speed + delta_rate).max(0.0) };
        }
        if reschedule {
            self.retrain_reschedule(t);
        }
    }

    /// Changes only how an instance that keeps its tenant's inference shares it (a plan that starts or stops
    /// retraining beside it): inference keeps serving, the batch in service keeps its latency.
    pub(super) fn reshare(&mut self, s: usize, share: Sharing) {
        let serving = self.insts[s].phase == Phase::Serving;
        if serving {
            self.co_stop(s);
        }
        if let Some(w) = &mut self.insts[s].work {
            w.share = share;
        }
        self.prepare(s);
        if serving {
            self.co_start(s);
        }
    }

    /// Counts a batch that starts on shared instance `s` with `n` requests.
    pub(super) fn co_batch(&mut self, s: usize, n: usize) {
        let inst = &mut self.insts[s];
        if inst.work.is_some_and(|w| w.co_trains()) {
            inst.co.busy_ms += inst.lat[n - 1];
            inst.co.batches += 1.0;
            inst.co.in_batch_ms += inst.co_lat.get(n - 1).copied().unwrap_or(0.0);
        }
    }
}
