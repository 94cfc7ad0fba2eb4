//! The PNG of `levee-bench overload --target URL --plot FILE`: against offered load, the
//! goodput of each criticality (requests/s answered 2xx within the deadline) with the
//! total and the "everything answered" diagonal, and the p99 of what was admitted per
//! criticality; dashed vertical lines at the capacity and where goodput falls.

use std::path::Path;

use plotters::prelude::*;

use super::plot::register_font;
use super::stats::Step;
use super::target::{Plan, Run, fall};

const CLASSES: [(&str, RGBColor); 3] = [
    ("CRITICAL", RGBColor(200, 30, 30)),
    ("SHEDDABLE_PLUS", RGBColor(230, 140, 0)),
    ("SHEDDABLE", RGBColor(40, 90, 200)),
];

/// Draws the run into `path` (PNG, 1000×500) with the TrueType font at `font`.
pub fn draw(path: &Path, font: &Path, plan: &Plan, run: &Run) -> anyhow::Result<()> {
    register_font(font)?;
    let root = BitMapBackend::new(path, (1000, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(500);
    let steps = &run.steps;
    let max_x = steps.iter().map(|s| s.offered_rps).fold(run.capacity.rps, f64::max) * 1.05;
    let max_y = steps.iter().map(|s| s.goodput_rps).fold(run.capacity.rps, f64::max) * 1.25;
    let (_, falls) = fall(steps);
    let markers: Vec<(f64, &str)> = std::iter::once((run.capacity.rps, "capacity"))
        .chain(falls.map(|i| (steps[i].offered_rps, "goodput falls")))
        .collect();

    let mut chart = ChartBuilder::on(&left)
        .caption("Goodput by criticality", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)?;
    chart
        .configure_mesh()
        .x_desc("offered (requests/s)")
        .y_desc("2xx within the deadline (requests/s)")
        .draw()?;
    chart
        // Clipped here: plotters clamps an end point outside the chart, bending the line.
        .draw_series(LineSeries::new(
            [(0.0, 0.0), (max_x.min(max_y), max_x.min(max_y))],
            BLACK.mix(0.3).stroke_width(1),
        ))?
        .label("offered")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.3).stroke_width(1)));
    chart
        .draw_series(LineSeries::new(
            steps.iter().map(|s| (s.offered_rps, s.goodput_rps)),
            BLACK.stroke_width(2),
        ))?
        .label("all")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
    for (c, (name, colour)) in CLASSES.iter().enumerate() {
        if plan.mix.0[c] == 0 {
            continue;
        }
        let pts: Vec<(f64, f64)> =
            steps.iter().map(|s| (s.offered_rps, s.goodput_rps_by_criticality[c])).collect();
        let colour = *colour;
        chart
            .draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled())))?;
    }
    for (x, label) in &markers {
        chart.draw_series(DashedLineSeries::new(
            [(*x, 0.0), (*x, max_y)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))?;
        chart.draw_series(std::iter::once(Text::new(*label, (*x, max_y * 0.06), ("sans-serif", 14))))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let deadline_ms = plan.deadline.as_secs_f64() * 1000.0;
    let low = steps
        .iter()
        .flat_map(|s| s.p99_admitted_ms_by_criticality)
        .filter(|v| *v > 0.0)
        .fold(deadline_ms, f64::min)
        .max(0.1)
        / 2.0;
    let mut chart = ChartBuilder::on(&right)
        .caption("p99 of admitted requests", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, (low..deadline_ms * 1.5).log_scale())?;
    chart.configure_mesh().x_desc("offered (requests/s)").y_desc("ms (log)").draw()?;
    chart.draw_series(DashedLineSeries::new(
        [(0.0, deadline_ms), (max_x, deadline_ms)],
        6,
        4,
        RED.mix(0.5).stroke_width(1),
    ))?;
    chart.draw_series(std::iter::once(Text::new(
        "deadline",
        (max_x * 0.02, deadline_ms * 1.1),
        ("sans-serif", 14),
    )))?;
    for (c, (_, colour)) in CLASSES.iter().enumerate() {
        if plan.mix.0[c] == 0 {
            continue;
        }
        let pts: Vec<(f64, f64)> = steps
            .iter()
            .map(|s: &Step| (s.offered_rps, s.p99_admitted_ms_by_criticality[c].max(low)))
            .collect();
        chart.draw_series(LineSeries::new(pts.clone(), colour.stroke_width(2)))?;
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, colour.filled())))?;
    }
    for (x, _) in &markers {
        chart.draw_series(DashedLineSeries::new(
            [(*x, low), (*x, deadline_ms * 1.5)],
            6,
            4,
            BLACK.mix(0.5).stroke_width(1),
        ))?;
    }
    root.present()?;
    Ok(())
}
