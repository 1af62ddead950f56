//! The replicated state and its one transition function, [`State::apply`].
//!
//! Handlers live in the `apply_*` modules beside this one, each an `impl State` block for one
//! area of the domain. Every handler checks everything first and mutates only after all checks
//! passed, so a rejected command changes nothing (the clock aside).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::access::{AccessState, AuditLog, OperatorToken, Subject, TaskLineage, TokenId};
use crate::agent_session::AgentSession;
use crate::apply_retention::EndedTasks;
use crate::codec::command_fingerprint;
use crate::command::{Batch, Command, CommandEnvelope};
use crate::credential::CredentialState;
use crate::credential_egress::EgressBinding;
use crate::idempotency::{IdempotencyLedger, IdempotencyLookup};
use crate::ids::{
    CredentialId, IdempotencyKey, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, TaskId,
    TenantId, WorkerId,
};
use crate::lease::RuntimeLease;
use crate::limits::COMMANDS_PER_BATCH_MAX;
use crate::mailbox::Mailbox;
use crate::profile::AgentProfile;
use crate::profile_credentials::ProfileCredentials;
use crate::project::Project;
use crate::rejection::{Entity, Rejection};
use crate::response::{Outcome, Response};
use crate::task::{AttemptProviderProgress, Task, TaskState};
use crate::task_record::TaskRecord;
use crate::task_tally::TaskTally;
use crate::worker::Worker;
use crate::worker_policy::WorkerPolicy;

/// A project's key: projects are unique within a tenant.
pub type ProjectKey = (TenantId, ProjectId);

pub use crate::persistent_maps::{PMap, PSet};

/// The whole replicated state. All collections are ordered maps so that encoding, digests and
/// iteration are the same on every replica (INV-12).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The largest command time applied so far; lease expiry is judged against it.
    pub(crate) clock_ms: u64,
    pub(crate) next_profile_id: ProfileId,
    pub(crate) next_lease_id: LeaseId,
    pub(crate) next_task_id: TaskId,
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
    pub(crate) projects: PMap<ProjectKey, Project>,
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
    pub(crate) profile_index: PMap<(TenantId, ProjectId, ProfileKey), ProfileId>,
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
    pub(crate) profiles: PMap<ProfileId, AgentProfile>,
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
    pub(crate) leases: PMap<LeaseId, RuntimeLease>,
    /// Active leases by expiry, so a sweep touches only what expired.
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_set")]
    pub(crate) lease_expiry: PSet<(u64, LeaseId)>,
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
    pub(crate) mailboxes: PMap<ProfileId, Arc<Mailbox>>,
    /// Relation tuples `profile:{id} → mcp_server:{name}#use` (INV-14).
    pub(crate) mcp_use: BTreeSet<(ProfileId, McpServerId)>,
    /// Each live task behind an `Arc`, so that a change to a map node a copy of the state
    /// shares copies the node's pointers, not its tasks; a task is copied only when it changes
    /// itself while a copy holds it (`Arc::make_mut`). Ended tasks are kept encoded
    /// (`task_record.rs`).
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_map")]
    pub(crate) tasks: PMap<TaskId, TaskRecord>,
    /// PENDING tasks by (inverse priority rank, id): first is next.
    #[serde(deserialize_with = "crate::persistent_maps::deserialize_set")]
    pub(crate) pending: PSet<(u8, TaskId)>,
    pub(crate) workers: BTreeMap<WorkerId, Worker>,
    pub(crate) idempotency: IdempotencyLedger,
    // Fields from here on came with snapshot version 2; a version-1 snapshot decodes with
    // them empty (`snapshot.rs`).
    /// Tokens, certificates and the audit record (DESIGN §5).
    pub(crate) access: AccessState,
    /// Parent links of child tasks.
    pub(crate) lineage: TaskLineage,
    // From here on: snapshot version 3; earlier versions decode with these empty.
    /// Sealed credentials and their session leases (INV-13).
    pub(crate) credentials: CredentialState,
    // From here on: snapshot version 4.
    /// What each worker agreed to run; a worker without an entry is held to nothing.
    pub(crate) worker_policies: BTreeMap<WorkerId, WorkerPolicy>,
    // From here on: snapshot version 5.
    /// The agent of each active task's sandbox that has registered.
    pub(crate) agent_sessions: BTreeMap<TaskId, AgentSession>,
    // From here on: snapshot version 6.
    /// The lease each running attempt of a `placement: project` task runs under.
    pub(crate) task_leases: BTreeMap<TaskId, LeaseId>,
    // From here on: snapshot version 7.
    /// The credentials of agent profiles and the leases that hand them out.
    pub(crate) profile_credentials: ProfileCredentials,
    // From here on: snapshot version 8.
    /// The credentials injected at egress, and where each may be sent.
    pub(crate) credential_egress: BTreeMap<CredentialId, EgressBinding>,
    // From here on: snapshot version 9.
    /// The figures of the ended tasks the retention policy pruned.
    pub(crate) pruned_tasks: TaskTally,
    // From here on: snapshot version 10.
    /// What each task's provider said of its run, as its worker last reported it.
    pub(crate) provider_progress: BTreeMap<TaskId, AttemptProviderProgress>,
    /// Ended tasks by end time: derived from `tasks`, rebuilt when a snapshot is decoded.
    #[serde(skip)]
    pub(crate) ended: EndedTasks,
}

