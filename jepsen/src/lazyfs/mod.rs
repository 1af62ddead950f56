//! A lazy fault filesystem for the suite, as LazyFS is for Jepsen and etcd's robustness
//! tests: mounted over a node's data directory, it keeps written data in memory until the
//! file is fsynced, and a `crash` drops what was not synced, which SIGKILL alone never does
//! (the kernel's page cache outlives the process). Written here, on `fuser`, because LazyFS
//! is C++ and not packaged by Debian.

mod fs;
mod inodes;
mod pending;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use fs::{Stats, DIRTY_BYTES_MAX};

#[derive(Debug, thiserror::Error)]
pub enum LazyFsError {
    #[error("lazyfs: cannot prepare {path}: {source}")]
    Prepare {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("lazyfs: cannot mount at {path} (needs root and /dev/fuse): {source}")]
    Mount {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A mounted lazy filesystem; unmounted when dropped.
pub struct LazyMount {
    mountpoint: PathBuf,
    state: Arc<Mutex<fs::State>>,
    session: Option<fuser::BackgroundSession>,
}

impl std::fmt::Debug for LazyMount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyMount")
            .field("mountpoint", &self.mountpoint)
            .finish_non_exhaustive()
    }
}

impl LazyMount {
    /// Mounts `disk` (created if missing) at `mountpoint` (created if missing).
    pub fn mount(disk: &Path, mountpoint: &Path) -> Result<Self, LazyFsError> {
        for dir in [disk, mountpoint] {
            std::fs::create_dir_all(dir).map_err(|source| LazyFsError::Prepare {
                path: dir.into(),
                source,
            })?;
        }
        let disk = disk.canonicalize().map_err(|source| LazyFsError::Prepare {
            path: disk.into(),
            source,
        })?;
        let state = Arc::new(Mutex::new(fs::State::new(disk)));
        let options = [
            fuser::MountOption::FSName("squadron-lazyfs".into()),
            fuser::MountOption::RW,
        ];
        let session = fuser::spawn_mount2(
            fs::LazyFs {
                state: state.clone(),
            },
            mountpoint,
            &options,
        )
        .map_err(|source| LazyFsError::Mount {
            path: mountpoint.into(),
            source,
        })?;
        Ok(Self {
            mountpoint: mountpoint.into(),
            state,
            session: Some(session),
        })
    }

    /// Drops every write not yet fsynced and refuses writes until `restart`: call it once
    /// the process using the filesystem is dead. Returns (files, bytes) lost.
    pub fn crash(&self) -> (u64, u64) {
        self.state().crash()
    }

    /// Accepts writes again (the process is about to start).
    pub fn restart(&self) {
        self.state().unfence();
    }

    pub fn stats(&self) -> Stats {
        self.state().stats
    }

    fn state(&self) -> std::sync::MutexGuard<'_, fs::State> {
        self.state.lock().expect("lazyfs state poisoned")
    }
}

impl Drop for LazyMount {
    fn drop(&mut self) {
        // Detach first: a plain unmount of a busy mount fails, and the session's own drop
        // would then wait forever for a kernel connection that never closes.
        let _ = rustix::mount::unmount(&self.mountpoint, rustix::mount::UnmountFlags::DETACH);
        drop(self.session.take());
    }
}
