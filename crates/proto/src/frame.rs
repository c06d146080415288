//! Frames of the client protocol: a 5-byte header (body length, type) and a
//! body whose layout depends on the type. `docs/wire-format.md` has the byte
//! tables; a decoder checks every length against the bytes present and the
//! frame size limit, so malformed input is an error, never a panic.

use crate::layout::{
    put_bytes32, put_frame, put_frame_head, Bytes32, Layout, Optional32, Reader, Rest, Str16,
    Str32, U128, U16, U32, U64, U8,
};
pub use crate::layout::{FrameError, FRAME_HEADER_LEN};
use crate::record::Record;
use bytes::{Bytes, BytesMut};

/// Version of the frame protocol spoken after the handshake.
pub const PROTOCOL_VERSION: u16 = 1;
/// The four bytes that open a client's `Hello`.
pub const HELLO_MAGIC: [u8; 4] = *b"STLG";
/// The four bytes that open a server's `PeerHello`.
pub const PEER_MAGIC: [u8; 4] = *b"STLP";
/// The four bytes that open a server's `ControlHello`.
pub const CONTROL_MAGIC: [u8; 4] = *b"STLC";
/// The four bytes that open a server's `ServerHello`.
pub const SERVER_MAGIC: [u8; 4] = *b"STLS";
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
/// Append flag: the acknowledgement carries the payload back (the logging
/// experiment's "reply of the same length").
pub const APPEND_FLAG_ECHO: u8 = 1;
/// `Append` flag: a server that is not the stream's primary answers
/// `NotPrimary` instead of forwarding the message to the primary.
pub const APPEND_FLAG_REDIRECT: u8 = 2;
/// Ack flag: the event id was already logged; the version is the original.
pub const ACK_FLAG_DUPLICATE: u8 = 1;
/// Ack flag: the message may repeat one logged before a failover.
pub const ACK_FLAG_POSSIBLE_DUPLICATE: u8 = 2;

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
    /// The connection's token lacks the right the request needs, is not
    /// known, or was revoked; or the request is one only a server may
    /// make. The message names the right.
    Unauthorized = 15,
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
            15 => Unauthorized,
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
    /// A replication message from a client: its fixed fields, the key and
    /// the payload (slices of the bytes received, when cut by a
    /// [`FrameBuffer`]).
    Submit {
        fields: SubmitFields,
        key: Bytes,
        payload: Bytes,
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
    /// The first frame of a client-style connection that a server opens
    /// to another (to create its replica of a stream, or to forward a
    /// client's appends as `client`): served as a client's, with a
    /// server's rights. With TLS the certificate must name server `from`.
    ServerHello {
        version: u16,
        from: u32,
        client: u128,
    },
    /// A replication message between servers for `stream`; its layout
    /// (a sub-kind byte and the sub-kind's fields) belongs to the server.
    /// The message is a slice of the bytes received, when cut by a
    /// [`FrameBuffer`].
    Peer {
        stream: u64,
        message: Bytes,
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

/// A stream's own retention at its creation; zeros leave the server's
/// defaults (`retain_bytes`, `retain_ms`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionConfig {
    /// Keep at least this many bytes of log.
    pub bytes: u64,
    /// Delete segments closed this many milliseconds ago.
    pub ms: u64,
}

/// The fixed fields of a `Submit` frame; a client encodes a whole frame
/// from them and a borrowed key and payload ([`SubmitFields::encode`]),
/// without copying the message into owned buffers first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubmitFields {
    pub stream: u64,
    /// One of the `SUBMIT_*` kinds, maybe with [`SUBMIT_FLAG_RESENT`].
    pub kind: u8,
    /// For `SUBMIT_PLACED` and `SUBMIT_CONFIRM`.
    pub version: u64,
    /// For `SUBMIT_PLACED`.
    pub epoch: u64,
    pub session: u64,
    pub sequence: u64,
    pub low_water: u64,
}

impl SubmitFields {
    /// Appends the whole frame, byte for byte what `Frame::Submit` encodes:
    /// the fields, the key after its length, the payload to the end.
    pub fn encode(&self, out: &mut Vec<u8>, key: &[u8], payload: &[u8]) {
        put_frame(out, SUBMIT, |out| {
            SubmitHead::put(self, out);
            put_bytes32(out, key);
            out.extend_from_slice(payload);
        });
    }

    /// Appends the frame [`SubmitFields::encode`] would, but for its last
    /// `payload_length` bytes: the payload, which the caller sends after
    /// these as they are.
    pub fn encode_head(&self, out: &mut Vec<u8>, key: &[u8], payload_length: usize) {
        put_frame_head(out, SUBMIT, payload_length, |out| {
            SubmitHead::put(self, out);
            put_bytes32(out, key);
        });
    }
}

