//! Bad input on raw sockets: garbage, oversize frames, wrong versions,
//! frames only a server may send, fuzzed frames, and reads of versions no
//! longer retained. Each gets a clear error (or a close), never a crash,
//! and the server goes on serving proper clients.

use std::net::SocketAddr;
use std::time::Duration;

use client::{Client, DurabilityConfig, ErrorCode};
use proto::{Frame, PROTOCOL_VERSION};
use server::ServerConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::harness::{
    panics_where, quick_client_config, raw_hello, read_frames, record_panics, TestServer,
};

/// A proper client can still create a stream, append and read back.
async fn a_good_client_is_served(address: SocketAddr, name: &str) {
    let client = Client::connect(quick_client_config(address))
        .await
        .expect("a good client connects");
    let stream = client
        .create_stream(name, DurabilityConfig::Sync)
        .await
        .expect("create");
    let mut producer = client.producer(stream.id);
    for number in 0..10u32 {
        let ack = producer.send(b"", &number.to_le_bytes()).await.unwrap();
        assert_eq!(ack.version, u64::from(number) + 1);
    }
    let records = client.fetch(stream.id, 1, 100).await.unwrap();
    let payloads: Vec<Vec<u8>> = records.into_iter().map(|r| r.payload).collect();
    let expected: Vec<Vec<u8>> = (0..10u32).map(|n| n.to_le_bytes().to_vec()).collect();
    assert_eq!(payloads, expected);
}

/// Reads what the server answers until it closes; asserts it closes
/// within a few seconds and returns the frames.
async fn answer_and_close(socket: &mut TcpStream) -> Vec<Frame> {
    let (frames, closed) = read_frames(socket, usize::MAX, Duration::from_secs(5)).await;
    assert!(
        closed,
        "the server kept the connection open after {frames:?}"
    );
    frames
}

fn single_error(frames: &[Frame]) -> (ErrorCode, String) {
    match frames {
        [Frame::Error { code, message, .. }] => (*code, message.clone()),
        other => panic!("expected one error frame, got {other:?}"),
    }
}

#[tokio::test]
async fn garbage_instead_of_a_hello_gets_an_error_or_a_close_and_the_server_goes_on() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.handshake_timeout = Duration::from_millis(300);
    let server = TestServer::start(config).await;
    let status = Frame::Status { request: 1 }.to_bytes();
    let mut bad_magic = Frame::Hello {
        version: PROTOCOL_VERSION,
        client: 1,
        token: String::new(),
    }
    .to_bytes();
    bad_magic[5] = b'X';
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        (
            "an HTTP request",
            b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        ),
        ("zeros", vec![0; 64]),
        ("a status frame first", status),
        ("a hello with a bad magic", bad_magic),
        ("a few bytes, then silence", b"hi".to_vec()),
        ("random bytes", proto::Rng::new(7).bytes(4096)),
    ];
    for (what, bytes) in garbage {
        let mut socket = TcpStream::connect(server.address).await.unwrap();
        let _ = socket.write_all(&bytes).await;
        let frames = answer_and_close(&mut socket).await;
        // An error frame (the clear answer) or nothing but the close.
        match frames.as_slice() {
            [] => {}
            [Frame::Error { code, message, .. }] => {
                assert_eq!(*code, ErrorCode::BadFrame, "{what}: {message}");
                assert!(!message.is_empty(), "{what}: an empty error message");
            }
            other => panic!("{what}: unexpected answer {other:?}"),
        }
    }
    let status = Client::connect(quick_client_config(server.address))
        .await
        .unwrap()
        .status()
        .await
        .unwrap();
    assert!(status.contains("server_id"), "{status}");
    a_good_client_is_served(server.address, "after-garbage").await;
    server.stop().await;
}

