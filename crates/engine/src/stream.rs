//! The versioning state machine of one stream: decides, for each append,
//! whether it is new (and which version it gets) or a duplicate.

use proto::{EventId, RecordHeader};

use crate::dedupe::{DedupeLimits, DedupeTable, Lookup, SnapshotError, SnapshotReader};

/// The format version of a state snapshot.
pub const STATE_FORMAT_VERSION: u32 = 1;
/// Leads every state snapshot, so bytes of another kind are refused at once.
const STATE_MAGIC: [u8; 8] = *b"STLGSM\0\0";

/// The decision for one append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A new message: log it under `version`, then call
    /// [`StreamMachine::record`].
    Assign { version: u64 },
    /// Already logged under `version`: answer with it and the `duplicate`
    /// flag, log nothing.
    Duplicate { version: u64 },
}

/// Why an append cannot be taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("sequence {sequence} is below the session's low-water mark {low_water}; the client already had its answer")]
    Retired { sequence: u64, low_water: u64 },
    #[error("the session has too many unanswered sequences; advance the low-water mark")]
    DedupeFull,
    #[error("sequence 0 is not valid: sequences start at 1")]
    ZeroSequence,
}

#[derive(Debug)]
pub struct StreamMachine {
    last_version: u64,
    epoch: u64,
    dedupe: DedupeTable,
}

impl StreamMachine {
    pub fn new(epoch: u64, limits: DedupeLimits) -> Self {
        StreamMachine {
            last_version: 0,
            epoch,
            dedupe: DedupeTable::new(limits),
        }
    }

    pub fn last_version(&self) -> u64 {
        self.last_version
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    pub fn dedupe(&self) -> &DedupeTable {
        &self.dedupe
    }

    /// Decides what to do with an append. Changes nothing but retiring
    /// entries below the low-water mark; a new message counts only once
    /// [`StreamMachine::record`] is called after the log took it.
    pub fn decide(&mut self, event: EventId, low_water: u64) -> Result<Decision, Rejection> {
        if event.sequence == 0 {
            return Err(Rejection::ZeroSequence);
        }
        // A low-water mark above the message's own sequence would retire
        // the message itself; the client cannot have that answer yet.
        let low_water = low_water.min(event.sequence);
        self.dedupe
            .advance_low_water(event.client, event.session, low_water);
        match self
            .dedupe
            .lookup(event.client, event.session, event.sequence)
        {
            Lookup::Logged(version) => Ok(Decision::Duplicate { version }),
            Lookup::Retired { low_water } => Err(Rejection::Retired {
                sequence: event.sequence,
                low_water,
            }),
            Lookup::New if !self.dedupe.has_room(event.client, event.session) => {
                Err(Rejection::DedupeFull)
            }
            Lookup::New => Ok(Decision::Assign {
                version: self.last_version + 1,
            }),
        }
    }

    /// The machine's whole state as bytes, for a checkpoint: magic
    /// `STLGSM\0\0`, format version (u32), last version, epoch, then the
    /// dedupe table (see [`DedupeTable::encode`]). The same state always
    /// gives the same bytes; the size is bounded by the dedupe limits.
    pub fn encode_state(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32 + self.dedupe.entries() * 16);
        out.extend_from_slice(&STATE_MAGIC);
        out.extend_from_slice(&STATE_FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&self.last_version.to_le_bytes());
        out.extend_from_slice(&self.epoch.to_le_bytes());
        self.dedupe.encode(&mut out);
        out
    }

    /// Rebuilds a machine from [`StreamMachine::encode_state`]'s bytes,
    /// with `limits` for its dedupe table. Never panics, whatever the
    /// bytes.
    pub fn decode_state(bytes: &[u8], limits: DedupeLimits) -> Result<Self, SnapshotError> {
        if bytes.get(..STATE_MAGIC.len()) != Some(&STATE_MAGIC[..]) {
            return Err(SnapshotError("not a stream state (bad magic)".into()));
        }
        let mut reader = SnapshotReader::new(&bytes[STATE_MAGIC.len()..]);
        let format = reader.u32()?;
        if format != STATE_FORMAT_VERSION {
            return Err(SnapshotError(format!(
                "unsupported state format version {format}"
            )));
        }
        let last_version = reader.u64()?;
        let epoch = reader.u64()?;
        let dedupe = DedupeTable::decode(&mut reader, limits, last_version)?;
        if reader.remaining() != 0 {
            return Err(SnapshotError(format!(
                "{} bytes after the end",
                reader.remaining()
            )));
        }
        Ok(StreamMachine {
            last_version,
            epoch,
            dedupe,
        })
    }