/// Type code of `Submit` (see the table below).
const SUBMIT: u8 = 0x0C;
/// Type code of `Peer`.
const PEER: u8 = 0x0F;

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

// The layouts of the frames' own field types.

/// [`SubmitFields`] in order: stream, kind, version, epoch, session,
/// sequence, low water.
struct SubmitHead;

impl Layout<SubmitFields> for SubmitHead {
    fn put(head: &SubmitFields, out: &mut Vec<u8>) {
        U64::put(&head.stream, out);
        U8::put(&head.kind, out);
        for value in [head.version, head.epoch, head.session, head.sequence] {
            U64::put(&value, out);
        }
        U64::put(&head.low_water, out);
    }
    fn get(reader: &mut Reader<'_>) -> Option<SubmitFields> {
        Some(SubmitFields {
            stream: reader.u64()?,
            kind: reader.u8()?,
            version: reader.u64()?,
            epoch: reader.u64()?,
            session: reader.u64()?,
            sequence: reader.u64()?,
            low_water: reader.u64()?,
        })
    }
}

/// Mode u8 (0 memory, 1 sync, 2 paged, 3 sender), pages u16, page size u32.
struct Durability;

impl Layout<DurabilityConfig> for Durability {
    fn put(durability: &DurabilityConfig, out: &mut Vec<u8>) {
        let (mode, pages, page_size) = match *durability {
            DurabilityConfig::Memory => (0u8, 0u16, 0u32),
            DurabilityConfig::Sync => (1, 0, 0),
            DurabilityConfig::Paged { pages, page_size } => (2, pages, page_size),
            DurabilityConfig::Sender { pages, page_size } => (3, pages, page_size),
        };
        out.push(mode);
        out.extend_from_slice(&pages.to_le_bytes());
        out.extend_from_slice(&page_size.to_le_bytes());
    }
    fn get(reader: &mut Reader<'_>) -> Option<DurabilityConfig> {
        let mode = reader.u8()?;
        let pages = reader.u16()?;
        let page_size = reader.u32()?;
        match mode {
            0 => Some(DurabilityConfig::Memory),
            1 => Some(DurabilityConfig::Sync),
            2 => Some(DurabilityConfig::Paged { pages, page_size }),
            3 => Some(DurabilityConfig::Sender { pages, page_size }),
            _ => None,
        }
    }
}

/// An [`ErrorCode`] as u16.
struct Code;

impl Layout<ErrorCode> for Code {
    fn put(code: &ErrorCode, out: &mut Vec<u8>) {
        out.extend_from_slice(&(*code as u16).to_le_bytes());
    }
    fn get(reader: &mut Reader<'_>) -> Option<ErrorCode> {
        ErrorCode::from_u16(reader.u16()?)
    }
}

/// An [`AckLevel`] as u8.
struct Level;

impl Layout<AckLevel> for Level {
    fn put(level: &AckLevel, out: &mut Vec<u8>) {
        out.push(*level as u8);
    }
    fn get(reader: &mut Reader<'_>) -> Option<AckLevel> {
        match reader.u8()? {
            0 => Some(AckLevel::Memory),
            1 => Some(AckLevel::Synced),
            _ => None,
        }
    }
}

/// A [`StreamInfo`] without its commit interval, which each frame places
/// after its own layout (so peers that predate it read what they did).
struct Info;

impl Layout<StreamInfo> for Info {
    fn put(info: &StreamInfo, out: &mut Vec<u8>) {
        U64::put(&info.id, out);
        Str16::put(&info.name, out);
        Durability::put(&info.durability, out);
        for version in [
            info.first_version,
            info.last_version,
            info.committed_version,
        ] {
            U64::put(&version, out);
        }
        U8::put(&info.protocol, out);
        U64::put(&info.epoch, out);
        U32::put(&info.primary, out);
        out.push(info.replicas.len().min(255) as u8);
        for replica in info.replicas.iter().take(255) {
            U32::put(&replica.id, out);
            Str16::put(&replica.address, out);
        }
    }
    fn get(reader: &mut Reader<'_>) -> Option<StreamInfo> {
        let mut info = StreamInfo {
            id: reader.u64()?,
            name: Str16::get(reader)?,
            durability: Durability::get(reader)?,
            first_version: reader.u64()?,
            last_version: reader.u64()?,
            committed_version: reader.u64()?,
            protocol: reader.u8()?,
            epoch: reader.u64()?,
            primary: reader.u32()?,
            replicas: Vec::new(),
            commit_interval_ms: 0,
        };
        for _ in 0..reader.u8()? {
            info.replicas.push(ReplicaAddress {
                id: reader.u32()?,
                address: Str16::get(reader)?,
            });
        }
        Some(info)
    }
}

