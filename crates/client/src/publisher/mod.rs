//! The replicated producer: one `send` whatever the stream's protocol.
//!
//! A [`Publisher`] connects to every server of the stream's replica set and
//! runs the client side of the stream's protocol (the pure
//! `engine::replication::Producer`): it sends each message where the
//! protocol says (the primary, every replica, or first the primary for a
//! version), collects the acknowledgements the protocol's ack rule needs,
//! and resends on a timeout with the same event id and content, so a
//! message that had landed is answered with its original version and the
//! `duplicate` flag. A broken connection is re-established in the
//! background; the retry covers what it lost. The connections are its
//! [`PublisherLinks`]' (`links.rs`): its own, or shared with the client's
//! other publishers, one per server.
//!
//! Failover: when the link to the primary is down, or a server answers
//! `NotPrimary`, or messages time out, the publisher asks the servers it
//! knows for the stream's placement every [`REFRESH_INTERVAL`]; a newer
//! epoch moves every message not done to the new primary at once, with
//! the same event ids.
//!
//! Who does what: the producer and everything it decides sit in one
//! [`Core`] behind a lock. A caller's `submit` runs the producer and
//! hands the frames to each server's [`Outbox`] (shared by the publishers
//! on that server's link). When the message is the publisher's only one
//! in flight and the connection is idle, the caller's own thread
//! writes it to the socket (`net::SharedWriter`); with more in flight the
//! frames queue for the link task, which writes what gathered in one go.
//! Each link task also feeds the answers it reads to the producers
//! themselves, each publisher's in one step per read;
//! a background task ticks the resends and follows the placement, and
//! parks its timer while the publisher is idle with every link up (a send,
//! a broken link or the publisher's drop wake it). So a
//! lone message crosses no task of the publisher's own on its way out, nor
//! an ack on its way back: the handoffs between tasks cost more than the
//! producer's work, and every one is a thread wake-up when the workers are
//! idle.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use engine::replication::{
    Bytes, Completion, Content, HybridMode, Msg, Node, Placement, Producer, ProducerSettings,
    Protocol, Refusal, ServerId,
};
use proto::{ErrorCode, EventId, Frame, StreamInfo};
use tokio::sync::{mpsc, oneshot, Notify, Semaphore};

use crate::client::Client;
use crate::config::{ClientConfig, Credentials};
use crate::error::ClientError;

mod links;

pub use links::PublisherLinks;
use links::{MemberKey, Outbox};

/// How long the placement refresher waits for other servers once one has
/// answered.
const REFRESH_GRACE: Duration = Duration::from_millis(150);

/// How often a publisher that suspects a failover asks for the placement.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(100);

/// How often the background task ticks the producer (resends).
const TICK: Duration = Duration::from_millis(10);

/// Messages answered under one hold of the lock, about: a burst of acks
/// (an output commit boundary releasing thousands, which a server sends as
/// a few runs of a frame each) reaches the callers in pieces of this many
/// rather than all at once, and the lock is never held for long. A piece
/// ends once it reaches this many; an ack run of the piece counts each of
/// its messages and is at most this long.
const ANSWER_PIECE_MAX: usize = 128;

/// What a replicated send returns once its protocol's ack rule is met.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub event: EventId,
    /// The version (for `unversioned`, the first replica's own).
    pub version: u64,
    /// Some server answered that the message was already logged.
    pub duplicate: bool,
    /// The message was sent again after a failover, so it may repeat one a
    /// reader saw before (`duplicate` says it surely was logged before). A
    /// record the new primary logged from the resend carries the
    /// `possible-duplicate` flag; a consumer that acts on messages outside
    /// the stream should check its own records for such an event id.
    pub possible_duplicate: bool,
    /// The servers that acknowledged, with the version each named.
    pub acks: Vec<(ServerId, u64)>,
}

/// The largest window a publisher takes: a server keeps the versions of at
/// most this many unanswered sequences of one session for deduplication
/// (`engine::DedupeLimits`), from the session's low-water mark on. The
/// window slides over sequences, so the newest message is never further
/// above the low-water mark than this; with more, a message refused for a
/// full table could find it full at every retry, filled by the messages
/// sent after it, while the low-water mark that would empty it waits for
/// that very message.
pub const PUBLISHER_WINDOW_MAX: usize = 1 << 16;

/// Settings of a publisher.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// Messages in flight at most, 1 to [`PUBLISHER_WINDOW_MAX`]: more
    /// exactly, how far the newest message's sequence may be above the
    /// oldest one not yet done (the window slides, as TCP's does), so a
    /// message held up holds back new sends a window later.
    pub window: usize,
    /// A message not done after this long is sent again.
    pub retry: Duration,
    /// What the links to the replicas prove themselves with.
    pub credentials: Credentials,
    /// The client id in the event ids; random when `None`.
    pub client_id: Option<u128>,
    /// The session (producer) number within the client.
    pub session: u64,
    pub connect_timeout: Duration,
    /// Sender-based logging: past this many bytes of acknowledged messages
    /// kept for the primary's next checkpoint, new sends wait.
    pub held_bytes_max: usize,
    /// Messages the publishers sharing one server's connection
    /// ([`PublisherLinks`], made with this configuration) may keep in
    /// flight there together, by the sum of their windows: a server
    /// refuses a connection's writes past its `in_flight_per_connection_max`
    /// (4,096 by default, this default) as `Busy`. A publisher alone on
    /// its links may have any window.
    pub server_in_flight_max: usize,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            window: 256,
            retry: Duration::from_millis(500),
            credentials: Credentials::default(),
            client_id: None,
            session: 1,
            connect_timeout: Duration::from_secs(5),
            held_bytes_max: 256 * 1024 * 1024,
            server_in_flight_max: 4096,
        }
    }
}

