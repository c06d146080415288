//! Producers: one session of a client, numbering its messages and keeping
//! every one until its acknowledgement arrives.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use proto::Frame;
use tokio::sync::oneshot;

use crate::command::{Ack, Command, SessionTracker};
use crate::error::ClientError;
use crate::inner::Inner;

/// One session of a client sending to one stream.
pub struct Producer {
    inner: Arc<Inner>,
    stream: u64,
    session: u64,
    next_sequence: u64,
    tracker: Arc<SessionTracker>,
    echo: bool,
}

impl Producer {
    pub(crate) fn new(inner: Arc<Inner>, stream: u64, session: u64) -> Self {
        Producer::resume(inner, stream, session, 1)
    }

    pub(crate) fn resume(inner: Arc<Inner>, stream: u64, session: u64, next_sequence: u64) -> Self {
        Producer {
            inner,
            stream,
            session,
            next_sequence: next_sequence.max(1),
            tracker: Arc::default(),
            echo: false,
        }
    }

    pub fn session(&self) -> u64 {
        self.session
    }

    /// The sequence the next message will carry.
    pub fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// Asks the server to send each payload back in its acknowledgement
    /// (the logging experiment's reply of the same length).
    pub fn set_echo(&mut self, echo: bool) {
        self.echo = echo;
    }

    /// Sends one message and waits for its acknowledgement.
    pub async fn send(&mut self, key: &[u8], payload: &[u8]) -> Result<Ack, ClientError> {
        self.submit(key, payload).await?.await
    }

    /// Sends one message once the window has room, and returns a future of
    /// its acknowledgement. The client keeps the message and sends it again
    /// after a reconnection until the acknowledgement arrives.
    pub async fn submit(&mut self, key: &[u8], payload: &[u8]) -> Result<PendingAck, ClientError> {
        let permit = Arc::clone(&self.inner.window)
            .acquire_owned()
            .await
            .map_err(|_| ClientError::Closed)?;
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.tracker.sent(sequence);
        let request = self.inner.next_request();
        let frame = Frame::Append {
            request,
            stream: self.stream,
            flags: if self.echo {
                proto::frame::APPEND_FLAG_ECHO
            } else {
                0
            },
            session: self.session,
            sequence,
            low_water: self.tracker.low_water(sequence),
            key: key.to_vec(),
            payload: payload.to_vec(),
        }
        .to_bytes();
        let (reply, answer) = oneshot::channel();
        let command = Command::Append {
            request,
            sequence,
            frame,
            reply,
            permit,
            tracker: Arc::clone(&self.tracker),
        };
        self.inner
            .commands
            .send(command)
            .map_err(|_| ClientError::Closed)?;
        Ok(PendingAck { answer })
    }
}

/// The acknowledgement of a submitted message, still to come.
pub struct PendingAck {
    answer: oneshot::Receiver<Result<Ack, ClientError>>,
}

impl Future for PendingAck {
    type Output = Result<Ack, ClientError>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.answer)
            .poll(context)
            .map(|result| result.unwrap_or(Err(ClientError::Closed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_low_water_mark_is_the_smallest_unanswered_sequence() {
        let tracker = SessionTracker::default();
        assert_eq!(tracker.low_water(1), 1, "nothing sent: the next sequence");
        for sequence in 1..=5 {
            tracker.sent(sequence);
        }
        assert_eq!(tracker.low_water(6), 1);
        tracker.answered(2);
        tracker.answered(3);
        assert_eq!(tracker.low_water(6), 1, "1 is still unanswered");
        tracker.answered(1);
        assert_eq!(tracker.low_water(6), 4);
        tracker.answered(4);
        tracker.answered(5);
        assert_eq!(tracker.low_water(6), 6, "everything answered");
    }
}
