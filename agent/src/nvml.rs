//! [`NvmlBackend`]: the [`MigBackend`] over real GPUs through NVML (feature `nvml`).
//!
//! `nvml-wrapper` loads libnvidia-ml at run time ([`NvmlBackend::init`] fails with [`NvmlLoadError`] on a machine
//! without a driver; the binary still builds and runs everywhere). It has no safe calls for GPU and compute instance
//! creation and destruction, and its `possible_placements` returns an empty vector, so the MIG calls go through its
//! symbol table (`Nvml::lib()`, `Result`-typed symbols: a missing symbol is an error, never a panic) with the raw
//! device handle (limitations of nvml-wrapper 0.13). Return codes and profile ids are mapped by
//! [`crate::nvml_codes`], the pure part, which is unit-tested without a GPU.
//!
//! Calls (`nvml.h`; see `docs/references.md`): `nvmlDeviceGetMigMode` / `nvmlDeviceSetMigMode`;
//! `nvmlDeviceGetGpuInstanceProfileInfo` (by profile index) for the profile ID; `nvmlDeviceGetGpuInstances` and
//! `nvmlGpuInstanceGetInfo` to read instances back; `nvmlDeviceCreateGpuInstanceWithPlacement` then
//! `nvmlGpuInstanceCreateComputeInstance` (one CI spanning the GI); `nvmlGpuInstanceGetComputeInstances`,
//! `nvmlComputeInstanceDestroy` and `nvmlGpuInstanceDestroy`; `nvmlDeviceGetGpuInstanceById`. MIG identity:
//! `nvmlDeviceGetMaxMigDeviceCount`, `nvmlDeviceGetMigDeviceHandleByIndex`, `nvmlDeviceGetGpuInstanceId` and
//! `nvmlDeviceGetUUID` (each instance's `MIG-...` UUID), `nvmlDeviceGetComputeRunningProcesses_v3` on a MIG device
//! (the processes attached to an instance). The driver's table: `nvmlDeviceGetGpuInstanceProfileInfo` and
//! `nvmlDeviceGetGpuInstancePossiblePlacements_v2` for every profile, `nvmlSystemGetDriverVersion`; all read-only.
//!
//! Not verified on hardware in this repository's CI (no GPU there); the mapping is.

#![allow(unsafe_code)]

use std::mem;

use nvml_wrapper::Nvml;
use nvml_wrapper_sys::bindings::{
    NvmlLib, nvmlComputeInstance_t, nvmlComputeInstanceProfileInfo_t, nvmlDevice_t, nvmlGpuInstance_t,
    nvmlGpuInstanceInfo_t, nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t,
};
use tessera_core::catalog::{GpuModel, Profile};
use tessera_core::driver::{DriverProfile, DriverTable};
use tessera_core::ids::MigUuid;
use tessera_core::layout::Placement;

use crate::backend::{BackendError, GpuInfo, GpuInstance, InstanceId, MigBackend, MigMode, Operation};
use crate::nvml_codes::{
    Call, GpuContext, code, error_from_code, full_ci_profile_index, placement_from_nvml, profile_index,
};

/// NVML could not be initialised (no driver, no library, or a library without `nvmlInit_v2`).
#[derive(Debug, thiserror::Error)]
#[error("NVML could not be loaded: {0}")]
pub struct NvmlLoadError(String);

/// The NVML backend: see the [module documentation](self).
pub struct NvmlBackend {
    nvml: Nvml,
}

/// `NVML_ERROR_INSUFFICIENT_SIZE`.
const INSUFFICIENT_SIZE: u32 = 7;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
const CI_ENGINE_SHARED: u32 = 0;
/// CI profile indices to look for when destroying (`NVML_COMPUTE_INSTANCE_PROFILE_1_SLICE` ..`_1_SLICE_REV1`).
const CI_PROFILE_INDICES: std::ops::Range<u32> = 0..8;

impl NvmlBackend {
    /// Loads libnvidia-ml and initialises NVML.
    pub fn init() -> Result<NvmlBackend, NvmlLoadError> {
        Nvml::init().map(|nvml| NvmlBackend { nvml }).map_err(|e| NvmlLoadError(e.to_string()))
    }

