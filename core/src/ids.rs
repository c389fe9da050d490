//! Identifier newtypes. Tenant and node ids are operator-chosen names; a GPU is named by its node and its index on
//! that node (`node-1/0`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} id `{value}`: {reason}")]
pub struct IdError {
    /// Which kind of id (`tenant`, `node`, `gpu`).
    pub kind: &'static str,
    /// The offending text.
    pub value: String,
    /// What is wrong.
    pub reason: &'static str,
}

fn check_name(kind: &'static str, value: &str) -> Result<(), IdError> {
    let err = |reason| Err(IdError { kind, value: value.to_string(), reason });
    if value.is_empty() {
        return err("must not be empty");
    }
    if value.len() > 128 {
        return err("must be at most 128 characters");
    }
    if !value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return err("may only contain ASCII letters, digits, `-`, `_` and `.`");
    }
    Ok(())
}

macro_rules! name_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Checks and wraps a name: 1 to 128 characters of ASCII letters, digits, `-`, `_`, `.`.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                check_name($kind, &value)?;
                Ok(Self(value))
            }

            /// The name.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        crate::string_serde!($name);
    };
}

name_id!(
    /// A tenant: one continuous-learning workload (an inference service and its retraining job).
    TenantId,
    "tenant"
);
name_id!(
    /// A GPU node (one agent).
    NodeId,
    "node"
);

/// A GPU: the node it is on and its index there (the NVML device index). Written `node/index`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct GpuId {
    /// The node.
    pub node: NodeId,
    /// The device index on the node.
    pub index: u32,
}

impl GpuId {
    /// The GPU at `index` on `node`.
    pub fn new(node: NodeId, index: u32) -> GpuId {
        GpuId { node, index }
    }
}

impl fmt::Display for GpuId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.node, self.index)
    }
}

impl FromStr for GpuId {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (node, index) = s.rsplit_once('/').ok_or(IdError {
            kind: "gpu",
            value: s.to_string(),
            reason: "expected `node/index`, e.g. `node-1/0`",
        })?;
        let index = index.parse().map_err(|_| IdError {
            kind: "gpu",
            value: s.to_string(),
            reason: "the part after `/` must be a device index",
        })?;
        Ok(GpuId { node: NodeId::new(node)?, index })
    }
}

crate::string_serde!(GpuId);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_validate_and_round_trip() {
        assert!(TenantId::new("resnet-eu.1").is_ok());
        let e = TenantId::new("bad id").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid tenant id `bad id`: may only contain ASCII letters, digits, `-`, `_` and `.`"
        );
        assert!(NodeId::new("").is_err());
        let g: GpuId = "node-1/3".parse().unwrap();
        assert_eq!(g, GpuId::new(NodeId::new("node-1").unwrap(), 3));
        assert_eq!(g.to_string(), "node-1/3");
        assert!("node-1".parse::<GpuId>().is_err());
        assert!("node-1/x".parse::<GpuId>().is_err());
        assert_eq!(serde_json::to_string(&g).unwrap(), "\"node-1/3\"");
    }
}
