//! The state machine: the core [`State`] in memory, made durable by the log plus snapshots.
//!
//! `apply` only changes memory. Every snapshot that is built or installed is written to disk
//! before openraft learns of it, so openraft purges only log entries a durable snapshot covers;
//! on open the latest snapshot is loaded and openraft re-applies the log after it (up to the
//! saved committed id).

// openraft's traits fix the error type; its size is not ours to choose.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::io::{Seek as _, SeekFrom};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{AnyError, EntryPayload, OptionalSend, StorageError, StorageIOError};
use squadron_core::ids::Digest;
use squadron_core::snapshot::{decode_snapshot_from, encode_snapshot_into, state_digest};
use squadron_core::{Rejection, Response, State};

use crate::machine_stats::{thread_cpu_seconds, MachineStats};
use crate::replicated_clock::ReplicatedClock;
use crate::snapshot_file::{
    check_meta, read_envelope, EnvelopeError, SnapshotDir, SnapshotFileError,
};
use crate::type_config::{
    Entry, LogId, NodeId, Snapshot, SnapshotMeta, StoredMembership, TypeConfig,
};
use crate::StoreError;

type StoreResult<T> = Result<T, StorageError<NodeId>>;

/// What the state machine holds: the core state and the Raft position it reflects.
#[derive(Debug, Clone, Default)]
pub struct StateMachineData {
    /// The last log entry applied, `None` before the first.
    pub last_applied: Option<LogId>,
    /// The last membership config applied.
    pub last_membership: StoredMembership,
    pub state: State,
}

/// The response recorded for a blank or membership entry. openraft wants one response per
/// applied entry, but no client ever reads these (a client's own write is always a normal
/// entry), and the core has no no-op outcome; so they get this fixed value.
pub fn non_command_response() -> Response {
    Response::Rejected(Rejection::invalid("entry", "not a command"))
}

/// Shared read access for the readers of the lock. A poisoned lock means a panic inside the
/// core's `apply`; readers still see the data (the node is going down through openraft's
/// storage error path anyway), writers refuse to continue.
fn read(lock: &RwLock<StateMachineData>) -> RwLockReadGuard<'_, StateMachineData> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn poisoned() -> StorageIOError<NodeId> {
    StorageIOError::write_state_machine(AnyError::error(
        "state machine lock poisoned by a panic during apply",
    ))
}

/// A cheap, cloneable, read-only view of the state machine for the server.
#[derive(Clone)]
pub struct StateReader {
    data: Arc<RwLock<StateMachineData>>,
    clock: Arc<ReplicatedClock>,
    stats: Arc<MachineStats>,
}

impl fmt::Debug for StateReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateReader")
            .field("last_applied", &self.last_applied())
            .finish_non_exhaustive()
    }
}

impl StateReader {
    pub fn last_applied(&self) -> Option<LogId> {
        read(&self.data).last_applied
    }

    /// The replicated clock (`State::clock_ms`) as of the last apply, without the lock: the
    /// cluster clock reads it on every proposal, which must not wait behind a long apply.
    pub fn clock_ms(&self) -> u64 {
        self.clock.clock_ms()
    }

    /// The replicated clock plus the monotonic time since this node applied it: a floor of the
    /// cluster's time now (see `ReplicatedClock::floor_ms`).
    pub fn clock_floor_ms(&self) -> u64 {
        self.clock.floor_ms()
    }

    /// Runs `f` on the current state under the read lock. Keep `f` short: apply waits for it.
    pub fn with_state<F, T>(&self, f: F) -> T
    where
        F: FnOnce(&State) -> T,
    {
        f(&read(&self.data).state)
    }

    /// Runs `f` on the state together with the log position it reflects, read atomically.
    pub fn with_data<F, T>(&self, f: F) -> T
    where
        F: FnOnce(&StateMachineData) -> T,
    {
        f(&read(&self.data))
    }

    /// The state digest (INV-12). Encodes the whole state under the read lock, so it costs
    /// as much as a snapshot encoding.
    pub fn digest(&self) -> Digest {
        state_digest(&read(&self.data).state)
    }

    pub fn membership(&self) -> StoredMembership {
        read(&self.data).last_membership.clone()
    }

    /// What applying and snapshotting have cost on this node (`/metrics`).
    pub fn stats(&self) -> &MachineStats {
        &self.stats
    }
}

