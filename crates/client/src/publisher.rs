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
//! background; the retry covers what it lost.
//!
//! Failover: when the link to the primary is down, or a server answers
//! `NotPrimary`, or messages time out, the publisher asks the servers it
//! knows for the stream's placement every [`REFRESH_INTERVAL`]; a newer
//! epoch moves every message not done to the new primary at once, with
//! the same event ids.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::replication::{
    Bytes, Completion, Content, HybridMode, Msg, Node, Placement, Producer, ProducerSettings,
    Protocol, Refusal, ServerId,
};
use proto::{ErrorCode, EventId, Frame, StreamInfo};
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::driver;
use crate::{ClientConfig, ClientError};

/// How often a publisher that suspects a failover asks for the placement.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(100);

/// Which replica links are up, by server.
type LinkStates = Arc<Mutex<HashMap<ServerId, bool>>>;

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
/// most this many unanswered messages of one session for deduplication
/// (`engine::DedupeLimits`). With more in flight, a message refused for a
/// full table could find it full at every retry, filled by the messages
/// sent after it, while the low-water mark that would empty it waits for
/// that very message.
pub const PUBLISHER_WINDOW_MAX: usize = 1 << 16;

/// Settings of a publisher.
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// Messages in flight at most, 1 to [`PUBLISHER_WINDOW_MAX`].
    pub window: usize,
    /// A message not done after this long is sent again.
    pub retry: Duration,
    /// The client id in the event ids; random when `None`.
    pub client_id: Option<u128>,
    /// The session (producer) number within the client.
    pub session: u64,
    pub connect_timeout: Duration,
    /// Sender-based logging: past this many bytes of acknowledged messages
    /// kept for the primary's next checkpoint, new sends wait.
    pub held_bytes_max: usize,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        PublisherConfig {
            window: 256,
            retry: Duration::from_millis(500),
            client_id: None,
            session: 1,
            connect_timeout: Duration::from_secs(5),
            held_bytes_max: 256 * 1024 * 1024,
        }
    }
}

enum Command {
    Send {
        /// The event id the handle predicted (the task's producer gives
        /// sequences in the order commands arrive).
        event: EventId,
        key: Vec<u8>,
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<Published, ClientError>>,
    },
}

/// The handle's side of the command queue: the next sequence and the
/// sender, under one lock so sequences enter the queue in order.
struct Queue {
    next_sequence: u64,
    commands: mpsc::UnboundedSender<Command>,
}

/// A replicated producer of one stream. Cheap to share behind an `Arc`;
/// dropping it stops its tasks (messages in flight are abandoned).
pub struct Publisher {
    queue: std::sync::Mutex<Queue>,
    session: u64,
    window: Arc<Semaphore>,
    client_id: u128,
    protocol: Protocol,
    mode: Arc<std::sync::atomic::AtomicU8>,
    held: Arc<Held>,
}

