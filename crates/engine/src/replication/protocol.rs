//! The replication protocols a stream can use: seed 001's six message
//! patterns and seed 002's four duplication protocols with their hybrid.
//!
//! Each protocol is a message flow ([`Flow`]: who sends the content to whom
//! and where the version comes from) plus an ack rule ([`AckRule`]: which
//! acknowledgements make a write done). Several protocols of the two seeds
//! share a flow and differ only in the rule; `docs/protocols.md` has the
//! table.

use std::fmt;
use std::str::FromStr;

/// A stream's replication protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Baseline: the client sends to every replica, each logs under its
    /// own local version and acks; no shared version.
    Unversioned,
    /// The client asks the primary for a version, then sends the message
    /// with it to every replica; each acks the client.
    VersionRequest,
    /// The client sends the message to the primary, which logs it and
    /// returns the version; the client then sends message and version to
    /// the other replicas; each acks the client.
    ReturnsVersion,
    /// The client sends to the primary, which stamps, logs and forwards;
    /// the replicas ack the primary, which acks the client once all have.
    OneHop,
    /// As `OneHop`, but every replica acks the client directly (default).
    OneHopAckClient,
    /// The client sends to every replica with a tag naming the primary; the
    /// primary stamps and sends the version to the others, which wait for
    /// it; every replica acks the client.
    BroadcastTag,
    /// The primary acks once its own log has the message and copies it to
    /// the replicas in the background.
    ServerAsync,
    /// The primary acks once every replica's log has the message.
    ServerSync,
    /// The client sends to every replica; the write is done at the first
    /// ack (which carries the primary's version).
    ClientAsync,
    /// The client sends to every replica; the write is done when all ack.
    ClientSync,
    /// `server-sync` while the replica set's servers outnumber the active
    /// clients, `client-async` otherwise, chosen by the primary from live
    /// counts.
    Hybrid,
}

/// Who sends the message's content where, and where the version comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Client to every replica; each assigns its own version.
    Local,
    /// Client asks the primary for a version, then sends content + version
    /// to every replica; replicas other than the primary wait for the
    /// primary's binding of the version before they log.
    Reserve,
    /// Client sends to the primary, which returns the version; the client
    /// sends content + version to the other replicas, which trust it.
    Stamp,
    /// Client sends to the primary, which forwards the stamped record.
    Forward,
    /// Client sends to every replica; the primary sends each other replica
    /// the binding (version → event id); they wait for it.
    Tagged,
}

/// Which acknowledgements make a write done for the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckRule {
    /// Every replica acks the client once its own log has the message; the
    /// write is done when all of them have.
    EveryReplica,
    /// Every replica acks the client; the first ack makes the write done.
    FirstReplica,
    /// Only the primary acks, once every replica's log has the message.
    PrimaryAfterAll,
    /// Only the primary acks, once its own log has the message.
    PrimaryOnly,
}

/// The mode a `hybrid` stream runs in at a given moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HybridMode {
    ServerSync,
    ClientAsync,
}

impl HybridMode {
    pub fn protocol(self) -> Protocol {
        match self {
            HybridMode::ServerSync => Protocol::ServerSync,
            HybridMode::ClientAsync => Protocol::ClientAsync,
        }
    }

    /// The seed's rule: server-driven while the servers outnumber the
    /// active clients, client-driven otherwise.
    pub fn choose(servers: usize, active_clients: usize) -> HybridMode {
        if servers > active_clients {
            HybridMode::ServerSync
        } else {
            HybridMode::ClientAsync
        }
    }
}

impl Protocol {
    pub const ALL: [Protocol; 11] = [
        Protocol::Unversioned,
        Protocol::VersionRequest,
        Protocol::ReturnsVersion,
        Protocol::OneHop,
        Protocol::OneHopAckClient,
        Protocol::BroadcastTag,
        Protocol::ServerAsync,
        Protocol::ServerSync,
        Protocol::ClientAsync,
        Protocol::ClientSync,
        Protocol::Hybrid,
    ];

    /// The six message patterns of seed 001, in the seed's order.
    pub const PATTERNS: [Protocol; 6] = [
        Protocol::Unversioned,
        Protocol::VersionRequest,
        Protocol::ReturnsVersion,
        Protocol::OneHop,
        Protocol::OneHopAckClient,
        Protocol::BroadcastTag,
    ];

