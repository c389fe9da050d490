//! Workload time for the simulated hardware: a [`VirtualClock`] that only its owner moves, or
//! the [`WallClock`].
//!
//! The device state machine ([`super::SimGpu`]) takes time as an argument; only [`super::SimBackend`] reads a clock,
//! to stamp each call and to wait for its simulated latency. Under a virtual clock nothing waits: a call returns at
//! once and reports, in virtual time, when its effect is complete; the driver (replay, a test) advances the clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tessera_core::time::SimTime;

/// A source of workload time.
pub trait Clock: Send + Sync {
    /// The current time.
    fn now(&self) -> SimTime;

    /// Returns once the clock reads `t` or later. A wall clock sleeps; a virtual clock returns at once (its time
    /// moves only when its owner advances it, and the caller works with the reported completion time instead).
    fn wait_until(&self, t: SimTime);
}

/// Virtual time, moved only by [`VirtualClock::advance`] and [`VirtualClock::advance_to`]; it never goes back.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now_ms: AtomicU64,
}

impl VirtualClock {
    /// A clock reading `start`.
    pub fn new(start: SimTime) -> VirtualClock {
        VirtualClock { now_ms: AtomicU64::new(start.as_ms()) }
    }

    /// Moves the clock `ms` forward; returns the new time.
    pub fn advance(&self, ms: u64) -> SimTime {
        SimTime(self.now_ms.fetch_add(ms, Ordering::SeqCst) + ms)
    }

    /// Moves the clock to `t` if `t` is later; returns the time afterwards.
    pub fn advance_to(&self, t: SimTime) -> SimTime {
        SimTime(self.now_ms.fetch_max(t.as_ms(), Ordering::SeqCst).max(t.as_ms()))
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> SimTime {
        SimTime(self.now_ms.load(Ordering::SeqCst))
    }

    fn wait_until(&self, _t: SimTime) {}
}

/// Real time: milliseconds elapsed since the clock was made, plus a starting time.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    origin: Instant,
    start: SimTime,
}

impl WallClock {
    /// A wall clock reading zero now.
    pub fn new() -> WallClock {
        WallClock::starting_at(SimTime::ZERO)
    }

    /// A wall clock reading `start` now (e.g. milliseconds since the Unix epoch in production).
    pub fn starting_at(start: SimTime) -> WallClock {
        WallClock { origin: Instant::now(), start }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        WallClock::new()
    }
}

impl Clock for WallClock {
    fn now(&self) -> SimTime {
        let elapsed_ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.start + elapsed_ms
    }

    fn wait_until(&self, t: SimTime) {
        // Sleep can wake early on some platforms: loop until the clock agrees.
        loop {
            let left_ms = t.saturating_since(self.now());
            if left_ms == 0 {
                return;
            }
            std::thread::sleep(Duration::from_millis(left_ms));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_moves_only_forward_and_only_when_told() {
        let c = VirtualClock::new(SimTime::from_secs(1));
        c.wait_until(SimTime::from_secs(100));
        assert_eq!(c.now(), SimTime::from_secs(1), "waiting does not move virtual time");
        assert_eq!(c.advance(250), SimTime::from_ms(1250));
        assert_eq!(c.advance_to(SimTime::from_ms(1000)), SimTime::from_ms(1250), "never backwards");
        assert_eq!(c.advance_to(SimTime::from_secs(2)), SimTime::from_secs(2));
        assert_eq!(c.now(), SimTime::from_secs(2));
    }

    #[test]
    fn the_wall_clock_waits_until_it_reads_the_target() {
        let c = WallClock::starting_at(SimTime::from_secs(5));
        let target = c.now() + 3;
        c.wait_until(target);
        assert!(c.now() >= target);
        c.wait_until(SimTime::ZERO); // a past time returns at once
    }
}
