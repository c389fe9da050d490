//! # Forecasting arrival rates
//!
//! Shared by every policy that forecasts (DESIGN: "at least EWMA and a seasonal (time-of-day) forecaster with an error
//! band, evaluated on the shipped traces"). A [`Forecaster`] is fed the measured arrival rate of each successive slot
//! (the slot length is the caller's and fixed) and forecasts the next `horizon` slots as a [`Forecast`]: a mean rate
//! per slot and an error band `low <= mean <= high`, `low >= 0`. Everything here is pure and deterministic.
//!
//! ## Methods
//! Notation: `x_t` is the rate observed in slot `t`, `z` the band half-width in standard deviations ([`DEFAULT_Z`] =
//! 1.64, a two-sided 90 % band if errors were normal), `w` = [`ERROR_ALPHA`] = 0.1 the weight of the error EWMA.
//!
//! - [`Last`] (persistence, the naive baseline): the mean of every future slot is the last observed rate.
//! - [`Ewma`]: level `l_t = alpha * x_t + (1 - alpha) * l_{t-1}`, started at the first observation (`l_0 = x_0`, so
//!   there is no bias towards zero); the forecast is flat, `mean_h = l_t` for every horizon `h`. [`Last`] is exactly
//!   `Ewma` with `alpha = 1`.
//! - [`Seasonal`]: additive Holt-Winters without trend (ETS(A,N,A)) over a period of `m` slots (24 hourly slots for a
//!   day). With phase `p = t mod m` and seasonal index `s_p`:
//!   `l_t = alpha * (x_t - s_p) + (1 - alpha) * l_{t-1}`, then `s_p <- gamma * (x_t - l_t) + (1 - gamma) * s_p`;
//!   `mean_h = max(0, l_t + s_{(t + h) mod m})`. The first full period initialises it (`l` = its mean, `s_p` = each
//!   slot minus that mean); until then it answers with an [`Ewma`] of the same `alpha`. Choices, and why:
//!   * additive rather than multiplicative: traffic has many empty slots (the Alibaba hourly series starts with months
//!     of zeros, half the 10 s slots of the code and functions traces are empty) and a multiplicative index divides
//!     by near-zero levels and indices. A multiplicative prototype, even with indices clamped to `[0.2, 5]`, was
//!     worse than additive on the Alibaba trace (WAPE 0.52 vs 0.47 a day ahead), and unclamped it diverged;
//!   * no trend term (a trend damped to zero): a busy morning must not be extrapolated into the next day;
//!   * the indices are re-centred to sum to zero once per period, moving their mean into the level (this leaves every
//!     forecast unchanged; it only keeps `l` interpretable as the de-seasonalised rate);
//!   * negative means (level plus a negative index) are clamped to zero.
//!
//! Observations: a negative rate is taken as zero; a non-finite one is a missing slot, which [`Ewma`] and [`Last`]
//! skip and [`Seasonal`] fills with its own forecast (so that its phase stays aligned with the slots).
//!
//! ## Error band
//! Every forecaster tracks `sigma^2`, the EWMA (weight `w`) of its own squared one-step errors `(x_t - mean_1)^2`,
//! started at the first error (not at zero). The band is `mean ± z * sigma` for every horizon, with `low` clamped at
//! zero. For [`Seasonal`] the errors are pooled over all phases and are the seasonal forecast's own errors from the
//! end of the first period on (seeded with the fallback EWMA's `sigma^2` at that point). Before any observation, or
//! before a second one, the band has zero width. The band is deliberately not widened with the horizon: it is a
//! one-step band, so its coverage at long horizons is lower than at horizon 1 (see the table below).
//!
//! **Intermittent series.** [`Ewma`] and [`Last`] (and [`Seasonal`] until its first period is complete) also smooth
//! the *sizes* of the non-empty slots on their own, as Croston's method for intermittent demand does: `q_t = alpha *
//! x_t + (1 - alpha) * q_{t-1}` over the slots with `x_t > 0` only (started at the first of them), and the band's high
//! edge is never below `q`: `high = max(mean + z * sigma, q)`. On a stream that never stops, `q` is the level itself
//! and nothing changes. On on/off traffic (the Azure LLM code trace: minutes without a request, then a minute at
//! several times the mean rate) the level and its one-step errors decay through every silence, so a band made of them
//! alone says "nothing will come" just before the next burst; `q` keeps the size a burst has when it comes. The
//! planners that hedge on the band (tessera's level 2 plans for a high scenario too, and level 1 sizes tenants by the
//! band's peak) then keep serving capacity through a lull instead of giving it all to retraining. Measured on 10
//! minutes of the code trace (seeds 1-3, see the README): tessera's goodput +6 to +10 %; on series without empty
//! slots (the default scenario, the main job, the Azure Functions window) every number is unchanged.
//!
//! ## Evaluation
//! [`evaluate`] is a rolling-origin evaluation: for every origin `t >= warmup` with `t + horizon <= n`, the forecaster
//! has observed `x_0 .. x_{t-1}` and forecasts `horizon` slots, compared with `x_t .. x_{t+horizon-1}`. Over all
//! (origin, step) pairs: `MAE = mean |x - mean|`, `WAPE = sum |x - mean| / sum x`, and `coverage` = the fraction of
//! actuals inside `[low, high]`.
//!
//! ## Measured on the bundled traces
//! Produced by `cargo run -p tessera-planner --example forecast_eval --release`.
//!
//! Series (complete slots only): the Azure LLM 2023 code (343 slots, mean 2.56 req/s) and conversation (350 slots,
//! 5.53 req/s) traces and the Azure Functions 2021 sample (120 slots, 0.16 req/s) as arrivals in 10 s slots, warm-up
//! 30 slots; the Alibaba GPU pod creations in 1 h slots (823 slots, 9.87 pods/h) from the first day with at least 24
//! creations (the trace's first 115 days are nearly empty), warm-up 48 slots. `h=H` is 20 slots (200 s) for the 10 s
//! series and 24 slots (a day) for the hourly one. Seasonal periods: 24 h for Alibaba, 1 minute (6 slots) for the
//! functions sample (timer triggers); the one-hour LLM traces have no period to learn.
//!
//! | series, slot | forecaster | MAE h=1 | WAPE h=1 | cover h=1 | h=H | MAE h=H | WAPE h=H | cover h=H |
//! |---|---|---:|---:|---:|---:|---:|---:|---:|
//! | azure-llm-2023-code, 10 s | last | 2.504 | 0.981 | 0.891 | 20 | 3.810 | 1.474 | 0.812 |
//! |  | ewma a=0.3 | 2.729 | 1.070 | 0.920 | 20 | 3.460 | 1.338 | 0.887 |
//! |  | ewma a=0.1 | 2.940 | 1.152 | 0.923 | 20 | 3.237 | 1.252 | 0.907 |
//! | azure-llm-2023-conv, 10 s | last | 0.872 | 0.156 | 0.856 | 20 | 1.016 | 0.178 | 0.824 |
//! |  | ewma a=0.3 | 0.719 | 0.128 | 0.866 | 20 | 0.851 | 0.149 | 0.808 |
//! |  | ewma a=0.1 | 0.730 | 0.130 | 0.875 | 20 | 0.846 | 0.148 | 0.815 |
//! | azure-functions-2021-sample, 10 s | last | 0.236 | 1.683 | 0.889 | 20 | 0.236 | 1.657 | 0.889 |
//! |  | ewma a=0.3 | 0.196 | 1.401 | 0.944 | 20 | 0.196 | 1.371 | 0.946 |
//! |  | ewma a=0.1 | 0.183 | 1.310 | 0.956 | 20 | 0.192 | 1.345 | 0.952 |
//! |  | seasonal p=6 a=0.1 g=0.2 | 0.169 | 1.207 | 0.922 | 20 | 0.185 | 1.298 | 0.937 |
//! | alibaba-openb-2023-pods, 1 h | last | 5.031 | 0.494 | 0.880 | 24 | 6.909 | 0.683 | 0.756 |
//! |  | ewma a=0.3 | 4.550 | 0.447 | 0.894 | 24 | 5.966 | 0.590 | 0.798 |
//! |  | ewma a=0.1 | 5.106 | 0.502 | 0.901 | 24 | 5.596 | 0.554 | 0.853 |
//! |  | seasonal p=24 a=0.1 g=0.2 | 4.348 | 0.427 | 0.888 | 24 | 4.721 | 0.467 | 0.836 |
//!
//! Reading it: on the daily pattern of Alibaba pod creations the seasonal forecaster has the lowest error at both
//! horizons (WAPE 0.47 a day ahead against 0.55 for the best EWMA and 0.68 for persistence). EWMA a=0.3 beats
//! persistence everywhere except one step ahead on the bursty code trace. WAPE near or above 1 on the code and
//! functions series says that at 10 s they are mostly noise (about half their slots are empty), so for them the band
//! matters more than the mean (and on the code trace the intermittent floor lifts the coverage by 0.003-0.007). The
//! one-step band covers 0.86-0.96 of the actuals at `h=1` (nominal 0.90) but only 0.76-0.85 at long horizons on the
//! series that drift (conversation, Alibaba), because it is not widened with `h`.

