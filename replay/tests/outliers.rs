//! `replay` on outlier input (bounded memory on any input): out-of-range trace times are errors naming file, line
//! and column (skipped and counted with `--skip-bad-rows`); a long gap after the rows replayed costs memory in
//! proportion to the run, not to the gap; and a reader that closes stdout early (`replay --help | head -1`) ends
//! nothing in a panic.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

fn replay() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_replay"));
    c.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    c
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("outliers").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A short run: one minute of workload on one GPU, one policy, no upper bound.
const SHORT: &[&str] = &["--duration", "1m", "--gpus", "1", "--policy", "static", "--no-bound"];

const TIME: &str = "expected a time in seconds from the trace start, from 0 to 31622400 (366 days), found";

#[test]
fn out_of_range_times_are_named_errors_and_skipped_on_request() {
    let dir = scratch("times");
    let f21 = "app,func,end_timestamp,duration\n";
    let cases = [
        ("huge.csv", "timestamp_s,tenant\n0,a\n1.5,a\n1e308,a\n3,a\n".to_string(), format!(":4: column timestamp_s: {TIME} \"1e308\"")),
        ("negative.csv", "timestamp_s,tenant\n0,a\n-3,a\n2,a\n".to_string(), format!(":3: column timestamp_s: {TIME} \"-3\"")),
        (
            "end.csv",
            format!("{f21}a,f,1,0.5\na,f,1e300,1\na,f,3,1\n"),
            format!(":3: column end_timestamp: {TIME} \"1e300\""),
        ),
        (
            "duration.csv",
            format!("{f21}a,f,1,0.5\na,f,3,5\na,f,4,1\n"),
            ":3: column duration: duration \"5\" is longer than end_timestamp \"3\": the invocation would start before \
             the trace (end_timestamp - duration < 0)"
                .to_string(),
        ),
    ];
    for (name, trace_text, want) in cases {
        let trace = write(&dir, name, &trace_text);
        let out = replay().args(SHORT).arg("--trace").arg(&trace).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{name}: stdout {}", text(&out.stdout));
        assert_eq!(text(&out.stderr), format!("error: {}{want}\n", trace.display()));
        assert!(out.stdout.is_empty());
        let out = replay().args(SHORT).arg("--skip-bad-rows").arg("--trace").arg(&trace).output().unwrap();
        let err = text(&out.stderr);
        assert!(out.status.success(), "{name}: {err}");
        assert!(err.contains("1 bad rows skipped"), "{name}: {err}");
        assert!(text(&out.stdout).lines().any(|l| l.starts_with("static")), "{name}: {}", text(&out.stdout));
    }
}

/// Peak resident memory (VmHWM, kB) of a child, read from `/proc/PID/status` every few ms until it exits; a child
/// past `kill_above_kb` is killed, so that a regression fails this test instead of exhausting the machine.
fn peak_rss_kb(mut child: Child, kill_above_kb: u64) -> (Output, u64) {
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let stdout = std::thread::spawn(move || {
        let mut b = Vec::new();
        out.read_to_end(&mut b).unwrap();
        b
    });
    let stderr = std::thread::spawn(move || {
        let mut b = Vec::new();
        err.read_to_end(&mut b).unwrap();
        b
    });
    let status_file = format!("/proc/{}/status", child.id());
    let mut peak = 0u64;
    let status = loop {
        if let Ok(s) = std::fs::read_to_string(&status_file)
            && let Some(kb) = s.lines().find_map(|l| l.strip_prefix("VmHWM:"))
        {
            peak = peak.max(kb.trim().trim_end_matches("kB").trim().parse().unwrap());
            if peak > kill_above_kb {
                child.kill().unwrap();
            }
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    (Output { status, stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }, peak)
}

/// A gap of 10^5 s after two rows, one minute replayed. The streams' rates are measured over the whole window, so
/// scaled to its tenants' rates the minute would be `rate x 10^5 s` copies of its two requests (93 M requests, a
/// 4.5 GB peak, debug build, before the cap); cut to `MAX_BURST` (10) times the window's mean rate, it stays small.
#[cfg(target_os = "linux")]
#[test]
fn a_long_gap_costs_memory_for_the_window_replayed_not_the_gap() {
    /// The bound on the child's peak resident memory, MB.
    const BOUND_MB: u64 = 300;
    let dir = scratch("gap");
    let trace = write(&dir, "gap.csv", "timestamp_s,tenant\n0,a\n1.5,a\n100000,a\n");
    let child = replay()
        .args(SHORT)
        .arg("--json")
        .arg("--trace")
        .arg(&trace)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (out, peak_kb) = peak_rss_kb(child, 4 * BOUND_MB * 1024);
    let err = text(&out.stderr);
    println!(
        "peak RSS of `replay` on a 1e5 s gap, 1 minute replayed: {:.1} MB (bound {BOUND_MB} MB)",
        peak_kb as f64 / 1024.0
    );
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(peak_kb > 0, "VmHWM never read");
    assert!(peak_kb < BOUND_MB * 1024, "peak RSS {peak_kb} kB over {BOUND_MB} MB");
    // Two requests in the minute against 3 in 10^5 s: 1111 times the mean, cut to 10 times.
    assert!(err.contains("(1 stream(s) cut to 10x their window's mean rate, the densest a at 1111x)"), "{err}");
    let v: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    // 10 x the rate the mapping targets x 60 s: 3.6 M requests at seed 1's model and SLO (the target is a few
    // thousand req/s, by the model and SLO the seed draws), against 93 M uncut.
    let requests = v["policies"]["static"]["requests"].as_f64().unwrap();
    assert!(requests < 1e7, "{requests} requests");
    assert_eq!(v["scenario"]["duration_s"], 60.0);
}

/// What a run ending on a closed stdout must not show: a panic (`print!` panics on EPIPE) or its exit code.
fn assert_quiet(what: &str, out: &Output) {
    let err = text(&out.stderr);
    assert!(!err.contains("panicked"), "{what}: {err}");
    assert_ne!(out.status.code(), Some(101), "{what}: {err}");
    assert!(out.status.success(), "{what}: {:?}: {err}", out.status);
}

/// Runs `cmd` with stdout a pipe whose reader is already gone: every write to it fails with EPIPE.
fn with_closed_stdout(mut cmd: Command) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer).stderr(Stdio::piped()).output().unwrap()
}

#[test]
fn a_closed_stdout_ends_quietly() {
    // `replay --help | head -1`: one line read, then the pipe closed.
    let mut child = replay().arg("--help").stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with("Tessera replay"), "{first}");
    let out = child.wait_with_output().unwrap();
    assert_quiet("--help | head -1", &out);
    // The reader gone before anything is written: help, a command's output, a run's table.
    for args in [&["--help"][..], &["--version"], &["policies"], SHORT] {
        let mut cmd = replay();
        cmd.args(args);
        let out = with_closed_stdout(cmd);
        assert_quiet(&args.join(" "), &out);
        if args != SHORT {
            assert_eq!(text(&out.stderr), "", "{args:?}");
        }
    }
}
