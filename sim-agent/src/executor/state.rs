//! The executor's internal state: instances (a slab), tenants, GPUs and the event heap entries.

use std::cmp::Ordering;
use std::collections::VecDeque;

use tessera_agent::backend::InstanceId;
use tessera_core::GpuModel;
use tessera_core::ids::GpuId;
use tessera_core::layout::Placement;
use tessera_core::plan::Role;
use tessera_core::sharing::Sharing;
use tessera_core::tenant::{RetrainingSpec, TenantSpec};

use super::metrics::{GpuMetrics, TenantMetrics};
use crate::device::SimGpu;

/// "No such time": a wake that is not scheduled, a switch-off that is not planned.
pub(super) const NEVER: f64 = f64::INFINITY;

/// A tenant's job on an instance (tenant index, role), and whether its inference shares the instance with its
/// retraining (`share` is [`Sharing::Exclusive`] for a retraining instance and an unshared inference instance).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Work {
    pub tenant: u32,
    pub role: Role,
    pub share: Sharing,
}

impl Work {
    /// A job on an instance of its own.
    pub(super) fn exclusive(tenant: u32, role: Role) -> Work {
        Work { tenant, role, share: Sharing::Exclusive }
    }

    /// Whether the instance runs the tenant's inference and, beside it, its retraining.
    pub(super) fn co_trains(&self) -> bool {
        self.role == Role::Inference && !self.share.is_exclusive()
    }
}

/// A shared instance's retraining beside its inference ([`tessera_core::sharing`]): what it contributes to its
/// tenant's retraining speed and what inference did since the contribution was last settled.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct CoTrain {
    /// Speed added to the tenant's retraining now, 7g GPU-seconds per second (0 unless serving).
    pub rate: f64,
    /// Since when the counters below run, ms.
    pub since: f64,
    /// Latency of the batches started since, ms.
    pub busy_ms: f64,
    /// Batches started since.
    pub batches: f64,
    /// Training time within those batches' latency (time-slice mode), ms.
    pub in_batch_ms: f64,
}

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Exists without work.
    Idle,
    /// Work loaded, warming up until `serve_from`.
    Loading,
    /// Serves its work (in its tenant's dispatch set, or retraining).
    Serving,
    /// Switched off: finishes its batch in service, then `after_drain`.
    Draining,
}

/// What happens once an instance has drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterDrain {
    /// Nothing planned (the instance keeps its work).
    Keep,
    /// Destroy it.
    Destroy,
    /// Load other work (a reassignment), or none.
    Load(Option<Work>),
}

/// One live GPU instance with the work on it.
#[derive(Debug, Clone)]
pub(super) struct Inst {
    pub alive: bool,
    /// Bumped when the slot is freed, so that stale events of an earlier occupant are ignored.
    pub generation: u32,
    pub gpu: u32,
    pub placement: Placement,
    pub device_id: InstanceId,
    /// When the create call ended, ms.
    pub available_ms: f64,
    pub work: Option<Work>,
    pub phase: Phase,
    pub after_drain: AfterDrain,
    /// Loading: when the work serves, ms.
    pub serve_from: f64,
    /// Make-before-break: when the work is switched off (its replacement is warm), ms.
    pub switch_off_at: f64,
    /// The time of the one wake event that is valid for this instance (`NEVER` if none).
    pub wake_at: f64,
    /// Interference factor on its latency (and on retraining time).
    pub slowdown: f64,
    /// Arrival times, ms: the first `in_service` are the batch in service, the rest wait, in arrival order.
    pub queue: VecDeque<f64>,
    pub in_service: u32,
    pub batch_start: f64,
    pub batch_end: f64,
    pub batch_accuracy: f64,
    /// Largest batch.
    pub cap: u32,
    /// `lat[b - 1]`: latency of a batch of `b`, slowdown included, ms.
    pub lat: Vec<f64>,
    pub timeout_ms: f64,
    /// Retraining (or the retraining beside a shared inference): 7g GPU-seconds per second alone on the
    /// instance, slowdown included.
    pub speed: f64,
    /// Shared inference: `co_lat[b - 1]` is the training time within a batch of `b` (time-slice mode).
    pub co_lat: Vec<f64>,
    /// Shared inference: the retraining beside it.
    pub co: CoTrain,
}

