//! The versioning state machine of one stream: decides, for each append,
//! whether it is new (and which version it gets) or a duplicate.

use proto::{EventId, RecordHeader};

use crate::dedupe::{DedupeLimits, DedupeTable, Lookup};

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

    /// Records a message the log took (or a record found by recovery).
    pub fn record(&mut self, header: &RecordHeader) {
        assert_eq!(
            header.version,
            self.last_version + 1,
            "versions must be recorded densely"
        );
        self.last_version = header.version;
        self.epoch = self.epoch.max(header.epoch);
        if header.flags & proto::FLAG_VOID != 0 {
            // A void version holds no message and no event id to remember.
            return;
        }
        let event = header.event;
        self.dedupe.advance_low_water(
            event.client,
            event.session,
            header.low_water.min(event.sequence),
        );
        self.dedupe
            .insert(event.client, event.session, event.sequence, header.version);
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

    #[test]
    fn sequence_zero_is_refused() {
        let mut machine = StreamMachine::new(1, DedupeLimits::default());
        assert_eq!(machine.decide(event(0), 0), Err(Rejection::ZeroSequence));
    }
}
