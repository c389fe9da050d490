//! Workload executor tests, grouped by area and numbered:
//! 1. queueing (M/D/1 closed form), 2. batching, 3. reconfiguration, 4. requests without an instance,
//! 5. retraining and accuracy, 6. dispatch (ELSA), 7. determinism, 8. accounting, 9. interference,
//! 10. fluid serving, 11. sharing one instance between inference and retraining.
//!
//! Every run is seeded; a failing assertion prints the seed where one is used. No test reads a clock.

use std::collections::BTreeMap;

use tessera_core::GpuModel;
use tessera_core::accuracy::{Drift, OptimusCurve};
use tessera_core::goodput::GoodputLedger;
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::model::{LatencyModel, ModelProfile, TrainingSpeed};
use tessera_core::plan::{Assignment, GpuPlan, Plan, Role};
use tessera_core::sharing::Sharing;
use tessera_core::tenant::{DemandSource, RetrainingSpec, TenantSpec};
use tessera_sim::executor::{
    Arrival, BatchCap, BatchRecord, Dispatch, ExecError, Executor, ExecutorConfig, FleetSpec, GpuIndex, Interference,
    InterferenceError, LateRequests, NoInstance, NoInterference, Resident, TenantIndex, TlbInterference,
};
use tessera_sim::tlb::{TenantStreamSpec, TlbMode, TlbModel, TlbParams};

// ---------------------------------------------------------------------------------------------------------------
// Helpers

/// A parametric model: `lat(g, b) = base_ms (7/g)^alpha (1 + beta (b - 1))`, training speed `(g/7)^1`.
fn model(name: &str, base_ms: f64, alpha: f64, beta: f64, max_batch: u32) -> ModelProfile {
    ModelProfile {
        name: name.into(),
        description: String::new(),
        inference_memory_gib: 1.0,
        training_memory_gib: 4.0,
        max_batch,
        latency: LatencyModel::Parametric { base_ms, alpha, beta },
        training: TrainingSpeed::Exponent(1.0),
    }
}

fn tenant(id: &str, model: &str, slo_ms: f64) -> TenantSpec {
    TenantSpec {
        jobs: Default::default(),
        pin: Default::default(),
        id: TenantId::new(id).unwrap(),
        name: id.into(),
        model: model.into(),
        slo_ms,
        slo_percentile: 99.0,
        weight: 1.0,
        demand: DemandSource::Poisson { rate_rps: 0.0 },
        retraining: None,
    }
}

fn retraining() -> RetrainingSpec {
    RetrainingSpec {
        window_ms: 200_000,
        work_gpu_s: 60.0,
        epochs: 5.0,
        curve: OptimusCurve { b0: 2.0, b1: 1.5, b2: 0.08 },
        initial_accuracy: 0.72,
        drift: Drift { per_window: 0.03, floor: 0.6 },
    }
}

fn gpu(s: &str) -> GpuId {
    s.parse().unwrap()
}

/// A GPU plan from a layout and `(placement, tenant, role, preinit)` assignments.
fn plan(layout: &str, assignments: &[(&str, &str, Role, bool)]) -> GpuPlan {
    GpuPlan {
        layout: layout.parse().unwrap(),
        assignments: assignments
            .iter()
            .map(|(p, t, role, preinit)| Assignment {
                placement: p.parse().unwrap(),
                tenant: TenantId::new(*t).unwrap(),
                role: *role,
                preinit: *preinit,
            })
            .collect(),
        expected_goodput: 0.0,
        explanation: String::new(),
        upcoming: Vec::new(),
        retraining_epochs: BTreeMap::new(),
        sharing: Default::default(),
    }
}

fn executor(config: ExecutorConfig, models: Vec<ModelProfile>, tenants: Vec<TenantSpec>, gpus: &[&str]) -> Executor {
    executor_with(config, models, tenants, gpus, Box::new(NoInterference))
}

fn executor_with(
    config: ExecutorConfig,
    models: Vec<ModelProfile>,
    tenants: Vec<TenantSpec>,
    gpus: &[&str],
    interference: Box<dyn Interference>,
) -> Executor {
    let fleet = FleetSpec {
        models: models.into_iter().map(|m| (m.name.clone(), m)).collect(),
        tenants,
        gpus: gpus.iter().map(|g| (gpu(g), GpuModel::A100_40GB)).collect(),
    };
    Executor::new(config, fleet, interference).unwrap()
}

fn ix(ex: &Executor, id: &str) -> TenantIndex {
    ex.tenant_index(&TenantId::new(id).unwrap()).unwrap()
}

fn gix(ex: &Executor, id: &str) -> GpuIndex {
    ex.gpu_index(&gpu(id)).unwrap()
}

/// Arrivals every `period_ms` from `from_ms` (inclusive) to `to_ms` (exclusive).
fn periodic(tenant: TenantIndex, from_ms: f64, to_ms: f64, period_ms: f64) -> Vec<Arrival> {
    let n = ((to_ms - from_ms) / period_ms).ceil() as usize;
    (0..n).map(|k| Arrival { at_ms: from_ms + k as f64 * period_ms, tenant }).filter(|a| a.at_ms < to_ms).collect()
}

fn recording() -> ExecutorConfig {
    ExecutorConfig { record_batches: true, ..ExecutorConfig::default() }
}

/// The batches of `tenant`, by completion time.
fn batches_of(ex: &Executor, tenant: TenantIndex) -> Vec<BatchRecord> {
    let mut v: Vec<BatchRecord> = ex.batches().iter().copied().filter(|b| b.tenant == tenant).collect();
    v.sort_by(|a, b| a.completed_ms.total_cmp(&b.completed_ms));
    v
}

/// The longest time between consecutive batch starts of `batches` within `[from, to]`.
fn longest_gap(batches: &[BatchRecord], from: f64, to: f64) -> f64 {
    let mut starts: Vec<f64> = batches.iter().map(|b| b.started_ms).filter(|&t| (from..=to).contains(&t)).collect();
    starts.sort_by(f64::total_cmp);
    starts.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max)
}

// ---------------------------------------------------------------------------------------------------------------
// 1. Queueing

