//! `TASK.md`: the instructions the agent finds in its checkout, kept out of git.

use std::path::Path;

use git2::Repository;
use squadron_core::manifest::TaskSpec;

use super::checkout::git_failure;
use super::{TASK_MD_BYTES_MAX, TASK_MD_FALLBACK_NAME, TASK_MD_NAME};
use crate::error::WorkerError;
use crate::support::{truncate_at_char, write_atomic};
use crate::task::task_dir::INBOX_MOUNT;

/// `TASK.md`, unless the checkout tracks a file or directory of that name.
pub(super) fn task_md_name(repo: &Repository) -> Result<String, WorkerError> {
    let index = repo
        .index()
        .map_err(|e| git_failure("cannot read the index of the clone", &e))?;
    let tracked = |name: &str| {
        index.get_path(Path::new(name), 0).is_some()
            || index
                .iter()
                .any(|entry| entry.path.starts_with(format!("{name}/").as_bytes()))
    };
    for name in [TASK_MD_NAME, TASK_MD_FALLBACK_NAME] {
        if !tracked(name) {
            return Ok(name.to_string());
        }
    }
    Err(WorkerError::Staging(format!(
        "the repository tracks both {TASK_MD_NAME} and {TASK_MD_FALLBACK_NAME}; \
         there is no place for the task instructions"
    )))
}

/// The instructions the agent finds in its checkout.
pub(super) fn task_md_text(spec: &TaskSpec, workdir: &str, base: Option<&str>) -> String {
    let mut patterns = String::new();
    if spec.lifecycle.artifact_patterns.is_empty() {
        patterns.push_str("- No artifact patterns are set; only the git changes are collected.\n");
    } else {
        patterns.push_str(
            "- Files matching these patterns (relative to the working directory) are copied \
             as artifacts, ignored files included:\n",
        );
        for pattern in &spec.lifecycle.artifact_patterns {
            patterns.push_str(&format!("  - `{pattern}`\n"));
        }
    }
    let base = base
        .map(|b| format!(" (base commit `{b}`)"))
        .unwrap_or_default();
    let instructions = format!(
        "\n## Instructions\n\n\
         - Work in `{workdir}`; the repository is checked out at `{INBOX_MOUNT}`{base}.\n\
         - When you exit, your changes are collected from git: the diff of the working tree \
         against the base commit (committed, staged and unstaged changes, binary files \
         included) and the list of new untracked files. Files ignored by `.gitignore` are \
         not in the diff.\n\
         {patterns}\
         - This file is excluded from git and never part of the diff.\n"
    );
    let title = format!("# {}\n\n## Task\n\n", spec.name);
    let room = TASK_MD_BYTES_MAX.saturating_sub(title.len() + instructions.len() + 128);
    let prompt = truncate_at_char(&spec.agent.prompt, room);
    let cut = if prompt.len() < spec.agent.prompt.len() {
        "\n\n(The prompt is cut here; it is given whole on standard input.)"
    } else {
        ""
    };
    format!("{title}{}{cut}\n{instructions}", prompt.trim_end())
}

/// Adds `/{name}` to `.git/info/exclude`, once.
pub(super) fn exclude_from_git(repo: &Repository, name: &str) -> Result<(), WorkerError> {
    let info = repo.path().join("info");
    std::fs::create_dir_all(&info).map_err(|e| WorkerError::io("creating", &info, e))?;
    let path = info.join("exclude");
    let line = format!("/{name}");
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(WorkerError::io("reading", &path, e)),
    };
    if existing.lines().any(|l| l.trim() == line) {
        return Ok(());
    }
    let mut text = existing;
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(&line);
    text.push('\n');
    write_atomic(&path, text.as_bytes())
}
