//! The conventions peers use to turn traces into workloads, each seeded: per-minute counts to arrival times, nested
//! sampling of streams, rate scaling (thinning / duplication), ordered uniform points for Poisson-style streams, and
//! the Alibaba `gpu_milli` to MIG-profile mapping.
//!
//! Every random draw comes from a ChaCha8 generator seeded by `(seed, stream key, purpose)`, so a stream's arrivals
//! do not depend on which other streams are sampled: a nested sample gives the shared streams the same arrivals.

use std::fmt;
use std::str::FromStr;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_core::Profile;
use tessera_core::catalog::GpuSpec;

use super::error::TraceError;

/// The generator of one purpose (minute placement, thinning, Poisson counts...) of one stream.
pub(crate) fn stream_rng(seed: u64, key: &str, purpose: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(mix(mix(seed ^ 0x5EED_7E55_E4A0_0001) ^ fnv1a(key.as_bytes()) ^ mix(purpose)))
}

/// Purposes of [`stream_rng`].
pub(crate) mod purpose {
    pub const MINUTES: u64 = 1;
    pub const RATE: u64 = 2;
    pub const POISSON: u64 = 3;
    pub const POINTS: u64 = 4;
    pub const SAMPLE: u64 = 5;
    pub const SYNTHETIC: u64 = 6;
}

/// FNV-1a, 64 bits: a hash that is stable across Rust versions and platforms.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64 finaliser.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// How per-minute invocation counts (Azure Functions 2019) become arrival times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CountsToArrivals {
    /// Each invocation at an independent uniform time in its minute (exact count per minute).
    #[default]
    Uniform,
    /// `N` invocations of a minute at `60 s / N` spacing from the start of the minute (exact count per minute).
    Equidistant,
    /// `N` exponential gaps rescaled so the `N` arrivals fill the minute, the first at its start (exact count per
    /// minute; burstier than equidistant).
    ExpNormalised,
    /// One constant rate per stream over the whole window: the stream's total count placed as a Poisson process
    /// conditioned on that total (exact total, per-minute shape and diurnal pattern dropped).
    PoissonFit,
}

impl CountsToArrivals {
    /// Every convention, in documentation order.
    pub const ALL: [CountsToArrivals; 4] = [
        CountsToArrivals::Uniform,
        CountsToArrivals::Equidistant,
        CountsToArrivals::ExpNormalised,
        CountsToArrivals::PoissonFit,
    ];

    /// The kebab-case name.
    pub const fn name(self) -> &'static str {
        match self {
            CountsToArrivals::Uniform => "uniform",
            CountsToArrivals::Equidistant => "equidistant",
            CountsToArrivals::ExpNormalised => "exp-normalised",
            CountsToArrivals::PoissonFit => "poisson-fit",
        }
    }
}

impl fmt::Display for CountsToArrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for CountsToArrivals {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        let s = s.trim().to_ascii_lowercase();
        let s = if s == "exp-normalized" { "exp-normalised".to_string() } else { s };
        CountsToArrivals::ALL.into_iter().find(|c| c.name() == s).ok_or_else(|| {
            TraceError::invalid("--arrivals", &s, "expected one of uniform, equidistant, exp-normalised, poisson-fit")
        })
    }
}

/// Places `count` arrivals in one 60-second minute (times in `[0, 60)`, unsorted when shifted), appending to `out`.
///
/// With `shift`, every time of the minute moves by one uniform offset in `[0, 60)` modulo 60: the count per minute
/// stays exact and the burst at the start of the minute (equidistant, exp-normalised) is gone.
pub(crate) fn place_in_minute(
    method: CountsToArrivals,
    shift: bool,
    count: u32,
    rng: &mut ChaCha8Rng,
    out: &mut Vec<f64>,
) {
    if count == 0 {
        return;
    }
    let start = out.len();
    let n = count as usize;
    match method {
        CountsToArrivals::Uniform | CountsToArrivals::PoissonFit => {
            out.extend((0..n).map(|_| rng.random::<f64>() * 60.0));
        }
        CountsToArrivals::Equidistant => {
            let gap = 60.0 / n as f64;
            out.extend((0..n).map(|i| i as f64 * gap));
        }
        CountsToArrivals::ExpNormalised => {
            // Gaps g_1..g_n ~ Exp(1); arrival i at 60 * (g_1 + ... + g_{i-1}) / (g_1 + ... + g_n).
            let mut acc = 0.0;
            for _ in 0..n {
                out.push(acc);
                acc += exp1(rng);
            }
            let scale = 60.0 / acc;
            for t in &mut out[start..] {
                *t *= scale;
            }
        }
    }
    if shift {
        let u = rng.random::<f64>() * 60.0;
        for t in &mut out[start..] {
            *t += u;
            if *t >= 60.0 {
                *t -= 60.0;
            }
            // Guard the rounding of `t + u - 60` onto 60.0 itself.
            if *t >= 60.0 {
                *t = 0.0;
            }
        }
    }
}

