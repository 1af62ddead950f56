//! Operator tokens: the creation request, the one answer that carries a secret, and a token
//! as listed (never its secret or hash).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::access::{ProjectScope, Role, Subject, TokenId};

/// `POST /api/v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub name: String,
    pub role: Role,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scope: Vec<ProjectScope>,
    /// `30d`, `12h`…; none: until revoked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// The answer to a creation; `token` is the secret, shown this once.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct CreatedToken {
    pub id: TokenId,
    pub token: String,
    pub name: String,
    pub role: Role,
    pub scope: Vec<ProjectScope>,
    pub expires_at_ms: Option<u64>,
}

// The secret stays out of debug output (and so out of logs and panics).
impl std::fmt::Debug for CreatedToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedToken")
            .field("id", &self.id)
            .field("token", &"[REDACTED]")
            .field("name", &self.name)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// `GET /api/v1/tokens`: a token as listed (never its secret or hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TokenView {
    pub id: TokenId,
    pub name: String,
    pub role: Role,
    pub scope: Vec<ProjectScope>,
    pub created_at_ms: u64,
    pub created_by: Subject,
    pub expires_at_ms: Option<u64>,
    pub revoked_at_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_created_token_s_secret_stays_out_of_debug_output() {
        let created = CreatedToken {
            id: TokenId::new("0123456789abcdef").expect("id"),
            token: "sqd_op_0123456789abcdef_s3cr3t".into(),
            name: "ci".into(),
            role: Role::Viewer,
            scope: Vec::new(),
            expires_at_ms: None,
        };
        let shown = format!("{created:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("0123456789abcdef"), "{shown}");
    }

    #[test]
    fn a_creation_request_with_an_unknown_field_is_refused() {
        let bad = r#"{"name": "ci", "role": "viewer", "roles": ["admin"]}"#;
        assert!(serde_json::from_str::<CreateToken>(bad).is_err());
        let ok: CreateToken =
            serde_json::from_str(r#"{"name": "ci", "role": "viewer"}"#).expect("decode");
        assert_eq!((ok.scope.len(), ok.ttl), (0, None));
    }
}
