//! Trace adapters: every format on the shipped traces (`traces/`, see `traces/README.md` for origin and licence) and
//! on small generated fixtures; header detection and override; named errors for each bad-row kind; the arrival
//! conventions, scaling, windows and nested sampling; the Alibaba MIG mapping; the Azure 2019 join; the synthetic
//! 2019 day.
//!
//! Cases are numbered by area: 1 shipped traces, 2 detection, 3 bad rows, 4 conventions, 5 scaling and windows,
//! 6 sampling, 7 Alibaba, 8 Azure 2019, 9 synthetic day, 10 command line.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use tessera_core::Profile;
use tessera_replay::trace::{
    CountsToArrivals, GroupBy, MAX_TRACE_TIME_S, Sample, SyntheticDaySpec, TraceArgs, TraceArrival, TraceError,
    TraceFormat, TraceOptions, TraceScan, generate_azure_functions_2019_day, generate_azure_functions_2019_day_report,
    mig_fit, parse_timestamp_ns, scan,
};

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../traces").join(name)
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn all(scan: &TraceScan) -> Vec<TraceArrival> {
    scan.arrivals(1.0).unwrap().collect_all().unwrap()
}

fn assert_sorted(a: &[TraceArrival]) {
    for w in a.windows(2) {
        assert!(w[0].time_s <= w[1].time_s, "not sorted: {:?} then {:?}", w[0], w[1]);
    }
}

fn opts() -> TraceOptions {
    TraceOptions::default()
}

fn row_error(e: TraceError) -> String {
    match e {
        TraceError::Row(r) => r.to_string(),
        other => panic!("expected a row error, got {other}"),
    }
}

/// Splits a simple CSV (no quoting) into rows of fields, header excluded.
fn rows_of(path: &Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

// ---- 1. Shipped traces ----

#[test]
fn t1_1_llm_code_whole_file() {
    let path = shipped("azure-llm-2023-code.csv");
    let s = scan(&path, &opts()).unwrap();
    assert_eq!(s.format, TraceFormat::AzureLlm);
    assert_eq!((s.rows, s.bad_rows), (8819, 0));
    assert_eq!(s.streams.len(), 1);
    assert_eq!(s.streams[0].key, "azure-llm-2023-code");
    assert_eq!(s.streams[0].requests, 8819);
    assert_eq!(s.start_timestamp.as_deref(), Some("2023-11-16 18:17:03.9799600"));
    // About one hour at about 2.6 req/s.
    assert!((3000.0..4000.0).contains(&s.duration_s), "duration {}", s.duration_s);
    assert!((2.0..3.2).contains(&s.streams[0].mean_rate_rps));
    let a = all(&s);
    assert_eq!(a.len(), 8819);
    assert_sorted(&a);
    assert_eq!(a[0].time_s, 0.0);
    // Work is tokens over the mean: it averages to exactly 1.
    let mean_work = a.iter().map(|x| x.work).sum::<f64>() / a.len() as f64;
    assert!((mean_work - 1.0).abs() < 1e-9);
    // The first row: 4808 + 10 tokens.
    assert!((a[0].work - 4818.0 / s.mean_tokens.unwrap()).abs() < 1e-12);
    // Gaps up to 217 s exist in this trace.
    let max_gap = a.windows(2).map(|w| w[1].time_s - w[0].time_s).fold(0.0, f64::max);
    assert!((200.0..230.0).contains(&max_gap), "max gap {max_gap}");
}

#[test]
fn t1_2_llm_conv_whole_file() {
    let s = scan(&shipped("azure-llm-2023-conv.csv"), &opts()).unwrap();
    assert_eq!((s.rows, s.streams[0].requests), (19366, 19366));
    let a = all(&s);
    assert_eq!(a.len(), 19366);
    assert_sorted(&a);
}

#[test]
fn t1_3_azure_2021_sample_reordered_exactly() {
    let path = shipped("azure-functions-2021-sample.csv");
    let s = scan(&path, &opts()).unwrap();
    assert_eq!(s.format, TraceFormat::AzureFunctions2021);
    assert_eq!(s.rows, 199);
    assert_eq!(s.total_streams, 31);
    assert!(s.reorder_needed_s > 0.0, "file order is end order, not arrival order");
    assert_eq!(s.reorder_horizon_s, s.reorder_needed_s);
    let mut stream = s.arrivals(1.0).unwrap();
    let mut got = Vec::new();
    let mut until = 10.0;
    while until < 2000.0 {
        stream.next_window(until, &mut got).unwrap();
        assert!(got.iter().all(|a| a.time_s < until));
        until += 10.0;
    }
    assert_eq!(stream.late_rows(), 0);
    assert_sorted(&got);
    // The same arrival times as computed independently, end - duration.
    let mut want: Vec<f64> =
        rows_of(&path).iter().map(|r| r[2].parse::<f64>().unwrap() - r[3].parse::<f64>().unwrap()).collect();
    want.sort_by(f64::total_cmp);
    let times: Vec<f64> = got.iter().map(|a| a.time_s).collect();
    assert_eq!(times, want);
    // Streams are app/func; durations are measured.
    let by_app = scan(&path, &TraceOptions { group_by: GroupBy::App, ..opts() }).unwrap();
    assert_eq!(by_app.total_streams, 13);
    let owner = scan(&path, &TraceOptions { group_by: GroupBy::Owner, ..opts() }).unwrap();
    assert_eq!(owner.total_streams, 13, "2021 has no owner: owner groups by app");
    assert!(s.streams.iter().all(|x| x.mean_duration_ms.is_some() && x.key.contains('/')));
}

#[test]
fn t1_4_alibaba_pods() {
    let path = shipped("alibaba-openb-2023-pods.csv");
    let s = scan(&path, &opts()).unwrap();
    assert_eq!(s.format, TraceFormat::Alibaba2023);
    assert_eq!(s.rows, 8152);
    assert_eq!(s.skipped_rows, 1088, "CPU-only pods carry no GPU demand");
    // Every GPU pod that lived a while is a stream; a few short-lived ones drew no request (or lived 0 s).
    let long_lived = rows_of(&path)
        .iter()
        .filter(|r| r[3] != "0" && r[9].parse::<f64>().unwrap() - r[8].parse::<f64>().unwrap() > 30.0)
        .count();
    assert!(s.total_streams >= long_lived && s.total_streams <= 8152 - 1088, "{} {long_lived}", s.total_streams);
    let w = s.profile_waste.as_ref().unwrap();
    assert_eq!(w.pods, s.streams.len() as u64);
    assert!(w.waste_fraction > 0.0 && w.waste_fraction < 0.5, "{w:?}");
    for st in &s.streams {
        let fit = mig_fit(st.gpu_milli.unwrap(), None).unwrap();
        assert_eq!(st.mig_profile, Some(fit.profile));
        assert_eq!(st.profile_waste_milli, Some(fit.waste_milli * st.num_gpu.unwrap()));
    }
    // 460-milli pods (750 of them) map to 4g (571), wasting 111 each.
    assert_eq!(mig_fit(460, None).unwrap().profile, Profile::G4);

    // Ten minutes at 1 req/s per GPU: arrivals lie in their pods' intervals and match the scan's counts.
    let o =
        TraceOptions { window_start_s: 12_800_000.0, window_duration_s: Some(600.0), pod_rps_per_gpu: 1.0, ..opts() };
    let s = scan(&path, &o).unwrap();
    // 41 GPU pods live through all of it (and a few through part of it).
    assert!(s.total_streams >= 41, "{}", s.total_streams);
    let a = all(&s);
    assert_eq!(a.len() as u64, s.sampled_requests());
    assert_sorted(&a);
    let mut per_stream = vec![0u64; s.streams.len()];
    for x in &a {
        let (lo, hi) = s.streams[x.stream as usize].active_s.unwrap();
        let t = x.time_s + s.window_start_s;
        assert!(t >= lo && t < hi && x.time_s < 600.0);
        per_stream[x.stream as usize] += 1;
    }
    assert!(per_stream.iter().zip(&s.streams).all(|(n, st)| *n == st.requests));
}

#[test]
fn t1_5_alibaba_scheduled_only_drops_pending_pods() {
    let path = shipped("alibaba-openb-2023-pods.csv");
    let all_pods = scan(&path, &opts()).unwrap();
    let scheduled = scan(&path, &TraceOptions { scheduled_pods_only: true, ..opts() }).unwrap();
    let rows = rows_of(&path);
    let pending: BTreeSet<&str> =
        rows.iter().filter(|r| r[3] != "0" && r[10].is_empty()).map(|r| r[0].as_str()).collect();
    assert!(!pending.is_empty());
    assert!(keys(&all_pods).iter().any(|k| pending.contains(k.as_str())), "demand includes never-scheduled pods");
    assert!(!keys(&scheduled).iter().any(|k| pending.contains(k.as_str())));
    assert!(scheduled.total_streams < all_pods.total_streams);
    // A scheduled pod's interval starts at its scheduled_time.
    let sched: BTreeMap<&str, f64> =
        rows.iter().filter(|r| !r[10].is_empty()).map(|r| (r[0].as_str(), r[10].parse().unwrap())).collect();
    assert!(scheduled.streams.iter().all(|x| x.active_s.unwrap().0 == sched[x.key.as_str()]));
}

// ---- 2. Detection and override ----

#[test]
fn t2_1_header_detection_and_unknown_header() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("a.csv", "timestamp_s,tenant\n1.5,alice\n", TraceFormat::Generic),
        ("b.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00+00:00,10,2\n", TraceFormat::AzureLlm),
        ("c.csv", "app,func,end_timestamp,duration\na,f,2.0,1.0\n", TraceFormat::AzureFunctions2021),
    ];
    for (name, text, want) in cases {
        let s = scan(&write(dir.path(), name, text), &opts()).unwrap();
        assert_eq!(s.format, want, "{name}");
    }
    let e = scan(&shipped("alibaba-openb-2023-gpu-nodes.csv"), &opts()).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, TraceError::UnknownHeader { .. }), "{msg}");
    for f in TraceFormat::ALL {
        assert!(msg.contains(f.name()), "{msg} lacks {f}");
    }
    assert!(msg.contains("sn,cpu_milli,memory_mib,gpu,model"), "{msg}");
    let empty = write(dir.path(), "empty.csv", "");
    assert!(matches!(scan(&empty, &opts()).unwrap_err(), TraceError::Empty { .. }));
}

