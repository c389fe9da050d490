//! The figures of a run's report and of a study, as SVG through plotters.
//!
//! Conventions, so that a figure can go into a paper or onto a slide as it is:
//! - **Legible text**: tick labels are 16 px and axis titles 18 px at the figure's own width (plotters writes
//!   `font-size` as the size given / 1.24, hence [`TICK`] and [`AXIS`]), and no text under 12 px. The report never
//!   draws a figure narrower than its own width (a narrow window scrolls it), so these are the smallest sizes a
//!   reader sees.
//! - **Axes fitted to the data** ([`fitted`]): a per-window series is shown from a little below its smallest value
//!   to a little above its largest, so differences between policies are visible; counts and shares of a bound keep
//!   their zero.
//! - **The policy of interest** (the first one run) is drawn last, on top, in a heavier line or a saturated bar; the
//!   others are lighter. Each policy keeps its colour in every figure ([`Pen::of`]).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::ops::Range;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::run::ReplayError;
use crate::run::driver::SliceRun;

/// Font family of every figure.
pub(crate) const FONT: &str = "sans-serif";
/// Tick labels (16 px in the SVG).
pub(crate) const TICK: u32 = 20;
/// Axis titles and legends (18 px in the SVG).
pub(crate) const AXIS: u32 = 22;
/// Text inside a figure's shapes (13 px in the SVG).
pub(crate) const SMALL: u32 = 16;

/// Series colours, one per policy in the order run: distinct on white and from one another (the Tableau 10 set).
pub(crate) const PALETTE: [RGBColor; 10] = [
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

/// Tenant colours of the slice map (Tableau 20, its greys swapped for two blues of Vega's category20b so that no
/// tenant looks like an idle instance), repeating after 20.
const TENANT_PALETTE: [RGBColor; 20] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(57, 59, 121),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(255, 152, 150),
    RGBColor(197, 176, 213),
    RGBColor(196, 156, 148),
    RGBColor(247, 182, 210),
    RGBColor(156, 158, 222),
    RGBColor(219, 219, 141),
    RGBColor(158, 218, 229),
];

/// The colour of the `i`-th tenant in the slice map.
pub(crate) fn tenant_color(i: usize) -> RGBColor {
    TENANT_PALETTE[i % TENANT_PALETTE.len()]
}

/// `#rrggbb` of a colour, for HTML legends.
pub(crate) fn hex(c: RGBColor) -> String {
    format!("#{:02x}{:02x}{:02x}", c.0, c.1, c.2)
}

/// How one policy is drawn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pen {
    /// Its colour, by its position in the run.
    pub color: RGBColor,
    /// It is the policy of interest.
    pub highlight: bool,
}

impl Pen {
    /// The pen of the `i`-th policy run; the first is the policy of interest.
    pub fn of(i: usize) -> Pen {
        Pen { color: PALETTE[i % PALETTE.len()], highlight: i == 0 }
    }

    /// A line: 4 px and opaque for the policy of interest, 2 px and a little transparent for the others.
    pub fn line(self) -> ShapeStyle {
        if self.highlight { self.color.stroke_width(4) } else { self.color.mix(0.7).stroke_width(2) }
    }

    /// A filled shape: saturated for the policy of interest, lighter for the others.
    pub fn fill(self) -> ShapeStyle {
        if self.highlight { self.color.filled() } else { self.color.mix(0.55).filled() }
    }
}

/// An axis range that shows the differences between `values`: from 8 % of their spread below the smallest to 8 %
/// above the largest, kept within `floor` and `ceil` where given. A flat series gets a band of 5 % of its value
/// (or 1 when it is 0) around it. No finite value: `0..1`.
pub(crate) fn fitted(values: impl IntoIterator<Item = f64>, floor: Option<f64>, ceil: Option<f64>) -> Range<f64> {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if lo > hi {
        return 0.0..1.0;
    }
    let spread = hi - lo;
    let pad = if spread > 1e-9 * hi.abs().max(lo.abs()).max(1e-12) {
        0.08 * spread
    } else if hi.abs() > 0.0 {
        0.05 * hi.abs()
    } else {
        1.0
    };
    let mut a = lo - pad;
    let mut b = hi + pad;
    if let Some(f) = floor {
        a = a.max(f);
    }
    if let Some(c) = ceil {
        b = b.min(c);
    }
    if b <= a {
        b = a + pad.max(1e-9);
    }
    a..b
}

