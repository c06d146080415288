//! The wire form of the replication state machines' messages: a peer's
//! `Msg` as a `Peer` frame body and back, a client's `Submit` as a `Msg`,
//! and what a stream says to a client as `Acked`, `Stamped`,
//! `Checkpointed` and `Refused` frames (consecutive acks folded into
//! runs). No I/O: the router, the connections and the streams call it.

use engine::replication::{Binding, Bytes, Content, Entry, HybridMode, Msg, ServerId, ACK_RUN_MAX};
use proto::layout::{Bytes32, Event, Layout, Reader, U64};
use proto::{EventId, Frame, FrameError, Record, SubmitFields};

// The replication messages between servers: a `Peer` frame's body is the
// stream id, a sub-kind byte, and the sub-kind's fields as laid out here
// (docs/wire-format.md, "Peer links").
proto::layouts! {
    Msg: put_peer, get_peer, PEER_KINDS;
    Replicate = 1, "replicate" { entries: Entries }
    Bind = 2, "bind" { bindings: Bindings }
    Progress = 3, "progress" { logged: U64, last: U64 }
    Commit = 4, "commit" { committed: U64, last: U64 }
    Need = 5, "need" { from: U64, to: U64 }
    Reack = 6, "reack" { event: Event, version: U64 }
    Probe = 7, "probe" {}
    Checkpoint = 8, "checkpoint" { through: U64, state: Bytes32 }
}

/// A u32 count, then that many records back to back to the body's end,
/// each checked (length and checksum) when read and kept as a slice of the
/// frame's bytes.
struct Entries;

impl Layout<Vec<Entry>> for Entries {
    fn put(entries: &Vec<Entry>, out: &mut Vec<u8>) {
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        for entry in entries {
            out.extend_from_slice(&entry.bytes);
            out.extend_from_slice(entry.rest());
        }
    }
    fn get(reader: &mut Reader<'_>) -> Option<Vec<Entry>> {
        let count = reader.u32()? as usize;
        let records = reader.rest_bytes();
        let (entries, used) = decode_entries(records.clone());
        (entries.len() == count && used == records.len()).then_some(entries)
    }
}

/// A u32 count of bindings, each version u64, epoch u64, event id, low
/// water u64, flags u16 and the record's crc u32.
struct Bindings;

/// Size of one encoded [`Binding`].
const BINDING_LEN: usize = 8 + 8 + 16 + 8 + 8 + 8 + 2 + 4;

impl Layout<Vec<Binding>> for Bindings {
    fn put(bindings: &Vec<Binding>, out: &mut Vec<u8>) {
        out.extend_from_slice(&(bindings.len() as u32).to_le_bytes());
        for b in bindings {
            U64::put(&b.version, out);
            U64::put(&b.epoch, out);
            Event::put(&b.event, out);
            U64::put(&b.low_water, out);
            out.extend_from_slice(&b.flags.to_le_bytes());
            out.extend_from_slice(&b.crc.to_le_bytes());
        }
    }
    fn get(reader: &mut Reader<'_>) -> Option<Vec<Binding>> {
        let count = reader.u32()? as usize;
        if count > reader.remaining() / BINDING_LEN {
            return None;
        }
        let mut bindings = Vec::with_capacity(count);
        for _ in 0..count {
            bindings.push(Binding {
                version: reader.u64()?,
                epoch: reader.u64()?,
                event: Event::get(reader)?,
                low_water: reader.u64()?,
                flags: reader.u16()?,
                crc: reader.u32()?,
            });
        }
        Some(bindings)
    }
}

/// A server-to-server `msg` as a whole `Peer` frame for `stream` (records
/// go straight from the entries into the frame: one copy); `None` for a
/// message that does not travel between servers.
pub(crate) fn peer_frame(stream: u64, msg: &Msg) -> Option<Vec<u8>> {
    let records = match msg {
        Msg::Replicate { entries } => entries.iter().map(Entry::len).sum(),
        _ => 0,
    };
    let mut frame = Vec::with_capacity(proto::FRAME_HEADER_LEN + 8 + 1 + 64 + records);
    let mut sub_kind = None;
    Frame::encode_peer(&mut frame, stream, |out| {
        let at = out.len();
        out.push(0);
        sub_kind = put_peer(msg, out);
        out[at] = sub_kind.unwrap_or_default();
    });
    sub_kind.map(|_| frame)
}

/// The sub-kind byte of `Replicate` in the table above.
const REPLICATE: u8 = 1;