#[tokio::test]
async fn a_frame_over_the_size_limit_gets_an_error_and_a_close() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.message_bytes_max = 1000;
    let limit = config.frame_bytes_max();
    let server = TestServer::start(config).await;

    // After the handshake: only a header announcing too large a body.
    let mut socket = raw_hello(server.address).await;
    let mut header = ((limit + 1) as u32).to_le_bytes().to_vec();
    header.push(0x06);
    socket.write_all(&header).await.unwrap();
    let (code, message) = single_error(&answer_and_close(&mut socket).await);
    assert_eq!(code, ErrorCode::BadFrame);
    assert!(
        message.contains(&(limit + 1).to_string()) && message.contains(&limit.to_string()),
        "the error names the size and the limit: {message}"
    );

    // A whole append just over the limit is cut the same way.
    let mut socket = raw_hello(server.address).await;
    let append = Frame::Append {
        request: 1,
        stream: 1,
        flags: 0,
        session: 1,
        sequence: 1,
        low_water: 1,
        key: Vec::new(),
        payload: vec![0; limit],
    };
    let _ = socket.write_all(&append.to_bytes()).await;
    let (code, _) = single_error(&answer_and_close(&mut socket).await);
    assert_eq!(code, ErrorCode::BadFrame);

    // During the handshake a big first frame is refused too.
    let mut socket = TcpStream::connect(server.address).await.unwrap();
    socket
        .write_all(&[0xFF, 0xFF, 0xFF, 0x7F, 0x01])
        .await
        .unwrap();
    let (code, message) = single_error(&answer_and_close(&mut socket).await);
    assert_eq!(code, ErrorCode::BadFrame);
    assert!(message.contains("exceeds"), "{message}");

    a_good_client_is_served(server.address, "after-oversize").await;
    server.stop().await;
}

#[tokio::test]
async fn a_hello_with_another_protocol_version_gets_an_error_naming_the_supported_one() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let mut socket = TcpStream::connect(server.address).await.unwrap();
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION + 98,
        client: 5,
        token: String::new(),
    };
    socket.write_all(&hello.to_bytes()).await.unwrap();
    let (code, message) = single_error(&answer_and_close(&mut socket).await);
    assert!(
        message.contains(&(PROTOCOL_VERSION + 98).to_string()),
        "the error names the version asked for: {message}"
    );
    assert!(
        message.ends_with(&format!(" {PROTOCOL_VERSION}")),
        "the error names the supported version: {message}"
    );
    // The protocol has a code for exactly this case.
    assert_eq!(
        code,
        ErrorCode::UnsupportedVersion,
        "a version mismatch is reported as such: {message}"
    );
    a_good_client_is_served(server.address, "after-version").await;
    server.stop().await;
}

#[tokio::test]
async fn a_client_that_sends_a_server_frame_gets_an_error_and_a_close() {
    let data = tempfile::tempdir().unwrap();
    let server = TestServer::start(ServerConfig::new(data.path())).await;
    let server_frames = vec![
        Frame::Ack {
            request: 1,
            stream: 1,
            version: 1,
            epoch: 1,
            level: proto::AckLevel::Synced,
            flags: 0,
            replicas: 1,
            echo: Vec::new(),
        },
        Frame::HelloOk {
            version: PROTOCOL_VERSION,
            server: 1,
            max_frame: 1024,
        },
        Frame::Ok { request: 3 },
        Frame::StatusReply {
            request: 4,
            json: "{}".into(),
        },
        Frame::Hello {
            version: PROTOCOL_VERSION,
            client: 9,
            token: String::new(),
        },
    ];
    for frame in server_frames {
        let mut socket = raw_hello(server.address).await;
        // A proper request first, answered as usual.
        socket
            .write_all(&Frame::Status { request: 77 }.to_bytes())
            .await
            .unwrap();
        socket.write_all(&frame.to_bytes()).await.unwrap();
        let frames = answer_and_close(&mut socket).await;
        assert!(
            matches!(frames.first(), Some(Frame::StatusReply { request: 77, .. })),
            "{frames:?}"
        );
        let (code, message) = single_error(&frames[1..]);
        assert_eq!(code, ErrorCode::BadFrame, "{frame:?}: {message}");
        assert!(message.contains("may not send"), "{frame:?}: {message}");
    }
    a_good_client_is_served(server.address, "after-server-frames").await;
    server.stop().await;
}

