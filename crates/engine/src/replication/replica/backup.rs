//! A backup's part: offers held back until every earlier version is
//! logged, client content waiting for its binding, gap repair (`Need`),
//! and the progress reports the primary commits by.

use super::*;

#[derive(Debug)]
pub(super) struct Unbound {
    pub(super) content: Content,
    pub(super) crc: u32,
    pub(super) received: u64,
}

impl Replica {
    /// Client content that waits for the primary's binding.
    pub(super) fn hold_content(
        &mut self,
        client: u128,
        content: Content,
        now: u64,
        out: &mut Vec<Effect>,
    ) {
        let event = content.event;
        match self.lookup(&event) {
            Lookup::Logged(version) => {
                self.metrics.duplicates += 1;
                let waiter = Waiter::duplicate(client, event);
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
                content: content.compact(),
                crc,
                received: now,
            },
        );
        self.advance(out);
    }

    /// `returns-version`: content with the primary's stamp, from the client.
    pub(super) fn place_stamped(
        &mut self,
        client: u128,
        version: u64,
        epoch: u64,
        content: Content,
        out: &mut Vec<Effect>,
    ) {
        let event = content.event;
        if let Lookup::Logged(logged) = self.lookup(&event) {
            self.metrics.duplicates += 1;
            let waiter = Waiter::duplicate(client, event);
            return self.wait_log(logged, waiter, out);
        }
        if epoch == 0 && version != 0 {
            // The primary had logged it before (a resend): its record,
            // whose header names the epoch it was stamped in, comes by
            // gap repair, never rebuilt from the client's copy.
            self.primary_last = self.primary_last.max(version);
            let waiter = Waiter::verified_duplicate(client, event);
            return self.wait_log(version, waiter, out);
        }
        if epoch != self.epoch() || version == 0 {
            return;
        }
        self.primary_last = self.primary_last.max(version);
        let header = self.header(version, event, content.low_water, content.flags());
        self.offer(Entry::with_payload(header, &content.key, &content.payload));
        self.advance(out);
    }

    /// A record from the primary (or stamped by it): logged now if it is
    /// the next version, held back otherwise.
    pub(super) fn offer(&mut self, entry: Entry) {
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
        // The log's next record, or one right after it and the records
        // held (then versions in a row from it), is logged in this step;
        // any other waits for a gap to close.
        let next = self.machine.last_version() + 1;
        let held = self.held.len() as u64;
        let in_row = || {
            let mut keys = self.held.keys();
            keys.next().is_none_or(|&first| first == next)
                && keys.next_back().is_none_or(|&last| last + 1 == next + held)
        };
        let in_order = version == next || (version == next + held && in_row());
        let entry = if in_order { entry } else { entry.compact() };
        self.held.insert(version, entry);
    }

    /// Takes the records of a `Replicate`, then logs every version that
    /// can be logged in order. A record that is the log's next version
    /// while none is held is logged at once, as [`Replica::advance`]
    /// would log it, without a trip through `held` (an insert and a
    /// removal that shift the map's entries in memory); any other is
    /// offered.
    pub(super) fn take_replicated(&mut self, entries: Vec<Entry>, out: &mut Vec<Effect>) {
        for entry in entries {
            let next = self.machine.last_version() + 1;
            if self.held.is_empty() && entry.version() == next {
                self.primary_last = self.primary_last.max(next);
                self.log_next(entry, out);
            } else {
                self.offer(entry);
            }
        }
        self.advance(out);
    }

    /// Logs `entry`, the log's next version, with the binding or the
    /// unbound content of its version retired.
    fn log_next(&mut self, entry: Entry, out: &mut Vec<Effect>) {
        self.bindings.remove(&entry.version());
        if !entry.is_void() {
            self.unbound.remove(&entry.header.event);
        }
        let client_acks = self.protocol != Protocol::Hybrid;
        self.accept(entry, client_acks, out);
    }

    /// Logs every version that can be logged in order.
    pub(super) fn advance(&mut self, out: &mut Vec<Effect>) {
        loop {
            let next = self.machine.last_version() + 1;
            if let Some(entry) = self.held.remove(&next) {
                self.log_next(entry, out);
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
                Entry::with_payload(header, &held.content.key, &held.content.payload),
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
    pub(super) fn known_last(&self) -> u64 {
        self.primary_last
            .max(self.held.keys().next_back().copied().unwrap_or(0))
            .max(self.bindings.keys().next_back().copied().unwrap_or(0))
    }

    pub(super) fn repair_gap(&mut self, now: u64, out: &mut Vec<Effect>) {
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

    pub(super) fn send_need(&mut self, last: u64, known: u64, now: u64, out: &mut Vec<Effect>) {
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
    pub(super) fn continue_repair(&mut self, now: u64, out: &mut Vec<Effect>) {
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

    pub(super) fn progress(&mut self, now: u64, out: &mut Vec<Effect>) {
        if !self.is_primary() && self.logged > self.progress_sent {
            self.send_progress(now, out);
        }
    }

    pub(super) fn send_progress(&mut self, now: u64, out: &mut Vec<Effect>) {
        self.progress_sent = self.logged;
        let last = self.machine.last_version();
        self.progress_beat
            .sent(now, (self.logged, last), &self.settings);
        out.push(Effect::Send(
            Node::Server(self.placement.primary),
            Msg::Progress {
                logged: self.logged,
                last,
            },
        ));
    }

    /// Takes the next version into this server's log.
    /// `client_acks`: whether a replica other than the primary acks the
    /// record's client (by the protocol's rule; a `hybrid` replica acks only
    /// what came by binding, the client-async flow).
    pub(super) fn accept(&mut self, entry: Entry, client_acks: bool, out: &mut Vec<Effect>) {
        let header = entry.header;
        // The same event id logged under another version before.
        if self
            .machine
            .record(&header)
            .is_some_and(|other| other != header.version)
        {
            self.metrics.conflicts += 1;
        }
        self.next_version = self.next_version.max(header.version + 1);
        self.waiting_since = None;
        if client_acks
            && !self.is_primary()
            && !entry.is_void()
            && self.protocol.replicas_ack_client()
        {
            let waiter = Waiter::new_message(header.event.client, header.event);
            self.wait_log(header.version, waiter, out);
        }
        out.push(Effect::Append(entry));
    }
}
