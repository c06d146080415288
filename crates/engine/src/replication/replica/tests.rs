//! Unit tests of the replica's startup, checkpoints and failover.

use super::*;
use crate::replication::PAYLOAD_SPLIT_MIN;

fn placement() -> Placement {
    Placement {
        replicas: vec![1, 2, 3],
        primary: 1,
        epoch: 1,
    }
}

fn write(client: u128, sequence: u64) -> Msg {
    Msg::Write(Content {
        event: EventId {
            client,
            session: 1,
            sequence,
        },
        low_water: 1,
        key: Bytes::new(),
        payload: Bytes::from(vec![sequence as u8; 8]),
        resent: false,
    })
}

fn appended(out: &[Effect]) -> Vec<Entry> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Append(entry) => Some(entry.clone()),
            _ => None,
        })
        .collect()
}

/// A primary killed before its log wrote records it had already
/// forwarded comes back shorter than its replicas. It must fetch those
/// records before it stamps, or it would put new messages under their
/// versions.
#[test]
fn a_restarted_primary_takes_back_what_its_replicas_hold_before_stamping() {
    let protocol = Protocol::OneHopAckClient;
    let settings = ReplicaSettings::default();
    let mut first = started_primary(protocol, settings);
    let mut out = Vec::new();
    out.clear();
    for sequence in 1..=3 {
        first.on_client(42, write(42, sequence), 2, &mut out);
    }
    let stamped = appended(&out);
    assert_eq!(stamped.len(), 3);

    // The new process's log kept only version 1.
    let mut restarted = Replica::new(7, 1, placement(), protocol, settings);
    restarted.recovered(&stamped[0].header);
    let mut out = Vec::new();
    restarted.start(10, &mut out);
    assert!(restarted.is_rejoining());
    let probes = out
        .iter()
        .filter(|e| matches!(e, Effect::Send(Node::Server(_), Msg::Probe)))
        .count();
    assert_eq!(probes, 2);
    out.clear();
    // A new message waits: no version is handed out yet.
    restarted.on_client(43, write(43, 1), 11, &mut out);
    assert!(appended(&out).is_empty());
    restarted.on_peer(2, Msg::Progress { logged: 3, last: 3 }, 12, &mut out);
    restarted.on_peer(3, Msg::Progress { logged: 2, last: 2 }, 12, &mut out);
    let need = out.iter().find_map(|e| match e {
        Effect::Send(Node::Server(to), Msg::Need { from, to: last }) => Some((*to, *from, *last)),
        _ => None,
    });
    assert_eq!(need, Some((2, 2, 3)), "asks the longest replica for 2..=3");
    out.clear();
    let entries = stamped[1..].to_vec();
    restarted.on_peer(2, Msg::Replicate { entries }, 13, &mut out);
    assert!(
        restarted.is_rejoining(),
        "stamping waits for the epoch record"
    );
    assert!(out.contains(&Effect::EpochStarted {
        epoch: 1,
        first_version: 4,
        members: vec![1, 2, 3],
    }));
    restarted.epoch_recorded(1, 14, &mut out);
    assert!(!restarted.is_rejoining());
    let taken = appended(&out);
    assert_eq!(
        taken.len(),
        3,
        "versions 2 and 3 back, then the waiting message"
    );
    assert_eq!(taken[0], stamped[1]);
    assert_eq!(taken[1], stamped[2]);
    assert_eq!(taken[2].version(), 4);
    assert_eq!(taken[2].header.event.client, 43);
}

/// Server 1, primary of a fresh stream on servers 1 to 3, once both
/// backups reported and its first epoch is recorded.
fn started_primary(protocol: Protocol, settings: ReplicaSettings) -> Replica {
    let mut primary = Replica::new(7, 1, placement(), protocol, settings);
    let mut out = Vec::new();
    primary.start(0, &mut out);
    for id in [2, 3] {
        primary.on_peer(id, Msg::Progress { logged: 0, last: 0 }, 1, &mut out);
    }
    primary.epoch_recorded(1, 1, &mut out);
    primary
}

/// Feeds every effect of `out` that is a record to append into the
/// replica's log at once and reports it logged.
fn log_all(replica: &mut Replica, out: &mut Vec<Effect>, now: u64) {
    let last = appended(out).last().map(Entry::version);
    if let Some(last) = last {
        replica.on_logged(last, now, out);
    }
}

