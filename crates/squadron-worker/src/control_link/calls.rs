//! The worker's calls that REST serves too, over `WorkerControl` to the leader: the agent
//! supervisor's lease, takeover, mailbox and sandbox steps and its reads, the driver's
//! credential lease and task reads, the certificate's renewal. Reads are linearizable.
//!
//! Writes are keyed per call (what they do and when they were first sent), so a resend after
//! a lost answer is answered with the first answer instead of applied twice; a later call is
//! a new key, decided afresh (an acquire's compare-and-swap is re-read, INV-11).

use squadron_api::leases::{
    AckMessages, AcquireLease, CommitCapsule, CrashTakeover, GracefulTakeover, LeaseFence, Takeover,
};
use squadron_api::worker_control::WORKER_CONTROL_MESSAGE_BYTES_MAX;
use squadron_api::{
    Addressed, AgentCredentialLeaseView, AttachSandbox, CredentialLeaseGrant, CredentialLeaseView,
    CurrentWriter, Enrolled, GrantAgentCredentialLease, GrantCredentialLease, McpDecision, McpUse,
    MintAgentToken, MintedAgentToken, ProjectRef, RenewCertificate,
};
use squadron_core::agent_session::AgentSession;
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::ids::{
    CredentialLeaseId, LeaseId, McpServerId, ProfileId, ProjectId, TaskId, TenantId,
};
use squadron_core::lease::{FencingToken, RuntimeLease};
use squadron_core::mailbox::Mailbox;
use squadron_core::manifest::CredentialRef;
use squadron_core::profile::AgentProfile;
use squadron_core::project::Project;
use squadron_core::roster::RosterSnapshot;
use squadron_core::task::Task;
use squadron_core::Outcome;
use squadron_proto::v1::worker_control_client::WorkerControlClient;
use tonic::transport::Channel;

use super::{keyed, CallError, ControlLink, CALL_ATTEMPTS_MAX};

type Client = WorkerControlClient<Channel>;

/// A call's request, keyed or not, sent as often as the leader channel needs.
macro_rules! call {
    ($link:expr, $method:ident, $message:expr, $key:expr) => {{
        let message = $message;
        let key: Option<String> = $key;
        $link
            .control_call(move |mut client: Client| {
                let mut request = tonic::Request::new(message.clone());
                if let Some(k) = &key {
                    keyed(&mut request, k);
                }
                async move { client.$method(request).await }
            })
            .await
    }};
}

/// A key for one call: its kind, what it acts on, and when it was first sent.
fn call_key(what: std::fmt::Arguments<'_>) -> Option<String> {
    Some(format!("{what}-t{}", squadron_client::now_ms()))
}

fn project(tenant: &TenantId, project: &ProjectId) -> ProjectRef {
    ProjectRef {
        tenant: tenant.clone(),
        project: project.clone(),
    }
}