/// `StreamInfo`'s info: [`Info`], then its commit interval as an
/// [`Optional32`].
struct InfoInterval;

impl Layout<StreamInfo> for InfoInterval {
    fn put(info: &StreamInfo, out: &mut Vec<u8>) {
        Info::put(info, out);
        Optional32::put(&info.commit_interval_ms, out);
    }
    fn get(reader: &mut Reader<'_>) -> Option<StreamInfo> {
        let mut info = Info::get(reader)?;
        info.commit_interval_ms = Optional32::get(reader)?;
        Some(info)
    }
}

/// The optional tail of `CreateStream`: the commit interval (only when not
/// 0), then the retention, after an interval written in full, only when it
/// is not the default.
struct Tail;

impl Tail {
    fn put_parts((interval, retention): (&u32, &RetentionConfig), out: &mut Vec<u8>) {
        if *retention == RetentionConfig::default() {
            Optional32::put(interval, out);
        } else {
            U32::put(interval, out);
            U64::put(&retention.bytes, out);
            U64::put(&retention.ms, out);
        }
    }
}

impl Layout<(u32, RetentionConfig)> for Tail {
    fn put((interval, retention): &(u32, RetentionConfig), out: &mut Vec<u8>) {
        Tail::put_parts((interval, retention), out);
    }
    fn get(reader: &mut Reader<'_>) -> Option<(u32, RetentionConfig)> {
        let interval = Optional32::get(reader)?;
        if reader.remaining() == 0 {
            return Some((interval, RetentionConfig::default()));
        }
        let retention = RetentionConfig {
            bytes: reader.u64()?,
            ms: reader.u64()?,
        };
        Some((interval, retention))
    }
}

/// `CreateReplica`'s stream and retention: [`Info`], then the [`Tail`] of
/// its commit interval and the retention.
struct ReplicaTail;

impl ReplicaTail {
    fn put_parts((info, retention): (&StreamInfo, &RetentionConfig), out: &mut Vec<u8>) {
        Info::put(info, out);
        Tail::put_parts((&info.commit_interval_ms, retention), out);
    }
}

impl Layout<(StreamInfo, RetentionConfig)> for ReplicaTail {
    fn put((info, retention): &(StreamInfo, RetentionConfig), out: &mut Vec<u8>) {
        ReplicaTail::put_parts((info, retention), out);
    }
    fn get(reader: &mut Reader<'_>) -> Option<(StreamInfo, RetentionConfig)> {
        let mut info = Info::get(reader)?;
        let (interval, retention) = Tail::get(reader)?;
        info.commit_interval_ms = interval;
        Some((info, retention))
    }
}

/// A u32 count of [`Info`]s, then, only when one is set, every stream's
/// commit interval as a u32 after the whole list.
struct InfoList;

impl Layout<Vec<StreamInfo>> for InfoList {
    fn put(streams: &Vec<StreamInfo>, out: &mut Vec<u8>) {
        U32::put(&(streams.len() as u32), out);
        for info in streams {
            Info::put(info, out);
        }
        if streams.iter().any(|info| info.commit_interval_ms != 0) {
            for info in streams {
                U32::put(&info.commit_interval_ms, out);
            }
        }
    }
    fn get(reader: &mut Reader<'_>) -> Option<Vec<StreamInfo>> {
        let count = reader.u32()? as usize;
        // Each entry takes at least 41 bytes; refuse counts the body cannot
        // hold before allocating for them.
        if count > reader.remaining() / 41 {
            return None;
        }
        let mut streams = Vec::with_capacity(count);
        for _ in 0..count {
            streams.push(Info::get(reader)?);
        }
        if reader.remaining() != 0 {
            for info in &mut streams {
                info.commit_interval_ms = reader.u32()?;
            }
        }
        Some(streams)
    }
}

/// A u16 count of [`Str16`] strings.
struct Roles;

impl Layout<Vec<String>> for Roles {
    fn put(roles: &Vec<String>, out: &mut Vec<u8>) {
        U16::put(&(roles.len().min(usize::from(u16::MAX)) as u16), out);
        for role in roles.iter().take(usize::from(u16::MAX)) {
            Str16::put(role, out);
        }
    }
    fn get(reader: &mut Reader<'_>) -> Option<Vec<String>> {
        let count = reader.u16()?;
        let mut roles = Vec::with_capacity(usize::from(count).min(64));
        for _ in 0..count {
            roles.push(Str16::get(reader)?);
        }
        Some(roles)
    }
}

