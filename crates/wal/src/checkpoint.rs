//! Checkpoint files: what a restart needs so it does not scan the log it
//! covers. A checkpoint of one stream's log names the version it covers
//! (`through`), the segment table of the covered part (so a restart needs
//! neither to scan nor to open the covered segments), and an opaque blob:
//! the state the application rebuilt from the records up to `through`.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `STLGCKP\0` |
//! | 8 | 4 | checkpoint format version (2; 1 is still read) |
//! | 12 | 4 | CRC32C of every byte from 16 to the end of the file |
//! | 16 | 8 | stream id |
//! | 24 | 8 | through: every version up to it is covered |
//! | 32 | 8 | written at, milliseconds since the Unix epoch (the caller's clock) |
//! | 40 | 4 | segment count S |
//! | 44 | 4 | reserved, 0 |
//! | 48 | … | S segment entries, then the blob |
//!
//! A segment entry of format 2 is 32 bytes: base (u64), last version
//! (u64), length in bytes up to the end of its last covered record (u64),
//! sealed at (u64 ms, 0 while the segment was still the log's last). The
//! blob is a u64 length and its bytes.
//!
//! Format 1 had, after sealed at, an index count I (u32), a reserved u32
//! and I (version u64, offset u64) pairs of the segment's sparse index.
//! It is still decoded (its index is checked, then dropped: the log
//! rebuilds a segment's index when it first reads the segment), so a
//! checkpoint written before format 2 still recovers the log.
//!
//! A checkpoint file is named `checkpoint-<through, 20 digits>.ckpt`, so
//! names sort in version order. It is written with
//! [`crate::storage::write_atomically`] (temporary file, sync, rename,
//! folder sync), and the log keeps the newest two: a damaged newest one
//! leaves the one before it to recover from.

use crate::FormatError;
use std::path::{Path, PathBuf};

use crate::storage::{self, Storage};

pub const CHECKPOINT_MAGIC: [u8; 8] = *b"STLGCKP\0";
/// The format this crate writes.
pub const CHECKPOINT_FORMAT_VERSION: u32 = 2;
/// The first format, with each segment's sparse index; still read.
pub const CHECKPOINT_FORMAT_VERSION_1: u32 = 1;
const MAGIC_SIZE: usize = 8;
const FORMAT_OFFSET: usize = MAGIC_SIZE;
const CHECKSUM_OFFSET: usize = FORMAT_OFFSET + 4;
const STREAM_OFFSET: usize = CHECKSUM_OFFSET + 4;
const THROUGH_OFFSET: usize = STREAM_OFFSET + 8;
const WRITTEN_AT_OFFSET: usize = THROUGH_OFFSET + 8;
const SEGMENT_COUNT_OFFSET: usize = WRITTEN_AT_OFFSET + 8;
/// Size of the fixed part; the segment entries start here.
pub const CHECKPOINT_HEADER_LEN: usize = SEGMENT_COUNT_OFFSET + 8;
/// Size of a segment entry of format 2.
const SEGMENT_ENTRY_LEN: usize = 32;
/// Size of a segment entry of format 1 without its index pairs.
const SEGMENT_ENTRY_V1_LEN: usize = 40;
const INDEX_ENTRY_LEN: usize = 16;
/// Checkpoint files a log keeps: the newest, and the one before it in case
/// the newest is damaged.
pub const CHECKPOINTS_KEPT: usize = 2;
/// The largest checkpoint file a log reads, so a damaged length field
/// cannot make it allocate without limit.
pub const CHECKPOINT_BYTES_MAX: u64 = 1 << 32;

const PREFIX: &str = "checkpoint-";
const EXTENSION: &str = ".ckpt";

/// One covered segment as a checkpoint records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSegment {
    pub base: u64,
    /// The segment's last covered version.
    pub last_version: u64,
    /// Bytes from the start of the file to the end of `last_version`'s
    /// record.
    pub length: u64,
    /// When a checkpoint first saw the segment closed (ms since the Unix
    /// epoch), or 0 while it was the log's last segment. Age retention
    /// counts from here: no later than the segment's last write, so a
    /// segment is never deleted early.
    pub sealed_at_ms: u64,
}

