//! Sender-based message logging at the state machines: the primary returns
//! each version at once and counts a message as logged only once its
//! client confirmed it (or the log synced it); a restarted primary takes
//! its clients' copies back at their versions.

use crate::{content, event, started_primary, three_servers};
use engine::replication::{
    Bytes, Effect, Entry, Msg, Node, Placement, Producer, ProducerSettings, Protocol, Replica,
    ReplicaSettings,
};

const CLIENT: u128 = 42;

fn settings() -> ReplicaSettings {
    ReplicaSettings {
        sender_logging: true,
        sender_recovery_ms: 500,
        ..ReplicaSettings::default()
    }
}

fn one_server() -> Placement {
    Placement {
        replicas: vec![1],
        primary: 1,
        epoch: 1,
    }
}

fn appended(out: &[Effect]) -> Vec<Entry> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Append(entry) => Some(entry.clone()),
            _ => None,
        })
        .collect()
}

fn stamped(out: &[Effect], client: u128) -> Vec<u64> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Send(Node::Client(c), Msg::Stamped { version, .. }) if *c == client => {
                Some(*version)
            }
            _ => None,
        })
        .collect()
}

/// Versions acknowledged to `client` (each message of a run).
fn acks(out: &[Effect], client: u128) -> Vec<u64> {
    out.iter()
        .flat_map(|effect| match effect {
            Effect::Send(Node::Client(c), msg) if *c == client => Some(msg.acked().map(|(_, v)| v)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn visible(out: &[Effect]) -> Option<u64> {
    out.iter().rev().find_map(|effect| match effect {
        Effect::Visible(version) => Some(*version),
        _ => None,
    })
}

fn forwarded(out: &[Effect]) -> Vec<u64> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Send(Node::Server(2), Msg::Replicate { entries }) => Some(entries),
            _ => None,
        })
        .flatten()
        .map(Entry::version)
        .collect()
}

fn standalone() -> Replica {
    let mut replica = Replica::new(7, 1, one_server(), Protocol::OneHopAckClient, settings());
    replica.start(0, &mut Vec::new());
    replica
}

#[test]
fn a_version_counts_as_logged_only_once_its_client_confirms_it() {
    let mut primary = standalone();
    let mut out = Vec::new();
    primary.on_client(CLIENT, Msg::Write(content(CLIENT, 1)), 1, &mut out);
    primary.on_client(CLIENT, Msg::Write(content(CLIENT, 2)), 1, &mut out);
    assert_eq!(
        stamped(&out, CLIENT),
        vec![1, 2],
        "the versions go back at once"
    );
    assert_eq!(appended(&out).len(), 2, "the log buffer takes them");
    out.clear();
    // The log buffer has both, but no client holds them yet.
    primary.on_logged(2, 2, &mut out);
    assert_eq!(visible(&out), None, "readers see nothing not fully logged");
    assert_eq!(primary.awaiting_confirmation(), 2);
    // A confirmation of another client's version is ignored.
    primary.on_client(
        7,
        Msg::Confirm {
            event: event(7, 1),
            version: 1,
            count: 1,
        },
        3,
        &mut out,
    );
    assert_eq!(visible(&out), None);
    // Version 2 confirmed first: nothing past the unconfirmed 1 goes out.
    primary.on_client(
        CLIENT,
        Msg::Confirm {
            event: event(CLIENT, 2),
            version: 2,
            count: 1,
        },
        3,
        &mut out,
    );
    assert_eq!(visible(&out), None);
    primary.on_client(
        CLIENT,
        Msg::Confirm {
            event: event(CLIENT, 1),
            version: 1,
            count: 1,
        },
        4,
        &mut out,
    );
    assert_eq!(visible(&out), Some(2));
    assert_eq!(primary.awaiting_confirmation(), 0);
    // On one replica the client's write was done at `Stamped`: no ack.
    assert!(acks(&out, CLIENT).is_empty());
}

#[test]
fn a_version_no_client_confirms_is_logged_once_the_log_syncs_it() {
    let mut primary = standalone();
    let mut out = Vec::new();
    for sequence in 1..=3 {
        primary.on_client(CLIENT, Msg::Write(content(CLIENT, sequence)), 1, &mut out);
    }
    primary.on_logged(3, 2, &mut out);
    out.clear();
    // The client died before it confirmed; the page writer synced 1..=2.
    primary.on_synced(2, 3, &mut out);
    assert_eq!(visible(&out), Some(2));
    primary.on_client(
        CLIENT,
        Msg::Confirm {
            event: event(CLIENT, 3),
            version: 3,
            count: 1,
        },
        4,
        &mut out,
    );
    assert_eq!(visible(&out), Some(3));
}

#[test]
fn replicas_get_a_record_only_once_it_is_fully_logged() {
    let mut primary = started_primary(Protocol::OneHopAckClient, settings());
    let mut out = Vec::new();
    for sequence in 1..=3 {
        primary.on_client(CLIENT, Msg::Write(content(CLIENT, sequence)), 2, &mut out);
    }
    primary.on_logged(3, 2, &mut out);
    assert!(forwarded(&out).is_empty(), "nothing is confirmed yet");
    // A replica asking for what the primary's heartbeat names gets only
    // fully logged versions: the heartbeat names none.
    primary.on_tick(100, &mut out);
    let last = out.iter().find_map(|effect| match effect {
        Effect::Send(Node::Server(2), Msg::Commit { last, .. }) => Some(*last),
        _ => None,
    });
    assert_eq!(last, Some(0));
    out.clear();
    // One message confirms the run of versions 1 and 2.
    primary.on_client(
        CLIENT,
        Msg::Confirm {
            event: event(CLIENT, 1),
            version: 1,
            count: 2,
        },
        101,
        &mut out,
    );
    assert_eq!(forwarded(&out), vec![1, 2]);
}

/// The primary's log kept versions 1 and 2 and lost 3 to 6. The client
/// holds 3 and 5 (confirmed); 4 was never confirmed and its client died
/// with the server; 6's client never got its version and resends it
/// without one. After the window: 3 and 5 at their versions, 4 void, then
/// the waiting messages.
#[test]
fn a_restarted_primary_places_resent_copies_at_their_versions_and_voids_the_rest() {
    let mut first = standalone();
    let mut out = Vec::new();
    for sequence in 1..=6 {
        first.on_client(CLIENT, Msg::Write(content(CLIENT, sequence)), 1, &mut out);
    }
    let original = appended(&out);
    assert_eq!(original.len(), 6);

    let mut restarted = Replica::new(7, 1, one_server(), Protocol::OneHopAckClient, settings());
    for entry in &original[..2] {
        restarted.recovered(&entry.header);
    }
    let mut out = Vec::new();
    restarted.start(1_000, &mut out);
    restarted.recover_senders(1_000, 0);
    assert!(restarted.sender_recovering());
    out.clear();
    // The resends, in any order, and a new message that must wait.
    restarted.on_client(CLIENT, Msg::Write(content(CLIENT, 6)), 1_010, &mut out);
    restarted.on_client(CLIENT, Msg::Write(content(CLIENT, 7)), 1_010, &mut out);
    for (version, sequence) in [(5, 5), (3, 3)] {
        restarted.on_client(
            CLIENT,
            Msg::Placed {
                version,
                epoch: 1,
                content: content(CLIENT, sequence),
            },
            1_020,
            &mut out,
        );
    }
    // A copy of a version the log kept is a duplicate, answered at once.
    restarted.on_client(
        CLIENT,
        Msg::Placed {
            version: 2,
            epoch: 1,
            content: content(CLIENT, 2),
        },
        1_020,
        &mut out,
    );
    assert!(appended(&out).is_empty(), "nothing is logged in the window");
    let asked = out
        .iter()
        .filter(|effect| {
            matches!(
                effect,
                Effect::Send(Node::Client(CLIENT), Msg::Checkpointed { resend: true, .. })
            )
        })
        .count();
    assert_eq!(asked, 1, "the client is asked once for its copies");
    out.clear();
    restarted.on_tick(1_499, &mut out);
    assert!(appended(&out).is_empty());
    restarted.on_tick(1_500, &mut out);
    assert!(!restarted.sender_recovering());
    let taken = appended(&out);
    let versions: Vec<u64> = taken.iter().map(Entry::version).collect();
    assert_eq!(versions, vec![3, 4, 5, 6, 7]);
    assert_eq!(taken[0], original[2], "the same bytes as before the crash");
    assert_eq!(taken[2], original[4]);
    assert!(taken[1].is_void(), "no one held version 4");
    assert_eq!(taken[3].header.event.sequence, 6);
    assert_eq!(taken[4].header.event.sequence, 7);
    assert_eq!(stamped(&out, CLIENT), vec![6, 7]);
    restarted.on_logged(7, 1_501, &mut out);
    assert_eq!(visible(&out), Some(5), "6 and 7 wait for their client");
    // A late copy of the voided version is refused: its client asks anew.
    out.clear();
    restarted.on_client(
        CLIENT,
        Msg::Placed {
            version: 4,
            epoch: 1,
            content: content(CLIENT, 4),
        },
        1_600,
        &mut out,
    );
    assert!(out.iter().any(|effect| matches!(
        effect,
        Effect::Send(
            Node::Client(CLIENT),
            Msg::Refused {
                refusal: engine::replication::Refusal::VersionVoid,
                ..
            }
        )
    )));
}

#[test]
fn a_producer_on_one_server_is_done_once_it_holds_the_version() {
    let settings = ProducerSettings {
        retry_ms: 1_000,
        sender_logging: true,
        ..ProducerSettings::default()
    };
    let mut producer = Producer::new(CLIENT, 1, Protocol::OneHop, one_server(), settings);
    let mut out = Vec::new();
    let event = producer.send(Bytes::new(), Bytes::from(vec![1; 10]), 0, &mut out);
    out.clear();
    let stamp = Msg::Stamped {
        event,
        version: 7,
        epoch: 1,
        duplicate: false,
    };
    producer.on_message(1, stamp, 1, &mut out);
    assert_eq!(
        out,
        vec![(
            Node::Server(1),
            Msg::Confirm {
                event,
                version: 7,
                count: 1
            }
        )]
    );
    let done = producer.take_completed();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].outcome.as_ref().unwrap().version, 7);
    assert_eq!(producer.in_flight(), 0);
    assert_eq!(producer.held(), (1, 10));
}

