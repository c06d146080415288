//! `bench patterns`: seed 001's table of the six message patterns (F3).
//!
//! One client and three servers on this machine, as in the seed. Each
//! server runs as a `stamplog server` process of its own, as deployed
//! (`--servers-as threads`: all three in one `stamplog cluster` process);
//! the client is this process, with its own runtime. For every durability,
//! payload and pattern the client creates a stream with R = 3 and sends
//! `--messages` messages through one `Publisher` with `--window` in
//! flight. The tables give the seconds that took (the seed's figure is
//! seconds per 1 million messages) and the payload megabytes per second.
//! `unversioned` is the baseline: send to every replica and wait for each
//! ack, with no shared version.
//!
//! The same run measures the physical limits, so the figures also read as
//! ratios (these machines are shared and noisy):
//! - at each payload with a one-hop-ack-client `sync` cell, before the
//!   cells (`limits::calibrate`): the disk's limit, three writers (one per
//!   replica) each doing write + fdatasync of batches of the size a
//!   calibration burst of that payload formed in the logs, which gives
//!   the messages/s the disk allows at that batch size; and the
//!   loopback's, three connections (one per hop) carrying records of
//!   that size;
//! - the flow's: the same window-1 records through a floor of the flow
//!   (`floor::FlowFloor`: three blocking threads on loopback, the same
//!   three hops and three write + fdatasync, nothing else), so the ack
//!   reads as what the flow costs on this machine and what the service
//!   adds to it; and the same flow on tokio runtimes
//!   (`floor::RuntimeFlowFloor`: each server a task on a runtime of its
//!   own, as a `stamplog server` runs), which splits what the service
//!   adds into what the runtime costs the flow and what the service's own
//!   work costs over that;
//! - one fdatasync's: `--latency-messages` messages sent one at a time to
//!   a one-hop-ack-client `sync` stream, their ack latency next to a bare
//!   write + fdatasync of the same size taken between two messages (the
//!   disks here drift tenfold within a minute, so the two are
//!   interleaved rather than run one after the other). The log writes into a
//!   preallocated tail segment, so the comparison is a bare fdatasync into
//!   a preallocated file of the segment's size
//!   (`fdatasync::tail_segment_bytes`); the appending one (`bench logging`'s, which
//!   also commits a new file size each time) is shown beside it. The disk
//!   limit's writers use preallocated files too.
//!
//! Replicas here share one file system, and replicas on hosts of their
//! own do not: the servers' data folders are spread over its block
//! groups (`process::spread_subfolders`) and the floors' files each get
//! an inode-table block of their own (`fdatasync::SyncProbe::replicas`),
//! so no two replicas' syncs share the inode writes a tick of the clock
//! brings. The report gives how many inode-table blocks the servers'
//! window-1 segments used (3: none shared).
//!
//! Each cell is also charged the CPU time (user + system) the client and
//! each server process used for its measured messages (`cpu::CpuClock`):
//! per message and per KB, for the client, the stream's primary and its
//! backups; and the bytes the server processes wrote to storage per
//! message (their logs, journals and zeros ahead of their segments).
//!
//! The targets (issue 3): at 1 KB, `sync`, R = 3, one-hop-ack-client is the
//! fastest versioned pattern or within 10% of it and reaches 100,000
//! messages/s; the window-1 median ack latency is at most 2 × the median
//! fdatasync. Issue 20's: the window-1 median ack at most 1.3 × the flow's
//! floor.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{ensure, Context};
use clap::Parser;
use client::{Protocol, Publisher, PublisherConfig};
use indicatif::ProgressBar;
use report::plot::{Chart, Series};
use report::stats::{density, Summary};
use report::Table;

use crate::cpu::{CpuClock, CpuPerMessage};
use crate::fdatasync::{self, SyncGroup, SyncProbe};
use crate::floor::{FlowFloor, RuntimeFlowFloor};
use crate::limits::{self, DiskLimit, PayloadLimits};
use crate::neighbour::{Neighbour, NeighbourWork};
use crate::output::{self, Output, OutputArgs};
use crate::process::{ClusterOptions, ServersAs};
use crate::progress;
use crate::replication::{
    batch_of, binary_or_self, parse_protocol, payload_of, publish, publish_one_at_a_time,
    spawn_cluster, Cluster, Durability, ReplicaLog,
};
use crate::units::{fixed, format_bytes, parse_bytes, parse_switch};

/// Servers in the cluster and replicas of every stream: the seed's three.
pub const REPLICAS: usize = 3;

/// The fewest messages of a calibration burst (see `measure_limits`).
const CALIBRATION_MESSAGES_MIN: usize = 2000;

/// The payload the targets are stated at, when `--payloads` has it.
pub const HEADLINE_PAYLOAD: usize = 1000;

/// Messages sent before the window-1 latency is measured, so the first
/// connection's set-up is not counted.
const LATENCY_WARMUP: usize = 10;

/// Bins of the latency density plot.
const DENSITY_BINS: usize = 40;

