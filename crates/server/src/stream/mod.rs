//! One stream on this server: its log, its versioning state machine, and
//! the append path that ties them together.

mod checkpoints;
mod meta;
mod sends;
mod tasks;
mod transfer;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use engine::replication::{
    AckRule, Bytes, ClusterView, Effect, Entry, HybridMode, Msg, Node, Placement, Protocol,
    Replica, ServerId,
};
use proto::DurabilityConfig;
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Notify};
use wal::{AppendError, Durability, Log, LogConfig, ReadError, Retention};

use crate::config::ServerConfig;
use crate::error::{CheckpointError, StreamOpenError};
use crate::replication::{ControlEvent, Router};
use sends::{Outbox, Sends};

/// A stream's way to the router, for its steps' messages.
struct RouterOutbox<'a> {
    router: &'a Router,
    stream: u64,
}

impl Outbox for RouterOutbox<'_> {
    fn to_peers(&self, to: &[ServerId], msg: &Msg) {
        self.router.send_peers(to, self.stream, msg);
    }
    fn to_client(&self, client: u128, msgs: Vec<Msg>) {
        self.router.send_client(client, self.stream, msgs);
    }
    fn between(&self) {
        std::thread::yield_now();
    }
}

pub(crate) use checkpoints::CheckpointSchedule;
pub use meta::{stream_name_error, StreamMeta, META_FILE};

/// Why a message was not taken.
#[derive(Debug, thiserror::Error)]
pub enum SubmitFailure {
    #[error("the stream was deleted")]
    Deleted,
    #[error("the stream's log has failed and takes no more writes: {0}")]
    LogFailed(Arc<str>),
    /// This replica's log failed, and the stream has others: the control
    /// plane moves it to one of them (a primary hands over), where the
    /// client sends again.
    #[error("this replica's log has failed ({0}); the stream goes on at another replica")]
    Moving(Arc<str>),
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
    /// The stream's in-sync replicas as the cluster last said (sorted),
    /// so each change is logged once.
    in_sync: Vec<ServerId>,
}

/// Milliseconds on the server's monotonic clock, as the state machines see
/// time.
pub fn now_ms() -> u64 {
    clock_start().elapsed().as_millis() as u64
}

/// The instant a time of [`now_ms`] stands for.
fn instant_of_ms(ms: u64) -> Instant {
    clock_start() + Duration::from_millis(ms)
}

/// The start of the state machines' time, and of the clocks' beats.
fn clock_start() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

/// When the tick task must next wake. For the output commit interval: the
/// state machine says when (`Replica::wake_at`), and a step that needs an
/// earlier wake than the one the task sleeps toward wakes it. And while
/// the stream is quiet (`Core::quiet_until`) the task rests until its
/// next heartbeat rather than ticking every tick (`run_clock`).
#[derive(Debug)]
struct ClockTimer {
    wake: Notify,
    /// The time (`now_ms`) the tick task sleeps toward; `u64::MAX`: none.
    scheduled: AtomicU64,
    /// While the stream is quiet: the time (`now_ms`) the tick task rests
    /// until, set under the stream's lock; 0 while it ticks every tick.
    rests_until: AtomicU64,
}

impl ClockTimer {
    /// After a change to the replica (under the stream's lock), while the
    /// tick task rests: a replica no longer quiet, or that needs its clock
    /// sooner (a backup that became the primary owes a heartbeat now),
    /// wakes it. A rest starts only at a tick, so this wakes the task at
    /// most once a tick, however many messages a busy stream takes.
    fn rouse(&self, core: &Core) {
        let rests_until = self.rests_until.load(Ordering::Acquire);
        if rests_until == 0 {
            return;
        }
        if core.quiet_until().is_none_or(|at| at < rests_until) {
            self.rests_until.store(0, Ordering::Release);
            self.wake.notify_one();
        }
    }
}

/// The replication state and the records waiting for room in the log.
struct Core {
    replica: Replica,
    /// Records the log had no room for yet, in version order: every later
    /// record waits behind them.
    backlog: VecDeque<Entry>,
    backlog_bytes: usize,
}

