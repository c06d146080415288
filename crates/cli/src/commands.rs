//! The client commands: `send`, `tail`, `status` and `streams`.

use std::io::BufRead;

use anyhow::Context;
use client::{Client, ClientConfig, DurabilityConfig};

/// Where the server is.
#[derive(clap::Args, Debug, Clone)]
pub struct ServerAddress {
    /// Server address (host:port).
    #[arg(
        long,
        short = 's',
        default_value = "127.0.0.1:7400",
        env = "STAMPLOG_SERVER"
    )]
    pub server: String,
}

/// A durability mode and its settings.
#[derive(clap::Args, Debug, Clone)]
pub struct DurabilityArgs {
    /// `sync`: ack after write + fdatasync (group commit); nothing
    /// acknowledged is lost by a crash. `paged`: ack once copied into a
    /// page buffer of `--pages` x `--page-size` bytes written in the
    /// background; a crash loses at most what the pages held. `memory`: no
    /// disk; a crash or restart loses everything.
    #[arg(long, default_value = "sync", value_parser = ["sync", "paged", "memory"])]
    pub durability: String,
    /// Pages of the `paged` buffer.
    #[arg(long, default_value_t = 2)]
    pub pages: u16,
    /// Bytes per page of the `paged` buffer; must hold the largest message.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub page_size: u32,
}

impl DurabilityArgs {
    pub fn config(&self) -> DurabilityConfig {
        match self.durability.as_str() {
            "memory" => DurabilityConfig::Memory,
            "paged" => DurabilityConfig::Paged {
                pages: self.pages,
                page_size: self.page_size,
            },
            _ => DurabilityConfig::Sync,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct SendArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    /// Stream to send to.
    #[arg(long)]
    pub stream: String,
    /// Create the stream first if it does not exist.
    #[arg(long)]
    pub create: bool,
    #[command(flatten)]
    pub durability: DurabilityArgs,
    /// Key of every message sent.
    #[arg(long, default_value = "")]
    pub key: String,
    /// Messages to send; without any, each line of standard input is one.
    pub messages: Vec<String>,
}

#[derive(clap::Args, Debug)]
pub struct TailArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    /// Stream to read.
    #[arg(long)]
    pub stream: String,
    /// First version to print.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Stop after this many messages (default: all committed so far, or
    /// forever with --follow).
    #[arg(long)]
    pub count: Option<u64>,
    /// Keep waiting for new messages.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub address: ServerAddress,
}

#[derive(clap::Args, Debug)]
pub struct StreamsArgs {
    #[command(flatten)]
    pub address: ServerAddress,
    #[command(subcommand)]
    pub action: StreamsAction,
}

#[derive(clap::Subcommand, Debug)]
pub enum StreamsAction {
    /// List the streams with their versions.
    List,
    /// Create a stream.
    Create {
        name: String,
        #[command(flatten)]
        durability: DurabilityArgs,
    },
    /// Delete a stream and its log.
    Delete { name: String },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")
}

async fn connect(address: &ServerAddress) -> anyhow::Result<Client> {
    let mut config = ClientConfig::new(address.server.clone());
    // A command-line user wants an answer, not endless retries.
    config.request_timeout = std::time::Duration::from_secs(10);
    Ok(Client::connect(config).await?)
}

pub fn send(args: SendArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        let stream = match client.open_stream(&args.stream).await {
            Ok(info) => info,
            Err(client::ClientError::Server {
                code: client::ErrorCode::UnknownStream,
                ..
            }) if args.create => {
                client
                    .create_stream(&args.stream, args.durability.config())
                    .await?
            }
            Err(error) => {
                return Err(error).with_context(|| format!("opening stream {:?}", args.stream))
            }
        };
        let mut producer = client.producer(stream.id);
        let messages: Box<dyn Iterator<Item = std::io::Result<String>>> =
            if args.messages.is_empty() {
                Box::new(std::io::stdin().lock().lines())
            } else {
                Box::new(args.messages.into_iter().map(Ok))
            };
        let mut pending = std::collections::VecDeque::new();
        for message in messages {
            let message = message.context("reading standard input")?;
            pending.push_back(
                producer
                    .submit(args.key.as_bytes(), message.as_bytes())
                    .await?,
            );
            // Print answers as they come, keeping the window full.
            while pending.len() > 64 {
                print_ack(pending.pop_front().expect("not empty").await?);
            }
        }
        for ack in pending {
            print_ack(ack.await?);
        }
        Ok(())
    })
}

fn print_ack(ack: client::Ack) {
    let duplicate = if ack.duplicate { " duplicate" } else { "" };
    println!(
        "version {} epoch {} {:?}{duplicate}",
        ack.version, ack.epoch, ack.level
    );
}

pub fn tail(args: TailArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        let stream = client.open_stream(&args.stream).await?;
        let end = match (args.count, args.follow) {
            (Some(count), _) => args.from.saturating_add(count).saturating_sub(1),
            (None, true) => u64::MAX,
            (None, false) => stream.committed_version,
        };
        if end < args.from {
            return Ok(());
        }
        let mut subscription = client.subscribe(stream.id, args.from).await?;
        while let Some(record) = subscription.next().await {
            let record = record?;
            println!(
                "{}\t{}\t{}",
                record.version,
                String::from_utf8_lossy(&record.key),
                String::from_utf8_lossy(&record.payload)
            );
            if record.version >= end {
                break;
            }
        }
        Ok(())
    })
}

pub fn status(args: StatusArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        let json: serde_json::Value = serde_json::from_str(&client.status().await?)?;
        println!("{}", serde_json::to_string_pretty(&json)?);
        Ok(())
    })
}

pub fn streams(args: StreamsArgs) -> anyhow::Result<()> {
    runtime()?.block_on(async {
        let client = connect(&args.address).await?;
        match args.action {
            StreamsAction::List => {
                let mut table = report::Table::new(
                    "streams",
                    &["name", "id", "durability", "first", "last", "committed"],
                );
                for info in client.list_streams().await? {
                    table.row(vec![
                        info.name,
                        format!("{:016x}", info.id),
                        format!("{:?}", info.durability),
                        info.first_version.to_string(),
                        info.last_version.to_string(),
                        info.committed_version.to_string(),
                    ]);
                }
                table.print();
            }
            StreamsAction::Create { name, durability } => {
                let info = client.create_stream(&name, durability.config()).await?;
                println!(
                    "created {} ({:016x}, {:?})",
                    info.name, info.id, info.durability
                );
            }
            StreamsAction::Delete { name } => {
                client.delete_stream(&name).await?;
                println!("deleted {name}");
            }
        }
        Ok(())
    })
}