/// Options of `bench patterns`.
#[derive(Parser, Debug, Clone)]
#[command(name = "patterns")]
pub struct PatternsArgs {
    /// The stamplog binary to run as the cluster (`<binary> cluster
    /// --servers 3`) [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// Messages per cell (durability × payload × pattern); the seed sent
    /// 1 million.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: usize,
    /// Payload sizes, comma separated (units B, KB = 1000, KiB = 1024).
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, default_value = "100,1000,3000,10000")]
    pub payloads: Vec<usize>,
    /// Durability of the streams, comma separated: `sync` (every replica
    /// acks after fdatasync) or `memory` (no disk).
    #[arg(long, value_delimiter = ',', value_enum, default_value = "sync,memory")]
    pub durability: Vec<Durability>,
    /// Patterns, comma separated, in the order of the table's columns.
    #[arg(
        long,
        value_delimiter = ',',
        value_parser = parse_protocol,
        default_value = "unversioned,version-request,returns-version,one-hop,one-hop-ack-client,broadcast-tag"
    )]
    pub patterns: Vec<Protocol>,
    /// Messages in flight through the publisher.
    #[arg(long, default_value_t = 256)]
    pub window: usize,
    /// Unmeasured messages each cell sends first, on its own stream and
    /// publisher, so that no cell pays for a cold cluster, fresh
    /// connections or the ramp to a full window (without them the first
    /// cell of a run measured up to a quarter slower than the same pattern
    /// measured later) [default: a fifth of --messages, at most 20,000]
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Milliseconds after which the publisher sends a message that is not
    /// done again (with the same event id).
    #[arg(long, default_value_t = 500)]
    pub retry_ms: u64,
    /// Messages sent one at a time (window 1) to a `sync`
    /// one-hop-ack-client stream to measure the ack latency, after 10
    /// unmeasured ones; after each, one bare write + fdatasync into a
    /// preallocated file, one appending to a file, three at once, one
    /// record through the flow's floor (three threads on loopback doing
    /// the same hops and syncs with nothing else), and one through the
    /// same flow on tokio runtimes (each server a task on a runtime of its
    /// own). The report gives their medians, and the ack's and the floor's
    /// p99 over their own medians: the service's tail beside the flow's;
    /// `patterns-window-one.csv` every message's figures, in order.
    #[arg(long, default_value_t = 2000)]
    pub latency_messages: usize,
    /// Payload of the window-1 latency run and of the bare fdatasync.
    #[arg(long, value_parser = parse_bytes, default_value = "1000")]
    pub latency_payload: usize,
    /// Batches each of the three disk-limit writers writes and syncs.
    #[arg(long, default_value_t = 1000)]
    pub disk_syncs: usize,
    /// Run the cluster secure, as `stamplog cluster` does by default: TLS
    /// on every link (client, peer, control) and the admin token. Without
    /// it the cluster runs `--insecure` (plain TCP), so a pair of runs
    /// with and without measures what TLS costs.
    #[arg(long)]
    pub tls: bool,
    /// Whether each server serves its admin port and keeps metrics (`on`,
    /// as `stamplog cluster` does by default) or not (`off`): a pair of
    /// runs measures what observability costs.
    #[arg(long, value_parser = parse_switch, action = clap::ArgAction::Set, default_value = "on", value_name = "on|off")]
    pub admin: bool,
    /// Whether each server's `sync` logs share its journal (`on`, as by
    /// default) or each writes and fdatasyncs on its own (`off`): a pair
    /// of runs measures what the journal changes for one stream.
    #[arg(long, value_parser = parse_switch, action = clap::ArgAction::Set, default_value = "on", value_name = "on|off")]
    pub journal: bool,
    /// Worker threads of each server's runtime (`stamplog server
    /// --runtime-workers`): servers that share this machine's cores may
    /// run better with a share each (docs/results.md, "One runtime worker
    /// per server, measured again"). Servers as processes only.
    /// [default: the server's, one per CPU]
    #[arg(long, value_name = "N")]
    pub server_workers: Option<usize>,
    /// Where the servers run: `processes` (each its own `stamplog server`
    /// process, as deployed) or `threads` (one `stamplog cluster`
    /// process, as these figures were measured before).
    #[arg(long, value_enum, default_value_t = ServersAs::Processes)]
    pub servers_as: ServersAs,
    /// A neighbour on the disk for the whole run: one thread for each size
    /// given, writing blocks of that size with `O_DSYNC` into a file of
    /// its own in the data folder, in a loop, so that every fdatasync of
    /// the run (the servers', the floor's, the disk-limit writers') waits
    /// behind theirs. A disk made slow on purpose, the same way in every
    /// run; comma separated (units B, KB = 1000, KiB = 1024), none by
    /// default.
    #[arg(long, value_delimiter = ',', value_parser = parse_bytes, value_name = "BLOCKS")]
    pub disk_neighbour: Vec<usize>,
    /// A neighbour on the CPU for the whole run: this many shell loops
    /// (`setsid sh -c 'while kill -0 BENCH; do /bin/true; done'`), each a
    /// process in a session of its own, as another program on the host,
    /// starting a short-lived process and waiting for it, again and
    /// again, so that every process of the run (the servers, the bench's
    /// client and floors) shares the cores with them; each ends with the
    /// bench, however the bench ends. A busy CPU made on purpose, the same
    /// way in every run; 0 (none) by default, at most 64.
    #[arg(long, default_value_t = 0, value_name = "LOOPS")]
    pub cpu_neighbour: usize,
    #[command(flatten)]
    pub output: OutputArgs,
}

impl Default for PatternsArgs {
    fn default() -> Self {
        PatternsArgs::parse_from(["patterns"])
    }
}

impl PatternsArgs {
    /// The unmeasured messages each cell sends first.
    pub fn warmup_messages(&self) -> usize {
        self.warmup.unwrap_or((self.messages / 5).min(20_000))
    }
}

/// What each replica's log did between `before` and `after` (a replica
/// missing from `before` counts from nothing).
fn since(after: &[ReplicaLog], before: &[ReplicaLog]) -> Vec<ReplicaLog> {
    after
        .iter()
        .map(|log| {
            let earlier = before.iter().find(|b| b.server == log.server);
            let minus =
                |field: fn(&ReplicaLog) -> u64| field(log).saturating_sub(earlier.map_or(0, field));
            ReplicaLog {
                server: log.server,
                appends: minus(|l| l.appends),
                syncs: minus(|l| l.syncs),
                records_synced: minus(|l| l.records_synced),
                bytes_written: minus(|l| l.bytes_written),
            }
        })
        .collect()
}

/// The figures of one durability × payload × pattern.
#[derive(Clone, Debug)]
pub struct PatternCell {
    pub durability: Durability,
    pub payload: usize,
    pub pattern: Protocol,
    /// Messages done (all that were sent).
    pub messages: usize,
    /// Messages a retry found already logged.
    pub duplicates: usize,
    pub seconds: f64,
    pub messages_per_second: f64,
    /// Payload megabytes (10^6) per second, as the client sent them.
    pub megabytes_per_second: f64,
    /// Time from submit to done, in microseconds, with the window full.
    pub latency: Summary,
    /// Records per fdatasync over the three replicas (`sync` only).
    pub records_per_sync: Option<f64>,
    /// Bytes each record took in the logs (`sync` only).
    pub record_bytes: Option<f64>,
    /// Every replica had logged (and synced) every message when the cell
    /// ended; false means the replicas' counters did not catch up in time.
    pub settled: bool,
    /// CPU microseconds per message of the client and of each server
    /// role, over the measured messages.
    pub cpu: CpuPerMessage,
    /// Bytes the servers wrote to storage per message, all replicas
    /// together (`None` where `/proc/<pid>/io` cannot be read).
    pub disk_bytes_per_message: Option<f64>,
}

impl PatternCell {
    /// The seed's figure: seconds to handle one million messages.
    pub fn seconds_per_million(&self) -> f64 {
        self.seconds * 1e6 / self.messages as f64
    }
}

