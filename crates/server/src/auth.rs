//! Who a connection speaks for and what it may do.
//!
//! A server given a token file (`tokens`) lets a client in only with a
//! token the file knows. The file is TOML; each `[[token]]` has a `name`
//! (what logs and errors say: the token itself never appears in either),
//! the SHA-256 of the token in hex (`sha256`), and the stream names the
//! token may `produce` to, `consume` from and `admin`ister (create, delete,
//! set requirements; `admin = ["*"]` also retires servers). A name is a
//! stream's exact name, a prefix ending in `*` (`"orders.*"`), or `"*"`
//! for every stream. Tokens are long random strings (`stamplog token`
//! makes one), so a plain SHA-256 is enough to keep the file from
//! revealing them; presented tokens are hashed and compared with every
//! entry in constant time.
//!
//! The file is read again when it changes (checked at most once a second,
//! at a login or a request), so a token is added or revoked without a
//! restart; a connection whose token was revoked is refused from its next
//! request on.
//!
//! A connection opened with `ServerHello` speaks for another server (its
//! certificate names it when TLS is on) and may do anything, including
//! `CreateReplica`, which no client may send. A server without a token
//! file lets every client do everything but `CreateReplica`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use engine::replication::ServerId;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a request needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    Produce,
    Consume,
    Admin,
}

impl Right {
    pub fn name(self) -> &'static str {
        match self {
            Right::Produce => "produce",
            Right::Consume => "consume",
            Right::Admin => "admin",
        }
    }
}

/// Stream names a right covers: exact names, prefixes (`a.*`) or all (`*`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Names(Vec<String>);

impl Names {
    fn covers(&self, stream: &str) -> bool {
        self.0
            .iter()
            .any(|pattern| match pattern.strip_suffix('*') {
                Some(prefix) => stream.starts_with(prefix),
                None => pattern == stream,
            })
    }

    fn covers_all(&self) -> bool {
        self.0.iter().any(|pattern| pattern == "*")
    }
}

/// One token of the file.
#[derive(Clone, Debug)]
pub struct TokenEntry {
    pub name: String,
    hash: [u8; 32],
    produce: Names,
    consume: Names,
    admin: Names,
}

impl TokenEntry {
    fn names(&self, right: Right) -> &Names {
        match right {
            Right::Produce => &self.produce,
            Right::Consume => &self.consume,
            Right::Admin => &self.admin,
        }
    }
}

/// Why a token file was not taken.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error("cannot read the token file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the token file {path} is not valid: {message}")]
    Invalid { path: PathBuf, message: String },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToml {
    #[serde(default)]
    token: Vec<EntryToml>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EntryToml {
    name: String,
    sha256: String,
    #[serde(default)]
    produce: Vec<String>,
    #[serde(default)]
    consume: Vec<String>,
    #[serde(default)]
    admin: Vec<String>,
}

/// The tokens of one reading of the file.
#[derive(Clone, Debug, Default)]
pub struct TokenFile {
    entries: Vec<TokenEntry>,
}

impl TokenFile {
    /// Parses the file's text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<TokenFile, TokenFileError> {
        let invalid = |message: String| TokenFileError::Invalid {
            path: path.to_path_buf(),
            message,
        };
        let file: FileToml = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut entries = Vec::new();
        for entry in file.token {
            let mut hash = [0u8; 32];
            hex::decode_to_slice(entry.sha256.trim(), &mut hash).map_err(|e| {
                invalid(format!(
                    "token {:?}: sha256 must be 64 hex digits ({e})",
                    entry.name
                ))
            })?;
            for pattern in entry
                .produce
                .iter()
                .chain(&entry.consume)
                .chain(&entry.admin)
            {
                // A `*` may only end the pattern (the last character may
                // be any, so cut by characters, not bytes).
                let star_inside = pattern.strip_suffix('*').unwrap_or(pattern).contains('*');
                if pattern.is_empty() || star_inside {
                    return Err(invalid(format!(
                        "token {:?}: {pattern:?} is not a stream name, a prefix ending in * or *",
                        entry.name
                    )));
                }
            }
            if entries.iter().any(|e: &TokenEntry| e.name == entry.name) {
                return Err(invalid(format!("two tokens are named {:?}", entry.name)));
            }
            entries.push(TokenEntry {
                name: entry.name,
                hash,
                produce: Names(entry.produce),
                consume: Names(entry.consume),
                admin: Names(entry.admin),
            });
        }
        Ok(TokenFile { entries })
    }

    /// The entry whose hash is the token's; every entry is compared, in
    /// constant time.
    pub fn find(&self, token: &str) -> Option<&TokenEntry> {
        let hash = hash_token(token);
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&hash)) {
                found = Some(entry);
            }
        }
        found
    }

    fn by_name(&self, name: &str) -> Option<&TokenEntry> {
        self.entries.iter().find(|entry| entry.name == name)
    }
}

