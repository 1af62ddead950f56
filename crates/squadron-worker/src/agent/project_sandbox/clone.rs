//! The sandbox's one clone: bare, into `repo/.git`, appearing only complete; and the commit
//! every profile branch starts from.

use std::cell::Cell;
use std::fs;
use std::path::Path;

use git2::build::{CloneLocal, RepoBuilder};
use git2::{FetchOptions, RemoteCallbacks, Repository};

use super::{git_error, invalid, project_error, unique_sibling, CLONING_DIR_NAME, ORIGIN};
use crate::error::WorkerError;
use crate::support::remove_path;
use crate::task::staging::{redact_url, CLONE_BYTES_MAX_DEFAULT};

pub(super) fn open_bare(git_dir: &Path) -> Result<Repository, WorkerError> {
    Repository::open_bare(git_dir).map_err(|e| git_error("opening repo/.git", &e))
}

/// Clones `url` bare into a fresh directory beside the sandbox and renames it to `git_dir`,
/// so `repo/.git` only ever appears complete.
pub(super) fn clone_bare(url: &str, root: &Path, git_dir: &Path) -> Result<(), WorkerError> {
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
pub(super) fn resolve_base(repo: &Repository, branch: Option<&str>) -> Result<String, WorkerError> {
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
