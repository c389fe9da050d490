//! Logging and OpenTelemetry tracing setup.
//!
//! [`init`] installs the process-wide `tracing` subscriber: an [`EnvFilter`] (from `RUST_LOG`, default `info`), a
//! compact fmt layer on stderr and, when an OTLP endpoint is configured, the layer built by [`otel_layer`], which turns
//! every `tracing` span into an OpenTelemetry span exported over OTLP/gRPC (tonic) in batches.
//!
//! The exporter runs on its own small tokio runtime owned by [`Telemetry`] (one worker thread, `otlp-export`), and the
//! SDK's batch span processor runs on its own thread. So neither [`otel_layer`] nor [`Telemetry::flush`] depends on
//! the caller's runtime: they work from plain threads, from a multi-thread runtime and from a current-thread runtime
//! (where a blocking flush would otherwise starve the very runtime that has to drive the export). The export runtime
//! silences `tracing` on its threads and the OTLP layer ignores spans from the transport crates (`h2`, `hyper`,
//! `tonic`, `tower`), so exporting spans never produces more spans.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{EnvFilter, LevelFilter, filter_fn};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How often the batch span processor exports what it has queued (its scheduled delay). Kept short so that traces
/// show up within a second (tests wait on them); a batch also goes out early once it reaches 512 spans.
pub const EXPORT_INTERVAL: Duration = Duration::from_millis(500);

/// Deadline for one OTLP export, retries included. Bounds [`Telemetry::flush`] when the collector is down or slow.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest [`Telemetry::shutdown`] waits for the final export before giving up on it.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// Name of the OpenTelemetry instrumentation scope the coordinator's spans are reported under.
pub const TRACER_NAME: &str = "tessera-coordinator";

/// Targets whose spans never go to OTLP: the transport the exporter itself uses.
const TRANSPORT_TARGETS: [&str; 5] = ["h2", "hyper", "hyper_util", "tonic", "tower"];

/// Handle on the OpenTelemetry pipeline built by [`otel_layer`] / [`init`]: owns the tracer provider (batch span
/// processor and OTLP exporter) and the runtime the exporter runs on.
///
/// Call [`Telemetry::shutdown`] (or drop it) before the process exits so queued spans are exported. Dropping it
/// shuts the pipeline down the same way; spans ended afterwards are discarded.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
    shut_down: bool,
}

impl Telemetry {
    /// The tracer provider, e.g. to create extra OpenTelemetry tracers that share this pipeline.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Exports every span ended so far and waits for the export to finish. Blocks the calling thread for at most
    /// about [`EXPORT_TIMEOUT`] when the collector is unreachable (the SDK caps a flush at 5 s in any case); a failure
    /// is logged as a warning. Safe to call from async code on any runtime flavor (it does not need the caller's
    /// runtime to make progress), though it does block that thread meanwhile.
    pub fn flush(&self) {
        if let Err(err) = self.try_flush() {
            tracing::warn!(error = %format!("{err:#}"), "OpenTelemetry flush failed");
        }
    }

    /// Like [`Telemetry::flush`], but returns the failure instead of logging it.
    pub fn try_flush(&self) -> anyhow::Result<()> {
        self.provider.force_flush().context("flushing OpenTelemetry spans")
    }

    /// Exports the spans still queued, then shuts the pipeline down. Blocks for at most about [`SHUTDOWN_TIMEOUT`]
    /// even when the collector is down; failures are logged as warnings. Safe to call from async code.
    pub fn shutdown(mut self) {
        self.shutdown_inner();
    }

    fn shutdown_inner(&mut self) {
        if !self.shut_down {
            self.shut_down = true;
            if let Err(err) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
                tracing::warn!(error = %err, "OpenTelemetry shutdown failed");
            }
        }
        // `shutdown_background` rather than a plain drop: dropping a runtime inside an async context panics.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.shutdown_inner();
    }
}

