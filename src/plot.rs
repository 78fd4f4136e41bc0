//! Memory over time as an SVG (plotters, SVG backend): reserved bytes in
//! total and per stream, live bytes, the recording allocator's reserved
//! bytes where the trace has them, the budget as a line, failures and
//! relocations marked. Each bucket of the [`Timeline`] is drawn as a band
//! from its least to its most bytes with a line through the most, so every
//! peak shows. The legend sits beside the chart, never over the data.

pub use crate::timeline::Timeline;
use crate::timeline::{Bucket, Range};
use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// The most markers of one kind drawn (more would bury the lines).
const MAX_MARKERS: usize = 120;

/// A unit to show bytes in: the largest that keeps the axis readable.
fn byte_unit(max: u64) -> (f64, &'static str) {
    const UNITS: [(f64, &str); 5] = [
        (1.0, "bytes"),
        (1024.0, "KiB"),
        (1048576.0, "MiB"),
        (1073741824.0, "GiB"),
        (1099511627776.0, "TiB"),
    ];
    UNITS
        .iter()
        .rev()
        .find(|(size, _)| max as f64 >= *size * 2.0)
        .copied()
        .unwrap_or(UNITS[0])
}

/// `1200`, `45K`, `1.5M`: a count for an axis tick.
fn count_label(value: f64) -> String {
    let magnitude = value.abs();
    let (scaled, suffix) = if magnitude >= 1e9 {
        (value / 1e9, "G")
    } else if magnitude >= 1e6 {
        (value / 1e6, "M")
    } else if magnitude >= 1e4 {
        (value / 1e3, "K")
    } else {
        (value, "")
    };
    let text = format!("{scaled:.1}");
    let text = text.strip_suffix(".0").unwrap_or(&text);
    format!("{text}{suffix}")
}

/// Reads a series' range from a bucket.
type Pick<'a> = Box<dyn Fn(&Bucket) -> Option<Range> + 'a>;

/// One series to draw.
struct Series<'a> {
    name: String,
    color: RGBAColor,
    width: u32,
    band: bool,
    value: Pick<'a>,
}

const STREAM_COLORS: [RGBColor; 6] = [
    RGBColor(230, 120, 0),
    RGBColor(0, 150, 150),
    RGBColor(170, 0, 170),
    RGBColor(120, 120, 0),
    RGBColor(0, 160, 60),
    RGBColor(120, 60, 0),
];

/// Check that an SVG can be written at `path` (before a long run, so a
/// bad path fails at once and loses nothing).
pub fn check_output(path: &Path) -> Result<(), String> {
    let svg = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !svg {
        return Err(format!(
            "{}: a plot is an SVG drawing: name it with .svg",
            path.display()
        ));
    }
    check_directory(path, "the plot")?;
    if path.is_dir() {
        return Err(format!(
            "{}: cannot write the plot: a directory",
            path.display()
        ));
    }
    Ok(())
}

/// Refuse `path` when its directory does not exist: `what` cannot be
/// written there (checked before a long job, not after it).
pub fn check_directory(path: &Path, what: &str) -> Result<(), String> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(format!(
            "{}: cannot write {what}: no directory {}",
            path.display(),
            dir.display()
        ));
    }
    Ok(())
}

