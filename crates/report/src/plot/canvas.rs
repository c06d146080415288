//! An RGB pixel buffer with the few drawing operations charts need.
//!
//! Coordinates are signed so callers can pass points that fall off the canvas;
//! everything is clipped here, which keeps the chart code free of bounds checks.

use std::io;
use std::path::Path;

/// An opaque RGB colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Color {
    pub red: u8,
    pub green: u8,
    pub blue: u8,
}

impl Color {
    /// Creates a colour from its red, green and blue components.
    pub const fn rgb(red: u8, green: u8, blue: u8) -> Color {
        Color { red, green, blue }
    }

    pub const WHITE: Color = Color::rgb(255, 255, 255);
    pub const BLACK: Color = Color::rgb(0, 0, 0);
    pub const DARK_GREY: Color = Color::rgb(90, 90, 90);
    pub const LIGHT_GREY: Color = Color::rgb(225, 225, 225);
}

/// A rectangle of pixels, inclusive of `left`/`top` and exclusive of `right`/`bottom`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub left: i64,
    pub top: i64,
    pub right: i64,
    pub bottom: i64,
}

impl Rect {
    pub fn width(&self) -> i64 {
        self.right - self.left
    }

    pub fn height(&self) -> i64 {
        self.bottom - self.top
    }

    fn contains(&self, x: i64, y: i64) -> bool {
        x >= self.left && x < self.right && y >= self.top && y < self.bottom
    }
}

/// An RGB image being drawn, with a clip rectangle that limits every operation.
pub struct Canvas {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
    clip: Rect,
}

impl Canvas {
    /// Creates a canvas filled with `background`.
    pub fn new(width: u32, height: u32, background: Color) -> Canvas {
        let count = width as usize * height as usize;
        let mut pixels = Vec::with_capacity(count * 3);
        for _ in 0..count {
            pixels.extend_from_slice(&[background.red, background.green, background.blue]);
        }
        Canvas {
            width,
            height,
            pixels,
            clip: Canvas::full_rect(width, height),
        }
    }

    fn full_rect(width: u32, height: u32) -> Rect {
        Rect {
            left: 0,
            top: 0,
            right: i64::from(width),
            bottom: i64::from(height),
        }
    }

    pub fn width(&self) -> u32 {
        self.width
    }

    pub fn height(&self) -> u32 {
        self.height
    }

    /// The raw RGB bytes, row by row.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// Restricts drawing to `clip` (intersected with the canvas), or lifts the restriction with `None`.
    pub fn set_clip(&mut self, clip: Option<Rect>) {
        let full = Canvas::full_rect(self.width, self.height);
        self.clip = match clip {
            Some(rect) => Rect {
                left: rect.left.max(0),
                top: rect.top.max(0),
                right: rect.right.min(full.right),
                bottom: rect.bottom.min(full.bottom),
            },
            None => full,
        };
    }

    /// Mixes `color` into the pixel at (`x`, `y`) with `coverage` between 0 (none) and 1 (opaque).
    pub fn blend(&mut self, x: i64, y: i64, color: Color, coverage: f64) {
        if !self.clip.contains(x, y) || coverage.is_nan() || coverage <= 0.0 {
            return;
        }
        let alpha = coverage.min(1.0);
        let index = (y as usize * self.width as usize + x as usize) * 3;
        for (offset, component) in [color.red, color.green, color.blue].into_iter().enumerate() {
            let old = f64::from(self.pixels[index + offset]);
            let mixed = old + (f64::from(component) - old) * alpha;
            self.pixels[index + offset] = mixed.round().clamp(0.0, 255.0) as u8;
        }
    }

    /// Fills a `width` by `height` rectangle whose top-left corner is (`left`, `top`).
    pub fn fill_rect(&mut self, left: i64, top: i64, width: i64, height: i64, color: Color) {
        let right = left.saturating_add(width).min(self.clip.right);
        let bottom = top.saturating_add(height).min(self.clip.bottom);
        for y in top.max(self.clip.top)..bottom {
            for x in left.max(self.clip.left)..right {
                self.blend(x, y, color, 1.0);
            }
        }
    }

    /// Draws the one-pixel outline of a rectangle.
    pub fn stroke_rect(&mut self, rect: Rect, color: Color) {
        self.fill_rect(rect.left, rect.top, rect.width(), 1, color);
        self.fill_rect(rect.left, rect.bottom - 1, rect.width(), 1, color);
        self.fill_rect(rect.left, rect.top, 1, rect.height(), color);
        self.fill_rect(rect.right - 1, rect.top, 1, rect.height(), color);
    }

    /// Draws an anti-aliased line of the given `thickness` with round ends.
    ///
    /// Each pixel near the segment is shaded by how far its centre lies from the segment,
    /// which gives smooth edges at any angle. Only a band around the line is visited, and the
    /// band is clipped first, so far-off endpoints cost nothing.
    pub fn draw_line(&mut self, start: (f64, f64), end: (f64, f64), thickness: f64, color: Color) {
        let coordinates = [start.0, start.1, end.0, end.1];
        if coordinates.iter().any(|value| !value.is_finite()) {
            return;
        }
        let reach = thickness / 2.0 + 1.0;
        let mostly_horizontal = (end.0 - start.0).abs() >= (end.1 - start.1).abs();
        // Walking along the longer axis visits each pixel of the band once; swapping the
        // axes lets one loop handle both steep and shallow lines.
        let (major_start, major_end, clip_low, clip_high) = if mostly_horizontal {
            (
                start.0.min(end.0),
                start.0.max(end.0),
                self.clip.left,
                self.clip.right,
            )
        } else {
            (
                start.1.min(end.1),
                start.1.max(end.1),
                self.clip.top,
                self.clip.bottom,
            )
        };
        let first = ((major_start - reach).floor() as i64).max(clip_low);
        let last = ((major_end + reach).ceil() as i64).min(clip_high - 1);
        let segment = Segment {
            start,
            end,
            thickness,
        };
        for major in first..=last {
            self.shade_band(segment, major, mostly_horizontal, color);
        }
    }

