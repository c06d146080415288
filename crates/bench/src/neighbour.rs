//! A neighbour on the disk (`bench patterns --disk-neighbour`): threads
//! that write blocks with `O_DSYNC` into files of their own, in a loop,
//! for the whole run, so that every fdatasync of the run (the servers',
//! the floor's, the disk-limit writers') waits behind theirs. It makes
//! the disk slow on purpose, in a way the next run can repeat, instead of
//! waiting for a slow spell of the disk to come back.

use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::Context;

/// Blocks each writer goes over before it starts again at the first,
/// so that its file stays small (the file is written over, not grown).
const BLOCKS: u64 = 200;
/// The largest block a writer takes (each writer holds one in memory).
const BLOCK_BYTES_MAX: usize = 64 * 1024 * 1024;

/// The running neighbour; stopped (and its files removed) by
/// [`Neighbour::stop`] or when dropped.
pub struct Neighbour {
    stop: Arc<AtomicBool>,
    writes: Arc<AtomicU64>,
    threads: Vec<JoinHandle<std::io::Result<()>>>,
    files: Vec<PathBuf>,
}

impl Neighbour {
    /// One writer for each of `blocks` (bytes per write, each from 1 to
    /// 64 MiB), each with a file `disk-neighbour-N` of its own in `folder`;
    /// none for an empty list.
    pub fn start(folder: &Path, blocks: &[usize]) -> anyhow::Result<Neighbour> {
        let mut neighbour = Neighbour {
            stop: Arc::new(AtomicBool::new(false)),
            writes: Arc::new(AtomicU64::new(0)),
            threads: Vec::new(),
            files: Vec::new(),
        };
        for (index, &block) in blocks.iter().enumerate() {
            anyhow::ensure!(
                (1..=BLOCK_BYTES_MAX).contains(&block),
                "a disk neighbour's block must be at least 1 byte and at most 64 MiB, not {block} bytes"
            );
            let path = folder.join(format!("disk-neighbour-{index}"));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .custom_flags(rustix::fs::OFlags::DSYNC.bits() as i32)
                .open(&path)
                .with_context(|| format!("cannot create {}", path.display()))?;
            neighbour.files.push(path);
            let (stop, writes) = (Arc::clone(&neighbour.stop), Arc::clone(&neighbour.writes));
            let thread = std::thread::Builder::new()
                .name("disk-neighbour".into())
                .spawn(move || write_loop(&file, block, &stop, &writes))?;
            neighbour.threads.push(thread);
        }
        Ok(neighbour)
    }

    /// Writes done so far, by all the writers.
    pub fn writes(&self) -> u64 {
        self.writes.load(Ordering::Relaxed)
    }

    /// Stops the writers, removes their files, and returns how many
    /// writes they made; the first writer's error, if one failed.
    pub fn stop(mut self) -> anyhow::Result<u64> {
        self.halt()?;
        Ok(self.writes())
    }

    fn halt(&mut self) -> anyhow::Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        let mut failed = None;
        for thread in self.threads.drain(..) {
            let outcome = thread
                .join()
                .map_err(|_| anyhow::anyhow!("a disk neighbour panicked"));
            if let Err(error) = outcome.and_then(|written| Ok(written?)) {
                failed.get_or_insert(error);
            }
        }
        for path in self.files.drain(..) {
            let _ = std::fs::remove_file(path);
        }
        failed.map_or(Ok(()), Err)
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

fn write_loop(
    file: &std::fs::File,
    block: usize,
    stop: &AtomicBool,
    writes: &AtomicU64,
) -> std::io::Result<()> {
    let bytes = vec![0x5a_u8; block];
    let mut index = 0;
    while !stop.load(Ordering::Relaxed) {
        file.write_all_at(&bytes, index * block as u64)?;
        writes.fetch_add(1, Ordering::Relaxed);
        index = (index + 1) % BLOCKS;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_write_until_stopped_and_leave_no_file() {
        let folder = tempfile::tempdir().unwrap();
        let neighbour = Neighbour::start(folder.path(), &[4096, 512]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while neighbour.writes() < 10 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(std::fs::read_dir(folder.path()).unwrap().count(), 2);
        let writes = neighbour.stop().unwrap();
        assert!(writes >= 10, "{writes} writes");
        assert_eq!(
            std::fs::read_dir(folder.path()).unwrap().count(),
            0,
            "the writers' files are removed"
        );
    }

    #[test]
    fn no_blocks_no_writers_and_blocks_out_of_bounds_are_refused() {
        let folder = tempfile::tempdir().unwrap();
        assert_eq!(
            Neighbour::start(folder.path(), &[])
                .unwrap()
                .stop()
                .unwrap(),
            0
        );
        for block in [0, BLOCK_BYTES_MAX + 1] {
            let refused = Neighbour::start(folder.path(), &[block]).err().unwrap();
            assert!(refused.to_string().contains("at most 64 MiB"), "{refused}");
        }
    }
}
