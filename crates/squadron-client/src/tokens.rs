//! Operator tokens (create — the answer carries the secret, once —, list, revoke), bootstrap
//! tokens and a worker's enrollment and certificate renewal.

use reqwest::Method;
use squadron_api::{
    CreateToken, CreatedToken, EnrollWorker, Enrolled, MintBootstrap, MintedBootstrap,
    RenewCertificate, TokenView,
};
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

    /// Mints a one-time bootstrap token for a worker's enrollment (admin).
    pub async fn mint_bootstrap(
        &self,
        req: &MintBootstrap,
        key: Option<&IdempotencyKey>,
    ) -> Result<MintedBootstrap, ClientError> {
        self.write(Method::POST, "/api/v1/bootstrap-tokens", Some(req), key)
            .await
    }

    /// Exchanges a bootstrap token and a CSR for a worker certificate. Unkeyed: a retry after
    /// a lost answer finds the token consumed, and the worker mints a new request.
    pub async fn enroll_worker(&self, req: &EnrollWorker) -> Result<Enrolled, ClientError> {
        self.write(Method::POST, "/api/v1/enroll", Some(req), None)
            .await
    }

    /// Renews a worker's certificate under the one this client presents.
    pub async fn renew_worker_certificate(
        &self,
        worker: &squadron_core::ids::WorkerId,
        req: &RenewCertificate,
    ) -> Result<Enrolled, ClientError> {
        self.write(
            Method::POST,
            &format!("/api/v1/workers/{worker}/certificate"),
            Some(req),
            None,
        )
        .await
    }
}
