//! Where agent attempts' cgroup leaves live: under the worker's cgroup parent, one level per
//! tenant and per project, one leaf per (profile, generation):
//!
//! ```text
//! <v2 base>/<worker>/tenant-{tenant}/project-{project}/profile-{key}-g{generation}
//! ```
//!
//! (the same nesting under the v1 memory, pids and cpu parents on a hybrid host). The project
//! level gives one place to read or limit a project's whole set of provider processes; the
//! tenant level keeps two tenants' projects of the same name apart. A leaf belongs to exactly
//! one generation, so its `populated 0` proves that generation quiescent and no other.
//!
//! The attempts themselves are in `attempt`.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use squadron_core::ids::{Generation, ProfileKey, ProjectId, TenantId};
use squadron_isolation::{CgroupRoot, CgroupRootConfig, IsolationError};

use crate::error::WorkerError;
use crate::runtime::process::{ProcessRuntime, ProcessRuntimeConfig};
use crate::support::truncate_at_char;

/// The runtime's name in errors.
pub(crate) const AGENT_RUNTIME: &str = "agent process";
/// Longest `cgroup.events` read when checking a leaf.
const CGROUP_EVENTS_BYTES_MAX: usize = 4096;
/// Most leaves of one project's cgroup read when looking for a profile's running generations.
pub(crate) const PROJECT_LEAVES_SCANNED_MAX: usize = 4096;

/// The worker's cgroup parent and boundary settings for agent attempts. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct AgentRuntime {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: ProcessRuntimeConfig,
    root: CgroupRoot,
    /// Held while tenant/project directories are created or pruned, so a prune never
    /// removes a directory a start is about to put a leaf in.
    cgroups: Mutex<()>,
}

/// The tenant and project cgroups of one sandbox (both created).
#[derive(Debug, Clone)]
pub(crate) struct ProjectCgroups {
    pub(crate) tenant: CgroupRoot,
    pub(crate) project: CgroupRoot,
}

impl AgentRuntime {
    /// Checks the host as the process runtime does (bubblewrap, setpriv, cgroup v2) and opens
    /// the worker's cgroup parent `<v2 base>/<config.worker>`.
    ///
    /// Providers run as `config.sandbox_user` (see `runtime::sandbox_user`): each start
    /// shares the profile's worktree with that user and hands it the state directory. The
    /// sandbox networks of the worker's previous life are swept (see `ProcessRuntime::new`).
    pub(crate) fn new(config: ProcessRuntimeConfig) -> Result<AgentRuntime, WorkerError> {
        let root = ProcessRuntime::probe(&config)?;
        ProcessRuntime::sweep_networks(&config);
        Ok(AgentRuntime {
            inner: Arc::new(Inner {
                config,
                root,
                cgroups: Mutex::new(()),
            }),
        })
    }

    pub(crate) fn config(&self) -> &ProcessRuntimeConfig {
        &self.inner.config
    }

    /// `profile-{key}-g{generation}`.
    pub(crate) fn leaf_name(key: &ProfileKey, generation: Generation) -> String {
        format!("profile-{key}-g{generation}")
    }

    /// The v2 directory of a project's cgroup (not created by this call).
    pub(crate) fn project_cgroup_path(&self, tenant: &TenantId, project: &ProjectId) -> PathBuf {
        self.inner
            .root
            .v2_parent()
            .join(format!("tenant-{tenant}"))
            .join(format!("project-{project}"))
    }

    /// The v2 leaf of (profile, generation): the cgroup its lease holder runs in.
    pub(crate) fn leaf_path(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        key: &ProfileKey,
        generation: Generation,
    ) -> PathBuf {
        self.project_cgroup_path(tenant, project)
            .join(Self::leaf_name(key, generation))
    }

    /// The generations of `key` whose leaf exists and is populated now, ascending.
    pub(crate) fn running_generations(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        key: &ProfileKey,
    ) -> Result<Vec<Generation>, WorkerError> {
        let dir = self.project_cgroup_path(tenant, project);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(WorkerError::io("listing cgroup", &dir, e)),
        };
        let prefix = format!("profile-{key}-g");
        let mut running = Vec::new();
        for (seen, entry) in entries.enumerate() {
            if seen >= PROJECT_LEAVES_SCANNED_MAX {
                return Err(WorkerError::runtime(
                    AGENT_RUNTIME,
                    format!(
                        "{} holds more than {PROJECT_LEAVES_SCANNED_MAX} entries",
                        dir.display()
                    ),
                ));
            }
            let entry = entry.map_err(|e| WorkerError::io("listing cgroup", &dir, e))?;
            let name = entry.file_name();
            let Some(digits) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
                continue;
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let Ok(generation) = digits.parse::<u64>() else {
                continue;
            };
            if leaf_populated(&entry.path())? {
                running.push(Generation::new(generation));
            }
        }
        running.sort();
        Ok(running)
    }

    /// Creates (or opens) the tenant and project cgroups; the caller holds `lock_cgroups`.
    pub(crate) fn project_cgroups(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<ProjectCgroups, WorkerError> {
        let tenant = nested_root(&self.inner.root, &format!("tenant-{tenant}"))?;
        let project = nested_root(&tenant, &format!("project-{project}"))?;
        Ok(ProjectCgroups { tenant, project })
    }

    /// Removes the project and tenant cgroups if no leaf is left in them.
    pub(crate) fn prune(&self, cgroups: &ProjectCgroups) {
        let _guard = self.lock_cgroups();
        for root in [&cgroups.project, &cgroups.tenant] {
            if let Err(e) = root.remove() {
                tracing::debug!(cgroup = %root.v2_parent().display(), error = %e, "cgroup kept: not empty");
                return;
            }
        }
    }

    pub(crate) fn lock_cgroups(&self) -> MutexGuard<'_, ()> {
        self.inner
            .cgroups
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// A cgroup directory `name` under `parent`, as a root for leaves: the v1 memory/pids/cpu
/// directories nest the same way when the parent uses them.
pub(crate) fn nested_root(parent: &CgroupRoot, name: &str) -> Result<CgroupRoot, WorkerError> {
    let config = CgroupRootConfig {
        v2_base: Some(parent.v2_parent().to_path_buf()),
        v1_memory_base: parent.v1_memory_parent().map(Path::to_path_buf),
        v1_pids_base: parent.v1_pids_parent().map(Path::to_path_buf),
        v1_cpu_base: parent.v1_cpu_parent().map(Path::to_path_buf),
        disable_v1: parent.v1_memory_parent().is_none()
            && parent.v1_pids_parent().is_none()
            && parent.v1_cpu_parent().is_none(),
    };
    CgroupRoot::open(name, &config).map_err(isolation)
}

pub(crate) fn isolation(e: IsolationError) -> WorkerError {
    WorkerError::runtime(AGENT_RUNTIME, e.to_string())
}

/// `populated` of a v2 cgroup directory; an absent directory holds nothing.
pub(crate) fn leaf_populated(cgroup: &Path) -> Result<bool, WorkerError> {
    let events = cgroup.join("cgroup.events");
    let text = match fs::read_to_string(&events) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(WorkerError::io("reading", &events, e)),
    };
    let text = truncate_at_char(&text, CGROUP_EVENTS_BYTES_MAX);
    text.lines()
        .find_map(|line| line.strip_prefix("populated "))
        .map(|v| v.trim() == "1")
        .ok_or_else(|| WorkerError::Project(format!("{} has no populated line", events.display())))
}