/// Window-1 ack latency next to one bare write + fdatasync.
#[derive(Clone, Debug)]
pub struct WindowOne {
    pub payload: usize,
    /// Ack latency in microseconds.
    pub ack: Summary,
    /// Bare write + fdatasync of `payload` bytes into a preallocated file,
    /// as the log writes, in microseconds: the ratios' denominator.
    pub fdatasync: Summary,
    /// The same, appending to a growing file (each sync also commits the
    /// new size), as `bench logging` measures it.
    pub fdatasync_appending: Summary,
    /// Three bare write + fdatasync at once, one per replica, each into its
    /// own preallocated file: the time until all three are done, which is
    /// what R = 3 on one disk pays at the least.
    pub fdatasync_replicas: Summary,
    /// The flow with nothing else (`floor::FlowFloor`): a client thread,
    /// three server threads on loopback, each write + fdatasync of its
    /// own, every server acking the client. The least the flow costs here.
    pub floor: Summary,
    /// The same flow on tokio runtimes, as the service runs it
    /// (`floor::RuntimeFlowFloor`): the least it costs on them.
    pub runtime_floor: Summary,
    /// How many inode-table blocks the servers' newest segments of the
    /// window-1 stream had their inodes in (`None` if not found): R when
    /// none shares one, as on hosts of their own. Replicas whose inodes
    /// share a block, written at once, share the block's write that
    /// follows a tick of the clock (`fdatasync::SyncProbe::replicas`), so
    /// fewer blocks make the ack cheaper than a deployment's.
    pub segment_inode_blocks: Option<usize>,
    /// Each window-1 message's samples, in the order they were taken:
    /// the ack, then the probes and floors timed after it.
    pub ack_samples: Vec<f64>,
    pub fdatasync_samples: Vec<f64>,
    pub fdatasync_replicas_samples: Vec<f64>,
    pub floor_samples: Vec<f64>,
    pub runtime_floor_samples: Vec<f64>,
}

impl WindowOne {
    pub fn median_ratio(&self) -> f64 {
        self.ack.p50 / self.fdatasync.p50
    }

    pub fn p99_ratio(&self) -> f64 {
        self.ack.p99 / self.fdatasync.p50
    }

    /// The ack's p99 over its own median (issue 20: at most 4).
    pub fn tail_ratio(&self) -> f64 {
        self.ack.p99 / self.ack.p50
    }

    /// The floor's p99 over its own median: the tail the flow itself has
    /// on this disk and these cores, beside the ack's.
    pub fn floor_tail_ratio(&self) -> f64 {
        self.floor.p99 / self.floor.p50
    }

    /// The floor's median over one fdatasync's: what the flow itself costs.
    pub fn floor_ratio(&self) -> f64 {
        self.floor.p50 / self.fdatasync.p50
    }

    /// The runtime floor's median over the floor's: what the runtime
    /// itself costs the flow.
    pub fn runtime_ratio(&self) -> f64 {
        self.runtime_floor.p50 / self.floor.p50
    }

    /// The figures as the report's JSON has them.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "payload_bytes": self.payload,
            "ack_latency_us": self.ack.to_json(),
            "fdatasync_preallocated_us": self.fdatasync.to_json(),
            "fdatasync_appending_us": self.fdatasync_appending.to_json(),
            "fdatasync_replicas_at_once_us": self.fdatasync_replicas.to_json(),
            "floor_us": self.floor.to_json(),
            "floor_ratio": self.floor_ratio(),
            "runtime_floor_us": self.runtime_floor.to_json(),
            "runtime_floor_ratio": self.runtime_ratio(),
            "segment_inode_blocks": self.segment_inode_blocks,
            "median_ratio": self.median_ratio(),
            "p99_over_fdatasync_median": self.p99_ratio(),
            "p99_over_median": self.tail_ratio(),
            "floor_p99_over_median": self.floor_tail_ratio(),
        })
    }
}

/// Everything `bench patterns` measured.
#[derive(Clone, Debug)]
pub struct PatternsFigures {
    /// Messages measured per cell.
    pub messages: usize,
    /// Unmeasured messages each cell sent before them.
    pub warmup: usize,
    pub window: usize,
    pub cells: Vec<PatternCell>,
    /// The payload the targets are read at (1 KB, or the first payload).
    pub headline_payload: usize,
    /// The disk's and the loopback's limits at each payload of a `sync`
    /// one-hop-ack-client cell, measured before the cells.
    pub limits: Vec<PayloadLimits>,
    pub window_one: WindowOne,
    /// The disk neighbour's block sizes (`--disk-neighbour`).
    pub disk_neighbour: Vec<usize>,
    /// The CPU neighbour's loops (`--cpu-neighbour`).
    pub cpu_neighbour: usize,
    /// What the neighbours did during the run.
    pub neighbours: NeighbourWork,
}

impl PatternsFigures {
    pub fn cell(
        &self,
        durability: Durability,
        payload: usize,
        pattern: Protocol,
    ) -> Option<&PatternCell> {
        self.cells
            .iter()
            .find(|c| c.durability == durability && c.payload == payload && c.pattern == pattern)
    }

    /// The fastest pattern that gives every replica one shared version.
    pub fn fastest_versioned(
        &self,
        durability: Durability,
        payload: usize,
    ) -> Option<&PatternCell> {
        self.cells
            .iter()
            .filter(|c| c.durability == durability && c.payload == payload)
            .filter(|c| c.pattern != Protocol::Unversioned)
            .max_by(|a, b| a.messages_per_second.total_cmp(&b.messages_per_second))
    }

    /// The disk's limit at the headline payload.
    pub fn disk(&self) -> Option<&DiskLimit> {
        let limits = self
            .limits
            .iter()
            .find(|l| l.payload == self.headline_payload);
        limits.map(|limits| &limits.disk)
    }

    /// The one-hop-ack-client `sync` cell at the headline payload.
    pub fn headline(&self) -> Option<&PatternCell> {
        self.cell(
            Durability::Sync,
            self.headline_payload,
            Protocol::OneHopAckClient,
        )
    }
}

/// Runs the experiment, prints its tables, writes its files.
pub fn run(args: PatternsArgs) -> anyhow::Result<PatternsFigures> {
    validate(&args)?;
    let binary = binary_or_self(&args.server_binary)?;
    let data = args.output.data_folder("patterns")?;
    let headline_payload = if args.payloads.contains(&HEADLINE_PAYLOAD) {
        HEADLINE_PAYLOAD
    } else {
        args.payloads[0]
    };
    let bar = progress::bar(planned_steps(&args), "patterns", args.output.quiet);
    let neighbour = Neighbour::start(data.path(), &args.disk_neighbour, args.cpu_neighbour)?;
    let runtime = output::runtime()?;
    let options = ClusterOptions {
        secure: args.tls,
        admin: args.admin,
        servers_as: args.servers_as,
        journal: args.journal,
        runtime_workers: args.server_workers,
    };
    let process = spawn_cluster(&binary, REPLICAS, data.path(), options)?;
    let cluster = runtime.block_on(Cluster::connect(process))?;
    let limits = runtime.block_on(measure_limits(&cluster, &args, data.path(), &bar))?;
    let cells = runtime.block_on(measure_cells(&cluster, &args, &bar))?;
    bar.set_message("window-1 latency and bare fdatasync");
    let samples = runtime.block_on(window_one_latency(&cluster, &args, data.path(), &bar))?;
    cluster.stop()?;
    drop(runtime);
    let neighbours = neighbour.stop()?;
    bar.finish_and_clear();
    let figures = PatternsFigures {
        messages: args.messages,
        warmup: args.warmup_messages(),
        window: args.window,
        cells,
        headline_payload,
        limits,
        window_one: WindowOne {
            payload: args.latency_payload,
            ack: Summary::of(&samples.ack),
            fdatasync: Summary::of(&samples.preallocated),
            fdatasync_appending: Summary::of(&samples.appending),
            fdatasync_replicas: Summary::of(&samples.replicas),
            floor: Summary::of(&samples.floor),
            runtime_floor: Summary::of(&samples.runtime_floor),
            segment_inode_blocks: samples.segment_inode_blocks,
            ack_samples: samples.ack,
            fdatasync_samples: samples.preallocated,
            fdatasync_replicas_samples: samples.replicas,
            floor_samples: samples.floor,
            runtime_floor_samples: samples.runtime_floor,
        },
        disk_neighbour: args.disk_neighbour.clone(),
        cpu_neighbour: args.cpu_neighbour,
        neighbours,
    };
    write_report(&args, &figures)?;
    Ok(figures)
}

