//! The record: one message as the log stores it and as readers receive it.
//!
//! The same bytes serve the disk and the network: a replica or a reader gets
//! exactly what the primary logged, checksum included, so a record is
//! verified where it is written and again wherever it is read.
//!
//! Layout (little-endian), `docs/log-format.md` has the byte table:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 4 | checksum: CRC32C of bytes 4..length |
//! | 4 | 4 | length: header + key + payload |
//! | 8 | 1 | kind (1 = message) |
//! | 9 | 1 | record format version (1) |
//! | 10 | 2 | flags |
//! | 12 | 4 | key length |
//! | 16 | 8 | stream id |
//! | 24 | 8 | version |
//! | 32 | 8 | epoch |
//! | 40 | 16 | client id |
//! | 56 | 8 | session |
//! | 64 | 8 | sequence |
//! | 72 | 8 | low-water mark of the session when sent |
//! | 80 | .. | key, then payload |

use crate::reader::Reader;

const CHECKSUM_SIZE: usize = 4;
const LENGTH_SIZE: usize = 4;
const KIND_OFFSET: usize = CHECKSUM_SIZE + LENGTH_SIZE;
const FORMAT_OFFSET: usize = KIND_OFFSET + 1;
const FLAGS_OFFSET: usize = FORMAT_OFFSET + 1;
const KEY_LENGTH_OFFSET: usize = FLAGS_OFFSET + 2;
const STREAM_OFFSET: usize = KEY_LENGTH_OFFSET + 4;
const VERSION_OFFSET: usize = STREAM_OFFSET + 8;
const EPOCH_OFFSET: usize = VERSION_OFFSET + 8;
const CLIENT_OFFSET: usize = EPOCH_OFFSET + 8;
const SESSION_OFFSET: usize = CLIENT_OFFSET + 16;
const SEQUENCE_OFFSET: usize = SESSION_OFFSET + 8;
const LOW_WATER_OFFSET: usize = SEQUENCE_OFFSET + 8;

/// Size of the fixed record header in bytes.
pub const RECORD_HEADER_LEN: usize = LOW_WATER_OFFSET + 8;

/// Record kind: an ordinary message.
pub const KIND_MESSAGE: u8 = 1;
/// The record layout described above.
pub const RECORD_FORMAT_VERSION: u8 = 1;
/// Flag: the record may repeat one logged before a failover.
pub const FLAG_POSSIBLE_DUPLICATE: u16 = 1;
/// Flag: the version holds no message. The primary wrote it to resolve a
/// version it handed out whose message never came (`version-request`);
/// every replica stores the same void record and readers skip it. Its event
/// id is client 0, session 0, sequence = version (client 0 is reserved).
pub const FLAG_VOID: u16 = 2;

/// The largest record this format can describe; the server's own limit
/// (`max_message_bytes`) is far below it.
pub const RECORD_LEN_MAX: usize = 256 * 1024 * 1024;

/// A client-chosen identity of one message: retries carry the same one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId {
    /// 128 random bits per client process unless configured.
    pub client: u128,
    /// The client's thread or logical producer.
    pub session: u64,
    /// Increases by one per message in the session, starting at 1.
    pub sequence: u64,
}

/// The fixed part of a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub flags: u16,
    pub stream: u64,
    pub version: u64,
    pub epoch: u64,
    pub event: EventId,
    /// The session's low-water mark when the message was sent: every
    /// sequence below it has been answered and its dedupe entry may retire.
    pub low_water: u64,
}

/// A decoded record borrowing its key and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record<'a> {
    pub header: RecordHeader,
    pub key: &'a [u8],
    pub payload: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    /// Fewer bytes than the record needs: at the end of a log this is a torn
    /// write, on the wire it is a malformed frame.
    #[error("record truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("record length {0} is out of range")]
    BadLength(u32),
    #[error("record checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("unknown record kind {kind} or format version {format}")]
    UnknownKind { kind: u8, format: u8 },
    #[error("record key length {key} exceeds the record body {body}")]
    BadKeyLength { key: u32, body: usize },
}

