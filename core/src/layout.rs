//! Placements (a profile at a memory-slice start) and layouts (the set of placements on one GPU), with validation
//! that explains what is wrong.
//!
//! A layout string is a whitespace- or comma-separated list of `profile@start`, e.g. `"4g@0 2g@4 1g@6"`; profiles are
//! short names (`1g`, `1g+me`, `1g.2x`, `2g`, `3g`, `4g`, `7g`) or, when parsed for a model, that model's nvidia-smi
//! names (`1g.10gb@6`). `-` or an empty string is the empty layout.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::catalog::{COMPUTE_SLICES, GpuModel, MAX_GPU_INSTANCES, MEMORY_SLICES, Profile};

/// A GPU instance of `profile` whose memory slices start at `start` (NVML's `nvmlGpuInstancePlacement_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Placement {
    /// Memory-slice start. Declared first so that placements sort by position on the GPU.
    pub start: u8,
    /// The profile.
    pub profile: Profile,
}

impl Placement {
    /// A placement; not checked (see [`Placement::check_start`]).
    pub const fn new(profile: Profile, start: u8) -> Placement {
        Placement { start, profile }
    }

    /// Bit mask of the memory slices this placement covers (bit i = slice i).
    pub const fn memory_mask(self) -> u8 {
        mask(self.start, self.profile.memory_slices())
    }

    /// Bit mask of the compute slices this placement covers (bit i = slice i).
    pub const fn compute_mask(self) -> u8 {
        mask(self.start, self.profile.compute_slices())
    }

    /// Whether the two placements share a memory or compute slice.
    pub const fn conflicts_with(self, other: Placement) -> bool {
        self.memory_mask() & other.memory_mask() != 0 || self.compute_mask() & other.compute_mask() != 0
    }

    /// Checks that the driver accepts this start for the profile.
    pub fn check_start(self) -> Result<(), LayoutError> {
        if self.profile.allowed_starts().contains(&self.start) {
            Ok(())
        } else {
            Err(LayoutError::BadStart { placement: self, allowed: self.profile.allowed_starts().to_vec() })
        }
    }

    /// Every placement the driver accepts for one of `profiles`, in (start, profile) order.
    pub fn all_for(profiles: &[Profile]) -> Vec<Placement> {
        let mut v: Vec<Placement> =
            profiles.iter().flat_map(|&p| p.allowed_starts().iter().map(move |&s| Placement::new(p, s))).collect();
        v.sort();
        v
    }

    /// Parses `profile@start` where the profile may be a short name or, with `model`, that model's nvidia-smi name.
    pub fn parse_for(text: &str, model: Option<GpuModel>) -> Result<Placement, LayoutParseError> {
        let text = text.trim();
        let (name, start) = text.rsplit_once('@').ok_or_else(|| LayoutParseError {
            token: text.to_string(),
            reason: "expected `profile@start`, e.g. `3g@4`".into(),
        })?;
        let profile = Profile::from_short_name(name)
            .or_else(|| model.and_then(|m| m.profile_by_name(name)).map(|p| p.profile))
            .ok_or_else(|| LayoutParseError {
                token: text.to_string(),
                reason: match model {
                    Some(m) => format!(
                        "unknown profile `{name}` (short names: 1g, 1g+me, 1g.2x, 2g, 3g, 4g, 7g; {m} names: {})",
                        m.spec().profiles.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")
                    ),
                    None => format!("unknown profile `{name}` (expected 1g, 1g+me, 1g.2x, 2g, 3g, 4g or 7g)"),
                },
            })?;
        let start: u8 = start.trim().parse().ok().filter(|s| *s < MEMORY_SLICES).ok_or_else(|| LayoutParseError {
            token: text.to_string(),
            reason: format!("start `{start}` is not a memory-slice index 0..{}", MEMORY_SLICES - 1),
        })?;
        Ok(Placement::new(profile, start))
    }
}

/// `len` bits from bit `start`, cut to the 8 slices; a start past the GPU covers nothing (validation rejects it).
const fn mask(start: u8, len: u8) -> u8 {
    let bits: u32 = (1u32 << len) - 1;
    match bits.checked_shl(start as u32) {
        Some(b) => (b & 0xff) as u8,
        None => 0,
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.profile, self.start)
    }
}

impl FromStr for Placement {
    type Err = LayoutParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Placement::parse_for(s, None)
    }
}

crate::string_serde!(Placement);