/// A decoded checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub stream: u64,
    pub through: u64,
    pub written_at_ms: u64,
    /// The segments holding versions up to `through`, chained in version
    /// order; the last one ends with `through`.
    pub segments: Vec<CheckpointSegment>,
    /// The application's state after the records up to `through`.
    pub blob: Vec<u8>,
}

pub fn checkpoint_name(through: u64) -> String {
    format!("{PREFIX}{through:020}{EXTENSION}")
}

pub fn checkpoint_path(folder: &Path, through: u64) -> PathBuf {
    folder.join(checkpoint_name(through))
}

/// The version a checkpoint file name stands for, or `None` for a name that
/// is not a checkpoint's.
pub fn parse_checkpoint_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(PREFIX)?.strip_suffix(EXTENSION)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&through| through > 0)
}

impl Checkpoint {
    /// The checkpoint in the current format.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_format(CHECKPOINT_FORMAT_VERSION, &[])
    }

    /// The checkpoint in format 1, as writers before format 2 wrote it,
    /// with `index[i]` as the sparse index of segment `i` (none when
    /// `index` is shorter). For tests that older checkpoints still read.
    pub fn encode_format_1(&self, index: &[Vec<(u64, u64)>]) -> Vec<u8> {
        self.encode_format(CHECKPOINT_FORMAT_VERSION_1, index)
    }

    fn encode_format(&self, format: u32, index: &[Vec<(u64, u64)>]) -> Vec<u8> {
        let entry_len = match format {
            CHECKPOINT_FORMAT_VERSION_1 => SEGMENT_ENTRY_V1_LEN,
            _ => SEGMENT_ENTRY_LEN,
        };
        let index_entries: usize = index.iter().map(Vec::len).sum();
        let mut bytes = Vec::with_capacity(
            CHECKPOINT_HEADER_LEN
                + self.segments.len() * entry_len
                + index_entries * INDEX_ENTRY_LEN
                + 8
                + self.blob.len(),
        );
        bytes.extend_from_slice(&CHECKPOINT_MAGIC);
        bytes.extend_from_slice(&format.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&self.stream.to_le_bytes());
        bytes.extend_from_slice(&self.through.to_le_bytes());
        bytes.extend_from_slice(&self.written_at_ms.to_le_bytes());
        let count = u32::try_from(self.segments.len()).expect("segment count fits in u32");
        bytes.extend_from_slice(&count.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        debug_assert_eq!(bytes.len(), CHECKPOINT_HEADER_LEN);
        for (position, segment) in self.segments.iter().enumerate() {
            for value in [
                segment.base,
                segment.last_version,
                segment.length,
                segment.sealed_at_ms,
            ] {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            if format == CHECKPOINT_FORMAT_VERSION_1 {
                let pairs = index.get(position).map_or(&[][..], Vec::as_slice);
                let count = u32::try_from(pairs.len()).expect("index count fits in u32");
                bytes.extend_from_slice(&count.to_le_bytes());
                bytes.extend_from_slice(&[0; 4]);
                for &(version, offset) in pairs {
                    bytes.extend_from_slice(&version.to_le_bytes());
                    bytes.extend_from_slice(&offset.to_le_bytes());
                }
            }
        }
        bytes.extend_from_slice(&(self.blob.len() as u64).to_le_bytes());
        bytes.extend_from_slice(&self.blob);
        let checksum = crc32c::crc32c(&bytes[STREAM_OFFSET..]);
        bytes[CHECKSUM_OFFSET..STREAM_OFFSET].copy_from_slice(&checksum.to_le_bytes());
        // Assert right after encoding, as before any write: what goes to
        // disk must read back.
        assert!(
            Checkpoint::decode(&bytes, self.stream).is_ok(),
            "an encoded checkpoint decodes"
        );
        bytes
    }

    /// Decodes and checks a checkpoint of `stream`; the error says what is
    /// wrong. Never panics, whatever the bytes.
    pub fn decode(bytes: &[u8], stream: u64) -> Result<Checkpoint, FormatError> {
        if bytes.len() < CHECKPOINT_HEADER_LEN {
            return Err(FormatError::Cut {
                what: "checkpoint",
                length: bytes.len(),
            });
        }
        if bytes[..MAGIC_SIZE] != CHECKPOINT_MAGIC {
            return Err(FormatError::BadMagic { what: "checkpoint" });
        }
        let mut reader = Reader {
            bytes,
            at: FORMAT_OFFSET,
        };
        let format = reader.u32()?;
        if format != CHECKPOINT_FORMAT_VERSION && format != CHECKPOINT_FORMAT_VERSION_1 {
            return Err(FormatError::UnsupportedVersion {
                what: "checkpoint",
                version: format,
            });
        }
        let stored = reader.u32()?;
        let computed = crc32c::crc32c(&bytes[STREAM_OFFSET..]);
        if stored != computed {
            return Err(FormatError::Checksum {
                what: "checkpoint",
                stored,
                computed,
            });
        }
        let found_stream = reader.u64()?;
        if found_stream != stream {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint belongs to stream {found_stream}, not {stream}"
            )));
        }
        let through = reader.u64()?;
        let written_at_ms = reader.u64()?;
        let count = reader.u32()? as usize;
        reader.u32()?;
        let entry_len = match format {
            CHECKPOINT_FORMAT_VERSION_1 => SEGMENT_ENTRY_V1_LEN,
            _ => SEGMENT_ENTRY_LEN,
        };
        if count == 0 || count > reader.remaining() / entry_len {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint names {count} segments"
            )));
        }
        let mut segments: Vec<CheckpointSegment> = Vec::with_capacity(count);
        for _ in 0..count {
            let segment = reader.segment(format)?;
            let expected_base = segments.last().map_or(segment.base, |s| s.last_version + 1);
            if segment.base != expected_base {
                return Err(FormatError::Inconsistent(format!(
                    "checkpoint segment based at {} where {expected_base} belongs",
                    segment.base
                )));
            }
            segments.push(segment);
        }
        let last = segments.last().expect("count > 0").last_version;
        if last != through || through == 0 {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint through {through} but its segments end at {last}"
            )));
        }
        let blob_length = reader.u64()?;
        if blob_length != reader.remaining() as u64 {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint blob of {blob_length} bytes where {} remain",
                reader.remaining()
            )));
        }
        Ok(Checkpoint {
            stream,
            through,
            written_at_ms,
            segments,
            blob: bytes[reader.at..].to_vec(),
        })
    }
}

