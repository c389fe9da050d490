//! Every file under `configs/` parses and validates, and the example tenants and fleets are accepted by the fleet
//! state machine. A file in a folder this test does not know is a failure: new config kinds need a parser here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use tessera_core::GpuModel;
use tessera_core::config::{load_fleet, load_model_dir, load_tenants};
use tessera_core::fleet::{Command, FleetState, GpuDescriptor};
use tessera_core::ids::GpuId;
use tessera_core::migparted;
use tessera_core::time::SimTime;

fn configs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs")
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

#[test]
fn every_config_file_parses() {
    let root = configs();
    let models = load_model_dir(&root.join("models")).unwrap_or_else(|e| panic!("{e}"));
    assert!(models.len() >= 6, "ship at least six model profiles, found {}", models.len());
    let mut parsed = 0;
    for path in files_under(&root) {
        let rel = path.strip_prefix(&root).unwrap().to_string_lossy().replace('\\', "/");
        let folder = rel.split('/').next().unwrap_or("");
        match (folder, path.extension().and_then(|e| e.to_str())) {
            ("models", Some("toml")) => {} // loaded above
            ("tenants", Some("toml")) => {
                for t in load_tenants(&path).unwrap_or_else(|e| panic!("{e}")) {
                    assert!(models.contains_key(&t.model), "{rel}: tenant {} uses unknown model `{}`", t.id, t.model);
                }
            }
            ("fleets", Some("toml")) => {
                let f = load_fleet(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(f.gpu_count() > 0, "{rel}");
            }
            ("mig-parted", Some("yaml")) => {
                // The file stem names the GPU model the profile names belong to.
                let stem = path.file_stem().unwrap().to_string_lossy();
                let model: GpuModel = stem.parse().unwrap_or_else(|e| panic!("{rel}: {e}"));
                let file =
                    migparted::parse(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{rel}: {e}"));
                for name in file.mig_configs.keys() {
                    for g in migparted::import(&file, name, model).unwrap_or_else(|e| panic!("{rel}: {e}")) {
                        assert_eq!(g.layout.validate(model), Ok(()), "{rel}: {name}");
                    }
                }
            }
            // A service's own configuration: parsed and validated by that crate's tests (tessera-agent:
            // `config::tests::the_shipped_config_is_valid`, tessera-coordinator: `config::tests::the_shipped_config_is_valid`),
            // which core cannot depend on.
            ("agent.toml" | "coordinator.toml", Some("toml")) => {}
            // Study files: loaded, with every scenario's flags parsed, by tessera-replay
            // (`run::study::tests::every_shipped_study_loads`).
            ("studies", Some("toml")) => {}
            _ => panic!("configs/{rel}: no parser for this file; add one to core/tests/configs.rs"),
        }
        parsed += 1;
    }
    assert!(parsed >= 10, "only {parsed} config files");
}

#[test]
fn example_fleet_and_tenants_are_accepted_by_the_state_machine() {
    let root = configs();
    let mut state = FleetState::new();
    for profile in load_model_dir(&root.join("models")).unwrap().into_values() {
        state.apply(Command::PutModel { profile }).unwrap();
    }
    let fleet = load_fleet(&root.join("fleets/mixed.toml")).unwrap();
    for n in &fleet.nodes {
        let gpus = n.gpus.iter().enumerate().map(|(i, m)| GpuDescriptor::fresh(i as u32, *m)).collect();
        let address = n.address.clone().unwrap_or_else(|| format!("{}:50051", n.id));
        state.apply(Command::RegisterNode { node: n.id.clone(), address, gpus, at: SimTime::ZERO }).unwrap();
    }
    assert_eq!(state.gpus.len(), fleet.gpu_count());
    for spec in load_tenants(&root.join("tenants/cl-mix.toml")).unwrap() {
        state.apply(Command::CreateTenant { spec }).unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(state.tenants.len(), 6);
    let per_model: BTreeMap<GpuModel, usize> = state.gpus.values().fold(BTreeMap::new(), |mut m, g| {
        *m.entry(g.model).or_insert(0) += 1;
        m
    });
    assert_eq!(per_model.get(&GpuModel::H200_141GB), Some(&8));
    assert!(state.gpus.contains_key(&"h100-2/7".parse::<GpuId>().unwrap()));
}

#[test]
fn put_model_commands_survive_the_coordinators_json_log() {
    // The coordinator replicates commands as JSON inside internally tagged enums; every shipped profile, with its
    // tables keyed by slice size, must come back equal.
    for (name, profile) in load_model_dir(&configs().join("models")).unwrap() {
        let command = Command::PutModel { profile };
        let json = serde_json::to_string(&command).unwrap();
        let back: Command = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{name}: {e}\n{json}"));
        assert_eq!(back, command, "{name}");
    }
}
