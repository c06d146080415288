//! Starting, rejoining and catching up (state flush): recovery from the
//! log or a checkpoint, a new placement or epoch, a new primary taking its
//! replicas' tails before it stamps, and a checkpoint installed in place of
//! a log too far behind.

use super::*;

impl Replica {
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

    /// Brings the replica in line with what the cluster says of the
    /// stream, on every change the server or simulator sees: a new
    /// placement, in-sync set or set of tails to take goes to
    /// [`Replica::reconfigure`], and a primary waiting for its epoch's
    /// record gets [`Replica::epoch_recorded`] once the record is there.
    ///
    /// A view of an older epoch than the one followed changes nothing: two
    /// callers may race to hand over the states they saw.
    pub fn follow(&mut self, view: &ClusterView, now: u64, out: &mut Vec<Effect>) {
        if view.placement.epoch < self.placement.epoch {
            return;
        }
        let changed = self.followed.as_ref().is_none_or(|followed| {
            followed.placement != view.placement
                || followed.in_sync != view.in_sync
                || followed.consider != view.consider
        });
        if changed {
            self.reconfigure(
                view.placement.clone(),
                &view.in_sync,
                &view.consider,
                now,
                out,
            );
        }
        self.followed = Some(view.clone());
        self.follow_record(view, now, out);
    }

    /// Only the epoch record of `view`: a primary waiting for it starts
    /// stamping. For a caller that saw the record land but does not follow
    /// the placement itself.
    pub fn follow_record(&mut self, view: &ClusterView, now: u64, out: &mut Vec<Effect>) {
        if view.epoch_recorded && view.placement.primary == self.me && self.is_rejoining() {
            self.epoch_recorded(view.placement.epoch, now, out);
        }
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
        assert!(
            placement.epoch >= self.placement.epoch,
            "stream {}: epochs never go down (placement of epoch {} after {})",
            self.stream,
            placement.epoch,
            self.placement.epoch
        );
        let passed = self.boundary(now, out);
        let new_epoch = placement.epoch != self.placement.epoch;
        // A replica the new view names may need a report it had: the
        // repeats start again from the base wait.
        self.commit_beat.renew();
        self.progress_beat.renew();
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
            self.forget_former_epoch();
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

    /// A new epoch: every replica forgets what the former primary had sent
    /// past its log and the acknowledgements it has not given yet (the
    /// clients resend; the dedupe table answers).
    fn forget_former_epoch(&mut self) {
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
        self.progress_beat.restart();
        self.commit_beat.restart();
        if let Some(sender) = &mut self.sender {
            // Versions past the fully logged point were never forwarded
            // and may be cut; their clients resend to the new primary.
            sender.awaiting.clear();
            sender.resent.clear();
            sender.queued.clear();
            sender.recovering_until = None;
            self.out_entries.clear();
        }
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

    pub(super) fn probe(&mut self, out: &mut Vec<Effect>) {
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
    pub(super) fn continue_rejoin(&mut self, out: &mut Vec<Effect>) {
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
    pub(super) fn shareable_last(&self) -> u64 {
        if self.sender.is_some() && self.is_primary() {
            self.logged
        } else {
            self.machine.last_version()
        }
    }
}
