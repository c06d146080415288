//! An in-memory [`Storage`] that can lose power, tear writes, fail fsync,
//! run out of space and flip bits, for crash-consistency tests of the log,
//! the server's tests and the deterministic simulator.
//!
//! Model: every file keeps two contents. Its visible bytes are what
//! `read_at` sees; its durable bytes are its content as of its last
//! successful `sync_data`. Every folder keeps two sets of entries (name to
//! file): its visible entries and its durable entries, as of its last
//! successful `sync_dir`. Files are inodes, so a handle keeps working after
//! its name is renamed or removed, as on Unix.
//!
//! Contract:
//! - A write is readable at once and durable only after a later successful
//!   `sync_data` on the same file.
//! - A created, removed or renamed file is durable only after a successful
//!   `sync_dir` on its folder (both folders, for a rename between two). A
//!   file created in a folder that was never synced vanishes on crash; a
//!   removed file reappears with its durable content; a rename reverts.
//! - A failed `sync_data` or `sync_dir` leaves durable content unchanged.
//! - [`FaultStorage::crash`] returns a new storage holding what a power loss
//!   would leave, chosen by a [`CrashMode`] and a seed: the same state, mode
//!   and seed always give the same image. The old handle keeps its state.
//!
//! Simplifications (documented so tests do not rely on more):
//! - Folders are durable at once: `create_dir_all` and `remove_dir_all`
//!   survive a crash without `sync_dir` on the parent, and a removed
//!   subtree never reappears.
//! - Paths are keys compared component by component; `..` is not resolved.
//!   The roots `""` and `"/"` always exist.
//! - `rename` renames files only; renaming a folder fails with
//!   `Unsupported`.
//! - Files longer than [`MAX_FILE_LENGTH`] cannot be written (`EFBIG`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use proto::Rng;

use crate::storage::{Storage, StorageFile};

/// The longest file a [`FaultStorage`] holds (1 TiB); it keeps offset
/// arithmetic from overflowing. Writes and `set_len` past it fail with
/// `EFBIG`.
pub const MAX_FILE_LENGTH: u64 = 1 << 40;

/// `ENOSPC`: "No space left on device".
const NO_SPACE: i32 = 28;
/// `EFBIG`: "File too large".
const FILE_TOO_LARGE: i32 = 27;
/// `EISDIR`: "Is a directory".
const IS_A_FOLDER: i32 = 21;
/// `EEXIST`: "File exists".
const ALREADY_EXISTS: i32 = 17;
/// `ESTALE`: a handle whose file is gone (never expected).
const STALE_HANDLE: i32 = 116;

/// Identifies one file's content independently of its names.
type FileId = u64;

/// What survives a power loss, for [`FaultStorage::crash`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CrashMode {
    /// Every surviving file holds exactly its durable content: nothing
    /// written since its last successful `sync_data` survives.
    DurableOnly,
    /// Every surviving file holds its durable content, plus a seeded-random
    /// prefix (possibly empty, possibly all) of the bytes written past its
    /// durable length since its last sync (taken from its visible content,
    /// so for appends exactly a prefix of what was appended); every unsynced
    /// write over durable bytes keeps either the old or the new bytes (a
    /// seeded coin per write). An unsynced shrink by `set_len` happens or
    /// not (a coin). Files synced since their last write are unchanged.
    /// A direct write (`write_blocks_at`) over durable bytes and on into a
    /// hole that `set_len` made since the last sync keeps its bytes in the
    /// hole only if its bytes over durable ones took the new value: a file
    /// system that writes into a hole past its page cache (ext4, XFS)
    /// allocates unwritten blocks and marks them written only once the
    /// whole write has completed, so the hole never holds the write
    /// without the rest of it.
    TornTail,
}

/// An in-memory file system with crash semantics and fault injection.
///
/// A cheap handle: clones share one state behind one mutex, so the log's
/// I/O thread, readers and the test can all hold one. Faults can be set at
/// any time and apply to every clone.
#[derive(Clone)]
pub struct FaultStorage {
    shared: Arc<Mutex<State>>,
}

/// Everything a [`FaultStorage`] holds.
struct State {
    files: BTreeMap<FileId, FileContent>,
    folders: BTreeMap<PathBuf, Folder>,
    next_id: FileId,
    faults: Faults,
    counters: Counters,
}

/// The entries of one folder: name to file.
#[derive(Clone, Default)]
struct Folder {
    visible: BTreeMap<String, FileId>,
    durable: BTreeMap<String, FileId>,
}

/// The content of one file, independent of its names.
#[derive(Default)]
struct FileContent {
    visible: Vec<u8>,
    durable: Vec<u8>,
    /// Length of the prefix in which visible and durable bytes are known to
    /// be equal, so `sync_data` copies only what changed.
    in_sync_prefix: usize,
    /// Unsynced writes over durable bytes (clipped to the durable length),
    /// in order, for [`CrashMode::TornTail`].
    overwrites: Vec<Overwrite>,
    /// Bytes a `set_len` grew the file by since its last sync and nothing
    /// has written since: a hole, which a direct write fills whole or not
    /// at all (see [`CrashMode::TornTail`]).
    hole: Option<(usize, usize)>,
    open_handles: usize,
}

/// One unsynced write over durable bytes.
struct Overwrite {
    offset: usize,
    bytes: Vec<u8>,
    /// A direct write (`write_blocks_at`) that also reached past the
    /// durable length into a hole: its bytes there survive only with
    /// these.
    holds_the_rest: bool,
}

