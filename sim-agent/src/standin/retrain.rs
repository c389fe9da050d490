//! `standin retrain`: a stand-in retraining job, with the checkpoint behaviour a supervisor relies on.
//!
//! Work is counted as in the simulator, in GPU-seconds of a full 7g instance: a `g`-slice instance (`--profile`)
//! does `g/7` of it per second, or `--speed S` gives the rate directly (default 1, a 7g instance). Progress
//! advances every `--tick-ms` by the time that passed, and never goes past `--work-gpu-s`.
//!
//! The job writes its [`Checkpoint`] atomically (`PATH.tmp`, then renamed over `PATH`) and prints
//! `checkpoint progress=P` for each write:
//! - on SIGUSR1, and goes on;
//! - on SIGTERM or SIGINT, and exits 0;
//! - every `--checkpoint-every-s`, when given;
//! - when the work is done (`done: true`), and exits 0.
//!
//! At start it resumes from the checkpoint if `PATH` exists (printing `standin retrain resumed from P`, else
//! `standin retrain started at 0`); a checkpoint that cannot be read or parsed is an error naming the file (exit
//! 1), never a silent restart from zero. A restart may run at another speed, as a job moved to an instance of
//! another size.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde::{Deserialize, Serialize};
use tessera_core::catalog::Profile;
use tokio::time::{Instant, Interval, MissedTickBehavior, interval_at};

use super::{Signals, StandinError, runtime, say};

/// Arguments of `standin retrain`.
#[derive(Debug, Clone, Args)]
pub struct RetrainArgs {
    /// Checkpoint file: resumed from at start when it exists, written atomically (PATH.tmp, then renamed).
    #[arg(long, value_name = "PATH")]
    pub checkpoint: PathBuf,
    /// Work to do, in GPU-seconds of a full 7g instance.
    #[arg(long, value_name = "W")]
    pub work_gpu_s: f64,
    /// MIG profile of the instance: a g-slice instance does g/7 of the work per second. Exclusive with --speed.
    #[arg(long, value_name = "PROFILE")]
    pub profile: Option<Profile>,
    /// Work (7g GPU-seconds) done per second [default: 1]. Exclusive with --profile.
    #[arg(long, value_name = "S")]
    pub speed: Option<f64>,
    /// Also write a checkpoint every N seconds.
    #[arg(long, value_name = "N")]
    pub checkpoint_every_s: Option<f64>,
    /// How often progress advances.
    #[arg(long, value_name = "MS", default_value_t = 100)]
    pub tick_ms: u64,
}

impl RetrainArgs {
    /// Work done per second: `--speed`, `g/7` for `--profile`, or 1.
    pub fn work_per_second(&self) -> Result<f64, StandinError> {
        let speed = match (self.profile, self.speed) {
            (Some(_), Some(_)) => return Err(usage("--profile and --speed are exclusive: give one of them")),
            (Some(profile), None) => f64::from(profile.compute_slices()) / 7.0,
            (None, Some(speed)) => speed,
            (None, None) => 1.0,
        };
        positive("--speed", speed)?;
        Ok(speed)
    }

    fn validate(&self) -> Result<(), StandinError> {
        positive("--work-gpu-s", self.work_gpu_s)?;
        if let Some(every) = self.checkpoint_every_s {
            positive("--checkpoint-every-s", every)?;
            if Duration::try_from_secs_f64(every).is_err() {
                return Err(StandinError::Usage(format!("--checkpoint-every-s {every} is too long")));
            }
        }
        if self.tick_ms == 0 {
            return Err(usage("--tick-ms must be at least 1"));
        }
        Ok(())
    }
}

fn usage(message: &str) -> StandinError {
    StandinError::Usage(message.to_string())
}

fn positive(flag: &str, value: f64) -> Result<(), StandinError> {
    if value.is_finite() && value > 0.0 {
        Ok(())
    } else {
        Err(StandinError::Usage(format!("{flag} must be a finite number > 0, got {value}")))
    }
}

/// The checkpoint file's contents (JSON).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// Work done, 7g GPU-seconds.
    pub progress: f64,
    /// Work of the whole job, 7g GPU-seconds.
    pub work_gpu_s: f64,
    /// Whether the work is done.
    pub done: bool,
    /// Checkpoints written so far, this one included, over every run of the job.
    pub checkpoints: u64,
}

