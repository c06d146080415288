//! The replicated state machine, as openraft's `RaftStateMachine`: it
//! applies committed [`Proposal`]s to a [`ControlState`] and keeps its
//! snapshot.
//!
//! A proposal carries a random id, and the machine remembers the responses
//! to the latest [`PROPOSALS_REMEMBERED`] proposals. A proposal that is
//! tried again after a timeout, and so committed twice, is applied once:
//! the second entry returns the first one's response.
//!
//! The state itself is not written at every apply. A restart rebuilds it
//! from the last snapshot and the committed entries after it, which the log
//! keeps. The snapshot is `snapshot.json` in the control folder,
//! `{"version": 1, "meta": ..., "image": ...}`, replaced atomically; the
//! snapshot data sent to a follower is the JSON of the [`Image`] alone.
//!
//! **Invariant:** `published` changes only after `state` has, and
//! `applied` only after `published`, so whoever sees an applied index in
//! `applied` sees its effect in `published`.

use std::collections::VecDeque;
use std::io::{self, Cursor};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openraft::storage::RaftStateMachine;
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{watch, Mutex};

use crate::error::ControlError;
use crate::files::write_atomically;
use crate::state::{Command, ControlState, Response};
use crate::TypeConfig;

/// The snapshot file's name in the control folder.
pub(crate) const SNAPSHOT_FILE: &str = "snapshot.json";
const SNAPSHOT_VERSION: u32 = 1;
/// Responses kept for proposals tried again: far more than a server
/// proposes while one proposal is retried (at most about 10 s).
pub(crate) const PROPOSALS_REMEMBERED: usize = 1024;

/// A command as the control log carries it, with the id that makes a
/// retried proposal apply once.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Proposal {
    pub(crate) id: u128,
    pub(crate) command: Command,
}

impl Proposal {
    pub(crate) fn new(command: Command) -> Proposal {
        Proposal {
            id: proto::random_u128(),
            command,
        }
    }
}

/// What the log's entries build, and what a snapshot holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Image {
    pub(crate) state: ControlState,
    /// The latest proposals' ids and responses, oldest first, at most
    /// [`PROPOSALS_REMEMBERED`].
    pub(crate) recent: VecDeque<(u128, Response)>,
}

impl Image {
    /// Applies a proposal unless it has been applied already; either way
    /// returns its response. Deterministic, as the state's `apply` is.
    pub(crate) fn apply(&mut self, proposal: Proposal) -> Response {
        if let Some((_, response)) = self.recent.iter().find(|(id, _)| *id == proposal.id) {
            return response.clone();
        }
        let response = self.state.apply(proposal.command);
        if self.recent.len() == PROPOSALS_REMEMBERED {
            self.recent.pop_front();
        }
        self.recent.push_back((proposal.id, response.clone()));
        response
    }
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    version: u32,
    meta: SnapshotMeta<u64, BasicNode>,
    image: Image,
}

/// A snapshot: its meta and its data (the image's JSON).
#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<u64, BasicNode>,
    data: Vec<u8>,
}

/// The newest snapshot, shared by the state machine and the builders that
/// openraft runs beside it.
struct SnapshotStore {
    path: PathBuf,
    current: Option<StoredSnapshot>,
}

impl SnapshotStore {
    /// Writes `snapshot` unless a newer one is already stored (a builder may
    /// finish after a newer snapshot was installed) and it is not `installed`
    /// from the leader, which replaces whatever is there.
    async fn keep(
        &mut self,
        snapshot: StoredSnapshot,
        image: &Image,
        installed: bool,
    ) -> io::Result<()> {
        let newer_stored = self
            .current
            .as_ref()
            .is_some_and(|current| current.meta.last_log_id > snapshot.meta.last_log_id);
        if newer_stored && !installed {
            return Ok(());
        }
        let file = SnapshotFile {
            version: SNAPSHOT_VERSION,
            meta: snapshot.meta.clone(),
            image: image.clone(),
        };
        let bytes = serde_json::to_vec(&file).expect("snapshots serialize");
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &bytes))
            .await
            .map_err(|error| io::Error::other(format!("snapshot task failed: {error}")))??;
        self.current = Some(snapshot);
        Ok(())
    }
}

/// What the rest of the crate watches.
pub(crate) struct Published {
    pub(crate) state: watch::Receiver<Arc<ControlState>>,
    /// The index of the last applied entry.
    pub(crate) applied: watch::Receiver<Option<u64>>,
}

/// The control state as openraft drives it.
pub(crate) struct StateMachine {
    image: Image,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    snapshots: Arc<Mutex<SnapshotStore>>,
    published: watch::Sender<Arc<ControlState>>,
    applied: watch::Sender<Option<u64>>,
}

/// Copies the state at one point for a snapshot.
pub(crate) struct SnapshotBuilder {
    image: Image,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    snapshots: Arc<Mutex<SnapshotStore>>,
}

