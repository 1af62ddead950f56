//! The agent facade's bodies: what an operator sends to launch, take over, stop or reap a
//! profile's provider process, and what the sandbox's worker answers. A control node relays
//! these between `/api/v1/profiles/{id}/agent/…` and the worker's `/worker/v1/agents/…`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use squadron_core::agent_session::SandboxUsage;
use squadron_core::ids::{
    Generation, LeaseId, ProfileId, ProfileKey, ProjectId, TaskId, TenantId, WorkerId,
};
use squadron_core::lease::FencingToken;
use squadron_core::manifest::RuntimeKind;
use squadron_core::provider::Provider;

/// Where a project's sandbox is made when the project has none yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SandboxRepository {
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
}

/// `POST /api/v1/profiles/{id}/agent/launch`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchAgent {
    /// The provider to run; by default the first of the profile's providers this worker can
    /// launch, in the profile's order of preference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    /// The worker that makes the project's sandbox, when the project has none yet; once a
    /// sandbox is attached every launch goes to its worker (INV-1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerId>,
    /// The repository the sandbox is cloned from, when it is made by this launch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository: Option<SandboxRepository>,
    /// Text given to the provider on standard input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TakeoverKind {
    /// Ask the running provider to stop (SIGTERM, grace), commit its capsule, fence, grant the
    /// next generation, start the next provider with the capsule.
    Graceful,
    /// The provider or its worker is gone: wait for expiry, reap for evidence, then grant.
    Crash,
}

/// `POST /api/v1/profiles/{id}/agent/takeover`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TakeoverAgent {
    pub kind: TakeoverKind,
    /// The next provider; by default the profile's preferred provider other than the current
    /// one (so a takeover swaps Codex for Claude and back), else the same.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    /// Crash takeover: how long to wait for the old lease to expire before giving up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_expiry_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
}

/// `POST /api/v1/profiles/{id}/agent/stop`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StopAgent {
    /// Between SIGTERM and SIGKILL; the worker's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_ms: Option<u64>,
}

/// Where one provider attempt is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
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

/// What the worker reports about a profile's provider attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentView {
    pub profile: ProfileId,
    pub key: ProfileKey,
    pub tenant: TenantId,
    pub project: ProjectId,
    pub worker: WorkerId,
    pub provider: Provider,
    pub lease: LeaseId,
    pub generation: Generation,
    pub status: AgentStatus,
    /// The generation's cgroup leaf (the lease holder's cgroup).
    pub cgroup: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// The capsule sequence the attempt started from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capsule_sequence: Option<u64>,
    /// Mailbox messages written to the profile's `/state/mailbox` so far.
    pub mailbox_delivered_through: u64,
    /// Set when the answer comes from a takeover: what became of the previous generation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced: Option<ReplacedGeneration>,
    /// What the generation's cgroup leaf and the profile's worktree and state use, measured by
    /// the worker as it answers; only while the generation's leaf exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<SandboxUsage>,
}

impl AgentView {
    /// The fencing triple of the attempt's lease.
    pub fn token(&self) -> FencingToken {
        FencingToken {
            profile: self.profile,
            lease: self.lease,
            generation: self.generation,
        }
    }
}

/// The previous generation of a takeover, and the proof it is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReplacedGeneration {
    pub lease: LeaseId,
    pub generation: Generation,
    pub cgroup: String,
    /// `false`: the cgroup was seen empty (`populated 0`).
    pub populated: bool,
    pub observed_at_ms: u64,
}

/// The Git broker's counters, as the evidence shows them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BrokerEvidence {
    pub commits_accepted: u64,
    /// Commits accepted while the fence was no longer current: dual writers. Must be 0.
    pub accepted_from_non_current: u64,
    /// Commits whose own lease ended (a stop, a fence) while they were written, with no newer
    /// generation: a race with the lease's end, not a second writer.
    #[serde(default)]
    pub ended_during_commit: u64,
    pub refused_stale_generation: u64,
    pub refused_other: u64,
}

