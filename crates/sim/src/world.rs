//! The simulated world: servers with in-memory logs, client processes, the
//! control plane, a network that delays, reorders, drops and duplicates,
//! and one queue of events ordered by (time, insertion order). Everything
//! here is a pure function of the config: ordered maps only, no clock, no
//! threads. The servers' side (processes, logs, placement) is in
//! `servers.rs`.

use std::collections::{BTreeMap, BTreeSet};

use checker::Sent;
use control::state::Command;
use engine::replication::{
    AckRule, Acknowledged, Bytes, Entry, Msg, Node, Placement, Producer, Replica, ReplicaMetrics,
    ServerId,
};
use proto::EventId;

use crate::config::SimConfig;
use crate::control::ControlPlane;
use crate::outcome::Counters;
use crate::rng::Rng;
use crate::trace::{describe, fingerprint, node, node_code, short, show};

/// The one stream every run replicates.
pub(crate) const STREAM: u64 = 1;
/// Failures kept in words; more are counted, not listed.
const FAILURES_MAX: usize = 20;
/// Key and payload sizes of the generated messages (bytes, inclusive).
const KEY_BYTES_MAX: u64 = 16;
const PAYLOAD_BYTES_MAX: u64 = 64;
/// One message in this many carries a large payload, which a primary
/// leaves out of its record's bytes (`Entry::with_payload`), of up to
/// `LARGE_PAYLOAD_EXTRA` bytes past the least that is left out.
const LARGE_PAYLOAD_ONE_IN: u64 = 32;
const LARGE_PAYLOAD_EXTRA: u64 = 2048;

pub(crate) enum Event {
    /// A network message. A server end carries the incarnation of its
    /// process when the message was sent: a process that has restarted
    /// since has new connections, and the message is gone.
    Deliver {
        from: Node,
        to: Node,
        from_incarnation: u64,
        to_incarnation: u64,
        msg: Msg,
    },
    /// The server's log is durable through `through` (a sync finished).
    Durable {
        server: ServerId,
        incarnation: u64,
        through: u64,
    },
    ServerTick {
        server: ServerId,
        incarnation: u64,
    },
    ClientTick {
        client: usize,
    },
    ClientCrash {
        client: usize,
        restart_after_ms: Option<u64>,
    },
    ClientRestart {
        predecessor: usize,
    },
    /// The control plane applies a proposed command. `proposer` is the
    /// server process that proposed it, told the response.
    Commit {
        command: Command,
        proposer: Option<(ServerId, u64)>,
    },
    /// A server process sees the control state of this index.
    Observe {
        server: ServerId,
        incarnation: u64,
        index: usize,
    },
    ClientObserve {
        client: usize,
        index: usize,
    },
    /// The `index`-th planned server crash.
    ServerCrash {
        index: usize,
    },
    ServerRestart {
        server: ServerId,
    },
    /// The process whose log failed is restarted with a working log.
    LogRestart {
        server: ServerId,
        incarnation: u64,
    },
    /// The failure detector has not heard from this member for its
    /// timeout.
    Suspect {
        server: ServerId,
        join_view: u64,
    },
}

impl Event {
    fn code(&self) -> u64 {
        match self {
            Event::Deliver { .. } => 1,
            Event::Durable { .. } => 2,
            Event::ServerTick { .. } => 3,
            Event::ClientTick { .. } => 4,
            Event::ClientCrash { .. } => 5,
            Event::ClientRestart { .. } => 6,
            Event::Commit { .. } => 7,
            Event::Observe { .. } => 8,
            Event::ClientObserve { .. } => 9,
            Event::ServerCrash { .. } => 10,
            Event::ServerRestart { .. } => 11,
            Event::Suspect { .. } => 12,
            Event::LogRestart { .. } => 13,
        }
    }
}

