//! A real server in this process, fed each input over TCP: as the first
//! bytes of a connection (the handshake, before any token), or after a
//! completed `Hello` (every request and replicated write, with two streams
//! to reach). After each input the server must close or answer within a
//! bound, no task of it may have panicked, and it must still complete a
//! new client's handshake.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use proto::{DurabilityConfig, Frame, RetentionConfig, SubmitFields, PROTOCOL_VERSION};
use server::{ServerConfig, ServerState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How long the server has to answer and close a connection whose
/// client has sent everything and shut its side.
const ANSWER_LIMIT: Duration = Duration::from_secs(5);

/// The server every input goes to, started at the first input and kept
/// for the whole run (a server per input would measure its start).
pub struct LiveServer {
    runtime: tokio::runtime::Runtime,
    address: SocketAddr,
    _state: Arc<ServerState>,
    _data: tempfile::TempDir,
}

static SERVER: OnceLock<LiveServer> = OnceLock::new();
/// Panics anywhere in the process since the hook was installed.
static PANICS: AtomicU64 = AtomicU64::new(0);

impl LiveServer {
    /// The running server, started on first use.
    pub fn get() -> &'static LiveServer {
        SERVER.get_or_init(LiveServer::start)
    }

    fn start() -> LiveServer {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            previous(info);
        }));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let data = tempfile::tempdir().expect("a temporary folder");
        let mut config = ServerConfig::new(data.path());
        config.message_bytes_max = 64 * 1024;
        config.segment_bytes_max = 1024 * 1024;
        let state = ServerState::open(config).expect("the server opens");
        let listener = runtime
            .block_on(TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port");
        let address = listener.local_addr().expect("a bound address");
        runtime.spawn(server::run(
            listener,
            Arc::clone(&state),
            std::future::pending(),
        ));
        runtime.block_on(async {
            let mut socket = hello(address).await;
            for (request, name, durability) in [
                (1, "fuzzed", DurabilityConfig::Sync),
                (2, "fuzzed.memory", DurabilityConfig::Memory),
            ] {
                let create = Frame::CreateStream {
                    request,
                    name: name.into(),
                    durability,
                    protocol: 0,
                    replicas: 1,
                    commit_interval_ms: 0,
                    retention: RetentionConfig::default(),
                };
                socket.write_all(&create.to_bytes()).await.expect("create");
                let answer = read_frame(&mut socket).await;
                assert!(
                    matches!(answer, Some(Frame::StreamInfo { .. })),
                    "creating {name}: {answer:?}"
                );
            }
        });
        LiveServer {
            runtime,
            address,
            _state: state,
            _data: data,
        }
    }
}

/// The first byte picks the way in: odd, after a `Hello`; even, as the
/// connection's first bytes.
pub fn server_session(bytes: &[u8]) {
    let Some((&mode, input)) = bytes.split_first() else {
        return;
    };
    let live = LiveServer::get();
    live.runtime.block_on(async {
        let mut socket = if mode % 2 == 1 {
            hello(live.address).await
        } else {
            TcpStream::connect(live.address).await.expect("connect")
        };
        // The server may close at any point (a bad frame): what it did
        // not read is not its problem.
        let _ = socket.write_all(input).await;
        let _ = socket.shutdown().await;
        let mut sink = vec![0u8; 64 * 1024];
        let drained = tokio::time::timeout(ANSWER_LIMIT, async {
            while let Ok(read) = socket.read(&mut sink).await {
                if read == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(
            drained.is_ok(),
            "the server neither answered nor closed within {ANSWER_LIMIT:?}"
        );
        // Still serving: a new client completes its handshake.
        drop(hello(live.address).await);
    });
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a task of the server panicked"
    );
}

async fn hello(address: SocketAddr) -> TcpStream {
    let mut socket = TcpStream::connect(address).await.expect("connect");
    let hello = Frame::Hello {
        version: PROTOCOL_VERSION,
        client: 0xF0_22ED,
        token: String::new(),
    };
    socket.write_all(&hello.to_bytes()).await.expect("hello");
    let answer = read_frame(&mut socket).await;
    assert!(
        matches!(answer, Some(Frame::HelloOk { .. })),
        "the server did not complete a handshake: {answer:?}"
    );
    socket
}

/// One whole frame from `socket`, or `None` when it closes first.
async fn read_frame(socket: &mut TcpStream) -> Option<Frame> {
    let mut bytes = Vec::new();
    let mut scratch = [0u8; 4096];
    loop {
        if let Ok(Some((frame, _))) = Frame::decode(&bytes, 64 << 20) {
            return Some(frame);
        }
        let read = tokio::time::timeout(ANSWER_LIMIT, socket.read(&mut scratch))
            .await
            .expect("an answer within the limit")
            .ok()?;
        if read == 0 {
            return None;
        }
        bytes.extend_from_slice(&scratch[..read]);
    }
}

/// Inputs that reach deep: every client request and write on the two
/// streams after a `Hello`, and each hello (client, peer, control,
/// server) as a connection's first frame.
pub(crate) fn session_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for frame in proto::frame::sample_frames() {
        let first = matches!(
            frame,
            Frame::Hello { .. }
                | Frame::PeerHello { .. }
                | Frame::ControlHello { .. }
                | Frame::ServerHello { .. }
        );
        let mut seed = vec![u8::from(!first)];
        seed.extend_from_slice(&frame.to_bytes());
        seeds.push(seed);
    }
    // A session on the live server's own streams (ids 1 and 2).
    for stream in [1, 2] {
        let mut session = vec![1];
        let mut write = SubmitFields {
            stream,
            kind: proto::frame::SUBMIT_WRITE,
            version: 0,
            epoch: 0,
            session: 1,
            sequence: 1,
            low_water: 1,
        };
        write.encode(&mut session, b"key", b"payload");
        write.sequence = 2;
        write.encode(&mut session, b"", b"second");
        for frame in [
            Frame::Append {
                request: 1,
                stream,
                flags: 0,
                session: 2,
                sequence: 1,
                low_water: 1,
                key: Vec::new(),
                payload: b"appended".to_vec(),
            },
            Frame::Fetch {
                request: 2,
                stream,
                from: 1,
                max_records: 10,
                max_bytes: 4096,
            },
            Frame::Subscribe {
                subscription: 3,
                stream,
                from: 1,
                credit: 2,
            },
            Frame::Credit {
                subscription: 3,
                credit: 5,
            },
            Frame::OpenStream {
                request: 4,
                name: "fuzzed".into(),
            },
            Frame::ListStreams { request: 5 },
            Frame::Status { request: 6 },
        ] {
            session.extend_from_slice(&frame.to_bytes());
        }
        seeds.push(session);
    }
    seeds
}
