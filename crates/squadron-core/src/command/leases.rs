//! Commands on runtime leases, takeovers, reap evidence and capsule commits.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::capsule::CapsuleDraft;
use crate::ids::{Generation, LeaseId, ProfileId, WorkerId};
use crate::lease::{FenceReason, FencingToken, LeaseHolder, ReapEvidence};
use crate::provider::Provider;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AcquireLease {
    pub profile: ProfileId,
    pub expected_generation: Generation,
    pub provider: Provider,
    pub holder: LeaseHolder,
    pub ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RenewLease {
    pub fence: FencingToken,
    pub ttl_ms: u64,
}

/// One command renews every lease a worker holds, so heartbeats of many agents cost one Raft
/// entry per worker rather than one each.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RenewLeases {
    pub worker: WorkerId,
    pub fences: Vec<FencingToken>,
    pub ttl_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReleaseLease {
    pub fence: FencingToken,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct FenceLease {
    pub fence: FencingToken,
    pub reason: FenceReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RecordReapEvidence {
    pub profile: ProfileId,
    pub evidence: ReapEvidence,
}

/// INV-8 in one command: commit and verify the capsule, fence the old lease, grant the next
/// generation. With `old_reap_evidence` the old lease is reaped at once and its slot passes to
/// the new one; without it the old lease keeps its slot until evidence arrives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GracefulTakeover {
    pub fence: FencingToken,
    pub capsule: CapsuleDraft,
    pub next: NextHolder,
    pub old_reap_evidence: Option<ReapEvidence>,
}

/// INV-9: only after expiry; needs reap evidence for that exact generation, given here or
/// recorded before.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CrashTakeover {
    pub profile: ProfileId,
    pub lease: LeaseId,
    pub generation: Generation,
    pub next: NextHolder,
    pub reap_evidence: Option<ReapEvidence>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CommitCapsule {
    pub fence: FencingToken,
    pub capsule: CapsuleDraft,
}

/// One grant request inside a takeover: the provider to start and who holds the new lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NextHolder {
    pub provider: Provider,
    pub holder: LeaseHolder,
    pub ttl_ms: u64,
}