impl Core {
    /// When the stream's clock next has work, if none before its next
    /// heartbeat (`Replica::quiet_until`): records waiting for room in the
    /// log are the clock's too.
    fn quiet_until(&self) -> Option<u64> {
        match self.backlog.is_empty() {
            true => self.replica.quiet_until(),
            false => None,
        }
    }
}

/// A stream's replication numbers at one instant (`Stream::gauges`).
#[derive(Clone, Debug)]
pub struct StreamGauges {
    pub last_version: u64,
    pub committed_version: u64,
    pub is_primary: bool,
    pub epoch: u64,
    /// Acknowledgements held back (the log, the other replicas, or an
    /// output commit boundary).
    pub pending_acks: usize,
    /// Sender-based logging: versions given to clients whose copies are
    /// not yet confirmed durable here.
    pub awaiting_confirmation: usize,
    /// Messages held back (out of order, unbound, reserved).
    pub held: usize,
    /// Writes answered from the dedupe table (a retry got its original
    /// version).
    pub duplicates: u64,
    pub dedupe_entries: usize,
    /// A `hybrid` stream: whether its primary now runs client-async
    /// (else server-sync).
    pub hybrid_client_async: Option<bool>,
}

pub struct Stream {
    /// Set once the stream is deleted: messages are refused from then on.
    deleted: AtomicBool,
    /// The highest durable version the state machine has been told of
    /// (`sync` streams), so the progress task skips what the log's durable
    /// hook already drove.
    logged_driven: AtomicU64,
    /// The log failed and the stream has other replicas: on this server
    /// it hears and sends nothing more, as if its process had left (the
    /// control plane moves the stream on; `Command::LogFailed`).
    stopped: AtomicBool,
    /// Ticks the clock gave the replica (`run_clock`).
    clock_ticks: AtomicU64,
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
    clock_timer: Arc<ClockTimer>,
    /// The next version of each subscription reading this stream (its
    /// lag, for the metrics); a finished one's is dropped.
    readers: Mutex<Vec<Weak<AtomicU64>>>,
}

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
        observer: config.log_observer.clone(),
        journal: config.journal.clone(),
    }
}

/// The log settings of a stream of `durability`, refused when they cannot
/// hold a record of the largest message the server takes.
fn checked_log_config(
    durability: DurabilityConfig,
    config: &ServerConfig,
) -> Result<LogConfig, StreamOpenError> {
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
        return Err(StreamOpenError::RecordTooLarge {
            limit: log_config.record_bytes_max(),
            needed: record_max,
            setting,
        });
    }
    Ok(log_config)
}