impl Default for State {
    fn default() -> Self {
        Self::new()
    }
}

impl State {
    pub fn new() -> Self {
        Self {
            clock_ms: 0,
            next_profile_id: ProfileId::FIRST,
            next_lease_id: LeaseId::FIRST,
            next_task_id: TaskId::FIRST,
            projects: PMap::new(),
            profile_index: PMap::new(),
            profiles: PMap::new(),
            leases: PMap::new(),
            lease_expiry: PSet::new(),
            mailboxes: PMap::new(),
            mcp_use: BTreeSet::new(),
            tasks: PMap::new(),
            pending: PSet::new(),
            workers: BTreeMap::new(),
            idempotency: IdempotencyLedger::default(),
            access: AccessState::default(),
            lineage: TaskLineage::default(),
            credentials: CredentialState::default(),
            worker_policies: BTreeMap::new(),
            agent_sessions: BTreeMap::new(),
            task_leases: BTreeMap::new(),
            profile_credentials: ProfileCredentials::default(),
            credential_egress: BTreeMap::new(),
            pruned_tasks: TaskTally::default(),
            provider_progress: BTreeMap::new(),
            ended: EndedTasks::default(),
        }
    }

    /// Applies one command. Deterministic: the same state and envelope give the same result on
    /// every replica. Business rejections come back as `Response::Rejected` and leave the state
    /// as it was, except that the clock moves and a keyed command records its answer.
    pub fn apply(&mut self, envelope: CommandEnvelope) -> Response {
        let now = self.clock_ms.max(envelope.at_ms);
        self.clock_ms = now;
        match envelope.command {
            Command::Batch(Batch { commands }) => {
                if envelope.idempotency_key.is_some() {
                    return Response::Rejected(Rejection::invalid(
                        "idempotency_key",
                        "a batch carries a key per command, not one for the whole",
                    ));
                }
                if commands.len() > COMMANDS_PER_BATCH_MAX {
                    return Response::Rejected(Rejection::invalid(
                        "commands",
                        format!(
                            "a batch holds at most {COMMANDS_PER_BATCH_MAX} commands, got {}",
                            commands.len()
                        ),
                    ));
                }
                let responses = commands
                    .into_iter()
                    .map(|b| match b.command {
                        Command::Batch(_) => Response::Rejected(Rejection::invalid(
                            "command",
                            "a batch cannot hold a batch",
                        )),
                        command => self.apply_one(now, b.idempotency_key, &b.subject, command),
                    })
                    .collect();
                Response::Ok(Outcome::Batch { responses })
            }
            command => self.apply_one(now, envelope.idempotency_key, &envelope.subject, command),
        }
    }

    /// One command at time `now`: at most once per idempotency key (INV-11). The key is bound
    /// to the command and its subject, so another caller reusing a key is refused rather than
    /// shown the first caller's answer.
    fn apply_one(
        &mut self,
        now: u64,
        idempotency_key: Option<IdempotencyKey>,
        subject: &Subject,
        command: Command,
    ) -> Response {
        let Some(key) = idempotency_key else {
            return self.dispatch_audited(now, subject, command);
        };
        let fingerprint = command_fingerprint(subject, &command);
        match self.idempotency.lookup(&key, &fingerprint) {
            IdempotencyLookup::Replay(first) => return first.clone(),
            IdempotencyLookup::KeyReused => {
                return Response::Rejected(Rejection::IdempotencyKeyReused)
            }
            IdempotencyLookup::Miss => {}
        }
        let response = self.dispatch_audited(now, subject, command);
        self.idempotency
            .record(key, fingerprint, response.clone(), now);
        response
    }

