//! The one table that maps every error the system can answer with to an HTTP status and a
//! gRPC status code. REST and gRPC adapters both read it, so a caller sees the same class of
//! error whichever interface it used.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A class of error, stable on the wire as its snake_case name (the `code` of `{code, message}`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// Malformed input; the message names the field.
    InvalidArgument,
    /// The entity named does not exist.
    NotFound,
    /// The entity already exists (unique key taken).
    AlreadyExists,
    /// A compare-and-swap lost: the caller's expected value is stale. Re-read, then decide;
    /// never retry blindly (INV-11).
    Conflict,
    /// The entity is in a state that does not allow the operation (busy profile, fenced lease,
    /// illegal transition, takeover without evidence).
    FailedPrecondition,
    /// A bound was reached (project capacity, mailbox, queue).
    ResourceExhausted,
    /// The caller is known but not allowed (INV-14).
    PermissionDenied,
    /// The caller did not prove who it is.
    Unauthenticated,
    /// The request body is larger than the route accepts.
    PayloadTooLarge,
    /// No leader is known or the cluster has no quorum; retry later.
    Unavailable,
    /// The server failed; the message says where. Never used for bad input.
    Internal,
    /// The request's body has a media type the route does not take (a JSON body sent as
    /// `text/plain`, a form). Appended last: the codes' order is their encoding.
    UnsupportedMediaType,
}

/// One row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCodeRow {
    pub code: ErrorCode,
    pub http_status: u16,
    /// The numeric gRPC status code (as in `google.rpc.Code`).
    pub grpc_code: i32,
}

/// The table itself. Every [`ErrorCode`] has exactly one row (checked by a test).
pub const ERROR_CODE_TABLE: [ErrorCodeRow; 12] = [
    row(ErrorCode::InvalidArgument, 400, 3),
    row(ErrorCode::NotFound, 404, 5),
    row(ErrorCode::AlreadyExists, 409, 6),
    row(ErrorCode::Conflict, 409, 10),
    row(ErrorCode::FailedPrecondition, 409, 9),
    row(ErrorCode::ResourceExhausted, 429, 8),
    row(ErrorCode::PermissionDenied, 403, 7),
    row(ErrorCode::Unauthenticated, 401, 16),
    row(ErrorCode::PayloadTooLarge, 413, 8),
    row(ErrorCode::Unavailable, 503, 14),
    row(ErrorCode::Internal, 500, 13),
    row(ErrorCode::UnsupportedMediaType, 415, 3),
];

const fn row(code: ErrorCode, http_status: u16, grpc_code: i32) -> ErrorCodeRow {
    ErrorCodeRow {
        code,
        http_status,
        grpc_code,
    }
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 12] = [
        ErrorCode::InvalidArgument,
        ErrorCode::NotFound,
        ErrorCode::AlreadyExists,
        ErrorCode::Conflict,
        ErrorCode::FailedPrecondition,
        ErrorCode::ResourceExhausted,
        ErrorCode::PermissionDenied,
        ErrorCode::Unauthenticated,
        ErrorCode::PayloadTooLarge,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
        ErrorCode::UnsupportedMediaType,
    ];

    fn row(self) -> ErrorCodeRow {
        // The table is indexed by declaration order; a test proves each row sits at its index.
        ERROR_CODE_TABLE[self as usize]
    }

    pub fn http_status(self) -> u16 {
        self.row().http_status
    }

    pub fn grpc_code(self) -> i32 {
        self.row().grpc_code
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArgument => "invalid_argument",
            ErrorCode::NotFound => "not_found",
            ErrorCode::AlreadyExists => "already_exists",
            ErrorCode::Conflict => "conflict",
            ErrorCode::FailedPrecondition => "failed_precondition",
            ErrorCode::ResourceExhausted => "resource_exhausted",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::Unauthenticated => "unauthenticated",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_exactly_its_own_row() {
        for (i, code) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(ERROR_CODE_TABLE[i].code, *code, "row {i} is out of order");
            assert_eq!(code.row().code, *code);
        }
        assert_eq!(ERROR_CODE_TABLE.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn client_errors_are_4xx_and_never_500() {
        for code in ErrorCode::ALL {
            let status = code.http_status();
            match code {
                ErrorCode::Unavailable => assert_eq!(status, 503),
                ErrorCode::Internal => assert_eq!(status, 500),
                _ => assert!((400..500).contains(&status), "{code:?} maps to {status}"),
            }
        }
    }

    #[test]
    fn wire_name_matches_serde_name() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
        }
    }
}
