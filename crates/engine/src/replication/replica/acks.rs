//! Acknowledgements and the output commit interval: waiters held until a
//! log (or every log) holds their version, and the batches a commit
//! boundary closes, through which every output to the outside world goes.

use super::*;

#[derive(Clone, Copy, Debug)]
pub(super) struct Waiter {
    pub(super) client: u128,
    pub(super) event: EventId,
    pub(super) duplicate: bool,
    /// Check the log still holds `event` at the version before acking
    /// (a `Reack` names a version this replica may not hold yet).
    pub(super) verify: bool,
}

impl Waiter {
    /// The ack of a message this replica logs for the first time.
    pub(super) fn new_message(client: u128, event: EventId) -> Self {
        Waiter {
            client,
            event,
            duplicate: false,
            verify: false,
        }
    }

    /// The answer `duplicate` to a client that sent `event` again.
    pub(super) fn duplicate(client: u128, event: EventId) -> Self {
        Waiter {
            client,
            event,
            duplicate: true,
            verify: false,
        }
    }

    /// A `duplicate` answer that first checks the log holds `event`.
    pub(super) fn verified_duplicate(client: u128, event: EventId) -> Self {
        Waiter {
            client,
            event,
            duplicate: true,
            verify: true,
        }
    }
}

/// Acknowledgements waiting for a version. New messages arrive in version
/// order and go to the back of a queue (no allocation per message); the
/// rare waiter for an older version (a duplicate) goes to a map.
#[derive(Debug, Default)]
pub(super) struct Waiters {
    pub(super) ordered: std::collections::VecDeque<(u64, Waiter)>,
    pub(super) late: BTreeMap<u64, Vec<Waiter>>,
}

impl Waiters {
    pub(super) fn push(&mut self, version: u64, waiter: Waiter) {
        match self.ordered.back() {
            Some((last, _)) if *last > version => {
                self.late.entry(version).or_default().push(waiter)
            }
            _ => self.ordered.push_back((version, waiter)),
        }
    }

    /// Removes and returns every waiter for a version up to `through`.
    pub(super) fn take_through(&mut self, through: u64) -> Vec<(u64, Waiter)> {
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
pub(super) const BATCHES_MAX: usize = 1024;

/// The output commit interval (seed 003's checkpoint-and-buffer scheme):
/// the boundaries at multiples of T and the batches they closed. An output
/// (an ack, reader visibility) whose rule says "through version x" may only
/// go through the last batch that ends at or before x: never before the
/// boundary that closed its batch, never for a version past that batch.
#[derive(Debug)]
pub(super) struct Boundaries {
    /// T in milliseconds; 0 gates nothing.
    pub(super) interval_ms: u64,
    /// The next boundary (a multiple of T on the replica's clock).
    pub(super) next_at: u64,
    /// The last version of each closed batch not yet released in full,
    /// ascending.
    pub(super) ends: VecDeque<u64>,
    /// Every version up to this one was in a batch released in full (or
    /// was in the log at startup).
    pub(super) floor: u64,
}

impl Boundaries {
    pub(super) fn new(interval_ms: u64) -> Boundaries {
        Boundaries {
            interval_ms,
            next_at: 0,
            ends: VecDeque::new(),
            floor: 0,
        }
    }

    pub(super) fn newest_end(&self) -> u64 {
        self.ends.back().copied().unwrap_or(self.floor)
    }

    /// Closes a batch of every version up to `last` if a boundary passed
    /// since the last call; `true` when a new batch was closed. Every
    /// version in the log was taken in before `now`, and so before any
    /// boundary that passed since the previous call.
    pub(super) fn pass(&mut self, now: u64, last: u64) -> bool {
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
    pub(super) fn gate(&self, through: u64) -> u64 {
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
    pub(super) fn prune(&mut self, low: u64) {
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
    pub(super) fn wake_at(&self, last: u64) -> Option<u64> {
        (self.interval_ms > 0 && last > self.newest_end()).then_some(self.next_at)
    }
}

impl Replica {
    /// A boundary of the output commit interval passed: the batch it
    /// closed is released as far as it is durable. `true` when one passed.
    pub(super) fn boundary(&mut self, now: u64, out: &mut Vec<Effect>) -> bool {
        let passed = self.boundaries.pass(now, self.machine.last_version());
        if passed {
            self.release(out);
        }
        passed
    }

    pub(super) fn wait(
        &mut self,
        rule: AckRule,
        version: u64,
        waiter: Waiter,
        out: &mut Vec<Effect>,
    ) {
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

    pub(super) fn wait_log(&mut self, version: u64, waiter: Waiter, out: &mut Vec<Effect>) {
        if version <= self.boundaries.gate(self.logged) {
            self.ack(version, waiter, out);
        } else {
            self.after_log.push(version, waiter);
        }
    }

    pub(super) fn release(&mut self, out: &mut Vec<Effect>) {
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
        if waiter.verify && self.lookup(&event) != Lookup::Logged(version) {
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
    pub(super) fn finish(&mut self, out: &mut Vec<Effect>) {
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
        self.check_invariants();
    }

    /// What holds at the end of every step, checked in release builds too:
    /// a broken one stops the process with its name rather than letting a
    /// replica acknowledge or expose what it must not.
    fn check_invariants(&self) {
        let last = self.machine.last_version();
        assert!(
            self.logged <= last,
            "stream {}: logged {} is past the log's last version {last}",
            self.stream,
            self.logged
        );
        assert!(
            self.visible <= self.logged,
            "stream {}: visible {} is past logged {}",
            self.stream,
            self.visible,
            self.logged
        );
        if self.is_primary() {
            assert!(
                self.committed <= last,
                "stream {}: the primary's commit point {} is past its last version {last}",
                self.stream,
                self.committed
            );
            assert!(
                self.is_rejoining() || self.next_version > last,
                "stream {}: the next version {} was handed out already (last {last})",
                self.stream,
                self.next_version
            );
        }
    }
}

/// Refuses a message whose sequence the client's low-water mark retired.
pub(super) fn refuse_retired(out: &mut Vec<Effect>, client: u128, event: EventId, low_water: u64) {
    let rejection = crate::Rejection::Retired {
        sequence: event.sequence,
        low_water,
    };
    refuse(out, client, event, rejection.into());
}

pub(super) fn refuse(out: &mut Vec<Effect>, client: u128, event: EventId, refusal: Refusal) {
    out.push(Effect::Send(
        Node::Client(client),
        Msg::Refused { event, refusal },
    ));
}

pub(super) fn stamped(
    client: u128,
    event: EventId,
    version: u64,
    epoch: u64,
    duplicate: bool,
) -> Effect {
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
