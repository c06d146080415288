//! The dedupe table: which version each unretired event id got.
//!
//! Entries retire only by the low-water mark a client sends with its
//! appends (every sequence below it has been answered), never by a clock:
//! a retry that comes an hour late is still recognised.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

/// Bounds on the table, so a client that never advances its low-water mark
/// cannot grow the server's memory without limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DedupeLimits {
    /// Unretired event ids one session may hold.
    pub entries_per_session_max: usize,
    /// Unretired event ids across all sessions of a stream.
    pub entries_max: usize,
}

impl Default for DedupeLimits {
    fn default() -> Self {
        DedupeLimits {
            entries_per_session_max: 1 << 16,
            entries_max: 1 << 22,
        }
    }
}

#[derive(Default, Debug)]
struct Session {
    /// Every sequence below this was answered; their entries are gone.
    low_water: u64,
    /// Sequence to version for sequences at or above `low_water`.
    versions: BTreeMap<u64, u64>,
}

/// Client id and session.
type SessionKey = (u128, u64);

#[derive(Debug, Default)]
pub struct DedupeTable {
    sessions: HashMap<SessionKey, Session>,
    entries: usize,
    limits: DedupeLimits,
}

/// What the table knows of an event id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Never seen (or seen and not logged): a new message.
    New,
    /// Logged under this version.
    Logged(u64),
    /// Below the session's low-water mark: the client said it has the
    /// answer, so this is a protocol error, not a retry.
    Retired { low_water: u64 },
}

impl DedupeTable {
    pub fn new(limits: DedupeLimits) -> Self {
        DedupeTable {
            limits,
            ..DedupeTable::default()
        }
    }

    pub fn entries(&self) -> usize {
        self.entries
    }

    pub fn sessions(&self) -> usize {
        self.sessions.len()
    }

    /// Retires every entry of the session below `low_water`.
    pub fn advance_low_water(&mut self, client: u128, session: u64, low_water: u64) {
        let Some(state) = self.sessions.get_mut(&(client, session)) else {
            return;
        };
        self.entries -= retire_below(state, low_water);
    }

    pub fn lookup(&self, client: u128, session: u64, sequence: u64) -> Lookup {
        match self.sessions.get(&(client, session)) {
            None => Lookup::New,
            Some(state) if sequence < state.low_water => Lookup::Retired {
                low_water: state.low_water,
            },
            Some(state) => state
                .versions
                .get(&sequence)
                .map_or(Lookup::New, |&v| Lookup::Logged(v)),
        }
    }

    /// Whether one more entry for the session fits within the limits.
    pub fn has_room(&self, client: u128, session: u64) -> bool {
        let session_entries = self
            .sessions
            .get(&(client, session))
            .map_or(0, |s| s.versions.len());
        self.entries < self.limits.entries_max
            && session_entries < self.limits.entries_per_session_max
    }

    /// Retires the session's entries below `low_water`, then records that
    /// `sequence` was logged as `version`: [`DedupeTable::advance_low_water`]
    /// then [`DedupeTable::insert`] with one lookup of the session (a
    /// session seen for the first time takes no low-water mark, as there).
    /// Returns the version the event id was logged under before, if any.
    pub fn record(
        &mut self,
        client: u128,
        session: u64,
        low_water: u64,
        sequence: u64,
        version: u64,
    ) -> Option<u64> {
        let state = match self.sessions.entry((client, session)) {
            Entry::Vacant(vacant) => vacant.insert(Session::default()),
            Entry::Occupied(occupied) => {
                let state = occupied.into_mut();
                self.entries -= retire_below(state, low_water);
                state
            }
        };
        if sequence < state.low_water {
            // Replaying a record whose entry an earlier record's low-water
            // mark already retired: nothing to remember.
            return None;
        }
        let before = state.versions.insert(sequence, version);
        if before.is_none() {
            self.entries += 1;
        }
        before
    }

    /// Records that `sequence` of the session was logged as `version`
    /// ([`DedupeTable::record`] with no low-water mark to advance).
    pub fn insert(&mut self, client: u128, session: u64, sequence: u64, version: u64) {
        self.record(client, session, 0, sequence, version);
    }
}

