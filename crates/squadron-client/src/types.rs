//! Request bodies and the response shapes the REST API defines itself (the domain values —
//! `Outcome`, `Task`, `AgentProfile`, `RuntimeLease`, … — come from `squadron-core`).
//!
//! Field names are the wire names of the server's bodies (`crates/squadron-server/src/rest`).
//! Bodies that moved to `squadron-api` are re-exported from there.

pub use squadron_api::{
    AddLearner, AttachSandbox, ClusterStatus, CreateProfile, CreateProject, Decommission,
    McpDecision, MemberView, MembershipChanged, ProjectSummary, PromoteVoter, RegisterWorker,
    ReportProgress, ReportTransition, SetCapabilities, TaskPage,
};

use serde::{Deserialize, Serialize};
use squadron_core::capsule::CapsuleDraft;
use squadron_core::command::NextHolder;
use squadron_core::ids::{Generation, LeaseId, ProfileId};
use squadron_core::lease::{FenceReason, FencingToken, LeaseHolder};
use squadron_core::mailbox::{MessageKind, MessageSender};
use squadron_core::provider::Provider;
use squadron_core::task::TaskState;

// --- leases ----------------------------------------------------------------------------------

/// `POST /api/v1/profiles/{id}/leases`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcquireLease {
    pub expected_generation: Generation,
    pub provider: Provider,
    pub holder: LeaseHolder,
    pub ttl_ms: u64,
}

/// `POST /api/v1/leases/{id}/renew`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewLease {
    pub profile: ProfileId,
    pub generation: Generation,
    pub ttl_ms: u64,
}

/// `POST /api/v1/leases/{id}/release`: the profile and generation of the fencing triple (the
/// lease is in the path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseFence {
    pub profile: ProfileId,
    pub generation: Generation,
}

/// `POST /api/v1/leases/{id}/fence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FenceLease {
    pub profile: ProfileId,
    pub generation: Generation,
    pub reason: FenceReason,
}

/// `POST /api/v1/leases/{id}/evidence`: the worker's proof that the lease's cgroup is empty.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordEvidence {
    pub profile: ProfileId,
    pub generation: Generation,
    pub cgroup: String,
    pub populated: bool,
    pub observed_at_ms: u64,
}

/// `POST /api/v1/workers/{id}/renewals`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewLeases {
    pub fences: Vec<FencingToken>,
    pub ttl_ms: u64,
}

/// Reap evidence inside a takeover (it names its lease through the takeover).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakeoverEvidence {
    pub cgroup: String,
    pub populated: bool,
    pub observed_at_ms: u64,
}

/// A graceful takeover: commit a capsule, fence the current lease, grant the next holder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GracefulTakeover {
    pub lease: LeaseId,
    pub generation: Generation,
    pub capsule: CapsuleDraft,
    pub next: NextHolder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_reap_evidence: Option<TakeoverEvidence>,
}

/// A crash takeover: after expiry, with reap evidence for the dead generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CrashTakeover {
    pub lease: LeaseId,
    pub generation: Generation,
    pub next: NextHolder,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reap_evidence: Option<TakeoverEvidence>,
}

/// `POST /api/v1/profiles/{id}/takeover` (tagged by `kind`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Takeover {
    Graceful(Box<GracefulTakeover>),
    Crash(CrashTakeover),
}

/// `POST /api/v1/profiles/{id}/capsules`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitCapsule {
    pub lease: LeaseId,
    pub generation: Generation,
    pub capsule: CapsuleDraft,
}

/// `POST /api/v1/profiles/{id}/mailbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PostMessage {
    pub sender: MessageSender,
    pub kind: MessageKind,
    pub body: String,
}

/// `POST /api/v1/profiles/{id}/mailbox/ack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckMessages {
    pub lease: LeaseId,
    pub generation: Generation,
    pub through_seq: u64,
}

// --- tasks -----------------------------------------------------------------------------------

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskQuery {
    pub state: Option<TaskState>,
    pub after: Option<u64>,
    pub limit: Option<usize>,
}

/// One entry of `GET /api/v1/tasks/{id}/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactEntry {
    /// Relative to the task's artifacts directory.
    pub name: String,
    pub size: u64,
}
