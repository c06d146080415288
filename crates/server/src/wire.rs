//! The wire form of the replication state machines' messages: a peer's
//! `Msg` as a `Peer` frame body and back, a client's `Submit` as a `Msg`,
//! and what a stream says to a client as `Acked`, `Stamped`,
//! `Checkpointed` and `Refused` frames (consecutive acks folded into
//! runs). No I/O: the router, the connections and the streams call it.

use engine::replication::{Binding, Bytes, Content, Entry, HybridMode, Msg, ServerId, ACK_RUN_MAX};
use proto::{EventId, Frame, PeerMessage, Record, WireBinding};

/// A `Peer` frame carrying `Replicate` of `entries`, laid out as
/// `Frame::encode` would lay it out.
pub(crate) fn replicate_frame(stream: u64, entries: &[Entry]) -> Vec<u8> {
    let records: usize = entries.iter().map(|e| e.bytes.len()).sum();
    let mut frame = Vec::with_capacity(proto::FRAME_HEADER_LEN + 8 + 1 + 4 + records);
    Frame::Peer {
        stream,
        message: PeerMessage::Replicate {
            count: entries.len() as u32,
            records: Vec::new(),
        },
    }
    .encode(&mut frame);
    for entry in entries {
        frame.extend_from_slice(&entry.bytes);
    }
    let body = (frame.len() - proto::FRAME_HEADER_LEN) as u32;
    frame[..4].copy_from_slice(&body.to_le_bytes());
    frame
}

fn wire_binding(binding: &Binding) -> WireBinding {
    WireBinding {
        version: binding.version,
        epoch: binding.epoch,
        client: binding.event.client,
        session: binding.event.session,
        sequence: binding.event.sequence,
        low_water: binding.low_water,
        flags: binding.flags,
        crc: binding.crc,
    }
}

/// A server-to-server `Msg` as a frame body; `None` for client messages.
pub(crate) fn peer_message(msg: Msg) -> Option<PeerMessage> {
    Some(match msg {
        Msg::Replicate { entries } => {
            let bytes: usize = entries.iter().map(|e| e.bytes.len()).sum();
            let mut records = Vec::with_capacity(bytes);
            for entry in &entries {
                records.extend_from_slice(&entry.bytes);
            }
            PeerMessage::Replicate {
                count: entries.len() as u32,
                records,
            }
        }
        Msg::Bind { bindings } => PeerMessage::Bind {
            bindings: bindings.iter().map(wire_binding).collect(),
        },
        Msg::Progress { logged, last } => PeerMessage::Progress { logged, last },
        Msg::Commit { committed, last } => PeerMessage::Commit { committed, last },
        Msg::Need { from, to } => PeerMessage::Need { from, to },
        Msg::Probe => PeerMessage::Probe,
        Msg::Checkpoint { through, state } => PeerMessage::Checkpoint {
            through,
            state: state.to_vec(),
        },
        Msg::Reack { event, version } => PeerMessage::Reack {
            client: event.client,
            session: event.session,
            sequence: event.sequence,
            version,
        },
        _ => return None,
    })
}

/// A peer frame body as a `Msg` (records were checked when decoded).
pub(crate) fn peer_msg(message: PeerMessage) -> Msg {
    match message {
        PeerMessage::Replicate { records, .. } => Msg::Replicate {
            // The frame decoder verified every record's checksum.
            entries: entries_of(Bytes::from(records), true),
        },
        PeerMessage::Bind { bindings } => Msg::Bind {
            bindings: bindings
                .into_iter()
                .map(|b| Binding {
                    version: b.version,
                    epoch: b.epoch,
                    event: EventId {
                        client: b.client,
                        session: b.session,
                        sequence: b.sequence,
                    },
                    low_water: b.low_water,
                    flags: b.flags,
                    crc: b.crc,
                })
                .collect(),
        },
        PeerMessage::Progress { logged, last } => Msg::Progress { logged, last },
        PeerMessage::Commit { committed, last } => Msg::Commit { committed, last },
        PeerMessage::Need { from, to } => Msg::Need { from, to },
        PeerMessage::Probe => Msg::Probe,
        PeerMessage::Checkpoint { through, state } => Msg::Checkpoint {
            through,
            state: Bytes::from(state),
        },
        PeerMessage::Reack {
            client,
            session,
            sequence,
            version,
        } => Msg::Reack {
            event: EventId {
                client,
                session,
                sequence,
            },
            version,
        },
    }
}

