//! The simulated world: servers with in-memory logs, client processes, a
//! network that delays, reorders, drops and duplicates, and one queue of
//! events ordered by (time, insertion order). Everything here is a pure
//! function of the config: ordered maps only, no clock, no threads.

use std::collections::BTreeMap;
use std::sync::Arc;

use checker::Sent;
use engine::replication::{
    AckRule, Acknowledged, Effect, Entry, HybridMode, Msg, Node, Placement, Producer, Protocol,
    Replica, ServerId,
};
use proto::{EventId, Record};

use crate::config::{Sabotage, SimConfig};
use crate::outcome::Counters;
use crate::rng::Rng;

/// The one stream every run replicates.
pub(crate) const STREAM: u64 = 1;
const EPOCH: u64 = 1;
pub(crate) const PRIMARY: ServerId = 1;
/// Failures kept in words; more are counted, not listed.
const FAILURES_MAX: usize = 20;
/// Key and payload sizes of the generated messages (bytes, inclusive).
const KEY_BYTES_MAX: u64 = 16;
const PAYLOAD_BYTES_MAX: u64 = 64;

enum Event {
    Deliver {
        from: Node,
        to: Node,
        msg: Msg,
    },
    /// The server's log is durable through `through` (a sync finished).
    Durable {
        server: ServerId,
        through: u64,
    },
    ServerTick {
        server: ServerId,
    },
    ClientTick {
        client: usize,
    },
    Crash {
        client: usize,
        restart_after_ms: Option<u64>,
    },
    Restart {
        predecessor: usize,
    },
}

impl Event {
    fn code(&self) -> u64 {
        match self {
            Event::Deliver { .. } => 1,
            Event::Durable { .. } => 2,
            Event::ServerTick { .. } => 3,
            Event::ClientTick { .. } => 4,
            Event::Crash { .. } => 5,
            Event::Restart { .. } => 6,
        }
    }
}

pub(crate) struct Server {
    pub(crate) id: ServerId,
    pub(crate) replica: Replica,
    /// The stream's log: `log[i]` holds version `i + 1`.
    pub(crate) log: Vec<Entry>,
    /// What the simulated disk has synced (reported with `on_logged`).
    pub(crate) durable: u64,
    /// When the last scheduled sync completes, so syncs complete in order
    /// and `durable` never goes back.
    sync_done_at: u64,
    /// The last `Effect::Visible`.
    pub(crate) visible: u64,
}

pub(crate) struct Client {
    pub(crate) id: u128,
    pub(crate) slot: usize,
    pub(crate) producer: Producer,
    /// Messages this process sends in total.
    pub(crate) quota: u32,
    pub(crate) sent: Vec<Sent>,
    pub(crate) acknowledged: Vec<(EventId, Acknowledged)>,
    pub(crate) refused: u32,
    pub(crate) crashed: bool,
}

pub(crate) struct World<'a> {
    pub(crate) config: &'a SimConfig,
    rng: Rng,
    pub(crate) now: u64,
    queue: BTreeMap<(u64, u64), Event>,
    scheduled: u64,
    pub(crate) servers: Vec<Server>,
    pub(crate) clients: Vec<Client>,
    by_id: BTreeMap<u128, usize>,
    restarts_pending: usize,
    /// Drops stop from this time on.
    pub(crate) heal_at: u64,
    senders_done: bool,
    /// The ack rule of each version the primary logged (`rules[v - 1]`):
    /// it says how many logs must hold `v` before anyone may see it.
    rules: Vec<AckRule>,
    /// The rule of the message the primary is handling (`hybrid` takes a
    /// `Write` under server-sync's rule and a `Tagged` under client-async's).
    stamping_rule: Option<AckRule>,
    pub(crate) counters: Counters,
    failures: Vec<String>,
    failures_unlisted: usize,
    pub(crate) trace: Vec<String>,
    pub(crate) hash: u64,
    /// A broken invariant left the world inconsistent: stop at once.
    pub(crate) aborted: bool,
    quiescent: bool,
}

