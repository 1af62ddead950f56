//! Decoders for what earlier versions wrote: log encoding 1 (commands without subjects),
//! snapshot version 1 (the state before the trust boundary), version 2 (before
//! credentials) and versions 3 to 7 (before worker policies, agent sessions, task leases,
//! credentials of agent profiles, egress bindings). Old entries are applied as
//! `Subject::Legacy`, exactly as they were applied then, so a data directory written by an
//! earlier build replays to the state it had. Nothing here is ever encoded.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::Deserialize;

use crate::access::{AccessState, Subject, TaskLineage};
use crate::agent_session::AgentSession;
use crate::command::{self as cmd, Batch, BatchedCommand, Command, CommandEnvelope};
use crate::credential::CredentialState;
use crate::credential_egress::EgressBinding;
use crate::idempotency::IdempotencyLedger;
use crate::ids::{
    CredentialId, IdempotencyKey, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, TaskId,
    TenantId, WorkerId,
};
use crate::lease::RuntimeLease;
use crate::mailbox::Mailbox;
use crate::profile::AgentProfile;
use crate::profile_credentials::ProfileCredentials;
use crate::project::Project;
use crate::state::{ProjectKey, State};
use crate::task_record::TaskRecord;
use crate::worker::Worker;
use crate::worker_policy::WorkerPolicy;

/// A log-encoding-1 envelope.
#[derive(Debug, Deserialize)]
pub struct CommandEnvelopeV1 {
    at_ms: u64,
    idempotency_key: Option<IdempotencyKey>,
    command: CommandV1,
}

/// The command enum as log encoding 1 knew it: the same variants in the same order; only the
/// batch differs (its commands had no subject).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum CommandV1 {
    CreateProject(cmd::CreateProject),
    AttachSandbox(cmd::AttachSandbox),
    DetachSandbox(cmd::DetachSandbox),
    CreateProfile(cmd::CreateProfile),
    SetCapabilityManifest(cmd::SetCapabilityManifest),
    GrantMcpUse(cmd::GrantMcpUse),
    RevokeMcpUse(cmd::RevokeMcpUse),
    AcquireLease(cmd::AcquireLease),
    RenewLease(cmd::RenewLease),
    RenewLeases(cmd::RenewLeases),
    ReleaseLease(cmd::ReleaseLease),
    FenceLease(cmd::FenceLease),
    RecordReapEvidence(cmd::RecordReapEvidence),
    GracefulTakeover(cmd::GracefulTakeover),
    CrashTakeover(cmd::CrashTakeover),
    CommitCapsule(cmd::CommitCapsule),
    PostMessage(cmd::PostMessage),
    AckMessages(cmd::AckMessages),
    SubmitTask(cmd::SubmitTask),
    AssignTasks(cmd::AssignTasks),
    ReportTransition(cmd::ReportTransition),
    ReportProgress(cmd::ReportProgress),
    CancelTask(cmd::CancelTask),
    RegisterWorker(cmd::RegisterWorker),
    WorkerHeartbeat(cmd::WorkerHeartbeat),
    DecommissionWorker(cmd::DecommissionWorker),
    Sweep,
    Batch(BatchV1),
}

#[derive(Debug, Deserialize)]
struct BatchV1 {
    commands: Vec<BatchedCommandV1>,
}

#[derive(Debug, Deserialize)]
struct BatchedCommandV1 {
    idempotency_key: Option<IdempotencyKey>,
    command: CommandV1,
}

impl From<CommandEnvelopeV1> for CommandEnvelope {
    fn from(v1: CommandEnvelopeV1) -> Self {
        CommandEnvelope {
            at_ms: v1.at_ms,
            idempotency_key: v1.idempotency_key,
            subject: Subject::Legacy,
            command: v1.command.into(),
        }
    }
}

impl From<CommandV1> for Command {
    fn from(v1: CommandV1) -> Self {
        use CommandV1 as V;
        match v1 {
            V::CreateProject(c) => Command::CreateProject(c),
            V::AttachSandbox(c) => Command::AttachSandbox(c),
            V::DetachSandbox(c) => Command::DetachSandbox(c),
            V::CreateProfile(c) => Command::CreateProfile(c),
            V::SetCapabilityManifest(c) => Command::SetCapabilityManifest(c),
            V::GrantMcpUse(c) => Command::GrantMcpUse(c),
            V::RevokeMcpUse(c) => Command::RevokeMcpUse(c),
            V::AcquireLease(c) => Command::AcquireLease(c),
            V::RenewLease(c) => Command::RenewLease(c),
            V::RenewLeases(c) => Command::RenewLeases(c),
            V::ReleaseLease(c) => Command::ReleaseLease(c),
            V::FenceLease(c) => Command::FenceLease(c),
            V::RecordReapEvidence(c) => Command::RecordReapEvidence(c),
            V::GracefulTakeover(c) => Command::GracefulTakeover(c),
            V::CrashTakeover(c) => Command::CrashTakeover(c),
            V::CommitCapsule(c) => Command::CommitCapsule(c),
            V::PostMessage(c) => Command::PostMessage(c),
            V::AckMessages(c) => Command::AckMessages(c),
            V::SubmitTask(c) => Command::SubmitTask(c),
            V::AssignTasks(c) => Command::AssignTasks(c),
            V::ReportTransition(c) => Command::ReportTransition(c),
            V::ReportProgress(c) => Command::ReportProgress(c),
            V::CancelTask(c) => Command::CancelTask(c),
            V::RegisterWorker(c) => Command::RegisterWorker(c),
            V::WorkerHeartbeat(c) => Command::WorkerHeartbeat(c),
            V::DecommissionWorker(c) => Command::DecommissionWorker(c),
            V::Sweep => Command::Sweep,
            V::Batch(b) => Command::Batch(Batch {
                commands: b
                    .commands
                    .into_iter()
                    .map(|c| BatchedCommand {
                        idempotency_key: c.idempotency_key,
                        subject: Subject::Legacy,
                        command: c.command.into(),
                    })
                    .collect(),
            }),
        }
    }
}

