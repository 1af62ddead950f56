//! Worker nodes as the control plane sees them.

use std::collections::{BTreeMap, BTreeSet};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{TaskId, WorkerId};
use crate::manifest::RuntimeKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerStatus {
    Alive,
    /// Missed heartbeats past the worker TTL; its tasks were re-queued or failed.
    Lost,
    /// An operator decommissioned it; its leases were reaped on the operator's word.
    Decommissioned,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Worker {
    pub id: WorkerId,
    pub address: String,
    pub runtimes: BTreeSet<RuntimeKind>,
    pub capacity: u32,
    pub labels: BTreeMap<String, String>,
    pub status: WorkerStatus,
    pub registered_at_ms: u64,
    pub last_heartbeat_ms: u64,
    /// Silence longer than this makes the worker lost (three heartbeat intervals).
    pub ttl_ms: u64,
    /// Tasks assigned to this worker that have not ended.
    pub tasks: BTreeSet<TaskId>,
}

impl Worker {
    pub fn free_slots(&self) -> u32 {
        self.capacity
            .saturating_sub(u32::try_from(self.tasks.len()).unwrap_or(u32::MAX))
    }

    /// True once the worker has been silent past its TTL.
    pub fn is_silent(&self, now_ms: u64) -> bool {
        now_ms >= self.last_heartbeat_ms.saturating_add(self.ttl_ms)
    }

    /// True once the worker has been silent past its TTL counted from the later of its last
    /// heartbeat and `heard_from_ms` (a leader's term start: it could not be heard before).
    pub fn is_silent_since(&self, now_ms: u64, heard_from_ms: u64) -> bool {
        now_ms
            >= self
                .last_heartbeat_ms
                .max(heard_from_ms)
                .saturating_add(self.ttl_ms)
    }

    /// Alive and its heartbeat fresh as of `now_ms`.
    pub fn is_live(&self, now_ms: u64) -> bool {
        self.status == WorkerStatus::Alive && !self.is_silent(now_ms)
    }

    /// Schedulable: live and not full.
    pub fn accepts_work(&self, now_ms: u64) -> bool {
        self.is_live(now_ms) && self.free_slots() > 0
    }
}