/// 1.1 One instance, batches of one, deterministic service D, Poisson arrivals at rate lambda: an M/D/1 queue,
/// whose mean waiting time is rho D / (2 (1 - rho)) (Pollaczek-Khinchine with zero service variance).
#[test]
fn t1_1_single_instance_without_batching_is_an_md1_queue() {
    let d_ms = 2.0;
    for (seed, rho) in [(11u64, 0.5), (12, 0.7)] {
        let config = ExecutorConfig { seed, ..ExecutorConfig::default() };
        let mut ex =
            executor(config, vec![model("md1", d_ms, 0.0, 0.0, 1)], vec![tenant("a", "md1", 1_000.0)], &["n/0"]);
        ex.install_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
        let a = ix(&ex, "a");
        let rate_rps = rho / d_ms * 1000.0;
        let n = 200_000.0;
        let end_ms = n / rate_rps * 1000.0;
        let arrivals = ex.poisson_arrivals(&[(a, rate_rps)], 0.0, end_ms);
        ex.arrive_all(&arrivals).unwrap();
        ex.advance_to(end_ms + 1_000.0).unwrap();
        let m = ex.tenant_metrics(a);
        assert_eq!(m.ledger.completed, arrivals.len() as u64, "seed {seed}");
        assert_eq!(m.batches, m.ledger.completed, "batches of one");
        let wait = m.mean_latency_ms() - d_ms;
        let expected = rho * d_ms / (2.0 * (1.0 - rho));
        assert!(
            (wait - expected).abs() / expected < 0.04,
            "seed {seed}, rho {rho}: mean wait {wait:.4} ms, M/D/1 says {expected:.4} ms"
        );
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 2. Batching

/// `lat(b) = 4 (1 + 0.25 (b - 1))` ms on any instance (alpha 0): lat(1) = 4, lat(2) = 5, lat(4) = 7, lat(8) = 11.
fn batchy(max_batch: u32) -> ModelProfile {
    model("batchy", 4.0, 0.0, 0.25, max_batch)
}

fn batching_executor(config: ExecutorConfig, slo_ms: f64) -> (Executor, TenantIndex) {
    let mut ex = executor(config, vec![batchy(8)], vec![tenant("a", "batchy", slo_ms)], &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
    let a = ix(&ex, "a");
    (ex, a)
}

/// 2.1 A burst of max-batch requests completes together after one batch latency; a burst larger than the batch
/// is split at the cap, the rest waiting for its head's timeout.
#[test]
fn t2_1_a_full_batch_starts_at_once_and_completes_together() {
    let (mut ex, a) = batching_executor(recording(), 100.0); // timeout 25 ms; 2 lat(8) = 22 <= 100: cap 8
    for _ in 0..8 {
        ex.arrive(a, 10.0).unwrap();
    }
    ex.advance_to(500.0).unwrap();
    let b = batches_of(&ex, a);
    assert_eq!(b.len(), 1);
    assert_eq!((b[0].size, b[0].started_ms, b[0].completed_ms), (8, 10.0, 21.0));
    let m = ex.tenant_metrics(a);
    assert_eq!((m.ledger.completed, m.latency_max_ms, m.latency_sum_ms), (8, 11.0, 88.0));

    // Twelve at once: 8 now, and 4 that wait for their head's timeout (25 ms after it arrived).
    ex.take_batches();
    for _ in 0..12 {
        ex.arrive(a, 1_000.0).unwrap();
    }
    ex.advance_to(2_000.0).unwrap();
    let b = batches_of(&ex, a);
    let got: Vec<(u32, f64, f64)> = b.iter().map(|b| (b.size, b.started_ms, b.completed_ms)).collect();
    assert_eq!(got, vec![(8, 1_000.0, 1_011.0), (4, 1_025.0, 1_032.0)]);
}

/// 2.2 The batch timeout holds a lone request exactly the timeout (and no longer); a second request joins it.
#[test]
fn t2_2_the_batch_timeout_bounds_the_wait_of_a_lone_request() {
    let (mut ex, a) = batching_executor(recording(), 100.0);
    ex.arrive(a, 1_000.0).unwrap();
    ex.advance_to(1_024.9).unwrap();
    assert_eq!(ex.tenant_metrics(a).ledger.completed, 0, "still waiting for its batch");
    ex.advance_to(2_000.0).unwrap();
    assert_eq!(ex.tenant_metrics(a).latency_max_ms, 25.0 + 4.0, "timeout + lat(1)");
    ex.arrive(a, 3_000.0).unwrap();
    ex.arrive(a, 3_010.0).unwrap();
    ex.advance_to(4_000.0).unwrap();
    let b = batches_of(&ex, a);
    let last = b.last().unwrap();
    assert_eq!((last.size, last.started_ms, last.completed_ms), (2, 3_025.0, 3_030.0));
}

/// 2.3 The SLO-admissible cap keeps batches whose latency fits the SLO; `MaxBatch` does not.
#[test]
fn t2_3_the_batch_cap_follows_the_slo_unless_told_otherwise() {
    // SLO 20: 2 lat(b) <= 20 -> lat(b) <= 10 -> b <= 7.
    let (mut ex, a) = batching_executor(recording(), 20.0);
    for _ in 0..8 {
        ex.arrive(a, 0.0).unwrap();
    }
    ex.advance_to(100.0).unwrap();
    let sizes: Vec<u32> = batches_of(&ex, a).iter().map(|b| b.size).collect();
    assert_eq!(sizes, vec![7, 1]);

    let config = ExecutorConfig { batch_cap: BatchCap::MaxBatch, ..recording() };
    let (mut ex, a) = batching_executor(config, 20.0);
    for _ in 0..8 {
        ex.arrive(a, 0.0).unwrap();
    }
    ex.advance_to(100.0).unwrap();
    let sizes: Vec<u32> = batches_of(&ex, a).iter().map(|b| b.size).collect();
    assert_eq!(sizes, vec![8]);
}

// ---------------------------------------------------------------------------------------------------------------
// 3. Reconfiguration

/// `lat(b) = 1 (1 + 0.1 (b - 1))` ms, max batch 4; SLO 50 ms (timeout 12.5 ms).
fn light() -> ModelProfile {
    model("light", 1.0, 0.0, 0.1, 4)
}

/// 3.1 An instance the plan keeps serves through the reconfiguration without a gap; a new cold instance on free
/// slices serves exactly create + warm-up after the plan.
#[test]
fn t3_1_unchanged_instances_keep_serving_and_a_cold_instance_waits_create_and_warmup() {
    let tenants = vec![tenant("a", "light", 50.0), tenant("b", "light", 50.0)];
    let mut ex = executor(recording(), vec![light()], tenants, &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("3g@4", &[("3g@4", "a", Role::Inference, false)])).unwrap();
    let (a, b) = (ix(&ex, "a"), ix(&ex, "b"));
    let mut arrivals = periodic(a, 0.0, 20_000.0, 2.0);
    arrivals.extend(periodic(b, 5_005.0, 20_000.0, 10.0));
    arrivals.sort_by(|x, y| x.at_ms.total_cmp(&y.at_ms));
    let (before, after): (Vec<Arrival>, Vec<Arrival>) = arrivals.iter().partition(|x| x.at_ms < 5_000.0);
    ex.arrive_all(&before).unwrap();
    ex.advance_to(5_000.0).unwrap();
    let target = plan("3g@0 3g@4", &[("3g@4", "a", Role::Inference, false), ("3g@0", "b", Role::Inference, false)]);
    let summary = ex.apply_plan(&gpu("n/0"), &target).unwrap();
    assert_eq!((summary.kept, summary.created_cold, summary.destroyed), (1, 1, 0));
    ex.arrive_all(&after).unwrap();
    ex.advance_to(21_000.0).unwrap();

    // a: batches of 4 every 8 ms all along, through the reconfiguration.
    let ab = batches_of(&ex, a);
    assert!(ab.iter().all(|x| x.placement == "3g@4".parse().unwrap()));
    let gap = longest_gap(&ab, 1_000.0, 19_000.0);
    assert!(gap <= 10.0, "a's longest gap between batches is {gap} ms");
    assert_eq!(ex.tenant_metrics(a).ledger.completed, 10_000);
    // b: created at 5 s (1 s), warm 4 s later; requests that waited less than the SLO are served at once.
    let bb = batches_of(&ex, b);
    assert_eq!(bb[0].started_ms, 10_000.0, "cold start = plan time + create + warm-up");
    let mb = ex.tenant_metrics(b);
    assert_eq!(mb.waited, 500, "b's arrivals before its instance served");
    assert_eq!(mb.dropped_wait_expired, 495, "those that waited longer than the SLO (50 ms)");
    let g = ex.gpu_metrics(gix(&ex, "n/0"));
    assert_eq!((g.reconfigurations, g.creates, g.destroys), (1, 2, 0));
}

/// Moves tenant `a` from 3g@4 to 3g@0 at 5 s, with or without pre-initialisation; returns a's longest gap
/// between batches around the move and its drops.
fn move_a(preinit: bool) -> (f64, u64) {
    let mut ex = executor(recording(), vec![light()], vec![tenant("a", "light", 50.0)], &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("3g@4", &[("3g@4", "a", Role::Inference, false)])).unwrap();
    let a = ix(&ex, "a");
    ex.arrive_all(&periodic(a, 0.0, 5_000.0, 2.0)).unwrap();
    ex.advance_to(5_000.0).unwrap();
    let summary = ex.apply_plan(&gpu("n/0"), &plan("3g@0", &[("3g@0", "a", Role::Inference, preinit)])).unwrap();
    assert_eq!(summary.destroyed, 1);
    assert_eq!(summary.created_preinit, u32::from(preinit));
    ex.arrive_all(&periodic(a, 5_000.0, 20_000.0, 2.0)).unwrap();
    ex.advance_to(21_000.0).unwrap();
    let m = ex.tenant_metrics(a);
    assert_eq!(m.ledger.requests, m.ledger.completed + m.ledger.dropped);
    assert_eq!(ex.gpu_layout(gix(&ex, "n/0")).to_string(), "3g@0");
    (longest_gap(&batches_of(&ex, a), 1_000.0, 19_000.0), m.ledger.dropped)
}

/// 3.2 Moving a tenant cold leaves it without an instance for create + warm-up; pre-initialised, the old
/// instance serves until the new one is warm and the tenant waits only the switch (1 s by default).
#[test]
fn t3_2_preinit_shortens_a_move_to_the_switch() {
    let (cold_gap, cold_drops) = move_a(false);
    let (pre_gap, pre_drops) = move_a(true);
    // Cold: off at 5 s, the new instance (created first, on free slices) serves at 5 + 1 + 4 s.
    assert!((5_000.0..5_015.0).contains(&cold_gap), "cold gap {cold_gap} ms");
    // Pre-initialised: the old one serves until 10 s, the new one from 11 s.
    assert!((1_000.0..1_015.0).contains(&pre_gap), "preinit gap {pre_gap} ms");
    // Requests that arrive in the gap and wait longer than the SLO are dropped.
    assert!((2_470..=2_480).contains(&cold_drops), "{cold_drops}");
    assert!((470..=480).contains(&pre_drops), "{pre_drops}");
}

/// 3.3 A destroyed inference instance finishes its batch in service, and its queued requests move to the
/// tenant's other instance; the GPU's MIG calls follow the device latencies.
#[test]
fn t3_3_a_destroyed_instance_drains_and_its_queue_moves() {
    let slow = model("slow", 100.0, 0.0, 0.0, 1);
    let mut ex = executor(recording(), vec![slow], vec![tenant("a", "slow", 1_000.0)], &["n/0", "n/1"]);
    for g in ["n/0", "n/1"] {
        ex.install_plan(&gpu(g), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
    }
    let a = ix(&ex, "a");
    for _ in 0..5 {
        ex.arrive(a, 0.0).unwrap(); // earliest finish: n/0, n/1, n/0, n/1, n/0
    }
    ex.advance_to(50.0).unwrap();
    let (g0, g1) = (gix(&ex, "n/0"), gix(&ex, "n/1"));
    assert_eq!(ex.gpu_metrics(g0).ledger.requests, 3);
    ex.apply_plan(&gpu("n/0"), &plan("", &[])).unwrap();
    assert_eq!(ex.gpu_layout(g0).to_string(), "7g@0", "still draining its batch");
    ex.advance_to(100.0).unwrap();
    assert!(ex.gpu_layout(g0).is_empty(), "destroyed once its batch completed");
    assert_eq!(ex.device(g0).calls_free_at().as_ms(), 600, "destroy call from 100 ms, 500 ms long");
    ex.advance_to(1_000.0).unwrap();
    let m = ex.tenant_metrics(a);
    assert_eq!((m.ledger.completed, m.redispatched), (5, 2));
    let (l0, l1) = (ex.gpu_metrics(g0).ledger, ex.gpu_metrics(g1).ledger);
    assert_eq!((l0.requests, l0.completed), (1, 1), "the two queued requests count where they were served");
    assert_eq!((l1.requests, l1.completed), (4, 4));
    let done: Vec<f64> = batches_of(&ex, a).iter().map(|b| b.completed_ms).collect();
    assert_eq!(done, vec![100.0, 100.0, 200.0, 300.0, 400.0]);
}

/// 3.4 A kept instance whose tenant changes drains and serves its new work a warm-up later; a plan that breaks a
/// core invariant is refused without effect.
#[test]
fn t3_4_reassignment_warms_up_and_invalid_plans_are_refused() {
    let tenants = vec![tenant("a", "light", 50.0), tenant("b", "light", 50.0)];
    let mut ex = executor(recording(), vec![light()], tenants, &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
    let b = ix(&ex, "b");
    ex.advance_to(1_000.0).unwrap();
    let summary = ex.apply_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "b", Role::Inference, false)])).unwrap();
    assert_eq!((summary.reassigned, summary.created_cold, summary.destroyed), (1, 0, 0));
    ex.arrive_all(&periodic(b, 1_000.0, 6_000.0, 10.0)).unwrap();
    ex.advance_to(7_000.0).unwrap();
    assert_eq!(batches_of(&ex, b)[0].started_ms, 5_000.0, "drained at once, then 4 s of warm-up");
    assert_eq!(ex.gpu_metrics(gix(&ex, "n/0")).reassigns, 1);

    let bad = plan("3g@0 2g@2", &[]);
    let e = ex.apply_plan(&gpu("n/0"), &bad).unwrap_err();
    assert!(matches!(e, ExecError::InvalidPlan(_)), "{e}");
    let unknown = plan("7g@0", &[("7g@0", "nobody", Role::Inference, false)]);
    assert!(matches!(ex.apply_plan(&gpu("n/0"), &unknown), Err(ExecError::InvalidPlan(_))));
    assert_eq!(ex.gpu_assignments(gix(&ex, "n/0")), plan("7g@0", &[("7g@0", "b", Role::Inference, false)]).assignments);
    // Committed plans: epochs must increase.
    let mut gpus = BTreeMap::new();
    gpus.insert(gpu("n/0"), plan("7g@0", &[("7g@0", "b", Role::Inference, false)]));
    let p = Plan { epoch: 3, made_at: Default::default(), policy: "test".into(), gpus };
    assert!(ex.apply(&p).unwrap()[&gpu("n/0")].is_noop());
    assert!(matches!(ex.apply(&p), Err(ExecError::InvalidPlan(_))));
    assert!(matches!(ex.advance_to(10.0), Err(ExecError::TimeWentBack { .. })));
}

// ---------------------------------------------------------------------------------------------------------------
// 4. Requests without an instance

fn without_instance(policy: NoInstance) -> (u64, u64, u64, u64, u64) {
    let config = ExecutorConfig { no_instance: policy, ..ExecutorConfig::default() };
    let mut ex = executor(config, vec![light()], vec![tenant("a", "light", 100.0)], &["n/0"]);
    let a = ix(&ex, "a");
    // Planned at 0, cold: serves from 5 s.
    ex.apply_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
    ex.arrive_all(&periodic(a, 5.0, 6_000.0, 10.0)).unwrap();
    ex.advance_to(7_000.0).unwrap();
    let m = ex.tenant_metrics(a);
    (m.ledger.requests, m.ledger.completed, m.dropped_no_instance, m.waited, m.dropped_wait_expired)
}

/// 4.1 Dropping at once loses every request before the instance serves; waiting saves those that can still meet
/// the SLO when it does, and drops the rest when their SLO has passed.
#[test]
fn t4_1_no_instance_requests_wait_or_drop() {
    // 600 arrivals at 5, 15, ..., 5995 ms; the instance serves from 5000 ms.
    assert_eq!(without_instance(NoInstance::Drop), (600, 100, 500, 0, 0));
    // Waiting at most the SLO (100 ms): those at 4905..4995 are served, the 490 before are dropped.
    assert_eq!(without_instance(NoInstance::Wait { max_wait_of_slo: 1.0 }), (600, 110, 0, 500, 490));
    assert_eq!(without_instance(NoInstance::Wait { max_wait_of_slo: 100.0 }), (600, 600, 0, 500, 0));
}

// ---------------------------------------------------------------------------------------------------------------
// 5. Retraining and accuracy

fn retraining_executor() -> (Executor, TenantIndex) {
    let mut spec = tenant("a", "light", 50.0);
    spec.retraining = Some(retraining());
    let ex = executor(ExecutorConfig::default(), vec![light()], vec![spec], &["n/0"]);
    let a = ix(&ex, "a");
    (ex, a)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// 5.1 Retraining takes work / speed (7g: speed 1; 3g: 3/7), then the accuracy jumps to acc(epochs); the plan's
/// epochs change the work and the accuracy.
#[test]
fn t5_1_retraining_time_is_work_over_speed_and_accuracy_jumps() {
    let r = retraining();
    for (layout, done_ms) in [("7g@0", 60_000.0), ("3g@0", 140_000.0)] {
        let (mut ex, a) = retraining_executor();
        ex.install_plan(&gpu("n/0"), &plan(layout, &[(layout, "a", Role::Retraining, false)])).unwrap();
        ex.advance_to(done_ms - 1.0).unwrap();
        let s = ex.tenant_state(a);
        assert!(s.retraining_due && close(s.accuracy, 0.72), "{layout}: {s:?}");
        assert!(close(s.retraining_done_gpu_s, 60.0 * (done_ms - 1.0) / done_ms), "{layout}: {s:?}");
        ex.advance_to(done_ms + 1e-6).unwrap();
        let s = ex.tenant_state(a);
        assert!(!s.retraining_due, "{layout}: {s:?}");
        assert!(close(s.accuracy, r.accuracy_after(5.0)), "{layout}: {s:?}");
        assert_eq!(ex.tenant_metrics(a).retrainings_completed, 1);
    }
    // Two epochs: 24 GPU-seconds, acc(2).
    let (mut ex, a) = retraining_executor();
    let mut p = plan("7g@0", &[("7g@0", "a", Role::Retraining, false)]);
    p.retraining_epochs.insert(TenantId::new("a").unwrap(), 2.0);
    ex.install_plan(&gpu("n/0"), &p).unwrap();
    ex.advance_to(24_000.0 + 1e-6).unwrap();
    let s = ex.tenant_state(a);
    assert!(!s.retraining_due && close(s.accuracy, r.accuracy_after(2.0)), "{s:?}");
}

/// 5.2 Progress is checkpointed when the retraining instance goes, and resumes on the new one once it is warm.
#[test]
fn t5_2_retraining_progress_survives_a_move() {
    let (mut ex, a) = retraining_executor();
    ex.install_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Retraining, false)])).unwrap();
    ex.advance_to(30_000.0).unwrap();
    // 7g@0 overlaps 3g@4: destroy (0.5 s), create (1 s), warm-up (4 s): training resumes at 35.5 s at 3/7.
    ex.apply_plan(&gpu("n/0"), &plan("3g@4", &[("3g@4", "a", Role::Retraining, false)])).unwrap();
    ex.advance_to(35_000.0).unwrap();
    assert!(close(ex.tenant_state(a).retraining_done_gpu_s, 30.0));
    ex.advance_to(105_499.0).unwrap();
    assert!(ex.tenant_state(a).retraining_due);
    ex.advance_to(105_500.0 + 1e-6).unwrap();
    let s = ex.tenant_state(a);
    assert!(!s.retraining_due && close(s.accuracy, retraining().accuracy_after(5.0)), "{s:?}");
}

