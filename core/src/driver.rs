//! The GPU-instance profile table as a GPU's driver reports it, and how it differs from the built-in catalog.
//!
//! The catalog ([`crate::catalog`]) is what the simulator and offline planning use. On a real node the driver is the
//! source of truth: the NVML backend reads each profile (`nvmlDeviceGetGpuInstanceProfileInfo`) and its possible
//! placements (`nvmlDeviceGetGpuInstancePossiblePlacements_v2`) into a [`DriverTable`], [`DriverTable::differences`]
//! lists where it disagrees with the catalog (each logged by the agent), and [`DriverTable::memory_gib`] gives the
//! memory the coordinator plans that node with. NVIDIA's own tools have had the same trouble with hard-coded tables
//! (mig-parted issue 227 asks that profiles come from NVML); on an H200 the catalog once overstated the 1g profiles'
//! memory by 7 %.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::catalog::{GpuModel, Profile};

/// One GPU-instance profile as the driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverProfile {
    /// The profile shape this entry is for.
    pub profile: Profile,
    /// NVML's profile ID (`nvmlGpuInstanceProfileInfo_t::id`).
    pub id: u32,
    /// How many instances of it the GPU can hold (`instanceCount`).
    pub instance_count: u32,
    /// Compute slices (`sliceCount`).
    pub slices: u32,
    /// Streaming multiprocessors (`multiprocessorCount`).
    pub sms: u32,
    /// Copy engines (`copyEngineCount`).
    pub copy_engines: u32,
    /// Memory, MiB (`memorySizeMB`, which NVML gives in MiB).
    pub memory_mib: u64,
    /// Memory-slice starts where it can be placed (`nvmlGpuInstancePlacement_t::start`), ascending.
    pub starts: Vec<u8>,
}

impl DriverProfile {
    /// The memory, GiB.
    pub fn memory_gib(&self) -> f64 {
        self.memory_mib as f64 / 1024.0
    }
}

/// A GPU's profile table as its driver reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverTable {
    /// The product name NVML reports.
    pub name: String,
    /// The catalog model the product name maps to, if any.
    pub model: Option<GpuModel>,
    /// The driver version (`nvmlSystemGetDriverVersion`), empty when unknown.
    pub driver_version: String,
    /// The profiles the driver knows on this GPU, in catalog order.
    pub profiles: Vec<DriverProfile>,
}

/// One way the driver's table differs from the catalog's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// The profile, or `None` for the table as a whole.
    pub profile: Option<Profile>,
    /// The field that differs (`memory_gib`, `sms`, `copy_engines`, `instance_count`, `id`, `starts`, `present`).
    pub field: String,
    /// The catalog's value.
    pub catalog: String,
    /// The driver's value.
    pub driver: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.profile {
            Some(p) => {
                write!(f, "{p}: {} is {} in the driver, {} in the catalog", self.field, self.driver, self.catalog)
            }
            None => write!(f, "{} is {} in the driver, {} in the catalog", self.field, self.driver, self.catalog),
        }
    }
}

/// Memory differences below this (GiB) are rounding, not a difference.
const MEMORY_TOLERANCE_GIB: f64 = 0.01;

impl DriverTable {
    /// The driver's entry for `profile`.
    pub fn profile(&self, profile: Profile) -> Option<&DriverProfile> {
        self.profiles.iter().find(|p| p.profile == profile)
    }

    /// The memory of `profile` as the driver gives it, GiB, falling back to the catalog for a profile the driver
    /// did not report.
    pub fn memory_gib(&self, profile: Profile) -> Option<f64> {
        self.profile(profile)
            .map(DriverProfile::memory_gib)
            .or_else(|| self.model.and_then(|m| m.profile(profile)).map(|p| p.memory_gib))
    }

