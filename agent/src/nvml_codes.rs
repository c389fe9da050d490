//! The pure part of the NVML backend: NVML return codes, profile ids and placements mapped to `core` types and
//! [`BackendError`]s. No NVML here (it builds without the `nvml` feature), so it is unit-tested on any machine;
//! the `nvml` backend module (feature `nvml`) calls it with what the driver returned.
//!
//! Sources: `nvml.h` (`nvmlReturn_t` values, `NVML_GPU_INSTANCE_PROFILE_*` indices, which call returns what) and the
//! NVIDIA MIG User Guide (profile IDs, placements).

use tessera_core::catalog::{GpuModel, Profile};
use tessera_core::layout::Placement;

use crate::backend::{BackendError, GpuInstance, MigMode, Operation, Unsupported};

/// `nvmlReturn_t` values the mapping distinguishes (nvml.h).
pub mod code {
    /// `NVML_SUCCESS`.
    pub const SUCCESS: u32 = 0;
    /// `NVML_ERROR_INVALID_ARGUMENT`.
    pub const INVALID_ARGUMENT: u32 = 2;
    /// `NVML_ERROR_NOT_SUPPORTED`.
    pub const NOT_SUPPORTED: u32 = 3;
    /// `NVML_ERROR_NO_PERMISSION`.
    pub const NO_PERMISSION: u32 = 4;
    /// `NVML_ERROR_NOT_FOUND`.
    pub const NOT_FOUND: u32 = 6;
    /// `NVML_ERROR_GPU_IS_LOST`.
    pub const GPU_IS_LOST: u32 = 15;
    /// `NVML_ERROR_IN_USE`.
    pub const IN_USE: u32 = 19;
    /// `NVML_ERROR_INSUFFICIENT_RESOURCES`.
    pub const INSUFFICIENT_RESOURCES: u32 = 23;
    /// `NVML_ERROR_UNKNOWN`.
    pub const UNKNOWN: u32 = 999;
}

/// The name nvml.h gives a return code.
pub fn code_name(c: u32) -> &'static str {
    match c {
        0 => "NVML_SUCCESS",
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        5 => "NVML_ERROR_ALREADY_INITIALIZED",
        6 => "NVML_ERROR_NOT_FOUND",
        7 => "NVML_ERROR_INSUFFICIENT_SIZE",
        8 => "NVML_ERROR_INSUFFICIENT_POWER",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        10 => "NVML_ERROR_TIMEOUT",
        11 => "NVML_ERROR_IRQ_ISSUE",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
        14 => "NVML_ERROR_CORRUPTED_INFOROM",
        15 => "NVML_ERROR_GPU_IS_LOST",
        16 => "NVML_ERROR_RESET_REQUIRED",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        19 => "NVML_ERROR_IN_USE",
        20 => "NVML_ERROR_MEMORY",
        21 => "NVML_ERROR_NO_DATA",
        22 => "NVML_ERROR_VGPU_ECC_NOT_ENABLED",
        23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
        24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        26 => "NVML_ERROR_DEPRECATED",
        27 => "NVML_ERROR_NOT_READY",
        28 => "NVML_ERROR_GPU_NOT_FOUND",
        29 => "NVML_ERROR_INVALID_STATE",
        _ => "NVML_ERROR_UNKNOWN",
    }
}

