//! The disk quota of a task's directory. From the start of STAGING until the task ends, the
//! whole directory (clone, `run/`, outbox, logs, checkpoint) is a loop-mounted ext4 image of
//! the quota's size (`squadron_isolation::disk_quota`), so a task that writes without end
//! meets `ENOSPC` and is stopped, and the host keeps its free space.
//!
//! When the task ends the volume is retired: what outlives the task (the manifest, the
//! checkpoint, the outbox with its logs and artifacts) is copied to a plain directory, the
//! image is unmounted and deleted, and the copy takes the directory's place — no loop device
//! is held for a finished task. A FAILED_PRESERVED task keeps its volume (the break-glass
//! workspace). A worker that died mid-retirement finishes it at its next start.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::io::Read as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use squadron_core::task::TaskState;
use squadron_isolation::disk_quota::DiskQuota;

use crate::error::WorkerError;
use crate::task::checkpoint::TaskCheckpoint;
use crate::task::task_dir::{TaskDir, STATE_JSON_NAME, UNREDACTED_MARKER_NAME};

// Every `vm.disk` a manifest may ask for is a quota the isolation crate can make.
const _: () = assert!(
    squadron_core::limits::SANDBOX_DISK_BYTES_MIN
        >= squadron_isolation::disk_quota::QUOTA_BYTES_MIN
        && squadron_core::limits::SANDBOX_DISK_BYTES_MAX
            <= squadron_isolation::disk_quota::QUOTA_BYTES_MAX
);

/// Where the images live, beneath the worker's data directory.
pub(crate) const VOLUMES_DIR: &str = "volumes";
/// Directory levels of the outbox copied at retirement (the collector walks no deeper).
const RETIRE_DEPTH_MAX: usize = 32;
/// Longest path a retirement copies to (below the kernel's PATH_MAX of 4096).
const RETIRE_PATH_BYTES_MAX: usize = 3_072;
/// The task-root files kept besides the outbox.
/// The worker's own files that outlive the volume (a VM's console: `runtime::kvm`; the mark
/// of an outbox that could not be redacted, without which its values would be served once
/// the volume is retired).
const KEPT_FILES: [&str; 4] = [
    "manifest.yaml",
    STATE_JSON_NAME,
    "vm-console.log",
    UNREDACTED_MARKER_NAME,
];