/// Reads little-endian values, failing at the end rather than panicking.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let slice = self
            .bytes
            .get(self.at..self.at + N)
            .ok_or(FormatError::Cut {
                what: "checkpoint",
                length: self.bytes.len(),
            })?;
        self.at += N;
        Ok(slice.try_into().expect("N bytes"))
    }

    fn u32(&mut self) -> Result<u32, FormatError> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Result<u64, FormatError> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn segment(&mut self, format: u32) -> Result<CheckpointSegment, FormatError> {
        let base = self.u64()?;
        let last_version = self.u64()?;
        let length = self.u64()?;
        let sealed_at_ms = self.u64()?;
        if base == 0 || last_version < base {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint segment based at {base} ends at {last_version}"
            )));
        }
        let header = crate::segment::SEGMENT_HEADER_LEN as u64;
        let records = last_version - base + 1;
        // Every record takes at least a record header.
        let least = records
            .checked_mul(proto::RECORD_HEADER_LEN as u64)
            .and_then(|bytes| bytes.checked_add(header));
        if least.is_none_or(|least| length < least) {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint segment {base} of {length} bytes cannot hold {records} records"
            )));
        }
        if format == CHECKPOINT_FORMAT_VERSION_1 {
            self.index_v1(base, last_version, length)?;
        }
        Ok(CheckpointSegment {
            base,
            last_version,
            length,
            sealed_at_ms,
        })
    }

    /// Checks and skips a format 1 segment's sparse index: the log no
    /// longer keeps an index of covered segments before it reads them.
    fn index_v1(&mut self, base: u64, last_version: u64, length: u64) -> Result<(), FormatError> {
        let count = self.u32()? as usize;
        self.u32()?;
        if count > self.remaining() / INDEX_ENTRY_LEN {
            return Err(FormatError::Inconsistent(format!(
                "checkpoint segment {base} names {count} index entries"
            )));
        }
        let header = crate::segment::SEGMENT_HEADER_LEN as u64;
        let mut previous: Option<(u64, u64)> = None;
        for _ in 0..count {
            let version = self.u64()?;
            let offset = self.u64()?;
            let ascending = previous.is_none_or(|(v, o)| version > v && offset > o);
            if !ascending || !(base..=last_version).contains(&version) {
                return Err(FormatError::Inconsistent(format!(
                    "checkpoint segment {base}: index entry ({version}, {offset}) out of order"
                )));
            }
            if !(header..length).contains(&offset) {
                return Err(FormatError::Inconsistent(format!(
                    "checkpoint segment {base}: index offset {offset} outside the segment"
                )));
            }
            previous = Some((version, offset));
        }
        Ok(())
    }
}

