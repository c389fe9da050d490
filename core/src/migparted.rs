//! Import and export of NVIDIA mig-parted configuration files, the de-facto interchange format for MIG layouts:
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-balanced:
//!     - devices: all
//!       mig-enabled: true
//!       mig-devices:
//!         "1g.5gb": 2
//!         "2g.10gb": 1
//!         "3g.20gb": 1
//! ```
//!
//! mig-parted gives profile *counts*, not placements; the driver's default placement order can fail where another
//! order works (NVIDIA MIG User Guide, placements). [`place`] therefore picks explicit placements: among the
//! layouts with exactly the requested counts, the one that strands the fewest compute slices, then leaves the most
//! room for further instances, then comes first in enumeration order. When no arrangement exists it says why.
//!
//! `device-filter` (PCI device IDs) is read and kept but not interpreted: a layout is imported for the GPU model
//! the caller names.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::catalog::{COMPUTE_SLICES, GpuModel, MAX_GPU_INSTANCES, MEMORY_SLICES, Profile};
use crate::enumerate::{ProfileSet, all_layouts};
use crate::layout::{Layout, Placement};

/// A whole mig-parted file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigPartedFile {
    /// Must be `v1`.
    pub version: String,
    /// Named configurations.
    #[serde(rename = "mig-configs")]
    pub mig_configs: BTreeMap<String, Vec<DeviceGroup>>,
}

/// One entry of a configuration: a set of devices and their layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGroup {
    /// PCI device IDs the entry applies to (kept, not interpreted).
    #[serde(rename = "device-filter", default, skip_serializing_if = "Option::is_none")]
    pub device_filter: Option<serde_yaml_ng::Value>,
    /// `all` or a list of device indices.
    pub devices: Devices,
    /// Whether MIG mode is on.
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Profile name (the model's nvidia-smi name) to count.
    #[serde(rename = "mig-devices", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mig_devices: BTreeMap<String, u32>,
}

/// Which devices a [`DeviceGroup`] applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Devices {
    /// `all`.
    All(AllDevices),
    /// Explicit device indices.
    List(Vec<u32>),
}

/// The literal `all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AllDevices {
    /// `all`.
    #[serde(rename = "all")]
    All,
}

/// A layout imported from one device group.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportedGroup {
    /// The devices it applies to.
    pub devices: Devices,
    /// Whether MIG mode is on (if off, `layout` is empty).
    pub mig_enabled: bool,
    /// The layout, with explicit placements.
    pub layout: Layout,
}

/// Why a mig-parted file or configuration cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MigPartedError {
    /// The YAML does not parse or does not have the mig-parted shape.
    #[error("not a mig-parted file: {0}")]
    Syntax(String),
    /// The version is not `v1`.
    #[error("version: `{0}` is not supported (expected v1)")]
    Version(String),
    /// The named configuration is absent.
    #[error("mig-configs: no configuration named `{name}` (have: {})", have.join(", "))]
    NoSuchConfig {
        /// The requested name.
        name: String,
        /// The names present.
        have: Vec<String>,
    },
    /// A profile name unknown on the model.
    #[error("mig-configs.{config}[{group}].mig-devices: `{profile}` is not a {model} profile (have: {})", have.join(", "))]
    UnknownProfile {
        /// Configuration name.
        config: String,
        /// Index of the device group.
        group: usize,
        /// The name.
        profile: String,
        /// The model.
        model: GpuModel,
        /// The model's profile names.
        have: Vec<String>,
    },
    /// The counts cannot be placed on one GPU.
    #[error("mig-configs.{config}[{group}]: {reason}")]
    NoFit {
        /// Configuration name.
        config: String,
        /// Index of the device group.
        group: usize,
        /// Why no placement fits.
        reason: NoFit,
    },
}

/// Why a profile multiset has no valid placement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFit {
    /// More memory slices than the GPU has.
    #[error("needs {needed} memory slices but a GPU has {MEMORY_SLICES}")]
    MemorySlices {
        /// Memory slices requested.
        needed: u32,
    },
    /// More compute slices than the GPU has.
    #[error("needs {needed} compute slices but a GPU has {COMPUTE_SLICES}")]
    ComputeSlices {
        /// Compute slices requested.
        needed: u32,
    },
    /// More of one profile than the model allows.
    #[error("{count} x {name} but {model} allows at most {max}")]
    Count {
        /// The model's name of the profile.
        name: String,
        /// Requested count.
        count: usize,
        /// Allowed maximum.
        max: u8,
        /// The model.
        model: GpuModel,
    },
    /// More instances than a GPU holds.
    #[error("{count} instances but a GPU holds at most {MAX_GPU_INSTANCES}")]
    Instances {
        /// Requested count.
        count: usize,
    },
    /// The totals fit but the placement rules do not allow any arrangement.
    #[error("the totals fit, but no arrangement satisfies the placement rules ({rules})")]
    Arrangement {
        /// The start rules of the profiles involved.
        rules: String,
    },
}

