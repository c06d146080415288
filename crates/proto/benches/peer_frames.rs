//! What a peer link's reader pays to cut `Peer` frames out of what it
//! read: decoded with their message copied out of the buffer
//! (`FrameBuffer::next_frame`, the way before) against cut as slices of
//! it (`FrameBuffer::next_peer`, what servers do), for messages of
//! 100 B, 1 KB and 10 KB, each read 64 KiB of frames as a socket read
//! gives them.
//!
//! `cargo bench -p proto --bench peer_frames`

// A bench stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use proto::{Frame, FrameBuffer, PeerCut};

/// Bytes of frames per read, as the servers' peer readers ask for.
const READ_BYTES: usize = 64 * 1024;

/// One read's worth of `Peer` frames with `message_bytes` each.
fn one_read(message_bytes: usize) -> (Vec<u8>, u64) {
    let mut wire = Vec::new();
    let mut frames = 0;
    while wire.len() < READ_BYTES {
        Frame::Peer {
            stream: frames % 100,
            message: vec![7; message_bytes],
        }
        .encode(&mut wire);
        frames += 1;
    }
    (wire, frames)
}

fn cut_peer_frames(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("peer_frames");
    for message_bytes in [100, 1_000, 10_000] {
        let (wire, frames) = one_read(message_bytes);
        group.throughput(Throughput::Elements(frames));
        let mut buffer = FrameBuffer::new();
        group.bench_with_input(
            BenchmarkId::new("copied", message_bytes),
            &wire,
            |bench, wire| {
                bench.iter(|| {
                    buffer.receiving().extend_from_slice(wire);
                    let mut kept = Vec::with_capacity(frames as usize);
                    while let Some(Frame::Peer { message, .. }) =
                        buffer.next_frame(1 << 20).unwrap()
                    {
                        kept.push(bytes::Bytes::from(message));
                    }
                    assert_eq!(kept.len() as u64, frames);
                    kept
                })
            },
        );
        let mut buffer = FrameBuffer::new();
        group.bench_with_input(
            BenchmarkId::new("sliced", message_bytes),
            &wire,
            |bench, wire| {
                bench.iter(|| {
                    buffer.receiving().extend_from_slice(wire);
                    let mut kept = Vec::with_capacity(frames as usize);
                    while let Some(PeerCut::Peer { message, .. }) =
                        buffer.next_peer(1 << 20).unwrap()
                    {
                        kept.push(message);
                    }
                    assert_eq!(kept.len() as u64, frames);
                    kept
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, cut_peer_frames);
criterion_main!(benches);