use serde::{Deserialize, Serialize};
use std::fmt;

use crate::error::InvalidField;

/// Default band half-width in standard deviations of the one-step error (two-sided 90 % for normal errors).
pub const DEFAULT_Z: f64 = 1.64;

/// Weight of the EWMA of squared one-step errors from which every forecaster's band is computed.
pub const ERROR_ALPHA: f64 = 0.1;

/// How far above the band's high edge a slot's measured rate must be to call a replan inside a planning window
/// ([`Forecast::left_band`]; replay's `--replan-on-burst`, a coordinator's `replan_on_burst`).
pub const BURST_FACTOR: f64 = 2.0;

/// The least measured rate, requests per second, that can call such a replan (an idle tenant's first requests do
/// not).
pub const BURST_MIN_RPS: f64 = 1.0;

/// The share of the fleet's forecast rate that the bursts of a slot must add up to before they call a replan of the
/// whole fleet ([`burst_calls_replan`]).
pub const BURST_FLEET_SHARE: f64 = 0.05;

/// Whether one slot's measured rates call a replan inside the window: the rates that leave their band
/// ([`Forecast::left_band`]) exceed [`BURST_FACTOR`] times its high edge by, in all, at least [`BURST_FLEET_SHARE`]
/// of the forecast mean of every tenant. `tenants` gives each tenant's forecast and its rate in slot `k` of it
/// (`None`: nothing measured). One small tenant's jump does not replan a fleet; a burst the fleet must absorb does
/// (measured: `docs/performance.md`, 2026-11-25, planning constants).
pub fn burst_calls_replan<'a>(tenants: impl IntoIterator<Item = (&'a Forecast, Option<f64>)>, k: usize) -> bool {
    let (mut excess, mut fleet) = (0.0, 0.0);
    for (fc, rate) in tenants {
        fleet += at_slot(&fc.mean, k);
        if let Some(rate) = rate.filter(|r| fc.left_band(k, *r)) {
            excess += rate - BURST_FACTOR * at_slot(&fc.high, k);
        }
    }
    excess > 0.0 && excess >= BURST_FLEET_SHARE * fleet
}

