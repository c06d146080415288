//! The least the `one-hop-ack-client` flow can cost on this machine: its
//! three hops and its three write + fdatasync, with nothing else.
//!
//! A client thread sends a record to a primary thread over loopback TCP.
//! The primary forwards it to two replica threads, then writes and
//! fdatasyncs it into a preallocated file of its own and acks the client;
//! each replica does the same with what it received. The client is done
//! when all three acks are in. Every thread blocks in its read, so each
//! hop costs one wake-up, as few as any implementation of the flow can
//! have, and the three syncs run at once, as the three replicas' do. So
//! the service's window-1 ack over this one says what the service adds,
//! and this one over one fdatasync says what the flow itself costs on
//! this disk and these cores. Each server's file has its inode in a
//! block of the inode table of its own (`SyncProbe::replicas`), as the
//! replicas' files on their own hosts: neighbours written at once would
//! share the inode writes that follow the clock's ticks.
//!
//! [`RuntimeFlowFloor`] is the same flow on tokio runtimes, the way the
//! service runs it: each server a task on a runtime of its own (the one a
//! `stamplog server` starts), reading through the runtime's I/O driver
//! and writing and fdatasyncing on its worker, and the client's
//! connections on the caller's runtime. Over the blocking floor it says what the runtime
//! itself costs the flow; the service's ack over it, what the service's
//! own work (its protocol, frames and logs) adds.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fdatasync::SyncProbe;

/// Bytes of one ack.
const ACK_BYTES: usize = 8;

/// The flow's four threads, ready to time one record at a time.
pub struct FlowFloor {
    to_primary: TcpStream,
    /// One connection from each server, the primary's first.
    acks: Vec<TcpStream>,
    record: Vec<u8>,
    servers: Vec<JoinHandle<anyhow::Result<SyncProbe>>>,
}

impl FlowFloor {
    /// Starts the three servers, each with a file in `folder` preallocated
    /// for `samples` records of `size` bytes and shaped like a log's tail
    /// segment (`fdatasync::tail_segment_bytes`).
    pub fn start(folder: &Path, size: usize, samples: usize) -> anyhow::Result<FlowFloor> {
        let wiring = wire()?;
        let servers = wiring
            .servers
            .into_iter()
            .zip(server_files(folder, 0, size, samples)?)
            .map(|(links, probe)| {
                Ok(std::thread::spawn(move || {
                    serve(links.input, links.forwards, probe, links.ack, size)
                }))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(FlowFloor {
            to_primary: wiring.to_primary,
            acks: wiring.acks,
            record: record(size),
            servers,
        })
    }

    /// Sends one record and waits for the three acks; returns the time in
    /// microseconds.
    pub fn sample(&mut self) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.to_primary
            .write_all(&self.record)
            .context("the floor's primary is gone")?;
        let mut ack = [0u8; ACK_BYTES];
        for link in &mut self.acks {
            link.read_exact(&mut ack)
                .context("a server of the floor is gone")?;
        }
        Ok(started.elapsed().as_secs_f64() * 1e6)
    }

    /// Stops the servers (the primary sees the end of its input, and the
    /// replicas the end of theirs) and removes their files.
    pub fn finish(self) -> anyhow::Result<()> {
        drop(self.to_primary);
        drop(self.acks);
        for server in self.servers {
            let probe = server
                .join()
                .map_err(|_| anyhow::anyhow!("a server of the floor panicked"))??;
            probe.finish()?;
        }
        Ok(())
    }
}

/// One server: each record read is forwarded, written and synced, then
/// acknowledged, until the input ends.
fn serve(
    mut input: TcpStream,
    mut forwards: Vec<TcpStream>,
    mut probe: SyncProbe,
    mut ack: TcpStream,
    size: usize,
) -> anyhow::Result<SyncProbe> {
    let mut record = vec![0u8; size];
    loop {
        match input.read_exact(&mut record) {
            Ok(()) => {}
            Err(error) if error.kind() == ErrorKind::UnexpectedEof => return Ok(probe),
            Err(error) => return Err(error).context("a floor server's input broke"),
        }
        for forward in &mut forwards {
            forward
                .write_all(&record)
                .context("a floor replica is gone")?;
        }
        // The probe writes a record of the same size as the one received.
        probe.sample()?;
        ack.write_all(&[0u8; ACK_BYTES])
            .context("the floor's client is gone")?;
    }
}

/// The flow's floor on tokio runtimes (see the module's notes).
pub struct RuntimeFlowFloor {
    to_primary: tokio::net::TcpStream,
    /// One connection from each server, the primary's first.
    acks: Vec<tokio::net::TcpStream>,
    record: Vec<u8>,
    /// Each server's runtime and task.
    servers: Vec<(
        tokio::runtime::Runtime,
        tokio::task::JoinHandle<anyhow::Result<SyncProbe>>,
    )>,
}

impl RuntimeFlowFloor {
    /// Starts the three servers, each on a runtime of its own with a file
    /// in `folder` preallocated for `samples` records of `size` bytes and
    /// shaped like a log's tail segment (`fdatasync::tail_segment_bytes`).
    /// Called on the client's runtime, which its connections join.
    pub fn start(folder: &Path, size: usize, samples: usize) -> anyhow::Result<RuntimeFlowFloor> {
        let wiring = wire()?;
        let servers = wiring
            .servers
            .into_iter()
            // Files of their own beside the blocking floor's.
            .zip(server_files(folder, 3, size, samples)?)
            .map(|(links, probe)| serve_on_runtime(links, probe, size))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(RuntimeFlowFloor {
            to_primary: on_runtime(wiring.to_primary)?,
            acks: wiring
                .acks
                .into_iter()
                .map(on_runtime)
                .collect::<anyhow::Result<Vec<_>>>()?,
            record: record(size),
            servers,
        })
    }