    fn lib(&self) -> &NvmlLib {
        self.nvml.lib()
    }

    fn count(&self) -> Result<u32, BackendError> {
        self.nvml.device_count().map_err(|e| BackendError::Driver {
            gpu: 0,
            operation: Operation::ListGpus,
            detail: e.to_string(),
        })
    }

    /// The device handle and what is known about the GPU.
    fn device(&self, gpu: u32, operation: Operation) -> Result<(nvmlDevice_t, GpuContext), BackendError> {
        let count = self.count()?;
        let device = self.nvml.device_by_index(gpu).map_err(|_| BackendError::NoSuchGpu { gpu, count })?;
        let name = device.name().map_err(|e| BackendError::Driver { gpu, operation, detail: e.to_string() })?;
        // SAFETY: the handle stays valid while `self.nvml` lives; it is only passed back to NVML.
        let handle = unsafe { device.handle() };
        let mig = self.mig_mode(handle, gpu)?;
        let model = GpuModel::lookup(&name);
        Ok((handle, GpuContext { gpu, name, model, mig }))
    }

    fn symbol<T: Copy, E: std::fmt::Display>(
        &self,
        sym: &Result<T, E>,
        gpu: u32,
        operation: Operation,
    ) -> Result<T, BackendError> {
        sym.as_ref().copied().map_err(|e| BackendError::Driver {
            gpu,
            operation,
            detail: format!("the NVML library lacks a MIG symbol ({e}); a newer driver is needed"),
        })
    }

    fn mig_mode(&self, handle: nvmlDevice_t, gpu: u32) -> Result<Option<MigMode>, BackendError> {
        let get = self.symbol(&self.lib().nvmlDeviceGetMigMode, gpu, Operation::ListGpus)?;
        let (mut current, mut pending) = (0u32, 0u32);
        // SAFETY: valid handle and out-pointers to locals.
        let rc = unsafe { get(handle, &mut current, &mut pending) };
        match rc {
            code::SUCCESS => Ok(Some(MigMode { current: current == 1, pending: pending == 1 })),
            code::NOT_SUPPORTED => Ok(None),
            c => Err(BackendError::Driver {
                gpu,
                operation: Operation::ListGpus,
                detail: format!("nvmlDeviceGetMigMode: {}", crate::nvml_codes::code_name(c)),
            }),
        }
    }

    /// The GPU instance profile ID of `profile` on this device, `None` when the device lacks the profile.
    fn profile_id(
        &self,
        handle: nvmlDevice_t,
        ctx: &GpuContext,
        profile: Profile,
        call: Call,
    ) -> Result<Option<u32>, BackendError> {
        let get = self.symbol(&self.lib().nvmlDeviceGetGpuInstanceProfileInfo, ctx.gpu, Operation::ListInstances)?;
        // SAFETY: a zeroed plain C struct is a valid out-parameter.
        let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { mem::zeroed() };
        // SAFETY: valid handle, out-pointer to a local.
        match unsafe { get(handle, profile_index(profile), &mut info) } {
            code::SUCCESS => Ok(Some(info.id)),
            code::NOT_SUPPORTED | code::INVALID_ARGUMENT => Ok(None),
            c => Err(error_from_code(c, call, ctx)),
        }
    }

