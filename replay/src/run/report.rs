//! What a run shows: the terminal table, and in `--out DIR` `summary.json`, `timeseries.csv` and `report.html`
//! (plots as inline SVG, viewable offline).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;
use serde_json::{Value, json};

use tessera_planner::bound::UpperBound;

use super::driver::{LAYOUT_GPUS, PolicyRun};
use super::{ReplayError, Scenario};

/// The comparison of a run's policies.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// The trace's file name.
    pub trace: String,
    /// The seed.
    pub seed: u64,
    /// Per policy, in the order run.
    pub runs: Vec<PolicyRun>,
    /// The upper bound on any policy's goodput over the run ([`tessera_planner::bound`]).
    pub upper_bound: Option<UpperBound>,
    /// What reproduces the run: the trace's path and how it was read, the fleet, the tenants, the load and the
    /// planner settings as the command line gave them (`summary.json`'s `reproduce`).
    pub reproduce: Value,
}

/// Version of `summary.json`'s layout: 2 added `schema_version`, `tool`, `reproduce` and `scenario.gpu_models`; 3
/// added each policy's `latency_ms` percentiles and `tenants` breakdown.
pub const SUMMARY_SCHEMA_VERSION: u32 = 3;

impl Comparison {
    /// `goodput / upper bound` for `run` (`None` without a bound; 1 when the bound is 0).
    pub fn over_bound(&self, run: &PolicyRun) -> Option<f64> {
        self.upper_bound.as_ref().map(|b| if b.goodput > 0.0 { run.total.goodput / b.goodput } else { 1.0 })
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
                "{:<16} {:>14.1} {:>9} {:>8.4} {:>8.4} {:>8} {:>8} {:>8.2} {:>9} {:>8.1} {:>7.2}",
                r.policy,
                r.total.goodput,
                self.over_bound(r).map_or("-".to_string(), |v| format!("{v:.4}")),
                r.total.slo_attainment(),
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
                    "slo_attainment": r.total.slo_attainment(),
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
                    "tenants": r.tenants.iter().map(|t| (t.tenant.clone(), json!({
                        "requests": t.ledger.requests,
                        "requests_within_slo": t.ledger.within_slo,
                        "completed": t.ledger.completed,
                        "dropped": t.ledger.dropped,
                        "goodput": t.ledger.goodput,
                        "slo_attainment": t.ledger.slo_attainment(),
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
                "window_s": scenario.window_s,
                "slot_s": scenario.planner.slot_s,
                "horizon_slots": scenario.planner.horizon_slots,
                "gap": scenario.planner.solver.mip_rel_gap,
                "forecaster": scenario.forecaster.to_string(),
                "tlb": scenario.tlb,
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
            "policy,start_s,requests,completed,within_slo,dropped,goodput,slo_attainment,mean_accuracy,reconfigurations,active_gpus,plan_ms",
        );
        for g in 0..LAYOUT_GPUS {
            let _ = write!(s, ",layout_gpu{g}");
        }
        s.push('\n');
        for r in &self.runs {
            for w in &r.windows {
                let att = if w.requests == 0 { 1.0 } else { w.within_slo as f64 / w.requests as f64 };
                let _ = write!(
                    s,
                    "{},{},{},{},{},{},{:.3},{:.6},{:.6},{},{},{:.2}",
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

    /// `report.html`: the table, and plots of goodput, SLO attainment, accuracy and reconfigurations per window,
    /// and the layouts of the first GPUs over time.
    pub fn html(&self, scenario: &Scenario) -> Result<String, ReplayError> {
        let mut h = String::new();
        let _ = write!(
            h,
            "<!doctype html><html><head><meta charset=\"utf-8\"><title>Tessera replay: {t}</title><style>\
             body{{font-family:sans-serif;margin:2em;max-width:1100px}} pre{{background:#f4f4f4;padding:1em}}\
             table{{border-collapse:collapse;font-size:12px}} td,th{{border:1px solid #ccc;padding:2px 6px}}</style>\
             </head><body><h1>Tessera replay: {t}</h1><p>{g} GPUs, {n} tenants, {d:.0} s of workload time, planning every \
             {w} s (slots of {s} s, horizon {hz}), seed {seed}.</p><pre>{table}</pre>",
            t = escape(&self.trace),
            g = scenario.gpus.len(),
            n = scenario.tenants.len(),
            d = scenario.duration_ms / 1000.0,
            w = scenario.window_s,
            s = scenario.planner.slot_s,
            hz = scenario.planner.horizon_slots,
            seed = self.seed,
            table = escape(&self.table()),
        );
        type Metric = fn(&super::driver::WindowRow) -> f64;
        let plots: [(&str, &str, Metric); 4] = [
            ("Goodput per window", "goodput (accuracy x requests within SLO)", |w| w.goodput),
            ("SLO attainment per window", "requests within SLO / requests", |w| {
                if w.requests == 0 { 1.0 } else { w.within_slo as f64 / w.requests as f64 }
            }),
            ("Mean accuracy of served requests", "mean accuracy", |w| w.mean_accuracy),
            ("Reconfigurations per window", "plans applied that changed a GPU", |w| w.reconfigurations as f64),
        ];
        for (title, y_desc, f) in plots {
            let _ = write!(h, "<h2>{title}</h2>{}", self.svg(title, y_desc, f)?);
        }
        h.push_str("<h2>Layouts over time</h2><p>The first GPUs' layouts at each window start (after planning).</p>");
        for r in &self.runs {
            let _ = write!(h, "<h3>{}</h3><table><tr><th>t (s)</th>", escape(&r.policy));
            let gpus = r.windows.first().map_or(0, |w| w.layouts.len());
            for g in 0..gpus {
                let _ = write!(h, "<th>GPU {g}</th>");
            }
            h.push_str("</tr>");
            let mut last: Option<&Vec<String>> = None;
            for w in &r.windows {
                if last == Some(&w.layouts) {
                    continue;
                }
                let _ = write!(h, "<tr><td>{}</td>", w.start_s);
                for l in &w.layouts {
                    let _ = write!(h, "<td>{}</td>", escape(l));
                }
                h.push_str("</tr>");
                last = Some(&w.layouts);
            }
            h.push_str("</table>");
        }
        h.push_str("</body></html>\n");
        Ok(h)
    }

    fn svg(
        &self,
        title: &str,
        y_desc: &str,
        metric: fn(&super::driver::WindowRow) -> f64,
    ) -> Result<String, ReplayError> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (1000, 320)).into_drawing_area();
            let draw = |e: String| ReplayError::Usage(format!("plot {title}: {e}"));
            root.fill(&WHITE).map_err(|e| draw(e.to_string()))?;
            let x_max = self.runs.iter().flat_map(|r| r.windows.last()).map(|w| w.start_s).fold(1.0, f64::max);
            let y_max =
                self.runs.iter().flat_map(|r| r.windows.iter().map(metric)).fold(0.0, f64::max).max(1e-9) * 1.05;
            // A run of an hour or more is plotted in hours, so that the ticks fall on whole hours.
            let hours = x_max >= 3600.0;
            let x_unit_s = if hours { 3600.0 } else { 1.0 };
            let mut chart = ChartBuilder::on(&root)
                .margin(10)
                .x_label_area_size(40)
                .y_label_area_size(80)
                .build_cartesian_2d(0.0..x_max / x_unit_s, 0.0..y_max)
                .map_err(|e| draw(e.to_string()))?;
            chart
                .configure_mesh()
                .x_desc(if hours { "workload time (h:mm)" } else { "workload time (s)" })
                .x_label_formatter(&|&x| if hours { hours_minutes(x * x_unit_s) } else { axis_number(x) })
                .y_desc(y_desc)
                .y_label_formatter(&|&y| axis_number(y))
                .draw()
                .map_err(|e| draw(e.to_string()))?;
            for (i, r) in self.runs.iter().enumerate() {
                let color = PALETTE[i % PALETTE.len()];
                chart
                    .draw_series(LineSeries::new(
                        r.windows.iter().map(|w| (w.start_s / x_unit_s, metric(w))),
                        color.stroke_width(2),
                    ))
                    .map_err(|e| draw(e.to_string()))?
                    .label(r.policy.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| draw(e.to_string()))?;
            root.present().map_err(|e| draw(e.to_string()))?;
        }
        Ok(out)
    }

    /// Writes `summary.json`, `timeseries.csv` and `report.html` into `dir` (created if missing).
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
        std::fs::write(&p, self.html(scenario)?).map_err(io(&p))?;
        Ok(())
    }
}

/// Line colours, one per policy in the order run: distinct on white and from one another (the Tableau 10 set).
pub(super) const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// An axis value with at most three decimals and an SI suffix from 10,000 up: `0.85`, `9999`, `900k`, `1.25M`,
/// `44.584G`.
fn axis_number(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e12 {
        (v / 1e12, "T")
    } else if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e4 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let s = format!("{x:.3}");
    let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.') } else { &s };
    format!("{s}{suffix}")
}

/// Workload seconds as `h:mm`.
fn hours_minutes(s: f64) -> String {
    let m = (s / 60.0).round() as i64;
    format!("{}:{:02}", m / 60, m % 60)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::{axis_number, hours_minutes};

    #[test]
    fn axis_labels_are_short() {
        let cases = [
            (0.0, "0"),
            (0.85, "0.85"),
            (1.0, "1"),
            (120.0, "120"),
            (9_999.0, "9999"),
            (900_000.0, "900k"),
            (1_250_000.0, "1.25M"),
            (44_584_269_008.3, "44.584G"),
            (-2_500.0, "-2500"),
        ];
        for (v, want) in cases {
            assert_eq!(axis_number(v), want, "{v}");
        }
        assert_eq!(hours_minutes(0.0), "0:00");
        assert_eq!(hours_minutes(5_400.0), "1:30");
        assert_eq!(hours_minutes(86_400.0), "24:00");
    }
}
