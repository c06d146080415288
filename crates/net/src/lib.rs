//! Socket plumbing shared by the server and the client.
//!
//! [`SharedWriter`] is a TCP connection's write side that any thread can
//! write to: a tokio task, a log's I/O thread, a caller's own thread. A
//! sender that finds the connection idle (nothing queued, no flush under
//! way, and nothing written for [`IDLE_BEFORE_DIRECT`]) writes its bytes at
//! once, from its own thread, with one non-blocking write, so a lone
//! message costs no hand-off to another task and no wake-up of another
//! thread. Everything else waits in a bounded queue that the connection's
//! flusher task ([`SharedWriter::run`]) writes in batches: on a busy
//! connection, sends gather into few writes, as they would with the
//! flusher alone, instead of each costing a write of its own and a
//! wake-up of the reader. A busy thread can also say that its sends should
//! all be queued ([`deferring`]), so that it spends no time writing. Every
//! send lands whole and in the order the senders took the writer's lock:
//! bytes are never interleaved. A send's bytes are its own or shared
//! ([`Chunk`]): one frame for several connections is encoded once, and
//! each writer holds a slice of it until written.
//!
//! A link may be TLS ([`tls`]); its bytes are then encrypted by the
//! flusher alone, as a TLS session cannot be written from two places, so
//! a send on a TLS link is always queued.

pub mod tls;

pub use tls::{Acceptor, Dialer, Identity, Link, LinkReader, LinkWriter};

use std::cell::Cell;
use std::collections::VecDeque;
use std::io::ErrorKind;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::Notify;

/// How long a connection must have written nothing for a send to be
/// written at once by its sender. Between sends closer together than this
/// the flusher gathers them: a connection that busy loses little by
/// waiting for a batch, and each direct write would cost its reader a
/// wake-up for one message.
pub const IDLE_BEFORE_DIRECT: Duration = Duration::from_micros(100);

thread_local! {
    /// Set while this thread runs work that [`deferring`] marked busy.
    static DEFERRING: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread runs work that [`prompt`] marked.
    static PROMPT: Cell<bool> = const { Cell::new(false) };
    /// Sends this thread left for the flushers ([`queued_here`]).
    static QUEUED: Cell<u64> = const { Cell::new(0) };
}

/// How many sends this thread has left queued for the flushers rather
/// than written to their sockets, a count that only grows: work that
/// must know its sends are in the kernel's hands before it goes on
/// compares the count before and after them.
pub fn queued_here() -> u64 {
    QUEUED.get()
}

/// Runs `work` with every send it makes queued for the flushers rather
/// than written at once, when `defer`: for a thread that is the
/// bottleneck of a busy pipeline (a read loop with many messages in hand),
/// whose time a write of its own would take from the work behind it. Sends made with `defer`
/// false follow the usual rule.
pub fn deferring<R>(defer: bool, work: impl FnOnce() -> R) -> R {
    let outer = DEFERRING.replace(defer);
    let result = work();
    DEFERRING.set(outer);
    result
}

/// Runs `work` with every send it makes written at once when nothing is
/// queued on its connection and no flush is under way, however recently
/// the connection wrote: for a thread about to block (on the disk) after
/// its sends, whose sends would otherwise wait for a flusher it holds up.
pub fn prompt<R>(work: impl FnOnce() -> R) -> R {
    let deferring = DEFERRING.replace(false);
    let outer = PROMPT.replace(true);
    let result = work();
    PROMPT.set(outer);
    DEFERRING.set(deferring);
    result
}

/// Reads what a connection has onto the end of `buffer`, with room for
/// at least `room` bytes: no scratch buffer, so no copy out of one.
/// Cancel-safe: `buffer` grows only by what a completed read returned.
pub async fn read_into<R: AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut BytesMut,
    room: usize,
) -> std::io::Result<usize> {
    buffer.reserve(room);
    reader.read_buf(buffer).await
}

/// Bytes the flusher gathers into one write at most.
const FLUSH_BYTES_MAX: usize = 1024 * 1024;
/// Sends in one vectored write at most (Linux takes 1,024 slices).
const FLUSH_SENDS_MAX: usize = 512;

/// The bytes of one send: owned by it, shared with other sends (the
/// same frame for several connections, encoded once), or a frame in
/// parts (its encoded head and the large payloads or records it carries,
/// each left where it was rather than copied into one buffer). A direct
/// write takes any of them from its slices; a queued one keeps them until
/// written. A send is written whole and in order whatever its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    Owned(Vec<u8>),
    Shared(Bytes),
    /// Written one after the other, as one send: never interleaved with
    /// another's bytes.
    Parts(VecDeque<Bytes>),
}

