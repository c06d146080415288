//! A server's journal: one file that every `Sync` log of a server shares
//! for its group commits, so that a round of many logs costs one write and
//! one fdatasync instead of one of each per log.
//!
//! One thread (the journal's) serves all the logs given the journal in
//! their [`crate::LogConfig`]. Each round it takes what every waiting log
//! has pending. A round of one log goes as that log's own I/O thread would
//! send it: written past the page cache into its segment, and fdatasynced.
//! In a round of several logs, a log with a large batch (32 KiB or more)
//! goes the same way on one of four direct writers, in parallel, and so
//! does every log of a round of small batches while few logs
//! (`JournalConfig::few_logs`, 12 by default) have been busy in the last
//! 10 ms, the journal's thread writing one of them itself; the rest
//! are written once into the journal, as frames naming each segment file,
//! offset and bytes, and fdatasynced once; then each log's bytes are
//! written into its segment through the page cache, unsynced, and the
//! logs are told their records are durable. A log is never in two
//! batches at once.
//!
//! Redo on start: [`Journal::open`] writes every frame of the file's
//! current epoch into the file it names (a file that is gone, removed by
//! retention or a reset, is skipped), fdatasyncs them all and starts a new
//! epoch, before any log of the server opens. A segment then holds what it
//! would hold had every write been synced, and a log recovers from its own
//! files as always. Frames are idempotent: each writes the same bytes at
//! the same place, in the order they were written.
//!
//! Epochs: the journal is written from its first block on, and rotates
//! when it passes its size: every segment file written through the page
//! cache since the last rotation is fdatasynced, then an epoch-start frame
//! with the next epoch is written over the first block and fdatasynced.
//! Redo reads frames from that start frame on while each has the start's
//! epoch, the next sequence number and a good checksum, so older frames
//! further on are never mistaken for this epoch's. A crash before the new
//! start frame is durable redoes the old epoch again (its files were
//! synced, so that writes the same bytes). So that a rotation does not
//! stall every stream of the server while the epoch's bytes go to disk,
//! a flusher thread fdatasyncs the files written in each eighth of the
//! epoch as the journal goes on; the rotation waits for it, then syncs
//! only what the last eighth wrote. Anything that removes or cuts a
//! segment file that may be named by frames of the current epoch, and may
//! later be made again under the same name (a stream deleted and created
//! again, a log cut back), first rotates ([`Journal::rotate`]), so that no
//! redo writes old bytes into a new file.
//!
//! Frame layout (little endian), packed back to back in a round, each
//! round starting on a block boundary:
//!
//! | size | field |
//! |---|---|
//! | 4 | magic `SLJ1` |
//! | 4 | CRC32C of everything after this field |
//! | 8 | epoch |
//! | 8 | sequence number in the epoch (the start frame is 0) |
//! | 8 | file offset of the bytes (`u64::MAX` in a start frame) |
//! | 8 | where in the journal the frame's round starts |
//! | 2 | length of the path |
//! | 4 | length of the bytes |
//! | .. | the path, relative to the journal's root folder, UTF-8 |
//! | .. | the bytes |

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::block::BlockBuffer;
use crate::block::Chunk;
use crate::error::{io_error, LogError};
use crate::storage::{Storage, StorageFile, BLOCK_BYTES};

/// The journal file in its folder.
pub const JOURNAL_FILE: &str = "journal.wal";
const MAGIC: [u8; 4] = *b"SLJ1";
const FRAME_HEADER_LEN: usize = 4 + 4 + 8 + 8 + 8 + 8 + 2 + 4;
const START_OFFSET: u64 = u64::MAX;
/// Zeros written per step when the journal file is first made.
const PREALLOCATE_STEP: usize = 1024 * 1024;
/// The flusher is handed the files written so far each time the journal
/// has gone this fraction of its size further.
const FLUSHES_PER_EPOCH: u64 = 8;
/// A log with at least this many bytes in a round of several logs is
/// written past the journal, into its segment, and synced there, by one
/// of the direct writers: written twice (journal and segment), a large
/// batch costs the disk more bandwidth than its own fdatasync costs. A
/// batch this large also writes no zeros ahead of it (the log's
/// `ZEROS_BATCH_BYTES_MAX` is this size).
pub(crate) const DIRECT_BYTES_MIN: usize = 32 * 1024;
/// Threads writing large batches of logs directly, in parallel.
const DIRECT_WRITERS: usize = 4;
/// How long a count of busy logs lasts ([`JournalConfig::few_logs`]).
const BUSY_SPAN: std::time::Duration = std::time::Duration::from_millis(10);

/// A log as the journal sees it (the log's side is in `writer`).
pub(crate) trait Member: Send + Sync {
    /// Everything pending, and the log out of the journal's list; nothing
    /// while a direct writer has a batch of it (it then stays marked, and
    /// the writer puts it back in the list when done).
    fn take_journaled(&self) -> Vec<Chunk>;
    /// A batch of the log goes to a direct writer.
    fn set_in_flight(&self);
    /// Everything pending, taken for a write on the calling thread and
    /// marked in flight in the same step; `None` while a direct writer has
    /// a batch of the log (it puts the log back in the list when done).
    fn take_direct(&self) -> Option<Vec<Chunk>>;
    /// The direct writer is done: whether a take (a round's, or a write
    /// in place) passed the log over meanwhile and so used up its place
    /// in the list (it must go back in the list). Not whether it is
    /// queued: it may be queued and still listed, and must not be listed
    /// twice.
    fn finish_in_flight(&self) -> bool;
    /// Writes the batch, then publishes it durable: past the page cache
    /// and synced, as the log's own I/O thread would; or, with `dirty`
    /// (its frames are durable), through the page cache, its files noted
    /// in `dirty`.
    fn write(&self, batch: Vec<Chunk>, started: Instant, dirty: Option<&mut Dirty>);
    /// The journal failed under the log's batch.
    fn latch_io(&self, message: String);
    /// The path of the log's segment `base`, relative to `root`.
    fn segment_path(&self, root: &Path, base: u64) -> Arc<str>;
    /// Whether the log keeps blocks of a round (not yet in its segment)
    /// and was not listed for the next rotation yet; it is listed now.
    fn take_listing(&self) -> bool;
    /// Writes the blocks the log keeps to its segment, its file noted in
    /// `dirty`, and takes it off the rotation's list.
    fn spill(&self, dirty: &mut Dirty) -> Result<(), LogError>;
}

