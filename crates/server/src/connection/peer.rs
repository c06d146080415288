//! A peer link: the replication messages one server sends to this one's
//! streams, read in one of two ways as its traffic goes.
//!
//! - **Quiet** (about a frame and at most a record a read, as at window 1),
//!   a plain link is read by a thread of its own that blocks in its reads,
//!   as the flow's floor does: each hop from a primary to a backup costs
//!   the wake-up of that one thread, not a read that finds nothing, an
//!   `epoll_wait` and a runtime worker's wake-up.
//! - **Busy** (several frames or records a read, as with many streams or a
//!   large window), the runtime reads it: a worker busy with other tasks
//!   finds the link's next bytes waiting, where a thread of its own would
//!   be woken for every arrival. So does a link of no records (a backup's
//!   acks and `Progress`), which no acknowledgement waits for under
//!   `one-hop-ack-client`.
//!
//! Every `LOOK_READS` reads the link's means decide (`Traffic`, with the
//! marks of `ServerConfig::peer_reading`); the hand-over keeps the socket
//! and the bytes read and not yet cut, so nothing is lost or read twice. A
//! TLS link stays with the runtime: its session cannot be handed back.
//! docs/results.md, "A peer link read by whichever suits its traffic",
//! gives what each way costs.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine::replication::{Msg, ServerId};
use net::Link;
use proto::{Frame, FrameBuffer};
use tokio::sync::{watch, Notify};

use super::READ_BYTES;
use crate::config::PeerReading;
use crate::state::ServerState;
use crate::stream::Stream;
use crate::wire;

/// Serves a peer link until it ends, the server stops or a newer link from
/// the same peer comes (`NewestPeerLink`). A link read by a thread when
/// that happens is closed, and the thread waited for: no step of a link
/// once served runs after this returns.
pub(super) async fn serve_peer(
    from: ServerId,
    mut link: Link,
    mut buffer: FrameBuffer,
    server: &Arc<ServerState>,
    mut stop: watch::Receiver<bool>,
) {
    let newest = NewestPeerLink::list(server, from);
    let mut feed = Feed::new(from, server);
    if let Some(metrics) = &server.metrics {
        metrics.peer_links_accepted.fetch_add(1, Ordering::Relaxed);
    }
    let plain = matches!(link, Link::Plain(_));
    let mut traffic = Traffic::new(plain, server.config.peer_reading);
    loop {
        if traffic.on_thread {
            let Link::Plain(socket) = link else {
                return;
            };
            let Some(mut thread) = ThreadRead::start(socket, (feed, buffer, traffic)) else {
                return;
            };
            let busy = tokio::select! {
                busy = &mut thread.reading => Some(busy.ok().flatten()),
                _ = stop.wait_for(|stopping| *stopping) => None,
                _ = newest.superseded.notified() => {
                    tracing::debug!("a newer link from server {from} closes this one");
                    None
                }
            };
            let Some(busy) = busy else {
                return thread.close().await;
            };
            // The thread is done: the socket is the runtime's again.
            thread.closer = None;
            let Some((socket, state)) = busy.and_then(into_runtime) else {
                return;
            };
            (feed, buffer, traffic) = state;
            link = Link::Plain(socket);
            feed.handed(HandedTo::Runtime);
        }
        let quiet = tokio::select! {
            quiet = read_on_runtime(&mut link, &mut feed, &mut buffer, &mut traffic) => quiet,
            _ = stop.wait_for(|stopping| *stopping) => false,
            _ = newest.superseded.notified() => {
                tracing::debug!("a newer link from server {from} closes this one");
                false
            }
        };
        if !quiet {
            return;
        }
        feed.handed(HandedTo::Thread);
    }
}

/// What a link's reader hands on when the link changes ways: where its
/// frames go, the bytes read and not yet cut, the traffic seen.
type ReadState = (Feed, FrameBuffer, Traffic);

/// Reads `link` on the runtime until it ends (`false`) or turns quiet
/// (`true`).
async fn read_on_runtime(
    link: &mut Link,
    feed: &mut Feed,
    buffer: &mut FrameBuffer,
    traffic: &mut Traffic,
) -> bool {
    loop {
        let Ok(cut) = feed.take(buffer) else {
            return false;
        };
        if traffic.count(cut) {
            return true;
        }
        match net::read_into(link, buffer.receiving(), READ_BYTES).await {
            Ok(0) | Err(_) => return false,
            Ok(read) => feed.received(read),
        }
    }
}

