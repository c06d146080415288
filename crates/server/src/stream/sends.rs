//! The order in which a step's messages leave. A step's messages for the
//! other replicas leave before this log takes a record (a record leaves
//! for them before this log's I/O thread is woken for it); otherwise
//! they leave after the clients' messages. An ack is on its client's
//! path, while a replica's progress or commit point is not, and each send
//! to a peer on the same machine's loopback also runs the peer's receive
//! and wake-up in the sender's time. The messages for each client go in
//! one note.
//!
//! After the acks of a record this thread wrote in place (the durable
//! hook of `wal::write_here`, one message in flight), and before the
//! peers' messages, the thread yields its CPU once (`Outbox::between`):
//! a client on the same machine woken by the ack is often placed on
//! this CPU, and it then reads its ack before this thread sends the
//! `Progress` or `Commit` that follows (and runs, on loopback, the
//! peer's side of it). Measured in docs/results.md ("The reader yields
//! after the acks of a record written in place").
//!
//! A primary's step sends each backup a `Replicate` of the same records
//! (the same bytes, shared); those leave together, so that their frame
//! is encoded once and shared by the links (`Outbox::to_peers`).

use engine::replication::{Msg, ServerId};

/// Peers one message goes to at once, at most (a longer run of the same
/// records is sent in parts).
const GROUP_MAX: usize = 8;

/// Where a step's messages go.
pub(super) trait Outbox {
    /// `msg` to each of `to`, encoded once.
    fn to_peers(&self, to: &[ServerId], msg: &Msg);
    fn to_client(&self, client: u128, msgs: Vec<Msg>);
    /// Between the acks of a record written in place and the peers'
    /// messages after them.
    fn between(&self);
}

/// A step's messages that have not left yet.
#[derive(Default)]
pub(super) struct Sends {
    peers: Vec<(ServerId, Msg)>,
    clients: Vec<(u128, Vec<Msg>)>,
}

impl Sends {
    pub(super) fn peer(&mut self, to: ServerId, msg: Msg) {
        self.peers.push((to, msg));
    }

    pub(super) fn client(&mut self, client: u128, msg: Msg) {
        match self.clients.iter_mut().find(|(c, _)| *c == client) {
            Some((_, msgs)) => msgs.push(msg),
            None => self.clients.push((client, vec![msg])),
        }
    }

    /// The log is about to take a record: the peers' messages leave now,
    /// each run of the same records to several peers as one.
    pub(super) fn before_append(&mut self, out: &impl Outbox) {
        let mut group = [0; GROUP_MAX];
        let mut grouped = 0;
        let mut peers = self.peers.drain(..).peekable();
        while let Some((to, msg)) = peers.next() {
            group[grouped] = to;
            grouped += 1;
            let joins = peers
                .peek()
                .is_some_and(|(_, next)| same_records(&msg, next));
            if !joins || grouped == GROUP_MAX {
                out.to_peers(&group[..grouped], &msg);
                grouped = 0;
            }
        }
    }

    /// The step is done: the clients' messages leave, then the peers'.
    /// `in_place`: the step is the durable hook of a record this thread
    /// wrote in place (`wal::hook_in_place`), so when it has both, the
    /// outbox's `between` runs after the acks.
    pub(super) fn finish(mut self, out: &impl Outbox, in_place: bool) {
        let acked = !self.clients.is_empty();
        for (client, msgs) in self.clients.drain(..) {
            out.to_client(client, msgs);
        }
        if in_place && acked && !self.peers.is_empty() {
            out.between();
        }
        self.before_append(out);
    }
}

