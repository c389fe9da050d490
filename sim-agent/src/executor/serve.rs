//! The inference hot path: events, dispatch, dynamic batching, completions, and requests without an instance.

use super::elsa::{ElsaPartition, elsa_dispatch};
use tessera_core::goodput::GoodputLedger;
use tessera_core::plan::Role;

use super::metrics::BatchRecord;
use super::state::{Event, EventKind, NEVER, Phase};
use super::{Dispatch, ExecError, Executor, GpuIndex, LateRequests, NoInstance, TenantIndex};

impl Executor {
    /// Handles every event due at or before `t`, in time order.
    pub(super) fn run_until(&mut self, t: f64) -> Result<(), ExecError> {
        while let Some(&ev) = self.heap.peek() {
            if ev.at > t {
                break;
            }
            self.heap.pop();
            // Events are never scheduled before the time they are scheduled at, so time only moves forward.
            self.now = ev.at;
            self.handle(ev)?;
        }
        Ok(())
    }

    fn handle(&mut self, ev: Event) -> Result<(), ExecError> {
        let id = ev.id as usize;
        match ev.kind {
            EventKind::Instance => {
                let inst = &mut self.insts[id];
                if !inst.alive || inst.generation != ev.generation || inst.wake_at != ev.at {
                    return Ok(()); // superseded
                }
                inst.wake_at = NEVER;
                self.step_instance(id)
            }
            EventKind::Retrain => {
                self.on_retrain_event(id, ev.generation);
                Ok(())
            }
            EventKind::Window => {
                self.on_window_end(id, ev.at);
                Ok(())
            }
            EventKind::WaitExpiry => {
                if self.tenants[id].wait_wake_at == ev.at {
                    self.tenants[id].wait_wake_at = NEVER;
                    self.expire_waiting(id);
                }
                Ok(())
            }
        }
    }

    /// Brings an instance up to `now`: completes its batch, switches its work off, makes it serve, finishes its
    /// drain, starts its next batch; then schedules its next wake. Idempotent: a spurious call changes nothing.
    pub(super) fn step_instance(&mut self, s: usize) -> Result<(), ExecError> {
        let now = self.now;
        if self.insts[s].in_service > 0 && self.insts[s].batch_end <= now {
            self.complete_batch(s);
        }
        let inst = &self.insts[s];
        if matches!(inst.phase, Phase::Serving | Phase::Loading) && inst.switch_off_at <= now {
            return self.begin_drain(s);
        }
        if inst.phase == Phase::Loading && inst.serve_from <= now {
            self.become_serving(s);
        }
        match self.insts[s].phase {
            Phase::Draining if self.insts[s].in_service == 0 => return self.finish_drain(s),
            Phase::Serving => self.try_start(s),
            _ => {}
        }
        self.reschedule(s);
        Ok(())
    }

    /// Schedules the instance's next wake: the end of its batch, else its head request's batch timeout, its
    /// warm-up end or its switch-off, whichever comes first. Never before now; at most one valid wake.
    pub(super) fn reschedule(&mut self, s: usize) {
        let now = self.now;
        let inst = &mut self.insts[s];
        let mut at = NEVER;
        if inst.in_service > 0 {
            at = inst.batch_end;
        } else if inst.phase == Phase::Serving
            && let Some(&head) = inst.queue.front()
        {
            at = head + inst.timeout_ms;
        }
        match inst.phase {
            Phase::Loading => at = at.min(inst.serve_from).min(inst.switch_off_at),
            Phase::Serving => at = at.min(inst.switch_off_at),
            Phase::Idle | Phase::Draining => {}
        }
        if at == NEVER {
            inst.wake_at = NEVER;
            return;
        }
        let at = at.max(now);
        if at != inst.wake_at {
            inst.wake_at = at;
            self.heap.push(Event { at, kind: EventKind::Instance, id: s as u32, generation: inst.generation });
        }
    }

    /// Routes a request of tenant `t` that arrived at `arrival` (now, or earlier for a moved request).
    pub(super) fn dispatch(&mut self, t: usize, arrival: f64) {
        let s = match self.tenants[t].serving.len() {
            0 => return self.no_instance(t, arrival),
            1 => self.tenants[t].serving[0] as usize,
            _ => self.choose(t, arrival),
        };
        self.enqueue(s, t, arrival);
    }

    fn choose(&mut self, t: usize, arrival: f64) -> usize {
        let now = self.now;
        let tenant = &self.tenants[t];
        match self.config.dispatch {
            Dispatch::EarliestFinish => {
                let mut best: Option<(f64, u32)> = None;
                for &s in &tenant.serving {
                    let (free_at, latency) = self.insts[s as usize].estimate(now);
                    let finish = free_at + latency;
                    if best.is_none_or(|(b, _)| finish < b) {
                        best = Some((finish, s));
                    }
                }
                best.map_or(tenant.serving[0], |(_, s)| s) as usize
            }
            Dispatch::Elsa => {
                self.elsa_partitions.clear();
                for &s in &tenant.serving {
                    let inst = &self.insts[s as usize];
                    let (free_at_ms, latency_ms) = inst.estimate(now);
                    self.elsa_partitions.push(ElsaPartition {
                        compute_slices: inst.placement.profile.compute_slices(),
                        free_at_ms,
                        latency_ms,
                    });
                }
                let k = elsa_dispatch(now, arrival + tenant.spec.slo_ms, &self.elsa_partitions).unwrap_or(0);
                tenant.serving[k] as usize
            }
        }
    }

