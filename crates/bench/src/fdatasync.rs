//! The physical limit the logging experiment compares against: one
//! `write` of a record followed by one `fdatasync`, appended to a file on
//! the same disk as the logs.
//!
//! The file grows with every record, as a log segment does, so the disk
//! pays the same metadata cost for the new length that the log pays.
//!
//! The log, though, keeps its tail segment preallocated (zeros written and
//! synced ahead of the records), so most of its syncs carry data only.
//! [`SyncProbe::preallocated`] measures that case: the physical limit the
//! log actually faces. `bench patterns` reports both, and also asks what the
//! disk allows several replicas at once: [`concurrent_batches`] runs one
//! writer per replica, each syncing batches of the size the log formed
//! into its own preallocated file.

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Barrier};
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

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
    let mut probe = SyncProbe::appending(folder, size)?;
    let mut latencies = Vec::with_capacity(samples);
    for _ in 0..samples {
        latencies.push(probe.sample()?);
        on_sample();
    }
    probe.finish()?;
    Ok(latencies)
}

/// A file that takes one record per sample with `write_all` +
/// `sync_data`, so an experiment can interleave bare syncs with its own
/// work and both see the disk in the same state (these machines' disks
/// drift by a factor of ten within a minute).
pub struct SyncProbe {
    path: PathBuf,
    file: File,
    record: Vec<u8>,
}

impl SyncProbe {
    /// Appends to a new file in `folder`, which grows with every record.
    pub fn appending(folder: &Path, size: usize) -> anyhow::Result<SyncProbe> {
        let path = folder.join(format!("fdatasync-appending-{size}.bin"));
        let file =
            File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
        Ok(SyncProbe::new(path, file, size))
    }

    /// Overwrites a new file in `folder` whose blocks for `samples` records
    /// were written (zeros) and synced beforehand, as the log's
    /// preallocated tail segment is, so each fdatasync carries the record
    /// and no new file size.
    pub fn preallocated(folder: &Path, size: usize, samples: usize) -> anyhow::Result<SyncProbe> {
        SyncProbe::preallocated_named(folder, &format!("preallocated-{size}"), size, samples)
    }

    /// As [`SyncProbe::preallocated`], in a file named after `name`, so
    /// several probes can share a folder.
    pub fn preallocated_named(
        folder: &Path,
        name: &str,
        size: usize,
        samples: usize,
    ) -> anyhow::Result<SyncProbe> {
        let path = folder.join(format!("fdatasync-{name}.bin"));
        let file = preallocated(&path, size * samples)?;
        Ok(SyncProbe::new(path, file, size))
    }

    fn new(path: PathBuf, file: File, size: usize) -> SyncProbe {
        let record = (0..size).map(|index| (index % 251) as u8).collect();
        SyncProbe { path, file, record }
    }

    /// Writes and syncs one record; returns the time taken in microseconds.
    pub fn sample(&mut self) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.file
            .write_all(&self.record)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        self.file
            .sync_data()
            .with_context(|| format!("cannot fdatasync {}", self.path.display()))?;
        Ok(started.elapsed().as_secs_f64() * 1e6)
    }

    /// Closes and removes the file.
    pub fn finish(self) -> anyhow::Result<()> {
        drop(self.file);
        std::fs::remove_file(&self.path)
            .with_context(|| format!("cannot remove {}", self.path.display()))
    }
}

/// Probes that sample at once, one thread each, released together by a
/// barrier: what R replicas' logs on one disk pay when each syncs the same
/// record at the same moment. The threads live as long as the group, so a
/// sample starts and ends no thread: an experiment that interleaves these
/// samples with its own work leaves nothing of them (a thread's exit, its
/// stack) running into its next step.
pub struct SyncGroup {
    go: Vec<mpsc::SyncSender<()>>,
    done: mpsc::Receiver<(ThreadId, anyhow::Result<(Instant, Instant)>)>,
    threads: Vec<JoinHandle<SyncProbe>>,
}

/// How long a sample of the group may take before it counts as stuck.
const GROUP_SAMPLE_TIMEOUT: Duration = Duration::from_secs(60);

impl SyncGroup {
    /// Starts one thread per probe; they wait for [`SyncGroup::sample`].
    pub fn start(probes: Vec<SyncProbe>) -> anyhow::Result<SyncGroup> {
        let start = Arc::new(Barrier::new(probes.len()));
        let (report, done) = mpsc::channel();
        let mut group = SyncGroup {
            go: Vec::with_capacity(probes.len()),
            done,
            threads: Vec::with_capacity(probes.len()),
        };
        for mut probe in probes {
            let (go, wait) = mpsc::sync_channel::<()>(1);
            let (start, report) = (Arc::clone(&start), report.clone());
            let thread = std::thread::Builder::new()
                .name("sync-probe".into())
                .spawn(move || {
                    while wait.recv().is_ok() {
                        start.wait();
                        let began = Instant::now();
                        let span = probe.sample().map(|_| (began, Instant::now()));
                        if report.send((std::thread::current().id(), span)).is_err() {
                            break;
                        }
                    }
                    probe
                })
                .context("cannot start a sync probe's thread")?;
            group.go.push(go);
            group.threads.push(thread);
        }
        Ok(group)
    }

