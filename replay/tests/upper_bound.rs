//! The upper bound is a bound: on random scenarios (traces, fleets, loads, SLO rules, sharing), in both executors, no
//! policy's measured goodput ever exceeds it. Deterministic: the scenarios come from a fixed seed.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tessera_replay::run::RunArgs;
use tessera_replay::run::compare::compare;

#[derive(clap::Parser)]
struct Flags {
    #[command(flatten)]
    run: RunArgs,
}

fn args(flags: &[String]) -> RunArgs {
    use clap::Parser;
    Flags::try_parse_from(std::iter::once("replay".to_string()).chain(flags.iter().cloned())).unwrap().run
}

#[test]
fn no_policy_ever_exceeds_the_upper_bound() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let traces = [
        "azure-llm-2023-conv.csv",
        "azure-llm-2023-code.csv",
        "azure-functions-2021-sample.csv",
        "alibaba-openb-2023-pods.csv",
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(37);
    let policies = tessera_planner::policies::all_names().join(",");
    // Every trace under every executor and late-request rule, each on a random fleet, load and seed; every policy
    // and ablation.
    let mut cases = Vec::new();
    for name in traces {
        for executor in ["discrete", "fluid"] {
            for late in ["shed", "serve"] {
                cases.push((name, executor, late));
            }
        }
    }
    for (k, (name, executor, late)) in cases.into_iter().enumerate() {
        // Every third case lets tessera and the reference share instances (the bound then drops its relaxation
        // that charges retraining for slices).
        let sharing = ["exclusive", "priority", "timeslice"][k % 3];
        let trace = root.join("traces").join(name);
        let gpus = rng.random_range(1..=2usize);
        let load = [0.3, 0.8, 1.6][rng.random_range(0..3)];
        let seed = rng.random_range(1..1000u64);
        let flags: Vec<String> = [
            "--trace",
            &trace.to_string_lossy(),
            "--gpus",
            &gpus.to_string(),
            "--load",
            &load.to_string(),
            "--duration",
            "3m",
            "--horizon",
            "6",
            "--executor",
            executor,
            "--late-requests",
            late,
            "--seed",
            &seed.to_string(),
            "--sharing",
            sharing,
            "--policy",
            &policies,
            "--models-dir",
            &root.join("configs/models").to_string_lossy(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (cmp, _) = compare(&args(&flags), true).unwrap();
        let bound = cmp.upper_bound.as_ref().unwrap().goodput;
        let best = cmp.runs.iter().map(|r| r.total.goodput).fold(0.0, f64::max);
        eprintln!(
            "{executor}, late {late}, sharing {sharing}, {} on {gpus} GPU(s) at load {load}, seed {seed}: {} policies, best {best:.1}, \
             bound {bound:.1} ({:.3})",
            name,
            cmp.runs.len(),
            best / bound
        );
        assert!(bound.is_finite() && bound > 0.0, "{flags:?}: bound {bound}");
        for r in &cmp.runs {
            assert!(
                r.total.goodput <= bound * (1.0 + 1e-9),
                "{executor}, late {late}, {name} on {gpus} GPU(s) at load {load}, seed {seed}: {} measured {} above \
                 the upper bound {bound}",
                r.policy,
                r.total.goodput
            );
            // The bound credits at most the requests that arrived, at accuracy at most 1.
            assert!(r.total.within_slo <= r.total.requests);
        }
        let requests = cmp.runs[0].total.requests as f64;
        assert!(bound <= requests + 1e-6, "the bound {bound} credits more than the {requests} requests");
    }
}