/// A forecast series' value in slot `k` (past its end: its last value; empty: zero).
fn at_slot(series: &[f64], k: usize) -> f64 {
    series.get(k).or(series.last()).copied().unwrap_or(0.0)
}

/// Smallest smoothing weight `build` uses when given a non-positive one (see [`ForecasterConfig::build`]).
const MIN_WEIGHT: f64 = 1e-6;

/// A forecast of the next slots: per future slot, the expected arrival rate (requests/s, or whatever unit was
/// observed) and an error band around it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Forecast {
    /// Expected rate of each future slot, first slot first.
    pub mean: Vec<f64>,
    /// Lower edge of the band per slot; `0 <= low <= mean`.
    pub low: Vec<f64>,
    /// Upper edge of the band per slot; `high >= mean`.
    pub high: Vec<f64>,
}

impl Forecast {
    /// A constant forecast of `rate` for `horizon` slots with a zero-width band (a negative or non-finite rate is
    /// taken as zero).
    pub fn flat(rate: f64, horizon: usize) -> Self {
        let rate = if rate.is_finite() { rate.max(0.0) } else { 0.0 };
        Forecast { mean: vec![rate; horizon], low: vec![rate; horizon], high: vec![rate; horizon] }
    }

    /// Number of forecast slots.
    pub fn len(&self) -> usize {
        self.mean.len()
    }

    /// Whether the forecast covers no slot at all.
    pub fn is_empty(&self) -> bool {
        self.mean.is_empty()
    }

    /// Whether `rate`, measured in slot `k` of this forecast (past the horizon: its last slot), leaves the band by
    /// a burst: above [`BURST_FACTOR`] times the band's high edge, and at least [`BURST_MIN_RPS`].
    pub fn left_band(&self, k: usize, rate: f64) -> bool {
        rate >= BURST_MIN_RPS && rate > BURST_FACTOR * at_slot(&self.high, k)
    }

    /// A forecast with the given means and a band of `± z * sigma` around each, `low` clamped at zero.
    fn banded(mean: Vec<f64>, z: f64, sigma: f64) -> Self {
        let half = z * sigma;
        let low = mean.iter().map(|m| (m - half).max(0.0)).collect();
        let high = mean.iter().map(|m| m + half).collect();
        Forecast { mean, low, high }
    }
}

/// Something that learns an arrival-rate series slot by slot and forecasts the next slots.
pub trait Forecaster: Send {
    /// Feeds the measured rate of the next slot. Negative rates are taken as zero; non-finite ones as missing.
    fn observe(&mut self, rate: f64);
    /// Forecasts the `horizon` slots following the last observed one.
    fn forecast(&self, horizon: usize) -> Forecast;
    /// Short stable name of the method (`"last"`, `"ewma"`, `"seasonal"`).
    fn name(&self) -> &'static str;
}

/// An observation as the forecasters use it: `None` when missing (non-finite), negative rates as zero.
fn clean(rate: f64) -> Option<f64> {
    rate.is_finite().then_some(rate.max(0.0))
}

/// A smoothing weight forced into `[MIN_WEIGHT, 1]`; NaN becomes 1.
fn unit_weight(w: f64) -> f64 {
    if w.is_nan() { 1.0 } else { w.clamp(MIN_WEIGHT, 1.0) }
}

/// The EWMA of squared one-step errors behind every band: started at the first error, weight [`ERROR_ALPHA`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct ErrorVar {
    var: f64,
    count: usize,
}

impl ErrorVar {
    fn push(&mut self, err: f64) {
        let sq = err * err;
        self.var = if self.count == 0 { sq } else { ERROR_ALPHA * sq + (1.0 - ERROR_ALPHA) * self.var };
        self.count += 1;
    }

    fn sigma(&self) -> f64 {
        self.var.sqrt()
    }
}

/// Exponentially weighted moving average: a flat forecast at the smoothed level, band from the EWMA of squared
/// one-step errors (see the module documentation).
#[derive(Debug, Clone, PartialEq)]
pub struct Ewma {
    alpha: f64,
    z: f64,
    level: f64,
    seen: usize,
    err: ErrorVar,
    /// The smoothed size of the non-empty slots (zero before the first), the band's floor.
    size: f64,
}

impl Ewma {
    /// An EWMA with smoothing weight `alpha` (forced into `(0, 1]`) and the default band width [`DEFAULT_Z`].
    pub fn new(alpha: f64) -> Self {
        Ewma { alpha: unit_weight(alpha), z: DEFAULT_Z, level: 0.0, seen: 0, err: ErrorVar::default(), size: 0.0 }
    }

    /// The same with a band of `± z` standard deviations (negative or non-finite `z` gives a zero-width band).
    pub fn with_z(mut self, z: f64) -> Self {
        self.z = if z.is_finite() { z.max(0.0) } else { 0.0 };
        self
    }

