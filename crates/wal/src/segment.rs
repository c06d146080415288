//! Segment files: a 32-byte header, then records back to back.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `STLGSEG\0` |
//! | 8 | 4 | segment format version (1) |
//! | 12 | 4 | CRC32C of bytes 16..32 |
//! | 16 | 8 | stream id |
//! | 24 | 8 | base version: the version of the segment's first record |
//!
//! A segment is named after its base version, zero-padded to 20 digits,
//! with the extension `.seg`, so names sort in version order.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{io_error, LogError};
use crate::storage::{Storage, StorageFile};
use crate::FormatError;

pub const SEGMENT_MAGIC: [u8; 8] = *b"STLGSEG\0";
pub const SEGMENT_FORMAT_VERSION: u32 = 1;
const MAGIC_SIZE: usize = 8;
const FORMAT_OFFSET: usize = MAGIC_SIZE;
const CHECKSUM_OFFSET: usize = FORMAT_OFFSET + 4;
const STREAM_OFFSET: usize = CHECKSUM_OFFSET + 4;
const BASE_OFFSET: usize = STREAM_OFFSET + 8;
/// Size of a segment header in bytes; the first record starts here.
pub const SEGMENT_HEADER_LEN: usize = BASE_OFFSET + 8;
const SEGMENT_EXTENSION: &str = ".seg";

pub fn segment_name(base_version: u64) -> String {
    format!("{base_version:020}{SEGMENT_EXTENSION}")
}

pub fn segment_path(folder: &Path, base_version: u64) -> PathBuf {
    folder.join(segment_name(base_version))
}

/// The base version a segment file name stands for, or `None` for a name
/// that is not a segment's.
pub fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(SEGMENT_EXTENSION)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Versions start at 1; a segment based at 0 is no segment of ours.
    digits.parse().ok().filter(|&base| base > 0)
}

pub fn encode_header(stream: u64, base_version: u64) -> [u8; SEGMENT_HEADER_LEN] {
    let mut header = [0u8; SEGMENT_HEADER_LEN];
    header[..MAGIC_SIZE].copy_from_slice(&SEGMENT_MAGIC);
    header[FORMAT_OFFSET..CHECKSUM_OFFSET].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
    header[STREAM_OFFSET..BASE_OFFSET].copy_from_slice(&stream.to_le_bytes());
    header[BASE_OFFSET..].copy_from_slice(&base_version.to_le_bytes());
    let checksum = crc32c::crc32c(&header[STREAM_OFFSET..]);
    header[CHECKSUM_OFFSET..STREAM_OFFSET].copy_from_slice(&checksum.to_le_bytes());
    header
}

/// Checks a header; returns a reason when it is not the header of
/// `stream`'s segment based at `base_version`.
pub fn check_header(bytes: &[u8], stream: u64, base_version: u64) -> Result<(), FormatError> {
    if bytes.len() < SEGMENT_HEADER_LEN {
        return Err(FormatError::Cut {
            what: "segment header",
            length: bytes.len(),
        });
    }
    if bytes[..MAGIC_SIZE] != SEGMENT_MAGIC {
        return Err(FormatError::BadMagic { what: "segment" });
    }
    let read_u32 = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
    let read_u64 = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let format = read_u32(FORMAT_OFFSET);
    if format != SEGMENT_FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion {
            what: "segment",
            version: format,
        });
    }
    let stored = read_u32(CHECKSUM_OFFSET);
    let computed = crc32c::crc32c(&bytes[STREAM_OFFSET..SEGMENT_HEADER_LEN]);
    if stored != computed {
        return Err(FormatError::Checksum {
            what: "segment header",
            stored,
            computed,
        });
    }
    let found_stream = read_u64(STREAM_OFFSET);
    if found_stream != stream {
        return Err(FormatError::Inconsistent(format!(
            "segment belongs to stream {found_stream}, not {stream}"
        )));
    }
    let found_base = read_u64(BASE_OFFSET);
    if found_base != base_version {
        return Err(FormatError::Inconsistent(format!(
            "segment header says base version {found_base}, its name says {base_version}"
        )));
    }
    Ok(())
}

/// Creates the file of a segment with its header; returns it once the file
/// and its folder entry are durable.
pub(crate) fn create_segment_file(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    base: u64,
) -> Result<Arc<dyn StorageFile>, LogError> {
    let path = segment_path(folder, base);
    let file = storage.open(&path, true).map_err(io_error(&path))?;
    file.set_len(0).map_err(io_error(&path))?;
    file.write_at(&encode_header(stream, base), 0)
        .map_err(io_error(&path))?;
    file.sync_data().map_err(io_error(&path))?;
    // The new file's folder entry must be durable too, or a crash could
    // lose the whole segment after its records were acknowledged.
    storage.sync_dir(folder).map_err(io_error(folder))?;
    Ok(file)
}

/// Removes a segment file; one already gone is no error (a segment a
/// checkpoint covers is not looked for at open, so it may be missing).
pub(crate) fn remove_segment_file(storage: &dyn Storage, path: &Path) -> std::io::Result<()> {
    match storage.remove_file(path) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_sort_in_version_order_and_parse_back() {
        let mut names: Vec<String> = [10, 9, 100_000, 1]
            .iter()
            .map(|&v| segment_name(v))
            .collect();
        names.sort();
        let bases: Vec<u64> = names
            .iter()
            .map(|n| parse_segment_name(n).unwrap())
            .collect();
        assert_eq!(bases, vec![1, 9, 10, 100_000]);
        assert_eq!(parse_segment_name("1.seg"), None);
        assert_eq!(parse_segment_name(&segment_name(0)), None);
        assert_eq!(parse_segment_name("00000000000000000001.seg.tmp"), None);
    }

    #[test]
    fn a_header_is_checked_against_stream_and_base() {
        let header = encode_header(7, 33);
        assert_eq!(check_header(&header, 7, 33), Ok(()));
        assert!(check_header(&header, 8, 33).is_err());
        assert!(check_header(&header, 7, 34).is_err());
        for byte in 0..SEGMENT_HEADER_LEN {
            let mut damaged = header;
            damaged[byte] ^= 0x10;
            assert!(check_header(&damaged, 7, 33).is_err(), "byte {byte}");
        }
    }
}