/// A replicated producer of one stream. Cheap to share behind an `Arc`.
/// Dropping it lets its tasks end once every message sent is done.
pub struct Publisher {
    shared: Arc<Shared>,
    protocol: Protocol,
}

/// What the callers, the links and the background task share.
struct Shared {
    stream: u64,
    /// The stream's name, which each link opens the stream by.
    name: String,
    client_id: u128,
    /// The session (producer) number within the client.
    session: u64,
    /// The most messages it keeps in flight (`PublisherConfig::window`).
    window_size: usize,
    core: Mutex<Core>,
    /// The window: a send takes a permit, and a permit comes back when the
    /// producer's low-water mark passes a sequence (`Shared::complete`).
    window: Semaphore,
    /// Sender-based logging: woken when the copies kept for the primary's
    /// checkpoint shrink, for sends waiting for room.
    held_room: Notify,
    held_bytes_max: usize,
    /// A `hybrid` stream's mode as the primary last reported it (0: none).
    mode: AtomicU8,
    held: Held,
    /// The server's words for messages refused for good, by sequence, so
    /// the caller's error says what the server said.
    refusals: Mutex<HashMap<u64, String>>,
    /// Which links are up, by server.
    link_states: Mutex<HashMap<ServerId, bool>>,
    /// The publisher was dropped: the tasks end once nothing waits.
    closed: AtomicBool,
    /// The background task's timer.
    timer: Timer,
}

/// The background task's timer, which it parks while ticks would have
/// nothing to do: nothing is in flight or held, every link is up, and no
/// failover is suspected.
#[derive(Default)]
struct Timer {
    /// The task waits for `wake` instead of ticking.
    parked: AtomicBool,
    wake: Notify,
    /// Ticks the task ran.
    ticks: AtomicU64,
}

/// The producer and what it decided, under the publisher's lock.
struct Core {
    producer: Producer,
    /// Each server's bytes to write.
    outboxes: HashMap<ServerId, Arc<Outbox>>,
    replies: Replies,
    /// The producer's completions being answered; kept between calls.
    completed: Vec<Completion>,
    /// What a step sends; kept between calls.
    out: Vec<(Node, Msg)>,
    started: Instant,
    /// The producer's low-water mark when window permits were last
    /// returned: the window slides over sequences, so a permit comes back
    /// when the low-water mark passes a sequence, not when a message
    /// completes (see `Shared::complete`).
    released_through: u64,
    /// A failover may be under way: ask for the placement.
    suspect: bool,
    refreshed_at: Option<Instant>,
}

/// Sender-based logging: the done messages kept until the primary's
/// checkpoint covers them, and their bytes.
#[derive(Default)]
struct Held {
    messages: AtomicUsize,
    bytes: AtomicUsize,
}

type Reply = oneshot::Sender<Result<Published, ClientError>>;

/// The callers waiting for their messages, by sequence. Sequences are
/// handed out densely and in order, so a queue from the oldest one waiting
/// holds them without hashing. Each caller waiting counts in `in_flight`,
/// the count shared by every publisher on the same links.
struct Replies {
    first: u64,
    slots: VecDeque<Option<Reply>>,
    /// The callers in `slots` still waiting.
    waiting: usize,
    in_flight: Arc<AtomicUsize>,
}

impl Replies {
    /// No caller yet; each one to come counts in `in_flight`.
    fn counting_in(in_flight: Arc<AtomicUsize>) -> Replies {
        Replies {
            first: 0,
            slots: VecDeque::new(),
            waiting: 0,
            in_flight,
        }
    }

    fn insert(&mut self, sequence: u64, reply: Reply) {
        if self.slots.is_empty() {
            self.first = sequence;
        }
        assert_eq!(
            sequence,
            self.first + self.slots.len() as u64,
            "a producer hands out sequences densely, in order"
        );
        self.slots.push_back(Some(reply));
        self.waiting += 1;
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    fn remove(&mut self, sequence: u64) -> Option<Reply> {
        let index = usize::try_from(sequence.checked_sub(self.first)?).ok()?;
        let reply = self.slots.get_mut(index)?.take();
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.first += 1;
        }
        if reply.is_some() {
            self.waiting -= 1;
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
        reply
    }

    fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Messages awaiting answers on the links, this publisher's and the
    /// others'.
    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        self.in_flight.fetch_sub(self.waiting, Ordering::Relaxed);
    }
}

/// A message sent and not yet done.
pub struct PendingPublish {
    pub event: EventId,
    answer: oneshot::Receiver<Result<Published, ClientError>>,
}

impl std::future::Future for PendingPublish {
    type Output = Result<Published, ClientError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.answer)
            .poll(cx)
            .map(|answer| answer.unwrap_or(Err(ClientError::Closed)))
    }
}

impl Publisher {
    /// Connects to every replica of the stream `info` describes (as
    /// `Client::open_stream` or `create_stream` returned it), over
    /// connections of its own.
    pub async fn connect(
        info: &StreamInfo,
        config: PublisherConfig,
    ) -> Result<Publisher, ClientError> {
        let links = PublisherLinks::new(&config);
        Publisher::connect_over(&links, info, config).await
    }

