//! The client side of every protocol: one producer session of one stream.
//! It sends each message by its protocol's flow, collects the
//! acknowledgements its ack rule needs, and resends (same event id, same
//! content) on a timeout. Pure, like [`super::Replica`]: the client library
//! and the simulator drive it.
//!
//! Invariant: a message's content (event id, low-water mark, key, payload)
//! never changes between its first send and its completion, so every copy
//! of it, on every replica and in every retry, is the same bytes.

use std::collections::BTreeMap;

use proto::EventId;

use super::message::{Bytes, Content, Msg, Node, Refusal, ServerId, ACK_RUN_MAX};
use super::protocol::{AckRule, Flow, HybridMode, Protocol};
use super::replica::Placement;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProducerSettings {
    /// A message not done after this long is sent again.
    pub retry_ms: u64,
    /// A message a server refused for a passing reason (`Busy`: its log
    /// or backlog is full; its dedupe table is full) is sent again after
    /// this long, doubling with each further refusal up to `retry_ms`: a
    /// held-up message holds the publisher's window (it slides over
    /// sequences), so waiting the whole retry time would stall it.
    pub busy_retry_ms: u64,
    /// Sender-based message logging (the stream's durability `sender`):
    /// confirm each version the primary returns, and keep every message
    /// with its version after it is done, until the primary's checkpoint
    /// covers it, to resend it if the primary restarts.
    pub sender_logging: bool,
}

impl Default for ProducerSettings {
    fn default() -> Self {
        ProducerSettings {
            retry_ms: 1_000,
            busy_retry_ms: BUSY_RETRY_MS,
            sender_logging: false,
        }
    }
}

/// The first resend after a passing refusal, by default.
pub const BUSY_RETRY_MS: u64 = 5;

/// A done message kept for sender-based logging.
#[derive(Debug)]
struct Held {
    content: Content,
    /// The epoch of the `Stamped` that gave the version (0: unknown).
    epoch: u64,
}

impl Held {
    fn bytes(&self) -> usize {
        self.content.key.len() + self.content.payload.len()
    }
}

/// A message the producer is done with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub event: EventId,
    pub outcome: Result<Acknowledged, Refusal>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acknowledged {
    /// The version (for `unversioned`, the first replica's own).
    pub version: u64,
    /// Some acknowledgement said the message was already logged.
    pub duplicate: bool,
    /// The message was sent again after a failover: it may have been
    /// logged before (`duplicate` says it surely was). A record made from
    /// the resend carries `possible-duplicate`.
    pub possible_duplicate: bool,
    /// Every acknowledgement received: server and the version it named.
    pub acks: Vec<(ServerId, u64)>,
}

#[derive(Debug)]
struct Pending {
    content: Content,
    flow: Flow,
    rule: AckRule,
    /// The primary's version, once known (`version-request`,
    /// `returns-version`).
    version: Option<u64>,
    /// The epoch of the primary's `Stamped` that gave `version` as new:
    /// the replicas may build the record from this copy in that epoch.
    /// `None` when the version came any other way (a duplicate, an ack),
    /// and the replicas take the primary's record instead: it may have
    /// been stamped in an earlier epoch, and its header says which.
    stamped_in: Option<u64>,
    acks: Vec<(ServerId, u64)>,
    duplicate: bool,
    /// When the message is sent again if not done by then.
    due_at: u64,
    /// Passing refusals in a row (`Busy`, dedupe table full): the next
    /// resend waits `busy_retry_ms` doubled this many times.
    refusals: u32,
}

pub struct Producer {
    client: u128,
    session: u64,
    protocol: Protocol,
    placement: Placement,
    settings: ProducerSettings,
    next_sequence: u64,
    pending: BTreeMap<u64, Pending>,
    /// No pending message is due for a resend before this time: `on_tick`
    /// scans the pending messages only from then on, not at every tick (a
    /// window of 65,536 scanned every 10 ms cost more than the messages).
    resend_scan_at: u64,
    mode: HybridMode,
    completed: Vec<Completion>,
    /// Sender-based logging: done messages by version, until the
    /// primary's checkpoint covers them.
    held: BTreeMap<u64, Held>,
    held_bytes: usize,
    /// The sequences an `Ack` completed (kept between acks, with its room).
    done_scratch: Vec<u64>,
}