/// 5.3 A window that ends without a completed retraining drifts the accuracy once, down to the floor; a new
/// retraining is due at every window start.
#[test]
fn t5_3_accuracy_drifts_per_window_without_retraining_down_to_the_floor() {
    let r = retraining();
    let (mut ex, a) = retraining_executor();
    ex.install_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Retraining, false)])).unwrap();
    ex.advance_to(199_999.0).unwrap();
    assert!(!ex.tenant_state(a).retraining_due);
    ex.advance_to(200_000.0).unwrap();
    let s = ex.tenant_state(a);
    assert!(s.retraining_due && s.retraining_done_gpu_s == 0.0, "fresh data, fresh retraining: {s:?}");
    assert!(close(s.accuracy, r.accuracy_after(5.0)), "retrained in the window: no drift");
    ex.advance_to(270_000.0).unwrap(); // retrained again at 260 s
    ex.apply_plan(&gpu("n/0"), &plan("", &[])).unwrap();
    ex.advance_to(400_000.0).unwrap();
    assert!(close(ex.tenant_state(a).accuracy, r.accuracy_after(5.0)));
    ex.advance_to(600_000.0).unwrap();
    assert!(close(ex.tenant_state(a).accuracy, r.accuracy_after(5.0) - 0.03));
    ex.advance_to(800_000.0).unwrap();
    assert!(close(ex.tenant_state(a).accuracy, r.accuracy_after(5.0) - 0.06));
    ex.advance_to(4_000_000.0).unwrap();
    let s = ex.tenant_state(a);
    assert!(close(s.accuracy, 0.6) && s.retraining_due, "{s:?}");
    assert_eq!(ex.tenant_metrics(a).drift_windows, 18, "windows ending at 600 s, 800 s, .., 4000 s");

    // Without any retraining instance the initial model drifts from the first window on.
    let (mut ex, a) = retraining_executor();
    ex.advance_to(400_000.0).unwrap();
    assert!(close(ex.tenant_state(a).accuracy, 0.72 - 0.06));
}

