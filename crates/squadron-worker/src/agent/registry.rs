//! What the supervisor knows, behind its one lock: the attempts it supervises, the project
//! sandboxes it opened, per-project counters for the evidence, and releases still owed.
//!
//! Each method is one state transition, taken under one lock by the caller
//! (`AgentSupervisor::registry`); nothing here blocks or waits on the control plane.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use squadron_core::ids::{Generation, LeaseId, ProfileId, ProjectId, TenantId};
use squadron_core::lease::FencingToken;
use squadron_core::provider::Provider;

use crate::agent::attempt::AgentAttempt;
use crate::agent::project_sandbox::ProjectSandbox;
use crate::agent::state::{AgentState, AttemptStatus, ReapProof};
use crate::agent::supervisor::AgentSockets;

/// A project, as the registry keys it.
pub(crate) type ProjectKey = (TenantId, ProjectId);

#[derive(Debug, Default)]
pub(crate) struct Registry {
    sandboxes: BTreeMap<ProjectKey, Arc<ProjectSandbox>>,
    agents: BTreeMap<ProfileId, AgentEntry>,
    projects: BTreeMap<ProjectKey, ProjectCounters>,
    /// Leases of attempts that never started or ended, whose release did not get through.
    pending_releases: Vec<FencingToken>,
}

#[derive(Debug)]
pub(crate) struct AgentEntry {
    pub(crate) state: AgentState,
    pub(crate) attempt: AgentAttempt,
    pub(crate) sandbox: Arc<ProjectSandbox>,
    /// The Git broker's and the MCP gateway's sockets; dropped (closed) when the attempt
    /// stops.
    pub(crate) sockets: Option<AgentSockets>,
    /// Local clock: the provider must be gone by then unless a renewal moves it.
    pub(crate) deadline_ms: u64,
    /// Proof of this attempt's reap not yet accepted by the control plane.
    pub(crate) pending_evidence: Option<ReapProof>,
}

impl AgentEntry {
    fn project(&self) -> ProjectKey {
        (self.state.tenant.clone(), self.state.project.clone())
    }

    /// `mailbox.jsonl` of the attempt's generation.
    fn mailbox_file(&self) -> PathBuf {
        self.run_dir().join("mailbox.jsonl")
    }

    fn run_dir(&self) -> PathBuf {
        self.sandbox
            .profile_paths(&self.state.key)
            .generation_run_dir(self.state.generation)
    }
}

/// Counters of one project, for the evidence (saved as they are by `evidence_ledger.rs`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct ProjectCounters {
    pub(crate) peak_processes: u32,
    pub(crate) messages_delivered: u64,
    pub(crate) roster_deltas_delivered: u64,
    pub(crate) self_fenced: u64,
}

/// A running attempt, as the tick loop's checks see it.
#[derive(Debug, Clone)]
pub(crate) struct RunningAttempt {
    pub(crate) token: FencingToken,
    pub(crate) attempt: AgentAttempt,
    pub(crate) project: ProjectKey,
    pub(crate) mailbox_file: PathBuf,
    pub(crate) delivered_through: u64,
}

/// The running attempt a graceful takeover replaces.
#[derive(Debug, Clone)]
pub(crate) struct Replaceable {
    pub(crate) token: FencingToken,
    pub(crate) attempt: AgentAttempt,
    pub(crate) sandbox: Arc<ProjectSandbox>,
    pub(crate) provider: Provider,
}

impl Registry {
    pub(crate) fn state(&self, id: ProfileId) -> Option<AgentState> {
        self.agents.get(&id).map(|e| e.state.clone())
    }

    pub(crate) fn states(&self) -> Vec<AgentState> {
        self.agents.values().map(|e| e.state.clone()).collect()
    }

    pub(crate) fn knows(&self, id: ProfileId) -> bool {
        self.agents.contains_key(&id)
    }

    /// The generation the profile runs here, if its provider is running.
    pub(crate) fn running_generation(&self, id: ProfileId) -> Option<Generation> {
        self.agents
            .get(&id)
            .filter(|e| e.state.is_running())
            .map(|e| e.state.generation)
    }

    /// How many attempts run here, and the generation `id` runs if it does: what a launch
    /// is admitted on.
    pub(crate) fn admission(&self, id: ProfileId) -> (usize, Option<Generation>) {
        (self.running_count(), self.running_generation(id))
    }

    fn running_count(&self) -> usize {
        self.agents
            .values()
            .filter(|e| e.state.is_running())
            .count()
    }