/// The state as snapshot version 1 encoded it: every field of today's state up to the
/// idempotency ledger, in the same order.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV1 {
    clock_ms: u64,
    next_profile_id: ProfileId,
    next_lease_id: LeaseId,
    next_task_id: TaskId,
    projects: BTreeMap<ProjectKey, Project>,
    profile_index: BTreeMap<(TenantId, ProjectId, ProfileKey), ProfileId>,
    profiles: BTreeMap<ProfileId, AgentProfile>,
    leases: BTreeMap<LeaseId, RuntimeLease>,
    lease_expiry: BTreeSet<(u64, LeaseId)>,
    mailboxes: BTreeMap<ProfileId, Mailbox>,
    mcp_use: BTreeSet<(ProfileId, McpServerId)>,
    tasks: BTreeMap<TaskId, TaskRecord>,
    pending: BTreeSet<(u8, TaskId)>,
    workers: BTreeMap<WorkerId, Worker>,
    idempotency: IdempotencyLedger,
}

impl From<StateV1> for State {
    fn from(v1: StateV1) -> Self {
        State {
            clock_ms: v1.clock_ms,
            next_profile_id: v1.next_profile_id,
            next_lease_id: v1.next_lease_id,
            next_task_id: v1.next_task_id,
            projects: v1.projects.into(),
            profile_index: v1.profile_index.into(),
            profiles: v1.profiles.into(),
            leases: v1.leases.into(),
            lease_expiry: v1.lease_expiry.into(),
            mailboxes: v1
                .mailboxes
                .into_iter()
                .map(|(id, m)| (id, Arc::new(m)))
                .collect(),
            mcp_use: v1.mcp_use,
            tasks: v1.tasks.into(),
            pending: v1.pending.into(),
            workers: v1.workers,
            idempotency: v1.idempotency,
            access: AccessState::default(),
            lineage: TaskLineage::default(),
            credentials: CredentialState::default(),
            worker_policies: BTreeMap::new(),
            agent_sessions: BTreeMap::new(),
            task_leases: BTreeMap::new(),
            profile_credentials: ProfileCredentials::default(),
            credential_egress: BTreeMap::new(),
            pruned_tasks: crate::task_tally::TaskTally::default(),
            provider_progress: BTreeMap::new(),
            ended: Default::default(),
        }
    }
}

/// Snapshot version 9: version 8, then the figures of pruned tasks; no provider progress.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV9(StateV8, crate::task_tally::TaskTally);

impl From<StateV9> for State {
    fn from(StateV9(v8, pruned_tasks): StateV9) -> Self {
        State {
            pruned_tasks,
            ..v8.into()
        }
    }
}

/// Snapshot version 8: version 7, then the egress bindings; no figures of pruned tasks.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV8(StateV7, BTreeMap<CredentialId, EgressBinding>);

impl From<StateV8> for State {
    fn from(StateV8(v7, credential_egress): StateV8) -> Self {
        State {
            credential_egress,
            ..v7.into()
        }
    }
}

/// Snapshot version 7: version 6, then the credentials of agent profiles; no egress bindings.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV7(StateV6, ProfileCredentials);

impl From<StateV7> for State {
    fn from(StateV7(v6, profile_credentials): StateV7) -> Self {
        State {
            profile_credentials,
            ..v6.into()
        }
    }
}

/// Snapshot version 6: version 5, then the task leases; no credentials of agent profiles.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV6(StateV5, BTreeMap<TaskId, LeaseId>);

impl From<StateV6> for State {
    fn from(StateV6(v5, task_leases): StateV6) -> Self {
        State {
            task_leases,
            ..v5.into()
        }
    }
}

/// Snapshot version 5: version 4, then the agent sessions; no task leases.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV5(StateV4, BTreeMap<TaskId, AgentSession>);

impl From<StateV5> for State {
    fn from(StateV5(v4, agent_sessions): StateV5) -> Self {
        State {
            agent_sessions,
            ..v4.into()
        }
    }
}

/// Snapshot version 4: version 3, then the workers' policies; no agent sessions.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV4(StateV3, BTreeMap<WorkerId, WorkerPolicy>);

impl From<StateV4> for State {
    fn from(StateV4(v3, worker_policies): StateV4) -> Self {
        State {
            worker_policies,
            ..v3.into()
        }
    }
}

/// Snapshot version 3: version 2, then credentials; no worker policies.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV3(StateV2, CredentialState);

impl From<StateV3> for State {
    fn from(StateV3(v2, credentials): StateV3) -> Self {
        State {
            credentials,
            ..v2.into()
        }
    }
}

/// Snapshot version 2: version 1's fields, then the trust boundary and lineage; no
/// credentials. bincode lays a struct and a tuple out alike (its fields in order, nothing
/// between), so version 1's struct followed by the two new fields decodes it.
#[derive(Debug, Deserialize)]
pub(crate) struct StateV2(StateV1, AccessState, TaskLineage);

impl From<StateV2> for State {
    fn from(StateV2(v1, access, lineage): StateV2) -> Self {
        State {
            access,
            lineage,
            ..v1.into()
        }
    }
}
