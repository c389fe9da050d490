//! What a run shows: the terminal table, and in `--out DIR` `summary.json`, `timeseries.csv` and `report.html`
//! (plots as inline SVG, viewable offline), drawn by [`figures`] (which studies draw with too); and the `replay`
//! command that prints and writes them ([`run`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

use serde::Serialize;
use serde_json::{Value, json};

use crate::run::RunArgs;
use crate::run::compare::{Comparison, compare};
use crate::run::driver::{LAYOUT_GPUS, PolicyRun, SliceRun, WindowRow};
use crate::run::{ReplayError, Scenario};
use figures::{Cdf, Pen, Series, TimeAxis, axis_number};

pub mod figures;

/// Where a policy's goodput goes, in goodput units: what separates it from the **ceiling**, every request that
/// arrived served within its SLO at its tenant's best reachable accuracy (the accuracy the bound credits,
/// [`tessera_planner::bound::UpperBound::accuracy`]). `goodput + not_within_slo + below_best_accuracy = ceiling = bound + unreachable`, so
/// the distance to the bound is `not_within_slo + below_best_accuracy - unreachable`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct GoodputSplit {
    /// Requests that arrived but were not served within their SLO (dropped, late or still queued at the end),
    /// each at its tenant's best accuracy.
    pub not_within_slo: f64,
    /// Of those, the requests dropped.
    pub dropped: f64,
    /// Requests served within SLO by a model below its tenant's best accuracy: the accuracy they missed.
    pub below_best_accuracy: f64,
    /// The ceiling over the bound: what no policy can earn (requests no schedule serves within SLO, accuracy no
    /// retraining reaches in time). The same for every policy of a run.
    pub unreachable: f64,
    /// The ceiling.
    pub ceiling: f64,
}

impl GoodputSplit {
    /// The split as shares of the bound `bound`: (not within SLO, below best accuracy, unreachable).
    pub fn over(&self, bound: f64) -> (f64, f64, f64) {
        (self.not_within_slo / bound, self.below_best_accuracy / bound, self.unreachable / bound)
    }
}

/// Version of `summary.json`'s layout: 2 added `schema_version`, `tool`, `reproduce` and `scenario.gpu_models`; 3
/// added each policy's `latency_ms` percentiles and `tenants` breakdown; 4 made `scenario.tlb` the TLB's name (`off`,
/// `baseline` or `star`) instead of a boolean; 5 added `scenario.tlb_aware` (whether replay gave the planners the
/// TLB model's interference table; always false in cluster mode, where the coordinator plans with its own
/// `interference` table) and `reproduce.tlb_blind`; 6 added `scenario.sharing` and `reproduce.sharing`; 7 added
/// each policy's `goodput_split` ([`GoodputSplit`]; null without a bound) and made `goodput_over_bound` and
/// `slo_attainment` null where there is no ratio.
pub const SUMMARY_SCHEMA_VERSION: u32 = 7;

impl Comparison {
    /// `goodput / upper bound` for `run`: `None` without a bound, or when the bound is 0 (nothing could be served,
    /// so there is no ratio: it used to read 1.0000).
    pub fn over_bound(&self, run: &PolicyRun) -> Option<f64> {
        self.upper_bound.as_ref().filter(|b| b.goodput > 0.0).map(|b| run.total.goodput / b.goodput)
    }

    /// Where `run`'s goodput goes ([`GoodputSplit`]): `None` without a bound (or a bound of 0).
    pub fn split(&self, run: &PolicyRun) -> Option<GoodputSplit> {
        let bound = self.upper_bound.as_ref().filter(|b| b.goodput > 0.0)?;
        let best: BTreeMap<&str, f64> =
            self.tenant_ids.iter().map(String::as_str).zip(bound.accuracy.iter().copied()).collect();
        let mut out = GoodputSplit {
            not_within_slo: 0.0,
            dropped: 0.0,
            below_best_accuracy: 0.0,
            unreachable: 0.0,
            ceiling: 0.0,
        };
        for t in &run.tenants {
            let a = *best.get(t.tenant.as_str())?;
            let l = &t.ledger;
            out.ceiling += l.requests as f64 * a;
            out.not_within_slo += l.requests.saturating_sub(l.within_slo) as f64 * a;
            out.dropped += l.dropped as f64 * a;
            // Never below zero: a request's accuracy never exceeds its tenant's best (rounding aside).
            out.below_best_accuracy += (l.within_slo as f64 * a - l.goodput).max(0.0);
        }
        out.unreachable = out.ceiling - bound.goodput;
        Some(out)
    }

