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

mod checkout;
mod redact;
mod task_md;

use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use backon::Retryable;
use git2::build::{CheckoutBuilder, CloneLocal, RepoBuilder};
use git2::{FetchOptions, RemoteCallbacks, Repository};
use serde::{Deserialize, Serialize};
use squadron_core::ids::TaskId;
use squadron_core::manifest::TaskSpec;

use crate::error::WorkerError;
use crate::retry;
use crate::support::{now_ms, remove_path, write_atomic};
use crate::task::task_dir::{TaskDir, INBOX_MOUNT};
use checkout::{check_out, resolve_subpath};
pub(crate) use redact::redact_url;
use task_md::{exclude_from_git, task_md_name, task_md_text};

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
    dir.make_attempt_dirs()?;
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
    let yaml = yaml_serde::to_string(spec)
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
    /// The worker's own trouble (its staging thread); returned as it is.
    Worker(WorkerError),
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
    let policy = &spec.lifecycle.retries.clone;
    let tries = policy.max.saturating_add(1);
    let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
    let url = spec.repository.url.clone();
    let own_checkout = spec.repository.branch.is_some() || spec.repository.commit.is_some();
    let tried = AtomicU32::new(0);
    // An event line that cannot be written ends the retries with its error.
    let unrecorded: Mutex<Option<WorkerError>> = Mutex::new(None);
    let once = || {
        tried.fetch_add(1, Ordering::Relaxed);
        let (inbox, url, flag) = (dir.inbox(), url.clone(), cancel.0.clone());
        let bytes_max = opts.clone_bytes_max;
        async move {
            blocking(move || clone_once(&url, &inbox, own_checkout, &flag, bytes_max))
                .await
                .map_err(CloneFailure::Worker)?
        }
    };
    let outcome = once
        .retry(retry::table(policy, opts.backoff_override_ms))
        .when(|f| matches!(f, CloneFailure::Transient(_)))
        .adjust(|f, pause| {
            let CloneFailure::Transient(message) = f else {
                return None;
            };
            let event = serde_json::json!({
                "ts_ms": now_ms(),
                "event": "clone_retry",
                "attempt": tried.load(Ordering::Relaxed),
                "error": message,
                "retry_in_ms": pause.map(|d| d.as_millis() as u64),
            });
            match append_event(dir, &event) {
                Ok(()) => pause,
                Err(e) => {
                    *unrecorded.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                    None
                }
            }
        })
        .await;
    match outcome {
        Ok(()) => Ok(tried.load(Ordering::Relaxed)),
        Err(CloneFailure::Permanent(err)) => {
            remove_path(&dir.inbox())?;
            Err(err)
        }
        Err(CloneFailure::Worker(err)) => Err(err),
        Err(CloneFailure::Transient(message)) => {
            if let Some(e) = unrecorded
                .into_inner()
                .unwrap_or_else(PoisonError::into_inner)
            {
                return Err(e);
            }
            remove_path(&dir.inbox())?;
            Err(WorkerError::Staging(format!(
                "repository.url: clone failed after {tries} attempt(s): {message}"
            )))
        }
    }
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
        dir,
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

/// Appends one JSON line to `events.jsonl` (through the outbox, never a link in it).
fn append_event(dir: &TaskDir, event: &serde_json::Value) -> Result<(), WorkerError> {
    crate::task::output_counter::append_event(dir, event)
        .map_err(|e| WorkerError::io("appending to", dir.events(), e))
}

#[cfg(test)]
mod tests;
