//! Who asked for a command. Every log entry records its authenticated subject (DESIGN §5), so
//! the audit trail and the "only for itself" rules below read the same value on every replica.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::operator_token::TokenId;
use crate::ids::{Generation, ProfileId, TaskId, WorkerId};

/// What an agent certificate is bound to.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum AgentIdentity {
    /// The agent of one task (`agent/task-{id}`).
    Task(TaskId),
    /// One generation of a profile's writer (`agent/profile-{id}-g{generation}`).
    ProfileGeneration {
        profile: ProfileId,
        generation: Generation,
    },
}

/// An identity that holds certificates recorded in the state (nodes' certificates are made
/// offline by `squadron init` and are not).
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Identity {
    Worker(WorkerId),
    Agent(AgentIdentity),
}

/// The caller of a command, as its edge authenticated it.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Subject {
    /// A leader loop (sweep, scheduler) or the cluster's own initialisation.
    System,
    /// An entry written before subjects were recorded (log encoding 1). It is applied exactly
    /// as it was then, so replaying an old log gives the state it gave.
    Legacy,
    /// A control node acting on its own (never on behalf of a caller).
    Node(u64),
    /// An operator's bearer token.
    Operator(TokenId),
    Worker(WorkerId),
    Agent(AgentIdentity),
}

impl Subject {
    /// The worker this subject is, if it is one.
    pub fn worker(&self) -> Option<&WorkerId> {
        match self {
            Subject::Worker(w) => Some(w),
            _ => None,
        }
    }
}

impl fmt::Display for AgentIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentIdentity::Task(t) => write!(f, "task-{t}"),
            AgentIdentity::ProfileGeneration {
                profile,
                generation,
            } => write!(f, "profile-{profile}-g{}", generation.get()),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Worker(w) => write!(f, "worker/{w}"),
            Identity::Agent(a) => write!(f, "agent/{a}"),
        }
    }
}

impl fmt::Display for Subject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Subject::System => f.write_str("system"),
            Subject::Legacy => f.write_str("legacy"),
            Subject::Node(id) => write!(f, "node/{id}"),
            Subject::Operator(t) => write!(f, "operator/{t}"),
            Subject::Worker(w) => write!(f, "worker/{w}"),
            Subject::Agent(a) => write!(f, "agent/{a}"),
        }
    }
}
