//! The Raft log and vote on RocksDB.
//!
//! Column family `log`: key = big-endian u64 index (so byte order is index order), value = the
//! entry encoded by [`crate::codec`]. Column family `meta`: the vote, the last purged log id,
//! the committed log id and the store format version, each under a fixed key.
//!
//! Every write goes through one `WriteBatch`. Vote, truncate and purge are synced before they
//! return. Appends use group commit: the entries are written at once (so they are readable
//! when `append` returns, as openraft requires) and a flusher thread then syncs the WAL once
//! for every append queued meanwhile and only then reports each of them flushed. RocksDB's WAL
//! is sequential, so a write becomes durable with the next sync and never overtakes an
//! earlier one.

// openraft's traits fix the error type; its size is not ours to choose.
#![allow(clippy::result_large_err)]

use std::fmt;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::Arc;

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{AnyError, OptionalSend, StorageError, StorageIOError};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use rocksdb::{ColumnFamily, Direction, IteratorMode, ReadOptions, WriteBatch, WriteOptions, DB};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::codec;
use crate::type_config::{Entry, LogId, NodeId, TypeConfig, Vote};

/// Column family of the log entries.
pub const CF_LOG: &str = "log";
/// Column family of the vote, purge and commit pointers.
pub const CF_META: &str = "meta";

pub(crate) const KEY_VOTE: &[u8] = b"vote";
pub(crate) const KEY_LAST_PURGED: &[u8] = b"last_purged";
pub(crate) const KEY_COMMITTED: &[u8] = b"committed";
pub(crate) const KEY_FORMAT: &[u8] = b"format";

/// Most entries one `limited_get_log_entries` call returns, so that one replication message
/// stays bounded however far a follower lags.
pub const LOG_READ_ENTRIES_MAX: usize = 4096;
/// Most encoded bytes one `limited_get_log_entries` call returns (the first entry is returned
/// even when it alone is larger).
pub const LOG_READ_BYTES_MAX: usize = 8 * 1024 * 1024;

type StoreResult<T> = Result<T, StorageError<NodeId>>;

/// The Raft log storage. Cloning is cheap (one shared RocksDB handle); the clone handed out as
/// the log reader reads the same database.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<DB>,
    stats: Arc<AppendStats>,
    flusher: Arc<Flusher>,
}

/// Most appends one WAL sync completes; the rest wait for the next.
pub const FLUSH_GROUP_APPENDS_MAX: usize = 1024;

/// Work for the flusher, in submission order.
enum FlushJob {
    /// An append written unsynced, waiting for its WAL sync.
    Append {
        callback: LogFlushed<TypeConfig>,
        entries: u64,
    },
    /// Answered once every append submitted before it is durable and reported: vote,
    /// truncate and purge wait for it, so no write is applied before an earlier one has
    /// completed (openraft's rule for log storage).
    Barrier(tokio::sync::oneshot::Sender<()>),
}

/// The group-commit thread's queue. Dropping the last store clone closes the queue and joins
/// the thread, so the database is released when the store is (a reopen needs its lock).
struct Flusher {
    queue: std::sync::Mutex<Option<std::sync::mpsc::Sender<FlushJob>>>,
    thread: std::sync::Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for Flusher {
    fn drop(&mut self) {
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(handle) = handle {
            let _ = handle.join();
        }
    }
}

impl Flusher {
    fn start(db: Arc<DB>, stats: Arc<AppendStats>) -> Arc<Self> {
        let (tx, rx) = std::sync::mpsc::channel::<FlushJob>();
        let spawned = std::thread::Builder::new()
            .name("raft-log-flush".into())
            .spawn(move || flush_loop(&db, &stats, &rx));
        let thread = match spawned {
            Ok(handle) => Some(handle),
            Err(e) => {
                // Without the thread every append reports an error instead of hanging.
                tracing::error!(error = %e, "cannot start the log flusher thread");
                None
            }
        };
        Arc::new(Self {
            queue: std::sync::Mutex::new(thread.is_some().then_some(tx)),
            thread: std::sync::Mutex::new(thread),
        })
    }

    fn submit(&self, job: FlushJob) {
        let sent = match self.queue.lock() {
            Ok(q) => match q.as_ref() {
                Some(q) => q.send(job).map_err(|e| e.0),
                None => Err(job),
            },
            Err(_) => Err(job),
        };
        match sent {
            Ok(()) => {}
            Err(FlushJob::Append { callback, .. }) => {
                callback.log_io_completed(Err(io::Error::other("the log flusher has stopped")))
            }
            Err(FlushJob::Barrier(done)) => {
                let _ = done.send(());
            }
        }
    }

