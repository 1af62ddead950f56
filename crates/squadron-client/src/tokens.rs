//! Operator tokens: create (the answer carries the secret, once), list, revoke.

use reqwest::Method;
use serde::{Deserialize, Serialize};
use squadron_core::access::{ProjectScope, Role, Subject, TokenId};
use squadron_core::ids::IdempotencyKey;
use squadron_core::Outcome;

use crate::{ClientError, Consistency, SquadronClient};

/// `POST /api/v1/tokens`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

impl SquadronClient {
    pub async fn create_token(
        &self,
        req: &CreateToken,
        key: Option<&IdempotencyKey>,
    ) -> Result<CreatedToken, ClientError> {
        self.write(Method::POST, "/api/v1/tokens", Some(req), key)
            .await
    }

    pub async fn list_tokens(&self, c: Consistency) -> Result<Vec<TokenView>, ClientError> {
        self.get("/api/v1/tokens", c).await
    }

    pub async fn revoke_token(
        &self,
        id: &TokenId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(Method::DELETE, &format!("/api/v1/tokens/{id}"), key)
            .await
    }
}