    /// The terminal table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<16} {:>14} {:>9} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7}",
            "policy",
            "goodput",
            "/bound",
            "slo_att",
            "mean_acc",
            "retrains",
            "reconfig",
            "gpu_h",
            "requests",
            "plan_ms",
            "wall_s"
        );
        for r in &self.runs {
            let _ = writeln!(
                s,
                "{:<16} {:>14.1} {:>9} {:>8} {:>8.4} {:>8} {:>8} {:>8.2} {:>9} {:>8.1} {:>7.2}",
                r.policy,
                r.total.goodput,
                self.over_bound(r).map_or("-".to_string(), |v| format!("{v:.4}")),
                share(r.total.attainment(), "-"),
                r.total.mean_accuracy(),
                r.retrainings_completed,
                r.reconfigurations,
                r.gpu_hours,
                r.total.requests,
                r.plan_ms_median,
                r.wall_s,
            );
        }
        if let Some(b) = &self.upper_bound {
            let _ = writeln!(
                s,
                "{:<16} {:>14.1} {:>9}  (no policy can exceed it: docs/evaluation.md)",
                "upper-bound", b.goodput, "1.0000"
            );
            let splits: Vec<_> = self.runs.iter().filter_map(|r| Some((r, self.split(r)?))).collect();
            if !splits.is_empty() {
                let _ = writeln!(
                    s,
                    "\nwhere the goodput goes, as shares of the bound (goodput + not within SLO + below best accuracy \
                     = 1 + unreachable):"
                );
                let _ = writeln!(
                    s,
                    "{:<16} {:>9} {:>14} {:>9} {:>14} {:>12}",
                    "policy", "goodput", "not_within_slo", "dropped", "below_best_acc", "unreachable"
                );
                for (r, sp) in splits {
                    let (slo, acc, unreachable) = sp.over(b.goodput);
                    let _ = writeln!(
                        s,
                        "{:<16} {:>9.4} {:>14.4} {:>9.4} {:>14.4} {:>12.4}",
                        r.policy,
                        r.total.goodput / b.goodput,
                        slo,
                        sp.dropped / b.goodput,
                        acc,
                        unreachable
                    );
                }
            }
        }
        s
    }

    /// `summary.json`.
    pub fn summary(&self, scenario: &Scenario) -> Value {
        let mut policies = serde_json::Map::new();
        for r in &self.runs {
            policies.insert(
                r.policy.clone(),
                json!({
                    "goodput": r.total.goodput,
                    "goodput_over_bound": self.over_bound(r),
                    "slo_attainment": r.total.attainment(),
                    "mean_accuracy": r.total.mean_accuracy(),
                    "reconfigurations": r.reconfigurations,
                    "requests": r.total.requests,
                    "requests_within_slo": r.total.within_slo,
                    "completed": r.total.completed,
                    "dropped": r.total.dropped,
                    "retrainings_completed": r.retrainings_completed,
                    "drift_windows": r.drift_windows,
                    "gpu_hours": r.gpu_hours,
                    "infeasible_rounds": r.infeasible_rounds,
                    "burst_replans": r.burst_replans,
                    "plan_ms_median": r.plan_ms_median,
                    "wall_s": r.wall_s,
                    "latency_ms": r.latency_ms,
                    "goodput_split": self.split(r),
                    "tenants": r.tenants.iter().map(|t| (t.tenant.clone(), json!({
                        "requests": t.ledger.requests,
                        "requests_within_slo": t.ledger.within_slo,
                        "completed": t.ledger.completed,
                        "dropped": t.ledger.dropped,
                        "goodput": t.ledger.goodput,
                        "slo_attainment": t.ledger.attainment(),
                        "mean_accuracy": t.ledger.mean_accuracy(),
                        "retrainings_completed": t.retrainings_completed,
                        "latency_ms": t.latency_ms,
                    }))).collect::<serde_json::Map<_, _>>(),
                }),
            );
        }
        let mut gpu_models: BTreeMap<String, usize> = BTreeMap::new();
        for m in scenario.gpus.values() {
            *gpu_models.entry(m.to_string()).or_insert(0) += 1;
        }
        json!({
            "schema_version": SUMMARY_SCHEMA_VERSION,
            "tool": {"name": "tessera-replay", "version": env!("CARGO_PKG_VERSION")},
            "reproduce": self.reproduce,
            "trace": self.trace,
            "seed": self.seed,
            "upper_bound": self.upper_bound.as_ref().map(|b| json!({
                "goodput": b.goodput,
                "method": b.method,
                "lp": b.lp,
                "lagrangian": b.lagrangian,
                "within_slo_at_optimum": b.within_slo,
                "accuracy": b.accuracy,
            })),
            "scenario": {
                "gpus": scenario.gpus.len(),
                "gpu_models": gpu_models,
                "tenants": scenario.tenants.len(),
                "target_utilization": scenario.planner.target_utilization,
                "duration_s": scenario.duration_ms / 1000.0,
                "window_s": scenario.plan_every_s,
                "slot_s": scenario.planner.slot_s,
                "horizon_slots": scenario.planner.horizon_slots,
                "gap": scenario.planner.solver.mip_rel_gap,
                "forecaster": scenario.forecaster.to_string(),
                "tlb": scenario.tlb.name(),
                "tlb_aware": scenario.interference.is_some(),
                "sharing": scenario.planner.sharing,
                "executor": if scenario.fluid_tick_ms.is_some() { "fluid" } else { "discrete" },
                "fluid_tick_ms": scenario.fluid_tick_ms,
                "late_requests": scenario.executor.late,
                "replan_on_burst": scenario.replan_on_burst,
            },
            "policies": policies,
        })
    }

    /// `timeseries.csv`: one row per policy and window.
    pub fn timeseries(&self) -> String {
        let mut s = String::from(
            "policy,start_s,requests,completed,within_slo,dropped,goodput,slo_attainment,mean_accuracy,reconfigurations,reconfigured_gpus,active_gpus,plan_ms",
        );
        for g in 0..LAYOUT_GPUS {
            let _ = write!(s, ",layout_gpu{g}");
        }
        s.push('\n');
        for r in &self.runs {
            for w in &r.windows {
                // A window without requests has no attainment: the field is left empty.
                let att = if w.requests == 0 {
                    String::new()
                } else {
                    format!("{:.6}", w.within_slo as f64 / w.requests as f64)
                };
                let _ = write!(
                    s,
                    "{},{},{},{},{},{},{:.3},{},{:.6},{},{},{},{:.2}",
                    r.policy,
                    w.start_s,
                    w.requests,
                    w.completed,
                    w.within_slo,
                    w.dropped,
                    w.goodput,
                    att,
                    w.mean_accuracy,
                    w.reconfigurations,
                    w.reconfigured_gpus,
                    w.active_gpus,
                    w.plan_ms
                );
                for g in 0..LAYOUT_GPUS {
                    let _ = write!(s, ",{}", w.layouts.get(g).map_or("", String::as_str));
                }
                s.push('\n');
            }
        }
        s
    }

    /// `report.html`: one page a paper or a talk can take from, viewable offline (figures are inline SVG).
    ///
    /// The results table (latency percentiles included), goodput over the upper bound, the latency CDF, the
    /// per-window series, a slice map of the first GPUs' layouts over time per policy, the per-tenant breakdown and
    /// what reruns the scenario. The first policy run is the policy of interest: highlighted everywhere.
    pub fn html(&self, scenario: &Scenario) -> Result<String, ReplayError> {
        self.page(scenario).map(|(html, _)| html)
    }

    /// The report page and its figures, each as `(file name, SVG)` (`--out DIR` writes them to `DIR/figures/`).
    fn page(&self, scenario: &Scenario) -> Result<(String, Vec<(String, String)>), ReplayError> {
        let focus = self.runs.first().map_or("", |r| r.policy.as_str());
        let mut h = String::new();
        let mut models: BTreeMap<String, usize> = BTreeMap::new();
        for m in scenario.gpus.values() {
            *models.entry(m.to_string()).or_insert(0) += 1;
        }
        let models = models.iter().map(|(m, n)| format!("{n} × {m}")).collect::<Vec<_>>().join(", ");
        let _ = write!(
            h,
            "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
             <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>Tessera replay: {t}</title>\
             <style>{STYLE}</style></head><body><h1>Tessera replay: {t}</h1>\
             <p class=\"lede\">{g} GPUs ({models}), {n} tenants, {d} of workload time, planning every {w} s (slots of \
             {s} s, horizon {hz} slots), {exec} executor, seed {seed}. Policy of interest: <b>{f}</b> (highlighted; \
             the first of <code>--policy</code>).</p>",
            t = escape(&self.trace),
            g = scenario.gpus.len(),
            n = scenario.tenants.len(),
            d = duration_words(scenario.duration_ms / 1000.0),
            w = scenario.plan_every_s,
            s = scenario.planner.slot_s,
            hz = scenario.planner.horizon_slots,
            exec = if scenario.fluid_tick_ms.is_some() { "fluid" } else { "discrete-request" },
            seed = self.seed,
            f = escape(focus),
        );
        h.push_str(&self.results_table());

        let mut files: Vec<(String, String)> = Vec::new();
        let mut figure = |h: &mut String, file: String, svg: String, caption: &str| -> () {
            let _ = write!(
                h,
                "<figure>{svg}<figcaption><b>Figure {}.</b> {caption} <a href=\"figures/{file}\">SVG</a></figcaption>\
                 </figure>",
                files.len() + 1
            );
            files.push((file, svg));
        };
        let pens: Vec<Pen> = (0..self.runs.len()).map(Pen::of).collect();

        if let Some(b) = &self.upper_bound {
            h.push_str("<h2>Goodput over the upper bound</h2>");
            let rows: Vec<(&str, f64, Option<f64>, Pen)> = self
                .runs
                .iter()
                .zip(&pens)
                .map(|(r, &p)| (r.policy.as_str(), self.over_bound(r).unwrap_or(0.0), None, p))
                .collect();
            let svg = figures::bars(
                "goodput over bound",
                "goodput / upper bound",
                0.0..1.0,
                &rows,
                (1000, 90 + 46 * rows.len() as u32),
            )?;
            figure(
                &mut h,
                "goodput_over_bound.svg".into(),
                svg,
                &format!(
                    "Goodput of each policy over the upper bound ({} goodput units: the smaller of an LP and a \
                     Lagrangian relaxation computed from the trace, which no policy can exceed; docs/evaluation.md). \
                     One seed: for 95 % intervals over seeds, run a study (<code>replay study</code>).",
                    axis_number(b.goodput),
                ),
            );
        }

        if let Some(b) = self.upper_bound.as_ref().filter(|b| b.goodput > 0.0) {
            let rows: Vec<(&str, [f64; 3])> = self
                .runs
                .iter()
                .filter_map(|r| {
                    let sp = self.split(r)?;
                    let (slo, acc, _) = sp.over(b.goodput);
                    Some((r.policy.as_str(), [r.total.goodput / b.goodput, slo, acc]))
                })
                .collect();
            if let Some(sp) = self.runs.first().and_then(|r| self.split(r)) {
                h.push_str("<h2>Where the goodput goes</h2>");
                let svg = figures::split_bars("goodput split", &rows, (1000, 130 + 46 * rows.len() as u32))?;
                figure(
                    &mut h,
                    "goodput_split.svg".into(),
                    svg,
                    &format!(
                        "What separates each policy from the ceiling, every request served within its SLO at its \
                         tenant's best reachable accuracy (the accuracy the bound credits), as shares of the bound \
                         (dashed): its goodput, the requests not served within SLO (dropped, late or queued at the \
                         end, each at its best accuracy) and the accuracy below the best of those served in time. The \
                         bars end at the ceiling, {} times the bound for every policy: the part beyond the bound is \
                         what no policy can earn.",
                        axis_number(sp.ceiling / b.goodput),
                    ),
                );
            }
        }

        h.push_str("<h2>Latency</h2>");
        let slo_of: BTreeMap<String, f64> = scenario.tenants.iter().map(|t| (t.id.to_string(), t.slo_ms)).collect();
        let cdfs: Vec<Cdf> = self
            .runs
            .iter()
            .zip(&pens)
            .map(|(r, &pen)| Cdf {
                name: &r.policy,
                steps: over_slo_steps(r, &slo_of),
                requests: r.total.requests,
                pen,
            })
            .collect();
        let (lo, hi) = scenario
            .tenants
            .iter()
            .map(|t| t.slo_ms)
            .fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let slos = if lo == hi {
            format!("{} ms", slo_words(lo))
        } else {
            format!("{} to {} ms", slo_words(lo), slo_words(hi))
        };
        figure(
            &mut h,
            "latency_cdf.svg".into(),
            figures::latency_cdf(
                "latency CDF",
                "latency of a request / its tenant's SLO (log scale)",
                &cdfs,
                &[(1.0, "SLO".to_string())],
                (1000, 460),
            )?,
            &format!(
                "Share of all arrived requests served within a multiple of their tenant's SLO ({slos}), per policy: \
                 the height at the SLO line is the SLO attainment. A curve ends below 1 by the share of requests \
                 dropped or still queued at the end. Latencies are the simulator's histogram buckets (about 12 % \
                 wide); the table above has each policy's percentiles in ms."
            ),
        );

        h.push_str("<h2>Over time</h2>");
        let named: Vec<(&str, Pen)> = self.runs.iter().zip(&pens).map(|(r, &p)| (r.policy.as_str(), p)).collect();
        h.push_str(&figures::html_legend(&named));
        let time = TimeAxis { end_s: scenario.duration_ms / 1000.0 };
        let window = scenario.plan_every_s;
        let mid = |w: &WindowRow| w.start_s + 0.5 * window.min((time.end_s - w.start_s).max(0.0));
        type Metric = fn(&WindowRow) -> f64;
        // Figure name, y axis, value, y floor and ceiling, caption.
        type Panel = (&'static str, &'static str, Metric, Option<f64>, Option<f64>, &'static str);
        let plots: [Panel; 4] = [
            (
                "goodput per window",
                "goodput per window",
                |w| w.goodput,
                Some(0.0),
                None,
                "Goodput (accuracy × requests served within SLO) per planning window.",
            ),
            (
                "slo attainment per window",
                "requests within SLO / requests",
                // A window without requests has no attainment: no point (NaN points are left out).
                |w| if w.requests == 0 { f64::NAN } else { w.within_slo as f64 / w.requests as f64 },
                Some(0.0),
                Some(1.0),
                "SLO attainment per planning window: requests served within SLO over requests that arrived.",
            ),
            (
                "accuracy per window",
                "mean accuracy served",
                |w| w.mean_accuracy,
                Some(0.0),
                Some(1.0),
                "Mean accuracy of the model that served each request, per planning window.",
            ),
            (
                "gpus reconfigured per window",
                "GPUs reconfigured",
                |w| f64::from(w.reconfigured_gpus),
                Some(0.0),
                None,
                "GPUs whose layout or work changed at least once in each planning window, each change counted in \
                 the window in which the GPU applied it (at most the fleet's size; the table's reconfig. column \
                 counts every change, a GPU changed twice counting twice).",
            ),
        ];
        for (name, y_desc, metric, floor, ceil, caption) in plots {
            let series: Vec<Series> = self
                .runs
                .iter()
                .zip(&pens)
                .map(|(r, &pen)| Series {
                    points: r.windows.iter().map(|w| (mid(w), metric(w))).filter(|p| p.1.is_finite()).collect(),
                    pen,
                })
                .collect();
            let counts = name.starts_with("gpus");
            let range = if counts {
                // Counts: from zero to the largest, at least 1, with room above it.
                let top = self.runs.iter().flat_map(|r| r.windows.iter().map(metric)).fold(1.0, f64::max);
                0.0..top + 0.5
            } else {
                figures::fitted(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), floor, ceil)
            };
            let axis_note = if range.start > 0.0 { " The y axis does not start at zero." } else { "" };
            let y = figures::ValueAxis { desc: y_desc, range, counts };
            figure(
                &mut h,
                format!("{}.svg", name.replace(' ', "_")),
                figures::time_series(name, &time, y, &series, (1000, 340))?,
                &format!("{caption} Points are window midpoints.{axis_note}"),
            );
        }

        h.push_str(&self.slice_maps(scenario, &time, &mut figure)?);
        h.push_str(&self.tenant_tables(focus));
        let _ = writeln!(
            h,
            "<h2>Rerun</h2><p><code>summary.json</code> (schema {SUMMARY_SCHEMA_VERSION}) holds these figures, and its \
             <code>reproduce</code> block what reruns the scenario; <code>timeseries.csv</code> holds the windows.</p>\
             <details><summary>reproduce</summary><pre>{}</pre></details></body></html>",
            escape(&serde_json::to_string_pretty(&self.reproduce).expect("JSON values serialise")),
        );
        Ok((h, files))
    }

    /// The results as an HTML table, the policy of interest's row highlighted, the bound last.
    fn results_table(&self) -> String {
        let mut h = String::from(
            "<h2>Results</h2><table><thead><tr><th>policy</th><th>goodput</th><th>/ bound</th><th>SLO attainment</th>\
             <th>mean accuracy</th><th>p50 ms</th><th>p99 ms</th><th>p99.9 ms</th><th>dropped</th><th>retrainings</th>\
             <th>reconfig.</th><th>GPU-hours</th><th>plan ms</th></tr></thead><tbody>",
        );
        let ms = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
        for (i, r) in self.runs.iter().enumerate() {
            let _ = write!(
                h,
                "<tr{}><td>{}</td><td>{:.1}</td><td>{}</td><td>{}</td><td>{:.4}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{:.2}</td><td>{:.1}</td></tr>",
                if i == 0 { " class=\"focus\"" } else { "" },
                escape(&r.policy),
                r.total.goodput,
                self.over_bound(r).map_or("–".to_string(), |v| format!("{v:.4}")),
                share(r.total.attainment(), "–"),
                r.total.mean_accuracy(),
                ms(r.latency_ms.p50),
                ms(r.latency_ms.p99),
                ms(r.latency_ms.p999),
                r.total.dropped,
                r.retrainings_completed,
                r.reconfigurations,
                r.gpu_hours,
                r.plan_ms_median,
            );
        }
        if let Some(b) = &self.upper_bound {
            let _ = write!(
                h,
                "<tr class=\"bound\"><td>upper bound</td><td>{:.1}</td><td>1</td><td colspan=\"11\">no policy can exceed \
                 it (docs/evaluation.md)</td></tr>",
                b.goodput,
            );
        }
        h.push_str("</tbody></table>");
        h
    }

    /// Per policy, a slice map of the first GPUs over time; the policy of interest's open, the others folded.
    fn slice_maps(
        &self,
        scenario: &Scenario,
        time: &TimeAxis,
        figure: &mut dyn FnMut(&mut String, String, String, &str),
    ) -> Result<String, ReplayError> {
        let tenants: BTreeMap<String, usize> =
            scenario.tenants.iter().enumerate().map(|(i, t)| (t.id.to_string(), i)).collect();
        let shown = self.runs.first().map_or(0, |r| r.windows.first().map_or(0, |w| w.instances.len()));
        let mut h = format!(
            "<h2>Layouts over time</h2><p>The first {shown} of {} GPUs: each row a GPU's eight memory slices (slice 0 on \
             top), each box a GPU instance from the window it appeared in to the one it left, coloured by its tenant, \
             pale while it retrains, white while idle.</p><p class=\"legend\">",
            scenario.gpus.len()
        );
        for (t, &i) in &tenants {
            let _ = write!(
                h,
                "<span class=\"swatch\" style=\"background:{}\"></span>{}",
                figures::hex(figures::tenant_color(i)),
                escape(t)
            );
        }
        h.push_str("</p>");
        for (i, r) in self.runs.iter().enumerate() {
            let windows: Vec<(f64, &[Vec<SliceRun>])> =
                r.windows.iter().map(|w| (w.start_s, w.instances.as_slice())).collect();
            let svg = figures::slice_map(
                &format!("slice map {}", r.policy),
                time,
                &windows,
                &tenants,
                tessera_core::catalog::MEMORY_SLICES,
                1000,
            )?;
            let caption = format!("GPU instances of <b>{}</b> over time.", escape(&r.policy));
            let file = format!("slice_map_{}.svg", file_safe(&r.policy));
            if i == 0 {
                figure(&mut h, file, svg, &caption);
            } else {
                let _ = write!(h, "<details><summary>{}</summary>", escape(&r.policy));
                figure(&mut h, file, svg, &caption);
                h.push_str("</details>");
            }
        }
        Ok(h)
    }

    /// Per policy, a table of its tenants: the policy of interest's open, the others folded.
    fn tenant_tables(&self, focus: &str) -> String {
        let mut h = String::from("<h2>Per tenant</h2>");
        let ms = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.1}"));
        for r in &self.runs {
            let open = if r.policy == focus { " open" } else { "" };
            let _ = write!(
                h,
                "<details{open}><summary>{}</summary><table><thead><tr><th>tenant</th><th>requests</th>\
                 <th>within SLO</th><th>SLO attainment</th><th>dropped</th><th>mean accuracy</th><th>goodput</th>\
                 <th>p50 ms</th><th>p99 ms</th><th>retrainings</th></tr></thead><tbody>",
                escape(&r.policy)
            );
            for t in &r.tenants {
                let _ = write!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4}</td><td>{:.1}</td>\
                     <td>{}</td><td>{}</td><td>{}</td></tr>",
                    escape(&t.tenant),
                    t.ledger.requests,
                    t.ledger.within_slo,
                    share(t.ledger.attainment(), "–"),
                    t.ledger.dropped,
                    t.ledger.mean_accuracy(),
                    t.ledger.goodput,
                    ms(t.latency_ms.p50),
                    ms(t.latency_ms.p99),
                    t.retrainings_completed,
                );
            }
            h.push_str("</tbody></table></details>");
        }
        h
    }

    /// Writes `summary.json`, `timeseries.csv`, `report.html` and its figures (`figures/*.svg`) into `dir` (created
    /// if missing).
    pub fn write(&self, dir: &Path, scenario: &Scenario) -> Result<(), ReplayError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| ReplayError::Io { path, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let summary = serde_json::to_string_pretty(&self.summary(scenario)).expect("JSON values serialise");
        let p = dir.join("summary.json");
        std::fs::write(&p, summary + "\n").map_err(io(&p))?;
        let p = dir.join("timeseries.csv");
        std::fs::write(&p, self.timeseries()).map_err(io(&p))?;
        let p = dir.join("report.html");
        let (html, figures) = self.page(scenario)?;
        std::fs::write(&p, html).map_err(io(&p))?;
        let figs = dir.join("figures");
        std::fs::create_dir_all(&figs).map_err(io(&figs))?;
        for (name, svg) in figures {
            let p = figs.join(name);
            std::fs::write(&p, svg).map_err(io(&p))?;
        }
        Ok(())
    }
}