/// A log [`write_here`] holds back, with its journal.
type Held = (Arc<Inner>, Arc<dyn Member>);

thread_local! {
    /// The logs whose journal wake-ups this thread holds back, while it
    /// runs [`write_here`]'s work.
    static HELD: std::cell::RefCell<Option<Vec<Held>>> = const { std::cell::RefCell::new(None) };
    /// Set by [`not_here`]: the held logs go to their journals.
    static ELSEWHERE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Set while this thread writes in place what [`write_here`] held
    /// back, and runs the log's durable hook ([`hook_in_place`]).
    static IN_PLACE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether this thread is writing in place a record [`write_here`] held
/// back, and so running the durable hook of a log written alone by the
/// thread that appended to it (the hook of a journal round runs on the
/// journal's thread, where this is false). The thread has nothing else
/// in hand: with one message in flight, a connection's reader.
pub fn hook_in_place() -> bool {
    IN_PLACE.get()
}

/// Called from [`write_here`]'s work: its logs go to their journals as
/// usual rather than being written on this thread (for example because
/// what must leave before the records are durable has not left yet).
pub fn not_here() {
    ELSEWHERE.set(true);
}

/// Runs `work`, holding back the journal wake-ups of the logs it appends
/// to; then, if it appended to one log alone and that log's journal is
/// idle, writes the log's records on this thread, past the page cache
/// and synced, exactly as the journal's round of that log alone would,
/// and runs its durable hook here. Otherwise the logs go to their
/// journals as usual. For a thread that may block on the disk and has
/// nothing better to do meanwhile: with one message in flight, the
/// reader of a connection, which saves the message the wake-up of the
/// journal's thread on each replica. Nested calls are one.
pub fn write_here<R>(work: impl FnOnce() -> R) -> R {
    let outer = HELD.with(|held| {
        let mut held = held.borrow_mut();
        let outer = held.is_some();
        if !outer {
            *held = Some(Vec::new());
        }
        outer
    });
    if outer {
        return work();
    }
    ELSEWHERE.set(false);
    /// Lets go of the held logs even when `work` panics.
    struct Release;
    impl Drop for Release {
        fn drop(&mut self) {
            let held = HELD
                .with(|held| held.borrow_mut().take())
                .unwrap_or_default();
            let alone = held.len() == 1 && !ELSEWHERE.replace(false);
            for (journal, log) in held {
                if alone && !std::thread::panicking() {
                    /// Clears the mark however the write ends.
                    struct Unmark;
                    impl Drop for Unmark {
                        fn drop(&mut self) {
                            IN_PLACE.set(false);
                        }
                    }
                    IN_PLACE.set(true);
                    let _unmark = Unmark;
                    journal.write_or_enqueue(log);
                } else {
                    journal.requeue(log);
                }
            }
        }
    }
    let release = Release;
    let result = work();
    drop(release);
    result
}

/// A log's identity for [`Control::alone`]: the address of its shared
/// state, the same through an `Arc<Shared>` as through the
/// `Arc<dyn Member>` made from it.
pub(crate) fn address<T: ?Sized>(log: &Arc<T>) -> usize {
    Arc::as_ptr(log) as *const () as usize
}

/// Holds `log` back when this thread runs [`write_here`]; gives it back
/// otherwise.
fn hold(journal: &Arc<Inner>, log: Arc<dyn Member>) -> Option<Arc<dyn Member>> {
    HELD.with(|held| match held.borrow_mut().as_mut() {
        Some(held) => {
            held.push((Arc::clone(journal), log));
            None
        }
        None => Some(log),
    })
}

/// Settings of a journal.
#[derive(Clone, Copy, Debug)]
pub struct JournalConfig {
    /// The journal rotates (syncs the segments written since the last
    /// rotation, and starts again at its first block) once a round would
    /// take it past this many bytes. The file is made this long at once,
    /// so that an fdatasync of it writes data only.
    pub bytes_max: u64,
    /// While at most this many logs had records in the journal's rounds
    /// of the last 10 ms, a round of several small batches (none large)
    /// writes each log's batch into its own segment and syncs it there
    /// (the journal's thread one, the direct writers the rest, in
    /// parallel), as it would a log alone: with few logs busy, their
    /// fdatasyncs side by side cost the disk less than every byte
    /// written twice, into the journal and again into its segment; with
    /// more, one write and one fdatasync for all of them cost less
    /// (docs/results.md, "A journal with few busy logs writes each into
    /// its own segment"). 0: every round of several logs goes through
    /// the journal.
    pub few_logs: usize,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            bytes_max: 64 * 1024 * 1024,
            few_logs: 12,
        }
    }
}

/// What [`Journal::open`] found and redid.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RedoReport {
    /// The epoch the file's start frame named (`None`: a new journal, or a
    /// start frame that did not read back whole: nothing to redo).
    pub epoch: Option<u64>,
    /// Frames written back into their files.
    pub frames: u64,
    pub bytes: u64,
    /// Frames naming a file that no longer exists.
    pub skipped: u64,
    /// Distinct files written and fdatasynced.
    pub files: usize,
}

