//! Store tests: openraft's own storage suite, then durability across reopen and refusal of
//! corrupt data.

use squadron_core::access::Subject;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Instant;

use openraft::storage::{
    RaftLogReader, RaftLogStorage, RaftLogStorageExt, RaftSnapshotBuilder, RaftStateMachine,
};
use openraft::testing::{log_id, StoreBuilder, Suite};
use openraft::{EntryPayload, Membership, StorageError, StorageHelper};
use rocksdb::{ColumnFamilyDescriptor, Options, DB};
use squadron_core::command::{Command, CreateProject, RegisterWorker};
use squadron_core::ids::{ProjectId, TenantId, WorkerId};
use squadron_core::manifest::RuntimeKind;
use squadron_core::{CommandEnvelope, Outcome, Response};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt as _, AsyncSeekExt as _, AsyncWriteExt as _};

use crate::log_store::{index_key, CF_LOG, CF_META, KEY_VOTE};
use crate::snapshot_file::{encode_envelope, SNAPSHOT_FILE_NAME};
use crate::type_config::{Entry, LogId, NodeId, SnapshotMeta, StoredMembership, Vote};
use crate::{
    open, LogStore, StateMachineStore, StoreError, TypeConfig, LOG_DIR_NAME, SNAPSHOT_DIR_NAME,
};

struct TempStoreBuilder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for TempStoreBuilder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<NodeId>> {
        let dir = TempDir::new().map_err(|e| openraft::StorageIOError::write(&e))?;
        let (log, sm) = open(dir.path())
            .await
            .map_err(|e| openraft::StorageIOError::write(&e))?;
        Ok((dir, log, sm))
    }
}

/// openraft's own contract for `RaftLogStorage` and `RaftStateMachine`. It makes its own
/// runtimes, so it runs in a plain test.
#[test]
fn openraft_storage_suite() {
    let started = Instant::now();
    Suite::test_all(TempStoreBuilder).unwrap();
    eprintln!("openraft storage suite took {:?}", started.elapsed());
}

fn envelope(at_ms: u64, command: Command) -> CommandEnvelope {
    CommandEnvelope {
        subject: Subject::Legacy,
        at_ms,
        idempotency_key: None,
        command,
    }
}

fn create_project(name: &str) -> Command {
    Command::CreateProject(CreateProject {
        tenant: TenantId::new("acme").unwrap(),
        project: ProjectId::new(name).unwrap(),
        max_profiles: None,
        max_active: None,
    })
}

fn register_worker(name: &str) -> Command {
    Command::RegisterWorker(RegisterWorker {
        worker: WorkerId::new(name).unwrap(),
        address: "127.0.0.1:9000".into(),
        runtimes: vec![RuntimeKind::Process],
        capacity: 2,
        labels: BTreeMap::from([("zone".into(), "a".into())]),
        heartbeat_interval_ms: 1_000,
    })
}

fn normal(index: u64, command: Command) -> Entry {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Normal(envelope(1_000 + index, command)),
    }
}

fn membership_entry(index: u64) -> Entry {
    Entry {
        log_id: log_id(1, 1, index),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1u64])], None)),
    }
}

/// Membership at 1, then two projects and a worker.
fn commands() -> Vec<Entry> {
    vec![
        membership_entry(1),
        normal(2, create_project("web")),
        normal(3, register_worker("w1")),
        normal(4, create_project("api")),
    ]
}

#[tokio::test]
async fn log_vote_and_committed_survive_reopen() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = open(dir.path()).await.unwrap();
        log.blocking_append(commands()).await.unwrap();
        log.save_vote(&Vote::new_committed(3, 1)).await.unwrap();
        log.save_committed(Some(log_id(1, 1, 3))).await.unwrap();
        log.purge(log_id(1, 1, 1)).await.unwrap();
    }
    let (mut log, _sm) = open(dir.path()).await.unwrap();
    let entries = log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(entries, commands()[1..].to_vec());
    assert_eq!(
        log.read_vote().await.unwrap(),
        Some(Vote::new_committed(3, 1))
    );
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 1, 3)));
    let state = log.get_log_state().await.unwrap();
    assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 1)));
    assert_eq!(state.last_log_id, Some(log_id(1, 1, 4)));

    // Truncation is durable too.
    log.truncate(log_id(1, 1, 3)).await.unwrap();
    drop(log);
    let (mut log, _sm) = open(dir.path()).await.unwrap();
    assert_eq!(
        log.get_log_state().await.unwrap().last_log_id,
        Some(log_id(1, 1, 2))
    );
}