impl StateMachine {
    /// Loads the snapshot in `dir`, if any. Blocking.
    pub(crate) fn open(dir: &Path) -> Result<(StateMachine, Published), ControlError> {
        let path = dir.join(SNAPSHOT_FILE);
        let loaded = match std::fs::read(&path) {
            Ok(bytes) => Some(parse_snapshot_file(&path, &bytes)?),
            Err(error) if error.kind() == io::ErrorKind::NotFound => None,
            Err(error) => {
                return Err(ControlError::Storage {
                    path,
                    action: "reading",
                    source: error,
                })
            }
        };
        let (image, current) = match loaded {
            Some(file) => {
                let data = serde_json::to_vec(&file.image).expect("images serialize");
                let snapshot = StoredSnapshot {
                    meta: file.meta,
                    data,
                };
                (file.image, Some(snapshot))
            }
            None => (Image::default(), None),
        };
        let (last_applied, membership) = match &current {
            Some(snapshot) => (
                snapshot.meta.last_log_id,
                snapshot.meta.last_membership.clone(),
            ),
            None => (None, StoredMembership::default()),
        };
        let (published, state_receiver) = watch::channel(Arc::new(image.state.clone()));
        let (applied, applied_receiver) = watch::channel(last_applied.map(|id| id.index));
        let machine = StateMachine {
            image,
            last_applied,
            membership,
            snapshots: Arc::new(Mutex::new(SnapshotStore { path, current })),
            published,
            applied,
        };
        let receivers = Published {
            state: state_receiver,
            applied: applied_receiver,
        };
        Ok((machine, receivers))
    }

    fn publish(&self) {
        self.published
            .send_replace(Arc::new(self.image.state.clone()));
        self.applied
            .send_replace(self.last_applied.map(|id| id.index));
    }
}

fn parse_snapshot_file(path: &Path, bytes: &[u8]) -> Result<SnapshotFile, ControlError> {
    let corrupt = |detail: String| ControlError::Corrupt {
        path: path.to_path_buf(),
        detail,
    };
    let file: SnapshotFile =
        serde_json::from_slice(bytes).map_err(|error| corrupt(error.to_string()))?;
    if file.version != SNAPSHOT_VERSION {
        return Err(corrupt(format!("snapshot format version {}", file.version)));
    }
    Ok(file)
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let data = serde_json::to_vec(&self.image).expect("images serialize");
        let snapshot_id = match self.last_applied {
            Some(id) => format!(
                "{}-{}-{}",
                id.leader_id.term, id.leader_id.node_id, id.index
            ),
            None => "empty".to_string(),
        };
        let meta = SnapshotMeta {
            last_log_id: self.last_applied,
            last_membership: self.membership.clone(),
            snapshot_id,
        };
        let snapshot = StoredSnapshot { meta, data };
        let mut store = self.snapshots.lock().await;
        store
            .keep(snapshot.clone(), &self.image, false)
            .await
            .map_err(|error| {
                StorageIOError::write_snapshot(Some(snapshot.meta.signature()), &error)
            })?;
        Ok(Snapshot {
            meta: snapshot.meta,
            snapshot: Box::new(Cursor::new(snapshot.data)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        Ok((self.last_applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Response>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + openraft::OptionalSend,
        I::IntoIter: openraft::OptionalSend,
    {
        let mut responses = Vec::new();
        for entry in entries {
            self.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Blank => Response::Done,
                EntryPayload::Normal(proposal) => self.image.apply(proposal),
                EntryPayload::Membership(membership) => {
                    self.membership = StoredMembership::new(Some(entry.log_id), membership);
                    Response::Done
                }
            };
            responses.push(response);
        }
        if !responses.is_empty() {
            self.publish();
        }
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            image: self.image.clone(),
            last_applied: self.last_applied,
            membership: self.membership.clone(),
            snapshots: self.snapshots.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        let image: Image = serde_json::from_slice(&data).map_err(|error| {
            StorageIOError::read_snapshot(
                Some(meta.signature()),
                AnyError::error(format!("the leader's snapshot does not parse: {error}")),
            )
        })?;
        let snapshot = StoredSnapshot {
            meta: meta.clone(),
            data,
        };
        {
            let mut store = self.snapshots.lock().await;
            store
                .keep(snapshot, &image, true)
                .await
                .map_err(|error| StorageIOError::write_snapshot(Some(meta.signature()), &error))?;
        }
        self.image = image;
        self.last_applied = meta.last_log_id;
        self.membership = meta.last_membership.clone();
        self.publish();
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let store = self.snapshots.lock().await;
        Ok(store.current.clone().map(|snapshot| Snapshot {
            meta: snapshot.meta,
            snapshot: Box::new(Cursor::new(snapshot.data)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn join(id: u128) -> Proposal {
        Proposal {
            id,
            command: Command::Join {
                id: 1,
                address: "127.0.0.1:7001".to_string(),
                roles: Vec::new(),
                admin_only: false,
                nonce: 0,
            },
        }
    }

    #[test]
    fn a_proposal_committed_twice_is_applied_once() {
        let mut image = Image::default();
        assert_eq!(image.apply(join(7)), Response::Joined { view: 1 });
        assert_eq!(image.apply(join(7)), Response::Joined { view: 1 });
        assert_eq!(image.state.view, 1);
        assert_eq!(image.apply(join(8)), Response::Joined { view: 2 });
    }

    #[test]
    fn only_the_latest_proposals_are_remembered() {
        let mut image = Image::default();
        for id in 0..=PROPOSALS_REMEMBERED as u128 {
            image.apply(join(id));
        }
        assert_eq!(image.recent.len(), PROPOSALS_REMEMBERED);
        assert_eq!(image.recent.front().map(|(id, _)| *id), Some(1));
    }

    #[test]
    fn an_image_with_full_width_ids_reads_back_from_json() {
        let mut image = Image::default();
        image.apply(join(u128::MAX));
        let bytes = serde_json::to_vec(&image).expect("serialize");
        let back: Image = serde_json::from_slice(&bytes).expect("parse");
        assert_eq!(back, image);
    }
}
