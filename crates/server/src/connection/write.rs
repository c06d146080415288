//! A connection's writes: the single-server `Append` (answered by request
//! number) and `Submit`, gathered per stream and handed to the stream's
//! replica in batches.

use super::*;
use crate::outgoing::InFlightFull;
use proto::SubmitFields;
use std::time::Instant;

impl Connection {
    /// A write request: `Append` or `Submit`.
    pub(super) async fn handle_write(&mut self, frame: Frame) -> bool {
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
                self.append(request, stream, event, low_water, key, payload, flags)
                    .await
            }
            Frame::Submit {
                fields,
                key,
                payload,
            } => self.submit(fields, key, payload).await,
            other => self.not_a_request(&other).await,
        }
    }

    /// Why a message is refused for its size, if it is.
    fn too_large(&self, key: &[u8], payload: &[u8]) -> Option<String> {
        let limit = self.server.config.message_bytes_max;
        let size = key.len() + payload.len();
        (size > limit)
            .then(|| format!("message of {size} bytes exceeds the limit of {limit} bytes"))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn append(
        &mut self,
        request: u64,
        stream_id: u64,
        event: EventId,
        low_water: u64,
        key: Vec<u8>,
        payload: Vec<u8>,
        flags: u8,
    ) -> bool {
        let echo = flags & proto::frame::APPEND_FLAG_ECHO != 0;
        let stream = match self.find_allowed(request, stream_id, Right::Produce).await {
            Ok(stream) => stream,
            Err(open) => return open,
        };
        self.declare(stream.id);
        if let Some(message) = self.too_large(&key, &payload) {
            return self
                .outgoing
                .error(request, ErrorCode::MessageTooLarge, message)
                .await;
        }
        if let Some(message) = append_refusal(&stream) {
            return self
                .outgoing
                .error(request, ErrorCode::InvalidArgument, message)
                .await;
        }
        let primary = stream.placement().primary;
        if primary != self.server.config.cluster.me {
            if flags & proto::frame::APPEND_FLAG_REDIRECT != 0 || primary == 0 {
                return self
                    .not_primary(request, &stream, "the client asked to be redirected")
                    .await;
            }
            let append = Frame::Append {
                request,
                stream: stream.id,
                flags,
                session: event.session,
                sequence: event.sequence,
                low_water,
                key,
                payload,
            };
            return self.forward(&stream, request, append).await;
        }
        let Ok(slot) = Arc::clone(&self.legacy_slots).acquire_owned().await else {
            return false;
        };
        let echo = if echo { payload.clone() } else { Vec::new() };
        self.hold_legacy(&stream, event, request, echo, slot);
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

    /// Keeps a single-server `Append` until its stream answers it.
    fn hold_legacy(
        &self,
        stream: &Stream,
        event: EventId,
        request: u64,
        echo: Vec<u8>,
        slot: tokio::sync::OwnedSemaphorePermit,
    ) {
        self.outgoing.legacy.lock().expect("legacy lock").insert(
            (stream.id, event.session, event.sequence),
            LegacyAppend {
                request,
                level: ack_level(stream),
                echo,
                arrived: self.outgoing.metrics.as_ref().map(|_| Instant::now()),
                _slot: slot,
            },
        );
    }

    /// A replication message (`Submit`).
    pub(super) async fn submit(
        &mut self,
        fields: SubmitFields,
        key: Bytes,
        payload: Bytes,
    ) -> bool {
        let stream_id = fields.stream;
        let refuse = |code: ErrorCode, message: String| Frame::Refused {
            stream: stream_id,
            session: fields.session,
            sequence: fields.sequence,
            code,
            message,
        };
        if let Some(message) = self.too_large(&key, &payload) {
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
        let Some(msg) = wire::submit_msg(self.client, fields, key, payload) else {
            let message = format!("unknown submit kind {}", fields.kind);
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
        // Checked once per batch: a batch is one stream's submits from
        // one read.
        if !same {
            if let Err(refused) = self.allow(Right::Produce, &stream.name) {
                let refusal = refuse(ErrorCode::Unauthorized, refused.0);
                return self.outgoing.send(&refusal).await;
            }
            self.declare(stream_id);
        }
        if let Err(InFlightFull(message)) = self.take_room(stream_id, &msg) {
            return self.outgoing.send(&refuse(ErrorCode::Busy, message)).await;
        }
        let (_, messages) = self.batch.get_or_insert_with(|| (stream, Vec::new()));
        messages.push(msg);
        if messages.len() >= SUBMIT_BATCH_MAX {
            return self.flush_batch().await;
        }
        true
    }

    /// Counts a write (a message's content) among the connection's writes
    /// in flight, or says why it may not be taken now.
    fn take_room(&self, stream: u64, msg: &Msg) -> Result<(), InFlightFull> {
        let content = match msg {
            Msg::Write(content) | Msg::Tagged(content) | Msg::Placed { content, .. } => content,
            _ => return Ok(()),
        };
        let config = &self.server.config;
        let limits = (
            config.in_flight_per_connection_max,
            config.bytes_in_flight_per_connection_max,
        );
        let event = content.event;
        let taken = self.outgoing.writes.lock().expect("writes lock").admit(
            (stream, event.session, event.sequence),
            content.key.len() + content.payload.len(),
            limits,
        );
        if taken.is_err() {
            self.server.writes_busy.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Hands the gathered submits to their stream in one step.
    pub(super) async fn flush_batch(&mut self) -> bool {
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
            let Some(event) = wire::event_of(&msg) else {
                continue;
            };
            self.outgoing.writes.lock().expect("writes lock").answered((
                stream.id,
                event.session,
                event.sequence,
            ));
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
}

/// What an `Ack` of a single-server append of `stream` says was reached.
fn ack_level(stream: &Stream) -> proto::AckLevel {
    if stream.durability == proto::DurabilityConfig::Sync {
        proto::AckLevel::Synced
    } else {
        proto::AckLevel::Memory
    }
}

/// Why `stream` takes no `Append`, if it does not: the primary's answer
/// alone must meet its acknowledgement rule.
fn append_refusal(stream: &Stream) -> Option<String> {
    let rule = stream.protocol.ack_rule(HybridMode::ServerSync);
    let primary_answers = matches!(rule, AckRule::PrimaryAfterAll | AckRule::PrimaryOnly)
        || stream.placement().replicas.len() == 1;
    if stream.is_sender_logged() {
        return Some(format!(
            "stream {:?} uses sender-based logging, which needs the client to confirm each version and keep its messages; send with Submit (the client library's replicated producer)",
            stream.name
        ));
    }
    if !primary_answers || stream.protocol == Protocol::Unversioned {
        return Some(format!(
            "stream {:?} uses {} over {} replicas; send with Submit (the client library's replicated producer)",
            stream.name,
            stream.protocol,
            stream.placement().replicas.len()
        ));
    }
    None
}

fn submit_failure_code(failure: &SubmitFailure) -> ErrorCode {
    match failure {
        SubmitFailure::Deleted => ErrorCode::UnknownStream,
        SubmitFailure::LogFailed(_) => ErrorCode::LogFailed,
        SubmitFailure::Moving(_) => ErrorCode::NotPrimary,
        SubmitFailure::Busy | SubmitFailure::Blocked(_) | SubmitFailure::Reconnect(_) => {
            ErrorCode::Busy
        }
        SubmitFailure::ReadOnly(_) => ErrorCode::ReadOnly,
    }
}