/// Sender-based logging: the done messages the task keeps until the
/// primary's checkpoint covers them, and their bytes.
#[derive(Default)]
struct Held {
    messages: std::sync::atomic::AtomicUsize,
    bytes: std::sync::atomic::AtomicUsize,
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
    /// `Client::open_stream` or `create_stream` returned it).
    pub async fn connect(
        info: &StreamInfo,
        config: PublisherConfig,
    ) -> Result<Publisher, ClientError> {
        let protocol = Protocol::from_code(info.protocol).ok_or_else(|| {
            ClientError::Protocol(format!("unknown protocol code {}", info.protocol))
        })?;
        if info.replicas.is_empty() {
            return Err(ClientError::Protocol("the stream has no replicas".into()));
        }
        if !(1..=PUBLISHER_WINDOW_MAX).contains(&config.window) {
            return Err(ClientError::Config(format!(
                "a window of {} messages: it must be 1 to {PUBLISHER_WINDOW_MAX}, the unanswered messages of one session a server keeps for deduplication",
                config.window
            )));
        }
        let placement = Placement {
            replicas: info.replicas.iter().map(|r| r.id).collect(),
            primary: info.primary,
            epoch: info.epoch,
        };
        let client_id = config.client_id.unwrap_or_else(proto::random_u128);
        let (incoming, incoming_receiver) = mpsc::channel(1024);
        let refusals: Refusals = Arc::default();
        let link_states: LinkStates = Arc::default();
        let mut links = HashMap::new();
        for replica in &info.replicas {
            let mut link_config = ClientConfig::new(replica.address.clone());
            link_config.connect_timeout = config.connect_timeout;
            // The first connection must succeed: a wrong address is an
            // error now, not an endless retry.
            let connection = driver::connect(&link_config, client_id).await?;
            let (outgoing, outgoing_receiver) = mpsc::channel(config.window.max(1) * 2 + 64);
            tokio::spawn(run_link(
                replica.id,
                link_config,
                (client_id, info.id),
                Some(connection),
                outgoing_receiver,
                incoming.clone(),
                Arc::clone(&refusals),
                Arc::clone(&link_states),
            ));
            links.insert(replica.id, outgoing);
        }
        let addresses: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(
            info.replicas.iter().map(|r| r.address.clone()).collect(),
        ));
        let (refresh, refresh_receiver) = mpsc::channel(1);
        let (infos, infos_receiver) = mpsc::channel(4);
        tokio::spawn(run_refresher(
            info.name.clone(),
            Arc::clone(&addresses),
            config.connect_timeout,
            refresh_receiver,
            infos,
        ));
        let producer = Producer::new(
            client_id,
            config.session,
            protocol,
            placement,
            ProducerSettings {
                retry_ms: config.retry.as_millis() as u64,
                sender_logging: matches!(info.durability, proto::DurabilityConfig::Sender { .. }),
            },
        );
        // Unbounded in type only: the window's permits bound it.
        let (commands, command_receiver) = mpsc::unbounded_channel();
        let window = Arc::new(Semaphore::new(config.window.max(1)));
        let mode = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let held = Arc::new(Held::default());
        let task = Task {
            stream: info.id,
            producer,
            links,
            incoming: incoming.clone(),
            link_states,
            addresses,
            refresh,
            suspect: false,
            refreshed_at: None,
            window_size: config.window.max(1),
            connect_timeout: config.connect_timeout,
            client_id,
            waiting: HashMap::new(),
            window: Arc::clone(&window),
            started: Instant::now(),
            mode: Arc::clone(&mode),
            refusals,
            held: Arc::clone(&held),
            held_bytes_max: config.held_bytes_max,
            completed: Vec::new(),
        };
        tokio::spawn(task.run(command_receiver, incoming_receiver, infos_receiver));
        Ok(Publisher {
            queue: std::sync::Mutex::new(Queue {
                next_sequence: 1,
                commands,
            }),
            session: config.session,
            window,
            client_id,
            protocol,
            mode,
            held,
        })
    }

    /// Sender-based logging (durability `sender`): the messages this
    /// publisher still keeps after they were acknowledged, until the
    /// primary's checkpoint covers them, and their key and payload bytes.
    pub fn held(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.held.messages.load(Relaxed),
            self.held.bytes.load(Relaxed),
        )
    }

    pub fn client_id(&self) -> u128 {
        self.client_id
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A `hybrid` stream's current mode as the primary last reported it.
    pub fn hybrid_mode(&self) -> Option<HybridMode> {
        match self.mode.load(std::sync::atomic::Ordering::Relaxed) {
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
        let permit = Arc::clone(&self.window)
            .acquire_owned()
            .await
            .map_err(|_| ClientError::Closed)?;
        permit.forget();
        let (reply, answer) = oneshot::channel();
        let mut queue = self.queue.lock().expect("publisher lock");
        let event = EventId {
            client: self.client_id,
            session: self.session,
            sequence: queue.next_sequence,
        };
        queue
            .commands
            .send(Command::Send {
                event,
                key: key.to_vec(),
                payload: payload.to_vec(),
                reply,
            })
            .map_err(|_| ClientError::Closed)?;
        queue.next_sequence += 1;
        Ok(PendingPublish { event, answer })
    }
}

struct Task {
    stream: u64,
    producer: Producer,
    links: HashMap<ServerId, mpsc::Sender<Vec<u8>>>,
    /// For links opened after a failover.
    incoming: mpsc::Sender<Vec<(ServerId, Msg)>>,
    link_states: LinkStates,
    /// Every server address seen, for placement requests.
    addresses: Arc<Mutex<Vec<String>>>,
    refresh: mpsc::Sender<()>,
    /// A failover may be under way: ask for the placement.
    suspect: bool,
    refreshed_at: Option<Instant>,
    window_size: usize,
    connect_timeout: Duration,
    client_id: u128,
    waiting: HashMap<u64, oneshot::Sender<Result<Published, ClientError>>>,
    window: Arc<Semaphore>,
    started: Instant,
    mode: Arc<std::sync::atomic::AtomicU8>,
    refusals: Refusals,
    held: Arc<Held>,
    held_bytes_max: usize,
    /// The producer's completions being answered; kept between calls.
    completed: Vec<Completion>,
}

/// The server's words for messages refused for good, by sequence, so the
/// caller's error says what the server said.
type Refusals = Arc<std::sync::Mutex<HashMap<u64, String>>>;

impl Task {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Sender-based logging: the copies kept for the primary's checkpoint
    /// fill their budget; new sends wait for the next checkpoint.
    fn held_full(&self) -> bool {
        self.producer.held().1 > self.held_bytes_max
    }

    async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut incoming: mpsc::Receiver<Vec<(ServerId, Msg)>>,
        mut infos: mpsc::Receiver<StreamInfo>,
    ) {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut out = Vec::new();
        let mut closed = false;
        loop {
            tokio::select! {
                command = commands.recv(), if !closed && !self.held_full() => match command {
                    Some(command) => {
                        let now = self.now();
                        self.take(command, now, &mut out);
                    }
                    None => closed = true,
                },
                batch = incoming.recv() => {
                    let Some(batch) = batch else { return };
                    self.answers(batch, &mut out);
                }
                Some(info) = infos.recv() => {
                    let now = self.now();
                    self.adopt(info, now, &mut out);
                }
                _ = tick.tick() => {
                    let now = self.now();
                    let before = out.len();
                    self.producer.on_tick(now, &mut out);
                    // Resends mean answers are missing.
                    self.suspect |= out.len() > before;
                    self.ask_placement();
                }
            }
            // Take whatever else is waiting before writing, so one write
            // per server carries many messages.
            let now = self.now();
            for _ in 0..1024 {
                if self.held_full() {
                    break;
                }
                match commands.try_recv() {
                    Ok(command) => self.take(command, now, &mut out),
                    Err(_) => break,
                }
            }
            while let Ok(batch) = incoming.try_recv() {
                // Let the callers the last batch completed run first: a
                // task this one woke waits in this worker's slot, which no
                // other worker takes over, until this task yields.
                tokio::task::yield_now().await;
                self.answers(batch, &mut out);
            }
            self.flush(&mut out).await;
            self.complete();
            let (messages, bytes) = self.producer.held();
            self.held
                .messages
                .store(messages, std::sync::atomic::Ordering::Relaxed);
            self.held
                .bytes
                .store(bytes, std::sync::atomic::Ordering::Relaxed);
            if closed && self.waiting.is_empty() {
                return;
            }
        }
    }

    /// Takes one batch of the servers' answers and completes the sends
    /// they finish at once, so a burst of acks (an output commit boundary)
    /// reaches the callers batch by batch rather than after the whole
    /// burst.
    fn answers(&mut self, batch: Vec<(ServerId, Msg)>, out: &mut Vec<(Node, Msg)>) {
        let now = self.now();
        for (from, msg) in batch {
            self.note(&msg);
            self.producer.on_message(from, msg, now, out);
        }
        self.complete();
    }

    /// A `NotPrimary` answer means the placement this producer knows is
    /// stale.
    fn note(&mut self, msg: &Msg) {
        if let Msg::Refused {
            refusal: Refusal::NotPrimary,
            ..
        } = msg
        {
            self.suspect = true;
        }
    }

    /// Asks for the placement while a failover may be under way.
    fn ask_placement(&mut self) {
        let primary = self.producer.placement().primary;
        let primary_down = !self
            .link_states
            .lock()
            .expect("link states lock")
            .get(&primary)
            .copied()
            .unwrap_or(false);
        if !(self.suspect || primary_down) {
            return;
        }
        if self
            .refreshed_at
            .is_some_and(|at| at.elapsed() < REFRESH_INTERVAL)
        {
            return;
        }
        self.refreshed_at = Some(Instant::now());
        let _ = self.refresh.try_send(());
    }

    /// A placement from a server: a newer epoch (or a changed replica set)
    /// moves the messages not done there.
    fn adopt(&mut self, info: StreamInfo, now: u64, out: &mut Vec<(Node, Msg)>) {
        let current = self.producer.placement();
        if info.id != self.stream || info.epoch < current.epoch || info.primary == 0 {
            return;
        }
        let placement = Placement {
            replicas: info.replicas.iter().map(|r| r.id).collect(),
            primary: info.primary,
            epoch: info.epoch,
        };
        if &placement == current {
            self.suspect = false;
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
            if self.links.contains_key(&replica.id) {
                continue;
            }
            let mut link_config = ClientConfig::new(replica.address.clone());
            link_config.connect_timeout = self.connect_timeout;
            let (outgoing, outgoing_receiver) = mpsc::channel(self.window_size * 2 + 64);
            tokio::spawn(run_link(
                replica.id,
                link_config,
                (self.client_id, self.stream),
                None,
                outgoing_receiver,
                self.incoming.clone(),
                Arc::clone(&self.refusals),
                Arc::clone(&self.link_states),
            ));
            self.links.insert(replica.id, outgoing);
        }
        self.suspect = false;
        self.producer.reconfigure(placement, now, out);
    }

    fn take(&mut self, command: Command, now: u64, out: &mut Vec<(Node, Msg)>) {
        let Command::Send {
            event,
            key,
            payload,
            reply,
        } = command;
        let id = self
            .producer
            .send(Bytes::from(key), Bytes::from(payload), now, out);
        debug_assert_eq!(id, event, "the handle predicts the producer's sequence");
        self.waiting.insert(id.sequence, reply);
    }

    async fn flush(&mut self, out: &mut Vec<(Node, Msg)>) {
        let mut frames: HashMap<ServerId, Vec<u8>> = HashMap::new();
        for (node, msg) in coalesce_confirms(out.drain(..)) {
            let Node::Server(server) = node else { continue };
            encode_submit(frames.entry(server).or_default(), self.stream, &msg);
        }
        for (server, bytes) in frames {
            if let Some(link) = self.links.get(&server) {
                // A full or broken link drops the frame: the retry resends.
                let _ = link.try_send(bytes);
            }
        }
    }

    fn complete(&mut self) {
        let mode = match self.producer.hybrid_mode() {
            HybridMode::ServerSync => 1,
            HybridMode::ClientAsync => 2,
        };
        if self.producer.protocol() == Protocol::Hybrid {
            self.mode.store(mode, std::sync::atomic::Ordering::Relaxed);
        }
        let mut completed = std::mem::take(&mut self.completed);
        self.producer.drain_completed(&mut completed);
        if completed.is_empty() {
            self.completed = completed;
            return;
        }
        // One release of the window for the lot, not one per message.
        self.window.add_permits(completed.len());
        for Completion { event, outcome } in completed.drain(..) {
            let Some(reply) = self.waiting.remove(&event.sequence) else {
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
            let _ = reply.send(result);
        }
        // Kept, with its room, for the next burst.
        self.completed = completed;
    }
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

/// Appends a client-to-server `Msg` as a `Submit` frame, encoded straight
/// from the shared key and payload.
fn encode_submit(out: &mut Vec<u8>, stream: u64, msg: &Msg) {
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
        _ => return,
    };
    let kind = if content.resent {
        kind | proto::frame::SUBMIT_FLAG_RESENT
    } else {
        kind
    };
    proto::frame::SubmitFields {
        stream,
        kind,
        version,
        epoch,
        session: event.session,
        sequence: event.sequence,
        low_water,
    }
    .encode(out, &content.key, &content.payload);
}

/// A server's answer frame as a `Msg` for the producer.
/// The acks an `Acked` frame carries, one per message of its run (at most
/// `ACKED_RUN_MAX + 1`, whatever the frame claims), onto `answers`.
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
    for offset in 0..=u64::from(more.min(proto::frame::ACKED_RUN_MAX)) {
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
        };
        answers.push((server, ack));
    }
}

