//! `WorkerControl`: the worker's calls that REST serves too, in REST's own types
//! (`squadron_api::worker_control`), JSON-encoded. Each method builds the command or runs
//! the read its REST route does (the same functions), on the leader only; reads are
//! linearizable (ReadIndex on the leader).

use std::sync::Arc;

use squadron_api::leases::{AckMessages, AcquireLease, CommitCapsule, LeaseFence, Takeover};
use squadron_api::{
    Addressed, AgentCredentialLeaseView, AttachSandbox, Consistency, CredentialLeaseGrant,
    CredentialLeaseView, CurrentWriter, Enrolled, GrantAgentCredentialLease, GrantCredentialLease,
    McpDecision, McpUse, MintAgentToken, MintedAgentToken, ProjectRef, RenewCertificate,
};
use squadron_core::agent_session::AgentSession;
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::ids::{CredentialLeaseId, LeaseId, McpServerId, ProfileId, TaskId, WorkerId};
use squadron_core::lease::{FencingToken, RuntimeLease};
use squadron_core::mailbox::Mailbox;
use squadron_core::manifest::CredentialRef;
use squadron_core::profile::AgentProfile;
use squadron_core::project::Project;
use squadron_core::roster::RosterSnapshot;
use squadron_core::task::Task;
use squadron_core::{Command, Outcome, State};
use squadron_proto::v1::worker_control_server::WorkerControl;
use tonic::{Request, Response, Status};

use super::{caller_of, itself, key_of, propose, require_leader};
use crate::error::ApiError;
use crate::node::ControlNode;
use crate::rest::{credentials, enrollment, leases, projects, read, tasks};

#[derive(Debug, Clone)]
pub struct WorkerControlGrpc {
    node: Arc<ControlNode>,
}

impl WorkerControlGrpc {
    pub fn new(node: Arc<ControlNode>) -> Self {
        Self { node }
    }

    /// Proposes the command REST would for this message, keyed as the metadata says.
    async fn write<T>(
        &self,
        request: Request<T>,
        command: impl FnOnce(T) -> Result<Command, Status>,
    ) -> Result<Response<Outcome>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let command = command(request.into_inner())?;
        propose(&self.node, &caller, key, command)
            .await
            .map(Response::new)
    }

    /// A linearizable read of what REST's route answers.
    async fn read<T, R>(
        &self,
        request: Request<T>,
        f: impl FnOnce(&State, T) -> Result<R, ApiError>,
    ) -> Result<Response<R>, Status> {
        require_leader(&self.node)?;
        let arg = request.into_inner();
        read(&self.node, Consistency::Linearizable, |s| f(s, arg))
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    /// The view `find` gives of a credential lease (a task attempt's or a profile
    /// generation's), to the lease's own worker only.
    async fn own_credential_lease<V: OwnedLease>(
        &self,
        request: Request<CredentialLeaseId>,
        find: impl FnOnce(&State, CredentialLeaseId) -> Option<V>,
    ) -> Result<Response<V>, Status> {
        let caller = caller_of(&request)?;
        let lease = *request.get_ref();
        let view = self
            .read(request, move |s, id| {
                find(s, id)
                    .ok_or_else(|| ApiError::not_found(format!("credential lease {id} not found")))
            })
            .await?;
        itself(
            &caller,
            view.get_ref().worker(),
            &format!("read credential lease {lease}"),
        )?;
        Ok(view)
    }
}

/// A credential lease's view, held by one worker.
trait OwnedLease {
    fn worker(&self) -> &WorkerId;
}

impl OwnedLease for CredentialLeaseView {
    fn worker(&self) -> &WorkerId {
        &self.worker
    }
}

impl OwnedLease for AgentCredentialLeaseView {
    fn worker(&self) -> &WorkerId {
        &self.worker
    }
}