/// Injected faults, changed through [`FaultStorage`]'s methods.
#[derive(Default)]
struct Faults {
    /// Syncs that may still succeed; `None` for no limit.
    syncs_left: Option<u64>,
    /// Most visible bytes over all live files; `None` for no limit.
    space_limit: Option<u64>,
    /// Bytes the next write keeps before failing; `None` for a whole write.
    torn_write_keep: Option<usize>,
    /// Every `sync_data` waits while this is set: a disk that stalls.
    syncs_held: bool,
}

/// Counts of calls, for tests.
#[derive(Default)]
struct Counters {
    syncs: u64,
    writes: u64,
    bytes_written: u64,
}

/// One open file of a [`FaultStorage`].
struct FaultFile {
    shared: Arc<Mutex<State>>,
    id: FileId,
}

impl Default for FaultStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for FaultStorage {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        formatter
            .debug_struct("FaultStorage")
            .field("files", &state.files.len())
            .field("folders", &state.folders.len())
            .field("syncs", &state.counters.syncs)
            .field("writes", &state.counters.writes)
            .finish()
    }
}

impl FaultStorage {
    /// An empty storage holding only the roots `""` and `"/"`, with no
    /// faults.
    pub fn new() -> Self {
        Self::from_state(State::with_folders(BTreeMap::new(), 0))
    }

