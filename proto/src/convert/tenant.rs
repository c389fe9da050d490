//! `TenantSpec`: a tenant as operators create it through the coordinator's API.

use tessera_core::Profile;
use tessera_core::accuracy::{Drift, OptimusCurve};
use tessera_core::ids::{GpuId, TenantId};
use tessera_core::tenant::{DemandSource, RetrainingSpec, TenantPin, TenantSpec};

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
            pin: (!t.pin.is_empty()).then(|| v1::TenantPin {
                gpus: t.pin.gpus.iter().map(ToString::to_string).collect(),
                profile: t.pin.profile.map(|p| p.to_string()).unwrap_or_default(),
            }),
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

impl TryFrom<v1::TenantPin> for TenantPin {
    type Error = ConvertError;
    fn try_from(p: v1::TenantPin) -> Result<Self, ConvertError> {
        // Bounded before parsing: the state machine's check of the count comes after conversion.
        if p.gpus.len() > TenantPin::MAX_GPUS {
            return Err(ConvertError::new("gpus", format!("at most {} GPUs may be given", TenantPin::MAX_GPUS)));
        }
        let gpus = p
            .gpus
            .iter()
            .enumerate()
            .map(|(i, g)| g.parse::<GpuId>().map_err(|e| ConvertError::new(format!("gpus[{i}]"), e.to_string())))
            .collect::<Result<Vec<_>, _>>()?;
        let profile = match p.profile.as_str() {
            "" => None,
            name => Some(name.parse::<Profile>().map_err(|e| ConvertError::new("profile", e.to_string()))?),
        };
        Ok(TenantPin { gpus, profile })
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
        let pin = match t.pin {
            Some(p) => TenantPin::try_from(p).map_err(|e| e.within("pin"))?,
            None => TenantPin::default(),
        };
        Ok(TenantSpec {
            jobs,
            pin,
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
            pin: Default::default(),
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
        let mut pinned = spec();
        pinned.pin = TenantPin { gpus: vec!["node-1/0".parse().unwrap()], profile: Some(Profile::G1Double) };
        let wire = v1::TenantSpec::from(&pinned);
        assert_eq!(wire.pin.as_ref().map(|p| p.profile.as_str()), Some("1g.2x"));
        assert_eq!(TenantSpec::try_from(wire).unwrap(), pinned);
        assert_eq!(v1::TenantSpec::from(&spec()).pin, None, "no pin: nothing on the wire");
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
        let mut wire = v1::TenantSpec::from(&spec());
        wire.pin = Some(v1::TenantPin { gpus: vec!["node-1/0".into(), "node-1".into()], profile: String::new() });
        assert_eq!(TenantSpec::try_from(wire).unwrap_err().field, "pin.gpus[1]");
        let mut wire = v1::TenantSpec::from(&spec());
        wire.pin = Some(v1::TenantPin { gpus: vec![], profile: "5g".into() });
        assert_eq!(TenantSpec::try_from(wire).unwrap_err().field, "pin.profile");
        let mut wire = v1::TenantSpec::from(&spec());
        wire.pin = Some(v1::TenantPin { gpus: vec!["n/0".into(); TenantPin::MAX_GPUS + 1], profile: String::new() });
        assert_eq!(TenantSpec::try_from(wire).unwrap_err().field, "pin.gpus");
    }
}
