//! Routes: a 3-member cluster, a simulated node that runs its tenants' jobs as real processes, and a tenant whose
//! `serve` job is a real HTTP server (Python's `http.server`). The leader serves the job's endpoint as the tenant's
//! route once it is ready (`GetRoutes`, `WatchRoutes`), a follower names the leader, and the router following the
//! cluster sends the tenant's requests to that server.

mod support;

use std::time::Duration;

use support::cluster::{Cluster, create, eventually, start_sim_jobs, tenant};
use tessera_proto::v1;

const T: Duration = Duration::from_secs(60);
const TENANT: &str = "routes-web";

fn job_pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return vec![] };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == format!("TESSERA_TENANT={TENANT}").as_bytes()))
        })
        .collect()
}

fn kill_jobs() {
    for pid in job_pids() {
        let _ = std::process::Command::new("kill").args(["-KILL", &pid.to_string()]).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ready_job_is_the_tenants_route_and_the_router_sends_requests_there() {
    kill_jobs();
    let c = Cluster::start(3, &["--plan-every", "1s"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    let follower = [1, 2, 3].into_iter().find(|i| *i != leader).unwrap();
    let sim = start_sim_jobs(&c.addr(leader), 1, 1, "web").await;

    let mut spec = tenant(TENANT, "resnet50", 20.0);
    let serve = v1::JobSpec {
        argv: ["python3", "-m", "http.server", "{port}", "--bind", "127.0.0.1"].map(String::from).to_vec(),
        ready_tcp: true,
        grace_ms: 5_000,
        ..Default::default()
    };
    spec.jobs = Some(v1::TenantJobs { tenant: TENANT.into(), serve: Some(serve), retrain: None });
    create(&c, follower, spec).await;
    // Stored with the tenant: every member answers with the jobs.
    let got = c.client(follower).get_tenant(v1::TenantIdRequest { id: TENANT.into(), if_revision: 0 }).await.unwrap();
    let jobs = got.into_inner().spec.unwrap().jobs.unwrap();
    assert_eq!(jobs.serve.unwrap().argv[0], "python3");

    // Planned, pushed with its jobs, started on the instance, ready: the leader's routes name it.
    let endpoint = eventually(T, "a ready endpoint of the tenant", || async {
        let r = c.client(leader).get_routes(v1::RoutesRequest { tenant: TENANT.into() }).await.ok()?.into_inner();
        r.tenants.first()?.endpoints.iter().find(|e| e.state == "ready").cloned()
    })
    .await;
    assert!(endpoint.mig_uuid.starts_with("MIG-"), "{endpoint:?}");
    assert_eq!(endpoint.node, "web-0");
    // The process runs on that instance, as CUDA would see it.
    let pids = job_pids();
    assert_eq!(pids.len(), 1, "one server for the tenant");
    let env = std::fs::read(format!("/proc/{}/environ", pids[0])).unwrap();
    let visible = format!("CUDA_VISIBLE_DEVICES={}", endpoint.mig_uuid);
    assert!(env.split(|b| *b == 0).any(|v| v == visible.as_bytes()));

    // A follower does not hear the agents: it names the leader.
    let e = c.client(follower).get_routes(v1::RoutesRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable);
    assert_eq!(e.metadata().get("tessera-leader").and_then(|v| v.to_str().ok()), Some(c.addr(leader).as_str()));
    let e = c.client(leader).get_routes(v1::RoutesRequest { tenant: "bad id".into() }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);

    // The stream starts with the routes now.
    let mut stream = c.client(leader).watch_routes(v1::RoutesRequest::default()).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert!(first.tenants.iter().any(|t| t.tenant == TENANT), "{first:?}");

    // The router, given every member (a follower first), finds the leader and serves the tenant through it.
    let (tx, rx) = tokio::sync::watch::channel(tessera_router::Routes::new());
    let members = vec![c.addr(follower), c.addr(leader)];
    tokio::spawn(tessera_router::source::follow_coordinator(members, None, tx));
    let router = tessera_router::proxy::Router::new(rx, Duration::from_secs(5));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(router.clone().serve(listener, std::future::pending()));
    let answer = eventually(T, "an answer through the router", || async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(format!("GET /t/{TENANT}/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        if !out.starts_with("HTTP/1.1 200") {
            eprintln!("through the router: {}", out.lines().next().unwrap_or(""));
            return None;
        }
        Some(out)
    })
    .await;
    assert!(answer.to_ascii_lowercase().contains(&format!("x-tessera-upstream: {}", endpoint.address)), "{answer}");
    // Requests that came before the routes are counted apart (a name the routes did not know yet).
    let stats = router.stats();
    assert_eq!(stats.values().map(|s| s.dropped).sum::<u64>(), 0, "{stats:?}");

    sim.stop().await;
    // The job outlives the agent (its own process group), as on a real node; the test cleans up.
    kill_jobs();
}
