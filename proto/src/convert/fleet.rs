//! `GpuDescriptor`: a GPU as a node registers it.

use tessera_core::catalog::GpuModel;
use tessera_core::fleet::GpuDescriptor;

use super::{ConvertError, required};
use crate::v1;

impl From<&GpuDescriptor> for v1::GpuDescriptor {
    fn from(g: &GpuDescriptor) -> Self {
        v1::GpuDescriptor {
            index: g.index,
            model: g.model.to_string(),
            mig_enabled: g.mig_enabled,
            layout: Some((&g.layout).into()),
            memory_gib: g.memory_gib.iter().map(|(p, m)| (p.to_string(), *m)).collect(),
        }
    }
}

impl TryFrom<v1::GpuDescriptor> for GpuDescriptor {
    type Error = ConvertError;
    fn try_from(g: v1::GpuDescriptor) -> Result<Self, ConvertError> {
        let model: GpuModel = g.model.parse().map_err(|e| ConvertError::new("model", format!("{e}")))?;
        if g.memory_gib.len() > tessera_core::Profile::ALL.len() {
            return Err(ConvertError::new(
                "memory_gib",
                format!("{} entries; a GPU has 7 profiles", g.memory_gib.len()),
            ));
        }
        let memory_gib = g
            .memory_gib
            .into_iter()
            .map(|(p, m)| {
                let profile = p.parse().map_err(|e| ConvertError::new(format!("memory_gib.{p}"), format!("{e}")))?;
                Ok((profile, m))
            })
            .collect::<Result<_, ConvertError>>()?;
        Ok(GpuDescriptor {
            index: g.index,
            model,
            mig_enabled: g.mig_enabled,
            layout: required("layout", g.layout)?,
            memory_gib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_round_trip_and_name_a_bad_model() {
        let g = GpuDescriptor {
            index: 3,
            model: GpuModel::H100_80GB,
            mig_enabled: true,
            layout: "3g@0 3g@4".parse().unwrap(),
            memory_gib: [(tessera_core::Profile::G1, 16.0)].into_iter().collect(),
        };
        let wire = v1::GpuDescriptor::from(&g);
        assert_eq!(GpuDescriptor::try_from(wire.clone()).unwrap(), g);
        let e = GpuDescriptor::try_from(v1::GpuDescriptor { model: "Z9".into(), ..wire }).unwrap_err();
        assert_eq!(e.field, "model");
        let mut bad = v1::GpuDescriptor::from(&g);
        bad.memory_gib.insert("5g".into(), 1.0);
        assert_eq!(GpuDescriptor::try_from(bad).unwrap_err().field, "memory_gib.5g");
    }
}