impl<'a> World<'a> {
    pub(crate) fn new(config: &'a SimConfig) -> World<'a> {
        assert!(config.servers >= 1, "a placement needs a server");
        assert!(config.window >= 1, "a client needs room for one message");
        assert!(config.tick_ms >= 1, "ticks need a period");
        let placement = Placement {
            replicas: (1..=config.servers).collect(),
            primary: PRIMARY,
            epoch: EPOCH,
        };
        let servers = placement
            .replicas
            .iter()
            .map(|&id| Server {
                id,
                replica: Replica::new(
                    STREAM,
                    id,
                    placement.clone(),
                    config.protocol,
                    config.replica,
                ),
                log: Vec::new(),
                durable: 0,
                sync_done_at: 0,
                visible: 0,
            })
            .collect();
        let mut world = World {
            config,
            rng: Rng::new(config.seed),
            now: 0,
            queue: BTreeMap::new(),
            scheduled: 0,
            servers,
            clients: Vec::new(),
            by_id: BTreeMap::new(),
            restarts_pending: 0,
            heal_at: config.heal_deadline_ms,
            senders_done: false,
            rules: Vec::new(),
            stamping_rule: None,
            counters: Counters::default(),
            failures: Vec::new(),
            failures_unlisted: 0,
            trace: Vec::new(),
            hash: 0xcbf2_9ce4_8422_2325,
            aborted: false,
            quiescent: false,
        };
        for id in 1..=config.servers {
            let mut out = Vec::new();
            world.server(id).replica.start(0, &mut out);
            world.apply(id, out);
            let first_tick = world.rng.between(1, config.tick_ms);
            world.schedule(first_tick, Event::ServerTick { server: id });
        }
        for slot in 0..config.clients {
            let start = world.rng.between(0, config.client_start_ms_max);
            world.spawn(slot, config.messages_per_client, start);
        }
        for crash in &config.crashes {
            if crash.client < config.clients {
                let event = Event::Crash {
                    client: crash.client,
                    restart_after_ms: crash.restart_after_ms,
                };
                world.schedule(crash.at_ms, event);
            }
        }
        world
    }

    /// Processes events until the run is over: quiescent after the heal,
    /// the drain period is over, the queue is empty, or the world broke.
    pub(crate) fn run(&mut self) {
        while !self.aborted && !self.quiescent {
            let end = self.heal_at.saturating_add(self.config.drain_ms);
            let Some(entry) = self.queue.first_entry() else {
                break;
            };
            if entry.key().0 > end {
                self.now = end;
                break;
            }
            let ((time, _), event) = entry.remove_entry();
            self.now = time;
            self.counters.events += 1;
            if self.counters.events > self.config.events_max {
                let max = self.config.events_max;
                self.fail(format!("event budget of {max} exhausted (livelock?)"));
                break;
            }
            self.mix(time);
            self.mix(event.code());
            self.handle(event);
        }
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver { from, to, msg } => self.deliver(from, to, msg),
            Event::Durable { server, through } => {
                self.mix(u64::from(server));
                self.mix(through);
                let now = self.now;
                let mut out = Vec::new();
                let state = self.server(server);
                state.durable = state.durable.max(through);
                state.replica.on_logged(through, now, &mut out);
                self.apply(server, out);
            }
            Event::ServerTick { server } => {
                self.mix(u64::from(server));
                let now = self.now;
                let mut out = Vec::new();
                self.server(server).replica.on_tick(now, &mut out);
                self.apply(server, out);
                self.schedule(now + self.config.tick_ms, Event::ServerTick { server });
                if server == PRIMARY && now >= self.heal_at && self.is_quiescent() {
                    self.note(|| "quiescent: every live client is done and the logs agree".into());
                    self.quiescent = true;
                }
            }
            Event::ClientTick { client } => {
                self.mix(client as u64);
                if self.clients[client].crashed {
                    return;
                }
                let now = self.now;
                let mut out = Vec::new();
                self.clients[client].producer.on_tick(now, &mut out);
                self.route(client, out);
                self.pump(client);
                self.schedule(now + self.config.tick_ms, Event::ClientTick { client });
            }
            Event::Crash {
                client,
                restart_after_ms,
            } => self.crash(client, restart_after_ms),
            Event::Restart { predecessor } => {
                self.restarts_pending -= 1;
                self.counters.client_restarts += 1;
                let old = &self.clients[predecessor];
                let quota = old.quota - old.sent.len() as u32;
                let slot = old.slot;
                let now = self.now;
                self.spawn(slot, quota, now);
            }
        }
    }