/// Opens a stream's log into `replica`: from the newest usable
/// checkpoint's state, replaying only the records after it.
fn recover(
    replica: Replica,
    meta: &StreamMeta,
    folder: &Path,
    config: &ServerConfig,
    log_config: LogConfig,
) -> Result<(Replica, Log, wal::RecoveryReport), StreamOpenError> {
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
                .map_err(wal::RestoreError::from)
        },
        &mut |record| replica.borrow_mut().recovered(&record.header),
    )?;
    for skipped in &report.ignored {
        tracing::warn!("stream {:?}: checkpoint not used: {skipped}", meta.name);
    }
    if let Some(through) = report.checkpoint {
        tracing::info!(
            "stream {:?} recovered from its checkpoint at version {through}, replaying {} records after it",
            meta.name,
            report.records_visited
        );
    }
    Ok((replica.into_inner(), log, report))
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
    ) -> Result<Stream, StreamOpenError> {
        let durability = meta.durability()?;
        let protocol = meta.protocol()?;
        let placement = placement.unwrap_or_else(|| meta.placement(config.cluster.me));
        if !placement.replicas.contains(&config.cluster.me) {
            return Err(StreamOpenError::NotAReplica {
                me: config.cluster.me,
                replicas: placement.replicas,
            });
        }
        let log_config = checked_log_config(durability, config)?;
        let mut settings = config.replication;
        settings.dedupe = engine::DedupeLimits::default();
        settings.commit_interval_ms = u64::from(meta.commit_interval_ms);
        settings.sender_logging = matches!(durability, DurabilityConfig::Sender { .. });
        let replica = Replica::new(meta.id, config.cluster.me, placement, protocol, settings);
        let (replica, log, report) = recover(replica, meta, folder, config, log_config)?;
        let stream = Stream {
            deleted: AtomicBool::new(false),
            logged_driven: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            clock_ticks: AtomicU64::new(0),
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
                in_sync: Vec::new(),
            }),
            retention: meta.retention(config),
            checkpointed: AtomicU64::new(report.checkpoint.unwrap_or(0)),
            retained_asked: AtomicU64::new(0),
            transfers: Mutex::new(HashMap::new()),
            peer_frame_bytes_max: config.peer_frame_bytes_max(),
            checkpoint_task: Mutex::new(None),
            tasks: Mutex::new(Vec::new()),
            readers: Mutex::new(Vec::new()),
            deleting: Arc::new(Notify::new()),
            clock_timer: Arc::new(ClockTimer {
                wake: Notify::new(),
                scheduled: AtomicU64::new(u64::MAX),
                rests_until: AtomicU64::new(0),
            }),
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
            let mut core = self.lock();
            core.replica.recover_senders(now_ms(), checkpointed);
            self.clock_timer.rouse(&core);
        }
    }

    /// Sender-based logging: says what a restart's recovery took back,
    /// once it is over.
    fn report_sender_recovery(&self) {
        let core = self.lock();
        if core.replica.sender_recovering() {
            return;
        }
        let metrics = core.replica.metrics();
        tracing::info!(
            "stream {:?}: sender recovery done: {} messages put back at the versions their clients held, {} versions voided in all, log at version {}",
            self.name,
            metrics.resent_placed,
            metrics.voided,
            core.replica.last_version()
        );
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

    /// The control plane's word on the stream: see `Replica::follow`.
    pub fn follow(&self, view: &ClusterView) {
        self.note_in_sync(view);
        self.drive(|replica, now, out| replica.follow(view, now, out));
    }

    /// Logs a change of the stream's in-sync set: a shrink as a warning
    /// (acknowledgements now stand on fewer replicas), a growth as news.
    fn note_in_sync(&self, view: &ClusterView) {
        let mut now = view.in_sync.clone();
        now.sort_unstable();
        let mut gate = self.gate.lock().expect("gate lock");
        if gate.in_sync == now {
            return;
        }
        // The live placement shrinks with the in-sync set (a lost replica
        // leaves it), so its size would hide the loss: the sets alone say
        // it; `status` gives the count against R.
        if now.len() < gate.in_sync.len() {
            tracing::warn!(
                "stream {:?}: in-sync replicas {now:?} (was {:?})",
                self.name,
                gate.in_sync
            );
        } else if !gate.in_sync.is_empty() {
            tracing::info!(
                "stream {:?}: in-sync replicas {now:?} (was {:?})",
                self.name,
                gate.in_sync
            );
        }
        gate.in_sync = now;
    }

    /// The control plane recorded an epoch: see `Replica::follow_record`.
    pub fn follow_record(&self, view: &ClusterView) {
        self.drive(|replica, now, out| replica.follow_record(view, now, out));
    }

    /// The control plane's word on whether the stream takes writes (its
    /// requirement, and the loss action while it is not met).
    pub fn set_availability(&self, availability: &control::Availability) {
        let mut gate = self.gate.lock().expect("gate lock");
        if &gate.availability != availability {
            tracing::info!(
                "stream {:?} is now {}",
                self.name,
                control::state::describe(availability)
            );
            gate.availability = availability.clone();
            gate.since = Instant::now();
        }
    }

    /// Why writes are refused now, if they are (the loss action's gate,
    /// `Availability::write_refusal`).
    fn gate_failure(&self) -> Option<SubmitFailure> {
        use control::WriteRefusal;
        let gate = self.gate.lock().expect("gate lock");
        let held_ms = gate.since.elapsed().as_millis() as u64;
        Some(match gate.availability.write_refusal(held_ms)? {
            WriteRefusal::ReadOnly(why) => SubmitFailure::ReadOnly(why),
            WriteRefusal::Blocked(why) => SubmitFailure::Blocked(why),
            WriteRefusal::Reconnect(why) => SubmitFailure::Reconnect(why),
        })
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

    /// The replication state's numbers for the metrics, under one lock.
    pub fn gauges(&self) -> StreamGauges {
        let core = self.lock();
        let replica = &core.replica;
        let metrics = replica.metrics();
        StreamGauges {
            last_version: replica.last_version(),
            committed_version: replica.committed(),
            is_primary: replica.is_primary(),
            epoch: replica.placement().epoch,
            pending_acks: replica.pending_acks(),
            awaiting_confirmation: replica.awaiting_confirmation(),
            held: replica.held(),
            duplicates: metrics.duplicates,
            dedupe_entries: replica.dedupe_entries(),
            hybrid_client_async: (self.protocol == Protocol::Hybrid)
                .then(|| replica.hybrid_mode() == engine::replication::HybridMode::ClientAsync),
        }
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

    /// How many times the stream's clock has ticked its replica: about
    /// every tick while something waits, every heartbeat while quiet.
    pub fn clock_ticks(&self) -> u64 {
        self.clock_ticks.load(Ordering::Relaxed)
    }

    /// A subscription's place in this stream, starting at `from`: it
    /// stores each next version it will push there.
    pub(crate) fn track_reader(&self, from: u64) -> Arc<AtomicU64> {
        let position = Arc::new(AtomicU64::new(from));
        let mut readers = self.readers.lock().expect("readers lock");
        readers.retain(|reader| reader.strong_count() > 0);
        readers.push(Arc::downgrade(&position));
        position
    }

    /// The subscriptions reading this stream and how far the furthest
    /// behind is from its visible version (records).
    pub fn reader_lag(&self) -> (usize, u64) {
        let visible = self.visible_version();
        let mut readers = self.readers.lock().expect("readers lock");
        readers.retain(|reader| reader.strong_count() > 0);
        let lag = readers
            .iter()
            .filter_map(Weak::upgrade)
            .map(|next| (visible + 1).saturating_sub(next.load(Ordering::Relaxed)))
            .max()
            .unwrap_or(0);
        (readers.len(), lag)
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
            let failure = match self.has_other_replicas() {
                true => SubmitFailure::Moving(failure),
                false => SubmitFailure::LogFailed(failure),
            };
            return Err((failure, msgs));
        }
        if let Some(failure) = self.gate_failure() {
            return Err((failure, msgs));
        }
        if self.lock().backlog_bytes > self.backlog_bytes_max {
            return Err((SubmitFailure::Busy, msgs));
        }
        self.run_step(msgs.len(), || {
            self.drive(|replica, now, out| replica.on_clients(client, msgs, now, out))
        });
        Ok(())
    }

    /// Replication messages from a peer, taken in one step.
    pub fn on_peer_many(&self, from: ServerId, msgs: Vec<Msg>) {
        if self.deleted.load(Ordering::Acquire) {
            return;
        }
        // Records, not messages, make a reader busy: a `Commit` read with
        // the next record's copy (a closed loop at window 1) is no batch.
        // A binding names a record the log takes, so it counts as one.
        let records: usize = msgs
            .iter()
            .map(|msg| match msg {
                Msg::Replicate { entries } => entries.len(),
                Msg::Bind { bindings } => bindings.len(),
                _ => 0,
            })
            .sum();
        self.run_step(records, || self.on_peer_step(from, msgs));
    }

    /// Runs a step of a connection's reader that carries `records`
    /// records. With many in hand the reader is the bottleneck, and its
    /// sends go to the flushers rather than costing it a write each. With
    /// none (a `Progress`, a `Commit`) its sends follow the usual rule.
    /// With one, when its log has the idle journal to itself
    /// (`Log::may_write_here`), under `wal::write_here`: its record is
    /// written and synced by this thread, which saves the wake-up of the
    /// journal's thread, and its sends (a primary's forwards) are written
    /// at once (`net::prompt`), however recently their connection wrote,
    /// since this thread blocks on the disk next and could not run a
    /// flusher. Only where an acknowledgement waits for every replica's
    /// log (the ack of one server alone could otherwise leave before the
    /// copies of the record it releases), and only when every send of the
    /// step reached its socket (none waits for a flusher).
    fn run_step(&self, records: usize, step: impl FnOnce()) {
        let busy = records > 1;
        let every_replica = self.protocol != Protocol::Hybrid
            && matches!(
                self.protocol.ack_rule(HybridMode::ServerSync),
                AckRule::EveryReplica | AckRule::PrimaryAfterAll
            );
        if records != 1 || !every_replica || !self.log.may_write_here() {
            return net::deferring(busy, step);
        }
        wal::write_here(|| {
            let queued = net::queued_here();
            net::prompt(step);
            if net::queued_here() != queued {
                wal::not_here();
            }
        });
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

    /// Whether other servers hold replicas of the stream, so that it can
    /// go on there when this one's log fails.
    fn has_other_replicas(&self) -> bool {
        self.protocol != Protocol::Unversioned && self.placement().replicas.len() > 1
    }

    /// The log failed: a stream with other replicas stops here (see
    /// `stopped`); whether it did.
    pub(crate) fn stop_for_failed_log(&self) -> bool {
        let others = self.has_other_replicas();
        if others {
            self.stopped.store(true, Ordering::Release);
        }
        others
    }

    /// One step of the state machine under the lock, its effects carried
    /// out; returns the work left for after the lock.
    fn step(&self, step: impl FnOnce(&mut Replica, u64, &mut Vec<Effect>)) -> Vec<Later> {
        let mut later = Vec::new();
        if self.stopped.load(Ordering::Acquire) {
            return later;
        }
        {
            let mut core = self.lock();
            let now = now_ms();
            let mut effects = Vec::new();
            step(&mut core.replica, now, &mut effects);
            self.apply(&mut core, effects, now, &mut later);
            if let Some(at) = core.replica.wake_at() {
                if at < self.clock_timer.scheduled.load(Ordering::Acquire) {
                    self.clock_timer.wake.notify_one();
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
        let out = RouterOutbox {
            router: &self.router,
            stream: self.id,
        };
        let mut sends = Sends::default();
        let mut appends = Vec::new();
        while !effects.is_empty() {
            let mut appended = false;
            for effect in std::mem::take(&mut effects) {
                match effect {
                    Effect::Append(entry) => appends.push(entry),
                    Effect::Send(Node::Server(to), msg) => sends.peer(to, msg),
                    Effect::Send(Node::Client(client), msg) => sends.client(client, msg),
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
                        appended |= self.append_all(core, &mut appends, &mut sends, &out);
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
            appended |= self.append_all(core, &mut appends, &mut sends, &out);
            if immediate && appended {
                // `memory` and `paged` acknowledge what the log buffer took.
                let through = self.log.last_version();
                core.replica.on_logged(through, now, &mut effects);
            }
        }
        sends.finish(&out, wal::hook_in_place());
        self.clock_timer.rouse(core);
    }

    /// Hands `appends` to the log, after the messages for the other
    /// replicas (`sends`). `true` when the log took one.
    fn append_all(
        &self,
        core: &mut Core,
        appends: &mut Vec<Entry>,
        sends: &mut Sends,
        out: &RouterOutbox<'_>,
    ) -> bool {
        if appends.is_empty() {
            return false;
        }
        sends.before_append(out);
        let mut appended = false;
        for entry in appends.drain(..) {
            appended |= self.append(core, entry);
        }
        appended
    }

    /// Hands a record to the log, or to the backlog when the log is full
    /// (or the backlog already holds earlier records). `true` when the log
    /// took it.
    fn append(&self, core: &mut Core, entry: Entry) -> bool {
        if core.backlog.is_empty() {
            match self
                .log
                .append_parts(entry.version(), &entry.bytes, entry.rest())
            {
                Ok(()) => return true,
                Err(AppendError::Full) => {}
                Err(AppendError::TooLarge { length, limit }) => {
                    tracing::warn!(
                        "stream {}: record of {length} bytes exceeds the log's limit of {limit}; the log stops here",
                        self.name
                    );
                    return false;
                }
                Err(AppendError::Failed(_)) => return false,
            }
        }
        core.backlog_bytes += entry.len();
        core.backlog.push_back(entry.compact());
        false
    }

    /// Moves backlogged records into the log as room frees.
    fn drain_backlog(&self) {
        let mut core = self.lock();
        let mut appended = false;
        while let Some(entry) = core.backlog.front() {
            match self
                .log
                .append_parts(entry.version(), &entry.bytes, entry.rest())
            {
                Ok(()) => {
                    let entry = core.backlog.pop_front().expect("present");
                    core.backlog_bytes -= entry.len();
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