impl Producer {
    pub fn new(
        client: u128,
        session: u64,
        protocol: Protocol,
        placement: Placement,
        settings: ProducerSettings,
    ) -> Producer {
        Producer {
            client,
            session,
            protocol,
            mode: HybridMode::choose(placement.replicas.len(), 1),
            placement,
            settings,
            next_sequence: 1,
            pending: BTreeMap::new(),
            resend_scan_at: 0,
            completed: Vec::new(),
            held: BTreeMap::new(),
            held_bytes: 0,
            done_scratch: Vec::new(),
        }
    }

    /// Sender-based logging: done messages kept until the primary's
    /// checkpoint covers them, and their key and payload bytes.
    pub fn held(&self) -> (usize, usize) {
        (self.held.len(), self.held_bytes)
    }

    /// Starts sequences after `last` (a session resumed by a new process).
    pub fn resume_after(&mut self, last: u64) {
        self.next_sequence = self.next_sequence.max(last + 1);
    }

    pub fn client(&self) -> u128 {
        self.client
    }

    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// Messages sent and not yet done.
    pub fn in_flight(&self) -> usize {
        self.pending.len()
    }

    /// Every sequence below this one is done.
    pub fn low_water(&self) -> u64 {
        self.pending
            .keys()
            .next()
            .copied()
            .unwrap_or(self.next_sequence)
    }

    /// The mode a `hybrid` producer sends in (the primary's last hint).
    pub fn hybrid_mode(&self) -> HybridMode {
        self.mode
    }

    /// Where the stream lives as this producer sends.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The stream failed over (or its replica set changed): every message
    /// not done goes again, same event id and content, to the new
    /// placement, forgetting acknowledgements and versions from before
    /// (the new primary's dedupe table answers with the original version
    /// for what had landed).
    pub fn reconfigure(&mut self, placement: Placement, now: u64, out: &mut Vec<(Node, Msg)>) {
        if placement == self.placement {
            return;
        }
        // Only a new epoch marks resends: within one epoch a late answer
        // to the first copy may still place it, and every replica must
        // build the same bytes the primary logged.
        let failover = placement.epoch != self.placement.epoch;
        self.placement = placement;
        for pending in self.pending.values_mut() {
            pending.content.resent |= failover;
            pending.acks.clear();
            pending.version = None;
            pending.stamped_in = None;
            pending.due_at = now + self.settings.retry_ms;
            pending.refusals = 0;
        }
        for pending in self.pending.values() {
            self.dispatch(pending, true, out);
        }
        if failover {
            // Sender-based logging: a done message may not have reached
            // the new primary yet (the old one forwards only what is fully
            // logged, and `server-async` acks before its replicas log).
            // The resend is answered `duplicate` where it had landed.
            let primary = self.placement.primary;
            for held in self.held.values() {
                let mut content = held.content.clone();
                content.resent = true;
                out.push((Node::Server(primary), Msg::Write(content)));
            }
        }
    }

    /// Messages done since the last call.
    pub fn take_completed(&mut self) -> Vec<Completion> {
        std::mem::take(&mut self.completed)
    }

    /// Moves the messages done since the last call onto `into`, keeping
    /// this producer's list (and its room) for the next ones: a caller
    /// that empties `into` each time allocates nothing per burst of acks.
    pub fn drain_completed(&mut self, into: &mut Vec<Completion>) {
        into.append(&mut self.completed);
    }

    /// Sends a new message; returns its event id.
    pub fn send(
        &mut self,
        key: Bytes,
        payload: Bytes,
        now: u64,
        out: &mut Vec<(Node, Msg)>,
    ) -> EventId {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        let event = EventId {
            client: self.client,
            session: self.session,
            sequence,
        };
        let content = Content {
            event,
            low_water: self.low_water().min(sequence),
            key,
            payload,
            resent: false,
        };
        let pending = Pending {
            content,
            flow: self.protocol.flow(self.mode),
            rule: self.protocol.ack_rule(self.mode),
            version: None,
            stamped_in: None,
            acks: Vec::new(),
            duplicate: false,
            due_at: now + self.settings.retry_ms,
            refusals: 0,
        };
        self.dispatch(&pending, false, out);
        self.pending.insert(sequence, pending);
        event
    }