#[test]
fn t2_2_format_override() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "mine.csv", "ts,who,tok\n0.5,alice,10\n1.5,bob,30\n2.5,alice,20\n");
    assert!(matches!(scan(&p, &opts()).unwrap_err(), TraceError::UnknownHeader { .. }));
    let s = scan(&p, &TraceOptions { format: Some(TraceFormat::Generic), ..opts() }).unwrap();
    assert_eq!(s.format, TraceFormat::Generic);
    assert_eq!(s.streams.iter().map(|x| (x.key.as_str(), x.requests)).collect::<Vec<_>>(), [("alice", 2), ("bob", 1)]);
    // Forcing the wrong format names the first bad field.
    let forced = TraceOptions { format: Some(TraceFormat::Generic), ..opts() };
    let e = scan(&shipped("azure-functions-2021-sample.csv"), &forced).unwrap_err();
    let msg = row_error(e);
    assert!(msg.ends_with("azure-functions-2021-sample.csv:2: column app: expected a number, found \"7b2c43a2bc30f6bb438074df88b603d2cb982d3e...\""), "{msg}");
    let short = TraceOptions { format: Some(TraceFormat::AzureFunctions2021), ..opts() };
    let e = scan(&shipped("azure-llm-2023-code.csv"), &short).unwrap_err();
    assert!(matches!(e, TraceError::HeaderTooShort { expected: 4, found: 3, .. }), "{e}");
}

#[test]
fn t2_3_names_round_trip() {
    for f in TraceFormat::ALL {
        assert_eq!(f.name().parse::<TraceFormat>().unwrap(), f);
        assert_eq!(f.to_string(), f.name());
    }
    for c in CountsToArrivals::ALL {
        assert_eq!(c.to_string().parse::<CountsToArrivals>().unwrap(), c);
    }
    for s in ["all", "top-k:5", "quantile:0.25-0.75", "quantile:0.5-1:3", "spread:8"] {
        assert_eq!(s.parse::<Sample>().unwrap().to_string(), s);
    }
    for bad in ["top-k:0", "quantile:0.5-0.2", "quantile:0.2", "spread:x", "every"] {
        assert!(bad.parse::<Sample>().is_err(), "{bad}");
    }
    assert!("csv".parse::<TraceFormat>().unwrap_err().to_string().contains("azure-functions-2019"));
}

// ---- 3. Bad rows ----

fn bad_case(name: &str, text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), name, text);
    let msg = row_error(scan(&p, &opts()).unwrap_err());
    let prefix = format!("{}:", p.display());
    assert!(msg.starts_with(&prefix), "{msg}");
    msg[prefix.len()..].to_string()
}

const LLM_HEAD: &str = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
const POD_HEAD: &str =
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

