//! The connections a client's publishers share: one per server.
//!
//! A [`PublisherLinks`] keeps one connection to each server any of its
//! publishers writes to, whatever the stream: a client writing 100 streams
//! over three servers has three connections, not 300. Its publishers'
//! frames for a server gather in that server's one [`Outbox`], so a
//! batch written to the socket carries many streams' messages, and a
//! server's acks for them come back in one read and are handed to each
//! publisher by stream and session (a server already routes a client's
//! answers to the connections that opened each stream). A publisher joins
//! the link of each of its replicas, opening its stream there, and leaves
//! once it is dropped and done; a link whose last publisher left closes.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use engine::replication::{Bytes, Msg, ServerId};
use net::{Chunk, SharedWriter};
use proto::{EventId, Frame};
use tokio::sync::Notify;

use super::{push_acks, PublisherConfig, Shared};
use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::link::{self, Connection, Ended, Session};

/// Bytes waiting for one server at most: past this (a server that stopped
/// reading) further frames are dropped, and the resend timer sends the
/// messages again. Well above a whole window of 1 KB messages (65,536 ×
/// about 1.1 KB framed), so nothing is dropped in ordinary running: a
/// dropped frame holds the low-water mark, and so the window, until its
/// resend.
pub(super) const OUTBOX_BYTES_MAX: usize = 256 * 1024 * 1024;

/// Capacity of the buffer a frame sent at once is encoded into: a submit
/// of a 1 KB message fits without growing it.
const FRAME_BYTES_GUESS: usize = 2048;

/// Bytes of answers one read takes.
const ANSWER_READ_BYTES: usize = 32 * 1024;

/// A publisher on a link: its stream and its session.
pub(super) type MemberKey = (u64, u64);

/// Connections to the servers, shared by the publishers made with them
/// (`Publisher::connect_over`): one per server, whatever the streams.
/// Cheap to clone; the clones share the connections. The client id, the
/// credentials and the connect timeout are the links', for every
/// publisher that uses them.
#[derive(Clone)]
pub struct PublisherLinks {
    pool: Arc<Pool>,
}

impl std::fmt::Debug for PublisherLinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublisherLinks")
            .field("client_id", &self.pool.client_id)
            .field("servers", &self.servers())
            .finish()
    }
}

struct Pool {
    client_id: u128,
    /// The sum of the windows of the publishers on one link, at most
    /// (`PublisherConfig::server_in_flight_max`).
    in_flight_max: usize,
    /// What every link is configured with, but for its address.
    config: ClientConfig,
    servers: Mutex<HashMap<ServerId, Arc<ServerLink>>>,
    /// The messages of every publisher on these links awaiting answers.
    in_flight: Arc<AtomicUsize>,
}

impl PublisherLinks {
    /// Links with `config`'s client id (random when `None`), credentials
    /// and connect timeout.
    pub fn new(config: &PublisherConfig) -> PublisherLinks {
        let mut links = ClientConfig::new(String::new());
        links.connect_timeout = config.connect_timeout;
        links.credentials = config.credentials.clone();
        PublisherLinks {
            pool: Arc::new(Pool {
                client_id: config.client_id.unwrap_or_else(proto::random_u128),
                in_flight_max: config.server_in_flight_max,
                config: links,
                servers: Mutex::default(),
                in_flight: Arc::default(),
            }),
        }
    }

    /// The client id in the event ids of every publisher on these links.
    pub fn client_id(&self) -> u128 {
        self.pool.client_id
    }

    /// How many servers the links reach now (one connection each, while
    /// it is up).
    pub fn servers(&self) -> usize {
        self.pool.lock().len()
    }

    /// The count of the messages of every publisher on these links that
    /// await their answers, which each publisher keeps up to date.
    pub(super) fn in_flight(&self) -> Arc<AtomicUsize> {
        Arc::clone(&self.pool.in_flight)
    }

    /// What a new link is configured with, but for its address.
    pub(super) fn config(&self) -> &ClientConfig {
        &self.pool.config
    }

