//! Interference between the instances that share a GPU: a latency multiplier per instance, recomputed whenever
//! the set of instances with work on a GPU changes.
//!
//! [`Interference`] is the boundary; [`NoInterference`] is isolation (MIG's promise), and [`TlbInterference`] asks
//! the L3 TLB model ([`crate::tlb::TlbModel`]) for the slowdown of each instance's model stream in the co-located
//! set. The executor multiplies inference batch latencies by the factor and divides retraining speed by it.

use tessera_core::ids::TenantId;
use tessera_core::plan::Role;
use tessera_core::{GpuModel, Profile};

use crate::tlb::{TenantStreamSpec, TlbError, TlbMode, TlbModel};

/// One instance with work on a GPU, as the interference model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resident<'a> {
    /// The tenant whose work it runs.
    pub tenant: &'a TenantId,
    /// The tenant's model profile name.
    pub model: &'a str,
    /// The instance's MIG profile.
    pub profile: Profile,
    /// Inference or retraining.
    pub role: Role,
}

/// Why an interference model could not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterferenceError {
    /// The TLB model refused the co-located set.
    #[error("TLB interference model: {0}")]
    Tlb(#[from] TlbError),
}

/// Latency multipliers of co-located instances.
pub trait Interference: Send {
    /// Fills `factors` (cleared first) with one multiplier (>= 1) per resident, in order, for `residents`
    /// sharing one `gpu`.
    fn factors(
        &mut self,
        gpu: GpuModel,
        residents: &[Resident<'_>],
        factors: &mut Vec<f64>,
    ) -> Result<(), InterferenceError>;
}

/// Perfect isolation: every factor is 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoInterference;

impl Interference for NoInterference {
    fn factors(
        &mut self,
        _: GpuModel,
        residents: &[Resident<'_>],
        factors: &mut Vec<f64>,
    ) -> Result<(), InterferenceError> {
        factors.clear();
        factors.resize(residents.len(), 1.0);
        Ok(())
    }
}

/// The L3 TLB model: each resident whose model has a default stream ([`TenantStreamSpec::for_model`]) is one
/// stream on its instance's compute slices; its factor is `1 + slowdown` of the co-located run (at least 1).
/// Residents without a stream, and a stream alone on its GPU, get 1. Reports are cached per mix by the model.
#[derive(Debug, Clone)]
pub struct TlbInterference {
    model: TlbModel,
    mode: TlbMode,
}

impl TlbInterference {
    /// Interference from `model` in `mode` (baseline L3 TLB or STAR).
    pub fn new(model: TlbModel, mode: TlbMode) -> TlbInterference {
        TlbInterference { model, mode }
    }

    /// The TLB model (and its cache).
    pub fn model(&self) -> &TlbModel {
        &self.model
    }
}

impl Interference for TlbInterference {
    fn factors(
        &mut self,
        _: GpuModel,
        residents: &[Resident<'_>],
        factors: &mut Vec<f64>,
    ) -> Result<(), InterferenceError> {
        factors.clear();
        factors.resize(residents.len(), 1.0);
        let (streams, specs): (Vec<usize>, Vec<TenantStreamSpec>) = residents
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                TenantStreamSpec::for_model(r.model).map(|s| (i, s.with_slices(r.profile.compute_slices())))
            })
            .unzip();
        if specs.len() < 2 {
            return Ok(());
        }
        let report = self.model.slowdowns(&specs, self.mode)?;
        for (k, &i) in streams.iter().enumerate() {
            factors[i] = report.tenants[k].latency_factor().max(1.0);
        }
        Ok(())
    }
}