/// Retires a session's entries below `low_water` and raises its mark to
/// it; returns how many went.
fn retire_below(state: &mut Session, low_water: u64) -> usize {
    if low_water <= state.low_water {
        return 0;
    }
    // Usually one entry or none goes: pop from the front rather than split
    // the tree.
    let mut retired = 0;
    while let Some(entry) = state.versions.first_entry() {
        if *entry.key() >= low_water {
            break;
        }
        entry.remove();
        retired += 1;
    }
    state.low_water = low_water;
    retired
}

/// Why a state snapshot could not be decoded.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad state snapshot: {0}")]
pub struct SnapshotError(pub String);

/// Reads little-endian values from a snapshot, failing at the end rather
/// than panicking.
pub(crate) struct SnapshotReader<'a> {
    bytes: &'a [u8],
}

impl<'a> SnapshotReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        SnapshotReader { bytes }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len()
    }

    fn take<const N: usize>(&mut self) -> Result<[u8; N], SnapshotError> {
        if self.bytes.len() < N {
            return Err(SnapshotError(format!(
                "cut short: {N} more bytes needed, {} left",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(N);
        self.bytes = rest;
        Ok(head.try_into().expect("N bytes"))
    }

    pub(crate) fn u32(&mut self) -> Result<u32, SnapshotError> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, SnapshotError> {
        self.take::<8>().map(u64::from_le_bytes)
    }

    fn u128(&mut self) -> Result<u128, SnapshotError> {
        self.take::<16>().map(u128::from_le_bytes)
    }

    /// A count of items of `item_bytes` each, no more than the bytes left
    /// can hold, so garbage cannot make the decoder allocate without limit.
    fn count(&mut self, item_bytes: usize, what: &str) -> Result<usize, SnapshotError> {
        let count = self.u64()?;
        if count > (self.remaining() / item_bytes) as u64 {
            return Err(SnapshotError(format!(
                "{count} {what} cannot fit in the {} bytes left",
                self.remaining()
            )));
        }
        Ok(count as usize)
    }
}

/// Bytes of a session's fixed part in a snapshot: client, session, low-water
/// mark, entry count.
const SESSION_SNAPSHOT_BYTES: usize = 16 + 8 + 8 + 8;
/// Bytes of one entry in a snapshot: sequence, version.
const ENTRY_SNAPSHOT_BYTES: usize = 16;

impl DedupeTable {
    /// Appends the table's whole state to `out`: the same table always
    /// gives the same bytes (sessions in key order), at most 40 bytes per
    /// session and 16 per entry. Limits are configuration and not included.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut keys: Vec<&SessionKey> = self.sessions.keys().collect();
        keys.sort_unstable();
        out.extend_from_slice(&(keys.len() as u64).to_le_bytes());
        for key in keys {
            let state = &self.sessions[key];
            out.extend_from_slice(&key.0.to_le_bytes());
            out.extend_from_slice(&key.1.to_le_bytes());
            out.extend_from_slice(&state.low_water.to_le_bytes());
            out.extend_from_slice(&(state.versions.len() as u64).to_le_bytes());
            for (&sequence, &version) in &state.versions {
                out.extend_from_slice(&sequence.to_le_bytes());
                out.extend_from_slice(&version.to_le_bytes());
            }
        }
    }

    /// Reads a table that [`DedupeTable::encode`] wrote, checking that
    /// sessions and sequences ascend, that no entry sits below its
    /// session's low-water mark, and that no version passes
    /// `last_version`. Never panics, whatever the bytes.
    pub(crate) fn decode(
        reader: &mut SnapshotReader<'_>,
        limits: DedupeLimits,
        last_version: u64,
    ) -> Result<DedupeTable, SnapshotError> {
        let mut table = DedupeTable::new(limits);
        let sessions = reader.count(SESSION_SNAPSHOT_BYTES, "sessions")?;
        let mut previous: Option<SessionKey> = None;
        for _ in 0..sessions {
            let key: SessionKey = (reader.u128()?, reader.u64()?);
            if previous.is_some_and(|p| p >= key) {
                return Err(SnapshotError(format!("session {key:?} out of order")));
            }
            previous = Some(key);
            let low_water = reader.u64()?;
            let entries = reader.count(ENTRY_SNAPSHOT_BYTES, "entries")?;
            let mut versions = BTreeMap::new();
            let mut last_sequence = None;
            for _ in 0..entries {
                let sequence = reader.u64()?;
                let version = reader.u64()?;
                if sequence < low_water || last_sequence.is_some_and(|l| l >= sequence) {
                    return Err(SnapshotError(format!(
                        "session {key:?}: sequence {sequence} out of order or below its low-water mark {low_water}"
                    )));
                }
                if version == 0 || version > last_version {
                    return Err(SnapshotError(format!(
                        "session {key:?}: version {version} outside 1..={last_version}"
                    )));
                }
                last_sequence = Some(sequence);
                versions.insert(sequence, version);
            }
            table.entries += versions.len();
            table.sessions.insert(
                key,
                Session {
                    low_water,
                    versions,
                },
            );
        }
        Ok(table)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_event_is_found_until_the_low_water_mark_passes_it() {
        let mut table = DedupeTable::default();
        table.insert(1, 1, 5, 100);
        table.insert(1, 1, 6, 101);
        assert_eq!(table.lookup(1, 1, 5), Lookup::Logged(100));
        assert_eq!(table.lookup(1, 2, 5), Lookup::New);
        assert_eq!(table.lookup(2, 1, 5), Lookup::New);
        table.advance_low_water(1, 1, 6);
        assert_eq!(table.lookup(1, 1, 5), Lookup::Retired { low_water: 6 });
        assert_eq!(table.lookup(1, 1, 6), Lookup::Logged(101));
        assert_eq!(table.entries(), 1);
    }

    /// `record` is `advance_low_water` then `insert`, in every case of a
    /// small run (a first session takes no mark; marks that retire, that
    /// do not, and that pass the sequence; the same sequence again), and
    /// returns what a lookup before it found logged.
    #[test]
    fn record_is_advance_then_insert_and_returns_the_version_before() {
        let steps = [
            (1, 5, 0, 10),
            (1, 5, 6, 11),
            (1, 3, 7, 12),
            (2, 9, 1, 13),
            (1, 6, 6, 14),
            (1, 8, 9, 15),
            (1, 8, 8, 16),
            (1, 2, 2, 17),
        ];
        let mut one = DedupeTable::default();
        let mut two = DedupeTable::default();
        for (session, low_water, sequence, version) in steps {
            let before = match one.lookup(7, session, sequence) {
                Lookup::Logged(version) => Some(version),
                _ => None,
            };
            assert_eq!(one.record(7, session, low_water, sequence, version), before);
            two.advance_low_water(7, session, low_water);
            two.insert(7, session, sequence, version);
            assert_eq!(one.entries(), two.entries());
            for probe in 0..12 {
                for session in [1, 2] {
                    assert_eq!(one.lookup(7, session, probe), two.lookup(7, session, probe));
                }
            }
        }
    }

    #[test]
    fn a_low_water_mark_never_moves_back() {
        let mut table = DedupeTable::default();
        table.insert(1, 1, 10, 1);
        table.advance_low_water(1, 1, 8);
        table.advance_low_water(1, 1, 3);
        assert_eq!(table.lookup(1, 1, 5), Lookup::Retired { low_water: 8 });
    }

    #[test]
    fn limits_bound_each_session_and_the_whole_table() {
        let mut table = DedupeTable::new(DedupeLimits {
            entries_per_session_max: 2,
            entries_max: 3,
        });
        table.insert(1, 1, 1, 1);
        table.insert(1, 1, 2, 2);
        assert!(!table.has_room(1, 1));
        assert!(table.has_room(1, 2));
        table.insert(1, 2, 1, 3);
        assert!(!table.has_room(1, 3));
        table.advance_low_water(1, 1, 3);
        assert!(table.has_room(1, 1));
    }
}