/// Counters of a journal, read by the metrics and the experiments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalMetrics {
    /// Rounds that went through the journal (several logs).
    pub rounds: u64,
    /// Batches written past the journal into their own segment and
    /// synced there: a log alone in its round, a large batch, or any
    /// while few logs are busy ([`JournalConfig::few_logs`]).
    pub direct_writes: u64,
    /// Of the direct writes, those the thread that appended the records
    /// made itself ([`write_here`]).
    pub in_place_writes: u64,
    /// Records and bytes the journal's rounds carried.
    pub records: u64,
    pub bytes: u64,
    pub rotations: u64,
}

struct Control {
    /// Logs with pending chunks, in the order they asked (a log a direct
    /// writer put back may stand twice; the second finds nothing).
    ready: Vec<Arc<dyn Member>>,
    waiting: bool,
    shutdown: bool,
    failed: Option<Arc<str>>,
    rotations_asked: u64,
    rotations_done: u64,
    /// Logs being written by the threads that appended to them
    /// ([`write_here`]).
    inline: usize,
    /// The log the last round (or write in place) wrote alone, by its
    /// address; 0 after a round of several. A log may be written in place
    /// only while it has the journal to itself: with many logs busy, the
    /// rounds that merge their syncs are what keeps the disk's pace.
    alone: usize,
    metrics: JournalMetrics,
}

impl Control {
    /// Whether a write of the log at `address` alone goes in place: the
    /// journal's thread waits with nothing in its list, and its last
    /// round (or write in place) was of that log alone.
    fn in_place(&self, address: usize) -> bool {
        self.alone == address && self.waiting && self.ready.is_empty() && !self.shutdown
    }
}

pub(crate) struct Inner {
    root: PathBuf,
    path: PathBuf,
    file: Arc<dyn StorageFile>,
    config: JournalConfig,
    control: Mutex<Control>,
    work: Condvar,
    rotated: Condvar,
    /// The journal's thread and its direct writers.
    threads: Mutex<Vec<std::thread::ThreadId>>,
}

/// A server's journal (see the module's comment). Dropping the last
/// handle, once every log using it is gone, stops its thread after a last
/// rotation, which leaves nothing to redo.
pub struct Journal {
    inner: Arc<Inner>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("path", &self.inner.path)
            .field("bytes_max", &self.inner.config.bytes_max)
            .finish()
    }
}

impl Journal {
    /// Opens (or makes) the journal `journal.wal` in `root`, redoes what
    /// its current epoch holds into the files under `root` it names, makes
    /// those durable, starts a new epoch and starts the journal's thread.
    /// Must run before any log under `root` opens.
    pub fn open(
        storage: Arc<dyn Storage>,
        root: &Path,
        config: JournalConfig,
    ) -> Result<(Journal, RedoReport), LogError> {
        Journal::open_in(storage, root, root, config)
    }

    /// As [`Journal::open`], with the journal file in `folder` (another
    /// device, say) rather than in `root`; its frames still name files
    /// under `root`. One journal per root: two servers must not share a
    /// folder's journal.
    pub fn open_in(
        storage: Arc<dyn Storage>,
        root: &Path,
        folder: &Path,
        config: JournalConfig,
    ) -> Result<(Journal, RedoReport), LogError> {
        storage.create_dir_all(folder).map_err(io_error(folder))?;
        let path = folder.join(JOURNAL_FILE);
        let existed = storage.exists(&path);
        let file = storage.open(&path, true).map_err(io_error(&path))?;
        let (report, epoch) = if existed {
            redo(storage.as_ref(), root, &path, file.as_ref())?
        } else {
            (RedoReport::default(), None)
        };
        let length = file.len().map_err(io_error(&path))?;
        if length < config.bytes_max {
            preallocate(file.as_ref(), length, config.bytes_max).map_err(io_error(&path))?;
        }
        let epoch = match epoch {
            Some(epoch) => epoch.wrapping_add(1).max(1),
            // A random start: stale frames of an unknown epoch further on
            // must not read as this one's.
            None => fresh_epoch(),
        };
        write_start(file.as_ref(), epoch).map_err(io_error(&path))?;
        if !existed {
            storage.sync_dir(folder).map_err(io_error(folder))?;
        }
        let inner = Arc::new(Inner {
            root: root.to_path_buf(),
            path,
            file,
            config,
            control: Mutex::new(Control {
                ready: Vec::new(),
                waiting: false,
                shutdown: false,
                failed: None,
                rotations_asked: 0,
                rotations_done: 0,
                inline: 0,
                alone: 0,
                metrics: JournalMetrics::default(),
            }),
            work: Condvar::new(),
            rotated: Condvar::new(),
            threads: Mutex::new(Vec::new()),
        });
        let worker = Arc::clone(&inner);
        let thread = std::thread::Builder::new()
            .name("journal".into())
            .spawn(move || worker.run(epoch))
            .map_err(io_error(root))?;
        inner.note_thread(&thread);
        Ok((
            Journal {
                inner,
                thread: Mutex::new(Some(thread)),
            },
            report,
        ))
    }

    /// Syncs every segment file written through the page cache since the
    /// last rotation and starts a new epoch, then returns: afterwards no
    /// frame of the journal names bytes written before the call. Call it
    /// before removing or cutting a log's files when a file of the same
    /// name may be made again.
    pub fn rotate(&self) -> Result<(), LogError> {
        let inner = &self.inner;
        let mut control = inner.lock();
        control.rotations_asked += 1;
        let wanted = control.rotations_asked;
        inner.work.notify_one();
        while control.rotations_done < wanted {
            if let Some(failure) = &control.failed {
                return Err(LogError::Checkpoint(format!(
                    "the journal failed: {failure}"
                )));
            }
            control = inner.rotated.wait(control).expect("journal lock poisoned");
        }
        Ok(())
    }

    pub fn metrics(&self) -> JournalMetrics {
        self.inner.lock().metrics
    }

