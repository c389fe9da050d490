//! Tessera's tracing: logs on stderr, OpenTelemetry spans over OTLP/gRPC, and W3C trace context carried in gRPC
//! metadata, shared by the coordinator, the agent and `sim-agent`.
//!
//! [`init`] installs the process-wide `tracing` subscriber: a compact fmt layer on stderr, filtered by an
//! [`EnvFilter`] (from `RUST_LOG`), and, when an OTLP endpoint is configured, the layer built by [`otel_layer`], which
//! turns every `tracing` span into an OpenTelemetry span exported over OTLP/gRPC (tonic) in batches, with a filter of
//! its own ([`SPAN_FILTER_ENV`], default `info`), so that a quiet log does not silence the traces.
//!
//! The exporter runs on its own small tokio runtime owned by [`Telemetry`] (one worker thread, `otlp-export`), and the
//! SDK's batch span processor runs on its own thread. So neither [`otel_layer`] nor [`Telemetry::flush`] depends on
//! the caller's runtime: they work from plain threads, from a multi-thread runtime and from a current-thread runtime
//! (where a blocking flush would otherwise starve the very runtime that has to drive the export). The export runtime
//! silences `tracing` on its threads and the OTLP layer ignores spans from the transport crates (`h2`, `hyper`,
//! `tonic`, `tower`), so exporting spans never produces more spans.
//!
//! # Conventions
//!
//! Spans follow the OpenTelemetry specification and its semantic conventions:
//!
//! - **Resource**: `service.name` (`tessera-coordinator`, `tessera-agent`, `tessera-sim-agent`), `service.version`
//!   (the crate version) and `service.instance.id` (the Raft id of a coordinator, the node id of an agent), from
//!   [`Service`]. A process that hosts several instances (`sim-agent`'s simulated nodes) names the span attribute
//!   that says whose a span is ([`Service::hosting`]): each span carrying it is exported under its own
//!   `service.instance.id`, the node's id.
//! - **Attributes** are namespaced `tessera.*` and typed: counts and epochs are integers, figures doubles, lists
//!   arrays. `tracing` sends `u64` and `usize` fields as strings, so spans record integers as `i64`; arrays go through
//!   [`completed_span`] or `OpenTelemetrySpanExt::set_attribute`.
//! - **Kinds**: an outgoing RPC is a `client` span and its handler a `server` span (`otel.kind`), named
//!   `tessera.v1.Service/Method` with `rpc.system`, `rpc.service` and `rpc.method`; everything else is `internal`.
//! - **Status**: a span whose operation failed sets `otel.status_code = "error"` and `otel.status_description`; one
//!   that succeeded and has a definite outcome sets `"ok"`.
//! - **Context**: the coordinator's push carries the W3C `traceparent` (and `tracestate`) of its client span in the
//!   gRPC metadata ([`inject_context`]); the agent continues the trace from it ([`extract_context`]), so its
//!   reconcile pass and every MIG step are descendants of the planning round that caused them.
//! - **Spans that time what they name**: work measured elsewhere (a planner's per-GPU solve on a worker thread) is
//!   reported with its measured start and end ([`completed_span`]), never as a span opened after the fact.
//!
//! | span | kind | where | attributes (besides `tessera.`) |
//! |---|---|---|---|
//! | `planning_round` | internal | coordinator leader | `round.trigger`, `policy`, `plan.epoch`, `gpu.count`, `tenant.count`, `round.outcome`, `plan.objective`, `plan.bound`, `plan.gap`, `plan.solve_ms`, `push.ok`, `push.failed` |
//! | `gpu_solve` | internal | coordinator (measured in the planner) | `gpu`, `gpu.model`, `tenants` (array), `forecast.mean_rps` (array), `tenant.count`, `candidate_profiles`, `layout.current`, `layout.chosen`, `plan.objective`, `plan.bound`, `solver.status`, `explanation`, `plan.kept` (bool: the last plan kept, shifted forward), `replan.reason` (why it was solved again, where it had a plan to keep) |
//! | `tessera.v1.Agent/ApplyLayout` | client | coordinator, one per node pushed | `node`, `plan.epoch`, `gpus` (array), `layouts.from` / `layouts.to` (arrays), `reconfiguration.steps` (the steps from the GPUs' previous targets, by the agent's diff), `push.result` |
//! | `tessera.v1.Agent/ApplyLayout` | server | agent | `node`, `plan.epoch`, `apply.result` |
//! | `reconcile` | internal | agent, per GPU and pass | `gpu`, `plan.epoch`, `layout.from`, `layout.to`, `reconfiguration.planned` (the pass's diff), `reconfiguration.steps` (the MIG steps it completed: a pass that waits leaves the rest to the next), `reconcile.outcome` |
//! | `mig.set_mode`, `mig.create_instance`, `mig.destroy_instance`, `mig.reassign`, `mig.apply_target` | internal | agent, per MIG step | `gpu`, `mig.profile`, `mig.placement.start`, `mig.instance_id`, `tenant.count` |

