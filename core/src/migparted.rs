//! Import and export of NVIDIA mig-parted configuration files, the de-facto interchange format for MIG layouts, and
//! of the GPU Operator's ConfigMap that carries one (`data: {config.yaml: ...}`):
//!
//! ```yaml
//! version: v1
//! mig-configs:
//!   all-balanced:
//!     - device-filter: ["0x20B010DE", "0x20B110DE"]
//!       devices: all
//!       mig-enabled: true
//!       mig-devices:
//!         "1g.5gb": 2
//!         "2g.10gb": 1
//!         "3g.20gb": 1
//! ```
//!
//! **Device filters.** A group with a `device-filter` applies only to GPUs whose PCI device ID (device, then vendor:
//! `0x20B010DE` is device 0x20B0 of vendor 0x10DE) is listed; a group without one applies to every GPU. Import for a
//! catalog model keeps the groups that apply to one of the boards the model stands for ([`pci_device_ids`]), as
//! mig-parted does on a node. An entry that is not a device ID matches nothing (mig-parted ignores it too); a
//! subsystem qualifier (`0x20B010DE:0x145F10DE`) is not modelled, so the entry matches by its device ID.
//!
//! **Placements.** mig-parted gives profile *counts*, not placements; the driver's default placement order can fail
//! where another order works (NVIDIA MIG User Guide, placements). A file written by [`export`] keeps Tessera's exact
//! placements in a comment line mig-parted ignores (`# tessera.placements: NAME[GROUP] MODEL: LAYOUT`), and
//! [`import`] takes them back where they realise the group's counts on the model. Otherwise [`place`] picks explicit
//! placements: among the layouts with exactly the requested counts, the one that strands the fewest compute slices,
//! then leaves the most room for further instances, then comes first in enumeration order; and [`ImportedGroup`]
//! says that Tessera chose them. When no arrangement exists it says why.
//!
//! **Validation.** [`parse`] refuses what mig-parted's own parser refuses (`api/spec/v1/spec.go` in
//! github.com/NVIDIA/mig-parted): a version other than `v1`, unknown fields, no configuration or an empty one, a group
//! without `devices` or `mig-enabled`, `mig-enabled: true` without `mig-devices` (an empty map is fine),
//! `mig-devices` entries with `mig-enabled: false`, and `mig-devices` whose counts are all 0.

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
    /// Tessera's placements found in the file's `# tessera.placements:` comment lines.
    #[serde(skip)]
    pub placements: Vec<PlacementNote>,
}

/// One `# tessera.placements: NAME[GROUP] MODEL: LAYOUT` line: the placements Tessera meant for a group on a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementNote {
    /// The configuration's name.
    pub config: String,
    /// The group's index in the configuration.
    pub group: usize,
    /// The model's short name, as written.
    pub model: String,
    /// The layout, as written.
    pub layout: String,
}

/// The comment prefix of a [`PlacementNote`] line.
const PLACEMENTS_PREFIX: &str = "# tessera.placements:";

impl PlacementNote {
    fn parse(line: &str) -> Option<PlacementNote> {
        let rest = line.trim_start().strip_prefix(PLACEMENTS_PREFIX)?.strip_prefix(' ')?;
        let (head, layout) = rest.rsplit_once(": ")?;
        let (config_group, model) = head.rsplit_once(' ')?;
        let (config, group) = config_group.strip_suffix(']')?.rsplit_once('[')?;
        Some(PlacementNote {
            config: config.to_string(),
            group: group.parse().ok()?,
            model: model.to_string(),
            layout: layout.trim().to_string(),
        })
    }
}

impl std::fmt::Display for PlacementNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{PLACEMENTS_PREFIX} {}[{}] {}: {}", self.config, self.group, self.model, self.layout)
    }
}