    /// Waits until every append submitted so far is durable and reported.
    async fn barrier(&self) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit(FlushJob::Barrier(tx));
        let _ = rx.await;
    }
}

/// How often a node with the deliberate fault `skip-wal-sync` syncs its WAL.
#[cfg(feature = "jepsen-faults")]
const FAULTY_WAL_SYNC_INTERVAL_MS: u64 = 1_000;

/// Whether this group of appends syncs the WAL before it is reported flushed: always, except
/// in a node built for the chaos suite with the deliberate fault `skip-wal-sync`, which syncs
/// at most once a second and acknowledges the appends between unsynced (so the cluster's
/// first entries survive and a crash loses recent acknowledged writes, not the whole
/// cluster). The lazy filesystem's crashes must catch it.
fn sync_wal(last_sync: &mut std::time::Instant) -> bool {
    #[cfg(feature = "jepsen-faults")]
    {
        static SKIP: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let skip = *SKIP.get_or_init(|| {
            let on = std::env::var("SQUADRON_JEPSEN_FAULT").is_ok_and(|v| v == "skip-wal-sync");
            if on {
                tracing::warn!(
                    "DELIBERATE FAULT ACTIVE (SQUADRON_JEPSEN_FAULT=skip-wal-sync): appends \
                     are acknowledged without syncing the WAL (synced once a second)"
                );
            }
            on
        });
        let due = std::time::Duration::from_millis(FAULTY_WAL_SYNC_INTERVAL_MS);
        if skip && last_sync.elapsed() < due {
            return false;
        }
    }
    *last_sync = std::time::Instant::now();
    true
}

fn flush_loop(db: &DB, stats: &AppendStats, rx: &std::sync::mpsc::Receiver<FlushJob>) {
    use std::sync::atomic::Ordering;
    let mut last_sync = std::time::Instant::now();
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        while jobs.len() < FLUSH_GROUP_APPENDS_MAX {
            match rx.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let entries: u64 = jobs
            .iter()
            .map(|j| match j {
                FlushJob::Append { entries, .. } => *entries,
                FlushJob::Barrier(_) => 0,
            })
            .sum();
        let synced = if entries > 0 {
            stats.appends.fetch_add(1, Ordering::Relaxed);
            stats.entries.fetch_add(entries, Ordering::Relaxed);
            stats.entries_per_sync.observe(entries as f64);
            let sync = sync_wal(&mut last_sync);
            let started = std::time::Instant::now();
            let flushed = db.flush_wal(sync);
            if sync {
                stats.sync_seconds.observe(started.elapsed().as_secs_f64());
            }
            flushed
        } else {
            Ok(())
        };
        let mut barriers = Vec::new();
        for job in jobs {
            match job {
                FlushJob::Append { callback, .. } => {
                    let result = match &synced {
                        Ok(()) => Ok(()),
                        Err(e) => Err(io::Error::other(format!("syncing the log: {e}"))),
                    };
                    callback.log_io_completed(result);
                }
                FlushJob::Barrier(done) => barriers.push(done),
            }
        }
        for done in barriers {
            let _ = done.send(());
        }
    }
}

/// Group commit at work: `entries / appends` is how many log entries share one fsync.
#[derive(Debug)]
pub struct AppendStats {
    /// WAL syncs made for appends.
    pub appends: std::sync::atomic::AtomicU64,
    /// Entries those syncs made durable.
    pub entries: std::sync::atomic::AtomicU64,
    /// How long each WAL sync took (`/metrics`: the fsync floor of every write).
    pub sync_seconds: Histogram,
    /// Log entries each append made durable.
    pub entries_per_sync: Histogram,
}

impl Default for AppendStats {
    fn default() -> Self {
        AppendStats {
            appends: Default::default(),
            entries: Default::default(),
            // 50 µs doubling to about 1.6 s: an fsync here is ~0.2 ms, a slow disk's 100 ms.
            sync_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            // 1 doubling to 4,096 entries (`FLUSH_GROUP_APPENDS_MAX` appends of many each).
            entries_per_sync: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
        }
    }
}

impl fmt::Debug for LogStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LogStore")
            .field("path", &self.db.path())
            .finish()
    }
}

/// The big-endian key of a log index.
pub(crate) fn index_key(index: u64) -> [u8; 8] {
    index.to_be_bytes()
}

fn key_index(key: &[u8]) -> Result<u64, StorageIOError<NodeId>> {
    let bytes: [u8; 8] = key.try_into().map_err(|_| {
        StorageIOError::read_logs(AnyError::error(format!(
            "log key of {} bytes, expected 8",
            key.len()
        )))
    })?;
    Ok(u64::from_be_bytes(bytes))
}

