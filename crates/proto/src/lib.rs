//! stamplog's byte formats: the record (one header for the log and the wire)
//! and the frames of the client protocol. No I/O, no async.
//!
//! `docs/log-format.md` and `docs/wire-format.md` describe the same layouts
//! as byte tables; the offsets here are derived from field sizes so the two
//! can be checked against each other.

pub mod frame;
pub mod layout;
mod random;
mod reader;
pub mod record;

pub use frame::{
    AckLevel, DurabilityConfig, ErrorCode, Frame, FrameBuffer, FrameError, ReplicaAddress,
    RetentionConfig, StreamInfo, SubmitFields, UnknownDurability, CONTROL_MAGIC, FRAME_HEADER_LEN,
    PROTOCOL_VERSION, SERVER_MAGIC,
};
pub use layout::{Layout, Reader};
pub use random::{random_u128, Rng};
pub use record::{
    EventId, Record, RecordError, RecordHeader, FLAG_POSSIBLE_DUPLICATE, FLAG_VOID,
    RECORD_HEADER_LEN,
};