    /// Connects to every replica of the stream over `links`, which it
    /// shares with the other publishers made with them: one connection per
    /// server for all of them. `config.client_id` must be `None` or the
    /// links' own; the links' credentials and connect timeout hold. Each
    /// publisher of one stream on the same links needs a session of its
    /// own.
    pub async fn connect_over(
        links: &PublisherLinks,
        info: &StreamInfo,
        config: PublisherConfig,
    ) -> Result<Publisher, ClientError> {
        let protocol = Protocol::from_code(info.protocol).ok_or_else(|| {
            ClientError::Protocol(format!("unknown protocol code {}", info.protocol))
        })?;
        if info.replicas.is_empty() {
            return Err(ClientError::Protocol("the stream has no replicas".into()));
        }
        check_window(config.window)?;
        let client_id = links.client_id();
        if config.client_id.is_some_and(|id| id != client_id) {
            return Err(ClientError::Config(format!(
                "client id {:032x} given to a publisher on links of client {client_id:032x}: leave it unset or give the links' own",
                config.client_id.unwrap_or_default()
            )));
        }
        let placement = Placement {
            replicas: info.replicas.iter().map(|r| r.id).collect(),
            primary: info.primary,
            epoch: info.epoch,
        };
        let shared = Arc::new(Shared::new(info, &config, links, protocol, placement));
        let mut joined = Vec::with_capacity(info.replicas.len());
        for replica in &info.replicas {
            match links.join(replica.id, &replica.address, &shared).await {
                Ok(outbox) => {
                    shared.lock().outboxes.insert(replica.id, outbox);
                    joined.push(replica.id);
                }
                Err(error) => {
                    links.leave(joined, shared.key());
                    return Err(error);
                }
            }
        }
        let addresses: Vec<String> = info.replicas.iter().map(|r| r.address.clone()).collect();
        let addresses = Arc::new(Mutex::new(addresses));
        let (refresh, refresh_receiver) = mpsc::channel(1);
        let (infos, infos_receiver) = mpsc::channel(4);
        tokio::spawn(run_refresher(
            info.name.clone(),
            Arc::clone(&addresses),
            links.config().clone(),
            refresh_receiver,
            infos,
        ));
        let background = Background {
            shared: Arc::clone(&shared),
            addresses,
            refresh,
            links: links.clone(),
        };
        tokio::spawn(background.run(infos_receiver));
        Ok(Publisher { shared, protocol })
    }

    /// Sender-based logging (durability `sender`): the messages this
    /// publisher still keeps after they were acknowledged, until the
    /// primary's checkpoint covers them, and their key and payload bytes.
    pub fn held(&self) -> (usize, usize) {
        (
            self.shared.held.messages.load(Ordering::Relaxed),
            self.shared.held.bytes.load(Ordering::Relaxed),
        )
    }

    /// How many times the background task has run its timer: every 10 ms
    /// while messages are in flight or a failover may be under way, not
    /// at all while the publisher is idle with every link up.
    pub fn ticks(&self) -> u64 {
        self.shared.timer.ticks.load(Ordering::Relaxed)
    }

