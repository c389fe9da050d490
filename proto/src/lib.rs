//! # tessera-proto
//!
//! The wire contract between Tessera processes: `.proto` files (`proto/tessera/v1/`), the
//! tonic/prost code generated from them ([`v1`]), and conversions to and from `tessera-core` types ([`convert`], one
//! file per type family). No logic: a conversion checks only what the target type itself requires (a known profile,
//! a valid tenant id) and names the field it refuses.
//!
//! ## Services
//! - `tessera.v1.Agent` (served by every node agent): `ApplyLayout` (an epoch-numbered set of GPU targets),
//!   `GetState` (observed instances, desired targets, workload metrics), `AdvanceClock` (virtual workload time, for
//!   replay) and `Arrive` (requests delivered to a simulated node's workload).
//! - `tessera.v1.Coordinator` (served by the coordinator): `Register` and `Heartbeat`, what an agent calls.
//!
//! Code generation runs in `build.rs` with the vendored `protoc` (`protoc-bin-vendored`); no system protoc is needed.

pub mod convert;

/// Generated messages, clients and servers of package `tessera.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("tessera.v1");
}

pub use convert::ConvertError;
