//! The wiring between the replication state machines and the network: the
//! [`Router`] carries what a stream's `Replica` sends to clients and peers,
//! peer links carry replication messages between servers, and the
//! conversions between `engine::replication::Msg` and frames live here.
//!
//! Each pair of servers uses two TCP connections, one per direction: a
//! server dials every peer and only writes to that link; what it receives
//! comes in on the links its peers dialled. A link's queue is bounded
//! (`peer_queue_max`): the connection writer's queue while the link is up,
//! its backlog while it is down. A message that finds it full, or a
//! connection failing under it, is dropped and counted: the protocols
//! repair loss (gap requests, heartbeats, client retries), so dropping
//! never breaks an invariant.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use engine::replication::{Binding, Bytes, Content, Entry, HybridMode, Msg, ServerId, ACK_RUN_MAX};
use net::{Refused, SharedWriter};
use proto::{EventId, Frame, PeerMessage, Record, WireBinding};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};

use crate::config::ClusterConfig;
use crate::connection::Outgoing;

/// What a stream tells the control plane (see `membership`).
#[derive(Debug)]
pub(crate) enum ControlEvent {
    /// The stream's new primary will stamp from `first_version`.
    EpochStarted {
        stream: String,
        epoch: u64,
        first_version: u64,
        members: Vec<ServerId>,
    },
    /// A replica caught up with the primary of `epoch`; `join_view` is
    /// the incarnation of its newest link here.
    InSync {
        stream: String,
        epoch: u64,
        server: ServerId,
        join_view: Option<u64>,
    },
}

/// Counters of what the router dropped.
#[derive(Default)]
pub struct RouterMetrics {
    pub peer_dropped: AtomicU64,
    pub client_dropped: AtomicU64,
    pub peer_sent: AtomicU64,
}

/// A peer's id, address and link, before the link's task runs.
type UnstartedLink = (ServerId, String, Arc<PeerLink>);

/// The way to one peer: the writer of its connection while the link is up,
/// and the frames queued while it is down (written first once it is up).
/// A frame sent while the link is up and idle is written at once by the
/// thread that sends it (`net::SharedWriter`).
pub(crate) struct PeerLink {
    state: Mutex<PeerLinkState>,
    /// Frames the backlog, and the writer's queue, hold at most.
    queue_max: usize,
}

#[derive(Default)]
struct PeerLinkState {
    writer: Option<Arc<SharedWriter>>,
    backlog: std::collections::VecDeque<Vec<u8>>,
}

impl PeerLink {
    fn new(queue_max: usize) -> Arc<PeerLink> {
        Arc::new(PeerLink {
            state: Mutex::default(),
            queue_max,
        })
    }

    /// Sends or queues `frame`; `false` when it was dropped (the queue is
    /// full, or the connection failed under it).
    fn send(&self, frame: Vec<u8>) -> bool {
        let mut state = self.state.lock().expect("link lock");
        match &state.writer {
            Some(writer) => writer.try_send(frame, None).is_ok(),
            None if state.backlog.len() < self.queue_max => {
                state.backlog.push_back(frame);
                true
            }
            None => false,
        }
    }

    /// The link is up on `writer`: what was queued meanwhile goes first.
    fn up(&self, writer: &Arc<SharedWriter>) {
        let mut state = self.state.lock().expect("link lock");
        for frame in state.backlog.drain(..) {
            if let Err(Refused::Closed) = writer.try_queue(frame, None) {
                break;
            }
        }
        state.writer = Some(Arc::clone(writer));
    }

    fn down(&self) {
        self.state.lock().expect("link lock").writer = None;
    }
}

/// One connection of a client: its number and its way to the socket.
type ClientConnection = (u64, Arc<Outgoing>);

