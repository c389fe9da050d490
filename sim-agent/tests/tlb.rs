//! The L3 TLB model: hand-built streams with exactly known hit and miss counts (sub-entries, set conflicts, LRU,
//! STAR sharing and revert), determinism per seed, STAR against baseline on sparse mixes, the calibration range,
//! the report cache, and the `sim-agent tlb` command line.

use std::process::Command;
use std::sync::Arc;

use tessera_sim::tlb::stream::model_stream;
use tessera_sim::tlb::subentry::{Lookup, SubEntryTlb};
use tessera_sim::tlb::{AccessPattern, TenantStreamSpec, TlbMode, TlbModel, TlbParams, simulate};

/// Page number of 64 KB sub-page `sub` of 1 MB range `base`.
fn page(base: u64, sub: u64) -> u64 {
    (base << 4) | sub
}

fn l3(mode: TlbMode) -> SubEntryTlb {
    let p = TlbParams::default();
    SubEntryTlb::new(p.l3_entries, p.l3_ways, mode).unwrap()
}

/// Bases that all map to L3 set 0 (128 sets).
fn conflicting(k: u64) -> u64 {
    k * 128
}

// 1. One tenant touching the 16 sub-pages of one range: one entry miss, 15 sub-entry misses, then only hits.
#[test]
fn t01_sixteen_sub_pages_of_one_range() {
    for mode in TlbMode::ALL {
        let mut t = l3(mode);
        let first: Vec<Lookup> = (0..16).map(|s| t.access(3, page(77, s))).collect();
        assert_eq!(first[0], Lookup::EntryMiss);
        assert!(first[1..].iter().all(|&l| l == Lookup::SubEntryMiss { shared: false }), "{mode}: {first:?}");
        assert!((0..16).all(|s| t.access(3, page(77, s)) == Lookup::Hit { shared: false }));
        let s = t.stats();
        assert_eq!((s.accesses, s.hits, s.subentry_misses, s.entry_misses), (32, 16, 15, 1), "{mode}");
        assert_eq!((s.evictions, s.shares, s.reverts), (0, 0, 0), "{mode}");
        assert_eq!(s.hit_rate(), 0.5);
    }
}

// 2. Nine ranges in one 8-way set, cycled: LRU thrashes, every lookup misses and each miss after the eighth evicts
// an entry holding one sub-entry.
#[test]
fn t02_set_conflict_evicts_with_known_counts() {
    let mut t = l3(TlbMode::Baseline);
    for _round in 0..3 {
        for k in 0..9 {
            assert_eq!(t.access(0, page(conflicting(k), 0)), Lookup::EntryMiss);
        }
    }
    let s = *t.stats();
    assert_eq!((s.accesses, s.hits, s.entry_misses, s.evictions, s.evicted_subentries), (27, 0, 27, 19, 19));
    assert_eq!(s.subentry_utilisation(), Some(1.0 / 16.0));
    // Other sets are untouched.
    assert!(t.set_contents(1).is_empty());
    assert_eq!(t.set_contents(0).len(), 8);

    // Eight ranges fit: 8 misses, then hits only.
    let mut t = l3(TlbMode::Baseline);
    let hits = (0..3).flat_map(|_| 0..8).filter(|&k| t.access(0, page(conflicting(k), 0)).is_hit()).count();
    assert_eq!(hits, 16);
    assert_eq!(t.stats().evictions, 0);
}

// 3. LRU: touching the oldest entry protects it; the next-oldest is evicted instead.
#[test]
fn t03_lru_victim() {
    let mut t = l3(TlbMode::Baseline);
    for k in 0..8 {
        t.access(0, page(conflicting(k), 0));
    }
    assert!(t.access(0, page(conflicting(0), 0)).is_hit());
    assert_eq!(t.access(0, page(conflicting(8), 0)), Lookup::EntryMiss);
    let resident: Vec<u64> = t.set_contents(0).iter().map(|e| e.bases[0].base).collect();
    assert!(resident.contains(&conflicting(0)));
    assert!(!resident.contains(&conflicting(1)), "base 1 was the LRU entry: {resident:?}");
    assert!(t.access(0, page(conflicting(0), 0)).is_hit());
    assert_eq!(t.access(0, page(conflicting(1), 0)), Lookup::EntryMiss);
}