/// 5.4 Requests are credited with the accuracy of the model that served their batch.
#[test]
fn t5_4_goodput_uses_the_serving_models_accuracy() {
    let mut spec = tenant("a", "light", 50.0);
    spec.retraining = Some(retraining());
    let mut ex = executor(ExecutorConfig::default(), vec![light()], vec![spec], &["n/0"]);
    let a = ix(&ex, "a");
    let p = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference, false), ("3g@4", "a", Role::Retraining, false)]);
    ex.install_plan(&gpu("n/0"), &p).unwrap();
    // Retraining on 3g takes 140 s; 100 requests before, 100 after.
    ex.arrive_all(&periodic(a, 0.0, 100_000.0, 1_000.0)).unwrap();
    ex.arrive_all(&periodic(a, 150_000.0, 250_000.0, 1_000.0)).unwrap();
    ex.advance_to(260_000.0).unwrap();
    let l = ex.tenant_metrics(a).ledger;
    assert_eq!((l.completed, l.within_slo), (200, 200));
    let expected = 100.0 * 0.72 + 100.0 * retraining().accuracy_after(5.0);
    assert!(close(l.goodput, expected), "{} vs {expected}", l.goodput);
}

// ---------------------------------------------------------------------------------------------------------------
// 6. Dispatch

/// `lat(g, b) = 2 (7/g) (1 + 0.1 (b - 1))`: 14 ms on 1g, 4.67 on 3g, 2 on 7g at batch 1.
fn elsa_executor(dispatch: Dispatch) -> (Executor, TenantIndex) {
    let config = ExecutorConfig { dispatch, ..ExecutorConfig::default() };
    let m = model("heavy", 2.0, 1.0, 0.1, 8);
    let mut ex = executor(config, vec![m], vec![tenant("a", "heavy", 40.0)], &["n/0", "n/1", "n/2"]);
    for (g, p) in [("n/0", "1g@0"), ("n/1", "3g@0"), ("n/2", "7g@0")] {
        ex.install_plan(&gpu(g), &plan(p, &[(p, "a", Role::Inference, false)])).unwrap();
    }
    let a = ix(&ex, "a");
    (ex, a)
}

fn requests_per_gpu(ex: &Executor) -> Vec<u64> {
    ["n/0", "n/1", "n/2"].iter().map(|g| ex.gpu_metrics(gix(ex, g)).ledger.requests).collect()
}

/// 6.1 ELSA sends a request to the smallest instance that meets its SLO; earliest-finish to the fastest.
#[test]
fn t6_1_elsa_picks_the_smallest_instance_that_meets_the_slo() {
    let (mut ex, a) = elsa_executor(Dispatch::Elsa);
    ex.arrive(a, 0.0).unwrap();
    assert_eq!(requests_per_gpu(&ex), vec![1, 0, 0]);
    let (mut ex, a) = elsa_executor(Dispatch::EarliestFinish);
    ex.arrive(a, 0.0).unwrap();
    assert_eq!(requests_per_gpu(&ex), vec![0, 0, 1]);

    // A burst of 20: the 1g instance (batch cap 5, lat(5) = 19.6 ms, timeout 10 ms) takes two batches, finishing
    // by 39.2 ms within the 40 ms SLO; the 11th could finish as late as 58.8 ms, so the rest go to the 3g one.
    let (mut ex, a) = elsa_executor(Dispatch::Elsa);
    for _ in 0..20 {
        ex.arrive(a, 0.0).unwrap();
    }
    assert_eq!(requests_per_gpu(&ex), vec![10, 10, 0]);
    ex.advance_to(100.0).unwrap();
    let l = ex.tenant_metrics(a).ledger;
    assert_eq!((l.completed, l.within_slo), (20, 20));
}

