//! File helpers for the control plane's storage: atomic replacement, and
//! length-prefixed, CRC32C-checked records.
//!
//! A record is `[u32 LE body length][u32 LE CRC32C of the body][body]`.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

/// Bytes before a record's body: its length and its checksum.
pub(crate) const RECORD_HEADER_LEN: usize = 8;
/// The largest record body written or accepted (control traffic is small;
/// this bounds what a garbled length can make us allocate).
pub(crate) const RECORD_BODY_MAX: usize = 64 * 1024 * 1024;

/// Replaces `path` with `bytes` so that a crash leaves either the old file
/// or the new one: write a temporary file, sync it, rename it over, and sync
/// the folder so the rename itself is durable.
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = Path::new(&temporary);
    {
        let mut file = File::create(temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    fs::rename(temporary, path)?;
    sync_folder(path)
}

/// Syncs the folder holding `path`, so a file created or renamed in it
/// survives a crash.
pub(crate) fn sync_folder(path: &Path) -> io::Result<()> {
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(folder)?.sync_all()
}

/// Appends one record holding `body` to `out`.
pub(crate) fn encode_record(body: &[u8], out: &mut Vec<u8>) {
    assert!(
        body.len() <= RECORD_BODY_MAX,
        "record of {} bytes",
        body.len()
    );
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(body).to_le_bytes());
    out.extend_from_slice(body);
}

/// What lies at an offset of a record file.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum RecordRead<'a> {
    /// A whole record whose checksum matches; `length` counts its header.
    Record { body: &'a [u8], length: usize },
    /// The bytes stop inside a record (or the length is absurd): a write
    /// that did not finish.
    Incomplete,
    /// A whole record whose checksum does not match; `length` counts its
    /// header.
    Mismatch { length: usize },
}

/// Reads the record at the start of `bytes`; never panics on any input.
pub(crate) fn decode_record(bytes: &[u8]) -> RecordRead<'_> {
    let Some(header) = bytes.get(..RECORD_HEADER_LEN) else {
        return RecordRead::Incomplete;
    };
    let body_length = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let checksum = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
    if body_length > RECORD_BODY_MAX {
        return RecordRead::Incomplete;
    }
    let length = RECORD_HEADER_LEN + body_length;
    let Some(body) = bytes.get(RECORD_HEADER_LEN..length) else {
        return RecordRead::Incomplete;
    };
    if crc32c::crc32c(body) != checksum {
        return RecordRead::Mismatch { length };
    }
    RecordRead::Record { body, length }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_and_a_flipped_bit_is_a_mismatch() {
        let mut bytes = Vec::new();
        encode_record(b"hello", &mut bytes);
        assert_eq!(
            decode_record(&bytes),
            RecordRead::Record {
                body: b"hello",
                length: 13
            }
        );
        assert_eq!(decode_record(&bytes[..12]), RecordRead::Incomplete);
        bytes[10] ^= 1;
        assert_eq!(decode_record(&bytes), RecordRead::Mismatch { length: 13 });
    }

    #[test]
    fn an_absurd_length_reads_as_incomplete() {
        let mut bytes = vec![0xff; 8];
        bytes.extend_from_slice(b"xyz");
        assert_eq!(decode_record(&bytes), RecordRead::Incomplete);
    }

    #[test]
    fn atomic_write_replaces_the_file() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vote.json");
        write_atomically(&path, b"one").expect("write");
        write_atomically(&path, b"two").expect("write");
        assert_eq!(fs::read(&path).expect("read"), b"two");
        assert!(!dir.path().join("vote.json.tmp").exists());
    }
}
