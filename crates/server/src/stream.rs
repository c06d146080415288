//! One stream on this server: its log, its versioning state machine, and
//! the append path that ties them together.

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use engine::replication::{
    Bytes, Effect, Entry, Msg, Node, Placement, Protocol, Replica, ServerId,
};
use proto::DurabilityConfig;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use wal::{AppendError, Durability, Log, LogConfig, LogError, ReadError, Retention};

use crate::config::ServerConfig;
use crate::replication::{ControlEvent, Router};

/// The file in a stream's folder that describes it.
pub const META_FILE: &str = "stream.json";
/// Longest stream name.
const NAME_BYTES_MAX: usize = 128;

/// What is persisted about a stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamMeta {
    pub format: u32,
    pub id: u64,
    pub name: String,
    pub durability: String,
    pub pages: u16,
    pub page_size: u32,
    /// Replication protocol name (`one-hop-ack-client` when absent).
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// The replica set's server ids (this server alone when absent).
    #[serde(default)]
    pub replicas: Vec<ServerId>,
    /// The primary's server id (0: this server).
    #[serde(default)]
    pub primary: ServerId,
    #[serde(default = "default_epoch")]
    pub epoch: u64,
    /// Retention: keep at least this many bytes of log; absent: the
    /// server's `retain_bytes`; 0: no size limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_bytes: Option<u64>,
    /// Retention: delete segments closed this long ago; absent: the
    /// server's `retain_ms`; 0: no age limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_ms: Option<u64>,
    /// The output commit interval in milliseconds (0: none; absent in
    /// files written before it existed).
    #[serde(default)]
    pub commit_interval_ms: u32,
}

fn default_protocol() -> String {
    Protocol::OneHopAckClient.name().to_string()
}

fn default_epoch() -> u64 {
    1
}

impl StreamMeta {
    pub fn new(
        id: u64,
        name: &str,
        durability: DurabilityConfig,
        protocol: Protocol,
        placement: &Placement,
    ) -> Self {
        let (mode, pages, page_size) = durability.parts();
        StreamMeta {
            format: 1,
            id,
            name: name.to_string(),
            durability: mode.to_string(),
            pages,
            page_size,
            protocol: protocol.name().to_string(),
            replicas: placement.replicas.clone(),
            primary: placement.primary,
            epoch: placement.epoch,
            commit_interval_ms: 0,
            retain_bytes: None,
            retain_ms: None,
        }
    }

    /// The stream's retention: its own settings, else the server's.
    pub fn retention(&self, config: &ServerConfig) -> Retention {
        Retention {
            bytes: self.retain_bytes.unwrap_or(config.retain_bytes),
            ms: self.retain_ms.unwrap_or(config.retain_ms),
        }
    }

    pub fn protocol(&self) -> Result<Protocol, String> {
        self.protocol.parse()
    }

    /// The stream's placement; a meta file from a single server (no
    /// replica list) places the stream on `me` alone.
    pub fn placement(&self, me: ServerId) -> Placement {
        if self.replicas.is_empty() {
            return Placement {
                replicas: vec![me],
                primary: me,
                epoch: self.epoch,
            };
        }
        Placement {
            replicas: self.replicas.clone(),
            primary: if self.primary == 0 { me } else { self.primary },
            epoch: self.epoch,
        }
    }

    pub fn durability(&self) -> Result<DurabilityConfig, String> {
        DurabilityConfig::from_parts(&self.durability, self.pages, self.page_size)
    }
}

/// Why a stream name is not acceptable, or `None` when it is.
pub fn stream_name_error(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Some(format!("stream names are 1 to {NAME_BYTES_MAX} bytes long"));
    }
    if name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Some(format!(
            "stream name {name:?} may hold only letters, digits, '.', '_' and '-', and may not start with '.'"
        ));
    }
    None
}

/// Why a message was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SubmitFailure {
    #[error("the stream was deleted")]
    Deleted,
    #[error("the stream's log has failed and takes no more writes: {0}")]
    LogFailed(Arc<str>),
    #[error("the stream's log is too far behind; retry")]
    Busy,
    /// The requirement is not met and the loss action is `read-only` (or
    /// `block` past its timeout).
    #[error("the stream is read-only until its requirement is met again: {0}")]
    ReadOnly(String),
    /// The requirement is not met and writes wait (`block`).
    #[error("the stream's writes wait until its requirement is met again ({0}); retry")]
    Blocked(String),
    /// The requirement is not met and the loss action is `reconnect`.
    #[error("the stream's requirement is not met ({0}); reconnect later")]
    Reconnect(String),
}

/// Whether a stream takes writes, as the control plane last said, and
/// since when (this server's clock).
struct Gate {
    availability: control::Availability,
    since: Instant,
}

/// Milliseconds on the server's monotonic clock, as the state machines see
/// time.
pub fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// When the tick task must next wake for the output commit interval: the
/// state machine says when (`Replica::wake_at`), and a step that needs an
/// earlier wake than the one the task sleeps toward wakes it.
#[derive(Debug)]
struct BoundaryTimer {
    wake: Notify,
    /// The time (`now_ms`) the tick task sleeps toward; `u64::MAX`: none.
    scheduled: AtomicU64,
}

/// The replication state and the records waiting for room in the log.
struct Core {
    replica: Replica,
    /// Records the log had no room for yet, in version order: every later
    /// record waits behind them.
    backlog: VecDeque<Entry>,
    backlog_bytes: usize,
}