    fn enqueue(&mut self, s: usize, t: usize, arrival: f64) {
        let inst = &mut self.insts[s];
        inst.queue.push_back(arrival);
        let waiting = inst.waiting() as u64;
        let gpu = &mut self.gpus[inst.gpu as usize].metrics;
        gpu.ledger.record_arrivals(1);
        gpu.max_queue_len = gpu.max_queue_len.max(waiting);
        let tm = &mut self.tenants[t].metrics;
        tm.max_queue_len = tm.max_queue_len.max(waiting);
        if inst.in_service == 0 {
            self.try_start(s);
            self.reschedule(s);
        }
    }

    /// Starts a batch on an idle serving instance when its queue holds a full batch or its head request has
    /// waited the batch timeout.
    fn try_start(&mut self, s: usize) {
        let now = self.now;
        let inst = &mut self.insts[s];
        if inst.in_service > 0 || inst.phase != Phase::Serving || inst.queue.is_empty() {
            return;
        }
        let tenant = inst.work.map_or(0, |w| w.tenant as usize);
        if self.config.late == LateRequests::Shed {
            // The queue is in arrival order and a batch's requests finish together: once the oldest meets its
            // deadline, so do the others.
            let slo_ms = self.tenants[tenant].spec.slo_ms;
            let mut shed = 0u64;
            while let Some(&oldest) = inst.queue.front() {
                let n = inst.queue.len().min(inst.cap as usize);
                if oldest + slo_ms >= now + inst.lat[n - 1] {
                    break;
                }
                inst.queue.pop_front();
                shed += 1;
            }
            if shed > 0 {
                self.gpus[inst.gpu as usize].metrics.ledger.dropped += shed;
                let m = &mut self.tenants[tenant].metrics;
                m.ledger.dropped += shed;
                m.dropped_late += shed;
            }
        }
        let Some(&head) = inst.queue.front() else { return };
        let n = inst.queue.len().min(inst.cap as usize);
        if n == inst.cap as usize || now >= head + inst.timeout_ms {
            inst.in_service = n as u32;
            inst.batch_start = now;
            inst.batch_end = now + inst.lat[n - 1];
            inst.batch_accuracy = self.tenants[tenant].accuracy;
            self.co_batch(s, n);
        }
    }

    /// Settles the batch in service: each request's latency is completion minus arrival, credited with the
    /// accuracy of the model that served the batch.
    fn complete_batch(&mut self, s: usize) {
        let inst = &mut self.insts[s];
        let n = inst.in_service as usize;
        let (start, end, accuracy) = (inst.batch_start, inst.batch_end, inst.batch_accuracy);
        let t = inst.work.map_or(0, |w| w.tenant as usize);
        let tenant = &mut self.tenants[t];
        let slo_ms = tenant.spec.slo_ms;
        let mut batch = GoodputLedger::default();
        let (mut sum, mut max) = (0.0, tenant.metrics.latency_max_ms);
        for arrival in inst.queue.drain(..n) {
            let latency = end - arrival;
            batch.record_completion(latency, slo_ms, accuracy);
            tenant.metrics.latency.record(latency, 1);
            sum += latency;
            max = f64::max(max, latency);
        }
        inst.in_service = 0;
        let m = &mut tenant.metrics;
        m.ledger += batch;
        m.latency_sum_ms += sum;
        m.latency_max_ms = max;
        m.batches += 1;
        let g = &mut self.gpus[inst.gpu as usize].metrics;
        g.ledger += batch;
        g.batches += 1;
        g.busy_ms += end - start;
        if self.config.record_batches {
            self.batch_log.push(BatchRecord {
                gpu: GpuIndex(inst.gpu),
                placement: inst.placement,
                tenant: TenantIndex(t as u32),
                size: n as u32,
                started_ms: start,
                completed_ms: end,
                accuracy,
            });
        }
    }

    /// Puts a loaded instance into service: an inference instance joins its tenant's dispatch set and takes the
    /// tenant's waiting requests; a retraining instance starts contributing its speed.
    fn become_serving(&mut self, s: usize) {
        let inst = &mut self.insts[s];
        let Some(w) = inst.work else {
            inst.phase = Phase::Idle;
            return;
        };
        inst.phase = Phase::Serving;
        let t = w.tenant as usize;
        match w.role {
            Role::Inference => {
                self.tenants[t].serving.push(s as u32);
                self.serving_epoch += 1;
                self.co_start(s);
                self.flush_waiting(t);
            }
            Role::Retraining => {
                let speed = inst.speed;
                self.retrain_add(t, speed);
            }
        }
    }

