//! One stream's replication state on one server: the primary's stamping,
//! reservations and commit index, and a replica's hold-back queue, bindings
//! and gap repair. Pure: messages and log progress go in, [`Effect`]s come
//! out; the server and the simulator carry them out.
//!
//! Invariants:
//! - versions are assigned only by the primary (`unversioned` excepted,
//!   where each server is its own primary and nothing is shared);
//! - a replica logs versions densely and in order: a later version waits in
//!   the hold-back queue until every earlier one is logged;
//! - a replica logs a message under a version only once it knows the
//!   primary's record for that version: the record itself (`Replicate`),
//!   the primary's stamp carried by the client (`returns-version`) or the
//!   primary's binding plus the client's content with a matching checksum;
//! - nothing is acknowledged or made visible past the log's contiguous end,
//!   and readers see only committed versions;
//! - with an output commit interval T (`commit_interval_ms`), acks to
//!   clients and reader visibility leave only in whole batches: a batch is
//!   what this replica had taken in when a multiple of T passed on its
//!   clock, and it is released once it is durable by each output's rule.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use proto::{EventId, RecordHeader};

use super::message::{Binding, Bytes, Content, Entry, Msg, Node, Refusal, ServerId, ACK_RUN_MAX};
use super::protocol::{AckRule, Flow, HybridMode, Protocol};
use crate::dedupe::{DedupeLimits, Lookup};
use crate::{Decision, StreamMachine};

/// Where a stream lives: its replica set, its primary, the epoch in which
/// that primary was appointed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    pub replicas: Vec<ServerId>,
    pub primary: ServerId,
    pub epoch: u64,
}

impl Placement {
    /// The replicas other than the primary.
    pub fn backups(&self) -> impl Iterator<Item = ServerId> + '_ {
        self.replicas
            .iter()
            .copied()
            .filter(move |id| *id != self.primary)
    }
}

/// Timeouts (in the caller's milliseconds) and bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaSettings {
    /// A replica that has waited this long for a missing version asks the
    /// primary for it.
    pub gap_timeout_ms: u64,
    /// `version-request`: a version whose message has not reached the
    /// primary after this long is voided.
    pub reserve_timeout_ms: u64,
    /// Client content waiting for its binding is dropped after this long
    /// (the primary never versioned it; the client retries).
    pub unbound_timeout_ms: u64,
    /// Progress and commit reports are repeated at least this often, so a
    /// lost one is replaced.
    pub heartbeat_ms: u64,
    /// Out-of-order records a replica holds back at most.
    pub held_max: usize,
    /// Client messages a replica holds while waiting for bindings, and
    /// versions a primary holds reserved.
    pub unbound_max: usize,
    /// Records asked for in one `Need`.
    pub need_batch: u64,
    /// `hybrid`: a client counts as active for this long after its last
    /// message.
    pub active_window_ms: u64,
    /// The output commit interval T: acks to clients and reader visibility
    /// are released only at multiples of T, for the versions taken in
    /// before that boundary, once they are durable. 0 releases them as soon
    /// as the log (and the ack rule) allows.
    pub commit_interval_ms: u64,
    /// Sender-based message logging (durability `sender`, forward-flow
    /// protocols): the primary returns each new message's version to its
    /// client at once, and the message counts as logged (for acks, commit,
    /// readers and forwarding to the replicas) only once it is fully
    /// logged: its client confirmed it holds the message with its version,
    /// or the primary's own log has synced it.
    pub sender_logging: bool,
    /// Sender-based logging: how long a restarted primary waits for its
    /// clients to resend the messages they hold with versions before it
    /// places them, voids the versions no one resent and stamps again.
    pub sender_recovery_ms: u64,
    pub dedupe: DedupeLimits,
}

impl Default for ReplicaSettings {
    fn default() -> Self {
        ReplicaSettings {
            gap_timeout_ms: 100,
            reserve_timeout_ms: 2_000,
            unbound_timeout_ms: 30_000,
            heartbeat_ms: 50,
            held_max: 1 << 16,
            unbound_max: 1 << 16,
            need_batch: 4_096,
            active_window_ms: 1_000,
            commit_interval_ms: 0,
            sender_logging: false,
            sender_recovery_ms: 3_000,
            dedupe: DedupeLimits::default(),
        }
    }
}

/// What the caller must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    Send(Node, Msg),
    /// Append to this server's log of the stream (versions arrive densely,
    /// in order). Report progress with [`Replica::on_logged`].
    Append(Entry),
    /// Read the log's records `from..=to` (those it has) and send them to
    /// the server as one or more `Msg::Replicate`.
    Serve {
        to: ServerId,
        from: u64,
        to_version: u64,
    },
    /// Readers may now see every version up to this one.
    Visible(u64),
    /// A primary in a new epoch has taken its replicas' tails (of the
    /// servers in `members`) and will stamp from `first_version` once the
    /// cluster has recorded it: call [`Replica::epoch_recorded`].
    EpochStarted {
        epoch: u64,
        first_version: u64,
        members: Vec<ServerId>,
    },
    /// A backup that did not count toward acknowledgements holds every
    /// committed version and counts from now on.
    InSync(ServerId),
    /// The primary sent the state of its checkpoint at `through`, past
    /// everything this replica holds: replace the log with an empty one
    /// starting at `through + 1` (plus a checkpoint holding `state`), then
    /// call [`Replica::install`] with [`Replica::decode_install`]'s
    /// machine. Until then the replica logs nothing more.
    Install {
        through: u64,
        state: Bytes,
    },
}

/// Counters for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplicaMetrics {
    /// Appends answered from the dedupe table.
    pub duplicates: u64,
    /// Records whose event id this replica had already logged at another
    /// version (must stay 0).
    pub conflicts: u64,
    /// Versions voided.
    pub voided: u64,
    /// `Need` requests sent for missing versions.
    pub gap_requests: u64,
    /// Messages dropped because a hold-back bound was reached.
    pub overflow_drops: u64,
    /// Sender-based logging: messages a restarted primary put back at the
    /// versions their clients held.
    pub resent_placed: u64,
    /// The most acks this replica has held at once (waiting for its log,
    /// the other replicas or an output commit boundary), as seen at the
    /// end of each step.
    pub pending_acks_peak: u64,
}

#[derive(Clone, Copy, Debug)]
struct Waiter {
    client: u128,
    event: EventId,
    duplicate: bool,
    /// Check the log still holds `event` at the version before acking
    /// (a `Reack` names a version this replica may not hold yet).
    verify: bool,
}

/// Acknowledgements waiting for a version. New messages arrive in version
/// order and go to the back of a queue (no allocation per message); the
/// rare waiter for an older version (a duplicate) goes to a map.
#[derive(Debug, Default)]
struct Waiters {
    ordered: std::collections::VecDeque<(u64, Waiter)>,
    late: BTreeMap<u64, Vec<Waiter>>,
}

impl Waiters {
    fn push(&mut self, version: u64, waiter: Waiter) {
        match self.ordered.back() {
            Some((last, _)) if *last > version => {
                self.late.entry(version).or_default().push(waiter)
            }
            _ => self.ordered.push_back((version, waiter)),
        }
    }

    /// Removes and returns every waiter for a version up to `through`.
    fn take_through(&mut self, through: u64) -> Vec<(u64, Waiter)> {
        let mut ready = Vec::new();
        while let Some((version, _)) = self.ordered.front() {
            if *version > through {
                break;
            }
            ready.push(self.ordered.pop_front().expect("present"));
        }
        if self
            .late
            .first_key_value()
            .is_some_and(|(v, _)| *v <= through)
        {
            let later = self.late.split_off(&(through + 1));
            for (version, waiters) in std::mem::replace(&mut self.late, later) {
                ready.extend(waiters.into_iter().map(|w| (version, w)));
            }
        }
        ready
    }
}

/// Batches closed by boundaries whose outputs are not all released yet, at
/// most; a further boundary widens the newest batch instead (its outputs
/// wait longer, none leaves early). Only a log that stops making progress
/// for this many intervals reaches it.
const BATCHES_MAX: usize = 1024;

/// The output commit interval (seed 003's checkpoint-and-buffer scheme):
/// the boundaries at multiples of T and the batches they closed. An output
/// (an ack, reader visibility) whose rule says "through version x" may only
/// go through the last batch that ends at or before x: never before the
/// boundary that closed its batch, never for a version past that batch.
#[derive(Debug)]
struct Boundaries {
    /// T in milliseconds; 0 gates nothing.
    interval_ms: u64,
    /// The next boundary (a multiple of T on the replica's clock).
    next_at: u64,
    /// The last version of each closed batch not yet released in full,
    /// ascending.
    ends: VecDeque<u64>,
    /// Every version up to this one was in a batch released in full (or
    /// was in the log at startup).
    floor: u64,
}

impl Boundaries {
    fn new(interval_ms: u64) -> Boundaries {
        Boundaries {
            interval_ms,
            next_at: 0,
            ends: VecDeque::new(),
            floor: 0,
        }
    }

    fn newest_end(&self) -> u64 {
        self.ends.back().copied().unwrap_or(self.floor)
    }

    /// Closes a batch of every version up to `last` if a boundary passed
    /// since the last call; `true` when a new batch was closed. Every
    /// version in the log was taken in before `now`, and so before any
    /// boundary that passed since the previous call.
    fn pass(&mut self, now: u64, last: u64) -> bool {
        if self.interval_ms == 0 || now < self.next_at {
            return false;
        }
        self.next_at = (now / self.interval_ms + 1) * self.interval_ms;
        if last <= self.newest_end() {
            return false;
        }
        if self.ends.len() >= BATCHES_MAX {
            *self.ends.back_mut().expect("full") = last;
        } else {
            self.ends.push_back(last);
        }
        true
    }

    /// How far an output whose own rule allows `through` may go.
    fn gate(&self, through: u64) -> u64 {
        if self.interval_ms == 0 {
            return through;
        }
        match self.ends.iter().rev().find(|end| **end <= through) {
            Some(end) => *end,
            None if self.floor <= through => self.floor,
            // A point that moved back (a new epoch) below batches already
            // released: everything up to it was released before.
            None => through,
        }
    }

    /// Forgets the batches every output has gone past.
    fn prune(&mut self, low: u64) {
        while let Some(&end) = self.ends.front() {
            if end > low {
                break;
            }
            self.floor = end;
            self.ends.pop_front();
        }
    }

    /// When the caller must tick next so a boundary is not missed: only
    /// while versions wait for a batch.
    fn wake_at(&self, last: u64) -> Option<u64> {
        (self.interval_ms > 0 && last > self.newest_end()).then_some(self.next_at)
    }
}

