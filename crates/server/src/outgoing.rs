//! The way out of one client connection (`Outgoing`): what the connection's
//! tasks and the router share. A stream's messages for the client are
//! turned into frames on the thread that produced them (a runtime worker,
//! or a log's I/O thread for acknowledgements after fdatasync) and go to
//! the socket through a `net::SharedWriter`: written at once by that
//! thread when the connection is idle, queued for the connection's
//! flusher task otherwise. Single-server `Append`s waiting for their
//! answer are kept here too, since their answers leave the same way, and
//! so are the replicated writes in flight (`WritesInFlight`): their
//! answers are what frees the connection's room for more.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use engine::replication::{Msg, ServerId};
use net::{Refused, SharedWriter};
use proto::{ErrorCode, EventId, Frame};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{Histogram, Metrics};
use crate::wire;

/// Bytes of records read for one connection and not yet written to it.
pub(crate) const READ_BUDGET_BYTES: usize = 4 * 1024 * 1024;

/// A single-server `Append` waiting for its answer, keyed by (stream,
/// session, sequence); it holds one of the connection's in-flight slots.
pub(crate) struct LegacyAppend {
    pub(crate) request: u64,
    pub(crate) level: proto::AckLevel,
    pub(crate) echo: Vec<u8>,
    /// When it arrived, when the server keeps metrics (its ack latency).
    pub(crate) arrived: Option<Instant>,
    pub(crate) _slot: OwnedSemaphorePermit,
}

pub(crate) type LegacyAppends = Arc<Mutex<HashMap<(u64, u64, u64), LegacyAppend>>>;

/// What one connection's tasks, and the router, share: the way to its
/// socket.
pub(crate) struct Outgoing {
    /// The socket's write side; a queued frame of records holds its read
    /// budget until it is written.
    pub(crate) writer: Arc<SharedWriter<OwnedSemaphorePermit>>,
    /// Single-server `Append`s waiting for their answer.
    pub(crate) legacy: LegacyAppends,
    pub(crate) me: ServerId,
    /// Bytes of records read for this connection (fetches and
    /// subscriptions) and not yet written to its socket. A reader takes its
    /// batch's worth before it reads, so a client that stops reading holds
    /// at most this much of the server's memory, however many
    /// subscriptions it opens.
    pub(crate) read_budget: Arc<Semaphore>,
    /// Replicated writes this connection handed to its streams and this
    /// server has not answered yet.
    pub(crate) writes: Mutex<WritesInFlight>,
    /// The server's metrics, when it keeps them: acknowledgements are
    /// timed, refusals and bytes counted, here.
    pub(crate) metrics: Option<Arc<Metrics>>,
}

/// A write's key: (stream, session, sequence).
type WriteKey = (u64, u64, u64);

/// A write this server never answers (its primary moved away and the
/// client sends it to the new one) stops counting after this long.
pub(crate) const WRITE_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a write was not taken: the connection's bound on writes or bytes
/// in flight, as the `Busy` refusal says it.
#[derive(Debug)]
pub(crate) struct InFlightFull(pub(crate) String);

/// The replicated writes (`Submit` of a message) one connection has in
/// flight on this server, with their bytes: taken when the connection
/// hands a write to its stream, given back when this server answers it
/// (`Acked` or `Refused`) or after [`WRITE_ANSWER_TIMEOUT`]. Past either
/// bound a new write is refused with `Busy`, which the client library
/// retries: one client cannot hold more of the server's memory than this.
#[derive(Default)]
pub(crate) struct WritesInFlight {
    writes: HashMap<WriteKey, (usize, Instant)>,
    bytes: usize,
    swept: Option<Instant>,
}

