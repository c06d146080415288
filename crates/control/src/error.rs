//! What can go wrong in the control plane, said so that an operator knows
//! which server and which file or peer to look at.

use std::io;
use std::path::PathBuf;

use crate::state::ServerId;

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Reading or writing a file of the control plane's storage failed.
    #[error("control storage {path}: {action} failed: {source}")]
    Storage {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
    /// A storage file holds bytes that no crash can leave behind.
    #[error("control storage {path} is corrupt, so this server cannot rejoin from it: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// The settings cannot work together.
    #[error("control plane settings of server {id}: {detail}")]
    Config { id: ServerId, detail: String },
    /// The Raft node did not start (its storage failed at open).
    #[error("the Raft node of server {id} did not start: {detail}")]
    Start { id: ServerId, detail: String },
    /// No leader took the request before the deadline.
    #[error(
        "server {id}: the control plane could not {what} within {waited_ms} ms \
         (no Raft leader took it; last: {last})"
    )]
    Unavailable {
        id: ServerId,
        what: String,
        waited_ms: u64,
        last: String,
    },
    /// The leader refused a membership change.
    #[error("server {id}: the Raft leader refused to {what}: {detail}")]
    Refused {
        id: ServerId,
        what: String,
        detail: String,
    },
    /// This server's control plane has been shut down, or its Raft node
    /// stopped after a storage failure.
    #[error("the control plane of server {id} has stopped")]
    Stopped { id: ServerId },
    /// A control connection broke or sent something unexpected.
    #[error("control connection {peer}: {detail}")]
    Connection { peer: String, detail: String },
}
