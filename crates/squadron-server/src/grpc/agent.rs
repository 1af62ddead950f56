//! `AgentService`.

use std::sync::Arc;

use squadron_core::capsule::{CapsuleDraft, CapsulePayload};
use std::time::Duration;

use squadron_core::agent_session::SandboxUsage;
use squadron_core::command::{AcquireLease, AgentCheckIn, CommitCapsule, ReleaseLease, RenewLease};
use squadron_core::ids::{Digest, Generation, McpServerId, ProfileId, TaskId, WorkerId};
use squadron_core::lease::LeaseHolder;
use squadron_core::provider::Provider;
use squadron_core::task::TaskState;
use squadron_core::{Command, Outcome};
use squadron_proto::v1 as pb;
use squadron_proto::v1::agent_service_server::AgentService;
use tonic::{Request, Response, Status};

use super::worker::fence_of;
use super::{caller_of, invalid, key_of, propose, require_leader, unexpected};
use crate::authz::Caller;
use crate::error::ApiError;
use crate::node::ControlNode;
use squadron_core::access::AgentIdentity;
use squadron_core::error_code::ErrorCode;

/// The longest the leader holds an `AwaitRun` call before answering "ask again".
pub const AWAIT_RUN_WAIT_MS_MAX: u32 = 20_000;
/// How often a held `AwaitRun` looks at the task again.
const AWAIT_RUN_POLL_MS: u64 = 20;

#[derive(Debug, Clone)]
pub struct AgentGrpc {
    node: Arc<ControlNode>,
}

impl AgentGrpc {
    pub fn new(node: Arc<ControlNode>) -> Self {
        Self { node }
    }
}

fn missing(field: &str) -> Status {
    invalid(squadron_core::ValidationError::new(field, "is required"))
}

fn digest_opt(field: &str, s: &str) -> Result<Option<Digest>, Status> {
    if s.is_empty() {
        Ok(None)
    } else {
        Digest::parse(field, s).map(Some).map_err(invalid)
    }
}

