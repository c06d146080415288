//! Tokens and rights (`auth`): a token without `produce` writes nothing,
//! a token for the prefix `a.` reads nothing of stream `b`, a wrong or
//! revoked token is refused, `CreateReplica` is refused on a client link,
//! and the limits on connections hold.

use std::path::Path;
use std::time::{Duration, Instant};

use client::{Client, ClientError, DurabilityConfig, ErrorCode};
use server::auth::{token_entry_toml, Right};
use server::ServerConfig;

use crate::harness::{raw_hello, read_frames, TestServer};

const ADMIN: &str = "stl_admin-token-for-the-tests";
const READER_A: &str = "stl_reader-of-a";
const WRITER_A: &str = "stl_writer-of-a";

/// A token file with an admin (everything), a reader of `a.*` and a
/// writer of `a.*` that may not read.
fn write_tokens(path: &Path, with_reader: bool) {
    let mut text = token_entry_toml(
        "admin",
        ADMIN,
        &[
            (Right::Admin, "*"),
            (Right::Produce, "*"),
            (Right::Consume, "*"),
        ],
    );
    if with_reader {
        text.push_str(&token_entry_toml(
            "reader-a",
            READER_A,
            &[(Right::Consume, "a.*")],
        ));
    }
    text.push_str(&token_entry_toml(
        "writer-a",
        WRITER_A,
        &[(Right::Produce, "a.*")],
    ));
    std::fs::write(path, text).unwrap();
}

async fn start_with_tokens(folder: &Path) -> TestServer {
    let tokens = folder.join("tokens.toml");
    write_tokens(&tokens, true);
    let mut config = ServerConfig::new(folder.join("data"));
    config.tokens = Some(tokens);
    TestServer::start(config).await
}

async fn client_with(server: &TestServer, token: &str) -> Result<Client, ClientError> {
    let mut config = server.client_config();
    config.credentials.token = token.to_string();
    Client::connect(config).await
}

