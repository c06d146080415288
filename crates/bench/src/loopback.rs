//! The loopback's own limit, measured beside the experiments' figures: how
//! many bytes per second TCP over 127.0.0.1 carries on this machine, with
//! `connections` connections at once (one per hop a message makes), each
//! writer sending `record_bytes` records in writes of up to
//! [`WRITE_BYTES_MAX`] and each reader reading into a buffer of as much,
//! as a busy server link does. Nothing of stamplog runs: it is the floor
//! under every replicated figure, as the disk's limit is.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use anyhow::Context;

/// Bytes of one write (and one read): what a busy connection's flusher
/// gathers in one batch.
pub const WRITE_BYTES_MAX: usize = 64 * 1024;

/// What the loopback carried.
#[derive(Clone, Debug)]
pub struct LoopbackLimit {
    pub connections: usize,
    pub record_bytes: usize,
    /// Bytes each connection carried.
    pub bytes_per_connection: usize,
    pub seconds: f64,
    /// All connections' bytes per second.
    pub bytes_per_second: f64,
}

impl LoopbackLimit {
    /// Records per second through all connections together divided by
    /// the hops each message makes (one connection each): the messages
    /// per second the loopback alone allows a flow of that many hops.
    pub fn messages_per_second(&self) -> f64 {
        self.bytes_per_second / (self.record_bytes * self.connections) as f64
    }
}

/// Sends `bytes_per_connection` bytes of `record_bytes` records through
/// each of `connections` loopback connections at once.
pub fn measure(
    connections: usize,
    record_bytes: usize,
    bytes_per_connection: usize,
) -> anyhow::Result<LoopbackLimit> {
    anyhow::ensure!(connections > 0 && record_bytes > 0, "nothing to send");
    let records_per_write = (WRITE_BYTES_MAX / record_bytes).max(1);
    let write = vec![0x5a_u8; records_per_write * record_bytes];
    let writes = bytes_per_connection.div_ceil(write.len()).max(1);
    let mut pairs = Vec::with_capacity(connections);
    for _ in 0..connections {
        pairs.push(connected_pair()?);
    }
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut running = Vec::new();
        for (mut sender, mut receiver) in pairs {
            let write = &write;
            running.push(scope.spawn(move || -> std::io::Result<()> {
                for _ in 0..writes {
                    sender.write_all(write)?;
                }
                Ok(())
            }));
            running.push(scope.spawn(move || -> std::io::Result<()> {
                let mut buffer = vec![0u8; WRITE_BYTES_MAX];
                let mut left = writes * write.len();
                while left > 0 {
                    let read = receiver.read(&mut buffer)?;
                    if read == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    left -= read.min(left);
                }
                Ok(())
            }));
        }
        for thread in running {
            thread
                .join()
                .map_err(|_| anyhow::anyhow!("a loopback thread panicked"))?
                .context("the loopback transfer failed")?;
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let carried = writes * write.len();
    Ok(LoopbackLimit {
        connections,
        record_bytes,
        bytes_per_connection: carried,
        seconds,
        bytes_per_second: (carried * connections) as f64 / seconds,
    })
}

/// A connected pair of loopback sockets, with no delay on sends.
fn connected_pair() -> anyhow::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    let sender = TcpStream::connect(listener.local_addr()?).context("connecting on loopback")?;
    let (receiver, _) = listener.accept().context("accepting on loopback")?;
    sender.set_nodelay(true)?;
    Ok((sender, receiver))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_arrives_and_the_rate_is_counted_per_hop() {
        let limit = measure(3, 1000, 1_000_000).unwrap();
        assert_eq!(limit.connections, 3);
        assert!(limit.bytes_per_connection >= 1_000_000);
        assert!(limit.bytes_per_second > 0.0);
        let per_message = limit.bytes_per_second / limit.messages_per_second();
        assert!((per_message - 3000.0).abs() < 1e-6, "{per_message}");
    }
}
