//! A stream's metadata file (`stream.json`): its id, name, durability,
//! protocol, replica set and options, written when the stream is created
//! and read when it is opened; and the rule for stream names.

use super::*;

/// The file in a stream's folder that describes it.
pub const META_FILE: &str = "stream.json";

/// Longest stream name.
const NAME_BYTES_MAX: usize = 128;

/// What is persisted about a stream.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct StreamMeta {
    pub format: u32,
    pub id: u64,
    pub name: String,
    pub durability: String,
    pub pages: u16,
    pub page_size: u32,
    /// Replication protocol name (`one-hop-ack-client` when absent).
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// The replica set's server ids (this server alone when absent).
    #[serde(default)]
    pub replicas: Vec<ServerId>,
    /// The primary's server id (0: this server).
    #[serde(default)]
    pub primary: ServerId,
    #[serde(default = "default_epoch")]
    pub epoch: u64,
    /// Retention: keep at least this many bytes of log; absent: the
    /// server's `retain_bytes`; 0: no size limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_bytes: Option<u64>,
    /// Retention: delete segments closed this long ago; absent: the
    /// server's `retain_ms`; 0: no age limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retain_ms: Option<u64>,
    /// The output commit interval in milliseconds (0: none; absent in
    /// files written before it existed).
    #[serde(default)]
    pub commit_interval_ms: u32,
}

fn default_protocol() -> String {
    Protocol::OneHopAckClient.name().to_string()
}

fn default_epoch() -> u64 {
    1
}

impl StreamMeta {
    pub fn new(
        id: u64,
        name: &str,
        durability: DurabilityConfig,
        protocol: Protocol,
        placement: &Placement,
    ) -> Self {
        let (mode, pages, page_size) = durability.parts();
        StreamMeta {
            format: 1,
            id,
            name: name.to_string(),
            durability: mode.to_string(),
            pages,
            page_size,
            protocol: protocol.name().to_string(),
            replicas: placement.replicas.clone(),
            primary: placement.primary,
            epoch: placement.epoch,
            commit_interval_ms: 0,
            retain_bytes: None,
            retain_ms: None,
        }
    }

    /// The stream's retention: its own settings, else the server's.
    pub fn retention(&self, config: &ServerConfig) -> Retention {
        Retention {
            bytes: self.retain_bytes.unwrap_or(config.retain_bytes),
            ms: self.retain_ms.unwrap_or(config.retain_ms),
        }
    }

    pub fn protocol(&self) -> Result<Protocol, engine::replication::UnknownProtocol> {
        self.protocol.parse()
    }

    /// The stream's placement; a meta file from a single server (no
    /// replica list) places the stream on `me` alone.
    pub fn placement(&self, me: ServerId) -> Placement {
        if self.replicas.is_empty() {
            return Placement {
                replicas: vec![me],
                primary: me,
                epoch: self.epoch,
            };
        }
        Placement {
            replicas: self.replicas.clone(),
            primary: if self.primary == 0 { me } else { self.primary },
            epoch: self.epoch,
        }
    }

    pub fn durability(&self) -> Result<DurabilityConfig, proto::UnknownDurability> {
        DurabilityConfig::from_parts(&self.durability, self.pages, self.page_size)
    }
}

/// Why a stream name is not acceptable, or `None` when it is.
pub fn stream_name_error(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > NAME_BYTES_MAX {
        return Some(format!("stream names are 1 to {NAME_BYTES_MAX} bytes long"));
    }
    if name.starts_with('.')
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Some(format!(
            "stream name {name:?} may hold only letters, digits, '.', '_' and '-', and may not start with '.'"
        ));
    }
    None
}