/// A layout string that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad placement `{token}`: {reason}")]
pub struct LayoutParseError {
    /// The offending token.
    pub token: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Which kind of slice two placements both claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SliceKind {
    /// A memory slice.
    Memory,
    /// A compute (SM) slice.
    Compute,
}

impl fmt::Display for SliceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SliceKind::Memory => "memory",
            SliceKind::Compute => "compute",
        })
    }
}

/// Why a layout is not valid on a GPU model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum LayoutError {
    /// Two placements share a memory or compute slice.
    #[error("{a} and {b} both use {kind} slice {slice}")]
    Overlap {
        /// The first placement.
        a: Placement,
        /// The second placement.
        b: Placement,
        /// The kind of slice they both use.
        kind: SliceKind,
        /// The lowest shared slice index.
        slice: u8,
    },
    /// The profile cannot start at that memory slice.
    #[error("{placement}: {} can only start at memory slice {}", placement.profile, join(allowed))]
    BadStart {
        /// The placement.
        placement: Placement,
        /// The starts the driver accepts for the profile.
        allowed: Vec<u8>,
    },
    /// The GPU model has no such profile.
    #[error("{model} has no {profile} profile")]
    ProfileNotOnModel {
        /// The profile.
        profile: Profile,
        /// The model.
        model: GpuModel,
    },
    /// More instances of a profile than the model allows.
    #[error("{count} x {profile} but {model} allows at most {max}")]
    TooMany {
        /// The profile.
        profile: Profile,
        /// How many the layout has.
        count: usize,
        /// The most the model allows.
        max: u8,
        /// The model.
        model: GpuModel,
    },
    /// More GPU instances than the GPU supports.
    #[error("{count} GPU instances but a GPU holds at most {max}")]
    TooManyInstances {
        /// How many the layout has.
        count: usize,
        /// The most a GPU holds.
        max: usize,
    },
}

fn join(v: &[u8]) -> String {
    let parts: Vec<String> = v.iter().map(u8::to_string).collect();
    match parts.len() {
        0 => String::new(),
        1 => parts[0].clone(),
        n => format!("{} or {}", parts[..n - 1].join(", "), parts[n - 1]),
    }
}

/// The placements on one GPU, kept sorted by start then profile; duplicates are kept so that validation can
/// report them.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Layout {
    placements: Vec<Placement>,
}

impl Layout {
    /// The empty layout (MIG enabled, no instances).
    pub const fn empty() -> Layout {
        Layout { placements: Vec::new() }
    }

    /// A layout from placements in any order. Not validated: call [`Layout::validate`].
    pub fn new(placements: impl IntoIterator<Item = Placement>) -> Layout {
        let mut placements: Vec<Placement> = placements.into_iter().collect();
        placements.sort();
        Layout { placements }
    }

    /// The placements, sorted by start.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// Number of GPU instances.
    pub fn len(&self) -> usize {
        self.placements.len()
    }

    /// Whether the layout has no instance.
    pub fn is_empty(&self) -> bool {
        self.placements.is_empty()
    }

    /// Whether `p` is in the layout.
    pub fn contains(&self, p: Placement) -> bool {
        self.placements.binary_search(&p).is_ok()
    }

    /// Adds a placement (unchecked).
    pub fn insert(&mut self, p: Placement) {
        let i = self.placements.partition_point(|q| *q < p);
        self.placements.insert(i, p);
    }

    /// Removes a placement; returns whether it was there.
    pub fn remove(&mut self, p: Placement) -> bool {
        match self.placements.binary_search(&p) {
            Ok(i) => {
                self.placements.remove(i);
                true
            }
            Err(_) => false,
        }
    }

    /// Memory slices in use (bit mask).
    pub fn memory_mask(&self) -> u8 {
        self.placements.iter().fold(0, |m, p| m | p.memory_mask())
    }

    /// Compute slices in use (bit mask).
    pub fn compute_mask(&self) -> u8 {
        self.placements.iter().fold(0, |m, p| m | p.compute_mask())
    }

    /// Compute slices in use (count).
    pub fn compute_slices_used(&self) -> u8 {
        self.placements.iter().map(|p| p.profile.compute_slices()).sum()
    }

    /// How many instances of `profile` the layout has.
    pub fn count(&self, profile: Profile) -> usize {
        self.placements.iter().filter(|p| p.profile == profile).count()
    }

    /// Profile counts, ordered by profile (the layout's profile multiset).
    pub fn profile_counts(&self) -> std::collections::BTreeMap<Profile, usize> {
        let mut m = std::collections::BTreeMap::new();
        for p in &self.placements {
            *m.entry(p.profile).or_insert(0) += 1;
        }
        m
    }