pub struct Stream {
    /// Set once the stream is deleted: messages are refused from then on.
    deleted: AtomicBool,
    /// The highest durable version the state machine has been told of
    /// (`sync` streams), so the progress task skips what the log's durable
    /// hook already drove.
    logged_driven: AtomicU64,
    pub id: u64,
    pub name: String,
    pub durability: DurabilityConfig,
    pub protocol: Protocol,
    pub folder: PathBuf,
    pub log: Log,
    core: Mutex<Core>,
    visible: watch::Sender<u64>,
    router: Arc<Router>,
    backlog_bytes_max: usize,
    gate: Mutex<Gate>,
    /// What the log keeps behind its newest checkpoints.
    pub retention: Retention,
    /// The version of the newest checkpoint written (or recovered from).
    checkpointed: AtomicU64,
    /// The first version a peer last asked for below the oldest retained
    /// one with no checkpoint to send instead, so the condition is logged
    /// once, not at every retry.
    retained_asked: AtomicU64,
    /// Checkpoint transfers: the version sent to each replica, and when,
    /// so a replica that asks again at every gap timeout while the state
    /// is on its way does not get it again at once.
    transfers: Mutex<HashMap<ServerId, (u64, Instant)>>,
    /// The largest peer frame: a checkpoint's state must fit in one.
    peer_frame_bytes_max: usize,
    /// The checkpoint task, awaited at shutdown: a checkpoint being
    /// written holds the stream, and the log must be closed before the
    /// server returns.
    checkpoint_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The log-progress and clock tasks, awaited at shutdown too: one
    /// of them may be driving the state machine (holding the stream) on
    /// another worker when `stop` fires.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Ends the checkpoint task when the stream is deleted: at once if it
    /// waits, after the checkpoint it writes otherwise (the permit of
    /// `notify_one` waits for it), so no checkpoint file appears in a
    /// folder being removed.
    deleting: Arc<Notify>,
    boundary_timer: Arc<BoundaryTimer>,
    /// Sender-based logging: the clients that sent messages here, told of
    /// each checkpoint so they drop the copies it covers (bounded; a
    /// client past the bound keeps its copies until a restart of this
    /// server asks for them, or the stream's next placement).
    senders: Mutex<HashSet<u128>>,
}

/// Clients a sender-based stream tells of its checkpoints, at most.
const SENDERS_MAX: usize = 65_536;

/// A replica that asked for versions this log no longer keeps gets the
/// checkpoint again after this long at the earliest.
const TRANSFER_REPEAT: Duration = Duration::from_secs(2);
/// Room in a peer frame for everything but a checkpoint's state.
const TRANSFER_FRAME_OVERHEAD: usize = 64;

/// Work a state machine step asks for that runs once the stream's lock is
/// released (a log read), or that takes the lock itself (a reset).
enum Later {
    Serve {
        to: ServerId,
        from: u64,
        to_version: u64,
    },
    Install {
        through: u64,
        state: Bytes,
    },
}

pub fn log_config(durability: DurabilityConfig, config: &ServerConfig) -> LogConfig {
    LogConfig {
        durability: match durability {
            DurabilityConfig::Memory => Durability::Memory,
            DurabilityConfig::Sync => Durability::Sync,
            // Sender-based logging writes its log through the page buffer:
            // the clients' copies, not a sync per message, cover a crash.
            DurabilityConfig::Paged { pages, page_size }
            | DurabilityConfig::Sender { pages, page_size } => Durability::Paged {
                pages: pages as usize,
                page_size: page_size as usize,
            },
        },
        segment_bytes_max: config.segment_bytes_max,
        pending_bytes_max: config.pending_bytes_max,
        page_flush_interval: config.page_flush_interval,
        memory_retain_bytes: config.memory_retain_bytes,
        sample_latency: config.sample_log_latency,
    }
}

impl Stream {
    /// Opens (and recovers) the stream described by `meta` in `folder`,
    /// placed as `placement` says (the control plane's word) or else as
    /// its meta file says.
    pub fn open(
        meta: &StreamMeta,
        folder: &Path,
        config: &ServerConfig,
        router: Arc<Router>,
        placement: Option<Placement>,
    ) -> Result<Stream, String> {
        let durability = meta.durability()?;
        let protocol = meta.protocol()?;
        let placement = placement.unwrap_or_else(|| meta.placement(config.cluster.me));
        if !placement.replicas.contains(&config.cluster.me) {
            return Err(format!(
                "this server ({}) is not in the stream's replica set {:?}",
                config.cluster.me, placement.replicas
            ));
        }
        let log_config = log_config(durability, config);
        let record_max = config.message_bytes_max + proto::RECORD_HEADER_LEN;
        if log_config.record_bytes_max() < record_max {
            let setting = match durability {
                DurabilityConfig::Paged { .. } | DurabilityConfig::Sender { .. } => {
                    "raise the stream's page_size"
                }
                DurabilityConfig::Sync => "raise the server's pending_bytes_max",
                DurabilityConfig::Memory => "raise the server's memory_retain_bytes",
            };
            return Err(format!(
                "this durability holds records of at most {} bytes, less than a message of {} bytes needs; {setting}",
                log_config.record_bytes_max(),
                record_max
            ));
        }
        let mut settings = config.replication;
        settings.dedupe = engine::DedupeLimits::default();
        settings.commit_interval_ms = u64::from(meta.commit_interval_ms);
        settings.sender_logging = matches!(durability, DurabilityConfig::Sender { .. });
        let replica = Replica::new(meta.id, config.cluster.me, placement, protocol, settings);
        // Recovery starts from the newest usable checkpoint's state and
        // replays only the records after it.
        let replica = std::cell::RefCell::new(replica);
        let (log, report) = Log::open_checkpointed(
            config.storage.clone(),
            &folder.join("log"),
            meta.id,
            log_config,
            &mut |state| {
                replica
                    .borrow_mut()
                    .restore(state)
                    .map(|_| ())
                    .map_err(|error| error.to_string())
            },
            &mut |record| replica.borrow_mut().recovered(&record.header),
        )
        .map_err(|error: LogError| error.to_string())?;
        let replica = replica.into_inner();
        for skipped in &report.ignored {
            eprintln!(
                "stamplog: stream {:?}: checkpoint not used: {skipped}",
                meta.name
            );
        }
        if let Some(through) = report.checkpoint {
            eprintln!(
                "stamplog: stream {:?} recovered from its checkpoint at version {through}, replaying {} records after it",
                meta.name, report.records_visited
            );
        }
        let stream = Stream {
            deleted: AtomicBool::new(false),
            logged_driven: AtomicU64::new(0),
            id: meta.id,
            name: meta.name.clone(),
            durability,
            protocol,
            folder: folder.to_path_buf(),
            log,
            core: Mutex::new(Core {
                replica,
                backlog: VecDeque::new(),
                backlog_bytes: 0,
            }),
            visible: watch::channel(0).0,
            router,
            backlog_bytes_max: config.log_backlog_bytes_max,
            gate: Mutex::new(Gate {
                availability: control::Availability::Available,
                since: Instant::now(),
            }),
            retention: meta.retention(config),
            checkpointed: AtomicU64::new(report.checkpoint.unwrap_or(0)),
            retained_asked: AtomicU64::new(0),
            transfers: Mutex::new(HashMap::new()),
            peer_frame_bytes_max: config.peer_frame_bytes_max(),
            checkpoint_task: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
            deleting: Arc::new(Notify::new()),
            boundary_timer: Arc::new(BoundaryTimer {
                wake: Notify::new(),
                scheduled: AtomicU64::new(u64::MAX),
            }),
            senders: Mutex::new(HashSet::new()),
        };
        stream.drive(|replica, now, out| replica.start(now, out));
        Ok(stream)
    }