    /// Every GPU instance with its handle and info.
    fn gpu_instances(
        &self,
        handle: nvmlDevice_t,
        ctx: &GpuContext,
    ) -> Result<Vec<(nvmlGpuInstance_t, nvmlGpuInstanceInfo_t)>, BackendError> {
        let call = Call::Other(Operation::ListInstances);
        let list = self.symbol(&self.lib().nvmlDeviceGetGpuInstances, ctx.gpu, Operation::ListInstances)?;
        let info_of = self.symbol(&self.lib().nvmlGpuInstanceGetInfo, ctx.gpu, Operation::ListInstances)?;
        let mut out = Vec::new();
        for profile in Profile::ALL {
            let Some(id) = self.profile_id(handle, ctx, profile, call)? else { continue };
            let mut buf: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); 8];
            let mut count = 0u32;
            // SAFETY: `buf` holds 8 handles, more than any profile's instance count (7 at most).
            let rc = unsafe { list(handle, id, buf.as_mut_ptr(), &mut count) };
            if rc != code::SUCCESS {
                return Err(error_from_code(rc, call, ctx));
            }
            for &gi in buf.iter().take(count as usize) {
                // SAFETY: zeroed C struct as out-parameter; `gi` came from NVML just now.
                let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
                let rc = unsafe { info_of(gi, &mut info) };
                if rc != code::SUCCESS {
                    return Err(error_from_code(rc, call, ctx));
                }
                out.push((gi, info));
            }
        }
        Ok(out)
    }

    fn to_instance(ctx: &GpuContext, info: &nvmlGpuInstanceInfo_t) -> Result<GpuInstance, BackendError> {
        let placement =
            placement_from_nvml(info.profileId, info.placement.start, info.placement.size).map_err(|e| {
                BackendError::Driver { gpu: ctx.gpu, operation: Operation::ListInstances, detail: e.to_string() }
            })?;
        Ok(GpuInstance { id: InstanceId(info.id), placement, uuid: None })
    }

    /// The MIG devices of a GPU: per GPU instance id, the MIG device handle and its UUID (`None` when the driver's
    /// UUID is not of the `MIG-<uuid>` form). A GI without a compute instance has no MIG device.
    fn mig_devices(
        &self,
        handle: nvmlDevice_t,
        ctx: &GpuContext,
    ) -> Result<std::collections::BTreeMap<u32, (nvmlDevice_t, Option<MigUuid>)>, BackendError> {
        let op = Operation::ListInstances;
        let lib = self.lib();
        let max = self.symbol(&lib.nvmlDeviceGetMaxMigDeviceCount, ctx.gpu, op)?;
        let by_index = self.symbol(&lib.nvmlDeviceGetMigDeviceHandleByIndex, ctx.gpu, op)?;
        let gi_id = self.symbol(&lib.nvmlDeviceGetGpuInstanceId, ctx.gpu, op)?;
        let uuid_of = self.symbol(&lib.nvmlDeviceGetUUID, ctx.gpu, op)?;
        let mut count = 0u32;
        // SAFETY: valid handle, out-pointer to a local.
        let rc = unsafe { max(handle, &mut count) };
        if rc != code::SUCCESS {
            return Err(error_from_code(rc, Call::Other(op), ctx));
        }
        let mut out = std::collections::BTreeMap::new();
        for index in 0..count {
            let mut mig: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: valid handle, out-pointer to a local. Indices without a MIG device answer NOT_FOUND.
            if unsafe { by_index(handle, index, &mut mig) } != code::SUCCESS {
                continue;
            }
            let mut id = 0u32;
            // SAFETY: `mig` came from NVML just now.
            if unsafe { gi_id(mig, &mut id) } != code::SUCCESS {
                continue;
            }
            let mut buf = [0 as std::os::raw::c_char; 96];
            // SAFETY: `buf` holds NVML_DEVICE_UUID_V2_BUFFER_SIZE (96) bytes, the length passed.
            let rc = unsafe { uuid_of(mig, buf.as_mut_ptr(), buf.len() as u32) };
            let uuid = (rc == code::SUCCESS)
                .then(|| {
                    // SAFETY: NVML wrote a NUL-terminated string into `buf`.
                    let text = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
                    match text.parse::<MigUuid>() {
                        Ok(u) => Some(u),
                        Err(e) => {
                            tracing::warn!(gpu = ctx.gpu, gi = id, uuid = %text, error = %e, "MIG UUID not understood");
                            None
                        }
                    }
                })
                .flatten();
            out.insert(id, (mig, uuid));
        }
        Ok(out)
    }

    /// The driver's profile table of a GPU (read-only; works with MIG mode off).
    fn read_driver_table(&self, gpu: u32) -> Result<DriverTable, BackendError> {
        let op = Operation::ListGpus;
        let (handle, ctx) = self.device(gpu, op)?;
        let lib = self.lib();
        let info_of = self.symbol(&lib.nvmlDeviceGetGpuInstanceProfileInfo, gpu, op)?;
        let placements_of = self.symbol(&lib.nvmlDeviceGetGpuInstancePossiblePlacements_v2, gpu, op)?;
        let mut profiles = Vec::new();
        for profile in Profile::ALL {
            // SAFETY: a zeroed plain C struct is a valid out-parameter.
            let mut info: nvmlGpuInstanceProfileInfo_t = unsafe { mem::zeroed() };
            // SAFETY: valid handle, out-pointer to a local.
            match unsafe { info_of(handle, profile_index(profile), &mut info) } {
                code::SUCCESS => {}
                code::NOT_SUPPORTED | code::INVALID_ARGUMENT => continue,
                c => return Err(error_from_code(c, Call::Other(op), &ctx)),
            }
            let mut buf = [nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 8];
            let mut count = buf.len() as u32;
            // SAFETY: `buf` holds `count` placements; NVML writes at most that many and sets `count`.
            let rc = unsafe { placements_of(handle, info.id, buf.as_mut_ptr(), &mut count) };
            if rc != code::SUCCESS {
                return Err(error_from_code(rc, Call::Other(op), &ctx));
            }
            let mut starts: Vec<u8> =
                buf.iter().take(count as usize).filter_map(|p| u8::try_from(p.start).ok()).collect();
            starts.sort_unstable();
            profiles.push(DriverProfile {
                profile,
                id: info.id,
                instance_count: info.instanceCount,
                slices: info.sliceCount,
                sms: info.multiprocessorCount,
                copy_engines: info.copyEngineCount,
                memory_mib: info.memorySizeMB,
                starts,
            });
        }
        let mut version = [0 as std::os::raw::c_char; 80];
        let driver_version = match &lib.nvmlSystemGetDriverVersion {
            // SAFETY: `version` holds NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE (80) bytes, the length passed.
            Ok(get) if unsafe { get(version.as_mut_ptr(), version.len() as u32) } == code::SUCCESS => {
                // SAFETY: NVML wrote a NUL-terminated string.
                unsafe { std::ffi::CStr::from_ptr(version.as_ptr()) }.to_string_lossy().into_owned()
            }
            _ => String::new(),
        };
        Ok(DriverTable { name: ctx.name, model: ctx.model, driver_version, profiles })
    }

    /// Destroys every compute instance of a GPU instance.
    fn destroy_compute_instances(
        &self,
        gi: nvmlGpuInstance_t,
        ctx: &GpuContext,
        call: Call,
    ) -> Result<(), BackendError> {
        let lib = self.lib();
        let info = self.symbol(&lib.nvmlGpuInstanceGetComputeInstanceProfileInfo, ctx.gpu, Operation::Destroy)?;
        let list = self.symbol(&lib.nvmlGpuInstanceGetComputeInstances, ctx.gpu, Operation::Destroy)?;
        let destroy = self.symbol(&lib.nvmlComputeInstanceDestroy, ctx.gpu, Operation::Destroy)?;
        for index in CI_PROFILE_INDICES {
            // SAFETY: zeroed C struct as out-parameter, `gi` from NVML.
            let mut p: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
            if unsafe { info(gi, index, CI_ENGINE_SHARED, &mut p) } != code::SUCCESS {
                continue;
            }
            let mut buf: Vec<nvmlComputeInstance_t> = vec![std::ptr::null_mut(); 8];
            let mut count = 0u32;
            // SAFETY: `buf` holds 8 handles; a GI has at most 7 compute instances.
            let rc = unsafe { list(gi, p.id, buf.as_mut_ptr(), &mut count) };
            if rc != code::SUCCESS {
                return Err(error_from_code(rc, call, ctx));
            }
            for &ci in buf.iter().take(count as usize) {
                // SAFETY: `ci` came from NVML just now.
                let rc = unsafe { destroy(ci) };
                if rc != code::SUCCESS {
                    return Err(error_from_code(rc, call, ctx));
                }
            }
        }
        Ok(())
    }
}

