//! The MIG hardware catalog: GPU models, their GPU-instance (GI) profiles, placements and compute-instance (CI)
//! profiles.
//!
//! Facts come from the NVIDIA MIG User Guide, `nvidia-smi mig -lgip` / `-lgipp` transcripts and `nvml.h` (summarised
//! in `docs/references.md`). Values those sources do not state are inferred, and a comment says so.
//!
//! ## Slice model
//! A MIG-capable GPU has 8 memory slices (0..=7) and 7 compute (SM) slices (0..=6). NVML counts placements in memory
//! slices: a placement `{start, size}` covers memory slices `start..start+size`. A profile with `c` compute slices
//! placed at `start` uses compute slices `start..start+c`: the 8th memory slice has no SM slice, so only `7g@0`,
//! `3g@4` and the double-memory `1g@6` use it, and `3g@0` leaves compute slice 3 unusable (prefer `3g@4`).
//!
//! The profile *shapes* (compute slices, memory slices, allowed starts) are the same on every model in the catalog;
//! names, SM counts, copy engines, memory and maximum counts are per model.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Number of memory slices on a MIG-capable GPU.
pub const MEMORY_SLICES: u8 = 8;
/// Number of compute (SM) slices on a MIG-capable GPU.
pub const COMPUTE_SLICES: u8 = 7;
/// Maximum number of GPU instances per GPU on every model in the catalog.
pub const MAX_GPU_INSTANCES: usize = 7;

/// A GPU-instance profile shape, independent of the GPU model (the model gives it a name and memory size).
///
/// Ordered from the smallest to the largest, so that sorted layouts read naturally.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Profile {
    /// One compute slice, one memory slice (nvidia-smi ID 19, e.g. `1g.5gb` on A100-40GB).
    G1,
    /// One compute slice, one memory slice, with the media extensions (ID 20, `+me`); at most one per GPU.
    G1Me,
    /// One compute slice with two memory slices (ID 15, e.g. `1g.10gb` on A100-40GB, `1g.20gb` on H100).
    G1Double,
    /// Two compute slices, two memory slices (ID 14).
    G2,
    /// Three compute slices, four memory slices (ID 9).
    G3,
    /// Four compute slices, four memory slices (ID 5).
    G4,
    /// The whole GPU: seven compute slices, eight memory slices (ID 0).
    G7,
}

impl Profile {
    /// Every profile, smallest first.
    pub const ALL: [Profile; 7] =
        [Profile::G1, Profile::G1Me, Profile::G1Double, Profile::G2, Profile::G3, Profile::G4, Profile::G7];

    /// The five classic profiles (1g, 2g, 3g, 4g, 7g).
    pub const CLASSIC: [Profile; 5] = [Profile::G1, Profile::G2, Profile::G3, Profile::G4, Profile::G7];

    /// The classic profiles plus the double-memory 1g.
    pub const WITH_DOUBLE_MEMORY: [Profile; 6] =
        [Profile::G1, Profile::G1Double, Profile::G2, Profile::G3, Profile::G4, Profile::G7];

    /// The nvidia-smi / NVML profile ID (`nvmlGpuInstanceProfileInfo_t::id`).
    pub const fn nvidia_id(self) -> u32 {
        match self {
            Profile::G1 => 19,
            Profile::G1Me => 20,
            Profile::G1Double => 15,
            Profile::G2 => 14,
            Profile::G3 => 9,
            Profile::G4 => 5,
            Profile::G7 => 0,
        }
    }

