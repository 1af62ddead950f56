//! Runtime leases, takeovers, continuity capsules and mailboxes.

use squadron_core::ids::{IdempotencyKey, LeaseId, ProfileId, ProjectId, TenantId, WorkerId};
use squadron_core::Outcome;

use crate::types::*;
use crate::{ClientError, Consistency, SquadronClient};
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::lease::RuntimeLease;
use squadron_core::mailbox::Mailbox;

impl SquadronClient {
    pub async fn acquire_lease(
        &self,
        profile: ProfileId,
        req: &AcquireLease,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/leases"), req, key)
            .await
    }

    pub async fn get_lease(
        &self,
        lease: LeaseId,
        c: Consistency,
    ) -> Result<RuntimeLease, ClientError> {
        self.get(&format!("/api/v1/leases/{lease}"), c).await
    }

    pub async fn list_leases(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        c: Consistency,
    ) -> Result<Vec<RuntimeLease>, ClientError> {
        self.get(&format!("/api/v1/projects/{tenant}/{project}/leases"), c)
            .await
    }

    pub async fn renew_lease(
        &self,
        lease: LeaseId,
        req: &RenewLease,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/renew"), req, key)
            .await
    }

    pub async fn release_lease(
        &self,
        lease: LeaseId,
        req: &LeaseFence,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/release"), req, key)
            .await
    }

    pub async fn fence_lease(
        &self,
        lease: LeaseId,
        req: &FenceLease,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/fence"), req, key)
            .await
    }

    pub async fn record_evidence(
        &self,
        lease: LeaseId,
        req: &RecordEvidence,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/leases/{lease}/evidence"), req, key)
            .await
    }

    /// Renews every listed lease of one worker in one command.
    pub async fn renew_leases(
        &self,
        worker: &WorkerId,
        req: &RenewLeases,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/workers/{worker}/renewals"), req, key)
            .await
    }

    pub async fn takeover_graceful(
        &self,
        profile: ProfileId,
        req: &GracefulTakeover,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/profiles/{profile}/takeover"),
            &Takeover::Graceful(Box::new(req.clone())),
            key,
        )
        .await
    }

    pub async fn takeover_crash(
        &self,
        profile: ProfileId,
        req: &CrashTakeover,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(
            &format!("/api/v1/profiles/{profile}/takeover"),
            &Takeover::Crash(req.clone()),
            key,
        )
        .await
    }

    pub async fn commit_capsule(
        &self,
        profile: ProfileId,
        req: &CommitCapsule,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/capsules"), req, key)
            .await
    }

    pub async fn list_capsules(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<Vec<ContinuityCapsule>, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/capsules"), c)
            .await
    }

    pub async fn post_message(
        &self,
        profile: ProfileId,
        req: &PostMessage,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/mailbox"), req, key)
            .await
    }

    pub async fn read_mailbox(
        &self,
        profile: ProfileId,
        c: Consistency,
    ) -> Result<Mailbox, ClientError> {
        self.get(&format!("/api/v1/profiles/{profile}/mailbox"), c)
            .await
    }

    pub async fn ack_messages(
        &self,
        profile: ProfileId,
        req: &AckMessages,
        key: Option<&IdempotencyKey>,
    ) -> Result<Outcome, ClientError> {
        self.post(&format!("/api/v1/profiles/{profile}/mailbox/ack"), req, key)
            .await
    }
}
