//! The client side of `coordinator` (like etcdctl): `status`, `tenant add|list|get|rm`, `node list`,
//! `gpu drain|undrain`, `plan show|explain|history|trigger|dump-input`, `member add|rm`, against
//! `--endpoints ADDR,...`. A call goes to the first endpoint that answers; an answer that may come from a failover
//! (no leader yet, not the leader, connection lost) moves on to the leader it names (metadata `tessera-leader`) or
//! to the next endpoint, round after round with a growing pause, until the call's `--timeout`. Writes carry a
//! request id so that a retry is applied once.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::service::{LEADER_KEY, REQUEST_ID_KEY};

/// First pause between two rounds over the endpoints; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// Longest pause between two rounds over the endpoints.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Whether a call may be sent again after an answer that leaves its outcome unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Reads, and writes made idempotent by a request id ([`Client::request`]): retried after any answer that
    /// may be a failover (no leader, not the leader, connection lost, deadline passed on one endpoint).
    Idempotent,
    /// Writes that must not run twice (a planning round, a membership change): retried only when the call
    /// certainly did not run (no leader, not the leader, connection refused).
    Once,
}

/// A client over several endpoints.
#[derive(Clone)]
pub struct Client {
    endpoints: Vec<String>,
    timeout: Duration,
    tls: Option<tessera_auth::TlsFiles>,
}

impl Client {
    /// A client of `endpoints` (`HOST:PORT`, with or without `http://`); `timeout` bounds a whole call, retries
    /// included.
    pub fn new(endpoints: &[String], timeout: Duration) -> Client {
        let endpoints =
            endpoints
                .iter()
                .map(|e| {
                    if e.starts_with("http://") || e.starts_with("https://") {
                        e.clone()
                    } else {
                        format!("http://{e}")
                    }
                })
                .collect();
        Client { endpoints, timeout, tls: None }
    }

    /// Talks mutual TLS with `tls`: this client's certificate (its role), checked by the cluster, and the
    /// coordinators' certificates checked against the CA and [`tessera_auth::COORDINATOR_SERVER_NAME`].
    pub fn with_tls(mut self, tls: Option<tessera_auth::TlsFiles>) -> Client {
        self.tls = tls;
        self
    }

    fn connect(&self, endpoint: &str, left: Duration) -> Result<CoordinatorApiClient<Channel>, Status> {
        let tls = self.tls.as_ref().map(|f| (f, tessera_auth::COORDINATOR_SERVER_NAME));
        let channel = crate::net::channel(endpoint, Duration::from_secs(1).min(left), Some(left), tls)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(CoordinatorApiClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// A request carrying a fresh request id, so that [`Client::call`] may resend it through another endpoint
    /// during an election and the cluster applies it once. Build it inside the call's closure from one id made
    /// before the call ([`Client::new_request_id`]).
    pub fn request<T>(message: T, id: &str) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Ok(v) = id.parse() {
            r.metadata_mut().insert(REQUEST_ID_KEY, v);
        }
        r
    }

    /// A request id unique to this process and moment.
    pub fn new_request_id() -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        format!("{}-{nanos:x}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// Runs an idempotent `call` ([`Retry::Idempotent`]).
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, Status>
    where
        F: Fn(CoordinatorApiClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        self.call_with(Retry::Idempotent, call).await
    }

    /// Runs `call` against the endpoints, the leader named by a refusal first, round after round with a growing
    /// pause, until one answers something that is not worth retrying or the client's timeout has passed.
    pub async fn call_with<T, F, Fut>(&self, retry: Retry, call: F) -> Result<T, Status>
    where
        F: Fn(CoordinatorApiClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        if self.endpoints.is_empty() {
            return Err(Status::invalid_argument("no endpoint given (--endpoints)"));
        }
        let deadline = Instant::now() + self.timeout;
        let mut backoff = FIRST_BACKOFF;
        let mut last = Status::unavailable("no endpoint answered");
        let mut hint: Option<String> = None;
        loop {
            let mut round: Vec<String> = hint.take().into_iter().collect();
            round.extend(self.endpoints.iter().cloned());
            for endpoint in round {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(timed_out(last, self.timeout));
                }
                let client = self.connect(&endpoint, left)?;
                let answer = match tokio::time::timeout(left, call(client)).await {
                    Ok(a) => a,
                    Err(_) => Err(Status::deadline_exceeded("no answer before the deadline")),
                };
                match answer {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s) if retryable(&s, retry) => {
                        if let Some(leader) = s.metadata().get(LEADER_KEY).and_then(|v| v.to_str().ok()) {
                            let leader = format!("http://{leader}");
                            if leader != endpoint && hint.is_none() {
                                hint = Some(leader);
                            }
                        }
                        last = Status::new(s.code(), format!("{endpoint}: {}", s.message()));
                        if hint.is_some() {
                            break;
                        }
                    }
                    Err(s) => return Err(s),
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(last, self.timeout));
            }
            if hint.is_none() {
                tokio::time::sleep(backoff.min(left)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Whether an answer is worth trying again elsewhere (or later).
fn retryable(s: &Status, retry: Retry) -> bool {
    let never_ran = s.code() == Code::Unavailable
        && (s.metadata().get(LEADER_KEY).is_some()
            || s.message().contains("no leader")
            || s.message().contains("not the leader")
            || s.message().contains("connect")
            || s.message().contains("refused"));
    match retry {
        Retry::Once => never_ran,
        Retry::Idempotent => {
            never_ran
                || matches!(s.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled)
                || s.code() == Code::Unknown && (s.message().contains("connect") || s.message().contains("transport"))
        }
    }
}

fn timed_out(last: Status, timeout: Duration) -> Status {
    Status::new(
        last.code(),
        format!("gave up after {} (--timeout); last answer: {}", humantime::format_duration(timeout), last.message()),
    )
}

/// Renders a layout for people.
pub fn layout_text(l: &Option<v1::Layout>) -> String {
    match l {
        Some(l) if !l.placements.is_empty() => {
            l.placements.iter().map(|p| format!("{}@{}", p.profile, p.start)).collect::<Vec<_>>().join(" ")
        }
        _ => "(empty)".into(),
    }
}

/// Renders assignments for people.
pub fn assignments_text(a: &[v1::Assignment]) -> String {
    a.iter()
        .map(|a| {
            let p = a.placement.as_ref().map(|p| format!("{}@{}", p.profile, p.start)).unwrap_or_default();
            let role = if a.role == v1::Role::Retraining as i32 { "train" } else { "serve" };
            format!("{p}:{}:{role}{}", a.tenant, if a.preinit { "(preinit)" } else { "" })
        })
        .collect::<Vec<_>>()
        .join(", ")
}