impl WritesInFlight {
    /// Takes a write of `bytes` unless it would pass `count_max` writes or
    /// `bytes_max` bytes (one write alone always fits); the refusal says
    /// which bound. A write already in flight (a resend) is not counted
    /// twice.
    pub(crate) fn admit(
        &mut self,
        key: WriteKey,
        bytes: usize,
        (count_max, bytes_max): (usize, usize),
    ) -> Result<(), InFlightFull> {
        if self.writes.contains_key(&key) {
            return Ok(());
        }
        let full = |writes: &Self| {
            writes.writes.len() >= count_max
                || (!writes.writes.is_empty() && writes.bytes + bytes > bytes_max)
        };
        if full(self) {
            self.sweep(Instant::now());
        }
        if full(self) {
            return Err(InFlightFull(format!(
                "this connection has {} replicated writes ({} bytes) in flight, the most it may (limits {count_max} writes, {bytes_max} bytes); retry once some are acknowledged",
                self.writes.len(),
                self.bytes
            )));
        }
        self.writes.insert(key, (bytes, Instant::now()));
        self.bytes += bytes;
        Ok(())
    }

    /// The server answered the write `key`; when it was taken, if it was
    /// in flight.
    pub(crate) fn answered(&mut self, key: WriteKey) -> Option<Instant> {
        let (bytes, taken) = self.writes.remove(&key)?;
        self.bytes -= bytes;
        Some(taken)
    }

    /// Every write `msg` (an answer of `stream`) answers; each one
    /// acknowledged is timed into `latency` (its ack latency on this
    /// server: arrival to answer).
    fn answered_by(&mut self, stream: u64, msg: &Msg, latency: Option<(&Histogram, Instant)>) {
        match msg {
            Msg::Ack { .. } => {
                for (event, _) in msg.acked() {
                    let taken = self.answered((stream, event.session, event.sequence));
                    if let (Some(taken), Some((histogram, now))) = (taken, latency) {
                        Metrics::acked(histogram, taken, now);
                    }
                }
            }
            Msg::Refused { event, .. } => {
                self.answered((stream, event.session, event.sequence));
            }
            _ => {}
        }
    }

    /// Drops the writes older than [`WRITE_ANSWER_TIMEOUT`]; at most once
    /// every 100 ms, since it walks them all.
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|swept| now.duration_since(swept) < Duration::from_millis(100))
        {
            return;
        }
        self.swept = Some(now);
        let mut freed = 0;
        self.writes.retain(|_, (bytes, taken)| {
            let keep = now.duration_since(*taken) < WRITE_ANSWER_TIMEOUT;
            if !keep {
                freed += *bytes;
            }
            keep
        });
        self.bytes -= freed;
    }

    pub(crate) fn len(&self) -> usize {
        self.writes.len()
    }
}

impl Outgoing {
    pub(crate) async fn send(&self, frame: &Frame) -> bool {
        let bytes = frame.to_bytes();
        self.count_out(frame, bytes.len());
        self.writer.send(bytes, None).await.is_ok()
    }

    /// Counts a frame leaving: its bytes, and its code when it refuses.
    fn count_out(&self, frame: &Frame, bytes: usize) {
        if let Some(metrics) = &self.metrics {
            metrics
                .client_bytes_out
                .fetch_add(bytes as u64, Ordering::Relaxed);
            if let Frame::Error { code, .. } | Frame::Refused { code, .. } = frame {
                metrics.refused(*code);
            }
        }
    }

    /// Takes `bytes` of the read budget (waiting for room); `None` once the
    /// connection is closing.
    pub(crate) async fn reserve_read(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let bytes = bytes.min(READ_BUDGET_BYTES) as u32;
        Arc::clone(&self.read_budget)
            .acquire_many_owned(bytes)
            .await
            .ok()
    }

    /// Queues a frame of records read under `budget`.
    pub(crate) async fn send_read(&self, frame: &Frame, budget: OwnedSemaphorePermit) -> bool {
        let bytes = frame.to_bytes();
        self.count_out(frame, bytes.len());
        self.writer.send(bytes, Some(budget)).await.is_ok()
    }

