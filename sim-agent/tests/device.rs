//! The simulated MIG device against the placement rules and NVML's semantics (NVIDIA MIG User Guide, `nvml.h`):
//! every class of transition of [`SimGpu`], the [`SimBackend`] behind the agent's trait, fault injection, and a
//! property test that random create/destroy sequences agree with `Layout::can_add` and keep the layout valid.

use std::sync::Arc;

use proptest::prelude::*;
use tessera_agent::backend::{BackendError, GpuInstance, InstanceId, MigBackend, MigMode, Operation, Unsupported};
use tessera_core::catalog::{GpuModel, MEMORY_SLICES, Profile};
use tessera_core::layout::{Layout, LayoutError, Placement, SliceKind};
use tessera_core::reconfig::ReconfigLatency;
use tessera_core::time::SimTime;
use tessera_sim::device::{Clock, Fault, OpTiming, SimBackend, SimGpu, VirtualClock, WallClock};

const T0: SimTime = SimTime::ZERO;

fn p(s: &str) -> Placement {
    s.parse().unwrap()
}

/// A GPU of `model` holding `layout`, created at time zero.
fn gpu_with(model: GpuModel, layout: &str) -> SimGpu {
    let mut g = SimGpu::new(0, model);
    for &placement in layout.parse::<Layout>().unwrap().placements() {
        g.create(T0, placement).unwrap();
    }
    g
}

fn id_of(g: &SimGpu, placement: &str) -> InstanceId {
    g.instances().find(|i| i.placement == p(placement)).map(|i| i.id).unwrap()
}

// ---- creating instances ----

#[test]
fn a_valid_placement_is_created_and_read_back() {
    let mut g = SimGpu::new(3, GpuModel::A100_40GB);
    let created = g.create(T0, p("3g@4")).unwrap();
    assert_eq!(created.placement, p("3g@4"));
    assert!(!created.busy);
    assert_eq!(g.list().unwrap(), vec![GpuInstance { id: created.id, placement: p("3g@4"), uuid: Some(created.uuid) }]);
    g.create(T0, p("2g@0")).unwrap();
    g.create(T0, p("1g@2")).unwrap();
    assert_eq!(g.layout().to_string(), "2g@0 1g@2 3g@4");
    let listed: Vec<Placement> = g.list().unwrap().iter().map(|i| i.placement).collect();
    assert_eq!(listed, vec![p("2g@0"), p("1g@2"), p("3g@4")], "read back in placement order");
}

#[test]
fn every_allowed_placement_of_every_profile_can_be_created_on_an_empty_gpu_of_every_model() {
    for model in GpuModel::ALL {
        for placement in Placement::all_for(&Profile::ALL) {
            let mut g = SimGpu::new(0, model);
            assert!(g.create(T0, placement).is_ok(), "{model} {placement}");
        }
    }
}

