//! STAGING: prepare a task's directory before any sandbox exists — the layout of `task_dir`,
//! `manifest.yaml`, the repository cloned into `inbox/` at the requested branch or commit,
//! `TASK.md`, and empty progress files.
//!
//! Staging is idempotent for recovery. Its last step writes `run/staged`, a JSON copy of the
//! [`StagingReport`]; a second call for the same attempt finds it and returns that report
//! without touching anything. A call for another attempt, or after a crash before the marker,
//! starts over: every clone try begins from an empty `inbox/`.
//!
//! The clone honours `lifecycle.retries.clone`: one event line per failed try in
//! `events.jsonl`, the policy's backoff between tries. Failures after the clone (unknown
//! branch or commit, missing subpath) are permanent and not retried. No error or event ever
//! carries `repository.url`: it is replaced by `<repository.url>` in git's messages.
//!
//! The clone runs in a blocking thread. When the caller drops the returned future (its stage
//! timeout fired), the thread notices at git's next progress report and aborts.

use std::cell::Cell;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use git2::build::{CheckoutBuilder, CloneLocal, RepoBuilder};
use git2::{ErrorCode, FetchOptions, RemoteCallbacks, Repository};
use serde::{Deserialize, Serialize};
use squadron_core::ids::TaskId;
use squadron_core::manifest::{RepositorySpec, TaskSpec};

use crate::error::WorkerError;
use crate::support::{now_ms, remove_path, truncate_at_char, write_atomic};
use crate::task::task_dir::{TaskDir, INBOX_MOUNT};

/// The instructions file written at the root of the clone.
pub(crate) const TASK_MD_NAME: &str = "TASK.md";
/// Used instead of [`TASK_MD_NAME`] when the repository itself tracks a `TASK.md`, so the
/// agent's patch never shows the worker's instructions overwriting the project's file.
pub(crate) const TASK_MD_FALLBACK_NAME: &str = "SQUADRON_TASK.md";
/// Largest `TASK.md`; a longer prompt is cut there (the provider gets it whole on stdin).
pub(crate) const TASK_MD_BYTES_MAX: usize = 320 * 1024;
/// Bytes a clone may download unless [`StagingOptions::clone_bytes_max`] says otherwise.
/// Local-path clones copy objects without progress reports and are not metered.
pub(crate) const CLONE_BYTES_MAX_DEFAULT: u64 = 16 << 30;
/// Longest git error message kept in an event line or error.
pub(crate) const CLONE_ERROR_BYTES_MAX: usize = 1_024;
/// Largest `run/staged` marker read back; anything bigger is not ours and means restage.
const STAGED_MARKER_BYTES_MAX: u64 = 64 * 1024;
/// The file, in `run/`, whose presence means staging of an attempt finished.
pub(crate) const STAGED_MARKER_NAME: &str = "staged";
/// The remote name of the clone; branches are looked up under `refs/remotes/{ORIGIN}/`.
const ORIGIN: &str = "origin";
/// Clone tries write to `{task root}/{CLONING_DIR_PREFIX}{pid}.{n}`, renamed to `inbox/`.
const CLONING_DIR_PREFIX: &str = ".inbox.cloning.";
/// Stands in for the repository URL in every message.
const URL_PLACEHOLDER: &str = "<repository.url>";

/// Knobs the worker's configuration (or a test) sets; the task's own policy comes from its spec.
#[derive(Debug, Clone)]
pub(crate) struct StagingOptions {
    /// Replaces every delay of `lifecycle.retries.clone.backoff` when set (tests, operators
    /// draining a queue); the number of retries still comes from the spec.
    pub(crate) backoff_override_ms: Option<u64>,
    /// Bytes a clone may download before it is aborted as too large (not retried).
    pub(crate) clone_bytes_max: u64,
}

impl Default for StagingOptions {
    fn default() -> Self {
        Self {
            backoff_override_ms: None,
            clone_bytes_max: CLONE_BYTES_MAX_DEFAULT,
        }
    }
}

/// What staging produced; also stored as `run/staged`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StagingReport {
    pub(crate) task: TaskId,
    pub(crate) attempt: u32,
    /// The commit checked out: the base the collector diffs against. `None` only for an empty
    /// repository with no commit at all.
    pub(crate) base_commit: Option<String>,
    /// The local branch checked out; `None` when detached at `repository.commit`.
    pub(crate) branch: Option<String>,
    /// The agent's working directory inside the sandbox: `/mnt/inbox` or
    /// `/mnt/inbox/<subpath>` (normalised: no `.` or empty segments).
    pub(crate) workdir: String,
    /// `repository.subpath`, normalised; empty for the repository root.
    pub(crate) subpath: String,
    /// The instructions file at the root of the clone: [`TASK_MD_NAME`] or, when the
    /// repository tracks one, [`TASK_MD_FALLBACK_NAME`].
    pub(crate) task_md: String,
    /// Clone tries it took, the successful one included.
    pub(crate) clone_attempts: u32,
    pub(crate) staged_at_ms: u64,
}

