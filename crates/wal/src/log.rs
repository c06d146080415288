//! The log of one stream: appends, the I/O thread that makes them durable,
//! and reads of durable records.
//!
//! Appends copy an encoded record into the pending buffer under a short
//! lock and return at once; the I/O thread takes everything pending, writes
//! it and fdatasyncs it, then publishes the new durable version on a watch
//! channel. Group commit needs no timer: whatever arrives while a sync is in
//! flight forms the next batch.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use proto::Record;
use tokio::sync::{watch, Notify};

use crate::block::BlockBuffer;
use crate::config::{Durability, LogConfig};
use crate::error::{AppendError, LogError, ReadError};
use crate::recovery::{self, Recovered, RecoveryReport, Segment};
use crate::storage::{Storage, StorageFile};

/// What the I/O thread has achieved, published on a watch channel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Every version up to this one is durable (for `Memory`: held).
    pub durable: u64,
    /// Set once, when a write or fsync fails; the log never recovers from it
    /// without a restart.
    pub failed: Option<Arc<str>>,
}

/// Counters of a log, read by the metrics endpoint and the experiments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogMetrics {
    pub appends: u64,
    pub syncs: u64,
    pub records_synced: u64,
    pub bytes_written: u64,
    /// Appends that found the buffer full and had to wait (seed 004's
    /// buffer-full events).
    pub buffer_full_waits: u64,
    /// Total time spent in write + fdatasync, in nanoseconds.
    pub io_nanos: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) appends: AtomicU64,
    pub(crate) syncs: AtomicU64,
    pub(crate) records_synced: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) buffer_full_waits: AtomicU64,
    pub(crate) io_nanos: AtomicU64,
}

/// Latency samples beyond this many are dropped, bounding the memory of the
/// logging experiment's sampler.
pub(crate) const LATENCY_SAMPLES_MAX: usize = 1 << 20;

pub(crate) use crate::block::Chunk;

/// The I/O thread's view of the segment it appends to.
pub(crate) struct Tail {
    pub(crate) base: u64,
    /// The file's length, zeros past the last record included.
    pub(crate) allocated: u64,
    /// Where the bytes written to the file (records, zeros) end: past it,
    /// up to `allocated`, a hole that a large batch grew the file by,
    /// which small batches' zeros fill before they go on.
    pub(crate) zeroed: u64,
    /// Off after a preallocation failed (a nearly full disk): the log goes
    /// on without it, and real writes report the error.
    pub(crate) preallocate: bool,
    /// Where the last record this thread wrote to the segment ends, and
    /// the segment's bytes from the block boundary before that point up to
    /// it: what the next write, which starts there, puts back in front of
    /// its records. `None` until the first write (the prefix is then read
    /// from the file).
    pub(crate) written: Option<(u64, Vec<u8>)>,
}

/// What the thread writing a log keeps between batches: its tail, and
/// the version the next batch must start with (`None` after a reset,
/// which starts the versions anew).
pub(crate) struct Writing {
    pub(crate) tail: Tail,
    pub(crate) next_version: Option<u64>,
}

pub(crate) struct State {
    pub(crate) last_version: u64,
    pub(crate) first_version: u64,
    pub(crate) segments: Vec<Segment>,
    /// Chunks not yet taken by the I/O thread, oldest first.
    pub(crate) pending: VecDeque<Chunk>,
    /// Bytes appended and not yet durable.
    pub(crate) pending_bytes: usize,
    /// Paged: page buffers ready for reuse. Sync: spare buffers.
    pub(crate) free_buffers: Vec<BlockBuffer>,
    /// Paged: pages in existence (free, filling or being written).
    pub(crate) pages_in_use: usize,
    pub(crate) failed: Option<Arc<str>>,
    pub(crate) shutdown: bool,
    /// Memory durability: the retained records.
    pub(crate) memory: VecDeque<(u64, Arc<[u8]>)>,
    pub(crate) memory_bytes: usize,
    /// The versions of the valid checkpoint files on disk, newest first
    /// (at most [`crate::checkpoint::CHECKPOINTS_KEPT`]).
    pub(crate) checkpoints: Vec<u64>,
    /// Set by a reset: the I/O thread takes its tail segment anew.
    pub(crate) tail_reset: bool,
    /// The I/O thread waits on `work` for a `Sync` batch. An append wakes
    /// it only then: a condition variable's notify is a system call even
    /// with no one waiting, and one per append cost more than the append.
    pub(crate) io_waiting: bool,
    /// A journaled log: it is in the journal's list for the next round,
    /// or held by a thread in `write_here`, exactly once.
    pub(crate) queued: bool,
    /// A journaled log: a direct writer (or a thread writing in place) has
    /// a batch of it; no round takes another until that one is durable.
    pub(crate) in_flight: bool,
    /// A take found the log in flight and used up its place in the list:
    /// the writer puts it back when done. Not `queued` alone, which is
    /// also true while the log's one place is still in the list: put back
    /// then, it would be listed twice, and a round would take two batches
    /// of it that two threads could write out of order.
    pub(crate) passed_over: bool,
}