    // --- clients ---

    fn spawn(&mut self, slot: usize, quota: u32, start_at: u64) {
        let id = self.fresh_client_id();
        let session = self.rng.next_u64();
        let placement = self.servers[0].replica.placement().clone();
        let producer = Producer::new(
            id,
            session,
            self.config.protocol,
            placement,
            self.config.producer,
        );
        let index = self.clients.len();
        self.clients.push(Client {
            id,
            slot,
            producer,
            quota,
            sent: Vec::new(),
            acknowledged: Vec::new(),
            refused: 0,
            crashed: false,
        });
        self.by_id.insert(id, index);
        self.note(|| {
            format!(
                "client {} starts in slot {slot} with {quota} messages",
                short(id)
            )
        });
        self.schedule(start_at, Event::ClientTick { client: index });
    }

    /// A nonzero id no other client process has (0 is the void records').
    fn fresh_client_id(&mut self) -> u128 {
        loop {
            let id = (u128::from(self.rng.next_u64()) << 64) | u128::from(self.rng.next_u64());
            if id != checker::VOID_CLIENT && !self.by_id.contains_key(&id) {
                return id;
            }
        }
    }

    fn crash(&mut self, client: usize, restart_after_ms: Option<u64>) {
        let state = &mut self.clients[client];
        if state.crashed {
            return;
        }
        state.crashed = true;
        let (id, in_flight) = (state.id, state.producer.in_flight());
        self.counters.client_crashes += 1;
        self.note(|| format!("client {} crashes with {in_flight} in flight", short(id)));
        if let Some(after) = restart_after_ms {
            self.restarts_pending += 1;
            let at = self.now + after;
            self.schedule(
                at,
                Event::Restart {
                    predecessor: client,
                },
            );
        }
        self.check_senders_done();
    }

    /// Sends new messages while the window has room and the quota is not
    /// used up.
    fn pump(&mut self, client: usize) {
        loop {
            let state = &self.clients[client];
            if state.crashed
                || state.producer.in_flight() >= self.config.window
                || state.sent.len() as u32 >= state.quota
            {
                break;
            }
            let key_length = self.rng.between(0, KEY_BYTES_MAX) as usize;
            let key = self.rng.bytes(key_length);
            let payload_length = self.rng.between(0, PAYLOAD_BYTES_MAX) as usize;
            let payload = self.rng.bytes(payload_length);
            let digest = checker::digest(&key, &payload);
            let now = self.now;
            let mut out = Vec::new();
            let state = &mut self.clients[client];
            let event = state
                .producer
                .send(Arc::new(key), Arc::new(payload), now, &mut out);
            state.sent.push(Sent { event, digest });
            self.counters.messages_sent += 1;
            self.route(client, out);
            self.collect(client);
        }
        self.check_senders_done();
    }

