//! `stamplog check`: judge a run after the fact. Reads the clients'
//! histories (as `stamplog demo --history` writes them) and the log of one
//! stream in each replica's data folder, without changing those folders,
//! and prints the history checker's report.

use std::path::PathBuf;

use anyhow::Context;

/// Judge clients' histories against the stream's log in each data folder.
/// Exits non-zero when any count is not 0.
#[derive(clap::Args, Debug)]
pub struct CheckArgs {
    /// A client history file (repeat for several clients).
    #[arg(long, required = true)]
    pub history: Vec<PathBuf>,
    /// A server's data folder, one per replica (repeat for several). Read
    /// only: a torn tail is left in place. Stop the server first.
    #[arg(long, required = true)]
    pub data: Vec<PathBuf>,
    /// The stream to check.
    #[arg(long)]
    pub stream: String,
    /// Check only versions up to this one (the committed version); by
    /// default every version logged.
    #[arg(long)]
    pub committed: Option<u64>,
}

pub fn run(args: CheckArgs) -> anyhow::Result<()> {
    let mut histories = Vec::new();
    for path in &args.history {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let history = checker::ClientHistory::parse_lines(&text)
            .map_err(|problem| anyhow::anyhow!("{}: {problem}", path.display()))?;
        histories.push(history);
    }
    let mut replicas = Vec::new();
    for folder in &args.data {
        replicas.push(read_replica(folder, &args.stream)?);
    }
    let report = checker::check(&histories, &replicas, args.committed);
    println!("{report}");
    anyhow::ensure!(report.is_clean(), "the history checker found violations");
    Ok(())
}

/// Reads one replica's log of `stream` from a server's data folder.
fn read_replica(folder: &std::path::Path, stream: &str) -> anyhow::Result<checker::ReplicaLog> {
    let stream_folder = folder.join("streams").join(stream);
    let meta_path = stream_folder.join("stream.json");
    let meta: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&meta_path).with_context(|| format!("reading {}", meta_path.display()))?,
    )
    .with_context(|| format!("parsing {}", meta_path.display()))?;
    let id = meta["id"]
        .as_u64()
        .with_context(|| format!("{} has no stream id", meta_path.display()))?;
    let mut records = Vec::new();
    wal::inspect(
        &wal::FileStorage,
        &stream_folder.join("log"),
        id,
        &mut |record| {
            records.push(checker::Logged {
                version: record.header.version,
                event: record.header.event,
                digest: checker::digest(record.key, record.payload),
            })
        },
    )
    .with_context(|| format!("reading the log of {stream:?} in {}", folder.display()))?;
    Ok(checker::ReplicaLog {
        replica: folder.display().to_string(),
        records,
    })
}
