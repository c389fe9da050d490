//! Helpers shared by the coordinator's integration tests.
#![allow(dead_code)]

pub mod otlp;
