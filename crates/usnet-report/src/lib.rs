//! usnet-report: shared benchmark reporting for `usnet bench ...`.
//!
//! * [`Table`]: aligned text tables (stdout) and Markdown.
//! * [`write_json`]: pretty JSON files (parent directories are created).
//! * [`line_plot`], [`bar_plot`], [`bar_plot_runs`], [`histogram_plot`]: PNG plots
//!   drawn with `plotters` (bitmap backend, TrueType text through
//!   font-kit/fontconfig), one style for every bench: axes in k/M/G units
//!   ([`si`]), each bar labelled with its value (and its ratio to a baseline when
//!   it has one), the runs' spread as min–max whiskers, no slot for a bar that has
//!   no value.
//! * [`percentile`], [`median`]: small statistics helpers.
//!
//! Plot text needs a system sans-serif font found through fontconfig. On a
//! fresh Debian/Ubuntu machine install `pkg-config libfontconfig1-dev
//! fonts-dejavu-core` (the `-dev` package pulls `libfreetype-dev`; at run time
//! only `libfontconfig1` and a font are needed).

use std::fmt::Write as _;
use std::io;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Errors from the plot functions.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    #[error("plot error: {0}")]
    Plot(String),
    #[error("nothing to plot: {0}")]
    Empty(&'static str),
}

fn perr<E: std::fmt::Display>(e: E) -> ReportError {
    ReportError::Plot(e.to_string())
}

/// A text table with a title and a header row.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    pub title: String,
    pub headers: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// New empty table.
    pub fn new(title: impl Into<String>, headers: Vec<String>) -> Self {
        Table {
            title: title.into(),
            headers,
            rows: Vec::new(),
        }
    }

    /// Append a row (short rows are padded with empty cells when printed).
    pub fn row(&mut self, row: Vec<String>) -> &mut Self {
        self.rows.push(row);
        self
    }

    fn widths(&self) -> Vec<usize> {
        let ncol = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.headers.len()])
            .max()
            .unwrap_or(0);
        let mut w = vec![0usize; ncol];
        for r in std::iter::once(&self.headers).chain(self.rows.iter()) {
            for (i, c) in r.iter().enumerate() {
                w[i] = w[i].max(c.chars().count());
            }
        }
        w
    }

    /// Aligned plain-text rendering (first column left-aligned, the rest right-aligned).
    pub fn to_text(&self) -> String {
        let w = self.widths();
        let mut s = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(s, "{}", self.title);
        }
        let line = |s: &mut String, r: &[String]| {
            for (i, width) in w.iter().enumerate() {
                let c = r.get(i).map(String::as_str).unwrap_or("");
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = width - c.chars().count();
                if i == 0 {
                    s.push_str(c);
                    s.push_str(&" ".repeat(pad));
                } else {
                    s.push_str(&" ".repeat(pad));
                    s.push_str(c);
                }
            }
            s.push('\n');
        };
        line(&mut s, &self.headers);
        let total: usize = w.iter().sum::<usize>() + 2 * w.len().saturating_sub(1);
        s.push_str(&"-".repeat(total));
        s.push('\n');
        for r in &self.rows {
            line(&mut s, r);
        }
        s
    }

    /// Print [`Table::to_text`] to stdout.
    pub fn print(&self) {
        println!("{}", self.to_text());
    }

    /// GitHub-flavoured Markdown (title as a bold line above the table).
    pub fn to_markdown(&self) -> String {
        let mut s = String::new();
        if !self.title.is_empty() {
            let _ = writeln!(s, "**{}**\n", self.title);
        }
        let ncol = self.widths().len();
        let cell = |c: &str| c.replace('|', "\\|");
        let row = |s: &mut String, r: &[String]| {
            s.push('|');
            for i in 0..ncol {
                let _ = write!(s, " {} |", cell(r.get(i).map(String::as_str).unwrap_or("")));
            }
            s.push('\n');
        };
        row(&mut s, &self.headers);
        s.push('|');
        for i in 0..ncol {
            s.push_str(if i == 0 { "---|" } else { "---:|" });
        }
        s.push('\n');
        for r in &self.rows {
            row(&mut s, r);
        }
        s
    }
}

/// Write `value` as pretty JSON to `path`, creating parent directories.
pub fn write_json(path: &Path, value: &serde_json::Value) -> io::Result<()> {
    if let Some(p) = path.parent() {
        if !p.as_os_str().is_empty() {
            std::fs::create_dir_all(p)?;
        }
    }
    let mut text = serde_json::to_string_pretty(value).map_err(io::Error::other)?;
    text.push('\n');
    std::fs::write(path, text)
}

