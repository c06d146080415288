//! The admin port's own client: one HTTP/1.1 `GET` over a fresh
//! connection, for the tools that read an admin port from Rust (`stamplog
//! bench metrics`, the tests). Operators use curl, a browser or
//! Prometheus.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The most an answer may hold: `/metrics` of a server with thousands of
/// streams is a few MiB.
const ANSWER_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// `GET path` from the admin port at `address`: the status code and the
/// body (a chunked body is joined). Fails past `timeout` or on an answer
/// that is not HTTP.
pub async fn get(
    address: SocketAddr,
    path: &str,
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let exchange = async {
        let mut socket = tokio::net::TcpStream::connect(address).await?;
        let request =
            format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        socket.write_all(request.as_bytes()).await?;
        let mut answer = Vec::new();
        socket
            .take(ANSWER_BYTES_MAX)
            .read_to_end(&mut answer)
            .await?;
        Ok::<_, std::io::Error>(answer)
    };
    let answer = tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| invalid(format!("no answer from {address}{path} within {timeout:?}")))??;
    parse(&answer).ok_or_else(|| invalid(format!("{address}{path} did not answer in HTTP/1.1")))
}

fn invalid(message: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message)
}

/// The status code and body of a whole HTTP/1.1 answer.
fn parse(answer: &[u8]) -> Option<(u16, String)> {
    let answer = std::str::from_utf8(answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        unchunk(body)?
    } else {
        body.to_string()
    };
    Some((status, body))
}

/// The body of a chunked answer.
fn unchunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn plain_and_chunked_answers_are_read_and_junk_is_refused() {
        let plain = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nready";
        assert_eq!(parse(plain), Some((200, "ready".to_string())));
        let chunked = b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nnot \r\n5\r\nready\r\n0\r\n\r\n";
        assert_eq!(parse(chunked), Some((503, "not ready".to_string())));
        assert_eq!(
            parse(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            None
        );
        assert_eq!(parse(b"garbage"), None);
    }
}