/// A link busy on a thread, back in the runtime.
fn into_runtime(
    (socket, state): (std::net::TcpStream, ReadState),
) -> Option<(tokio::net::TcpStream, ReadState)> {
    let handed = socket
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpStream::from_std(socket));
    match handed {
        Ok(socket) => Some((socket, state)),
        Err(error) => {
            tracing::warn!("closing the link from server {}: {error}", state.0.from);
            None
        }
    }
}

/// A link read by a blocking thread of the runtime (`spawn_blocking`: the
/// steps it runs spawn tasks and set timers on the runtime), and a handle
/// on its socket that ends the thread's read.
struct ThreadRead {
    /// The link and what was read once it turned busy; `None` once it
    /// ended.
    reading: tokio::task::JoinHandle<Option<(std::net::TcpStream, ReadState)>>,
    closer: Option<std::net::TcpStream>,
}

impl ThreadRead {
    /// Hands `socket` to a thread that reads it with blocking calls until
    /// it ends or turns busy; `None` (the link closed) when the socket
    /// cannot leave the runtime.
    fn start(socket: tokio::net::TcpStream, state: ReadState) -> Option<ThreadRead> {
        let blocking = socket.into_std().and_then(|socket| {
            socket.set_nonblocking(false)?;
            let closer = socket.try_clone()?;
            Ok((socket, closer))
        });
        let (socket, closer) = blocking
            .map_err(|error| {
                tracing::warn!("closing the link from server {}: {error}", state.0.from)
            })
            .ok()?;
        let span = tracing::Span::current();
        let reading = tokio::task::spawn_blocking(move || {
            let _span = span.enter();
            read_on_thread(socket, state)
        });
        Some(ThreadRead {
            reading,
            closer: Some(closer),
        })
    }

    /// Ends the thread's read at once: it sees the end of the stream.
    fn shut(&self) {
        if let Some(closer) = &self.closer {
            let _ = closer.shutdown(std::net::Shutdown::Both);
        }
    }

    /// Ends the thread's read and waits for the thread.
    async fn close(mut self) {
        self.shut();
        let _ = (&mut self.reading).await;
    }
}

impl Drop for ThreadRead {
    /// A link whose serving is dropped ends its thread's read too.
    fn drop(&mut self) {
        self.shut();
    }
}

/// The read loop of a link on a thread of its own: until it ends (`None`)
/// or turns busy.
fn read_on_thread(
    mut socket: std::net::TcpStream,
    (mut feed, mut buffer, mut traffic): ReadState,
) -> Option<(std::net::TcpStream, ReadState)> {
    loop {
        let cut = feed.take(&mut buffer).ok()?;
        if traffic.count(cut) {
            return Some((socket, (feed, buffer, traffic)));
        }
        match buffer.read_from(&mut socket, READ_BYTES) {
            Ok(0) | Err(_) => return None,
            Ok(read) => feed.received(read),
        }
    }
}

/// Turns a link's frames into steps of its streams: the messages of one
/// stream in one read are handed over in one step.
struct Feed {
    from: ServerId,
    server: Arc<ServerState>,
    max_frame: usize,
    batch: Vec<Msg>,
    batch_stream: Option<Arc<Stream>>,
}

impl Feed {
    fn new(from: ServerId, server: &Arc<ServerState>) -> Feed {
        Feed {
            from,
            server: Arc::clone(server),
            max_frame: server.config.peer_frame_bytes_max(),
            batch: Vec::new(),
            batch_stream: None,
        }
    }