impl Default for Chunk {
    fn default() -> Chunk {
        Chunk::Owned(Vec::new())
    }
}

impl From<Vec<u8>> for Chunk {
    fn from(bytes: Vec<u8>) -> Chunk {
        Chunk::Owned(bytes)
    }
}

impl From<Bytes> for Chunk {
    fn from(bytes: Bytes) -> Chunk {
        Chunk::Shared(bytes)
    }
}

impl Chunk {
    /// One send of `parts` in order, empty ones left out: `Shared` when
    /// only one is left.
    pub fn parts(parts: impl IntoIterator<Item = Bytes>) -> Chunk {
        let mut parts: VecDeque<Bytes> =
            parts.into_iter().filter(|part| !part.is_empty()).collect();
        match parts.len() {
            0 => Chunk::default(),
            1 => Chunk::Shared(parts.pop_front().unwrap_or_default()),
            _ => Chunk::Parts(parts),
        }
    }

    /// The send's bytes.
    pub fn len(&self) -> usize {
        match self {
            Chunk::Owned(bytes) => bytes.len(),
            Chunk::Shared(bytes) => bytes.len(),
            Chunk::Parts(parts) => parts.iter().map(Bytes::len).sum(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The send's bytes as slices, in the order they are written.
    pub fn slices(&self) -> impl Iterator<Item = &[u8]> {
        static NO_PARTS: VecDeque<Bytes> = VecDeque::new();
        let (one, parts): (&[u8], &VecDeque<Bytes>) = match self {
            Chunk::Owned(bytes) => (bytes, &NO_PARTS),
            Chunk::Shared(bytes) => (bytes, &NO_PARTS),
            Chunk::Parts(parts) => (&[], parts),
        };
        std::iter::once(one)
            .filter(|one| !one.is_empty())
            .chain(parts.iter().map(|part| &part[..]))
    }

    /// The bytes as a vector of their own (a copy unless owned).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            Chunk::Owned(bytes) => bytes,
            Chunk::Shared(bytes) => bytes.to_vec(),
            Chunk::Parts(parts) => parts.iter().flat_map(|part| part.iter().copied()).collect(),
        }
    }

    /// Drops the first `count` bytes, which were written.
    fn consume(&mut self, mut count: usize) {
        match self {
            Chunk::Owned(bytes) => drop(bytes.drain(..count)),
            Chunk::Shared(bytes) => bytes.advance(count),
            Chunk::Parts(parts) => {
                while let Some(front) = parts.front_mut() {
                    if count < front.len() {
                        front.advance(count);
                        return;
                    }
                    count -= front.len();
                    parts.pop_front();
                }
            }
        }
    }

    /// Written whole: an owned buffer keeps its capacity for the next
    /// bytes.
    fn clear(&mut self) {
        match self {
            Chunk::Owned(bytes) => bytes.clear(),
            Chunk::Shared(bytes) => bytes.clear(),
            Chunk::Parts(parts) => parts.clear(),
        }
    }
}

/// Why bytes were not taken.
#[derive(Debug)]
pub enum Refused<H> {
    /// The queue holds its maximum: the bytes (and what they hold) come
    /// back.
    Full(Chunk, Option<H>),
    /// The connection failed or was closed; nothing more is written.
    Closed,
}

/// The connection is closed; nothing more is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Closed;

/// How the writes went, for metrics and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Sends written whole by the sender's own thread.
    pub direct: u64,
    /// Writes of the flusher (each one batch of queued sends).
    pub flushed: u64,
}

/// A connection's write side; see the crate's documentation. `H` is what a
/// queued send holds until its bytes are written (a permit of a budget,
/// for example), dropped once they are.
pub struct SharedWriter<H = ()> {
    socket: Socket,
    state: Mutex<State<H>>,
    queued_max: usize,
    queued_bytes_max: usize,
    /// Wakes the flusher: bytes were queued, or the writer closed.
    flush: Notify,
    /// Wakes senders waiting for room in the queue.
    room: Notify,
    direct: AtomicU64,
    flushed: AtomicU64,
}

