//! `standin serve`: a stand-in inference server, with the lifecycle of Triton or vLLM as a supervisor sees it.
//!
//! It binds its port at once (a TCP probe sees it listening) but is ready only after `--warmup-ms`, as a server
//! loading its weights. Its HTTP/1.1 API (keep-alive connections work):
//!
//! - `GET /ready`: 200 `ready` once warm and not draining; 503 `warming up` or `draining` otherwise.
//! - `POST /infer` (any body): after the latency, 200 `{"served_by", "instance", "latency_ms"}`; while warming up
//!   or draining, 503 `warming up` or `draining` at once, counted as refused.
//! - `POST /drain[?deadline_ms=N]`: stops admitting requests, then answers once none is in flight (or after N ms,
//!   default 30 000): 200 `{"in_flight_left", "served"}`. Idempotent; a drain never ends.
//! - `GET /stats`: 200 `{"served", "refused", "in_flight", "ready", "draining"}`.
//! - `GET /metrics`: Prometheus text with the counters `standin_requests_total` (served) and
//!   `standin_refused_total`, for the agent's load signal (a job's `metrics`).
//!
//! `instance` is the value of `CUDA_VISIBLE_DEVICES` at start (the MIG instance the supervisor gave the process).
//! The latency is `--latency-ms`, or a model profile's batch-1 latency on the instance
//! ([`ModelProfile::latency_on`]). On SIGTERM or SIGINT the server stops accepting connections, lets the requests
//! in flight finish (for at most 30 s), closes idle connections and exits 0.
//!
//! [`ModelProfile::latency_on`]: tessera_core::model::ModelProfile::latency_on

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde::Serialize;
use tessera_core::catalog::{GpuModel, Profile};
use tessera_core::config::load_model_profile;
use tessera_core::model::REFERENCE_GPU;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{Signals, StandinError, runtime, say};

/// How long a drain waits for the requests in flight when the request names no deadline.
pub const DEFAULT_DRAIN_DEADLINE: Duration = Duration::from_secs(30);

/// How long a shutdown (SIGTERM, SIGINT) waits for the requests in flight before it closes their connections.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// The largest request body `/infer` reads; a larger one is refused with 413.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// Arguments of `standin serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to listen on; port 0 takes any free port (the line printed at start names the one bound).
    #[arg(long, value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Time from start until the server is ready, as a server loading its model.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub warmup_ms: u64,
    /// Latency of every request. Give this or --model.
    #[arg(long, value_name = "MS")]
    pub latency_ms: Option<f64>,
    /// Model profile (TOML, as in configs/models/): every request takes its batch-1 latency on a --profile
    /// instance of --gpu-model. Give this or --latency-ms.
    #[arg(long, value_name = "FILE.toml")]
    pub model: Option<PathBuf>,
    /// GPU model of the instance, with --model [default: A100-40GB].
    #[arg(long, value_name = "GPU")]
    pub gpu_model: Option<GpuModel>,
    /// MIG profile of the instance (1g, 1g.2x, 2g, 3g, 4g, 7g), with --model.
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<Profile>,
    /// The name answers carry in `served_by`.
    #[arg(long, default_value = "standin")]
    pub name: String,
}

impl ServeArgs {
    /// The latency of a request, ms: `--latency-ms`, or the model profile's batch-1 latency on the instance.
    /// Exactly one of the two must be given.
    pub fn request_latency_ms(&self) -> Result<f64, StandinError> {
        let usage = |m: &str| Err(StandinError::Usage(m.to_string()));
        let ms = match (self.latency_ms, &self.model) {
            (Some(_), Some(_)) => return usage("--latency-ms and --model are exclusive: give one of them"),
            (None, None) => {
                return usage("no request latency: give --latency-ms MS, or --model FILE.toml with --profile");
            }
            (Some(_), None) if self.gpu_model.is_some() || self.profile.is_some() => {
                return usage("--gpu-model and --profile apply only with --model");
            }
            (Some(ms), None) => ms,
            (None, Some(path)) => {
                let Some(profile) = self.profile else {
                    return usage("--model needs --profile: the MIG profile of the instance (e.g. 3g)");
                };
                let model = load_model_profile(path)?;
                model.latency_on(self.gpu_model.unwrap_or(REFERENCE_GPU), profile, 1)
            }
        };
        if !(ms >= 0.0 && Duration::try_from_secs_f64(ms / 1000.0).is_ok()) {
            return Err(StandinError::Usage(format!(
                "the request latency must be a number of ms >= 0 that a duration can hold, got {ms:?}"
            )));
        }
        Ok(ms)
    }
}