/// Whether this process may loop-mount (it runs as root): `/proc/self` belongs to the
/// effective uid.
pub(crate) fn may_mount() -> bool {
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

#[derive(Debug, Clone)]
pub(crate) struct TaskVolume {
    quota: DiskQuota,
    root: PathBuf,
    retired: PathBuf,
}

impl TaskVolume {
    pub(crate) fn of(data_dir: &Path, dir: &TaskDir) -> Self {
        let id = dir.task().get();
        let image = data_dir.join(VOLUMES_DIR).join(format!("{id}.img"));
        let root = dir.root().to_path_buf();
        let retired = Self::retired_dir(dir);
        Self {
            quota: DiskQuota::new(image, root.clone()),
            root,
            retired,
        }
    }

    /// Mounts the quota on the task directory, or adopts the mount a previous life left.
    pub(crate) fn ensure(&self, quota_bytes: u64) -> Result<(), WorkerError> {
        self.quota.ensure(quota_bytes).map_err(isolation)
    }

    /// Where a retirement keeps its copy of what outlives the task, beside the directory,
    /// until the copy moves in: `.{id}.retired`.
    pub(crate) fn retired_dir(dir: &TaskDir) -> PathBuf {
        dir.root()
            .with_file_name(format!(".{}.retired", dir.task().get()))
    }

    /// Whether a retirement is under way (or was interrupted): the copy exists.
    pub(crate) fn retiring(&self) -> bool {
        self.retired.exists()
    }

    /// Whether the task's files may still be inside its volume: mounted, being retired, or
    /// not known (an error counts as mounted).
    pub(crate) fn holds_files(&self) -> bool {
        self.retiring() || !matches!(self.quota.is_mounted(), Ok(false))
    }

    /// Whether the task used its quota up (`false` for a directory without one).
    pub(crate) fn exhausted(&self) -> bool {
        matches!(self.quota.is_mounted(), Ok(true)) && matches!(self.quota.exhausted(), Ok(true))
    }

    /// Copies what outlives the task out of the volume, releases the volume and puts the copy
    /// in the directory's place. A directory without a volume is left as it is.
    pub(crate) fn retire(&self) -> Result<(), WorkerError> {
        if !self.quota.is_mounted().map_err(isolation)? {
            // Interrupted after the unmount: finish. An image without its mount (the host
            // rebooted) is left for the sweep to mount again, never deleted unread.
            if self.retired.exists() {
                self.finish()?;
                return self.quota.remove_image().map_err(isolation);
            }
            return Ok(());
        }
        remove_if_present(&self.retired)?;
        fs::create_dir_all(&self.retired).map_err(|e| io_err("create", &self.retired, e))?;
        let mut budget = CopyBudget {
            bytes_left: self.quota.used_bytes().map_err(isolation)?,
        };
        for name in KEPT_FILES {
            copy_entry(
                &self.root.join(name),
                &self.retired.join(name),
                0,
                &mut budget,
            )?;
        }
        let outbox = self.root.join("outbox");
        copy_entry(&outbox, &self.retired.join("outbox"), 0, &mut budget)?;
        // The copy goes in right after the unmount; deleting the image (slow for a big one)
        // waits until readers see the copy.
        self.quota.unmount().map_err(isolation)?;
        self.finish()?;
        self.quota.remove_image().map_err(isolation)
    }

    /// The last step of a retirement, alone when a crash interrupted one after the release:
    /// the kept entries move into the (now unmounted) directory one rename each. The
    /// directory itself is never renamed over: while any mount namespace still holds a copy
    /// of the volume's mount (a sandbox made meanwhile), it stays a mount point there and a
    /// rename onto it would fail.
    fn finish(&self) -> Result<(), WorkerError> {
        if !self.retired.exists() {
            return Ok(());
        }
        fs::create_dir_all(&self.root).map_err(|e| io_err("create", &self.root, e))?;
        let mut kept = fs::read_dir(&self.retired)
            .map_err(|e| io_err("list", &self.retired, e))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| io_err("list", &self.retired, e))?;
        // The unredacted mark first: an outbox back without it would be served.
        kept.sort_by_key(|entry| entry.file_name() != UNREDACTED_MARKER_NAME);
        for entry in kept {
            let target = self.root.join(entry.file_name());
            // What an earlier attempt left beneath the mount point gives way to the copy.
            remove_entry(&target)?;
            fs::rename(entry.path(), &target).map_err(|e| io_err("move", &target, e))?;
        }
        remove_if_present(&self.retired)
    }

    /// At worker start: finishes interrupted retirements and retires the volumes of tasks
    /// whose checkpoint says they ended (the driver died before it could). Returns the ids.
    pub(crate) fn sweep(data_dir: &Path) -> Vec<u64> {
        Self::remount_all(data_dir);
        let Ok(entries) = fs::read_dir(data_dir.join("tasks")) else {
            return Vec::new();
        };
        let mut retired = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Some(task) = task_id(name.trim_start_matches('.').trim_end_matches(".retired"))
            else {
                continue;
            };
            let dir = TaskDir::new(data_dir, task);
            let volume = TaskVolume::of(data_dir, &dir);
            let ended = TaskCheckpoint::load(&dir.state_json())
                .ok()
                .flatten()
                .is_some_and(|c| c.state.is_terminal() && c.state != TaskState::FailedPreserved);
            let interrupted = name.ends_with(".retired");
            if interrupted || (ended && matches!(volume.quota.is_mounted(), Ok(true))) {
                match volume.retire() {
                    Ok(()) => retired.push(task.get()),
                    Err(e) => tracing::error!(%task, error = %e, "cannot retire a task volume"),
                }
            }
        }
        retired.sort_unstable();
        retired.dedup();
        retired
    }
}

