//! Subscriptions: push committed records to a reader, in order, each once,
//! as far as the reader's credit allows.
//!
//! Flow control is by credit: the reader grants a number of records, and
//! the server pushes no more than that until it grants more. Records are
//! read from the log files, not held in memory, so a slow reader costs the
//! server one read batch and its share of the connection's bounded queue.

use std::sync::Arc;

use proto::{ErrorCode, Frame};
use tokio::sync::Semaphore;
use wal::ReadError;

use crate::outgoing::Outgoing;
use crate::stream::Stream;

/// Records pushed in one `Deliver` frame at most.
const DELIVER_RECORDS_MAX: u32 = 1024;

/// Removes void records (versions that hold no message) from a batch read
/// from the log: readers never see them. Returns the kept bytes and count.
pub(crate) fn strip_voids(records: Vec<u8>, count: u32) -> (Vec<u8>, u32) {
    let voids = proto::frame::iter_records(&records)
        .filter(|r| r.header.flags & proto::FLAG_VOID != 0)
        .count() as u32;
    if voids == 0 {
        return (records, count);
    }
    let mut kept = Vec::with_capacity(records.len());
    let mut offset = 0;
    while let Ok((record, length)) = proto::Record::decode_verified(&records[offset..]) {
        if record.header.flags & proto::FLAG_VOID == 0 {
            kept.extend_from_slice(&records[offset..offset + length]);
        }
        offset += length;
    }
    (kept, count - voids)
}

pub(crate) fn read_error_code(error: &ReadError) -> ErrorCode {
    match error {
        ReadError::Retained { .. } => ErrorCode::VersionUnavailable,
        ReadError::Io(_) | ReadError::Corrupt { .. } => ErrorCode::Internal,
    }
}

/// Waits for credit, then takes all there is, up to one frame's worth;
/// `None` once the subscription is cancelled.
async fn take_credits(credits: &Semaphore) -> Option<u32> {
    credits.acquire().await.ok()?.forget();
    let extra = (credits.available_permits() as u32).min(DELIVER_RECORDS_MAX - 1);
    if extra > 0 {
        if let Ok(more) = credits.try_acquire_many(extra) {
            more.forget();
        }
    }
    Some(1 + extra)
}

/// Pushes records of `stream` from version `from` on until the connection
/// closes, the subscription is cancelled, or a read fails.
pub(crate) async fn run(
    id: u64,
    stream: Arc<Stream>,
    from: u64,
    credits: Arc<Semaphore>,
    outgoing: Arc<Outgoing>,
    batch_bytes_max: usize,
) {
    let mut next = from;
    let position = stream.track_reader(from);
    let mut progress = stream.log.progress_beyond_hook();
    let mut visible = stream.visible();
    loop {
        let Some(granted) = take_credits(&credits).await else {
            return;
        };
        // Only committed versions are read: wait until `next` is visible
        // (or the log fails).
        let woken = tokio::select! {
            woken = visible.wait_for(|v| *v >= next) => woken.is_ok(),
            woken = progress.wait_for(|p| p.failed.is_some()) => woken.is_ok(),
        };
        if !woken {
            return;
        }
        let readable = (*visible.borrow() + 1).saturating_sub(next);
        let granted_now = (granted as u64).min(readable) as u32;
        let Some(budget) = outgoing.reserve_read(batch_bytes_max).await else {
            return;
        };
        let mut records = Vec::new();
        let count = match stream
            .log
            .read(next, granted_now as usize, batch_bytes_max, &mut records)
        {
            Ok(count) => count as u32,
            Err(error) => {
                let frame = Frame::Error {
                    request: id,
                    code: read_error_code(&error),
                    message: error.to_string(),
                };
                outgoing.send(&frame).await;
                return;
            }
        };
        let (records, delivered) = strip_voids(records, count);
        if delivered < granted {
            credits.add_permits((granted - delivered) as usize);
        }
        if count == 0 {
            // The log failed before reaching `next`: nothing more will come.
            if let Some(failure) = stream.log.failure() {
                let frame = Frame::Error {
                    request: id,
                    code: ErrorCode::LogFailed,
                    message: format!("the stream's log failed: {failure}"),
                };
                outgoing.send(&frame).await;
                return;
            }
            // Durable yet unread should not happen; do not spin if it does.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            continue;
        }
        next += u64::from(count);
        position.store(next, std::sync::atomic::Ordering::Relaxed);
        if delivered == 0 {
            // Only void versions: nothing to push.
            continue;
        }
        let frame = Frame::Deliver {
            subscription: id,
            count: delivered,
            records,
        };
        if !outgoing.send_read(&frame, budget).await {
            return;
        }
    }
}
