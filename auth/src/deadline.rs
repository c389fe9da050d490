//! A deadline on every unary call, body included: a tower layer over a gRPC server's routes (the coordinator's and
//! the agent's).
//!
//! tonic decodes a unary request's body inside the handler's future, so a client that sends all of a body but its
//! last byte holds the request (and up to its size in memory) for as long as it likes. [`UnaryDeadline`] ends any
//! unary call that has not been answered within its limit with `DEADLINE_EXCEEDED`, which drops the partial body.
//! Streams that live as long as their peer (the coordinator's [`LONG_LIVED`]: the members' Raft streams, route
//! watches) are left alone; their callers are checked before their bodies are read.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

/// The coordinator's methods whose calls last as long as their caller keeps them open.
pub const LONG_LIVED: [&str; 2] = ["/tessera.v1.Raft/StepStream", "/tessera.v1.CoordinatorApi/WatchRoutes"];

/// The layer: every call but `long_lived` ones is answered within `limit`, or ends with `DEADLINE_EXCEEDED`.
#[derive(Debug, Clone, Copy)]
pub struct UnaryDeadline {
    /// The limit.
    pub limit: Duration,
    /// Paths (`/package.Service/Method`) of the streams that are not cut.
    pub long_lived: &'static [&'static str],
}

impl<S> tower::Layer<S> for UnaryDeadline {
    type Service = Deadline<S>;

    fn layer(&self, inner: S) -> Deadline<S> {
        Deadline { inner, limit: self.limit, long_lived: self.long_lived }
    }
}

/// The service [`UnaryDeadline`] wraps a route in.
#[derive(Debug, Clone)]
pub struct Deadline<S> {
    inner: S,
    limit: Duration,
    long_lived: &'static [&'static str],
}

impl<S, B> tower::Service<http::Request<B>> for Deadline<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let long_lived = self.long_lived.contains(&req.uri().path());
        let call = self.inner.call(req);
        let limit = self.limit;
        Box::pin(async move {
            if long_lived {
                return call.await;
            }
            match tokio::time::timeout(limit, call).await {
                Ok(answer) => answer,
                Err(_) => Ok(tonic::Status::deadline_exceeded(format!(
                    "the call was not answered within {limit:?}, its body read included"
                ))
                .into_http()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{Layer as _, Service as _};

    /// A route whose calls never finish (a body that never arrives).
    struct Never;

    impl tower::Service<http::Request<()>> for Never {
        type Response = http::Response<tonic::body::Body>;
        type Error = std::convert::Infallible;
        type Future = std::future::Pending<Result<Self::Response, Self::Error>>;

        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, _: http::Request<()>) -> Self::Future {
            std::future::pending()
        }
    }

    fn request(path: &str) -> http::Request<()> {
        http::Request::builder().uri(format!("http://x{path}")).body(()).unwrap()
    }

    #[tokio::test]
    async fn a_unary_call_that_never_ends_is_cut_and_a_stream_is_not() {
        let mut svc = UnaryDeadline { limit: Duration::from_millis(50), long_lived: &LONG_LIVED }.layer(Never);
        let answer = svc.call(request("/tessera.v1.CoordinatorApi/CreateTenant")).await.unwrap();
        let status = tonic::Status::from_header_map(answer.headers()).unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
        let stream = svc.call(request(LONG_LIVED[0]));
        assert!(tokio::time::timeout(Duration::from_millis(500), stream).await.is_err(), "a Raft stream is not cut");
    }
}
