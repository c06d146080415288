//! The control connection's bytes. The dialing server opens it with a
//! `Frame::ControlHello` (the client protocol's frame, so one listener
//! serves both), then sends requests and reads one reply to each, in order.
//! Every message after the hello is `[u32 LE body length][JSON body]`, at
//! most [`CONTROL_MESSAGE_MAX`] bytes of body: control traffic is small,
//! and JSON keeps it readable.

use std::time::Duration;

use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, SnapshotMeta, Vote};
use proto::{Frame, FrameError, FRAME_HEADER_LEN, PROTOCOL_VERSION};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::ControlError;
use crate::machine::{Image, Proposal};
use crate::state::{Response, ServerId};
use crate::TypeConfig;

/// The largest message body a control connection carries; a longer length
/// prefix is refused before anything is allocated.
pub const CONTROL_MESSAGE_MAX: usize = 64 * 1024 * 1024;
/// A hello's body is 10 bytes; anything much longer is not a hello.
const HELLO_BODY_MAX: usize = 64;

/// What one server asks another over a control connection.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Request {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<u64>),
    /// A whole snapshot: the control state is small enough for one message.
    Snapshot {
        vote: Vote<u64>,
        meta: SnapshotMeta<u64, BasicNode>,
        image: Image,
    },
    /// Commit this proposal (sent to the leader).
    Forward(Proposal),
    /// The member `id`, joined in `join_view`, is alive (sent to the leader).
    Heartbeat {
        id: ServerId,
        join_view: u64,
    },
    /// Make `id` at `address` a voter (sent to the leader).
    AddVoter {
        id: ServerId,
        address: String,
    },
    /// Take `id`, gone from the view, out of the voters (sent to the
    /// leader).
    RemoveVoter {
        id: ServerId,
    },
}

/// The answer to a [`Request`] of the same name. Raft errors travel as
/// text: the only ones are "this node is stopping", which the caller treats
/// as unreachable.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Reply {
    AppendEntries(Result<AppendEntriesResponse<u64>, RaftErrorText>),
    Vote(Result<VoteResponse<u64>, RaftErrorText>),
    Snapshot(Result<SnapshotResponse<u64>, RaftErrorText>),
    /// Answers `Forward`, `AddVoter` and `RemoveVoter`.
    Committed(Result<Committed, Refusal>),
    Heartbeat(Result<(), Refusal>),
}

/// A Raft error of the answering node, as its text (openraft's errors do
/// not travel as themselves).
#[derive(Clone, Debug, Serialize, Deserialize, thiserror::Error)]
#[error("{0}")]
pub(crate) struct RaftErrorText(pub String);

impl RaftErrorText {
    pub(crate) fn of(error: impl std::fmt::Display) -> RaftErrorText {
        RaftErrorText(error.to_string())
    }
}

/// A command or membership change the leader has committed and applied.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Committed {
    pub(crate) response: Response,
    /// Its log index: the caller waits for its own state machine to reach
    /// it.
    pub(crate) index: u64,
}

/// Why a server did not do what it was asked.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) enum Refusal {
    /// This server is not the leader; the leader it knows of, if any, with
    /// its address.
    NotLeader { leader: Option<(ServerId, String)> },
    /// It tried and did not finish (for people); asking again may work.
    Failed(String),
    /// It will not do this, however often asked (for people).
    Refused(String),
    /// Its control plane is shutting down.
    Stopped,
}

/// How reading or writing a message failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WireError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("a message of {length} bytes is over the limit of {limit}")]
    TooLarge { length: usize, limit: usize },
    #[error("the connection closed inside a message")]
    Truncated,
    #[error("a message does not parse: {0}")]
    Malformed(#[from] serde_json::Error),
}

/// Decodes a request body as a control connection does, and checks that
/// what decodes encodes back to the same request: the fuzzers' way in.
pub fn check_request(body: &[u8]) -> Result<(), serde_json::Error> {
    let request: Request = serde_json::from_slice(body)?;
    let encoded = serde_json::to_vec(&request).expect("a decoded request encodes");
    let again: Request = serde_json::from_slice(&encoded).expect("an encoded request decodes");
    assert_eq!(
        format!("{request:?}"),
        format!("{again:?}"),
        "control request round trip"
    );
    Ok(())
}

/// Writes one message.
pub(crate) async fn write_message<W, T>(writer: &mut W, message: &T) -> Result<(), WireError>
where
    W: AsyncWrite + Unpin,
    T: Serialize,
{
    let body = serde_json::to_vec(message)?;
    if body.len() > CONTROL_MESSAGE_MAX {
        return Err(WireError::TooLarge {
            length: body.len(),
            limit: CONTROL_MESSAGE_MAX,
        });
    }
    let mut bytes = Vec::with_capacity(4 + body.len());
    bytes.extend_from_slice(&(body.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&body);
    writer.write_all(&bytes).await?;
    writer.flush().await?;
    Ok(())
}

/// Reads one message; `None` when the peer closed the connection between
/// messages. The body buffer grows only as bytes arrive, so a length
/// prefix alone cannot make us allocate.
pub(crate) async fn read_message<R, T>(reader: &mut R, limit: usize) -> Result<Option<T>, WireError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let mut prefix = [0u8; 4];
    let mut filled = 0;
    while filled < prefix.len() {
        let read = reader.read(&mut prefix[filled..]).await?;
        if read == 0 {
            return match filled {
                0 => Ok(None),
                _ => Err(WireError::Truncated),
            };
        }
        filled += read;
    }
    let length = u32::from_le_bytes(prefix) as usize;
    if length > limit {
        return Err(WireError::TooLarge { length, limit });
    }
    let mut body = Vec::new();
    reader.take(length as u64).read_to_end(&mut body).await?;
    if body.len() < length {
        return Err(WireError::Truncated);
    }
    Ok(Some(serde_json::from_slice(&body)?))
}