fn assert_unauthorized<T>(result: Result<T, ClientError>, naming: &str) {
    match result.map(|_| "an answer") {
        Err(ClientError::Server {
            code: ErrorCode::Unauthorized,
            message,
        }) => assert!(message.contains(naming), "{message:?} names {naming:?}"),
        other => panic!("expected Unauthorized naming {naming:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn a_token_without_produce_writes_nothing() {
    let folder = tempfile::tempdir().unwrap();
    let server = start_with_tokens(folder.path()).await;
    let admin = client_with(&server, ADMIN).await.unwrap();
    let info = admin
        .create_stream("a.orders", DurabilityConfig::Sync)
        .await
        .unwrap();
    // The reader may read a.* but not write it: through the replicated
    // producer and through the single-server append.
    let config = client::PublisherConfig {
        credentials: client::Credentials {
            token: READER_A.into(),
            ..client::Credentials::default()
        },
        ..client::PublisherConfig::default()
    };
    let publisher = client::Publisher::connect(&info, config).await.unwrap();
    let refused = tokio::time::timeout(Duration::from_secs(10), publisher.send(b"k", b"forged"))
        .await
        .expect("the refusal comes");
    assert!(
        refused.is_err(),
        "a reader's message was taken: {refused:?}"
    );
    let reader = client_with(&server, READER_A).await.unwrap();
    let mut producer = reader.producer(info.id);
    assert_unauthorized(producer.send(b"k", b"forged").await, "produce");
    // Nothing reached the log; the writer's message did.
    let writer = client_with(&server, WRITER_A).await.unwrap();
    writer.producer(info.id).send(b"k", b"real").await.unwrap();
    let records = crate::harness::fetch_all(&admin, info.id).await;
    let payloads: Vec<&[u8]> = records.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, vec![&b"real"[..]]);
    // The writer may not read what it wrote.
    assert_unauthorized(writer.fetch(info.id, 1, 10).await, "consume");
    assert!(
        server
            .state
            .requests_unauthorized
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 2
    );
    server.stop().await;
}

#[tokio::test]
async fn a_token_for_prefix_a_cannot_read_stream_b() {
    let folder = tempfile::tempdir().unwrap();
    let server = start_with_tokens(folder.path()).await;
    let admin = client_with(&server, ADMIN).await.unwrap();
    let a = admin
        .create_stream("a.x", DurabilityConfig::Sync)
        .await
        .unwrap();
    let b = admin
        .create_stream("b", DurabilityConfig::Sync)
        .await
        .unwrap();
    for info in [&a, &b] {
        admin.producer(info.id).send(b"k", b"secret").await.unwrap();
    }
    let reader = client_with(&server, READER_A).await.unwrap();
    assert_eq!(reader.fetch(a.id, 1, 10).await.unwrap().len(), 1);
    assert_unauthorized(
        reader.fetch(b.id, 1, 10).await,
        "consume right on stream \"b\"",
    );
    assert_unauthorized(reader.open_stream("b").await, "no right on stream \"b\"");
    let mut subscription = reader.subscribe(b.id, 1).await.unwrap();
    let delivered = tokio::time::timeout(Duration::from_secs(10), subscription.next())
        .await
        .expect("the subscription ends");
    assert!(
        matches!(delivered, Some(Err(_)) | None),
        "a subscription to b delivered {delivered:?}"
    );
    let listed: Vec<String> = reader
        .list_streams()
        .await
        .unwrap()
        .into_iter()
        .map(|info| info.name)
        .collect();
    assert_eq!(listed, vec!["a.x".to_string()], "b is not even listed");
    // Administration needs `admin`.
    assert_unauthorized(
        reader.create_stream("a.new", DurabilityConfig::Sync).await,
        "admin",
    );
    assert_unauthorized(reader.delete_stream("a.x").await, "admin");
    assert_unauthorized(reader.retire_server(9).await, "admin right on every stream");
    server.stop().await;
}

#[tokio::test]
async fn a_wrong_missing_or_revoked_token_is_refused() {
    let folder = tempfile::tempdir().unwrap();
    let server = start_with_tokens(folder.path()).await;
    let started = Instant::now();
    assert_unauthorized(client_with(&server, "stl_wrong").await, "not known");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "a failed login is slowed down"
    );
    assert_unauthorized(client_with(&server, "").await, "needs a token");
    // A prefix of a real token is no token.
    assert_unauthorized(client_with(&server, &READER_A[..8]).await, "not known");
    let refused = server
        .state
        .logins_refused
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(refused, 3);

    // Revoked: the reader's entry leaves the file; its open connection is
    // refused from the next request on, and it cannot log in again.
    let admin = client_with(&server, ADMIN).await.unwrap();
    let info = admin
        .create_stream("a.y", DurabilityConfig::Sync)
        .await
        .unwrap();
    let reader = client_with(&server, READER_A).await.unwrap();
    assert!(reader.fetch(info.id, 1, 1).await.is_ok());
    let tokens = folder.path().join("tokens.toml");
    write_tokens(&tokens, false);
    let later = std::time::SystemTime::now() + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&tokens)
        .unwrap()
        .set_modified(later)
        .unwrap();
    server.state.tokens.as_ref().unwrap().check_now();
    assert_unauthorized(reader.fetch(info.id, 1, 1).await, "revoked");
    assert_unauthorized(client_with(&server, READER_A).await, "not known");
    // The others are unaffected.
    assert!(admin.fetch(info.id, 1, 1).await.is_ok());
    server.stop().await;
}

#[tokio::test]
async fn create_replica_is_refused_on_a_client_link() {
    use tokio::io::AsyncWriteExt;
    let folder = tempfile::tempdir().unwrap();
    // Even without a token file, where a client may do everything else.
    let server = TestServer::start(ServerConfig::new(folder.path())).await;
    let mut socket = raw_hello(server.address).await;
    let info = proto::StreamInfo {
        id: 77,
        name: "forged".into(),
        durability: DurabilityConfig::Sync,
        protocol: 1,
        primary: 1,
        epoch: 1,
        first_version: 1,
        last_version: 0,
        committed_version: 0,
        replicas: vec![proto::ReplicaAddress {
            id: 1,
            address: server.address.to_string(),
        }],
        commit_interval_ms: 0,
    };
    let request = proto::Frame::CreateReplica {
        request: 5,
        info,
        retention: proto::RetentionConfig::default(),
    };
    socket.write_all(&request.to_bytes()).await.unwrap();
    let (frames, _) = read_frames(&mut socket, 1, Duration::from_secs(5)).await;
    match frames.first() {
        Some(proto::Frame::Error { code, message, .. }) => {
            assert_eq!(*code, ErrorCode::Unauthorized, "{message}");
            assert!(message.contains("between servers"), "{message}");
        }
        other => panic!("create-replica was answered with {other:?}"),
    }
    assert!(server.state.stream_by_name("forged").is_none());
    server.stop().await;
}