/// The worker's half of `squadron evidence`: what only the sandbox's host can see. Fields a
/// worker of another version leaves out read as zero, so its answer still shows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(default)]
pub struct WorkerEvidence {
    pub worker: String,
    /// Project sandboxes of this project on the worker (INV-1: at most 1).
    pub sandboxes: u32,
    /// Most provider processes (populated generation leaves) of the project seen at once.
    pub peak_concurrent_processes: u32,
    pub processes_now: u32,
    /// Messages (roster deltas included) written into profiles' `/state/mailbox`.
    pub mailbox_messages_delivered: u64,
    pub roster_deltas_delivered: u64,
    pub self_fenced: u64,
    pub broker: BrokerEvidence,
    /// Cgroup directories of the project left on the host.
    pub cgroup_leaves_left: Vec<String>,
    /// Credential files left in the project's launch directories.
    pub credential_files_left: Vec<String>,
    /// SHA-256 of the worker's running binary (empty when it could not be read).
    pub binary_sha256: String,
    /// The worker's task sandboxes now, all runtimes (the whole worker's, not only this
    /// project's; those of tasks beyond the caller's scope shown as [`HeldSandbox::HIDDEN`]);
    /// absent from older workers.
    #[serde(default)]
    pub task_sandboxes: Vec<HeldSandbox>,
    /// Runtimes whose sandboxes could not be listed, with the error: `task_sandboxes` is then
    /// short of theirs.
    #[serde(default)]
    pub task_sandbox_errors: Vec<String>,
    /// The project sandbox's worktrees and Git's records of them, by path; absent from older
    /// workers.
    #[serde(default)]
    pub worktrees: Vec<String>,
}

/// A task sandbox a worker holds: a process runtime leaf, a container, a domain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HeldSandbox {
    pub runtime: RuntimeKind,
    /// The leaf, container or domain; [`HeldSandbox::HIDDEN`] for a task beyond the caller's
    /// scope.
    pub name: String,
    /// The task it was made for, as its name says (absent when hidden or unknown).
    #[serde(default)]
    pub task: Option<TaskId>,
}

impl HeldSandbox {
    /// The name shown for a sandbox of a task the caller may not see.
    pub const HIDDEN: &'static str = "hidden";

    /// `{runtime}:{name}`, as a soak counts it.
    pub fn label(&self) -> String {
        format!("{}:{}", self.runtime, self.name)
    }
}

/// `GET /worker/v1/build`: the SHA-256 of a worker's running binary (empty when it could not
/// be read).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct WorkerBuild {
    pub sha256: String,
}

/// The SHA-256 of one member's running binary, as it reported it (empty: no report).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct BuildDigest {
    /// `node {id}` or `worker {id}`.
    pub member: String,
    pub sha256: String,
}

/// `GET /api/v1/projects/{tenant}/{project}/evidence` (and `squadron evidence`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProjectEvidence {
    pub tenant: TenantId,
    pub project: ProjectId,
    pub profiles: u32,
    pub max_active: u32,
    /// From replicated state: the most slot-holding leases at once.
    pub peak_slots_held: u32,
    pub slots_held_now: u32,
    pub leases_granted: u64,
    pub takeovers_graceful: u64,
    pub takeovers_crash: u64,
    /// Roster deltas the control plane put into peers' mailboxes.
    pub roster_deltas_posted: u64,
    /// Leases of the project that are not terminal (Active or Fenced).
    pub leases_not_terminal: Vec<LeaseId>,
    /// MCP checks of the project's profiles answered 403 / PERMISSION_DENIED by the node(s)
    /// asked.
    pub unauthorized_mcp_denied: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_worker: Option<WorkerId>,
    /// The sandbox worker's half; absent when the project has no sandbox or the worker did
    /// not answer (then `worker_error` says why).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerEvidence>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_error: Option<String>,
    /// Each member's running binary: the answering node's own here; `squadron evidence` asks
    /// every member and adds the sandbox worker's.
    #[serde(default)]
    pub build_digests: Vec<BuildDigest>,
}