    /// Checks the layout against the rules of `model`; the first problem found is returned.
    ///
    /// Rules: every profile exists on the model; every start is one the driver accepts; no memory or compute slice
    /// is used twice; no profile exceeds its maximum count; at most seven GPU instances.
    pub fn validate(&self, model: GpuModel) -> Result<(), LayoutError> {
        for p in &self.placements {
            if model.profile(p.profile).is_none() {
                return Err(LayoutError::ProfileNotOnModel { profile: p.profile, model });
            }
            p.check_start()?;
        }
        if let Some(overlap) = self.first_overlap() {
            return Err(overlap);
        }
        for (profile, count) in self.profile_counts() {
            let max = model.profile(profile).map_or(0, |p| p.max_count);
            if count > usize::from(max) {
                return Err(LayoutError::TooMany { profile, count, max, model });
            }
        }
        if self.len() > MAX_GPU_INSTANCES {
            return Err(LayoutError::TooManyInstances { count: self.len(), max: MAX_GPU_INSTANCES });
        }
        Ok(())
    }

    /// The first pair of placements that share a memory or compute slice, as a [`LayoutError::Overlap`].
    pub fn first_overlap(&self) -> Option<LayoutError> {
        for (i, a) in self.placements.iter().enumerate() {
            for b in &self.placements[i + 1..] {
                let (kind, shared) = if a.memory_mask() & b.memory_mask() != 0 {
                    (SliceKind::Memory, a.memory_mask() & b.memory_mask())
                } else if a.compute_mask() & b.compute_mask() != 0 {
                    (SliceKind::Compute, a.compute_mask() & b.compute_mask())
                } else {
                    continue;
                };
                return Some(LayoutError::Overlap { a: *a, b: *b, kind, slice: shared.trailing_zeros() as u8 });
            }
        }
        None
    }

    /// Whether `p` can be added to this (valid) layout on `model` and keep it valid.
    pub fn can_add(&self, model: GpuModel, p: Placement) -> bool {
        let Some(spec) = model.profile(p.profile) else { return false };
        p.check_start().is_ok()
            && self.placements.iter().all(|q| !q.conflicts_with(p))
            && self.count(p.profile) < usize::from(spec.max_count)
            && self.len() < MAX_GPU_INSTANCES
    }

    /// Parses a layout string, accepting `model`'s nvidia-smi profile names as well as short names. The result is
    /// not validated.
    pub fn parse_for(text: &str, model: Option<GpuModel>) -> Result<Layout, LayoutParseError> {
        let text = text.trim();
        if text.is_empty() || text == "-" {
            return Ok(Layout::empty());
        }
        text.split(|c: char| c.is_whitespace() || c == ',')
            .filter(|t| !t.is_empty())
            .map(|t| Placement::parse_for(t, model))
            .collect::<Result<Vec<_>, _>>()
            .map(Layout::new)
    }