// 4. STAR: a ninth range in a full set of sparse entries shares an entry instead of evicting; lookups on the
// shared entry report `shared`; the same address space is preferred over an older entry of another one.
#[test]
fn t04_star_shares_two_bases_in_one_entry() {
    let mut t = l3(TlbMode::Star);
    // Ways 0..7: address space 1 owns base 0 (the LRU entry); address space 2 owns the other seven.
    t.access(1, page(conflicting(0), 0));
    for k in 1..8 {
        t.access(2, page(conflicting(k), 0));
    }
    // Address space 2 misses on a new base: shares its own LRU entry (base 1), not the older base 0.
    assert_eq!(t.access(2, page(conflicting(8), 5)), Lookup::EntryMiss);
    let s = *t.stats();
    assert_eq!((s.shares, s.evictions), (1, 0));
    let set = t.set_contents(0);
    let shared: Vec<_> = set.iter().filter(|e| e.bases.len() == 2).collect();
    assert_eq!(shared.len(), 1);
    let bases: Vec<u64> = shared[0].bases.iter().map(|b| b.base).collect();
    assert_eq!(bases, vec![conflicting(1), conflicting(8)]);
    // Both bases hit, at the shared latency; every original base still hits too.
    assert_eq!(t.access(2, page(conflicting(8), 5)), Lookup::Hit { shared: true });
    assert_eq!(t.access(2, page(conflicting(1), 0)), Lookup::Hit { shared: true });
    assert_eq!(t.access(1, page(conflicting(0), 0)), Lookup::Hit { shared: false });
    // A sub-entry miss on the shared entry fills the half and keeps it shared.
    assert_eq!(t.access(2, page(conflicting(8), 6)), Lookup::SubEntryMiss { shared: true });

    // The same stream in baseline evicts instead.
    let mut b = l3(TlbMode::Baseline);
    b.access(1, page(conflicting(0), 0));
    for k in 1..9 {
        b.access(2, page(conflicting(k), if k == 8 { 5 } else { 0 }));
    }
    assert_eq!((b.stats().shares, b.stats().evictions), (0, 1));
    assert_eq!(b.access(1, page(conflicting(0), 0)), Lookup::EntryMiss);
}

// 5. STAR revert: when a base of a shared entry fills its 8th slot the other base is dropped and the entry is
// exclusive again, free to grow to 16 sub-entries.
#[test]
fn t05_star_reverts_to_exclusive_after_eight_fills() {
    let mut t = l3(TlbMode::Star);
    for k in 0..8 {
        t.access(0, page(conflicting(k), 0));
    }
    assert_eq!(t.access(0, page(conflicting(8), 0)), Lookup::EntryMiss); // shares with base 0 (LRU)
    assert_eq!(t.stats().shares, 1);
    // Fills 2..7 of base 8: still shared.
    for sub in 1..7 {
        assert_eq!(t.access(0, page(conflicting(8), sub)), Lookup::SubEntryMiss { shared: true });
    }
    assert_eq!(t.stats().reverts, 0);
    // The 8th fill: looked up as shared, then reverts.
    assert_eq!(t.access(0, page(conflicting(8), 7)), Lookup::SubEntryMiss { shared: true });
    let s = *t.stats();
    assert_eq!((s.reverts, s.reverted_subentries, s.evictions), (1, 1, 0));
    let entry = t.set_contents(0).into_iter().find(|e| e.bases[0].base == conflicting(8)).unwrap();
    assert_eq!(entry.bases.len(), 1);
    assert_eq!(entry.bases[0].subentries, 0x00ff);
    // Exclusive now: lookups cost the normal latency and the entry grows past 8.
    assert_eq!(t.access(0, page(conflicting(8), 0)), Lookup::Hit { shared: false });
    for sub in 8..16 {
        assert_eq!(t.access(0, page(conflicting(8), sub)), Lookup::SubEntryMiss { shared: false });
    }
    assert_eq!(t.stats().reverts, 1);
    // The dropped base misses; it shares again with a sparse entry rather than evicting.
    assert_eq!(t.access(0, page(conflicting(0), 0)), Lookup::EntryMiss);
    assert_eq!((t.stats().shares, t.stats().evictions), (2, 0));
}

