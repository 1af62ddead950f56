//! Tasks: a page of the listing and the worker's reports.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::agent_session::SandboxUsage;
use squadron_core::command::TransitionDetail;
use squadron_core::ids::{TaskId, WorkerId};
use squadron_core::manifest::RuntimeKind;
use squadron_core::task::{Task, TaskState};

/// `GET /api/v1/tasks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Oldest first: pass as `after` to get the next page; absent on the last page.
    #[serde(default)]
    pub next_after: Option<u64>,
    /// Newest first: pass as `before` to get the next page; absent on the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_before: Option<u64>,
}

/// `POST /api/v1/tasks/{id}/transitions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportTransition {
    pub worker: WorkerId,
    pub attempt: u32,
    pub from: TaskState,
    pub to: TaskState,
    #[serde(default)]
    pub detail: TransitionDetail,
}

/// `POST /api/v1/tasks/{id}/progress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportProgress {
    pub worker: WorkerId,
    pub attempt: u32,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub lines: u64,
    pub events: u64,
    /// What the provider's own stream said so far; absent for a provider without one.
    #[serde(default)]
    pub provider: Option<squadron_core::task::ProviderProgress>,
}

/// One entry of `GET /api/v1/tasks/{id}/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ArtifactEntry {
    /// Relative to the task's artifacts directory.
    pub name: String,
    pub size: u64,
}

/// What a task's sandbox uses now, measured by its worker (`GET /api/v1/tasks/{id}/usage`):
/// the runtimes whose sandboxes run no agent (the process runtime) answer it from the host's
/// accounting of the attempt's cgroup leaf; the others' agents report theirs
/// (`GET /api/v1/tasks/{id}/agent`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskUsage {
    pub task: TaskId,
    pub attempt: u32,
    pub runtime: RuntimeKind,
    /// The attempt's state as its worker last had it confirmed.
    pub state: TaskState,
    /// `null` once the attempt's sandbox is gone (or before it exists): a poll that races
    /// the end of a task reads that, not an error.
    pub usage: Option<SandboxUsage>,
    /// When the worker measured it (worker clock).
    pub measured_at_ms: u64,
}
