//! `{id}-untracked.txt`: the new files git does not ignore, one path per line.

use git2::{Repository, Status, StatusOptions};

use super::{ArtifactEntry, Collector, UntrackedSummary};
use crate::support::write_atomic;

impl Collector<'_> {
    pub(super) fn write_untracked(
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
        let paths: Vec<String> = statuses
            .iter()
            .filter(|entry| entry.status().contains(Status::WT_NEW))
            .map(|entry| quote_path(entry.path_bytes()))
            .collect();
        self.write_path_list(paths, name)
    }

    /// `paths`, sorted and bounded, one per line, as the artifact `name`.
    pub(super) fn write_path_list(
        &mut self,
        mut paths: Vec<String>,
        name: &str,
    ) -> Result<UntrackedSummary, String> {
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
}

/// A path for `{id}-untracked.txt`: as is when it is plain UTF-8, else C-quoted like git's
/// `core.quotePath=false` output, so every line is exactly one path.
pub(super) fn quote_path(bytes: &[u8]) -> String {
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
