//! The `MigBackend` trait: what the agent needs from a node's GPUs, shaped after NVML's MIG API
//! (`nvml.h`), with NVML's errors.
//!
//! ## Model
//! - A node has GPUs numbered by their NVML device index. Each reports its product name, the catalog model
//!   ([`GpuModel`]) when the catalog knows it, and its MIG mode as NVML does (`nvmlDeviceGetMigMode`: a *current*
//!   and a *pending* mode; they differ while a mode change waits for a GPU reset).
//! - An instance is a GPU instance (GI) at an explicit [`Placement`] (profile and memory-slice start, NVML's
//!   `nvmlDeviceCreateGpuInstanceWithPlacement`) holding **one compute instance that spans the whole GI**. Tessera
//!   gives each GI to one tenant role, and CUDA accepts one CI per GI anyway (NVIDIA MIG User Guide), so finer CIs buy
//!   nothing here. [`MigBackend::create_instance`] creates the GI and its CI; [`MigBackend::destroy_instance`]
//!   destroys the CI, then the GI.
//! - Instances are named by [`InstanceId`], NVML's GI id: unique among the live instances of one GPU, and **reused**
//!   after a destroy or a reset (NVML draws them from a small per-GPU pool). An id says nothing about where the
//!   instance is: read its placement. Only an id read since the last destroy or reset is meaningful (NVML
//!   handles are invalidated by destroy and reset).
//! - Always create with an explicit placement: without one the driver's default order can fail where another
//!   order works (NVIDIA MIG User Guide, placements).
//!
//! ## Errors
//! [`BackendError`] mirrors NVML's return codes ([`BackendError::nvml_code`]): a start the profile cannot take is
//! `NVML_ERROR_INVALID_ARGUMENT`; slices already taken or a profile over its count is
//! `NVML_ERROR_INSUFFICIENT_RESOURCES`; MIG disabled or not supported is `NVML_ERROR_NOT_SUPPORTED`; destroying a
//! GI with work on it is `NVML_ERROR_IN_USE` (only that GI is refused, its neighbours keep running: `nvml.h`). Every
//! message names the GPU and, where there is one, the placement or instance.
//!
//! ## Why synchronous, with `&self`
//! NVML calls block (creating a GI takes about a second) and NVML is thread-safe, so the trait is plain
//! synchronous Rust taking `&self`: an `Arc<dyn MigBackend>` is shared by the reconcile loops and each call runs
//! in `tokio::task::spawn_blocking` without an async mutex around the backend. Implementations keep their state
//! behind their own lock (the simulator) or in the driver (NVML); each call is atomic. Calls for one GPU must still
//! be issued one at a time by the caller (the reconcile loop owns its GPU): the hardware runs MIG calls on a GPU
//! one after another, and the backend does not order concurrent callers.
//!
//! What it does not do: drain work (the runtime drains an instance before destroying it; a backend only refuses
//! with `InUse` while work is there), reset GPUs (an operator act; a mode change that needs one is reported as a
//! pending mode), or choose placements.

use std::fmt;

use serde::{Deserialize, Serialize};
use tessera_core::Profile;
use tessera_core::catalog::GpuModel;
use tessera_core::driver::DriverTable;
use tessera_core::ids::MigUuid;
use tessera_core::layout::{Layout, LayoutError, Placement};
use tessera_core::plan::GpuPlan;

/// A GPU instance id as NVML reports it (`nvmlGpuInstanceInfo_t::id`), unique among the live instances of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(pub u32);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GI {}", self.0)
    }
}

/// A GPU's MIG mode as `nvmlDeviceGetMigMode` reports it (`true` = enabled).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigMode {
    /// The mode in force.
    pub current: bool,
    /// The mode after the next activation (a GPU reset on Ampere); equal to `current` when nothing is pending.
    pub pending: bool,
}

impl MigMode {
    /// MIG enabled, nothing pending.
    pub const ENABLED: MigMode = MigMode { current: true, pending: true };
    /// MIG disabled, nothing pending.
    pub const DISABLED: MigMode = MigMode { current: false, pending: false };

    /// Whether a mode change waits for a GPU reset.
    pub const fn reset_pending(self) -> bool {
        self.current != self.pending
    }
}

impl fmt::Display for MigMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |on: bool| if on { "enabled" } else { "disabled" };
        if self.reset_pending() {
            write!(f, "{} ({} after a GPU reset)", word(self.current), word(self.pending))
        } else {
            f.write_str(word(self.current))
        }
    }
}

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The NVML device index.
    pub index: u32,
    /// The product name NVML reports (`NVIDIA A100-SXM4-40GB`).
    pub name: String,
    /// The catalog model, `None` when the catalog does not know the product (the agent cannot plan for it).
    pub model: Option<GpuModel>,
    /// The MIG mode, `None` when the GPU does not support MIG.
    pub mig: Option<MigMode>,
}