/// Sender-based message logging at the primary (seed 000's protocol of
/// Johnson and Zwaenepoel): the client keeps each message and the version
/// it was given (the receive sequence number) until a checkpoint covers
/// it; the primary's log is written in the background and synced only by
/// its page writer and its checkpoints.
#[derive(Debug, Default)]
struct SenderLog {
    /// What the log buffer has taken (the caller's `on_logged`).
    appended: u64,
    /// What the log has synced (the caller's `on_synced`).
    synced: u64,
    /// Versions given to a client and not yet confirmed by it, above
    /// `synced`: the first of them bounds what counts as logged.
    awaiting: BTreeSet<u64>,
    /// A restarted primary takes resends until this time.
    recovering_until: Option<u64>,
    /// Messages resent with the versions their clients hold, past the log.
    resent: BTreeMap<u64, Resent>,
    /// Client messages that arrived while recovering, taken afterwards.
    queued: Vec<(u128, Msg)>,
    /// The newest checkpoint's version, and the clients asked to resend.
    checkpoint: u64,
    asked: HashSet<u128>,
    /// Resends past the bound of `resent` (`unbound_max`): the lowest
    /// version turned away, and the clients that sent them. The window
    /// then places only the versions below it and opens again, asking
    /// those clients once more, so no copy is voided for want of room.
    overflow: Option<u64>,
    overflow_clients: BTreeSet<u128>,
}

#[derive(Debug)]
struct Resent {
    client: u128,
    epoch: u64,
    content: Content,
}

impl SenderLog {
    /// Every version up to this one is fully logged and in the log buffer.
    fn fully_logged(&self) -> u64 {
        match self.awaiting.first() {
            Some(first) => self.appended.min(first - 1),
            None => self.appended,
        }
    }
}

#[derive(Debug)]
struct Reservation {
    event: EventId,
    client: u128,
    deadline: u64,
    content: Option<Content>,
}

#[derive(Debug)]
struct Unbound {
    content: Content,
    crc: u32,
    received: u64,
}

pub struct Replica {
    stream: u64,
    me: ServerId,
    placement: Placement,
    protocol: Protocol,
    settings: ReplicaSettings,
    machine: StreamMachine,
    /// The log holds every version up to this one (by the durability
    /// mode's rule).
    logged: u64,
    committed: u64,
    visible: u64,
    // Primary.
    next_version: u64,
    reservations: BTreeMap<u64, Reservation>,
    reserved: HashMap<EventId, u64>,
    peer_logged: BTreeMap<ServerId, u64>,
    /// Backups whose logs count toward acknowledgements and the commit
    /// point: the in-sync replicas, and those that have caught up since.
    counting: BTreeSet<ServerId>,
    all_logged: u64,
    /// First version → how many logs make it committed.
    quorum: BTreeMap<u64, AckRule>,
    active: HashMap<u128, u64>,
    mode: HybridMode,
    commit_sent_at: Option<u64>,
    out_entries: Vec<Entry>,
    out_bindings: Vec<Binding>,
    // Replica.
    held: BTreeMap<u64, Entry>,
    unbound: HashMap<EventId, Unbound>,
    bindings: BTreeMap<u64, Binding>,
    primary_last: u64,
    waiting_since: Option<u64>,
    need_sent_at: Option<u64>,
    /// The last version the outstanding `Need` asked for.
    need_to: Option<u64>,
    /// A primary that has just started: each replica's reported newest
    /// version, until every replica has reported and this log holds the
    /// longest of them. Records may have reached a replica and not this
    /// log (a crash before the write), and their versions must not be
    /// handed out again.
    rejoining: Option<BTreeMap<ServerId, u64>>,
    /// The tails are taken; stamping waits for the epoch record.
    unrecorded: Option<u64>,
    /// The backups whose tails a rejoining primary takes.
    consider: BTreeSet<ServerId>,
    /// Client messages that arrived while rejoining, taken afterwards.
    rejoin_queue: Vec<(u128, Msg)>,
    progress_sent: u64,
    progress_sent_at: Option<u64>,
    // Acknowledgements waiting for the log (or, at the primary, for all).
    after_log: Waiters,
    after_all: Waiters,
    /// The output commit interval's batches.
    boundaries: Boundaries,
    /// Sender-based message logging (`None`: the log's own rule).
    sender: Option<SenderLog>,
    metrics: ReplicaMetrics,
}

impl Replica {
    pub fn new(
        stream: u64,
        me: ServerId,
        placement: Placement,
        protocol: Protocol,
        settings: ReplicaSettings,
    ) -> Replica {
        let replicas = placement.replicas.len();
        Replica {
            stream,
            me,
            protocol,
            settings,
            machine: StreamMachine::new(placement.epoch, settings.dedupe),
            logged: 0,
            committed: 0,
            visible: 0,
            next_version: 1,
            reservations: BTreeMap::new(),
            reserved: HashMap::new(),
            peer_logged: BTreeMap::new(),
            counting: placement.backups().collect(),
            all_logged: 0,
            quorum: BTreeMap::from([(1, protocol.ack_rule(HybridMode::ServerSync))]),
            active: HashMap::new(),
            mode: HybridMode::choose(replicas, 0),
            commit_sent_at: None,
            out_entries: Vec::new(),
            out_bindings: Vec::new(),
            held: BTreeMap::new(),
            unbound: HashMap::new(),
            bindings: BTreeMap::new(),
            primary_last: 0,
            waiting_since: None,
            need_sent_at: None,
            need_to: None,
            rejoining: None,
            unrecorded: None,
            consider: placement.backups().collect(),
            rejoin_queue: Vec::new(),
            progress_sent: 0,
            progress_sent_at: None,
            after_log: Waiters::default(),
            after_all: Waiters::default(),
            boundaries: Boundaries::new(settings.commit_interval_ms),
            sender: settings.sender_logging.then(SenderLog::default),
            metrics: ReplicaMetrics::default(),
            placement,
        }
    }

    /// Replays a record found in the log at startup.
    pub fn recovered(&mut self, header: &RecordHeader) {
        self.machine.record(header);
        self.next_version = self.machine.last_version() + 1;
    }

    /// The state a checkpoint keeps: the version it reflects (every record
    /// up to it was recorded, none after) and its bytes. The caller writes
    /// the checkpoint only once that version is durable.
    pub fn checkpoint_state(&self) -> (u64, Vec<u8>) {
        (self.machine.last_version(), self.machine.encode_state())
    }