pub(crate) struct Shared {
    pub(crate) storage: Arc<dyn Storage>,
    pub(crate) folder: PathBuf,
    pub(crate) stream: u64,
    pub(crate) config: LogConfig,
    pub(crate) state: Mutex<State>,
    /// Wakes the I/O thread when work arrives or on shutdown.
    pub(crate) work: Condvar,
    /// Wakes appenders waiting for room in the buffer.
    pub(crate) space: Notify,
    pub(crate) progress: watch::Sender<Progress>,
    /// The same progress for those that only need what the durable hook
    /// did not take (see [`Log::progress_beyond_hook`]).
    pub(crate) beyond_hook: watch::Sender<Progress>,
    pub(crate) counters: Counters,
    pub(crate) latency_samples: Mutex<Vec<u64>>,
    /// Held while a checkpoint is written or retention deletes segments,
    /// so the two never interleave; appends and reads do not take it.
    pub(crate) maintenance: Mutex<()>,
    /// Held while the manifest is written and, at a rollover, until the
    /// new segment's file exists, so that a manifest never names a segment
    /// older than a file on disk (see [`crate::manifest`]).
    pub(crate) manifest: Mutex<()>,
    /// Called by the I/O thread each time the durable version moves.
    pub(crate) on_durable: Mutex<Option<DurableHook>>,
    /// A journaled log: the tail as the journal's thread writes it (the
    /// I/O thread of a log of its own keeps it on its stack).
    pub(crate) journal_tail: Mutex<Option<Writing>>,
    /// A journaled log: the path its journal frames name for the segment
    /// last written (its base, and the path relative to the journal's
    /// folder), so that a round does not format it anew.
    pub(crate) journal_path: Mutex<Option<(u64, Arc<str>)>>,
    /// The path of the segment last written (its base, and the path), so
    /// that writing a batch does not format it anew.
    pub(crate) last_segment_path: Mutex<Option<(u64, Arc<std::path::Path>)>>,
    /// A journaled log: the blocks its journal rounds wrote, kept here
    /// rather than written to the segment each round (see [`Kept`]).
    pub(crate) kept: Mutex<Kept>,
}

/// A journaled log's blocks that its journal rounds made durable in the
/// journal but did not write to their segment yet: they go there in one
/// write once they reach [`KEPT_BYTES_MAX`], and before anything reads or
/// changes the segment file (a read, a segment roll, a trim, a direct
/// write, a checkpoint) and before the journal rotates (its frames are the
/// kept blocks' only durable copy until then). One image of consecutive
/// bytes of the tail segment from a block boundary on, each round's
/// records appended (the bytes before them in their block taken from the
/// log's last write when the image does not end where they start), and
/// padded with zeros to whole blocks when written.
#[derive(Default)]
pub(crate) struct Kept {
    /// The segment file, its path, and the offset of the image's first
    /// block.
    pub(crate) target: Option<(Arc<dyn StorageFile>, crate::journal::SegmentPath, u64)>,
    pub(crate) bytes: Vec<u8>,
    /// The file kept blocks were last written to, through the page cache:
    /// the journal's next rotation syncs it (a write outside a round, for
    /// a read say, may come after the flusher synced the file).
    pub(crate) written: Option<(crate::journal::SegmentPath, Arc<dyn StorageFile>)>,
    /// The same, for the journal's next round to hand its flusher.
    pub(crate) fresh: Option<(crate::journal::SegmentPath, Arc<dyn StorageFile>)>,
    /// The journal has the log in its list of logs to write out at its
    /// next rotation.
    pub(crate) listed: bool,
}

/// Bytes of blocks a journaled log keeps before writing them to its
/// segment.
pub(crate) const KEPT_BYTES_MAX: usize = 64 * 1024;

/// What [`Log::on_durable`] calls with each new durable version, and
/// whether more records wait for the I/O thread (the log is busy); it
/// returns whether it took the version.
pub type DurableHook = Box<dyn Fn(u64, bool) -> bool + Send + Sync>;

