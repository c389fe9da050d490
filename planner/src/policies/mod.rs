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
pub mod oracle;
pub mod paris;
pub mod static_layout;
pub mod tessera;

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
        make: || Box::new(tessera::Tessera),
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
        name: "oracle",
        about: "perfect-forecast reference: tessera planning with the true future rates (not a bound)",
        make: || Box::new(oracle::Oracle),
    },
];

/// The names of every registered policy, in registry order.
pub fn names() -> Vec<&'static str> {
    REGISTRY.iter().map(|e| e.name).collect()
}

/// The policy called `name`.
pub fn by_name(name: &str) -> Result<Box<dyn Policy>, String> {
    REGISTRY
        .iter()
        .find(|e| e.name == name)
        .map(|e| (e.make)())
        .ok_or_else(|| format!("unknown policy {name:?} (known: {})", names().join(", ")))
}

/// One line per policy, `name: about`, for help texts.
pub fn help() -> String {
    REGISTRY.iter().map(|e| format!("{}: {}", e.name, e.about)).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_makes_the_policy_it_names() {
        for e in REGISTRY {
            assert_eq!((e.make)().name(), e.name);
        }
        let mut names = names();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len(), "policy names are unique");
        assert!(by_name("nonsense").err().is_some_and(|e| e.contains("known: tessera")));
    }
}
