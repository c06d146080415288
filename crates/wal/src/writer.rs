//! The I/O thread of a log: takes pending chunks, writes and syncs them,
//! publishes the durable version, and latches the log failed on any error.
//!
//! It is a plain thread, not a task: fdatasync blocks, and a blocked async
//! worker would stall unrelated connections.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::config::Durability;
use crate::log::{LogError, Shared};
use crate::recovery;
use crate::storage::StorageFile;

/// Spare buffers a `Sync` log keeps for reuse between batches.
const SPARE_BUFFERS_MAX: usize = 4;

impl Shared {
    pub(crate) fn run_io(self: Arc<Self>) {
        while let Some(batch) = self.next_batch() {
            let started = Instant::now();
            match self.write_batch(&batch) {
                Ok(()) => self.complete(batch, started),
                Err(error) => {
                    self.latch(error);
                    return;
                }
            }
        }
    }

    /// Waits for the next batch: for `Sync`, everything pending; for
    /// `Paged`, the oldest sealed page (or a partly filled one that waited
    /// long enough). `None` on shutdown with nothing left, or after failure.
    fn next_batch(&self) -> Option<Vec<crate::log::Chunk>> {
        let mut state = self.lock_state();
        loop {
            if state.failed.is_some() {
                return None;
            }
            match self.config.durability {
                Durability::Sync if !state.pending.is_empty() => {
                    return Some(state.pending.drain(..).collect());
                }
                Durability::Paged { .. } => {
                    let interval = self.config.page_flush_interval;
                    let shutdown = state.shutdown;
                    if let Some(front) = state.pending.front_mut() {
                        if front.sealed || shutdown || front.opened_at.elapsed() >= interval {
                            front.sealed = true;
                            return state.pending.pop_front().map(|page| vec![page]);
                        }
                    }
                }
                _ => {}
            }
            if state.shutdown {
                return None;
            }
            state = match self.config.durability {
                Durability::Paged { .. } => {
                    self.work
                        .wait_timeout(state, self.config.page_flush_interval)
                        .expect("log state lock poisoned")
                        .0
                }
                _ => self.work.wait(state).expect("log state lock poisoned"),
            };
        }
    }

    fn segment_file(&self, base: u64) -> Option<Arc<dyn StorageFile>> {
        let state = self.lock_state();
        let segment = state.segments.iter().rev().find(|s| s.base == base)?;
        segment.file.clone()
    }

    fn write_batch(&self, batch: &[crate::log::Chunk]) -> Result<(), LogError> {
        let mut touched: Vec<(std::path::PathBuf, Arc<dyn StorageFile>)> = Vec::new();
        for chunk in batch {
            let path = crate::segment::segment_path(&self.folder, chunk.segment_base);
            let file = match self.segment_file(chunk.segment_base) {
                Some(file) => file,
                None => {
                    // Everything written to earlier segments is made durable
                    // before a later segment gets any record, so recovery
                    // never finds a later segment behind a torn earlier one.
                    sync_all(&touched)?;
                    let file = recovery::create_segment_file(
                        self.storage.as_ref(),
                        &self.folder,
                        self.stream,
                        chunk.segment_base,
                    )?;
                    let mut state = self.lock_state();
                    if let Some(segment) = state
                        .segments
                        .iter_mut()
                        .rev()
                        .find(|s| s.base == chunk.segment_base)
                    {
                        segment.file = Some(file.clone());
                    }
                    file
                }
            };
            file.write_at(&chunk.bytes, chunk.offset)
                .map_err(|source| LogError::Io {
                    path: path.clone(),
                    source,
                })?;
            if !touched.iter().any(|(p, _)| *p == path) {
                touched.push((path, file));
            }
        }
        sync_all(&touched)
    }

    fn complete(&self, batch: Vec<crate::log::Chunk>, started: Instant) {
        let now = Instant::now();
        let last_version = batch.last().expect("a batch is never empty").last_version;
        let records: u64 = batch.iter().map(|c| c.records).sum();
        let bytes: usize = batch.iter().map(|c| c.bytes.len()).sum();
        if self.config.sample_latency {
            let mut samples = self.latency_samples.lock().expect("sampler lock poisoned");
            for chunk in &batch {
                for appended in &chunk.appended_at {
                    if samples.len() < super::log::LATENCY_SAMPLES_MAX {
                        samples.push(now.duration_since(*appended).as_nanos() as u64);
                    }
                }
            }
        }
        {
            let mut state = self.lock_state();
            state.pending_bytes -= bytes;
            let keep = match self.config.durability {
                Durability::Paged { .. } => usize::MAX,
                _ => SPARE_BUFFERS_MAX,
            };
            for mut chunk in batch {
                if state.free_buffers.len() < keep {
                    chunk.bytes.clear();
                    state.free_buffers.push(chunk.bytes);
                }
            }
        }
        self.progress
            .send_modify(|progress| progress.durable = last_version);
        self.space.notify_waiters();
        let counters = &self.counters;
        counters.syncs.fetch_add(1, Ordering::Relaxed);
        counters
            .records_synced
            .fetch_add(records, Ordering::Relaxed);
        counters
            .bytes_written
            .fetch_add(bytes as u64, Ordering::Relaxed);
        counters.io_nanos.fetch_add(
            now.duration_since(started).as_nanos() as u64,
            Ordering::Relaxed,
        );
    }

    /// Latches the log failed. The data of a failed fsync may or may not be
    /// on disk; retrying could report success for data the kernel already
    /// dropped, so the log never retries and never acknowledges again.
    fn latch(&self, error: LogError) {
        let message: Arc<str> = Arc::from(error.to_string());
        {
            let mut state = self.lock_state();
            state.failed = Some(message.clone());
            state.pending.clear();
        }
        self.progress
            .send_modify(|progress| progress.failed = Some(message));
        self.space.notify_waiters();
    }
}

fn sync_all(files: &[(std::path::PathBuf, Arc<dyn StorageFile>)]) -> Result<(), LogError> {
    for (path, file) in files {
        file.sync_data().map_err(|source| LogError::Io {
            path: path.clone(),
            source,
        })?;
    }
    Ok(())
}