/// The checkpoint files in `folder`: their versions, newest first.
pub(crate) fn list(storage: &dyn Storage, folder: &Path) -> std::io::Result<Vec<u64>> {
    Ok(versions_named(&storage.list(folder)?))
}

/// The versions of the checkpoint files among `names`, newest first.
fn versions_named(names: &[String]) -> Vec<u64> {
    let mut versions: Vec<u64> = names
        .iter()
        .filter_map(|name| parse_checkpoint_name(name))
        .collect();
    versions.sort_unstable_by(|a, b| b.cmp(a));
    versions
}

/// What loading the checkpoints of a log found.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Valid checkpoints, newest first.
    pub checkpoints: Vec<Checkpoint>,
    /// Files that could not be used, each with the reason.
    pub ignored: Vec<(PathBuf, FormatError)>,
}

/// Reads every checkpoint file in `folder`. A damaged one (cut, bit
/// flipped, another stream's) is ignored and reported, never fatal: the
/// log itself is the truth, the checkpoint only a shortcut.
pub fn load(storage: &dyn Storage, folder: &Path, stream: u64) -> std::io::Result<Loaded> {
    if !storage.exists(folder) {
        return Ok(Loaded::default());
    }
    load_listed(storage, folder, stream, &storage.list(folder)?)
}

/// [`load`], given the names in `folder` (which exists).
pub(crate) fn load_listed(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    names: &[String],
) -> std::io::Result<Loaded> {
    Ok(load_versions(
        storage,
        folder,
        stream,
        &versions_named(names),
        false,
    ))
}

/// Reads the checkpoint files of `versions` (newest first) in `folder`.
/// With `skip_missing`, a file that is not there is left out silently
/// (the manifest names checkpoints that may since have been removed).
pub(crate) fn load_versions(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    versions: &[u64],
    skip_missing: bool,
) -> Loaded {
    let mut loaded = Loaded::default();
    for &through in versions {
        let path = checkpoint_path(folder, through);
        let read = storage.open(&path, false).and_then(|file| {
            let length = file.len()?;
            if length > CHECKPOINT_BYTES_MAX {
                return Err(std::io::Error::other(format!(
                    "{length} bytes is more than a checkpoint may hold"
                )));
            }
            let mut bytes = vec![0; length as usize];
            file.read_exact_at(&mut bytes, 0)?;
            Ok(bytes)
        });
        let decoded = match read {
            Ok(bytes) => Checkpoint::decode(&bytes, stream),
            Err(error) if skip_missing && error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => Err(FormatError::Read(error.to_string())),
        };
        match decoded {
            Ok(checkpoint) if checkpoint.through == through => {
                loaded.checkpoints.push(checkpoint);
            }
            Ok(checkpoint) => loaded.ignored.push((
                path,
                FormatError::Inconsistent(format!(
                    "it covers version {} but is named for {through}",
                    checkpoint.through
                )),
            )),
            Err(reason) => loaded.ignored.push((path, reason)),
        }
    }
    loaded
}