#[tonic::async_trait]
impl AgentService for AgentGrpc {
    async fn acquire_lease(
        &self,
        request: Request<pb::AcquireLeaseRequest>,
    ) -> Result<Response<pb::LeaseGrant>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let holder = r.holder.ok_or_else(|| missing("holder"))?;
        let profile = ProfileId::new(r.profile).map_err(invalid)?;
        own_profile(&caller, profile, None)?;
        let command = Command::AcquireLease(AcquireLease {
            profile,
            expected_generation: Generation::new(r.expected_generation),
            provider: Provider::parse("provider", &r.provider).map_err(invalid)?,
            holder: LeaseHolder {
                worker: WorkerId::new(holder.worker).map_err(invalid)?,
                process: holder.process,
                cgroup: (!holder.cgroup.is_empty()).then_some(holder.cgroup),
            },
            ttl_ms: r.ttl_ms,
        });
        match propose(&self.node, &caller, key, command).await? {
            Outcome::LeaseGranted(g) => Ok(Response::new(pb::LeaseGrant {
                profile: g.profile.get(),
                lease: g.lease.get(),
                generation: g.generation.get(),
                expires_at_ms: g.expires_at_ms,
            })),
            o => Err(unexpected(&o)),
        }
    }

    async fn renew_lease(
        &self,
        request: Request<pb::RenewLeaseRequest>,
    ) -> Result<Response<pb::RenewLeaseReply>, Status> {
        let caller = caller_of(&request)?;
        let r = request.into_inner();
        let fence = fence_of(&r.fence.ok_or_else(|| missing("fence"))?)?;
        own_profile(&caller, fence.profile, Some(fence.generation))?;
        match propose(
            &self.node,
            &caller,
            None,
            Command::RenewLease(RenewLease {
                fence,
                ttl_ms: r.ttl_ms,
            }),
        )
        .await?
        {
            Outcome::LeaseRenewed { expires_at_ms } => {
                Ok(Response::new(pb::RenewLeaseReply { expires_at_ms }))
            }
            o => Err(unexpected(&o)),
        }
    }

    async fn release_lease(
        &self,
        request: Request<pb::FencingToken>,
    ) -> Result<Response<pb::ReleaseLeaseReply>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let fence = fence_of(&request.into_inner())?;
        own_profile(&caller, fence.profile, Some(fence.generation))?;
        propose(
            &self.node,
            &caller,
            key,
            Command::ReleaseLease(ReleaseLease { fence }),
        )
        .await?;
        Ok(Response::new(pb::ReleaseLeaseReply {}))
    }

    async fn commit_capsule(
        &self,
        request: Request<pb::CommitCapsuleRequest>,
    ) -> Result<Response<pb::CapsuleCommitted>, Status> {
        let caller = caller_of(&request)?;
        let key = key_of(&request)?;
        let r = request.into_inner();
        let fence = fence_of(&r.fence.ok_or_else(|| missing("fence"))?)?;
        own_profile(&caller, fence.profile, Some(fence.generation))?;
        let p = r.payload.ok_or_else(|| missing("payload"))?;
        let capsule = CapsuleDraft {
            sequence: r.sequence,
            previous: digest_opt("previous", &r.previous)?,
            schema_version: r.schema_version,
            payload: CapsulePayload {
                task_state: p.task_state,
                decisions: p.decisions,
                pending_work: p.pending_work,
                repository_revision: p.repository_revision,
                mailbox_cursor: p.mailbox_cursor,
                context_ref: p.context_ref,
            },
            expected_digest: digest_opt("expected_digest", &r.expected_digest)?,
        };
        match propose(
            &self.node,
            &caller,
            key,
            Command::CommitCapsule(CommitCapsule { fence, capsule }),
        )
        .await?
        {
            Outcome::CapsuleCommitted { sequence, digest } => {
                Ok(Response::new(pb::CapsuleCommitted {
                    sequence,
                    digest: digest.to_hex(),
                }))
            }
            o => Err(unexpected(&o)),
        }
    }

    async fn register(
        &self,
        request: Request<pb::AgentCheckInRequest>,
    ) -> Result<Response<pb::AgentCheckInReply>, Status> {
        self.check_in(request).await
    }

    async fn heartbeat(
        &self,
        request: Request<pb::AgentCheckInRequest>,
    ) -> Result<Response<pb::AgentCheckInReply>, Status> {
        self.check_in(request).await
    }

    /// Held on the leader until the task of this attempt is RUNNING or has ended, or the
    /// wait is over; the leader's applied state is read, which is what it committed.
    async fn await_run(
        &self,
        request: Request<pb::AwaitRunRequest>,
    ) -> Result<Response<pb::AwaitRunReply>, Status> {
        let caller = caller_of(&request)?;
        let r = request.into_inner();
        let task = TaskId::new(r.task).map_err(invalid)?;
        own_task(&caller, task)?;
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(u64::from(r.wait_ms.min(AWAIT_RUN_WAIT_MS_MAX)));
        loop {
            require_leader(&self.node)?;
            let (state, attempt) = self
                .node
                .state
                .with_state(|s| s.task(task).map(|t| (t.state, t.attempt)))
                .ok_or_else(|| ApiError::not_found(format!("task {task} not found")))?;
            let ended = state.is_terminal() || attempt != r.attempt;
            let run = !ended && matches!(state, TaskState::Running | TaskState::Completing);
            if run || ended || tokio::time::Instant::now() >= deadline {
                return Ok(Response::new(pb::AwaitRunReply {
                    state: state.to_string(),
                    run,
                    ended,
                }));
            }
            tokio::time::sleep(Duration::from_millis(AWAIT_RUN_POLL_MS)).await;
        }
    }

    /// The caller renews its own certificate; the core refuses once its task has ended.
    async fn renew_certificate(
        &self,
        request: Request<pb::RenewAgentCertificateRequest>,
    ) -> Result<Response<pb::AgentCertificate>, Status> {
        require_leader(&self.node)?;
        let caller = caller_of(&request)?;
        let Caller::Agent(agent) = &caller else {
            return Err(super::status(
                ErrorCode::PermissionDenied,
                format!("only an agent renews its certificate here, not {caller:?}"),
            ));
        };
        let identity = squadron_core::access::Identity::Agent(*agent);
        let csr_pem = request.into_inner().csr_pem;
        let renewed = crate::rest::enrollment::renew_identity(
            &self.node,
            &caller,
            None,
            identity,
            &csr_pem,
            &[],
        )
        .await?;
        Ok(Response::new(pb::AgentCertificate {
            cert_pem: renewed.cert_pem,
            ca_pem: renewed.ca_pem,
            serial: renewed.serial,
            not_after_ms: renewed.not_after_ms,
        }))
    }

    async fn check_mcp_use(
        &self,
        request: Request<pb::CheckMcpUseRequest>,
    ) -> Result<Response<pb::CheckMcpUseReply>, Status> {
        let caller = caller_of(&request)?;
        require_leader(&self.node)?;
        let r = request.into_inner();
        let profile = ProfileId::new(r.profile).map_err(invalid)?;
        own_profile(&caller, profile, None)?;
        let server = McpServerId::new(r.server).map_err(invalid)?;
        self.node
            .read_barrier(crate::node::Consistency::Linearizable)
            .await?;
        let denials = &self.node.counters.mcp_denials;
        let decision = self
            .node
            .state
            .with_state(|s| crate::rest::projects::mcp_decision(denials, s, profile, server))?;
        Ok(Response::new(pb::CheckMcpUseReply {
            subject: decision.subject,
            allowed: decision.allowed,
        }))
    }
}

