//! The primary's part: stamping versions, reservations and voids
//! (`version-request`), the hybrid's choice, and the commit point.

use super::*;

#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) event: EventId,
    pub(super) client: u128,
    pub(super) deadline: u64,
    pub(super) content: Option<Content>,
}

impl Replica {
    pub(super) fn note_active(&mut self, client: u128, now: u64) {
        if self.protocol == Protocol::Hybrid && self.active.insert(client, now).is_none() {
            self.mode = HybridMode::choose(self.placement.replicas.len(), self.active.len());
        }
    }

    /// The rule a message arriving by `flow` is acknowledged under.
    pub(super) fn rule_for(&self, flow: Flow) -> AckRule {
        match self.protocol {
            Protocol::Hybrid if flow == Flow::Tagged => AckRule::FirstReplica,
            Protocol::Hybrid => AckRule::PrimaryAfterAll,
            other => other.ack_rule(self.mode),
        }
    }

    /// Assigns the next version to a new message, or answers a duplicate.
    pub(super) fn stamp(
        &mut self,
        client: u128,
        content: Content,
        flow: Flow,
        out: &mut Vec<Effect>,
    ) {
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
                let waiter = Waiter::duplicate(client, event);
                return self.wait(rule, version, waiter, out);
            }
            Ok(Decision::Assign { .. }) => self.machine.last_version() + 1,
        };
        if !self.reservations.is_empty() {
            // Only `version-request` reserves, and it never stamps.
            return refuse(out, client, event, Refusal::Busy);
        }
        let entry = Entry::with_payload(
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
        let waiter = Waiter::new_message(client, event);
        self.wait(rule, version, waiter, out);
    }

    pub(super) fn reserve(
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
    pub(super) fn place_reserved(
        &mut self,
        client: u128,
        version: u64,
        content: Content,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let event = content.event;
        if version <= self.machine.last_version() {
            return match self.lookup(&event) {
                Lookup::Logged(logged) if logged == version => {
                    let waiter = Waiter::duplicate(client, event);
                    self.wait_log(version, waiter, out)
                }
                _ => refuse(out, client, event, Refusal::VersionVoid),
            };
        }
        match self.reservations.get_mut(&version) {
            Some(reservation) if reservation.event == event => {
                reservation.client = client;
                reservation.content = Some(content.compact());
                self.advance_reservations(now, out);
            }
            _ => refuse(out, client, event, Refusal::VersionVoid),
        }
    }

    /// Logs reserved versions whose messages came, in order, and voids the
    /// first one if its message is overdue.
    pub(super) fn advance_reservations(&mut self, now: u64, out: &mut Vec<Effect>) {
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
                    let entry = Entry::with_payload(
                        self.header(next, content.event, content.low_water, content.flags()),
                        &content.key,
                        &content.payload,
                    );
                    let binding = self.binding_of(&entry, &content);
                    self.accept(entry, true, out);
                    self.out_bindings.push(binding);
                    let waiter = Waiter::new_message(reservation.client, reservation.event);
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
    pub(super) fn note_quorum(&mut self, version: u64, rule: AckRule) {
        if self.quorum.values().next_back() != Some(&rule) {
            self.quorum.insert(version, rule);
        }
    }

    pub(super) fn header(
        &self,
        version: u64,
        event: EventId,
        low_water: u64,
        flags: u16,
    ) -> RecordHeader {
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
    pub(super) fn update_commit(&mut self, now: u64, out: &mut Vec<Effect>) {
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

    pub(super) fn send_commit(&mut self, now: u64, out: &mut Vec<Effect>) {
        let (committed, last) = (self.committed, self.shareable_last());
        self.commit_beat
            .sent(now, (committed, last), &self.settings);
        for backup in self.placement.backups() {
            out.push(Effect::Send(
                Node::Server(backup),
                Msg::Commit { committed, last },
            ));
        }
    }

    /// `one-hop-ack-client`: a client sent a message the primary has
    /// logged again (its ack from some replica was lost), so the backups
    /// ack it again once their logs hold it.
    pub(super) fn reack(&self, event: EventId, version: u64, out: &mut Vec<Effect>) {
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
}
