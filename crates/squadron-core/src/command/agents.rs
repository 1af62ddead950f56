//! What an operator asks of the worker running a profile's provider. The worker's own
//! commands (lease, takeover, evidence) follow under its subject; this one, recorded by the
//! node before it relays the request, is how the audit names who asked.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::agent_session::SandboxUsage;
use crate::ids::{ProfileId, TaskId, WorkerId};

/// An operator's request, relayed to `worker`, for `operation` on `profile`'s provider.
/// It changes nothing but the audit record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RequestAgentOperation {
    pub profile: ProfileId,
    pub operation: AgentOperation,
    pub worker: WorkerId,
}

/// The agent facade's operations (`/api/v1/profiles/{id}/agent/…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentOperation {
    Launch,
    Takeover,
    Stop,
    Reap,
}

impl AgentOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentOperation::Launch => "launch",
            AgentOperation::Takeover => "takeover",
            AgentOperation::Stop => "stop",
            AgentOperation::Reap => "reap",
        }
    }
}

/// The agent of a task's sandbox checks in: the first time it registers (the worker reports
/// READY once it sees the registration), then it heartbeats with what its sandbox uses. Only
/// that task's agent certificate may send it, for the task's current attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentCheckIn {
    pub task: TaskId,
    pub attempt: u32,
    pub usage: Option<SandboxUsage>,
    /// The provider launcher's exit code (128 + n for signal n), on the agent's last
    /// check-in once the launcher ended: the runtime's own view for sandboxes that give none
    /// (a VM).
    pub exit_code: Option<i32>,
}
