//! Placement of a chart's parts on the canvas, and the drawing of each part.

use super::axis::Axis;
use super::canvas::{Canvas, Color, Rect};
use super::font::{draw_text, draw_text_upward, fit_text, text_height, text_width};
use super::{series_color, Chart, ChartKind};

/// Blank space around the chart and between its parts.
const PADDING: i64 = 10;
const TICK_LENGTH: i64 = 5;
/// Gap between a tick mark and its label.
const LABEL_GAP: i64 = 4;
const TITLE_SCALE: i64 = 2;
const SERIES_THICKNESS: f64 = 2.0;
const MARKER_DIAMETER: f64 = 6.0;
const SWATCH_SIZE: i64 = 12;
const LEGEND_ROW_HEIGHT: i64 = 16;
/// Bar charts with more categories than this are assumed to be mistakes and the extra points skipped.
const MAX_CATEGORIES: usize = 10_000;
const TEXT_COLOR: Color = Color::rgb(30, 30, 30);

/// A point already checked to be drawable, or a gap where a line chart's polyline breaks.
type Plottable = Option<(f64, f64)>;

/// The chart's drawable points and the axes that fit them.
struct Frame {
    points: Vec<Vec<Plottable>>,
    x_axis: Axis,
    y_axis: Axis,
    category_count: usize,
    has_data: bool,
}

/// Draws every part of `chart` onto `canvas`.
pub fn draw_chart(canvas: &mut Canvas, chart: &Chart) {
    draw_title(canvas, &chart.title);
    let frame = fit_frame(chart);
    let legend_width = legend_width(chart, canvas.width());
    let plot = plot_area(canvas, chart, &frame.y_axis, legend_width);
    if plot.width() < 20 || plot.height() < 20 {
        // Too small for axes; the title alone is the most useful thing left to show.
        return;
    }
    draw_y_ticks(canvas, plot, &frame.y_axis);
    match chart.kind {
        ChartKind::Lines => {
            draw_x_ticks(canvas, plot, &frame.x_axis);
            draw_lines(canvas, plot, &frame);
        }
        ChartKind::Bars => {
            draw_categories(canvas, plot, &chart.categories, frame.category_count);
            draw_bars(canvas, plot, &frame);
        }
    }
    canvas.stroke_rect(plot, Color::DARK_GREY);
    draw_axis_labels(canvas, chart, plot);
    draw_legend(canvas, chart, plot);
    if !frame.has_data {
        let note = "no data";
        let left = plot.left + (plot.width() - text_width(note, 2)) / 2;
        let top = plot.top + (plot.height() - text_height(2)) / 2;
        draw_text(canvas, left, top, note, Color::DARK_GREY, 2);
    }
}

/// Draws the title centred at the top, shrinking or shortening it when the canvas is narrow.
fn draw_title(canvas: &mut Canvas, title: &str) {
    let available = i64::from(canvas.width()) - 2 * PADDING;
    let scale = if text_width(title, TITLE_SCALE) <= available {
        TITLE_SCALE
    } else {
        1
    };
    let title = fit_text(title, available, scale);
    let left = (i64::from(canvas.width()) - text_width(&title, scale)) / 2;
    draw_text(canvas, left, PADDING, &title, TEXT_COLOR, scale);
}

/// Filters each series down to drawable points and builds axes that contain them.
fn fit_frame(chart: &Chart) -> Frame {
    let points: Vec<Vec<Plottable>> = chart
        .series
        .iter()
        .map(|series| {
            series
                .points
                .iter()
                .map(|point| plottable(chart, *point))
                .collect()
        })
        .collect();
    let valid = || points.iter().flatten().flatten();
    let has_data = valid().next().is_some();
    let y_range = extent(valid().map(|point| point.1));
    let y_axis = match (chart.log_y, y_range) {
        (true, Some((low, high))) => Axis::logarithmic(low, high),
        (true, None) => Axis::logarithmic(1.0, 10.0),
        // Linear value axes start at zero so bar heights and line levels compare honestly.
        (false, Some((low, high))) => Axis::linear(low.min(0.0), high.max(0.0)),
        (false, None) => Axis::linear(0.0, 1.0),
    };
    let x_range = extent(valid().map(|point| point.0));
    let x_axis = match (chart.log_x, x_range) {
        (true, Some((low, high))) => Axis::logarithmic(low, high),
        (true, None) => Axis::logarithmic(1.0, 10.0),
        (false, Some((low, high))) => Axis::linear(low, high),
        (false, None) => Axis::linear(0.0, 1.0),
    };
    // Only bar charts have categories; their x values were already bounded by `plottable`.
    let category_count = match (chart.kind, x_range) {
        (ChartKind::Bars, Some((_, high))) => chart.categories.len().max(high as usize + 1),
        _ => chart.categories.len(),
    };
    Frame {
        points,
        x_axis,
        y_axis,
        category_count,
        has_data,
    }
}