    /// Shades the pixels across the line at one step `major` along its longer axis.
    fn shade_band(&mut self, segment: Segment, major: i64, mostly_horizontal: bool, color: Color) {
        let (start, end) = if mostly_horizontal {
            (segment.start, segment.end)
        } else {
            (swap(segment.start), swap(segment.end))
        };
        let centre = major as f64 + 0.5;
        let run = end.0 - start.0;
        let fraction = if run == 0.0 {
            0.5
        } else {
            ((centre - start.0) / run).clamp(0.0, 1.0)
        };
        let minor_on_line = start.1 + fraction * (end.1 - start.1);
        // With the line at most 45 degrees off the major axis, its band across the minor
        // axis is at most sqrt(2) times its thickness; 1.5 times plus a pixel is enough.
        let half_band = segment.thickness * 0.75 + 1.0;
        let (clip_low, clip_high) = if mostly_horizontal {
            (self.clip.top, self.clip.bottom)
        } else {
            (self.clip.left, self.clip.right)
        };
        let first = ((minor_on_line - half_band).floor() as i64).max(clip_low);
        let last = ((minor_on_line + half_band).ceil() as i64).min(clip_high - 1);
        for minor in first..=last {
            let pixel = (centre, minor as f64 + 0.5);
            let distance = distance_to_segment(pixel, start, end);
            let coverage = (segment.thickness / 2.0 + 0.5 - distance).clamp(0.0, 1.0);
            let (x, y) = if mostly_horizontal {
                (major, minor)
            } else {
                (minor, major)
            };
            self.blend(x, y, color, coverage);
        }
    }

    /// Draws a filled anti-aliased dot, used as a marker on line charts.
    pub fn draw_dot(&mut self, centre: (f64, f64), diameter: f64, color: Color) {
        self.draw_line(centre, centre, diameter, color);
    }

    /// Encodes the canvas as an 8-bit RGB PNG into `writer`.
    pub fn write_png(&self, writer: impl io::Write) -> io::Result<()> {
        let mut encoder = png::Encoder::new(writer, self.width, self.height);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut png_writer = encoder.write_header().map_err(io::Error::other)?;
        png_writer
            .write_image_data(&self.pixels)
            .map_err(io::Error::other)?;
        png_writer.finish().map_err(io::Error::other)
    }

    /// Writes the canvas as a PNG file via `path.tmp` and a rename, creating the parent folder.
    pub fn save_png(&self, path: &Path) -> io::Result<()> {
        let mut bytes = Vec::new();
        self.write_png(&mut bytes)?;
        crate::write_file_atomically(path, &bytes)
    }
}

/// A line segment in pixel coordinates with its stroke thickness.
#[derive(Debug, Clone, Copy)]
struct Segment {
    start: (f64, f64),
    end: (f64, f64),
    thickness: f64,
}

fn swap(point: (f64, f64)) -> (f64, f64) {
    (point.1, point.0)
}

/// The Euclidean distance from `point` to the closest point of the segment `start`..`end`.
fn distance_to_segment(point: (f64, f64), start: (f64, f64), end: (f64, f64)) -> f64 {
    let (run_x, run_y) = (end.0 - start.0, end.1 - start.1);
    let length_squared = run_x * run_x + run_y * run_y;
    let fraction = if length_squared == 0.0 {
        0.0
    } else {
        (((point.0 - start.0) * run_x + (point.1 - start.1) * run_y) / length_squared)
            .clamp(0.0, 1.0)
    };
    let closest = (start.0 + fraction * run_x, start.1 + fraction * run_y);
    ((point.0 - closest.0).powi(2) + (point.1 - closest.1).powi(2)).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pixel(canvas: &Canvas, x: usize, y: usize) -> [u8; 3] {
        let index = (y * canvas.width() as usize + x) * 3;
        canvas.pixels()[index..index + 3].try_into().unwrap()
    }

    #[test]
    fn a_line_colours_pixels_along_its_path_only() {
        let mut canvas = Canvas::new(20, 20, Color::WHITE);
        canvas.draw_line((2.0, 10.5), (18.0, 10.5), 2.0, Color::BLACK);
        assert_eq!(pixel(&canvas, 10, 10), [0, 0, 0]);
        assert_eq!(pixel(&canvas, 10, 2), [255, 255, 255]);
    }

    #[test]
    fn drawing_far_outside_the_canvas_is_clipped_quietly() {
        let mut canvas = Canvas::new(10, 10, Color::WHITE);
        canvas.draw_line((-1e12, -5.0), (1e12, 5.0), 2.0, Color::BLACK);
        canvas.draw_line((f64::NAN, 0.0), (3.0, 3.0), 2.0, Color::BLACK);
        canvas.fill_rect(-100, -100, 1000, 3, Color::BLACK);
        canvas.fill_rect(i64::MAX - 1, 0, i64::MAX, 5, Color::BLACK);
        assert_eq!(pixel(&canvas, 5, 9), [255, 255, 255]);
    }

    #[test]
    fn clip_limits_drawing() {
        let mut canvas = Canvas::new(10, 10, Color::WHITE);
        canvas.set_clip(Some(Rect {
            left: 0,
            top: 0,
            right: 5,
            bottom: 10,
        }));
        canvas.fill_rect(0, 0, 10, 10, Color::BLACK);
        assert_eq!(pixel(&canvas, 4, 4), [0, 0, 0]);
        assert_eq!(pixel(&canvas, 6, 4), [255, 255, 255]);
    }
}
