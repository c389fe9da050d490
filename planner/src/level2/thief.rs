//! The thief scheduler of Ekya (Bhardwaj et al., "Ekya: Continuous Learning of Video Analytics Models on Edge
//! Compute Servers", NSDI 2022), on one GPU's MIG slices: a fair split of the compute slices over every job, then
//! one-slice steals between every (thief, victim) pair while the estimated window-averaged accuracy improves, and
//! [`run_horizon`], which re-runs it over a planning horizon at each window boundary and retraining completion.
//!
//! The `ekya` policy plans with it; `tessera` takes its allocation as one of the starts of its own search.

// The scheduler indexes several parallel tables (tenants x profiles x slots) at once; index loops read clearer.
#![allow(clippy::needless_range_loop)]

use tessera_core::plan::Role;

use crate::level2::problem::{GpuProblem, RetrainOption, Schedule, mean_demand};

/// Ekya's retraining window, seconds (the paper's 200 s).
pub const WINDOW_S: f64 = 200.0;

/// A retraining configuration: epochs, work (7g-seconds) and the accuracy it reaches.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Config {
    /// Epochs.
    pub epochs: f64,
    /// Work, 7g GPU-seconds.
    pub work_s: f64,
    /// Accuracy of the retrained model.
    pub accuracy: f64,
}

/// What the thief scheduler decides for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct Allocation {
    /// Inference profile (index into the problem's profiles) per tenant.
    pub inference: Vec<Option<usize>>,
    /// Retraining profile and configuration per tenant.
    pub retraining: Vec<Option<(usize, Config)>>,
    /// The estimated mean window-averaged accuracy.
    pub value: f64,
}

/// The state the thief scheduler plans from.
#[derive(Debug, Clone)]
pub struct ThiefInput<'a> {
    /// The problem (profiles, capacities, speeds).
    pub pb: &'a GpuProblem,
    /// Mean arrival rate per tenant over the window, requests per second.
    pub rate: Vec<f64>,
    /// Accuracy of each tenant's serving model.
    pub accuracy: Vec<f64>,
    /// Retraining configurations each tenant may start (empty: nothing to retrain).
    pub configs: Vec<Vec<Config>>,
    /// A retraining under way that keeps its profile and configuration.
    pub pinned: Vec<Option<(usize, Config)>>,
    /// Seconds of the window left to average over.
    pub window_s: f64,
}

