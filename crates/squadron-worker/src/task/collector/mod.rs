//! COMPLETING: turn what the agent left in `inbox/` into the task's artifacts.
//!
//! `outbox/artifacts/` ends up holding:
//!
//! ```text
//! {id}.patch            the working tree against the base commit, binary files included
//! {id}-untracked.txt    new files git does not ignore, one path per line
//! metadata.json         exit code, timings, stats, the artifact list, what was skipped
//! files/<path>          copies of the files matching lifecycle.artifact_patterns
//! ```
//!
//! Pattern matches live under `files/`, so no file of the worktree can take the name of
//! `metadata.json` or the patch. Patterns are matched relative to the task's working
//! directory (`repository.subpath`, else the repository root) and see ignored files too;
//! `.git` directories and the task's `TASK.md` are never copied.
//!
//! The patch is `git diff <base>` where base is the commit staging checked out (recorded in
//! `run/staged`), falling back to `HEAD`: without agent commits that is exactly
//! `git diff HEAD`, and with them the patch still holds everything the agent changed. It
//! applies with `git apply` to a fresh clone at the base commit. Files that would push it
//! past [`CollectLimits::patch_bytes_max`] are left out whole (never cut mid-file, so the
//! rest still applies) and listed in `metadata.json`.
//!
//! The worktree is hostile input: the agent had full control of it, and a sandbox may still
//! be running (failure_action: preserve). So symbolic links are never followed; every file
//! copied is checked, after it is opened, to lie inside `inbox/`; its `.git` must be a plain
//! directory without alternates or a common directory pointing elsewhere, and git's view of
//! the work tree is pinned to `inbox/` whatever its config says. Results are assembled in a
//! private directory next to `outbox/` (never mounted into a sandbox) and renamed over
//! `outbox/artifacts/` at the end, so nothing the sandbox plants there can redirect a write.
//! Whatever was there before is replaced.

pub(crate) mod artifact_pattern;
mod git_guard;
mod patch;
mod pattern_copy;
mod untracked;
pub(crate) mod worktree;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use squadron_core::ids::TaskId;
use squadron_core::limits::TASK_ARTIFACTS_MAX;
use squadron_core::manifest::{RuntimeKind, TaskSpec};

use crate::error::WorkerError;
use crate::support::{now_ms, remove_path, write_atomic};
use crate::task::staging::StagingReport;
use crate::task::task_dir::{TaskDir, INBOX_MOUNT};
use git_guard::open_worktree_repo;

/// Largest patch; files beyond it are left out and listed.
pub(crate) const PATCH_BYTES_MAX: u64 = 64 << 20;
/// Largest single pattern-matched file copied.
pub(crate) const ARTIFACT_FILE_BYTES_MAX: u64 = 64 << 20;
/// Bytes of pattern-matched files copied in all.
pub(crate) const ARTIFACT_TOTAL_BYTES_MAX: u64 = 512 << 20;
/// Pattern-matched files copied: the control plane records at most `TASK_ARTIFACTS_MAX`
/// names, three of which are the patch, the untracked list and `metadata.json`.
pub(crate) const ARTIFACT_FILES_MAX: usize = TASK_ARTIFACTS_MAX - 3;
/// Paths in `{id}-untracked.txt`.
pub(crate) const UNTRACKED_PATHS_MAX: usize = 100_000;
/// Directory entries the pattern walk visits before it stops.
pub(crate) const WALK_ENTRIES_MAX: usize = 1_000_000;
/// How long one collection may take, all outputs together.
pub(crate) const COLLECT_MS_MAX: u64 = 20 * 60 * 1_000;
/// Directory depth the pattern walk descends to.
pub(crate) const WALK_DEPTH_MAX: usize = 64;
/// Skipped files (and files left out of the patch) listed by name in `metadata.json`;
/// the totals count them all.
pub(crate) const SKIPPED_LISTED_MAX: usize = 256;
/// Notes kept in `metadata.json`; more are counted in a last note.
pub(crate) const NOTES_MAX: usize = 64;

