//! Commands: the only way the replicated state changes. Each travels in a [`CommandEnvelope`]
//! that carries the leader-stamped time and an optional idempotency key.
//!
//! Every variant holds a named struct from the file of its area, so a request shape is written
//! once and handlers take it whole. An externally tagged newtype variant holding a struct
//! encodes exactly as the struct variant it replaced did, in serde_json and in bincode; the
//! golden test `tests/encoding_goldens.rs` pins both, and the fingerprints the idempotency
//! ledger keeps.

mod batch;
mod leases;
mod mailboxes;
mod projects;
mod tasks;
mod workers;

use serde::{Deserialize, Serialize};

use crate::ids::IdempotencyKey;

pub use batch::{Batch, BatchedCommand};
pub use leases::{
    AcquireLease, CommitCapsule, CrashTakeover, FenceLease, GracefulTakeover, NextHolder,
    RecordReapEvidence, ReleaseLease, RenewLease, RenewLeases,
};
pub use mailboxes::{AckMessages, PostMessage};
pub use projects::{
    AttachSandbox, CreateProfile, CreateProject, DetachSandbox, GrantMcpUse, RevokeMcpUse,
    SetCapabilityManifest,
};
pub use tasks::{
    AssignTasks, Assignment, CancelTask, ReportProgress, ReportTransition, SubmitTask,
    TransitionDetail,
};
pub use workers::{DecommissionWorker, RegisterWorker, WorkerHeartbeat};

/// A command as the log stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEnvelope {
    /// Leader-stamped wall time at proposal. Apply uses `max(state.clock_ms, at_ms)`.
    pub at_ms: u64,
    /// When set, the command is applied at most once (INV-11).
    pub idempotency_key: Option<IdempotencyKey>,
    pub command: Command,
}

/// The variants' order is part of the log encoding (bincode writes the variant index): add new
/// ones at the end, never reorder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Command {
    // --- projects and profiles -------------------------------------------------------------
    CreateProject(CreateProject),
    AttachSandbox(AttachSandbox),
    DetachSandbox(DetachSandbox),
    CreateProfile(CreateProfile),
    SetCapabilityManifest(SetCapabilityManifest),
    GrantMcpUse(GrantMcpUse),
    RevokeMcpUse(RevokeMcpUse),

    // --- runtime leases --------------------------------------------------------------------
    AcquireLease(AcquireLease),
    RenewLease(RenewLease),
    RenewLeases(RenewLeases),
    ReleaseLease(ReleaseLease),
    FenceLease(FenceLease),
    RecordReapEvidence(RecordReapEvidence),
    GracefulTakeover(GracefulTakeover),
    CrashTakeover(CrashTakeover),
    CommitCapsule(CommitCapsule),

    // --- mailboxes -------------------------------------------------------------------------
    PostMessage(PostMessage),
    AckMessages(AckMessages),

    // --- tasks -----------------------------------------------------------------------------
    SubmitTask(SubmitTask),
    AssignTasks(AssignTasks),
    ReportTransition(ReportTransition),
    ReportProgress(ReportProgress),
    CancelTask(CancelTask),

    // --- workers ---------------------------------------------------------------------------
    RegisterWorker(RegisterWorker),
    WorkerHeartbeat(WorkerHeartbeat),
    DecommissionWorker(DecommissionWorker),

    // --- maintenance -----------------------------------------------------------------------
    /// Proposed by the leader: fences expired leases, marks silent workers lost and handles
    /// their tasks, prunes idempotency records.
    Sweep,

    // --- batching ------------------------------------------------------------------------
    Batch(Batch),
}

impl Command {
    /// A short stable name, for metrics and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Command::CreateProject(_) => "create_project",
            Command::AttachSandbox(_) => "attach_sandbox",
            Command::DetachSandbox(_) => "detach_sandbox",
            Command::CreateProfile(_) => "create_profile",
            Command::SetCapabilityManifest(_) => "set_capability_manifest",
            Command::GrantMcpUse(_) => "grant_mcp_use",
            Command::RevokeMcpUse(_) => "revoke_mcp_use",
            Command::AcquireLease(_) => "acquire_lease",
            Command::RenewLease(_) => "renew_lease",
            Command::RenewLeases(_) => "renew_leases",
            Command::ReleaseLease(_) => "release_lease",
            Command::FenceLease(_) => "fence_lease",
            Command::RecordReapEvidence(_) => "record_reap_evidence",
            Command::GracefulTakeover(_) => "graceful_takeover",
            Command::CrashTakeover(_) => "crash_takeover",
            Command::CommitCapsule(_) => "commit_capsule",
            Command::PostMessage(_) => "post_message",
            Command::AckMessages(_) => "ack_messages",
            Command::SubmitTask(_) => "submit_task",
            Command::AssignTasks(_) => "assign_tasks",
            Command::ReportTransition(_) => "report_transition",
            Command::ReportProgress(_) => "report_progress",
            Command::CancelTask(_) => "cancel_task",
            Command::RegisterWorker(_) => "register_worker",
            Command::WorkerHeartbeat(_) => "worker_heartbeat",
            Command::DecommissionWorker(_) => "decommission_worker",
            Command::Sweep => "sweep",
            Command::Batch(_) => "batch",
        }
    }
}
