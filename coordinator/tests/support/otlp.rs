//! An in-process OTLP/gRPC trace collector for tests.
//!
//! [`OtlpReceiver::start`] serves the OTLP `TraceService` on `127.0.0.1:<ephemeral port>` (reachable from other
//! processes too, e.g. a coordinator started with `--otlp-endpoint`), flattens every exported span into a
//! [`ReceivedSpan`] and wakes [`OtlpReceiver::wait_for`] on each export.
//!
//! The server runs on its own small tokio runtime, so it keeps answering while the test's own runtime is blocked
//! (e.g. in a synchronous `Telemetry::flush` under `#[tokio::test]`'s current-thread runtime).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
pub use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue};
pub use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
pub use opentelemetry_proto::tonic::trace::v1::status::StatusCode;
use tokio::sync::Notify;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// One span as received, flattened: ids as raw bytes (16-byte trace id, 8-byte span ids; `parent_span_id` empty for
/// a root span), kind, status and times as sent, attributes both stringified and typed, and the `service.name`,
/// `service.version` and `service.instance.id` resource attributes of the process that sent it (empty when absent).
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedSpan {
    /// Span name.
    pub name: String,
    /// Trace id (16 bytes).
    pub trace_id: Vec<u8>,
    /// Span id (8 bytes).
    pub span_id: Vec<u8>,
    /// Parent span id (8 bytes), empty for a root span.
    pub parent_span_id: Vec<u8>,
    /// Span attributes. Strings as they are, integers and booleans via `Display`, doubles via `f64`'s `Display`
    /// (`1.5`, `3`), arrays as `[a, b]`, key-value lists as `{k: v}`, bytes as lowercase hex.
    pub attributes: BTreeMap<String, String>,
    /// Attribute values with their OTLP types.
    pub values: BTreeMap<String, any_value::Value>,
    /// Span kind (`SpanKind` of the OTLP proto: 1 internal, 2 server, 3 client).
    pub kind: SpanKind,
    /// Status code (unset, ok, error) and message.
    pub status: (StatusCode, String),
    /// Start and end, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// End, nanoseconds since the Unix epoch.
    pub end_ns: u64,
    /// `service.name` resource attribute.
    pub service_name: String,
    /// `service.version` resource attribute.
    pub service_version: String,
    /// `service.instance.id` resource attribute.
    pub service_instance: String,
}

impl ReceivedSpan {
    /// The stringified value of attribute `key`, if present.
    pub fn attr(&self, key: &str) -> Option<&str> {
        self.attributes.get(key).map(String::as_str)
    }

    /// Attribute `key` if it was sent as an integer.
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.values.get(key) {
            Some(any_value::Value::IntValue(i)) => Some(*i),
            _ => None,
        }
    }

    /// Attribute `key` if it was sent as a boolean.
    pub fn bool(&self, key: &str) -> Option<bool> {
        match self.values.get(key) {
            Some(any_value::Value::BoolValue(b)) => Some(*b),
            _ => None,
        }
    }

    /// Attribute `key` if it was sent as a double.
    pub fn double(&self, key: &str) -> Option<f64> {
        match self.values.get(key) {
            Some(any_value::Value::DoubleValue(d)) => Some(*d),
            _ => None,
        }
    }

    /// Attribute `key` if it was sent as a string.
    pub fn string(&self, key: &str) -> Option<&str> {
        match self.values.get(key) {
            Some(any_value::Value::StringValue(s)) => Some(s),
            _ => None,
        }
    }

    /// Attribute `key` if it was sent as an array, its elements typed.
    pub fn array(&self, key: &str) -> Option<Vec<any_value::Value>> {
        match self.values.get(key) {
            Some(any_value::Value::ArrayValue(a)) => Some(a.values.iter().filter_map(|v| v.value.clone()).collect()),
            _ => None,
        }
    }

    /// How long the span lasted, in seconds.
    pub fn duration_s(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e9
    }

    /// Whether this span has no parent.
    pub fn is_root(&self) -> bool {
        self.parent_span_id.is_empty()
    }

    /// One line for failure messages: name, ids in hex, service and attributes.
    pub fn summary(&self) -> String {
        format!(
            "{} {:?} {:?} span={} parent={} trace={} service={}/{} {:?}",
            self.name,
            self.kind,
            self.status,
            hex(&self.span_id),
            if self.parent_span_id.is_empty() { "-".to_owned() } else { hex(&self.parent_span_id) },
            hex(&self.trace_id),
            self.service_name,
            self.service_instance,
            self.attributes
        )
    }
}

/// The spans in `spans` whose parent is `parent` (same trace, `parent_span_id` equal to `parent.span_id`).
pub fn children_of<'a>(spans: &'a [ReceivedSpan], parent: &ReceivedSpan) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id).collect()
}