// ---------------------------------------------------------------------------------------------------------------
// 7. Determinism

/// A small fleet with Poisson arrivals, a mid-run plan change and retraining; returns the serialised report.
fn scenario(seed: u64) -> (String, Executor) {
    let config = ExecutorConfig { seed, ..ExecutorConfig::default() };
    let models = vec![light(), model("heavy", 2.0, 1.0, 0.1, 8)];
    let mut tenants = vec![tenant("a", "light", 50.0), tenant("b", "heavy", 40.0), tenant("c", "heavy", 60.0)];
    tenants[1].retraining = Some(retraining());
    let mut ex = executor(config, models, tenants, &["n/0", "n/1"]);
    let ab = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference, false), ("3g@4", "b", Role::Inference, false)]);
    let bc = plan("4g@0 3g@4", &[("4g@0", "c", Role::Inference, false), ("3g@4", "b", Role::Retraining, false)]);
    ex.install_plan(&gpu("n/0"), &ab).unwrap();
    ex.install_plan(&gpu("n/1"), &bc).unwrap();
    let (a, b, c) = (ix(&ex, "a"), ix(&ex, "b"), ix(&ex, "c"));
    let rates = [(a, 800.0), (b, 300.0), (c, 400.0)];
    ex.arrive_all(&ex.poisson_arrivals(&rates, 0.0, 30_000.0)).unwrap();
    let moved = plan(
        "2g@0 2g@2 3g@4",
        &[
            ("2g@0", "a", Role::Inference, true),
            ("2g@2", "c", Role::Inference, true),
            ("3g@4", "b", Role::Inference, false),
        ],
    );
    ex.apply_plan(&gpu("n/0"), &moved).unwrap();
    ex.arrive_all(&ex.poisson_arrivals(&rates, 30_000.0, 60_000.0)).unwrap();
    ex.advance_to(61_000.0).unwrap();
    (serde_json::to_string(&ex.report()).unwrap(), ex)
}

/// 7.1 Same seed, same report (every counter and float); another seed, another report.
#[test]
fn t7_1_runs_are_deterministic_for_a_seed() {
    let (one, ex) = scenario(1);
    let (again, _) = scenario(1);
    assert_eq!(one, again);
    let (other, _) = scenario(2);
    assert_ne!(one, other);
    assert!(ex.report().total.requests > 60_000);
}

// ---------------------------------------------------------------------------------------------------------------
// 8. Accounting

/// 8.1 At every point of a run with reconfigurations, drains and drops: requests = completed + dropped +
/// in flight (queued and waiting), for every tenant; the GPUs' ledgers add up to the tenants' completions.
#[test]
fn t8_1_goodput_accounting_is_consistent() {
    let (_, mut ex) = scenario(3);
    let check = |ex: &Executor| {
        let report = ex.report();
        let mut completed = GoodputLedger::default();
        for (id, t) in &report.tenants {
            let l = t.metrics.ledger;
            assert_eq!(l.in_flight(), t.state.queued + t.state.waiting, "{id}");
            assert_eq!(l.requests, l.completed + l.dropped + l.in_flight(), "{id}");
            completed += l;
        }
        let served: u64 = report.gpus.values().map(|g| g.metrics.ledger.completed).sum();
        let queued: u64 = report.gpus.values().map(|g| g.queued).sum();
        let on_gpus: u64 = report.gpus.values().map(|g| g.metrics.ledger.requests).sum();
        assert_eq!(served, completed.completed);
        assert_eq!(on_gpus, served + queued);
        let goodput: f64 = report.gpus.values().map(|g| g.metrics.ledger.goodput).sum();
        assert!((goodput - completed.goodput).abs() < 1e-6 * goodput.max(1.0));
        assert_eq!(ex.check_invariants(), Ok(()));
    };
    check(&ex);
    let a = ix(&ex, "a");
    // A burst while a's only instance is being replaced cold: some wait, some drop, all are accounted for.
    let now = ex.now_ms();
    ex.apply_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
    check(&ex);
    for k in 0..2_000 {
        ex.arrive(a, now + f64::from(k) * 5.0).unwrap();
        if k % 250 == 0 {
            check(&ex);
        }
    }
    ex.advance_to(now + 20_000.0).unwrap();
    check(&ex);
    let m = ex.tenant_metrics(a);
    assert!(m.waited > 0 && m.dropped_wait_expired > 0 && m.ledger.completed > 0);
}

// ---------------------------------------------------------------------------------------------------------------
// 9. Interference

/// Every instance runs `factor` times slower when it shares its GPU with another.
struct Crowded {
    factor: f64,
}

impl Interference for Crowded {
    fn factors(
        &mut self,
        _: GpuModel,
        residents: &[Resident<'_>],
        out: &mut Vec<f64>,
    ) -> Result<(), InterferenceError> {
        out.clear();
        out.resize(residents.len(), if residents.len() > 1 { self.factor } else { 1.0 });
        Ok(())
    }
}

/// 9.1 Batch latency is the profile's latency times the interference factor of the co-located set, recomputed
/// when the set changes; retraining slows by the same factor.
#[test]
fn t9_1_interference_scales_latency_and_retraining() {
    let mut b = tenant("b", "light", 50.0);
    b.retraining = Some(RetrainingSpec { work_gpu_s: 6.0, ..retraining() });
    let tenants = vec![tenant("a", "batchy", 100.0), b];
    let mut ex =
        executor_with(recording(), vec![batchy(8), light()], tenants, &["n/0"], Box::new(Crowded { factor: 1.5 }));
    ex.install_plan(&gpu("n/0"), &plan("3g@0", &[("3g@0", "a", Role::Inference, false)])).unwrap();
    let (a, bi) = (ix(&ex, "a"), ix(&ex, "b"));
    ex.arrive(a, 0.0).unwrap();
    ex.advance_to(100.0).unwrap();
    assert_eq!(ex.tenant_metrics(a).latency_max_ms, 25.0 + 4.0, "alone: timeout + lat(1)");
    let shared = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference, false), ("3g@4", "b", Role::Retraining, false)]);
    ex.apply_plan(&gpu("n/0"), &shared).unwrap();
    ex.arrive(a, 200.0).unwrap();
    ex.advance_to(300.0).unwrap();
    assert_eq!(ex.tenant_metrics(a).latency_max_ms, 25.0 + 4.0 * 1.5, "shared: timeout + 1.5 lat(1)");
    // b's retraining (3g: 3/7 per second, 1.5 times slower) starts at 5.1 s (create + warm-up): 6 / (2/7) s.
    let done_ms = 5_100.0 + 6.0 / (3.0 / 7.0 / 1.5) * 1000.0;
    ex.advance_to(done_ms - 1.0).unwrap();
    assert!(ex.tenant_state(bi).retraining_due);
    ex.advance_to(done_ms + 1.0).unwrap();
    assert!(!ex.tenant_state(bi).retraining_due);
}

/// 9.2 The TLB model's slowdowns reach the latencies of co-located tenants.
#[test]
fn t9_2_the_tlb_model_slows_co_located_tenants() {
    let tlb = TlbModel::new(TlbParams::default(), 5, 40_000).unwrap();
    let interference = TlbInterference::new(tlb, TlbMode::Baseline);
    let models = vec![model("resnet50", 4.0, 0.0, 0.25, 8), model("bert_base", 4.0, 0.0, 0.25, 8)];
    let tenants = vec![tenant("a", "resnet50", 100.0), tenant("b", "bert_base", 100.0)];
    let mut ex = executor_with(recording(), models, tenants, &["n/0"], Box::new(interference));
    let both = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference, false), ("3g@4", "b", Role::Inference, false)]);
    ex.install_plan(&gpu("n/0"), &both).unwrap();
    let a = ix(&ex, "a");
    ex.arrive(a, 0.0).unwrap();
    ex.advance_to(100.0).unwrap();
    // The same mix asked of a fresh model with the same seed and length: the factor the executor used.
    let mut check = TlbModel::new(TlbParams::default(), 5, 40_000).unwrap();
    let specs = [
        TenantStreamSpec::for_model("resnet50").unwrap().with_slices(3),
        TenantStreamSpec::for_model("bert_base").unwrap().with_slices(3),
    ];
    let factor = check.slowdowns(&specs, TlbMode::Baseline).unwrap().tenants[0].latency_factor().max(1.0);
    assert!(factor > 1.0, "co-located streams interfere ({factor})");
    let latency = ex.tenant_metrics(a).latency_max_ms;
    assert!((latency - (25.0 + 4.0 * factor)).abs() < 1e-9, "{latency} vs factor {factor}");
}

