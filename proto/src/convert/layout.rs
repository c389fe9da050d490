//! `Placement` and `Layout`.

use tessera_core::catalog::{MEMORY_SLICES, Profile};
use tessera_core::layout::{Layout, Placement};

use super::{ConvertError, try_all};
use crate::v1;

impl From<Placement> for v1::Placement {
    fn from(p: Placement) -> Self {
        v1::Placement { profile: p.profile.short_name().to_string(), start: u32::from(p.start) }
    }
}

impl TryFrom<v1::Placement> for Placement {
    type Error = ConvertError;
    fn try_from(p: v1::Placement) -> Result<Self, ConvertError> {
        let profile = Profile::from_short_name(&p.profile).ok_or_else(|| {
            ConvertError::new(
                "profile",
                format!("unknown profile `{}` (expected 1g, 1g+me, 1g.2x, 2g, 3g, 4g or 7g)", p.profile),
            )
        })?;
        let start = u8::try_from(p.start).ok().filter(|s| *s < MEMORY_SLICES).ok_or_else(|| {
            ConvertError::new("start", format!("{} is not a memory-slice index 0..{}", p.start, MEMORY_SLICES - 1))
        })?;
        Ok(Placement::new(profile, start))
    }
}

impl From<&Layout> for v1::Layout {
    fn from(l: &Layout) -> Self {
        v1::Layout { placements: l.placements().iter().map(|&p| p.into()).collect() }
    }
}

impl TryFrom<v1::Layout> for Layout {
    type Error = ConvertError;
    fn try_from(l: v1::Layout) -> Result<Self, ConvertError> {
        Ok(Layout::new(try_all::<_, Placement>("placements", l.placements)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements_and_layouts_round_trip() {
        let l: Layout = "4g@0 2g@4 1g@6".parse().unwrap();
        let wire = v1::Layout::from(&l);
        assert_eq!(wire.placements[1], v1::Placement { profile: "2g".into(), start: 4 });
        assert_eq!(Layout::try_from(wire).unwrap(), l);
    }

    #[test]
    fn a_bad_placement_names_its_field() {
        let wire = v1::Layout {
            placements: vec![
                v1::Placement { profile: "3g".into(), start: 0 },
                v1::Placement { profile: "5g".into(), start: 0 },
            ],
        };
        let e = Layout::try_from(wire).unwrap_err();
        assert_eq!(e.field, "placements[1].profile");
        assert!(e.message.contains("unknown profile `5g`"), "{e}");
        let e = Placement::try_from(v1::Placement { profile: "1g".into(), start: 8 }).unwrap_err();
        assert_eq!(e.to_string(), "field `start`: 8 is not a memory-slice index 0..7");
    }
}