/// The snapshot file plus the meta of what it holds; the mutex also serializes file writes
/// between the snapshot builder task and `install_snapshot`.
#[derive(Debug)]
struct SnapshotSlot {
    dir: SnapshotDir,
    current: Mutex<Option<SnapshotMeta>>,
    builds: AtomicU64,
}

impl SnapshotSlot {
    /// Puts a received and checked snapshot `file` in place as the live snapshot unless a
    /// newer one is already there (an install can overtake a build that started earlier).
    /// Returns whether it was put in place; if not, the file is removed.
    fn persist_received(&self, meta: &SnapshotMeta, file: std::fs::File) -> std::io::Result<bool> {
        let held = file.try_clone()?;
        let persisted = self.persist_with(meta, || self.dir.replace_with_received(file));
        if !matches!(persisted, Ok(true)) {
            self.dir.discard_received(&held);
        }
        persisted
    }

    /// [`Self::persist_received`] for a file written as the state was encoded: put in place
    /// unless a newer snapshot already is (then the file is dropped, and removed with it).
    fn persist_file(
        &self,
        meta: &SnapshotMeta,
        file: atomic_write_file::AtomicWriteFile,
    ) -> std::io::Result<bool> {
        self.persist_with(meta, || self.dir.replace_with(file))
    }

    /// Runs `write` (which puts a snapshot in place) under the slot's lock, unless a newer
    /// snapshot than `meta`'s is already there.
    fn persist_with(
        &self,
        meta: &SnapshotMeta,
        write: impl FnOnce() -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current
            .as_ref()
            .is_some_and(|cur| cur.last_log_id > meta.last_log_id)
        {
            return Ok(false);
        }
        write()?;
        *current = Some(meta.clone());
        Ok(true)
    }

    fn next_snapshot_id(&self, last: Option<LogId>) -> String {
        let seq = self.builds.fetch_add(1, Ordering::Relaxed);
        // Only uniqueness matters: the same log id can be snapshotted twice with different
        // bytes (a rebuild after restart), and openraft tells the streams apart by this id.
        let millis = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        match last {
            Some(id) => format!("{}-{}-{millis}-{seq}", id.leader_id, id.index),
            None => format!("none-{millis}-{seq}"),
        }
    }
}

/// The openraft state machine.
pub struct StateMachineStore {
    data: Arc<RwLock<StateMachineData>>,
    /// `data.state.clock_ms()`, published after each apply and install for lock-free readers.
    clock: Arc<ReplicatedClock>,
    snapshots: Arc<SnapshotSlot>,
    stats: Arc<MachineStats>,
}

impl fmt::Debug for StateMachineStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StateMachineStore")
            .field("last_applied", &read(&self.data).last_applied)
            .field("snapshot_dir", &self.snapshots.dir)
            .finish_non_exhaustive()
    }
}

impl StateMachineStore {
    /// Loads the latest snapshot from `dir`, or starts empty when there is none. A snapshot
    /// that fails its checks stops the open: starting empty would silently drop the state
    /// that the purged log no longer holds.
    pub(crate) fn load(dir: SnapshotDir) -> Result<Self, StoreError> {
        let path = dir.path();
        let stats = MachineStats::default();
        let io_error = |source| StoreError::Io {
            path: path.clone(),
            source,
        };
        let (data, current) = match dir.open_current().map_err(io_error)? {
            None => (StateMachineData::default(), None),
            Some(mut file) => {
                let corrupt = |source| StoreError::CorruptSnapshot {
                    path: path.clone(),
                    source,
                };
                let (meta, state) = read_state(&mut file).map_err(|e| match e {
                    SnapshotFileError::Envelope(e) => corrupt(e),
                    SnapshotFileError::Io(e) => io_error(e),
                })?;
                stats
                    .snapshot_bytes
                    .store(file.metadata().map_or(0, |m| m.len()), Ordering::Relaxed);
                let data = StateMachineData {
                    last_applied: meta.last_log_id,
                    last_membership: meta.last_membership.clone(),
                    state,
                };
                (data, Some(meta))
            }
        };
        Ok(Self {
            clock: Arc::new(ReplicatedClock::new(data.state.clock_ms())),
            data: Arc::new(RwLock::new(data)),
            snapshots: Arc::new(SnapshotSlot {
                dir,
                current: Mutex::new(current),
                builds: AtomicU64::new(0),
            }),
            stats: Arc::new(stats),
        })
    }

