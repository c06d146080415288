//! What a reader pays to cut the frames that carry records out of what it
//! read: decoded with their bytes copied out of the read
//! (`Frame::decode`, the way before) against cut off the read as slices of
//! it (`FrameBuffer::next_frame`, what servers do). A peer link's `Peer`
//! frames and a client's `Submit`s, with messages of 100 B, 1 KB and
//! 10 KB, each read 64 KiB of frames as a socket read gives them.
//!
//! `cargo bench -p proto --bench cut_frames`

// A bench stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use proto::frame::sample_fields;
use proto::{Frame, FrameBuffer};

/// Bytes of frames per read, as the servers' readers ask for.
const READ_BYTES: usize = 64 * 1024;

/// One read's worth of frames of `kind` with `message_bytes` each.
fn one_read(kind: &str, message_bytes: usize) -> (Vec<u8>, usize) {
    let mut wire = Vec::new();
    let mut frames = 0;
    while wire.len() < READ_BYTES {
        let message = Bytes::from(vec![7; message_bytes]);
        let frame = match kind {
            "peer" => Frame::Peer {
                stream: frames % 100,
                message,
            },
            _ => Frame::Submit {
                fields: sample_fields(),
                key: Bytes::new(),
                payload: message,
            },
        };
        frame.encode(&mut wire);
        frames += 1;
    }
    (wire, frames as usize)
}

fn cut_frames(criterion: &mut Criterion) {
    let mut group = criterion.benchmark_group("frames_cut");
    for kind in ["peer", "submit"] {
        for message_bytes in [100, 1_000, 10_000] {
            let (wire, frames) = one_read(kind, message_bytes);
            group.throughput(Throughput::Elements(frames as u64));
            let mut read: Vec<u8> = Vec::with_capacity(READ_BYTES * 2);
            let id = format!("{kind}/copied");
            group.bench_with_input(BenchmarkId::new(id, message_bytes), &wire, |bench, wire| {
                bench.iter(|| {
                    read.clear();
                    read.extend_from_slice(wire);
                    let mut kept = Vec::with_capacity(frames);
                    let mut at = 0;
                    while let Some((frame, used)) = Frame::decode(&read[at..], 1 << 20).unwrap() {
                        kept.push(frame);
                        at += used;
                    }
                    assert_eq!(kept.len(), frames);
                    kept
                })
            });
            let mut buffer = FrameBuffer::new();
            let id = format!("{kind}/sliced");
            group.bench_with_input(BenchmarkId::new(id, message_bytes), &wire, |bench, wire| {
                bench.iter(|| {
                    buffer.receiving().extend_from_slice(wire);
                    let mut kept = Vec::with_capacity(frames);
                    while let Some(frame) = buffer.next_frame(1 << 20).unwrap() {
                        kept.push(frame);
                    }
                    assert_eq!(kept.len(), frames);
                    kept
                })
            });
        }
    }
    group.finish();
}

criterion_group!(benches, cut_frames);
criterion_main!(benches);