fn validate(args: &PatternsArgs) -> anyhow::Result<()> {
    ensure!(
        !args.payloads.is_empty() && !args.durability.is_empty() && !args.patterns.is_empty(),
        "--payloads, --durability and --patterns each need at least one value"
    );
    ensure!(
        args.messages > 0 && args.latency_messages > 0 && args.disk_syncs > 0,
        "--messages, --latency-messages and --disk-syncs must be at least 1"
    );
    ensure!(args.window > 0, "--window must be at least 1");
    ensure!(
        !args.durability.contains(&Durability::Sender),
        "bench patterns compares sync and memory; sender-based logging applies to the forward protocols only (bench logging and bench failover measure it)"
    );
    ensure!(
        args.payloads
            .iter()
            .chain([&args.latency_payload])
            .all(|size| *size <= 1024 * 1024),
        "payloads above 1 MiB exceed the server's message limit"
    );
    Ok(())
}

/// Progress steps: every message, every disk-limit sync, every latency
/// sample.
fn planned_steps(args: &PatternsArgs) -> u64 {
    let cells = args.durability.len() * args.payloads.len() * args.patterns.len();
    let disk = if args.durability.contains(&Durability::Sync)
        && args.patterns.contains(&Protocol::OneHopAckClient)
    {
        REPLICAS * args.disk_syncs * args.payloads.len()
    } else {
        0
    };
    (cells * args.messages + disk + 4 * args.latency_messages + LATENCY_WARMUP) as u64
}

fn publisher_config(args: &PatternsArgs, cluster: &Cluster, window: usize) -> PublisherConfig {
    PublisherConfig {
        window,
        credentials: cluster.credentials().clone(),
        retry: Duration::from_millis(args.retry_ms.max(1)),
        ..PublisherConfig::default()
    }
}

