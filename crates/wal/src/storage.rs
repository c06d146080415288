//! The disk seam: every byte the log reads or writes goes through
//! [`Storage`] and [`StorageFile`], so tests can swap the real file system
//! for one that tears writes, flips bits, fails fsync or runs out of space,
//! and a simulator can crash it at any point.
//!
//! Contract every implementation keeps:
//! - `write_at` is readable by `read_at` at once; it is durable only after a
//!   later `sync_data` on the same file returns `Ok`.
//! - A created or removed file is durable only after `sync_dir` on its
//!   folder returns `Ok`.
//! - An error from `sync_data` means the data may or may not be on disk; the
//!   caller must not retry and then report success (the log latches).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One open file.
pub trait StorageFile: Send + Sync {
    /// Reads up to `buffer.len()` bytes at `offset`; returns how many were
    /// read (0 at the end of the file).
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Writes all of `bytes` at `offset`.
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync: makes every earlier write to this file durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Cuts (or extends with zeros) the file to `length` bytes.
    fn set_len(&self, length: u64) -> io::Result<()>;

    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Reads exactly `buffer.len()` bytes at `offset`, or fails with
    /// `UnexpectedEof`.
    fn read_exact_at(&self, buffer: &mut [u8], mut offset: u64) -> io::Result<()> {
        let mut filled = 0;
        while filled < buffer.len() {
            let count = self.read_at(&mut buffer[filled..], offset)?;
            if count == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            filled += count;
            offset += count as u64;
        }
        Ok(())
    }
}

/// A file system: folders of files.
pub trait Storage: Send + Sync {
    /// Opens a file for reading and writing, creating it when `create`.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>>;
    /// Names (not paths) of the entries in `folder`, in no particular order.
    fn list(&self, folder: &Path) -> io::Result<Vec<String>>;
    /// Creates `folder` and its parents.
    fn create_dir_all(&self, folder: &Path) -> io::Result<()>;
    /// Removes one file.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Removes a folder and everything in it.
    fn remove_dir_all(&self, folder: &Path) -> io::Result<()>;
    /// Renames a file, replacing any file at `to`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the creation, removal and renaming of entries in `folder`
    /// durable.
    fn sync_dir(&self, folder: &Path) -> io::Result<()>;
    /// Whether `path` exists.
    fn exists(&self, path: &Path) -> bool;
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStorage;

struct RealFile(std::fs::File);

impl StorageFile for RealFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.0, buffer, offset)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.0, bytes, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        self.0.set_len(length)
    }
}

impl Storage for FileStorage {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        Ok(Arc::new(RealFile(file)))
    }

    fn list(&self, folder: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(folder)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn create_dir_all(&self, folder: &Path) -> io::Result<()> {
        std::fs::create_dir_all(folder)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn remove_dir_all(&self, folder: &Path) -> io::Result<()> {
        std::fs::remove_dir_all(folder)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, folder: &Path) -> io::Result<()> {
        std::fs::File::open(folder)?.sync_all()
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

/// Writes `bytes` to `path` atomically: a temporary file, synced, renamed
/// over `path`, and the folder synced, so a crash leaves the old content or
/// the new one, never a mix.
pub fn write_atomically(storage: &dyn Storage, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let folder = path.parent().unwrap_or(Path::new("."));
    let mut temporary = PathBuf::from(path);
    temporary.as_mut_os_string().push(".tmp");
    let file = storage.open(&temporary, true)?;
    file.set_len(0)?;
    file.write_at(bytes, 0)?;
    file.sync_data()?;
    drop(file);
    storage.rename(&temporary, path)?;
    storage.sync_dir(folder)
}

/// Reads a whole file.
pub fn read_all(storage: &dyn Storage, path: &Path) -> io::Result<Vec<u8>> {
    let file = storage.open(path, false)?;
    let mut bytes = vec![0; file.len()? as usize];
    file.read_exact_at(&mut bytes, 0)?;
    Ok(bytes)
}
