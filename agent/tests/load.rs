//! The live load signal against a real HTTP endpoint: a Triton-style `/metrics` served over HTTP is scraped, its
//! counter's increase becomes the tenant's arrivals in the agent's heartbeat metrics (a restart of the serving stack
//! included), and `ReportLoad` adds a second source.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_agent::load::{LoadOptions, LoadSignal, ScrapeSource, scrape_loop};
use tessera_agent::workload::{Bookkeeping, Workload};
use tessera_core::ids::TenantId;

/// Serves `GET /metrics` with Triton's request counter for two models, `resnet50` at `count`.
async fn serving_stack(count: Arc<AtomicU64>) -> String {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let n = count.load(Ordering::SeqCst);
            async move {
                format!(
                    "# HELP nv_inference_request_success Number of successful inference requests\n\
                     # TYPE nv_inference_request_success counter\n\
                     nv_inference_request_success{{model=\"resnet50\",version=\"1\"}} {n}\n\
                     nv_inference_request_success{{model=\"bert\",version=\"1\"}} 999\n"
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/metrics")
}

async fn wait_arrivals(w: &Bookkeeping, tenant: &TenantId, want: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let got = w.metrics().tenants.get(tenant).map_or(0, |c| c.arrivals);
        if got == want {
            return;
        }
        assert!(Instant::now() < until, "arrivals stayed at {got}, expected {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scraped_counter_becomes_arrivals_and_reports_add_to_it() {
    let count = Arc::new(AtomicU64::new(1000));
    let url = serving_stack(count.clone()).await;
    let vision = TenantId::new("vision").unwrap();
    let signal = Arc::new(LoadSignal::default());
    let w = Bookkeeping::with_load(signal.clone());
    let options = LoadOptions {
        interval: Duration::from_millis(20),
        sources: vec![ScrapeSource {
            tenant: vision.clone(),
            url,
            metric: "nv_inference_request_success".into(),
            labels: BTreeMap::from([("model".to_string(), "resnet50".to_string())]),
        }],
    };
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let scraper = tokio::spawn(scrape_loop(options, signal.clone(), stop_rx));

    // What the stack served before the agent looked is not counted; what it serves afterwards is.
    let until = Instant::now() + Duration::from_secs(30);
    while signal.sources() == 0 {
        assert!(Instant::now() < until, "the endpoint was never read");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_arrivals(&w, &vision, 0).await;
    count.store(1250, Ordering::SeqCst);
    wait_arrivals(&w, &vision, 250).await;
    // The stack restarts: its counter starts again from 0, and its new requests count.
    count.store(40, Ordering::SeqCst);
    wait_arrivals(&w, &vision, 290).await;

    // A second serving process reports its own counter.
    w.report_load("triton-1", &vision, 7).unwrap();
    w.report_load("triton-1", &vision, 17).unwrap();
    wait_arrivals(&w, &vision, 300).await;

    let _ = stop.send(true);
    scraper.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_or_silent_endpoint_counts_nothing() {
    let signal = Arc::new(LoadSignal::default());
    let t = TenantId::new("t").unwrap();
    let e =
        tessera_agent::load::fetch("http://127.0.0.1:9/metrics", Duration::from_secs(2)).await.unwrap_err().to_string();
    assert!(e.starts_with("http://127.0.0.1:9/metrics: "), "{e}");
    let count = Arc::new(AtomicU64::new(5));
    let url = serving_stack(count).await;
    let text = tessera_agent::load::fetch(&url, Duration::from_secs(2)).await.unwrap();
    assert!(tessera_agent::load::counter_value(&text, "vllm:request_success_total", &BTreeMap::new()).is_err());
    assert!(!signal.arrivals().contains_key(&t));
    // Without a load signal, reports are refused.
    let e = Bookkeeping::default().report_load("x", &t, 1).unwrap_err();
    assert!(e.to_string().contains("does not take load reports"), "{e}");
}
