//! A disk quota for one directory: an ext4 filesystem in a sparse image file, loop-mounted on
//! the directory. Whatever a sandbox writes beneath it counts against the image's size, so a
//! task cannot fill the host's disk; the host's filesystem needs no project quotas.
//!
//! Blocks for root are reserved above the quota ([`QUOTA_HEADROOM_BYTES`]): the sandbox (an
//! unprivileged uid) meets `ENOSPC` at the quota while the worker (root) can still write its
//! checkpoint and collect. Mounted `nosuid,nodev`; not `noexec`, since agents run what they
//! build.

use std::path::{Path, PathBuf};

use rustix::mount::{mount_bind, unmount, UnmountFlags};

use crate::error::IsolationError;
use crate::sandbox_network::run;
use crate::secret_tmpfs::is_mount_point;

/// Smallest quota accepted: below this ext4's own metadata would eat most of it.
pub const QUOTA_BYTES_MIN: u64 = 16 * 1024 * 1024;
/// Largest quota accepted (the image is sparse: only written blocks cost host space).
pub const QUOTA_BYTES_MAX: u64 = 16 * 1024 * 1024 * 1024 * 1024;
/// Space beyond the quota reserved for root (the worker's own files).
pub const QUOTA_HEADROOM_BYTES: u64 = 8 * 1024 * 1024;
/// Below this much left for an unprivileged writer the quota counts as used up: ext4 keeps a
/// few blocks back (delayed allocation), so a writer meets `ENOSPC` with some still shown.
pub const QUOTA_EXHAUSTED_BYTES: u64 = 1024 * 1024;
/// Below this many free inodes the quota counts as used up, leaving the worker a few for its
/// checkpoint and the collection.
pub const QUOTA_EXHAUSTED_INODES: u64 = 256;

const MKFS: &str = "/usr/sbin/mkfs.ext4";
const MOUNT: &str = "/usr/bin/mount";
const FSCK: &str = "/usr/sbin/e2fsck";

/// The quota of one directory: its image and its mount point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskQuota {
    image: PathBuf,
    mount: PathBuf,
    /// Whether a new image gets a journal (see [`DiskQuota::journaled`]).
    journal: bool,
}

impl DiskQuota {
    pub fn new(image: impl Into<PathBuf>, mount: impl Into<PathBuf>) -> Self {
        Self {
            image: image.into(),
            mount: mount.into(),
            journal: false,
        }
    }

    /// A new image gets a journal: for a volume that holds long-lived data through host
    /// crashes (a project's clone and worktrees), which a journal-less filesystem may come
    /// back from needing a repair `e2fsck -p` refuses. A task's short-lived volume goes
    /// without (less to write; it is copied out and deleted at the task's end).
    pub fn journaled(mut self) -> Self {
        self.journal = true;
        self
    }

    /// The quota an existing image was made with (its size less the root headroom).
    pub fn made_bytes(&self) -> Result<u64, IsolationError> {
        let meta = std::fs::metadata(&self.image)
            .map_err(|e| IsolationError::io("inspect", &self.image, e))?;
        Ok(meta.len().saturating_sub(QUOTA_HEADROOM_BYTES))
    }

    /// The image file holding the filesystem.
    pub fn image(&self) -> &Path {
        &self.image
    }

    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// Makes the image (when missing) and mounts it on the directory (when not mounted yet):
    /// a second call is a no-op, so a restarted worker adopts the mount it left. Whatever
    /// the directory held before is hidden beneath the mount.
    pub fn ensure(&self, quota_bytes: u64) -> Result<(), IsolationError> {
        if !(QUOTA_BYTES_MIN..=QUOTA_BYTES_MAX).contains(&quota_bytes) {
            return Err(IsolationError::invalid(
                "disk",
                format!("{quota_bytes} bytes is outside {QUOTA_BYTES_MIN}..={QUOTA_BYTES_MAX}"),
            ));
        }
        if !self.image.exists() {
            self.make_image(quota_bytes)?;
        }
        self.remount()
    }