    /// Records what the producer finished.
    fn collect(&mut self, client: usize) {
        for completion in self.clients[client].producer.take_completed() {
            let event = completion.event;
            match completion.outcome {
                Ok(acknowledged) => {
                    self.counters.messages_acked += 1;
                    self.counters.completion_ms = self.now;
                    self.note(|| {
                        format!(
                            "done {} @{} {:?}",
                            show(&event),
                            acknowledged.version,
                            acknowledged.acks
                        )
                    });
                    self.clients[client]
                        .acknowledged
                        .push((event, acknowledged));
                }
                Err(refusal) => {
                    self.counters.messages_refused += 1;
                    self.clients[client].refused += 1;
                    self.note(|| format!("refused {}: {refusal}", show(&event)));
                }
            }
        }
    }

    /// Starts the heal once no live client has anything left to send.
    fn check_senders_done(&mut self) {
        if self.senders_done || self.restarts_pending > 0 {
            return;
        }
        let done = self
            .clients
            .iter()
            .all(|c| c.crashed || c.sent.len() as u32 >= c.quota);
        if done {
            self.senders_done = true;
            self.heal_at = self.heal_at.min(self.now + self.config.heal_margin_ms);
            let at = self.heal_at;
            self.note(|| format!("every client has sent everything; the network heals at {at}"));
        }
    }

    fn route(&mut self, client: usize, out: Vec<(Node, Msg)>) {
        let from = Node::Client(self.clients[client].id);
        for (to, msg) in out {
            self.transmit(from, to, msg);
        }
    }

    // --- servers ---

    fn server(&mut self, id: ServerId) -> &mut Server {
        &mut self.servers[id as usize - 1]
    }