    /// Whether the stream uses sender-based message logging.
    pub fn is_sender_logged(&self) -> bool {
        matches!(self.durability, DurabilityConfig::Sender { .. })
    }

    /// Sender-based logging: this server restarted with the stream; as its
    /// primary it takes its clients' copies back before it stamps again
    /// (see `Replica::recover_senders`). Clients are asked as they connect.
    pub fn recover_senders(&self) {
        if self.is_sender_logged() {
            let checkpointed = self.checkpointed();
            self.lock().replica.recover_senders(now_ms(), checkpointed);
        }
    }

    /// Sender-based logging: what a client that has just connected is
    /// told: the checkpoint, and whether to resend what it holds past it.
    pub fn checkpoint_note(&self) -> Option<Msg> {
        if !self.is_sender_logged() {
            return None;
        }
        self.lock()
            .replica
            .sender_recovering()
            .then(|| Msg::Checkpointed {
                through: self.checkpointed(),
                resend: true,
            })
    }

    /// Sender-based logging: says what a restart's recovery took back,
    /// once it is over.
    fn report_sender_recovery(&self) {
        let core = self.lock();
        if core.replica.sender_recovering() {
            return;
        }
        let metrics = core.replica.metrics();
        eprintln!(
            "stamplog: stream {:?}: sender recovery done: {} messages put back at the versions their clients held, {} versions voided in all, log at version {}",
            self.name,
            metrics.resent_placed,
            metrics.voided,
            core.replica.last_version()
        );
    }

    /// Sender-based logging: tells the stream's clients that the newest
    /// checkpoint covers `through`.
    fn announce_checkpoint(&self, through: u64) {
        if !self.is_sender_logged() || !self.lock().replica.is_primary() {
            return;
        }
        let senders: Vec<u128> = self
            .senders
            .lock()
            .expect("senders lock")
            .iter()
            .copied()
            .collect();
        for client in senders {
            let note = Msg::Checkpointed {
                through,
                resend: false,
            };
            self.router.send_client(client, self.id, vec![note]);
        }
    }

    /// The newest version readers of this replica may see.
    pub fn visible_version(&self) -> u64 {
        *self.visible.borrow()
    }

    /// Watches the visible version.
    pub fn visible(&self) -> watch::Receiver<u64> {
        self.visible.subscribe()
    }

    /// Where the stream lives now (the replicas are the live ones).
    pub fn placement(&self) -> Placement {
        self.lock().replica.placement().clone()
    }

    /// The control plane moved the stream: see `Replica::reconfigure`.
    pub fn reconfigure(&self, placement: Placement, in_sync: &[ServerId], consider: &[ServerId]) {
        self.drive(|replica, now, out| replica.reconfigure(placement, in_sync, consider, now, out));
    }

    /// The control plane's word on whether the stream takes writes (its
    /// requirement, and the loss action while it is not met).
    pub fn set_availability(&self, availability: &control::Availability) {
        let mut gate = self.gate.lock().expect("gate lock");
        if &gate.availability != availability {
            eprintln!(
                "stamplog: stream {:?} is now {}",
                self.name,
                control::state::describe(availability)
            );
            gate.availability = availability.clone();
            gate.since = Instant::now();
        }
    }

    /// Why writes are refused now, if they are.
    fn gate_failure(&self) -> Option<SubmitFailure> {
        use control::{Availability, LossAction};
        let gate = self.gate.lock().expect("gate lock");
        let Availability::Degraded { action, why } = &gate.availability else {
            return None;
        };
        Some(match action {
            LossAction::ReadOnly => SubmitFailure::ReadOnly(why.clone()),
            LossAction::Block { timeout_ms } => {
                let waited = gate.since.elapsed();
                if waited < Duration::from_millis(*timeout_ms) {
                    SubmitFailure::Blocked(why.clone())
                } else {
                    SubmitFailure::ReadOnly(format!("{why}; blocked for more than {timeout_ms} ms"))
                }
            }
            LossAction::Reconnect => SubmitFailure::Reconnect(why.clone()),
        })
    }

    /// The control plane recorded the epoch this primary announced.
    pub fn epoch_recorded(&self, epoch: u64) {
        self.drive(|replica, now, out| replica.epoch_recorded(epoch, now, out));
    }

    /// Whether a new primary waits for its epoch to be recorded (or for
    /// its replicas' tails).
    pub fn is_rejoining(&self) -> bool {
        self.lock().replica.is_rejoining()
    }

    /// Backups counting toward acknowledgements.
    pub fn counting(&self) -> Vec<ServerId> {
        self.lock().replica.counting().collect()
    }

    /// The state machine's view, for status.
    pub fn replication_status(&self) -> serde_json::Value {
        let core = self.lock();
        let replica = &core.replica;
        let metrics = replica.metrics();
        let placement = replica.placement();
        serde_json::json!({
            "protocol": self.protocol.name(),
            "primary": placement.primary,
            "replicas": placement.replicas,
            "epoch": placement.epoch,
            "counting": replica.counting().collect::<Vec<_>>(),
            "rejoining": replica.is_rejoining(),
            "is_primary": replica.is_primary(),
            "last_version": replica.last_version(),
            "logged_version": replica.logged(),
            "committed_version": replica.committed(),
            "visible_version": replica.visible(),
            "held": replica.held(),
            "backlog_records": core.backlog.len(),
            "hybrid_mode": (self.protocol == Protocol::Hybrid).then(|| format!("{:?}", replica.hybrid_mode())),
            "active_clients": replica.active_clients(),
            "duplicates": metrics.duplicates,
            "conflicts": metrics.conflicts,
            "voided": metrics.voided,
            "gap_requests": metrics.gap_requests,
            "overflow_drops": metrics.overflow_drops,
            "resent_placed": metrics.resent_placed,
            "sender_recovering": replica.sender_recovering(),
            "awaiting_confirmation": replica.awaiting_confirmation(),
            "commit_interval_ms": replica.commit_interval_ms(),
            "pending_acks": replica.pending_acks(),
            "pending_acks_peak": metrics.pending_acks_peak,
        })
    }

    /// The output commit interval in milliseconds (0: none).
    pub fn commit_interval_ms(&self) -> u32 {
        self.lock().replica.commit_interval_ms() as u32
    }

    /// Acknowledgements the state machine holds back (waiting for the log,
    /// the other replicas or an output commit boundary).
    pub fn pending_acks(&self) -> usize {
        self.lock().replica.pending_acks()
    }

