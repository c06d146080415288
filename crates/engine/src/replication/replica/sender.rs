//! Sender-based message logging at the primary (durability `sender`): the
//! versions handed out and not yet confirmed, the logged point they cap,
//! and a restarted primary's recovery window that takes resent copies back
//! at their versions.

use super::*;

/// Sender-based message logging at the primary (seed 000's protocol of
/// Johnson and Zwaenepoel): the client keeps each message and the version
/// it was given (the receive sequence number) until a checkpoint covers
/// it; the primary's log is written in the background and synced only by
/// its page writer and its checkpoints.
#[derive(Debug, Default)]
pub(super) struct SenderLog {
    /// What the log buffer has taken (the caller's `on_logged`).
    pub(super) appended: u64,
    /// What the log has synced (the caller's `on_synced`).
    pub(super) synced: u64,
    /// Versions given to a client and not yet confirmed by it, above
    /// `synced`: the first of them bounds what counts as logged.
    pub(super) awaiting: BTreeSet<u64>,
    /// A restarted primary takes resends until this time.
    pub(super) recovering_until: Option<u64>,
    /// Messages resent with the versions their clients hold, past the log.
    pub(super) resent: BTreeMap<u64, Resent>,
    /// Client messages that arrived while recovering, taken afterwards.
    pub(super) queued: Vec<(u128, Msg)>,
    /// The newest checkpoint's version, and the clients asked to resend.
    pub(super) checkpoint: u64,
    pub(super) asked: HashSet<u128>,
    /// Resends past the bound of `resent` (`unbound_max`): the lowest
    /// version turned away, and the clients that sent them. The window
    /// then places only the versions below it and opens again, asking
    /// those clients once more, so no copy is voided for want of room.
    pub(super) overflow: Option<u64>,
    pub(super) overflow_clients: BTreeSet<u128>,
    /// The clients that have sent this replica messages (at most
    /// [`SENDERS_MAX`]): a primary's checkpoints are announced to them.
    pub(super) clients: BTreeSet<u128>,
}

/// Clients a sender-based stream tells of its checkpoints, at most.
pub const SENDERS_MAX: usize = 65_536;

#[derive(Debug)]
pub(super) struct Resent {
    pub(super) client: u128,
    pub(super) epoch: u64,
    pub(super) content: Content,
}

impl SenderLog {
    /// Every version up to this one is fully logged and in the log buffer.
    pub(super) fn fully_logged(&self) -> u64 {
        match self.awaiting.first() {
            Some(first) => self.appended.min(first - 1),
            None => self.appended,
        }
    }
}

impl Replica {
    /// Sender-based logging: remembers `client` as one to tell of this
    /// replica's checkpoints.
    pub(super) fn note_sender(&mut self, client: u128) {
        if let Some(sender) = self.sender.as_mut() {
            if sender.clients.len() < SENDERS_MAX {
                sender.clients.insert(client);
            }
        }
    }

    /// Sender-based logging: a checkpoint covering every version up to
    /// `through` is durable. A primary that is neither rejoining nor
    /// recovering its senders tells every client that has sent it messages
    /// (`Checkpointed`), so they may drop the copies it covers; any other
    /// replica, and a stream without sender-based logging, says nothing.
    pub fn checkpoint_written(&mut self, through: u64, out: &mut Vec<Effect>) {
        if !self.is_primary() || self.is_rejoining() || self.sender_recovering() {
            return;
        }
        let Some(sender) = self.sender.as_ref() else {
            return;
        };
        for &client in &sender.clients {
            let note = Msg::Checkpointed {
                through,
                resend: false,
            };
            out.push(Effect::Send(Node::Client(client), note));
        }
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

    /// Sender-based logging: a client holds the message with `version`.
    fn confirm(&mut self, event: EventId, version: u64, now: u64, out: &mut Vec<Effect>) {
        self.note_confirmed(event, version);
        self.after_confirm(now, out);
    }

    pub(super) fn note_confirmed(&mut self, event: EventId, version: u64) {
        let logged = self.lookup(&event);
        // Only the message's own client confirms its own version.
        if let Some(sender) = self.sender.as_mut() {
            if logged == Lookup::Logged(version) {
                sender.awaiting.remove(&version);
            }
        }
    }

    /// Sender-based logging: the fully logged point may have moved.
    pub(super) fn after_confirm(&mut self, now: u64, out: &mut Vec<Effect>) {
        if let Some(sender) = &self.sender {
            let through = sender.fully_logged();
            self.logged_through(through, now, out);
        }
    }

    /// Sender-based logging, outside recovery: a client resends a message
    /// with the version it holds (its confirmation or ack was lost).
    pub(super) fn placed_resend(
        &mut self,
        client: u128,
        content: Content,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let event = content.event;
        match self.lookup(&event) {
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
        let waiter = Waiter::duplicate(client, event);
        let rule = self.rule_for(Flow::Forward);
        self.wait(rule, logged, waiter, out);
    }

    /// Sender-based logging: a restarted primary takes resends (messages
    /// with the versions their clients hold) and queues everything else
    /// until the recovery window closes.
    pub(super) fn recovering_client(&mut self, client: u128, msg: Msg, out: &mut Vec<Effect>) {
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
                Msg::Write(content) => sender.queued.push((client, Msg::Write(content.compact()))),
                other => sender.queued.push((client, other)),
            }
            return;
        };
        let event = content.event;
        match self.lookup(&event) {
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
                        content: content.compact(),
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
    pub(super) fn end_sender_recovery(&mut self, now: u64, out: &mut Vec<Effect>) {
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
                    let waiter = Waiter::new_message(*client, event);
                    (
                        Entry::with_payload(header, &content.key, &content.payload),
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
}