/// An Exp(1) draw.
#[inline]
pub(crate) fn exp1(rng: &mut ChaCha8Rng) -> f64 {
    -(1.0 - rng.random::<f64>()).ln()
}

/// `n` sorted uniform points on `[lo, hi)`, generated one at a time in increasing order with O(1) memory: the
/// conditional law of the smallest of `k` remaining uniforms on `[u, 1)` is `u + (1 - u) (1 - V^(1/k))`.
#[derive(Debug, Clone)]
pub(crate) struct SortedUniforms {
    lo: f64,
    span: f64,
    remaining: u64,
    u: f64,
}

impl SortedUniforms {
    pub fn new(lo: f64, hi: f64, n: u64) -> SortedUniforms {
        SortedUniforms { lo, span: (hi - lo).max(0.0), remaining: n, u: 0.0 }
    }

    /// The next point, or `None` when all `n` are out.
    pub fn next(&mut self, rng: &mut ChaCha8Rng) -> Option<f64> {
        if self.remaining == 0 {
            return None;
        }
        let v = 1.0 - rng.random::<f64>(); // (0, 1]
        let step = -(v.ln() / self.remaining as f64).exp_m1(); // 1 - V^(1/k), in [0, 1)
        self.u += (1.0 - self.u) * step;
        self.remaining -= 1;
        let t = self.lo + self.u * self.span;
        Some(t.min(self.lo + self.span * (1.0 - f64::EPSILON)).max(self.lo))
    }
}

/// Rate scaling of one stream: each invocation is kept `floor(r)` times plus once more with probability `frac(r)`
/// (`r < 1` thins, `r > 1` duplicates at the same instant).
#[derive(Debug, Clone)]
pub(crate) struct RateScaler {
    whole: u32,
    frac: f64,
}

impl RateScaler {
    pub fn new(rate_scale: f64) -> RateScaler {
        RateScaler { whole: rate_scale.floor() as u32, frac: rate_scale - rate_scale.floor() }
    }

    /// How many copies of one invocation to emit.
    #[inline]
    pub fn copies(&self, rng: &mut ChaCha8Rng) -> u32 {
        if self.frac == 0.0 { self.whole } else { self.whole + u32::from(rng.random::<f64>() < self.frac) }
    }
}

/// Which streams to keep, by popularity (requests in the window).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Sample {
    /// Every stream.
    #[default]
    All,
    /// The `N` most popular streams.
    TopK(usize),
    /// Streams whose popularity quantile lies in `[lo, hi)` (0 = least popular, 1 = most popular; `hi = 1`
    /// includes the most popular), optionally only `N` of them spread over that range.
    Quantile {
        /// Lower quantile, in `[0, 1)`.
        lo: f64,
        /// Upper quantile, in `(lo, 1]`.
        hi: f64,
        /// How many to keep (all in the range when `None`).
        n: Option<usize>,
    },
    /// `N` streams spread over the whole popularity ranking (distribution-preserving).
    Spread(usize),
}

impl fmt::Display for Sample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sample::All => f.write_str("all"),
            Sample::TopK(n) => write!(f, "top-k:{n}"),
            Sample::Quantile { lo, hi, n: None } => write!(f, "quantile:{lo}-{hi}"),
            Sample::Quantile { lo, hi, n: Some(n) } => write!(f, "quantile:{lo}-{hi}:{n}"),
            Sample::Spread(n) => write!(f, "spread:{n}"),
        }
    }
}

impl FromStr for Sample {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        let bad = |reason: &str| TraceError::invalid("--sample", s, reason);
        let usage = "expected all, top-k:N, quantile:LO-HI, quantile:LO-HI:N or spread:N";
        let t = s.trim().to_ascii_lowercase();
        let count = |v: &str| -> Result<usize, TraceError> {
            match v.parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(bad("N must be a positive integer")),
            }
        };
        if t == "all" {
            return Ok(Sample::All);
        }
        if let Some(v) = t.strip_prefix("top-k:").or_else(|| t.strip_prefix("topk:")) {
            return Ok(Sample::TopK(count(v)?));
        }
        if let Some(v) = t.strip_prefix("spread:") {
            return Ok(Sample::Spread(count(v)?));
        }
        if let Some(v) = t.strip_prefix("quantile:") {
            let (range, n) = match v.split_once(':') {
                Some((r, n)) => (r, Some(count(n)?)),
                None => (v, None),
            };
            let (lo, hi) = range.split_once('-').ok_or_else(|| bad(usage))?;
            let lo: f64 = lo.parse().map_err(|_| bad("LO must be a number in [0, 1)"))?;
            let hi: f64 = hi.parse().map_err(|_| bad("HI must be a number in (LO, 1]"))?;
            if !((0.0..1.0).contains(&lo) && hi > lo && hi <= 1.0) {
                return Err(bad("need 0 <= LO < HI <= 1"));
            }
            return Ok(Sample::Quantile { lo, hi, n });
        }
        Err(bad(usage))
    }
}