    /// Takes the state of a checkpoint at startup, before the records
    /// after it are replayed with [`Replica::recovered`]; returns the
    /// checkpoint's version. A replica that has recorded anything already
    /// is a broken caller.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<u64, crate::SnapshotError> {
        assert_eq!(
            self.machine.last_version(),
            0,
            "a checkpoint is restored before any record is replayed"
        );
        let mut machine = StreamMachine::decode_state(bytes, self.settings.dedupe)?;
        machine.raise_epoch(self.machine.epoch());
        self.machine = machine;
        self.next_version = self.machine.last_version() + 1;
        Ok(self.machine.last_version())
    }

    /// Decodes the state of a checkpoint a primary sent (see
    /// [`Effect::Install`]) without changing anything: the caller resets
    /// its log only once the state is known good. Refused when it is not
    /// past what this replica holds.
    pub fn decode_install(&self, bytes: &[u8]) -> Result<StreamMachine, crate::SnapshotError> {
        let machine = StreamMachine::decode_state(bytes, self.settings.dedupe)?;
        let through = machine.last_version();
        let last = self.machine.last_version();
        if through <= last {
            return Err(crate::SnapshotError(format!(
                "the checkpoint at version {through} is not past this replica's last version {last}"
            )));
        }
        Ok(machine)
    }

    /// A running replica takes the state of its primary's checkpoint (from
    /// [`Replica::decode_install`]) in place of every version up to its
    /// version V, once the caller's log holds nothing before V + 1: the
    /// state machine becomes the checkpoint's, every version up to V
    /// counts as logged and committed (the primary checkpoints only
    /// committed versions), what was held back up to V is dropped, the
    /// primary hears the new progress, and the versions after V are asked
    /// for at once by the usual `Need`.
    pub fn install(&mut self, machine: StreamMachine, now: u64, out: &mut Vec<Effect>) {
        let through = machine.last_version();
        assert!(
            through > self.machine.last_version(),
            "a checkpoint is installed only past the replica's last version"
        );
        let mut machine = machine;
        machine.raise_epoch(self.machine.epoch());
        self.machine = machine;
        self.next_version = through + 1;
        self.logged = self.logged.max(through);
        self.committed = self.committed.max(through);
        self.primary_last = self.primary_last.max(through);
        self.held = self.held.split_off(&(through + 1));
        self.bindings = self.bindings.split_off(&(through + 1));
        // Every version up to V was released by the primary long ago.
        self.boundaries.ends.retain(|end| *end > through);
        self.boundaries.floor = self.boundaries.floor.max(through);
        if let Some(sender) = &mut self.sender {
            sender.appended = sender.appended.max(through);
            sender.synced = sender.synced.max(through);
            sender.awaiting = sender.awaiting.split_off(&(through + 1));
        }
        self.waiting_since = None;
        self.need_to = None;
        self.need_sent_at = None;
        self.release(out);
        if !self.is_primary() {
            self.send_progress(now, out);
            let known = self.known_last();
            if known > through {
                self.send_need(through, known, now, out);
            }
        }
        self.finish(out);
    }

    /// Startup is over: the log holds (durably) every recovered version.
    pub fn start(&mut self, now: u64, out: &mut Vec<Effect>) {
        self.logged = self.machine.last_version();
        self.next_version = self.logged + 1;
        // What the log held at startup may have been acknowledged before.
        self.boundaries.floor = self.logged;
        self.boundaries.pass(now, self.logged);
        if let Some(sender) = &mut self.sender {
            // What the log held at startup is fully logged.
            sender.appended = self.logged;
            sender.synced = self.logged;
        }
        if self.is_primary() {
            // A replica set of one commits what its own log holds; a larger
            // one waits for its replicas' progress reports.
            self.update_commit(now, out);
            if !self.standalone() && self.placement.replicas.len() > 1 {
                self.rejoining = Some(BTreeMap::new());
                self.probe(out);
            }
        }
        self.progress(now, out);
        self.finish(out);
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    pub fn is_primary(&self) -> bool {
        self.standalone() || self.me == self.placement.primary
    }

    /// Whether the replica set has a server besides the primary.
    fn has_backups(&self) -> bool {
        self.placement.backups().next().is_some()
    }

    /// `unversioned`: every server logs on its own.
    fn standalone(&self) -> bool {
        self.protocol == Protocol::Unversioned
    }

    /// Newest version in this server's log (logged or not yet).
    pub fn last_version(&self) -> u64 {
        self.machine.last_version()
    }

    pub fn logged(&self) -> u64 {
        self.logged
    }

    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// Newest version readers of this replica may see.
    pub fn visible(&self) -> u64 {
        self.visible
    }

    pub fn epoch(&self) -> u64 {
        self.placement.epoch
    }

    /// A `hybrid` primary's current choice.
    pub fn hybrid_mode(&self) -> HybridMode {
        self.mode
    }

    /// Clients that sent within the active window (as the primary counts).
    pub fn active_clients(&self) -> usize {
        self.active.len()
    }

    pub fn metrics(&self) -> ReplicaMetrics {
        self.metrics
    }

    /// The output commit interval T in milliseconds (0: none).
    pub fn commit_interval_ms(&self) -> u64 {
        self.boundaries.interval_ms
    }

    /// When the caller must call [`Replica::on_tick`] next so that an
    /// output commit boundary is not missed (`None`: no version waits for
    /// one). It may be in the past: tick at once.
    pub fn wake_at(&self) -> Option<u64> {
        self.boundaries.wake_at(self.machine.last_version())
    }

    /// Acknowledgements this replica holds back (waiting for the log, the
    /// other replicas or a boundary).
    pub fn pending_acks(&self) -> usize {
        let count = |waiters: &Waiters| {
            waiters.ordered.len() + waiters.late.values().map(Vec::len).sum::<usize>()
        };
        count(&self.after_log) + count(&self.after_all)
    }

    pub fn dedupe_entries(&self) -> usize {
        self.machine.dedupe().entries()
    }

    /// Messages held back (out-of-order records, unbound client content,
    /// reserved versions).
    pub fn held(&self) -> usize {
        self.held.len() + self.unbound.len() + self.reservations.len() + self.bindings.len()
    }

    /// Whether a started primary is still learning its replicas' tails.
    pub fn is_rejoining(&self) -> bool {
        self.rejoining.is_some() || self.unrecorded.is_some()
    }

    /// Backups that count toward acknowledgements.
    pub fn counting(&self) -> impl Iterator<Item = ServerId> + '_ {
        self.counting.iter().copied()
    }

    /// The cluster changed the stream's placement: `placement.replicas`
    /// are the live replicas, `in_sync` those known to hold every
    /// acknowledged version. In a new epoch every replica forgets what the
    /// former primary had sent past its log, and acknowledgements it has
    /// not given yet (the clients resend; the dedupe table answers); a new
    /// primary learns every live replica's tail before it stamps.
    /// `consider`: the backups whose tails a new primary takes (the live
    /// replicas when the epoch began; one that joined later is cut back by
    /// the epoch's record instead).
    pub fn reconfigure(
        &mut self,
        placement: Placement,
        in_sync: &[ServerId],
        consider: &[ServerId],
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let passed = self.boundary(now, out);
        let new_epoch = placement.epoch != self.placement.epoch;
        self.placement = placement;
        if self.standalone() {
            // `unversioned`: each server logs on its own; nothing moves.
            if passed {
                self.finish(out);
            }
            return;
        }
        let backups: BTreeSet<ServerId> = self.placement.backups().collect();
        if new_epoch || self.rejoining.is_some() {
            self.consider = consider
                .iter()
                .copied()
                .filter(|id| backups.contains(id))
                .collect();
        }
        // A backup the cluster does not list as in sync may be a new
        // process of the same server: what it reported before is void,
        // and it counts again once it reports having caught up.
        self.counting = self
            .placement
            .backups()
            .filter(|id| in_sync.contains(id))
            .collect();
        let counting = &self.counting;
        self.peer_logged.retain(|id, _| counting.contains(id));
        if new_epoch {
            // What the former primary committed may be past the tail the
            // new one keeps (under the rules that commit on fewer than
            // every log); readers keep what they have seen, no more.
            self.committed = self.visible;
            // The versions past it came from an earlier epoch, whose rule
            // for each this replica may not know (a hybrid's mode): they
            // commit on every log that counts.
            self.quorum = BTreeMap::from([(self.committed + 1, AckRule::EveryReplica)]);
            self.held.clear();
            self.bindings.clear();
            self.unbound.clear();
            self.reservations.clear();
            self.reserved.clear();
            self.waiting_since = None;
            self.need_sent_at = None;
            self.need_to = None;
            self.primary_last = self.machine.last_version();
            self.after_log = Waiters::default();
            self.after_all = Waiters::default();
            self.rejoining = None;
            self.unrecorded = None;
            self.progress_sent_at = None;
            self.commit_sent_at = None;
            if let Some(sender) = &mut self.sender {
                // Versions past the fully logged point were never forwarded
                // and may be cut; their clients resend to the new primary.
                sender.awaiting.clear();
                sender.resent.clear();
                sender.queued.clear();
                sender.recovering_until = None;
                self.out_entries.clear();
            }
            if self.is_primary() && !self.standalone() {
                self.rejoining = Some(BTreeMap::new());
                self.probe(out);
                self.continue_rejoin(out);
            } else {
                self.rejoin_queue.clear();
                self.send_progress(now, out);
            }
        } else if self.is_primary() && self.rejoining.is_some() {
            // A backup whose tail was awaited may have left.
            self.continue_rejoin(out);
        } else if self.is_primary() {
            self.update_commit(now, out);
        }
        self.finish(out);
    }

    /// The cluster has recorded the epoch this primary announced with
    /// [`Effect::EpochStarted`]: stamping begins.
    pub fn epoch_recorded(&mut self, epoch: u64, now: u64, out: &mut Vec<Effect>) {
        let passed = self.boundary(now, out);
        if epoch != self.placement.epoch || self.unrecorded.is_none() {
            if passed {
                self.finish(out);
            }
            return;
        }
        self.unrecorded = None;
        self.update_commit(now, out);
        for (client, msg) in std::mem::take(&mut self.rejoin_queue) {
            self.on_client(client, msg, now, out);
        }
        self.finish(out);
    }

    /// A message from a client.
    pub fn on_client(&mut self, client: u128, msg: Msg, now: u64, out: &mut Vec<Effect>) {
        self.on_clients(client, std::iter::once(msg), now, out);
    }

    /// Messages from one client, taken in one step: each is handled as
    /// `on_client` would, and what they leave to send to the backups goes
    /// out once, as one `Replicate` (and one `Bind`) for them all.
    pub fn on_clients(
        &mut self,
        client: u128,
        msgs: impl IntoIterator<Item = Msg>,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        for msg in msgs {
            self.take_client(client, msg, now, out);
        }
        self.finish(out);
    }

    /// One client message, short of `finish`.
    fn take_client(&mut self, client: u128, msg: Msg, now: u64, out: &mut Vec<Effect>) {
        if self.boundary(now, out) {
            self.finish(out);
        }
        if self.rejoining.is_some() || self.unrecorded.is_some() {
            if self.rejoin_queue.len() < self.settings.unbound_max {
                self.rejoin_queue.push((client, msg));
            }
            return;
        }
        if self.is_primary() && self.sender_recovering() {
            self.recovering_client(client, msg, out);
            return;
        }
        match msg {
            Msg::Write(content) => {
                if !self.is_primary() {
                    return refuse(out, client, content.event, Refusal::NotPrimary);
                }
                self.note_active(client, now);
                let flow = match self.protocol {
                    Protocol::Hybrid => Flow::Forward,
                    other => other.flow(self.mode),
                };
                self.stamp(client, content, flow, out);
            }
            Msg::Tagged(content) => {
                if self.is_primary() {
                    self.note_active(client, now);
                    self.stamp(client, content, Flow::Tagged, out);
                } else {
                    self.hold_content(client, content, now, out);
                }
            }
            Msg::Reserve { event, low_water } => {
                if !self.is_primary() {
                    return refuse(out, client, event, Refusal::NotPrimary);
                }
                self.note_active(client, now);
                self.reserve(client, event, low_water, now, out);
            }
            Msg::Placed {
                version,
                epoch,
                content,
            } => {
                if self.is_primary() {
                    if self.protocol.flow(self.mode) == Flow::Reserve {
                        self.place_reserved(client, version, content, now, out);
                    } else if self.sender.is_some() {
                        self.placed_resend(client, content, now, out);
                    }
                } else if self.protocol.flow(self.mode) == Flow::Stamp {
                    self.place_stamped(client, version, epoch, content, out);
                } else {
                    self.hold_content(client, content, now, out);
                }
            }
            Msg::Confirm {
                event,
                version,
                count,
            } if self.is_primary() => {
                for offset in 0..count.min(self.settings.unbound_max as u64) {
                    let next = EventId {
                        sequence: event.sequence + offset,
                        ..event
                    };
                    self.note_confirmed(next, version + offset);
                }
                self.after_confirm(now, out);
            }
            // Server-to-client and server-to-server messages are not
            // accepted from clients.
            _ => {}
        }
    }

    /// A message from another server.
    pub fn on_peer(&mut self, from: ServerId, msg: Msg, now: u64, out: &mut Vec<Effect>) {
        self.boundary(now, out);
        match msg {
            Msg::Replicate { entries }
                if (!self.is_primary() && from == self.placement.primary)
                    || (self.rejoining.is_some() && self.placement.replicas.contains(&from)) =>
            {
                for entry in entries {
                    self.offer(entry);
                }
                self.advance(out);
                self.continue_repair(now, out);
                if self.rejoining.is_some() {
                    let last = self.machine.last_version();
                    if self.need_to.is_some_and(|to| last >= to) {
                        self.need_to = None;
                    }
                    self.continue_rejoin(out);
                }
            }
            Msg::Bind { bindings } if !self.is_primary() && from == self.placement.primary => {
                for binding in bindings {
                    if binding.version > self.machine.last_version() {
                        self.primary_last = self.primary_last.max(binding.version);
                        self.bindings.insert(binding.version, binding);
                    }
                }
                self.advance(out);
            }
            Msg::Commit { committed, last } if from == self.placement.primary => {
                self.committed = self.committed.max(committed);
                self.primary_last = self.primary_last.max(last);
            }
            Msg::Reack { event, version } if from == self.placement.primary => {
                self.wait_log(
                    version,
                    Waiter {
                        client: event.client,
                        event,
                        duplicate: true,
                        verify: true,
                    },
                    out,
                );
            }
            Msg::Progress { logged, last }
                if self.is_primary() && self.placement.replicas.contains(&from) =>
            {
                let known = self.peer_logged.entry(from).or_insert(0);
                *known = (*known).max(logged);
                if let Some(tails) = &mut self.rejoining {
                    tails.insert(from, last);
                    self.continue_rejoin(out);
                }
                self.update_commit(now, out);
            }
            Msg::Probe if !self.is_primary() && from == self.placement.primary => {
                self.send_progress(now, out);
            }
            Msg::Checkpoint { through, state }
                if !self.is_primary()
                    && from == self.placement.primary
                    && through > self.machine.last_version() =>
            {
                out.push(Effect::Install { through, state });
            }
            Msg::Need { from: first, to }
                if self.is_primary() || from == self.placement.primary =>
            {
                let last = self.shareable_last();
                if first <= last && self.placement.replicas.contains(&from) {
                    out.push(Effect::Serve {
                        to: from,
                        from: first,
                        to_version: to.min(last),
                    });
                }
            }
            _ => {}
        }
        self.finish(out);
    }

    /// The log now holds every version up to `through` (by its durability
    /// mode's rule; with sender-based logging, its buffer has taken them).
    pub fn on_logged(&mut self, through: u64, now: u64, out: &mut Vec<Effect>) {
        let through = match &mut self.sender {
            Some(sender) => {
                sender.appended = sender.appended.max(through);
                sender.fully_logged()
            }
            None => through,
        };
        self.logged_through(through, now, out);
    }

    /// Sender-based logging: the log has synced every version up to
    /// `through`, so those need no client's copy to be fully logged.
    pub fn on_synced(&mut self, through: u64, now: u64, out: &mut Vec<Effect>) {
        let Some(sender) = &mut self.sender else {
            return;
        };
        sender.synced = sender.synced.max(through);
        sender.awaiting = sender.awaiting.split_off(&(sender.synced + 1));
        let through = sender.fully_logged();
        self.logged_through(through, now, out);
    }

    /// Sender-based logging: this primary restarted, and its log may have
    /// lost messages its clients hold with versions. It takes their
    /// resends for `sender_recovery_ms` (from the end of its rejoin, at
    /// the earliest), then logs them at their versions, voids the versions
    /// no one resent, and stamps what waited. Call after `start`, with
    /// the version the newest checkpoint covers: each client that sends
    /// anything meanwhile is asked to resend what it holds past it.
    pub fn recover_senders(&mut self, now: u64, checkpoint: u64) {
        let until = now + self.settings.sender_recovery_ms;
        let primary = self.is_primary();
        if let Some(sender) = self.sender.as_mut().filter(|_| primary) {
            sender.recovering_until = Some(until);
            sender.checkpoint = checkpoint;
            sender.asked.clear();
        }
    }

    /// Whether a restarted primary with sender-based logging is still
    /// taking its clients' resends.
    pub fn sender_recovering(&self) -> bool {
        self.sender
            .as_ref()
            .is_some_and(|sender| sender.recovering_until.is_some())
    }

    /// Sender-based logging: versions given to clients and not yet
    /// confirmed (or synced).
    pub fn awaiting_confirmation(&self) -> usize {
        self.sender
            .as_ref()
            .map_or(0, |sender| sender.awaiting.len())
    }

    fn logged_through(&mut self, through: u64, now: u64, out: &mut Vec<Effect>) {
        let passed = self.boundary(now, out);
        let through = through.min(self.machine.last_version());
        if through <= self.logged {
            if passed {
                self.finish(out);
            }
            return;
        }
        self.logged = through;
        self.release(out);
        if self.is_primary() {
            self.update_commit(now, out);
        } else {
            self.progress(now, out);
        }
        self.finish(out);
    }

    /// Time passes: voids, gap repair, heartbeats, expiry.
    pub fn on_tick(&mut self, now: u64, out: &mut Vec<Effect>) {
        self.boundary(now, out);
        if self.is_primary() {
            if self.unrecorded.is_some() {
                self.finish(out);
                return;
            }
            if self.rejoining.is_some() {
                // Probes or answers may be lost: ask again.
                let due = self
                    .commit_sent_at
                    .is_none_or(|at| now.saturating_sub(at) >= self.settings.heartbeat_ms);
                if due {
                    self.commit_sent_at = Some(now);
                    self.probe(out);
                    self.need_to = None;
                    self.continue_rejoin(out);
                }
                self.finish(out);
                return;
            }
            if self
                .sender
                .as_ref()
                .and_then(|sender| sender.recovering_until)
                .is_some_and(|until| now >= until)
            {
                self.end_sender_recovery(now, out);
            }
            self.advance_reservations(now, out);
            if self.protocol == Protocol::Hybrid {
                let window = self.settings.active_window_ms;
                self.active
                    .retain(|_, seen| now.saturating_sub(*seen) < window);
                self.mode = HybridMode::choose(self.placement.replicas.len(), self.active.len());
            }
            let due = self
                .commit_sent_at
                .is_none_or(|at| now.saturating_sub(at) >= self.settings.heartbeat_ms);
            if due && !self.standalone() {
                self.send_commit(now, out);
            }
        } else {
            self.repair_gap(now, out);
            let timeout = self.settings.unbound_timeout_ms;
            self.unbound
                .retain(|_, held| now.saturating_sub(held.received) < timeout);
            let due = self
                .progress_sent_at
                .is_none_or(|at| now.saturating_sub(at) >= self.settings.heartbeat_ms);
            if due {
                self.send_progress(now, out);
            }
        }
        self.finish(out);
    }

    // --- the primary ---

    fn note_active(&mut self, client: u128, now: u64) {
        if self.protocol == Protocol::Hybrid && self.active.insert(client, now).is_none() {
            self.mode = HybridMode::choose(self.placement.replicas.len(), self.active.len());
        }
    }

    /// The rule a message arriving by `flow` is acknowledged under.
    fn rule_for(&self, flow: Flow) -> AckRule {
        match self.protocol {
            Protocol::Hybrid if flow == Flow::Tagged => AckRule::FirstReplica,
            Protocol::Hybrid => AckRule::PrimaryAfterAll,
            other => other.ack_rule(self.mode),
        }
    }

    /// Assigns the next version to a new message, or answers a duplicate.
    fn stamp(&mut self, client: u128, content: Content, flow: Flow, out: &mut Vec<Effect>) {
        let event = content.event;
        let rule = self.rule_for(flow);
        let version = match self.machine.decide(event, content.low_water) {
            Err(rejection) => return refuse(out, client, event, rejection.into()),
            Ok(Decision::Duplicate { version }) => {
                self.metrics.duplicates += 1;
                if flow == Flow::Stamp || (flow == Flow::Forward && self.sender.is_some()) {
                    // Sender-based logging: the client confirms the version
                    // it now holds.
                    out.push(stamped(client, event, version, self.epoch(), true));
                }
                if flow == Flow::Forward {
                    self.reack(event, version, out);
                }
                let waiter = Waiter {
                    client,
                    event,
                    duplicate: true,
                    verify: false,
                };
                return self.wait(rule, version, waiter, out);
            }
            Ok(Decision::Assign { .. }) => self.machine.last_version() + 1,
        };
        if !self.reservations.is_empty() {
            // Only `version-request` reserves, and it never stamps.
            return refuse(out, client, event, Refusal::Busy);
        }
        let entry = Entry::new(
            self.header(version, event, content.low_water, content.flags()),
            &content.key,
            &content.payload,
        );
        if self.standalone() || flow == Flow::Stamp {
            // `returns-version`: the client carries the stamped message to
            // the other replicas itself (gap repair covers a client that
            // dies first).
            self.accept(entry, true, out);
        } else if flow == Flow::Tagged {
            let binding = self.binding_of(&entry, &content);
            self.accept(entry, true, out);
            self.out_bindings.push(binding);
        } else if self.has_backups() {
            self.accept(entry.clone(), true, out);
            self.out_entries.push(entry);
        } else {
            self.accept(entry, true, out);
        }
        self.note_quorum(version, rule);
        if flow == Flow::Stamp {
            out.push(stamped(client, event, version, self.epoch(), false));
        }
        if flow == Flow::Forward {
            if let Some(sender) = &mut self.sender {
                // The receive sequence number: the message counts as logged
                // once its client confirms it holds it with this version.
                sender.awaiting.insert(version);
                out.push(stamped(client, event, version, self.epoch(), false));
            }
        }
        let waiter = Waiter {
            client,
            event,
            duplicate: false,
            verify: false,
        };
        self.wait(rule, version, waiter, out);
    }

    fn reserve(
        &mut self,
        client: u128,
        event: EventId,
        low_water: u64,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let epoch = self.epoch();
        match self.machine.decide(event, low_water) {
            Err(rejection) => refuse(out, client, event, rejection.into()),
            Ok(Decision::Duplicate { version }) => {
                self.metrics.duplicates += 1;
                out.push(stamped(client, event, version, epoch, true));
            }
            Ok(Decision::Assign { .. }) => {
                if let Some(&version) = self.reserved.get(&event) {
                    return out.push(stamped(client, event, version, epoch, false));
                }
                if self.reservations.len() >= self.settings.unbound_max {
                    return refuse(out, client, event, Refusal::Busy);
                }
                let version = self.next_version;
                self.next_version += 1;
                self.reservations.insert(
                    version,
                    Reservation {
                        event,
                        client,
                        deadline: now + self.settings.reserve_timeout_ms,
                        content: None,
                    },
                );
                self.reserved.insert(event, version);
                out.push(stamped(client, event, version, epoch, false));
            }
        }
    }

    /// `version-request`: the message for a reserved version arrived.
    fn place_reserved(
        &mut self,
        client: u128,
        version: u64,
        content: Content,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let event = content.event;
        if version <= self.machine.last_version() {
            return match self
                .machine
                .dedupe()
                .lookup(event.client, event.session, event.sequence)
            {
                Lookup::Logged(logged) if logged == version => {
                    let waiter = Waiter {
                        client,
                        event,
                        duplicate: true,
                        verify: false,
                    };
                    self.wait_log(version, waiter, out)
                }
                _ => refuse(out, client, event, Refusal::VersionVoid),
            };
        }
        match self.reservations.get_mut(&version) {
            Some(reservation) if reservation.event == event => {
                reservation.client = client;
                reservation.content = Some(content);
                self.advance_reservations(now, out);
            }
            _ => refuse(out, client, event, Refusal::VersionVoid),
        }
    }

    /// Logs reserved versions whose messages came, in order, and voids the
    /// first one if its message is overdue.
    fn advance_reservations(&mut self, now: u64, out: &mut Vec<Effect>) {
        loop {
            let next = self.machine.last_version() + 1;
            let Some(reservation) = self.reservations.get(&next) else {
                return;
            };
            let ready = reservation.content.is_some();
            if !ready && reservation.deadline > now {
                return;
            }
            let reservation = self.reservations.remove(&next).expect("present");
            self.reserved.remove(&reservation.event);
            let rule = self.rule_for(Flow::Reserve);
            match reservation.content {
                Some(content) => {
                    let entry = Entry::new(
                        self.header(next, content.event, content.low_water, content.flags()),
                        &content.key,
                        &content.payload,
                    );
                    let binding = self.binding_of(&entry, &content);
                    self.accept(entry, true, out);
                    self.out_bindings.push(binding);
                    let waiter = Waiter {
                        client: reservation.client,
                        event: reservation.event,
                        duplicate: false,
                        verify: false,
                    };
                    self.wait(rule, next, waiter, out);
                }
                None => {
                    let entry = Entry::void(self.stream, next, self.epoch());
                    let binding = Binding {
                        version: next,
                        epoch: self.epoch(),
                        event: entry.header.event,
                        low_water: 0,
                        flags: entry.header.flags,
                        crc: 0,
                    };
                    self.metrics.voided += 1;
                    self.accept(entry, true, out);
                    self.out_bindings.push(binding);
                }
            }
            self.note_quorum(next, rule);
        }
    }

    /// Versions from `version` on commit under `rule`. The rule, not a
    /// count, is kept: how many logs it asks for follows the replica set
    /// as it is when the commit point moves.
    fn note_quorum(&mut self, version: u64, rule: AckRule) {
        if self.quorum.values().next_back() != Some(&rule) {
            self.quorum.insert(version, rule);
        }
    }

    fn header(&self, version: u64, event: EventId, low_water: u64, flags: u16) -> RecordHeader {
        RecordHeader {
            flags,
            stream: self.stream,
            version,
            epoch: self.epoch(),
            event,
            low_water: low_water.min(event.sequence),
        }
    }

    fn binding_of(&self, entry: &Entry, content: &Content) -> Binding {
        Binding {
            version: entry.header.version,
            epoch: entry.header.epoch,
            event: entry.header.event,
            low_water: entry.header.low_water,
            flags: entry.header.flags,
            crc: content.crc(),
        }
    }

    /// Recomputes how far every log, and a commit quorum of logs, reach.
    fn update_commit(&mut self, now: u64, out: &mut Vec<Effect>) {
        if self.standalone() {
            self.committed = self.logged;
            self.release(out);
            return;
        }
        let last = self.machine.last_version();
        let caught_up: Vec<ServerId> = self
            .placement
            .backups()
            .filter(|id| {
                !self.counting.contains(id)
                    && self
                        .peer_logged
                        .get(id)
                        .is_some_and(|&l| l >= self.committed)
            })
            .collect();
        for id in caught_up {
            self.counting.insert(id);
            out.push(Effect::InSync(id));
        }
        let mut reached: Vec<u64> = self
            .counting
            .iter()
            .map(|id| self.peer_logged.get(id).copied().unwrap_or(0).min(last))
            .collect();
        reached.push(self.logged);
        reached.sort_unstable_by(|a, b| b.cmp(a));
        self.all_logged = *reached.last().expect("the primary is a replica");
        let mut committed = self.committed;
        let replicas = self.placement.replicas.len();
        let segments: Vec<(u64, usize)> = self
            .quorum
            .iter()
            .map(|(v, rule)| (*v, Protocol::commit_quorum(*rule, replicas)))
            .collect();
        for (index, &(start, quorum)) in segments.iter().enumerate() {
            let end = segments
                .get(index + 1)
                .map_or(last, |(next, _)| next - 1)
                .min(last);
            if end <= committed {
                continue;
            }
            let reach = reached[quorum.clamp(1, reached.len()) - 1];
            if reach < start.max(committed + 1) {
                break;
            }
            committed = reach.min(end);
            if committed < end {
                break;
            }
        }
        // Drop the quorum segments wholly below the commit point.
        while self.quorum.len() > 1 {
            let second = *self.quorum.keys().nth(1).expect("two segments");
            if second <= committed + 1 {
                let first = *self.quorum.keys().next().expect("one segment");
                self.quorum.remove(&first);
            } else {
                break;
            }
        }
        if committed > self.committed {
            self.committed = committed;
            self.send_commit(now, out);
        }
        self.release(out);
    }

    fn send_commit(&mut self, now: u64, out: &mut Vec<Effect>) {
        self.commit_sent_at = Some(now);
        for backup in self.placement.backups() {
            out.push(Effect::Send(
                Node::Server(backup),
                Msg::Commit {
                    committed: self.committed,
                    last: self.shareable_last(),
                },
            ));
        }
    }

    fn probe(&mut self, out: &mut Vec<Effect>) {
        let waiting: Vec<ServerId> = self
            .consider
            .iter()
            .copied()
            .filter(|id| {
                self.rejoining
                    .as_ref()
                    .is_some_and(|tails| !tails.contains_key(id))
            })
            .collect();
        for backup in waiting {
            out.push(Effect::Send(Node::Server(backup), Msg::Probe));
        }
    }

    /// Once every replica reported its tail, fetches what this log lacks
    /// from the longest; then the primary starts stamping.
    fn continue_rejoin(&mut self, out: &mut Vec<Effect>) {
        let Some(tails) = &self.rejoining else {
            return;
        };
        if self.consider.iter().any(|id| !tails.contains_key(id)) {
            return;
        }
        let last = self.machine.last_version();
        let longest = tails
            .iter()
            .filter(|(id, _)| self.consider.contains(id))
            .map(|(id, tail)| (*id, *tail))
            .max_by_key(|(_, tail)| *tail);
        if let Some((longest, target)) = longest.filter(|(_, tail)| *tail > last) {
            if self.need_to.is_none() {
                let to = target.min(last + self.settings.need_batch);
                self.need_to = Some(to);
                self.metrics.gap_requests += 1;
                out.push(Effect::Send(
                    Node::Server(longest),
                    Msg::Need { from: last + 1, to },
                ));
            }
            return;
        }
        let mut members: Vec<ServerId> = self.consider.iter().copied().collect();
        members.push(self.me);
        members.sort_unstable();
        self.rejoining = None;
        self.need_to = None;
        self.next_version = self.next_version.max(last + 1);
        self.unrecorded = Some(last + 1);
        out.push(Effect::EpochStarted {
            epoch: self.placement.epoch,
            first_version: last + 1,
            members,
        });
    }

    /// The newest version other replicas may learn of: with sender-based
    /// logging a primary shares only what is fully logged.
    fn shareable_last(&self) -> u64 {
        if self.sender.is_some() && self.is_primary() {
            self.logged
        } else {
            self.machine.last_version()
        }
    }

    /// `one-hop-ack-client`: a client sent a message the primary has
    /// logged again (its ack from some replica was lost), so the backups
    /// ack it again once their logs hold it.
    fn reack(&self, event: EventId, version: u64, out: &mut Vec<Effect>) {
        if self.protocol != Protocol::OneHopAckClient {
            return;
        }
        for backup in self.placement.backups() {
            out.push(Effect::Send(
                Node::Server(backup),
                Msg::Reack { event, version },
            ));
        }
    }

    /// Sender-based logging: a client holds the message with `version`.
    fn confirm(&mut self, event: EventId, version: u64, now: u64, out: &mut Vec<Effect>) {
        self.note_confirmed(event, version);
        self.after_confirm(now, out);
    }

    fn note_confirmed(&mut self, event: EventId, version: u64) {
        let logged = self
            .machine
            .dedupe()
            .lookup(event.client, event.session, event.sequence);
        // Only the message's own client confirms its own version.
        if let Some(sender) = self.sender.as_mut() {
            if logged == Lookup::Logged(version) {
                sender.awaiting.remove(&version);
            }
        }
    }

    /// Sender-based logging: the fully logged point may have moved.
    fn after_confirm(&mut self, now: u64, out: &mut Vec<Effect>) {
        if let Some(sender) = &self.sender {
            let through = sender.fully_logged();
            self.logged_through(through, now, out);
        }
    }

    /// Sender-based logging, outside recovery: a client resends a message
    /// with the version it holds (its confirmation or ack was lost).
    fn placed_resend(&mut self, client: u128, content: Content, now: u64, out: &mut Vec<Effect>) {
        let event = content.event;
        match self
            .machine
            .dedupe()
            .lookup(event.client, event.session, event.sequence)
        {
            Lookup::Logged(logged) => {
                self.confirm(event, logged, now, out);
                self.answer_logged_copy(client, event, logged, out);
            }
            Lookup::Retired { low_water } => refuse_retired(out, client, event, low_water),
            // The log lost it and its version was voided (or given to
            // another message) when no one resent it in time: the client
            // asks for a new version.
            Lookup::New => refuse(out, client, event, Refusal::VersionVoid),
        }
    }

    /// Sender-based logging: a copy of a message the log holds at
    /// `logged` is answered as a duplicate (and the backups asked to ack it
    /// again).
    fn answer_logged_copy(
        &mut self,
        client: u128,
        event: EventId,
        logged: u64,
        out: &mut Vec<Effect>,
    ) {
        self.metrics.duplicates += 1;
        self.reack(event, logged, out);
        let waiter = Waiter {
            client,
            event,
            duplicate: true,
            verify: false,
        };
        let rule = self.rule_for(Flow::Forward);
        self.wait(rule, logged, waiter, out);
    }

    /// Sender-based logging: a restarted primary takes resends (messages
    /// with the versions their clients hold) and queues everything else
    /// until the recovery window closes.
    fn recovering_client(&mut self, client: u128, msg: Msg, out: &mut Vec<Effect>) {
        let limit = self.settings.unbound_max;
        let last = self.machine.last_version();
        let sender = self.sender.as_mut().expect("recovering");
        if sender.asked.len() < limit && sender.asked.insert(client) {
            let ask = Msg::Checkpointed {
                through: sender.checkpoint,
                resend: true,
            };
            out.push(Effect::Send(Node::Client(client), ask));
        }
        let Msg::Placed {
            version,
            epoch,
            content,
        } = msg
        else {
            let sender = self.sender.as_mut().expect("recovering");
            match msg {
                // Nothing awaits confirmation after a restart.
                Msg::Confirm { .. } => {}
                Msg::Write(content) if sender.queued.len() >= limit => {
                    refuse(out, client, content.event, Refusal::Busy)
                }
                other => sender.queued.push((client, other)),
            }
            return;
        };
        let event = content.event;
        match self
            .machine
            .dedupe()
            .lookup(event.client, event.session, event.sequence)
        {
            Lookup::Logged(logged) => self.answer_logged_copy(client, event, logged, out),
            Lookup::Retired { low_water } => refuse_retired(out, client, event, low_water),
            Lookup::New if version <= last || version == 0 => {
                refuse(out, client, event, Refusal::VersionVoid);
            }
            Lookup::New => {
                let sender = self.sender.as_mut().expect("recovering");
                if sender.resent.len() >= limit && !sender.resent.contains_key(&version) {
                    // Full: keep the lowest versions; the one turned away
                    // comes back in the next round.
                    self.metrics.overflow_drops += 1;
                    let highest = sender.resent.keys().next_back().copied();
                    let (away, away_client) = match highest {
                        Some(highest) if highest > version => {
                            let evicted = sender.resent.remove(&highest).expect("present");
                            (highest, evicted.client)
                        }
                        _ => (version, client),
                    };
                    sender.overflow = Some(sender.overflow.map_or(away, |v| v.min(away)));
                    if sender.overflow_clients.len() < limit {
                        sender.overflow_clients.insert(away_client);
                    }
                    if away == version {
                        return refuse(out, client, event, Refusal::Busy);
                    }
                }
                sender.resent.insert(
                    version,
                    Resent {
                        client,
                        epoch,
                        content,
                    },
                );
            }
        }
    }

    /// Sender-based logging: the recovery window closed. The resent
    /// messages are logged at their versions in version order (the fully
    /// logged ones: their clients held the versions), the versions no one
    /// resent are voided (never confirmed, so no reader or replica saw
    /// them, unless their client crashed too), then the messages that
    /// waited are stamped after them. When resends were turned away for
    /// room, only the versions below the lowest of them are settled, and
    /// another window opens for the rest.
    fn end_sender_recovery(&mut self, now: u64, out: &mut Vec<Effect>) {
        let sender = self.sender.as_mut().expect("sender-based logging");
        sender.recovering_until = None;
        sender.asked.clear();
        let resent = std::mem::take(&mut sender.resent);
        let overflow = sender.overflow.take();
        let queued = if overflow.is_some() {
            Vec::new()
        } else {
            std::mem::take(&mut sender.queued)
        };
        let rule = self.rule_for(Flow::Forward);
        let last = self.machine.last_version();
        let top = resent.keys().next_back().copied().unwrap_or(last);
        // Resends were turned away for room: only the versions below the
        // lowest of them are complete (every entry kept is below it).
        let top = overflow.map_or(top, |away| top.min(away - 1));
        for version in last + 1..=top {
            let (entry, waiter) = match resent.get(&version) {
                Some(Resent {
                    client,
                    epoch,
                    content,
                }) => {
                    let event = content.event;
                    let header = RecordHeader {
                        flags: content.flags(),
                        stream: self.stream,
                        version,
                        epoch: if *epoch == 0 { self.epoch() } else { *epoch },
                        event,
                        low_water: content.low_water.min(event.sequence),
                    };
                    let waiter = Waiter {
                        client: *client,
                        event,
                        duplicate: false,
                        verify: false,
                    };
                    (
                        Entry::new(header, &content.key, &content.payload),
                        Some(waiter),
                    )
                }
                None => {
                    self.metrics.voided += 1;
                    (Entry::void(self.stream, version, self.epoch()), None)
                }
            };
            if !self.standalone() && self.has_backups() {
                self.accept(entry.clone(), true, out);
                self.out_entries.push(entry);
            } else {
                self.accept(entry, true, out);
            }
            self.note_quorum(version, rule);
            if waiter.is_some() {
                self.metrics.resent_placed += 1;
            }
            if let Some(waiter) = waiter {
                self.wait(rule, version, waiter, out);
            }
        }
        if overflow.is_some() {
            // Another round for the copies turned away: their clients are
            // asked again, and the queued messages wait for its end.
            let until = now + self.settings.sender_recovery_ms;
            let sender = self.sender.as_mut().expect("sender-based logging");
            sender.recovering_until = Some(until);
            for client in std::mem::take(&mut sender.overflow_clients) {
                sender.asked.insert(client);
                let ask = Msg::Checkpointed {
                    through: sender.checkpoint,
                    resend: true,
                };
                out.push(Effect::Send(Node::Client(client), ask));
            }
            return;
        }
        for (client, msg) in queued {
            self.on_client(client, msg, now, out);
        }
    }

    // --- a replica that is not the primary ---

    /// Client content that waits for the primary's binding.
    fn hold_content(&mut self, client: u128, content: Content, now: u64, out: &mut Vec<Effect>) {
        let event = content.event;
        match self
            .machine
            .dedupe()
            .lookup(event.client, event.session, event.sequence)
        {
            Lookup::Logged(version) => {
                self.metrics.duplicates += 1;
                let waiter = Waiter {
                    client,
                    event,
                    duplicate: true,
                    verify: false,
                };
                return self.wait_log(version, waiter, out);
            }
            Lookup::Retired { low_water } => {
                return refuse_retired(out, client, event, low_water);
            }
            Lookup::New => {}
        }
        if self.unbound.len() >= self.settings.unbound_max && !self.unbound.contains_key(&event) {
            self.metrics.overflow_drops += 1;
            return refuse(out, client, event, Refusal::Busy);
        }
        let crc = content.crc();
        self.unbound.insert(
            event,
            Unbound {
                content,
                crc,
                received: now,
            },
        );
        self.advance(out);
    }

    /// `returns-version`: content with the primary's stamp, from the client.
    fn place_stamped(
        &mut self,
        client: u128,
        version: u64,
        epoch: u64,
        content: Content,
        out: &mut Vec<Effect>,
    ) {
        let event = content.event;
        if let Lookup::Logged(logged) =
            self.machine
                .dedupe()
                .lookup(event.client, event.session, event.sequence)
        {
            self.metrics.duplicates += 1;
            let waiter = Waiter {
                client,
                event,
                duplicate: true,
                verify: false,
            };
            return self.wait_log(logged, waiter, out);
        }
        if epoch == 0 && version != 0 {
            // The primary had logged it before (a resend): its record,
            // whose header names the epoch it was stamped in, comes by
            // gap repair, never rebuilt from the client's copy.
            self.primary_last = self.primary_last.max(version);
            let waiter = Waiter {
                client,
                event,
                duplicate: true,
                verify: true,
            };
            return self.wait_log(version, waiter, out);
        }
        if epoch != self.epoch() || version == 0 {
            return;
        }
        self.primary_last = self.primary_last.max(version);
        let header = self.header(version, event, content.low_water, content.flags());
        self.offer(Entry::new(header, &content.key, &content.payload));
        self.advance(out);
    }

    /// A record from the primary (or stamped by it): logged now if it is
    /// the next version, held back otherwise.
    fn offer(&mut self, entry: Entry) {
        let version = entry.version();
        if version <= self.machine.last_version() {
            return;
        }
        self.primary_last = self.primary_last.max(version);
        if self.held.len() >= self.settings.held_max && !self.held.contains_key(&version) {
            self.metrics.overflow_drops += 1;
            // Keep the lowest versions: they are the ones the log needs
            // next. Dropping the newcomer instead would, once the queue is
            // full of later versions, refuse the very record that lets it
            // drain; a later version dropped here comes again by repair.
            match self.held.keys().next_back().copied() {
                Some(highest) if highest > version => {
                    self.held.remove(&highest);
                }
                _ => return,
            }
        }
        self.held.insert(version, entry);
    }

    /// Logs every version that can be logged in order.
    fn advance(&mut self, out: &mut Vec<Effect>) {
        loop {
            let next = self.machine.last_version() + 1;
            if let Some(entry) = self.held.remove(&next) {
                self.bindings.remove(&next);
                if !entry.is_void() {
                    self.unbound.remove(&entry.header.event);
                }
                let client_acks = self.protocol != Protocol::Hybrid;
                self.accept(entry, client_acks, out);
                continue;
            }
            let Some(binding) = self.bindings.get(&next).copied() else {
                break;
            };
            if binding.is_void() {
                self.bindings.remove(&next);
                self.accept(Entry::void(self.stream, next, binding.epoch), true, out);
                continue;
            }
            let matches = self
                .unbound
                .get(&binding.event)
                .is_some_and(|held| held.crc == binding.crc);
            if !matches {
                break;
            }
            let held = self.unbound.remove(&binding.event).expect("matched");
            self.bindings.remove(&next);
            let header = RecordHeader {
                flags: binding.flags,
                stream: self.stream,
                version: next,
                epoch: binding.epoch,
                event: binding.event,
                low_water: binding.low_water,
            };
            self.accept(
                Entry::new(header, &held.content.key, &held.content.payload),
                true,
                out,
            );
        }
        // Whatever is now below the log's end is stale.
        let last = self.machine.last_version();
        self.held = self.held.split_off(&(last + 1));
        self.bindings = self.bindings.split_off(&(last + 1));
    }

    /// The newest version this replica knows exists: from the primary's
    /// heartbeat, a held record or a binding.
    fn known_last(&self) -> u64 {
        self.primary_last
            .max(self.held.keys().next_back().copied().unwrap_or(0))
            .max(self.bindings.keys().next_back().copied().unwrap_or(0))
    }

    fn repair_gap(&mut self, now: u64, out: &mut Vec<Effect>) {
        let last = self.machine.last_version();
        let known = self.known_last();
        if known <= last {
            self.waiting_since = None;
            return;
        }
        let since = *self.waiting_since.get_or_insert(now);
        let timeout = self.settings.gap_timeout_ms;
        let recently_asked = self
            .need_sent_at
            .is_some_and(|at| now.saturating_sub(at) < timeout);
        if now.saturating_sub(since) >= timeout && !recently_asked {
            self.send_need(last, known, now, out);
        }
    }

    fn send_need(&mut self, last: u64, known: u64, now: u64, out: &mut Vec<Effect>) {
        let to = known.min(last + self.settings.need_batch);
        self.need_sent_at = Some(now);
        self.need_to = Some(to);
        self.metrics.gap_requests += 1;
        out.push(Effect::Send(
            Node::Server(self.placement.primary),
            Msg::Need { from: last + 1, to },
        ));
    }

    /// A repair batch arrived whole: ask for the next one at once rather
    /// than after another gap timeout, so a replica far behind catches up
    /// at the speed of the link.
    fn continue_repair(&mut self, now: u64, out: &mut Vec<Effect>) {
        if self.is_primary() {
            return;
        }
        let last = self.machine.last_version();
        let Some(to) = self.need_to else {
            return;
        };
        if last < to {
            return;
        }
        self.need_to = None;
        let known = self.known_last();
        if known > last {
            self.send_need(last, known, now, out);
        }
    }

    fn progress(&mut self, now: u64, out: &mut Vec<Effect>) {
        if !self.is_primary() && self.logged > self.progress_sent {
            self.send_progress(now, out);
        }
    }

    fn send_progress(&mut self, now: u64, out: &mut Vec<Effect>) {
        self.progress_sent = self.logged;
        self.progress_sent_at = Some(now);
        out.push(Effect::Send(
            Node::Server(self.placement.primary),
            Msg::Progress {
                logged: self.logged,
                last: self.machine.last_version(),
            },
        ));
    }

    // --- both ---

    /// Takes the next version into this server's log.
    /// `client_acks`: whether a replica other than the primary acks the
    /// record's client (by the protocol's rule; a `hybrid` replica acks only
    /// what came by binding, the client-async flow).
    fn accept(&mut self, entry: Entry, client_acks: bool, out: &mut Vec<Effect>) {
        let header = entry.header;
        if !entry.is_void() {
            let event = header.event;
            if let Lookup::Logged(other) =
                self.machine
                    .dedupe()
                    .lookup(event.client, event.session, event.sequence)
            {
                if other != header.version {
                    self.metrics.conflicts += 1;
                }
            }
        }
        self.machine.record(&header);
        self.next_version = self.next_version.max(header.version + 1);
        self.waiting_since = None;
        if client_acks
            && !self.is_primary()
            && !entry.is_void()
            && self.protocol.replicas_ack_client()
        {
            let waiter = Waiter {
                client: header.event.client,
                event: header.event,
                duplicate: false,
                verify: false,
            };
            self.wait_log(header.version, waiter, out);
        }
        out.push(Effect::Append(entry));
    }

    /// A boundary of the output commit interval passed: the batch it
    /// closed is released as far as it is durable. `true` when one passed.
    fn boundary(&mut self, now: u64, out: &mut Vec<Effect>) -> bool {
        let passed = self.boundaries.pass(now, self.machine.last_version());
        if passed {
            self.release(out);
        }
        passed
    }

    fn wait(&mut self, rule: AckRule, version: u64, waiter: Waiter, out: &mut Vec<Effect>) {
        if self.sender.is_some() && self.placement.replicas.len() == 1 {
            // Sender-based logging on one replica: the client's write is
            // done when it holds the version (`Stamped`); no ack follows.
            return;
        }
        match rule {
            AckRule::PrimaryAfterAll if !self.standalone() => {
                if version <= self.boundaries.gate(self.all_logged) {
                    self.ack(version, waiter, out);
                } else {
                    self.after_all.push(version, waiter);
                }
            }
            _ => self.wait_log(version, waiter, out),
        }
    }

    fn wait_log(&mut self, version: u64, waiter: Waiter, out: &mut Vec<Effect>) {
        if version <= self.boundaries.gate(self.logged) {
            self.ack(version, waiter, out);
        } else {
            self.after_log.push(version, waiter);
        }
    }

    fn release(&mut self, out: &mut Vec<Effect>) {
        let logged = self.boundaries.gate(self.logged);
        for (version, waiter) in self.after_log.take_through(logged) {
            self.ack(version, waiter, out);
        }
        let all_logged = self.boundaries.gate(self.all_logged);
        for (version, waiter) in self.after_all.take_through(all_logged) {
            self.ack(version, waiter, out);
        }
    }

    fn ack(&mut self, version: u64, waiter: Waiter, out: &mut Vec<Effect>) {
        let event = waiter.event;
        if waiter.verify
            && self
                .machine
                .dedupe()
                .lookup(event.client, event.session, event.sequence)
                != Lookup::Logged(version)
        {
            return;
        }
        let hint = (self.protocol == Protocol::Hybrid && self.is_primary()).then_some(self.mode);
        let epoch = self.epoch();
        if let Some(Effect::Send(
            Node::Client(to),
            Msg::Ack {
                event: first,
                version: first_version,
                epoch: run_epoch,
                duplicate,
                hint: run_hint,
                count,
            },
        )) = out.last_mut()
        {
            // The next message of the run just before: it joins the run.
            let continues = *to == waiter.client
                && (first.client, first.session) == (event.client, event.session)
                && first.sequence.checked_add(*count) == Some(event.sequence)
                && first_version.checked_add(*count) == Some(version)
                && (*run_epoch, *duplicate, *run_hint) == (epoch, waiter.duplicate, hint)
                && *count < ACK_RUN_MAX;
            if continues {
                *count += 1;
                return;
            }
        }
        out.push(Effect::Send(
            Node::Client(waiter.client),
            Msg::Ack {
                event,
                version,
                epoch,
                duplicate: waiter.duplicate,
                hint,
                count: 1,
            },
        ));
    }

    /// Sends the batched records and bindings, and the new visible point.
    fn finish(&mut self, out: &mut Vec<Effect>) {
        let held = self.pending_acks() as u64;
        self.metrics.pending_acks_peak = self.metrics.pending_acks_peak.max(held);
        let entries = if !self.has_backups() {
            // No replica to send to (a replica set that shrank to this one
            // may leave some behind).
            self.out_entries.clear();
            Vec::new()
        } else if self.sender.is_some() && self.is_primary() {
            // Sender-based logging: replicas get a record only once it is
            // fully logged; the ones still waiting stay, in order.
            let logged = self.logged;
            let cut = self.out_entries.partition_point(|e| e.version() <= logged);
            self.out_entries.drain(..cut).collect()
        } else {
            std::mem::take(&mut self.out_entries)
        };
        if !entries.is_empty() {
            for backup in self.placement.backups() {
                out.push(Effect::Send(
                    Node::Server(backup),
                    Msg::Replicate {
                        entries: entries.clone(),
                    },
                ));
            }
        }
        if !self.out_bindings.is_empty() {
            let bindings = std::mem::take(&mut self.out_bindings);
            for backup in self.placement.backups() {
                out.push(Effect::Send(
                    Node::Server(backup),
                    Msg::Bind {
                        bindings: bindings.clone(),
                    },
                ));
            }
        }
        let durable = self.logged.min(self.committed);
        let visible = self.boundaries.gate(durable);
        if self.boundaries.interval_ms > 0 {
            // A batch every output has gone past is no longer needed.
            let mut low = durable;
            let waiting_for_all =
                !self.after_all.ordered.is_empty() || !self.after_all.late.is_empty();
            if waiting_for_all {
                low = low.min(self.all_logged);
            }
            self.boundaries.prune(low);
        }
        if visible > self.visible {
            self.visible = visible;
            out.push(Effect::Visible(visible));
        }
    }
}

