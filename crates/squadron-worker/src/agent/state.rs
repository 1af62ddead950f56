//! The supervisor's own record of a profile's provider attempt, and the proof that a
//! generation is gone. The wire shapes (`AgentView`, `ReplacedGeneration`, the evidence
//! bodies of the lease commands) are made from these at the edges, so the supervisor's state
//! can change without changing what clients read.

use squadron_client::types::TakeoverEvidence;
use squadron_client::{AgentStatus, AgentView, ReplacedGeneration};
use squadron_core::ids::{
    Generation, LeaseId, ProfileId, ProfileKey, ProjectId, TenantId, WorkerId,
};
use squadron_core::lease::FencingToken;
use squadron_core::provider::Provider;
use squadron_proto::v1 as pb;

/// Where one provider attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AttemptStatus {
    Running,
    /// An operator's stop or a takeover is stopping it.
    Stopping,
    /// The provider ended on its own; its lease was released.
    Exited,
    /// The provider died from outside (killed); its lease is left to expire, and the next
    /// generation needs a crash takeover.
    Crashed,
    /// The worker could not renew the lease in time and stopped the provider itself.
    SelfFenced,
    /// Stopped by an operator or replaced by a takeover; reaped.
    Stopped,
}

impl From<AttemptStatus> for AgentStatus {
    fn from(s: AttemptStatus) -> Self {
        match s {
            AttemptStatus::Running => AgentStatus::Running,
            AttemptStatus::Stopping => AgentStatus::Stopping,
            AttemptStatus::Exited => AgentStatus::Exited,
            AttemptStatus::Crashed => AgentStatus::Crashed,
            AttemptStatus::SelfFenced => AgentStatus::SelfFenced,
            AttemptStatus::Stopped => AgentStatus::Stopped,
        }
    }
}

/// One profile's provider attempt on this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentState {
    pub(crate) profile: ProfileId,
    pub(crate) key: ProfileKey,
    pub(crate) tenant: TenantId,
    pub(crate) project: ProjectId,
    pub(crate) provider: Provider,
    pub(crate) lease: LeaseId,
    pub(crate) generation: Generation,
    pub(crate) status: AttemptStatus,
    /// The generation's cgroup leaf (the lease holder's cgroup).
    pub(crate) cgroup: String,
    pub(crate) exit_code: Option<i32>,
    /// The capsule sequence the attempt started from, if any.
    pub(crate) capsule_sequence: Option<u64>,
    /// Mailbox messages written to the generation's `mailbox.jsonl` so far.
    pub(crate) mailbox_delivered_through: u64,
}

impl AgentState {
    /// The fencing triple of the attempt's lease.
    pub(crate) fn token(&self) -> FencingToken {
        FencingToken {
            profile: self.profile,
            lease: self.lease,
            generation: self.generation,
        }
    }

    pub(crate) fn is_running(&self) -> bool {
        self.status == AttemptStatus::Running
    }

    /// What the worker's agent API answers about this attempt on `worker`; `replaced` is set
    /// when the answer comes from a takeover.
    pub(crate) fn view(&self, worker: &WorkerId, replaced: Option<&ReapProof>) -> AgentView {
        AgentView {
            profile: self.profile,
            key: self.key.clone(),
            tenant: self.tenant.clone(),
            project: self.project.clone(),
            worker: worker.clone(),
            provider: self.provider,
            lease: self.lease,
            generation: self.generation,
            status: self.status.into(),
            cgroup: self.cgroup.clone(),
            exit_code: self.exit_code,
            capsule_sequence: self.capsule_sequence,
            mailbox_delivered_through: self.mailbox_delivered_through,
            replaced: replaced.map(ReapProof::replaced),
            usage: None,
        }
    }
}

/// Proof that a generation's cgroup leaf was seen empty (`populated 0`). Only such proof is
/// kept or sent: a reap that left the leaf populated proves nothing and is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReapProof {
    pub(crate) lease: LeaseId,
    pub(crate) generation: Generation,
    pub(crate) cgroup: String,
    pub(crate) observed_at_ms: u64,
}

impl ReapProof {
    /// The previous generation of a takeover, as the agent API shows it.
    pub(crate) fn replaced(&self) -> ReplacedGeneration {
        ReplacedGeneration {
            lease: self.lease,
            generation: self.generation,
            cgroup: self.cgroup.clone(),
            populated: false,
            observed_at_ms: self.observed_at_ms,
        }
    }

    /// The evidence a takeover command carries.
    pub(crate) fn takeover_evidence(&self) -> TakeoverEvidence {
        TakeoverEvidence {
            cgroup: self.cgroup.clone(),
            populated: false,
            observed_at_ms: self.observed_at_ms,
        }
    }

    /// The evidence recorded under `token`'s lease, as the leader takes it.
    pub(crate) fn record(&self, token: &FencingToken) -> pb::ReapEvidenceRequest {
        pb::ReapEvidenceRequest {
            profile: token.profile.get(),
            lease: token.lease.get(),
            generation: token.generation.get(),
            cgroup: self.cgroup.clone(),
            populated: false,
            observed_at_ms: self.observed_at_ms,
        }
    }
}
