//! Accuracy of a continuously retrained model.
//!
//! - **Optimus curve** (Peng et al., EuroSys 2018; used by Ekya): accuracy after `x` epochs of training is
//!   `acc(x) = 1 - (1 / (b0 x + b1) + b2)`, clamped to `[0, 1]`.
//! - **Drift**: the data distribution moves, so a deployed model loses `drift_per_window` accuracy at the end of
//!   every retraining window in which no retraining completed, never going below `floor`.
//! - **Retraining** of `epochs` epochs on fresh data replaces the model; the new one serves with `acc(epochs)`.

use serde::{Deserialize, Serialize};

/// The Optimus accuracy curve `acc(x) = 1 - (1 / (b0 x + b1) + b2)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimusCurve {
    /// Learning-speed coefficient (> 0).
    pub b0: f64,
    /// Offset (> 0): `1 / b1` is the loss before training.
    pub b1: f64,
    /// Irreducible error (>= 0).
    pub b2: f64,
}

impl OptimusCurve {
    /// Accuracy after `epochs` epochs, in `[0, 1]`.
    pub fn accuracy(&self, epochs: f64) -> f64 {
        (1.0 - (1.0 / (self.b0 * epochs.max(0.0) + self.b1) + self.b2)).clamp(0.0, 1.0)
    }

    /// The accuracy approached with unlimited training, `1 - b2`.
    pub fn asymptote(&self) -> f64 {
        (1.0 - self.b2).clamp(0.0, 1.0)
    }
}

/// How accuracy decays between retrainings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// Accuracy lost per window without a completed retraining.
    pub per_window: f64,
    /// Accuracy never drops below this.
    pub floor: f64,
}

impl Drift {
    /// Accuracy after `windows` windows without retraining, starting from `accuracy`.
    pub fn after(&self, accuracy: f64, windows: u32) -> f64 {
        if accuracy <= self.floor {
            return accuracy;
        }
        (accuracy - self.per_window * f64::from(windows)).max(self.floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optimus_curve_rises_to_its_asymptote() {
        let c = OptimusCurve { b0: 0.5, b1: 2.0, b2: 0.05 };
        assert!((c.accuracy(0.0) - 0.45).abs() < 1e-12);
        assert!((c.accuracy(2.0) - (1.0 - (1.0 / 3.0 + 0.05))).abs() < 1e-12);
        assert!(c.accuracy(10.0) > c.accuracy(5.0));
        assert!(c.accuracy(1e9) <= c.asymptote() + 1e-9);
        // Clamped: a curve that would go negative stays at 0.
        assert_eq!(OptimusCurve { b0: 1.0, b1: 0.5, b2: 0.0 }.accuracy(0.0), 0.0);
    }

    #[test]
    fn drift_stops_at_the_floor() {
        let d = Drift { per_window: 0.02, floor: 0.6 };
        assert!((d.after(0.8, 3) - 0.74).abs() < 1e-12);
        assert_eq!(d.after(0.8, 100), 0.6);
        assert_eq!(d.after(0.5, 1), 0.5);
    }
}