#[test]
fn a_producer_confirms_holds_until_the_checkpoint_and_resends_when_asked() {
    let settings = ProducerSettings {
        retry_ms: 1_000,
        sender_logging: true,
        ..ProducerSettings::default()
    };
    let mut producer = Producer::new(CLIENT, 1, Protocol::OneHop, three_servers(), settings);
    let mut out = Vec::new();
    let first = producer.send(Bytes::new(), Bytes::from(vec![1; 10]), 0, &mut out);
    let second = producer.send(Bytes::new(), Bytes::from(vec![2; 10]), 0, &mut out);
    out.clear();
    for (event, version) in [(first, 1), (second, 2)] {
        producer.on_message(
            1,
            Msg::Stamped {
                event,
                version,
                epoch: 1,
                duplicate: false,
            },
            1,
            &mut out,
        );
    }
    assert_eq!(
        out,
        vec![
            (
                Node::Server(1),
                Msg::Confirm {
                    event: first,
                    version: 1,
                    count: 1,
                }
            ),
            (
                Node::Server(1),
                Msg::Confirm {
                    event: second,
                    version: 2,
                    count: 1,
                }
            ),
        ]
    );
    assert!(
        producer.take_completed().is_empty(),
        "three replicas: acks decide"
    );
    for (event, version) in [(first, 1), (second, 2)] {
        producer.on_message(
            1,
            Msg::Ack {
                event,
                version,
                epoch: 1,
                duplicate: false,
                hint: None,
                count: 1,
            },
            2,
            &mut out,
        );
    }
    assert_eq!(producer.take_completed().len(), 2);
    assert_eq!(producer.held(), (2, 20), "done, and still held");
    out.clear();
    producer.on_message(
        1,
        Msg::Checkpointed {
            through: 1,
            resend: false,
        },
        3,
        &mut out,
    );
    assert_eq!(producer.held(), (1, 10));
    assert!(out.is_empty());
    producer.on_message(
        1,
        Msg::Checkpointed {
            through: 1,
            resend: true,
        },
        4,
        &mut out,
    );
    assert!(matches!(
        &out[..],
        [(Node::Server(1), Msg::Placed { version: 2, epoch: 1, content })] if content.event == second
    ));
    // A message from a server that is not the primary drops nothing.
    producer.on_message(
        9,
        Msg::Checkpointed {
            through: 5,
            resend: false,
        },
        5,
        &mut out,
    );
    assert_eq!(producer.held(), (1, 10));
}
