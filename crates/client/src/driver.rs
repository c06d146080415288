//! The task that owns the connection: sends what the client asks, routes
//! answers back, and on a broken connection reconnects and sends again
//! every append still unacknowledged and every subscription from where it
//! stopped.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;

use net::LinkWriter;
use proto::Frame;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};

use crate::command::{Ack, Command, ReceivedRecord, SessionTracker, SubscriptionCounters};
use crate::config::ClientConfig;
use crate::error::ClientError;
use crate::link::{self, Connection, Ended, Session, READ_BYTES};

/// Frames from the server may exceed the limit the server sets for
/// clients' frames (a status document of many streams); this bounds them.
const SERVER_FRAME_BYTES_MAX: usize = 64 * 1024 * 1024;

struct PendingAppend {
    sequence: u64,
    frame: Vec<u8>,
    reply: oneshot::Sender<Result<Ack, ClientError>>,
    _permit: OwnedSemaphorePermit,
    tracker: Arc<SessionTracker>,
}

struct PendingRequest {
    frame: Vec<u8>,
    reply: oneshot::Sender<Result<Frame, ClientError>>,
    /// Sent on the current connection (and so lost if it breaks).
    sent: bool,
}

struct SubscriptionState {
    stream: u64,
    /// The next version to deliver: where a resubscription starts.
    next: u64,
    /// Records delivered into the buffer so far.
    delivered: u64,
    sender: mpsc::UnboundedSender<Result<ReceivedRecord, ClientError>>,
    counters: Arc<SubscriptionCounters>,
}

/// The client's control connection: its commands' state, kept across
/// connections.
pub(crate) struct Driver {
    config: ClientConfig,
    client_id: u128,
    commands: mpsc::UnboundedReceiver<Command>,
    appends: BTreeMap<u64, PendingAppend>,
    requests: HashMap<u64, PendingRequest>,
    subscriptions: HashMap<u64, SubscriptionState>,
    /// Servers to connect to when the connection breaks: the configured
    /// one first, then every replica a stream's placement named (at most
    /// [`KNOWN_SERVERS_MAX`]), so that requests and subscriptions go on
    /// through another server when it dies.
    known: Vec<String>,
}

/// Server addresses a client remembers at most.
const KNOWN_SERVERS_MAX: usize = 64;

impl Driver {
    pub(crate) fn new(
        config: ClientConfig,
        client_id: u128,
        commands: mpsc::UnboundedReceiver<Command>,
    ) -> Self {
        let config_address = config.address.clone();
        Driver {
            config,
            client_id,
            commands,
            appends: BTreeMap::new(),
            requests: HashMap::new(),
            subscriptions: HashMap::new(),
            known: vec![config_address],
        }
    }

    /// Hands a subscription the records a `Deliver` frame carries.
    fn deliver(&mut self, subscription: u64, records: &[u8]) {
        let Some(state) = self.subscriptions.get_mut(&subscription) else {
            return;
        };
        for record in proto::frame::iter_records(records) {
            // After a resubscription the server starts at `next`;
            // anything older was delivered already.
            if record.header.version < state.next {
                continue;
            }
            state.next = record.header.version + 1;
            state.delivered += 1;
            let _ = state.sender.send(Ok(ReceivedRecord::from(record)));
        }
    }

    /// Remembers the servers of a stream's placement.
    fn learn(&mut self, info: &proto::StreamInfo) {
        for replica in &info.replicas {
            if self.known.len() < KNOWN_SERVERS_MAX && !self.known.contains(&replica.address) {
                self.known.push(replica.address.clone());
            }
        }
    }

    pub(crate) async fn run(mut self, first: Connection) {
        let config = self.config.clone();
        link::keep_connected(&config, self.client_id, Some(first), &mut self).await;
    }

