//! `AgentService`.

use std::sync::Arc;

use squadron_core::capsule::{CapsuleDraft, CapsulePayload};
use squadron_core::command::{AcquireLease, CommitCapsule, ReleaseLease, RenewLease};
use squadron_core::ids::{Digest, Generation, McpServerId, ProfileId, WorkerId};
use squadron_core::lease::LeaseHolder;
use squadron_core::provider::Provider;
use squadron_core::{Command, Outcome, Rejection};
use squadron_proto::v1 as pb;
use squadron_proto::v1::agent_service_server::AgentService;
use tonic::{Request, Response, Status};

use super::worker::fence_of;
use super::{invalid, key_of, propose, require_leader, unexpected};
use crate::error::ApiError;
use crate::node::ControlNode;

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
        let key = key_of(&request)?;
        let r = request.into_inner();
        let holder = r.holder.ok_or_else(|| missing("holder"))?;
        let command = Command::AcquireLease(AcquireLease {
            profile: ProfileId::new(r.profile).map_err(invalid)?,
            expected_generation: Generation::new(r.expected_generation),
            provider: Provider::parse("provider", &r.provider).map_err(invalid)?,
            holder: LeaseHolder {
                worker: WorkerId::new(holder.worker).map_err(invalid)?,
                process: holder.process,
                cgroup: (!holder.cgroup.is_empty()).then_some(holder.cgroup),
            },
            ttl_ms: r.ttl_ms,
        });
        match propose(&self.node, key, command).await? {
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
        let r = request.into_inner();
        let fence = fence_of(&r.fence.ok_or_else(|| missing("fence"))?)?;
        match propose(
            &self.node,
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
        let key = key_of(&request)?;
        let fence = fence_of(&request.into_inner())?;
        propose(
            &self.node,
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
        let key = key_of(&request)?;
        let r = request.into_inner();
        let fence = fence_of(&r.fence.ok_or_else(|| missing("fence"))?)?;
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

    async fn check_mcp_use(
        &self,
        request: Request<pb::CheckMcpUseRequest>,
    ) -> Result<Response<pb::CheckMcpUseReply>, Status> {
        require_leader(&self.node)?;
        let r = request.into_inner();
        let profile = ProfileId::new(r.profile).map_err(invalid)?;
        let server = McpServerId::new(r.server).map_err(invalid)?;
        self.node
            .read_barrier(crate::node::Consistency::Linearizable)
            .await?;
        let subject = self.node.state.with_state(|s| {
            let p = s
                .profile(profile)
                .ok_or_else(|| ApiError::not_found(format!("profile {profile} not found")))?;
            if s.mcp_use_allowed(profile, &server) {
                Ok(p.subject.clone())
            } else {
                self.node.counters.mcp_denials.record(&p.tenant, &p.project);
                Err(ApiError::from(Rejection::PermissionDenied {
                    reason: format!("{} has no mcp_server:use relation to {server}", p.subject),
                }))
            }
        })?;
        Ok(Response::new(pb::CheckMcpUseReply {
            subject,
            allowed: true,
        }))
    }
}