    /// The profile with this nvidia-smi ID.
    pub fn from_nvidia_id(id: u32) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.nvidia_id() == id)
    }

    /// Compute (SM) slices the profile owns.
    pub const fn compute_slices(self) -> u8 {
        match self {
            Profile::G1 | Profile::G1Me | Profile::G1Double => 1,
            Profile::G2 => 2,
            Profile::G3 => 3,
            Profile::G4 => 4,
            Profile::G7 => 7,
        }
    }

    /// Memory slices the profile owns (the NVML placement `size`).
    pub const fn memory_slices(self) -> u8 {
        match self {
            Profile::G1 | Profile::G1Me => 1,
            Profile::G1Double | Profile::G2 => 2,
            Profile::G3 | Profile::G4 => 4,
            Profile::G7 => 8,
        }
    }

    /// The memory-slice starts the driver accepts (`nvidia-smi mig -lgipp`).
    pub const fn allowed_starts(self) -> &'static [u8] {
        match self {
            Profile::G1 | Profile::G1Me => &[0, 1, 2, 3, 4, 5, 6],
            Profile::G1Double => &[0, 2, 4, 6],
            Profile::G2 => &[0, 2, 4],
            Profile::G3 => &[0, 4],
            Profile::G4 | Profile::G7 => &[0],
        }
    }

    /// The short, model-independent name used in layout strings: `1g`, `1g+me`, `1g.2x` (double memory), `2g`,
    /// `3g`, `4g`, `7g`.
    pub const fn short_name(self) -> &'static str {
        match self {
            Profile::G1 => "1g",
            Profile::G1Me => "1g+me",
            Profile::G1Double => "1g.2x",
            Profile::G2 => "2g",
            Profile::G3 => "3g",
            Profile::G4 => "4g",
            Profile::G7 => "7g",
        }
    }

    /// Parses a short name (`1g`, `1g+me`, `1g.2x`, `2g`, ...), case-insensitively.
    pub fn from_short_name(name: &str) -> Option<Profile> {
        Profile::ALL.into_iter().find(|p| p.short_name().eq_ignore_ascii_case(name.trim()))
    }

    /// Compute-instance configurations this GI profile supports (MIG UG): each entry is a CI size and how many of
    /// that size fit in one GI.
    pub const fn compute_instances(self) -> &'static [ComputeInstanceProfile] {
        use ComputeInstanceProfile as C;
        match self {
            Profile::G1 | Profile::G1Me | Profile::G1Double => &[C { slices: 1, max_count: 1 }],
            Profile::G2 => &[C { slices: 1, max_count: 2 }, C { slices: 2, max_count: 1 }],
            Profile::G3 => {
                &[C { slices: 1, max_count: 3 }, C { slices: 2, max_count: 1 }, C { slices: 3, max_count: 1 }]
            }
            Profile::G4 => {
                &[C { slices: 1, max_count: 4 }, C { slices: 2, max_count: 2 }, C { slices: 4, max_count: 1 }]
            }
            Profile::G7 => &[
                C { slices: 1, max_count: 7 },
                C { slices: 2, max_count: 3 },
                C { slices: 3, max_count: 2 },
                C { slices: 4, max_count: 1 },
                C { slices: 7, max_count: 1 },
            ],
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// An unknown profile short name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown MIG profile `{name}` (expected one of 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g)")]
pub struct UnknownProfile {
    /// The name that was not found.
    pub name: String,
}

impl FromStr for Profile {
    type Err = UnknownProfile;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Profile::from_short_name(s).ok_or_else(|| UnknownProfile { name: s.to_string() })
    }
}

crate::string_serde!(Profile);

/// A compute-instance size inside a GPU instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeInstanceProfile {
    /// Compute slices of the CI (`1c`, `2c`, `3c`, `4c`, `7c`).
    pub slices: u8,
    /// How many CIs of this size fit in one GI of the parent profile.
    pub max_count: u8,
}

impl ComputeInstanceProfile {
    /// The NVML CI profile index (`NVML_COMPUTE_INSTANCE_PROFILE_*`): 1c:0, 2c:1, 3c:2, 4c:3, 7c:4.
    pub const fn nvml_index(self) -> u32 {
        match self.slices {
            1 => 0,
            2 => 1,
            3 => 2,
            4 => 3,
            _ => 4,
        }
    }

    /// The nvidia-smi name, e.g. `2c`.
    pub fn name(self) -> String {
        format!("{}c", self.slices)
    }
}

/// What one GPU model says about one GI profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProfileSpec {
    /// The profile shape.
    pub profile: Profile,
    /// The nvidia-smi name on this model, e.g. `1g.10gb`.
    pub name: &'static str,
    /// Maximum number of instances of this profile per GPU.
    pub max_count: u8,
    /// Streaming multiprocessors of one instance.
    pub sms: u32,
    /// Copy engines of one instance.
    pub copy_engines: u32,
    /// Usable memory of one instance, GiB.
    pub memory_gib: f64,
}

