//! The host side of a warm sandbox's slot: a container of the worker's pool starts before its
//! task is known, with its slot directory bound in with slave propagation, so what the host
//! binds beneath the slot later (the task's inbox, outbox, launch files) appears inside it.
//! The engine accepts slave propagation only from a shared mount: the pool's directory is
//! made one (a bind of itself), once per boot.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::mount::{
    mount_bind, mount_change, mount_remount, unmount, MountFlags, MountPropagationFlags,
    UnmountFlags,
};

use crate::cgroup_root::read_mounts;
use crate::error::IsolationError;

/// Makes `dir` a shared mount (binding it onto itself first if it is no mount point), so
/// mounts made beneath it propagate to the slave copies containers hold.
pub fn ensure_shared(dir: &Path) -> Result<(), IsolationError> {
    std::fs::create_dir_all(dir).map_err(|e| IsolationError::io("create", dir, e))?;
    let dir = canonical(dir)?;
    if !mounted_at(&dir)? {
        mount_bind(&dir, &dir).map_err(|e| IsolationError::io("bind-mount on", &dir, e.into()))?;
    }
    mount_change(&dir, MountPropagationFlags::SHARED)
        .map_err(|e| IsolationError::io("make shared", &dir, e.into()))
}

/// Shows `source` at `target` (a directory beneath a slot), never with set-uid programs or
/// device nodes, read-only when asked. The flags are set on a bind made at a point of
/// `staging` (a directory outside the pool) and that bind is bound on at `target`: a remount
/// does not propagate, so a bind restricted in place would stay writable in the containers
/// that hold the slot, while a new bind's copies take its source's flags.
pub fn bind(
    source: &Path,
    target: &Path,
    read_only: bool,
    staging: &Path,
) -> Result<(), IsolationError> {
    std::fs::create_dir_all(target).map_err(|e| IsolationError::io("create", target, e))?;
    std::fs::create_dir_all(staging).map_err(|e| IsolationError::io("create", staging, e))?;
    static POINTS: AtomicU64 = AtomicU64::new(0);
    let point = staging.join(format!(
        "bind-{}-{}",
        std::process::id(),
        POINTS.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir(&point)
        .map_err(|e| IsolationError::io("create a staging point", &point, e))?;
    let bound = bind_through(source, target, read_only, &point);
    let _ = std::fs::remove_dir(&point);
    bound
}

fn bind_through(
    source: &Path,
    target: &Path,
    read_only: bool,
    point: &Path,
) -> Result<(), IsolationError> {
    mount_bind(source, point).map_err(|e| IsolationError::io("bind-mount on", point, e.into()))?;
    let mut flags = MountFlags::BIND | MountFlags::NOSUID | MountFlags::NODEV;
    if read_only {
        flags |= MountFlags::RDONLY;
    }
    let bound = mount_remount(point, flags, "")
        .map_err(|e| IsolationError::io("restrict the bind on", point, e.into()))
        .and_then(|()| {
            mount_bind(point, target)
                .map_err(|e| IsolationError::io("bind-mount on", target, e.into()))
        });
    unmount(point, UnmountFlags::DETACH)
        .map_err(|e| IsolationError::io("unmount", point, e.into()))?;
    bound
}

/// Unmounts every mount strictly beneath `dir`, deepest first, and answers how many. Detached:
/// a container that still holds a copy keeps it until it is gone, the host is free at once.
pub fn unmount_beneath(dir: &Path) -> Result<usize, IsolationError> {
    let Some(dir) = existing(dir)? else {
        return Ok(0);
    };
    let mut beneath: Vec<PathBuf> = read_mounts()?
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|p| p.starts_with(&dir) && *p != dir)
        .collect();
    // Deepest first; a point listed twice (stacked binds) counted once.
    beneath.sort_by(|a, b| (b.components().count(), a).cmp(&(a.components().count(), b)));
    beneath.dedup();
    for point in &beneath {
        // Stacked binds on one point each need their own unmount.
        while mounted_at(point)? {
            unmount(point, UnmountFlags::DETACH)
                .map_err(|e| IsolationError::io("unmount", point, e.into()))?;
        }
    }
    Ok(beneath.len())
}

/// Whether something is mounted at `point` (a bind beneath a slot).
pub fn is_bound(point: &Path) -> Result<bool, IsolationError> {
    match existing(point)? {
        Some(point) => mounted_at(&point),
        None => Ok(false),
    }
}

fn mounted_at(point: &Path) -> Result<bool, IsolationError> {
    Ok(read_mounts()?.iter().any(|m| m.mount_point == point))
}

fn canonical(dir: &Path) -> Result<PathBuf, IsolationError> {
    dir.canonicalize()
        .map_err(|e| IsolationError::io("resolve", dir, e))
}

/// `path` resolved, or `None` when nothing is there.
fn existing(path: &Path) -> Result<Option<PathBuf>, IsolationError> {
    match canonical(path) {
        Ok(path) => Ok(Some(path)),
        Err(_) if !path.exists() => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_beneath_a_shared_slot_show_read_only_where_asked_and_all_go_at_once() {
        let base = tempfile::tempdir().unwrap();
        let pool = base.path().join("pool");
        let task = base.path().join("task");
        std::fs::create_dir_all(task.join("inbox")).unwrap();
        std::fs::create_dir_all(task.join("run")).unwrap();
        std::fs::write(task.join("run/launch.sh"), b"exit 0").unwrap();
        ensure_shared(&pool).unwrap();
        // Again: no second layer.
        ensure_shared(&pool).unwrap();
        let pool = pool.canonicalize().unwrap();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let line = mounts
            .lines()
            .filter(|l| l.split(' ').nth(4) == Some(pool.to_str().unwrap()))
            .collect::<Vec<_>>();
        assert_eq!(line.len(), 1, "{line:?}");
        assert!(line[0].contains("shared:"), "{}", line[0]);

        let slot = pool.join("1");
        std::fs::create_dir_all(slot.join("mnt")).unwrap();
        // What a container holds: a slave copy of the slot, made before the binds.
        let viewer = base.path().join("viewer");
        std::fs::create_dir_all(&viewer).unwrap();
        mount_bind(slot.join("mnt"), &viewer).unwrap();
        mount_change(&viewer, MountPropagationFlags::DOWNSTREAM).unwrap();
        let staging = base.path().join("staging");
        bind(
            &task.join("inbox"),
            &slot.join("mnt/inbox"),
            false,
            &staging,
        )
        .unwrap();
        bind(&task.join("run"), &slot.join("mnt/run"), true, &staging).unwrap();
        assert_eq!(
            std::fs::read_dir(&staging).unwrap().count(),
            0,
            "no staging point stays"
        );
        // The copy sees the binds with their flags: a remount in place would leave it writable.
        std::fs::write(viewer.join("inbox/seen"), b"x").unwrap();
        assert!(task.join("inbox/seen").exists());
        let refused = std::fs::write(viewer.join("run/other"), b"x").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc_erofs()), "{refused}");
        std::fs::write(slot.join("mnt/inbox/new"), b"x").unwrap();
        assert!(task.join("inbox/new").exists());
        let refused = std::fs::write(slot.join("mnt/run/other"), b"x").unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc_erofs()), "{refused}");
        assert_eq!(
            std::fs::read(slot.join("mnt/run/launch.sh")).unwrap(),
            b"exit 0"
        );

        assert_eq!(unmount_beneath(&slot).unwrap(), 2);
        assert!(
            !viewer.join("run/launch.sh").exists(),
            "the copy loses the binds with the slot"
        );
        unmount(&viewer, UnmountFlags::DETACH).unwrap();
        assert!(!slot.join("mnt/inbox/new").exists());
        assert!(task.join("inbox/new").exists(), "the task's own files stay");
        assert_eq!(unmount_beneath(&slot).unwrap(), 0);
        assert_eq!(unmount_beneath(&base.path().join("gone")).unwrap(), 0);
        unmount(&pool, UnmountFlags::DETACH).unwrap();
    }

    fn libc_erofs() -> i32 {
        rustix::io::Errno::ROFS.raw_os_error()
    }
}