/// A u32 count, then that many records back to back to the body's end,
/// each checked (length and checksum) when read.
struct Records;

impl Records {
    fn put_parts((count, records): (&u32, &Vec<u8>), out: &mut Vec<u8>) {
        U32::put(count, out);
        out.extend_from_slice(records);
    }
}

impl Layout<(u32, Vec<u8>)> for Records {
    fn put((count, records): &(u32, Vec<u8>), out: &mut Vec<u8>) {
        Records::put_parts((count, records), out);
    }
    fn get(reader: &mut Reader<'_>) -> Option<(u32, Vec<u8>)> {
        let count = reader.u32()?;
        let records = reader.rest();
        records_valid(records, count).then(|| (count, records.to_vec()))
    }
}

crate::layouts! {
    Frame: put_body, get_body, KINDS;
    Hello = 0x01, "hello", magic HELLO_MAGIC { version: U16, client: U128, token: Str16 }
    CreateStream = 0x02, "create-stream" {
        request: U64, name: Str16, durability: Durability, protocol: U8, replicas: U8,
        (commit_interval_ms, retention): Tail,
    }
    DeleteStream = 0x03, "delete-stream" { request: U64, name: Str16 }
    ListStreams = 0x04, "list-streams" { request: U64 }
    OpenStream = 0x05, "open-stream" { request: U64, name: Str16 }
    Append = 0x06, "append" {
        request: U64, stream: U64, flags: U8, session: U64, sequence: U64, low_water: U64,
        key: Bytes32, payload: Rest,
    }
    Fetch = 0x07, "fetch" {
        request: U64, stream: U64, from: U64, max_records: U32, max_bytes: U32,
    }
    Subscribe = 0x08, "subscribe" { subscription: U64, stream: U64, from: U64, credit: U32 }
    Credit = 0x09, "credit" { subscription: U64, credit: U32 }
    Unsubscribe = 0x0A, "unsubscribe" { subscription: U64 }
    Status = 0x0B, "status" { request: U64 }
    Submit = 0x0C, "submit" { fields: SubmitHead, key: Bytes32, payload: Rest }
    CreateReplica = 0x0D, "create-replica" { request: U64, (info, retention): ReplicaTail }
    PeerHello = 0x0E, "peer-hello", magic PEER_MAGIC { version: U16, from: U32, incarnation: U64 }
    Peer = 0x0F, "peer" { stream: U64, message: Rest }
    ControlHello = 0x10, "control-hello", magic CONTROL_MAGIC { version: U16, from: U32 }
    SetRequirement = 0x11, "set-requirement" {
        request: U64, name: Str16, min_in_sync: U16, action: U8, block_ms: U32, roles: Roles,
    }
    RetireServer = 0x12, "retire-server" { request: U64, server: U32 }
    ServerHello = 0x13, "server-hello", magic SERVER_MAGIC { version: U16, from: U32, client: U128 }
    HelloOk = 0x81, "hello-ok" { version: U16, server: U128, max_frame: U32 }
    StreamInfo = 0x82, "stream-info" { request: U64, info: InfoInterval }
    StreamList = 0x83, "stream-list" { request: U64, streams: InfoList }
    Ack = 0x84, "ack" {
        request: U64, stream: U64, version: U64, epoch: U64, level: Level, flags: U8,
        replicas: U8, echo: Rest,
    }
    Records = 0x85, "records" { request: U64, next: U64, (count, records): Records }
    Deliver = 0x86, "deliver" { subscription: U64, (count, records): Records }
    Error = 0x87, "error" { request: U64, code: Code, message: Str16 }
    Ok = 0x88, "ok" { request: U64 }
    StatusReply = 0x89, "status-reply" { request: U64, json: Str32 }
    Acked = 0x8A, "acked" {
        stream: U64, server: U32, session: U64, sequence: U64, version: U64, epoch: U64,
        flags: U8, hint: U8, more: Optional32,
    }
    Stamped = 0x8B, "stamped" {
        stream: U64, session: U64, sequence: U64, version: U64, epoch: U64, flags: U8,
    }
    Refused = 0x8C, "refused" {
        stream: U64, session: U64, sequence: U64, code: Code, message: Str16,
    }
    Checkpointed = 0x8D, "checkpointed" { stream: U64, version: U64, flags: U8 }
}

