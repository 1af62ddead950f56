//! The validated task spec the state machine stores, section by section, with its defaults.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::keywords::{FailureAction, NetworkMode, RuntimeKind, StartupTrigger, TaskPriority};
use crate::ids::{CredentialId, ProfileKey, ProjectId, TenantId};
use crate::limits::{
    AGENT_CONNECT_BACKOFF_MS_DEFAULT, AGENT_CONNECT_RETRIES_DEFAULT, CANCEL_GRACE_MS_DEFAULT,
    CLONE_BACKOFF_MS_DEFAULT, CLONE_RETRIES_DEFAULT, HANG_TIMEOUT_MS_DEFAULT,
    PROVISION_BACKOFF_MS_DEFAULT, PROVISION_RETRIES_DEFAULT, PROVISION_TIMEOUT_MS_DEFAULT,
    STAGE_TIMEOUT_MS_DEFAULT, TASK_TIMEOUT_MS_DEFAULT,
};
use crate::provider::Provider;

/// A validated task manifest, as stored by the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TaskSpec {
    /// `metadata.name`: free text for humans, not an id.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub priority: TaskPriority,
    pub repository: RepositorySpec,
    pub agent: AgentSpec,
    pub sandbox: SandboxSpec,
    pub placement: Placement,
    pub startup_profile: Option<StartupProfileSpec>,
    pub lifecycle: LifecycleSpec,
}

impl TaskSpec {
    /// The runtime a worker must offer to run this task.
    pub fn requires_runtime(&self) -> RuntimeKind {
        self.sandbox.runtime
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RepositorySpec {
    pub url: String,
    pub branch: Option<String>,
    pub commit: Option<String>,
    pub subpath: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct AgentSpec {
    pub prompt: String,
    pub model: Option<String>,
    pub max_turns: Option<u32>,
    /// `None` leaves the provider's tool set alone; `Some` is a whitelist.
    pub allowed_tools: Option<Vec<String>>,
    pub provider: Provider,
    /// Present exactly when `provider` is `script`.
    pub script: Option<String>,
}

/// Unset sizes leave the choice to the worker's profile defaults.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SandboxSpec {
    pub profile: Option<String>,
    pub cpus: Option<u32>,
    pub memory_bytes: Option<u64>,
    pub disk_bytes: Option<u64>,
    pub network_mode: NetworkMode,
    pub runtime: RuntimeKind,
    pub full_control: bool,
}

/// Where the task runs: a fresh sandbox of its own, or the runtime of a project's agent profile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    #[default]
    Dedicated,
    Project {
        tenant: TenantId,
        project: ProjectId,
        profile: ProfileKey,
    },
}

impl Placement {
    /// The project a task placed in one belongs to; `None` for a dedicated task.
    pub fn project(&self) -> Option<(TenantId, ProjectId)> {
        match self {
            Placement::Dedicated => None,
            Placement::Project {
                tenant, project, ..
            } => Some((tenant.clone(), project.clone())),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StartupProfileSpec {
    pub id: String,
    pub trigger: StartupTrigger,
    pub session: SessionSpec,
    pub credential_refs: Vec<CredentialRef>,
    pub readiness: ReadinessSpec,
    pub observation: ObservationSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionSpec {
    pub launcher: String,
    pub workdir: String,
    pub cols: u16,
    pub rows: u16,
}

/// A reference to a credential, resolved into a session-scoped lease at run time; the secret
/// itself never enters the task record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialRef {
    pub id: CredentialId,
    pub mount: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ReadinessSpec {
    pub probes: Vec<ProbeSpec>,
}

/// The readiness probes the worker runs before the provider starts, as (provider, kind):
/// `auth` — the provider's API key credential is in the sandbox (mount `anthropic_api_key`,
/// `openai_api_key`); `cli` — its CLI runs; `github`/`repo_access` — the `github_token`
/// credential is there (the seed's example).
pub const PROBES: [(&str, &str); 5] = [
    ("claude", "auth"),
    ("claude", "cli"),
    ("codex", "auth"),
    ("codex", "cli"),
    ("github", "repo_access"),
];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ProbeSpec {
    pub provider: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ObservationSpec {
    pub retention_class: String,
    pub redaction_profile: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct LifecycleSpec {
    pub timeout_ms: u64,
    pub stage_timeout_ms: u64,
    pub provision_timeout_ms: u64,
    pub hang_timeout_ms: u64,
    pub cancel_grace_ms: u64,
    pub failure_action: FailureAction,
    pub artifact_patterns: Vec<String>,
    pub success_exit_codes: Vec<i32>,
    pub retries: RetryPolicy,
}

impl Default for LifecycleSpec {
    fn default() -> Self {
        Self {
            timeout_ms: TASK_TIMEOUT_MS_DEFAULT,
            stage_timeout_ms: STAGE_TIMEOUT_MS_DEFAULT,
            provision_timeout_ms: PROVISION_TIMEOUT_MS_DEFAULT,
            hang_timeout_ms: HANG_TIMEOUT_MS_DEFAULT,
            cancel_grace_ms: CANCEL_GRACE_MS_DEFAULT,
            failure_action: FailureAction::default(),
            artifact_patterns: Vec::new(),
            success_exit_codes: vec![0],
            retries: RetryPolicy::default(),
        }
    }
}

impl LifecycleSpec {
    /// Whether a process exit code counts as success.
    pub fn is_success_exit_code(&self, code: i32) -> bool {
        self.success_exit_codes.contains(&code)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RetryPolicy {
    pub clone: RetrySpec,
    pub provision: RetrySpec,
    pub agent_connect: RetrySpec,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            clone: RetrySpec::new(CLONE_RETRIES_DEFAULT, &CLONE_BACKOFF_MS_DEFAULT),
            provision: RetrySpec::new(PROVISION_RETRIES_DEFAULT, &PROVISION_BACKOFF_MS_DEFAULT),
            agent_connect: RetrySpec::new(
                AGENT_CONNECT_RETRIES_DEFAULT,
                &AGENT_CONNECT_BACKOFF_MS_DEFAULT,
            ),
        }
    }
}

/// Retries of one stage: at most `max` retries after the first attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct RetrySpec {
    pub max: u32,
    pub backoff_ms: Vec<u64>,
}

impl RetrySpec {
    pub fn new(max: u32, backoff_ms: &[u64]) -> Self {
        Self {
            max,
            backoff_ms: backoff_ms.to_vec(),
        }
    }

    /// Delay before retry number `attempt`, counted from 1 (0 is treated as 1). Past the end of
    /// `backoff_ms` the last entry repeats.
    pub fn delay_ms(&self, attempt: u32) -> u64 {
        let index = usize::try_from(attempt.saturating_sub(1)).unwrap_or(usize::MAX);
        self.backoff_ms
            .get(index)
            .or(self.backoff_ms.last())
            .copied()
            .unwrap_or(0)
    }
}