#[tokio::test]
async fn reading_a_version_older_than_retained_names_the_oldest_available() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.memory_retain_bytes = 4096;
    // A memory stream must hold one whole message.
    config.message_bytes_max = 1000;
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let stream = client
        .create_stream("ring", DurabilityConfig::Memory)
        .await
        .unwrap();
    let mut producer = client.producer(stream.id);
    for number in 0..200u32 {
        producer
            .send(b"", &[number as u8; 100])
            .await
            .expect("memory append");
    }
    let info = client.open_stream("ring").await.unwrap();
    assert_eq!(info.last_version, 200);
    assert!(
        info.first_version > 1 && info.first_version <= 200,
        "a 4 KiB ring holds fewer than 200 records of 100 bytes: {info:?}"
    );
    let oldest = info.first_version;
    crate::harness::assert_version_1_unavailable(&client, stream.id, oldest).await;
    // The oldest retained version itself is readable (a few records at a
    // time: see the next test for many at once).
    let kept = client.fetch(stream.id, oldest, 3).await.unwrap();
    let versions: Vec<u64> = kept.iter().map(|r| r.version).collect();
    assert_eq!(versions, vec![oldest, oldest + 1, oldest + 2]);
    server.stop().await;
}

/// With the message limit lowered, the largest frame the server accepts
/// (and announces in its hello answer) is small, but a fetch or a
/// subscription still asks for up to `read_batch_bytes_max` of records in
/// one frame: the answer must still reach the client whole.
#[tokio::test]
async fn a_server_with_a_small_message_limit_still_serves_reads_of_many_records() {
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.message_bytes_max = 1000;
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let stream = client
        .create_stream("small", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut producer = client.producer(stream.id);
    let mut pending = Vec::new();
    for number in 0..100u32 {
        pending.push(producer.submit(b"", &[number as u8; 900]).await.unwrap());
    }
    for ack in pending {
        ack.await.unwrap();
    }
    // A fetch may answer with fewer records than asked (a page); paging
    // through gets everything, and the connection stays up.
    let mut versions = Vec::new();
    for _ in 0..1000 {
        let from = versions.last().map_or(1, |v| v + 1);
        match client.fetch(stream.id, from, 100).await {
            Ok(page) if page.is_empty() => break,
            Ok(page) => versions.extend(page.iter().map(|r| r.version)),
            Err(error) => panic!("a fetch from version {from} failed: {error}"),
        }
    }
    assert_eq!(versions, (1..=100).collect::<Vec<u64>>());
    let mut subscription = client.subscribe(stream.id, 1).await.unwrap();
    for version in 1..=100u64 {
        let record = tokio::time::timeout(Duration::from_secs(5), subscription.next())
            .await
            .unwrap_or_else(|_| panic!("version {version} was not delivered within 5 s"))
            .expect("the subscription is open")
            .expect("no subscription error");
        assert_eq!(record.version, version);
    }
    server.stop().await;
}

/// Valid frames for one fuzzed connection: a hello, then a random mix of
/// requests against the stream `stream` and streams of its own.
fn valid_frames(rng: &mut proto::Rng, connection: u64, stream: u64) -> Vec<u8> {
    let mut bytes = Frame::Hello {
        version: PROTOCOL_VERSION,
        client: u128::from(connection) + 1,
        token: String::new(),
    }
    .to_bytes();
    let own = format!("fuzz-{connection}");
    for request in 1..rng.between(2, 10 - 1) {
        let frame = match rng.below(11) {
            0 => Frame::CreateStream {
                request,
                name: own.clone(),
                durability: DurabilityConfig::Memory,
                protocol: 0,
                replicas: 0,
                commit_interval_ms: 0,
                retention: proto::RetentionConfig::default(),
            },
            1 => Frame::DeleteStream {
                request,
                name: own.clone(),
            },
            2 => Frame::ListStreams { request },
            3 => Frame::OpenStream {
                request,
                name: "main".into(),
            },
            4..=6 => {
                let key_length = rng.below(8) as usize;
                let payload_length = rng.below(300) as usize;
                Frame::Append {
                    request,
                    stream,
                    flags: rng.below(2) as u8,
                    session: rng.between(1, 4 - 1),
                    sequence: rng.between(1, 50 - 1),
                    low_water: rng.below(50),
                    key: rng.bytes(key_length),
                    payload: rng.bytes(payload_length),
                }
            }
            7 => Frame::Fetch {
                request,
                stream,
                from: rng.below(100),
                max_records: rng.below(100) as u32,
                max_bytes: rng.below(100_000) as u32,
            },
            8 => Frame::Subscribe {
                subscription: request,
                stream,
                from: rng.below(100),
                credit: rng.below(1000) as u32,
            },
            9 => Frame::Credit {
                subscription: rng.below(10),
                credit: rng.next_u64() as u32,
            },
            _ => Frame::Status { request },
        };
        frame.encode(&mut bytes);
    }
    bytes
}

/// Damages `bytes` a few times: flips bits, overwrites, cuts, extends,
/// inserts, or writes a random length over a frame header.
fn mutate(rng: &mut proto::Rng, bytes: &mut Vec<u8>) {
    for _ in 0..rng.between(1, 4 - 1) {
        if bytes.is_empty() {
            bytes.push(rng.next_u64() as u8);
        }
        let at = rng.below(bytes.len() as u64) as usize;
        match rng.below(7) {
            0 => bytes[at] ^= 1 << rng.below(8),
            1 => bytes[at] = rng.next_u64() as u8,
            2 => bytes.truncate(at),
            3 => {
                let count = rng.between(1, 64 - 1) as usize;
                bytes.extend(rng.bytes(count));
            }
            4 => {
                let count = rng.between(1, 16 - 1) as usize;
                let inserted = rng.bytes(count);
                bytes.splice(at..at, inserted);
            }
            5 => {
                let end = (at + 4).min(bytes.len());
                let length = (rng.next_u64() as u32).to_le_bytes();
                bytes[at..end].copy_from_slice(&length[..end - at]);
            }
            _ => {
                let end = (at + rng.between(1, 32 - 1) as usize).min(bytes.len());
                let copy = bytes[at..end].to_vec();
                bytes.splice(at..at, copy);
            }
        }
    }
}

#[tokio::test]
async fn fuzzed_frames_never_crash_the_server_nor_damage_a_stream() {
    const CONNECTIONS: u64 = 300;
    record_panics();
    let test_thread = std::thread::current()
        .name()
        .unwrap_or_default()
        .to_string();
    let data = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(data.path());
    config.handshake_timeout = Duration::from_millis(500);
    config.message_bytes_max = 64 * 1024;
    let server = TestServer::start(config).await;
    let client = Client::connect(quick_client_config(server.address))
        .await
        .unwrap();
    let stream = client
        .create_stream("main", DurabilityConfig::Sync)
        .await
        .unwrap();
    let mut producer = client.producer(stream.id);
    let mut mine = Vec::new();
    for number in 0..20u32 {
        let ack = producer.send(b"good", &number.to_le_bytes()).await.unwrap();
        mine.push((ack.version, number));
    }

    let mut rng = proto::Rng::new(0xF022);
    for connection in 0..CONNECTIONS {
        let mut bytes = valid_frames(&mut rng, connection, stream.id);
        mutate(&mut rng, &mut bytes);
        let mut socket = TcpStream::connect(server.address).await.unwrap();
        // The server may close early; a write error is an answer too.
        let _ = socket.write_all(&bytes).await;
        let _ = socket.shutdown().await;
        let (_, closed) = read_frames(&mut socket, usize::MAX, Duration::from_secs(5)).await;
        assert!(
            closed,
            "connection {connection}: the server did not close within 5 s after the client's end of input"
        );
    }

    assert_eq!(
        panics_where(|name| name == test_thread || name.starts_with("log-")),
        0,
        "the server panicked on fuzzed input"
    );
    let status = client.status().await.expect("status after fuzzing");
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    let main = status["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "main")
        .expect("the main stream is still there");
    assert!(main["failed"].is_null(), "{main}");

    for number in 20..40u32 {
        let ack = producer.send(b"good", &number.to_le_bytes()).await.unwrap();
        mine.push((ack.version, number));
    }
    let records = crate::harness::fetch_all(&client, stream.id).await;
    for (position, record) in records.iter().enumerate() {
        assert_eq!(record.version, position as u64 + 1, "versions stay dense");
    }
    for (version, number) in mine {
        let record = &records[(version - 1) as usize];
        assert_eq!(record.key, b"good");
        assert_eq!(record.payload, number.to_le_bytes());
        assert_eq!(record.event.client, client.client_id());
    }
    a_good_client_is_served(server.address, "after-fuzz").await;
    drop(client);
    server.stop().await;
}

/// Shunning: a server that left the view and joined again is a new
/// member; a peer link that names its former incarnation is refused, so a
/// process of the past (paused, partitioned, or an impostor replaying its
/// hello) cannot feed records to a replica.
#[tokio::test]
async fn a_peer_link_from_a_departed_incarnation_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let mut cluster = server::LocalCluster::start(3, data.path(), |config| {
        config.cluster.heartbeat_interval = Duration::from_millis(50);
        config.cluster.suspect_timeout = Duration::from_millis(400);
    })
    .await
    .unwrap();
    cluster.stop_server(2).await;
    cluster.start_server(2).await.unwrap();
    // Server 2 first joined in one of the views 1 to 3 and now in a later
    // one: incarnation 1 is a departed member, 0 never was one.
    for incarnation in [1, 0] {
        let mut socket = TcpStream::connect(cluster.address(1)).await.unwrap();
        let hello = Frame::PeerHello {
            version: PROTOCOL_VERSION,
            from: 2,
            incarnation,
        };
        socket.write_all(&hello.to_bytes()).await.unwrap();
        let (code, message) = single_error(&answer_and_close(&mut socket).await);
        assert_eq!(code, ErrorCode::BadFrame, "{message}");
        assert!(
            message.contains("is no longer a member"),
            "incarnation {incarnation}: {message}"
        );
    }
    cluster.stop().await;
}

/// A peer dials one link to a server at a time: a newer link from the
/// same peer closes the one before, so a link left half open (a
/// partition, a host gone without closing its sockets) holds its task and
/// its connection slot only until the peer dials again. Server 3 is
/// stopped, so the only links that speak for it are the test's. A server
/// never writes on a peer link (it shuts its side at once), so a link is
/// told served by what its writes meet: frames for a stream the server
/// does not have are read and dropped, and a closed link refuses them.
#[tokio::test]
async fn a_newer_peer_link_from_the_same_server_closes_the_one_before() {
    let data = tempfile::tempdir().unwrap();
    let mut cluster = server::LocalCluster::start(3, data.path(), |_| {})
        .await
        .unwrap();
    cluster.stop_server(3).await;
    let hello = Frame::PeerHello {
        version: PROTOCOL_VERSION,
        from: 3,
        incarnation: 1 << 40,
    };
    let ignored = Frame::Peer {
        stream: u64::MAX,
        message: vec![0; 64].into(),
    }
    .to_bytes();
    // Whether the link still takes frames after `within` of writing them.
    async fn served(socket: &mut TcpStream, frame: &[u8], within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while tokio::time::Instant::now() < deadline {
            if socket.write_all(frame).await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }
    let mut older = TcpStream::connect(cluster.address(1)).await.unwrap();
    older.write_all(&hello.to_bytes()).await.unwrap();
    assert!(served(&mut older, &ignored, Duration::from_millis(400)).await);
    let mut newer = TcpStream::connect(cluster.address(1)).await.unwrap();
    newer.write_all(&hello.to_bytes()).await.unwrap();
    assert!(
        !served(&mut older, &ignored, Duration::from_secs(5)).await,
        "the older link was still served after a newer one came"
    );
    assert!(served(&mut newer, &ignored, Duration::from_millis(400)).await);
    drop(newer);
    cluster.stop().await;
}
