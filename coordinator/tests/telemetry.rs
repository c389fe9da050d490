//! End-to-end check of the OTLP pipeline: `tracing` spans built by the coordinator's `otel_layer` reach a real
//! OTLP/gRPC receiver with their parent/child links, attributes and resource attributes.

mod support;

use std::time::Duration;

use support::otlp::{OtlpReceiver, ReceivedSpan, SpanKind, StatusCode, any_value, children_of, named};
use tessera_coordinator::telemetry::{EXPORT_INTERVAL, LevelFilter, Service, completed_span, init, otel_layer};
use tracing::field::Empty;
use tracing_subscriber::layer::SubscriberExt as _;

const WAIT: Duration = Duration::from_secs(10);

/// Emits one `planning_round` with two `gpu_solve` children through a thread-local subscriber.
fn emit_round(layer: impl tracing_subscriber::Layer<tracing_subscriber::Registry> + Send + Sync) {
    let subscriber = tracing_subscriber::registry().with(layer);
    tracing::subscriber::with_default(subscriber, || {
        let round = tracing::info_span!(
            "planning_round",
            tessera.plan.epoch = 17i64,
            tessera.policy = "balanced",
            tessera.round.outcome = Empty,
            otel.status_code = Empty
        );
        {
            let _entered = round.enter();
            for (gpu, objective) in [("gpu-0", 1.5), ("gpu-1", 2.25)] {
                let solve = tracing::info_span!(
                    "gpu_solve",
                    otel.kind = "client",
                    tessera.gpu = %gpu,
                    tessera.plan.objective = objective,
                    tessera.solver.status = Empty
                );
                let _in_solve = solve.enter();
                // Recorded after creation, as the solver learns it.
                solve.record("tessera.solver.status", "optimal");
            }
        }
        round.record("tessera.round.outcome", "planned");
        round.record("otel.status_code", "error");
    });
}

fn round_complete(spans: &[ReceivedSpan]) -> bool {
    named(spans, "planning_round").first().is_some_and(|round| children_of(spans, round).len() == 2)
}

