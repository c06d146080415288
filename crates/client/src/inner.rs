//! What every handle of one client shares: its configuration and id, the
//! way to its connection task, the window, and the request and session
//! counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, Semaphore};

use crate::command::Command;
use crate::config::ClientConfig;

pub(crate) struct Inner {
    pub(crate) config: ClientConfig,
    pub(crate) client_id: u128,
    pub(crate) commands: mpsc::UnboundedSender<Command>,
    /// Bounds the appends in flight (`window`).
    pub(crate) window: Arc<Semaphore>,
    pub(crate) next_request: AtomicU64,
    pub(crate) next_session: AtomicU64,
}

impl Inner {
    pub(crate) fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}
