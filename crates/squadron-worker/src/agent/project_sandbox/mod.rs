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
//! read-only (see `agent_attempt`), so Git metadata is changed only from the worker's side.
//!
//! A worktree is created once and never reset implicitly: `reset_worktree` is the only way,
//! and it demands reap evidence (`populated 0`) for the leaf of the profile's last started
//! generation (ADR-0011 decision 6, INV-9). The `g{n}.started` markers are the worker's own
//! record of which generations ran, so the proof requirement survives a worker restart.
//!
//! Everything here blocks (git, file system): call it from a blocking task.

use std::cell::Cell;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use git2::build::{CheckoutBuilder, CloneLocal, RepoBuilder};
use git2::{FetchOptions, RemoteCallbacks, Repository, ResetType, WorktreeAddOptions};
use serde::{Deserialize, Serialize};
use squadron_core::ids::{Generation, ProfileKey, ProjectId, TenantId};
use squadron_core::limits::DESCRIPTOR_BYTES_MAX;
use squadron_isolation::bubblewrap::SYSTEM_RO_PATHS;
use squadron_isolation::ReapEvidence;

use crate::error::WorkerError;
use crate::support::remove_path;
use crate::support::{now_ms, write_atomic};
use crate::task::staging::{redact_url, CLONE_BYTES_MAX_DEFAULT};

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
/// Longest `cgroup.events` read when checking a leaf.
const CGROUP_EVENTS_BYTES_MAX: usize = 4096;
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
    pub(crate) fn open_or_create(
        data_dir: &Path,
        tenant: &TenantId,
        project: &ProjectId,
        repo_url: &str,
        branch: Option<&str>,
    ) -> Result<ProjectSandbox, WorkerError> {
        if let Some(branch) = branch {
            if !git2::Reference::is_valid_name(&format!("refs/heads/{branch}")) {
                return Err(invalid(
                    "branch",
                    format!("{branch:?} is not a branch name"),
                ));
            }
        }
        check_not_shown(data_dir)?;
        fs::create_dir_all(data_dir).map_err(|e| WorkerError::io("creating", data_dir, e))?;
        // Real paths: the worktrees' `.git` files name the common directory by its real path,
        // and the boundary shows it at exactly that path.
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
        for dir in [
            root.join(REPO_DIR),
            root.join(WORKTREES_DIR),
            root.join(STATE_DIR),
            root.join(RUN_DIR),
        ] {
            fs::create_dir_all(&dir).map_err(|e| WorkerError::io("creating", &dir, e))?;
        }

        let record_path = root.join(SANDBOX_RECORD_NAME);
        let record = match read_json::<SandboxRecord>(&record_path)? {
            Some(record) => record,
            None => {
                let git_dir = root.join(REPO_DIR).join(".git");
                if !git_dir.exists() {
                    clone_bare(repo_url, &root, &git_dir)?;
                }
                let repo = open_bare(&git_dir)?;
                let record = SandboxRecord {
                    tenant: tenant.clone(),
                    project: project.clone(),
                    repo_url: repo_url.to_owned(),
                    branch: branch.map(str::to_owned),
                    base_commit: resolve_base(&repo, branch)?,
                    created_at_ms: now_ms(),
                };
                let json = serde_json::to_vec_pretty(&record).map_err(|e| {
                    project_error(format!("cannot encode {SANDBOX_RECORD_NAME}: {e}"))
                })?;
                write_atomic(&record_path, &json)?;
                record
            }
        };
        if record.tenant != *tenant || record.project != *project {
            return Err(invalid(
                "sandbox",
                format!(
                    "{} belongs to {}/{}",
                    record_path.display(),
                    record.tenant,
                    record.project
                ),
            ));
        }
        if record.repo_url != repo_url {
            return Err(invalid(
                "repository.url",
                format!(
                    "the sandbox at {} was cloned from another repository",
                    root.display()
                ),
            ));
        }
        if record.branch.as_deref() != branch {
            return Err(invalid(
                "branch",
                format!(
                    "the sandbox at {} was made from branch {:?}, not {branch:?}",
                    root.display(),
                    record.branch
                ),
            ));
        }
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

    /// The generations of a profile started on this worker, ascending.
    pub(crate) fn started_generations(
        &self,
        key: &ProfileKey,
    ) -> Result<Vec<Generation>, WorkerError> {
        let run = self.profile_paths(key).run;
        let mut generations: Vec<Generation> = list_names(&run)?
            .iter()
            .filter_map(|name| {
                let digits = name.strip_prefix('g')?.strip_suffix(".started")?;
                let valid = !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit());
                valid.then(|| digits.parse().ok().map(Generation::new))?
            })
            .collect();
        generations.sort();
        Ok(generations)
    }

    /// The record of a started generation; `None` if it never started here.
    pub(crate) fn started(
        &self,
        key: &ProfileKey,
        generation: Generation,
    ) -> Result<Option<StartedGeneration>, WorkerError> {
        let path = self.profile_paths(key).started_marker(generation);
        let Some(record) = read_json::<StartedGeneration>(&path)? else {
            if path.exists() {
                return Err(project_error(format!(
                    "{} is unreadable: generation {generation} of {key} started but its leaf \
                     is unknown",
                    path.display()
                )));
            }
            return Ok(None);
        };
        Ok(Some(record))
    }

    #[allow(
        dead_code,
        reason = "no caller yet: a takeover that resets the worktree will use it (ADR-0011 decision 6); the tests prove the proof requirement"
    )]
    /// The last generation of a profile started here, with its leaf.
    pub(crate) fn last_started(
        &self,
        key: &ProfileKey,
    ) -> Result<Option<StartedGeneration>, WorkerError> {
        match self.started_generations(key)?.last() {
            Some(generation) => self.started(key, *generation),
            None => Ok(None),
        }
    }

    /// The reap evidence recorded for a generation (`run/{key}/g{n}.reaped`), if any.
    pub(crate) fn reap_evidence(
        &self,
        key: &ProfileKey,
        generation: Generation,
    ) -> Result<Option<ReapEvidence>, WorkerError> {
        read_json(&self.profile_paths(key).reaped_record(generation))
    }

    /// Records, exclusively and before anything is spawned, that `generation` of the profile
    /// starts in leaf `cgroup`. Refused when this or a newer generation started already, or
    /// when `precheck` (the caller's proof that no other generation runs) fails.
    pub(crate) fn record_start(
        &self,
        paths: &ProfilePaths,
        generation: Generation,
        cgroup: &Path,
        precheck: impl FnOnce() -> Result<(), WorkerError>,
    ) -> Result<StartedGeneration, WorkerError> {
        let _guard = self.guard();
        let key = &paths.key;
        let last = self.started_generations(key)?.last().copied();
        if let Some(last) = last {
            if last == generation {
                return Err(invalid(
                    "generation",
                    format!(
                        "generation {generation} of profile {key} was started already; adopt it"
                    ),
                ));
            }
            if last > generation {
                return Err(invalid(
                    "generation",
                    format!(
                        "generation {generation} of profile {key} is older than generation \
                         {last}, which started already"
                    ),
                ));
            }
        }
        precheck()?;
        if let Some(last) = last {
            // The previous generation may still be between its start record and its leaf:
            // only its exit code or its reap record says it is over.
            let exited = paths.exit_code_file(last).exists();
            let reaped = self
                .reap_evidence(key, last)?
                .is_some_and(|evidence| !evidence.populated);
            if !exited && !reaped {
                return Err(invalid(
                    "generation",
                    format!(
                        "generation {last} of profile {key} has neither exited nor been \
                         reaped; reap it before starting generation {generation}"
                    ),
                ));
            }
        }
        let record = StartedGeneration {
            generation,
            cgroup: cgroup.display().to_string(),
            started_at_ms: now_ms(),
        };
        let json = serde_json::to_vec_pretty(&record)
            .map_err(|e| project_error(format!("cannot encode the start record: {e}")))?;
        let marker = paths.started_marker(generation);
        // Written whole under another name, then linked: the marker appears complete or not at
        // all, and link(2) fails if it exists (the once-only guarantee).
        let tmp = unique_sibling(&marker, ".tmp");
        write_atomic(&tmp, &json)?;
        let linked = fs::hard_link(&tmp, &marker);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => Ok(record),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Err(invalid(
                "generation",
                format!("generation {generation} of profile {key} was started already; adopt it"),
            )),
            Err(e) => Err(WorkerError::io("recording the start at", &marker, e)),
        }
    }

    #[allow(
        dead_code,
        reason = "no caller yet: a takeover that resets the worktree will use it (ADR-0011 decision 6); the tests prove the proof requirement"
    )]
    /// Resets the profile's worktree to the tip of `squadron/{key}`: every file of the
    /// worktree is removed (symlinks are not followed), the `.git` link rewritten, the tip
    /// checked out and the index reset. Returns the commit.
    ///
    /// Refused unless `proof` is reap evidence with `populated: false` for the leaf of the
    /// profile's last started generation, and that leaf is not populated now. A profile
    /// that never started on this worker needs no proof.
    pub(crate) fn reset_worktree(
        &self,
        key: &ProfileKey,
        proof: Option<&ReapEvidence>,
    ) -> Result<String, WorkerError> {
        let _guard = self.guard();
        let paths = self.profile_paths(key);
        let admin = self.git_dir().join("worktrees").join(key.as_str());
        if !self.has_worktree(key) {
            return Err(invalid(
                "profile_key",
                format!("{key} has no worktree in {}", self.root.display()),
            ));
        }
        if let Some(last) = self.last_started(key)? {
            check_quiescence_proof(key, &last, proof)?;
        }

        for name in list_names(&paths.worktree)? {
            remove_path(&paths.worktree.join(name))?;
        }
        let gitfile = paths.worktree.join(".git");
        let link = format!("gitdir: {}\n", admin.display());
        write_atomic(&gitfile, link.as_bytes())?;
        let repo = Repository::open(&paths.worktree)
            .map_err(|e| git_error("opening the profile worktree", &e))?;
        let refname = format!("refs/heads/{}", paths.branch);
        let tip = repo
            .find_reference(&refname)
            .and_then(|r| r.peel_to_commit())
            .map_err(|e| git_error("finding the profile branch", &e))?;
        repo.set_head(&refname)
            .map_err(|e| git_error("pointing the worktree at its branch", &e))?;
        let mut checkout = CheckoutBuilder::new();
        checkout.force().recreate_missing(true);
        repo.reset(tip.as_object(), ResetType::Hard, Some(&mut checkout))
            .map_err(|e| git_error("resetting the profile worktree", &e))?;
        Ok(tip.id().to_string())
    }

    fn guard(&self) -> MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps the evidence of a reap that proved a generation quiescent, so a restarted worker