/// Returns the point if it can be drawn on this chart's axes.
///
/// Bar charts additionally need a whole, non-negative category index, which is rounded
/// so that indexes computed in floating point still land on their category.
fn plottable(chart: &Chart, (x, y): (f64, f64)) -> Plottable {
    if !x.is_finite() || !y.is_finite() || (chart.log_y && y <= 0.0) {
        return None;
    }
    match chart.kind {
        ChartKind::Lines if chart.log_x && x <= 0.0 => None,
        ChartKind::Lines => Some((x, y)),
        ChartKind::Bars => {
            let index = x.round();
            (index >= 0.0 && index < MAX_CATEGORIES as f64).then_some((index, y))
        }
    }
}

/// The smallest and largest of `values`, or `None` when there are none.
fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |range, value| match range {
        None => Some((value, value)),
        Some((low, high)) => Some((low.min(value), high.max(value))),
    })
}

/// Legend names, shortened so the legend never takes more than a third of the canvas.
fn legend_names(chart: &Chart, canvas_width: u32) -> Vec<String> {
    let limit = i64::from(canvas_width) / 3 - SWATCH_SIZE - 2 * PADDING;
    chart
        .series
        .iter()
        .enumerate()
        .map(|(index, series)| {
            let name = if series.name.is_empty() {
                format!("series {}", index + 1)
            } else {
                series.name.clone()
            };
            fit_text(&name, limit, 1)
        })
        .collect()
}

/// Horizontal space the legend needs to the right of the plot, including its gap.
fn legend_width(chart: &Chart, canvas_width: u32) -> i64 {
    let names = legend_names(chart, canvas_width);
    match names.iter().map(|name| text_width(name, 1)).max() {
        Some(widest) => PADDING + SWATCH_SIZE + 6 + widest,
        None => 0,
    }
}

/// The rectangle inside the axes, after room for the title, labels, ticks and legend.
fn plot_area(canvas: &Canvas, chart: &Chart, y_axis: &Axis, legend_width: i64) -> Rect {
    let label_room = text_height(1) + PADDING;
    let widest_tick = y_axis
        .ticks
        .iter()
        .map(|tick| text_width(&y_axis.label(*tick), 1))
        .max();
    let top = if chart.title.is_empty() {
        PADDING
    } else {
        2 * PADDING + text_height(TITLE_SCALE)
    };
    let y_label_room = if chart.y_label.is_empty() {
        0
    } else {
        label_room
    };
    let x_label_room = if chart.x_label.is_empty() {
        0
    } else {
        label_room
    };
    Rect {
        left: PADDING + y_label_room + widest_tick.unwrap_or(0) + LABEL_GAP + TICK_LENGTH,
        top,
        right: i64::from(canvas.width()) - PADDING - legend_width,
        bottom: i64::from(canvas.height())
            - PADDING
            - x_label_room
            - text_height(1)
            - LABEL_GAP
            - TICK_LENGTH,
    }
}

/// The horizontal pixel coordinate of axis fraction `fraction` inside `plot`.
fn x_pixel(plot: Rect, fraction: f64) -> f64 {
    plot.left as f64 + fraction * (plot.width() - 1) as f64 + 0.5
}

/// The vertical pixel coordinate of axis fraction `fraction`, measured upwards from the bottom.
fn y_pixel(plot: Rect, fraction: f64) -> f64 {
    (plot.bottom - 1) as f64 - fraction * (plot.height() - 1) as f64 + 0.5
}

