//! The credential store (admin): put, list, rotate, revoke; a worker's lease grant; a task's
//! leases as listed; the credentials of agent profiles and their generations' leases.

use reqwest::Method;
use squadron_api::{
    CredentialLeaseGrant, CredentialLeaseView, CredentialView, GrantAgentCredentialLease,
    GrantCredentialLease, ProfileCredentialsView, PutCredential, PutCredentialEgress,
    RotateCredential, SetProfileCredentials,
};
use squadron_core::ids::{CredentialId, IdempotencyKey, ProfileId, TaskId};
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

    /// Injects the credential at egress, to `req.upstream` only (admin).
    pub async fn set_credential_egress(
        &self,
        id: &CredentialId,
        req: &PutCredentialEgress,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let path = format!("/api/v1/credentials/{id}/egress");
        self.write(Method::PUT, &path, Some(req), key).await
    }

    /// Stops injecting the credential at egress (admin): it is a file in the sandbox again.
    pub async fn clear_credential_egress(
        &self,
        id: &CredentialId,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let path = format!("/api/v1/credentials/{id}/egress");
        self.send_empty(Method::DELETE, &path, key).await
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

    /// Names the credentials the profile's providers are given (admin); an empty list clears.
    pub async fn set_profile_credentials(
        &self,
        profile: ProfileId,
        req: &SetProfileCredentials,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        let path = format!("/api/v1/profiles/{profile}/credentials");
        self.write(Method::PUT, &path, Some(req), key).await
    }

    pub async fn profile_credentials(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<ProfileCredentialsView, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/credentials"), c)
            .await
    }

    /// The worker holding the profile's active lease takes its generation's credentials
    /// (worker certificate). Unkeyed: a second grant under the same lease answers the same
    /// credential lease.
    pub async fn grant_agent_credential_lease(
        &self,
        profile: ProfileId,
        req: &GrantAgentCredentialLease,
    ) -> Result<CredentialLeaseGrant, ClientError> {
        let path = format!("/api/v1/profiles/{profile}/credential-lease");
        self.write(Method::POST, &path, Some(req), None).await
    }
}
