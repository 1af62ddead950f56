//! The agent inside a task's sandbox, as the control plane knows it: registered for one
//! attempt, last heard from at some time, using so much of its sandbox. READY means the agent
//! of the current attempt registered (DESIGN §5, "The KVM runtime"), on every runtime that
//! runs one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the agent last reported of its sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxUsage {
    /// CPU time of every process in the sandbox, user and system, in microseconds.
    pub cpu_usec: u64,
    /// Resident memory of every process in the sandbox.
    pub memory_bytes: u64,
    /// Bytes of the task's files (inbox and outbox) as the agent counted them.
    pub disk_bytes: u64,
}

/// One task's agent: the attempt it runs in and when it registered and last checked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSession {
    pub attempt: u32,
    pub registered_at_ms: u64,
    pub last_seen_ms: u64,
    pub check_ins: u64,
    pub usage: Option<SandboxUsage>,
    /// The launcher's exit code, once the agent reported it (RUNNING or COMPLETING only).
    pub exit_code: Option<i32>,
}