// ---------------------------------------------------------------------------------------------------------------
// 10. Fluid serving

/// Tenant "a" on a 7g of `batchy(8)` at SLO 40 ms (cap 8, lat(8) = 11 ms: 727 requests per second), served for
/// `secs` at `load` of that capacity, discretely (Poisson arrivals) or fluidly (ticks of 100 ms); returns the
/// tenant's ledger and its queue at the end.
fn served_at(load: f64, fluid: bool, secs: f64) -> (GoodputLedger, u64) {
    served_with(LateRequests::Serve, load, fluid, secs)
}

/// [`served_at`] with `late` requests served or shed.
fn served_with(late: LateRequests, load: f64, fluid: bool, secs: f64) -> (GoodputLedger, u64) {
    let config = ExecutorConfig { seed: 5, late, ..ExecutorConfig::default() };
    let mut ex = executor(config, vec![batchy(8)], vec![tenant("a", "batchy", 40.0)], &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
    let a = ix(&ex, "a");
    let rate_rps = load * 8.0 / 11.0 * 1000.0;
    let end_ms = secs * 1000.0;
    if fluid {
        let mut t = 0.0;
        while t < end_ms {
            ex.flow(t + 100.0, &[rate_rps / 10.0]).unwrap();
            t += 100.0;
        }
    } else {
        let arrivals = ex.poisson_arrivals(&[(a, rate_rps)], 0.0, end_ms);
        ex.arrive_all(&arrivals).unwrap();
        ex.advance_to(end_ms).unwrap();
    }
    ex.check_invariants().unwrap();
    let m = ex.tenant_metrics(a);
    // Every request completed, and only those, is in the latency record (shed ones included in neither).
    assert_eq!(m.latency.total(), m.ledger.completed, "{late:?} at load {load}, fluid {fluid}");
    (m.ledger, ex.tenant_state(a).queued)
}

/// 10.1 Fluid serving agrees with request-by-request serving on one instance, from light load to overload: the
/// requests served, and the share within SLO (the queueing correction below capacity, the growing backlog above).
#[test]
fn t10_1_fluid_serving_agrees_with_discrete_serving() {
    for load in [0.3, 0.7, 0.85, 0.95, 1.1] {
        let (d, dq) = served_at(load, false, 60.0);
        let (f, fq) = served_at(load, true, 60.0);
        let att = |l: &GoodputLedger| l.within_slo as f64 / l.requests as f64;
        let served = |l: &GoodputLedger| l.completed as f64 / l.requests as f64;
        eprintln!(
            "load {load}: discrete {} requests, served {:.4}, within {:.4} (queued {dq}); fluid {} requests, served {:.4}, within {:.4} (queued {fq})",
            d.requests,
            served(&d),
            att(&d),
            f.requests,
            served(&f),
            att(&f)
        );
        assert!((f.requests as f64 / d.requests as f64 - 1.0).abs() < 0.01, "load {load}: the same requests");
        assert!((served(&f) - served(&d)).abs() < 0.01, "load {load}: served");
        assert!((att(&f) - att(&d)).abs() < 0.03, "load {load}: within SLO");
    }
}

/// 10.1b Shedding late requests, in both executors: below capacity it changes almost nothing; above it, every
/// request served meets the SLO, the queue stays short, and within-SLO requests are about the instance's capacity
/// (where serving them late loses nearly all). Fluid and discrete shedding agree.
#[test]
fn t10_1b_shedding_late_requests_keeps_an_overloaded_instance_within_slo() {
    let att = |l: &GoodputLedger| l.within_slo as f64 / l.requests as f64;
    for fluid in [false, true] {
        let (served, _) = served_with(LateRequests::Serve, 0.7, fluid, 60.0);
        let (shed, _) = served_with(LateRequests::Shed, 0.7, fluid, 60.0);
        assert!(att(&shed) >= att(&served) - 1e-9 && att(&shed) - att(&served) < 0.01, "fluid {fluid}: {shed:?}");
    }
    for load in [0.85, 0.95, 1.0] {
        let (d, _) = served_with(LateRequests::Shed, load, false, 60.0);
        let (f, _) = served_with(LateRequests::Shed, load, true, 60.0);
        eprintln!("load {load}: discrete {d:?}; fluid {f:?}");
        assert!((att(&d) - att(&f)).abs() < 0.02, "load {load}: discrete {} vs fluid {}", att(&d), att(&f));
    }
    for load in [1.1, 1.5, 2.0] {
        let capacity = 8.0 / 11.0 * 60_000.0; // requests the instance serves in 60 s at full batches
        let mut attained = Vec::new();
        for fluid in [false, true] {
            let (late, _) = served_with(LateRequests::Serve, load, fluid, 60.0);
            let (l, queued) = served_with(LateRequests::Shed, load, fluid, 60.0);
            eprintln!("load {load}, fluid {fluid}: served late {late:?}; shed {l:?}, queued {queued}");
            assert_eq!(l.requests, l.completed + l.dropped + queued);
            assert_eq!(l.within_slo, l.completed, "load {load}, fluid {fluid}: every request served meets the SLO");
            assert!(
                l.dropped > 0 && (queued as f64) < 0.01 * l.requests as f64,
                "load {load}: excess shed, not queued"
            );
            let within = l.within_slo as f64;
            assert!(
                within > 0.93 * capacity && within < 1.01 * capacity,
                "load {load}, fluid {fluid}: {within} of {capacity}"
            );
            assert!(att(&l) > 2.0 * att(&late), "load {load}, fluid {fluid}: shedding beats serving late");
            attained.push(att(&l));
        }
        assert!(
            (attained[0] - attained[1]).abs() < 0.03,
            "load {load}: discrete {} vs fluid {}",
            attained[0],
            attained[1]
        );
    }
}

/// 10.2 Fluid accounting: every request is completed, dropped or queued, within-SLO counts never exceed
/// completions, and above capacity the backlog grows by the excess.
#[test]
fn t10_2_fluid_accounting_and_backlog() {
    let (l, queued) = served_at(0.5, true, 10.0);
    assert_eq!(l.requests, l.completed + l.dropped + queued);
    assert!(queued <= 1, "below capacity nothing waits beyond a tick ({queued})");
    assert!(l.within_slo <= l.completed && l.within_slo as f64 > 0.999 * l.completed as f64);
    let (l, queued) = served_at(1.5, true, 10.0);
    assert_eq!(l.requests, l.completed + l.dropped + queued);
    let excess = 0.5 * 8.0 / 11.0 * 10_000.0;
    assert!((queued as f64 - excess).abs() < 2.0, "backlog {queued}, excess {excess}");
    assert!(l.within_slo < l.completed / 10, "an ever-growing backlog misses the SLO: {l:?}");
}

/// 10.3 Without a serving instance, fluid requests wait their longest wait or are dropped at once, as discrete
/// ones do (4.1: 600 requests over 6 s, the instance serving from 5 s).
#[test]
fn t10_3_fluid_requests_without_an_instance_wait_or_drop() {
    let run = |policy: NoInstance| {
        let config = ExecutorConfig { no_instance: policy, ..ExecutorConfig::default() };
        let mut ex = executor(config, vec![light()], vec![tenant("a", "light", 100.0)], &["n/0"]);
        let a = ix(&ex, "a");
        ex.apply_plan(&gpu("n/0"), &plan("7g@0", &[("7g@0", "a", Role::Inference, false)])).unwrap();
        for k in 0..60 {
            ex.flow(f64::from(k + 1) * 100.0, &[10.0]).unwrap();
        }
        ex.advance_to(7_000.0).unwrap();
        let m = ex.tenant_metrics(a);
        (m.ledger.requests, m.ledger.completed, m.dropped_no_instance, m.dropped_wait_expired)
    };
    assert_eq!(run(NoInstance::Drop), (600, 100, 500, 0));
    // Chunks at the middle of each tick: those of the tick before 5 s are still served.
    assert_eq!(run(NoInstance::Wait { max_wait_of_slo: 1.0 }), (600, 110, 0, 490));
}

/// 10.4 Counts that do not fit the executor are refused, naming what is wrong.
#[test]
fn t10_4_fluid_counts_are_checked() {
    let mut ex = executor(ExecutorConfig::default(), vec![light()], vec![tenant("a", "light", 100.0)], &["n/0"]);
    let e = ex.flow(100.0, &[1.0, 2.0]).unwrap_err().to_string();
    assert!(e.contains("2 counts for 1 tenants"), "{e}");
    let e = ex.flow(100.0, &[f64::NAN]).unwrap_err().to_string();
    assert!(e.contains("finite"), "{e}");
    assert!(matches!(ex.flow(-1.0, &[1.0]), Err(ExecError::TimeWentBack { .. })));
    let e = ex.flow(0.0, &[1.0]).unwrap_err().to_string();
    assert!(e.contains("empty interval"), "{e}");
    ex.flow(0.0, &[0.0]).unwrap();
}

/// 10.5 Fluid serving follows reconfigurations: a tenant overloading its 3g is moved to a 7g, and once the 7g
/// serves (create + warm-up later) its backlog drains and its requests meet the SLO again.
#[test]
fn t10_5_fluid_serving_follows_a_reconfiguration() {
    let mut ex = executor(ExecutorConfig::default(), vec![batchy(8)], vec![tenant("a", "batchy", 40.0)], &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("3g@0", &[("3g@0", "a", Role::Inference, false)])).unwrap();
    let a = ix(&ex, "a");
    // batchy has alpha 0: every profile serves 727 requests per second; the 3g's latency is the 7g's. Load it
    // at 1.5x for 2 s: the backlog grows.
    let tick = |ex: &mut Executor, k: u32, rps: f64| ex.flow(f64::from(k + 1) * 100.0, &[rps / 10.0]).unwrap();
    for k in 0..20 {
        tick(&mut ex, k, 1_090.0);
    }
    let backlog = ex.tenant_state(a).queued;
    assert!(backlog > 500, "{backlog}");
    // Two instances: the backlog drains at twice the rate once the second serves.
    let both = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference, false), ("3g@4", "a", Role::Inference, false)]);
    ex.apply_plan(&gpu("n/0"), &both).unwrap();
    let before = ex.tenant_metrics(a).ledger;
    // The new 3g serves 5.1 s later (create + warm-up), then drains the backlog at 364 requests per second.
    for k in 20..220 {
        tick(&mut ex, k, 1_090.0);
    }
    assert_eq!(ex.tenant_state(a).serving_instances, 2);
    assert!(ex.tenant_state(a).queued < 20, "drained: {}", ex.tenant_state(a).queued);
    let mid = ex.tenant_metrics(a).ledger;
    for k in 220..240 {
        tick(&mut ex, k, 1_090.0);
    }
    let after = ex.tenant_metrics(a).ledger;
    let (served, within) = (after.completed - mid.completed, after.within_slo - mid.within_slo);
    assert!(within as f64 > 0.99 * served as f64, "{within} of {served} within SLO at 0.75 load");
    assert!(mid.completed - before.completed > 20 * 1_090, "two instances served more than arrived");
}