    fn dispatch_audited(&mut self, now: u64, subject: &Subject, command: Command) -> Response {
        let audit = (!command.is_routine()).then(|| (command.name(), command.audit_target()));
        let response = self.dispatch(now, subject, command);
        if let (Some((name, target)), Response::Ok(_)) = (audit, &response) {
            self.access.audit.record(now, subject, name, target);
        }
        response
    }

    fn dispatch(&mut self, now: u64, subject: &Subject, command: Command) -> Response {
        use Command as C;
        let s = subject;
        let result = match command {
            C::CreateProject(c) => self.create_project(now, c),
            C::AttachSandbox(c) => self.attach_sandbox(now, s, c),
            C::DetachSandbox(c) => self.detach_sandbox(c),
            C::CreateProfile(c) => self.create_profile(now, c),
            C::SetCapabilityManifest(c) => self.set_capability_manifest(c),
            C::GrantMcpUse(c) => self.grant_mcp_use(c),
            C::RevokeMcpUse(c) => self.revoke_mcp_use(c),
            C::AcquireLease(c) => self.acquire_lease(now, s, c),
            C::RenewLease(c) => self.renew_lease(now, subject, c),
            C::RenewLeases(c) => self.renew_leases(now, s, c),
            C::ReleaseLease(c) => self.release_lease(now, subject, c),
            C::FenceLease(c) => self.fence_lease(now, c),
            C::RecordReapEvidence(c) => self.record_reap_evidence(now, s, c),
            C::GracefulTakeover(c) => self.graceful_takeover(now, s, c),
            C::CrashTakeover(c) => self.crash_takeover(now, s, c),
            C::CommitCapsule(c) => self.commit_capsule(now, subject, c),
            C::PostMessage(c) => self.post_message(now, c),
            C::AckMessages(c) => self.ack_messages(now, c),
            C::SubmitTask(c) => self.submit_task(now, s, c),
            C::AssignTasks(c) => self.assign_tasks(now, c),
            C::ReportTransition(c) => self.report_transition(now, s, c),
            C::ReportProgress(c) => self.report_progress(s, c),
            C::ReportProgressV2(c) => self.report_progress_v2(s, c),
            C::CancelTask(c) => self.cancel_task(now, c),
            C::RegisterWorker(c) => self.register_worker(now, s, c),
            C::WorkerHeartbeat(c) => self.worker_heartbeat(now, s, c),
            C::DecommissionWorker(c) => self.decommission_worker(now, s, c),
            C::Sweep => self.sweep(now, 0),
            C::LeaderSweep(c) => self.sweep(now, c.term_started_ms),
            C::PruneTasks(c) => self.prune_tasks(now, c),
            // `apply` unpacks batches; one reaching here was nested.
            C::Batch(_) => Err(Rejection::invalid("command", "a batch cannot hold a batch")),
            C::CreateOperatorToken(c) => self.create_operator_token(now, s, c),
            C::RevokeOperatorToken(c) => self.revoke_operator_token(now, s, c),
            C::MintBootstrapToken(c) => self.mint_bootstrap_token(now, s, c),
            C::Enroll(c) => self.enroll(now, c),
            C::RecordCertificate(c) => self.record_certificate(now, s, c),
            C::RevokeIdentity(c) => self.revoke_identity(now, s, c),
            C::PutCredential(c) => self.put_credential(now, s, c),
            C::RotateCredential(c) => self.rotate_credential(now, s, c),
            C::RevokeCredential(c) => self.revoke_credential(now, s, c),
            C::GrantCredentialLease(c) => self.grant_credential_lease(now, s, c),
            C::SetWorkerPolicy(c) => self.set_worker_policy(s, c),
            C::RequestAgentOperation(c) => self.request_agent_operation(s, c),
            C::AgentCheckIn(c) => self.agent_check_in(now, s, c),
            C::AssignProjectTasks(c) => self.assign_project_tasks(now, c),
            C::SetProfileCredentials(c) => self.set_profile_credentials(now, s, c),
            C::GrantAgentCredentialLease(c) => self.grant_agent_credential_lease(now, s, c),
            C::RegrantAgentCredentialLease(c) => self.regrant_agent_credential_lease(now, s, c),
            C::RegrantCredentialLease(c) => self.regrant_credential_lease(now, s, c),
            C::SetCredentialEgress(c) => self.set_credential_egress(now, s, c),
            C::RegisterWorkerWithPolicy(c) => self.register_worker_with_policy(now, s, c),
        };
        result.into()
    }