/// Dials `address` and says hello as server `from`.
pub(crate) async fn dial(
    dialer: &net::Dialer,
    address: &str,
    from: ServerId,
) -> std::io::Result<net::Link> {
    let mut stream = dialer.connect(address).await?;
    let hello = Frame::ControlHello {
        version: PROTOCOL_VERSION,
        from,
    };
    stream.write_all(&hello.to_bytes()).await?;
    stream.flush().await?;
    Ok(stream)
}

/// Reads the `ControlHello` that opens a control connection and returns the
/// dialing server's id. It reads exactly the hello's bytes, so the stream
/// can go on to [`Control::serve`](crate::Control::serve).
pub async fn read_hello<S>(stream: &mut S, timeout: Duration) -> Result<ServerId, ControlError>
where
    S: AsyncRead + Unpin,
{
    let refuse = |detail: String| ControlError::Connection {
        peer: "an incoming control connection".to_string(),
        detail,
    };
    let read = async {
        let mut bytes = vec![0u8; FRAME_HEADER_LEN];
        stream.read_exact(&mut bytes).await?;
        let body_length = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        if body_length > HELLO_BODY_MAX {
            return Ok(Err(FrameError::TooLarge {
                length: body_length,
                limit: HELLO_BODY_MAX,
            }));
        }
        bytes.resize(FRAME_HEADER_LEN + body_length, 0);
        stream.read_exact(&mut bytes[FRAME_HEADER_LEN..]).await?;
        Ok::<_, std::io::Error>(Frame::decode(&bytes, HELLO_BODY_MAX))
    };
    let decoded = match tokio::time::timeout(timeout, read).await {
        Err(_) => {
            return Err(refuse(format!(
                "no hello within {} ms",
                timeout.as_millis()
            )))
        }
        Ok(Err(error)) => return Err(refuse(format!("reading the hello: {error}"))),
        Ok(Ok(decoded)) => decoded,
    };
    match decoded {
        Ok(Some((Frame::ControlHello { version, from }, _))) if version == PROTOCOL_VERSION => {
            Ok(from)
        }
        Ok(Some((Frame::ControlHello { version, from }, _))) => Err(refuse(format!(
            "server {from} speaks protocol version {version}; this server speaks {PROTOCOL_VERSION}"
        ))),
        Ok(Some(_)) => Err(refuse("the first frame is not a ControlHello".to_string())),
        Ok(None) => Err(refuse("the hello is incomplete".to_string())),
        Err(error) => Err(refuse(format!("the hello does not decode: {error}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_message_reads_back() {
        let mut bytes = Vec::new();
        write_message(
            &mut bytes,
            &Request::Heartbeat {
                id: 3,
                join_view: 7,
            },
        )
        .await
        .expect("write");
        let mut reader = &bytes[..];
        let request: Request = read_message(&mut reader, CONTROL_MESSAGE_MAX)
            .await
            .expect("read")
            .expect("a message");
        assert!(matches!(
            request,
            Request::Heartbeat {
                id: 3,
                join_view: 7
            }
        ));
        let end: Option<Request> = read_message(&mut reader, CONTROL_MESSAGE_MAX)
            .await
            .expect("read");
        assert!(end.is_none());
    }

    #[tokio::test]
    async fn an_oversized_length_is_refused_before_reading_the_body() {
        let bytes = u32::MAX.to_le_bytes();
        let mut reader = &bytes[..];
        let result: Result<Option<Request>, _> = read_message(&mut reader, 1024).await;
        assert!(matches!(result, Err(WireError::TooLarge { .. })));
    }

    #[tokio::test]
    async fn garbage_and_cut_messages_are_errors() {
        let mut bytes = 5u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"{oops");
        let mut reader = &bytes[..];
        let result: Result<Option<Request>, _> = read_message(&mut reader, 1024).await;
        assert!(matches!(result, Err(WireError::Malformed(_))));
        let mut reader = &bytes[..6];
        let result: Result<Option<Request>, _> = read_message(&mut reader, 1024).await;
        assert!(matches!(result, Err(WireError::Truncated)));
    }

    #[tokio::test]
    async fn a_hello_is_read_exactly() {
        let mut bytes = Frame::ControlHello {
            version: PROTOCOL_VERSION,
            from: 9,
        }
        .to_bytes();
        bytes.extend_from_slice(b"rest");
        let mut reader = &bytes[..];
        let from = read_hello(&mut reader, Duration::from_secs(1))
            .await
            .expect("hello");
        assert_eq!(from, 9);
        assert_eq!(reader, b"rest");
    }

    #[tokio::test]
    async fn a_client_hello_is_not_a_control_hello() {
        let bytes = [5u8, 0, 0, 0, 0x10, 1, 2, 3, 4, 5];
        let mut reader = &bytes[..];
        assert!(read_hello(&mut reader, Duration::from_secs(1))
            .await
            .is_err());
        let huge = [0xffu8, 0xff, 0xff, 0xff, 0x10];
        let mut reader = &huge[..];
        assert!(read_hello(&mut reader, Duration::from_secs(1))
            .await
            .is_err());
    }
}