/// Runs `standin serve`: binds, prints `standin serve listening on ADDR`, serves until SIGTERM or SIGINT, and
/// returns once the requests in flight are done.
pub fn run(args: &ServeArgs) -> Result<(), StandinError> {
    let started = Instant::now();
    let latency_ms = args.request_latency_ms()?;
    let instance = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_default();
    let server =
        Arc::new(Server::new(args.name.clone(), instance, latency_ms, started + Duration::from_millis(args.warmup_ms)));
    runtime()?.block_on(async {
        let listener =
            TcpListener::bind(args.listen).await.map_err(StandinError::io(format!("binding {}", args.listen)))?;
        let addr = listener.local_addr().map_err(StandinError::io("reading the bound address"))?;
        let mut signals = Signals::install()?;
        say(&format!("standin serve listening on {addr}"))?;
        serve(listener, server, signals.stop.recv()).await;
        Ok(())
    })
}

/// Accepts connections on `listener` and serves `server` on them until `shutdown` resolves; then stops
/// accepting, lets every connection finish the request it is serving (for at most [`SHUTDOWN_GRACE`]) and
/// returns.
pub async fn serve(listener: TcpListener, server: Arc<Server>, shutdown: impl Future<Output = ()>) {
    let (stop, stopped) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(stream, Arc::clone(&server), stopped.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: let connections close rather than spin.
                    eprintln!("standin serve: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    stop.send_replace(true);
    let finished =
        tokio::time::timeout(SHUTDOWN_GRACE, async { while connections.join_next().await.is_some() {} }).await.is_ok();
    if !finished {
        eprintln!(
            "standin serve: {} connections still busy after {} s; closing them",
            connections.len(),
            SHUTDOWN_GRACE.as_secs()
        );
        connections.shutdown().await;
    }
}

/// Serves one connection (HTTP/1.1, keep-alive) until the client closes it or `stop` turns true; then finishes
/// the request in progress, if any, and closes it.
async fn serve_connection(stream: TcpStream, server: Arc<Server>, mut stop: watch::Receiver<bool>) {
    let service = service_fn(move |request| {
        let server = Arc::clone(&server);
        async move { Ok::<_, Infallible>(server.handle(request).await) }
    });
    let connection = http1::Builder::new().timer(TokioTimer::new()).serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        // A client that goes away is its own business: nothing to report.
        _ = connection.as_mut() => return,
        _ = stop.wait_for(|stop| *stop) => {}
    }
    connection.as_mut().graceful_shutdown();
    let _ = connection.await;
}

/// The counters of a server; changes are published to whoever waits on them (a drain waits for `in_flight` to
/// reach 0).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Requests answered with 200.
    pub served: u64,
    /// Requests refused with 503 (warming up or draining).
    pub refused: u64,
    /// Requests admitted and not yet answered.
    pub in_flight: u64,
    /// Whether a drain was asked for; it never ends.
    pub draining: bool,
}

/// A stand-in inference server's state and request handling, independent of the transport.
#[derive(Debug)]
pub struct Server {
    name: String,
    instance: String,
    latency_ms: f64,
    latency: Duration,
    ready_at: Instant,
    counters: watch::Sender<Counters>,
}

impl Server {
    /// A server named `name` on `instance` whose requests take `latency_ms` (finite, >= 0), warm from `ready_at`.
    pub fn new(name: String, instance: String, latency_ms: f64, ready_at: Instant) -> Server {
        Server {
            name,
            instance,
            latency_ms,
            latency: Duration::from_secs_f64(latency_ms / 1000.0),
            ready_at,
            counters: watch::Sender::new(Counters::default()),
        }
    }

    /// The counters now.
    pub fn counters(&self) -> Counters {
        *self.counters.borrow()
    }

    /// Whether the warm-up is over.
    pub fn is_warm(&self) -> bool {
        Instant::now() >= self.ready_at
    }

    /// Whether the server admits requests: warm and not draining.
    pub fn is_ready(&self) -> bool {
        self.is_warm() && !self.counters().draining
    }

    /// Answers one request (see the module doc for the API).
    pub async fn handle<B>(&self, request: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let path = request.uri().path();
        match (request.method(), path) {
            (&Method::GET, "/ready") => match self.refusal() {
                None => text(StatusCode::OK, "ready"),
                Some(why) => text(StatusCode::SERVICE_UNAVAILABLE, why),
            },
            (&Method::GET, "/stats") => {
                let c = self.counters();
                let ready = self.is_warm() && !c.draining;
                json_response(&Stats {
                    served: c.served,
                    refused: c.refused,
                    in_flight: c.in_flight,
                    ready,
                    draining: c.draining,
                })
            }
            (&Method::GET, "/metrics") => {
                // Prometheus text, as a serving stack exposes it: the agent reads the load from the requests served.
                let c = self.counters();
                let body = format!(
                    "# HELP standin_requests_total Inference requests served.\n# TYPE standin_requests_total counter\n\
                     standin_requests_total {}\n# HELP standin_refused_total Inference requests refused (warming up or \
                     draining).\n# TYPE standin_refused_total counter\nstandin_refused_total {}\n",
                    c.served, c.refused
                );
                response(StatusCode::OK, "text/plain; version=0.0.4", Bytes::from(body))
            }
            (&Method::POST, "/drain") => match drain_deadline(request.uri().query()) {
                Ok(deadline) => self.drain(deadline).await,
                Err(bad) => text(StatusCode::BAD_REQUEST, &bad.to_string()),
            },
            (&Method::POST, "/infer") => self.infer(request.into_body()).await,
            (_, "/ready" | "/stats" | "/metrics" | "/drain" | "/infer") => {
                text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed")
            }
            _ => text(StatusCode::NOT_FOUND, "not found"),
        }
    }

