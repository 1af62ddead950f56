//! Responses: what applying a command answered. Replicated with the command, so every node
//! (and every retry of an idempotent command) gives the same answer.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::access::{CertSerial, Identity, TokenId};

use crate::credential::SealedSecret;
use crate::ids::{CredentialId, CredentialLeaseId, Digest, Generation, LeaseId, ProfileId, TaskId};
use crate::manifest::CredentialRef;
use crate::rejection::Rejection;
use crate::task::TaskState;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Response {
    Ok(Outcome),
    Rejected(Rejection),
}

impl Response {
    pub fn is_ok(&self) -> bool {
        matches!(self, Response::Ok(_))
    }

    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            Response::Ok(_) => None,
            Response::Rejected(r) => Some(r),
        }
    }
}

impl From<Result<Outcome, Rejection>> for Response {
    fn from(r: Result<Outcome, Rejection>) -> Self {
        match r {
            Ok(o) => Response::Ok(o),
            Err(e) => Response::Rejected(e),
        }
    }
}

/// A granted lease, as acquire and takeover answer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LeaseGrant {
    pub profile: ProfileId,
    pub lease: LeaseId,
    pub generation: Generation,
    pub expires_at_ms: u64,
}

/// One renewal of a batched renewal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RenewalResult {
    pub lease: LeaseId,
    pub result: Result<u64, Rejection>,
}

/// One assignment of a scheduling batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AssignmentResult {
    pub task: TaskId,
    pub result: Result<(), Rejection>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SweepReport {
    pub leases_fenced: Vec<LeaseId>,
    pub workers_lost: Vec<String>,
    pub tasks_requeued: Vec<TaskId>,
    pub tasks_failed: Vec<TaskId>,
    pub idempotency_pruned: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    ProjectCreated,
    SandboxAttached,
    SandboxDetached,
    ProfileCreated {
        profile: ProfileId,
    },
    CapabilityManifestSet {
        version: u64,
    },
    McpUseGranted,
    McpUseRevoked,
    LeaseGranted(LeaseGrant),
    LeaseRenewed {
        expires_at_ms: u64,
    },
    LeasesRenewed {
        results: Vec<RenewalResult>,
    },
    LeaseReleased,
    LeaseFenced,
    /// `slot_freed` is true when the evidence ended a fenced lease.
    EvidenceRecorded {
        slot_freed: bool,
    },
    TookOver {
        capsule: Option<(u64, Digest)>,
        fenced: LeaseId,
        old_reaped: bool,
        grant: LeaseGrant,
    },
    CapsuleCommitted {
        sequence: u64,
        digest: Digest,
    },
    MessagePosted {
        seq: u64,
    },
    MessagesAcked {
        acked_through: u64,
    },
    TaskSubmitted {
        task: TaskId,
    },
    TasksAssigned {
        results: Vec<AssignmentResult>,
    },
    TransitionRecorded {
        state: TaskState,
    },
    ProgressRecorded,
    /// A queued task ended at once; an assigned one is asked to stop.
    CancelAccepted {
        state: TaskState,
    },
    WorkerRegistered,
    WorkerHeartbeatRecorded,
    WorkerDecommissioned {
        leases_reaped: Vec<LeaseId>,
        tasks_requeued: Vec<TaskId>,
        tasks_failed: Vec<TaskId>,
    },
    Swept(SweepReport),
    /// The responses of a [`crate::Command::Batch`], in its order.
    Batch {
        responses: Vec<Response>,
    },
    // New variants go last: the order is part of the encoding of recorded answers.
    OperatorTokenCreated {
        id: TokenId,
    },
    OperatorTokenRevoked {
        id: TokenId,
    },
    BootstrapTokenMinted {
        id: TokenId,
        expires_at_ms: u64,
    },
    Enrolled {
        identity: Identity,
        serial: CertSerial,
        not_after_ms: u64,
    },
    CertificateRecorded {
        serial: CertSerial,
        not_after_ms: u64,
    },
    IdentityRevoked {
        identity: Identity,
        certificates: u32,
    },
    CredentialStored {
        id: CredentialId,
        version: u32,
    },
    CredentialRevoked {
        id: CredentialId,
        leases_revoked: u32,
    },
    /// The sealed values travel in the answer, never in the log; the proposing node opens
    /// them for the worker.
    CredentialLeaseGranted {
        lease: CredentialLeaseId,
        session: String,
        credentials: Vec<GrantedCredential>,
    },
    WorkerPolicySet,
    /// Recorded for the audit; the node relays the request to the worker next.
    AgentOperationRequested,
    /// The agent's check-in is recorded; the task is in `state` (the agent starts the
    /// provider once it is RUNNING, and stops checking in once it has ended).
    AgentCheckedIn {
        state: TaskState,
        registered_at_ms: u64,
    },
    /// The profile's providers are given these credentials from the next generation on.
    ProfileCredentialsSet {
        profile: ProfileId,
        credential_refs: Vec<CredentialRef>,
    },
    /// The credential is injected at egress (`bound`) or given as a file again.
    CredentialEgressSet {
        id: CredentialId,
        bound: bool,
    },
    /// Ended tasks dropped by the retention policy.
    TasksPruned {
        count: u64,
    },
}

/// One value of a granted lease, still sealed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GrantedCredential {
    pub id: CredentialId,
    pub mount: String,
    pub version: u32,
    pub sealed: SealedSecret,
}
