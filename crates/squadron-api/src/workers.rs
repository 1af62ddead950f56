//! Workers: registration and an operator's decommission.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::ids::WorkerId;
use squadron_core::manifest::RuntimeKind;
use squadron_core::worker_policy::WorkerPolicy;

/// Heartbeat interval of a registration that names none.
pub const HEARTBEAT_INTERVAL_MS_DEFAULT: u64 = 30_000;

/// `POST /api/v1/workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RegisterWorker {
    pub worker: WorkerId,
    pub address: String,
    pub runtimes: Vec<RuntimeKind>,
    pub capacity: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// [`HEARTBEAT_INTERVAL_MS_DEFAULT`] when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
    /// What the worker agrees to run, set with the registration in one entry. Absent: the
    /// policy already stated, if any, stays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<WorkerPolicy>,
}

/// `POST /api/v1/workers/{id}/decommission`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Decommission {
    pub operator: String,
    pub reason: String,
}