/// Refuses a message whose sequence the client's low-water mark retired.
fn refuse_retired(out: &mut Vec<Effect>, client: u128, event: EventId, low_water: u64) {
    let rejection = crate::Rejection::Retired {
        sequence: event.sequence,
        low_water,
    };
    refuse(out, client, event, rejection.into());
}

fn refuse(out: &mut Vec<Effect>, client: u128, event: EventId, refusal: Refusal) {
    out.push(Effect::Send(
        Node::Client(client),
        Msg::Refused { event, refusal },
    ));
}

fn stamped(client: u128, event: EventId, version: u64, epoch: u64, duplicate: bool) -> Effect {
    Effect::Send(
        Node::Client(client),
        Msg::Stamped {
            event,
            version,
            epoch,
            duplicate,
        },
    )
}

#[cfg(test)]
mod tests {

    use super::*;

    fn placement() -> Placement {
        Placement {
            replicas: vec![1, 2, 3],
            primary: 1,
            epoch: 1,
        }
    }

    fn write(client: u128, sequence: u64) -> Msg {
        Msg::Write(Content {
            event: EventId {
                client,
                session: 1,
                sequence,
            },
            low_water: 1,
            key: Bytes::new(),
            payload: Bytes::from(vec![sequence as u8; 8]),
            resent: false,
        })
    }

