//! The trust boundary's edge (DESIGN §5): every REST route and gRPC method is guarded by its
//! row of the access table (`squadron_api::Access`). The guard resolves the caller — a bearer
//! token's operator or a verified certificate's worker or agent — holds it to the rule, and
//! hands the handler a [`Caller`] whose subject every command it proposes carries.
//!
//! **Architecture Invariant:** no handler runs without its route's rule having been checked;
//! a handler learns who called only through the `Caller` the guard inserted.

mod caller;
mod decision;
mod guard;

pub use caller::{Caller, WS_BEARER_PROTOCOL_PREFIX};
pub use decision::{decide, scope_covers, Target};
pub use guard::{grpc_guard, rest_guard, RouteGuard};

use axum::response::{IntoResponse, Response};
use squadron_core::error_code::ErrorCode;

use crate::error::ApiError;

/// Why a caller was turned away.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No credential, or one that is malformed, unknown, revoked or expired: 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// A valid credential without the right: 403.
    #[error("{0}")]
    Forbidden(String),
}

impl AuthError {
    pub(crate) fn bad(message: impl Into<String>) -> Self {
        AuthError::Unauthenticated(message.into())
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> Self {
        AuthError::Forbidden(message.into())
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            AuthError::Unauthenticated(_) => ErrorCode::Unauthenticated,
            AuthError::Forbidden(_) => ErrorCode::PermissionDenied,
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        ApiError::new(e.code(), e.to_string())
    }
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        ApiError::from(self).into_response()
    }
}
