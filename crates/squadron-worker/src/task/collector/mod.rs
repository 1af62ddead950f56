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

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use git2::{DiffOptions, Patch, Repository, Status, StatusOptions, Tree};
use serde::{Deserialize, Serialize};
use squadron_core::ids::TaskId;
use squadron_core::limits::{ARTIFACT_NAME_BYTES_MAX, TASK_ARTIFACTS_MAX};
use squadron_core::manifest::{RuntimeKind, TaskSpec};

use crate::error::WorkerError;
use crate::support::remove_path;
use crate::support::{now_ms, write_atomic};
use crate::task::staging::{StagingReport, TASK_MD_NAME};
use crate::task::task_dir::{TaskDir, INBOX_MOUNT};
use artifact_pattern::ArtifactPattern;

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
/// Directory depth the pattern walk descends to.
pub(crate) const WALK_DEPTH_MAX: usize = 64;
/// Skipped files (and files left out of the patch) listed by name in `metadata.json`;
/// the totals count them all.
pub(crate) const SKIPPED_LISTED_MAX: usize = 256;
/// Notes kept in `metadata.json`; more are counted in a last note.
pub(crate) const NOTES_MAX: usize = 64;
/// Entries of `.git/objects` (loose objects included) inspected for symbolic links; a
/// repository with more is not read at all.
const GIT_OBJECT_ENTRIES_CHECKED_MAX: usize = 200_000;

/// The metadata file's name in `artifacts/`.
pub(crate) const METADATA_NAME: &str = "metadata.json";
/// The directory of `artifacts/` holding the pattern-matched copies.
pub(crate) const FILES_DIR: &str = "files";
/// Where the artifacts are assembled, in the task root (not mounted in any sandbox).
const ASSEMBLY_DIR_NAME: &str = ".artifacts.assembling";
/// Tries at swapping the assembled directory in while a sandbox recreates the old one.
const SWAP_TRIES_MAX: u32 = 3;
/// Linux `O_NONBLOCK` (the same value on x86, ARM and RISC-V): opening a file that was
/// swapped for a FIFO after it was inspected must not hang the collector.
const OPEN_NONBLOCK: i32 = 0o4000;

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

/// Collects the artifacts of `task` with the default [`CollectLimits`].
pub(crate) async fn collect(
    dir: &TaskDir,
    task: TaskId,
    spec: &TaskSpec,
    run: &RunFacts,
) -> Result<CollectReport, WorkerError> {
    collect_with_limits(dir, task, spec, run, &CollectLimits::default()).await
}

/// Collects the artifacts of `task` within `limits`. Git trouble (a broken or hostile
/// repository) does not fail the collection: the patch or list is left out and a note says
/// why. Errors are reserved for the worker's own file system.
pub(crate) async fn collect_with_limits(
    dir: &TaskDir,
    task: TaskId,
    spec: &TaskSpec,
    run: &RunFacts,
    limits: &CollectLimits,
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
    let (dir, spec, run, limits) = (dir.clone(), spec.clone(), run.clone(), limits.clone());
    tokio::task::spawn_blocking(move || Collector::new(&dir, &spec, &run, &limits)?.run())
        .await
        .map_err(|e| WorkerError::Collect(format!("collection thread failed: {e}")))?
}

