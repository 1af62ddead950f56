//! The credential store (admin): put, list, rotate, revoke; a worker's lease grant; a task's
//! leases as listed.

use reqwest::Method;
use squadron_api::{
    CredentialLeaseGrant, CredentialLeaseView, CredentialView, GrantCredentialLease, PutCredential,
    RotateCredential,
};
use squadron_core::ids::{CredentialId, IdempotencyKey, TaskId};
use squadron_core::Outcome;

use crate::{ClientError, Consistency, SquadronClient};

impl SquadronClient {
    pub async fn put_credential(
        &self,
        req: &PutCredential,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.write(Method::POST, "/api/v1/credentials", Some(req), key)
            .await
    }

    pub async fn list_credentials(
        &self,
        c: Consistency,
    ) -> Result<Vec<CredentialView>, ClientError> {
        self.get("/api/v1/credentials", c).await
    }

    pub async fn rotate_credential(
        &self,
        id: &CredentialId,
        req: &RotateCredential,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let path = format!("/api/v1/credentials/{id}/rotate");
        self.write(Method::POST, &path, Some(req), key).await
    }

    pub async fn revoke_credential(
        &self,
        id: &CredentialId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.send_empty(Method::DELETE, &format!("/api/v1/credentials/{id}"), key)
            .await
    }

    /// The worker running `task`'s attempt takes its credentials (worker certificate). Unkeyed:
    /// a second grant for the same attempt answers the same lease.
    pub async fn grant_credential_lease(
        &self,
        task: TaskId,
        req: &GrantCredentialLease,
    ) -> Result<CredentialLeaseGrant, ClientError> {
        let path = format!("/api/v1/tasks/{task}/credential-lease");
        self.write(Method::POST, &path, Some(req), None).await
    }

    pub async fn credential_leases(
        &self,
        task: TaskId,
        c: Consistency,
    ) -> Result<Vec<CredentialLeaseView>, ClientError> {
        self.get(&format!("/api/v1/tasks/{task}/credential-leases"), c)
            .await
    }
}
