//! Projects and their single sandbox.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ids::{ProfileId, ProjectId, TenantId, WorkerId};
use crate::manifest::RuntimeKind;
use crate::roster::Roster;

/// The one live sandbox of a project (INV-1). Every provider process of every profile of the
/// project runs inside it; profiles never own or fork one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProjectSandbox {
    pub worker: WorkerId,
    pub runtime: RuntimeKind,
    /// The runtime's handle (container id, cgroup root, domain name).
    pub sandbox_ref: String,
    pub attached_at_ms: u64,
}

/// Counters for the release evidence; they change only on successful commands.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProjectStats {
    pub leases_granted: u64,
    pub peak_slots_held: u32,
    pub takeovers_graceful: u64,
    pub takeovers_crash: u64,
    pub roster_deliveries: u64,
    pub sandboxes_attached: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Project {
    pub tenant: TenantId,
    pub project: ProjectId,
    /// INV-2 bound on profiles.
    pub max_profiles: u32,
    /// INV-5 bound on slot-holding leases.
    pub max_active: u32,
    pub created_at_ms: u64,
    /// Profiles of this project in creation order.
    pub profiles: Vec<ProfileId>,
    /// Leases of this project that hold a slot right now (Active or Fenced). Kept as a counter so
    /// admission is O(1); the invariant checker recounts it from the leases.
    pub slots_held: u32,
    pub sandbox: Option<ProjectSandbox>,
    pub roster: Roster,
    pub stats: ProjectStats,
}
