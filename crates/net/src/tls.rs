//! TLS on every link, with rustls: a [`Link`] is a TCP connection, plain or
//! inside TLS; a [`Dialer`] opens links (trusting a CA, presenting a
//! certificate of its own when it has one); an [`Acceptor`] takes them on
//! the server's side and tells whether a link's certificate is the one the
//! cluster's CA issued to a given server ([`server_name`]).
//!
//! Certificates and keys are PEM files. [`make_certificates`] makes a CA,
//! a certificate for each server (valid for its server name, `localhost`,
//! `127.0.0.1`, `::1` and any hosts given, usable to serve and to dial) and
//! one for a client, as `stamplog cluster`, `stamplog demo` and
//! `stamplog certs` use them.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector, TlsStream};

pub use rustls;

/// The name a server's certificate carries, and that a peer's certificate
/// must carry for the peer to be taken for server `id`.
pub fn server_name(id: u32) -> String {
    format!("server-{id}.stamplog")
}

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {what} {path}: {detail}")]
    Read {
        what: &'static str,
        path: PathBuf,
        detail: String,
    },
    #[error("{what} {path} holds no {expected}")]
    Empty {
        what: &'static str,
        path: PathBuf,
        expected: &'static str,
    },
    #[error("TLS settings: {0}")]
    Config(String),
    #[error("making certificates: {0}")]
    Generate(String),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// ring's suites with AES-128-GCM first (TLS 1.3, then 1.2): 128-bit
/// security, and four rounds of AES per block fewer than AES-256, which
/// every byte of every message pays on each of its hops. Both ends prefer
/// it, so a stamplog cluster and its clients agree on it.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .sort_by_key(|suite| !format!("{:?}", suite.suite()).contains("AES_128_GCM"));
    Arc::new(provider)
}

/// The certificates of a PEM file (`what` names it in errors).
pub fn read_certificates(
    path: &Path,
    what: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let failed = |detail: String| TlsError::Read {
        what,
        path: path.to_path_buf(),
        detail,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|e| failed(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(e.to_string()))?;
    if certificates.is_empty() {
        return Err(TlsError::Empty {
            what,
            path: path.to_path_buf(),
            expected: "PEM certificate",
        });
    }
    Ok(certificates)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::Read {
        what: "private key",
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

fn roots(paths: &[&Path]) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for path in paths {
        for certificate in read_certificates(path, "CA file")? {
            store
                .add(certificate)
                .map_err(|e| TlsError::Config(format!("CA {}: {e}", path.display())))?;
        }
    }
    Ok(Arc::new(store))
}

fn config_error(error: impl std::fmt::Display) -> TlsError {
    TlsError::Config(error.to_string())
}

/// A certificate and its key, as PEM files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub certificate: PathBuf,
    pub key: PathBuf,
}

/// Opens links: plain TCP, or TLS trusting a CA.
#[derive(Clone, Default)]
pub struct Dialer {
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.tls.is_some() {
            "Dialer(tls)"
        } else {
            "Dialer(plain)"
        })
    }
}

impl Dialer {
    /// Plain TCP.
    pub fn plain() -> Dialer {
        Dialer::default()
    }

    /// TLS that trusts the CA in `ca` (a server's certificate must name
    /// the host dialed), presenting `identity` when the server asks for a
    /// client certificate.
    pub fn tls(ca: &Path, identity: Option<&Identity>) -> Result<Dialer, TlsError> {
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_root_certificates(roots(&[ca])?);
        let config = match identity {
            Some(identity) => builder
                .with_client_auth_cert(
                    read_certificates(&identity.certificate, "certificate")?,
                    read_key(&identity.key)?,
                )
                .map_err(config_error)?,
            None => builder.with_no_client_auth(),
        };
        Ok(Dialer {
            tls: Some(Arc::new(config)),
        })
    }

    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Connects to `address` (`HOST:PORT`) and, with TLS, completes the
    /// TLS handshake, checking the server's certificate against the CA
    /// and HOST.
    pub async fn connect(&self, address: &str) -> io::Result<Link> {
        let socket = TcpStream::connect(address).await?;
        let _ = socket.set_nodelay(true);
        let Some(config) = &self.tls else {
            return Ok(Link::Plain(socket));
        };
        let host = host_of(address);
        let name = ServerName::try_from(host.to_string()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{host:?} is not a host name or IP address"),
            )
        })?;
        let stream = TlsConnector::from(Arc::clone(config))
            .connect(name, buffered(socket))
            .await?;
        Ok(Link::Tls(Box::new(TlsStream::Client(stream))))
    }
}

