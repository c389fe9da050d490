//! A live load signal reaches the forecasts: an agent on a simulated GPU, with the real-GPU workload hook, reads a
//! serving stack's request counter from a real HTTP `/metrics` endpoint and reports it in its heartbeats; the
//! leader's forecast for the tenant follows the measured rate, not the rate the tenant declares.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::cluster::{Cluster, create, eventually, tenant};
use tessera_agent::coordinator::ClientOptions;
use tessera_agent::load::{LoadOptions, LoadSignal, ScrapeSource, scrape_loop};
use tessera_agent::reconcile::Reconciler;
use tessera_agent::runtime::{self, RuntimeOptions};
use tessera_agent::workload::Bookkeeping;
use tessera_core::catalog::GpuModel;
use tessera_core::ids::{NodeId, TenantId};
use tessera_proto::v1;

const T: Duration = Duration::from_secs(60);
/// The serving stack's request rate.
const RATE_RPS: f64 = 40.0;

/// A Triton-style `/metrics` whose request counter grows at [`RATE_RPS`] from 5,000.
async fn serving_stack() -> String {
    let start = Instant::now();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = 5000.0 + RATE_RPS * start.elapsed().as_secs_f64();
            async move { format!("nv_inference_request_success{{model=\"resnet50\",version=\"1\"}} {}\n", n.floor()) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_serving_stacks_request_counter_moves_the_forecast() {
    let c = Cluster::start(3, &["--plan-every", "1s", "--forecaster", "last"]);
    let leader = c.wait_leader(&[1, 2, 3], T).await;
    // Declared at 1 rps: a forecast near 40 can only come from the counter.
    create(&c, leader, tenant("vision", "resnet50", 1.0)).await;

    let url = serving_stack().await;
    let dir = tempfile::tempdir().unwrap();
    let signal = Arc::new(LoadSignal::default());
    let backend = Arc::new(
        tessera_sim::node::PersistentSim::open(
            1,
            GpuModel::A100_40GB,
            tessera_sim::node::NodeClock::new(tessera_sim::node::ClockKind::Wall).as_clock(),
            None,
            0,
        )
        .unwrap(),
    );
    let node = NodeId::new("live-0").unwrap();
    let reconciler = Arc::new(
        Reconciler::new(node.clone(), backend, Arc::new(Bookkeeping::with_load(signal.clone())), dir.path()).unwrap(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let options = RuntimeOptions {
        coordinator: Some(ClientOptions {
            endpoint: c.endpoints(),
            advertise: listener.local_addr().unwrap().to_string(),
            heartbeat_interval: Duration::from_millis(200),
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(1),
            rpc_timeout: Duration::from_secs(2),
            tls: None,
        }),
        ..RuntimeOptions::default()
    };
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let (handles, tasks) = runtime::start(reconciler, &options, stop_rx.clone());
    let mut stop_serve = stop_rx.clone();
    let server = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop_serve.wait_for(|s| *s).await;
        };
        runtime::serve(&handles, listener, shutdown).await.unwrap();
    });
    let load = LoadOptions {
        interval: Duration::from_millis(100),
        sources: vec![ScrapeSource {
            tenant: TenantId::new("vision").unwrap(),
            url,
            metric: "nv_inference_request_success".into(),
            labels: BTreeMap::from([("model".to_string(), "resnet50".to_string())]),
        }],
    };
    let scraper = tokio::spawn(scrape_loop(load, signal, stop_rx));

    // The leader plans every second from the counters of the heartbeats in between.
    let forecast = eventually(T, "a forecast for vision near the measured rate", || async {
        let gpu = format!("{node}/0");
        let ex = c.client(leader).explain(v1::GpuRequest { gpu, stale: false }).await.ok()?.into_inner();
        let f = *ex.forecasts.get("vision")?;
        (f > RATE_RPS * 0.75 && f < RATE_RPS * 1.25).then_some(f)
    })
    .await;
    assert!((forecast - RATE_RPS).abs() < RATE_RPS * 0.25, "{forecast}");

    let _ = stop.send(true);
    server.await.unwrap();
    scraper.await.unwrap();
    for t in tasks {
        let _ = t.await;
    }
}