    /// Whether the journal's thread waits for work, with none in its
    /// list: a log alone on the journal is then written in place by
    /// [`write_here`].
    pub fn idle(&self) -> bool {
        let control = self.inner.lock();
        control.waiting && control.ready.is_empty()
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.inner.lock().shutdown = true;
        self.inner.work.notify_all();
        let thread = self.thread.lock().expect("journal lock poisoned").take();
        if let Some(thread) = thread {
            // Dropped by a durable hook on one of the journal's threads:
            // they stop once the hook returns, and cannot wait for
            // themselves.
            if self.inner.is_current() {
                return;
            }
            if thread.join().is_err() && !std::thread::panicking() {
                panic!("journal thread panicked");
            }
        }
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Control> {
        self.control.lock().expect("journal lock poisoned")
    }

    /// Called by a log whose first pending chunk just arrived: the next
    /// round takes it. `Err` when the journal failed or stopped.
    pub(crate) fn enqueue(self: &Arc<Self>, log: Arc<dyn Member>) -> Result<(), Arc<str>> {
        let control = self.lock();
        if let Some(failure) = &control.failed {
            return Err(failure.clone());
        }
        if control.shutdown {
            return Err(Arc::from("the journal is closed"));
        }
        let Some(log) = hold(self, log) else {
            return Ok(());
        };
        self.push_ready(control, log);
        Ok(())
    }

    /// Puts `log` in the list and wakes the journal's thread if it waits.
    /// The wake clears `waiting`: the logs that come before the thread
    /// runs find it already woken and cost no system call each (with many
    /// streams, several arrive within one wake-up).
    fn push_ready(&self, mut control: MutexGuard<'_, Control>, log: Arc<dyn Member>) {
        control.ready.push(log);
        let wake = std::mem::replace(&mut control.waiting, false);
        drop(control);
        if wake {
            self.work.notify_one();
        }
    }

    /// The journal's lock; `None`, with `log` latched failed, when the
    /// journal has failed.
    fn lock_unless_failed(&self, log: &Arc<dyn Member>) -> Option<MutexGuard<'_, Control>> {
        let control = self.lock();
        if let Some(failure) = &control.failed {
            let failure = failure.to_string();
            drop(control);
            log.latch_io(failure);
            return None;
        }
        Some(control)
    }

    /// A log a round passed over while a direct writer had a batch of it.
    fn requeue(&self, log: Arc<dyn Member>) {
        if let Some(control) = self.lock_unless_failed(&log) {
            self.push_ready(control, log);
        }
    }

    /// Whether a [`write_here`] that appends to the log at `address` alone
    /// would now write it on its thread ([`Inner::write_or_enqueue`]'s
    /// test, read before the work: the journal may change meanwhile).
    pub(crate) fn would_write_in_place(&self, address: usize) -> bool {
        let control = self.lock();
        control.failed.is_none() && control.in_place(address)
    }

    /// A log [`write_here`] held back: written on this thread when the
    /// journal is idle and nothing else waits (a round of it alone would
    /// be the same direct write, after a wake-up of the journal's
    /// thread), otherwise handed to the journal as usual.
    fn write_or_enqueue(self: &Arc<Self>, log: Arc<dyn Member>) {
        let Some(mut control) = self.lock_unless_failed(&log) else {
            return;
        };
        if !control.in_place(address(&log)) {
            self.push_ready(control, log);
            return;
        }
        control.inline += 1;
        drop(control);
        let me = std::thread::current().id();
        // A durable hook run here may drop the log's last handle, which
        // must not wait for this thread.
        self.threads.lock().expect("journal lock poisoned").push(me);
        let mut wrote = false;
        if let Some(chunks) = log.take_direct() {
            if !chunks.is_empty() {
                log.write(chunks, Instant::now(), None);
                wrote = true;
            }
            if log.finish_in_flight() {
                self.requeue(Arc::clone(&log));
            }
        }
        {
            let mut threads = self.threads.lock().expect("journal lock poisoned");
            if let Some(at) = threads.iter().rposition(|thread| *thread == me) {
                threads.swap_remove(at);
            }
        }
        let mut control = self.lock();
        control.inline -= 1;
        if wrote {
            control.metrics.direct_writes += 1;
            control.metrics.in_place_writes += 1;
        }
        if control.shutdown && control.inline == 0 {
            drop(control);
            self.work.notify_all();
        }
    }

    /// Waits until no thread writes a log of the journal in place.
    fn wait_inline_idle(&self) {
        let mut control = self.lock();
        while control.inline > 0 {
            control = self.work.wait(control).expect("journal lock poisoned");
        }
    }

    /// Whether the calling thread is one of the journal's: its own thread
    /// or a direct writer, the threads that run the logs' durable hooks,
    /// which may drop a log (or the journal) and must not then wait for
    /// themselves.
    pub(crate) fn is_current(&self) -> bool {
        let me = std::thread::current().id();
        self.threads
            .lock()
            .expect("journal lock poisoned")
            .contains(&me)
    }

    fn note_thread(&self, thread: &JoinHandle<()>) {
        let mut threads = self.threads.lock().expect("journal lock poisoned");
        threads.push(thread.thread().id());
    }