/// One stream's write-ahead log. Dropping it writes and syncs everything
/// pending and stops the I/O thread.
pub struct Log {
    pub(crate) shared: Arc<Shared>,
    io_thread: Option<JoinHandle<()>>,
}

pub(crate) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding the lock is a broken invariant; the state may be
    // inconsistent, so propagate it rather than go on.
    state.lock().expect("log state lock poisoned")
}

impl Log {
    /// Opens the log in `folder` (creating it when absent), recovers it, and
    /// calls `visit` with every valid record in version order.
    /// Every segment is scanned: checkpoints are not used, and a log whose
    /// oldest segments retention deleted does not open this way.
    pub fn open(
        storage: Arc<dyn Storage>,
        folder: &Path,
        stream: u64,
        config: LogConfig,
        visit: &mut dyn FnMut(&Record<'_>),
    ) -> Result<Log, LogError> {
        config.validate().map_err(LogError::Config)?;
        let recovered = match config.durability {
            Durability::Memory => None,
            _ => Some(recovery::recover(
                storage.as_ref(),
                folder,
                stream,
                recovery::Mode::Repair,
                visit,
            )?),
        };
        Log::start(storage, folder, stream, config, recovered)
    }

    /// Opens the log in `folder` (creating it when absent) from its newest
    /// usable checkpoint: `restore` gets the checkpoint's blob, and `visit`
    /// only the records after the checkpoint's version, in order. Of the
    /// segments the checkpoint covers, only its last is opened (header and
    /// length checked); the others are checked, record by record, when
    /// first read (damage found then is a [`ReadError::Corrupt`] naming
    /// the file and byte). With a usable manifest (see [`crate::manifest`])
    /// the folder is not listed either. So the time this takes grows with
    /// the log after the checkpoint, and with the covered part only by
    /// its 32 bytes a segment of checkpoint. A damaged
    /// checkpoint, one `restore` refuses, or one that claims more than the
    /// segments on disk hold, is skipped for the one before it; with none
    /// left, every segment is scanned and `restore` is not called. The
    /// report says which checkpoint was used and which were skipped, why.
    pub fn open_checkpointed(
        storage: Arc<dyn Storage>,
        folder: &Path,
        stream: u64,
        config: LogConfig,
        restore: &mut dyn FnMut(&[u8]) -> Result<(), crate::RestoreError>,
        visit: &mut dyn FnMut(&Record<'_>),
    ) -> Result<(Log, RecoveryReport), LogError> {
        config.validate().map_err(LogError::Config)?;
        let recovered = match config.durability {
            Durability::Memory => None,
            _ => Some(recovery::recover_checkpointed(
                storage.as_ref(),
                folder,
                stream,
                recovery::Mode::Repair,
                restore,
                visit,
            )?),
        };
        let report = recovered
            .as_ref()
            .map(|r| r.report.clone())
            .unwrap_or_default();
        let log = Log::start(storage, folder, stream, config, recovered)?;
        Ok((log, report))
    }

    fn start(
        storage: Arc<dyn Storage>,
        folder: &Path,
        stream: u64,
        config: LogConfig,
        recovered: Option<Recovered>,
    ) -> Result<Log, LogError> {
        let (segments, last_version, checkpoints) = match recovered {
            None => (Vec::new(), 0, Vec::new()),
            Some(recovered) => (
                recovered.segments,
                recovered.last_version,
                recovered.checkpoints,
            ),
        };
        let first_version = segments.first().map_or(1, |s| s.base);
        let state = State {
            last_version,
            first_version,
            segments,
            pending: VecDeque::new(),
            pending_bytes: 0,
            free_buffers: Vec::new(),
            pages_in_use: 0,
            failed: None,
            shutdown: false,
            memory: VecDeque::new(),
            memory_bytes: 0,
            checkpoints,
            tail_reset: false,
            io_waiting: false,
            queued: false,
            in_flight: false,
            passed_over: false,
        };
        let (progress, _) = watch::channel(Progress {
            durable: last_version,
            failed: None,
        });
        let (beyond_hook, _) = watch::channel(progress.borrow().clone());
        let shared = Arc::new(Shared {
            storage,
            folder: folder.to_path_buf(),
            stream,
            config,
            state: Mutex::new(state),
            work: Condvar::new(),
            space: Notify::new(),
            progress,
            beyond_hook,
            counters: Counters::default(),
            latency_samples: Mutex::new(Vec::new()),
            maintenance: Mutex::new(()),
            manifest: Mutex::new(()),
            on_durable: Mutex::new(None),
            journal_tail: Mutex::new(None),
            journal_path: Mutex::new(None),
            last_segment_path: Mutex::new(None),
            kept: Mutex::default(),
        });
        let io_thread = shared.spawn_io()?;
        Ok(Log { shared, io_thread })
    }

    /// Appends one encoded record, which must carry version
    /// `last_version() + 1`. Returns at once; the record becomes durable
    /// when [`Log::progress`] says so.
    pub fn append(&self, version: u64, record: &[u8]) -> Result<(), AppendError> {
        self.append_parts(version, record, &[])
    }

    /// [`Log::append`] of a record in two parts, `head` then `rest` (a
    /// large payload kept where it came, with the head encoded before it):
    /// both are copied into the log's buffer, one after the other, as one
    /// record.
    pub fn append_parts(&self, version: u64, head: &[u8], rest: &[u8]) -> Result<(), AppendError> {
        let shared = &self.shared;
        let limit = shared.config.record_bytes_max();
        let length = head.len() + rest.len();
        if length > limit {
            return Err(AppendError::TooLarge { length, limit });
        }
        let record = Parts(head, rest);
        assert_eq!(
            proto::Record::peek_stream_version(head),
            Some((shared.stream, version)),
            "a record is logged only in the stream and at the version its header names"
        );
        let mut state = lock(&shared.state);
        if let Some(failure) = &state.failed {
            return Err(AppendError::Failed(failure.clone()));
        }
        assert_eq!(
            version,
            state.last_version + 1,
            "log of stream {} appended out of order",
            shared.stream
        );
        match shared.config.durability {
            Durability::Memory => {
                self.append_memory(&mut state, version, record);
                return Ok(());
            }
            Durability::Sync => {
                let room = shared.config.pending_bytes_max
                    - state.pending_bytes.min(shared.config.pending_bytes_max);
                if length > room && state.pending_bytes > 0 {
                    shared
                        .counters
                        .buffer_full_waits
                        .fetch_add(1, Ordering::Relaxed);
                    return Err(AppendError::Full);
                }
            }
            Durability::Paged { .. } => {}
        }
        shared.place_record(&mut state, version, record)?;
        state.last_version = version;
        state.pending_bytes += length;
        if let Some(journal) = shared.journal() {
            let enqueue = !std::mem::replace(&mut state.queued, true);
            drop(state);
            shared.counters.appends.fetch_add(1, Ordering::Relaxed);
            if enqueue {
                let member: Arc<dyn crate::journal::Member> = Arc::clone(shared) as _;
                if let Err(failure) = journal.enqueue(member) {
                    shared.latch_message(failure.clone());
                    return Err(AppendError::Failed(failure));
                }
            }
            return Ok(());
        }
        // The first append since the thread began to wait wakes it; the
        // ones before it runs find it woken and make no system call.
        let wake = shared.config.durability == Durability::Sync
            && std::mem::replace(&mut state.io_waiting, false);
        drop(state);
        shared.counters.appends.fetch_add(1, Ordering::Relaxed);
        if wake {
            shared.work.notify_one();
        }
        Ok(())
    }

    fn append_memory(&self, state: &mut State, version: u64, record: Parts<'_>) {
        let shared = &self.shared;
        let bytes: Arc<[u8]> = if record.1.is_empty() {
            Arc::from(record.0)
        } else {
            record.0.iter().chain(record.1).copied().collect()
        };
        state.memory_bytes += bytes.len();
        state.memory.push_back((version, bytes));
        while state.memory_bytes > shared.config.memory_retain_bytes && state.memory.len() > 1 {
            let (_, dropped) = state.memory.pop_front().expect("ring is not empty");
            state.memory_bytes -= dropped.len();
        }
        state.first_version = state.memory.front().map_or(version + 1, |(v, _)| *v);
        state.last_version = version;
        shared.counters.appends.fetch_add(1, Ordering::Relaxed);
        shared.publish(|progress| progress.durable = version);
    }

    /// A future that completes when room frees up in the buffer. Create it
    /// before retrying an append that failed with `Full`, so no wake-up is
    /// missed between the failure and the wait.
    pub fn space_notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.shared.space.notified()
    }

    /// Whether records appended to this log alone under
    /// [`crate::write_here`] would now be written and synced by the
    /// appending thread: the log shares a journal whose thread is idle and
    /// whose last round (or write in place) was of this log alone. A hint,
    /// read before the work; the write itself decides again.
    pub fn may_write_here(&self) -> bool {
        let address = crate::journal::address(&self.shared);
        self.shared
            .journal()
            .is_some_and(|journal| journal.would_write_in_place(address))
    }

    pub fn last_version(&self) -> u64 {
        lock(&self.shared.state).last_version
    }

    /// Oldest version readers may still ask for.
    pub fn first_version(&self) -> u64 {
        lock(&self.shared.state).first_version
    }

    pub fn durable_version(&self) -> u64 {
        self.shared.progress.borrow().durable
    }

    /// The failure that latched the log, if any.
    pub fn failure(&self) -> Option<Arc<str>> {
        self.shared.progress.borrow().failed.clone()
    }

    /// Watches the durable version and the failed latch.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.shared.progress.subscribe()
    }

