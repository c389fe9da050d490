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

/// A MIG device's UUID as NVML gives it (`nvmlDeviceGetUUID` on a MIG device handle): `MIG-` and a UUID,
/// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (drivers from R470 on). It is what a process names in
/// `CUDA_VISIBLE_DEVICES` (or a container in `NVIDIA_VISIBLE_DEVICES`) to run on one instance. A new instance at the
/// same placement gets a new UUID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MigUuid(pub u128);

impl fmt::Display for MigUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let h = format!("{:032x}", self.0);
        write!(f, "MIG-{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
    }
}

impl FromStr for MigUuid {
    type Err = IdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| IdError { kind: "MIG device", value: s.to_string(), reason };
        let body = s.strip_prefix("MIG-").ok_or(err("expected `MIG-` and a UUID"))?;
        let groups: Vec<&str> = body.split('-').collect();
        let lengths: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lengths != [8, 4, 4, 4, 12] || !groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit())) {
            return Err(err("expected `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in hexadecimal digits"));
        }
        u128::from_str_radix(&groups.concat(), 16).map(MigUuid).map_err(|_| err("not a hexadecimal UUID"))
    }
}

crate::string_serde!(MigUuid);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_uuids_round_trip_and_name_what_is_wrong() {
        let text = "MIG-b5d6a3c0-1f2e-5d4c-9b8a-0123456789ab";
        let u: MigUuid = text.parse().unwrap();
        assert_eq!(u.to_string(), text);
        assert_eq!(serde_json::to_string(&u).unwrap(), format!("\"{text}\""));
        assert_eq!(MigUuid(1).to_string(), "MIG-00000000-0000-0000-0000-000000000001");
        // The pre-R470 form names the GPU and the instance ids; it is not a MIG device UUID of this kind.
        let e = "MIG-GPU-b5d6a3c0-1f2e-5d4c-9b8a-0123456789ab/1/0".parse::<MigUuid>().unwrap_err();
        assert!(e.to_string().contains("MIG-xxxxxxxx"), "{e}");
        assert!("GPU-b5d6a3c0-1f2e-5d4c-9b8a-0123456789ab".parse::<MigUuid>().is_err());
        assert!("MIG-g5d6a3c0-1f2e-5d4c-9b8a-0123456789ab".parse::<MigUuid>().is_err());
    }

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
