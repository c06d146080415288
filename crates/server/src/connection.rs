//! One client connection: the handshake, the read loop that cuts frames and
//! dispatches them, the acknowledgement queue, and the way out (`Outgoing`).
//!
//! Messages go to the stream's replication state machine; what it says to
//! the client comes back through the server's router, which hands it to the
//! connection's `Outgoing` on the thread that produced it (a runtime
//! worker, or the log's I/O thread for acknowledgements after fdatasync).
//! `Outgoing::deliver` turns it into frames there: `Acked`, `Stamped` and
//! `Refused` for `Submit`, and the request-numbered `Ack` or `Error` for a
//! single-server `Append`. The frames go to the socket through a
//! `net::SharedWriter`: written at once by that thread when the connection
//! is idle, queued for the connection's flusher task otherwise. Appends
//! awaiting their answer are bounded by
//! `in_flight_per_connection_max`; when the bound is reached the read loop
//! stops reading, and TCP pushes back on the client.
//!
//! A connection whose first frame is `PeerHello` is a peer link: it carries
//! replication messages from that server to this one's streams.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use engine::replication::{AckRule, Bytes, Content, HybridMode, Msg, Protocol, ServerId};
use net::{Refused, SharedWriter};
use proto::{ErrorCode, EventId, Frame, FrameBuffer, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};

use crate::replication;
use crate::state::ServerState;
use crate::stream::{Stream, SubmitFailure};
use crate::subscription;

/// Bytes the read loop asks the socket for at a time.
const READ_BYTES: usize = 64 * 1024;
/// Bytes of records read for one connection and not yet written to it.
const READ_BUDGET_BYTES: usize = 4 * 1024 * 1024;

/// A single-server `Append` waiting for its answer, keyed by (stream,
/// session, sequence); it holds one of the connection's in-flight slots.
struct LegacyAppend {
    request: u64,
    level: proto::AckLevel,
    echo: Vec<u8>,
    _slot: OwnedSemaphorePermit,
}

type LegacyAppends = Arc<Mutex<HashMap<(u64, u64, u64), LegacyAppend>>>;

/// Who opened the connection.
enum Opener {
    Client(u128),
    Peer(ServerId),
    /// A control-plane connection from this server.
    Control,
}

/// What one connection's tasks, and the router, share: the way to its
/// socket.
pub(crate) struct Outgoing {
    /// The socket's write side; a queued frame of records holds its read
    /// budget until it is written.
    writer: Arc<SharedWriter<OwnedSemaphorePermit>>,
    /// Single-server `Append`s waiting for their answer.
    legacy: LegacyAppends,
    me: ServerId,
    /// Bytes of records read for this connection (fetches and
    /// subscriptions) and not yet written to its socket. A reader takes its
    /// batch's worth before it reads, so a client that stops reading holds
    /// at most this much of the server's memory, however many
    /// subscriptions it opens.
    read_budget: Arc<Semaphore>,
}

impl Outgoing {
    pub(crate) async fn send(&self, frame: &Frame) -> bool {
        self.writer.send(frame.to_bytes(), None).await.is_ok()
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
        self.writer
            .send(frame.to_bytes(), Some(budget))
            .await
            .is_ok()
    }

    /// A stream's messages for this client, from whichever thread produced
    /// them: every answer leaves in one write (or one queued send). `false`
    /// when the connection could not take them (closed, or its queue full:
    /// the client resends what matters).
    pub(crate) fn deliver(&self, stream: u64, msgs: Vec<Msg>) -> bool {
        // An append is registered before its stream can answer it, so an
        // empty table means no answer here is a legacy one.
        let any_legacy = !self.legacy.lock().expect("legacy lock").is_empty();
        let mut frames = replication::ClientFrames::default();
        for msg in msgs {
            if any_legacy {
                if let Some(answers) = legacy_answers(&self.legacy, self.me, stream, &msg) {
                    for frame in answers {
                        frames.push(frame);
                    }
                    continue;
                }
            }
            if let Some(frame) = replication::client_frame(self.me, stream, msg) {
                frames.push(frame);
            }
        }
        let bytes = frames.finish();
        bytes.is_empty() || self.writer.try_send(bytes, None).is_ok()
    }