    /// The layout with the model's nvidia-smi names, e.g. `3g.20gb@0 3g.20gb@4`.
    pub fn display_for(&self, model: GpuModel) -> String {
        if self.is_empty() {
            return "-".into();
        }
        self.placements
            .iter()
            .map(|p| match model.profile(p.profile) {
                Some(spec) => format!("{}@{}", spec.name, p.start),
                None => p.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A picture of memory-slice use, one character per slice: each instance gets a letter in start order, `.` is
    /// free and `#` is claimed twice (invalid). `4g@0 2g@4 1g@6` is `AAAABBC.`.
    pub fn slice_map(&self) -> String {
        let mut cells = ['.'; MEMORY_SLICES as usize];
        for (i, p) in self.placements.iter().enumerate() {
            let letter = char::from(b'A' + (i as u8 % 26));
            for (s, cell) in cells.iter_mut().enumerate() {
                if p.memory_mask() & (1 << s) != 0 {
                    *cell = if *cell == '.' { letter } else { '#' };
                }
            }
        }
        cells.iter().collect()
    }

    /// Compute slices left unusable: free compute slices whose memory slice is taken (`3g@0` strands slice 3).
    pub fn stranded_compute_slices(&self) -> u8 {
        let free_compute = !self.compute_mask() & ((1 << COMPUTE_SLICES) - 1);
        (free_compute & self.memory_mask()).count_ones() as u8
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("-");
        }
        for (i, p) in self.placements.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

impl FromStr for Layout {
    type Err = LayoutParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Layout::parse_for(s, None)
    }
}

crate::string_serde!(Layout);

impl FromIterator<Placement> for Layout {
    fn from_iter<I: IntoIterator<Item = Placement>>(iter: I) -> Self {
        Layout::new(iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(s: &str) -> Layout {
        s.parse().unwrap()
    }

    #[test]
    fn masks_follow_the_slice_model() {
        let p = |s: &str| s.parse::<Placement>().unwrap();
        assert_eq!(p("7g@0").memory_mask(), 0xff);
        assert_eq!(p("7g@0").compute_mask(), 0x7f);
        assert_eq!(p("3g@4").memory_mask(), 0xf0);
        assert_eq!(p("3g@4").compute_mask(), 0x70);
        assert_eq!(p("3g@0").compute_mask(), 0x07);
        assert_eq!(p("1g.2x@6").memory_mask(), 0xc0);
        assert_eq!(p("1g.2x@6").compute_mask(), 0x40);
        assert_eq!(l("3g@0").stranded_compute_slices(), 1);
        assert_eq!(l("4g@0 3g@4").stranded_compute_slices(), 0);
    }

    #[test]
    fn valid_layouts_pass() {
        for s in ["7g@0", "4g@0 3g@4", "3g@0 3g@4", "2g@0 1g@2 1g@3 2g@4 1g@6", "1g.2x@0 1g.2x@2 1g.2x@4 1g.2x@6", "-"]
        {
            assert_eq!(l(s).validate(GpuModel::A100_40GB), Ok(()), "{s}");
        }
    }

    #[test]
    fn validation_explains_what_is_wrong() {
        let m = GpuModel::A100_40GB;
        let e = l("3g@0 2g@2").validate(m).unwrap_err();
        assert_eq!(e.to_string(), "3g@0 and 2g@2 both use memory slice 2");
        let e = l("3g@2").validate(m).unwrap_err();
        assert_eq!(e.to_string(), "3g@2: 3g can only start at memory slice 0 or 4");
        let e = l("4g@4").validate(m).unwrap_err();
        assert_eq!(e.to_string(), "4g@4: 4g can only start at memory slice 0");
        let e = l("1g+me@0 1g+me@1").validate(m).unwrap_err();
        assert_eq!(e.to_string(), "2 x 1g+me but A100-40GB allows at most 1");
        let e = l("1g@3 1g@3").validate(m).unwrap_err();
        assert!(matches!(e, LayoutError::Overlap { kind: SliceKind::Memory, slice: 3, .. }));
    }

    #[test]
    fn parse_and_display_round_trip() {
        let layout = Layout::parse_for("1g.5gb@6, 2g.10gb@4  4g@0", Some(GpuModel::A100_40GB)).unwrap();
        assert_eq!(layout.to_string(), "4g@0 2g@4 1g@6");
        assert_eq!(layout.display_for(GpuModel::A100_40GB), "4g.20gb@0 2g.10gb@4 1g.5gb@6");
        assert_eq!(layout.slice_map(), "AAAABBC.");
        assert_eq!(layout.to_string().parse::<Layout>().unwrap(), layout);
        assert_eq!(l("").to_string(), "-");
    }

    #[test]
    fn parse_errors_name_the_token() {
        let e = "3g@0 5g@1".parse::<Layout>().unwrap_err();
        assert_eq!(e.token, "5g@1");
        assert!(e.to_string().contains("unknown profile `5g`"), "{e}");
        let e = "3g".parse::<Layout>().unwrap_err();
        assert!(e.to_string().contains("expected `profile@start`"), "{e}");
        let e = "3g@x".parse::<Layout>().unwrap_err();
        assert!(e.to_string().contains("not a memory-slice index"), "{e}");
        let e = "7g@0 1g@20".parse::<Layout>().unwrap_err();
        assert_eq!(e.to_string(), "bad placement `1g@20`: start `20` is not a memory-slice index 0..7");
        // Built without parsing, a far start covers no slice and fails validation instead of overflowing.
        let far = Layout::new([Placement::new(Profile::G7, 0), Placement::new(Profile::G1, 200)]);
        assert!(matches!(far.validate(GpuModel::A100_40GB), Err(LayoutError::BadStart { .. })));
    }

    #[test]
    fn can_add_agrees_with_validate() {
        let m = GpuModel::H100_80GB;
        let base = l("3g@0 1g@4");
        for p in Placement::all_for(&Profile::ALL) {
            let mut with = base.clone();
            with.insert(p);
            assert_eq!(base.can_add(m, p), with.validate(m).is_ok(), "{p}");
        }
    }

    #[test]
    fn serde_uses_the_string_form() {
        let layout = l("4g@0 3g@4");
        let json = serde_json::to_string(&layout).unwrap();
        assert_eq!(json, "\"4g@0 3g@4\"");
        assert_eq!(serde_json::from_str::<Layout>(&json).unwrap(), layout);
    }
}
