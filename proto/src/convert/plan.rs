//! `Role`, `Work`, `Assignment`, `PlannedChange` and `GpuPlan`.

use tessera_core::ids::TenantId;
use tessera_core::layout::Layout;
use tessera_core::plan::{Assignment, GpuPlan, PlannedChange, Role};
use tessera_core::reconfig::Work;
use tessera_core::sharing::Sharing;
use tessera_core::time::SimTime;

use super::{ConvertError, required, try_all};
use crate::v1;

impl From<Role> for v1::Role {
    fn from(r: Role) -> Self {
        match r {
            Role::Inference => v1::Role::Inference,
            Role::Retraining => v1::Role::Retraining,
        }
    }
}

/// A role from its wire value (`field` names it in the error).
pub fn role_from_wire(field: &str, value: i32) -> Result<Role, ConvertError> {
    match v1::Role::try_from(value) {
        Ok(v1::Role::Inference) => Ok(Role::Inference),
        Ok(v1::Role::Retraining) => Ok(Role::Retraining),
        Ok(v1::Role::Unspecified) => Err(ConvertError::new(field, "must be ROLE_INFERENCE or ROLE_RETRAINING")),
        Err(_) => Err(ConvertError::new(field, format!("unknown role {value}"))),
    }
}

fn tenant(field: &str, value: String) -> Result<TenantId, ConvertError> {
    TenantId::new(value).map_err(|e| ConvertError::new(field, e.to_string()))
}

impl From<&Work> for v1::Work {
    fn from(w: &Work) -> Self {
        v1::Work { tenant: w.tenant.to_string(), role: v1::Role::from(w.role).into() }
    }
}

impl TryFrom<v1::Work> for Work {
    type Error = ConvertError;
    fn try_from(w: v1::Work) -> Result<Self, ConvertError> {
        Ok(Work { tenant: tenant("tenant", w.tenant)?, role: role_from_wire("role", w.role)? })
    }
}

impl From<&Assignment> for v1::Assignment {
    fn from(a: &Assignment) -> Self {
        v1::Assignment {
            placement: Some(a.placement.into()),
            tenant: a.tenant.to_string(),
            role: v1::Role::from(a.role).into(),
            preinit: a.preinit,
        }
    }
}

impl TryFrom<v1::Assignment> for Assignment {
    type Error = ConvertError;
    fn try_from(a: v1::Assignment) -> Result<Self, ConvertError> {
        Ok(Assignment {
            placement: required("placement", a.placement)?,
            tenant: tenant("tenant", a.tenant)?,
            role: role_from_wire("role", a.role)?,
            preinit: a.preinit,
        })
    }
}

impl From<&PlannedChange> for v1::PlannedChange {
    fn from(c: &PlannedChange) -> Self {
        v1::PlannedChange {
            at_ms: c.at.as_ms(),
            layout: Some((&c.layout).into()),
            assignments: c.assignments.iter().map(Into::into).collect(),
        }
    }
}

impl TryFrom<v1::PlannedChange> for PlannedChange {
    type Error = ConvertError;
    fn try_from(c: v1::PlannedChange) -> Result<Self, ConvertError> {
        Ok(PlannedChange {
            at: SimTime::from_ms(c.at_ms),
            layout: required::<_, Layout>("layout", c.layout)?,
            assignments: try_all("assignments", c.assignments)?,
        })
    }
}

impl From<&GpuPlan> for v1::GpuPlan {
    fn from(p: &GpuPlan) -> Self {
        v1::GpuPlan {
            layout: Some((&p.layout).into()),
            assignments: p.assignments.iter().map(Into::into).collect(),
            expected_goodput: p.expected_goodput,
            explanation: p.explanation.clone(),
            upcoming: p.upcoming.iter().map(Into::into).collect(),
            retraining_epochs: p.retraining_epochs.iter().map(|(t, e)| (t.to_string(), *e)).collect(),
            sharing: match p.sharing {
                Sharing::Exclusive => v1::Sharing::Exclusive,
                Sharing::Timeslice => v1::Sharing::Timeslice,
                Sharing::Priority => v1::Sharing::Priority,
            }
            .into(),
        }
    }
}

impl TryFrom<v1::GpuPlan> for GpuPlan {
    type Error = ConvertError;
    fn try_from(p: v1::GpuPlan) -> Result<Self, ConvertError> {
        let retraining_epochs = p
            .retraining_epochs
            .into_iter()
            .map(|(t, e)| Ok((tenant(&format!("retraining_epochs[{t}]"), t.clone())?, e)))
            .collect::<Result<_, ConvertError>>()?;
        Ok(GpuPlan {
            layout: required("layout", p.layout)?,
            assignments: try_all("assignments", p.assignments)?,
            expected_goodput: p.expected_goodput,
            explanation: p.explanation,
            upcoming: try_all("upcoming", p.upcoming)?,
            retraining_epochs,
            sharing: match v1::Sharing::try_from(p.sharing) {
                Ok(v1::Sharing::Exclusive) => Sharing::Exclusive,
                Ok(v1::Sharing::Timeslice) => Sharing::Timeslice,
                Ok(v1::Sharing::Priority) => Sharing::Priority,
                Err(_) => return Err(ConvertError::new("sharing", format!("unknown sharing mode {}", p.sharing))),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn plan() -> GpuPlan {
        let a = |p: &str, t: &str, role, preinit| Assignment {
            placement: p.parse().unwrap(),
            tenant: TenantId::new(t).unwrap(),
            role,
            preinit,
        };
        GpuPlan {
            layout: "4g@0 2g@4 1g@6".parse().unwrap(),
            assignments: vec![a("4g@0", "resnet", Role::Inference, false), a("2g@4", "bert", Role::Retraining, true)],
            expected_goodput: 12.5,
            explanation: "because".into(),
            upcoming: vec![PlannedChange {
                at: SimTime::from_secs(200),
                layout: "7g@0".parse().unwrap(),
                assignments: vec![a("7g@0", "resnet", Role::Inference, false)],
            }],
            retraining_epochs: BTreeMap::from([(TenantId::new("bert").unwrap(), 3.0)]),
            sharing: Sharing::Priority,
        }
    }

    #[test]
    fn gpu_plans_round_trip() {
        let p = plan();
        assert_eq!(GpuPlan::try_from(v1::GpuPlan::from(&p)).unwrap(), p);
        let w = Work { tenant: TenantId::new("x").unwrap(), role: Role::Retraining };
        assert_eq!(Work::try_from(v1::Work::from(&w)).unwrap(), w);
    }

    #[test]
    fn bad_fields_are_named() {
        let mut wire = v1::GpuPlan::from(&plan());
        wire.assignments[1].tenant = "bad id".into();
        let e = GpuPlan::try_from(wire.clone()).unwrap_err();
        assert_eq!(e.field, "assignments[1].tenant");
        wire.assignments[1].tenant = "ok".into();
        wire.assignments[0].role = 0;
        assert_eq!(GpuPlan::try_from(wire.clone()).unwrap_err().field, "assignments[0].role");
        wire.assignments[0].role = 9;
        assert!(GpuPlan::try_from(wire.clone()).unwrap_err().message.contains("unknown role 9"));
        wire.layout = None;
        assert_eq!(GpuPlan::try_from(wire).unwrap_err().to_string(), "field `layout`: is required");
    }
}
