//! Retraining progress, completion, accuracy jumps and drift per window.

use super::Executor;
use super::state::{Event, EventKind};

impl Executor {
    /// Brings tenant `t`'s retraining progress up to now.
    pub(super) fn retrain_sync(&mut self, t: usize) {
        let now = self.now;
        if let Some(r) = &mut self.tenants[t].retrain {
            r.done_gpu_s = r.done_at(now);
            r.progress_at = now;
        }
    }

    /// A retraining instance of tenant `t` starts working at `speed`.
    pub(super) fn retrain_add(&mut self, t: usize, speed: f64) {
        self.retrain_sync(t);
        if let Some(r) = &mut self.tenants[t].retrain {
            r.speed += speed;
            r.running += 1;
        }
        self.retrain_reschedule(t);
    }

    /// A retraining instance of tenant `t` stops (its progress so far is kept: a checkpoint).
    pub(super) fn retrain_remove(&mut self, t: usize, speed: f64) {
        self.retrain_sync(t);
        if let Some(r) = &mut self.tenants[t].retrain {
            r.running = r.running.saturating_sub(1);
            // Without a running instance the speed is exactly 0, whatever the rounding of the sums.
            r.speed = if r.running == 0 { 0.0 } else { (r.speed - speed).max(0.0) };
        }
        self.retrain_reschedule(t);
    }

    /// Schedules the completion of tenant `t`'s due retraining at its current speed (superseding any earlier
    /// estimate).
    pub(super) fn retrain_reschedule(&mut self, t: usize) {
        let now = self.now;
        let Some(r) = &mut self.tenants[t].retrain else { return };
        r.generation = r.generation.wrapping_add(1);
        if r.due && r.speed > 0.0 {
            let left = (r.work_gpu_s() - r.done_gpu_s).max(0.0);
            let at = now + left / r.speed * 1000.0;
            self.heap.push(Event { at, kind: EventKind::Retrain, id: t as u32, generation: r.generation });
        }
    }

    pub(super) fn on_retrain_event(&mut self, t: usize, generation: u32) {
        if self.tenants[t].retrain.as_ref().is_none_or(|r| r.generation != generation) {
            return;
        }
        self.co_settle(t, false);
        self.retrain_sync(t);
        let tenant = &mut self.tenants[t];
        let Some(r) = &mut tenant.retrain else { return };
        let work = r.work_gpu_s();
        if r.done_gpu_s < work - 1e-9 * work.max(1.0) {
            self.retrain_reschedule(t); // rounding left a sliver
            return;
        }
        r.due = false;
        r.done_gpu_s = work;
        r.completed_in_window = true;
        r.generation = r.generation.wrapping_add(1);
        tenant.accuracy = r.spec.accuracy_after(r.epochs);
        tenant.metrics.retrainings_completed += 1;
    }

    /// End of tenant `t`'s retraining window: the model drifts unless a retraining completed in the window, and
    /// the next window's retraining is due from scratch (fresh data).
    pub(super) fn on_window_end(&mut self, t: usize, at: f64) {
        if self.tenants[t].retrain.as_ref().is_none_or(|r| r.window_end != at) {
            return;
        }
        self.co_settle(t, false);
        self.retrain_sync(t);
        let tenant = &mut self.tenants[t];
        let Some(r) = &mut tenant.retrain else { return };
        if !r.completed_in_window {
            tenant.accuracy = r.spec.drift.after(tenant.accuracy, 1);
            tenant.metrics.drift_windows += 1;
        }
        r.due = true;
        r.done_gpu_s = 0.0;
        r.completed_in_window = false;
        r.window_end = at + r.spec.window_ms as f64;
        let next = r.window_end;
        self.heap.push(Event { at: next, kind: EventKind::Window, id: t as u32, generation: 0 });
        self.retrain_reschedule(t);
    }
}
