//! `bench soak` (issue 17): writers and readers for a chosen time against
//! a cluster of separate server processes, while servers are killed,
//! paused and partitioned at random; the history checker's counts and the
//! time each fault took to heal at the end.
//!
//! It is `bench failover --fault mixed --victims random` sized by time:
//! `--minutes` at `--rate` messages a second, with `--faults-per-minute`
//! faults spread evenly over the run, each lasting `--fault-ms`. With
//! `--network namespaces` (the default where network namespaces can be
//! made) every server has its own address and the faults include
//! partitions, one-way partitions, flapping links and minority partitions;
//! on loopback they are SIGKILLs and pauses only, and the soak says so.

use std::path::PathBuf;

use clap::Parser;

use crate::failover::{self, FailoverArgs, FailoverFigures, Fault, Network, Victims};
use crate::network::Namespaces;
use crate::output::OutputArgs;
use crate::replication::Durability;

/// Options of `bench soak`.
#[derive(Parser, Debug, Clone)]
#[command(name = "soak")]
pub struct SoakArgs {
    /// The stamplog binary to run as the servers [default: this program].
    #[arg(long, value_name = "PATH")]
    pub server_binary: Option<PathBuf>,
    /// How long the writers write, in minutes (the run lasts a little
    /// longer: the last fault is healed and every replica read back).
    #[arg(long, default_value_t = 30.0)]
    pub minutes: f64,
    /// Faults per minute, spread evenly over the run.
    #[arg(long, default_value_t = 1.2)]
    pub faults_per_minute: f64,
    /// How long a pause or a network fault lasts, in milliseconds.
    #[arg(long, default_value_t = 4_000)]
    pub fault_ms: u64,
    /// Server processes in the cluster.
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// Messages per second the writer offers.
    #[arg(long, default_value_t = 2_000)]
    pub rate: u64,
    /// Payload bytes of each message.
    #[arg(long, value_parser = crate::units::parse_bytes, default_value = "200")]
    pub payload: usize,
    /// Where the servers run [default: `namespaces` where they can be
    /// made, else `loopback`, without network faults].
    #[arg(long, value_enum)]
    pub network: Option<Network>,
    /// Seed of the random victims.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// The failover loop a soak runs.
pub fn failover_args(args: &SoakArgs, network: Network) -> anyhow::Result<FailoverArgs> {
    anyhow::ensure!(args.minutes > 0.0, "--minutes must be above 0");
    anyhow::ensure!(args.rate > 0, "--rate must be at least 1");
    anyhow::ensure!(
        args.faults_per_minute >= 0.0,
        "--faults-per-minute must not be negative"
    );
    let seconds = args.minutes * 60.0;
    Ok(FailoverArgs {
        server_binary: args.server_binary.clone(),
        servers: args.servers,
        messages: (seconds * args.rate as f64).ceil().max(1.0) as u64,
        kills: (args.minutes * args.faults_per_minute).round() as u32,
        victims: Victims::Random,
        fault: Fault::Mixed,
        fault_ms: args.fault_ms,
        network,
        rate: args.rate,
        payload: args.payload,
        durability: Durability::Sync,
        output: args.output.clone(),
        ..FailoverArgs::default()
    })
}

pub fn run(args: SoakArgs) -> anyhow::Result<FailoverFigures> {
    let network = match args.network {
        Some(network) => network,
        None => match Namespaces::unavailable() {
            None => Network::Namespaces,
            Some(why) => {
                eprintln!(
                    "soak: network namespaces cannot be made here ({why}); the servers run on \
                     loopback and the faults are SIGKILLs and pauses only"
                );
                Network::Loopback
            }
        },
    };
    failover::run(failover_args(&args, network)?)
}