    /// Sends one record and waits for the three acks; returns the time in
    /// microseconds.
    pub async fn sample(&mut self) -> anyhow::Result<f64> {
        let started = Instant::now();
        self.to_primary
            .write_all(&self.record)
            .await
            .context("the runtime floor's primary is gone")?;
        let mut ack = [0u8; ACK_BYTES];
        for link in &mut self.acks {
            link.read_exact(&mut ack)
                .await
                .context("a server of the runtime floor is gone")?;
        }
        Ok(started.elapsed().as_secs_f64() * 1e6)
    }

    /// Stops the servers and their runtimes and removes their files.
    /// Blocking: not on a runtime's worker (a runtime is not dropped
    /// there).
    pub fn finish(mut self) -> anyhow::Result<()> {
        // The servers see the end of their input.
        self.acks.clear();
        let servers = std::mem::take(&mut self.servers);
        drop(self);
        for (runtime, server) in servers {
            let probe = runtime
                .block_on(server)
                .map_err(|_| anyhow::anyhow!("a server of the runtime floor panicked"))??;
            drop(runtime);
            probe.finish()?;
        }
        Ok(())
    }
}

impl Drop for RuntimeFlowFloor {
    /// A floor left without `finish` (a sample failed, the caller is on a
    /// runtime): its runtimes stop without waiting for their servers, as
    /// a runtime may not be dropped where it would block.
    fn drop(&mut self) {
        for (runtime, _) in self.servers.drain(..) {
            runtime.shutdown_background();
        }
    }
}

/// A blocking socket as one of the current runtime's.
fn on_runtime(stream: TcpStream) -> anyhow::Result<tokio::net::TcpStream> {
    stream.set_nonblocking(true)?;
    tokio::net::TcpStream::from_std(stream).context("cannot register a socket with the runtime")
}

/// Starts a runtime as a server's (`Runtime::new`, as `stamplog server`
/// does) and the server's task on it.
fn serve_on_runtime(
    links: ServerLinks,
    probe: SyncProbe,
    size: usize,
) -> anyhow::Result<(
    tokio::runtime::Runtime,
    tokio::task::JoinHandle<anyhow::Result<SyncProbe>>,
)> {
    let runtime = tokio::runtime::Runtime::new().context("cannot start a runtime")?;
    let task = {
        let _entered = runtime.enter();
        let input = on_runtime(links.input)?;
        let forwards = links
            .forwards
            .into_iter()
            .map(on_runtime)
            .collect::<anyhow::Result<Vec<_>>>()?;
        let ack = on_runtime(links.ack)?;
        runtime.spawn(serve_async(input, forwards, probe, ack, size))
    };
    Ok((runtime, task))
}

/// `serve` as a task: reads wait on the runtime's I/O driver, and the
/// write + fdatasync blocks the worker, as a record written in place
/// does in the service.
async fn serve_async(
    mut input: tokio::net::TcpStream,
    mut forwards: Vec<tokio::net::TcpStream>,
    mut probe: SyncProbe,
    mut ack: tokio::net::TcpStream,
    size: usize,
) -> anyhow::Result<SyncProbe> {
    let mut record = vec![0u8; size];
    loop {
        match input.read_exact(&mut record).await {
            Ok(_) => {}
            Err(error) if error.kind() == ErrorKind::UnexpectedEof => return Ok(probe),
            Err(error) => return Err(error).context("a runtime floor server's input broke"),
        }
        for forward in &mut forwards {
            forward
                .write_all(&record)
                .await
                .context("a runtime floor replica is gone")?;
        }
        probe.sample()?;
        ack.write_all(&[0u8; ACK_BYTES])
            .await
            .context("the runtime floor's client is gone")?;
    }
}

/// The flow's connections on loopback, before any server runs.
struct Wiring {
    to_primary: TcpStream,
    /// The client's end of one connection from each server, the
    /// primary's first.
    acks: Vec<TcpStream>,
    /// The replicas' first, then the primary's.
    servers: Vec<ServerLinks>,
}

/// One server's connections: what it reads, where it forwards, where it
/// acks.
struct ServerLinks {
    input: TcpStream,
    forwards: Vec<TcpStream>,
    ack: TcpStream,
}

fn wire() -> anyhow::Result<Wiring> {
    let ack_listener = listen()?;
    let ack_address = ack_listener.local_addr()?;
    let mut acks = Vec::new();
    let mut ack_link = || -> anyhow::Result<TcpStream> {
        let sender = connect(ack_address)?;
        acks.push(accept(&ack_listener)?);
        Ok(sender)
    };
    let primary_ack = ack_link()?;
    let mut forwards = Vec::new();
    let mut servers = Vec::new();
    for _replica in 0..2 {
        let listener = listen()?;
        forwards.push(connect(listener.local_addr()?)?);
        let input = accept(&listener)?;
        let ack = ack_link()?;
        servers.push(ServerLinks {
            input,
            forwards: Vec::new(),
            ack,
        });
    }
    let listener = listen()?;
    let to_primary = connect(listener.local_addr()?)?;
    let input = accept(&listener)?;
    servers.push(ServerLinks {
        input,
        forwards,
        ack: primary_ack,
    });
    Ok(Wiring {
        to_primary,
        acks,
        servers,
    })
}

/// The record every sample sends.
fn record(size: usize) -> Vec<u8> {
    (0..size).map(|index| (index % 251) as u8).collect()
}

/// The three servers' files, in the order of `Wiring::servers`, numbered
/// from `first`: each with its inode in a block of its own, as replicas'
/// files on their own hosts (`SyncProbe::replicas`).
fn server_files(
    folder: &Path,
    first: usize,
    size: usize,
    samples: usize,
) -> anyhow::Result<Vec<SyncProbe>> {
    let names: Vec<String> = (0..3)
        .map(|server| format!("floor-{}-{size}", first + server))
        .collect();
    SyncProbe::replicas(folder, &names, size, samples)
}

fn listen() -> anyhow::Result<TcpListener> {
    TcpListener::bind("127.0.0.1:0").context("cannot listen on loopback")
}

fn connect(address: SocketAddr) -> anyhow::Result<TcpStream> {
    let stream =
        TcpStream::connect(address).with_context(|| format!("cannot connect to {address}"))?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

fn accept(listener: &TcpListener) -> anyhow::Result<TcpStream> {
    let (stream, _) = listener.accept().context("cannot accept on loopback")?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sample took some time, and less than ten seconds.
    fn assert_timed(latency: f64) {
        assert!(latency > 0.0 && latency < 10e6, "{latency}");
    }

    fn assert_removed(folder: &Path) {
        let left: Vec<_> = std::fs::read_dir(folder).unwrap().collect();
        assert!(left.is_empty(), "the servers' files are removed");
    }

    #[test]
    fn the_floor_times_each_record_through_three_servers_and_cleans_up() {
        let folder = tempfile::tempdir().unwrap();
        let mut floor = FlowFloor::start(folder.path(), 1000, 20).unwrap();
        for _ in 0..20 {
            assert_timed(floor.sample().unwrap());
        }
        floor.finish().unwrap();
        assert_removed(folder.path());
    }

    #[test]
    fn the_runtime_floor_times_each_record_through_three_server_runtimes_and_cleans_up() {
        let folder = tempfile::tempdir().unwrap();
        let client = tokio::runtime::Runtime::new().unwrap();
        let mut floor = {
            let _entered = client.enter();
            RuntimeFlowFloor::start(folder.path(), 1000, 20).unwrap()
        };
        for _ in 0..20 {
            assert_timed(client.block_on(floor.sample()).unwrap());
        }
        floor.finish().unwrap();
        assert_removed(folder.path());
    }

    #[test]
    fn a_runtime_floor_dropped_on_a_runtime_stops_without_panicking() {
        let folder = tempfile::tempdir().unwrap();
        let client = tokio::runtime::Runtime::new().unwrap();
        client.block_on(async {
            let mut floor = RuntimeFlowFloor::start(folder.path(), 100, 4).unwrap();
            floor.sample().await.unwrap();
            // As on an error path inside the bench: dropped, not finished.
            drop(floor);
        });
    }
}
