//! Durable agent profiles: the identity that outlives every provider process.

use std::collections::{BTreeSet, VecDeque};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::capsule::ContinuityCapsule;
use crate::ids::{
    Digest, Generation, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, SkillId, TenantId,
};
use crate::provider::Provider;

/// What a profile needs to launch; versioned so a launch can name the manifest it was admitted
/// under.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapabilityManifest {
    pub version: u64,
    pub required_skills: BTreeSet<SkillId>,
    pub mcp_servers: BTreeSet<McpServerId>,
}

/// The head of a profile's capsule chain (INV-7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CapsuleHead {
    pub sequence: u64,
    pub digest: Digest,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentProfile {
    pub id: ProfileId,
    pub tenant: TenantId,
    pub project: ProjectId,
    pub key: ProfileKey,
    /// Preferred provider first (for example codex, then claude).
    pub providers: Vec<Provider>,
    /// The profile's own worktree, relative to the project sandbox root.
    pub worktree: String,
    /// The stable authorization subject (`profile:{id}`), used by relation tuples (INV-14).
    pub subject: String,
    pub context_ref: Option<String>,
    pub capabilities: CapabilityManifest,
    /// Raised by exactly one on each successful acquisition (INV-3).
    pub generation: Generation,
    /// The one lease of this profile that is not terminal, if any (INV-4).
    pub live_lease: Option<LeaseId>,
    /// Fenced leases whose processes are not yet proved gone; each still holds a slot.
    pub fenced_unreaped: BTreeSet<LeaseId>,
    /// Recent terminal leases, oldest first; older ones are pruned from the state.
    pub past_leases: VecDeque<LeaseId>,
    pub capsule_head: Option<CapsuleHead>,
    /// The most recent capsules, oldest first; the head is always the last one.
    pub capsules: VecDeque<ContinuityCapsule>,
    pub created_at_ms: u64,
}

impl AgentProfile {
    pub fn subject_for(id: ProfileId) -> String {
        format!("profile:{id}")
    }
}
