//! A stream's background tasks: log progress, the clock that ticks the
//! replica (and wakes it at commit-interval boundaries), and the
//! checkpoint task; started when the stream opens, stopped and awaited
//! before it closes.

use super::checkpoints::run_checkpoints;
use super::*;
use tracing::Instrument;

impl Stream {
    /// Waits for every background task of the stream to end (each ends
    /// once `stop` fires), so none holds the stream, and with it the log,
    /// after the server stops.
    pub(crate) async fn stop_tasks(&self) {
        // Waits for a hook call under way: from here on the I/O thread
        // holds the stream no more, so the last holder closes the log.
        self.log.clear_on_durable();
        self.stop_checkpoints().await;
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("task lock"));
        for task in tasks {
            let _ = task.await;
        }
    }

    /// Starts the stream's background work: log progress into the state
    /// machine, clock ticks, the backlog and checkpoints. Each task ends
    /// when the stream is dropped or `stop` fires.
    pub(crate) fn start_tasks(
        self: &Arc<Self>,
        tick: Duration,
        checkpoints: CheckpointSchedule,
        stop: watch::Receiver<bool>,
    ) {
        let checkpoints = if self.is_sender_logged() {
            CheckpointSchedule {
                interval: checkpoints.sender_interval,
                ..checkpoints
            }
        } else {
            checkpoints
        };
        // Every event of the stream's tasks names the server and the
        // stream (the epoch is a field of the events that change it).
        let span = tracing::info_span!("stream", server = self.router.me, stream = %self.name);
        if self.durability != DurabilityConfig::Memory && checkpoints.is_on() {
            let weak = Arc::downgrade(self);
            let stopping = stop.clone();
            let deleting = Arc::clone(&self.deleting);
            let task = tokio::spawn(
                run_checkpoints(weak, checkpoints, stopping, deleting).instrument(span.clone()),
            );
            *self.checkpoint_task.lock().expect("task lock") = Some(task);
        }
        if self.durability == DurabilityConfig::Sync {
            // Acknowledgements leave from the log's I/O thread itself.
            let weak = Arc::downgrade(self);
            let runtime = tokio::runtime::Handle::current();
            self.log.on_durable(move |durable, busy| {
                // With the next batch waiting, the I/O thread goes on to it
                // and the progress task takes this one, on another thread.
                if busy {
                    return false;
                }
                match weak.upgrade() {
                    Some(stream) => {
                        stream.logged(durable, &runtime);
                        true
                    }
                    None => false,
                }
            });
        }
        // The progress task hears only of what the hook did not take: a
        // version the hook drove would wake it for nothing, on the path of
        // the acknowledgements the hook just sent.
        let progress_task = tokio::spawn(
            follow_progress(
                Arc::downgrade(self),
                self.log.progress_beyond_hook(),
                stop.clone(),
            )
            .instrument(span.clone()),
        );
        let clock_task = tokio::spawn(
            run_clock(
                Arc::downgrade(self),
                tick,
                Arc::clone(&self.clock_timer),
                stop,
            )
            .instrument(span),
        );
        let mut tasks = self.tasks.lock().expect("task lock");
        tasks.retain(|task| !task.is_finished());
        tasks.extend([progress_task, clock_task]);
    }
}

/// Drives the replica with the log's progress (a `sync` log's durable
/// version when its hook left it, a `sender` log's synced one) and tells
/// the clients when the log fails.
async fn follow_progress(
    weak: Weak<Stream>,
    mut progress: watch::Receiver<wal::Progress>,
    mut stopping: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            changed = progress.changed() => if changed.is_err() { return },
            _ = stopping.wait_for(|s| *s) => return,
        }
        let current = progress.borrow_and_update().clone();
        let Some(stream) = weak.upgrade() else {
            return;
        };
        if let Some(failure) = current.failed {
            // With other replicas the stream stops here, and the control
            // plane takes this copy out (a primary hands over), so that
            // the stream goes on without it.
            if stream.stop_for_failed_log() {
                stream.router.control_event(ControlEvent::LogFailed {
                    stream: stream.name.clone(),
                    reason: failure.to_string(),
                });
            }
            stream.router.broadcast_failure(stream.id, failure);
            return;
        }
        match stream.durability {
            // The durable hook drove it already, unless the log was busy
            // (the hook leaves it to this task then) or the version moved
            // another way (a checkpoint transfer's reset).
            DurabilityConfig::Sync
                if current.durable > stream.logged_driven.load(Ordering::Acquire) =>
            {
                stream.drive(|replica, now, out| replica.on_logged(current.durable, now, out));
                stream
                    .logged_driven
                    .fetch_max(current.durable, Ordering::AcqRel);
            }
            DurabilityConfig::Sender { .. } => {
                stream.drive(|replica, now, out| replica.on_synced(current.durable, now, out))
            }
            _ => {}
        }
    }
}

/// The first tick of a stream's clock: the next multiple of `tick` since
/// the grid's start (`next_beat`), so that every stream of the
/// server ticks at the same moments. Their heartbeats then leave
/// together (sends that close together share a write, `net`), and a
/// peer takes them in together, instead of each stream's costing a
/// write and a wake-up of its own.
fn aligned_start(tick: Duration) -> tokio::time::Instant {
    // The grid's start is set before the time is read: the first clock
    // starts a whole tick after it.
    clock_start();
    next_beat(std::time::Instant::now(), tick)
}

