//! What the replication state machines say to each other. The server's
//! frames carry these between processes; the simulator carries them as
//! values. Messages carry no stream id: the caller routes by stream.

use proto::{EventId, Record, RecordHeader};

use super::protocol::HybridMode;
use crate::Rejection;

/// A server's id in the cluster configuration.
pub type ServerId = u32;

/// Shared bytes: a message goes to several replicas without copies, and a
/// record received in a frame of many is a slice of that frame's bytes.
pub use bytes::Bytes;

/// A message as the client sent it: event id, low-water mark, content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content {
    pub event: EventId,
    pub low_water: u64,
    pub key: Bytes,
    pub payload: Bytes,
    /// Sent again after a failover (the client's stream moved to a new
    /// epoch before the message was done): a record made from it carries
    /// `possible-duplicate`. A message the new primary already holds is
    /// answered `duplicate` and its record is left as it was.
    pub resent: bool,
}

impl Content {
    /// The record flags a message with this content is logged with.
    pub fn flags(&self) -> u16 {
        if self.resent {
            proto::FLAG_POSSIBLE_DUPLICATE
        } else {
            0
        }
    }

    /// The content with bytes of its own. A client's key and payload are
    /// slices of the whole read they came in (`proto::FrameBuffer`); a
    /// message kept past the step that got it (waiting for its binding,
    /// its reserved version or the end of a recovery) is copied, so that
    /// it does not keep that read's buffer alive.
    pub fn compact(self) -> Content {
        Content {
            key: Bytes::copy_from_slice(&self.key),
            payload: Bytes::copy_from_slice(&self.payload),
            ..self
        }
    }

    /// CRC32C of the key length, key and payload: a binding names the
    /// content it binds, so a replica never stores other bytes than the
    /// primary did under a version.
    pub fn crc(&self) -> u32 {
        let crc = crc32c::crc32c(&(self.key.len() as u32).to_le_bytes());
        let crc = crc32c::crc32c_append(crc, &self.key);
        crc32c::crc32c_append(crc, &self.payload)
    }
}

/// One logged record: its parsed header and its encoded bytes (the same
/// bytes on every replica, checksum included): `bytes`, then `payload`.
/// A primary leaves a payload of [`PAYLOAD_SPLIT_MIN`] bytes or more
/// where the client's message brought it ([`Entry::with_payload`]):
/// `bytes` is then the record's head (header and key) and `payload` a
/// slice of the read it came in, which the log copies into its buffer
/// and the backups' frame carries as it is. Every other record is all in
/// `bytes`, `payload` `None`.
#[derive(Clone, Debug)]
pub struct Entry {
    pub header: RecordHeader,
    pub bytes: Bytes,
    pub payload: Option<Bytes>,
}

/// A payload of at least this many bytes is left out of its record's
/// `bytes` (see [`Entry`]): below it a copy costs less than a part of a
/// vectored write or of a log append.
pub const PAYLOAD_SPLIT_MIN: usize = 4096;

impl PartialEq for Entry {
    /// The same header and the same record bytes, however they are split.
    fn eq(&self, other: &Entry) -> bool {
        self.header == other.header && self.len() == other.len() && {
            let ours = self.bytes.iter().chain(self.rest());
            ours.eq(other.bytes.iter().chain(other.rest()))
        }
    }
}

impl Eq for Entry {}

impl Entry {
    /// Encodes a record, all of it in `bytes`.
    pub fn new(header: RecordHeader, key: &[u8], payload: &[u8]) -> Entry {
        let record = Record {
            header,
            key,
            payload,
        };
        let mut bytes = Vec::with_capacity(record.encoded_len());
        record.encode(&mut bytes);
        Entry {
            header,
            bytes: Bytes::from(bytes),
            payload: None,
        }
    }

    /// Encodes a record whose payload is shared: one of
    /// [`PAYLOAD_SPLIT_MIN`] bytes or more stays where it is, and only the
    /// head is encoded (its checksum covers the payload); a smaller one is
    /// copied in as by [`Entry::new`].
    pub fn with_payload(header: RecordHeader, key: &[u8], payload: &Bytes) -> Entry {
        if payload.len() < PAYLOAD_SPLIT_MIN {
            return Entry::new(header, key, payload);
        }
        let record = Record {
            header,
            key,
            payload,
        };
        let mut head = Vec::new();
        record.encode_head(&mut head);
        Entry {
            header,
            bytes: Bytes::from(head),
            payload: Some(payload.clone()),
        }
    }