pub struct Router {
    pub me: ServerId,
    /// Each peer's link queue: the configured peers, and servers that
    /// joined later (learned from the control plane's members).
    peers: RwLock<HashMap<ServerId, Arc<PeerLink>>>,
    /// Each peer's link until its link task starts.
    unstarted_links: Mutex<Vec<UnstartedLink>>,
    /// Set once the links run: a peer added later gets its task at once.
    links_stop: Mutex<Option<watch::Receiver<bool>>>,
    queue_max: usize,
    /// The incarnation each peer's newest inbound link announced.
    peer_incarnations: Mutex<HashMap<ServerId, u64>>,
    /// Each connected client's connections: (connection, note sender).
    clients: Mutex<HashMap<u128, Vec<ClientConnection>>>,
    next_connection: AtomicU64,
    pub metrics: RouterMetrics,
    /// The view in which this process joined the cluster (0 before it
    /// has): links announce it in `PeerHello`.
    incarnation: Arc<AtomicU64>,
    /// Stream events for the control plane; at most a few per placement
    /// change, so the queue needs no bound of its own.
    events: mpsc::UnboundedSender<ControlEvent>,
    events_receiver: Mutex<Option<mpsc::UnboundedReceiver<ControlEvent>>>,
}

impl Router {
    pub fn new(cluster: &ClusterConfig, queue_max: usize) -> Router {
        let mut peers = HashMap::new();
        let mut receivers = Vec::new();
        let queue_max = queue_max.max(1);
        for peer in &cluster.peers {
            let link = PeerLink::new(queue_max);
            peers.insert(peer.id, Arc::clone(&link));
            receivers.push((peer.id, peer.address.clone(), link));
        }
        let (events, events_receiver) = mpsc::unbounded_channel();
        Router {
            me: cluster.me,
            peers: RwLock::new(peers),
            unstarted_links: Mutex::new(receivers),
            links_stop: Mutex::new(None),
            queue_max,
            peer_incarnations: Mutex::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            next_connection: AtomicU64::new(1),
            metrics: RouterMetrics::default(),
            incarnation: Arc::new(AtomicU64::new(0)),
            events,
            events_receiver: Mutex::new(Some(events_receiver)),
        }
    }

    pub(crate) fn set_incarnation(&self, view: u64) {
        self.incarnation.store(view, Ordering::Release);
    }

    pub fn incarnation(&self) -> u64 {
        self.incarnation.load(Ordering::Acquire)
    }

    pub(crate) fn control_event(&self, event: ControlEvent) {
        let _ = self.events.send(event);
    }

    /// The receiving end of the control events (once).
    pub(crate) fn take_events(&self) -> Option<mpsc::UnboundedReceiver<ControlEvent>> {
        self.events_receiver.lock().expect("router lock").take()
    }

    /// Starts one link task per peer (once); each ends when `stop` fires.
    pub(crate) fn start_links(&self, stop: watch::Receiver<bool>) {
        let receivers = {
            let mut started = self.links_stop.lock().expect("router lock");
            *started = Some(stop.clone());
            std::mem::take(&mut *self.unstarted_links.lock().expect("router lock"))
        };
        for (id, address, link) in receivers {
            self.spawn_link(id, address, link, stop.clone());
        }
    }

    fn spawn_link(
        &self,
        id: ServerId,
        address: String,
        link: Arc<PeerLink>,
        stop: watch::Receiver<bool>,
    ) {
        let incarnation = Arc::clone(&self.incarnation);
        tokio::spawn(run_link(self.me, incarnation, id, address, link, stop));
    }

    /// A peer's link to this server opened, announcing the process's
    /// incarnation.
    pub(crate) fn note_peer_incarnation(&self, id: ServerId, incarnation: u64) {
        self.peer_incarnations
            .lock()
            .expect("router lock")
            .insert(id, incarnation);
    }

    /// The incarnation of the newest link `id` opened to this server.
    pub(crate) fn peer_incarnation(&self, id: ServerId) -> Option<u64> {
        self.peer_incarnations
            .lock()
            .expect("router lock")
            .get(&id)
            .copied()
    }

    /// Whether `id` has a link (a configured peer, or one learned since).
    pub(crate) fn knows_peer(&self, id: ServerId) -> bool {
        self.peers.read().expect("router lock").contains_key(&id)
    }

