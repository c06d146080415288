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
//! - `write_blocks_at` keeps `write_at`'s contract; it only lets a real file
//!   skip the page cache.

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
    /// Writes all of `bytes` at `offset`, exactly as `write_at` does, for a
    /// caller that lays its writes out in whole [`BLOCK_BYTES`] blocks
    /// (offset, length and the buffer's address all multiples of it). A
    /// real file then writes them past the page cache (`O_DIRECT`): copying
    /// every log byte into newly allocated page cache costs more CPU than
    /// anything else the log does. Anything not so aligned, or a file
    /// system that refuses direct I/O, takes the `write_at` path.
    fn write_blocks_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        self.write_at(bytes, offset)
    }
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

/// The unit of [`StorageFile::write_blocks_at`]: a multiple of the logical
/// block size of every disk in common use, which direct I/O requires of
/// offsets, lengths and buffer addresses.
pub const BLOCK_BYTES: usize = 4096;

/// Whether `bytes` at `offset` can go to disk by direct I/O.
pub fn is_block_aligned(bytes: &[u8], offset: u64) -> bool {
    let block = BLOCK_BYTES as u64;
    offset.is_multiple_of(block)
        && (bytes.len() as u64).is_multiple_of(block)
        && (bytes.as_ptr() as usize).is_multiple_of(BLOCK_BYTES)
}

/// The real file system.
#[derive(Clone, Copy, Debug, Default)]
pub struct FileStorage;

struct RealFile {
    file: std::fs::File,
    path: PathBuf,
    /// A second handle on the same file opened with `O_DIRECT`, opened at
    /// the first block write; `None` inside when the file system refuses
    /// direct I/O (tmpfs, for one), and writes stay buffered. Reads keep
    /// the buffered handle: the kernel keeps the two coherent (a direct
    /// write drops the cached pages it overlaps).
    direct: std::sync::OnceLock<Option<std::fs::File>>,
}

impl RealFile {
    fn direct(&self) -> Option<&std::fs::File> {
        self.direct
            .get_or_init(|| {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(&self.path)
                    .ok()
            })
            .as_ref()
    }
}

impl StorageFile for RealFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        std::os::unix::fs::FileExt::read_at(&self.file, buffer, offset)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, bytes, offset)
    }

    fn write_blocks_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        match self.direct() {
            Some(direct) if is_block_aligned(bytes, offset) => {
                std::os::unix::fs::FileExt::write_all_at(direct, bytes, offset)
            }
            _ => self.write_at(bytes, offset),
        }
    }

    fn sync_data(&self) -> io::Result<()> {
        // One inode behind both handles: this flushes what either wrote.
        self.file.sync_data()
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        self.file.set_len(length)
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
        Ok(Arc::new(RealFile {
            file,
            path: path.to_path_buf(),
            direct: std::sync::OnceLock::new(),
        }))
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
