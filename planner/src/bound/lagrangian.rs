//! The retraining-aware bound: a Lagrangian relaxation of the fleet's compute slices, whose every value is a bound.
//!
//! The LP bound credits every request with the best accuracy the fleet could ever retrain to, for free. This one
//! charges retraining the slices it takes. The fleet's compute-slice constraint (per GPU model and slot) is moved into
//! the objective with a price `λ ≥ 0` per slice and slot; what is left separates by tenant, and each tenant's part is
//! solved exactly, on grids rounded in its favour. By weak duality, for **any** prices,
//! `Σ λ × slices + Σ_tenants (best value of the tenant at these prices)` bounds the goodput of every feasible
//! schedule; subgradient steps only look for prices that make it small.
//!
//! A tenant's part, at prices `λ`, relaxes further (each relaxation only raises its value):
//! - Its instances are fractional, up to the fleet's slices of each GPU model for inference and, separately, for
//!   retraining; memory is not limited.
//! - In a slot, inference serves at most the requests that can complete there (arrivals plus the previous slot's
//!   tail), from the GPU models cheapest per request first, at `accuracy - price per request` each.
//! - Per retraining window (its windows must be whole slots; a tenant whose are not keeps the LP's accuracy), it
//!   either retrains or not. A retraining of `e` epochs counts its new accuracy `acc(e)` over the **whole** window
//!   (it can only complete later), if above the accuracy the window started with, and pays the cheapest slices of
//!   the window that do its work. Epochs are taken on a grid: `e` in `(e_{j-1}, e_j]` is credited `acc(e_j)` and
//!   charged the work of `e_{j-1}`. A window without retraining drifts the accuracy as the simulator does.
//! - Accuracy states are rounded up to a grid of [`STEP`]: values and the drift are monotone in the accuracy, so
//!   rounding up only adds value.

use tessera_core::GpuModel;
use tessera_core::model::ModelProfile;
use tessera_core::tenant::{RetrainingSpec, TenantSpec};

use super::{Demand, ServeOption, train_per_slice};

/// Accuracy grid of the dynamic programme.
pub const STEP: f64 = 0.0025;
/// Epoch grid points per tenant.
const EPOCH_POINTS: usize = 32;
/// Subgradient iterations, at most.
const ITERATIONS: usize = 300;
/// Elementary steps (tenant-slots and dynamic-programme cells) all iterations together may take: fleet- and
/// day-sized runs get fewer iterations, and none below [`MIN_ITERATIONS`] (the LP bound then stands alone).
const WORK_BUDGET: f64 = 3e9;
/// Fewer iterations than this are not worth running.
const MIN_ITERATIONS: usize = 5;

/// One tenant's data.
struct Tenant {
    /// Requests that can complete within SLO per slot.
    demand: Vec<f64>,
    /// `per_slice[s][m]`: requests one compute slice of GPU model `m` completes within SLO in slot `s`, at best.
    per_slice: Vec<Vec<f64>>,
    /// Retraining work (7g GPU-seconds) one slice does per second, per GPU model (0: cannot retrain there).
    train: Vec<f64>,
    plan: Accuracy,
}

/// How a tenant's accuracy is treated.
enum Accuracy {
    /// Fixed (no retraining, or windows that are not whole slots: the LP's best accuracy).
    Fixed(f64),
    /// Retraining windows of `slots` slots, epochs on a grid.
    Windows { slots: usize, spec: RetrainingSpec, epochs: Vec<f64> },
}

/// What a tenant earns and uses at given prices.
struct Usage {
    value: f64,
    /// Slices per slot and GPU model.
    slices: Vec<Vec<f64>>,
}

/// What the bound needs to know about the fleet and the run.
pub struct Fleet<'a> {
    /// GPU models.
    pub models: &'a [GpuModel],
    /// GPUs of each model.
    pub counts: &'a [f64],
    /// Slot lengths, seconds (the last one with the overrun).
    pub dt: &'a [f64],
}