    /// Watches the same progress, but changes only for what the durable
    /// hook ([`Log::on_durable`]) did not take: a failure, a reset, and a
    /// durable version reached with no hook set or that the hook left
    /// (it returned `false`). For whoever the hook stands in for, such as
    /// a task that drives the stream when the hook could not: every
    /// version the hook takes would wake it for nothing, a wake-up of
    /// another thread on the path of the acknowledgement the hook just
    /// sent.
    pub fn progress_beyond_hook(&self) -> watch::Receiver<Progress> {
        self.shared.beyond_hook.subscribe()
    }

    /// Has the I/O thread call `hook` with the new durable version each
    /// time it moves, right after the progress watch has it, so whoever
    /// acts on durability can do so without waiting for another thread to
    /// wake. The second argument says whether more records already wait
    /// to be written (the log is busy, and the hook's time delays them).
    /// The hook returns whether it took the version: the watchers of
    /// [`Log::progress_beyond_hook`] hear only of the versions it did not
    /// take. The hook runs before the I/O thread takes its next batch: it
    /// must be short, and must not wait on this log (no `reset`, no wait
    /// for durability). It replaces any earlier hook.
    pub fn on_durable(&self, hook: impl Fn(u64, bool) -> bool + Send + Sync + 'static) {
        *self.shared.on_durable.lock().expect("hook lock poisoned") = Some(Box::new(hook));
    }

