//! What a call can fail with: the server's answer, or the lack of one.

use squadron_core::error_code::ErrorCode;
use squadron_core::Rejection;

pub use squadron_api::ErrorBody;

/// One endpoint that could not be reached, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointFailure {
    pub endpoint: String,
    pub message: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The server answered with an error.
    #[error("{}: {}", body.code.as_str(), body.message)]
    Api {
        endpoint: String,
        status: u16,
        body: ErrorBody,
    },
    /// No endpoint could be reached, and no request that might have changed state was sent.
    #[error("no endpoint reachable: {}", describe(attempts))]
    Unreachable { attempts: Vec<EndpointFailure> },
    /// A write may have reached a server, but no answer came back (a timeout or a dropped
    /// connection after sending). It was not resent, because it carried no idempotency key:
    /// read the state to learn whether it happened, or retry with an idempotency key.
    #[error(
        "outcome unknown: the write was sent to {endpoint} but no answer came ({message}); \
         it was not resent because it carries no idempotency key"
    )]
    OutcomeUnknown { endpoint: String, message: String },
    /// The server answered 2xx with a body this client does not understand.
    #[error("unexpected answer from {endpoint}: {message}")]
    Decode { endpoint: String, message: String },
    /// The call was refused before anything was sent (no endpoints, bad argument).
    #[error("invalid request: {0}")]
    Invalid(String),
}

fn describe(attempts: &[EndpointFailure]) -> String {
    if attempts.is_empty() {
        return "no endpoints configured".into();
    }
    attempts
        .iter()
        .map(|a| format!("{}: {}", a.endpoint, a.message))
        .collect::<Vec<_>>()
        .join("; ")
}

impl ClientError {
    /// The server's error body, when a server answered.
    pub fn body(&self) -> Option<&ErrorBody> {
        match self {
            ClientError::Api { body, .. } => Some(body),
            _ => None,
        }
    }

    /// The error code: the server's, or `unavailable` when none answered.
    pub fn code(&self) -> ErrorCode {
        match self {
            ClientError::Api { body, .. } => body.code,
            ClientError::Unreachable { .. } | ClientError::OutcomeUnknown { .. } => {
                ErrorCode::Unavailable
            }
            ClientError::Decode { .. } => ErrorCode::Internal,
            ClientError::Invalid(_) => ErrorCode::InvalidArgument,
        }
    }

    /// The core's rejection, for business refusals.
    pub fn rejection(&self) -> Option<&Rejection> {
        self.body().and_then(|b| b.rejection.as_ref())
    }

    /// The message without the code.
    pub fn message(&self) -> String {
        match self {
            ClientError::Api { body, .. } => body.message.clone(),
            other => other.to_string(),
        }
    }

    /// True when no server answered at all.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            ClientError::Unreachable { .. } | ClientError::OutcomeUnknown { .. }
        )
    }
}

/// The error code a status implies, for answers whose body is not an `ErrorBody` (a proxy, a
/// route the server does not know the method of).
pub(crate) fn code_for_status(status: u16) -> ErrorCode {
    match status {
        400 | 405 | 422 => ErrorCode::InvalidArgument,
        415 => ErrorCode::UnsupportedMediaType,
        401 => ErrorCode::Unauthenticated,
        403 => ErrorCode::PermissionDenied,
        404 => ErrorCode::NotFound,
        409 => ErrorCode::Conflict,
        413 => ErrorCode::PayloadTooLarge,
        429 => ErrorCode::ResourceExhausted,
        502..=504 => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    }
}
