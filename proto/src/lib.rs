//! # tessera-proto
//!
//! The wire contract between Tessera processes (DESIGN.md section 1): `.proto` files, the tonic/prost code generated
//! from them, and conversions to and from `tessera-core` types, one file per type family. No logic.
//!
//! The services arrive with the agent-runtime and coordinator issues; until then this crate holds nothing but this
//! description, so that the workspace layout and dependency direction (`proto -> core`) are fixed from the start.
