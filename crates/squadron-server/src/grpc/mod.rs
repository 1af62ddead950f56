//! gRPC services for agents and workers (`WorkerControl` in JSON, the others protobuf). They are served by the leader only: a follower
//! answers UNAVAILABLE with the leader's gRPC address in the `x-squadron-leader` metadata, so
//! the client reconnects there instead of paying a forward on every call.

mod agent;
mod worker;
mod worker_control;

pub use agent::AgentGrpc;
pub use worker::WorkerGrpc;
pub use worker_control::WorkerControlGrpc;

use squadron_api::error_body::{ERROR_BODY_METADATA, ERROR_BODY_METADATA_BYTES_MAX};
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{IdempotencyKey, WorkerId};
use squadron_core::{Command, Outcome, Response, ValidationError};
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::authz::Caller;
use crate::error::ApiError;
use crate::node::{ControlNode, IDEMPOTENCY_HEADER};
use crate::write_path::WriteError;

/// Metadata key naming the leader's gRPC address on a follower's refusal.
pub const LEADER_METADATA: &str = "x-squadron-leader";
/// Metadata key naming the error-table code of a refusal.
pub use squadron_api::error_body::ERROR_CODE_METADATA;

pub fn status(code: ErrorCode, message: impl Into<String>) -> Status {
    let mut s = Status::new(Code::from_i32(code.grpc_code()), message.into());
    if let Ok(v) = MetadataValue::try_from(code.as_str()) {
        s.metadata_mut().insert(ERROR_CODE_METADATA, v);
    }
    s
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        let message = match &e.body.field {
            Some(f) => format!("{} (field {f})", e.body.message),
            None => e.body.message.clone(),
        };
        let mut s = status(e.body.code, message);
        // The body REST would have answered with, so a caller reads the rejection's values.
        if let Ok(json) = serde_json::to_vec(&e.body) {
            if json.len() <= ERROR_BODY_METADATA_BYTES_MAX {
                s.metadata_mut()
                    .insert_bin(ERROR_BODY_METADATA, MetadataValue::from_bytes(&json));
            }
        }
        s
    }
}

impl From<WriteError> for Status {
    fn from(e: WriteError) -> Self {
        ApiError::from(e).into()
    }
}

pub fn invalid(e: ValidationError) -> Status {
    ApiError::from(e).into()
}

/// Refuses on a follower, naming the leader.
pub fn require_leader(node: &ControlNode) -> Result<(), Status> {
    if node.is_leader() {
        return Ok(());
    }
    Err(not_leader(node))
}

/// A follower's refusal, naming the leader so the client reconnects there.
fn not_leader(node: &ControlNode) -> Status {
    let mut s = status(
        ErrorCode::Unavailable,
        "this node is not the leader; reconnect to the address in x-squadron-leader",
    );
    if let Some((id, addr)) = node.leader() {
        if let Ok(v) = MetadataValue::try_from(addr.grpc.as_str()) {
            s.metadata_mut().insert(LEADER_METADATA, v);
        }
        if let Ok(v) = MetadataValue::try_from(id.to_string().as_str()) {
            s.metadata_mut().insert("x-squadron-leader-id", v);
        }
    }
    s
}

fn key_of<T>(request: &tonic::Request<T>) -> Result<Option<IdempotencyKey>, Status> {
    match request.metadata().get(IDEMPOTENCY_HEADER) {
        None => Ok(None),
        Some(v) => {
            let s = v
                .to_str()
                .map_err(|_| invalid(ValidationError::new("idempotency-key", "must be ASCII")))?;
            IdempotencyKey::new(s).map(Some).map_err(invalid)
        }
    }
}

/// Who called, as the listener's guard (`authz::grpc_guard`) authenticated and admitted it.
pub fn caller_of<T>(request: &tonic::Request<T>) -> Result<Caller, Status> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| {
            status(
                ErrorCode::Internal,
                "no access rule was applied to this method",
            )
        })
}

/// Proposes on the leader and maps the answer to gRPC. A leader deposed meanwhile refuses
/// like any follower, naming the new leader.
pub async fn propose(
    node: &ControlNode,
    caller: &Caller,
    key: Option<IdempotencyKey>,
    command: Command,
) -> Result<Outcome, Status> {
    require_leader(node)?;
    let answer = node
        .propose_here(
            caller
                .subject()
                .map_err(|e| status(e.code(), e.to_string()))?,
            command,
            key,
        )
        .await
        .map_err(|e| match e {
            WriteError::NotLeader { .. } => not_leader(node),
            e => e.into(),
        })?;
    match answer {
        Response::Ok(o) => Ok(o),
        Response::Rejected(r) => Err(ApiError::from(r).into()),
    }
}

/// A call a worker makes only for itself: the gRPC twin of REST's `Scope::Worker`, whose path
/// names the worker where here the message does.
pub(crate) fn itself(caller: &Caller, worker: &WorkerId, what: &str) -> Result<(), Status> {
    if matches!(caller, Caller::Worker(w) if w == worker) {
        return Ok(());
    }
    Err(status(
        ErrorCode::PermissionDenied,
        format!("only worker {worker} may {what}"),
    ))
}

pub fn unexpected(o: &Outcome) -> Status {
    status(ErrorCode::Internal, format!("unexpected outcome {o:?}"))
}

#[cfg(test)]
mod tests {
    use squadron_api::ErrorBody;
    use squadron_core::ids::{Generation, LeaseId};
    use squadron_core::Rejection;

    use super::*;

    fn carried(s: &Status) -> Option<ErrorBody> {
        let bytes = s.metadata().get_bin(ERROR_BODY_METADATA)?.to_bytes().ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    #[test]
    fn a_refusal_carries_the_error_body_rest_would_send() {
        let rejection = Rejection::Fenced {
            reason: "lease 3 was taken over".into(),
            current_lease: Some(LeaseId::new(4).unwrap()),
            current_generation: Generation::new(2),
        };
        let api = ApiError::from(rejection.clone());
        let s = Status::from(api.clone());
        assert_eq!(s.code(), Code::from_i32(api.body.code.grpc_code()));
        assert_eq!(s.message(), rejection.to_string());
        let body = carried(&s).expect("the body in the metadata");
        assert_eq!(body, api.body);
        assert_eq!(body.rejection, Some(rejection));
        let invalid = Status::from(ApiError::from(ValidationError::new("ttl_ms", "too long")));
        let body = carried(&invalid).expect("body");
        assert_eq!(body.field.as_deref(), Some("ttl_ms"));
        assert_eq!(invalid.message(), "invalid ttl_ms: too long (field ttl_ms)");
    }

    #[test]
    fn a_body_too_large_for_the_metadata_is_left_out() {
        let huge = ApiError::from(ValidationError::new(
            "x",
            "y".repeat(ERROR_BODY_METADATA_BYTES_MAX),
        ));
        let s = Status::from(huge);
        assert!(carried(&s).is_none());
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.metadata().get(ERROR_CODE_METADATA).is_some());
    }
}