/// The SHA-256 of a token, as the file holds it.
pub fn hash_token(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// The line of a token file for a new token: its `[[token]]` table.
pub fn token_entry_toml(name: &str, token: &str, rights: &[(Right, &str)]) -> String {
    let mut text = format!(
        "[[token]]\nname = {name:?}\nsha256 = \"{}\"\n",
        hex::encode(hash_token(token))
    );
    for right in [Right::Produce, Right::Consume, Right::Admin] {
        let names: Vec<String> = rights
            .iter()
            .filter(|(r, _)| *r == right)
            .map(|(_, names)| format!("{names:?}"))
            .collect();
        if !names.is_empty() {
            text.push_str(&format!("{} = [{}]\n", right.name(), names.join(", ")));
        }
    }
    text
}

/// A new random token: 32 random bytes in hex, prefixed `stl_`.
pub fn new_token() -> String {
    let high = proto::random_u128().to_le_bytes();
    let low = proto::random_u128().to_le_bytes();
    format!("stl_{}{}", hex::encode(high), hex::encode(low))
}

/// How often the file's modification time is looked at.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// The server's token file, read again when it changes.
pub struct Tokens {
    path: PathBuf,
    current: RwLock<Arc<TokenFile>>,
    /// Bumped at every reading that changed the file.
    generation: AtomicU64,
    /// When the file was last looked at, and its modification time then.
    checked: Mutex<(Instant, Option<SystemTime>)>,
}

impl Tokens {
    /// Reads the file; an unreadable or invalid file is an error here (at
    /// start). Later readings that fail keep the tokens already read.
    pub fn open(path: &Path) -> Result<Tokens, TokenFileError> {
        let (file, modified) = read_file(path)?;
        Ok(Tokens {
            path: path.to_path_buf(),
            current: RwLock::new(Arc::new(file)),
            generation: AtomicU64::new(1),
            checked: Mutex::new((Instant::now(), modified)),
        })
    }

    /// The tokens now, having read the file again if it changed.
    pub fn current(&self) -> (u64, Arc<TokenFile>) {
        self.reload_if_changed();
        let file = Arc::clone(&self.current.read().expect("tokens lock poisoned"));
        (self.generation.load(Ordering::Acquire), file)
    }

    /// The generation of the tokens: a connection whose rights were
    /// worked out under an older one works them out again.
    pub fn generation(&self) -> u64 {
        self.reload_if_changed();
        self.generation.load(Ordering::Acquire)
    }

    fn reload_if_changed(&self) {
        let mut checked = self.checked.lock().expect("tokens lock poisoned");
        if checked.0.elapsed() < RELOAD_CHECK {
            return;
        }
        checked.0 = Instant::now();
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        if modified == checked.1 {
            return;
        }
        match read_file(&self.path) {
            Ok((file, modified)) => {
                checked.1 = modified;
                *self.current.write().expect("tokens lock poisoned") = Arc::new(file);
                self.generation.fetch_add(1, Ordering::AcqRel);
                tracing::info!(path = %self.path.display(), "token file read again");
            }
            Err(error) => {
                tracing::warn!("{error}; keeping the tokens read before");
            }
        }
    }

    /// Makes the next `current` look at the file (tests, and a reload on
    /// demand).
    pub fn check_now(&self) {
        let mut checked = self.checked.lock().expect("tokens lock poisoned");
        checked.0 = Instant::now() - RELOAD_CHECK;
    }
}

fn read_file(path: &Path) -> Result<(TokenFile, Option<SystemTime>), TokenFileError> {
    let read = |source| TokenFileError::Read {
        path: path.to_path_buf(),
        source,
    };
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(read)?;
    let text = std::fs::read_to_string(path).map_err(read)?;
    Ok((TokenFile::parse(&text, path)?, Some(modified)))
}

/// Who a connection speaks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// No token file: every client may do everything a client may.
    Open,
    /// Another server of the cluster (`ServerHello`).
    Server(ServerId),
    /// A client that presented the token of this name.
    Token(String),
}

