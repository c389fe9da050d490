//! The client side of `coordinator` (like etcdctl): `status`, `tenant add|list|get|rm`, `node list`,
//! `gpu drain|undrain`, `plan show|explain|history|trigger|dump-input`, `member add|rm`, against
//! `--endpoints ADDR,...`. A call goes to the first endpoint that answers; an UNAVAILABLE answer moves on to the
//! leader it names (metadata `tessera-leader`) or to the next endpoint.

use std::time::Duration;

use tessera_proto::v1;
use tessera_proto::v1::coordinator_api_client::CoordinatorApiClient;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use crate::service::LEADER_KEY;

/// A client over several endpoints.
#[derive(Clone)]
pub struct Client {
    endpoints: Vec<String>,
    timeout: Duration,
}

impl Client {
    /// A client of `endpoints` (`HOST:PORT`, with or without `http://`).
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
        Client { endpoints, timeout }
    }

    fn connect(&self, endpoint: &str) -> Result<CoordinatorApiClient<Channel>, Status> {
        let channel = Endpoint::from_shared(endpoint.to_string())
            .map_err(|e| Status::invalid_argument(format!("bad endpoint {endpoint}: {e}")))?
            .connect_timeout(Duration::from_secs(1))
            .timeout(self.timeout)
            .connect_lazy();
        Ok(CoordinatorApiClient::new(channel).max_decoding_message_size(64 * 1024 * 1024))
    }

    /// Runs `call` against the endpoints until one answers something other than UNAVAILABLE.
    pub async fn call<T, F, Fut>(&self, call: F) -> Result<T, Status>
    where
        F: Fn(CoordinatorApiClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let mut queue: Vec<String> = self.endpoints.clone();
        let mut last = Status::unavailable("no endpoint given (--endpoints)");
        let mut tried = 0;
        while let Some(endpoint) = queue.first().cloned() {
            queue.remove(0);
            tried += 1;
            if tried > self.endpoints.len() + 3 {
                break;
            }
            let client = self.connect(&endpoint)?;
            match call(client).await {
                Ok(r) => return Ok(r.into_inner()),
                Err(s)
                    if s.code() == Code::Unavailable
                        || s.code() == Code::Unknown && s.message().contains("connect") =>
                {
                    if let Some(leader) = s.metadata().get(LEADER_KEY).and_then(|v| v.to_str().ok()) {
                        queue.insert(0, format!("http://{leader}"));
                    }
                    last = Status::unavailable(format!("{endpoint}: {}", s.message()));
                }
                Err(s) => return Err(s),
            }
        }
        Err(last)
    }
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
