//! One client connection: the handshake, the read loop that cuts frames and
//! dispatches them, the acknowledgement queue, and the writer task.
//!
//! Acknowledgements (and log failures) of logged appends leave in the order
//! the appends arrived: the ack task waits for each one's durability in
//! turn. Refusals that log nothing are answered at once and may overtake
//! them; clients match answers by request id. The queue between the read loop
//! and the ack task is bounded by `in_flight_per_connection_max`; when it is
//! full the read loop stops reading, and TCP pushes back on the client.

use std::collections::HashMap;
use std::sync::Arc;

use proto::{ErrorCode, EventId, Frame, FrameBuffer, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};

use crate::state::ServerState;
use crate::stream::{AppendFailure, Stream};
use crate::subscription;

/// Bytes the read loop asks the socket for at a time.
const READ_BYTES: usize = 64 * 1024;
/// Bytes of records read for one connection and not yet written to it.
const READ_BUDGET_BYTES: usize = 4 * 1024 * 1024;

/// An append waiting for its acknowledgement.
struct PendingAck {
    request: u64,
    stream: Arc<Stream>,
    version: u64,
    duplicate: bool,
    echo: Vec<u8>,
}

/// A frame waiting for the socket, with the read budget it holds (returned
/// once it is written).
type Queued = (Vec<u8>, Option<OwnedSemaphorePermit>);

/// What one connection's tasks share.
pub(crate) struct Outgoing {
    frames: mpsc::Sender<Queued>,
    /// Bytes of records read for this connection (fetches and
    /// subscriptions) and not yet written to its socket. A reader takes its
    /// batch's worth before it reads, so a client that stops reading holds
    /// at most this much of the server's memory, however many
    /// subscriptions it opens.
    read_budget: Arc<Semaphore>,
}

impl Outgoing {
    pub(crate) async fn send(&self, frame: &Frame) -> bool {
        self.frames.send((frame.to_bytes(), None)).await.is_ok()
    }

    /// Takes `bytes` of the read budget (waiting for room); `None` once the
    /// connection is closing.
    pub(crate) async fn reserve_read(&self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let bytes = bytes.min(READ_BUDGET_BYTES) as u32;
        Arc::clone(&self.read_budget)
            .acquire_many_owned(bytes)
            .await
            .ok()
    }

    /// Queues a frame of records read under `budget`.
    pub(crate) async fn send_read(&self, frame: &Frame, budget: OwnedSemaphorePermit) -> bool {
        self.frames
            .send((frame.to_bytes(), Some(budget)))
            .await
            .is_ok()
    }

    async fn error(&self, request: u64, code: ErrorCode, message: impl Into<String>) -> bool {
        self.send(&Frame::Error {
            request,
            code,
            message: message.into(),
        })
        .await
    }
}

pub(crate) async fn serve(
    socket: TcpStream,
    server: Arc<ServerState>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let (mut reader, mut writer) = socket.into_split();
    let Ok(_slot) = Arc::clone(&server.connection_slots).try_acquire_owned() else {
        let frame = Frame::Error {
            request: 0,
            code: ErrorCode::Busy,
            message: format!(
                "the server serves at most {} connections",
                server.config.connections_max
            ),
        };
        let _ = writer.write_all(&frame.to_bytes()).await;
        return;
    };
    let mut buffer = FrameBuffer::new();
    let shaken = tokio::select! {
        shaken = handshake(&mut reader, &mut writer, &mut buffer, &server) => shaken,
        _ = stop.wait_for(|stopping| *stopping) => return,
    };
    let client = match shaken {
        Ok(client) => client,
        Err((code, message)) => {
            let frame = Frame::Error {
                request: 0,
                code,
                message,
            };
            let _ = writer.write_all(&frame.to_bytes()).await;
            return;
        }
    };
    let (frames, frames_receiver) = mpsc::channel(server.config.outgoing_frames_max);
    let outgoing = Arc::new(Outgoing {
        frames,
        read_budget: Arc::new(Semaphore::new(READ_BUDGET_BYTES)),
    });
    let writer_task = tokio::spawn(write_frames(writer, frames_receiver));
    let (acks, acks_receiver) = mpsc::channel(server.config.in_flight_per_connection_max);
    let ack_task = tokio::spawn(send_acks(acks_receiver, Arc::clone(&outgoing)));
    // When the server shuts down it aborts this task; the guard takes the
    // connection's other tasks down with it, so the socket closes and the
    // client reconnects instead of waiting on a half-open connection.
    let _guard = AbortOnDrop(vec![writer_task.abort_handle(), ack_task.abort_handle()]);
    let mut connection = Connection {
        server,
        client,
        outgoing,
        acks,
        subscriptions: HashMap::new(),
    };
    let stopped_by_server = tokio::select! {
        _ = connection.read_loop(reader, buffer) => false,
        _ = stop.wait_for(|stopping| *stopping) => true,
    };
    // Every task of the connection is gone before `serve` returns: they
    // hold the streams, and the server's shutdown closes the logs only once
    // nothing holds them.
    let subscriptions: Vec<JoinHandle<()>> = connection
        .subscriptions
        .drain()
        .map(|(_, (task, _))| task)
        .collect();
    drop(connection);
    for task in &subscriptions {
        task.abort();
    }
    for task in subscriptions {
        let _ = task.await;
    }
    if stopped_by_server {
        ack_task.abort();
        writer_task.abort();
    }
    // Otherwise the ack task drains what is queued (acks for appends
    // already logged) and the writer sends them, unless the socket is gone.
    let _ = ack_task.await;
    let _ = writer_task.await;
}