/// One collection in progress.
struct Collector<'a> {
    dir: &'a TaskDir,
    spec: &'a TaskSpec,
    run: &'a RunFacts,
    limits: &'a CollectLimits,
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
    ) -> Result<Self, WorkerError> {
        let staged = StagingReport::load(dir)?;
        let mut notes = Vec::new();
        match &staged {
            None => notes
                .push("no staging record (run/staged); the patch is relative to HEAD".to_string()),
            Some(s) if s.attempt != run.attempt => notes.push(format!(
                "staged for attempt {} but collecting attempt {}",
                s.attempt, run.attempt
            )),
            Some(_) => {}
        }
        Ok(Self {
            dir,
            spec,
            run,
            limits,
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
        let task = self.dir.task();

        let mut base_commit = self.staged.as_ref().and_then(|s| s.base_commit.clone());
        let (mut patch, mut untracked) = (None, None);
        match open_worktree_repo(&self.dir.inbox(), &mut self.notes) {
            Ok(repo) => {
                let base = self.base_tree(&repo, &mut base_commit);
                match self.write_patch(&repo, base.as_ref(), &patch_name(task)) {
                    Ok(summary) => patch = Some(summary),
                    Err(e) => self.notes.push(format!("no patch: {e}")),
                }
                match self.write_untracked(&repo, &untracked_name(task)) {
                    Ok(summary) => untracked = Some(summary),
                    Err(e) => self.notes.push(format!("no untracked list: {e}")),
                }
            }
            Err(why) => self
                .notes
                .push(format!("no patch or untracked list: {why}")),
        }

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
        let run = self.run;
        let metadata = CollectMetadata {
            task_id: task,
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
            base_commit,
            workdir,
            patch,
            untracked,
            artifacts: self.artifacts.clone(),
            skipped: self.skipped,
            skipped_total: self.skipped_total,
            notes: capped_notes(self.notes),
            limits: self.limits.clone(),
        };
        let json = serde_json::to_vec_pretty(&metadata)
            .map_err(|e| WorkerError::Collect(format!("cannot encode {METADATA_NAME}: {e}")))?;
        write_atomic(&self.assembly.join(METADATA_NAME), &json)?;
        let mut artifacts = self.artifacts;
        artifacts.push(ArtifactEntry {
            name: METADATA_NAME.to_string(),
            bytes: json.len() as u64,
        });
        swap_into_place(&self.assembly, &self.dir.artifacts())?;
        Ok(CollectReport {
            artifacts,
            metadata,
        })
    }

    /// The working directory on the host and as the sandbox saw it.
    fn workdir(&self) -> (PathBuf, String) {
        let subpath = match &self.staged {
            Some(s) => s.subpath.clone(),
            None => self
                .spec
                .repository
                .subpath
                .as_deref()
                .unwrap_or("")
                .split('/')
                .filter(|p| !p.is_empty() && *p != "." && *p != "..")
                .collect::<Vec<_>>()
                .join("/"),
        };
        if subpath.is_empty() {
            (self.dir.inbox(), INBOX_MOUNT.to_string())
        } else {
            (
                self.dir.inbox().join(&subpath),
                format!("{INBOX_MOUNT}/{subpath}"),
            )
        }
    }

    /// The tree the patch starts from: the staged base commit, else HEAD, else empty.
    fn base_tree<'r>(
        &mut self,
        repo: &'r Repository,
        base: &mut Option<String>,
    ) -> Option<Tree<'r>> {
        let staged_base = self.staged.is_some();
        if let Some(id) = base.clone() {
            match git2::Oid::from_str(&id).and_then(|oid| repo.find_commit(oid)?.tree()) {
                Ok(tree) => return Some(tree),
                Err(e) => self.notes.push(format!(
                    "base commit {id} unreadable ({}); the patch is relative to HEAD",
                    e.message()
                )),
            }
        } else if staged_base {
            // Staged from an empty repository: everything is new.
            return None;
        }
        match repo.head().and_then(|h| h.peel_to_commit()) {
            Ok(commit) => {
                *base = Some(commit.id().to_string());
                commit.tree().ok()
            }
            Err(_) => {
                *base = None;
                None
            }
        }
    }

    fn write_patch(
        &mut self,
        repo: &Repository,
        base: Option<&Tree<'_>>,
        name: &str,
    ) -> Result<PatchSummary, String> {
        let mut opts = DiffOptions::new();
        opts.show_binary(true)
            .id_abbrev(40)
            .include_untracked(false)
            .ignore_submodules(true);
        let diff = repo
            .diff_tree_to_workdir_with_index(base, Some(&mut opts))
            .map_err(|e| format!("git diff failed: {}", e.message()))?;
        let odb = repo
            .odb()
            .map_err(|e| format!("cannot open the object database: {}", e.message()))?;
        let inbox = self.dir.inbox();
        let budget_total = self.limits.patch_bytes_max;
        let mut out: Vec<u8> = Vec::new();
        let (mut files, mut omitted_total) = (0u64, 0u64);
        let mut omitted = Vec::new();
        let mut omit = |path: String| {
            omitted_total += 1;
            if omitted.len() < SKIPPED_LISTED_MAX {
                omitted.push(path);
            }
        };
        for idx in 0..diff.deltas().len() {
            let Some(delta) = diff.get_delta(idx) else {
                continue;
            };
            let path = delta
                .new_file()
                .path()
                .or(delta.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let remaining = budget_total.saturating_sub(out.len() as u64);
            // Patch generation loads both sides whole: a side larger than the whole budget
            // cannot fit and is refused before it is read.
            let old_bytes = if delta.old_file().id().is_zero() {
                0
            } else {
                odb.read_header(delta.old_file().id())
                    .map(|(size, _)| size as u64)
                    .unwrap_or(0)
            };
            let new_bytes = delta
                .new_file()
                .path()
                .and_then(|p| std::fs::symlink_metadata(inbox.join(p)).ok())
                .map(|m| m.len())
                .unwrap_or(0);
            if old_bytes.max(new_bytes) > budget_total {
                omit(path);
                continue;
            }
            let mut patch = match Patch::from_diff(&diff, idx) {
                Ok(Some(patch)) => patch,
                Ok(None) => continue,
                Err(e) => return Err(format!("cannot diff {path:?}: {}", e.message())),
            };
            let mut text: Vec<u8> = Vec::new();
            let mut over = false;
            let printed = patch.print(&mut |_delta, _hunk, line| {
                let origin = line.origin();
                let prefix = usize::from(matches!(origin, '+' | '-' | ' '));
                if (text.len() + prefix + line.content().len()) as u64 > remaining {
                    over = true;
                    return false;
                }
                if prefix == 1 {
                    text.push(origin as u8);
                }
                text.extend_from_slice(line.content());
                true
            });
            if over {
                omit(path);
                continue;
            }
            printed.map_err(|e| format!("cannot print the patch of {path:?}: {}", e.message()))?;
            out.extend_from_slice(&text);
            files += 1;
        }
        write_atomic(&self.assembly.join(name), &out).map_err(|e| e.to_string())?;
        self.artifacts.push(ArtifactEntry {
            name: name.to_string(),
            bytes: out.len() as u64,
        });
        if omitted_total > 0 {
            self.notes.push(format!(
                "{omitted_total} changed file(s) left out of the patch: it may hold at most {budget_total} bytes"
            ));
        }
        Ok(PatchSummary {
            name: name.to_string(),
            bytes: out.len() as u64,
            files,
            truncated: omitted_total > 0,
            omitted,
            omitted_total,
        })
    }

    fn write_untracked(
        &mut self,
        repo: &Repository,
        name: &str,
    ) -> Result<UntrackedSummary, String> {
        let mut opts = StatusOptions::new();
        opts.include_untracked(true)
            .recurse_untracked_dirs(true)
            .include_ignored(false)
            .exclude_submodules(true);
        let statuses = repo
            .statuses(Some(&mut opts))
            .map_err(|e| format!("git status failed: {}", e.message()))?;
        let mut paths: Vec<String> = statuses
            .iter()
            .filter(|entry| entry.status().contains(Status::WT_NEW))
            .map(|entry| quote_path(entry.path_bytes()))
            .collect();
        paths.sort();
        let truncated = paths.len() > self.limits.untracked_paths_max;
        if truncated {
            self.notes.push(format!(
                "untracked list cut at {} of {} paths",
                self.limits.untracked_paths_max,
                paths.len()
            ));
            paths.truncate(self.limits.untracked_paths_max);
        }
        let mut text = paths.join("\n");
        if !text.is_empty() {
            text.push('\n');
        }
        write_atomic(&self.assembly.join(name), text.as_bytes()).map_err(|e| e.to_string())?;
        self.artifacts.push(ArtifactEntry {
            name: name.to_string(),
            bytes: text.len() as u64,
        });
        Ok(UntrackedSummary {
            name: name.to_string(),
            paths: paths.len() as u64,
            truncated,
        })
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

    /// Walks the working directory (symlinks not followed, `.git` skipped) and copies the
    /// files the patterns match into `files/`. The walk is deterministic — a directory's
    /// files in name order, then its subdirectories in name order — so the caps always keep
    /// the same files.
    fn copy_pattern_matches(&mut self, root: &Path) -> Result<(), WorkerError> {
        let mut patterns = Vec::new();
        for (i, text) in self.spec.lifecycle.artifact_patterns.iter().enumerate() {
            match ArtifactPattern::parse(&format!("lifecycle.artifact_patterns[{i}]"), text) {
                Ok(p) => patterns.push(p),
                Err(e) => self.notes.push(format!("pattern ignored: {e}")),
            }
        }
        if patterns.is_empty() {
            return Ok(());
        }
        let inbox_real = match std::fs::canonicalize(self.dir.inbox()) {
            Ok(path) => path,
            Err(e) => {
                self.notes
                    .push(format!("no pattern artifacts: inbox unreadable: {e}"));
                return Ok(());
            }
        };
        match std::fs::symlink_metadata(root) {
            Ok(meta) if meta.is_dir() => {}
            _ => {
                self.notes.push(
                    "no pattern artifacts: the working directory is gone or not a directory".into(),
                );
                return Ok(());
            }
        }
        // The task's own instructions file, relative to the working directory.
        let task_md = self
            .staged
            .as_ref()
            .map(|s| s.task_md.clone())
            .unwrap_or_else(|| TASK_MD_NAME.to_string());
        let own_file = (root == self.dir.inbox()).then_some(task_md);
        let matches = |rel: &str| patterns.iter().any(|p| p.matches(rel));

        let mut visited = 0usize;
        let mut stack: Vec<(PathBuf, String, usize)> = vec![(root.to_path_buf(), String::new(), 0)];
        while let Some((path, rel_dir, depth)) = stack.pop() {
            let mut entries: Vec<std::fs::DirEntry> = match std::fs::read_dir(&path) {
                Ok(iter) => iter.filter_map(Result::ok).collect(),
                Err(e) => {
                    self.notes.push(format!("cannot list {rel_dir:?}: {e}"));
                    continue;
                }
            };
            entries.sort_by_key(|e| e.file_name());
            let mut subdirs = Vec::new();
            for entry in entries {
                visited += 1;
                if visited > self.limits.walk_entries_max {
                    self.notes.push(format!(
                        "pattern walk stopped after {} entries",
                        self.limits.walk_entries_max
                    ));
                    return Ok(());
                }
                let name = entry.file_name();
                let lossy = name.to_string_lossy().into_owned();
                let rel = if rel_dir.is_empty() {
                    lossy.clone()
                } else {
                    format!("{rel_dir}/{lossy}")
                };
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() {
                    if lossy == ".git" {
                        continue;
                    }
                    if depth + 1 >= WALK_DEPTH_MAX {
                        self.notes.push(format!(
                            "pattern walk did not descend below {rel:?} (depth limit)"
                        ));
                        continue;
                    }
                    subdirs.push((entry.path(), rel, depth + 1));
                    continue;
                }
                if !matches(&rel) || own_file.as_deref() == Some(rel.as_str()) {
                    continue;
                }
                if name.to_str().is_none() {
                    self.skip(&rel, "name is not valid UTF-8");
                } else if kind.is_symlink() {
                    self.skip(&rel, "symbolic link, not followed");
                } else if !kind.is_file() {
                    self.skip(&rel, "not a regular file");
                } else {
                    self.copy_one(&entry.path(), &rel, &inbox_real)?;
                }
            }
            // Reverse so the stack pops them in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    fn copy_one(&mut self, src: &Path, rel: &str, inbox_real: &Path) -> Result<(), WorkerError> {
        let name = format!("{FILES_DIR}/{rel}");
        if name.len() > ARTIFACT_NAME_BYTES_MAX {
            self.skip(
                rel,
                format!("name longer than {ARTIFACT_NAME_BYTES_MAX} bytes"),
            );
            return Ok(());
        }
        if self.copied_files >= self.limits.artifact_files_max {
            self.skip(
                rel,
                format!(
                    "artifact_files_max ({}) reached",
                    self.limits.artifact_files_max
                ),
            );
            return Ok(());
        }
        let file_max = self.limits.artifact_file_bytes_max;
        let room = self
            .limits
            .artifact_total_bytes_max
            .saturating_sub(self.copied_bytes);
        let mut file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(OPEN_NONBLOCK)
            .open(src)
        {
            Ok(file) => file,
            Err(e) => {
                self.skip(rel, format!("cannot open: {e}"));
                return Ok(());
            }
        };
        // What was opened, not what the path named when it was listed: a path swapped for a
        // symbolic link in between would otherwise lead out of the worktree.
        match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            Ok(real) if real.starts_with(inbox_real) => {}
            Ok(_) => {
                self.skip(rel, "resolves outside the worktree");
                return Ok(());
            }
            Err(e) => {
                self.skip(rel, format!("cannot verify where it resolves: {e}"));
                return Ok(());
            }
        }
        let size = match file.metadata() {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => {
                self.skip(rel, "not a regular file");
                return Ok(());
            }
            Err(e) => {
                self.skip(rel, format!("cannot stat: {e}"));
                return Ok(());
            }
        };
        if size > file_max {
            self.skip(
                rel,
                format!("{size} bytes, over artifact_file_bytes_max ({file_max})"),
            );
            return Ok(());
        }
        if size > room {
            self.skip(
                rel,
                format!(
                    "{size} bytes, over the {room} bytes left of artifact_total_bytes_max ({})",
                    self.limits.artifact_total_bytes_max
                ),
            );
            return Ok(());
        }
        let dest = self.assembly.join(FILES_DIR).join(rel);
        if let Some(parent) = dest.parent() {
            std::fs::create_dir_all(parent).map_err(|e| WorkerError::io("creating", parent, e))?;
        }
        let limit = file_max.min(room);
        let copied = (|| -> std::io::Result<u64> {
            let mut out = std::fs::File::create(&dest)?;
            let n = std::io::copy(&mut (&mut file).take(limit + 1), &mut out)?;
            out.flush()?;
            Ok(n)
        })();
        match copied {
            Ok(n) if n <= limit => {
                self.copied_bytes += n;
                self.copied_files += 1;
                self.artifacts.push(ArtifactEntry { name, bytes: n });
            }
            Ok(_) => {
                remove_path(&dest)?;
                self.skip(rel, "grew past the size limits while being copied");
            }
            Err(e) => {
                remove_path(&dest)?;
                self.skip(rel, format!("copy failed: {e}"));
            }
        }
        Ok(())
    }
}

/// Opens the clone in `inbox` as git sees it, refusing the redirections an agent could plant
/// to make the worker read the host's repositories or files: a `.git` that is a link or a
/// gitfile, a `commondir`, linked object directories, alternates. The work tree is pinned to
/// `inbox` whatever `core.worktree` says.
fn open_worktree_repo(inbox: &Path, notes: &mut Vec<String>) -> Result<Repository, String> {
    let git_dir = inbox.join(".git");
    let is_real_dir = |path: &Path| {
        std::fs::symlink_metadata(path)
            .map(|m| m.is_dir())
            .unwrap_or(false)
    };
    if !is_real_dir(&git_dir) {
        return Err(".git is missing or not a plain directory".into());
    }
    for name in ["commondir", "gitdir"] {
        if std::fs::symlink_metadata(git_dir.join(name)).is_ok() {
            return Err(format!(".git/{name} exists; it would point git elsewhere"));
        }
    }
    for name in ["HEAD", "config", "index", "packed-refs", "refs", "objects"] {
        if let Ok(meta) = std::fs::symlink_metadata(git_dir.join(name)) {
            if meta.file_type().is_symlink() {
                return Err(format!(".git/{name} is a symbolic link"));
            }
        }
    }
    // Objects are read through links, so a linked loose object or pack would let the agent
    // name a blob of some other repository on the host and read it back in the patch.
    let objects = git_dir.join("objects");
    let mut checked = 0usize;
    let mut dirs = vec![objects.clone()];
    while let Some(dir) = dirs.pop() {
        let Ok(iter) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in iter {
            checked += 1;
            if checked > GIT_OBJECT_ENTRIES_CHECKED_MAX {
                return Err(format!(
                    ".git/objects holds more than {GIT_OBJECT_ENTRIES_CHECKED_MAX} entries"
                ));
            }
            let entry = entry.map_err(|e| format!("cannot list .git/objects: {e}"))?;
            let kind = entry
                .file_type()
                .map_err(|e| format!("cannot inspect .git/objects: {e}"))?;
            if kind.is_symlink() {
                return Err(format!(
                    ".git/objects holds the symbolic link {:?}",
                    entry.file_name()
                ));
            }
            // Objects live one level down (fan-out, pack, info); deeper is not git's.
            if kind.is_dir() && dir == objects {
                dirs.push(entry.path());
            }
        }
    }
    for name in ["alternates", "http-alternates"] {
        let path = objects.join("info").join(name);
        if std::fs::symlink_metadata(&path).is_ok() {
            std::fs::remove_file(&path).map_err(|e| format!("cannot remove {name}: {e}"))?;
            notes.push(format!(
                "removed .git/objects/info/{name}: objects are read from the clone only"
            ));
        }
    }
    let repo = Repository::open(&git_dir)
        .map_err(|e| format!("cannot open the repository: {}", e.message()))?;
    repo.set_workdir(inbox, false)
        .map_err(|e| format!("cannot pin the work tree: {}", e.message()))?;
    Ok(repo)
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

/// A path for `{id}-untracked.txt`: as is when it is plain UTF-8, else C-quoted like git's
/// `core.quotePath=false` output, so every line is exactly one path.
fn quote_path(bytes: &[u8]) -> String {
    if let Ok(text) = std::str::from_utf8(bytes) {
        if !text
            .chars()
            .any(|c| c.is_control() || c == '"' || c == '\\')
        {
            return text.to_string();
        }
    }
    let mut out = String::from("\"");
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{b:03o}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\{b:03o}"));
        }
    }
    out.push('"');
    out
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
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::task::staging::{stage, StagingOptions};
    use crate::test_support::{
        binary_blob, git, git_output, spec_for, task_dir, write, SourceRepo,
    };

    fn facts(attempt: u32) -> RunFacts {
        RunFacts {
            attempt,
            runtime: RuntimeKind::Process,
            exit_code: Some(0),
            started_at_ms: 1_000,
            finished_at_ms: 4_500,
            stdout_bytes: 10,
            stderr_bytes: 2,
            lines: 3,
            events: 4,
        }
    }

    async fn staged(
        source: &SourceRepo,
        id: u64,
        patterns: &[&str],
    ) -> (tempfile::TempDir, TaskDir, TaskSpec) {
        let (tmp, dir) = task_dir(id);
        let mut spec = spec_for(&source.url());
        spec.lifecycle.artifact_patterns = patterns.iter().map(|p| p.to_string()).collect();
        stage(&dir, dir.task(), 1, &spec, &StagingOptions::default())
            .await
            .unwrap();
        (tmp, dir, spec)
    }

    /// Clones the source into a fresh directory at `commit` and applies `patch` with git.
    fn apply_to_fresh_clone(source: &SourceRepo, commit: &str, patch: &Path) -> tempfile::TempDir {
        let fresh = tempfile::tempdir().unwrap();
        git(fresh.path(), &["clone", "-q", &source.url(), "c"]);
        let clone = fresh.path().join("c");
        git(&clone, &["checkout", "-q", "--detach", commit]);
        let out = git_output(&clone, &["apply", "--check", patch.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        git(&clone, &["apply", patch.to_str().unwrap()]);
        fresh
    }

    fn sizes_on_disk(artifacts: &Path) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        let mut stack = vec![artifacts.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let meta = std::fs::symlink_metadata(entry.path()).unwrap();
                if meta.is_dir() {
                    stack.push(entry.path());
                } else {
                    let rel = entry
                        .path()
                        .strip_prefix(artifacts)
                        .unwrap()
                        .to_str()
                        .unwrap()
                        .to_string();
                    out.insert(rel, meta.len());
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn the_patch_reproduces_every_change_on_a_fresh_clone() {
        let source = SourceRepo::new();
        let (_tmp, dir, spec) = staged(&source, 7, &[]).await;
        let inbox = dir.inbox();
        // What an agent does: edit text and binary files, delete, add with and without
        // `git add`, commit part of it, and leave ignored files around.
        write(
            &inbox.join("README.md"),
            "# Project\n\nchanged by the agent\n",
        );
        let new_blob = binary_blob(9, 6000);
        write(&inbox.join("data.bin"), &new_blob);
        std::fs::remove_file(inbox.join("docs/guide.md")).unwrap();
        write(&inbox.join("added.txt"), "staged new file\n");
        git(&inbox, &["add", "added.txt"]);
        git(&inbox, &["config", "user.name", "Agent"]);
        git(&inbox, &["config", "user.email", "agent@squadron.invalid"]);
        write(
            &inbox.join("src/lib.rs"),
            "pub fn answer() -> u32 {\n    44\n}\n",
        );
        git(
            &inbox,
            &["commit", "-q", "-m", "agent commit", "src/lib.rs"],
        );
        write(&inbox.join("no-newline.txt"), "tail without newline");
        git(&inbox, &["add", "no-newline.txt"]);
        write(&inbox.join("notes/todo.txt"), "untracked\n");
        write(&inbox.join("untracked.bin"), binary_blob(3, 100));
        write(&inbox.join("build.tmp"), "ignored\n");
        write(&inbox.join("ignored/deep/x.txt"), "ignored dir\n");

        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        let artifacts = dir.artifacts();
        let patch_path = artifacts.join("7.patch");
        let patch = std::fs::read_to_string(&patch_path).unwrap();
        assert!(patch.contains("GIT binary patch"), "{patch}");
        assert!(!patch.contains("TASK.md"));
        assert!(!patch.contains("todo.txt") && !patch.contains("build.tmp"));

        let fresh = apply_to_fresh_clone(&source, &source.main_head, &patch_path);
        let clone = fresh.path().join("c");
        let read = |p: &str| std::fs::read(clone.join(p)).unwrap();
        assert_eq!(read("README.md"), b"# Project\n\nchanged by the agent\n");
        assert_eq!(read("data.bin"), new_blob);
        assert_eq!(read("added.txt"), b"staged new file\n");
        assert_eq!(read("no-newline.txt"), b"tail without newline");
        assert_eq!(read("src/lib.rs"), b"pub fn answer() -> u32 {\n    44\n}\n");
        assert!(!clone.join("docs/guide.md").exists());
        assert!(!clone.join("notes/todo.txt").exists());

        let untracked = std::fs::read_to_string(artifacts.join("7-untracked.txt")).unwrap();
        assert_eq!(untracked, "notes/todo.txt\nuntracked.bin\n");

        let meta = &report.metadata;
        let summary = meta.patch.as_ref().unwrap();
        assert_eq!(summary.files, 6);
        assert!(!summary.truncated);
        assert_eq!(summary.bytes, patch.len() as u64);
        assert_eq!(meta.base_commit.as_deref(), Some(source.main_head.as_str()));
        assert_eq!(meta.untracked.as_ref().unwrap().paths, 2);
        assert_eq!(
            report.names(),
            ["7.patch", "7-untracked.txt", "metadata.json"]
        );
        let on_disk = sizes_on_disk(&artifacts);
        let reported: BTreeMap<String, u64> = report
            .artifacts
            .iter()
            .map(|a| (a.name.clone(), a.bytes))
            .collect();
        assert_eq!(on_disk, reported);
    }

    #[tokio::test]
    async fn metadata_records_the_run() {
        let source = SourceRepo::new();
        let (_tmp, dir, spec) = staged(&source, 8, &["*.txt"]).await;
        write(&dir.inbox().join("out.txt"), "result\n");
        let mut run = facts(1);
        run.exit_code = Some(3);
        run.runtime = RuntimeKind::Docker;
        let report = collect(&dir, dir.task(), &spec, &run).await.unwrap();
        let text = std::fs::read_to_string(dir.artifacts().join(METADATA_NAME)).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["task_id"], 8);
        assert_eq!(json["attempt"], 1);
        assert_eq!(json["name"], "Fix the answer");
        assert_eq!(json["runtime"], "docker");
        assert_eq!(json["exit_code"], 3);
        assert_eq!(json["success"], false);
        assert_eq!(json["started_at_ms"], 1_000);
        assert_eq!(json["finished_at_ms"], 4_500);
        assert_eq!(json["duration_ms"], 3_500);
        assert!(json["collected_at_ms"].as_u64().unwrap() > 1_000_000);
        assert_eq!(
            json["stats"],
            serde_json::json!({"stdout_bytes": 10, "stderr_bytes": 2, "lines": 3, "events": 4})
        );
        assert_eq!(json["base_commit"], source.main_head.as_str());
        assert_eq!(json["workdir"], "/mnt/inbox");
        assert_eq!(json["patch"]["name"], "8.patch");
        assert_eq!(json["untracked"]["name"], "8-untracked.txt");
        assert_eq!(json["limits"]["patch_bytes_max"], PATCH_BYTES_MAX);
        let names: Vec<&str> = json["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["8.patch", "8-untracked.txt", "files/out.txt"]);
        assert_eq!(json["artifacts"][2]["bytes"], 7);
        assert_eq!(json["skipped_total"], 0);
        let decoded: CollectMetadata = serde_json::from_str(&text).unwrap();
        assert_eq!(decoded, report.metadata);

        run.exit_code = Some(0);
        let report = collect(&dir, dir.task(), &spec, &run).await.unwrap();
        assert!(report.metadata.success);
        run.exit_code = None;
        let report = collect(&dir, dir.task(), &spec, &run).await.unwrap();
        assert!(!report.metadata.success && report.metadata.exit_code.is_none());
    }

    #[tokio::test]
    async fn patterns_select_files_under_files_dir() {
        let source = SourceRepo::new();
        let patterns = ["*.txt", "reports/*.json", "coverage/**/*", "**/*.log"];
        let (_tmp, dir, spec) = staged(&source, 9, &patterns).await;
        let inbox = dir.inbox();
        for (path, body) in [
            ("top.txt", "top"),
            ("notes/nested.txt", "not top-level"),
            ("reports/a.json", "{}"),
            ("reports/deep/b.json", "{}"),
            ("reports/a.jsonl", ""),
            ("coverage/index.html", "<html>"),
            ("coverage/lcov/x/y.info", "TN:"),
            ("root.log", "r"),
            ("logs/run.log", "l"),
            ("ignored/x.log", "ignored by git, still an artifact"),
            ("metadata.json", "{\"forged\": true}"),
            ("9.patch", "forged patch"),
        ] {
            write(&inbox.join(path), body);
        }
        // Never copied: the task's own instructions and git's internals.
        write(&inbox.join(".git/hooks/x.log"), "inside .git");

        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        let files: Vec<String> = report
            .names()
            .into_iter()
            .filter(|n| n.starts_with("files/"))
            .collect();
        assert_eq!(
            files,
            [
                "files/coverage/index.html",
                "files/coverage/lcov/x/y.info",
                "files/ignored/x.log",
                "files/logs/run.log",
                "files/reports/a.json",
                "files/root.log",
                "files/top.txt",
            ]
        );
        let artifacts = dir.artifacts();
        assert_eq!(
            std::fs::read_to_string(artifacts.join("files/coverage/lcov/x/y.info")).unwrap(),
            "TN:"
        );
        // The worktree's look-alikes do not replace the collector's own files.
        let meta: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(artifacts.join("metadata.json")).unwrap(),
        )
        .unwrap();
        assert_eq!(meta["task_id"], 9);
        assert_ne!(
            std::fs::read_to_string(artifacts.join("9.patch")).unwrap(),
            "forged patch"
        );
        assert!(!artifacts.join("files/TASK.md").exists());
    }

    #[tokio::test]
    async fn patterns_are_relative_to_the_subpath() {
        let source = SourceRepo::new();
        let (tmp, dir) = task_dir(10);
        let mut spec = spec_for(&source.url());
        spec.repository.subpath = Some("packages/auth".into());
        spec.lifecycle.artifact_patterns = vec!["**/*.txt".into()];
        stage(&dir, dir.task(), 1, &spec, &StagingOptions::default())
            .await
            .unwrap();
        write(&dir.inbox().join("packages/auth/out/r.txt"), "r");
        write(&dir.inbox().join("outside-subpath.txt"), "no");
        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        let files: Vec<String> = report
            .names()
            .into_iter()
            .filter(|n| n.starts_with("files/"))
            .collect();
        assert_eq!(files, ["files/mod.txt", "files/out/r.txt"]);
        assert_eq!(report.metadata.workdir, "/mnt/inbox/packages/auth");
        drop(tmp);
    }

    #[tokio::test]
    async fn symlinks_are_never_followed() {
        let source = SourceRepo::new();
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("secret.json"), "host secret");
        write(&outside.path().join("more/secret.txt"), "host secret");
        let (_tmp, dir, spec) = staged(&source, 11, &["**/*"]).await;
        let inbox = dir.inbox();
        std::fs::create_dir_all(inbox.join("reports")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join("secret.json"),
            inbox.join("reports/leak.json"),
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.path(), inbox.join("linked-dir")).unwrap();
        std::os::unix::fs::symlink(inbox.join("README.md"), inbox.join("inner-link.md")).unwrap();

        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        let names = report.names();
        assert!(names.contains(&"files/README.md".to_string()), "{names:?}");
        for name in &names {
            assert!(
                !name.contains("leak")
                    && !name.contains("linked-dir")
                    && !name.contains("inner-link"),
                "{name}"
            );
        }
        let copied = sizes_on_disk(&dir.artifacts());
        assert!(copied.keys().all(|k| !k.contains("secret")), "{copied:?}");
        let skipped: BTreeMap<&str, &str> = report
            .metadata
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert_eq!(
            skipped.get("reports/leak.json"),
            Some(&"symbolic link, not followed")
        );
        assert_eq!(
            skipped.get("inner-link.md"),
            Some(&"symbolic link, not followed")
        );
        assert_eq!(
            skipped.get("linked-dir"),
            Some(&"symbolic link, not followed")
        );
        // The patch shows the links as links, never their targets' content.
        let patch = std::fs::read_to_string(dir.artifacts().join("11.patch")).unwrap();
        assert!(!patch.contains("host secret"));
    }

    #[tokio::test]
    async fn a_hostile_git_directory_cannot_redirect_the_collector() {
        let source = SourceRepo::new();
        let outside = tempfile::tempdir().unwrap();
        write(&outside.path().join("README.md"), "host file\n");
        let (_tmp, dir, spec) = staged(&source, 12, &[]).await;
        let inbox = dir.inbox();
        write(&inbox.join("README.md"), "agent change\n");
        // Point git's work tree at the host, and borrow objects from another repository.
        git(
            &inbox,
            &["config", "core.worktree", outside.path().to_str().unwrap()],
        );
        write(
            &inbox.join(".git/objects/info/alternates"),
            format!("{}/.git/objects\n", source.url()),
        );
        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        let patch = std::fs::read_to_string(dir.artifacts().join("12.patch")).unwrap();
        assert!(patch.contains("+agent change"), "{patch}");
        assert!(!patch.contains("host file"));
        assert!(!inbox.join(".git/objects/info/alternates").exists());
        assert!(
            report
                .metadata
                .notes
                .iter()
                .any(|n| n.contains("alternates")),
            "{:?}",
            report.metadata.notes
        );

        // A .git that is a link (or gitfile) elsewhere: no git outputs, but the rest works.
        let git_dir = inbox.join(".git");
        std::fs::rename(&git_dir, outside.path().join("moved.git")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("moved.git"), &git_dir).unwrap();
        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        assert_eq!(report.names(), ["metadata.json"]);
        assert!(report.metadata.patch.is_none());
        assert!(
            report
                .metadata
                .notes
                .iter()
                .any(|n| n.contains("not a plain directory")),
            "{:?}",
            report.metadata.notes
        );
    }

    #[tokio::test]
    async fn the_patch_cap_leaves_out_whole_files_and_says_so() {
        let source = SourceRepo::new();
        let (_tmp, dir, spec) = staged(&source, 13, &[]).await;
        let inbox = dir.inbox();
        write(&inbox.join("README.md"), "# Project\n\nsmall change\n");
        write(&inbox.join("big.txt"), "line of text\n".repeat(1_000));
        git(&inbox, &["add", "big.txt"]);
        let limits = CollectLimits {
            patch_bytes_max: 2_000,
            ..CollectLimits::default()
        };
        let report = collect_with_limits(&dir, dir.task(), &spec, &facts(1), &limits)
            .await
            .unwrap();
        let summary = report.metadata.patch.clone().unwrap();
        assert!(summary.truncated);
        assert_eq!(summary.omitted, ["big.txt"]);
        assert_eq!(summary.omitted_total, 1);
        assert_eq!(summary.files, 1);
        assert!(summary.bytes <= 2_000);
        assert!(report
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("left out of the patch")));
        // What is in the patch still applies.
        let fresh = apply_to_fresh_clone(
            &source,
            &source.main_head,
            &dir.artifacts().join("13.patch"),
        );
        assert_eq!(
            std::fs::read_to_string(fresh.path().join("c/README.md")).unwrap(),
            "# Project\n\nsmall change\n"
        );
        assert!(!fresh.path().join("c/big.txt").exists());
    }

    #[tokio::test]
    async fn artifact_caps_skip_and_record() {
        let source = SourceRepo::new();
        let (_tmp, dir, spec) = staged(&source, 14, &["out/*"]).await;
        let inbox = dir.inbox();
        write(&inbox.join("out/a-small"), "x".repeat(60));
        write(&inbox.join("out/b-huge"), "x".repeat(500));
        write(&inbox.join("out/c-small"), "x".repeat(60));
        write(&inbox.join("out/d-small"), "x".repeat(60));
        write(&inbox.join("out/e-small"), "x".repeat(10));
        for i in 0..3 {
            write(&inbox.join(format!("untracked-{i}")), "u");
        }
        let limits = CollectLimits {
            artifact_file_bytes_max: 100,
            artifact_total_bytes_max: 150,
            artifact_files_max: 3,
            untracked_paths_max: 2,
            ..CollectLimits::default()
        };
        let report = collect_with_limits(&dir, dir.task(), &spec, &facts(1), &limits)
            .await
            .unwrap();
        let files: Vec<String> = report
            .names()
            .into_iter()
            .filter(|n| n.starts_with("files/"))
            .collect();
        assert_eq!(
            files,
            [
                "files/out/a-small",
                "files/out/c-small",
                "files/out/e-small"
            ]
        );
        let skipped: BTreeMap<&str, &str> = report
            .metadata
            .skipped
            .iter()
            .map(|s| (s.path.as_str(), s.reason.as_str()))
            .collect();
        assert!(
            skipped["out/b-huge"].contains("artifact_file_bytes_max"),
            "{skipped:?}"
        );
        assert!(
            skipped["out/d-small"].contains("artifact_total_bytes_max"),
            "{skipped:?}"
        );
        assert_eq!(report.metadata.skipped_total, 2);
        assert!(!dir.artifacts().join("files/out/b-huge").exists());

        let untracked = report.metadata.untracked.clone().unwrap();
        assert!(untracked.truncated);
        assert_eq!(untracked.paths, 2);
        let list = std::fs::read_to_string(dir.artifacts().join("14-untracked.txt")).unwrap();
        assert_eq!(list.lines().count(), 2);

        // The file-count cap.
        let limits = CollectLimits {
            artifact_files_max: 1,
            ..CollectLimits::default()
        };
        let report = collect_with_limits(&dir, dir.task(), &spec, &facts(1), &limits)
            .await
            .unwrap();
        assert_eq!(report.metadata.skipped_total, 4);
        assert!(report
            .metadata
            .skipped
            .iter()
            .any(|s| s.reason.contains("artifact_files_max")));
    }

    #[tokio::test]
    async fn whatever_the_sandbox_left_in_artifacts_is_replaced() {
        let source = SourceRepo::new();
        let outside = tempfile::tempdir().unwrap();
        let (_tmp, dir, spec) = staged(&source, 15, &["*.txt"]).await;
        write(&dir.inbox().join("r.txt"), "r");
        // A planted link where the collector writes: it must not be written through.
        std::fs::create_dir_all(dir.artifacts()).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.artifacts().join("files")).unwrap();
        write(&dir.artifacts().join("stale"), "old");
        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        assert!(!std::fs::symlink_metadata(dir.artifacts().join("files"))
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!dir.artifacts().join("stale").exists());
        assert!(
            report
                .metadata
                .notes
                .iter()
                .any(|n| n.contains("replaced 2 entries")),
            "{:?}",
            report.metadata.notes
        );
        assert!(!dir.root().join(ASSEMBLY_DIR_NAME).exists());

        // The artifacts directory itself replaced by a link.
        remove_path(&dir.artifacts()).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.artifacts()).unwrap();
        collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        assert!(std::fs::symlink_metadata(dir.artifacts()).unwrap().is_dir());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    }

    #[tokio::test]
    async fn without_a_staging_record_the_patch_is_relative_to_head() {
        let source = SourceRepo::new();
        let (_tmp, dir, spec) = staged(&source, 16, &[]).await;
        std::fs::remove_file(crate::task::staging::staged_marker(&dir)).unwrap();
        write(&dir.inbox().join("README.md"), "edited\n");
        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        assert_eq!(
            report.metadata.base_commit.as_deref(),
            Some(source.main_head.as_str())
        );
        assert!(report
            .metadata
            .notes
            .iter()
            .any(|n| n.contains("no staging record")));
        let patch = std::fs::read_to_string(dir.artifacts().join("16.patch")).unwrap();
        assert!(patch.contains("+edited"));
        let err = collect(&dir, TaskId::new(99).unwrap(), &spec, &facts(1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("task_id"));
    }

    #[tokio::test]
    async fn a_linked_object_keeps_git_out() {
        let source = SourceRepo::new();
        let (_tmp, dir, spec) = staged(&source, 17, &["*.md"]).await;
        let objects = dir.inbox().join(".git/objects/ab");
        std::fs::create_dir_all(&objects).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", objects.join("cdef0123")).unwrap();
        let report = collect(&dir, dir.task(), &spec, &facts(1)).await.unwrap();
        assert!(report.metadata.patch.is_none() && report.metadata.untracked.is_none());
        assert!(
            report
                .metadata
                .notes
                .iter()
                .any(|n| n.contains("symbolic link")),
            "{:?}",
            report.metadata.notes
        );
        // Pattern artifacts do not depend on git.
        assert!(report.names().contains(&"files/README.md".to_string()));
    }

    #[test]
    fn notes_are_capped() {
        let notes: Vec<String> = (0..NOTES_MAX + 10).map(|i| format!("n{i}")).collect();
        let capped = capped_notes(notes);
        assert_eq!(capped.len(), NOTES_MAX);
        assert_eq!(capped.last().unwrap(), "11 more notes not kept");
        assert_eq!(capped_notes(vec!["a".into()]), ["a"]);
    }

    #[test]
    fn untracked_paths_are_one_per_line() {
        assert_eq!(quote_path(b"src/a.rs"), "src/a.rs");
        assert_eq!(quote_path("é/ü.txt".as_bytes()), "é/ü.txt");
        assert_eq!(quote_path(b"a\nb"), "\"a\\nb\"");
        assert_eq!(quote_path(b"q\"\\"), "\"q\\\"\\\\\"");
        assert_eq!(quote_path(b"bad\xffname"), "\"bad\\377name\"");
        assert_eq!(quote_path(b"\x01"), "\"\\001\"");
    }
}