#[test]
fn t3_1_each_bad_row_kind_is_named() {
    let ok = "2023-11-16 18:17:03.9799600,10,2\n";
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "llm.csv",
            format!("{LLM_HEAD}{ok}{ok}2023-11-16 18:17:04.0,abc,3\n"),
            "4: column ContextTokens: expected an integer, found \"abc\"",
        ),
        (
            "llm.csv",
            format!("{LLM_HEAD}{ok}2023-11-16 18:17:04.0,3,-1\n"),
            "3: column GeneratedTokens: expected an integer, found \"-1\"",
        ),
        (
            "llm.csv",
            format!("{LLM_HEAD}{ok}16/11/2023 18:17,3,1\n"),
            "3: column TIMESTAMP: expected a timestamp like 2023-11-16 18:17:03.9799600, found \"16/11/2023 18:17\"",
        ),
        ("llm.csv", format!("{LLM_HEAD}{ok}{ok}{ok}2023-11-16 18:17:04.0,3\n"), "5: expected 3 fields, found 2"),
        (
            "f21.csv",
            "app,func,end_timestamp,duration\na,f,1.0,0.5\na,f,2.0,-0.5\n".into(),
            "3: column duration: expected a non-negative duration, found \"-0.5\"",
        ),
        (
            "f21.csv",
            "app,func,end_timestamp,duration\na,f,soon,0.5\n".into(),
            "2: column end_timestamp: expected a number, found \"soon\"",
        ),
        (
            "f21.csv",
            "app,func,end_timestamp,duration\na,,1.0,0.5\n".into(),
            "2: column func: expected a non-empty value",
        ),
        (
            "gen.csv",
            "timestamp_s,tenant,tokens\n1.0,a,5\n2.0,b,many\n".into(),
            "3: column tokens: expected a number, found \"many\"",
        ),
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,100,1,1500,,LS,Running,0,10,0\n"),
            "2: column gpu_milli: expected 1..=1000 for a GPU pod, found 1500",
        ),
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,100,1,500,,LS,Running,50,10,50\n"),
            "2: column deletion_time: deletion_time \"10\" is before creation_time 50",
        ),
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,100,one,500,,LS,Running,0,10,0\n"),
            "2: column num_gpu: expected an integer, found \"one\"",
        ),
        // Found by the fuzzer (trace_alibaba): 4294967295 GPUs overflowed the rounding waste (a panic in a debug
        // build) and asked for ~10^17 requests.
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,1024,4294967295,1,,LS,Running,0,100,0\n"),
            "2: column num_gpu: expected at most 64 GPUs (a pod runs on one node), found 4294967295",
        ),
    ];
    for (name, text, want) in cases {
        assert_eq!(bad_case(name, &text), want);
    }
    // Azure 2019: the minute column is named.
    let dir = tempfile::tempdir().unwrap();
    let mut counts = vec!["0"; 1440];
    counts[16] = "x";
    let p = write(dir.path(), "inv.csv", &format!("{}\no,a,f,http,{}\n", header_2019(), counts.join(",")));
    let msg = row_error(scan(&p, &opts()).unwrap_err());
    assert!(msg.ends_with("inv.csv:2: column 17: expected an invocation count, found \"x\""), "{msg}");
}

fn header_2019() -> String {
    let mut h = String::from("HashOwner,HashApp,HashFunction,Trigger");
    for m in 1..=1440 {
        h.push_str(&format!(",{m}"));
    }
    h
}

#[test]
fn t3_2_skip_bad_rows_counts_and_keeps_good_rows() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "{LLM_HEAD}2023-11-16 18:00:00.0,10,2\nbad,1,1\n2023-11-16 18:00:01.0,abc,2\n2023-11-16 18:00:02.0,30,6\n\
         2023-11-16 18:00:03.0,1\n2023-11-16 18:00:04.0,20,4\n"
    );
    let p = write(dir.path(), "llm.csv", &text);
    assert!(scan(&p, &opts()).is_err());
    let s = scan(&p, &TraceOptions { skip_bad_rows: true, ..opts() }).unwrap();
    assert_eq!((s.rows, s.bad_rows), (6, 3));
    assert_eq!(s.bad_row_examples.iter().map(|e| e.line).collect::<Vec<_>>(), [3, 4, 6]);
    assert_eq!(s.bad_row_examples[1].column.as_deref(), Some("ContextTokens"));
    assert_eq!(s.streams[0].requests, 3);
    let a = all(&s);
    let times: Vec<f64> = a.iter().map(|x| x.time_s).collect();
    assert_eq!(times, [0.0, 2.0, 4.0]);
    // Mean tokens 24: works 12/24, 36/24, 24/24.
    let works: Vec<f64> = a.iter().map(|x| x.work).collect();
    assert_eq!(works, [0.5, 1.5, 1.0]);
    let mut stream = s.arrivals(1.0).unwrap();
    stream.next_window(f64::INFINITY, &mut Vec::new()).unwrap();
    assert_eq!(stream.bad_rows(), 3);
}

/// Times outside `[0, MAX_TRACE_TIME_S]` (366 days) are bad rows naming file, line and column, in every format with
/// a time field: negative, non-finite, `1e308`, and an Azure 2021 duration longer than its end timestamp.
#[test]
fn t3_3_out_of_range_times_are_named() {
    assert_eq!(MAX_TRACE_TIME_S, 366.0 * 86_400.0);
    let time = |found: &str| {
        format!("expected a time in seconds from the trace start, from 0 to 31622400 (366 days), found \"{found}\"")
    };
    let ok = "2023-11-16 18:17:03.9799600,10,2\n";
    let f21 = "app,func,end_timestamp,duration\na,f,1.0,0.5\n";
    let cases: Vec<(&str, String, String)> = vec![
        ("gen.csv", "timestamp_s,tenant\n0,a\n1e308,a\n2,a\n".into(), format!("3: column timestamp_s: {}", time("1e308"))),
        ("gen.csv", "timestamp_s,tenant\n0,a\n-3,a\n".into(), format!("3: column timestamp_s: {}", time("-3"))),
        ("gen.csv", "timestamp_s,tenant\n0,a\ninf,a\n".into(), format!("3: column timestamp_s: {}", time("inf"))),
        ("gen.csv", "timestamp_s,tenant\nNaN,a\n".into(), format!("2: column timestamp_s: {}", time("NaN"))),
        ("gen.csv", "timestamp_s,tenant\n1e400,a\n".into(), format!("2: column timestamp_s: {}", time("1e400"))),
        // Just past the bound: epoch seconds are not seconds from the start.
        ("gen.csv", "timestamp_s,tenant\n1700000000,a\n".into(), format!("2: column timestamp_s: {}", time("1700000000"))),
        ("f21.csv", format!("{f21}a,f,1e300,1\n"), format!("3: column end_timestamp: {}", time("1e300"))),
        ("f21.csv", format!("{f21}a,f,-1,0\n"), format!("3: column end_timestamp: {}", time("-1"))),
        (
            "f21.csv",
            format!("{f21}a,f,3,5\n"),
            "3: column duration: duration \"5\" is longer than end_timestamp \"3\": the invocation would start before \
             the trace (end_timestamp - duration < 0)"
                .into(),
        ),
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,100,1,500,,LS,Running,-5,10,0\n"),
            format!("2: column creation_time: {}", time("-5")),
        ),
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,100,1,500,,LS,Running,0,1e300,0\n"),
            format!("2: column deletion_time: {}", time("1e300")),
        ),
        (
            "pods.csv",
            format!("{POD_HEAD}p0,1000,100,1,500,,LS,Running,0,10,NaN\n"),
            format!("2: column scheduled_time: {}", time("NaN")),
        ),
        (
            "llm.csv",
            format!("{LLM_HEAD}{ok}2023-11-16 18:17:02.0,3,1\n"),
            "3: column TIMESTAMP: timestamp \"2023-11-16 18:17:02.0\" is before the first row's, \
             2023-11-16 18:17:03.9799600, which is time 0"
                .into(),
        ),
        (
            "llm.csv",
            format!("{LLM_HEAD}{ok}2025-11-16 18:17:04.0,3,1\n"),
            "3: column TIMESTAMP: timestamp \"2025-11-16 18:17:04.0\" is more than 31622400 s (366 days) after the \
             first row's, 2023-11-16 18:17:03.9799600"
                .into(),
        ),
        (
            // Past what an i64 of nanoseconds holds: refused, not an overflow.
            "llm.csv",
            format!("{LLM_HEAD}{ok}9999-12-31 23:59:59.0,3,1\n"),
            "3: column TIMESTAMP: expected a timestamp like 2023-11-16 18:17:03.9799600, found \"9999-12-31 23:59:59.0\""
                .into(),
        ),
    ];
    for (name, text, want) in cases {
        assert_eq!(bad_case(name, &text), want, "{text}");
    }
    // The last time in range is accepted, and so is an Azure 2021 start up to 1 ms before 0 (durations are rounded to
    // the millisecond): it is read as 0.
    let dir = tempfile::tempdir().unwrap();
    let p = write(dir.path(), "gen.csv", "timestamp_s,tenant\n0,a\n31622400,a\n");
    assert_eq!(scan(&p, &opts()).unwrap().window_end_s, MAX_TRACE_TIME_S);
    let p = write(dir.path(), "f21.csv", "app,func,end_timestamp,duration\na,f,0.0795,0.0800\na,f,1.0,1.0\n");
    let times: Vec<f64> = all(&scan(&p, &opts()).unwrap()).iter().map(|a| a.time_s).collect();
    assert_eq!(times, [0.0, 0.0]);
}