/// The records laid end to end in `records`, each a slice of it, up to the
/// first that does not decode. `checked`: their checksums were verified a
/// moment ago (by the frame decoder), so decoding skips them.
pub(crate) fn entries_of(records: Bytes, checked: bool) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut offset = 0;
    loop {
        let decoded = if checked {
            Record::decode_verified(&records[offset..])
        } else {
            Record::decode(&records[offset..])
        };
        let Ok((record, length)) = decoded else {
            break;
        };
        entries.push(Entry {
            header: record.header,
            bytes: records.slice(offset..offset + length),
        });
        offset += length;
    }
    entries
}

/// The event a client message is about.
pub(crate) fn event_of(msg: &Msg) -> Option<EventId> {
    match msg {
        Msg::Write(content) | Msg::Tagged(content) | Msg::Placed { content, .. } => {
            Some(content.event)
        }
        Msg::Reserve { event, .. } => Some(*event),
        _ => None,
    }
}

/// A client's `Submit` as a `Msg`; `None` for an unknown kind.
#[allow(clippy::too_many_arguments)]
pub(crate) fn submit_msg(
    client: u128,
    kind: u8,
    version: u64,
    epoch: u64,
    session: u64,
    sequence: u64,
    low_water: u64,
    key: Vec<u8>,
    payload: Vec<u8>,
) -> Option<Msg> {
    let event = EventId {
        client,
        session,
        sequence,
    };
    let resent = kind & proto::frame::SUBMIT_FLAG_RESENT != 0;
    let content = || Content {
        event,
        low_water,
        key: Bytes::from(key),
        payload: Bytes::from(payload),
        resent,
    };
    Some(match kind & !proto::frame::SUBMIT_FLAG_RESENT {
        proto::frame::SUBMIT_WRITE => Msg::Write(content()),
        proto::frame::SUBMIT_TAGGED => Msg::Tagged(content()),
        proto::frame::SUBMIT_RESERVE => Msg::Reserve { event, low_water },
        proto::frame::SUBMIT_PLACED => Msg::Placed {
            version,
            epoch,
            content: content(),
        },
        // A run of confirmations: `low_water` carries its length.
        proto::frame::SUBMIT_CONFIRM => Msg::Confirm {
            event,
            version,
            count: low_water.max(1),
        },
        _ => return None,
    })
}

pub(crate) fn hint_code(hint: Option<HybridMode>) -> u8 {
    match hint {
        None => 0,
        Some(HybridMode::ServerSync) => 1,
        Some(HybridMode::ClientAsync) => 2,
    }
}

/// Encodes the frames of one note to a client, folding each `Acked` that
/// continues the one before it (the next sequence of the same session
/// under the next version, with the same stream, epoch, flags and hint)
/// into that frame's run, so a batch of acks costs one frame rather than
/// one per message.
#[derive(Default)]
pub(crate) struct ClientFrames {
    bytes: Vec<u8>,
    run: Option<Frame>,
}

impl ClientFrames {
    pub(crate) fn push(&mut self, frame: Frame) {
        if let Some(run) = &mut self.run {
            if extend_run(run, &frame) {
                return;
            }
        }
        if let Some(run) = self.run.take() {
            run.encode(&mut self.bytes);
        }
        match frame {
            Frame::Acked { .. } => self.run = Some(frame),
            other => other.encode(&mut self.bytes),
        }
    }