    /// The profile's attempt, its lease and its status.
    pub(crate) fn attempt(
        &self,
        id: ProfileId,
    ) -> Option<(AgentAttempt, FencingToken, AttemptStatus)> {
        self.agents
            .get(&id)
            .map(|e| (e.attempt.clone(), e.state.token(), e.state.status))
    }

    /// The profile's running attempt at `generation`, for a graceful takeover.
    pub(crate) fn replaceable(&self, id: ProfileId, generation: Generation) -> Option<Replaceable> {
        self.agents
            .get(&id)
            .filter(|e| e.state.is_running() && e.state.generation == generation)
            .map(|e| Replaceable {
                token: e.state.token(),
                attempt: e.attempt.clone(),
                sandbox: e.sandbox.clone(),
                provider: e.state.provider,
            })
    }

    pub(crate) fn running(&self) -> Vec<RunningAttempt> {
        self.agents
            .values()
            .filter(|e| e.state.is_running())
            .map(|e| RunningAttempt {
                token: e.state.token(),
                attempt: e.attempt.clone(),
                project: e.project(),
                mailbox_file: e.mailbox_file(),
                delivered_through: e.state.mailbox_delivered_through,
            })
            .collect()
    }

    /// The leases of the running attempts: what a renewal batch renews.
    pub(crate) fn running_tokens(&self) -> Vec<FencingToken> {
        self.agents
            .values()
            .filter(|e| e.state.is_running())
            .map(|e| e.state.token())
            .collect()
    }

    /// Every attempt's local deadline.
    pub(crate) fn deadlines(&self) -> BTreeMap<ProfileId, u64> {
        self.agents
            .iter()
            .map(|(id, e)| (*id, e.deadline_ms))
            .collect()
    }

    pub(crate) fn insert(&mut self, entry: AgentEntry) {
        self.agents.insert(entry.state.profile, entry);
    }

    pub(crate) fn set_status(&mut self, id: ProfileId, status: AttemptStatus) {
        if let Some(entry) = self.agents.get_mut(&id) {
            entry.state.status = status;
        }
    }

    /// Moves a running attempt's deadline later; the deadline file to rewrite when it moved.
    pub(crate) fn move_deadline(&mut self, id: ProfileId, deadline: u64) -> Option<PathBuf> {
        let entry = self.agents.get_mut(&id)?;
        if !entry.state.is_running() || deadline <= entry.deadline_ms {
            return None;
        }
        entry.deadline_ms = deadline;
        Some(entry.run_dir().join("lease-deadline-ms"))
    }

    /// The attempt of `token` stops being trusted: marked self-fenced, counted, its broker
    /// socket closed. The attempt to stop, when it was running under that lease.
    pub(crate) fn self_fence(&mut self, token: FencingToken) -> Option<AgentAttempt> {
        let entry = self
            .agents
            .get_mut(&token.profile)
            .filter(|e| e.state.is_running() && e.state.lease == token.lease)?;
        entry.state.status = AttemptStatus::SelfFenced;
        entry.sockets = None;
        let attempt = entry.attempt.clone();
        let project = entry.project();
        self.projects.entry(project).or_default().self_fenced += 1;
        Some(attempt)
    }

    /// The provider of `token` ended with `code` (`None`: no exit recorded). `None` when the
    /// attempt moved on meanwhile (another operation took it); else whether it crashed (a
    /// death by signal, or no exit code), which closes its sockets.
    pub(crate) fn provider_ended(
        &mut self,
        token: FencingToken,
        code: Option<i32>,
    ) -> Option<bool> {
        let entry = self
            .agents
            .get_mut(&token.profile)
            .filter(|e| e.state.is_running() && e.state.lease == token.lease)?;
        let crashed = code.is_none_or(|c| c >= 128);
        entry.state.status = if crashed {
            AttemptStatus::Crashed
        } else {
            AttemptStatus::Exited
        };
        if code.is_some() {
            entry.state.exit_code = code;
        }
        if crashed {
            entry.sockets = None;
        }
        Some(crashed)
    }

    /// Closes the sockets (broker, MCP gateway, egress proxy) of whichever attempt runs under
    /// `lease`: it is being stopped, or its lease ended (what survives a failed stop must not
    /// keep them while its lease runs out). `false` when none does — the profile has moved
    /// on to a newer generation, which keeps its sockets.
    pub(crate) fn close_sockets_of(&mut self, lease: LeaseId) -> bool {
        match self.agents.values_mut().find(|e| e.state.lease == lease) {
            Some(entry) => {
                entry.sockets = None;
                true
            }
            None => false,
        }
    }

