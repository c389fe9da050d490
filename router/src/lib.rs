//! # tessera-router
//!
//! The front end a tenant's clients talk to: it follows where each tenant is served now and sends each request to
//! one of the tenant's **ready** instances, so that clients keep one address while Tessera grows, shrinks and moves
//! the instances behind it.
//!
//! - Routes come from the coordinator's `WatchRoutes` stream ([`source::follow_coordinator`], the endpoints the
//!   agents' job supervisors report, following the leader), or, without a coordinator, from polling agents'
//!   `GetState` ([`source::poll_agents`]).
//! - `http://ROUTER/t/TENANT/PATH` is sent to `http://INSTANCE/PATH` ([`proxy::Router`]); instances are taken in
//!   turn. An instance that refuses the connection or answers 503 (a server that is draining or warming up answers
//!   so without doing the work) is skipped and the request goes to the next ready one.
//! - While a tenant has no ready instance (a break-before-make reconfiguration, where the new instance needs the
//!   old one's slices), requests are **held** until one is ready, up to `--hold`; a request still unplaced then is
//!   **dropped** (503) and counted. `GET /_tessera/stats` gives the counts per tenant; `GET /_tessera/routes` the
//!   routes as the router sees them.

pub mod proxy;
pub mod source;

use std::collections::BTreeMap;

use serde::Serialize;

/// One instance of a tenant, as the routes give it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Upstream {
    /// `HOST:PORT`.
    pub address: String,
    /// The node.
    pub node: String,
    /// The GPU index on the node.
    pub gpu: u32,
    /// The instance (`3g@4`).
    pub placement: String,
    /// Its MIG UUID.
    pub mig_uuid: String,
    /// `starting`, `ready` or `draining`.
    pub state: String,
}

impl Upstream {
    /// Whether requests may go there.
    pub fn ready(&self) -> bool {
        self.state == "ready"
    }
}

/// Every tenant's instances, by tenant id.
pub type Routes = BTreeMap<String, Vec<Upstream>>;
