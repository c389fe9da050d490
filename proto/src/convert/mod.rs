//! Conversions between the generated messages ([`crate::v1`]) and `tessera-core` types, one file per type family:
//!
//! - [`layout`]: placements and layouts (`Placement`, `Layout`).
//! - [`plan`]: plans and their parts (`Role`, `Work`, `Assignment`, `PlannedChange`, `GpuPlan`).
//! - [`fleet`]: a GPU as a node registers it (`GpuDescriptor`).
//! - [`jobs`]: a tenant's serve and retrain jobs (`JobSpec`, `TenantJobs`).
//! - [`tenant`]: a tenant spec as the coordinator API carries it (`TenantSpec`).
//!
//! Core to wire is infallible (`From`); wire to core is `TryFrom` with a [`ConvertError`] naming the field.

pub mod fleet;
pub mod jobs;
pub mod layout;
pub mod plan;
pub mod tenant;

/// A message field that does not convert to its `core` type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("field `{field}`: {message}")]
pub struct ConvertError {
    /// Dotted path of the field (`targets[0].plan.assignments[2].tenant`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl ConvertError {
    /// An error about `field`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> ConvertError {
        ConvertError { field: field.into(), message: message.into() }
    }

    /// The same error for a field nested under `prefix`.
    pub fn within(self, prefix: &str) -> ConvertError {
        ConvertError { field: format!("{prefix}.{}", self.field), message: self.message }
    }

    /// An absent message field that is required.
    pub fn missing(field: impl Into<String>) -> ConvertError {
        ConvertError::new(field, "is required")
    }
}

/// Converts every element, naming the failing one as `field[i]`.
pub(crate) fn try_all<W, C>(field: &str, items: Vec<W>) -> Result<Vec<C>, ConvertError>
where
    C: TryFrom<W, Error = ConvertError>,
{
    items.into_iter().enumerate().map(|(i, w)| C::try_from(w).map_err(|e| e.within(&format!("{field}[{i}]")))).collect()
}

/// Converts a required message field.
pub(crate) fn required<W, C>(field: &str, item: Option<W>) -> Result<C, ConvertError>
where
    C: TryFrom<W, Error = ConvertError>,
{
    C::try_from(item.ok_or_else(|| ConvertError::missing(field))?).map_err(|e| e.within(field))
}
