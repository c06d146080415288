//! The physical limit the logging experiment compares against: one
//! `write` of a record followed by one `fdatasync`, appended to a file on
//! the same disk as the logs.
//!
//! The file grows with every record, as a log segment does, so the disk
//! pays the same metadata cost for the new length that the log pays.

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;

/// Appends `samples` records of `size` bytes to a new file in `folder`,
/// each with `write_all` + `sync_data`, and returns each one's latency in
/// microseconds. The file is removed afterwards.
pub fn measure(
    folder: &Path,
    size: usize,
    samples: usize,
    mut on_sample: impl FnMut(),
) -> anyhow::Result<Vec<f64>> {
    let path = folder.join(format!("fdatasync-{size}.bin"));
    let mut file =
        File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    let record: Vec<u8> = (0..size).map(|index| (index % 251) as u8).collect();
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        file.write_all(&record)
            .with_context(|| format!("cannot write {}", path.display()))?;
        file.sync_data()
            .with_context(|| format!("cannot fdatasync {}", path.display()))?;
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
        on_sample();
    }
    drop(file);
    std::fs::remove_file(&path).with_context(|| format!("cannot remove {}", path.display()))?;
    Ok(latencies)
}