// 6. STAR never shares an entry holding 8 or more sub-entries: a full set of dense entries evicts the LRU.
#[test]
fn t06_star_does_not_share_dense_entries() {
    let mut t = l3(TlbMode::Star);
    for k in 0..8 {
        for sub in 0..8 {
            t.access(0, page(conflicting(k), sub));
        }
    }
    assert_eq!(t.access(0, page(conflicting(8), 0)), Lookup::EntryMiss);
    let s = *t.stats();
    assert_eq!((s.shares, s.evictions, s.evicted_subentries), (0, 1, 8));
    assert_eq!(s.subentry_utilisation(), Some(0.5));
}

fn mix(patterns: &[AccessPattern], slices: &[u8]) -> Vec<TenantStreamSpec> {
    patterns.iter().zip(slices).map(|(&p, &g)| TenantStreamSpec::new(p).with_slices(g)).collect()
}

// 7. Same seed, same report; another seed gives other streams.
#[test]
fn t07_deterministic_per_seed() {
    use AccessPattern::*;
    let tenants = mix(&[Streaming, Stride, Blocked], &[3, 2, 2]);
    let p = TlbParams::default();
    for mode in TlbMode::ALL {
        let a = simulate(&p, &tenants, mode, 11, 300_000).unwrap();
        let b = simulate(&p, &tenants, mode, 11, 300_000).unwrap();
        assert_eq!(a, b, "{mode}");
        let c = simulate(&p, &tenants, mode, 12, 300_000).unwrap();
        assert_ne!(a.tenants, c.tenants, "{mode}: seeds 11 and 12 gave identical runs");
        assert_eq!(a.tenants.iter().map(|t| t.colocated.accesses).sum::<u64>(), 300_000);
        for t in &a.tenants {
            assert_eq!(t.alone.accesses, t.colocated.accesses);
        }
    }
}

// 8. STAR raises the L3 hit rate and lowers the slowdown of sparse mixes (stride and blocked).
#[test]
fn t08_star_beats_baseline_on_sparse_mixes() {
    use AccessPattern::*;
    let p = TlbParams::default();
    for (patterns, slices) in [(&[Stride, Blocked][..], &[3, 3][..]), (&[Stride, Stride, Blocked][..], &[3, 2, 2][..])]
    {
        let tenants = mix(patterns, slices);
        let base = simulate(&p, &tenants, TlbMode::Baseline, 1, 1_000_000).unwrap();
        let star = simulate(&p, &tenants, TlbMode::Star, 1, 1_000_000).unwrap();
        assert!(
            star.hit_rate > base.hit_rate + 0.1,
            "{patterns:?}: STAR hit rate {} vs baseline {}",
            star.hit_rate,
            base.hit_rate
        );
        assert!(star.mean_slowdown < base.mean_slowdown, "{patterns:?}");
        assert!(base.mean_slowdown > 0.05, "{patterns:?}: co-location must cost something");
        assert!(star.l3.shares > 0);
        // Stride leaves about 4 of 16 sub-entries filled at eviction (paper), blocked 7.
        let util = base.subentry_utilisation.unwrap();
        assert!((0.2..0.5).contains(&util), "{patterns:?}: utilisation {util}");
    }
}

