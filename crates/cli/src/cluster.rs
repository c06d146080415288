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
    /// Plain TCP and no tokens. By default the cluster makes a CA, server
    /// certificates and an admin token in `<data>/security` (kept when
    /// the folder is), every link is TLS and clients need the token.
    #[arg(long)]
    pub insecure: bool,
    /// Serve no admin HTTP ports (and keep no metrics). By default each
    /// server has one on a free loopback port, printed as `server <id>
    /// admin <URL>`: the status page, `/metrics`, `/status` and the health
    /// checks.
    #[arg(long)]
    pub no_admin: bool,
    /// Each `sync` log writes and fdatasyncs on its own, without the
    /// server's shared journal (for comparison; see `server
    /// --journal-bytes-max`).
    #[arg(long)]
    pub no_journal: bool,
    /// Stop, as on SIGTERM, when standard input reaches its end (see
    /// `server --stop-at-stdin-end`).
    #[arg(long, env = "STAMPLOG_STOP_AT_STDIN_END")]
    pub stop_at_stdin_end: bool,
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
        let security = if args.insecure {
            None
        } else {
            Some(server::LocalSecurity::make(&folder, args.servers)?)
        };
        let cluster = server::LocalCluster::start(args.servers, &folder, |config| {
            if let Some(security) = &security {
                security.apply(config);
            }
            if !args.no_admin {
                config.admin_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
            }
            if args.no_journal {
                config.journal_bytes_max = 0;
            }
        })
        .await
        .map_err(anyhow::Error::msg)?;
        for server in &cluster.servers {
            println!("server {} listening on {}", server.id, server.address);
            if let Some(admin) = &server.admin {
                println!("server {} admin {}", server.id, admin.url());
            }
        }
        println!(
            "cluster ready: {} servers, data in {}",
            args.servers,
            folder.display()
        );
        match &security {
            Some(security) => {
                eprintln!(
                    "TLS on every link, tokens required. A client connects with:\n  export STAMPLOG_CA={} STAMPLOG_TOKEN=$(cat {})",
                    security.ca.display(),
                    security.folder.join("admin.token").display()
                );
            }
            None => eprintln!("insecure: plain TCP, no tokens"),
        }
        eprintln!(
            "try: stamplog send --server {} --stream demo --create hello",
            cluster.address(1)
        );
        crate::server_config::shutdown_signal(args.stop_at_stdin_end).await;
        cluster.stop().await;
        anyhow::Ok(())
    })?;
    eprintln!("stamplog cluster stopped");
    Ok(())
}