impl ControlLink {
    pub(crate) async fn acquire_lease(
        &self,
        profile: ProfileId,
        req: &AcquireLease,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!(
            "acquire-p{profile}-g{}",
            req.expected_generation
        ));
        call!(
            self,
            acquire_lease,
            Addressed::new(profile, req.clone()),
            key
        )
    }

    pub(crate) async fn release_lease(
        &self,
        lease: LeaseId,
        req: &LeaseFence,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!("release-l{lease}-g{}", req.generation));
        call!(self, release_lease, Addressed::new(lease, *req), key)
    }

    pub(crate) async fn takeover_graceful(
        &self,
        profile: ProfileId,
        req: &GracefulTakeover,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!("graceful-p{profile}-g{}", req.generation));
        let body = Takeover::Graceful(Box::new(req.clone()));
        call!(self, takeover, Addressed::new(profile, body), key)
    }

    pub(crate) async fn takeover_crash(
        &self,
        profile: ProfileId,
        req: &CrashTakeover,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!("crash-p{profile}-g{}", req.generation));
        let body = Takeover::Crash(req.clone());
        call!(self, takeover, Addressed::new(profile, body), key)
    }

    pub(crate) async fn commit_capsule(
        &self,
        profile: ProfileId,
        req: &CommitCapsule,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!(
            "capsule-p{profile}-g{}-s{}",
            req.generation, req.capsule.sequence
        ));
        call!(
            self,
            commit_capsule,
            Addressed::new(profile, req.clone()),
            key
        )
    }

    pub(crate) async fn ack_messages(
        &self,
        profile: ProfileId,
        req: &AckMessages,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!("ack-p{profile}-s{}", req.through_seq));
        call!(self, ack_messages, Addressed::new(profile, *req), key)
    }

    pub(crate) async fn attach_sandbox(
        &self,
        tenant: &TenantId,
        name: &ProjectId,
        req: &AttachSandbox,
    ) -> Result<Outcome, CallError> {
        let key = call_key(format_args!("attach-{tenant}-{name}"));
        let message = Addressed::new(project(tenant, name), req.clone());
        call!(self, attach_sandbox, message, key)
    }

    pub(crate) async fn grant_credential_lease(
        &self,
        task: TaskId,
        req: &GrantCredentialLease,
    ) -> Result<CredentialLeaseGrant, CallError> {
        let key = call_key(format_args!("credentials-t{task}-a{}", req.attempt));
        call!(
            self,
            grant_credential_lease,
            Addressed::new(task, req.clone()),
            key
        )
    }

    /// Unkeyed: a resend signs a new certificate, and a keyed one would be answered with the
    /// first request's certificate, whose key this request does not hold.
    pub(crate) async fn renew_certificate(
        &self,
        req: &RenewCertificate,
    ) -> Result<Enrolled, CallError> {
        let message = Addressed::new(self.config.id.clone(), req.clone());
        call!(self, renew_certificate, message, None)
    }

    /// The lease `token` names, when it may write now (the leader's answer, with its clock).
    pub(crate) async fn check_fence(
        &self,
        token: FencingToken,
    ) -> Result<CurrentWriter, CallError> {
        call!(self, check_fence, token, None)
    }

    pub(crate) async fn get_profile(&self, id: ProfileId) -> Result<AgentProfile, CallError> {
        call!(self, get_profile, id, None)
    }

    /// The credentials the profile's providers are given.
    pub(crate) async fn profile_credentials(
        &self,
        id: ProfileId,
    ) -> Result<Vec<CredentialRef>, CallError> {
        call!(self, get_profile_credentials, id, None)
    }

    /// Keyed by the runtime lease: a resend is answered with the same credential lease.
    pub(crate) async fn grant_agent_credential_lease(
        &self,
        id: ProfileId,
        req: &GrantAgentCredentialLease,
    ) -> Result<CredentialLeaseGrant, CallError> {
        let key = call_key(format_args!("credentials-p{id}-l{}", req.fence.lease));
        call!(
            self,
            grant_agent_credential_lease,
            Addressed::new(id, req.clone()),
            key
        )
    }

    /// INV-14 for one MCP message of the profile's provider: `Ok` when allowed; a refusal is
    /// a `permission_denied` error, counted by the node for `squadron evidence`.
    pub(crate) async fn check_mcp_use(
        &self,
        id: ProfileId,
        server: &McpServerId,
    ) -> Result<McpDecision, CallError> {
        let body = McpUse {
            server: server.clone(),
        };
        call!(self, check_mcp_use, Addressed::new(id, body), None)
    }

    /// The MCP servers the profile is granted (its providers' configuration lists these).
    /// One of this worker's credential leases, as the state has it now.
    pub(crate) async fn get_credential_lease(
        &self,
        id: CredentialLeaseId,
    ) -> Result<CredentialLeaseView, CallError> {
        call!(self, get_credential_lease, id, None)
    }

    /// One of this worker's agent credential leases (a profile generation's), as the state
    /// has it now.
    pub(crate) async fn get_agent_credential_lease(
        &self,
        id: CredentialLeaseId,
    ) -> Result<AgentCredentialLeaseView, CallError> {
        call!(self, get_agent_credential_lease, id, None)
    }

    pub(crate) async fn mcp_grants(&self, id: ProfileId) -> Result<Vec<McpServerId>, CallError> {
        call!(self, mcp_grants, id, None)
    }

    pub(crate) async fn get_lease(&self, id: LeaseId) -> Result<RuntimeLease, CallError> {
        call!(self, get_lease, id, None)
    }

    pub(crate) async fn list_capsules(
        &self,
        id: ProfileId,
    ) -> Result<Vec<ContinuityCapsule>, CallError> {
        call!(self, list_capsules, id, None)
    }

    pub(crate) async fn get_project(
        &self,
        tenant: &TenantId,
        name: &ProjectId,
    ) -> Result<Project, CallError> {
        call!(self, get_project, project(tenant, name), None)
    }

    pub(crate) async fn roster(
        &self,
        tenant: &TenantId,
        name: &ProjectId,
    ) -> Result<RosterSnapshot, CallError> {
        call!(self, get_roster, project(tenant, name), None)
    }

    pub(crate) async fn read_mailbox(&self, id: ProfileId) -> Result<Mailbox, CallError> {
        call!(self, read_mailbox, id, None)
    }

    pub(crate) async fn task(&self, id: TaskId) -> Result<Task, CallError> {
        call!(self, get_task, id, None)
    }

    /// The one-time token the agent of `task`'s sandbox enrolls with. Unkeyed, as a
    /// certificate's renewal: a keyed resend would be answered with the first request's
    /// token id but not its secret; an extra token is never used and goes with the task.
    pub(crate) async fn mint_agent_token(
        &self,
        task: TaskId,
        ttl_ms: u64,
    ) -> Result<MintedAgentToken, CallError> {
        let message = Addressed::new(task, MintAgentToken { ttl_ms });
        call!(self, mint_agent_token, message, None)
    }

    /// The registered agent of `task`, if one has checked in.
    pub(crate) async fn agent_session(
        &self,
        task: TaskId,
    ) -> Result<Option<AgentSession>, CallError> {
        call!(self, get_agent_session, task, None)
    }

    /// Where the leader's gRPC listener is now, asked afresh (the agent relay dials it).
    pub(crate) async fn leader_grpc_address(&self) -> Result<String, CallError> {
        self.grpc
            .leader_address()
            .await
            .map_err(|e| CallError::Unanswered(e.to_string()))
    }

    /// The leases a restart adopts: holding a slot, held here, in projects whose sandbox is
    /// here.
    pub(crate) async fn held_leases(&self) -> Result<Vec<RuntimeLease>, CallError> {
        call!(self, held_leases, self.config.id.clone(), None)
    }

    /// One call to the leader's `WorkerControl`, resent as [`ControlLink::call_leader`] does.
    async fn control_call<T, F, Fut>(&self, call: F) -> Result<T, CallError>
    where
        F: Fn(Client) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.call_channel(CALL_ATTEMPTS_MAX, |channel| {
            call(
                WorkerControlClient::new(channel)
                    .max_decoding_message_size(WORKER_CONTROL_MESSAGE_BYTES_MAX)
                    .max_encoding_message_size(WORKER_CONTROL_MESSAGE_BYTES_MAX),
            )
        })
        .await
        .map_err(CallError::from)
    }
}
