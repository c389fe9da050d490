//! `replay study`: a small study writes its tables, CSV and plot with intervals over seeds; bad study files are
//! refused with the file and the field or scenario named.

use std::path::{Path, PathBuf};
use std::process::Command;

fn replay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_replay"));
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    c
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("study_cli").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

const STUDY: &str = r#"
name = "small"
description = "Two policies on two minutes of the conversation trace."
seeds = [1, 2, 3]
policies = ["tessera", "static"]

[options]
executor = "fluid"
duration = "2m"
horizon = 6

[goals]
over_bound = 0.5
ratio = { static = 1.0 }

[[scenario]]
name = "conv"
set = "evaluation"
trace = "traces/azure-llm-2023-conv.csv"
gpus = 1
load = 0.5

[[scenario]]
name = "conv-tuning"
set = "tuning"
trace = "traces/azure-llm-2023-conv.csv"
gpus = 1
load = 0.9
"#;

#[test]
fn a_study_writes_tables_with_intervals_csv_and_a_plot() {
    let dir = scratch("small");
    let file = dir.join("small.toml");
    // Two trace families in the evaluation set: each gets a table of its own besides the set's.
    let study = STUDY.replace("set = \"evaluation\"\n", "set = \"evaluation\"\nfamily = \"steady\"\n")
        + "\n[[scenario]]\nname = \"code\"\nset = \"evaluation\"\nfamily = \"bursty\"\n\
           trace = \"traces/azure-llm-2023-code.csv\"\ngpus = 1\nload = 0.5\n";
    std::fs::write(&file, study).unwrap();
    let out = replay().arg("study").arg(&file).arg("--out").arg(&dir).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(dir.join("small/results.md")).unwrap();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{md}\n"));
    for needle in [
        "## Study: small",
        "### Evaluation set",
        "### Tuning set",
        "| tessera / upper bound | >= 0.50 |",
        "| tessera / static | >= 1.00 |",
        "### conv (evaluation set)",
        "Steady traces of the evaluation set (conv):",
        "Bursty traces of the evaluation set (code):",
        "| not within SLO | below best accuracy |",
        "`replay --duration 2m --executor fluid --gpus 1 --horizon 6 --load 0.5",
        " ± ",
    ] {
        assert!(md.contains(needle), "{needle:?} missing:\n{md}");
    }
    let runs = std::fs::read_to_string(dir.join("small/runs.csv")).unwrap();
    assert!(runs.starts_with("scenario,set,seed,policy,goodput,upper_bound,goodput_over_bound,"));
    assert_eq!(runs.lines().count(), 1 + 3 * 3 * 2, "scenarios x seeds x policies");
    for row in runs.lines().skip(1) {
        let f: Vec<&str> = row.split(',').collect();
        let (g, b): (f64, f64) = (f[4].parse().unwrap(), f[5].parse().unwrap());
        assert!(g <= b + 1e-6, "above the bound: {row}");
        // Goodput and the two losses reach at least the bound (the ceiling is the bound and what no policy earns).
        let (slo, acc): (f64, f64) = (f[9].parse().unwrap(), f[10].parse().unwrap());
        assert!(slo >= 0.0 && acc >= 0.0 && g / b + slo + acc >= 1.0 - 1e-6, "{row}");
    }
    let summary = std::fs::read_to_string(dir.join("small/summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 1 + 3 * 2);
    for figure in ["goodput_over_bound.svg", "evaluation_over_bound.svg", "tuning_over_bound.svg"] {
        assert!(std::fs::read_to_string(dir.join("small").join(figure)).unwrap().starts_with("<svg"), "{figure}");
        assert!(md.contains(figure), "results.md does not show {figure}");
    }
    // The same study gives the same rows (planning times aside).
    let again = replay().arg("study").arg(&file).arg("--out").arg(dir.join("again")).output().unwrap();
    assert!(again.status.success());
    let figures = |csv: &str| -> Vec<String> {
        csv.lines().map(|l| l.rsplit_once(',').map_or(l, |(head, _)| head).to_string()).collect()
    };
    assert_eq!(figures(&runs), figures(&std::fs::read_to_string(dir.join("again/small/runs.csv")).unwrap()));
}

#[test]
fn bad_study_files_name_the_file_and_what_is_wrong() {
    let dir = scratch("bad");
    let cases = [
        (STUDY.replace("seeds = [1, 2, 3]", "seeds = [1, 2, 3]\ncolour = 1"), "unknown field `colour`"),
        (
            STUDY.replace("policies = [\"tessera\", \"static\"]", "policies = [\"tessera\", \"nope\"]"),
            "unknown policy \"nope\"",
        ),
        (
            STUDY.replace("set = \"tuning\"", "set = \"holdout\""),
            "scenario conv-tuning: set must be tuning or evaluation",
        ),
        (STUDY.replace("load = 0.5", "load = 0.5\nflux = 3"), "scenario conv:"),
        (STUDY.replace("load = 0.5", "load = 0.5\nfamily = \"spiky\""), "scenario conv: family must be one of steady"),
        (STUDY.replace("load = 0.5", "load = 0.5\nseed = 3"), "\"seed\" is set by the study"),
        (
            STUDY.replace("gpus = 1\nload = 0.5", "gpus = 0\nload = 0.5"),
            "scenario conv seed 1: --gpus must be at least 1",
        ),
    ];
    for (i, (text, expected)) in cases.iter().enumerate() {
        let file = dir.join(format!("bad{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let out = replay().arg("study").arg(&file).arg("--out").arg(&dir).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "case {i}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.contains(&format!("bad{i}.toml")) && err.contains(expected), "case {i}: {err}");
    }
}

#[test]
fn a_study_in_shards_merges_to_the_numbers_of_one_run() {
    let dir = scratch("shards");
    let file = dir.join("small.toml");
    std::fs::write(&file, STUDY).unwrap();
    let one = replay().arg("study").arg(&file).arg("--out").arg(dir.join("one")).output().unwrap();
    assert!(one.status.success(), "{}", String::from_utf8_lossy(&one.stderr));
    // 6 (scenario, seed) jobs in 4 shards: two of two jobs, two of one.
    let parts = dir.join("parts");
    for k in 1..=4 {
        let out = replay()
            .arg("study")
            .arg(&file)
            .args(["--shard", &format!("{k}/4"), "--out"])
            .arg(&parts)
            .output()
            .unwrap();
        assert!(out.status.success(), "shard {k}: {}", String::from_utf8_lossy(&out.stderr));
        let written = String::from_utf8(out.stdout).unwrap();
        assert!(written.trim_end().ends_with(&format!("part-{k}-of-4.json")), "{written}");
    }
    assert!(!parts.join("small/results.md").exists(), "a shard writes its part, not results");
    let merged = replay().args(["study", "merge"]).arg(&file).arg("--out").arg(&parts).output().unwrap();
    assert!(merged.status.success(), "{}", String::from_utf8_lossy(&merged.stderr));
    // The same rows in the same order, planning times aside; the same summary.
    let figures = |p: PathBuf| -> Vec<String> {
        let csv = std::fs::read_to_string(p).unwrap();
        csv.lines().map(|l| l.rsplit_once(',').map_or(l, |(head, _)| head).to_string()).collect()
    };
    assert_eq!(figures(dir.join("one/small/runs.csv")), figures(parts.join("small/runs.csv")));
    let summary = |d: &str| std::fs::read_to_string(dir.join(d).join("small/summary.csv")).unwrap();
    assert_eq!(summary("one"), summary("parts"));
    let md = std::fs::read_to_string(parts.join("small/results.md")).unwrap();
    assert!(md.contains("in 4 shards, the longest"), "{md}");
    let tables = |md: &str| md.lines().filter(|l| l.starts_with('|')).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(tables(&std::fs::read_to_string(dir.join("one/small/results.md")).unwrap()), tables(&md));

    let merge = |extra: &[&str], study: &Path| {
        let out = replay().args(["study", "merge"]).arg(study).arg("--out").arg(&parts).args(extra).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{extra:?} was accepted");
        String::from_utf8(out.stderr).unwrap()
    };
    // A shard given twice, and the wrong --seeds.
    let copy = dir.join("copy.json");
    std::fs::copy(parts.join("small/part-2-of-4.json"), &copy).unwrap();
    let part_dir = parts.join("small");
    let err = merge(&["--parts", part_dir.to_str().unwrap(), copy.to_str().unwrap()], &file);
    assert!(err.contains("shard 2/4 again") && err.contains("copy.json"), "{err}");
    let err = merge(&["--seeds", "2"], &file);
    assert!(err.contains("made with seeds [1, 2, 3]") && err.contains("--seeds"), "{err}");
    // Another version of the study file.
    let changed = dir.join("changed/small.toml");
    std::fs::create_dir_all(changed.parent().unwrap()).unwrap();
    std::fs::write(&changed, STUDY.replace("load = 0.9", "load = 0.8")).unwrap();
    let err = merge(&[], &changed);
    assert!(err.contains("part-1-of-4.json") && err.contains("another version of"), "{err}");
    // A part with a row taken out.
    let first = parts.join("small/part-1-of-4.json");
    let mut part: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&first).unwrap()).unwrap();
    part["rows"].as_array_mut().unwrap().pop();
    std::fs::write(&first, part.to_string()).unwrap();
    let err = merge(&[], &file);
    assert!(err.contains("part-1-of-4.json") && err.contains("not one for each of"), "{err}");
    // A shard missing.
    std::fs::remove_file(parts.join("small/part-3-of-4.json")).unwrap();
    let err = merge(&[], &file);
    assert!(err.contains("study small: shard(s) 3/4 missing"), "{err}");
    // K/N out of range.
    for bad in ["0/4", "5/4", "2", "a/b"] {
        let out = replay().arg("study").arg(&file).args(["--shard", bad]).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "--shard {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("expected K/N"), "--shard {bad}");
    }
}
