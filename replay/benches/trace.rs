//! Parse rate of the trace adapters on generated large files (the goal: at least 1 million rows per second per
//! core). Writes 1.5 M rows of the Azure LLM and Azure Functions 2021 formats to a temporary directory, then times
//! pass 1 (`scan`) and pass 1 + pass 2 (`scan` then every arrival). Throughput is reported in rows (elements) per
//! second. Run with `cargo bench -p tessera-replay --bench trace`.

use std::fs::File;
use std::hint::black_box;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tessera_replay::trace::{TraceOptions, scan};

const ROWS: u64 = 1_500_000;

/// Azure LLM 2023 style: 7 fractional digits, no zone, about 5 requests per second.
fn write_llm(path: &Path) {
    let mut w = BufWriter::new(File::create(path).unwrap());
    writeln!(w, "TIMESTAMP,ContextTokens,GeneratedTokens").unwrap();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..ROWS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let t_100ns = i * 2_000_000 + x % 1_000_000; // ~0.2 s apart, in 100 ns units
        let secs = t_100ns / 10_000_000;
        let frac = t_100ns % 10_000_000;
        let (d, h, m, s) = (1 + secs / 86_400, (secs / 3600) % 24, (secs / 60) % 60, secs % 60);
        writeln!(w, "2023-11-{d:02} {h:02}:{m:02}:{s:02}.{frac:07},{},{}", 100 + x % 4000, 1 + (x >> 20) % 500)
            .unwrap();
    }
}

/// Azure Functions 2021 style: 64-hex app and function hashes, ordered by end time, 400 functions.
fn write_2021(path: &Path) {
    let mut w = BufWriter::new(File::create(path).unwrap());
    writeln!(w, "app,func,end_timestamp,duration").unwrap();
    let hex = |v: u64| format!("{:016x}{:016x}{:016x}{:016x}", v, v.rotate_left(16), v.rotate_left(32), !v);
    let apps: Vec<String> = (0..40u64).map(|a| hex(a.wrapping_mul(0x9e37_79b9_7f4a_7c15))).collect();
    let funcs: Vec<String> = (0..400u64).map(|f| hex(f.wrapping_mul(0xbf58_476d_1ce4_e5b9) ^ 7)).collect();
    let mut x: u64 = 0x1234_5678_9abc_def1;
    for i in 0..ROWS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = (x % 400) as usize;
        let end = i as f64 * 0.01 + 1.0;
        let dur = (x >> 16) % 5000;
        writeln!(w, "{},{},{end:.6},{}.{:03}", apps[f / 10], funcs[f], dur / 1000, dur % 1000).unwrap();
    }
}

fn files() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let llm = dir.path().join("llm.csv");
    let f2021 = dir.path().join("azure2021.csv");
    write_llm(&llm);
    write_2021(&f2021);
    (dir, llm, f2021)
}

fn bench(c: &mut Criterion) {
    let (_dir, llm, f2021) = files();
    let opts = TraceOptions::default();
    let mut group = c.benchmark_group("trace");
    group.throughput(Throughput::Elements(ROWS));
    group.sample_size(10);
    for (name, path) in [("azure-llm", &llm), ("azure-functions-2021", &f2021)] {
        group.bench_function(format!("{name}/scan"), |b| {
            b.iter(|| {
                let s = scan(path, &opts).unwrap();
                assert_eq!(s.rows, ROWS);
                black_box(s.total_requests)
            })
        });
        group.bench_function(format!("{name}/scan+arrivals"), |b| {
            b.iter(|| {
                let s = scan(path, &opts).unwrap();
                let mut stream = s.arrivals(1.0).unwrap();
                let mut out = Vec::with_capacity(1 << 16);
                let mut n = 0u64;
                let mut until = 60.0;
                loop {
                    out.clear();
                    stream.next_window(until, &mut out).unwrap();
                    n += out.len() as u64;
                    if until > s.duration_s + 60.0 {
                        break;
                    }
                    until += 60.0;
                }
                assert_eq!(n, s.sampled_requests());
                black_box(n)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
