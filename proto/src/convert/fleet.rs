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
        }
    }
}

impl TryFrom<v1::GpuDescriptor> for GpuDescriptor {
    type Error = ConvertError;
    fn try_from(g: v1::GpuDescriptor) -> Result<Self, ConvertError> {
        let model: GpuModel = g.model.parse().map_err(|e| ConvertError::new("model", format!("{e}")))?;
        Ok(GpuDescriptor { index: g.index, model, mig_enabled: g.mig_enabled, layout: required("layout", g.layout)? })
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
        };
        let wire = v1::GpuDescriptor::from(&g);
        assert_eq!(GpuDescriptor::try_from(wire.clone()).unwrap(), g);
        let e = GpuDescriptor::try_from(v1::GpuDescriptor { model: "Z9".into(), ..wire }).unwrap_err();
        assert_eq!(e.field, "model");
    }
}
