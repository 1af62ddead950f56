//! Business rejections: the answers of commands that were applied and refused. They are values
//! in the replicated response, never panics or Raft errors, and a refused command changes
//! nothing in the state.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error_code::ErrorCode;
use crate::ids::{Digest, Generation, LeaseId};
use crate::provider::Provider;
use crate::task::TaskState;
use crate::validation_error::ValidationError;

/// The kinds of entity a rejection can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Entity {
    Project,
    Profile,
    Lease,
    Sandbox,
    Task,
    Worker,
    Message,
    Relation,
    Token,
    Certificate,
    Credential,
    CredentialLease,
}

impl Entity {
    pub fn as_str(self) -> &'static str {
        match self {
            Entity::Project => "project",
            Entity::Profile => "profile",
            Entity::Lease => "lease",
            Entity::Sandbox => "sandbox",
            Entity::Task => "task",
            Entity::Worker => "worker",
            Entity::Message => "message",
            Entity::Relation => "relation",
            Entity::Token => "token",
            Entity::Certificate => "certificate",
            Entity::Credential => "credential",
            Entity::CredentialLease => "credential lease",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Rejection {
    #[error("{0}")]
    Invalid(ValidationError),
    #[error("{} {id} not found", entity.as_str())]
    NotFound { entity: Entity, id: String },
    #[error("{} {id} already exists", entity.as_str())]
    AlreadyExists { entity: Entity, id: String },
    #[error("project holds {count} profiles, its limit is {max}")]
    ProfileLimitReached { count: u32, max: u32 },
    #[error("stale generation: expected {expected}, current is {current}")]
    StaleGeneration {
        expected: Generation,
        current: Generation,
    },
    #[error("profile is busy: lease {lease} (generation {generation}) is {state}")]
    ProfileBusy {
        lease: LeaseId,
        generation: Generation,
        state: String,
    },
    #[error("project capacity full: {held} of {max} slots held")]
    CapacityFull { held: u32, max: u32 },
    #[error("provider {provider} is not in the profile's priority list {allowed:?}")]
    ProviderNotAllowed {
        provider: Provider,
        allowed: Vec<Provider>,
    },
    #[error("fenced: {reason}")]
    Fenced {
        reason: String,
        current_lease: Option<LeaseId>,
        current_generation: Generation,
    },
    #[error("lease expired at {expired_at_ms} ms")]
    LeaseExpired { expired_at_ms: u64 },
    #[error("lease has not expired yet; it expires at {expires_at_ms} ms")]
    LeaseNotExpired { expires_at_ms: u64 },
    #[error("takeover blocked: {reason}")]
    TakeoverBlocked { reason: String },
    #[error("reap evidence refused: {reason}")]
    EvidenceRefused { reason: String },
    #[error(
        "capsule chain broken: expected sequence {expected_sequence} after {expected_previous:?}"
    )]
    ChainBroken {
        expected_sequence: u64,
        expected_previous: Option<Digest>,
    },
    #[error("capsule digest mismatch: computed {computed}")]
    DigestMismatch { computed: Digest },
    #[error("illegal transition {from} -> {to}: {reason}")]
    IllegalTransition {
        from: TaskState,
        to: TaskState,
        reason: String,
    },
    #[error("stale task state: expected {expected}, current is {current}")]
    StaleTaskState {
        expected: TaskState,
        current: TaskState,
    },
    #[error("task is not owned by this report: {reason}")]
    NotTaskOwner { reason: String },
    #[error("project already has a live sandbox {sandbox_ref} on worker {worker}")]
    SandboxExists { worker: String, sandbox_ref: String },
    #[error("project has no live sandbox; a launch is denied rather than given another")]
    NoSandbox,
    #[error("the launch must run in the project sandbox on worker {sandbox_worker}")]
    SandboxMismatch { sandbox_worker: String },
    #[error("sandbox still hosts {slots_held} slot-holding leases")]
    SandboxBusy { slots_held: u32 },
    #[error("mailbox full: {max} unacknowledged messages")]
    MailboxFull { max: usize },
    #[error("acknowledgement beyond the last message {last_seq}")]
    AckBeyondHead { last_seq: u64 },
    #[error("lifecycle-only message not relayed")]
    LifecycleNoise,
    #[error("pending queue full: {max} tasks")]
    QueueFull { max: usize },
    #[error("worker unavailable: {reason}")]
    WorkerUnavailable { reason: String },
    #[error("capability manifest version conflict: expected {expected}, current is {current}")]
    ManifestVersionConflict { expected: u64, current: u64 },
    #[error("idempotency key was used for a different command")]
    IdempotencyKeyReused,
    #[error("permission denied: {reason}")]
    PermissionDenied { reason: String },
    /// A presented token or certificate does not prove what it claims (unknown, used,
    /// expired, revoked). The reason never repeats the secret.
    #[error("not authenticated: {reason}")]
    Unauthenticated { reason: String },
    /// A manifest names a credential whose value was revoked.
    #[error("{field}: credential {id} is revoked")]
    CredentialRevoked { field: String, id: String },
}

impl Rejection {
    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Rejection::Invalid(ValidationError::new(field, reason))
    }

    pub fn denied(reason: impl Into<String>) -> Self {
        Rejection::PermissionDenied {
            reason: reason.into(),
        }
    }

    pub fn unauthenticated(reason: impl Into<String>) -> Self {
        Rejection::Unauthenticated {
            reason: reason.into(),
        }
    }

    pub fn not_found(entity: Entity, id: impl ToString) -> Self {
        Rejection::NotFound {
            entity,
            id: id.to_string(),
        }
    }

    /// The row of the error-code table this rejection answers with.
    pub fn code(&self) -> ErrorCode {
        match self {
            Rejection::Invalid(_) => ErrorCode::InvalidArgument,
            Rejection::NotFound { .. } => ErrorCode::NotFound,
            Rejection::AlreadyExists { .. } | Rejection::SandboxExists { .. } => {
                ErrorCode::AlreadyExists
            }
            Rejection::StaleGeneration { .. }
            | Rejection::StaleTaskState { .. }
            | Rejection::ChainBroken { .. }
            | Rejection::ManifestVersionConflict { .. }
            | Rejection::IdempotencyKeyReused => ErrorCode::Conflict,
            Rejection::ProfileBusy { .. }
            | Rejection::Fenced { .. }
            | Rejection::LeaseExpired { .. }
            | Rejection::LeaseNotExpired { .. }
            | Rejection::TakeoverBlocked { .. }
            | Rejection::EvidenceRefused { .. }
            | Rejection::DigestMismatch { .. }
            | Rejection::IllegalTransition { .. }
            | Rejection::NotTaskOwner { .. }
            | Rejection::NoSandbox
            | Rejection::SandboxMismatch { .. }
            | Rejection::SandboxBusy { .. }
            | Rejection::AckBeyondHead { .. }
            | Rejection::LifecycleNoise
            | Rejection::ProviderNotAllowed { .. }
            | Rejection::WorkerUnavailable { .. }
            | Rejection::CredentialRevoked { .. } => ErrorCode::FailedPrecondition,
            Rejection::ProfileLimitReached { .. }
            | Rejection::CapacityFull { .. }
            | Rejection::MailboxFull { .. }
            | Rejection::QueueFull { .. } => ErrorCode::ResourceExhausted,
            Rejection::PermissionDenied { .. } => ErrorCode::PermissionDenied,
            Rejection::Unauthenticated { .. } => ErrorCode::Unauthenticated,
        }
    }
}

impl From<ValidationError> for Rejection {
    fn from(e: ValidationError) -> Self {
        Rejection::Invalid(e)
    }
}