/// `v` with an SI prefix, three significant digits at most: 160000 → "160k",
/// 1.5e9 → "1.5G", 0.25 → "0.25". The axes and bar labels of every plot.
pub fn si(v: f64) -> String {
    if !v.is_finite() {
        return "-".into();
    }
    let a = v.abs();
    let (div, suffix) = [(1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
        .into_iter()
        .find(|(d, _)| a >= *d)
        .unwrap_or((1.0, ""));
    let x = v / div;
    let digits = if x.abs() >= 100.0 {
        0
    } else if x.abs() >= 10.0 {
        1
    } else {
        2
    };
    let mut t = format!("{x:.digits$}");
    if t.contains('.') {
        t = t.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    t + suffix
}

/// One bar of [`bar_plot_runs`]: the runs of one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    pub label: String,
    /// Every run's value; the bar is their median, the whisker their range.
    pub runs: Vec<f64>,
    /// The value this bar is compared with (Linux's, measured in the same run):
    /// its label then gives the ratio too.
    pub baseline: Option<f64>,
}

impl Bar {
    pub fn new(label: impl Into<String>, runs: Vec<f64>) -> Self {
        Bar {
            label: label.into(),
            runs,
            baseline: None,
        }
    }

    pub fn against(mut self, baseline: f64) -> Self {
        self.baseline = Some(baseline);
        self
    }

    /// The finite runs: (median, min, max); None if there are none.
    fn summary(&self) -> Option<(f64, f64, f64)> {
        let mut v: Vec<f64> = self
            .runs
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .collect();
        if v.is_empty() {
            return None;
        }
        let m = median(&mut v);
        Some((m, v[0], v[v.len() - 1]))
    }

    /// The text above the bar: its value, and its ratio to the baseline.
    fn caption(&self, value: f64) -> String {
        match self.baseline.filter(|b| b.is_finite() && *b != 0.0) {
            Some(b) => format!("{} ({:.2}×)", si(value), value / b),
            None => si(value),
        }
    }
}

/// One line of a line plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            name: name.into(),
            points,
        }
    }
}

const W: u32 = 1024;
const H: u32 = 640;
const FONT: &str = "sans-serif";

fn prepare(path: &Path) -> Result<(), ReportError> {
    if let Some(p) = path.parent() {
        if !p.as_os_str().is_empty() {
            std::fs::create_dir_all(p)?;
        }
    }
    Ok(())
}

fn range(lo: f64, hi: f64, log: bool) -> (f64, f64) {
    if log {
        let lo = if lo > 0.0 { lo } else { 1e-3 };
        let hi = if hi > lo { hi } else { lo * 10.0 };
        (lo / 1.5, hi * 1.5)
    } else if hi > lo {
        let pad = (hi - lo) * 0.05;
        (
            if lo >= 0.0 {
                0.0f64.max(lo - pad)
            } else {
                lo - pad
            },
            hi + pad,
        )
    } else {
        (lo - 1.0, hi + 1.0)
    }
}

/// Line plot with one line (and point markers) per series; PNG at `path`.
pub fn line_plot(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    log_y: bool,
) -> Result<(), ReportError> {
    let pts = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|p| p.0.is_finite() && p.1.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    let mut any = false;
    for &(x, y) in pts {
        if log_y && y <= 0.0 {
            continue;
        }
        any = true;
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !any {
        return Err(ReportError::Empty("line_plot: no finite points"));
    }
    prepare(path)?;
    let (x0, x1) = range(x0, x1, false);
    let (y0, y1) = range(y0, y1, log_y);
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut b = ChartBuilder::on(&root);
    b.caption(title, (FONT, 24))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(80);
    macro_rules! body {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .x_label_formatter(&|v| si(*v))
                .y_label_formatter(&|v| si(*v))
                .label_style((FONT, 15))
                .draw()
                .map_err(perr)?;
            for (i, s) in series.iter().enumerate() {
                let color = Palette99::pick(i).to_rgba().stroke_width(2);
                let data: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|p| p.0.is_finite() && p.1.is_finite() && (!log_y || p.1 > 0.0))
                    .collect();
                chart
                    .draw_series(LineSeries::new(data.clone(), color))
                    .map_err(perr)?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
                chart
                    .draw_series(
                        data.into_iter()
                            .map(move |p| Circle::new(p, 3, color.filled())),
                    )
                    .map_err(perr)?;
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font((FONT, 15))
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(perr)?;
        }};
    }
    if log_y {
        body!(b
            .build_cartesian_2d(x0..x1, (y0..y1).log_scale())
            .map_err(perr)?);
    } else {
        body!(b.build_cartesian_2d(x0..x1, y0..y1).map_err(perr)?);
    }
    root.present().map_err(perr)?;
    Ok(())
}