impl Checkpoint {
    /// Reads the checkpoint at `path`: `None` when there is none; an error naming the file when it cannot be
    /// read, is not a checkpoint, or holds impossible numbers.
    pub fn read(path: &Path) -> Result<Option<Checkpoint>, StandinError> {
        let bad = |message: String| StandinError::Checkpoint { path: path.to_path_buf(), message };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(bad(format!("cannot read: {e}"))),
        };
        let checkpoint: Checkpoint = serde_json::from_str(&text).map_err(|e| bad(format!("malformed: {e}")))?;
        if !(checkpoint.progress.is_finite() && checkpoint.progress >= 0.0) {
            return Err(bad(format!("malformed: progress {} is not a finite number >= 0", checkpoint.progress)));
        }
        if !(checkpoint.work_gpu_s.is_finite() && checkpoint.work_gpu_s > 0.0) {
            return Err(bad(format!("malformed: work_gpu_s {} is not a finite number > 0", checkpoint.work_gpu_s)));
        }
        Ok(Some(checkpoint))
    }

    /// Writes the checkpoint to `path` atomically: to `PATH.tmp`, synced, then renamed over `PATH` (its folder is
    /// created if missing, as a job's first checkpoint on a fresh volume needs).
    pub fn write(&self, path: &Path) -> Result<(), StandinError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(StandinError::io(format!("creating {}", dir.display())))?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut text = serde_json::to_string(self).expect("a checkpoint serialises");
        text.push('\n');
        std::fs::File::create(&tmp)
            .and_then(|mut file| file.write_all(text.as_bytes()).and_then(|()| file.sync_all()))
            .map_err(StandinError::io(format!("writing checkpoint {}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(StandinError::io(format!(
            "renaming checkpoint {} to {}",
            tmp.display(),
            path.display()
        )))
    }
}

/// A retraining job's progress: the pure part of `standin retrain`.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    progress: f64,
    work_gpu_s: f64,
    speed: f64,
    checkpoints: u64,
}

impl Job {
    /// A job of `work_gpu_s` doing `speed` of it per second, from `resumed`'s progress (capped at the work) and
    /// checkpoint count, or from 0.
    pub fn new(work_gpu_s: f64, speed: f64, resumed: Option<&Checkpoint>) -> Job {
        Job {
            progress: resumed.map_or(0.0, |c| c.progress.min(work_gpu_s)),
            work_gpu_s,
            speed,
            checkpoints: resumed.map_or(0, |c| c.checkpoints),
        }
    }

    /// Work done, 7g GPU-seconds.
    pub fn progress(&self) -> f64 {
        self.progress
    }

    /// Whether the work is done.
    pub fn is_done(&self) -> bool {
        self.progress >= self.work_gpu_s
    }

    /// Advances by `elapsed` of running, never past the work.
    pub fn advance(&mut self, elapsed: Duration) {
        self.progress = (self.progress + self.speed * elapsed.as_secs_f64()).min(self.work_gpu_s);
    }

    /// The next checkpoint to write (counted).
    pub fn checkpoint(&mut self) -> Checkpoint {
        self.checkpoints += 1;
        Checkpoint {
            progress: self.progress,
            work_gpu_s: self.work_gpu_s,
            done: self.is_done(),
            checkpoints: self.checkpoints,
        }
    }
}

/// What woke the job up.
enum Event {
    Tick,
    Periodic,
    CheckpointSignal,
    Stop,
}

/// Runs `standin retrain` until the work is done or SIGTERM/SIGINT, checkpointing as the module doc says.
pub fn run(args: &RetrainArgs) -> Result<(), StandinError> {
    args.validate()?;
    let speed = args.work_per_second()?;
    let resumed = Checkpoint::read(&args.checkpoint)?;
    let mut job = Job::new(args.work_gpu_s, speed, resumed.as_ref());
    runtime()?.block_on(async {
        let mut signals = Signals::install()?;
        say(&match resumed {
            Some(_) => format!("standin retrain resumed from {}", job.progress()),
            None => "standin retrain started at 0".to_string(),
        })?;
        let every = |period: Duration| {
            let mut interval = interval_at(Instant::now() + period, period);
            interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            interval
        };
        let mut ticks = every(Duration::from_millis(args.tick_ms));
        let mut periodic = args.checkpoint_every_s.map(|s| every(Duration::from_secs_f64(s)));
        let mut last = Instant::now();
        // A job resumed from a finished checkpoint is done at once.
        while !job.is_done() {
            let event = tokio::select! {
                _ = ticks.tick() => Event::Tick,
                () = tick_of(periodic.as_mut()) => Event::Periodic,
                () = signals.user1.recv() => Event::CheckpointSignal,
                () = signals.stop.recv() => Event::Stop,
            };
            let now = Instant::now();
            job.advance(now - last);
            last = now;
            match event {
                // Finishing writes the last checkpoint, whatever the event that finished the work.
                _ if job.is_done() => break,
                Event::Tick => {}
                Event::Periodic | Event::CheckpointSignal => save(&mut job, &args.checkpoint)?,
                Event::Stop => return save(&mut job, &args.checkpoint),
            }
        }
        save(&mut job, &args.checkpoint)
    })
}