impl TaskVolume {
    /// Mounts every image whose mount is gone (the host rebooted), so its task's files are
    /// where the worker and the output server look for them.
    fn remount_all(data_dir: &Path) {
        let Ok(images) = fs::read_dir(data_dir.join(VOLUMES_DIR)) else {
            return;
        };
        for image in images.flatten() {
            let name = image.file_name();
            let Some(task) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".img"))
                .and_then(task_id)
            else {
                continue;
            };
            let volume = TaskVolume::of(data_dir, &TaskDir::new(data_dir, task));
            if volume.retired.exists() || matches!(volume.quota.is_mounted(), Ok(true)) {
                continue;
            }
            if let Err(e) = volume.quota.remount() {
                tracing::error!(%task, error = %e, "cannot mount a task volume again");
            }
        }
    }
}

/// The task a directory or image name stands for (`7`, `.7.retired`, `7.img`).
fn task_id(name: &str) -> Option<squadron_core::ids::TaskId> {
    name.parse()
        .ok()
        .and_then(|n| squadron_core::ids::TaskId::new(n).ok())
}

/// What a retirement may still copy: the bytes the volume really holds. A copy would inflate
/// sparse files and duplicate hard links, so without it a task could make root write far more
/// than its quota to the host's disk.
struct CopyBudget {
    bytes_left: u64,
}

/// Copies a regular file or a directory tree, never following a link (the outbox is the
/// sandbox's): links, hard-linked files, devices, anything deeper than [`RETIRE_DEPTH_MAX`] or
/// with a longer path than [`RETIRE_PATH_BYTES_MAX`], and what the budget cannot hold are left
/// out. The sandbox is gone by now, so nothing moves while it is walked.
fn copy_entry(
    from: &Path,
    to: &Path,
    depth: usize,
    budget: &mut CopyBudget,
) -> Result<(), WorkerError> {
    if to.as_os_str().len() > RETIRE_PATH_BYTES_MAX {
        return Ok(());
    }
    let meta = match fs::symlink_metadata(from) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_err("inspect", from, e)),
    };
    if meta.is_file() {
        if meta.nlink() > 1 || meta.len() > budget.bytes_left {
            return Ok(());
        }
        budget.bytes_left -= meta.len();
        let src = OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(from)
            .map_err(|e| io_err("open", from, e))?;
        let mut dst = File::create(to).map_err(|e| io_err("create", to, e))?;
        io::copy(&mut src.take(meta.len()), &mut dst).map_err(|e| io_err("copy", from, e))?;
        return dst.sync_all().map_err(|e| io_err("sync", to, e));
    }
    if !meta.is_dir() || depth >= RETIRE_DEPTH_MAX {
        return Ok(());
    }
    fs::create_dir_all(to).map_err(|e| io_err("create", to, e))?;
    for entry in fs::read_dir(from).map_err(|e| io_err("list", from, e))? {
        let entry = entry.map_err(|e| io_err("list", from, e))?;
        copy_entry(
            &entry.path(),
            &to.join(entry.file_name()),
            depth + 1,
            budget,
        )?;
    }
    Ok(())
}

fn remove_entry(path: &Path) -> Result<(), WorkerError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("inspect", path, e)),
        Ok(m) if m.is_dir() => remove_if_present(path),
        Ok(_) => fs::remove_file(path).map_err(|e| io_err("remove", path, e)),
    }
}

fn remove_if_present(path: &Path) -> Result<(), WorkerError> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("remove", path, e)),
    }
}

fn io_err(what: &'static str, path: &Path, e: io::Error) -> WorkerError {
    WorkerError::io(what, path, e)
}