/// Whether two messages are a `Replicate` of the same records: slices
/// of the same bytes, as a primary's step sends to each backup. Compared
/// by address, not by content, so the check costs nothing per byte.
fn same_records(a: &Msg, b: &Msg) -> bool {
    match (a, b) {
        (Msg::Replicate { entries: a }, Msg::Replicate { entries: b }) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.shares_bytes(b))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use engine::replication::Entry;

    use super::*;

    /// Records where each message went, in order.
    #[derive(Default)]
    struct Recorded(RefCell<Vec<String>>);

    impl Outbox for Recorded {
        fn to_peers(&self, to: &[ServerId], msg: &Msg) {
            let to: Vec<String> = to.iter().map(ToString::to_string).collect();
            self.0
                .borrow_mut()
                .push(format!("peer {}: {msg:?}", to.join(",")));
        }
        fn to_client(&self, client: u128, msgs: Vec<Msg>) {
            self.0
                .borrow_mut()
                .push(format!("client {client}: {} messages", msgs.len()));
        }
        fn between(&self) {
            self.0.borrow_mut().push("between".to_string());
        }
    }

    fn progress(logged: u64) -> Msg {
        Msg::Progress {
            logged,
            last: logged,
        }
    }

    #[test]
    fn a_steps_acks_leave_before_its_progress_and_each_client_gets_one_note() {
        let out = Recorded::default();
        let mut sends = Sends::default();
        sends.peer(1, progress(7));
        sends.client(9, progress(1));
        sends.client(8, progress(2));
        sends.client(9, progress(3));
        sends.finish(&out, false);
        assert_eq!(
            out.0.into_inner(),
            vec![
                "client 9: 2 messages".to_string(),
                "client 8: 1 messages".to_string(),
                format!("peer 1: {:?}", progress(7)),
            ]
        );
    }

    #[test]
    fn the_same_records_for_several_peers_leave_as_one_message_and_nothing_else_does() {
        let out = Recorded::default();
        let mut sends = Sends::default();
        let records = vec![Entry::void(1, 5, 1), Entry::void(1, 6, 1)];
        let replicate = || Msg::Replicate {
            entries: records.clone(),
        };
        sends.peer(2, replicate());
        sends.peer(3, replicate());
        // Equal records that are other bytes, and messages that are
        // equal but carry no records, each leave on their own.
        let copied = Msg::Replicate {
            entries: vec![Entry::void(1, 5, 1), Entry::void(1, 6, 1)],
        };
        assert_eq!(copied, replicate());
        sends.peer(3, copied.clone());
        sends.peer(2, progress(6));
        sends.peer(3, progress(6));
        // A run longer than a group goes in parts, in order.
        for to in 0..GROUP_MAX as ServerId + 1 {
            sends.peer(to, replicate());
        }
        sends.before_append(&out);
        let all: Vec<String> = (0..GROUP_MAX).map(|to| to.to_string()).collect();
        assert_eq!(
            out.0.into_inner(),
            vec![
                format!("peer 2,3: {:?}", replicate()),
                format!("peer 3: {copied:?}"),
                format!("peer 2: {:?}", progress(6)),
                format!("peer 3: {:?}", progress(6)),
                format!("peer {}: {:?}", all.join(","), replicate()),
                format!("peer {GROUP_MAX}: {:?}", replicate()),
            ]
        );
    }

    #[test]
    fn messages_for_the_peers_leave_before_the_log_takes_a_record() {
        let out = Recorded::default();
        let mut sends = Sends::default();
        sends.peer(2, progress(1));
        sends.client(9, progress(1));
        sends.before_append(&out);
        // Only the peers' so far; the client's waits for the step's end.
        assert_eq!(out.0.borrow().len(), 1);
        sends.peer(3, progress(2));
        sends.finish(&out, false);
        assert_eq!(
            out.0.into_inner(),
            vec![
                format!("peer 2: {:?}", progress(1)),
                "client 9: 1 messages".to_string(),
                format!("peer 3: {:?}", progress(2)),
            ]
        );
    }

    #[test]
    fn after_a_write_in_place_the_thread_yields_between_acks_and_peers_only_when_it_has_both() {
        let finished = |clients: bool, peers: bool, in_place: bool| {
            let out = Recorded::default();
            let mut sends = Sends::default();
            if peers {
                sends.peer(2, progress(4));
            }
            if clients {
                sends.client(9, progress(4));
            }
            sends.finish(&out, in_place);
            out.0.into_inner()
        };
        assert_eq!(
            finished(true, true, true),
            vec![
                "client 9: 1 messages".to_string(),
                "between".to_string(),
                format!("peer 2: {:?}", progress(4)),
            ]
        );
        // Not in place (a journal round's hook, a reader's step), or
        // with nothing on one side: no pause.
        assert!(!finished(true, true, false).contains(&"between".to_string()));
        assert_eq!(finished(true, false, true).len(), 1);
        assert_eq!(finished(false, true, true).len(), 1);
    }
}
