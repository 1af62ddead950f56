//! Pattern artifacts: the files of the working directory matching
//! `lifecycle.artifact_patterns`, copied into `files/` — symbolic links never followed, every
//! copy checked to lie inside `inbox/` after it is opened, within the copy bounds.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use squadron_core::limits::ARTIFACT_NAME_BYTES_MAX;

use super::artifact_pattern::ArtifactPattern;
use super::{ArtifactEntry, Collector, FILES_DIR, WALK_DEPTH_MAX};
use crate::error::WorkerError;
use crate::support::remove_path;
use crate::task::staging::TASK_MD_NAME;

/// Linux `O_NONBLOCK` (the same value on x86, ARM and RISC-V): opening a file that was
/// swapped for a FIFO after it was inspected must not hang the collector.
const OPEN_NONBLOCK: i32 = 0o4000;

/// What one pattern walk matches against and must not copy.
struct PatternWalk {
    patterns: Vec<ArtifactPattern>,
    /// `inbox/` by its real path: every copied file must resolve inside it.
    inbox_real: PathBuf,
    /// The task's own instructions file, relative to the working directory, when the
    /// working directory is the repository root.
    own_file: Option<String>,
}

/// A directory still to walk: its path, its path relative to the working directory, depth.
type PendingDir = (PathBuf, String, usize);

impl Collector<'_> {
    /// Walks the working directory (symlinks not followed, `.git` skipped) and copies the
    /// files the patterns match into `files/`. The walk is deterministic — a directory's
    /// files in name order, then its subdirectories in name order — so the caps always keep
    /// the same files.
    pub(super) fn copy_pattern_matches(&mut self, root: &Path) -> Result<(), WorkerError> {
        let Some(walk) = self.pattern_walk(root) else {
            return Ok(());
        };
        let mut visited = 0usize;
        let mut stack: Vec<PendingDir> = vec![(root.to_path_buf(), String::new(), 0)];
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
                if let Some(dir) = self.visit(&walk, &entry, &rel_dir, depth)? {
                    subdirs.push(dir);
                }
            }
            // Reverse so the stack pops them in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    /// The patterns to walk with, or `None` (with a note saying why) when there is nothing
    /// to walk.
    fn pattern_walk(&mut self, root: &Path) -> Option<PatternWalk> {
        let mut patterns = Vec::new();
        for (i, text) in self.spec.lifecycle.artifact_patterns.iter().enumerate() {
            match ArtifactPattern::parse(&format!("lifecycle.artifact_patterns[{i}]"), text) {
                Ok(p) => patterns.push(p),
                Err(e) => self.notes.push(format!("pattern ignored: {e}")),
            }
        }
        if patterns.is_empty() {
            return None;
        }
        let inbox_real = match std::fs::canonicalize(&self.work_tree) {
            Ok(path) => path,
            Err(e) => {
                self.notes
                    .push(format!("no pattern artifacts: inbox unreadable: {e}"));
                return None;
            }
        };
        match std::fs::symlink_metadata(root) {
            Ok(meta) if meta.is_dir() => {}
            _ => {
                self.notes.push(
                    "no pattern artifacts: the working directory is gone or not a directory".into(),
                );
                return None;
            }
        }
        let task_md = self
            .staged
            .as_ref()
            .map(|s| s.task_md.clone())
            .unwrap_or_else(|| TASK_MD_NAME.to_string());
        Some(PatternWalk {
            patterns,
            inbox_real,
            own_file: (root == self.work_tree).then_some(task_md),
        })
    }

    /// One entry of the walk: a directory to descend into is returned; a matching file is
    /// copied or skipped with the reason.
    fn visit(
        &mut self,
        walk: &PatternWalk,
        entry: &std::fs::DirEntry,
        rel_dir: &str,
        depth: usize,
    ) -> Result<Option<PendingDir>, WorkerError> {
        let name = entry.file_name();
        let lossy = name.to_string_lossy().into_owned();
        let rel = if rel_dir.is_empty() {
            lossy.clone()
        } else {
            format!("{rel_dir}/{lossy}")
        };
        let Ok(kind) = entry.file_type() else {
            return Ok(None);
        };
        if kind.is_dir() {
            if lossy == ".git" {
                return Ok(None);
            }
            if depth + 1 >= WALK_DEPTH_MAX {
                self.notes.push(format!(
                    "pattern walk did not descend below {rel:?} (depth limit)"
                ));
                return Ok(None);
            }
            return Ok(Some((entry.path(), rel, depth + 1)));
        }
        let matched = walk.patterns.iter().any(|p| p.matches(&rel));
        if !matched || walk.own_file.as_deref() == Some(rel.as_str()) {
            return Ok(None);
        }
        if name.to_str().is_none() {
            self.skip(&rel, "name is not valid UTF-8");
        } else if kind.is_symlink() {
            self.skip(&rel, "symbolic link, not followed");
        } else if !kind.is_file() {
            self.skip(&rel, "not a regular file");
        } else {
            self.copy_one(&entry.path(), &rel, &walk.inbox_real)?;
        }
        Ok(None)
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
        let Some((mut file, size)) = self.open_inside(src, rel, inbox_real) else {
            return Ok(());
        };
        let file_max = self.limits.artifact_file_bytes_max;
        let room = self
            .limits
            .artifact_total_bytes_max
            .saturating_sub(self.copied_bytes);
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

    /// Opens a listed file and checks what was opened: a regular file inside `inbox/`, and
    /// its size. `None` when it is skipped (the reason recorded).
    fn open_inside(&mut self, src: &Path, rel: &str, inbox_real: &Path) -> Option<(File, u64)> {
        let file = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(OPEN_NONBLOCK)
            .open(src)
        {
            Ok(file) => file,
            Err(e) => {
                self.skip(rel, format!("cannot open: {e}"));
                return None;
            }
        };
        // What was opened, not what the path named when it was listed: a path swapped for a
        // symbolic link in between would otherwise lead out of the worktree.
        match std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())) {
            Ok(real) if real.starts_with(inbox_real) => {}
            Ok(_) => {
                self.skip(rel, "resolves outside the worktree");
                return None;
            }
            Err(e) => {
                self.skip(rel, format!("cannot verify where it resolves: {e}"));
                return None;
            }
        }
        match file.metadata() {
            Ok(meta) if meta.is_file() => Some((file, meta.len())),
            Ok(_) => {
                self.skip(rel, "not a regular file");
                None
            }
            Err(e) => {
                self.skip(rel, format!("cannot stat: {e}"));
                None
            }
        }
    }
}
