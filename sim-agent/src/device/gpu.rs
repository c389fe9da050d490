//! One simulated GPU: the MIG state machine with time as an argument.

use std::collections::BTreeMap;

use tessera_agent::backend::{BackendError, GpuInfo, GpuInstance, InstanceId, MigMode, Operation, Unsupported};
use tessera_core::catalog::{GpuModel, MEMORY_SLICES, Profile};
use tessera_core::ids::MigUuid;
use tessera_core::layout::{Layout, LayoutError, Placement};
use tessera_core::reconfig::ReconfigLatency;
use tessera_core::time::SimTime;

/// The GPU architecture, as far as MIG mode changes differ (NVIDIA MIG User Guide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// A100: changing the MIG mode resets the GPU, which any driver client (dcgm, nvsm) blocks; the mode persists
    /// across reboots and driver reloads.
    Ampere,
    /// H100, H200: no reset, but the mode is lost on a driver reload.
    Hopper,
    /// B200: as Hopper ("Hopper and later").
    Blackwell,
}

impl Architecture {
    /// The architecture of a catalog model.
    pub const fn of(model: GpuModel) -> Architecture {
        match model {
            GpuModel::A100_40GB | GpuModel::A100_80GB => Architecture::Ampere,
            GpuModel::H100_80GB | GpuModel::H200_141GB => Architecture::Hopper,
            GpuModel::B200_180GB => Architecture::Blackwell,
        }
    }

    /// Whether a MIG mode change takes effect through a GPU reset (and so waits while a driver client is attached).
    pub const fn mode_change_resets_gpu(self) -> bool {
        matches!(self, Architecture::Ampere)
    }

    /// Whether the MIG mode survives a driver reload (or reboot).
    pub const fn mode_survives_driver_reload(self) -> bool {
        matches!(self, Architecture::Ampere)
    }
}

/// A GPU instance on a simulated GPU, with when it was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimInstance {
    /// The GI id.
    pub id: InstanceId,
    /// Its placement.
    pub placement: Placement,
    /// When the create call began on the GPU (after the calls before it on this GPU).
    pub started_at: SimTime,
    /// When the create call ended: the instance exists and work can be loaded onto it.
    pub available_at: SimTime,
    /// When work loaded at creation (a pre-initialised instance) serves: `available_at` plus the warm-up.
    pub warm_at: SimTime,
    /// Whether work runs on it (processes); a busy instance cannot be destroyed.
    pub busy: bool,
    /// The MIG device's UUID: stable while the instance lives (and across a restart of a persisted simulator),
    /// new for every instance created.
    pub uuid: MigUuid,
}

impl SimInstance {
    /// When work loaded at `loaded_at` serves, given the warm-up (CUDA context and model load) of
    /// `warmup_ms`: loading cannot begin before the instance is available.
    pub fn serves_from(&self, loaded_at: SimTime, warmup_ms: u64) -> SimTime {
        loaded_at.max(self.available_at) + warmup_ms
    }

    /// The NVML view of the instance.
    pub fn as_gpu_instance(&self) -> GpuInstance {
        GpuInstance { id: self.id, placement: self.placement, uuid: Some(self.uuid) }
    }
}

/// When a MIG call ran on the GPU's sequential call timeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpTiming {
    /// When it began (after the calls before it on this GPU).
    pub started_at: SimTime,
    /// When it ended.
    pub done_at: SimTime,
}

/// An injected failure: the next `times` calls of `operation` (any operation when `None`) on the GPU fail with
/// `error`. With `applied`, a create, destroy or mode change takes effect before the error is returned: the reply
/// was lost, as when the agent crashes right after the driver acted.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    /// The operation it hits, or every operation.
    pub operation: Option<Operation>,
    /// How many calls it fails.
    pub times: u32,
    /// What those calls return.
    pub error: BackendError,
    /// Whether the call takes effect anyway.
    pub applied: bool,
}