/// A plotters error as the run's error, naming the figure.
fn err<E: Display>(figure: &str) -> impl Fn(E) -> ReplayError + '_ {
    move |e| ReplayError::Usage(format!("figure {figure}: {e}"))
}

/// A series of one policy.
pub(crate) struct Series {
    /// Its points, in x order.
    pub points: Vec<(f64, f64)>,
    /// How it is drawn.
    pub pen: Pen,
}

/// The x axis of a time series: workload seconds, labelled `h:mm` from an hour on.
pub(crate) struct TimeAxis {
    /// Largest x, seconds.
    pub end_s: f64,
}

impl TimeAxis {
    fn hours(&self) -> bool {
        self.end_s >= 3600.0
    }

    fn unit(&self) -> f64 {
        if self.hours() { 3600.0 } else { 1.0 }
    }

    fn desc(&self) -> &'static str {
        if self.hours() { "workload time (h:mm)" } else { "workload time (s)" }
    }

    fn label(&self, x: f64) -> String {
        if self.hours() { hours_minutes(x * 3600.0) } else { axis_number(x) }
    }
}

/// The y axis of a time series: its description, its range, and whether it counts (ticks on whole numbers only).
pub(crate) struct ValueAxis<'a> {
    /// What the axis shows.
    pub desc: &'a str,
    /// Its range.
    pub range: Range<f64>,
    /// The values are counts: ticks fall on whole numbers.
    pub counts: bool,
}

/// A line chart of `series` over workload time against `y`; markers on every point when there are few.
pub(crate) fn time_series(
    figure: &str,
    time: &TimeAxis,
    y: ValueAxis<'_>,
    series: &[Series],
    size: (u32, u32),
) -> Result<String, ReplayError> {
    let ValueAxis { desc: y_desc, range: y, counts } = y;
    // Counts up to 10 get a tick on every whole number; above, plotters' 1-2-5 steps are whole already, and any
    // other tick is left unlabelled.
    let y_ticks = if counts { (y.end.floor().max(0.0) as usize + 1).min(11) } else { 10 };
    let y_label = move |v: &f64| {
        if counts && (v - v.round()).abs() > 1e-9 { String::new() } else { axis_number(*v) }
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(err(figure))?;
        let unit = time.unit();
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(56)
            .y_label_area_size(96)
            .build_cartesian_2d(0.0..(time.end_s / unit).max(1e-9), y)
            .map_err(err(figure))?;
        chart
            .configure_mesh()
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(time.desc())
            .y_desc(y_desc)
            .y_labels(y_ticks)
            .x_label_formatter(&|&x| time.label(x))
            .y_label_formatter(&y_label)
            .label_style((FONT, TICK))
            .axis_desc_style((FONT, AXIS))
            .draw()
            .map_err(err(figure))?;
        let markers = series.iter().map(|s| s.points.len()).max().unwrap_or(0) <= 40;
        // The policy of interest last, on top; the page carries the legend ([`html_legend`]).
        for s in series.iter().filter(|s| !s.pen.highlight).chain(series.iter().filter(|s| s.pen.highlight)) {
            let pen = s.pen;
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(x, y)| (x / unit, y)).collect();
            chart.draw_series(LineSeries::new(pts.clone(), pen.line())).map_err(err(figure))?;
            if markers {
                let r = if pen.highlight { 5 } else { 3 };
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, r, pen.fill()))).map_err(err(figure))?;
            }
        }
        root.present().map_err(err(figure))?;
    }
    Ok(out)
}

