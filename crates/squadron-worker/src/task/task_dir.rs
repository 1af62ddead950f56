//! The on-disk layout of one task on a worker, as in the seed's STAGING section:
//!
//! ```text
//! {data_dir}/tasks/{task_id}/
//! ├── manifest.yaml          the validated spec, as submitted
//! ├── state.json             the worker's checkpoint (for recovery)
//! ├── run/                   worker-written files the sandbox reads: launch.sh, prompt, script
//! ├── inbox/                 the cloned repository + TASK.md
//! └── outbox/
//!     ├── progress/{stdout.log, stderr.log, events.jsonl}
//!     └── artifacts/
//! ```

use std::path::{Path, PathBuf};

use squadron_core::ids::TaskId;
use squadron_isolation::beneath::{Beneath, BeneathError};

use crate::error::WorkerError;

/// The progress files and the artifacts, beneath the outbox (which the sandbox owns: open them
/// only through [`TaskDir::outbox_beneath`]).
pub(crate) const STDOUT_LOG: &str = "progress/stdout.log";
pub(crate) const STDERR_LOG: &str = "progress/stderr.log";
pub(crate) const EVENTS_LOG: &str = "progress/events.jsonl";
pub(crate) const ARTIFACTS: &str = "artifacts";

/// Where the task's directories appear inside every sandbox, whatever the runtime.
/// The attempt's checkpoint in the task's root (`checkpoint.rs`).
pub(crate) const STATE_JSON_NAME: &str = "state.json";
pub(crate) const INBOX_MOUNT: &str = "/mnt/inbox";
pub(crate) const OUTBOX_MOUNT: &str = "/mnt/outbox";
pub(crate) const GLOBAL_MOUNT: &str = "/mnt/global";
pub(crate) const RUN_MOUNT: &str = "/mnt/run";

/// Marks a task directory whose outbox could not be redacted: none of it is served.
pub(crate) const UNREDACTED_MARKER_NAME: &str = "outbox-unredacted";

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TaskDir {
    root: PathBuf,
    task: TaskId,
}

impl TaskDir {
    pub(crate) fn new(data_dir: &Path, task: TaskId) -> Self {
        TaskDir {
            root: data_dir.join("tasks").join(task.get().to_string()),
            task,
        }
    }

    pub(crate) fn task(&self) -> TaskId {
        self.task
    }
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }
    pub(crate) fn manifest(&self) -> PathBuf {
        self.root.join("manifest.yaml")
    }
    /// An attempt's own directories, made if missing: `run/`, `outbox/progress/`,
    /// `outbox/artifacts/`.
    pub(crate) fn make_attempt_dirs(&self) -> Result<(), WorkerError> {
        for path in [self.run(), self.progress(), self.artifacts()] {
            std::fs::create_dir_all(&path).map_err(|e| WorkerError::io("creating", &path, e))?;
        }
        Ok(())
    }

    pub(crate) fn state_json(&self) -> PathBuf {
        self.root.join(STATE_JSON_NAME)
    }
    /// Written when the end-of-attempt redaction could not rewrite a file of the outbox (it
    /// names them): the task's output is not served from then on.
    pub(crate) fn unredacted_marker(&self) -> PathBuf {
        self.root.join(UNREDACTED_MARKER_NAME)
    }
    pub(crate) fn run(&self) -> PathBuf {
        self.root.join("run")
    }
    pub(crate) fn inbox(&self) -> PathBuf {
        self.root.join("inbox")
    }
    #[cfg(test)]
    pub(crate) fn task_md(&self) -> PathBuf {
        self.inbox().join("TASK.md")
    }
    pub(crate) fn outbox(&self) -> PathBuf {
        self.root.join("outbox")
    }
    /// The outbox as a root beneath which no link is followed: every worker-side open of a
    /// file the sandbox can write goes through it.
    pub(crate) fn outbox_beneath(&self) -> Result<Beneath, BeneathError> {
        Beneath::open(&self.outbox())
    }
    pub(crate) fn progress(&self) -> PathBuf {
        self.outbox().join("progress")
    }
    pub(crate) fn stdout_log(&self) -> PathBuf {
        self.outbox().join(STDOUT_LOG)
    }
    pub(crate) fn stderr_log(&self) -> PathBuf {
        self.outbox().join(STDERR_LOG)
    }
    pub(crate) fn events(&self) -> PathBuf {
        self.outbox().join(EVENTS_LOG)
    }
    pub(crate) fn artifacts(&self) -> PathBuf {
        self.outbox().join(ARTIFACTS)
    }
    /// The sandbox agent's directory: its environment file, the CA, the relay sockets.
    pub(crate) fn agent(&self) -> PathBuf {
        self.root.join("agent")
    }
}
