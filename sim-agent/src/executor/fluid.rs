//! Fluid serving: requests as counts per tick instead of one event per request or batch, for runs too large to
//! simulate request by request (a day of a 100-GPU fleet is tens of billions of requests).
//!
//! [`Executor::flow`] takes each tenant's requests over `[now, to)` as a count and serves them from the tenant's
//! **backlog**, a FIFO of chunks of evenly spaced requests, by the tenant's serving instances pooled: together they
//! serve `c = sum of cap / latency(cap)` requests per millisecond (each instance's full-batch throughput, the
//! planner's SLO capacity, interference included). Everything else is the discrete executor's own: plans,
//! reconfiguration latencies, drains, warm-ups, retraining, drift and interference run through the same events,
//! which [`Executor::flow`] handles at the end of the tick (so a phase change takes effect at tick granularity).
//!
//! Per tick, per tenant:
//! - The tick's arrivals join the backlog as one chunk of evenly spaced requests (whole requests: fractional
//!   counts are carried to the next tick, so the total is exact).
//! - Up to `c x tick` requests (plus the fraction carried while a backlog remains) leave the backlog, oldest first,
//!   one every `1 / c` ms but none before it arrives; each completes a full-batch latency `l` after it is served,
//!   and is **within SLO** when that is at most its arrival plus the SLO (counted in closed form per chunk).
//! - That deterministic fluid has no queueing below capacity, where the discrete executor's Poisson arrivals
//!   queue. So the within-SLO count is multiplied by `1 - p`, `p = exp(-2 (1 - r) c w / r)`: the tail of the
//!   reflected Brownian motion that a Poisson stream against a constant-rate server converges to (mean wait
//!   `r / (2 c (1 - r))`, the M/D/1 mean), at slack `w = SLO - l` and load `r` (the tick's arrival rate over `c`,
//!   at most 0.99). Above capacity the backlog grows and its requests are served late, as in the discrete
//!   executor.
//! - With [`LateRequests::Shed`], requests that would be served after `arrival + SLO - l` are shed instead, as
//!   the discrete executor sheds them: those the backlog has made late, and, where a chunk arrives faster than
//!   `c`, the requests the server passes over while it serves one request every `1 / c` ms at the edge of the
//!   slack. The queueing correction is then the share a Poisson stream loses beyond that excess when waits
//!   are capped at the slack ([`shed_share`]), and those requests are shed rather than served late (they leave
//!   the latency record too, taken from the tick's slowest chunks).
//! - With no serving instance, the backlog waits as requests do (`NoInstance::Wait`: a chunk is dropped once it
//!   has waited its longest wait; `NoInstance::Drop`: at once).
//! - Accounting as in the discrete executor: arrivals when they arrive, completions with the accuracy of the model
//!   when served, within-SLO counts rounded with a carried fraction (never more than the completions). The GPU
//!   counters take a tick's completions on the tenant's fastest instance.
//!
//! Not modelled in fluid mode: dispatch policies (a tenant's instances are pooled: ELSA and earliest finish are
//! alike), batch records, latencies below the full-batch latency (the histogram records each served chunk's
//! mean latency), and queueing between instances of different speeds.

use tessera_core::goodput::GoodputLedger;

use rayon::prelude::*;

use super::config::{LateRequests, NoInstance};
use super::state::{Chunk, Inst, Pool, Tenant};
use super::{ExecError, Executor};

/// `x.floor() as u64` without the floor: the cast truncates toward zero and saturates, which is the floor for every
/// `x >= 0` and 0 for every negative `x`, as `x.floor() as u64` is (one cast instruction where `floor` is a libm
/// call on the baseline x86-64 target).
fn floor_u64(x: f64) -> u64 {
    x as u64
}

/// `x.ceil() as u64` without the ceil: the truncation, one more where it fell below `x`, saturating as the cast
/// does (0 for negative `x` and NaN, `u64::MAX` from 2^64 up).
fn ceil_u64(x: f64) -> u64 {
    let t = x as u64;
    if (t as f64) < x { t.saturating_add(1) } else { t }
}

