//! Commands: the only way the replicated state changes. Each travels in a [`CommandEnvelope`]
//! that carries the leader-stamped time and an optional idempotency key.
//!
//! Every variant holds a named struct from the file of its area, so a request shape is written
//! once and handlers take it whole. An externally tagged newtype variant holding a struct
//! encodes exactly as the struct variant it replaced did, in serde_json and in bincode; the
//! golden test `tests/encoding_goldens.rs` pins both, and the fingerprints the idempotency
//! ledger keeps.

mod access;
mod agents;
mod batch;
mod credentials;
mod leases;
mod mailboxes;
mod maintenance;
mod projects;
mod tasks;
mod workers;

use serde::{Deserialize, Serialize};

use crate::access::Subject;
use crate::ids::IdempotencyKey;

pub use access::{
    CreateOperatorToken, Enroll, MintBootstrapToken, RecordCertificate, RevokeIdentity,
    RevokeOperatorToken,
};
pub use agents::{AgentCheckIn, AgentOperation, RequestAgentOperation};
pub use batch::{Batch, BatchedCommand};
pub use credentials::{
    GrantAgentCredentialLease, GrantCredentialLease, PutCredential, RegrantAgentCredentialLease,
    RegrantCredentialLease, RevokeCredential, RotateCredential, SetCredentialEgress,
    SetProfileCredentials,
};
pub use leases::{
    AcquireLease, CommitCapsule, CrashTakeover, FenceLease, GracefulTakeover, NextHolder,
    RecordReapEvidence, ReleaseLease, RenewLease, RenewLeases,
};
pub use mailboxes::{AckMessages, PostMessage};
pub use maintenance::{LeaderSweep, PruneTasks};
pub use projects::{
    AttachSandbox, CreateProfile, CreateProject, DetachSandbox, GrantMcpUse, RevokeMcpUse,
    SetCapabilityManifest,
};
pub use tasks::{
    AssignTasks, Assignment, CancelTask, ReportProgress, ReportProgressV2, ReportTransition,
    SubmitTask, TransitionDetail,
};
pub use workers::{
    DecommissionWorker, RegisterWorker, RegisterWorkerWithPolicy, SetWorkerPolicy, WorkerHeartbeat,
};

/// A command as the log stores it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandEnvelope {
    /// Leader-stamped wall time at proposal. Apply uses `max(state.clock_ms, at_ms)`.
    pub at_ms: u64,
    /// When set, the command is applied at most once (INV-11).
    pub idempotency_key: Option<IdempotencyKey>,
    /// Who asked, as the edge authenticated it (DESIGN §5). A batch's own subject is the
    /// proposing node's; each batched command carries its caller's.
    pub subject: Subject,
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

    // --- the trust boundary ------------------------------------------------------------------
    CreateOperatorToken(CreateOperatorToken),
    RevokeOperatorToken(RevokeOperatorToken),
    MintBootstrapToken(MintBootstrapToken),
    Enroll(Enroll),
    RecordCertificate(RecordCertificate),
    RevokeIdentity(RevokeIdentity),

    // --- credentials (INV-13) ------------------------------------------------------------
    PutCredential(PutCredential),
    RotateCredential(RotateCredential),
    RevokeCredential(RevokeCredential),
    GrantCredentialLease(GrantCredentialLease),

    // --- worker policy -----------------------------------------------------------------------
    SetWorkerPolicy(SetWorkerPolicy),

    // --- the agent facade ------------------------------------------------------------------
    RequestAgentOperation(RequestAgentOperation),

    // --- the agent inside a sandbox ------------------------------------------------------
    AgentCheckIn(AgentCheckIn),

    // --- tasks placed in a project ----------------------------------------------------------
    /// Proposed by the leader: assigns `placement: project` tasks, each with a lease of its
    /// profile (`apply_project_tasks`).
    AssignProjectTasks(AssignTasks),

    // --- credentials of agent profiles (INV-13) -------------------------------------------
    SetProfileCredentials(SetProfileCredentials),
    GrantAgentCredentialLease(GrantAgentCredentialLease),

    // --- egress injection (INV-13) ----------------------------------------------------------
    SetCredentialEgress(SetCredentialEgress),

    // --- workers, continued ------------------------------------------------------------------
    RegisterWorkerWithPolicy(RegisterWorkerWithPolicy),

    // --- maintenance, continued ----------------------------------------------------------
    /// What a leader proposes in place of `Sweep` (which older logs still hold): the same sweep,
    /// with workers given a grace after a leader change.
    LeaderSweep(LeaderSweep),
    /// Proposed by the leader: the retention of ended tasks (`apply_retention`).
    PruneTasks(PruneTasks),

    // --- tasks, continued ----------------------------------------------------------------
    /// What workers report in place of `ReportProgress`: the counters and the provider's
    /// progress.
    ReportProgressV2(ReportProgressV2),

    // --- credentials of agent profiles, continued ------------------------------------------
    /// What a restarted worker resuming a generation asks in place of
    /// `GrantAgentCredentialLease`: the lease it served before, or none.
    RegrantAgentCredentialLease(RegrantAgentCredentialLease),
    /// What a restarted worker resuming a task attempt asks in place of
    /// `GrantCredentialLease`: the lease it held before, or none.
    RegrantCredentialLease(RegrantCredentialLease),
}

