//! The client library's error type.

use std::time::Duration;

use proto::ErrorCode;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum ClientError {
    #[error("cannot connect to {address}: {reason}")]
    Connect { address: String, reason: String },
    #[error("server refused ({code:?}): {message}")]
    Server { code: ErrorCode, message: String },
    #[error(
        "the connection broke before the answer came; the request may or may not have taken effect"
    )]
    Disconnected,
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the client is closed")]
    Closed,
    #[error("unexpected answer from the server: {0}")]
    Protocol(String),
    #[error("invalid configuration: {0}")]
    Config(String),
}
