//! Operator tokens: create (the answer carries the secret, once), list, revoke.

use reqwest::Method;
use squadron_api::{CreateToken, CreatedToken, TokenView};
use squadron_core::access::TokenId;
use squadron_core::ids::IdempotencyKey;
use squadron_core::Outcome;

use crate::{ClientError, Consistency, SquadronClient};

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