/// Vertical bar chart, one labelled bar per entry (one value each); PNG at
/// `path`. [`bar_plot_runs`] with one run per bar and no baseline.
pub fn bar_plot(
    path: &Path,
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
) -> Result<(), ReportError> {
    let bars: Vec<Bar> = bars
        .iter()
        .map(|(l, v)| Bar::new(l.clone(), vec![*v]))
        .collect();
    bar_plot_runs(path, title, y_label, &bars)
}

/// Vertical bar chart: per [`Bar`] the median of its runs, a min–max whisker when
/// there were several, and its value (and ratio to its baseline) above it. A bar
/// with no finite run gets no slot. PNG at `path`.
pub fn bar_plot_runs(
    path: &Path,
    title: &str,
    y_label: &str,
    bars: &[Bar],
) -> Result<(), ReportError> {
    let drawn: Vec<(&Bar, (f64, f64, f64))> = bars
        .iter()
        .filter_map(|b| Some((b, b.summary()?)))
        .collect();
    if drawn.is_empty() {
        return Err(ReportError::Empty("bar_plot: no bars with a value"));
    }
    prepare(path)?;
    let ymax = drawn.iter().map(|(_, s)| s.2).fold(0.0f64, f64::max);
    // Room above the tallest whisker for its label.
    let ymax = if ymax > 0.0 { ymax * 1.15 } else { 1.0 };
    let n = drawn.len();
    // Many bars: their names stand upright below them instead of overlapping.
    let upright = n > 8;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 24))
        .margin(15)
        .x_label_area_size(if upright { 150 } else { 60 })
        .y_label_area_size(80)
        // `a..b` segmented has a slot for `b` too: the last bar's index ends it.
        .build_cartesian_2d((0..n as i32 - 1).into_segmented(), 0.0..ymax)
        .map_err(perr)?;
    let labels: Vec<String> = drawn.iter().map(|(b, _)| b.label.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) if !upright => {
                labels.get(*i as usize).cloned().unwrap_or_default()
            }
            _ => String::new(),
        })
        .y_label_formatter(&|v| si(*v))
        .label_style((FONT, 14))
        .draw()
        .map_err(perr)?;
    if upright {
        // Each name reads downwards from just below its bar.
        for (i, l) in labels.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(SegmentValue::CenterOf(i as i32), 0.0));
            root.draw(&Text::new(
                l.clone(),
                (x + 6, y + 8),
                (FONT, 13).into_font().transform(FontTransform::Rotate90),
            ))
            .map_err(perr)?;
        }
    }
    chart
        .draw_series(drawn.iter().enumerate().map(|(i, (_, (m, _, _)))| {
            let mut r = Rectangle::new(
                [
                    (SegmentValue::Exact(i as i32), 0.0),
                    (SegmentValue::Exact(i as i32 + 1), m.max(0.0)),
                ],
                Palette99::pick(i).filled(),
            );
            r.set_margin(0, 0, 8, 8);
            r
        }))
        .map_err(perr)?;
    // Whiskers: the runs' range, where there was more than one run.
    chart
        .draw_series(
            drawn
                .iter()
                .enumerate()
                .filter(|(_, (b, _))| b.runs.len() > 1)
                .map(|(i, (_, (_, lo, hi)))| {
                    PathElement::new(
                        vec![
                            (SegmentValue::CenterOf(i as i32), lo.max(0.0)),
                            (SegmentValue::CenterOf(i as i32), hi.max(0.0)),
                        ],
                        BLACK.stroke_width(2),
                    )
                }),
        )
        .map_err(perr)?;
    chart
        .draw_series(drawn.iter().enumerate().map(|(i, (b, (m, _, hi)))| {
            Text::new(
                b.caption(*m),
                (
                    SegmentValue::CenterOf(i as i32),
                    hi.max(*m).max(0.0) + ymax * 0.02,
                ),
                (FONT, if upright { 11 } else { 14 })
                    .into_font()
                    .color(&BLACK)
                    .pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// Histogram from pre-bucketed data: `(bucket start, count)`, buckets sorted by
/// start; each bucket extends to the next start (the last one to start + the
/// previous width).
pub fn histogram_plot(
    path: &Path,
    title: &str,
    x_label: &str,
    buckets: &[(f64, u64)],
) -> Result<(), ReportError> {
    if buckets.is_empty() {
        return Err(ReportError::Empty("histogram_plot: no buckets"));
    }
    prepare(path)?;
    let width_of = |i: usize| -> f64 {
        if i + 1 < buckets.len() {
            buckets[i + 1].0 - buckets[i].0
        } else if i > 0 {
            buckets[i].0 - buckets[i - 1].0
        } else {
            1.0
        }
    };
    let x0 = buckets[0].0;
    let last = buckets.len() - 1;
    let x1 = buckets[last].0 + width_of(last);
    let cmax = buckets.iter().map(|b| b.1).max().unwrap_or(1).max(1) as f64 * 1.1;
    let root = BitMapBackend::new(path, (W, H)).into_drawing_area();
    root.fill(&WHITE).map_err(perr)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FONT, 24))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x0..x1, 0.0..cmax)
        .map_err(perr)?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("count")
        .x_label_formatter(&|v| si(*v))
        .y_label_formatter(&|v| si(*v))
        .label_style((FONT, 15))
        .draw()
        .map_err(perr)?;
    chart
        .draw_series(buckets.iter().enumerate().map(|(i, &(s, c))| {
            Rectangle::new(
                [(s, 0.0), (s + width_of(i), c as f64)],
                BLUE.mix(0.6).filled(),
            )
        }))
        .map_err(perr)?;
    root.present().map_err(perr)?;
    Ok(())
}

/// Percentile `p` in `0..=100` of already sorted data, linear interpolation
/// between closest ranks. NaN for empty input.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let rank = (p.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            let f = rank - lo as f64;
            sorted[lo] + (sorted[hi] - sorted[lo]) * f
        }
    }
}