/// A writer's socket: a plain one is written by senders and the flusher
/// in turn (`State::flushing` says whose turn it is); a TLS one by the
/// flusher only, which alone locks it.
enum Socket {
    Plain(OwnedWriteHalf),
    Tls(tokio::sync::Mutex<LinkWriter>),
}

/// Whether a send may be written by its sender's thread.
#[derive(Clone, Copy)]
enum Direct {
    /// Whenever nothing is queued (a batch its sender gathered).
    Always,
    /// When nothing is queued, the connection is idle and the thread does
    /// not defer.
    WhenIdle,
    Never,
}

enum Taken {
    Batch,
    Nothing,
    Done,
}

struct State<H> {
    queue: VecDeque<(Chunk, Option<H>)>,
    /// Bytes of `queue`.
    queued_bytes: usize,
    /// The flusher owns the socket: set when a send is queued, cleared by
    /// the flusher once it finds the queue empty. A queued send implies
    /// it, so a direct write never overtakes queued bytes.
    flushing: bool,
    /// No more sends are taken: closed by its owner, or the socket failed.
    closed: bool,
    /// When bytes last went to the socket (or were taken by the flusher).
    last_write: Option<Instant>,
}

impl<H: Send + 'static> SharedWriter<H> {
    /// A writer over `socket` whose queue holds at most `queued_max` sends
    /// (at least one). Its flusher, [`SharedWriter::run`], must run for
    /// queued sends to be written.
    pub fn new(socket: LinkWriter, queued_max: usize) -> SharedWriter<H> {
        let socket = match socket {
            LinkWriter::Plain(socket) => Socket::Plain(socket),
            tls => Socket::Tls(tokio::sync::Mutex::new(tls)),
        };
        SharedWriter {
            socket,
            queued_bytes_max: usize::MAX,
            state: Mutex::new(State {
                queue: VecDeque::new(),
                queued_bytes: 0,
                last_write: None,
                flushing: false,
                closed: false,
            }),
            queued_max: queued_max.max(1),
            flush: Notify::new(),
            room: Notify::new(),
            direct: AtomicU64::new(0),
            flushed: AtomicU64::new(0),
        }
    }

    /// Bounds the queue's bytes too: a send that would pass `bytes` (with
    /// something queued already) is refused as `Full`.
    pub fn with_queued_bytes_max(mut self, bytes: usize) -> SharedWriter<H> {
        self.queued_bytes_max = bytes;
        self
    }

    /// Sends `bytes`: written at once from this thread when the connection
    /// is idle (see [`IDLE_BEFORE_DIRECT`]), queued for the flusher
    /// otherwise. Never blocks.
    pub fn try_send(&self, bytes: impl Into<Chunk>, hold: Option<H>) -> Result<(), Refused<H>> {
        self.offer(&mut bytes.into(), hold, Direct::WhenIdle)
    }

    /// Writes `bytes` from this thread unless sends are queued or a flush
    /// is under way (they are then queued whole), however recently the
    /// connection wrote: for the task that gathered them, which writes for
    /// its connection as the flusher would. A whole write leaves `bytes`
    /// empty with its capacity, to gather the next ones into; otherwise
    /// the writer takes them. Never blocks.
    pub fn send_gathered(&self, bytes: &mut Vec<u8>) -> Result<(), Refused<H>> {
        let mut chunk = Chunk::Owned(std::mem::take(bytes));
        let offered = self.offer(&mut chunk, None, Direct::Always);
        if let Chunk::Owned(left) = chunk {
            *bytes = left;
        }
        offered
    }

    /// [`SharedWriter::send_gathered`] for bytes gathered in parts.
    pub fn send_gathered_chunk(&self, bytes: Chunk) -> Result<(), Refused<H>> {
        self.offer(&mut { bytes }, None, Direct::Always)
    }

    /// Queues `bytes` for the flusher without writing from this thread:
    /// for a sender with more to come, whose sends the flusher gathers
    /// into fewer writes. Never blocks.
    pub fn try_queue(&self, bytes: impl Into<Chunk>, hold: Option<H>) -> Result<(), Refused<H>> {
        self.offer(&mut bytes.into(), hold, Direct::Never)
    }

    /// Sends `bytes` as [`SharedWriter::try_send`] does, waiting for room
    /// while the queue is full.
    pub async fn send(&self, bytes: impl Into<Chunk>, hold: Option<H>) -> Result<(), Closed> {
        let mut item = (bytes.into(), hold);
        loop {
            let room = self.room.notified();
            tokio::pin!(room);
            // Registered before the check, so room made after it wakes us.
            room.as_mut().enable();
            match self.offer(&mut item.0, item.1, Direct::WhenIdle) {
                Ok(()) => return Ok(()),
                Err(Refused::Closed) => return Err(Closed),
                Err(Refused::Full(bytes, hold)) => {
                    item = (bytes, hold);
                    room.await;
                }
            }
        }
    }

    /// Refuses every later send. The flusher writes what is queued, then
    /// returns; the socket's write side shuts when the writer is dropped.
    pub fn close(&self) {
        self.lock().closed = true;
        self.flush.notify_one();
        self.room.notify_waiters();
    }

    /// Whether sends are refused (closed, or the socket failed).
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Sends queued and not yet taken by the flusher.
    pub fn queued(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn stats(&self) -> WriterStats {
        WriterStats {
            direct: self.direct.load(Ordering::Relaxed),
            flushed: self.flushed.load(Ordering::Relaxed),
        }
    }

    /// The flusher: writes queued sends in batches until the writer is
    /// closed and its queue written, or the socket fails (later sends are
    /// then refused with `Closed`).
    pub async fn run(&self) {
        let mut batch = Batch::default();
        let mut holds = Vec::new();
        loop {
            match self.take_batch(&mut batch, &mut holds) {
                Taken::Batch => {}
                Taken::Nothing => {
                    self.flush.notified().await;
                    continue;
                }
                Taken::Done => return,
            }
            self.room.notify_waiters();
            if self.write_batch(&batch).await.is_err() {
                self.fail();
                return;
            }
            self.flushed.fetch_add(1, Ordering::Relaxed);
            // Written: what the sends held is released.
            holds.clear();
        }
    }

    /// Moves queued sends into `batch` (up to `FLUSH_BYTES_MAX` and
    /// `FLUSH_SENDS_MAX`), or, with nothing queued, gives the socket back
    /// to direct writers.
    fn take_batch(&self, batch: &mut Batch, holds: &mut Vec<H>) -> Taken {
        let mut state = self.lock();
        if state.queue.is_empty() {
            state.flushing = false;
            let closed = state.closed;
            drop(state);
            self.room.notify_waiters();
            return if closed { Taken::Done } else { Taken::Nothing };
        }
        batch.clear();
        state.last_write = Some(Instant::now());
        let gather = matches!(self.socket, Socket::Tls(_));
        while let Some((bytes, hold)) = state.queue.pop_front() {
            state.queued_bytes -= bytes.len();
            batch.push(bytes, gather);
            holds.extend(hold);
            if batch.bytes >= FLUSH_BYTES_MAX || batch.sends.len() >= FLUSH_SENDS_MAX {
                break;
            }
        }
        Taken::Batch
    }

    /// Writes `bytes` at once if `direct` allows, leaving them empty (an
    /// owned buffer with its capacity); otherwise (or for what the socket
    /// did not take) the queue takes them.
    fn offer(&self, bytes: &mut Chunk, hold: Option<H>, direct: Direct) -> Result<(), Refused<H>> {
        let mut state = self.lock();
        if state.closed {
            return Err(Refused::Closed);
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let write = !state.flushing
            && matches!(self.socket, Socket::Plain(_))
            && match direct {
                Direct::Always => true,
                Direct::WhenIdle => {
                    !DEFERRING.get()
                        && (PROMPT.get()
                            || state
                                .last_write
                                .is_none_or(|last| last.elapsed() >= IDLE_BEFORE_DIRECT))
                }
                Direct::Never => false,
            };
        if write {
            let Some(written) = self.write_now(&mut state, bytes) else {
                drop(state);
                self.fail();
                return Err(Refused::Closed);
            };
            if written == bytes.len() {
                bytes.clear();
                return Ok(());
            }
            bytes.consume(written);
        }
        QUEUED.set(QUEUED.get() + 1);
        self.enqueue(state, std::mem::take(bytes), hold)
    }

    /// Writes as much of `bytes` as the socket takes now; `None` when the
    /// socket failed.
    fn write_now(&self, state: &mut State<H>, bytes: &Chunk) -> Option<usize> {
        let Socket::Plain(socket) = &self.socket else {
            return Some(0);
        };
        let length = bytes.len();
        let mut slices = Vec::new();
        let mut written = 0;
        while written < length {
            let wrote = match bytes {
                Chunk::Owned(one) => socket.try_write(&one[written..]),
                Chunk::Shared(one) => socket.try_write(&one[written..]),
                Chunk::Parts(_) => {
                    io_slices(std::slice::from_ref(bytes), written, &mut slices);
                    socket.try_write_vectored(&slices)
                }
            };
            match wrote {
                Ok(0) => break,
                Ok(count) => written += count,
                Err(error) if error.kind() == ErrorKind::Interrupted => {}
                Err(error) if error.kind() == ErrorKind::WouldBlock => break,
                Err(_) => return None,
            }
        }
        if written == length {
            self.direct.fetch_add(1, Ordering::Relaxed);
            state.last_write = Some(Instant::now());
        }
        Some(written)
    }

    /// Queues a send behind what is queued (the flusher owns the socket
    /// from now on), within the queue's bounds.
    fn enqueue(
        &self,
        mut state: MutexGuard<'_, State<H>>,
        bytes: Chunk,
        hold: Option<H>,
    ) -> Result<(), Refused<H>> {
        // An empty queue always has room: `queued_max` is at least one.
        let over_bytes = !state.queue.is_empty()
            && state.queued_bytes.saturating_add(bytes.len()) > self.queued_bytes_max;
        if state.queue.len() >= self.queued_max || over_bytes {
            return Err(Refused::Full(bytes, hold));
        }
        state.queued_bytes += bytes.len();
        state.queue.push_back((bytes, hold));
        if !std::mem::replace(&mut state.flushing, true) {
            drop(state);
            self.flush.notify_one();
        }
        Ok(())
    }

    /// The socket failed: nothing queued will be written.
    fn fail(&self) {
        {
            let mut state = self.lock();
            state.closed = true;
            state.queue.clear();
            state.queued_bytes = 0;
        }
        self.flush.notify_one();
        self.room.notify_waiters();
    }

    /// Writes a batch of the flusher.
    async fn write_batch(&self, batch: &Batch) -> std::io::Result<()> {
        match &self.socket {
            Socket::Plain(socket) => write_all_vectored(socket, &batch.sends).await,
            Socket::Tls(socket) => {
                let mut socket = socket.lock().await;
                socket.write_all(&batch.gathered).await?;
                socket.flush().await
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<H>> {
        self.state.lock().expect("writer lock poisoned")
    }
}

/// What the flusher writes at once. On a plain socket, the queued sends
/// themselves, written with vectored writes: no copy of their bytes on
/// the way to the kernel. On a TLS link, gathered into one buffer: the TLS
/// layer copies them into its records anyway, and a few large records
/// cost less than one per send.
#[derive(Default)]
struct Batch {
    sends: Vec<Chunk>,
    gathered: Vec<u8>,
    bytes: usize,
}

impl Batch {
    fn clear(&mut self) {
        self.sends.clear();
        self.gathered.clear();
        self.bytes = 0;
    }

    fn push(&mut self, bytes: Chunk, gather: bool) {
        self.bytes += bytes.len();
        match gather {
            true => bytes
                .slices()
                .for_each(|slice| self.gathered.extend_from_slice(slice)),
            false => self.sends.push(bytes),
        }
    }
}

/// Slices one vectored write takes at most (Linux's `IOV_MAX`).
const IO_SLICES_MAX: usize = 1024;

/// `sends`' bytes after their first `skip`, as the slices of one vectored
/// write (at most [`IO_SLICES_MAX`]), into `out`.
fn io_slices<'a>(sends: &'a [Chunk], mut skip: usize, out: &mut Vec<std::io::IoSlice<'a>>) {
    out.clear();
    for slice in sends.iter().flat_map(Chunk::slices) {
        if skip >= slice.len() {
            skip -= slice.len();
            continue;
        }
        out.push(std::io::IoSlice::new(&slice[skip..]));
        skip = 0;
        if out.len() == IO_SLICES_MAX {
            return;
        }
    }
}

/// Writes every byte of `sends`, in order, with as few vectored writes as
/// the socket allows.
async fn write_all_vectored(socket: &OwnedWriteHalf, sends: &[Chunk]) -> std::io::Result<()> {
    let length: usize = sends.iter().map(Chunk::len).sum();
    let mut slices = Vec::new();
    let mut written = 0;
    while written < length {
        socket.writable().await?;
        io_slices(sends, written, &mut slices);
        match socket.try_write_vectored(&slices) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(count) => written += count,
            Err(error)
                if matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
