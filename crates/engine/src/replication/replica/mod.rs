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

mod acks;
mod backup;
mod heartbeat;
mod primary;
mod rejoin;
mod sender;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use proto::{EventId, RecordHeader};

use super::message::{Binding, Bytes, Content, Entry, Msg, Node, Refusal, ServerId, ACK_RUN_MAX};
use super::protocol::{AckRule, Flow, HybridMode, Protocol};
use crate::dedupe::{DedupeLimits, Lookup};
use crate::{Decision, StreamMachine};

use acks::{refuse, refuse_retired, stamped, Boundaries, Waiter, Waiters};
use backup::Unbound;
use heartbeat::Heartbeat;
use primary::Reservation;
use sender::SenderLog;

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

/// What the cluster says of a stream, as one server's replica follows it
/// (the control plane's `StreamPlacement::live_view`): the live placement,
/// the live in-sync replicas, the backups whose tails a new primary takes,
/// and whether the cluster has recorded the current epoch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterView {
    pub placement: Placement,
    pub in_sync: Vec<ServerId>,
    pub consider: Vec<ServerId>,
    pub epoch_recorded: bool,
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
    /// Progress and commit reports are repeated this long after one that
    /// told something new, so a lost one is replaced.
    pub heartbeat_ms: u64,
    /// A repeat that told nothing new doubles the wait before the next,
    /// up to this: a quiet stream's replicas report about this often.
    pub heartbeat_max_ms: u64,
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
            heartbeat_max_ms: 800,
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