/// A GPU instance (with its one full compute instance) as read back from the GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInstance {
    /// NVML's GI id.
    pub id: InstanceId,
    /// Its profile and memory-slice start.
    pub placement: Placement,
    /// The UUID of the MIG device its compute instance makes (`nvmlDeviceGetUUID`), what a process names in
    /// `CUDA_VISIBLE_DEVICES`; `None` where the driver gave none this backend could read.
    #[serde(default)]
    pub uuid: Option<MigUuid>,
}

impl fmt::Display for GpuInstance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.id, self.placement)
    }
}

/// A backend operation, for error messages and fault injection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    /// [`MigBackend::gpus`].
    ListGpus,
    /// [`MigBackend::instances`].
    ListInstances,
    /// [`MigBackend::create_instance`].
    Create,
    /// [`MigBackend::destroy_instance`].
    Destroy,
    /// [`MigBackend::set_mig_mode`].
    SetMigMode,
    /// [`MigBackend::apply_target`].
    ApplyTarget,
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operation::ListGpus => "list GPUs",
            Operation::ListInstances => "list instances",
            Operation::Create => "create an instance",
            Operation::Destroy => "destroy an instance",
            Operation::SetMigMode => "set the MIG mode",
            Operation::ApplyTarget => "apply a target",
        })
    }
}

/// Why NVML answers `NVML_ERROR_NOT_SUPPORTED`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unsupported {
    /// The GPU has no MIG support (or the catalog does not know it).
    NotMigCapable {
        /// The product name.
        name: String,
    },
    /// MIG mode is disabled; `pending_enable` when enabling waits for a GPU reset.
    MigDisabled {
        /// Whether MIG is enabled after the next GPU reset.
        pending_enable: bool,
    },
    /// The GPU model has no such profile.
    ProfileNotOnModel {
        /// The model.
        model: GpuModel,
        /// The profile.
        profile: Profile,
    },
}

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsupported::NotMigCapable { name } => write!(f, "{name} does not support MIG"),
            Unsupported::MigDisabled { pending_enable: false } => f.write_str("MIG mode is disabled"),
            Unsupported::MigDisabled { pending_enable: true } => {
                f.write_str("MIG mode is disabled until the GPU is reset (enable pending)")
            }
            Unsupported::ProfileNotOnModel { model, profile } => write!(f, "{model} has no {profile} profile"),
        }
    }
}

/// An error from a [`MigBackend`], one variant per NVML return code it stands for (see
/// [`BackendError::nvml_code`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum BackendError {
    /// No GPU has this index (`NVML_ERROR_INVALID_ARGUMENT` from `nvmlDeviceGetHandleByIndex`).
    #[error("GPU {gpu}: no such GPU (the node has {count}) (NVML_ERROR_INVALID_ARGUMENT)")]
    NoSuchGpu {
        /// The index asked for.
        gpu: u32,
        /// How many GPUs the node has.
        count: u32,
    },
    /// The profile cannot start at that memory slice (`NVML_ERROR_INVALID_ARGUMENT`: NVML checks the placement
    /// against the profile's possible placements before it looks at what is in use).
    #[error("GPU {gpu}: cannot create {reason} (NVML_ERROR_INVALID_ARGUMENT)")]
    InvalidPlacement {
        /// The GPU index.
        gpu: u32,
        /// The placement asked for.
        placement: Placement,
        /// What the placement rules say ([`LayoutError::BadStart`], whose text starts with the placement).
        reason: LayoutError,
    },
    /// The placement's slices are taken, or the profile or the GPU is at its instance limit
    /// (`NVML_ERROR_INSUFFICIENT_RESOURCES`).
    #[error("GPU {gpu}: cannot create {placement}: {} (NVML_ERROR_INSUFFICIENT_RESOURCES)", because(reason))]
    InsufficientResources {
        /// The GPU index.
        gpu: u32,
        /// The placement asked for.
        placement: Placement,
        /// The placement rule the new instance would break, when the backend knows it (NVML does not say).
        reason: Option<LayoutError>,
    },
    /// The instance has work on it (processes, or compute instances other than its own) and cannot be destroyed
    /// (`NVML_ERROR_IN_USE`). Drain it first.
    #[error("GPU {gpu}: cannot destroy {instance} ({placement}): it is in use (NVML_ERROR_IN_USE); drain it first")]
    InUse {
        /// The GPU index.
        gpu: u32,
        /// The instance.
        instance: InstanceId,
        /// Its placement.
        placement: Placement,
    },
    /// The MIG mode cannot change while the GPU has instances (`NVML_ERROR_IN_USE` as the activation status of
    /// `nvmlDeviceSetMigMode`).
    #[error(
        "GPU {gpu}: cannot change the MIG mode while {instances} GPU instance(s) exist (NVML_ERROR_IN_USE); \
         destroy them first"
    )]
    GpuBusy {
        /// The GPU index.
        gpu: u32,
        /// How many GPU instances exist.
        instances: usize,
    },
    /// No instance with this id on the GPU (`NVML_ERROR_NOT_FOUND` from `nvmlDeviceGetGpuInstanceById`).
    #[error("GPU {gpu}: no {instance} (NVML_ERROR_NOT_FOUND)")]
    NotFound {
        /// The GPU index.
        gpu: u32,
        /// The id asked for.
        instance: InstanceId,
    },
    /// The GPU cannot do this now or ever (`NVML_ERROR_NOT_SUPPORTED`).
    #[error("GPU {gpu}: cannot {operation}: {reason} (NVML_ERROR_NOT_SUPPORTED)")]
    NotSupported {
        /// The GPU index.
        gpu: u32,
        /// What was asked.
        operation: Operation,
        /// Why not.
        reason: Unsupported,
    },
    /// The caller lacks the privilege (`NVML_ERROR_NO_PERMISSION`): MIG changes need root.
    #[error("GPU {gpu}: no permission to {operation} (NVML_ERROR_NO_PERMISSION); MIG changes need root")]
    NoPermission {
        /// The GPU index.
        gpu: u32,
        /// What was asked.
        operation: Operation,
    },
    /// The GPU fell off the bus or stopped answering (`NVML_ERROR_GPU_IS_LOST`).
    #[error("GPU {gpu}: lost (NVML_ERROR_GPU_IS_LOST) during {operation}")]
    GpuLost {
        /// The GPU index.
        gpu: u32,
        /// What was being done.
        operation: Operation,
    },
    /// Any other driver failure, with NVML's own words.
    #[error("GPU {gpu}: cannot {operation}: {detail}")]
    Driver {
        /// The GPU index.
        gpu: u32,
        /// What was asked.
        operation: Operation,
        /// The NVML return code and its text.
        detail: String,
    },
}