// 9. Calibration: over paper-like mixes (two tenants on 3g+3g, three on 3g+2g+2g) the baseline slowdown averages
// near the paper's 40% and STAR's is lower (paper 26.1%); see the `tlb` module doc for the measured figures.
#[test]
fn t09_calibrated_slowdown_range() {
    use AccessPattern::*;
    let p = TlbParams::default();
    let mixes = [
        mix(&[Streaming, Stride], &[3, 3]),
        mix(&[Stride, Random], &[3, 3]),
        mix(&[Streaming, Stride, Blocked], &[3, 2, 2]),
        mix(&[Stride, Blocked, Random], &[3, 2, 2]),
        mix(&[Streaming, Streaming, Random], &[3, 2, 2]),
        mix(&[Blocked, Blocked, Blocked], &[3, 2, 2]),
    ];
    let mean = |mode| {
        let runs: Vec<_> = mixes.iter().map(|m| simulate(&p, m, mode, 1, 1_000_000).unwrap()).collect();
        let n = runs.len() as f64;
        (runs.iter().map(|r| r.mean_slowdown).sum::<f64>() / n, runs.iter().map(|r| r.hit_rate).sum::<f64>() / n)
    };
    let (slow_base, hit_base) = mean(TlbMode::Baseline);
    let (slow_star, hit_star) = mean(TlbMode::Star);
    assert!((0.25..0.6).contains(&slow_base), "baseline mean slowdown {slow_base}");
    assert!(slow_star < slow_base * 0.85, "STAR mean slowdown {slow_star} vs baseline {slow_base}");
    assert!(hit_star > hit_base * 1.2, "STAR hit rate {hit_star} vs baseline {hit_base}");
}

// 10. A tenant alone is not slowed down; a 4g neighbour hurts more than a 1g one (issue rate scales with slices).
#[test]
fn t10_slowdown_grows_with_the_neighbours_rate() {
    use AccessPattern::*;
    let p = TlbParams::default();
    let alone = simulate(&p, &mix(&[Stride], &[3]), TlbMode::Baseline, 4, 300_000).unwrap();
    assert_eq!(alone.tenants[0].slowdown, 0.0);
    let light = simulate(&p, &mix(&[Stride, Random], &[3, 1]), TlbMode::Baseline, 4, 1_000_000).unwrap();
    let heavy = simulate(&p, &mix(&[Stride, Random], &[3, 4]), TlbMode::Baseline, 4, 1_000_000).unwrap();
    assert!(
        heavy.tenants[0].slowdown > light.tenants[0].slowdown,
        "stride next to random 4g {} vs 1g {}",
        heavy.tenants[0].slowdown,
        light.tenants[0].slowdown
    );
}

// 11. The cache: one simulation per (set, mode), the caller's order preserved.
#[test]
fn t11_model_caches_reports() {
    use AccessPattern::*;
    let mut model = TlbModel::new(TlbParams::default(), 9, 200_000).unwrap();
    let tenants = mix(&[Blocked, Stride], &[2, 3]);
    let first = model.slowdowns(&tenants, TlbMode::Star).unwrap();
    let again = model.slowdowns(&tenants, TlbMode::Star).unwrap();
    assert_eq!(first, again);
    assert_eq!(model.len(), 1);
    let reversed: Vec<_> = tenants.iter().rev().copied().collect();
    let rev = model.slowdowns(&reversed, TlbMode::Star).unwrap();
    assert_eq!(model.len(), 1);
    assert_eq!(rev.tenants[0].spec.pattern, Stride);
    assert_eq!(rev.slowdowns(), first.slowdowns().into_iter().rev().collect::<Vec<_>>());
    let base = model.slowdowns(&tenants, TlbMode::Baseline).unwrap();
    assert_eq!(model.len(), 2);
    assert!(!Arc::ptr_eq(&first, &base));
    assert!(model.slowdowns(&[], TlbMode::Star).is_err());
}