    /// The smoothing weight.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The current smoothed level (zero before any observation).
    pub fn level(&self) -> f64 {
        self.level
    }

    /// The current one-step error standard deviation `sigma` (zero before two observations).
    pub fn sigma(&self) -> f64 {
        self.err.sigma()
    }

    /// The smoothed rate of the non-empty slots, `q` (zero before the first): the floor of the band's high edge
    /// (see the module documentation).
    pub fn size(&self) -> f64 {
        self.size
    }
}

impl Forecaster for Ewma {
    fn observe(&mut self, rate: f64) {
        let Some(x) = clean(rate) else { return };
        if x > 0.0 {
            self.size = if self.size > 0.0 { self.alpha * x + (1.0 - self.alpha) * self.size } else { x };
        }
        if self.seen == 0 {
            self.level = x;
        } else {
            self.err.push(x - self.level);
            self.level = self.alpha * x + (1.0 - self.alpha) * self.level;
        }
        self.seen += 1;
    }

    fn forecast(&self, horizon: usize) -> Forecast {
        let mut fc = Forecast::banded(vec![self.level; horizon], self.z, self.err.sigma());
        fc.high.iter_mut().for_each(|h| *h = h.max(self.size));
        fc
    }

    fn name(&self) -> &'static str {
        "ewma"
    }
}

/// Persistence ("last value") forecast, the naive baseline: [`Ewma`] with `alpha = 1`.
#[derive(Debug, Clone, PartialEq)]
pub struct Last(Ewma);

impl Last {
    /// A persistence forecaster with the default band width [`DEFAULT_Z`].
    pub fn new() -> Self {
        Last(Ewma::new(1.0))
    }

    /// The same with a band of `± z` standard deviations.
    pub fn with_z(self, z: f64) -> Self {
        Last(self.0.with_z(z))
    }
}

impl Default for Last {
    fn default() -> Self {
        Last::new()
    }
}

impl Forecaster for Last {
    fn observe(&mut self, rate: f64) {
        self.0.observe(rate);
    }

    fn forecast(&self, horizon: usize) -> Forecast {
        self.0.forecast(horizon)
    }

    fn name(&self) -> &'static str {
        "last"
    }
}

/// Time-of-day forecaster: additive Holt-Winters without trend over a period of `period` slots, falling back to an
/// [`Ewma`] until one full period has been seen (see the module documentation for the formulas).
#[derive(Debug, Clone, PartialEq)]
pub struct Seasonal {
    period: usize,
    alpha: f64,
    gamma: f64,
    z: f64,
    fallback: Ewma,
    /// Observations so far (missing ones included: they advance the phase).
    seen: usize,
    /// The first period, collected for initialisation; emptied once used.
    first: Vec<f64>,
    level: f64,
    /// Additive index per phase; empty until initialised.
    season: Vec<f64>,
    err: ErrorVar,
}

impl Seasonal {
    /// A seasonal forecaster over `period` slots (at least 1) with level weight `alpha` and seasonal weight `gamma`
    /// (both forced into `(0, 1]`), default band width [`DEFAULT_Z`].
    pub fn new(period: usize, alpha: f64, gamma: f64) -> Self {
        let period = period.max(1);
        Seasonal {
            period,
            alpha: unit_weight(alpha),
            gamma: unit_weight(gamma),
            z: DEFAULT_Z,
            fallback: Ewma::new(alpha),
            seen: 0,
            first: Vec::with_capacity(period),
            level: 0.0,
            season: Vec::new(),
            err: ErrorVar::default(),
        }
    }

    /// The same with a band of `± z` standard deviations.
    pub fn with_z(mut self, z: f64) -> Self {
        self.fallback = self.fallback.with_z(z);
        self.z = self.fallback.z;
        self
    }

    /// The period in slots.
    pub fn period(&self) -> usize {
        self.period
    }

    /// Whether a full period has been seen (before that, forecasts are the fallback EWMA's).
    pub fn is_seasonal(&self) -> bool {
        !self.season.is_empty()
    }

    /// The seasonal forecast mean `h >= 1` slots after the last observation (only once initialised).
    fn mean_ahead(&self, h: usize) -> f64 {
        let phase = (self.seen + h - 1) % self.period;
        (self.level + self.season[phase]).max(0.0)
    }
}

impl Forecaster for Seasonal {
    fn observe(&mut self, rate: f64) {
        let x = clean(rate);
        if !self.is_seasonal() {
            // Still collecting the first period: a missing value is imputed by the fallback's level.
            let x = x.unwrap_or(self.fallback.level());
            self.fallback.observe(x);
            self.first.push(x);
            self.seen += 1;
            if self.first.len() == self.period {
                let mean = self.first.iter().sum::<f64>() / self.period as f64;
                self.level = mean;
                self.season = self.first.iter().map(|v| v - mean).collect();
                self.first = Vec::new();
                self.err = self.fallback.err;
            }
            return;
        }
        let phase = self.seen % self.period;
        let predicted = self.mean_ahead(1);
        // A missing value is imputed by the forecast, which moves nothing but the phase.
        let x = match x {
            Some(x) => {
                self.err.push(x - predicted);
                self.fallback.observe(x);
                x
            }
            None => predicted,
        };
        let level = self.alpha * (x - self.season[phase]) + (1.0 - self.alpha) * self.level;
        self.season[phase] = self.gamma * (x - level) + (1.0 - self.gamma) * self.season[phase];
        self.level = level;
        self.seen += 1;
        if self.seen.is_multiple_of(self.period) {
            let drift = self.season.iter().sum::<f64>() / self.period as f64;
            self.season.iter_mut().for_each(|s| *s -= drift);
            self.level += drift;
        }
    }

