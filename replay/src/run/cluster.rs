//! `--mode cluster`: the same scenario through a running coordinator cluster over gRPC.
//!
//! Replay hosts the simulated nodes itself, each a real agent: `tessera-agent`'s gRPC `Agent` service and
//! `Reconciler` (epoch rules, target validation, state file, status reports) over its GPUs in one shared
//! [`Executor`] (the simulator's workload model: queues, batching, latency, retraining, accuracy drift;
//! `tessera_sim::shared_node`). So the requests of the trace run on simulated GPUs exactly as in-process, but every
//! layout comes from the coordinator: the nodes register and heartbeat (the agent's own reports: observed layouts
//! and work, arrival counters, accuracy, retraining progress), the coordinator's leader plans with its own policy
//! and forecasts, commits the plan through Raft and pushes epoch-numbered targets to the nodes' agent services; each
//! node's reconcile pass hands the targets it accepted to the executor, which carries them out in virtual time.
//!
//! Window by window, in virtual workload time: run every node's reconcile pass and heartbeat its status (the
//! reports are replicated before the call returns), move the cluster's clock to the window start
//! (`AdvanceClock`; the coordinator plans when a window boundary passes, and replay asks for a round with
//! `TriggerPlan` when it did not), run the passes again (the targets pushed in the round reach the executor), then
//! feed the window's arrivals to the executor and advance it, applying the taken targets' scheduled changes at
//! their times. Replay runs the passes itself, as an agent's reconcile loop does when woken, so that each target
//! reaches the executor at the virtual time it was planned for.
//!
//! The nodes report what a real agent measures, and the coordinator plans from the replicated state only: observed
//! layouts and work (instances by placement, the executor's order), each tenant's accuracy, whether a retraining is
//! due and its progress, and the measured arrival rate of every planner slot (before the first window, each
//! tenant's first-window rate, the rate it declares when onboarded). With the same `--plan-every`, `--slot`,
//! `--horizon`, `--target-utilization` and `--forecaster` on both sides, the leader's `PlannerInput` is the one
//! in-process replay builds, so both modes give the same numbers for the same seed (a test checks it). With
//! `--tlb`, in-process planners also get the TLB model's interference table; give the coordinator the same one
//! (`sim-agent interference --models <the tenants' models> --mode <the TLB> --seed <the seed>`, then
//! `coordinator dev-cluster --interference FILE`), or run replay with `--tlb-blind` to match a coordinator without. The
//! coordinator must run with `--clock virtual` (as `coordinator dev-cluster` starts it) and start with no nodes of
//! its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_core::ids::{GpuId, NodeId};
use tessera_core::plan::GpuPlan;
use tessera_planner::settings::RoundSettings;
use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tessera_proto::v1::coordinator_client::CoordinatorClient;
use tessera_sim::agent::coordinator::gpu_descriptors;
use tessera_sim::agent::reconcile::Reconciler;
use tessera_sim::agent::service::{AgentService, node_state_to_wire};
use tessera_sim::executor::{Arrival, Dispatch, GpuIndex};
use tessera_sim::shared_node::{ExecutorNode, NodeGpu, SharedFleet, lock};
use tonic::Status;
use tonic::transport::Channel;

use super::arrivals::Arrivals;
use super::driver::{
    PolicyRun, RateTable, Totals, WindowRow, executor_for, feed_window, gpu_snapshot, reconfigured_in, upcoming_within,
};
use super::{ReplayError, Scenario};

type Shared = Arc<Mutex<SharedFleet>>;

/// One simulated node: a real agent over its GPUs in the shared executor.
struct SimulatedNode {
    reconciler: Arc<Reconciler>,
}

impl SimulatedNode {
    /// One reconcile pass (the targets accepted since the last one reach the executor); a GPU whose target the
    /// executor refused is an error.
    fn pass(&self) -> Result<(), ReplayError> {
        let report = self.reconciler.reconcile().map_err(|e| ReplayError::Sim(format!("{}: {e}", self.node())))?;
        match report.errors.first() {
            None => Ok(()),
            Some((gpu, e)) => {
                Err(ReplayError::Sim(format!("{}: GPU {gpu}: a pushed target did not apply: {e}", self.node())))
            }
        }
    }

    /// The agent's status report.
    fn state(&self) -> v1::NodeState {
        node_state_to_wire(&self.reconciler.status(), self.node().as_str())
    }