    /// Joins `member` to the link to `server`, connecting first when there
    /// is none (that first connection must succeed: a wrong address is an
    /// error now, not an endless retry); returns the server's outbox.
    pub(super) async fn join(
        &self,
        server: ServerId,
        address: &str,
        member: &Arc<Shared>,
    ) -> Result<Arc<Outbox>, ClientError> {
        if let Some(outbox) = self.attach(server, address, member, None)? {
            return Ok(outbox);
        }
        let config = self.pool.config.to(address);
        let first = link::connect(&config, self.pool.client_id).await?;
        let attached = self.attach(server, address, member, Some(first))?;
        Ok(attached.expect("a link with its first connection is always made"))
    }

    /// Joins `member` to the link to `server`: the one there is, or else a
    /// new one served from `first`; `None` when there is neither.
    fn attach(
        &self,
        server: ServerId,
        address: &str,
        member: &Arc<Shared>,
        first: Option<Connection>,
    ) -> Result<Option<Arc<Outbox>>, ClientError> {
        let mut servers = self.pool.lock();
        if let Some(link) = servers.get(&server) {
            // Raced with another publisher's join: its connection serves.
            link.add(member, self.pool.in_flight_max)?;
            return Ok(Some(Arc::clone(&link.outbox)));
        }
        let Some(first) = first else {
            return Ok(None);
        };
        Ok(Some(self.start(
            &mut servers,
            server,
            address,
            member,
            Some(first),
        )?))
    }

    /// Joins `member` to the link to `server`, starting one that connects
    /// in the background when there is none (a server a failover brought
    /// in).
    pub(super) fn attach_later(
        &self,
        server: ServerId,
        address: &str,
        member: &Arc<Shared>,
    ) -> Result<Arc<Outbox>, ClientError> {
        let mut servers = self.pool.lock();
        if let Some(link) = servers.get(&server) {
            link.add(member, self.pool.in_flight_max)?;
            return Ok(Arc::clone(&link.outbox));
        }
        self.start(&mut servers, server, address, member, None)
    }

    /// A new link to `server` with `member` on it, its task started.
    fn start(
        &self,
        servers: &mut HashMap<ServerId, Arc<ServerLink>>,
        server: ServerId,
        address: &str,
        member: &Arc<Shared>,
        first: Option<Connection>,
    ) -> Result<Arc<Outbox>, ClientError> {
        let link = Arc::new(ServerLink {
            server,
            outbox: Arc::default(),
            members: Mutex::default(),
            changed: Notify::new(),
        });
        link.add(member, self.pool.in_flight_max)?;
        servers.insert(server, Arc::clone(&link));
        let outbox = Arc::clone(&link.outbox);
        let config = self.pool.config.to(address);
        let client = self.pool.client_id;
        tokio::spawn(async move {
            let mut session = LinkSession {
                link,
                client,
                writing: Vec::new(),
            };
            link::keep_connected(&config, client, first, &mut session).await;
        });
        Ok(outbox)
    }

    /// Takes `key` off the links to `servers`; a link left with no
    /// publisher closes.
    pub(super) fn leave(&self, servers: impl IntoIterator<Item = ServerId>, key: MemberKey) {
        let mut links = self.pool.lock();
        for server in servers {
            let Some(link) = links.get(&server) else {
                continue;
            };
            let empty = {
                let mut members = link.lock();
                members.by_key.remove(&key);
                members.by_key.is_empty()
            };
            if empty {
                // Under the pool's lock: a publisher joining later makes a
                // new link.
                link.changed.notify_one();
                links.remove(&server);
            }
        }
    }
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, HashMap<ServerId, Arc<ServerLink>>> {
        self.servers.lock().expect("links lock")
    }
}

/// The link to one server: its outbox and the publishers on it.
struct ServerLink {
    server: ServerId,
    outbox: Arc<Outbox>,
    members: Mutex<Members>,
    /// The last publisher left: the link's task ends.
    changed: Notify,
}

#[derive(Default)]
struct Members {
    by_key: HashMap<MemberKey, Arc<Shared>>,
    /// A connection is up (its streams opened).
    up: bool,
}