/// Draw `timeline` to an SVG file.
pub fn write_svg(timeline: &Timeline, path: &Path, title: &str) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (1400, 720)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let (chart_area, legend_area) = root.split_horizontally(1120);
    let (reserved_peak, live_peak) = timeline.peaks();
    let recorded_peak = timeline
        .buckets
        .iter()
        .filter_map(|b| b.recorded.map(|r| r.max))
        .max()
        .unwrap_or(0);
    let y_top = reserved_peak
        .max(live_peak)
        .max(recorded_peak)
        .max(timeline.budget.unwrap_or(0))
        .max(1);
    let (unit, unit_name) = byte_unit(y_top);
    let x_min = timeline.buckets.first().map_or(0.0, |b| b.start);
    let x_max = timeline
        .buckets
        .last()
        .map_or(1.0, |b| b.end)
        .max(x_min + 1.0);
    let y_max = y_top as f64 / unit * 1.08;
    let mut chart = ChartBuilder::on(&chart_area)
        .caption(title, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(x_min..x_max, 0.0..y_max)
        .map_err(|e| fail(&e))?;
    let x_label = timeline.x_label.clone();
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(unit_name)
        .x_label_formatter(&|x| count_label(*x))
        .y_label_formatter(&|y| count_label(*y))
        .draw()
        .map_err(|e| fail(&e))?;

    let mut series = vec![
        Series {
            name: "reserved, total".into(),
            color: BLACK.to_rgba(),
            width: 2,
            band: true,
            value: Box::new(|b: &Bucket| Some(b.reserved)),
        },
        Series {
            name: "live, total".into(),
            color: BLUE.to_rgba(),
            width: 2,
            band: true,
            value: Box::new(|b: &Bucket| Some(b.live)),
        },
    ];
    if let Some(name) = &timeline.recorded_name {
        series.push(Series {
            name: format!("{name} reserved"),
            color: RGBColor(200, 0, 0).to_rgba(),
            width: 2,
            band: true,
            value: Box::new(|b: &Bucket| b.recorded),
        });
    }
    if timeline.streams.len() > 1 {
        for (index, name) in timeline.streams.iter().enumerate().take(12) {
            series.push(Series {
                name: format!("reserved, {name}"),
                color: STREAM_COLORS[index % STREAM_COLORS.len()].to_rgba(),
                width: 1,
                band: false,
                value: Box::new(move |b: &Bucket| {
                    b.stream_reserved
                        .get(index)
                        .map(|v| Range { min: *v, max: *v })
                }),
            });
        }
    }
    let scaled = |v: u64| v as f64 / unit;
    for s in &series {
        let points: Vec<(&Bucket, Range)> = timeline
            .buckets
            .iter()
            .filter_map(|b| (s.value)(b).map(|r| (b, r)))
            .collect();
        if s.band {
            // Least to most within each bucket: where the line jitters.
            let upper = points.iter().map(|(b, r)| (b.end, scaled(r.max)));
            let lower = points.iter().rev().map(|(b, r)| (b.end, scaled(r.min)));
            let outline: Vec<_> = upper.chain(lower).collect();
            if outline.len() > 2 {
                chart
                    .draw_series(std::iter::once(Polygon::new(outline, s.color.mix(0.15))))
                    .map_err(|e| fail(&e))?;
            }
        }
        let line: Vec<_> = points.iter().map(|(b, r)| (b.end, scaled(r.max))).collect();
        chart
            .draw_series(LineSeries::new(line, s.color.stroke_width(s.width)))
            .map_err(|e| fail(&e))?;
    }
    if let Some(budget) = timeline.budget {
        let y = scaled(budget);
        chart
            .draw_series(DashedLineSeries::new(
                vec![(x_min, y), (x_max, y)],
                8,
                6,
                RED.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?;
    }
    let marks = |pick: &dyn Fn(&Bucket) -> bool| -> Vec<(f64, f64)> {
        // At most MAX_MARKERS, one per stretch of the x axis.
        let stretch = (x_max - x_min) / MAX_MARKERS as f64;
        let mut last = f64::NEG_INFINITY;
        let mut out = Vec::new();
        for bucket in timeline.buckets.iter().filter(|b| pick(b)) {
            if bucket.end - last >= stretch {
                out.push((bucket.end, scaled(bucket.reserved.max)));
                last = bucket.end;
            }
        }
        out
    };
    let failures = marks(&|b| b.failures > 0);
    chart
        .draw_series(
            failures
                .iter()
                .map(|p| Cross::new(*p, 6, RED.stroke_width(2))),
        )
        .map_err(|e| fail(&e))?;
    let relocations = marks(&|b| b.relocated > 0);
    chart
        .draw_series(
            relocations
                .iter()
                .map(|p| TriangleMarker::new(*p, 5, GREEN.filled())),
        )
        .map_err(|e| fail(&e))?;
    draw_legend(
        &legend_area,
        &series,
        timeline.budget.is_some(),
        !failures.is_empty(),
        !relocations.is_empty(),
    )
    .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))
}

/// The legend, in its own area beside the chart.
fn draw_legend(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    series: &[Series<'_>],
    budget: bool,
    failures: bool,
    relocations: bool,
) -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
    let font = ("sans-serif", 15).into_font();
    let mut y = 60;
    let mut row = |draw: &dyn Fn(i32) -> Result<(), DrawingAreaErrorKind<std::io::Error>>,
                   label: &str|
     -> Result<(), DrawingAreaErrorKind<std::io::Error>> {
        draw(y)?;
        area.draw(&Text::new(label.to_string(), (40, y - 8), font.clone()))?;
        y += 24;
        Ok(())
    };
    for s in series {
        let color = s.color;
        let width = s.width;
        row(
            &|y| {
                area.draw(&PathElement::new(
                    vec![(5, y), (32, y)],
                    color.stroke_width(width),
                ))
            },
            &s.name,
        )?;
    }
    if budget {
        row(
            &|y| {
                area.draw(&PathElement::new(
                    vec![(5, y), (32, y)],
                    RED.stroke_width(2),
                ))
            },
            "budget",
        )?;
    }
    if failures {
        row(
            &|y| area.draw(&Cross::new((18, y), 6, RED.stroke_width(2))),
            "failed request",
        )?;
    }
    if relocations {
        row(
            &|y| area.draw(&TriangleMarker::new((18, y), 5, GREEN.filled())),
            "relocation",
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_read_as_counts_and_units_fit() {
        assert_eq!(count_label(1_000_000.0), "1M");
        assert_eq!(count_label(1_500_000.0), "1.5M");
        assert_eq!(count_label(45_000.0), "45K");
        assert_eq!(count_label(800.0), "800");
        assert_eq!(byte_unit(300 << 20).1, "MiB");
        assert_eq!(byte_unit(5 << 30).1, "GiB");
        assert_eq!(byte_unit(100).1, "bytes");
    }
}