    fn run(self: Arc<Self>, epoch: u64) {
        let mut writer = match Writer::start(&self, epoch) {
            Ok(writer) => writer,
            Err(error) => {
                self.fail(io_error(&self.path)(error));
                return;
            }
        };
        loop {
            let (logs, rotate, shutdown) = {
                let mut control = self.lock();
                while control.ready.is_empty()
                    && !control.shutdown
                    && control.rotations_done == control.rotations_asked
                {
                    control.waiting = true;
                    control = self.work.wait(control).expect("journal lock poisoned");
                    control.waiting = false;
                }
                (
                    std::mem::take(&mut control.ready),
                    control.rotations_asked,
                    control.shutdown,
                )
            };
            if !logs.is_empty() {
                if let Err(error) = self.round(&mut writer, logs) {
                    self.fail(error);
                    return;
                }
            }
            let asked = self.lock().rotations_done < rotate;
            let finishing = shutdown && self.lock().ready.is_empty();
            if finishing {
                // A direct writer, or a thread writing a log in place, may
                // put a log back in the list.
                writer.direct.wait_idle();
                self.wait_inline_idle();
                if !self.lock().ready.is_empty() {
                    continue;
                }
            }
            if asked || finishing {
                if let Err(error) = self.rotate(&mut writer) {
                    self.fail(error);
                    return;
                }
                let mut control = self.lock();
                control.rotations_done = rotate.max(control.rotations_done);
                drop(control);
                self.rotated.notify_all();
                if finishing {
                    return;
                }
            }
        }
    }

    /// One round: takes every waiting log's pending chunks and makes them
    /// durable (see the module's comment).
    fn round(&self, writer: &mut Writer, logs: Vec<Arc<dyn Member>>) -> Result<(), LogError> {
        let started = Instant::now();
        let mut taken: Vec<(Arc<dyn Member>, Vec<Chunk>)> = Vec::with_capacity(logs.len());
        for log in logs {
            let chunks = log.take_journaled();
            if !chunks.is_empty() {
                taken.push((log, chunks));
            }
        }
        match taken.as_slice() {
            [] => {}
            [(log, _)] => self.lock().alone = address(log),
            _ => self.lock().alone = 0,
        }
        if taken.len() > 1 {
            let is_large = |chunks: &[Chunk]| {
                chunks.iter().map(|c| c.bytes.len()).sum::<usize>() >= DIRECT_BYTES_MIN
            };
            // Few logs busy, and none of the round's batches large: the
            // direct writers are free to take every log of the round.
            let few = writer.busy.few(&taken, started, self.config.few_logs)
                && !taken.iter().any(|(_, chunks)| is_large(chunks));
            let (mut direct, mut journaled): (Vec<_>, Vec<_>) = taken
                .into_iter()
                .partition(|(_, chunks)| few || is_large(chunks));
            if few {
                // The journal's thread writes one of them itself.
                journaled.extend(direct.pop());
            }
            self.lock().metrics.direct_writes += direct.len() as u64;
            for (log, chunks) in direct {
                log.set_in_flight();
                writer.direct.submit(log, chunks, started);
            }
            taken = journaled;
        }
        match taken.len() {
            0 => return Ok(()),
            1 => {
                let (log, chunks) = taken.pop().expect("one log");
                log.write(chunks, started, None);
                self.lock().metrics.direct_writes += 1;
                return Ok(());
            }
            _ => {}
        }
        if let Err(error) = self.write_frames(writer, &taken) {
            for (log, _) in &taken {
                log.latch_io(error.to_string());
            }
            return Err(error);
        }
        for (log, chunks) in taken {
            log.write(chunks, started, Some(&mut writer.dirty));
            if log.take_listing() {
                writer.kept.push(Arc::downgrade(&log));
            }
        }
        if writer.position - writer.flushed_at >= self.config.bytes_max / FLUSHES_PER_EPOCH
            && writer.flusher.offer(&mut writer.dirty)
        {
            writer.flushed_at = writer.position;
        }
        Ok(())
    }

    /// Writes the frames of `taken`'s chunks as one round and syncs the
    /// journal, rotating first when the round would pass its size.
    fn write_frames(
        &self,
        writer: &mut Writer,
        taken: &[(Arc<dyn Member>, Vec<Chunk>)],
    ) -> Result<(), LogError> {
        let frames: Vec<(Arc<str>, &Chunk)> = taken
            .iter()
            .flat_map(|(log, chunks)| {
                chunks
                    .iter()
                    .map(move |chunk| (log.segment_path(&self.root, chunk.segment_base), chunk))
            })
            .collect();
        let size: u64 = frames
            .iter()
            .map(|(path, chunk)| (FRAME_HEADER_LEN + path.len() + chunk.bytes.len()) as u64)
            .sum();
        if writer.position > BLOCK_BYTES as u64
            && writer.position + size.next_multiple_of(BLOCK_BYTES as u64) > self.config.bytes_max
        {
            self.rotate(writer)?;
        }
        writer.buffer.reset(0);
        let mut records = 0;
        for (path, chunk) in frames {
            let head = FrameHead {
                epoch: writer.epoch,
                sequence: writer.sequence,
                offset: chunk.offset,
                round_start: writer.position,
            };
            push_frame(
                &mut writer.buffer,
                head,
                path.as_bytes(),
                chunk.bytes.records(),
            );
            writer.sequence += 1;
            records += chunk.records;
        }
        let bytes = writer.buffer.len() as u64;
        let blocks = writer.buffer.blocks();
        self.file
            .write_blocks_at(blocks, writer.position)
            .and_then(|()| self.file.sync_data())
            .map_err(io_error(&self.path))?;
        writer.position += blocks.len() as u64;
        let mut control = self.lock();
        control.metrics.rounds += 1;
        control.metrics.records += records;
        control.metrics.bytes += bytes;
        Ok(())
    }

    /// Syncs every file written through the page cache since the last
    /// rotation, then starts the next epoch at the first block.
    fn rotate(&self, writer: &mut Writer) -> Result<(), LogError> {
        writer.flusher.wait_idle()?;
        // A log dropped since wrote what it kept as it closed.
        for log in std::mem::take(&mut writer.kept) {
            if let Some(log) = log.upgrade() {
                log.spill(&mut writer.dirty)?;
            }
        }
        for (path, file) in writer.dirty.drain() {
            file.sync_data().map_err(io_error(&path))?;
        }
        writer.epoch = writer.epoch.wrapping_add(1).max(1);
        write_start(self.file.as_ref(), writer.epoch).map_err(io_error(&self.path))?;
        writer.sequence = 1;
        writer.position = BLOCK_BYTES as u64;
        writer.flushed_at = writer.position;
        self.lock().metrics.rotations += 1;
        Ok(())
    }