impl ServerLink {
    fn lock(&self) -> MutexGuard<'_, Members> {
        self.members.lock().expect("link members lock")
    }

    /// Puts `member` on the link; while a connection is up, its stream is
    /// opened there at once, so the server routes its answers here.
    /// Refused when the stream and session has a publisher here already,
    /// or when the windows of the publishers here would pass
    /// `in_flight_max` (a publisher alone is never refused).
    fn add(&self, member: &Arc<Shared>, in_flight_max: usize) -> Result<(), ClientError> {
        let mut members = self.lock();
        let key = member.key();
        if members.by_key.contains_key(&key) {
            return Err(ClientError::Config(format!(
                "stream {} already has a publisher with session {} on these links: give each publisher of a stream a session of its own",
                member.name, key.1
            )));
        }
        let windows: usize = members.by_key.values().map(|m| m.window_size).sum();
        if !members.by_key.is_empty() && windows + member.window_size > in_flight_max {
            return Err(ClientError::Config(format!(
                "a publisher of stream {} with a window of {} would give the publishers on these links {} messages in flight to server {}, past the {in_flight_max} one connection may have there (PublisherConfig::server_in_flight_max; the server's in_flight_per_connection_max): give the publishers smaller windows, or make more links",
                member.name,
                member.window_size,
                windows + member.window_size,
                self.server
            )));
        }
        members.by_key.insert(key, Arc::clone(member));
        if members.up {
            member.set_link(self.server, true);
            let open = open_stream(&member.name);
            self.outbox.push(true, |bytes| {
                bytes.extend_from_slice(&open);
                None
            });
        }
        Ok(())
    }

    fn is_empty(&self) -> bool {
        self.lock().by_key.is_empty()
    }
}

/// `OpenStream` for `name`: tells the server that the connection is the
/// stream's, so the client's answers of that stream come here. The
/// server's answer is not needed.
fn open_stream(name: &str) -> Vec<u8> {
    Frame::OpenStream {
        request: 0,
        name: name.to_string(),
    }
    .to_bytes()
}

/// The way to one server: the bytes waiting for its link task, the
/// wake-up of that task, and the connection's writer while the link is up.
#[derive(Default)]
pub(super) struct Outbox {
    state: Mutex<OutboxState>,
    ready: Notify,
}

#[derive(Default)]
struct OutboxState {
    writer: Option<Arc<SharedWriter>>,
    /// Encoded frames the link task has not handed to the writer yet, in
    /// order: `parts` first, then `waiting`.
    waiting: Vec<u8>,
    /// What waited before a frame's large payload, and the payloads
    /// themselves, sent as they are (`net::Chunk::Parts`).
    parts: Vec<Bytes>,
    /// Bytes of `parts`.
    parts_bytes: usize,
    /// The link task is writing what it took from `waiting`: a frame sent
    /// at once now would overtake it.
    handing_over: bool,
}

impl Outbox {
    /// Sends what `encode` writes, and after it the bytes it returns, if
    /// any (a large payload, sent as it is rather than copied). When
    /// `now`, the link is up and nothing waits for the link task, the
    /// frame goes to the writer from this thread (written at once if the
    /// connection is idle); otherwise it is appended to what waits, and
    /// the link task writes it all in one go. Past `OUTBOX_BYTES_MAX`
    /// bytes waiting the frame is dropped: the resend timer covers it.
    pub(super) fn push(&self, now: bool, encode: impl FnOnce(&mut Vec<u8>) -> Option<Bytes>) {
        let mut guard = self.state.lock().expect("outbox lock");
        let state = &mut *guard;
        let was_empty = state.waiting.is_empty() && state.parts.is_empty();
        if now && was_empty && !state.handing_over {
            if let Some(writer) = &state.writer {
                let mut bytes = Vec::with_capacity(FRAME_BYTES_GUESS);
                let _ = match encode(&mut bytes) {
                    None => writer.try_send(bytes, None),
                    Some(tail) => writer.try_send(Chunk::parts([Bytes::from(bytes), tail]), None),
                };
                return;
            }
        }
        if state.waiting.len() + state.parts_bytes >= OUTBOX_BYTES_MAX {
            return;
        }
        if let Some(tail) = encode(&mut state.waiting) {
            let head = Bytes::from(std::mem::take(&mut state.waiting));
            state.parts_bytes += head.len() + tail.len();
            state.parts.extend([head, tail]);
        }
        drop(guard);
        if was_empty {
            self.ready.notify_one();
        }
    }

