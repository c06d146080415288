//! Frames of the client protocol: a 5-byte header (body length, type) and a
//! body whose layout depends on the type. `docs/wire-format.md` has the byte
//! tables; a decoder checks every length against the bytes present and the
//! frame size limit, so malformed input is an error, never a panic.

use crate::record::Record;
use crate::Reader;

/// Version of the frame protocol spoken after the handshake.
pub const PROTOCOL_VERSION: u16 = 1;
/// The four bytes that open a client's `Hello`.
pub const HELLO_MAGIC: [u8; 4] = *b"STLG";
/// The four bytes that open a server's `PeerHello`.
pub const PEER_MAGIC: [u8; 4] = *b"STLP";
/// The four bytes that open a server's `ControlHello`.
pub const CONTROL_MAGIC: [u8; 4] = *b"STLC";
/// `Submit` kinds: the replication message a client sends.
pub const SUBMIT_WRITE: u8 = 1;
pub const SUBMIT_TAGGED: u8 = 2;
pub const SUBMIT_RESERVE: u8 = 3;
pub const SUBMIT_PLACED: u8 = 4;
/// Sender-based logging: the client holds the message (`session`,
/// `sequence`) with `version`, and the next `low_water - 1` sequences with
/// the next versions (the field carries the run's length here); no key or
/// payload.
pub const SUBMIT_CONFIRM: u8 = 5;
/// `Submit` kind bit: the message is sent again after a failover (its
/// record carries `possible-duplicate`).
pub const SUBMIT_FLAG_RESENT: u8 = 0x80;
/// The longest run one `Acked` frame may carry (`more`): a server folds at
/// most this many acks into a frame, and a client takes no more than this
/// from one (no window of messages in flight is larger).
pub const ACKED_RUN_MAX: u32 = 65_535;

/// `Acked`/`Stamped` flag: the message was already logged.
pub const ACKED_FLAG_DUPLICATE: u8 = 1;
/// Body length (u32) + frame type (u8).
pub const FRAME_HEADER_LEN: usize = 5;
/// Append flag: the acknowledgement carries the payload back (the logging
/// experiment's "reply of the same length").
pub const APPEND_FLAG_ECHO: u8 = 1;
/// Ack flag: the event id was already logged; the version is the original.
pub const ACK_FLAG_DUPLICATE: u8 = 1;
/// Ack flag: the message may repeat one logged before a failover.
pub const ACK_FLAG_POSSIBLE_DUPLICATE: u8 = 2;

mod kind {
    pub const HELLO: u8 = 0x01;
    pub const CREATE_STREAM: u8 = 0x02;
    pub const DELETE_STREAM: u8 = 0x03;
    pub const LIST_STREAMS: u8 = 0x04;
    pub const OPEN_STREAM: u8 = 0x05;
    pub const APPEND: u8 = 0x06;
    pub const FETCH: u8 = 0x07;
    pub const SUBSCRIBE: u8 = 0x08;
    pub const CREDIT: u8 = 0x09;
    pub const UNSUBSCRIBE: u8 = 0x0A;
    pub const STATUS: u8 = 0x0B;
    pub const SUBMIT: u8 = 0x0C;
    pub const CREATE_REPLICA: u8 = 0x0D;
    pub const PEER_HELLO: u8 = 0x0E;
    pub const PEER: u8 = 0x0F;
    pub const CONTROL_HELLO: u8 = 0x10;
    pub const SET_REQUIREMENT: u8 = 0x11;
    pub const RETIRE_SERVER: u8 = 0x12;
    pub const HELLO_OK: u8 = 0x81;
    pub const STREAM_INFO: u8 = 0x82;
    pub const STREAM_LIST: u8 = 0x83;
    pub const ACK: u8 = 0x84;
    pub const RECORDS: u8 = 0x85;
    pub const DELIVER: u8 = 0x86;
    pub const ERROR: u8 = 0x87;
    pub const OK: u8 = 0x88;
    pub const STATUS_REPLY: u8 = 0x89;
    pub const ACKED: u8 = 0x8A;
    pub const STAMPED: u8 = 0x8B;
    pub const REFUSED: u8 = 0x8C;
    pub const CHECKPOINTED: u8 = 0x8D;
}

/// How a stream's log reaches the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurabilityConfig {
    /// No disk: records live in a bounded memory ring. Lost on any crash.
    Memory,
    /// Ack after write + fdatasync, with group commit. Nothing acknowledged
    /// is lost by a crash.
    Sync,
    /// Seed 004's paged buffer: `pages` × `page_size` bytes, pages written
    /// asynchronously. A crash loses at most what the pages held.
    Paged { pages: u16, page_size: u32 },
    /// Sender-based message logging (seed 000): the log is written through
    /// a page buffer like `Paged`, and the client keeps each message with
    /// its version until the primary's checkpoint covers it, so a crash of
    /// the server alone loses nothing acknowledged.
    Sender { pages: u16, page_size: u32 },
}

impl DurabilityConfig {
    /// The mode's name and its buffer's settings, as stream files and the
    /// control plane keep them.
    pub fn parts(self) -> (&'static str, u16, u32) {
        match self {
            DurabilityConfig::Memory => ("memory", 0, 0),
            DurabilityConfig::Sync => ("sync", 0, 0),
            DurabilityConfig::Paged { pages, page_size } => ("paged", pages, page_size),
            DurabilityConfig::Sender { pages, page_size } => ("sender", pages, page_size),
        }
    }

    /// The inverse of [`DurabilityConfig::parts`].
    pub fn from_parts(mode: &str, pages: u16, page_size: u32) -> Result<Self, UnknownDurability> {
        match mode {
            "memory" => Ok(DurabilityConfig::Memory),
            "sync" => Ok(DurabilityConfig::Sync),
            "paged" => Ok(DurabilityConfig::Paged { pages, page_size }),
            "sender" => Ok(DurabilityConfig::Sender { pages, page_size }),
            other => Err(UnknownDurability {
                name: other.to_string(),
            }),
        }
    }

    /// The page buffer of `paged` and `sender`.
    pub fn pages(self) -> Option<(u16, u32)> {
        match self {
            DurabilityConfig::Paged { pages, page_size }
            | DurabilityConfig::Sender { pages, page_size } => Some((pages, page_size)),
            _ => None,
        }
    }
}

/// A durability mode name that is none of `memory`, `sync`, `paged` and
/// `sender`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown durability {name:?}")]
pub struct UnknownDurability {
    pub name: String,
}

/// What durability an acknowledgement reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckLevel {
    /// Held in the server's memory (the log buffer); not yet on disk.
    Memory = 0,
    /// Written and fdatasynced to the server's log.
    Synced = 1,
}

/// Error codes carried by `Frame::Error`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorCode {
    BadFrame = 1,
    UnsupportedVersion = 2,
    UnknownStream = 3,
    StreamExists = 4,
    MessageTooLarge = 5,
    LogFailed = 6,
    InvalidArgument = 7,
    VersionUnavailable = 8,
    SequenceRetired = 9,
    Busy = 10,
    Internal = 11,
    /// The server is not the stream's primary (or not one of its replicas).
    NotPrimary = 12,
    /// `version-request`: the version was voided; ask for a new one.
    VersionVoid = 13,
    /// The stream's requirement (roles, in-sync replicas) is not met and
    /// its loss action refuses writes (`read-only`, or `block` past its
    /// timeout); reads go on.
    ReadOnly = 14,
}

