//! The bench report's SVG chart ([`Report::to_svg`]): grouped bars of warm and cold median GB/s
//! per backend and peer in situation (a) (the first load of a fresh process), with the fixture's
//! rooflines of the same situation as horizontal lines and the paired runs' ratios in the caption,
//! so the chart and the acceptance pairs of a run are read together.

use anyhow::Result;
use plotters::coord::Shift;
use plotters::coord::ranged1d::SegmentedCoord;
use plotters::coord::types::{RangedCoordf64, RangedCoordu32};
use plotters::prelude::*;

use crate::report::{Cache, Cell, Kind, Mode, Report, Scope, Situation};

/// Warm bars and the warm roofline.
const WARM_COLOR: RGBColor = RGBColor(232, 120, 40);
/// Cold bars and the device roofline.
const COLD_COLOR: RGBColor = RGBColor(40, 100, 180);

/// The chart's coordinates: one segment per subject, GB/s upwards.
type Chart<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<SegmentedCoord<RangedCoordu32>, RangedCoordf64>>;

/// A plotters error, which borrows its backend, as an owned error.
fn plot_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

impl Report {
    /// Grouped bars (warm and cold median GB/s per backend and peer, full scope, owned mode,
    /// situation (a)) for `fixture`, with the warm and device rooflines as horizontal lines, as an
    /// SVG document.
    pub fn to_svg(&self, fixture: &str) -> Result<String> {
        let data = ChartData::of(self, fixture);
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (160 * data.slots() + 200, 520)).into_drawing_area();
            root.fill(&WHITE).map_err(plot_error)?;
            let mut chart = axes(&root, &caption(self, fixture), &data)?;
            draw_bars(&mut chart, &data)?;
            draw_rooflines(&mut chart, &data)?;
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(plot_error)?;
            root.present().map_err(plot_error)?;
        }
        Ok(svg)
    }
}

/// What one fixture's chart shows.
struct ChartData<'a> {
    /// The measured cells of the loaders and peers (full scope, owned mode).
    cells: Vec<&'a Cell>,
    /// Their subjects, in report order, each once.
    subjects: Vec<&'a str>,
    /// The warm roofline, GB/s.
    warm_gbps: Option<f64>,
    /// The device roofline, GB/s.
    device_gbps: Option<f64>,
    /// Top of the y axis: the highest value plus headroom for the legend.
    top_gbps: f64,
}

impl<'a> ChartData<'a> {
    fn of(report: &'a Report, fixture: &str) -> ChartData<'a> {
        let cells: Vec<&Cell> = report
            .cells
            .iter()
            .filter(|c| c.fixture == fixture && c.kind != Kind::Roofline)
            .filter(|c| c.situation == Situation::FirstLoad)
            .filter(|c| c.scope == Scope::Full && c.mode == Mode::Owned && c.median().is_some())
            .collect();
        let mut subjects: Vec<&str> = Vec::new();
        for c in &cells {
            if !subjects.contains(&c.subject.as_str()) {
                subjects.push(&c.subject);
            }
        }
        let rooflines = report.rooflines_of(fixture, Situation::FirstLoad);
        let warm_gbps = rooflines.and_then(|r| r.warm_gbps);
        let device_gbps = rooflines.and_then(|r| r.device_gbps);
        let top_gbps = cells
            .iter()
            .filter_map(|c| c.median())
            .chain(warm_gbps)
            .chain(device_gbps)
            .fold(0.0f64, f64::max);
        ChartData { cells, subjects, warm_gbps, device_gbps, top_gbps: top_gbps.max(0.1) * 1.15 }
    }

    /// One slot per subject (at least one, so an empty chart still has an axis).
    fn slots(&self) -> u32 {
        self.subjects.len().max(1) as u32
    }

    /// The median GB/s of `subject` with `cache`.
    fn value(&self, subject: &str, cache: Cache) -> Option<f64> {
        self.cells.iter().find(|c| c.subject == subject && c.cache == cache).and_then(|c| c.median())
    }
}

/// The chart's title: the fixture, the situation and the paired ratios of the same run.
fn caption(report: &Report, fixture: &str) -> String {
    let pairs: Vec<String> = report
        .pairs
        .iter()
        .filter(|p| p.fixture == fixture)
        .filter_map(|p| p.ratio().map(|r| format!("{} {:.2}", p.cache.as_str(), r.median)))
        .collect();
    let paired = if pairs.is_empty() {
        String::new()
    } else {
        format!("; paired auto/roofline: {}", pairs.join(", "))
    };
    format!("{fixture}, full owned load, {} (GB/s){paired}", Situation::FirstLoad.label())
}

/// The caption, the axes and their labels.
fn axes<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    data: &ChartData<'_>,
) -> Result<Chart<'a, 'b>> {
    let n = data.slots();
    let mut chart = ChartBuilder::on(root)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d((0u32..n - 1).into_segmented(), 0f64..data.top_gbps)
        .map_err(plot_error)?;
    let labels: Vec<String> = data.subjects.iter().map(|s| s.to_string()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n as usize + 1)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => labels.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .y_desc("GB/s (median)")
        .draw()
        .map_err(plot_error)?;
    Ok(chart)
}

/// A warm bar in the left half of each subject's slot, a cold bar in the right half.
fn draw_bars(chart: &mut Chart<'_, '_>, data: &ChartData<'_>) -> Result<()> {
    for (cache, color) in [(Cache::Warm, WARM_COLOR), (Cache::Cold, COLD_COLOR)] {
        let bars: Vec<Rectangle<(SegmentValue<u32>, f64)>> = data
            .subjects
            .iter()
            .enumerate()
            .filter_map(|(i, s)| data.value(s, cache).map(|v| (i as u32, v)))
            .map(|(i, v)| {
                let (left, right) = match cache {
                    Cache::Warm => (SegmentValue::Exact(i), SegmentValue::CenterOf(i)),
                    Cache::Cold => (SegmentValue::CenterOf(i), SegmentValue::Exact(i + 1)),
                };
                let mut bar = Rectangle::new([(left, 0.0), (right, v)], color.filled());
                match cache {
                    Cache::Warm => bar.set_margin(0, 0, 14, 1),
                    Cache::Cold => bar.set_margin(0, 0, 1, 14),
                };
                bar
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(plot_error)?
            .label(cache.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    Ok(())
}

/// The warm and device rooflines as lines across the chart, where measured.
fn draw_rooflines(chart: &mut Chart<'_, '_>, data: &ChartData<'_>) -> Result<()> {
    let lines =
        [("warm roofline", data.warm_gbps, WARM_COLOR), ("device roofline", data.device_gbps, COLD_COLOR)];
    for (label, level, color) in lines {
        let Some(level) = level else { continue };
        let style = ShapeStyle { color: color.to_rgba(), filled: false, stroke_width: 2 };
        chart
            .draw_series(LineSeries::new(
                [(SegmentValue::Exact(0), level), (SegmentValue::Exact(data.slots()), level)],
                style,
            ))
            .map_err(plot_error)?
            .label(format!("{label} {level:.2} GB/s"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], style));
    }
    Ok(())
}