use std::io::IsTerminal;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use opentelemetry::KeyValue;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt as _, Tracer as _, TracerProvider as _};
use opentelemetry_otlp::{WithExportConfig as _, WithTonicConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing::Subscriber;
pub use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer;
pub use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::filter::{EnvFilter, filter_fn};
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

/// Name of the OpenTelemetry instrumentation scope Tessera's spans are reported under (the processes differ by their
/// `service.name`).
pub const TRACER_NAME: &str = "tessera";

/// Who is sending the spans: the resource attributes `service.name`, `service.version` and `service.instance.id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Service {
    /// `service.name`, e.g. `tessera-coordinator`.
    pub name: String,
    /// `service.version`: the version of the binary.
    pub version: String,
    /// `service.instance.id`: which one of the service's processes (Raft id, node id).
    pub instance: String,
    /// For a process that hosts several instances: the span attribute whose (string) value is the instance a span
    /// belongs to. Spans without it are the process's own (`instance`).
    pub instance_attribute: Option<&'static str>,
}

impl Service {
    /// `name` at this crate's version (the workspace shares one version), instance `instance`.
    pub fn new(name: impl Into<String>, instance: impl ToString) -> Service {
        Service {
            name: name.into(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            instance: instance.to_string(),
            instance_attribute: None,
        }
    }

    /// The same service, hosting several instances in one process: a span whose attribute `attribute` holds a
    /// string is exported with that string as its `service.instance.id` (at most [`MAX_INSTANCES`] of them; the
    /// rest are reported as the process's own).
    pub fn hosting(mut self, attribute: &'static str) -> Service {
        self.instance_attribute = Some(attribute);
        self
    }

    /// The resource of instance `instance` of this service.
    fn resource(&self, instance: &str) -> Resource {
        Resource::builder()
            .with_service_name(self.name.clone())
            .with_attribute(KeyValue::new("service.version", self.version.clone()))
            .with_attribute(KeyValue::new("service.instance.id", instance.to_string()))
            .build()
    }
}

/// The most instances one process reports spans for ([`Service::hosting`]); each has its own OTLP exporter.
pub const MAX_INSTANCES: usize = 4096;

/// An OTLP exporter per instance of the service: OpenTelemetry gives a tracer provider one resource, so a process
/// that hosts several instances routes each span, by [`Service::instance_attribute`], to an exporter whose resource
/// names its instance. Exporters are built when an instance's first span arrives, and all of them share one
/// connection to the collector.
#[derive(Debug)]
struct PerInstance {
    service: Service,
    endpoint: String,
    channel: tonic::transport::Channel,
    exporters: std::sync::Mutex<std::collections::BTreeMap<String, std::sync::Arc<opentelemetry_otlp::SpanExporter>>>,
}

impl PerInstance {
    fn new(service: &Service, endpoint: &str, runtime: &tokio::runtime::Runtime) -> anyhow::Result<PerInstance> {
        let channel = {
            // The lazily connecting tonic channel spawns its worker on the runtime it is built in.
            let _guard = runtime.enter();
            tonic::transport::Endpoint::from_shared(endpoint.to_string())
                .with_context(|| format!("the OTLP endpoint {endpoint}"))?
                .timeout(EXPORT_TIMEOUT)
                .connect_lazy()
        };
        let this = PerInstance {
            service: service.clone(),
            endpoint: endpoint.to_string(),
            channel,
            exporters: Default::default(),
        };
        // The process's own exporter is built now, so that a bad endpoint is an error at start.
        this.exporter(&service.instance)?;
        Ok(this)
    }