#[test]
fn a_replica_restored_from_a_checkpoint_matches_one_that_replayed_the_whole_log() {
    let settings = ReplicaSettings::default();
    let mut primary = Replica::new(
        7,
        1,
        Placement {
            replicas: vec![1],
            primary: 1,
            epoch: 1,
        },
        Protocol::OneHopAckClient,
        settings,
    );
    let mut out = Vec::new();
    primary.start(0, &mut out);
    for sequence in 1..=20 {
        for client in [42, 43] {
            primary.on_client(client, write(client, sequence), 1, &mut out);
        }
    }
    let headers: Vec<RecordHeader> = appended(&out).iter().map(|e| e.header).collect();
    assert_eq!(headers.len(), 40);
    let fresh = || Replica::new(7, 1, placement(), Protocol::OneHopAckClient, settings);
    let mut whole = fresh();
    headers.iter().for_each(|h| whole.recovered(h));
    for cut in [0, 1, 17, 40] {
        let mut before = fresh();
        headers[..cut].iter().for_each(|h| before.recovered(h));
        let (version, state) = before.checkpoint_state();
        assert_eq!(version, cut as u64);
        let mut restored = fresh();
        assert_eq!(restored.restore(&state), Ok(cut as u64));
        headers[cut..].iter().for_each(|h| restored.recovered(h));
        assert_eq!(
            restored.checkpoint_state(),
            whole.checkpoint_state(),
            "cut {cut}"
        );
        assert_eq!(restored.dedupe_entries(), whole.dedupe_entries());
    }
    let mut damaged = whole.checkpoint_state().1;
    damaged.truncate(damaged.len() - 1);
    let mut refused = fresh();
    assert!(refused.restore(&damaged).is_err());
    assert_eq!(refused.last_version(), 0, "a refused state changes nothing");
}

/// A backup far behind gets the primary's checkpoint instead of the
/// records its primary no longer keeps: it installs the state, counts
/// every version up to it as logged, reports so, and asks for the
/// rest, after which it holds what the primary holds.
#[test]
fn a_backup_installs_its_primarys_checkpoint_then_asks_for_the_rest() {
    let protocol = Protocol::OneHopAckClient;
    let settings = ReplicaSettings::default();
    let mut primary = started_primary(protocol, settings);
    let mut out = Vec::new();
    for sequence in 1..=30 {
        primary.on_client(42, write(42, sequence), 2, &mut out);
    }
    let stamped = appended(&out);
    assert_eq!(stamped.len(), 30);
    // The primary's checkpoint at 20: the state after records 1..=20.
    let mut at_twenty = Replica::new(7, 1, placement(), protocol, settings);
    stamped[..20]
        .iter()
        .for_each(|e| at_twenty.recovered(&e.header));
    let (through, state) = at_twenty.checkpoint_state();
    assert_eq!(through, 20);

    let mut backup = Replica::new(7, 2, placement(), protocol, settings);
    let mut out = Vec::new();
    backup.start(3, &mut out);
    let first = stamped[..5].to_vec();
    backup.on_peer(1, Msg::Replicate { entries: first }, 4, &mut out);
    log_all(&mut backup, &mut out, 4);
    backup.on_peer(
        1,
        Msg::Commit {
            committed: 30,
            last: 30,
        },
        5,
        &mut out,
    );
    assert_eq!(backup.last_version(), 5);
    let state = Bytes::from(state);
    let checkpoint = Msg::Checkpoint {
        through: 20,
        state: state.clone(),
    };
    // Only from the primary.
    out.clear();
    backup.on_peer(3, checkpoint.clone(), 6, &mut out);
    assert!(!out.iter().any(|e| matches!(e, Effect::Install { .. })));
    backup.on_peer(1, checkpoint.clone(), 6, &mut out);
    assert!(out.contains(&Effect::Install {
        through: 20,
        state: state.clone(),
    }));
    // A damaged state is refused and changes nothing.
    let mut damaged = state.to_vec();
    damaged.truncate(damaged.len() - 1);
    assert!(backup.decode_install(&damaged).is_err());
    let machine = backup.decode_install(&state).expect("decodes");
    out.clear();
    backup.install(machine, 7, &mut out);
    assert_eq!(backup.last_version(), 20);
    assert_eq!(backup.logged(), 20);
    assert!(out.contains(&Effect::Send(
        Node::Server(1),
        Msg::Progress {
            logged: 20,
            last: 20
        }
    )));
    assert!(out.contains(&Effect::Send(
        Node::Server(1),
        Msg::Need { from: 21, to: 30 }
    )));
    assert!(out.contains(&Effect::Visible(20)));
    assert!(appended(&out).is_empty(), "nothing up to 20 is logged");
    // A second copy of the same checkpoint is no longer past the log.
    out.clear();
    backup.on_peer(1, checkpoint, 8, &mut out);
    assert!(!out.iter().any(|e| matches!(e, Effect::Install { .. })));
    assert!(backup.decode_install(&state).is_err());
    // The rest comes by the usual repair and is logged from 21 on.
    let rest = stamped[20..].to_vec();
    backup.on_peer(1, Msg::Replicate { entries: rest }, 9, &mut out);
    let taken: Vec<u64> = appended(&out).iter().map(Entry::version).collect();
    assert_eq!(taken, (21..=30).collect::<Vec<_>>());
    log_all(&mut backup, &mut out, 9);
    assert_eq!(backup.logged(), 30);
    let mut whole = Replica::new(7, 1, placement(), protocol, settings);
    stamped.iter().for_each(|e| whole.recovered(&e.header));
    assert_eq!(backup.checkpoint_state(), whole.checkpoint_state());
    // The dedupe table came with the state: a duplicate is known.
    assert_eq!(backup.dedupe_entries(), whole.dedupe_entries());
}

