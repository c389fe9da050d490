//! Arrivals: the unit the executor is fed, and seeded Poisson streams.
//!
//! Each tenant's stream draws exponential gaps from its own ChaCha8 stream (the seed, stream number = the tenant's
//! index), so adding a tenant or changing another tenant's rate never changes a tenant's arrivals.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use super::TenantIndex;

/// One request arriving for a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Arrival {
    /// Workload time of the arrival, ms.
    pub at_ms: f64,
    /// The tenant.
    pub tenant: TenantIndex,
}

/// Poisson arrivals of one tenant at a constant rate over `[from_ms, to_ms)`, in time order.
#[derive(Debug, Clone)]
pub struct PoissonArrivals {
    rng: ChaCha8Rng,
    tenant: TenantIndex,
    mean_gap_ms: f64,
    next_ms: f64,
    to_ms: f64,
}

impl PoissonArrivals {
    /// The stream of `tenant` at `rate_rps` requests per second for `seed`. A rate of zero (or less) gives none.
    pub fn new(seed: u64, tenant: TenantIndex, rate_rps: f64, from_ms: f64, to_ms: f64) -> PoissonArrivals {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(u64::from(tenant.0));
        let mean_gap_ms = if rate_rps > 0.0 { 1000.0 / rate_rps } else { f64::INFINITY };
        let mut s = PoissonArrivals { rng, tenant, mean_gap_ms, next_ms: from_ms, to_ms };
        s.next_ms = from_ms + s.gap();
        s
    }

    fn gap(&mut self) -> f64 {
        // 1 - u is in (0, 1], so the logarithm is finite.
        let u: f64 = self.rng.random();
        -self.mean_gap_ms * (1.0 - u).ln()
    }
}

impl Iterator for PoissonArrivals {
    type Item = Arrival;

    fn next(&mut self) -> Option<Arrival> {
        if self.next_ms.is_nan() || self.next_ms >= self.to_ms {
            return None;
        }
        let at_ms = self.next_ms;
        self.next_ms += self.gap();
        Some(Arrival { at_ms, tenant: self.tenant })
    }
}

/// Poisson arrivals of several tenants (`(tenant, rate_rps)`) over `[from_ms, to_ms)`, merged in time order (ties
/// by tenant index).
pub fn poisson_arrivals(seed: u64, rates: &[(TenantIndex, f64)], from_ms: f64, to_ms: f64) -> Vec<Arrival> {
    let mut out: Vec<Arrival> =
        rates.iter().flat_map(|&(t, rate)| PoissonArrivals::new(seed, t, rate, from_ms, to_ms)).collect();
    out.sort_by(|a, b| a.at_ms.total_cmp(&b.at_ms).then(a.tenant.cmp(&b.tenant)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_streams_have_their_rate_and_are_seeded() {
        let a: Vec<Arrival> = PoissonArrivals::new(7, TenantIndex(0), 500.0, 0.0, 100_000.0).collect();
        // 50 000 expected; the standard deviation is about 224.
        assert!((a.len() as f64 - 50_000.0).abs() < 1_500.0, "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(a.iter().all(|x| (0.0..100_000.0).contains(&x.at_ms)));
        let again: Vec<Arrival> = PoissonArrivals::new(7, TenantIndex(0), 500.0, 0.0, 100_000.0).collect();
        assert_eq!(a, again);
        let other: Vec<Arrival> = PoissonArrivals::new(8, TenantIndex(0), 500.0, 0.0, 100_000.0).collect();
        assert_ne!(a, other);
        // Another tenant's stream is independent of the first's presence.
        let merged = poisson_arrivals(7, &[(TenantIndex(0), 500.0), (TenantIndex(1), 100.0)], 0.0, 100_000.0);
        let only0: Vec<Arrival> = merged.iter().copied().filter(|x| x.tenant == TenantIndex(0)).collect();
        assert_eq!(only0, a);
        assert!(merged.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert_eq!(PoissonArrivals::new(1, TenantIndex(0), 0.0, 0.0, 1e9).count(), 0);
    }
}