fn because(reason: &Option<LayoutError>) -> String {
    match reason {
        Some(r) => r.to_string(),
        None => "the driver has no room for it".to_string(),
    }
}

impl BackendError {
    /// The NVML return code this error stands for (`Driver` errors carry theirs in `detail`:
    /// `NVML_ERROR_UNKNOWN` here).
    pub fn nvml_code(&self) -> &'static str {
        match self {
            BackendError::NoSuchGpu { .. } | BackendError::InvalidPlacement { .. } => "NVML_ERROR_INVALID_ARGUMENT",
            BackendError::InsufficientResources { .. } => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            BackendError::InUse { .. } | BackendError::GpuBusy { .. } => "NVML_ERROR_IN_USE",
            BackendError::NotFound { .. } => "NVML_ERROR_NOT_FOUND",
            BackendError::NotSupported { .. } => "NVML_ERROR_NOT_SUPPORTED",
            BackendError::NoPermission { .. } => "NVML_ERROR_NO_PERMISSION",
            BackendError::GpuLost { .. } => "NVML_ERROR_GPU_IS_LOST",
            BackendError::Driver { .. } => "NVML_ERROR_UNKNOWN",
        }
    }

    /// The GPU index the error is about.
    pub fn gpu(&self) -> u32 {
        match self {
            BackendError::NoSuchGpu { gpu, .. }
            | BackendError::InvalidPlacement { gpu, .. }
            | BackendError::InsufficientResources { gpu, .. }
            | BackendError::InUse { gpu, .. }
            | BackendError::GpuBusy { gpu, .. }
            | BackendError::NotFound { gpu, .. }
            | BackendError::NotSupported { gpu, .. }
            | BackendError::NoPermission { gpu, .. }
            | BackendError::GpuLost { gpu, .. }
            | BackendError::Driver { gpu, .. } => *gpu,
        }
    }
}

/// What the agent needs from a node's GPUs: NVML (feature `nvml`) or the simulator (`tessera-sim`).
///
/// GPUs are named by NVML device index. See the [module documentation](self) for the instance model, the errors
/// and why the methods are synchronous and take `&self`.
pub trait MigBackend: Send + Sync {
    /// Every GPU of the node, by index.
    fn gpus(&self) -> Result<Vec<GpuInfo>, BackendError>;

    /// The GPU instances of `gpu`, ordered by placement. `NotSupported` when MIG is disabled or unsupported.
    fn instances(&self, gpu: u32) -> Result<Vec<GpuInstance>, BackendError>;

    /// Creates a GPU instance at `placement` and one compute instance spanning it; returns the instance. Fails with
    /// `InvalidPlacement` for a start the profile cannot take, `InsufficientResources` when slices are taken or a
    /// limit is reached, `NotSupported` when MIG is off. Nothing changes on failure.
    fn create_instance(&self, gpu: u32, placement: Placement) -> Result<GpuInstance, BackendError>;

