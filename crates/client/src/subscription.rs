//! Subscriptions: committed records pushed by the server, in order, each
//! once, with credit-based flow control and resumption after reconnects.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::command::{Command, ReceivedRecord, SubscriptionCounters};
use crate::error::ClientError;
use crate::inner::Inner;

pub struct Subscription {
    id: u64,
    inner: Arc<Inner>,
    records: mpsc::UnboundedReceiver<Result<ReceivedRecord, ClientError>>,
    counters: Arc<SubscriptionCounters>,
    /// Records taken since credit was last granted.
    ungranted: u32,
    finished: bool,
}

impl Subscription {
    pub(crate) fn start(
        inner: Arc<Inner>,
        stream: u64,
        from: u64,
    ) -> Result<Subscription, ClientError> {
        let id = inner.next_request();
        let (sender, records) = mpsc::unbounded_channel();
        let counters = Arc::new(SubscriptionCounters::default());
        inner
            .commands
            .send(Command::Subscribe {
                id,
                stream,
                from,
                sender,
                counters: Arc::clone(&counters),
            })
            .map_err(|_| ClientError::Closed)?;
        Ok(Subscription {
            id,
            inner,
            records,
            counters,
            ungranted: 0,
            finished: false,
        })
    }

    /// The next record; `None` once the client is closed. An error ends
    /// the subscription (an unknown stream, a version no longer retained).
    pub async fn next(&mut self) -> Option<Result<ReceivedRecord, ClientError>> {
        if self.finished {
            return None;
        }
        let item = self.records.recv().await;
        match &item {
            Some(Ok(_)) => {
                self.counters.consumed.fetch_add(1, Ordering::Relaxed);
                self.ungranted += 1;
                // Credit goes back in halves of the buffer, so the server
                // never waits for a reader that is keeping up.
                if self.ungranted >= (self.inner.config.subscription_buffer / 2).max(1) {
                    let credit = std::mem::take(&mut self.ungranted);
                    self.counters
                        .returned
                        .fetch_add(u64::from(credit), Ordering::Relaxed);
                    let _ = self.inner.commands.send(Command::Credit {
                        id: self.id,
                        credit,
                    });
                }
            }
            Some(Err(_)) | None => self.finished = true,
        }
        item
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let _ = self
            .inner
            .commands
            .send(Command::Unsubscribe { id: self.id });
    }
}
