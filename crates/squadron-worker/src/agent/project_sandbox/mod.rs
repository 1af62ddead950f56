//! `placement: project`: the one sandbox of a project on this worker (INV-1), on disk.
//!
//! ```text
//! {data_dir}/projects/{tenant}/{project}/
//! ├── sandbox.json              what the sandbox was made from (url, branch, base commit)
//! ├── repo/.git/                one bare clone: the Git common metadata every worktree shares
//! ├── worktrees/{profile_key}/  a linked worktree per profile, on branch squadron/{profile_key}
//! ├── state/{profile_key}/      profile state: capsule drafts, mailbox files, scratch, logs/
//! └── run/{profile_key}/
//!     ├── worktree.ready        the worktree's first checkout completed
//!     ├── g{n}/                 launch files of generation n (launch.sh, prompt, …)
//!     ├── g{n}.started          written once, before generation n is spawned: its cgroup leaf
//!     ├── g{n}.exit-code        written by the shim when generation n's boundary exits
//!     └── g{n}.reaped           the reap evidence (`populated 0`) of generation n
//! ```
//!
//! A profile's process sees only its own worktree and state writable; `repo/.git` is shown
//! read-only (see `agent::attempt`), so Git metadata is changed only from the worker's side.
//!
//! A worktree is created once and never reset implicitly: `reset_worktree` is the only way,
//! and it demands reap evidence (`populated 0`) for the leaf of the profile's last started
//! generation (ADR-0011 decision 6, INV-9). The `g{n}.started` markers are the worker's own
//! record of which generations ran, so the proof requirement survives a worker restart.
//!
//! Everything here blocks (git, file system): call it from a blocking task.

mod clone;
mod records;
mod removal;
mod reset;
mod volume;

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use git2::WorktreeAddOptions;
use serde::{Deserialize, Serialize};
use squadron_core::ids::{Generation, ProfileKey, ProjectId, TenantId};
use squadron_core::limits::DESCRIPTOR_BYTES_MAX;
use squadron_isolation::bubblewrap::SYSTEM_RO_PATHS;

use crate::error::WorkerError;
use crate::support::{now_ms, remove_path, write_atomic};
use clone::{clone_bare, open_bare, resolve_base};
pub(crate) use records::{prune_launch_files, record_reap};
pub(crate) use removal::{
    delete_left_aside, delete_taken, detached_since, forget_detached, local_sandboxes, take_away,
};
pub(crate) use volume::ProjectVolume;

/// Directory of `data_dir` holding every project sandbox.
pub(crate) const PROJECTS_DIR: &str = "projects";
pub(crate) const REPO_DIR: &str = "repo";
pub(crate) const WORKTREES_DIR: &str = "worktrees";
pub(crate) const STATE_DIR: &str = "state";
pub(crate) const RUN_DIR: &str = "run";
/// Inside `state/{profile_key}/`: the provider's stdout and stderr, one pair per generation.
pub(crate) const LOGS_DIR: &str = "logs";
pub(crate) const SANDBOX_RECORD_NAME: &str = "sandbox.json";
/// In `run/{profile_key}/`: written once the worktree's first checkout is complete.
pub(crate) const WORKTREE_READY_NAME: &str = "worktree.ready";
/// Profile branches are `squadron/{profile_key}`.
pub(crate) const PROFILE_BRANCH_PREFIX: &str = "squadron/";
/// Most profiles (worktrees) one sandbox holds; the control plane's `max_profiles` is lower.
pub(crate) const PROJECT_PROFILES_MAX: usize = 64;
/// Most directory entries read when listing worktrees or a profile's run directory.
pub(crate) const SANDBOX_DIR_ENTRIES_MAX: usize = 100_000;
/// Largest `sandbox.json` or `g{n}.started` read back.
pub(crate) const SANDBOX_RECORD_BYTES_MAX: u64 = 64 * 1024;
/// Clones are made in `{root}/{CLONING_DIR_NAME}.{pid}.{n}`, then renamed to `repo/.git`.
const CLONING_DIR_NAME: &str = ".repo.cloning";
const ORIGIN: &str = "origin";