/// The next tick of `interval`, or never without one.
async fn tick_of(interval: Option<&mut Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}

/// Writes the job's next checkpoint and reports it on stdout.
fn save(job: &mut Job, path: &Path) -> Result<(), StandinError> {
    let checkpoint = job.checkpoint();
    checkpoint.write(path)?;
    say(&format!("checkpoint progress={}", checkpoint.progress))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(profile: Option<Profile>, speed: Option<f64>) -> RetrainArgs {
        RetrainArgs {
            checkpoint: PathBuf::from("ckpt.json"),
            work_gpu_s: 10.0,
            profile,
            speed,
            checkpoint_every_s: None,
            tick_ms: 100,
        }
    }

    #[test]
    fn speed_is_the_instance_share_of_a_7g() {
        assert_eq!(args(None, None).work_per_second().unwrap(), 1.0);
        assert_eq!(args(Some(Profile::G3), None).work_per_second().unwrap(), 3.0 / 7.0);
        assert_eq!(args(Some(Profile::G1Double), None).work_per_second().unwrap(), 1.0 / 7.0);
        assert_eq!(args(None, Some(2.5)).work_per_second().unwrap(), 2.5);
        let both = args(Some(Profile::G3), Some(1.0)).work_per_second().unwrap_err();
        assert!(both.to_string().contains("--profile") && both.to_string().contains("--speed"));
        assert_eq!(both.exit_code(), 2);
        assert!(args(None, Some(0.0)).work_per_second().unwrap_err().to_string().contains("--speed"));
        let no_ticks = RetrainArgs { tick_ms: 0, ..args(None, None) };
        assert!(no_ticks.validate().unwrap_err().to_string().contains("--tick-ms"));
    }

    #[test]
    fn progress_stops_at_the_work_and_checkpoints_count() {
        let mut job = Job::new(10.0, 3.0 / 7.0, None);
        job.advance(Duration::from_secs(7));
        assert!((job.progress() - 3.0).abs() < 1e-12);
        let first = job.checkpoint();
        assert_eq!((first.done, first.checkpoints), (false, 1));
        job.advance(Duration::from_secs(100));
        assert_eq!(job.progress(), 10.0);
        let last = job.checkpoint();
        assert_eq!(last, Checkpoint { progress: 10.0, work_gpu_s: 10.0, done: true, checkpoints: 2 });
        // A resumed job keeps the count; progress past a smaller job's work is capped.
        let resumed = Job::new(2.0, 1.0, Some(&first));
        assert_eq!((resumed.progress(), resumed.checkpoints), (2.0, 1));
        assert!(resumed.is_done());
    }

    #[test]
    fn checkpoints_round_trip_and_bad_ones_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ckpt.json");
        assert_eq!(Checkpoint::read(&path).unwrap(), None);
        let c = Checkpoint { progress: 0.1 + 0.2, work_gpu_s: 5.0, done: false, checkpoints: 3 };
        c.write(&path).unwrap();
        assert_eq!(Checkpoint::read(&path).unwrap(), Some(c));
        assert!(!dir.path().join("ckpt.json.tmp").exists());
        for bad in
            ["", "{", r#"{"progress": 1}"#, r#"{"progress": -1, "work_gpu_s": 1, "done": false, "checkpoints": 0}"#]
        {
            std::fs::write(&path, bad).unwrap();
            let e = Checkpoint::read(&path).unwrap_err();
            assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            assert_eq!(e.exit_code(), 1);
        }
    }
}
