//! The failure detector's decisions, with no I/O and no clock of its own:
//! the leader feeds it heartbeats and the time, and it names the members
//! to remove.
//!
//! A member is one incarnation, `(id, join_view)`. The leader remembers when
//! it last heard from each. When it becomes leader it has heard from nobody
//! yet, so it counts every member as just heard (a grace period of one
//! suspect timeout). A member silent for longer than the suspect timeout is
//! named once; the leader itself is never named.
//!
//! The leader's own pauses count against nobody: when its checks are
//! further apart than half the suspect timeout, its process was stalled
//! (no CPU, a blocked runtime) and the heartbeats of that time may still
//! be waiting to be read, so it counts every member as just heard again,
//! as a new leader does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use crate::state::{Member, ServerId};

/// A member to remove, and how long it has been silent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Suspect {
    pub(crate) id: ServerId,
    pub(crate) join_view: u64,
    pub(crate) silent: Duration,
}

/// The leader's memory of its members' heartbeats.
#[derive(Debug)]
pub(crate) struct Detector {
    suspect_timeout: Duration,
    last_heard: HashMap<(ServerId, u64), Instant>,
    /// Incarnations already named, so each is removed once.
    named: HashSet<(ServerId, u64)>,
    /// When `suspects` last ran.
    checked: Option<Instant>,
}

impl Detector {
    pub(crate) fn new(suspect_timeout: Duration) -> Detector {
        Detector {
            suspect_timeout,
            last_heard: HashMap::new(),
            named: HashSet::new(),
            checked: None,
        }
    }

    /// This server has just become leader: forget everything and count
    /// every member as heard now.
    pub(crate) fn lead(&mut self, now: Instant, members: &BTreeMap<ServerId, Member>) {
        self.last_heard.clear();
        self.named.clear();
        self.checked = None;
        for member in members.values() {
            self.last_heard.insert((member.id, member.join_view), now);
        }
    }

    pub(crate) fn heard(&mut self, id: ServerId, join_view: u64, now: Instant) {
        self.last_heard.insert((id, join_view), now);
    }

    /// A removal of this incarnation did not commit: name it again if it
    /// stays silent.
    pub(crate) fn unname(&mut self, id: ServerId, join_view: u64) {
        self.named.remove(&(id, join_view));
    }

    /// The members silent for longer than the suspect timeout, each named
    /// once. Entries of former members are forgotten; a member seen here
    /// for the first time counts as just heard.
    pub(crate) fn suspects(
        &mut self,
        now: Instant,
        members: &BTreeMap<ServerId, Member>,
        leader: ServerId,
    ) -> Vec<Suspect> {
        let current = |key: &(ServerId, u64)| {
            members
                .get(&key.0)
                .is_some_and(|member| member.join_view == key.1)
        };
        self.last_heard.retain(|key, _| current(key));
        self.named.retain(|key| current(key));
        let paused = self.checked.is_some_and(|checked| {
            now.saturating_duration_since(checked) > self.suspect_timeout / 2
        });
        self.checked = Some(now);
        if paused {
            // This leader was stalled: what it did not hear, it may not
            // have read yet.
            for last in self.last_heard.values_mut() {
                *last = now;
            }
        }
        let mut suspects = Vec::new();
        for member in members.values() {
            let key = (member.id, member.join_view);
            let last = *self.last_heard.entry(key).or_insert(now);
            let silent = now.saturating_duration_since(last);
            if member.id == leader || silent <= self.suspect_timeout || self.named.contains(&key) {
                continue;
            }
            self.named.insert(key);
            suspects.push(Suspect {
                id: member.id,
                join_view: member.join_view,
                silent,
            });
        }
        suspects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(list: &[(ServerId, u64)]) -> BTreeMap<ServerId, Member> {
        list.iter()
            .map(|&(id, join_view)| {
                let member = Member {
                    id,
                    address: format!("127.0.0.1:{}", 7000 + id),
                    join_view,
                    roles: Vec::new(),
                    admin_only: false,
                    nonce: 0,
                };
                (id, member)
            })
            .collect()
    }

    const TIMEOUT: Duration = Duration::from_millis(1000);

    #[test]
    fn a_new_leader_gives_every_member_a_grace_period() {
        let start = Instant::now();
        let view = members(&[(1, 1), (2, 2), (3, 3)]);
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &view);
        assert!(detector
            .suspects(start + Duration::from_millis(900), &view, 1)
            .is_empty());
        let suspects = detector.suspects(start + Duration::from_millis(1100), &view, 1);
        let named: Vec<ServerId> = suspects.iter().map(|s| s.id).collect();
        assert_eq!(named, vec![2, 3]);
        assert_eq!(suspects[0].silent, Duration::from_millis(1100));
    }