/// With `skip_bad_rows`, out-of-range times are counted and skipped: the window is the good rows', not stretched to
/// `1e308` or `1e300`.
#[test]
fn t3_4_skipped_outliers_leave_the_window_alone() {
    let dir = tempfile::tempdir().unwrap();
    let skip = TraceOptions { skip_bad_rows: true, ..opts() };
    let p = write(dir.path(), "gen.csv", "timestamp_s,tenant\n0,a\n1e308,a\n-3,b\n2,a\n4,b\n");
    let s = scan(&p, &skip).unwrap();
    assert_eq!((s.rows, s.bad_rows, s.total_requests), (5, 2, 3));
    assert_eq!(s.bad_row_examples.iter().map(|e| e.line).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(s.window_end_s, 4.0);
    assert_eq!(all(&s).len(), 3);
    let p = write(dir.path(), "f21.csv", "app,func,end_timestamp,duration\na,f,1,0.5\na,f,1e300,1\na,g,3,5\na,f,9,2\n");
    let s = scan(&p, &skip).unwrap();
    assert_eq!((s.rows, s.bad_rows, s.total_requests), (4, 2, 2));
    assert_eq!(
        s.bad_row_examples.iter().map(|e| e.column.as_deref().unwrap()).collect::<Vec<_>>(),
        ["end_timestamp", "duration"]
    );
    // The reorder horizon is measured on good rows only (a 1e300 end would have made it 1e300).
    assert_eq!(s.reorder_needed_s, 2.0);
    let times: Vec<f64> = all(&s).iter().map(|a| a.time_s).collect();
    assert_eq!(times, [0.5, 7.0]);
}

// ---- 4. Counts to arrivals (Azure 2019) ----

/// A small 2019 day: three functions with known per-minute counts.
fn small_2019(dir: &Path) -> PathBuf {
    let mut text = header_2019();
    text.push('\n');
    for (f, scale, trigger) in [("f1", 7u32, "http"), ("f2", 2, "timer"), ("f3", 1, "queue")] {
        let counts: Vec<String> =
            (0..1440u32).map(|m| ((m * scale) % 13 + u32::from(m % 60 == 0) * 40).to_string()).collect();
        text.push_str(&format!("own1,app1,{f},{trigger},{}\n", counts.join(",")));
    }
    write(dir, "invocations_per_function_md.anon.d03.csv", &text)
}

fn per_minute(a: &[TraceArrival], streams: usize) -> BTreeMap<(u32, i64), u64> {
    let mut m = BTreeMap::new();
    for x in a {
        *m.entry((x.stream, (x.time_s / 60.0).floor() as i64)).or_insert(0) += 1;
    }
    assert!(m.keys().all(|(s, _)| (*s as usize) < streams));
    m
}

#[test]
fn t4_1_minute_conventions_keep_exact_counts_and_are_seeded() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_2019(dir.path());
    let file = rows_of(&path);
    let window = TraceOptions { window_start_s: 3600.0, window_duration_s: Some(7200.0), ..opts() };
    for method in [CountsToArrivals::Uniform, CountsToArrivals::Equidistant, CountsToArrivals::ExpNormalised] {
        for shift in [false, true] {
            let o = TraceOptions { counts_to_arrivals: method, random_shift: shift, seed: 7, ..window.clone() };
            let s = scan(&path, &o).unwrap();
            let a = all(&s);
            assert_sorted(&a);
            let got = per_minute(&a, s.streams.len());
            for (i, st) in s.streams.iter().enumerate() {
                let f = st.key.rsplit('/').next().unwrap();
                let row = file.iter().find(|r| r[2] == f).unwrap();
                for m in 0..120 {
                    let want: u64 = row[4 + 60 + m].parse().unwrap();
                    let have = got.get(&(i as u32, m as i64)).copied().unwrap_or(0);
                    assert_eq!(have, want, "{method} shift {shift} stream {f} minute {m}");
                }
            }
            assert_eq!(a, all(&scan(&path, &o).unwrap()), "{method}: same seed, same arrivals");
            let other = all(&scan(&path, &TraceOptions { seed: 8, ..o.clone() }).unwrap());
            if method == CountsToArrivals::Equidistant && !shift {
                assert_eq!(a, other, "equidistant without shift draws nothing");
            } else {
                assert_ne!(a, other, "{method} shift {shift}: another seed, other arrivals");
            }
        }
    }
    // Equidistant: minute 60 of f1 has 40 + (60 * 7) % 13 = 44 invocations 60/44 s apart from the window start.
    let o = TraceOptions { counts_to_arrivals: CountsToArrivals::Equidistant, ..window.clone() };
    let s = scan(&path, &o).unwrap();
    let f1 = s.streams.iter().position(|x| x.key.ends_with("/f1")).unwrap() as u32;
    let first: Vec<f64> = all(&s).iter().filter(|x| x.stream == f1 && x.time_s < 60.0).map(|x| x.time_s).collect();
    assert_eq!(first.len(), 44);
    assert!(first.iter().enumerate().all(|(i, t)| (t - i as f64 * 60.0 / 44.0).abs() < 1e-9));
    // Exp-normalised without shift puts the first arrival of every minute at its start.
    let o = TraceOptions { counts_to_arrivals: CountsToArrivals::ExpNormalised, ..window };
    let s = scan(&path, &o).unwrap();
    let a = all(&s);
    assert!(a.iter().any(|x| x.time_s == 0.0) && a.iter().any(|x| x.time_s == 60.0));
}

#[test]
fn t4_2_poisson_fit_keeps_totals() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_2019(dir.path());
    let o = TraceOptions { counts_to_arrivals: CountsToArrivals::PoissonFit, seed: 3, ..opts() };
    let s = scan(&path, &o).unwrap();
    let a = all(&s);
    assert_sorted(&a);
    assert_eq!(a.len() as u64, s.total_requests);
    for (i, st) in s.streams.iter().enumerate() {
        assert_eq!(a.iter().filter(|x| x.stream == i as u32).count() as u64, st.requests);
    }
    assert!(a.iter().all(|x| x.time_s >= 0.0 && x.time_s < 86_400.0));
    // A constant rate: the hourly bursts of the file (40 at each hour's first minute) are gone.
    let at_hour_start = a.iter().filter(|x| (x.time_s / 60.0).floor() as i64 % 60 == 0).count() as f64;
    assert!(at_hour_start < 1.5 * a.len() as f64 / 60.0, "{at_hour_start}");
    assert_eq!(a, all(&scan(&path, &o).unwrap()));
    assert_ne!(a, all(&scan(&path, &TraceOptions { seed: 4, ..o }).unwrap()));
}