/// can still show it (a crash takeover needs it, INV-9); evidence that proves nothing is not
/// kept.
pub(crate) fn record_reap(
    paths: &ProfilePaths,
    generation: Generation,
    evidence: &ReapEvidence,
) -> Result<(), WorkerError> {
    if evidence.populated {
        return Ok(());
    }
    let json = serde_json::to_vec_pretty(evidence)
        .map_err(|e| project_error(format!("cannot encode reap evidence: {e}")))?;
    write_atomic(&paths.reaped_record(generation), &json)
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

#[allow(
    dead_code,
    reason = "no caller yet: a takeover that resets the worktree will use it (ADR-0011 decision 6); the tests prove the proof requirement"
)]
/// The proof `reset_worktree` demands for the last started generation.
fn check_quiescence_proof(
    key: &ProfileKey,
    last: &StartedGeneration,
    proof: Option<&ReapEvidence>,
) -> Result<(), WorkerError> {
    let generation = last.generation;
    let Some(proof) = proof else {
        return Err(invalid(
            "reap evidence",
            format!(
                "missing: resetting the worktree of {key} needs reap evidence that generation \
                 {generation} (cgroup {}) is quiescent",
                last.cgroup
            ),
        ));
    };
    if proof.cgroup != last.cgroup {
        return Err(invalid(
            "reap evidence",
            format!(
                "it is for {}, not for {}, the leaf of generation {generation} of {key}, the \
                 last one started",
                proof.cgroup, last.cgroup
            ),
        ));
    }
    if proof.populated {
        return Err(invalid(
            "reap evidence",
            format!(
                "{} was still populated when reaped; generation {generation} of {key} is not \
                 proved quiescent",
                proof.cgroup
            ),
        ));
    }
    if leaf_populated(Path::new(&last.cgroup))? {
        return Err(invalid(
            "reap evidence",
            format!(
                "{} is populated now; generation {generation} of {key} runs again",
                last.cgroup
            ),
        ));
    }
    Ok(())
}

