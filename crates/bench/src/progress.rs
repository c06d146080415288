//! Progress bars on stderr, hidden with `--quiet`, so a long experiment
//! shows where it is without mixing with the table on stdout.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar of `total` steps labelled `label`; hidden when `quiet`.
pub fn bar(total: u64, label: &str, quiet: bool) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), draw_target(quiet));
    let style = ProgressStyle::with_template(
        "{prefix:>10} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg} (eta {eta})",
    )
    .expect("the template is valid")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(label.to_string());
    bar
}

fn draw_target(quiet: bool) -> ProgressDrawTarget {
    if quiet {
        ProgressDrawTarget::hidden()
    } else {
        // A few redraws a second are plenty and keep the bar cheap next to
        // the microsecond-scale work it counts.
        ProgressDrawTarget::stderr_with_hz(4)
    }
}