// ---- 5. Time scaling, rate scaling, windows ----

#[test]
fn t5_1_time_scale_and_window() {
    let path = shipped("azure-llm-2023-code.csv");
    let base = scan(&path, &opts()).unwrap();
    let all_t: Vec<f64> = all(&base).iter().map(|x| x.time_s).collect();
    let o = TraceOptions { window_start_s: 600.0, window_duration_s: Some(900.0), time_scale: 0.5, ..opts() };
    let s = scan(&path, &o).unwrap();
    assert_eq!(s.duration_s, 450.0);
    let want: Vec<f64> = all_t.iter().filter(|t| (600.0..1500.0).contains(*t)).map(|t| (t - 600.0) * 0.5).collect();
    assert!(!want.is_empty());
    assert_eq!(s.streams[0].requests, want.len() as u64);
    assert!((s.streams[0].mean_rate_rps - want.len() as f64 / 450.0).abs() < 1e-12);
    let got: Vec<f64> = all(&s).iter().map(|x| x.time_s).collect();
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(g, w)| (g - w).abs() < 1e-9));
    // next_window takes scaled times.
    let mut stream = s.arrivals(1.0).unwrap();
    let mut out = Vec::new();
    stream.next_window(100.0, &mut out).unwrap();
    assert_eq!(out.len(), want.iter().filter(|t| **t < 100.0).count());
}

#[test]
fn t5_2_rate_scaling_thins_and_duplicates_seeded() {
    let s = scan(&shipped("azure-llm-2023-conv.csv"), &TraceOptions { seed: 11, ..opts() }).unwrap();
    let n = s.sampled_requests() as f64;
    let count = |r: f64| s.arrivals(r).unwrap().collect_all().unwrap();
    assert_eq!(count(2.0).len() as f64, 2.0 * n);
    assert_eq!(count(0.0).len(), 0);
    let half = count(0.5);
    assert!(((half.len() as f64) - n / 2.0).abs() < 4.0 * (n * 0.25).sqrt(), "{} of {n}", half.len());
    assert_eq!(half, count(0.5), "seeded");
    let one_and_half = count(1.5);
    assert!(((one_and_half.len() as f64) - 1.5 * n).abs() < 4.0 * (n * 0.25).sqrt());
    assert_sorted(&one_and_half);
    let other_seed = scan(&shipped("azure-llm-2023-conv.csv"), &TraceOptions { seed: 12, ..opts() }).unwrap();
    assert_ne!(half, other_seed.arrivals(0.5).unwrap().collect_all().unwrap());
    assert!(s.arrivals(-1.0).is_err());
}

#[test]
fn t5_3_2019_window_rounds_to_minutes() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_2019(dir.path());
    let o = TraceOptions { window_start_s: 90.0, window_duration_s: Some(100.0), ..opts() };
    let s = scan(&path, &o).unwrap();
    // Minutes starting in [90, 190): minutes 2 and 3.
    assert_eq!((s.window_start_s, s.window_end_s, s.duration_s), (120.0, 240.0, 120.0));
    let file = rows_of(&path);
    let want: u64 = file.iter().map(|r| r[4 + 2].parse::<u64>().unwrap() + r[4 + 3].parse::<u64>().unwrap()).sum();
    assert_eq!(s.total_requests, want);
    let a = all(&s);
    assert_eq!(a.len() as u64, want);
    assert!(a.iter().all(|x| (0.0..120.0).contains(&x.time_s)));
}

#[test]
fn t5_4_synthetic_arrivals_keep_tokens() {
    let path = shipped("azure-llm-2023-code.csv");
    let recorded = all(&scan(&path, &opts()).unwrap());
    let stats = |a: &[TraceArrival]| {
        let gaps: Vec<f64> = a.windows(2).map(|w| w[1].time_s - w[0].time_s).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        (mean, var.sqrt() / mean)
    };
    for (spec, cv) in [("poisson:10", 1.0), ("gamma:10:3", 3.0)] {
        let o = TraceOptions { synthetic_arrivals: Some(spec.parse().unwrap()), seed: 1, ..opts() };
        let s = scan(&path, &o).unwrap();
        let a = all(&s);
        assert_eq!(a.len(), recorded.len());
        assert_eq!(s.reorder_needed_s, 0.0);
        assert_sorted(&a);
        // The token sequence (the file is in time order) is kept.
        assert!(a.iter().zip(&recorded).all(|(x, y)| x.work == y.work));
        let (mean_gap, got_cv) = stats(&a);
        assert!((mean_gap - 0.1).abs() < 0.01, "{spec}: mean gap {mean_gap}");
        assert!((got_cv - cv).abs() < 0.25 * cv, "{spec}: cv {got_cv}");
        assert_eq!(a, all(&scan(&path, &o).unwrap()));
        // Windows apply to the synthetic times.
        let w = scan(&path, &TraceOptions { window_duration_s: Some(100.0), ..o }).unwrap();
        assert_eq!(w.sampled_requests(), a.iter().filter(|x| x.time_s < 100.0).count() as u64);
    }
    assert!("gamma:10".parse::<tessera_replay::trace::SyntheticArrivals>().is_err());
    assert!("poisson:0".parse::<tessera_replay::trace::SyntheticArrivals>().is_err());
}

/// Pass 2 cut at an end (`arrivals_before`, what a run shorter than the window reads) gives exactly the uncut
/// stream's arrivals before it, for every kind of source: per-row (time-scaled too), 2019 minutes, Alibaba pods; a
/// per-row file is read no further than the first row past the end.
#[test]
fn t5_5_arrivals_before_an_end_are_the_uncut_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("timestamp_s,tenant\n");
    for i in 0..200 {
        text.push_str(&format!("{},{}\n", f64::from(i) * 0.5, if i % 3 == 0 { "a" } else { "b" }));
    }
    // A bad row after the gap: read (and skipped) by the uncut pass only.
    text.push_str("100000,a\nsoon,a\n");
    let generic = write(dir.path(), "gen.csv", &text);
    let skip = TraceOptions { skip_bad_rows: true, ..opts() };
    let pods = TraceOptions { window_duration_s: Some(3600.0), ..opts() };
    let cases = [
        (generic.clone(), skip.clone(), 20.0),
        (generic, TraceOptions { time_scale: 0.5, ..skip }, 20.0),
        (small_2019(dir.path()), opts(), 150.0),
        (shipped("alibaba-openb-2023-pods.csv"), pods, 1800.0),
    ];
    for (path, o, end) in cases {
        let s = scan(&path, &o).unwrap();
        let full = all(&s);
        let want: Vec<TraceArrival> = full.iter().filter(|a| a.time_s < end).copied().collect();
        let mut cut = s.arrivals_before(1.0, end).unwrap();
        let mut got = Vec::new();
        cut.next_window(end / 2.0, &mut got).unwrap();
        cut.next_window(f64::INFINITY, &mut got).unwrap();
        assert_eq!(got, want, "{} at {end} s", path.display());
        assert!(!got.is_empty() && got.len() < full.len(), "{}: {} of {}", path.display(), got.len(), full.len());
        assert_eq!(cut.bad_rows(), 0, "{}", path.display());
    }
}