    /// Control requests sent on a broken connection get `Disconnected`:
    /// unlike appends they carry no event id, so resending them could apply
    /// them twice.
    fn fail_sent_requests(&mut self) {
        let sent: Vec<u64> = self
            .requests
            .iter()
            .filter(|(_, r)| r.sent)
            .map(|(&id, _)| id)
            .collect();
        for id in sent {
            if let Some(request) = self.requests.remove(&id) {
                let _ = request.reply.send(Err(ClientError::Disconnected));
            }
        }
    }

    /// Records a command's state; returns the bytes to send, if any.
    fn register(&mut self, command: Command) -> Option<Vec<u8>> {
        match command {
            Command::Append {
                request,
                sequence,
                frame,
                reply,
                permit,
                tracker,
            } => {
                let bytes = frame.clone();
                self.appends.insert(
                    request,
                    PendingAppend {
                        sequence,
                        frame,
                        reply,
                        _permit: permit,
                        tracker,
                    },
                );
                Some(bytes)
            }
            Command::Request {
                request,
                frame,
                reply,
            } => {
                let bytes = frame.clone();
                self.requests.insert(
                    request,
                    PendingRequest {
                        frame,
                        reply,
                        sent: false,
                    },
                );
                Some(bytes)
            }
            Command::Subscribe {
                id,
                stream,
                from,
                sender,
                counters,
            } => {
                let state = SubscriptionState {
                    stream,
                    next: from,
                    delivered: 0,
                    sender,
                    counters,
                };
                let bytes = self.subscribe_frame(id, &state);
                self.subscriptions.insert(id, state);
                Some(bytes)
            }
            Command::Credit { id, credit } => self.subscriptions.contains_key(&id).then(|| {
                Frame::Credit {
                    subscription: id,
                    credit,
                }
                .to_bytes()
            }),
            Command::Unsubscribe { id } => self
                .subscriptions
                .remove(&id)
                .map(|_| Frame::Unsubscribe { subscription: id }.to_bytes()),
        }
    }

    fn subscribe_frame(&self, id: u64, state: &SubscriptionState) -> Vec<u8> {
        // Credit is what the buffer can still take: the records delivered
        // and not yet consumed occupy part of it, and the slots consumed
        // but not yet granted back will be granted by the reader itself.
        let consumed = state
            .counters
            .consumed
            .load(Ordering::Relaxed)
            .min(state.delivered);
        let returned = state
            .counters
            .returned
            .load(Ordering::Relaxed)
            .min(consumed);
        let buffered = state.delivered - consumed;
        let held_back = consumed - returned;
        let credit =
            u64::from(self.config.subscription_buffer).saturating_sub(buffered + held_back) as u32;
        Frame::Subscribe {
            subscription: id,
            stream: state.stream,
            from: state.next,
            credit,
        }
        .to_bytes()
    }

    /// Everything to send on a fresh connection: control requests (in no
    /// particular order), then appends in the order they were submitted,
    /// then subscriptions.
    fn resend_all(&mut self) -> Vec<u8> {
        let mut bytes = Vec::new();
        for request in self.requests.values_mut() {
            bytes.extend_from_slice(&request.frame);
            request.sent = true;
        }
        for append in self.appends.values() {
            bytes.extend_from_slice(&append.frame);
        }
        let ids: Vec<u64> = self.subscriptions.keys().copied().collect();
        for id in ids {
            let frame = self.subscribe_frame(id, &self.subscriptions[&id]);
            bytes.extend_from_slice(&frame);
        }
        bytes
    }