/// The disk's and the loopback's limits at each payload, when the run
/// has `sync` one-hop-ack-client cells, measured before the cells
/// (`limits::calibrate`), so that neither the cells' write-back slows the
/// disk's measurement nor the measurement's the cells.
async fn measure_limits(
    cluster: &Cluster,
    args: &PatternsArgs,
    folder: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<PayloadLimits>> {
    let measured = args.durability.contains(&Durability::Sync)
        && args.patterns.contains(&Protocol::OneHopAckClient);
    let mut limits = Vec::new();
    for &payload in args.payloads.iter().filter(|_| measured) {
        let burst = limits::Burst {
            payload,
            messages: args.warmup_messages().max(CALIBRATION_MESSAGES_MIN),
            config: publisher_config(args, cluster, args.window),
        };
        let probe = (REPLICAS, args.disk_syncs, folder);
        limits.extend(limits::calibrate(cluster, burst, probe, bar).await?);
    }
    Ok(limits)
}

async fn measure_cells(
    cluster: &Cluster,
    args: &PatternsArgs,
    bar: &ProgressBar,
) -> anyhow::Result<Vec<PatternCell>> {
    let mut cells = Vec::new();
    for &durability in &args.durability {
        for &payload in &args.payloads {
            for &pattern in &args.patterns {
                bar.set_message(format!(
                    "{} {} {}",
                    durability.name(),
                    format_bytes(payload),
                    pattern.name()
                ));
                cells.push(run_cell(cluster, args, durability, payload, pattern, bar).await?);
            }
        }
    }
    Ok(cells)
}

async fn run_cell(
    cluster: &Cluster,
    args: &PatternsArgs,
    durability: Durability,
    payload: usize,
    pattern: Protocol,
    bar: &ProgressBar,
) -> anyhow::Result<PatternCell> {
    let name = format!(
        "patterns-{}-{payload}-{}",
        durability.name(),
        pattern.name()
    );
    let info = cluster
        .create(&name, durability, pattern, REPLICAS as u8)
        .await?;
    let publisher = Publisher::connect(&info, publisher_config(args, cluster, args.window))
        .await
        .with_context(|| format!("cannot connect a publisher to {name}"))?;
    let bytes = payload_of(payload);
    let publishers = std::slice::from_ref(&publisher);
    let warmup = args.warmup_messages();
    if warmup > 0 {
        publish(
            publishers,
            args.window,
            &bytes,
            warmup,
            &ProgressBar::hidden(),
        )
        .await
        .with_context(|| format!("warming up {name} failed"))?;
    }
    let before = cluster.replica_logs(&info).await?;
    let clock = CpuClock::start(&cluster.pids())?;
    let run = publish(publishers, args.window, &bytes, args.messages, bar)
        .await
        .with_context(|| format!("publishing to {name} failed"))?;
    let cpu = clock.per_message(run.messages, info.primary)?;
    let disk_bytes_per_message = clock.written_per_message(run.messages);
    drop(publisher);
    let (logs, settled) = cluster
        .settled_replica_logs(&info, durability, (warmup + run.messages) as u64)
        .await?;
    let logs = since(&logs, &before);
    // The cell's logs are of no further use; deleting them keeps the disk
    // and the servers' log threads from piling up over many cells.
    cluster.delete(&info).await?;
    let batch = match durability {
        Durability::Sync => batch_of(&logs),
        Durability::Memory | Durability::Sender => None,
    };
    let seconds = run.seconds();
    Ok(PatternCell {
        durability,
        payload,
        pattern,
        messages: run.messages,
        duplicates: run.duplicates,
        seconds,
        messages_per_second: run.messages as f64 / seconds,
        megabytes_per_second: (run.messages * payload) as f64 / seconds / 1e6,
        latency: Summary::of(&run.latencies_us),
        records_per_sync: batch.map(|(records, _)| records),
        record_bytes: batch.map(|(_, bytes)| bytes),
        settled,
        cpu,
        disk_bytes_per_message,
    })
}

/// The window-1 samples, in microseconds.
struct WindowOneSamples {
    ack: Vec<f64>,
    preallocated: Vec<f64>,
    appending: Vec<f64>,
    replicas: Vec<f64>,
    floor: Vec<f64>,
    runtime_floor: Vec<f64>,
    segment_inode_blocks: Option<usize>,
}

impl WindowOneSamples {
    fn with_capacity(samples: usize) -> WindowOneSamples {
        WindowOneSamples {
            ack: Vec::with_capacity(samples),
            preallocated: Vec::with_capacity(samples),
            appending: Vec::with_capacity(samples),
            replicas: Vec::with_capacity(samples),
            floor: Vec::with_capacity(samples),
            runtime_floor: Vec::with_capacity(samples),
            segment_inode_blocks: None,
        }
    }
}

/// Sends messages one at a time to a fresh `sync` one-hop-ack-client
/// stream, and after each ack one bare write + fdatasync into a
/// preallocated file, one appending, three at once (one per replica), and
/// one record through the flow's floor (`floor::FlowFloor`) and one
/// through the same flow on runtimes (`floor::RuntimeFlowFloor`):
/// interleaved, so the messages and the probes see the disk in the same
/// state, and nothing is in flight during a probe.
async fn window_one_latency(
    cluster: &Cluster,
    args: &PatternsArgs,
    folder: &Path,
    bar: &ProgressBar,
) -> anyhow::Result<WindowOneSamples> {
    let info = cluster
        .create(
            "patterns-window-one",
            Durability::Sync,
            Protocol::OneHopAckClient,
            REPLICAS as u8,
        )
        .await?;
    let publisher = Publisher::connect(&info, publisher_config(args, cluster, 1))
        .await
        .context("cannot connect the window-1 publisher")?;
    let publisher = std::sync::Arc::new(publisher);
    let payload: std::sync::Arc<[u8]> = payload_of(args.latency_payload).into();
    publish_one_at_a_time(&publisher, &payload, LATENCY_WARMUP, bar).await?;
    let size = args.latency_payload;
    let mut preallocated = SyncProbe::preallocated(folder, size, args.latency_messages)?;
    let mut appending = SyncProbe::appending(folder, size)?;
    let mut together = replicas_at_once(folder, size, args.latency_messages)?;
    let mut floor = FlowFloor::start(folder, size, args.latency_messages + LATENCY_WARMUP)?;
    let mut runtime_floor =
        RuntimeFlowFloor::start(folder, size, args.latency_messages + LATENCY_WARMUP)?;
    for _ in 0..LATENCY_WARMUP {
        (floor, _) = sample_off_runtime(floor, FlowFloor::sample).await?;
        runtime_floor.sample().await?;
    }
    let mut samples = WindowOneSamples::with_capacity(args.latency_messages);
    for _ in 0..args.latency_messages {
        samples
            .ack
            .extend(publish_one_at_a_time(&publisher, &payload, 1, bar).await?);
        let (probe, latency) = sample_off_runtime(preallocated, SyncProbe::sample).await?;
        preallocated = probe;
        samples.preallocated.push(latency);
        let (probe, latency) = sample_off_runtime(appending, SyncProbe::sample).await?;
        appending = probe;
        samples.appending.push(latency);
        let (probe, latency) = sample_off_runtime(floor, FlowFloor::sample).await?;
        floor = probe;
        samples.floor.push(latency);
        samples.runtime_floor.push(runtime_floor.sample().await?);
        let (group, latency) = sample_off_runtime(together, SyncGroup::sample).await?;
        together = group;
        samples.replicas.push(latency);
        bar.inc(3);
    }
    drop(publisher);
    samples.segment_inode_blocks = newest_segments(folder, &info.name)
        .and_then(|segments| fdatasync::inode_blocks_of(&segments).ok());
    cluster.delete(&info).await?;
    preallocated.finish()?;
    appending.finish()?;
    together.finish()?;
    floor.finish()?;
    tokio::task::spawn_blocking(move || runtime_floor.finish())
        .await
        .context("the runtime floor panicked")??;
    Ok(samples)
}

/// [`REPLICAS`] probes that sync at once, one per replica, each file's
/// inode in a block of its own (`SyncProbe::replicas`).
fn replicas_at_once(folder: &Path, size: usize, samples: usize) -> anyhow::Result<SyncGroup> {
    let names: Vec<String> = (0..REPLICAS)
        .map(|replica| format!("replica-{replica}-{size}"))
        .collect();
    SyncGroup::start(SyncProbe::replicas(folder, &names, size, samples)?)
}

/// Each server's newest segment of `stream` under the cluster's data in
/// `folder` (`Servers::start`), or `None` unless every one of the
/// [`REPLICAS`] servers has one.
fn newest_segments(folder: &Path, stream: &str) -> Option<Vec<PathBuf>> {
    let servers = std::fs::read_dir(folder.join("cluster")).ok()?;
    let mut segments = Vec::new();
    for server in servers.flatten() {
        let log = server.path().join("streams").join(stream).join("log");
        let Ok(files) = std::fs::read_dir(&log) else {
            continue;
        };
        let newest = files
            .flatten()
            .filter_map(|file| {
                wal::segment::parse_segment_name(&file.file_name().to_string_lossy())
            })
            .max();
        segments.extend(newest.map(|base| wal::segment::segment_path(&log, base)));
    }
    (segments.len() == REPLICAS).then_some(segments)
}

/// One probe's sample on a blocking thread, so no runtime worker waits on
/// the disk.
async fn sample_off_runtime<P: Send + 'static>(
    mut probe: P,
    sample: fn(&mut P) -> anyhow::Result<f64>,
) -> anyhow::Result<(P, f64)> {
    tokio::task::spawn_blocking(move || {
        let latency = sample(&mut probe);
        latency.map(|latency| (probe, latency))
    })
    .await
    .context("a bare fdatasync probe panicked")?
}

/// Seed 001's table for one durability: seconds per payload and pattern.
pub fn seconds_table(figures: &PatternsFigures, durability: Durability) -> Table {
    pattern_table(
        figures,
        durability,
        format!(
            "Seconds to handle {} messages (after {} unmeasured), durability {}, R = {REPLICAS}, window {} (seed 001)",
            figures.messages,
            figures.warmup,
            durability.name(),
            figures.window
        ),
        |cell| fixed(cell.seconds, 2),
    )
}

/// Payload megabytes per second per payload and pattern.
pub fn megabytes_table(figures: &PatternsFigures, durability: Durability) -> Table {
    pattern_table(
        figures,
        durability,
        format!(
            "Payload MB/s, durability {}, R = {REPLICAS}, window {}",
            durability.name(),
            figures.window
        ),
        |cell| fixed(cell.megabytes_per_second, 1),
    )
}

fn pattern_table(
    figures: &PatternsFigures,
    durability: Durability,
    title: String,
    value: impl Fn(&PatternCell) -> String,
) -> Table {
    let patterns = patterns_of(figures);
    let mut columns = vec!["payload"];
    columns.extend(patterns.iter().map(|p| p.name()));
    let mut table = Table::new(title, &columns);
    for payload in payloads_of(figures) {
        let mut row = vec![format_bytes(payload)];
        for &pattern in &patterns {
            row.push(
                figures
                    .cell(durability, payload, pattern)
                    .map(&value)
                    .unwrap_or_else(|| "-".into()),
            );
        }
        table.row(row);
    }
    table
}

