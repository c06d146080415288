//! The I/O thread of a log: takes pending chunks, writes and syncs them,
//! publishes the durable version, and latches the log failed on any error.
//!
//! It is a plain thread, not a task: fdatasync blocks, and a blocked async
//! worker would stall unrelated connections.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::config::Durability;
use crate::error::LogError;
use crate::journal::SegmentPath;
use crate::log::{Shared, Tail, Writing};
use crate::storage::{StorageFile, BLOCK_BYTES};

/// Spare buffers a `Sync` log keeps for reuse between batches.
const SPARE_BUFFERS_MAX: usize = 4;

/// After a small batch the tail segment is kept this far ahead of its
/// last record with zeros, so that the fdatasync of the next small batch
/// flushes data only: a write that grows the file also changes its size,
/// and syncing that metadata costs a journal commit on every batch.
/// Public so that a benchmark's bare fdatasync can write into a file of
/// the same shape (`bench::fdatasync`).
pub const PREALLOCATE_AHEAD_BYTES: u64 = 1024 * 1024;
/// Zeros written per preallocation step.
const PREALLOCATE_STEP_BYTES: usize = 1024 * 1024;
/// A batch of this many bytes or more writes no zeros ahead of it. Zeros
/// save each batch a metadata commit, which is worth it while a batch is
/// small; past this the zeros cost the disk about as much time and as
/// many bytes as the batches themselves (written by the same thread
/// between batches), and the commit is small beside a batch. Such
/// batches, once past the zeros, grow the file by a hole first and are
/// written into it past the page cache (docs/results.md, "NATS JetStream
/// in the same run, and zeros ahead of small batches only"; "Large
/// batches past the page cache"). The size from which a log's batch in a
/// journal round of many logs goes to a direct writer: at 100 streams
/// and 16 clients most batches are 32 to 64 KiB, and zeros ahead of them
/// were half of what the direct writers wrote, for the same throughput
/// ("Zeros ahead of batches under 32 KiB only").
const ZEROS_BATCH_BYTES_MAX: u64 = crate::journal::DIRECT_BYTES_MIN as u64;

/// One preallocation step of zeros, on a block boundary so it can be
/// written past the page cache like the records.
#[repr(C, align(4096))]
struct Zeros([u8; PREALLOCATE_STEP_BYTES]);
static ZEROS: Zeros = Zeros([0; PREALLOCATE_STEP_BYTES]);

impl crate::journal::Member for Shared {
    fn take_journaled(&self) -> Vec<crate::log::Chunk> {
        self.take_pending(false).unwrap_or_default()
    }

    fn set_in_flight(&self) {
        self.lock_state().in_flight = true;
    }

    fn take_direct(&self) -> Option<Vec<crate::log::Chunk>> {
        self.take_pending(true)
    }

    fn finish_in_flight(&self) -> bool {
        let mut state = self.lock_state();
        state.in_flight = false;
        std::mem::take(&mut state.passed_over)
    }

    fn write(
        &self,
        batch: Vec<crate::log::Chunk>,
        started: Instant,
        dirty: Option<&mut crate::journal::Dirty>,
    ) {
        let mut guard = self.journal_tail.lock().expect("tail lock poisoned");
        let writing =
            guard.get_or_insert_with(|| self.writing(self.tail_of(batch[0].segment_base)));
        self.write_and_complete(writing, batch, started, dirty);
    }

    fn latch_io(&self, message: String) {
        self.latch_message(Arc::from(message));
    }

    fn take_listing(&self) -> bool {
        let mut kept = self.kept.lock().expect("kept lock poisoned");
        let list = !kept.bytes.is_empty() && !kept.listed;
        kept.listed |= list;
        list
    }

    fn spill(&self, dirty: &mut crate::journal::Dirty) -> Result<(), LogError> {
        let spilled = self.spill_kept(&mut Vec::new());
        if let Err(error) = &spilled {
            self.latch_message(Arc::from(error.to_string()));
        }
        let mut kept = self.kept.lock().expect("kept lock poisoned");
        kept.listed = false;
        // Whoever wrote kept blocks since the last rotation: synced now.
        dirty.extend(kept.written.take());
        spilled
    }