/// The radical inverse of `i` in base 2 (van der Corput): 0, 1/2, 1/4, 3/4, 1/8, ...
fn van_der_corput(mut i: u64) -> f64 {
    let mut v = 0.0;
    let mut denom = 1.0;
    while i > 0 {
        denom *= 2.0;
        v += (i & 1) as f64 / denom;
        i >>= 1;
    }
    v
}

/// Picks `n` of `m` ranked items spread over the ranking: a randomly rotated van der Corput sequence (collisions go
/// to the next free rank). The first `n` picks do not depend on `n`, so a larger sample contains a smaller one, and
/// every stretch of the ranking is represented in proportion (distribution-preserving).
fn spread_pick(m: usize, n: usize, rotation: f64) -> Vec<usize> {
    let n = n.min(m);
    let mut taken = vec![false; m];
    let mut picks = Vec::with_capacity(n);
    let mut i = 0u64;
    while picks.len() < n {
        let p = (van_der_corput(i) + rotation).fract();
        let mut idx = ((p * m as f64) as usize).min(m - 1);
        while taken[idx] {
            idx = (idx + 1) % m;
        }
        taken[idx] = true;
        picks.push(idx);
        i += 1;
    }
    picks
}

/// Applies `sample` to streams ranked most popular first; returns the kept ranks, most popular first.
pub(crate) fn select(sample: Sample, ranked: usize, seed: u64) -> Vec<usize> {
    let mut rng = stream_rng(seed, "", purpose::SAMPLE);
    let rotation: f64 = rng.random();
    let mut keep: Vec<usize> = match sample {
        Sample::All => (0..ranked).collect(),
        Sample::TopK(n) => (0..ranked.min(n)).collect(),
        Sample::Spread(n) => spread_pick(ranked, n, rotation),
        Sample::Quantile { lo, hi, n } => {
            // Quantile q of the rank counted from the least popular: ascending index a = ranked - 1 - rank.
            let a_lo = (lo * ranked as f64).ceil() as usize;
            let a_hi = if hi >= 1.0 { ranked } else { ((hi * ranked as f64).ceil() as usize).min(ranked) };
            // Ranks (most popular first) covering ascending indices a_lo..a_hi.
            let (r_lo, r_hi) = (ranked - a_hi, ranked - a_lo.min(ranked));
            let span = r_hi.saturating_sub(r_lo);
            match n {
                None => (r_lo..r_hi).collect(),
                Some(n) => spread_pick(span, n, rotation).into_iter().map(|i| r_lo + i).collect(),
            }
        }
    };
    keep.sort_unstable();
    keep
}

/// The compute share (in 1/1000 of a GPU) of a MIG profile: `round(1000 * compute_slices / 7)`, so 1g = 143,
/// 2g = 286, 3g = 429, 4g = 571, 7g = 1000.
pub fn profile_milli(profile: Profile) -> u32 {
    ((1000.0 * f64::from(profile.compute_slices()) / 7.0).round()) as u32
}

/// The MIG profile an Alibaba pod's `gpu_milli` maps to, and what the rounding wastes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MigFit {
    /// The smallest classic profile whose compute share covers the request (and whose memory fits, when a memory
    /// need was given).
    pub profile: Profile,
    /// The profile's compute share, 1/1000 of a GPU.
    pub profile_milli: u32,
    /// `profile_milli - gpu_milli`: compute paid for but not requested.
    pub waste_milli: u32,
}

