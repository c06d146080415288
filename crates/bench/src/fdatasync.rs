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
//!
//! Replicas write their own files on their own hosts, so no two of them
//! share a block of file system metadata. On one machine, files made one
//! after another in one folder do: their inodes are neighbours in the
//! inode table, several to a 4 KiB block. A write after the clock's
//! coarse tick changes a file's timestamps, and on ext4 without a journal
//! (this project's machines) the fdatasync that follows writes the
//! inode's block too, one more disk write before the flush. Three
//! neighbours written at the same moment put their three changes in one
//! block and pay that write once; three replicas pay it three times.
//! [`SyncProbe::replicas`] therefore gives each replica's file an
//! inode-table block of its own (docs/results.md, "Three replicas' files
//! pay three inode writes").

use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
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

    /// Overwrites a new file in `folder` whose blocks were written (zeros)
    /// and synced beforehand, as the log's preallocated tail segment is, so
    /// each fdatasync carries the record and no new file size. The file has
    /// the tail segment's shape too: room for `samples` records and the
    /// zeros the log keeps ahead of its last one ([`tail_segment_bytes`]).
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
        let file = preallocated(&path, tail_segment_bytes(size * samples))?;
        Ok(SyncProbe::new(path, file, size))
    }

    /// Preallocated probes, one per name, for replicas that write at the
    /// same moment: each file's inode is in an inode-table block none of
    /// the others' is in, as on replicas' own hosts (see the module's
    /// notes). Best effort: on a file system whose inode numbers say
    /// nothing of where inodes lie, the files are made all the same.
    pub fn replicas(
        folder: &Path,
        names: &[String],
        size: usize,
        samples: usize,
    ) -> anyhow::Result<Vec<SyncProbe>> {
        let mut taken = Vec::with_capacity(names.len());
        names
            .iter()
            .map(|name| {
                let path = folder.join(format!("fdatasync-{name}.bin"));
                let (file, block) = create_apart(&path, &taken)?;
                taken.push(block);
                let file = preallocate(file, &path, tail_segment_bytes(size * samples))?;
                Ok(SyncProbe::new(path, file, size))
            })
            .collect()
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

/// The bytes of a log's tail segment once `records` bytes of records are
/// in it: the records, and the zeros the log keeps ahead of the last one
/// (`wal::PREALLOCATE_AHEAD_BYTES`). A probe standing for the log's write +
/// fdatasync of a small batch overwrites a file of this size: the log's
/// tail segment is never smaller while its batches are small, and on this
/// machine the flow's floor synced faster in smaller files
/// (docs/results.md, "The floor's files shaped like the log's tail
/// segment").
pub fn tail_segment_bytes(records: usize) -> usize {
    records + wal::PREALLOCATE_AHEAD_BYTES as usize
}

/// Creates `path` holding `bytes` zeros, synced with its size, and returns
/// it positioned at its start, so later writes overwrite allocated blocks.
fn preallocated(path: &Path, bytes: usize) -> anyhow::Result<File> {
    let file = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    preallocate(file, path, bytes)
}

/// Writes `bytes` zeros into the new, empty `file` at `path`, syncs them
/// with its size and returns it positioned at its start.
fn preallocate(mut file: File, path: &Path, bytes: usize) -> anyhow::Result<File> {
    const CHUNK: usize = 1024 * 1024;
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

/// Inode numbers per 4 KiB block of an ext4 inode table at most (inodes
/// of 128 bytes; 16 of the default 256): two inodes whose numbers fall in
/// different runs of this many share no block.
const INODES_PER_BLOCK_MAX: u64 = 32;

/// How many files [`create_apart`] may set aside before it takes the file
/// it has.
const SPACERS_MAX: usize = 256;

/// A file's device and the run of [`INODES_PER_BLOCK_MAX`] inode numbers
/// its inode is in.
fn inode_block(file: &File, path: &Path) -> anyhow::Result<(u64, u64)> {
    let metadata = file
        .metadata()
        .with_context(|| format!("cannot read what {} is", path.display()))?;
    Ok(block_of(&metadata))
}

fn block_of(metadata: &std::fs::Metadata) -> (u64, u64) {
    (
        metadata.dev(),
        metadata.ino().saturating_sub(1) / INODES_PER_BLOCK_MAX,
    )
}

/// How many inode-table blocks the files at `paths` have their inodes in:
/// as many as there are files when no two share one, as on hosts of their
/// own. (Reading a file's times makes its next write update them finely:
/// call this once its writes are measured.)
pub fn inode_blocks_of(paths: &[PathBuf]) -> anyhow::Result<usize> {
    let mut blocks = Vec::with_capacity(paths.len());
    for path in paths {
        let metadata = std::fs::metadata(path)
            .with_context(|| format!("cannot read what {} is", path.display()))?;
        blocks.push(block_of(&metadata));
    }
    blocks.sort_unstable();
    blocks.dedup();
    Ok(blocks.len())
}

/// Creates `path` with its inode in none of the blocks of `taken`: a file
/// whose inode is in one is renamed aside, which keeps its inode in use, so
/// the next file made gets another, until one is apart (or
/// [`SPACERS_MAX`] were set aside); the files set aside are removed.
/// Returns the file and its inode's block.
fn create_apart(path: &Path, taken: &[(u64, u64)]) -> anyhow::Result<(File, (u64, u64))> {
    let mut spacers: Vec<PathBuf> = Vec::new();
    let mut make = || -> anyhow::Result<(File, (u64, u64))> {
        loop {
            let file =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let block = inode_block(&file, path)?;
            if !taken.contains(&block) || spacers.len() == SPACERS_MAX {
                return Ok((file, block));
            }
            let spacer = path.with_extension(format!("spacer-{}", spacers.len()));
            std::fs::rename(path, &spacer)
                .with_context(|| format!("cannot set {} aside", path.display()))?;
            spacers.push(spacer);
        }
    };
    let made = make();
    for spacer in spacers {
        std::fs::remove_file(&spacer)
            .with_context(|| format!("cannot remove {}", spacer.display()))?;
    }
    made
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
        let names: Vec<String> = (0..probes).map(|probe| format!("group-{probe}")).collect();
        SyncGroup::start(SyncProbe::replicas(folder, &names, 512, samples).unwrap()).unwrap()
    }

    #[test]
    fn a_file_made_apart_has_its_inode_outside_the_blocks_taken_and_leaves_no_spacer() {
        let folder = tempfile::tempdir().unwrap();
        let first_path = folder.path().join("first");
        let first = File::create(&first_path).unwrap();
        // The next inode is most likely the first's neighbour, in its block.
        let taken = [inode_block(&first, &first_path).unwrap()];
        let path = folder.path().join("apart");
        let (file, block) = create_apart(&path, &taken).unwrap();
        assert_ne!(block, taken[0]);
        assert_eq!(inode_block(&file, &path).unwrap(), block);
        assert_eq!(
            inode_blocks_of(&[first_path.clone(), path.clone()]).unwrap(),
            2
        );
        assert_eq!(
            inode_blocks_of(&[first_path.clone(), first_path]).unwrap(),
            1
        );
        let left: Vec<String> = std::fs::read_dir(folder.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left.len(), 2, "only the two files are left: {left:?}");
    }

    #[test]
    fn replicas_files_are_shaped_like_a_tail_segment_each_in_an_inode_block_of_its_own() {
        let folder = tempfile::tempdir().unwrap();
        let names: Vec<String> = (0..3).map(|replica| format!("replica-{replica}")).collect();
        let probes = SyncProbe::replicas(folder.path(), &names, 100, 4).unwrap();
        let blocks: Vec<(u64, u64)> = probes
            .iter()
            .map(|probe| inode_block(&probe.file, &probe.path).unwrap())
            .collect();
        for (index, block) in blocks.iter().enumerate() {
            assert!(
                !blocks[..index].contains(block),
                "replica {index}'s inode shares a block: {blocks:?}"
            );
        }
        // Four records of 100 bytes, and the zeros a log keeps ahead.
        let shaped = 400 + wal::PREALLOCATE_AHEAD_BYTES;
        for probe in probes {
            assert_eq!(probe.file.metadata().unwrap().len(), shaped, "preallocated");
            probe.finish().unwrap();
        }
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 0);
        let probe = SyncProbe::preallocated(folder.path(), 100, 4).unwrap();
        assert_eq!(probe.file.metadata().unwrap().len(), shaped);
        probe.finish().unwrap();
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