/// Whether a tick's axis fraction lies on the axis, allowing for rounding.
fn on_axis(fraction: f64) -> bool {
    (-1e-9..=1.0 + 1e-9).contains(&fraction)
}

/// Draws horizontal grid lines, tick marks and labels for the value axis.
fn draw_y_ticks(canvas: &mut Canvas, plot: Rect, axis: &Axis) {
    for tick in &axis.ticks {
        let fraction = axis.fraction(*tick);
        if !on_axis(fraction) {
            continue;
        }
        let y = y_pixel(plot, fraction).floor() as i64;
        canvas.fill_rect(plot.left, y, plot.width(), 1, Color::LIGHT_GREY);
        canvas.fill_rect(plot.left - TICK_LENGTH, y, TICK_LENGTH, 1, Color::DARK_GREY);
        let label = axis.label(*tick);
        let left = plot.left - TICK_LENGTH - LABEL_GAP - text_width(&label, 1);
        draw_text(canvas, left, y - 3, &label, TEXT_COLOR, 1);
    }
}

/// Draws vertical grid lines, tick marks and labels for a line chart's x axis.
///
/// Labels that would touch their neighbours are thinned out to every second, third, … tick.
fn draw_x_ticks(canvas: &mut Canvas, plot: Rect, axis: &Axis) {
    let ticks: Vec<(f64, String)> = axis
        .ticks
        .iter()
        .filter(|tick| on_axis(axis.fraction(**tick)))
        .map(|tick| (x_pixel(plot, axis.fraction(*tick)), axis.label(*tick)))
        .collect();
    let widest = ticks
        .iter()
        .map(|(_, label)| text_width(label, 1))
        .max()
        .unwrap_or(0);
    let spacing = plot.width() as f64 / ticks.len().max(1) as f64;
    let stride = ((widest + 2 * LABEL_GAP) as f64 / spacing.max(1.0))
        .ceil()
        .max(1.0) as usize;
    for (index, (x, label)) in ticks.iter().enumerate() {
        let x = x.floor() as i64;
        canvas.fill_rect(x, plot.top, 1, plot.height(), Color::LIGHT_GREY);
        canvas.fill_rect(x, plot.bottom, 1, TICK_LENGTH, Color::DARK_GREY);
        if index % stride == 0 {
            let left = x - text_width(label, 1) / 2;
            draw_text(
                canvas,
                left,
                plot.bottom + TICK_LENGTH + LABEL_GAP,
                label,
                TEXT_COLOR,
                1,
            );
        }
    }
}

/// Draws each series as a polyline, with markers when the points are few enough to tell apart.
fn draw_lines(canvas: &mut Canvas, plot: Rect, frame: &Frame) {
    // Lines may spill a few pixels past the frame so points on the edge keep their full marker.
    let margin = MARKER_DIAMETER as i64;
    canvas.set_clip(Some(Rect {
        left: plot.left - margin,
        top: plot.top - margin,
        right: plot.right + margin,
        bottom: plot.bottom + margin,
    }));
    for (index, points) in frame.points.iter().enumerate() {
        let color = series_color(index);
        let pixels: Vec<Option<(f64, f64)>> = points
            .iter()
            .map(|point| point.and_then(|(x, y)| to_pixel(plot, frame, x, y)))
            .collect();
        for pair in pixels.windows(2) {
            if let (Some(start), Some(end)) = (pair[0], pair[1]) {
                canvas.draw_line(start, end, SERIES_THICKNESS, color);
            }
        }
        let drawn = pixels.iter().flatten().count() as i64;
        if drawn * 3 * MARKER_DIAMETER as i64 <= plot.width() {
            for point in pixels.iter().flatten() {
                canvas.draw_dot(*point, MARKER_DIAMETER, color);
            }
        }
    }
    canvas.set_clip(None);
}

/// Maps a data point to pixel coordinates, or `None` if an axis cannot show it.
fn to_pixel(plot: Rect, frame: &Frame, x: f64, y: f64) -> Option<(f64, f64)> {
    let horizontal = frame.x_axis.fraction(x);
    let vertical = frame.y_axis.fraction(y);
    (horizontal.is_finite() && vertical.is_finite())
        .then(|| (x_pixel(plot, horizontal), y_pixel(plot, vertical)))
}