/// The report's page style: readable type, numbers in aligned columns, figures as wide as the column but never
/// narrower than they are drawn (1000 px, every figure's width: a narrower window scrolls them), so their text is never drawn
/// smaller than its size.
const STYLE: &str = "body{font:16px/1.5 system-ui,-apple-system,'Segoe UI',sans-serif;color:#222;max-width:1080px;\
margin:2em auto;padding:0 1em}h1{font-size:1.7em;margin-bottom:.2em}h2{font-size:1.3em;margin-top:2.2em;\
border-bottom:1px solid #ddd;padding-bottom:.2em}.lede{color:#444}table{border-collapse:collapse;font-size:14px;\
font-variant-numeric:tabular-nums;margin:.6em 0}th{font-weight:600;border-bottom:2px solid #bbb}td,th{padding:4px 9px;\
text-align:right;border-bottom:1px solid #e6e6e6}td:first-child,th:first-child{text-align:left;white-space:nowrap}\
tr.focus td{background:#e8f1fa;font-weight:600}tr.bound td{color:#555;font-style:italic}figure{margin:1.4em 0;\
overflow-x:auto}figure svg{width:100%;min-width:1000px;height:auto;display:block}figcaption{font-size:14px;color:#444;\
margin-top:.4em}details{margin:.5em 0}summary{cursor:pointer;font-weight:600}.legend{font-size:14px;line-height:2}\
.swatch{display:inline-block;width:14px;height:14px;border-radius:2px;vertical-align:-2px;margin:0 5px 0 14px}\
.line{display:inline-block;width:26px;vertical-align:middle;margin:0 6px 0 16px}\
pre{background:#f6f6f6;padding:1em;overflow-x:auto;font-size:13px}code{font-size:.92em}";