/// The bound (`None` without slots, or where a run is too large for enough iterations within [`WORK_BUDGET`]).
pub fn bound(
    tenants: &[TenantSpec],
    profiles: &[&ModelProfile],
    fleet: &Fleet<'_>,
    demand: &Demand,
    serving: &[Vec<ServeOption>],
    best_accuracy: &[f64],
) -> Option<f64> {
    let slots = fleet.dt.len();
    if slots == 0 {
        return None;
    }
    let at = |v: &Vec<f64>, s: usize| v.get(s).copied().unwrap_or(0.0).max(0.0);
    let data: Vec<Tenant> = tenants
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let demand_i: Vec<f64> = (0..slots)
                .map(|s| at(&demand.arrivals[i], s) + if s > 0 { at(&demand.tail[i], s - 1) } else { 0.0 })
                .collect();
            let per_slice = (0..slots)
                .map(|s| {
                    (0..fleet.models.len())
                        .map(|m| {
                            serving[i]
                                .iter()
                                .filter(|o| o.model == m)
                                .map(|o| (o.rps * fleet.dt[s] + o.batch) / o.compute)
                                .fold(0.0, f64::max)
                        })
                        .collect()
                })
                .collect();
            let train: Vec<f64> = fleet.models.iter().map(|g| train_per_slice(profiles[i], *g)).collect();
            let plan = match &t.retraining {
                Some(r) if r.work_gpu_s > 0.0 && r.epochs > 0.0 => {
                    let ratio = r.window_ms as f64 / demand.slot_ms;
                    if (ratio - ratio.round()).abs() > 1e-9 || ratio.round() < 1.0 {
                        Accuracy::Fixed(best_accuracy[i])
                    } else {
                        let window_s = r.window_ms as f64 / 1000.0;
                        let most: f64 = train.iter().zip(fleet.counts).map(|(w, n)| w * 7.0 * n * window_s).sum();
                        let e_hi = (most / r.work_for_epochs(1.0)).max(1e-6);
                        let e_lo = (e_hi / 400.0).min(r.epochs / 4.0).max(1e-6).min(e_hi);
                        let epochs = (0..EPOCH_POINTS)
                            .map(|j| e_lo * (e_hi / e_lo).powf(j as f64 / (EPOCH_POINTS - 1) as f64))
                            .collect();
                        Accuracy::Windows { slots: ratio.round() as usize, spec: r.clone(), epochs }
                    }
                }
                _ => Accuracy::Fixed(best_accuracy[i]),
            };
            Tenant { demand: demand_i, per_slice, train, plan }
        })
        .collect();
    let supply: Vec<f64> = fleet.counts.iter().map(|n| 7.0 * n).collect();
    let models = supply.len();
    let states = (grid(1.0) + 1) as f64;
    let per_iteration: f64 = data
        .iter()
        .map(|t| {
            let dp = match &t.plan {
                Accuracy::Windows { slots: per, epochs, .. } => {
                    slots.div_ceil(*per) as f64 * states * epochs.len() as f64
                }
                Accuracy::Fixed(_) => 0.0,
            };
            (slots * models) as f64 + dp
        })
        .sum();
    let iterations = ((WORK_BUDGET / per_iteration.max(1.0)) as usize).min(ITERATIONS);
    if iterations < MIN_ITERATIONS {
        return None;
    }
    let mut price = initial_prices(&data, &supply, slots, best_accuracy);
    let mut best = f64::INFINITY;
    let mut theta = 1.0;
    let mut since = 0;
    for _ in 0..iterations {
        let mut value: f64 = price.iter().map(|row| row.iter().zip(&supply).map(|(p, n)| p * n).sum::<f64>()).sum();
        let mut used = vec![vec![0.0; models]; slots];
        for t in &data {
            let u = tenant_value(t, &price, fleet.dt, &supply);
            value += u.value;
            for (row, add) in used.iter_mut().zip(&u.slices) {
                for (x, a) in row.iter_mut().zip(add) {
                    *x += a;
                }
            }
        }
        if !best.is_finite() || value < best - 1e-9 * best.abs().max(1.0) {
            best = value;
            since = 0;
        } else {
            since += 1;
            if since >= 10 {
                theta /= 2.0;
                since = 0;
            }
        }
        // A subgradient of the dual is supply minus use; a Polyak step towards 97 % of the best value so far.
        let norm: f64 = used.iter().flat_map(|row| row.iter().zip(&supply).map(|(u, n)| (n - u).powi(2))).sum();
        if norm < 1e-12 || theta < 1e-4 {
            break;
        }
        let step = theta * (value - 0.97 * best).max(0.01 * best.abs()) / norm;
        for (row, use_row) in price.iter_mut().zip(&used) {
            for ((p, u), n) in row.iter_mut().zip(use_row).zip(&supply) {
                *p = (*p - step * (n - u)).max(0.0);
            }
        }
    }
    best.is_finite().then_some(best)
}