/// The host of `HOST:PORT` (`[v6]:PORT` loses its brackets).
fn host_of(address: &str) -> &str {
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// The server's side of TLS.
#[derive(Clone)]
pub struct Acceptor {
    acceptor: TlsAcceptor,
    /// Checks that a certificate is the cluster CA's for a server name.
    cluster: Arc<WebPkiServerVerifier>,
}

impl Acceptor {
    /// Serves with `identity`. Clients may present a certificate (peers
    /// must): it is verified against `ca`, the cluster's CA, and
    /// `client_ca` when given.
    pub fn new(
        identity: &Identity,
        ca: &Path,
        client_ca: Option<&Path>,
    ) -> Result<Acceptor, TlsError> {
        let mut trusted = vec![ca];
        trusted.extend(client_ca);
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(&trusted)?, provider())
            .allow_unauthenticated()
            .build()
            .map_err(config_error)?;
        let config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(config_error)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                read_certificates(&identity.certificate, "certificate")?,
                read_key(&identity.key)?,
            )
            .map_err(config_error)?;
        let cluster = WebPkiServerVerifier::builder_with_provider(roots(&[ca])?, provider())
            .build()
            .map_err(config_error)?;
        Ok(Acceptor {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            cluster,
        })
    }

    /// Runs the TLS handshake on an accepted connection.
    pub async fn accept(&self, socket: TcpStream) -> io::Result<Link> {
        let stream = self.acceptor.accept(buffered(socket)).await?;
        Ok(Link::Tls(Box::new(TlsStream::Server(stream))))
    }

    /// Whether a link's certificate chain (`Link::peer_certificates`) is
    /// the one the cluster's CA issued to server `id` (one that names
    /// [`server_name`]`(id)`).
    pub fn names_server(&self, chain: Option<&[CertificateDer<'static>]>, id: u32) -> bool {
        let Some(chain) = chain else {
            return false;
        };
        let Some((end_entity, intermediates)) = chain.split_first() else {
            return false;
        };
        let Ok(name) = ServerName::try_from(server_name(id)) else {
            return false;
        };
        self.cluster
            .verify_server_cert(end_entity, intermediates, &name, &[], UnixTime::now())
            .is_ok()
    }
}

/// The TCP stream under a TLS link: reads go through a buffer of
/// [`TLS_READ_BUFFER`] bytes, since rustls asks for at most 4 KiB a
/// time and a stream of 1 KB messages would otherwise pay a read call
/// for every four.
pub type Tcp = tokio::io::BufReader<TcpStream>;

/// Bytes a TLS link reads from its socket at once.
pub const TLS_READ_BUFFER: usize = 64 * 1024;

fn buffered(socket: TcpStream) -> Tcp {
    tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, socket)
}

/// A connection: plain TCP, or TLS over TCP.
pub enum Link {
    Plain(TcpStream),
    Tls(Box<TlsStream<Tcp>>),
}

impl Link {
    /// The peer's certificate chain, when it presented one over TLS.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        match self {
            Link::Plain(_) => None,
            Link::Tls(stream) => stream.get_ref().1.peer_certificates(),
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Link::Tls(_))
    }

    /// The two directions, to be used by different tasks. A plain link's
    /// write side can be written from any thread without a task
    /// ([`LinkWriter::try_write`]); a TLS link's only through its
    /// `AsyncWrite`.
    pub fn into_split(self) -> (LinkReader, LinkWriter) {
        match self {
            Link::Plain(socket) => {
                let (reader, writer) = socket.into_split();
                (LinkReader::Plain(reader), LinkWriter::Plain(writer))
            }
            Link::Tls(stream) => {
                let (reader, writer) = tokio::io::split(*stream);
                (LinkReader::Tls(reader), LinkWriter::Tls(writer))
            }
        }
    }
}

/// A link's read side.
pub enum LinkReader {
    Plain(OwnedReadHalf),
    Tls(ReadHalf<TlsStream<Tcp>>),
}

/// A link's write side.
pub enum LinkWriter {
    Plain(OwnedWriteHalf),
    Tls(WriteHalf<TlsStream<Tcp>>),
}

impl LinkReader {
    /// The link again, from both of its halves; `None` if they are not
    /// one link's.
    pub fn reunite(self, writer: LinkWriter) -> Option<Link> {
        match (self, writer) {
            (LinkReader::Plain(reader), LinkWriter::Plain(writer)) => {
                reader.reunite(writer).ok().map(Link::Plain)
            }
            (LinkReader::Tls(reader), LinkWriter::Tls(writer)) => {
                if !reader.is_pair_of(&writer) {
                    return None;
                }
                Some(Link::Tls(Box::new(reader.unsplit(writer))))
            }
            _ => None,
        }
    }
}