/// A MIG-capable GPU model in the catalog.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum GpuModel {
    /// NVIDIA A100-SXM4-40GB (also the PCIe 40GB card: same MIG table).
    A100_40GB,
    /// NVIDIA A100 80GB (SXM4 and PCIe).
    A100_80GB,
    /// NVIDIA H100 80GB (SXM5 HBM3 and PCIe).
    H100_80GB,
    /// NVIDIA H200 141GB.
    H200_141GB,
    /// NVIDIA B200 180GB.
    B200_180GB,
}

/// Everything the catalog knows about one GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSpec {
    /// The model.
    pub model: GpuModel,
    /// The short name (`A100-40GB`, ...), also the canonical name in configs.
    pub short_name: &'static str,
    /// The full product name as `nvidia-smi` prints it for the reference board.
    pub product_name: &'static str,
    /// Other names `nvidia-smi` / NVML report for boards of this model (PCIe, NVL variants).
    pub aliases: &'static [&'static str],
    /// Total SMs of the 7g instance.
    pub sms_7g: u32,
    /// Usable memory of the whole GPU, GiB (what the 7g instance gets).
    pub memory_gib: f64,
    /// Minimum driver branch for MIG on this model.
    pub min_driver: &'static str,
    /// Profiles, smallest first.
    pub profiles: &'static [ProfileSpec],
}

const fn ps(
    profile: Profile,
    name: &'static str,
    max_count: u8,
    sms: u32,
    copy_engines: u32,
    memory_gib: f64,
) -> ProfileSpec {
    ProfileSpec { profile, name, max_count, sms, copy_engines, memory_gib }
}

use Profile::{G1, G1Double, G1Me, G2, G3, G4, G7};

/// A100-SXM4-40GB: MIG UG table and `nvidia-smi mig -lgip`.
const A100_40GB_PROFILES: [ProfileSpec; 7] = [
    ps(G1, "1g.5gb", 7, 14, 1, 4.75),
    ps(G1Me, "1g.5gb+me", 1, 14, 1, 4.75),
    ps(G1Double, "1g.10gb", 4, 14, 1, 9.62),
    ps(G2, "2g.10gb", 3, 28, 2, 9.62),
    ps(G3, "3g.20gb", 2, 42, 3, 19.50),
    ps(G4, "4g.20gb", 1, 56, 4, 19.50),
    ps(G7, "7g.40gb", 1, 98, 7, 39.25),
];

/// A100-80GB: same IDs and placements; 1g.10gb = 9.50 GiB and 1g.20gb / 2g.20gb = 19.50 GiB are read from the MIG
/// UG; 3g / 4g / 7g memory is *inferred* as twice the 40GB values.
const A100_80GB_PROFILES: [ProfileSpec; 7] = [
    ps(G1, "1g.10gb", 7, 14, 1, 9.50),
    ps(G1Me, "1g.10gb+me", 1, 14, 1, 9.50),
    ps(G1Double, "1g.20gb", 4, 14, 1, 19.50),
    ps(G2, "2g.20gb", 3, 28, 2, 19.50),
    ps(G3, "3g.40gb", 2, 42, 3, 39.00),
    ps(G4, "4g.40gb", 1, 56, 4, 39.00),
    ps(G7, "7g.80gb", 1, 98, 7, 78.50),
];

/// H100-SXM5-80GB: MIG UG table 7 and two real `-lgip` transcripts. The 26 SMs of 1g.20gb come from the two
/// transcripts and are unconfirmed by the guide.
const H100_80GB_PROFILES: [ProfileSpec; 7] = [
    ps(G1, "1g.10gb", 7, 16, 1, 9.75),
    ps(G1Me, "1g.10gb+me", 1, 16, 1, 9.75),
    ps(G1Double, "1g.20gb", 4, 26, 1, 19.62),
    ps(G2, "2g.20gb", 3, 32, 2, 19.62),
    ps(G3, "3g.40gb", 2, 60, 3, 39.50),
    ps(G4, "4g.40gb", 1, 64, 4, 39.50),
    ps(G7, "7g.80gb", 1, 132, 8, 79.25),
];

