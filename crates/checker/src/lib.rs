//! The history checker that judges every reliability test of stamplog.
//!
//! A test records what its clients did ([`ClientHistory`]: the messages
//! they sent, with event ids and a [`digest`] of the content, and the
//! acknowledgements they received, with versions) and reads back every
//! replica's log of one stream ([`ReplicaLog`]: version → record, in the
//! order the log holds them). [`check`] compares the two against the
//! guarantees of the brief (section 2) and counts each kind of violation in
//! a [`Report`]. Every count must be 0 for the test to pass (section 5).
//!
//! The crate is pure logic: no I/O, no async, no clock, no randomness, and
//! its output (counts and examples) is deterministic for a given input.
//! It runs in O(n log n) time for n logged records plus O(a + s) for a
//! acknowledgements and s sent messages, using hash maps keyed by event id
//! and one sort of the logged records by version.
//!
//! # Scope
//!
//! When `committed` is `Some(c)`, only logged records with version `<= c`
//! are checked: the records above it are an uncommitted tail that a later
//! view may legitimately replace. Every definition below reads "a replica's
//! log" as the records that remain after this filter (the *checked log*),
//! and a replica's *last version* as the largest version in its checked
//! log (0 when it is empty). Acknowledgements are never filtered: an
//! acknowledged message must be in the committed log, so an ack above `c`
//! is judged like any other (its message counts as lost unless it is logged
//! at or below `c`, and the ack as misplaced when it is).
//!
//! A *message* is the pair (event id, digest). Two records hold the same
//! message when both match; they differ when either differs. A replica
//! *reaches* version `v` when its last version is `>= v`; a replica whose
//! log simply ends earlier is lagging, which is allowed (a quorum can
//! acknowledge without it).
//!
//! # Definitions
//!
//! - **lost** (guarantee 1) counts distinct acknowledged event ids `e`,
//!   with `v` the smallest version `e` was acknowledged at, such that
//!   either no replica's log holds a record of `e` at all, or some replica
//!   that reaches `v` holds no record of `e` at any version. A replica that
//!   does not reach `v` is lagging and not judged. Where the message sits
//!   (at `v` or elsewhere) and whether its content is intact are judged by
//!   `misplaced_acks`, `divergent` and `conflicting_versions`; `lost` only
//!   asks whether the event is there at all, so one fault is not counted
//!   twice under two names.
//! - **duplicated** (guarantee 3) counts distinct event ids that appear at
//!   more than one version in the union of all replicas' logs: twice in one
//!   replica, or at different versions on two replicas. It counts event ids,
//!   not extra copies. The same event at the same version on several
//!   replicas is replication, not duplication.
//! - **conflicting_versions** (guarantee 2) counts versions at which the
//!   union of all replicas' logs holds two or more different messages,
//!   whether on different replicas or twice at the same version in one
//!   replica's log. It asks only "does this version hold one message".
//! - **gaps** (guarantee 2) counts, for each replica, the versions missing
//!   between the smallest and the largest version of its log, summed over
//!   replicas. The count starts at the replica's first version, not at 1,
//!   because a log may have dropped its head (retention, memory mode); a
//!   head that is missing while other replicas hold it is `divergent`, and
//!   `lost` if it was acknowledged.
//! - **reordered** (guarantee 4) counts, for each replica, the adjacent
//!   pairs of records in log order whose second version is not greater than
//!   the first (a decrease or a repeat), summed over replicas. Swapping two
//!   neighbouring records therefore counts 1.
//! - **divergent** (guarantee 2) counts versions at which the replicas do
//!   not all agree: two replicas hold different messages there (each
//!   replica judged by the first record its log holds at that version), or
//!   some replica holds the version while another replica reaches past it
//!   and does not hold it. Unlike `conflicting_versions` it sees holes
//!   (a replica missing a version the others have), and unlike it, it does
//!   not see a second record at the same version inside one replica.
//!   Versions that only some replicas hold because the others' logs end
//!   earlier are not divergent.
//! - **misplaced_acks** counts distinct (event id, version) pairs among
//!   acknowledgements such that either some replica's log holds, at that
//!   version, a record of another event or of a digest the client did not
//!   send for that event, or the event is logged somewhere but no replica
//!   holds it at that version (the ack points to the wrong place, or past
//!   the end). Duplicate acks that repeat the original version are the same
//!   pair and count once, so they are fine; one naming another version is
//!   judged on its own.
//! - **unknown_events** counts distinct messages (event id, digest) in the
//!   logs that no client reports having sent: an event id nobody sent, or a
//!   known event id with content its client never sent (corruption, or a
//!   record built from the wrong bytes).
//!
//! A *void* record (client id [`VOID_CLIENT`], written by a primary to
//! resolve a version whose message never came) fills its version like any
//! record, for gaps and divergence, but is not an unknown event: no client
//! sends it.
//!
//! Messages sent and never acknowledged are not required to be anywhere:
//! absent, they are fine; logged (the ack was lost on the way), they are
//! judged like every other record. The `duplicate` flag of an [`Acked`] is
//! context only: a duplicate ack is judged by its version like any other.
//!
//! One fault often breaks more than one rule, and the counts say so: a
//! record dropped from the middle of one replica's log is a gap and a
//! divergent version, and a lost message if it was acknowledged.

mod check;
mod digest;
mod history;
mod reads;
mod report;

pub use check::check;
pub use digest::digest;
pub use history::{HistoryError, LineProblem};
pub use proto::EventId;
pub use reads::{check_reads, ReadReport, ReaderHistory};
pub use report::{Report, EXAMPLES_MAX};

/// The client id of void records (`proto::FLAG_VOID`); no client uses it.
pub const VOID_CLIENT: u128 = 0;

/// A message a client sent: its event id and the [`digest`] of its key and
/// payload. Recorded for every send attempt's message (retries repeat it),
/// so the checker can tell a logged message that somebody sent from one that
/// nobody did, and an intact one from a corrupted one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The event id the client chose for the message.
    pub event: EventId,
    /// [`digest`] of the key and payload the client sent.
    pub digest: u64,
}

/// An acknowledgement a client received: the message's event id and the
/// version the cluster gave it. Each one is a promise the logs must keep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    /// The event id the acknowledgement answers.
    pub event: EventId,
    /// The version the acknowledgement names.
    pub version: u64,
    /// The server flagged it as the answer to a retry of a message already
    /// logged; it must still name the original version.
    pub duplicate: bool,
}

/// What one client (or one session, or all of them; the checker merges
/// them) recorded during a run. Order does not matter for the counts; it
/// decides which examples are reported first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClientHistory {
    /// Every message the client sent.
    pub sent: Vec<Sent>,
    /// Every acknowledgement the client received.
    pub acked: Vec<Acked>,
}

/// One record in one replica's log, reduced to what the checker compares:
/// its version, its event id and the [`digest`] of its key and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logged {
    /// The version the record is stored under.
    pub version: u64,
    /// The event id in the record's header.
    pub event: EventId,
    /// [`digest`] of the record's key and payload.
    pub digest: u64,
}

/// One replica's log of the stream under test, read back after the run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaLog {
    /// A name for the replica, used only in the examples.
    pub replica: String,
    /// The records in the order the log holds them (not sorted by the
    /// caller: the order itself is checked).
    pub records: Vec<Logged>,
}