impl MigBackend for NvmlBackend {
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError> {
        (0..self.count()?)
            .map(|i| {
                let (_, ctx) = self.device(i, Operation::ListGpus)?;
                Ok(GpuInfo { index: i, name: ctx.name, model: ctx.model, mig: ctx.mig })
            })
            .collect()
    }

    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, BackendError> {
        let (handle, ctx) = self.device(gpu, Operation::ListInstances)?;
        if !ctx.mig.is_some_and(|m| m.current) {
            return Err(error_from_code(code::NOT_SUPPORTED, Call::Other(Operation::ListInstances), &ctx));
        }
        let devices = self.mig_devices(handle, &ctx)?;
        let mut v: Vec<GpuInstance> = self
            .gpu_instances(handle, &ctx)?
            .iter()
            .map(|(_, info)| {
                let mut i = Self::to_instance(&ctx, info)?;
                i.uuid = devices.get(&info.id).and_then(|(_, u)| *u);
                Ok(i)
            })
            .collect::<Result<_, BackendError>>()?;
        v.sort_by_key(|i| i.placement);
        Ok(v)
    }

    fn processes(&self, gpu: u32, instance: &GpuInstance) -> Result<Vec<u32>, BackendError> {
        let (handle, ctx) = self.device(gpu, Operation::Destroy)?;
        let devices = self.mig_devices(handle, &ctx)?;
        let Some((mig, _)) = devices.get(&instance.id.0) else { return Ok(Vec::new()) };
        let get = self.symbol(&self.lib().nvmlDeviceGetComputeRunningProcesses_v3, gpu, Operation::Destroy)?;
        let mut buf: Vec<nvml_wrapper_sys::bindings::nvmlProcessInfo_t> = Vec::new();
        let mut count = 0u32;
        // Ask for the count first (INSUFFICIENT_SIZE with the count, or SUCCESS with none), then read; a process
        // that starts in between makes the second call fail the same way, so it is retried a few times.
        for _ in 0..4 {
            buf.resize(
                count as usize,
                nvml_wrapper_sys::bindings::nvmlProcessInfo_t {
                    pid: 0,
                    usedGpuMemory: 0,
                    gpuInstanceId: 0,
                    computeInstanceId: 0,
                },
            );
            let mut n = count;
            // SAFETY: `buf` holds `n` entries; NVML writes at most that many and sets `n`.
            let rc = unsafe { get(*mig, &mut n, buf.as_mut_ptr()) };
            match rc {
                code::SUCCESS => return Ok(buf.iter().take(n as usize).map(|p| p.pid).collect()),
                INSUFFICIENT_SIZE => count = n + 4,
                c => return Err(error_from_code(c, Call::Other(Operation::Destroy), &ctx)),
            }
        }
        Err(BackendError::Driver {
            gpu,
            operation: Operation::Destroy,
            detail: format!("{instance}: the process list kept growing while it was read"),
        })
    }