/// Highest load the queueing correction is evaluated at: at and above capacity the backlog itself makes requests
/// late, and the stationary queue of a load of exactly 1 is unbounded.
const LOAD_CAP: f64 = 0.99;

/// Share of the requests served below capacity that meet the SLO: `1 - exp(-2 (1 - r) c w / r)`.
pub(super) fn within_share(load: f64, per_ms: f64, slack_ms: f64) -> f64 {
    if load <= 0.0 {
        return 1.0;
    }
    if slack_ms <= 0.0 {
        return 0.0;
    }
    let r = load.min(LOAD_CAP);
    1.0 - (-2.0 * (1.0 - r) * per_ms * slack_ms / r).exp()
}

/// Share of its arrivals that a server shedding late requests loses to queueing, beyond the excess it sheds
/// above capacity (`max(0, 1 - 1/r)`, which the fluid sheds itself). The queue of a Poisson stream against a
/// constant-rate server is a reflected Brownian motion (drift `r - 1`, variance `r` per service time); with
/// shedding, a wait never exceeds the slack, so it is reflected at `k = c w` requests as well, where it loses
/// `(r - 1) e^(q) / (e^(q) - 1)` per service time, `q = 2 (r - 1) k / r` (`1 / (2 k)` of the arrivals at `r = 1`).
pub(super) fn shed_share(load: f64, per_ms: f64, slack_ms: f64) -> f64 {
    if load <= 0.0 || slack_ms <= 0.0 {
        return 0.0;
    }
    let (r, k) = (load, per_ms * slack_ms);
    let q = 2.0 * (r - 1.0) * k / r;
    let lost = if q.abs() < 1e-9 {
        1.0 / (2.0 * k)
    } else if q > 0.0 {
        (r - 1.0) / (r * (1.0 - (-q).exp()))
    } else {
        (1.0 - r) * q.exp() / (r * (1.0 - q.exp()))
    };
    (lost - (1.0 - 1.0 / r).max(0.0)).clamp(0.0, 1.0)
}

impl Executor {
    /// Fluid serving over `[now, to_ms)`: `counts[t]` requests of tenant index `t` arrive spread over it (see the
    /// module documentation of fluid mode); then every event due by `to_ms` is handled and the clock moves there.
    pub fn flow(&mut self, to_ms: f64, counts: &[f64]) -> Result<(), ExecError> {
        self.check_flow(self.now, to_ms, counts)?;
        let (from, to) = (self.now, to_ms);
        if to > from {
            for (t, &count) in counts.iter().enumerate() {
                let delta = self.flow_tenant(t, from, to, count);
                self.add_gpu_delta(delta);
            }
        }
        self.run_until(to)?;
        self.now = to;
        self.co_settle_all();
        self.debug_check();
        Ok(())
    }

    /// [`Executor::flow`] for each of `steps` in turn, `(to_ms, counts)`, with the same result to the last bit;
    /// tenants are served in parallel over the steps between two events (when no event falls due, a tenant's
    /// fluid serving does not depend on any other tenant's), and the GPU counters are added in step order.
    pub fn flow_steps(&mut self, steps: &[(f64, &[f64])]) -> Result<(), ExecError> {
        let mut from = self.now;
        for &(to, counts) in steps {
            self.check_flow(from, to, counts)?;
            from = to;
        }
        // Kept between calls: a batch's part is a few hundred kilobytes, which a fresh allocation would fault in.
        let mut deltas = std::mem::take(&mut self.flow_deltas);
        let mut i = 0;
        while i < steps.len() {
            // Steps i..=k run before the next event falls due: it is handled at the end of step k.
            let due = self.heap.peek().map_or(f64::INFINITY, |ev| ev.at);
            let k = (i..steps.len()).find(|&j| steps[j].0 >= due).unwrap_or(steps.len() - 1);
            let batch = &steps[i..=k];
            let n = batch.len();
            // Every entry of the batch's part is written below: the buffer only grows, and is not cleared.
            let len = self.tenants.len() * n;
            if deltas.len() < len {
                deltas.resize(len, None);
            }
            let start = self.now;
            let (insts, epoch, rules) = (&self.insts, self.serving_epoch, self.rules());
            let out = &mut deltas[..len];
            self.tenants.par_iter_mut().zip(out.par_chunks_mut(n)).enumerate().for_each(|(t, (tenant, out))| {
                let mut from = start;
                for (&(to, counts), slot) in batch.iter().zip(out) {
                    *slot = if to > from { flow_one(tenant, insts, epoch, rules, from, to, counts[t]) } else { None };
                    from = to;
                }
            });
            for j in 0..n {
                for t in 0..self.tenants.len() {
                    self.add_gpu_delta(deltas[t * n + j]);
                }
            }
            let to = batch[n - 1].0;
            self.run_until(to)?;
            self.now = to;
            self.co_settle_all();
            self.debug_check();
            i = k + 1;
        }
        self.flow_deltas = deltas;
        Ok(())
    }