#[test]
fn an_overlapping_placement_is_insufficient_resources_and_changes_nothing() {
    let mut g = gpu_with(GpuModel::A100_40GB, "3g@0 1g@4");
    let err = g.create(T0, p("2g@2")).unwrap_err();
    assert_eq!(err.nvml_code(), "NVML_ERROR_INSUFFICIENT_RESOURCES");
    assert!(
        matches!(
            err,
            BackendError::InsufficientResources {
                gpu: 0,
                reason: Some(LayoutError::Overlap { kind: SliceKind::Memory, slice: 2, .. }),
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "GPU 0: cannot create 2g@2: 3g@0 and 2g@2 both use memory slice 2 (NVML_ERROR_INSUFFICIENT_RESOURCES)"
    );
    // The same placement again (an existing instance: NVML's INSUFFICIENT_RESOURCES).
    let err = g.create(T0, p("1g@4")).unwrap_err();
    assert!(matches!(err, BackendError::InsufficientResources { .. }), "{err:?}");
    // 3g@0 strands compute slice 3: a 1g at memory slice 3 overlaps in memory, not just compute.
    assert!(g.create(T0, p("1g@3")).is_err());
    assert_eq!(g.layout().to_string(), "3g@0 1g@4");
}

#[test]
fn a_start_the_profile_cannot_take_is_invalid_argument_before_anything_else() {
    let mut g = SimGpu::new(1, GpuModel::A100_40GB);
    let err = g.create(T0, p("3g@2")).unwrap_err();
    assert_eq!(err.nvml_code(), "NVML_ERROR_INVALID_ARGUMENT");
    assert!(
        matches!(&err, BackendError::InvalidPlacement { gpu: 1, placement, reason: LayoutError::BadStart { allowed, .. } }
            if *placement == p("3g@2") && allowed == &[0, 4]),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "GPU 1: cannot create 3g@2: 3g can only start at memory slice 0 or 4 (NVML_ERROR_INVALID_ARGUMENT)"
    );
    for bad in ["4g@4", "2g@1", "1g.2x@3", "7g@1", "1g@7"] {
        let err = g.create(T0, p(bad)).unwrap_err();
        assert!(matches!(err, BackendError::InvalidPlacement { .. }), "{bad}: {err:?}");
    }
    // Checked before the slices: on a full GPU the bad start is still the argument error.
    g.create(T0, p("7g@0")).unwrap();
    assert!(matches!(g.create(T0, p("2g@3")), Err(BackendError::InvalidPlacement { .. })));
    assert_eq!(g.layout().to_string(), "7g@0");
}

#[test]
fn a_profile_over_its_maximum_count_is_insufficient_resources() {
    // One 1g+me per GPU (its maximum count in the MIG User Guide), even on free slices.
    let mut g = gpu_with(GpuModel::H100_80GB, "1g+me@0");
    let err = g.create(T0, p("1g+me@3")).unwrap_err();
    assert!(
        matches!(
            err,
            BackendError::InsufficientResources {
                reason: Some(LayoutError::TooMany { profile: Profile::G1Me, count: 2, max: 1, .. }),
                ..
            }
        ),
        "{err:?}"
    );
    // A plain 1g fits there.
    assert!(g.create(T0, p("1g@3")).is_ok());
}

#[test]
fn seven_instances_fill_the_gpu() {
    let mut g = gpu_with(GpuModel::A100_80GB, "1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6");
    assert_eq!(g.instances().count(), 7);
    // Memory slice 7 is free but has no compute slice: nothing else fits.
    for placement in Placement::all_for(&Profile::ALL) {
        assert!(matches!(g.create(T0, placement), Err(BackendError::InsufficientResources { .. })), "{placement}");
    }
}

#[test]
fn creating_with_mig_disabled_is_not_supported() {
    let mut g = SimGpu::mig_disabled(2, GpuModel::H100_80GB);
    let err = g.create(T0, p("7g@0")).unwrap_err();
    assert_eq!(
        err,
        BackendError::NotSupported {
            gpu: 2,
            operation: Operation::Create,
            reason: Unsupported::MigDisabled { pending_enable: false },
        }
    );
    assert_eq!(err.nvml_code(), "NVML_ERROR_NOT_SUPPORTED");
    assert!(matches!(g.list(), Err(BackendError::NotSupported { operation: Operation::ListInstances, .. })));
    assert!(matches!(g.destroy(T0, InstanceId(0)), Err(BackendError::NotSupported { .. })));
}

#[test]
fn a_gpu_without_mig_supports_no_mig_call() {
    let mut g = SimGpu::without_mig(0, "Tesla V100-SXM2-32GB");
    let info = g.info();
    assert_eq!((info.model, info.mig, info.name.as_str()), (None, None, "Tesla V100-SXM2-32GB"));
    let not_capable = |op| BackendError::NotSupported {
        gpu: 0,
        operation: op,
        reason: Unsupported::NotMigCapable { name: "Tesla V100-SXM2-32GB".into() },
    };
    assert_eq!(g.set_mig_mode(true), Err(not_capable(Operation::SetMigMode)));
    assert_eq!(g.create(T0, p("7g@0")), Err(not_capable(Operation::Create)));
    assert_eq!(g.list(), Err(not_capable(Operation::ListInstances)));
    assert_eq!(
        not_capable(Operation::Create).to_string(),
        "GPU 0: cannot create an instance: Tesla V100-SXM2-32GB does not support MIG (NVML_ERROR_NOT_SUPPORTED)"
    );
}

// ---- destroying instances ----

#[test]
fn destroying_an_unknown_id_is_not_found() {
    let mut g = gpu_with(GpuModel::A100_40GB, "3g@0");
    let err = g.destroy(T0, InstanceId(2)).unwrap_err();
    assert_eq!(err, BackendError::NotFound { gpu: 0, instance: InstanceId(2) });
    assert_eq!(err.to_string(), "GPU 0: no GI 2 (NVML_ERROR_NOT_FOUND)");
    let id = id_of(&g, "3g@0");
    g.destroy(T0, id).unwrap();
    assert!(matches!(g.destroy(T0, id), Err(BackendError::NotFound { .. })), "gone after the first destroy");
    assert!(g.layout().is_empty());
}

#[test]
fn a_busy_instance_is_in_use_until_idle_and_its_neighbours_are_not_affected() {
    let mut g = gpu_with(GpuModel::H100_80GB, "4g@0 2g@4 1g@6");
    let busy = id_of(&g, "2g@4");
    g.set_busy(busy, true).unwrap();
    let err = g.destroy(T0, busy).unwrap_err();
    assert_eq!(err, BackendError::InUse { gpu: 0, instance: busy, placement: p("2g@4") });
    assert_eq!(err.nvml_code(), "NVML_ERROR_IN_USE");
    assert_eq!(g.layout().to_string(), "4g@0 2g@4 1g@6", "refused: nothing changed");
    // The neighbours can go while it works.
    g.destroy(T0, id_of(&g, "1g@6")).unwrap();
    g.destroy(T0, id_of(&g, "4g@0")).unwrap();
    assert_eq!(g.layout().to_string(), "2g@4");
    // Drained: now it goes.
    g.set_busy(busy, false).unwrap();
    g.destroy(T0, busy).unwrap();
    assert!(g.layout().is_empty());
    assert!(matches!(g.set_busy(busy, true), Err(BackendError::NotFound { .. })));
}

// ---- MIG mode ----

#[test]
fn the_mig_mode_cannot_change_while_instances_exist() {
    for model in [GpuModel::A100_40GB, GpuModel::H100_80GB] {
        let mut g = gpu_with(model, "3g@0 3g@4");
        let err = g.set_mig_mode(false).unwrap_err();
        assert_eq!(err, BackendError::GpuBusy { gpu: 0, instances: 2 }, "{model}");
        assert_eq!(err.nvml_code(), "NVML_ERROR_IN_USE");
        assert_eq!(g.mig_mode(), Some(MigMode::ENABLED));
        assert_eq!(g.layout().to_string(), "3g@0 3g@4");
        // Asking for the mode it has is fine.
        assert_eq!(g.set_mig_mode(true), Ok(MigMode::ENABLED));
    }
}

#[test]
fn on_ampere_a_driver_client_keeps_the_mode_change_pending_until_a_reset() {
    let mut g = SimGpu::mig_disabled(0, GpuModel::A100_40GB);
    g.set_driver_client(true);
    let pending = g.set_mig_mode(true).unwrap();
    assert_eq!(pending, MigMode { current: false, pending: true });
    assert!(pending.reset_pending());
    assert_eq!(
        g.create(T0, p("7g@0")),
        Err(BackendError::NotSupported {
            gpu: 0,
            operation: Operation::Create,
            reason: Unsupported::MigDisabled { pending_enable: true },
        })
    );
    // Detaching the client does not apply it: the reset is what does.
    g.set_driver_client(false);
    assert_eq!(g.mig_mode(), Some(MigMode { current: false, pending: true }));
    g.reset(SimTime::from_secs(1));
    assert_eq!(g.mig_mode(), Some(MigMode::ENABLED));
    assert!(g.create(SimTime::from_secs(1), p("7g@0")).is_ok());
}

#[test]
fn on_ampere_without_a_driver_client_the_change_resets_the_gpu_at_once() {
    let mut g = SimGpu::mig_disabled(0, GpuModel::A100_80GB);
    assert_eq!(g.set_mig_mode(true), Ok(MigMode::ENABLED));
    assert!(g.create(T0, p("4g@0")).is_ok());
}

#[test]
fn a_pending_change_can_be_taken_back() {
    let mut g = SimGpu::new(0, GpuModel::A100_40GB);
    g.set_driver_client(true);
    assert_eq!(g.set_mig_mode(false), Ok(MigMode { current: true, pending: false }));
    assert_eq!(g.set_mig_mode(true), Ok(MigMode::ENABLED));
    g.reset(T0);
    assert_eq!(g.mig_mode(), Some(MigMode::ENABLED));
}

#[test]
fn on_hopper_and_later_the_change_needs_no_reset_and_a_driver_reload_loses_it() {
    for model in [GpuModel::H100_80GB, GpuModel::H200_141GB, GpuModel::B200_180GB] {
        let mut g = SimGpu::mig_disabled(0, model);
        g.set_driver_client(true);
        assert_eq!(g.set_mig_mode(true), Ok(MigMode::ENABLED), "{model}");
        g.create(T0, p("3g@4")).unwrap();
        let lost = g.reload_driver(SimTime::from_secs(1));
        assert_eq!(lost.len(), 1);
        assert_eq!(g.mig_mode(), Some(MigMode::DISABLED), "{model}: mode lost on driver reload");
        assert!(g.instances().next().is_none());
    }
    // Ampere keeps its mode across a driver reload, but not its instances.
    let mut a = gpu_with(GpuModel::A100_40GB, "7g@0");
    a.reload_driver(SimTime::from_secs(1));
    assert_eq!(a.mig_mode(), Some(MigMode::ENABLED));
    assert!(a.layout().is_empty());
}

// ---- reset and ids ----

#[test]
fn instances_do_not_survive_a_reset_even_busy_ones() {
    let mut g = gpu_with(GpuModel::H100_80GB, "3g@0 2g@4 1g@6");
    g.set_busy(id_of(&g, "3g@0"), true).unwrap();
    let lost = g.reset(SimTime::from_secs(9));
    let mut lost_layout: Vec<Placement> = lost.iter().map(|i| i.placement).collect();
    lost_layout.sort();
    assert_eq!(lost_layout, vec![p("3g@0"), p("2g@4"), p("1g@6")]);
    assert!(g.layout().is_empty());
    assert_eq!(g.mig_mode(), Some(MigMode::ENABLED), "a reset keeps an applied mode");
    // Calls in flight were cut short: the next one starts at once.
    assert_eq!(g.calls_free_at(), SimTime::from_secs(9));
}

#[test]
fn ids_are_unique_among_live_instances_and_reused_after_a_destroy_or_reset() {
    let mut g = SimGpu::new(0, GpuModel::A100_40GB);
    let a = g.create(T0, p("1g@0")).unwrap().id;
    let b = g.create(T0, p("1g@1")).unwrap().id;
    let c = g.create(T0, p("1g@2")).unwrap().id;
    assert!(a != b && b != c && a != c);
    g.destroy(T0, b).unwrap();
    // The freed id comes back, for another start: an id says nothing about where the instance is.
    let d = g.create(T0, p("1g@5")).unwrap();
    assert_eq!(d.id, b);
    assert_eq!(g.instance(b).map(|i| i.placement), Some(p("1g@5")));
    // Different sizes draw from different pools.
    let big = g.create(T0, p("3g@4")).unwrap_err();
    assert!(matches!(big, BackendError::InsufficientResources { .. }), "1g@5 is in the way");
    g.destroy(T0, d.id).unwrap();
    let big = g.create(T0, p("3g@4")).unwrap().id;
    assert!(![a, c].contains(&big));
    // After a reset the pools are full again.
    g.reset(T0);
    assert_eq!(g.create(T0, p("1g@6")).unwrap().id, a);
    // Every live id is in its size pool (0; 1-2; 3-6; 7-14).
    let g = gpu_with(GpuModel::H100_80GB, "2g@0 1g@2 1g@3 3g@4");
    for i in g.instances() {
        let per_gpu = u32::from(MEMORY_SLICES / i.placement.profile.memory_slices());
        assert!((per_gpu - 1..2 * per_gpu - 1).contains(&i.id.0), "{} has {}", i.placement, i.id);
    }
}

// ---- latency ----

#[test]
fn mig_calls_on_a_gpu_run_one_after_another_with_the_reference_latencies() {
    let mut g = SimGpu::new(0, GpuModel::A100_40GB);
    assert_eq!(g.latency(), ReconfigLatency { create_ms: 1000, destroy_ms: 500, warmup_ms: 4000 });
    let first = g.create(T0, p("3g@0")).unwrap();
    assert_eq!((first.started_at, first.available_at, first.warm_at), (T0, SimTime(1000), SimTime(5000)));
    // Issued at the same moment, the second create waits for the first.
    let second = g.create(T0, p("3g@4")).unwrap();
    assert_eq!((second.started_at, second.available_at), (SimTime(1000), SimTime(2000)));
    let destroyed = g.destroy(SimTime(1500), first.id).unwrap();
    assert_eq!(destroyed, OpTiming { started_at: SimTime(2000), done_at: SimTime(2500) });
    assert_eq!(g.calls_free_at(), SimTime(2500));
    // An idle GPU starts the call when it is made.
    let later = g.create(SimTime::from_secs(60), p("2g@0")).unwrap();
    assert_eq!(later.started_at, SimTime::from_secs(60));
    // Work loaded later warms from then; never before the instance exists.
    assert_eq!(later.serves_from(SimTime::from_secs(70), g.latency().warmup_ms), SimTime::from_secs(74));
    assert_eq!(later.serves_from(SimTime::ZERO, g.latency().warmup_ms), later.warm_at);
    // A refused call takes no time.
    let before = g.calls_free_at();
    assert!(g.create(SimTime::from_secs(61), p("2g@0")).is_err());
    assert_eq!(g.calls_free_at(), before);
}

#[test]
fn latencies_are_configurable() {
    let latency = ReconfigLatency { create_ms: 300, destroy_ms: 70, warmup_ms: 0 };
    let mut g = SimGpu::new(0, GpuModel::H100_80GB).with_latency(latency);
    let i = g.create(SimTime(10), p("7g@0")).unwrap();
    assert_eq!((i.available_at, i.warm_at), (SimTime(310), SimTime(310)));
    assert_eq!(g.destroy(SimTime(10), i.id).unwrap().done_at, SimTime(380));
}

// ---- the backend behind the agent's trait ----

fn virtual_backend(models: &[GpuModel]) -> (Arc<VirtualClock>, SimBackend) {
    let clock = Arc::new(VirtualClock::new(SimTime::from_secs(100)));
    let backend = SimBackend::with_models(models, clock.clone());
    (clock, backend)
}

#[test]
fn the_backend_lists_gpus_and_drives_them_through_the_trait() {
    let (clock, backend) = virtual_backend(&[GpuModel::A100_40GB, GpuModel::H100_80GB]);
    let dyn_backend: Arc<dyn MigBackend> = Arc::new(backend);
    let gpus = dyn_backend.gpus().unwrap();
    assert_eq!(gpus.len(), 2);
    assert_eq!((gpus[1].index, gpus[1].model, gpus[1].mig), (1, Some(GpuModel::H100_80GB), Some(MigMode::ENABLED)));
    assert_eq!(gpus[0].name, "NVIDIA A100-SXM4-40GB");
    let made = dyn_backend.create_instance(1, p("4g@0")).unwrap();
    assert_eq!(made.placement, p("4g@0"));
    dyn_backend.create_instance(1, p("3g@4")).unwrap();
    assert_eq!(dyn_backend.layout(1).unwrap().to_string(), "4g@0 3g@4");
    assert!(dyn_backend.layout(0).unwrap().is_empty(), "GPUs are independent");
    dyn_backend.destroy_instance(1, made.id).unwrap();
    assert_eq!(dyn_backend.instances(1).unwrap().len(), 1);
    assert_eq!(clock.now(), SimTime::from_secs(100), "a virtual clock never moves by itself");
    assert_eq!(dyn_backend.create_instance(7, p("7g@0")), Err(BackendError::NoSuchGpu { gpu: 7, count: 2 }));
}

#[test]
fn the_backend_stamps_calls_with_its_clock() {
    let (clock, backend) = virtual_backend(&[GpuModel::H100_80GB]);
    let first = backend.create_instance(0, p("3g@0")).unwrap();
    let timing = backend.with_gpu(0, |g| *g.instance(first.id).unwrap()).unwrap();
    assert_eq!((timing.started_at, timing.available_at), (SimTime::from_secs(100), SimTime::from_secs(101)));
    clock.advance_to(SimTime::from_secs(200));
    let second = backend.create_instance(0, p("3g@4")).unwrap();
    let timing = backend.with_gpu(0, |g| *g.instance(second.id).unwrap()).unwrap();
    assert_eq!(timing.available_at, SimTime::from_secs(201));
}

#[test]
fn the_backend_refuses_to_destroy_busy_instances_until_told_they_are_idle() {
    let (_clock, backend) = virtual_backend(&[GpuModel::A100_40GB]);
    let made = backend.create_instance(0, p("3g@4")).unwrap();
    backend.set_busy(0, made.id, true).unwrap();
    assert!(matches!(backend.destroy_instance(0, made.id), Err(BackendError::InUse { .. })));
    backend.set_busy(0, made.id, false).unwrap();
    backend.destroy_instance(0, made.id).unwrap();
    assert!(matches!(backend.set_busy(3, made.id, true), Err(BackendError::NoSuchGpu { .. })));
}

#[test]
fn the_backend_sets_the_mig_mode_and_resets() {
    let clock = Arc::new(VirtualClock::default());
    let gpus = vec![SimGpu::mig_disabled(0, GpuModel::A100_40GB), SimGpu::without_mig(1, "Tesla T4")];
    let backend = SimBackend::new(gpus, clock);
    backend.with_gpu_mut(0, |g, _| g.set_driver_client(true)).unwrap();
    assert!(backend.set_mig_mode(0, true).unwrap().reset_pending());
    assert!(matches!(backend.instances(0), Err(BackendError::NotSupported { .. })));
    assert!(backend.reset(0).unwrap().is_empty());
    assert_eq!(backend.gpus().unwrap()[0].mig, Some(MigMode::ENABLED));
    assert_eq!(backend.instances(0), Ok(vec![]));
    assert!(matches!(backend.set_mig_mode(1, true), Err(BackendError::NotSupported { .. })));
}

#[test]
fn with_the_wall_clock_a_call_returns_once_its_latency_has_passed() {
    let clock = Arc::new(WallClock::new());
    let latency = ReconfigLatency { create_ms: 3, destroy_ms: 2, warmup_ms: 0 };
    let backend = SimBackend::new(vec![SimGpu::new(0, GpuModel::H100_80GB).with_latency(latency)], clock.clone());
    let made = backend.create_instance(0, p("7g@0")).unwrap();
    let available_at = backend.with_gpu(0, |g| g.instance(made.id).unwrap().available_at).unwrap();
    assert!(clock.now() >= available_at);
    backend.destroy_instance(0, made.id).unwrap();
    assert!(clock.now() >= backend.with_gpu(0, SimGpu::calls_free_at).unwrap());
}

#[test]
#[should_panic(expected = "distinct indices")]
fn gpus_with_the_same_index_are_a_set_up_bug() {
    let gpus = vec![SimGpu::new(0, GpuModel::A100_40GB), SimGpu::new(0, GpuModel::H100_80GB)];
    let _ = SimBackend::new(gpus, Arc::new(VirtualClock::default()));
}

// ---- fault injection ----

#[test]
fn injected_faults_fail_the_next_calls_and_then_stop() {
    let (_clock, backend) = virtual_backend(&[GpuModel::H100_80GB]);
    let denied = BackendError::NoPermission { gpu: 0, operation: Operation::Create };
    backend.inject(0, Fault::fail(Some(Operation::Create), 2, denied.clone())).unwrap();
    assert_eq!(backend.create_instance(0, p("7g@0")), Err(denied.clone()));
    assert_eq!(backend.create_instance(0, p("7g@0")), Err(denied));
    assert!(backend.layout(0).unwrap().is_empty(), "failed calls changed nothing");
    assert!(backend.create_instance(0, p("7g@0")).is_ok());
    // A lost reply: the destroy happened, the caller hears an error, and a retry finds nothing to destroy.
    let id = backend.instances(0).unwrap()[0].id;
    let lost = BackendError::GpuLost { gpu: 0, operation: Operation::Destroy };
    backend.inject(0, Fault::fail(Some(Operation::Destroy), 1, lost.clone()).after_applying()).unwrap();
    assert_eq!(backend.destroy_instance(0, id), Err(lost));
    assert!(backend.layout(0).unwrap().is_empty());
    assert!(matches!(backend.destroy_instance(0, id), Err(BackendError::NotFound { .. })));
    // A fault on any operation hits reads too.
    let gone = BackendError::GpuLost { gpu: 0, operation: Operation::ListGpus };
    backend.inject(0, Fault::fail(None, 1, gone.clone())).unwrap();
    assert_eq!(backend.gpus(), Err(gone));
    assert!(backend.gpus().is_ok());
}

// ---- property: the device follows the placement rules ----

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Destroy(usize),
    ToggleBusy(usize),
    Wait(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..1000).prop_map(Op::Create),
        3 => (0usize..1000).prop_map(Op::Destroy),
        1 => (0usize..1000).prop_map(Op::ToggleBusy),
        1 => (0u64..3000).prop_map(Op::Wait),
    ]
}