    fn driver_table(&self, gpu: u32) -> Result<Option<DriverTable>, BackendError> {
        self.read_driver_table(gpu).map(Some)
    }

    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<GpuInstance, BackendError> {
        let call = Call::Create(placement);
        let (handle, ctx) = self.device(gpu, Operation::Create)?;
        if !ctx.mig.is_some_and(|m| m.current) {
            return Err(error_from_code(code::NOT_SUPPORTED, call, &ctx));
        }
        let Some(profile_id) = self.profile_id(handle, &ctx, placement.profile, call)? else {
            return Err(error_from_code(code::NOT_SUPPORTED, call, &ctx));
        };
        let lib = self.lib();
        let create_gi = self.symbol(&lib.nvmlDeviceCreateGpuInstanceWithPlacement, gpu, Operation::Create)?;
        let ci_info = self.symbol(&lib.nvmlGpuInstanceGetComputeInstanceProfileInfo, gpu, Operation::Create)?;
        let create_ci = self.symbol(&lib.nvmlGpuInstanceCreateComputeInstance, gpu, Operation::Create)?;
        let destroy_gi = self.symbol(&lib.nvmlGpuInstanceDestroy, gpu, Operation::Create)?;
        let gi_info = self.symbol(&lib.nvmlGpuInstanceGetInfo, gpu, Operation::Create)?;
        let nvml_placement = nvmlGpuInstancePlacement_t {
            start: u32::from(placement.start),
            size: u32::from(placement.profile.memory_slices()),
        };
        let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
        // SAFETY: valid handle, placement by reference, out-pointer to a local.
        let rc = unsafe { create_gi(handle, profile_id, &nvml_placement, &mut gi) };
        if rc != code::SUCCESS {
            return Err(error_from_code(rc, call, &ctx));
        }
        // One compute instance spanning the GI; on failure the GI is destroyed again, so nothing changes.
        let mut ci_profile: nvmlComputeInstanceProfileInfo_t = unsafe { mem::zeroed() };
        let mut ci: nvmlComputeInstance_t = std::ptr::null_mut();
        // SAFETY: `gi` was just created; out-pointers to locals.
        let mut rc =
            unsafe { ci_info(gi, full_ci_profile_index(placement.profile), CI_ENGINE_SHARED, &mut ci_profile) };
        if rc == code::SUCCESS {
            rc = unsafe { create_ci(gi, ci_profile.id, &mut ci) };
        }
        if rc != code::SUCCESS {
            // SAFETY: `gi` exists and has no compute instance.
            let _ = unsafe { destroy_gi(gi) };
            return Err(error_from_code(rc, call, &ctx));
        }
        let mut info: nvmlGpuInstanceInfo_t = unsafe { mem::zeroed() };
        // SAFETY: `gi` exists; out-pointer to a local.
        let rc = unsafe { gi_info(gi, &mut info) };
        if rc != code::SUCCESS {
            return Err(error_from_code(rc, Call::Other(Operation::ListInstances), &ctx));
        }
        let mut created = Self::to_instance(&ctx, &info)?;
        created.uuid = self.mig_devices(handle, &ctx)?.get(&info.id).and_then(|(_, u)| *u);
        Ok(created)
    }

