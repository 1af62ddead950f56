//! Commands on tasks.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{TaskId, WorkerId};
use crate::manifest::TaskSpec;
use crate::task::{ProviderProgress, TaskProgress, TaskState};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SubmitTask {
    pub spec: Box<TaskSpec>,
}

/// Proposed by the leader's scheduler; each assignment is re-checked at apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AssignTasks {
    pub assignments: Vec<Assignment>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    pub task: TaskId,
    pub worker: WorkerId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReportTransition {
    pub task: TaskId,
    pub worker: WorkerId,
    pub attempt: u32,
    pub from: TaskState,
    pub to: TaskState,
    pub detail: TransitionDetail,
}

/// What a worker reports with a transition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct TransitionDetail {
    /// Required when leaving RUNNING for COMPLETING.
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// Artifact names collected so far (COMPLETING onwards).
    pub artifacts: Vec<String>,
}

/// Absolute counters; they may only grow.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReportProgress {
    pub task: TaskId,
    pub worker: WorkerId,
    pub attempt: u32,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub lines: u64,
    pub events: u64,
}

impl ReportProgress {
    /// The counters as the task records them.
    pub fn progress(&self) -> TaskProgress {
        TaskProgress {
            stdout_bytes: self.stdout_bytes,
            stderr_bytes: self.stderr_bytes,
            lines: self.lines,
            events: self.events,
        }
    }
}

/// Progress with what the provider's own stream said; what a worker reports since
/// `ReportProgress` (which older logs still hold) alone carried the counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReportProgressV2 {
    pub counts: ReportProgress,
    /// `None` for a provider without a structured stream (`script`), or before its first line.
    pub provider: Option<ProviderProgress>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CancelTask {
    pub task: TaskId,
    pub reason: String,
}