    pub fn dedupe_entries(&self) -> usize {
        self.lock().replica.dedupe_entries()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Core> {
        self.core.lock().expect("stream lock poisoned")
    }

    /// Refuses every later message, then waits (up to `timeout`) until the
    /// log has written what it holds. Blocking; for the delete path.
    pub fn close_for_delete(&self, timeout: Duration) {
        {
            // Under the core lock, so no message is halfway through.
            let _core = self.lock();
            self.deleted.store(true, Ordering::Release);
        }
        self.deleting.notify_one();
        let deadline = std::time::Instant::now() + timeout;
        while self.log.durable_version() < self.log.last_version()
            && self.log.failure().is_none()
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.log.clear_on_durable();
        // A checkpoint being written finishes first; then the task ends.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.block_on(self.stop_checkpoints());
        }
    }

    /// A message from a client (its id is the connection's).
    pub fn submit(&self, client: u128, msg: Msg) -> Result<(), SubmitFailure> {
        self.submit_many(client, vec![msg])
            .map_err(|(failure, _)| failure)
    }

    /// Messages from a client, taken in one step; on refusal they come
    /// back with the reason.
    pub fn submit_many(
        &self,
        client: u128,
        msgs: Vec<Msg>,
    ) -> Result<(), (SubmitFailure, Vec<Msg>)> {
        if self.deleted.load(Ordering::Acquire) {
            return Err((SubmitFailure::Deleted, msgs));
        }
        if let Some(failure) = self.log.failure() {
            return Err((SubmitFailure::LogFailed(failure), msgs));
        }
        if let Some(failure) = self.gate_failure() {
            return Err((failure, msgs));
        }
        if self.lock().backlog_bytes > self.backlog_bytes_max {
            return Err((SubmitFailure::Busy, msgs));
        }
        if self.is_sender_logged() {
            let mut senders = self.senders.lock().expect("senders lock");
            if senders.len() < SENDERS_MAX {
                senders.insert(client);
            }
        }
        // Many messages in hand: the reader is busy, and its sends go to
        // the flushers rather than costing it a write each.
        let busy = msgs.len() > 1;
        net::deferring(busy, || {
            self.drive(|replica, now, out| replica.on_clients(client, msgs, now, out))
        });
        Ok(())
    }

    /// Replication messages from a peer, taken in one step.
    pub fn on_peer_many(&self, from: ServerId, msgs: Vec<Msg>) {
        if self.deleted.load(Ordering::Acquire) {
            return;
        }
        let busy = msgs.len() > 1
            || msgs
                .iter()
                .any(|msg| matches!(msg, Msg::Replicate { entries } if entries.len() > 1));
        net::deferring(busy, || self.on_peer_step(from, msgs));
    }

    fn on_peer_step(&self, from: ServerId, msgs: Vec<Msg>) {
        self.drive(|replica, now, out| {
            for msg in msgs {
                if let Msg::Replicate { entries } = &msg {
                    // A record of another stream is never logged here.
                    if entries.iter().any(|e| e.header.stream != self.id) {
                        continue;
                    }
                }
                replica.on_peer(from, msg, now, out);
            }
        });
    }

    /// Runs the state machine under the lock and carries out its effects.
    fn drive(&self, step: impl FnOnce(&mut Replica, u64, &mut Vec<Effect>)) {
        let later = self.step(step);
        self.run_later(later);
    }

    /// The log made `durable` durable and has nothing else to write: runs
    /// on the log's I/O thread (the hook `start_tasks` sets), so the
    /// acknowledgements it releases leave from there, written at once to
    /// an idle connection, with no wake-up of another thread. Work that
    /// reads or resets the log goes to the runtime: the I/O thread must
    /// not wait on its own log.
    fn logged(self: &Arc<Self>, durable: u64, runtime: &tokio::runtime::Handle) {
        let later = self.step(|replica, now, out| replica.on_logged(durable, now, out));
        self.logged_driven.fetch_max(durable, Ordering::AcqRel);
        if !later.is_empty() {
            let stream = Arc::clone(self);
            runtime.spawn(async move { stream.run_later(later) });
        }
    }

    /// One step of the state machine under the lock, its effects carried
    /// out; returns the work left for after the lock.
    fn step(&self, step: impl FnOnce(&mut Replica, u64, &mut Vec<Effect>)) -> Vec<Later> {
        let mut later = Vec::new();
        {
            let mut core = self.lock();
            let now = now_ms();
            let mut effects = Vec::new();
            step(&mut core.replica, now, &mut effects);
            self.apply(&mut core, effects, now, &mut later);
            if let Some(at) = core.replica.wake_at() {
                if at < self.boundary_timer.scheduled.load(Ordering::Acquire) {
                    self.boundary_timer.wake.notify_one();
                }
            }
        }
        later
    }

    /// Carries out what a step left for after the lock.
    fn run_later(&self, later: Vec<Later>) {
        for work in later {
            match work {
                Later::Serve {
                    to,
                    from,
                    to_version,
                } => self.serve(to, from, to_version),
                Later::Install { through, state } => self.install(through, state),
            }
        }
    }

    fn apply(&self, core: &mut Core, mut effects: Vec<Effect>, now: u64, later: &mut Vec<Later>) {
        let immediate = self.durability != DurabilityConfig::Sync;
        // Messages for each client go in one note.
        let mut to_clients: Vec<(u128, Vec<Msg>)> = Vec::new();
        let mut appends = Vec::new();
        while !effects.is_empty() {
            let mut appended = false;
            for effect in std::mem::take(&mut effects) {
                match effect {
                    // After the step's sends: a record leaves for the other
                    // replicas before this log's I/O thread is woken for it.
                    Effect::Append(entry) => appends.push(entry),
                    Effect::Send(Node::Server(to), msg) => self.router.send_peer(to, self.id, msg),
                    Effect::Send(Node::Client(client), msg) => {
                        match to_clients.iter_mut().find(|(c, _)| *c == client) {
                            Some((_, msgs)) => msgs.push(msg),
                            None => to_clients.push((client, vec![msg])),
                        }
                    }
                    Effect::Serve {
                        to,
                        from,
                        to_version,
                    } => later.push(Later::Serve {
                        to,
                        from,
                        to_version,
                    }),
                    Effect::Install { through, state } => {
                        later.push(Later::Install { through, state })
                    }
                    Effect::Visible(version) => {
                        // Readers read the log up to it: it holds the
                        // records first.
                        for entry in appends.drain(..) {
                            appended |= self.append(core, entry);
                        }
                        self.visible.send_replace(version);
                    }
                    Effect::EpochStarted {
                        epoch,
                        first_version,
                        members,
                    } => self.router.control_event(ControlEvent::EpochStarted {
                        stream: self.name.clone(),
                        epoch,
                        first_version,
                        members,
                    }),
                    Effect::InSync(server) => self.router.control_event(ControlEvent::InSync {
                        stream: self.name.clone(),
                        epoch: core.replica.epoch(),
                        server,
                        join_view: self.router.peer_incarnation(server),
                    }),
                }
            }
            for entry in appends.drain(..) {
                appended |= self.append(core, entry);
            }
            if immediate && appended {
                // `memory` and `paged` acknowledge what the log buffer took.
                let through = self.log.last_version();
                core.replica.on_logged(through, now, &mut effects);
            }
        }
        for (client, msgs) in to_clients {
            self.router.send_client(client, self.id, msgs);
        }
    }