    /// Cuts every whole frame in `buffer` and hands its messages to their
    /// streams; what it cut, or `Err` when the link must close.
    fn take(&mut self, buffer: &mut FrameBuffer) -> Result<Cut, ()> {
        let from = self.from;
        let mut cut = Cut::default();
        loop {
            match buffer.next_frame(self.max_frame) {
                Ok(Some(Frame::Peer { stream, message })) => {
                    cut.frames += 1;
                    if self.batch_stream.as_ref().is_some_and(|s| s.id != stream) {
                        self.hand_over();
                    }
                    if self.batch_stream.is_none() {
                        self.batch_stream = self.server.stream_by_id(stream);
                    }
                    if self.batch_stream.is_some() {
                        match wire::peer_msg(message) {
                            Ok(msg) => {
                                if let Msg::Replicate { entries } = &msg {
                                    cut.records += entries.len() as u64;
                                }
                                self.batch.push(msg);
                            }
                            Err(error) => {
                                tracing::warn!("closing the link from server {from}: {error}");
                                return Err(());
                            }
                        }
                    }
                }
                Ok(Some(_)) | Err(_) => {
                    tracing::warn!("closing the link from server {from}: unexpected frame");
                    return Err(());
                }
                Ok(None) => break,
            }
        }
        self.hand_over();
        Ok(cut)
    }

    /// The batch to its stream, in one step.
    fn hand_over(&mut self) {
        if let Some(done) = self.batch_stream.take() {
            done.on_peer_many(self.from, std::mem::take(&mut self.batch));
        }
    }

