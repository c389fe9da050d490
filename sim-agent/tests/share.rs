//! The intra-instance sharing model (`tessera_sim::share`) and `sim-agent share`: determinism, accounting and the
//! bounds each mode's mechanism implies. No test compares the modes' results with one another.

use std::path::Path;
use std::process::Command;

use tessera_core::model::ModelProfile;
use tessera_core::{GpuModel, Profile};
use tessera_sim::share::{ShareMode, ShareParams, ShareReport, ShareSetup, simulate, smallest_shared_profile};

fn models() -> std::collections::BTreeMap<String, ModelProfile> {
    tessera_core::config::load_model_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models")).unwrap()
}

fn report(m: &std::collections::BTreeMap<String, ModelProfile>, mode: ShareMode, load: f64, seed: u64) -> ShareReport {
    let setup = ShareSetup {
        gpu: GpuModel::A100_40GB,
        profile: Profile::G3,
        inference: &m["resnet50"],
        training: &m["bert_base"],
        load,
        duration_s: 10.0,
        seed,
    };
    simulate(&setup, mode, &ShareParams::default()).unwrap()
}

#[test]
fn the_same_seed_gives_the_same_figures_and_another_seed_other_arrivals() {
    let m = models();
    for mode in [ShareMode::Exclusive, ShareMode::Timeslice, ShareMode::Priority] {
        assert_eq!(report(&m, mode, 0.5, 3), report(&m, mode, 0.5, 3), "{mode:?}");
        assert_ne!(report(&m, mode, 0.5, 3).requests, report(&m, mode, 0.5, 4).requests, "{mode:?}");
    }
}

/// Every request is served exactly once in every mode (the same arrivals), and instance time is not counted twice:
/// inference's busy share and training's share of the run add up to at most the whole instance.
#[test]
fn every_request_once_and_no_instance_second_counted_twice() {
    let m = models();
    for load in [0.2, 0.5, 0.8] {
        let alone = report(&m, ShareMode::Exclusive, load, 5);
        assert_eq!((alone.train_share, alone.train_throughput, alone.p99_overhead), (0.0, 0.0, 0.0));
        assert_eq!(alone.p99_ms, alone.alone_p99_ms);
        for mode in [ShareMode::Timeslice, ShareMode::Priority] {
            let r = report(&m, mode, load, 5);
            assert_eq!(r.requests, alone.requests, "{mode:?} at {load}: a request lost or served twice");
            assert_eq!(r.alone_p99_ms, alone.p99_ms);
            assert!(r.train_share > 0.0, "{mode:?} at {load}: {r:?}");
            assert!(r.inference_busy + r.train_share <= 1.0 + 1e-9, "{mode:?} at {load}: {r:?}");
            assert!(r.p50_ms <= r.p99_ms && r.p99_ms.is_finite(), "{r:?}");
            let speed = m["bert_base"].training_speed_on(GpuModel::A100_40GB, Profile::G3);
            assert!((r.train_throughput - r.train_share * speed).abs() < 1e-12);
            assert!(r.system_throughput <= 1.0 + r.train_share + 1e-12, "{r:?}");
        }
    }
}

/// The priority mode's training only uses what inference leaves, less Tally's idle wait, at the transformed
/// kernels' efficiency: its share is at most (1 - inference's busy share) x the efficiency.
#[test]
fn priority_training_fits_in_the_idle_time() {
    let m = models();
    let p = ShareParams::default();
    for load in [0.3, 0.6] {
        let r = report(&m, ShareMode::Priority, load, 9);
        assert!(r.train_share <= (1.0 - r.inference_busy) * p.transform_efficiency + 1e-9, "{r:?}");
    }
}

#[test]
fn the_default_profile_holds_both_models() {
    let m = models();
    let p = smallest_shared_profile(GpuModel::A100_40GB, &m["resnet50"], &m["bert_base"]).unwrap();
    let spec = GpuModel::A100_40GB.profile(p).unwrap();
    assert!(spec.memory_gib >= m["resnet50"].inference_memory_gib + m["bert_base"].training_memory_gib);
    let mut big = m["bert_base"].clone();
    big.training_memory_gib = 100.0;
    assert!(smallest_shared_profile(GpuModel::A100_40GB, &m["resnet50"], &big).is_none());
}

fn sim_agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sim-agent"))
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args(args)
        .output()
        .expect("sim-agent runs")
}

#[test]
fn cli_prints_the_figures_and_refuses_bad_input() {
    let args = ["share", "--mode", "priority", "--model", "resnet50", "--train-model", "bert_base"];
    let out = sim_agent(&[&args[..], &["--load", "0.5", "--seed", "3", "--duration", "5", "--json"]].concat());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    for key in ["p99_ms", "p99_overhead", "train_throughput", "alone_p99_ms", "system_throughput"] {
        assert!(v[key].is_f64(), "{key} in {v}");
    }
    assert_eq!((v["mode"].as_str(), v["profile"].as_str()), (Some("priority"), Some("1g.2x")));
    for (extra, needle) in [
        (&["--load", "1.5"][..], "load"),
        (&["--model", "zigzag"][..], "zigzag"),
        (&["--profile", "9g"][..], "9g"),
        (&["--duration", "0"][..], "--duration"),
        (&["--duration", "0.0001", "--load", "0.01"][..], "no request arrives"),
        (&["--timeslice-ms", "NaN"][..], "--timeslice-ms"),
        (&["--profile", "1g"][..], "together"),
    ] {
        let mut a: Vec<&str> = args.to_vec();
        if extra[0] == "--model" {
            a[4] = extra[1];
        } else {
            a.extend_from_slice(extra);
        }
        let out = sim_agent(&a);
        assert_eq!(out.status.code(), Some(2), "{a:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(err.starts_with("error: ") && err.contains(needle), "{a:?}: {err}");
    }
}