/// Median (sorts `v` in place). NaN for empty input.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    percentile(v, 50.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats() {
        assert!(percentile(&[], 50.0).is_nan());
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 50.0), 2.5);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 100.0), 4.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.0), 1.0);
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), 3.0);
    }

    #[test]
    fn si_units_for_axes_and_labels() {
        assert_eq!(si(160000.0), "160k");
        assert_eq!(si(1.5e9), "1.5G");
        assert_eq!(si(12_345_678.0), "12.3M");
        assert_eq!(si(999.0), "999");
        assert_eq!(si(0.25), "0.25");
        assert_eq!(si(0.0), "0");
        assert_eq!(si(-2500.0), "-2.5k");
        assert_eq!(si(f64::NAN), "-");
        let b = Bar::new("u", vec![3.0, 1.0, 2.0]).against(1.0);
        assert_eq!(b.summary(), Some((2.0, 1.0, 3.0)));
        assert_eq!(b.caption(2e6), "2M (2000000.00×)");
        assert_eq!(Bar::new("l", vec![5e3]).caption(5e3), "5k");
    }

    #[test]
    fn table_text_and_markdown() {
        let mut t = Table::new("T", vec!["name".into(), "value".into()]);
        t.row(vec!["a".into(), "1".into()])
            .row(vec!["long".into(), "12345".into()]);
        let s = t.to_text();
        assert!(s.contains("a         1"), "{s}");
        let m = t.to_markdown();
        assert!(m.contains("| long | 12345 |"), "{m}");
        assert!(m.contains("|---|---:|"), "{m}");
    }

    #[test]
    fn plots_and_json() {
        let dir = std::env::temp_dir().join(format!("usnet-report-test-{}", std::process::id()));
        let s = vec![
            Series::new("a", vec![(0.0, 1.0), (1.0, 2.0), (2.0, 4.0)]),
            Series::new("b", vec![(0.0, 2.0), (1.0, 1.0), (2.0, 0.5)]),
        ];
        line_plot(&dir.join("l.png"), "lines", "x", "y", &s, false).unwrap();
        line_plot(&dir.join("log.png"), "log", "x", "y", &s, true).unwrap();
        bar_plot(
            &dir.join("b.png"),
            "bars",
            "v",
            &[("x".into(), 1.0), ("y".into(), 3.0)],
        )
        .unwrap();
        bar_plot_runs(
            &dir.join("r.png"),
            "runs",
            "req/s",
            &[
                Bar::new("linux", vec![150e3, 160e3, 170e3]),
                Bar::new("usnet", vec![200e3, 210e3, 190e3]).against(160e3),
                Bar::new("missing", vec![f64::NAN]),
            ],
        )
        .unwrap();
        assert!(matches!(
            bar_plot_runs(&dir.join("e.png"), "e", "v", &[Bar::new("x", vec![])]),
            Err(ReportError::Empty(_))
        ));
        histogram_plot(
            &dir.join("h.png"),
            "hist",
            "ns",
            &[(0.0, 3), (10.0, 7), (20.0, 1)],
        )
        .unwrap();
        write_json(&dir.join("sub/x.json"), &serde_json::json!({"a": 1})).unwrap();
        for f in ["l.png", "log.png", "b.png", "r.png", "h.png", "sub/x.json"] {
            assert!(std::fs::metadata(dir.join(f)).unwrap().len() > 0, "{f}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