fn isolation(e: squadron_isolation::error::IsolationError) -> WorkerError {
    WorkerError::DiskQuota(e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn task_dir(data: &Path, id: u64) -> TaskDir {
        TaskDir::new(data, squadron_core::ids::TaskId::new(id).unwrap())
    }

    #[test]
    fn a_full_volume_is_exhausted_and_retiring_keeps_the_outbox_only() {
        let data = tempfile::tempdir().unwrap();
        let dir = task_dir(data.path(), 7);
        let volume = TaskVolume::of(data.path(), &dir);
        volume.ensure(16 << 20).unwrap();
        fs::create_dir_all(dir.progress()).unwrap();
        fs::create_dir_all(dir.inbox()).unwrap();
        fs::write(dir.stdout_log(), b"hello\n").unwrap();
        fs::write(dir.manifest(), b"kind: Task\n").unwrap();
        fs::write(dir.unredacted_marker(), b"stdout.log: too big\n").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", dir.outbox().join("shadow")).unwrap();
        // A huge sparse file and many links to one file would make a copy write far more
        // than the volume holds: neither is copied.
        File::create(dir.outbox().join("sparse"))
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        fs::write(dir.outbox().join("once"), b"1").unwrap();
        fs::hard_link(dir.outbox().join("once"), dir.outbox().join("twice")).unwrap();
        let mut fill = File::create(dir.inbox().join("big")).unwrap();
        let chunk = vec![1u8; 1 << 20];
        while fill.write_all(&chunk).is_ok() {}
        drop(fill);
        assert!(volume.exhausted());
        volume.retire().unwrap();
        assert!(!volume.quota.is_mounted().unwrap());
        assert!(!data.path().join(VOLUMES_DIR).join("7.img").exists());
        assert_eq!(fs::read(dir.stdout_log()).unwrap(), b"hello\n");
        assert_eq!(fs::read(dir.manifest()).unwrap(), b"kind: Task\n");
        assert_eq!(
            fs::read(dir.unredacted_marker()).unwrap(),
            b"stdout.log: too big\n",
            "an outbox that could not be redacted stays unserved"
        );
        assert!(!dir.inbox().exists(), "the workspace went with the volume");
        assert!(fs::symlink_metadata(dir.outbox().join("shadow")).is_err());
        for skipped in ["sparse", "once", "twice"] {
            assert!(!dir.outbox().join(skipped).exists(), "{skipped} was copied");
        }
        assert!(!volume.exhausted(), "a retired directory has no quota");
        // Retiring twice is retiring once.
        volume.retire().unwrap();
        assert_eq!(fs::read(dir.stdout_log()).unwrap(), b"hello\n");
    }

    #[test]
    fn the_sweep_retires_ended_tasks_and_finishes_interrupted_retirements() {
        let data = tempfile::tempdir().unwrap();
        let ended = task_dir(data.path(), 1);
        let running = task_dir(data.path(), 2);
        for (dir, state) in [
            (&ended, TaskState::Completed),
            (&running, TaskState::Running),
        ] {
            TaskVolume::of(data.path(), dir).ensure(16 << 20).unwrap();
            let runtime = squadron_core::manifest::RuntimeKind::Process;
            let cp = TaskCheckpoint::fresh(dir.task().get(), 1, state, runtime);
            cp.store(&dir.state_json()).unwrap();
        }
        // A retirement that died after the release: the copy waits beside an empty directory.
        let half = task_dir(data.path(), 3);
        fs::create_dir_all(half.root()).unwrap();
        let copy = half.root().with_file_name(".3.retired");
        fs::create_dir_all(copy.join("outbox")).unwrap();
        fs::write(copy.join("outbox").join("kept"), b"x").unwrap();
        // A reboot drops every mount; the images stay.
        TaskVolume::of(data.path(), &running)
            .quota
            .unmount()
            .unwrap();
        assert!(
            !running.state_json().exists(),
            "the checkpoint is inside the volume"
        );
        assert_eq!(TaskVolume::sweep(data.path()), vec![1, 3]);
        assert!(!TaskVolume::of(data.path(), &ended)
            .quota
            .is_mounted()
            .unwrap());
        let still = TaskVolume::of(data.path(), &running);
        assert!(
            still.quota.is_mounted().unwrap(),
            "a running task keeps its volume"
        );
        assert_eq!(fs::read(half.outbox().join("kept")).unwrap(), b"x");
        still.retire().unwrap();
    }
}