    /// Mounts an existing image (again, after a reboot dropped the mount); a no-op when it is
    /// mounted.
    pub fn remount(&self) -> Result<(), IsolationError> {
        std::fs::create_dir_all(&self.mount)
            .map_err(|e| IsolationError::io("create", &self.mount, e))?;
        if self.is_mounted()? {
            return Ok(());
        }
        // Possibly cut off mid-write (the host went down; a task's image has no journal):
        // checked and repaired first; `-p` fixes only what is safe and fails on the rest (a clean image,
        // as a fresh one is, is passed at once).
        let image = path_text(&self.image)?;
        match run(Path::new(FSCK), &["-p", image], None) {
            Ok(_) => {}
            // Exit code 1: errors corrected.
            Err(IsolationError::Launch(m)) if m.contains("exit status: 1)") => {}
            Err(e) => return Err(e),
        }
        self.mount_image()
    }

    fn mount_image(&self) -> Result<(), IsolationError> {
        let image = path_text(&self.image)?;
        let mount = path_text(&self.mount)?;
        run(
            Path::new(MOUNT),
            // `discard`: a deleted file's blocks are punched out of the sparse image, so the
            // host gets its space back while the volume lives on.
            &[
                "-t",
                "ext4",
                "-o",
                "loop,nosuid,nodev,discard",
                image,
                mount,
            ],
            None,
        )?;
        Ok(())
    }

    fn make_image(&self, quota_bytes: u64) -> Result<(), IsolationError> {
        if let Some(dir) = self.image.parent() {
            std::fs::create_dir_all(dir).map_err(|e| IsolationError::io("create", dir, e))?;
        }
        let total = quota_bytes + QUOTA_HEADROOM_BYTES;
        // Written under a temporary name: a crash mid-mkfs leaves no half-made image that a
        // later `ensure` would try to mount.
        let partial = self.image.with_extension("partial");
        let file = std::fs::File::create(&partial)
            .map_err(|e| IsolationError::io("create", &partial, e))?;
        file.set_len(total)
            .map_err(|e| IsolationError::io("size", &partial, e))?;
        drop(file);
        // mke2fs reads `-m` as a (fractional) percentage of the blocks.
        let reserved = format!("{:.4}", QUOTA_HEADROOM_BYTES as f64 * 100.0 / total as f64);
        let target = path_text(&partial)?;
        let journal = if self.journal {
            "has_journal"
        } else {
            "^has_journal"
        };
        run(
            Path::new(MKFS),
            &[
                "-q",
                "-F",
                "-O",
                journal,
                "-E",
                "lazy_itable_init=1,root_owner=0:0",
                "-m",
                &reserved,
                target,
            ],
            None,
        )?;
        std::fs::rename(&partial, &self.image)
            .map_err(|e| IsolationError::io("rename", &partial, e))
    }

    pub fn is_mounted(&self) -> Result<bool, IsolationError> {
        if !self.mount.exists() {
            return Ok(false);
        }
        is_mount_point(&self.mount)
    }

    /// Whether an unprivileged writer has (next to) nothing left — blocks or inodes (ext4
    /// keeps no inodes back for root, so many empty files are a way to fill it too).
    pub fn exhausted(&self) -> Result<bool, IsolationError> {
        let st = rustix::fs::statvfs(&self.mount)
            .map_err(|e| IsolationError::io("statvfs", &self.mount, e.into()))?;
        let bytes = st.f_bavail.saturating_mul(st.f_frsize);
        Ok(bytes < QUOTA_EXHAUSTED_BYTES || st.f_favail < QUOTA_EXHAUSTED_INODES)
    }

    /// Bytes written beneath the mount (blocks in use, metadata included).
    pub fn used_bytes(&self) -> Result<u64, IsolationError> {
        let st = rustix::fs::statvfs(&self.mount)
            .map_err(|e| IsolationError::io("statvfs", &self.mount, e.into()))?;
        Ok(st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize)
    }

    /// Unmounts (detaching if something still holds it open); the image stays until
    /// [`DiskQuota::remove_image`], so a caller can put a copy in place first.
    pub fn unmount(&self) -> Result<(), IsolationError> {
        if !self.is_mounted()? {
            return Ok(());
        }
        // Flushed first: the unmount's own flush runs after the mount has gone from view, so
        // a big one would leave the directory empty for that long.
        let root = std::fs::File::open(&self.mount)
            .map_err(|e| IsolationError::io("open", &self.mount, e))?;
        rustix::fs::syncfs(&root).map_err(|e| IsolationError::io("sync", &self.mount, e.into()))?;
        drop(root);
        if unmount(&self.mount, UnmountFlags::empty()).is_err() {
            unmount(&self.mount, UnmountFlags::DETACH)
                .map_err(|e| IsolationError::io("unmount", &self.mount, e.into()))?;
        }
        Ok(())
    }

