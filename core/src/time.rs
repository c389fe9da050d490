//! Time as an explicit value. `core` and `planner` never read a clock: callers pass a [`SimTime`].

use std::fmt;
use std::ops::Add;

use serde::{Deserialize, Serialize};

/// A point in workload time, in milliseconds since the start of the run (or the Unix epoch in production).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SimTime(pub u64);

impl SimTime {
    /// Time zero.
    pub const ZERO: SimTime = SimTime(0);

    /// A time `ms` milliseconds after zero.
    pub const fn from_ms(ms: u64) -> SimTime {
        SimTime(ms)
    }

    /// A time `s` seconds after zero.
    pub const fn from_secs(s: u64) -> SimTime {
        SimTime(s * 1000)
    }

    /// Milliseconds since zero.
    pub const fn as_ms(self) -> u64 {
        self.0
    }

    /// Seconds since zero, as a float.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1000.0
    }

    /// Milliseconds from `earlier` to `self`, zero if `earlier` is later.
    pub const fn saturating_since(self, earlier: SimTime) -> u64 {
        self.0.saturating_sub(earlier.0)
    }

    /// Milliseconds from `earlier` to `self`, `None` if `earlier` is later. (There is deliberately no `-`: a
    /// negative duration is a bug to handle, not to hide.)
    pub const fn checked_since(self, earlier: SimTime) -> Option<u64> {
        self.0.checked_sub(earlier.0)
    }
}

impl Add<u64> for SimTime {
    type Output = SimTime;
    fn add(self, ms: u64) -> SimTime {
        SimTime(self.0 + ms)
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.3}s", self.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_between_times_never_hide_a_negative() {
        let (a, b) = (SimTime::from_secs(2), SimTime::from_ms(2500));
        assert_eq!(b.checked_since(a), Some(500));
        assert_eq!(a.checked_since(b), None);
        assert_eq!(a.saturating_since(b), 0);
        assert_eq!((a + 250).as_ms(), 2250);
        assert_eq!(b.to_string(), "2.500s");
    }
}