    fn appended(out: &[Effect]) -> Vec<Entry> {
        out.iter()
            .filter_map(|effect| match effect {
                Effect::Append(entry) => Some(entry.clone()),
                _ => None,
            })
            .collect()
    }

    /// A primary killed before its log wrote records it had already
    /// forwarded comes back shorter than its replicas. It must fetch those
    /// records before it stamps, or it would put new messages under their
    /// versions.
    #[test]
    fn a_restarted_primary_takes_back_what_its_replicas_hold_before_stamping() {
        let protocol = Protocol::OneHopAckClient;
        let settings = ReplicaSettings::default();
        let mut first = started_primary(protocol, settings);
        let mut out = Vec::new();
        out.clear();
        for sequence in 1..=3 {
            first.on_client(42, write(42, sequence), 2, &mut out);
        }
        let stamped = appended(&out);
        assert_eq!(stamped.len(), 3);

        // The new process's log kept only version 1.
        let mut restarted = Replica::new(7, 1, placement(), protocol, settings);
        restarted.recovered(&stamped[0].header);
        let mut out = Vec::new();
        restarted.start(10, &mut out);
        assert!(restarted.is_rejoining());
        let probes = out
            .iter()
            .filter(|e| matches!(e, Effect::Send(Node::Server(_), Msg::Probe)))
            .count();
        assert_eq!(probes, 2);
        out.clear();
        // A new message waits: no version is handed out yet.
        restarted.on_client(43, write(43, 1), 11, &mut out);
        assert!(appended(&out).is_empty());
        restarted.on_peer(2, Msg::Progress { logged: 3, last: 3 }, 12, &mut out);
        restarted.on_peer(3, Msg::Progress { logged: 2, last: 2 }, 12, &mut out);
        let need = out.iter().find_map(|e| match e {
            Effect::Send(Node::Server(to), Msg::Need { from, to: last }) => {
                Some((*to, *from, *last))
            }
            _ => None,
        });
        assert_eq!(need, Some((2, 2, 3)), "asks the longest replica for 2..=3");
        out.clear();
        let entries = stamped[1..].to_vec();
        restarted.on_peer(2, Msg::Replicate { entries }, 13, &mut out);
        assert!(
            restarted.is_rejoining(),
            "stamping waits for the epoch record"
        );
        assert!(out.contains(&Effect::EpochStarted {
            epoch: 1,
            first_version: 4,
            members: vec![1, 2, 3],
        }));
        restarted.epoch_recorded(1, 14, &mut out);
        assert!(!restarted.is_rejoining());
        let taken = appended(&out);
        assert_eq!(
            taken.len(),
            3,
            "versions 2 and 3 back, then the waiting message"
        );
        assert_eq!(taken[0], stamped[1]);
        assert_eq!(taken[1], stamped[2]);
        assert_eq!(taken[2].version(), 4);
        assert_eq!(taken[2].header.event.client, 43);
    }