    fn segment_path(&self, root: &std::path::Path, base: u64) -> Arc<str> {
        let mut cached = self.journal_path.lock().expect("path lock poisoned");
        match &*cached {
            Some((cached_base, path)) if *cached_base == base => Arc::clone(path),
            _ => {
                let path = crate::segment::segment_path(&self.folder, base);
                let relative: Arc<str> = Arc::from(
                    path.strip_prefix(root)
                        .unwrap_or(&path)
                        .to_string_lossy()
                        .as_ref(),
                );
                *cached = Some((base, Arc::clone(&relative)));
                relative
            }
        }
    }
}

impl Shared {
    /// Everything pending, the log no longer queued on its journal; `None`
    /// while a direct writer has a batch of the log (it stays queued and
    /// is marked passed over, so that writer puts it back in the list
    /// when done) or once it failed. `in_flight`: the caller writes the
    /// batch itself, and the log is marked in flight in the same step.
    fn take_pending(&self, in_flight: bool) -> Option<Vec<crate::log::Chunk>> {
        let mut state = self.lock_state();
        if state.in_flight {
            state.passed_over = true;
            return None;
        }
        state.queued = false;
        if state.failed.is_some() {
            return None;
        }
        state.in_flight = in_flight;
        Some(state.pending.drain(..).collect())
    }

    /// The path of the segment with first version `base` (the last one
    /// asked for is kept).
    fn segment_path_of(&self, base: u64) -> SegmentPath {
        let mut cached = self.last_segment_path.lock().expect("path lock poisoned");
        match &*cached {
            Some((cached_base, path)) if *cached_base == base => Arc::clone(path),
            _ => {
                let path: SegmentPath = crate::segment::segment_path(&self.folder, base).into();
                *cached = Some((base, Arc::clone(&path)));
                path
            }
        }
    }

    /// A writer starting at `tail`: its first batch follows the durable
    /// version.
    fn writing(&self, tail: Tail) -> Writing {
        Writing {
            tail,
            next_version: Some(self.progress.borrow().durable + 1),
        }
    }

    pub(crate) fn run_io(self: Arc<Self>) {
        let mut writing = self.writing(self.current_tail());
        while let Some(batch) = self.next_batch() {
            if !self.write_and_complete(&mut writing, batch, Instant::now(), None) {
                return;
            }
        }
        self.close_tail(&writing.tail);
    }

    /// Writes a batch (past the page cache and synced, or, with `dirty`,
    /// through the page cache for a journal round whose frames are
    /// already durable), then publishes it durable; on an error latches
    /// the log failed and returns false.
    fn write_and_complete(
        &self,
        writing: &mut Writing,
        mut batch: Vec<crate::log::Chunk>,
        started: Instant,
        dirty: Option<&mut crate::journal::Dirty>,
    ) -> bool {
        let (reset, failed) = {
            let mut state = self.lock_state();
            (
                std::mem::take(&mut state.tail_reset),
                state.failed.is_some(),
            )
        };
        if failed {
            // A latched log writes nothing more (nor acknowledges it): a
            // batch taken before the failure is dropped.
            return false;
        }
        if reset {
            // A reset replaced every segment: the old tail is gone, and
            // the batch starts the new one.
            writing.tail = self.tail_of(batch[0].segment_base);
            writing.next_version = None;
        }
        // Batches go to the disk in version order. One that does not
        // start where the last ended would be synced, and its records
        // acknowledged, over a hole where the versions between belong:
        // a bug upstream (two batches of the log written by two threads
        // at once), which latches the log rather than write it.
        let first = batch[0].last_version + 1 - batch[0].records.max(1);
        if let Some(next) = writing.next_version.filter(|&next| next != first) {
            let last = batch.last().map_or(first, |chunk| chunk.last_version);
            self.latch_message(Arc::from(format!(
                "a batch of versions {first} to {last} came to be written where version {next} is next; refusing to write it out of order"
            )));
            return false;
        }
        // A journal round's bytes go through the page cache, unsynced:
        // zeros ahead of them would save no fdatasync, and would cost the
        // disk as many bytes again.
        let journaled = dirty.is_some();
        let written = self.write_batch(&mut batch, &mut writing.tail, dirty);
        match written {
            Ok(()) => {
                let last = batch.last().expect("a batch is never empty");
                writing.next_version = Some(last.last_version + 1);
                let end = last.offset + last.bytes.len() as u64;
                let in_tail = last.segment_base == writing.tail.base;
                let bytes: u64 = batch.iter().map(|c| c.bytes.len() as u64).sum();
                self.complete(batch, started);
                if in_tail && !journaled && bytes < ZEROS_BATCH_BYTES_MAX {
                    self.preallocate(&mut writing.tail, end);
                }
                true
            }
            Err(error) => {
                self.latch(error);
                false
            }
        }
    }