    fn node(&self) -> &NodeId {
        self.reconciler.node()
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

/// The policy and the round settings the coordinator at `endpoint` plans with (`ClusterStatus`), which a run through
/// it adopts.
pub async fn cluster_settings(endpoint: &str) -> Result<(String, RoundSettings), ReplayError> {
    let endpoint = endpoint.split(',').next().unwrap_or_default().trim();
    let mut api = CoordinatorApiClient::new(connect(endpoint).await?);
    let status = api
        .cluster_status(v1::ClusterStatusRequest {})
        .await
        .map_err(|s| status_err("cluster status", s))?
        .into_inner();
    let round = serde_json::from_str(&status.round_settings_json).map_err(|e| {
        ReplayError::Usage(format!(
            "--mode cluster: the coordinator's round settings do not read ({e}); is it an older version?"
        ))
    })?;
    Ok((status.policy, round))
}

/// Where replay's simulated nodes listen, and the host the coordinator reaches them at.
pub struct NodeAddresses {
    /// The IP address every node listens on (each on a free port).
    pub listen: std::net::IpAddr,
    /// The host name or address nodes register with (`HOST:PORT`, with each node's port); `None`: the listen
    /// address.
    pub advertise: Option<String>,
}

/// Runs `scenario` through the coordinator at `endpoint` (see the module documentation). `policy` labels the run
/// (the coordinator's own policy plans).
pub async fn run_cluster(
    scenario: &Scenario,
    arrivals: &dyn Arrivals,
    truth: &RateTable,
    endpoint: &str,
    addresses: &NodeAddresses,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<PolicyRun, ReplayError> {
    let started = Instant::now();
    // Any node serves every call (followers forward): the first endpoint of a list is enough.
    let endpoint = endpoint.split(',').next().unwrap_or_default().trim();
    let channel = connect(endpoint).await?;
    let mut api = CoordinatorApiClient::new(channel.clone());
    let mut agents_api = CoordinatorClient::new(channel);
    // Reachability and the cluster's settings were checked by `cluster_settings` before the scenario was prepared.
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
    let fleet: Shared = SharedFleet::new(exec);
    let mut by_node: BTreeMap<NodeId, Vec<NodeGpu>> = BTreeMap::new();
    for (gi, id) in &gpu_ids {
        let gpu = NodeGpu { index: id.index, id: id.clone(), exec: *gi, model: scenario.gpus[id] };
        by_node.entry(id.node.clone()).or_default().push(gpu);
    }
    // Each agent keeps its accepted epoch and targets in a state file, as on a real node.
    let state_dir = tempfile::tempdir().map_err(|e| ReplayError::Sim(format!("cannot make a state directory: {e}")))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut nodes = Vec::new();
    for (k, (node, gpus)) in by_node.into_iter().enumerate() {
        let sim = Arc::new(ExecutorNode::new(node.clone(), gpus, Arc::clone(&fleet), k == 0));
        let reconciler = Reconciler::new(node.clone(), sim.clone(), sim, &state_dir.path().join(node.as_str()))
            .map_err(|e| ReplayError::Sim(format!("{node}: {e}")))?;
        let reconciler = Arc::new(reconciler);
        let listener = tokio::net::TcpListener::bind((addresses.listen, 0))
            .await
            .map_err(|e| ReplayError::Sim(format!("--node-listen {}: cannot listen: {e}", addresses.listen)))?;
        let port = listener.local_addr().map_err(|e| ReplayError::Sim(e.to_string()))?.port();
        let addr = match &addresses.advertise {
            Some(host) => format!("{host}:{port}"),
            None => std::net::SocketAddr::new(addresses.listen, port).to_string(),
        };
        // The agent's own service; its reconcile loop is replay, which runs each node's pass (below) where an
        // agent's loop would be woken.
        let server = AgentService::new(Arc::clone(&reconciler), Arc::new(tokio::sync::Notify::new())).into_server();
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
        let gpus =
            gpu_descriptors(reconciler.backend().as_ref()).map_err(|e| ReplayError::Sim(format!("{node}: {e}")))?;
        let req = v1::RegisterRequest {
            node_id: node.to_string(),
            address: addr,
            gpus: gpus.iter().map(Into::into).collect(),
        };
        agents_api.register(req).await.map_err(|s| status_err("register a node", s))?;
        nodes.push(SimulatedNode { reconciler });
    }
    for t in &scenario.tenants {
        let req = v1::TenantRequest { spec: Some(t.into()), ..Default::default() };
        match api.create_tenant(req.clone()).await {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::AlreadyExists => {
                api.update_tenant(req).await.map_err(|s| status_err(&format!("update tenant {}", t.id), s))?;
            }
            Err(s) => return Err(status_err(&format!("create tenant {}", t.id), s)),
        }
    }

    let window_ms = scenario.plan_every_s * 1000.0;
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
        let last = report_and_advance(&nodes, &mut agents_api, &mut api, t0.round() as u64).await?;
        if last.epoch == 0 || last.made_at_ms != t0.round() as u64 {
            let r = api.trigger_plan(v1::TriggerPlanRequest {}).await.map_err(|s| status_err("plan", s))?;
            if r.get_ref().outcome == "infeasible" {
                infeasible += 1;
            }
            // The round's targets were pushed before it answered: hand them to the executor now.
            settle(&nodes)?;
        }
        let round_ms = round.elapsed().as_secs_f64() * 1000.0;
        plan_ms.push(round_ms);

        let mut round_ms = round_ms;
        let (mut later, active, layouts) = {
            let mut f = lock(&fleet);
            let later = taken_within(&mut f, t0, t1);
            let active = gpu_ids.iter().filter(|(i, _)| !f.exec.gpu_layout(*i).is_empty()).count() as u32;
            let layouts = gpu_snapshot(&f.exec, &gpu_ids, &scenario.gpus);
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
                let last = report_and_advance(&nodes, &mut agents_api, &mut api, until.round() as u64).await?;
                if last.made_at_ms == until.round() as u64 {
                    let ms = round.elapsed().as_secs_f64() * 1000.0;
                    plan_ms.push(ms);
                    round_ms += ms;
                    replans += 1;
                    later = taken_within(&mut lock(&fleet), until, t1);
                }
            }
        } else {
            feed_window(&mut lock(&fleet).exec, src.as_mut(), &mut buf, &later, t1)?;
        }
        gpu_ms += f64::from(active) * (t1 - t0);
        let now = Totals::read(&lock(&fleet).exec, &gpu_ids);
        let d = now.since(&prev);
        let changed = reconfigured_in(&lock(&fleet).exec, &gpu_ids, t0, t1);
        rows.push(WindowRow::new(t0, &d, active, changed, round_ms, layouts));
        prev = now;
        progress(w + 1, windows);
    }
    let _ = stop_tx.send(true);
    let end = Totals::read(&lock(&fleet).exec, &gpu_ids);
    let mut run = PolicyRun::finish("cluster", &end, gpu_ms, infeasible, &plan_ms, started, rows);
    run.burst_replans = replans;
    Ok(run)
}

/// Every simulated node runs a reconcile pass and reports (a heartbeat: layouts, accuracy, the slot rates queued
/// for it), then the cluster's workload clock moves to `to_ms` and the nodes run their passes again (a round the
/// move started has pushed its targets by then); returns the last committed plan, read linearizably (its time tells
/// whether the move planned).
async fn report_and_advance(
    nodes: &[SimulatedNode],
    agents_api: &mut CoordinatorClient<Channel>,
    api: &mut CoordinatorApiClient<Channel>,
    to_ms: u64,
) -> Result<v1::PlanResponse, ReplayError> {
    for n in nodes {
        n.pass()?;
        agents_api
            .heartbeat(v1::HeartbeatRequest { state: Some(n.state()), revocations_index: 0 })
            .await
            .map_err(|s| status_err("heartbeat", s))?;
    }
    api.advance_clock(v1::AdvanceClockRequest { to_ms })
        .await
        .map_err(|s| status_err("advance the clock (is the cluster on --clock virtual?)", s))?;
    let last = api.get_plan(v1::ListRequest { stale: false }).await.map_err(|s| status_err("plan", s))?;
    settle(nodes)?;
    Ok(last.into_inner())
}

/// Every node runs a reconcile pass: the targets its agent accepted reach the executor now.
fn settle(nodes: &[SimulatedNode]) -> Result<(), ReplayError> {
    nodes.iter().try_for_each(SimulatedNode::pass)
}

/// The targets the nodes handed to the executor since the last call, as the changes they schedule inside
/// `(t0, t1)`.
fn taken_within(f: &mut SharedFleet, t0: f64, t1: f64) -> Vec<(f64, GpuId, GpuPlan)> {
    let taken = std::mem::take(&mut f.taken);
    upcoming_within(taken.iter().map(|(g, p)| (g, p)), t0, t1)
}