/// The steps of a run's latency CDF in units of each request's SLO: every tenant's histogram scaled by its SLO,
/// merged, with steps closer than 0.5 % joined (so a fleet of many tenants stays a light figure).
fn over_slo_steps(run: &PolicyRun, slo_of: &BTreeMap<String, f64>) -> Vec<(f64, u64)> {
    let mut points: Vec<(f64, u64)> = Vec::new();
    for t in &run.tenants {
        let Some(&slo) = slo_of.get(&t.tenant).filter(|s| **s > 0.0) else { continue };
        let mut before = 0;
        for (ms, seen) in t.latency.cumulative() {
            points.push((ms / slo, seen - before));
            before = seen;
        }
    }
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut steps: Vec<(f64, u64)> = Vec::new();
    let mut total = 0;
    for (x, n) in points {
        total += n;
        match steps.last_mut() {
            Some(last) if x <= last.0 * 1.005 => last.1 = total,
            _ => steps.push((x, total)),
        }
    }
    steps
}

/// An SLO in ms, to three significant digits at most.
fn slo_words(ms: f64) -> String {
    if ms >= 100.0 { format!("{ms:.0}") } else { axis_number((ms * 100.0).round() / 100.0) }
}

/// A policy name as a file name: letters, digits, `-` and `_` kept, anything else `_`.
fn file_safe(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// Seconds of workload as words: `5 min`, `1.5 h`, `45 s`.
fn duration_words(s: f64) -> String {
    if s >= 3600.0 {
        format!("{} h", axis_number(s / 3600.0))
    } else if s >= 60.0 {
        format!("{} min", axis_number(s / 60.0))
    } else {
        format!("{} s", axis_number(s))
    }
}

/// A share to four decimals, or `none` when there is none.
fn share(v: Option<f64>, none: &str) -> String {
    v.map_or_else(|| none.to_string(), |v| format!("{v:.4}"))
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// `replay [--trace FILE] ...`: runs every policy, prints the table (or JSON), writes `--out`.
pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<Comparison, ReplayError> {
    let (cmp, scenario) = compare(args, false)?;
    let scenario = &scenario;
    let text = if args.json {
        format!("{}\n", serde_json::to_string_pretty(&cmp.summary(scenario)).expect("JSON values serialise"))
    } else {
        cmp.table()
    };
    out.write_all(text.as_bytes()).map_err(|source| ReplayError::Io { path: "stdout".into(), source })?;
    if let Some(dir) = &args.out {
        cmp.write(dir, scenario)?;
        crate::note(format_args!("replay: wrote {}/summary.json, timeseries.csv and report.html", dir.display()));
    }
    Ok(cmp)
}

#[cfg(test)]
mod tests {
    use super::{duration_words, file_safe, share};

    #[test]
    fn no_requests_have_no_attainment() {
        let none = tessera_core::goodput::GoodputLedger::default();
        assert_eq!(none.attainment(), None, "0/0 is not 1");
        assert_eq!(share(none.attainment(), "–"), "–");
        let some = tessera_core::goodput::GoodputLedger { requests: 4, within_slo: 3, ..none };
        assert_eq!(share(some.attainment(), "–"), "0.7500");
    }

    #[test]
    fn policy_names_make_safe_file_names() {
        assert_eq!(file_safe("tessera-no-tail"), "tessera-no-tail");
        assert_eq!(file_safe("../a b"), "___a_b");
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(duration_words(45.0), "45 s");
        assert_eq!(duration_words(300.0), "5 min");
        assert_eq!(duration_words(5_400.0), "1.5 h");
    }
}
