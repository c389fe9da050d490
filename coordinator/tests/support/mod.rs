//! Helpers shared by the coordinator's integration tests.
#![allow(dead_code)]

pub mod cluster;
pub mod otlp;