// ---- 6. Sampling ----

fn keys(s: &TraceScan) -> BTreeSet<String> {
    s.streams.iter().map(|x| x.key.clone()).collect()
}

#[test]
fn t6_1_samples_are_nested() {
    let path = shipped("azure-functions-2021-sample.csv");
    let with = |sample: Sample| scan(&path, &TraceOptions { sample, seed: 5, ..opts() }).unwrap();
    let every = with(Sample::All);
    let top5 = with(Sample::TopK(5));
    let top10 = with(Sample::TopK(10));
    assert_eq!(top5.streams.len(), 5);
    assert!(keys(&top5).is_subset(&keys(&top10)));
    // Most popular first, and top-k is the head of the full ranking.
    assert!(top10.streams.windows(2).all(|w| w[0].requests >= w[1].requests));
    assert_eq!(top10.streams, every.streams[..10]);
    let min_top = top5.streams.last().unwrap().requests;
    assert!(every.streams[5..].iter().all(|x| x.requests <= min_top));

    let s5 = with(Sample::Spread(5));
    let s10 = with(Sample::Spread(10));
    assert_eq!((s5.streams.len(), s10.streams.len()), (5, 10));
    assert!(keys(&s5).is_subset(&keys(&s10)));
    // Spread covers the ranking: not just the head.
    assert!(s10.streams.iter().any(|x| x.requests < top10.streams[9].requests));

    // Quantile: the upper half of the popularity ranking (ranks 0..15 of 31 streams, ascending index >= 15.5).
    let upper = with(Sample::Quantile { lo: 0.5, hi: 1.0, n: None });
    assert_eq!(upper.streams, every.streams[..15]);
    let lower = with(Sample::Quantile { lo: 0.0, hi: 0.5, n: None });
    assert_eq!(lower.streams, every.streams[15..]);
    let q3 = with(Sample::Quantile { lo: 0.0, hi: 0.5, n: Some(3) });
    let q6 = with(Sample::Quantile { lo: 0.0, hi: 0.5, n: Some(6) });
    assert!(keys(&q3).is_subset(&keys(&q6)) && keys(&q6).is_subset(&keys(&lower)));
    assert_eq!(q6.streams.len(), 6);
    // Totals describe the whole trace, whatever the sample.
    assert_eq!((top5.total_streams, top5.total_requests), (31, 199));
}

#[test]
fn t6_2_nested_samples_share_arrivals() {
    let dir = tempfile::tempdir().unwrap();
    let day = generate_azure_functions_2019_day_report(
        dir.path(),
        &SyntheticDaySpec { functions: 60, total_invocations: 20_000, seed: 2, ..Default::default() },
    )
    .unwrap();
    let o = |n| TraceOptions { sample: Sample::Spread(n), seed: 9, window_duration_s: Some(3600.0), ..opts() };
    let small = scan(&day.invocations_path, &o(4)).unwrap();
    let big = scan(&day.invocations_path, &o(12)).unwrap();
    assert!(keys(&small).is_subset(&keys(&big)));
    let (a_small, a_big) = (all(&small), all(&big));
    for (i, st) in small.streams.iter().enumerate() {
        let j = big.streams.iter().position(|x| x.key == st.key).unwrap();
        let ts = |a: &[TraceArrival], s: usize| {
            a.iter().filter(|x| x.stream as usize == s).map(|x| x.time_s).collect::<Vec<_>>()
        };
        assert_eq!(ts(&a_small, i), ts(&a_big, j), "{}", st.key);
    }
}

// ---- 7. Alibaba MIG mapping ----

#[test]
fn t7_1_gpu_milli_to_profile_with_waste() {
    let cases = [
        (1, Profile::G1, 142),
        (143, Profile::G1, 0),
        (144, Profile::G2, 142),
        (286, Profile::G2, 0),
        (287, Profile::G3, 142),
        (429, Profile::G3, 0),
        (571, Profile::G4, 0),
        (572, Profile::G7, 428),
        (1000, Profile::G7, 0),
    ];
    for (milli, profile, waste) in cases {
        let fit = mig_fit(milli, None).unwrap();
        assert_eq!((fit.profile, fit.waste_milli), (profile, waste), "{milli}");
    }
    assert!(mig_fit(1001, None).is_none());
    // With a memory need, memory can force a larger profile: 143 milli needing 15 GiB on H100 (1g has 9.75).
    let h100 = tessera_core::GpuModel::H100_80GB.spec();
    assert_eq!(mig_fit(143, Some((15.0, h100))).unwrap().profile, Profile::G2);

    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "pods.csv",
        &format!(
            "{POD_HEAD}a,1000,1,1,143,,LS,Running,0,1000,0\nb,1000,1,1,144,,BE,Running,0,1000,0\n\
             c,1000,1,2,1000,V100M16|V100M32,LS,Running,0,1000,0\nd,1000,1,0,0,,BE,Running,0,1000,0\n\
             e,1000,1,1,500,,BE,Pending,0,1000,\n"
        ),
    );
    let s = scan(&p, &TraceOptions { pod_rps_per_gpu: 5.0, ..opts() }).unwrap();
    assert_eq!((s.total_streams, s.skipped_rows), (4, 1));
    let by: BTreeMap<&str, _> =
        s.streams.iter().map(|x| (x.key.as_str(), (x.mig_profile.unwrap(), x.profile_waste_milli.unwrap()))).collect();
    assert_eq!(by["a"], (Profile::G1, 0));
    assert_eq!(by["b"], (Profile::G2, 142));
    assert_eq!(by["c"], (Profile::G7, 0));
    assert_eq!(by["e"], (Profile::G4, 71));
    let w = s.profile_waste.unwrap();
    assert_eq!((w.requested_milli, w.allocated_milli), (143 + 144 + 2000 + 500, 143 + 286 + 2000 + 571));
    assert_eq!(w.by_profile.get("7g"), Some(&2));
    // Rates follow the GPU share: pod c (2 GPUs) sends about 14 times what pod a (0.143) sends.
    let req: BTreeMap<&str, u64> = s.streams.iter().map(|x| (x.key.as_str(), x.requests)).collect();
    assert!((req["c"] as f64 - 10_000.0).abs() < 500.0, "{req:?}");
    assert!((req["a"] as f64 - 715.0).abs() < 120.0, "{req:?}");
}

// ---- 8. Azure 2019 join ----

