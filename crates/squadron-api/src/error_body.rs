//! The body of every REST error answer (and of the worker's own listeners).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::error_code::ErrorCode;
use squadron_core::Rejection;

/// `{code, message, field?, rejection?}`; the HTTP status comes from `code` through the one
/// error table (`squadron_core::error_code`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorBody {
    pub code: ErrorCode,
    pub message: String,
    /// The field at fault, for invalid input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// The core's rejection, for business refusals, so clients can act on its values (the
    /// current generation, the slot counts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejection: Option<Rejection>,
}

/// The gRPC metadata key naming the error-table code of a refusal.
pub const ERROR_CODE_METADATA: &str = "x-squadron-error-code";
/// The gRPC metadata key (binary, so any text fits) of a refusal's error body as JSON: a gRPC
/// caller reads the same `{code, message, field?, rejection?}` a REST caller does, so the
/// worker acts on a rejection's values whichever transport answered.
pub const ERROR_BODY_METADATA: &str = "x-squadron-error-body-bin";
/// Largest error body carried in the metadata; a larger one is left out (the status keeps its
/// code and message), so a refusal never outgrows the peer's header limit.
pub const ERROR_BODY_METADATA_BYTES_MAX: usize = 4 * 1024;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wire_shape_leaves_out_what_is_absent_and_reads_back() {
        let body = ErrorBody {
            code: ErrorCode::InvalidArgument,
            message: "bad".into(),
            field: Some("limit".into()),
            rejection: None,
        };
        let text = serde_json::to_string(&body).expect("encode");
        assert_eq!(
            text,
            r#"{"code":"invalid_argument","message":"bad","field":"limit"}"#
        );
        let back: ErrorBody = serde_json::from_str(&text).expect("decode");
        assert_eq!(back, body);
        let minimal: ErrorBody =
            serde_json::from_str(r#"{"code":"not_found","message":"gone"}"#).expect("decode");
        assert_eq!((minimal.field, minimal.rejection), (None, None));
    }
}
