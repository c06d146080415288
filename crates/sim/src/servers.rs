//! The servers' side of the world: processes that open the stream as the
//! control plane places it and follow every change of placement, crash
//! (keeping their log's durable prefix) and restart, carry out their
//! replica's effects, and are checked on every acknowledgement and every
//! visible version.

use std::collections::BTreeSet;

use control::state::{Command, ControlState, Response};
use engine::replication::{
    AckRule, Effect, Entry, HybridMode, Msg, Node, Protocol, Replica, ReplicaMetrics, ServerId,
};
use proto::{EventId, Record};

use crate::config::{CrashTarget, Sabotage};
use crate::control::address;
use crate::trace::show;
use crate::world::{Event, World, STREAM};

/// Sender-based logging: how often a recovering primary asks its clients
/// for their copies again.
const ASK_MS: u64 = 50;

impl World<'_> {
    pub(crate) fn server(&mut self, id: ServerId) -> &mut crate::world::Server {
        &mut self.servers[id as usize - 1]
    }

    /// The stream's primary as the control plane names it.
    pub(crate) fn primary(&self) -> Option<ServerId> {
        self.control.placed().primary
    }

    // --- processes ---

    /// Opens the stream on a process that has joined, as the real server
    /// does: the log cut back to what the cluster agrees with, replayed
    /// into a new replica, started, and placed as the control plane says.
    pub(crate) fn open(&mut self, id: ServerId, state: &ControlState) {
        let placed = &state.streams[&self.control.name];
        if !placed.replicas.contains(&id) {
            self.note(|| format!("s{id} is no longer a replica; its copy stays closed"));
            return;
        }
        if !placed.may_open(id) {
            self.note(|| format!("s{id} waits for epoch {}'s record to open", placed.epoch));
            return;
        }
        if let Some(after) = placed.truncate_after(id) {
            let server = self.server(id);
            let length = server.log.len() as u64;
            if length > after {
                server.log.truncate(after as usize);
                server.durable = server.durable.min(after);
                self.counters.truncated += length - after;
                self.note(|| format!("s{id} drops versions {}..={length}", after + 1));
            }
        }
        let placement = placed.live_view(state).placement;
        let config = self.config;
        let mut replica = Replica::new(STREAM, id, placement, config.protocol, config.replica);
        let now = self.now;
        let server = self.server(id);
        for entry in &server.log {
            replica.recovered(&entry.header);
        }
        let mut out = Vec::new();
        replica.start(now, &mut out);
        // Sender-based logging: as the real server does after opening a
        // stream, a primary takes back the copies its clients hold past
        // its newest checkpoint (what its disk kept of it).
        let mut ask = None;
        if config.sender {
            let checkpoint = server.checkpointed.min(server.log.len() as u64);
            replica.recover_senders(now, checkpoint);
            server.checkpoint_at = now + config.checkpoint_ms;
            server.ask_at = now + ASK_MS;
            ask = replica.sender_recovering().then_some(checkpoint);
        }
        server.replica = Some(replica);
        let incarnation = server.incarnation;
        self.note(|| format!("s{id} opens the stream"));
        self.apply(id, out);
        if let Some(checkpoint) = ask {
            self.note(|| format!("s{id} recovers its senders past checkpoint {checkpoint}"));
            self.ask_clients(id, checkpoint);
        }
        self.follow(id, state);
        let first_tick = self.rng.between(1, config.tick_ms);
        self.schedule(
            now + first_tick,
            Event::ServerTick {
                server: id,
                incarnation,
            },
        );
    }

    /// Brings a server's replica in line with a control state, as the real
    /// server does on every change (`Replica::follow`).
    fn follow(&mut self, id: ServerId, state: &ControlState) {
        let placed = &state.streams[&self.control.name];
        if !placed.replicas.contains(&id) || !state.members.contains_key(&id) {
            return;
        }
        let view = placed.live_view(state);
        let now = self.now;
        let Some(replica) = self.servers[id as usize - 1].replica.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        replica.follow(&view, now, &mut out);
        self.apply(id, out);
    }

    /// A server process sees control state `index`: a process that has
    /// just joined opens the stream, one that runs follows the placement.
    pub(crate) fn observe(&mut self, id: ServerId, incarnation: u64, index: usize) {
        let server = &mut self.servers[id as usize - 1];
        if !server.up || server.incarnation != incarnation || index <= server.seen {
            return;
        }
        if server.log_failed {
            return;
        }
        server.seen = index;
        let state = self.control.state(index);
        if server.replica.is_some() {
            return self.follow(id, &state);
        }
        let joined = server
            .join_view
            .is_some_and(|view| state.members.get(&id).is_some_and(|m| m.join_view == view));
        if joined {
            self.open(id, &state);
        }
    }

    /// The planned crash of a server: the primary or a backup, whichever
    /// the plan names. Its process loses everything in memory; its disk
    /// keeps the log's durable prefix and, maybe, part of the unsynced
    /// tail.
    pub(crate) fn crash_server(&mut self, index: usize) {
        self.server_faults_pending -= 1;
        let crash = self.config.server_crashes[index];
        let primary = self.primary();
        let candidates: Vec<ServerId> = self
            .servers
            .iter()
            .filter(|s| s.up)
            .map(|s| s.id)
            .filter(|&id| (crash.target == CrashTarget::Primary) == (Some(id) == primary))
            .collect();
        if candidates.is_empty() {
            self.note(|| format!("no server to crash as {:?}", crash.target));
            return;
        }
        let id = candidates[self.rng.below(candidates.len() as u64) as usize];
        if crash.log_fails {
            return self.fail_log(id, crash.restart_after_ms);
        }
        self.crash_process(id, crash.restart_after_ms);
    }

    /// The process of `id` crashes: its memory is lost, its disk keeps
    /// the log's durable prefix and maybe part of the unsynced tail; a
    /// new process starts `restart_after_ms` later.
    fn crash_process(&mut self, id: ServerId, restart_after_ms: u64) {
        let unsynced = {
            let server = &self.servers[id as usize - 1];
            server.log.len() as u64 - server.durable
        };
        let kept = if unsynced > 0 && self.rng.chance(self.config.keep_unsynced_permille) {
            self.rng.between(0, unsynced)
        } else {
            0
        };
        let now = self.now;
        let server = self.server(id);
        let length = server.durable + kept;
        server.log.truncate(length as usize);
        server.durable = length;
        server.sync_done_at = now;
        server.visible = 0;
        server.up = false;
        server.log_failed = false;
        server.incarnation += 1;
        let checkpoint = self.last_checkpoint;
        if self.config.sender {
            self.sender_crashes.push(crate::world::SenderCrash {
                at_ms: now,
                checkpoint,
            });
        }
        let server = self.server(id);
        if let Some(replica) = server.replica.take() {
            server.past_metrics = add_metrics(server.past_metrics, replica.metrics());
        }
        let join_view = server.join_view.take();
        self.counters.server_crashes += 1;
        self.counters.unsynced_kept += kept;
        self.note(|| {
            format!("s{id} crashes; its disk keeps {length} versions ({kept} not reported synced)")
        });
        if let Some(join_view) = join_view {
            let at = now + self.config.control.suspect_timeout_ms;
            self.schedule(
                at,
                Event::Suspect {
                    server: id,
                    join_view,
                },
            );
        }
        self.server_faults_pending += 1;
        self.schedule(now + restart_after_ms, Event::ServerRestart { server: id });
    }

    /// The log of `id`'s process fails (a full disk): the stream stops
    /// there and the log reports nothing more synced; the server tells
    /// the control plane, as the real one does, and is restarted
    /// `restart_after_ms` later with a working log.
    fn fail_log(&mut self, id: ServerId, restart_after_ms: u64) {
        let name = self.control.name.clone();
        let server = self.server(id);
        server.log_failed = true;
        // The stream stops on this process, as the real server's does: it
        // sends nothing more and hears nothing more (what it sent before
        // may still arrive).
        if let Some(replica) = server.replica.take() {
            server.past_metrics = add_metrics(server.past_metrics, replica.metrics());
        }
        let (join_view, incarnation) = (server.join_view, server.incarnation);
        self.counters.log_failures += 1;
        self.note(|| format!("s{id}'s log fails"));
        if let Some(join_view) = join_view {
            let command = Command::LogFailed {
                name,
                server: id,
                join_view,
                reason: "simulated: no space left on device".to_string(),
            };
            self.propose(command, None);
        }
        self.server_faults_pending += 1;
        self.schedule(
            self.now + restart_after_ms,
            Event::LogRestart {
                server: id,
                incarnation,
            },
        );
    }

    /// The process whose log failed, if it still runs, is stopped and
    /// started again at once.
    pub(crate) fn restart_failed_log(&mut self, id: ServerId, incarnation: u64) {
        self.server_faults_pending -= 1;
        let server = &self.servers[id as usize - 1];
        if server.incarnation != incarnation || !server.up {
            return;
        }
        self.crash_process(id, 0);
    }

    /// A new process of a crashed server starts and joins the cluster; it
    /// opens the stream once it sees itself a member.
    pub(crate) fn restart_server(&mut self, id: ServerId) {
        self.server_faults_pending -= 1;
        self.counters.server_restarts += 1;
        let server = self.server(id);
        server.up = true;
        let incarnation = server.incarnation;
        self.note(|| format!("s{id} restarts and joins"));
        let join = Command::Join {
            id,
            address: address(id),
            roles: Vec::new(),
            admin_only: false,
            nonce: 0,
        };
        self.propose(join, Some((id, incarnation)));
    }

    /// The failure detector names a member it has not heard from.
    pub(crate) fn suspect(&mut self, id: ServerId, join_view: u64) {
        let (_, state) = self.control.latest();
        if !state.is_member(id, join_view) {
            return;
        }
        let remove = Command::Remove {
            id,
            join_view,
            reason: "silent for the suspect timeout".to_string(),
        };
        self.propose(remove, None);
    }

    // --- the control plane ---

    /// Hands a command to the control plane: applied after the commit
    /// delay, after every command proposed before it. Without delays
    /// (the default timing) it is applied and seen at once.
    pub(crate) fn propose(&mut self, command: Command, proposer: Option<(ServerId, u64)>) {
        self.counters.control_commands += 1;
        let timing = self.config.control;
        if self.inline_control() {
            return self.commit(command, proposer);
        }
        let delay = self.rng.between(timing.commit_ms_min, timing.commit_ms_max);
        let at = self.control.commit_time(self.now, delay);
        self.control.in_flight += 1;
        self.schedule(at, Event::Commit { command, proposer });
    }

    fn inline_control(&self) -> bool {
        let timing = self.config.control;
        timing.commit_ms_max == 0 && timing.observe_lag_ms_max == 0
    }

    /// The control plane applies a command; every running process and
    /// every client sees the new state after its lag.
    pub(crate) fn commit(&mut self, command: Command, proposer: Option<(ServerId, u64)>) {
        let epoch = self.control.placed().epoch;
        let what = format!("{command:?}");
        let (response, index) = self.control.apply(command);
        self.note(|| format!("control applies {what}: {response:?}"));
        if let (Response::Joined { view }, Some((id, incarnation))) = (&response, proposer) {
            let view = *view;
            let server = self.server(id);
            if server.up && server.incarnation == incarnation {
                server.join_view = Some(view);
            } else {
                // The process died before its join was agreed: the
                // detector removes the member it left behind.
                let at = self.now + self.config.control.suspect_timeout_ms;
                self.schedule(
                    at,
                    Event::Suspect {
                        server: id,
                        join_view: view,
                    },
                );
            }
        }
        let placed = self.control.placed();
        if placed.epoch != epoch {
            let (epoch, primary) = (placed.epoch, placed.primary);
            self.counters.failovers += 1;
            self.counters.last_failover_ms = self.now;
            self.counters.acked_after_last_failover = 0;
            self.note(|| format!("failover: epoch {epoch}, primary {primary:?}"));
        }
        self.publish(index);
    }

    /// Schedules every running process's and client's view of a state.
    fn publish(&mut self, index: usize) {
        let inline = self.inline_control();
        for id in 1..=self.config.servers {
            let server = &self.servers[id as usize - 1];
            if !server.up {
                continue;
            }
            let incarnation = server.incarnation;
            if inline {
                self.observe(id, incarnation, index);
                continue;
            }
            let lag = self.rng.between(0, self.config.control.observe_lag_ms_max);
            let now = self.now;
            let server = self.server(id);
            server.observe_at = server.observe_at.max(now + lag);
            let at = server.observe_at;
            self.control.in_flight += 1;
            let event = Event::Observe {
                server: id,
                incarnation,
                index,
            };
            self.schedule(at, event);
        }
        self.publish_to_clients(index, inline);
    }

    // --- the data path ---

    pub(crate) fn durable(&mut self, id: ServerId, incarnation: u64, through: u64) {
        let server = &self.servers[id as usize - 1];
        if server.incarnation != incarnation || server.log_failed {
            return;
        }
        self.mix(u64::from(id));
        self.mix(through);
        let now = self.now;
        let mut out = Vec::new();
        let sender = self.config.sender;
        let server = self.server(id);
        server.durable = server.durable.max(through);
        if let Some(replica) = server.replica.as_mut() {
            if sender {
                // The buffer reported the records when it took them.
                replica.on_synced(through, now, &mut out);
            } else {
                replica.on_logged(through, now, &mut out);
            }
        }
        self.apply(id, out);
    }

    pub(crate) fn server_tick(&mut self, id: ServerId, incarnation: u64) {
        let server = &self.servers[id as usize - 1];
        if server.incarnation != incarnation || !server.up {
            return;
        }
        self.mix(u64::from(id));
        let now = self.now;
        let mut out = Vec::new();
        if let Some(replica) = self.server(id).replica.as_mut() {
            replica.on_tick(now, &mut out);
        }
        self.apply(id, out);
        if self.config.sender {
            self.sender_tick(id);
        }
        let event = Event::ServerTick {
            server: id,
            incarnation,
        };
        self.schedule(now + self.config.tick_ms, event);
        if Some(id) == self.primary() && now >= self.heal_at && self.is_quiescent() {
            self.note(|| "quiescent: every live client is done and the logs agree".into());
            self.quiescent = true;
        }
    }

    /// Sender-based logging, on each tick of a primary: while it recovers
    /// its senders, it asks every client for its copies again now and then
    /// (a client that reconnects is told again; a lost ask or resend is a
    /// broken connection); otherwise it takes a checkpoint every
    /// `checkpoint_ms`: the synced prefix of its log, as far as it is
    /// visible (committed), when that has grown, and the replica announces
    /// it (`Replica::checkpoint_written`, as the server's does).
    fn sender_tick(&mut self, id: ServerId) {
        let now = self.now;
        let checkpoint_ms = self.config.checkpoint_ms;
        let server = &self.servers[id as usize - 1];
        let Some(replica) = server.replica.as_ref() else {
            return;
        };
        if !replica.is_primary() {
            return;
        }
        if replica.sender_recovering() {
            if now >= server.ask_at {
                let checkpoint = server.checkpointed.min(server.log.len() as u64);
                self.server(id).ask_at = now + ASK_MS;
                self.ask_clients(id, checkpoint);
            }
            return;
        }
        if replica.is_rejoining() || now < server.checkpoint_at {
            return;
        }
        let through = server.durable.min(server.visible);
        let before = server.checkpointed;
        let server = self.server(id);
        server.checkpoint_at = now + checkpoint_ms;
        if through <= before {
            return;
        }
        server.checkpointed = through;
        self.last_checkpoint = self.last_checkpoint.max(through);
        self.checkpoint_times.push(now);
        self.counters.checkpoints += 1;
        self.note(|| format!("s{id} checkpoints through {through}"));
        let mut out = Vec::new();
        if let Some(replica) = self.server(id).replica.as_mut() {
            replica.checkpoint_written(through, &mut out);
        }
        self.apply(id, out);
    }

    /// Sender-based logging: a restarted primary asks every live client
    /// that has written to resend the copies it holds past `checkpoint`.
    fn ask_clients(&mut self, id: ServerId, checkpoint: u64) {
        for client in 0..self.clients.len() {
            let state = &self.clients[client];
            if state.crashed || state.sent.is_empty() {
                continue;
            }
            let ask = Msg::Checkpointed {
                through: checkpoint,
                resend: true,
            };
            self.transmit(Node::Server(id), Node::Client(state.id), ask);
        }
    }

    /// Carries out a replica's effects. With sender-based logging the
    /// log's buffer reports what it took at once (`on_logged`), before the
    /// disk syncs it.
    pub(crate) fn apply(&mut self, server: ServerId, effects: Vec<Effect>) {
        let mut appended = false;
        for effect in effects {
            match effect {
                Effect::Send(to, msg) => {
                    if let Node::Client(_) = to {
                        for (event, version) in msg.acked() {
                            self.check_ack(server, &event, version);
                        }
                    }
                    self.transmit(Node::Server(server), to, msg);
                }
                Effect::Append(entry) => appended |= self.append(server, entry),
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
                Effect::EpochStarted {
                    epoch,
                    first_version,
                    members,
                } => {
                    let name = self.control.name.clone();
                    self.note(|| {
                        format!(
                            "s{server} starts epoch {epoch} at {first_version} with {members:?}"
                        )
                    });
                    let command = Command::EpochStarted {
                        name,
                        epoch,
                        first_version,
                        members,
                    };
                    self.propose(command, None);
                }
                Effect::InSync(backup) => {
                    let name = self.control.name.clone();
                    let epoch = self.servers[server as usize - 1]
                        .replica
                        .as_ref()
                        .map_or(0, Replica::epoch);
                    // The simulated peers carry no incarnation.
                    let command = Command::InSync {
                        name,
                        epoch,
                        server: backup,
                        join_view: None,
                    };
                    self.propose(command, None);
                }
                // The simulated logs keep every version, so no primary
                // sends a checkpoint in place of records.
                Effect::Install { through, .. } => {
                    self.note(|| format!("s{server} ignores a checkpoint at {through}"));
                }
            }
        }
        if appended && self.config.sender {
            let now = self.now;
            let state = self.server(server);
            let through = state.log.len() as u64;
            let mut out = Vec::new();
            if let Some(replica) = state.replica.as_mut() {
                replica.on_logged(through, now, &mut out);
            }
            self.apply(server, out);
        }
    }

    /// Appends to the server's log; whether the log took the entry.
    fn append(&mut self, server: ServerId, entry: Entry) -> bool {
        let version = entry.version();
        if self.config.sabotage == Some(Sabotage::SkipAppend { server, version }) {
            self.note(|| {
                format!("sabotage: server {server} loses the append of version {version}")
            });
            return false;
        }
        let expected = self.servers[server as usize - 1].log.len() as u64 + 1;
        if version != expected {
            self.fail(format!(
                "server {server} appended version {version}, but its log ends at version {}: versions must be dense and in order",
                expected - 1
            ));
            self.aborted = true;
            return false;
        }
        match Record::decode(&entry.contiguous()) {
            Ok((record, _)) if record.header == entry.header => {}
            _ => {
                self.fail(format!(
                    "server {server} appended version {version} whose bytes do not decode to its header"
                ));
                self.aborted = true;
                return false;
            }
        }
        self.counters.appends += 1;
        self.note_stamp(server, &entry);
        let delay = self.rng.between(0, self.config.sync_delay_ms_max);
        let now = self.now;
        let state = self.server(server);
        state.log.push(entry);
        state.sync_done_at = state.sync_done_at.max(now + delay);
        if self.config.sender {
            self.note_taken(server, version);
        }
        let state = self.server(server);
        let (at, incarnation) = (state.sync_done_at, state.incarnation);
        self.schedule(
            at,
            Event::Durable {
                server,
                incarnation,
                through: version,
            },
        );
        true
    }

    /// Remembers the ack rule of a record the primary stamps (a record of
    /// its own epoch; those of earlier epochs it fetched were stamped
    /// before), and the rule's commit quorum over the live replicas as
    /// they are when it stamps.
    fn note_stamp(&mut self, server: ServerId, entry: &Entry) {
        let protocol = self.config.protocol;
        let Some(replica) = self.servers[server as usize - 1].replica.as_ref() else {
            return;
        };
        if protocol == Protocol::Unversioned
            || !replica.is_primary()
            || entry.header.epoch != replica.epoch()
        {
            return;
        }
        let event = entry.header.event;
        let rule = if protocol == Protocol::Hybrid && self.tagged.contains(&event) {
            AckRule::FirstReplica
        } else {
            protocol.ack_rule(HybridMode::ServerSync)
        };
        let quorum = Protocol::commit_quorum(rule, replica.placement().replicas.len());
        self.rules.insert(entry.version(), (rule, quorum));
        if !entry.is_void() {
            self.stamped_rules.entry(event).or_insert(rule);
        }
    }

    /// What a server's log holds for the rules: its durable prefix, or
    /// with sender-based logging every record its buffer took (a client
    /// holds a copy of what is not synced yet).
    fn kept(&self, id: ServerId) -> u64 {
        let server = &self.servers[id as usize - 1];
        if self.config.sender {
            server.log.len() as u64
        } else {
            server.durable
        }
    }

    /// Output commit: a server acknowledges only what its own log holds
    /// durably (with sender-based logging: what its log has taken);
    /// under the all-replica rule the primary acknowledges only what every
    /// log it counts holds.
    fn check_ack(&mut self, server: ServerId, event: &EventId, version: u64) {
        let durable = self.kept(server);
        if version > durable {
            self.fail(format!(
                "server {server} acknowledged {} at version {version} while its log was durable through {durable}",
                show(event)
            ));
        }
        let Some(replica) = self.servers[server as usize - 1].replica.as_ref() else {
            return;
        };
        if !replica.is_primary() || self.rule_of(version) != Some(AckRule::PrimaryAfterAll) {
            return;
        }
        let counted: Vec<ServerId> = replica.counting().collect();
        for id in counted {
            let taken = self.config.sender && self.has_taken(id, server, version);
            if !self.holds_same(id, server, version) && !taken {
                let durable = self.kept(id);
                self.fail(format!(
                    "primary {server} acknowledged {} at version {version} while server {id} (counted) was durable through {durable} or held other bytes",
                    show(event)
                ));
            }
        }
    }

    /// Whether `id`'s log holds durably, at `version`, the bytes `other`'s
    /// log holds there.
    fn holds_same(&self, id: ServerId, other: ServerId, version: u64) -> bool {
        let (a, b) = (
            &self.servers[id as usize - 1],
            &self.servers[other as usize - 1],
        );
        let index = version as usize - 1;
        self.kept(id) >= version
            && match (a.log.get(index), b.log.get(index)) {
                (Some(mine), Some(theirs)) => self.same_record(mine, theirs),
                _ => false,
            }
    }

    /// Sender-based logging: whether an earlier process of `id` took, at
    /// `version`, the bytes `other`'s log holds there, since they were
    /// stamped, and lost them in its crash (its report counts; the running
    /// process must hold what it reports).
    fn has_taken(&self, id: ServerId, other: ServerId, version: u64) -> bool {
        let Some(record) = self.servers[other as usize - 1]
            .log
            .get(version as usize - 1)
        else {
            return false;
        };
        let current = self.servers[id as usize - 1].incarnation;
        self.taken_by.get(&version).is_some_and(|(taken, takers)| {
            self.same_record(taken, record) && takers.range((id, 0)..(id, current)).next().is_some()
        })
    }

    /// Whether two records are the same bytes.
    pub(crate) fn same_record(&self, a: &Entry, b: &Entry) -> bool {
        a.shares_bytes(b) || a == b
    }

    /// Readers never see a version go away (within a process), nor one
    /// that is not durable (taken, with sender-based logging), nor one
    /// that fewer logs hold than the commit quorum of the rule it was
    /// written under (over the logs the primary counts).
    fn check_visible(&mut self, server: ServerId, version: u64) {
        let (before, durable) = (self.servers[server as usize - 1].visible, self.kept(server));
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
            self.check_visible_quorum(server, before, version);
        }
        self.server(server).visible = before.max(version);
        self.note(|| format!("s{server} visible {version}"));
    }

    /// The quorum is the one the primary fixed when it stamped the version,
    /// at most the logs it counts now (the backups it counts shrink when
    /// one leaves the view or comes back out of sync).
    fn check_visible_quorum(&mut self, server: ServerId, before: u64, version: u64) {
        let counted = self
            .primary()
            .and_then(|p| self.servers[p as usize - 1].replica.as_ref())
            .map_or(usize::MAX, |r| 1 + r.counting().count());
        for shown in before + 1..=version {
            let Some((rule, quorum)) = self.rules.get(&shown).copied() else {
                self.fail(format!(
                    "server {server}: version {shown} visible, but no primary stamped it"
                ));
                break;
            };
            let quorum = quorum.min(counted);
            let holding = (1..=self.config.servers)
                .filter(|&id| {
                    self.holds_same(id, server, shown)
                        || (self.config.sender && self.has_taken(id, server, shown))
                })
                .count();
            let record = self.servers[server as usize - 1]
                .log
                .get(shown as usize - 1)
                .cloned();
            if holding >= quorum {
                if let Some(record) = record {
                    self.quorum_reached.entry(shown).or_insert(record);
                }
                continue;
            }
            // Committed before: this record reached its quorum once, and
            // copies dropped since (refilled replicas) are being restored.
            let reached = match (&record, self.quorum_reached.get(&shown)) {
                (Some(record), Some(reached)) => self.same_record(record, reached),
                _ => false,
            };
            if !reached {
                self.fail(format!(
                    "server {server}: version {shown} visible while only {holding} logs hold it (quorum {quorum}, {rule:?})"
                ));
            }
        }
    }

    /// Sender-based logging: a log that has taken a version reports it
    /// logged before it syncs it, and a crash may take it again before
    /// the primary acknowledges or commits it on that report (the version
    /// lives on in the other logs and its client's copy). So a log counts
    /// for a version once it has taken the same record at some time since
    /// it was stamped: this notes which logs (which processes) have.
    fn note_taken(&mut self, server: ServerId, version: u64) {
        let Some(record) = self.servers[server as usize - 1]
            .log
            .get(version as usize - 1)
            .cloned()
        else {
            return;
        };
        let same = self
            .taken_by
            .get(&version)
            .is_some_and(|(taken, _)| self.same_record(taken, &record));
        if !same {
            self.taken_by
                .insert(version, (record.clone(), BTreeSet::new()));
        }
        let incarnation = self.servers[server as usize - 1].incarnation;
        let (_, takers) = self.taken_by.get_mut(&version).expect("present");
        takers.insert((server, incarnation));
    }

    /// The ack rule the record now at `version` was stamped under.
    fn rule_of(&self, version: u64) -> Option<AckRule> {
        self.rules.get(&version).map(|(rule, _)| *rule)
    }

    /// After the heal: every live client is done, every planned fault has
    /// happened, the control plane is idle, and every server runs the
    /// stream with the primary's log, all of it visible.
    fn is_quiescent(&self) -> bool {
        if !self.clients_done() || self.server_faults_pending > 0 || self.control.in_flight > 0 {
            return false;
        }
        let Some(primary) = self
            .primary()
            .and_then(|p| self.servers[p as usize - 1].replica.as_ref())
        else {
            return false;
        };
        if primary.is_rejoining() || primary.sender_recovering() {
            return false;
        }
        let versioned = self.config.protocol != Protocol::Unversioned;
        let primary_last = primary.last_version();
        self.servers.iter().all(|s| {
            let Some(replica) = s.replica.as_ref() else {
                return false;
            };
            let last = replica.last_version();
            replica.held() == 0
                && s.durable == s.log.len() as u64
                && replica.logged() == last
                && (!versioned || (last == primary_last && s.visible == last))
        })
    }
}

fn add_metrics(a: ReplicaMetrics, b: ReplicaMetrics) -> ReplicaMetrics {
    ReplicaMetrics {
        duplicates: a.duplicates + b.duplicates,
        conflicts: a.conflicts + b.conflicts,
        voided: a.voided + b.voided,
        gap_requests: a.gap_requests + b.gap_requests,
        overflow_drops: a.overflow_drops + b.overflow_drops,
        resent_placed: a.resent_placed + b.resent_placed,
        pending_acks_peak: a.pending_acks_peak.max(b.pending_acks_peak),
    }
}

/// A server's metrics over all its processes.
pub(crate) fn metrics_of(server: &crate::world::Server) -> ReplicaMetrics {
    let current = server
        .replica
        .as_ref()
        .map(Replica::metrics)
        .unwrap_or_default();
    add_metrics(server.past_metrics, current)
}