/// What a sandbox was made from; `sandbox.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SandboxRecord {
    pub(crate) tenant: TenantId,
    pub(crate) project: ProjectId,
    /// Kept on the worker's disk only; never put in errors or events.
    pub(crate) repo_url: String,
    /// `None`: the repository's default branch.
    pub(crate) branch: Option<String>,
    /// Every profile branch starts here.
    pub(crate) base_commit: String,
    pub(crate) created_at_ms: u64,
}

/// The record of a started generation, `run/{key}/g{n}.started`, written exclusively before
/// the spawn: the cgroup leaf whose `populated 0` proves that generation quiescent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StartedGeneration {
    pub(crate) generation: Generation,
    /// The v2 leaf path, as `ReapEvidence::cgroup` spells it.
    pub(crate) cgroup: String,
    pub(crate) started_at_ms: u64,
}

/// The host paths of one profile in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProfilePaths {
    pub(crate) key: ProfileKey,
    /// `worktrees/{key}`: shown writable at `/workspace`.
    pub(crate) worktree: PathBuf,
    /// `state/{key}`: shown writable at `/state`.
    pub(crate) state: PathBuf,
    /// `state/{key}/logs`.
    pub(crate) logs: PathBuf,
    /// `run/{key}`: never shown; one `g{n}/` of it is shown read-only per attempt.
    pub(crate) run: PathBuf,
    /// `squadron/{key}`.
    pub(crate) branch: String,
}

impl ProfilePaths {
    /// `run/{key}/g{n}/`: the launch files of generation n.
    pub(crate) fn generation_run_dir(&self, generation: Generation) -> PathBuf {
        self.run.join(format!("g{generation}"))
    }

    pub(crate) fn started_marker(&self, generation: Generation) -> PathBuf {
        self.run.join(format!("g{generation}.started"))
    }

    pub(crate) fn exit_code_file(&self, generation: Generation) -> PathBuf {
        self.run.join(format!("g{generation}.exit-code"))
    }

    /// The evidence of the reap that proved generation n quiescent.
    pub(crate) fn reaped_record(&self, generation: Generation) -> PathBuf {
        self.run.join(format!("g{generation}.reaped"))
    }

    pub(crate) fn stdout_log(&self, generation: Generation) -> PathBuf {
        self.logs.join(format!("g{generation}.stdout.log"))
    }

    pub(crate) fn stderr_log(&self, generation: Generation) -> PathBuf {
        self.logs.join(format!("g{generation}.stderr.log"))
    }
}

/// The sandbox of one project on this worker. Keep one object per project in a worker
/// process (share it): its lock is what serialises worktree creation, resets and start
/// records; there is no lock across processes (one worker owns a data directory).
#[derive(Debug)]
pub(crate) struct ProjectSandbox {
    record: SandboxRecord,
    root: PathBuf,
    /// Serialises worktree creation, resets and start records within this process.
    lock: Mutex<()>,
}

impl ProjectSandbox {
    /// Opens the sandbox of (tenant, project) under `data_dir`, cloning `repo_url` (bare, into
    /// `repo/.git`) the first time. Idempotent; a second call with another URL or branch is
    /// refused, naming the field. `branch` `None` takes the repository's default branch.
    /// `quota_bytes`: the whole sandbox lives on a disk quota of that size ([`ProjectVolume`]),
    /// mounted before anything is written; `None` runs it without one.
    pub(crate) fn open_or_create(
        data_dir: &Path,
        tenant: &TenantId,
        project: &ProjectId,
        repo_url: &str,
        branch: Option<&str>,
        quota_bytes: Option<u64>,
    ) -> Result<ProjectSandbox, WorkerError> {
        if let Some(branch) = branch {
            if !git2::Reference::is_valid_name(&format!("refs/heads/{branch}")) {
                return Err(invalid(
                    "branch",
                    format!("{branch:?} is not a branch name"),
                ));
            }
        }
        let root = make_root(data_dir, tenant, project, quota_bytes)?;
        let origin = SandboxOrigin {
            tenant,
            project,
            repo_url,
            branch,
        };
        let record_path = root.join(SANDBOX_RECORD_NAME);
        let record = match read_json::<SandboxRecord>(&record_path)? {
            Some(record) => record,
            None => first_record(&root, &origin)?,
        };
        origin.check(&record, &record_path, &root)?;
        Ok(ProjectSandbox {
            record,
            root,
            lock: Mutex::new(()),
        })
    }

