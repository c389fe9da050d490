//! `replay plan` end to end: the binary on a synthetic input, a dumped input re-planned, and bad input.

use std::path::{Path, PathBuf};
use std::process::Command;

fn replay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_replay"));
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    c
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("plan_cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn synthetic_rounds_print_solve_time_objective_bound_and_gap() {
    let dump = scratch("input.json");
    let out = replay()
        .args(["plan", "--synthetic", "--gpus", "2", "--tenants", "5", "--slots", "6", "--seed", "4", "--repeat", "2"])
        .args(["--policy", "tessera", "--json", "--dump"])
        .arg(&dump)
        .output()
        .unwrap();
    let v = json(&out);
    for key in ["solve_ms", "objective", "bound", "gap"] {
        assert!(v[key].is_number(), "{key} missing in {v}");
    }
    assert!(v["objective"].as_f64().unwrap() > 0.0);
    assert!(v["bound"].as_f64().unwrap() >= v["objective"].as_f64().unwrap() - 1e-6);
    assert_eq!(v["rounds"], 2);

    // The dumped input re-plans to the same plan.
    let again = json(
        &replay()
            .args(["plan", "--policy", "tessera", "--json", "--repeat", "1", "--input"])
            .arg(&dump)
            .output()
            .unwrap(),
    );
    assert_eq!(again["objective"], v["objective"]);

    // Every policy, in one table.
    let all = tessera_planner::policies::names().join(",");
    let out = replay().args(["plan", "--policy", &all, "--repeat", "1", "--input"]).arg(&dump).output().unwrap();
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8(out.stdout).unwrap();
    for policy in tessera_planner::policies::names() {
        assert!(table.lines().any(|l| l.starts_with(policy)), "{policy} missing:\n{table}");
    }
}

#[test]
fn bad_input_is_named_by_file_line_and_field() {
    let dump = scratch("bad-source.json");
    let out = replay()
        .args(["plan", "--synthetic", "--gpus", "1", "--tenants", "1", "--slots", "3", "--repeat", "1", "--dump"])
        .arg(&dump)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = std::fs::read_to_string(&dump).unwrap();
    let bad = text.replacen("\"slot_s\": 10.0", "\"slot_s\": \"ten\"", 1);
    assert_ne!(bad, text);
    let path = scratch("bad.json");
    std::fs::write(&path, bad).unwrap();
    let out = replay().args(["plan", "--input"]).arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("bad.json:") && err.contains("config.slot_s"), "{err}");

    let out = replay().args(["plan", "--synthetic", "--policy", "nonsense"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("unknown policy"));
    let out = replay().args(["plan", "--input", "/nonexistent/input.json"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8(out.stderr).unwrap().contains("cannot read"));
}

#[test]
fn warm_rounds_follow_one_another_and_report_the_cold_one_apart() {
    let base = ["plan", "--synthetic", "--gpus", "2", "--tenants", "5", "--slots", "6", "--seed", "4", "--json"];
    let v = json(&replay().args(base).args(["--repeat", "3", "--warm", "2"]).output().unwrap());
    assert_eq!(v["rounds"], 2, "the cold first round is not counted: {v}");
    assert_eq!(v["warm_slots"], 2);
    assert!(v["cold_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(v["solve_ms_all"].as_array().unwrap().len(), 2);
    assert!(v["bound"].as_f64().unwrap() >= v["objective"].as_f64().unwrap() - 1e-6);
    // The chain is seeded: the same command gives the same plans.
    let again = json(&replay().args(base).args(["--repeat", "3", "--warm", "2"]).output().unwrap());
    assert_eq!(again["objective"], v["objective"]);
    // A later round is another input: its plan differs from the first round's.
    let first = json(&replay().args(base).args(["--repeat", "1"]).output().unwrap());
    assert_ne!(first["objective"], v["objective"]);

    for (args, needle) in
        [(["--repeat", "1", "--warm", "2"], "at least 2"), (["--repeat", "3", "--warm", "0"], "--warm")]
    {
        let out = replay().args(base).args(args).output().unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{err}");
    }
}
