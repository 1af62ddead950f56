//! The task lifecycle register: one dedicated task's state, moved by its worker's reports.
//!
//! Operations (`f`, input → output):
//! - `read`: `null` → `{state}`
//! - `transition`: `{from, to}` → `{state}`; refusals `{error: "stale_task_state", current}`
//!   (the task is not in `from`), `{error: "illegal_transition"}` (it is, but the lifecycle
//!   has no such step), `{error: "not_task_owner"}` (no worker was assigned yet)
//!
//! The core checks a report in this order: the owner (an unassigned, PENDING task has none),
//! then `from` against the state, then the transition table (`apply_tasks.rs`). The control
//! plane's own move, PENDING → STAGING when the scheduler assigns the task, is not a client
//! operation: the model makes it lazily, when an operation needs an assigned task, which
//! loses no linearization because nothing can observe the assignment but those operations.
//! Nothing else moves a task here: the harness's worker is never lost and nobody cancels.

use squadron_core::task::{TaskState, TransitionActor};

use crate::model::{Model, ModelError};
use crate::operation::{Completion, Operation};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskStep {
    Read(TaskState),
    /// Recorded, or of unknown outcome (the search decides whether it took effect).
    Move {
        from: TaskState,
        to: TaskState,
    },
    Stale {
        from: TaskState,
        current: Option<TaskState>,
    },
    Illegal {
        from: TaskState,
        to: TaskState,
    },
    NotOwner,
}

/// The sequential lifecycle of one task.
#[derive(Debug, Clone, Copy, Default)]
pub struct TaskLifecycle;

/// Whether the core records a worker's report `from` → `to` on a task of the workload's
/// manifest (success code 0, failures destroyed, never cancelled).
pub fn is_legal(from: TaskState, to: TaskState) -> bool {
    from.can_move(to, TransitionActor::Worker)
        && !matches!(to, TaskState::FailedPreserved | TaskState::Cancelled)
}

fn state_of(op: &Operation, v: &serde_json::Value, name: &str) -> Result<TaskState, ModelError> {
    let s = v
        .get(name)
        .and_then(|v| v.as_str())
        .ok_or_else(|| ModelError::new(op, format!("missing task state {name:?} in {v}")))?;
    TaskState::parse(name, s).map_err(|e| ModelError::new(op, e.to_string()))
}

impl Model for TaskLifecycle {
    type State = TaskState;
    type Step = TaskStep;

    fn name(&self) -> &'static str {
        "task-lifecycle"
    }

    fn init(&self) -> TaskState {
        TaskState::Pending
    }

    fn parse(&self, op: &Operation) -> Result<Option<TaskStep>, ModelError> {
        let step = match (op.f.as_str(), op.completion) {
            ("read", Completion::Ok) => TaskStep::Read(state_of(op, &op.output, "state")?),
            ("read", _) => return Ok(None),
            ("transition", c) => {
                let from = state_of(op, &op.input, "from")?;
                let to = state_of(op, &op.input, "to")?;
                match (c, op.error()) {
                    (Completion::Ok | Completion::Info, _) => TaskStep::Move { from, to },
                    (Completion::Fail, Some("stale_task_state")) => TaskStep::Stale {
                        from,
                        current: match op.output.get("current") {
                            Some(v) if !v.is_null() => Some(state_of(op, &op.output, "current")?),
                            _ => None,
                        },
                    },
                    (Completion::Fail, Some("illegal_transition")) => {
                        TaskStep::Illegal { from, to }
                    }
                    (Completion::Fail, Some("not_task_owner")) => TaskStep::NotOwner,
                    (Completion::Fail, _) => return Ok(None),
                }
            }
            (f, _) => return Err(ModelError::new(op, format!("unknown task operation {f:?}"))),
        };
        Ok(Some(step))
    }

    fn step(&self, s: &TaskState, step: &TaskStep) -> Option<TaskState> {
        // Every answer but `not_task_owner` (and a read of PENDING) comes from an assigned
        // task: if the model's task is still PENDING, the scheduler assigned it just before.
        let assigned = if *s == TaskState::Pending {
            TaskState::Staging
        } else {
            *s
        };
        match *step {
            TaskStep::Read(seen) => (seen == *s || seen == assigned).then_some(seen),
            TaskStep::NotOwner => (*s == TaskState::Pending).then_some(*s),
            TaskStep::Move { from, to } => (assigned == from && is_legal(from, to)).then_some(to),
            TaskStep::Stale { from, current } => {
                (assigned != from && current.is_none_or(|c| c == assigned)).then_some(assigned)
            }
            TaskStep::Illegal { from, to } => {
                (assigned == from && !is_legal(from, to)).then_some(assigned)
            }
        }
    }
}
