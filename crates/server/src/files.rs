//! The open-file limit. A server keeps a file open for each replica's
//! tail segment, its journal, and a socket for each connection, so a
//! thousand streams' replicas need more than the soft limit of 1,024 that
//! many systems give a process (three servers in one process stopped
//! creating replicas at about 320 streams, "Too many open files"). On
//! opening, a server raises its soft limit to the hard limit, which needs
//! no privilege; it never lowers it.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The process's open-file limits after [`raise_open_files_limit`]
/// (`None`: no limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    /// The soft limit before.
    pub before: Option<u64>,
    /// The soft limit now.
    pub soft: Option<u64>,
    /// The hard limit.
    pub hard: Option<u64>,
}

/// Raises the soft limit on open files to the hard limit. Idempotent; a
/// soft limit already at or past the hard one (or none) is left alone.
pub fn raise_open_files_limit() -> std::io::Result<OpenFiles> {
    let limits = getrlimit(Resource::Nofile);
    let below = match (limits.current, limits.maximum) {
        (Some(soft), Some(hard)) => soft < hard,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if below {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: limits.maximum,
                maximum: limits.maximum,
            },
        )?;
    }
    let now = getrlimit(Resource::Nofile);
    Ok(OpenFiles {
        before: limits.current,
        soft: now.current,
        hard: now.maximum,
    })
}

/// [`raise_open_files_limit`], with what it did in the log.
pub(crate) fn raise_and_log() {
    match raise_open_files_limit() {
        Ok(files) if files.before != files.soft => tracing::info!(
            "open files: soft limit raised from {} to {}",
            shown(files.before),
            shown(files.soft)
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(
            "open files: cannot raise the soft limit to the hard limit ({error}); \
             each replica keeps a file open, so a server with many streams may run out"
        ),
    }
}

fn shown(limit: Option<u64>) -> String {
    limit.map_or_else(|| "unlimited".to_string(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_reaches_the_hard_one_and_a_second_call_changes_nothing() {
        let first = raise_open_files_limit().expect("raising to the hard limit needs no privilege");
        assert_eq!(first.soft, first.hard, "{first:?}");
        let second = raise_open_files_limit().unwrap();
        assert_eq!(second.before, first.soft);
        assert_eq!(second.soft, first.soft);
    }
}
