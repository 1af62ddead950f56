//! Squadron's Raft storage on RocksDB: the log, the vote, and the state machine that applies
//! committed commands to the deterministic core. The only crate that touches RocksDB.
//!
//! On-disk layout under the directory given to [`open`]:
//!
//! ```text
//! <dir>/log/                 RocksDB: column families `log` (entries) and `meta` (vote,
//!                            last purged id, committed id, store format)
//! <dir>/snapshot/current.snap  the latest snapshot envelope (see `snapshot_file`)
//! ```
//!
//! Map of the crate: `codec` (value encoding), `log_store` ([`LogStore`]), `state_machine`
//! ([`StateMachineStore`], [`StateReader`]), `machine_stats` ([`MachineStats`]: apply and
//! snapshot costs), `snapshot_file` (snapshot envelope and file),
//! `type_config` (openraft types).

pub mod codec;
mod legacy_addr;
pub mod log_store;
pub mod machine_stats;
pub mod replicated_clock;
pub mod snapshot_file;
pub mod state_machine;
pub mod type_config;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::{ColumnFamilyDescriptor, Options, DB};

pub use log_store::{AppendStats, LogStore};
pub use machine_stats::MachineStats;
pub use replicated_clock::{monotonic_us, ReplicatedClock};
pub use snapshot_file::EnvelopeError;
pub use state_machine::{
    non_command_response, SnapshotBuilder, StateMachineData, StateMachineStore, StateReader,
};
pub use type_config::{NodeAddr, NodeId, TypeConfig};

use log_store::{CF_LOG, CF_META, KEY_FORMAT};
use snapshot_file::SnapshotDir;

/// Version of the on-disk layout (key scheme and column families), recorded in `meta`.
pub const STORE_FORMAT_VERSION: u8 = 1;
/// Subdirectory of the RocksDB instance.
pub const LOG_DIR_NAME: &str = "log";
/// Subdirectory of the snapshot file.
pub const SNAPSHOT_DIR_NAME: &str = "snapshot";

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("RocksDB at {path}: {source}")]
    Db {
        path: PathBuf,
        source: rocksdb::Error,
    },
    #[error("I/O on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store at {path} has format {found:?}; this build reads format {supported}")]
    UnsupportedFormat {
        path: PathBuf,
        found: Vec<u8>,
        supported: u8,
    },
    #[error("snapshot {path} is refused: {source}")]
    CorruptSnapshot {
        path: PathBuf,
        source: EnvelopeError,
    },
    #[error("opening the store failed in its background task: {0}")]
    Task(String),
}

/// Opens (or creates) the store under `dir`: the log storage and the state machine, the
/// latter loaded from the latest snapshot. openraft re-applies the log after it.
pub async fn open(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    let dir = dir.to_path_buf();
    // Opening RocksDB and decoding a snapshot are blocking and can be slow.
    tokio::task::spawn_blocking(move || open_blocking(&dir))
        .await
        .map_err(|e| StoreError::Task(e.to_string()))?
}

fn open_blocking(dir: &Path) -> Result<(LogStore, StateMachineStore), StoreError> {
    let log_path = dir.join(LOG_DIR_NAME);
    let db_err = |source| StoreError::Db {
        path: log_path.clone(),
        source,
    };
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    let cfs = [
        ColumnFamilyDescriptor::new(CF_LOG, Options::default()),
        ColumnFamilyDescriptor::new(CF_META, Options::default()),
    ];
    let db = DB::open_cf_descriptors(&opts, &log_path, cfs).map_err(db_err)?;
    check_format(&db, &log_path)?;

    let snapshots =
        SnapshotDir::open(dir.join(SNAPSHOT_DIR_NAME)).map_err(|source| StoreError::Io {
            path: dir.join(SNAPSHOT_DIR_NAME),
            source,
        })?;
    let state_machine = StateMachineStore::load(snapshots)?;
    Ok((LogStore::new(Arc::new(db)), state_machine))
}

/// Records the layout version in a new store and refuses a store written in another one.
fn check_format(db: &DB, path: &Path) -> Result<(), StoreError> {
    let db_err = |source| StoreError::Db {
        path: path.to_path_buf(),
        source,
    };
    let missing = || StoreError::Io {
        path: path.to_path_buf(),
        source: std::io::Error::other("column family meta is missing"),
    };
    let meta = db.cf_handle(CF_META).ok_or_else(missing)?;
    match db.get_cf(meta, KEY_FORMAT).map_err(db_err)? {
        Some(found) if found != [STORE_FORMAT_VERSION] => Err(StoreError::UnsupportedFormat {
            path: path.to_path_buf(),
            found,
            supported: STORE_FORMAT_VERSION,
        }),
        Some(_) => Ok(()),
        None => {
            let mut write = rocksdb::WriteOptions::default();
            write.set_sync(true);
            db.put_cf_opt(meta, KEY_FORMAT, [STORE_FORMAT_VERSION], &write)
                .map_err(db_err)
        }
    }
}

#[cfg(test)]
mod tests;