impl Command {
    /// Whether applying the command may let the scheduler place a task it could not before:
    /// a task to place, a task that ended (capacity freed), a worker that came or changed.
    /// The leader runs its scheduler after such a command instead of at its next tick;
    /// missing one costs latency only, never a placement (the tick still runs).
    pub fn wakes_scheduler(&self) -> bool {
        match self {
            Command::SubmitTask(_)
            | Command::ReportTransition(_)
            | Command::CancelTask(_)
            | Command::RegisterWorker(_)
            | Command::RegisterWorkerWithPolicy(_)
            | Command::SetWorkerPolicy(_)
            | Command::ReleaseLease(_)
            | Command::FenceLease(_) => true,
            Command::Batch(b) => b.commands.iter().any(|c| c.command.wakes_scheduler()),
            _ => false,
        }
    }

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
            Command::CreateOperatorToken(_) => "create_operator_token",
            Command::RevokeOperatorToken(_) => "revoke_operator_token",
            Command::MintBootstrapToken(_) => "mint_bootstrap_token",
            Command::Enroll(_) => "enroll",
            Command::RecordCertificate(_) => "record_certificate",
            Command::RevokeIdentity(_) => "revoke_identity",
            Command::PutCredential(_) => "put_credential",
            Command::RotateCredential(_) => "rotate_credential",
            Command::RevokeCredential(_) => "revoke_credential",
            Command::GrantCredentialLease(_) => "grant_credential_lease",
            Command::SetWorkerPolicy(_) => "set_worker_policy",
            Command::RequestAgentOperation(_) => "request_agent_operation",
            Command::AgentCheckIn(_) => "agent_check_in",
            Command::AssignProjectTasks(_) => "assign_project_tasks",
            Command::SetProfileCredentials(_) => "set_profile_credentials",
            Command::GrantAgentCredentialLease(_) => "grant_agent_credential_lease",
            Command::SetCredentialEgress(_) => "set_credential_egress",
            Command::RegisterWorkerWithPolicy(_) => "register_worker_with_policy",
            Command::LeaderSweep(_) => "leader_sweep",
            Command::PruneTasks(_) => "prune_tasks",
            Command::ReportProgressV2(_) => "report_progress_v2",
            Command::RegrantAgentCredentialLease(_) => "regrant_agent_credential_lease",
            Command::RegrantCredentialLease(_) => "regrant_credential_lease",
        }
    }

    /// Periodic machinery the audit record leaves out (their subjects stay in the log).
    pub fn is_routine(&self) -> bool {
        matches!(
            self,
            Command::RenewLease(_)
                | Command::RenewLeases(_)
                | Command::WorkerHeartbeat(_)
                | Command::ReportProgress(_)
                | Command::ReportProgressV2(_)
                | Command::AckMessages(_)
                | Command::AssignTasks(_)
                | Command::AssignProjectTasks(_)
                | Command::Sweep
                | Command::LeaderSweep(_)
                | Command::PruneTasks(_)
                | Command::Batch(_)
        )
    }

    /// What the command names first, for the audit record.
    pub fn audit_target(&self) -> String {
        use Command as C;
        match self {
            C::CreateProject(c) => format!("project {}/{}", c.tenant, c.project),
            C::AttachSandbox(c) => format!("project {}/{}", c.tenant, c.project),
            C::DetachSandbox(c) => format!("project {}/{}", c.tenant, c.project),
            C::CreateProfile(c) => format!("project {}/{}", c.tenant, c.project),
            C::SetCapabilityManifest(c) => format!("profile {}", c.profile),
            C::GrantMcpUse(c) => format!("profile {}", c.profile),
            C::RevokeMcpUse(c) => format!("profile {}", c.profile),
            C::AcquireLease(c) => format!("profile {}", c.profile),
            C::RenewLease(c) => format!("lease {}", c.fence.lease),
            C::RenewLeases(c) => format!("worker {}", c.worker),
            C::ReleaseLease(c) => format!("lease {}", c.fence.lease),
            C::FenceLease(c) => format!("lease {}", c.fence.lease),
            C::RecordReapEvidence(c) => format!("profile {}", c.profile),
            C::GracefulTakeover(c) => format!("profile {}", c.fence.profile),
            C::CrashTakeover(c) => format!("profile {}", c.profile),
            C::CommitCapsule(c) => format!("profile {}", c.fence.profile),
            C::PostMessage(c) => format!("profile {}", c.to),
            C::AckMessages(c) => format!("profile {}", c.fence.profile),
            C::SubmitTask(c) => match &c.spec.placement {
                crate::manifest::Placement::Project {
                    tenant, project, ..
                } => format!("project {tenant}/{project}"),
                crate::manifest::Placement::Dedicated => format!("task {:?}", c.spec.name),
            },
            C::AssignTasks(_)
            | C::AssignProjectTasks(_)
            | C::Sweep
            | C::LeaderSweep(_)
            | C::PruneTasks(_)
            | C::Batch(_) => String::new(),
            C::ReportTransition(c) => format!("task {}", c.task),
            C::ReportProgress(c) => format!("task {}", c.task),
            C::ReportProgressV2(c) => format!("task {}", c.counts.task),
            C::CancelTask(c) => format!("task {}", c.task),
            C::RegisterWorker(c) => format!("worker {}", c.worker),
            C::WorkerHeartbeat(c) => format!("worker {}", c.worker),
            C::DecommissionWorker(c) => format!("worker {}", c.worker),
            C::CreateOperatorToken(c) => format!("token {}", c.id),
            C::RevokeOperatorToken(c) => format!("token {}", c.id),
            C::MintBootstrapToken(c) => format!("bootstrap token {}", c.id),
            C::Enroll(c) => format!("{}", c.identity),
            C::RecordCertificate(c) => format!("{}", c.identity),
            C::RevokeIdentity(c) => format!("{}", c.identity),
            C::PutCredential(c) => format!("credential {}", c.id),
            C::RotateCredential(c) => format!("credential {}", c.id),
            C::RevokeCredential(c) => format!("credential {}", c.id),
            C::GrantCredentialLease(c) => format!("task {}", c.task),
            C::SetWorkerPolicy(c) => format!("worker {}", c.worker),
            C::RequestAgentOperation(c) => format!(
                "profile {}: {} on worker {}",
                c.profile,
                c.operation.as_str(),
                c.worker
            ),
            C::AgentCheckIn(c) => format!("task {} attempt {}", c.task, c.attempt),
            C::SetProfileCredentials(c) => format!("profile {}", c.profile),
            C::GrantAgentCredentialLease(c) => format!(
                "profile {} generation {}",
                c.fence.profile, c.fence.generation
            ),
            C::RegrantAgentCredentialLease(c) => format!(
                "profile {} generation {} credential lease {}",
                c.fence.profile, c.fence.generation, c.only_lease
            ),
            C::RegrantCredentialLease(c) => format!(
                "task {} attempt {} credential lease {}",
                c.task, c.attempt, c.only_lease
            ),
            C::SetCredentialEgress(c) => format!("credential {}", c.id),
            C::RegisterWorkerWithPolicy(c) => format!("worker {}", c.registration.worker),
        }
    }
}