    /// Every difference between this table and the catalog's entry for its model (one naming the model when the
    /// catalog does not know the product).
    pub fn differences(&self) -> Vec<Difference> {
        let Some(model) = self.model else {
            return vec![Difference {
                profile: None,
                field: "model".into(),
                catalog: "none".into(),
                driver: self.name.clone(),
            }];
        };
        let mut out = Vec::new();
        let mut diff = |profile, field: &str, catalog: String, driver: String| {
            if catalog != driver {
                out.push(Difference { profile: Some(profile), field: field.into(), catalog, driver });
            }
        };
        for spec in model.spec().profiles {
            let p = spec.profile;
            let Some(d) = self.profile(p) else {
                diff(p, "present", "yes".into(), "no".into());
                continue;
            };
            diff(p, "id", p.nvidia_id().to_string(), d.id.to_string());
            diff(p, "instance_count", spec.max_count.to_string(), d.instance_count.to_string());
            diff(p, "sms", spec.sms.to_string(), d.sms.to_string());
            diff(p, "copy_engines", spec.copy_engines.to_string(), d.copy_engines.to_string());
            diff(p, "starts", format!("{:?}", p.allowed_starts()), format!("{:?}", d.starts));
            if (spec.memory_gib - d.memory_gib()).abs() > MEMORY_TOLERANCE_GIB {
                diff(p, "memory_gib", format!("{:.2}", spec.memory_gib), format!("{:.2}", d.memory_gib()));
            }
        }
        for d in &self.profiles {
            if model.profile(d.profile).is_none() {
                diff(d.profile, "present", "no".into(), "yes".into());
            }
        }
        out
    }

    /// The catalog's table for `model`, as a driver that agrees with it would report it (for the simulator and for
    /// tests).
    pub fn from_catalog(model: GpuModel) -> DriverTable {
        DriverTable {
            name: model.spec().product_name.to_string(),
            model: Some(model),
            driver_version: String::new(),
            profiles: model
                .spec()
                .profiles
                .iter()
                .map(|s| DriverProfile {
                    profile: s.profile,
                    id: s.profile.nvidia_id(),
                    instance_count: u32::from(s.max_count),
                    slices: u32::from(s.profile.compute_slices()),
                    sms: s.sms,
                    copy_engines: s.copy_engines,
                    memory_mib: (s.memory_gib * 1024.0).round() as u64,
                    starts: s.profile.allowed_starts().to_vec(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalog_agrees_with_itself() {
        for model in GpuModel::ALL {
            let t = DriverTable::from_catalog(model);
            assert!(t.differences().is_empty(), "{model}: {:?}", t.differences());
        }
    }

    #[test]
    fn the_h200_read_from_a_real_driver_agrees_with_the_catalog() {
        // What a real H200 (driver 580.159.04) reported: 16.00 / 32.50 / 69.75 / 140.00 GiB.
        let mut t = DriverTable::from_catalog(GpuModel::H200_141GB);
        for p in &mut t.profiles {
            p.memory_mib = match p.profile {
                Profile::G1 | Profile::G1Me => 16_384,
                Profile::G1Double | Profile::G2 => 33_280,
                Profile::G3 | Profile::G4 => 71_424,
                Profile::G7 => 143_360,
            };
        }
        assert_eq!(t.differences(), vec![]);
        assert_eq!(t.memory_gib(Profile::G1), Some(16.0));
    }

    #[test]
    fn differences_name_the_profile_the_field_and_both_values() {
        let mut t = DriverTable::from_catalog(GpuModel::H100_80GB);
        t.profiles[0].memory_mib = 10_240;
        t.profiles[0].starts = vec![0, 1, 2];
        t.profiles.retain(|p| p.profile != Profile::G7);
        let d = t.differences();
        let text: Vec<String> = d.iter().map(ToString::to_string).collect();
        assert_eq!(
            text,
            [
                "1g: starts is [0, 1, 2] in the driver, [0, 1, 2, 3, 4, 5, 6] in the catalog",
                "1g: memory_gib is 10.00 in the driver, 9.75 in the catalog",
                "7g: present is no in the driver, yes in the catalog",
            ]
        );
        // A profile the driver left out is planned with the catalog's memory.
        assert_eq!(t.memory_gib(Profile::G7), Some(79.25));
        assert_eq!(t.memory_gib(Profile::G1), Some(10.0));
        let unknown =
            DriverTable { name: "NVIDIA X1".into(), model: None, driver_version: String::new(), profiles: vec![] };
        assert_eq!(unknown.differences()[0].field, "model");
    }
}