impl Fault {
    /// The next `times` calls of `operation` fail with `error` and change nothing.
    pub fn fail(operation: Option<Operation>, times: u32, error: BackendError) -> Fault {
        Fault { operation, times, error, applied: false }
    }

    /// The same fault, but the calls take effect before they fail (a lost reply).
    pub fn after_applying(mut self) -> Fault {
        self.applied = true;
        self
    }
}

/// One simulated GPU: MIG mode, GPU instances, a sequential MIG-call timeline, driver clients and injected
/// faults. Every method that changes it takes the time of the call; see the [module documentation](super).
#[derive(Debug, Clone)]
pub struct SimGpu {
    index: u32,
    name: String,
    model: Option<GpuModel>,
    mode: MigMode,
    instances: BTreeMap<InstanceId, SimInstance>,
    latency: ReconfigLatency,
    calls_free_at: SimTime,
    driver_client: bool,
    faults: Vec<Fault>,
    /// Seeds the UUIDs of the instances it creates (a node's simulator gives each GPU its own).
    uuid_seed: u64,
    /// Instances created so far: the next instance's UUID is drawn from the seed and this count.
    uuids_drawn: u64,
}

/// The UUID of the `n`th instance created on a GPU whose seed is `seed`: deterministic, distinct for distinct
/// `(seed, n)` with overwhelming probability, and shaped as a version-4 UUID, as the driver's are.
fn draw_uuid(seed: u64, n: u64) -> MigUuid {
    fn splitmix(mut z: u64) -> u64 {
        z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    let hi = splitmix(seed ^ splitmix(n));
    let lo = splitmix(hi ^ n.rotate_left(17));
    let v = (u128::from(hi) << 64) | u128::from(lo);
    // Version 4, RFC 4122 variant.
    MigUuid((v & !(0xF_u128 << 76) & !(0x3_u128 << 62)) | (0x4_u128 << 76) | (0x2_u128 << 62))
}

impl SimGpu {
    /// A GPU of `model` at NVML index `index` with MIG enabled and no instance (a node prepared for Tessera),
    /// default latencies.
    pub fn new(index: u32, model: GpuModel) -> SimGpu {
        SimGpu {
            index,
            name: model.spec().product_name.to_string(),
            model: Some(model),
            mode: MigMode::ENABLED,
            instances: BTreeMap::new(),
            latency: ReconfigLatency::default(),
            calls_free_at: SimTime::ZERO,
            driver_client: false,
            faults: Vec::new(),
            uuid_seed: u64::from(index),
            uuids_drawn: 0,
        }
    }

    /// The same GPU drawing its instances' UUIDs from `seed` (give every simulated GPU of a fleet its own).
    pub fn with_uuid_seed(mut self, seed: u64) -> SimGpu {
        self.uuid_seed = seed;
        self
    }

    /// How many instance UUIDs the GPU has drawn (persisted with the GPU so a restored one draws new ones).
    pub fn uuids_drawn(&self) -> u64 {
        self.uuids_drawn
    }

    /// Restores what [`SimGpu::uuids_drawn`] said, and the UUID of a restored instance.
    pub fn restore_uuids(&mut self, drawn: u64, instances: &[(InstanceId, MigUuid)]) {
        self.uuids_drawn = self.uuids_drawn.max(drawn);
        for (id, uuid) in instances {
            if let Some(i) = self.instances.get_mut(id) {
                i.uuid = *uuid;
            }
        }
    }

    /// A GPU of `model` with MIG disabled, as it leaves the factory.
    pub fn mig_disabled(index: u32, model: GpuModel) -> SimGpu {
        SimGpu { mode: MigMode::DISABLED, ..SimGpu::new(index, model) }
    }

    /// A GPU without MIG support (or that the catalog does not know), reported as `name`.
    pub fn without_mig(index: u32, name: impl Into<String>) -> SimGpu {
        SimGpu { name: name.into(), model: None, mode: MigMode::DISABLED, ..SimGpu::new(index, GpuModel::A100_40GB) }
    }

    /// The same GPU with other MIG-call and warm-up latencies.
    pub fn with_latency(mut self, latency: ReconfigLatency) -> SimGpu {
        self.latency = latency;
        self
    }

    /// The NVML device index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The product name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The catalog model, `None` for a GPU without MIG.
    pub fn model(&self) -> Option<GpuModel> {
        self.model
    }

    /// The MIG mode, `None` for a GPU without MIG.
    pub fn mig_mode(&self) -> Option<MigMode> {
        self.model.map(|_| self.mode)
    }

    /// What [`tessera_agent::backend::MigBackend::gpus`] reports for this GPU.
    pub fn info(&self) -> GpuInfo {
        GpuInfo { index: self.index, name: self.name.clone(), model: self.model, mig: self.mig_mode() }
    }

    /// The latencies of its MIG calls and of the warm-up.
    pub fn latency(&self) -> ReconfigLatency {
        self.latency
    }

    /// When the last MIG call issued so far ends; the next call starts then at the earliest.
    pub fn calls_free_at(&self) -> SimTime {
        self.calls_free_at
    }

    /// Whether a driver client (dcgm, nvsm) holds the GPU.
    pub fn driver_client(&self) -> bool {
        self.driver_client
    }

    /// The instances, by id.
    pub fn instances(&self) -> impl Iterator<Item = &SimInstance> {
        self.instances.values()
    }

    /// The instance with this id.
    pub fn instance(&self, id: InstanceId) -> Option<&SimInstance> {
        self.instances.get(&id)
    }

    /// The instances' placements as a layout.
    pub fn layout(&self) -> Layout {
        self.instances.values().map(|i| i.placement).collect()
    }

    /// The GPU's invariant: its instances form a layout that is valid for its model (every start allowed, no slice
    /// used twice, no profile over its count, at most seven instances). The agent's reconcile loop relies on reading
    /// back a valid layout; every call that would break it is refused, so a violation is a bug in this module.
    /// (That only a GPU in MIG mode has instances holds by construction: a mode change needs an empty GPU, and a
    /// reset empties it.)
    pub fn check_invariant(&self) -> Result<(), LayoutError> {
        match self.model {
            Some(model) => self.layout().validate(model),
            None => Ok(()),
        }
    }

    /// What `nvmlDeviceGetGpuInstances` returns: the instances ordered by placement; `NotSupported` without MIG
    /// mode. (`&mut` because it consumes an injected [`Operation::ListInstances`] fault.)
    pub fn list(&mut self) -> Result<Vec<GpuInstance>, BackendError> {
        self.faulted(Operation::ListInstances, |gpu| {
            gpu.mig_model(Operation::ListInstances)?;
            let mut v: Vec<GpuInstance> = gpu.instances.values().map(SimInstance::as_gpu_instance).collect();
            v.sort_by_key(|i| i.placement);
            Ok(v)
        })
    }

    /// Consumes a matching fault of [`Operation::ListGpus`], if any (the GPU list itself cannot fail otherwise).
    pub(super) fn list_gpus_fault(&mut self) -> Result<(), BackendError> {
        self.faulted(Operation::ListGpus, |_| Ok(()))
    }

    /// Creates a GPU instance (and its full compute instance) at `placement`, as
    /// `nvmlDeviceCreateGpuInstanceWithPlacement` at time `now`. The call starts when the GPU's previous MIG call
    /// ends and takes `create_ms`; the returned instance says when it is available and when it would be warm.
    ///
    /// Errors, checked in this order, with nothing changed: `NotSupported` without MIG support or with MIG
    /// disabled, or for a profile the model lacks; `InvalidPlacement` for a start the profile cannot take;
    /// `InsufficientResources` when [`Layout::can_add`] refuses (slices taken, profile or GPU at its limit).
    pub fn create(&mut self, now: SimTime, placement: Placement) -> Result<SimInstance, BackendError> {
        self.faulted(Operation::Create, |gpu| gpu.apply_create(now, placement))
    }

    fn apply_create(&mut self, now: SimTime, placement: Placement) -> Result<SimInstance, BackendError> {
        let gpu = self.index;
        let model = self.mig_model(Operation::Create)?;
        let layout = self.layout();
        if !layout.can_add(model, placement) {
            let mut with = layout;
            with.insert(placement);
            return Err(match with.validate(model) {
                Err(reason @ LayoutError::BadStart { .. }) => BackendError::InvalidPlacement { gpu, placement, reason },
                Err(LayoutError::ProfileNotOnModel { model, profile }) => BackendError::NotSupported {
                    gpu,
                    operation: Operation::Create,
                    reason: Unsupported::ProfileNotOnModel { model, profile },
                },
                // The current layout is valid, so what `validate` finds is the new placement's fault.
                other => BackendError::InsufficientResources { gpu, placement, reason: other.err() },
            });
        }
        let Some(id) = self.free_id(placement.profile) else {
            return Err(BackendError::InsufficientResources { gpu, placement, reason: None });
        };
        let started_at = now.max(self.calls_free_at);
        let available_at = started_at + self.latency.create_ms;
        self.calls_free_at = available_at;
        let instance = SimInstance {
            id,
            placement,
            started_at,
            available_at,
            warm_at: available_at + self.latency.warmup_ms,
            busy: false,
            uuid: draw_uuid(self.uuid_seed, self.uuids_drawn),
        };
        self.uuids_drawn += 1;
        self.instances.insert(id, instance);
        debug_assert_eq!(self.check_invariant(), Ok(()));
        Ok(instance)
    }

    /// The lowest free GI id in the profile's size class. NVML draws GI ids from a per-GPU pool by memory size
    /// (an observed A100/H100 pattern: 0 for 8 memory slices, 1-2 for 4, 3-6 for 2, 7-14 for 1), reuses them after
    /// a destroy, and does not tie them to a start; the lowest-free rule is this simulator's deterministic choice.
    fn free_id(&self, profile: Profile) -> Option<InstanceId> {
        let per_gpu = u32::from(MEMORY_SLICES / profile.memory_slices());
        let first = per_gpu - 1;
        (first..first + per_gpu).map(InstanceId).find(|id| !self.instances.contains_key(id))
    }

    /// Destroys an instance's compute instance and GPU instance, as `nvmlComputeInstanceDestroy` and
    /// `nvmlGpuInstanceDestroy` at time `now`; the call starts when the previous MIG call ends and takes
    /// `destroy_ms`. Its slices are free for the next call.
    ///
    /// Errors, with nothing changed: `NotSupported` without MIG; `NotFound` for an unknown id; `InUse` while the
    /// instance is busy (only that instance is refused).
    pub fn destroy(&mut self, now: SimTime, id: InstanceId) -> Result<OpTiming, BackendError> {
        self.faulted(Operation::Destroy, |gpu| gpu.apply_destroy(now, id))
    }

    fn apply_destroy(&mut self, now: SimTime, id: InstanceId) -> Result<OpTiming, BackendError> {
        let gpu = self.index;
        self.mig_model(Operation::Destroy)?;
        let instance = self.instances.get(&id).ok_or(BackendError::NotFound { gpu, instance: id })?;
        if instance.busy {
            return Err(BackendError::InUse { gpu, instance: id, placement: instance.placement });
        }
        self.instances.remove(&id);
        let started_at = now.max(self.calls_free_at);
        let done_at = started_at + self.latency.destroy_ms;
        self.calls_free_at = done_at;
        Ok(OpTiming { started_at, done_at })
    }

    /// Asks for MIG mode on or off, as `nvmlDeviceSetMigMode`, and returns the mode afterwards.
    ///
    /// Asking for the current mode is a no-op (and cancels a pending change). Otherwise the GPU must have no
    /// instance (`GpuBusy`). On Ampere the change resets the GPU: it takes effect at once unless a driver client
    /// holds the GPU, in which case it stays pending until [`SimGpu::reset`]. On Hopper and later it takes effect
    /// at once. A GPU without MIG answers `NotSupported`. The change itself is taken as instantaneous.
    pub fn set_mig_mode(&mut self, enabled: bool) -> Result<MigMode, BackendError> {
        self.faulted(Operation::SetMigMode, |gpu| gpu.apply_set_mig_mode(enabled))
    }

    fn apply_set_mig_mode(&mut self, enabled: bool) -> Result<MigMode, BackendError> {
        let gpu = self.index;
        let Some(model) = self.model else {
            return Err(self.not_mig_capable(Operation::SetMigMode));
        };
        if enabled == self.mode.current {
            self.mode.pending = enabled;
            return Ok(self.mode);
        }
        if !self.instances.is_empty() {
            return Err(BackendError::GpuBusy { gpu, instances: self.instances.len() });
        }
        self.mode.pending = enabled;
        if !(Architecture::of(model).mode_change_resets_gpu() && self.driver_client) {
            self.mode.current = enabled;
        }
        Ok(self.mode)
    }

    /// Marks an instance busy (work in flight: destroy fails with `InUse`) or idle.
    pub fn set_busy(&mut self, id: InstanceId, busy: bool) -> Result<(), BackendError> {
        let gpu = self.index;
        let instance = self.instances.get_mut(&id).ok_or(BackendError::NotFound { gpu, instance: id })?;
        instance.busy = busy;
        Ok(())
    }

    /// Attaches or detaches a driver client (dcgm, nvsm), which blocks the reset of an Ampere MIG mode change.
    pub fn set_driver_client(&mut self, attached: bool) {
        self.driver_client = attached;
    }

    /// Resets the GPU at `now` (`nvidia-smi -r`): every instance is gone (work on them dies), a pending MIG mode
    /// takes effect, and MIG calls in flight are cut short. Returns the instances that were destroyed.
    pub fn reset(&mut self, now: SimTime) -> Vec<SimInstance> {
        self.mode.current = self.mode.pending;
        self.calls_free_at = now;
        std::mem::take(&mut self.instances).into_values().collect()
    }

    /// Reloads the driver (or reboots the node) at `now`: a reset, after which Hopper and later GPUs are back in
    /// non-MIG mode while Ampere keeps its mode. Returns the instances that were destroyed.
    pub fn reload_driver(&mut self, now: SimTime) -> Vec<SimInstance> {
        let lost = self.reset(now);
        if let Some(model) = self.model
            && !Architecture::of(model).mode_survives_driver_reload()
        {
            self.mode = MigMode::DISABLED;
        }
        lost
    }

    /// Adds a fault (one for no call is dropped); faults are consumed in the order they were added.
    pub fn inject(&mut self, fault: Fault) {
        if fault.times > 0 {
            self.faults.push(fault);
        }
    }

    /// Faults not yet used up.
    pub fn pending_faults(&self) -> &[Fault] {
        &self.faults
    }

    /// Runs `op` under the first fault that matches `operation`: without `applied` the fault's error replaces the
    /// call; with it the call runs and its success is reported as the fault's error.
    fn faulted<T>(
        &mut self,
        operation: Operation,
        op: impl FnOnce(&mut SimGpu) -> Result<T, BackendError>,
    ) -> Result<T, BackendError> {
        let Some(i) = self.faults.iter().position(|f| f.operation.is_none_or(|o| o == operation)) else {
            return op(self);
        };
        self.faults[i].times -= 1;
        let fault = if self.faults[i].times == 0 { self.faults.remove(i) } else { self.faults[i].clone() };
        if fault.applied {
            op(self)?;
        }
        Err(fault.error)
    }

    /// The model, if the GPU is in MIG mode; the `NotSupported` error for `operation` otherwise.
    fn mig_model(&self, operation: Operation) -> Result<GpuModel, BackendError> {
        match self.model {
            None => Err(self.not_mig_capable(operation)),
            Some(_) if !self.mode.current => Err(BackendError::NotSupported {
                gpu: self.index,
                operation,
                reason: Unsupported::MigDisabled { pending_enable: self.mode.pending },
            }),
            Some(model) => Ok(model),
        }
    }

    fn not_mig_capable(&self, operation: Operation) -> BackendError {
        BackendError::NotSupported {
            gpu: self.index,
            operation,
            reason: Unsupported::NotMigCapable { name: self.name.clone() },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Placement {
        s.parse().unwrap()
    }

    #[test]
    fn ids_come_from_the_size_class_pools() {
        let mut g = SimGpu::new(0, GpuModel::A100_40GB);
        let t = SimTime::ZERO;
        let ids: Vec<u32> = ["3g@4", "2g@0", "1g@2", "1g@3"].iter().map(|s| g.create(t, p(s)).unwrap().id.0).collect();
        assert_eq!(ids, [1, 3, 7, 8]);
        let mut h = SimGpu::new(1, GpuModel::H100_80GB);
        assert_eq!(h.create(t, p("7g@0")).unwrap().id, InstanceId(0));
        let mut d = SimGpu::new(2, GpuModel::H100_80GB);
        let ids: Vec<u32> =
            ["1g.2x@0", "2g@2", "1g.2x@4", "1g.2x@6"].iter().map(|s| d.create(t, p(s)).unwrap().id.0).collect();
        assert_eq!(ids, [3, 4, 5, 6], "the four two-slice ids cover every two-slice layout");
    }

    #[test]
    fn a_fault_that_fails_an_applied_call_keeps_the_effect() {
        let mut g = SimGpu::new(0, GpuModel::H100_80GB);
        let lost = BackendError::GpuLost { gpu: 0, operation: Operation::Create };
        g.inject(Fault::fail(Some(Operation::Create), 1, lost.clone()).after_applying());
        assert_eq!(g.create(SimTime::ZERO, p("3g@0")), Err(lost));
        assert_eq!(g.layout().to_string(), "3g@0", "the driver acted, the reply was lost");
        assert!(g.pending_faults().is_empty());
        // A fault for another operation leaves creates alone and waits for its own.
        let denied = BackendError::NoPermission { gpu: 0, operation: Operation::Destroy };
        g.inject(Fault::fail(Some(Operation::Destroy), 2, denied.clone()));
        let id = g.create(SimTime::ZERO, p("3g@4")).unwrap().id;
        assert_eq!(g.destroy(SimTime::ZERO, id), Err(denied.clone()));
        assert_eq!(g.destroy(SimTime::ZERO, id), Err(denied));
        assert!(g.destroy(SimTime::ZERO, id).is_ok());
        assert_eq!(g.layout().to_string(), "3g@0");
    }

    #[test]
    fn architectures_follow_the_reference() {
        assert_eq!(Architecture::of(GpuModel::A100_80GB), Architecture::Ampere);
        assert!(Architecture::Ampere.mode_change_resets_gpu() && Architecture::Ampere.mode_survives_driver_reload());
        for m in [GpuModel::H100_80GB, GpuModel::H200_141GB, GpuModel::B200_180GB] {
            let a = Architecture::of(m);
            assert!(!a.mode_change_resets_gpu() && !a.mode_survives_driver_reload(), "{m}");
        }
    }

    #[test]
    fn the_invariant_catches_a_broken_state() {
        let mut g = SimGpu::new(0, GpuModel::A100_40GB);
        g.create(SimTime::ZERO, p("3g@0")).unwrap();
        assert_eq!(g.check_invariant(), Ok(()));
        // Forge an overlap behind the state machine's back.
        let forged = SimInstance { id: InstanceId(9), placement: p("2g@2"), ..*g.instance(InstanceId(1)).unwrap() };
        g.instances.insert(forged.id, forged);
        assert!(matches!(g.check_invariant(), Err(LayoutError::Overlap { .. })));
    }
}