#[tokio::test]
async fn round_and_solves_arrive_with_links_and_attributes() {
    let receiver = OtlpReceiver::start().await;
    let (layer, telemetry) = otel_layer(&receiver.endpoint(), &Service::new("tessera-coordinator-test", 42)).unwrap();
    emit_round(layer);
    // Synchronous flush on the test's current-thread runtime: must not need that runtime to make progress.
    telemetry.try_flush().unwrap();

    let spans = receiver.wait_for(WAIT, round_complete).await;
    let rounds = named(&spans, "planning_round");
    assert_eq!(rounds.len(), 1, "{spans:#?}");
    let round = rounds[0];
    assert!(round.is_root(), "{}", round.summary());
    assert_eq!(round.trace_id.len(), 16);
    assert_eq!(round.span_id.len(), 8);
    // Typed, namespaced attributes; kind and status from the `otel.*` fields; the resource names the service.
    assert_eq!(round.int("tessera.plan.epoch"), Some(17), "{}", round.summary());
    assert_eq!(round.string("tessera.policy"), Some("balanced"), "{}", round.summary());
    assert_eq!(round.string("tessera.round.outcome"), Some("planned"), "{}", round.summary());
    assert_eq!(round.kind, SpanKind::Internal);
    assert_eq!(round.status.0, StatusCode::Error, "{}", round.summary());
    assert!(round.start_ns > 0 && round.end_ns >= round.start_ns, "{}", round.summary());
    assert_eq!(round.service_name, "tessera-coordinator-test");
    assert_eq!(round.service_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(round.service_instance, "42");

    let mut solves = children_of(&spans, round);
    solves.sort_by(|a, b| a.attr("tessera.gpu").cmp(&b.attr("tessera.gpu")));
    assert_eq!(solves.len(), 2, "{spans:#?}");
    for (solve, (gpu, objective)) in solves.iter().zip([("gpu-0", "1.5"), ("gpu-1", "2.25")]) {
        assert_eq!(solve.name, "gpu_solve");
        assert_eq!(solve.parent_span_id, round.span_id);
        assert_eq!(solve.trace_id, round.trace_id);
        assert_ne!(solve.span_id, round.span_id);
        assert_eq!(solve.string("tessera.gpu"), Some(gpu), "{}", solve.summary());
        assert_eq!(solve.attr("tessera.plan.objective"), Some(objective), "{}", solve.summary());
        assert!(solve.double("tessera.plan.objective").is_some(), "{}", solve.summary());
        assert_eq!(solve.string("tessera.solver.status"), Some("optimal"), "{}", solve.summary());
        assert_eq!(solve.kind, SpanKind::Client);
        assert!(solve.start_ns >= round.start_ns && solve.end_ns <= round.end_ns, "{}", solve.summary());
        assert_eq!(solve.service_name, "tessera-coordinator-test");
        assert_eq!(solve.service_instance, "42");
    }
    assert_ne!(solves[0].span_id, solves[1].span_id);
    assert_eq!(named(&spans, "gpu_solve").len(), 2, "{spans:#?}");

    telemetry.shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_exported_on_the_interval_without_flush() {
    let receiver = OtlpReceiver::start().await;
    let (layer, telemetry) = otel_layer(&receiver.endpoint(), &Service::new("tessera-coordinator-test", 7)).unwrap();
    let started = std::time::Instant::now();
    emit_round(layer);

    let spans = receiver.wait_for(WAIT, round_complete).await;
    assert!(started.elapsed() < EXPORT_INTERVAL * 6, "took {:?}", started.elapsed());
    assert!(spans.iter().all(|s| s.service_instance == "7"), "{spans:#?}");

    // Shutting down with nothing left to export is prompt.
    let started = std::time::Instant::now();
    telemetry.shutdown();
    assert!(started.elapsed() < Duration::from_secs(3), "shutdown took {:?}", started.elapsed());
}

#[tokio::test]
async fn shutdown_is_bounded_when_the_collector_is_gone() {
    let receiver = OtlpReceiver::start().await;
    let endpoint = receiver.endpoint();
    drop(receiver);
    let (layer, telemetry) = otel_layer(&endpoint, &Service::new("tessera-coordinator-test", 1)).unwrap();
    emit_round(layer);
    let started = std::time::Instant::now();
    telemetry.flush();
    telemetry.shutdown();
    assert!(started.elapsed() < Duration::from_secs(5), "flush + shutdown took {:?}", started.elapsed());
}

/// The only test in this binary that touches the global subscriber (the others use thread-local ones).
#[tokio::test]
async fn init_installs_the_global_subscriber_once() {
    let receiver = OtlpReceiver::start().await;
    let service = Service::new("tessera-coordinator-global", 3);
    // Logging at `warn`, as the agents do by default: the log level does not decide which spans are exported.
    let telemetry = init(Some(&receiver.endpoint()), &service, LevelFilter::WARN)
        .expect("first init")
        .expect("an endpoint gives a Telemetry");
    // A second call fails cleanly instead of panicking, whether or not it has an endpoint.
    assert!(init(None, &service, LevelFilter::INFO).is_err());
    assert!(init(Some(&receiver.endpoint()), &service, LevelFilter::INFO).is_err());

    // A thread with no subscriber of its own uses the global one (an info span passes the spans' filter). Work
    // timed elsewhere is reported with its own times, as a child of the round, through the global provider.
    let (start, end) = (
        std::time::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        std::time::UNIX_EPOCH + Duration::from_millis(1_800_000_000_250),
    );
    std::thread::spawn(move || {
        let span = tracing::info_span!("global_round", tessera.plan.epoch = 5i64).entered();
        tracing::info!("inside the global round");
        completed_span(
            &span,
            "gpu_solve",
            opentelemetry::trace::SpanKind::Internal,
            (start, end),
            vec![
                opentelemetry::KeyValue::new(
                    "tessera.tenants",
                    opentelemetry::Value::Array(vec![opentelemetry::StringValue::from("a"), "b".into()].into()),
                ),
                opentelemetry::KeyValue::new("tessera.tenant.count", 2i64),
            ],
            opentelemetry::trace::Status::Ok,
        );
    })
    .join()
    .unwrap();
    telemetry.flush();
    let spans = receiver
        .wait_for(WAIT, |spans| !named(spans, "global_round").is_empty() && !named(spans, "gpu_solve").is_empty())
        .await;
    let round = named(&spans, "global_round")[0];
    assert_eq!(round.int("tessera.plan.epoch"), Some(5), "{}", round.summary());
    let solve = named(&spans, "gpu_solve")[0];
    assert_eq!(solve.parent_span_id, round.span_id, "{}", solve.summary());
    assert_eq!(solve.trace_id, round.trace_id);
    assert_eq!((solve.start_ns, solve.end_ns), (1_800_000_000_000_000_000, 1_800_000_000_250_000_000));
    assert_eq!(solve.status.0, StatusCode::Ok);
    assert_eq!(
        solve.array("tessera.tenants"),
        Some(vec![any_value::Value::StringValue("a".into()), any_value::Value::StringValue("b".into())])
    );
    assert_eq!(solve.int("tessera.tenant.count"), Some(2));
    assert_eq!(round.service_name, "tessera-coordinator-global");
    assert_eq!(round.service_instance, "3");
    telemetry.shutdown();
}
