//! REST errors: `{code, message}` with the HTTP status from the core's one error table.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use squadron_core::error_code::ErrorCode;
use squadron_core::{Rejection, ValidationError};

/// Seconds a client is asked to wait before retrying when no leader is known.
pub const RETRY_AFTER_S: u64 = 1;

pub use squadron_api::ErrorBody;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub body: ErrorBody,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            body: ErrorBody {
                code,
                message: message.into(),
                field: None,
                rejection: None,
            },
        }
    }

    pub fn invalid(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ValidationError::new(field, reason).into()
    }

    pub fn not_found(what: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, what)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unavailable, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    pub fn code(&self) -> ErrorCode {
        self.body.code
    }
}

impl From<ValidationError> for ApiError {
    fn from(e: ValidationError) -> Self {
        Self {
            body: ErrorBody {
                code: ErrorCode::InvalidArgument,
                message: e.to_string(),
                field: Some(e.field),
                rejection: None,
            },
        }
    }
}

impl From<Rejection> for ApiError {
    fn from(r: Rejection) -> Self {
        if let Rejection::Invalid(e) = r {
            return e.into();
        }
        Self {
            body: ErrorBody {
                code: r.code(),
                message: r.to_string(),
                field: None,
                rejection: Some(r),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.body.code.http_status())
            .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let code = self.body.code;
        let mut response = (status, axum::Json(self.body)).into_response();
        let headers = response.headers_mut();
        match code {
            ErrorCode::Unavailable => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            }
            // RFC 6750's challenges: MCP clients (and any OAuth-style client) read
            // `insufficient_scope` from a 403.
            ErrorCode::Unauthenticated => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"squadron\""),
                );
            }
            ErrorCode::PermissionDenied => {
                headers.insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static(
                        "Bearer realm=\"squadron\", error=\"insufficient_scope\"",
                    ),
                );
            }
            _ => {}
        }
        response
    }
}
