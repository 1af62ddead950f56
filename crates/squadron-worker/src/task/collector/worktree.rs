//! A `placement: project` task works in its profile's worktree, which earlier generations of
//! the profile may have left with uncommitted changes and new files. Its patch is therefore
//! the work tree as the task left it against the work tree as the task found it: both are
//! snapshots — every file git tracks or would add (ignored ones left out), written as a tree
//! to the project's object database — taken by the worker with nothing of the profile running.
//!
//! The worktree is hostile input as a clone is (see the module above), and its `.git` file
//! is the provider's to rewrite: git is opened through the worktree's administrative
//! directory in `repo/.git/worktrees/{key}` instead, which only the worker writes, and the
//! work tree is pinned. Snapshots go through a scratch index of their own (a copy of the
//! worktree's, for its stat cache), so the worktree's real index is never written.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use git2::{Delta, IndexAddOption, IndexEntry, Oid, Repository, Tree};
use serde::{Deserialize, Serialize};

use super::git_guard::remove_special_files;
use super::untracked::quote_path;
use super::{patch_name, untracked_name, Collector, GitOutputs};
use crate::support::remove_path;

/// A profile's worktree and the snapshot a task started from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProfileWorktree {
    /// The work tree on the host.
    pub(crate) worktree: PathBuf,
    /// Its administrative directory, `repo/.git/worktrees/{key}`.
    pub(crate) admin: PathBuf,
    /// The snapshot taken before the task started.
    pub(crate) base: WorktreeSnapshot,
}

/// The work tree at one moment: its files as a tree, and the commit it had checked out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WorktreeSnapshot {
    pub(crate) tree: String,
    /// `None` for a branch without commits.
    pub(crate) head: Option<String>,
}

/// Opens the worktree through its administrative directory, the work tree pinned.
pub(crate) fn open_profile_worktree(admin: &Path, worktree: &Path) -> Result<Repository, String> {
    let repo = Repository::open(admin)
        .map_err(|e| format!("cannot open the profile's worktree: {}", e.message()))?;
    repo.set_workdir(worktree, false)
        .map_err(|e| format!("cannot pin the work tree: {}", e.message()))?;
    Ok(repo)
}

/// Snapshots the worktree (see the module documentation), with `scratch` as the scratch
/// index's path; FIFOs, sockets and device nodes are removed from the work tree first.
pub(crate) fn snapshot_worktree(
    admin: &Path,
    worktree: &Path,
    scratch: &Path,
    notes: &mut Vec<String>,
) -> Result<WorktreeSnapshot, String> {
    remove_special_files(worktree, notes)?;
    let repo = open_profile_worktree(admin, worktree)?;
    let tree = snapshot_tree(&repo, admin, worktree, scratch)?;
    let head = repo
        .head()
        .ok()
        .and_then(|h| h.peel_to_commit().ok())
        .map(|c| c.id().to_string());
    Ok(WorktreeSnapshot {
        tree: tree.to_string(),
        head,
    })
}

/// The work tree's files as a tree written to `repo`, through a scratch index at `scratch`.
/// Directories are never added as such: one holding a `.git` would be added as a submodule,
/// which git opens — wherever its `.git` points — to read its HEAD.
fn snapshot_tree(
    repo: &Repository,
    admin: &Path,
    worktree: &Path,
    scratch: &Path,
) -> Result<Oid, String> {
    let failed = |what: &str, e: git2::Error| format!("cannot {what}: {}", e.message());
    remove_path(scratch).map_err(|e| e.to_string())?;
    let real = admin.join("index");
    let copied = match std::fs::symlink_metadata(&real) {
        Ok(meta) if meta.is_file() => {
            std::fs::copy(&real, scratch).map_err(|e| format!("cannot copy the index: {e}"))?;
            true
        }
        _ => false,
    };
    let result = (|| {
        let mut index = git2::Index::open(scratch).map_err(|e| failed("open an index", e))?;
        // The index belongs to the repository from here on: `add_all` needs an owner.
        repo.set_index(&mut index)
            .map_err(|e| failed("use the scratch index", e))?;
        if !copied {
            if let Ok(tree) = repo.head().and_then(|h| h.peel_to_tree()) {
                index.read_tree(&tree).map_err(|e| failed("read HEAD", e))?;
            }
        }
        // Submodules out while the work tree is read: git would open each one's `.git` —
        // wherever a gitfile the provider wrote there points — for its status. They go back
        // as they were: a task does not move a submodule.
        let gitlinks: Vec<IndexEntry> = index.iter().filter(|e| e.mode == GITLINK_MODE).collect();
        for entry in &gitlinks {
            index
                .remove_path(Path::new(OsStr::from_bytes(&entry.path)))
                .map_err(|e| failed("set a submodule aside", e))?;
        }
        let mut files_only = |path: &Path, _: &[u8]| -> i32 {
            let dir_delta = path.as_os_str().as_bytes().ends_with(b"/");
            let is_dir = std::fs::symlink_metadata(worktree.join(path)).is_ok_and(|m| m.is_dir());
            i32::from(dir_delta || is_dir)
        };
        index
            .add_all(["*"], IndexAddOption::DEFAULT, Some(&mut files_only))
            .map_err(|e| failed("add the work tree", e))?;
        index
            .update_all(["*"], Some(&mut files_only))
            .map_err(|e| failed("note removed files", e))?;
        for entry in &gitlinks {
            index
                .add(entry)
                .map_err(|e| failed("put a submodule back", e))?;
        }
        index.write_tree().map_err(|e| failed("write the tree", e))
    })();
    remove_path(scratch).map_err(|e| e.to_string())?;
    result
}