#[tokio::test]
async fn limited_reads_are_bounded_and_never_empty() {
    let dir = TempDir::new().unwrap();
    let (mut log, _sm) = open(dir.path()).await.unwrap();
    let count = crate::log_store::LOG_READ_ENTRIES_MAX as u64 + 10;
    let entries: Vec<Entry> = (1..=count)
        .map(|i| Entry {
            log_id: log_id(1, 1, i),
            payload: EntryPayload::Blank,
        })
        .collect();
    log.blocking_append(entries).await.unwrap();
    let limited = log.limited_get_log_entries(1, count + 1).await.unwrap();
    assert_eq!(limited.len(), crate::log_store::LOG_READ_ENTRIES_MAX);
    assert_eq!(limited[0].log_id.index, 1);
    let all = log.try_get_log_entries(1..=count).await.unwrap();
    assert_eq!(all.len() as u64, count);
    let tail = log.limited_get_log_entries(count, count + 1).await.unwrap();
    assert_eq!(tail.len(), 1);
}

#[tokio::test]
async fn applied_commands_and_snapshot_survive_reopen() {
    let dir = TempDir::new().unwrap();
    let (digest, built_meta) = {
        let (mut log, mut sm) = open(dir.path()).await.unwrap();
        log.blocking_append(commands()).await.unwrap();
        let responses = sm.apply(commands()).await.unwrap();
        assert_eq!(responses.len(), 4);
        assert_eq!(responses[1], Response::Ok(Outcome::ProjectCreated));
        assert_eq!(responses[2], Response::Ok(Outcome::WorkerRegistered));
        let reader = sm.reader();
        assert_eq!(reader.with_state(|s| s.projects().count()), 2);
        let snapshot = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(1, 1, 4)));
        (reader.digest(), snapshot.meta)
    };

    let (_log, mut sm) = open(dir.path()).await.unwrap();
    let (applied, membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 1, 4)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 1, 1)));
    let reader = sm.reader();
    assert_eq!(reader.digest(), digest);
    assert_eq!(reader.membership(), membership);
    assert_eq!(reader.last_applied(), Some(log_id(1, 1, 4)));
    assert!(reader.with_state(|s| s.worker(&WorkerId::new("w1").unwrap()).is_some()));
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, built_meta);
}

/// The whole restart path: snapshot at 3, commands 4..5 committed only in the log. On reopen
/// openraft loads the snapshot and re-applies the committed tail; the digest matches a
/// replica that applied everything in memory.
#[tokio::test]
async fn restart_replays_committed_log_after_snapshot() {
    let dir = TempDir::new().unwrap();
    let mut entries = commands();
    entries.push(normal(5, register_worker("w2")));
    let expected = {
        let (mut log, mut sm) = open(dir.path()).await.unwrap();
        log.blocking_append(entries.clone()).await.unwrap();
        sm.apply(entries[..3].to_vec()).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        log.purge(log_id(1, 1, 3)).await.unwrap();
        sm.apply(entries[3..].to_vec()).await.unwrap();
        log.save_committed(Some(log_id(1, 1, 5))).await.unwrap();
        sm.reader().digest()
    };

    let (mut log, mut sm) = open(dir.path()).await.unwrap();
    assert_eq!(sm.reader().last_applied(), Some(log_id(1, 1, 3)));
    let initial = StorageHelper::new(&mut log, &mut sm)
        .get_initial_state()
        .await
        .unwrap();
    assert_eq!(initial.committed, Some(log_id(1, 1, 5)));
    assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 1, 5)));
    assert_eq!(sm.reader().digest(), expected);
}

fn meta_at(index: u64) -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(1, 1, index)),
        last_membership: StoredMembership::default(),
        snapshot_id: format!("test-{index}"),
    }
}