    /// A stream's log failed: every append waiting on it gets the failure.
    pub(crate) fn fail_stream(&self, stream: u64, failure: &str) {
        let failed: Vec<LegacyAppend> = {
            let mut map = self.legacy.lock().expect("legacy lock");
            let keys: Vec<_> = map.keys().filter(|k| k.0 == stream).copied().collect();
            keys.iter().filter_map(|k| map.remove(k)).collect()
        };
        for append in failed {
            let frame = Frame::Error {
                request: append.request,
                code: ErrorCode::LogFailed,
                message: format!("not acknowledged: the stream's log failed: {failure}"),
            };
            if let Err(Refused::Closed) = self.writer.try_send(frame.to_bytes(), None) {
                return;
            }
        }
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
        Ok(Opener::Client(client)) => client,
        Ok(Opener::Control) => {
            let Some(control) = server.control.get().cloned() else {
                return;
            };
            let Ok(socket) = reader.reunite(writer) else {
                return;
            };
            let rest = buffer.take_rest();
            tokio::select! {
                _ = control.serve_with(socket, rest) => {}
                _ = stop.wait_for(|stopping| *stopping) => {}
            }
            return;
        }
        Ok(Opener::Peer(from)) => {
            drop(writer);
            tokio::select! {
                _ = serve_peer(from, reader, buffer, &server) => {}
                _ = stop.wait_for(|stopping| *stopping) => {}
            }
            return;
        }
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
    let writer = Arc::new(SharedWriter::new(writer, server.config.outgoing_frames_max));
    let outgoing = Arc::new(Outgoing {
        writer: Arc::clone(&writer),
        legacy: Arc::default(),
        me: server.config.cluster.me,
        read_budget: Arc::new(Semaphore::new(READ_BUDGET_BYTES)),
    });
    let writer_task = tokio::spawn({
        let writer = Arc::clone(&writer);
        async move { writer.run().await }
    });
    let in_flight = server.config.in_flight_per_connection_max;
    let registration = server.router.register(client, Arc::clone(&outgoing));
    // Sender-based logging: a restarted primary asks each client that
    // connects for the copies it holds.
    for stream in server.streams() {
        if let Some(note) = stream.checkpoint_note() {
            server.router.send_client(client, stream.id, vec![note]);
        }
    }
    // When the server shuts down it aborts this task; the guard takes the
    // connection's writer down with it, so the socket closes and the
    // client reconnects instead of waiting on a half-open connection.
    let _guard = AbortOnDrop(vec![writer_task.abort_handle()]);
    let mut connection = Connection {
        server: Arc::clone(&server),
        client,
        outgoing,
        batch: None,
        legacy_slots: Arc::new(Semaphore::new(in_flight)),
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
    let legacy_slots = Arc::clone(&connection.legacy_slots);
    drop(connection);
    for task in &subscriptions {
        task.abort();
    }
    for task in subscriptions {
        let _ = task.await;
    }
    if !stopped_by_server {
        // Let the answers to appends already taken arrive (bounded wait):
        // a client that closes after its last append still gets its ack.
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            legacy_slots.acquire_many(in_flight as u32),
        )
        .await;
    }
    server.router.unregister(client, registration);
    // What is queued is written, then the flusher ends; the socket's write
    // side shuts once the last holder of the writer lets go.
    writer.close();
    if stopped_by_server {
        writer_task.abort();
    }
    let _ = writer_task.await;
}

/// Feeds a peer's replication messages to this server's streams.
async fn serve_peer(
    from: ServerId,
    mut reader: OwnedReadHalf,
    mut buffer: FrameBuffer,
    server: &Arc<ServerState>,
) {
    let max_frame = server.config.peer_frame_bytes_max();
    let mut scratch = vec![0u8; READ_BYTES];
    // Messages for one stream from one read are handed over in one step.
    let mut batch: Vec<Msg> = Vec::new();
    let mut batch_stream: Option<Arc<Stream>> = None;
    loop {
        loop {
            match buffer.next_frame(max_frame) {
                Ok(Some(Frame::Peer { stream, message })) => {
                    if batch_stream.as_ref().is_some_and(|s| s.id != stream) {
                        if let Some(done) = batch_stream.take() {
                            done.on_peer_many(from, std::mem::take(&mut batch));
                        }
                    }
                    if batch_stream.is_none() {
                        batch_stream = server.stream_by_id(stream);
                    }
                    if batch_stream.is_some() {
                        batch.push(replication::peer_msg(message));
                    }
                }
                Ok(Some(_)) | Err(_) => {
                    eprintln!("stamplog: closing the link from server {from}: unexpected frame");
                    return;
                }
                Ok(None) => break,
            }
        }
        if let Some(done) = batch_stream.take() {
            done.on_peer_many(from, std::mem::take(&mut batch));
        }
        match read_some(&mut reader, &mut scratch, &mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
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
) -> Result<Opener, (ErrorCode, String)> {
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
    let (version, opener) = match first {
        Frame::Hello { client: 0, .. } => {
            return Err((
                ErrorCode::InvalidArgument,
                "client id 0 is reserved (void records); choose another".into(),
            ))
        }
        Frame::Hello {
            version, client, ..
        } => (version, Opener::Client(client)),
        Frame::PeerHello {
            version,
            from,
            incarnation,
        } => {
            // A configured peer, or a server that joined since (the
            // control plane's members).
            let known = server
                .config
                .cluster
                .peers
                .iter()
                .any(|peer| peer.id == from)
                || server.router.knows_peer(from)
                || server
                    .control_state()
                    .is_some_and(|state| state.members.contains_key(&from));
            if !known {
                return Err(bad(format!("server {from} is not in this cluster")));
            }
            // Shunning: a process that has left the view (its server has
            // joined again since, as a newer member) is not heard.
            if let Some(state) = server.control_state() {
                let current = state.members.get(&from).map(|m| m.join_view);
                if incarnation == 0 || current.is_some_and(|view| incarnation < view) {
                    return Err(bad(format!(
                        "server {from} joined in view {incarnation} is no longer a member"
                    )));
                }
            }
            server.router.note_peer_incarnation(from, incarnation);
            (version, Opener::Peer(from))
        }
        Frame::ControlHello { version, from } => {
            // Any server may speak to the control plane: one that is not
            // a member yet joins this way (it asks to be added as a
            // voter, then proposes its `Join`).
            if server.control.get().is_none() {
                return Err(bad(format!(
                    "server {from} asked for the control plane, and this server runs none"
                )));
            }
            (version, Opener::Control)
        }
        _ => return Err(bad("the first frame must be a hello".into())),
    };
    if version != PROTOCOL_VERSION {
        let message = format!(
            "protocol version {version} is not supported; this server speaks {PROTOCOL_VERSION}"
        );
        return Err((ErrorCode::UnsupportedVersion, message));
    }
    if let Opener::Peer(_) | Opener::Control = opener {
        return Ok(opener);
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
    Ok(opener)
}

/// The answers to `msg` when some of its messages answer single-server
/// `Append`s: each of those as its request-numbered `Ack` (or the
/// refusal's `Error`), any other message of an ack run as its own
/// `Acked`. `None` when none of its messages is a legacy append.
fn legacy_answers(
    legacy: &LegacyAppends,
    me: ServerId,
    stream: u64,
    msg: &Msg,
) -> Option<Vec<Frame>> {
    let mut appends = legacy.lock().expect("legacy lock");
    let mut take = |event: EventId| appends.remove(&(stream, event.session, event.sequence));
    match msg {
        &Msg::Ack {
            epoch,
            duplicate,
            hint,
            ..
        } => {
            let mut any = false;
            let answers: Vec<Frame> = msg
                .acked()
                .filter_map(|(event, version)| {
                    let Some(append) = take(event) else {
                        let single = Msg::Ack {
                            event,
                            version,
                            epoch,
                            duplicate,
                            hint,
                            count: 1,
                        };
                        return replication::client_frame(me, stream, single);
                    };
                    any = true;
                    Some(Frame::Ack {
                        request: append.request,
                        stream,
                        version,
                        epoch,
                        level: append.level,
                        flags: if duplicate {
                            proto::frame::ACK_FLAG_DUPLICATE
                        } else {
                            0
                        },
                        replicas: 1,
                        echo: append.echo,
                    })
                })
                .collect();
            any.then_some(answers)
        }
        Msg::Refused { event, refusal } => {
            let append = take(*event)?;
            Some(vec![Frame::Error {
                request: append.request,
                code: refusal.code(),
                message: refusal.to_string(),
            }])
        }
        _ => None,
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

/// Submits handed to a stream in one step at most.
const SUBMIT_BATCH_MAX: usize = 1024;

struct Connection {
    server: Arc<ServerState>,
    client: u128,
    /// Submits gathered from the bytes read so far, for one stream.
    batch: Option<(Arc<Stream>, Vec<Msg>)>,
    outgoing: Arc<Outgoing>,
    legacy_slots: Arc<Semaphore>,
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
                        // Submits are gathered and handed to their stream
                        // together; anything else first hands over what
                        // was gathered, so order is kept.
                        if !matches!(frame, Frame::Submit { .. }) && !self.flush_batch().await {
                            return;
                        }
                        if !self.handle(frame).await {
                            return;
                        }
                    }
                    Ok(None) => {
                        if !self.flush_batch().await {
                            return;
                        }
                        break;
                    }
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
                protocol,
                replicas,
                commit_interval_ms,
                retention,
            } => {
                let protocol = if protocol == 0 {
                    Some(Protocol::OneHopAckClient)
                } else {
                    Protocol::from_code(protocol)
                };
                let Some(protocol) = protocol else {
                    let message = "unknown protocol code".to_string();
                    return self
                        .outgoing
                        .error(request, ErrorCode::InvalidArgument, message)
                        .await;
                };
                let result = self
                    .server
                    .create_replicated(
                        &name,
                        durability,
                        protocol,
                        replicas as usize,
                        (commit_interval_ms, retention),
                    )
                    .await;
                let reply = match result {
                    Ok(info) => Frame::StreamInfo { request, info },
                    Err(error) => Frame::Error {
                        request,
                        code: error.code,
                        message: error.message,
                    },
                };
                self.outgoing.send(&reply).await
            }
            Frame::CreateReplica {
                request,
                info,
                retention,
            } => {
                let server = Arc::clone(&self.server);
                let result =
                    tokio::task::spawn_blocking(move || server.create_replica(&info, retention))
                        .await;
                let reply = match result.expect("create_replica does not panic") {
                    Ok(info) => Frame::StreamInfo { request, info },
                    Err(error) => Frame::Error {
                        request,
                        code: error.code,
                        message: error.message,
                    },
                };
                self.outgoing.send(&reply).await
            }
            Frame::Submit {
                stream,
                kind,
                version,
                epoch,
                session,
                sequence,
                low_water,
                key,
                payload,
            } => {
                self.submit(
                    stream, kind, version, epoch, session, sequence, low_water, key, payload,
                )
                .await
            }
            Frame::DeleteStream { request, name } => {
                let result = self.server.delete_replicated(&name).await;
                self.outgoing.send(&done_or_error(request, result)).await
            }
            Frame::SetRequirement {
                request,
                name,
                min_in_sync,
                action,
                block_ms,
                roles,
            } => {
                let requirement = match action {
                    0 => Ok(None),
                    1 => Ok(Some(control::LossAction::ReadOnly)),
                    2 => Ok(Some(control::LossAction::Block {
                        timeout_ms: u64::from(block_ms),
                    })),
                    3 => Ok(Some(control::LossAction::Reconnect)),
                    other => Err(format!("unknown loss action {other}")),
                }
                .map(|action| {
                    action.map(|action| control::Requirement {
                        roles,
                        min_in_sync: usize::from(min_in_sync),
                        action,
                    })
                });
                let result = match requirement {
                    Ok(requirement) => self.server.set_requirement(&name, requirement).await,
                    Err(problem) => Err(crate::state::StreamError {
                        code: ErrorCode::InvalidArgument,
                        message: problem,
                    }),
                };
                self.outgoing.send(&done_or_error(request, result)).await
            }
            Frame::RetireServer { request, server } => {
                let result = self.server.retire_server(server).await;
                self.outgoing.send(&done_or_error(request, result)).await
            }
            Frame::OpenStream { request, name } if !self.server.is_ready() => {
                let message = format!(
                    "this server is joining the cluster; {name:?} is not open here yet: retry"
                );
                self.outgoing.error(request, ErrorCode::Busy, message).await
            }
            Frame::OpenStream { request, name } => match self.server.stream_by_name(&name) {
                Some(stream) => {
                    let info = self.server.stream_info(&stream);
                    self.outgoing
                        .send(&Frame::StreamInfo { request, info })
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
                let streams = self
                    .server
                    .streams()
                    .iter()
                    .map(|s| self.server.stream_info(s))
                    .collect();
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
        // `Append` is answered by the primary alone: it serves streams whose
        // ack rule the primary's answer meets.
        let rule = stream.protocol.ack_rule(HybridMode::ServerSync);
        let primary_answers = matches!(rule, AckRule::PrimaryAfterAll | AckRule::PrimaryOnly)
            || stream.placement().replicas.len() == 1;
        if stream.is_sender_logged() {
            let message = format!(
                "stream {:?} uses sender-based logging, which needs the client to confirm each version and keep its messages; send with Submit (the client library's replicated producer)",
                stream.name
            );
            return self
                .outgoing
                .error(request, ErrorCode::InvalidArgument, message)
                .await;
        }
        if !primary_answers || stream.protocol == Protocol::Unversioned {
            let message = format!(
                "stream {:?} uses {} over {} replicas; send with Submit (the client library's replicated producer)",
                stream.name,
                stream.protocol,
                stream.placement().replicas.len()
            );
            return self
                .outgoing
                .error(request, ErrorCode::InvalidArgument, message)
                .await;
        }
        let Ok(slot) = Arc::clone(&self.legacy_slots).acquire_owned().await else {
            return false;
        };
        let level = if stream.durability == proto::DurabilityConfig::Sync {
            proto::AckLevel::Synced
        } else {
            proto::AckLevel::Memory
        };
        let echo = if echo { payload.clone() } else { Vec::new() };
        self.outgoing.legacy.lock().expect("legacy lock").insert(
            (stream.id, event.session, event.sequence),
            LegacyAppend {
                request,
                level,
                echo,
                _slot: slot,
            },
        );
        let content = Content {
            event,
            low_water,
            key: Bytes::from(key),
            payload: Bytes::from(payload),
            resent: false,
        };
        match stream.submit(self.client, Msg::Write(content)) {
            Ok(()) => true,
            Err(failure) => {
                self.outgoing.legacy.lock().expect("legacy lock").remove(&(
                    stream.id,
                    event.session,
                    event.sequence,
                ));
                self.outgoing
                    .error(request, submit_failure_code(&failure), failure.to_string())
                    .await
            }
        }
    }

    /// A replication message (`Submit`).
    #[allow(clippy::too_many_arguments)]
    async fn submit(
        &mut self,
        stream_id: u64,
        kind: u8,
        version: u64,
        epoch: u64,
        session: u64,
        sequence: u64,
        low_water: u64,
        key: Vec<u8>,
        payload: Vec<u8>,
    ) -> bool {
        let refuse = |code: ErrorCode, message: String| Frame::Refused {
            stream: stream_id,
            session,
            sequence,
            code,
            message,
        };
        let limit = self.server.config.message_bytes_max;
        if key.len() + payload.len() > limit {
            let message = format!(
                "message of {} bytes exceeds the limit of {limit} bytes",
                key.len() + payload.len()
            );
            return self
                .outgoing
                .send(&refuse(ErrorCode::MessageTooLarge, message))
                .await;
        }
        let Some(stream) = self.server.stream_by_id(stream_id) else {
            // A replica this server opens or creates in a moment (it is
            // joining, or the control plane just placed the stream here)
            // is worth a retry; any other id is not.
            let (code, message) = if self.server.expects_stream(stream_id) {
                (
                    ErrorCode::Busy,
                    format!("stream {stream_id} is not open on this server yet; retry"),
                )
            } else {
                (
                    ErrorCode::UnknownStream,
                    format!("no stream with id {stream_id}"),
                )
            };
            return self.outgoing.send(&refuse(code, message)).await;
        };
        let Some(msg) = replication::submit_msg(
            self.client,
            kind,
            version,
            epoch,
            session,
            sequence,
            low_water,
            key,
            payload,
        ) else {
            let message = format!("unknown submit kind {kind}");
            self.outgoing.error(0, ErrorCode::BadFrame, message).await;
            return false;
        };
        let same = self
            .batch
            .as_ref()
            .is_some_and(|(batched, _)| Arc::ptr_eq(batched, &stream));
        if !same && !self.flush_batch().await {
            return false;
        }
        let (_, messages) = self.batch.get_or_insert_with(|| (stream, Vec::new()));
        messages.push(msg);
        if messages.len() >= SUBMIT_BATCH_MAX {
            return self.flush_batch().await;
        }
        true
    }

    /// Hands the gathered submits to their stream in one step.
    async fn flush_batch(&mut self) -> bool {
        let Some((stream, messages)) = self.batch.take() else {
            return true;
        };
        let Err((failure, messages)) = stream.submit_many(self.client, messages) else {
            return true;
        };
        // `reconnect`: the connection closes after the refusals; the
        // client comes back and retries.
        let stay = !matches!(failure, SubmitFailure::Reconnect(_));
        for msg in messages {
            let Some(event) = replication::event_of(&msg) else {
                continue;
            };
            let frame = Frame::Refused {
                stream: stream.id,
                session: event.session,
                sequence: event.sequence,
                code: submit_failure_code(&failure),
                message: failure.to_string(),
            };
            if !self.outgoing.send(&frame).await {
                return false;
            }
        }
        stay
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
        let visible = stream.visible_version();
        let from = from.max(1);
        let max_records = (max_records as u64).min((visible + 1).saturating_sub(from)) as usize;
        let reply = match stream.log.read(from, max_records, max_bytes, &mut records) {
            Ok(count) => {
                // Void versions hold no message: readers never see them.
                let (records, kept) = subscription::strip_voids(records, count as u32);
                Frame::Records {
                    request,
                    next: from + count as u64,
                    count: kept,
                    records,
                }
            }
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

/// `Ok`, or the error with its code, in answer to `request`.
fn done_or_error(request: u64, result: Result<(), crate::state::StreamError>) -> Frame {
    match result {
        Ok(()) => Frame::Ok { request },
        Err(error) => Frame::Error {
            request,
            code: error.code,
            message: error.message,
        },
    }
}

fn submit_failure_code(failure: &SubmitFailure) -> ErrorCode {
    match failure {
        SubmitFailure::Deleted => ErrorCode::UnknownStream,
        SubmitFailure::LogFailed(_) => ErrorCode::LogFailed,
        SubmitFailure::Busy | SubmitFailure::Blocked(_) | SubmitFailure::Reconnect(_) => {
            ErrorCode::Busy
        }
        SubmitFailure::ReadOnly(_) => ErrorCode::ReadOnly,
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
