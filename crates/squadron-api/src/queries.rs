//! The query strings of the read routes (and of a task's cancel and logs). Unknown parameters
//! are refused, as unknown body fields are.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::task::TaskState;

/// Read consistency a caller asks for (`?consistency=linearizable|stale`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// ReadIndex through the leader: the read sees every write acknowledged before it began.
    #[default]
    Linearizable,
    /// The answering node's applied state, possibly behind; answers without a leader.
    Stale,
}

/// `?consistency=…`, the query of most reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConsistencyQuery {
    #[serde(default)]
    pub consistency: Consistency,
}

/// `GET /api/v1/tasks`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskListQuery {
    /// Kept as text so a bad state is refused naming `state` and listing the states.
    #[serde(default)]
    #[schemars(with = "Option<TaskState>")]
    pub state: Option<String>,
    /// Tasks with ids above this one (the previous page's `next_after`).
    #[serde(default)]
    pub after: Option<u64>,
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only the tasks this task's agent submitted (its children), in id order. Kept as text
    /// like `state`, so a bad id is refused naming `parent`.
    #[serde(default)]
    #[schemars(with = "Option<squadron_core::ids::TaskId>")]
    pub parent: Option<String>,
    #[serde(default)]
    pub consistency: Consistency,
}

/// `GET /api/v1/audit`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditQuery {
    /// Records with sequence numbers above this one.
    #[serde(default)]
    pub after: u64,
    #[serde(default)]
    pub limit: Option<usize>,
    #[serde(default)]
    pub consistency: Consistency,
}

/// `DELETE /api/v1/tasks/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelQuery {
    /// Why, for the task's record and the worker.
    #[serde(default)]
    pub reason: Option<String>,
}

/// Which of a task's output files a log read returns.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    #[default]
    Stdout,
    Stderr,
    Events,
    /// All three, interleaved as NDJSON frames; only with `follow=true`.
    All,
}

/// `GET /api/v1/tasks/{id}/logs` (relayed as is to the worker's output server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LogQuery {
    #[serde(default)]
    pub stream: LogStream,
    /// Start at this byte.
    #[serde(default)]
    pub offset: Option<u64>,
    /// Only the last this many lines (at most the worker's `TAIL_LINES_MAX`, 10,000).
    #[serde(default)]
    pub tail: Option<u64>,
    /// Keep the answer open and stream what is appended.
    #[serde(default)]
    pub follow: bool,
}
