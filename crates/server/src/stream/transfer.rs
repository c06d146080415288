//! Catching a peer up (state flush): serving a range of the log to a
//! replica that asked for it, sending the newest checkpoint instead when
//! the range was retained, and installing a checkpoint a primary sent.

use super::*;

/// A replica that asked for versions this log no longer keeps gets the
/// checkpoint again after this long at the earliest.
const TRANSFER_REPEAT: Duration = Duration::from_secs(2);

/// Room in a peer frame for everything but a checkpoint's state.
const TRANSFER_FRAME_OVERHEAD: usize = 64;

impl Stream {
    /// Sends a peer the records it asked for (from the log, off the lock).
    pub(super) fn serve(&self, to: ServerId, from: u64, to_version: u64) {
        const SERVE_BYTES_MAX: usize = 4 * 1024 * 1024;
        let mut records = Vec::new();
        let count = (to_version + 1).saturating_sub(from) as usize;
        let read = match self.log.read(from, count, SERVE_BYTES_MAX, &mut records) {
            Ok(read) => read,
            Err(ReadError::Retained { oldest, .. }) => {
                // The replica is behind the retained log: it catches up
                // from the newest checkpoint instead.
                self.transfer_checkpoint(to, from, oldest);
                return;
            }
            Err(_) => return,
        };
        if read == 0 {
            return;
        }
        let entries = crate::wire::entries_of(Bytes::from(records));
        self.router
            .send_peer(to, self.id, Msg::Replicate { entries });
    }

    /// Sends a replica that asked for versions from `from`, older than the
    /// oldest this log keeps (`oldest`), the newest checkpoint in their
    /// place: the state as of a version V that the log follows from V + 1
    /// (retention keeps every version after the oldest kept checkpoint),
    /// so the replica asks for the rest by the usual `Need`. Only a
    /// primary sends one; not again to the same replica within
    /// `TRANSFER_REPEAT`; never a state larger than a peer frame may carry.
    pub(super) fn transfer_checkpoint(&self, to: ServerId, from: u64, oldest: u64) {
        if !self.lock().replica.is_primary() {
            return;
        }
        let mut transfers = self.transfers.lock().expect("transfers lock");
        if transfers
            .get(&to)
            .is_some_and(|(_, at)| at.elapsed() < TRANSFER_REPEAT)
        {
            return;
        }
        let found = self
            .log
            .newest_checkpoint()
            .filter(|(through, _)| through + 1 >= oldest);
        let Some((through, state)) = found else {
            if self.retained_asked.swap(from, Ordering::Relaxed) != from {
                tracing::warn!(
                    "stream {:?}: server {to} asks for version {from}, but this log keeps versions from {oldest} only and has no checkpoint to send in their place; that replica cannot catch up yet",
                    self.name
                );
            }
            return;
        };
        let limit = self.peer_frame_bytes_max - TRANSFER_FRAME_OVERHEAD;
        if state.len() > limit {
            if self.retained_asked.swap(from, Ordering::Relaxed) != from {
                tracing::warn!(
                    "stream {:?}: server {to} asks for version {from}, but this log keeps versions from {oldest} only, and the state of the checkpoint at version {through} ({} bytes) is larger than a peer frame may carry ({limit} bytes); that replica cannot catch up",
                    self.name,
                    state.len()
                );
            }
            return;
        }
        let before = transfers.insert(to, (through, Instant::now()));
        drop(transfers);
        if before.is_none_or(|(sent, _)| sent != through) {
            tracing::warn!(
                "stream {:?}: server {to} asks for version {from}, but this log keeps versions from {oldest} only; sending it the checkpoint at version {through} ({} bytes) instead",
                self.name,
                state.len()
            );
        }
        self.router.send_peer(
            to,
            self.id,
            Msg::Checkpoint {
                through,
                state: Bytes::from(state),
            },
        );
    }