    /// A clean shutdown leaves the tail segment ending in its last record,
    /// as if no zeros had been written ahead.
    fn close_tail(&self, tail: &Tail) {
        if self.lock_state().failed.is_none() {
            let mut touched = Vec::new();
            // A journaled log's kept blocks go to its segment, synced:
            // the journal forgets a closed log.
            let trimmed = self
                .spill_kept(&mut touched)
                .and_then(|()| self.trim_tail(tail, &mut touched))
                .and_then(|()| sync_all(&touched));
            if let Err(error) = trimmed {
                self.latch(error);
            }
        }
    }

    /// A journaled log being dropped: waits until the journal's thread has
    /// made everything appended durable (or the log failed), then trims
    /// its tail as a log of its own does at shutdown.
    pub(crate) fn close_journaled(&self) {
        loop {
            let progress = self.progress.borrow().clone();
            if progress.failed.is_some() || progress.durable >= self.lock_state().last_version {
                break;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
        let guard = self.journal_tail.lock().expect("tail lock poisoned");
        if let Some(writing) = guard.as_ref() {
            self.close_tail(&writing.tail);
        }
    }

    /// The segment writing goes on in: that of the oldest chunk not yet
    /// written, or the last segment when none is pending (appends may have
    /// opened later segments before this thread started).
    fn current_tail(&self) -> Tail {
        let base = {
            let state = self.lock_state();
            match state.pending.front() {
                Some(chunk) => chunk.segment_base,
                None => {
                    state
                        .segments
                        .last()
                        .expect("a disk log has a segment")
                        .base
                }
            }
        };
        self.tail_of(base)
    }

    /// The tail as segment `base` stands on disk, before this thread wrote
    /// to it.
    fn tail_of(&self, base: u64) -> Tail {
        let allocated = self
            .segment_file(base)
            .and_then(|f| f.len().ok())
            .unwrap_or(0);
        Tail {
            base,
            allocated,
            zeroed: allocated,
            preallocate: true,
            written: None,
        }
    }

    /// Extends the tail segment with zeros, a step at a time, until it
    /// reaches `PREALLOCATE_AHEAD_BYTES` past its last record (or the
    /// segment's limit). The zeros are made durable by the next batch's
    /// fdatasync; recovery cuts them off. They start on the block boundary
    /// after the records (the records' last block was padded with zeros
    /// when it was written).
    fn preallocate(&self, tail: &mut Tail, end: u64) {
        let target = (end + PREALLOCATE_AHEAD_BYTES).min(self.config.segment_bytes_max);
        if !tail.preallocate || tail.zeroed >= target {
            return;
        }
        let Some(file) = self.segment_file(tail.base) else {
            return;
        };
        let limit = self.config.segment_bytes_max;
        while tail.preallocate && tail.zeroed < target {
            let from = tail.zeroed.max(end.next_multiple_of(BLOCK_BYTES as u64));
            let length = (PREALLOCATE_STEP_BYTES as u64).min(limit.saturating_sub(from)) as usize;
            if length == 0 {
                return;
            }
            match file.write_blocks_at(&ZEROS.0[..length], from) {
                Ok(()) => {
                    tail.zeroed = from + length as u64;
                    tail.allocated = tail.allocated.max(tail.zeroed);
                }
                Err(_) => {
                    // A short write may have grown the file before failing;
                    // remember its real length so a rollover still trims it.
                    tail.allocated = file.len().unwrap_or(from + length as u64);
                    tail.preallocate = false;
                }
            }
        }
    }

    /// Cuts the zeros off a segment the log is leaving, so that only the
    /// last segment can end in anything but a whole record.
    fn trim_tail(
        &self,
        tail: &Tail,
        touched: &mut Vec<(SegmentPath, Arc<dyn StorageFile>)>,
    ) -> Result<(), LogError> {
        let length = {
            let state = self.lock_state();
            state
                .segments
                .iter()
                .rev()
                .find(|s| s.base == tail.base)
                .map(|s| s.length)
        };
        let (Some(length), Some(file)) = (length, self.segment_file(tail.base)) else {
            return Ok(());
        };
        let path = self.segment_path_of(tail.base);
        // The file's own length, not `tail.allocated`: another thread's
        // tail (a journal's, a log's own) may have grown it since.
        let on_file = file.len().map_err(|source| LogError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if tail.allocated.max(on_file) <= length {
            return Ok(());
        }
        // Kept blocks past the cut would make the file long again.
        self.spill_kept(touched)?;
        file.set_len(length).map_err(|source| LogError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        if !touched.iter().any(|(p, _)| *p == path) {
            touched.push((path, file));
        }
        Ok(())
    }

    /// Waits for the next batch: for `Sync`, everything pending; for
    /// `Paged`, the oldest sealed page (or a partly filled one that waited
    /// long enough). `None` on shutdown with nothing left, or after failure.
    fn next_batch(&self) -> Option<Vec<crate::log::Chunk>> {
        let mut state = self.lock_state();
        loop {
            if state.failed.is_some() {
                return None;
            }
            match self.config.durability {
                Durability::Sync if !state.pending.is_empty() => {
                    return Some(state.pending.drain(..).collect());
                }
                Durability::Paged { .. } => {
                    let interval = self.config.page_flush_interval;
                    let shutdown = state.shutdown;
                    if let Some(front) = state.pending.front_mut() {
                        if front.sealed || shutdown || front.opened_at.elapsed() >= interval {
                            front.sealed = true;
                            return state.pending.pop_front().map(|page| vec![page]);
                        }
                    }
                }
                _ => {}
            }
            if state.shutdown {
                return None;
            }
            state = match self.config.durability {
                Durability::Paged { .. } => {
                    self.work
                        .wait_timeout(state, self.config.page_flush_interval)
                        .expect("log state lock poisoned")
                        .0
                }
                _ => {
                    state.io_waiting = true;
                    let mut woken = self.work.wait(state).expect("log state lock poisoned");
                    woken.io_waiting = false;
                    woken
                }
            };
        }
    }

    /// A journal round's bytes of the tail segment: `prefix`, the bytes
    /// from the block boundary `start` up to the records, then `records`.
    /// Onto the kept image (written over it from `start` on), which goes
    /// to the file first when they do not continue it, and after them
    /// once it reaches `KEPT_BYTES_MAX`. An image that ends where the
    /// records start already holds the prefix (the same log's round
    /// before wrote it there), so only the records are copied.
    fn keep(
        &self,
        file: &Arc<dyn StorageFile>,
        path: &SegmentPath,
        (prefix, records): (&[u8], &[u8]),
        start: u64,
    ) -> std::io::Result<()> {
        let mut kept = self.kept.lock().expect("kept lock poisoned");
        let continues = kept.target.as_ref().is_some_and(|(to, _, at)| {
            std::ptr::addr_eq(Arc::as_ptr(to), Arc::as_ptr(file))
                && (*at..=*at + kept.bytes.len() as u64).contains(&start)
        });
        if !continues {
            write_kept(&mut kept)?;
            kept.target = Some((Arc::clone(file), Arc::clone(path), start));
        }
        let at = kept.target.as_ref().map_or(start, |(_, _, at)| *at);
        let from = (start - at) as usize;
        if kept.bytes.len() != from + prefix.len() {
            kept.bytes.truncate(from);
            kept.bytes.extend_from_slice(prefix);
        }
        debug_assert_eq!(&kept.bytes[from..], prefix, "the image holds the prefix");
        kept.bytes.extend_from_slice(records);
        if kept.bytes.len() >= crate::log::KEPT_BYTES_MAX {
            write_kept(&mut kept)?;
        }
        Ok(())
    }

    /// Writes the kept blocks to their segment, through the page cache.
    fn write_kept(&self) -> std::io::Result<()> {
        write_kept(&mut self.kept.lock().expect("kept lock poisoned")).map(|_| ())
    }

    /// The durable version, for a read of the segments (`Log::read`),
    /// with what journal rounds kept written there first: every version
    /// up to it was kept before it became durable. A log that cannot
    /// write them latches failed.
    pub(crate) fn durable_for_read(&self) -> Result<u64, crate::error::ReadError> {
        let durable = self.progress.borrow().durable;
        self.spill_kept(&mut Vec::new()).map_err(|error| {
            self.latch_message(Arc::from(error.to_string()));
            crate::error::ReadError::Io(error.to_string())
        })?;
        Ok(durable)
    }

    /// A reset replaced every segment: the writing thread starts a new
    /// tail, and what journal rounds kept belonged to the files replaced.
    pub(crate) fn reset_tail(&self, state: &mut crate::log::State) {
        state.tail_reset = true;
        let mut kept = self.kept.lock().expect("kept lock poisoned");
        kept.bytes.clear();
        kept.target = None;
    }

    /// Writes the kept blocks to their segment and notes its file in
    /// `touched` (to be synced, or handed to the journal's flusher). Before
    /// anything reads the segments (a read, a checkpoint) or changes them
    /// past the kept blocks (a direct write, a roll, a trim).
    pub(crate) fn spill_kept(
        &self,
        touched: &mut impl Extend<(SegmentPath, Arc<dyn StorageFile>)>,
    ) -> Result<(), LogError> {
        let mut kept = self.kept.lock().expect("kept lock poisoned");
        let path = kept.target.as_ref().map(|(_, path, _)| Arc::clone(path));
        match write_kept(&mut kept) {
            Ok(Some(written)) => {
                touched.extend([written]);
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(source) => Err(LogError::Io {
                path: path.map(|p| p.to_path_buf()).unwrap_or_default(),
                source,
            }),
        }
    }

    fn segment_file(&self, base: u64) -> Option<Arc<dyn StorageFile>> {
        let state = self.lock_state();
        let segment = state.segments.iter().rev().find(|s| s.base == base)?;
        segment.file.clone()
    }

    /// Writes a batch: past the page cache and synced, or, with `dirty`,
    /// through the page cache and unsynced (its bytes are in the
    /// journal's durable frames), its files noted in `dirty` for the
    /// journal's flusher. Whole blocks either way: a page the write covers
    /// only in part would first be read from the disk.
    fn write_batch(
        &self,
        batch: &mut [crate::log::Chunk],
        tail: &mut Tail,
        mut dirty: Option<&mut crate::journal::Dirty>,
    ) -> Result<(), LogError> {
        let mut touched: Vec<(SegmentPath, Arc<dyn StorageFile>)> = Vec::new();
        if dirty.is_none() {
            // Past the page cache: the blocks journal rounds kept go first,
            // or they would later be written over these.
            self.spill_kept(&mut touched)?;
        }
        for chunk in batch {
            let (path, file) = self.segment_for(chunk, tail, &mut touched)?;
            let kept = self
                .write_chunk(chunk, (&file, &path), tail, dirty.is_none())
                .map_err(|source| LogError::Io {
                    path: path.to_path_buf(),
                    source,
                })?;
            match dirty.as_deref_mut() {
                // Kept blocks reach the file, and the flusher, once
                // written.
                Some(_) if kept => {}
                Some(dirty) => {
                    dirty.entry(path).or_insert(file);
                }
                None if !touched.iter().any(|(p, _)| *p == path) => touched.push((path, file)),
                None => {}
            }
        }
        match dirty {
            Some(dirty) => {
                let fresh = self.kept.lock().expect("kept lock poisoned").fresh.take();
                dirty.extend(fresh);
                Ok(())
            }
            None => sync_all(&touched),
        }
    }

    /// The file of the segment `chunk` goes to, opening a new segment (and
    /// leaving the tail) as needed; `touched` holds the files written so
    /// far in the batch.
    fn segment_for(
        &self,
        chunk: &crate::log::Chunk,
        tail: &mut Tail,
        touched: &mut Vec<(SegmentPath, Arc<dyn StorageFile>)>,
    ) -> Result<(SegmentPath, Arc<dyn StorageFile>), LogError> {
        let path = self.segment_path_of(chunk.segment_base);
        let file = match self.segment_file(chunk.segment_base) {
            Some(file) if chunk.segment_base == tail.base => file,
            Some(file) => {
                // A segment this thread did not open: the tail it knew
                // was taken before the appends that decide it.
                self.trim_tail(tail, touched)?;
                *tail = self.tail_of(chunk.segment_base);
                file
            }
            None => {
                // Everything written to earlier segments is made durable
                // before a later segment gets any record, so recovery
                // never finds a later segment behind a torn earlier one
                // (the tail's earlier batches too: a journal round writes
                // them unsynced).
                self.spill_kept(touched)?;
                if let Some(file) = self.segment_file(tail.base) {
                    let tail_path = self.segment_path_of(tail.base);
                    if !touched.iter().any(|(p, _)| *p == tail_path) {
                        touched.push((tail_path, file));
                    }
                }
                self.trim_tail(tail, touched)?;
                sync_all(touched)?;
                // The manifest names the new segment before its file
                // exists, so no segment file is ever newer than the
                // manifest says.
                let manifest = self.manifest.lock().expect("manifest lock poisoned");
                self.write_manifest(chunk.segment_base)?;
                let file = crate::segment::create_segment_file(
                    self.storage.as_ref(),
                    &self.folder,
                    self.stream,
                    chunk.segment_base,
                )?;
                drop(manifest);
                let mut state = self.lock_state();
                if let Some(segment) = state
                    .segments
                    .iter_mut()
                    .rev()
                    .find(|s| s.base == chunk.segment_base)
                {
                    segment.file = Some(file.clone());
                }
                *tail = Tail {
                    base: chunk.segment_base,
                    allocated: crate::segment::SEGMENT_HEADER_LEN as u64,
                    zeroed: crate::segment::SEGMENT_HEADER_LEN as u64,
                    preallocate: tail.preallocate,
                    written: None,
                };
                file
            }
        };
        Ok((path, file))
    }

    /// Grows the tail segment, which a batch ending at `end` would grow
    /// past its zeros (a large batch, which writes none ahead), by a hole
    /// that reads as zeros and costs the disk nothing until written: the
    /// records then go past the page cache into it as into zeros. Copying
    /// them into newly allocated page cache instead cost the servers more
    /// CPU than anything else at 10 KB (docs/results.md, "Large batches
    /// past the page cache"). Only when the file ends where this thread's
    /// tail does: bytes past that are another writer's (a journal round's
    /// kept blocks), not a hole, and the records are then appended as
    /// they come, in order. The hole reaches as far ahead as small batches
    /// keep zeros, so that the next batches go into a hole their own sync
    /// made durable (and small ones fill it with zeros first, see
    /// `preallocate`).
    fn grow_by_hole(
        &self,
        file: &Arc<dyn StorageFile>,
        tail: &mut Tail,
        end: u64,
    ) -> std::io::Result<()> {
        if file.len()? <= tail.allocated {
            let limit = self.config.segment_bytes_max;
            let grown = end.next_multiple_of(BLOCK_BYTES as u64);
            let grown = grown.max((grown + PREALLOCATE_AHEAD_BYTES).min(limit));
            file.set_len(grown)?;
            tail.allocated = grown;
        }
        Ok(())
    }

    /// Writes one chunk as whole blocks: the bytes already in the file
    /// from the block boundary before the chunk (the same bytes again, so
    /// a torn write leaves them as they were), its records, and zeros to
    /// the next boundary, which the preallocated tail holds anyway.
    /// `direct`: past the page cache, and only inside the file: a write
    /// that would grow it grows the file first, by a hole
    /// (`grow_by_hole`), and goes into the hole. A file system that writes
    /// a hole past its page cache (ext4, XFS) gives it unwritten blocks
    /// and marks them written only once the whole write has completed, in
    /// the metadata that the fdatasync commits: after a crash the hole
    /// reads as zeros or holds the whole write, never a later record
    /// behind a torn earlier one, as an append keeps its bytes in order.
    /// Otherwise (a journal round) the records are kept for the page
    /// cache (`keep`, which makes the same blocks when it writes them),
    /// past the zeros too: the journal's frames stay their durable copy
    /// until a rotation syncs the file.
    fn write_chunk(
        &self,
        chunk: &mut crate::log::Chunk,
        (file, path): (&Arc<dyn StorageFile>, &SegmentPath),
        tail: &mut Tail,
        direct: bool,
    ) -> std::io::Result<bool> {
        let block = BLOCK_BYTES as u64;
        let start = chunk.offset - chunk.offset % block;
        let end = chunk.offset + chunk.bytes.len() as u64;
        let in_tail = chunk.segment_base == tail.base;
        if direct && in_tail && end.next_multiple_of(block) > tail.allocated {
            self.grow_by_hole(file, tail, end)?;
        }
        // Kept blocks (a journal round's) may grow the file: until a
        // rotation syncs the segment, the journal's frames are their
        // durable copy, and redo writes them again after a crash.
        let fits = in_tail && (!direct || end.next_multiple_of(block) <= tail.allocated);
        let prefix = match tail.written.take() {
            _ if !fits => None,
            Some((written, prefix)) if written == chunk.offset => Some(prefix),
            _ => {
                // Read once after opening: the bytes before the chunk, if
                // they can be read back (a storage that keeps nothing, as
                // the buffering-only benchmark's, cannot).
                self.write_kept()?;
                let mut prefix = vec![0u8; (chunk.offset - start) as usize];
                file.read_exact_at(&mut prefix, start).ok().map(|()| prefix)
            }
        };
        let Some(mut prefix) = prefix else {
            if in_tail {
                tail.allocated = tail.allocated.max(end);
                tail.zeroed = tail.zeroed.max(end);
            }
            self.write_kept()?;
            return file
                .write_at(chunk.bytes.records(), chunk.offset)
                .map(|()| false);
        };
        if direct {
            chunk.bytes.set_prefix(&prefix);
            file.write_blocks_at(chunk.bytes.blocks(), start)?;
            tail.zeroed = tail.zeroed.max(end.next_multiple_of(block));
        } else {
            self.keep(file, path, (&prefix, chunk.bytes.records()), start)?;
            // The file reaches the kept blocks' end once they are written:
            // a clean close cuts it back to the last record.
            tail.allocated = tail.allocated.max(end.next_multiple_of(block));
            tail.zeroed = tail.zeroed.max(end.next_multiple_of(block));
        }
        // What the next write, which starts at `end`, puts back in front:
        // the bytes of the last block up to `end`.
        let records = chunk.bytes.records();
        match (end - end % block).checked_sub(chunk.offset) {
            Some(from) => {
                prefix.clear();
                prefix.extend_from_slice(&records[from as usize..]);
            }
            None => prefix.extend_from_slice(records),
        }
        tail.written = Some((end, prefix));
        Ok(!direct)
    }

    /// Writes the manifest naming `newest_segment` and the kept
    /// checkpoints; the caller holds the manifest lock.
    pub(crate) fn write_manifest(&self, newest_segment: u64) -> Result<(), LogError> {
        let manifest = crate::manifest::Manifest {
            newest_segment,
            checkpoints: self.lock_state().checkpoints.clone(),
        };
        crate::manifest::write(self.storage.as_ref(), &self.folder, self.stream, &manifest).map_err(
            |source| LogError::Io {
                path: crate::manifest::manifest_path(&self.folder),
                source,
            },
        )
    }

    fn complete(&self, mut batch: Vec<crate::log::Chunk>, started: Instant) {
        let now = Instant::now();
        let last_version = batch.last().expect("a batch is never empty").last_version;
        let records: u64 = batch.iter().map(|c| c.records).sum();
        let bytes: usize = batch.iter().map(|c| c.bytes.len()).sum();
        self.sample_latency(&batch, now);
        let backlog = self.recycle(&mut batch, bytes);
        // Counters first, so whoever the new durable version wakes sees
        // them complete.
        let counters = &self.counters;
        counters.syncs.fetch_add(1, Ordering::Relaxed);
        counters
            .records_synced
            .fetch_add(records, Ordering::Relaxed);
        counters
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        counters.io_nanos.fetch_add(
            now.duration_since(started).as_nanos() as u64,
            Ordering::Relaxed,
        );
        // The new version is readable at once, but the watchers (tasks on
        // other threads, each a wake-up) are told after the hook, which
        // sends the acknowledgements.
        self.progress.send_if_modified(|progress| {
            progress.durable = last_version;
            false
        });
        let taken = match &*self.on_durable.lock().expect("hook lock poisoned") {
            Some(hook) => hook(last_version, backlog),
            None => false,
        };
        // The metrics after the hook, which sends the acknowledgements:
        // they are not on their path (their times were all taken above).
        if let Some(observer) = &self.config.observer {
            observer.synced(&crate::config::SyncReport {
                records,
                bytes: bytes as u64,
                io: now.duration_since(started),
                durable_at: now,
                chunks: &batch,
            });
        }
        self.progress.send_modify(|_| {});
        if !taken {
            self.pass_beyond_hook();
        }
        self.space.notify_waiters();
    }

    /// Keeps the time from append to durable of the batch's records, for
    /// the experiments that ask for it.
    fn sample_latency(&self, batch: &[crate::log::Chunk], now: Instant) {
        if !self.config.sample_latency {
            return;
        }
        let mut samples = self.latency_samples.lock().expect("sampler lock poisoned");
        for chunk in batch {
            for appended in &chunk.appended_at {
                if samples.len() < super::log::LATENCY_SAMPLES_MAX {
                    samples.push(now.duration_since(*appended).as_nanos() as u64);
                }
            }
        }
    }

    /// Takes a written batch's bytes off the pending ones and keeps its
    /// buffers for reuse (the chunks keep their append times); returns
    /// whether more records wait (the log is busy).
    fn recycle(&self, batch: &mut [crate::log::Chunk], bytes: usize) -> bool {
        let mut state = self.lock_state();
        state.pending_bytes -= bytes;
        let keep = match self.config.durability {
            Durability::Paged { .. } => usize::MAX,
            _ => SPARE_BUFFERS_MAX,
        };
        for chunk in batch {
            if state.free_buffers.len() < keep {
                state.free_buffers.push(std::mem::take(&mut chunk.bytes));
            }
        }
        state.pending_bytes > 0
    }

    /// Latches the log failed. The data of a failed fsync may or may not be
    /// on disk; retrying could report success for data the kernel already
    /// dropped, so the log never retries and never acknowledges again.
    fn latch(&self, error: LogError) {
        self.latch_message(Arc::from(error.to_string()));
    }

    pub(crate) fn latch_message(&self, message: Arc<str>) {
        {
            let mut state = self.lock_state();
            state.failed = Some(message.clone());
            state.pending.clear();
        }
        self.publish(|progress| progress.failed = Some(message));
        self.space.notify_waiters();
    }
}

/// Writes `kept`'s blocks to their file; returns the file written, if
/// any. Kept as they were if the write fails.
fn write_kept(
    kept: &mut crate::log::Kept,
) -> std::io::Result<Option<(SegmentPath, Arc<dyn StorageFile>)>> {
    if kept.bytes.is_empty() {
        return Ok(None);
    }
    let (file, path, start) = kept.target.clone().expect("kept blocks have a file");
    // Whole blocks: a page the write covers only in part would first be
    // read from the disk.
    let length = kept.bytes.len();
    kept.bytes.resize(length.next_multiple_of(BLOCK_BYTES), 0);
    if let Err(error) = file.write_at(&kept.bytes, start) {
        kept.bytes.truncate(length);
        return Err(error);
    }
    kept.bytes.clear();
    kept.written = Some((Arc::clone(&path), Arc::clone(&file)));
    kept.fresh = Some((Arc::clone(&path), Arc::clone(&file)));
    Ok(Some((path, file)))
}

fn sync_all(files: &[(SegmentPath, Arc<dyn StorageFile>)]) -> Result<(), LogError> {
    for (path, file) in files {
        file.sync_data().map_err(|source| LogError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(())
}