    pub(crate) fn tenant(&self) -> &TenantId {
        &self.record.tenant
    }

    pub(crate) fn project(&self) -> &ProjectId {
        &self.record.project
    }

    #[cfg(test)]
    pub(crate) fn record(&self) -> &SandboxRecord {
        &self.record
    }

    /// `{data_dir}/projects/{tenant}/{project}`, a real path.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The sandbox's id for the control plane's `AttachSandbox` (`sandbox_ref`): its root
    /// path, unique on this worker and at most `DESCRIPTOR_BYTES_MAX` bytes.
    pub(crate) fn sandbox_ref(&self) -> String {
        self.root.display().to_string()
    }

    /// `repo/.git`: the Git common directory every worktree shares.
    pub(crate) fn git_dir(&self) -> PathBuf {
        self.root.join(REPO_DIR).join(".git")
    }

    /// The paths of a profile (nothing is created).
    pub(crate) fn profile_paths(&self, key: &ProfileKey) -> ProfilePaths {
        let state = self.root.join(STATE_DIR).join(key.as_str());
        ProfilePaths {
            key: key.clone(),
            worktree: self.root.join(WORKTREES_DIR).join(key.as_str()),
            logs: state.join(LOGS_DIR),
            state,
            run: self.root.join(RUN_DIR).join(key.as_str()),
            branch: format!("{PROFILE_BRANCH_PREFIX}{key}"),
        }
    }