    /// A read handle on the live state, for the server.
    pub fn reader(&self) -> StateReader {
        StateReader {
            data: self.data.clone(),
            clock: self.clock.clone(),
            stats: self.stats.clone(),
        }
    }
}

/// Builds snapshots from a consistent view of the state machine; runs in its own task,
/// concurrently with `apply`.
pub struct SnapshotBuilder {
    data: Arc<RwLock<StateMachineData>>,
    snapshots: Arc<SnapshotSlot>,
    stats: Arc<MachineStats>,
}

impl fmt::Debug for SnapshotBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SnapshotBuilder").finish_non_exhaustive()
    }
}

fn build_blocking(
    data: &RwLock<StateMachineData>,
    slot: &SnapshotSlot,
    stats: &MachineStats,
) -> Result<Snapshot, StorageIOError<NodeId>> {
    let started = Instant::now();
    // A copy taken under the read lock gives a consistent (position, state) pair, and the
    // encoding runs after the lock is released: apply waits for the copy only. The maps that
    // grow with tasks and profiles are persistent (`PMap`), so the copy shares their nodes and
    // clones only the small rest; a node changed while the copy lives is copied then (DESIGN
    // §7: no write waits more than 50 ms while a snapshot is built; encoding under the lock
    // stalled apply ~0.8 s with 280,000 tasks, and a `BTreeMap` copy ~0.3 s with a million
    // under load).
    let (meta, state) = {
        let guard = read(data);
        let locked = Instant::now();
        let meta = SnapshotMeta {
            last_log_id: guard.last_applied,
            last_membership: guard.last_membership.clone(),
            snapshot_id: slot.next_snapshot_id(guard.last_applied),
        };
        let copy = guard.state.clone();
        stats
            .snapshot_copy_seconds
            .observe(locked.elapsed().as_secs_f64());
        (meta, copy)
    };
    let signature = Some(meta.signature());
    let failed = |e: &(dyn std::error::Error + 'static)| {
        StorageIOError::write_snapshot(signature.clone(), AnyError::from_dyn(e, None))
    };
    // Encoded straight into the new file, never whole in memory.
    let (file, size) = slot
        .dir
        .write_new(&meta, |out| encode_snapshot_into(&state, out))
        .map_err(|e| failed(&e))?;
    drop(state);
    // A handle on the file's inode: it holds this build's bytes even when a newer install
    // overtakes it and the file is not put in place.
    let mut built = file.as_file().try_clone().map_err(|e| failed(&e))?;
    slot.persist_file(&meta, file).map_err(|e| failed(&e))?;
    built.seek(SeekFrom::Start(0)).map_err(|e| failed(&e))?;
    stats.snapshot_written(&stats.snapshot_build_seconds, started, size as usize);
    // openraft 0.9 keeps only the meta of a snapshot it had built (the state machine worker
    // answers `BuildSnapshot(snap.meta)`); a follower is sent the file `get_current_snapshot`
    // opens.
    Ok(Snapshot {
        meta,
        snapshot: Box::new(tokio::fs::File::from_std(built)),
    })
}

/// The meta and the decoded state of a snapshot file, its checksum checked first; both passes
/// stream through the file.
fn read_state(file: &mut std::fs::File) -> Result<(SnapshotMeta, State), SnapshotFileError> {
    let found = read_envelope(file)?;
    file.seek(SeekFrom::Start(found.state_at))?;
    let state = decode_snapshot_from(&mut *file, found.state_len).map_err(EnvelopeError::State)?;
    Ok((found.meta, state))
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot> {
        let data = self.data.clone();
        let (slot, stats) = (self.snapshots.clone(), self.stats.clone());
        let snapshot = tokio::task::spawn_blocking(move || build_blocking(&data, &slot, &stats))
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))??;
        tracing::info!(meta = %snapshot.meta, "snapshot built and persisted");
        Ok(snapshot)
    }
}