fn patterns_of(figures: &PatternsFigures) -> Vec<Protocol> {
    let mut patterns: Vec<Protocol> = Vec::new();
    for cell in &figures.cells {
        if !patterns.contains(&cell.pattern) {
            patterns.push(cell.pattern);
        }
    }
    patterns
}

fn payloads_of(figures: &PatternsFigures) -> Vec<usize> {
    let mut payloads: Vec<usize> = figures.cells.iter().map(|c| c.payload).collect();
    payloads.sort_unstable();
    payloads.dedup();
    payloads
}

fn durabilities_of(figures: &PatternsFigures) -> Vec<Durability> {
    let mut durabilities: Vec<Durability> = Vec::new();
    for cell in &figures.cells {
        if !durabilities.contains(&cell.durability) {
            durabilities.push(cell.durability);
        }
    }
    durabilities
}

/// One row per cell with every figure.
pub fn cells_table(figures: &PatternsFigures) -> Table {
    let mut table = Table::new(
        format!(
            "Every cell: {} messages each, R = {REPLICAS}, window {}",
            figures.messages, figures.window
        ),
        &[
            "durability",
            "payload",
            "pattern",
            "messages",
            "seconds",
            "s per 1M",
            "msgs/s",
            "MB/s",
            "ack p50 µs",
            "ack p99 µs",
            "records per sync",
            "bytes per record",
            "duplicates",
            "settled",
        ],
    );
    for cell in &figures.cells {
        table.row(vec![
            cell.durability.name().to_string(),
            format_bytes(cell.payload),
            cell.pattern.name().to_string(),
            cell.messages.to_string(),
            fixed(cell.seconds, 3),
            fixed(cell.seconds_per_million(), 1),
            fixed(cell.messages_per_second, 0),
            fixed(cell.megabytes_per_second, 2),
            fixed(cell.latency.p50, 0),
            fixed(cell.latency.p99, 0),
            cell.records_per_sync
                .map_or_else(|| "-".into(), |r| fixed(r, 1)),
            cell.record_bytes
                .map_or_else(|| "-".into(), |b| fixed(b, 0)),
            cell.duplicates.to_string(),
            if cell.settled { "yes" } else { "no" }.to_string(),
        ]);
    }
    table
}

/// CPU per message and per KB of payload, by role, for every `sync`
/// one-hop-ack-client cell (every cell when there is none).
pub fn cpu_table(figures: &PatternsFigures) -> Table {
    let mut table = Table::new(
        "CPU per message and per KB of payload (user + system, µs); primary and backup: their server processes (- when the servers share one process), backup the mean of the backups; servers disk: the bytes every server process sent to storage per message (KB, /proc/<pid>/io)",
        &[
            "durability",
            "payload",
            "pattern",
            "client /msg",
            "primary /msg",
            "backup /msg",
            "servers /msg",
            "client /KB",
            "primary /KB",
            "backup /KB",
            "servers disk KB/msg",
        ],
    );
    let headline = |c: &&PatternCell| {
        c.durability == Durability::Sync && c.pattern == Protocol::OneHopAckClient
    };
    let chosen: Vec<&PatternCell> = match figures.cells.iter().any(|c| headline(&c)) {
        true => figures.cells.iter().filter(headline).collect(),
        false => figures.cells.iter().collect(),
    };
    let show = |value: Option<f64>| value.map_or_else(|| "-".into(), |v| fixed(v, 2));
    for cell in chosen {
        let per_kb = cell.cpu.per_kilobyte(cell.payload);
        table.row(vec![
            cell.durability.name().to_string(),
            format_bytes(cell.payload),
            cell.pattern.name().to_string(),
            fixed(cell.cpu.client, 2),
            show(cell.cpu.primary),
            show(cell.cpu.backup),
            fixed(cell.cpu.servers, 2),
            fixed(per_kb.client, 2),
            show(per_kb.primary),
            show(per_kb.backup),
            show(cell.disk_bytes_per_message.map(|b| b / 1000.0)),
        ]);
    }
    table
}

/// The targets and the physical limits, each with its figure.
pub fn limits_table(figures: &PatternsFigures) -> Table {
    let headline = format_bytes(figures.headline_payload);
    let mut table = Table::new(
        format!("Against the targets (issue 3) and the disk, {headline}, sync, R = {REPLICAS}"),
        &["measure", "value", "target", "met"],
    );
    headline_rows(&mut table, figures);
    disk_rows(&mut table, figures);
    window_one_rows(&mut table, &figures.window_one);
    table
}

/// One row of the limits table; `ok` says whether its target is met.
fn limit_row(table: &mut Table, measure: String, value: String, target: &str, ok: Option<bool>) {
    let met = ok.map_or_else(
        || "-".to_string(),
        |ok| if ok { "yes" } else { "no" }.to_string(),
    );
    table.row(vec![measure, value, target.to_string(), met]);
}

/// The headline cell against its targets and the other patterns.
fn headline_rows(table: &mut Table, figures: &PatternsFigures) {
    let mut row = |measure: String, value: String, target: &str, ok: Option<bool>| {
        limit_row(table, measure, value, target, ok)
    };
    let headline_cell = figures.headline();
    if let Some(cell) = headline_cell {
        let rate = cell.messages_per_second;
        row(
            "one-hop-ack-client msgs/s".into(),
            fixed(rate, 0),
            ">= 100000",
            Some(rate >= 100_000.0),
        );
        if let Some(fastest) = figures.fastest_versioned(Durability::Sync, figures.headline_payload)
        {
            row(
                "fastest versioned pattern".into(),
                format!(
                    "{} ({} msgs/s)",
                    fastest.pattern.name(),
                    fixed(fastest.messages_per_second, 0)
                ),
                "-",
                None,
            );
            let ratio = rate / fastest.messages_per_second;
            row(
                "one-hop-ack-client / fastest versioned".into(),
                fixed(ratio, 3),
                ">= 0.90",
                Some(ratio >= 0.90),
            );
        }
        if let Some(base) = figures.cell(
            Durability::Sync,
            figures.headline_payload,
            Protocol::Unversioned,
        ) {
            row(
                "one-hop-ack-client / unversioned".into(),
                fixed(rate / base.messages_per_second, 2),
                "-",
                None,
            );
        }
        if let Some(memory) = figures.cell(
            Durability::Memory,
            figures.headline_payload,
            Protocol::OneHopAckClient,
        ) {
            row(
                "one-hop-ack-client sync / memory".into(),
                fixed(rate / memory.messages_per_second, 2),
                "-",
                None,
            );
        }
        if let Some(records) = cell.records_per_sync {
            row(
                "log records per fdatasync (3 replicas)".into(),
                fixed(records, 1),
                "-",
                None,
            );
        }
    }
}