impl Inst {
    pub(super) fn new(gpu: u32, placement: Placement, device_id: InstanceId, available_ms: f64) -> Inst {
        Inst {
            alive: true,
            generation: 0,
            gpu,
            placement,
            device_id,
            available_ms,
            work: None,
            phase: Phase::Idle,
            after_drain: AfterDrain::Keep,
            serve_from: NEVER,
            switch_off_at: NEVER,
            wake_at: NEVER,
            slowdown: 1.0,
            queue: VecDeque::new(),
            in_service: 0,
            batch_start: 0.0,
            batch_end: 0.0,
            batch_accuracy: 0.0,
            cap: 1,
            lat: Vec::new(),
            timeout_ms: 0.0,
            speed: 0.0,
            co_lat: Vec::new(),
            co: CoTrain::default(),
        }
    }

    /// Reuses a freed slot for a new instance, keeping the buffers' capacity.
    pub(super) fn reuse(&mut self, gpu: u32, placement: Placement, device_id: InstanceId, available_ms: f64) {
        let generation = self.generation;
        let mut queue = std::mem::take(&mut self.queue);
        let mut lat = std::mem::take(&mut self.lat);
        let mut co_lat = std::mem::take(&mut self.co_lat);
        queue.clear();
        lat.clear();
        co_lat.clear();
        *self = Inst { generation, queue, lat, co_lat, ..Inst::new(gpu, placement, device_id, available_ms) };
    }

    /// Requests waiting for a batch (the batch in service excluded).
    pub(super) fn waiting(&self) -> usize {
        self.queue.len() - self.in_service as usize
    }

    /// For a request joining now, an upper bound on when its batch starts and on that batch's latency (ms), so
    /// that their sum bounds its finish (service is deterministic): the full batches ahead of it run back to
    /// back after the batch in service; its own batch then starts at once if the request fills it, else at the
    /// latest when the batch's first request has waited the timeout; it holds at most a full batch.
    pub(super) fn estimate(&self, now: f64) -> (f64, f64) {
        let waiting = self.waiting();
        let cap = self.cap as usize;
        let free = if self.in_service > 0 { self.batch_end } else { now };
        let (full, before) = (waiting / cap, waiting % cap);
        let ahead_done = free + full as f64 * self.lat[cap - 1];
        let start = if before + 1 == cap {
            ahead_done
        } else {
            let head = if before == 0 { now } else { self.queue[self.in_service as usize + full * cap] };
            ahead_done.max(head + self.timeout_ms)
        };
        (start, self.lat[cap - 1])
    }
}

/// Retraining state of a tenant that retrains.
#[derive(Debug, Clone)]
pub(super) struct Retrain {
    pub spec: RetrainingSpec,
    /// Epochs of the due retraining (the plan's choice or the spec's default).
    pub epochs: f64,
    pub due: bool,
    /// Work done as of `progress_at`, 7g GPU-seconds.
    pub done_gpu_s: f64,
    pub progress_at: f64,
    /// Sum of the speeds of its serving retraining instances.
    pub speed: f64,
    pub running: u32,
    pub completed_in_window: bool,
    /// Bumped whenever the completion estimate changes; only the event with the current value counts.
    pub generation: u32,
    pub window_end: f64,
}

impl Retrain {
    pub(super) fn work_gpu_s(&self) -> f64 {
        self.spec.work_for_epochs(self.epochs)
    }

    /// Work done by `now`, 7g GPU-seconds.
    pub(super) fn done_at(&self, now: f64) -> f64 {
        if self.due { self.done_gpu_s + self.speed * (now - self.progress_at) / 1000.0 } else { self.done_gpu_s }
    }
}

/// A tenant.
#[derive(Debug, Clone)]
pub(super) struct Tenant {
    pub spec: TenantSpec,
    /// Index of its model in the executor's model table.
    pub model: usize,
    pub timeout_ms: f64,
    pub max_wait_ms: f64,
    /// Serving inference instances, in the order they began to serve.
    pub serving: Vec<u32>,
    /// Requests waiting for a serving instance (arrival times, ms).
    pub waiting: VecDeque<f64>,
    pub wait_wake_at: f64,
    pub accuracy: f64,
    pub retrain: Option<Retrain>,
    pub metrics: TenantMetrics,
    /// Fluid serving's backlog and carried fractions ([`Executor::flow`](super::Executor::flow)).
    pub fluid: FluidTenant,
    /// Its serving inference instances that share with its retraining.
    pub co_insts: u32,
}