impl StagingReport {
    /// The report of a finished staging of this task directory, if there is one. A marker
    /// that is unreadable or malformed counts as absent (the caller then stages again).
    pub(crate) fn load(dir: &TaskDir) -> Result<Option<StagingReport>, WorkerError> {
        let path = staged_marker(dir);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(WorkerError::io("reading", path, e)),
        };
        if !meta.is_file() || meta.len() > STAGED_MARKER_BYTES_MAX {
            return Ok(None);
        }
        let bytes = std::fs::read(&path).map_err(|e| WorkerError::io("reading", &path, e))?;
        Ok(serde_json::from_slice(&bytes).ok())
    }

    #[cfg(test)]
    /// The agent's working directory on the worker's side.
    pub(crate) fn workdir_host(&self, dir: &TaskDir) -> PathBuf {
        if self.subpath.is_empty() {
            dir.inbox()
        } else {
            dir.inbox().join(&self.subpath)
        }
    }
}

/// `run/staged` of a task directory.
pub(crate) fn staged_marker(dir: &TaskDir) -> PathBuf {
    dir.run().join(STAGED_MARKER_NAME)
}

/// Stages attempt `attempt` of `task` into `dir` (see the module documentation).
pub(crate) async fn stage(
    dir: &TaskDir,
    task: TaskId,
    attempt: u32,
    spec: &TaskSpec,
    opts: &StagingOptions,
) -> Result<StagingReport, WorkerError> {
    if dir.task() != task {
        return Err(WorkerError::Invalid {
            field: "task_id".into(),
            message: format!(
                "task {task} does not own task directory {}",
                dir.root().display()
            ),
        });
    }
    spec.validate().map_err(|e| WorkerError::Invalid {
        field: e.field,
        message: e.reason,
    })?;

    let prepared = {
        let (dir, spec) = (dir.clone(), spec.clone());
        blocking(move || prepare(&dir, task, attempt, &spec)).await??
    };
    if let Some(report) = prepared {
        return Ok(report);
    }

    let clone_attempts = clone_with_retries(dir, spec, opts).await?;

    let (dir, spec) = (dir.clone(), spec.clone());
    blocking(move || finish(&dir, task, attempt, &spec, clone_attempts)).await?
}

/// Runs blocking file-system and git work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, WorkerError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| WorkerError::Staging(format!("staging thread failed: {e}")))
}

/// Returns the finished report when this attempt already staged; otherwise clears what a
/// previous attempt left and lays out the directory.
fn prepare(
    dir: &TaskDir,
    task: TaskId,
    attempt: u32,
    spec: &TaskSpec,
) -> Result<Option<StagingReport>, WorkerError> {
    match StagingReport::load(dir)? {
        Some(report) if report.task == task && report.attempt == attempt => {
            return Ok(Some(report));
        }
        Some(_) => {
            // Another attempt's clone may hold the last agent's edits and its outbox that
            // agent's output; a new attempt starts from the repository again.
            for path in [dir.run(), dir.inbox(), dir.outbox()] {
                remove_path(&path)?;
            }
        }
        None => {}
    }
    for path in [dir.run(), dir.progress(), dir.artifacts()] {
        std::fs::create_dir_all(&path).map_err(|e| WorkerError::io("creating", &path, e))?;
    }
    // Clone tries a crashed worker left behind.
    let root = dir.root();
    let entries = std::fs::read_dir(root).map_err(|e| WorkerError::io("listing", root, e))?;
    for entry in entries.filter_map(Result::ok) {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(CLONING_DIR_PREFIX))
        {
            remove_path(&entry.path())?;
        }
    }
    for path in [dir.stdout_log(), dir.stderr_log(), dir.events()] {
        // Append mode: a restaged attempt keeps the events of its earlier tries.
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| WorkerError::io("creating", &path, e))?;
    }
    let yaml = serde_yaml::to_string(spec)
        .map_err(|e| WorkerError::Staging(format!("cannot encode manifest.yaml: {e}")))?;
    write_atomic(&dir.manifest(), yaml.as_bytes())?;
    Ok(None)
}

/// Why one clone try failed.
enum CloneFailure {
    /// Worth another try (network, remote, transient file-system trouble).
    Transient(String),
    /// Would fail the same way again.
    Permanent(WorkerError),
}