/// A legend for the page, for figures drawn without one: a line of each policy's colour and its name, the policy
/// of interest in bold.
pub(crate) fn html_legend(policies: &[(&str, Pen)]) -> String {
    let mut h = String::from("<p class=\"legend\">");
    for (name, pen) in policies {
        let (w, b) = if pen.highlight { (4, "<b>") } else { (2, "") };
        let end = if b.is_empty() { "" } else { "</b>" };
        h.push_str(&format!(
            "<span class=\"line\" style=\"border-top:{w}px solid {}\"></span>{b}{}{end}",
            hex(pen.color),
            name.replace('&', "&amp;").replace('<', "&lt;")
        ));
    }
    h.push_str("</p>");
    h
}

/// The legend of a chart's series, boxed, at `position`.
fn legend<'a, DB: DrawingBackend + 'a, CT: plotters::coord::CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    figure: &str,
    position: SeriesLabelPosition,
) -> Result<(), ReplayError>
where
    DB::ErrorType: 'static,
{
    chart
        .configure_series_labels()
        .label_font((FONT, AXIS))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .position(position)
        .draw()
        .map_err(err(figure))
}

/// One policy's latency distribution: steps `(latency, requests served within it)` and its requests.
pub(crate) struct Cdf<'a> {
    /// The policy.
    pub name: &'a str,
    /// Cumulative counts at increasing latencies (from
    /// [`LatencyHistogram::cumulative`](tessera_sim::executor::metrics::LatencyHistogram::cumulative)).
    pub steps: Vec<(f64, u64)>,
    /// Requests that arrived (the denominator: a dropped request is never served, so a curve ends below 1 by the
    /// share dropped or still queued).
    pub requests: u64,
    /// How it is drawn.
    pub pen: Pen,
}

/// The latency CDF of every policy on a log x axis described by `x_desc`, with a grey line at each of `marks`
/// (`(x, label)`).
pub(crate) fn latency_cdf(
    figure: &str,
    x_desc: &str,
    cdfs: &[Cdf],
    marks: &[(f64, String)],
    size: (u32, u32),
) -> Result<String, ReplayError> {
    // The axis runs in log10 units from where the first policy passes 0.5 % of its requests (earlier steps are
    // drawn at the left edge) to the last step, marks included.
    let start = |c: &Cdf| c.steps.iter().find(|s| s.1 as f64 >= 0.005 * c.requests.max(1) as f64).map(|s| s.0);
    let positive = |x: &f64| *x > 0.0 && x.is_finite();
    let lo =
        cdfs.iter().filter_map(start).chain(marks.iter().map(|m| m.0)).filter(positive).fold(f64::INFINITY, f64::min);
    let hi = cdfs
        .iter()
        .flat_map(|c| c.steps.iter().map(|s| s.0))
        .chain(marks.iter().map(|m| m.0))
        .filter(positive)
        .fold(0.0_f64, f64::max);
    // Past the last mark by at least a factor of 4, so that where each curve levels off (the tail, and the share
    // never served) shows.
    let last_mark = marks.iter().map(|m| m.0).filter(positive).fold(0.0_f64, f64::max);
    let hi = hi.max(4.0 * last_mark);
    let (lo, hi) = if lo.is_finite() && hi >= lo { (lo.log10() - 0.15, hi.log10() + 0.1) } else { (-1.0, 3.0) };
    let log = |x: f64| if x > 0.0 { x.log10().max(lo) } else { lo };
    let ticks = log_ticks(lo, hi);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(err(figure))?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(56)
            .y_label_area_size(96)
            .build_cartesian_2d(lo..hi, 0.0..1.0)
            .map_err(err(figure))?;
        // plotters spaces ticks evenly in log units (0.32, 0.63...): the x ticks and their grid are drawn here, on
        // round values ([`log_ticks`]), and the mesh draws only the y axis's.
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(x_desc)
            .y_desc("share of requests served within")
            .y_label_formatter(&|&y| axis_number(y))
            .label_style((FONT, TICK))
            .axis_desc_style((FONT, AXIS))
            .draw()
            .map_err(err(figure))?;
        let grid = ticks.iter().map(|&t| PathElement::new(vec![(t, 0.0), (t, 1.0)], BLACK.mix(0.12)));
        chart.draw_series(grid).map_err(err(figure))?;
        let tick_style = (FONT, TICK).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Top));
        for &t in &ticks {
            let (px, py) = chart.backend_coord(&(t, 0.0));
            let label = Text::new(significant(10f64.powf(t)), (px, py + 8), tick_style.clone());
            root.draw(&label).map_err(err(figure))?;
        }
        for (x, label) in marks {
            let x = log(*x);
            let line = PathElement::new(vec![(x, 0.0), (x, 1.0)], BLACK.mix(0.45).stroke_width(2));
            chart.draw_series(std::iter::once(line)).map_err(err(figure))?;
            let text = Text::new(format!(" {label}"), (x, 0.06), (FONT, SMALL).into_font().color(&BLACK.mix(0.7)));
            chart.draw_series(std::iter::once(text)).map_err(err(figure))?;
        }
        // Every policy in order for the legend, then the policy of interest again on top.
        let on_top = cdfs.iter().filter(|c| c.pen.highlight);
        for (k, c) in cdfs.iter().chain(on_top).enumerate() {
            let pen = c.pen;
            let n = c.requests.max(1) as f64;
            // A step function: flat until the next bucket's edge, then up.
            let mut pts = Vec::with_capacity(2 * c.steps.len() + 1);
            let mut last = 0.0;
            for &(x, k) in &c.steps {
                pts.push((log(x), last));
                last = k as f64 / n;
                pts.push((log(x), last));
            }
            pts.push((hi, last));
            let drawn = chart.draw_series(LineSeries::new(pts, pen.line())).map_err(err(figure))?;
            if k < cdfs.len() {
                drawn
                    .label(c.name.to_string())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 28, y)], pen.line()));
            }
        }
        legend(&mut chart, figure, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(err(figure))?;
    }
    Ok(out)
}