    fn destroy_instance(&self, gpu: u32, instance: InstanceId) -> Result<(), BackendError> {
        let (handle, ctx) = self.device(gpu, Operation::Destroy)?;
        if !ctx.mig.is_some_and(|m| m.current) {
            return Err(error_from_code(code::NOT_SUPPORTED, Call::Other(Operation::Destroy), &ctx));
        }
        let found = self
            .gpu_instances(handle, &ctx)?
            .into_iter()
            .find(|(_, info)| info.id == instance.0)
            .ok_or(BackendError::NotFound { gpu, instance })?;
        let observed = Self::to_instance(&ctx, &found.1)?;
        let call = Call::Destroy(observed);
        self.destroy_compute_instances(found.0, &ctx, call)?;
        let destroy_gi = self.symbol(&self.lib().nvmlGpuInstanceDestroy, gpu, Operation::Destroy)?;
        // SAFETY: `found.0` is a live GI handle read just now.
        let rc = unsafe { destroy_gi(found.0) };
        if rc != code::SUCCESS {
            return Err(error_from_code(rc, call, &ctx));
        }
        Ok(())
    }

    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode, BackendError> {
        let call = Call::Other(Operation::SetMigMode);
        let (handle, ctx) = self.device(gpu, Operation::SetMigMode)?;
        if ctx.mig.is_none() {
            return Err(error_from_code(code::NOT_SUPPORTED, call, &ctx));
        }
        let set = self.symbol(&self.lib().nvmlDeviceSetMigMode, gpu, Operation::SetMigMode)?;
        let mut activation = code::SUCCESS;
        // SAFETY: valid handle, out-pointer to a local.
        let rc = unsafe { set(handle, u32::from(enabled), &mut activation) };
        for c in [rc, activation] {
            if c != code::SUCCESS {
                return Err(error_from_code(c, call, &ctx));
            }
        }
        self.mig_mode(handle, gpu)?.ok_or_else(|| error_from_code(code::NOT_SUPPORTED, call, &ctx))
    }
}