    /// A server that joined the cluster without being in this server's
    /// configuration: it gets a link like a configured peer. Nothing
    /// happens for a peer already known or for this server.
    pub(crate) fn add_peer(&self, id: ServerId, address: &str) {
        if id == self.me || self.knows_peer(id) {
            return;
        }
        let link = PeerLink::new(self.queue_max);
        let mut peers = self.peers.write().expect("router lock");
        if peers.contains_key(&id) {
            return;
        }
        peers.insert(id, Arc::clone(&link));
        drop(peers);
        let started = self.links_stop.lock().expect("router lock").clone();
        match started {
            Some(stop) => self.spawn_link(id, address.to_string(), link, stop),
            None => self.unstarted_links.lock().expect("router lock").push((
                id,
                address.to_string(),
                link,
            )),
        }
    }

    /// Sends a replication message to a peer: written by this thread when
    /// the link is up and idle, queued otherwise.
    pub(crate) fn send_peer(&self, to: ServerId, stream: u64, msg: Msg) {
        let peers = self.peers.read().expect("router lock");
        let Some(link) = peers.get(&to) else {
            return;
        };
        let frame = match msg {
            // The records go straight into the frame: one copy.
            Msg::Replicate { entries } => replicate_frame(stream, &entries),
            other => match peer_message(other) {
                Some(message) => Frame::Peer { stream, message }.to_bytes(),
                None => return,
            },
        };
        if link.send(frame) {
            self.metrics.peer_sent.fetch_add(1, Ordering::Relaxed);
        } else {
            self.metrics.peer_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The frames queued for a peer whose link has not started, for tests.
    #[cfg(test)]
    pub(crate) fn take_queued(&self, to: ServerId) -> Vec<Vec<u8>> {
        let link = self.peers.read().expect("router lock").get(&to).cloned();
        link.map(|link| {
            let mut state = link.state.lock().expect("link lock");
            state.backlog.drain(..).collect()
        })
        .unwrap_or_default()
    }

    /// Registers a client connection; returns its handle for `unregister`.
    pub(crate) fn register(&self, client: u128, outgoing: Arc<Outgoing>) -> u64 {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        self.clients
            .lock()
            .expect("router lock")
            .entry(client)
            .or_default()
            .push((id, outgoing));
        id
    }

    pub(crate) fn unregister(&self, client: u128, connection: u64) {
        let mut clients = self.clients.lock().expect("router lock");
        if let Some(list) = clients.get_mut(&client) {
            list.retain(|(id, _)| *id != connection);
            if list.is_empty() {
                clients.remove(&client);
            }
        }
    }

    /// Hands messages to every connection of the client, on this thread (a
    /// client that is not connected gets nothing: it will retry).
    pub(crate) fn send_client(&self, client: u128, stream: u64, msgs: Vec<Msg>) {
        // Delivered outside the router's lock: a delivery may write.
        let connections: Vec<Arc<Outgoing>> = {
            let clients = self.clients.lock().expect("router lock");
            clients
                .get(&client)
                .map(|list| list.iter().map(|(_, o)| Arc::clone(o)).collect())
                .unwrap_or_default()
        };
        let count = msgs.len() as u64;
        let dropped = match connections.split_last() {
            None => 1,
            Some((last, others)) => {
                let mut dropped = 0;
                for outgoing in others {
                    dropped += u64::from(!outgoing.deliver(stream, msgs.clone()));
                }
                dropped + u64::from(!last.deliver(stream, msgs))
            }
        };
        if dropped > 0 {
            self.metrics
                .client_dropped
                .fetch_add(dropped * count, Ordering::Relaxed);
        }
    }

    /// Tells every client connection that a stream's log failed.
    pub(crate) fn broadcast_failure(&self, stream: u64, failure: Arc<str>) {
        let connections: Vec<Arc<Outgoing>> = {
            let clients = self.clients.lock().expect("router lock");
            clients
                .values()
                .flatten()
                .map(|(_, o)| Arc::clone(o))
                .collect()
        };
        for outgoing in connections {
            outgoing.fail_stream(stream, &failure);
        }
    }
}

/// Keeps a connection to one peer and runs its writer's flusher,
/// reconnecting with backoff. Frames sent while the link is down wait in its
/// bounded backlog; the protocols resend what matters.
async fn run_link(
    me: ServerId,
    incarnation: Arc<AtomicU64>,
    peer: ServerId,
    address: String,
    link: Arc<PeerLink>,
    mut stop: watch::Receiver<bool>,
) {
    let mut delay = Duration::from_millis(10);
    loop {
        let connected = tokio::select! {
            connected = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(&address)) => connected,
            _ = stop.wait_for(|s| *s) => return,
        };
        let mut socket = match connected {
            Ok(Ok(socket)) => socket,
            _ => {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = stop.wait_for(|s| *s) => return,
                }
                delay = (delay * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        delay = Duration::from_millis(10);
        let _ = socket.set_nodelay(true);
        let hello = Frame::PeerHello {
            version: proto::PROTOCOL_VERSION,
            from: me,
            incarnation: incarnation.load(Ordering::Acquire),
        };
        if socket.write_all(&hello.to_bytes()).await.is_err() {
            continue;
        }
        // Nothing comes back on a link; the read half only keeps it open.
        let (_read, write) = socket.into_split();
        let writer = Arc::new(SharedWriter::new(write, link.queue_max));
        link.up(&writer);
        tokio::select! {
            _ = writer.run() => {}
            _ = stop.wait_for(|s| *s) => {
                link.down();
                return;
            }
        }
        // What was queued is lost with the connection; the protocols
        // repair it.
        link.down();
        eprintln!("stamplog: link to server {peer} at {address} broke; reconnecting");
    }
}

/// A `Peer` frame carrying `Replicate` of `entries`, laid out as
/// `Frame::encode` would lay it out.
fn replicate_frame(stream: u64, entries: &[Entry]) -> Vec<u8> {
    let records: usize = entries.iter().map(|e| e.bytes.len()).sum();
    let mut frame = Vec::with_capacity(proto::FRAME_HEADER_LEN + 8 + 1 + 4 + records);
    Frame::Peer {
        stream,
        message: PeerMessage::Replicate {
            count: entries.len() as u32,
            records: Vec::new(),
        },
    }
    .encode(&mut frame);
    for entry in entries {
        frame.extend_from_slice(&entry.bytes);
    }
    let body = (frame.len() - proto::FRAME_HEADER_LEN) as u32;
    frame[..4].copy_from_slice(&body.to_le_bytes());
    frame
}

fn wire_binding(binding: &Binding) -> WireBinding {
    WireBinding {
        version: binding.version,
        epoch: binding.epoch,
        client: binding.event.client,
        session: binding.event.session,
        sequence: binding.event.sequence,
        low_water: binding.low_water,
        flags: binding.flags,
        crc: binding.crc,
    }
}

/// A server-to-server `Msg` as a frame body; `None` for client messages.
fn peer_message(msg: Msg) -> Option<PeerMessage> {
    Some(match msg {
        Msg::Replicate { entries } => {
            let bytes: usize = entries.iter().map(|e| e.bytes.len()).sum();
            let mut records = Vec::with_capacity(bytes);
            for entry in &entries {
                records.extend_from_slice(&entry.bytes);
            }
            PeerMessage::Replicate {
                count: entries.len() as u32,
                records,
            }
        }
        Msg::Bind { bindings } => PeerMessage::Bind {
            bindings: bindings.iter().map(wire_binding).collect(),
        },
        Msg::Progress { logged, last } => PeerMessage::Progress { logged, last },
        Msg::Commit { committed, last } => PeerMessage::Commit { committed, last },
        Msg::Need { from, to } => PeerMessage::Need { from, to },
        Msg::Probe => PeerMessage::Probe,
        Msg::Checkpoint { through, state } => PeerMessage::Checkpoint {
            through,
            state: state.to_vec(),
        },
        Msg::Reack { event, version } => PeerMessage::Reack {
            client: event.client,
            session: event.session,
            sequence: event.sequence,
            version,
        },
        _ => return None,
    })
}

/// A peer frame body as a `Msg` (records were checked when decoded).
pub(crate) fn peer_msg(message: PeerMessage) -> Msg {
    match message {
        PeerMessage::Replicate { records, .. } => Msg::Replicate {
            // The frame decoder verified every record's checksum.
            entries: entries_of(Bytes::from(records), true),
        },
        PeerMessage::Bind { bindings } => Msg::Bind {
            bindings: bindings
                .into_iter()
                .map(|b| Binding {
                    version: b.version,
                    epoch: b.epoch,
                    event: EventId {
                        client: b.client,
                        session: b.session,
                        sequence: b.sequence,
                    },
                    low_water: b.low_water,
                    flags: b.flags,
                    crc: b.crc,
                })
                .collect(),
        },
        PeerMessage::Progress { logged, last } => Msg::Progress { logged, last },
        PeerMessage::Commit { committed, last } => Msg::Commit { committed, last },
        PeerMessage::Need { from, to } => Msg::Need { from, to },
        PeerMessage::Probe => Msg::Probe,
        PeerMessage::Checkpoint { through, state } => Msg::Checkpoint {
            through,
            state: Bytes::from(state),
        },
        PeerMessage::Reack {
            client,
            session,
            sequence,
            version,
        } => Msg::Reack {
            event: EventId {
                client,
                session,
                sequence,
            },
            version,
        },
    }
}

/// The records laid end to end in `records`, each a slice of it, up to the
/// first that does not decode. `checked`: their checksums were verified a
/// moment ago (by the frame decoder), so decoding skips them.
pub(crate) fn entries_of(records: Bytes, checked: bool) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut offset = 0;
    loop {
        let decoded = if checked {
            Record::decode_verified(&records[offset..])
        } else {
            Record::decode(&records[offset..])
        };
        let Ok((record, length)) = decoded else {
            break;
        };
        entries.push(Entry {
            header: record.header,
            bytes: records.slice(offset..offset + length),
        });
        offset += length;
    }
    entries
}

/// The event a client message is about.
pub(crate) fn event_of(msg: &Msg) -> Option<EventId> {
    match msg {
        Msg::Write(content) | Msg::Tagged(content) | Msg::Placed { content, .. } => {
            Some(content.event)
        }
        Msg::Reserve { event, .. } => Some(*event),
        _ => None,
    }
}

/// A client's `Submit` as a `Msg`; `None` for an unknown kind.
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit_msg(
    client: u128,
    kind: u8,
    version: u64,
    epoch: u64,
    session: u64,
    sequence: u64,
    low_water: u64,
    key: Vec<u8>,
    payload: Vec<u8>,
) -> Option<Msg> {
    let event = EventId {
        client,
        session,
        sequence,
    };
    let resent = kind & proto::frame::SUBMIT_FLAG_RESENT != 0;
    let content = || Content {
        event,
        low_water,
        key: Bytes::from(key),
        payload: Bytes::from(payload),
        resent,
    };
    Some(match kind & !proto::frame::SUBMIT_FLAG_RESENT {
        proto::frame::SUBMIT_WRITE => Msg::Write(content()),
        proto::frame::SUBMIT_TAGGED => Msg::Tagged(content()),
        proto::frame::SUBMIT_RESERVE => Msg::Reserve { event, low_water },
        proto::frame::SUBMIT_PLACED => Msg::Placed {
            version,
            epoch,
            content: content(),
        },
        // A run of confirmations: `low_water` carries its length.
        proto::frame::SUBMIT_CONFIRM => Msg::Confirm {
            event,
            version,
            count: low_water.max(1),
        },
        _ => return None,
    })
}

pub(crate) fn hint_code(hint: Option<HybridMode>) -> u8 {
    match hint {
        None => 0,
        Some(HybridMode::ServerSync) => 1,
        Some(HybridMode::ClientAsync) => 2,
    }
}

/// Encodes the frames of one note to a client, folding each `Acked` that
/// continues the one before it (the next sequence of the same session
/// under the next version, with the same stream, epoch, flags and hint)
/// into that frame's run, so a batch of acks costs one frame rather than
/// one per message.
#[derive(Default)]
pub(crate) struct ClientFrames {
    bytes: Vec<u8>,
    run: Option<Frame>,
}

impl ClientFrames {
    pub(crate) fn push(&mut self, frame: Frame) {
        if let Some(run) = &mut self.run {
            if extend_run(run, &frame) {
                return;
            }
        }
        if let Some(run) = self.run.take() {
            run.encode(&mut self.bytes);
        }
        match frame {
            Frame::Acked { .. } => self.run = Some(frame),
            other => other.encode(&mut self.bytes),
        }
    }

    /// The encoded frames, in the order they were pushed.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        if let Some(run) = self.run.take() {
            run.encode(&mut self.bytes);
        }
        self.bytes
    }
}

