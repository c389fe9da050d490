//! The HTTP endpoints every Tessera service serves to Prometheus and to its supervisor (Kubernetes probes, systemd):
//!
//! - `GET /metrics`: the service's registry, in OpenMetrics (`application/openmetrics-text`) when the scraper asks for
//!   it in `Accept`, as Prometheus does, and otherwise in the Prometheus text format 0.0.4 (`text/plain`), which
//!   `curl` and `promtool check metrics` read;
//! - `GET /healthz`: 200 while the process serves;
//! - `GET /readyz`: 200 when the service can do its work ([`Exposition::ready`]), 503 with the reason otherwise.
//!
//! The server is bounded like every Tessera server, though it speaks plain HTTP/1.1 to anyone who reaches its port
//! ([`Limits`]): a fixed number of connections (in all and per peer address), request headers read within a few
//! seconds and at most 16 KiB of them, and a connection's whole life bounded (a scraper reconnects).
//!
//! `prometheus-client` encodes OpenMetrics only. The text format differs in what matters here: a counter's `# HELP`
//! and `# TYPE` lines name the sample (`x_total`, not `x`), there are no `# UNIT` lines and no `# EOF`
//! ([`to_prometheus_text`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

/// `Content-Type` of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `Content-Type` of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a service exposes: its metrics, encoded at scrape time, and whether it is ready.
pub trait Exposition: Send + Sync + 'static {
    /// The registry in OpenMetrics text (ending in `# EOF`). Per-object families are best filled here, from the
    /// service's state, so that keeping them costs nothing between scrapes.
    fn openmetrics(&self) -> String;

    /// `Ok` when the service can do its work; otherwise why not (the body of `/readyz`'s 503).
    fn ready(&self) -> Result<(), NotReady>;
}

/// Why a service is not ready, in words for its operator (the body of `/readyz`'s 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

impl From<&str> for NotReady {
    fn from(why: &str) -> NotReady {
        NotReady(why.to_string())
    }
}

impl From<String> for NotReady {
    fn from(why: String) -> NotReady {
        NotReady(why)
    }
}

/// A count or index as a gauge's `i64`, saturating at `i64::MAX`.
pub fn gauge_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `registry` in OpenMetrics text.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry).expect("writing to a String cannot fail");
    out
}