/// Ticks of a log axis running from `lo` to `hi` (log10 units): round values (1, 2 and 5 times a power of ten,
/// only the powers when the axis spans more than three decades, every whole multiple when it spans less than one),
/// as their log10.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = hi - lo;
    let mantissas: &[f64] = if span > 3.0 {
        &[1.0]
    } else if span >= 1.0 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    };
    let mut ticks = Vec::new();
    for decade in (lo.floor() as i32)..=(hi.ceil() as i32) {
        for m in mantissas {
            let x = (m * 10f64.powi(decade)).log10();
            if (lo..=hi).contains(&x) {
                ticks.push(x);
            }
        }
    }
    ticks
}

/// The name of the row at `y` in a chart of horizontal bars, row `k` drawn at `y = n - 1 - k` (the first on top);
/// empty between rows.
fn row_name(names: &[&str], y: f64) -> String {
    let n = names.len().max(1) as f64;
    let k = (n - 1.0 - y).round();
    if (n - 1.0 - y - k).abs() < 1e-6 && k >= 0.0 {
        names.get(k as usize).map_or(String::new(), |s| s.to_string())
    } else {
        String::new()
    }
}

/// Width of the label area that holds `names`, px.
fn row_names_px(names: &[&str]) -> u32 {
    24 + 11 * names.iter().map(|s| s.chars().count()).max().unwrap_or(4) as u32
}