    /// Deletes the image (a missing one is fine).
    pub fn remove_image(&self) -> Result<(), IsolationError> {
        match std::fs::remove_file(&self.image) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(IsolationError::io("remove", &self.image, e)),
        }
    }
}

/// Shows `source` (a directory outside any quota) at `target` inside a quota's mount, so what
/// is written there counts against the host instead: the worker's own records, which must be
/// writable when the sandbox has filled its volume. A no-op when `target` is a mount already.
pub fn bind_outside(source: &Path, target: &Path) -> Result<(), IsolationError> {
    std::fs::create_dir_all(source).map_err(|e| IsolationError::io("create", source, e))?;
    std::fs::create_dir_all(target).map_err(|e| IsolationError::io("create", target, e))?;
    if is_mount_point(target)? {
        return Ok(());
    }
    mount_bind(source, target).map_err(|e| IsolationError::io("bind-mount on", target, e.into()))
}

fn path_text(p: &Path) -> Result<&str, IsolationError> {
    p.to_str()
        .ok_or_else(|| IsolationError::invalid("path", format!("{} is not UTF-8", p.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn writes_beyond_the_quota_fail_and_root_keeps_its_headroom() {
        let base = tempfile::tempdir().unwrap();
        let quota = DiskQuota::new(base.path().join("q.img"), base.path().join("task"));
        quota.ensure(QUOTA_BYTES_MIN).unwrap();
        assert!(quota.is_mounted().unwrap());
        // Adopting the mount again changes nothing.
        quota.ensure(QUOTA_BYTES_MIN).unwrap();
        let image = std::fs::metadata(base.path().join("q.img")).unwrap();
        assert_eq!(image.len(), QUOTA_BYTES_MIN + QUOTA_HEADROOM_BYTES);
        // This test writes as root, which may use the reserve too: the writes still end at the
        // image's size, and an unprivileged writer has nothing left.
        let mut f = std::fs::File::create(quota.mount_point().join("fill")).unwrap();
        let chunk = vec![7u8; 1 << 20];
        let mut written = 0u64;
        while f.write_all(&chunk).is_ok() {
            written += chunk.len() as u64;
            assert!(
                written <= 2 * QUOTA_BYTES_MIN + QUOTA_HEADROOM_BYTES,
                "no limit"
            );
        }
        assert!(quota.exhausted().unwrap(), "the quota is not exhausted");
        assert!(written <= QUOTA_BYTES_MIN + QUOTA_HEADROOM_BYTES);
        assert!(quota.used_bytes().unwrap() >= QUOTA_BYTES_MIN / 2);
        drop(f);
        quota.unmount().unwrap();
        quota.remove_image().unwrap();
        assert!(!quota.is_mounted().unwrap());
        assert!(!base.path().join("q.img").exists());
        assert_eq!(std::fs::read_dir(quota.mount_point()).unwrap().count(), 0);
    }

    #[test]
    fn many_empty_files_use_the_quota_up_too() {
        let base = tempfile::tempdir().unwrap();
        let quota = DiskQuota::new(base.path().join("q.img"), base.path().join("task"));
        quota.ensure(QUOTA_BYTES_MIN).unwrap();
        let mut made = 0u32;
        while std::fs::File::create(quota.mount_point().join(format!("f{made}"))).is_ok() {
            made += 1;
            assert!(made < 1_000_000, "no inode limit");
        }
        assert!(quota.exhausted().unwrap(), "{made} files and not exhausted");
        assert!(
            quota.used_bytes().unwrap() < QUOTA_BYTES_MIN,
            "the blocks are not what ran out"
        );
        quota.unmount().unwrap();
        quota.remove_image().unwrap();
    }

    #[test]
    fn a_quota_out_of_bounds_is_refused_naming_disk() {
        let base = tempfile::tempdir().unwrap();
        let quota = DiskQuota::new(base.path().join("q.img"), base.path().join("task"));
        let e = quota.ensure(1024).unwrap_err();
        assert!(e.to_string().contains("disk"), "{e}");
        assert!(!base.path().join("q.img").exists());
    }
}
