//! A small raster plotting library: line and grouped-bar charts rendered to PNG.
//!
//! It draws into an RGB buffer with its own bitmap font so that benchmarks can emit
//! plots with no dependency beyond the `png` encoder.

mod axis;
mod canvas;
mod font;
mod layout;

pub use axis::{format_tick, nice_step, Axis};
pub use canvas::{Canvas, Color, Rect};

use std::io;
use std::path::Path;

/// One named sequence of `(x, y)` points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// Creates a series from a name and its points.
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
        }
    }
}

/// How a chart draws its series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChartKind {
    /// Each series is a polyline with small markers at its points.
    Lines,
    /// Grouped bars: a point's x is a category index into `Chart::categories`,
    /// and each category shows one bar per series side by side.
    Bars,
}

/// Everything needed to draw one chart.
#[derive(Debug, Clone, PartialEq)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub kind: ChartKind,
    pub series: Vec<Series>,
    /// Labels of the bar groups; unused by line charts.
    pub categories: Vec<String>,
    pub log_x: bool,
    pub log_y: bool,
}

impl Chart {
    /// Creates an empty line chart.
    pub fn lines(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Chart {
        Chart {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            kind: ChartKind::Lines,
            series: Vec::new(),
            categories: Vec::new(),
            log_x: false,
            log_y: false,
        }
    }

    /// Creates an empty grouped-bar chart with the given category labels.
    pub fn bars(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
        categories: Vec<String>,
    ) -> Chart {
        Chart {
            kind: ChartKind::Bars,
            categories,
            ..Chart::lines(title, x_label, y_label)
        }
    }

    /// Appends a series; its colour is picked by its position.
    pub fn add(&mut self, series: Series) {
        self.series.push(series);
    }
}

/// Colours for series in order, chosen to stay distinguishable from each other.
pub const PALETTE: [Color; 8] = [
    Color::rgb(31, 119, 180),
    Color::rgb(255, 127, 14),
    Color::rgb(44, 160, 44),
    Color::rgb(214, 39, 40),
    Color::rgb(148, 103, 189),
    Color::rgb(140, 86, 75),
    Color::rgb(227, 119, 194),
    Color::rgb(127, 127, 127),
];

/// The colour of the series at `index`, cycling through the palette.
pub fn series_color(index: usize) -> Color {
    PALETTE[index % PALETTE.len()]
}

/// Draws `chart` and writes it as a PNG to `path` (via `path.tmp` and a rename).
///
/// Invalid points (NaN, infinities, non-positive values on a log axis) are skipped,
/// and a chart without drawable points still gets its axes and a "no data" note.
pub fn render_png(chart: &Chart, path: &Path, width: u32, height: u32) -> io::Result<()> {
    render(chart, width, height)?.save_png(path)
}

/// Draws `chart` into a new canvas of `width` by `height` pixels.
pub fn render(chart: &Chart, width: u32, height: u32) -> io::Result<Canvas> {
    if width == 0 || height == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("cannot render a {width}x{height} chart"),
        ));
    }
    let mut canvas = Canvas::new(width, height, Color::WHITE);
    layout::draw_chart(&mut canvas, chart);
    Ok(canvas)
}