/// Explicit placements for a profile multiset on `model` (see the module doc for the choice), or why none exist.
pub fn place(model: GpuModel, counts: &BTreeMap<Profile, usize>) -> Result<Layout, NoFit> {
    let total = |f: fn(Profile) -> u8| counts.iter().map(|(p, n)| u32::from(f(*p)) * *n as u32).sum::<u32>();
    for (p, &n) in counts {
        let max = model.profile(*p).map_or(0, |s| s.max_count);
        if n > usize::from(max) {
            let name = model.profile(*p).map_or(p.short_name(), |s| s.name).to_string();
            return Err(NoFit::Count { name, count: n, max, model });
        }
    }
    let instances: usize = counts.values().sum();
    if instances > MAX_GPU_INSTANCES {
        return Err(NoFit::Instances { count: instances });
    }
    let memory = total(Profile::memory_slices);
    if memory > u32::from(MEMORY_SLICES) {
        return Err(NoFit::MemorySlices { needed: memory });
    }
    let compute = total(Profile::compute_slices);
    if compute > u32::from(COMPUTE_SLICES) {
        return Err(NoFit::ComputeSlices { needed: compute });
    }
    if instances == 0 {
        return Ok(Layout::empty());
    }
    let all_placements = Placement::all_for(&Profile::ALL);
    all_layouts(model, ProfileSet::All)
        .into_iter()
        .filter(|l| &l.profile_counts() == counts)
        .min_by_key(|l| {
            let room = all_placements.iter().filter(|p| l.can_add(model, **p)).count();
            (l.stranded_compute_slices(), std::cmp::Reverse(room))
        })
        .ok_or_else(|| NoFit::Arrangement {
            rules: counts
                .keys()
                .map(|p| {
                    let starts: Vec<String> = p.allowed_starts().iter().map(u8::to_string).collect();
                    format!("{} starts at {}", p, starts.join("/"))
                })
                .collect::<Vec<_>>()
                .join("; "),
        })
}

/// Parses a mig-parted file.
pub fn parse(text: &str) -> Result<MigPartedFile, MigPartedError> {
    let file: MigPartedFile = serde_yaml_ng::from_str(text).map_err(|e| MigPartedError::Syntax(e.to_string()))?;
    if file.version != "v1" {
        return Err(MigPartedError::Version(file.version));
    }
    Ok(file)
}

/// The layouts of configuration `name` in `file` for GPUs of `model`, with explicit placements.
pub fn import(file: &MigPartedFile, name: &str, model: GpuModel) -> Result<Vec<ImportedGroup>, MigPartedError> {
    let groups = file.mig_configs.get(name).ok_or_else(|| MigPartedError::NoSuchConfig {
        name: name.to_string(),
        have: file.mig_configs.keys().cloned().collect(),
    })?;
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let mut counts: BTreeMap<Profile, usize> = BTreeMap::new();
            if g.mig_enabled {
                for (profile_name, &n) in &g.mig_devices {
                    let spec = model.profile_by_name(profile_name).ok_or_else(|| MigPartedError::UnknownProfile {
                        config: name.to_string(),
                        group: i,
                        profile: profile_name.clone(),
                        model,
                        have: model.spec().profiles.iter().map(|p| p.name.to_string()).collect(),
                    })?;
                    if n > 0 {
                        *counts.entry(spec.profile).or_insert(0) += n as usize;
                    }
                }
            }
            let layout = place(model, &counts).map_err(|reason| MigPartedError::NoFit {
                config: name.to_string(),
                group: i,
                reason,
            })?;
            Ok(ImportedGroup { devices: g.devices.clone(), mig_enabled: g.mig_enabled, layout })
        })
        .collect()
}

