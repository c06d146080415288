//! `stamplog token`: makes a token and its entry in a token file;
//! `stamplog certs`: makes a CA and certificates for servers and a client.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use server::auth::{self, Right};

/// Make a new random token and add its entry (name, SHA-256, rights) to a
/// token file. The token itself is printed once, on standard output, and
/// kept nowhere: give it to the client (`--token` or `STAMPLOG_TOKEN`).
/// A server reads its token file again within a second of a change, so a
/// token added (or an entry removed, revoking it) takes effect without a
/// restart.
#[derive(clap::Args, Debug)]
pub struct TokenArgs {
    /// The token's name, used in logs and errors (never the token).
    #[arg(long)]
    pub name: String,
    /// Stream names it may write to: a name, a prefix ending in `*`
    /// (`orders.*`), or `*` for all; repeat for more.
    #[arg(long, value_name = "NAMES")]
    pub produce: Vec<String>,
    /// Stream names it may read (fetch, subscribe).
    #[arg(long, value_name = "NAMES")]
    pub consume: Vec<String>,
    /// Stream names it may create, delete and set requirements of; `*`
    /// also lets it retire servers.
    #[arg(long, value_name = "NAMES")]
    pub admin: Vec<String>,
    /// The token file to add the entry to (made when missing); without
    /// it the entry is printed on standard error.
    #[arg(long, value_name = "FILE")]
    pub file: Option<PathBuf>,
}

pub fn token(args: TokenArgs) -> anyhow::Result<()> {
    let mut rights: Vec<(Right, &str)> = Vec::new();
    for (right, names) in [
        (Right::Produce, &args.produce),
        (Right::Consume, &args.consume),
        (Right::Admin, &args.admin),
    ] {
        rights.extend(names.iter().map(|name| (right, name.as_str())));
    }
    anyhow::ensure!(
        !rights.is_empty(),
        "give the token at least one right (--produce, --consume or --admin)"
    );
    let token = auth::new_token();
    let entry = auth::token_entry_toml(&args.name, &token, &rights);
    // The entry must parse as the server will parse it.
    auth::TokenFile::parse(&entry, std::path::Path::new("the new entry"))?;
    match &args.file {
        Some(path) => {
            add_entry(path, &args.name, &entry)?;
            eprintln!("added token {:?} to {}", args.name, path.display());
        }
        None => eprint!("{entry}"),
    }
    println!("{token}");
    Ok(())
}

/// Appends `entry` to the token file at `path` (made, readable by its
/// owner only, when missing), refusing a name the file holds already.
pub fn add_entry(path: &std::path::Path, name: &str, entry: &str) -> anyhow::Result<()> {
    let existing = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(error) => return Err(error).with_context(|| format!("reading {}", path.display())),
    };
    let combined = format!("{existing}\n{entry}");
    auth::TokenFile::parse(&combined, path)
        .with_context(|| format!("adding token {name:?} to {}", path.display()))?;
    let mut options = std::fs::OpenOptions::new();
    options.create(true).append(true);
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    file.write_all(format!("\n{entry}").as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Make a CA and, signed by it, a certificate and key for each server
/// (named `server-<id>.stamplog`, `localhost`, `127.0.0.1`, `::1` and each
/// --host) and one client certificate, as PEM files. Give each server its
/// own certificate and key and the CA (`--tls-cert`, `--tls-key`,
/// `--tls-ca`); give clients the CA (`--ca`). Keep `ca-key.pem` apart: it
/// makes more certificates.
#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Folder for the files (made when missing; files there are replaced).
    #[arg(long, value_name = "FOLDER")]
    pub out: PathBuf,
    /// Servers to make certificates for (ids 1..=N).
    #[arg(long, default_value_t = 3)]
    pub servers: u32,
    /// A host name or IP address clients reach the servers at; repeat for
    /// each.
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
}

pub fn certs(args: CertsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=1024).contains(&args.servers),
        "--servers must be between 1 and 1024"
    );
    let ids: Vec<u32> = (1..=args.servers).collect();
    let made = net::tls::make_certificates(&args.out, &ids, &args.hosts)?;
    println!("CA: {}", made.ca.display());
    for (id, identity) in &made.servers {
        println!(
            "server {id}: --tls-cert {} --tls-key {} --tls-ca {}",
            identity.certificate.display(),
            identity.key.display(),
            made.ca.display()
        );
    }
    println!(
        "client: --ca {} [--cert {} --cert-key {}]",
        made.ca.display(),
        made.client.certificate.display(),
        made.client.key.display()
    );
    Ok(())
}