/// A request that is not allowed, with what to tell the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Unauthorized(pub String);

/// A connection's principal with its rights as of a generation of the
/// token file, worked out again when the file changes.
pub struct Access {
    principal: Principal,
    tokens: Option<Arc<Tokens>>,
    seen: Option<(u64, Option<TokenEntry>)>,
}

impl Access {
    pub fn new(principal: Principal, tokens: Option<Arc<Tokens>>) -> Access {
        Access {
            principal,
            tokens,
            seen: None,
        }
    }

    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    /// Whether the connection is another server's.
    pub fn is_server(&self) -> bool {
        matches!(self.principal, Principal::Server(_))
    }

    /// Whether `right` on stream `name` is allowed; the error names the
    /// right that is missing.
    pub fn check(&mut self, right: Right, name: &str) -> Result<(), Unauthorized> {
        let label = match &self.principal {
            Principal::Open | Principal::Server(_) => return Ok(()),
            Principal::Token(label) => label.clone(),
        };
        match self.entry() {
            Some(entry) if entry.names(right).covers(name) => Ok(()),
            Some(_) => Err(Unauthorized(format!(
                "token {label:?} lacks the {} right on stream {name:?}",
                right.name()
            ))),
            None => Err(revoked(&label)),
        }
    }

    /// Whether `right` is allowed on every stream (retiring a server
    /// needs `admin` on `*`).
    pub fn check_all(&mut self, right: Right) -> Result<(), Unauthorized> {
        let label = match &self.principal {
            Principal::Open | Principal::Server(_) => return Ok(()),
            Principal::Token(label) => label.clone(),
        };
        match self.entry() {
            Some(entry) if entry.names(right).covers_all() => Ok(()),
            Some(_) => Err(Unauthorized(format!(
                "token {label:?} lacks the {} right on every stream (\"*\")",
                right.name()
            ))),
            None => Err(revoked(&label)),
        }
    }

    /// Whether any right on stream `name` is allowed (opening it, seeing
    /// it in a list).
    pub fn may_see(&mut self, name: &str) -> bool {
        [Right::Produce, Right::Consume, Right::Admin]
            .into_iter()
            .any(|right| self.check(right, name).is_ok())
    }

    /// The token's entry in the current file; `None` once revoked.
    fn entry(&mut self) -> Option<&TokenEntry> {
        let Principal::Token(label) = &self.principal else {
            return None;
        };
        let tokens = self.tokens.as_ref()?;
        let generation = tokens.generation();
        if self
            .seen
            .as_ref()
            .is_none_or(|(seen, _)| *seen != generation)
        {
            let (generation, file) = tokens.current();
            self.seen = Some((generation, file.by_name(label).cloned()));
        }
        self.seen.as_ref().and_then(|(_, entry)| entry.as_ref())
    }
}