    pub fn client_id(&self) -> u128 {
        self.shared.client_id
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A `hybrid` stream's current mode as the primary last reported it.
    pub fn hybrid_mode(&self) -> Option<HybridMode> {
        match self.shared.mode.load(Ordering::Relaxed) {
            1 => Some(HybridMode::ServerSync),
            2 => Some(HybridMode::ClientAsync),
            _ => None,
        }
    }

    /// Sends one message and waits until its protocol's ack rule is met.
    pub async fn send(&self, key: &[u8], payload: &[u8]) -> Result<Published, ClientError> {
        self.submit(key, payload).await?.await
    }

    /// Sends one message once the window has room; the returned future
    /// resolves when the message is done.
    pub async fn submit(&self, key: &[u8], payload: &[u8]) -> Result<PendingPublish, ClientError> {
        let shared = &self.shared;
        shared
            .window
            .acquire()
            .await
            .map_err(|_| ClientError::Closed)?
            .forget();
        let (reply, answer) = oneshot::channel();
        let key = Bytes::copy_from_slice(key);
        let payload = Bytes::copy_from_slice(payload);
        loop {
            // Created before the check, so room freed in between wakes it.
            let room = shared.held_room.notified();
            tokio::pin!(room);
            room.as_mut().enable();
            {
                let mut core = shared.lock();
                if core.producer.held().1 <= shared.held_bytes_max {
                    let event = core.step(shared.stream, |producer, now, out| {
                        producer.send(key, payload, now, out)
                    });
                    core.replies.insert(event.sequence, reply);
                    drop(core);
                    shared.wake_background();
                    return Ok(PendingPublish { event, answer });
                }
            }
            // Sender-based logging: the copies kept for the primary's
            // checkpoint fill their budget; wait for the next checkpoint.
            room.await;
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake_background();
    }
}

impl Shared {
    /// A publisher of the stream `info` describes, to join `links`, with
    /// no link yet.
    fn new(
        info: &StreamInfo,
        config: &PublisherConfig,
        links: &PublisherLinks,
        protocol: Protocol,
        placement: Placement,
    ) -> Shared {
        let client_id = links.client_id();
        let producer = Producer::new(
            client_id,
            config.session,
            protocol,
            placement,
            ProducerSettings {
                retry_ms: config.retry.as_millis() as u64,
                sender_logging: matches!(info.durability, proto::DurabilityConfig::Sender { .. }),
                ..ProducerSettings::default()
            },
        );
        Shared {
            stream: info.id,
            name: info.name.clone(),
            client_id,
            session: config.session,
            window_size: config.window,
            core: Mutex::new(Core::new(producer, links.in_flight())),
            window: Semaphore::new(config.window),
            held_room: Notify::new(),
            held_bytes_max: config.held_bytes_max,
            mode: AtomicU8::new(0),
            held: Held::default(),
            refusals: Mutex::default(),
            link_states: Mutex::default(),
            closed: AtomicBool::new(false),
            timer: Timer::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        self.core.lock().expect("publisher lock")
    }

    /// What the shared links know this publisher by.
    fn key(&self) -> MemberKey {
        (self.stream, self.session)
    }

    /// The link to `server` went up or down.
    fn set_link(&self, server: ServerId, up: bool) {
        self.link_states
            .lock()
            .expect("link states lock")
            .insert(server, up);
        if !up {
            self.wake_background();
        }
    }

    /// The refusal of message `sequence` with `code`, as the producer
    /// understands it; the server's words are kept for a refusal that
    /// ends the message, so its caller's error says them.
    fn refusal(&self, sequence: u64, code: ErrorCode, message: String) -> Option<Refusal> {
        let refusal = refusal_of(code);
        if matches!(
            refusal,
            Some(Refusal::Invalid | Refusal::LogFailed | Refusal::ReadOnly | Refusal::Rejected(_))
        ) {
            let mut said = self.refusals.lock().expect("refusals lock");
            // Bounded: one entry per message in flight.
            if said.len() < PUBLISHER_WINDOW_MAX {
                said.insert(sequence, message);
            }
        }
        refusal
    }

    /// Gets a parked background task ticking again (after a send, a link
    /// going down, or the publisher's drop).
    fn wake_background(&self) {
        if self.timer.parked.swap(false, Ordering::SeqCst) {
            self.timer.wake.notify_one();
        }
    }

    /// Takes a server's answers, a piece at a time, and answers the callers
    /// whose messages they complete.
    async fn answers(&self, answers: Vec<(ServerId, Msg)>) {
        let mut answers = answers.into_iter().peekable();
        let mut done = Vec::new();
        while answers.peek().is_some() {
            let freed;
            {
                let mut core = self.lock();
                let suspect = core.step(self.stream, |producer, now, out| {
                    let (mut suspect, mut messages) = (false, 0);
                    while messages < ANSWER_PIECE_MAX {
                        let Some((from, msg)) = answers.next() else {
                            break;
                        };
                        suspect |= stale_placement(&msg);
                        messages += match msg {
                            Msg::Ack { count, .. } => count as usize,
                            _ => 1,
                        };
                        producer.on_message(from, msg, now, out);
                    }
                    suspect
                });
                core.suspect |= suspect;
                freed = self.complete(&mut core, &mut done);
            }
            self.reply(freed, &mut done);
            if answers.peek().is_some() {
                // The callers just answered run before the next piece.
                tokio::task::yield_now().await;
            }
        }
    }

    /// Takes the producer's completions and the replies they answer (sent
    /// by `reply`, once the lock is released), and returns the window
    /// permits the step freed.
    ///
    /// The window slides over sequences, as TCP's does over bytes: a
    /// permit comes back when the low-water mark passes a sequence. So the
    /// newest sequence is never a window or more above the low-water mark,
    /// and a server's dedupe table never holds more of this session than
    /// the window. Counting only the messages in flight instead, a message
    /// held up (a frame dropped, a refusal, a retry seconds away) would let
    /// the later ones run far ahead of the mark it holds back, fill the
    /// table, and have its own retry refused for good.
    fn complete(
        &self,
        core: &mut Core,
        done: &mut Vec<(Reply, Result<Published, ClientError>)>,
    ) -> usize {
        let mode = match core.producer.hybrid_mode() {
            HybridMode::ServerSync => 1,
            HybridMode::ClientAsync => 2,
        };
        if core.producer.protocol() == Protocol::Hybrid {
            self.mode.store(mode, Ordering::Relaxed);
        }
        let (messages, bytes) = core.producer.held();
        let before = self.held.bytes.swap(bytes, Ordering::Relaxed);
        self.held.messages.store(messages, Ordering::Relaxed);
        if bytes < before {
            self.held_room.notify_waiters();
        }
        let mut completed = std::mem::take(&mut core.completed);
        core.producer.drain_completed(&mut completed);
        for Completion { event, outcome } in completed.drain(..) {
            let Some(reply) = core.replies.remove(event.sequence) else {
                continue;
            };
            let result = match outcome {
                Ok(acknowledged) => Ok(Published {
                    event,
                    version: acknowledged.version,
                    duplicate: acknowledged.duplicate,
                    possible_duplicate: acknowledged.possible_duplicate,
                    acks: acknowledged.acks,
                }),
                Err(refusal) => {
                    let said = self
                        .refusals
                        .lock()
                        .expect("refusals lock")
                        .remove(&event.sequence);
                    Err(ClientError::Server {
                        code: refusal.code(),
                        message: said.unwrap_or_else(|| refusal.to_string()),
                    })
                }
            };
            done.push((reply, result));
        }
        // Kept, with its room, for the next burst.
        core.completed = completed;
        let low_water = core.producer.low_water();
        let freed = low_water.saturating_sub(core.released_through);
        core.released_through = core.released_through.max(low_water);
        freed as usize
    }

    /// Returns `freed` window permits (one release for the lot, not one per
    /// message) and answers the callers.
    fn reply(&self, freed: usize, done: &mut Vec<(Reply, Result<Published, ClientError>)>) {
        if freed > 0 {
            self.window.add_permits(freed);
        }
        for (reply, result) in done.drain(..) {
            let _ = reply.send(result);
        }
    }
}

impl Core {
    /// `in_flight`: the count of the messages awaiting answers on the
    /// links the publisher joins.
    fn new(producer: Producer, in_flight: Arc<AtomicUsize>) -> Core {
        Core {
            producer,
            outboxes: HashMap::new(),
            replies: Replies::counting_in(in_flight),
            completed: Vec::new(),
            out: Vec::new(),
            started: Instant::now(),
            released_through: 1,
            suspect: false,
            refreshed_at: None,
        }
    }

    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Runs one step of the producer at the current time, then encodes
    /// what it sends into the servers' outboxes (the send list is kept
    /// between steps, with its room).
    fn step<R>(
        &mut self,
        stream: u64,
        step: impl FnOnce(&mut Producer, u64, &mut Vec<(Node, Msg)>) -> R,
    ) -> R {
        let now = self.now();
        let mut out = std::mem::take(&mut self.out);
        let result = step(&mut self.producer, now, &mut out);
        self.flush(stream, &mut out);
        self.out = out;
        result
    }

    /// Encodes what the producer sends into the servers' outboxes. With
    /// at most one other message awaiting its answer on the links, this
    /// publisher's or another's (window 1, or a lull), the frames are
    /// written at once by this thread; otherwise they gather for the link
    /// tasks, which write them in batches.
    fn flush(&mut self, stream: u64, out: &mut Vec<(Node, Msg)>) {
        let now = self.replies.in_flight() <= 1;
        for (node, msg) in coalesce_confirms(out.drain(..)) {
            let Node::Server(server) = node else { continue };
            if let Some(outbox) = self.outboxes.get(&server) {
                outbox.push(now, |bytes| encode_submit(bytes, stream, &msg));
            }
        }
    }
}

/// The background task: resends on time, and the placement.
struct Background {
    shared: Arc<Shared>,
    /// Every server address seen, for placement requests.
    addresses: Arc<Mutex<Vec<String>>>,
    refresh: mpsc::Sender<()>,
    /// The connections the publisher shares.
    links: PublisherLinks,
}

impl Background {
    async fn run(self, mut infos: mpsc::Receiver<StreamInfo>) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut done = Vec::new();
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let (freed, finished, park) = {
                        let mut core = self.shared.lock();
                        let resent = core.step(self.shared.stream, |producer, now, out| {
                            producer.on_tick(now, out);
                            !out.is_empty()
                        });
                        // Resends mean answers are missing.
                        core.suspect |= resent;
                        self.ask_placement(&mut core);
                        let freed = self.shared.complete(&mut core, &mut done);
                        let finished = self.shared.closed.load(Ordering::Acquire) && core.replies.is_empty();
                        let park = (!finished).then(|| self.may_park(&core)).flatten();
                        (freed, finished, park)
                    };
                    self.shared.reply(freed, &mut done);
                    if finished {
                        let servers: Vec<ServerId> = self.shared.lock().outboxes.keys().copied().collect();
                        self.links.leave(servers, self.shared.key());
                        return;
                    }
                    if park.is_some_and(|links| self.links_up(links)) {
                        tokio::select! {
                            _ = self.shared.timer.wake.notified() => {}
                            Some(info) = infos.recv() => self.adopt(info, &mut done),
                        }
                        self.shared.timer.parked.store(false, Ordering::SeqCst);
                        tick.reset_immediately();
                    } else {
                        self.shared.timer.parked.store(false, Ordering::SeqCst);
                    }
                    self.shared.timer.ticks.fetch_add(1, Ordering::Relaxed);
                }
                Some(info) = infos.recv() => self.adopt(info, &mut done),
            }
        }
    }

    /// Whether the next ticks would have nothing to do: no message in
    /// flight, waiting for its caller or kept for a checkpoint, and no
    /// failover suspected; then `Some` of the number of links the
    /// publisher has, which must all be up too (`links_up`). Marks the
    /// task parked first (under the publisher's lock, which a send takes
    /// to add its message), so that a send or a link going down after
    /// this look wakes it.
    fn may_park(&self, core: &Core) -> Option<usize> {
        self.shared.timer.parked.store(true, Ordering::SeqCst);
        let idle = core.replies.is_empty()
            && core.producer.in_flight() == 0
            && core.producer.held().0 == 0
            && !core.suspect;
        idle.then_some(core.outboxes.len())
    }

    /// Whether all `links` are up (looked at after the task is marked
    /// parked: a link that goes down later wakes it).
    fn links_up(&self, links: usize) -> bool {
        let states = self.shared.link_states.lock().expect("link states lock");
        states.len() >= links && states.values().all(|up| *up)
    }

    /// Asks for the placement while a failover may be under way.
    fn ask_placement(&self, core: &mut Core) {
        let primary = core.producer.placement().primary;
        let primary_down = !self
            .shared
            .link_states
            .lock()
            .expect("link states lock")
            .get(&primary)
            .copied()
            .unwrap_or(false);
        if !(core.suspect || primary_down) {
            return;
        }
        if core
            .refreshed_at
            .is_some_and(|at| at.elapsed() < REFRESH_INTERVAL)
        {
            return;
        }
        core.refreshed_at = Some(Instant::now());
        let _ = self.refresh.try_send(());
    }

    /// A placement from a server: a newer epoch (or a changed replica set)
    /// moves the messages not done there.
    fn adopt(&self, info: StreamInfo, done: &mut Vec<(Reply, Result<Published, ClientError>)>) {
        let shared = &self.shared;
        let mut core = shared.lock();
        let current = core.producer.placement();
        if info.id != shared.stream || info.epoch < current.epoch || info.primary == 0 {
            return;
        }
        let placement = Placement {
            replicas: info.replicas.iter().map(|r| r.id).collect(),
            primary: info.primary,
            epoch: info.epoch,
        };
        if &placement == current {
            core.suspect = false;
            return;
        }
        {
            let mut addresses = self.addresses.lock().expect("addresses lock");
            for replica in &info.replicas {
                if !addresses.contains(&replica.address) {
                    addresses.push(replica.address.clone());
                }
            }
        }
        for replica in &info.replicas {
            if core.outboxes.contains_key(&replica.id) {
                continue;
            }
            // Only a publisher already on this stream and session could
            // refuse it, and the links checked that when it joined.
            match self
                .links
                .attach_later(replica.id, &replica.address, shared)
            {
                Ok(outbox) => {
                    core.outboxes.insert(replica.id, outbox);
                }
                Err(error) => tracing::warn!(%error, "cannot reach a new replica"),
            }
        }
        core.suspect = false;
        core.step(shared.stream, |producer, now, out| {
            producer.reconfigure(placement, now, out)
        });
        let freed = shared.complete(&mut core, done);
        drop(core);
        shared.reply(freed, done);
    }
}