#[test]
fn a_backup_takes_over_in_a_new_epoch_from_the_longest_live_tail() {
    let protocol = Protocol::OneHopAckClient;
    let settings = ReplicaSettings::default();
    let mut primary = started_primary(protocol, settings);
    let mut out = Vec::new();
    out.clear();
    for sequence in 1..=3 {
        primary.on_client(42, write(42, sequence), 2, &mut out);
    }
    let stamped = appended(&out);

    // Server 2 has versions 1..=2, server 3 all three; 1 dies.
    let mut second = Replica::new(7, 2, placement(), protocol, settings);
    let mut out = Vec::new();
    second.start(0, &mut out);
    second.on_peer(
        1,
        Msg::Replicate {
            entries: stamped[..2].to_vec(),
        },
        3,
        &mut out,
    );
    log_all(&mut second, &mut out, 3);
    out.clear();
    let next = Placement {
        replicas: vec![2, 3],
        primary: 2,
        epoch: 2,
    };
    second.reconfigure(next, &[2, 3], &[3], 10, &mut out);
    assert!(second.is_primary() && second.is_rejoining());
    assert!(out.contains(&Effect::Send(Node::Server(3), Msg::Probe)));
    out.clear();
    second.on_peer(3, Msg::Progress { logged: 3, last: 3 }, 11, &mut out);
    assert!(out.contains(&Effect::Send(Node::Server(3), Msg::Need { from: 3, to: 3 })));
    out.clear();
    second.on_peer(
        3,
        Msg::Replicate {
            entries: stamped[2..].to_vec(),
        },
        12,
        &mut out,
    );
    assert_eq!(appended(&out), stamped[2..].to_vec());
    assert!(out.contains(&Effect::EpochStarted {
        epoch: 2,
        first_version: 4,
        members: vec![2, 3],
    }));
    log_all(&mut second, &mut out, 12);
    out.clear();
    // A client resends version 2's message: the original version comes
    // back as a duplicate once stamping starts; a new message gets 4.
    second.on_client(42, write(42, 2), 13, &mut out);
    second.on_client(42, write(42, 4), 13, &mut out);
    assert!(appended(&out).is_empty(), "nothing before the record");
    second.epoch_recorded(2, 14, &mut out);
    let taken = appended(&out);
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].version(), taken[0].header.epoch), (4, 2));
    second.on_peer(3, Msg::Progress { logged: 4, last: 4 }, 15, &mut out);
    log_all(&mut second, &mut out, 15);
    let acks: Vec<(u64, bool)> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Send(
                Node::Client(42),
                Msg::Ack {
                    version, duplicate, ..
                },
            ) => Some((*version, *duplicate)),
            _ => None,
        })
        .collect();
    assert!(acks.contains(&(2, true)), "{acks:?}");
}

