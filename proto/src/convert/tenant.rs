//! `TenantSpec`: a tenant as operators create it through the coordinator's API.

use tessera_core::accuracy::{Drift, OptimusCurve};
use tessera_core::ids::TenantId;
use tessera_core::tenant::{DemandSource, RetrainingSpec, TenantSpec};

use super::{ConvertError, required};
use crate::v1;

impl From<&TenantSpec> for v1::TenantSpec {
    fn from(t: &TenantSpec) -> Self {
        let demand = match &t.demand {
            DemandSource::Trace { selector, scale } => {
                v1::tenant_spec::Demand::Trace(v1::TraceDemand { selector: selector.clone(), scale: *scale })
            }
            DemandSource::Poisson { rate_rps } => {
                v1::tenant_spec::Demand::Poisson(v1::PoissonDemand { rate_rps: *rate_rps })
            }
        };
        v1::TenantSpec {
            id: t.id.to_string(),
            name: t.name.clone(),
            model: t.model.clone(),
            slo_ms: t.slo_ms,
            slo_percentile: t.slo_percentile,
            weight: t.weight,
            demand: Some(demand),
            retraining: t.retraining.as_ref().map(|r| v1::RetrainingSpec {
                window_ms: r.window_ms,
                work_gpu_s: r.work_gpu_s,
                epochs: r.epochs,
                curve: Some(v1::OptimusCurve { b0: r.curve.b0, b1: r.curve.b1, b2: r.curve.b2 }),
                initial_accuracy: r.initial_accuracy,
                drift: Some(v1::Drift { per_window: r.drift.per_window, floor: r.drift.floor }),
            }),
            jobs: (!t.jobs.is_empty()).then(|| v1::TenantJobs { tenant: t.id.to_string(), ..(&t.jobs).into() }),
        }
    }
}

impl TryFrom<v1::OptimusCurve> for OptimusCurve {
    type Error = ConvertError;
    fn try_from(c: v1::OptimusCurve) -> Result<Self, ConvertError> {
        Ok(OptimusCurve { b0: c.b0, b1: c.b1, b2: c.b2 })
    }
}

impl TryFrom<v1::Drift> for Drift {
    type Error = ConvertError;
    fn try_from(d: v1::Drift) -> Result<Self, ConvertError> {
        Ok(Drift { per_window: d.per_window, floor: d.floor })
    }
}

impl TryFrom<v1::RetrainingSpec> for RetrainingSpec {
    type Error = ConvertError;
    fn try_from(r: v1::RetrainingSpec) -> Result<Self, ConvertError> {
        Ok(RetrainingSpec {
            window_ms: r.window_ms,
            work_gpu_s: r.work_gpu_s,
            epochs: r.epochs,
            curve: required("curve", r.curve)?,
            initial_accuracy: r.initial_accuracy,
            drift: required("drift", r.drift)?,
        })
    }
}

/// Converts the wire spec; the values themselves are validated by the coordinator's state machine
/// (`tessera_core::config::validate_tenant`), which names the field it refuses.
impl TryFrom<v1::TenantSpec> for TenantSpec {
    type Error = ConvertError;
    fn try_from(t: v1::TenantSpec) -> Result<Self, ConvertError> {
        let id = TenantId::new(t.id).map_err(|e| ConvertError::new("id", e.to_string()))?;
        let demand = match t.demand.ok_or_else(|| ConvertError::missing("demand"))? {
            v1::tenant_spec::Demand::Trace(d) => DemandSource::Trace { selector: d.selector, scale: d.scale },
            v1::tenant_spec::Demand::Poisson(d) => DemandSource::Poisson { rate_rps: d.rate_rps },
        };
        let retraining = match t.retraining {
            Some(r) => Some(RetrainingSpec::try_from(r).map_err(|e| e.within("retraining"))?),
            None => None,
        };
        let jobs = match t.jobs {
            Some(j) => tessera_core::jobs::TenantJobs::try_from(j).map_err(|e| e.within("jobs"))?,
            None => tessera_core::jobs::TenantJobs::default(),
        };
        Ok(TenantSpec {
            jobs,
            id,
            name: t.name,
            model: t.model,
            slo_ms: t.slo_ms,
            slo_percentile: t.slo_percentile,
            weight: t.weight,
            demand,
            retraining,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TenantSpec {
        TenantSpec {
            jobs: Default::default(),
            id: TenantId::new("vision-a").unwrap(),
            name: "vision A".into(),
            model: "resnet50".into(),
            slo_ms: 50.0,
            slo_percentile: 0.99,
            weight: 1.0,
            demand: DemandSource::Poisson { rate_rps: 120.0 },
            retraining: Some(RetrainingSpec {
                window_ms: 200_000,
                work_gpu_s: 300.0,
                epochs: 5.0,
                curve: OptimusCurve { b0: 0.5, b1: 2.0, b2: 0.05 },
                initial_accuracy: 0.7,
                drift: Drift { per_window: 0.02, floor: 0.5 },
            }),
        }
    }

    #[test]
    fn tenant_specs_round_trip() {
        let t = spec();
        assert_eq!(TenantSpec::try_from(v1::TenantSpec::from(&t)).unwrap(), t);
        let mut trace = spec();
        trace.demand = DemandSource::Trace { selector: "rank:3".into(), scale: 2.0 };
        trace.retraining = None;
        assert_eq!(TenantSpec::try_from(v1::TenantSpec::from(&trace)).unwrap(), trace);
    }

    #[test]
    fn bad_tenant_fields_are_named() {
        let mut wire = v1::TenantSpec::from(&spec());
        wire.retraining.as_mut().unwrap().curve = None;
        assert_eq!(TenantSpec::try_from(wire).unwrap_err().field, "retraining.curve");
        let mut wire = v1::TenantSpec::from(&spec());
        wire.demand = None;
        assert_eq!(TenantSpec::try_from(wire).unwrap_err().field, "demand");
        let mut wire = v1::TenantSpec::from(&spec());
        wire.id = "bad id!".into();
        assert_eq!(TenantSpec::try_from(wire).unwrap_err().field, "id");
    }
}