    /// A stream's messages for this client, from whichever thread produced
    /// them: every answer leaves in one write (or one queued send). `false`
    /// when the connection could not take them (closed, or its queue full:
    /// the client resends what matters).
    pub(crate) fn deliver(&self, stream: u64, msgs: Vec<Msg>) -> bool {
        // An append is registered before its stream can answer it, so an
        // empty table means no answer here is a legacy one.
        let any_legacy = !self.legacy.lock().expect("legacy lock").is_empty();
        let mut writes = self.writes.lock().expect("writes lock");
        let answers_writes = writes.len() > 0;
        // The acknowledgements leave now: each write they answer is timed.
        let latency = self
            .metrics
            .as_ref()
            .filter(|_| answers_writes || any_legacy)
            .map(|metrics| (metrics.ack_latency(stream), Instant::now()));
        let latency = latency.as_ref().map(|(h, now)| (&**h, *now));
        if answers_writes {
            for msg in &msgs {
                writes.answered_by(stream, msg, latency);
            }
        }
        drop(writes);
        if let Some(metrics) = &self.metrics {
            for msg in &msgs {
                if let Msg::Refused { refusal, .. } = msg {
                    metrics.refused(refusal.code());
                }
            }
        }
        let mut frames = wire::ClientFrames::for_messages(msgs.len());
        for msg in msgs {
            if any_legacy {
                let answers = legacy_answers(&self.legacy, (self.me, stream), &msg, latency);
                if let Some(answers) = answers {
                    for frame in answers {
                        frames.push(frame);
                    }
                    continue;
                }
            }
            if let Some(frame) = wire::client_frame(self.me, stream, msg) {
                frames.push(frame);
            }
        }
        let bytes = frames.finish();
        if let Some(metrics) = &self.metrics {
            metrics
                .client_bytes_out
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        }
        bytes.is_empty() || self.writer.try_send(bytes, None).is_ok()
    }

    /// A stream's log failed: every append waiting on it gets the failure.
    pub(crate) fn fail_stream(&self, stream: u64, failure: &str) {
        let failed: Vec<LegacyAppend> = {
            let mut map = self.legacy.lock().expect("legacy lock");
            let keys: Vec<_> = map.keys().filter(|k| k.0 == stream).copied().collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for append in failed {
            let frame = Frame::Error {
                request: append.request,
                code: ErrorCode::LogFailed,
                message: format!("not acknowledged: the stream's log failed: {failure}"),
            };
            let bytes = frame.to_bytes();
            self.count_out(&frame, bytes.len());
            if let Err(Refused::Closed) = self.writer.try_send(bytes, None) {
                return;
            }
        }
    }

    pub(crate) async fn error(
        &self,
        request: u64,
        code: ErrorCode,
        message: impl Into<String>,
    ) -> bool {
        self.send(&Frame::Error {
            request,
            code,
            message: message.into(),
        })
        .await
    }
}

/// The answers to `msg` when some of its messages answer single-server
/// `Append`s: each of those as its request-numbered `Ack` (or the
/// refusal's `Error`), any other message of an ack run as its own
/// `Acked`. `None` when none of its messages is a legacy append. Each
/// append acknowledged is timed into `latency` (its ack latency here).
pub(crate) fn legacy_answers(
    legacy: &LegacyAppends,
    (me, stream): (ServerId, u64),
    msg: &Msg,
    latency: Option<(&Histogram, Instant)>,
) -> Option<Vec<Frame>> {
    let mut appends = legacy.lock().expect("legacy lock");
    let mut take = |event: EventId| appends.remove(&(stream, event.session, event.sequence));
    match msg {
        &Msg::Ack {
            epoch,
            duplicate,
            hint,
            ..
        } => {
            let mut any = false;
            let answers: Vec<Frame> = msg
                .acked()
                .filter_map(|(event, version)| {
                    let Some(append) = take(event) else {
                        let single = Msg::Ack {
                            event,
                            version,
                            epoch,
                            duplicate,
                            hint,
                            count: 1,
                        };
                        return wire::client_frame(me, stream, single);
                    };
                    any = true;
                    if let (Some(arrived), Some((histogram, now))) = (append.arrived, latency) {
                        Metrics::acked(histogram, arrived, now);
                    }
                    Some(Frame::Ack {
                        request: append.request,
                        stream,
                        version,
                        epoch,
                        level: append.level,
                        flags: if duplicate {
                            proto::frame::ACK_FLAG_DUPLICATE
                        } else {
                            0
                        },
                        replicas: 1,
                        echo: append.echo,
                    })
                })
                .collect();
            any.then_some(answers)
        }
        Msg::Refused { event, refusal } => {
            let append = take(*event)?;
            Some(vec![Frame::Error {
                request: append.request,
                code: refusal.code(),
                message: refusal.to_string(),
            }])
        }
        _ => None,
    }
}