    /// Removes the hook [`Log::on_durable`] set, waiting for a call of it
    /// under way: once this returns, the I/O thread calls it no more.
    pub fn clear_on_durable(&self) {
        *self.shared.on_durable.lock().expect("hook lock poisoned") = None;
    }

    pub fn metrics(&self) -> LogMetrics {
        let counters = &self.shared.counters;
        LogMetrics {
            appends: counters.appends.load(Ordering::Relaxed),
            syncs: counters.syncs.load(Ordering::Relaxed),
            records_synced: counters.records_synced.load(Ordering::Relaxed),
            bytes_written: counters.bytes_written.load(Ordering::Relaxed),
            buffer_full_waits: counters.buffer_full_waits.load(Ordering::Relaxed),
            io_nanos: counters.io_nanos.load(Ordering::Relaxed),
        }
    }

    /// Takes the per-record logging latencies (append to durable, in
    /// nanoseconds) sampled since the last call; empty unless
    /// `LogConfig::sample_latency` is on.
    pub fn take_latency_samples(&self) -> Vec<u64> {
        std::mem::take(
            &mut *self
                .shared
                .latency_samples
                .lock()
                .expect("sampler lock poisoned"),
        )
    }

    /// Reads durable records from version `from` on, appending their encoded
    /// bytes to `out`: at most `max_records`, and no more than `max_bytes`
    /// unless the first record alone is larger. Returns how many were read.
    pub fn read(
        &self,
        from: u64,
        max_records: usize,
        max_bytes: usize,
        out: &mut Vec<u8>,
    ) -> Result<usize, ReadError> {
        let durable = self.shared.durable_for_read()?;
        let state = lock(&self.shared.state);
        if from < state.first_version {
            return Err(ReadError::Retained {
                requested: from,
                oldest: state.first_version,
            });
        }
        if from > durable || max_records == 0 {
            return Ok(0);
        }
        if self.shared.config.durability == Durability::Memory {
            return Ok(read_memory(
                &state,
                from,
                durable,
                max_records,
                max_bytes,
                out,
            ));
        }
        drop(state);
        let mut reader = SegmentReader {
            next: from,
            durable,
            count: 0,
            max_records,
            max_bytes,
            start_len: out.len(),
        };
        // One segment at a time, each found again under the lock: a read
        // of a few records touches one or two segments, however many the
        // log holds.
        while reader.next <= durable && reader.count < max_records {
            let target = match self.read_target(reader.next) {
                Ok(target) => target,
                // A covered segment that fails its check: what was read
                // before it is good, and the next read gets the error.
                Err(_) if reader.count > 0 => break,
                Err(error) => return Err(error),
            };
            let Some(target) = target else {
                if reader.count == 0 {
                    // Retention deleted the segment since the check above.
                    let oldest = self.first_version();
                    if from < oldest {
                        return Err(ReadError::Retained {
                            requested: from,
                            oldest,
                        });
                    }
                }
                break;
            };
            let before = reader.next;
            let file = target.file.as_ref();
            if !reader.read_segment(file, target.offset, target.last_version, target.end, out)? {
                break;
            }
            if reader.next == before {
                // The segment's file ends before the records the log says
                // it holds.
                let path = crate::segment::segment_path(&self.shared.folder, target.base);
                return Err(ReadError::Corrupt {
                    version: before,
                    reason: format!("{} ends before it", path.display()),
                });
            }
        }
        Ok(reader.count)
    }