pub(crate) struct Server {
    pub(crate) id: ServerId,
    /// The running process's replica of the stream: `None` while the
    /// process is down or has not joined the cluster yet.
    pub(crate) replica: Option<Replica>,
    /// The stream's log: `log[i]` holds version `i + 1`. It outlives
    /// processes: a crash keeps what the disk had.
    pub(crate) log: Vec<Entry>,
    /// What the simulated disk has synced (reported with `on_logged`).
    pub(crate) durable: u64,
    /// When the last scheduled sync completes, so syncs complete in order
    /// and `durable` never goes back.
    pub(crate) sync_done_at: u64,
    /// The last `Effect::Visible` of the running process.
    pub(crate) visible: u64,
    /// A process runs (it may not have joined yet).
    pub(crate) up: bool,
    /// Counts the server's processes: events of an earlier one are void.
    pub(crate) incarnation: u64,
    /// The view this process joined in, once its `Join` is applied.
    pub(crate) join_view: Option<u64>,
    /// The newest control state this server has seen, and when it sees
    /// the next one (states arrive in order).
    pub(crate) seen: usize,
    pub(crate) observe_at: u64,
    /// The metrics of its earlier processes.
    pub(crate) past_metrics: ReplicaMetrics,
    /// Sender-based logging: the newest checkpoint this server announced
    /// as primary (kept on its disk across crashes), when it looks for a
    /// new one next, and when a recovering primary asks its clients for
    /// their copies again.
    pub(crate) checkpointed: u64,
    pub(crate) checkpoint_at: u64,
    /// The running process's log failed (`ServerCrash::log_fails`): its
    /// replica is gone and its log reports nothing synced until a new
    /// process.
    pub(crate) log_failed: bool,
    pub(crate) ask_at: u64,
}

/// Sender-based logging: a server crash, and the newest checkpoint any
/// primary had announced when it happened. Acknowledged messages past it
/// may live only in their clients' copies.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SenderCrash {
    pub(crate) at_ms: u64,
    pub(crate) checkpoint: u64,
}

pub(crate) struct Client {
    pub(crate) id: u128,
    pub(crate) slot: usize,
    pub(crate) producer: Producer,
    /// The placement the producer routes by.
    placement: Placement,
    /// Messages this process sends in total.
    pub(crate) quota: u32,
    pub(crate) sent: Vec<Sent>,
    pub(crate) acknowledged: Vec<(EventId, Acknowledged)>,
    /// When each of `acknowledged` was done.
    pub(crate) acked_at: Vec<u64>,
    pub(crate) refused: u32,
    pub(crate) crashed: bool,
    pub(crate) crashed_at: Option<u64>,
    seen: usize,
    observe_at: u64,
}

pub(crate) struct World<'a> {
    pub(crate) config: &'a SimConfig,
    pub(crate) rng: Rng,
    pub(crate) now: u64,
    queue: BTreeMap<(u64, u64), Event>,
    scheduled: u64,
    pub(crate) servers: Vec<Server>,
    pub(crate) clients: Vec<Client>,
    by_id: BTreeMap<u128, usize>,
    restarts_pending: usize,
    /// Planned server crashes and restarts not carried out yet.
    pub(crate) server_faults_pending: usize,
    pub(crate) control: ControlPlane,
    /// Drops stop from this time on.
    pub(crate) heal_at: u64,
    senders_done: bool,
    /// The ack rule the record now at each version was stamped under, and
    /// how many logs must hold the version before anyone may see it.
    pub(crate) rules: BTreeMap<u64, (AckRule, usize)>,
    /// Each version's record as it was when its commit quorum of logs
    /// held it: a replica refilled from an empty log later shows the
    /// same record while fewer logs hold it again for a while.
    pub(crate) quorum_reached: BTreeMap<u64, Entry>,
    /// Sender-based logging: each version's record and the server
    /// processes (server, incarnation) whose logs have taken it since (a
    /// crash may take it again).
    pub(crate) taken_by: BTreeMap<u64, (Entry, BTreeSet<(ServerId, u64)>)>,
    /// The ack rule each event was first stamped under.
    pub(crate) stamped_rules: BTreeMap<EventId, AckRule>,
    /// Events some client sent by the client-async flow (`Tagged`): a
    /// `hybrid` primary stamps those under the first-replica rule.
    pub(crate) tagged: BTreeSet<EventId>,
    /// Sender-based logging: every server crash with the checkpoint
    /// announced before it, the times of every checkpoint announcement,
    /// and the newest one.
    pub(crate) sender_crashes: Vec<SenderCrash>,
    pub(crate) checkpoint_times: Vec<u64>,
    pub(crate) last_checkpoint: u64,
    pub(crate) counters: Counters,
    failures: Vec<String>,
    failures_unlisted: usize,
    pub(crate) trace: Vec<String>,
    pub(crate) hash: u64,
    /// A broken invariant left the world inconsistent: stop at once.
    pub(crate) aborted: bool,
    pub(crate) quiescent: bool,
}