/// One entry of a configuration: a set of devices and their layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceGroup {
    /// PCI device IDs the entry applies to: one string or a list (see the module doc).
    #[serde(rename = "device-filter", default, skip_serializing_if = "Option::is_none")]
    pub device_filter: Option<serde_yaml_ng::Value>,
    /// `all` or a list of device indices.
    pub devices: Devices,
    /// Whether MIG mode is on.
    #[serde(rename = "mig-enabled")]
    pub mig_enabled: bool,
    /// Profile name (the model's nvidia-smi name) to count; required (possibly empty) when MIG is on.
    #[serde(rename = "mig-devices", default, skip_serializing_if = "Option::is_none")]
    pub mig_devices: Option<BTreeMap<String, u32>>,
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
    /// The group's index in its configuration.
    pub group: usize,
    /// The devices it applies to.
    pub devices: Devices,
    /// Whether MIG mode is on (if off, `layout` is empty).
    pub mig_enabled: bool,
    /// The layout, with explicit placements.
    pub layout: Layout,
    /// Where the placements come from.
    pub placements: PlacementSource,
}

/// Where an imported layout's placements come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlacementSource {
    /// Nothing to place (MIG off, or no instances).
    Nothing,
    /// The file's `# tessera.placements:` line for the group and model.
    Annotation,
    /// Chosen by [`place`]: the file gives counts only. `ignored` says why a placements line was not used, if the
    /// file had one for the group and model.
    Chosen {
        /// Why the file's placements line was not taken.
        ignored: Option<String>,
    },
}

/// PCI device IDs (device, then NVIDIA's vendor ID 0x10DE) of the boards each catalog model stands for, as
/// mig-parted's `device-filter` names them. From the GPU Operator's default MIG ConfigMap
/// (`assets/state-mig-manager/0400_configmap.yaml` in github.com/NVIDIA/gpu-operator), which groups boards by MIG
/// table, restricted to the boards each catalog entry describes (`catalog.rs`): the H100 PCIe and NVL boards have
/// other SM counts and are not H100-80GB here.
pub fn pci_device_ids(model: GpuModel) -> &'static [u32] {
    match model {
        // A100-SXM4-40GB, A100-PCIE-40GB.
        GpuModel::A100_40GB => &[0x20B0_10DE, 0x20B1_10DE],
        // A100-SXM4-80GB, A100 80GB PCIe.
        GpuModel::A100_80GB => &[0x20B2_10DE, 0x20B5_10DE],
        // H100 SXM5 80GB.
        GpuModel::H100_80GB => &[0x2330_10DE],
        // H200 141GB, H200 NVL.
        GpuModel::H200_141GB => &[0x2335_10DE, 0x233B_10DE],
        // B200.
        GpuModel::B200_180GB => &[0x2901_10DE],
    }
}

/// The PCI device IDs a `device-filter` value lists (`None`: no filter); entries that are not IDs are left out.
fn filter_ids(filter: &serde_yaml_ng::Value) -> Vec<u32> {
    let entries: Vec<&str> = match filter {
        serde_yaml_ng::Value::String(s) => vec![s.as_str()],
        serde_yaml_ng::Value::Sequence(v) => v.iter().filter_map(serde_yaml_ng::Value::as_str).collect(),
        _ => Vec::new(),
    };
    entries
        .into_iter()
        .filter_map(|e| {
            let primary = e.trim().split(':').next().unwrap_or_default();
            let hex = primary.strip_prefix("0x").or_else(|| primary.strip_prefix("0X"))?;
            u32::from_str_radix(hex, 16).ok()
        })
        .collect()
}

/// A `device-filter` value on one line: `0x20B010DE` or `[0x20B010DE, 0x20B110DE]`.
fn filter_text(filter: &serde_yaml_ng::Value) -> String {
    let one = |v: &serde_yaml_ng::Value| {
        v.as_str()
            .map_or_else(|| serde_yaml_ng::to_string(v).unwrap_or_default().trim().replace('\n', " "), str::to_string)
    };
    match filter {
        serde_yaml_ng::Value::Sequence(v) => format!("[{}]", v.iter().map(one).collect::<Vec<_>>().join(", ")),
        other => one(other),
    }
}