impl ErrorCode {
    pub fn from_u16(code: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        Some(match code {
            1 => BadFrame,
            2 => UnsupportedVersion,
            3 => UnknownStream,
            4 => StreamExists,
            5 => MessageTooLarge,
            6 => LogFailed,
            7 => InvalidArgument,
            8 => VersionUnavailable,
            9 => SequenceRetired,
            10 => Busy,
            11 => Internal,
            12 => NotPrimary,
            13 => VersionVoid,
            14 => ReadOnly,
            _ => return None,
        })
    }
}

/// A stream as the server describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub id: u64,
    pub name: String,
    pub durability: DurabilityConfig,
    /// Oldest version still readable (1 for a log that kept everything).
    pub first_version: u64,
    /// Newest version assigned.
    pub last_version: u64,
    /// Newest version readers may see.
    pub committed_version: u64,
    /// Replication protocol code (`engine::replication::Protocol::code`).
    pub protocol: u8,
    /// Epoch of the current primary.
    pub epoch: u64,
    /// Server id of the primary.
    pub primary: u32,
    /// The replica set: server ids and client addresses.
    pub replicas: Vec<ReplicaAddress>,
    /// The output commit interval in milliseconds (0: acks as soon as the
    /// log holds the message). Encoded after the fixed layout, and only
    /// when not 0, so peers that predate it read what they always did.
    pub commit_interval_ms: u32,
}

/// One server of a stream's replica set, as clients reach it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaAddress {
    pub id: u32,
    pub address: String,
}

/// A primary's binding of a version to an event id (see
/// `engine::replication::Binding`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WireBinding {
    pub version: u64,
    pub epoch: u64,
    pub client: u128,
    pub session: u64,
    pub sequence: u64,
    pub low_water: u64,
    pub flags: u16,
    pub crc: u32,
}

/// Size of one encoded [`WireBinding`].
const BINDING_LEN: usize = 8 + 8 + 16 + 8 + 8 + 8 + 2 + 4;

/// A replication message between servers, for one stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerMessage {
    /// Encoded records back to back, in version order.
    Replicate {
        count: u32,
        records: Vec<u8>,
    },
    Bind {
        bindings: Vec<WireBinding>,
    },
    Progress {
        logged: u64,
        last: u64,
    },
    Commit {
        committed: u64,
        last: u64,
    },
    Need {
        from: u64,
        to: u64,
    },
    /// Primary to replica: report your log's progress and tail now.
    Probe,
    /// Primary to replica: the state of its newest checkpoint, as of
    /// `through`, in place of versions its log no longer keeps.
    Checkpoint {
        through: u64,
        state: Vec<u8>,
    },
    Reack {
        client: u128,
        session: u64,
        sequence: u64,
        version: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Hello {
        version: u16,
        client: u128,
        token: String,
    },
    CreateStream {
        request: u64,
        name: String,
        durability: DurabilityConfig,
        /// Replication protocol code; 0 picks the default.
        protocol: u8,
        /// Replica count; 0 picks the default (3, or fewer servers).
        replicas: u8,
        /// The output commit interval in milliseconds; 0 (and a frame
        /// without the field) acks as soon as the log holds a message.
        commit_interval_ms: u32,
        /// The stream's own retention (zeros, and a frame without the
        /// fields: the server's defaults).
        retention: RetentionConfig,
    },
    /// Server to server: create this replica of a stream as described.
    CreateReplica {
        request: u64,
        info: StreamInfo,
        retention: RetentionConfig,
    },
    /// A replication message from a client: `kind` is one of the
    /// `SUBMIT_*` constants; `version` and `epoch` matter for
    /// `SUBMIT_PLACED` only.
    Submit {
        stream: u64,
        kind: u8,
        version: u64,
        epoch: u64,
        session: u64,
        sequence: u64,
        low_water: u64,
        key: Vec<u8>,
        payload: Vec<u8>,
    },
    /// The first frame of a server's connection to a peer. `incarnation`
    /// is the view in which the sending process joined; a receiver refuses
    /// an incarnation that is no longer a member (shunning).
    PeerHello {
        version: u16,
        from: u32,
        incarnation: u64,
    },
    /// The first frame of a control-plane connection (Raft and membership
    /// requests, whose encoding belongs to the control crate).
    ControlHello {
        version: u16,
        from: u32,
    },
    Peer {
        stream: u64,
        message: PeerMessage,
    },
    DeleteStream {
        request: u64,
        name: String,
    },
    /// Sets (or with `action` 0 clears) what a stream requires of its
    /// in-sync replicas, and what it does while that is not met: `action`
    /// 1 read-only, 2 block for up to `block_ms`, 3 reconnect.
    SetRequirement {
        request: u64,
        name: String,
        min_in_sync: u16,
        action: u8,
        block_ms: u32,
        roles: Vec<String>,
    },
    /// Takes a server that has left the view for good out of the control
    /// plane's voters, so the cluster's majority no longer counts it.
    RetireServer {
        request: u64,
        server: u32,
    },
    ListStreams {
        request: u64,
    },
    OpenStream {
        request: u64,
        name: String,
    },
    Append {
        request: u64,
        stream: u64,
        flags: u8,
        session: u64,
        sequence: u64,
        low_water: u64,
        key: Vec<u8>,
        payload: Vec<u8>,
    },
    Fetch {
        request: u64,
        stream: u64,
        from: u64,
        max_records: u32,
        max_bytes: u32,
    },
    Subscribe {
        subscription: u64,
        stream: u64,
        from: u64,
        credit: u32,
    },
    Credit {
        subscription: u64,
        credit: u32,
    },
    Unsubscribe {
        subscription: u64,
    },
    Status {
        request: u64,
    },
    HelloOk {
        version: u16,
        server: u128,
        max_frame: u32,
    },
    StreamInfo {
        request: u64,
        info: StreamInfo,
    },
    StreamList {
        request: u64,
        streams: Vec<StreamInfo>,
    },
    Ack {
        request: u64,
        stream: u64,
        version: u64,
        epoch: u64,
        level: AckLevel,
        flags: u8,
        replicas: u8,
        echo: Vec<u8>,
    },
    /// Answer to `Fetch`: `count` encoded records back to back in `records`;
    /// `next` is the version to ask for next.
    Records {
        request: u64,
        next: u64,
        count: u32,
        records: Vec<u8>,
    },
    /// Pushed to a subscription: `count` encoded records back to back.
    Deliver {
        subscription: u64,
        count: u32,
        records: Vec<u8>,
    },
    Error {
        request: u64,
        code: ErrorCode,
        message: String,
    },
    Ok {
        request: u64,
    },
    StatusReply {
        request: u64,
        json: String,
    },
    /// Server `server`'s log has the message `(session, sequence)` of this
    /// connection's client under `version`. `hint`: a `hybrid` primary's
    /// mode (0 none, 1 server-sync, 2 client-async). `more`: so it has the
    /// next `more` sequences of the session under the next `more`
    /// versions, with the same epoch, flags and hint (a run of acks in one
    /// frame).
    Acked {
        stream: u64,
        server: u32,
        session: u64,
        sequence: u64,
        version: u64,
        epoch: u64,
        flags: u8,
        hint: u8,
        more: u32,
    },
    /// The primary gave the message this version (before logging it).
    Stamped {
        stream: u64,
        session: u64,
        sequence: u64,
        version: u64,
        epoch: u64,
        flags: u8,
    },
    /// The server refused the message.
    Refused {
        stream: u64,
        session: u64,
        sequence: u64,
        code: ErrorCode,
        message: String,
    },
    /// Sender-based logging: the primary's newest checkpoint covers every
    /// version up to `version`; flag 1: it restarted, resend the copies
    /// held past it.
    Checkpointed {
        stream: u64,
        version: u64,
        flags: u8,
    },
}

