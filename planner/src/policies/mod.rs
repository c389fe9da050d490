//! The policies, one file each, and the registry that names them.
//!
//! A policy is a [`Policy`]: level 1 (which tenants share which GPU, from [`crate::assign`]) and a level 2 per
//! GPU built from the shared toolkit in [`crate::level2`]. No policy imports another: what two of them share lives
//! in the toolkit. Each file opens with the original algorithm, what was adapted to MIG, and its parameters.
//!
//! Adding a policy is a new file here and one line in [`REGISTRY`]; `--policy` values, help texts and every caller
//! (replay, the coordinator, the reports) find it there and ask the trait, never the name.

pub mod astraea;
pub mod ekya;
pub mod migrator;
pub mod paris;
pub mod perfect_forecast;
pub mod static_layout;
pub mod tessera;

use crate::error::UnknownPolicy;
use crate::policy::Policy;

/// A registered policy.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// Its name (`--policy NAME`).
    pub name: &'static str,
    /// What it is, in a line (help texts).
    pub about: &'static str,
    /// Makes one.
    pub make: fn() -> Box<dyn Policy>,
}

/// Every policy, in the order tables list them.
pub const REGISTRY: &[Entry] = &[
    Entry {
        name: "tessera",
        about: "ours: fleet-wide level 1, goodput column generation over the forecast band, warm starts",
        make: || Box::new(tessera::Tessera::default()),
    },
    Entry { name: "migrator", about: "MIGRator's per-GPU goodput ILP", make: || Box::new(migrator::Migrator) },
    Entry {
        name: "paris",
        about: "PARIS heterogeneous partitions with ELSA dispatch",
        make: || Box::new(paris::Paris),
    },
    Entry {
        name: "ekya",
        about: "Ekya's thief scheduler per 200 s retraining window",
        make: || Box::new(ekya::Ekya::default()),
    },
    Entry {
        name: "astraea",
        about: "Astraea: most load within SLO, accuracy-blind",
        make: || Box::new(astraea::Astraea),
    },
    Entry {
        name: "static",
        about: "mig-parted all-balanced layout, never reconfigured",
        make: || Box::new(static_layout::StaticLayout),
    },
    Entry {
        name: "perfect-forecast",
        about: "reference: tessera planning with the true future rates (not a bound; see replay's upper bound)",
        make: || Box::new(perfect_forecast::PerfectForecast),
    },
];

/// Tessera with one idea switched off at a time, for ablation studies: by name like any policy, but not among the
/// defaults of a run.
pub const ABLATIONS: &[Entry] = &[
    Entry {
        name: "tessera-spread",
        about: "ablation: tessera with level 1 spreading tenants by demand instead of the fleet placement",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::Spread)),
    },
    Entry {
        name: "tessera-point",
        about: "ablation: tessera planning for the forecast mean instead of its band",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::PointForecast)),
    },
    Entry {
        name: "tessera-no-tail",
        about: "ablation: tessera without crediting retraining beyond the horizon",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::NoTail)),
    },
    Entry {
        name: "tessera-cold",
        about: "ablation: tessera without warm starts",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::ColdStart)),
    },
    Entry {
        name: "tessera-no-burst",
        about: "ablation: tessera without replanning on bursts (where the run replans on bursts)",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::NoBurstReplans)),
    },
    Entry {
        name: "tessera-default-epochs",
        about: "ablation: tessera retraining at the default epochs instead of choosing them with the layout",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::DefaultEpochs)),
    },
    Entry {
        name: "tessera-full-rounds",
        about: "ablation: tessera solving every GPU every round instead of only those whose inputs left the band",
        make: || Box::new(tessera::Tessera::without(tessera::Ablation::FullRounds)),
    },
];

/// The policy a coordinator plans with unless told otherwise.
pub const DEFAULT_POLICY: &str = "tessera";

/// The names of every registered policy, in registry order.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|e| e.name).collect()
}

/// The names of every policy and ablation.
pub fn all_names() -> Vec<&'static str> {
    REGISTRY.iter().chain(ABLATIONS).map(|e| e.name).collect()
}

/// The policy (or ablation) called `name`.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, UnknownPolicy> {
    REGISTRY
        .iter()
        .chain(ABLATIONS)
        .find(|e| e.name == name)
        .map(|e| (e.make)())
        .ok_or_else(|| UnknownPolicy { name: name.to_string(), known: all_names() })
}

/// One line per policy, `name: about`, for help texts.
pub fn help() -> String {
    REGISTRY.iter().chain(ABLATIONS).map(|e| format!("{}: {}", e.name, e.about)).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_makes_the_policy_it_names() {
        for e in REGISTRY.iter().chain(ABLATIONS) {
            assert_eq!((e.make)().name(), e.name);
        }
        let mut names = all_names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len() + ABLATIONS.len(), "policy names are unique");
        assert!(by_name("nonsense").err().is_some_and(|e| e.to_string().contains("known: tessera")));
    }
}