    /// A message from a server.
    pub fn on_message(&mut self, from: ServerId, msg: Msg, now: u64, out: &mut Vec<(Node, Msg)>) {
        if let Msg::Checkpointed { through, resend } = msg {
            if from == self.placement.primary {
                self.checkpointed(through, resend, out);
            }
            return;
        }
        let event = match &msg {
            Msg::Ack { event, .. } | Msg::Stamped { event, .. } | Msg::Refused { event, .. } => {
                *event
            }
            _ => return,
        };
        if event.client != self.client || event.session != self.session {
            return;
        }
        if let Msg::Ack {
            duplicate, hint, ..
        } = msg
        {
            if let Some(mode) = hint.filter(|_| from == self.placement.primary) {
                self.mode = mode;
            }
            self.on_acks(from, &msg, duplicate);
            return;
        }
        match msg {
            Msg::Stamped {
                version,
                epoch,
                duplicate,
                ..
            } => self.on_stamped(from, event, (version, epoch, duplicate), now, out),
            Msg::Refused { refusal, .. } => self.on_refused(event, refusal, now, out),
            _ => {}
        }
    }

    /// The primary's version for a message: with sender-based logging it is
    /// the receive sequence number, held and confirmed; otherwise the
    /// message goes on to the replicas its flow names.
    fn on_stamped(
        &mut self,
        from: ServerId,
        event: EventId,
        (version, epoch, duplicate): (u64, u64, bool),
        now: u64,
        out: &mut Vec<(Node, Msg)>,
    ) {
        let sender_logging = self.settings.sender_logging;
        let Some(pending) = self.pending.get_mut(&event.sequence) else {
            return;
        };
        if sender_logging && pending.flow == Flow::Forward {
            // The receive sequence number: hold the message with it and
            // confirm; the primary counts the message as logged now.
            if from != self.placement.primary {
                return;
            }
            if pending.version != Some(version) {
                pending.version = Some(version);
                pending.stamped_in = (!duplicate).then_some(epoch);
            }
            pending.duplicate |= duplicate;
            let confirm = Msg::Confirm {
                event,
                version,
                count: 1,
            };
            out.push((Node::Server(from), confirm));
            if self.placement.replicas.len() == 1 {
                // One replica: the write is done once this client holds
                // the message with its version (the original protocol's
                // "fully logged"); a restart of the server takes it back
                // from the copy. With more, the protocol's acks decide.
                let pending = self.pending.remove(&event.sequence).expect("present");
                self.complete_held(event, version, pending, vec![(from, version)]);
            }
            return;
        }
        if pending.version.is_some() || from != self.placement.primary {
            return;
        }
        pending.version = Some(version);
        pending.stamped_in = (!duplicate).then_some(epoch);
        pending.duplicate |= duplicate;
        pending.due_at = now + self.settings.retry_ms;
        pending.refusals = 0;
        let pending = &self.pending[&event.sequence];
        self.dispatch(pending, false, out);
    }

    /// A server refused a message: ask for a new version, wait for a new
    /// placement, back off and send it again, or give up on it.
    fn on_refused(
        &mut self,
        event: EventId,
        refusal: Refusal,
        now: u64,
        out: &mut Vec<(Node, Msg)>,
    ) {
        let Some(pending) = self.pending.get_mut(&event.sequence) else {
            return;
        };
        match refusal {
            Refusal::VersionVoid => {
                // The version was voided: ask for a new one.
                pending.version = None;
                pending.stamped_in = None;
                pending.acks.clear();
                pending.due_at = now + self.settings.retry_ms;
                let pending = &self.pending[&event.sequence];
                self.dispatch(pending, false, out);
            }
            // A new primary is announced by a placement, which sends
            // everything again; else the retry timer does.
            Refusal::NotPrimary => {}
            // Passing conditions: sent again soon, backing off. A full
            // log drains as the disk catches up; a full dedupe table
            // empties as earlier messages complete and the low-water
            // mark passes them.
            Refusal::Busy | Refusal::Rejected(crate::Rejection::DedupeFull) => {
                let settings = self.settings;
                let wait = settings
                    .busy_retry_ms
                    .max(1)
                    .saturating_mul(1 << pending.refusals.min(16))
                    .min(settings.retry_ms);
                pending.refusals += 1;
                pending.due_at = pending.due_at.min(now + wait);
                self.resend_scan_at = self.resend_scan_at.min(pending.due_at);
            }
            Refusal::Rejected(_) | Refusal::Invalid | Refusal::LogFailed | Refusal::ReadOnly => {
                self.pending.remove(&event.sequence);
                self.completed.push(Completion {
                    event,
                    outcome: Err(refusal),
                });
            }
        }
    }

