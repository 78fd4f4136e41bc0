//! Memory over time as an SVG: reserved bytes per stream and in total, the
//! live total, with failures and relocations marked (plotters, SVG backend).

use plotters::prelude::*;
use std::path::Path;

/// Samples of a run, for plotting.
#[derive(Debug, Clone, Default)]
pub struct Timeline {
    /// The stream names, one per series.
    pub streams: Vec<String>,
    /// What the x axis counts.
    pub x_label: String,
    /// Sample positions.
    pub x: Vec<f64>,
    /// Live bytes per stream at each sample.
    pub live: Vec<Vec<u64>>,
    /// Reserved bytes per stream at each sample.
    pub reserved: Vec<Vec<u64>>,
    /// Where a request failed.
    pub failures: Vec<f64>,
    /// Where allocations were relocated.
    pub relocations: Vec<f64>,
}

impl Timeline {
    /// An empty timeline over `streams`.
    pub fn new(streams: Vec<String>, x_label: &str) -> Self {
        Self {
            streams,
            x_label: x_label.into(),
            ..Self::default()
        }
    }

    /// Add a sample.
    pub fn push(&mut self, x: f64, live: Vec<u64>, reserved: Vec<u64>) {
        self.x.push(x);
        self.live.push(live);
        self.reserved.push(reserved);
    }

    fn totals(series: &[Vec<u64>]) -> Vec<u64> {
        series.iter().map(|s| s.iter().sum()).collect()
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Draw `timeline` to an SVG file.
pub fn write_svg(timeline: &Timeline, path: &Path, title: &str) -> Result<(), String> {
    let root = SVGBackend::new(path, (1200, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let reserved_total = Timeline::totals(&timeline.reserved);
    let live_total = Timeline::totals(&timeline.live);
    let x_max = timeline.x.last().copied().unwrap_or(1.0).max(1e-9);
    let y_max = reserved_total
        .iter()
        .chain(live_total.iter())
        .copied()
        .max()
        .unwrap_or(1) as f64
        / MIB
        * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max.max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(timeline.x_label.as_str())
        .y_desc("MiB")
        .draw()
        .map_err(|e| e.to_string())?;
    let series = |values: &[u64]| -> Vec<(f64, f64)> {
        timeline
            .x
            .iter()
            .zip(values)
            .map(|(x, v)| (*x, *v as f64 / MIB))
            .collect()
    };
    chart
        .draw_series(LineSeries::new(
            series(&reserved_total),
            BLACK.stroke_width(3),
        ))
        .map_err(|e| e.to_string())?
        .label("reserved, total")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(3)));
    chart
        .draw_series(LineSeries::new(series(&live_total), BLUE.stroke_width(2)))
        .map_err(|e| e.to_string())?
        .label("live, total")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE.stroke_width(2)));
    if timeline.streams.len() > 1 {
        for (index, name) in timeline.streams.iter().enumerate() {
            const COLORS: [RGBColor; 6] = [
                RGBColor(230, 120, 0),
                RGBColor(0, 150, 150),
                RGBColor(170, 0, 170),
                RGBColor(120, 120, 0),
                RGBColor(0, 160, 60),
                RGBColor(120, 60, 0),
            ];
            let color = COLORS[index % COLORS.len()].to_rgba();
            let values: Vec<u64> = timeline.reserved.iter().map(|s| s[index]).collect();
            chart
                .draw_series(LineSeries::new(series(&values), color.stroke_width(1)))
                .map_err(|e| e.to_string())?
                .label(format!("reserved, {name}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        }
    }
    let at = |x: f64| -> f64 {
        let index = timeline
            .x
            .partition_point(|v| *v < x)
            .min(reserved_total.len().saturating_sub(1));
        reserved_total.get(index).copied().unwrap_or(0) as f64 / MIB
    };
    if !timeline.failures.is_empty() {
        chart
            .draw_series(
                timeline
                    .failures
                    .iter()
                    .map(|x| Cross::new((*x, at(*x)), 6, RED.stroke_width(2))),
            )
            .map_err(|e| e.to_string())?
            .label("failed request")
            .legend(|(x, y)| Cross::new((x + 10, y), 6, RED.stroke_width(2)));
    }
    if !timeline.relocations.is_empty() {
        chart
            .draw_series(
                timeline
                    .relocations
                    .iter()
                    .map(|x| TriangleMarker::new((*x, at(*x)), 6, GREEN.filled())),
            )
            .map_err(|e| e.to_string())?
            .label("relocation")
            .legend(|(x, y)| TriangleMarker::new((x + 10, y), 6, GREEN.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}