/// `Checkpointed` flag: resend every message held past the checkpoint.
pub const CHECKPOINTED_FLAG_RESEND: u8 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {length} bytes exceeds the limit of {limit} bytes")]
    TooLarge { length: usize, limit: usize },
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    #[error("malformed {0} frame")]
    Malformed(&'static str),
    #[error("bad handshake magic")]
    BadMagic,
}

fn put_str16(out: &mut Vec<u8>, text: &str) {
    let bytes = text.as_bytes();
    // Cut an over-long string on a character boundary, so what is sent is
    // still valid UTF-8.
    let mut length = bytes.len().min(u16::MAX as usize);
    while !text.is_char_boundary(length) {
        length -= 1;
    }
    out.extend_from_slice(&(length as u16).to_le_bytes());
    out.extend_from_slice(&bytes[..length]);
}

fn put_durability(out: &mut Vec<u8>, durability: DurabilityConfig) {
    let (mode, pages, page_size) = match durability {
        DurabilityConfig::Memory => (0u8, 0u16, 0u32),
        DurabilityConfig::Sync => (1, 0, 0),
        DurabilityConfig::Paged { pages, page_size } => (2, pages, page_size),
        DurabilityConfig::Sender { pages, page_size } => (3, pages, page_size),
    };
    out.push(mode);
    out.extend_from_slice(&pages.to_le_bytes());
    out.extend_from_slice(&page_size.to_le_bytes());
}

/// A stream's own retention at its creation; zeros leave the server's
/// defaults (`retain_bytes`, `retain_ms`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Keep at least this many bytes of log.
    pub bytes: u64,
    /// Delete segments closed this many milliseconds ago.
    pub ms: u64,
}

/// The optional tail of `CreateStream` and `CreateReplica`: the commit
/// interval (only when not 0), then the retention, after an interval
/// written in full, only when it is not the default.
fn put_interval_and_retention(out: &mut Vec<u8>, interval: u32, retention: RetentionConfig) {
    if retention == RetentionConfig::default() {
        put_optional_u32(out, interval);
    } else {
        out.extend_from_slice(&interval.to_le_bytes());
        out.extend_from_slice(&retention.bytes.to_le_bytes());
        out.extend_from_slice(&retention.ms.to_le_bytes());
    }
}

/// A field added after a frame's original layout: written only when it is
/// not 0, read as 0 when the body ends before it.
fn put_optional_u32(out: &mut Vec<u8>, value: u32) {
    if value != 0 {
        out.extend_from_slice(&value.to_le_bytes());
    }
}

fn put_info(out: &mut Vec<u8>, info: &StreamInfo) {
    out.extend_from_slice(&info.id.to_le_bytes());
    put_str16(out, &info.name);
    put_durability(out, info.durability);
    out.extend_from_slice(&info.first_version.to_le_bytes());
    out.extend_from_slice(&info.last_version.to_le_bytes());
    out.extend_from_slice(&info.committed_version.to_le_bytes());
    out.push(info.protocol);
    out.extend_from_slice(&info.epoch.to_le_bytes());
    out.extend_from_slice(&info.primary.to_le_bytes());
    out.push(info.replicas.len().min(255) as u8);
    for replica in info.replicas.iter().take(255) {
        out.extend_from_slice(&replica.id.to_le_bytes());
        put_str16(out, &replica.address);
    }
}

fn put_peer_message(out: &mut Vec<u8>, message: &PeerMessage) {
    match message {
        PeerMessage::Replicate { count, records } => {
            out.push(1);
            out.extend_from_slice(&count.to_le_bytes());
            out.extend_from_slice(records);
        }
        PeerMessage::Bind { bindings } => {
            out.push(2);
            out.extend_from_slice(&(bindings.len() as u32).to_le_bytes());
            for b in bindings {
                out.extend_from_slice(&b.version.to_le_bytes());
                out.extend_from_slice(&b.epoch.to_le_bytes());
                out.extend_from_slice(&b.client.to_le_bytes());
                out.extend_from_slice(&b.session.to_le_bytes());
                out.extend_from_slice(&b.sequence.to_le_bytes());
                out.extend_from_slice(&b.low_water.to_le_bytes());
                out.extend_from_slice(&b.flags.to_le_bytes());
                out.extend_from_slice(&b.crc.to_le_bytes());
            }
        }
        PeerMessage::Progress { logged, last } => {
            out.push(3);
            out.extend_from_slice(&logged.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
        }
        PeerMessage::Commit { committed, last } => {
            out.push(4);
            out.extend_from_slice(&committed.to_le_bytes());
            out.extend_from_slice(&last.to_le_bytes());
        }
        PeerMessage::Need { from, to } => {
            out.push(5);
            out.extend_from_slice(&from.to_le_bytes());
            out.extend_from_slice(&to.to_le_bytes());
        }
        PeerMessage::Probe => out.push(7),
        PeerMessage::Checkpoint { through, state } => {
            out.push(8);
            out.extend_from_slice(&through.to_le_bytes());
            out.extend_from_slice(&(state.len() as u32).to_le_bytes());
            out.extend_from_slice(state);
        }
        PeerMessage::Reack {
            client,
            session,
            sequence,
            version,
        } => {
            out.push(6);
            out.extend_from_slice(&client.to_le_bytes());
            out.extend_from_slice(&session.to_le_bytes());
            out.extend_from_slice(&sequence.to_le_bytes());
            out.extend_from_slice(&version.to_le_bytes());
        }
    }
}

impl Reader<'_> {
    fn str16(&mut self) -> Option<String> {
        let length = self.u16()? as usize;
        String::from_utf8(self.take(length)?.to_vec()).ok()
    }

    fn bytes32(&mut self) -> Option<Vec<u8>> {
        let length = self.u32()? as usize;
        Some(self.take(length)?.to_vec())
    }

    fn durability(&mut self) -> Option<DurabilityConfig> {
        let mode = self.u8()?;
        let pages = self.u16()?;
        let page_size = self.u32()?;
        match mode {
            0 => Some(DurabilityConfig::Memory),
            1 => Some(DurabilityConfig::Sync),
            2 => Some(DurabilityConfig::Paged { pages, page_size }),
            3 => Some(DurabilityConfig::Sender { pages, page_size }),
            _ => None,
        }
    }

    /// A u32 added after a layout's end: 0 when the body ends here,
    /// malformed when fewer than 4 bytes are left.
    /// The tail [`put_interval_and_retention`] writes.
    fn interval_and_retention(&mut self) -> Option<(u32, RetentionConfig)> {
        let interval = self.optional_u32()?;
        if self.remaining() == 0 {
            return Some((interval, RetentionConfig::default()));
        }
        let retention = RetentionConfig {
            bytes: self.u64()?,
            ms: self.u64()?,
        };
        Some((interval, retention))
    }

    fn optional_u32(&mut self) -> Option<u32> {
        if self.remaining() == 0 {
            Some(0)
        } else {
            self.u32()
        }
    }

    fn info(&mut self) -> Option<StreamInfo> {
        let mut info = StreamInfo {
            id: self.u64()?,
            name: self.str16()?,
            durability: self.durability()?,
            first_version: self.u64()?,
            last_version: self.u64()?,
            committed_version: self.u64()?,
            protocol: self.u8()?,
            epoch: self.u64()?,
            primary: self.u32()?,
            replicas: Vec::new(),
            commit_interval_ms: 0,
        };
        let count = self.u8()?;
        for _ in 0..count {
            info.replicas.push(ReplicaAddress {
                id: self.u32()?,
                address: self.str16()?,
            });
        }
        Some(info)
    }

    fn peer_message(&mut self) -> Option<PeerMessage> {
        Some(match self.u8()? {
            1 => {
                let count = self.u32()?;
                let records = self.rest().to_vec();
                if !records_valid(&records, count) {
                    return None;
                }
                PeerMessage::Replicate { count, records }
            }
            2 => {
                let count = self.u32()? as usize;
                if count > self.remaining() / BINDING_LEN {
                    return None;
                }
                let mut bindings = Vec::with_capacity(count);
                for _ in 0..count {
                    bindings.push(WireBinding {
                        version: self.u64()?,
                        epoch: self.u64()?,
                        client: self.u128()?,
                        session: self.u64()?,
                        sequence: self.u64()?,
                        low_water: self.u64()?,
                        flags: self.u16()?,
                        crc: self.u32()?,
                    });
                }
                PeerMessage::Bind { bindings }
            }
            3 => PeerMessage::Progress {
                logged: self.u64()?,
                last: self.u64()?,
            },
            4 => PeerMessage::Commit {
                committed: self.u64()?,
                last: self.u64()?,
            },
            5 => PeerMessage::Need {
                from: self.u64()?,
                to: self.u64()?,
            },
            7 => PeerMessage::Probe,
            8 => PeerMessage::Checkpoint {
                through: self.u64()?,
                state: self.bytes32()?,
            },
            6 => PeerMessage::Reack {
                client: self.u128()?,
                session: self.u64()?,
                sequence: self.u64()?,
                version: self.u64()?,
            },
            _ => return None,
        })
    }
}