/// A producer whose stream fails over resends what is not done with
/// the resent mark; the new primary logs a message it did not have
/// with `possible-duplicate`, and answers one it had as a duplicate
/// without touching its record. Before the failover nothing is marked.
#[test]
fn messages_resent_after_a_failover_carry_possible_duplicate() {
    use crate::replication::{Producer, ProducerSettings};
    let protocol = Protocol::OneHopAckClient;
    let settings = ReplicaSettings::default();
    let mut producer = Producer::new(42, 1, protocol, placement(), ProducerSettings::default());
    let mut sent = Vec::new();
    for _ in 0..2 {
        producer.send(Bytes::new(), Bytes::from(vec![7; 8]), 0, &mut sent);
    }
    let mut primary = started_primary(protocol, settings);
    let mut out = Vec::new();
    for (_, msg) in sent.drain(..) {
        let Msg::Write(content) = &msg else {
            panic!("one-hop-ack-client writes to the primary: {msg:?}");
        };
        assert!(!content.resent);
        primary.on_client(42, msg, 1, &mut out);
    }
    let first = appended(&out);
    assert!(first
        .iter()
        .all(|e| e.header.flags & proto::FLAG_POSSIBLE_DUPLICATE == 0));

    // Server 2 holds version 1 only when server 1 dies.
    let mut second = Replica::new(7, 2, placement(), protocol, settings);
    second.start(0, &mut out);
    let mut out = Vec::new();
    second.on_peer(
        1,
        Msg::Replicate {
            entries: first[..1].to_vec(),
        },
        2,
        &mut out,
    );
    log_all(&mut second, &mut out, 2);
    let next = Placement {
        replicas: vec![2, 3],
        primary: 2,
        epoch: 2,
    };
    second.reconfigure(next.clone(), &[2, 3], &[3], 3, &mut out);
    second.on_peer(3, Msg::Progress { logged: 1, last: 1 }, 4, &mut out);
    second.epoch_recorded(2, 5, &mut out);
    out.clear();

    producer.reconfigure(next, 6, &mut sent);
    assert_eq!(sent.len(), 2);
    for (node, msg) in sent.drain(..) {
        assert_eq!(node, Node::Server(2));
        let Msg::Write(content) = &msg else {
            panic!("a resend goes to the new primary: {msg:?}");
        };
        assert!(content.resent);
        second.on_client(42, msg, 7, &mut out);
    }
    let taken = appended(&out);
    assert_eq!(taken.len(), 1, "version 1 was a duplicate");
    assert_eq!((taken[0].version(), taken[0].header.epoch), (2, 2));
    assert_eq!(
        taken[0].header.flags & proto::FLAG_POSSIBLE_DUPLICATE,
        proto::FLAG_POSSIBLE_DUPLICATE
    );
    log_all(&mut second, &mut out, 8);
    second.on_peer(3, Msg::Progress { logged: 2, last: 2 }, 9, &mut out);
    for effect in out.drain(..) {
        if let Effect::Send(Node::Client(42), msg) = effect {
            producer.on_message(2, msg, 10, &mut sent);
        }
    }
    // server 3 acks for one-hop-ack-client too: it logged version 2.
    for (version, duplicate) in [(1, true), (2, false)] {
        let event = EventId {
            client: 42,
            session: 1,
            sequence: version,
        };
        let ack = Msg::Ack {
            event,
            version,
            epoch: 2,
            duplicate,
            hint: None,
            count: 1,
        };
        producer.on_message(3, ack, 10, &mut sent);
    }
    let done: Vec<(u64, bool, bool)> = producer
        .take_completed()
        .into_iter()
        .map(|c| {
            let a = c.outcome.expect("acknowledged");
            (a.version, a.duplicate, a.possible_duplicate)
        })
        .collect();
    assert_eq!(done, vec![(1, true, true), (2, false, true)]);
}

