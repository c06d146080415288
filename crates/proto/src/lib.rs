//! stamplog's byte formats: the record (one header for the log and the wire)
//! and the frames of the client protocol. No I/O, no async.
//!
//! `docs/log-format.md` and `docs/wire-format.md` describe the same layouts
//! as byte tables; the offsets here are derived from field sizes so the two
//! can be checked against each other.

pub mod frame;
mod random;
pub mod record;

pub use frame::{
    AckLevel, DurabilityConfig, ErrorCode, Frame, FrameBuffer, FrameError, PeerMessage,
    ReplicaAddress, RetentionConfig, StreamInfo, UnknownDurability, WireBinding, CONTROL_MAGIC,
    FRAME_HEADER_LEN, PROTOCOL_VERSION,
};
pub use random::{random_u128, Rng};
pub use record::{
    EventId, Record, RecordError, RecordHeader, FLAG_POSSIBLE_DUPLICATE, FLAG_VOID,
    RECORD_HEADER_LEN,
};

/// Little-endian cursor over a byte slice; every read is bounds-checked, so
/// malformed input becomes an error, never a panic.
pub(crate) struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Reader { bytes, position: 0 }
    }

    pub(crate) fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let end = self.position.checked_add(count)?;
        let slice = self.bytes.get(self.position..end)?;
        self.position = end;
        Some(slice)
    }

    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub(crate) fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    pub(crate) fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    pub(crate) fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    pub(crate) fn u128(&mut self) -> Option<u128> {
        self.take(16)
            .map(|b| u128::from_le_bytes(b.try_into().expect("16 bytes")))
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    pub(crate) fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.position..];
        self.position = self.bytes.len();
        rest
    }
}