/// The fixed fields of a `Submit` frame, so a client can encode one from
/// borrowed key and payload without building a [`Frame`] (no copy of the
/// message into owned buffers first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubmitFields {
    pub stream: u64,
    pub kind: u8,
    pub version: u64,
    pub epoch: u64,
    pub session: u64,
    pub sequence: u64,
    pub low_water: u64,
}

impl SubmitFields {
    /// Appends the whole frame, byte for byte what `Frame::Submit` encodes.
    pub fn encode(&self, out: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
        self.put_body(out, key, payload);
        let body_length = (out.len() - start - FRAME_HEADER_LEN) as u32;
        out[start..start + 4].copy_from_slice(&body_length.to_le_bytes());
        out[start + 4] = kind::SUBMIT;
    }

    fn put_body(&self, out: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
        out.extend_from_slice(&self.stream.to_le_bytes());
        out.push(self.kind);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.session.to_le_bytes());
        out.extend_from_slice(&self.sequence.to_le_bytes());
        out.extend_from_slice(&self.low_water.to_le_bytes());
        out.extend_from_slice(&(key.len() as u32).to_le_bytes());
        out.extend_from_slice(key);
        out.extend_from_slice(payload);
    }
}

/// Checks that `records` holds exactly `count` valid records.
fn records_valid(records: &[u8], count: u32) -> bool {
    let mut offset = 0;
    for _ in 0..count {
        match Record::decode(&records[offset..]) {
            Ok((_, length)) => offset += length,
            Err(_) => return false,
        }
    }
    offset == records.len()
}

