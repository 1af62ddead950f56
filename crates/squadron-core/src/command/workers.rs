//! Commands on workers.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::WorkerId;
use crate::manifest::RuntimeKind;
use crate::worker_policy::WorkerPolicy;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RegisterWorker {
    pub worker: WorkerId,
    pub address: String,
    pub runtimes: Vec<RuntimeKind>,
    pub capacity: u32,
    pub labels: BTreeMap<String, String>,
    /// The worker is lost after three intervals without a heartbeat.
    pub heartbeat_interval_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerHeartbeat {
    pub worker: WorkerId,
}

/// A registration and the policy the worker states, in one entry: a worker is never alive
/// without its policy, so nothing its policy refuses is placed on it in between (and a worker
/// restarted with another policy is never held to its old one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RegisterWorkerWithPolicy {
    pub registration: RegisterWorker,
    pub policy: WorkerPolicy,
}

/// A worker states what it agrees to run (sent after registering, and again whenever it
/// restarts with another policy).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SetWorkerPolicy {
    pub worker: WorkerId,
    pub policy: WorkerPolicy,
}

/// An operator's explicit, audited decision that a worker and everything it ran are gone. Its
/// slot-holding leases are fenced and reaped on the operator's word.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct DecommissionWorker {
    pub worker: WorkerId,
    pub operator: String,
    pub reason: String,
}