/// Horizontal bars, one per policy in the order given (the first on top), from 0 to each value, with the value
/// written at the bar's end and, where given, a 95 % interval as a whisker. `x` is the axis range.
pub(crate) fn bars(
    figure: &str,
    x_desc: &str,
    x: Range<f64>,
    rows: &[(&str, f64, Option<f64>, Pen)],
    size: (u32, u32),
) -> Result<String, ReplayError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(err(figure))?;
        let n = rows.len().max(1);
        let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let label_px = row_names_px(&names);
        let x_end = x.end;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(56)
            .y_label_area_size(label_px)
            .build_cartesian_2d(x, -0.5..n as f64 - 0.5)
            .map_err(err(figure))?;
        // Row k is drawn at y = n - 1 - k, so that the first row is on top.
        let at = |k: usize| (n - 1 - k) as f64;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(x_desc)
            .x_label_formatter(&|&v| axis_number(v))
            .y_labels(2 * n + 1)
            .y_label_formatter(&|&y| row_name(&names, y))
            .label_style((FONT, TICK))
            .axis_desc_style((FONT, AXIS))
            .draw()
            .map_err(err(figure))?;
        let crowded = rows.iter().any(|r| r.1 + r.2.filter(|h| h.is_finite()).unwrap_or(0.0) + 0.2 * x_end > x_end);
        for (k, &(_, v, half, pen)) in rows.iter().enumerate() {
            let y = at(k);
            chart
                .draw_series(std::iter::once(Rectangle::new([(0.0, y - 0.32), (v.max(0.0), y + 0.32)], pen.fill())))
                .map_err(err(figure))?;
            let mut text_at = v.max(0.0);
            if let Some(h) = half.filter(|h| h.is_finite()) {
                let style = BLACK.stroke_width(2);
                let (a, b) = (v - h, v + h);
                let whisker = vec![
                    PathElement::new(vec![(a, y), (b, y)], style),
                    PathElement::new(vec![(a, y - 0.15), (a, y + 0.15)], style),
                    PathElement::new(vec![(b, y - 0.15), (b, y + 0.15)], style),
                ];
                chart.draw_series(whisker).map_err(err(figure))?;
                text_at = b;
            }
            let label = match half.filter(|h| h.is_finite()) {
                Some(h) => format!("{v:.3} ± {h:.3}"),
                None => format!("{v:.3}"),
            };
            // Inside the bar's end when any label would run past the axis (all alike), else right of the bar or its
            // whisker; a bar too short to hold its label has it outside.
            let inside = crowded && v > 0.25 * x_end;
            let (x, anchor, color) = if inside {
                (v.max(0.0) - 0.01 * x_end, HPos::Right, if pen.highlight { WHITE } else { BLACK })
            } else {
                (text_at + 0.01 * x_end, HPos::Left, BLACK)
            };
            let font = (FONT, SMALL).into_font().color(&color).pos(Pos::new(anchor, VPos::Center));
            chart.draw_series(std::iter::once(Text::new(label, (x, y), font))).map_err(err(figure))?;
        }
        root.present().map_err(err(figure))?;
    }
    Ok(out)
}

/// Colours of [`split_bars`]' parts: goodput, not within SLO, below the best accuracy.
const SPLIT_COLORS: [RGBColor; 3] = [RGBColor(31, 119, 180), RGBColor(214, 39, 40), RGBColor(255, 187, 120)];

/// Where each policy's goodput goes: one bar per policy (the first on top) in three parts laid end to end, its
/// goodput, the requests not served within SLO and the accuracy below the best reachable, all as shares of the
/// bound; the parts add up to the ceiling over the bound, the same for every policy, and a dashed line marks the
/// bound at 1. `rows`: `(policy, [goodput, not within SLO, below best accuracy])`.
pub(crate) fn split_bars(figure: &str, rows: &[(&str, [f64; 3])], size: (u32, u32)) -> Result<String, ReplayError> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
        root.fill(&WHITE).map_err(err(figure))?;
        let n = rows.len().max(1);
        let names: Vec<&str> = rows.iter().map(|r| r.0).collect();
        let label_px = row_names_px(&names);
        let end = rows.iter().map(|r| r.1.iter().map(|v| v.max(0.0)).sum::<f64>()).fold(1.0, f64::max) * 1.04;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(56)
            .y_label_area_size(label_px)
            // Room above the bars for the legend.
            .build_cartesian_2d(0.0..end, -0.5..n as f64 + 0.9)
            .map_err(err(figure))?;
        let at = |k: usize| (n - 1 - k) as f64;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .x_desc("share of the upper bound")
            .x_label_formatter(&|&v| axis_number(v))
            .y_labels(2 * n + 1)
            .y_label_formatter(&|&y| row_name(&names, y))
            .label_style((FONT, TICK))
            .axis_desc_style((FONT, AXIS))
            .draw()
            .map_err(err(figure))?;
        let parts = ["goodput", "not within SLO", "below best accuracy"];
        for (j, part) in parts.iter().enumerate() {
            let color = SPLIT_COLORS[j];
            let bars: Vec<_> = rows
                .iter()
                .enumerate()
                .map(|(k, (_, v))| {
                    let from: f64 = v[..j].iter().map(|x| x.max(0.0)).sum();
                    let y = at(k);
                    Rectangle::new([(from, y - 0.32), (from + v[j].max(0.0), y + 0.32)], color.filled())
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(err(figure))?
                .label(*part)
                .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
        }
        for (k, (_, v)) in rows.iter().enumerate() {
            let font = (FONT, SMALL).into_font().color(&WHITE).pos(Pos::new(HPos::Left, VPos::Center));
            chart
                .draw_series(std::iter::once(Text::new(format!("{:.3}", v[0]), (0.01 * end, at(k)), font)))
                .map_err(err(figure))?;
        }
        let dashes = (0..20).map(|i| {
            let y0 = -0.5 + (n as f64 + 0.2) * f64::from(i) / 20.0;
            PathElement::new(vec![(1.0, y0), (1.0, y0 + 0.6 * (n as f64 + 0.2) / 20.0)], BLACK.stroke_width(2))
        });
        chart.draw_series(dashes).map_err(err(figure))?;
        legend(&mut chart, figure, SeriesLabelPosition::UpperLeft)?;
        root.present().map_err(err(figure))?;
    }
    Ok(out)
}

