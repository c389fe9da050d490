//! The HTTP endpoints every Tessera service serves to Prometheus and to its supervisor (Kubernetes probes, systemd):
//!
//! - `GET /metrics`: the service's registry, in OpenMetrics (`application/openmetrics-text`) when the scraper asks for
//!   it in `Accept`, as Prometheus does, and otherwise in the Prometheus text format 0.0.4 (`text/plain`), which
//!   `curl` and `promtool check metrics` read;
//! - `GET /healthz`: 200 while the process serves;
//! - `GET /readyz`: 200 when the service can do its work ([`Exposition::ready`]), 503 with the reason otherwise.
//!
//! `prometheus-client` encodes OpenMetrics only. The text format differs in what matters here: a counter's `# HELP`
//! and `# TYPE` lines name the sample (`x_total`, not `x`), there are no `# UNIT` lines and no `# EOF`
//! ([`to_prometheus_text`]).

use std::sync::Arc;

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
    fn ready(&self) -> Result<(), String>;
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

/// Serves `/metrics`, `/healthz` and `/readyz` for `exposition` on `listener` until the listener fails.
pub async fn serve<E: Exposition>(listener: tokio::net::TcpListener, exposition: Arc<E>) -> std::io::Result<()> {
    axum::serve(listener, router(exposition)).await
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
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Sample {
        registry: Registry,
        ready: bool,
    }

    impl Exposition for Sample {
        fn openmetrics(&self) -> String {
            encode(&self.registry)
        }
        fn ready(&self) -> Result<(), String> {
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
}
