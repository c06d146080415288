//! The manifest: a small file naming a log's newest segment and the
//! checkpoints it keeps, so that opening the log from a checkpoint does not
//! list its folder (with small segments, a folder of thousands of files
//! takes longer to list than the rest of the open).
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `STLGMAN\0` |
//! | 8 | 4 | manifest format version (1) |
//! | 12 | 4 | CRC32C of every byte from 16 to the end of the file |
//! | 16 | 8 | stream id |
//! | 24 | 8 | newest segment: no segment file has a larger base |
//! | 32 | 4 | checkpoint count C (at most 16) |
//! | 36 | 4 | reserved, 0 |
//! | 40 | 8 × C | the versions of the kept checkpoints, newest first |
//!
//! The file is `manifest` in the log's folder, written with
//! [`crate::storage::write_atomically`]. Its one promise is that no segment
//! file has a base above its newest segment: the I/O thread writes the
//! manifest naming a new segment before it creates the segment's file, and
//! a checkpoint writes it naming the log's last segment. Everything else
//! in it is a hint: a checkpoint it names may be gone (recovery skips it),
//! and one it does not name is not used. A missing or damaged manifest,
//! or one whose newest segment is not on disk, makes recovery list the
//! folder as it did before the manifest existed.

use crate::FormatError;
use std::path::{Path, PathBuf};

use crate::storage::{self, Storage};

pub const MANIFEST_MAGIC: [u8; 8] = *b"STLGMAN\0";
pub const MANIFEST_FORMAT_VERSION: u32 = 1;
/// The manifest's file name in the log's folder.
pub const MANIFEST_NAME: &str = "manifest";
const HEADER_LEN: usize = 40;
const CHECKPOINTS_MAX: usize = 16;

/// What a manifest says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// No segment file has a larger base.
    pub newest_segment: u64,
    /// The kept checkpoints' versions, newest first.
    pub checkpoints: Vec<u64>,
}

pub fn manifest_path(folder: &Path) -> PathBuf {
    folder.join(MANIFEST_NAME)
}

impl Manifest {
    pub fn encode(&self, stream: u64) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(HEADER_LEN + 8 * self.checkpoints.len());
        bytes.extend_from_slice(&MANIFEST_MAGIC);
        bytes.extend_from_slice(&MANIFEST_FORMAT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        bytes.extend_from_slice(&stream.to_le_bytes());
        bytes.extend_from_slice(&self.newest_segment.to_le_bytes());
        let count = self.checkpoints.len().min(CHECKPOINTS_MAX);
        bytes.extend_from_slice(&(count as u32).to_le_bytes());
        bytes.extend_from_slice(&[0; 4]);
        for version in &self.checkpoints[..count] {
            bytes.extend_from_slice(&version.to_le_bytes());
        }
        let checksum = crc32c::crc32c(&bytes[16..]);
        bytes[12..16].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Decodes and checks a manifest of `stream`. Never panics.
    pub fn decode(bytes: &[u8], stream: u64) -> Result<Manifest, FormatError> {
        if bytes.len() < HEADER_LEN {
            return Err(FormatError::Cut {
                what: "manifest",
                length: bytes.len(),
            });
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8"));
        if bytes[..8] != MANIFEST_MAGIC {
            return Err(FormatError::BadMagic { what: "manifest" });
        }
        let format = u32_at(8);
        if format != MANIFEST_FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: "manifest",
                version: format,
            });
        }
        let stored = u32_at(12);
        let computed = crc32c::crc32c(&bytes[16..]);
        if stored != computed {
            return Err(FormatError::Checksum {
                what: "manifest",
                stored,
                computed,
            });
        }
        if u64_at(16) != stream {
            return Err(FormatError::Inconsistent(format!(
                "manifest of stream {}, not {stream}",
                u64_at(16)
            )));
        }
        let newest_segment = u64_at(24);
        let count = u32_at(32) as usize;
        if newest_segment == 0 || count > CHECKPOINTS_MAX || bytes.len() != HEADER_LEN + 8 * count {
            return Err(FormatError::Inconsistent(
                "manifest fields out of range".into(),
            ));
        }
        let checkpoints = (0..count).map(|i| u64_at(HEADER_LEN + 8 * i)).collect();
        Ok(Manifest {
            newest_segment,
            checkpoints,
        })
    }
}

/// The manifest in `folder`, or `None` when it is missing, unreadable or
/// damaged (recovery then lists the folder).
pub(crate) fn read(storage: &dyn Storage, folder: &Path, stream: u64) -> Option<Manifest> {
    let file = storage.open(&manifest_path(folder), false).ok()?;
    let length = file.len().ok()?;
    if length > (HEADER_LEN + 8 * CHECKPOINTS_MAX) as u64 {
        return None;
    }
    let mut bytes = vec![0; length as usize];
    file.read_exact_at(&mut bytes, 0).ok()?;
    Manifest::decode(&bytes, stream).ok()
}

/// Writes the manifest atomically (temporary file, sync, rename, folder
/// sync).
pub(crate) fn write(
    storage: &dyn Storage,
    folder: &Path,
    stream: u64,
    manifest: &Manifest,
) -> std::io::Result<()> {
    storage::write_atomically(storage, &manifest_path(folder), &manifest.encode(stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_decodes_to_what_was_encoded_and_damage_is_refused() {
        let manifest = Manifest {
            newest_segment: 52137,
            checkpoints: vec![52136, 40000],
        };
        let bytes = manifest.encode(7);
        assert_eq!(bytes.len(), 56);
        assert_eq!(Manifest::decode(&bytes, 7), Ok(manifest));
        assert!(Manifest::decode(&bytes, 8).is_err());
        for bit in 0..bytes.len() * 8 {
            let mut damaged = bytes.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert!(Manifest::decode(&damaged, 7).is_err(), "bit {bit}");
        }
        for cut in 0..bytes.len() {
            assert!(Manifest::decode(&bytes[..cut], 7).is_err(), "cut {cut}");
        }
    }
}
