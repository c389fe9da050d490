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
    /// `inference` (a server) or `retraining` (a job that takes no requests).
    pub role: String,
    /// `starting`, `ready` or `draining`.
    pub state: String,
}

impl Upstream {
    /// Whether requests may go there: a ready server.
    pub fn ready(&self) -> bool {
        self.state == "ready" && self.role == "inference"
    }
}

/// The word for a wire role.
pub fn role_word(role: i32) -> &'static str {
    match tessera_proto::v1::Role::try_from(role) {
        Ok(tessera_proto::v1::Role::Inference) => "inference",
        Ok(tessera_proto::v1::Role::Retraining) => "retraining",
        _ => "unknown",
    }
}

/// Every tenant's instances, by tenant id.
pub type Routes = BTreeMap<String, Vec<Upstream>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_ready_servers_take_requests() {
        let up = |role: &str, state: &str| Upstream {
            address: "h:1".into(),
            node: "n".into(),
            gpu: 0,
            placement: "3g@0".into(),
            mig_uuid: String::new(),
            role: role.into(),
            state: state.into(),
        };
        assert!(up("inference", "ready").ready());
        assert!(!up("inference", "starting").ready());
        assert!(!up("inference", "draining").ready());
        assert!(!up("retraining", "ready").ready(), "a retraining job takes no requests");
        assert_eq!(role_word(tessera_proto::v1::Role::Retraining as i32), "retraining");
    }
}
