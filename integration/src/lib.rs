//! # tessera-integration
//!
//! Tests only: multi-process and multi-node tests that start the real binaries (coordinator clusters of three
//! processes on loopback, sim-agents) and inject faults. Grouped by area with numbered cases under `tests/`.
//! The library itself is empty; shared test harness code lands here as the services arrive.
