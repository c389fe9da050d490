//! NVIDIA's own MIG configuration files (copies in `tests/fixtures/nvidia/`, with their licence) import as mig-parted
//! applies them on each GPU model, and what Tessera exports from them passes mig-parted's rules and comes back whole.

use std::collections::BTreeMap;
use std::path::Path;

use tessera_core::catalog::{GpuModel, Profile};
use tessera_core::migparted::{self, MigPartedError, MigPartedFile, PlacementSource};

const OPERATOR: &str = "gpu-operator-default-mig-parted-config.yaml";
const EXAMPLES: &str = "mig-parted-examples-config.yaml";

fn fixture(name: &str) -> MigPartedFile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia").join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    migparted::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn counts(v: &[(Profile, usize)]) -> BTreeMap<Profile, usize> {
    v.iter().copied().collect()
}

/// Every configuration on every model either imports, or is for other GPUs: no group applies to the model, or a
/// group without a filter names another model's profile (mig-parted fails on such a GPU too). A configuration made
/// only of the model's own profiles always imports. What imports exports, passes mig-parted's rules and comes back
/// with the same placements.
#[test]
fn every_configuration_imports_where_it_applies_and_round_trips() {
    for f in [OPERATOR, EXAMPLES] {
        let file = fixture(f);
        let mut imported = 0;
        for (name, groups) in &file.mig_configs {
            for model in GpuModel::ALL {
                let own = groups.iter().filter(|g| g.applies_to(model)).all(|g| {
                    g.mig_devices.iter().flatten().all(|(p, _)| model.spec().profiles.iter().any(|s| s.name == p))
                });
                match migparted::import(&file, name, model) {
                    Ok(gs) => {
                        imported += 1;
                        for g in gs {
                            assert_eq!(g.layout.validate(model), Ok(()), "{f} {name} {model}");
                            let text = migparted::export(name, model, &g.layout);
                            let back = migparted::import(&migparted::parse(&text).unwrap(), name, model).unwrap();
                            assert_eq!(back[0].layout, g.layout, "{f} {name} {model}\n{text}");
                            let want = if g.layout.is_empty() {
                                PlacementSource::Nothing
                            } else {
                                PlacementSource::Annotation
                            };
                            assert_eq!(back[0].placements, want);
                        }
                    }
                    Err(MigPartedError::NotForModel { .. }) => {}
                    Err(MigPartedError::UnknownProfile { .. }) if !own => {}
                    Err(e) => panic!("{f}: {name} on {model}: {e}"),
                }
            }
        }
        assert!(imported >= 19, "{f}: only {imported} (configuration, model) pairs import");
    }
}

/// The operator's filtered configurations give one layout per model, the one meant for it.
#[test]
fn the_operators_device_filters_pick_each_models_group() {
    let file = fixture(OPERATOR);
    let one = |name: &str, model: GpuModel| {
        let gs = migparted::import(&file, name, model).unwrap_or_else(|e| panic!("{name} {model}: {e}"));
        assert_eq!(gs.len(), 1, "{name} on {model}: {gs:?}");
        gs.into_iter().next().unwrap()
    };
    for model in GpuModel::ALL {
        let g = one("all-balanced", model);
        assert_eq!(g.layout.profile_counts(), counts(&[(Profile::G1, 2), (Profile::G2, 1), (Profile::G3, 1)]));
        assert_eq!(g.layout.to_string(), "1g@0 1g@1 2g@2 3g@4", "{model}");
        assert_eq!(g.placements, PlacementSource::Chosen { ignored: None });
        assert!(!one("all-disabled", model).mig_enabled);
        let enabled = one("all-enabled", model);
        assert!(enabled.mig_enabled && enabled.layout.is_empty());
    }
    // all-1g.10gb has a group for 80 GB boards (7 x 1g.10gb) and one for 40 GB boards (4 x 1g.10gb, there the 1g
    // profile with two memory slices).
    assert_eq!(one("all-1g.10gb", GpuModel::H100_80GB).layout.profile_counts(), counts(&[(Profile::G1, 7)]));
    assert_eq!(one("all-1g.10gb", GpuModel::A100_40GB).layout.profile_counts(), counts(&[(Profile::G1Double, 4)]));
    let e = migparted::import(&file, "all-1g.10gb", GpuModel::B200_180GB).unwrap_err();
    assert!(matches!(e, MigPartedError::NotForModel { .. }), "{e}");
}

/// The ConfigMap as shipped: read through its `config.yaml`, whose content is the mig-parted file itself.
#[test]
fn the_configmap_and_its_config_yaml_read_the_same() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/nvidia").join(OPERATOR);
    let text = std::fs::read_to_string(path).unwrap();
    let map: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text).unwrap();
    let inner = map["data"]["config.yaml"].as_str().unwrap();
    assert_eq!(migparted::parse(inner).unwrap(), fixture(OPERATOR));
    assert!(fixture(OPERATOR).mig_configs.len() > 80);
}