#[tokio::test]
async fn connections_from_one_address_and_in_all_are_bounded() {
    let folder = tempfile::tempdir().unwrap();
    let mut config = ServerConfig::new(folder.path());
    config.connections_per_address_max = 2;
    config.connections_max = 3;
    let server = TestServer::start(config).await;
    let first = raw_hello(server.address).await;
    let _second = raw_hello(server.address).await;
    let busy = |frames: &[proto::Frame], naming: &str| match frames.first() {
        Some(proto::Frame::Error { code, message, .. }) => {
            assert_eq!(*code, ErrorCode::Busy, "{message}");
            assert!(message.contains(naming), "{message}");
        }
        other => panic!("a connection past the limit got {other:?}"),
    };
    // A third from 127.0.0.1 is one too many for the address.
    let mut third = tokio::net::TcpStream::connect(server.address)
        .await
        .unwrap();
    let (frames, closed) = read_frames(&mut third, 1, Duration::from_secs(5)).await;
    busy(&frames, "from one address");
    let _ = closed;
    // From another loopback address it is served, up to the server's
    // own limit of 3.
    let other = std::net::SocketAddr::from(([127, 0, 0, 2], 0));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(other).unwrap();
    let mut fourth = socket.connect(server.address).await.unwrap();
    use tokio::io::AsyncWriteExt;
    let hello = proto::Frame::Hello {
        version: proto::PROTOCOL_VERSION,
        client: 9,
        token: String::new(),
    };
    fourth.write_all(&hello.to_bytes()).await.unwrap();
    let (frames, _) = read_frames(&mut fourth, 1, Duration::from_secs(5)).await;
    assert!(
        matches!(frames.first(), Some(proto::Frame::HelloOk { .. })),
        "{frames:?}"
    );
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 3], 0)))
        .unwrap();
    let mut fifth = socket.connect(server.address).await.unwrap();
    let (frames, _) = read_frames(&mut fifth, 1, Duration::from_secs(5)).await;
    busy(&frames, "at most 3 connections");
    // A connection that ends gives its place back.
    drop(first);
    let mut again = None;
    for _ in 0..100 {
        let mut socket = tokio::net::TcpStream::connect(server.address)
            .await
            .unwrap();
        socket.write_all(&hello.to_bytes()).await.unwrap();
        let (frames, _) = read_frames(&mut socket, 1, Duration::from_secs(5)).await;
        if matches!(frames.first(), Some(proto::Frame::HelloOk { .. })) {
            again = Some(socket);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        again.is_some(),
        "the place of a closed connection was not given back"
    );
    server.stop().await;
}

/// A three-server cluster with TLS on every link and the admin token,
/// made as `stamplog cluster` makes it.
async fn secure_cluster(folder: &Path) -> (server::LocalCluster, server::LocalSecurity) {
    let security = server::LocalSecurity::make(folder, 3).unwrap();
    let cluster = server::LocalCluster::start(3, folder, |config| {
        crate::harness::fast(config);
        security.apply(config);
    })
    .await
    .unwrap();
    (cluster, security)
}

fn admin_config(
    address: std::net::SocketAddr,
    security: &server::LocalSecurity,
) -> client::ClientConfig {
    let mut config = client::ClientConfig::new(address.to_string());
    config.credentials = client::Credentials {
        token: security.admin_token.clone(),
        dialer: security.admin_dialer().unwrap(),
    };
    config
}

/// A secure three-server cluster (as [`secure_cluster`]) with a `sync`
/// stream `name` on all three, its admin client and a publisher of it.
async fn secure_stream(
    folder: &Path,
    name: &str,
) -> (
    server::LocalCluster,
    server::LocalSecurity,
    Client,
    client::StreamInfo,
    client::Publisher,
) {
    let (cluster, security) = secure_cluster(folder).await;
    let address = cluster.address(1);
    let admin = Client::connect(admin_config(address, &security))
        .await
        .unwrap();
    let info = admin
        .create_stream_with(
            name,
            DurabilityConfig::Sync,
            client::Protocol::OneHopAckClient,
            3,
        )
        .await
        .unwrap();
    let config = client::PublisherConfig {
        credentials: admin_config(address, &security).credentials,
        ..client::PublisherConfig::default()
    };
    let publisher = client::Publisher::connect(&info, config).await.unwrap();
    (cluster, security, admin, info, publisher)
}