/// The slice map of one policy: for each of the first GPUs (a row each), its memory slices over workload time,
/// coloured by the tenant each instance works for (pale while it retrains, white while idle), with its tenant and
/// profile written where they fit. `windows` holds each window's start and instances; `tenants` gives each tenant's colour index.
pub(crate) fn slice_map(
    figure: &str,
    time: &TimeAxis,
    windows: &[(f64, &[Vec<SliceRun>])],
    tenants: &BTreeMap<String, usize>,
    slices_per_gpu: u8,
    width: u32,
) -> Result<String, ReplayError> {
    let gpus = windows.iter().map(|w| w.1.len()).max().unwrap_or(0).max(1);
    let height = 100 + 26 * u32::from(slices_per_gpu.max(1)).min(8) * gpus as u32 / 2 + 12 * gpus as u32;
    let unit = time.unit();
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (width, height.max(220))).into_drawing_area();
        root.fill(&WHITE).map_err(err(figure))?;
        let mut chart = ChartBuilder::on(&root)
            .margin(12)
            .margin_right(24)
            .x_label_area_size(56)
            .y_label_area_size(96)
            .build_cartesian_2d(0.0..(time.end_s / unit).max(1e-9), -0.5..gpus as f64 - 0.5)
            .map_err(err(figure))?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .light_line_style(WHITE.mix(0.0))
            .bold_line_style(BLACK.mix(0.12))
            .x_desc(time.desc())
            .x_label_formatter(&|&x| time.label(x))
            .y_labels(2 * gpus + 1)
            .y_label_formatter(&|&y| {
                let g = (gpus as f64 - 1.0 - y).round();
                if (gpus as f64 - 1.0 - y - g).abs() < 1e-6 && g >= 0.0 { format!("GPU {g}") } else { String::new() }
            })
            .label_style((FONT, TICK))
            .axis_desc_style((FONT, AXIS))
            .draw()
            .map_err(err(figure))?;
        let spans = instance_spans(windows, time.end_s);
        let per_slice = 0.9 / f64::from(slices_per_gpu.max(1));
        let mut rects = Vec::new();
        let mut labels = Vec::new();
        // Labels start a few pixels into their box.
        let nudge = (time.end_s / unit) * 6.0 / f64::from(width);
        for s in &spans {
            // GPU 0 is the top row; slice 0 the top of its row.
            let top = (gpus - 1 - s.gpu) as f64 + 0.45 - per_slice * f64::from(s.run.start);
            let bottom = top - per_slice * f64::from(s.run.slices);
            let (x0, x1) = (s.from_s / unit, s.to_s / unit);
            let fill = match &s.run.tenant {
                Some(t) => {
                    let c = tenant_color(tenants.get(t).copied().unwrap_or(0));
                    if s.run.retraining { c.mix(0.35).filled() } else { c.filled() }
                }
                None => WHITE.filled(),
            };
            let edge = if s.run.tenant.is_some() { WHITE.stroke_width(1) } else { BLACK.mix(0.45).stroke_width(1) };
            rects.push(Rectangle::new([(x0, bottom), (x1, top)], fill));
            rects.push(Rectangle::new([(x0, bottom), (x1, top)], edge));
            let (px0, py0) = chart.backend_coord(&(x0, top));
            let (px1, py1) = chart.backend_coord(&(x1, bottom));
            let text = match (&s.run.tenant, s.run.retraining) {
                (Some(t), true) => format!("{t} {} train", s.run.profile),
                (Some(t), false) => format!("{t} {}", s.run.profile),
                (None, _) => format!("{} idle", s.run.profile),
            };
            if px1 - px0 >= 9 * text.chars().count() as i32 + 8 && py1 - py0 >= 16 {
                labels.push(Text::new(
                    text,
                    (x0 + nudge, (top + bottom) / 2.0),
                    (FONT, SMALL).into_font().color(&BLACK).pos(Pos::new(HPos::Left, VPos::Center)),
                ));
            }
        }
        chart.draw_series(rects).map_err(err(figure))?;
        chart.draw_series(labels).map_err(err(figure))?;
        root.present().map_err(err(figure))?;
    }
    Ok(out)
}

