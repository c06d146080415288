//! The physical limit the logging experiment compares against: one
//! `write` of a record followed by one `fdatasync`, appended to a file on
//! the same disk as the logs.
//!
//! The file grows with every record, as a log segment does, so the disk
//! pays the same metadata cost for the new length that the log pays.
//!
//! The log, though, keeps its tail segment preallocated (zeros written and
//! synced ahead of the records), so most of its syncs carry data only.
//! [`measure_preallocated`] measures that case: the physical limit the log
//! actually faces. `bench patterns` reports both, and also asks what the
//! disk allows several replicas at once: [`concurrent_batches`] runs one
//! writer per replica, each syncing batches of the size the log formed
//! into its own preallocated file.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
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

/// As [`measure`], but into a file whose blocks were written (zeros) and
/// synced beforehand, as the log's preallocated tail segment is, so each
/// fdatasync carries the record and no new file size. The file is removed
/// afterwards.
pub fn measure_preallocated(
    folder: &Path,
    size: usize,
    samples: usize,
    mut on_sample: impl FnMut(),
) -> anyhow::Result<Vec<f64>> {
    let path = folder.join(format!("fdatasync-preallocated-{size}.bin"));
    let mut file = preallocated(&path, size * samples)?;
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

/// Creates `path` holding `bytes` zeros, synced with its size, and returns
/// it positioned at its start, so later writes overwrite allocated blocks.
fn preallocated(path: &Path, bytes: usize) -> anyhow::Result<File> {
    const CHUNK: usize = 1024 * 1024;
    let mut file =
        File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let zeros = vec![0u8; CHUNK.min(bytes.max(1))];
    let mut left = bytes;
    while left > 0 {
        let step = left.min(zeros.len());
        file.write_all(&zeros[..step])
            .with_context(|| format!("cannot preallocate {}", path.display()))?;
        left -= step;
    }
    file.sync_all()
        .with_context(|| format!("cannot sync {}", path.display()))?;
    file.seek(SeekFrom::Start(0))
        .with_context(|| format!("cannot seek in {}", path.display()))?;
    Ok(file)
}

/// What [`concurrent_batches`] measured.
#[derive(Clone, Debug)]
pub struct ConcurrentSyncs {
    /// From the moment every writer was ready to the end of the last one.
    pub seconds: f64,
    /// One write + fdatasync of one batch, in microseconds, every writer's.
    pub latencies_us: Vec<f64>,
}

/// Runs `writers` threads at once, each writing `syncs` batches of
/// `batch_bytes` bytes into its own preallocated file in `folder` with one
/// `write_all` + `sync_data` per batch: what `writers` replicas' logs ask
/// of one disk when each syncs batches of that size. The files are
/// removed afterwards.
pub fn concurrent_batches(
    folder: &Path,
    writers: usize,
    batch_bytes: usize,
    syncs: usize,
    on_sync: &(dyn Fn() + Sync),
) -> anyhow::Result<ConcurrentSyncs> {
    let batch: Vec<u8> = (0..batch_bytes).map(|index| (index % 251) as u8).collect();
    let start = std::sync::Barrier::new(writers + 1);
    let (started, results) = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..writers)
            .map(|writer| {
                let path = folder.join(format!("fdatasync-writer-{writer}.bin"));
                let (batch, start) = (&batch, &start);
                scope.spawn(move || write_batches(&path, batch, syncs, start, on_sync))
            })
            .collect();
        start.wait();
        let started = Instant::now();
        let results: Vec<_> = handles
            .into_iter()
            .map(|handle| handle.join().expect("a disk writer panicked"))
            .collect();
        (started, results)
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut latencies_us = Vec::with_capacity(writers * syncs);
    for result in results {
        latencies_us.extend(result?);
    }
    Ok(ConcurrentSyncs {
        seconds,
        latencies_us,
    })
}

/// One writer of [`concurrent_batches`]: preallocates its file, waits for
/// the others at `start`, then writes and syncs `syncs` batches.
fn write_batches(
    path: &Path,
    batch: &[u8],
    syncs: usize,
    start: &std::sync::Barrier,
    on_sync: &(dyn Fn() + Sync),
) -> anyhow::Result<Vec<f64>> {
    let created = preallocated(path, batch.len() * syncs);
    // Every writer reaches the barrier, even one whose file failed, so
    // the others are not left waiting.
    start.wait();
    let mut file = created?;
    let mut latencies = Vec::with_capacity(syncs);
    for _ in 0..syncs {
        let started = Instant::now();
        file.write_all(batch)
            .with_context(|| format!("cannot write {}", path.display()))?;
        file.sync_data()
            .with_context(|| format!("cannot fdatasync {}", path.display()))?;
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
        on_sync();
    }
    drop(file);
    std::fs::remove_file(path).with_context(|| format!("cannot remove {}", path.display()))?;
    Ok(latencies)
}