#[tokio::test]
async fn corrupt_snapshot_install_is_refused_and_old_state_stays() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = open(dir.path()).await.unwrap();
    sm.apply(commands()).await.unwrap();
    let good = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let before = (sm.applied_state().await.unwrap(), sm.reader().digest());

    // A built snapshot's data is the file on disk (openraft keeps only the meta of a build).
    let current = sm.get_current_snapshot().await.unwrap().unwrap();
    assert_eq!(current.meta, good.meta);
    let good_bytes = read_all(*current.snapshot).await;
    let mut flipped = good_bytes.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    // Framing and checksum are right, the core body is not.
    let bad_body = encode_envelope(&meta_at(9), b"SQDSNAP\0\0\0\0\x01not a state").unwrap();
    let offers: Vec<(SnapshotMeta, Vec<u8>, &str)> = vec![
        (meta_at(9), b"garbage".to_vec(), "bad magic"),
        (good.meta.clone(), flipped, "checksum mismatch"),
        (meta_at(9), bad_body, "snapshot state is refused"),
        // A sound snapshot offered under another meta.
        (meta_at(9), good_bytes.clone(), "but was offered as"),
    ];
    for (meta, bytes, why) in offers {
        let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
        receiving.write_all(&bytes).await.unwrap();
        let err = sm.install_snapshot(&meta, receiving).await.unwrap_err();
        assert!(err.to_string().contains(why), "{err} does not say {why}");
        assert_eq!(
            (sm.applied_state().await.unwrap(), sm.reader().digest()),
            before
        );
        let current = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(
            current.meta, good.meta,
            "the persisted snapshot was replaced"
        );
        assert!(
            !dir.path()
                .join(SNAPSHOT_DIR_NAME)
                .join("receiving.snap")
                .exists(),
            "{why}: the refused file stayed"
        );
    }

    // The sound one installs on a fresh node, and survives its reopen.
    let other = TempDir::new().unwrap();
    {
        let (_log, mut fresh) = open(other.path()).await.unwrap();
        let mut receiving = fresh.begin_receiving_snapshot().await.unwrap();
        receiving.write_all(&good_bytes).await.unwrap();
        fresh.install_snapshot(&good.meta, receiving).await.unwrap();
        assert_eq!(fresh.reader().digest(), before.1);
    }
    let (_log, mut fresh) = open(other.path()).await.unwrap();
    assert_eq!(fresh.applied_state().await.unwrap(), before.0);
    assert_eq!(fresh.reader().digest(), before.1);
}

/// A snapshot's data read whole (the tests' snapshots are small).
async fn read_all(mut data: tokio::fs::File) -> Vec<u8> {
    data.seek(std::io::SeekFrom::Start(0)).await.unwrap();
    let mut bytes = Vec::new();
    data.read_to_end(&mut bytes).await.unwrap();
    bytes
}

/// A follower receives a snapshot as openraft streams it, chunk by chunk at their offsets (a
/// chunk sent again after a timeout is written again), into a file that is checked and then
/// renamed into place: the file installed is the one received, and the receiving file is gone.
#[tokio::test]
async fn a_snapshot_received_in_chunks_is_renamed_into_place() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = open(dir.path()).await.unwrap();
    sm.apply(commands()).await.unwrap();
    let built = sm
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let sent = sm.get_current_snapshot().await.unwrap().unwrap();
    let bytes = read_all(*sent.snapshot).await;
    assert_eq!(
        read_all(*built.snapshot).await,
        bytes,
        "the build's own data"
    );
    let digest = sm.reader().digest();

    let other = TempDir::new().unwrap();
    let (_log, mut fresh) = open(other.path()).await.unwrap();
    let mut receiving = fresh.begin_receiving_snapshot().await.unwrap();
    let chunk = 7;
    for (i, part) in bytes.chunks(chunk).enumerate() {
        receiving
            .seek(std::io::SeekFrom::Start((i * chunk) as u64))
            .await
            .unwrap();
        receiving.write_all(part).await.unwrap();
        if i == 3 {
            receiving
                .seek(std::io::SeekFrom::Start((2 * chunk) as u64))
                .await
                .unwrap();
            receiving
                .write_all(&bytes[2 * chunk..3 * chunk])
                .await
                .unwrap();
        }
    }
    receiving.shutdown().await.unwrap();
    let snapshot_dir = other.path().join(SNAPSHOT_DIR_NAME);
    let received = std::fs::metadata(snapshot_dir.join("receiving.snap")).unwrap();
    fresh.install_snapshot(&sent.meta, receiving).await.unwrap();
    assert_eq!(fresh.reader().digest(), digest);
    let installed = std::fs::metadata(snapshot_dir.join(SNAPSHOT_FILE_NAME)).unwrap();
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&installed),
        std::os::unix::fs::MetadataExt::ino(&received),
        "the received file itself is the live snapshot"
    );
    assert!(!snapshot_dir.join("receiving.snap").exists());
    assert_eq!(
        std::fs::read(snapshot_dir.join(SNAPSHOT_FILE_NAME)).unwrap(),
        bytes
    );
}

/// A received snapshot that fails its checks leaves nothing behind, and beginning a new one
/// abandons a half-received one.
#[tokio::test]
async fn a_refused_or_abandoned_received_snapshot_leaves_no_file() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = open(dir.path()).await.unwrap();
    let snapshot_dir = dir.path().join(SNAPSHOT_DIR_NAME);
    let mut abandoned = sm.begin_receiving_snapshot().await.unwrap();
    abandoned.write_all(b"half a snap").await.unwrap();
    abandoned.flush().await.unwrap();
    let mut receiving = sm.begin_receiving_snapshot().await.unwrap();
    receiving.write_all(b"garbage").await.unwrap();
    let err = sm
        .install_snapshot(&meta_at(9), receiving)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("bad magic"), "{err}");
    let names: Vec<_> = std::fs::read_dir(&snapshot_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(names.is_empty(), "left behind: {names:?}");
    assert_eq!(
        sm.get_current_snapshot().await.unwrap().map(|s| s.meta),
        None
    );
}

