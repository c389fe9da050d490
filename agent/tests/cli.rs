//! The `agent mig` command line, run as a process: the counts from the reference, readable diffs, and one-line
//! errors with a non-zero exit for bad input.

use std::process::{Command, Output};

fn agent(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_agent")).args(args).output().expect("agent runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn layout_counts_match_the_reference_for_every_variant() {
    let cases: [(&[&str], &str); 4] = [
        (&[], "297 layouts, 37 distinct profile multisets"),
        (&["--maximal"], "19 maximal layouts, 14 distinct profile multisets"),
        (&["--with-double-memory"], "722 layouts, 77 distinct profile multisets"),
        (&["--maximal", "--with-double-memory"], "78 maximal layouts, 38 distinct profile multisets"),
    ];
    for gpu in ["A100-40GB", "H100-80GB"] {
        for (flags, want) in cases {
            let mut args = vec!["mig", "layouts", "--gpu", gpu, "--count"];
            args.extend_from_slice(flags);
            let o = agent(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            assert_eq!(stdout(&o).trim(), want, "{args:?}");
        }
    }
}

#[test]
fn layouts_and_diff_print_what_an_operator_reads() {
    let o = agent(&["mig", "layouts", "--gpu", "a100-40gb", "--maximal"]);
    let out = stdout(&o);
    assert_eq!(out.lines().count(), 19);
    assert!(out.lines().all(|l| l.split(' ').all(|p| p.contains('@'))), "{out}");

    let o = agent(&["mig", "diff", "--gpu", "A100-40GB", "--from", "3g@0 3g@4", "--to", "4g@0 2g@4 1g@6"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("destroy  3g@4"), "{out}");
    assert!(out.contains("5 MIG operations (2 destroy, 3 create)"), "{out}");

    let o = agent(&["mig", "diff", "--gpu", "A100-40GB", "--from", "3g@0 3g@4", "--to", "3g@0 2g@4", "--json"]);
    let plan: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(plan["unchanged"], serde_json::json!(["3g@0"]));
    assert_eq!(plan["steps"].as_array().map(Vec::len), Some(2));

    let o = agent(&["mig", "profiles", "--gpu", "NVIDIA A100-SXM4-40GB"]);
    assert!(stdout(&o).contains("3g.20gb"), "{}", stdout(&o));
}

#[test]
fn mig_parted_files_round_trip_through_the_cli() {
    let dir = std::env::temp_dir().join(format!("tessera-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("exported.yaml");
    // Placements the driver's default order would not pick come back as they were.
    let o = agent(&["mig", "export", "--gpu", "H100-80GB", "--layout", "3g@4 2g@0 1g@2 1g@3", "--name", "mine"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(&file, o.stdout).unwrap();
    let o = agent(&["mig", "import", "--gpu", "H100-80GB", "--file", file.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "mine                 devices all      2g@0 1g@2 1g@3 3g@4  (placements: the file's tessera.placements line)\n"
    );
    // The file is for H100-80GB boards only.
    let o = agent(&["mig", "import", "--gpu", "A100-80GB", "--file", file.to_str().unwrap(), "--config", "mine"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("mig-configs.mine: no device group applies to A100-80GB"), "{}", stderr(&o));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn the_gpu_operators_configmap_imports_as_shipped() {
    let configmap = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../core/tests/fixtures/nvidia/gpu-operator-default-mig-parted-config.yaml"
    );
    let o = agent(&["mig", "import", "--gpu", "H100-80GB", "--file", configmap, "--config", "all-1g.10gb"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        "all-1g.10gb          devices all      1g@0 1g@1 1g@2 1g@3 1g@4 1g@5 1g@6  (placements: chosen by Tessera; \
         mig-parted files give counts only)\n"
    );
    let o = agent(&["mig", "import", "--gpu", "A100-40GB", "--file", configmap]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("all-balanced         devices all      1g@0 1g@1 2g@2 3g@4"), "{out}");
    assert!(out.contains("all-1g.10gb          devices all      1g.2x@0 1g.2x@2 1g.2x@4 1g.2x@6"), "{out}");
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("# not for A100-40GB (") && last.contains("all-7g.80gb"), "{last}");
}

#[test]
fn bad_input_gets_a_one_line_error_and_a_non_zero_exit() {
    let cases: [(&[&str], &str); 8] = [
        (&["mig", "diff", "--gpu", "A100-40GB", "--from", "7g@0"], "required arguments were not provided: --to <TO>"),
        (
            &["mig", "diff", "--gpu", "A100-40GB", "--from", "7g@0", "--to", "-", "--create-s", "-1"],
            "error: --create-s: -1 is not a duration in seconds",
        ),
        (&["mig", "layouts", "--gpu", "A100-40GB", "--all-profiles", "--with-double-memory"], "cannot be used with"),
        (&["mig", "layouts", "--gpu", "V100"], "error: --gpu: unknown GPU model `V100`"),
        (
            &["mig", "diff", "--gpu", "A100-40GB", "--from", "3g@0 3g", "--to", "7g@0"],
            "error: --from: bad placement `3g`: expected `profile@start`",
        ),
        (
            &["mig", "diff", "--gpu", "A100-40GB", "--from", "7g@0", "--to", "4g@0 4g@4"],
            "error: --to: `4g@0 4g@4` is not a valid A100-40GB layout: 4g@4: 4g can only start at memory slice 0",
        ),
        (&["mig", "validate", "--gpu", "H100-80GB", "3g@0 2g@2"], "3g@0 and 2g@2 both use memory slice 2"),
        (&["mig", "import", "--gpu", "H100-80GB", "--file", "/nonexistent/x.yaml"], "/nonexistent/x.yaml: cannot read"),
    ];
    for (args, want) in cases {
        let o = agent(args);
        assert!(!o.status.success(), "{args:?} should fail");
        let err = stderr(&o);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn agent_run_without_a_driver_says_nvml_could_not_be_loaded_in_one_line() {
    let o = agent(&["run", "--backend", "nvml"]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    // Where a driver is installed NVML loads and the missing --config is what is reported.
    assert!(err.starts_with("error: NVML could not be loaded") || err.contains("--config is required"), "{err}");
    let o = agent(&["run", "--config", "no/such/agent.toml"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("no/such/agent.toml: cannot read"), "{}", stderr(&o));
    let o = agent(&["run", "--backend", "sim"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--backend: unknown backend `sim`"), "{}", stderr(&o));
}