    /// The messages of an `Ack` (a run names several), in one pass over
    /// the pending messages it covers.
    fn on_acks(&mut self, from: ServerId, msg: &Msg, duplicate: bool) {
        let &Msg::Ack {
            event: first,
            version: first_version,
            count,
            ..
        } = msg
        else {
            return;
        };
        let count = count.clamp(1, ACK_RUN_MAX);
        let last = first.sequence.saturating_add(count - 1);
        let mut done = std::mem::take(&mut self.done_scratch);
        let primary = self.placement.primary;
        for (&sequence, pending) in self.pending.range_mut(first.sequence..=last) {
            let version = first_version.saturating_add(sequence - first.sequence);
            if pending.flow != Flow::Local && from == primary && pending.version.is_none() {
                // The primary's word on the version wins over a replica's
                // (a replica that came back may ack a stale copy).
                pending.version = Some(version);
                pending.stamped_in = None;
                pending.acks.retain(|(_, acked)| *acked == version);
            }
            if pending.version.is_some_and(|known| known != version) {
                // An ack names the version the server's log holds the
                // message at, so it wins: a `Stamped` can be a stale answer
                // naming a reservation voided since.
                pending.version = Some(version);
                pending.stamped_in = None;
                pending.acks.retain(|(_, acked)| *acked == version);
            }
            if !pending.acks.iter().any(|(server, _)| *server == from) {
                pending.acks.push((from, version));
            }
            pending.duplicate |= duplicate;
            if is_done(&self.placement, pending) {
                done.push(sequence);
            }
        }
        for sequence in done.drain(..) {
            let mut pending = self.pending.remove(&sequence).expect("present");
            let version = match pending.flow {
                Flow::Local => pending.acks[0].1,
                _ => pending.version.unwrap_or_else(|| pending.acks[0].1),
            };
            let acks = std::mem::take(&mut pending.acks);
            let event = EventId { sequence, ..first };
            self.complete_held(event, version, pending, acks);
        }
        self.done_scratch = done;
    }