/// Asks the known servers, one after another, for the stream's placement
/// whenever the publisher wants it.
async fn run_refresher(
    name: String,
    addresses: Arc<Mutex<Vec<String>>>,
    timeout: Duration,
    mut requests: mpsc::Receiver<()>,
    infos: mpsc::Sender<StreamInfo>,
) {
    while requests.recv().await.is_some() {
        let known = addresses.lock().expect("addresses lock").clone();
        let mut asked = HashSet::new();
        for address in known {
            if !asked.insert(address.clone()) {
                continue;
            }
            let mut config = ClientConfig::new(address);
            config.connect_timeout = timeout.min(Duration::from_secs(1));
            let answer = tokio::time::timeout(Duration::from_secs(1), async {
                let client = crate::Client::connect(config).await?;
                client.open_stream(&name).await
            })
            .await;
            if let Ok(Ok(info)) = answer {
                if infos.send(info).await.is_err() {
                    return;
                }
                break;
            }
        }
    }
}

/// Bytes of answers one read takes.
const ANSWER_READ_BYTES: usize = 32 * 1024;

/// Answers handed to the publisher's task at once: a burst of acks (an
/// output commit boundary releasing thousands, which a server sends as a
/// few runs of a frame each) reaches the producer, and the callers, in
/// pieces of this many rather than all at once.
const ANSWER_PIECE_MAX: usize = 512;