/// The metadata file's name in `artifacts/`.
pub(crate) const METADATA_NAME: &str = "metadata.json";
/// The directory of `artifacts/` holding the pattern-matched copies.
pub(crate) const FILES_DIR: &str = "files";
/// Where the artifacts are assembled, in the task root (not mounted in any sandbox).
const ASSEMBLY_DIR_NAME: &str = ".artifacts.assembling";
/// Tries at swapping the assembled directory in while a sandbox recreates the old one.
const SWAP_TRIES_MAX: u32 = 3;

/// The patch's name in `artifacts/`.
pub(crate) fn patch_name(task: TaskId) -> String {
    format!("{task}.patch")
}

/// The untracked list's name in `artifacts/`.
pub(crate) fn untracked_name(task: TaskId) -> String {
    format!("{task}-untracked.txt")
}

/// What the worker observed of the provider's run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunFacts {
    pub(crate) attempt: u32,
    pub(crate) runtime: RuntimeKind,
    /// `None` when the sandbox vanished without an exit code.
    pub(crate) exit_code: Option<i32>,
    pub(crate) started_at_ms: u64,
    pub(crate) finished_at_ms: u64,
    pub(crate) stdout_bytes: u64,
    pub(crate) stderr_bytes: u64,
    pub(crate) lines: u64,
    pub(crate) events: u64,
}

/// The bounds of one collection; [`Default`] gives the module's constants.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CollectLimits {
    pub(crate) patch_bytes_max: u64,
    pub(crate) artifact_file_bytes_max: u64,
    pub(crate) artifact_total_bytes_max: u64,
    pub(crate) artifact_files_max: usize,
    pub(crate) untracked_paths_max: usize,
    pub(crate) walk_entries_max: usize,
}

impl Default for CollectLimits {
    fn default() -> Self {
        Self {
            patch_bytes_max: PATCH_BYTES_MAX,
            artifact_file_bytes_max: ARTIFACT_FILE_BYTES_MAX,
            artifact_total_bytes_max: ARTIFACT_TOTAL_BYTES_MAX,
            artifact_files_max: ARTIFACT_FILES_MAX,
            untracked_paths_max: UNTRACKED_PATHS_MAX,
            walk_entries_max: WALK_ENTRIES_MAX,
        }
    }
}

/// One file in `artifacts/`; `name` is relative to it, `/`-separated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ArtifactEntry {
    pub(crate) name: String,
    pub(crate) bytes: u64,
}

/// A file matched by a pattern but not copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SkippedFile {
    /// Relative to the working directory.
    pub(crate) path: String,
    pub(crate) reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RunStats {
    pub(crate) stdout_bytes: u64,
    pub(crate) stderr_bytes: u64,
    pub(crate) lines: u64,
    pub(crate) events: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PatchSummary {
    pub(crate) name: String,
    pub(crate) bytes: u64,
    /// Files whose changes are in the patch.
    pub(crate) files: u64,
    /// Some changed files were left out (too large for the remaining room).
    pub(crate) truncated: bool,
    /// Repository paths left out, up to [`SKIPPED_LISTED_MAX`].
    pub(crate) omitted: Vec<String>,
    pub(crate) omitted_total: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UntrackedSummary {
    pub(crate) name: String,
    pub(crate) paths: u64,
    /// More untracked paths existed than [`CollectLimits::untracked_paths_max`].
    pub(crate) truncated: bool,
}

/// The content of `metadata.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CollectMetadata {
    pub(crate) task_id: TaskId,
    pub(crate) attempt: u32,
    pub(crate) name: String,
    pub(crate) runtime: RuntimeKind,
    pub(crate) exit_code: Option<i32>,
    /// The exit code is one of `lifecycle.success_exit_codes`.
    pub(crate) success: bool,
    pub(crate) started_at_ms: u64,
    pub(crate) finished_at_ms: u64,
    pub(crate) duration_ms: u64,
    pub(crate) collected_at_ms: u64,
    pub(crate) stats: RunStats,
    /// The commit the patch is relative to (`None`: the empty tree).
    pub(crate) base_commit: Option<String>,
    /// The working directory the patterns were matched in, as the sandbox saw it.
    pub(crate) workdir: String,
    pub(crate) patch: Option<PatchSummary>,
    pub(crate) untracked: Option<UntrackedSummary>,
    /// Every artifact but `metadata.json` itself.
    pub(crate) artifacts: Vec<ArtifactEntry>,
    /// Pattern matches not copied, up to [`SKIPPED_LISTED_MAX`].
    pub(crate) skipped: Vec<SkippedFile>,
    pub(crate) skipped_total: u64,
    /// Anything else worth knowing: outputs not produced and why, limits hit.
    pub(crate) notes: Vec<String>,
    pub(crate) limits: CollectLimits,
}

/// What the control plane is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CollectReport {
    /// Every file in `artifacts/`, `metadata.json` included, names relative to it.
    pub(crate) artifacts: Vec<ArtifactEntry>,
    pub(crate) metadata: CollectMetadata,
}