impl<'a> World<'a> {
    pub(crate) fn new(config: &'a SimConfig) -> World<'a> {
        assert!(config.servers >= 1, "a placement needs a server");
        assert!(config.window >= 1, "a client needs room for one message");
        assert!(config.tick_ms >= 1, "ticks need a period");
        let servers = (1..=config.servers)
            .map(|id| Server {
                id,
                replica: None,
                log: Vec::new(),
                durable: 0,
                sync_done_at: 0,
                visible: 0,
                up: true,
                incarnation: 1,
                join_view: None,
                seen: 0,
                observe_at: 0,
                past_metrics: ReplicaMetrics::default(),
                checkpointed: 0,
                log_failed: false,
                checkpoint_at: 0,
                ask_at: 0,
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
            server_faults_pending: config.server_crashes.len(),
            control: ControlPlane::new(config.servers, config.protocol),
            heal_at: config.heal_deadline_ms,
            senders_done: false,
            rules: BTreeMap::new(),
            quorum_reached: BTreeMap::new(),
            taken_by: BTreeMap::new(),
            stamped_rules: BTreeMap::new(),
            tagged: BTreeSet::new(),
            sender_crashes: Vec::new(),
            checkpoint_times: Vec::new(),
            last_checkpoint: 0,
            counters: Counters::default(),
            failures: Vec::new(),
            failures_unlisted: 0,
            trace: Vec::new(),
            hash: 0xcbf2_9ce4_8422_2325,
            aborted: false,
            quiescent: false,
        };
        world.start();
        world
    }

    /// Every server opens the stream as the control plane placed it, the
    /// clients start, and the planned faults are scheduled.
    fn start(&mut self) {
        let config = self.config;
        let (_, state) = self.control.latest();
        for id in 1..=config.servers {
            let view = state.members[&id].join_view;
            self.servers[id as usize - 1].join_view = Some(view);
            self.open(id, &state);
        }
        for slot in 0..config.clients {
            let start = self.rng.between(0, config.client_start_ms_max);
            self.spawn(slot, config.messages_per_client, start);
        }
        if let Some(late) = config.late_client {
            let start = config.last_restart_ms() + late.after_ms;
            self.spawn(config.clients, late.messages, start);
        }
        for crash in &config.crashes {
            if crash.client < config.clients {
                let event = Event::ClientCrash {
                    client: crash.client,
                    restart_after_ms: crash.restart_after_ms,
                };
                self.schedule(crash.at_ms, event);
            }
        }
        for (index, crash) in config.server_crashes.iter().enumerate() {
            self.schedule(crash.at_ms, Event::ServerCrash { index });
        }
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
            match event {
                Event::Deliver {
                    from: Node::Client(client),
                    to: Node::Server(server),
                    to_incarnation,
                    msg,
                    ..
                } => self.deliver_from_client(client, server, to_incarnation, msg),
                other => self.handle(other),
            }
        }
    }

    /// A client's message to a server, with the ones from the same client
    /// to the same server that come right after it at the same instant:
    /// a server takes what one read of a connection holds in one step
    /// (`Replica::on_clients`), so the simulator does too.
    fn deliver_from_client(&mut self, client: u128, server: ServerId, incarnation: u64, msg: Msg) {
        let mut msgs = vec![msg];
        while let Some(entry) = self.queue.first_entry() {
            let same = entry.key().0 == self.now
                && matches!(
                    entry.get(),
                    Event::Deliver {
                        from: Node::Client(c),
                        to: Node::Server(s),
                        to_incarnation,
                        ..
                    } if *c == client && *s == server && *to_incarnation == incarnation
                );
            if !same {
                break;
            }
            let (_, event) = entry.remove_entry();
            self.counters.events += 1;
            self.mix(self.now);
            self.mix(event.code());
            if let Event::Deliver { msg, .. } = event {
                msgs.push(msg);
            }
        }
        if !self.connected(Node::Server(server), incarnation) {
            self.counters.network_undeliverable += msgs.len() as u64;
            return;
        }
        for msg in &msgs {
            self.mix(node_code(Node::Client(client)));
            self.mix(node_code(Node::Server(server)));
            for word in fingerprint(msg) {
                self.mix(word);
            }
            self.note(|| {
                format!(
                    "{} -> {}: {}",
                    node(Node::Client(client)),
                    node(Node::Server(server)),
                    describe(msg)
                )
            });
        }
        let now = self.now;
        let mut out = Vec::new();
        let Some(replica) = self.servers[server as usize - 1].replica.as_mut() else {
            self.counters.network_undeliverable += msgs.len() as u64;
            return;
        };
        replica.on_clients(client, msgs, now, &mut out);
        self.apply(server, out);
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Deliver {
                from,
                to,
                from_incarnation,
                to_incarnation,
                msg,
            } => {
                if self.connected(from, from_incarnation) && self.connected(to, to_incarnation) {
                    self.deliver(from, to, msg);
                } else {
                    self.counters.network_undeliverable += 1;
                }
            }
            Event::Durable {
                server,
                incarnation,
                through,
            } => self.durable(server, incarnation, through),
            Event::ServerTick {
                server,
                incarnation,
            } => self.server_tick(server, incarnation),
            Event::ClientTick { client } => self.client_tick(client),
            Event::ClientCrash {
                client,
                restart_after_ms,
            } => self.crash_client(client, restart_after_ms),
            Event::ClientRestart { predecessor } => {
                self.restarts_pending -= 1;
                self.counters.client_restarts += 1;
                let old = &self.clients[predecessor];
                let quota = old.quota - old.sent.len() as u32;
                let slot = old.slot;
                let now = self.now;
                self.spawn(slot, quota, now);
            }
            Event::Commit { command, proposer } => {
                self.control.in_flight -= 1;
                self.commit(command, proposer);
            }
            Event::Observe {
                server,
                incarnation,
                index,
            } => {
                self.control.in_flight -= 1;
                self.observe(server, incarnation, index);
            }
            Event::ClientObserve { client, index } => {
                self.control.in_flight -= 1;
                self.client_observe(client, index);
            }
            Event::ServerCrash { index } => self.crash_server(index),
            Event::ServerRestart { server } => self.restart_server(server),
            Event::LogRestart {
                server,
                incarnation,
            } => self.restart_failed_log(server, incarnation),
            Event::Suspect { server, join_view } => self.suspect(server, join_view),
        }
    }