impl AsyncRead for Link {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(socket) => Pin::new(socket).poll_read(cx, buf),
            Link::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Link {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Link::Plain(socket) => Pin::new(socket).poll_write(cx, buf),
            Link::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(socket) => Pin::new(socket).poll_flush(cx),
            Link::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Link::Plain(socket) => Pin::new(socket).poll_shutdown(cx),
            Link::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

impl AsyncRead for LinkReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkReader::Plain(reader) => Pin::new(reader).poll_read(cx, buf),
            LinkReader::Tls(reader) => Pin::new(reader).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkWriter::Plain(writer) => Pin::new(writer).poll_write(cx, buf),
            LinkWriter::Tls(writer) => Pin::new(writer).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWriter::Plain(writer) => Pin::new(writer).poll_flush(cx),
            LinkWriter::Tls(writer) => Pin::new(writer).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkWriter::Plain(writer) => Pin::new(writer).poll_shutdown(cx),
            LinkWriter::Tls(writer) => Pin::new(writer).poll_shutdown(cx),
        }
    }
}

/// Where [`make_certificates`] put the files.
#[derive(Clone, Debug)]
pub struct CertificateFiles {
    /// The CA's certificate: what clients and servers trust.
    pub ca: PathBuf,
    /// The CA's key (keep it to make more certificates; servers do not
    /// need it).
    pub ca_key: PathBuf,
    /// Each server's certificate and key, by id.
    pub servers: Vec<(u32, Identity)>,
    /// A client certificate (for servers given a client CA).
    pub client: Identity,
}

/// Makes a CA and, signed by it, a certificate for each server in
/// `servers` (valid for its [`server_name`], `localhost`, `127.0.0.1`,
/// `::1` and `hosts`, to serve and to dial) and one client certificate,
/// as PEM files in `folder` (keys readable by their owner only).
pub fn make_certificates(
    folder: &Path,
    servers: &[u32],
    hosts: &[String],
) -> Result<CertificateFiles, TlsError> {
    use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose};
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    std::fs::create_dir_all(folder).map_err(|source| TlsError::Write {
        path: folder.to_path_buf(),
        source,
    })?;
    let (ca_cert, ca_key) = make_ca()?;
    let ca = folder.join("ca.pem");
    let ca_key_path = folder.join("ca-key.pem");
    write_file(&ca, ca_cert.pem().as_bytes(), false)?;
    write_file(&ca_key_path, ca_key.serialize_pem().as_bytes(), true)?;
    let leaf = |names: Vec<String>, common: String, file: String| {
        let mut params = CertificateParams::new(names).map_err(generate)?;
        params.distinguished_name.push(DnType::CommonName, common);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().map_err(generate)?;
        let cert = params
            .signed_by(&key, &ca_cert, &ca_key)
            .map_err(generate)?;
        let identity = Identity {
            certificate: folder.join(format!("{file}.pem")),
            key: folder.join(format!("{file}-key.pem")),
        };
        write_file(&identity.certificate, cert.pem().as_bytes(), false)?;
        write_file(&identity.key, key.serialize_pem().as_bytes(), true)?;
        Ok::<_, TlsError>(identity)
    };
    let mut made = Vec::new();
    for &id in servers {
        let mut names = vec![
            server_name(id),
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            "::1".to_string(),
        ];
        names.extend(hosts.iter().cloned());
        let identity = leaf(names, server_name(id), format!("server-{id}"))?;
        made.push((id, identity));
    }
    let client = leaf(
        vec!["client.stamplog".to_string()],
        "stamplog client".to_string(),
        "client".to_string(),
    )?;
    Ok(CertificateFiles {
        ca,
        ca_key: ca_key_path,
        servers: made,
        client,
    })
}

/// A new self-signed CA and its key.
fn make_ca() -> Result<(rcgen::Certificate, rcgen::KeyPair), TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let generate = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "stamplog cluster CA");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().map_err(generate)?;
    let certificate = params.self_signed(&key).map_err(generate)?;
    Ok((certificate, key))
}

/// Writes a file, readable by its owner only when `secret`.
pub fn write_file(path: &Path, bytes: &[u8], secret: bool) -> Result<(), TlsError> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.create(true).write(true).truncate(true);
    if secret {
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    }
    options
        .open(path)
        .and_then(|mut file| file.write_all(bytes))
        .map_err(|source| TlsError::Write {
            path: path.to_path_buf(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_cut_from_addresses() {
        assert_eq!(host_of("127.0.0.1:7400"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7400"), "::1");
        assert_eq!(host_of("db-1.example:7400"), "db-1.example");
    }
}