    /// The segment holding `version`, for a read: its file, the offset of
    /// an indexed record at or before `version`, its last version and its
    /// length. Checks the segment's covered records first when no one has
    /// read them since the open (see [`Segment::unchecked`]), without
    /// holding the lock meanwhile. `None` when no file holds `version`
    /// (retention deleted it during the read, or it is not written yet).
    fn read_target(&self, version: u64) -> Result<Option<ReadTarget>, ReadError> {
        let shared = &self.shared;
        let (base, file, unchecked) = {
            let state = lock(&shared.state);
            if version < state.first_version {
                return Ok(None);
            }
            let position = state.segments.partition_point(|s| s.base <= version);
            let Some(segment) = position.checked_sub(1).map(|p| &state.segments[p]) else {
                return Ok(None);
            };
            match segment.unchecked {
                Some(unchecked) if segment.needs_check(version) => {
                    (segment.base, segment.file.clone(), unchecked)
                }
                _ => {
                    return Ok(segment.file.clone().map(|file| ReadTarget {
                        base: segment.base,
                        file,
                        offset: segment.seek(version.max(segment.base)),
                        last_version: segment.last_version,
                        end: segment.length,
                    }))
                }
            }
        };
        let path = crate::segment::segment_path(&shared.folder, base);
        let checked = recovery::check_unchecked(
            shared.storage.as_ref(),
            &shared.folder,
            shared.stream,
            base,
            file,
            unchecked,
        );
        if checked.is_err() && version < self.first_version() {
            // Retention deleted the file while it was being checked.
            return Ok(None);
        }
        let (file, index) = checked.map_err(|error| match error {
            recovery::CheckError::Io(error) => {
                ReadError::Io(format!("{}: {error}", path.display()))
            }
            recovery::CheckError::Damaged { offset, reason } => ReadError::Corrupt {
                version,
                reason: format!(
                    "{} at byte {offset}, a segment a checkpoint covers: {reason}",
                    path.display()
                ),
            },
        })?;
        let mut state = lock(&shared.state);
        let position = state.segments.partition_point(|s| s.base <= version);
        match position.checked_sub(1).map(|p| &mut state.segments[p]) {
            Some(segment) if segment.base == base => {
                segment.mark_checked(file, index);
                Ok(Some(ReadTarget {
                    base,
                    file: segment.file.clone().expect("a checked segment is open"),
                    offset: segment.seek(version.max(base)),
                    last_version: segment.last_version,
                    end: segment.length,
                }))
            }
            // Retention deleted it meanwhile; the open file still reads.
            _ => {
                let offset = match index.partition_point(|&(v, _)| v <= version) {
                    0 => crate::segment::SEGMENT_HEADER_LEN as u64,
                    p => index[p - 1].1,
                };
                Ok(Some(ReadTarget {
                    base,
                    file,
                    offset,
                    last_version: unchecked.last_version,
                    end: unchecked.end,
                }))
            }
        }
    }
}

/// A record appended in two parts, one after the other (the second often
/// empty): see [`Log::append_parts`].
#[derive(Clone, Copy)]
struct Parts<'a>(&'a [u8], &'a [u8]);

impl Parts<'_> {
    fn len(&self) -> usize {
        self.0.len() + self.1.len()
    }
}

/// What a read needs of one segment.
struct ReadTarget {
    base: u64,
    file: Arc<dyn StorageFile>,
    /// An indexed record at or before the version read.
    offset: u64,
    last_version: u64,
    /// Where its records end.
    end: u64,
}

