//! The numbers the data path keeps for `/metrics` ([`Metrics`]):
//! histograms of ack latency per stream, of fdatasync time, records per
//! fdatasync and append-to-durable time, and counters of refusals and
//! bytes. `crate::observe` reads them at scrape time.
//!
//! A server without an admin port keeps no metrics: its data path does
//! not time appends or acknowledgements (`ServerState::metrics` is
//! `None`), so the cost of observability is what the paired `bench
//! patterns --admin off` runs measure.

pub mod histogram;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

use proto::ErrorCode;
use wal::{SyncObserver, SyncReport};

pub use histogram::Histogram;

/// Error codes are 1..=15; one counter each (slot 0 unused).
const CODES: usize = 16;

/// The data path's instruments of one server.
pub struct Metrics {
    /// Ack latency of the writes this server acknowledges (`Append` and
    /// `Submit`), per stream id: from the write's arrival to the
    /// acknowledgement leaving it.
    acks: RwLock<HashMap<u64, Arc<Histogram>>>,
    /// Every log of this server's group commits.
    pub(crate) log: Arc<LogInstruments>,
    /// Answers refused by error code.
    refused: [AtomicU64; CODES],
    /// Bytes read from and written to client connections.
    pub(crate) client_bytes_in: AtomicU64,
    pub(crate) client_bytes_out: AtomicU64,
    /// Bytes read from peers' links.
    pub(crate) peer_bytes_in: AtomicU64,
    /// Links peers opened to this server (each reconnection counts).
    pub(crate) peer_links_accepted: AtomicU64,
    /// Peer links handed to a thread of their own, and to the runtime, as
    /// their traffic changed (`connection::peer`).
    pub(crate) peer_links_to_thread: AtomicU64,
    pub(crate) peer_links_to_runtime: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            acks: RwLock::default(),
            log: Arc::new(LogInstruments::default()),
            refused: std::array::from_fn(|_| AtomicU64::new(0)),
            client_bytes_in: AtomicU64::new(0),
            client_bytes_out: AtomicU64::new(0),
            peer_bytes_in: AtomicU64::new(0),
            peer_links_accepted: AtomicU64::new(0),
            peer_links_to_thread: AtomicU64::new(0),
            peer_links_to_runtime: AtomicU64::new(0),
        }
    }
}

impl Metrics {
    /// The metrics of a server with `config`: some, watching every log's
    /// group commits, when it has an admin port; none otherwise.
    pub(crate) fn for_config(config: &mut crate::config::ServerConfig) -> Option<Arc<Metrics>> {
        config.admin_listen?;
        let metrics = Arc::new(Metrics::default());
        config.log_observer = Some(Arc::clone(&metrics.log) as Arc<dyn SyncObserver>);
        Some(metrics)
    }

    /// The ack-latency histogram of stream `id`, made at its first ack.
    pub fn ack_latency(&self, stream: u64) -> Arc<Histogram> {
        if let Some(found) = self.acks.read().expect("acks lock").get(&stream) {
            return Arc::clone(found);
        }
        let mut acks = self.acks.write().expect("acks lock");
        Arc::clone(
            acks.entry(stream)
                .or_insert_with(|| Arc::new(Histogram::latency())),
        )
    }

    /// Notes the acknowledgement of a write that arrived at `arrived`.
    pub(crate) fn acked(histogram: &Histogram, arrived: Instant, now: Instant) {
        histogram.observe(now.saturating_duration_since(arrived).as_nanos() as u64);
    }

    /// An answer refused with `code`.
    pub(crate) fn refused(&self, code: ErrorCode) {
        self.refused[(code as usize).min(CODES - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// Answers refused so far with each code that refused any.
    pub fn refused_by_code(&self) -> Vec<(ErrorCode, u64)> {
        (1..CODES as u16)
            .filter_map(|code| {
                let count = self.refused[code as usize].load(Ordering::Relaxed);
                Some((ErrorCode::from_u16(code)?, count)).filter(|(_, n)| *n > 0)
            })
            .collect()
    }

    /// Drops the histograms of streams `keep` says are gone.
    pub(crate) fn retain_streams(&self, keep: impl Fn(u64) -> bool) {
        self.acks
            .write()
            .expect("acks lock")
            .retain(|&id, _| keep(id));
    }

    pub(crate) fn ack_histograms(&self) -> Vec<(u64, Arc<Histogram>)> {
        let acks = self.acks.read().expect("acks lock");
        acks.iter().map(|(&id, h)| (id, Arc::clone(h))).collect()
    }
}

/// The group commits of every log of a server.
pub(crate) struct LogInstruments {
    /// One write + fdatasync of a batch.
    pub(crate) sync_seconds: Histogram,
    /// Records made durable by one fdatasync.
    pub(crate) records_per_sync: Histogram,
    /// Each record's time from its append to its batch being durable.
    pub(crate) append_to_durable: Histogram,
}

impl Default for LogInstruments {
    fn default() -> Self {
        LogInstruments {
            sync_seconds: Histogram::latency(),
            records_per_sync: Histogram::counts(),
            append_to_durable: Histogram::latency(),
        }
    }
}

impl SyncObserver for LogInstruments {
    fn synced(&self, report: &SyncReport<'_>) {
        self.sync_seconds.observe(report.io.as_nanos() as u64);
        self.records_per_sync.observe(report.records);
        let durable = report.durable_at;
        self.append_to_durable.observe_all(
            report
                .appended_at()
                .map(|at| durable.saturating_duration_since(at).as_nanos() as u64),
        );
    }
}