impl ThiefInput<'_> {
    /// Estimated window-averaged accuracy of tenant `i` with inference on `inf` and retraining `rt`.
    fn stream_value(&self, i: usize, inf: Option<usize>, rt: Option<(usize, Config)>) -> f64 {
        let t = &self.pb.tenants[i];
        let served = match inf {
            _ if self.rate[i] <= 0.0 => 1.0,
            Some(p) => (t.cap[p] / self.rate[i]).min(1.0),
            None => 0.0,
        };
        let acc = self.accuracy[i];
        let averaged = match rt {
            Some((p, c)) => {
                let speed = t.retrain.as_ref().map_or(0.0, |r| r.speed[p]);
                if speed <= 0.0 {
                    acc
                } else {
                    let d = c.work_s / speed;
                    if d < self.window_s { (acc * d + c.accuracy * (self.window_s - d)) / self.window_s } else { acc }
                }
            }
            None => acc,
        };
        served * averaged
    }

    /// The best configuration for tenant `i` retraining on profile `p`, and its value.
    fn best_config(&self, i: usize, inf: Option<usize>, p: usize) -> Option<(Config, f64)> {
        if let Some((q, c)) = self.pinned[i] {
            return (q == p).then(|| (c, self.stream_value(i, inf, Some((p, c)))));
        }
        self.configs[i]
            .iter()
            .map(|c| (*c, self.stream_value(i, inf, Some((p, *c)))))
            .max_by(|a, b| a.1.total_cmp(&b.1).then(b.0.epochs.total_cmp(&a.0.epochs)))
    }

    /// The largest profile with at most `slices` compute slices that tenant `i` can use in `role`.
    fn profile_for(&self, i: usize, role: Role, slices: u8) -> Option<usize> {
        let t = &self.pb.tenants[i];
        (0..self.pb.profiles.len())
            .filter(|p| self.pb.compute_slices(*p) <= slices)
            .filter(|p| match role {
                Role::Inference => t.cap[*p] > 0.0,
                Role::Retraining => t.retrain.as_ref().is_some_and(|r| r.speed[*p] > 0.0),
            })
            .max_by(|a, b| {
                let ka = (self.pb.compute_slices(*a), self.score(i, role, *a));
                let kb = (self.pb.compute_slices(*b), self.score(i, role, *b));
                ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1)).then(b.cmp(a))
            })
    }

    fn score(&self, i: usize, role: Role, p: usize) -> f64 {
        let t = &self.pb.tenants[i];
        match role {
            Role::Inference => t.cap[p],
            Role::Retraining => t.retrain.as_ref().map_or(0.0, |r| r.speed[p]),
        }
    }

    /// The nearest valid allocation to `slices` (inference slices then retraining slices per tenant).
    fn map(&self, inf_slices: &[u8], rt_slices: &[u8]) -> Allocation {
        let n = self.pb.tenants.len();
        let mut inference: Vec<Option<usize>> =
            (0..n).map(|i| self.profile_for(i, Role::Inference, inf_slices[i])).collect();
        let mut retraining: Vec<Option<usize>> = (0..n)
            .map(|i| match self.pinned[i] {
                Some((p, _)) => Some(p),
                None if self.configs[i].is_empty() => None,
                None => self.profile_for(i, Role::Retraining, rt_slices[i]),
            })
            .collect();
        loop {
            let mut counts = vec![0u8; self.pb.profiles.len()];
            for p in inference.iter().chain(&retraining).flatten() {
                counts[*p] += 1;
            }
            if self.pb.counts_feasible(&counts) {
                break;
            }
            // Step down the job whose downgrade loses least.
            let mut best: Option<(f64, usize, Role, Option<usize>)> = None;
            for i in 0..n {
                for role in [Role::Inference, Role::Retraining] {
                    let cur = if role == Role::Inference { inference[i] } else { retraining[i] };
                    let Some(p) = cur else { continue };
                    if role == Role::Retraining && self.pinned[i].is_some() {
                        continue;
                    }
                    let smaller = self.pb.compute_slices(p).checked_sub(1).and_then(|s| self.profile_for(i, role, s));
                    let (mut a, mut b) = (inference[i], retraining[i]);
                    if role == Role::Inference {
                        a = smaller;
                    } else {
                        b = smaller;
                    }
                    let loss = self.value_of(i, inference[i], retraining[i]) - self.value_of(i, a, b);
                    if best.is_none_or(|x| loss < x.0) {
                        best = Some((loss, i, role, smaller));
                    }
                }
            }
            let Some((_, i, role, smaller)) = best else { break };
            if role == Role::Inference {
                inference[i] = smaller;
            } else {
                retraining[i] = smaller;
            }
        }
        let mut value = 0.0;
        let mut chosen = Vec::with_capacity(n);
        for i in 0..n {
            let rt = retraining[i].and_then(|p| self.best_config(i, inference[i], p).map(|(c, _)| (p, c)));
            value += self.stream_value(i, inference[i], rt);
            chosen.push(rt);
        }
        Allocation { inference, retraining: chosen, value: value / n.max(1) as f64 }
    }

    fn value_of(&self, i: usize, inf: Option<usize>, rt: Option<usize>) -> f64 {
        match rt.and_then(|p| self.best_config(i, inf, p)) {
            Some((_, v)) => v,
            None => self.stream_value(i, inf, None),
        }
    }
}