/// A mig-parted file with one configuration `name` that applies `layout` to all devices of `model`.
pub fn export(name: &str, model: GpuModel, layout: &Layout) -> String {
    let group = DeviceGroup {
        device_filter: None,
        devices: Devices::All(AllDevices::All),
        mig_enabled: true,
        mig_devices: layout
            .profile_counts()
            .into_iter()
            .map(|(p, n)| (model.profile(p).map_or(p.short_name(), |s| s.name).to_string(), n as u32))
            .collect(),
    };
    let file = MigPartedFile { version: "v1".into(), mig_configs: BTreeMap::from([(name.to_string(), vec![group])]) };
    serde_yaml_ng::to_string(&file).expect("a mig-parted file always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enumerate::multisets;

    const BALANCED: &str = r#"
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - device-filter: ["0x20B010DE", "0x20B110DE"]
      devices: all
      mig-enabled: true
      mig-devices:
        "1g.5gb": 2
        "2g.10gb": 1
        "3g.20gb": 1
  custom:
    - devices: [0, 1]
      mig-enabled: true
      mig-devices:
        "4g.20gb": 1
        "3g.20gb": 1
"#;

    #[test]
    fn imports_with_explicit_placements() {
        let file = parse(BALANCED).unwrap();
        let g = import(&file, "all-balanced", GpuModel::A100_40GB).unwrap();
        assert_eq!(g.len(), 1);
        // 3g goes to 4 (3g@0 would strand compute slice 3), the rest fills 0..3.
        assert_eq!(g[0].layout.to_string(), "1g@0 1g@1 2g@2 3g@4");
        let g = import(&file, "custom", GpuModel::A100_40GB).unwrap();
        assert_eq!(g[0].devices, Devices::List(vec![0, 1]));
        assert_eq!(g[0].layout.to_string(), "4g@0 3g@4");
        let g = import(&file, "all-disabled", GpuModel::A100_40GB).unwrap();
        assert!(!g[0].mig_enabled && g[0].layout.is_empty());
    }

    #[test]
    fn import_says_why_nothing_fits() {
        let file = parse(BALANCED).unwrap();
        let e = import(&file, "nope", GpuModel::A100_40GB).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mig-configs: no configuration named `nope` (have: all-balanced, all-disabled, custom)"
        );
        let e = import(&file, "all-balanced", GpuModel::H100_80GB).unwrap_err();
        assert!(e.to_string().contains("`1g.5gb` is not a H100-80GB profile"), "{e}");
        let counts = |v: &[(Profile, usize)]| v.iter().copied().collect::<BTreeMap<_, _>>();
        let m = GpuModel::A100_40GB;
        let e = place(m, &counts(&[(Profile::G4, 2)])).unwrap_err();
        assert_eq!(e.to_string(), "2 x 4g.20gb but A100-40GB allows at most 1");
        let e = place(m, &counts(&[(Profile::G3, 2), (Profile::G1, 1)])).unwrap_err();
        assert_eq!(e.to_string(), "needs 9 memory slices but a GPU has 8");
        let e = place(m, &counts(&[(Profile::G4, 1), (Profile::G2, 2)])).unwrap_err();
        assert_eq!(e.to_string(), "needs 8 compute slices but a GPU has 7");
    }

    /// On the shipped catalog the totals are exact: every multiset within the slice, count and instance limits has
    /// an arrangement, so [`NoFit::Arrangement`] is only a guard for future models.
    #[test]
    fn every_multiset_within_the_totals_is_placeable() {
        fn rec(model: GpuModel, i: usize, counts: &mut BTreeMap<Profile, usize>, checked: &mut usize) {
            if i == Profile::ALL.len() {
                match place(model, counts) {
                    Ok(l) => assert_eq!(&l.profile_counts(), counts),
                    Err(e) => assert!(!matches!(e, NoFit::Arrangement { .. }), "{counts:?}: {e}"),
                }
                *checked += 1;
                return;
            }
            let p = Profile::ALL[i];
            for n in 0..=usize::from(model.profile(p).unwrap().max_count) {
                if n == 0 {
                    counts.remove(&p);
                } else {
                    counts.insert(p, n);
                }
                rec(model, i + 1, counts, checked);
            }
            counts.remove(&p);
        }
        let mut checked = 0;
        rec(GpuModel::A100_40GB, 0, &mut BTreeMap::new(), &mut checked);
        assert_eq!(checked, 8 * 2 * 5 * 4 * 3 * 2 * 2);
    }

    #[test]
    fn export_then_import_keeps_the_multiset_for_every_layout() {
        for model in [GpuModel::A100_40GB, GpuModel::H100_80GB] {
            let layouts = all_layouts(model, ProfileSet::All);
            for l in &layouts {
                let text = export("x", model, l);
                let back = import(&parse(&text).unwrap(), "x", model).unwrap();
                assert_eq!(back.len(), 1);
                assert_eq!(back[0].layout.profile_counts(), l.profile_counts(), "{l}\n{text}");
                assert_eq!(back[0].layout.validate(model), Ok(()));
            }
            // Every multiset that some layout realises can be placed.
            for ms in multisets(&layouts) {
                let mut counts = BTreeMap::new();
                for p in ms {
                    *counts.entry(p).or_insert(0) += 1;
                }
                assert_eq!(place(model, &counts).map(|l| l.profile_counts()), Ok(counts));
            }
        }
    }

    #[test]
    fn bad_files_are_refused() {
        assert!(matches!(parse("version: v2\nmig-configs: {}\n"), Err(MigPartedError::Version(v)) if v == "v2"));
        let e = parse("version: v1\nmig-configs:\n  a:\n    - devices: all\n      mig-enabled: true\n      bogus: 1\n")
            .unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
    }
}