fn revoked(label: &str) -> Unauthorized {
    Unauthorized(format!(
        "token {label:?} was revoked (it is no longer in the token file)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> TokenFile {
        TokenFile::parse(text, Path::new("tokens.toml")).expect("valid")
    }

    #[test]
    fn names_cover_exact_prefix_and_all() {
        let names = Names(vec!["orders".into(), "a.*".into()]);
        assert!(names.covers("orders"));
        assert!(!names.covers("orders2"));
        assert!(names.covers("a.x"));
        assert!(!names.covers("b"));
        assert!(!names.covers("a"));
        assert!(!names.covers_all());
        assert!(Names(vec!["*".into()]).covers("anything"));
    }

    #[test]
    fn a_token_is_found_by_its_hash_only() {
        let text = token_entry_toml("writer", "secret-1", &[(Right::Produce, "a.*")]);
        let tokens = file(&text);
        assert_eq!(
            tokens.find("secret-1").map(|e| e.name.as_str()),
            Some("writer")
        );
        assert!(tokens.find("secret-2").is_none());
        assert!(tokens.find("").is_none());
        assert!(!text.contains("secret-1"));
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let path = Path::new("t.toml");
        let short = "[[token]]\nname = \"x\"\nsha256 = \"abcd\"\n";
        let error = TokenFile::parse(short, path).expect_err("short hash");
        assert!(error.to_string().contains("64 hex digits"), "{error}");
        let star = format!(
            "[[token]]\nname = \"x\"\nsha256 = \"{}\"\nproduce = [\"a*b\"]\n",
            "0".repeat(64)
        );
        let error = TokenFile::parse(&star, path).expect_err("star inside");
        assert!(error.to_string().contains("prefix ending in *"), "{error}");
        // A pattern ending in a character of several bytes (the fuzzer
        // found it cut inside one).
        let wide = format!(
            "[[token]]\nname = \"x\"\nsha256 = \"{}\"\nproduce = [\"ordersé\", \"a.é*\"]\n",
            "0".repeat(64)
        );
        assert!(TokenFile::parse(&wide, path).is_ok());
        let unknown = "[[token]]\nname = \"x\"\nsha256 = \"00\"\nwrite = []\n";
        assert!(TokenFile::parse(unknown, path).is_err());
    }

    #[test]
    fn rights_are_checked_per_stream_and_name_what_is_missing() {
        let folder = tempfile::tempdir().expect("folder");
        let path = folder.path().join("tokens.toml");
        let text = token_entry_toml(
            "reader",
            "t",
            &[(Right::Consume, "a.*"), (Right::Admin, "a.x")],
        );
        std::fs::write(&path, text).expect("write");
        let tokens = Arc::new(Tokens::open(&path).expect("open"));
        let mut access = Access::new(Principal::Token("reader".into()), Some(tokens.clone()));
        assert!(access.check(Right::Consume, "a.one").is_ok());
        let error = access.check(Right::Consume, "b").expect_err("b");
        assert!(
            error.0.contains("lacks the consume right on stream \"b\""),
            "{error}"
        );
        let error = access.check(Right::Produce, "a.one").expect_err("produce");
        assert!(error.0.contains("produce"), "{error}");
        assert!(access.check(Right::Admin, "a.x").is_ok());
        assert!(access.check_all(Right::Admin).is_err());
        assert!(access.may_see("a.y"));
        assert!(!access.may_see("b"));
        // Revoked: the file no longer holds it.
        std::fs::write(&path, "").expect("empty");
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(later))
            .expect("touch");
        tokens.check_now();
        let error = access.check(Right::Consume, "a.one").expect_err("revoked");
        assert!(error.0.contains("revoked"), "{error}");
        let mut server = Access::new(Principal::Server(2), Some(tokens));
        assert!(server.check_all(Right::Admin).is_ok());
    }
}