/// `populated` of a v2 cgroup directory; an absent directory holds nothing.
pub(crate) fn leaf_populated(cgroup: &Path) -> Result<bool, WorkerError> {
    let events = cgroup.join("cgroup.events");
    let text = match fs::read_to_string(&events) {
        Ok(text) => text,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(WorkerError::io("reading", &events, e)),
    };
    let text = crate::support::truncate_at_char(&text, CGROUP_EVENTS_BYTES_MAX);
    text.lines()
        .find_map(|line| line.strip_prefix("populated "))
        .map(|v| v.trim() == "1")
        .ok_or_else(|| project_error(format!("{} has no populated line", events.display())))
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

fn open_bare(git_dir: &Path) -> Result<Repository, WorkerError> {
    Repository::open_bare(git_dir).map_err(|e| git_error("opening repo/.git", &e))
}

/// Clones `url` bare into a fresh directory beside the sandbox and renames it to `git_dir`,
/// so `repo/.git` only ever appears complete.
fn clone_bare(url: &str, root: &Path, git_dir: &Path) -> Result<(), WorkerError> {
    let local = url.strip_prefix("file://").unwrap_or(url);
    if local.starts_with('/') && fs::symlink_metadata(local).is_err() {
        return Err(invalid(
            "repository.url",
            "no repository at <repository.url>: the local path does not exist",
        ));
    }
    let too_large = Cell::new(false);
    let mut callbacks = RemoteCallbacks::new();
    callbacks.transfer_progress(|progress| {
        let over =
            u64::try_from(progress.received_bytes()).unwrap_or(u64::MAX) > CLONE_BYTES_MAX_DEFAULT;
        too_large.set(over);
        !over
    });
    let mut fetch = FetchOptions::new();
    fetch.remote_callbacks(callbacks);
    let mut builder = RepoBuilder::new();
    builder.bare(true).fetch_options(fetch);
    // Never hard-link the source's objects (see staging): copy them, or use the transport.
    builder.clone_local(if url.starts_with("file://") {
        CloneLocal::None
    } else {
        CloneLocal::NoLinks
    });
    let cloning = unique_sibling(&root.join(CLONING_DIR_NAME), "");
    let cloned = builder.clone(url, &cloning);
    drop(builder);
    let outcome = match cloned {
        Ok(_) => match fs::rename(&cloning, git_dir) {
            Ok(()) => Ok(()),
            // Another caller finished first; its clone is as good as ours.
            Err(_) if git_dir.join("HEAD").exists() => Ok(()),
            Err(e) => Err(WorkerError::io("moving the clone to", git_dir, e)),
        },
        Err(_) if too_large.get() => Err(project_error(format!(
            "repository.url: clone aborted after downloading more than \
             {CLONE_BYTES_MAX_DEFAULT} bytes"
        ))),
        Err(e) => Err(project_error(format!(
            "repository.url: clone failed: {}",
            redact_url(e.message(), url)
        ))),
    };
    let _ = remove_path(&cloning);
    outcome
}

/// The commit profiles start from: the branch's tip at the remote, or the default branch.
fn resolve_base(repo: &Repository, branch: Option<&str>) -> Result<String, WorkerError> {
    let commit = match branch {
        Some(branch) => [
            format!("refs/remotes/{ORIGIN}/{branch}"),
            format!("refs/heads/{branch}"),
        ]
        .iter()
        .find_map(|name| {
            repo.find_reference(name)
                .and_then(|r| r.peel_to_commit())
                .ok()
        })
        .ok_or_else(|| {
            invalid(
                "branch",
                format!("branch {branch:?} does not exist in the repository"),
            )
        })?,
        None => repo.head().and_then(|h| h.peel_to_commit()).map_err(|_| {
            invalid(
                "repository.url",
                "the repository has no commit to start from",
            )
        })?,
    };
    Ok(commit.id().to_string())
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
