//! A seeded property test of the first guarantee: whatever is acknowledged
//! on a `sync` stream survives a power loss at any point, at exactly its
//! acknowledged version, and the recovered log is dense with no event id
//! twice. Each seed picks message sizes and keys, client windows, log
//! limits, the number of producers and the crash point and mode; a failure
//! prints the seed, and `STAMPLOG_SEED=<seed>` replays that seed alone.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use client::{Client, DurabilityConfig};
use wal::fault::{CrashMode, FaultStorage};

use crate::harness::{fault_config, quick_client_config, read_log, TestServer};

const SEEDS: u64 = 30;

/// The payload of message `sequence` of producer `producer`: both numbers,
/// then seeded filler, so a payload names its message.
fn payload(seed: u64, producer: u32, sequence: u64, length: usize) -> Vec<u8> {
    let mut bytes = producer.to_le_bytes().to_vec();
    bytes.extend_from_slice(&sequence.to_le_bytes());
    let mut rng = proto::Rng::new(seed ^ (u64::from(producer) << 40) ^ sequence);
    bytes.extend(rng.bytes(length));
    bytes
}

/// An acknowledgement received before the crash.
#[derive(Clone, Debug)]
struct Acked {
    producer: u32,
    client: u128,
    sequence: u64,
    version: u64,
    key: Vec<u8>,
    payload: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    acked: Vec<Acked>,
    /// Answers other than an ack before the crash (none are expected).
    errors: Vec<String>,
    /// The image a power loss left, once it happened. Acks that arrive
    /// later are not counted: their records may postdate the image.
    image: Option<FaultStorage>,
}

/// Takes the crash image under the lock, so every ack recorded before it
/// was received (and so made durable) before the image was taken.
fn crash_once(shared: &Mutex<Shared>, storage: &FaultStorage, mode: CrashMode, seed: u64) {
    let mut shared = shared.lock().unwrap();
    if shared.image.is_none() {
        shared.image = Some(storage.crash(mode, seed));
    }
}