/// OpenMetrics text as the Prometheus text format 0.0.4 (see the crate doc). Families of the types
/// `prometheus-client` writes (counter, gauge, histogram, info) convert exactly.
pub fn to_prometheus_text(openmetrics: &str) -> String {
    let mut counters = std::collections::BTreeSet::new();
    for line in openmetrics.lines() {
        if let Some(name) = line.strip_prefix("# TYPE ").and_then(|r| r.strip_suffix(" counter")) {
            counters.insert(name.to_string());
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].into_iter().find(|p| line.starts_with(p));
        match meta {
            Some(p) => {
                let rest = &line[p.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{p}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Whether an `Accept` header asks for OpenMetrics.
pub fn wants_openmetrics(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| a.split(',').any(|t| t.trim().starts_with("application/openmetrics-text")))
}

/// The router behind [`serve`], to embed the endpoints in another server.
pub fn router<E: Exposition>(exposition: Arc<E>) -> Router {
    Router::new()
        .route("/metrics", get(get_metrics::<E>))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(get_ready::<E>))
        .with_state(exposition)
}

/// What one metrics server allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, in all (a scraper or two and a probe need a handful).
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_per_peer: usize,
    /// How long a request's headers may take to arrive (and an idle kept-alive connection may wait for the next).
    pub header_read_timeout: Duration,
    /// Most bytes of request headers buffered (the least hyper allows is 8 KiB).
    pub max_header_bytes: usize,
    /// How long a connection may live, whatever it does.
    pub connection_lifetime: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            max_per_peer: 16,
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            connection_lifetime: Duration::from_secs(120),
        }
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` for `exposition` on `listener`, within the default [`Limits`], until
/// the listener fails.
pub async fn serve<E: Exposition>(listener: tokio::net::TcpListener, exposition: Arc<E>) -> std::io::Result<()> {
    serve_within(listener, router(exposition), Limits::default()).await
}

/// Serves `router` over HTTP/1.1 on `listener` within `limits` until the listener fails. A connection beyond a
/// limit is closed at once, before anything is read from it.
pub async fn serve_within(listener: tokio::net::TcpListener, router: Router, limits: Limits) -> std::io::Result<()> {
    let open = Arc::new(Open::default());
    let service = hyper_util::service::TowerToHyperService::new(router);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            // A connection that failed before it was accepted, or no descriptors left for a moment: not fatal.
            Err(e) if is_transient(&e) => {
                tracing::debug!(error = %e, "metrics: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(slot) = Open::admit(&open, peer.ip(), &limits) else {
            tracing::debug!(%peer, "metrics: connection refused (too many open)");
            drop(stream);
            continue;
        };
        let service = service.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(limits.max_header_bytes.max(8192));
            let conn = http.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_lifetime, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics: connection ended"),
                Err(_) => tracing::debug!(%peer, "metrics: connection closed at the end of its lifetime"),
            }
        });
    }
}

fn is_transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock)
        || e.raw_os_error().is_some_and(|c| c == 23 || c == 24) // ENFILE, EMFILE
}

/// Connections open, in all and per peer address.
#[derive(Debug, Default)]
struct Open(Mutex<(usize, HashMap<IpAddr, usize>)>);

/// One admitted connection: counted until dropped.
struct Slot {
    open: Arc<Open>,
    peer: IpAddr,
}

impl Open {
    fn admit(open: &Arc<Open>, peer: IpAddr, limits: &Limits) -> Option<Slot> {
        let mut counts = open.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let from_peer = counts.1.get(&peer).copied().unwrap_or(0);
        if counts.0 >= limits.max_connections || from_peer >= limits.max_per_peer {
            return None;
        }
        counts.0 += 1;
        *counts.1.entry(peer).or_insert(0) += 1;
        Some(Slot { open: Arc::clone(open), peer })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut counts = self.open.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        counts.0 -= 1;
        if let Some(n) = counts.1.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                counts.1.remove(&self.peer);
            }
        }
    }
}

async fn get_metrics<E: Exposition>(State(e): State<Arc<E>>, headers: HeaderMap) -> impl IntoResponse {
    let text = e.openmetrics();
    if wants_openmetrics(headers.get(header::ACCEPT).and_then(|v| v.to_str().ok())) {
        ([(header::CONTENT_TYPE, OPENMETRICS)], text)
    } else {
        ([(header::CONTENT_TYPE, PROMETHEUS_TEXT)], to_prometheus_text(&text))
    }
}

async fn get_ready<E: Exposition>(State(e): State<Arc<E>>) -> impl IntoResponse {
    match e.ready() {
        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

/// Runs `promtool check metrics` on `text` when the `PROMTOOL` environment variable names the binary (CI provides
/// it: `.ci/run`); `None` when it does not. `Some(Err)` carries promtool's complaints.
pub fn promtool_check(text: &str) -> Option<Result<(), String>> {
    use std::io::Write;
    let promtool = std::env::var_os("PROMTOOL")?;
    let run = || -> std::io::Result<std::process::Output> {
        let mut child = std::process::Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        child.stdin.take().expect("piped").write_all(text.as_bytes())?;
        child.wait_with_output()
    };
    Some(match run() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))),
        Err(e) => Err(format!("cannot run promtool ({}): {e}", promtool.to_string_lossy())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::Histogram;
    use prometheus_client::registry::Unit;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Sample {
        registry: Registry,
        ready: bool,
    }

    impl Exposition for Sample {
        fn openmetrics(&self) -> String {
            encode(&self.registry)
        }
        fn ready(&self) -> Result<(), NotReady> {
            if self.ready { Ok(()) } else { Err("no leader known".into()) }
        }
    }

    fn sample(ready: bool) -> Sample {
        let mut registry = Registry::with_prefix("tessera_test");
        let c: Family<Vec<(String, String)>, Counter> = Family::default();
        c.get_or_create(&vec![("result".into(), "ok".into())]).inc_by(3);
        registry.register("pushes", "Pushes, by result", c);
        let g = Gauge::<i64>::default();
        g.set(7);
        registry.register("epoch", "Epoch", g);
        let h = Histogram::new([0.1, 1.0]);
        h.observe(0.5);
        registry.register_with_unit("round", "Round time", Unit::Seconds, h);
        Sample { registry, ready }
    }

    #[test]
    fn counters_are_named_by_their_sample_in_the_text_format() {
        let om = sample(true).openmetrics();
        assert!(om.contains("# TYPE tessera_test_pushes counter\n") && om.ends_with("# EOF\n"), "{om}");
        let text = to_prometheus_text(&om);
        assert!(text.contains("# HELP tessera_test_pushes_total Pushes, by result.\n"), "{text}");
        assert!(
            text.contains("# TYPE tessera_test_pushes_total counter\ntessera_test_pushes_total{result=\"ok\"} 3\n")
        );
        assert!(text.contains("# TYPE tessera_test_epoch gauge\ntessera_test_epoch 7\n"), "{text}");
        assert!(text.contains("tessera_test_round_seconds_bucket{le=\"1.0\"} 1\n"), "{text}");
        assert!(!text.contains("# EOF") && !text.contains("# UNIT"), "{text}");
        if let Some(r) = promtool_check(&text) {
            r.unwrap();
        }
    }

    #[test]
    fn prometheus_is_answered_in_openmetrics_and_others_in_text() {
        assert!(wants_openmetrics(Some(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        )));
        assert!(!wants_openmetrics(Some("*/*")));
        assert!(!wants_openmetrics(None));
    }

    async fn http_get(addr: std::net::SocketAddr, path: &str, accept: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_endpoints_answer_over_http() {
        for ready in [true, false] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let server = tokio::spawn(serve(listener, Arc::new(sample(ready))));
            let text = http_get(addr, "/metrics", "*/*").await;
            assert!(text.starts_with("HTTP/1.1 200") && text.contains(PROMETHEUS_TEXT), "{text}");
            assert!(text.contains("tessera_test_pushes_total{result=\"ok\"} 3"), "{text}");
            let om = http_get(addr, "/metrics", "application/openmetrics-text;version=1.0.0").await;
            assert!(om.contains(OPENMETRICS) && om.contains("# EOF"), "{om}");
            assert!(http_get(addr, "/healthz", "*/*").await.starts_with("HTTP/1.1 200"));
            let r = http_get(addr, "/readyz", "*/*").await;
            if ready {
                assert!(r.starts_with("HTTP/1.1 200"), "{r}");
            } else {
                assert!(r.starts_with("HTTP/1.1 503") && r.contains("not ready: no leader known"), "{r}");
            }
            assert!(http_get(addr, "/nope", "*/*").await.starts_with("HTTP/1.1 404"));
            server.abort();
        }
    }

    /// Reads until the server closes the connection (or resets it), and returns what it sent.
    async fn until_closed(s: &mut tokio::net::TcpStream) -> String {
        let mut out = Vec::new();
        // Bounded below hyper's own 30 s header timeout, so that a server without ours fails the test.
        let read = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "the server never closed the connection");
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn slow_headers_big_headers_and_extra_connections_are_cut() {
        let limits = Limits {
            max_connections: 3,
            max_per_peer: 2,
            header_read_timeout: Duration::from_millis(300),
            max_header_bytes: 8192,
            connection_lifetime: Duration::from_secs(600),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_within(listener, router(Arc::new(sample(true))), limits));
        // Headers that never end: the connection is closed once the header timeout passes.
        let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        let answer = until_closed(&mut slow).await;
        assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 408"), "{answer}");
        // Headers beyond the buffer: refused (431) or the connection closed, never buffered.
        let mut big = tokio::net::TcpStream::connect(addr).await.unwrap();
        let header = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(64 * 1024));
        let _ = big.write_all(header.as_bytes()).await;
        let answer = until_closed(&mut big).await;
        assert!(!answer.contains("200 OK"), "{answer}");
        server.abort();
        // Two idle connections from this address fill its share: a third is closed before anything is read.
        let limits = Limits { header_read_timeout: Duration::from_secs(600), ..limits };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve_within(listener, router(Arc::new(sample(true))), limits));
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            // A request answered shows the connection was admitted (and keeps it open: keep-alive).
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", String::from_utf8_lossy(&buf[..n]));
            held.push(s);
        }
        let mut third = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert_eq!(until_closed(&mut third).await, "", "refused unread");
        // Once one closes, a new connection is served again (the count follows connections, not requests).
        drop(held.pop());
        loop {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let _ = s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await;
            let answer = until_closed(&mut s).await;
            if answer.starts_with("HTTP/1.1 200") {
                break;
            }
            assert_eq!(answer, "", "refused connections are closed unread");
            tokio::task::yield_now().await;
        }
        server.abort();
    }
}
