//! The `standin` stand-in workloads as processes, as the agent's job supervisor sees them: `standin serve` warms
//! up, serves over keep-alive connections, drains and stops on SIGTERM; `standin retrain` checkpoints on signals,
//! resumes from its checkpoint and refuses a malformed one.
//!
//! Every wait is on state (a line on stdout, an HTTP answer, a process exit) with a deadline, never a fixed sleep.
//! Signals are sent with `kill(1)`, which needs no unsafe code.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The longest any wait in these tests may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// A running `standin`, killed when dropped; its stdout read line by line.
struct Standin {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Standin {
    fn start(args: &[&str], env: &[(&str, &str)]) -> Standin {
        let mut child = Command::new(env!("CARGO_BIN_EXE_standin"))
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("cannot start standin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Standin { child, lines }
    }

    /// The next line on stdout, which must start with `prefix`; the rest of it.
    fn line(&self, prefix: &str) -> String {
        let line = self.lines.recv_timeout(DEADLINE).unwrap_or_else(|e| panic!("no line `{prefix}...`: {e}"));
        line.strip_prefix(prefix).unwrap_or_else(|| panic!("expected `{prefix}...`, got `{line}`")).to_string()
    }

    /// The number in the next line, which must be `prefix` then the number.
    fn number(&self, prefix: &str) -> f64 {
        let rest = self.line(prefix);
        rest.parse().unwrap_or_else(|e| panic!("`{prefix}{rest}`: {e}"))
    }

    /// Asserts that stdout closes without another line (the process exited or is exiting).
    fn no_more_lines(&self) {
        if let Ok(line) = self.lines.recv_timeout(DEADLINE) {
            panic!("unexpected line `{line}`");
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill").args([&format!("-{name}"), &self.child.id().to_string()]).status();
        assert!(status.expect("cannot run kill").success(), "kill -{name} failed");
    }

    fn exit_status(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(start.elapsed() < DEADLINE, "standin did not exit within {DEADLINE:?}");
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `condition` until it holds; panics after [`DEADLINE`].
fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let start = Instant::now();
    while !condition() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// An HTTP/1.1 client connection, reused across requests (keep-alive).
struct Http {
    stream: BufReader<TcpStream>,
}

impl Http {
    fn connect(addr: &str) -> Http {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        Http { stream: BufReader::new(stream) }
    }

    /// Sends a request (POSTs carry a small JSON body) and reads the answer: status and body.
    fn request(&mut self, method: &str, path: &str) -> (u16, String) {
        let body = if method == "POST" { r#"{"inputs": [[0.1, 0.2, 0.3]]}"# } else { "" };
        let request =
            format!("{method} {path} HTTP/1.1\r\nHost: standin\r\nContent-Length: {}\r\n\r\n{body}", body.len());
        self.stream.get_mut().write_all(request.as_bytes()).expect("send request");
        let mut status_line = String::new();
        self.stream.read_line(&mut status_line).expect("read status line");
        let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok());
        let status = status.unwrap_or_else(|| panic!("bad status line `{status_line}`"));
        let mut length = 0;
        loop {
            let mut header = String::new();
            self.stream.read_line(&mut header).expect("read header");
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().expect("content-length");
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).expect("read body");
        (status, String::from_utf8(body).expect("utf-8 body"))
    }
}

/// One request on a fresh connection.
fn http(addr: &str, method: &str, path: &str) -> (u16, String) {
    Http::connect(addr).request(method, path)
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON: `{text}`: {e}"))
}

fn stats(addr: &str) -> Value {
    let (status, body) = http(addr, "GET", "/stats");
    assert_eq!(status, 200, "{body}");
    json(&body)
}

fn start_server(args: &[&str]) -> (Standin, String) {
    let mut argv = vec!["serve", "--listen", "127.0.0.1:0"];
    argv.extend_from_slice(args);
    let server = Standin::start(&argv, &[("CUDA_VISIBLE_DEVICES", "MIG-0c5a0e1e-test")]);
    let addr = server.line("standin serve listening on ");
    (server, addr)
}

#[test]
fn serve_warms_up_serves_over_keep_alive_drains_and_stops_on_sigterm() {
    let warmup = Duration::from_millis(1500);
    let latency = Duration::from_millis(400);
    let started = Instant::now();
    let (mut server, addr) = start_server(&["--warmup-ms", "1500", "--latency-ms", "400", "--name", "s1"]);

    // Listening at once, but not ready, until the warm-up is over.
    assert_eq!(http(&addr, "GET", "/ready"), (503, "warming up".to_string()));
    assert_eq!(http(&addr, "POST", "/infer"), (503, "warming up".to_string()));
    wait_until("/ready", || http(&addr, "GET", "/ready").0 == 200);
    assert!(started.elapsed() >= warmup, "ready after {:?}", started.elapsed());

    // Requests take the latency, over one connection.
    let mut connection = Http::connect(&addr);
    for _ in 0..3 {
        let sent = Instant::now();
        let (status, body) = connection.request("POST", "/infer");
        assert!(sent.elapsed() >= latency, "answered after {:?}", sent.elapsed());
        assert_eq!(status, 200, "{body}");
        let expected = serde_json::json!({ "served_by": "s1", "instance": "MIG-0c5a0e1e-test", "latency_ms": 400.0 });
        assert_eq!(json(&body), expected);
    }
    assert_eq!(connection.request("GET", "/ready"), (200, "ready".to_string()));
    let s = stats(&addr);
    assert_eq!((s["served"].as_u64(), s["refused"].as_u64(), s["in_flight"].as_u64()), (Some(3), Some(1), Some(0)));
    assert_eq!((s["ready"].as_bool(), s["draining"].as_bool()), (Some(true), Some(false)));

    // A drain with five requests in flight answers once all five are served; new requests are refused meanwhile.
    let requests: Vec<_> = (0..5)
        .map(|_| {
            let addr = addr.clone();
            thread::spawn(move || http(&addr, "POST", "/infer"))
        })
        .collect();
    wait_until("5 requests in flight", || stats(&addr)["in_flight"] == 5);
    let drain = {
        let addr = addr.clone();
        thread::spawn(move || http(&addr, "POST", "/drain"))
    };
    wait_until("draining", || stats(&addr)["draining"] == true);
    assert_eq!(http(&addr, "GET", "/ready"), (503, "draining".to_string()));
    assert_eq!(http(&addr, "POST", "/infer"), (503, "draining".to_string()));
    let (status, body) = drain.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body), serde_json::json!({ "in_flight_left": 0, "served": 8 }));
    for request in requests {
        let (status, body) = request.join().unwrap();
        assert_eq!(status, 200, "{body}");
    }

    // Draining lasts; a second drain answers at once.
    assert_eq!(http(&addr, "POST", "/infer"), (503, "draining".to_string()));
    assert_eq!(
        json(&http(&addr, "POST", "/drain?deadline_ms=100").1),
        serde_json::json!({ "in_flight_left": 0, "served": 8 })
    );
    let s = stats(&addr);
    assert_eq!((s["served"].as_u64(), s["refused"].as_u64(), s["in_flight"].as_u64()), (Some(8), Some(3), Some(0)));
    assert_eq!((s["ready"].as_bool(), s["draining"].as_bool()), (Some(false), Some(true)));

    server.signal("TERM");
    let status = server.exit_status();
    assert!(status.success(), "{status}");
}

#[test]
fn sigterm_lets_the_request_in_flight_finish_and_closes_idle_connections() {
    let (mut server, addr) = start_server(&["--latency-ms", "800"]);
    wait_until("/ready", || http(&addr, "GET", "/ready").0 == 200);
    // An idle keep-alive connection must not hold up the exit.
    let mut idle = Http::connect(&addr);
    assert_eq!(idle.request("GET", "/ready").0, 200);
    let request = {
        let addr = addr.clone();
        thread::spawn(move || http(&addr, "POST", "/infer"))
    };
    wait_until("a request in flight", || stats(&addr)["in_flight"] == 1);
    server.signal("TERM");
    let (status, body) = request.join().unwrap();
    assert_eq!(status, 200, "{body}");
    let status = server.exit_status();
    assert!(status.success(), "{status}");
    assert!(TcpStream::connect(&addr).is_err(), "still accepting on {addr}");
}

#[test]
fn serve_takes_its_latency_from_a_model_profile_and_names_missing_flags() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/models/resnet50.toml");
    let model = model.to_str().unwrap();
    let (mut server, addr) = start_server(&["--model", model, "--gpu-model", "A100-40GB", "--profile", "3g"]);
    wait_until("/ready", || http(&addr, "GET", "/ready").0 == 200);
    let (status, body) = http(&addr, "POST", "/infer");
    assert_eq!(status, 200, "{body}");
    // resnet50's table: 0.534 ms at batch 1 on a 3g instance of the reference GPU.
    assert_eq!(json(&body)["latency_ms"].as_f64(), Some(0.534));
    server.signal("INT");
    assert!(server.exit_status().success());

    let out = Command::new(env!("CARGO_BIN_EXE_standin")).args(["serve", "--listen", "127.0.0.1:0"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--latency-ms") && stderr.contains("--model"), "{stderr}");
}

fn checkpoint(path: &Path) -> Value {
    json(&std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

#[test]
fn retrain_checkpoints_on_signals_and_resumes_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("retrain.ckpt");
    let path_arg = path.to_str().unwrap();

    // On a 7g instance: one GPU-second per second, so 20 of work outlasts the test's signals by far.
    let mut job = Standin::start(
        &["retrain", "--checkpoint", path_arg, "--work-gpu-s", "20", "--profile", "7g", "--tick-ms", "10"],
        &[],
    );
    assert_eq!(job.line("standin retrain "), "started at 0");
    // SIGUSR1 writes a checkpoint and the job goes on; ask until one shows progress.
    let mut first = 0.0;
    let mut asked = 0;
    wait_until("a checkpoint with progress", || {
        job.signal("USR1");
        asked += 1;
        first = job.number("checkpoint progress=");
        first > 0.0
    });
    let c = checkpoint(&path);
    assert_eq!(c["progress"].as_f64(), Some(first));
    assert_eq!(
        (c["work_gpu_s"].as_f64(), c["done"].as_bool(), c["checkpoints"].as_u64()),
        (Some(20.0), Some(false), Some(asked))
    );

    // SIGTERM writes one more and exits 0.
    job.signal("TERM");
    let stopped_at = job.number("checkpoint progress=");
    assert!(job.exit_status().success());
    job.no_more_lines();
    assert!(stopped_at >= first && stopped_at < 20.0, "{stopped_at}");
    let c = checkpoint(&path);
    assert_eq!(c["progress"].as_f64(), Some(stopped_at));
    assert_eq!((c["done"].as_bool(), c["checkpoints"].as_u64()), (Some(false), Some(asked + 1)));
    assert!(!dir.path().join("retrain.ckpt.tmp").exists());

    // Restarted on a faster instance, it resumes where it stopped, checkpoints periodically and finishes.
    let mut job = Standin::start(
        &["retrain", "--checkpoint", path_arg, "--work-gpu-s", "20", "--speed", "20", "--checkpoint-every-s", "0.2"],
        &[],
    );
    assert_eq!(job.number("standin retrain resumed from "), stopped_at);
    let mut written = 0;
    let mut last = stopped_at;
    while last < 20.0 {
        let progress = job.number("checkpoint progress=");
        assert!(progress >= last && progress <= 20.0, "{progress} after {last}");
        last = progress;
        written += 1;
    }
    assert!(written >= 2, "one periodic checkpoint at least, then the last: {written}");
    assert!(job.exit_status().success());
    job.no_more_lines();
    let c = checkpoint(&path);
    let expected =
        serde_json::json!({ "progress": 20.0, "work_gpu_s": 20.0, "done": true, "checkpoints": asked + 1 + written });
    assert_eq!(c, expected);
}

#[test]
fn retrain_refuses_a_malformed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.ckpt");
    std::fs::write(&path, r#"{"progress": 3.5, "work_gpu_s": "#).unwrap();
    // One GPU-second of work: even a job that wrongly started over would end at once.
    let out = Command::new(env!("CARGO_BIN_EXE_standin"))
        .args(["retrain", "--checkpoint", path.to_str().unwrap(), "--work-gpu-s", "1", "--tick-ms", "10"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(path.to_str().unwrap()) && stderr.contains("malformed"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), r#"{"progress": 3.5, "work_gpu_s": "#);
}