impl Frame {
    /// Appends the encoded frame (header and body) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER_LEN]);
        let frame_type = put_body(self, out);
        // The table holds every variant (a test checks it); a variant
        // without a layout would be a build that cannot speak.
        assert!(frame_type.is_some(), "frame without a layout: {self:?}");
        let body_length = (out.len() - start - FRAME_HEADER_LEN) as u32;
        out[start..start + 4].copy_from_slice(&body_length.to_le_bytes());
        out[start + 4] = frame_type.unwrap_or_default();
    }

    /// Encodes into a fresh buffer.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode(&mut out);
        out
    }

    /// Appends a `Peer` frame for `stream` whose message `message` writes
    /// (the replication messages' layouts belong to the server), without
    /// building the message's bytes apart first.
    pub fn encode_peer(out: &mut Vec<u8>, stream: u64, message: impl FnOnce(&mut Vec<u8>)) {
        Frame::encode_peer_head(out, stream, 0, message);
    }

    /// [`Frame::encode_peer`] for a message whose last `tail` bytes the
    /// caller sends after these as they are (records, not copied).
    pub fn encode_peer_head(
        out: &mut Vec<u8>,
        stream: u64,
        tail: usize,
        message: impl FnOnce(&mut Vec<u8>),
    ) {
        put_frame_head(out, PEER, tail, |out| {
            U64::put(&stream, out);
            message(out);
        });
    }

    /// Decodes one frame from the start of `bytes`. `Ok(None)` means more
    /// bytes are needed; the `usize` is the number of bytes consumed. Its
    /// byte fields are copied out of `bytes`.
    pub fn decode(bytes: &[u8], max_frame: usize) -> Result<Option<(Frame, usize)>, FrameError> {
        let Some((frame_type, length)) = Frame::whole(bytes, max_frame)? else {
            return Ok(None);
        };
        let frame = Frame::decode_body(
            frame_type,
            &mut Reader::new(&bytes[FRAME_HEADER_LEN..length]),
        )?;
        Ok(Some((frame, length)))
    }

    /// The type and whole length (header and body) of the frame at the
    /// start of `bytes`, once all of it is there.
    fn whole(bytes: &[u8], max_frame: usize) -> Result<Option<(u8, usize)>, FrameError> {
        let mut header = Reader::new(bytes);
        let (Some(body_length), Some(frame_type)) = (header.u32(), header.u8()) else {
            return Ok(None);
        };
        let body_length = body_length as usize;
        if body_length > max_frame {
            return Err(FrameError::TooLarge {
                length: body_length,
                limit: max_frame,
            });
        }
        let length = FRAME_HEADER_LEN + body_length;
        Ok((bytes.len() >= length).then_some((frame_type, length)))
    }

    fn decode_body(frame_type: u8, body: &mut Reader<'_>) -> Result<Frame, FrameError> {
        get_body(frame_type, body).unwrap_or(Err(FrameError::UnknownType(frame_type)))
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

/// Fields of a `Submit`, for tests and the fuzzers' seeds.
pub fn sample_fields() -> SubmitFields {
    SubmitFields {
        stream: 5,
        kind: SUBMIT_PLACED,
        version: 12,
        epoch: 2,
        session: 1,
        sequence: 44,
        low_water: 40,
    }
}

/// At least one frame of every type in the table, with typical fields:
/// what the tests round-trip and the fuzzers start from.
pub fn sample_frames() -> Vec<Frame> {
    let info = sample_info();
    let records = sample_records();
    let mut frames = sample_server_frames(&info);
    frames.extend(sample_server_answers());
    frames.extend(sample_creates());
    frames.extend(sample_requests());
    frames.extend(sample_infos(&info));
    frames.extend(sample_answers(records));
    frames
}

/// Three records of stream 5, end to end.
fn sample_records() -> Vec<u8> {
    use crate::record::{EventId, RecordHeader};
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
    records
}

/// A stream of three replicas.
fn sample_info() -> StreamInfo {
    StreamInfo {
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
    }
}

fn sample_server_frames(info: &StreamInfo) -> Vec<Frame> {
    vec![
        Frame::CreateReplica {
            request: 9,
            info: info.clone(),
            retention: RetentionConfig::default(),
        },
        Frame::Submit {
            fields: sample_fields(),
            key: Bytes::from_static(b"k"),
            payload: Bytes::from_static(b"payload"),
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
        Frame::ServerHello {
            version: PROTOCOL_VERSION,
            from: 2,
            client: 77,
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
        // The server's table lays out the message; here it is bytes.
        Frame::Peer {
            stream: 5,
            message: Bytes::from(vec![3, 7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0]),
        },
    ]
}

fn sample_server_answers() -> Vec<Frame> {
    vec![
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
    ]
}

fn sample_creates() -> Vec<Frame> {
    vec![
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
    ]
}

fn sample_requests() -> Vec<Frame> {
    vec![
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
    ]
}

fn sample_infos(info: &StreamInfo) -> Vec<Frame> {
    vec![
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
                ..info.clone()
            },
            retention: RetentionConfig { bytes: 7, ms: 9 },
        },
    ]
}

fn sample_answers(records: Vec<u8>) -> Vec<Frame> {
    vec![
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn submit_fields_encode_what_the_frame_encodes() {
        let fields = sample_fields();
        let mut direct = Vec::new();
        fields.encode(&mut direct, b"k", b"payload");
        let frame = Frame::Submit {
            fields,
            key: Bytes::from_static(b"k"),
            payload: Bytes::from_static(b"payload"),
        };
        assert_eq!(direct, frame.to_bytes());
    }

    #[test]
    fn the_samples_hold_every_frame_type_of_the_table() {
        let sampled: Vec<u8> = sample_frames()
            .iter()
            .map(|frame| frame.to_bytes()[4])
            .collect();
        for (code, name) in KINDS {
            assert!(sampled.contains(code), "no sample of {name} ({code:#04x})");
        }
    }

    #[test]
    fn every_frame_round_trips() {
        for frame in sample_frames() {
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
        for frame in sample_frames() {
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

    /// A handshake with another magic is `BadMagic`, a body with a byte
    /// left over or cut short is malformed, an unknown type is named.
    #[test]
    fn bad_magic_leftovers_and_unknown_types_are_told_apart() {
        let hello = Frame::Hello {
            version: PROTOCOL_VERSION,
            client: 1,
            token: String::new(),
        };
        let mut bytes = hello.to_bytes();
        bytes[FRAME_HEADER_LEN] = b'X';
        assert_eq!(Frame::decode(&bytes, 1 << 20), Err(FrameError::BadMagic));
        let mut longer = Frame::Ok { request: 1 }.to_bytes();
        longer.push(0);
        longer[0] += 1;
        assert_eq!(
            Frame::decode(&longer, 1 << 20),
            Err(FrameError::Malformed("ok"))
        );
        let mut shorter = Frame::Ok { request: 1 }.to_bytes();
        shorter.pop();
        shorter[0] -= 1;
        assert_eq!(
            Frame::decode(&shorter, 1 << 20),
            Err(FrameError::Malformed("ok"))
        );
        let mut unknown = Frame::Ok { request: 1 }.to_bytes();
        unknown[4] = 0x7F;
        assert_eq!(
            Frame::decode(&unknown, 1 << 20),
            Err(FrameError::UnknownType(0x7F))
        );
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
        for frame in sample_frames() {
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
/// The bytes sit in a shared buffer: a frame is cut off it whole, and its
/// byte fields kept as `Bytes` (a `Submit`'s key and payload, a `Peer`
/// frame's message) are slices of it, not copies.
///
/// A thread that reads with blocking calls ([`FrameBuffer::read_from`])
/// reads straight into the buffer too, into room zeroed once when made
/// (a safe read needs initialised bytes) and reused for as long as it
/// lasts: `bytes` then ends in `spare` such bytes, not yet received.
#[derive(Debug, Default)]
pub struct FrameBuffer {
    bytes: BytesMut,
    spare: usize,
}

impl FrameBuffer {
    pub fn new() -> Self {
        FrameBuffer::default()
    }

    /// Adds bytes read from the socket. Reading into a separate buffer and
    /// then calling this keeps a cancelled read from leaving junk behind.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.drop_spare();
        self.bytes.extend_from_slice(bytes);
    }

    /// The bytes received and not yet cut into frames, to read more onto
    /// the end of (what `extend` appends to): a read straight into it
    /// saves copying every byte out of a scratch buffer. The read must
    /// leave it as it was when cancelled (tokio's `read_buf` does: it
    /// appends only what a completed read returned). Room made for the
    /// read reuses the space of the frames already cut, unless a slice of
    /// one is still kept.
    pub fn receiving(&mut self) -> &mut BytesMut {
        self.drop_spare();
        &mut self.bytes
    }

    /// Reads once from `reader` (a blocking socket) onto the end of the
    /// bytes received, with room for at least half of `room` bytes: no
    /// scratch buffer, so no copy out of one. Room runs out every `room /
    /// 2` bytes or so, and is then made again, `room` bytes zeroed once
    /// (the cost of a `memset` per byte read, not of a copy). An
    /// interrupted read is tried again.
    pub fn read_from(
        &mut self,
        reader: &mut impl std::io::Read,
        room: usize,
    ) -> std::io::Result<usize> {
        let room = room.max(2);
        if self.spare < room / 2 {
            self.drop_spare();
            self.bytes.reserve(room);
            let received = self.bytes.len();
            self.bytes.resize(received + room, 0);
            self.spare = room;
        }
        let start = self.bytes.len() - self.spare;
        let read = loop {
            match reader.read(&mut self.bytes[start..]) {
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        self.spare -= read;
        Ok(read)
    }

    /// The bytes received, without the room past them.
    fn received(&self) -> &[u8] {
        &self.bytes[..self.bytes.len() - self.spare]
    }

    /// Gives up the room [`read_from`](Self::read_from) made, so that the
    /// buffer ends where the bytes received end.
    fn drop_spare(&mut self) {
        if self.spare > 0 {
            let received = self.bytes.len() - self.spare;
            self.bytes.truncate(received);
            self.spare = 0;
        }
    }

    /// Cuts the next whole frame, if the buffer holds one, as
    /// [`Frame::decode`] decodes it, but with its `Bytes` fields slices of
    /// the buffer.
    pub fn next_frame(&mut self, max_frame: usize) -> Result<Option<Frame>, FrameError> {
        let Some((frame_type, length)) = Frame::whole(self.received(), max_frame)? else {
            return Ok(None);
        };
        let frame = self.bytes.split_to(length).freeze();
        let mut body = Reader::shared(&frame);
        body.take(FRAME_HEADER_LEN);
        Frame::decode_body(frame_type, &mut body).map(Some)
    }

    /// Bytes received and not yet cut into frames.
    pub fn buffered(&self) -> usize {
        self.received().len()
    }
    /// Takes the bytes received and not yet cut into frames (a connection
    /// handed to another protocol after its first frame).
    pub fn take_rest(&mut self) -> Vec<u8> {
        self.drop_spare();
        self.bytes.split().to_vec()
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

    /// A reader that hands out its bytes at most `piece` at a time, as a
    /// socket may.
    struct Pieces<'a> {
        bytes: &'a [u8],
        piece: usize,
    }

    impl std::io::Read for Pieces<'_> {
        fn read(&mut self, into: &mut [u8]) -> std::io::Result<usize> {
            let length = self.piece.min(into.len()).min(self.bytes.len());
            into[..length].copy_from_slice(&self.bytes[..length]);
            self.bytes = &self.bytes[length..];
            Ok(length)
        }
    }

    /// Blocking reads into the buffer's own room cut the same frames as
    /// `decode` at every read size and room, frames that span a remaking
    /// of the room included, and the room never shows as bytes received.
    #[test]
    fn reads_from_a_blocking_reader_cut_the_frames_decode_gives() {
        let frames = sample_frames();
        let wire: Vec<u8> = frames.iter().flat_map(Frame::to_bytes).collect();
        for (piece, room) in [
            (1, 16),
            (7, 64),
            (64, 100),
            (4096, 4096),
            (1 << 20, 1 << 16),
        ] {
            let mut reader = Pieces {
                bytes: &wire,
                piece,
            };
            let mut buffer = FrameBuffer::new();
            let mut cut = Vec::new();
            loop {
                while let Some(frame) = buffer.next_frame(1 << 16).unwrap() {
                    cut.push(frame);
                }
                let before = buffer.buffered();
                let read = buffer.read_from(&mut reader, room).unwrap();
                assert_eq!(buffer.buffered(), before + read);
                if read == 0 {
                    break;
                }
            }
            assert_eq!(cut, frames, "pieces of {piece} bytes, room {room}");
            assert_eq!(buffer.buffered(), 0);
        }
    }

    /// A buffer read by blocking reads and then by the async way (or
    /// extended) keeps its bytes in order, without its room between them.
    #[test]
    fn a_buffer_read_both_ways_keeps_its_bytes_in_order() {
        let wire: Vec<u8> = [Frame::Status { request: 1 }, Frame::Ok { request: 2 }]
            .iter()
            .flat_map(Frame::to_bytes)
            .collect();
        let (first, second) = wire.split_at(5);
        let mut buffer = FrameBuffer::new();
        let read = buffer
            .read_from(
                &mut Pieces {
                    bytes: first,
                    piece: 5,
                },
                1024,
            )
            .unwrap();
        assert_eq!((read, buffer.buffered()), (5, 5));
        buffer.receiving().extend_from_slice(&second[..3]);
        buffer.extend(&second[3..]);
        assert_eq!(
            buffer.next_frame(1024).unwrap(),
            Some(Frame::Status { request: 1 })
        );
        assert_eq!(
            buffer.next_frame(1024).unwrap(),
            Some(Frame::Ok { request: 2 })
        );
        assert_eq!(buffer.buffered(), 0);
        buffer
            .read_from(
                &mut Pieces {
                    bytes: &wire[..3],
                    piece: 3,
                },
                1024,
            )
            .unwrap();
        assert_eq!(buffer.take_rest(), wire[..3].to_vec());
    }

    #[test]
    fn every_frame_cut_from_the_buffer_is_what_decode_gives_at_every_read_size() {
        let frames = sample_frames();
        let wire: Vec<u8> = frames.iter().flat_map(Frame::to_bytes).collect();
        for piece_length in [1, 7, 64, 4096] {
            let mut buffer = FrameBuffer::new();
            let mut cut = Vec::new();
            for piece in wire.chunks(piece_length) {
                buffer.receiving().extend_from_slice(piece);
                while let Some(frame) = buffer.next_frame(1 << 16).unwrap() {
                    cut.push(frame);
                }
            }
            assert_eq!(cut, frames, "pieces of {piece_length} bytes");
            assert_eq!(buffer.buffered(), 0);
        }
    }

    #[test]
    fn a_submits_key_and_payload_and_a_peer_message_are_slices_of_the_buffer() {
        let submit = Frame::Submit {
            fields: sample_fields(),
            key: Bytes::from_static(b"key"),
            payload: Bytes::from(vec![9; 500]),
        };
        let peer = Frame::Peer {
            stream: 3,
            message: Bytes::from(vec![4; 300]),
        };
        let mut buffer = FrameBuffer::new();
        buffer.extend(&submit.to_bytes());
        buffer.extend(&peer.to_bytes());
        let read = buffer.bytes.as_ptr_range();
        let within = |part: &Bytes| read.contains(&part.as_ptr());
        let Some(Frame::Submit { key, payload, .. }) = buffer.next_frame(1024).unwrap() else {
            panic!("a submit is whole");
        };
        assert!(within(&key) && within(&payload));
        assert_eq!((&key[..], &payload[..]), (&b"key"[..], &[9; 500][..]));
        let Some(Frame::Peer { stream, message }) = buffer.next_frame(1024).unwrap() else {
            panic!("a peer frame is whole");
        };
        assert!(within(&message));
        assert_eq!((stream, &message[..]), (3, &[4; 300][..]));
        // `Frame::decode` copies them.
        let (Frame::Peer { message, .. }, _) =
            Frame::decode(&peer.to_bytes(), 1024).unwrap().unwrap()
        else {
            panic!("a peer frame decodes");
        };
        assert!(!within(&message));
    }

    #[test]
    fn a_frame_too_large_or_malformed_is_refused_as_decode_refuses_it() {
        let large = Frame::Peer {
            stream: 1,
            message: Bytes::from(vec![0; 100]),
        }
        .to_bytes();
        let mut short = Vec::new();
        short.extend_from_slice(&4u32.to_le_bytes());
        short.push(PEER);
        short.extend_from_slice(&[0; 4]);
        for (wire, max) in [(large, 50), (short, 1024)] {
            let mut buffer = FrameBuffer::new();
            buffer.extend(&wire);
            let refused = buffer.next_frame(max).unwrap_err();
            assert_eq!(refused, Frame::decode(&wire, max).unwrap_err());
        }
    }

    #[test]
    fn a_message_cut_as_a_slice_keeps_its_bytes_while_the_buffer_reads_on() {
        let mut buffer = FrameBuffer::new();
        let first = Frame::Peer {
            stream: 7,
            message: Bytes::from(vec![0xAB; 1000]),
        };
        buffer.extend(&first.to_bytes());
        // Half of the next frame is already here when the first is cut.
        let second = Frame::Peer {
            stream: 8,
            message: Bytes::from(vec![0xCD; 200_000]),
        }
        .to_bytes();
        buffer.extend(&second[..100]);
        let Some(Frame::Peer { stream, message }) = buffer.next_frame(1 << 20).unwrap() else {
            panic!("the first peer frame is whole");
        };
        for piece in second[100..].chunks(65_536) {
            buffer.receiving().reserve(65_536);
            buffer.receiving().extend_from_slice(piece);
        }
        assert_eq!((stream, &message[..]), (7, &[0xAB; 1000][..]));
        let Some(Frame::Peer { stream, message }) = buffer.next_frame(1 << 20).unwrap() else {
            panic!("the second peer frame is whole");
        };
        assert_eq!(stream, 8);
        assert!(message.len() == 200_000 && message.iter().all(|&b| b == 0xCD));
    }
}