fn synced() -> WriteOptions {
    let mut opts = WriteOptions::default();
    opts.set_sync(true);
    opts
}

fn decode_entry(key: &[u8], value: &[u8]) -> Result<Entry, StorageIOError<NodeId>> {
    let index = key_index(key)?;
    let entry: Entry =
        codec::decode_entry(value).map_err(|e| StorageIOError::read_log_at_index(index, &e))?;
    // A value filed under the wrong key would break log continuity silently; refuse it.
    if entry.log_id.index != index {
        return Err(StorageIOError::read_log_at_index(
            index,
            AnyError::error(format!(
                "entry under key {index} carries index {}",
                entry.log_id.index
            )),
        ));
    }
    Ok(entry)
}

impl LogStore {
    pub(crate) fn new(db: Arc<DB>) -> Self {
        let stats = Arc::new(AppendStats::default());
        let flusher = Flusher::start(db.clone(), stats.clone());
        Self { db, stats, flusher }
    }

    /// The append counters, shared with whoever reports them.
    pub fn append_stats(&self) -> Arc<AppendStats> {
        self.stats.clone()
    }

    fn cf(&self, name: &str) -> Result<&ColumnFamily, StorageIOError<NodeId>> {
        self.db.cf_handle(name).ok_or_else(|| {
            StorageIOError::read(AnyError::error(format!("column family {name} is missing")))
        })
    }

    fn read_meta<T: DeserializeOwned>(
        &self,
        key: &[u8],
        err: fn(AnyError) -> StorageIOError<NodeId>,
    ) -> StoreResult<Option<T>> {
        let cf = self.cf(CF_META)?;
        let Some(bytes) = self
            .db
            .get_pinned_cf(cf, key)
            .map_err(|e| err(AnyError::new(&e)))?
        else {
            return Ok(None);
        };
        let value = codec::decode(&bytes).map_err(|e| err(AnyError::new(&e)))?;
        Ok(Some(value))
    }

    fn write_meta<T: Serialize>(
        &self,
        key: &[u8],
        value: &T,
        sync: bool,
        err: fn(AnyError) -> StorageIOError<NodeId>,
    ) -> StoreResult<()> {
        let cf = self.cf(CF_META)?;
        let bytes = codec::encode(value).map_err(|e| err(AnyError::new(&e)))?;
        let mut batch = WriteBatch::default();
        batch.put_cf(cf, key, bytes);
        let opts = if sync {
            synced()
        } else {
            WriteOptions::default()
        };
        self.db
            .write_opt(batch, &opts)
            .map_err(|e| err(AnyError::new(&e)))?;
        Ok(())
    }

    fn last_purged(&self) -> StoreResult<Option<LogId>> {
        self.read_meta(KEY_LAST_PURGED, StorageIOError::read_logs)
    }