/// Builds the layer that exports `tracing` spans as OpenTelemetry spans to the OTLP/gRPC collector at `endpoint`
/// (e.g. `http://127.0.0.1:4317`; plain HTTP/2, no TLS), with resource attributes `service.name` = `service_name`
/// and `service.instance.id` = `node_id` (as a decimal string).
///
/// Spans go through the SDK's batch span processor, exported every [`EXPORT_INTERVAL`] with an [`EXPORT_TIMEOUT`]
/// deadline; the gRPC channel connects lazily on a small tokio runtime owned by the returned [`Telemetry`], so this
/// may be called with or without a tokio runtime around and does not fail when the collector is down (exports then
/// fail, are logged by the SDK only with its internal logging, and the spans are dropped). Keep the [`Telemetry`]
/// alive as long as the layer is in use, and shut it down at exit.
///
/// Span fields become attributes (`tracing::info_span!("gpu_solve", gpu = %id, objective = x)`), including fields
/// declared `tracing::field::Empty` and recorded later with `Span::record`; span nesting becomes the parent/child
/// relationship. Only spans that the subscriber's filters enable reach this layer.
pub fn otel_layer<S>(endpoint: &str, service_name: &str, node_id: u64) -> anyhow::Result<(impl Layer<S>, Telemetry)>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("otlp-export")
        .enable_all()
        // Silence `tracing` on the export threads: the transport's own spans and events must not feed back into
        // the pipeline (the guard is leaked on purpose so the no-op default lasts as long as the thread).
        .on_thread_start(|| {
            std::mem::forget(tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::new()))
        })
        .build()
        .context("building the OTLP export runtime")?;

    let exporter = {
        // The lazily connecting tonic channel spawns its worker on the runtime it is built in.
        let _guard = runtime.enter();
        opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("building the OTLP span exporter for {endpoint}"))?
    };
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(EXPORT_INTERVAL).build())
        .build();
    let resource = Resource::builder()
        .with_service_name(service_name.to_owned())
        .with_attribute(KeyValue::new("service.instance.id", node_id.to_string()))
        .build();
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();

    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(TRACER_NAME))
        .with_filter(filter_fn(|meta| !is_transport_target(meta.target())));
    Ok((layer, Telemetry { provider, runtime: Some(runtime), shut_down: false }))
}

/// Whether `target` belongs to one of [`TRANSPORT_TARGETS`] (the crate itself or one of its modules).
fn is_transport_target(target: &str) -> bool {
    TRANSPORT_TARGETS
        .iter()
        .any(|t| target.strip_prefix(t).is_some_and(|rest| rest.is_empty() || rest.starts_with("::")))
}

/// Installs the global `tracing` subscriber: an [`EnvFilter`] from `RUST_LOG` (default `info`; invalid directives are
/// skipped), a compact fmt layer on stderr (ANSI colours only when stderr is a terminal) and, when `otlp_endpoint` is
/// given, the OTLP layer from [`otel_layer`] with `service_name` and `node_id` as resource attributes.
///
/// Returns the [`Telemetry`] to shut down at exit (`None` without an endpoint). Fails, without panicking, when a
/// global subscriber is already installed (e.g. on a second call) or the exporter cannot be built; the OTLP pipeline
/// built for a call that then fails is shut down again.
pub fn init(otlp_endpoint: Option<&str>, service_name: &str, node_id: u64) -> anyhow::Result<Option<Telemetry>> {
    let filter = EnvFilter::builder().with_default_directive(LevelFilter::INFO.into()).from_env_lossy();
    let fmt = tracing_subscriber::fmt::layer()
        .compact()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let subscriber = tracing_subscriber::registry().with(filter).with(fmt);
    let (otel, telemetry) = match otlp_endpoint {
        Some(endpoint) => {
            let (layer, telemetry) = otel_layer(endpoint, service_name, node_id)?;
            (Some(layer), Some(telemetry))
        }
        None => (None, None),
    };
    subscriber.with(otel).try_init().context("installing the global tracing subscriber")?;
    Ok(telemetry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::Registry;

    #[test]
    fn transport_targets() {
        assert!(is_transport_target("h2"));
        assert!(is_transport_target("h2::proto::connection"));
        assert!(is_transport_target("tonic::transport"));
        assert!(is_transport_target("hyper_util::client"));
        assert!(!is_transport_target("h2o"));
        assert!(!is_transport_target("tessera_coordinator::planner"));
    }

    #[test]
    fn pipeline_without_collector_shuts_down_promptly() {
        // A port that was just free: nothing listens there, so exports fail (fast, or at the export timeout).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (layer, telemetry) = otel_layer::<Registry>(&format!("http://127.0.0.1:{port}"), "test", 7).unwrap();
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, || {
            let _span = tracing::info_span!("orphan").entered();
        });
        let started = std::time::Instant::now();
        telemetry.flush();
        telemetry.shutdown();
        assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
    }
}