    /// The exporter of `instance`, built on first use; the process's own once [`MAX_INSTANCES`] are in use.
    fn exporter(&self, instance: &str) -> anyhow::Result<std::sync::Arc<opentelemetry_otlp::SpanExporter>> {
        use opentelemetry_sdk::trace::SpanExporter as _;
        let mut exporters = self.exporters.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(e) = exporters.get(instance) {
            return Ok(e.clone());
        }
        if exporters.len() >= MAX_INSTANCES
            && let Some(own) = exporters.get(&self.service.instance)
        {
            return Ok(own.clone());
        }
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_channel(self.channel.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .with_context(|| format!("building the OTLP span exporter for {}", self.endpoint))?;
        exporter.set_resource(&self.service.resource(instance));
        let exporter = std::sync::Arc::new(exporter);
        exporters.insert(instance.to_string(), exporter.clone());
        Ok(exporter)
    }

    /// The instance span `span` belongs to.
    fn instance_of(&self, span: &opentelemetry_sdk::trace::SpanData) -> String {
        let named = self.service.instance_attribute.and_then(|key| {
            span.attributes.iter().find(|kv| kv.key.as_str() == key).and_then(|kv| match &kv.value {
                opentelemetry::Value::String(s) if !s.as_str().is_empty() => Some(s.to_string()),
                _ => None,
            })
        });
        named.unwrap_or_else(|| self.service.instance.clone())
    }

    fn exporters(&self) -> Vec<std::sync::Arc<opentelemetry_otlp::SpanExporter>> {
        self.exporters.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values().cloned().collect()
    }
}

impl opentelemetry_sdk::trace::SpanExporter for PerInstance {
    async fn export(&self, batch: Vec<opentelemetry_sdk::trace::SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        let mut groups: std::collections::BTreeMap<String, Vec<opentelemetry_sdk::trace::SpanData>> =
            Default::default();
        for span in batch {
            groups.entry(self.instance_of(&span)).or_default().push(span);
        }
        let mut result = Ok(());
        for (instance, spans) in groups {
            let exporter = self
                .exporter(&instance)
                .map_err(|e| opentelemetry_sdk::error::OTelSdkError::InternalFailure(format!("{e:#}")))?;
            if let Err(e) = exporter.export(spans).await {
                result = Err(e);
            }
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.exporters().iter().map(|e| e.shutdown_with_timeout(timeout)).fold(Ok(()), Result::and)
    }
}

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
/// (e.g. `http://127.0.0.1:4317`; plain HTTP/2, no TLS), with `service`'s resource attributes.
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
pub fn otel_layer<S>(endpoint: &str, service: &Service) -> anyhow::Result<(impl Layer<S>, Telemetry)>
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

    let exporter = PerInstance::new(service, endpoint, &runtime)?;
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(BatchConfigBuilder::default().with_scheduled_delay(EXPORT_INTERVAL).build())
        .build();
    let resource = service.resource(&service.instance);
    let provider = SdkTracerProvider::builder().with_span_processor(processor).with_resource(resource).build();

    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer(TRACER_NAME))
        // `busy_ns`/`idle_ns` and `target` are not conventional attributes (`code.module.name` names the module).
        .with_tracked_inactivity(false)
        .with_target(false)
        .with_filter(filter_fn(|meta| !is_transport_target(meta.target())));
    Ok((layer, Telemetry { provider, runtime: Some(runtime), shut_down: false }))
}

/// Whether `target` belongs to one of [`TRANSPORT_TARGETS`] (the crate itself or one of its modules).
fn is_transport_target(target: &str) -> bool {
    TRANSPORT_TARGETS
        .iter()
        .any(|t| target.strip_prefix(t).is_some_and(|rest| rest.is_empty() || rest.starts_with("::")))
}

/// The environment variable that filters which spans are exported over OTLP ([`EnvFilter`] directives); `info` when
/// unset, whatever `RUST_LOG` says of the log lines.
pub const SPAN_FILTER_ENV: &str = "TESSERA_OTLP_FILTER";

/// The OTLP layer's own filter: [`SPAN_FILTER_ENV`], default `info` (every span Tessera opens).
fn span_filter() -> EnvFilter {
    EnvFilter::builder().with_default_directive(LevelFilter::INFO.into()).with_env_var(SPAN_FILTER_ENV).from_env_lossy()
}

/// Installs the global `tracing` subscriber: a compact fmt layer on stderr (ANSI colours only when stderr is a
/// terminal) filtered by an [`EnvFilter`] from `RUST_LOG` (default `default_level`; invalid directives are skipped)
/// and, when `otlp_endpoint` is given, the OTLP layer from [`otel_layer`] with `service`'s resource attributes,
/// filtered apart ([`SPAN_FILTER_ENV`], default `info`): the log level never decides which spans are exported. The pipeline's tracer provider
/// also becomes OpenTelemetry's global one, which [`completed_span`] reports through.
///
/// Returns the [`Telemetry`] to shut down at exit (`None` without an endpoint). Fails, without panicking, when a
/// global subscriber is already installed (e.g. on a second call) or the exporter cannot be built; the OTLP pipeline
/// built for a call that then fails is shut down again.
pub fn init(
    otlp_endpoint: Option<&str>,
    service: &Service,
    default_level: LevelFilter,
) -> anyhow::Result<Option<Telemetry>> {
    // Each layer has its own filter: the log level decides which lines reach stderr, never which spans are
    // exported (agents log at `warn` by default, and every span of theirs is an `info` span).
    let filter = EnvFilter::builder().with_default_directive(default_level.into()).from_env_lossy();
    let fmt = tracing_subscriber::fmt::layer()
        .compact()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let subscriber = tracing_subscriber::registry().with(fmt);
    let (otel, telemetry) = match otlp_endpoint {
        Some(endpoint) => {
            let (layer, telemetry) = otel_layer(endpoint, service)?;
            (Some(layer.with_filter(span_filter())), Some(telemetry))
        }
        None => (None, None),
    };
    subscriber.with(otel).try_init().context("installing the global tracing subscriber")?;
    if let Some(t) = &telemetry {
        opentelemetry::global::set_tracer_provider(t.provider.clone());
    }
    Ok(telemetry)
}

/// Reports an operation that was timed elsewhere (`start` to `end`) as a span `name` of `kind`, child of `parent`
/// (a root span when `parent` is not exported), with typed `attributes` and `status`. Goes through OpenTelemetry's
/// global tracer provider, which [`init`] sets; without one (no OTLP endpoint) it costs next to nothing.
pub fn completed_span(
    parent: &tracing::Span,
    name: &'static str,
    kind: SpanKind,
    (start, end): (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    status: Status,
) {
    let cx = parent.context();
    let tracer = opentelemetry::global::tracer(TRACER_NAME);
    let mut span = tracer
        .span_builder(name)
        .with_kind(kind)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&tracer, &cx);
    span.set_status(status);
    span.end_with_timestamp(end.max(start));
}

/// gRPC metadata as a carrier of W3C trace context.
struct Metadata<'a>(&'a tonic::metadata::MetadataMap);
struct MetadataMut<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(k, v);
        }
    }
}

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Records how the operation `span` names ended: `otel.status_code = "ok"`, or `"error"` with
/// `otel.status_description` set to the error's message. The span must declare both fields (`Empty` until now).
pub fn record_status<T, E: std::fmt::Display>(span: &tracing::Span, result: &Result<T, E>) {
    match result {
        Ok(_) => {
            span.record("otel.status_code", "ok");
        }
        Err(e) => {
            span.record("otel.status_code", "error").record("otel.status_description", e.to_string());
        }
    }
}