    /// Hands a record to the log, or to the backlog when the log is full
    /// (or the backlog already holds earlier records). `true` when the log
    /// took it.
    fn append(&self, core: &mut Core, entry: Entry) -> bool {
        if core.backlog.is_empty() {
            match self.log.append(entry.version(), &entry.bytes) {
                Ok(()) => return true,
                Err(AppendError::Full) => {}
                Err(AppendError::TooLarge { length, limit }) => {
                    eprintln!(
                        "stamplog: stream {}: record of {length} bytes exceeds the log's limit of {limit}; the log stops here",
                        self.name
                    );
                    return false;
                }
                Err(AppendError::Failed(_)) => return false,
            }
        }
        core.backlog_bytes += entry.bytes.len();
        core.backlog.push_back(entry);
        false
    }

    /// Moves backlogged records into the log as room frees.
    fn drain_backlog(&self) {
        let mut core = self.lock();
        let mut appended = false;
        while let Some(entry) = core.backlog.front() {
            match self.log.append(entry.version(), &entry.bytes) {
                Ok(()) => {
                    let entry = core.backlog.pop_front().expect("present");
                    core.backlog_bytes -= entry.bytes.len();
                    appended = true;
                }
                Err(_) => break,
            }
        }
        if appended && self.durability != DurabilityConfig::Sync {
            let now = now_ms();
            let mut effects = Vec::new();
            let through = self.log.last_version();
            core.replica.on_logged(through, now, &mut effects);
            let mut later = Vec::new();
            self.apply(&mut core, effects, now, &mut later);
            drop(core);
            self.run_later(later);
        }
    }

    /// Sends a peer the records it asked for (from the log, off the lock).
    fn serve(&self, to: ServerId, from: u64, to_version: u64) {
        const SERVE_BYTES_MAX: usize = 4 * 1024 * 1024;
        let mut records = Vec::new();
        let count = (to_version + 1).saturating_sub(from) as usize;
        let read = match self.log.read(from, count, SERVE_BYTES_MAX, &mut records) {
            Ok(read) => read,
            Err(ReadError::Retained { oldest, .. }) => {
                // The replica is behind the retained log: it catches up
                // from the newest checkpoint instead.
                self.transfer_checkpoint(to, from, oldest);
                return;
            }
            Err(_) => return,
        };
        if read == 0 {
            return;
        }
        let entries = crate::replication::entries_of(Bytes::from(records), false);
        self.router
            .send_peer(to, self.id, Msg::Replicate { entries });
    }

    /// Sends a replica that asked for versions from `from`, older than the
    /// oldest this log keeps (`oldest`), the newest checkpoint in their
    /// place: the state as of a version V that the log follows from V + 1
    /// (retention keeps every version after the oldest kept checkpoint),
    /// so the replica asks for the rest by the usual `Need`. Only a
    /// primary sends one; not again to the same replica within
    /// `TRANSFER_REPEAT`; never a state larger than a peer frame may carry.
    fn transfer_checkpoint(&self, to: ServerId, from: u64, oldest: u64) {
        if !self.lock().replica.is_primary() {
            return;
        }
        let mut transfers = self.transfers.lock().expect("transfers lock");
        if transfers
            .get(&to)
            .is_some_and(|(_, at)| at.elapsed() < TRANSFER_REPEAT)
        {
            return;
        }
        let found = self
            .log
            .newest_checkpoint()
            .filter(|(through, _)| through + 1 >= oldest);
        let Some((through, state)) = found else {
            if self.retained_asked.swap(from, Ordering::Relaxed) != from {
                eprintln!(
                    "stamplog: stream {:?}: server {to} asks for version {from}, but this log keeps versions from {oldest} only and has no checkpoint to send in their place; that replica cannot catch up yet",
                    self.name
                );
            }
            return;
        };
        let limit = self.peer_frame_bytes_max - TRANSFER_FRAME_OVERHEAD;
        if state.len() > limit {
            if self.retained_asked.swap(from, Ordering::Relaxed) != from {
                eprintln!(
                    "stamplog: stream {:?}: server {to} asks for version {from}, but this log keeps versions from {oldest} only, and the state of the checkpoint at version {through} ({} bytes) is larger than a peer frame may carry ({limit} bytes); that replica cannot catch up",
                    self.name,
                    state.len()
                );
            }
            return;
        }
        let before = transfers.insert(to, (through, Instant::now()));
        drop(transfers);
        if before.is_none_or(|(sent, _)| sent != through) {
            eprintln!(
                "stamplog: stream {:?}: server {to} asks for version {from}, but this log keeps versions from {oldest} only; sending it the checkpoint at version {through} ({} bytes) instead",
                self.name,
                state.len()
            );
        }
        self.router.send_peer(
            to,
            self.id,
            Msg::Checkpoint {
                through,
                state: Bytes::from(state),
            },
        );
    }