    fn from_state(state: State) -> Self {
        Self {
            shared: Arc::new(Mutex::new(state)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }

    /// Returns a new storage holding the image a power loss would leave now:
    /// folders hold their durable entries, and each file they name holds
    /// content chosen by `mode` and `seed` (see [`CrashMode`]). The same
    /// state, mode and seed always give the same image. The new storage has
    /// no faults and zero counters; `self` keeps working unchanged.
    pub fn crash(&self, mode: CrashMode, seed: u64) -> FaultStorage {
        let state = self.lock();
        let mut image = State::with_folders(BTreeMap::new(), state.next_id);
        for (path, folder) in &state.folders {
            for &id in folder.durable.values() {
                if image.files.contains_key(&id) {
                    continue;
                }
                if let Some(content) = state.files.get(&id) {
                    let mut random = Rng::new(seed ^ id.wrapping_mul(Rng::GAMMA));
                    let bytes = content.after_crash(mode, &mut random);
                    image.files.insert(id, FileContent::at_rest(bytes));
                }
            }
            let entries = folder.durable.clone();
            let folder = Folder {
                visible: entries.clone(),
                durable: entries,
            };
            image.folders.insert(path.clone(), folder);
        }
        FaultStorage::from_state(image)
    }

    /// Lets the next `n` calls of `sync_data` or `sync_dir` succeed; every
    /// later one fails with "injected fsync failure" and leaves durable
    /// content unchanged, like an fsync that returned `EIO`.
    pub fn fail_sync_after(&self, n: u64) {
        self.lock().faults.syncs_left = Some(n);
    }

    /// Limits the visible bytes over all live files (named or open). A write
    /// that would pass the limit writes the part that fits, then fails with
    /// `ENOSPC` ("No space left on device"); `None` removes the limit.
    pub fn set_space_limit(&self, bytes: Option<u64>) {
        self.lock().faults.space_limit = bytes;
    }

    /// Makes the next `write_at` (on any file) write only its first
    /// `keep_bytes` bytes and then fail with "injected torn write", even when
    /// `keep_bytes` covers the whole write.
    pub fn tear_next_write(&self, keep_bytes: usize) {
        self.lock().faults.torn_write_keep = Some(keep_bytes);
    }

    /// Makes every `sync_data` wait until [`FaultStorage::release_syncs`],
    /// like a disk that stalls: what waits for durability waits.
    pub fn hold_syncs(&self) {
        self.lock().faults.syncs_held = true;
    }

    /// Lets the syncs held by [`FaultStorage::hold_syncs`] go on.
    pub fn release_syncs(&self) {
        self.lock().faults.syncs_held = false;
    }

    /// Removes every injected fault: syncs succeed, space is unlimited,
    /// no write is torn and no sync is held.
    pub fn clear_faults(&self) {
        self.lock().faults = Faults::default();
    }

    /// Flips bit `bit_offset` (bit 0 is the lowest bit of byte 0) in both
    /// the visible and the durable content of the file at `path`, like
    /// media corruption. Fails when the bit is past both contents.
    pub fn flip_bit(&self, path: &Path, bit_offset: u64) -> io::Result<()> {
        let mut state = self.lock();
        let id = state.lookup_file(path)?;
        let content = state.content_mut(id)?;
        let byte = usize::try_from(bit_offset / 8).unwrap_or(usize::MAX);
        let mask = 1u8 << (bit_offset % 8);
        let mut flipped = false;
        for bytes in [&mut content.visible, &mut content.durable] {
            if let Some(value) = bytes.get_mut(byte) {
                *value ^= mask;
                flipped = true;
            }
        }
        if flipped {
            Ok(())
        } else {
            let message = format!("bit {bit_offset} is past the end of {}", path.display());
            Err(io::Error::new(io::ErrorKind::InvalidInput, message))
        }
    }

    /// Cuts (or extends with zeros) both the visible and the durable content
    /// of the file at `path` to `length` bytes, as if the file had been cut
    /// on disk; for tests that try every cut offset.
    pub fn truncate_to(&self, path: &Path, length: u64) -> io::Result<()> {
        let length = checked_length(length)?;
        let mut state = self.lock();
        let id = state.lookup_file(path)?;
        let content = state.content_mut(id)?;
        content.visible.resize(length, 0);
        content.durable.resize(length, 0);
        content.in_sync_prefix = content.in_sync_prefix.min(length);
        Ok(())
    }

    /// How many `sync_data` and `sync_dir` calls were made, failed ones
    /// included.
    pub fn sync_count(&self) -> u64 {
        self.lock().counters.syncs
    }

    /// How many `write_at` calls were made, failed ones included.
    pub fn write_count(&self) -> u64 {
        self.lock().counters.writes
    }

    /// How many bytes `write_at` put into files, counting the prefixes of
    /// torn and out-of-space writes.
    pub fn bytes_written(&self) -> u64 {
        self.lock().counters.bytes_written
    }

    /// Every named file (by its visible entry) with its visible length,
    /// sorted by path.
    pub fn files(&self) -> Vec<(PathBuf, u64)> {
        let state = self.lock();
        let mut files = Vec::new();
        for (folder_path, folder) in &state.folders {
            for (name, id) in &folder.visible {
                let length = state.files.get(id).map_or(0, |c| c.visible.len());
                files.push((folder_path.join(name), length as u64));
            }
        }
        files.sort();
        files
    }

    /// The visible content of the file at `path`, or `None` when no file
    /// has that name.
    pub fn read_file(&self, path: &Path) -> Option<Vec<u8>> {
        let state = self.lock();
        let id = state.lookup_file(path).ok()?;
        state.files.get(&id).map(|content| content.visible.clone())
    }
}

impl Storage for FaultStorage {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn StorageFile>> {
        let mut state = self.lock();
        let id = state.open_or_create(path, create)?;
        state.content_mut(id)?.open_handles += 1;
        Ok(Arc::new(FaultFile {
            shared: Arc::clone(&self.shared),
            id,
        }))
    }

    fn list(&self, folder: &Path) -> io::Result<Vec<String>> {
        let state = self.lock();
        let mut names: Vec<String> = state.folder(folder)?.visible.keys().cloned().collect();
        for path in state.folders.keys() {
            if path.parent() == Some(folder) {
                if let Some(name) = path.file_name() {
                    names.push(name.to_string_lossy().into_owned());
                }
            }
        }
        Ok(names)
    }

    fn create_dir_all(&self, folder: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let mut missing: Vec<&Path> = Vec::new();
        for ancestor in folder.ancestors() {
            if state.folders.contains_key(ancestor) {
                break;
            }
            missing.push(ancestor);
        }
        for path in missing.into_iter().rev() {
            if let Some(parent) = path.parent() {
                let (_, name) = split(path)?;
                let parent_folder = state.folders.get(parent);
                if parent_folder.is_some_and(|f| f.visible.contains_key(&name)) {
                    return Err(io::Error::from_raw_os_error(ALREADY_EXISTS));
                }
            }
            state.folders.insert(path.to_path_buf(), Folder::default());
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut state = self.lock();
        let id = state.lookup_file(path)?;
        let (parent, name) = split(path)?;
        state.folder_mut(parent)?.visible.remove(&name);
        state.forget_if_unreachable(id);
        Ok(())
    }

    fn remove_dir_all(&self, folder: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.folder(folder)?;
        let doomed: Vec<PathBuf> = state
            .folders
            .keys()
            .filter(|path| path.starts_with(folder))
            .cloned()
            .collect();
        let mut orphans = BTreeSet::new();
        for path in doomed {
            if let Some(removed) = state.folders.remove(&path) {
                orphans.extend(removed.visible.into_values());
                orphans.extend(removed.durable.into_values());
            }
        }
        for id in orphans {
            state.forget_if_unreachable(id);
        }
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut state = self.lock();
        if state.folders.contains_key(from) {
            let message = "FaultStorage renames files only";
            return Err(io::Error::new(io::ErrorKind::Unsupported, message));
        }
        let id = state.lookup_file(from)?;
        if state.folders.contains_key(to) {
            return Err(io::Error::from_raw_os_error(IS_A_FOLDER));
        }
        let (from_parent, from_name) = split(from)?;
        let (to_parent, to_name) = split(to)?;
        state.folder(to_parent)?;
        state.folder_mut(from_parent)?.visible.remove(&from_name);
        let replaced = state.folder_mut(to_parent)?.visible.insert(to_name, id);
        if let Some(replaced) = replaced.filter(|&replaced| replaced != id) {
            state.forget_if_unreachable(replaced);
        }
        Ok(())
    }

    fn sync_dir(&self, folder: &Path) -> io::Result<()> {
        let mut state = self.lock();
        state.folder(folder)?;
        state.begin_sync()?;
        let entries = state.folder_mut(folder)?;
        let dropped: Vec<FileId> = entries.durable.values().copied().collect();
        entries.durable = entries.visible.clone();
        for id in dropped {
            state.forget_if_unreachable(id);
        }
        Ok(())
    }

    fn exists(&self, path: &Path) -> bool {
        let state = self.lock();
        state.folders.contains_key(path) || state.lookup_file(path).is_ok()
    }
}

impl StorageFile for FaultFile {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<usize> {
        let state = lock(&self.shared);
        let visible = &state.content(self.id)?.visible;
        let start = match usize::try_from(offset) {
            Ok(start) if start < visible.len() => start,
            _ => return Ok(0),
        };
        let count = buffer.len().min(visible.len() - start);
        buffer[..count].copy_from_slice(&visible[start..start + count]);
        Ok(count)
    }

    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        lock(&self.shared).write(self.id, bytes, offset, false)
    }

    fn write_blocks_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        lock(&self.shared).write(self.id, bytes, offset, true)
    }

    fn sync_data(&self) -> io::Result<()> {
        while lock(&self.shared).faults.syncs_held {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let mut state = lock(&self.shared);
        state.content(self.id)?;
        state.begin_sync()?;
        state.content_mut(self.id)?.sync();
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        let state = lock(&self.shared);
        Ok(state.content(self.id)?.visible.len() as u64)
    }

    fn set_len(&self, length: u64) -> io::Result<()> {
        let mut state = lock(&self.shared);
        let new_length = checked_length(length)?;
        let old_length = state.content(self.id)?.visible.len();
        if new_length > old_length {
            let available = state.space_available().unwrap_or(u64::MAX);
            if (new_length - old_length) as u64 > available {
                return Err(io::Error::from_raw_os_error(NO_SPACE));
            }
        }
        state.content_mut(self.id)?.set_length(new_length);
        Ok(())
    }
}

impl Drop for FaultFile {
    fn drop(&mut self) {
        let mut state = lock(&self.shared);
        if let Some(content) = state.files.get_mut(&self.id) {
            content.open_handles = content.open_handles.saturating_sub(1);
        }
        state.forget_if_unreachable(self.id);
    }
}

impl State {
    /// A state holding `folders` plus the two roots, with no files.
    fn with_folders(mut folders: BTreeMap<PathBuf, Folder>, next_id: FileId) -> Self {
        for root in ["", "/"] {
            folders.entry(PathBuf::from(root)).or_default();
        }
        Self {
            files: BTreeMap::new(),
            folders,
            next_id,
            faults: Faults::default(),
            counters: Counters::default(),
        }
    }

    fn folder(&self, path: &Path) -> io::Result<&Folder> {
        self.folders.get(path).ok_or_else(|| not_found(path))
    }

    fn folder_mut(&mut self, path: &Path) -> io::Result<&mut Folder> {
        self.folders.get_mut(path).ok_or_else(|| not_found(path))
    }

    fn content(&self, id: FileId) -> io::Result<&FileContent> {
        self.files
            .get(&id)
            .ok_or_else(|| io::Error::from_raw_os_error(STALE_HANDLE))
    }

    fn content_mut(&mut self, id: FileId) -> io::Result<&mut FileContent> {
        self.files
            .get_mut(&id)
            .ok_or_else(|| io::Error::from_raw_os_error(STALE_HANDLE))
    }

    /// The file a visible entry names at `path`.
    fn lookup_file(&self, path: &Path) -> io::Result<FileId> {
        if self.folders.contains_key(path) {
            return Err(io::Error::from_raw_os_error(IS_A_FOLDER));
        }
        let (parent, name) = split(path)?;
        let folder = self.folders.get(parent).ok_or_else(|| not_found(path))?;
        folder
            .visible
            .get(&name)
            .copied()
            .ok_or_else(|| not_found(path))
    }

    fn open_or_create(&mut self, path: &Path, create: bool) -> io::Result<FileId> {
        if self.folders.contains_key(path) {
            return Err(io::Error::from_raw_os_error(IS_A_FOLDER));
        }
        let (parent, name) = split(path)?;
        let id = self.next_id;
        let folder = self.folder_mut(parent)?;
        if let Some(&existing) = folder.visible.get(&name) {
            return Ok(existing);
        }
        if !create {
            return Err(not_found(path));
        }
        folder.visible.insert(name, id);
        self.files.insert(id, FileContent::default());
        self.next_id += 1;
        Ok(id)
    }

    /// Drops a file's content once no handle holds it and no visible or
    /// durable entry names it.
    fn forget_if_unreachable(&mut self, id: FileId) {
        if self.files.get(&id).is_some_and(|c| c.open_handles > 0) {
            return;
        }
        let named = self.folders.values().any(|folder| {
            let mut ids = folder.visible.values().chain(folder.durable.values());
            ids.any(|&named| named == id)
        });
        if !named {
            self.files.remove(&id);
        }
    }

    /// Counts a sync and fails it when the injected budget is spent.
    fn begin_sync(&mut self) -> io::Result<()> {
        self.counters.syncs += 1;
        match &mut self.faults.syncs_left {
            Some(0) => Err(io::Error::other("injected fsync failure")),
            Some(left) => {
                *left -= 1;
                Ok(())
            }
            None => Ok(()),
        }
    }

    /// Bytes that files may still grow by, or `None` without a limit.
    fn space_available(&self) -> Option<u64> {
        let limit = self.faults.space_limit?;
        let named: BTreeSet<FileId> = self
            .folders
            .values()
            .flat_map(|folder| folder.visible.values().copied())
            .collect();
        let used: u64 = self
            .files
            .iter()
            .filter(|(id, content)| content.open_handles > 0 || named.contains(id))
            .map(|(_, content)| content.visible.len() as u64)
            .sum();
        Some(limit.saturating_sub(used))
    }

    /// `write_at` (`write_blocks_at` when `direct`): applies a torn-write
    /// fault and the space limit, writes what is left, and reports the
    /// fault.
    fn write(&mut self, id: FileId, bytes: &[u8], offset: u64, direct: bool) -> io::Result<()> {
        self.counters.writes += 1;
        let old_length = self.content(id)?.visible.len() as u64;
        let mut bytes = bytes;
        let mut failure = None;
        if let Some(keep) = self.faults.torn_write_keep.take() {
            bytes = &bytes[..keep.min(bytes.len())];
            failure = Some(io::Error::other("injected torn write"));
        }
        let end = offset.saturating_add(bytes.len() as u64);
        if let Some(available) = self.space_available() {
            let room_end = old_length.saturating_add(available);
            if end > room_end {
                let fits = room_end.saturating_sub(offset).min(bytes.len() as u64);
                bytes = &bytes[..fits as usize];
                failure = Some(io::Error::from_raw_os_error(NO_SPACE));
            }
        }
        if !bytes.is_empty() {
            let end = checked_length(offset.saturating_add(bytes.len() as u64))?;
            self.content_mut(id)?
                .write(bytes, end - bytes.len(), direct);
            self.counters.bytes_written += bytes.len() as u64;
        }
        failure.map_or(Ok(()), Err)
    }
}

impl FileContent {
    /// A file whose visible and durable content are both `bytes`.
    fn at_rest(bytes: Vec<u8>) -> Self {
        Self {
            in_sync_prefix: bytes.len(),
            visible: bytes.clone(),
            durable: bytes,
            overwrites: Vec::new(),
            hole: None,
            open_handles: 0,
        }
    }

    fn write(&mut self, bytes: &[u8], offset: usize, direct: bool) {
        let old_length = self.visible.len();
        let end = offset + bytes.len();
        if end > old_length {
            self.visible.resize(end, 0);
        }
        self.visible[offset..end].copy_from_slice(bytes);
        self.in_sync_prefix = self.in_sync_prefix.min(offset.min(old_length));
        let durable_end = end.min(self.durable.len());
        let into_hole = self
            .hole
            .take()
            .is_some_and(|(from, to)| from <= offset.max(durable_end) && end <= to);
        if offset < durable_end {
            self.overwrites.push(Overwrite {
                offset,
                bytes: bytes[..durable_end - offset].to_vec(),
                holds_the_rest: direct && into_hole && end > durable_end,
            });
        }
    }

    fn set_length(&mut self, length: usize) {
        let old_length = self.visible.len();
        self.hole = match self.hole {
            _ if length <= old_length => None,
            Some((from, to)) if to == old_length => Some((from, length)),
            _ => Some((old_length, length)),
        };
        self.visible.resize(length, 0);
        self.in_sync_prefix = self.in_sync_prefix.min(length.min(old_length));
    }

    /// `sync_data`: durable content becomes the visible content.
    fn sync(&mut self) {
        let keep = self.in_sync_prefix.min(self.durable.len());
        self.durable.truncate(keep);
        self.durable.extend_from_slice(&self.visible[keep..]);
        self.in_sync_prefix = self.visible.len();
        self.overwrites.clear();
        self.hole = None;
    }

    /// The content a power loss leaves, per [`CrashMode`].
    fn after_crash(&self, mode: CrashMode, random: &mut Rng) -> Vec<u8> {
        let mut image = self.durable.clone();
        if mode == CrashMode::DurableOnly {
            return image;
        }
        // Whether bytes past the durable length may survive: not after a
        // direct write across it whose bytes over durable ones did not.
        let mut past = true;
        for overwrite in &self.overwrites {
            let end = (overwrite.offset + overwrite.bytes.len()).min(image.len());
            let new = random.coin();
            if new && overwrite.offset < end {
                let count = end - overwrite.offset;
                image[overwrite.offset..end].copy_from_slice(&overwrite.bytes[..count]);
            }
            past &= new || !overwrite.holds_the_rest;
        }
        let durable_length = image.len();
        if self.visible.len() > durable_length {
            let kept = prefix_length(random, self.visible.len() - durable_length);
            let kept = if past { kept } else { 0 };
            image.extend_from_slice(&self.visible[durable_length..durable_length + kept]);
        } else if self.visible.len() < durable_length && random.coin() {
            image.truncate(self.visible.len());
        }
        image
    }
}

/// Locks the state; a panic in another thread while holding the lock does
/// not make the storage unusable (the state is still consistent).
fn lock(shared: &Mutex<State>) -> MutexGuard<'_, State> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Splits `path` into its folder and its name.
fn split(path: &Path) -> io::Result<(&Path, String)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name.to_string_lossy().into_owned())),
        _ => {
            let message = format!("{} names no file", path.display());
            Err(io::Error::new(io::ErrorKind::InvalidInput, message))
        }
    }
}

