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
//! stops reading, and TCP pushes back on the client. Replicated writes
//! (`Submit`) in flight are bounded by the same count and by
//! `bytes_in_flight_per_connection_max`; past either a write is refused
//! with `Busy` (`WritesInFlight`), which the client retries.
//!
//! A connection whose first frame is `PeerHello` is a peer link: it carries
//! replication messages from that server to this one's streams. A client's
//! `Hello` carries its token, which the handshake checks against the token
//! file (`auth`); every request is then checked against the token's rights,
//! and a refused one answered with `Unauthorized`.

mod admin;
mod forward;
mod peer;
mod read;
mod write;

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use engine::replication::{AckRule, Bytes, Content, HybridMode, Msg, Protocol, ServerId};
use net::tls::rustls::pki_types::CertificateDer;
use net::SharedWriter;
use net::{Link, LinkReader, LinkWriter};
use proto::{ErrorCode, EventId, Frame, FrameBuffer, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::{watch, Semaphore};
use tokio::task::{AbortHandle, JoinHandle};

use crate::auth::{Access, Principal, Right, Unauthorized};
use crate::outgoing::{LegacyAppend, Outgoing, READ_BUDGET_BYTES};
use crate::state::ServerState;
use crate::stream::{Stream, SubmitFailure};
use crate::subscription;
use crate::wire;

/// Bytes the read loop asks the socket for at a time.
const READ_BYTES: usize = 64 * 1024;
/// How long a hello with a wrong token waits for its refusal: guessing
/// tokens costs a connection this long each.
const LOGIN_FAILURE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// Who opened the connection.
enum Opener {
    /// A client (or a server speaking as one, `ServerHello`), with who it
    /// speaks for.
    Client(u128, Principal),
    Peer(ServerId),
    /// A control-plane connection from this server.
    Control,
}

pub(crate) async fn serve(
    socket: TcpStream,
    server: Arc<ServerState>,
    mut stop: watch::Receiver<bool>,
) {
    let _ = socket.set_nodelay(true);
    let address = socket.peer_addr().ok().map(|a| a.ip());
    let Some(link) = accept(socket, &server, &mut stop).await else {
        return;
    };
    let chain: Option<Vec<CertificateDer<'static>>> =
        link.peer_certificates().map(|chain| chain.to_vec());
    let (mut reader, mut writer) = link.into_split();
    let Ok(_slot) = Arc::clone(&server.connection_slots).try_acquire_owned() else {
        let message = format!(
            "the server serves at most {} connections",
            server.config.connections_max
        );
        refuse(&mut writer, ErrorCode::Busy, message).await;
        return;
    };
    let _address_slot = match address.map(|ip| AddressSlot::take(&server, ip)) {
        Some(Err(TooMany(message))) => {
            refuse(&mut writer, ErrorCode::Busy, message).await;
            return;
        }
        Some(Ok(slot)) => Some(slot),
        None => None,
    };
    let mut buffer = FrameBuffer::new();
    let shaken = tokio::select! {
        shaken = handshake((&mut reader, &mut writer), &mut buffer, &server, chain.as_deref()) => shaken,
        _ = stop.wait_for(|stopping| *stopping) => return,
    };
    match shaken {
        Ok(Opener::Client(client, principal)) => {
            let access = Access::new(principal, server.tokens.clone());
            serve_client((client, access), (reader, writer, buffer), server, stop).await
        }
        Ok(Opener::Control) => {
            let Some(control) = server.control.get().cloned() else {
                return;
            };
            let Some(socket) = reader.reunite(writer) else {
                return;
            };
            let rest = buffer.take_rest();
            tokio::select! {
                _ = control.serve_with(socket, rest) => {}
                _ = stop.wait_for(|stopping| *stopping) => {}
            }
        }
        Ok(Opener::Peer(from)) => {
            let Some(link) = reader.reunite(writer) else {
                return;
            };
            peer::serve_peer(from, link, buffer, &server, stop).await
        }
        Err((code, message)) => refuse(&mut writer, code, message).await,
    }
}

/// The connection as a link: with TLS, once its TLS handshake is done
/// (everything, even a refusal, is then said inside TLS: a client that
/// does not speak it gets nothing but a closed connection). `None`: the
/// handshake failed, timed out, or the server stops.
async fn accept(
    socket: TcpStream,
    server: &ServerState,
    stop: &mut watch::Receiver<bool>,
) -> Option<Link> {
    let Some(acceptor) = &server.acceptor else {
        return Some(Link::Plain(socket));
    };
    let address = socket.peer_addr().ok();
    let accepted = tokio::select! {
        accepted = tokio::time::timeout(server.config.handshake_timeout, acceptor.accept(socket)) => accepted,
        _ = stop.wait_for(|stopping| *stopping) => return None,
    };
    match accepted {
        Ok(Ok(link)) => Some(link),
        Ok(Err(error)) => {
            server.tls_refused.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(?address, "TLS handshake failed: {error}");
            None
        }
        Err(_) => None,
    }
}

/// Answers a connection that is not served with one error frame.
async fn refuse(writer: &mut LinkWriter, code: ErrorCode, message: String) {
    let frame = Frame::Error {
        request: 0,
        code,
        message,
    };
    let _ = writer.write_all(&frame.to_bytes()).await;
    let _ = writer.flush().await;
}

/// Serves a client after its handshake, until it closes or the server
/// stops; every task of the connection is gone when it returns.
async fn serve_client(
    (client, access): (u128, Access),
    (reader, writer, buffer): (LinkReader, LinkWriter, FrameBuffer),
    server: Arc<ServerState>,
    mut stop: watch::Receiver<bool>,
) {
    let writer = Arc::new(SharedWriter::new(writer, server.config.outgoing_frames_max));
    let outgoing = Arc::new(Outgoing {
        writer: Arc::clone(&writer),
        legacy: Arc::default(),
        me: server.config.cluster.me,
        read_budget: Arc::new(Semaphore::new(READ_BUDGET_BYTES)),
        writes: Mutex::default(),
        metrics: server.metrics.clone(),
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
        registration,
        declared: HashSet::new(),
        access,
        outgoing,
        batch: None,
        legacy_slots: Arc::new(Semaphore::new(in_flight)),
        subscriptions: HashMap::new(),
        forwarder: None,
    };
    let stopped_by_server = tokio::select! {
        _ = connection.read_loop(reader, buffer) => false,
        _ = stop.wait_for(|stopping| *stopping) => true,
    };
    connection.close(stopped_by_server).await;
    server.router.unregister(client, registration);
    // What is queued is written, then the flusher ends; the socket's write
    // side shuts once the last holder of the writer lets go.
    writer.close();
    if stopped_by_server {
        writer_task.abort();
    }
    let _ = writer_task.await;
}

async fn handshake(
    (reader, writer): (&mut LinkReader, &mut LinkWriter),
    buffer: &mut FrameBuffer,
    server: &ServerState,
    chain: Option<&[CertificateDer<'static>]>,
) -> Result<Opener, (ErrorCode, String)> {
    let bad = |message: String| (ErrorCode::BadFrame, message);
    let first = tokio::time::timeout(server.config.handshake_timeout, first_frame(reader, buffer))
        .await
        .map_err(|_| bad("no hello within the handshake timeout".to_string()))?
        .map_err(|e| bad(e.to_string()))?;
    let (version, opener) = opener_of(first, server, chain).await?;
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
    writer.flush().await.map_err(|e| bad(e.to_string()))?;
    Ok(opener)
}

/// Who opened the connection, by its first frame, and the protocol
/// version it speaks; `Err` is the refusal to answer with.
async fn opener_of(
    first: Frame,
    server: &ServerState,
    chain: Option<&[CertificateDer<'static>]>,
) -> Result<(u16, Opener), (ErrorCode, String)> {
    let bad = |message: String| (ErrorCode::BadFrame, message);
    Ok(match first {
        Frame::Hello { client: 0, .. } => {
            return Err((
                ErrorCode::InvalidArgument,
                "client id 0 is reserved (void records); choose another".into(),
            ))
        }
        Frame::Hello {
            version,
            client,
            token,
        } => (
            version,
            Opener::Client(client, log_in(server, &token).await?),
        ),
        Frame::ServerHello {
            version,
            from,
            client,
        } => {
            certified(server, chain, from)?;
            admit_server(server, from).map_err(|e| bad(e.to_string()))?;
            (version, Opener::Client(client, Principal::Server(from)))
        }
        Frame::PeerHello {
            version,
            from,
            incarnation,
        } => {
            certified(server, chain, from)?;
            admit_peer(server, from, incarnation).map_err(|e| bad(e.to_string()))?;
            (version, Opener::Peer(from))
        }
        Frame::ControlHello { version, from } => {
            certified(server, chain, from)?;
            // Any server may speak to the control plane: one that is not
            // a member yet joins this way (it asks to be added as a
            // voter, then proposes its `Join`). A server that is starting
            // serves it in a moment: its peers, starting too, ask for
            // votes before it is up.
            if !control_started(server).await {
                return Err(bad(format!(
                    "server {from} asked for the control plane, and this server runs none"
                )));
            }
            (version, Opener::Control)
        }
        _ => return Err(bad("the first frame must be a hello".into())),
    })
}

/// How long a control connection waits for this server's control plane
/// to start before it is refused.
const CONTROL_START_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Whether this server runs a control plane, waiting up to
/// `CONTROL_START_WAIT` for one that is starting.
async fn control_started(server: &ServerState) -> bool {
    if !server.config.cluster.is_multi() {
        // A server alone never runs one.
        return server.control.get().is_some();
    }
    let deadline = tokio::time::Instant::now() + CONTROL_START_WAIT;
    while server.control.get().is_none() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    true
}

/// Why a connection's first frame was not taken; answered with one
/// `BadFrame` error.
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("bad handshake: {0}")]
    Frame(#[from] proto::FrameError),
    #[error("connection closed during the handshake")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("server {0} is not in this cluster")]
    UnknownPeer(ServerId),
    #[error("server {from} joined in view {incarnation} is no longer a member")]
    Departed { from: ServerId, incarnation: u64 },
}

/// The connection's first frame, read within the handshake's bounds.
async fn first_frame(
    reader: &mut LinkReader,
    buffer: &mut FrameBuffer,
) -> Result<Frame, HandshakeError> {
    loop {
        match buffer.next_frame(1024) {
            Ok(Some(frame)) => return Ok(frame),
            Ok(None) => {}
            Err(error) => return Err(HandshakeError::Frame(error)),
        }
        match net::read_into(reader, buffer.receiving(), 1024).await {
            Ok(0) => return Err(HandshakeError::Closed),
            Ok(_) => {}
            Err(error) => return Err(HandshakeError::Io(error)),
        }
    }
}

/// With TLS, whether the connection's certificate is the one the cluster's
/// CA issued to server `from`, as a hello that speaks for a server must
/// present; without TLS a server is taken at its word (a trusted network).
fn certified(
    server: &ServerState,
    chain: Option<&[CertificateDer<'static>]>,
    from: ServerId,
) -> Result<(), (ErrorCode, String)> {
    let Some(acceptor) = &server.acceptor else {
        return Ok(());
    };
    if acceptor.names_server(chain, from) {
        return Ok(());
    }
    server.tls_refused.fetch_add(1, Ordering::Relaxed);
    tracing::warn!("refused a connection that claimed to be server {from} without its certificate");
    Err((
        ErrorCode::Unauthorized,
        format!(
            "a connection that speaks for server {from} must present the certificate the cluster's CA issued to {}",
            net::tls::server_name(from)
        ),
    ))
}

/// Who a client's `Hello` speaks for: anyone without a token file, else
/// the token's holder. A token the file does not hold is refused after
/// [`LOGIN_FAILURE_DELAY`], counted and logged (never the token itself).
async fn log_in(server: &ServerState, token: &str) -> Result<Principal, (ErrorCode, String)> {
    let Some(tokens) = &server.tokens else {
        return Ok(Principal::Open);
    };
    let (_, file) = tokens.current();
    if let Some(entry) = file.find(token) {
        return Ok(Principal::Token(entry.name.clone()));
    }
    server.logins_refused.fetch_add(1, Ordering::Relaxed);
    let message = if token.is_empty() {
        tracing::warn!("refused a client without a token");
        "this server needs a token (--token or STAMPLOG_TOKEN)".to_string()
    } else {
        tracing::warn!("refused a client with an unknown or revoked token");
        "the token is not known to this server (wrong, or revoked)".to_string()
    };
    tokio::time::sleep(LOGIN_FAILURE_DELAY).await;
    Err((ErrorCode::Unauthorized, message))
}

/// Whether `from` may speak as a server of the cluster on a client-style
/// link (`ServerHello`): a server this one knows.
fn admit_server(server: &ServerState, from: ServerId) -> Result<(), HandshakeError> {
    if is_known_server(server, from) {
        Ok(())
    } else {
        Err(HandshakeError::UnknownPeer(from))
    }
}

fn is_known_server(server: &ServerState, from: ServerId) -> bool {
    server
        .config
        .cluster
        .peers
        .iter()
        .any(|peer| peer.id == from)
        || server.router.knows_peer(from)
        || server
            .control_state()
            .is_some_and(|state| state.members.contains_key(&from))
}

/// One connection too many from an address: the refusal's message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TooMany(String);

/// A connection's place in its address's count, given back when dropped.
struct AddressSlot {
    server: Arc<ServerState>,
    ip: IpAddr,
}

impl AddressSlot {
    /// Counts a connection from `ip`, or says why it is one too many.
    fn take(server: &Arc<ServerState>, ip: IpAddr) -> Result<AddressSlot, TooMany> {
        let limit = server.config.connections_per_address_max;
        let mut counts = server.per_address.lock().expect("address lock poisoned");
        let count = counts.entry(ip).or_default();
        if *count >= limit {
            return Err(TooMany(format!(
                "the server serves at most {limit} connections from one address ({ip})"
            )));
        }
        *count += 1;
        Ok(AddressSlot {
            server: Arc::clone(server),
            ip,
        })
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        let mut counts = self
            .server
            .per_address
            .lock()
            .expect("address lock poisoned");
        if let Some(count) = counts.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// Whether `from` may open a peer link as `incarnation`: a configured
/// peer, or a server that joined since (the control plane's members),
/// and not a process that has left the view (shunning: its server has
/// joined again since, as a newer member, and is not heard as the old).
fn admit_peer(
    server: &ServerState,
    from: ServerId,
    incarnation: u64,
) -> Result<(), HandshakeError> {
    if !is_known_server(server, from) {
        return Err(HandshakeError::UnknownPeer(from));
    }
    if let Some(state) = server.control_state() {
        let current = state.members.get(&from).map(|m| m.join_view);
        if incarnation == 0 || current.is_some_and(|view| incarnation < view) {
            return Err(HandshakeError::Departed { from, incarnation });
        }
    }
    server.router.note_peer_incarnation(from, incarnation);
    Ok(())
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
    /// The connection's number in the router.
    registration: u64,
    /// The streams this connection opened or wrote to, as told to the
    /// router (`Router::declare`): their messages for the client come
    /// here, those of other streams go to the client's other connections.
    declared: HashSet<u64>,
    /// Who the connection speaks for, and what it may do.
    access: Access,
    /// Submits gathered from the bytes read so far, for one stream.
    batch: Option<(Arc<Stream>, Vec<Msg>)>,
    outgoing: Arc<Outgoing>,
    legacy_slots: Arc<Semaphore>,
    /// Each subscription's task and its credit (records it may still push).
    subscriptions: HashMap<u64, (JoinHandle<()>, Arc<Semaphore>)>,
    /// The link to another server's primary that `Append`s for its
    /// streams are forwarded over (`forward.rs`), once one was needed.
    forwarder: Option<forward::Forwarder>,
}

impl Connection {
    /// Ends every task of the connection (they hold the streams, and the
    /// server's shutdown closes the logs only once nothing holds them); a
    /// client that closed first still gets the answers to the appends
    /// already taken (a bounded wait).
    async fn close(mut self, stopped_by_server: bool) {
        let subscriptions: Vec<JoinHandle<()>> = self
            .subscriptions
            .drain()
            .map(|(_, (task, _))| task)
            .collect();
        let legacy_slots = Arc::clone(&self.legacy_slots);
        let in_flight = self.server.config.in_flight_per_connection_max;
        drop(self);
        for task in &subscriptions {
            task.abort();
        }
        for task in subscriptions {
            let _ = task.await;
        }
        if !stopped_by_server {
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                legacy_slots.acquire_many(in_flight as u32),
            )
            .await;
        }
    }

    async fn read_loop(&mut self, mut reader: LinkReader, mut buffer: FrameBuffer) {
        let max_frame = self.server.config.frame_bytes_max();
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
            match net::read_into(&mut reader, buffer.receiving(), READ_BYTES).await {
                Ok(0) | Err(_) => return,
                Ok(read) => {
                    if let Some(metrics) = &self.server.metrics {
                        metrics
                            .client_bytes_in
                            .fetch_add(read as u64, Ordering::Relaxed);
                    }
                }
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

    /// [`find_stream`](Self::find_stream), when the connection may do
    /// `right` on it; otherwise the result of answering `request` with
    /// `Unauthorized`.
    async fn find_allowed(
        &mut self,
        request: u64,
        stream_id: u64,
        right: Right,
    ) -> Result<Arc<Stream>, bool> {
        let stream = self.find_stream(request, stream_id).await?;
        match self.allow(right, &stream.name) {
            Ok(()) => Ok(stream),
            Err(refused) => Err(self.unauthorized(request, refused).await),
        }
    }

    /// This connection opened or wrote to `stream`: the client's messages
    /// of that stream come here (told to the router once).
    fn declare(&mut self, stream: u64) {
        if self.declared.insert(stream) {
            let router = &self.server.router;
            router.declare(self.client, self.registration, stream);
        }
    }

    /// Handles one frame; `false` closes the connection. Each request
    /// kind has its own handler: writes in `write.rs`, reads in `read.rs`,
    /// stream and cluster administration in `admin.rs`.
    async fn handle(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::Append { .. } | Frame::Submit { .. } => self.handle_write(frame).await,
            Frame::Fetch { .. }
            | Frame::Subscribe { .. }
            | Frame::Credit { .. }
            | Frame::Unsubscribe { .. } => self.handle_read(frame).await,
            Frame::CreateStream { .. }
            | Frame::CreateReplica { .. }
            | Frame::DeleteStream { .. }
            | Frame::SetRequirement { .. }
            | Frame::RetireServer { .. }
            | Frame::OpenStream { .. }
            | Frame::ListStreams { .. }
            | Frame::Status { .. } => self.handle_admin(frame).await,
            other => self.not_a_request(&other).await,
        }
    }

    /// Whether the connection may do `right` on stream `name`: `Err` holds
    /// the refusal's message (the request was counted as unauthorized).
    fn allow(&mut self, right: Right, name: &str) -> Result<(), Unauthorized> {
        self.access.check(right, name).inspect_err(|_| {
            self.server
                .requests_unauthorized
                .fetch_add(1, Ordering::Relaxed);
        })
    }

    /// Answers a request that lacks a right with `Unauthorized`.
    async fn unauthorized(&self, request: u64, refused: Unauthorized) -> bool {
        self.outgoing
            .error(request, ErrorCode::Unauthorized, refused.0)
            .await
    }

    /// Answers a frame that a client may not send, and closes.
    async fn not_a_request(&mut self, frame: &Frame) -> bool {
        let message = format!("a client may not send {}", frame_name(frame));
        self.outgoing.error(0, ErrorCode::BadFrame, message).await;
        false
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