    /// Counts a change of ways (`stamplog_peer_links_handed`).
    fn handed(&self, to: HandedTo) {
        tracing::debug!("the link from server {} read by {to:?}", self.from);
        if let Some(metrics) = &self.server.metrics {
            let counter = match to {
                HandedTo::Thread => &metrics.peer_links_to_thread,
                HandedTo::Runtime => &metrics.peer_links_to_runtime,
            };
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn received(&self, read: usize) {
        if let Some(metrics) = &self.server.metrics {
            metrics
                .peer_bytes_in
                .fetch_add(read as u64, Ordering::Relaxed);
        }
    }
}

/// What reads a link after a change of ways.
#[derive(Debug, Clone, Copy)]
enum HandedTo {
    Thread,
    Runtime,
}

/// Reads between two looks at a link's traffic: at window 1, about a tenth
/// of a second of a link's reads.
const LOOK_READS: u32 = 128;

/// What one read brought: frames, and the records their `Replicate`s
/// carry.
#[derive(Debug, Default, Clone, Copy)]
struct Cut {
    frames: u64,
    records: u64,
}

/// A link's frames and records over its last reads, and which way it is
/// read.
#[derive(Debug)]
struct Traffic {
    /// Read by a thread of its own (else by the runtime).
    on_thread: bool,
    /// When it changes ways; `None` for a TLS link, which stays on the
    /// runtime.
    marks: Option<PeerReading>,
    reads: u32,
    seen: Cut,
}

impl Traffic {
    /// A plain link starts quiet, on a thread.
    fn new(plain: bool, marks: PeerReading) -> Traffic {
        Traffic {
            on_thread: plain,
            marks: plain.then_some(marks),
            reads: 0,
            seen: Cut::default(),
        }
    }

    /// Counts one read's `cut`; `true` when the link is to change ways (and
    /// `on_thread` then says which it takes). A look that found no record
    /// (a link of acks and `Progress`, whose hops no acknowledgement waits
    /// for under `one-hop-ack-client`) or many frames or records a read
    /// sends a link to the runtime; one of few frames and records, some
    /// records among them, to a thread.
    fn count(&mut self, cut: Cut) -> bool {
        let Some(marks) = self.marks else {
            return false;
        };
        self.reads += 1;
        self.seen.frames += cut.frames;
        self.seen.records += cut.records;
        if self.reads < LOOK_READS {
            return false;
        }
        let reads = f64::from(self.reads);
        let (frames, records) = (self.seen.frames as f64, self.seen.records as f64);
        let change = if self.on_thread {
            let busy = marks.busy_per_read * reads;
            records == 0.0 || frames > busy || records > busy
        } else {
            let quiet = marks.quiet_per_read * reads;
            records > 0.0 && frames < quiet && records < quiet
        };
        self.reads = 0;
        self.seen = Cut::default();
        self.on_thread ^= change;
        change
    }
}

/// A peer link listed as its peer's newest (`ServerState::peer_links`). A
/// peer dials one link to a server at a time, so a newer link from the
/// same peer ends this one: a link left half open (a partition, a host
/// gone without closing its sockets) holds its task and its connection
/// slot only until the peer dials again. Dropped, it takes itself off the
/// list (if still there: its `Notify` is its identity).
struct NewestPeerLink<'a> {
    server: &'a ServerState,
    from: ServerId,
    /// Notified when a newer link from the same peer is listed.
    superseded: Arc<Notify>,
}

impl<'a> NewestPeerLink<'a> {
    /// Lists a link as `from`'s newest, ending the one listed before.
    fn list(server: &'a ServerState, from: ServerId) -> Self {
        let superseded = Arc::new(Notify::new());
        let older = server
            .peer_links
            .lock()
            .expect("peer links lock")
            .insert(from, Arc::clone(&superseded));
        if let Some(older) = older {
            // A permit: the older link ends even if it is not waiting yet.
            older.notify_one();
        }
        NewestPeerLink {
            server,
            from,
            superseded,
        }
    }
}

impl Drop for NewestPeerLink<'_> {
    fn drop(&mut self) {
        let mut links = self.server.peer_links.lock().expect("peer links lock");
        if links
            .get(&self.from)
            .is_some_and(|listed| Arc::ptr_eq(listed, &self.superseded))
        {
            links.remove(&self.from);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `reads` reads of `frames` frames and `records` records each;
    /// the number of changes of ways.
    fn feed(traffic: &mut Traffic, reads: u32, frames: u64, records: u64) -> u32 {
        let cut = Cut { frames, records };
        (0..reads).filter(|_| traffic.count(cut)).count() as u32
    }

    /// A plain link starts on a thread; at window 1 (a `Replicate` of one
    /// record, then a `Commit`, a read each) it stays there; many frames or
    /// many records a read send it to the runtime at the end of a look, and
    /// it comes back once quiet; between the two marks it stays where it
    /// is.
    #[test]
    fn a_link_changes_ways_with_its_frames_and_records_per_read_and_not_back_and_forth() {
        let mut traffic = Traffic::new(true, PeerReading::default());
        assert!(traffic.on_thread);
        let window_1 = (0..10 * LOOK_READS).filter(|read| {
            let records = u64::from(read % 2 == 0);
            traffic.count(Cut { frames: 1, records })
        });
        assert_eq!(window_1.count(), 0);
        assert!(traffic.on_thread);
        // Many streams: many frames a read, at the end of the first look.
        assert_eq!(feed(&mut traffic, LOOK_READS - 1, 10, 10), 0);
        assert!(traffic.count(Cut {
            frames: 10,
            records: 10
        }));
        assert!(!traffic.on_thread);
        // In between the marks it stays, either way.
        assert_eq!(feed(&mut traffic, 10 * LOOK_READS, 2, 2), 0);
        assert!(!traffic.on_thread);
        // Quiet again: back to a thread at the end of one look.
        assert_eq!(feed(&mut traffic, LOOK_READS, 1, 1), 1);
        assert!(traffic.on_thread);
        assert_eq!(feed(&mut traffic, 10 * LOOK_READS, 2, 2), 0);
        // One stream at window 256: a frame a read, of a whole batch.
        assert_eq!(feed(&mut traffic, LOOK_READS, 1, 40), 1);
        assert!(!traffic.on_thread);
        // A look of mixed reads goes by its mean: 3 a read is not over 3.
        assert_eq!(feed(&mut traffic, LOOK_READS, 1, 1), 1);
        let mut mixed = (0..LOOK_READS).map(|read| {
            let n = if read % 2 == 0 { 1 } else { 5 };
            Cut {
                frames: n,
                records: n,
            }
        });
        assert!(!mixed.any(|cut| traffic.count(cut)));
        assert!(traffic.on_thread);
    }

    /// A link of acks and `Progress` alone (no record) goes to the runtime
    /// and stays there, whatever its frames a read; a TLS link never
    /// changes.
    #[test]
    fn a_link_without_records_and_a_tls_link_stay_on_the_runtime() {
        let mut acks = Traffic::new(true, PeerReading::default());
        assert_eq!(feed(&mut acks, LOOK_READS, 1, 0), 1);
        assert!(!acks.on_thread);
        assert_eq!(feed(&mut acks, 10 * LOOK_READS, 1, 0), 0);
        assert!(!acks.on_thread);

        let mut tls = Traffic::new(false, PeerReading::default());
        assert!(!tls.on_thread);
        assert_eq!(feed(&mut tls, 10 * LOOK_READS, 1, 1), 0);
        assert_eq!(feed(&mut tls, 10 * LOOK_READS, 20, 20), 0);
        assert!(!tls.on_thread);
    }
}
