//! Tasks and their lifecycle (INV-10).

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{TaskId, WorkerId};
use crate::manifest::TaskSpec;
use crate::validation_error::ValidationError;

/// The states of the task lifecycle, as in `task-run-lifecycle.txt`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TaskState {
    Pending,
    Staging,
    Provisioning,
    Ready,
    Running,
    Completing,
    Completed,
    Failed,
    FailedPreserved,
    Cancelled,
}

/// Who may cause a transition. Workers report what they did; the control plane itself moves
/// tasks when it assigns them, re-queues them from a lost worker, or cancels a queued one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransitionActor {
    Worker,
    ControlPlane,
}

impl TaskState {
    pub const ALL: [TaskState; 10] = [
        TaskState::Pending,
        TaskState::Staging,
        TaskState::Provisioning,
        TaskState::Ready,
        TaskState::Running,
        TaskState::Completing,
        TaskState::Completed,
        TaskState::Failed,
        TaskState::FailedPreserved,
        TaskState::Cancelled,
    ];

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed
                | TaskState::Failed
                | TaskState::FailedPreserved
                | TaskState::Cancelled
        )
    }

    /// States in which a worker owns the task (it was assigned and has not ended).
    pub fn is_assigned(self) -> bool {
        !self.is_terminal() && self != TaskState::Pending
    }

    /// The legal transition table. The forward path is the seed's; any non-terminal state may
    /// fail, fail-preserved or be cancelled; and a task that has not started running yet may go
    /// back to PENDING when the control plane re-queues it from a lost worker (the agent never
    /// ran, so nothing can have happened twice).
    pub fn can_move(self, to: TaskState, actor: TransitionActor) -> bool {
        use TaskState::*;
        if self.is_terminal() {
            return false;
        }
        match (actor, self, to) {
            (_, _, Failed | FailedPreserved) => true,
            (TransitionActor::ControlPlane, _, Cancelled) => true,
            (TransitionActor::ControlPlane, Pending, Staging) => true,
            (TransitionActor::ControlPlane, Staging | Provisioning | Ready, Pending) => true,
            (TransitionActor::Worker, s, Cancelled) => s != Pending,
            (TransitionActor::Worker, Staging, Provisioning)
            | (TransitionActor::Worker, Provisioning, Ready)
            | (TransitionActor::Worker, Ready, Running)
            | (TransitionActor::Worker, Running, Completing)
            | (TransitionActor::Worker, Completing, Completed) => true,
            _ => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Pending => "PENDING",
            TaskState::Staging => "STAGING",
            TaskState::Provisioning => "PROVISIONING",
            TaskState::Ready => "READY",
            TaskState::Running => "RUNNING",
            TaskState::Completing => "COMPLETING",
            TaskState::Completed => "COMPLETED",
            TaskState::Failed => "FAILED",
            TaskState::FailedPreserved => "FAILED_PRESERVED",
            TaskState::Cancelled => "CANCELLED",
        }
    }

    pub fn parse(field: &str, s: &str) -> Result<Self, crate::ValidationError> {
        let upper = s.to_ascii_uppercase();
        Self::ALL
            .into_iter()
            .find(|t| t.as_str() == upper)
            .ok_or_else(|| {
                crate::ValidationError::new(
                    field,
                    format!(
                        "unknown task state {s:?}; expected one of {}",
                        Self::ALL.map(TaskState::as_str).join(", ")
                    ),
                )
            })
    }
}

impl fmt::Display for TaskState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Longest model or tool name a provider's progress records.
pub const PROVIDER_NAME_BYTES_MAX: usize = 128;

/// What a provider CLI's own stream (Claude Code's stream-json, Codex's JSONL) said while the
/// attempt ran, as its worker last reported it: the seed's progress tracking — tool calls,
/// the current tool, tokens. Each report replaces the last of the same attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProviderProgress {
    pub model: Option<String>,
    pub tool_calls: u64,
    /// The tool it called last (Codex: the kind of work — `command_execution`, …).
    pub current_tool: Option<String>,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Millionths of a US dollar, where the CLI states a cost (Claude Code, once it finished).
    pub cost_micro_usd: Option<u64>,
    pub turns: u64,
}

impl ProviderProgress {
    pub fn validate(&self) -> Result<(), ValidationError> {
        for (field, name) in [
            ("provider.model", &self.model),
            ("provider.current_tool", &self.current_tool),
        ] {
            if let Some(name) = name {
                if name.is_empty()
                    || name.len() > PROVIDER_NAME_BYTES_MAX
                    || name.chars().any(char::is_control)
                {
                    return Err(ValidationError::new(
                        field,
                        format!(
                            "must be 1..={PROVIDER_NAME_BYTES_MAX} bytes without control \
                             characters"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// A task's provider progress and the attempt it is of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AttemptProviderProgress {
    pub attempt: u32,
    pub progress: ProviderProgress,
}

/// Output counters; the output itself never passes through Raft.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskProgress {
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub lines: u64,
    pub events: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Task {
    pub id: TaskId,
    pub spec: TaskSpec,
    pub state: TaskState,
    /// 1 for the first run; raised when the task is re-queued from a lost worker.
    pub attempt: u32,
    pub worker: Option<WorkerId>,
    pub submitted_at_ms: u64,
    /// When the task last entered each state it has been in.
    pub entered_at_ms: BTreeMap<TaskState, u64>,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub cancel_requested: Option<String>,
    pub progress: TaskProgress,
    pub artifacts: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use TaskState::*;

    #[test]
    fn terminal_states_are_final() {
        for from in [Completed, Failed, FailedPreserved, Cancelled] {
            for to in TaskState::ALL {
                for actor in [TransitionActor::Worker, TransitionActor::ControlPlane] {
                    assert!(!from.can_move(to, actor), "{from} -> {to} must be illegal");
                }
            }
        }
    }

    #[test]
    fn forward_path_is_legal_for_workers_only_after_assignment() {
        let path = [Staging, Provisioning, Ready, Running, Completing, Completed];
        for pair in path.windows(2) {
            assert!(pair[0].can_move(pair[1], TransitionActor::Worker));
        }
        assert!(!Pending.can_move(Staging, TransitionActor::Worker));
        assert!(Pending.can_move(Staging, TransitionActor::ControlPlane));
    }

    #[test]
    fn no_skipping_or_going_back() {
        assert!(!Staging.can_move(Running, TransitionActor::Worker));
        assert!(!Running.can_move(Ready, TransitionActor::Worker));
        assert!(!Running.can_move(Pending, TransitionActor::ControlPlane));
        assert!(!Completing.can_move(Pending, TransitionActor::ControlPlane));
        assert!(!Running.can_move(Completed, TransitionActor::Worker));
    }

    #[test]
    fn parse_accepts_either_case_and_names_the_field() {
        assert_eq!(
            TaskState::parse("state", "failed_preserved").unwrap(),
            FailedPreserved
        );
        assert_eq!(TaskState::parse("state", "RUNNING").unwrap(), Running);
        assert_eq!(
            TaskState::parse("state", "nope").unwrap_err().field,
            "state"
        );
    }
}
