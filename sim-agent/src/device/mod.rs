//! The simulated MIG device: a state machine per GPU with NVML's placement rules, errors and latencies, and
//! [`SimBackend`], which puts a node's simulated GPUs behind the agent's
//! [`MigBackend`](tessera_agent::backend::MigBackend) trait.
//!
//! ## Layout
//! - [`SimGpu`] (`gpu.rs`): one GPU. Pure: every call takes the time it happens at (`now: SimTime`) and reports
//!   when its effect is complete, so the workload executor can run it under a virtual clock.
//! - [`SimBackend`] (`backend.rs`): N `SimGpu`s behind a mutex, stamped by a [`Clock`].
//! - [`Clock`], [`VirtualClock`], [`WallClock`] (`clock.rs`): workload time.
//!
//! ## Rules followed (NVIDIA MIG User Guide and `nvml.h`; summarised in `docs/references.md`)
//! - **Placements**: a create is accepted exactly when
//!   [`Layout::can_add`](tessera_core::layout::Layout::can_add) accepts it on the GPU's model; nothing here
//!   restates the placement tables. When it refuses, [`Layout::validate`](tessera_core::layout::Layout::validate)
//!   of the layout with the new placement names the rule, which picks NVML's error (nvml.h,
//!   `nvmlDeviceCreateGpuInstanceWithPlacement`): a start the profile cannot take is `NVML_ERROR_INVALID_ARGUMENT`
//!   (`InvalidPlacement`); a slice already taken, a profile at its maximum count or seven instances is
//!   `NVML_ERROR_INSUFFICIENT_RESOURCES` (nvml.h: for occupied slices or an existing instance); a profile the
//!   model lacks is `NVML_ERROR_NOT_SUPPORTED`.
//! - **MIG mode**: without MIG support every MIG call is `NotSupported`; with MIG disabled
//!   listing, creating and destroying instances are `NotSupported`. A mode change needs a GPU without instances
//!   (`GpuBusy`, NVML's `IN_USE` activation status). Ampere (A100): the change resets the GPU, so it takes
//!   effect at once unless a driver client (dcgm, nvsm) holds the GPU, and then stays *pending* until
//!   [`SimGpu::reset`]; the mode persists across a driver reload. Hopper and later (H100, H200, B200): no reset,
//!   the change takes effect at once, and a driver reload ([`SimGpu::reload_driver`]) returns the GPU to non-MIG
//!   mode.
//! - **Reset**: instances never survive a GPU reset or a driver reload; the agent recreates them.
//! - **Destroy**: `NVML_ERROR_IN_USE` only for the instance that has work on it
//!   ([`SimGpu::set_busy`]); its neighbours are untouched. An unknown id is `NVML_ERROR_NOT_FOUND`.
//! - **Instance model**: a GPU instance with one compute instance spanning it (see
//!   [`tessera_agent::backend`]); GI ids are unique among live instances, drawn lowest-first from per-size pools
//!   (0 for the 8-slice GI, 1-2 for 4 slices, 3-6 for 2, 7-14 for 1, the pattern `nvidia-smi mig -lgi` shows) and
//!   reused after a destroy or reset.
//! - **Latency** (no vendor figure exists; the defaults are assumptions): MIG calls on one GPU run one after
//!   another; a create takes `create_ms` (1.0 s by default), a destroy `destroy_ms` (0.5 s), and work loaded on a
//!   new instance serves `warmup_ms` (4.0 s) after it is loaded, no earlier than the instance is available. These
//!   are [`ReconfigLatency`](tessera_core::reconfig::ReconfigLatency), the same numbers the reconfiguration diff
//!   plans with. Pre-initialisation is not a separate latency: a pre-initialised instance is one whose work is
//!   loaded when it is created, so it is warm at [`SimInstance::warm_at`]; loading later costs the warm-up again
//!   from then ([`SimInstance::serves_from`]). A failed call takes no time; a mode change is taken as instantaneous.
//!
//! ## Fault injection
//! [`Fault`]: the next N calls of an operation on a GPU fail with a given error, either without effect or after
//! taking effect (a lost reply), for the agent's crash and retry tests.
//!
//! What it does not model: processes on a GPU outside MIG mode, compute-instance layouts other than one full CI,
//! the driver's own default placement order, MIG device UUIDs.

mod backend;
mod clock;
mod gpu;

pub use backend::SimBackend;
pub use clock::{Clock, VirtualClock, WallClock};
pub use gpu::{Architecture, Fault, OpTiming, SimGpu, SimInstance};