    /// Serves one connection: sends what was waiting, then commands as
    /// they come, and routes the answers.
    async fn serve_connection(&mut self, connection: Connection) -> Ended {
        let Connection {
            mut reader,
            writer,
            mut buffer,
            max_frame,
        } = connection;
        let (outgoing, queue) = mpsc::unbounded_channel::<Vec<u8>>();
        let mut writer_task = tokio::spawn(write_frames(writer, queue));
        let resend = self.resend_all();
        if !resend.is_empty() {
            let _ = outgoing.send(resend);
        }
        loop {
            tokio::select! {
                command = self.commands.recv() => match command {
                    Some(command) => {
                        let is_request = matches!(command, Command::Request { .. });
                        let request_id = match &command { Command::Request { request, .. } => *request, _ => 0 };
                        if let Some(bytes) = self.register(command) {
                            if is_request {
                                if let Some(request) = self.requests.get_mut(&request_id) {
                                    request.sent = true;
                                }
                            }
                            let _ = outgoing.send(bytes);
                        }
                    }
                    None => {
                        writer_task.abort();
                        return Ended::Closed;
                    }
                },
                read = net::read_into(&mut reader, buffer.receiving(), READ_BYTES) => {
                    if !matches!(read, Ok(count) if count > 0) {
                        writer_task.abort();
                        return Ended::Broken;
                    }
                    loop {
                        match buffer.next_frame(max_frame.max(SERVER_FRAME_BYTES_MAX)) {
                            Ok(Some(frame)) => self.dispatch(frame),
                            Ok(None) => break,
                            Err(_) => {
                                writer_task.abort();
                                return Ended::Broken;
                            }
                        }
                    }
                }
                _ = &mut writer_task => return Ended::Broken,
            }
        }
    }

    fn dispatch(&mut self, frame: Frame) {
        match frame {
            Frame::Ack {
                request,
                stream,
                version,
                epoch,
                level,
                flags,
                replicas,
                echo,
            } => {
                if let Some(append) = self.appends.remove(&request) {
                    append.tracker.answered(append.sequence);
                    let _ = append.reply.send(Ok(Ack {
                        stream,
                        version,
                        epoch,
                        level,
                        duplicate: flags & proto::frame::ACK_FLAG_DUPLICATE != 0,
                        possible_duplicate: flags & proto::frame::ACK_FLAG_POSSIBLE_DUPLICATE != 0,
                        replicas,
                        echo,
                        sequence: append.sequence,
                    }));
                }
            }
            Frame::Deliver {
                subscription,
                records,
                ..
            } => self.deliver(subscription, &records),
            Frame::Error {
                request,
                code,
                message,
            } => {
                let error = ClientError::Server { code, message };
                if let Some(append) = self.appends.remove(&request) {
                    append.tracker.answered(append.sequence);
                    let _ = append.reply.send(Err(error));
                } else if let Some(pending) = self.requests.remove(&request) {
                    let _ = pending.reply.send(Err(error));
                } else if let Some(state) = self.subscriptions.remove(&request) {
                    let _ = state.sender.send(Err(error));
                }
            }
            other => {
                if let Frame::StreamInfo { info, .. } = &other {
                    self.learn(info);
                }
                let request = match &other {
                    Frame::StreamInfo { request, .. }
                    | Frame::StreamList { request, .. }
                    | Frame::Ok { request }
                    | Frame::StatusReply { request, .. }
                    | Frame::Records { request, .. } => *request,
                    _ => return,
                };
                if let Some(pending) = self.requests.remove(&request) {
                    let _ = pending.reply.send(Ok(other));
                }
            }
        }
    }
}

impl Session for Driver {
    async fn serve(&mut self, connection: Connection) -> Ended {
        self.serve_connection(connection).await
    }

    async fn wait(&mut self) -> bool {
        match self.commands.recv().await {
            Some(command) => {
                self.register(command);
                true
            }
            None => false,
        }
    }

    fn down(&mut self) {
        self.fail_sent_requests();
    }

    /// The configured server first, then the others it knows in turn.
    fn address(&self, attempt: u64) -> Option<String> {
        let index = (attempt % self.known.len() as u64) as usize;
        Some(self.known[index].clone())
    }
}

async fn write_frames(mut writer: LinkWriter, mut queue: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut batch = Vec::new();
    while let Some(first) = queue.recv().await {
        batch.clear();
        batch.extend_from_slice(&first);
        while batch.len() < 1024 * 1024 {
            match queue.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        if writer.write_all(&batch).await.is_err() || writer.flush().await.is_err() {
            return;
        }
    }
}
