//! Seed 001's forwarding (F5): a server that is not a stream's primary and
//! receives a client's `Append` (a retry after a timeout that went to
//! another server, or a client that knows only this one) forwards it to
//! the primary and relays the answer, so the client gets the version the
//! message has, and `duplicate` when it had landed before, whichever
//! server it reached.
//!
//! Each client connection opens at most one forwarding link, to the
//! current primary, lazily, as a client with the same client id (the
//! primary's dedupe table keys on it) and the same request numbers, so
//! the primary's `Ack` or `Error` goes back to the client as it is. A
//! client that prefers the redirect sets `APPEND_FLAG_REDIRECT` and gets
//! `NotPrimary` naming the primary, as before; so does every client when
//! the primary cannot be reached.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::*;

/// How long opening the link to the primary may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The primary's answers are short frames; this bounds each.
const ANSWER_FRAME_BYTES_MAX: usize = 64 << 20;

/// One connection's link to the primary of the streams it forwards for.
pub(super) struct Forwarder {
    primary: ServerId,
    writer: LinkWriter,
    /// Requests sent and not answered yet: whoever takes one out answers
    /// it (the relay with the primary's answer, or the connection with
    /// `NotPrimary` when the link goes).
    pending: Arc<Mutex<HashSet<u64>>>,
    broken: Arc<AtomicBool>,
    relay: AbortHandle,
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.relay.abort();
    }
}

impl Connection {
    /// Forwards `append` (request `request`) to `stream`'s primary and
    /// relays its answer; answers `NotPrimary` itself when the primary
    /// cannot be reached. `false`: this connection is gone.
    pub(super) async fn forward(&mut self, stream: &Stream, request: u64, append: Frame) -> bool {
        let primary = stream.placement().primary;
        let stale = self
            .forwarder
            .as_ref()
            .is_some_and(|f| f.primary != primary || f.broken.load(Ordering::Acquire));
        if stale && !self.drop_forwarder().await {
            return false;
        }
        if self.forwarder.is_none() {
            match self.open_forwarder(primary).await {
                Ok(forwarder) => self.forwarder = Some(forwarder),
                Err(why) => return self.not_primary(request, stream, &why.to_string()).await,
            }
        }
        let in_flight_max = self.server.config.in_flight_per_connection_max;
        let forwarder = self.forwarder.as_mut().expect("opened above");
        let full = {
            let mut pending = forwarder.pending.lock().expect("pending lock");
            pending.len() >= in_flight_max || !pending.insert(request)
        };
        if full {
            let message =
                format!("{in_flight_max} appends are already forwarded to the primary; retry");
            return self.outgoing.error(request, ErrorCode::Busy, message).await;
        }
        if forwarder
            .writer
            .write_all(&append.to_bytes())
            .await
            .is_err()
        {
            forwarder.broken.store(true, Ordering::Release);
            return self.drop_forwarder().await;
        }
        true
    }

    /// Opens a link to server `primary` as this connection's client.
    async fn open_forwarder(&self, primary: ServerId) -> Result<Forwarder, std::io::Error> {
        if primary == 0 || primary == self.server.config.cluster.me {
            return Err(std::io::Error::other("the stream has no other primary now"));
        }
        let address = self.server.address_of(primary);
        let opened = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let socket = self.server.router.dialer.connect(&address).await?;
            let (mut reader, mut writer) = socket.into_split();
            // The client's rights were checked here; the primary takes
            // this server's word for them.
            let hello = Frame::ServerHello {
                version: PROTOCOL_VERSION,
                from: self.server.config.cluster.me,
                client: self.client,
            };
            writer.write_all(&hello.to_bytes()).await?;
            let mut buffer = FrameBuffer::new();
            let first = first_frame(&mut reader, &mut buffer)
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            match first {
                Frame::HelloOk { .. } => Ok((reader, writer, buffer)),
                other => Err(std::io::Error::other(format!(
                    "the primary answered the hello with {other:?}"
                ))),
            }
        })
        .await;
        let (reader, writer, buffer) = match opened {
            Ok(Ok(link)) => link,
            Ok(Err(error)) => {
                return Err(std::io::Error::other(format!(
                    "server {primary} at {address}: {error}"
                )))
            }
            Err(_) => {
                return Err(std::io::Error::other(format!(
                    "server {primary} at {address} did not answer"
                )))
            }
        };
        let pending: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let broken = Arc::new(AtomicBool::new(false));
        let relay = tokio::spawn(relay(
            (reader, buffer),
            Arc::clone(&pending),
            Arc::clone(&broken),
            Arc::clone(&self.outgoing),
            primary,
        ));
        Ok(Forwarder {
            primary,
            writer,
            pending,
            broken,
            relay: relay.abort_handle(),
        })
    }

    /// Lets the forwarding link go, answering what it had not relayed with
    /// `NotPrimary` (the client sends it again). `false`: this connection
    /// is gone.
    async fn drop_forwarder(&mut self) -> bool {
        let Some(forwarder) = self.forwarder.take() else {
            return true;
        };
        let primary = forwarder.primary;
        let left: Vec<u64> = forwarder
            .pending
            .lock()
            .expect("pending lock")
            .drain()
            .collect();
        drop(forwarder);
        answer_unrelayed(&self.outgoing, primary, left).await
    }

    /// `NotPrimary` for `request`, naming the primary when there is one.
    pub(super) async fn not_primary(&self, request: u64, stream: &Stream, why: &str) -> bool {
        let primary = stream.placement().primary;
        let message = if primary == 0 {
            format!("stream {:?} has no primary now ({why}); retry", stream.name)
        } else {
            format!(
                "server {} is not the primary of stream {:?}: server {primary} at {} is ({why})",
                self.server.config.cluster.me,
                stream.name,
                self.server.address_of(primary)
            )
        };
        self.outgoing
            .error(request, ErrorCode::NotPrimary, message)
            .await
    }
}

/// Relays the primary's answers to forwarded requests to the client; when
/// the link ends, answers what is left with `NotPrimary`.
async fn relay(
    (mut reader, mut buffer): (LinkReader, FrameBuffer),
    pending: Arc<Mutex<HashSet<u64>>>,
    broken: Arc<AtomicBool>,
    outgoing: Arc<Outgoing>,
    primary: ServerId,
) {
    'read: loop {
        loop {
            let frame = match buffer.next_frame(ANSWER_FRAME_BYTES_MAX) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => break 'read,
            };
            // Other frames (answers for this client id's other
            // connections) are not this link's to relay.
            let request = match &frame {
                Frame::Ack { request, .. } | Frame::Error { request, .. } => *request,
                _ => continue,
            };
            if pending.lock().expect("pending lock").remove(&request)
                && !outgoing.send(&frame).await
            {
                break 'read;
            }
        }
        match net::read_into(&mut reader, buffer.receiving(), READ_BYTES).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    broken.store(true, Ordering::Release);
    let left: Vec<u64> = pending.lock().expect("pending lock").drain().collect();
    answer_unrelayed(&outgoing, primary, left).await;
}

/// Answers forwarded requests that a broken link to server `primary`
/// left without an answer with `NotPrimary` (the client sends them
/// again). `false`: the client's connection is gone.
async fn answer_unrelayed(outgoing: &Outgoing, primary: ServerId, left: Vec<u64>) -> bool {
    for request in left {
        let message = format!(
            "the link to the primary (server {primary}) broke before it answered; send again"
        );
        if !outgoing
            .error(request, ErrorCode::NotPrimary, message)
            .await
        {
            return false;
        }
    }
    true
}