    /// Installs the state of the primary's checkpoint at `through` (see
    /// `Effect::Install`): checks it, resets the log to start at
    /// `through + 1` with a checkpoint holding it, then hands it to the
    /// state machine, which asks for the versions after it. Takes the
    /// stream's lock throughout, so nothing is appended meanwhile; the
    /// reset blocks on a few syncs (the runtime is told, see `blocking`).
    fn install(&self, through: u64, state: Bytes) {
        let mut core = self.lock();
        if through <= core.replica.last_version() {
            return;
        }
        let machine = match core.replica.decode_install(&state) {
            Ok(machine) => machine,
            Err(error) => {
                eprintln!(
                    "stamplog: stream {:?}: the primary's checkpoint at version {through} was refused: {error}",
                    self.name
                );
                return;
            }
        };
        // What waited for room in the log is older than the checkpoint.
        core.backlog.clear();
        core.backlog_bytes = 0;
        let held = self.log.last_version();
        if let Err(error) = blocking(|| self.log.reset(through, &state, wall_clock_ms())) {
            eprintln!(
                "stamplog: stream {:?}: could not install the primary's checkpoint at version {through}: {error}",
                self.name
            );
            return;
        }
        self.checkpointed.fetch_max(through, Ordering::AcqRel);
        eprintln!(
            "stamplog: stream {:?}: installed the primary's checkpoint at version {through} ({} bytes) in place of the versions up to it (this log held up to {held}); it now starts at version {}",
            self.name,
            state.len(),
            self.log.first_version()
        );
        let now = now_ms();
        let mut effects = Vec::new();
        core.replica.install(machine, now, &mut effects);
        let mut later = Vec::new();
        self.apply(&mut core, effects, now, &mut later);
        drop(core);
        self.run_later(later);
    }

    /// The state machine's state as a checkpoint would hold it: its
    /// version and bytes (the same state always gives the same bytes).
    pub fn machine_state(&self) -> (u64, Vec<u8>) {
        self.lock().replica.checkpoint_state()
    }

    /// The version of the newest checkpoint written or recovered from.
    pub fn checkpointed(&self) -> u64 {
        self.checkpointed.load(Ordering::Acquire)
    }

    /// Writes a checkpoint of the state machine, then applies retention.
    /// Returns the checkpoint's version, or `None` when there was nothing
    /// new, or the version did not become durable and visible within
    /// `wait`.
    pub async fn checkpoint(
        self: &Arc<Self>,
        retention: Retention,
        wait: Duration,
    ) -> Result<Option<u64>, String> {
        match self.checkpoint_ready(wait).await {
            Some((through, state)) => self.write_checkpoint(through, state, retention).await,
            None => Ok(None),
        }
    }

    /// Copies the state machine's state under the stream's lock, then
    /// waits (off the lock) until the version it reflects is durable and
    /// visible: a version readers may not see yet could still be cut back
    /// after a failover. `None` when there is nothing new to checkpoint or
    /// the wait ran out.
    async fn checkpoint_ready(&self, wait: Duration) -> Option<(u64, Vec<u8>)> {
        if self.durability == DurabilityConfig::Memory || self.deleted.load(Ordering::Acquire) {
            return None;
        }
        let (through, state) = self.lock().replica.checkpoint_state();
        if through == 0 || through <= self.checkpointed() {
            return None;
        }
        let mut visible = self.visible();
        let mut progress = self.log.progress();
        let reached = tokio::time::timeout(wait, async {
            let durable = progress.wait_for(|p| p.durable >= through || p.failed.is_some());
            let durable = durable.await.map(|p| p.failed.is_none()).unwrap_or(false);
            durable && visible.wait_for(|v| *v >= through).await.is_ok()
        })
        .await;
        (reached == Ok(true)).then_some((through, state))
    }

    /// Writes the checkpoint and applies retention on a blocking thread,
    /// without the stream's lock.
    async fn write_checkpoint(
        self: &Arc<Self>,
        through: u64,
        state: Vec<u8>,
        retention: Retention,
    ) -> Result<Option<u64>, String> {
        let stream = Arc::clone(self);
        let retained = tokio::task::spawn_blocking(move || {
            let now = wall_clock_ms();
            stream.log.checkpoint(through, &state, now)?;
            stream.checkpointed.fetch_max(through, Ordering::AcqRel);
            stream.log.retain(retention, now)
        })
        .await
        .map_err(|error| format!("the checkpoint task failed: {error}"))?
        .map_err(|error| error.to_string())?;
        self.announce_checkpoint(through);
        self.report_retention(&retained);
        Ok(Some(through))
    }

    /// Applies retention without a new checkpoint, on a blocking thread.
    async fn apply_retention(
        self: &Arc<Self>,
        retention: Retention,
    ) -> Result<Option<u64>, String> {
        let stream = Arc::clone(self);
        let retained =
            tokio::task::spawn_blocking(move || stream.log.retain(retention, wall_clock_ms()))
                .await
                .map_err(|error| format!("the retention task failed: {error}"))?
                .map_err(|error| error.to_string())?;
        self.report_retention(&retained);
        Ok(None)
    }

    fn report_retention(&self, retained: &wal::Retained) {
        if retained.segments_deleted > 0 {
            eprintln!(
                "stamplog: stream {:?}: retention deleted {} segments ({} bytes); the log now starts at version {}",
                self.name, retained.segments_deleted, retained.bytes_deleted, retained.first_version
            );
        }
    }