/// One instance held unchanged (same place, profile and work) from `from_s` to `to_s` on GPU row `gpu`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct InstanceSpan {
    /// GPU row.
    pub gpu: usize,
    /// The instance.
    pub run: SliceRun,
    /// First window start it was seen at, seconds.
    pub from_s: f64,
    /// The next window start it was no longer seen at, or the end of the run.
    pub to_s: f64,
}

/// The instances of `windows` merged over consecutive windows in which they stay the same, in the order they end.
pub(crate) fn instance_spans(windows: &[(f64, &[Vec<SliceRun>])], end_s: f64) -> Vec<InstanceSpan> {
    let mut open: HashMap<(usize, SliceRun), f64> = HashMap::new();
    let mut done = Vec::new();
    for &(t, gpus) in windows {
        let now: Vec<(usize, SliceRun)> =
            gpus.iter().enumerate().flat_map(|(g, runs)| runs.iter().map(move |r| (g, r.clone()))).collect();
        let mut closed: Vec<(usize, SliceRun)> = open.keys().filter(|k| !now.contains(k)).cloned().collect();
        closed.sort_by_key(|a| (a.0, a.1.start));
        for k in closed {
            let from_s = open.remove(&k).expect("an open span");
            done.push(InstanceSpan { gpu: k.0, run: k.1, from_s, to_s: t });
        }
        for k in now {
            open.entry(k).or_insert(t);
        }
    }
    let mut rest: Vec<_> = open.into_iter().collect();
    rest.sort_by_key(|a| (a.0.0, a.0.1.start));
    done.extend(rest.into_iter().map(|((gpu, run), from_s)| InstanceSpan { gpu, run, from_s, to_s: end_s }));
    done
}

/// An axis value with at most three decimals and an SI suffix from 10,000 up: `0.85`, `9999`, `900k`, `1.25M`,
/// `44.584G`.
pub(crate) fn axis_number(v: f64) -> String {
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
    let s = if s == "-0" { "0" } else { s };
    format!("{s}{suffix}")
}

/// A positive value to two significant digits (`0.25`, `0.4`, `1`, `6.3`, `40`, `2500`), for log axes.
pub(crate) fn significant(v: f64) -> String {
    if !(v.is_finite() && v > 0.0) {
        return axis_number(v);
    }
    let digits = 1 - v.log10().floor() as i32;
    let scale = 10f64.powi(digits);
    axis_number((v * scale).round() / scale)
}