/// A `NotPrimary` answer means the placement the producer knows is stale.
fn stale_placement(msg: &Msg) -> bool {
    matches!(
        msg,
        Msg::Refused {
            refusal: Refusal::NotPrimary,
            ..
        }
    )
}

/// Sender-based logging: folds each confirmation that continues the run
/// before it (next sequence, next version, same server) into that run, so
/// a burst of versions is confirmed in one frame.
fn coalesce_confirms(msgs: impl Iterator<Item = (Node, Msg)>) -> Vec<(Node, Msg)> {
    let mut folded: Vec<(Node, Msg)> = Vec::new();
    for (node, msg) in msgs {
        if let (
            Msg::Confirm {
                event,
                version,
                count: 1,
            },
            Some((
                last_node,
                Msg::Confirm {
                    event: run,
                    version: first,
                    count,
                },
            )),
        ) = (&msg, folded.last_mut())
        {
            if *last_node == node
                && run.session == event.session
                && run.sequence + *count == event.sequence
                && *first + *count == *version
            {
                *count += 1;
                continue;
            }
        }
        folded.push((node, msg));
    }
    folded
}

/// A payload of at least this many bytes is sent as it is, after its
/// `Submit` frame's head (`net::Chunk::Parts`), instead of copied into the
/// link's outbox: below it the copy costs less than a part.
const PAYLOAD_PART_MIN: usize = 4096;

