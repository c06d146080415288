//! Integration tests: charts render to PNG files that decode back with the expected size.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use std::fs::File;
use std::path::PathBuf;

use report::plot::{render_png, Chart, Series};
use report::stats::density;

/// A fresh folder under Cargo's per-target temporary directory, kept for inspection after the run.
fn output_folder() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("report-it")
}

/// Decodes a PNG and returns its width, height and RGB bytes.
fn decode(path: &PathBuf) -> (u32, u32, Vec<u8>) {
    let decoder = png::Decoder::new(File::open(path).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buffer = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buffer).unwrap();
    assert_eq!(info.color_type, png::ColorType::Rgb);
    buffer.truncate(info.buffer_size());
    (info.width, info.height, buffer)
}

/// Renders `chart` to a file named after `name`, decodes it, and checks its size.
fn render_and_decode(chart: &Chart, name: &str, width: u32, height: u32) -> Vec<u8> {
    let path = output_folder().join(format!("{name}.png"));
    render_png(chart, &path, width, height).unwrap();
    let (decoded_width, decoded_height, pixels) = decode(&path);
    assert_eq!((decoded_width, decoded_height), (width, height));
    let mut temporary = path.into_os_string();
    temporary.push(".tmp");
    assert!(!PathBuf::from(temporary).exists());
    pixels
}

/// Renders `chart` and checks that the decoded image has the right size and is not blank.
fn assert_renders(chart: &Chart, name: &str, width: u32, height: u32) {
    let pixels = render_and_decode(chart, name, width, height);
    assert!(
        pixels.iter().any(|byte| *byte != 255),
        "{name} is all white"
    );
}

fn latency_chart() -> Chart {
    let mut chart = Chart::lines(
        "Append latency by batch size",
        "batch size (records)",
        "p99 latency (µs)",
    );
    let sizes = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
    chart.add(Series::new(
        "fsync per record",
        sizes
            .iter()
            .map(|size| (*size, 900.0 + size * 3.0))
            .collect(),
    ));
    chart.add(Series::new(
        "group commit",
        sizes
            .iter()
            .map(|size| (*size, 120.0 + size * 1.5))
            .collect(),
    ));
    chart.add(Series::new(
        "no fsync",
        sizes.iter().map(|size| (*size, 8.0 + size * 0.2)).collect(),
    ));
    chart
}

#[test]
fn a_line_chart_renders_to_a_valid_png() {
    assert_renders(&latency_chart(), "lines", 800, 500);
}

#[test]
fn a_bar_chart_renders_to_a_valid_png() {
    let categories = vec![
        "logging".to_string(),
        "paged".to_string(),
        "throughput".to_string(),
    ];
    let mut chart = Chart::bars("Operations per second", "benchmark", "ops/s", categories);
    chart.add(Series::new(
        "1 replica",
        vec![(0.0, 120_000.0), (1.0, 80_000.0), (2.0, 250_000.0)],
    ));
    chart.add(Series::new(
        "3 replicas",
        vec![(0.0, 70_000.0), (1.0, 45_000.0), (2.0, 150_000.0)],
    ));
    assert_renders(&chart, "bars", 800, 500);
}

#[test]
fn a_log_axis_chart_renders_to_a_valid_png() {
    let mut chart = latency_chart();
    chart.title = "Append latency (log-log)".to_string();
    chart.log_x = true;
    chart.log_y = true;
    chart.series[0].points.push((0.0, 5.0));
    chart.series[1].points.push((256.0, -1.0));
    assert_renders(&chart, "log", 800, 500);
}

#[test]
fn a_density_plot_renders_to_a_valid_png() {
    let samples: Vec<f64> = (0..5000)
        .map(|index| 100.0 + ((index * 7919) % 997) as f64 * ((index % 7) as f64 / 7.0))
        .collect();
    let mut chart = Chart::lines("Latency density", "latency (µs)", "density");
    chart.add(Series::new("append", density(&samples, 60)));
    assert_renders(&chart, "density", 640, 400);
}

#[test]
fn the_font_covers_the_promised_characters() {
    let mut chart = Chart::lines(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789",
        "abcdefghijklmnopqrstuvwxyz .,:;-+_/()%=<>[]*#'\" ×µ",
        "Quick brown fox: jumps (over) the lazy dog!",
    );
    chart.add(Series::new("glyphs: jpqgy", vec![(0.0, 1.0), (1.0, 2.0)]));
    assert_renders(&chart, "font", 800, 300);
}

#[test]
fn rendering_never_panics_on_empty_nan_or_single_point_data() {
    let empty = Chart::lines("empty", "x", "y");
    assert_renders(&empty, "empty", 400, 300);

    let mut nan = Chart::lines("nan", "x", "y");
    nan.add(Series::new(
        "nan",
        vec![(f64::NAN, 1.0), (1.0, f64::NAN), (f64::INFINITY, 2.0)],
    ));
    nan.add(Series::new("", Vec::new()));
    assert_renders(&nan, "nan", 400, 300);

    let mut single = Chart::lines("single", "x", "y");
    single.add(Series::new("one", vec![(3.0, 7.0)]));
    single.log_x = true;
    assert_renders(&single, "single", 400, 300);

    let mut zero_log = Chart::lines("only non-positive values on log axes", "x", "y");
    zero_log.log_y = true;
    zero_log.add(Series::new("zero", vec![(1.0, 0.0), (2.0, -3.0)]));
    assert_renders(&zero_log, "zero-log", 400, 300);

    let mut bars = Chart::bars("bars", "x", "y", Vec::new());
    bars.add(Series::new(
        "odd",
        vec![(-1.0, 3.0), (f64::NAN, 1.0), (1e300, 2.0), (0.0, -5.0)],
    ));
    assert_renders(&bars, "bars-odd", 400, 300);

    let mut tiny = latency_chart();
    tiny.log_y = true;
    assert_renders(&tiny, "tiny", 30, 20);
    // A single pixel has no room for anything, so it only has to decode.
    render_and_decode(&tiny, "one-pixel", 1, 1);

    let mut extreme = Chart::lines("extreme", "x", "y");
    extreme.add(Series::new(
        "huge",
        vec![(-1e308, -1e308), (1e308, 1e308), (1e-300, 0.0)],
    ));
    assert_renders(&extreme, "extreme", 400, 300);
}

#[test]
fn rendering_a_zero_sized_chart_is_an_error_not_a_panic() {
    let path = output_folder().join("zero.png");
    assert!(render_png(&latency_chart(), &path, 0, 100).is_err());
}
