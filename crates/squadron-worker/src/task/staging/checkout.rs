//! After the clone: the requested branch or commit checked out, and the subpath resolved.

use std::path::Path;

use git2::build::CheckoutBuilder;
use git2::{ErrorCode, Repository};
use squadron_core::manifest::RepositorySpec;

use super::ORIGIN;
use crate::error::WorkerError;

pub(super) fn git_failure(what: &str, e: &git2::Error) -> WorkerError {
    WorkerError::Staging(format!("{what}: {}", e.message()))
}

/// Checks out `repository.branch` (as a local branch tracking origin's) and then
/// `repository.commit` (detached), or leaves the default branch. Returns the commit checked
/// out and the local branch, if any.
pub(super) fn check_out(
    repo: &Repository,
    spec: &RepositorySpec,
) -> Result<(Option<String>, Option<String>), WorkerError> {
    let mut checkout = CheckoutBuilder::new();
    // The clone wrote no files (dry run); every file of the target must be created.
    checkout.force().recreate_missing(true);
    let mut branch_name = None;
    if let Some(branch) = &spec.branch {
        check_out_branch(repo, branch, &mut checkout)?;
        branch_name = Some(branch.clone());
    }
    if let Some(prefix) = &spec.commit {
        let commit = check_out_commit(repo, prefix, spec.branch.as_deref(), &mut checkout)?;
        return Ok((Some(commit), None));
    }
    let head = match repo.head() {
        Ok(head) => head.peel_to_commit().ok().map(|c| c.id().to_string()),
        // An empty repository: HEAD names a branch with no commit yet.
        Err(e) if e.code() == ErrorCode::UnbornBranch => None,
        Err(e) => return Err(git_failure("cannot read HEAD of the clone", &e)),
    };
    if branch_name.is_none() {
        branch_name = repo.find_reference("HEAD").ok().and_then(|h| {
            h.symbolic_target()
                .and_then(|t| t.strip_prefix("refs/heads/"))
                .map(str::to_string)
        });
    }
    Ok((head, branch_name))
}

/// `repository.branch`, checked out as a local branch tracking origin's.
fn check_out_branch(
    repo: &Repository,
    branch: &str,
    checkout: &mut CheckoutBuilder<'_>,
) -> Result<(), WorkerError> {
    let remote_ref = format!("refs/remotes/{ORIGIN}/{branch}");
    let commit = repo
        .find_reference(&remote_ref)
        .and_then(|r| r.peel_to_commit())
        .map_err(|_| {
            WorkerError::Staging(format!(
                "repository.branch: branch {branch:?} does not exist in the repository"
            ))
        })?;
    let local_ref = format!("refs/heads/{branch}");
    let head_is_branch = repo
        .find_reference("HEAD")
        .ok()
        .and_then(|h| h.symbolic_target().map(|t| t == local_ref))
        .unwrap_or(false);
    if !head_is_branch {
        let mut local = repo
            .branch(branch, &commit, true)
            .map_err(|e| git_failure("repository.branch: cannot create the local branch", &e))?;
        local
            .set_upstream(Some(&format!("{ORIGIN}/{branch}")))
            .map_err(|e| git_failure("repository.branch: cannot set the upstream", &e))?;
    }
    repo.checkout_tree(commit.as_object(), Some(checkout))
        .map_err(|e| git_failure("repository.branch: checkout failed", &e))?;
    repo.set_head(&local_ref)
        .map_err(|e| git_failure("repository.branch: cannot move HEAD", &e))
}

/// `repository.commit` (a full or abbreviated id), checked out detached; its full id.
fn check_out_commit(
    repo: &Repository,
    prefix: &str,
    branch: Option<&str>,
    checkout: &mut CheckoutBuilder<'_>,
) -> Result<String, WorkerError> {
    let within = branch
        .map(|b| format!(" (fetched with branch {b:?})"))
        .unwrap_or_default();
    let commit = repo.find_commit_by_prefix(prefix).map_err(|e| {
        WorkerError::Staging(match e.code() {
            ErrorCode::Ambiguous => format!(
                "repository.commit: {prefix:?} is ambiguous in the repository; give more digits"
            ),
            _ => {
                format!("repository.commit: no commit {prefix:?} in the cloned repository{within}")
            }
        })
    })?;
    repo.checkout_tree(commit.as_object(), Some(checkout))
        .map_err(|e| git_failure("repository.commit: checkout failed", &e))?;
    repo.set_head_detached(commit.id())
        .map_err(|e| git_failure("repository.commit: cannot detach HEAD", &e))?;
    Ok(commit.id().to_string())
}

/// Normalises `subpath` and checks it names a real directory of the checkout, reached without
/// symbolic links (a link could lead the working directory out of the repository).
pub(super) fn resolve_subpath(inbox: &Path, subpath: &str) -> Result<String, WorkerError> {
    let bad = |why: String| WorkerError::Staging(format!("repository.subpath {subpath:?} {why}"));
    let parts: Vec<&str> = subpath
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    let mut path = inbox.to_path_buf();
    for part in &parts {
        if *part == ".." || *part == ".git" {
            return Err(bad(format!("must not contain a {part:?} segment")));
        }
        path.push(part);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(bad(format!("goes through the symbolic link {part:?}")));
            }
            Ok(meta) if !meta.is_dir() => {
                return Err(bad("is not a directory in the repository".into()));
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(bad(
                    "does not exist in the repository at the checked-out commit".into(),
                ));
            }
            Err(e) => return Err(WorkerError::io("reading", &path, e)),
        }
    }
    Ok(parts.join("/"))
}