/// Appends a client-to-server `Msg` as a `Submit` frame, encoded straight
/// from the shared key and payload; a payload of [`PAYLOAD_PART_MIN`]
/// bytes or more is left out of `out` and returned, to be sent after it.
fn encode_submit(out: &mut Vec<u8>, stream: u64, msg: &Msg) -> Option<Bytes> {
    let empty = Content {
        event: EventId {
            client: 0,
            session: 0,
            sequence: 0,
        },
        low_water: 0,
        key: Bytes::new(),
        payload: Bytes::new(),
        resent: false,
    };
    let (kind, version, epoch, content, event, low_water) = match msg {
        Msg::Write(content) => (
            proto::frame::SUBMIT_WRITE,
            0,
            0,
            content,
            content.event,
            content.low_water,
        ),
        Msg::Tagged(content) => (
            proto::frame::SUBMIT_TAGGED,
            0,
            0,
            content,
            content.event,
            content.low_water,
        ),
        Msg::Placed {
            version,
            epoch,
            content,
        } => (
            proto::frame::SUBMIT_PLACED,
            *version,
            *epoch,
            content,
            content.event,
            content.low_water,
        ),
        Msg::Reserve { event, low_water } => (
            proto::frame::SUBMIT_RESERVE,
            0,
            0,
            &empty,
            *event,
            *low_water,
        ),
        // The run's length travels in the low-water field.
        Msg::Confirm {
            event,
            version,
            count,
        } => (
            proto::frame::SUBMIT_CONFIRM,
            *version,
            0,
            &empty,
            *event,
            *count,
        ),
        _ => return None,
    };
    let kind = if content.resent {
        kind | proto::frame::SUBMIT_FLAG_RESENT
    } else {
        kind
    };
    let fields = proto::frame::SubmitFields {
        stream,
        kind,
        version,
        epoch,
        session: event.session,
        sequence: event.sequence,
        low_water,
    };
    put_submit(out, &fields, content)
}

/// Appends a `Submit` frame of `fields` and `content`, all but a payload
/// of [`PAYLOAD_PART_MIN`] bytes or more, which it returns.
fn put_submit(
    out: &mut Vec<u8>,
    fields: &proto::frame::SubmitFields,
    content: &Content,
) -> Option<Bytes> {
    if content.payload.len() >= PAYLOAD_PART_MIN {
        fields.encode_head(out, &content.key, content.payload.len());
        return Some(content.payload.clone());
    }
    fields.encode(out, &content.key, &content.payload);
    None
}