/// Sets the flag when dropped, so a clone thread outliving its caller stops.
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Clones `repository.url` into `inbox/`, retrying per `lifecycle.retries.clone`. Returns the
/// number of tries.
async fn clone_with_retries(
    dir: &TaskDir,
    spec: &TaskSpec,
    opts: &StagingOptions,
) -> Result<u32, WorkerError> {
    let retry = &spec.lifecycle.retries.clone;
    let tries = retry.max.saturating_add(1);
    let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
    let url = spec.repository.url.clone();
    let own_checkout = spec.repository.branch.is_some() || spec.repository.commit.is_some();
    for try_number in 1..=tries {
        let outcome = {
            let (inbox, url, flag) = (dir.inbox(), url.clone(), cancel.0.clone());
            let bytes_max = opts.clone_bytes_max;
            blocking(move || clone_once(&url, &inbox, own_checkout, &flag, bytes_max)).await?
        };
        let message = match outcome {
            Ok(()) => return Ok(try_number),
            Err(CloneFailure::Permanent(err)) => {
                remove_path(&dir.inbox())?;
                return Err(err);
            }
            Err(CloneFailure::Transient(message)) => message,
        };
        let retry_in_ms = (try_number < tries).then(|| {
            opts.backoff_override_ms
                .unwrap_or(retry.delay_ms(try_number))
        });
        append_event(
            &dir.events(),
            &serde_json::json!({
                "ts_ms": now_ms(),
                "event": "clone_retry",
                "attempt": try_number,
                "error": message,
                "retry_in_ms": retry_in_ms,
            }),
        )?;
        match retry_in_ms {
            Some(delay) => tokio::time::sleep(std::time::Duration::from_millis(delay)).await,
            None => {
                remove_path(&dir.inbox())?;
                return Err(WorkerError::Staging(format!(
                    "repository.url: clone failed after {tries} attempt(s): {message}"
                )));
            }
        }
    }
    Err(WorkerError::Staging(
        "repository.url: no clone attempt was made".into(),
    ))
}

/// One clone try into a fresh `inbox`. With `own_checkout` the files are not written: the
/// caller checks out the requested branch or commit, so the default branch is not written
/// first only to be replaced.
fn clone_once(
    url: &str,
    inbox: &Path,
    own_checkout: bool,
    cancel: &AtomicBool,
    bytes_max: u64,
) -> Result<(), CloneFailure> {
    remove_path(inbox).map_err(CloneFailure::Permanent)?;
    // libgit2 reports a missing local path as an "unsupported URL protocol"; say what it is.
    let local = url.strip_prefix("file://").unwrap_or(url);
    if local.starts_with('/') && std::fs::symlink_metadata(local).is_err() {
        return Err(CloneFailure::Transient(format!(
            "no repository at {URL_PLACEHOLDER}: the local path does not exist"
        )));
    }
    let too_large = Cell::new(false);
    let mut callbacks = RemoteCallbacks::new();
    callbacks.transfer_progress(|progress| {
        if u64::try_from(progress.received_bytes()).unwrap_or(u64::MAX) > bytes_max {
            too_large.set(true);
            return false;
        }
        !cancel.load(Ordering::Relaxed)
    });
    let mut fetch = FetchOptions::new();
    fetch.remote_callbacks(callbacks);
    let mut builder = RepoBuilder::new();
    builder.fetch_options(fetch);
    // A plain path would otherwise be cloned by hard-linking the source's object files, which
    // an agent with full control of the inbox could then rewrite in place. `file://` keeps
    // git's own meaning: the regular transport.
    builder.clone_local(if url.starts_with("file://") {
        CloneLocal::None
    } else {
        CloneLocal::NoLinks
    });
    if own_checkout {
        let mut checkout = CheckoutBuilder::new();
        checkout.dry_run();
        builder.with_checkout(checkout);
    }
    let cloning = cloning_dir(inbox);
    let cloned = builder.clone(url, &cloning);
    drop(builder);
    let outcome = match cloned {
        Ok(_) if cancel.load(Ordering::Relaxed) => {
            Err(CloneFailure::Transient("staging was cancelled".into()))
        }
        Ok(_) => std::fs::rename(&cloning, inbox)
            .map_err(|e| CloneFailure::Permanent(WorkerError::io("moving the clone to", inbox, e))),
        Err(_) if too_large.get() => Err(CloneFailure::Permanent(WorkerError::Staging(format!(
            "repository.url: clone aborted after downloading more than {bytes_max} bytes"
        )))),
        Err(e) => Err(CloneFailure::Transient(redact_url(e.message(), url))),
    };
    if outcome.is_err() {
        // Best effort: the next try or the next staging removes leftovers too.
        let _ = remove_path(&cloning);
    }
    outcome
}

/// A directory of its own for one clone try, beside `inbox/`. A try abandoned by a caller's
/// timeout may still be winding down when the next begins; it never writes into the next
/// one's clone, and `inbox/` only ever appears complete (renamed in at the end).
fn cloning_dir(inbox: &Path) -> PathBuf {
    static TRIES: AtomicU64 = AtomicU64::new(0);
    let n = TRIES.fetch_add(1, Ordering::Relaxed);
    inbox.with_file_name(format!("{CLONING_DIR_PREFIX}{}.{n}", std::process::id()))
}

/// Replaces every spelling of `url` in a git message, and any `user:password@` left in a URL
/// git may have rebuilt, so messages can be logged and stored.
pub(crate) fn redact_url(message: &str, url: &str) -> String {
    let mut needles = vec![url.to_string()];
    if let Some(path) = url.strip_prefix("file://") {
        needles.push(path.to_string());
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        if let Some((userinfo, host_path)) = rest.split_once('@') {
            if !userinfo.contains('/') {
                needles.push(format!("{scheme}://{host_path}"));
                needles.push(host_path.to_string());
            }
        }
    }
    let trimmed: Vec<String> = needles
        .iter()
        .filter_map(|n| n.strip_suffix('/').map(str::to_string))
        .collect();
    needles.extend(trimmed);
    needles.retain(|n| n.len() >= 2);
    needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
    let mut out = message.to_string();
    for needle in &needles {
        out = out.replace(needle.as_str(), URL_PLACEHOLDER);
    }
    truncate_at_char(&scrub_userinfo(&out), CLONE_ERROR_BYTES_MAX).to_string()
}