    /// The link task's part: swaps what waits into `writing` (the buffer
    /// it keeps, so neither is allocated again) and writes it, outside the
    /// lock, so a sender never waits for the write.
    fn hand_over(&self, writing: &mut Vec<u8>) {
        let (writer, mut parts) = {
            let mut guard = self.state.lock().expect("outbox lock");
            let state = &mut *guard;
            let Some(writer) = state.writer.clone() else {
                return;
            };
            if state.waiting.is_empty() && state.parts.is_empty() {
                return;
            }
            writing.clear();
            std::mem::swap(writing, &mut state.waiting);
            state.parts_bytes = 0;
            state.handing_over = true;
            (writer, std::mem::take(&mut state.parts))
        };
        // Refused, the frames are lost with the connection or the full
        // queue; the resend timer covers them.
        let _ = match parts.is_empty() {
            true => writer.send_gathered(writing),
            false => {
                parts.push(Bytes::from(std::mem::take(writing)));
                writer.send_gathered_chunk(Chunk::parts(parts))
            }
        };
        self.state.lock().expect("outbox lock").handing_over = false;
    }

    /// The link is up on `writer`: what waited goes first.
    fn up(&self, writer: &Arc<SharedWriter>, writing: &mut Vec<u8>) {
        self.state.lock().expect("outbox lock").writer = Some(Arc::clone(writer));
        self.hand_over(writing);
    }

    fn down(&self) {
        self.state.lock().expect("outbox lock").writer = None;
    }
}

/// A link to one server, as a session of the client's connection loop
/// (`link::keep_connected`): writes its outbox and hands the answers it
/// reads to the publishers they are for, until the last one leaves.
struct LinkSession {
    link: Arc<ServerLink>,
    /// The client id the answers' event ids carry.
    client: u128,
    /// The buffer the link writes from, swapped with the outbox's.
    writing: Vec<u8>,
}

impl LinkSession {
    /// Marks the link up or down for every publisher on it; returns the
    /// names of their streams (none when the last one has left).
    fn set_up(&self, up: bool) -> Vec<String> {
        let mut members = self.link.lock();
        members.up = up;
        let mut names: Vec<String> = Vec::with_capacity(members.by_key.len());
        for member in members.by_key.values() {
            member.set_link(self.link.server, up);
            names.push(member.name.clone());
        }
        names.sort_unstable();
        names.dedup();
        names
    }
}

impl Session for LinkSession {
    async fn serve(&mut self, connection: Connection) -> Ended {
        let Connection {
            mut reader,
            writer,
            mut buffer,
            ..
        } = connection;
        let writer =
            Arc::new(SharedWriter::new(writer, usize::MAX).with_queued_bytes_max(OUTBOX_BYTES_MAX));
        // Opening each stream first tells the server that this connection
        // is the stream's: the client's answers of that stream come here.
        let names = self.set_up(true);
        if names.is_empty() {
            return Ended::Closed;
        }
        for name in names {
            if writer.try_send(open_stream(&name), None).is_err() {
                return Ended::Broken;
            }
        }
        let outbox = Arc::clone(&self.link.outbox);
        outbox.up(&writer, &mut self.writing);
        let flusher = writer.run();
        tokio::pin!(flusher);
        loop {
            tokio::select! {
                // It ends only when the socket fails: what was queued is
                // lost with the connection, and the resend timer covers it.
                _ = &mut flusher => return Ended::Broken,
                _ = outbox.ready.notified() => outbox.hand_over(&mut self.writing),
                read = net::read_into(&mut reader, buffer.receiving(), ANSWER_READ_BYTES) => {
                    if !matches!(read, Ok(count) if count > 0) {
                        return Ended::Broken;
                    }
                    for (member, answers) in self.decode(&mut buffer) {
                        member.answers(answers).await;
                    }
                }
                _ = self.link.changed.notified() => {
                    if self.link.is_empty() {
                        outbox.down();
                        return Ended::Closed;
                    }
                }
            }
        }
    }

    async fn wait(&mut self) -> bool {
        self.link.changed.notified().await;
        !self.link.is_empty()
    }

    fn down(&mut self) {
        self.link.outbox.down();
        self.set_up(false);
    }
}

