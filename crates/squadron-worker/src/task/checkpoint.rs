//! `state.json`: the worker's own record of where a task attempt is, written after each step
//! so a restarted worker resumes instead of starting anything twice.

use std::path::Path;

use serde::{Deserialize, Serialize};
use squadron_core::manifest::RuntimeKind;
use squadron_core::task::TaskState;

use crate::error::WorkerError;
use crate::support::write_atomic;

/// Largest `state.json` read back; anything bigger is not ours.
pub(crate) const CHECKPOINT_BYTES_MAX: u64 = 64 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct TaskCheckpoint {
    pub(crate) task: u64,
    pub(crate) attempt: u32,
    /// The last state the control plane confirmed.
    pub(crate) state: TaskState,
    pub(crate) runtime: RuntimeKind,
    /// The sandbox id (cgroup path or container id) once provisioned.
    pub(crate) sandbox: Option<String>,
    pub(crate) workdir: Option<String>,
    /// When the provider was started (worker clock), for the task timeout across restarts.
    pub(crate) started_at_ms: Option<u64>,
    pub(crate) exit_code: Option<i32>,
    pub(crate) error: Option<String>,
    pub(crate) updated_at_ms: u64,
    /// The credential lease this attempt took: a restarted worker asks for it again and only
    /// for it (absent in checkpoints of older workers, which then take a plain grant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) credential_lease: Option<u64>,
}

impl TaskCheckpoint {
    /// The record of an attempt nothing has been checkpointed for yet.
    pub(crate) fn fresh(task: u64, attempt: u32, state: TaskState, runtime: RuntimeKind) -> Self {
        Self {
            task,
            attempt,
            state,
            runtime,
            sandbox: None,
            workdir: None,
            started_at_ms: None,
            exit_code: None,
            error: None,
            updated_at_ms: 0,
            credential_lease: None,
        }
    }

    pub(crate) fn load(path: &Path) -> Result<Option<Self>, WorkerError> {
        match std::fs::metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(WorkerError::io("reading checkpoint", path, e)),
            Ok(m) if m.len() > CHECKPOINT_BYTES_MAX => {
                return Err(WorkerError::Invalid {
                    field: path.display().to_string(),
                    message: format!("checkpoint larger than {CHECKPOINT_BYTES_MAX} bytes"),
                })
            }
            Ok(_) => {}
        }
        let bytes =
            std::fs::read(path).map_err(|e| WorkerError::io("reading checkpoint", path, e))?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| WorkerError::Invalid {
                field: path.display().to_string(),
                message: format!("unreadable checkpoint: {e}"),
            })
    }

    /// Written to a temporary file, synced and renamed, so a crash leaves the old or the new
    /// record.
    pub(crate) fn store(&self, path: &Path) -> Result<(), WorkerError> {
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| WorkerError::Invalid {
            field: "checkpoint".into(),
            message: e.to_string(),
        })?;
        write_atomic(path, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_round_trips_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        assert_eq!(TaskCheckpoint::load(&path).unwrap(), None);
        let c = TaskCheckpoint {
            task: 7,
            attempt: 1,
            state: TaskState::Running,
            runtime: RuntimeKind::Process,
            sandbox: Some("/sys/fs/cgroup/unified/squadron/w/task-7-a1".into()),
            workdir: Some("/mnt/inbox".into()),
            started_at_ms: Some(5),
            exit_code: None,
            error: None,
            updated_at_ms: 6,
            credential_lease: Some(3),
        };
        c.store(&path).unwrap();
        assert_eq!(TaskCheckpoint::load(&path).unwrap(), Some(c));
    }

    #[test]
    fn a_corrupt_checkpoint_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        std::fs::write(&path, b"{not json").unwrap();
        let e = TaskCheckpoint::load(&path).unwrap_err().to_string();
        assert!(e.contains("state.json"), "{e}");
    }
}