/// Placements the driver accepts, plus starts it refuses, so both kinds of refusal are exercised.
fn candidates() -> Vec<Placement> {
    let mut v = Placement::all_for(&Profile::ALL);
    for profile in Profile::ALL {
        for start in 0..MEMORY_SLICES {
            let placement = Placement::new(profile, start);
            if placement.check_start().is_err() {
                v.push(placement);
            }
        }
    }
    v
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Random create/destroy/busy sequences: a create succeeds exactly when `Layout::can_add` says so (and fails
    /// with the right NVML class otherwise), a destroy fails exactly for busy or unknown instances, the device's
    /// layout matches a reference kept beside it and is valid after every step, ids stay in their pools, and the
    /// call timeline never goes back.
    #[test]
    fn random_sequences_follow_the_placement_rules(model in 0usize..5, ops in prop::collection::vec(op(), 1..60)) {
        let model = GpuModel::ALL[model];
        let candidates = candidates();
        let mut g = SimGpu::new(0, model);
        let mut reference = Layout::empty();
        let mut now = SimTime::ZERO;
        let mut free_at = g.calls_free_at();
        for op in ops {
            match op {
                Op::Create(k) => {
                    let placement = candidates[k % candidates.len()];
                    let allowed = reference.can_add(model, placement);
                    let result = g.create(now, placement);
                    prop_assert_eq!(result.is_ok(), allowed, "{} on {} holding {}", placement, model, reference);
                    match result {
                        Ok(made) => {
                            reference.insert(placement);
                            prop_assert_eq!(made.started_at, now.max(free_at));
                            prop_assert_eq!(made.available_at, made.started_at + g.latency().create_ms);
                        }
                        Err(BackendError::InvalidPlacement { .. }) => prop_assert!(placement.check_start().is_err()),
                        Err(BackendError::InsufficientResources { reason: Some(_), .. }) => {
                            prop_assert!(placement.check_start().is_ok())
                        }
                        Err(e) => return Err(TestCaseError::fail(format!("{placement}: unexpected error {e}"))),
                    }
                }
                Op::Destroy(k) => {
                    let live: Vec<(InstanceId, Placement, bool)> =
                        g.instances().map(|i| (i.id, i.placement, i.busy)).collect();
                    // One choice in eight is an id no live instance has.
                    if k % 8 == 7 || live.is_empty() {
                        let unknown = (0..16).map(InstanceId).find(|id| live.iter().all(|l| l.0 != *id)).unwrap();
                        prop_assert!(
                            matches!(g.destroy(now, unknown), Err(BackendError::NotFound { .. })),
                            "NotFound expected"
                        );
                    } else {
                        let (id, placement, busy) = live[k % live.len()];
                        let result = g.destroy(now, id);
                        if busy {
                            prop_assert!(matches!(result, Err(BackendError::InUse { .. })), "InUse expected");
                        } else {
                            prop_assert!(result.is_ok());
                            prop_assert!(reference.remove(placement));
                        }
                    }
                }
                Op::ToggleBusy(k) => {
                    let live: Vec<(InstanceId, bool)> = g.instances().map(|i| (i.id, i.busy)).collect();
                    if !live.is_empty() {
                        let (id, busy) = live[k % live.len()];
                        g.set_busy(id, !busy).unwrap();
                    }
                }
                Op::Wait(ms) => now = now + ms,
            }
            prop_assert_eq!(&g.layout(), &reference);
            prop_assert_eq!(g.layout().validate(model), Ok(()));
            prop_assert_eq!(g.check_invariant(), Ok(()));
            for i in g.instances() {
                let per_gpu = u32::from(MEMORY_SLICES / i.placement.profile.memory_slices());
                prop_assert!((per_gpu - 1..2 * per_gpu - 1).contains(&i.id.0));
            }
            prop_assert!(g.calls_free_at() >= free_at);
            free_at = g.calls_free_at();
        }
    }
}
