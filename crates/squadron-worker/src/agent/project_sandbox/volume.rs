//! The disk quota of a project sandbox: the whole of `{data_dir}/projects/{tenant}/{project}`
//! (the bare clone, every profile's worktree, state and logs, the launch files) is a
//! loop-mounted ext4 image of the quota's size (`squadron_isolation::disk_quota`), so agents
//! that write without end meet `ENOSPC` and the host keeps its free space. The image lives
//! beside the tasks' ones, in `{data_dir}/volumes/projects/{tenant}/{project}.img`, for as long
//! as the sandbox does; a worker start mounts the images a reboot unmounted. It has a journal
//! (the clone and unpushed branches outlive host crashes) and is mounted with `discard` (what
//! agents delete goes back to the host).
//!
//! `run/` is not on the volume: the worker's own records (start markers, exit codes, reap
//! records, credential tmpfs mount points, the unredacted-logs marker) must be writable when
//! agents have filled it — a start or a proving reap that could not record would wedge the
//! project — so `{project}.run` beside the image, on the host's filesystem, is bind-mounted
//! at `run/`. Agents never write there (only one `g{n}/` of it is shown, read-only).

use std::fs;
use std::path::{Path, PathBuf};

use squadron_core::ids::{ProjectId, TenantId};
use squadron_isolation::disk_quota::{bind_outside, DiskQuota};

use crate::error::WorkerError;
use crate::task::task_volume::VOLUMES_DIR;

use super::{PROJECTS_DIR, RUN_DIR};

/// Beneath the worker's volumes directory: one image per project sandbox.
const PROJECT_VOLUMES_DIR: &str = "projects";
/// Most entries read from one directory of images or sandboxes (a start-up remount, the
/// detached sandboxes' sweep).
const REMOUNT_ENTRIES_MAX: usize = 100_000;

#[derive(Debug, Clone)]
pub(crate) struct ProjectVolume {
    quota: DiskQuota,
    /// `{project}.run` beside the image: shown at the sandbox's `run/`.
    run_outside: PathBuf,
}

impl ProjectVolume {
    /// The volume of (tenant, project) under `data_dir` (resolved, as the sandbox's root is).
    pub(crate) fn of(data_dir: &Path, tenant: &TenantId, project: &ProjectId) -> Self {
        let images = data_dir
            .join(VOLUMES_DIR)
            .join(PROJECT_VOLUMES_DIR)
            .join(tenant.as_str());
        let image = images.join(format!("{}.img", project.as_str()));
        let run_outside = images.join(format!("{}.run", project.as_str()));
        let root = data_dir
            .join(PROJECTS_DIR)
            .join(tenant.as_str())
            .join(project.as_str());
        Self {
            quota: DiskQuota::new(image, root).journaled(),
            run_outside,
        }
    }

    /// Mounts the quota on the sandbox's root, making the image the first time; a mounted
    /// volume is left as it is. A sandbox made before quotas existed (its root holds files
    /// and it has no image) keeps its files and runs without one: mounting an empty image
    /// over them would hide the clone and every worktree.
    pub(crate) fn ensure(&self, quota_bytes: u64) -> Result<(), WorkerError> {
        if !self.quota.is_mounted().map_err(quota_error)? {
            if !self.image().exists() && holds_entries(self.quota.mount_point()) {
                tracing::warn!(
                    sandbox = %self.quota.mount_point().display(),
                    "a project sandbox made without a disk quota keeps running without one"
                );
                return Ok(());
            }
            self.quota.ensure(quota_bytes).map_err(quota_error)?;
        }
        self.bind_run()
    }

    /// Mounts an existing image whose mount is gone (the host rebooted), and its `run/`;
    /// no image, no-op.
    pub(crate) fn remount(&self) -> Result<(), WorkerError> {
        if !self.image().exists() {
            return Ok(());
        }
        self.quota.remount().map_err(quota_error)?;
        self.bind_run()
    }

    /// Shows `{project}.run` at `run/`. Refused while `run/` on the volume holds records and
    /// `{project}.run` does not exist yet: a bind over them would hide the start and reap
    /// records (INV-9's reset proofs) and any credential tmpfs mounted there (INV-13).
    fn bind_run(&self) -> Result<(), WorkerError> {
        let run = self.quota.mount_point().join(RUN_DIR);
        let on_volume = !self.run_outside.exists()
            && !squadron_isolation::secret_tmpfs::is_mount_point(&run).unwrap_or(false)
            && holds_entries(&run);
        if on_volume {
            return Err(WorkerError::DiskQuota(format!(
                "{} holds records on the sandbox's volume; move them to {} before the worker \
                 shows that directory there",
                run.display(),
                self.run_outside.display()
            )));
        }
        bind_outside(&self.run_outside, &run).map_err(quota_error)
    }

    /// The quota the image was made with, when the agents used it up; `None` while there is
    /// room, or without a mounted quota.
    pub(crate) fn exhausted(&self) -> Option<u64> {
        let full = matches!(self.quota.is_mounted(), Ok(true))
            && matches!(self.quota.exhausted(), Ok(true));
        full.then(|| self.quota.made_bytes().ok()).flatten()
    }

    /// At worker start: mounts every project image whose mount is gone. Failures are logged;
    /// that sandbox's next use tries again and reports its own error.
    pub(crate) fn remount_all(data_dir: &Path) {
        let images = data_dir.join(VOLUMES_DIR).join(PROJECT_VOLUMES_DIR);
        for tenant in names(&images) {
            let Ok(tenant) = TenantId::new(tenant) else {
                continue;
            };
            for image in names(&images.join(tenant.as_str())) {
                let project = image.strip_suffix(".img").map(ProjectId::new);
                let Some(Ok(project)) = project else {
                    continue;
                };
                let volume = ProjectVolume::of(data_dir, &tenant, &project);
                if let Err(e) = volume.remount() {
                    tracing::error!(%tenant, %project, error = %e, "cannot mount a project volume again");
                }
            }
        }
    }

    fn image(&self) -> PathBuf {
        self.quota.image().to_path_buf()
    }

    /// The sandbox's root, which the volume is mounted on.
    pub(crate) fn root(&self) -> &Path {
        self.quota.mount_point()
    }

    /// The directory of the tenant's images (and `{project}.run` directories).
    pub(crate) fn tenant_dir(&self) -> &Path {
        self.run_outside.parent().unwrap_or(&self.run_outside)
    }

    /// The sandbox is gone: what is mounted beneath its root and beneath `{project}.run` is
    /// unmounted (with or without a volume), then the volume, and the image and
    /// `{project}.run` are removed.
    pub(crate) fn remove(&self) -> Result<(), WorkerError> {
        for dir in [self.quota.mount_point(), self.run_outside.as_path()] {
            squadron_isolation::slot_mounts::unmount_beneath(dir).map_err(quota_error)?;
        }
        self.quota.unmount().map_err(quota_error)?;
        self.quota.remove_image().map_err(quota_error)?;
        crate::support::remove_path(&self.run_outside)
    }
}

/// Whether `dir` exists and holds anything.
fn holds_entries(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some())
}

/// The UTF-8 names in `dir`, at most [`REMOUNT_ENTRIES_MAX`]; none when it cannot be read.
pub(super) fn names(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .take(REMOUNT_ENTRIES_MAX)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

fn quota_error(e: squadron_isolation::error::IsolationError) -> WorkerError {
    WorkerError::DiskQuota(e.to_string())
}