async fn read_some(
    reader: &mut OwnedReadHalf,
    scratch: &mut [u8],
    buffer: &mut FrameBuffer,
) -> std::io::Result<usize> {
    // Cancel-safe: bytes reach `buffer` only once the read has completed.
    let count = reader.read(scratch).await?;
    buffer.extend(&scratch[..count]);
    Ok(count)
}

async fn handshake(
    reader: &mut OwnedReadHalf,
    writer: &mut OwnedWriteHalf,
    buffer: &mut FrameBuffer,
    server: &ServerState,
) -> Result<u128, (ErrorCode, String)> {
    let bad = |message: String| (ErrorCode::BadFrame, message);
    let mut scratch = vec![0u8; 1024];
    let first = tokio::time::timeout(server.config.handshake_timeout, async {
        loop {
            match buffer.next_frame(1024) {
                Ok(Some(frame)) => return Ok(frame),
                Ok(None) => {}
                Err(error) => return Err(format!("bad handshake: {error}")),
            }
            match read_some(reader, &mut scratch, buffer).await {
                Ok(0) => return Err("connection closed during the handshake".to_string()),
                Ok(_) => {}
                Err(error) => return Err(error.to_string()),
            }
        }
    })
    .await
    .map_err(|_| bad("no hello within the handshake timeout".to_string()))?
    .map_err(bad)?;
    let Frame::Hello {
        version, client, ..
    } = first
    else {
        return Err(bad("the first frame must be a hello".into()));
    };
    if version != PROTOCOL_VERSION {
        let message = format!(
            "protocol version {version} is not supported; this server speaks {PROTOCOL_VERSION}"
        );
        return Err((ErrorCode::UnsupportedVersion, message));
    }
    let reply = Frame::HelloOk {
        version: PROTOCOL_VERSION,
        server: server.id,
        max_frame: server.config.frame_bytes_max() as u32,
    };
    writer
        .write_all(&reply.to_bytes())
        .await
        .map_err(|e| bad(e.to_string()))?;
    Ok(client)
}

/// Writes queued frames, coalescing whatever is queued into one write.
async fn write_frames(mut writer: OwnedWriteHalf, mut frames: mpsc::Receiver<Queued>) {
    let mut batch = Vec::new();
    let mut budgets = Vec::new();
    while let Some((first, budget)) = frames.recv().await {
        batch.clear();
        batch.extend_from_slice(&first);
        budgets.extend(budget);
        while batch.len() < 1024 * 1024 {
            match frames.try_recv() {
                Ok((more, budget)) => {
                    batch.extend_from_slice(&more);
                    budgets.extend(budget);
                }
                Err(_) => break,
            }
        }
        if writer.write_all(&batch).await.is_err() {
            return;
        }
        // Written: the records' bytes are the kernel's now.
        budgets.clear();
    }
    let _ = writer.shutdown().await;
}

async fn send_acks(mut acks: mpsc::Receiver<PendingAck>, outgoing: Arc<Outgoing>) {
    while let Some(pending) = acks.recv().await {
        let frame = match pending.stream.wait_ack(pending.version).await {
            Ok(level) => Frame::Ack {
                request: pending.request,
                stream: pending.stream.id,
                version: pending.version,
                epoch: pending.stream.epoch(),
                level,
                flags: if pending.duplicate {
                    proto::frame::ACK_FLAG_DUPLICATE
                } else {
                    0
                },
                replicas: 1,
                echo: pending.echo,
            },
            Err(failure) => Frame::Error {
                request: pending.request,
                code: ErrorCode::LogFailed,
                message: format!("not acknowledged: the stream's log failed: {failure}"),
            },
        };
        if !outgoing.send(&frame).await {
            return;
        }
    }
}

/// Aborts tasks when dropped.
struct AbortOnDrop(Vec<AbortHandle>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        for (task, _) in self.subscriptions.values() {
            task.abort();
        }
    }
}