    /// The record's length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len() + self.rest().len()
    }

    /// What follows `bytes` in the record: the payload left out of them,
    /// or nothing.
    pub fn rest(&self) -> &[u8] {
        self.payload.as_deref().unwrap_or_default()
    }

    /// Never: a record has at least its header.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the payload was left out of `bytes`.
    pub fn is_split(&self) -> bool {
        self.payload.is_some()
    }

    /// Whether `other` is this record in the same memory (a clone, not a
    /// copy): compared by address, so it costs nothing per byte.
    pub fn shares_bytes(&self, other: &Entry) -> bool {
        let same = |a: &Bytes, b: &Bytes| a.as_ptr() == b.as_ptr() && a.len() == b.len();
        self.header == other.header
            && same(&self.bytes, &other.bytes)
            && match (&self.payload, &other.payload) {
                (None, None) => true,
                (Some(a), Some(b)) => same(a, b),
                _ => false,
            }
    }

    /// The whole record in one piece: `bytes` itself unless the payload
    /// was left out, then a copy of both.
    pub fn contiguous(&self) -> Bytes {
        let Some(payload) = &self.payload else {
            return self.bytes.clone();
        };
        let mut whole = Vec::with_capacity(self.len());
        whole.extend_from_slice(&self.bytes);
        whole.extend_from_slice(payload);
        Bytes::from(whole)
    }

    /// The record with bytes of its own, in one piece. A record that
    /// arrived from a peer is a slice of the whole read it came in
    /// (`proto::FrameBuffer::next_peer`), and a primary's large payload a
    /// slice of the client's read; one kept past the step that got it
    /// (held behind a gap, waiting for room in the log) is copied, so
    /// that it does not keep that read's buffer alive.
    pub fn compact(self) -> Entry {
        let bytes = match self.payload {
            None => Bytes::copy_from_slice(&self.bytes),
            Some(_) => self.contiguous(),
        };
        Entry {
            header: self.header,
            bytes,
            payload: None,
        }
    }

    /// The void record of `version`: no message, agreed by every replica.
    pub fn void(stream: u64, version: u64, epoch: u64) -> Entry {
        Entry::new(
            RecordHeader {
                flags: proto::FLAG_VOID,
                stream,
                version,
                epoch,
                event: EventId {
                    client: 0,
                    session: 0,
                    sequence: version,
                },
                low_water: 0,
            },
            &[],
            &[],
        )
    }

    pub fn is_void(&self) -> bool {
        self.header.flags & proto::FLAG_VOID != 0
    }

    pub fn version(&self) -> u64 {
        self.header.version
    }

    /// The decoded record (the bytes were encoded or checked on the way in).
    pub fn record(&self) -> Record<'_> {
        if let Some(payload) = &self.payload {
            return Record {
                header: self.header,
                key: &self.bytes[proto::RECORD_HEADER_LEN..],
                payload,
            };
        }
        Record::decode(&self.bytes)
            .expect("an entry holds a valid record")
            .0
    }
}

/// The primary's statement that `version` holds the message with this
/// event id and content checksum (or nothing, when void).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Binding {
    pub version: u64,
    pub epoch: u64,
    pub event: EventId,
    pub low_water: u64,
    pub flags: u16,
    pub crc: u32,
}

impl Binding {
    pub fn is_void(&self) -> bool {
        self.flags & proto::FLAG_VOID != 0
    }
}

/// Why a server refused a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(transparent)]
    Rejected(#[from] Rejection),
    #[error("this server is not the stream's primary")]
    NotPrimary,
    #[error("the version was voided before its message came; ask for a new one")]
    VersionVoid,
    #[error("the replica is holding too many messages; retry")]
    Busy,
    /// Refused before reaching the state machine: too large, unknown
    /// stream, bad argument. A retry cannot help.
    #[error("the server refused the message as invalid")]
    Invalid,
    /// The replica's log failed; it takes no more writes.
    #[error("the replica's log failed")]
    LogFailed,
    /// The stream's requirement is not met and its loss action refuses
    /// writes for now.
    #[error("the stream takes no writes while its requirement is not met")]
    ReadOnly,
}

/// The most messages one `Ack` names: as many as one `Acked` frame
/// carries, so a run crosses the wire as one frame.
pub const ACK_RUN_MAX: u64 = proto::frame::ACKED_RUN_MAX as u64 + 1;