// 12. Every shipped model profile (configs/models) has a default stream.
#[test]
fn t12_every_shipped_model_has_a_stream() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let name = text
            .lines()
            .find_map(|l| l.trim().strip_prefix("name = \""))
            .and_then(|rest| rest.split('"').next())
            .unwrap_or_else(|| panic!("{}: no name", path.display()));
        let spec = model_stream(name).unwrap_or_else(|| panic!("model {name:?} has no TLB stream"));
        spec.validate(0).unwrap();
        seen += 1;
    }
    assert!(seen >= 6, "only {seen} model profiles found in {}", dir.display());
}

fn sim_agent(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_sim-agent")).args(args).output().expect("sim-agent runs")
}

// 13. CLI: the table.
#[test]
fn t13_cli_table() {
    let out = sim_agent(&["tlb", "--mix", "streaming,stride,blocked", "--mode", "baseline", "--accesses", "200000"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in
        ["mode baseline", "streaming", "stride", "blocked", "L3 hit rate", "sub-entry utilisation", "slowdown"]
    {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
}

// 14. CLI: `--json` prints exactly one object with the figures.
#[test]
fn t14_cli_json() {
    let out = sim_agent(&[
        "tlb",
        "--mix",
        "stride,blocked,stride",
        "--mode",
        "star",
        "--seed",
        "7",
        "--accesses",
        "200000",
        "--slices",
        "3,2,2",
        "--json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON value");
    assert_eq!(v["mode"], "star");
    assert_eq!(v["seed"], 7);
    let hit = v["hit_rate"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&hit));
    assert!(v["subentry_utilisation"].is_f64() || v["subentry_utilisation"].is_null());
    let slowdown = v["slowdown"].as_object().unwrap();
    assert_eq!(slowdown.len(), 3);
    for key in ["stride", "blocked", "stride#2"] {
        assert!(slowdown[key].is_f64(), "slowdown of {key}");
        assert!(v["tenant_hit_rate"][key].is_f64(), "hit rate of {key}");
    }
    let tenants = v["tenants"].as_array().unwrap();
    assert_eq!(tenants[1]["name"], "blocked");
    assert_eq!(tenants[0]["slices"], 3);
}

// 15. CLI: bad input is one `error:` line and exit code 2.
#[test]
fn t15_cli_bad_input() {
    for (args, needle) in [
        (&["tlb", "--mix", "streaming,zigzag"][..], "zigzag"),
        (&["tlb", "--mix", "stride", "--mode", "turbo"][..], "turbo"),
        (&["tlb", "--mix", "stride,blocked", "--slices", "3"][..], "slices"),
        (&["tlb", "--mix", "stride", "--accesses", "0"][..], "accesses"),
        (&["tlb"][..], "--mix"),
        (&[][..], "subcommand"),
    ] {
        let out = sim_agent(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("error: ") && err.contains(needle), "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}

// 16. CLI: `interference` prints the planner's table: every ordered pair of the models once, factors >= 1, and how
// it was made; an unknown model is an input error naming it.
#[test]
fn t16_cli_interference_table() {
    let args = ["interference", "--models", "resnet50,llama_2_7b", "--mode", "star", "--accesses", "100000"];
    let out = sim_agent(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON value");
    assert_eq!(
        v["source"],
        "sim-agent interference --models llama_2_7b,resnet50 --mode star --seed 1 --accesses 100000"
    );
    let pairs: Vec<(String, String, f64)> = serde_json::from_value(v["pairs"].clone()).unwrap();
    let names: Vec<(&str, &str)> = pairs.iter().map(|(a, b, _)| (a.as_str(), b.as_str())).collect();
    assert_eq!(
        names,
        [
            ("llama_2_7b", "llama_2_7b"),
            ("llama_2_7b", "resnet50"),
            ("resnet50", "llama_2_7b"),
            ("resnet50", "resnet50")
        ]
    );
    assert!(pairs.iter().all(|(_, _, f)| f.is_finite() && *f >= 1.0), "{pairs:?}");
    assert_eq!(out.stdout, sim_agent(&args).stdout, "the same seed, the same table");

    let out = sim_agent(&["interference", "--models", "resnet50,zigzag"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.starts_with("error: ") && err.contains("zigzag"), "{err}");
}