/// Folds `next` into `run` when it is the run's next ack.
fn extend_run(run: &mut Frame, next: &Frame) -> bool {
    let (
        Frame::Acked {
            stream,
            server,
            session,
            sequence,
            version,
            epoch,
            flags,
            hint,
            more,
        },
        Frame::Acked {
            stream: next_stream,
            server: next_server,
            session: next_session,
            sequence: next_sequence,
            version: next_version,
            epoch: next_epoch,
            flags: next_flags,
            hint: next_hint,
            more: next_more,
        },
    ) = (run, next)
    else {
        return false;
    };
    let step = u64::from(*more) + 1;
    let joined = more.checked_add(*next_more).and_then(|m| m.checked_add(1));
    let continues = (*stream, *server, *session, *epoch, *flags, *hint)
        == (
            *next_stream,
            *next_server,
            *next_session,
            *next_epoch,
            *next_flags,
            *next_hint,
        )
        && sequence.checked_add(step) == Some(*next_sequence)
        && version.checked_add(step) == Some(*next_version)
        && joined.is_some_and(|m| m <= proto::frame::ACKED_RUN_MAX);
    if continues {
        *more = joined.expect("checked");
    }
    continues
}

/// A client-bound `Msg` as the frame this server sends.
pub(crate) fn client_frame(me: ServerId, stream: u64, msg: Msg) -> Option<Frame> {
    Some(match msg {
        Msg::Ack {
            event,
            version,
            epoch,
            duplicate,
            hint,
            count,
        } => Frame::Acked {
            stream,
            server: me,
            session: event.session,
            sequence: event.sequence,
            version,
            epoch,
            flags: if duplicate {
                proto::frame::ACKED_FLAG_DUPLICATE
            } else {
                0
            },
            hint: hint_code(hint),
            // A run is at most `ACK_RUN_MAX` messages, one frame's worth.
            more: count.clamp(1, ACK_RUN_MAX) as u32 - 1,
        },
        Msg::Stamped {
            event,
            version,
            epoch,
            duplicate,
        } => Frame::Stamped {
            stream,
            session: event.session,
            sequence: event.sequence,
            version,
            epoch,
            flags: if duplicate {
                proto::frame::ACKED_FLAG_DUPLICATE
            } else {
                0
            },
        },
        Msg::Checkpointed { through, resend } => Frame::Checkpointed {
            stream,
            version: through,
            flags: if resend {
                proto::frame::CHECKPOINTED_FLAG_RESEND
            } else {
                0
            },
        },
        Msg::Refused { event, refusal } => Frame::Refused {
            stream,
            session: event.session,
            sequence: event.sequence,
            code: refusal.code(),
            message: refusal.to_string(),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::RecordHeader;

    fn acked(session: u64, sequence: u64, version: u64, flags: u8) -> Frame {
        Frame::Acked {
            stream: 4,
            server: 2,
            session,
            sequence,
            version,
            epoch: 1,
            flags,
            hint: 0,
            more: 0,
        }
    }

    /// Every frame in `bytes`, each `Acked` run expanded to its acks.
    fn expanded(bytes: &[u8]) -> (Vec<Frame>, usize) {
        let mut buffer = proto::FrameBuffer::default();
        buffer.extend(bytes);
        let mut frames = Vec::new();
        let mut count = 0;
        while let Some(frame) = buffer.next_frame(1 << 20).expect("well formed") {
            count += 1;
            match frame {
                Frame::Acked {
                    session,
                    sequence,
                    version,
                    flags,
                    more,
                    ..
                } => {
                    for offset in 0..=u64::from(more) {
                        frames.push(acked(session, sequence + offset, version + offset, flags));
                    }
                }
                other => frames.push(other),
            }
        }
        (frames, count)
    }

    #[test]
    fn consecutive_acks_travel_as_one_frame_and_expand_to_the_same_acks() {
        let mut pushed = Vec::new();
        for sequence in 1..=1000u64 {
            pushed.push(acked(1, sequence, sequence + 10, 0));
        }
        // Each of these breaks the run: a gap in versions, a duplicate
        // flag, another session, a frame of another kind.
        pushed.push(acked(1, 1001, 1012, 0));
        pushed.push(acked(1, 1002, 1013, proto::frame::ACKED_FLAG_DUPLICATE));
        pushed.push(acked(2, 1003, 1014, 0));
        pushed.push(Frame::Stamped {
            stream: 4,
            session: 2,
            sequence: 1004,
            version: 1015,
            epoch: 1,
            flags: 0,
        });
        pushed.push(acked(2, 1004, 1015, 0));
        let mut frames = ClientFrames::default();
        for frame in pushed.clone() {
            frames.push(frame);
        }
        let (back, count) = expanded(&frames.finish());
        assert_eq!(back, pushed);
        assert_eq!(count, 6, "one frame for the run, one for each break");
    }

    #[test]
    fn a_run_stops_at_the_longest_a_frame_may_carry() {
        let total = u64::from(proto::frame::ACKED_RUN_MAX) + 10;
        let mut frames = ClientFrames::default();
        for sequence in 1..=total {
            frames.push(acked(1, sequence, sequence, 0));
        }
        let (back, count) = expanded(&frames.finish());
        assert_eq!(back.len() as u64, total);
        assert_eq!(count, 2);
    }

    #[test]
    fn runs_that_continue_each_other_fold_into_one_frame_up_to_the_bound() {
        let run = |sequence: u64, count: u64| {
            let msg = Msg::Ack {
                event: EventId {
                    client: 5,
                    session: 1,
                    sequence,
                },
                version: sequence + 10,
                epoch: 1,
                duplicate: false,
                hint: None,
                count,
            };
            client_frame(2, 4, msg).expect("a client frame")
        };
        let mut frames = ClientFrames::default();
        frames.push(run(1, 100));
        frames.push(run(101, 50));
        // Fills the frame exactly; the next run starts another.
        frames.push(run(151, ACK_RUN_MAX - 150));
        frames.push(run(ACK_RUN_MAX + 1, 7));
        let (back, count) = expanded(&frames.finish());
        assert_eq!(count, 2);
        let every: Vec<Frame> = (1..=ACK_RUN_MAX + 7)
            .map(|sequence| acked(1, sequence, sequence + 10, 0))
            .collect();
        assert_eq!(back, every);
    }

    #[test]
    fn a_replicate_frame_is_what_frame_encode_makes() {
        let entries: Vec<Entry> = (1..=3u64)
            .map(|version| {
                let header = RecordHeader {
                    flags: 0,
                    stream: 9,
                    version,
                    epoch: 1,
                    event: EventId {
                        client: 5,
                        session: 1,
                        sequence: version,
                    },
                    low_water: 1,
                };
                Entry::new(header, b"key", &[version as u8; 100])
            })
            .collect();
        let records: Vec<u8> = entries
            .iter()
            .flat_map(|e| e.bytes.iter().copied())
            .collect();
        let expected = Frame::Peer {
            stream: 9,
            message: PeerMessage::Replicate { count: 3, records },
        }
        .to_bytes();
        assert_eq!(replicate_frame(9, &entries), expected);
        let (decoded, _) = Frame::decode(&expected, 1 << 20).unwrap().unwrap();
        let Frame::Peer { message, .. } = decoded else {
            panic!("not a peer frame");
        };
        let Msg::Replicate { entries: back } = peer_msg(message) else {
            panic!("not replicate");
        };
        assert_eq!(back, entries);
    }
}
