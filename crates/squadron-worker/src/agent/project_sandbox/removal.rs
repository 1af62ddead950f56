//! The end of a project sandbox on this worker, once the project is no longer attached here
//! (`agent::detached`). `take_away` (under the supervisor's operation lock) unmounts whatever
//! is mounted beneath it (the `run/` bind, credential tmpfs) and its volume, removes the image
//! and `{project}.run`, and renames the directory into `projects.removing/`, so the project
//! has no sandbox here from then on; `delete_taken` removes the renamed directory, which may
//! take long for a big clone, without the lock. A worker killed in between leaves it there;
//! every sweep first deletes what is left there (`delete_left_aside`).
//!
//! When a project was first seen detached is kept beside its sandbox, in the tenant's
//! directory (`.{project}.detached`, root's), so a restart does not start the retention over.

use std::fs;
use std::path::{Path, PathBuf};

use squadron_core::ids::{ProjectId, TenantId};

use super::volume::names;
use super::{ProjectVolume, PROJECTS_DIR, SANDBOX_DIR_ENTRIES_MAX};
use crate::error::WorkerError;
use crate::support::{now_ms, read_bounded, remove_path, write_atomic};

/// Beside `projects/`: sandboxes taken away and not yet deleted.
const REMOVING_DIR: &str = "projects.removing";
/// The largest detached-since marker read back.
const MARKER_BYTES_MAX: u64 = 64;

/// Takes the sandbox of (tenant, project) away from `data_dir`: afterwards the project has
/// none here. Returns the directory it moved aside, for `delete_taken`.
pub(crate) fn take_away(
    data_dir: &Path,
    tenant: &TenantId,
    project: &ProjectId,
) -> Result<Option<PathBuf>, WorkerError> {
    let data_dir =
        fs::canonicalize(data_dir).map_err(|e| WorkerError::io("resolving", data_dir, e))?;
    let volume = ProjectVolume::of(&data_dir, tenant, project);
    let root = volume.root().to_path_buf();
    // Also what is mounted beneath a root without a volume (a worker run with
    // --no-disk-quota).
    volume.remove()?;
    let mut aside = None;
    if root.exists() {
        let removing = data_dir.join(REMOVING_DIR);
        fs::create_dir_all(&removing).map_err(|e| WorkerError::io("creating", &removing, e))?;
        let to = removing.join(format!("{tenant}.{project}.{}", now_ms()));
        fs::rename(&root, &to).map_err(|e| WorkerError::io("moving aside", &root, e))?;
        aside = Some(to);
    }
    forget_detached(&data_dir, tenant, project)?;
    // The tenant's directories go with its last project (another may be made meanwhile: then
    // they are not empty and stay).
    if let Some(tenant_dir) = root.parent() {
        let _ = fs::remove_dir(tenant_dir);
    }
    let _ = fs::remove_dir(volume.tenant_dir());
    Ok(aside)
}

/// Deletes what `take_away` moved aside.
pub(crate) fn delete_taken(aside: Option<&Path>) -> Result<(), WorkerError> {
    aside.map_or(Ok(()), remove_path)
}

/// Deletes what an earlier life moved aside and was killed before deleting.
pub(crate) fn delete_left_aside(data_dir: &Path) -> Result<(), WorkerError> {
    let removing = data_dir.join(REMOVING_DIR);
    for left in names(&removing) {
        remove_path(&removing.join(left))?;
    }
    Ok(())
}

/// When the project was first seen detached from this worker, recording `now` if it was not
/// yet.
pub(crate) fn detached_since(
    data_dir: &Path,
    tenant: &TenantId,
    project: &ProjectId,
    now: u64,
) -> Result<u64, WorkerError> {
    let marker = marker_path(data_dir, tenant, project);
    // Root's file in root's directory; whatever is unreadable there is recorded anew.
    let recorded = read_bounded(&marker, MARKER_BYTES_MAX)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| t.trim().parse::<u64>().ok());
    if let Some(since) = recorded {
        return Ok(since);
    }
    write_atomic(&marker, now.to_string().as_bytes())?;
    Ok(now)
}

/// The project is attached here (again), or its sandbox is gone: no detached-since record.
pub(crate) fn forget_detached(
    data_dir: &Path,
    tenant: &TenantId,
    project: &ProjectId,
) -> Result<(), WorkerError> {
    remove_path(&marker_path(data_dir, tenant, project))
}

/// Every project with a sandbox directory under `data_dir`, at most
/// [`SANDBOX_DIR_ENTRIES_MAX`].
pub(crate) fn local_sandboxes(data_dir: &Path) -> Vec<(TenantId, ProjectId)> {
    let projects = data_dir.join(PROJECTS_DIR);
    let mut found = Vec::new();
    for tenant in names(&projects) {
        let Ok(tenant_id) = TenantId::new(tenant.clone()) else {
            continue;
        };
        let tenant_dir = projects.join(&tenant);
        for project in names(&tenant_dir) {
            if found.len() >= SANDBOX_DIR_ENTRIES_MAX {
                return found;
            }
            if !tenant_dir.join(&project).is_dir() {
                continue;
            }
            if let Ok(project) = ProjectId::new(project) {
                found.push((tenant_id.clone(), project));
            }
        }
    }
    found
}

/// `.{project}.detached` in the tenant's directory: outside the sandbox, which agents write.
fn marker_path(data_dir: &Path, tenant: &TenantId, project: &ProjectId) -> PathBuf {
    data_dir
        .join(PROJECTS_DIR)
        .join(tenant.as_str())
        .join(format!(".{project}.detached"))
}