/// The disk's own limit, measured in the same run, beside the headline.
fn disk_rows(table: &mut Table, figures: &PatternsFigures) {
    let mut row = |measure: String, value: String, target: &str, ok: Option<bool>| {
        limit_row(table, measure, value, target, ok)
    };
    let headline_cell = figures.headline();
    if let Some(disk) = figures.disk() {
        row(
            format!(
                "disk limit: {} writers, write + fdatasync of {} B, msgs/s",
                disk.writers, disk.batch_bytes
            ),
            fixed(disk.messages_per_second, 0),
            "-",
            None,
        );
        row(
            "disk limit: one batch's write + fdatasync p50 µs".into(),
            fixed(disk.sync_latency.p50, 0),
            "-",
            None,
        );
        if let Some(cell) = headline_cell {
            row(
                "one-hop-ack-client / disk limit".into(),
                fixed(cell.messages_per_second / disk.messages_per_second, 2),
                "-",
                None,
            );
        }
    }
}

/// One message in flight: the ack against a bare fdatasync and the flow's
/// floor.
fn window_one_rows(table: &mut Table, one: &WindowOne) {
    let mut row = |measure: String, value: String, target: &str, ok: Option<bool>| {
        limit_row(table, measure, value, target, ok)
    };
    let size = format_bytes(one.payload);
    row(
        format!("window-1 ack latency p50 µs ({size})"),
        fixed(one.ack.p50, 0),
        "-",
        None,
    );
    row(
        format!("window-1 ack latency p99 µs ({size})"),
        fixed(one.ack.p99, 0),
        "-",
        None,
    );
    row(
        format!("bare write + fdatasync p50 µs ({size}, preallocated)"),
        fixed(one.fdatasync.p50, 0),
        "-",
        None,
    );
    row(
        format!("bare write + fdatasync p99 µs ({size}, preallocated)"),
        fixed(one.fdatasync.p99, 0),
        "-",
        None,
    );
    row(
        format!("bare write + fdatasync p50 µs ({size}, appending)"),
        fixed(one.fdatasync_appending.p50, 0),
        "-",
        None,
    );
    row(
        format!("{REPLICAS} bare write + fdatasync at once, p50 µs ({size})"),
        fixed(one.fdatasync_replicas.p50, 0),
        "-",
        None,
    );
    window_one_ratios(table, one);
}

/// The window-1 ack and the flow's floor as ratios to the disk's syncs.
fn window_one_ratios(table: &mut Table, one: &WindowOne) {
    let size = format_bytes(one.payload);
    let median = one.median_ratio();
    limit_row(
        table,
        "ack p50 / fdatasync p50".into(),
        fixed(median, 2),
        "<= 2 (issue 3; brief: 1.5)",
        Some(median <= 2.0),
    );
    let floors = [
        (
            format!("ack p50 / {REPLICAS} fdatasync at once p50"),
            fixed(one.ack.p50 / one.fdatasync_replicas.p50, 2),
        ),
        (
            format!("the flow's floor p50 µs ({size}): 3 hops, {REPLICAS} write + fdatasync, blocking threads"),
            fixed(one.floor.p50, 0),
        ),
        (
            "floor p50 / fdatasync p50 (what the flow itself costs)".into(),
            fixed(one.floor_ratio(), 2),
        ),
    ];
    figure_rows(table, floors);
    let added = one.ack.p50 / one.floor.p50;
    limit_row(
        table,
        "ack p50 / floor p50 (what the service adds)".into(),
        fixed(added, 2),
        "<= 1.3 (issue 20)",
        Some(added <= 1.3),
    );
    let runtime = [
        (
            format!("the flow's floor on runtimes p50 µs ({size}): each server a task on a tokio runtime of its own"),
            fixed(one.runtime_floor.p50, 0),
        ),
        (
            "runtime floor p50 / floor p50 (what the runtime costs the flow)".into(),
            fixed(one.runtime_ratio(), 2),
        ),
        (
            "ack p50 / runtime floor p50 (what the service's own work adds)".into(),
            fixed(one.ack.p50 / one.runtime_floor.p50, 2),
        ),
    ];
    figure_rows(table, runtime);
    limit_row(
        table,
        format!("inode-table blocks of the servers' {REPLICAS} segments ({REPLICAS}: none shared, as on hosts of their own)"),
        one.segment_inode_blocks
            .map_or("-".into(), |blocks| blocks.to_string()),
        "-",
        None,
    );
    let tail = one.p99_ratio();
    limit_row(
        table,
        "ack p99 / fdatasync p50".into(),
        fixed(tail, 2),
        "<= 4 (brief)",
        Some(tail <= 4.0),
    );
    window_one_tails(table, one);
}

/// The window-1 ack's tail over its own median, beside the flow's floor's:
/// what the service's tail would be with nothing of the service.
fn window_one_tails(table: &mut Table, one: &WindowOne) {
    let size = format_bytes(one.payload);
    let tail = one.tail_ratio();
    limit_row(
        table,
        "ack p99 / ack p50".into(),
        fixed(tail, 2),
        "<= 4 (issue 20)",
        Some(tail <= 4.0),
    );
    let floors = [
        (
            format!("the flow's floor p99 µs ({size})"),
            fixed(one.floor.p99, 0),
        ),
        (
            "floor p99 / floor p50 (the flow's own tail here)".into(),
            fixed(one.floor_tail_ratio(), 2),
        ),
        (
            "ack p99 / floor p99 (what the service adds to the tail)".into(),
            fixed(one.ack.p99 / one.floor.p99, 2),
        ),
    ];
    figure_rows(table, floors);
}

/// Rows of figures that have no target of their own.
fn figure_rows(table: &mut Table, rows: impl IntoIterator<Item = (String, String)>) {
    for (measure, value) in rows {
        limit_row(table, measure, value, "-", None);
    }
}

/// Every window-1 message with what was timed after it, in order: how
/// the ack and the floors moved over the run, which the medians hide.
fn window_one_samples(one: &WindowOne) -> Table {
    let mut table = Table::new(
        format!(
            "Window-1 samples in order, µs ({})",
            format_bytes(one.payload)
        ),
        &[
            "message",
            "ack",
            "floor",
            "runtime floor",
            "bare write + fdatasync",
            "3 at once",
        ],
    );
    let columns = [
        &one.ack_samples,
        &one.floor_samples,
        &one.runtime_floor_samples,
        &one.fdatasync_samples,
        &one.fdatasync_replicas_samples,
    ];
    for message in 0..one.ack_samples.len() {
        let mut row = vec![(message + 1).to_string()];
        row.extend(
            columns
                .iter()
                .map(|samples| samples.get(message).map_or("-".into(), |us| fixed(*us, 0))),
        );
        table.row(row);
    }
    table
}