impl Frame {
    /// Appends the encoded frame (header and body) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
        let frame_type = self.encode_body(out);
        let body_length = (out.len() - start - FRAME_HEADER_LEN) as u32;
        out[start..start + 4].copy_from_slice(&body_length.to_le_bytes());
        out[start + 4] = frame_type;
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    fn encode_body(&self, out: &mut Vec<u8>) -> u8 {
        match self {
            Frame::Hello {
                version,
                client,
                token,
            } => {
                out.extend_from_slice(&HELLO_MAGIC);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&client.to_le_bytes());
                put_str16(out, token);
                kind::HELLO
            }
            Frame::CreateStream {
                request,
                name,
                durability,
                protocol,
                replicas,
                commit_interval_ms,
                retention,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                put_str16(out, name);
                put_durability(out, *durability);
                out.push(*protocol);
                out.push(*replicas);
                put_interval_and_retention(out, *commit_interval_ms, *retention);
                kind::CREATE_STREAM
            }
            Frame::CreateReplica {
                request,
                info,
                retention,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                put_info(out, info);
                put_interval_and_retention(out, info.commit_interval_ms, *retention);
                kind::CREATE_REPLICA
            }
            Frame::Submit {
                stream,
                kind: submit,
                version,
                epoch,
                session,
                sequence,
                low_water,
                key,
                payload,
            } => {
                let fields = SubmitFields {
                    stream: *stream,
                    kind: *submit,
                    version: *version,
                    epoch: *epoch,
                    session: *session,
                    sequence: *sequence,
                    low_water: *low_water,
                };
                fields.put_body(out, key, payload);
                kind::SUBMIT
            }
            Frame::PeerHello {
                version,
                from,
                incarnation,
            } => {
                out.extend_from_slice(&PEER_MAGIC);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&incarnation.to_le_bytes());
                kind::PEER_HELLO
            }
            Frame::ControlHello { version, from } => {
                out.extend_from_slice(&CONTROL_MAGIC);
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                kind::CONTROL_HELLO
            }
            Frame::Peer { stream, message } => {
                out.extend_from_slice(&stream.to_le_bytes());
                put_peer_message(out, message);
                kind::PEER
            }
            Frame::Acked {
                stream,
                server,
                session,
                sequence,
                version,
                epoch,
                flags,
                hint,
                more,
            } => {
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&server.to_le_bytes());
                out.extend_from_slice(&session.to_le_bytes());
                out.extend_from_slice(&sequence.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
                out.push(*flags);
                out.push(*hint);
                put_optional_u32(out, *more);
                kind::ACKED
            }
            Frame::Stamped {
                stream,
                session,
                sequence,
                version,
                epoch,
                flags,
            } => {
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&session.to_le_bytes());
                out.extend_from_slice(&sequence.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
                out.push(*flags);
                kind::STAMPED
            }
            Frame::Checkpointed {
                stream,
                version,
                flags,
            } => {
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
                out.push(*flags);
                kind::CHECKPOINTED
            }
            Frame::Refused {
                stream,
                session,
                sequence,
                code,
                message,
            } => {
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&session.to_le_bytes());
                out.extend_from_slice(&sequence.to_le_bytes());
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                put_str16(out, message);
                kind::REFUSED
            }
            Frame::DeleteStream { request, name } => {
                out.extend_from_slice(&request.to_le_bytes());
                put_str16(out, name);
                kind::DELETE_STREAM
            }
            Frame::SetRequirement {
                request,
                name,
                min_in_sync,
                action,
                block_ms,
                roles,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                put_str16(out, name);
                out.extend_from_slice(&min_in_sync.to_le_bytes());
                out.push(*action);
                out.extend_from_slice(&block_ms.to_le_bytes());
                out.extend_from_slice(&(roles.len() as u16).to_le_bytes());
                for role in roles {
                    put_str16(out, role);
                }
                kind::SET_REQUIREMENT
            }
            Frame::RetireServer { request, server } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&server.to_le_bytes());
                kind::RETIRE_SERVER
            }
            Frame::ListStreams { request } => {
                out.extend_from_slice(&request.to_le_bytes());
                kind::LIST_STREAMS
            }
            Frame::OpenStream { request, name } => {
                out.extend_from_slice(&request.to_le_bytes());
                put_str16(out, name);
                kind::OPEN_STREAM
            }
            Frame::Append {
                request,
                stream,
                flags,
                session,
                sequence,
                low_water,
                key,
                payload,
            } => {
                Self::encode_append_header(
                    out, *request, *stream, *flags, *session, *sequence, *low_water,
                );
                out.extend_from_slice(&(key.len() as u32).to_le_bytes());
                out.extend_from_slice(key);
                out.extend_from_slice(payload);
                kind::APPEND
            }
            Frame::Fetch {
                request,
                stream,
                from,
                max_records,
                max_bytes,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&max_records.to_le_bytes());
                out.extend_from_slice(&max_bytes.to_le_bytes());
                kind::FETCH
            }
            Frame::Subscribe {
                subscription,
                stream,
                from,
                credit,
            } => {
                out.extend_from_slice(&subscription.to_le_bytes());
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&from.to_le_bytes());
                out.extend_from_slice(&credit.to_le_bytes());
                kind::SUBSCRIBE
            }
            Frame::Credit {
                subscription,
                credit,
            } => {
                out.extend_from_slice(&subscription.to_le_bytes());
                out.extend_from_slice(&credit.to_le_bytes());
                kind::CREDIT
            }
            Frame::Unsubscribe { subscription } => {
                out.extend_from_slice(&subscription.to_le_bytes());
                kind::UNSUBSCRIBE
            }
            Frame::Status { request } => {
                out.extend_from_slice(&request.to_le_bytes());
                kind::STATUS
            }
            Frame::HelloOk {
                version,
                server,
                max_frame,
            } => {
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&server.to_le_bytes());
                out.extend_from_slice(&max_frame.to_le_bytes());
                kind::HELLO_OK
            }
            Frame::StreamInfo { request, info } => {
                out.extend_from_slice(&request.to_le_bytes());
                put_info(out, info);
                put_optional_u32(out, info.commit_interval_ms);
                kind::STREAM_INFO
            }
            Frame::StreamList { request, streams } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&(streams.len() as u32).to_le_bytes());
                for info in streams {
                    put_info(out, info);
                }
                // The intervals follow the whole list, only when one is set,
                // so a list without them reads as before.
                if streams.iter().any(|info| info.commit_interval_ms != 0) {
                    for info in streams {
                        out.extend_from_slice(&info.commit_interval_ms.to_le_bytes());
                    }
                }
                kind::STREAM_LIST
            }
            Frame::Ack {
                request,
                stream,
                version,
                epoch,
                level,
                flags,
                replicas,
                echo,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
                out.extend_from_slice(&epoch.to_le_bytes());
                out.push(*level as u8);
                out.push(*flags);
                out.push(*replicas);
                out.extend_from_slice(echo);
                kind::ACK
            }
            Frame::Records {
                request,
                next,
                count,
                records,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&next.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(records);
                kind::RECORDS
            }
            Frame::Deliver {
                subscription,
                count,
                records,
            } => {
                out.extend_from_slice(&subscription.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
                out.extend_from_slice(records);
                kind::DELIVER
            }
            Frame::Error {
                request,
                code,
                message,
            } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&(*code as u16).to_le_bytes());
                put_str16(out, message);
                kind::ERROR
            }
            Frame::Ok { request } => {
                out.extend_from_slice(&request.to_le_bytes());
                kind::OK
            }
            Frame::StatusReply { request, json } => {
                out.extend_from_slice(&request.to_le_bytes());
                out.extend_from_slice(&(json.len() as u32).to_le_bytes());
                out.extend_from_slice(json.as_bytes());
                kind::STATUS_REPLY
            }
        }
    }

    fn encode_append_header(
        out: &mut Vec<u8>,
        request: u64,
        stream: u64,
        flags: u8,
        session: u64,
        sequence: u64,
        low_water: u64,
    ) {
        out.extend_from_slice(&request.to_le_bytes());
        out.extend_from_slice(&stream.to_le_bytes());
        out.push(flags);
        out.extend_from_slice(&session.to_le_bytes());
        out.extend_from_slice(&sequence.to_le_bytes());
        out.extend_from_slice(&low_water.to_le_bytes());
    }

    /// Decodes one frame from the start of `bytes`. `Ok(None)` means more
    /// bytes are needed; the `usize` is the number of bytes consumed.
    pub fn decode(bytes: &[u8], max_frame: usize) -> Result<Option<(Frame, usize)>, FrameError> {
        if bytes.len() < FRAME_HEADER_LEN {
            return Ok(None);
        }
        let body_length = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes")) as usize;
        if body_length > max_frame {
            return Err(FrameError::TooLarge {
                length: body_length,
                limit: max_frame,
            });
        }
        let total = FRAME_HEADER_LEN + body_length;
        if bytes.len() < total {
            return Ok(None);
        }
        let frame = Self::decode_body(bytes[4], &bytes[FRAME_HEADER_LEN..total])?;
        Ok(Some((frame, total)))
    }

    fn decode_body(frame_type: u8, body: &[u8]) -> Result<Frame, FrameError> {
        let mut reader = Reader::new(body);
        let (frame, name) = match frame_type {
            kind::HELLO => {
                if reader.take(4) != Some(&HELLO_MAGIC[..]) {
                    return Err(FrameError::BadMagic);
                }
                (
                    (|| {
                        Some(Frame::Hello {
                            version: reader.u16()?,
                            client: reader.u128()?,
                            token: reader.str16()?,
                        })
                    })(),
                    "hello",
                )
            }
            kind::CREATE_STREAM => (
                (|| {
                    let request = reader.u64()?;
                    let name = reader.str16()?;
                    let durability = reader.durability()?;
                    let protocol = reader.u8()?;
                    let replicas = reader.u8()?;
                    let (commit_interval_ms, retention) = reader.interval_and_retention()?;
                    Some(Frame::CreateStream {
                        request,
                        name,
                        durability,
                        protocol,
                        replicas,
                        commit_interval_ms,
                        retention,
                    })
                })(),
                "create-stream",
            ),
            kind::CREATE_REPLICA => (
                (|| {
                    let request = reader.u64()?;
                    let mut info = reader.info()?;
                    let (commit_interval_ms, retention) = reader.interval_and_retention()?;
                    info.commit_interval_ms = commit_interval_ms;
                    Some(Frame::CreateReplica {
                        request,
                        info,
                        retention,
                    })
                })(),
                "create-replica",
            ),
            kind::SUBMIT => (
                (|| {
                    Some(Frame::Submit {
                        stream: reader.u64()?,
                        kind: reader.u8()?,
                        version: reader.u64()?,
                        epoch: reader.u64()?,
                        session: reader.u64()?,
                        sequence: reader.u64()?,
                        low_water: reader.u64()?,
                        key: reader.bytes32()?,
                        payload: reader.rest().to_vec(),
                    })
                })(),
                "submit",
            ),
            kind::PEER_HELLO => {
                if reader.take(4) != Some(&PEER_MAGIC[..]) {
                    return Err(FrameError::BadMagic);
                }
                (
                    (|| {
                        Some(Frame::PeerHello {
                            version: reader.u16()?,
                            from: reader.u32()?,
                            incarnation: reader.u64()?,
                        })
                    })(),
                    "peer-hello",
                )
            }
            kind::CONTROL_HELLO => {
                if reader.take(4) != Some(&CONTROL_MAGIC[..]) {
                    return Err(FrameError::BadMagic);
                }
                (
                    (|| {
                        Some(Frame::ControlHello {
                            version: reader.u16()?,
                            from: reader.u32()?,
                        })
                    })(),
                    "control-hello",
                )
            }
            kind::PEER => (
                (|| {
                    Some(Frame::Peer {
                        stream: reader.u64()?,
                        message: reader.peer_message()?,
                    })
                })(),
                "peer",
            ),
            kind::ACKED => (
                (|| {
                    Some(Frame::Acked {
                        stream: reader.u64()?,
                        server: reader.u32()?,
                        session: reader.u64()?,
                        sequence: reader.u64()?,
                        version: reader.u64()?,
                        epoch: reader.u64()?,
                        flags: reader.u8()?,
                        hint: reader.u8()?,
                        more: reader.optional_u32()?,
                    })
                })(),
                "acked",
            ),
            kind::STAMPED => (
                (|| {
                    Some(Frame::Stamped {
                        stream: reader.u64()?,
                        session: reader.u64()?,
                        sequence: reader.u64()?,
                        version: reader.u64()?,
                        epoch: reader.u64()?,
                        flags: reader.u8()?,
                    })
                })(),
                "stamped",
            ),
            kind::CHECKPOINTED => (
                (|| {
                    Some(Frame::Checkpointed {
                        stream: reader.u64()?,
                        version: reader.u64()?,
                        flags: reader.u8()?,
                    })
                })(),
                "checkpointed",
            ),
            kind::REFUSED => (
                (|| {
                    Some(Frame::Refused {
                        stream: reader.u64()?,
                        session: reader.u64()?,
                        sequence: reader.u64()?,
                        code: ErrorCode::from_u16(reader.u16()?)?,
                        message: reader.str16()?,
                    })
                })(),
                "refused",
            ),
            kind::DELETE_STREAM => (
                (|| {
                    Some(Frame::DeleteStream {
                        request: reader.u64()?,
                        name: reader.str16()?,
                    })
                })(),
                "delete-stream",
            ),
            kind::SET_REQUIREMENT => (
                (|| {
                    let request = reader.u64()?;
                    let name = reader.str16()?;
                    let min_in_sync = reader.u16()?;
                    let action = reader.u8()?;
                    let block_ms = reader.u32()?;
                    let count = reader.u16()?;
                    let mut roles = Vec::with_capacity(usize::from(count).min(64));
                    for _ in 0..count {
                        roles.push(reader.str16()?);
                    }
                    Some(Frame::SetRequirement {
                        request,
                        name,
                        min_in_sync,
                        action,
                        block_ms,
                        roles,
                    })
                })(),
                "set-requirement",
            ),
            kind::RETIRE_SERVER => (
                (|| {
                    let request = reader.u64()?;
                    let server = reader.u32()?;
                    Some(Frame::RetireServer { request, server })
                })(),
                "retire-server",
            ),
            kind::LIST_STREAMS => (
                reader.u64().map(|request| Frame::ListStreams { request }),
                "list-streams",
            ),
            kind::OPEN_STREAM => (
                (|| {
                    Some(Frame::OpenStream {
                        request: reader.u64()?,
                        name: reader.str16()?,
                    })
                })(),
                "open-stream",
            ),
            kind::APPEND => (
                (|| {
                    Some(Frame::Append {
                        request: reader.u64()?,
                        stream: reader.u64()?,
                        flags: reader.u8()?,
                        session: reader.u64()?,
                        sequence: reader.u64()?,
                        low_water: reader.u64()?,
                        key: reader.bytes32()?,
                        payload: reader.rest().to_vec(),
                    })
                })(),
                "append",
            ),
            kind::FETCH => (
                (|| {
                    Some(Frame::Fetch {
                        request: reader.u64()?,
                        stream: reader.u64()?,
                        from: reader.u64()?,
                        max_records: reader.u32()?,
                        max_bytes: reader.u32()?,
                    })
                })(),
                "fetch",
            ),
            kind::SUBSCRIBE => (
                (|| {
                    Some(Frame::Subscribe {
                        subscription: reader.u64()?,
                        stream: reader.u64()?,
                        from: reader.u64()?,
                        credit: reader.u32()?,
                    })
                })(),
                "subscribe",
            ),
            kind::CREDIT => (
                (|| {
                    Some(Frame::Credit {
                        subscription: reader.u64()?,
                        credit: reader.u32()?,
                    })
                })(),
                "credit",
            ),
            kind::UNSUBSCRIBE => (
                reader
                    .u64()
                    .map(|subscription| Frame::Unsubscribe { subscription }),
                "unsubscribe",
            ),
            kind::STATUS => (
                reader.u64().map(|request| Frame::Status { request }),
                "status",
            ),
            kind::HELLO_OK => (
                (|| {
                    Some(Frame::HelloOk {
                        version: reader.u16()?,
                        server: reader.u128()?,
                        max_frame: reader.u32()?,
                    })
                })(),
                "hello-ok",
            ),
            kind::STREAM_INFO => (
                (|| {
                    let request = reader.u64()?;
                    let mut info = reader.info()?;
                    info.commit_interval_ms = reader.optional_u32()?;
                    Some(Frame::StreamInfo { request, info })
                })(),
                "stream-info",
            ),
            kind::STREAM_LIST => (
                (|| {
                    let request = reader.u64()?;
                    let count = reader.u32()? as usize;
                    // Each entry takes at least 41 bytes; refuse counts the
                    // body cannot hold before allocating for them.
                    if count > reader.remaining() / 41 {
                        return None;
                    }
                    let mut streams = Vec::with_capacity(count);
                    for _ in 0..count {
                        streams.push(reader.info()?);
                    }
                    if reader.remaining() != 0 {
                        for info in &mut streams {
                            info.commit_interval_ms = reader.u32()?;
                        }
                    }
                    Some(Frame::StreamList { request, streams })
                })(),
                "stream-list",
            ),
            kind::ACK => (
                (|| {
                    Some(Frame::Ack {
                        request: reader.u64()?,
                        stream: reader.u64()?,
                        version: reader.u64()?,
                        epoch: reader.u64()?,
                        level: match reader.u8()? {
                            0 => AckLevel::Memory,
                            1 => AckLevel::Synced,
                            _ => return None,
                        },
                        flags: reader.u8()?,
                        replicas: reader.u8()?,
                        echo: reader.rest().to_vec(),
                    })
                })(),
                "ack",
            ),
            kind::RECORDS => (
                (|| {
                    let request = reader.u64()?;
                    let next = reader.u64()?;
                    let count = reader.u32()?;
                    let records = reader.rest();
                    records_valid(records, count).then(|| Frame::Records {
                        request,
                        next,
                        count,
                        records: records.to_vec(),
                    })
                })(),
                "records",
            ),
            kind::DELIVER => (
                (|| {
                    let subscription = reader.u64()?;
                    let count = reader.u32()?;
                    let records = reader.rest();
                    records_valid(records, count).then(|| Frame::Deliver {
                        subscription,
                        count,
                        records: records.to_vec(),
                    })
                })(),
                "deliver",
            ),
            kind::ERROR => (
                (|| {
                    Some(Frame::Error {
                        request: reader.u64()?,
                        code: ErrorCode::from_u16(reader.u16()?)?,
                        message: reader.str16()?,
                    })
                })(),
                "error",
            ),
            kind::OK => (reader.u64().map(|request| Frame::Ok { request }), "ok"),
            kind::STATUS_REPLY => (
                (|| {
                    let request = reader.u64()?;
                    let length = reader.u32()? as usize;
                    let json = String::from_utf8(reader.take(length)?.to_vec()).ok()?;
                    Some(Frame::StatusReply { request, json })
                })(),
                "status-reply",
            ),
            other => return Err(FrameError::UnknownType(other)),
        };
        let frame = frame.ok_or(FrameError::Malformed(name))?;
        // Every layout but those ending in a "rest" field must consume its
        // whole body; trailing bytes mean the peer and we disagree.
        if reader.remaining() != 0 {
            return Err(FrameError::Malformed(name));
        }
        Ok(frame)
    }
}