    /// Why a request would be refused now, if it would.
    fn refusal(&self) -> Option<&'static str> {
        if self.counters().draining {
            Some("draining")
        } else if !self.is_warm() {
            Some("warming up")
        } else {
            None
        }
    }

    async fn infer<B>(&self, body: B) -> Response<Full<Bytes>>
    where
        B: Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        // Read the input whole, as a server does before it runs the model (an unread body would also cost the
        // client its keep-alive connection).
        if let Err(e) = Limited::new(body, MAX_BODY_BYTES).collect().await {
            return text(StatusCode::PAYLOAD_TOO_LARGE, &format!("cannot read the request body: {e}"));
        }
        let admitted = match self.admit() {
            Ok(admitted) => admitted,
            Err(why) => return text(StatusCode::SERVICE_UNAVAILABLE, why),
        };
        tokio::time::sleep(self.latency).await;
        admitted.served();
        json_response(&Inference { served_by: &self.name, instance: &self.instance, latency_ms: self.latency_ms })
    }

    /// Admits a request (counted in flight until the guard goes) or counts it refused. Checked and counted under
    /// one lock, so that a drain either sees the request in flight or the request sees the drain.
    fn admit(&self) -> Result<InFlight<'_>, &'static str> {
        let warm = self.is_warm();
        let mut refusal = None;
        self.counters.send_modify(|c| {
            refusal = if c.draining {
                Some("draining")
            } else if !warm {
                Some("warming up")
            } else {
                None
            };
            match refusal {
                Some(_) => c.refused += 1,
                None => c.in_flight += 1,
            }
        });
        match refusal {
            Some(why) => Err(why),
            None => Ok(InFlight { server: self, served: false }),
        }
    }

    async fn drain(&self, deadline: Duration) -> Response<Full<Bytes>> {
        self.counters.send_modify(|c| c.draining = true);
        let mut counters = self.counters.subscribe();
        // The sender lives as long as `self`, so the wait ends only with the deadline or an idle server.
        let _ = tokio::time::timeout(deadline, async {
            let _ = counters.wait_for(|c| c.in_flight == 0).await;
        })
        .await;
        let c = self.counters();
        json_response(&Drained { in_flight_left: c.in_flight, served: c.served })
    }
}

/// A request in flight: leaves the count when dropped, as served if [`InFlight::served`] was called, otherwise
/// (the client went away and the request was cancelled) uncounted.
struct InFlight<'a> {
    server: &'a Server,
    served: bool,
}

impl InFlight<'_> {
    fn served(mut self) {
        self.served = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let served = self.served;
        // One update, so that whoever sees the request leave the flight also sees it served.
        self.server.counters.send_modify(|c| {
            c.in_flight -= 1;
            c.served += u64::from(served);
        });
    }
}

/// A drain's `deadline_ms` that is not a whole number of milliseconds (as written).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("deadline_ms must be a whole number of milliseconds, got `{0}`")]
struct BadDeadline(String);

/// The `deadline_ms` of a drain's query string, [`DEFAULT_DRAIN_DEADLINE`] without one.
fn drain_deadline(query: Option<&str>) -> Result<Duration, BadDeadline> {
    let value = query.into_iter().flat_map(|q| q.split('&')).find_map(|pair| pair.strip_prefix("deadline_ms="));
    match value {
        None => Ok(DEFAULT_DRAIN_DEADLINE),
        Some(v) => v.parse::<u64>().map(Duration::from_millis).map_err(|_| BadDeadline(v.to_string())),
    }
}

fn text(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    response(status, "text/plain; charset=utf-8", Bytes::from(body.to_string()))
}

/// The answer to `POST /infer`.
#[derive(Serialize)]
struct Inference<'a> {
    served_by: &'a str,
    instance: &'a str,
    latency_ms: f64,
}

/// The answer to `POST /drain`.
#[derive(Serialize)]
struct Drained {
    in_flight_left: u64,
    served: u64,
}

/// The answer to `GET /stats`.
#[derive(Serialize)]
struct Stats {
    served: u64,
    refused: u64,
    in_flight: u64,
    ready: bool,
    draining: bool,
}