/// The thief scheduler on one GPU: a fair split of the 7 compute slices over every job (inference per tenant,
/// retraining per tenant with something to retrain), then one-slice steals between every (thief, victim) pair
/// while the estimate improves.
pub fn thief(input: &ThiefInput) -> Allocation {
    let n = input.pb.tenants.len();
    // Jobs: (tenant, role). A pinned retraining is not a job: its slices are taken off the top.
    let mut jobs: Vec<(usize, Role)> = (0..n).map(|i| (i, Role::Inference)).collect();
    jobs.extend(
        (0..n).filter(|i| input.pinned[*i].is_none() && !input.configs[*i].is_empty()).map(|i| (i, Role::Retraining)),
    );
    let pinned_slices: u8 = input.pinned.iter().flatten().map(|(p, _)| input.pb.compute_slices(*p)).sum::<u8>().min(7);
    let budget = 7 - pinned_slices;
    let mut slices = vec![0u8; jobs.len()];
    if !jobs.is_empty() {
        let base = budget / jobs.len() as u8;
        let extra = (budget % jobs.len() as u8) as usize;
        for (k, s) in slices.iter_mut().enumerate() {
            *s = base + u8::from(k < extra);
        }
    }
    let split = |slices: &[u8]| {
        let mut inf = vec![0u8; n];
        let mut rt = vec![0u8; n];
        for ((i, role), s) in jobs.iter().zip(slices) {
            match role {
                Role::Inference => inf[*i] = *s,
                Role::Retraining => rt[*i] = *s,
            }
        }
        input.map(&inf, &rt)
    };
    let mut best = split(&slices);
    loop {
        let mut improved = false;
        for thief in 0..jobs.len() {
            for victim in 0..jobs.len() {
                if thief == victim {
                    continue;
                }
                while slices[victim] > 0 {
                    slices[victim] -= 1;
                    slices[thief] += 1;
                    let trial = split(&slices);
                    if trial.value > best.value + 1e-12 {
                        best = trial;
                        improved = true;
                    } else {
                        slices[victim] += 1;
                        slices[thief] -= 1;
                        break;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    best
}

/// Ekya's decisions over one GPU's horizon.
#[derive(Debug, Clone)]
pub struct HorizonRun {
    /// The count-level schedule.
    pub schedule: Schedule,
    /// The configuration each tenant's retraining runs with, where one runs.
    pub configs: Vec<Option<Config>>,
    /// Thief-scheduler runs.
    pub replans: usize,
    /// The last run's estimated mean window accuracy.
    pub value: f64,
}

/// Runs the thief scheduler over the horizon of `pb`, starting `now_s` seconds into the workload: at the start
/// (unless `keep` gives the allocation to keep until the next window), at every window boundary and after every
/// retraining completes. `configs[i]` are the configurations tenant `i` may start; `defaults[i]` is the one a
/// retraining already under way runs with.
pub fn run_horizon(
    pb: &GpuProblem,
    now_s: f64,
    window_s: f64,
    configs: &[Vec<Config>],
    defaults: &[Config],
    keep: Option<Allocation>,
) -> HorizonRun {
    let n = pb.tenants.len();
    let (slots, slot_s) = (pb.slots, pb.slot_s);
    let mut pinned: Vec<Option<(usize, Config)>> = (0..n)
        .map(|i| {
            let running = pb.tenants[i].retrain.as_ref().and_then(|r| r.running_on)?;
            pb.profile_index(running.profile).map(|p| (p, defaults[i]))
        })
        .collect();
    let rate: Vec<f64> = (0..n).map(|i| mean_demand(pb, i)).collect();
    let mut accuracy: Vec<f64> = pb.tenants.iter().map(|t| t.acc_old).collect();
    let mut started: Vec<Option<(RetrainOption, Config)>> = vec![None; n];
    let mut done = vec![false; n];
    let mut schedule = Schedule::empty(slots, n);
    let mut current = keep;
    let mut replans = 0usize;
    let mut last_value = current.as_ref().map_or(0.0, |a| a.value);
    for t in 0..slots {
        let at_s = now_s + t as f64 * slot_s;
        let into_window = at_s.rem_euclid(window_s);
        let boundary = t > 0 && into_window < slot_s - 1e-9;
        let completed = t > 0 && (0..n).any(|i| started[i].is_some_and(|(o, _)| o.end == t));
        if current.is_none() || boundary || completed {
            let left = window_s - into_window;
            let window = if left < slot_s { window_s } else { left };
            let open: Vec<Vec<Config>> =
                (0..n).map(|i| if started[i].is_some() || done[i] { Vec::new() } else { configs[i].clone() }).collect();
            let thief_input = ThiefInput {
                pb,
                rate: rate.clone(),
                accuracy: accuracy.clone(),
                configs: open,
                pinned: pinned.clone(),
                window_s: window,
            };
            let a = thief(&thief_input);
            last_value = a.value;
            current = Some(a);
            replans += 1;
        }
        let a = current.as_ref().expect("set above");
        for i in 0..n {
            schedule.inference[t][i] = a.inference[i];
            if t == 0
                && let Some((p, c)) = pinned[i]
            {
                let o = pb.retrain_options(i).first().copied().unwrap_or(RetrainOption {
                    profile: p,
                    start: 0,
                    end: slots + 1,
                });
                started[i] = Some((o, c));
                schedule.retrain[i] = Some(o);
            }
            if started[i].is_none()
                && !done[i]
                && let Some((p, c)) = a.retraining[i]
            {
                let speed = pb.tenants[i].retrain.as_ref().map_or(0.0, |r| r.speed[p]);
                let d = ((c.work_s / (speed * slot_s)) - 1e-9).ceil().max(1.0) as usize;
                let o = RetrainOption { profile: p, start: t, end: t + d };
                started[i] = Some((o, c));
                schedule.retrain[i] = Some(o);
            }
        }
        // Jobs that finish in this slot free their instance and lift accuracy from the next.
        for i in 0..n {
            if let Some((o, c)) = started[i]
                && o.end == t + 1
            {
                done[i] = true;
                accuracy[i] = c.accuracy;
                pinned[i] = None;
                if let Some(a) = current.as_mut() {
                    a.retraining[i] = None;
                }
            }
        }
    }
    HorizonRun { schedule, configs: started.iter().map(|s| s.map(|(_, c)| c)).collect(), replans, value: last_value }
}
