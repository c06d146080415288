//! The wiring between the replication state machines and the network: the
//! [`Router`] carries what a stream's `Replica` sends to clients and peers,
//! and peer links carry replication messages between servers (their frames
//! are made in `wire`).
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

use bytes::Bytes;
use engine::replication::{Msg, ServerId};
use net::{Chunk, Refused, SharedWriter};
use proto::Frame;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};

use crate::config::ClusterConfig;
use crate::outgoing::Outgoing;
use crate::wire;

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
    /// This server's log of the stream failed (`reason`).
    LogFailed { stream: String, reason: String },
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
    backlog: std::collections::VecDeque<Chunk>,
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
    fn send(&self, frame: Chunk) -> bool {
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

/// One connection of a client: its number, its way to the socket, and the
/// streams it opened or wrote to, sorted (none yet: every stream's). Most
/// connections have one, so a delivery, which asks every connection of
/// the client, hashes nothing.
struct ClientConnection {
    id: u64,
    outgoing: Arc<Outgoing>,
    streams: Vec<u64>,
}

impl ClientConnection {
    /// Whether a message of `stream` for this connection's client goes to
    /// this connection.
    fn wants(&self, stream: u64) -> bool {
        self.streams.is_empty() || self.opened(stream)
    }

    /// The connection opened or wrote to `stream`.
    fn opened(&self, stream: u64) -> bool {
        self.streams.binary_search(&stream).is_ok()
    }
}

pub struct Router {
    pub me: ServerId,
    /// Opens this server's links to the others.
    pub dialer: net::Dialer,
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
    /// Each connected client's connections.
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
    /// `dialer` opens every link this server starts to another (peer
    /// links, forwarding, replica creation): TLS with the server's own
    /// certificate when the server has one.
    pub fn new(cluster: &ClusterConfig, queue_max: usize, dialer: net::Dialer) -> Router {
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
            dialer,
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
        let dialer = self.dialer.clone();
        let ends = (id, address, stop);
        let span = tracing::info_span!("link", server = self.me, peer = id);
        tokio::spawn(tracing::Instrument::instrument(
            run_link((self.me, incarnation, dialer), ends, link),
            span,
        ));
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
        self.send_peers(&[to], stream, &msg);
    }

    /// Sends one replication message to several peers, encoded once: with
    /// more than one, each link gets the same frame, shared (at R = 3, a
    /// primary's `Replicate` to both backups is one copy of its records,
    /// not two).
    pub(crate) fn send_peers(&self, to: &[ServerId], stream: u64, msg: &Msg) {
        let peers = self.peers.read().expect("router lock");
        let links = || to.iter().filter_map(|to| peers.get(to));
        let count = links().count();
        if count == 0 {
            return;
        }
        let Some(frame) = wire::peer_send(stream, msg) else {
            return;
        };
        // One link takes the frame as it is; several share it (a frame in
        // parts shares them already).
        let frame = match (count, frame) {
            (2.., Chunk::Owned(frame)) => Chunk::Shared(Bytes::from(frame)),
            (_, frame) => frame,
        };
        // `repeat_n` moves the frame itself into its last item: an owned
        // frame is never copied.
        let sent = links()
            .zip(std::iter::repeat_n(frame, count))
            .map(|(link, frame)| link.send(frame))
            .filter(|sent| *sent)
            .count();
        self.metrics
            .peer_sent
            .fetch_add(sent as u64, Ordering::Relaxed);
        self.metrics
            .peer_dropped
            .fetch_add((count - sent) as u64, Ordering::Relaxed);
    }

    /// The frames queued for a peer whose link has not started, for tests.
    #[cfg(test)]
    pub(crate) fn take_queued(&self, to: ServerId) -> Vec<Chunk> {
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
            .push(ClientConnection {
                id,
                outgoing,
                streams: Vec::new(),
            });
        id
    }

    /// Connection `connection` of `client` opened or wrote to `stream`:
    /// from now on it gets that stream's messages for the client, and no
    /// longer those of streams it did neither with. So a client with a
    /// connection per stream to a server (a publisher per stream) gets
    /// each acknowledgement once, not once per connection.
    pub(crate) fn declare(&self, client: u128, connection: u64, stream: u64) {
        let mut clients = self.clients.lock().expect("router lock");
        let found = clients
            .get_mut(&client)
            .and_then(|list| list.iter_mut().find(|c| c.id == connection));
        if let Some(found) = found {
            if let Err(at) = found.streams.binary_search(&stream) {
                found.streams.insert(at, stream);
            }
        }
    }

    pub(crate) fn unregister(&self, client: u128, connection: u64) {
        let mut clients = self.clients.lock().expect("router lock");
        if let Some(list) = clients.get_mut(&client) {
            list.retain(|c| c.id != connection);
            if list.is_empty() {
                clients.remove(&client);
            }
        }
    }

    /// Hands messages of `stream` to the client's connections that opened
    /// or wrote to it and to those that did neither with any stream yet
    /// (`declare`); when no connection of the client opened or wrote to
    /// it, to every one: a connection a client shares among its streams may not
    /// have said it carries this one yet (its `OpenStream` is behind a
    /// message the primary forwarded here). On this thread; a client that
    /// is not connected gets nothing: it will retry.
    pub(crate) fn send_client(&self, client: u128, stream: u64, msgs: Vec<Msg>) {
        // Delivered outside the router's lock: a delivery may write.
        let connections: Vec<Arc<Outgoing>> = {
            let clients = self.clients.lock().expect("router lock");
            let list = clients.get(&client).map(Vec::as_slice).unwrap_or_default();
            let opened = list.iter().any(|c| c.opened(stream));
            list.iter()
                .filter(|c| !opened || c.wants(stream))
                .map(|c| Arc::clone(&c.outgoing))
                .collect()
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
                .map(|c| Arc::clone(&c.outgoing))
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
    (me, incarnation, dialer): (ServerId, Arc<AtomicU64>, net::Dialer),
    (peer, address, mut stop): (ServerId, String, watch::Receiver<bool>),
    link: Arc<PeerLink>,
) {
    let mut delay = Duration::from_millis(10);
    loop {
        let connected = tokio::select! {
            connected = tokio::time::timeout(Duration::from_secs(2), dialer.connect(&address)) => connected,
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
        tracing::warn!("link to server {peer} at {address} broke; reconnecting");
    }
}

#[cfg(test)]
mod tests {
    use engine::replication::Entry;

    use super::*;
    use crate::config::{ClusterConfig, Peer};

    /// A router of server 1 with peers 2 and 3 whose links have not
    /// started, so what is sent to them stays queued.
    fn router() -> Router {
        let cluster = ClusterConfig {
            me: 1,
            peers: [2, 3]
                .into_iter()
                .map(|id| Peer {
                    id,
                    address: "127.0.0.1:9".into(),
                })
                .collect(),
            ..ClusterConfig::default()
        };
        let router = Router::new(&cluster, 16, net::Dialer::plain());
        for peer in &cluster.peers {
            router.add_peer(peer.id, &peer.address);
        }
        router
    }

    #[test]
    fn one_message_to_two_peers_is_one_frame_they_share_and_to_one_peer_its_own() {
        let router = router();
        let msg = Msg::Replicate {
            entries: vec![Entry::void(5, 1, 1), Entry::void(5, 2, 1)],
        };
        let expected = wire::peer_frame(5, &msg).unwrap();
        router.send_peers(&[2, 3], 5, &msg);
        let (two, three) = (router.take_queued(2), router.take_queued(3));
        let ([Chunk::Shared(two)], [Chunk::Shared(three)]) = (&two[..], &three[..]) else {
            panic!("one shared frame each: {two:?} {three:?}");
        };
        assert_eq!(two, &expected[..]);
        assert_eq!(two.as_ptr(), three.as_ptr(), "the same bytes, not a copy");
        router.send_peer(3, 5, msg.clone());
        assert_eq!(router.take_queued(3), vec![Chunk::Owned(expected)]);
        assert!(router.take_queued(2).is_empty());
        // A peer the router does not know counts for nothing.
        router.send_peers(&[3, 4], 5, &msg);
        assert_eq!(router.take_queued(3).len(), 1);
        assert_eq!(router.metrics.peer_sent.load(Ordering::Relaxed), 4);
        assert_eq!(router.metrics.peer_dropped.load(Ordering::Relaxed), 0);
    }
}
