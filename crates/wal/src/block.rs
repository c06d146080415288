//! A byte buffer laid out for whole-block writes: the records a chunk
//! gathers, preceded by room for the bytes of the block they start in and
//! followed by room to pad the last block with zeros, the whole starting
//! on a block boundary in memory. The I/O thread fills the room and writes
//! the blocks as they stand, past the page cache
//! ([`crate::StorageFile::write_blocks_at`]), with no copy of the records.
//!
//! It is made of safe code only: the vector is allocated with a block of
//! slack, and the buffer starts at the first block boundary inside it.

use std::time::Instant;

use crate::storage::BLOCK_BYTES;

/// Records bound for one segment, written with one write call.
pub(crate) struct Chunk {
    pub(crate) segment_base: u64,
    pub(crate) offset: u64,
    pub(crate) bytes: BlockBuffer,
    pub(crate) last_version: u64,
    pub(crate) records: u64,
    /// When each record was appended, for latency sampling and the
    /// log's observer (empty unless one of them is on).
    pub(crate) appended_at: Vec<Instant>,
    /// When the chunk's first record arrived (paged idle flush).
    pub(crate) opened_at: Instant,
    /// Paged: no further record goes into this page.
    pub(crate) sealed: bool,
}

/// Records at an offset inside a block, with the room around them.
#[derive(Default)]
pub(crate) struct BlockBuffer {
    /// Allocation, all of it initialized; its length is its capacity.
    memory: Vec<u8>,
    /// Index in `memory` of the first block boundary.
    start: usize,
    /// Bytes of room before the records: the records' file offset modulo
    /// the block size.
    head: usize,
    /// Record bytes after the room.
    length: usize,
}

impl BlockBuffer {
    /// An empty buffer for at least `capacity` record bytes.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        let mut buffer = BlockBuffer::default();
        buffer.reserve(capacity);
        buffer
    }

    /// Empties the buffer for records that start `offset` bytes into the
    /// file (only the offset within a block matters).
    pub(crate) fn reset(&mut self, offset: u64) {
        self.head = (offset % BLOCK_BYTES as u64) as usize;
        self.length = 0;
    }

    /// The record bytes.
    pub(crate) fn records(&self) -> &[u8] {
        let from = self.start + self.head;
        &self.memory[from..from + self.length]
    }

    pub(crate) fn len(&self) -> usize {
        self.length
    }

    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        self.reserve(self.length + bytes.len());
        let from = self.start + self.head + self.length;
        self.memory[from..from + bytes.len()].copy_from_slice(bytes);
        self.length += bytes.len();
    }

    /// Fills the room before the records with `prefix`, the bytes of the
    /// file from the records' block boundary up to the records.
    pub(crate) fn set_prefix(&mut self, prefix: &[u8]) {
        assert_eq!(
            prefix.len(),
            self.head,
            "a prefix covers exactly the room before the records"
        );
        self.memory[self.start..self.start + self.head].copy_from_slice(prefix);
    }

    /// The whole blocks to write: the prefix (set by
    /// [`BlockBuffer::set_prefix`]), the records, and zeros up to the next
    /// block boundary.
    pub(crate) fn blocks(&mut self) -> &[u8] {
        let used = self.head + self.length;
        let padded = used.next_multiple_of(BLOCK_BYTES);
        let from = self.start;
        self.memory[from + used..from + padded].fill(0);
        &self.memory[from..from + padded]
    }

    /// Bytes of the allocation from the first block boundary on.
    fn usable(&self) -> usize {
        self.memory.len() - self.start
    }

    /// Grows so `length` record bytes fit with the room on both sides.
    fn reserve(&mut self, length: usize) {
        let needed = self.head + length + BLOCK_BYTES;
        if needed <= self.usable() {
            return;
        }
        let size = needed.max(self.usable() * 2).next_multiple_of(BLOCK_BYTES);
        let mut memory = vec![0u8; size + BLOCK_BYTES];
        let start = memory.as_ptr().align_offset(BLOCK_BYTES);
        // The records move; the room before them is filled at write time.
        if self.length > 0 {
            let from = self.head;
            let to = self.head + self.length;
            memory[start + from..start + to]
                .copy_from_slice(&self.memory[self.start + from..self.start + to]);
        }
        self.memory = memory;
        self.start = start;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::is_block_aligned;

    #[test]
    fn blocks_start_on_a_boundary_and_pad_with_zeros() {
        let mut buffer = BlockBuffer::default();
        buffer.reset(4096 * 3 + 100);
        buffer.extend_from_slice(&[7u8; 5000]);
        buffer.set_prefix(&[1u8; 100]);
        let records = buffer.records().to_vec();
        assert_eq!(records, vec![7u8; 5000]);
        let blocks = buffer.blocks();
        assert_eq!(blocks.len(), 8192);
        assert!(is_block_aligned(blocks, 4096 * 3));
        assert_eq!(&blocks[..100], &[1u8; 100][..]);
        assert_eq!(&blocks[100..5100], &[7u8; 5000][..]);
        assert!(blocks[5100..].iter().all(|b| *b == 0));
    }

    #[test]
    fn growing_keeps_the_records_and_the_alignment() {
        let mut buffer = BlockBuffer::with_capacity(10);
        buffer.reset(33);
        let mut expected = Vec::new();
        for round in 0..200u32 {
            let piece = vec![round as u8; 1000 + round as usize];
            buffer.extend_from_slice(&piece);
            expected.extend_from_slice(&piece);
        }
        assert_eq!(buffer.records(), &expected[..]);
        assert_eq!(buffer.len(), expected.len());
        buffer.set_prefix(&[9u8; 33]);
        let blocks = buffer.blocks();
        assert!(is_block_aligned(blocks, 0));
        assert_eq!(&blocks[33..33 + expected.len()], &expected[..]);
    }

    #[test]
    fn a_reset_buffer_reuses_its_memory_at_a_new_offset() {
        let mut buffer = BlockBuffer::default();
        buffer.reset(0);
        buffer.extend_from_slice(&[5u8; 3000]);
        let allocation = buffer.memory.as_ptr();
        buffer.reset(4095);
        assert_eq!(buffer.len(), 0);
        buffer.extend_from_slice(&[6u8; 10]);
        assert_eq!(buffer.records(), &[6u8; 10][..]);
        assert_eq!(buffer.memory.as_ptr(), allocation, "no new allocation");
        buffer.set_prefix(&[0u8; 4095]);
        let blocks = buffer.blocks();
        assert_eq!(blocks.len(), 8192);
    }
}