/// H200-141GB: names and counts from MIG UG table 8. IDs, counts, SMs, copy engines and placements were read from a
/// real H200 (driver 580.159.04, `nvidia-smi mig -lgip` and `-lgipp`, and the NVML backend's probe) and equal H100's;
/// memory is the driver's: 16.00 / 32.50 / 69.75 / 140.00 GiB. (It was once inferred as H100's scaled by 141/80,
/// which overstated the 1g profiles by 7 %.)
const H200_141GB_PROFILES: [ProfileSpec; 7] = [
    ps(G1, "1g.18gb", 7, 16, 1, 16.00),
    ps(G1Me, "1g.18gb+me", 1, 16, 1, 16.00),
    ps(G1Double, "1g.35gb", 4, 26, 1, 32.50),
    ps(G2, "2g.35gb", 3, 32, 2, 32.50),
    ps(G3, "3g.71gb", 2, 60, 3, 69.75),
    ps(G4, "4g.71gb", 1, 64, 4, 69.75),
    ps(G7, "7g.141gb", 1, 132, 8, 140.00),
];

/// B200-180GB: names from MIG UG table 9. Nothing else here was read from a B200: SMs are *inferred* (148 SMs on the
/// board, 20 per slice, 140 in 7g); copy engines *inferred* equal to H100's; memory *inferred* as H100's scaled by
/// 180/80 (the same inference overstated H200's small profiles by 7 %). On a real B200 the NVML backend reads the
/// driver's table at start, logs every difference, and the coordinator plans the node with the driver's values.
const B200_180GB_PROFILES: [ProfileSpec; 7] = [
    ps(G1, "1g.23gb", 7, 20, 1, 21.94),
    ps(G1Me, "1g.23gb+me", 1, 20, 1, 21.94),
    ps(G1Double, "1g.45gb", 4, 20, 1, 44.15),
    ps(G2, "2g.45gb", 3, 40, 2, 44.15),
    ps(G3, "3g.90gb", 2, 60, 3, 88.88),
    ps(G4, "4g.90gb", 1, 80, 4, 88.88),
    ps(G7, "7g.180gb", 1, 140, 8, 178.31),
];

static A100_40GB_SPEC: GpuSpec = GpuSpec {
    model: GpuModel::A100_40GB,
    short_name: "A100-40GB",
    product_name: "NVIDIA A100-SXM4-40GB",
    // PCIe 40GB boards have the same 108-SM chip and MIG table. A bare "A100" is ambiguous (40 or 80 GB): refused.
    aliases: &["A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB", "A100-PCIE-40GB"],
    sms_7g: 98,
    memory_gib: 39.25,
    min_driver: "R450",
    profiles: &A100_40GB_PROFILES,
};

