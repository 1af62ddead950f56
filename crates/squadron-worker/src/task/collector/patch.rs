//! The patch: the working tree against the base commit staging checked out, binary files
//! included; files that would push it past its bound are left out whole and listed.

use std::path::Path;

use git2::{Diff, DiffOptions, Odb, Patch, Repository, Tree};

use super::{ArtifactEntry, Collector, PatchSummary, SKIPPED_LISTED_MAX};
use crate::support::write_atomic;

impl Collector<'_> {
    /// The tree the patch starts from: the staged base commit, else HEAD, else empty.
    pub(super) fn base_tree<'r>(
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

    pub(super) fn write_patch(
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
        self.write_diff(repo, &diff, name)
    }

    /// The patch of `base` → `end`, two trees of the repository.
    pub(super) fn write_tree_patch(
        &mut self,
        repo: &Repository,
        base: &Tree<'_>,
        end: &Tree<'_>,
        name: &str,
    ) -> Result<PatchSummary, String> {
        let mut opts = DiffOptions::new();
        opts.show_binary(true).id_abbrev(40).ignore_submodules(true);
        let diff = repo
            .diff_tree_to_tree(Some(base), Some(end), Some(&mut opts))
            .map_err(|e| format!("git diff failed: {}", e.message()))?;
        self.write_diff(repo, &diff, name)
    }

    /// Writes `diff` as the patch `name`, within the patch budget.
    fn write_diff(
        &mut self,
        repo: &Repository,
        diff: &Diff<'_>,
        name: &str,
    ) -> Result<PatchSummary, String> {
        let odb = repo
            .odb()
            .map_err(|e| format!("cannot open the object database: {}", e.message()))?;
        let inbox = self.work_tree.clone();
        let budget_total = self.limits.patch_bytes_max;
        let mut out: Vec<u8> = Vec::new();
        let mut files = 0u64;
        let mut omitted = Omitted::default();
        for idx in 0..diff.deltas().len() {
            let remaining = budget_total.saturating_sub(out.len() as u64);
            match file_patch(diff, idx, &odb, &inbox, budget_total, remaining)? {
                FilePatch::Nothing => {}
                FilePatch::Omitted(path) => omitted.add(path),
                FilePatch::Text(text) => {
                    out.extend_from_slice(&text);
                    files += 1;
                }
            }
        }
        write_atomic(&self.assembly.join(name), &out).map_err(|e| e.to_string())?;
        self.artifacts.push(ArtifactEntry {
            name: name.to_string(),
            bytes: out.len() as u64,
        });
        if omitted.total > 0 {
            self.notes.push(format!(
                "{} changed file(s) left out of the patch: it may hold at most {budget_total} bytes",
                omitted.total
            ));
        }
        Ok(PatchSummary {
            name: name.to_string(),
            bytes: out.len() as u64,
            files,
            truncated: omitted.total > 0,
            omitted: omitted.listed,
            omitted_total: omitted.total,
        })
    }
}

/// Files left out of the patch: all counted, the first [`SKIPPED_LISTED_MAX`] named.
#[derive(Default)]
struct Omitted {
    listed: Vec<String>,
    total: u64,
}

impl Omitted {
    fn add(&mut self, path: String) {
        self.total += 1;
        if self.listed.len() < SKIPPED_LISTED_MAX {
            self.listed.push(path);
        }
    }
}

/// One file's part of the patch.
enum FilePatch {
    /// No change to show.
    Nothing,
    /// Too large for the room left (or for the whole budget): left out whole.
    Omitted(String),
    Text(Vec<u8>),
}

/// The patch of delta `idx`, if it fits in `remaining` bytes.
fn file_patch(
    diff: &Diff<'_>,
    idx: usize,
    odb: &Odb<'_>,
    inbox: &Path,
    budget_total: u64,
    remaining: u64,
) -> Result<FilePatch, String> {
    let Some(delta) = diff.get_delta(idx) else {
        return Ok(FilePatch::Nothing);
    };
    let path = delta
        .new_file()
        .path()
        .or(delta.old_file().path())
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
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
        return Ok(FilePatch::Omitted(path));
    }
    let mut patch = match Patch::from_diff(diff, idx) {
        Ok(Some(patch)) => patch,
        Ok(None) => return Ok(FilePatch::Nothing),
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
        return Ok(FilePatch::Omitted(path));
    }
    printed.map_err(|e| format!("cannot print the patch of {path:?}: {}", e.message()))?;
    Ok(FilePatch::Text(text))
}