async fn run_seed(seed: u64) -> Result<String, String> {
    let mut rng = proto::Rng::new(seed);
    let storage = FaultStorage::new();
    let mut config = fault_config(&storage);
    config.message_bytes_max = 40_000;
    config.segment_bytes_max = rng.between(4096, 200_000 - 1);
    config.pending_bytes_max = rng.between(48_000, 400_000 - 1) as usize;
    let server = TestServer::start(config).await;
    let admin = Client::connect(quick_client_config(server.address))
        .await
        .map_err(|e| e.to_string())?;
    let stream = admin
        .create_stream("prop", DurabilityConfig::Sync)
        .await
        .map_err(|e| e.to_string())?;

    let producers = rng.between(1, 4 - 1) as u32;
    let mut plans = Vec::new();
    let mut total = 0u64;
    for producer in 0..producers {
        let count = rng.between(1, 250 - 1);
        total += count;
        let window = rng.between(1, 65 - 1) as usize;
        let mut messages = Vec::new();
        for sequence in 1..=count {
            let length = match rng.below(20) {
                0 => rng.between(4_000, 39_000 - 1),
                1..=3 => 0,
                _ => rng.between(1, 600 - 1),
            } as usize;
            let key_length = rng.below(24) as usize;
            let key = rng.bytes(key_length);
            messages.push((key, payload(seed, producer, sequence, length)));
        }
        plans.push((window, messages));
    }
    let crash_after = rng.below(total + 10) as usize;
    let mode = if rng.coin() {
        CrashMode::DurableOnly
    } else {
        CrashMode::TornTail
    };
    let crash_seed = rng.next_u64();
    let summary = format!(
        "{producers} producers, {total} messages, crash after {crash_after} acks ({mode:?})"
    );

    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut tasks = tokio::task::JoinSet::new();
    let mut clients = Vec::new();
    for (producer, (window, messages)) in plans.into_iter().enumerate() {
        let producer = producer as u32;
        let mut client_config = quick_client_config(server.address);
        client_config.window = window;
        let client = Client::connect(client_config)
            .await
            .map_err(|e| e.to_string())?;
        clients.push(client.clone());
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let mut session = client.producer(stream.id);
        tasks.spawn(async move {
            for (key, payload) in messages {
                let Ok(pending) = session.submit(&key, &payload).await else {
                    return;
                };
                if sender.send((key, payload, pending)).is_err() {
                    return;
                }
            }
        });
        let shared = Arc::clone(&shared);
        let storage = storage.clone();
        let client_id = client.client_id();
        tasks.spawn(async move {
            while let Some((key, payload, pending)) = receiver.recv().await {
                let ack = match pending.await {
                    Ok(ack) => ack,
                    Err(error) => {
                        let mut state = shared.lock().unwrap();
                        if state.image.is_none() {
                            state.errors.push(format!("producer {producer}: {error}"));
                        }
                        continue;
                    }
                };
                {
                    let mut state = shared.lock().unwrap();
                    if state.image.is_some() {
                        return;
                    }
                    state.acked.push(Acked {
                        producer,
                        client: client_id,
                        sequence: ack.sequence,
                        version: ack.version,
                        key,
                        payload,
                    });
                    if state.acked.len() > crash_after {
                        state.image = Some(storage.crash(mode, crash_seed));
                        return;
                    }
                }
            }
        });
    }
    // Run until the crash, or until everything is acknowledged (then the
    // crash comes after the last ack).
    let finished = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if shared.lock().unwrap().image.is_some() {
                return;
            }
            if tasks.join_next().await.is_none() {
                return;
            }
        }
    })
    .await;
    if finished.is_err() {
        return Err(format!("{summary}: no crash and no end within 20 s"));
    }
    crash_once(&shared, &storage, mode, crash_seed);
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    drop(clients);
    drop(admin);
    server.stop().await;

    let (acked, image) = {
        let mut shared = shared.lock().unwrap();
        if !shared.errors.is_empty() {
            return Err(format!(
                "{summary}: appends failed before the crash: {:?}",
                shared.errors
            ));
        }
        (
            std::mem::take(&mut shared.acked),
            shared.image.take().expect("crashed"),
        )
    };
    // A new server on what the power loss left.
    let restarted = TestServer::start(fault_config(&image)).await;
    let state = Arc::clone(&restarted.state);
    let records = tokio::task::spawn_blocking(move || read_log(&state, "prop"))
        .await
        .unwrap();
    restarted.stop().await;

    let mut events = HashSet::new();
    let mut by_version = HashMap::new();
    for (position, record) in records.iter().enumerate() {
        if record.version != position as u64 + 1 {
            return Err(format!(
                "{summary}: version {} at position {position}: versions are not dense",
                record.version
            ));
        }
        if !events.insert(record.event) {
            return Err(format!(
                "{summary}: event id {:?} is logged twice (again at version {})",
                record.event, record.version
            ));
        }
        by_version.insert(record.version, record);
    }
    for ack in &acked {
        let Some(record) = by_version.get(&ack.version) else {
            return Err(format!(
                "{summary}: acknowledged version {} (producer {}, sequence {}) is lost; {} records recovered, {} acks",
                ack.version,
                ack.producer,
                ack.sequence,
                records.len(),
                acked.len()
            ));
        };
        if record.event.client != ack.client
            || record.event.sequence != ack.sequence
            || record.key != ack.key
            || record.payload != ack.payload
        {
            return Err(format!(
                "{summary}: version {} holds {:?} instead of producer {} sequence {}",
                ack.version, record.event, ack.producer, ack.sequence
            ));
        }
    }
    Ok(format!(
        "{summary}: {} acks checked, {} records recovered",
        acked.len(),
        records.len()
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_message_is_always_read_back_with_its_version_after_a_crash() {
    let seeds: Vec<u64> = match std::env::var("STAMPLOG_SEED") {
        Ok(seed) => vec![seed.parse().expect("STAMPLOG_SEED is a number")],
        Err(_) => (1..=SEEDS).map(|n| n.wrapping_mul(0x9E37_79B9)).collect(),
    };
    let mut failures = Vec::new();
    for seed in seeds {
        match run_seed(seed).await {
            Ok(summary) => println!("seed {seed}: {summary}"),
            Err(failure) => {
                eprintln!("seed {seed} FAILED: {failure}");
                failures.push(format!("seed {seed}: {failure}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} seeds failed (replay one with STAMPLOG_SEED=<seed>):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