static A100_80GB_SPEC: GpuSpec = GpuSpec {
    model: GpuModel::A100_80GB,
    short_name: "A100-80GB",
    product_name: "NVIDIA A100-SXM4-80GB",
    aliases: &["A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "A100 80GB PCIe"],
    sms_7g: 98,
    memory_gib: 78.50,
    min_driver: "R450",
    profiles: &A100_80GB_PROFILES,
};

static H100_80GB_SPEC: GpuSpec = GpuSpec {
    model: GpuModel::H100_80GB,
    short_name: "H100-80GB",
    product_name: "NVIDIA H100 80GB HBM3",
    // H100 PCIe (114 SMs) and H100 NVL have other SM counts and are not in the reference tables: not aliased.
    aliases: &["H100 80GB HBM3", "H100-SXM5-80GB"],
    sms_7g: 132,
    memory_gib: 79.25,
    min_driver: "R525",
    profiles: &H100_80GB_PROFILES,
};

static H200_141GB_SPEC: GpuSpec = GpuSpec {
    model: GpuModel::H200_141GB,
    short_name: "H200-141GB",
    product_name: "NVIDIA H200",
    aliases: &["H200", "NVIDIA H200 NVL", "H200 NVL", "H200-SXM-141GB"],
    sms_7g: 132,
    memory_gib: 140.00,
    min_driver: "R550",
    profiles: &H200_141GB_PROFILES,
};

static B200_180GB_SPEC: GpuSpec = GpuSpec {
    model: GpuModel::B200_180GB,
    short_name: "B200-180GB",
    product_name: "NVIDIA B200",
    aliases: &["B200"],
    sms_7g: 140,
    memory_gib: 178.31,
    min_driver: "R570",
    profiles: &B200_180GB_PROFILES,
};

impl GpuModel {
    /// Every model in the catalog.
    pub const ALL: [GpuModel; 5] =
        [GpuModel::A100_40GB, GpuModel::A100_80GB, GpuModel::H100_80GB, GpuModel::H200_141GB, GpuModel::B200_180GB];

    /// The catalog entry.
    pub fn spec(self) -> &'static GpuSpec {
        match self {
            GpuModel::A100_40GB => &A100_40GB_SPEC,
            GpuModel::A100_80GB => &A100_80GB_SPEC,
            GpuModel::H100_80GB => &H100_80GB_SPEC,
            GpuModel::H200_141GB => &H200_141GB_SPEC,
            GpuModel::B200_180GB => &B200_180GB_SPEC,
        }
    }

    /// The short name (`H100-80GB`).
    pub fn short_name(self) -> &'static str {
        self.spec().short_name
    }

    /// What this model says about `profile`, or `None` if the model lacks it.
    pub fn profile(self, profile: Profile) -> Option<&'static ProfileSpec> {
        self.spec().profiles.iter().find(|p| p.profile == profile)
    }

    /// Finds a profile by this model's nvidia-smi name (`1g.10gb`, `3g.40gb`), optionally prefixed with `MIG `, or
    /// by its short name (`3g`, `1g.2x`); case-insensitive.
    pub fn profile_by_name(self, name: &str) -> Option<&'static ProfileSpec> {
        let name = name.trim();
        let name = name.strip_prefix("MIG ").or_else(|| name.strip_prefix("mig ")).unwrap_or(name).trim();
        self.spec()
            .profiles
            .iter()
            .find(|p| p.name.eq_ignore_ascii_case(name))
            .or_else(|| Profile::from_short_name(name).and_then(|p| self.profile(p)))
    }

    /// Looks a model up by its short name, its product name as nvidia-smi prints it, or an alias, ignoring case
    /// and an optional `NVIDIA ` prefix.
    pub fn lookup(name: &str) -> Option<GpuModel> {
        fn norm(s: &str) -> String {
            let s = s.trim().to_ascii_lowercase();
            let s = s.strip_prefix("nvidia ").unwrap_or(&s).to_string();
            s.replace(['_', ' '], "-")
        }
        let wanted = norm(name);
        GpuModel::ALL.into_iter().find(|m| {
            let spec = m.spec();
            std::iter::once(spec.short_name)
                .chain(std::iter::once(spec.product_name))
                .chain(spec.aliases.iter().copied())
                .any(|n| norm(n) == wanted)
        })
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.short_name())
    }
}

/// An unknown GPU model name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown GPU model `{name}` (known: A100-40GB, A100-80GB, H100-80GB, H200-141GB, B200-180GB)")]
pub struct UnknownGpuModel {
    /// The name that was not found.
    pub name: String,
}

impl FromStr for GpuModel {
    type Err = UnknownGpuModel;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        GpuModel::lookup(s).ok_or_else(|| UnknownGpuModel { name: s.to_string() })
    }
}