/// Iterates over records packed back to back (the body of `Records` and
/// `Deliver`, already validated by the decoder).
pub fn iter_records(records: &[u8]) -> impl Iterator<Item = Record<'_>> {
    let mut offset = 0;
    std::iter::from_fn(move || {
        if offset >= records.len() {
            return None;
        }
        let (record, length) = Record::decode(&records[offset..]).ok()?;
        offset += length;
        Some(record)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{EventId, RecordHeader};

    fn samples() -> Vec<Frame> {
        let mut records = Vec::new();
        for version in 1..=3 {
            Record {
                header: RecordHeader {
                    flags: 0,
                    stream: 5,
                    version,
                    epoch: 1,
                    event: EventId {
                        client: 77,
                        session: 1,
                        sequence: version,
                    },
                    low_water: 1,
                },
                key: b"k",
                payload: b"hello",
            }
            .encode(&mut records);
        }
        let info = StreamInfo {
            id: 5,
            name: "orders".into(),
            durability: DurabilityConfig::Paged {
                pages: 2,
                page_size: 4096,
            },
            first_version: 1,
            last_version: 9,
            committed_version: 8,
            protocol: 5,
            epoch: 2,
            primary: 3,
            replicas: vec![
                ReplicaAddress {
                    id: 3,
                    address: "127.0.0.1:7400".into(),
                },
                ReplicaAddress {
                    id: 1,
                    address: "127.0.0.1:7401".into(),
                },
            ],
            commit_interval_ms: 0,
        };
        vec![
            Frame::CreateReplica {
                request: 9,
                info: info.clone(),
                retention: RetentionConfig::default(),
            },
            Frame::Submit {
                stream: 5,
                kind: SUBMIT_PLACED,
                version: 12,
                epoch: 2,
                session: 1,
                sequence: 44,
                low_water: 40,
                key: b"k".to_vec(),
                payload: b"payload".to_vec(),
            },
            Frame::PeerHello {
                version: PROTOCOL_VERSION,
                from: 2,
                incarnation: 7,
            },
            Frame::ControlHello {
                version: PROTOCOL_VERSION,
                from: 3,
            },
            Frame::SetRequirement {
                request: 9,
                name: "orders".into(),
                min_in_sync: 2,
                action: 2,
                block_ms: 1500,
                roles: vec!["east".into(), "ssd".into()],
            },
            Frame::RetireServer {
                request: 10,
                server: 4,
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Replicate {
                    count: 3,
                    records: records.clone(),
                },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Bind {
                    bindings: vec![WireBinding {
                        version: 4,
                        epoch: 1,
                        client: 77,
                        session: 1,
                        sequence: 9,
                        low_water: 3,
                        flags: 0,
                        crc: 0xdead_beef,
                    }],
                },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Progress { logged: 7, last: 8 },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Commit {
                    committed: 6,
                    last: 9,
                },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Need { from: 3, to: 8 },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Probe,
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Checkpoint {
                    through: 4_000,
                    state: b"engine state".to_vec(),
                },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Checkpoint {
                    through: 1,
                    state: Vec::new(),
                },
            },
            Frame::Peer {
                stream: 5,
                message: PeerMessage::Reack {
                    client: 77,
                    session: 1,
                    sequence: 2,
                    version: 2,
                },
            },
            Frame::Acked {
                stream: 5,
                server: 2,
                session: 1,
                sequence: 44,
                version: 12,
                epoch: 2,
                flags: ACKED_FLAG_DUPLICATE,
                hint: 1,
                more: 0,
            },
            Frame::Acked {
                stream: 5,
                server: 3,
                session: 1,
                sequence: 45,
                version: 13,
                epoch: 2,
                flags: 0,
                hint: 0,
                more: 699,
            },
            Frame::Stamped {
                stream: 5,
                session: 1,
                sequence: 44,
                version: 12,
                epoch: 2,
                flags: 0,
            },
            Frame::Checkpointed {
                stream: 5,
                version: 9_000,
                flags: CHECKPOINTED_FLAG_RESEND,
            },
            Frame::Refused {
                stream: 5,
                session: 1,
                sequence: 44,
                code: ErrorCode::VersionVoid,
                message: "voided".into(),
            },
            Frame::Hello {
                version: PROTOCOL_VERSION,
                client: u128::MAX - 3,
                token: "secret".into(),
            },
            Frame::CreateStream {
                request: 1,
                name: "orders".into(),
                durability: DurabilityConfig::Sync,
                protocol: 5,
                replicas: 3,
                commit_interval_ms: 0,
                retention: RetentionConfig::default(),
            },
            Frame::CreateStream {
                request: 1,
                name: "orders".into(),
                durability: DurabilityConfig::Sync,
                protocol: 5,
                replicas: 3,
                commit_interval_ms: 20,
                retention: RetentionConfig::default(),
            },
            Frame::CreateStream {
                request: 1,
                name: "orders".into(),
                durability: DurabilityConfig::Sender {
                    pages: 4,
                    page_size: 1 << 20,
                },
                protocol: 5,
                replicas: 3,
                commit_interval_ms: 0,
                retention: RetentionConfig {
                    bytes: 1 << 30,
                    ms: 0,
                },
            },
            Frame::CreateStream {
                request: 1,
                name: "orders".into(),
                durability: DurabilityConfig::Sync,
                protocol: 5,
                replicas: 3,
                commit_interval_ms: 0,
                retention: RetentionConfig {
                    bytes: 0,
                    ms: 86_400_000,
                },
            },
            Frame::DeleteStream {
                request: 2,
                name: "orders".into(),
            },
            Frame::ListStreams { request: 3 },
            Frame::OpenStream {
                request: 4,
                name: "x".into(),
            },
            Frame::Append {
                request: 5,
                stream: 5,
                flags: APPEND_FLAG_ECHO,
                session: 2,
                sequence: 3,
                low_water: 1,
                key: b"key".to_vec(),
                payload: vec![9; 100],
            },
            Frame::Fetch {
                request: 6,
                stream: 5,
                from: 1,
                max_records: 10,
                max_bytes: 1000,
            },
            Frame::Subscribe {
                subscription: 7,
                stream: 5,
                from: 2,
                credit: 64,
            },
            Frame::Credit {
                subscription: 7,
                credit: 3,
            },
            Frame::Unsubscribe { subscription: 7 },
            Frame::Status { request: 8 },
            Frame::HelloOk {
                version: 1,
                server: 99,
                max_frame: 1 << 20,
            },
            Frame::StreamInfo {
                request: 9,
                info: info.clone(),
            },
            Frame::StreamList {
                request: 10,
                streams: vec![info.clone(), info.clone()],
            },
            Frame::StreamList {
                request: 10,
                streams: vec![
                    StreamInfo {
                        commit_interval_ms: 160,
                        ..info.clone()
                    },
                    info.clone(),
                ],
            },
            Frame::StreamInfo {
                request: 9,
                info: StreamInfo {
                    commit_interval_ms: 50,
                    ..info.clone()
                },
            },
            Frame::CreateReplica {
                request: 9,
                info: StreamInfo {
                    commit_interval_ms: 5,
                    ..info.clone()
                },
                retention: RetentionConfig::default(),
            },
            Frame::CreateReplica {
                request: 9,
                info: StreamInfo {
                    commit_interval_ms: 0,
                    ..info
                },
                retention: RetentionConfig { bytes: 7, ms: 9 },
            },
            Frame::Ack {
                request: 11,
                stream: 5,
                version: 12,
                epoch: 1,
                level: AckLevel::Synced,
                flags: ACK_FLAG_DUPLICATE,
                replicas: 1,
                echo: vec![1, 2, 3],
            },
            Frame::Records {
                request: 12,
                next: 4,
                count: 3,
                records: records.clone(),
            },
            Frame::Deliver {
                subscription: 7,
                count: 3,
                records,
            },
            Frame::Error {
                request: 13,
                code: ErrorCode::UnknownStream,
                message: "no stream named x".into(),
            },
            Frame::Ok { request: 14 },
            Frame::StatusReply {
                request: 15,
                json: "{}".into(),
            },
        ]
    }

    #[test]
    fn submit_fields_encode_what_the_frame_encodes() {
        let fields = SubmitFields {
            stream: 5,
            kind: SUBMIT_PLACED,
            version: 12,
            epoch: 2,
            session: 1,
            sequence: 44,
            low_water: 40,
        };
        let mut direct = Vec::new();
        fields.encode(&mut direct, b"k", b"payload");
        let frame = Frame::Submit {
            stream: 5,
            kind: SUBMIT_PLACED,
            version: 12,
            epoch: 2,
            session: 1,
            sequence: 44,
            low_water: 40,
            key: b"k".to_vec(),
            payload: b"payload".to_vec(),
        };
        assert_eq!(direct, frame.to_bytes());
    }

    #[test]
    fn every_frame_round_trips() {
        for frame in samples() {
            let bytes = frame.to_bytes();
            let (decoded, used) = Frame::decode(&bytes, 1 << 20).unwrap().unwrap();
            assert_eq!(used, bytes.len());
            assert_eq!(decoded, frame);
        }
    }

    /// A client that predates the commit interval sends `CreateStream`
    /// without it: the body ends after `replicas`, and it reads as 0.
    #[test]
    fn a_create_stream_without_the_commit_interval_reads_as_zero() {
        let frame = |commit_interval_ms| Frame::CreateStream {
            request: 1,
            name: "orders".into(),
            durability: DurabilityConfig::Sync,
            protocol: 5,
            replicas: 3,
            commit_interval_ms,
            retention: RetentionConfig::default(),
        };
        let old_layout = frame(0).to_bytes();
        let body = old_layout.len() - FRAME_HEADER_LEN;
        assert_eq!(body, 8 + 2 + "orders".len() + 7 + 1 + 1);
        let (decoded, _) = Frame::decode(&old_layout, 1 << 20).unwrap().unwrap();
        assert_eq!(decoded, frame(0));
        let with_interval = frame(20).to_bytes();
        assert_eq!(with_interval.len(), old_layout.len() + 4);
        let (decoded, _) = Frame::decode(&with_interval, 1 << 20).unwrap().unwrap();
        assert_eq!(decoded, frame(20));
    }

    #[test]
    fn an_over_long_string_is_cut_on_a_character_boundary() {
        // Four-byte characters: 65,535 falls inside one.
        let message = "\u{1F600}".repeat(20_000);
        let bytes = Frame::Error {
            request: 1,
            code: ErrorCode::UnknownStream,
            message,
        }
        .to_bytes();
        let (decoded, _) = Frame::decode(&bytes, 1 << 20).unwrap().unwrap();
        let Frame::Error { message, .. } = decoded else {
            panic!("not an error frame");
        };
        assert_eq!(message.len(), 65_532);
    }

    #[test]
    fn a_partial_frame_asks_for_more_bytes() {
        for frame in samples() {
            let bytes = frame.to_bytes();
            for cut in 0..bytes.len() {
                assert_eq!(Frame::decode(&bytes[..cut], 1 << 20), Ok(None));
            }
        }
    }

    #[test]
    fn a_frame_over_the_limit_is_refused_before_its_body_arrives() {
        let bytes = Frame::Append {
            request: 1,
            stream: 1,
            flags: 0,
            session: 1,
            sequence: 1,
            low_water: 1,
            key: vec![],
            payload: vec![0; 2000],
        }
        .to_bytes();
        assert!(matches!(
            Frame::decode(&bytes[..FRAME_HEADER_LEN], 1000),
            Err(FrameError::TooLarge { .. })
        ));
    }

    #[test]
    fn damaged_frames_never_panic() {
        // A deterministic fuzz: flip, cut and extend every sample frame and
        // decode; errors are fine, panics are not.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for frame in samples() {
            let bytes = frame.to_bytes();
            for _ in 0..2000 {
                let mut damaged = bytes.clone();
                let flips = 1 + next() % 4;
                for _ in 0..flips {
                    let at = (next() as usize) % damaged.len();
                    damaged[at] ^= 1 << (next() % 8);
                }
                if next() % 3 == 0 {
                    let cut = (next() as usize) % damaged.len();
                    damaged.truncate(cut);
                }
                let _ = Frame::decode(&damaged, 1 << 16);
            }
        }
    }
}