/// Prices at which each slot's inference demand alone would just fill each GPU model, every tenant at its best
/// accuracy: a start for the subgradient steps (any start is valid).
fn initial_prices(data: &[Tenant], supply: &[f64], slots: usize, accuracy: &[f64]) -> Vec<Vec<f64>> {
    (0..slots)
        .map(|s| {
            (0..supply.len())
                .map(|m| {
                    // (value per slice, slices wanted), richest first, until the supply is used.
                    let mut bids: Vec<(f64, f64)> = data
                        .iter()
                        .zip(accuracy)
                        .filter_map(|(t, a)| {
                            let q = t.per_slice[s][m];
                            (q > 0.0 && t.demand[s] > 0.0).then(|| (a * q, t.demand[s] / q))
                        })
                        .collect();
                    bids.sort_by(|a, b| b.0.total_cmp(&a.0));
                    let mut left = supply[m];
                    for (v, want) in bids {
                        if want >= left {
                            return v;
                        }
                        left -= want;
                    }
                    0.0
                })
                .collect()
        })
        .collect()
}

/// Inference in slot `s` at the slot's prices: per GPU model, cheapest per request first, the price of a request
/// served there and how many it can serve. At accuracy `a`, the tenant serves on every model whose price is below
/// `a`, earning `a - price` a request.
fn offers(t: &Tenant, price: &[f64], s: usize, supply: &[f64]) -> Vec<(f64, f64, usize)> {
    let mut order: Vec<(f64, usize)> =
        (0..supply.len()).filter(|&m| t.per_slice[s][m] > 0.0).map(|m| (price[m] / t.per_slice[s][m], m)).collect();
    order.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut left = t.demand[s];
    let mut out = Vec::with_capacity(order.len());
    for (cost, m) in order {
        if left <= 0.0 {
            break;
        }
        let u = left.min(supply[m] * t.per_slice[s][m]);
        out.push((cost, u, m));
        left -= u;
    }
    out
}

/// Value of `offers` at accuracy `a`, adding the slices used per GPU model to `slices` when given.
fn serve(t: &Tenant, s: usize, offers: &[(f64, f64, usize)], a: f64, slices: Option<&mut Vec<f64>>) -> f64 {
    let mut value = 0.0;
    let mut out = slices;
    for &(cost, u, m) in offers.iter().take_while(|o| o.0 < a) {
        value += (a - cost) * u;
        if let Some(o) = out.as_deref_mut() {
            o[m] += u / t.per_slice[s][m];
        }
    }
    value
}

/// Values at every grid state of serving all of `offers` (pairs of price and requests): `Σ (a - price)⁺ × requests`.
fn values_on_grid(mut offers: Vec<(f64, f64)>, states: usize) -> Vec<f64> {
    offers.sort_by(|x, y| x.0.total_cmp(&y.0));
    let (mut i, mut sum_u, mut sum_cu) = (0, 0.0, 0.0);
    (0..states)
        .map(|n| {
            let a = n as f64 * STEP;
            while i < offers.len() && offers[i].0 < a {
                sum_u += offers[i].1;
                sum_cu += offers[i].0 * offers[i].1;
                i += 1;
            }
            a * sum_u - sum_cu
        })
        .collect()
}

/// Offers of retraining work in slots `range`, cheapest first: (price per unit of work, units, slot, model).
fn work_offers(
    t: &Tenant,
    price: &[Vec<f64>],
    dt: &[f64],
    supply: &[f64],
    range: std::ops::Range<usize>,
) -> Vec<(f64, f64, usize, usize)> {
    let mut offers = Vec::new();
    for s in range {
        for (m, w) in t.train.iter().enumerate() {
            if *w > 0.0 {
                let per_slice = w * dt[s];
                offers.push((price[s][m] / per_slice, supply[m] * per_slice, s, m));
            }
        }
    }
    offers.sort_by(|a, b| a.0.total_cmp(&b.0));
    offers
}