/// 10.6 Serving the steps of a window together ([`Executor::flow_steps`], tenants in parallel between events) gives
/// what serving them one by one gives, to the last bit: three tenants on two GPUs through a reconfiguration (its
/// create, warm-up and drain events), a retraining that completes, a tenant without an instance whose requests
/// wait, overload and a split tick.
#[test]
fn t10_6_fluid_steps_together_match_steps_one_by_one() {
    let run = |together: bool| {
        let mut b = tenant("b", "batchy", 40.0);
        b.retraining = Some(RetrainingSpec { work_gpu_s: 20.0, ..retraining() });
        let tenants = vec![tenant("a", "batchy", 40.0), b, tenant("c", "light", 100.0)];
        let mut ex = executor(ExecutorConfig::default(), vec![batchy(8), light()], tenants, &["n/0", "n/1"]);
        let first = plan("3g@0 3g@4", &[("3g@0", "a", Role::Inference, false), ("3g@4", "b", Role::Inference, false)]);
        ex.install_plan(&gpu("n/0"), &first).unwrap();
        ex.install_plan(&gpu("n/1"), &plan("7g@0", &[("7g@0", "b", Role::Retraining, false)])).unwrap();
        // (to, counts) per step: 100 ms ticks at rising load, one tick split at 3,050 ms where "c" gets an
        // instance and "a" a second one.
        let mut steps: Vec<(f64, Vec<f64>)> = Vec::new();
        for k in 0..400u32 {
            let load = 20.0 + f64::from(k) * 0.4;
            let counts = vec![load * 1.3, load * 0.7, 3.0 + f64::from(k % 7)];
            let to = f64::from(k + 1) * 100.0;
            if k == 30 {
                steps.push((3_050.0, counts.iter().map(|c| c * 0.5).collect()));
                steps.push((to, counts.iter().map(|c| c * 0.5).collect()));
            } else {
                steps.push((to, counts));
            }
        }
        let change = plan(
            "3g@0 2g@4 1g@6",
            &[
                ("3g@0", "a", Role::Inference, false),
                ("2g@4", "b", Role::Inference, false),
                ("1g@6", "c", Role::Inference, false),
            ],
        );
        let split = steps.iter().position(|(to, _)| *to == 3_050.0).unwrap() + 1;
        for part in [&steps[..split], &steps[split..]] {
            if together {
                for chunk in part.chunks(37) {
                    let batch: Vec<(f64, &[f64])> = chunk.iter().map(|(to, c)| (*to, c.as_slice())).collect();
                    ex.flow_steps(&batch).unwrap();
                }
            } else {
                for (to, c) in part {
                    ex.flow(*to, c).unwrap();
                }
            }
            if ex.now_ms() == 3_050.0 {
                ex.apply_plan(&gpu("n/0"), &change).unwrap();
            }
        }
        ex.check_invariants().unwrap();
        let tenants: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|t| format!("{:?} {:?}", ex.tenant_metrics(ix(&ex, t)), ex.tenant_state(ix(&ex, t))))
            .collect();
        let gpus: Vec<String> = ["n/0", "n/1"].iter().map(|g| format!("{:?}", ex.gpu_metrics(gix(&ex, g)))).collect();
        (tenants, gpus)
    };
    let (one_by_one, together) = (run(false), run(true));
    assert!(one_by_one.0[1].contains("retrainings_completed: 1"), "{}", one_by_one.0[1]);
    assert_eq!(one_by_one, together);
}

// ---------------------------------------------------------------------------------------------------------------
// 11. Sharing one instance between inference and retraining

/// A tenant of `batchy(8)` (SLO 100 ms) that retrains 60 7g-seconds, on one 7g instance whose inference and
/// retraining share it under `mode` (inference alone under `Exclusive`), at `load` of the exclusive full-batch throughput for `secs` seconds.
fn shared_run(mode: Sharing, load: f64, fluid: bool, secs: f64) -> (Executor, TenantIndex) {
    let mut spec = tenant("a", "batchy", 100.0);
    spec.retraining = Some(retraining());
    let mut ex =
        executor(ExecutorConfig { seed: 11, ..ExecutorConfig::default() }, vec![batchy(8)], vec![spec], &["n/0"]);
    let mut p = plan("7g@0", &[("7g@0", "a", Role::Inference, false), ("7g@0", "a", Role::Retraining, false)]);
    p.sharing = mode;
    if mode == Sharing::Exclusive {
        p.assignments.pop(); // inference alone
    }
    ex.install_plan(&gpu("n/0"), &p).unwrap();
    let a = ix(&ex, "a");
    let rate_rps = load * 8.0 / 11.0 * 1000.0;
    let arrivals = ex.poisson_arrivals(&[(a, rate_rps)], 0.0, secs * 1000.0);
    let mut t = 0.0;
    let mut next = 0;
    while t < secs * 1000.0 {
        // Settled every 100 ms, as replay's ticks do.
        if fluid {
            ex.flow(t + 100.0, &[rate_rps / 10.0]).unwrap();
        } else {
            let k = next + arrivals[next..].partition_point(|x| x.at_ms < t + 100.0);
            ex.arrive_all(&arrivals[next..k]).unwrap();
            next = k;
            ex.advance_to(t + 100.0).unwrap();
        }
        t += 100.0;
    }
    ex.check_invariants().unwrap();
    (ex, a)
}

