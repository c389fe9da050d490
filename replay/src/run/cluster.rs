//! `--mode cluster`: the same scenario through a running coordinator cluster over gRPC.
//!
//! Replay hosts the simulated nodes itself: one gRPC `Agent` endpoint per node of the scenario's fleet, all backed
//! by one shared [`Executor`] (the simulator's workload model: queues, batching, latency, retraining, accuracy
//! drift), so the requests of the trace run on simulated GPUs exactly as in-process, but every layout comes from the
//! coordinator: the nodes register and heartbeat (observed layouts, arrival counters, accuracy, retraining
//! progress), the coordinator's leader plans with its own policy and forecasts, commits the plan through Raft and
//! pushes epoch-numbered targets to the node endpoints, which apply them to the executor.
//!
//! Window by window, in virtual workload time: heartbeat every node (the reports are replicated before the call
//! returns), move the cluster's clock to the window start (`AdvanceClock`; the coordinator plans when a window
//! boundary passes, and replay asks for a round with `TriggerPlan` when it did not), then feed the window's arrivals
//! to the executor and advance it, applying the pushed targets' scheduled changes at their times.
//!
//! The nodes report what a real agent measures, and the coordinator plans from the replicated state only: observed
//! layouts and assignments (in the executor's instance order), each tenant's accuracy, whether a retraining is due
//! and its progress, and the measured arrival rate of every planner slot (before the first window, each tenant's
//! first-window rate, the rate it declares when onboarded). With the same `--plan-every`, `--slot`, `--horizon`,
//! `--target-utilization` and `--forecaster` on both sides, the leader's `PlannerInput` is the one in-process replay
//! builds, so both modes give the same numbers for the same seed (a test checks it). The coordinator must run with
//! `--clock virtual` (as `coordinator dev-cluster` starts it) and start with no nodes of its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_core::GpuModel;
use tessera_core::ids::{GpuId, NodeId};
use tessera_core::plan::GpuPlan;
use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tessera_proto::v1::coordinator_client::CoordinatorClient;
use tessera_sim::executor::{Arrival, Dispatch, Executor, GpuIndex};
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use super::arrivals::Arrivals;
use super::driver::{LAYOUT_GPUS, PolicyRun, RateTable, Totals, WindowRow, executor_for, feed_window, upcoming_within};
use super::{ReplayError, Scenario};

/// The simulated fleet behind the node endpoints.
struct Fleet {
    exec: Executor,
    /// Per node: the newest epoch and its targets.
    epochs: BTreeMap<NodeId, (u64, BTreeMap<u32, GpuPlan>)>,
    /// Targets accepted since the driver last looked (applied at once; their scheduled changes are queued).
    pushed: Vec<(GpuId, GpuPlan)>,
    reconfig_errors: Vec<String>,
    /// Per tenant (executor order): measured rates of the slots completed since the last report.
    slot_rates: Vec<Vec<f64>>,
}

type Shared = Arc<Mutex<Fleet>>;

fn lock(f: &Shared) -> std::sync::MutexGuard<'_, Fleet> {
    f.lock().unwrap_or_else(|e| e.into_inner())
}

/// One simulated node's `Agent` endpoint over the shared executor.
#[derive(Clone)]
struct NodeFacade {
    node: NodeId,
    gpus: Vec<(u32, GpuId, GpuIndex, GpuModel)>,
    fleet: Shared,
    /// Whether this node reports the fleet's per-tenant counters (one node does, so the coordinator does not
    /// count them once per node).
    reports_tenants: bool,
}