impl DeviceGroup {
    /// Whether the group applies to GPUs of `model` (see the module doc).
    pub fn applies_to(&self, model: GpuModel) -> bool {
        match &self.device_filter {
            None => true,
            Some(serde_yaml_ng::Value::String(s)) if s.is_empty() => true,
            Some(serde_yaml_ng::Value::Sequence(v)) if v.is_empty() => true,
            Some(f) => filter_ids(f).iter().any(|id| pci_device_ids(model).contains(id)),
        }
    }
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
    /// A rule of mig-parted's format is broken (see the module doc); `at` names the field.
    #[error("{at}: {rule}")]
    Rule {
        /// Where: `mig-configs`, `mig-configs.NAME[GROUP]`, ...
        at: String,
        /// What is wrong.
        rule: String,
    },
    /// A Kubernetes ConfigMap without a mig-parted file in its `data`.
    #[error("ConfigMap: {0}")]
    ConfigMap(String),
    /// The mig-parted file inside a ConfigMap is at fault.
    #[error("data.{key}: {error}")]
    InConfigMap {
        /// The `data` entry.
        key: String,
        /// What is wrong with it.
        error: Box<MigPartedError>,
    },
    /// No device group of the configuration applies to the model.
    #[error(
        "mig-configs.{config}: no device group applies to {model} (device filters: {}; {model} is {})",
        filters.join(" | "),
        pci_device_ids(*model).iter().map(|id| format!("{id:#010X}")).collect::<Vec<_>>().join(", ")
    )]
    NotForModel {
        /// Configuration name.
        config: String,
        /// The model.
        model: GpuModel,
        /// Each group's filter, as written.
        filters: Vec<String>,
    },
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

/// Parses a mig-parted file, or a Kubernetes ConfigMap holding one (the GPU Operator's `default-mig-parted-config`:
/// its `config.yaml` entry, or its only entry), and checks mig-parted's rules (see the module doc).
pub fn parse(text: &str) -> Result<MigPartedFile, MigPartedError> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| MigPartedError::Syntax(e.to_string()))?;
    if value.get("kind").and_then(serde_yaml_ng::Value::as_str) != Some("ConfigMap") {
        return parse_file(text);
    }
    let data = value
        .get("data")
        .and_then(serde_yaml_ng::Value::as_mapping)
        .ok_or_else(|| MigPartedError::ConfigMap("no `data` mapping".into()))?;
    let keys: Vec<String> = data.keys().filter_map(|k| k.as_str().map(str::to_string)).collect();
    let key = if keys.iter().any(|k| k == "config.yaml") {
        "config.yaml".to_string()
    } else if keys.len() == 1 {
        keys[0].clone()
    } else {
        return Err(MigPartedError::ConfigMap(format!(
            "`data` has no `config.yaml` entry (has: {})",
            if keys.is_empty() { "nothing".to_string() } else { keys.join(", ") }
        )));
    };
    let inner = data
        .get(key.as_str())
        .and_then(serde_yaml_ng::Value::as_str)
        .ok_or_else(|| MigPartedError::ConfigMap(format!("data.{key}: not a string")))?;
    parse_file(inner).map_err(|error| MigPartedError::InConfigMap { key, error: Box::new(error) })
}

fn parse_file(text: &str) -> Result<MigPartedFile, MigPartedError> {
    let mut file: MigPartedFile = serde_yaml_ng::from_str(text).map_err(|e| MigPartedError::Syntax(e.to_string()))?;
    if file.version != "v1" {
        return Err(MigPartedError::Version(file.version));
    }
    let rule = |at: String, rule: &str| Err(MigPartedError::Rule { at, rule: rule.to_string() });
    if file.mig_configs.is_empty() {
        return rule("mig-configs".into(), "at least one configuration is required");
    }
    for (name, groups) in &file.mig_configs {
        if groups.is_empty() {
            return rule(format!("mig-configs.{name}"), "at least one device group is required");
        }
        for (i, g) in groups.iter().enumerate() {
            let at = format!("mig-configs.{name}[{i}]");
            match &g.mig_devices {
                None if g.mig_enabled => return rule(at, "`mig-devices` is required when `mig-enabled` is true"),
                Some(d) if !g.mig_enabled && !d.is_empty() => {
                    return rule(at, "`mig-devices` lists devices but `mig-enabled` is false");
                }
                Some(d) if !d.is_empty() && d.values().all(|n| *n == 0) => {
                    return rule(format!("{at}.mig-devices"), "all counts are 0");
                }
                _ => {}
            }
        }
    }
    file.placements = text.lines().filter_map(PlacementNote::parse).collect();
    Ok(file)
}