/// The spans in `spans` named `name`.
pub fn named<'a>(spans: &'a [ReceivedSpan], name: &str) -> Vec<&'a ReceivedSpan> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// State shared between the gRPC service and the test's handle.
#[derive(Default)]
struct Shared {
    spans: Mutex<Vec<ReceivedSpan>>,
    exported: Notify,
}

impl Shared {
    fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

struct Collector {
    shared: Arc<Shared>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let received = flatten(request.into_inner());
        self.shared.spans.lock().unwrap_or_else(PoisonError::into_inner).extend(received);
        self.shared.exported.notify_waiters();
        Ok(Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// A running OTLP trace receiver; stops serving when dropped.
pub struct OtlpReceiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl OtlpReceiver {
    /// Binds `127.0.0.1:0` and starts serving the OTLP `TraceService` (plain HTTP/2) on a dedicated runtime. Panics
    /// if the port cannot be bound.
    pub async fn start() -> OtlpReceiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding the OTLP receiver");
        listener.set_nonblocking(true).expect("making the OTLP receiver's socket non-blocking");
        let addr = listener.local_addr().expect("OTLP receiver address");
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-receiver")
            .enable_all()
            // Keep the server's own tracing out of whatever subscriber the test installed globally.
            .on_thread_start(|| {
                std::mem::forget(tracing::subscriber::set_default(tracing::subscriber::NoSubscriber::new()))
            })
            .build()
            .expect("building the OTLP receiver runtime");
        let shared = Arc::new(Shared::default());
        let listener = {
            let _guard = runtime.enter();
            tokio::net::TcpListener::from_std(listener).expect("registering the OTLP receiver's socket")
        };
        let service = TraceServiceServer::new(Collector { shared: Arc::clone(&shared) });
        runtime.spawn(async move {
            if let Err(err) = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await
            {
                eprintln!("OTLP receiver on {addr} stopped: {err}");
            }
        });
        OtlpReceiver { addr, shared, runtime: Some(runtime) }
    }

    /// The socket address the receiver listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint to give an OTLP/gRPC exporter: `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, in arrival order.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.shared.spans()
    }

    /// Waits until `pred` holds for the spans received so far (checked now and after every export) and returns
    /// them. Panics after `timeout` with a summary of what did arrive.
    pub async fn wait_for(&self, timeout: Duration, pred: impl Fn(&[ReceivedSpan]) -> bool) -> Vec<ReceivedSpan> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Register for the next export before looking, so one landing in between is not missed.
            let mut exported = pin!(self.shared.exported.notified());
            exported.as_mut().enable();
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            if tokio::time::timeout_at(deadline, exported).await.is_err() {
                let spans = self.spans();
                if pred(&spans) {
                    return spans;
                }
                let mut summary = String::new();
                for span in &spans {
                    let _ = writeln!(summary, "  {}", span.summary());
                }
                panic!("timed out after {timeout:?} waiting for spans; {} received:\n{summary}", spans.len());
            }
        }
    }
}

impl Drop for OtlpReceiver {
    fn drop(&mut self) {
        // Not a plain drop: dropping a runtime inside an async context panics.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn flatten(request: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    let mut out = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service_name = resource.get("service.name").cloned().unwrap_or_default();
        let service_instance = resource.get("service.instance.id").cloned().unwrap_or_default();
        let service_version = resource.get("service.version").cloned().unwrap_or_default();
        for scope_spans in resource_spans.scope_spans {
            for span in scope_spans.spans {
                let status = span.status.as_ref().map_or((StatusCode::Unset, String::new()), |s| {
                    (StatusCode::try_from(s.code).unwrap_or(StatusCode::Unset), s.message.clone())
                });
                out.push(ReceivedSpan {
                    kind: SpanKind::try_from(span.kind).unwrap_or(SpanKind::Unspecified),
                    status,
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                    values: span
                        .attributes
                        .iter()
                        .filter_map(|kv| Some((kv.key.clone(), kv.value.as_ref()?.value.clone()?)))
                        .collect(),
                    name: span.name,
                    trace_id: span.trace_id,
                    span_id: span.span_id,
                    parent_span_id: span.parent_span_id,
                    attributes: attributes(&span.attributes),
                    service_name: service_name.clone(),
                    service_version: service_version.clone(),
                    service_instance: service_instance.clone(),
                });
            }
        }
    }
    out
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map(stringify).unwrap_or_default())).collect()
}

fn stringify(value: &AnyValue) -> String {
    use any_value::Value;
    match &value.value {
        None => String::new(),
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BytesValue(b)) => hex(b),
        Some(Value::ArrayValue(a)) => {
            format!("[{}]", a.values.iter().map(stringify).collect::<Vec<_>>().join(", "))
        }
        Some(Value::KvlistValue(l)) => format!(
            "{{{}}}",
            l.values
                .iter()
                .map(|kv| format!("{}: {}", kv.key, kv.value.as_ref().map(stringify).unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        // Only used with a dictionary-encoded profile, never in traces.
        Some(Value::StringValueStrindex(i)) => format!("strindex:{i}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}