crate::string_serde!(GpuModel);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_model_has_every_profile_with_consistent_shapes() {
        for model in GpuModel::ALL {
            let spec = model.spec();
            assert_eq!(spec.profiles.len(), Profile::ALL.len(), "{model}");
            for p in Profile::ALL {
                let ps = model.profile(p).unwrap_or_else(|| panic!("{model} lacks {p}"));
                assert!(ps.max_count >= 1);
                // The name starts with the compute-slice count, as nvidia-smi names do.
                assert!(ps.name.starts_with(&format!("{}g.", p.compute_slices())), "{}", ps.name);
                assert_eq!(ps.name.ends_with("+me"), p == Profile::G1Me);
                // No profile claims more instances than it has starts.
                assert!(usize::from(ps.max_count) <= p.allowed_starts().len());
                for &s in p.allowed_starts() {
                    assert!(s + p.memory_slices() <= MEMORY_SLICES, "{p}@{s}");
                    assert!(s + p.compute_slices() <= COMPUTE_SLICES, "{p}@{s}");
                }
            }
            assert_eq!(model.profile(Profile::G7).map(|p| p.sms), Some(spec.sms_7g));
            assert_eq!(model.profile(Profile::G7).map(|p| p.memory_gib), Some(spec.memory_gib));
        }
    }

    #[test]
    fn reference_values_for_a100_40gb_and_h100() {
        let a = GpuModel::A100_40GB;
        let g3 = a.profile(Profile::G3).unwrap();
        assert_eq!((g3.profile.nvidia_id(), g3.name, g3.max_count, g3.sms, g3.copy_engines), (9, "3g.20gb", 2, 42, 3));
        assert_eq!(g3.memory_gib, 19.50);
        let h = GpuModel::H100_80GB;
        let g1 = h.profile(Profile::G1).unwrap();
        assert_eq!((g1.name, g1.sms, g1.memory_gib), ("1g.10gb", 16, 9.75));
        let g7 = h.profile(Profile::G7).unwrap();
        assert_eq!((g7.sms, g7.copy_engines, g7.memory_gib), (132, 8, 79.25));
        assert_eq!(h.profile_by_name("MIG 1g.20gb").map(|p| p.profile), Some(Profile::G1Double));
    }

    #[test]
    fn nvidia_ids_round_trip() {
        for p in Profile::ALL {
            assert_eq!(Profile::from_nvidia_id(p.nvidia_id()), Some(p));
        }
        assert_eq!(Profile::from_nvidia_id(42), None);
    }

    #[test]
    fn models_are_found_by_short_and_nvidia_smi_names_case_insensitively() {
        let cases = [
            ("A100-40GB", GpuModel::A100_40GB),
            ("nvidia a100-sxm4-40gb", GpuModel::A100_40GB),
            ("NVIDIA A100-PCIE-40GB", GpuModel::A100_40GB),
            ("a100-80gb", GpuModel::A100_80GB),
            ("NVIDIA A100 80GB PCIe", GpuModel::A100_80GB),
            ("NVIDIA H100 80GB HBM3", GpuModel::H100_80GB),
            ("h100-80gb", GpuModel::H100_80GB),
            ("H200-141GB", GpuModel::H200_141GB),
            ("NVIDIA H200", GpuModel::H200_141GB),
            ("b200-180gb", GpuModel::B200_180GB),
            ("NVIDIA B200", GpuModel::B200_180GB),
        ];
        for (name, model) in cases {
            assert_eq!(name.parse::<GpuModel>(), Ok(model), "{name}");
        }
        for ambiguous in ["A100", "H100", "NVIDIA H100 PCIe"] {
            assert!(ambiguous.parse::<GpuModel>().is_err(), "{ambiguous}");
        }
        let err = "V100".parse::<GpuModel>().unwrap_err();
        assert!(err.to_string().contains("unknown GPU model `V100`"));
    }

    #[test]
    fn compute_instance_profiles_match_the_guide() {
        let sizes = |p: Profile| p.compute_instances().iter().map(|c| (c.slices, c.max_count)).collect::<Vec<_>>();
        assert_eq!(sizes(Profile::G2), vec![(1, 2), (2, 1)]);
        assert_eq!(sizes(Profile::G7), vec![(1, 7), (2, 3), (3, 2), (4, 1), (7, 1)]);
        for p in Profile::ALL {
            for ci in p.compute_instances() {
                assert!(ci.slices * ci.max_count <= p.compute_slices());
            }
        }
        let idx: Vec<u32> = Profile::G7.compute_instances().iter().map(|c| c.nvml_index()).collect();
        assert_eq!(idx, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn profile_names_parse() {
        assert_eq!("1G+ME".parse::<Profile>(), Ok(Profile::G1Me));
        assert_eq!("1g.2x".parse::<Profile>(), Ok(Profile::G1Double));
        assert!("5g".parse::<Profile>().is_err());
    }
}