#[tokio::test]
async fn a_tls_cluster_serves_tls_clients_and_refuses_plaintext() {
    let folder = tempfile::tempdir().unwrap();
    let (cluster, security, admin, info, publisher) = secure_stream(folder.path(), "tls").await;
    let address = cluster.address(1);
    for index in 0..20u32 {
        publisher.send(b"k", &index.to_le_bytes()).await.unwrap();
    }
    assert_eq!(
        crate::harness::fetch_visible(&admin, info.id, 20)
            .await
            .len(),
        20
    );

    // A plaintext client gets no answer but a closed connection, with the
    // right token or not.
    let mut plain = client::ClientConfig::new(address.to_string());
    plain.credentials.token = security.admin_token.clone();
    plain.connect_timeout = Duration::from_secs(3);
    let refused = Client::connect(plain).await.map(|_| ());
    assert!(refused.is_err(), "a plaintext client was served");
    let mut raw = tokio::net::TcpStream::connect(address).await.unwrap();
    use tokio::io::AsyncWriteExt;
    let hello = proto::Frame::Hello {
        version: proto::PROTOCOL_VERSION,
        client: 5,
        token: security.admin_token.clone(),
    };
    raw.write_all(&hello.to_bytes()).await.unwrap();
    let (frames, closed) = read_frames(&mut raw, 1, Duration::from_secs(5)).await;
    assert!(frames.is_empty() && closed, "plaintext got {frames:?}");
    // A TLS client that trusts another CA refuses the server.
    let other = tempfile::tempdir().unwrap();
    let stranger = net::tls::make_certificates(other.path(), &[1], &[]).unwrap();
    let mut wrong_ca = admin_config(address, &security);
    wrong_ca.credentials.dialer = net::Dialer::tls(&stranger.ca, None).unwrap();
    assert!(
        Client::connect(wrong_ca).await.is_err(),
        "a server outside the CA was trusted"
    );
    // The servers' own links (peer, control, replica creation) all ran
    // over TLS: the stream was created and replicated on three.
    for server in &cluster.servers {
        let state = server.state();
        let stream = state
            .stream_by_name("tls")
            .expect("a replica on every server");
        assert_eq!(stream.visible_version(), 20, "server {}", server.id);
    }
    cluster.stop().await;
}

#[tokio::test]
async fn a_peer_impostor_without_the_clusters_certificate_delivers_nothing() {
    use tokio::io::AsyncWriteExt;
    let folder = tempfile::tempdir().unwrap();
    let (cluster, security, admin, info, publisher) = secure_stream(folder.path(), "guarded").await;
    let address = cluster.address(1);
    publisher.send(b"k", b"real").await.unwrap();
    let visible = |cluster: &server::LocalCluster| -> Vec<u64> {
        cluster
            .servers
            .iter()
            .map(|s| {
                s.state()
                    .stream_by_name("guarded")
                    .unwrap()
                    .visible_version()
            })
            .collect()
    };
    // Every replica has committed the real message before the impostors.
    crate::harness::wait_until(
        Duration::from_secs(10),
        "every replica has the message",
        || visible(&cluster) == vec![1, 1, 1],
    )
    .await;

    // Three impostors claim to be server 2 to server 1: with the CA's
    // client certificate (not server 2's), with no certificate, and as
    // a server asking for a replica.
    let client_cert = net::Dialer::tls(&security.ca, Some(&security.client)).unwrap();
    let anonymous = net::Dialer::tls(&security.ca, None).unwrap();
    let forged = proto::Frame::Peer {
        stream: info.id,
        message: vec![1; 64].into(),
    };
    let hellos = [
        proto::Frame::PeerHello {
            version: proto::PROTOCOL_VERSION,
            from: 2,
            incarnation: 1,
        },
        proto::Frame::ServerHello {
            version: proto::PROTOCOL_VERSION,
            from: 2,
            client: 3,
        },
        proto::Frame::ControlHello {
            version: proto::PROTOCOL_VERSION,
            from: 2,
        },
    ];
    for dialer in [&client_cert, &anonymous] {
        for hello in &hellos {
            let mut link = match dialer.connect(&address.to_string()).await {
                Ok(link) => link,
                Err(error) => panic!("the TLS handshake itself should pass: {error}"),
            };
            let mut bytes = hello.to_bytes();
            forged.encode(&mut bytes);
            let _ = link.write_all(&bytes).await;
            let _ = link.flush().await;
            let (frames, closed) = read_frames(&mut link, 1, Duration::from_secs(5)).await;
            match frames.first() {
                Some(proto::Frame::Error { code, message, .. }) => {
                    assert_eq!(*code, ErrorCode::Unauthorized, "{message}");
                    assert!(message.contains("server-2.stamplog"), "{message}");
                }
                other => panic!("an impostor's {hello:?} got {other:?} (closed: {closed})"),
            }
        }
    }
    let refused = cluster.servers[0]
        .state()
        .tls_refused
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(refused, 6);
    publisher.send(b"k", b"after").await.unwrap();
    crate::harness::wait_until(Duration::from_secs(10), "every replica has both", || {
        visible(&cluster) == vec![2, 2, 2]
    })
    .await;
    // Nothing else arrives: only the two real messages, on every replica.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(visible(&cluster), vec![2, 2, 2]);
    let records = crate::harness::fetch_all(&admin, info.id).await;
    let payloads: Vec<&[u8]> = records.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, vec![&b"real"[..], &b"after"[..]]);
    cluster.stop().await;
}