impl<'a> Record<'a> {
    /// Length of the encoded record.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_LEN + self.key.len() + self.payload.len()
    }

    /// Appends the encoded record to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(self.encoded_len());
        self.put_head(out);
        out.extend_from_slice(self.payload);
        let checksum = crc32c::crc32c(&out[start + CHECKSUM_SIZE..]);
        out[start..start + CHECKSUM_SIZE].copy_from_slice(&checksum.to_le_bytes());
    }

    /// Appends the record's head to `out`: its fixed header and key, the
    /// checksum covering the payload as well, which is not written. The
    /// record is that head followed by the payload's own bytes, wherever
    /// they are (a large payload sent or stored as it came, not copied).
    pub fn encode_head(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(RECORD_HEADER_LEN + self.key.len());
        self.put_head(out);
        let checksum = crc32c::crc32c(&out[start + CHECKSUM_SIZE..]);
        let checksum = crc32c::crc32c_append(checksum, self.payload);
        out[start..start + CHECKSUM_SIZE].copy_from_slice(&checksum.to_le_bytes());
    }

    /// The header and key, the checksum left zero.
    fn put_head(&self, out: &mut Vec<u8>) {
        let length = self.encoded_len();
        assert!(length <= RECORD_LEN_MAX, "record of {length} bytes");
        let start = out.len();
        out.extend_from_slice(&[0; CHECKSUM_SIZE]);
        out.extend_from_slice(&(length as u32).to_le_bytes());
        out.push(KIND_MESSAGE);
        out.push(RECORD_FORMAT_VERSION);
        out.extend_from_slice(&self.header.flags.to_le_bytes());
        out.extend_from_slice(&(self.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.header.stream.to_le_bytes());
        out.extend_from_slice(&self.header.version.to_le_bytes());
        out.extend_from_slice(&self.header.epoch.to_le_bytes());
        out.extend_from_slice(&self.header.event.client.to_le_bytes());
        out.extend_from_slice(&self.header.event.session.to_le_bytes());
        out.extend_from_slice(&self.header.event.sequence.to_le_bytes());
        out.extend_from_slice(&self.header.low_water.to_le_bytes());
        debug_assert_eq!(out.len() - start, RECORD_HEADER_LEN);
        out.extend_from_slice(self.key);
    }

    /// The total length a record claims, read from its first 8 bytes, or
    /// `None` when fewer than 8 bytes are given.
    pub fn peek_len(bytes: &[u8]) -> Option<usize> {
        let raw = bytes.get(CHECKSUM_SIZE..KIND_OFFSET)?;
        Some(u32::from_le_bytes(raw.try_into().expect("4 bytes")) as usize)
    }

    /// The stream and version a record's header names, read from their
    /// fields without decoding the rest, or `None` when the header is cut.
    pub fn peek_stream_version(bytes: &[u8]) -> Option<(u64, u64)> {
        let field = |at: usize| {
            let raw = bytes.get(at..at + 8)?;
            Some(u64::from_le_bytes(raw.try_into().expect("8 bytes")))
        };
        Some((field(STREAM_OFFSET)?, field(VERSION_OFFSET)?))
    }

    /// Decodes and verifies one record at the start of `bytes`; returns it
    /// and its encoded length.
    pub fn decode(bytes: &'a [u8]) -> Result<(Record<'a>, usize), RecordError> {
        Self::decode_with(bytes, true)
    }

    /// As [`Record::decode`] without the checksum, for bytes whose checksum
    /// was verified a moment ago (a frame's records, checked when the frame
    /// was decoded). Every length is still checked.
    pub fn decode_verified(bytes: &'a [u8]) -> Result<(Record<'a>, usize), RecordError> {
        Self::decode_with(bytes, false)
    }

    fn decode_with(bytes: &'a [u8], verify: bool) -> Result<(Record<'a>, usize), RecordError> {
        if bytes.len() < RECORD_HEADER_LEN {
            return Err(RecordError::Truncated {
                needed: RECORD_HEADER_LEN,
                available: bytes.len(),
            });
        }
        let length = Self::peek_len(bytes).expect("header present");
        if !(RECORD_HEADER_LEN..=RECORD_LEN_MAX).contains(&length) {
            return Err(RecordError::BadLength(length as u32));
        }
        if bytes.len() < length {
            return Err(RecordError::Truncated {
                needed: length,
                available: bytes.len(),
            });
        }
        let bytes = &bytes[..length];
        let mut reader = Reader::new(bytes);
        let stored = reader.u32().expect("checked length");
        if verify {
            let computed = crc32c::crc32c(&bytes[CHECKSUM_SIZE..]);
            if stored != computed {
                return Err(RecordError::Checksum { stored, computed });
            }
        }
        let _length = reader.u32().expect("checked length");
        let kind = reader.u8().expect("checked length");
        let format = reader.u8().expect("checked length");
        if kind != KIND_MESSAGE || format != RECORD_FORMAT_VERSION {
            return Err(RecordError::UnknownKind { kind, format });
        }
        let flags = reader.u16().expect("checked length");
        let key_length = reader.u32().expect("checked length");
        let header = RecordHeader {
            flags,
            stream: reader.u64().expect("checked length"),
            version: reader.u64().expect("checked length"),
            epoch: reader.u64().expect("checked length"),
            event: EventId {
                client: reader.u128().expect("checked length"),
                session: reader.u64().expect("checked length"),
                sequence: reader.u64().expect("checked length"),
            },
            low_water: reader.u64().expect("checked length"),
        };
        let body = reader.remaining();
        if key_length as usize > body {
            return Err(RecordError::BadKeyLength {
                key: key_length,
                body,
            });
        }
        let key = reader
            .take(key_length as usize)
            .expect("checked key length");
        let payload = reader.rest();
        Ok((
            Record {
                header,
                key,
                payload,
            },
            length,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (RecordHeader, Vec<u8>, Vec<u8>) {
        let header = RecordHeader {
            flags: FLAG_POSSIBLE_DUPLICATE,
            stream: 7,
            version: 42,
            epoch: 3,
            event: EventId {
                client: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
                session: 9,
                sequence: 11,
            },
            low_water: 10,
        };
        (header, b"key".to_vec(), b"payload bytes".to_vec())
    }

    #[test]
    fn record_round_trips_through_its_encoding() {
        let (header, key, payload) = sample();
        let record = Record {
            header,
            key: &key,
            payload: &payload,
        };
        let mut bytes = Vec::new();
        record.encode(&mut bytes);
        assert_eq!(bytes.len(), RECORD_HEADER_LEN + 3 + 13);
        let (decoded, used) = Record::decode(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(decoded, record);
    }

    #[test]
    fn a_head_followed_by_its_payload_is_the_whole_record() {
        let (header, key, payload) = sample();
        let record = Record {
            header,
            key: &key,
            payload: &payload,
        };
        let mut whole = Vec::new();
        record.encode(&mut whole);
        let mut head = vec![0xaa];
        record.encode_head(&mut head);
        assert_eq!(head.len(), 1 + RECORD_HEADER_LEN + key.len());
        head.extend_from_slice(&payload);
        assert_eq!(&head[1..], &whole[..]);
        assert_eq!(Record::decode(&head[1..]).unwrap().0, record);
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let (header, key, payload) = sample();
        let mut bytes = Vec::new();
        Record {
            header,
            key: &key,
            payload: &payload,
        }
        .encode(&mut bytes);
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(Record::decode(&damaged).is_err(), "bit {bit} not detected");
        }
    }

    #[test]
    fn every_truncation_is_reported_as_truncated() {
        let (header, key, payload) = sample();
        let mut bytes = Vec::new();
        Record {
            header,
            key: &key,
            payload: &payload,
        }
        .encode(&mut bytes);
        for cut in 0..bytes.len() {
            match Record::decode(&bytes[..cut]) {
                Err(RecordError::Truncated { .. }) => {}
                other => panic!("cut at {cut}: {other:?}"),
            }
        }
    }
}
