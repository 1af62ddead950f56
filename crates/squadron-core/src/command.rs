//! Commands: the only way the replicated state changes. Each travels in a [`CommandEnvelope`]
//! that carries the leader-stamped time and an optional idempotency key.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::capsule::CapsuleDraft;
use crate::ids::{
    Generation, IdempotencyKey, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, SkillId,
    TaskId, TenantId, WorkerId,
};
use crate::lease::{FenceReason, FencingToken, LeaseHolder, ReapEvidence};
use crate::mailbox::{MessageKind, MessageSender};
use crate::manifest::{RuntimeKind, TaskSpec};
use crate::provider::Provider;
use crate::task::TaskState;

/// A command as the log stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEnvelope {
    /// Leader-stamped wall time at proposal. Apply uses `max(state.clock_ms, at_ms)`.
    pub at_ms: u64,
    /// When set, the command is applied at most once (INV-11).
    pub idempotency_key: Option<IdempotencyKey>,
    pub command: Command,
}

/// One grant request inside a takeover: the provider to start and who holds the new lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NextHolder {
    pub provider: Provider,
    pub holder: LeaseHolder,
    pub ttl_ms: u64,
}

/// What a worker reports with a transition.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(default)]
pub struct TransitionDetail {
    /// Required when leaving RUNNING for COMPLETING.
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// Artifact names collected so far (COMPLETING onwards).
    pub artifacts: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assignment {
    pub task: TaskId,
    pub worker: WorkerId,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    // --- projects and profiles -------------------------------------------------------------
    CreateProject {
        tenant: TenantId,
        project: ProjectId,
        max_profiles: Option<u32>,
        max_active: Option<u32>,
    },
    AttachSandbox {
        tenant: TenantId,
        project: ProjectId,
        worker: WorkerId,
        runtime: RuntimeKind,
        sandbox_ref: String,
    },
    DetachSandbox {
        tenant: TenantId,
        project: ProjectId,
        sandbox_ref: String,
    },
    CreateProfile {
        tenant: TenantId,
        project: ProjectId,
        key: ProfileKey,
        providers: Vec<Provider>,
        context_ref: Option<String>,
    },
    SetCapabilityManifest {
        profile: ProfileId,
        expected_version: u64,
        required_skills: Vec<SkillId>,
        mcp_servers: Vec<McpServerId>,
    },
    GrantMcpUse {
        profile: ProfileId,
        server: McpServerId,
    },
    RevokeMcpUse {
        profile: ProfileId,
        server: McpServerId,
    },

    // --- runtime leases --------------------------------------------------------------------
    AcquireLease {
        profile: ProfileId,
        expected_generation: Generation,
        provider: Provider,
        holder: LeaseHolder,
        ttl_ms: u64,
    },
    RenewLease {
        fence: FencingToken,
        ttl_ms: u64,
    },
    /// One command renews every lease a worker holds, so heartbeats of many agents cost one
    /// Raft entry per worker rather than one each.
    RenewLeases {
        worker: WorkerId,
        fences: Vec<FencingToken>,
        ttl_ms: u64,
    },
    ReleaseLease {
        fence: FencingToken,
    },
    FenceLease {
        fence: FencingToken,
        reason: FenceReason,
    },
    RecordReapEvidence {
        profile: ProfileId,
        evidence: ReapEvidence,
    },
    /// INV-8 in one command: commit and verify the capsule, fence the old lease, grant the next
    /// generation. With `old_reap_evidence` the old lease is reaped at once and its slot passes
    /// to the new one; without it the old lease keeps its slot until evidence arrives.
    GracefulTakeover {
        fence: FencingToken,
        capsule: CapsuleDraft,
        next: NextHolder,
        old_reap_evidence: Option<ReapEvidence>,
    },
    /// INV-9: only after expiry; needs reap evidence for that exact generation, given here or
    /// recorded before.
    CrashTakeover {
        profile: ProfileId,
        lease: LeaseId,
        generation: Generation,
        next: NextHolder,
        reap_evidence: Option<ReapEvidence>,
    },
    CommitCapsule {
        fence: FencingToken,
        capsule: CapsuleDraft,
    },

    // --- mailboxes -------------------------------------------------------------------------
    PostMessage {
        to: ProfileId,
        sender: MessageSender,
        kind: MessageKind,
        body: String,
    },
    AckMessages {
        fence: FencingToken,
        through_seq: u64,
    },

    // --- tasks -----------------------------------------------------------------------------
    SubmitTask {
        spec: Box<TaskSpec>,
    },
    /// Proposed by the leader's scheduler; each assignment is re-checked at apply.
    AssignTasks {
        assignments: Vec<Assignment>,
    },
    ReportTransition {
        task: TaskId,
        worker: WorkerId,
        attempt: u32,
        from: TaskState,
        to: TaskState,
        detail: TransitionDetail,
    },
    /// Absolute counters; they may only grow.
    ReportProgress {
        task: TaskId,
        worker: WorkerId,
        attempt: u32,
        stdout_bytes: u64,
        stderr_bytes: u64,
        lines: u64,
        events: u64,
    },
    CancelTask {
        task: TaskId,
        reason: String,
    },

    // --- workers ---------------------------------------------------------------------------
    RegisterWorker {
        worker: WorkerId,
        address: String,
        runtimes: Vec<RuntimeKind>,
        capacity: u32,
        labels: BTreeMap<String, String>,
        /// The worker is lost after three intervals without a heartbeat.
        heartbeat_interval_ms: u64,
    },
    WorkerHeartbeat {
        worker: WorkerId,
    },
    /// An operator's explicit, audited decision that a worker and everything it ran are gone.
    /// Its slot-holding leases are fenced and reaped on the operator's word.
    DecommissionWorker {
        worker: WorkerId,
        operator: String,
        reason: String,
    },

    // --- maintenance -----------------------------------------------------------------------
    /// Proposed by the leader: fences expired leases, marks silent workers lost and handles
    /// their tasks, prunes idempotency records.
    Sweep,

    // --- batching ------------------------------------------------------------------------
    /// Commands proposed concurrently, carried in one log entry and applied in order, each
    /// exactly as if it had been an entry of its own (its own idempotency key, the batch's
    /// time). One entry instead of many is what lets a busy leader pass its per-entry cost.
    /// Proposed by the leader's batcher only; a batch never nests.
    Batch {
        commands: Vec<BatchedCommand>,
    },
}

/// One command of a [`Command::Batch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchedCommand {
    pub idempotency_key: Option<IdempotencyKey>,
    pub command: Command,
}