    fn forecast(&self, horizon: usize) -> Forecast {
        if !self.is_seasonal() {
            return self.fallback.forecast(horizon);
        }
        let mean = (1..=horizon).map(|h| self.mean_ahead(h)).collect();
        Forecast::banded(mean, self.z, self.err.sigma())
    }

    fn name(&self) -> &'static str {
        "seasonal"
    }
}

/// Which forecaster to use, as written in configuration (`{"kind": "seasonal", "period_slots": 24, ...}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ForecasterConfig {
    /// Persistence: the last observed rate ([`Last`]).
    Last,
    /// Exponentially weighted moving average ([`Ewma`]).
    Ewma {
        /// Level smoothing weight in `(0, 1]`; larger follows changes faster.
        alpha: f64,
    },
    /// Additive time-of-day seasonal forecaster ([`Seasonal`]).
    Seasonal {
        /// Period in slots (24 for a day of hourly slots, 8640 for a day of 10 s slots); at least 1.
        period_slots: usize,
        /// Level smoothing weight in `(0, 1]`.
        alpha: f64,
        /// Seasonal-index smoothing weight in `(0, 1]`.
        gamma: f64,
    },
}

impl Default for ForecasterConfig {
    /// EWMA with `alpha = 0.3`.
    fn default() -> Self {
        ForecasterConfig::Ewma { alpha: 0.3 }
    }
}

impl ForecasterConfig {
    /// The forecaster a command line names: `last`, `ewma` (alpha 0.3) or `seasonal` (a day of `slot_s` slots,
    /// alpha 0.3, gamma 0.2). Replay and the coordinator read `--forecaster` through this, so both forecast alike.
    pub fn from_name(name: &str, slot_s: f64) -> Result<ForecasterConfig, InvalidField> {
        let slots_per_day = (86_400.0 / slot_s).round().max(1.0) as usize;
        match name {
            "last" => Ok(ForecasterConfig::Last),
            "ewma" => Ok(ForecasterConfig::Ewma { alpha: 0.3 }),
            "seasonal" => Ok(ForecasterConfig::Seasonal { period_slots: slots_per_day, alpha: 0.3, gamma: 0.2 }),
            other => Err(InvalidField::new("forecaster", format!("expected last, ewma or seasonal, got {other:?}"))),
        }
    }

    /// Checks the parameters: weights in `(0, 1]`, period at least 1. The error names the field and the value.
    pub fn validate(&self) -> Result<(), InvalidField> {
        fn weight(field: &str, v: f64) -> Result<(), InvalidField> {
            if v > 0.0 && v <= 1.0 {
                Ok(())
            } else {
                Err(InvalidField::new(field, format!("must be in (0, 1], got {v}")))
            }
        }
        match *self {
            ForecasterConfig::Last => Ok(()),
            ForecasterConfig::Ewma { alpha } => weight("alpha", alpha),
            ForecasterConfig::Seasonal { period_slots, alpha, gamma } => {
                if period_slots == 0 {
                    return Err(InvalidField::new("period_slots", "must be at least 1, got 0"));
                }
                weight("alpha", alpha)?;
                weight("gamma", gamma)
            }
        }
    }

    /// A fresh forecaster with no observations. Meant for validated configurations; it never panics: out-of-range
    /// weights are forced into `(0, 1]` (NaN to 1) and a zero period to 1.
    pub fn build(&self) -> Box<dyn Forecaster> {
        match *self {
            ForecasterConfig::Last => Box::new(Last::new()),
            ForecasterConfig::Ewma { alpha } => Box::new(Ewma::new(alpha)),
            ForecasterConfig::Seasonal { period_slots, alpha, gamma } => {
                Box::new(Seasonal::new(period_slots, alpha, gamma))
            }
        }
    }
}

impl fmt::Display for ForecasterConfig {
    /// A short label: `last`, `ewma a=0.3`, `seasonal p=24 a=0.1 g=0.2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ForecasterConfig::Last => write!(f, "last"),
            ForecasterConfig::Ewma { alpha } => write!(f, "ewma a={alpha}"),
            ForecasterConfig::Seasonal { period_slots, alpha, gamma } => {
                write!(f, "seasonal p={period_slots} a={alpha} g={gamma}")
            }
        }
    }
}

/// Accuracy of a forecaster over a series, from [`evaluate`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ForecastError {
    /// Mean absolute error over all (origin, step) pairs, in the series' unit.
    pub mae: f64,
    /// Weighted absolute percentage error: `sum |error| / sum actual` (0 when both are 0, infinite when only the
    /// actuals are).
    pub wape: f64,
    /// Fraction of actuals inside `[low, high]` (1 when there are no pairs).
    pub coverage: f64,
    /// Number of (origin, step) pairs compared.
    pub points: usize,
}

