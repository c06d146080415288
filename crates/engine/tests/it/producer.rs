//! The producer's resends: a message refused for a passing reason goes
//! again soon, backing off, and any other waits for the retry time.

use engine::replication::{
    Bytes, Msg, Node, Placement, Producer, ProducerSettings, Protocol, Refusal,
};
use engine::Rejection;

const CLIENT: u128 = 42;

/// A producer of `protocol` on servers 1 (the primary), 2 and 3, resending
/// after 1 s, or 5 ms after a first passing refusal.
fn producer_of(protocol: Protocol) -> Producer {
    let placement = Placement {
        replicas: vec![1, 2, 3],
        primary: 1,
        epoch: 1,
    };
    let settings = ProducerSettings {
        retry_ms: 1_000,
        busy_retry_ms: 5,
        sender_logging: false,
    };
    Producer::new(CLIENT, 1, protocol, placement, settings)
}

fn producer() -> Producer {
    producer_of(Protocol::OneHopAckClient)
}

/// The times in `0..until` (ms, one tick each) at which the producer sent
/// something, refusing each send with `refusal` at once.
fn resends(producer: &mut Producer, refusal: Refusal, until: u64) -> Vec<u64> {
    let mut out = Vec::new();
    let mut times = Vec::new();
    for now in 1..until {
        out.clear();
        producer.on_tick(now, &mut out);
        if out.is_empty() {
            continue;
        }
        times.push(now);
        for (node, msg) in out.drain(..) {
            let (Node::Server(server), Msg::Write(content)) = (node, msg) else {
                continue;
            };
            let refused = Msg::Refused {
                event: content.event,
                refusal,
            };
            producer.on_message(server, refused, now, &mut Vec::new());
        }
    }
    times
}

fn send_refused(producer: &mut Producer, refusal: Refusal) {
    let mut out = Vec::new();
    let event = producer.send(Bytes::new(), Bytes::from(vec![1; 8]), 0, &mut out);
    assert!(
        matches!(out.as_slice(), [(Node::Server(1), Msg::Write(_))]),
        "the first send goes to the primary: {out:?}"
    );
    producer.on_message(1, Msg::Refused { event, refusal }, 0, &mut out);
}

#[test]
fn a_busy_refusal_is_sent_again_soon_and_backs_off_to_the_retry_time() {
    let mut producer = producer();
    send_refused(&mut producer, Refusal::Busy);
    // 5, then 10, 20, ... ms after each refusal, capped at 1,000.
    let times = resends(&mut producer, Refusal::Busy, 4_000);
    let gaps: Vec<u64> = std::iter::once(times[0])
        .chain(times.windows(2).map(|pair| pair[1] - pair[0]))
        .collect();
    assert_eq!(
        &gaps[..9],
        &[5, 10, 20, 40, 80, 160, 320, 640, 1_000],
        "resend times {times:?}"
    );
    assert!(gaps[9..].iter().all(|&gap| gap == 1_000), "{gaps:?}");
    assert_eq!(producer.in_flight(), 1, "still waiting, not failed");
}

#[test]
fn a_full_dedupe_table_backs_off_like_busy() {
    let mut producer = producer();
    send_refused(&mut producer, Refusal::Rejected(Rejection::DedupeFull));
    let times = resends(&mut producer, Refusal::Rejected(Rejection::DedupeFull), 40);
    assert_eq!(times, vec![5, 15, 35]);
}

#[test]
fn not_primary_waits_for_the_retry_time_or_a_new_placement() {
    let mut producer = producer();
    send_refused(&mut producer, Refusal::NotPrimary);
    let times = resends(&mut producer, Refusal::NotPrimary, 2_500);
    assert_eq!(times, vec![1_000, 2_000]);
}

#[test]
fn a_version_between_refusals_starts_the_backoff_again() {
    // `returns-version`: the primary stamps, then the client carries the
    // message to the replicas with its version.
    let mut producer = producer_of(Protocol::ReturnsVersion);
    let mut out = Vec::new();
    let event = producer.send(Bytes::new(), Bytes::from(vec![1; 8]), 0, &mut out);
    for now in [0, 5] {
        let refused = Msg::Refused {
            event,
            refusal: Refusal::Busy,
        };
        producer.on_message(1, refused, now, &mut out);
        out.clear();
        producer.on_tick(now + 5, &mut out);
    }
    // Two refusals in a row: the next wait would be 20 ms. A version
    // comes first, and a replica's refusal after it waits 5 ms again.
    let stamped = Msg::Stamped {
        event,
        version: 1,
        epoch: 1,
        duplicate: false,
    };
    out.clear();
    producer.on_message(1, stamped, 11, &mut out);
    assert!(
        out.iter().any(|(node, _)| *node == Node::Server(2)),
        "the stamped message goes to the replicas: {out:?}"
    );
    let refused = Msg::Refused {
        event,
        refusal: Refusal::Busy,
    };
    producer.on_message(2, refused, 12, &mut out);
    let times = (13..40)
        .filter(|&now| {
            let mut sent = Vec::new();
            producer.on_tick(now, &mut sent);
            !sent.is_empty()
        })
        .collect::<Vec<_>>();
    assert_eq!(times.first(), Some(&17), "resent 5 ms after the refusal");
}