#[tonic::async_trait]
impl WorkerControl for WorkerControlGrpc {
    async fn acquire_lease(
        &self,
        request: Request<Addressed<ProfileId, AcquireLease>>,
    ) -> Result<Response<Outcome>, Status> {
        self.write(request, |a| Ok(leases::acquire_command(a.id, a.body)))
            .await
    }

    async fn release_lease(
        &self,
        request: Request<Addressed<LeaseId, LeaseFence>>,
    ) -> Result<Response<Outcome>, Status> {
        self.write(request, |a| Ok(leases::release_command(a.id, a.body)))
            .await
    }

    async fn takeover(
        &self,
        request: Request<Addressed<ProfileId, Takeover>>,
    ) -> Result<Response<Outcome>, Status> {
        self.write(request, |a| Ok(leases::takeover_command(a.id, a.body)))
            .await
    }

    async fn commit_capsule(
        &self,
        request: Request<Addressed<ProfileId, CommitCapsule>>,
    ) -> Result<Response<Outcome>, Status> {
        self.write(request, |a| {
            Ok(leases::commit_capsule_command(a.id, a.body))
        })
        .await
    }

    async fn ack_messages(
        &self,
        request: Request<Addressed<ProfileId, AckMessages>>,
    ) -> Result<Response<Outcome>, Status> {
        self.write(request, |a| Ok(leases::ack_command(a.id, a.body)))
            .await
    }

    async fn attach_sandbox(
        &self,
        request: Request<Addressed<ProjectRef, AttachSandbox>>,
    ) -> Result<Response<Outcome>, Status> {
        self.write(request, |a| {
            Ok(projects::attach_command(a.id.tenant, a.id.project, a.body))
        })
        .await
    }

