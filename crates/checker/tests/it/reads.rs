//! The reader check: a clean reader, each violation alone, counted once.

use checker::{check_reads, digest, EventId, Logged, ReaderHistory, ReplicaLog};

fn record(version: u64) -> Logged {
    Logged {
        version,
        event: EventId {
            client: 7,
            session: 1,
            sequence: version,
        },
        digest: digest(b"", &version.to_le_bytes()),
    }
}

fn logs(last: u64) -> Vec<ReplicaLog> {
    vec![ReplicaLog {
        replica: "server-1".into(),
        records: (1..=last).map(record).collect(),
    }]
}

fn reader(versions: &[u64]) -> ReaderHistory {
    ReaderHistory {
        reader: "reader".into(),
        delivered: versions.iter().map(|v| record(*v)).collect(),
    }
}

#[test]
fn a_reader_that_resumed_midway_is_clean() {
    let report = check_reads(&[reader(&[3, 4, 5, 6]), reader(&[1, 2, 3])], &logs(10));
    assert!(report.is_clean(), "{report}");
    assert_eq!(report.deliveries, 7);
}

#[test]
fn a_skipped_version_is_out_of_order() {
    let report = check_reads(&[reader(&[1, 2, 4, 5])], &logs(10));
    assert_eq!(
        (report.out_of_order, report.repeated, report.not_in_log),
        (1, 0, 0)
    );
}

#[test]
fn a_version_given_twice_is_repeated() {
    let report = check_reads(&[reader(&[1, 2, 2, 3])], &logs(10));
    assert_eq!(
        (report.out_of_order, report.repeated, report.not_in_log),
        (0, 1, 0)
    );
}

#[test]
fn a_record_the_logs_do_not_hold_is_counted() {
    let mut other = reader(&[1, 2, 3]);
    other.delivered[1].digest ^= 1;
    let past_the_end = reader(&[9, 10, 11]);
    let report = check_reads(&[other, past_the_end], &logs(10));
    assert_eq!(
        (report.out_of_order, report.repeated, report.not_in_log),
        (0, 0, 2)
    );
    assert_eq!(report.examples.len(), 2, "{report}");
}