/// One stream on one server: the primary's or a backup's half of the
/// stream's protocol, by `placement`. Every field is private to this
/// folder; each file of it holds one role's fields' logic.
pub struct Replica {
    /// The stream's id, carried in every record header this replica makes.
    stream: u64,
    /// This server.
    me: ServerId,
    /// The live replica set, its primary and epoch, as the cluster last
    /// said (`reconfigure`).
    placement: Placement,
    /// The stream's replication protocol: who stamps, who forwards, and
    /// each message's ack rule.
    protocol: Protocol,
    /// Timeouts and bounds.
    settings: ReplicaSettings,
    /// Version assignment and the dedupe table: what the log holds.
    machine: StreamMachine,
    /// The log holds every version up to this one (by the durability
    /// mode's rule; with sender-based logging, fully logged ones only).
    logged: u64,
    /// Every version up to this one met its commit quorum (primary), or
    /// the primary said so (`Commit`).
    committed: u64,
    /// Readers may see every version up to this one: `min(logged,
    /// committed)` through the commit interval's gate; never goes down.
    visible: u64,
    // --- the primary (`primary.rs`) ---
    /// The version the next new message gets.
    next_version: u64,
    /// `version-request`: versions handed out whose message has not
    /// arrived, with their deadline (voided after it).
    reservations: BTreeMap<u64, Reservation>,
    /// `version-request`: the version reserved for each event id.
    reserved: HashMap<EventId, u64>,
    /// How far each counting backup reported its log reaches.
    peer_logged: BTreeMap<ServerId, u64>,
    /// Backups whose logs count toward acknowledgements and the commit
    /// point: the in-sync replicas, and those that have caught up since.
    counting: BTreeSet<ServerId>,
    /// How far every counting log (this one included) reaches: what
    /// `PrimaryAfterAll` acks wait for.
    all_logged: u64,
    /// First version → the ack rule, and so how many logs make it
    /// committed (a hybrid's rule changes between versions).
    quorum: BTreeMap<u64, AckRule>,
    /// `hybrid`: each client's last message time, within the active window.
    active: HashMap<u128, u64>,
    /// `hybrid`: the current choice, from the live counts.
    mode: HybridMode,
    /// When `Commit` (or a rejoining primary's `Probe`) was last sent, and
    /// when it is repeated: the heartbeat to the backups.
    commit_beat: Heartbeat,
    /// Records stamped in this step, sent to the backups as one
    /// `Replicate` when the step finishes.
    out_entries: Vec<Entry>,
    /// Bindings made in this step, sent as one `Bind` when it finishes.
    out_bindings: Vec<Binding>,
    // --- a backup (`backup.rs`) ---
    /// Records past the log's end, held back until every earlier version
    /// is logged (bounded by `held_max`).
    held: BTreeMap<u64, Entry>,
    /// Client content that waits for the primary's binding (bounded by
    /// `unbound_max`, dropped after `unbound_timeout_ms`).
    unbound: HashMap<EventId, Unbound>,
    /// The primary's bindings whose content has not arrived.
    bindings: BTreeMap<u64, Binding>,
    /// The newest version the primary is known to have: a gap below it is
    /// repaired with `Need`.
    primary_last: u64,
    /// Since when the log has waited for a missing version.
    waiting_since: Option<u64>,
    /// When the outstanding `Need` was sent.
    need_sent_at: Option<u64>,
    /// The last version the outstanding `Need` asked for.
    need_to: Option<u64>,
    /// The logged version last reported to the primary (`Progress`).
    progress_sent: u64,
    /// When `Progress` was last sent, and when it is repeated: the
    /// heartbeat to the primary.
    progress_beat: Heartbeat,
    // --- starting and rejoining (`rejoin.rs`) ---
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
    /// The cluster's view this replica last followed (`follow`).
    followed: Option<ClusterView>,
    // --- acks and the commit interval (`acks.rs`) ---
    /// Acknowledgements waiting for this replica's log.
    after_log: Waiters,
    /// Acknowledgements waiting for every counting log (the primary's
    /// `PrimaryAfterAll`).
    after_all: Waiters,
    /// The output commit interval's batches.
    boundaries: Boundaries,
    // --- sender-based logging (`sender.rs`) ---
    /// Sender-based message logging (`None`: the log's own rule).
    sender: Option<SenderLog>,
    /// Counters for status and metrics.
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
            commit_beat: Heartbeat::default(),
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
            followed: None,
            progress_sent: 0,
            progress_beat: Heartbeat::default(),
            after_log: Waiters::default(),
            after_all: Waiters::default(),
            boundaries: Boundaries::new(settings.commit_interval_ms),
            sender: settings.sender_logging.then(SenderLog::default),
            metrics: ReplicaMetrics::default(),
            placement,
        }
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

    /// When [`Replica::on_tick`] next has work, if it has none before this
    /// replica's next heartbeat: that heartbeat's time (`u64::MAX` for a
    /// replica with no heartbeat to send). `None` while anything waits on
    /// the clock or on another message: records not logged, committed or
    /// sent yet, acknowledgements held back, held or missing records,
    /// reservations, a start or rejoin, sender recovery, a hybrid stream's
    /// recent writers. A caller that ticks only then must ask again after
    /// every step, as a step can end the quiet. Output commit boundaries
    /// are [`Replica::wake_at`]'s.
    pub fn quiet_until(&self) -> Option<u64> {
        let last = self.machine.last_version();
        let waits = self.logged < last
            || self.committed < last
            || self.pending_acks() > 0
            || !self.out_entries.is_empty()
            || !self.out_bindings.is_empty()
            || self.unrecorded.is_some()
            || self.rejoining.is_some()
            || !self.reservations.is_empty()
            || (self.protocol == Protocol::Hybrid && !self.active.is_empty())
            || self.sender_recovering()
            || !self.held.is_empty()
            || !self.unbound.is_empty()
            || self.waiting_since.is_some()
            || self.need_to.is_some()
            || (!self.is_primary() && self.known_last() > last);
        if waits {
            return None;
        }
        let beat = match self.is_primary() {
            true if self.standalone() => return Some(u64::MAX),
            true => &self.commit_beat,
            false => &self.progress_beat,
        };
        Some(beat.due_at(&self.settings))
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

    /// What the dedupe table knows of `event`.
    fn lookup(&self, event: &EventId) -> Lookup {
        self.machine
            .dedupe()
            .lookup(event.client, event.session, event.sequence)
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
        self.note_sender(client);
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
                self.take_replicated(entries, out);
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
                    Waiter::verified_duplicate(event.client, event),
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
                if self.commit_beat.is_due(now, &self.settings) {
                    self.commit_beat.probed(now);
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
            if self.commit_beat.is_due(now, &self.settings) && !self.standalone() {
                self.send_commit(now, out);
            }
        } else {
            self.repair_gap(now, out);
            let timeout = self.settings.unbound_timeout_ms;
            self.unbound
                .retain(|_, held| now.saturating_sub(held.received) < timeout);
            if self.progress_beat.is_due(now, &self.settings) {
                self.send_progress(now, out);
            }
        }
        self.finish(out);
    }
}