/// Writes `span`'s trace context into `metadata` as W3C `traceparent` (and `tracestate` when it has one), so the
/// callee's spans join the trace. Writes nothing when `span` is not exported.
pub fn inject_context(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut MetadataMut(metadata));
    }
}

/// The trace context a caller put in `metadata` (see [`inject_context`]), to give a server span as its parent with
/// `OpenTelemetrySpanExt::set_parent`. Malformed or absent headers give an empty context (the span is then a root).
/// Only `traceparent` and `tracestate` are read; tonic bounds their size with the rest of the headers.
pub fn extract_context(metadata: &tonic::metadata::MetadataMap) -> opentelemetry::Context {
    TraceContextPropagator::new().extract(&Metadata(metadata))
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
    fn trace_context_survives_grpc_metadata_and_garbage_gives_a_root() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(provider.tracer("t")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("caller");
            let mut md = tonic::metadata::MetadataMap::new();
            inject_context(&span, &mut md);
            let header = md.get("traceparent").expect("traceparent").to_str().unwrap().to_string();
            let sent = span.context().span().span_context().clone();
            assert_eq!(header, format!("00-{}-{}-01", sent.trace_id(), sent.span_id()));
            let got = extract_context(&md);
            assert_eq!(got.span().span_context().trace_id(), sent.trace_id());
            assert_eq!(got.span().span_context().span_id(), sent.span_id());
            assert!(got.span().span_context().is_remote());
            for bad in ["", "00-xyz", "ff-00000000000000000000000000000000-0000000000000000-01"] {
                let mut md = tonic::metadata::MetadataMap::new();
                md.insert("traceparent", bad.parse().unwrap());
                assert!(!extract_context(&md).span().span_context().is_valid(), "{bad}");
            }
        });
        // A span nobody exports writes no header.
        let mut md = tonic::metadata::MetadataMap::new();
        inject_context(&tracing::Span::none(), &mut md);
        assert!(md.is_empty());
    }

    #[test]
    fn pipeline_without_collector_shuts_down_promptly() {
        // A port that was just free: nothing listens there, so exports fail (fast, or at the export timeout).
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let (layer, telemetry) =
            otel_layer::<Registry>(&format!("http://127.0.0.1:{port}"), &Service::new("test", 7)).unwrap();
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