/// A record of at least this many bytes goes into a `Peer` frame as it is,
/// a part of the send (`net::Chunk::Parts`) that shares the entry's bytes,
/// instead of a copy: below it the copy costs less than a part.
pub(crate) const RECORD_PART_MIN: usize = 4096;

/// [`peer_frame`] as a send: a `Replicate` that carries a record of
/// [`RECORD_PART_MIN`] bytes or more goes in parts (the frame's head with
/// the smaller records after it, copied, and each large record as it is:
/// a record whose payload was left where it came, its head copied and its
/// payload a part); anything else as one encoded frame. The bytes are the
/// same either way.
pub(crate) fn peer_send(stream: u64, msg: &Msg) -> Option<net::Chunk> {
    let entries = match msg {
        Msg::Replicate { entries } if entries.iter().any(|e| e.len() >= RECORD_PART_MIN) => entries,
        _ => return peer_frame(stream, msg).map(net::Chunk::Owned),
    };
    let records: usize = entries.iter().map(Entry::len).sum();
    let mut run = Vec::with_capacity(proto::FRAME_HEADER_LEN + 8 + 1 + 4);
    Frame::encode_peer_head(&mut run, stream, records, |out| {
        out.push(REPLICATE);
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    });
    let mut parts = Vec::with_capacity(2 * entries.len() + 1);
    for entry in entries {
        if let Some(payload) = &entry.payload {
            run.extend_from_slice(&entry.bytes);
            parts.push(Bytes::from(std::mem::take(&mut run)));
            parts.push(payload.clone());
        } else if entry.bytes.len() >= RECORD_PART_MIN {
            parts.push(Bytes::from(std::mem::take(&mut run)));
            parts.push(entry.bytes.clone());
        } else {
            run.extend_from_slice(&entry.bytes);
        }
    }
    parts.push(Bytes::from(run));
    Some(net::Chunk::parts(parts))
}

/// A `Peer` frame's message as a `Msg`; its records are checked and kept
/// as slices of `message` (itself a slice of the bytes received).
pub(crate) fn peer_msg(message: Bytes) -> Result<Msg, FrameError> {
    let mut reader = Reader::shared(&message);
    let sub_kind = reader.u8().ok_or(FrameError::Malformed("peer"))?;
    get_peer(sub_kind, &mut reader).unwrap_or(Err(FrameError::Malformed("peer")))
}

/// Decodes a `Peer` frame's message as a server does, and checks that
/// what decodes encodes back to a message that decodes the same: the
/// fuzzers' way in. A message that does not decode is an `Err`, never a
/// panic.
pub fn check_peer_message(message: &[u8]) -> Result<(), FrameError> {
    let msg = peer_msg(Bytes::copy_from_slice(message))?;
    let Some(frame) = peer_frame(1, &msg) else {
        return Ok(());
    };
    let Ok(Some((Frame::Peer { message: again, .. }, _))) = Frame::decode(&frame, usize::MAX)
    else {
        panic!("a decoded peer message did not encode to a Peer frame: {msg:?}");
    };
    let again = peer_msg(again).expect("a re-encoded peer message decodes");
    assert_eq!(
        format!("{msg:?}"),
        format!("{again:?}"),
        "peer message round trip"
    );
    Ok(())
}

/// The records laid end to end in `records`, each a slice of it, up to the
/// first that does not decode (checksums included).
pub(crate) fn entries_of(records: Bytes) -> Vec<Entry> {
    decode_entries(records).0
}