    /// Raises the epoch to at least `epoch` (a restored machine keeps the
    /// newer of its snapshot's and its placement's).
    pub(crate) fn raise_epoch(&mut self, epoch: u64) {
        self.epoch = self.epoch.max(epoch);
    }

    /// Records a message the log took (or a record found by recovery);
    /// returns the version its event id was logged under before, if any.
    pub fn record(&mut self, header: &RecordHeader) -> Option<u64> {
        assert_eq!(
            header.version,
            self.last_version + 1,
            "versions must be recorded densely"
        );
        self.last_version = header.version;
        self.epoch = self.epoch.max(header.epoch);
        if header.flags & proto::FLAG_VOID != 0 {
            // A void version holds no message and no event id to remember.
            return None;
        }
        let event = header.event;
        self.dedupe.record(
            event.client,
            event.session,
            header.low_water.min(event.sequence),
            event.sequence,
            header.version,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(sequence: u64) -> EventId {
        EventId {
            client: 42,
            session: 1,
            sequence,
        }
    }

    fn header(version: u64, sequence: u64, low_water: u64) -> RecordHeader {
        RecordHeader {
            flags: 0,
            stream: 1,
            version,
            epoch: 1,
            event: event(sequence),
            low_water,
        }
    }

    #[test]
    fn new_events_get_dense_versions_and_retries_get_the_original() {
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        for sequence in 1..=3 {
            let decision = machine.decide(event(sequence), 1).unwrap();
            assert_eq!(decision, Decision::Assign { version: sequence });
            machine.record(&header(sequence, sequence, 1));
        }
        assert_eq!(
            machine.decide(event(2), 1),
            Ok(Decision::Duplicate { version: 2 })
        );
        assert_eq!(
            machine.decide(event(4), 1),
            Ok(Decision::Assign { version: 4 })
        );
    }

    #[test]
    fn deciding_without_recording_hands_out_the_same_version_again() {
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        assert_eq!(
            machine.decide(event(1), 1),
            Ok(Decision::Assign { version: 1 })
        );
        assert_eq!(
            machine.decide(event(1), 1),
            Ok(Decision::Assign { version: 1 })
        );
    }

    #[test]
    fn a_retired_sequence_is_rejected_not_logged_again() {
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        machine.record(&header(1, 1, 1));
        machine.record(&header(2, 2, 2));
        assert_eq!(
            machine.decide(event(1), 2),
            Err(Rejection::Retired {
                sequence: 1,
                low_water: 2
            })
        );
    }

    #[test]
    fn replaying_records_rebuilds_the_same_table() {
        let mut live = StreamMachine::new(1, DedupeLimits::default());
        let mut replayed = StreamMachine::new(1, DedupeLimits::default());
        let mut headers = Vec::new();
        for sequence in 1..=50u64 {
            let low_water = sequence.saturating_sub(10).max(1);
            let Decision::Assign { version } = live.decide(event(sequence), low_water).unwrap()
            else {
                panic!("new event treated as duplicate");
            };
            let h = header(version, sequence, low_water);
            live.record(&h);
            headers.push(h);
        }
        for h in &headers {
            replayed.record(h);
        }
        for sequence in 1..=50 {
            assert_eq!(
                live.decide(event(sequence), 1),
                replayed.decide(event(sequence), 1)
            );
        }
        assert_eq!(live.dedupe().entries(), replayed.dedupe().entries());
    }

    /// A log of `count` records from a few clients and sessions, with
    /// low-water marks that move (and sometimes lag), retries that are
    /// answered as duplicates, void versions and epoch changes: the
    /// headers a primary would log.
    fn random_log(random: &mut proto::Rng, count: usize) -> Vec<RecordHeader> {
        let mut live = StreamMachine::new(1, DedupeLimits::default());
        let mut next_sequence = std::collections::HashMap::new();
        let mut headers = Vec::new();
        let mut epoch = 1;
        while headers.len() < count {
            let version = live.last_version() + 1;
            if random.below(10) == 0 {
                epoch += random.below(2);
            }
            if random.below(15) == 0 {
                let void = RecordHeader {
                    flags: proto::FLAG_VOID,
                    stream: 1,
                    version,
                    epoch,
                    event: EventId {
                        client: 0,
                        session: 0,
                        sequence: version,
                    },
                    low_water: 0,
                };
                live.record(&void);
                headers.push(void);
                continue;
            }
            let client = 1 + random.below(3) as u128;
            let session = random.below(3);
            let next = next_sequence.entry((client, session)).or_insert(1u64);
            // Sometimes a retry of an earlier sequence.
            let sequence = if *next > 1 && random.below(5) == 0 {
                1 + random.below(*next - 1)
            } else {
                *next
            };
            let low_water = 1 + random.below(sequence);
            let event = EventId {
                client,
                session,
                sequence,
            };
            if let Ok(Decision::Assign { version }) = live.decide(event, low_water) {
                let header = RecordHeader {
                    flags: 0,
                    stream: 1,
                    version,
                    epoch,
                    event,
                    low_water,
                };
                live.record(&header);
                headers.push(header);
                if sequence == *next {
                    *next += 1;
                }
            }
        }
        headers
    }

    #[test]
    fn a_restored_state_plus_the_records_after_it_equals_replaying_the_whole_log() {
        for seed in 1..=200u64 {
            let mut random = proto::Rng::new(seed);
            let count = 1 + random.below(300) as usize;
            let headers = random_log(&mut random, count);
            let cut = random.below(count as u64 + 1) as usize;
            let mut whole = StreamMachine::new(1, DedupeLimits::default());
            for h in &headers {
                whole.record(h);
            }
            let mut before = StreamMachine::new(1, DedupeLimits::default());
            for h in &headers[..cut] {
                before.record(h);
            }
            let snapshot = before.encode_state();
            let mut restored = StreamMachine::decode_state(&snapshot, DedupeLimits::default())
                .unwrap_or_else(|error| panic!("seed {seed}: {error}"));
            assert_eq!(restored.encode_state(), snapshot, "seed {seed}: round trip");
            for h in &headers[cut..] {
                restored.record(h);
            }
            assert_eq!(
                restored.encode_state(),
                whole.encode_state(),
                "seed {seed}: cut at {cut} of {count}"
            );
            assert_eq!(restored.dedupe().entries(), whole.dedupe().entries());
            assert_eq!(restored.epoch(), whole.epoch());
            // And they answer every event id alike.
            for client in 1..=3u128 {
                for session in 0..3 {
                    for sequence in 1..40 {
                        let event = EventId {
                            client,
                            session,
                            sequence,
                        };
                        assert_eq!(
                            restored.decide(event, 0),
                            whole.decide(event, 0),
                            "seed {seed}: {event:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_same_state_always_encodes_to_the_same_bytes() {
        let mut random = proto::Rng::new(77);
        let headers = random_log(&mut random, 500);
        let mut first = StreamMachine::new(1, DedupeLimits::default());
        let mut second = StreamMachine::new(1, DedupeLimits::default());
        for h in &headers {
            first.record(h);
        }
        for h in &headers {
            second.record(h);
        }
        assert_eq!(first.encode_state(), second.encode_state());
        assert!(first.dedupe().entries() > 0);
    }

    #[test]
    fn garbage_never_panics_the_state_decoder() {
        let mut random = proto::Rng::new(5);
        let headers = random_log(&mut random, 200);
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        for h in &headers {
            machine.record(h);
        }
        let valid = machine.encode_state();
        let limits = DedupeLimits::default();
        for cut in 0..valid.len() {
            assert!(
                StreamMachine::decode_state(&valid[..cut], limits).is_err(),
                "cut {cut}"
            );
        }
        for round in 0..20_000 {
            let mut bytes = if round % 2 == 0 {
                valid.clone()
            } else {
                let mut bytes: Vec<u8> = (0..random.below(200))
                    .map(|_| random.next_u64() as u8)
                    .collect();
                if round % 4 == 1 && bytes.len() >= 12 {
                    bytes[..8].copy_from_slice(&STATE_MAGIC);
                    bytes[8..12].copy_from_slice(&STATE_FORMAT_VERSION.to_le_bytes());
                }
                bytes
            };
            for _ in 0..1 + random.below(4) {
                if !bytes.is_empty() {
                    let at = random.below(bytes.len() as u64) as usize;
                    bytes[at] = random.next_u64() as u8;
                }
            }
            // Whatever it decodes to must encode back to the same bytes.
            if let Ok(decoded) = StreamMachine::decode_state(&bytes, limits) {
                assert_eq!(decoded.encode_state(), bytes, "round {round}");
            }
        }
    }

    #[test]
    fn sequence_zero_is_refused() {
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        assert_eq!(machine.decide(event(0), 0), Err(Rejection::ZeroSequence));
    }
}