/// The smallest classic MIG profile (1g, 2g, 3g, 4g, 7g) whose compute share ([`profile_milli`]) covers `gpu_milli`
/// and, when `memory` gives a need in GiB and a GPU model, whose memory on that model fits it. `None` when nothing
/// fits (`gpu_milli` above 1000, or the memory need above the whole GPU).
///
/// The Alibaba trace records no GPU memory per pod (`memory_mib` is host memory), so the replay mapping passes
/// `None` and only compute decides; the waste is then the compute share rounded up.
pub fn mig_fit(gpu_milli: u32, memory: Option<(f64, &GpuSpec)>) -> Option<MigFit> {
    Profile::CLASSIC.into_iter().find_map(|profile| {
        let milli = profile_milli(profile);
        if milli < gpu_milli {
            return None;
        }
        if let Some((need_gib, spec)) = memory {
            let have = spec.profiles.iter().find(|p| p.profile == profile)?.memory_gib;
            if have < need_gib {
                return None;
            }
        }
        Some(MigFit { profile, profile_milli: milli, waste_milli: milli - gpu_milli })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn van_der_corput_prefix() {
        assert_eq!(van_der_corput(0), 0.0);
        assert_eq!(van_der_corput(1), 0.5);
        assert_eq!(van_der_corput(2), 0.25);
        assert_eq!(van_der_corput(3), 0.75);
    }

    #[test]
    fn spread_is_nested_and_distinct() {
        let big = spread_pick(100, 40, 0.3);
        let small = spread_pick(100, 10, 0.3);
        assert_eq!(&big[..10], &small[..]);
        let mut d = big.clone();
        d.sort_unstable();
        d.dedup();
        assert_eq!(d.len(), 40);
    }

    #[test]
    fn sorted_uniforms_are_sorted_and_counted() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut g = SortedUniforms::new(10.0, 20.0, 1000);
        let mut last = 10.0;
        let mut n = 0;
        let mut sum = 0.0;
        while let Some(t) = g.next(&mut rng) {
            assert!(t >= last && t < 20.0);
            last = t;
            n += 1;
            sum += t;
        }
        assert_eq!(n, 1000);
        assert!((sum / 1000.0 - 15.0).abs() < 0.5, "mean {}", sum / 1000.0);
    }
}

/// Synthetic arrivals for the per-row formats: each accepted row keeps its stream and tokens, in file order, but its
/// arrival time is replaced by a renewal process at `rate_rps` (trace time; the first row at 0): exponential gaps
/// (Poisson) when `cv == 1`, Gamma gaps with coefficient of variation `cv` otherwise (burstier above 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SyntheticArrivals {
    /// Mean requests per second, trace time.
    pub rate_rps: f64,
    /// Coefficient of variation of the gaps (1 = Poisson).
    pub cv: f64,
}

impl fmt::Display for SyntheticArrivals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cv == 1.0 {
            write!(f, "poisson:{}", self.rate_rps)
        } else {
            write!(f, "gamma:{}:{}", self.rate_rps, self.cv)
        }
    }
}

impl FromStr for SyntheticArrivals {
    type Err = TraceError;
    fn from_str(s: &str) -> Result<Self, TraceError> {
        let bad = |why: &str| TraceError::invalid("--synthetic-arrivals", s, why);
        let t = s.trim().to_ascii_lowercase();
        let num = |v: &str, what: &str| -> Result<f64, TraceError> {
            match v.parse::<f64>() {
                Ok(x) if x.is_finite() && x > 0.0 => Ok(x),
                _ => Err(bad(&format!("{what} must be a positive number"))),
            }
        };
        if let Some(rate) = t.strip_prefix("poisson:") {
            return Ok(SyntheticArrivals { rate_rps: num(rate, "RATE")?, cv: 1.0 });
        }
        if let Some(rest) = t.strip_prefix("gamma:") {
            let (rate, cv) = rest.split_once(':').ok_or_else(|| bad("expected gamma:RATE:CV"))?;
            return Ok(SyntheticArrivals { rate_rps: num(rate, "RATE")?, cv: num(cv, "CV")? });
        }
        Err(bad("expected poisson:RATE or gamma:RATE:CV"))
    }
}

/// The clock of [`SyntheticArrivals`]: the next arrival time on each call.
#[derive(Debug, Clone)]
pub(crate) struct SyntheticClock {
    spec: SyntheticArrivals,
    gamma: Option<rand_distr::Gamma<f64>>,
    rng: ChaCha8Rng,
    now: f64,
}

impl SyntheticClock {
    pub fn new(spec: SyntheticArrivals, seed: u64) -> SyntheticClock {
        let gamma = (spec.cv != 1.0).then(|| {
            let shape = 1.0 / (spec.cv * spec.cv);
            rand_distr::Gamma::new(shape, 1.0 / (spec.rate_rps * shape)).expect("positive shape and scale")
        });
        SyntheticClock { spec, gamma, rng: stream_rng(seed, "synthetic-arrivals", purpose::SYNTHETIC), now: 0.0 }
    }

    /// The next arrival: the current time, then the clock advances by one gap.
    pub fn tick(&mut self) -> f64 {
        use rand_distr::Distribution;
        let t = self.now;
        let gap = match &self.gamma {
            Some(g) => g.sample(&mut self.rng),
            None => exp1(&mut self.rng) / self.spec.rate_rps,
        };
        self.now += gap;
        t
    }
}
