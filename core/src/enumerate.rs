//! Enumeration of the valid layouts of a GPU model.
//!
//! A depth-first search over the driver's placements in (start, profile) order: each placement is either taken (if
//! it keeps the layout valid) or skipped, so every valid layout is produced exactly once, in a deterministic order.
//! A layout is *maximal* when no placement of the considered profiles can be added to it.
//!
//! With the five classic profiles there are 297 non-empty layouts (37 profile multisets), 19 of them maximal
//! (14 multisets); adding the double-memory 1g gives 722 / 77 / 78 / 38 (over the MIG User Guide's placements).

use std::collections::BTreeSet;

use crate::catalog::{GpuModel, Profile};
use crate::layout::{Layout, Placement};

/// Which profiles an enumeration considers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProfileSet {
    /// 1g, 2g, 3g, 4g, 7g.
    #[default]
    Classic,
    /// The classic profiles and the double-memory 1g (`1g.2x`).
    WithDoubleMemory,
    /// Every profile, including `1g+me`.
    All,
}

impl ProfileSet {
    /// The profiles in the set.
    pub fn profiles(self) -> &'static [Profile] {
        match self {
            ProfileSet::Classic => &Profile::CLASSIC,
            ProfileSet::WithDoubleMemory => &Profile::WITH_DOUBLE_MEMORY,
            ProfileSet::All => &Profile::ALL,
        }
    }
}

/// Every valid non-empty layout of `model` built from `set`, in a deterministic order.
pub fn all_layouts(model: GpuModel, set: ProfileSet) -> Vec<Layout> {
    let candidates: Vec<Placement> =
        Placement::all_for(set.profiles()).into_iter().filter(|p| model.profile(p.profile).is_some()).collect();
    let mut out = Vec::new();
    let mut current = Layout::empty();
    walk(model, &candidates, 0, &mut current, &mut out);
    out
}

fn walk(model: GpuModel, candidates: &[Placement], from: usize, current: &mut Layout, out: &mut Vec<Layout>) {
    for (i, &p) in candidates.iter().enumerate().skip(from) {
        if current.can_add(model, p) {
            current.insert(p);
            out.push(current.clone());
            walk(model, candidates, i + 1, current, out);
            current.remove(p);
        }
    }
}

/// Whether no placement of `set` can be added to `layout` on `model`.
pub fn is_maximal(model: GpuModel, set: ProfileSet, layout: &Layout) -> bool {
    Placement::all_for(set.profiles()).into_iter().all(|p| !layout.can_add(model, p))
}

/// The maximal layouts of `model` built from `set`.
pub fn maximal_layouts(model: GpuModel, set: ProfileSet) -> Vec<Layout> {
    all_layouts(model, set).into_iter().filter(|l| is_maximal(model, set, l)).collect()
}

/// The distinct profile multisets among `layouts`, as sorted profile lists.
pub fn multisets(layouts: &[Layout]) -> BTreeSet<Vec<Profile>> {
    layouts.iter().map(|l| l.placements().iter().map(|p| p.profile).collect::<Vec<_>>()).map(sorted).collect()
}

fn sorted(mut v: Vec<Profile>) -> Vec<Profile> {
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(model: GpuModel, set: ProfileSet) -> (usize, usize, usize, usize) {
        let all = all_layouts(model, set);
        let max = maximal_layouts(model, set);
        (all.len(), multisets(&all).len(), max.len(), multisets(&max).len())
    }

    #[test]
    fn classic_counts_match_the_reference() {
        for model in GpuModel::ALL {
            assert_eq!(counts(model, ProfileSet::Classic), (297, 37, 19, 14), "{model}");
        }
    }

    #[test]
    fn double_memory_counts_match_the_reference() {
        for model in GpuModel::ALL {
            assert_eq!(counts(model, ProfileSet::WithDoubleMemory), (722, 77, 78, 38), "{model}");
        }
    }

    #[test]
    fn the_nineteen_maximal_classic_layouts_are_the_reference_list() {
        let expected = [
            "7g@0",
            "4g@0 3g@4",
            "3g@0 3g@4",
            "2g@0 2g@2 3g@4",
            "2g@0 1g@2 1g@3 3g@4",
            "1g@0 1g@1 2g@2 3g@4",
            "1g@0 1g@1 1g@2 1g@3 3g@4",
            "4g@0 2g@4 1g@6",
            "3g@0 2g@4 1g@6",
            "4g@0 1g@4 1g@5 1g@6",
            "3g@0 1g@4 1g@5 1g@6",
            "2g@0 2g@2 2g@4 1g@6",
            "2g@0 2g@2 1g@4 1g@5 1g@6",
            "2g@0 1g@2 1g@3 2g@4 1g@6",
            "1g@0 1g@1 2g@2 2g@4 1g@6",
            "2g@0 1g@2 1g@3 1g@4 1g@5 1g@6",
            "1g@0 1g@1 2g@2 1g@4 1g@5 1g@6",
            "1g@0 1g@1 1g@2 1g@3 2g@4 1g@6",
            "1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6",
        ];
        let got: BTreeSet<Layout> = maximal_layouts(GpuModel::A100_40GB, ProfileSet::Classic).into_iter().collect();
        let want: BTreeSet<Layout> = expected.iter().map(|s| s.parse().unwrap()).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn enumeration_is_deterministic_and_every_layout_is_valid_and_distinct() {
        let a = all_layouts(GpuModel::H100_80GB, ProfileSet::All);
        assert_eq!(a, all_layouts(GpuModel::H100_80GB, ProfileSet::All));
        let distinct: BTreeSet<&Layout> = a.iter().collect();
        assert_eq!(distinct.len(), a.len());
        for l in &a {
            assert_eq!(l.validate(GpuModel::H100_80GB), Ok(()), "{l}");
        }
        // The media-extension 1g is at most one per GPU, so it never doubles up.
        assert!(a.iter().all(|l| l.count(Profile::G1Me) <= 1));
    }
}
