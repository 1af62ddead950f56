//! Commands of the leader's own upkeep.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The sweep a leader proposes (in place of the older `Sweep`, which judged workers from their
/// last heartbeat alone): fences expired leases, marks silent workers lost, prunes records.
///
/// A worker's heartbeats go to the leader, so while an election runs and the worker finds the
/// new leader, it cannot be heard; a worker is therefore judged silent only from the later of
/// its last heartbeat and the start of the proposing leader's term (Nomad's grace after a
/// leader change). Leases get no such grace: their holders fence themselves on their own
/// clock, so the control plane fencing at expiry stays safe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeaderSweep {
    /// The cluster time at which the proposing leader first saw itself lead its term.
    pub term_started_ms: u64,
}

/// The retention of ended tasks a leader proposes with its node's policy
/// (`retention.terminal_tasks`): prunes tasks that ended more than `age_ms_max` ago, and the
/// oldest-ended COMPLETED, FAILED and CANCELLED tasks while more than `count_max` of them are
/// held. FAILED_PRESERVED tasks go by age only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct PruneTasks {
    pub age_ms_max: u64,
    pub count_max: u64,
}