/// A create waiting for its slices.
#[derive(Debug, Clone, Copy)]
pub(super) struct PendingCreate {
    pub placement: Placement,
    pub work: Option<Work>,
}

/// A GPU.
#[derive(Debug, Clone)]
pub(super) struct Gpu {
    pub id: GpuId,
    pub model: GpuModel,
    pub device: SimGpu,
    /// Live instance slots, ordered by placement.
    pub insts: Vec<u32>,
    /// Cold creates waiting for their slices, in plan order.
    pub pending: Vec<PendingCreate>,
    pub metrics: GpuMetrics,
    /// The sharing mode of the plan applied last.
    pub sharing: Sharing,
}

/// What an event wakes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum EventKind {
    /// An instance: batch done, batch timeout, warm, switch-off.
    Instance,
    /// A tenant's retraining completes.
    Retrain,
    /// A tenant's retraining window ends.
    Window,
    /// The head of a tenant's waiting queue reaches its longest wait.
    WaitExpiry,
}

/// A heap entry. Ordered so that `BinaryHeap` pops the earliest first, then by kind, id and generation: ties are
/// broken deterministically.
#[derive(Debug, Clone, Copy)]
pub(super) struct Event {
    pub at: f64,
    pub kind: EventKind,
    pub id: u32,
    pub generation: u32,
}

impl Event {
    fn key(&self) -> (EventKind, u32, u32) {
        (self.kind, self.id, self.generation)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Event {}

impl PartialOrd for Event {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Event {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: the smallest time is the greatest entry.
        other.at.total_cmp(&self.at).then_with(|| other.key().cmp(&self.key()))
    }
}

/// Requests that arrived evenly spaced: `count` of them, the first at `first` ms, then every `spacing` ms.
#[derive(Debug, Clone, Copy)]
pub(super) struct Chunk {
    pub first: f64,
    pub spacing: f64,
    pub count: u64,
}

/// A tenant's fluid state (fluid serving, `fluid.rs`).
#[derive(Debug, Clone, Default)]
pub(super) struct FluidTenant {
    /// Requests not served yet, oldest first.
    pub backlog: std::collections::VecDeque<Chunk>,
    /// Requests in the backlog.
    pub queued: u64,
    /// Fraction of a request carried to the next tick's arrivals.
    pub arrival_carry: f64,
    /// Fraction of a request's service carried while a backlog remains.
    pub service_carry: f64,
    /// Fraction of a within-SLO completion carried.
    pub within_carry: f64,
    /// The pooled server, as of [`super::Executor`]'s `serving_epoch` (`None`: not computed yet).
    pub pool: Option<(u64, Pool)>,
    /// Time each instance of the pool was busy since shared instances were last settled, ms (kept only while
    /// the tenant has a shared instance).
    pub pool_busy_ms: f64,
}

/// A tenant's serving instances pooled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pool {
    /// Requests per ms (0: no serving instance).
    pub per_ms: f64,
    /// Full-batch latency, ms, weighted by throughput.
    pub lat: f64,
    /// The fastest instance and its batch cap.
    pub fastest: u32,
    pub cap: u32,
}

#[cfg(test)]
mod tests {
    use std::collections::BinaryHeap;

    use super::*;

    #[test]
    fn the_heap_pops_the_earliest_event_and_breaks_ties_by_kind_then_id() {
        let ev = |at, kind, id| Event { at, kind, id, generation: 0 };
        let mut heap: BinaryHeap<Event> = [
            ev(2.0, EventKind::Instance, 0),
            ev(1.0, EventKind::WaitExpiry, 0),
            ev(1.0, EventKind::Instance, 3),
            ev(1.0, EventKind::Instance, 1),
            ev(1.0, EventKind::Retrain, 0),
            ev(0.5, EventKind::Window, 9),
        ]
        .into_iter()
        .collect();
        let mut order = Vec::new();
        while let Some(e) = heap.pop() {
            order.push((e.at, e.kind, e.id));
        }
        assert_eq!(
            order,
            vec![
                (0.5, EventKind::Window, 9),
                (1.0, EventKind::Instance, 1),
                (1.0, EventKind::Instance, 3),
                (1.0, EventKind::Retrain, 0),
                (1.0, EventKind::WaitExpiry, 0),
                (2.0, EventKind::Instance, 0),
            ]
        );
    }
}