    /// Waits for the checkpoint task to end (it ends once `stop` fires),
    /// so no checkpoint holds the stream after the server stops.
    pub(crate) async fn stop_checkpoints(&self) {
        let task = self.checkpoint_task.lock().expect("task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }

    /// Waits for every background task of the stream to end (each ends
    /// once `stop` fires), so none holds the stream, and with it the log,
    /// after the server stops.
    pub(crate) async fn stop_tasks(&self) {
        // Waits for a hook call under way: from here on the I/O thread
        // holds the stream no more, so the last holder closes the log.
        self.log.clear_on_durable();
        self.stop_checkpoints().await;
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("task lock"));
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Starts the stream's background work: log progress into the state
    /// machine, clock ticks, the backlog and checkpoints. Each task ends
    /// when the stream is dropped or `stop` fires.
    pub(crate) fn start_tasks(
        self: &Arc<Self>,
        tick: Duration,
        checkpoints: CheckpointSchedule,
        stop: watch::Receiver<bool>,
    ) {
        let checkpoints = if self.is_sender_logged() {
            CheckpointSchedule {
                interval: checkpoints.sender_interval,
                ..checkpoints
            }
        } else {
            checkpoints
        };
        if self.durability != DurabilityConfig::Memory && checkpoints.is_on() {
            let weak = Arc::downgrade(self);
            let stopping = stop.clone();
            let deleting = Arc::clone(&self.deleting);
            let task = tokio::spawn(run_checkpoints(weak, checkpoints, stopping, deleting));
            *self.checkpoint_task.lock().expect("task lock") = Some(task);
        }
        if self.durability == DurabilityConfig::Sync {
            // Acknowledgements leave from the log's I/O thread itself.
            let weak = Arc::downgrade(self);
            let runtime = tokio::runtime::Handle::current();
            self.log.on_durable(move |durable, busy| {
                // With the next batch waiting, the I/O thread goes on to it
                // and the progress task takes this one, on another thread.
                if busy {
                    return;
                }
                if let Some(stream) = weak.upgrade() {
                    stream.logged(durable, &runtime);
                }
            });
        }
        let weak = Arc::downgrade(self);
        let mut progress = self.log.progress();
        let mut stopping = stop.clone();
        let progress_task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = progress.changed() => if changed.is_err() { return },
                    _ = stopping.wait_for(|s| *s) => return,
                }
                let current = progress.borrow_and_update().clone();
                let Some(stream) = weak.upgrade() else {
                    return;
                };
                if let Some(failure) = current.failed {
                    stream.router.broadcast_failure(stream.id, failure);
                    return;
                }
                match stream.durability {
                    // The durable hook drove it already, unless the log was
                    // busy (the hook leaves it to this task then) or the
                    // version moved another way (a checkpoint transfer's
                    // reset).
                    DurabilityConfig::Sync
                        if current.durable > stream.logged_driven.load(Ordering::Acquire) =>
                    {
                        stream.drive(|replica, now, out| {
                            replica.on_logged(current.durable, now, out)
                        });
                        stream
                            .logged_driven
                            .fetch_max(current.durable, Ordering::AcqRel);
                    }
                    DurabilityConfig::Sender { .. } => stream
                        .drive(|replica, now, out| replica.on_synced(current.durable, now, out)),
                    _ => {}
                }
            }
        });
        let weak: Weak<Stream> = Arc::downgrade(self);
        let mut stopping = stop;
        let timer = Arc::clone(&self.boundary_timer);
        let clock_task = tokio::spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                // The next output commit boundary, if a version waits for
                // one; a step that needs an earlier one wakes this task
                // (none is missed while it reads: `scheduled` says none).
                timer.scheduled.store(u64::MAX, Ordering::Release);
                let wake_at = match weak.upgrade() {
                    Some(stream) => stream.lock().replica.wake_at(),
                    None => return,
                };
                timer
                    .scheduled
                    .store(wake_at.unwrap_or(u64::MAX), Ordering::Release);
                let boundary = async {
                    match wake_at {
                        Some(at) => {
                            let wait = at.saturating_sub(now_ms());
                            tokio::time::sleep(Duration::from_millis(wait)).await
                        }
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = interval.tick() => {}
                    _ = boundary => {}
                    _ = timer.wake.notified() => continue,
                    _ = stopping.wait_for(|s| *s) => return,
                }
                let Some(stream) = weak.upgrade() else {
                    return;
                };
                stream.drain_backlog();
                let recovering = stream.lock().replica.sender_recovering();
                stream.drive(|replica, now, out| replica.on_tick(now, out));
                if recovering {
                    stream.report_sender_recovery();
                }
            }
        });
        let mut tasks = self.tasks.lock().expect("task lock");
        tasks.retain(|task| !task.is_finished());
        tasks.extend([progress_task, clock_task]);
    }
}

/// Runs `work`, which blocks on disk I/O, telling a multi-threaded tokio
/// runtime first so it moves this worker's other tasks elsewhere meanwhile
/// (on any other thread it just runs).
fn blocking<R>(work: impl FnOnce() -> R) -> R {
    let multi_threaded = tokio::runtime::Handle::try_current()
        .is_ok_and(|handle| handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi_threaded {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

/// Milliseconds since the Unix epoch: checkpoints date the segments they
/// see closed with it, and age retention counts from there, across
/// restarts.
pub fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64)
}

/// When a stream writes checkpoints.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CheckpointSchedule {
    /// Zero: never by time.
    pub interval: Duration,
    /// Versions logged since the last checkpoint that call for the next
    /// one (0: never by count).
    pub records: u64,
    /// The interval of `sender` streams, whose clients hold copies until
    /// a checkpoint covers them.
    pub sender_interval: Duration,
}

impl CheckpointSchedule {
    pub(crate) fn of(config: &ServerConfig) -> Self {
        CheckpointSchedule {
            interval: config.checkpoint_interval,
            records: config.checkpoint_records,
            sender_interval: config.sender_checkpoint_interval,
        }
    }

    fn is_on(&self) -> bool {
        !self.interval.is_zero() || self.records > 0
    }
}

/// How often the checkpoint task looks at the record count.
const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