#[tokio::test]
async fn corrupt_snapshot_file_stops_open() {
    let dir = TempDir::new().unwrap();
    {
        let (_log, mut sm) = open(dir.path()).await.unwrap();
        sm.apply(commands()).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
    }
    let path = dir.path().join(SNAPSHOT_DIR_NAME).join(SNAPSHOT_FILE_NAME);
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(&path, bytes).unwrap();
    match open(dir.path()).await {
        Err(StoreError::CorruptSnapshot { .. }) => {}
        other => panic!("expected a corrupt snapshot error, got {other:?}"),
    }
}

/// Writes raw bytes under a key, behind the store's back.
fn poke(dir: &Path, cf: &str, key: &[u8], value: &[u8]) {
    let cfs = [
        ColumnFamilyDescriptor::new(CF_LOG, Options::default()),
        ColumnFamilyDescriptor::new(CF_META, Options::default()),
    ];
    let db = DB::open_cf_descriptors(&Options::default(), dir.join(LOG_DIR_NAME), cfs).unwrap();
    db.put_cf(db.cf_handle(cf).unwrap(), key, value).unwrap();
}

#[tokio::test]
async fn corrupt_log_values_are_errors_not_panics() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = open(dir.path()).await.unwrap();
        log.blocking_append(commands()).await.unwrap();
        log.save_vote(&Vote::new(2, 1)).await.unwrap();
    }
    poke(dir.path(), CF_LOG, &index_key(2), b"\x01garbage");
    poke(dir.path(), CF_LOG, &index_key(4), b"");
    poke(dir.path(), CF_META, KEY_VOTE, b"\x07");
    // An intact entry filed under the wrong index.
    let misfiled = crate::codec::encode(&commands()[0]).unwrap();
    poke(dir.path(), CF_LOG, &index_key(3), &misfiled);

    let (mut log, _sm) = open(dir.path()).await.unwrap();
    assert!(log.try_get_log_entries(1..2).await.is_ok());
    assert!(log.try_get_log_entries(2..3).await.is_err());
    assert!(log.try_get_log_entries(3..4).await.is_err());
    assert!(log.try_get_log_entries(0..).await.is_err());
    // The last entry is what get_log_state decodes.
    assert!(log.get_log_state().await.is_err());
    assert!(log.read_vote().await.is_err());
}

#[tokio::test]
async fn non_command_entries_answer_the_fixed_response() {
    let dir = TempDir::new().unwrap();
    let (_log, mut sm) = open(dir.path()).await.unwrap();
    let blank = Entry {
        log_id: log_id(1, 1, 1),
        payload: EntryPayload::Blank,
    };
    let responses = sm.apply([blank, membership_entry(2)]).await.unwrap();
    assert_eq!(responses, vec![crate::non_command_response(); 2]);
    let _: LogId = sm.reader().last_applied().unwrap();
}

/// A log written by a build before subjects (value format 1, log encoding 1) still reads: its
/// commands come back as legacy commands, applied as they were then.
#[tokio::test]
async fn format_1_log_entries_still_read_as_legacy_commands() {
    let dir = TempDir::new().unwrap();
    {
        let (mut log, _sm) = open(dir.path()).await.unwrap();
        log.blocking_append(commands()).await.unwrap();
    }
    // The core's version-1 golden of `create_project` (envelope without a subject), wrapped
    // in openraft's entry layout as format 1 wrote it: log id, payload variant 1 (Normal).
    let golden_v1 = "01fd0000018bcfe5680001056b65792d30000461636d6503776562010800";
    let envelope_v1 = &hex::decode(golden_v1).unwrap()[1..];
    let log_id = log_id(1, 1, 2);
    let mut value = crate::codec::encode(&log_id).unwrap();
    value[0] = crate::codec::VALUE_FORMAT_VERSION_V1;
    value.push(1);
    value.extend_from_slice(envelope_v1);
    poke(dir.path(), CF_LOG, &index_key(2), &value);

    let (mut log, _sm) = open(dir.path()).await.unwrap();
    let entries = log.try_get_log_entries(2..3).await.unwrap();
    let EntryPayload::Normal(envelope) = &entries[0].payload else {
        panic!("not a normal entry: {:?}", entries[0]);
    };
    assert_eq!(envelope.subject, Subject::Legacy);
    assert_eq!(envelope.at_ms, 1_700_000_000_000);
    assert_eq!(envelope.command.name(), "create_project");
    assert_eq!(entries[0].log_id, log_id);
    // Entries this build writes are format 2.
    let current = crate::codec::encode(&commands()[0]).unwrap();
    assert_eq!(current[0], crate::codec::VALUE_FORMAT_VERSION);
}
