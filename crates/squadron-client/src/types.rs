//! Request bodies and the response shapes the REST API defines itself (the domain values —
//! `Outcome`, `Task`, `AgentProfile`, `RuntimeLease`, … — come from `squadron-core`).
//!
//! Field names are the wire names of the server's bodies (`crates/squadron-server/src/rest`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use squadron_core::capsule::CapsuleDraft;
use squadron_core::command::{NextHolder, TransitionDetail};
use squadron_core::ids::{
    Generation, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, SkillId, TenantId, WorkerId,
};
use squadron_core::lease::{FenceReason, FencingToken, LeaseHolder};
use squadron_core::mailbox::{MessageKind, MessageSender};
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;
use squadron_core::task::{Task, TaskState};

// --- projects and profiles -----------------------------------------------------------------

/// `POST /api/v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateProject {
    pub tenant: TenantId,
    pub project: ProjectId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_profiles: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active: Option<u32>,
}

/// One row of `GET /api/v1/projects`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProjectSummary {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub profiles: usize,
    pub slots_held: u32,
    pub max_active: u32,
    pub sandbox: Option<String>,
}

/// `POST /api/v1/projects/{tenant}/{project}/sandbox`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttachSandbox {
    pub worker: WorkerId,
    pub runtime: RuntimeKind,
    pub sandbox_ref: String,
}

/// `POST /api/v1/projects/{tenant}/{project}/profiles`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateProfile {
    pub key: ProfileKey,
    pub providers: Vec<Provider>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_ref: Option<String>,
}

/// `PUT /api/v1/profiles/{id}/capabilities`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetCapabilities {
    pub expected_version: u64,
    #[serde(default)]
    pub required_skills: Vec<SkillId>,
    #[serde(default)]
    pub mcp_servers: Vec<McpServerId>,
}

/// The answer of `GET /api/v1/profiles/{id}/mcp/{server}` when the use is allowed (a refusal
/// is a `permission_denied` error).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpDecision {
    pub subject: String,
    pub server: McpServerId,
    pub allowed: bool,
}

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

/// `GET /api/v1/tasks`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPage {
    pub tasks: Vec<Task>,
    /// Pass as `after` to get the next page; absent on the last page.
    #[serde(default)]
    pub next_after: Option<u64>,
}

/// Filters of `GET /api/v1/tasks`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TaskQuery {
    pub state: Option<TaskState>,
    pub after: Option<u64>,
    pub limit: Option<usize>,
}

/// `POST /api/v1/tasks/{id}/transitions`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportTransition {
    pub worker: WorkerId,
    pub attempt: u32,
    pub from: TaskState,
    pub to: TaskState,
    #[serde(default)]
    pub detail: TransitionDetail,
}

/// `POST /api/v1/tasks/{id}/progress`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportProgress {
    pub worker: WorkerId,
    pub attempt: u32,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    pub lines: u64,
    pub events: u64,
}

// --- workers ---------------------------------------------------------------------------------

/// `POST /api/v1/workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterWorker {
    pub worker: WorkerId,
    pub address: String,
    pub runtimes: Vec<RuntimeKind>,
    pub capacity: u32,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
}

/// `POST /api/v1/workers/{id}/decommission`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decommission {
    pub operator: String,
    pub reason: String,
}

// --- cluster ---------------------------------------------------------------------------------

/// One member in a node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberView {
    pub id: u64,
    /// `host:port` of the member's REST API.
    pub rest: String,
    pub grpc: String,
    /// `host:port` of the member's peer listener (absent from nodes older than it).
    #[serde(default)]
    pub peer: String,
    pub voter: bool,
}

/// `GET /api/v1/cluster/status`: one node's own view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node_id: u64,
    pub role: String,
    pub leader: Option<u64>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub applied: Option<u64>,
    #[serde(default)]
    pub snapshot: Option<u64>,
    #[serde(default)]
    pub purged: Option<u64>,
    pub digest: String,
    #[serde(default)]
    pub clock_ms: u64,
    pub members: Vec<MemberView>,
}

/// `POST /api/v1/cluster/learners`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddLearner {
    pub id: u64,
    pub rest: String,
    pub grpc: String,
    /// `host:port` of the new node's peer listener.
    pub peer: String,
}

/// `POST /api/v1/cluster/voters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromoteVoter {
    pub id: u64,
}

/// The answer of a membership change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipChanged {
    pub log_index: u64,
    pub members: Vec<MemberView>,
}

/// One entry of `GET /api/v1/tasks/{id}/artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactEntry {
    /// Relative to the task's artifacts directory.
    pub name: String,
    pub size: u64,
}
