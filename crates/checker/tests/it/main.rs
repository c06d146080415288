//! The checker's integration tests: a clean history, each violation
//! injected alone and counted exactly, the histories that must stay clean,
//! and a seeded randomized test over single faults.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

mod reads;

use std::time::Instant;

use checker::{check, digest, Acked, ClientHistory, EventId, Logged, ReplicaLog, Report, Sent};
use proto::Rng;

/// The violation counts of a report, compared as one value so a test shows
/// every count when it fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Counts {
    lost: u64,
    duplicated: u64,
    conflicting_versions: u64,
    gaps: u64,
    reordered: u64,
    divergent: u64,
    misplaced_acks: u64,
    unknown_events: u64,
}

fn counts(report: &Report) -> Counts {
    Counts {
        lost: report.lost,
        duplicated: report.duplicated,
        conflicting_versions: report.conflicting_versions,
        gaps: report.gaps,
        reordered: report.reordered,
        divergent: report.divergent,
        misplaced_acks: report.misplaced_acks,
        unknown_events: report.unknown_events,
    }
}

const CLIENTS: u64 = 2;
const SESSIONS: u64 = 2;
const UNLOGGED_PER_SESSION: u64 = 2;

/// A clean run: `n` messages at versions 1..=n on three replicas, from two
/// clients with two sessions each. Every 5th version was never
/// acknowledged (its ack was lost), every 7th acknowledged one was also
/// answered a second time as a duplicate, and each session also sent
/// messages that were never logged nor acknowledged.
struct History {
    n: u64,
    clients: Vec<ClientHistory>,
    replicas: Vec<ReplicaLog>,
    /// The message at each version, index `version - 1`.
    messages: Vec<Logged>,
    /// Where the (first) ack of each acknowledged version sits:
    /// (client index, ack index).
    ack_at: Vec<Option<(usize, usize)>>,
    /// Serial for fresh messages injected by tests.
    fresh: u64,
}

fn event(client: u64, session: u64, sequence: u64) -> EventId {
    EventId {
        client: 0x5eed_0000_0000_0000_0000_0000_0000_0000 | u128::from(client),
        session,
        sequence,
    }
}

fn is_acked(version: u64) -> bool {
    !version.is_multiple_of(5)
}

impl History {
    fn clean(n: u64) -> Self {
        let mut clients = vec![ClientHistory::default(); CLIENTS as usize];
        let mut sequences = vec![0u64; (CLIENTS * SESSIONS) as usize];
        let mut messages = Vec::new();
        let mut ack_at = Vec::new();
        for version in 1..=n {
            let producer = (version * 7 + version / 3) % (CLIENTS * SESSIONS);
            let (client, session) = (producer / SESSIONS, producer % SESSIONS);
            sequences[producer as usize] += 1;
            let event = event(client, session, sequences[producer as usize]);
            let digest = digest(
                format!("key-{version}").as_bytes(),
                format!("payload of message {version}").as_bytes(),
            );
            let history = &mut clients[client as usize];
            history.sent.push(Sent { event, digest });
            if is_acked(version) {
                ack_at.push(Some((client as usize, history.acked.len())));
                history.acked.push(Acked {
                    event,
                    version,
                    duplicate: false,
                });
                if version.is_multiple_of(7) {
                    history.acked.push(Acked {
                        event,
                        version,
                        duplicate: true,
                    });
                }
            } else {
                ack_at.push(None);
            }
            messages.push(Logged {
                version,
                event,
                digest,
            });
        }
        for (producer, sequence) in sequences.iter().enumerate() {
            let producer = producer as u64;
            let (client, session) = (producer / SESSIONS, producer % SESSIONS);
            for extra in 1..=UNLOGGED_PER_SESSION {
                clients[client as usize].sent.push(Sent {
                    event: event(client, session, sequence + extra),
                    digest: digest(b"never", &extra.to_le_bytes()),
                });
            }
        }
        let replicas = ["a", "b", "c"]
            .iter()
            .map(|name| ReplicaLog {
                replica: name.to_string(),
                records: messages.clone(),
            })
            .collect();
        History {
            n,
            clients,
            replicas,
            messages,
            ack_at,
            fresh: 0,
        }
    }

    fn check(&self) -> Report {
        check(&self.clients, &self.replicas, None)
    }

    fn message(&self, version: u64) -> Logged {
        self.messages[(version - 1) as usize]
    }