    /// Server 1, primary of a fresh stream on servers 1 to 3, once both
    /// backups reported and its first epoch is recorded.
    fn started_primary(protocol: Protocol, settings: ReplicaSettings) -> Replica {
        let mut primary = Replica::new(7, 1, placement(), protocol, settings);
        let mut out = Vec::new();
        primary.start(0, &mut out);
        for id in [2, 3] {
            primary.on_peer(id, Msg::Progress { logged: 0, last: 0 }, 1, &mut out);
        }
        primary.epoch_recorded(1, 1, &mut out);
        primary
    }

    /// Feeds every effect of `out` that is a record to append into the
    /// replica's log at once and reports it logged.
    fn log_all(replica: &mut Replica, out: &mut Vec<Effect>, now: u64) {
        let last = appended(out).last().map(Entry::version);
        if let Some(last) = last {
            replica.on_logged(last, now, out);
        }
    }

    #[test]
    fn a_replica_restored_from_a_checkpoint_matches_one_that_replayed_the_whole_log() {
        let settings = ReplicaSettings::default();
        let mut primary = Replica::new(
            7,
            1,
            Placement {
                replicas: vec![1],
                primary: 1,
                epoch: 1,
            },
            Protocol::OneHopAckClient,
            settings,
        );
        let mut out = Vec::new();
        primary.start(0, &mut out);
        for sequence in 1..=20 {
            for client in [42, 43] {
                primary.on_client(client, write(client, sequence), 1, &mut out);
            }
        }
        let headers: Vec<RecordHeader> = appended(&out).iter().map(|e| e.header).collect();
        assert_eq!(headers.len(), 40);
        let fresh = || Replica::new(7, 1, placement(), Protocol::OneHopAckClient, settings);
        let mut whole = fresh();
        headers.iter().for_each(|h| whole.recovered(h));
        for cut in [0, 1, 17, 40] {
            let mut before = fresh();
            headers[..cut].iter().for_each(|h| before.recovered(h));
            let (version, state) = before.checkpoint_state();
            assert_eq!(version, cut as u64);
            let mut restored = fresh();
            assert_eq!(restored.restore(&state), Ok(cut as u64));
            headers[cut..].iter().for_each(|h| restored.recovered(h));
            assert_eq!(
                restored.checkpoint_state(),
                whole.checkpoint_state(),
                "cut {cut}"
            );
            assert_eq!(restored.dedupe_entries(), whole.dedupe_entries());
        }
        let mut damaged = whole.checkpoint_state().1;
        damaged.truncate(damaged.len() - 1);
        let mut refused = fresh();
        assert!(refused.restore(&damaged).is_err());
        assert_eq!(refused.last_version(), 0, "a refused state changes nothing");
    }