/// [`entries_of`], with the bytes the entries take.
fn decode_entries(records: Bytes) -> (Vec<Entry>, usize) {
    let mut entries = Vec::new();
    let mut offset = 0;
    while let Ok((record, length)) = Record::decode(&records[offset..]) {
        entries.push(Entry {
            header: record.header,
            bytes: records.slice(offset..offset + length),
            payload: None,
        });
        offset += length;
    }
    (entries, offset)
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
pub(crate) fn submit_msg(
    client: u128,
    fields: SubmitFields,
    key: Bytes,
    payload: Bytes,
) -> Option<Msg> {
    let SubmitFields {
        kind,
        version,
        epoch,
        session,
        sequence,
        low_water,
        ..
    } = fields;
    let event = EventId {
        client,
        session,
        sequence,
    };
    let resent = kind & proto::frame::SUBMIT_FLAG_RESENT != 0;
    let content = || Content {
        event,
        low_water,
        key,
        payload,
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

/// The flags of an answer that is, or is not, a duplicate.
fn duplicate_flags(duplicate: bool) -> u8 {
    if duplicate {
        proto::frame::ACKED_FLAG_DUPLICATE
    } else {
        0
    }
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

/// Bytes an `Acked` frame takes at most (header and fields).
const ACKED_FRAME_BYTES: usize = 64;

impl ClientFrames {
    /// For the frames of `messages` messages: room for that many `Acked`
    /// frames (up to 64), so that a note's buffer is allocated once
    /// rather than grown frame by frame.
    pub(crate) fn for_messages(messages: usize) -> Self {
        ClientFrames {
            bytes: Vec::with_capacity(messages.clamp(1, 64) * ACKED_FRAME_BYTES),
            run: None,
        }
    }

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
            flags: duplicate_flags(duplicate),
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
            flags: duplicate_flags(duplicate),
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
    fn a_notes_buffer_is_sized_once_for_its_acks() {
        // The longest `Acked`: a run, every field at its widest.
        let widest = Frame::Acked {
            stream: u64::MAX,
            server: u32::MAX,
            session: u64::MAX,
            sequence: u64::MAX,
            version: u64::MAX,
            epoch: u64::MAX,
            flags: u8::MAX,
            hint: u8::MAX,
            more: proto::frame::ACKED_RUN_MAX,
        };
        assert!(widest.to_bytes().len() <= ACKED_FRAME_BYTES);
        // Acks that do not continue each other: a frame each, no growth.
        let mut frames = ClientFrames::for_messages(3);
        let room = frames.bytes.capacity();
        for session in 1..=3 {
            frames.push(acked(session, 1, session, 0));
        }
        let bytes = frames.finish();
        assert_eq!(expanded(&bytes).1, 3);
        assert_eq!(bytes.capacity(), room);
    }

    /// A record of stream 9 at `version` with `size` bytes of payload.
    fn entry(version: u64, size: usize) -> Entry {
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
        Entry::new(header, b"key", &vec![version as u8; size])
    }

    /// [`entry`], its payload left out of its bytes as a primary leaves a
    /// large one it got from a client.
    fn split_entry(version: u64, size: usize) -> Entry {
        let whole = entry(version, size);
        let payload = Bytes::from(vec![version as u8; size]);
        let split = Entry::with_payload(whole.header, b"key", &payload);
        assert!(split.is_split() && split == whole);
        split
    }

    fn entries() -> Vec<Entry> {
        (1..=3u64).map(|version| entry(version, 100)).collect()
    }

    /// One message of every sub-kind the table holds.
    fn peer_samples() -> Vec<Msg> {
        let event = EventId {
            client: 77,
            session: 1,
            sequence: 2,
        };
        vec![
            Msg::Replicate { entries: entries() },
            Msg::Bind {
                bindings: vec![Binding {
                    version: 4,
                    epoch: 1,
                    event,
                    low_water: 1,
                    flags: proto::FLAG_VOID,
                    crc: 0xDEAD_BEEF,
                }],
            },
            Msg::Progress { logged: 7, last: 8 },
            Msg::Commit {
                committed: 6,
                last: 8,
            },
            Msg::Need { from: 3, to: 8 },
            Msg::Reack { event, version: 2 },
            Msg::Probe,
            Msg::Checkpoint {
                through: 30,
                state: Bytes::from_static(b"state"),
            },
        ]
    }

    fn decoded_peer(frame: &[u8]) -> Result<Msg, FrameError> {
        let (decoded, used) = Frame::decode(frame, 1 << 20).unwrap().unwrap();
        assert_eq!(used, frame.len());
        let Frame::Peer { stream: 9, message } = decoded else {
            panic!("not a peer frame of stream 9: {decoded:?}");
        };
        peer_msg(message)
    }

    #[test]
    fn every_peer_message_round_trips_and_every_sub_kind_has_a_sample() {
        let mut seen = Vec::new();
        for msg in peer_samples() {
            let frame = peer_frame(9, &msg).expect("a peer message");
            seen.push(frame[proto::FRAME_HEADER_LEN + 8]);
            assert_eq!(decoded_peer(&frame), Ok(msg));
        }
        for (code, name) in PEER_KINDS {
            assert!(seen.contains(code), "no sample of {name}");
        }
        let ack = Msg::Checkpointed {
            through: 1,
            resend: false,
        };
        assert_eq!(peer_frame(9, &ack), None, "a client message is no peer's");
    }

    /// `Replicate` is the documented layout: count u32, then the records
    /// back to back.
    #[test]
    fn a_replicate_frame_carries_the_count_and_the_records_as_logged() {
        let entries = entries();
        let frame = peer_frame(
            9,
            &Msg::Replicate {
                entries: entries.clone(),
            },
        )
        .unwrap();
        let body = &frame[proto::FRAME_HEADER_LEN..];
        assert_eq!(&body[..8], &9u64.to_le_bytes());
        assert_eq!(body[8], 1, "sub-kind replicate");
        assert_eq!(&body[9..13], &3u32.to_le_bytes());
        let records: Vec<u8> = entries
            .iter()
            .flat_map(|e| e.bytes.iter().copied())
            .collect();
        assert_eq!(&body[13..], &records[..]);
    }

    /// A `Replicate` with records of `RECORD_PART_MIN` bytes or more is
    /// sent in parts that share those records' bytes, and its bytes are
    /// the frame's, byte for byte; anything else is the frame itself.
    #[test]
    fn a_replicate_of_large_records_is_sent_in_parts_that_make_the_same_frame() {
        let sizes = [100, RECORD_PART_MIN, 50, 20_000, RECORD_PART_MIN - 40];
        let mut entries: Vec<Entry> = sizes
            .iter()
            .enumerate()
            .map(|(at, size)| entry(at as u64 + 1, *size))
            .collect();
        // A primary's record with a client's large payload left out of it.
        entries.push(split_entry(6, 9_000));
        let msg = Msg::Replicate {
            entries: entries.clone(),
        };
        let net::Chunk::Parts(parts) = peer_send(9, &msg).unwrap() else {
            panic!("large records go in parts");
        };
        // The head with the first small record; each large one as it is,
        // followed by the small ones after it, then the split record's
        // head after them and its payload as it is.
        assert_eq!(parts.len(), 7, "{parts:?}");
        let shares = |bytes: &Bytes| parts.iter().any(|part| part.as_ptr() == bytes.as_ptr());
        for large in [1, 3] {
            assert!(shares(&entries[large].bytes), "record {large}");
        }
        let payload = entries[5].payload.as_ref().expect("split");
        assert!(shares(payload), "the split record's payload");
        let sent: Vec<u8> = parts.iter().flat_map(|part| part.iter().copied()).collect();
        assert_eq!(sent, peer_frame(9, &msg).unwrap());
        let whole: Vec<Entry> = entries.iter().cloned().map(Entry::compact).collect();
        let whole = Msg::Replicate { entries: whole };
        assert_eq!(sent, peer_frame(9, &whole).unwrap());
        assert_eq!(decoded_peer(&sent), Ok(msg));
        for small in peer_samples() {
            assert_eq!(
                peer_send(9, &small),
                peer_frame(9, &small).map(net::Chunk::Owned)
            );
        }
    }

    /// Every cut and every flipped byte of every sample is an error or a
    /// message, never a panic; a record whose byte changed is refused by
    /// its checksum; a count the records do not match is malformed.
    #[test]
    fn damaged_peer_messages_are_errors_never_panics() {
        for msg in peer_samples() {
            let frame = peer_frame(9, &msg).unwrap();
            let body = &frame[proto::FRAME_HEADER_LEN + 8..];
            for cut in 0..body.len() {
                let _ = peer_msg(Bytes::copy_from_slice(&body[..cut]));
            }
            for at in 0..body.len() {
                let mut damaged = body.to_vec();
                damaged[at] ^= 0x41;
                let _ = peer_msg(Bytes::from(damaged));
            }
        }
        let frame = peer_frame(9, &Msg::Replicate { entries: entries() }).unwrap();
        let mut body = frame[proto::FRAME_HEADER_LEN + 8..].to_vec();
        let last = body.len() - 1;
        body[last] ^= 1;
        assert_eq!(
            peer_msg(Bytes::from(body.clone())),
            Err(FrameError::Malformed("replicate"))
        );
        body[last] ^= 1;
        body[1] = 4;
        assert_eq!(
            peer_msg(Bytes::from(body)),
            Err(FrameError::Malformed("replicate"))
        );
        assert_eq!(
            peer_msg(Bytes::from(vec![99])),
            Err(FrameError::Malformed("peer"))
        );
        assert_eq!(
            peer_msg(Bytes::from(vec![3, 1, 2])),
            Err(FrameError::Malformed("progress"))
        );
    }
}
