//! The Rust client library of stamplog.
//!
//! A [`Client`] holds a control connection to one server of the cluster:
//! it creates, lists and opens streams, reads them, and reports status. A
//! [`Publisher`] sends messages to one stream whatever its replication
//! protocol: it connects to every replica, runs the client side of the
//! protocol, and keeps each message until the protocol's ack rule is met,
//! resending it with the same event id after a timeout, so a message that
//! had landed is answered with its original version and the `duplicate`
//! flag instead of being logged twice (seed 000's application-level
//! reliable messaging: the sender keeps a copy until the explicit
//! acknowledgement).
//!
//! ```no_run
//! use client::{Client, ClientConfig, DurabilityConfig, Protocol, Publisher, PublisherConfig};
//!
//! # async fn example() -> Result<(), client::ClientError> {
//! let client = Client::connect(ClientConfig::new("127.0.0.1:7400")).await?;
//! // Three replicas; the default protocol: the primary stamps and
//! // forwards, every replica acks the client.
//! let stream = client
//!     .create_stream_with("orders", DurabilityConfig::Sync, Protocol::OneHopAckClient, 3)
//!     .await?;
//! let publisher = Publisher::connect(&stream, PublisherConfig::default()).await?;
//! // One message, waiting until every replica has it on disk:
//! let done = publisher.send(b"order-1", b"two apples").await?;
//! println!("version {} acked by {:?}", done.version, done.acks);
//! // Many in flight: submit returns once the message is sent; the answer
//! // comes later.
//! let mut pending = Vec::new();
//! for number in 0..1000u32 {
//!     pending.push(publisher.submit(b"", &number.to_le_bytes()).await?);
//! }
//! for answer in pending {
//!     answer.await?;
//! }
//! // Read everything from version 1 on, in order, each once, from the
//! // server this client is connected to (any replica will do).
//! let mut subscription = client.subscribe(stream.id, 1).await?;
//! while let Some(record) = subscription.next().await {
//!     let record = record?;
//!     println!("{} -> {} bytes", record.version, record.payload.len());
//! #   break;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A client writing many streams makes its publishers over one
//! [`PublisherLinks`] (`Publisher::connect_over`): they share one
//! connection per server, so a server's acks for all of them come back in
//! one read, and their messages leave in shared writes, instead of a
//! connection per publisher and replica.
//!
//! [`Producer`] is the single-server path (`Append`), answered by the
//! primary alone; the server accepts it only on streams whose ack rule the
//! primary's answer meets (one replica, or `one-hop`, `server-sync`,
//! `server-async`). The logging experiment uses it for its echo replies.

mod client;
mod command;
mod config;
mod driver;
mod error;
mod inner;
mod link;
mod producer;
mod publisher;
mod subscription;

pub use client::Client;
pub use command::{Ack, ReceivedRecord};
pub use config::{ClientConfig, Credentials, LossAction, StreamOptions};
pub use engine::replication::{HybridMode, Protocol};
pub use error::ClientError;
pub use producer::{PendingAck, Producer};
pub use proto::{AckLevel, DurabilityConfig, ErrorCode, EventId, RetentionConfig, StreamInfo};
pub use publisher::{
    PendingPublish, Published, Publisher, PublisherConfig, PublisherLinks, PUBLISHER_WINDOW_MAX,
};
pub use subscription::Subscription;
