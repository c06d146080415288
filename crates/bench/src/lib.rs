//! stamplog's experiments: each reproduces a figure or table of a seed
//! document (F14), prints a table, and writes CSV, PNG and optional JSON.
//!
//! The `stamplog bench` subcommand embeds [`BenchCommand`] and calls [`run`];
//! tests call each experiment's own `run` with tiny parameters and assert on
//! the figures it returns, so no benchmark can rot unnoticed.
//!
//! | experiment | seed | what it measures |
//! | --- | --- | --- |
//! | [`logging`] | 000, Figures 2.14-2.16 | logging latency densities, end-to-end latency with and without logging, against a bare write + fdatasync |
//! | [`paged`] | 004, Tables 1 and 2 | overhead of the paged log buffer against no logging and buffering only, buffer-full rate, for 1, 2 and 3 pages |
//! | [`throughput`] | F1 group commit | messages/s and ack latency per size, durability and window; sync/memory ratio |
//! | [`memory`] | F16 limits | the server's resident memory while a slow reader lags behind a fast writer |
//! | [`patterns`] | 001, the table of seconds per million messages | the six message patterns at R = 3 per payload and durability, against the disk's limit and one fdatasync |
//! | [`duplication`] | 002, Table II | aggregate write throughput against clients for the four duplication protocols, the hybrid and no duplication |
//! | [`commit_interval`] | 003, the checkpoint interval sensitivity analysis | throughput, ack latency (p50, p99, mean) and the memory held per interval against the output commit interval T |
//! | [`failover`] | F7 | time until writes are acknowledged again after a SIGKILL of the primary (or of random servers, the kill loop), with the history checker's counts; also pauses and, in network namespaces, partitions |
//! | [`soak`] | issue 17 | `failover`'s every fault in turn at random servers for a chosen time |
//! | [`metrics`] | F15 | how long a scrape of `/metrics` takes on servers holding many streams |
//! | [`scale`] | F17, issue 20 | aggregate throughput of 1 to 100 streams written by 1 to 16 clients on separate server processes, against the disk's limit |
//! | [`growth`] | F17, issue 20 | msgs/s, latency and CPU per message as one stream's log grows to 100 million records |

pub mod commit_interval;
pub mod compute;
pub mod cpu;
pub mod discard;
pub mod duplication;
pub mod failover;
pub mod fdatasync;
pub mod floor;
pub mod growth;
pub mod harness;
pub mod limits;
pub mod logging;
pub mod loopback;
pub mod memory;
pub mod metrics;
pub mod neighbour;
pub mod network;
pub mod output;
pub mod paged;
pub mod patterns;
pub mod process;
pub mod progress;
pub mod replication;
pub mod scale;
pub mod soak;
pub mod throughput;
pub mod units;

pub use commit_interval::CommitIntervalArgs;
pub use duplication::DuplicationArgs;
pub use failover::FailoverArgs;
pub use growth::GrowthArgs;
pub use logging::LoggingArgs;
pub use memory::MemoryArgs;
pub use metrics::MetricsArgs;
pub use paged::PagedArgs;
pub use patterns::PatternsArgs;
pub use scale::ScaleArgs;
pub use soak::SoakArgs;
pub use throughput::ThroughputArgs;

/// The experiments of `stamplog bench`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum BenchCommand {
    /// Seed 000: logging latency per message size, and end-to-end latency
    /// with and without logging (Figures 2.14-2.16), against a bare
    /// write + fdatasync on the same disk.
    Logging(LoggingArgs),
    /// Seed 004: run time of a compute-and-send workload with no logging,
    /// buffering only, and the paged log with 1, 2 and 3 pages; buffer-full
    /// rate (Tables 1 and 2).
    Paged(PagedArgs),
    /// Group commit: messages/s, MB/s and ack latency per payload size,
    /// durability mode and window of messages in flight.
    Throughput(ThroughputArgs),
    /// Bounded memory: the server's RSS (run as a child process) while a
    /// writer streams messages and a slow reader lags behind.
    Memory(MemoryArgs),
    /// Seed 001: seconds to handle N messages per payload for the six
    /// message patterns (one client, three servers each a `stamplog
    /// server` process, R = 3), plus MB/s, the disk's and the loopback's
    /// limits and the window-1 ack latency against one fdatasync.
    Patterns(PatternsArgs),
    /// Seed 002: aggregate write throughput against 1 to 8 clients for
    /// server-async, server-sync, client-async, client-sync, hybrid and no
    /// duplication (four `stamplog server` processes, R = 2).
    Duplication(DuplicationArgs),
    /// Seed 003: throughput, ack latency (p50, p99, mean) and the memory
    /// held per interval (bandwidth × T) against the output commit
    /// interval T, on `stamplog server` processes (R = 1 by default).
    CommitInterval(CommitIntervalArgs),
    /// F7: separate server processes; SIGKILL the primary (or random
    /// servers), pause it, or (in network namespaces) partition it under
    /// a steady write load, report the time until writes are acknowledged
    /// again (p50, max), until the victim is a complete replica again, and
    /// the history checker's counts.
    Failover(FailoverArgs),
    /// Soak: writers and readers for `--minutes` against separate
    /// server processes (each in its own network namespace where it can
    /// be), killed, paused and partitioned at random; the history
    /// checker's counts and each fault's time to heal.
    Soak(SoakArgs),
    /// F15: the time a Prometheus scrape of `/metrics` takes (p50, p99,
    /// max) on separate server processes holding `--streams` replicated
    /// streams, with the answer's size.
    Metrics(MetricsArgs),
    /// F17: aggregate msgs/s and MB/s of 1, 10 and 100 streams written by
    /// 1, 4 and 16 clients at once, on three `stamplog server` processes,
    /// beside the disk's and the loopback's limits.
    Scale(ScaleArgs),
    /// F17: the cost per message (msgs/s, latency, CPU µs per message)
    /// as one stream's log grows to `--records` records (100 million by
    /// default), in timed slices.
    Growth(GrowthArgs),
}

/// Runs one experiment: progress bar on stderr, table on stdout, files in
/// its output folder.
pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Logging(args) => logging::run(args).map(drop),
        BenchCommand::Paged(args) => paged::run(args).map(drop),
        BenchCommand::Throughput(args) => throughput::run(args).map(drop),
        BenchCommand::Memory(args) => memory::run(args).map(drop),
        BenchCommand::Patterns(args) => patterns::run(args).map(drop),
        BenchCommand::Duplication(args) => duplication::run(args).map(drop),
        BenchCommand::CommitInterval(args) => commit_interval::run(args).map(drop),
        BenchCommand::Failover(args) => failover::run(args).map(drop),
        BenchCommand::Soak(args) => soak::run(args).map(drop),
        BenchCommand::Metrics(args) => metrics::run(args).map(drop),
        BenchCommand::Scale(args) => scale::run(args).map(drop),
        BenchCommand::Growth(args) => growth::run(args).map(drop),
    }
}