/// The first beat of the clocks' grid after `after`. The beats are the
/// multiples of the tick since the start of the state machines' time
/// (`clock_start`, `now_ms`), so a beat falls on a whole millisecond of
/// it, and a heartbeat due a whole number of ticks after the beat it left
/// on falls on a beat.
fn next_beat(after: std::time::Instant, tick: Duration) -> tokio::time::Instant {
    let anchor = clock_start();
    let tick_nanos = tick.as_nanos().max(1);
    let phase = after.saturating_duration_since(anchor).as_nanos() % tick_nanos;
    let wait = u64::try_from(tick_nanos - phase).unwrap_or(u64::MAX);
    tokio::time::Instant::from_std(after + Duration::from_nanos(wait))
}

/// Where a quiet stream's clock rests until: the first beat at or after
/// `until` (`now_ms` time), so that the heartbeats of resting streams
/// still leave on the grid's beats together. `None`: no time, it rests
/// until woken.
fn rest_deadline(until: u64, tick: Duration) -> Option<tokio::time::Instant> {
    if until == u64::MAX {
        return None;
    }
    let due = instant_of_ms(until);
    Some(next_beat(
        due.checked_sub(Duration::from_nanos(1)).unwrap_or(due),
        tick,
    ))
}

/// Ticks the replica every `tick`, and at each output commit boundary a
/// version waits for. A quiet stream (`Core::quiet_until`: nothing for a
/// tick to do before its next heartbeat) rests instead until that
/// heartbeat: with many idle streams a server would otherwise spend most
/// of its idle time ticking them (1,000 idle streams on three servers
/// took 0.8 of a core, 0.5 resting). It rests only once the stream was
/// quiet at two ticks in a row, so a busy stream's moments between
/// messages do not count. A step that ends the quiet wakes the clock
/// (`ClockTimer::rouse`).
async fn run_clock(
    weak: Weak<Stream>,
    tick: Duration,
    timer: Arc<ClockTimer>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut interval = tokio::time::interval_at(aligned_start(tick), tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let tick_ms = u64::try_from(tick.as_millis()).unwrap_or(u64::MAX);
    // Whether the last tick found the stream quiet: it rests only once
    // quiet for a whole tick, not in a busy stream's moment between
    // messages.
    let mut was_quiet = false;
    loop {
        // The next output commit boundary, if a version waits for
        // one; a step that needs an earlier one wakes this task
        // (none is missed while it reads: `scheduled` says none).
        timer.scheduled.store(u64::MAX, Ordering::Release);
        let (wake_at, rest) = match weak.upgrade() {
            Some(stream) => plan_wait(&stream, &timer, &mut was_quiet, tick_ms),
            None => return,
        };
        timer
            .scheduled
            .store(wake_at.unwrap_or(u64::MAX), Ordering::Release);
        let boundary = async {
            match wake_at {
                Some(at) => {
                    let wait = at.saturating_sub(now_ms());
                    tokio::time::sleep(Duration::from_millis(wait)).await
                }
                None => std::future::pending().await,
            }
        };
        let next_tick = async {
            match rest.map(|until| rest_deadline(until, tick)) {
                None => {
                    interval.tick().await;
                }
                Some(Some(deadline)) => tokio::time::sleep_until(deadline).await,
                Some(None) => std::future::pending().await,
            }
        };
        let woken = tokio::select! {
            _ = next_tick => false,
            _ = boundary => false,
            _ = timer.wake.notified() => true,
            _ = stopping.wait_for(|s| *s) => return,
        };
        timer.rests_until.store(0, Ordering::Release);
        if rest.is_some() {
            // Back to a tick on every beat, from the next one (not at
            // once for the beats the rest skipped).
            interval.reset_at(aligned_start(tick));
        }
        if woken {
            continue;
        }
        let Some(stream) = weak.upgrade() else {
            return;
        };
        stream.clock_tick();
    }
}

/// Under the stream's lock: the output commit boundary a version waits
/// for, and the time the clock rests until when the stream is quiet now
/// and was at the last tick, and resting saves a tick. The rest is said
/// under the lock, so a step after it sees it and wakes the task.
fn plan_wait(
    stream: &Stream,
    timer: &ClockTimer,
    was_quiet: &mut bool,
    tick_ms: u64,
) -> (Option<u64>, Option<u64>) {
    let core = stream.lock();
    let quiet = core.quiet_until();
    let rest = quiet.filter(|&until| *was_quiet && until > now_ms().saturating_add(tick_ms));
    *was_quiet = quiet.is_some();
    timer
        .rests_until
        .store(rest.unwrap_or(0), Ordering::Release);
    (core.replica.wake_at(), rest)
}

impl Stream {
    /// One tick of the clock: records waiting for room in the log, then
    /// the replica's timed work.
    fn clock_tick(&self) {
        self.drain_backlog();
        let recovering = self.lock().replica.sender_recovering();
        self.clock_ticks.fetch_add(1, Ordering::Relaxed);
        self.drive(|replica, now, out| replica.on_tick(now, out));
        if recovering {
            self.report_sender_recovery();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_streams_clock_starts_on_the_same_beat() {
        let tick = Duration::from_millis(10);
        let first = aligned_start(tick);
        // Clocks started at other moments, within a tick and a few ticks
        // later, start on the same beat: a whole number of ticks apart,
        // and never more than a tick from when they start.
        for pause in [3_300, 17_900, 41_000] {
            tokio::time::sleep(Duration::from_micros(pause)).await;
            let before = tokio::time::Instant::now();
            let start = aligned_start(tick);
            let after = tokio::time::Instant::now();
            assert!(start > before && start <= after + tick, "within one tick");
            let apart = start.duration_since(first);
            assert_eq!(
                apart.as_nanos() % tick.as_nanos(),
                0,
                "{apart:?} apart is not a whole number of ticks"
            );
        }
    }
}