    /// The encoded frames, in the order they were pushed.
    pub(crate) fn finish(mut self) -> Vec<u8> {
        if let Some(run) = self.run.take() {
            run.encode(&mut self.bytes);
        }
        self.bytes
    }
}

/// Folds `next` into `run` when it is the run's next ack.
fn extend_run(run: &mut Frame, next: &Frame) -> bool {
    let (
        Frame::Acked {
            stream,
            server,
            session,
            sequence,
            version,
            epoch,
            flags,
            hint,
            more,
        },
        Frame::Acked {
            stream: next_stream,
            server: next_server,
            session: next_session,
            sequence: next_sequence,
            version: next_version,
            epoch: next_epoch,
            flags: next_flags,
            hint: next_hint,
            more: next_more,
        },
    ) = (run, next)
    else {
        return false;
    };
    let step = u64::from(*more) + 1;
    let joined = more.checked_add(*next_more).and_then(|m| m.checked_add(1));
    let continues = (*stream, *server, *session, *epoch, *flags, *hint)
        == (
            *next_stream,
            *next_server,
            *next_session,
            *next_epoch,
            *next_flags,
            *next_hint,
        )
        && sequence.checked_add(step) == Some(*next_sequence)
        && version.checked_add(step) == Some(*next_version)
        && joined.is_some_and(|m| m <= proto::frame::ACKED_RUN_MAX);
    if continues {
        *more = joined.expect("checked");
    }
    continues
}

