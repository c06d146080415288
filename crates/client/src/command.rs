//! What a client's handles ask its connection task (`Command`), and the
//! answers they share with it: an append's `Ack`, a session's unanswered
//! sequences, a subscription's records and counters.

use std::collections::BTreeSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use proto::{AckLevel, EventId, Frame, Record};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::error::ClientError;

pub(crate) enum Command {
    Append {
        request: u64,
        sequence: u64,
        frame: Vec<u8>,
        reply: oneshot::Sender<Result<Ack, ClientError>>,
        /// Held until the answer arrives: the window slot of this append.
        permit: OwnedSemaphorePermit,
        tracker: Arc<SessionTracker>,
    },
    Request {
        request: u64,
        frame: Vec<u8>,
        reply: oneshot::Sender<Result<Frame, ClientError>>,
    },
    Subscribe {
        id: u64,
        stream: u64,
        from: u64,
        sender: mpsc::UnboundedSender<Result<ReceivedRecord, ClientError>>,
        counters: Arc<SubscriptionCounters>,
    },
    Credit {
        id: u64,
        credit: u32,
    },
    Unsubscribe {
        id: u64,
    },
}

/// The answer to one message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    pub stream: u64,
    /// The version the message holds in the stream.
    pub version: u64,
    pub epoch: u64,
    /// What durability the server reached before answering.
    pub level: AckLevel,
    /// The event id was logged before: `version` is the original one.
    pub duplicate: bool,
    pub possible_duplicate: bool,
    /// Replicas that hold the message.
    pub replicas: u8,
    /// The payload sent back, when the message asked for it.
    pub echo: Vec<u8>,
    /// The message's sequence in its session.
    pub sequence: u64,
}

/// Which sequences of a session still wait for an answer; the smallest of
/// them is the session's low-water mark.
#[derive(Debug, Default)]
pub(crate) struct SessionTracker {
    unanswered: Mutex<BTreeSet<u64>>,
}

impl SessionTracker {
    pub(crate) fn answered(&self, sequence: u64) {
        self.unanswered
            .lock()
            .expect("tracker lock poisoned")
            .remove(&sequence);
    }

    /// Every sequence below the returned one has been answered.
    pub(crate) fn low_water(&self, next_sequence: u64) -> u64 {
        let unanswered = self.unanswered.lock().expect("tracker lock poisoned");
        unanswered.first().copied().unwrap_or(next_sequence)
    }

    pub(crate) fn sent(&self, sequence: u64) {
        self.unanswered
            .lock()
            .expect("tracker lock poisoned")
            .insert(sequence);
    }
}

/// One record as a reader receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceivedRecord {
    pub stream: u64,
    pub version: u64,
    pub epoch: u64,
    pub event: EventId,
    pub flags: u16,
    pub key: Vec<u8>,
    pub payload: Vec<u8>,
}

impl From<Record<'_>> for ReceivedRecord {
    fn from(record: Record<'_>) -> Self {
        ReceivedRecord {
            stream: record.header.stream,
            version: record.header.version,
            epoch: record.header.epoch,
            event: record.header.event,
            flags: record.header.flags,
            key: record.key.to_vec(),
            payload: record.payload.to_vec(),
        }
    }
}

/// What the driver and the subscription share.
#[derive(Debug, Default)]
pub(crate) struct SubscriptionCounters {
    /// Records the reader has taken out of the buffer.
    pub consumed: AtomicU64,
    /// Records whose slots the reader has granted back to the server as
    /// credit; `consumed - returned` are slots free but not yet granted.
    pub returned: AtomicU64,
}
