//! The HTTP front end: `http://ROUTER/t/TENANT/PATH` to a ready instance of the tenant (see the crate doc).

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::Routes;

/// Largest request body forwarded.
pub const MAX_BODY_BYTES: usize = 16 << 20;
/// The stats entry of requests for tenants the routes do not know.
pub const UNKNOWN_TENANT: &str = "(unknown)";
/// Longest an instance may take to answer one request.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(30);

/// One tenant's request counts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TenantStats {
    /// Requests received for it.
    pub requests: u64,
    /// Requests answered by an instance (whatever its status other than 503).
    pub forwarded: u64,
    /// Attempts sent to another instance after one refused (connection refused or 503).
    pub retries: u64,
    /// Requests that waited for a ready instance.
    pub held: u64,
    /// The longest such wait, ms.
    pub max_hold_ms: u64,
    /// Requests given up after `--hold` without a ready instance (answered 503).
    pub dropped: u64,
}

/// The front end: see the [module documentation](self).
pub struct Router {
    routes: watch::Receiver<Routes>,
    client: Client<HttpConnector, Full<Bytes>>,
    hold: Duration,
    turn: AtomicUsize,
    stats: Mutex<BTreeMap<String, TenantStats>>,
}

/// Headers that belong to one connection, not to the request or answer (RFC 9110, section 7.6.1): never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the hop-by-hop headers, and those the `Connection` header names, from `headers`.
fn strip_hop_by_hop(headers: &mut hyper::HeaderMap) {
    let named: Vec<String> = headers
        .get_all(hyper::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(',').map(|n| n.trim().to_ascii_lowercase()))
        .collect();
    for h in HOP_BY_HOP.iter().map(|h| h.to_string()).chain(named) {
        headers.remove(h.as_str());
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r
}

fn json(value: &impl Serialize) -> Response<Full<Bytes>> {
    let mut r = text(StatusCode::OK, serde_json::to_string_pretty(value).unwrap_or_default());
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

impl Router {
    /// A router over `routes` that holds requests up to `hold` while their tenant has no ready instance.
    pub fn new(routes: watch::Receiver<Routes>, hold: Duration) -> Arc<Router> {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(1)));
        let client = Client::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(http);
        Arc::new(Router { routes, client, hold, turn: AtomicUsize::new(0), stats: Mutex::new(BTreeMap::new()) })
    }

    /// The counts per tenant.
    pub fn stats(&self) -> BTreeMap<String, TenantStats> {
        self.stats.lock().expect("stats lock").clone()
    }

    fn count(&self, tenant: &str, f: impl FnOnce(&mut TenantStats)) {
        f(self.stats.lock().expect("stats lock").entry(tenant.to_string()).or_default());
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(self: Arc<Self>, listener: TcpListener, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        loop {
            let (stream, _) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        continue;
                    }
                },
                () = &mut shutdown => return,
            };
            let _ = stream.set_nodelay(true);
            let router = self.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let router = router.clone();
                    async move { Ok::<_, Infallible>(router.handle(req).await) }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(true)
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    }

    /// Answers one request.
    pub async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let path = req.uri().path().to_string();
        if path == "/_tessera/stats" {
            return json(&self.stats());
        }
        if path == "/_tessera/routes" {
            let routes = self.routes.borrow().clone();
            return json(&routes);
        }
        let Some(rest) = path.strip_prefix("/t/") else {
            return text(StatusCode::NOT_FOUND, "use /t/TENANT/PATH (or /_tessera/stats, /_tessera/routes)\n");
        };
        let (tenant, tail) = match rest.split_once('/') {
            Some((t, tail)) => (t.to_string(), format!("/{tail}")),
            None => (rest.to_string(), "/".to_string()),
        };
        let query = req.uri().query().map(|q| format!("?{q}")).unwrap_or_default();
        let (mut parts, body) = req.into_parts();
        let body = match Limited::new(body, MAX_BODY_BYTES).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => return text(StatusCode::PAYLOAD_TOO_LARGE, format!("request body: {e}\n")),
        };
        strip_hop_by_hop(&mut parts.headers);
        parts.headers.remove(hyper::header::HOST);
        // Counted per tenant the routes know or knew (one whose instances are all gone for a moment, in a
        // reconfiguration without free slices, is still that tenant); requests for any other name share one entry
        // (bounded).
        let known =
            self.routes.borrow().contains_key(&tenant) || self.stats.lock().expect("stats lock").contains_key(&tenant);
        let counted = if known { tenant.as_str() } else { UNKNOWN_TENANT };
        self.count(counted, |s| s.requests += 1);
        self.forward(counted, &tenant, &format!("{tail}{query}"), &parts, body).await
    }

    /// Sends the request to a ready instance of `tenant`, skipping those that refuse it, holding while there is none.
    async fn forward(
        &self,
        counted: &str,
        tenant: &str,
        path: &str,
        parts: &hyper::http::request::Parts,
        body: Bytes,
    ) -> Response<Full<Bytes>> {
        let started = Instant::now();
        let deadline = started + self.hold;
        let mut refused: BTreeSet<String> = BTreeSet::new();
        let mut routes = self.routes.clone();
        let mut held = false;
        loop {
            let candidates: Vec<String> = routes
                .borrow_and_update()
                .get(tenant)
                .map(|v| {
                    v.iter().filter(|u| u.ready() && !refused.contains(&u.address)).map(|u| u.address.clone()).collect()
                })
                .unwrap_or_default();
            if candidates.is_empty() {
                let now = Instant::now();
                if now >= deadline {
                    self.count(counted, |s| s.dropped += 1);
                    return text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        format!("no ready instance of tenant {tenant} within {:?}\n", self.hold),
                    );
                }
                if !held {
                    held = true;
                    self.count(counted, |s| s.held += 1);
                }
                // Wait for new routes; instances that refused are tried again only once the routes changed (a
                // request is not sent to the same draining instance every few milliseconds).
                if tokio::time::timeout((deadline - now).min(Duration::from_millis(50)), routes.changed()).await.is_ok()
                {
                    refused.clear();
                }
                continue;
            }
            let address = &candidates[self.turn.fetch_add(1, Ordering::Relaxed) % candidates.len()];
            let mut builder = Request::builder().method(parts.method.clone()).uri(format!("http://{address}{path}"));
            for (k, v) in &parts.headers {
                builder = builder.header(k, v);
            }
            let Ok(upstream) = builder.body(Full::new(body.clone())) else {
                return text(StatusCode::BAD_REQUEST, "cannot forward this request\n");
            };
            let answer = tokio::time::timeout(UPSTREAM_TIMEOUT, self.client.request(upstream)).await;
            let retry = match answer {
                Ok(Ok(resp)) if resp.status() != StatusCode::SERVICE_UNAVAILABLE => {
                    let (mut rparts, rbody) = resp.into_parts();
                    let collected =
                        tokio::time::timeout(UPSTREAM_TIMEOUT, Limited::new(rbody, MAX_BODY_BYTES).collect()).await;
                    let bytes = match collected {
                        Ok(Ok(b)) => b.to_bytes(),
                        // The instance went away mid-answer, stalled or answered too much: the request may have
                        // run; not retried.
                        _ => return text(StatusCode::BAD_GATEWAY, format!("{address}: the answer was cut\n")),
                    };
                    strip_hop_by_hop(&mut rparts.headers);
                    if let Ok(v) = hyper::header::HeaderValue::from_str(address) {
                        rparts.headers.insert("x-tessera-upstream", v);
                    }
                    // Answered as this server speaks (an HTTP/1.0 upstream's version is not the client's).
                    rparts.version = hyper::Version::HTTP_11;
                    let waited = started.elapsed().as_millis() as u64;
                    self.count(counted, |s| {
                        s.forwarded += 1;
                        if held {
                            s.max_hold_ms = s.max_hold_ms.max(waited);
                        }
                    });
                    return Response::from_parts(rparts, Full::new(bytes));
                }
                Ok(Ok(_)) => true,
                // A connection that could not be made did not run the request: safe to send elsewhere.
                Ok(Err(e)) if e.is_connect() => true,
                Ok(Err(e)) => {
                    return text(StatusCode::BAD_GATEWAY, format!("{address}: {e}\n"));
                }
                Err(_) => return text(StatusCode::GATEWAY_TIMEOUT, format!("{address}: no answer within 30 s\n")),
            };
            if retry {
                refused.insert(address.clone());
                self.count(counted, |s| s.retries += 1);
            }
        }
    }
}
