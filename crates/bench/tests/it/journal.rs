//! The server's journal on a real `stamplog server` process killed with
//! SIGKILL: six `sync` streams written at once (so the server's rounds
//! hold several streams and go through the journal), a kill with
//! messages in flight, a restart that redoes the journal, and the history
//! checker on every stream.

use std::time::Duration;

use bench::process::ServerProcess;
use client::{
    Client, ClientConfig, DurabilityConfig, PendingPublish, Publisher, PublisherConfig, StreamInfo,
};

use crate::stamplog_binary;

const STREAMS: usize = 6;
const BEFORE: u64 = 300;
const DURING: u64 = 300;

/// Each stream's info, publisher, history and messages not yet answered.
pub(crate) struct Streams {
    pub(crate) infos: Vec<StreamInfo>,
    pub(crate) publishers: Vec<Publisher>,
    pub(crate) histories: Vec<checker::ClientHistory>,
    pub(crate) pending: Vec<Vec<PendingPublish>>,
}

impl Streams {
    /// No streams yet.
    pub(crate) fn new(count: usize) -> Streams {
        Streams {
            infos: Vec::new(),
            publishers: Vec::new(),
            histories: vec![checker::ClientHistory::default(); count],
            pending: (0..count).map(|_| Vec::new()).collect(),
        }
    }

    /// Submits messages `from..to` to every stream, a message to each in
    /// turn, so the server's rounds hold several streams.
    pub(crate) async fn submit(&mut self, from: u64, to: u64) {
        for index in from..to {
            for (stream, publisher) in self.publishers.iter().enumerate() {
                let mut payload = vec![index as u8; 300];
                payload[..8].copy_from_slice(&index.to_le_bytes());
                let sent = publisher.submit(b"", &payload).await.unwrap();
                self.histories[stream].sent.push(checker::Sent {
                    event: sent.event,
                    digest: checker::digest(b"", &payload),
                });
                self.pending[stream].push(sent);
            }
        }
    }

    /// Waits for every answer and notes each acknowledgement.
    pub(crate) async fn settle(&mut self) {
        for (stream, pending) in self.pending.iter_mut().enumerate() {
            for sent in pending.drain(..) {
                let published = tokio::time::timeout(Duration::from_secs(30), sent)
                    .await
                    .expect("acknowledged within 30 s")
                    .unwrap();
                self.histories[stream].acked.push(checker::Acked {
                    event: published.event,
                    version: published.version,
                    duplicate: published.duplicate,
                });
            }
        }
    }
}

#[test]
fn streams_sharing_the_journal_lose_nothing_acknowledged_to_a_sigkill() {
    let folder = tempfile::tempdir().unwrap();
    let binary = stamplog_binary();
    let data = folder.path().join("server");
    let log = |start: u32| folder.path().join(format!("server-start-{start}.log"));
    // Six streams are few: without this the server would write each
    // stream's log on its own rather than through the journal.
    let journal = ["--journal-few-logs".to_string(), "0".to_string()];
    let server =
        ServerProcess::spawn_with(&binary, &data, "127.0.0.1:0", &log(1), &journal).unwrap();
    let address = server.address;
    let runtime = crate::two_worker_runtime();
    let mut streams = runtime.block_on(async {
        let client = Client::connect(ClientConfig::new(address.to_string()))
            .await
            .unwrap();
        let mut streams = Streams::new(STREAMS);
        for index in 0..STREAMS {
            let info = client
                .create_stream(&format!("j{index}"), DurabilityConfig::Sync)
                .await
                .unwrap();
            let config = PublisherConfig {
                client_id: Some(100 + index as u128),
                ..PublisherConfig::default()
            };
            streams
                .publishers
                .push(Publisher::connect(&info, config).await.unwrap());
            streams.infos.push(info);
        }
        streams.submit(0, BEFORE).await;
        streams.settle().await;
        // More in flight when the kill comes.
        streams.submit(BEFORE, BEFORE + DURING).await;
        streams
    });
    server.kill().unwrap();
    let server =
        ServerProcess::spawn_with(&binary, &data, &address.to_string(), &log(2), &journal).unwrap();
    runtime.block_on(async {
        streams.settle().await;
        let replicas = [(1, address.to_string())];
        for (info, history) in streams.infos.iter().zip(&streams.histories) {
            assert_eq!(history.acked.len() as u64, BEFORE + DURING);
            let (report, _) = bench::failover::read_logs(
                &replicas,
                info,
                std::slice::from_ref(history),
                &client::Credentials::default(),
            )
            .await
            .unwrap();
            assert!(report.is_clean(), "stream {}: {report}", info.name);
        }
    });
    let restarted = std::fs::read_to_string(log(2)).unwrap();
    assert!(
        restarted.contains("redid the journal"),
        "the restarted server redid its journal: {restarted}"
    );
    drop(server);
}