    /// The generation's evidence is recorded: nothing is pending and its socket is closed.
    pub(crate) fn reaped(&mut self, id: ProfileId) {
        if let Some(entry) = self.agents.get_mut(&id) {
            entry.pending_evidence = None;
            entry.sockets = None;
        }
    }

    pub(crate) fn queue_evidence(&mut self, id: ProfileId, proof: ReapProof) {
        if let Some(entry) = self.agents.get_mut(&id) {
            entry.pending_evidence = Some(proof);
        }
    }

    pub(crate) fn clear_evidence(&mut self, id: ProfileId) {
        if let Some(entry) = self.agents.get_mut(&id) {
            entry.pending_evidence = None;
        }
    }

    /// Proof waiting for the control plane, with the lease it is recorded under.
    pub(crate) fn pending_evidence(&self) -> Vec<(FencingToken, ReapProof)> {
        self.agents
            .values()
            .filter_map(|e| e.pending_evidence.clone().map(|p| (e.state.token(), p)))
            .collect()
    }

    pub(crate) fn owe_release(&mut self, token: FencingToken) {
        self.pending_releases.push(token);
    }

    pub(crate) fn owe_releases(&mut self, tokens: Vec<FencingToken>) {
        self.pending_releases.extend(tokens);
    }

    pub(crate) fn take_releases(&mut self) -> Vec<FencingToken> {
        std::mem::take(&mut self.pending_releases)
    }

    /// Messages written to the attempt's mailbox file through `seq`, counted for its project.
    pub(crate) fn delivered(
        &mut self,
        token: FencingToken,
        project: ProjectKey,
        seq: u64,
        messages: u64,
        roster: u64,
    ) {
        if let Some(entry) = self.agents.get_mut(&token.profile) {
            entry.state.mailbox_delivered_through = seq;
        }
        let c = self.projects.entry(project).or_default();
        c.messages_delivered += messages;
        c.roster_deltas_delivered += roster;
    }

    /// Keeps the peak of the project's populated generation leaves.
    pub(crate) fn processes_seen(&mut self, project: ProjectKey, now: u32) {
        let c = self.projects.entry(project).or_default();
        c.peak_processes = c.peak_processes.max(now);
    }

    pub(crate) fn counters(&self, project: &ProjectKey) -> ProjectCounters {
        self.projects.get(project).copied().unwrap_or_default()
    }

    /// A registry that goes on from the counters an earlier life of the worker saved.
    pub(crate) fn with_counters(saved: Vec<(ProjectKey, ProjectCounters)>) -> Registry {
        Registry {
            projects: saved.into_iter().collect(),
            ..Registry::default()
        }
    }

    /// Every project's counters, for the ledger.
    pub(crate) fn all_counters(&self) -> Vec<(ProjectKey, ProjectCounters)> {
        self.projects.iter().map(|(k, c)| (k.clone(), *c)).collect()
    }

    pub(crate) fn sandbox(&self, project: &ProjectKey) -> Option<Arc<ProjectSandbox>> {
        self.sandboxes.get(project).cloned()
    }

    pub(crate) fn add_sandbox(&mut self, project: ProjectKey, sandbox: Arc<ProjectSandbox>) {
        self.sandboxes.insert(project, sandbox);
    }

    /// Whether an attempt of the project is running or stopping here, or owes the control
    /// plane its reap evidence: its sandbox must stay.
    pub(crate) fn project_busy(&self, project: &ProjectKey) -> bool {
        self.agents.values().any(|a| {
            a.project() == *project
                && (matches!(
                    a.state.status,
                    AttemptStatus::Running | AttemptStatus::Stopping
                ) || a.pending_evidence.is_some())
        })
    }

    /// The project's sandbox was removed from this worker: it is opened afresh next time.
    pub(crate) fn forget_sandbox(&mut self, project: &ProjectKey) {
        self.sandboxes.remove(project);
    }

    /// The sandbox already opened for the project, else `sandbox`, kept.
    pub(crate) fn sandbox_or(
        &mut self,
        project: ProjectKey,
        sandbox: Arc<ProjectSandbox>,
    ) -> Arc<ProjectSandbox> {
        self.sandboxes.entry(project).or_insert(sandbox).clone()
    }
}
