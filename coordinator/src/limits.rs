//! What the server lets one caller take: request sizes, requests and streams in flight per connection, deadlines
//! and keepalive (applied by [`crate::server`], defaults of [`crate::config`]).

use std::time::Duration;

/// Largest request a client may send to the API (a tenant spec is well under 4 KiB once its fields are bounded).
pub const MAX_API_REQUEST_BYTES: usize = 1024 * 1024;
/// Largest registration or heartbeat an agent may send.
pub const MAX_AGENT_REQUEST_BYTES: usize = 4 * 1024 * 1024;
/// Requests one connection may have in flight at once.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 256;
/// HTTP/2 streams one connection may have open at once (a member keeps one Raft stream per peer; a client needs
/// a handful): beyond it the client waits, so one connection cannot pin hundreds of half-sent bodies.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 64;
/// How long a unary call may take by default, its body read included (`call_deadline`): a forwarded planning round
/// over a large fleet fits.
pub const UNARY_DEADLINE: Duration = Duration::from_secs(90);
/// How often an idle connection is pinged, and how long a ping may go unanswered before the connection is closed.
pub const KEEPALIVE: Duration = Duration::from_secs(20);