/// The acks an `Acked` frame carries (at most `ACKED_RUN_MAX + 1`,
/// whatever the frame claims), onto `answers` as runs of at most
/// [`ANSWER_PIECE_MAX`] messages, so that one piece of answers stays short.
fn push_acks(client: u128, frame: Frame, answers: &mut Vec<(ServerId, Msg)>) {
    let Frame::Acked {
        server,
        session,
        sequence,
        version,
        epoch,
        flags,
        hint,
        more,
        ..
    } = frame
    else {
        return;
    };
    let duplicate = flags & proto::frame::ACKED_FLAG_DUPLICATE != 0;
    let hint = match hint {
        1 => Some(HybridMode::ServerSync),
        2 => Some(HybridMode::ClientAsync),
        _ => None,
    };
    let total = u64::from(more.min(proto::frame::ACKED_RUN_MAX)) + 1;
    let piece = ANSWER_PIECE_MAX as u64;
    for offset in (0..total).step_by(ANSWER_PIECE_MAX) {
        let event = EventId {
            client,
            session,
            sequence: sequence.saturating_add(offset),
        };
        let ack = Msg::Ack {
            event,
            version: version.saturating_add(offset),
            epoch,
            duplicate,
            hint,
            count: (total - offset).min(piece),
        };
        answers.push((server, ack));
    }
}

/// A publisher's window must be 1 to [`PUBLISHER_WINDOW_MAX`].
fn check_window(window: usize) -> Result<(), ClientError> {
    if (1..=PUBLISHER_WINDOW_MAX).contains(&window) {
        return Ok(());
    }
    Err(ClientError::Config(format!(
        "a window of {window} messages: it must be 1 to {PUBLISHER_WINDOW_MAX}, the unanswered messages of one session a server keeps for deduplication"
    )))
}

/// Asks every known server at once for the stream's placement whenever
/// the publisher wants it, and hands over the newest epoch among the
/// answers (within a second, and at most [`REFRESH_GRACE`] after the
/// first): a server cut off from the others still answers its clients,
/// from a view the cluster has left behind, so the first answer is not
/// enough, while a paused server never answers and must not hold up the
/// rest.
async fn run_refresher(
    name: String,
    addresses: Arc<Mutex<Vec<String>>>,
    links: ClientConfig,
    mut requests: mpsc::Receiver<()>,
    infos: mpsc::Sender<StreamInfo>,
) {
    while requests.recv().await.is_some() {
        let known: HashSet<String> = addresses
            .lock()
            .expect("addresses lock")
            .iter()
            .cloned()
            .collect();
        let mut asking = tokio::task::JoinSet::new();
        for address in known {
            let mut config = links.to(&address);
            config.connect_timeout = links.connect_timeout.min(Duration::from_secs(1));
            let name = name.clone();
            asking.spawn(async move {
                let client = Client::connect(config).await?;
                client.open_stream(&name).await
            });
        }
        let mut newest: Option<StreamInfo> = None;
        let mut deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        while let Ok(Some(answer)) = tokio::time::timeout_at(deadline, asking.join_next()).await {
            if let Ok(Ok(info)) = answer {
                if newest.is_none() {
                    deadline = deadline.min(tokio::time::Instant::now() + REFRESH_GRACE);
                }
                if newest.as_ref().is_none_or(|n| info.epoch > n.epoch) {
                    newest = Some(info);
                }
            }
        }
        asking.abort_all();
        if let Some(info) = newest {
            if infos.send(info).await.is_err() {
                return;
            }
        }
    }
}