    /// Resends every message not done within the retry time.
    pub fn on_tick(&mut self, now: u64, out: &mut Vec<(Node, Msg)>) {
        if now < self.resend_scan_at {
            return;
        }
        let retry = self.settings.retry_ms;
        let due: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.due_at <= now)
            .map(|(sequence, _)| *sequence)
            .collect();
        for sequence in due {
            let pending = self.pending.get_mut(&sequence).expect("present");
            pending.due_at = now + retry;
            let pending = &self.pending[&sequence];
            self.dispatch(pending, true, out);
        }
        // Nothing is due before the earliest `due_at`, and a refusal that
        // brings one forward brings this forward too: the ticks until then
        // need not look.
        let earliest = self.pending.values().map(|p| p.due_at).min();
        self.resend_scan_at = earliest.unwrap_or(now.saturating_add(retry));
    }

    /// A message is done at `version`: with sender-based logging, its copy
    /// is kept until the primary's checkpoint covers it.
    fn complete_held(
        &mut self,
        event: EventId,
        version: u64,
        pending: Pending,
        acks: Vec<(ServerId, u64)>,
    ) {
        let possible_duplicate = pending.content.resent;
        let duplicate = pending.duplicate;
        if self.settings.sender_logging && pending.flow == Flow::Forward {
            let held = Held {
                content: pending.content,
                epoch: pending.stamped_in.unwrap_or(0),
            };
            self.held_bytes += held.bytes();
            if let Some(old) = self.held.insert(version, held) {
                self.held_bytes -= old.bytes();
            }
        }
        self.completed.push(Completion {
            event,
            outcome: Ok(Acknowledged {
                version,
                duplicate,
                possible_duplicate,
                acks,
            }),
        });
    }

    /// Sender-based logging: the primary's checkpoint covers `through`;
    /// with `resend`, it restarted and asks for every copy past it.
    fn checkpointed(&mut self, through: u64, resend: bool, out: &mut Vec<(Node, Msg)>) {
        let kept = self.held.split_off(&(through + 1));
        for dropped in std::mem::replace(&mut self.held, kept).values() {
            self.held_bytes -= dropped.bytes();
        }
        if !resend {
            return;
        }
        let primary = self.placement.primary;
        for (version, held) in &self.held {
            out.push((
                Node::Server(primary),
                Msg::Placed {
                    version: *version,
                    epoch: held.epoch,
                    content: held.content.clone(),
                },
            ));
        }
        for pending in self.pending.values() {
            self.dispatch(pending, true, out);
        }
    }
    /// Sends what the message's flow calls for at its current step, to the
    /// servers that have not acked yet.
    fn dispatch(&self, pending: &Pending, retry: bool, out: &mut Vec<(Node, Msg)>) {
        let primary = self.placement.primary;
        let unacked = |server: &ServerId| !pending.acks.iter().any(|(s, _)| s == server);
        let content = &pending.content;
        match (pending.flow, pending.version) {
            (Flow::Local, _) => {
                for server in self.placement.replicas.iter().filter(|s| unacked(s)) {
                    out.push((Node::Server(*server), Msg::Write(content.clone())));
                }
            }
            (Flow::Reserve, None) => out.push((
                Node::Server(primary),
                Msg::Reserve {
                    event: content.event,
                    low_water: content.low_water,
                },
            )),
            (Flow::Forward, Some(version)) if self.settings.sender_logging => {
                // Sender-based logging: the message goes with the version
                // it holds (a restarted primary places it there).
                out.push((
                    Node::Server(primary),
                    Msg::Placed {
                        version,
                        epoch: pending.stamped_in.unwrap_or(0),
                        content: content.clone(),
                    },
                ))
            }
            (Flow::Stamp, None) | (Flow::Forward, _) => {
                out.push((Node::Server(primary), Msg::Write(content.clone())))
            }
            (Flow::Reserve | Flow::Stamp, Some(version)) => {
                for server in self.placement.replicas.iter().filter(|s| unacked(s)) {
                    let msg = if pending.flow == Flow::Stamp && *server == primary {
                        // The primary logged it when it stamped it; only a
                        // resend asks again (for its lost ack).
                        if !retry {
                            continue;
                        }
                        Msg::Write(content.clone())
                    } else {
                        Msg::Placed {
                            version,
                            // 0: the primary had logged it already (or the
                            // version came without a fresh stamp), so the
                            // replicas take its record, not this copy.
                            epoch: match pending.stamped_in {
                                Some(epoch) if !pending.duplicate => epoch,
                                _ => 0,
                            },
                            content: content.clone(),
                        }
                    };
                    out.push((Node::Server(*server), msg));
                }
            }
            (Flow::Tagged, _) => {
                for server in self.placement.replicas.iter().filter(|s| unacked(s)) {
                    out.push((Node::Server(*server), Msg::Tagged(content.clone())));
                }
            }
        }
    }
}

/// Whether the acks `pending` holds meet its ack rule.
fn is_done(placement: &Placement, pending: &Pending) -> bool {
    let acked = |server: ServerId| pending.acks.iter().any(|(s, _)| *s == server);
    // Every ack names the same version (`unversioned` excepted, where each
    // replica has its own).
    let agreed = pending.flow == Flow::Local
        || pending
            .acks
            .first()
            .is_none_or(|(_, first)| pending.acks.iter().all(|(_, v)| v == first));
    if !agreed {
        return false;
    }
    match pending.rule {
        AckRule::EveryReplica => placement.replicas.iter().all(|s| acked(*s)),
        AckRule::FirstReplica => !pending.acks.is_empty(),
        AckRule::PrimaryAfterAll | AckRule::PrimaryOnly => acked(placement.primary),
    }
}