    // --- read access -----------------------------------------------------------------------

    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    pub fn project(&self, tenant: &TenantId, project: &ProjectId) -> Option<&Project> {
        self.projects.get(&(tenant.clone(), project.clone()))
    }

    pub fn projects(&self) -> impl Iterator<Item = &Project> {
        self.projects.values()
    }

    pub fn profile(&self, id: ProfileId) -> Option<&AgentProfile> {
        self.profiles.get(&id)
    }

    pub fn profile_by_key(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
        key: &ProfileKey,
    ) -> Option<&AgentProfile> {
        self.profile_index
            .get(&(tenant.clone(), project.clone(), key.clone()))
            .and_then(|id| self.profiles.get(id))
    }

    pub fn profiles(&self) -> impl Iterator<Item = &AgentProfile> {
        self.profiles.values()
    }

    pub fn lease(&self, id: LeaseId) -> Option<&RuntimeLease> {
        self.leases.get(&id)
    }

    pub fn leases(&self) -> impl Iterator<Item = &RuntimeLease> {
        self.leases.values()
    }

    /// Every task held, as a persistent map: a copy that shares the state's nodes, to scan
    /// after the state's lock is released.
    pub fn tasks_shared(&self) -> PMap<TaskId, TaskRecord> {
        self.tasks.clone()
    }

    pub fn mailbox(&self, profile: ProfileId) -> Option<&Mailbox> {
        self.mailboxes.get(&profile).map(Arc::as_ref)
    }

    /// INV-14: true only when the relation tuple for this exact profile subject exists.
    pub fn mcp_use_allowed(&self, profile: ProfileId, server: &McpServerId) -> bool {
        self.mcp_use.contains(&(profile, server.clone()))
    }

    /// The MCP servers this profile's subject may use (INV-14), in order.
    pub fn mcp_grants(&self, profile: ProfileId) -> impl Iterator<Item = &McpServerId> {
        self.mcp_use
            .iter()
            .filter(move |(p, _)| *p == profile)
            .map(|(_, server)| server)
    }

    /// The registered agent of an active task, if it has one.
    pub fn agent_session(&self, task: TaskId) -> Option<&AgentSession> {
        self.agent_sessions.get(&task)
    }

    /// The lease the running attempt of a `placement: project` task holds, if any.
    pub fn task_lease(&self, task: TaskId) -> Option<LeaseId> {
        self.task_leases.get(&task).copied()
    }

    /// What the task's provider said of its run, as its worker last reported it.
    pub fn provider_progress(&self, task: TaskId) -> Option<&AttemptProviderProgress> {
        self.provider_progress.get(&task)
    }

    /// Whether `lease` is a project task's (a worker's agent supervisor leaves those alone).
    pub fn is_task_lease(&self, lease: LeaseId) -> bool {
        self.task_leases.values().any(|l| *l == lease)
    }

    /// Every registered agent of a task's current attempt.
    pub fn agent_sessions(&self) -> impl Iterator<Item = (TaskId, &AgentSession)> {
        self.agent_sessions.iter().map(|(t, s)| (*t, s))
    }

    /// The task, decoded if it ended.
    pub fn task(&self, id: TaskId) -> Option<Arc<Task>> {
        self.tasks.get(&id).map(TaskRecord::task)
    }

    /// The task's state, without decoding an ended one.
    pub fn task_state(&self, id: TaskId) -> Option<TaskState> {
        self.tasks.get(&id).map(TaskRecord::state)
    }