    /// Carries out a replica's effects.
    fn apply(&mut self, server: ServerId, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Send(to, msg) => {
                    if let (Node::Client(_), Msg::Ack { event, version, .. }) = (&to, &msg) {
                        self.check_ack(server, event, *version);
                    }
                    self.transmit(Node::Server(server), to, msg);
                }
                Effect::Append(entry) => self.append(server, entry),
                Effect::Serve {
                    to,
                    from,
                    to_version,
                } => {
                    let log = &self.servers[server as usize - 1].log;
                    let first = from.max(1) as usize - 1;
                    let end = (to_version as usize).min(log.len());
                    if first < end {
                        let entries = log[first..end].to_vec();
                        self.transmit(
                            Node::Server(server),
                            Node::Server(to),
                            Msg::Replicate { entries },
                        );
                    }
                }
                Effect::Visible(version) => self.check_visible(server, version),
            }
        }
    }

    fn append(&mut self, server: ServerId, entry: Entry) {
        let version = entry.version();
        if self.config.sabotage == Some(Sabotage::SkipAppend { server, version }) {
            self.note(|| {
                format!("sabotage: server {server} loses the append of version {version}")
            });
            return;
        }
        let expected = self.servers[server as usize - 1].log.len() as u64 + 1;
        if version != expected {
            self.fail(format!(
                "server {server} appended version {version}, but its log ends at version {}: versions must be dense and in order",
                expected - 1
            ));
            self.aborted = true;
            return;
        }
        match Record::decode(&entry.bytes) {
            Ok((record, _)) if record.header == entry.header => {}
            _ => {
                self.fail(format!(
                    "server {server} appended version {version} whose bytes do not decode to its header"
                ));
                self.aborted = true;
                return;
            }
        }
        self.counters.appends += 1;
        if server == PRIMARY && self.config.protocol != Protocol::Unversioned {
            let fixed = self.config.protocol.ack_rule(HybridMode::ServerSync);
            self.rules.push(self.stamping_rule.unwrap_or(fixed));
        }
        let delay = self.rng.between(0, self.config.sync_delay_ms_max);
        let now = self.now;
        let state = self.server(server);
        state.log.push(entry);
        state.sync_done_at = state.sync_done_at.max(now + delay);
        let at = state.sync_done_at;
        self.schedule(
            at,
            Event::Durable {
                server,
                through: version,
            },
        );
    }

    /// Output commit: a server acknowledges only what its own log holds
    /// durably; under the all-replica rule the primary acknowledges only
    /// what every log holds.
    fn check_ack(&mut self, server: ServerId, event: &EventId, version: u64) {
        let durable = self.servers[server as usize - 1].durable;
        if version > durable {
            self.fail(format!(
                "server {server} acknowledged {} at version {version} while its log was durable through {durable}",
                show(event)
            ));
        }
        let rule = self.rule_of(version);
        if server == PRIMARY && rule == Some(AckRule::PrimaryAfterAll) {
            if let Some(behind) = self.servers.iter().find(|s| s.durable < version) {
                let (id, durable) = (behind.id, behind.durable);
                self.fail(format!(
                    "primary acknowledged {} at version {version} while server {id} was durable through {durable}",
                    show(event)
                ));
            }
        }
    }

    /// Readers never see a version go away, nor one that is not durable,
    /// nor one that fewer logs hold than its ack rule's commit quorum.
    fn check_visible(&mut self, server: ServerId, version: u64) {
        let state = &self.servers[server as usize - 1];
        let (before, durable) = (state.visible, state.durable);
        if version < before {
            self.fail(format!(
                "server {server}: visible went back from {before} to {version}"
            ));
        }
        if version > durable {
            self.fail(format!(
                "server {server}: version {version} visible while its log was durable through {durable}"
            ));
        }
        if self.config.protocol != Protocol::Unversioned {
            for shown in before + 1..=version {
                let Some(rule) = self.rule_of(shown) else {
                    self.fail(format!(
                        "server {server}: version {shown} visible, but the primary never logged it"
                    ));
                    break;
                };
                let quorum = Protocol::commit_quorum(rule, self.servers.len());
                let holding = self.servers.iter().filter(|s| s.durable >= shown).count();
                if holding < quorum {
                    self.fail(format!(
                        "server {server}: version {shown} visible while only {holding} logs hold it (quorum {quorum}, {rule:?})"
                    ));
                }
            }
        }
        self.server(server).visible = before.max(version);
        self.note(|| format!("s{server} visible {version}"));
    }

    /// The ack rule the primary logged `version` under.
    fn rule_of(&self, version: u64) -> Option<AckRule> {
        let index = usize::try_from(version.checked_sub(1)?).ok()?;
        self.rules.get(index).copied()
    }

    /// After the heal: every live client is done and the replicas agree.
    fn is_quiescent(&self) -> bool {
        let clients_done = self
            .clients
            .iter()
            .all(|c| c.crashed || (c.sent.len() as u32 >= c.quota && c.producer.in_flight() == 0));
        if !clients_done || self.restarts_pending > 0 {
            return false;
        }
        let versioned = self.config.protocol != Protocol::Unversioned;
        let primary_last = self.servers[0].replica.last_version();
        self.servers.iter().all(|s| {
            let last = s.replica.last_version();
            s.replica.held() == 0
                && s.durable == s.log.len() as u64
                && s.replica.logged() == last
                && (!versioned || (last == primary_last && s.visible == last))
        })
    }

    // --- the network ---

    /// Hands a message to the network: lost (before the heal), delivered
    /// once or twice, each copy after its own delay.
    fn transmit(&mut self, from: Node, to: Node, msg: Msg) {
        self.counters.network_sent += 1;
        if self.now < self.heal_at && (self.cut_off(from) || self.cut_off(to)) {
            self.counters.network_dropped += 1;
            self.note(|| format!("cut {} -> {}: {}", node(from), node(to), describe(&msg)));
            return;
        }
        if self.now < self.heal_at && self.rng.chance(self.config.drop_permille) {
            self.counters.network_dropped += 1;
            self.note(|| format!("lost {} -> {}: {}", node(from), node(to), describe(&msg)));
            return;
        }
        if self.rng.chance(self.config.duplicate_permille) {
            self.counters.network_duplicated += 1;
            let delay = self.delay();
            let copy = Event::Deliver {
                from,
                to,
                msg: msg.clone(),
            };
            self.schedule(self.now + delay, copy);
        }
        let delay = self.delay();
        self.schedule(self.now + delay, Event::Deliver { from, to, msg });
    }

    /// One message's time on the wire.
    fn delay(&mut self) -> u64 {
        if self.rng.chance(self.config.straggler_permille) {
            self.counters.network_stragglers += 1;
            let max = self.config.straggler_ms_max;
            return self.rng.between(max / 10, max);
        }
        self.rng.between(0, self.config.delay_ms_max)
    }

    fn cut_off(&self, node: Node) -> bool {
        let Node::Server(server) = node else {
            return false;
        };
        let now = self.now;
        self.config
            .partitions
            .iter()
            .any(|p| p.server == server && (p.from_ms..p.to_ms).contains(&now))
    }

    fn deliver(&mut self, from: Node, to: Node, msg: Msg) {
        self.mix(node_code(from));
        self.mix(node_code(to));
        for word in fingerprint(&msg) {
            self.mix(word);
        }
        self.note(|| format!("{} -> {}: {}", node(from), node(to), describe(&msg)));
        let now = self.now;
        let mut out = Vec::new();
        match (from, to) {
            (Node::Client(client), Node::Server(server)) => {
                if server == PRIMARY && self.config.protocol == Protocol::Hybrid {
                    self.stamping_rule = match msg {
                        Msg::Write(_) => Some(AckRule::PrimaryAfterAll),
                        Msg::Tagged(_) => Some(AckRule::FirstReplica),
                        _ => None,
                    };
                }
                self.server(server)
                    .replica
                    .on_client(client, msg, now, &mut out);
                self.apply(server, out);
                self.stamping_rule = None;
            }
            (Node::Server(peer), Node::Server(server)) => {
                self.server(server)
                    .replica
                    .on_peer(peer, msg, now, &mut out);
                self.apply(server, out);
            }
            (Node::Server(server), Node::Client(id)) => {
                let Some(&client) = self.by_id.get(&id) else {
                    self.counters.network_undeliverable += 1;
                    return;
                };
                if self.clients[client].crashed {
                    self.counters.network_undeliverable += 1;
                    return;
                }
                let mut sends = Vec::new();
                self.clients[client]
                    .producer
                    .on_message(server, msg, now, &mut sends);
                self.route(client, sends);
                self.collect(client);
                self.pump(client);
            }
            (Node::Client(_), Node::Client(_)) => {
                self.counters.network_undeliverable += 1;
            }
        }
    }

    // --- bookkeeping ---

    fn schedule(&mut self, at: u64, event: Event) {
        self.scheduled += 1;
        self.queue.insert((at, self.scheduled), event);
    }

    pub(crate) fn fail(&mut self, failure: String) {
        self.note(|| format!("FAILURE: {failure}"));
        if self.failures.len() < FAILURES_MAX {
            self.failures.push(failure);
        } else {
            self.failures_unlisted += 1;
        }
    }

    pub(crate) fn take_failures(&mut self) -> Vec<String> {
        let mut failures = std::mem::take(&mut self.failures);
        if self.failures_unlisted > 0 {
            failures.push(format!("... and {} more failures", self.failures_unlisted));
        }
        failures
    }

    pub(crate) fn note(&mut self, line: impl FnOnce() -> String) {
        if self.config.trace {
            let line = format!("{:>7} {}", self.now, line());
            self.trace.push(line);
        }
    }

    /// FNV-1a over the words of each event.
    fn mix(&mut self, word: u64) {
        for byte in word.to_le_bytes() {
            self.hash ^= u64::from(byte);
            self.hash = self.hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

fn node_code(node: Node) -> u64 {
    match node {
        Node::Server(id) => u64::from(id),
        Node::Client(id) => (id as u64) ^ ((id >> 64) as u64) ^ (1 << 63),
    }
}

/// The words of a message that the trace hash covers.
fn fingerprint(msg: &Msg) -> [u64; 3] {
    match msg {
        Msg::Write(content) => [1, content.event.sequence, content.payload.len() as u64],
        Msg::Tagged(content) => [2, content.event.sequence, content.payload.len() as u64],
        Msg::Reserve { event, .. } => [3, event.sequence, 0],
        Msg::Placed {
            version, content, ..
        } => [4, content.event.sequence, *version],
        Msg::Ack {
            event,
            version,
            duplicate,
            ..
        } => [5, event.sequence, *version ^ (u64::from(*duplicate) << 63)],
        Msg::Stamped { event, version, .. } => [6, event.sequence, *version],
        Msg::Refused { event, .. } => [7, event.sequence, 0],
        Msg::Replicate { entries } => [
            8,
            entries.first().map_or(0, Entry::version),
            entries.len() as u64,
        ],
        Msg::Bind { bindings } => [
            9,
            bindings.first().map_or(0, |b| b.version),
            bindings.len() as u64,
        ],
        Msg::Progress { logged, last } => [10, *logged, *last],
        Msg::Commit { committed, last } => [11, *committed, *last],
        Msg::Need { from, to } => [12, *from, *to],
        Msg::Probe => [14, 0, 0],
        Msg::Reack { event, version } => [13, event.sequence, *version],
    }
}

/// A message in a few words, for the trace.
fn describe(msg: &Msg) -> String {
    let range = |first: Option<u64>, last: Option<u64>, count: usize| match (first, last) {
        (Some(first), Some(last)) => format!("{first}..={last} ({count})"),
        _ => "nothing".to_string(),
    };
    match msg {
        Msg::Write(content) => format!("write {}", show(&content.event)),
        Msg::Tagged(content) => format!("tagged {}", show(&content.event)),
        Msg::Reserve { event, .. } => format!("reserve {}", show(event)),
        Msg::Placed {
            version, content, ..
        } => format!("placed {} @{version}", show(&content.event)),
        Msg::Ack {
            event,
            version,
            duplicate,
            hint,
            ..
        } => {
            let duplicate = if *duplicate { " duplicate" } else { "" };
            let hint = hint.map_or(String::new(), |mode| format!(" hint {mode:?}"));
            format!("ack {} @{version}{duplicate}{hint}", show(event))
        }
        Msg::Stamped {
            event,
            version,
            duplicate,
            ..
        } => {
            let duplicate = if *duplicate { " duplicate" } else { "" };
            format!("stamped {} @{version}{duplicate}", show(event))
        }
        Msg::Refused { event, refusal } => format!("refused {}: {refusal}", show(event)),
        Msg::Replicate { entries } => format!(
            "replicate {}",
            range(
                entries.first().map(Entry::version),
                entries.last().map(Entry::version),
                entries.len()
            )
        ),
        Msg::Bind { bindings } => format!(
            "bind {}",
            range(
                bindings.first().map(|b| b.version),
                bindings.last().map(|b| b.version),
                bindings.len()
            )
        ),
        Msg::Progress { logged, last } => format!("progress {logged} {last}"),
        Msg::Commit { committed, last } => format!("commit {committed} last {last}"),
        Msg::Need { from, to } => format!("need {from}..={to}"),
        Msg::Probe => "probe".to_string(),
        Msg::Reack { event, version } => format!("reack {} @{version}", show(event)),
    }
}

fn node(node: Node) -> String {
    match node {
        Node::Server(id) => format!("s{id}"),
        Node::Client(id) => format!("c{}", short(id)),
    }
}

/// The low 16 bits of a client id: enough to tell a run's clients apart.
fn short(client: u128) -> String {
    format!("{:04x}", client as u16)
}

/// An event id in the trace: short client id / sequence.
pub(crate) fn show(event: &EventId) -> String {
    format!("{}/{}", short(event.client), event.sequence)
}