/// Accumulates bytes from a stream socket and cuts them into frames, so the
/// async read loops of the server and the client stay a few lines each.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    bytes: Vec<u8>,
    start: usize,
}

impl FrameBuffer {
    pub fn new() -> Self {
        FrameBuffer::default()
    }

    /// Adds bytes read from the socket. Reading into a separate buffer and
    /// then calling this keeps a cancelled read from leaving junk behind.
    pub fn extend(&mut self, bytes: &[u8]) {
        if self.start == self.bytes.len() {
            self.bytes.clear();
            self.start = 0;
        } else if self.start > 64 * 1024 && self.start > self.bytes.len() / 2 {
            self.bytes.drain(..self.start);
            self.start = 0;
        }
        self.bytes.extend_from_slice(bytes);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self, max_frame: usize) -> Result<Option<Frame>, FrameError> {
        match Frame::decode(&self.bytes[self.start..], max_frame)? {
            Some((frame, used)) => {
                self.start += used;
                Ok(Some(frame))
            }
            None => Ok(None),
        }
    }

    /// Bytes received and not yet cut into frames.
    pub fn buffered(&self) -> usize {
        self.bytes.len() - self.start
    }
    /// Takes the bytes received and not yet cut into frames (a connection
    /// handed to another protocol after its first frame).
    pub fn take_rest(&mut self) -> Vec<u8> {
        let rest = self.bytes.split_off(self.start);
        self.bytes.clear();
        self.start = 0;
        rest
    }
}

#[cfg(test)]
mod frame_buffer_tests {
    use super::*;

    #[test]
    fn frames_split_across_reads_come_out_whole_and_in_order() {
        let mut wire = Vec::new();
        for request in 0..50u64 {
            Frame::Status { request }.encode(&mut wire);
            Frame::Ok { request }.encode(&mut wire);
        }
        let mut buffer = FrameBuffer::new();
        let mut frames = Vec::new();
        for piece in wire.chunks(7) {
            buffer.extend(piece);
            while let Some(frame) = buffer.next_frame(1024).unwrap() {
                frames.push(frame);
            }
        }
        assert_eq!(frames.len(), 100);
        assert_eq!(frames[99], Frame::Ok { request: 49 });
        assert_eq!(buffer.buffered(), 0);
    }
}