struct Connection {
    server: Arc<ServerState>,
    client: u128,
    outgoing: Arc<Outgoing>,
    acks: mpsc::Sender<PendingAck>,
    /// Each subscription's task and its credit (records it may still push).
    subscriptions: HashMap<u64, (JoinHandle<()>, Arc<Semaphore>)>,
}

impl Connection {
    async fn read_loop(&mut self, mut reader: OwnedReadHalf, mut buffer: FrameBuffer) {
        let max_frame = self.server.config.frame_bytes_max();
        let mut scratch = vec![0u8; READ_BYTES];
        loop {
            loop {
                match buffer.next_frame(max_frame) {
                    Ok(Some(frame)) => {
                        if !self.handle(frame).await {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(error) => {
                        // A frame we cannot cut means we no longer know
                        // where the next one starts: say why and close.
                        self.outgoing
                            .error(0, ErrorCode::BadFrame, error.to_string())
                            .await;
                        return;
                    }
                }
            }
            match read_some(&mut reader, &mut scratch, &mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    /// The stream with `stream_id`, or, when there is none, the result of
    /// answering `request` with `UnknownStream` (`false`: the connection
    /// is gone).
    async fn find_stream(&self, request: u64, stream_id: u64) -> Result<Arc<Stream>, bool> {
        match self.server.stream_by_id(stream_id) {
            Some(stream) => Ok(stream),
            None => {
                let message = format!("no stream with id {stream_id}");
                Err(self
                    .outgoing
                    .error(request, ErrorCode::UnknownStream, message)
                    .await)
            }
        }
    }

    /// Handles one frame; `false` closes the connection.
    async fn handle(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::Append {
                request,
                stream,
                flags,
                session,
                sequence,
                low_water,
                key,
                payload,
            } => {
                let event = EventId {
                    client: self.client,
                    session,
                    sequence,
                };
                let echo = flags & proto::frame::APPEND_FLAG_ECHO != 0;
                self.append(request, stream, event, low_water, key, payload, echo)
                    .await
            }
            Frame::CreateStream {
                request,
                name,
                durability,
            } => {
                let server = Arc::clone(&self.server);
                let result =
                    tokio::task::spawn_blocking(move || server.create_stream(&name, durability))
                        .await;
                let reply = match result.expect("create_stream does not panic") {
                    Ok(info) => Frame::StreamInfo { request, info },
                    Err(error) => Frame::Error {
                        request,
                        code: error.code,
                        message: error.message,
                    },
                };
                self.outgoing.send(&reply).await
            }
            Frame::DeleteStream { request, name } => {
                let server = Arc::clone(&self.server);
                let result = tokio::task::spawn_blocking(move || server.delete_stream(&name)).await;
                let reply = match result.expect("delete_stream does not panic") {
                    Ok(()) => Frame::Ok { request },
                    Err(error) => Frame::Error {
                        request,
                        code: error.code,
                        message: error.message,
                    },
                };
                self.outgoing.send(&reply).await
            }
            Frame::OpenStream { request, name } => match self.server.stream_by_name(&name) {
                Some(stream) => {
                    self.outgoing
                        .send(&Frame::StreamInfo {
                            request,
                            info: stream.info(),
                        })
                        .await
                }
                None => {
                    self.outgoing
                        .error(
                            request,
                            ErrorCode::UnknownStream,
                            format!("no stream named {name:?}"),
                        )
                        .await
                }
            },
            Frame::ListStreams { request } => {
                let streams = self.server.streams().iter().map(|s| s.info()).collect();
                self.outgoing
                    .send(&Frame::StreamList { request, streams })
                    .await
            }
            Frame::Status { request } => {
                let json = self.server.status_json().to_string();
                self.outgoing
                    .send(&Frame::StatusReply { request, json })
                    .await
            }
            Frame::Fetch {
                request,
                stream,
                from,
                max_records,
                max_bytes,
            } => {
                self.fetch(request, stream, from, max_records, max_bytes)
                    .await
            }
            Frame::Subscribe {
                subscription,
                stream,
                from,
                credit,
            } => self.subscribe(subscription, stream, from, credit).await,
            Frame::Credit {
                subscription,
                credit,
            } => {
                if let Some((_, credits)) = self.subscriptions.get(&subscription) {
                    let limit = self.server.config.subscription_credit_max as usize;
                    let room = limit.saturating_sub(credits.available_permits());
                    credits.add_permits((credit as usize).min(room));
                }
                true
            }
            Frame::Unsubscribe { subscription } => {
                if let Some((task, _)) = self.subscriptions.remove(&subscription) {
                    task.abort();
                }
                self.outgoing
                    .send(&Frame::Ok {
                        request: subscription,
                    })
                    .await
            }
            other => {
                let message = format!("a client may not send {}", frame_name(&other));
                self.outgoing.error(0, ErrorCode::BadFrame, message).await;
                false
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn append(
        &mut self,
        request: u64,
        stream_id: u64,
        event: EventId,
        low_water: u64,
        key: Vec<u8>,
        payload: Vec<u8>,
        echo: bool,
    ) -> bool {
        let stream = match self.find_stream(request, stream_id).await {
            Ok(stream) => stream,
            Err(open) => return open,
        };
        let limit = self.server.config.message_bytes_max;
        if key.len() + payload.len() > limit {
            let message = format!(
                "message of {} bytes exceeds the limit of {limit} bytes",
                key.len() + payload.len()
            );
            return self
                .outgoing
                .error(request, ErrorCode::MessageTooLarge, message)
                .await;
        }
        match stream.append(event, low_water, &key, &payload).await {
            Ok(appended) => {
                let pending = PendingAck {
                    request,
                    stream,
                    version: appended.version,
                    duplicate: appended.duplicate,
                    echo: if echo { payload } else { Vec::new() },
                };
                self.acks.send(pending).await.is_ok()
            }
            Err(failure) => {
                let code = match &failure {
                    AppendFailure::Rejected(engine::Rejection::Retired { .. }) => {
                        ErrorCode::SequenceRetired
                    }
                    AppendFailure::Rejected(engine::Rejection::DedupeFull) => ErrorCode::Busy,
                    AppendFailure::Rejected(engine::Rejection::ZeroSequence) => {
                        ErrorCode::InvalidArgument
                    }
                    AppendFailure::TooLarge(_) => ErrorCode::MessageTooLarge,
                    AppendFailure::LogFailed(_) => ErrorCode::LogFailed,
                    AppendFailure::Deleted => ErrorCode::UnknownStream,
                };
                self.outgoing
                    .error(request, code, failure.to_string())
                    .await
            }
        }
    }

    async fn fetch(
        &mut self,
        request: u64,
        stream_id: u64,
        from: u64,
        max_records: u32,
        max_bytes: u32,
    ) -> bool {
        let stream = match self.find_stream(request, stream_id).await {
            Ok(stream) => stream,
            Err(open) => return open,
        };
        let max_bytes = (max_bytes as usize).min(self.server.config.read_batch_bytes_max);
        let Some(budget) = self.outgoing.reserve_read(max_bytes).await else {
            return false;
        };
        let mut records = Vec::new();
        let reply =
            match stream
                .log
                .read(from.max(1), max_records as usize, max_bytes, &mut records)
            {
                Ok(count) => Frame::Records {
                    request,
                    next: from.max(1) + count as u64,
                    count: count as u32,
                    records,
                },
                Err(error) => Frame::Error {
                    request,
                    code: subscription::read_error_code(&error),
                    message: error.to_string(),
                },
            };
        self.outgoing.send_read(&reply, budget).await
    }

    async fn subscribe(&mut self, id: u64, stream_id: u64, from: u64, credit: u32) -> bool {
        let stream = match self.find_stream(id, stream_id).await {
            Ok(stream) => stream,
            Err(open) => return open,
        };
        if self.subscriptions.contains_key(&id) {
            // Replacing a live subscription could interleave its queued
            // records with the new one's; ids must be fresh.
            let message = format!("subscription id {id} is in use on this connection");
            return self
                .outgoing
                .error(id, ErrorCode::InvalidArgument, message)
                .await;
        }
        let limit = self.server.config.subscriptions_per_connection_max;
        if self.subscriptions.len() >= limit {
            let message = format!("a connection may hold at most {limit} subscriptions");
            return self.outgoing.error(id, ErrorCode::Busy, message).await;
        }
        let credits = Arc::new(Semaphore::new(
            credit.min(self.server.config.subscription_credit_max) as usize,
        ));
        let task = tokio::spawn(subscription::run(
            id,
            stream,
            from.max(1),
            Arc::clone(&credits),
            Arc::clone(&self.outgoing),
            self.server.config.read_batch_bytes_max,
        ));
        self.subscriptions.insert(id, (task, credits));
        true
    }
}

fn frame_name(frame: &Frame) -> &'static str {
    match frame {
        Frame::HelloOk { .. } => "hello-ok",
        Frame::Hello { .. } => "a second hello",
        Frame::Ack { .. } => "ack",
        Frame::Records { .. } => "records",
        Frame::Deliver { .. } => "deliver",
        Frame::Error { .. } => "error",
        Frame::Ok { .. } => "ok",
        Frame::StreamInfo { .. } => "stream-info",
        Frame::StreamList { .. } => "stream-list",
        Frame::StatusReply { .. } => "status-reply",
        _ => "this frame",
    }
}
