//! A small tmpfs per credential session (INV-13): the values live in memory only, never on a
//! disk a later reader (or a backup) could find, and unmounting drops them at once. Mounted
//! `nosuid,nodev,noexec`, bounded in size, on a host directory the worker owns; the runtimes
//! bind it read-only into the sandbox.

use std::ffi::CString;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use rustix::mount::{mount, unmount, MountFlags, UnmountFlags};

use crate::error::IsolationError;

/// Size of one session's tmpfs: a few keys and tokens.
pub const SECRET_TMPFS_BYTES_DEFAULT: u64 = 1024 * 1024;

/// Mounts a fresh tmpfs on `dir` (created when missing) unless one is mounted there already.
/// Its root is 0700 root's until the worker hands it to the sandbox user.
pub fn mount_secret_tmpfs(dir: &Path, bytes: u64) -> Result<(), IsolationError> {
    std::fs::create_dir_all(dir).map_err(|e| IsolationError::io("create", dir, e))?;
    if is_mount_point(dir)? {
        return Ok(());
    }
    let data = CString::new(format!("size={bytes},mode=0700"))
        .map_err(|_| IsolationError::Launch("tmpfs options hold a NUL".into()))?;
    mount(
        "squadron-credentials",
        dir,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        data.as_c_str(),
    )
    .map_err(|e| IsolationError::io("mount tmpfs on", dir, e.into()))
}

/// Unlinks what the tmpfs holds (so a sandbox still holding the bind sees nothing either),
/// detaches it and removes the directory. Missing is fine: wiping twice is wiping once.
pub fn wipe_secret_tmpfs(dir: &Path) -> Result<(), IsolationError> {
    if !dir.exists() {
        return Ok(());
    }
    if is_mount_point(dir)? {
        let entries = std::fs::read_dir(dir).map_err(|e| IsolationError::io("list", dir, e))?;
        for entry in entries.flatten() {
            let path = entry.path();
            // Only the worker writes here; a failure to unlink still ends with the unmount.
            let _ = std::fs::remove_file(&path);
        }
        unmount(dir, UnmountFlags::DETACH)
            .map_err(|e| IsolationError::io("unmount", dir, e.into()))?;
    }
    std::fs::remove_dir_all(dir).map_err(|e| IsolationError::io("remove", dir, e))
}

/// Whether `dir` is the root of a mount: another device than its parent's.
pub fn is_mount_point(dir: &Path) -> Result<bool, IsolationError> {
    let meta = std::fs::symlink_metadata(dir).map_err(|e| IsolationError::io("inspect", dir, e))?;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    let up = std::fs::metadata(parent).map_err(|e| IsolationError::io("inspect", parent, e))?;
    Ok(meta.dev() != up.dev())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_tmpfs_holds_files_in_memory_and_wiping_leaves_nothing() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("task-1-a1");
        mount_secret_tmpfs(&dir, SECRET_TMPFS_BYTES_DEFAULT).unwrap();
        assert!(is_mount_point(&dir).unwrap());
        // Mounting again is a no-op, not a second layer.
        mount_secret_tmpfs(&dir, SECRET_TMPFS_BYTES_DEFAULT).unwrap();
        std::fs::write(dir.join("key"), b"sk-1").unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mounts
            .lines()
            .find(|l| l.contains(&dir.display().to_string()))
            .expect("listed");
        assert!(line.contains("tmpfs") && line.contains("nosuid") && line.contains("noexec"));
        // The size bound holds: a file beyond it fails.
        let big = vec![0u8; (SECRET_TMPFS_BYTES_DEFAULT as usize) * 2];
        assert!(std::fs::write(dir.join("big"), big).is_err());
        wipe_secret_tmpfs(&dir).unwrap();
        assert!(!dir.exists());
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mounts.contains(&dir.display().to_string()));
        wipe_secret_tmpfs(&dir).unwrap();
    }
}