impl Command {
    /// A short stable name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateProject { .. } => "create_project",
            Command::AttachSandbox { .. } => "attach_sandbox",
            Command::DetachSandbox { .. } => "detach_sandbox",
            Command::CreateProfile { .. } => "create_profile",
            Command::SetCapabilityManifest { .. } => "set_capability_manifest",
            Command::GrantMcpUse { .. } => "grant_mcp_use",
            Command::RevokeMcpUse { .. } => "revoke_mcp_use",
            Command::AcquireLease { .. } => "acquire_lease",
            Command::RenewLease { .. } => "renew_lease",
            Command::RenewLeases { .. } => "renew_leases",
            Command::ReleaseLease { .. } => "release_lease",
            Command::FenceLease { .. } => "fence_lease",
            Command::RecordReapEvidence { .. } => "record_reap_evidence",
            Command::GracefulTakeover { .. } => "graceful_takeover",
            Command::CrashTakeover { .. } => "crash_takeover",
            Command::CommitCapsule { .. } => "commit_capsule",
            Command::PostMessage { .. } => "post_message",
            Command::AckMessages { .. } => "ack_messages",
            Command::SubmitTask { .. } => "submit_task",
            Command::AssignTasks { .. } => "assign_tasks",
            Command::ReportTransition { .. } => "report_transition",
            Command::ReportProgress { .. } => "report_progress",
            Command::CancelTask { .. } => "cancel_task",
            Command::RegisterWorker { .. } => "register_worker",
            Command::WorkerHeartbeat { .. } => "worker_heartbeat",
            Command::DecommissionWorker { .. } => "decommission_worker",
            Command::Sweep => "sweep",
            Command::Batch { .. } => "batch",
        }
    }
}
