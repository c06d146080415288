//! How a run is written down: a line per event for the trace, and the
//! words of each message that the run's hash covers.

use engine::replication::{Entry, Msg, Node};
use proto::EventId;

pub(crate) fn node_code(node: Node) -> u64 {
    match node {
        Node::Server(id) => u64::from(id),
        Node::Client(id) => (id as u64) ^ ((id >> 64) as u64) ^ (1 << 63),
    }
}

/// The words of a message that the trace hash covers.
pub(crate) fn fingerprint(msg: &Msg) -> [u64; 3] {
    match msg {
        Msg::Write(content) => [1, content.event.sequence, content.payload.len() as u64],
        Msg::Tagged(content) => [2, content.event.sequence, content.payload.len() as u64],
        Msg::Reserve { event, .. } => [3, event.sequence, 0],
        Msg::Placed {
            version, content, ..
        } => [4, content.event.sequence, *version],
        Msg::Ack {
            event,
            version,
            duplicate,
            count,
            ..
        } => [
            5,
            event.sequence ^ (count << 40),
            *version ^ (u64::from(*duplicate) << 63),
        ],
        Msg::Stamped { event, version, .. } => [6, event.sequence, *version],
        Msg::Refused { event, .. } => [7, event.sequence, 0],
        Msg::Replicate { entries } => [
            8,
            entries.first().map_or(0, Entry::version),
            entries.len() as u64,
        ],
        Msg::Bind { bindings } => [
            9,
            bindings.first().map_or(0, |b| b.version),
            bindings.len() as u64,
        ],
        Msg::Progress { logged, last } => [10, *logged, *last],
        Msg::Commit { committed, last } => [11, *committed, *last],
        Msg::Need { from, to } => [12, *from, *to],
        Msg::Probe => [14, 0, 0],
        Msg::Reack { event, version } => [13, event.sequence, *version],
        Msg::Confirm {
            event,
            version,
            count,
        } => [15, event.sequence, *version ^ (*count << 48)],
        Msg::Checkpointed { through, resend } => [16, *through, u64::from(*resend)],
        Msg::Checkpoint { through, state } => [17, *through, state.len() as u64],
    }
}

/// A message in a few words, for the trace.
pub(crate) fn describe(msg: &Msg) -> String {
    let range = |first: Option<u64>, last: Option<u64>, count: usize| match (first, last) {
        (Some(first), Some(last)) => format!("{first}..={last} ({count})"),
        _ => "nothing".to_string(),
    };
    match msg {
        Msg::Write(content) => format!("write {}", show(&content.event)),
        Msg::Tagged(content) => format!("tagged {}", show(&content.event)),
        Msg::Reserve { event, .. } => format!("reserve {}", show(event)),
        Msg::Placed {
            version,
            epoch,
            content,
        } => format!("placed {} @{version} e{epoch}", show(&content.event)),
        Msg::Ack {
            event,
            version,
            duplicate,
            hint,
            count,
            ..
        } => {
            let duplicate = if *duplicate { " duplicate" } else { "" };
            let hint = hint.map_or(String::new(), |mode| format!(" hint {mode:?}"));
            let run = if *count > 1 {
                format!(" and the next {}", count - 1)
            } else {
                String::new()
            };
            format!("ack {} @{version}{run}{duplicate}{hint}", show(event))
        }
        Msg::Stamped {
            event,
            version,
            duplicate,
            ..
        } => {
            let duplicate = if *duplicate { " duplicate" } else { "" };
            format!("stamped {} @{version}{duplicate}", show(event))
        }
        Msg::Refused { event, refusal } => format!("refused {}: {refusal}", show(event)),
        Msg::Confirm {
            event,
            version,
            count,
        } => format!("confirm {} @{version} x{count}", show(event)),
        Msg::Checkpointed { through, resend } => {
            let resend = if *resend { " resend" } else { "" };
            format!("checkpointed @{through}{resend}")
        }
        Msg::Replicate { entries } => format!(
            "replicate {}",
            range(
                entries.first().map(Entry::version),
                entries.last().map(Entry::version),
                entries.len()
            )
        ),
        Msg::Bind { bindings } => format!(
            "bind {}",
            range(
                bindings.first().map(|b| b.version),
                bindings.last().map(|b| b.version),
                bindings.len()
            )
        ),
        Msg::Progress { logged, last } => format!("progress {logged} {last}"),
        Msg::Commit { committed, last } => format!("commit {committed} last {last}"),
        Msg::Need { from, to } => format!("need {from}..={to}"),
        Msg::Probe => "probe".to_string(),
        Msg::Reack { event, version } => format!("reack {} @{version}", show(event)),
        Msg::Checkpoint { through, state } => {
            format!("checkpoint @{through} ({} bytes)", state.len())
        }
    }
}

pub(crate) fn node(node: Node) -> String {
    match node {
        Node::Server(id) => format!("s{id}"),
        Node::Client(id) => format!("c{}", short(id)),
    }
}

/// The low 16 bits of a client id: enough to tell a run's clients apart.
pub(crate) fn short(client: u128) -> String {
    format!("{:04x}", client as u16)
}

/// An event id in the trace: short client id / sequence.
pub(crate) fn show(event: &EventId) -> String {
    format!("{}/{}", short(event.client), event.sequence)
}