/// The layouts of configuration `name` in `file` for GPUs of `model`, with explicit placements: one per device group
/// that applies to the model (see the module doc); an error when none does.
pub fn import(file: &MigPartedFile, name: &str, model: GpuModel) -> Result<Vec<ImportedGroup>, MigPartedError> {
    let groups = file.mig_configs.get(name).ok_or_else(|| MigPartedError::NoSuchConfig {
        name: name.to_string(),
        have: file.mig_configs.keys().cloned().collect(),
    })?;
    let imported: Vec<ImportedGroup> = groups
        .iter()
        .enumerate()
        .filter(|(_, g)| g.applies_to(model))
        .map(|(i, g)| import_group(file, name, i, g, model))
        .collect::<Result<_, _>>()?;
    if imported.is_empty() {
        return Err(MigPartedError::NotForModel {
            config: name.to_string(),
            model,
            filters: groups.iter().map(|g| g.device_filter.as_ref().map_or("none".to_string(), filter_text)).collect(),
        });
    }
    Ok(imported)
}

fn import_group(
    file: &MigPartedFile,
    name: &str,
    i: usize,
    g: &DeviceGroup,
    model: GpuModel,
) -> Result<ImportedGroup, MigPartedError> {
    let mut counts: BTreeMap<Profile, usize> = BTreeMap::new();
    if g.mig_enabled {
        for (profile_name, &n) in g.mig_devices.iter().flatten() {
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
    let chosen = |ignored: Option<String>| -> Result<ImportedGroup, MigPartedError> {
        let layout = place(model, &counts).map_err(|reason| MigPartedError::NoFit {
            config: name.to_string(),
            group: i,
            reason,
        })?;
        let placements = if layout.is_empty() { PlacementSource::Nothing } else { PlacementSource::Chosen { ignored } };
        Ok(ImportedGroup { group: i, devices: g.devices.clone(), mig_enabled: g.mig_enabled, layout, placements })
    };
    let note = file
        .placements
        .iter()
        .rev()
        .find(|n| n.config == name && n.group == i && GpuModel::lookup(&n.model) == Some(model));
    let Some(note) = note.filter(|_| !counts.is_empty()) else { return chosen(None) };
    match Layout::parse_for(&note.layout, Some(model)) {
        Err(e) => chosen(Some(format!("its placements `{}` do not parse: {e}", note.layout))),
        Ok(l) => match l.validate(model) {
            Err(e) => chosen(Some(format!("its placements `{l}` are not valid on {model}: {e}"))),
            Ok(()) if l.profile_counts() != counts => {
                chosen(Some(format!("its placements `{l}` do not have the group's profile counts")))
            }
            Ok(()) => Ok(ImportedGroup {
                group: i,
                devices: g.devices.clone(),
                mig_enabled: g.mig_enabled,
                layout: l,
                placements: PlacementSource::Annotation,
            }),
        },
    }
}

/// A mig-parted file with one configuration `name` that applies `layout` to every GPU of `model` (a device filter
/// with the model's PCI device IDs), the empty layout as MIG on with no instances; its placements are kept in a
/// `# tessera.placements:` line, since mig-parted files carry counts only.
pub fn export(name: &str, model: GpuModel, layout: &Layout) -> String {
    let group = DeviceGroup {
        device_filter: Some(serde_yaml_ng::Value::Sequence(
            pci_device_ids(model).iter().map(|id| serde_yaml_ng::Value::String(format!("{id:#010X}"))).collect(),
        )),
        devices: Devices::All(AllDevices::All),
        mig_enabled: true,
        mig_devices: Some(
            layout
                .profile_counts()
                .into_iter()
                .map(|(p, n)| (model.profile(p).map_or(p.short_name(), |s| s.name).to_string(), n as u32))
                .collect(),
        ),
    };
    let file = MigPartedFile {
        version: "v1".into(),
        mig_configs: BTreeMap::from([(name.to_string(), vec![group])]),
        placements: Vec::new(),
    };
    let header = format!(
        "# Written by Tessera for NVIDIA mig-parted ({model}). mig-parted files give profile counts only and the\n\
         # driver places the instances: the tessera.placements line keeps Tessera's placements for `agent mig import`.\n"
    );
    let note =
        PlacementNote { config: name.to_string(), group: 0, model: model.to_string(), layout: layout.to_string() };
    // A name with a line break (YAML counts NEL, LS and PS too) or another control character cannot be written in a
    // comment line: its placements are left out.
    let one_line = !name.chars().any(|c| c.is_control() || matches!(c, '\u{2028}' | '\u{2029}'));
    let note = if layout.is_empty() || !one_line { String::new() } else { format!("{note}\n") };
    format!("{header}{note}{}", serde_yaml_ng::to_string(&file).expect("a mig-parted file always serialises"))
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
        assert_eq!(g[0].placements, PlacementSource::Chosen { ignored: None });
        let g = import(&file, "custom", GpuModel::A100_40GB).unwrap();
        assert_eq!(g[0].devices, Devices::List(vec![0, 1]));
        assert_eq!(g[0].layout.to_string(), "4g@0 3g@4");
        let g = import(&file, "all-disabled", GpuModel::A100_40GB).unwrap();
        assert!(!g[0].mig_enabled && g[0].layout.is_empty());
        assert_eq!(g[0].placements, PlacementSource::Nothing);
    }

    #[test]
    fn device_filters_pick_the_groups_for_the_model() {
        let text = r#"
version: v1
mig-configs:
  all-1g:
    - device-filter: ["0x233010DE", "0x20B210DE"]
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 7}
    - device-filter: "0x20B010DE"
      devices: all
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
    - device-filter: ["0x20B110DE:0x145F10DE", "A100-PCIE-40GB"]
      devices: [3]
      mig-enabled: false
"#;
        let file = parse(text).unwrap();
        let h100 = import(&file, "all-1g", GpuModel::H100_80GB).unwrap();
        assert_eq!((h100.len(), h100[0].group, h100[0].layout.len()), (1, 0, 7));
        let a100 = import(&file, "all-1g", GpuModel::A100_40GB).unwrap();
        // The plain ID and, by its device ID, the subsystem-qualified one; the product name matches nothing.
        assert_eq!(a100.iter().map(|g| g.group).collect::<Vec<_>>(), vec![1, 2]);
        let e = import(&file, "all-1g", GpuModel::B200_180GB).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mig-configs.all-1g: no device group applies to B200-180GB (device filters: [0x233010DE, 0x20B210DE] | \
             0x20B010DE | [0x20B110DE:0x145F10DE, A100-PCIE-40GB]; B200-180GB is 0x290110DE)"
        );
    }

    #[test]
    fn a_configmap_is_read_through_its_config_yaml() {
        let indented: String = BALANCED.lines().map(|l| format!("    {l}\n")).collect();
        let map = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  config.yaml: |\n{indented}");
        let file = parse(&map).unwrap();
        assert_eq!(file, parse(BALANCED).unwrap());
        let bad = "kind: ConfigMap\ndata:\n  config.yaml: |\n    version: v2\n    mig-configs: {}\n";
        assert_eq!(
            parse(bad).unwrap_err().to_string(),
            "data.config.yaml: version: `v2` is not supported (expected v1)"
        );
        let two = "kind: ConfigMap\ndata:\n  a.yaml: x\n  b.yaml: y\n";
        assert_eq!(
            parse(two).unwrap_err().to_string(),
            "ConfigMap: `data` has no `config.yaml` entry (has: a.yaml, b.yaml)"
        );
        assert_eq!(parse("kind: ConfigMap\n").unwrap_err().to_string(), "ConfigMap: no `data` mapping");
    }

    #[test]
    fn mig_parted_rules_are_enforced() {
        let group = |body: &str| format!("version: v1\nmig-configs:\n  c:\n    - devices: all\n{body}");
        let cases = [
            ("version: v1\nmig-configs: {}\n".to_string(), "mig-configs: at least one configuration is required"),
            (
                "version: v1\nmig-configs:\n  c: []\n".to_string(),
                "mig-configs.c: at least one device group is required",
            ),
            (
                group("      mig-enabled: true\n"),
                "mig-configs.c[0]: `mig-devices` is required when `mig-enabled` is true",
            ),
            (
                group("      mig-enabled: false\n      mig-devices: {\"1g.5gb\": 1}\n"),
                "mig-configs.c[0]: `mig-devices` lists devices but `mig-enabled` is false",
            ),
            (
                group("      mig-enabled: true\n      mig-devices: {\"1g.5gb\": 0}\n"),
                "mig-configs.c[0].mig-devices: all counts are 0",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(parse(&text).unwrap_err().to_string(), want, "{text}");
        }
        // Accepted: MIG on with no instances, MIG off with an empty map.
        for body in
            ["      mig-enabled: true\n      mig-devices: {}\n", "      mig-enabled: false\n      mig-devices: {}\n"]
        {
            assert!(parse(&group(body)).is_ok(), "{body}");
        }
    }

    #[test]
    fn exported_placements_come_back_and_wrong_ones_are_named() {
        let m = GpuModel::H100_80GB;
        let layout = Layout::parse_for("3g@4 2g@0 1g@2 1g@3", Some(m)).unwrap();
        let text = export("mine", m, &layout);
        assert!(text.contains("# tessera.placements: mine[0] H100-80GB: 2g@0 1g@2 1g@3 3g@4\n"), "{text}");
        let back = import(&parse(&text).unwrap(), "mine", m).unwrap();
        assert_eq!((&back[0].layout, &back[0].placements), (&layout, &PlacementSource::Annotation));
        // Counts edited by hand: the placements line no longer fits and Tessera chooses.
        let edited = text.replace("1g.10gb: 2", "1g.10gb: 1");
        let back = import(&parse(&edited).unwrap(), "mine", m).unwrap();
        assert_eq!(back[0].layout.to_string(), "1g@0 2g@2 3g@4");
        assert_eq!(
            back[0].placements,
            PlacementSource::Chosen {
                ignored: Some("its placements `2g@0 1g@2 1g@3 3g@4` do not have the group's profile counts".into())
            }
        );
        // A name YAML would break across lines keeps no placements line, and the file stays valid.
        for name in ["a\nb", "a\u{2028}b", "a\u{85}b"] {
            let text = export(name, m, &layout);
            assert!(!text.contains(PLACEMENTS_PREFIX), "{text}");
            let back = import(&parse(&text).unwrap(), name, m).unwrap();
            assert_eq!(back[0].layout.profile_counts(), layout.profile_counts());
        }
        // Another model's line is not taken.
        let other = text.replace("] H100-80GB:", "] A100-80GB:");
        let back = import(&parse(&other).unwrap(), "mine", m).unwrap();
        assert_eq!(back[0].placements, PlacementSource::Chosen { ignored: None });
    }

    #[test]
    fn import_says_why_nothing_fits() {
        let file = parse(BALANCED).unwrap();
        let e = import(&file, "nope", GpuModel::A100_40GB).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mig-configs: no configuration named `nope` (have: all-balanced, all-disabled, custom)"
        );
        let e = import(&file, "custom", GpuModel::H100_80GB).unwrap_err();
        assert!(e.to_string().contains("`3g.20gb` is not a H100-80GB profile"), "{e}");
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
    fn export_then_import_gives_back_every_layout() {
        for model in GpuModel::ALL {
            let layouts = all_layouts(model, ProfileSet::All);
            for l in layouts.iter().chain([&Layout::empty()]) {
                let text = export("x", model, l);
                let back = import(&parse(&text).unwrap(), "x", model).unwrap();
                assert_eq!(back.len(), 1);
                assert_eq!(&back[0].layout, l, "{text}");
                // Another model's GPUs are not touched by it.
                for other in GpuModel::ALL.into_iter().filter(|o| *o != model) {
                    assert!(matches!(
                        import(&parse(&text).unwrap(), "x", other),
                        Err(MigPartedError::NotForModel { .. })
                    ));
                }
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
