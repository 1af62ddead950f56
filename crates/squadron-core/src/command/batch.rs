//! Many commands in one log entry.

use serde::{Deserialize, Serialize};

use super::Command;
use crate::access::Subject;
use crate::ids::IdempotencyKey;

/// Commands proposed concurrently, carried in one log entry and applied in order, each exactly
/// as if it had been an entry of its own (its own idempotency key, the batch's time). One entry
/// instead of many is what lets a busy leader pass its per-entry cost. Proposed by the leader's
/// batcher only; a batch never nests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    pub commands: Vec<BatchedCommand>,
}

/// One command of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchedCommand {
    pub idempotency_key: Option<IdempotencyKey>,
    /// The caller of this command (the batch's envelope names the proposing node). Absent in
    /// JSON written before subjects: such a command is a legacy one.
    #[serde(default = "legacy")]
    pub subject: Subject,
    pub command: Command,
}

fn legacy() -> Subject {
    Subject::Legacy
}
