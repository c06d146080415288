//! One server connection kept up: the handshake ([`connect`]) and the
//! loop that serves a connection, and when it breaks connects again with
//! doubling delays ([`keep_connected`]). The client's control connection
//! (`driver.rs`) and each server link the publishers share
//! (`publisher/links.rs`) are a [`Session`] over this one loop.

use std::time::Duration;

use net::{LinkReader, LinkWriter};
use proto::{ErrorCode, Frame, FrameBuffer, PROTOCOL_VERSION};
use tokio::io::AsyncWriteExt;

use crate::config::ClientConfig;
use crate::error::ClientError;

/// Bytes a connection reads at a time.
pub(crate) const READ_BYTES: usize = 64 * 1024;
/// The handshake's answer is a short frame; this bounds it.
const HANDSHAKE_FRAME_BYTES_MAX: usize = 1 << 20;

pub(crate) struct Connection {
    pub(crate) reader: LinkReader,
    pub(crate) writer: LinkWriter,
    pub(crate) buffer: FrameBuffer,
    pub(crate) max_frame: usize,
}

/// Connects to the configured server and runs the handshake.
pub(crate) async fn connect(
    config: &ClientConfig,
    client_id: u128,
) -> Result<Connection, ClientError> {
    connect_to(&config.address, config, client_id).await
}

/// Connects to `address` and runs the handshake.
async fn connect_to(
    address: &str,
    config: &ClientConfig,
    client_id: u128,
) -> Result<Connection, ClientError> {
    let failure = |reason: String| ClientError::Connect {
        address: address.to_string(),
        reason,
    };
    let attempt = async {
        let socket = config
            .credentials
            .dialer
            .connect(address)
            .await
            .map_err(|e| failure(e.to_string()))?;
        let (mut reader, mut writer) = socket.into_split();
        let hello = Frame::Hello {
            version: PROTOCOL_VERSION,
            client: client_id,
            token: config.credentials.token.clone(),
        };
        writer
            .write_all(&hello.to_bytes())
            .await
            .map_err(|e| failure(e.to_string()))?;
        writer.flush().await.map_err(|e| failure(e.to_string()))?;
        let mut buffer = FrameBuffer::new();
        loop {
            match buffer
                .next_frame(HANDSHAKE_FRAME_BYTES_MAX)
                .map_err(|e| failure(e.to_string()))?
            {
                Some(Frame::HelloOk { max_frame, .. }) => {
                    return Ok(Connection {
                        reader,
                        writer,
                        buffer,
                        max_frame: max_frame as usize,
                    })
                }
                Some(Frame::Error { code, message, .. }) => {
                    return Err(refusal(address, code, message))
                }
                Some(other) => {
                    return Err(failure(format!("unexpected handshake answer {other:?}")))
                }
                None => {}
            }
            let count = net::read_into(&mut reader, buffer.receiving(), READ_BYTES)
                .await
                .map_err(|e| failure(e.to_string()))?;
            if count == 0 {
                return Err(failure(
                    "the server closed the connection during the handshake".into(),
                ));
            }
        }
    };
    tokio::time::timeout(config.connect_timeout, attempt)
        .await
        .map_err(|_| failure(format!("no answer within {:?}", config.connect_timeout)))?
}

/// The error for a handshake the server refused: a refused token is not
/// fixed by connecting again, so it is the server's answer; anything else
/// is a failure to connect.
fn refusal(address: &str, code: ErrorCode, message: String) -> ClientError {
    if code == ErrorCode::Unauthorized {
        let message = format!("{address}: {message}");
        return ClientError::Server { code, message };
    }
    ClientError::Connect {
        address: address.to_string(),
        reason: message,
    }
}

/// How a served connection ended.
pub(crate) enum Ended {
    /// The connection broke: connect again.
    Broken,
    /// The owner is done with the link: stop.
    Closed,
}

/// What runs over a kept connection.
pub(crate) trait Session {
    /// Serves `connection` until it breaks or the owner is done.
    async fn serve(&mut self, connection: Connection) -> Ended;
    /// While no connection is up: waits for the owner (taking what it asks
    /// meanwhile); `false` once the owner is gone.
    async fn wait(&mut self) -> bool;
    /// A connection broke, or an attempt to connect failed: the link is
    /// down.
    fn down(&mut self);
    /// Where attempt `attempt` (from 0) after a break connects: `None`,
    /// the configured server every time.
    fn address(&self, attempt: u64) -> Option<String> {
        let _ = attempt;
        None
    }
}

/// Serves `first` (when given) and every connection after it, connecting
/// again at once when one breaks and then with delays doubling from
/// `reconnect_delay_min` to `reconnect_delay_max`, until the session's
/// owner is gone.
pub(crate) async fn keep_connected(
    config: &ClientConfig,
    client: u128,
    first: Option<Connection>,
    session: &mut impl Session,
) {
    let mut connection = first;
    loop {
        let current = match connection.take() {
            Some(current) => current,
            None => match reconnect(config, client, session).await {
                Some(current) => current,
                None => return,
            },
        };
        if let Ended::Closed = session.serve(current).await {
            return;
        }
        session.down();
    }
}

/// Connects, with doubling delays between failed attempts; `None` once
/// the session's owner is gone.
async fn reconnect(
    config: &ClientConfig,
    client: u128,
    session: &mut impl Session,
) -> Option<Connection> {
    let mut delay = config.reconnect_delay_min;
    for attempts in 0.. {
        let address = session
            .address(attempts)
            .unwrap_or_else(|| config.address.clone());
        let attempt = connect_to(&address, config, client);
        tokio::pin!(attempt);
        let connected = loop {
            tokio::select! {
                connected = &mut attempt => break connected,
                alive = session.wait() => if !alive { return None },
            }
        };
        if let Ok(connection) = connected {
            return Some(connection);
        }
        session.down();
        if !pause(delay, session).await {
            return None;
        }
        delay = (delay * 2).min(config.reconnect_delay_max);
    }
    None
}

/// Sleeps for `delay` while the session waits; `false` once its owner is
/// gone.
async fn pause(delay: Duration, session: &mut impl Session) -> bool {
    let sleep = tokio::time::sleep(delay);
    tokio::pin!(sleep);
    loop {
        tokio::select! {
            _ = &mut sleep => return true,
            alive = session.wait() => if !alive { return false },
        }
    }
}