impl CollectReport {
    /// The artifact names, for the task record.
    pub(crate) fn names(&self) -> Vec<String> {
        self.artifacts.iter().map(|a| a.name.clone()).collect()
    }
}

/// Where the work the task did lies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CollectSource {
    /// The clone staging made in `inbox/` (a dedicated task).
    Inbox,
    /// A profile's worktree in its project's sandbox (`placement: project`).
    ProfileWorktree(worktree::ProfileWorktree),
}

/// Collects the artifacts of `task` from `source` with the default [`CollectLimits`].
pub(crate) async fn collect(
    dir: &TaskDir,
    task: TaskId,
    spec: &TaskSpec,
    run: &RunFacts,
    source: &CollectSource,
) -> Result<CollectReport, WorkerError> {
    collect_from(dir, task, spec, run, &CollectLimits::default(), source).await
}

/// Collects the artifacts of a dedicated task within `limits`.
#[cfg(test)]
pub(crate) async fn collect_with_limits(
    dir: &TaskDir,
    task: TaskId,
    spec: &TaskSpec,
    run: &RunFacts,
    limits: &CollectLimits,
) -> Result<CollectReport, WorkerError> {
    collect_from(dir, task, spec, run, limits, &CollectSource::Inbox).await
}

/// Collects the artifacts of `task` from `source` within `limits`. Git trouble (a broken or
/// hostile repository) does not fail the collection: the patch or list is left out and a
/// note says why. Errors are reserved for the worker's own file system.
pub(crate) async fn collect_from(
    dir: &TaskDir,
    task: TaskId,
    spec: &TaskSpec,
    run: &RunFacts,
    limits: &CollectLimits,
    source: &CollectSource,
) -> Result<CollectReport, WorkerError> {
    if dir.task() != task {
        return Err(WorkerError::Invalid {
            field: "task_id".into(),
            message: format!(
                "task {task} does not own task directory {}",
                dir.root().display()
            ),
        });
    }
    let (dir, spec, run, limits, source) = (
        dir.clone(),
        spec.clone(),
        run.clone(),
        limits.clone(),
        source.clone(),
    );
    let collecting = tokio::task::spawn_blocking(move || {
        Collector::new(&dir, &spec, &run, &limits, source)?.run()
    });
    // A bound on the whole, whatever the sandbox left for git to read: the task fails naming
    // it instead of staying COMPLETING (the known ways to hang it, FIFOs, are removed first).
    match tokio::time::timeout(Duration::from_millis(COLLECT_MS_MAX), collecting).await {
        Ok(joined) => {
            joined.map_err(|e| WorkerError::Collect(format!("collection thread failed: {e}")))?
        }
        Err(_) => Err(WorkerError::Collect(format!(
            "the collection did not finish within {COLLECT_MS_MAX} ms"
        ))),
    }
}

/// What git gave for the patch and the untracked list.
struct GitOutputs {
    /// The commit the patch is relative to (`None`: the empty tree).
    base_commit: Option<String>,
    patch: Option<PatchSummary>,
    untracked: Option<UntrackedSummary>,
}