fn read_memory(
    state: &State,
    from: u64,
    durable: u64,
    max_records: usize,
    max_bytes: usize,
    out: &mut Vec<u8>,
) -> usize {
    let start = (from - state.first_version) as usize;
    let start_len = out.len();
    let mut count = 0;
    for (version, bytes) in state.memory.iter().skip(start) {
        if *version > durable
            || count >= max_records
            || (count > 0 && out.len() - start_len + bytes.len() > max_bytes)
        {
            break;
        }
        out.extend_from_slice(bytes);
        count += 1;
    }
    count
}

/// Reads consecutive records from segment files within the caller's limits.
struct SegmentReader {
    next: u64,
    durable: u64,
    count: usize,
    max_records: usize,
    max_bytes: usize,
    start_len: usize,
}

/// Bytes read from a segment per call.
const READ_CHUNK_BYTES: usize = 256 * 1024;

impl SegmentReader {
    /// Reads from one segment; returns whether the caller should go on to
    /// the next segment.
    fn read_segment(
        &mut self,
        file: &dyn StorageFile,
        mut offset: u64,
        last_version: u64,
        end: u64,
        out: &mut Vec<u8>,
    ) -> Result<bool, ReadError> {
        // The file may run past its last record (preallocated zeros); only
        // the bytes up to the segment's logical end hold records.
        let length = file
            .len()
            .map_err(|e| ReadError::Io(e.to_string()))?
            .min(end);
        let mut buffer = vec![0u8; READ_CHUNK_BYTES];
        loop {
            if self.next > self.durable {
                return Ok(false);
            }
            if offset >= length || self.next > last_version {
                return Ok(true);
            }
            let want = buffer.len().min((length - offset) as usize);
            file.read_exact_at(&mut buffer[..want], offset)
                .map_err(|e| ReadError::Io(e.to_string()))?;
            let mut position = 0;
            while position < want {
                if self.next > self.durable {
                    return Ok(false);
                }
                if self.next > last_version {
                    return Ok(true);
                }
                let (record, used) = match Record::decode(&buffer[position..want]) {
                    Ok(decoded) => decoded,
                    Err(proto::RecordError::Truncated { needed, .. }) => {
                        if position > 0 {
                            break;
                        }
                        // A record still being written past the durable
                        // version; everything before it was returned.
                        if needed as u64 > length - offset {
                            return Ok(false);
                        }
                        buffer.resize(needed, 0);
                        break;
                    }
                    Err(error) => {
                        return Err(ReadError::Corrupt {
                            version: self.next,
                            reason: error.to_string(),
                        })
                    }
                };
                let version = record.header.version;
                if version < self.next {
                    position += used;
                    continue;
                }
                if version != self.next {
                    return Err(ReadError::Corrupt {
                        version: self.next,
                        reason: format!("found version {version} in its place"),
                    });
                }
                let written = out.len() - self.start_len;
                if version > self.durable
                    || self.count >= self.max_records
                    || (self.count > 0 && written + used > self.max_bytes)
                {
                    return Ok(false);
                }
                out.extend_from_slice(&buffer[position..position + used]);
                self.count += 1;
                self.next += 1;
                position += used;
            }
            offset += position as u64;
        }
    }
}

impl Shared {
    /// Puts an encoded record into the pending chunks, starting a new
    /// segment or page when the current one is full.
    fn place_record(
        &self,
        state: &mut State,
        version: u64,
        record: Parts<'_>,
    ) -> Result<(), AppendError> {
        let length = record.len() as u64;
        let segment_full = {
            let segment = state.segments.last().expect("a disk log has a segment");
            segment.last_version >= segment.base
                && segment.length + length > self.config.segment_bytes_max
        };
        if segment_full {
            let segment = Segment::new(version);
            state.segments.push(segment);
        }
        let (segment_base, offset) = {
            let segment = state.segments.last().expect("a disk log has a segment");
            (segment.base, segment.length)
        };
        self.chunk_for(state, segment_base, offset, record.len())?;
        let chunk = state
            .pending
            .back_mut()
            .expect("chunk_for leaves an open chunk");
        chunk.bytes.extend_from_slice(record.0);
        chunk.bytes.extend_from_slice(record.1);
        chunk.last_version = version;
        chunk.records += 1;
        if self.config.times_appends() {
            chunk.appended_at.push(Instant::now());
        }
        let segment = state.segments.last_mut().expect("a disk log has a segment");
        segment.note_record(version, offset, length);
        Ok(())
    }