    /// Samples every probe at once; returns the time from the first start
    /// to the last finish, in microseconds.
    pub fn sample(&mut self) -> anyhow::Result<f64> {
        let spans = self.spans()?;
        let first = spans.iter().map(|(_, began, _)| *began).min();
        let last = spans.iter().map(|(_, _, ended)| *ended).max();
        match (first, last) {
            (Some(first), Some(last)) => Ok((last - first).as_secs_f64() * 1e6),
            _ => Ok(0.0),
        }
    }

    /// Each probe's start and end in one sample, with the thread that ran it.
    fn spans(&mut self) -> anyhow::Result<Vec<(ThreadId, Instant, Instant)>> {
        for go in &self.go {
            go.send(())
                .map_err(|_| anyhow::anyhow!("a sync probe's thread is gone"))?;
        }
        let mut spans = Vec::with_capacity(self.go.len());
        for _ in 0..self.go.len() {
            let (thread, span) = self
                .done
                .recv_timeout(GROUP_SAMPLE_TIMEOUT)
                .context("a sync probe's thread stopped answering")?;
            spans.push(span.map(|(began, ended)| (thread, began, ended)));
        }
        spans.into_iter().collect()
    }

    /// Stops the threads and removes the probes' files.
    pub fn finish(self) -> anyhow::Result<()> {
        drop(self.go);
        for thread in self.threads {
            let probe = thread
                .join()
                .map_err(|_| anyhow::anyhow!("a sync probe panicked"))?;
            probe.finish()?;
        }
        Ok(())
    }
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
/// write + `sync_data` per batch: what `writers` replicas' logs ask of one
/// disk when each syncs batches of that size. Each batch is written as the
/// log writes it, in whole blocks past the page cache
/// (`wal::StorageFile::write_blocks_at`, `O_DIRECT` where the file system
/// allows it), its length rounded up to a block. The files are removed
/// afterwards.
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
    let block = wal::storage::BLOCK_BYTES;
    let padded = batch.len().div_ceil(block) * block;
    let created = preallocated(path, padded * syncs).and_then(|file| {
        drop(file);
        use wal::Storage;
        wal::FileStorage
            .open(path, false)
            .with_context(|| format!("cannot open {}", path.display()))
    });
    // Every writer reaches the barrier, even one whose file failed, so
    // the others are not left waiting.
    start.wait();
    let file = created?;
    // The batch at a block-aligned address, zeros up to the block's end.
    let mut buffer = vec![0u8; padded + block];
    let at = buffer.as_ptr().align_offset(block);
    buffer[at..at + batch.len()].copy_from_slice(batch);
    let blocks = &buffer[at..at + padded];
    let mut latencies = Vec::with_capacity(syncs);
    for index in 0..syncs {
        let started = Instant::now();
        file.write_blocks_at(blocks, (index * padded) as u64)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn group_of(folder: &Path, probes: usize, samples: usize) -> SyncGroup {
        let probes = (0..probes)
            .map(|probe| {
                SyncProbe::preallocated_named(folder, &format!("group-{probe}"), 512, samples)
                    .unwrap()
            })
            .collect();
        SyncGroup::start(probes).unwrap()
    }

    #[test]
    fn a_group_samples_on_the_same_threads_every_time_and_removes_its_files() {
        let folder = tempfile::tempdir().unwrap();
        let mut group = group_of(folder.path(), 3, 20);
        let mut threads: Vec<ThreadId> = group.threads.iter().map(|t| t.thread().id()).collect();
        threads.sort_unstable_by_key(|id| format!("{id:?}"));
        for _ in 0..20 {
            let spans = group.spans().unwrap();
            // Every sample runs on the group's own threads: none is started
            // or ended for it.
            let mut ran: Vec<ThreadId> = spans.iter().map(|(thread, _, _)| *thread).collect();
            ran.sort_unstable_by_key(|id| format!("{id:?}"));
            assert_eq!(ran, threads);
            assert!(spans.iter().all(|(_, began, ended)| ended > began));
        }
        assert!(group.sample().unwrap() > 0.0);
        assert!(group.threads.iter().all(|t| !t.is_finished()));
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 3);
        group.finish().unwrap();
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_probe_that_cannot_write_fails_its_sample_and_the_group_still_finishes() {
        let folder = tempfile::tempdir().unwrap();
        let path = folder.path().join("read-only.bin");
        std::fs::write(&path, [0u8; 512]).unwrap();
        let read_only = SyncProbe::new(
            path,
            File::open(folder.path().join("read-only.bin")).unwrap(),
            512,
        );
        let writable = SyncProbe::preallocated_named(folder.path(), "writable", 512, 4).unwrap();
        let mut group = SyncGroup::start(vec![writable, read_only]).unwrap();
        let error = group.sample().unwrap_err();
        assert!(format!("{error:#}").contains("cannot write"), "{error:#}");
        // The next sample runs again on both threads, and fails again.
        assert!(group.sample().is_err());
        group.finish().unwrap();
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 0);
    }
}