impl LinkSession {
    /// The answers in what the link has read so far, by the publisher
    /// they are for, each publisher's in the order they came. A frame of
    /// a stream and session no publisher here has is dropped (one that
    /// left); a checkpoint goes to every session of its stream.
    fn decode(&self, buffer: &mut proto::FrameBuffer) -> Vec<Batch> {
        let members = self.link.lock();
        let mut sorted = Sorted::default();
        while let Ok(Some(frame)) = buffer.next_frame(64 * 1024 * 1024) {
            self.sort(frame, &members, &mut sorted);
        }
        sorted.batches
    }

    /// Puts one answer with the publisher's it is for.
    fn sort(&self, frame: Frame, members: &Members, sorted: &mut Sorted) {
        let (server, client) = (self.link.server, self.client);
        match frame {
            Frame::Checkpointed {
                stream,
                version,
                flags,
            } => {
                let msg = Msg::Checkpointed {
                    through: version,
                    resend: flags & proto::frame::CHECKPOINTED_FLAG_RESEND != 0,
                };
                sorted.for_every_session(members, stream, (server, msg));
            }
            Frame::Stamped {
                stream,
                session,
                sequence,
                version,
                epoch,
                flags,
            } => {
                let Some(answers) = sorted.answers(members, (stream, session)) else {
                    return;
                };
                let msg = Msg::Stamped {
                    event: EventId {
                        client,
                        session,
                        sequence,
                    },
                    version,
                    epoch,
                    duplicate: flags & proto::frame::ACKED_FLAG_DUPLICATE != 0,
                };
                answers.push((server, msg));
            }
            Frame::Refused {
                stream,
                session,
                sequence,
                code,
                message,
            } => {
                let Some(member) = members.by_key.get(&(stream, session)) else {
                    return;
                };
                let Some(refusal) = member.refusal(sequence, code, message) else {
                    return;
                };
                let event = EventId {
                    client,
                    session,
                    sequence,
                };
                if let Some(answers) = sorted.answers(members, (stream, session)) {
                    answers.push((server, Msg::Refused { event, refusal }));
                }
            }
            Frame::Acked {
                stream, session, ..
            } => {
                if let Some(answers) = sorted.answers(members, (stream, session)) {
                    push_acks(client, frame, answers);
                }
            }
            _ => {}
        }
    }
}

/// A publisher and the answers a read brought it.
type Batch = (Arc<Shared>, Vec<(ServerId, Msg)>);

/// Answers sorted by the publisher they are for.
#[derive(Default)]
struct Sorted {
    batches: Vec<Batch>,
    index: HashMap<MemberKey, usize>,
    /// The key of the answer before, and where its batch is: a run of one
    /// publisher's answers (a lone stream's, always) needs no hashing.
    last: Option<(MemberKey, usize)>,
}

impl Sorted {
    /// `answer` for every publisher of `stream` on the link.
    fn for_every_session(&mut self, members: &Members, stream: u64, answer: (ServerId, Msg)) {
        for key in members.by_key.keys().filter(|(of, _)| *of == stream) {
            if let Some(answers) = self.answers(members, *key) {
                answers.push(answer.clone());
            }
        }
    }