#[test]
fn a_replica_out_of_sync_does_not_hold_acks_until_it_catches_up() {
    let protocol = Protocol::ServerSync;
    let settings = ReplicaSettings::default();
    let mut primary = started_primary(protocol, settings);
    let mut out = Vec::new();
    // Server 3 came back and is not in sync.
    primary.reconfigure(placement(), &[1, 2], &[2, 3], 2, &mut out);
    assert_eq!(primary.counting().collect::<Vec<_>>(), vec![2]);
    out.clear();
    primary.on_client(42, write(42, 1), 3, &mut out);
    log_all(&mut primary, &mut out, 3);
    primary.on_peer(2, Msg::Progress { logged: 1, last: 1 }, 4, &mut out);
    let acked = out.iter().any(|e| {
        matches!(
            e,
            Effect::Send(Node::Client(42), Msg::Ack { version: 1, .. })
        )
    });
    assert!(acked, "server 3 does not hold the ack");
    assert_eq!(primary.committed(), 1);
    out.clear();
    primary.on_peer(3, Msg::Progress { logged: 1, last: 1 }, 5, &mut out);
    assert!(out.contains(&Effect::InSync(3)));
    assert_eq!(primary.counting().collect::<Vec<_>>(), vec![2, 3]);
}

fn backup_in_epoch_two() -> Replica {
    let placement = Placement {
        replicas: vec![1, 2, 3],
        primary: 1,
        epoch: 2,
    };
    let settings = ReplicaSettings::default();
    let mut replica = Replica::new(9, 2, placement, Protocol::OneHopAckClient, settings);
    replica.start(0, &mut Vec::new());
    replica
}

#[test]
fn a_view_of_an_older_epoch_changes_nothing() {
    let mut replica = backup_in_epoch_two();
    let older = ClusterView {
        placement: Placement {
            replicas: vec![1, 2, 3],
            primary: 2,
            epoch: 1,
        },
        in_sync: vec![1, 2, 3],
        consider: vec![1, 3],
        epoch_recorded: true,
    };
    let mut out = Vec::new();
    replica.follow(&older, 1, &mut out);
    assert_eq!(replica.epoch(), 2);
    assert!(!replica.is_primary());
    assert!(out.is_empty(), "{out:?}");
}

#[test]
#[should_panic(expected = "epochs never go down")]
fn a_placement_of_an_older_epoch_stops_the_replica() {
    let mut replica = backup_in_epoch_two();
    let older = Placement {
        replicas: vec![1, 2, 3],
        primary: 1,
        epoch: 1,
    };
    replica.reconfigure(older, &[1, 2, 3], &[2, 3], 1, &mut Vec::new());
}

/// The clients told of a checkpoint by `checkpoint_written`.
fn told_of_checkpoint(replica: &mut Replica, through: u64) -> Vec<u128> {
    let mut out = Vec::new();
    replica.checkpoint_written(through, &mut out);
    out.iter()
        .map(|effect| match effect {
            Effect::Send(
                Node::Client(client),
                Msg::Checkpointed {
                    through: told,
                    resend: false,
                },
            ) if *told == through => *client,
            other => panic!("not a checkpoint note: {other:?}"),
        })
        .collect()
}

/// Sender-based logging: a primary announces a checkpoint to every client
/// that has sent it messages, and to no other; a backup, a primary still
/// recovering its senders, and a stream without sender-based logging say
/// nothing.
#[test]
fn a_checkpoint_is_announced_by_a_sender_logged_primary_to_its_senders() {
    let sender = ReplicaSettings {
        sender_logging: true,
        ..ReplicaSettings::default()
    };
    let mut primary = started_primary(Protocol::OneHopAckClient, sender);
    assert!(
        told_of_checkpoint(&mut primary, 1).is_empty(),
        "no sender yet"
    );
    let mut out = Vec::new();
    primary.on_client(42, write(42, 1), 2, &mut out);
    primary.on_client(43, write(43, 1), 2, &mut out);
    primary.on_client(42, write(42, 2), 2, &mut out);
    assert_eq!(told_of_checkpoint(&mut primary, 2), vec![42, 43]);

    primary.recover_senders(3, 2);
    assert!(primary.sender_recovering());
    assert!(told_of_checkpoint(&mut primary, 3).is_empty(), "recovering");

    let mut backup = Replica::new(7, 2, placement(), Protocol::OneHopAckClient, sender);
    backup.start(0, &mut out);
    backup.on_client(44, write(44, 1), 1, &mut out);
    assert!(told_of_checkpoint(&mut backup, 1).is_empty(), "a backup");

    let mut plain = started_primary(Protocol::OneHopAckClient, ReplicaSettings::default());
    plain.on_client(42, write(42, 1), 2, &mut out);
    assert!(
        told_of_checkpoint(&mut plain, 1).is_empty(),
        "no sender log"
    );
}