    /// Installs the state of the primary's checkpoint at `through` (see
    /// `Effect::Install`): checks it, resets the log to start at
    /// `through + 1` with a checkpoint holding it, then hands it to the
    /// state machine, which asks for the versions after it. Takes the
    /// stream's lock throughout, so nothing is appended meanwhile; the
    /// reset blocks on a few syncs (the runtime is told, see `blocking`).
    pub(super) fn install(&self, through: u64, state: Bytes) {
        let mut core = self.lock();
        if through <= core.replica.last_version() {
            return;
        }
        let machine = match core.replica.decode_install(&state) {
            Ok(machine) => machine,
            Err(error) => {
                tracing::warn!(
                    "stream {:?}: the primary's checkpoint at version {through} was refused: {error}",
                    self.name
                );
                return;
            }
        };
        // What waited for room in the log is older than the checkpoint.
        core.backlog.clear();
        core.backlog_bytes = 0;
        let held = self.log.last_version();
        if let Err(error) = blocking(|| self.log.reset(through, &state, wall_clock_ms())) {
            tracing::warn!(
                "stream {:?}: could not install the primary's checkpoint at version {through}: {error}",
                self.name
            );
            return;
        }
        self.checkpointed.fetch_max(through, Ordering::AcqRel);
        tracing::info!(
            "stream {:?}: installed the primary's checkpoint at version {through} ({} bytes) in place of the versions up to it (this log held up to {held}); it now starts at version {}",
            self.name,
            state.len(),
            self.log.first_version()
        );
        let now = now_ms();
        let mut effects = Vec::new();
        core.replica.install(machine, now, &mut effects);
        let mut later = Vec::new();
        self.apply(&mut core, effects, now, &mut later);
        drop(core);
        self.run_later(later);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Peer;
    use proto::{EventId, Record, RecordHeader};

    /// Writes a log of `count` records of stream 5 into `folder` with the
    /// wal directly, with checkpoints (holding the state machine's state)
    /// at `checkpoints`, then retention that keeps as little as it may.
    fn retained_log(
        storage: &wal::fault::FaultStorage,
        folder: &Path,
        count: u64,
        checkpoints: &[u64],
    ) {
        let config = LogConfig {
            segment_bytes_max: 4096,
            ..LogConfig::default()
        };
        let log = Log::open(Arc::new(storage.clone()), folder, 5, config, &mut |_| {}).unwrap();
        let mut machine = engine::StreamMachine::new(1, engine::DedupeLimits::default());
        for version in 1..=count {
            let header = RecordHeader {
                flags: 0,
                stream: 5,
                version,
                epoch: 1,
                event: EventId {
                    client: 9,
                    session: 1,
                    sequence: version,
                },
                low_water: version,
            };
            let mut bytes = Vec::new();
            Record {
                header,
                key: b"",
                payload: &[7; 500],
            }
            .encode(&mut bytes);
            log.append(version, &bytes).unwrap();
            machine.record(&header);
            while log.durable_version() < version {
                std::thread::sleep(Duration::from_micros(50));
            }
            if checkpoints.contains(&version) {
                log.checkpoint(version, &machine.encode_state(), 0).unwrap();
            }
        }
        log.retain(Retention { bytes: 1, ms: 0 }, 0).unwrap();
        assert!(log.first_version() > 1);
    }

    /// A stream of `storage`'s folder `/data/streams/s`, on server `me`
    /// of the replica set `replicas` whose primary is server 1.
    fn open_stream(
        storage: &wal::fault::FaultStorage,
        me: ServerId,
        replicas: Vec<ServerId>,
    ) -> (Stream, Arc<Router>) {
        let folder = Path::new("/data/streams/s");
        let mut config = ServerConfig::new("/data");
        config.storage = Arc::new(storage.clone());
        config.segment_bytes_max = 4096;
        config.cluster.me = me;
        config.cluster.peers = [1, 2]
            .into_iter()
            .filter(|&id| id != me)
            .map(|id| Peer {
                id,
                address: "127.0.0.1:9".into(),
            })
            .collect();
        let router = Arc::new(Router::new(&config.cluster, 16, net::Dialer::plain()));
        let placement = Placement {
            replicas,
            primary: 1,
            epoch: 1,
        };
        let meta = StreamMeta::new(
            5,
            "s",
            DurabilityConfig::Sync,
            Protocol::OneHopAckClient,
            &placement,
        );
        let stream = Stream::open(&meta, folder, &config, Arc::clone(&router), None).unwrap();
        (stream, router)
    }

    #[test]
    fn a_peer_asking_for_a_retained_version_gets_the_newest_checkpoint_and_installs_it() {
        let storage = wal::fault::FaultStorage::new();
        retained_log(&storage, Path::new("/data/streams/s/log"), 40, &[20, 30]);
        let (stream, router) = open_stream(&storage, 1, vec![1]);
        assert_eq!(
            stream.checkpointed(),
            30,
            "recovered from the newest checkpoint"
        );
        assert_eq!(stream.machine_state().0, 40);
        let oldest = stream.log.first_version();
        assert!(oldest > 1 && oldest <= 21, "the log starts at {oldest}");
        let sent = || router.metrics.peer_sent.load(Ordering::Relaxed);
        stream.serve(2, 1, 10);
        stream.serve(2, 1, 10);
        assert_eq!(sent(), 1, "the checkpoint goes once, not at every ask");
        let frames = router.take_queued(2);
        assert_eq!(frames.len(), 1);
        let frame = frames[0].clone().into_vec();
        let (frame, _) = proto::Frame::decode(&frame, 1 << 26).unwrap().unwrap();
        let proto::Frame::Peer { stream: 5, message } = frame else {
            panic!("not a peer frame: {frame:?}");
        };
        let Ok(Msg::Checkpoint { through, state }) = crate::wire::peer_msg(message) else {
            panic!("not a checkpoint transfer");
        };
        assert_eq!(through, 30, "the newest checkpoint");
        assert_eq!(Some((30, state.to_vec())), stream.log.newest_checkpoint());
        stream.serve(2, oldest, oldest + 3);
        assert_eq!(sent(), 2, "what the log keeps is served");

        // The replica (server 2, holding nothing) installs it.
        let replica_storage = wal::fault::FaultStorage::new();
        let (replica, _replica_router) = open_stream(&replica_storage, 2, vec![1, 2]);
        replica.on_peer_many(1, vec![Msg::Checkpoint { through, state }]);
        assert_eq!(replica.machine_state().0, 30);
        assert_eq!(replica.log.first_version(), 31);
        assert_eq!(replica.log.durable_version(), 30);
        assert_eq!(replica.checkpointed(), 30);
        let mut out = Vec::new();
        assert_eq!(
            replica.log.read(12, 10, 1 << 20, &mut out),
            Err(ReadError::Retained {
                requested: 12,
                oldest: 31
            })
        );
        // The records after the checkpoint come by the usual path.
        let mut records = Vec::new();
        let count = stream.log.read(31, 10, 1 << 20, &mut records).unwrap();
        assert_eq!(count, 10);
        let entries = crate::wire::entries_of(Bytes::from(records));
        replica.on_peer_many(1, vec![Msg::Replicate { entries }]);
        let deadline = Instant::now() + Duration::from_secs(5);
        while replica.log.durable_version() < 40 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(replica.log.durable_version(), 40);
        assert_eq!(replica.machine_state(), stream.machine_state());
        drop(replica);
        // A restart recovers from the installed checkpoint.
        let (reopened, _) = open_stream(&replica_storage, 2, vec![1, 2]);
        assert_eq!(reopened.checkpointed(), 30);
        assert_eq!(reopened.machine_state(), stream.machine_state());
    }

    #[test]
    fn a_checkpoint_larger_than_a_peer_frame_is_not_sent() {
        let storage = wal::fault::FaultStorage::new();
        retained_log(&storage, Path::new("/data/streams/s/log"), 40, &[20, 30]);
        let (mut stream, router) = open_stream(&storage, 1, vec![1]);
        let (_, state) = stream.log.newest_checkpoint().unwrap();
        stream.peer_frame_bytes_max = TRANSFER_FRAME_OVERHEAD + state.len() - 1;
        stream.serve(2, 1, 10);
        assert_eq!(router.metrics.peer_sent.load(Ordering::Relaxed), 0);
        assert_eq!(
            stream.retained_asked.load(Ordering::Relaxed),
            1,
            "said once"
        );
        stream.peer_frame_bytes_max = TRANSFER_FRAME_OVERHEAD + state.len();
        stream.serve(2, 1, 10);
        assert_eq!(router.metrics.peer_sent.load(Ordering::Relaxed), 1);
    }
}