impl NodeFacade {
    fn state(&self) -> v1::NodeState {
        let mut f = lock(&self.fleet);
        let slot_rates = if self.reports_tenants { std::mem::take(&mut f.slot_rates) } else { vec![] };
        let (epoch, targets) = f.epochs.get(&self.node).cloned().unwrap_or_default();
        let gpus = self
            .gpus
            .iter()
            .map(|(idx, id, gi, model)| {
                // Instances in the executor's order (the order the in-process planner input lists assignments in),
                // then the idle ones.
                let layout = f.exec.gpu_layout(*gi);
                let assignments = f.exec.gpu_assignments(*gi);
                let mut order: Vec<tessera_core::Placement> = Vec::new();
                for p in assignments.iter().map(|a| a.placement).chain(layout.placements().iter().copied()) {
                    if !order.contains(&p) {
                        order.push(p);
                    }
                }
                let instances = order
                    .iter()
                    .enumerate()
                    .map(|(k, p)| v1::Instance {
                        id: k as u32,
                        placement: Some((*p).into()),
                        work: assignments
                            .iter()
                            .filter(|a| a.placement == *p)
                            .map(|a| v1::Work { tenant: a.tenant.to_string(), role: v1::Role::from(a.role).into() })
                            .collect(),
                        serving: true,
                    })
                    .collect();
                v1::GpuState {
                    index: *idx,
                    name: id.to_string(),
                    model: model.to_string(),
                    mig: Some(v1::MigMode { current: true, pending: true }),
                    instances,
                    desired: targets.get(idx).map(Into::into),
                    desired_epoch: epoch,
                    converged: true,
                    last_error: String::new(),
                }
            })
            .collect();
        let now_ms = f.exec.now_ms().round() as u64;
        let tenants = if self.reports_tenants {
            f.exec
                .tenant_ids()
                .map(|(i, id)| {
                    let m = f.exec.tenant_metrics(i);
                    let st = f.exec.tenant_state(i);
                    v1::TenantMetrics {
                        tenant: id.to_string(),
                        arrivals: m.ledger.requests,
                        served_within_slo: m.ledger.within_slo,
                        dropped: m.ledger.dropped,
                        queued: st.queued,
                        retraining_done_gpu_s: st.retraining_done_gpu_s,
                        serving_instances: st.serving_instances,
                        retraining_instances: 0,
                        accuracy: st.accuracy,
                        model_version: m.retrainings_completed,
                        retraining_due: Some(st.retraining_due),
                        slot_rates: slot_rates.get(i.0 as usize).cloned().unwrap_or_default(),
                    }
                })
                .collect()
        } else {
            vec![]
        };
        v1::NodeState {
            node_id: self.node.to_string(),
            epoch,
            applied_epoch: epoch,
            gpus,
            metrics: Some(v1::WorkloadMetrics { now_ms, tenants }),
            steps: 0,
        }
    }

