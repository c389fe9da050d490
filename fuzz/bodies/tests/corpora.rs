//! Every committed corpus file (`fuzz/corpus/TARGET/`) through its target's body, on the stable toolchain: what the
//! fuzzers found once keeps working without a nightly toolchain or libFuzzer. One test per target, so that they run
//! side by side; a failure names every file that panicked.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use tessera_fuzz_bodies::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs every file of `fuzz/corpus/NAME/` through the target `NAME`, in name order.
fn run_corpus(name: &str) {
    let (_, body) = TARGETS.iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("no target {name}"));
    let dir = fuzz_dir().join("corpus").join(name);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a corpus entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{}: an empty corpus", dir.display());
    let failed: Vec<String> = files
        .iter()
        .filter(|file| {
            let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            catch_unwind(AssertUnwindSafe(|| body(&data))).is_err()
        })
        .map(|file| file.display().to_string())
        .collect();
    assert!(failed.is_empty(), "{name}: {} of {} corpus files panicked: {failed:?}", failed.len(), files.len());
}

macro_rules! corpus_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run_corpus(stringify!($name));
            }
        )*

        /// The tests above, the bodies' list, the libFuzzer targets and the corpus directories name the same targets.
        #[test]
        fn every_target_has_a_test_a_binary_and_a_corpus() {
            let mut tests = vec![$(stringify!($name)),*];
            tests.sort_unstable();
            let mut bodies: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
            bodies.sort_unstable();
            let listed = |dir: &str, suffix: &str| {
                let mut names: Vec<String> = std::fs::read_dir(fuzz_dir().join(dir))
                    .expect(dir)
                    .map(|e| e.expect("an entry").file_name().to_string_lossy().into_owned())
                    .filter_map(|n| n.strip_suffix(suffix).map(str::to_owned))
                    .collect();
                names.sort_unstable();
                names
            };
            assert_eq!(tests, bodies, "corpora.rs and TARGETS differ");
            assert_eq!(listed("fuzz_targets", ".rs"), bodies, "fuzz_targets/ and TARGETS differ");
            assert_eq!(listed("corpus", ""), bodies, "corpus/ and TARGETS differ");
        }
    };
}

corpus_tests!(
    trace_azure2019,
    trace_azure2021,
    trace_azure_llm,
    trace_alibaba,
    trace_generic,
    tenant_toml,
    model_toml,
    fleet_toml,
    study_toml,
    agent_config,
    coordinator_config,
    migparted_yaml,
    layout_str,
    load_exposition,
    proto_agent_requests,
    proto_coordinator_requests,
    proto_coordinator_answers,
    proto_coordinator_api_requests,
    proto_raft_requests,
    raft_log,
);