/// The `NVML_GPU_INSTANCE_PROFILE_*` index of a profile (what `nvmlDeviceGetGpuInstanceProfileInfo` takes; its
/// answer's `id` is the profile ID that placements and creation take).
pub const fn profile_index(p: Profile) -> u32 {
    match p {
        Profile::G1 => 0,       // NVML_GPU_INSTANCE_PROFILE_1_SLICE
        Profile::G2 => 1,       // NVML_GPU_INSTANCE_PROFILE_2_SLICE
        Profile::G3 => 2,       // NVML_GPU_INSTANCE_PROFILE_3_SLICE
        Profile::G4 => 3,       // NVML_GPU_INSTANCE_PROFILE_4_SLICE
        Profile::G7 => 4,       // NVML_GPU_INSTANCE_PROFILE_7_SLICE
        Profile::G1Me => 7,     // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1 (with media extensions)
        Profile::G1Double => 9, // NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 (double memory)
    }
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*` index of the compute instance that spans a whole GPU instance of `p`
/// (1c: 0, 2c: 1, 3c: 2, 4c: 3, 7c: 4).
pub const fn full_ci_profile_index(p: Profile) -> u32 {
    match p.compute_slices() {
        1 => 0,
        2 => 1,
        3 => 2,
        4 => 3,
        _ => 4,
    }
}

/// A GPU instance NVML reported that is no placement of the catalog's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NvmlPlacementError {
    /// A profile ID the catalog does not know.
    #[error("unknown GPU instance profile ID {0}")]
    UnknownProfile(u32),
    /// A size that does not match the profile.
    #[error("profile ID {profile_id} ({profile}) reported with {size} memory slices; the catalog says {expected}")]
    Size {
        /// The profile ID.
        profile_id: u32,
        /// Its profile.
        profile: Profile,
        /// The size reported.
        size: u32,
        /// The profile's size.
        expected: u8,
    },
    /// A start beyond any slice.
    #[error("placement start {0} out of range")]
    Start(u32),
    /// A start the profile may not take.
    #[error("{0}")]
    Placement(String),
}

/// A GPU instance read back from NVML (`nvmlGpuInstanceInfo_t`: profile ID and placement `{start, size}`) as a core
/// placement. Refuses a profile ID the catalog does not know and a size that does not match the profile.
pub fn placement_from_nvml(profile_id: u32, start: u32, size: u32) -> Result<Placement, NvmlPlacementError> {
    let profile = Profile::from_nvidia_id(profile_id).ok_or(NvmlPlacementError::UnknownProfile(profile_id))?;
    if size != u32::from(profile.memory_slices()) {
        return Err(NvmlPlacementError::Size { profile_id, profile, size, expected: profile.memory_slices() });
    }
    let start = u8::try_from(start).map_err(|_| NvmlPlacementError::Start(start))?;
    let p = Placement::new(profile, start);
    p.check_start().map_err(|e| NvmlPlacementError::Placement(e.to_string()))?;
    Ok(p)
}

/// What the failing call was about, for the error it becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// `nvmlDeviceCreateGpuInstanceWithPlacement` (and its compute instance).
    Create(Placement),
    /// `nvmlComputeInstanceDestroy` / `nvmlGpuInstanceDestroy`.
    Destroy(GpuInstance),
    /// Any other call.
    Other(Operation),
}

impl Call {
    fn operation(self) -> Operation {
        match self {
            Call::Create(_) => Operation::Create,
            Call::Destroy(_) => Operation::Destroy,
            Call::Other(op) => op,
        }
    }
}

/// What the backend knows about the GPU when a call fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuContext {
    /// The device index.
    pub gpu: u32,
    /// The product name.
    pub name: String,
    /// The catalog model.
    pub model: Option<GpuModel>,
    /// The MIG mode, `None` without MIG support.
    pub mig: Option<MigMode>,
}

/// The [`BackendError`] for NVML return code `c` from `call` on the GPU. `c` must not be `NVML_SUCCESS`.
pub fn error_from_code(c: u32, call: Call, gpu: &GpuContext) -> BackendError {
    let operation = call.operation();
    let index = gpu.gpu;
    let driver = || BackendError::Driver { gpu: index, operation, detail: format!("{} ({c})", code_name(c)) };
    match (c, call) {
        (code::INVALID_ARGUMENT, Call::Create(placement)) => match placement.check_start() {
            Err(reason) => BackendError::InvalidPlacement { gpu: index, placement, reason },
            Ok(()) => driver(),
        },
        (code::INSUFFICIENT_RESOURCES, Call::Create(placement)) => {
            BackendError::InsufficientResources { gpu: index, placement, reason: None }
        }
        (code::IN_USE, Call::Destroy(i)) => BackendError::InUse { gpu: index, instance: i.id, placement: i.placement },
        (code::IN_USE, Call::Other(Operation::SetMigMode)) => BackendError::GpuBusy { gpu: index, instances: 0 },
        (code::NOT_FOUND, Call::Destroy(i)) => BackendError::NotFound { gpu: index, instance: i.id },
        (code::NOT_SUPPORTED, _) => {
            let reason = match (gpu.model, gpu.mig, call) {
                (None, _, _) | (_, None, _) => Unsupported::NotMigCapable { name: gpu.name.clone() },
                (_, Some(m), _) if !m.current => Unsupported::MigDisabled { pending_enable: m.pending },
                (Some(model), Some(_), Call::Create(p)) => Unsupported::ProfileNotOnModel { model, profile: p.profile },
                _ => return driver(),
            };
            BackendError::NotSupported { gpu: index, operation, reason }
        }
        (code::NO_PERMISSION, _) => BackendError::NoPermission { gpu: index, operation },
        (code::GPU_IS_LOST, _) => BackendError::GpuLost { gpu: index, operation },
        _ => driver(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::InstanceId;

    fn ctx(mig: Option<MigMode>) -> GpuContext {
        GpuContext { gpu: 1, name: "NVIDIA A100-SXM4-40GB".into(), model: Some(GpuModel::A100_40GB), mig }
    }

    #[test]
    fn profile_indices_and_ids_follow_nvml() {
        // Every profile has a distinct index, and NVML's answer for it (the ID) maps back to the profile.
        let mut seen = std::collections::BTreeSet::new();
        for p in Profile::ALL {
            assert!(seen.insert(profile_index(p)), "{p}");
            assert_eq!(Profile::from_nvidia_id(p.nvidia_id()), Some(p));
        }
        assert_eq!(profile_index(Profile::G7), 4);
        assert_eq!(full_ci_profile_index(Profile::G7), 4);
        assert_eq!(full_ci_profile_index(Profile::G1Double), 0);
        assert_eq!(full_ci_profile_index(Profile::G3), 2);
        assert_eq!(placement_from_nvml(9, 4, 4), Ok("3g@4".parse().unwrap()));
        assert_eq!(placement_from_nvml(15, 6, 2), Ok("1g.2x@6".parse().unwrap()));
        assert!(placement_from_nvml(9, 4, 2).unwrap_err().to_string().contains("2 memory slices"));
        assert!(placement_from_nvml(9, 2, 4).unwrap_err().to_string().contains("3g can only start"));
        assert!(placement_from_nvml(42, 0, 1).unwrap_err().to_string().contains("unknown GPU instance profile ID 42"));
    }

    #[test]
    fn return_codes_become_the_backend_errors_they_stand_for() {
        let p: Placement = "3g@4".parse().unwrap();
        let on = ctx(Some(MigMode::ENABLED));
        let e = error_from_code(code::INSUFFICIENT_RESOURCES, Call::Create(p), &on);
        assert_eq!(e, BackendError::InsufficientResources { gpu: 1, placement: p, reason: None });
        assert_eq!(e.nvml_code(), "NVML_ERROR_INSUFFICIENT_RESOURCES");
        let bad: Placement = "3g@2".parse().unwrap();
        assert!(matches!(
            error_from_code(code::INVALID_ARGUMENT, Call::Create(bad), &on),
            BackendError::InvalidPlacement { .. }
        ));
        let inst = GpuInstance { id: InstanceId(2), placement: p, uuid: None };
        assert_eq!(
            error_from_code(code::IN_USE, Call::Destroy(inst), &on),
            BackendError::InUse { gpu: 1, instance: InstanceId(2), placement: p }
        );
        assert_eq!(
            error_from_code(code::NOT_FOUND, Call::Destroy(inst), &on),
            BackendError::NotFound { gpu: 1, instance: InstanceId(2) }
        );
        let off = ctx(Some(MigMode { current: false, pending: true }));
        assert_eq!(
            error_from_code(code::NOT_SUPPORTED, Call::Other(Operation::ListInstances), &off),
            BackendError::NotSupported {
                gpu: 1,
                operation: Operation::ListInstances,
                reason: Unsupported::MigDisabled { pending_enable: true }
            }
        );
        let none = GpuContext { model: None, mig: None, name: "Tesla T4".into(), gpu: 0 };
        assert!(error_from_code(code::NOT_SUPPORTED, Call::Create(p), &none).to_string().contains("Tesla T4"));
        assert_eq!(
            error_from_code(code::NO_PERMISSION, Call::Create(p), &on),
            BackendError::NoPermission { gpu: 1, operation: Operation::Create }
        );
        let e = error_from_code(18, Call::Other(Operation::ListGpus), &on);
        assert!(e.to_string().contains("NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)"), "{e}");
    }
}