impl Msg {
    /// The event id and version of each message an `Ack` names, in order
    /// (none for any other message).
    pub fn acked(&self) -> impl Iterator<Item = (EventId, u64)> {
        let run = match self {
            Msg::Ack {
                event,
                version,
                count,
                ..
            } => Some((*event, *version, (*count).min(ACK_RUN_MAX))),
            _ => None,
        };
        run.into_iter().flat_map(|(event, version, count)| {
            (0..count).map(move |offset| {
                let next = EventId {
                    sequence: event.sequence.saturating_add(offset),
                    ..event
                };
                (next, version.saturating_add(offset))
            })
        })
    }
}

impl Refusal {
    /// The error code that carries this refusal on the wire.
    pub fn code(&self) -> proto::ErrorCode {
        use proto::ErrorCode;
        match self {
            Refusal::Rejected(crate::Rejection::Retired { .. }) => ErrorCode::SequenceRetired,
            Refusal::Rejected(crate::Rejection::DedupeFull) | Refusal::Busy => ErrorCode::Busy,
            Refusal::Rejected(crate::Rejection::ZeroSequence) | Refusal::Invalid => {
                ErrorCode::InvalidArgument
            }
            Refusal::NotPrimary => ErrorCode::NotPrimary,
            Refusal::VersionVoid => ErrorCode::VersionVoid,
            Refusal::LogFailed => ErrorCode::LogFailed,
            Refusal::ReadOnly => ErrorCode::ReadOnly,
        }
    }
}

/// A message between clients and servers, or between servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Msg {
    // Client to server.
    /// A message for the primary to stamp (`forward`, `stamp`) or, for
    /// `unversioned`, for each replica to log under its own version.
    Write(Content),
    /// A message sent to every replica, tagged for the primary to version.
    Tagged(Content),
    /// `version-request`: give this event id a version.
    Reserve {
        event: EventId,
        low_water: u64,
    },
    /// A message with the version the primary gave it.
    Placed {
        version: u64,
        epoch: u64,
        content: Content,
    },
    /// Sender-based logging: the client holds this message with the
    /// version the primary returned for it (it is now fully logged), and
    /// likewise the `count - 1` messages of the next sequences with the
    /// next versions (a run, confirmed in one message).
    Confirm {
        event: EventId,
        version: u64,
        count: u64,
    },

    // Server to client.
    /// The server's log has the message under `version`, and likewise the
    /// `count - 1` messages of the session's next sequences under the next
    /// versions (a run: a replica releases its waiting acks in order, so a
    /// batch of acks costs one message, one frame and one step of the
    /// client's producer rather than one per message). `count` is 1 to
    /// [`ACK_RUN_MAX`]; [`Msg::acked`] lists the run's messages.
    Ack {
        event: EventId,
        version: u64,
        epoch: u64,
        duplicate: bool,
        /// A `hybrid` primary's current mode.
        hint: Option<HybridMode>,
        count: u64,
    },
    /// The primary's answer to `Reserve` (`version-request`) or to a
    /// `Write` of `returns-version`: the version, before it is logged.
    Stamped {
        event: EventId,
        version: u64,
        epoch: u64,
        duplicate: bool,
    },
    Refused {
        event: EventId,
        refusal: Refusal,
    },
    /// Sender-based logging: the primary's newest checkpoint covers every
    /// version up to `through`, so its clients may drop their copies of
    /// them; with `resend`, a restarted primary asks for the copies past
    /// it.
    Checkpointed {
        through: u64,
        resend: bool,
    },

    // Between servers.
    /// Primary to replica: stamped records, in version order.
    Replicate {
        entries: Vec<Entry>,
    },
    /// Primary to replica: version bindings, in version order.
    Bind {
        bindings: Vec<Binding>,
    },
    /// Replica to primary: my log holds every version up to `logged`, and
    /// its newest version (taken, maybe not yet logged) is `last`.
    Progress {
        logged: u64,
        last: u64,
    },
    /// Primary to replica: versions up to `committed` are committed, and
    /// the primary has assigned up to `last`.
    Commit {
        committed: u64,
        last: u64,
    },
    /// Replica to primary: send me the records `from..=to`.
    Need {
        from: u64,
        to: u64,
    },
    /// Primary to replica, in answer to a `Need` for versions its log no
    /// longer keeps (retention deleted them): the state of its newest
    /// checkpoint, as of `through`. The replica installs it in place of
    /// the records up to `through`, then asks for the rest.
    Checkpoint {
        through: u64,
        state: Bytes,
    },
    /// Primary to replica: report your log at once (a primary that starts
    /// learns the replicas' tails before it stamps anything).
    Probe,
    /// Primary to replica: ack this event again when your log has it (the
    /// client retried and may have lost your first ack).
    Reack {
        event: EventId,
        version: u64,
    },
}

/// Where a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Node {
    Server(ServerId),
    Client(u128),
}