    /// Switches an instance's work off: it leaves the dispatch set and its queued requests are routed again (to
    /// the tenant's other instances or its waiting queue); a retraining keeps its progress (checkpoint). The
    /// batch in service completes; then [`Executor::finish_drain`].
    pub(super) fn begin_drain(&mut self, s: usize) -> Result<(), ExecError> {
        let inst = &mut self.insts[s];
        let was = inst.phase;
        inst.phase = Phase::Draining;
        inst.switch_off_at = NEVER;
        if was == Phase::Serving
            && let Some(w) = inst.work
        {
            let t = w.tenant as usize;
            match w.role {
                Role::Inference => {
                    self.co_stop(s);
                    self.tenants[t].serving.retain(|&x| x as usize != s);
                    self.serving_epoch += 1;
                    let inst = &mut self.insts[s];
                    let keep = inst.in_service as usize;
                    let mut moved = std::mem::take(&mut self.moved);
                    moved.clear();
                    moved.extend(inst.queue.drain(keep..));
                    if !moved.is_empty() {
                        let n = moved.len() as u64;
                        self.gpus[inst.gpu as usize].metrics.ledger.requests -= n;
                        self.tenants[t].metrics.redispatched += n;
                        for &arrival in &moved {
                            self.dispatch(t, arrival);
                        }
                        self.restore_arrival_order(t);
                    }
                    self.moved = moved;
                }
                Role::Retraining => {
                    let speed = inst.speed;
                    self.retrain_remove(t, speed);
                }
            }
        }
        if self.insts[s].in_service == 0 {
            self.finish_drain(s)
        } else {
            self.reschedule(s);
            Ok(())
        }
    }

    /// Moved requests were appended behind newer ones: put every queue of tenant `t` back in arrival order (the
    /// batch in service stays in front) and recompute the timeouts that depend on the heads.
    fn restore_arrival_order(&mut self, t: usize) {
        for k in 0..self.tenants[t].serving.len() {
            let s = self.tenants[t].serving[k] as usize;
            let inst = &mut self.insts[s];
            let in_service = inst.in_service as usize;
            let (_, waiting) = inst.queue.make_contiguous().split_at_mut(in_service);
            if !waiting.is_sorted_by(|a, b| a <= b) {
                waiting.sort_by(f64::total_cmp);
            }
            self.try_start(s);
            self.reschedule(s);
        }
        let tenant = &mut self.tenants[t];
        let waiting = tenant.waiting.make_contiguous();
        if !waiting.is_sorted_by(|a, b| a <= b) {
            waiting.sort_by(f64::total_cmp);
            tenant.wait_wake_at = NEVER;
            self.expire_waiting(t);
        }
    }

    /// A request of tenant `t` with no serving instance: dropped, or queued at the tenant until an instance
    /// serves or its longest wait passes.
    fn no_instance(&mut self, t: usize, arrival: f64) {
        let now = self.now;
        let tenant = &mut self.tenants[t];
        let m = &mut tenant.metrics;
        match self.config.no_instance {
            NoInstance::Drop => {
                m.ledger.record_drop();
                m.dropped_no_instance += 1;
            }
            NoInstance::Wait { .. } if arrival + tenant.max_wait_ms <= now => {
                m.ledger.record_drop();
                m.dropped_wait_expired += 1;
            }
            NoInstance::Wait { .. } => {
                tenant.waiting.push_back(arrival);
                m.waited += 1;
                m.max_waiting_len = m.max_waiting_len.max(tenant.waiting.len() as u64);
                if tenant.wait_wake_at == NEVER {
                    self.schedule_wait_expiry(t);
                }
            }
        }
    }

    fn schedule_wait_expiry(&mut self, t: usize) {
        let now = self.now;
        let tenant = &mut self.tenants[t];
        if let Some(&head) = tenant.waiting.front() {
            let at = (head + tenant.max_wait_ms).max(now);
            tenant.wait_wake_at = at;
            self.heap.push(Event { at, kind: EventKind::WaitExpiry, id: t as u32, generation: 0 });
        }
    }

    /// Drops the waiting requests that have waited their longest wait, and schedules the next expiry.
    fn expire_waiting(&mut self, t: usize) {
        let now = self.now;
        let tenant = &mut self.tenants[t];
        while let Some(&head) = tenant.waiting.front() {
            if head + tenant.max_wait_ms > now {
                break;
            }
            tenant.waiting.pop_front();
            tenant.metrics.ledger.record_drop();
            tenant.metrics.dropped_wait_expired += 1;
        }
        if tenant.wait_wake_at == NEVER {
            self.schedule_wait_expiry(t);
        }
    }

    /// Routes tenant `t`'s waiting requests to its serving instances (oldest first), dropping expired ones.
    fn flush_waiting(&mut self, t: usize) {
        if self.tenants[t].waiting.is_empty() {
            return;
        }
        self.expire_waiting(t);
        while let Some(arrival) = self.tenants[t].waiting.pop_front() {
            self.dispatch(t, arrival);
        }
        self.tenants[t].wait_wake_at = NEVER;
    }
}
