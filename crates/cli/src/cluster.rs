//! `stamplog cluster`: a local cluster of N servers in this process, on
//! loopback, for development and the experiments.

use std::path::PathBuf;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct ClusterArgs {
    /// Servers in the cluster (ids 1..=N).
    #[arg(long, default_value_t = 3)]
    pub servers: usize,
    /// Folder for the servers' data (`server-<id>` each); a temporary
    /// folder, removed at exit, when not given.
    #[arg(long)]
    pub data: Option<PathBuf>,
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=64).contains(&args.servers),
        "--servers must be between 1 and 64"
    );
    let temporary = match &args.data {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("creating a temporary data folder")?),
    };
    let folder = args
        .data
        .clone()
        .unwrap_or_else(|| temporary.as_ref().expect("made above").path().to_path_buf());
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let cluster = server::LocalCluster::start(args.servers, &folder, |_| {})
            .await
            .map_err(anyhow::Error::msg)?;
        for server in &cluster.servers {
            println!("server {} listening on {}", server.id, server.address);
        }
        println!(
            "cluster ready: {} servers, data in {}",
            args.servers,
            folder.display()
        );
        eprintln!(
            "try: stamplog send --server {} --stream demo --create hello",
            cluster.address(1)
        );
        crate::server_config::shutdown_signal().await;
        cluster.stop().await;
        anyhow::Ok(())
    })?;
    eprintln!("stamplog cluster stopped");
    Ok(())
}
