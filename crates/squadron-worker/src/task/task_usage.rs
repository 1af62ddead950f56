//! What a task's sandbox uses, measured by its worker: the runtime's accounting of the
//! current attempt's sandbox (the process runtime's cgroup leaf) and the bytes of the task's
//! inbox and outbox. Runtimes whose sandboxes run `squadron agent` leave it to the agent's
//! heartbeat (`AgentSession::usage`), which sees inside the sandbox.

use std::path::PathBuf;

use squadron_api::TaskUsage;
use squadron_core::agent_session::SandboxUsage;
use squadron_core::manifest::RuntimeKind;
use squadron_isolation::LeafUsage;

use std::sync::Arc;

use crate::agent::supervisor::AgentSupervisor;
use crate::error::WorkerError;
use crate::runtime::probe::RuntimeSet;
use crate::runtime::project::ProjectRuntime;
use crate::runtime::{Runtime, SandboxHandle};
use crate::support::now_ms;
use crate::task::checkpoint::TaskCheckpoint;
use crate::task::task_dir::{TaskDir, STATE_JSON_NAME};
use crate::task::task_volume::TaskVolume;

/// Why a task's usage cannot be measured here.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UsageUnavailable {
    #[error("task {0} has no attempt on this worker")]
    NoAttempt(u64),
    #[error(
        "the {0} runtime's sandboxes run an agent that reports their usage: \
         GET /api/v1/tasks/{1}/agent"
    )]
    AgentReports(RuntimeKind, u64),
    #[error("the {0} runtime does not measure its sandboxes' usage without its agent")]
    NotMeasured(RuntimeKind),
    #[error(transparent)]
    Worker(#[from] WorkerError),
}

/// The task's current attempt's usage now; none once its sandbox is gone. A `placement:
/// project` task's is its generation's leaf in `agents`' project sandbox, and the disk it
/// uses the profile's worktree with its outbox.
pub(crate) async fn measure(
    runtimes: &RuntimeSet,
    agents: Option<&AgentSupervisor>,
    dir: &TaskDir,
) -> Result<TaskUsage, UsageUnavailable> {
    let task = dir.task().get();
    let c = checkpoint_of(dir)?.ok_or(UsageUnavailable::NoAttempt(task))?;
    let (runtime, disk_dirs): (Arc<dyn Runtime>, _) =
        match (ProjectRuntime::record(dir, c.attempt)?, agents) {
            (Some(run), Some(agents)) => {
                let project = ProjectRuntime::of_record(agents, &run).await?;
                let dirs = vec![project.worktree(), dir.outbox()];
                (Arc::new(project), dirs)
            }
            (Some(_), None) => return Err(UsageUnavailable::NoAttempt(task)),
            (None, _) => (
                runtimes
                    .get(c.runtime)
                    .ok_or(UsageUnavailable::NoAttempt(task))?
                    .clone(),
                vec![dir.inbox(), dir.outbox()],
            ),
        };
    if runtime.runs_agent() {
        return Err(UsageUnavailable::AgentReports(c.runtime, task));
    }
    if !runtime.measures_usage() {
        return Err(UsageUnavailable::NotMeasured(c.runtime));
    }
    let leaf = match &c.sandbox {
        Some(id) => {
            // A project task's sandbox is its project's, whatever its `vm.runtime`.
            let handle = SandboxHandle {
                runtime: runtime.kind(),
                id: id.clone(),
            };
            runtime.usage(&handle).await?
        }
        None => None,
    };
    let usage = match leaf {
        Some(leaf) => Some(with_disk(leaf, disk_dirs).await?),
        None => None,
    };
    Ok(TaskUsage {
        task: dir.task(),
        attempt: c.attempt,
        runtime: c.runtime,
        state: c.state,
        usage,
        measured_at_ms: now_ms(),
    })
}

/// The attempt's checkpoint. A task that just ended may be retiring its volume: its kept files
/// wait beside the directory for a moment before they move in (`TaskVolume::retire`), so the
/// copy is asked, and the directory again after it.
fn checkpoint_of(dir: &TaskDir) -> Result<Option<TaskCheckpoint>, WorkerError> {
    let retired = TaskVolume::retired_dir(dir).join(STATE_JSON_NAME);
    for path in [dir.state_json(), retired, dir.state_json()] {
        if let Some(c) = TaskCheckpoint::load(&path)? {
            return Ok(Some(c));
        }
    }
    Ok(None)
}

/// A leaf's usage with the bytes under `dirs` (a bounded walk that follows no link, off the
/// async runtime).
pub(crate) async fn with_disk(
    leaf: LeafUsage,
    dirs: Vec<PathBuf>,
) -> Result<SandboxUsage, WorkerError> {
    let disk_bytes =
        tokio::task::spawn_blocking(move || squadron_agent::sandbox_usage::disk_bytes(&dirs))
            .await
            .map_err(|e| WorkerError::runtime("usage", format!("the disk walk failed: {e}")))?;
    Ok(SandboxUsage {
        cpu_usec: leaf.cpu_usec,
        memory_bytes: leaf.memory_bytes,
        disk_bytes,
    })
}