    /// Removes the record at `version` from one replica.
    fn drop_record(&mut self, replica: usize, version: u64) {
        self.replicas[replica]
            .records
            .retain(|r| r.version != version);
    }

    /// Replaces the record at `version` on one replica.
    fn replace(&mut self, replica: usize, version: u64, with: Logged) {
        let record = self.replicas[replica]
            .records
            .iter_mut()
            .find(|r| r.version == version)
            .expect("version present");
        *record = with;
    }

    /// A message some client sent that no replica logged and nobody
    /// acknowledged, placed at `version`.
    fn fresh_sent(&mut self, version: u64) -> Logged {
        let logged = self.fresh_unsent(version);
        self.clients[0].sent.push(Sent {
            event: logged.event,
            digest: logged.digest,
        });
        logged
    }

    /// A message no client sent, placed at `version`.
    fn fresh_unsent(&mut self, version: u64) -> Logged {
        self.fresh += 1;
        Logged {
            version,
            event: event(99, 0, self.fresh),
            digest: digest(b"fresh", &self.fresh.to_le_bytes()),
        }
    }

    fn ack_mut(&mut self, version: u64) -> &mut Acked {
        let (client, index) = self.ack_at[(version - 1) as usize].expect("acknowledged version");
        &mut self.clients[client].acked[index]
    }
}

fn acked(version: u64) -> u64 {
    u64::from(is_acked(version))
}

#[test]
fn a_clean_history_of_three_replicas_reports_zero_everywhere() {
    let history = History::clean(100);
    let report = history.check();
    assert_eq!(counts(&report), Counts::default(), "{report}");
    assert!(report.is_clean(), "{report}");
    assert!(report.examples.is_empty(), "{report}");
    assert_eq!(report.acknowledged, 80);
    assert_eq!(report.logged_versions, 100);
    let committed = check(&history.clients, &history.replicas, Some(100));
    assert_eq!(committed, report);
}

#[test]
fn an_empty_history_is_clean() {
    let report = check(&[], &[], None);
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.logged_versions, 0);
}