#[test]
fn t8_1_durations_and_memory_joined_by_hash() {
    let dir = tempfile::tempdir().unwrap();
    let path = small_2019(dir.path());
    let zeros = vec!["0"; 1440].join(",");
    // A second app and owner, to test grouping: own2/app2/g1 with 5 invocations in minute 0.
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(&format!("own2,app2,g1,event,5,{}\n", &zeros[2..]));
    std::fs::write(&path, text).unwrap();
    let dur_head = "HashOwner,HashApp,HashFunction,Average,Count,Minimum,Maximum,percentile_Average_0,\
                    percentile_Average_1,percentile_Average_25,percentile_Average_50,percentile_Average_75,\
                    percentile_Average_99,percentile_Average_100";
    write(
        dir.path(),
        "function_durations_percentiles.anon.d03.csv",
        &format!(
            "{dur_head}\nown1,app1,f1,100,10,1,2,1,1,1,1,1,1,1\nown1,app1,f2,400,30,1,2,1,1,1,1,1,1,1\n\
             own1,app1,f3,-5,10,1,2,1,1,1,1,1,1,1\nown2,app2,g1,,3,1,2,1,1,1,1,1,1,1\nzz,zz,zz,9,9,1,2,1,1,1,1,1,1,1\n"
        ),
    );
    let mem_head = "HashOwner,HashApp,SampleCount,AverageAllocatedMb,AverageAllocatedMb_pct1,AverageAllocatedMb_pct5,\
                    AverageAllocatedMb_pct25,AverageAllocatedMb_pct50,AverageAllocatedMb_pct75,AverageAllocatedMb_pct95,\
                    AverageAllocatedMb_pct99,AverageAllocatedMb_pct100";
    write(
        dir.path(),
        "app_memory_percentiles.anon.d03.csv",
        &format!("{mem_head}\nown1,app1,10,128,1,1,1,1,1,1,1,1\nown2,app2,10,64,1,1,1,1,1,1,1,1\n"),
    );
    let s = scan(&path, &opts()).unwrap();
    let join = s.join.clone().unwrap();
    assert!(join.durations_path.unwrap().ends_with("function_durations_percentiles.anon.d03.csv"));
    assert_eq!((join.streams_with_duration, join.streams_with_memory), (2, 4));
    let get = |s: &TraceScan, k: &str| s.streams.iter().find(|x| x.key == k).unwrap().clone();
    assert_eq!(get(&s, "own1/app1/f1").mean_duration_ms, Some(100.0));
    assert_eq!(get(&s, "own1/app1/f2").mean_duration_ms, Some(400.0));
    assert_eq!(get(&s, "own1/app1/f3").mean_duration_ms, None, "negative average is unknown");
    assert_eq!(get(&s, "own2/app2/g1").mean_duration_ms, None, "missing average is unknown");
    assert_eq!(get(&s, "own1/app1/f1").memory_mb, Some(128.0));
    assert_eq!(get(&s, "own1/app1/f1").label.as_deref(), Some("http"));
    // By app: durations weighted by Count ((100*10 + 400*30) / 40 = 325), the trigger mixed.
    let app = scan(&path, &TraceOptions { group_by: GroupBy::App, ..opts() }).unwrap();
    assert_eq!(get(&app, "own1/app1").mean_duration_ms, Some(325.0));
    assert_eq!(get(&app, "own1/app1").label.as_deref(), Some("mixed"));
    assert_eq!(get(&app, "own2/app2").memory_mb, Some(64.0));
    assert_eq!(get(&app, "own2/app2").requests, 5);
    let owner = scan(&path, &TraceOptions { group_by: GroupBy::Owner, ..opts() }).unwrap();
    assert_eq!(owner.total_streams, 2);
    assert_eq!(get(&owner, "own1").requests, s.total_requests - 5);
    // Explicit paths override the siblings; a missing explicit file is an error naming it.
    let o = TraceOptions { memory_path: Some(dir.path().join("nope.csv")), ..opts() };
    let e = scan(&path, &o).unwrap_err();
    assert!(matches!(e, TraceError::Io { .. }) && e.to_string().contains("nope.csv"), "{e}");
    // A bad durations row is named in the durations file; skipped with skip_bad_rows.
    write(dir.path(), "bad_dur.csv", &format!("{dur_head}\nown1,app1,f1,fast,10,1,2,1,1,1,1,1,1,1\n"));
    let o = TraceOptions { durations_path: Some(dir.path().join("bad_dur.csv")), ..opts() };
    let msg = row_error(scan(&path, &o).unwrap_err());
    assert!(msg.ends_with("bad_dur.csv:2: column Average: expected a number, found \"fast\""), "{msg}");
    let s = scan(&path, &TraceOptions { skip_bad_rows: true, ..o }).unwrap();
    assert_eq!(s.bad_rows, 1);
    // The companion files are not traces.
    let e = scan(&dir.path().join("app_memory_percentiles.anon.d03.csv"), &opts()).unwrap_err();
    assert!(matches!(e, TraceError::CompanionFile { kind: "memory", .. }), "{e}");
}

// ---- 9. Synthetic Azure 2019 day ----

#[test]
fn t9_1_synthetic_day_parses_back_with_its_totals() {
    let dir = tempfile::tempdir().unwrap();
    let spec = SyntheticDaySpec { functions: 300, total_invocations: 400_000, seed: 4, ..Default::default() };
    let day = generate_azure_functions_2019_day_report(dir.path(), &spec).unwrap();
    assert!(day.invocations_path.ends_with("invocations_per_function_md.anon.d01.csv"));
    let s = scan(&day.invocations_path, &opts()).unwrap();
    assert_eq!(s.format, TraceFormat::AzureFunctions2019);
    assert_eq!((s.rows as usize, s.total_streams), (day.functions, day.functions));
    assert_eq!(s.total_requests, day.total_invocations);
    assert!((day.total_invocations as f64 - 400_000.0).abs() < 40_000.0, "{}", day.total_invocations);
    let want: BTreeMap<&str, u64> = day.function_totals.iter().map(|(k, n)| (k.as_str(), *n)).collect();
    assert!(s.streams.iter().all(|x| want[x.key.as_str()] == x.requests));
    // Every stream joined its duration and its app's memory.
    let join = s.join.as_ref().unwrap();
    assert_eq!((join.streams_with_duration, join.streams_with_memory), (day.functions, day.functions));
    let by_app = scan(&day.invocations_path, &TraceOptions { group_by: GroupBy::App, ..opts() }).unwrap();
    let by_owner = scan(&day.invocations_path, &TraceOptions { group_by: GroupBy::Owner, ..opts() }).unwrap();
    assert_eq!((by_app.total_streams, by_owner.total_streams), (day.apps, day.owners));
    // Heavy tail: the top 5% of functions take over half the invocations.
    let top: u64 = s.streams[..s.streams.len() / 20].iter().map(|x| x.requests).sum();
    assert!(top as f64 > 0.5 * s.total_requests as f64, "{top} of {}", s.total_requests);
    // Diurnal: the busiest hour has well over the quietest's invocations.
    let hours: Vec<u64> = day.minute_totals.chunks(60).map(|c| c.iter().sum()).collect();
    assert!(*hours.iter().max().unwrap() as f64 > 1.5 * *hours.iter().min().unwrap() as f64, "{hours:?}");
    // Arrivals per minute match the file's totals per minute.
    let a = all(&s);
    assert_eq!(a.len() as u64, day.total_invocations);
    let mut minutes = vec![0u64; 1440];
    for x in &a {
        minutes[(x.time_s / 60.0) as usize] += 1;
    }
    assert_eq!(minutes, day.minute_totals);
    // Timer functions fire periodically: equal counts at a fixed period.
    let rows = rows_of(&day.invocations_path);
    let timers: Vec<_> = rows.iter().filter(|r| r[3] == "timer").collect();
    assert!(!timers.is_empty());
    for r in timers {
        let fires: Vec<usize> = (0..1440).filter(|m| r[4 + m] != "0").collect();
        let gaps: BTreeSet<usize> = fires.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() <= 1, "timer gaps {gaps:?}");
        assert_eq!(fires.iter().map(|m| &r[4 + m]).collect::<BTreeSet<_>>().len(), 1);
    }
    // Seeded: the same spec writes the same bytes.
    let dir2 = tempfile::tempdir().unwrap();
    let paths = generate_azure_functions_2019_day(dir2.path(), &spec).unwrap();
    assert_eq!(paths.len(), 3);
    for (a, b) in [&day.invocations_path, &day.durations_path, &day.memory_path].iter().zip(&paths) {
        assert_eq!(std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    }
}