fn write_report(args: &PatternsArgs, figures: &PatternsFigures) -> anyhow::Result<()> {
    let mut output = Output::new(args.output.out_folder("patterns"))?;
    let mut tables = Vec::new();
    for durability in durabilities_of(figures) {
        let seconds = seconds_table(figures, durability);
        let megabytes = megabytes_table(figures, durability);
        print!("{}", seconds.render());
        println!();
        print!("{}", megabytes.render());
        println!();
        output.csv(&format!("patterns-{}-seconds", durability.name()), &seconds)?;
        output.csv(&format!("patterns-{}-mbps", durability.name()), &megabytes)?;
        output.png(
            &format!("patterns-{}", durability.name()),
            &seconds_chart(figures, durability),
        )?;
        tables.push(seconds.to_json());
        tables.push(megabytes.to_json());
    }
    let rates: Vec<limits::Rate> = figures
        .cells
        .iter()
        .filter(|c| c.durability == Durability::Sync && c.pattern == Protocol::OneHopAckClient)
        .map(|c| (c.payload, c.messages_per_second, c.megabytes_per_second))
        .collect();
    let per_payload = limits::table(&figures.limits, &rates);
    shown(
        &mut output,
        &mut tables,
        "patterns-limits-per-payload",
        &per_payload,
    )?;
    shown(
        &mut output,
        &mut tables,
        "patterns-cpu",
        &cpu_table(figures),
    )?;
    let limits = limits_table(figures);
    print!("{}", limits.render());
    print_neighbours(figures);
    let cells = cells_table(figures);
    output.csv("patterns-limits", &limits)?;
    output.csv("patterns-cells", &cells)?;
    output.png("patterns-latency", &latency_chart(figures))?;
    output.csv(
        "patterns-window-one",
        &window_one_samples(&figures.window_one),
    )?;
    tables.push(limits.to_json());
    tables.push(cells.to_json());
    output.json(args.output.json.as_deref(), &figures_json(figures, tables))?;
    output.announce();
    Ok(())
}

/// Prints `table`, writes it as `<name>.csv` and keeps it for the JSON.
fn shown(
    output: &mut Output,
    tables: &mut Vec<serde_json::Value>,
    name: &str,
    table: &Table,
) -> anyhow::Result<()> {
    print!("{}", table.render());
    println!();
    output.csv(name, table)?;
    tables.push(table.to_json());
    Ok(())
}

/// The run's figures as `--json` writes them, with its `tables`.
fn figures_json(figures: &PatternsFigures, tables: Vec<serde_json::Value>) -> serde_json::Value {
    serde_json::json!({
        "experiment": "patterns",
        "messages_per_cell": figures.messages,
        "window": figures.window,
        "replicas": REPLICAS,
        "headline_payload_bytes": figures.headline_payload,
        "tables": tables,
        "cells": figures.cells.iter().map(cell_json).collect::<Vec<_>>(),
        "disk_limit": figures.disk().map(|disk| disk.to_json()),
        "limits": figures.limits.iter().map(PayloadLimits::to_json).collect::<Vec<_>>(),
        "window_one": figures.window_one.to_json(),
        "disk_neighbour": {
            "blocks_bytes": figures.disk_neighbour,
            "writes": figures.neighbours.writes,
        },
        "cpu_neighbour": {
            "loops": figures.cpu_neighbour,
            "cpu_seconds": figures.neighbours.cpu.as_secs_f64(),
            "seconds": figures.neighbours.cpu_wall.as_secs_f64(),
        },
    })
}

/// The run's neighbours (`--disk-neighbour`, `--cpu-neighbour`), when it
/// had them.
fn print_neighbours(figures: &PatternsFigures) {
    let NeighbourWork {
        writes,
        cpu,
        cpu_wall,
    } = figures.neighbours;
    if !figures.disk_neighbour.is_empty() {
        let sizes: Vec<String> = figures
            .disk_neighbour
            .iter()
            .map(|b| format_bytes(*b))
            .collect();
        println!(
            "Beside a disk neighbour writing with O_DSYNC in blocks of {} ({writes} writes in the run)",
            sizes.join(", ")
        );
    }
    let loops = figures.cpu_neighbour;
    if loops > 0 {
        println!(
            "Beside a CPU neighbour: {loops} shell loop(s) starting /bin/true, {:.1} CPU-seconds in {:.1} s",
            cpu.as_secs_f64(),
            cpu_wall.as_secs_f64()
        );
    }
}

fn cell_json(cell: &PatternCell) -> serde_json::Value {
    serde_json::json!({
        "durability": cell.durability.name(),
        "payload_bytes": cell.payload,
        "pattern": cell.pattern.name(),
        "messages": cell.messages,
        "duplicates": cell.duplicates,
        "seconds": cell.seconds,
        "seconds_per_million": cell.seconds_per_million(),
        "messages_per_second": cell.messages_per_second,
        "megabytes_per_second": cell.megabytes_per_second,
        "ack_latency_us": cell.latency.to_json(),
        "records_per_sync": cell.records_per_sync,
        "record_bytes": cell.record_bytes,
        "settled": cell.settled,
        "cpu_us_per_message": {
            "client": cell.cpu.client,
            "primary": cell.cpu.primary,
            "backup": cell.cpu.backup,
            "servers": cell.cpu.servers,
        },
        "servers_disk_bytes_per_message": cell.disk_bytes_per_message,
    })
}

/// Seconds per million messages against the payload, one line per
/// pattern, for one durability.
fn seconds_chart(figures: &PatternsFigures, durability: Durability) -> Chart {
    let mut chart = Chart::lines(
        format!(
            "Seconds per million messages, {}, R = {REPLICAS}, window {}",
            durability.name(),
            figures.window
        ),
        "payload (bytes)",
        "seconds per 1M messages",
    );
    chart.log_x = true;
    for pattern in patterns_of(figures) {
        let points = figures
            .cells
            .iter()
            .filter(|c| c.durability == durability && c.pattern == pattern)
            .map(|c| (c.payload as f64, c.seconds_per_million()))
            .collect();
        chart.add(Series::new(pattern.name(), points));
    }
    chart
}

/// Densities of the window-1 ack latency and of the bare fdatasync.
fn latency_chart(figures: &PatternsFigures) -> Chart {
    let one = &figures.window_one;
    let mut chart = Chart::lines(
        format!(
            "Window-1 ack latency (sync, one-hop-ack-client, R = {REPLICAS}) and one fdatasync, {}",
            format_bytes(one.payload)
        ),
        "latency (µs)",
        "density",
    );
    chart.log_x = true;
    chart.add(Series::new(
        "ack latency",
        density(&one.ack_samples, DENSITY_BINS),
    ));
    chart.add(Series::new(
        "write + fdatasync, preallocated file",
        density(&one.fdatasync_samples, DENSITY_BINS),
    ));
    chart.add(Series::new(
        format!("{REPLICAS} write + fdatasync at once"),
        density(&one.fdatasync_replicas_samples, DENSITY_BINS),
    ));
    chart
}
