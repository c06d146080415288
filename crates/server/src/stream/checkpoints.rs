//! A stream's checkpoints and retention: the periodic task that writes a
//! checkpoint of the state machine once the version it reflects is durable
//! and visible, applies retention, and (sender-based logging) tells the
//! stream's clients what the newest checkpoint covers.

use super::*;

impl Stream {
    /// Sender-based logging: what a client that has just connected is
    /// told: the checkpoint, and whether to resend what it holds past it.
    pub fn checkpoint_note(&self) -> Option<Msg> {
        if !self.is_sender_logged() {
            return None;
        }
        self.lock()
            .replica
            .sender_recovering()
            .then(|| Msg::Checkpointed {
                through: self.checkpointed(),
                resend: true,
            })
    }

    /// Sender-based logging: the newest checkpoint covers `through`; the
    /// replica tells its clients when its role says so
    /// (`Replica::checkpoint_written`).
    pub(super) fn announce_checkpoint(&self, through: u64) {
        if self.is_sender_logged() {
            self.drive(|replica, _, out| replica.checkpoint_written(through, out));
        }
    }

    /// The state machine's state as a checkpoint would hold it: its
    /// version and bytes (the same state always gives the same bytes).
    pub fn machine_state(&self) -> (u64, Vec<u8>) {
        self.lock().replica.checkpoint_state()
    }

    /// The version of the newest checkpoint written or recovered from.
    pub fn checkpointed(&self) -> u64 {
        self.checkpointed.load(Ordering::Acquire)
    }

    /// Writes a checkpoint of the state machine, then applies retention.
    /// Returns the checkpoint's version, or `None` when there was nothing
    /// new, or the version did not become durable and visible within
    /// `wait`.
    pub async fn checkpoint(
        self: &Arc<Self>,
        retention: Retention,
        wait: Duration,
    ) -> Result<Option<u64>, CheckpointError> {
        match self.checkpoint_ready(wait).await {
            Some((through, state)) => self.write_checkpoint(through, state, retention).await,
            None => Ok(None),
        }
    }

    /// Copies the state machine's state under the stream's lock, then
    /// waits (off the lock) until the version it reflects is durable and
    /// visible: a version readers may not see yet could still be cut back
    /// after a failover. `None` when there is nothing new to checkpoint or
    /// the wait ran out.
    pub(super) async fn checkpoint_ready(&self, wait: Duration) -> Option<(u64, Vec<u8>)> {
        if self.durability == DurabilityConfig::Memory || self.deleted.load(Ordering::Acquire) {
            return None;
        }
        let (through, state) = self.lock().replica.checkpoint_state();
        if through == 0 || through <= self.checkpointed() {
            return None;
        }
        let mut visible = self.visible();
        let mut progress = self.log.progress();
        let reached = tokio::time::timeout(wait, async {
            let durable = progress.wait_for(|p| p.durable >= through || p.failed.is_some());
            let durable = durable.await.map(|p| p.failed.is_none()).unwrap_or(false);
            durable && visible.wait_for(|v| *v >= through).await.is_ok()
        })
        .await;
        (reached == Ok(true)).then_some((through, state))
    }

    /// Writes the checkpoint and applies retention on a blocking thread,
    /// without the stream's lock.
    pub(super) async fn write_checkpoint(
        self: &Arc<Self>,
        through: u64,
        state: Vec<u8>,
        retention: Retention,
    ) -> Result<Option<u64>, CheckpointError> {
        let stream = Arc::clone(self);
        let retained = tokio::task::spawn_blocking(move || {
            let now = wall_clock_ms();
            stream.log.checkpoint(through, &state, now)?;
            stream.checkpointed.fetch_max(through, Ordering::AcqRel);
            stream.log.retain(retention, now)
        })
        .await
        .map_err(|error| CheckpointError::Task("checkpoint", error))??;
        self.announce_checkpoint(through);
        self.report_retention(&retained);
        Ok(Some(through))
    }

    /// Applies retention without a new checkpoint, on a blocking thread.
    pub(super) async fn apply_retention(
        self: &Arc<Self>,
        retention: Retention,
    ) -> Result<Option<u64>, CheckpointError> {
        let stream = Arc::clone(self);
        let retained =
            tokio::task::spawn_blocking(move || stream.log.retain(retention, wall_clock_ms()))
                .await
                .map_err(|error| CheckpointError::Task("retention", error))??;
        self.report_retention(&retained);
        Ok(None)
    }