    // --- clients ---

    fn client_tick(&mut self, client: usize) {
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

    fn spawn(&mut self, slot: usize, quota: u32, start_at: u64) {
        let id = self.fresh_client_id();
        let session = self.rng.next_u64();
        let (seen, state) = self.control.latest();
        let placement = self.control.placed().live_view(&state).placement;
        let producer = Producer::new(
            id,
            session,
            self.config.protocol,
            placement.clone(),
            self.config.producer,
        );
        let index = self.clients.len();
        self.clients.push(Client {
            id,
            slot,
            producer,
            placement,
            quota,
            sent: Vec::new(),
            acknowledged: Vec::new(),
            acked_at: Vec::new(),
            refused: 0,
            crashed: false,
            crashed_at: None,
            seen,
            observe_at: 0,
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

    fn crash_client(&mut self, client: usize, restart_after_ms: Option<u64>) {
        let state = &mut self.clients[client];
        if state.crashed {
            return;
        }
        state.crashed = true;
        state.crashed_at = Some(self.now);
        let (id, in_flight) = (state.id, state.producer.in_flight());
        self.counters.client_crashes += 1;
        self.note(|| format!("client {} crashes with {in_flight} in flight", short(id)));
        if let Some(after) = restart_after_ms {
            self.restarts_pending += 1;
            let at = self.now + after;
            self.schedule(
                at,
                Event::ClientRestart {
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
            let key = Bytes::from(self.rng.bytes(key_length));
            let payload_length = if self.rng.between(1, LARGE_PAYLOAD_ONE_IN) == 1 {
                let least = engine::replication::PAYLOAD_SPLIT_MIN as u64;
                self.rng.between(least, least + LARGE_PAYLOAD_EXTRA) as usize
            } else {
                self.rng.between(0, PAYLOAD_BYTES_MAX) as usize
            };
            let payload = Bytes::from(self.rng.bytes(payload_length));
            let digest = checker::digest(&key, &payload);
            let now = self.now;
            let mut out = Vec::new();
            let state = &mut self.clients[client];
            let event = state.producer.send(key, payload, now, &mut out);
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
                    if self.counters.failovers > 0 {
                        self.counters.acked_after_last_failover += 1;
                    }
                    self.note(|| {
                        format!(
                            "done {} @{} {:?}",
                            show(&event),
                            acknowledged.version,
                            acknowledged.acks
                        )
                    });
                    let now = self.now;
                    let state = &mut self.clients[client];
                    state.acknowledged.push((event, acknowledged));
                    state.acked_at.push(now);
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
            let content = match &msg {
                Msg::Write(content) | Msg::Tagged(content) | Msg::Placed { content, .. } => {
                    Some(content)
                }
                _ => None,
            };
            if let Some(content) = content {
                let event = content.event;
                if matches!(msg, Msg::Tagged(_)) {
                    self.tagged.insert(event);
                }
            }
            self.transmit(from, to, msg);
        }
    }

    /// A client sees a control state. A new placement (another primary,
    /// epoch or set of live replicas) goes to its producer, which sends
    /// every unfinished message again with its event id and content (as
    /// the client library's publisher does): the new primary answers those
    /// it has with their versions, and logs the others marked
    /// possible-duplicate when the epoch changed.
    fn client_observe(&mut self, client: usize, index: usize) {
        let state = &mut self.clients[client];
        if state.crashed || index <= state.seen {
            return;
        }
        state.seen = index;
        let control = self.control.state(index);
        let placed = &control.streams[&self.control.name];
        let placement = placed.live_view(&control).placement;
        if placement.primary == 0 || placement == self.clients[client].placement {
            return;
        }
        let now = self.now;
        let state = &mut self.clients[client];
        let mut out = Vec::new();
        state.producer.reconfigure(placement.clone(), now, &mut out);
        state.placement = placement;
        let (id, resent) = (state.id, state.producer.in_flight());
        self.note(|| {
            format!(
                "client {} follows the new placement, resending {resent}",
                short(id)
            )
        });
        self.route(client, out);
    }

    /// Schedules a client's view of control state `index`, after its lag.
    pub(crate) fn publish_to_clients(&mut self, index: usize, inline: bool) {
        for client in 0..self.clients.len() {
            if self.clients[client].crashed {
                continue;
            }
            if inline {
                self.client_observe(client, index);
                continue;
            }
            let lag = self.rng.between(0, self.config.control.observe_lag_ms_max);
            let state = &mut self.clients[client];
            state.observe_at = state.observe_at.max(self.now + lag);
            let at = state.observe_at;
            self.control.in_flight += 1;
            self.schedule(at, Event::ClientObserve { client, index });
        }
    }

    // --- the network ---

    /// Hands a message to the network: lost (before the heal), delivered
    /// once or twice, each copy after its own delay.
    pub(crate) fn transmit(&mut self, from: Node, to: Node, msg: Msg) {
        self.counters.network_sent += 1;
        if self.now < self.heal_at && self.cut(from, to) {
            self.counters.network_dropped += 1;
            self.note(|| format!("cut {} -> {}: {}", node(from), node(to), describe(&msg)));
            return;
        }
        if self.now < self.heal_at && self.rng.chance(self.config.drop_permille) {
            self.counters.network_dropped += 1;
            self.note(|| format!("lost {} -> {}: {}", node(from), node(to), describe(&msg)));
            return;
        }
        let from_incarnation = self.incarnation_of(from);
        let to_incarnation = self.incarnation_of(to);
        if self.rng.chance(self.config.duplicate_permille) {
            self.counters.network_duplicated += 1;
            let delay = self.delay();
            let copy = Event::Deliver {
                from,
                to,
                from_incarnation,
                to_incarnation,
                msg: msg.clone(),
            };
            self.schedule(self.now + delay, copy);
        }
        let delay = self.delay();
        let deliver = Event::Deliver {
            from,
            to,
            from_incarnation,
            to_incarnation,
            msg,
        };
        self.schedule(self.now + delay, deliver);
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

    /// Whether a partition cuts the link between two nodes now.
    fn cut(&self, from: Node, to: Node) -> bool {
        let now = self.now;
        let id = |node: Node| match node {
            Node::Server(id) => Some(id),
            Node::Client(_) => None,
        };
        let (a, b) = (id(from), id(to));
        self.config.partitions.iter().any(|p| {
            (p.from_ms..p.to_ms).contains(&now)
                && match p.peer {
                    None => a == Some(p.server) || b == Some(p.server),
                    Some(peer) => {
                        (a, b) == (Some(p.server), Some(peer))
                            || (a, b) == (Some(peer), Some(p.server))
                    }
                }
        })
    }

    /// The process a server node's connection belongs to (0: a client).
    fn incarnation_of(&self, node: Node) -> u64 {
        match node {
            Node::Server(id) => self
                .servers
                .get((id as usize).wrapping_sub(1))
                .map_or(0, |s| s.incarnation),
            Node::Client(_) => 0,
        }
    }

    /// Whether the process at this end of a connection still runs.
    fn connected(&self, node: Node, incarnation: u64) -> bool {
        match node {
            Node::Server(id) => self
                .servers
                .get((id as usize).wrapping_sub(1))
                .is_some_and(|s| s.up && s.incarnation == incarnation),
            Node::Client(_) => true,
        }
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
                let Some(replica) = self.servers[server as usize - 1].replica.as_mut() else {
                    self.counters.network_undeliverable += 1;
                    return;
                };
                replica.on_client(client, msg, now, &mut out);
                self.apply(server, out);
            }
            (Node::Server(peer), Node::Server(server)) => {
                let Some(replica) = self.servers[server as usize - 1].replica.as_mut() else {
                    self.counters.network_undeliverable += 1;
                    return;
                };
                replica.on_peer(peer, msg, now, &mut out);
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

    pub(crate) fn schedule(&mut self, at: u64, event: Event) {
        self.scheduled += 1;
        self.queue.insert((at, self.scheduled), event);
    }

    /// Whether every live client is done.
    pub(crate) fn clients_done(&self) -> bool {
        self.restarts_pending == 0
            && self.clients.iter().all(|c| {
                c.crashed || (c.sent.len() as u32 >= c.quota && c.producer.in_flight() == 0)
            })
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
    pub(crate) fn mix(&mut self, word: u64) {
        for byte in word.to_le_bytes() {
            self.hash ^= u64::from(byte);
            self.hash = self.hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}