/// One collection in progress.
struct Collector<'a> {
    dir: &'a TaskDir,
    spec: &'a TaskSpec,
    run: &'a RunFacts,
    limits: &'a CollectLimits,
    source: CollectSource,
    /// The work tree on the host: `inbox/`, or the profile's worktree.
    work_tree: PathBuf,
    staged: Option<StagingReport>,
    assembly: PathBuf,
    artifacts: Vec<ArtifactEntry>,
    skipped: Vec<SkippedFile>,
    skipped_total: u64,
    notes: Vec<String>,
    copied_bytes: u64,
    copied_files: usize,
}

impl<'a> Collector<'a> {
    fn new(
        dir: &'a TaskDir,
        spec: &'a TaskSpec,
        run: &'a RunFacts,
        limits: &'a CollectLimits,
        source: CollectSource,
    ) -> Result<Self, WorkerError> {
        let mut notes = Vec::new();
        let (staged, work_tree) = match &source {
            CollectSource::Inbox => {
                let staged = StagingReport::load(dir)?;
                match &staged {
                    None => notes.push(
                        "no staging record (run/staged); the patch is relative to HEAD".to_string(),
                    ),
                    Some(s) if s.attempt != run.attempt => notes.push(format!(
                        "staged for attempt {} but collecting attempt {}",
                        s.attempt, run.attempt
                    )),
                    Some(_) => {}
                }
                (staged, dir.inbox())
            }
            CollectSource::ProfileWorktree(w) => (None, w.worktree.clone()),
        };
        Ok(Self {
            dir,
            spec,
            run,
            limits,
            source,
            work_tree,
            staged,
            assembly: dir.root().join(ASSEMBLY_DIR_NAME),
            artifacts: Vec::new(),
            skipped: Vec::new(),
            skipped_total: 0,
            notes,
            copied_bytes: 0,
            copied_files: 0,
        })
    }

    fn run(mut self) -> Result<CollectReport, WorkerError> {
        remove_path(&self.assembly)?;
        std::fs::create_dir_all(&self.assembly)
            .map_err(|e| WorkerError::io("creating", &self.assembly, e))?;
        let git = self.git_outputs();
        let (workdir_host, workdir) = self.workdir();
        let first_copy = self.artifacts.len();
        self.copy_pattern_matches(&workdir_host)?;
        self.artifacts[first_copy..].sort_by(|a, b| a.name.cmp(&b.name));

        let leftovers = count_entries(&self.dir.artifacts());
        if leftovers > 0 {
            self.notes.push(format!(
                "replaced {leftovers} entries found in outbox/artifacts before collection"
            ));
        }
        let assembly = self.assembly.clone();
        let artifacts_dir = self.dir.artifacts();
        let (metadata, mut artifacts) = self.metadata(git, workdir);
        let json = serde_json::to_vec_pretty(&metadata)
            .map_err(|e| WorkerError::Collect(format!("cannot encode {METADATA_NAME}: {e}")))?;
        write_atomic(&assembly.join(METADATA_NAME), &json)?;
        artifacts.push(ArtifactEntry {
            name: METADATA_NAME.to_string(),
            bytes: json.len() as u64,
        });
        swap_into_place(&assembly, &artifacts_dir)?;
        Ok(CollectReport {
            artifacts,
            metadata,
        })
    }

    /// The patch and the untracked list, each left out with a note when git cannot give it.
    fn git_outputs(&mut self) -> GitOutputs {
        if let CollectSource::ProfileWorktree(w) = &self.source {
            let w = w.clone();
            return self.worktree_outputs(&w);
        }
        let task = self.dir.task();
        let mut out = GitOutputs {
            base_commit: self.staged.as_ref().and_then(|s| s.base_commit.clone()),
            patch: None,
            untracked: None,
        };
        match open_worktree_repo(&self.dir.inbox(), &mut self.notes) {
            Ok(repo) => {
                let base = self.base_tree(&repo, &mut out.base_commit);
                match self.write_patch(&repo, base.as_ref(), &patch_name(task)) {
                    Ok(summary) => out.patch = Some(summary),
                    Err(e) => self.notes.push(format!("no patch: {e}")),
                }
                match self.write_untracked(&repo, &untracked_name(task)) {
                    Ok(summary) => out.untracked = Some(summary),
                    Err(e) => self.notes.push(format!("no untracked list: {e}")),
                }
            }
            Err(why) => self
                .notes
                .push(format!("no patch or untracked list: {why}")),
        }
        out
    }