/// A refusal code as the producer understands it; codes that a retry
/// cannot fix end the message with an error.
fn refusal_of(code: ErrorCode) -> Option<Refusal> {
    Some(match code {
        ErrorCode::VersionVoid => Refusal::VersionVoid,
        ErrorCode::NotPrimary => Refusal::NotPrimary,
        ErrorCode::Busy => Refusal::Busy,
        ErrorCode::LogFailed => Refusal::LogFailed,
        ErrorCode::ReadOnly => Refusal::ReadOnly,
        ErrorCode::SequenceRetired => Refusal::Rejected(engine::Rejection::Retired {
            sequence: 0,
            low_water: 0,
        }),
        ErrorCode::InvalidArgument
        | ErrorCode::MessageTooLarge
        | ErrorCode::UnknownStream
        | ErrorCode::Unauthorized => Refusal::Invalid,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_links_count_every_publishers_waiting_callers_until_answered_or_dropped() {
        let links = Arc::new(AtomicUsize::new(0));
        let mut first = Replies::counting_in(Arc::clone(&links));
        let mut second = Replies::counting_in(Arc::clone(&links));
        for sequence in 1..=3 {
            first.insert(sequence, oneshot::channel().0);
        }
        second.insert(10, oneshot::channel().0);
        assert_eq!((first.in_flight(), second.in_flight()), (4, 4));
        // Answered out of order, each counts off once; a repeat does not.
        assert!(first.remove(2).is_some());
        assert!(first.remove(2).is_none());
        assert!(first.remove(9).is_none());
        assert_eq!(links.load(Ordering::Relaxed), 3);
        assert!(first.remove(1).is_some());
        assert_eq!(second.in_flight(), 2);
        // A publisher dropped with callers waiting takes them off.
        drop(first);
        assert_eq!(links.load(Ordering::Relaxed), 1);
        assert!(second.remove(10).is_some());
        assert_eq!(links.load(Ordering::Relaxed), 0);
    }

    fn shared_of(window: usize) -> Shared {
        shared_on(3, 1, window)
    }

    /// A publisher of client 7 on `stream` with `session`, its one replica
    /// server 1.
    pub(super) fn shared_on(stream: u64, session: u64, window: usize) -> Shared {
        let placement = Placement {
            replicas: vec![1],
            primary: 1,
            epoch: 1,
        };
        let producer = Producer::new(
            7,
            session,
            Protocol::OneHopAckClient,
            placement,
            ProducerSettings::default(),
        );
        Shared {
            stream,
            name: format!("s{stream}"),
            client_id: 7,
            session,
            window_size: window,
            core: Mutex::new(Core::new(producer, Arc::default())),
            window: Semaphore::new(window),
            held_room: Notify::new(),
            held_bytes_max: usize::MAX,
            mode: AtomicU8::new(0),
            held: Held::default(),
            refusals: Mutex::default(),
            link_states: Mutex::default(),
            closed: AtomicBool::new(false),
            timer: Timer::default(),
        }
    }

    fn ack(sequence: u64) -> (ServerId, Msg) {
        let event = EventId {
            client: 7,
            session: 1,
            sequence,
        };
        let ack = Msg::Ack {
            event,
            version: sequence,
            epoch: 1,
            duplicate: false,
            hint: None,
            count: 1,
        };
        (1, ack)
    }

    #[tokio::test]
    async fn the_window_slides_over_sequences_and_opens_only_as_the_low_water_mark_passes() {
        let shared = shared_of(3);
        let mut pending = Vec::new();
        for _ in 0..3 {
            let (reply, answer) = oneshot::channel();
            shared.window.acquire().await.unwrap().forget();
            let mut core = shared.lock();
            let mut out = Vec::new();
            let event = core
                .producer
                .send(Bytes::new(), Bytes::from_static(b"x"), 0, &mut out);
            core.replies.insert(event.sequence, reply);
            pending.push(answer);
        }
        assert_eq!(shared.window.available_permits(), 0);
        // The second and third are done, the first is not: the callers
        // hear, but the window stays shut.
        shared.answers(vec![ack(2), ack(3)]).await;
        assert_eq!(shared.window.available_permits(), 0);
        let third = pending.pop().unwrap().await.unwrap().unwrap();
        assert_eq!(third.version, 3);
        shared.answers(vec![ack(1)]).await;
        assert_eq!(shared.window.available_permits(), 3);
        assert_eq!(pending.remove(0).await.unwrap().unwrap().version, 1);
    }

    #[test]
    fn an_acked_run_becomes_ack_runs_of_a_piece_each_and_no_further_than_the_bound() {
        let frame = |more| Frame::Acked {
            stream: 1,
            server: 3,
            session: 2,
            sequence: 10,
            version: 100,
            epoch: 4,
            flags: proto::frame::ACKED_FLAG_DUPLICATE,
            hint: 1,
            more,
        };
        let runs = |more| {
            let mut answers = Vec::new();
            push_acks(7, frame(more), &mut answers);
            answers
                .iter()
                .map(|(server, msg)| match msg {
                    Msg::Ack {
                        event,
                        version,
                        epoch: 4,
                        duplicate: true,
                        hint: Some(HybridMode::ServerSync),
                        count,
                    } if *server == 3 && event.client == 7 && event.session == 2 => {
                        (event.sequence, *version, *count)
                    }
                    other => panic!("unexpected answer {other:?}"),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(runs(2), vec![(10, 100, 3)]);
        let piece = ANSWER_PIECE_MAX as u64;
        assert_eq!(
            runs(piece as u32),
            vec![(10, 100, piece), (10 + piece, 100 + piece, 1)]
        );
        let longest = runs(u32::MAX);
        let total: u64 = longest.iter().map(|(_, _, count)| count).sum();
        assert_eq!(total, u64::from(proto::frame::ACKED_RUN_MAX) + 1);
        assert!(longest
            .windows(2)
            .all(|pair| pair[0].0 + pair[0].2 == pair[1].0 && pair[0].1 + pair[0].2 == pair[1].1));
    }

    fn confirm(server: ServerId, sequence: u64, version: u64) -> (Node, Msg) {
        let event = EventId {
            client: 1,
            session: 1,
            sequence,
        };
        let msg = Msg::Confirm {
            event,
            version,
            count: 1,
        };
        (Node::Server(server), msg)
    }

    #[test]
    fn consecutive_confirmations_to_one_server_travel_as_one_run() {
        let msgs = vec![
            confirm(1, 5, 10),
            confirm(1, 6, 11),
            confirm(1, 7, 12),
            // A version that does not follow starts a new run.
            confirm(1, 8, 20),
            // So does another server.
            confirm(2, 9, 21),
        ];
        let runs: Vec<(Node, u64, u64, u64)> = coalesce_confirms(msgs.into_iter())
            .into_iter()
            .map(|(node, msg)| match msg {
                Msg::Confirm {
                    event,
                    version,
                    count,
                } => (node, event.sequence, version, count),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            runs,
            vec![
                (Node::Server(1), 5, 10, 3),
                (Node::Server(1), 8, 20, 1),
                (Node::Server(2), 9, 21, 1),
            ]
        );
    }
}