    /// Checks one fluid step from `from` to `to_ms`.
    fn check_flow(&self, from: f64, to_ms: f64, counts: &[f64]) -> Result<(), ExecError> {
        if to_ms.is_nan() || to_ms < from {
            return Err(ExecError::TimeWentBack { now_ms: from, at_ms: to_ms });
        }
        if counts.len() != self.tenants.len() {
            return Err(ExecError::InvalidConfig {
                field: "flow counts",
                reason: format!("{} counts for {} tenants", counts.len(), self.tenants.len()),
            });
        }
        if let Some(bad) = counts.iter().find(|c| !(c.is_finite() && **c >= 0.0)) {
            return Err(ExecError::InvalidConfig {
                field: "flow counts",
                reason: format!("a count must be finite and >= 0 (got {bad})"),
            });
        }
        if to_ms <= from && counts.iter().any(|c| *c > 0.0) {
            return Err(ExecError::InvalidConfig {
                field: "flow counts",
                reason: format!("requests over an empty interval (from {from} ms to {to_ms} ms)"),
            });
        }
        Ok(())
    }

    /// Adds a tenant's served requests of one step to the GPU of its fastest instance.
    fn add_gpu_delta(&mut self, delta: Option<GpuDelta>) {
        let Some(GpuDelta { gpu, chunk, batches, busy_ms }) = delta else { return };
        let g = &mut self.gpus[gpu as usize].metrics;
        g.ledger += chunk;
        g.batches += batches;
        g.busy_ms += busy_ms;
    }
}

/// What one tenant's fluid step adds to the counters of the GPU of its fastest instance.
#[derive(Debug, Clone, Copy)]
pub(super) struct GpuDelta {
    gpu: u32,
    chunk: GoodputLedger,
    batches: u64,
    busy_ms: f64,
}

/// The served chunks' mean latencies of one tenant's tick, recorded at its end so that requests the queueing
/// correction sheds ([`LateRequests::Shed`]) can leave the record first, the slowest first. A tick serves a few
/// chunks; beyond [`Latencies::KEPT`] of them, chunks are recorded at once (and are never the ones dropped).
#[derive(Default)]
struct Latencies {
    kept: [(f64, u64); Latencies::KEPT],
    len: usize,
    /// Latency sum of the chunks recorded at once.
    early_sum: f64,
}

impl Latencies {
    const KEPT: usize = 8;

    fn push(&mut self, hist: &mut super::metrics::LatencyHistogram, mid: f64, n: u64) {
        if self.len < Self::KEPT {
            self.kept[self.len] = (mid, n);
            self.len += 1;
        } else {
            hist.record(mid, n);
            self.early_sum += mid * n as f64;
        }
    }

    /// Removes `n` requests from the kept chunks, slowest first.
    fn drop_slowest(&mut self, mut n: u64) {
        while n > 0 {
            let Some(i) = (0..self.len)
                .filter(|i| self.kept[*i].1 > 0)
                .max_by(|a, b| self.kept[*a].0.total_cmp(&self.kept[*b].0))
            else {
                return;
            };
            let take = n.min(self.kept[i].1);
            self.kept[i].1 -= take;
            n -= take;
        }
    }