fn not_found(path: &Path) -> io::Error {
    let message = format!("{}: no such file or folder", path.display());
    io::Error::new(io::ErrorKind::NotFound, message)
}

/// `length` as a `usize`, or `EFBIG` past [`MAX_FILE_LENGTH`].
fn checked_length(length: u64) -> io::Result<usize> {
    if length > MAX_FILE_LENGTH {
        return Err(io::Error::from_raw_os_error(FILE_TOO_LARGE));
    }
    usize::try_from(length).map_err(|_| io::Error::from_raw_os_error(FILE_TOO_LARGE))
}

/// A length in `0..=total`: none and all a quarter of the time each,
/// otherwise uniform, so both edges are tested often.
fn prefix_length(random: &mut Rng, total: usize) -> usize {
    match random.below(4) {
        0 => 0,
        1 => total,
        _ => random.below(total as u64 + 1) as usize,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{read_all, write_atomically};

    fn path(text: &str) -> &Path {
        Path::new(text)
    }

    /// A storage with a folder `log` holding a file `log/a` whose durable
    /// content (and name) is `durable`.
    fn storage_with_durable_file(durable: &[u8]) -> (FaultStorage, Arc<dyn StorageFile>) {
        let storage = FaultStorage::new();
        storage.create_dir_all(path("log")).unwrap();
        let file = storage.open(path("log/a"), true).unwrap();
        file.write_at(durable, 0).unwrap();
        file.sync_data().unwrap();
        storage.sync_dir(path("log")).unwrap();
        (storage, file)
    }

    #[test]
    fn writes_are_readable_at_once() {
        let (storage, file) = storage_with_durable_file(b"durable");
        file.write_at(b"more", 7).unwrap();
        let mut buffer = [0; 11];
        file.read_exact_at(&mut buffer, 0).unwrap();
        assert_eq!(&buffer, b"durablemore");
        assert_eq!(file.read_at(&mut buffer, 11).unwrap(), 0);
        assert_eq!(storage.read_file(path("log/a")).unwrap(), b"durablemore");
    }

    #[test]
    fn unsynced_appends_vanish_on_a_durable_only_crash() {
        let (storage, file) = storage_with_durable_file(b"durable");
        file.write_at(b" and lost", 7).unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 1);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"durable");
    }

    #[test]
    fn synced_writes_survive_a_durable_only_crash() {
        let (storage, file) = storage_with_durable_file(b"durable");
        file.write_at(b" and kept", 7).unwrap();
        file.write_at(b"D", 0).unwrap();
        file.sync_data().unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 1);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"Durable and kept");
    }

    #[test]
    fn a_file_whose_folder_was_not_synced_vanishes_on_crash() {
        let (storage, _) = storage_with_durable_file(b"durable");
        let file = storage.open(path("log/b"), true).unwrap();
        file.write_at(b"synced data", 0).unwrap();
        file.sync_data().unwrap();
        let image = storage.crash(CrashMode::TornTail, 3);
        assert!(!image.exists(path("log/b")));
        assert!(image.exists(path("log/a")));
        storage.sync_dir(path("log")).unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 3);
        assert_eq!(image.read_file(path("log/b")).unwrap(), b"synced data");
    }

    #[test]
    fn a_removed_file_reappears_with_its_durable_content_when_its_folder_was_not_synced() {
        let (storage, file) = storage_with_durable_file(b"durable");
        file.write_at(b" unsynced", 7).unwrap();
        drop(file);
        storage.remove_file(path("log/a")).unwrap();
        assert!(!storage.exists(path("log/a")));
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"durable");
        storage.sync_dir(path("log")).unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert!(!image.exists(path("log/a")));
        assert!(storage.files().is_empty());
    }

    #[test]
    fn a_rename_not_followed_by_a_folder_sync_reverts_on_crash() {
        let (storage, _) = storage_with_durable_file(b"durable");
        storage.rename(path("log/a"), path("log/b")).unwrap();
        assert_eq!(storage.read_file(path("log/b")).unwrap(), b"durable");
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"durable");
        assert!(!image.exists(path("log/b")));
        storage.sync_dir(path("log")).unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert!(!image.exists(path("log/a")));
        assert_eq!(image.read_file(path("log/b")).unwrap(), b"durable");
    }

    #[test]
    fn write_atomically_leaves_old_or_new_content_after_a_crash() {
        let (storage, _) = storage_with_durable_file(b"old");
        write_atomically(&storage, path("log/a"), b"new").unwrap();
        let image = storage.crash(CrashMode::TornTail, 5);
        assert_eq!(read_all(&image, path("log/a")).unwrap(), b"new");
        storage.fail_sync_after(1);
        let error = write_atomically(&storage, path("log/a"), b"newer").unwrap_err();
        assert_eq!(error.to_string(), "injected fsync failure");
        let image = storage.crash(CrashMode::TornTail, 5);
        assert_eq!(read_all(&image, path("log/a")).unwrap(), b"new");
        assert_eq!(image.list(path("log")).unwrap(), vec!["a".to_string()]);
    }

    #[test]
    fn torn_tail_keeps_a_prefix_of_unsynced_appends() {
        let (storage, file) = storage_with_durable_file(b"durable");
        file.write_at(b" first", 7).unwrap();
        file.write_at(b" second", 13).unwrap();
        let full = storage.read_file(path("log/a")).unwrap();
        let mut lengths = BTreeSet::new();
        for seed in 0..200 {
            let image = storage.crash(CrashMode::TornTail, seed);
            let bytes = image.read_file(path("log/a")).unwrap();
            assert!(bytes.len() >= 7, "seed {seed} lost durable bytes");
            assert_eq!(bytes[..], full[..bytes.len()], "seed {seed}");
            lengths.insert(bytes.len());
        }
        assert!(lengths.contains(&7));
        assert!(lengths.contains(&full.len()));
        assert!(lengths.len() > 4, "only lengths {lengths:?}");
    }

    #[test]
    fn torn_tail_keeps_old_or_new_bytes_for_each_unsynced_overwrite() {
        let (storage, file) = storage_with_durable_file(b"aaaabbbb");
        file.write_at(b"AAAA", 0).unwrap();
        file.write_at(b"BBBB", 4).unwrap();
        let mut images = BTreeSet::new();
        for seed in 0..100 {
            let image = storage.crash(CrashMode::TornTail, seed);
            images.insert(image.read_file(path("log/a")).unwrap());
        }
        let expected: BTreeSet<Vec<u8>> = [b"aaaabbbb", b"AAAAbbbb", b"aaaaBBBB", b"AAAABBBB"]
            .into_iter()
            .map(|bytes| bytes.to_vec())
            .collect();
        assert_eq!(images, expected);
    }

    #[test]
    fn a_direct_write_into_a_hole_keeps_its_bytes_there_only_with_the_rest() {
        // Durable "aaaa"; the file grows by a hole of 4, and one write puts
        // "AABB" over the last two durable bytes and the hole's first two.
        let images = |direct: bool| {
            let (storage, file) = storage_with_durable_file(b"aaaa");
            file.set_len(8).unwrap();
            match direct {
                true => file.write_blocks_at(b"AABB", 2).unwrap(),
                false => file.write_at(b"AABB", 2).unwrap(),
            }
            (0..200)
                .map(|seed| {
                    let image = storage.crash(CrashMode::TornTail, seed);
                    image.read_file(path("log/a")).unwrap()
                })
                .collect::<BTreeSet<Vec<u8>>>()
        };
        let direct = images(true);
        assert!(direct.contains(b"aaAABB\0\0".as_slice()), "{direct:?}");
        assert!(direct.contains(b"aaaa".as_slice()), "{direct:?}");
        for image in &direct {
            assert!(
                image.len() <= 4 || image.starts_with(b"aaAA"),
                "a direct write's bytes in the hole survived without the rest: {image:?}"
            );
        }
        // A write through the page cache has no such order.
        assert!(
            images(false)
                .iter()
                .any(|image| image.starts_with(b"aaaaB")),
            "{:?}",
            images(false)
        );
    }

    #[test]
    fn crash_images_are_reproducible_from_the_seed() {
        let (storage, file) = storage_with_durable_file(b"0123456789");
        file.write_at(b"xy", 2).unwrap();
        file.write_at(&[7; 500], 10).unwrap();
        let other = storage.open(path("log/b"), true).unwrap();
        other.write_at(&[9; 300], 0).unwrap();
        storage.sync_dir(path("log")).unwrap();
        let images = |seed| {
            let image = storage.crash(CrashMode::TornTail, seed);
            (image.files(), image.read_file(path("log/a")))
        };
        for seed in 0..20 {
            assert_eq!(images(seed), images(seed));
        }
        let distinct: BTreeSet<_> = (0..20).map(images).collect();
        assert!(distinct.len() > 1);
    }

    #[test]
    fn the_old_handle_keeps_its_state_after_a_crash() {
        let (storage, file) = storage_with_durable_file(b"durable");
        file.write_at(b"!", 7).unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 0);
        file.write_at(b"?", 8).unwrap();
        assert_eq!(storage.read_file(path("log/a")).unwrap(), b"durable!?");
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"durable");
        let reopened = image.open(path("log/a"), false).unwrap();
        reopened.write_at(b"#", 7).unwrap();
        assert_eq!(storage.read_file(path("log/a")).unwrap(), b"durable!?");
    }

    #[test]
    fn sync_failures_do_not_advance_durable_content() {
        let (storage, file) = storage_with_durable_file(b"durable");
        storage.fail_sync_after(1);
        file.write_at(b" one", 7).unwrap();
        file.sync_data().unwrap();
        file.write_at(b" two", 11).unwrap();
        let error = file.sync_data().unwrap_err();
        assert_eq!(error.to_string(), "injected fsync failure");
        assert!(file.sync_data().is_err());
        assert!(storage.sync_dir(path("log")).is_err());
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"durable one");
        storage.clear_faults();
        file.sync_data().unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"durable one two");
    }

    #[test]
    fn space_limit_writes_a_prefix_then_reports_enospc() {
        let (storage, file) = storage_with_durable_file(b"0123456789");
        storage.set_space_limit(Some(14));
        file.write_at(b"ab", 0).unwrap();
        let error = file.write_at(b"abcdefgh", 10).unwrap_err();
        assert_eq!(error.raw_os_error(), Some(28));
        assert!(error.to_string().contains("No space left on device"));
        assert_eq!(storage.read_file(path("log/a")).unwrap(), b"ab23456789abcd");
        assert_eq!(file.set_len(15).unwrap_err().raw_os_error(), Some(28));
        storage.set_space_limit(None);
        file.write_at(b"efgh", 14).unwrap();
        assert_eq!(file.len().unwrap(), 18);
    }

    #[test]
    fn a_torn_write_keeps_only_its_first_bytes_and_fails() {
        let (storage, file) = storage_with_durable_file(b"");
        storage.tear_next_write(3);
        let error = file.write_at(b"abcdef", 0).unwrap_err();
        assert_eq!(error.to_string(), "injected torn write");
        assert_eq!(storage.read_file(path("log/a")).unwrap(), b"abc");
        file.write_at(b"def", 3).unwrap();
        assert_eq!(storage.read_file(path("log/a")).unwrap(), b"abcdef");
    }

    #[test]
    fn flipping_a_bit_changes_visible_and_durable_content() {
        let (storage, file) = storage_with_durable_file(b"\x00\x00");
        storage.flip_bit(path("log/a"), 9).unwrap();
        let mut buffer = [0; 2];
        file.read_exact_at(&mut buffer, 0).unwrap();
        assert_eq!(buffer, [0, 2]);
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert_eq!(image.read_file(path("log/a")).unwrap(), [0, 2]);
        assert!(storage.flip_bit(path("log/a"), 16).is_err());
        assert!(storage.flip_bit(path("log/missing"), 0).is_err());
    }

    #[test]
    fn truncate_to_cuts_visible_and_durable_content() {
        let (storage, file) = storage_with_durable_file(b"0123456789");
        file.write_at(b"abc", 10).unwrap();
        storage.truncate_to(path("log/a"), 4).unwrap();
        assert_eq!(file.len().unwrap(), 4);
        for mode in [CrashMode::DurableOnly, CrashMode::TornTail] {
            let image = storage.crash(mode, 9);
            assert_eq!(image.read_file(path("log/a")).unwrap(), b"0123");
        }
        file.write_at(b"x", 4).unwrap();
        file.sync_data().unwrap();
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert_eq!(image.read_file(path("log/a")).unwrap(), b"0123x");
    }

    #[test]
    fn creating_a_file_in_a_missing_folder_is_not_found() {
        let storage = FaultStorage::new();
        let error = storage.open(path("missing/a"), true).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        let error = storage.open(path("a"), false).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::NotFound);
        storage.open(path("a"), true).unwrap();
        storage.open(path("/a"), true).unwrap();
        assert!(storage.create_dir_all(path("a/b")).is_err());
        assert_eq!(storage.files().len(), 2);
    }

    #[test]
    fn list_names_direct_children_files_and_folders() {
        let storage = FaultStorage::new();
        storage
            .create_dir_all(path("/data/streams/one/deep"))
            .unwrap();
        storage.create_dir_all(path("/data/streams/two")).unwrap();
        storage.open(path("/data/streams/manifest"), true).unwrap();
        let mut names = storage.list(path("/data/streams")).unwrap();
        names.sort();
        assert_eq!(names, ["manifest", "one", "two"]);
        assert!(storage.list(path("/nowhere")).is_err());
    }

    #[test]
    fn remove_dir_all_removes_the_subtree() {
        let storage = FaultStorage::new();
        storage.create_dir_all(path("data/one/deep")).unwrap();
        storage.create_dir_all(path("data/other")).unwrap();
        storage.open(path("data/one/deep/a"), true).unwrap();
        storage.sync_dir(path("data/one/deep")).unwrap();
        storage.remove_dir_all(path("data/one")).unwrap();
        assert!(!storage.exists(path("data/one")));
        assert!(!storage.exists(path("data/one/deep/a")));
        assert!(storage.exists(path("data/other")));
        assert_eq!(storage.list(path("data")).unwrap(), ["other"]);
        let image = storage.crash(CrashMode::DurableOnly, 0);
        assert!(!image.exists(path("data/one/deep/a")));
    }

    #[test]
    fn an_open_handle_to_a_removed_file_keeps_working() {
        let (storage, file) = storage_with_durable_file(b"durable");
        storage.remove_file(path("log/a")).unwrap();
        storage.sync_dir(path("log")).unwrap();
        file.write_at(b"!", 7).unwrap();
        file.sync_data().unwrap();
        assert_eq!(file.len().unwrap(), 8);
        assert!(storage.files().is_empty());
    }

    #[test]
    fn counters_count_syncs_writes_and_bytes() {
        let (storage, file) = storage_with_durable_file(b"abc");
        assert_eq!(storage.sync_count(), 2);
        assert_eq!(storage.write_count(), 1);
        storage.tear_next_write(1);
        assert!(file.write_at(b"def", 3).is_err());
        storage.fail_sync_after(0);
        assert!(file.sync_data().is_err());
        assert_eq!(storage.sync_count(), 3);
        assert_eq!(storage.write_count(), 2);
        assert_eq!(storage.bytes_written(), 4);
    }

    #[test]
    fn concurrent_writers_and_readers_share_one_storage() {
        let storage = FaultStorage::new();
        storage.create_dir_all(path("log")).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|index| {
                let storage = storage.clone();
                std::thread::spawn(move || {
                    let name = PathBuf::from(format!("log/{index}"));
                    let file = storage.open(&name, true).unwrap();
                    for round in 0..100u64 {
                        file.write_at(&round.to_le_bytes(), round * 8).unwrap();
                        file.sync_data().unwrap();
                        let mut buffer = [0; 8];
                        file.read_exact_at(&mut buffer, round * 8).unwrap();
                        assert_eq!(u64::from_le_bytes(buffer), round);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        assert_eq!(storage.write_count(), 400);
        assert_eq!(storage.sync_count(), 400);
        let lengths: Vec<u64> = storage.files().iter().map(|(_, length)| *length).collect();
        assert_eq!(lengths, [800; 4]);
    }
}