/// Writes `checkpoint` atomically, then removes every other checkpoint
/// file not in `keep` (and temporary files a crash left), and syncs the
/// folder. Returns the file's size.
pub(crate) fn write(
    storage: &dyn Storage,
    folder: &Path,
    checkpoint: &Checkpoint,
    keep: &[u64],
) -> std::io::Result<u64> {
    let path = checkpoint_path(folder, checkpoint.through);
    let bytes = checkpoint.encode();
    storage::write_atomically(storage, &path, &bytes)?;
    if prune(storage, folder, keep)? {
        storage.sync_dir(folder)?;
    }
    Ok(bytes.len() as u64)
}

/// Removes checkpoint files except those in `keep`.
fn prune(
    storage: &dyn crate::Storage,
    folder: &std::path::Path,
    keep: &[u64],
) -> std::io::Result<bool> {
    let mut removed = false;
    for name in storage.list(folder)? {
        let stray = name
            .strip_suffix(".tmp")
            .and_then(parse_checkpoint_name)
            .is_some();
        let old = parse_checkpoint_name(&name).is_some_and(|v| !keep.contains(&v));
        if stray || old {
            storage.remove_file(&folder.join(&name))?;
            removed = true;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            stream: 9,
            through: 20,
            written_at_ms: 1_700_000_000_000,
            segments: vec![
                CheckpointSegment {
                    base: 1,
                    last_version: 10,
                    length: 32 + 10 * 100,
                    sealed_at_ms: 1_699_999_999_000,
                },
                CheckpointSegment {
                    base: 11,
                    last_version: 20,
                    length: 32 + 10 * 90,
                    sealed_at_ms: 0,
                },
            ],
            blob: b"engine state".to_vec(),
        }
    }

    #[test]
    fn checkpoint_names_sort_in_version_order_and_parse_back() {
        assert_eq!(checkpoint_name(42), "checkpoint-00000000000000000042.ckpt");
        assert_eq!(parse_checkpoint_name(&checkpoint_name(42)), Some(42));
        assert_eq!(parse_checkpoint_name(&checkpoint_name(0)), None);
        assert_eq!(parse_checkpoint_name("checkpoint-42.ckpt"), None);
        assert_eq!(
            parse_checkpoint_name("checkpoint-00000000000000000042.ckpt.tmp"),
            None
        );
        assert!(checkpoint_name(9) < checkpoint_name(10));
    }

    #[test]
    fn a_checkpoint_decodes_to_what_was_encoded() {
        let checkpoint = sample();
        let bytes = checkpoint.encode();
        assert_eq!(Checkpoint::decode(&bytes, 9), Ok(checkpoint));
        assert!(Checkpoint::decode(&bytes, 8).is_err(), "another stream's");
    }

    fn sample_index() -> Vec<Vec<(u64, u64)>> {
        vec![vec![(1, 32), (6, 532)], vec![(11, 32)]]
    }

    #[test]
    fn a_checkpoint_is_written_in_format_2_with_32_bytes_a_segment() {
        let checkpoint = sample();
        let bytes = checkpoint.encode();
        assert_eq!(bytes[8..12], 2u32.to_le_bytes());
        let blob = 8 + checkpoint.blob.len();
        assert_eq!(bytes.len(), CHECKPOINT_HEADER_LEN + 2 * 32 + blob);
    }

    #[test]
    fn a_format_1_checkpoint_with_its_index_still_decodes() {
        let checkpoint = sample();
        let bytes = checkpoint.encode_format_1(&sample_index());
        assert_eq!(bytes[8..12], 1u32.to_le_bytes());
        let blob = 8 + checkpoint.blob.len();
        assert_eq!(bytes.len(), CHECKPOINT_HEADER_LEN + 2 * 40 + 3 * 16 + blob);
        assert_eq!(Checkpoint::decode(&bytes, 9), Ok(checkpoint.clone()));
        // Its index is still checked.
        let bad: Vec<Vec<(u64, u64)>> = vec![vec![(1, 32), (6, 5000)], vec![]];
        let mut bytes = checkpoint.encode_format_1(&[]);
        let good_len = bytes.len();
        bytes = {
            // Encode the bad index by hand: encoding asserts a good one.
            let mut out = bytes[..CHECKPOINT_HEADER_LEN].to_vec();
            for (segment, pairs) in checkpoint.segments.iter().zip(&bad) {
                for value in [
                    segment.base,
                    segment.last_version,
                    segment.length,
                    segment.sealed_at_ms,
                ] {
                    out.extend_from_slice(&value.to_le_bytes());
                }
                out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
                out.extend_from_slice(&[0; 4]);
                for &(version, offset) in pairs {
                    out.extend_from_slice(&version.to_le_bytes());
                    out.extend_from_slice(&offset.to_le_bytes());
                }
            }
            out.extend_from_slice(&bytes[good_len - blob..]);
            let checksum = crc32c::crc32c(&out[STREAM_OFFSET..]);
            out[CHECKSUM_OFFSET..STREAM_OFFSET].copy_from_slice(&checksum.to_le_bytes());
            out
        };
        let refused = Checkpoint::decode(&bytes, 9);
        assert!(
            refused
                .as_ref()
                .is_err_and(|reason| reason.to_string().contains("outside the segment")),
            "{refused:?}"
        );
        let mut future = checkpoint.encode();
        future[8..12].copy_from_slice(&3u32.to_le_bytes());
        assert!(Checkpoint::decode(&future, 9).is_err(), "an unknown format");
    }

    #[test]
    fn every_flipped_bit_and_every_cut_is_refused() {
        for bytes in [sample().encode(), sample().encode_format_1(&sample_index())] {
            for bit in 0..bytes.len() * 8 {
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                assert!(Checkpoint::decode(&damaged, 9).is_err(), "bit {bit}");
            }
            for cut in 0..bytes.len() {
                assert!(Checkpoint::decode(&bytes[..cut], 9).is_err(), "cut {cut}");
            }
        }
    }

    #[test]
    fn random_bytes_never_panic_the_decoder() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let valid = sample().encode();
        let valid_1 = sample().encode_format_1(&sample_index());
        for round in 0..20_000 {
            let mut bytes = if round % 4 == 0 {
                valid_1.clone()
            } else if round % 2 == 0 {
                valid.clone()
            } else {
                (0..(next() % 400) as usize).map(|_| next() as u8).collect()
            };
            for _ in 0..(next() % 6) {
                if !bytes.is_empty() {
                    let at = (next() % bytes.len() as u64) as usize;
                    bytes[at] = next() as u8;
                }
            }
            // With its checksum fixed, garbage reaches the field checks.
            if bytes.len() >= CHECKPOINT_HEADER_LEN && round % 3 == 0 {
                bytes[..MAGIC_SIZE].copy_from_slice(&CHECKPOINT_MAGIC);
                let format = 1 + (round / 3 % 2) as u32;
                bytes[FORMAT_OFFSET..CHECKSUM_OFFSET].copy_from_slice(&format.to_le_bytes());
                bytes[STREAM_OFFSET..THROUGH_OFFSET].copy_from_slice(&9u64.to_le_bytes());
                let checksum = crc32c::crc32c(&bytes[STREAM_OFFSET..]);
                bytes[CHECKSUM_OFFSET..STREAM_OFFSET].copy_from_slice(&checksum.to_le_bytes());
            }
            let _ = Checkpoint::decode(&bytes, 9);
        }
    }
}