/// The clock may rest (`Replica::quiet_until`) only while nothing waits
/// on it or on another message, and then until the next heartbeat: a
/// primary with a record not yet logged everywhere is not quiet, nor is a
/// backup that knows of a version it lacks.
#[test]
fn a_replica_is_quiet_only_when_nothing_waits_and_then_until_its_next_heartbeat() {
    let settings = ReplicaSettings::default();
    let heartbeat = settings.heartbeat_ms;
    let mut primary = started_primary(Protocol::OneHopAckClient, settings);
    let mut out = Vec::new();
    log_all(&mut primary, &mut out, 2);
    primary.on_tick(10, &mut out);
    assert_eq!(primary.quiet_until(), Some(10 + heartbeat), "{out:?}");

    // A write: not quiet until every replica logged it and acked.
    out.clear();
    primary.on_client(42, write(42, 1), 20, &mut out);
    let entries = appended(&out);
    assert_eq!(primary.quiet_until(), None);
    log_all(&mut primary, &mut out, 21);
    assert_eq!(
        primary.quiet_until(),
        None,
        "the backups have not logged it"
    );
    let last = entries.last().map(Entry::version).unwrap();
    for id in [2, 3] {
        primary.on_peer(id, Msg::Progress { logged: last, last }, 22, &mut out);
    }
    // The new commit point went to the backups at once: the next
    // heartbeat is due a heartbeat later.
    assert_eq!(primary.quiet_until(), Some(22 + heartbeat), "{out:?}");
    // That heartbeat told nothing new: the next waits twice as long, to
    // a multiple of that wait.
    primary.on_tick(22 + heartbeat, &mut out);
    assert_eq!(
        primary.quiet_until(),
        Some((22 + 3 * heartbeat).next_multiple_of(2 * heartbeat))
    );

    // A backup told of a version it lacks is not quiet: its clock asks
    // for it after the gap timeout.
    let mut backup = Replica::new(7, 2, placement(), Protocol::OneHopAckClient, settings);
    let mut out = Vec::new();
    backup.start(0, &mut out);
    backup.on_peer(
        1,
        Msg::Replicate {
            entries: entries.clone(),
        },
        1,
        &mut out,
    );
    log_all(&mut backup, &mut out, 2);
    backup.on_peer(
        1,
        Msg::Commit {
            committed: last,
            last,
        },
        3,
        &mut out,
    );
    backup.on_tick(10, &mut out);
    // It reported its log when it logged the record.
    assert_eq!(backup.quiet_until(), Some(2 + heartbeat), "{out:?}");
    backup.on_peer(
        1,
        Msg::Commit {
            committed: last,
            last: last + 2,
        },
        11,
        &mut out,
    );
    assert_eq!(backup.quiet_until(), None);
}

/// Whether `part` lies inside `whole`'s bytes.
fn within(part: &Bytes, whole: &Bytes) -> bool {
    let range = whole.as_ptr_range();
    range.contains(&part.as_ptr())
}

/// Records that arrive as slices of one read (as a peer link cuts them)
/// go to the log as those slices when they are next, and are copied when
/// they wait behind a gap, so that the read's buffer is not kept alive
/// by them.
#[test]
fn a_backup_logs_records_in_order_as_slices_and_copies_those_it_holds_behind_a_gap() {
    let protocol = Protocol::OneHopAckClient;
    let settings = ReplicaSettings::default();
    let mut primary = started_primary(protocol, settings);
    let mut out = Vec::new();
    for sequence in 1..=6 {
        primary.on_client(42, write(42, sequence), 2, &mut out);
    }
    let stamped = appended(&out);
    // The six records end to end in one buffer, each entry a slice of it.
    let read = Bytes::from(
        stamped
            .iter()
            .flat_map(|e| e.bytes.to_vec())
            .collect::<Vec<u8>>(),
    );
    let mut offset = 0;
    let sliced: Vec<Entry> = stamped
        .iter()
        .map(|e| {
            let bytes = read.slice(offset..offset + e.bytes.len());
            offset += e.bytes.len();
            Entry {
                header: e.header,
                bytes,
                payload: None,
            }
        })
        .collect();
    let mut backup = Replica::new(7, 2, placement(), protocol, settings);
    backup.start(3, &mut out);
    // 1 and 2 in order; 4 to 6 behind the gap at 3.
    out.clear();
    let mut first = sliced[..2].to_vec();
    first.extend_from_slice(&sliced[3..]);
    backup.on_peer(1, Msg::Replicate { entries: first }, 4, &mut out);
    let taken = appended(&out);
    assert_eq!(taken.iter().map(Entry::version).collect::<Vec<_>>(), [1, 2]);
    assert!(taken.iter().all(|e| within(&e.bytes, &read)));
    assert_eq!(backup.held.len(), 3);
    for entry in backup.held.values() {
        assert!(!within(&entry.bytes, &read), "version {}", entry.version());
        assert_eq!(entry.bytes, stamped[entry.version() as usize - 1].bytes);
    }
    // The gap closes: 3 as it came, 4 to 6 as held, the same bytes.
    out.clear();
    backup.on_peer(
        1,
        Msg::Replicate {
            entries: vec![sliced[2].clone()],
        },
        5,
        &mut out,
    );
    let taken = appended(&out);
    assert_eq!(
        taken.iter().map(Entry::version).collect::<Vec<_>>(),
        [3, 4, 5, 6]
    );
    assert!(within(&taken[0].bytes, &read));
    assert_eq!(taken, stamped[2..].to_vec());
}

