//! A [`Storage`] that keeps no bytes: writes and syncs return at once.
//!
//! It is the "buffering only" baseline of the paged experiment (seed 004):
//! the log copies every record into its pages and hands full pages to its
//! I/O thread exactly as it does on a disk, but the page write costs
//! nothing, so the difference to "no logging" is the cost of buffering and
//! the difference to a real disk is the cost of writing.
//!
//! It keeps the storage contract only for what the log does on an empty
//! folder (create a segment, write, sync); reads see an empty file, so a
//! log opened on it must not be reopened or read.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use wal::{Storage, StorageFile};

/// Discards every write; every folder is empty.
#[derive(Clone, Copy, Debug, Default)]
pub struct DiscardStorage;

/// A file that remembers only its length, so offsets stay consistent.
#[derive(Default)]
struct DiscardFile {
    length: AtomicU64,
}

impl StorageFile for DiscardFile {
    fn read_at(&self, _buffer: &mut [u8], _offset: u64) -> io::Result<usize> {
        Ok(0)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.length
            .fetch_max(offset + bytes.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.length.load(Ordering::Relaxed))
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        self.length.store(length, Ordering::Relaxed);
        Ok(())
    }
}

impl Storage for DiscardStorage {
    fn open(&self, _path: &Path, _create: bool) -> io::Result<Arc<dyn StorageFile>> {
        Ok(Arc::new(DiscardFile::default()))
    }

    fn list(&self, _folder: &Path) -> io::Result<Vec<String>> {
        Ok(Vec::new())
    }

    fn create_dir_all(&self, _folder: &Path) -> io::Result<()> {
        Ok(())
    }

    fn remove_file(&self, _path: &Path) -> io::Result<()> {
        Ok(())
    }

    fn remove_dir_all(&self, _folder: &Path) -> io::Result<()> {
        Ok(())
    }

    fn rename(&self, _from: &Path, _to: &Path) -> io::Result<()> {
        Ok(())
    }

    fn sync_dir(&self, _folder: &Path) -> io::Result<()> {
        Ok(())
    }

    fn exists(&self, _path: &Path) -> bool {
        false
    }
}
