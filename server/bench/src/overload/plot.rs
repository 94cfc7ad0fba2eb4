//! The PNG of docs/benchmarks.md: goodput and p99 of admitted requests against offered
//! load, one line per protection, drawn with plotters.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;
use plotters::style::FontStyle;

use super::stats::Step;

/// Registers the TrueType font at `font` as plotters' "sans-serif" (plotters needs one
/// to write labels; the bench does not ship any).
pub fn register_font(font: &Path) -> anyhow::Result<()> {
    let bytes: &'static [u8] = Box::leak(std::fs::read(font)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow!("{} is not a usable TrueType font", font.display()))
}

/// Draws `results` into `path` (PNG, 1500×500: goodput, CRITICAL goodput, p99) with the TrueType font at `font` (plotters
/// needs one to write labels; the bench does not ship any).
pub fn draw(path: &Path, font: &Path, capacity: f64, results: &[(&str, Vec<Step>)]) -> anyhow::Result<()> {
    register_font(font)?;
    let root = BitMapBackend::new(path, (1500, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, rest) = root.split_horizontally(500);
    let (middle, right) = rest.split_horizontally(500);
    let max_x = results.iter().flat_map(|(_, r)| r.iter().map(|s| s.multiple)).fold(1.0, f64::max) * 1.05;
    let colour = |i: usize| Palette99::pick(i).to_rgba();

    let mut chart = ChartBuilder::on(&left)
        .caption("Goodput (2xx within the deadline)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..capacity * 1.25)?;
    chart.configure_mesh().x_desc("offered load (× capacity)").y_desc("goodput (requests/s)").draw()?;
    for (i, (name, rows)) in results.iter().enumerate() {
        let c = colour(i);
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|s| (s.multiple, s.goodput_rps)),
                c.stroke_width(2),
            ))?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart.draw_series(rows.iter().map(|s| Circle::new((s.multiple, s.goodput_rps), 3, c.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;

    let mut chart = ChartBuilder::on(&middle)
        .caption("CRITICAL requests answered in time", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, 0.0..105.0)?;
    chart.configure_mesh().x_desc("offered load (× capacity)").y_desc("% of CRITICAL sent").draw()?;
    for (i, (_, rows)) in results.iter().enumerate() {
        let c = colour(i);
        let pts: Vec<(f64, f64)> =
            rows.iter().map(|s| (s.multiple, s.goodput_ratio_by_criticality[0] * 100.0)).collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
    }

    let max_p99 =
        results.iter().flat_map(|(_, r)| r.iter().map(|s| s.p99_admitted_ms)).fold(10.0, f64::max) * 1.5;
    let mut chart = ChartBuilder::on(&right)
        .caption("p99 of admitted requests", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..max_x, (50.0..max_p99).log_scale())?;
    chart.configure_mesh().x_desc("offered load (× capacity)").y_desc("ms (log)").draw()?;
    for (i, (_, rows)) in results.iter().enumerate() {
        let c = colour(i);
        let pts: Vec<(f64, f64)> = rows.iter().map(|s| (s.multiple, s.p99_admitted_ms.max(50.0))).collect();
        chart.draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))?;
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, c.filled())))?;
    }
    root.present()?;
    Ok(())
}
