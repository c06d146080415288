//! `SharedWriter` over real loopback sockets: direct writes from threads
//! outside any runtime, concurrent senders whose sends never interleave,
//! one shared frame sent to several connections,
//! the bounded queue, closing, a peer that goes away, and the count of
//! sends a thread left for the flusher.

// A test stops at the first thing that is not as it expects.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use net::{Chunk, Closed, Refused, SharedWriter};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

/// A connected pair: our writer's half and the peer's socket.
async fn pair(queued_max: usize) -> (Arc<SharedWriter<u32>>, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (connected, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
    let (_, write) = connected.unwrap().into_split();
    (
        Arc::new(SharedWriter::new(net::LinkWriter::Plain(write), queued_max)),
        accepted.unwrap().0,
    )
}

/// Runs the writer's flusher in a task.
fn spawn_flusher(writer: &Arc<SharedWriter<u32>>) -> tokio::task::JoinHandle<()> {
    let writer = Arc::clone(writer);
    tokio::spawn(async move { writer.run().await })
}

/// A message of `len` bytes: its sender, its number and its length up
/// front, then filler that depends on all three.
fn message(sender: u8, number: u32, len: usize) -> Vec<u8> {
    let mut bytes = vec![sender];
    bytes.extend_from_slice(&number.to_le_bytes());
    bytes.extend_from_slice(&(len as u32).to_le_bytes());
    bytes.extend((9..len).map(|i| (i as u32 ^ number ^ u32::from(sender)) as u8));
    bytes
}

/// `bytes` as one send in three parts (the last may be empty, and is then
/// left out).
fn in_parts(bytes: Vec<u8>) -> Chunk {
    let bytes = bytes::Bytes::from(bytes);
    let (third, two_thirds) = (bytes.len() / 3, bytes.len() * 2 / 3);
    Chunk::parts([
        bytes.slice(..third),
        bytes.slice(third..two_thirds),
        bytes.slice(two_thirds..),
    ])
}

/// Cuts what the peer read back into messages, checking each is whole.
fn messages(mut bytes: &[u8]) -> Vec<(u8, u32)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let sender = bytes[0];
        let number = u32::from_le_bytes(bytes[1..5].try_into().unwrap());
        let len = u32::from_le_bytes(bytes[5..9].try_into().unwrap()) as usize;
        assert_eq!(
            &bytes[..len],
            &message(sender, number, len)[..],
            "message {number} of sender {sender} arrived whole"
        );
        out.push((sender, number));
        bytes = &bytes[len..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_from_a_thread_outside_the_runtime_is_written_by_that_thread() {
    let (writer, mut peer) = pair(16).await;
    let flusher = spawn_flusher(&writer);
    let sent = message(1, 7, 1000);
    let from_thread = Arc::clone(&writer);
    let copy = sent.clone();
    std::thread::spawn(move || from_thread.try_send(copy, None).unwrap())
        .join()
        .unwrap();
    let mut read = vec![0u8; sent.len()];
    peer.read_exact(&mut read).await.unwrap();
    assert_eq!(read, sent);
    let stats = writer.stats();
    assert_eq!((stats.direct, stats.flushed), (1, 0), "{stats:?}");
    writer.close();
    flusher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_senders_never_interleave_and_each_keeps_its_order() {
    let (writer, mut peer) = pair(1 << 20).await;
    let flusher = spawn_flusher(&writer);
    const SENDERS: u8 = 4;
    const EACH: u32 = 500;
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        peer.read_to_end(&mut all).await.unwrap();
        all
    });
    let threads: Vec<_> = (0..SENDERS)
        .map(|sender| {
            let writer = Arc::clone(&writer);
            std::thread::spawn(move || {
                for number in 0..EACH {
                    // Sizes from 9 bytes to past a socket buffer's worth.
                    let len = 9 + (number as usize * 7919) % 200_000;
                    let bytes = message(sender, number, len);
                    // Owned, shared and in parts alike: a shared send the
                    // socket takes in part keeps the rest as a slice, a
                    // send in parts the parts not written yet.
                    let sent = match number % 6 {
                        0 => writer.try_queue(bytes, Some(number)),
                        1 => writer.try_send(bytes::Bytes::from(bytes), Some(number)),
                        2 => writer.try_queue(bytes::Bytes::from(bytes), Some(number)),
                        3 => writer.try_send(in_parts(bytes), Some(number)),
                        4 => writer.try_queue(in_parts(bytes), Some(number)),
                        _ => writer.try_send(bytes, Some(number)),
                    };
                    assert!(sent.is_ok(), "the queue has room for everything");
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(
        writer.stats().flushed > 0,
        "queued sends go through the flusher"
    );
    writer.close();
    flusher.await.unwrap();
    drop(writer);
    let got = messages(&reader.await.unwrap());
    assert_eq!(got.len(), usize::from(SENDERS) * EACH as usize);
    for sender in 0..SENDERS {
        let numbers: Vec<u32> = got
            .iter()
            .filter(|(s, _)| *s == sender)
            .map(|(_, n)| *n)
            .collect();
        assert_eq!(numbers, (0..EACH).collect::<Vec<_>>(), "sender {sender}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_shared_frame_sent_to_two_connections_arrives_whole_at_each_and_is_released_once_written(
) {
    let ((first, mut first_peer), (second, mut second_peer)) = tokio::join!(pair(16), pair(16));
    let flushers = [spawn_flusher(&first), spawn_flusher(&second)];
    // Past a loopback socket's buffer, so the direct write takes a part
    // and the rest waits in the queue as a slice of the same bytes.
    let frame = bytes::Bytes::from(message(3, 1, 8 << 20));
    let readers = [&mut first_peer, &mut second_peer].map(|peer| {
        let mut read = vec![0u8; frame.len()];
        async move {
            peer.read_exact(&mut read).await.unwrap();
            read
        }
    });
    for writer in [&first, &second] {
        writer.try_send(frame.clone(), None).unwrap();
    }
    let [a, b] = readers;
    let (a, b) = tokio::join!(a, b);
    assert!(
        a == frame && b == frame,
        "each connection got the frame whole"
    );
    for writer in [&first, &second] {
        writer.close();
    }
    for flusher in flushers {
        flusher.await.unwrap();
    }
    // Once written, the writers dropped their slices of the frame: it is
    // this test's alone again.
    assert!(frame.is_unique(), "the writers keep no slice of the frame");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_fills_the_queue_and_a_waiting_send_resumes_when_it_reads() {
    let (writer, mut peer) = pair(4).await;
    let flusher = spawn_flusher(&writer);
    // Fill the socket's buffers, then the queue.
    let mut sent = 0u32;
    let mut full = false;
    for _ in 0..10_000 {
        match writer.try_send(message(1, sent, 64 * 1024), Some(sent)) {
            Ok(()) => sent += 1,
            Err(Refused::Full(bytes, hold)) => {
                assert_eq!(hold, Some(sent), "the refused send comes back whole");
                assert_eq!(bytes.into_vec(), message(1, sent, 64 * 1024));
                full = true;
                break;
            }
            Err(Refused::Closed) => panic!("the connection is up"),
        }
        tokio::time::sleep(Duration::from_micros(50)).await;
    }
    assert!(full, "a peer that reads nothing fills the queue");
    assert!(writer.queued() >= 3, "{} queued", writer.queued());
    let waiting = tokio::spawn({
        let writer = Arc::clone(&writer);
        async move { writer.send(message(1, sent, 64 * 1024), None).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiting.is_finished(), "the send waits for room");
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        peer.read_to_end(&mut all).await.unwrap();
        all
    });
    assert_eq!(waiting.await.unwrap(), Ok(()));
    writer.close();
    flusher.await.unwrap();
    drop(writer);
    let got = messages(&reader.await.unwrap());
    assert_eq!(got, (0..=sent).map(|n| (1, n)).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_writer_refuses_sends_and_a_gone_peer_closes_it() {
    let (writer, peer) = pair(4).await;
    let flusher = spawn_flusher(&writer);
    drop(peer);
    // Writes to a socket whose peer is gone fail within a few sends.
    let mut refused = false;
    for number in 0..1_000 {
        match writer.send(message(2, number, 4096), None).await {
            Ok(()) => tokio::time::sleep(Duration::from_millis(1)).await,
            Err(Closed) => {
                refused = true;
                break;
            }
        }
    }
    assert!(refused, "sends to a gone peer end in Closed");
    assert!(writer.is_closed());
    assert!(matches!(
        writer.try_send(vec![1], None),
        Err(Refused::Closed)
    ));
    flusher.await.unwrap();

    let (writer, _peer) = pair(4).await;
    writer.close();
    assert!(matches!(
        writer.try_queue(vec![1], None),
        Err(Refused::Closed)
    ));
    // Closed and empty: the flusher ends at once.
    tokio::time::timeout(Duration::from_secs(5), writer.run())
        .await
        .unwrap();
}

/// Waits (up to 5 s) until `writer` has made `writes` writes, direct or
/// batches: its counters move once a write is done.
async fn written(writer: &SharedWriter<u32>, writes: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stats = writer.stats();
        if stats.direct + stats.flushed >= writes {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{stats:?}");
        tokio::time::sleep(Duration::from_micros(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_close_together_and_deferred_sends_go_through_the_flusher() {
    let (writer, mut peer) = pair(16).await;
    let flusher = spawn_flusher(&writer);
    let mut expected = Vec::new();
    // Each send says whether this thread left it for the flusher
    // (`net::queued_here`).
    let mut send = |number: u32, defer: bool| {
        let bytes = message(3, number, 100);
        expected.push((3, number));
        let queued = net::queued_here();
        net::deferring(defer, || writer.try_send(bytes, None)).unwrap();
        net::queued_here() - queued
    };
    // Idle: written at once. Right after a write: queued.
    let started = std::time::Instant::now();
    assert_eq!(send(0, false), 0, "written at once");
    let second = send(1, false);
    let close_together = started.elapsed() < net::IDLE_BEFORE_DIRECT;
    // Each step starts once the one before is written (two writes, direct
    // or a batch), however late a loaded machine runs the flusher.
    written(&writer, 2).await;
    tokio::time::sleep(net::IDLE_BEFORE_DIRECT * 3).await;
    // Idle, but the sender defers: queued.
    assert_eq!(send(2, true), 1, "left for the flusher");
    written(&writer, 3).await;
    tokio::time::sleep(net::IDLE_BEFORE_DIRECT * 3).await;
    // Idle again, and no longer deferring: written at once.
    assert_eq!(send(3, false), 0, "written at once");
    let mut read = vec![0u8; 4 * 100];
    peer.read_exact(&mut read).await.unwrap();
    assert_eq!(messages(&read), expected);
    written(&writer, 4).await;
    let stats = writer.stats();
    if close_together {
        assert_eq!(second, 1, "the second send was left for the flusher");
        assert_eq!(stats.direct, 2, "{stats:?}");
        assert_eq!(stats.flushed, 2, "{stats:?}");
    } else {
        // The second send came late enough to be written at once too.
        assert_eq!(stats.direct, 3, "{stats:?}");
        assert_eq!(stats.flushed, 1, "{stats:?}");
    }
    writer.close();
    flusher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_send_is_written_at_once_right_after_a_write_but_never_past_a_queue() {
    let (writer, mut peer) = pair(16).await;
    let mut expected = Vec::new();
    // Whether each send was left for the flusher (`net::queued_here`).
    let mut send = |number: u32, how: &str| {
        let bytes = message(5, number, 100);
        expected.push((5, number));
        let queued = net::queued_here();
        match how {
            "prompt" => net::prompt(|| writer.try_send(bytes, None)).unwrap(),
            "prompt, deferring outside" => {
                net::deferring(true, || net::prompt(|| writer.try_send(bytes, None))).unwrap()
            }
            _ => writer.try_queue(bytes, None).unwrap(),
        }
        net::queued_here() - queued
    };
    // However close together, and inside a deferring caller, a prompt
    // send finds the connection without a queue and writes at once.
    assert_eq!(send(0, "prompt"), 0, "written at once");
    assert_eq!(send(1, "prompt"), 0, "written at once right after a write");
    assert_eq!(send(2, "prompt, deferring outside"), 0, "written at once");
    // With a send queued (no flusher runs yet), a prompt send queues
    // behind it rather than overtake it.
    assert_eq!(send(3, "queue"), 1, "queued");
    assert_eq!(send(4, "prompt"), 1, "queued behind the queue");
    let flusher = spawn_flusher(&writer);
    let mut read = vec![0u8; 5 * 100];
    peer.read_exact(&mut read).await.unwrap();
    assert_eq!(messages(&read), expected);
    written(&writer, 4).await;
    let stats = writer.stats();
    assert_eq!(stats.direct, 3, "{stats:?}");
    assert_eq!(stats.flushed, 1, "the queued two in one write: {stats:?}");
    writer.close();
    flusher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gathered_batch_is_written_at_once_keeps_its_buffer_and_never_overtakes_a_queue() {
    let (writer, mut peer) = pair(16).await;
    // Right after a write, so the idle rule would queue a `try_send`:
    // a gathered batch is written at once all the same.
    writer.try_send(message(4, 0, 100), None).unwrap();
    let mut batch = message(4, 1, 100);
    batch.extend(message(4, 2, 100));
    let capacity = batch.capacity();
    writer.send_gathered(&mut batch).unwrap();
    assert!(batch.is_empty(), "written whole");
    assert_eq!(batch.capacity(), capacity, "the caller keeps its buffer");
    assert_eq!(writer.stats().direct, 2);
    // With a send queued (no flusher runs yet), the batch queues behind it.
    writer.try_queue(message(4, 3, 100), None).unwrap();
    let mut batch = message(4, 4, 100);
    writer.send_gathered(&mut batch).unwrap();
    assert!(batch.is_empty(), "the writer took it");
    assert_eq!(writer.queued(), 2);
    let flusher = spawn_flusher(&writer);
    let mut read = vec![0u8; 5 * 100];
    peer.read_exact(&mut read).await.unwrap();
    assert_eq!(messages(&read), (0..5).map(|n| (4, n)).collect::<Vec<_>>());
    writer.close();
    flusher.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_sends_of_every_size_arrive_whole_and_in_order_through_partial_vectored_writes() {
    // Small socket buffers on both sides, so most writes are partial.
    let listener = tokio::net::TcpSocket::new_v4().unwrap();
    listener.set_recv_buffer_size(4096).unwrap();
    listener.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let address = listener.local_addr().unwrap();
    let listener = listener.listen(1).unwrap();
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_send_buffer_size(4096).unwrap();
    let (connected, accepted) = tokio::join!(socket.connect(address), listener.accept());
    let (_, write) = connected.unwrap().into_split();
    let writer = Arc::new(SharedWriter::new(net::LinkWriter::Plain(write), 4096));
    let mut peer = accepted.unwrap().0;
    let flusher = spawn_flusher(&writer);
    // Sizes from a header alone to past a socket buffer's share, so that
    // vectored writes stop inside a send and between sends.
    let sizes = |n: u32| 9 + (n as usize * 7919) % 70_000;
    let count = 1500u32;
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        let mut piece = vec![0u8; 3000];
        loop {
            let read = peer.read(&mut piece).await.unwrap();
            if read == 0 {
                return all;
            }
            all.extend_from_slice(&piece[..read]);
            if all.len() % 7 == 0 {
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
        }
    });
    for number in 0..count {
        // Every third send in parts, so that writes stop inside a part.
        let mut item = match number % 3 {
            0 => in_parts(message(2, number, sizes(number))),
            _ => Chunk::from(message(2, number, sizes(number))),
        };
        loop {
            match writer.try_queue(item, None) {
                Ok(()) => break,
                Err(Refused::Full(bytes, _)) => {
                    item = bytes;
                    tokio::time::sleep(Duration::from_micros(100)).await;
                }
                Err(Refused::Closed) => panic!("the connection is up"),
            }
        }
    }
    writer.close();
    // A flusher that lost its place in a send would write too few bytes
    // or too many: the reader then waits, and the test fails here.
    let read = tokio::time::timeout(Duration::from_secs(60), async move {
        flusher.await.unwrap();
        drop(writer);
        reader.await.unwrap()
    })
    .await
    .expect("every queued byte is written within a minute");
    let got = messages(&read);
    assert_eq!(got, (0..count).map(|n| (2, n)).collect::<Vec<_>>());
}