    pub(super) fn report_retention(&self, retained: &wal::Retained) {
        if retained.segments_deleted > 0 {
            tracing::info!(
                "stream {:?}: retention deleted {} segments ({} bytes); the log now starts at version {}",
                self.name, retained.segments_deleted, retained.bytes_deleted, retained.first_version
            );
        }
    }

    /// Waits for the checkpoint task to end (it ends once `stop` fires),
    /// so no checkpoint holds the stream after the server stops.
    pub(crate) async fn stop_checkpoints(&self) {
        let task = self.checkpoint_task.lock().expect("task lock").take();
        if let Some(task) = task {
            let _ = task.await;
        }
    }
}

/// When a stream writes checkpoints.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CheckpointSchedule {
    /// Zero: never by time.
    pub interval: Duration,
    /// Versions logged since the last checkpoint that call for the next
    /// one (0: never by count).
    pub records: u64,
    /// The interval of `sender` streams, whose clients hold copies until
    /// a checkpoint covers them.
    pub sender_interval: Duration,
}

impl CheckpointSchedule {
    pub(crate) fn of(config: &ServerConfig) -> Self {
        CheckpointSchedule {
            interval: config.checkpoint_interval,
            records: config.checkpoint_records,
            sender_interval: config.sender_checkpoint_interval,
        }
    }

    pub(super) fn is_on(&self) -> bool {
        !self.interval.is_zero() || self.records > 0
    }
}

/// How often the checkpoint task looks at the record count.
const CHECKPOINT_POLL: Duration = Duration::from_secs(1);

/// Where in its interval, and in its poll, a stream's checkpoints fall: a
/// fraction in [0, 1) taken from the stream's id and the server's, the
/// same on every start. Streams made or recovered together would
/// otherwise all come due in the same poll and write their checkpoints
/// (a file and its syncs each, then retention) in one burst.
fn checkpoint_phase(stream: u64, server: ServerId) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (stream, server).hash(&mut hasher);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A stream's checkpoint task: a checkpoint every interval, or sooner once
/// enough versions were logged, then retention. The first interval is
/// shortened, and the polls shifted, by the stream's phase
/// (`checkpoint_phase`), so that streams started together spread their
/// checkpoints over the interval.
pub(super) async fn run_checkpoints(
    weak: Weak<Stream>,
    schedule: CheckpointSchedule,
    mut stopping: watch::Receiver<bool>,
    deleting: Arc<Notify>,
) {
    let Some(phase) = weak.upgrade().map(|s| checkpoint_phase(s.id, s.router.me)) else {
        return;
    };
    let poll = if schedule.interval.is_zero() {
        CHECKPOINT_POLL
    } else {
        schedule.interval.min(CHECKPOINT_POLL)
    };
    let start = Instant::now();
    let mut last = start
        .checked_sub(schedule.interval.mul_f64(phase))
        .unwrap_or(start);
    let mut sleep = poll.mul_f64(phase);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(std::mem::replace(&mut sleep, poll)) => {}
            _ = stopping.wait_for(|s| *s) => return,
            _ = deleting.notified() => return,
        }
        let Some(stream) = weak.upgrade() else {
            return;
        };
        if stream.deleted.load(Ordering::Acquire) || stream.log.failure().is_some() {
            return;
        }
        let due_by_time = !schedule.interval.is_zero() && last.elapsed() >= schedule.interval;
        let logged = stream
            .log
            .durable_version()
            .saturating_sub(stream.checkpointed());
        let due_by_count = schedule.records > 0 && logged >= schedule.records;
        if !due_by_time && !due_by_count {
            continue;
        }
        last = Instant::now();
        let wait = schedule.interval.max(CHECKPOINT_POLL);
        // The wait for durability ends at once on stop; a checkpoint
        // being written is finished.
        let ready = tokio::select! {
            ready = stream.checkpoint_ready(wait) => ready,
            _ = stopping.wait_for(|s| *s) => return,
        };
        let written = match ready {
            Some((through, state)) => {
                stream
                    .write_checkpoint(through, state, stream.retention)
                    .await
            }
            // Nothing new to checkpoint: segments still age out of an
            // idle stream.
            None if stream.retention.ms > 0 && due_by_time => {
                stream.apply_retention(stream.retention).await
            }
            None => continue,
        };
        if let Err(error) = written {
            tracing::warn!("stream {:?}: checkpoint failed: {error}", stream.name);
        }
    }
}