    #[test]
    fn heartbeats_keep_a_member_and_a_silent_one_is_named_once() {
        let start = Instant::now();
        let view = members(&[(1, 1), (2, 2), (3, 3)]);
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &view);
        for step in 1..=20u64 {
            let now = start + Duration::from_millis(100 * step);
            detector.heard(2, 2, now);
            let suspects = detector.suspects(now, &view, 1);
            if step == 11 {
                assert_eq!(suspects.len(), 1);
                assert_eq!((suspects[0].id, suspects[0].join_view), (3, 3));
            } else {
                assert!(suspects.is_empty(), "step {step}: {suspects:?}");
            }
        }
    }

    #[test]
    fn the_leader_is_never_named() {
        let start = Instant::now();
        let view = members(&[(1, 1)]);
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &view);
        assert!(detector
            .suspects(start + Duration::from_secs(60), &view, 1)
            .is_empty());
    }

    #[test]
    fn a_rejoined_member_is_a_new_incarnation_with_its_own_grace() {
        let start = Instant::now();
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &members(&[(1, 1), (2, 2)]));
        let later = start + Duration::from_millis(1500);
        let rejoined = members(&[(1, 1), (2, 3)]);
        assert!(detector.suspects(later, &rejoined, 1).is_empty());
        // The leader checks every 100 ms. A heartbeat from the former
        // incarnation does not keep the new one.
        for step in 1..=11u64 {
            let now = later + Duration::from_millis(100 * step);
            detector.heard(2, 2, now);
            let suspects = detector.suspects(now, &rejoined, 1);
            if step < 11 {
                assert!(suspects.is_empty(), "step {step}: {suspects:?}");
            } else {
                assert_eq!(suspects.len(), 1);
                assert_eq!(suspects[0].join_view, 3);
            }
        }
    }

    #[test]
    fn a_stall_of_the_leader_itself_counts_against_no_member() {
        let start = Instant::now();
        let view = members(&[(1, 1), (2, 2), (3, 3)]);
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &view);
        let at = |ms: u64| start + Duration::from_millis(ms);
        for ms in [100, 200, 300] {
            detector.heard(2, 2, at(ms));
            detector.heard(3, 3, at(ms));
            assert!(detector.suspects(at(ms), &view, 1).is_empty());
        }
        // The leader's next check comes 1,100 ms late: nobody is named,
        // though nothing was heard for longer than the timeout.
        assert!(detector.suspects(at(1400), &view, 1).is_empty());
        // Then server 3 stays silent and is named a timeout after the
        // stall, not before; server 2 keeps up.
        for ms in (1500..=2500).step_by(100) {
            detector.heard(2, 2, at(ms));
            let named: Vec<ServerId> = detector
                .suspects(at(ms), &view, 1)
                .iter()
                .map(|s| s.id)
                .collect();
            let expected = if ms == 2500 { vec![3] } else { vec![] };
            assert_eq!(named, expected, "at {ms} ms");
        }
    }

    #[test]
    fn a_removal_that_did_not_commit_is_named_again() {
        let start = Instant::now();
        let view = members(&[(1, 1), (2, 2)]);
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &view);
        let late = start + Duration::from_millis(1100);
        assert_eq!(detector.suspects(late, &view, 1).len(), 1);
        assert!(detector.suspects(late, &view, 1).is_empty());
        detector.unname(2, 2);
        assert_eq!(detector.suspects(late, &view, 1).len(), 1);
    }

    #[test]
    fn leading_again_forgets_what_was_named() {
        let start = Instant::now();
        let view = members(&[(1, 1), (2, 2)]);
        let mut detector = Detector::new(TIMEOUT);
        detector.lead(start, &view);
        let late = start + Duration::from_millis(1100);
        assert_eq!(detector.suspects(late, &view, 1).len(), 1);
        detector.lead(late, &view);
        assert!(detector.suspects(late, &view, 1).is_empty());
        // Checking every 100 ms, the silent member is named again a
        // timeout later.
        let named: Vec<u64> = (1..=11u64)
            .filter(|step| {
                let now = late + Duration::from_millis(100 * step);
                !detector.suspects(now, &view, 1).is_empty()
            })
            .collect();
        assert_eq!(named, vec![11]);
    }
}
