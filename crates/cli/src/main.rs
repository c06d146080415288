//! The `stamplog` binary: parses the command line and calls the libraries.

mod check;
mod cluster;
mod commands;
mod demo;
mod security;
mod server_config;

use clap::{Parser, Subcommand};

/// Every message's payload, frame and entry is allocated on one thread
/// and often freed on another (a reader task, a log thread, a replica's
/// link), in bursts when an output commit boundary releases a batch.
/// jemalloc's thread caches and arenas cost less there than the system
/// allocator's consolidation: with it `bench commit-interval` ran T = 0
/// at about 360,000 msgs/s instead of 280,000 and T = 100 ms at 0.96 to
/// 0.98 of that instead of 0.76 to 0.88 (docs/results.md, "Where the time
/// went").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// stamplog: a replicated, durably logged message service. Every
/// acknowledged message has one version shared by every replica, is on disk
/// before its acknowledgement (durability `sync`), and is read back in
/// order, exactly once, while clients retry and servers restart. Each
/// stream chooses its replication protocol (docs/protocols.md).
#[derive(Parser, Debug)]
#[command(name = "stamplog", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log events are written on stderr: `text` (one readable line
    /// each) or `json` (one JSON object per line, with the span fields:
    /// server, stream, epoch).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Which log events to write: a level (`error`, `warn`, `info`,
    /// `debug`, `trace`) or a filter per crate (`info,server=debug`). The
    /// control plane's Raft library (openraft) narrates every vote and
    /// append at `info`, so by default only its warnings are written.
    #[arg(
        long = "log",
        global = true,
        env = "STAMPLOG_LOG",
        default_value = "info,openraft=warn",
        value_name = "FILTER"
    )]
    log_filter: String,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a server: listen for clients and keep the streams' logs in a
    /// data folder.
    Server(Box<server_config::ServerArgs>),
    /// Start a local cluster of N servers (default 3) on loopback, with
    /// data folders, and serve until Ctrl-C. Prints each server's address.
    Cluster(cluster::ClusterArgs),
    /// Send messages (the arguments, or one per line of standard input) and
    /// print the version each one got.
    Send(commands::SendArgs),
    /// Print a stream's committed messages in version order.
    Tail(commands::TailArgs),
    /// Print a server's status as tables: members, placement with the
    /// in-sync sets, this server's replicas with their versions and reader
    /// lag (`--json`: the whole document).
    Status(commands::StatusArgs),
    /// Create, list or delete streams.
    Streams(commands::StreamsArgs),
    /// Take a server that has left the cluster for good out of the control
    /// plane's voters, so its majority no longer counts it. Stop the server
    /// and wait until it is removed from the view first.
    Retire(commands::RetireArgs),
    /// Start three local server processes in a temporary folder, send a
    /// workload to a stream replicated on all three, kill the primary with
    /// SIGKILL midway and restart it, read every replica back, and let the
    /// history checker count lost, duplicated and divergent messages (all
    /// must be 0).
    Demo(demo::DemoArgs),
    /// Judge clients' histories against a stream's log in each replica's
    /// data folder: lost, duplicated, conflicting, gaps, reordered,
    /// divergent (non-zero exit when any count is not 0).
    Check(check::CheckArgs),
    /// Make a token and add its entry to a token file (docs/security.md).
    Token(security::TokenArgs),
    /// Make a CA and TLS certificates for servers and a client
    /// (docs/security.md).
    Certs(security::CertsArgs),
    /// Run an experiment: print a table, write CSV, JSON and PNG plots.
    Bench {
        #[command(subcommand)]
        experiment: bench::BenchCommand,
    },
}

fn main() {
    let cli = Cli::parse();
    if let Err(error) = init_logging(cli.log_format, &cli.log_filter) {
        eprintln!("stamplog: {error:#}");
        std::process::exit(2);
    }
    let result = match cli.command {
        Command::Server(args) => server_config::run(*args),
        Command::Cluster(args) => cluster::run(args),
        Command::Send(args) => commands::send(args),
        Command::Tail(args) => commands::tail(args),
        Command::Status(args) => commands::status(args),
        Command::Streams(args) => commands::streams(args),
        Command::Retire(args) => commands::retire(args),
        Command::Demo(args) => demo::run(args),
        Command::Check(args) => check::run(args),
        Command::Token(args) => security::token(args),
        Command::Certs(args) => security::certs(args),
        Command::Bench { experiment } => bench::run(experiment),
    };
    if let Err(error) = result {
        eprintln!("stamplog: {error:#}");
        std::process::exit(1);
    }
}

/// The libraries log through `tracing` (openraft's events included); the
/// binary writes their events to stderr as text or JSON lines, filtered by
/// `--log` / `STAMPLOG_LOG` (`info,openraft=warn` by default).
fn init_logging(format: LogFormat, filter: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .map_err(|error| anyhow::anyhow!("--log {filter:?} is not a log filter: {error}"))?;
    // Colours only on a terminal: a log file gets plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.with_target(false).init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
    Ok(())
}