    /// Records the kept chunks; the latency sum of everything recorded.
    fn flush(&self, hist: &mut super::metrics::LatencyHistogram) -> f64 {
        let mut sum = self.early_sum;
        for &(mid, n) in &self.kept[..self.len] {
            if n > 0 {
                hist.record(mid, n);
                sum += mid * n as f64;
            }
        }
        sum
    }
}

/// Tenant `tenant`'s serving instances pooled: summed throughput, throughput-weighted latency, fastest instance.
fn pool(tenant: &Tenant, insts: &[Inst]) -> Pool {
    let mut pool = Pool { per_ms: 0.0, lat: 0.0, fastest: 0, cap: 1 };
    let mut best = 0.0;
    for &s in &tenant.serving {
        let inst = &insts[s as usize];
        let lat = inst.lat[inst.cap as usize - 1];
        let mu = f64::from(inst.cap) / lat;
        pool.per_ms += mu;
        pool.lat += mu * lat;
        if mu > best {
            best = mu;
            pool.fastest = s;
            pool.cap = inst.cap;
        }
    }
    if pool.per_ms > 0.0 {
        pool.lat /= pool.per_ms;
    }
    pool
}

impl Executor {
    fn flow_tenant(&mut self, t: usize, from: f64, to: f64, count: f64) -> Option<GpuDelta> {
        let (insts, epoch, rules) = (&self.insts, self.serving_epoch, self.rules());
        flow_one(&mut self.tenants[t], insts, epoch, rules, from, to, count)
    }

    fn rules(&self) -> Rules {
        Rules { no_instance: self.config.no_instance, late: self.config.late }
    }
}

/// The executor settings a fluid step follows.
#[derive(Debug, Clone, Copy)]
struct Rules {
    no_instance: NoInstance,
    late: LateRequests,
}