    /// `metadata.json`'s content, and every artifact but itself.
    fn metadata(self, git: GitOutputs, workdir: String) -> (CollectMetadata, Vec<ArtifactEntry>) {
        let run = self.run;
        let metadata = CollectMetadata {
            task_id: self.dir.task(),
            attempt: run.attempt,
            name: self.spec.name.clone(),
            runtime: run.runtime,
            exit_code: run.exit_code,
            success: run
                .exit_code
                .is_some_and(|c| self.spec.lifecycle.is_success_exit_code(c)),
            started_at_ms: run.started_at_ms,
            finished_at_ms: run.finished_at_ms,
            duration_ms: run.finished_at_ms.saturating_sub(run.started_at_ms),
            collected_at_ms: now_ms(),
            stats: RunStats {
                stdout_bytes: run.stdout_bytes,
                stderr_bytes: run.stderr_bytes,
                lines: run.lines,
                events: run.events,
            },
            base_commit: git.base_commit,
            workdir,
            patch: git.patch,
            untracked: git.untracked,
            artifacts: self.artifacts.clone(),
            skipped: self.skipped,
            skipped_total: self.skipped_total,
            notes: capped_notes(self.notes),
            limits: self.limits.clone(),
        };
        (metadata, self.artifacts)
    }

    /// The working directory on the host and as the sandbox saw it.
    fn workdir(&self) -> (PathBuf, String) {
        let subpath = match &self.staged {
            Some(s) => s.subpath.clone(),
            None => spec_subpath(self.spec),
        };
        if subpath.is_empty() {
            (self.work_tree.clone(), INBOX_MOUNT.to_string())
        } else {
            (
                self.work_tree.join(&subpath),
                format!("{INBOX_MOUNT}/{subpath}"),
            )
        }
    }

    fn skip(&mut self, path: &str, reason: impl Into<String>) {
        self.skipped_total += 1;
        if self.skipped.len() < SKIPPED_LISTED_MAX {
            self.skipped.push(SkippedFile {
                path: path.to_string(),
                reason: reason.into(),
            });
        }
    }
}

/// `repository.subpath` as a relative path of plain components (`.`, `..` and empty ones
/// dropped); empty for the repository's root.
pub(crate) fn spec_subpath(spec: &TaskSpec) -> String {
    spec.repository
        .subpath
        .as_deref()
        .unwrap_or("")
        .split('/')
        .filter(|p| !p.is_empty() && *p != "." && *p != "..")
        .collect::<Vec<_>>()
        .join("/")
}

/// At most [`NOTES_MAX`] notes, the last one counting those dropped.
fn capped_notes(mut notes: Vec<String>) -> Vec<String> {
    if notes.len() > NOTES_MAX {
        let dropped = notes.len() - (NOTES_MAX - 1);
        notes.truncate(NOTES_MAX - 1);
        notes.push(format!("{dropped} more notes not kept"));
    }
    notes
}

/// Entries directly in `path`, when it is a real directory (bounded count).
fn count_entries(path: &Path) -> usize {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::read_dir(path)
            .map(|iter| iter.take(TASK_ARTIFACTS_MAX).count())
            .unwrap_or(0),
        Ok(_) => 1,
        Err(_) => 0,
    }
}

/// Replaces `target` (whatever it is now: directory, link, file) with `assembled`.
fn swap_into_place(assembled: &Path, target: &Path) -> Result<(), WorkerError> {
    let mut last = None;
    for _ in 0..SWAP_TRIES_MAX {
        remove_path(target)?;
        match std::fs::rename(assembled, target) {
            Ok(()) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    let err = last.unwrap_or_else(|| std::io::Error::other("rename failed"));
    Err(WorkerError::io("replacing", target, err))
}

#[cfg(test)]
mod tests;