/// Keeps one connection to one replica: writes what the producer sends,
/// reads answers and hands them over in batches, reconnects when broken.
#[allow(clippy::too_many_arguments)]
async fn run_link(
    server: ServerId,
    config: ClientConfig,
    (client, stream): (u128, u64),
    first: Option<driver::Connection>,
    mut outgoing: mpsc::Receiver<Vec<u8>>,
    incoming: mpsc::Sender<Vec<(ServerId, Msg)>>,
    refusals: Refusals,
    states: LinkStates,
) {
    let mut connection = first;
    let mut delay = config.reconnect_delay_min;
    let set_up = |up: bool| {
        states.lock().expect("link states lock").insert(server, up);
    };
    loop {
        let current = match connection.take() {
            Some(current) => current,
            None => match driver::connect(&config, client).await {
                Ok(current) => {
                    delay = config.reconnect_delay_min;
                    current
                }
                Err(_) => {
                    set_up(false);
                    if incoming.is_closed() {
                        return;
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(config.reconnect_delay_max);
                    continue;
                }
            },
        };
        set_up(true);
        let driver::Connection {
            mut reader,
            mut writer,
            mut buffer,
            ..
        } = current;
        let mut scratch = vec![0u8; ANSWER_READ_BYTES];
        let mut batch = Vec::with_capacity(256 * 1024);
        loop {
            tokio::select! {
                bytes = outgoing.recv() => {
                    let Some(bytes) = bytes else { return };
                    batch.clear();
                    batch.extend_from_slice(&bytes);
                    while batch.len() < 1024 * 1024 {
                        match outgoing.try_recv() {
                            Ok(more) => batch.extend_from_slice(&more),
                            Err(_) => break,
                        }
                    }
                    if writer.write_all(&batch).await.is_err() {
                        break;
                    }
                }
                read = driver::read_some(&mut reader, &mut scratch, &mut buffer) => {
                    match read {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let mut answers = Vec::new();
                    loop {
                        match buffer.next_frame(64 * 1024 * 1024) {
                            Ok(Some(Frame::Stamped { session, sequence, version, epoch, flags, .. })) => {
                                answers.push((server, Msg::Stamped {
                                    event: EventId { client, session, sequence },
                                    version,
                                    epoch,
                                    duplicate: flags & proto::frame::ACKED_FLAG_DUPLICATE != 0,
                                }));
                            }
                            Ok(Some(Frame::Refused { session, sequence, code, message, .. })) => {
                                let event = EventId { client, session, sequence };
                                let refusal = refusal_of(code);
                                if matches!(refusal, Some(Refusal::Invalid | Refusal::LogFailed | Refusal::ReadOnly | Refusal::Rejected(_))) {
                                    let mut said = refusals.lock().expect("refusals lock");
                                    // Bounded: one entry per message in flight.
                                    if said.len() < 65_536 {
                                        said.insert(sequence, message);
                                    }
                                }
                                if let Some(refusal) = refusal {
                                    answers.push((server, Msg::Refused { event, refusal }));
                                }
                            }
                            Ok(Some(Frame::Checkpointed { stream: of, version, flags })) => {
                                // Notes of other streams reach every client.
                                if of == stream {
                                    answers.push((server, Msg::Checkpointed {
                                        through: version,
                                        resend: flags & proto::frame::CHECKPOINTED_FLAG_RESEND != 0,
                                    }));
                                }
                            }
                            Ok(Some(frame)) => push_acks(client, frame, &mut answers),
                            Ok(None) => break,
                            Err(_) => break,
                        }
                    }
                    let mut answers = answers.into_iter();
                    loop {
                        let piece: Vec<_> = answers.by_ref().take(ANSWER_PIECE_MAX).collect();
                        if piece.is_empty() {
                            break;
                        }
                        if incoming.send(piece).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }
        set_up(false);
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
        ErrorCode::InvalidArgument | ErrorCode::MessageTooLarge | ErrorCode::UnknownStream => {
            Refusal::Invalid
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acked_run_expands_to_one_ack_per_message_and_no_further_than_the_bound() {
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
        let mut answers = Vec::new();
        push_acks(7, frame(2), &mut answers);
        let versions: Vec<(u64, u64)> = answers
            .iter()
            .map(|(server, msg)| match msg {
                Msg::Ack {
                    event,
                    version,
                    epoch: 4,
                    duplicate: true,
                    hint: Some(HybridMode::ServerSync),
                } if *server == 3 && event.client == 7 && event.session == 2 => {
                    (event.sequence, *version)
                }
                other => panic!("unexpected answer {other:?}"),
            })
            .collect();
        assert_eq!(versions, vec![(10, 100), (11, 101), (12, 102)]);
        answers.clear();
        push_acks(7, frame(u32::MAX), &mut answers);
        assert_eq!(
            answers.len() as u64,
            u64::from(proto::frame::ACKED_RUN_MAX) + 1
        );
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
