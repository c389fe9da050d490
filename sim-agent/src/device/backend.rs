//! [`SimBackend`]: simulated GPUs behind the agent's [`MigBackend`] trait.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tessera_agent::backend::{BackendError, GpuInfo, GpuInstance, InstanceId, MigBackend, MigMode};
use tessera_core::catalog::GpuModel;
use tessera_core::layout::Placement;
use tessera_core::time::SimTime;

use super::clock::Clock;
use super::gpu::{Fault, SimGpu, SimInstance};

/// A node's simulated GPUs behind one lock, stamped by a [`Clock`].
///
/// Each trait call is applied to its GPU at `clock.now()` and then waits (outside the lock) until the call's
/// simulated end: with a [`super::VirtualClock`] it returns at once and the caller reads completion times from the
/// [`SimGpu`] ([`SimBackend::with_gpu`]); with a [`super::WallClock`] it blocks like NVML for the configured latency.
/// Either way MIG calls on one GPU run one after another on the GPU's own timeline.
pub struct SimBackend {
    gpus: Mutex<Vec<SimGpu>>,
    clock: Arc<dyn Clock>,
}

impl SimBackend {
    /// A backend over `gpus`, found by their [`SimGpu::index`].
    ///
    /// # Panics
    /// If two GPUs share an index (a bug in the caller's set-up).
    pub fn new(mut gpus: Vec<SimGpu>, clock: Arc<dyn Clock>) -> SimBackend {
        gpus.sort_by_key(SimGpu::index);
        assert!(gpus.windows(2).all(|w| w[0].index() != w[1].index()), "simulated GPUs must have distinct indices");
        SimBackend { gpus: Mutex::new(gpus), clock }
    }

    /// GPUs `0..models.len()` of the given models, MIG enabled, no instance, default latencies.
    pub fn with_models(models: &[GpuModel], clock: Arc<dyn Clock>) -> SimBackend {
        let gpus = (0u32..).zip(models).map(|(i, &m)| SimGpu::new(i, m)).collect();
        SimBackend::new(gpus, clock)
    }

    /// The clock.
    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Reads a GPU.
    pub fn with_gpu<R>(&self, gpu: u32, f: impl FnOnce(&SimGpu) -> R) -> Result<R, BackendError> {
        let gpus = self.lock();
        let count = gpus.len() as u32;
        gpus.iter().find(|g| g.index() == gpu).map(f).ok_or(BackendError::NoSuchGpu { gpu, count })
    }

    /// Changes a GPU; `f` gets the clock's current time.
    pub fn with_gpu_mut<R>(&self, gpu: u32, f: impl FnOnce(&mut SimGpu, SimTime) -> R) -> Result<R, BackendError> {
        let now = self.clock.now();
        let mut gpus = self.lock();
        let count = gpus.len() as u32;
        gpus.iter_mut().find(|g| g.index() == gpu).map(|g| f(g, now)).ok_or(BackendError::NoSuchGpu { gpu, count })
    }

    /// Marks an instance busy (work in flight: destroy fails with `InUse`) or idle.
    pub fn set_busy(&self, gpu: u32, instance: InstanceId, busy: bool) -> Result<(), BackendError> {
        self.with_gpu_mut(gpu, |g, _| g.set_busy(instance, busy))?
    }

    /// Adds a fault to a GPU.
    pub fn inject(&self, gpu: u32, fault: Fault) -> Result<(), BackendError> {
        self.with_gpu_mut(gpu, |g, _| g.inject(fault))
    }

    /// Resets a GPU now; returns the instances that were lost.
    pub fn reset(&self, gpu: u32) -> Result<Vec<SimInstance>, BackendError> {
        self.with_gpu_mut(gpu, |g, now| g.reset(now))
    }

    fn lock(&self) -> MutexGuard<'_, Vec<SimGpu>> {
        // Every SimGpu call validates before it changes anything, so a panic elsewhere leaves no half-done state.
        self.gpus.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl MigBackend for SimBackend {
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        self.lock()
            .iter_mut()
            .map(|g| {
                g.list_gpus_fault()?;
                Ok(g.info())
            })
            .collect()
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, BackendError> {
        self.with_gpu_mut(gpu, |g, _| g.list())?
    }

    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<GpuInstance, BackendError> {
        let created = self.with_gpu_mut(gpu, |g, now| g.create(now, placement))??;
        self.clock.wait_until(created.available_at);
        Ok(created.as_gpu_instance())
    }

    fn destroy_instance(&self, gpu: u32, instance: InstanceId) -> Result<(), BackendError> {
        let timing = self.with_gpu_mut(gpu, |g, now| g.destroy(now, instance))??;
        self.clock.wait_until(timing.done_at);
        Ok(())
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode, BackendError> {
        self.with_gpu_mut(gpu, |g, _| g.set_mig_mode(enabled))?
    }

    /// The catalog's table: the simulated driver agrees with the catalog by construction.
    fn driver_table(&self, gpu: u32) -> Result<Option<tessera_core::driver::DriverTable>, BackendError> {
        self.with_gpu(gpu, |g| g.model().map(tessera_core::driver::DriverTable::from_catalog))
    }
}