    async fn grant_credential_lease(
        &self,
        request: Request<Addressed<TaskId, GrantCredentialLease>>,
    ) -> Result<Response<CredentialLeaseGrant>, Status> {
        require_leader(&self.node)?;
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let a = request.into_inner();
        credentials::grant_lease(&self.node, &caller, key, a.id, a.body)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn grant_agent_credential_lease(
        &self,
        request: Request<Addressed<ProfileId, GrantAgentCredentialLease>>,
    ) -> Result<Response<CredentialLeaseGrant>, Status> {
        require_leader(&self.node)?;
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let a = request.into_inner();
        credentials::grant_agent_lease(&self.node, &caller, key, a.id, a.body)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn get_profile_credentials(
        &self,
        request: Request<ProfileId>,
    ) -> Result<Response<Vec<CredentialRef>>, Status> {
        self.read(request, |s, profile| {
            projects::profile_of(s, profile)?;
            Ok(s.profile_credentials().refs_of(profile).to_vec())
        })
        .await
    }

    async fn check_mcp_use(
        &self,
        request: Request<Addressed<ProfileId, McpUse>>,
    ) -> Result<Response<McpDecision>, Status> {
        let node = self.node.clone();
        self.read(request, move |s, a| {
            projects::mcp_decision(&node.counters.mcp_denials, s, a.id, a.body.server)
        })
        .await
    }

    /// A credential lease the caller holds: the egress proxy asks before every request.
    async fn get_credential_lease(
        &self,
        request: Request<CredentialLeaseId>,
    ) -> Result<Response<CredentialLeaseView>, Status> {
        self.own_credential_lease(request, |s, id| {
            s.credentials().lease(id).map(CredentialLeaseView::from)
        })
        .await
    }

    /// An agent credential lease the caller holds: the egress proxy of a profile
    /// generation asks before every request.
    async fn get_agent_credential_lease(
        &self,
        request: Request<CredentialLeaseId>,
    ) -> Result<Response<AgentCredentialLeaseView>, Status> {
        self.own_credential_lease(request, |s, id| {
            s.profile_credentials()
                .lease(id)
                .map(AgentCredentialLeaseView::from)
        })
        .await
    }

    async fn mcp_grants(
        &self,
        request: Request<ProfileId>,
    ) -> Result<Response<Vec<McpServerId>>, Status> {
        self.read(request, |s, profile| {
            projects::profile_of(s, profile)?;
            Ok(s.mcp_grants(profile).cloned().collect())
        })
        .await
    }

    async fn mint_agent_token(
        &self,
        request: Request<Addressed<TaskId, MintAgentToken>>,
    ) -> Result<Response<MintedAgentToken>, Status> {
        require_leader(&self.node)?;
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let a = request.into_inner();
        enrollment::mint_agent_token(&self.node, &caller, key, a.id, a.body)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn get_agent_session(
        &self,
        request: Request<TaskId>,
    ) -> Result<Response<Option<AgentSession>>, Status> {
        self.read(request, |s, task| Ok(s.agent_session(task).copied()))
            .await
    }

    async fn renew_certificate(
        &self,
        request: Request<Addressed<WorkerId, RenewCertificate>>,
    ) -> Result<Response<Enrolled>, Status> {
        require_leader(&self.node)?;
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let a = request.into_inner();
        // REST's route is scoped to the worker in its path; here the message names it.
        itself(&caller, &a.id, "renew its certificate")?;
        enrollment::renew_certificate(&self.node, &caller, key, a.id, a.body)
            .await
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn check_fence(
        &self,
        request: Request<FencingToken>,
    ) -> Result<Response<CurrentWriter>, Status> {
        self.read(request, |s, token| {
            let clock_ms = s.clock_ms();
            let lease = s.current_writer(&token, clock_ms)?.clone();
            Ok(CurrentWriter { lease, clock_ms })
        })
        .await
    }

    async fn get_profile(
        &self,
        request: Request<ProfileId>,
    ) -> Result<Response<AgentProfile>, Status> {
        self.read(request, projects::profile_of).await
    }

    async fn get_lease(&self, request: Request<LeaseId>) -> Result<Response<RuntimeLease>, Status> {
        self.read(request, leases::lease_of).await
    }

    async fn list_capsules(
        &self,
        request: Request<ProfileId>,
    ) -> Result<Response<Vec<ContinuityCapsule>>, Status> {
        self.read(request, leases::capsules_of).await
    }

    async fn get_project(&self, request: Request<ProjectRef>) -> Result<Response<Project>, Status> {
        self.read(request, |s, p| {
            projects::find_project(s, &(p.tenant, p.project)).cloned()
        })
        .await
    }

    async fn get_roster(
        &self,
        request: Request<ProjectRef>,
    ) -> Result<Response<RosterSnapshot>, Status> {
        self.read(request, |s, p| {
            projects::find_project(s, &(p.tenant, p.project)).map(|p| p.roster.snapshot())
        })
        .await
    }

    async fn read_mailbox(&self, request: Request<ProfileId>) -> Result<Response<Mailbox>, Status> {
        self.read(request, leases::mailbox_of).await
    }

    async fn get_task(&self, request: Request<TaskId>) -> Result<Response<Task>, Status> {
        self.read(request, tasks::task_of).await
    }

    /// The leases a restarted worker adopts: holding a slot, held by it, in a project whose
    /// sandbox is on it.
    async fn held_leases(
        &self,
        request: Request<WorkerId>,
    ) -> Result<Response<Vec<RuntimeLease>>, Status> {
        let caller = caller_of(&request)?;
        itself(&caller, request.get_ref(), "list the leases it holds")?;
        self.read(request, |s, worker| Ok(held_leases(s, &worker)))
            .await
    }
}

fn held_leases(s: &State, worker: &WorkerId) -> Vec<RuntimeLease> {
    let sandbox_here = |l: &RuntimeLease| {
        s.project(&l.tenant, &l.project)
            .and_then(|p| p.sandbox.as_ref())
            .is_some_and(|sb| sb.worker == *worker)
    };
    s.leases()
        // A project task's lease is the task driver's, not an agent attempt to adopt.
        .filter(|l| l.state.holds_slot() && l.holder.worker == *worker && sandbox_here(l))
        .filter(|l| !s.is_task_lease(l.id))
        .cloned()
        .collect()
}
