//! Acks travel as runs: a replica that releases the acks of consecutive
//! messages of one session says so in one `Ack`, and the producer takes a
//! run as an ack of each of its messages.

use crate::{content, event, started_primary, three_servers};
use engine::replication::{
    Bytes, Effect, Msg, Node, Producer, ProducerSettings, Protocol, Replica, ReplicaSettings,
    ServerId, ACK_RUN_MAX,
};
use proto::EventId;

const CLIENT: u128 = 42;
const OTHER: u128 = 43;

fn write(client: u128, sequence: u64) -> Msg {
    Msg::Write(content(client, sequence))
}

/// Each ack effect as (client, first sequence, first version, count).
fn runs(out: &[Effect]) -> Vec<(u128, u64, u64, u64)> {
    out.iter()
        .filter_map(|effect| match effect {
            Effect::Send(
                Node::Client(to),
                Msg::Ack {
                    event,
                    version,
                    count,
                    ..
                },
            ) => Some((*to, event.sequence, *version, *count)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_replica_acknowledges_consecutive_messages_of_a_session_as_one_run() {
    let protocol = Protocol::OneHopAckClient;
    let mut primary = started_primary(protocol, ReplicaSettings::default());
    let mut out = Vec::new();
    // Versions 1-5 for CLIENT, 6 for another client, 7-8 for CLIENT again.
    for sequence in 1..=5 {
        primary.on_client(CLIENT, write(CLIENT, sequence), 2, &mut out);
    }
    primary.on_client(OTHER, write(OTHER, 1), 2, &mut out);
    for sequence in 6..=7 {
        primary.on_client(CLIENT, write(CLIENT, sequence), 2, &mut out);
    }
    let entries: Vec<_> = out
        .iter()
        .filter_map(|effect| match effect {
            Effect::Append(entry) => Some(entry.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(entries.len(), 8);
    out.clear();
    primary.on_logged(8, 3, &mut out);
    let expected = vec![(CLIENT, 1, 1, 5), (OTHER, 1, 6, 1), (CLIENT, 6, 7, 2)];
    assert_eq!(runs(&out), expected, "the primary's acks");

    // A backup acks the client directly, in the same runs.
    let mut backup = Replica::new(7, 2, three_servers(), protocol, ReplicaSettings::default());
    let mut backup_out = Vec::new();
    backup.start(0, &mut backup_out);
    backup.on_peer(1, Msg::Replicate { entries }, 3, &mut backup_out);
    backup_out.clear();
    backup.on_logged(8, 4, &mut backup_out);
    assert_eq!(runs(&backup_out), expected, "the backup's acks");
    let each: Vec<(EventId, u64)> = backup_out
        .iter()
        .filter_map(|effect| match effect {
            Effect::Send(Node::Client(_), msg) => Some(msg.acked()),
            _ => None,
        })
        .flatten()
        .collect();
    let mut listed: Vec<(EventId, u64)> = (1..=5).map(|s| (event(CLIENT, s), s)).collect();
    listed.push((event(OTHER, 1), 6));
    listed.extend((6..=7).map(|s| (event(CLIENT, s), s + 1)));
    assert_eq!(each, listed, "a run lists each of its messages");
}

/// A one-hop-ack-client producer on servers 1 (the primary), 2 and 3.
fn producer() -> Producer {
    let settings = ProducerSettings {
        retry_ms: 1_000,
        ..ProducerSettings::default()
    };
    Producer::new(
        CLIENT,
        1,
        Protocol::OneHopAckClient,
        three_servers(),
        settings,
    )
}

fn run(first: u64, count: u64) -> Msg {
    Msg::Ack {
        event: event(CLIENT, first),
        version: first + 100,
        epoch: 1,
        duplicate: false,
        hint: None,
        count,
    }
}

fn done(producer: &mut Producer) -> Vec<(u64, u64, Vec<ServerId>)> {
    producer
        .take_completed()
        .into_iter()
        .map(|completion| {
            let acked = completion.outcome.expect("acknowledged");
            let mut servers: Vec<ServerId> = acked.acks.iter().map(|(s, _)| *s).collect();
            servers.sort_unstable();
            (completion.event.sequence, acked.version, servers)
        })
        .collect()
}

#[test]
fn the_producer_takes_a_run_as_an_ack_of_each_of_its_messages() {
    let mut producer = producer();
    let mut out = Vec::new();
    for _ in 0..4 {
        producer.send(Bytes::new(), Bytes::from_static(b"x"), 0, &mut out);
    }
    producer.on_message(1, run(1, 4), 1, &mut out);
    producer.on_message(2, run(1, 4), 1, &mut out);
    // Server 3's run covers the first three only.
    producer.on_message(3, run(1, 3), 1, &mut out);
    let all = vec![1, 2, 3];
    let first_three: Vec<_> = (1..=3).map(|s| (s, s + 100, all.clone())).collect();
    assert_eq!(done(&mut producer), first_three);
    producer.on_message(3, run(4, 1), 2, &mut out);
    assert_eq!(done(&mut producer), vec![(4, 104, all.clone())]);
    // A run past the longest one names no further than `ACK_RUN_MAX`.
    assert_eq!(run(1, u64::MAX).acked().count() as u64, ACK_RUN_MAX);
}