    /// Makes the profile's worktree (branch `squadron/{key}` from the base commit, or the
    /// branch as it is when it exists already), state and run directories. Idempotent: an
    /// existing worktree is returned untouched, whatever its content.
    pub(crate) fn ensure_profile(&self, key: &ProfileKey) -> Result<ProfilePaths, WorkerError> {
        let _guard = self.guard();
        let paths = self.profile_paths(key);
        for dir in [&paths.state, &paths.logs, &paths.run] {
            fs::create_dir_all(dir).map_err(|e| WorkerError::io("creating", dir, e))?;
        }
        let ready = paths.run.join(WORKTREE_READY_NAME);
        if self.has_worktree(key) {
            if ready.exists() || !self.started_generations(key)?.is_empty() {
                return Ok(paths);
            }
            // Made by a creation that never finished (a crash mid-checkout), and no process
            // ever ran in it: nothing of anyone's is lost by making it again.
            tracing::warn!(profile = %key, worktree = %paths.worktree.display(), "remaking an unfinished worktree");
            remove_path(&paths.worktree)?;
        }
        match fs::read_dir(&paths.worktree).map(|mut entries| entries.next().is_none()) {
            // A crash between mkdir and the `.git` file leaves an empty directory.
            Ok(true) => remove_path(&paths.worktree)?,
            Ok(false) => {
                return Err(invalid(
                    "profile worktree",
                    format!(
                        "{} exists but is not a git worktree; refusing to touch it",
                        paths.worktree.display()
                    ),
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(WorkerError::io("reading", &paths.worktree, e)),
        }
        let existing = self.profiles()?;
        if existing.len() >= PROJECT_PROFILES_MAX {
            return Err(invalid(
                "profile_key",
                format!(
                    "the sandbox of {}/{} holds {PROJECT_PROFILES_MAX} profiles already",
                    self.record.tenant, self.record.project
                ),
            ));
        }

        let repo = open_bare(&self.git_dir())?;
        let refname = format!("refs/heads/{}", paths.branch);
        let reference = match repo.find_reference(&refname) {
            Ok(reference) => reference,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                let base = git2::Oid::from_str(&self.record.base_commit)
                    .and_then(|oid| repo.find_commit(oid))
                    .map_err(|e| git_error("finding the base commit", &e))?;
                repo.branch(&paths.branch, &base, false)
                    .map_err(|e| git_error("creating the profile branch", &e))?
                    .into_reference()
            }
            Err(e) => return Err(git_error("finding the profile branch", &e)),
        };
        // The administrative directory of a worktree whose directory is gone: stale.
        let admin = self.git_dir().join("worktrees").join(key.as_str());
        remove_path(&admin)?;
        let mut options = WorktreeAddOptions::new();
        options.reference(Some(&reference));
        repo.worktree(key.as_str(), &paths.worktree, Some(&options))
            .map_err(|e| git_error("adding the profile worktree", &e))?;
        write_atomic(&ready, b"")?;
        Ok(paths)
    }

    /// Whether the profile has a worktree: its directory and its administrative directory in
    /// `repo/.git/worktrees/` both exist. The `.git` link inside the worktree is not asked:
    /// the provider can delete it, but not the administrative directory.
    pub(crate) fn has_worktree(&self, key: &ProfileKey) -> bool {
        let admin = self.git_dir().join("worktrees").join(key.as_str());
        self.profile_paths(key).worktree.is_dir() && admin.is_dir()
    }

    /// The profiles that have a worktree, sorted.
    pub(crate) fn profiles(&self) -> Result<Vec<ProfileKey>, WorkerError> {
        let dir = self.root.join(WORKTREES_DIR);
        let mut keys = Vec::new();
        for name in list_names(&dir)? {
            if let Ok(key) = ProfileKey::new(name) {
                if self.has_worktree(&key) {
                    keys.push(key);
                }
            }
        }
        keys.sort();
        Ok(keys)
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What a sandbox is asked to be made from.
struct SandboxOrigin<'a> {
    tenant: &'a TenantId,
    project: &'a ProjectId,
    repo_url: &'a str,
    branch: Option<&'a str>,
}

impl SandboxOrigin<'_> {
    /// An existing sandbox is reopened only for the project, repository and branch it was
    /// made for; the refusal names the field that differs.
    fn check(&self, record: &SandboxRecord, path: &Path, root: &Path) -> Result<(), WorkerError> {
        if record.tenant != *self.tenant || record.project != *self.project {
            return Err(invalid(
                "sandbox",
                format!(
                    "{} belongs to {}/{}",
                    path.display(),
                    record.tenant,
                    record.project
                ),
            ));
        }
        // A sandbox the project left here (detached, or an attach that failed after the
        // clone): its worktrees may hold unpushed work, so it is never replaced on a launch's
        // word.
        if record.repo_url != self.repo_url {
            return Err(invalid(
                "repository.url",
                format!(
                    "the sandbox at {} was cloned from another repository (left by the \
                     project's earlier attachment to this worker): launch from that \
                     repository to use it again, or after --detached-sandbox-retention it is \
                     removed",
                    root.display()
                ),
            ));
        }
        if record.branch.as_deref() != self.branch {
            return Err(invalid(
                "branch",
                format!(
                    "the sandbox at {} was made from branch {:?}, not {:?}",
                    root.display(),
                    record.branch,
                    self.branch
                ),
            ));
        }
        Ok(())
    }
}

/// `{data_dir}/projects/{tenant}/{project}` and its directories, by real path: the
/// worktrees' `.git` files name the common directory by its real path, and the boundary
/// shows it at exactly that path. With `quota_bytes`, the quota is mounted on the root first.
fn make_root(
    data_dir: &Path,
    tenant: &TenantId,
    project: &ProjectId,
    quota_bytes: Option<u64>,
) -> Result<PathBuf, WorkerError> {
    check_not_shown(data_dir)?;
    fs::create_dir_all(data_dir).map_err(|e| WorkerError::io("creating", data_dir, e))?;
    let data_dir = fs::canonicalize(data_dir)
        .map_err(|e| WorkerError::io("resolving data dir", data_dir, e))?;
    check_not_shown(&data_dir)?;
    let root = data_dir
        .join(PROJECTS_DIR)
        .join(tenant.as_str())
        .join(project.as_str());
    let sandbox_ref = root.display().to_string();
    if sandbox_ref.len() > DESCRIPTOR_BYTES_MAX {
        return Err(invalid(
            "data_dir",
            format!("sandbox path {sandbox_ref} is longer than {DESCRIPTOR_BYTES_MAX} bytes"),
        ));
    }
    if let Some(bytes) = quota_bytes {
        ProjectVolume::of(&data_dir, tenant, project).ensure(bytes)?;
    }
    for dir in [
        root.join(REPO_DIR),
        root.join(WORKTREES_DIR),
        root.join(STATE_DIR),
        root.join(RUN_DIR),
    ] {
        fs::create_dir_all(&dir).map_err(|e| WorkerError::io("creating", &dir, e))?;
    }
    Ok(root)
}

/// The first opening of a sandbox: the bare clone (unless a crash left a complete one) and
/// `sandbox.json`.
fn first_record(root: &Path, origin: &SandboxOrigin<'_>) -> Result<SandboxRecord, WorkerError> {
    let git_dir = root.join(REPO_DIR).join(".git");
    if !git_dir.exists() {
        clone_bare(origin.repo_url, root, &git_dir)?;
    }
    let repo = open_bare(&git_dir)?;
    let record = SandboxRecord {
        tenant: origin.tenant.clone(),
        project: origin.project.clone(),
        repo_url: origin.repo_url.to_owned(),
        branch: origin.branch.map(str::to_owned),
        base_commit: resolve_base(&repo, origin.branch)?,
        created_at_ms: now_ms(),
    };
    let json = serde_json::to_vec_pretty(&record)
        .map_err(|e| project_error(format!("cannot encode {SANDBOX_RECORD_NAME}: {e}")))?;
    write_atomic(&root.join(SANDBOX_RECORD_NAME), &json)?;
    Ok(record)
}

/// A data directory must be absolute and outside the system directories every boundary
/// shows read-only, or each profile would see its peers' worktrees.
fn check_not_shown(data_dir: &Path) -> Result<(), WorkerError> {
    if !data_dir.is_absolute() {
        return Err(invalid(
            "data_dir",
            format!("{} must be an absolute path", data_dir.display()),
        ));
    }
    match SYSTEM_RO_PATHS
        .iter()
        .find(|s| data_dir.starts_with(Path::new(s)))
    {
        Some(system) => Err(invalid(
            "data_dir",
            format!(
                "{} lies under {system}, which every boundary shows read-only: peers' \
                 worktrees would be visible",
                data_dir.display()
            ),
        )),
        None => Ok(()),
    }
}

/// The UTF-8 names in a directory (others are skipped); empty when it does not exist.
fn list_names(dir: &Path) -> Result<Vec<String>, WorkerError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(WorkerError::io("listing", dir, e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| WorkerError::io("listing", dir, e))?;
        if names.len() >= SANDBOX_DIR_ENTRIES_MAX {
            return Err(project_error(format!(
                "{} holds more than {SANDBOX_DIR_ENTRIES_MAX} entries",
                dir.display()
            )));
        }
        if let Some(name) = entry.file_name().to_str() {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

/// A JSON record; `None` when absent, malformed or too large (treated as never written).
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, WorkerError> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(WorkerError::io("reading", path, e)),
    };
    if !meta.is_file() || meta.len() > SANDBOX_RECORD_BYTES_MAX {
        return Ok(None);
    }
    let bytes = fs::read(path).map_err(|e| WorkerError::io("reading", path, e))?;
    Ok(serde_json::from_slice(&bytes).ok())
}

/// `path` with a suffix unique in this process: `{path}.{pid}.{n}{suffix}`.
fn unique_sibling(path: &Path, suffix: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{name}.{}.{n}{suffix}", std::process::id()))
}

fn invalid(field: &str, message: impl Into<String>) -> WorkerError {
    WorkerError::Invalid {
        field: field.to_owned(),
        message: message.into(),
    }
}

fn project_error(message: String) -> WorkerError {
    WorkerError::Project(message)
}

fn git_error(what: &str, e: &git2::Error) -> WorkerError {
    WorkerError::Project(format!("{what}: {}", e.message()))
}

#[cfg(test)]
mod tests;