/// Checks a received snapshot file completely, persists it, and returns the decoded state
/// and the file's size. Nothing is put in place unless every check passed; a file that fails
/// them is removed.
fn check_and_persist(
    slot: &SnapshotSlot,
    meta: &SnapshotMeta,
    mut file: std::fs::File,
) -> Result<(State, u64), StorageIOError<NodeId>> {
    let signature = Some(meta.signature());
    let checked = read_state(&mut file).and_then(|(found, state)| {
        check_meta(&found, meta)?;
        Ok((state, file.metadata()?.len()))
    });
    let (state, size) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            slot.dir.discard_received(&file);
            return Err(StorageIOError::read_snapshot(signature, &e));
        }
    };
    slot.persist_received(meta, file)
        .map_err(|e| StorageIOError::write_snapshot(signature.clone(), &e))?;
    Ok((state, size))
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StoreResult<(Option<LogId>, StoredMembership)> {
        let guard = read(&self.data);
        Ok((guard.last_applied, guard.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<Response>>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries = entries.into_iter();
        let mut responses = Vec::with_capacity(entries.size_hint().0);
        // One write-lock hold per batch: readers see whole batches, never half of one.
        let asked = Instant::now();
        let mut guard = self.data.write().map_err(|_| poisoned())?;
        let locked = Instant::now();
        for entry in entries {
            let started = Instant::now();
            let cpu_started = thread_cpu_seconds();
            guard.last_applied = Some(entry.log_id);
            let response = match entry.payload {
                EntryPayload::Normal(envelope) => guard.state.apply(envelope),
                EntryPayload::Blank => non_command_response(),
                EntryPayload::Membership(membership) => {
                    guard.last_membership = StoredMembership::new(Some(entry.log_id), membership);
                    non_command_response()
                }
            };
            responses.push(response);
            self.stats
                .apply_entry_seconds
                .observe(started.elapsed().as_secs_f64());
            self.stats
                .apply_entry_cpu_seconds
                .observe((thread_cpu_seconds() - cpu_started).max(0.0));
        }
        self.clock.publish(guard.state.clock_ms());
        drop(guard);
        self.stats.applied(asked, locked, responses.len() as u64);
        Ok(responses)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            data: self.data.clone(),
            snapshots: self.snapshots.clone(),
            stats: self.stats.clone(),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<tokio::fs::File>> {
        let slot = self.snapshots.clone();
        let file = tokio::task::spawn_blocking(move || slot.dir.new_receiving())
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?
            .map_err(|e| StorageIOError::write_snapshot(None, &e))?;
        Ok(Box::new(tokio::fs::File::from_std(file)))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<tokio::fs::File>,
    ) -> StoreResult<()> {
        let started = Instant::now();
        let mut file = *snapshot;
        // openraft shuts the stream down before it installs; a write still in tokio's buffer
        // would otherwise be missing from the file.
        let flushed = tokio::io::AsyncWriteExt::flush(&mut file).await;
        let file = file.into_std().await;
        if let Err(e) = flushed {
            self.snapshots.dir.discard_received(&file);
            return Err(StorageIOError::write_snapshot(Some(meta.signature()), &e).into());
        }
        let slot = self.snapshots.clone();
        let owned_meta = meta.clone();
        let (state, size) =
            tokio::task::spawn_blocking(move || check_and_persist(&slot, &owned_meta, file))
                .await
                .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))??;
        let mut guard = self.data.write().map_err(|_| poisoned())?;
        *guard = StateMachineData {
            last_applied: meta.last_log_id,
            last_membership: meta.last_membership.clone(),
            state,
        };
        self.clock.publish(guard.state.clock_ms());
        drop(guard);
        self.stats
            .snapshot_written(&self.stats.snapshot_install_seconds, started, size as usize);
        tracing::info!(%meta, "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot>> {
        let slot = self.snapshots.clone();
        tokio::task::spawn_blocking(move || -> Result<_, StorageIOError<NodeId>> {
            let refused = |e: &(dyn std::error::Error + 'static)| {
                StorageIOError::read_snapshot(None, AnyError::from_dyn(e, None))
            };
            let Some(mut file) = slot.dir.open_current().map_err(|e| refused(&e))? else {
                return Ok(None);
            };
            // Re-check the checksum so a file damaged on disk is never shipped to a follower.
            let found = read_envelope(&mut file).map_err(|e| refused(&e))?;
            file.seek(SeekFrom::Start(0)).map_err(|e| refused(&e))?;
            Ok(Some(Snapshot {
                meta: found.meta,
                snapshot: Box::new(tokio::fs::File::from_std(file)),
            }))
        })
        .await
        .map_err(|e| StorageIOError::read_snapshot(None, &e))?
        .map_err(StorageError::from)
    }
}