    /// A backup far behind gets the primary's checkpoint instead of the
    /// records its primary no longer keeps: it installs the state, counts
    /// every version up to it as logged, reports so, and asks for the
    /// rest, after which it holds what the primary holds.
    #[test]
    fn a_backup_installs_its_primarys_checkpoint_then_asks_for_the_rest() {
        let protocol = Protocol::OneHopAckClient;
        let settings = ReplicaSettings::default();
        let mut primary = started_primary(protocol, settings);
        let mut out = Vec::new();
        for sequence in 1..=30 {
            primary.on_client(42, write(42, sequence), 2, &mut out);
        }
        let stamped = appended(&out);
        assert_eq!(stamped.len(), 30);
        // The primary's checkpoint at 20: the state after records 1..=20.
        let mut at_twenty = Replica::new(7, 1, placement(), protocol, settings);
        stamped[..20]
            .iter()
            .for_each(|e| at_twenty.recovered(&e.header));
        let (through, state) = at_twenty.checkpoint_state();
        assert_eq!(through, 20);

        let mut backup = Replica::new(7, 2, placement(), protocol, settings);
        let mut out = Vec::new();
        backup.start(3, &mut out);
        let first = stamped[..5].to_vec();
        backup.on_peer(1, Msg::Replicate { entries: first }, 4, &mut out);
        log_all(&mut backup, &mut out, 4);
        backup.on_peer(
            1,
            Msg::Commit {
                committed: 30,
                last: 30,
            },
            5,
            &mut out,
        );
        assert_eq!(backup.last_version(), 5);
        let state = Bytes::from(state);
        let checkpoint = Msg::Checkpoint {
            through: 20,
            state: state.clone(),
        };
        // Only from the primary.
        out.clear();
        backup.on_peer(3, checkpoint.clone(), 6, &mut out);
        assert!(!out.iter().any(|e| matches!(e, Effect::Install { .. })));
        backup.on_peer(1, checkpoint.clone(), 6, &mut out);
        assert!(out.contains(&Effect::Install {
            through: 20,
            state: state.clone(),
        }));
        // A damaged state is refused and changes nothing.
        let mut damaged = state.to_vec();
        damaged.truncate(damaged.len() - 1);
        assert!(backup.decode_install(&damaged).is_err());
        let machine = backup.decode_install(&state).expect("decodes");
        out.clear();
        backup.install(machine, 7, &mut out);
        assert_eq!(backup.last_version(), 20);
        assert_eq!(backup.logged(), 20);
        assert!(out.contains(&Effect::Send(
            Node::Server(1),
            Msg::Progress {
                logged: 20,
                last: 20
            }
        )));
        assert!(out.contains(&Effect::Send(
            Node::Server(1),
            Msg::Need { from: 21, to: 30 }
        )));
        assert!(out.contains(&Effect::Visible(20)));
        assert!(appended(&out).is_empty(), "nothing up to 20 is logged");
        // A second copy of the same checkpoint is no longer past the log.
        out.clear();
        backup.on_peer(1, checkpoint, 8, &mut out);
        assert!(!out.iter().any(|e| matches!(e, Effect::Install { .. })));
        assert!(backup.decode_install(&state).is_err());
        // The rest comes by the usual repair and is logged from 21 on.
        let rest = stamped[20..].to_vec();
        backup.on_peer(1, Msg::Replicate { entries: rest }, 9, &mut out);
        let taken: Vec<u64> = appended(&out).iter().map(Entry::version).collect();
        assert_eq!(taken, (21..=30).collect::<Vec<_>>());
        log_all(&mut backup, &mut out, 9);
        assert_eq!(backup.logged(), 30);
        let mut whole = Replica::new(7, 1, placement(), protocol, settings);
        stamped.iter().for_each(|e| whole.recovered(&e.header));
        assert_eq!(backup.checkpoint_state(), whole.checkpoint_state());
        // The dedupe table came with the state: a duplicate is known.
        assert_eq!(backup.dedupe_entries(), whole.dedupe_entries());
    }