    /// Latches the journal failed: every log waiting now or later fails.
    fn fail(&self, error: LogError) {
        let message: Arc<str> = Arc::from(error.to_string());
        let waiting = {
            let mut control = self.lock();
            control.failed = Some(message.clone());
            std::mem::take(&mut control.ready)
        };
        for log in waiting {
            log.latch_io(message.to_string());
        }
        self.rotated.notify_all();
    }
}

/// The journal thread's own state.
struct Writer {
    epoch: u64,
    /// The next frame's sequence number.
    sequence: u64,
    /// Where the next round starts (a block boundary).
    position: u64,
    /// Segment files written through the page cache since they were
    /// last handed to the flusher.
    dirty: Dirty,
    buffer: BlockBuffer,
    /// Where the journal stood when the flusher was last handed files.
    flushed_at: u64,
    /// Logs that kept blocks of a round since the last rotation: the
    /// rotation writes them to their segments first (the frames it
    /// leaves behind are those blocks' only durable copy).
    kept: Vec<std::sync::Weak<dyn Member>>,
    flusher: Flusher,
    direct: DirectWriters,
    busy: BusyLogs,
}

/// The logs with records in the journal's recent rounds, counted over
/// spans of [`BUSY_SPAN`] (see [`JournalConfig::few_logs`]).
struct BusyLogs {
    /// The logs of this span's rounds, by address.
    seen: std::collections::HashSet<usize>,
    since: Instant,
    /// How many the last whole span saw.
    last: usize,
}

impl BusyLogs {
    fn new() -> BusyLogs {
        BusyLogs {
            seen: std::collections::HashSet::new(),
            since: Instant::now(),
            last: 0,
        }
    }

    /// Counts the logs of a round of several that started at `now`, and
    /// tells whether few logs are busy: no more than `few_logs` in this
    /// span nor in the last. Counting stops once a span has seen more
    /// than `few_logs`: the answer is then no for it and the next, and
    /// with many logs busy a round hashes none of them.
    fn few(
        &mut self,
        round: &[(Arc<dyn Member>, Vec<Chunk>)],
        now: Instant,
        few_logs: usize,
    ) -> bool {
        if now.saturating_duration_since(self.since) >= BUSY_SPAN {
            self.last = self.seen.len();
            self.seen.clear();
            self.since = now;
        }
        for (log, _) in round {
            if self.seen.len() > few_logs {
                break;
            }
            self.seen.insert(address(log));
        }
        self.last.max(self.seen.len()) <= few_logs
    }
}

/// Threads that write large batches of logs past the journal.
struct DirectWriters {
    shared: Arc<DirectShared>,
    threads: Vec<JoinHandle<()>>,
}

struct DirectShared {
    journal: std::sync::Weak<Inner>,
    queue: Mutex<DirectQueue>,
    work: Condvar,
    idle: Condvar,
}

#[derive(Default)]
struct DirectQueue {
    batches: std::collections::VecDeque<(Arc<dyn Member>, Vec<Chunk>, Instant)>,
    busy: usize,
    shutdown: bool,
}

impl DirectWriters {
    fn start(journal: &Arc<Inner>) -> std::io::Result<DirectWriters> {
        let shared = Arc::new(DirectShared {
            journal: Arc::downgrade(journal),
            queue: Mutex::new(DirectQueue::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
        });
        let mut threads = Vec::with_capacity(DIRECT_WRITERS);
        for _ in 0..DIRECT_WRITERS {
            let worker = Arc::clone(&shared);
            let thread = std::thread::Builder::new()
                .name("journal-direct".into())
                .spawn(move || worker.run())?;
            journal.note_thread(&thread);
            threads.push(thread);
        }
        Ok(DirectWriters { shared, threads })
    }

    fn lock(&self) -> MutexGuard<'_, DirectQueue> {
        self.shared
            .queue
            .lock()
            .expect("direct writers' lock poisoned")
    }

    fn submit(&self, log: Arc<dyn Member>, chunks: Vec<Chunk>, started: Instant) {
        self.lock().batches.push_back((log, chunks, started));
        self.shared.work.notify_one();
    }

    /// Waits until every batch handed over is durable (or failed).
    fn wait_idle(&self) {
        let mut queue = self.lock();
        while queue.busy > 0 || !queue.batches.is_empty() {
            queue = self
                .shared
                .idle
                .wait(queue)
                .expect("direct writers' lock poisoned");
        }
    }
}