#[test]
fn an_acknowledged_message_on_no_replica_is_lost() {
    let mut history = History::clean(21);
    assert!(is_acked(21));
    for replica in 0..3 {
        history.drop_record(replica, 21);
    }
    let report = history.check();
    let expected = Counts {
        lost: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
    assert!(!report.is_clean());
    assert!(report.examples[0].contains("version 21"), "{report}");
}

#[test]
fn an_acknowledged_record_dropped_from_one_replica_is_lost_a_gap_and_divergent() {
    let mut history = History::clean(30);
    history.drop_record(1, 12);
    let report = history.check();
    let expected = Counts {
        lost: 1,
        gaps: 1,
        divergent: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
    assert!(
        report.examples.iter().any(|e| e.contains("replica b")),
        "{report}"
    );
}

#[test]
fn an_unacknowledged_record_dropped_from_one_replica_is_a_gap_and_divergent_but_not_lost() {
    let mut history = History::clean(30);
    history.drop_record(2, 15);
    let report = history.check();
    let expected = Counts {
        gaps: 1,
        divergent: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn a_middle_version_missing_from_every_replica_is_one_gap_per_replica() {
    let mut history = History::clean(30);
    for replica in 0..3 {
        history.drop_record(replica, 10);
    }
    let report = history.check();
    let expected = Counts {
        gaps: 3,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn several_missing_versions_count_one_gap_each() {
    let mut history = History::clean(30);
    for version in 11..=14 {
        history.drop_record(0, version);
    }
    let report = history.check();
    // 11..=14: four gaps and four divergent versions; 11, 12, 13, 14
    // are all acknowledged, so four lost messages.
    let expected = Counts {
        lost: 4,
        gaps: 4,
        divergent: 4,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn an_event_logged_at_two_versions_counts_one_duplicated_event() {
    let mut history = History::clean(30);
    let copy = history.message(8);
    for replica in &mut history.replicas {
        replica.records.push(Logged {
            version: 31,
            ..copy
        });
    }
    let report = history.check();
    let expected = Counts {
        duplicated: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
    assert!(report.examples[0].contains("versions 8 and 31"), "{report}");
}

#[test]
fn an_event_logged_three_times_still_counts_one_duplicated_event() {
    let mut history = History::clean(30);
    let copy = history.message(8);
    for replica in &mut history.replicas {
        for version in [31, 32] {
            replica.records.push(Logged { version, ..copy });
        }
    }
    let report = history.check();
    let expected = Counts {
        duplicated: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn two_messages_at_one_version_on_different_replicas_conflict_and_diverge() {
    let mut history = History::clean(30);
    assert!(!is_acked(10));
    let other = history.fresh_sent(10);
    history.replace(1, 10, other);
    let report = history.check();
    let expected = Counts {
        conflicting_versions: 1,
        divergent: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn a_conflict_at_an_acknowledged_version_also_misplaces_the_ack_and_loses_the_message() {
    let mut history = History::clean(30);
    let other = history.fresh_sent(11);
    history.replace(0, 11, other);
    let report = history.check();
    let expected = Counts {
        lost: 1,
        conflicting_versions: 1,
        divergent: 1,
        misplaced_acks: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn two_messages_at_one_version_in_one_replica_conflict_without_diverging() {
    let mut history = History::clean(30);
    let other = history.fresh_sent(10);
    let records = &mut history.replicas[0].records;
    let at = records
        .iter()
        .position(|r| r.version == 10)
        .expect("present");
    records.insert(at + 1, other);
    let report = history.check();
    // The repeat of version 10 is also a non-increase in log order.
    let expected = Counts {
        conflicting_versions: 1,
        reordered: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn swapping_two_neighbouring_records_counts_one_reordering() {
    let mut history = History::clean(30);
    history.replicas[2].records.swap(16, 17);
    let report = history.check();
    let expected = Counts {
        reordered: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn a_changed_digest_on_one_replica_conflicts_diverges_and_is_content_nobody_sent() {
    let mut history = History::clean(30);
    assert!(!is_acked(20));
    let mut record = history.message(20);
    record.digest ^= 1;
    history.replace(1, 20, record);
    let report = history.check();
    let expected = Counts {
        conflicting_versions: 1,
        divergent: 1,
        unknown_events: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn a_changed_digest_at_an_acknowledged_version_also_misplaces_the_ack() {
    let mut history = History::clean(30);
    let mut record = history.message(19);
    record.digest ^= 0x8000;
    history.replace(0, 19, record);
    let report = history.check();
    let expected = Counts {
        conflicting_versions: 1,
        divergent: 1,
        unknown_events: 1,
        misplaced_acks: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn a_changed_digest_on_every_replica_is_caught_as_content_nobody_sent() {
    let mut history = History::clean(30);
    let mut record = history.message(20);
    record.digest ^= 1;
    for replica in 0..3 {
        history.replace(replica, 20, record);
    }
    let report = history.check();
    let expected = Counts {
        unknown_events: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn an_ack_with_a_wrong_version_is_misplaced() {
    let mut history = History::clean(30);
    history.ack_mut(12).version = 13;
    let report = history.check();
    let expected = Counts {
        misplaced_acks: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
    assert!(report.examples[0].contains("version 13"), "{report}");
}

#[test]
fn an_ack_past_the_end_of_the_log_is_misplaced() {
    let mut history = History::clean(30);
    history.ack_mut(12).version = 500;
    let report = history.check();
    let expected = Counts {
        misplaced_acks: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn a_record_nobody_sent_is_an_unknown_event() {
    let mut history = History::clean(30);
    let stranger = history.fresh_unsent(31);
    for replica in &mut history.replicas {
        replica.records.push(stranger);
    }
    let report = history.check();
    let expected = Counts {
        unknown_events: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn duplicate_acks_with_the_original_version_are_fine() {
    let mut history = History::clean(40);
    for client in &mut history.clients {
        let again: Vec<Acked> = client
            .acked
            .iter()
            .map(|a| Acked {
                duplicate: true,
                ..*a
            })
            .collect();
        client.acked.extend(again);
    }
    let report = history.check();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.acknowledged, 32);
}

#[test]
fn a_duplicate_ack_naming_another_version_is_misplaced() {
    let mut history = History::clean(40);
    let original = *history.ack_mut(14);
    history.clients[0].acked.push(Acked {
        version: 15,
        duplicate: true,
        ..original
    });
    let report = history.check();
    let expected = Counts {
        misplaced_acks: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn messages_sent_but_never_acknowledged_and_absent_from_the_logs_are_fine() {
    let mut history = History::clean(30);
    for _ in 0..50 {
        history.fresh_sent(0);
    }
    // Also drop the unacknowledged tail version 30 everywhere.
    for replica in 0..3 {
        history.drop_record(replica, 30);
    }
    let report = history.check();
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_lagging_replica_whose_log_ends_early_is_fine() {
    let mut history = History::clean(30);
    history.replicas[2].records.truncate(24);
    history.replicas[1].records.clear();
    let report = history.check();
    assert!(report.is_clean(), "{report}");
}

#[test]
fn a_replica_whose_log_starts_late_has_no_gap_but_diverges_and_loses_acknowledged_messages() {
    let mut history = History::clean(30);
    history.replicas[0].records.drain(..3);
    let report = history.check();
    let expected = Counts {
        lost: 3,
        divergent: 3,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn records_above_the_committed_version_are_not_checked() {
    let mut history = History::clean(30);
    let stranger = history.fresh_unsent(31);
    let copy = history.message(3);
    history.replicas[0].records.push(stranger);
    history.replicas[1].records.push(Logged {
        version: 31,
        ..copy
    });
    history.replicas[2].records.push(Logged {
        version: 40,
        ..copy
    });
    let report = check(&history.clients, &history.replicas, Some(30));
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.logged_versions, 30);
    let unfiltered = history.check();
    assert!(!unfiltered.is_clean(), "{unfiltered}");
}

#[test]
fn an_ack_above_the_committed_version_loses_its_message_when_only_the_tail_holds_it() {
    let history = History::clean(30);
    // Version 29 is acknowledged, version 30 is not.
    assert!(is_acked(29) && !is_acked(30));
    let report = check(&history.clients, &history.replicas, Some(28));
    let expected = Counts {
        lost: 1,
        ..Counts::default()
    };
    assert_eq!(counts(&report), expected, "{report}");
}

#[test]
fn examples_name_the_first_violations_and_stop_at_ten() {
    let mut history = History::clean(100);
    for version in (2..90).step_by(3) {
        history.drop_record(0, version);
    }
    let report = history.check();
    assert_eq!(report.examples.len(), checker::EXAMPLES_MAX, "{report}");
    assert!(report.gaps >= 20, "{report}");
    assert!(report.examples[0].contains("version 2 "), "{report}");
    assert!(
        report
            .examples
            .iter()
            .any(|e| e == "gap: replica a misses versions 2..=2"),
        "{report}"
    );
}

#[test]
fn the_report_prints_every_count_as_a_table_and_as_json() {
    let mut history = History::clean(30);
    history.drop_record(1, 12);
    let report = history.check();
    let table = report.to_string();
    for (name, _) in report.violations() {
        assert!(table.contains(name), "{table}");
    }
    assert!(table.contains("VIOLATIONS"), "{table}");
    let json = report.to_json();
    assert!(json.starts_with("{\"clean\":false,\"lost\":1,"), "{json}");
    assert!(json.contains("\"gaps\":1"), "{json}");
    assert!(json.contains("\"logged_versions\":30"), "{json}");
    assert!(json.ends_with("\"]}"), "{json}");
    let clean = History::clean(5).check();
    assert!(clean.to_json().contains("\"examples\":[]"));
    assert!(clean.to_string().contains("clean"));
}

/// Injects one random fault into `history` and returns the counts it must
/// produce and a description.
fn inject(history: &mut History, rng: &mut Rng) -> (Counts, String) {
    let n = history.n;
    let kind = rng.between(0, 8);
    let mut expected = Counts::default();
    let description;
    match kind {
        0 => {
            let (r, v) = (replica(rng), rng.between(2, n - 1));
            history.drop_record(r, v);
            expected.gaps = 1;
            expected.divergent = 1;
            expected.lost = acked(v);
            description = format!("drop version {v} from replica {r}");
        }
        1 => {
            let v = rng.between(2, n);
            for r in 0..3 {
                history.drop_record(r, v);
            }
            expected.gaps = if v < n { 3 } else { 0 };
            expected.lost = acked(v);
            description = format!("drop version {v} everywhere");
        }
        2 => {
            let v = rng.between(1, n);
            let copy = history.message(v);
            let everywhere = rng.between(0, 1) == 1;
            let only = replica(rng);
            for (r, replica) in history.replicas.iter_mut().enumerate() {
                if everywhere || r == only {
                    replica.records.push(Logged {
                        version: n + 1,
                        ..copy
                    });
                }
            }
            expected.duplicated = 1;
            description = format!("log version {v} again at {}", n + 1);
        }
        3 => {
            let (r, v) = (replica(rng), rng.between(1, n));
            let other = history.fresh_sent(v);
            history.replace(r, v, other);
            expected.conflicting_versions = 1;
            expected.divergent = 1;
            expected.misplaced_acks = acked(v);
            expected.lost = acked(v);
            description = format!("another message at version {v} on replica {r}");
        }
        4 => {
            let (r, p) = (replica(rng), rng.between(0, n - 2) as usize);
            history.replicas[r].records.swap(p, p + 1);
            expected.reordered = 1;
            description = format!("swap positions {p} and {} on replica {r}", p + 1);
        }
        5 => {
            let (r, v) = (replica(rng), rng.between(1, n));
            let mut record = history.message(v);
            record.digest ^= 1 << rng.between(0, 63);
            history.replace(r, v, record);
            expected.conflicting_versions = 1;
            expected.divergent = 1;
            expected.unknown_events = 1;
            expected.misplaced_acks = acked(v);
            description = format!("change the digest of version {v} on replica {r}");
        }
        6 => {
            let mut v = rng.between(1, n);
            while !is_acked(v) {
                v = rng.between(1, n);
            }
            let mut w = rng.between(1, n + 5);
            while w == v {
                w = rng.between(1, n + 5);
            }
            history.ack_mut(v).version = w;
            expected.misplaced_acks = 1;
            description = format!("ack version {v} as {w}");
        }
        7 => {
            let stranger = history.fresh_unsent(n + 1);
            let skip = rng.between(0, 3) as usize;
            for (r, replica) in history.replicas.iter_mut().enumerate() {
                if r != skip {
                    replica.records.push(stranger);
                }
            }
            expected.unknown_events = 1;
            description = format!("log a stranger at {} (not on replica {skip})", n + 1);
        }
        _ => {
            description = "no fault".to_string();
        }
    }
    (expected, description)
}

#[test]
fn randomized_single_faults_are_counted_exactly() {
    let mut seen = [0u32; 9];
    for seed in 0..2_000u64 {
        let mut rng = Rng::new(seed);
        let mut history = History::clean(rng.between(10, 60));
        let (expected, description) = inject(&mut history, &mut rng);
        let committed = match rng.between(0, 2) {
            0 => None,
            1 => Some(history.n + 10),
            _ => Some(u64::MAX),
        };
        let report = check(&history.clients, &history.replicas, committed);
        assert_eq!(
            counts(&report),
            expected,
            "seed {seed}: {description}\n{report}"
        );
        assert_eq!(report.is_clean(), expected == Counts::default());
        assert_eq!(
            report.examples.is_empty(),
            report.is_clean(),
            "seed {seed}: {description}\n{report}"
        );
        let kind = description.split(' ').next().unwrap_or_default();
        let index = [
            "drop", "log", "another", "swap", "change", "ack", "no", "", "",
        ]
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(8);
        seen[index] += 1;
    }
    assert!(seen[..7].iter().all(|&count| count > 50), "{seen:?}");
}

#[test]
fn a_million_messages_on_three_replicas_check_in_seconds() {
    let n = 1_000_000u64;
    let records: Vec<Logged> = (1..=n)
        .map(|version| Logged {
            version,
            event: event(version % 16, 0, version),
            digest: version.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        })
        .collect();
    let client = ClientHistory {
        sent: records
            .iter()
            .map(|r| Sent {
                event: r.event,
                digest: r.digest,
            })
            .collect(),
        acked: records
            .iter()
            .map(|r| Acked {
                event: r.event,
                version: r.version,
                duplicate: false,
            })
            .collect(),
    };
    let replicas: Vec<ReplicaLog> = ["a", "b", "c"]
        .iter()
        .map(|name| ReplicaLog {
            replica: name.to_string(),
            records: records.clone(),
        })
        .collect();
    let started = Instant::now();
    let report = check(&[client], &replicas, Some(n));
    let took = started.elapsed();
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.logged_versions, n);
    assert_eq!(report.acknowledged, n);
    // Generous: the point is "not quadratic", not a benchmark.
    assert!(took.as_secs() < 60, "took {took:?}");
}

/// One of the three replicas.
fn replica(rng: &mut Rng) -> usize {
    rng.below(3) as usize
}