    fn register_request(&self, address: &str) -> v1::RegisterRequest {
        let f = lock(&self.fleet);
        v1::RegisterRequest {
            node_id: self.node.to_string(),
            address: address.to_string(),
            gpus: self
                .gpus
                .iter()
                .map(|(idx, _, gi, model)| v1::GpuDescriptor {
                    index: *idx,
                    model: model.to_string(),
                    mig_enabled: true,
                    layout: Some((&f.exec.gpu_layout(*gi)).into()),
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl v1::agent_server::Agent for NodeFacade {
    async fn apply_layout(
        &self,
        request: Request<v1::ApplyLayoutRequest>,
    ) -> Result<Response<v1::ApplyLayoutResponse>, Status> {
        let req = request.into_inner();
        let targets = tessera_agent::service::targets_from_wire(req.targets)?;
        let mut f = lock(&self.fleet);
        let current = f.epochs.get(&self.node).map_or(0, |e| e.0);
        let status = if req.epoch < current {
            v1::ApplyStatus::Stale
        } else if req.epoch == current && f.epochs.get(&self.node).is_some_and(|e| e.1 == targets) {
            v1::ApplyStatus::AlreadyAccepted
        } else if req.epoch == current {
            return Err(Status::failed_precondition(format!("epoch {current} was accepted with other targets")));
        } else {
            for (idx, plan) in &targets {
                let Some((_, id, _, _)) = self.gpus.iter().find(|g| g.0 == *idx) else {
                    return Err(Status::invalid_argument(format!("node {} has no GPU {idx}", self.node)));
                };
                if let Err(e) = f.exec.apply_plan(id, plan) {
                    f.reconfig_errors.push(format!("{id}: {e}"));
                    return Err(Status::failed_precondition(format!("{id}: {e}")));
                }
                f.pushed.push((id.clone(), plan.clone()));
            }
            f.epochs.insert(self.node.clone(), (req.epoch, targets));
            v1::ApplyStatus::Accepted
        };
        let epoch = f.epochs.get(&self.node).map_or(0, |e| e.0);
        Ok(Response::new(v1::ApplyLayoutResponse { status: status.into(), epoch }))
    }

    async fn get_state(&self, _request: Request<v1::GetStateRequest>) -> Result<Response<v1::NodeState>, Status> {
        Ok(Response::new(self.state()))
    }

    async fn advance_clock(
        &self,
        _request: Request<v1::AdvanceClockRequest>,
    ) -> Result<Response<v1::AdvanceClockResponse>, Status> {
        // Replay moves the shared executor itself, with the arrivals; the coordinator's clock only follows.
        let now_ms = lock(&self.fleet).exec.now_ms().round() as u64;
        Ok(Response::new(v1::AdvanceClockResponse { now_ms }))
    }

    async fn arrive(&self, _request: Request<v1::ArriveRequest>) -> Result<Response<v1::ArriveResponse>, Status> {
        Err(Status::unimplemented("replay feeds its trace's requests to the simulated fleet itself"))
    }
}

fn status_err(what: &str, s: Status) -> ReplayError {
    ReplayError::Usage(format!("--mode cluster: {what}: {} ({:?})", s.message(), s.code()))
}

async fn connect(endpoint: &str) -> Result<Channel, ReplayError> {
    let url = if endpoint.starts_with("http") { endpoint.to_string() } else { format!("http://{endpoint}") };
    tonic::transport::Endpoint::from_shared(url)
        .map_err(|e| ReplayError::Usage(format!("--coordinator {endpoint}: {e}")))?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(600))
        .connect()
        .await
        .map_err(|e| ReplayError::Usage(format!("--coordinator {endpoint}: cannot connect: {e}")))
}

/// Runs `scenario` through the coordinator at `endpoint` (see the module documentation). `policy` labels the run
/// (the coordinator's own policy plans).
pub async fn run_cluster(
    scenario: &Scenario,
    arrivals: &dyn Arrivals,
    truth: &RateTable,
    endpoint: &str,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PolicyRun, ReplayError> {
    let started = Instant::now();
    // Any node serves every call (followers forward): the first endpoint of a list is enough.
    let endpoint = endpoint.split(',').next().unwrap_or_default().trim();
    let channel = connect(endpoint).await?;
    let mut api = CoordinatorApiClient::new(channel.clone());
    let mut agents_api = CoordinatorClient::new(channel);
    api.cluster_status(v1::ClusterStatusRequest {}).await.map_err(|s| status_err("cluster status", s))?;
    let nodes = api.list_nodes(v1::ListRequest { stale: false }).await.map_err(|s| status_err("list nodes", s))?;
    if !nodes.get_ref().nodes.is_empty() {
        return Err(ReplayError::Usage(format!(
            "--mode cluster: the coordinator already has {} node(s); replay brings its own simulated fleet and \
             needs a fresh cluster (`coordinator dev-cluster`)",
            nodes.get_ref().nodes.len()
        )));
    }

    // The coordinator's policy is not known here; its tenants are served by the default dispatch rule.
    let exec = executor_for(scenario, Dispatch::EarliestFinish)?;
    let gpu_ids: Vec<(GpuIndex, GpuId)> = exec.gpu_ids().map(|(i, g)| (i, g.clone())).collect();
    let fleet: Shared = Arc::new(Mutex::new(Fleet {
        exec,
        epochs: BTreeMap::new(),
        pushed: Vec::new(),
        reconfig_errors: Vec::new(),
        slot_rates: Vec::new(),
    }));
    let mut by_node: BTreeMap<NodeId, Vec<(u32, GpuId, GpuIndex, GpuModel)>> = BTreeMap::new();
    for (gi, id) in &gpu_ids {
        by_node.entry(id.node.clone()).or_default().push((id.index, id.clone(), *gi, scenario.gpus[id]));
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut facades = Vec::new();
    for (k, (node, gpus)) in by_node.into_iter().enumerate() {
        let facade = NodeFacade { node, gpus, fleet: Arc::clone(&fleet), reports_tenants: k == 0 };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| ReplayError::Sim(format!("cannot listen for a simulated node: {e}")))?;
        let addr = listener.local_addr().map_err(|e| ReplayError::Sim(e.to_string()))?.to_string();
        let server = v1::agent_server::AgentServer::new(facade.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            let _ = tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
        });
        agents_api.register(facade.register_request(&addr)).await.map_err(|s| status_err("register a node", s))?;
        facades.push(facade);
    }
    for t in &scenario.tenants {
        let req = v1::TenantRequest { spec: Some(t.into()) };
        match api.create_tenant(req.clone()).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::AlreadyExists => {
                api.update_tenant(req).await.map_err(|s| status_err(&format!("update tenant {}", t.id), s))?;
            }
            Err(s) => return Err(status_err(&format!("create tenant {}", t.id), s)),
        }
    }

    let window_ms = scenario.window_s * 1000.0;
    let windows = (scenario.duration_ms / window_ms).ceil() as usize;
    let mut src = arrivals.open()?;
    let mut buf: Vec<Arrival> = Vec::new();
    let mut rows = Vec::with_capacity(windows);
    let mut plan_ms = Vec::with_capacity(windows);
    let mut infeasible = 0;
    let mut gpu_ms = 0.0;
    let mut prev = Totals::read(&lock(&fleet).exec, &gpu_ids);
    let slot_ms = scenario.planner.slot_s * 1000.0;
    let slots_per_window = (window_ms / slot_ms).round() as usize;
    // Slots whose rates the cluster has been sent; burst replans in the window.
    let mut reported = 0;
    let mut replans = 0u64;
    // The executor numbers tenants in id order; the rate table follows the scenario's order.
    let order: Vec<usize> = {
        let f = lock(&fleet);
        f.exec
            .tenant_ids()
            .map(|(_, id)| scenario.tenants.iter().position(|t| &t.id == id).expect("a scenario tenant"))
            .collect()
    };
    for w in 0..windows {
        let t0 = w as f64 * window_ms;
        let t1 = ((w + 1) as f64 * window_ms).min(scenario.duration_ms);
        // What the nodes measured since their last report, as in-process replay's forecasters see it: before the
        // first window, each tenant's first-window rate (the rate it declares when onboarded); then the rates of
        // the slots not sent yet (the window that ended, or with burst replans only its last slot).
        let first_slot = w * slots_per_window;
        lock(&fleet).slot_rates = order
            .iter()
            .map(|&i| {
                if w == 0 {
                    vec![truth.mean(i, 0, slots_per_window)]
                } else {
                    (reported..first_slot)
                        .filter(|s| (*s as f64) * slot_ms < t0)
                        .map(|s| truth.rates[i].get(s).copied().unwrap_or(0.0))
                        .collect()
                }
            })
            .collect();
        reported = first_slot;
        let round = Instant::now();
        // The cluster plans by itself when the clock crosses one of its windows; otherwise (or when that round was
        // infeasible) replay asks for the round. A linearizable read tells which: the last committed plan's time.
        let last = report_and_advance(&facades, &mut agents_api, &mut api, t0.round() as u64).await?;
        if last.epoch == 0 || last.made_at_ms != t0.round() as u64 {
            let r = api.trigger_plan(v1::TriggerPlanRequest {}).await.map_err(|s| status_err("plan", s))?;
            if r.get_ref().outcome == "infeasible" {
                infeasible += 1;
            }
        }
        let round_ms = round.elapsed().as_secs_f64() * 1000.0;
        plan_ms.push(round_ms);

        let mut round_ms = round_ms;
        let (mut later, active, layouts) = {
            let mut f = lock(&fleet);
            let later = pushed_within(&mut f, w, t0, t1)?;
            let active = gpu_ids.iter().filter(|(i, _)| !f.exec.gpu_layout(*i).is_empty()).count() as u32;
            let layouts: Vec<String> = gpu_ids
                .iter()
                .take(LAYOUT_GPUS)
                .map(|(i, id)| f.exec.gpu_layout(*i).display_for(scenario.gpus[id]))
                .collect();
            (later, active, layouts)
        };
        if scenario.replan_on_burst {
            // A slot at a time: each slot's rate goes to the cluster as it ends, and its leader plans again at once
            // when the rate leaves the last plan's band (it must run with --replan-on-burst too).
            for slot in (first_slot..first_slot + slots_per_window).filter(|s| (*s as f64) * slot_ms < t1) {
                let until = ((slot + 1) as f64 * slot_ms).min(t1);
                let due = later.partition_point(|(at, _, _)| *at < until);
                let now: Vec<_> = later.drain(..due).collect();
                {
                    let mut f = lock(&fleet);
                    feed_window(&mut f.exec, src.as_mut(), &mut buf, &now, until)?;
                    if until >= t1 {
                        // The window's last slot goes with the next window's report.
                        break;
                    }
                    f.slot_rates =
                        order.iter().map(|&i| vec![truth.rates[i].get(slot).copied().unwrap_or(0.0)]).collect();
                }
                reported = slot + 1;
                let round = Instant::now();
                let last = report_and_advance(&facades, &mut agents_api, &mut api, until.round() as u64).await?;
                if last.made_at_ms == until.round() as u64 {
                    let ms = round.elapsed().as_secs_f64() * 1000.0;
                    plan_ms.push(ms);
                    round_ms += ms;
                    replans += 1;
                    later = pushed_within(&mut lock(&fleet), w, until, t1)?;
                }
            }
        } else {
            feed_window(&mut lock(&fleet).exec, src.as_mut(), &mut buf, &later, t1)?;
        }
        gpu_ms += f64::from(active) * (t1 - t0);
        let now = Totals::read(&lock(&fleet).exec, &gpu_ids);
        let d = now.since(&prev);
        rows.push(WindowRow::new(t0, &d, active, round_ms, layouts));
        prev = now;
        progress(w + 1, windows);
    }
    let _ = stop_tx.send(true);
    let end = Totals::read(&lock(&fleet).exec, &gpu_ids);
    let mut run = PolicyRun::finish("cluster", &end, gpu_ms, infeasible, &plan_ms, started, rows);
    run.burst_replans = replans;
    Ok(run)
}

/// Every simulated node reports (a heartbeat: layouts, accuracy, the slot rates queued for it), then the cluster's
/// workload clock moves to `to_ms`; returns the last committed plan, read linearizably (its time tells whether the
/// move planned).
async fn report_and_advance(
    facades: &[NodeFacade],
    agents_api: &mut CoordinatorClient<Channel>,
    api: &mut CoordinatorApiClient<Channel>,
    to_ms: u64,
) -> Result<v1::PlanResponse, ReplayError> {
    for f in facades {
        agents_api
            .heartbeat(v1::HeartbeatRequest { state: Some(f.state()) })
            .await
            .map_err(|s| status_err("heartbeat", s))?;
    }
    api.advance_clock(v1::AdvanceClockRequest { to_ms })
        .await
        .map_err(|s| status_err("advance the clock (is the cluster on --clock virtual?)", s))?;
    let last = api.get_plan(v1::ListRequest { stale: false }).await.map_err(|s| status_err("plan", s))?;
    Ok(last.into_inner())
}

/// The targets pushed since the last call, as the changes they schedule inside `(t0, t1)`; a target a node could
/// not apply is an error.
fn pushed_within(f: &mut Fleet, w: usize, t0: f64, t1: f64) -> Result<Vec<(f64, GpuId, GpuPlan)>, ReplayError> {
    if let Some(e) = f.reconfig_errors.first() {
        return Err(ReplayError::Sim(format!("window {w}: a pushed target did not apply: {e}")));
    }
    let pushed = std::mem::take(&mut f.pushed);
    Ok(upcoming_within(pushed.iter().map(|(g, p)| (g, p)), t0, t1))
}