// ---- 10. Command line ----

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    trace: TraceArgs,
}

#[test]
fn t10_1_args_defaults_and_parsing() {
    let cli = Cli::try_parse_from(["replay"]).unwrap();
    assert_eq!(cli.trace.options(0).unwrap(), TraceOptions::default());
    assert_eq!(cli.trace.rate_scale, 1.0);
    let cli = Cli::try_parse_from([
        "replay",
        "--format",
        "azure-functions-2019",
        "--arrivals",
        "exp-normalised",
        "--arrival-shift",
        "--window-start",
        "6h",
        "--window-duration",
        "90",
        "--time-scale",
        "0.1",
        "--rate-scale",
        "2",
        "--sample",
        "quantile:0.9-1:20",
        "--group-by",
        "app",
        "--skip-bad-rows",
    ])
    .unwrap();
    let o = cli.trace.options(42).unwrap();
    assert_eq!(o.format, Some(TraceFormat::AzureFunctions2019));
    assert_eq!(o.counts_to_arrivals, CountsToArrivals::ExpNormalised);
    assert!(o.random_shift && o.skip_bad_rows);
    assert_eq!((o.window_start_s, o.window_duration_s, o.time_scale), (21_600.0, Some(90.0), 0.1));
    assert_eq!(o.sample, Sample::Quantile { lo: 0.9, hi: 1.0, n: Some(20) });
    assert_eq!((o.group_by, o.seed), (GroupBy::App, 42));
    for bad in ["--time-scale=0", "--rate-scale=-1", "--window-duration=0", "--max-reorder=-5"] {
        let cli = Cli::try_parse_from(["replay", bad]).unwrap();
        assert!(cli.trace.options(0).is_err(), "{bad}");
    }
    for bad in [["--sample", "top-k:0"], ["--arrivals", "burst"], ["--format", "csv"], ["--window-start", "soon"]] {
        assert!(Cli::try_parse_from(["replay", bad[0], bad[1]]).is_err(), "{bad:?}");
    }
    let help = Cli::try_parse_from(["replay", "--help"]).unwrap_err().to_string();
    for needle in
        ["gamma:RATE:CV", "exp-normalised", "poisson-fit", "top-k:N", "gpu_milli", "end_timestamp", "--skip-bad-rows"]
    {
        assert!(help.contains(needle), "help lacks {needle}");
    }
}

#[test]
fn t10_2_llm_2024_timestamps_and_generic_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let p = write(
        dir.path(),
        "week.csv",
        &format!(
            "{LLM_HEAD}2024-05-10 00:00:00+00:00,100,10\n2024-05-10 00:00:00.009930+00:00,300,30\n2024-05-10 00:00:01+00:00,200,20\n"
        ),
    );
    let s = scan(&p, &opts()).unwrap();
    let a = all(&s);
    let times: Vec<f64> = a.iter().map(|x| x.time_s).collect();
    assert!((times[1] - 0.00993).abs() < 1e-12 && times[2] == 1.0, "{times:?}");
    assert_eq!(parse_timestamp_ns("2024-05-10 00:00:00+00:00"), Some(1_715_299_200_000_000_000));
    // Generic tokens: prefill weight on the first token column, decode weight on the second.
    let g = write(dir.path(), "g.csv", "timestamp_s,tenant,prompt,output\n0,a,100,10\n1,b,100,30\n");
    let o = TraceOptions { prefill_weight: 1.0, decode_weight: 5.0, ..opts() };
    let s = scan(&g, &o).unwrap();
    // a: 150, b: 250, mean 200.
    let w: BTreeMap<&str, f64> = s.streams.iter().map(|x| (x.key.as_str(), x.mean_work)).collect();
    assert_eq!((w["a"], w["b"]), (0.75, 1.25));
    // Generic rows out of order come out sorted.
    let u = write(dir.path(), "u.csv", "timestamp_s,tenant\n1,a\n5,a\n6,b\n3,b\n");
    let s = scan(&u, &opts()).unwrap();
    assert_eq!(s.reorder_needed_s, 3.0);
    assert_eq!(all(&s).iter().map(|x| x.time_s).collect::<Vec<_>>(), [1.0, 3.0, 5.0, 6.0]);
    // With the reorder horizon capped below what the file needs, a late row is an error naming it and the line it
    // is late behind...
    let e = scan(&u, &TraceOptions { max_reorder_s: 0.0, ..opts() }).unwrap_err().to_string();
    assert!(e.contains("u.csv:5: time 3 s is 3 s before the time 6 s of line 4"), "{e}");
    assert!(e.contains("--max-reorder 0 s") && e.contains("--skip-bad-rows"), "{e}");
    // ... and with --skip-bad-rows late rows are counted and kept, in order.
    let s = scan(&u, &TraceOptions { max_reorder_s: 0.0, skip_bad_rows: true, ..opts() }).unwrap();
    let mut stream = s.arrivals(1.0).unwrap();
    let mut out = Vec::new();
    for until in [5.5, 10.0] {
        stream.next_window(until, &mut out).unwrap();
    }
    // Row `3` comes after `5` was emitted: emitted at 5 and counted.
    assert_eq!(out.iter().map(|x| x.time_s).collect::<Vec<_>>(), [1.0, 5.0, 5.0, 6.0]);
    assert_eq!(stream.late_rows(), 1);
    // A row far ahead of the rest, beyond the window (a bad timestamp), does not stop the reading of the rows after
    // it: they used to be lost, and the whole window with them.
    let far = write(dir.path(), "far.csv", "timestamp_s,tenant\n0,a\n100000,b\n1,a\n2,b\n3,a\n200000,a\n");
    let capped = TraceOptions { max_reorder_s: 10.0, window_duration_s: Some(50.0), ..opts() };
    let e = scan(&far, &capped).unwrap_err().to_string();
    assert!(e.contains("far.csv:4: time 1 s is 99999 s before the time 100000 s of line 3"), "{e}");
    let s = scan(&far, &TraceOptions { skip_bad_rows: true, ..capped }).unwrap();
    assert_eq!(s.late_rows, 3, "the rows after the far one are out of order by more than the cap");
    let mut stream = s.arrivals(1.0).unwrap();
    let mut out = Vec::new();
    stream.next_window(5.0, &mut out).unwrap();
    assert_eq!(out.iter().map(|x| x.time_s).collect::<Vec<_>>(), [0.0, 1.0, 2.0, 3.0]);
    assert_eq!(stream.late_rows(), 0, "none of them was replayed late");
}