/// Blanks the user information of every `scheme://user:secret@host` in `text`.
fn scrub_userinfo(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let (head, tail) = rest.split_at(at + 3);
        out.push_str(head);
        let authority_end = tail
            .find(|c: char| c == '/' || c.is_whitespace() || c == '\'' || c == '"')
            .unwrap_or(tail.len());
        match tail[..authority_end].rfind('@') {
            Some(userinfo_end) => {
                out.push_str("***");
                rest = &tail[userinfo_end..];
            }
            None => rest = tail,
        }
    }
    out.push_str(rest);
    out
}

/// After the clone: check out the branch or commit, check the subpath, write `TASK.md`,
/// exclude it from git, and record the marker.
fn finish(
    dir: &TaskDir,
    task: TaskId,
    attempt: u32,
    spec: &TaskSpec,
    clone_attempts: u32,
) -> Result<StagingReport, WorkerError> {
    let inbox = dir.inbox();
    let repo = Repository::open(&inbox)
        .map_err(|e| WorkerError::Staging(format!("cannot open the clone: {}", e.message())))?;
    let (base_commit, branch) = check_out(&repo, &spec.repository)?;
    let subpath = match &spec.repository.subpath {
        Some(subpath) => resolve_subpath(&inbox, subpath)?,
        None => String::new(),
    };
    let workdir = if subpath.is_empty() {
        INBOX_MOUNT.to_string()
    } else {
        format!("{INBOX_MOUNT}/{subpath}")
    };
    let task_md = task_md_name(&repo)?;
    let text = task_md_text(spec, &workdir, base_commit.as_deref());
    write_atomic(&inbox.join(&task_md), text.as_bytes())?;
    exclude_from_git(&repo, &task_md)?;

    let report = StagingReport {
        task,
        attempt,
        base_commit,
        branch,
        workdir,
        subpath,
        task_md,
        clone_attempts,
        staged_at_ms: now_ms(),
    };
    append_event(
        &dir.events(),
        &serde_json::json!({
            "ts_ms": report.staged_at_ms,
            "event": "staged",
            "attempt": attempt,
            "clone_attempts": clone_attempts,
            "base_commit": report.base_commit,
            "workdir": report.workdir,
        }),
    )?;
    let json = serde_json::to_vec_pretty(&report)
        .map_err(|e| WorkerError::Staging(format!("cannot encode the staging report: {e}")))?;
    write_atomic(&staged_marker(dir), &json)?;
    Ok(report)
}

fn git_failure(what: &str, e: &git2::Error) -> WorkerError {
    WorkerError::Staging(format!("{what}: {}", e.message()))
}