impl Drop for DirectWriters {
    fn drop(&mut self) {
        self.lock().shutdown = true;
        self.shared.work.notify_all();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

impl DirectShared {
    fn run(&self) {
        let mut queue = self.queue.lock().expect("direct writers' lock poisoned");
        loop {
            while queue.batches.is_empty() && !queue.shutdown {
                queue = self
                    .work
                    .wait(queue)
                    .expect("direct writers' lock poisoned");
            }
            let Some((log, chunks, started)) = queue.batches.pop_front() else {
                return;
            };
            queue.busy += 1;
            drop(queue);
            log.write(chunks, started, None);
            if log.finish_in_flight() {
                if let Some(journal) = self.journal.upgrade() {
                    journal.requeue(log);
                }
            }
            queue = self.queue.lock().expect("direct writers' lock poisoned");
            queue.busy -= 1;
            self.idle.notify_all();
        }
    }
}

impl Writer {
    fn start(journal: &Arc<Inner>, epoch: u64) -> std::io::Result<Writer> {
        Ok(Writer {
            direct: DirectWriters::start(journal)?,
            epoch,
            sequence: 1,
            position: BLOCK_BYTES as u64,
            dirty: HashMap::new(),
            buffer: BlockBuffer::default(),
            flushed_at: BLOCK_BYTES as u64,
            kept: Vec::new(),
            flusher: Flusher::start()?,
            busy: BusyLogs::new(),
        })
    }
}

/// The thread that syncs segment files ahead of a rotation.
struct Flusher {
    shared: Arc<FlusherShared>,
    thread: Option<JoinHandle<()>>,
}

struct FlusherShared {
    job: Mutex<FlushJob>,
    work: Condvar,
    idle: Condvar,
}

#[derive(Default)]
struct FlushJob {
    files: Vec<(SegmentPath, Arc<dyn StorageFile>)>,
    busy: bool,
    shutdown: bool,
    /// Threads in [`Flusher::wait_idle`]: the end of a sync wakes no one
    /// (and makes no system call) when there are none.
    idle_waiters: usize,
    /// The first sync that failed: its file, and the error.
    failed: Option<(PathBuf, std::io::ErrorKind, String)>,
}

impl Flusher {
    fn start() -> std::io::Result<Flusher> {
        let shared = Arc::new(FlusherShared {
            job: Mutex::new(FlushJob::default()),
            work: Condvar::new(),
            idle: Condvar::new(),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("journal-flush".into())
            .spawn(move || worker.run())?;
        Ok(Flusher {
            shared,
            thread: Some(thread),
        })
    }

    fn lock(&self) -> MutexGuard<'_, FlushJob> {
        self.shared.job.lock().expect("flusher lock poisoned")
    }

    /// Hands `dirty` over when the flusher has nothing to do; false (and
    /// `dirty` kept) when it is still syncing the last files.
    fn offer(&self, dirty: &mut Dirty) -> bool {
        let mut job = self.lock();
        if job.busy || !job.files.is_empty() {
            return false;
        }
        job.files.extend(dirty.drain());
        drop(job);
        self.shared.work.notify_one();
        true
    }

    /// Waits until everything handed over is synced; the first failure.
    fn wait_idle(&self) -> Result<(), LogError> {
        let mut job = self.lock();
        while job.busy || !job.files.is_empty() {
            job.idle_waiters += 1;
            job = self.shared.idle.wait(job).expect("flusher lock poisoned");
            job.idle_waiters -= 1;
        }
        match &job.failed {
            Some((path, kind, message)) => Err(LogError::Io {
                path: path.clone(),
                source: std::io::Error::new(*kind, message.clone()),
            }),
            None => Ok(()),
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.lock().shutdown = true;
        self.shared.work.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl FlusherShared {
    fn run(&self) {
        let mut job = self.job.lock().expect("flusher lock poisoned");
        loop {
            while job.files.is_empty() && !job.shutdown {
                job = self.work.wait(job).expect("flusher lock poisoned");
            }
            if job.files.is_empty() {
                return;
            }
            let files = std::mem::take(&mut job.files);
            job.busy = true;
            drop(job);
            let mut failed = None;
            for (path, file) in files {
                if let Err(error) = file.sync_data() {
                    failed.get_or_insert_with(|| {
                        (path.to_path_buf(), error.kind(), error.to_string())
                    });
                }
            }
            job = self.job.lock().expect("flusher lock poisoned");
            job.busy = false;
            if job.failed.is_none() {
                job.failed = failed;
            }
            if job.idle_waiters > 0 {
                self.idle.notify_all();
            }
        }
    }
}

/// Files written through the page cache, to sync at the next rotation.
pub(crate) type Dirty = HashMap<SegmentPath, Arc<dyn StorageFile>>;

/// A segment file's path, shared: a log keeps its current segment's, so
/// that writing a batch formats no path.
pub(crate) type SegmentPath = Arc<Path>;

/// A frame's numbers.
#[derive(Clone, Copy)]
struct FrameHead {
    epoch: u64,
    sequence: u64,
    offset: u64,
    round_start: u64,
}

fn push_frame(buffer: &mut BlockBuffer, head: FrameHead, path: &[u8], bytes: &[u8]) {
    let mut header = [0u8; FRAME_HEADER_LEN];
    header[0..4].copy_from_slice(&MAGIC);
    header[8..16].copy_from_slice(&head.epoch.to_le_bytes());
    header[16..24].copy_from_slice(&head.sequence.to_le_bytes());
    header[24..32].copy_from_slice(&head.offset.to_le_bytes());
    header[32..40].copy_from_slice(&head.round_start.to_le_bytes());
    header[40..42].copy_from_slice(&(path.len() as u16).to_le_bytes());
    header[42..46].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
    let crc = checksum(&header, path, bytes);
    header[4..8].copy_from_slice(&crc.to_le_bytes());
    buffer.extend_from_slice(&header);
    buffer.extend_from_slice(path);
    buffer.extend_from_slice(bytes);
}

fn checksum(header: &[u8], path: &[u8], bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&header[8..]);
    crc32c::crc32c_append(crc32c::crc32c_append(crc, path), bytes)
}

/// One frame read back.
struct Frame<'a> {
    head: FrameHead,
    path: &'a str,
    bytes: &'a [u8],
    /// Where the frame ends in the file.
    end: usize,
}

/// The frame at `at` of `file`, if one is there whole, with a path that
/// stays inside the journal's root.
fn read_frame(file: &[u8], at: usize) -> Option<Frame<'_>> {
    let header = file.get(at..at.checked_add(FRAME_HEADER_LEN)?)?;
    if header[0..4] != MAGIC {
        return None;
    }
    let word = |from: usize| u64::from_le_bytes(header[from..from + 8].try_into().expect("8"));
    let path_len = u16::from_le_bytes(header[40..42].try_into().expect("2")) as usize;
    let bytes_len = u32::from_le_bytes(header[42..46].try_into().expect("4")) as usize;
    let body = at + FRAME_HEADER_LEN;
    let end = body.checked_add(path_len)?.checked_add(bytes_len)?;
    let path = file.get(body..body + path_len)?;
    let bytes = file.get(body + path_len..end)?;
    let stored = u32::from_le_bytes(header[4..8].try_into().expect("4"));
    if checksum(header, path, bytes) != stored {
        return None;
    }
    let path = std::str::from_utf8(path).ok()?;
    let inside = Path::new(path)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !inside {
        return None;
    }
    Some(Frame {
        head: FrameHead {
            epoch: word(8),
            sequence: word(16),
            offset: word(24),
            round_start: word(32),
        },
        path,
        bytes,
        end,
    })
}

/// Whether a good frame of `epoch` from a round that starts after `at`
/// lies further on: the damage at `at` is then no torn last round.
fn later_round(file: &[u8], at: usize, epoch: u64, sequence: u64) -> bool {
    let mut next = at.next_multiple_of(BLOCK_BYTES);
    while next + FRAME_HEADER_LEN <= file.len() {
        if let Some(frame) = read_frame(file, next) {
            let head = frame.head;
            if head.epoch == epoch && head.sequence > sequence && head.round_start as usize > at {
                return true;
            }
        }
        next += BLOCK_BYTES;
    }
    false
}

/// Redoes the current epoch's frames (see the module's comment); returns
/// what it did and the epoch, if the start frame read back.
fn redo(
    storage: &dyn Storage,
    root: &Path,
    path: &Path,
    journal: &dyn StorageFile,
) -> Result<(RedoReport, Option<u64>), LogError> {
    let mut report = RedoReport::default();
    let length = journal.len().map_err(io_error(path))? as usize;
    let mut content = vec![0u8; length];
    journal
        .read_exact_at(&mut content, 0)
        .map_err(io_error(path))?;
    let Some(start) =
        read_frame(&content, 0).filter(|f| f.head.offset == START_OFFSET && f.head.sequence == 0)
    else {
        return Ok((report, None));
    };
    let epoch = start.head.epoch;
    report.epoch = Some(epoch);
    let mut files: HashMap<PathBuf, Option<Arc<dyn StorageFile>>> = HashMap::new();
    let mut at = BLOCK_BYTES;
    let mut expected = 1;
    loop {
        let frame = read_frame(&content, at).or_else(|| {
            // Rounds start on block boundaries: past one round's end.
            let next = at.next_multiple_of(BLOCK_BYTES);
            (next != at).then(|| read_frame(&content, next)).flatten()
        });
        let Some(frame) = frame.filter(|f| f.head.epoch == epoch && f.head.sequence == expected)
        else {
            if later_round(&content, at, epoch, expected) {
                return Err(LogError::Corrupt {
                    path: path.to_path_buf(),
                    offset: at as u64,
                    reason: format!(
                        "journal frame {expected} of epoch {epoch} is damaged, and a later round was written after it"
                    ),
                });
            }
            break;
        };
        if frame.head.offset == START_OFFSET {
            break;
        }
        redo_frame(storage, root, &frame, &mut files, &mut report)?;
        expected += 1;
        at = frame.end;
    }
    for (target, file) in &files {
        if let Some(file) = file {
            file.sync_data().map_err(io_error(target))?;
            report.files += 1;
        }
    }
    Ok((report, Some(epoch)))
}

/// Writes one frame's bytes into the file it names (opened once, kept in
/// `files`; a file that is gone is skipped).
fn redo_frame(
    storage: &dyn Storage,
    root: &Path,
    frame: &Frame<'_>,
    files: &mut HashMap<PathBuf, Option<Arc<dyn StorageFile>>>,
    report: &mut RedoReport,
) -> Result<(), LogError> {
    let target = root.join(frame.path);
    let file = match files.get(&target) {
        Some(file) => file.clone(),
        None => {
            let opened = match storage.open(&target, false) {
                Ok(file) => Some(file),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
                Err(error) => return Err(io_error(&target)(error)),
            };
            files.insert(target.clone(), opened.clone());
            opened
        }
    };
    match file {
        Some(file) => {
            file.write_at(frame.bytes, frame.head.offset)
                .map_err(io_error(&target))?;
            report.frames += 1;
            report.bytes += frame.bytes.len() as u64;
        }
        None => report.skipped += 1,
    }
    Ok(())
}

/// Writes and syncs the start frame of `epoch` over the first block.
fn write_start(file: &dyn StorageFile, epoch: u64) -> std::io::Result<()> {
    let mut buffer = BlockBuffer::default();
    buffer.reset(0);
    let head = FrameHead {
        epoch,
        sequence: 0,
        offset: START_OFFSET,
        round_start: 0,
    };
    push_frame(&mut buffer, head, &[], &[]);
    file.write_blocks_at(buffer.blocks(), 0)?;
    file.sync_data()
}

/// Fills the file with zeros from `from` (rounded down to a block) to
/// `to`, so that rounds overwrite allocated blocks.
fn preallocate(file: &dyn StorageFile, from: u64, to: u64) -> std::io::Result<()> {
    #[repr(C, align(4096))]
    struct Zeros([u8; PREALLOCATE_STEP]);
    static ZEROS: Zeros = Zeros([0; PREALLOCATE_STEP]);
    let mut at = from - from % BLOCK_BYTES as u64;
    while at < to {
        let length = (to - at).min(PREALLOCATE_STEP as u64) as usize;
        let length = length.next_multiple_of(BLOCK_BYTES);
        file.write_blocks_at(&ZEROS.0[..length], at)?;
        at += length as u64;
    }
    file.sync_data()
}

fn fresh_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1);
    nanos.max(1)
}

#[cfg(test)]
#[path = "journal_tests.rs"]
mod tests;