    /// Makes sure the newest pending chunk can take `length` more bytes at
    /// `offset` of segment `segment_base`.
    fn chunk_for(
        &self,
        state: &mut State,
        segment_base: u64,
        offset: u64,
        length: usize,
    ) -> Result<(), AppendError> {
        let page_size = match self.config.durability {
            Durability::Paged { page_size, .. } => Some(page_size),
            _ => None,
        };
        if let Some(chunk) = state.pending.back_mut() {
            let fits = page_size.is_none_or(|size| chunk.bytes.len() + length <= size);
            if !chunk.sealed && chunk.segment_base == segment_base && fits {
                return Ok(());
            }
            if page_size.is_some() && !chunk.sealed {
                chunk.sealed = true;
                self.work.notify_one();
            }
        }
        let buffer = match self.config.durability {
            Durability::Paged { pages, page_size } => match state.free_buffers.pop() {
                Some(buffer) => buffer,
                None if state.pages_in_use < pages => {
                    state.pages_in_use += 1;
                    BlockBuffer::with_capacity(page_size)
                }
                None => {
                    self.counters
                        .buffer_full_waits
                        .fetch_add(1, Ordering::Relaxed);
                    // Undo a segment started for this record: nothing went
                    // into it, and the retry will start it again.
                    if let Some(segment) = state.segments.last() {
                        if segment.base == segment_base
                            && segment.last_version < segment.base
                            && state.segments.len() > 1
                            && segment.file.is_none()
                        {
                            state.segments.pop();
                        }
                    }
                    return Err(AppendError::Full);
                }
            },
            _ => state.free_buffers.pop().unwrap_or_default(),
        };
        let mut buffer: BlockBuffer = buffer;
        buffer.reset(offset);
        state.pending.push_back(Chunk {
            segment_base,
            offset,
            bytes: buffer,
            last_version: 0,
            records: 0,
            appended_at: Vec::new(),
            opened_at: Instant::now(),
            sealed: false,
        });
        Ok(())
    }
}

impl Shared {
    /// The journal this log's group commits go through, if any (only a
    /// `Sync` log uses one).
    pub(crate) fn journal(&self) -> Option<&Arc<crate::journal::Inner>> {
        match self.config.durability {
            Durability::Sync => self.config.journal.as_ref().map(|j| j.inner()),
            _ => None,
        }
    }

    /// The log's own I/O thread: for `Sync` without a journal, and
    /// `Paged`; `None` for `Memory` and a journaled log.
    fn spawn_io(self: &Arc<Self>) -> Result<Option<JoinHandle<()>>, LogError> {
        if self.config.durability == Durability::Memory || self.journal().is_some() {
            return Ok(None);
        }
        let worker = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("log-{:x}", self.stream))
            .spawn(move || worker.run_io())
            .map(Some)
            .map_err(|source| LogError::Io {
                path: self.folder.clone(),
                source,
            })
    }
}

impl Shared {
    pub(crate) fn lock_state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Changes the progress and tells both of its watches.
    pub(crate) fn publish(&self, change: impl FnOnce(&mut Progress)) {
        self.progress.send_modify(change);
        self.pass_beyond_hook();
    }

    /// Brings the watch of what the hook did not take up to the progress.
    /// Merged rather than replaced: the durable version only grows and a
    /// failure stays, whichever of two threads passes its copy last.
    pub(crate) fn pass_beyond_hook(&self) {
        let now = self.progress.borrow().clone();
        self.beyond_hook.send_modify(|progress| {
            progress.durable = progress.durable.max(now.durable);
            if now.failed.is_some() {
                progress.failed = now.failed;
            }
        });
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        lock(&self.shared.state).shutdown = true;
        if let Some(journal) = self.shared.journal() {
            // The journal's thread writes what is pending; a log dropped on
            // that thread (by a durable hook) cannot wait for it.
            if !journal.is_current() {
                self.shared.close_journaled();
            }
            return;
        }
        self.shared.work.notify_all();
        if let Some(thread) = self.io_thread.take() {
            // Dropped by the I/O thread itself (a durable hook held the last
            // reference to the log's owner): it stops once the hook returns,
            // after writing what is pending, and cannot wait for itself.
            if thread.thread().id() == std::thread::current().id() {
                return;
            }
            // The I/O thread writes what is pending before it stops; a panic
            // there is a broken invariant worth surfacing.
            if thread.join().is_err() && !std::thread::panicking() {
                panic!("log I/O thread of stream {} panicked", self.shared.stream);
            }
        }
    }
}