/// The cheapest cost of `work` from `offers` (infinite when they cannot do it), adding the slices it takes to
/// `slices` when given.
fn retrain_cost(
    t: &Tenant,
    dt: &[f64],
    offers: &[(f64, f64, usize, usize)],
    work: f64,
    mut slices: Option<&mut [Vec<f64>]>,
) -> f64 {
    let (mut left, mut cost) = (work, 0.0);
    for &(p, cap, s, m) in offers {
        if left <= 0.0 {
            break;
        }
        let u = left.min(cap);
        cost += p * u;
        if let Some(out) = slices.as_deref_mut() {
            out[s][m] += u / (t.train[m] * dt[s]);
        }
        left -= u;
    }
    if left > 1e-9 * work.max(1.0) { f64::INFINITY } else { cost }
}

/// The grid state at or above accuracy `a`.
fn grid(a: f64) -> usize {
    ((a / STEP) - 1e-9).ceil().clamp(0.0, (1.0 / STEP).round()) as usize
}

/// The state after a window without retraining.
fn drift(spec: &RetrainingSpec, n: usize) -> usize {
    grid(spec.drift.after(n as f64 * STEP, 1))
}

/// A tenant's best value at `price`, and the slices it uses.
fn tenant_value(t: &Tenant, price: &[Vec<f64>], dt: &[f64], supply: &[f64]) -> Usage {
    let slots = dt.len();
    let mut slices = vec![vec![0.0; supply.len()]; slots];
    let slot_offers: Vec<Vec<(f64, f64, usize)>> = (0..slots).map(|s| offers(t, &price[s], s, supply)).collect();
    let Accuracy::Windows { slots: per, spec, epochs } = &t.plan else {
        let Accuracy::Fixed(a) = t.plan else { unreachable!("two variants") };
        let value = (0..slots).map(|s| serve(t, s, &slot_offers[s], a, Some(&mut slices[s]))).sum();
        return Usage { value, slices };
    };
    let states = grid(1.0) + 1;
    let windows = slots.div_ceil(*per);
    let range = |k: usize| k * per..((k + 1) * per).min(slots);
    // Window values at every accuracy state.
    let v: Vec<Vec<f64>> = (0..windows)
        .map(|k| {
            let pairs = range(k).flat_map(|s| slot_offers[s].iter().map(|o| (o.0, o.1))).collect();
            values_on_grid(pairs, states)
        })
        .collect();
    // Per epoch grid point: the state it reaches, and the work it is charged.
    let acc: Vec<usize> = epochs.iter().map(|e| grid(spec.accuracy_after(*e))).collect();
    let charged: Vec<f64> =
        (0..epochs.len()).map(|j| if j == 0 { 0.0 } else { spec.work_for_epochs(epochs[j - 1]) }).collect();
    let window_offers: Vec<Vec<(f64, f64, usize, usize)>> =
        (0..windows).map(|k| work_offers(t, price, dt, supply, range(k))).collect();
    let cost: Vec<Vec<f64>> =
        window_offers.iter().map(|o| charged.iter().map(|w| retrain_cost(t, dt, o, *w, None)).collect()).collect();
    // Backwards: best[k][n] is the value from window k on, starting it at state n.
    let mut best = vec![vec![0.0; states]; windows + 1];
    let mut choice = vec![vec![None; states]; windows];
    for k in (0..windows).rev() {
        for n in 0..states {
            let mut b = v[k][n] + best[k + 1][drift(spec, n)];
            let mut c = None;
            for (j, &f) in acc.iter().enumerate() {
                let here = v[k][n.max(f)] - cost[k][j] + best[k + 1][f];
                if here > b {
                    b = here;
                    c = Some(j);
                }
            }
            best[k][n] = b;
            choice[k][n] = c;
        }
    }
    // Forwards: the slices of the best path.
    let mut n = grid(spec.initial_accuracy);
    let value = best[0][n];
    for (k, row) in choice.iter().enumerate() {
        let (serve_at, next) = match row[n] {
            None => (n, drift(spec, n)),
            Some(j) => {
                retrain_cost(t, dt, &window_offers[k], charged[j], Some(&mut slices));
                (n.max(acc[j]), acc[j])
            }
        };
        for s in range(k) {
            serve(t, s, &slot_offers[s], serve_at as f64 * STEP, Some(&mut slices[s]));
        }
        n = next;
    }
    Usage { value, slices }
}