impl AgentGrpc {
    async fn check_in(
        &self,
        request: Request<pb::AgentCheckInRequest>,
    ) -> Result<Response<pb::AgentCheckInReply>, Status> {
        let caller = caller_of(&request)?;
        let r = request.into_inner();
        let task = TaskId::new(r.task).map_err(invalid)?;
        own_task(&caller, task)?;
        let command = Command::AgentCheckIn(AgentCheckIn {
            task,
            attempt: r.attempt,
            usage: r.usage.map(|u| SandboxUsage {
                cpu_usec: u.cpu_usec,
                memory_bytes: u.memory_bytes,
                disk_bytes: u.disk_bytes,
            }),
            exit_code: r.exit_code,
        });
        match propose(&self.node, &caller, None, command).await? {
            Outcome::AgentCheckedIn {
                state,
                registered_at_ms,
            } => Ok(Response::new(pb::AgentCheckInReply {
                state: state.to_string(),
                registered_at_ms,
            })),
            o => Err(unexpected(&o)),
        }
    }
}

/// A task's agent certificate (`agent/task-{id}`) acts for that task only.
fn own_task(caller: &Caller, task: TaskId) -> Result<(), Status> {
    match caller {
        Caller::Agent(AgentIdentity::Task(mine)) if *mine == task => Ok(()),
        other => Err(super::status(
            ErrorCode::PermissionDenied,
            format!("only the agent of task {task} may call this, not {other:?}"),
        )),
    }
}

/// An agent's certificate names one profile generation (`agent/profile-{id}-g{n}`): it acts
/// for that profile only, and under a fence only with its own generation.
fn own_profile(
    caller: &Caller,
    profile: ProfileId,
    generation: Option<Generation>,
) -> Result<(), Status> {
    let denied = |why: String| super::status(ErrorCode::PermissionDenied, why);
    match caller {
        Caller::Agent(AgentIdentity::ProfileGeneration {
            profile: mine,
            generation: my_generation,
        }) => {
            if *mine != profile {
                return Err(denied(format!(
                    "agent of profile {mine} may not act for profile {profile}"
                )));
            }
            match generation {
                Some(g) if g != *my_generation => Err(denied(format!(
                    "agent of generation {} may not act under generation {}",
                    my_generation.get(),
                    g.get()
                ))),
                _ => Ok(()),
            }
        }
        other => Err(denied(format!(
            "only a profile's agent certificate may call this, not {other:?}"
        ))),
    }
}
