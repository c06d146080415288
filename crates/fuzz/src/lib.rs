//! The fuzz targets: everything a server reads, each as a function of
//! arbitrary bytes that must never panic, hang or leave the server unable
//! to serve. The same functions run two ways: under libFuzzer with
//! coverage guidance (`fuzz/`, `cargo +nightly fuzz run <target>`, the
//! long run) and under [`mutate`]'s seeded mutations of the checked-in
//! corpus on the stable toolchain (`tests/it/main.rs`, the short run in
//! CI). `docs/security.md` says how to run each.

mod disk;
mod live;
mod mutate;

pub use disk::{journal, log_files};
pub use live::{server_session, LiveServer};
pub use mutate::Mutator;

use std::path::Path;

use proto::{Frame, FrameBuffer, Record};

/// A fuzz target: a name (the corpus folder and the cargo-fuzz target)
/// and the function that reads the bytes.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]),
    /// Valid inputs the fuzzers start from, besides the corpus.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "frame",
        run: frame,
        seeds: frame_seeds,
    },
    Target {
        name: "peer_message",
        run: peer_message,
        seeds: peer_message_seeds,
    },
    Target {
        name: "control_request",
        run: control_request,
        seeds: control_request_seeds,
    },
    Target {
        name: "record",
        run: record,
        seeds: disk::record_seeds,
    },
    Target {
        name: "log_files",
        run: disk::log_files,
        seeds: disk::log_file_seeds,
    },
    Target {
        name: "journal",
        run: disk::journal,
        seeds: disk::journal_seeds,
    },
    Target {
        name: "token_file",
        run: token_file,
        seeds: token_file_seeds,
    },
    Target {
        name: "server_session",
        run: server_session,
        seeds: live::session_seeds,
    },
];

/// The target named `name`.
pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Every frame type, from the client and from peers (`Hello`, requests,
/// `Submit`, `PeerHello`, `Peer`, `ControlHello`, `ServerHello`): the
/// bytes are cut into frames as a connection cuts them, and each frame
/// that decodes must encode to bytes that decode to the same frame. A
/// connection's buffer (`FrameBuffer::next_frame`, whose frames' byte
/// fields are slices of it) must cut the same frames and stop where
/// decoding does.
pub fn frame(bytes: &[u8]) {
    let mut rest = bytes;
    let mut frames = Vec::new();
    let last = loop {
        let (frame, used) = match Frame::decode(rest, 1 << 20) {
            Ok(Some(decoded)) => decoded,
            Ok(None) => break Ok(()),
            Err(error) => break Err(error),
        };
        assert!(used > 0 && used <= rest.len(), "a frame used {used} bytes");
        let encoded = frame.to_bytes();
        let (again, length) = Frame::decode(&encoded, usize::MAX)
            .expect("an encoded frame decodes")
            .expect("an encoded frame is whole");
        assert_eq!(length, encoded.len());
        assert_eq!(again, frame, "frame round trip");
        frames.push(frame);
        rest = &rest[used..];
    };
    let mut buffer = FrameBuffer::new();
    buffer.extend(bytes);
    let mut cut = Vec::new();
    let buffer_last = loop {
        match buffer.next_frame(1 << 20) {
            Ok(Some(frame)) => cut.push(frame),
            Ok(None) => break Ok(()),
            Err(error) => break Err(error),
        }
    };
    assert_eq!(
        cut, frames,
        "a connection's buffer cuts the frames decoding cuts"
    );
    assert_eq!(
        buffer_last, last,
        "a connection's buffer stops where decoding stops"
    );
}

fn frame_seeds() -> Vec<Vec<u8>> {
    proto::frame::sample_frames()
        .iter()
        .map(Frame::to_bytes)
        .collect()
}

/// The message of a `Peer` frame, as a replica decodes it.
pub fn peer_message(bytes: &[u8]) {
    let _ = server::check_peer_message(bytes);
}

/// One message of each sub-kind (docs/wire-format.md, "Peer links").
fn peer_message_seeds() -> Vec<Vec<u8>> {
    let numbers = |kind: u8, values: &[u64]| {
        let mut bytes = vec![kind];
        for value in values {
            bytes.extend_from_slice(&value.to_le_bytes());
        }
        bytes
    };
    let records = disk::record_seeds();
    let mut replicate = vec![1];
    replicate.extend_from_slice(&(records.len() as u32).to_le_bytes());
    for record in &records {
        replicate.extend_from_slice(record);
    }
    let mut bind = vec![2];
    bind.extend_from_slice(&1u32.to_le_bytes());
    for value in [4u64, 1] {
        bind.extend_from_slice(&value.to_le_bytes());
    }
    bind.extend_from_slice(&9u128.to_le_bytes());
    for value in [1u64, 4, 1] {
        bind.extend_from_slice(&value.to_le_bytes());
    }
    bind.extend_from_slice(&0u16.to_le_bytes());
    bind.extend_from_slice(&0x1234_5678u32.to_le_bytes());
    let mut reack = vec![6];
    reack.extend_from_slice(&9u128.to_le_bytes());
    for value in [1u64, 4, 4] {
        reack.extend_from_slice(&value.to_le_bytes());
    }
    let mut checkpoint = numbers(8, &[3]);
    checkpoint.extend_from_slice(&5u32.to_le_bytes());
    checkpoint.extend_from_slice(b"state");
    vec![
        replicate,
        bind,
        numbers(3, &[3, 3]),
        numbers(4, &[2, 3]),
        numbers(5, &[1, 3]),
        reack,
        vec![7],
        checkpoint,
    ]
}

/// A control connection's request body (JSON), as a control-plane
/// server decodes it.
pub fn control_request(bytes: &[u8]) {
    let _ = control::check_request(bytes);
}

fn control_request_seeds() -> Vec<Vec<u8>> {
    [
        r#"{"Heartbeat":{"id":2,"join_view":7}}"#,
        r#"{"AddVoter":{"id":4,"address":"127.0.0.1:7400"}}"#,
        r#"{"RemoveVoter":{"id":3}}"#,
        r#"{"Vote":{"vote":{"leader_id":{"term":3,"node_id":1},"committed":false},"last_log_id":null}}"#,
    ]
    .iter()
    .map(|text| text.as_bytes().to_vec())
    .collect()
}

/// One record, as a log's reader and a frame's records decode it: the
/// verified decode never accepts what the full decode refuses for its
/// lengths, and both agree on the length of what they accept.
pub fn record(bytes: &[u8]) {
    let checked = Record::decode(bytes);
    let trusted = Record::decode_verified(bytes);
    if let Ok((record, used)) = &checked {
        let (again, length) = trusted.expect("a record that decodes checked decodes trusted");
        assert_eq!(*used, length);
        assert_eq!(record.header.version, again.header.version);
        assert_eq!(record.payload, again.payload);
    }
}

/// A token file, as a server reads it at start and on every change.
pub fn token_file(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        let _ = server::auth::TokenFile::parse(text, Path::new("tokens.toml"));
    }
}

fn token_file_seeds() -> Vec<Vec<u8>> {
    use server::auth::{token_entry_toml, Right};
    let mut text = token_entry_toml(
        "admin",
        "stl_admin",
        &[(Right::Admin, "*"), (Right::Produce, "orders.*")],
    );
    text.push_str(&token_entry_toml(
        "reader",
        "stl_reader",
        &[(Right::Consume, "a.*")],
    ));
    vec![text.into_bytes()]
}