    /// Destroys the instance's compute instance and then the GPU instance. Fails with `InUse` while work runs on
    /// it (other instances are not affected) and `NotFound` for an unknown id. Nothing changes on failure.
    fn destroy_instance(&self, gpu: u32, instance: InstanceId) -> Result<(), BackendError>;

    /// Asks for MIG mode on or off and returns the mode afterwards: `reset_pending()` when the change waits for
    /// a GPU reset (Ampere with a driver client attached). Fails with `GpuBusy` while instances exist. Setting the
    /// mode the GPU already has is a no-op.
    fn set_mig_mode(&self, gpu: u32, enabled: bool) -> Result<MigMode, BackendError>;

    /// The processes (host PIDs) running on `instance` of `gpu` now: NVML's
    /// `nvmlDeviceGetComputeRunningProcesses` on the instance's MIG device. The agent never destroys an instance
    /// with processes attached. The default reports none.
    fn processes(&self, gpu: u32, instance: &GpuInstance) -> Result<Vec<u32>, BackendError> {
        let _ = (gpu, instance);
        Ok(Vec::new())
    }

    /// The GPU's profile table as its driver reports it (profiles, counts, SMs, copy engines, memory and possible
    /// placements), `None` where the backend cannot read one. The simulator reports the catalog's.
    fn driver_table(&self, gpu: u32) -> Result<Option<DriverTable>, BackendError> {
        let _ = gpu;
        Ok(None)
    }

    /// The instances of `gpu` as a [`Layout`].
    fn layout(&self, gpu: u32) -> Result<Layout, BackendError> {
        Ok(self.instances(gpu)?.into_iter().map(|i| i.placement).collect())
    }

    /// Whether this backend carries out a GPU's whole target itself ([`MigBackend::apply_target`]) instead of
    /// taking single MIG calls. False (the default) for hardware: the reconciler steps through the diff, draining
    /// and loading work around each call. True for the simulator's workload executor, which models a
    /// reconfiguration as a whole (drains that take as long as the requests in flight, creates queued until their
    /// slices are free, warm-ups, pre-initialised switch-overs) in virtual time, where no call can wait.
    fn applies_whole_targets(&self) -> bool {
        false
    }

    /// Takes GPU `gpu`'s whole target (layout and work) and carries it out from now on; returns once it is taken.
    /// The reconciler hands each target over once; a backend must take a target it already holds as a no-op (a
    /// restarted agent hands it again). Only called where [`MigBackend::applies_whole_targets`] is true; the
    /// default refuses.
    fn apply_target(&self, gpu: u32, plan: &GpuPlan) -> Result<(), BackendError> {
        let _ = plan;
        Err(BackendError::Driver {
            gpu,
            operation: Operation::ApplyTarget,
            detail: "this backend takes single MIG calls, not whole targets".to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_gpu_the_placement_and_the_nvml_code() {
        let p: Placement = "3g@2".parse().unwrap();
        let reason = p.check_start().unwrap_err();
        let e = BackendError::InvalidPlacement { gpu: 1, placement: p, reason };
        assert_eq!(
            e.to_string(),
            "GPU 1: cannot create 3g@2: 3g can only start at memory slice 0 or 4 (NVML_ERROR_INVALID_ARGUMENT)"
        );
        let e = BackendError::InsufficientResources { gpu: 0, placement: p, reason: None };
        assert_eq!(
            e.to_string(),
            "GPU 0: cannot create 3g@2: the driver has no room for it (NVML_ERROR_INSUFFICIENT_RESOURCES)"
        );
        assert_eq!(e.nvml_code(), "NVML_ERROR_INSUFFICIENT_RESOURCES");
        let e = BackendError::InUse { gpu: 2, instance: InstanceId(7), placement: "1g@0".parse().unwrap() };
        assert_eq!(
            e.to_string(),
            "GPU 2: cannot destroy GI 7 (1g@0): it is in use (NVML_ERROR_IN_USE); drain it first"
        );
        assert_eq!(e.gpu(), 2);
        let e = BackendError::NotSupported {
            gpu: 0,
            operation: Operation::Create,
            reason: Unsupported::MigDisabled { pending_enable: true },
        };
        assert_eq!(
            e.to_string(),
            "GPU 0: cannot create an instance: MIG mode is disabled until the GPU is reset (enable pending) \
             (NVML_ERROR_NOT_SUPPORTED)"
        );
    }

    #[test]
    fn mig_mode_reports_a_pending_change() {
        assert!(!MigMode::ENABLED.reset_pending());
        let pending = MigMode { current: false, pending: true };
        assert!(pending.reset_pending());
        assert_eq!(pending.to_string(), "disabled (enabled after a GPU reset)");
        assert_eq!(MigMode::DISABLED.to_string(), "disabled");
    }
}