    /// Tasks in id order, optionally only those in one state (filtered before an ended task
    /// is decoded).
    pub fn tasks(&self, state: Option<TaskState>) -> impl Iterator<Item = Arc<Task>> + '_ {
        self.tasks
            .values()
            .filter(move |t| state.is_none_or(|s| t.state() == s))
            .map(TaskRecord::task)
    }

    /// The task as the state holds it: what a filter reads before deciding to decode it.
    pub fn task_record(&self, id: TaskId) -> Option<&TaskRecord> {
        self.tasks.get(&id)
    }

    /// Task records with an id above `after`, in id order. Starts at `after` in the map
    /// instead of walking from the first task, so paging through a million tasks costs each
    /// page only its own entries.
    pub fn task_records_after(
        &self,
        after: u64,
    ) -> impl Iterator<Item = (TaskId, &TaskRecord)> + '_ {
        let from = TaskId::new(after.saturating_add(1)).unwrap_or(TaskId::FIRST);
        self.tasks
            .range(from..)
            .map(|(id, t)| (*id, t))
            .filter(move |(id, _)| id.get() > after)
    }

    /// Task records with an id below `before`, newest first: the other direction of
    /// `task_records_after`, with the same cost per page.
    pub fn task_records_before(
        &self,
        before: u64,
    ) -> impl Iterator<Item = (TaskId, &TaskRecord)> + '_ {
        self.tasks
            .range(..TaskId::new(before).unwrap_or(TaskId::FIRST))
            .rev()
            .map(|(id, t)| (*id, t))
            .filter(move |(id, _)| id.get() < before)
    }

    /// Tasks with an id above `after`, in id order, optionally only those in one state.
    pub fn tasks_after(
        &self,
        after: u64,
        state: Option<TaskState>,
    ) -> impl Iterator<Item = Arc<Task>> + '_ {
        self.task_records_after(after)
            .filter(move |(_, t)| state.is_none_or(|s| t.state() == s))
            .map(|(_, t)| t.task())
    }

    /// Tasks with an id below `before`, newest first, optionally only those in one state.
    pub fn tasks_before(
        &self,
        before: u64,
        state: Option<TaskState>,
    ) -> impl Iterator<Item = Arc<Task>> + '_ {
        self.task_records_before(before)
            .filter(move |(_, t)| state.is_none_or(|s| t.state() == s))
            .map(|(_, t)| t.task())
    }

    /// PENDING tasks in the order the scheduler takes them: priority, then submission.
    pub fn pending_queue(&self) -> impl Iterator<Item = TaskId> + '_ {
        self.pending.iter().map(|(_, id)| *id)
    }

    pub fn worker(&self, id: &WorkerId) -> Option<&Worker> {
        self.workers.get(id)
    }

    pub fn workers(&self) -> impl Iterator<Item = &Worker> {
        self.workers.values()
    }

    /// The policy a worker sent; `None` for one that sent none (held to nothing).
    pub fn worker_policy(&self, id: &WorkerId) -> Option<&WorkerPolicy> {
        self.worker_policies.get(id)
    }

    /// An operator token by id (revoked and expired ones too; see `OperatorToken::is_live`).
    pub fn operator_token(&self, id: &TokenId) -> Option<&OperatorToken> {
        self.access.operator_tokens.get(id)
    }

    pub fn operator_tokens(&self) -> impl Iterator<Item = &OperatorToken> {
        self.access.operator_tokens.values()
    }

    pub fn bootstrap_tokens(&self) -> impl Iterator<Item = &crate::access::BootstrapToken> {
        self.access.bootstrap_tokens.values()
    }

    /// A certificate record by serial.
    pub fn certificate(
        &self,
        serial: &crate::access::CertSerial,
    ) -> Option<&crate::access::IssuedCertificate> {
        self.access.certificates.get(serial)
    }

    pub fn audit(&self) -> &AuditLog {
        &self.access.audit
    }

    pub fn credentials(&self) -> &CredentialState {
        &self.credentials
    }

    pub fn lineage(&self) -> &TaskLineage {
        &self.lineage
    }

    pub fn idempotency(&self) -> &IdempotencyLedger {
        &self.idempotency
    }

    // --- lookups shared by handlers --------------------------------------------------------

    pub(crate) fn project_ref(&self, key: &ProjectKey) -> Result<&Project, Rejection> {
        self.projects
            .get(key)
            .ok_or_else(|| Rejection::not_found(Entity::Project, format!("{}/{}", key.0, key.1)))
    }

    pub(crate) fn profile_ref(&self, id: ProfileId) -> Result<&AgentProfile, Rejection> {
        self.profiles
            .get(&id)
            .ok_or_else(|| Rejection::not_found(Entity::Profile, id))
    }

    pub(crate) fn lease_ref(&self, id: LeaseId) -> Result<&RuntimeLease, Rejection> {
        self.leases
            .get(&id)
            .ok_or_else(|| Rejection::not_found(Entity::Lease, id))
    }

    pub(crate) fn task_ref(&self, id: TaskId) -> Result<Cow<'_, Task>, Rejection> {
        self.tasks
            .get(&id)
            .map(TaskRecord::view)
            .ok_or_else(|| Rejection::not_found(Entity::Task, id))
    }

    pub(crate) fn worker_ref(&self, id: &WorkerId) -> Result<&Worker, Rejection> {
        self.workers
            .get(id)
            .ok_or_else(|| Rejection::not_found(Entity::Worker, id))
    }
}