fn json_response(value: &impl Serialize) -> Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).expect("answers serialise");
    response(StatusCode::OK, "application/json", Bytes::from(body))
}

fn response(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use serde_json::json;

    use super::*;

    fn args(extra: &[&str]) -> ServeArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let argv = ["standin", "--listen", "127.0.0.1:0"].iter().chain(extra);
        <Cli as clap::Parser>::try_parse_from(argv).unwrap().serve
    }

    fn resnet() -> String {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models/resnet50.toml").display().to_string()
    }

    #[test]
    fn latency_comes_from_the_flag_or_the_model_profile() {
        assert_eq!(args(&["--latency-ms", "12.5"]).request_latency_ms().unwrap(), 12.5);
        // resnet50's table: 3g at batch 1 is 0.534 ms on the reference GPU.
        let ms = args(&["--model", &resnet(), "--gpu-model", "A100-40GB", "--profile", "3g"]).request_latency_ms();
        assert!((ms.unwrap() - 0.534).abs() < 1e-9);
        let model = load_model_profile(Path::new(&resnet())).unwrap();
        let h100 = args(&["--model", &resnet(), "--gpu-model", "H100-80GB", "--profile", "3g"]);
        assert_eq!(h100.request_latency_ms().unwrap(), model.latency_on(GpuModel::H100_80GB, Profile::G3, 1));
    }

    #[test]
    fn latency_errors_name_the_flags() {
        let message = |a: &[&str]| args(a).request_latency_ms().unwrap_err().to_string();
        assert!(message(&[]).contains("--latency-ms") && message(&[]).contains("--model"));
        assert!(message(&["--latency-ms", "1", "--model", &resnet()]).contains("exclusive"));
        assert!(message(&["--model", &resnet()]).contains("--profile"));
        assert!(message(&["--latency-ms", "1", "--profile", "3g"]).contains("only with --model"));
        assert!(message(&["--latency-ms=-1"]).contains("-1"));
        assert!(message(&["--latency-ms", "1e300"]).contains("1e300"));
        let missing = args(&["--model", "/nonexistent.toml", "--profile", "3g"]).request_latency_ms().unwrap_err();
        assert!(missing.to_string().contains("/nonexistent.toml"), "{missing}");
        assert_eq!(missing.exit_code(), 2);
    }

    #[test]
    fn drain_deadlines_parse_from_the_query() {
        assert_eq!(drain_deadline(None), Ok(DEFAULT_DRAIN_DEADLINE));
        assert_eq!(drain_deadline(Some("x=1&deadline_ms=250")), Ok(Duration::from_millis(250)));
        assert_eq!(drain_deadline(Some("deadline_ms=soon")), Err(BadDeadline("soon".into())));
    }

    async fn call(server: &Server, method: Method, uri: &str) -> (StatusCode, String) {
        let request = Request::builder().method(method).uri(uri).body(Full::new(Bytes::new())).unwrap();
        let response = server.handle(request).await;
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_server_refuses_while_warming_up_and_after_a_drain() {
        let cold = Server::new("s".into(), "MIG-1".into(), 1.0, Instant::now() + Duration::from_secs(3600));
        assert_eq!(call(&cold, Method::GET, "/ready").await, (StatusCode::SERVICE_UNAVAILABLE, "warming up".into()));
        assert_eq!(call(&cold, Method::POST, "/infer").await.1, "warming up");

        let server = Server::new("s".into(), "MIG-1".into(), 1.0, Instant::now());
        assert_eq!(call(&server, Method::GET, "/ready").await, (StatusCode::OK, "ready".into()));
        let (status, body) = call(&server, Method::POST, "/infer").await;
        assert_eq!(status, StatusCode::OK);
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body, json!({ "served_by": "s", "instance": "MIG-1", "latency_ms": 1.0 }));
        let (status, body) = call(&server, Method::POST, "/drain?deadline_ms=10").await;
        assert_eq!((status, body.as_str()), (StatusCode::OK, r#"{"in_flight_left":0,"served":1}"#));
        assert_eq!(call(&server, Method::POST, "/infer").await, (StatusCode::SERVICE_UNAVAILABLE, "draining".into()));
        assert_eq!(call(&server, Method::GET, "/ready").await.1, "draining");
        assert_eq!(call(&server, Method::GET, "/infer").await.0, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(call(&server, Method::GET, "/nope").await.0, StatusCode::NOT_FOUND);
        assert_eq!(server.counters(), Counters { served: 1, refused: 1, in_flight: 0, draining: true });
        let stats: serde_json::Value = serde_json::from_str(&call(&server, Method::GET, "/stats").await.1).unwrap();
        assert_eq!(stats, json!({ "served": 1, "refused": 1, "in_flight": 0, "ready": false, "draining": true }));
    }
}