    /// The answers gathered for `key`'s publisher, if it is on the link.
    fn answers(&mut self, members: &Members, key: MemberKey) -> Option<&mut Vec<(ServerId, Msg)>> {
        let at = match self.last.filter(|(last, _)| *last == key) {
            Some((_, at)) => at,
            None => match self.index.get(&key) {
                Some(at) => *at,
                None => {
                    let member = members.by_key.get(&key)?;
                    self.batches.push((Arc::clone(member), Vec::new()));
                    self.index.insert(key, self.batches.len() - 1);
                    self.batches.len() - 1
                }
            },
        };
        self.last = Some((key, at));
        Some(&mut self.batches[at].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::publisher::tests::shared_on;
    use proto::ErrorCode;

    fn acked(stream: u64, session: u64, sequence: u64) -> Frame {
        Frame::Acked {
            stream,
            server: 1,
            session,
            sequence,
            version: 10 + sequence,
            epoch: 1,
            flags: 0,
            hint: 0,
            more: 0,
        }
    }

    /// One connection carries the answers of every publisher of the client
    /// on that server, and sessions of one stream number their messages
    /// alike: each publisher gets its own answers, in the order they came,
    /// and nothing of a stream or session no publisher here has.
    #[test]
    fn a_read_is_sorted_by_stream_and_session_and_nobody_gets_anothers_answers() {
        let a = Arc::new(shared_on(3, 1, 4));
        let b = Arc::new(shared_on(4, 1, 4));
        let c = Arc::new(shared_on(3, 2, 4));
        let link = Arc::new(ServerLink {
            server: 1,
            outbox: Arc::default(),
            members: Mutex::default(),
            changed: Notify::new(),
        });
        for member in [&a, &b, &c] {
            link.add(member, 4096).unwrap();
        }
        let again = link.add(&Arc::new(shared_on(4, 1, 4)), 4096);
        assert!(matches!(again, Err(ClientError::Config(_))), "{again:?}");
        let session = LinkSession {
            link,
            client: 7,
            writing: Vec::new(),
        };
        let frames = [
            acked(3, 1, 1),
            acked(4, 1, 1),
            Frame::Stamped {
                stream: 5,
                session: 1,
                sequence: 1,
                version: 9,
                epoch: 1,
                flags: 0,
            },
            Frame::Refused {
                stream: 3,
                session: 2,
                sequence: 1,
                code: ErrorCode::LogFailed,
                message: "for c".into(),
            },
            Frame::Checkpointed {
                stream: 3,
                version: 9,
                flags: 0,
            },
            acked(3, 1, 2),
            acked(4, 2, 1),
        ];
        let mut buffer = proto::FrameBuffer::new();
        for frame in &frames {
            buffer.extend(&frame.to_bytes());
        }
        let batches = session.decode(&mut buffer);
        assert_eq!(batches.len(), 3);
        let of = |member: &Arc<Shared>| {
            let found = batches.iter().find(|(m, _)| Arc::ptr_eq(m, member));
            found.map(|(_, answers)| answers.clone()).unwrap()
        };
        let sequence_of = |msg: &Msg| match msg {
            Msg::Ack { event, count, .. } => {
                assert_eq!((event.client, *count), (7, 1));
                Some((event.session, event.sequence))
            }
            _ => None,
        };
        let answers = of(&a);
        assert_eq!(answers.len(), 3, "{answers:?}");
        assert_eq!(sequence_of(&answers[0].1), Some((1, 1)));
        assert!(matches!(answers[1].1, Msg::Checkpointed { through: 9, .. }));
        assert_eq!(sequence_of(&answers[2].1), Some((1, 2)));
        let answers = of(&b);
        assert_eq!(answers.len(), 1, "{answers:?}");
        assert_eq!(sequence_of(&answers[0].1), Some((1, 1)));
        let answers = of(&c);
        assert_eq!(answers.len(), 2, "{answers:?}");
        assert!(matches!(answers[0].1, Msg::Refused { .. }));
        assert!(matches!(answers[1].1, Msg::Checkpointed { through: 9, .. }));
        assert_eq!(c.refusals.lock().unwrap().get(&1).unwrap(), "for c");
        assert!(a.refusals.lock().unwrap().is_empty());
    }

    fn empty_link() -> ServerLink {
        ServerLink {
            server: 2,
            outbox: Arc::default(),
            members: Mutex::default(),
            changed: Notify::new(),
        }
    }

    /// A server refuses a connection's writes past its in-flight bound as
    /// `Busy`: publishers whose windows together would pass it on one link
    /// are refused when they join, saying why; one alone may have any
    /// window, as with links of its own.
    #[test]
    fn publishers_whose_windows_pass_a_servers_in_flight_bound_are_refused_when_they_join() {
        let link = empty_link();
        link.add(&Arc::new(shared_on(1, 1, 4)), 10).unwrap();
        link.add(&Arc::new(shared_on(2, 1, 6)), 10).unwrap();
        let refused = link.add(&Arc::new(shared_on(3, 1, 1)), 10);
        let Err(ClientError::Config(message)) = refused else {
            panic!("{refused:?}");
        };
        assert!(
            message.contains("11 messages in flight to server 2")
                && message.contains("past the 10"),
            "{message}"
        );
        assert_eq!(link.lock().by_key.len(), 2);
        let alone = empty_link();
        alone.add(&Arc::new(shared_on(1, 1, 64)), 10).unwrap();
    }
}
