//! The replicated state and its one transition function, [`State::apply`].
//!
//! Handlers live in the `apply_*` modules beside this one, each an `impl State` block for one
//! area of the domain. Every handler checks everything first and mutates only after all checks
//! passed, so a rejected command changes nothing (the clock aside).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::codec::command_fingerprint;
use crate::command::{Command, CommandEnvelope};
use crate::idempotency::{IdempotencyLedger, IdempotencyLookup};
use crate::ids::{
    IdempotencyKey, LeaseId, McpServerId, ProfileId, ProfileKey, ProjectId, TaskId, TenantId,
    WorkerId,
};
use crate::lease::RuntimeLease;
use crate::limits::COMMANDS_PER_BATCH_MAX;
use crate::mailbox::Mailbox;
use crate::profile::AgentProfile;
use crate::project::Project;
use crate::rejection::{Entity, Rejection};
use crate::response::{Outcome, Response};
use crate::task::{Task, TaskState};
use crate::worker::Worker;

/// A project's key: projects are unique within a tenant.
pub type ProjectKey = (TenantId, ProjectId);

/// The whole replicated state. All collections are ordered maps so that encoding, digests and
/// iteration are the same on every replica (INV-12).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The largest command time applied so far; lease expiry is judged against it.
    pub(crate) clock_ms: u64,
    pub(crate) next_profile_id: ProfileId,
    pub(crate) next_lease_id: LeaseId,
    pub(crate) next_task_id: TaskId,
    pub(crate) projects: BTreeMap<ProjectKey, Project>,
    pub(crate) profile_index: BTreeMap<(TenantId, ProjectId, ProfileKey), ProfileId>,
    pub(crate) profiles: BTreeMap<ProfileId, AgentProfile>,
    pub(crate) leases: BTreeMap<LeaseId, RuntimeLease>,
    /// Active leases by expiry, so a sweep touches only what expired.
    pub(crate) lease_expiry: BTreeSet<(u64, LeaseId)>,
    pub(crate) mailboxes: BTreeMap<ProfileId, Mailbox>,
    /// Relation tuples `profile:{id} → mcp_server:{name}#use` (INV-14).
    pub(crate) mcp_use: BTreeSet<(ProfileId, McpServerId)>,
    pub(crate) tasks: BTreeMap<TaskId, Task>,
    /// PENDING tasks by (inverse priority rank, id): first is next.
    pub(crate) pending: BTreeSet<(u8, TaskId)>,
    pub(crate) workers: BTreeMap<WorkerId, Worker>,
    pub(crate) idempotency: IdempotencyLedger,
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
            projects: BTreeMap::new(),
            profile_index: BTreeMap::new(),
            profiles: BTreeMap::new(),
            leases: BTreeMap::new(),
            lease_expiry: BTreeSet::new(),
            mailboxes: BTreeMap::new(),
            mcp_use: BTreeSet::new(),
            tasks: BTreeMap::new(),
            pending: BTreeSet::new(),
            workers: BTreeMap::new(),
            idempotency: IdempotencyLedger::default(),
        }
    }

    /// Applies one command. Deterministic: the same state and envelope give the same result on
    /// every replica. Business rejections come back as `Response::Rejected` and leave the state
    /// as it was, except that the clock moves and a keyed command records its answer.
    pub fn apply(&mut self, envelope: CommandEnvelope) -> Response {
        let now = self.clock_ms.max(envelope.at_ms);
        self.clock_ms = now;
        match envelope.command {
            Command::Batch { commands } => {
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
                        Command::Batch { .. } => Response::Rejected(Rejection::invalid(
                            "command",
                            "a batch cannot hold a batch",
                        )),
                        command => self.apply_one(now, b.idempotency_key, command),
                    })
                    .collect();
                Response::Ok(Outcome::Batch { responses })
            }
            command => self.apply_one(now, envelope.idempotency_key, command),
        }
    }

    /// One command at time `now`: at most once per idempotency key (INV-11).
    fn apply_one(
        &mut self,
        now: u64,
        idempotency_key: Option<IdempotencyKey>,
        command: Command,
    ) -> Response {
        let Some(key) = idempotency_key else {
            return self.dispatch(now, command);
        };
        let fingerprint = command_fingerprint(&command);
        match self.idempotency.lookup(&key, &fingerprint) {
            IdempotencyLookup::Replay(first) => return first.clone(),
            IdempotencyLookup::KeyReused => {
                return Response::Rejected(Rejection::IdempotencyKeyReused)
            }
            IdempotencyLookup::Miss => {}
        }
        let response = self.dispatch(now, command);
        self.idempotency
            .record(key, fingerprint, response.clone(), now);
        response
    }

    fn dispatch(&mut self, now: u64, command: Command) -> Response {
        use Command as C;
        let result = match command {
            C::CreateProject {
                tenant,
                project,
                max_profiles,
                max_active,
            } => self.create_project(now, tenant, project, max_profiles, max_active),
            C::AttachSandbox {
                tenant,
                project,
                worker,
                runtime,
                sandbox_ref,
            } => self.attach_sandbox(now, (tenant, project), worker, runtime, sandbox_ref),
            C::DetachSandbox {
                tenant,
                project,
                sandbox_ref,
            } => self.detach_sandbox((tenant, project), &sandbox_ref),
            C::CreateProfile {
                tenant,
                project,
                key,
                providers,
                context_ref,
            } => self.create_profile(now, (tenant, project), key, providers, context_ref),
            C::SetCapabilityManifest {
                profile,
                expected_version,
                required_skills,
                mcp_servers,
            } => self.set_capability_manifest(
                profile,
                expected_version,
                required_skills,
                mcp_servers,
            ),
            C::GrantMcpUse { profile, server } => self.grant_mcp_use(profile, server),
            C::RevokeMcpUse { profile, server } => self.revoke_mcp_use(profile, &server),
            C::AcquireLease {
                profile,
                expected_generation,
                provider,
                holder,
                ttl_ms,
            } => self.acquire_lease(now, profile, expected_generation, provider, holder, ttl_ms),
            C::RenewLease { fence, ttl_ms } => self.renew_lease(now, fence, ttl_ms),
            C::RenewLeases {
                worker,
                fences,
                ttl_ms,
            } => self.renew_leases(now, &worker, fences, ttl_ms),
            C::ReleaseLease { fence } => self.release_lease(now, fence),
            C::FenceLease { fence, reason } => self.fence_lease_cmd(now, fence, reason),
            C::RecordReapEvidence { profile, evidence } => {
                self.record_reap_evidence(now, profile, evidence)
            }
            C::GracefulTakeover {
                fence,
                capsule,
                next,
                old_reap_evidence,
            } => self.graceful_takeover(now, fence, capsule, next, old_reap_evidence),
            C::CrashTakeover {
                profile,
                lease,
                generation,
                next,
                reap_evidence,
            } => self.crash_takeover(now, profile, lease, generation, next, reap_evidence),
            C::CommitCapsule { fence, capsule } => self.commit_capsule_cmd(now, fence, capsule),
            C::PostMessage {
                to,
                sender,
                kind,
                body,
            } => self.post_message(now, to, sender, kind, body),
            C::AckMessages { fence, through_seq } => self.ack_messages(now, fence, through_seq),
            C::SubmitTask { spec } => self.submit_task(now, *spec),
            C::AssignTasks { assignments } => self.assign_tasks(now, assignments),
            C::ReportTransition {
                task,
                worker,
                attempt,
                from,
                to,
                detail,
            } => self.report_transition(now, task, &worker, attempt, from, to, detail),
            C::ReportProgress {
                task,
                worker,
                attempt,
                stdout_bytes,
                stderr_bytes,
                lines,
                events,
            } => self.report_progress(
                task,
                &worker,
                attempt,
                crate::task::TaskProgress {
                    stdout_bytes,
                    stderr_bytes,
                    lines,
                    events,
                },
            ),
            C::CancelTask { task, reason } => self.cancel_task(now, task, reason),
            C::RegisterWorker {
                worker,
                address,
                runtimes,
                capacity,
                labels,
                heartbeat_interval_ms,
            } => self.register_worker(
                now,
                worker,
                address,
                runtimes,
                capacity,
                labels,
                heartbeat_interval_ms,
            ),
            C::WorkerHeartbeat { worker } => self.worker_heartbeat(now, &worker),
            C::DecommissionWorker {
                worker,
                operator,
                reason,
            } => self.decommission_worker(now, &worker, operator, reason),
            C::Sweep => self.sweep(now),
            // `apply` unpacks batches; one reaching here was nested.
            C::Batch { .. } => Err(Rejection::invalid("command", "a batch cannot hold a batch")),
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

    pub fn mailbox(&self, profile: ProfileId) -> Option<&Mailbox> {
        self.mailboxes.get(&profile)
    }

    /// INV-14: true only when the relation tuple for this exact profile subject exists.
    pub fn mcp_use_allowed(&self, profile: ProfileId, server: &McpServerId) -> bool {
        self.mcp_use.contains(&(profile, server.clone()))
    }

    pub fn task(&self, id: TaskId) -> Option<&Task> {
        self.tasks.get(&id)
    }

    /// Tasks in id order, optionally only those in one state.
    pub fn tasks(&self, state: Option<TaskState>) -> impl Iterator<Item = &Task> {
        self.tasks
            .values()
            .filter(move |t| state.is_none_or(|s| t.state == s))
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

    pub(crate) fn task_ref(&self, id: TaskId) -> Result<&Task, Rejection> {
        self.tasks
            .get(&id)
            .ok_or_else(|| Rejection::not_found(Entity::Task, id))
    }

    pub(crate) fn worker_ref(&self, id: &WorkerId) -> Result<&Worker, Rejection> {
        self.workers
            .get(id)
            .ok_or_else(|| Rejection::not_found(Entity::Worker, id))
    }
}