/// Checks out `repository.branch` (as a local branch tracking origin's) and then
/// `repository.commit` (detached), or leaves the default branch. Returns the commit checked
/// out and the local branch, if any.
fn check_out(
    repo: &Repository,
    spec: &RepositorySpec,
) -> Result<(Option<String>, Option<String>), WorkerError> {
    let mut checkout = CheckoutBuilder::new();
    // The clone wrote no files (dry run); every file of the target must be created.
    checkout.force().recreate_missing(true);
    let mut branch_name = None;
    if let Some(branch) = &spec.branch {
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
            let mut local = repo.branch(branch, &commit, true).map_err(|e| {
                git_failure("repository.branch: cannot create the local branch", &e)
            })?;
            local
                .set_upstream(Some(&format!("{ORIGIN}/{branch}")))
                .map_err(|e| git_failure("repository.branch: cannot set the upstream", &e))?;
        }
        repo.checkout_tree(commit.as_object(), Some(&mut checkout))
            .map_err(|e| git_failure("repository.branch: checkout failed", &e))?;
        repo.set_head(&local_ref)
            .map_err(|e| git_failure("repository.branch: cannot move HEAD", &e))?;
        branch_name = Some(branch.clone());
    }
    if let Some(prefix) = &spec.commit {
        let within = spec
            .branch
            .as_deref()
            .map(|b| format!(" (fetched with branch {b:?})"))
            .unwrap_or_default();
        let commit = repo.find_commit_by_prefix(prefix).map_err(|e| {
            WorkerError::Staging(match e.code() {
                ErrorCode::Ambiguous => format!(
                    "repository.commit: {prefix:?} is ambiguous in the repository; give more digits"
                ),
                _ => format!(
                    "repository.commit: no commit {prefix:?} in the cloned repository{within}"
                ),
            })
        })?;
        repo.checkout_tree(commit.as_object(), Some(&mut checkout))
            .map_err(|e| git_failure("repository.commit: checkout failed", &e))?;
        repo.set_head_detached(commit.id())
            .map_err(|e| git_failure("repository.commit: cannot detach HEAD", &e))?;
        return Ok((Some(commit.id().to_string()), None));
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

/// Normalises `subpath` and checks it names a real directory of the checkout, reached without
/// symbolic links (a link could lead the working directory out of the repository).
fn resolve_subpath(inbox: &Path, subpath: &str) -> Result<String, WorkerError> {
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

/// `TASK.md`, unless the checkout tracks a file or directory of that name.
fn task_md_name(repo: &Repository) -> Result<String, WorkerError> {
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
fn task_md_text(spec: &TaskSpec, workdir: &str, base: Option<&str>) -> String {
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
fn exclude_from_git(repo: &Repository, name: &str) -> Result<(), WorkerError> {
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

/// Appends one JSON line to `events.jsonl`.
fn append_event(path: &Path, event: &serde_json::Value) -> Result<(), WorkerError> {
    let mut line = event.to_string();
    line.push('\n');
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| WorkerError::io("opening", path, e))?;
    file.write_all(line.as_bytes())
        .map_err(|e| WorkerError::io("appending to", path, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, Instant};

    use squadron_core::manifest::RetrySpec;

    use super::*;
    use crate::test_support::{events, git, git_output, spec_for, task_dir, write, SourceRepo};

    fn fast() -> StagingOptions {
        StagingOptions {
            backoff_override_ms: Some(1),
            ..StagingOptions::default()
        }
    }

    fn task(id: u64) -> TaskId {
        TaskId::new(id).unwrap()
    }

    fn assert_clean(inbox: &Path) {
        assert_eq!(
            git(inbox, &["status", "--porcelain", "--untracked-files=all"]),
            ""
        );
    }

    #[tokio::test]
    async fn clones_a_local_path_and_lays_out_the_task() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(7);
        let spec = spec_for(&source.url());
        let report = stage(&dir, task(7), 1, &spec, &fast()).await.unwrap();

        assert_eq!(report.task, task(7));
        assert_eq!(report.attempt, 1);
        assert_eq!(
            report.base_commit.as_deref(),
            Some(source.main_head.as_str())
        );
        assert_eq!(report.branch.as_deref(), Some("main"));
        assert_eq!(report.workdir, "/mnt/inbox");
        assert_eq!(report.subpath, "");
        assert_eq!(report.task_md, TASK_MD_NAME);
        assert_eq!(report.clone_attempts, 1);
        assert_eq!(report.workdir_host(&dir), dir.inbox());

        for path in [dir.stdout_log(), dir.stderr_log()] {
            assert_eq!(std::fs::read(&path).unwrap(), b"", "{}", path.display());
        }
        assert!(dir.artifacts().is_dir() && dir.run().is_dir());
        let manifest: TaskSpec =
            serde_yaml::from_str(&std::fs::read_to_string(dir.manifest()).unwrap()).unwrap();
        assert_eq!(manifest, spec);

        let inbox = dir.inbox();
        assert_eq!(
            std::fs::read_to_string(inbox.join("src/lib.rs")).unwrap(),
            "pub fn answer() -> u32 {\n    43\n}\n"
        );
        assert_eq!(git(&inbox, &["rev-parse", "HEAD"]).trim(), source.main_head);
        assert_eq!(
            git(&inbox, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
            "main"
        );
        assert_clean(&inbox);

        let task_md = std::fs::read_to_string(dir.task_md()).unwrap();
        assert!(task_md.starts_with("# Fix the answer\n"), "{task_md}");
        assert!(task_md.contains("Make answer() return 44.\nKeep the tests green."));
        assert!(task_md.contains("Work in `/mnt/inbox`"), "{task_md}");
        assert!(task_md.contains(&source.main_head));
        let exclude = std::fs::read_to_string(inbox.join(".git/info/exclude")).unwrap();
        assert_eq!(exclude.lines().filter(|l| *l == "/TASK.md").count(), 1);

        // Objects are copies: an agent rewriting them cannot reach the source repository.
        let pack_or_loose = walk_files(&inbox.join(".git/objects"));
        assert!(!pack_or_loose.is_empty());
        for file in pack_or_loose {
            assert_eq!(
                std::fs::metadata(&file).unwrap().nlink(),
                1,
                "{}",
                file.display()
            );
        }

        let events = events(&dir);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["event"], "staged");
        assert_eq!(events[0]["base_commit"], source.main_head.as_str());
        assert_eq!(StagingReport::load(&dir).unwrap(), Some(report));
        assert_eq!(cloning_leftovers(&dir), 0);
    }

    fn cloning_leftovers(dir: &TaskDir) -> usize {
        std::fs::read_dir(dir.root())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_str()
                    .unwrap()
                    .starts_with(CLONING_DIR_PREFIX)
            })
            .count()
    }

    fn walk_files(root: &Path) -> Vec<PathBuf> {
        let mut out = Vec::new();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    stack.push(entry.path());
                } else {
                    out.push(entry.path());
                }
            }
        }
        out
    }

    #[tokio::test]
    async fn clones_a_file_url_at_a_branch() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(8);
        let mut spec = spec_for(&source.file_url());
        spec.repository.branch = Some("feature".into());
        let report = stage(&dir, task(8), 1, &spec, &fast()).await.unwrap();

        assert_eq!(
            report.base_commit.as_deref(),
            Some(source.feature_head.as_str())
        );
        assert_eq!(report.branch.as_deref(), Some("feature"));
        let inbox = dir.inbox();
        assert_eq!(
            std::fs::read_to_string(inbox.join("README.md")).unwrap(),
            "# Project\n\nfeature line\n"
        );
        assert!(inbox.join("feature.txt").is_file());
        assert!(!inbox.join("docs/guide.md").exists());
        // The first commit of main, which feature starts from.
        assert_eq!(
            std::fs::read_to_string(inbox.join("src/lib.rs")).unwrap(),
            "pub fn answer() -> u32 {\n    42\n}\n"
        );
        assert_eq!(
            git(&inbox, &["rev-parse", "--abbrev-ref", "HEAD"]).trim(),
            "feature"
        );
        assert_eq!(
            git(&inbox, &["rev-parse", "--abbrev-ref", "feature@{upstream}"]).trim(),
            "origin/feature"
        );
        assert_clean(&inbox);
    }

    #[tokio::test]
    async fn checks_out_full_and_abbreviated_commits_detached() {
        let source = SourceRepo::new();

        let (_tmp, dir) = task_dir(9);
        let mut spec = spec_for(&source.url());
        spec.repository.commit = Some(source.main_first.clone());
        let report = stage(&dir, task(9), 1, &spec, &fast()).await.unwrap();
        assert_eq!(
            report.base_commit.as_deref(),
            Some(source.main_first.as_str())
        );
        assert_eq!(report.branch, None);
        let inbox = dir.inbox();
        assert_eq!(
            git(&inbox, &["rev-parse", "HEAD"]).trim(),
            source.main_first
        );
        assert!(!git_output(&inbox, &["symbolic-ref", "-q", "HEAD"])
            .status
            .success());
        assert!(std::fs::read_to_string(inbox.join("src/lib.rs"))
            .unwrap()
            .contains("42"));
        assert!(inbox.join("docs/guide.md").is_file());
        assert_clean(&inbox);

        let (_tmp2, dir) = task_dir(10);
        let mut spec = spec_for(&source.file_url());
        spec.repository.branch = Some("feature".into());
        spec.repository.commit = Some(source.feature_head[..8].to_string());
        let report = stage(&dir, task(10), 1, &spec, &fast()).await.unwrap();
        assert_eq!(
            report.base_commit.as_deref(),
            Some(source.feature_head.as_str())
        );
        assert_eq!(report.branch, None);
        assert!(dir.inbox().join("feature.txt").is_file());
        assert_clean(&dir.inbox());
    }

    #[tokio::test]
    async fn unknown_commit_and_branch_fail_without_retries() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(11);
        let mut spec = spec_for(&source.url());
        spec.repository.commit = Some("deadbeef00".into());
        let err = stage(&dir, task(11), 1, &spec, &fast())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("repository.commit") && err.contains("deadbeef00"),
            "{err}"
        );
        assert!(!err.contains(&source.url()), "{err}");
        assert!(StagingReport::load(&dir).unwrap().is_none());

        let (_tmp2, dir) = task_dir(12);
        let mut spec = spec_for(&source.url());
        spec.repository.branch = Some("no-such-branch".into());
        let err = stage(&dir, task(12), 1, &spec, &fast())
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("repository.branch") && err.contains("does not exist"),
            "{err}"
        );
        assert!(events(&dir).iter().all(|e| e["event"] != "clone_retry"));
    }

    #[tokio::test]
    async fn subpath_sets_the_workdir_and_must_exist() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(13);
        let mut spec = spec_for(&source.url());
        spec.repository.subpath = Some("./packages//auth/".into());
        let report = stage(&dir, task(13), 1, &spec, &fast()).await.unwrap();
        assert_eq!(report.workdir, "/mnt/inbox/packages/auth");
        assert_eq!(report.subpath, "packages/auth");
        assert_eq!(report.workdir_host(&dir), dir.inbox().join("packages/auth"));
        let task_md = std::fs::read_to_string(dir.task_md()).unwrap();
        assert!(
            task_md.contains("Work in `/mnt/inbox/packages/auth`"),
            "{task_md}"
        );

        for (subpath, why) in [
            ("packages/nope", "does not exist"),
            ("README.md", "not a directory"),
        ] {
            let (_tmp, dir) = task_dir(14);
            let mut spec = spec_for(&source.url());
            spec.repository.subpath = Some(subpath.into());
            let err = stage(&dir, task(14), 1, &spec, &fast())
                .await
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("repository.subpath") && err.contains(subpath) && err.contains(why),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn subpath_through_a_symlink_is_refused() {
        let source = SourceRepo::new();
        std::os::unix::fs::symlink("/etc", source.path.join("escape")).unwrap();
        git(&source.path, &["add", "escape"]);
        git(&source.path, &["commit", "-q", "-m", "link"]);
        let (_tmp, dir) = task_dir(15);
        let mut spec = spec_for(&source.url());
        spec.repository.subpath = Some("escape".into());
        let err = stage(&dir, task(15), 1, &spec, &fast())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
    }

    #[tokio::test]
    async fn a_bad_url_is_retried_then_fails_without_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let not_a_repo = tmp.path().join("not-a-repo");
        std::fs::create_dir_all(not_a_repo.join("sub")).unwrap();
        let cases = [
            (tmp.path().join("no-such-repo"), "local path does not exist"),
            (not_a_repo, ""),
        ];
        for (n, (path, why)) in cases.into_iter().enumerate() {
            let url = path.to_str().unwrap().to_string();
            let id = 16 + 100 * n as u64;
            let (_tmp, dir) = task_dir(id);
            let spec = spec_for(&url);
            assert_eq!(spec.lifecycle.retries.clone.max, 2);
            let err = stage(&dir, task(id), 1, &spec, &fast())
                .await
                .unwrap_err()
                .to_string();
            assert!(err.contains("repository.url"), "{err}");
            assert!(err.contains("after 3 attempt(s)"), "{err}");
            assert!(err.contains(why), "{err}");
            assert!(!err.contains(&url), "{err}");

            let retries: Vec<_> = events(&dir)
                .into_iter()
                .filter(|e| e["event"] == "clone_retry")
                .collect();
            assert_eq!(retries.len(), 3, "{retries:?}");
            for (i, event) in retries.iter().enumerate() {
                assert_eq!(event["attempt"], i as u64 + 1);
                assert!(event["ts_ms"].as_u64().unwrap() > 0);
                let error = event["error"].as_str().unwrap();
                assert!(!error.is_empty() && !error.contains(&url), "{error}");
            }
            assert_eq!(retries[0]["retry_in_ms"], 1);
            assert!(retries[2]["retry_in_ms"].is_null());
            assert!(!dir.inbox().exists());
            assert_eq!(cloning_leftovers(&dir), 0);
            assert!(StagingReport::load(&dir).unwrap().is_none());
        }
    }

    #[tokio::test]
    async fn retries_wait_the_policy_backoff() {
        let tmp = tempfile::tempdir().unwrap();
        let url = tmp.path().join("absent").to_str().unwrap().to_string();
        let (_tmp, dir) = task_dir(17);
        let mut spec = spec_for(&url);
        spec.lifecycle.retries.clone = RetrySpec::new(2, &[200, 300]);
        let started = Instant::now();
        stage(&dir, task(17), 1, &spec, &StagingOptions::default())
            .await
            .unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(500));
        let delays: Vec<_> = events(&dir)
            .iter()
            .map(|e| e["retry_in_ms"].clone())
            .collect();
        assert_eq!(
            delays,
            [
                serde_json::json!(200),
                serde_json::json!(300),
                serde_json::Value::Null
            ]
        );
    }

    #[tokio::test]
    async fn an_oversized_clone_is_aborted_once() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(18);
        let spec = spec_for(&source.file_url());
        let opts = StagingOptions {
            clone_bytes_max: 16,
            ..fast()
        };
        let err = stage(&dir, task(18), 1, &spec, &opts)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("more than 16 bytes"), "{err}");
        assert!(events(&dir).iter().all(|e| e["event"] != "clone_retry"));
        assert!(!dir.inbox().exists());
    }

    #[test]
    fn a_cancelled_clone_leaves_nothing() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(25);
        std::fs::create_dir_all(dir.root()).unwrap();
        let cancelled = AtomicBool::new(true);
        // Over the git transport the progress callback stops it; a local copy has no
        // progress reports and is discarded once done.
        for url in [source.file_url(), source.url()] {
            let outcome = clone_once(&url, &dir.inbox(), false, &cancelled, u64::MAX);
            match outcome {
                Err(CloneFailure::Transient(message)) => assert!(!message.contains(&source.url())),
                _ => panic!("{url}: a cancelled clone must fail"),
            }
            assert!(!dir.inbox().exists());
            assert_eq!(cloning_leftovers(&dir), 0);
        }
        let live = AtomicBool::new(false);
        assert!(clone_once(&source.url(), &dir.inbox(), false, &live, u64::MAX).is_ok());
        assert!(dir.inbox().join("README.md").is_file());
        assert_eq!(cloning_leftovers(&dir), 0);
    }

    #[tokio::test]
    async fn staging_again_is_a_no_op_for_the_same_attempt() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(19);
        let spec = spec_for(&source.url());
        let first = stage(&dir, task(19), 1, &spec, &fast()).await.unwrap();
        // The agent's edits of this attempt survive a recovering worker staging again.
        write(&dir.inbox().join("README.md"), "edited by the agent\n");
        let again = stage(&dir, task(19), 1, &spec, &fast()).await.unwrap();
        assert_eq!(again, first);
        assert_eq!(
            std::fs::read_to_string(dir.inbox().join("README.md")).unwrap(),
            "edited by the agent\n"
        );
        assert_eq!(events(&dir).len(), 1);

        // A new attempt starts from the repository again.
        write(&dir.stdout_log(), "attempt 1 output\n");
        let second = stage(&dir, task(19), 2, &spec, &fast()).await.unwrap();
        assert_eq!(second.attempt, 2);
        assert_eq!(
            std::fs::read_to_string(dir.inbox().join("README.md")).unwrap(),
            "# Project\n\nfirst line\n"
        );
        assert_eq!(std::fs::read(dir.stdout_log()).unwrap(), b"");
        assert_clean(&dir.inbox());
    }

    #[tokio::test]
    async fn a_crash_before_the_marker_restages_from_scratch() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(20);
        let spec = spec_for(&source.url());
        stage(&dir, task(20), 1, &spec, &fast()).await.unwrap();
        std::fs::remove_file(staged_marker(&dir)).unwrap();
        write(&dir.inbox().join("half-written"), "junk");
        write(&dir.root().join(".inbox.cloning.1.0/.git/HEAD"), "junk");
        let report = stage(&dir, task(20), 1, &spec, &fast()).await.unwrap();
        assert!(!dir.inbox().join("half-written").exists());
        assert_eq!(cloning_leftovers(&dir), 0);
        assert_eq!(
            report.base_commit.as_deref(),
            Some(source.main_head.as_str())
        );
        let exclude = std::fs::read_to_string(dir.inbox().join(".git/info/exclude")).unwrap();
        assert_eq!(exclude.lines().filter(|l| *l == "/TASK.md").count(), 1);
        assert_clean(&dir.inbox());
    }

    #[tokio::test]
    async fn a_tracked_task_md_is_left_alone() {
        let source = SourceRepo::new();
        write(&source.path.join("TASK.md"), "the project's own file\n");
        git(&source.path, &["add", "TASK.md"]);
        git(&source.path, &["commit", "-q", "-m", "task file"]);
        let (_tmp, dir) = task_dir(21);
        let report = stage(&dir, task(21), 1, &spec_for(&source.url()), &fast())
            .await
            .unwrap();
        assert_eq!(report.task_md, TASK_MD_FALLBACK_NAME);
        assert_eq!(
            std::fs::read_to_string(dir.task_md()).unwrap(),
            "the project's own file\n"
        );
        let ours = std::fs::read_to_string(dir.inbox().join(TASK_MD_FALLBACK_NAME)).unwrap();
        assert!(ours.contains("Make answer() return 44."));
        assert_clean(&dir.inbox());
    }

    #[tokio::test]
    async fn an_empty_repository_stages_with_no_base() {
        let tmp = tempfile::tempdir().unwrap();
        git(tmp.path(), &["init", "-q", "empty"]);
        let (_tmp, dir) = task_dir(22);
        let url = tmp.path().join("empty").to_str().unwrap().to_string();
        let report = stage(&dir, task(22), 1, &spec_for(&url), &fast())
            .await
            .unwrap();
        assert_eq!(report.base_commit, None);
        assert!(dir.task_md().is_file());
    }

    #[tokio::test]
    async fn the_task_must_own_the_directory_and_the_spec_must_be_valid() {
        let source = SourceRepo::new();
        let (_tmp, dir) = task_dir(23);
        let spec = spec_for(&source.url());
        let err = stage(&dir, task(24), 1, &spec, &fast()).await.unwrap_err();
        assert!(err.to_string().contains("task_id"), "{err}");
        let mut bad = spec.clone();
        bad.agent.prompt.clear();
        let err = stage(&dir, task(23), 1, &bad, &fast()).await.unwrap_err();
        assert!(err.to_string().contains("agent.prompt"), "{err}");
    }

    #[test]
    fn a_long_prompt_is_cut_in_task_md() {
        let mut spec = spec_for("/srv/repo");
        spec.agent.prompt = "é".repeat(TASK_MD_BYTES_MAX);
        let text = task_md_text(&spec, "/mnt/inbox", None);
        assert!(text.len() <= TASK_MD_BYTES_MAX, "{}", text.len());
        assert!(text.contains("given whole on standard input"));
        assert!(text.contains("## Instructions"));
    }

    #[test]
    fn urls_and_credentials_never_reach_messages() {
        let cases = [
            (
                "failed to resolve path '/srv/git/repo': No such file",
                "/srv/git/repo",
            ),
            (
                "could not read file:///srv/git/repo/ or /srv/git/repo",
                "file:///srv/git/repo",
            ),
            (
                "failed to connect to https://github.com/org/repo",
                "https://github.com/org/repo",
            ),
            (
                "unexpected http status for ssh://git@host/x.git",
                "ssh://git@host/x.git",
            ),
            (
                "auth failed for git@github.com:org/repo.git",
                "git@github.com:org/repo.git",
            ),
        ];
        for (message, url) in cases {
            let redacted = redact_url(message, url);
            assert!(redacted.contains(URL_PLACEHOLDER), "{redacted}");
            let without_user = url.rsplit('@').next().unwrap();
            assert!(!redacted.contains(without_user), "{url}: {redacted}");
        }
        let leaked = redact_url("redirect to https://user:hunter2@mirror.example/repo", "/x");
        assert!(
            !leaked.contains("hunter2") && leaked.contains("https://***@mirror"),
            "{leaked}"
        );
        let long = redact_url(&"x".repeat(CLONE_ERROR_BYTES_MAX * 2), "/x");
        assert_eq!(long.len(), CLONE_ERROR_BYTES_MAX);
    }
}