    /// Seed 002's four duplication protocols and the hybrid.
    pub const DUPLICATION: [Protocol; 5] = [
        Protocol::ServerAsync,
        Protocol::ServerSync,
        Protocol::ClientAsync,
        Protocol::ClientSync,
        Protocol::Hybrid,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Protocol::Unversioned => "unversioned",
            Protocol::VersionRequest => "version-request",
            Protocol::ReturnsVersion => "returns-version",
            Protocol::OneHop => "one-hop",
            Protocol::OneHopAckClient => "one-hop-ack-client",
            Protocol::BroadcastTag => "broadcast-tag",
            Protocol::ServerAsync => "server-async",
            Protocol::ServerSync => "server-sync",
            Protocol::ClientAsync => "client-async",
            Protocol::ClientSync => "client-sync",
            Protocol::Hybrid => "hybrid",
        }
    }

    /// Wire code (one byte).
    pub fn code(self) -> u8 {
        Protocol::ALL
            .iter()
            .position(|p| *p == self)
            .expect("listed") as u8
            + 1
    }

    pub fn from_code(code: u8) -> Option<Protocol> {
        Protocol::ALL.get((code as usize).checked_sub(1)?).copied()
    }

    /// The flow of a write; `hybrid` has the flow of its current mode.
    pub fn flow(self, mode: HybridMode) -> Flow {
        match self {
            Protocol::Unversioned => Flow::Local,
            Protocol::VersionRequest => Flow::Reserve,
            Protocol::ReturnsVersion => Flow::Stamp,
            Protocol::OneHop
            | Protocol::OneHopAckClient
            | Protocol::ServerAsync
            | Protocol::ServerSync => Flow::Forward,
            Protocol::BroadcastTag | Protocol::ClientAsync | Protocol::ClientSync => Flow::Tagged,
            Protocol::Hybrid => mode.protocol().flow(mode),
        }
    }

    pub fn ack_rule(self, mode: HybridMode) -> AckRule {
        match self {
            Protocol::Unversioned
            | Protocol::VersionRequest
            | Protocol::ReturnsVersion
            | Protocol::OneHopAckClient
            | Protocol::BroadcastTag
            | Protocol::ClientSync => AckRule::EveryReplica,
            Protocol::ClientAsync => AckRule::FirstReplica,
            Protocol::OneHop | Protocol::ServerSync => AckRule::PrimaryAfterAll,
            Protocol::ServerAsync => AckRule::PrimaryOnly,
            Protocol::Hybrid => mode.protocol().ack_rule(mode),
        }
    }

    /// Whether replicas other than the primary ack the client for records
    /// they log. `hybrid` replicas ack every record (a client in
    /// server-sync mode ignores them).
    pub fn replicas_ack_client(self) -> bool {
        match self {
            Protocol::Hybrid => true,
            other => matches!(
                other.ack_rule(HybridMode::ServerSync),
                AckRule::EveryReplica | AckRule::FirstReplica
            ),
        }
    }

    /// How many replicas' logs a version needs to be committed, under the
    /// rule `rule`, with `replicas` replicas.
    pub fn commit_quorum(rule: AckRule, replicas: usize) -> usize {
        match rule {
            AckRule::EveryReplica | AckRule::PrimaryAfterAll => replicas,
            AckRule::FirstReplica | AckRule::PrimaryOnly => 1,
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A protocol name that is none of [`Protocol::ALL`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown protocol {name:?}; expected one of {}", Protocol::ALL.map(Protocol::name).join(", "))]
pub struct UnknownProtocol {
    pub name: String,
}

impl FromStr for Protocol {
    type Err = UnknownProtocol;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Protocol::ALL
            .iter()
            .copied()
            .find(|p| p.name() == text)
            .ok_or_else(|| UnknownProtocol {
                name: text.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_codes_round_trip() {
        for protocol in Protocol::ALL {
            assert_eq!(protocol.name().parse::<Protocol>(), Ok(protocol));
            assert_eq!(Protocol::from_code(protocol.code()), Some(protocol));
        }
        assert_eq!(Protocol::from_code(0), None);
        assert_eq!(Protocol::from_code(12), None);
        assert!("two-hop".parse::<Protocol>().is_err());
    }

    #[test]
    fn hybrid_follows_the_seed_rule() {
        assert_eq!(HybridMode::choose(3, 1), HybridMode::ServerSync);
        assert_eq!(HybridMode::choose(3, 3), HybridMode::ClientAsync);
        assert_eq!(Protocol::Hybrid.flow(HybridMode::ClientAsync), Flow::Tagged);
        assert_eq!(
            Protocol::Hybrid.ack_rule(HybridMode::ServerSync),
            AckRule::PrimaryAfterAll
        );
    }
}