/// A primary leaves a client's large payload where its read put it: the
/// record it logs and forwards is a head of its own and that payload,
/// the same bytes as the record encoded whole; a small payload is copied
/// into its record, and a split record kept past its step is made whole.
#[test]
fn a_primary_leaves_a_large_payload_in_the_clients_read_and_encodes_only_the_head() {
    let mut primary = started_primary(Protocol::OneHopAckClient, ReplicaSettings::default());
    let read = Bytes::from(vec![7u8; 3 * PAYLOAD_SPLIT_MIN]);
    let sizes = [
        PAYLOAD_SPLIT_MIN,
        PAYLOAD_SPLIT_MIN - 1,
        2 * PAYLOAD_SPLIT_MIN,
    ];
    let mut out = Vec::new();
    for (at, size) in sizes.into_iter().enumerate() {
        let Msg::Write(mut content) = write(42, at as u64 + 1) else {
            unreachable!("a write")
        };
        content.key = Bytes::from_static(b"k");
        content.payload = read.slice(..size);
        primary.on_client(42, Msg::Write(content), 2, &mut out);
    }
    let logged = appended(&out);
    let forwarded: Vec<Entry> = out
        .iter()
        .filter_map(|effect| match effect {
            Effect::Send(_, Msg::Replicate { entries }) => Some(entries.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(logged.len(), 3);
    for (entry, size) in logged.iter().zip(sizes) {
        let split = size >= PAYLOAD_SPLIT_MIN;
        assert_eq!(entry.is_split(), split, "payload of {size}");
        let in_read = entry.payload.as_ref().is_some_and(|p| within(p, &read));
        assert_eq!(in_read, split, "payload of {size}");
        let whole = Entry::new(entry.header, b"k", &read[..size]);
        assert_eq!(entry.contiguous(), whole.bytes, "payload of {size}");
        assert_eq!(entry.record(), whole.record());
        assert!(forwarded.iter().any(|sent| sent.shares_bytes(entry)));
        let kept = entry.clone().compact();
        assert!(!kept.is_split() && kept.bytes == whole.bytes);
        assert!(!within(&kept.bytes, &read));
    }
}

/// A client's key and payload arrive as slices of one read; a backup that
/// holds the message until the primary's binding names its version keeps
/// a copy of its own, not the read.
#[test]
fn a_backup_copies_a_clients_message_it_holds_for_its_binding() {
    let settings = ReplicaSettings::default();
    let mut backup = Replica::new(7, 2, placement(), Protocol::Hybrid, settings);
    let mut out = Vec::new();
    backup.start(3, &mut out);
    let read = Bytes::from((0..64u8).collect::<Vec<u8>>());
    let content = Content {
        event: EventId {
            client: 42,
            session: 1,
            sequence: 1,
        },
        low_water: 1,
        key: read.slice(0..3),
        payload: read.slice(3..40),
        resent: false,
    };
    backup.on_client(42, Msg::Tagged(content.clone()), 4, &mut out);
    let held = &backup.unbound[&content.event].content;
    assert_eq!(held, &content);
    assert!(!within(&held.key, &read) && !within(&held.payload, &read));
}
