//! Fenced operations' bodies: leases, renewals, reap evidence, takeovers, capsules and
//! mailboxes. Every request body refuses unknown fields.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::capsule::CapsuleDraft;
use squadron_core::command::NextHolder;
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::lease::{FenceReason, FencingToken, LeaseHolder};
use squadron_core::mailbox::{MessageKind, MessageSender};
use squadron_core::provider::Provider;

/// `POST /api/v1/profiles/{id}/leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireLease {
    pub expected_generation: Generation,
    pub provider: Provider,
    pub holder: LeaseHolder,
    pub ttl_ms: u64,
}

/// `POST /api/v1/leases/{id}/renew`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewLease {
    pub profile: ProfileId,
    pub generation: Generation,
    pub ttl_ms: u64,
}

/// `POST /api/v1/leases/{id}/release`: the profile and generation of the fencing triple (the
/// lease is in the path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseFence {
    pub profile: ProfileId,
    pub generation: Generation,
}

/// `POST /api/v1/leases/{id}/fence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FenceLease {
    pub profile: ProfileId,
    pub generation: Generation,
    pub reason: FenceReason,
}

/// `POST /api/v1/leases/{id}/evidence`: the worker's proof that the lease's cgroup is empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordEvidence {
    pub profile: ProfileId,
    pub generation: Generation,
    pub cgroup: String,
    pub populated: bool,
    pub observed_at_ms: u64,
}

/// `POST /api/v1/workers/{id}/renewals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewLeases {
    pub fences: Vec<FencingToken>,
    pub ttl_ms: u64,
}

/// Reap evidence inside a takeover (it names its lease through the takeover).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeoverEvidence {
    pub cgroup: String,
    pub populated: bool,
    pub observed_at_ms: u64,
}

/// A graceful takeover: commit a capsule, fence the current lease, grant the next holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GracefulTakeover {
    pub lease: LeaseId,
    pub generation: Generation,
    pub capsule: CapsuleDraft,
    pub next: NextHolder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_reap_evidence: Option<TakeoverEvidence>,
}

/// A crash takeover: after expiry, with reap evidence for the dead generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CrashTakeover {
    pub lease: LeaseId,
    pub generation: Generation,
    pub next: NextHolder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap_evidence: Option<TakeoverEvidence>,
}

/// `POST /api/v1/profiles/{id}/takeover` (tagged by `kind`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Takeover {
    Graceful(Box<GracefulTakeover>),
    Crash(CrashTakeover),
}

/// `POST /api/v1/profiles/{id}/capsules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitCapsule {
    pub lease: LeaseId,
    pub generation: Generation,
    pub capsule: CapsuleDraft,
}

/// `POST /api/v1/profiles/{id}/mailbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostMessage {
    pub sender: MessageSender,
    pub kind: MessageKind,
    pub body: String,
}

/// `POST /api/v1/profiles/{id}/mailbox/ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckMessages {
    pub lease: LeaseId,
    pub generation: Generation,
    pub through_seq: u64,
}