/// 11.1 Under a sharing mode one instance holds the tenant's inference and its retraining: both assignments are
/// reported, every request is accounted for once, and the instance's time splits into inference's own work,
/// training and the rest, never counting a second twice; the retraining progresses by exactly the training
/// credited there. Priority costs inference the preemption bound per batch, time-slicing at least a slice.
#[test]
fn t11_1_a_shared_instance_serves_and_retrains_without_counting_twice() {
    let mut mean_latency = BTreeMap::new();
    for mode in [Sharing::Priority, Sharing::Timeslice] {
        let (ex, a) = shared_run(mode, 0.5, false, 30.0);
        let roles: Vec<Role> = ex.gpu_assignments(gix(&ex, "n/0")).iter().map(|x| x.role).collect();
        assert_eq!(roles, vec![Role::Inference, Role::Retraining], "{mode}");
        let m = ex.tenant_metrics(a);
        let s = ex.tenant_state(a);
        let l = m.ledger;
        assert_eq!(l.requests, l.completed + l.dropped + s.queued + s.waiting, "{mode}");
        let sh = m.shared;
        assert!((sh.serving_ms - 30_000.0).abs() < 1e-6, "{mode}: {sh:?}");
        assert!(sh.inference_ms + sh.train_ms <= sh.serving_ms + 1e-6, "{mode}: {sh:?}");
        assert!(sh.inference_ms > 0.2 * sh.serving_ms && sh.train_ms > 0.2 * sh.serving_ms, "{mode}: {sh:?}");
        // Training alone on a 7g runs at 1 7g-second per second: the progress is the training credited.
        assert!(s.retraining_due, "{mode}: {s:?}");
        assert!((s.retraining_done_gpu_s - sh.train_gpu_s).abs() < 1e-6, "{mode}: {s:?} {sh:?}");
        assert!((sh.train_gpu_s - sh.train_ms / 1000.0).abs() < 1e-6, "{mode}: {sh:?}");
        mean_latency.insert(mode, m.mean_latency_ms());
    }
    let (alone, a) = shared_run(Sharing::Exclusive, 0.5, false, 30.0);
    let exclusive = alone.tenant_metrics(a).mean_latency_ms();
    assert_eq!(alone.tenant_metrics(a).shared.serving_ms, 0.0);
    assert!(!alone.gpu_assignments(gix(&alone, "n/0")).is_empty());
    let priority = mean_latency[&Sharing::Priority];
    let timeslice = mean_latency[&Sharing::Timeslice];
    assert!(priority > exclusive && priority < exclusive * 1.1, "{exclusive} {priority}");
    assert!(timeslice > exclusive + 2.0, "{exclusive} {timeslice}");
}

/// 11.2 A shared retraining completes, and the plan that starts sharing on a kept inference instance does not
/// interrupt it (no reload); the one that stops it hands the retraining back to an exclusive instance with its
/// progress.
#[test]
fn t11_2_sharing_starts_and_stops_on_a_kept_instance() {
    let mut spec = tenant("a", "batchy", 100.0);
    spec.retraining = Some(retraining());
    let mut ex = executor(ExecutorConfig::default(), vec![batchy(8)], vec![spec], &["n/0"]);
    ex.install_plan(&gpu("n/0"), &plan("4g@0", &[("4g@0", "a", Role::Inference, false)])).unwrap();
    let a = ix(&ex, "a");
    ex.advance_to(1_000.0).unwrap();
    let mut shared = plan("4g@0", &[("4g@0", "a", Role::Inference, false), ("4g@0", "a", Role::Retraining, false)]);
    shared.sharing = Sharing::Priority;
    let summary = ex.apply_plan(&gpu("n/0"), &shared).unwrap();
    assert_eq!((summary.kept, summary.reassigned, summary.created_cold), (1, 0, 0), "{summary:?}");
    assert_eq!(ex.tenant_state(a).serving_instances, 1);
    ex.advance_to(21_000.0).unwrap();
    // Idle inference: training at Tally's transformed-kernel speed, 0.95 x 4/7 7g-seconds per second.
    let done = ex.tenant_state(a).retraining_done_gpu_s;
    assert!((done - 20.0 * 0.95 * 4.0 / 7.0).abs() < 1e-6, "{done}");
    // Stop sharing: the retraining moves to 3g@4 (created cold) with its progress.
    let back = plan("4g@0 3g@4", &[("4g@0", "a", Role::Inference, false), ("3g@4", "a", Role::Retraining, false)]);
    let summary = ex.apply_plan(&gpu("n/0"), &back).unwrap();
    assert_eq!((summary.kept, summary.created_cold), (1, 1), "{summary:?}");
    ex.advance_to(22_000.0).unwrap();
    assert!((ex.tenant_state(a).retraining_done_gpu_s - done).abs() < 1e-9);
    let left = 60.0 - done;
    let warm_ms = 21_000.0 + 1_000.0 + 4_000.0;
    ex.advance_to(warm_ms + left / (3.0 / 7.0) * 1000.0 + 1.0).unwrap();
    let s = ex.tenant_state(a);
    assert!(!s.retraining_due, "{s:?}");
    assert_eq!(ex.tenant_metrics(a).retrainings_completed, 1);
}

/// 11.3 Fluid serving credits a shared instance's training from the pool's busy time as discrete serving does
/// from its batches: they agree within a few per cent of the instance's time.
#[test]
fn t11_3_fluid_and_discrete_sharing_agree() {
    for mode in [Sharing::Priority, Sharing::Timeslice] {
        for load in [0.3, 0.7] {
            let (d, a) = shared_run(mode, load, false, 30.0);
            let (f, b) = shared_run(mode, load, true, 30.0);
            let (ds, fs) = (d.tenant_metrics(a).shared, f.tenant_metrics(b).shared);
            eprintln!("{mode} at {load}: discrete {ds:?}; fluid {fs:?}");
            assert!((ds.train_ms - fs.train_ms).abs() < 0.05 * ds.serving_ms, "{mode} {load}: {ds:?} {fs:?}");
            let att = |ex: &Executor, t| {
                let l = ex.tenant_metrics(t).ledger;
                l.within_slo as f64 / l.requests as f64
            };
            assert!((att(&d, a) - att(&f, b)).abs() < 0.03, "{mode} {load}");
        }
    }
}

/// 11.4 Two roles on one instance are refused without a sharing mode, and never for two tenants.
#[test]
fn t11_4_plans_share_an_instance_only_under_a_sharing_mode() {
    let mut spec = tenant("a", "batchy", 100.0);
    spec.retraining = Some(retraining());
    let mut ex =
        executor(ExecutorConfig::default(), vec![batchy(8)], vec![spec, tenant("b", "batchy", 100.0)], &["n/0"]);
    let both = plan("7g@0", &[("7g@0", "a", Role::Inference, false), ("7g@0", "a", Role::Retraining, false)]);
    assert!(matches!(ex.apply_plan(&gpu("n/0"), &both), Err(ExecError::InvalidPlan(_))));
    let mut two = plan("7g@0", &[("7g@0", "a", Role::Inference, false), ("7g@0", "b", Role::Retraining, false)]);
    two.sharing = Sharing::Priority;
    assert!(matches!(ex.apply_plan(&gpu("n/0"), &two), Err(ExecError::InvalidPlan(_))));
    assert_eq!(ex.gpu_layout(gix(&ex, "n/0")).len(), 0);
}