/// Workload seconds as `h:mm`.
pub(crate) fn hours_minutes(s: f64) -> String {
    let m = (s / 60.0).round() as i64;
    format!("{}:{:02}", m / 60, m % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            (-0.0001, "0"),
        ];
        for (v, want) in cases {
            assert_eq!(axis_number(v), want, "{v}");
        }
        for (v, want) in [(0.2512, "0.25"), (0.398, "0.4"), (1.0, "1"), (6.31, "6.3"), (39.8, "40"), (2512.0, "2500")] {
            assert_eq!(significant(v), want, "{v}");
        }
        assert_eq!(hours_minutes(0.0), "0:00");
        assert_eq!(hours_minutes(5_400.0), "1:30");
        assert_eq!(hours_minutes(86_400.0), "24:00");
    }

    #[test]
    fn log_axes_tick_on_round_values() {
        let at = |lo: f64, hi: f64| -> Vec<String> {
            log_ticks(lo.log10(), hi.log10()).into_iter().map(|x| significant(10f64.powf(x))).collect()
        };
        // The case of a latency CDF: a tick at the SLO (1), none at 0.32 or 0.63.
        assert_eq!(at(0.25, 5.0), ["0.5", "1", "2", "5"]);
        assert_eq!(at(0.3, 4.5), ["0.5", "1", "2"]);
        assert_eq!(at(0.3, 0.95), ["0.3", "0.4", "0.5", "0.6", "0.7", "0.8", "0.9"]);
        assert_eq!(at(0.05, 2000.0), ["0.1", "1", "10", "100", "1000"]);
    }

    #[test]
    fn fitted_ranges_hold_every_value_and_show_their_spread() {
        let r = fitted([0.91, 0.95, 0.93], None, Some(1.0));
        assert!(r.start <= 0.91 && r.end >= 0.95 && r.end <= 1.0, "{r:?}");
        // The values fill most of the axis, instead of a sliver near its top.
        assert!((0.95 - 0.91) / (r.end - r.start) > 0.8, "{r:?}");
        let r = fitted([3.0, 0.0, 1.0], Some(0.0), None);
        assert_eq!(r.start, 0.0);
        assert!(r.end >= 3.0);
        let r = fitted([5.0, 5.0], None, None);
        assert!(r.start < 5.0 && r.end > 5.0);
        let r = fitted([0.0], None, None);
        assert!(r.start < 0.0 && r.end > 0.0);
        assert_eq!(fitted([f64::NAN], None, None), 0.0..1.0);
        assert_eq!(fitted(Vec::new(), None, None), 0.0..1.0);
        let r = fitted([1.0, 1.0], Some(0.0), Some(1.0));
        assert!(r.start < 1.0 && r.end <= 1.0 + 1e-9 && r.start < r.end, "{r:?}");
    }

    fn run(start: u8, slices: u8, tenant: &str) -> SliceRun {
        SliceRun { start, slices, profile: format!("{slices}g"), tenant: Some(tenant.into()), retraining: false }
    }

    #[test]
    fn instance_spans_merge_unchanged_windows_and_cover_the_run() {
        let w0 = vec![vec![run(0, 4, "a"), run(4, 4, "b")]];
        let w1 = vec![vec![run(0, 4, "a"), run(4, 4, "b")]];
        let w2 = vec![vec![run(0, 4, "a"), run(4, 2, "b"), run(6, 2, "c")]];
        let windows: Vec<(f64, &[Vec<SliceRun>])> = vec![(0.0, &w0), (60.0, &w1), (120.0, &w2)];
        let spans = instance_spans(&windows, 180.0);
        assert_eq!(spans.len(), 4, "{spans:?}");
        let a = spans.iter().find(|s| s.run.tenant.as_deref() == Some("a")).unwrap();
        assert_eq!((a.from_s, a.to_s), (0.0, 180.0));
        let b4 = spans.iter().find(|s| s.run == run(4, 4, "b")).unwrap();
        assert_eq!((b4.from_s, b4.to_s), (0.0, 120.0));
        let c = spans.iter().find(|s| s.run.tenant.as_deref() == Some("c")).unwrap();
        assert_eq!((c.from_s, c.to_s), (120.0, 180.0));
        // Slice-seconds are conserved: each window's instances, times its length.
        let covered: f64 = spans.iter().map(|s| f64::from(s.run.slices) * (s.to_s - s.from_s)).sum();
        assert_eq!(covered, 8.0 * 180.0);
    }
}