/// Rolling-origin evaluation of `config` on `series`: from every origin `t >= warmup` that leaves a full `horizon`
/// of actuals, forecast `horizon` slots from `series[..t]` and compare with `series[t..t + horizon]` (see the module
/// documentation). Pairs whose actual is not finite are skipped.
pub fn evaluate(series: &[f64], config: &ForecasterConfig, horizon: usize, warmup: usize) -> ForecastError {
    let mut forecaster = config.build();
    let (mut abs_err, mut actual_sum, mut inside, mut points) = (0.0, 0.0, 0usize, 0usize);
    for (t, &x) in series.iter().enumerate() {
        if horizon > 0 && t >= warmup && t + horizon <= series.len() {
            let fc = forecaster.forecast(horizon);
            for (k, &actual) in series[t..t + horizon].iter().enumerate() {
                if !actual.is_finite() {
                    continue;
                }
                abs_err += (actual - fc.mean[k]).abs();
                actual_sum += actual;
                // A tolerance of a few ulps so that a zero-width band around an exact forecast counts as covering.
                let tol = 1e-9 * actual.abs().max(1.0);
                if fc.low[k] - tol <= actual && actual <= fc.high[k] + tol {
                    inside += 1;
                }
                points += 1;
            }
        }
        forecaster.observe(x);
    }
    if points == 0 {
        return ForecastError { mae: 0.0, wape: 0.0, coverage: 1.0, points: 0 };
    }
    let wape = if actual_sum > 0.0 {
        abs_err / actual_sum
    } else if abs_err == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    ForecastError { mae: abs_err / points as f64, wape, coverage: inside as f64 / points as f64, points }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny deterministic LCG (Knuth's MMIX constants) so the tests need no RNG crate.
    struct Lcg(u64);

    impl Lcg {
        fn uniform(&mut self) -> f64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64
        }

        /// Poisson by Knuth's multiplication method (fine for small means).
        fn poisson(&mut self, mean: f64) -> f64 {
            let limit = (-mean).exp();
            let (mut k, mut p) = (0.0, 1.0);
            loop {
                p *= self.uniform();
                if p <= limit {
                    return k;
                }
                k += 1.0;
            }
        }
    }

    fn assert_well_formed(fc: &Forecast, horizon: usize) {
        assert_eq!(fc.len(), horizon);
        assert_eq!(fc.low.len(), horizon);
        assert_eq!(fc.high.len(), horizon);
        for k in 0..horizon {
            assert!(fc.low[k] >= 0.0, "{fc:?}");
            assert!(fc.low[k] <= fc.mean[k] && fc.mean[k] <= fc.high[k], "{fc:?}");
        }
    }

    #[test]
    fn flat_forecast_and_empty_state() {
        let fc = Forecast::flat(3.5, 4);
        assert_eq!(fc.len(), 4);
        assert!(!fc.is_empty());
        assert_eq!(fc.low, fc.high);
        assert_eq!(Forecast::flat(-1.0, 2).mean, vec![0.0, 0.0]);
        assert!(Forecast::flat(1.0, 0).is_empty());
        for config in [
            ForecasterConfig::Last,
            ForecasterConfig::default(),
            ForecasterConfig::Seasonal { period_slots: 4, alpha: 0.2, gamma: 0.2 },
        ] {
            assert_eq!(config.build().forecast(3), Forecast::flat(0.0, 3), "{config}");
        }
    }

    #[test]
    fn a_burst_leaves_the_band_at_twice_its_high_edge() {
        let fc = Forecast { mean: vec![10.0, 20.0], low: vec![5.0, 10.0], high: vec![15.0, 30.0] };
        assert!(!fc.left_band(0, 30.0) && fc.left_band(0, 30.1));
        assert!(!fc.left_band(1, 60.0) && fc.left_band(1, 60.1));
        // Past the horizon, the last slot's band.
        assert!(!fc.left_band(5, 60.0) && fc.left_band(5, 61.0));
        // An idle forecast: only a rate of at least BURST_MIN_RPS counts.
        let idle = Forecast::flat(0.0, 3);
        assert!(!idle.left_band(0, 0.5) && idle.left_band(0, BURST_MIN_RPS));
        assert!(!Forecast::flat(0.0, 0).left_band(0, 0.0));
    }

    #[test]
    fn only_a_burst_the_fleet_must_absorb_calls_a_replan() {
        let big = Forecast { mean: vec![1000.0], low: vec![900.0], high: vec![1100.0] };
        let small = Forecast { mean: vec![10.0], low: vec![5.0], high: vec![15.0] };
        // The small tenant jumps far out of its band (70 against a high edge of 15), 40 requests per second past
        // twice that edge: under 5 % of the fleet's 1010.
        assert!(!burst_calls_replan([(&big, Some(1000.0)), (&small, Some(70.0))], 0));
        // By 80 (past the horizon: the last slot's band), with the big one silent: 7.9 %.
        assert!(burst_calls_replan([(&big, None), (&small, Some(110.0))], 3));
        // The big tenant bursting out of its band alone.
        assert!(burst_calls_replan([(&big, Some(2300.0)), (&small, Some(10.0))], 0));
        assert!(!burst_calls_replan([(&big, Some(2240.0)), (&small, Some(10.0))], 0));
        // An idle fleet: any burst of at least BURST_MIN_RPS.
        let idle = Forecast::flat(0.0, 1);
        assert!(burst_calls_replan([(&idle, Some(BURST_MIN_RPS))], 0));
        assert!(!burst_calls_replan([(&idle, Some(0.5))], 0));
        assert!(!burst_calls_replan(std::iter::empty(), 0));
    }

    #[test]
    fn ewma_converges_on_a_constant_series_with_a_shrinking_band() {
        let mut ewma = Ewma::new(0.3);
        for x in [2.0, 9.0, 4.0, 7.0, 1.0] {
            ewma.observe(x);
        }
        let initial = ewma.forecast(1).high[0] - ewma.forecast(1).low[0];
        let mut width = f64::INFINITY;
        for _ in 0..300 {
            ewma.observe(5.0);
            let fc = ewma.forecast(2);
            assert_well_formed(&fc, 2);
            let w = fc.high[0] - fc.low[0];
            assert!(w <= width + 1e-12, "band grew from {width} to {w}");
            width = w;
        }
        let fc = ewma.forecast(3);
        assert!((fc.mean[2] - 5.0).abs() < 1e-9, "{fc:?}");
        assert!(initial > 1.0 && width < 1e-5 * initial, "band {initial} wide at first, still {width} at the end");
        assert_eq!(ewma.name(), "ewma");
    }

    #[test]
    fn an_intermittent_series_keeps_its_burst_size_as_the_high_edge() {
        // Quiet, a burst of three slots at 100, then a long silence: the level and its errors decay towards zero,
        // but the band's high edge stays at the size bursts have when they come.
        let mut ewma = Ewma::new(0.3);
        let mut last = Last::new();
        let series = [0.0; 5].into_iter().chain([100.0; 3]).chain([0.0; 20]);
        for x in series {
            ewma.observe(x);
            last.observe(x);
        }
        let fc = ewma.forecast(4);
        assert_well_formed(&fc, 4);
        assert!(fc.mean[0] < 1.0, "the mean follows the silence: {fc:?}");
        assert!(fc.mean[0] + DEFAULT_Z * ewma.sigma() < 50.0, "the error band alone has decayed: {fc:?}");
        assert_eq!(ewma.size(), 100.0);
        assert_eq!(fc.high, vec![100.0; 4]);
        let fc = last.forecast(2);
        assert_eq!((fc.mean[0], fc.high[0]), (0.0, 100.0));
        // A missing slot changes nothing, and the next burst's size is smoothed in.
        ewma.observe(f64::NAN);
        ewma.observe(200.0);
        assert!((ewma.size() - 130.0).abs() < 1e-9, "{}", ewma.size());
    }

    #[test]
    fn a_stream_without_empty_slots_keeps_the_plain_band() {
        let mut ewma = Ewma::new(0.3);
        for x in [5.0, 6.0, 4.0, 7.0, 5.5, 9.0, 3.0] {
            ewma.observe(x);
            let fc = ewma.forecast(2);
            assert_eq!(ewma.size(), ewma.level());
            assert!((fc.high[1] - (ewma.level() + DEFAULT_Z * ewma.sigma())).abs() < 1e-12, "{fc:?}");
        }
    }

    #[test]
    fn ewma_band_uses_the_configured_z() {
        let mut wide = Ewma::new(0.5).with_z(3.0);
        let mut narrow = Ewma::new(0.5).with_z(1.0);
        for x in [1.0, 5.0, 2.0, 8.0] {
            wide.observe(x);
            narrow.observe(x);
        }
        let (w, n) = (wide.forecast(1), narrow.forecast(1));
        assert!((w.high[0] - w.mean[0] - 3.0 * (n.high[0] - n.mean[0])).abs() < 1e-9);
    }

    #[test]
    fn last_repeats_the_last_value() {
        let mut last = Last::new();
        for x in [1.0, 4.0, 2.0] {
            last.observe(x);
        }
        assert_eq!(last.forecast(3).mean, vec![2.0; 3]);
        assert_eq!(last.name(), "last");
    }

    #[test]
    fn seasonal_falls_back_to_ewma_during_the_first_period() {
        let mut seasonal = Seasonal::new(5, 0.3, 0.2);
        let mut ewma = Ewma::new(0.3);
        for x in [1.0, 3.0, 2.0, 6.0] {
            seasonal.observe(x);
            ewma.observe(x);
            assert_eq!(seasonal.forecast(7), ewma.forecast(7));
        }
        seasonal.observe(4.0);
        assert!(seasonal.is_seasonal());
        // Right after the first period the forecast repeats it (level + index = the observed values).
        let fc = seasonal.forecast(5);
        for (got, want) in fc.mean.iter().zip([1.0, 3.0, 2.0, 6.0, 4.0]) {
            assert!((got - want).abs() < 1e-9, "{fc:?}");
        }
    }

    #[test]
    fn seasonal_learns_a_square_wave_and_beats_ewma_by_far() {
        let mut rng = Lcg(7);
        let series: Vec<f64> =
            (0..24 * 20).map(|t| if t % 24 < 12 { 10.0 } else { 2.0 } + (rng.uniform() - 0.5)).collect();
        let seasonal = ForecasterConfig::Seasonal { period_slots: 24, alpha: 0.1, gamma: 0.2 };
        for horizon in [1, 24] {
            let s = evaluate(&series, &seasonal, horizon, 96);
            let e = evaluate(&series, &ForecasterConfig::Ewma { alpha: 0.3 }, horizon, 96);
            assert!(s.wape < 0.25 * e.wape, "horizon {horizon}: seasonal {s:?} vs ewma {e:?}");
            assert!(s.wape < 0.06, "horizon {horizon}: {s:?}");
        }
    }

    #[test]
    fn seasonal_learns_a_sine_period() {
        let mut rng = Lcg(11);
        let period = 48;
        let series: Vec<f64> = (0..period * 15)
            .map(|t| {
                let phase = std::f64::consts::TAU * (t % period) as f64 / period as f64;
                rng.poisson(20.0 + 15.0 * phase.sin())
            })
            .collect();
        let seasonal = ForecasterConfig::Seasonal { period_slots: period, alpha: 0.1, gamma: 0.2 };
        let s = evaluate(&series, &seasonal, period, 3 * period);
        let e = evaluate(&series, &ForecasterConfig::Ewma { alpha: 0.3 }, period, 3 * period);
        assert!(s.wape < 0.6 * e.wape, "seasonal {s:?} vs ewma {e:?}");
        assert!(s.coverage > 0.7, "{s:?}");
    }

    #[test]
    fn band_coverage_on_poisson_noise_is_sensible() {
        let mut rng = Lcg(42);
        let series: Vec<f64> = (0..3000).map(|_| rng.poisson(20.0)).collect();
        for config in [
            ForecasterConfig::Ewma { alpha: 0.1 },
            ForecasterConfig::Last,
            ForecasterConfig::Seasonal { period_slots: 10, alpha: 0.1, gamma: 0.1 },
        ] {
            let err = evaluate(&series, &config, 1, 50);
            assert!((0.8..=0.97).contains(&err.coverage), "{config}: {err:?}");
        }
    }

    #[test]
    fn forecasts_are_well_formed_on_spiky_series_with_zeros() {
        let mut rng = Lcg(3);
        let series: Vec<f64> =
            (0..500).map(|_| if rng.uniform() < 0.6 { 0.0 } else { 100.0 * rng.uniform().powi(3) }).collect();
        for config in [
            ForecasterConfig::Last,
            ForecasterConfig::Ewma { alpha: 0.3 },
            ForecasterConfig::Seasonal { period_slots: 7, alpha: 0.5, gamma: 0.9 },
        ] {
            let mut f = config.build();
            for &x in &series {
                f.observe(x);
                assert_well_formed(&f.forecast(10), 10);
            }
            // Missing and negative observations do not poison the state.
            f.observe(f64::NAN);
            f.observe(-5.0);
            f.observe(f64::INFINITY);
            let fc = f.forecast(10);
            assert_well_formed(&fc, 10);
            assert!(fc.high.iter().all(|h| h.is_finite()), "{config}: {fc:?}");
        }
    }

    #[test]
    fn evaluate_on_a_constant_series_has_no_error() {
        let series = vec![7.25; 200];
        for config in [
            ForecasterConfig::Last,
            ForecasterConfig::Ewma { alpha: 0.3 },
            ForecasterConfig::Seasonal { period_slots: 24, alpha: 0.1, gamma: 0.2 },
        ] {
            let err = evaluate(&series, &config, 5, 30);
            assert_eq!(err.points, (200 - 30 - 5 + 1) * 5);
            assert!(err.mae < 1e-9 && err.wape < 1e-9, "{config}: {err:?}");
            assert_eq!(err.coverage, 1.0, "{config}: {err:?}");
        }
        let none = evaluate(&series, &ForecasterConfig::Last, 5, 300);
        assert_eq!(none.points, 0);
        assert_eq!(evaluate(&[0.0; 20], &ForecasterConfig::Last, 1, 0).wape, 0.0);
    }

    #[test]
    fn config_validation_and_serde() {
        assert!(ForecasterConfig::default().validate().is_ok());
        assert_eq!(ForecasterConfig::default(), ForecasterConfig::Ewma { alpha: 0.3 });
        assert!(ForecasterConfig::Last.validate().is_ok());
        assert!(ForecasterConfig::Ewma { alpha: 1.0 }.validate().is_ok());
        for alpha in [0.0, -0.1, 1.5, f64::NAN] {
            let err = ForecasterConfig::Ewma { alpha }.validate().unwrap_err();
            assert_eq!(err.field, "alpha", "{err}");
        }
        let seasonal = |period_slots, alpha, gamma| ForecasterConfig::Seasonal { period_slots, alpha, gamma };
        assert!(seasonal(24, 0.1, 0.2).validate().is_ok());
        assert!(seasonal(0, 0.1, 0.2).validate().unwrap_err().field == "period_slots");
        assert!(seasonal(24, 2.0, 0.2).validate().unwrap_err().field == "alpha");
        assert!(seasonal(24, 0.1, 0.0).validate().unwrap_err().field == "gamma");
        // Invalid configurations still build without panicking.
        let mut f = seasonal(0, f64::NAN, 7.0).build();
        f.observe(1.0);
        assert_well_formed(&f.forecast(2), 2);

        let json = r#"{"kind":"seasonal","period_slots":24,"alpha":0.1,"gamma":0.2}"#;
        let parsed: ForecasterConfig = serde_json::from_str(json).unwrap();
        assert_eq!(parsed, seasonal(24, 0.1, 0.2));
        assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
        assert_eq!(serde_json::from_str::<ForecasterConfig>(r#"{"kind":"last"}"#).unwrap(), ForecasterConfig::Last);
        assert_eq!(parsed.to_string(), "seasonal p=24 a=0.1 g=0.2");
        assert_eq!(parsed.build().name(), "seasonal");
    }
}