/// Draws the category labels centred under each bar group, shortened to the group's width.
///
/// Groups without a label are numbered by their index so bars never go unexplained.
fn draw_categories(canvas: &mut Canvas, plot: Rect, categories: &[String], count: usize) {
    let group_width = plot.width() as f64 / count.max(1) as f64;
    for index in 0..count {
        let name = categories
            .get(index)
            .cloned()
            .unwrap_or_else(|| index.to_string());
        let label = fit_text(&name, group_width as i64 - 2, 1);
        let centre = plot.left as f64 + (index as f64 + 0.5) * group_width;
        let left = centre as i64 - text_width(&label, 1) / 2;
        canvas.fill_rect(centre as i64, plot.bottom, 1, TICK_LENGTH, Color::DARK_GREY);
        draw_text(
            canvas,
            left,
            plot.bottom + TICK_LENGTH + LABEL_GAP,
            &label,
            TEXT_COLOR,
            1,
        );
    }
}

/// Draws one bar per series in each category, side by side within the group.
fn draw_bars(canvas: &mut Canvas, plot: Rect, frame: &Frame) {
    let group_width = plot.width() as f64 / frame.category_count.max(1) as f64;
    let bar_width = group_width * 0.8 / frame.points.len().max(1) as f64;
    // Bars grow from zero on a linear axis; a logarithmic axis has no zero, so they grow from its floor.
    let baseline_fraction = if frame.y_axis.logarithmic {
        0.0
    } else {
        frame.y_axis.fraction(0.0)
    };
    let baseline = y_pixel(plot, baseline_fraction.clamp(0.0, 1.0)).round() as i64;
    canvas.set_clip(Some(plot));
    for (series_index, points) in frame.points.iter().enumerate() {
        let color = series_color(series_index);
        for (category, value) in points.iter().flatten() {
            let fraction = frame.y_axis.fraction(*value);
            if !fraction.is_finite() {
                continue;
            }
            let top = y_pixel(plot, fraction.clamp(0.0, 1.0)).round() as i64;
            let left = plot.left as f64
                + category * group_width
                + group_width * 0.1
                + series_index as f64 * bar_width;
            let right = left + bar_width - if bar_width > 4.0 { 1.0 } else { 0.0 };
            let (left, right) = (
                left.round() as i64,
                (right.round() as i64).max(left.round() as i64 + 1),
            );
            canvas.fill_rect(
                left,
                top.min(baseline),
                right - left,
                (top - baseline).abs().max(1),
                color,
            );
        }
    }
    canvas.set_clip(None);
}

/// Draws the x label centred under the plot and the y label reading upwards beside it.
fn draw_axis_labels(canvas: &mut Canvas, chart: &Chart, plot: Rect) {
    let x_label = fit_text(&chart.x_label, plot.width(), 1);
    let left = plot.left + (plot.width() - text_width(&x_label, 1)) / 2;
    let top = i64::from(canvas.height()) - PADDING - text_height(1);
    draw_text(canvas, left, top, &x_label, TEXT_COLOR, 1);
    let y_label = fit_text(&chart.y_label, plot.height(), 1);
    let bottom = plot.top + (plot.height() + text_width(&y_label, 1)) / 2;
    draw_text_upward(canvas, PADDING, bottom, &y_label, TEXT_COLOR, 1);
}

/// Draws a colour swatch and name per series to the right of the plot.
fn draw_legend(canvas: &mut Canvas, chart: &Chart, plot: Rect) {
    let names = legend_names(chart, canvas.width());
    let left = plot.right + PADDING;
    for (index, name) in names.iter().enumerate() {
        let top = plot.top + index as i64 * LEGEND_ROW_HEIGHT;
        canvas.fill_rect(left, top, SWATCH_SIZE, SWATCH_SIZE, series_color(index));
        let text_top = top + (SWATCH_SIZE - 7) / 2;
        draw_text(
            canvas,
            left + SWATCH_SIZE + 6,
            text_top,
            name,
            TEXT_COLOR,
            1,
        );
    }
}