/// A stream's checkpoint task: a checkpoint every interval, or sooner once
/// enough versions were logged, then retention.
async fn run_checkpoints(
    weak: Weak<Stream>,
    schedule: CheckpointSchedule,
    mut stopping: watch::Receiver<bool>,
    deleting: Arc<Notify>,
) {
    let poll = if schedule.interval.is_zero() {
        CHECKPOINT_POLL
    } else {
        schedule.interval.min(CHECKPOINT_POLL)
    };
    let mut last = Instant::now();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(poll) => {}
            _ = stopping.wait_for(|s| *s) => return,
            _ = deleting.notified() => return,
        }
        let Some(stream) = weak.upgrade() else {
            return;
        };
        if stream.deleted.load(Ordering::Acquire) || stream.log.failure().is_some() {
            return;
        }
        let due_by_time = !schedule.interval.is_zero() && last.elapsed() >= schedule.interval;
        let logged = stream
            .log
            .durable_version()
            .saturating_sub(stream.checkpointed());
        let due_by_count = schedule.records > 0 && logged >= schedule.records;
        if !due_by_time && !due_by_count {
            continue;
        }
        last = Instant::now();
        let wait = schedule.interval.max(CHECKPOINT_POLL);
        // The wait for durability ends at once on stop; a checkpoint
        // being written is finished.
        let ready = tokio::select! {
            ready = stream.checkpoint_ready(wait) => ready,
            _ = stopping.wait_for(|s| *s) => return,
        };
        let written = match ready {
            Some((through, state)) => {
                stream
                    .write_checkpoint(through, state, stream.retention)
                    .await
            }
            // Nothing new to checkpoint: segments still age out of an
            // idle stream.
            None if stream.retention.ms > 0 && due_by_time => {
                stream.apply_retention(stream.retention).await
            }
            None => continue,
        };
        if let Err(error) = written {
            eprintln!(
                "stamplog: stream {:?}: checkpoint failed: {error}",
                stream.name
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Peer;
    use proto::{EventId, Record, RecordHeader};

    /// Writes a log of `count` records of stream 5 into `folder` with the
    /// wal directly, with checkpoints (holding the state machine's state)
    /// at `checkpoints`, then retention that keeps as little as it may.
    fn retained_log(
        storage: &wal::fault::FaultStorage,
        folder: &Path,
        count: u64,
        checkpoints: &[u64],
    ) {
        let config = LogConfig {
            segment_bytes_max: 4096,
            ..LogConfig::default()
        };
        let log = Log::open(Arc::new(storage.clone()), folder, 5, config, &mut |_| {}).unwrap();
        let mut machine = engine::StreamMachine::new(1, engine::DedupeLimits::default());
        for version in 1..=count {
            let header = RecordHeader {
                flags: 0,
                stream: 5,
                version,
                epoch: 1,
                event: EventId {
                    client: 9,
                    session: 1,
                    sequence: version,
                },
                low_water: version,
            };
            let mut bytes = Vec::new();
            Record {
                header,
                key: b"",
                payload: &[7; 500],
            }
            .encode(&mut bytes);
            log.append(version, &bytes).unwrap();
            machine.record(&header);
            while log.durable_version() < version {
                std::thread::sleep(Duration::from_micros(50));
            }
            if checkpoints.contains(&version) {
                log.checkpoint(version, &machine.encode_state(), 0).unwrap();
            }
        }
        log.retain(Retention { bytes: 1, ms: 0 }, 0).unwrap();
        assert!(log.first_version() > 1);
    }

    /// A stream of `storage`'s folder `/data/streams/s`, on server `me`
    /// of the replica set `replicas` whose primary is server 1.
    fn open_stream(
        storage: &wal::fault::FaultStorage,
        me: ServerId,
        replicas: Vec<ServerId>,
    ) -> (Stream, Arc<Router>) {
        let folder = Path::new("/data/streams/s");
        let mut config = ServerConfig::new("/data");
        config.storage = Arc::new(storage.clone());
        config.segment_bytes_max = 4096;
        config.cluster.me = me;
        config.cluster.peers = [1, 2]
            .into_iter()
            .filter(|&id| id != me)
            .map(|id| Peer {
                id,
                address: "127.0.0.1:9".into(),
            })
            .collect();
        let router = Arc::new(Router::new(&config.cluster, 16));
        let placement = Placement {
            replicas,
            primary: 1,
            epoch: 1,
        };
        let meta = StreamMeta::new(
            5,
            "s",
            DurabilityConfig::Sync,
            Protocol::OneHopAckClient,
            &placement,
        );
        let stream = Stream::open(&meta, folder, &config, Arc::clone(&router), None).unwrap();
        (stream, router)
    }

    #[test]
    fn a_peer_asking_for_a_retained_version_gets_the_newest_checkpoint_and_installs_it() {
        let storage = wal::fault::FaultStorage::new();
        retained_log(&storage, Path::new("/data/streams/s/log"), 40, &[20, 30]);
        let (stream, router) = open_stream(&storage, 1, vec![1]);
        assert_eq!(
            stream.checkpointed(),
            30,
            "recovered from the newest checkpoint"
        );
        assert_eq!(stream.machine_state().0, 40);
        let oldest = stream.log.first_version();
        assert!(oldest > 1 && oldest <= 21, "the log starts at {oldest}");
        let sent = || router.metrics.peer_sent.load(Ordering::Relaxed);
        stream.serve(2, 1, 10);
        stream.serve(2, 1, 10);
        assert_eq!(sent(), 1, "the checkpoint goes once, not at every ask");
        let frames = router.take_queued(2);
        assert_eq!(frames.len(), 1);
        let (frame, _) = proto::Frame::decode(&frames[0], 1 << 26).unwrap().unwrap();
        let proto::Frame::Peer {
            stream: 5,
            message: proto::PeerMessage::Checkpoint { through, state },
        } = frame
        else {
            panic!("not a checkpoint transfer: {frame:?}");
        };
        assert_eq!(through, 30, "the newest checkpoint");
        assert_eq!(Some((30, state.clone())), stream.log.newest_checkpoint());
        stream.serve(2, oldest, oldest + 3);
        assert_eq!(sent(), 2, "what the log keeps is served");

        // The replica (server 2, holding nothing) installs it.
        let replica_storage = wal::fault::FaultStorage::new();
        let (replica, _replica_router) = open_stream(&replica_storage, 2, vec![1, 2]);
        replica.on_peer_many(
            1,
            vec![Msg::Checkpoint {
                through,
                state: Bytes::from(state),
            }],
        );
        assert_eq!(replica.machine_state().0, 30);
        assert_eq!(replica.log.first_version(), 31);
        assert_eq!(replica.log.durable_version(), 30);
        assert_eq!(replica.checkpointed(), 30);
        let mut out = Vec::new();
        assert_eq!(
            replica.log.read(12, 10, 1 << 20, &mut out),
            Err(ReadError::Retained {
                requested: 12,
                oldest: 31
            })
        );
        // The records after the checkpoint come by the usual path.
        let mut records = Vec::new();
        let count = stream.log.read(31, 10, 1 << 20, &mut records).unwrap();
        assert_eq!(count, 10);
        let entries = crate::replication::entries_of(Bytes::from(records), false);
        replica.on_peer_many(1, vec![Msg::Replicate { entries }]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while replica.log.durable_version() < 40 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(replica.log.durable_version(), 40);
        assert_eq!(replica.machine_state(), stream.machine_state());
        drop(replica);
        // A restart recovers from the installed checkpoint.
        let (reopened, _) = open_stream(&replica_storage, 2, vec![1, 2]);
        assert_eq!(reopened.checkpointed(), 30);
        assert_eq!(reopened.machine_state(), stream.machine_state());
    }

    #[test]
    fn a_checkpoint_larger_than_a_peer_frame_is_not_sent() {
        let storage = wal::fault::FaultStorage::new();
        retained_log(&storage, Path::new("/data/streams/s/log"), 40, &[20, 30]);
        let (mut stream, router) = open_stream(&storage, 1, vec![1]);
        let (_, state) = stream.log.newest_checkpoint().unwrap();
        stream.peer_frame_bytes_max = TRANSFER_FRAME_OVERHEAD + state.len() - 1;
        stream.serve(2, 1, 10);
        assert_eq!(router.metrics.peer_sent.load(Ordering::Relaxed), 0);
        assert_eq!(
            stream.retained_asked.load(Ordering::Relaxed),
            1,
            "said once"
        );
        stream.peer_frame_bytes_max = TRANSFER_FRAME_OVERHEAD + state.len();
        stream.serve(2, 1, 10);
        assert_eq!(router.metrics.peer_sent.load(Ordering::Relaxed), 1);
    }
}