/// One tenant's fluid step over `[from, to)` with `count` arrivals (see the module documentation); what it adds to
/// its fastest instance's GPU, if it served anything.
fn flow_one(
    tenant: &mut Tenant,
    insts: &[Inst],
    epoch: u64,
    rules: Rules,
    from: f64,
    to: f64,
    count: f64,
) -> Option<GpuDelta> {
    {
        let tick = to - from;
        let pool = match tenant.fluid.pool {
            Some((e, pool)) if e == epoch => pool,
            _ => {
                let pool = pool(tenant, insts);
                tenant.fluid.pool = Some((epoch, pool));
                pool
            }
        };
        let fl = &mut tenant.fluid;
        let m = &mut tenant.metrics;

        let arrived = count + fl.arrival_carry;
        // `arrived` is at least 0: its floor is its truncation.
        let n = floor_u64(arrived);
        fl.arrival_carry = arrived - n as f64;
        m.ledger.record_arrivals(n);
        if n > 0 {
            let spacing = tick / n as f64;
            fl.backlog.push_back(Chunk { first: from + spacing / 2.0, spacing, count: n });
            fl.queued += n;
        }
        if fl.queued == 0 {
            fl.service_carry = 0.0;
            return None;
        }

        if pool.per_ms <= 0.0 {
            fl.service_carry = 0.0;
            match rules.no_instance {
                NoInstance::Drop => {
                    m.ledger.dropped += fl.queued;
                    m.dropped_no_instance += fl.queued;
                    fl.backlog.clear();
                    fl.queued = 0;
                }
                NoInstance::Wait { .. } => {
                    m.waited += n;
                    m.max_waiting_len = m.max_waiting_len.max(fl.queued);
                    // Drop the requests that have waited their longest wait by the end of the tick.
                    let expired_before = to - tenant.max_wait_ms;
                    while let Some(front) = fl.backlog.front_mut() {
                        let gone = if front.first > expired_before {
                            0
                        } else {
                            (floor_u64((expired_before - front.first) / front.spacing) + 1).min(front.count)
                        };
                        fl.queued -= gone;
                        m.ledger.dropped += gone;
                        m.dropped_wait_expired += gone;
                        if gone < front.count {
                            front.first += gone as f64 * front.spacing;
                            front.count -= gone;
                            break;
                        }
                        fl.backlog.pop_front();
                    }
                }
            }
            return None;
        }

        let Pool { per_ms, lat, fastest: fast, cap } = pool;
        let slack = tenant.spec.slo_ms - lat;
        let load = n as f64 / (per_ms * tick);
        let share = match rules.late {
            LateRequests::Serve => within_share(load, per_ms, slack),
            LateRequests::Shed => 1.0 - shed_share(load, per_ms, slack),
        };
        let accuracy = tenant.accuracy;
        let budget = per_ms * tick + fl.service_carry;
        let shed = rules.late == LateRequests::Shed;
        let mut left = floor_u64(budget);
        let mut cursor = from; // when the server is free for the next request
        let mut within = 0.0;
        let mut served = 0u64;
        let per_request = 1.0 / per_ms;
        let mut shed_count = 0u64;
        let mut recs = Latencies::default();
        while left > 0 {
            let Some(front) = fl.backlog.front_mut() else { break };
            if shed && (cursor - slack > front.first || slack <= 0.0) {
                // Shed the requests that would be served after their deadline: arrived before cursor - slack.
                let late = if slack <= 0.0 {
                    front.count // even served at once, it would complete late
                } else {
                    ceil_u64((cursor - slack - front.first) / front.spacing).min(front.count)
                };
                shed_count += late;
                fl.queued -= late;
                if late == front.count {
                    fl.backlog.pop_front();
                    continue;
                }
                front.first += late as f64 * front.spacing;
                front.count -= late;
            }
            let Chunk { first, spacing, count } = *front;
            let take = count.min(left);
            if shed && per_request > spacing {
                // Denser than the server: the first requests are served within the slack; once the wait reaches
                // it, each request served is the oldest one still in time, and those between are shed.
                let room = (slack - (cursor - first)).max(0.0);
                let in_time = (floor_u64(room / (per_request - spacing)) + 1).min(take);
                let edge = if in_time < take {
                    // Serving at the edge: one request every 1 / c ms passes over 1 / (c x spacing) requests.
                    let passed = count - in_time;
                    let most = ceil_u64(passed as f64 * spacing / per_request).max(1);
                    let served = (left - in_time).min(most);
                    let over = if served == most {
                        passed
                    } else {
                        ((served as f64 * per_request / spacing) as u64).clamp(served, passed)
                    };
                    (served, over)
                } else {
                    (0, 0)
                };
                let (edge_served, edge_over) = edge;
                let n_served = in_time + edge_served;
                let consumed = in_time + edge_over;
                within += n_served as f64;
                let wait0 = (cursor - first).max(0.0);
                let wait_last = if edge_served > 0 {
                    slack.max(0.0)
                } else {
                    wait0 + (in_time - 1) as f64 * (per_request - spacing)
                };
                let mid = (wait0 + wait_last) / 2.0 + lat;
                recs.push(&mut m.latency, mid, n_served);
                m.latency_max_ms = m.latency_max_ms.max(wait_last.max(wait0) + lat);
                cursor = cursor.max(first) + n_served as f64 * per_request;
                shed_count += consumed - n_served;
                left -= n_served;
                served += n_served;
                fl.queued -= consumed - n_served;
                if consumed == count {
                    fl.backlog.pop_front();
                } else {
                    front.first += consumed as f64 * spacing;
                    front.count -= consumed;
                }
                continue;
            }
            // Request i of the chunk arrives at first + i x spacing and is served at
            // max(cursor + i / c, its arrival): it waits `delay(i) = cursor - first + i (1/c - spacing)` when that
            // is positive, and is within SLO when the wait is at most the slack.
            let slope = per_request - spacing;
            let room = slack - (cursor - first);
            let ok = if room >= 0.0 && slope <= 0.0 {
                take as f64
            } else if slope > 0.0 {
                if room < 0.0 { 0.0 } else { (room / slope).floor() + 1.0 }
            } else if slope == 0.0 {
                0.0 // every request waits the same, too long
            } else {
                // Waits shrink along the chunk: the first requests wait too long.
                take as f64 - (room / slope).ceil()
            };
            within += ok.clamp(0.0, take as f64);
            let delay = |i: f64| (cursor - first + i * slope).max(0.0) + lat;
            let last = delay((take - 1) as f64);
            let mid = (delay(0.0) + last) / 2.0;
            recs.push(&mut m.latency, mid, take);
            m.latency_max_ms = m.latency_max_ms.max(last.max(delay(0.0)));
            cursor = (cursor + take as f64 * per_request).max(first + (take - 1) as f64 * spacing + per_request);
            left -= take;
            served += take;
            if take == count {
                fl.backlog.pop_front();
            } else {
                front.first += take as f64 * spacing;
                front.count -= take;
            }
        }
        fl.queued -= served;
        fl.service_carry = if fl.queued > 0 { budget - floor_u64(budget) as f64 } else { 0.0 };
        m.max_queue_len = m.max_queue_len.max(fl.queued);
        m.ledger.dropped += shed_count;
        m.dropped_late += shed_count;
        if served == 0 {
            return None;
        }
        let w = within * share + fl.within_carry;
        let whole = floor_u64(w).min(served);
        fl.within_carry = (w - whole as f64).min(1.0);
        // Shedding: the requests the queueing correction makes late are shed rather than served late.
        let (completed, late) = if shed { (whole, served - whole) } else { (served, 0) };
        m.dropped_late += late;
        // The shed ones are the longest waits: they leave the latency record.
        recs.drop_slowest(late);
        m.latency_sum_ms += recs.flush(&mut m.latency);
        let mut chunk = GoodputLedger {
            completed,
            dropped: late,
            within_slo: whole,
            goodput: accuracy * whole as f64,
            accuracy_sum: accuracy * completed as f64,
            ..GoodputLedger::default()
        };
        m.ledger += chunk;
        let batches = served.div_ceil(u64::from(cap));
        m.batches += batches;
        chunk.requests = served;
        if tenant.co_insts > 0 {
            fl.pool_busy_ms += served as f64 / per_ms;
        }
        Some(GpuDelta { gpu: insts[fast as usize].gpu, chunk, batches, busy_ms: served as f64 / per_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cast_roundings_agree_with_floor_and_ceil() {
        let mut xs = vec![0.0, -0.0, 0.5, 1.0, 1.5, 2.0 - 1e-15, 2.0, 1e9 + 0.25, 4.35e3, -0.5, -1.0, -7.25, f64::NAN];
        xs.extend([1e20, f64::INFINITY, f64::NEG_INFINITY, 2f64.powi(64), 2f64.powi(53) + 2.0]);
        xs.extend((0..2_000).map(|i| f64::from(i) * 0.137 - 3.0));
        xs.extend((1..60).map(|k| 2f64.powi(k) + 0.5));
        for x in xs {
            assert_eq!(floor_u64(x), x.floor() as u64, "floor of {x}");
            assert_eq!(ceil_u64(x), x.ceil() as u64, "ceil of {x}");
        }
    }

    #[test]
    fn the_within_share_falls_with_load_and_rises_with_slack() {
        let at = |r| within_share(r, 1.0, 20.0);
        assert_eq!(at(0.0), 1.0);
        assert!(at(0.5) > 0.999_99, "{}", at(0.5));
        assert!(at(0.8) > at(0.9) && at(0.9) > at(0.95));
        assert!(at(0.9) > 0.9 && at(0.9) < 0.99, "{}", at(0.9));
        // Capped: at capacity and above, the backlog decides.
        assert!(at(1.5) > 0.1 && at(1.5) == at(1.0));
        assert!(within_share(0.9, 1.0, 40.0) > at(0.9));
        assert_eq!(within_share(0.5, 1.0, 0.0), 0.0);
    }
}
