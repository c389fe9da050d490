//! Every gRPC channel the coordinator opens (to peers, to the leader when forwarding, to agents, and the client's):
//! one constructor, so that none can sit on a dead connection.
//!
//! A connection whose peer vanished (a cut link, a host that lost power) gives no error by itself: without help a
//! request written into it waits in the kernel's send buffer until the link heals, possibly many seconds later, and
//! is then delivered as if it were new. Three settings bound that:
//! - HTTP/2 keepalive pings every [`KEEPALIVE_INTERVAL`], even when idle; no answer within [`KEEPALIVE_TIMEOUT`]
//!   closes the connection, so the next call opens a fresh one;
//! - `TCP_USER_TIMEOUT` ([`USER_TIMEOUT`], Linux): data left unacknowledged that long aborts the connection in the
//!   kernel, which also discards what was queued in it;
//! - TCP keepalive probes, for connections with nothing in flight.
//!
//! What was already sent is bounded separately: proposals carry a deadline ([`crate::state::Proposal`]) that a
//! leader checks when they arrive.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use tessera_auth::TlsFiles;
use tonic::transport::{Channel, Endpoint};

/// Interval of HTTP/2 keepalive pings.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// How long a keepalive ping may go unanswered before the connection is closed.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(2);
/// `TCP_USER_TIMEOUT`: how long sent data may stay unacknowledged before the kernel aborts the connection.
pub const USER_TIMEOUT: Duration = Duration::from_secs(3);
/// Idle time before TCP keepalive probes start.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(5);

/// A channel that cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum ChannelError {
    /// The address is not `HOST:PORT` or a URL.
    #[error("bad address {address}: {source}")]
    Address {
        /// The address given.
        address: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// This process's certificate files cannot be read.
    #[error("{0}")]
    Certificate(#[from] tessera_auth::AuthError),
    /// The TLS settings are refused.
    #[error("TLS settings for {address}: {source}")]
    Tls {
        /// The address given.
        address: String,
        /// Why.
        source: tonic::transport::Error,
    },
}

/// A lazily connected channel to `address` (`HOST:PORT`, or a URL), with the settings above, a connect timeout,
/// when given a deadline for each call, and with `tls` mutual TLS (this process's certificate, the server checked
/// against the CA and the name `server_name`).
pub fn channel(
    address: &str,
    connect_timeout: Duration,
    call_timeout: Option<Duration>,
    tls: Option<(&TlsFiles, &str)>,
) -> Result<Channel, ChannelError> {
    let host = address.strip_prefix("http://").or_else(|| address.strip_prefix("https://")).unwrap_or(address);
    let uri = if tls.is_some() { format!("https://{host}") } else { format!("http://{host}") };
    let mut endpoint = Endpoint::from_shared(uri)
        .map_err(|source| ChannelError::Address { address: address.to_string(), source })?
        .connect_timeout(connect_timeout)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true);
    if let Some(t) = call_timeout {
        endpoint = endpoint.timeout(t);
    }
    if let Some((files, server_name)) = tls {
        // Read at each new channel, so renewed certificate files take effect without a restart.
        let config = files.client(server_name)?;
        endpoint =
            endpoint.tls_config(config).map_err(|source| ChannelError::Tls { address: address.to_string(), source })?;
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_keepalive(Some(TCP_KEEPALIVE));
    #[cfg(target_os = "linux")]
    http.set_tcp_user_timeout(Some(USER_TIMEOUT));
    Ok(endpoint.connect_with_connector_lazy(http))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn addresses_with_or_without_a_scheme_make_channels_and_bad_ones_are_named() {
        channel("127.0.0.1:1", Duration::from_secs(1), None, None).unwrap();
        channel("http://127.0.0.1:1", Duration::from_secs(1), Some(Duration::from_secs(2)), None).unwrap();
        let e = channel("bad host:1", Duration::from_secs(1), None, None).unwrap_err();
        assert!(matches!(e, ChannelError::Address { .. }) && e.to_string().contains("bad host:1"), "{e}");
    }
}
