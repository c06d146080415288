//! The dedupe table: which version each unretired event id got.
//!
//! Entries retire only by the low-water mark a client sends with its
//! appends (every sequence below it has been answered), never by a clock:
//! a retry that comes an hour late is still recognised.

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
        if low_water <= state.low_water {
            return;
        }
        // Usually one entry or none goes: pop from the front rather than
        // split the tree.
        while let Some(entry) = state.versions.first_entry() {
            if *entry.key() >= low_water {
                break;
            }
            entry.remove();
            self.entries -= 1;
        }
        state.low_water = low_water;
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

    /// Records that `sequence` of the session was logged as `version`.
    pub fn insert(&mut self, client: u128, session: u64, sequence: u64, version: u64) {
        let state = self.sessions.entry((client, session)).or_default();
        if sequence < state.low_water {
            // Replaying a record whose entry an earlier record's low-water
            // mark already retired: nothing to remember.
            return;
        }
        if state.versions.insert(sequence, version).is_none() {
            self.entries += 1;
        }
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