    #[test]
    fn a_backup_takes_over_in_a_new_epoch_from_the_longest_live_tail() {
        let protocol = Protocol::OneHopAckClient;
        let settings = ReplicaSettings::default();
        let mut primary = started_primary(protocol, settings);
        let mut out = Vec::new();
        out.clear();
        for sequence in 1..=3 {
            primary.on_client(42, write(42, sequence), 2, &mut out);
        }
        let stamped = appended(&out);

        // Server 2 has versions 1..=2, server 3 all three; 1 dies.
        let mut second = Replica::new(7, 2, placement(), protocol, settings);
        let mut out = Vec::new();
        second.start(0, &mut out);
        second.on_peer(
            1,
            Msg::Replicate {
                entries: stamped[..2].to_vec(),
            },
            3,
            &mut out,
        );
        log_all(&mut second, &mut out, 3);
        out.clear();
        let next = Placement {
            replicas: vec![2, 3],
            primary: 2,
            epoch: 2,
        };
        second.reconfigure(next, &[2, 3], &[3], 10, &mut out);
        assert!(second.is_primary() && second.is_rejoining());
        assert!(out.contains(&Effect::Send(Node::Server(3), Msg::Probe)));
        out.clear();
        second.on_peer(3, Msg::Progress { logged: 3, last: 3 }, 11, &mut out);
        assert!(out.contains(&Effect::Send(Node::Server(3), Msg::Need { from: 3, to: 3 })));
        out.clear();
        second.on_peer(
            3,
            Msg::Replicate {
                entries: stamped[2..].to_vec(),
            },
            12,
            &mut out,
        );
        assert_eq!(appended(&out), stamped[2..].to_vec());
        assert!(out.contains(&Effect::EpochStarted {
            epoch: 2,
            first_version: 4,
            members: vec![2, 3],
        }));
        log_all(&mut second, &mut out, 12);
        out.clear();
        // A client resends version 2's message: the original version comes
        // back as a duplicate once stamping starts; a new message gets 4.
        second.on_client(42, write(42, 2), 13, &mut out);
        second.on_client(42, write(42, 4), 13, &mut out);
        assert!(appended(&out).is_empty(), "nothing before the record");
        second.epoch_recorded(2, 14, &mut out);
        let taken = appended(&out);
        assert_eq!(taken.len(), 1);
        assert_eq!((taken[0].version(), taken[0].header.epoch), (4, 2));
        second.on_peer(3, Msg::Progress { logged: 4, last: 4 }, 15, &mut out);
        log_all(&mut second, &mut out, 15);
        let acks: Vec<(u64, bool)> = out
            .iter()
            .filter_map(|e| match e {
                Effect::Send(
                    Node::Client(42),
                    Msg::Ack {
                        version, duplicate, ..
                    },
                ) => Some((*version, *duplicate)),
                _ => None,
            })
            .collect();
        assert!(acks.contains(&(2, true)), "{acks:?}");
    }

    /// A producer whose stream fails over resends what is not done with
    /// the resent mark; the new primary logs a message it did not have
    /// with `possible-duplicate`, and answers one it had as a duplicate
    /// without touching its record. Before the failover nothing is marked.
    #[test]
    fn messages_resent_after_a_failover_carry_possible_duplicate() {
        use crate::replication::{Producer, ProducerSettings};
        let protocol = Protocol::OneHopAckClient;
        let settings = ReplicaSettings::default();
        let mut producer = Producer::new(42, 1, protocol, placement(), ProducerSettings::default());
        let mut sent = Vec::new();
        for _ in 0..2 {
            producer.send(Bytes::new(), Bytes::from(vec![7; 8]), 0, &mut sent);
        }
        let mut primary = started_primary(protocol, settings);
        let mut out = Vec::new();
        for (_, msg) in sent.drain(..) {
            let Msg::Write(content) = &msg else {
                panic!("one-hop-ack-client writes to the primary: {msg:?}");
            };
            assert!(!content.resent);
            primary.on_client(42, msg, 1, &mut out);
        }
        let first = appended(&out);
        assert!(first
            .iter()
            .all(|e| e.header.flags & proto::FLAG_POSSIBLE_DUPLICATE == 0));

        // Server 2 holds version 1 only when server 1 dies.
        let mut second = Replica::new(7, 2, placement(), protocol, settings);
        second.start(0, &mut out);
        let mut out = Vec::new();
        second.on_peer(
            1,
            Msg::Replicate {
                entries: first[..1].to_vec(),
            },
            2,
            &mut out,
        );
        log_all(&mut second, &mut out, 2);
        let next = Placement {
            replicas: vec![2, 3],
            primary: 2,
            epoch: 2,
        };
        second.reconfigure(next.clone(), &[2, 3], &[3], 3, &mut out);
        second.on_peer(3, Msg::Progress { logged: 1, last: 1 }, 4, &mut out);
        second.epoch_recorded(2, 5, &mut out);
        out.clear();

        producer.reconfigure(next, 6, &mut sent);
        assert_eq!(sent.len(), 2);
        for (node, msg) in sent.drain(..) {
            assert_eq!(node, Node::Server(2));
            let Msg::Write(content) = &msg else {
                panic!("a resend goes to the new primary: {msg:?}");
            };
            assert!(content.resent);
            second.on_client(42, msg, 7, &mut out);
        }
        let taken = appended(&out);
        assert_eq!(taken.len(), 1, "version 1 was a duplicate");
        assert_eq!((taken[0].version(), taken[0].header.epoch), (2, 2));
        assert_eq!(
            taken[0].header.flags & proto::FLAG_POSSIBLE_DUPLICATE,
            proto::FLAG_POSSIBLE_DUPLICATE
        );
        log_all(&mut second, &mut out, 8);
        second.on_peer(3, Msg::Progress { logged: 2, last: 2 }, 9, &mut out);
        for effect in out.drain(..) {
            if let Effect::Send(Node::Client(42), msg) = effect {
                producer.on_message(2, msg, 10, &mut sent);
            }
        }
        // server 3 acks for one-hop-ack-client too: it logged version 2.
        for (version, duplicate) in [(1, true), (2, false)] {
            let event = EventId {
                client: 42,
                session: 1,
                sequence: version,
            };
            let ack = Msg::Ack {
                event,
                version,
                epoch: 2,
                duplicate,
                hint: None,
                count: 1,
            };
            producer.on_message(3, ack, 10, &mut sent);
        }
        let done: Vec<(u64, bool, bool)> = producer
            .take_completed()
            .into_iter()
            .map(|c| {
                let a = c.outcome.expect("acknowledged");
                (a.version, a.duplicate, a.possible_duplicate)
            })
            .collect();
        assert_eq!(done, vec![(1, true, true), (2, false, true)]);
    }

    #[test]
    fn a_replica_out_of_sync_does_not_hold_acks_until_it_catches_up() {
        let protocol = Protocol::ServerSync;
        let settings = ReplicaSettings::default();
        let mut primary = started_primary(protocol, settings);
        let mut out = Vec::new();
        // Server 3 came back and is not in sync.
        primary.reconfigure(placement(), &[1, 2], &[2, 3], 2, &mut out);
        assert_eq!(primary.counting().collect::<Vec<_>>(), vec![2]);
        out.clear();
        primary.on_client(42, write(42, 1), 3, &mut out);
        log_all(&mut primary, &mut out, 3);
        primary.on_peer(2, Msg::Progress { logged: 1, last: 1 }, 4, &mut out);
        let acked = out.iter().any(|e| {
            matches!(
                e,
                Effect::Send(Node::Client(42), Msg::Ack { version: 1, .. })
            )
        });
        assert!(acked, "server 3 does not hold the ack");
        assert_eq!(primary.committed(), 1);
        out.clear();
        primary.on_peer(3, Msg::Progress { logged: 1, last: 1 }, 5, &mut out);
        assert!(out.contains(&Effect::InSync(3)));
        assert_eq!(primary.counting().collect::<Vec<_>>(), vec![2, 3]);
    }
}