    /// Reads entries with index in `[start, end)` (`end = None`: to the last entry), stopping
    /// early at the given limits; at least one entry is returned when any is present.
    fn read_range(
        &self,
        start: u64,
        end: Option<u64>,
        entries_max: usize,
        bytes_max: usize,
    ) -> StoreResult<Vec<Entry>> {
        if end.is_some_and(|end| end <= start) {
            return Ok(Vec::new());
        }
        let cf = self.cf(CF_LOG)?;
        let mut opts = ReadOptions::default();
        if let Some(end) = end {
            // The bound lets RocksDB stop at the end key instead of scanning past it.
            opts.set_iterate_upper_bound(index_key(end).to_vec());
        }
        let start_key = index_key(start);
        let iter =
            self.db
                .iterator_cf_opt(cf, opts, IteratorMode::From(&start_key, Direction::Forward));
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for item in iter {
            let (key, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
            if !out.is_empty() && (out.len() >= entries_max || bytes + value.len() > bytes_max) {
                break;
            }
            bytes += value.len();
            out.push(decode_entry(&key, &value)?);
        }
        Ok(out)
    }

    /// The id of the last entry present, if any.
    fn last_entry_id(&self) -> StoreResult<Option<LogId>> {
        let cf = self.cf(CF_LOG)?;
        let mut iter = self.db.iterator_cf(cf, IteratorMode::End);
        match iter.next() {
            None => Ok(None),
            Some(item) => {
                let (key, value) = item.map_err(|e| StorageIOError::read_logs(&e))?;
                Ok(Some(decode_entry(&key, &value)?.log_id))
            }
        }
    }
}

/// Converts a range over indexes to `[start, end)`, `end = None` meaning unbounded; `None`
/// overall means the range is empty.
fn index_bounds(range: &impl RangeBounds<u64>) -> Option<(u64, Option<u64>)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.checked_add(1)?,
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => None,
    };
    Some((start, end))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + fmt::Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry>> {
        let Some((start, end)) = index_bounds(&range) else {
            return Ok(Vec::new());
        };
        // openraft expects every present entry of the range here (it checks continuity), so
        // only the range bounds this read, not a count.
        self.read_range(start, end, usize::MAX, usize::MAX)
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> StoreResult<Vec<Entry>> {
        self.read_range(start, Some(end), LOG_READ_ENTRIES_MAX, LOG_READ_BYTES_MAX)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let last_purged_log_id = self.last_purged()?;
        let last_entry = self.last_entry_id()?;
        // After a purge past the last entry the log is empty and the purge point is the last
        // log id; otherwise the last entry is newer than the purge point.
        let last_log_id = std::cmp::max(last_entry, last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> StoreResult<()> {
        // The vote must be on disk before openraft acts on it: synced, after earlier appends.
        self.flusher.barrier().await;
        self.write_meta(KEY_VOTE, vote, true, StorageIOError::write_vote)
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote>> {
        self.read_meta(KEY_VOTE, StorageIOError::read_vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> StoreResult<()> {
        // Not synced: losing the latest value only means re-applying less on restart, and the
        // sequential WAL makes it durable with the next synced write.
        self.write_meta(KEY_COMMITTED, &committed, false, StorageIOError::write)
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId>> {
        Ok(self
            .read_meta::<Option<LogId>>(KEY_COMMITTED, StorageIOError::read)?
            .flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batch = WriteBatch::default();
        let mut count = 0u64;
        {
            let cf = self.cf(CF_LOG)?;
            for entry in entries {
                let bytes = codec::encode(&entry)
                    .map_err(|e| StorageIOError::write_log_entry(entry.log_id, &e))?;
                batch.put_cf(cf, index_key(entry.log_id.index), bytes);
                count += 1;
            }
        }
        // Unsynced: the entries are readable at once; the flusher syncs the WAL for this and
        // every other append queued meanwhile, then reports them flushed.
        if let Err(e) = self.db.write_opt(batch, &WriteOptions::default()) {
            let err = StorageIOError::write_logs(&e);
            callback.log_io_completed(Err(io::Error::other(e.to_string())));
            return Err(err.into());
        }
        self.flusher.submit(FlushJob::Append {
            callback,
            entries: count,
        });
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> StoreResult<()> {
        self.flusher.barrier().await;
        let cf = self.cf(CF_LOG)?;
        let mut batch = WriteBatch::default();
        // delete_range's end is exclusive; the last possible key is deleted on its own.
        batch.delete_range_cf(cf, index_key(log_id.index), index_key(u64::MAX));
        batch.delete_cf(cf, index_key(u64::MAX));
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> StoreResult<()> {
        self.flusher.barrier().await;
        if self.last_purged()? >= Some(log_id) {
            return Ok(());
        }
        let log = self.cf(CF_LOG)?;
        let meta = self.cf(CF_META)?;
        let pointer = codec::encode(&log_id).map_err(|e| StorageIOError::write_logs(&e))?;
        let mut batch = WriteBatch::default();
        // Pointer and deletion in one atomic batch: the log never shows a hole without the
        // purge point that explains it.
        batch.put_cf(meta, KEY_LAST_PURGED, pointer);
        match log_id.index.checked_add(1) {
            Some(end) => batch.delete_range_cf(log, index_key(0), index_key(end)),
            None => {
                batch.delete_range_cf(log, index_key(0), index_key(u64::MAX));
                batch.delete_cf(log, index_key(u64::MAX));
            }
        }
        self.db
            .write_opt(batch, &synced())
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_bounds_cover_every_bound_kind() {
        assert_eq!(index_bounds(&(3..7)), Some((3, Some(7))));
        assert_eq!(index_bounds(&(3..=7)), Some((3, Some(8))));
        assert_eq!(index_bounds(&(3..)), Some((3, None)));
        assert_eq!(index_bounds(&(..)), Some((0, None)));
        assert_eq!(index_bounds(&(..=u64::MAX)), Some((0, None)));
        assert_eq!(
            index_bounds(&(Bound::Excluded(u64::MAX), Bound::Unbounded)),
            None
        );
    }

    #[test]
    fn keys_sort_in_index_order() {
        assert!(index_key(255) < index_key(256));
        assert_eq!(key_index(&index_key(42)).unwrap(), 42);
        assert!(key_index(b"short").is_err());
    }
}