impl Collector<'_> {
    /// The patch (base snapshot → the work tree now) and the untracked list of a profile's
    /// worktree.
    pub(super) fn worktree_outputs(&mut self, w: &ProfileWorktree) -> GitOutputs {
        let task = self.dir.task();
        let mut out = GitOutputs {
            base_commit: w.base.head.clone(),
            patch: None,
            untracked: None,
        };
        let scratch = self.dir.root().join(SCRATCH_INDEX_NAME);
        let end = match snapshot_worktree(&w.admin, &w.worktree, &scratch, &mut self.notes) {
            Ok(end) => end,
            Err(why) => {
                self.notes
                    .push(format!("no patch or untracked list: {why}"));
                return out;
            }
        };
        let repo = match open_profile_worktree(&w.admin, &w.worktree) {
            Ok(repo) => repo,
            Err(why) => {
                self.notes
                    .push(format!("no patch or untracked list: {why}"));
                return out;
            }
        };
        self.notes.push(format!(
            "the patch is the profile's worktree as the task left it against the worktree as \
             it found it (tree {}), uncommitted changes of earlier work excluded",
            w.base.tree
        ));
        let tree = |id: &str| {
            Oid::from_str(id)
                .and_then(|oid| repo.find_tree(oid))
                .map_err(|e| format!("snapshot {id} unreadable: {}", e.message()))
        };
        let (base, end) = match tree(&w.base.tree).and_then(|base| Ok((base, tree(&end.tree)?))) {
            Ok(trees) => trees,
            Err(e) => {
                self.notes.push(format!("no patch or untracked list: {e}"));
                return out;
            }
        };
        match self.write_tree_patch(&repo, &base, &end, &patch_name(task)) {
            Ok(summary) => out.patch = Some(summary),
            Err(e) => self.notes.push(format!("no patch: {e}")),
        }
        // The new files are the task's: those the base snapshot lacks.
        let listed = added_paths(&repo, &base, &end)
            .and_then(|paths| self.write_path_list(paths, &untracked_name(task)));
        match listed {
            Ok(summary) => out.untracked = Some(summary),
            Err(e) => self.notes.push(format!("no untracked list: {e}")),
        }
        out
    }
}

/// The paths `end` has and `base` lacks.
fn added_paths(repo: &Repository, base: &Tree<'_>, end: &Tree<'_>) -> Result<Vec<String>, String> {
    let diff = repo
        .diff_tree_to_tree(Some(base), Some(end), None)
        .map_err(|e| format!("git diff failed: {}", e.message()))?;
    Ok(diff
        .deltas()
        .filter(|d| d.status() == Delta::Added)
        .filter_map(|d| d.new_file().path_bytes().map(quote_path))
        .collect())
}

/// The mode of a submodule's entry (a commit of another repository).
const GITLINK_MODE: u32 = 0o160_000;

/// The scratch index of a snapshot, in the task's root (never mounted in a sandbox).
pub(crate) const SCRATCH_INDEX_NAME: &str = ".snapshot.index";