/// A client-bound `Msg` as the frame this server sends.
pub(crate) fn client_frame(me: ServerId, stream: u64, msg: Msg) -> Option<Frame> {
    Some(match msg {
        Msg::Ack {
            event,
            version,
            epoch,
            duplicate,
            hint,
            count,
        } => Frame::Acked {
            stream,
            server: me,
            session: event.session,
            sequence: event.sequence,
            version,
            epoch,
            flags: if duplicate {
                proto::frame::ACKED_FLAG_DUPLICATE
            } else {
                0
            },
            hint: hint_code(hint),
            // A run is at most `ACK_RUN_MAX` messages, one frame's worth.
            more: count.clamp(1, ACK_RUN_MAX) as u32 - 1,
        },
        Msg::Stamped {
            event,
            version,
            epoch,
            duplicate,
        } => Frame::Stamped {
            stream,
            session: event.session,
            sequence: event.sequence,
            version,
            epoch,
            flags: if duplicate {
                proto::frame::ACKED_FLAG_DUPLICATE
            } else {
                0
            },
        },
        Msg::Checkpointed { through, resend } => Frame::Checkpointed {
            stream,
            version: through,
            flags: if resend {
                proto::frame::CHECKPOINTED_FLAG_RESEND
            } else {
                0
            },
        },
        Msg::Refused { event, refusal } => Frame::Refused {
            stream,
            session: event.session,
            sequence: event.sequence,
            code: refusal.code(),
            message: refusal.to_string(),
        },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::RecordHeader;

    fn acked(session: u64, sequence: u64, version: u64, flags: u8) -> Frame {
        Frame::Acked {
            stream: 4,
            server: 2,
            session,
            sequence,
            version,
            epoch: 1,
            flags,
            hint: 0,
            more: 0,
        }
    }

    /// Every frame in `bytes`, each `Acked` run expanded to its acks.
    fn expanded(bytes: &[u8]) -> (Vec<Frame>, usize) {
        let mut buffer = proto::FrameBuffer::default();
        buffer.extend(bytes);
        let mut frames = Vec::new();
        let mut count = 0;
        while let Some(frame) = buffer.next_frame(1 << 20).expect("well formed") {
            count += 1;
            match frame {
                Frame::Acked {
                    session,
                    sequence,
                    version,
                    flags,
                    more,
                    ..
                } => {
                    for offset in 0..=u64::from(more) {
                        frames.push(acked(session, sequence + offset, version + offset, flags));
                    }
                }
                other => frames.push(other),
            }
        }
        (frames, count)
    }

    #[test]
    fn consecutive_acks_travel_as_one_frame_and_expand_to_the_same_acks() {
        let mut pushed = Vec::new();
        for sequence in 1..=1000u64 {
            pushed.push(acked(1, sequence, sequence + 10, 0));
        }
        // Each of these breaks the run: a gap in versions, a duplicate
        // flag, another session, a frame of another kind.
        pushed.push(acked(1, 1001, 1012, 0));
        pushed.push(acked(1, 1002, 1013, proto::frame::ACKED_FLAG_DUPLICATE));
        pushed.push(acked(2, 1003, 1014, 0));
        pushed.push(Frame::Stamped {
            stream: 4,
            session: 2,
            sequence: 1004,
            version: 1015,
            epoch: 1,
            flags: 0,
        });
        pushed.push(acked(2, 1004, 1015, 0));
        let mut frames = ClientFrames::default();
        for frame in pushed.clone() {
            frames.push(frame);
        }
        let (back, count) = expanded(&frames.finish());
        assert_eq!(back, pushed);
        assert_eq!(count, 6, "one frame for the run, one for each break");
    }

    #[test]
    fn a_run_stops_at_the_longest_a_frame_may_carry() {
        let total = u64::from(proto::frame::ACKED_RUN_MAX) + 10;
        let mut frames = ClientFrames::default();
        for sequence in 1..=total {
            frames.push(acked(1, sequence, sequence, 0));
        }
        let (back, count) = expanded(&frames.finish());
        assert_eq!(back.len() as u64, total);
        assert_eq!(count, 2);
    }

    #[test]
    fn runs_that_continue_each_other_fold_into_one_frame_up_to_the_bound() {
        let run = |sequence: u64, count: u64| {
            let msg = Msg::Ack {
                event: EventId {
                    client: 5,
                    session: 1,
                    sequence,
                },
                version: sequence + 10,
                epoch: 1,
                duplicate: false,
                hint: None,
                count,
            };
            client_frame(2, 4, msg).expect("a client frame")
        };
        let mut frames = ClientFrames::default();
        frames.push(run(1, 100));
        frames.push(run(101, 50));
        // Fills the frame exactly; the next run starts another.
        frames.push(run(151, ACK_RUN_MAX - 150));
        frames.push(run(ACK_RUN_MAX + 1, 7));
        let (back, count) = expanded(&frames.finish());
        assert_eq!(count, 2);
        let every: Vec<Frame> = (1..=ACK_RUN_MAX + 7)
            .map(|sequence| acked(1, sequence, sequence + 10, 0))
            .collect();
        assert_eq!(back, every);
    }

    #[test]
    fn a_replicate_frame_is_what_frame_encode_makes() {
        let entries: Vec<Entry> = (1..=3u64)
            .map(|version| {
                let header = RecordHeader {
                    flags: 0,
                    stream: 9,
                    version,
                    epoch: 1,
                    event: EventId {
                        client: 5,
                        session: 1,
                        sequence: version,
                    },
                    low_water: 1,
                };
                Entry::new(header, b"key", &[version as u8; 100])
            })
            .collect();
        let records: Vec<u8> = entries
            .iter()
            .flat_map(|e| e.bytes.iter().copied())
            .collect();
        let expected = Frame::Peer {
            stream: 9,
            message: PeerMessage::Replicate { count: 3, records },
        }
        .to_bytes();
        assert_eq!(replicate_frame(9, &entries), expected);
        let (decoded, _) = Frame::decode(&expected, 1 << 20).unwrap().unwrap();
        let Frame::Peer { message, .. } = decoded else {
            panic!("not a peer frame");
        };
        let Msg::Replicate { entries: back } = peer_msg(message) else {
            panic!("not replicate");
        };
        assert_eq!(back, entries);
    }
}
