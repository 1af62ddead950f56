//! The API's wire types, defined once: the server serializes exactly what the client, the
//! worker and the CLI deserialize. It holds only data (serde), no transport.
//!
//! Every REST request body and the response shapes the API defines itself (domain values such
//! as `Outcome`, `Task` or `RuntimeLease` come from `squadron-core`), each area in its own
//! module; the access rules of every route and method; the one error body. Every type derives
//! `JsonSchema`, from which the server's OpenAPI document takes its schemas.

pub mod access;
pub mod agent_channel;
pub mod agents;
pub mod audit;
pub mod cluster;
pub mod credentials;
pub mod enrollment;
pub mod error_body;
pub mod leases;
pub mod projects;
pub mod queries;
pub mod tasks;
pub mod tokens;
pub mod trace_id;
pub mod worker_control;
pub mod workers;

pub use access::{grpc_access, Access, Scope, GRPC_METHODS};
pub use audit::AuditPage;
pub use cluster::{
    AddLearner, ClusterStatus, MemberView, MembershipChanged, PromoteVoter, TlsReloaded,
};
pub use credentials::{
    AgentCredentialLeaseView, CredentialLeaseGrant, CredentialLeaseView, CredentialView,
    GrantAgentCredentialLease, GrantCredentialLease, LeasedValue, ProfileCredentialsView,
    PutCredential, PutCredentialEgress, RotateCredential, SetProfileCredentials,
};
pub use enrollment::{
    EnrollAgent, EnrollWorker, Enrolled, MintAgentToken, MintBootstrap, MintedAgentToken,
    MintedBootstrap, RenewCertificate,
};
pub use error_body::ErrorBody;
pub use projects::{
    AttachSandbox, CreateProfile, CreateProject, McpDecision, McpUse, ProjectSummary,
    SetCapabilities,
};
pub use queries::{
    AuditQuery, CancelQuery, ClusterStatusQuery, Consistency, ConsistencyQuery, LogQuery,
    LogStream, StreamQuery, TaskListQuery, TaskOrder,
};
pub use tasks::{ArtifactEntry, ReportProgress, ReportTransition, TaskPage, TaskUsage};
pub use tokens::{CreateToken, CreatedToken, TokenView};
pub use trace_id::{TraceId, TRACEPARENT_HEADER};
pub use worker_control::{Addressed, CurrentWriter, ProjectRef};
pub use workers::{Decommission, RegisterWorker};

/// The content type of an OpenMetrics text exposition: a node's `/metrics` and a worker's
/// `/worker/v1/metrics`, which nodes relay.
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The header (and gRPC metadata key) that carries a client's idempotency key (INV-11).
/// Lowercase: gRPC metadata keys must be, and HTTP header names compare without case.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";
