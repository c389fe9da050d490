//! The whole control loop: a 3-process coordinator cluster, two simulated nodes (real agents with their own gRPC
//! endpoints, hosted in this test process) registering with a follower, a tenant added through the API that ends
//! up with an instance applied on a simulated GPU, and the planning decision arriving at a real OTLP receiver with
//! its child spans and attributes.

mod support;

use std::time::Duration;

use support::cluster::{Cluster, create, eventually, start_sim, tenant};
use support::otlp::{OtlpReceiver, ReceivedSpan, SpanKind, StatusCode, any_value::Value, children_of, named};
use tessera_coordinator::telemetry::LevelFilter;
use tessera_proto::v1;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_added_through_the_api_is_served_on_a_simulated_gpu_and_the_decision_is_traced() {
    let otlp = OtlpReceiver::start().await;
    let endpoint = otlp.endpoint();
    // The simulated agents run in this process: its global subscriber exports their spans (the only test of this
    // binary that installs one).
    let service = tessera_coordinator::telemetry::Service::new("tessera-sim-agent", "test").hosting("tessera.node");
    let telemetry = tessera_coordinator::telemetry::init(Some(&endpoint), &service, LevelFilter::INFO).unwrap();
    let c = Cluster::start(3, &["--otlp-endpoint", &endpoint, "--plan-every", "1s", "--metrics-listen", "127.0.0.1:0"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let follower = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();

    // Two simulated nodes with one A100 each, heartbeating to a follower.
    let sim = start_sim(&c.addr(follower), 2, 1, tessera_sim::node::ClockKind::Wall, "sim").await;
    eventually(T, "both simulated nodes to register", || async {
        let r = c.client(leader).list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        (r.nodes.len() == 2).then_some(())
    })
    .await;

    create(&c, follower, tenant("vision", "resnet50", 50.0)).await;

    // The leader plans within a window, pushes, the agent reconciles and reports what it applied.
    let (gpu, layout) = eventually(T, "an applied instance serving the tenant", || async {
        let r = c.client(follower).list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        r.nodes.iter().flat_map(|n| n.gpus.iter()).find_map(|g| {
            let serving =
                g.applied_assignments.iter().any(|a| a.tenant == "vision" && a.role == v1::Role::Inference as i32);
            (serving && g.applied_epoch > 0).then(|| (g.id.clone(), g.applied.clone()))
        })
    })
    .await;
    assert!(layout.is_some_and(|l| !l.placements.is_empty()));

    // Explain, history and the dumped PlannerInput answer through a follower.
    let ex = c.client(follower).explain(v1::GpuRequest { gpu: gpu.clone(), stale: false }).await.unwrap().into_inner();
    assert!(ex.epoch > 0 && !ex.explanation.is_empty(), "{ex:?}");
    let hist =
        c.client(follower).plan_history(v1::GpuRequest { gpu: gpu.clone(), stale: false }).await.unwrap().into_inner();
    assert!(!hist.entries.is_empty());
    let dump = c.client(follower).dump_planner_input(v1::ListRequest { stale: false }).await.unwrap().into_inner();
    let input: tessera_planner::input::PlannerInput = serde_json::from_str(&dump.json).unwrap();
    assert!(input.tenants.keys().any(|t| t.as_str() == "vision"));

    // The decision reached the OTLP receiver as one trace: a planning round; its gpu_solve children, timed by the
    // planner; a client span per push, carrying its context to the agent; the agent's server span; the reconcile
    // pass; each MIG step. Attributes are namespaced and typed.
    let pushed_trace = |spans: &[ReceivedSpan]| -> Option<(ReceivedSpan, ReceivedSpan, ReceivedSpan)> {
        named(spans, "planning_round").into_iter().find_map(|r| {
            let children = children_of(spans, r);
            let solved = children.iter().any(|c| {
                c.name == "gpu_solve"
                    && c.array("tessera.tenants").is_some_and(|t| t.contains(&Value::StringValue("vision".into())))
            });
            if !solved {
                return None;
            }
            let client = children.iter().find(|c| c.name == "tessera.v1.Agent/ApplyLayout")?;
            let server = children_of(spans, client).into_iter().find(|s| s.kind == SpanKind::Server)?;
            // Every pass of the push has ended once one converged (a pass that waited comes before it).
            let passes = children_of(spans, server);
            passes
                .iter()
                .find(|p| p.name == "reconcile" && p.string("tessera.reconcile.outcome") == Some("converged"))?;
            let pass = passes.into_iter().find(|p| {
                p.name == "reconcile" && children_of(spans, p).iter().any(|s| s.name == "mig.create_instance")
            })?;
            Some((r.clone(), (*client).clone(), pass.clone()))
        })
    };
    let spans = otlp.wait_for(T, |spans| pushed_trace(spans).is_some()).await;
    let (round, client, pass) = pushed_trace(&spans).unwrap();
    assert_eq!(round.string("tessera.round.outcome"), Some("planned"), "{}", round.summary());
    for key in ["tessera.plan.epoch", "tessera.gpu.count", "tessera.tenant.count", "tessera.push.ok"] {
        assert!(round.int(key).is_some(), "planning_round lacks integer {key}: {}", round.summary());
    }
    for key in ["tessera.plan.objective", "tessera.plan.bound", "tessera.plan.gap", "tessera.plan.solve_ms"] {
        assert!(round.double(key).is_some(), "planning_round lacks double {key}: {}", round.summary());
    }
    assert_eq!((round.kind, round.status.0), (SpanKind::Internal, StatusCode::Ok), "{}", round.summary());
    assert_eq!(round.service_name, "tessera-coordinator");
    assert_eq!(round.service_version, env!("CARGO_PKG_VERSION"));
    assert!(["1", "2", "3"].contains(&round.service_instance.as_str()), "{}", round.summary());

    let children = children_of(&spans, &round);
    let solve = children.iter().find(|c| c.name == "gpu_solve" && c.string("tessera.gpu") == Some(&gpu)).unwrap();
    assert_eq!(solve.array("tessera.tenants"), Some(vec![Value::StringValue("vision".into())]), "{}", solve.summary());
    assert!(matches!(solve.array("tessera.forecast.mean_rps").as_deref(), Some([Value::DoubleValue(_)])));
    for key in ["tessera.tenant.count", "tessera.candidate_profiles"] {
        assert!(solve.int(key).is_some(), "gpu_solve lacks integer {key}: {}", solve.summary());
    }
    for key in ["tessera.plan.objective", "tessera.plan.bound"] {
        assert!(solve.double(key).is_some(), "gpu_solve lacks double {key}: {}", solve.summary());
    }
    // The first round has no plan to keep: solved, and no reason to solve again is given.
    assert_eq!(solve.bool("tessera.plan.kept"), Some(false), "{}", solve.summary());
    assert_eq!(solve.string("tessera.replan.reason"), None, "{}", solve.summary());
    for key in ["tessera.layout.chosen", "tessera.solver.status", "tessera.gpu.model", "tessera.explanation"] {
        assert!(solve.string(key).is_some(), "gpu_solve lacks {key}: {}", solve.summary());
    }
    // The solve is timed where it ran: inside the round, and no longer than the round's measured solve.
    assert!(solve.start_ns >= round.start_ns && solve.end_ns <= round.end_ns, "{}", solve.summary());
    let solve_ms = round.double("tessera.plan.solve_ms").unwrap();
    assert!(solve.duration_s() * 1000.0 <= solve_ms + 1.0, "{} > {solve_ms} ms", solve.duration_s() * 1000.0);

    assert_eq!((client.kind, client.status.0), (SpanKind::Client, StatusCode::Ok), "{}", client.summary());
    assert_eq!(client.string("rpc.system"), Some("grpc"));
    assert_eq!(client.string("tessera.push.result"), Some("ok"), "{}", client.summary());
    // OpenTelemetry's split: the host in `server.address`, the port an integer in `server.port`.
    assert!(client.string("server.address").is_some_and(|h| !h.contains(':')), "{}", client.summary());
    assert!(client.int("server.port").is_some_and(|p| p > 0), "{}", client.summary());
    assert!(client.int("tessera.plan.epoch").is_some_and(|e| e > 0), "{}", client.summary());
    assert!(matches!(client.array("tessera.gpus").as_deref(), Some([Value::IntValue(_), ..])), "{}", client.summary());
    let server = children_of(&spans, &client).into_iter().find(|s| s.kind == SpanKind::Server).unwrap();
    assert_eq!(server.name, "tessera.v1.Agent/ApplyLayout");
    assert_eq!(server.service_name, "tessera-sim-agent", "{}", server.summary());
    // Each simulated node reports as its own instance, though both live in this process.
    let node = gpu.split_once('/').unwrap().0;
    assert_eq!(server.service_instance, node, "{}", server.summary());
    assert_eq!(server.string("tessera.apply.result"), Some("accepted"), "{}", server.summary());
    assert_eq!(server.int("tessera.plan.epoch"), client.int("tessera.plan.epoch"));
    assert_eq!(pass.int("tessera.plan.epoch"), client.int("tessera.plan.epoch"), "{}", pass.summary());
    assert!(pass.int("tessera.reconfiguration.steps").is_some_and(|n| n > 0), "{}", pass.summary());
    // The push's step count is what the agent did for it: over the push's passes, the steps each pass says it
    // completed, and the MIG step spans that arrived.
    let mut passes: Vec<&ReceivedSpan> =
        children_of(&spans, server).into_iter().filter(|p| p.name == "reconcile").collect();
    passes.sort_by_key(|p| p.start_ns);
    let done: i64 = passes.iter().map(|p| p.int("tessera.reconfiguration.steps").unwrap_or(0)).sum();
    let step_spans = passes
        .iter()
        .flat_map(|p| children_of(&spans, p))
        .filter(|s| s.name.starts_with("mig.") && s.status.0 == StatusCode::Ok)
        .inspect(|s| assert_eq!(s.service_instance, node, "{}", s.summary()))
        .count();
    let described: Vec<String> = passes.iter().map(|p| p.summary()).collect();
    assert_eq!(client.int("tessera.reconfiguration.steps"), Some(done), "{}\n{described:#?}", client.summary());
    assert_eq!(done, step_spans as i64, "{described:#?}");
    assert_eq!(passes.last().and_then(|p| p.string("tessera.reconcile.outcome")), Some("converged"), "{described:#?}");
    let step = children_of(&spans, &pass).into_iter().find(|s| s.name == "mig.create_instance").unwrap();
    assert!(step.string("tessera.mig.profile").is_some_and(|p| !p.is_empty()), "{}", step.summary());
    assert!(step.int("tessera.mig.placement.start").is_some_and(|s| s >= 0), "{}", step.summary());
    assert!(step.int("tessera.mig.instance_id").is_some(), "{}", step.summary());
    assert_eq!(step.status.0, StatusCode::Ok, "{}", step.summary());
    assert!(step.start_ns >= pass.start_ns && step.end_ns <= pass.end_ns, "{}", step.summary());

    // The leader's Prometheus endpoint counts the rounds and pushes.
    let body = http_get(&c.metrics_addr(leader).unwrap(), "/metrics").await;
    for name in [
        "tessera_coordinator_raft_term",
        "tessera_coordinator_raft_commit_index",
        "tessera_coordinator_plan_rounds_total",
        "tessera_coordinator_plan_round_seconds",
        "tessera_coordinator_pushes_total",
    ] {
        assert!(body.contains(name), "/metrics lacks {name}:\n{body}");
    }
    assert!(body.contains("tessera_coordinator_raft_is_leader 1"), "{body}");
    // Per GPU, from the replicated state; the push-to-report time of the reconfiguration; the round's gap.
    let metrics_addr = c.metrics_addr(leader).unwrap();
    let body = eventually(T, "the GPU's applied epoch and a reconfiguration time on /metrics", || async {
        let body = http_get(&metrics_addr, "/metrics").await;
        let applied = body.lines().any(|l| {
            l.starts_with(&format!("tessera_coordinator_gpu_applied_epoch{{gpu=\"{gpu}\",model=\"A100-40GB\"}} "))
                && !l.ends_with(" 0")
        });
        let timed = body
            .lines()
            .any(|l| l.starts_with("tessera_coordinator_reconfiguration_seconds_count ") && !l.ends_with(" 0"));
        (applied && timed).then_some(body)
    })
    .await;
    assert!(
        body.contains("tessera_coordinator_gpu_instances{") && body.contains("tessera_coordinator_plan_gap "),
        "{body}"
    );
    let (head, text) = body.split_once("\r\n\r\n").unwrap();
    assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
    if let Some(r) = tessera_metrics::promtool_check(text) {
        r.unwrap();
    }

    sim.stop().await;
    drop(telemetry);
}

async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn virtual_time_moves_the_agents_and_plans_at_window_boundaries_and_a_new_leader_resumes() {
    let mut c = Cluster::start(3, &["--clock", "virtual", "--plan-every", "60s"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    // The node knows the whole cluster: when the node it talks to dies, it moves on to the next.
    let sim = start_sim(&c.endpoints(), 1, 2, tessera_sim::node::ClockKind::Virtual, "v").await;
    let agent_addr = sim.addr(0);
    let mut agent = v1::agent_client::AgentClient::connect(format!("http://{agent_addr}")).await.unwrap();
    eventually(T, "the node to register", || async {
        let r = c.client(leader).list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        (r.nodes.len() == 1).then_some(())
    })
    .await;
    create(&c, leader, tenant("clocked", "resnet50", 30.0)).await;

    // Within the first window: the clock moves, the agent follows, nothing is planned yet.
    let follower = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    let r = c.client(follower).advance_clock(v1::AdvanceClockRequest { to_ms: 30_000 }).await.unwrap().into_inner();
    assert_eq!(r.now_ms, 30_000);
    let st = agent.get_state(v1::GetStateRequest {}).await.unwrap().into_inner();
    assert_eq!(st.metrics.unwrap().now_ms, 30_000);
    assert_eq!(c.status(follower).await.unwrap().plan_epoch, 0);
    // Crossing the 60 s boundary plans (the call answers after the plan is committed and pushed).
    c.client(follower).advance_clock(v1::AdvanceClockRequest { to_ms: 61_000 }).await.unwrap();
    let epoch = c.status(leader).await.unwrap().plan_epoch;
    assert_eq!(epoch, 1);
    let plan = c.client(follower).get_plan(v1::ListRequest { stale: false }).await.unwrap().into_inner();
    assert_eq!(plan.made_at_ms, 61_000);
    // An earlier time is ignored.
    let r = c.client(leader).advance_clock(v1::AdvanceClockRequest { to_ms: 10 }).await.unwrap().into_inner();
    assert_eq!(r.now_ms, 61_000);

    // The leader dies; the new one knows the time and the committed plan and plans the next epoch.
    c.kill(leader);
    let survivors: Vec<u64> = [1, 2, 3].into_iter().filter(|i| *i != leader).collect();
    let new_leader = c.wait_leader(&survivors, T).await;
    let st = c.status(new_leader).await.unwrap();
    assert_eq!((st.workload_time_ms, st.plan_epoch), (61_000, 1));
    let r = c.client(new_leader).advance_clock(v1::AdvanceClockRequest { to_ms: 121_000 }).await;
    r.unwrap();
    assert_eq!(c.status(new_leader).await.unwrap().plan_epoch, 2);
    let desired = eventually(T, "the agent to hold epoch 2", || async {
        let st = agent.clone().get_state(v1::GetStateRequest {}).await.ok()?.into_inner();
        (st.epoch == 2).then_some(st.epoch)
    })
    .await;
    assert_eq!(desired, 2);
    // Its heartbeats reach a live coordinator, which records that it applied epoch 2.
    eventually(T, "the new leader to record epoch 2 as applied", || async {
        let r = c.client(new_leader).list_nodes(v1::ListRequest { stale: false }).await.ok()?.into_inner();
        r.nodes.iter().flat_map(|n| &n.gpus).all(|g| g.applied_epoch == 2).then_some(())
    })
    .await;

    sim.stop().await;
}

/// The failure detector end to end: two simulated nodes, a tenant served on one; that node stops (its gRPC server
/// and heartbeats end, as when its process dies); the leader marks it suspect, then failed, replans at once and the
/// tenant is served on the other node. The dead node's replacement, under the same node id with fresh hardware,
/// heartbeats again, is healthy again and converges to the target it is pushed (its GPU emptied).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_node_is_failed_and_its_tenants_are_served_elsewhere_and_it_rejoins_clean() {
    // No window round during the test (10 min): only the failure detector replans.
    let c = Cluster::start(3, &["--plan-every", "600s", "--suspect-after", "1s", "--fail-after", "3s"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let a = start_sim(&c.endpoints(), 1, 1, tessera_sim::node::ClockKind::Wall, "a").await;
    let b = start_sim(&c.endpoints(), 1, 1, tessera_sim::node::ClockKind::Wall, "b").await;
    let nodes = || async {
        c.client(leader).list_nodes(v1::ListRequest { stale: false }).await.ok().map(|r| r.into_inner().nodes)
    };
    eventually(T, "both nodes to register", || async { nodes().await.filter(|n| n.len() == 2).map(|_| ()) }).await;
    create(&c, leader, tenant("vision", "resnet50", 50.0)).await;
    c.client(leader).trigger_plan(v1::TriggerPlanRequest {}).await.unwrap();
    // The first healthy node whose agent reports an instance serving the tenant (a failed node's last report
    // stays recorded as it was).
    let serving = |nodes: &[v1::NodeInfo]| {
        nodes
            .iter()
            .filter(|n| n.health == "healthy")
            .find(|n| {
                n.gpus.iter().any(|g| {
                    g.applied_epoch > 0
                        && g.applied_assignments
                            .iter()
                            .any(|x| x.tenant == "vision" && x.role == v1::Role::Inference as i32)
                })
            })
            .map(|n| n.id.clone())
    };
    let first = eventually(T, "the tenant to be served", || async { serving(&nodes().await?) }).await;
    assert!(nodes().await.unwrap().iter().all(|n| n.health == "healthy"));

    // The serving node dies.
    let (dead, survivor) = if first == "a-0" { (a, b) } else { (b, a) };
    let survivor_id = if first == "a-0" { "b-0" } else { "a-0" };
    let prefix = first.trim_end_matches("-0").to_string();
    let died = std::time::Instant::now();
    dead.stop().await;
    let suspect = eventually(T, "the dead node to be suspect", || async {
        let n = nodes().await?;
        n.iter().find(|n| n.id == first && n.health != "healthy").map(|_| died.elapsed())
    })
    .await;
    let (failed, reason) = eventually(T, "the dead node to be failed", || async {
        let n = nodes().await?;
        n.iter().find(|n| n.id == first && n.health == "failed").map(|n| (died.elapsed(), n.health_reason.clone()))
    })
    .await;
    assert!(reason.contains("no heartbeat"), "{reason}");
    // `node list` shows the dead node's GPU as the planner sees it (failed), in the table and in --json; the GPU's
    // own health stays apart.
    let list = |json: bool| {
        let mut cmd = std::process::Command::new(support::cluster::binary());
        cmd.args(["node", "list", "--endpoints", &c.endpoints()]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let table = list(false);
    let gpu_line = table.lines().find(|l| l.trim_start().starts_with(&format!("{first}/"))).unwrap_or_default();
    assert!(gpu_line.contains("failed (node)"), "{table}");
    let js: serde_json::Value = serde_json::from_str(&list(true)).unwrap();
    let dead = js.as_array().unwrap().iter().find(|n| n["id"] == first.as_str()).unwrap();
    assert_eq!(dead["gpus"][0]["health"], "failed (node)", "{dead}");
    assert_eq!(dead["gpus"][0]["gpu_health"], "healthy", "{dead}");
    let moved = eventually(T, "the tenant to be served on the surviving node", || async {
        (serving(&nodes().await?)? == survivor_id).then(|| died.elapsed())
    })
    .await;
    println!("node death: suspect after {suspect:?}, failed after {failed:?}, tenant served elsewhere after {moved:?}");
    // The failed node's GPU target is empty, and nothing else plans on it.
    let n = nodes().await.unwrap();
    let dead_gpu = &n.iter().find(|n| n.id == first).unwrap().gpus[0];
    assert!(dead_gpu.target.as_ref().is_none_or(|t| t.layout.as_ref().is_none_or(|l| l.placements.is_empty())));

    // A replacement under the same node id comes back: healthy again, and its layout is reconciled to its target.
    let back = start_sim(&c.endpoints(), 1, 1, tessera_sim::node::ClockKind::Wall, &prefix).await;
    eventually(T, "the node to be healthy and converged again", || async {
        let n = nodes().await?;
        let node = n.iter().find(|n| n.id == first)?;
        let g = &node.gpus[0];
        (node.health == "healthy" && g.applied_epoch == g.target_epoch).then_some(())
    })
    .await;
    assert_eq!(serving(&nodes().await.unwrap()).as_deref(), Some(survivor_id));
    back.stop().await;
    survivor.stop().await;
}
