//! A little-endian cursor over bytes, every read bounds-checked: what the
//! record and frame decoders read with.

use bytes::Bytes;

/// Little-endian cursor over a byte slice; every read is bounds-checked.
/// A reader made with [`Reader::shared`] hands out parts of its buffer
/// without copying them ([`Reader::take_bytes`], [`Reader::rest_bytes`]).
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    owner: Option<&'a Bytes>,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Reader {
            bytes,
            position: 0,
            owner: None,
        }
    }

    /// A reader over `bytes` whose byte fields are slices of it.
    pub fn shared(bytes: &'a Bytes) -> Self {
        Reader {
            bytes,
            position: 0,
            owner: Some(bytes),
        }
    }

    pub fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let end = self.position.checked_add(count)?;
        let slice = self.bytes.get(self.position..end)?;
        self.position = end;
        Some(slice)
    }

    /// The next `count` bytes as `Bytes`: a slice of a shared buffer, a
    /// copy otherwise.
    pub fn take_bytes(&mut self, count: usize) -> Option<Bytes> {
        let start = self.position;
        let slice = self.take(count)?;
        Some(match self.owner {
            Some(owner) => owner.slice(start..start + count),
            None => Bytes::copy_from_slice(slice),
        })
    }

    pub fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }

    pub fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn u64(&mut self) -> Option<u64> {
        let mut array = [0; 8];
        array.copy_from_slice(self.take(8)?);
        Some(u64::from_le_bytes(array))
    }

    pub fn u128(&mut self) -> Option<u128> {
        let mut array = [0; 16];
        array.copy_from_slice(self.take(16)?);
        Some(u128::from_le_bytes(array))
    }

    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.position
    }

    pub fn rest(&mut self) -> &'a [u8] {
        let rest = &self.bytes[self.position..];
        self.position = self.bytes.len();
        rest
    }

    /// The rest as `Bytes` (a slice of a shared buffer, a copy otherwise).
    pub fn rest_bytes(&mut self) -> Bytes {
        let count = self.remaining();
        self.take_bytes(count).unwrap_or_default()
    }
}
