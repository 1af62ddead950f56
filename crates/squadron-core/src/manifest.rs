//! Task manifests: the YAML or JSON a user submits, and the validated [`TaskSpec`] the state
//! machine stores.
//!
//! Two layers. The private `Raw*` structs mirror the document (unknown fields refused, paths
//! tracked by `serde_path_to_error`); converting them yields a typed `TaskSpec` with durations
//! in milliseconds, sizes in bytes and ids as newtypes. `TaskSpec` is encoded into the Raft log
//! with bincode's serde mode, so it uses only externally tagged enums, `Option`, `Vec` and
//! `BTreeMap`. Every semantic rule lives in [`TaskSpec::validate`], which the parser also runs,
//! so a spec decoded from the log is held to exactly the rules a fresh submission is.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize};

use crate::ids::{check_name, CredentialId, ProfileKey, ProjectId, TenantId};
use crate::limits::*;
use crate::provider::Provider;
use crate::quantity::{format_byte_size, format_duration_ms, parse_byte_size, parse_duration_ms};
use crate::validation_error::ValidationError;

/// The only manifest `version` this core reads.
pub const MANIFEST_VERSION: &str = "1";
/// The only manifest `kind` this core reads.
pub const MANIFEST_KIND: &str = "Task";
/// The label whose value sets [`TaskSpec::priority`].
pub const PRIORITY_LABEL: &str = "priority";

macro_rules! keyword_enum {
    (
        $(#[$doc:meta])*
        $name:ident, $what:literal, default $default:ident,
        { $($(#[$vdoc:meta])* $variant:ident = $text:literal),+ $(,)? }
    ) => {
        $(#[$doc])*
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $($(#[$vdoc])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            pub fn parse(field: &str, s: &str) -> Result<Self, ValidationError> {
                Self::ALL.iter().copied().find(|v| v.as_str() == s).ok_or_else(|| {
                    let expected: Vec<&str> = Self::ALL.iter().map(|v| v.as_str()).collect();
                    ValidationError::new(
                        field,
                        format!(
                            "unknown {} {s:?}; expected one of {}",
                            $what,
                            expected.join(", ")
                        ),
                    )
                })
            }
        }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl FromStr for $name {
            type Err = ValidationError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::parse($what, s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

keyword_enum!(
    /// Queue priority, set by the `priority` label. Declaration order is queue order.
    TaskPriority, "priority", default Normal,
    { Low = "low", Normal = "normal", High = "high", Critical = "critical" }
);

impl TaskPriority {
    /// 0 for `low` up to 3 for `critical`.
    pub fn rank(self) -> u8 {
        match self {
            TaskPriority::Low => 0,
            TaskPriority::Normal => 1,
            TaskPriority::High => 2,
            TaskPriority::Critical => 3,
        }
    }
}

keyword_enum!(
    /// What the sandbox may reach on the network.
    NetworkMode, "network_mode", default Outbound,
    {
        /// No network at all.
        Isolated = "isolated",
        /// Outbound connections only; inbound restricted to the management host.
        Outbound = "outbound",
        /// Unrestricted.
        Full = "full",
    }
);

keyword_enum!(
    /// The kind of sandbox a worker must offer to run the task.
    RuntimeKind, "runtime", default Process,
    {
        /// A plain process on the worker host.
        Process = "process",
        /// A Docker container.
        Docker = "docker",
        /// A KVM virtual machine.
        Kvm = "kvm",
    }
);

keyword_enum!(
    /// What happens to the sandbox when the task fails.
    FailureAction, "failure_action", default Destroy,
    {
        Destroy = "destroy",
        /// Keep the sandbox running for debugging.
        Preserve = "preserve",
    }
);

keyword_enum!(
    /// When a startup profile runs.
    StartupTrigger, "trigger", default OnInstanceReady,
    { OnInstanceReady = "on_instance_ready" }
);

/// A validated task manifest, as stored by the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositorySpec {
    pub url: String,
    pub branch: Option<String>,
    pub commit: Option<String>,
    pub subpath: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartupProfileSpec {
    pub id: String,
    pub trigger: StartupTrigger,
    pub session: SessionSpec,
    pub credential_refs: Vec<CredentialRef>,
    pub readiness: ReadinessSpec,
    pub observation: ObservationSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSpec {
    pub launcher: String,
    pub workdir: String,
    pub cols: u16,
    pub rows: u16,
}

/// A reference to a credential, resolved into a session-scoped lease at run time; the secret
/// itself never enters the task record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialRef {
    pub id: CredentialId,
    pub mount: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadinessSpec {
    pub probes: Vec<ProbeSpec>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeSpec {
    pub provider: String,
    pub kind: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObservationSpec {
    pub retention_class: String,
    pub redaction_profile: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

/// How the user spelled the aliased top-level sections, so errors name what they wrote.
#[derive(Clone, Copy)]
struct Spelling {
    agent: &'static str,
    vm: &'static str,
}

const CANONICAL: Spelling = Spelling {
    agent: "agent",
    vm: "vm",
};

impl TaskSpec {
    /// The runtime a worker must offer to run this task.
    pub fn requires_runtime(&self) -> RuntimeKind {
        self.sandbox.runtime
    }

    /// Re-checks a spec that arrived already decoded (from the Raft log, a snapshot, an RPC).
    /// Errors name fields by their canonical manifest paths (`agent.prompt`, `vm.memory`).
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.check(CANONICAL)
    }

    fn check(&self, spelling: Spelling) -> Result<(), ValidationError> {
        check_text("name", &self.name, TASK_NAME_BYTES_MAX).map_err(|e| e.within("metadata"))?;
        check_labels(&self.labels).map_err(|e| e.within("metadata"))?;
        let labelled = priority_from_labels(&self.labels)?;
        if self.labels.contains_key(PRIORITY_LABEL) && labelled != self.priority {
            return Err(ValidationError::new(
                "metadata.labels.priority",
                format!(
                    "says {} but the spec's priority is {}",
                    labelled, self.priority
                ),
            ));
        }
        self.repository
            .check()
            .map_err(|e| e.within("repository"))?;
        self.agent.check().map_err(|e| e.within(spelling.agent))?;
        self.sandbox.check().map_err(|e| e.within(spelling.vm))?;
        if let Some(startup) = &self.startup_profile {
            startup.check().map_err(|e| e.within("startup_profile"))?;
        }
        self.lifecycle.check().map_err(|e| e.within("lifecycle"))
    }
}

fn priority_from_labels(
    labels: &BTreeMap<String, String>,
) -> Result<TaskPriority, ValidationError> {
    match labels.get(PRIORITY_LABEL) {
        Some(value) => TaskPriority::parse("metadata.labels.priority", value),
        None => Ok(TaskPriority::Normal),
    }
}

impl RepositorySpec {
    fn check(&self) -> Result<(), ValidationError> {
        check_repo_url("url", &self.url)?;
        if let Some(branch) = &self.branch {
            check_branch("branch", branch)?;
        }
        if let Some(commit) = &self.commit {
            check_commit("commit", commit)?;
        }
        if let Some(subpath) = &self.subpath {
            check_relative_path("subpath", subpath, REPO_SUBPATH_BYTES_MAX)?;
        }
        Ok(())
    }
}

impl AgentSpec {
    fn check(&self) -> Result<(), ValidationError> {
        if self.prompt.trim().is_empty() {
            return Err(ValidationError::new("prompt", "must not be empty"));
        }
        check_len("prompt", &self.prompt, PROMPT_BYTES_MAX)?;
        if let Some(model) = &self.model {
            check_token("model", model, MODEL_BYTES_MAX)?;
        }
        if let Some(turns) = self.max_turns {
            check_range("max_turns", turns, AGENT_TURNS_MIN, AGENT_TURNS_MAX)?;
        }
        if let Some(tools) = &self.allowed_tools {
            check_count("allowed_tools", tools.len(), ALLOWED_TOOLS_MAX)?;
            for (i, tool) in tools.iter().enumerate() {
                check_token(&format!("allowed_tools[{i}]"), tool, TOOL_NAME_BYTES_MAX)?;
            }
        }
        match (self.provider, &self.script) {
            (Provider::Script, None) => Err(ValidationError::new(
                "script",
                "is required when provider is script",
            )),
            (Provider::Script, Some(script)) => {
                if script.trim().is_empty() {
                    return Err(ValidationError::new("script", "must not be empty"));
                }
                check_len("script", script, SCRIPT_BYTES_MAX)
            }
            (other, Some(_)) => Err(ValidationError::new(
                "script",
                format!("is allowed only when provider is script, not {other}"),
            )),
            (_, None) => Ok(()),
        }
    }
}

impl SandboxSpec {
    fn check(&self) -> Result<(), ValidationError> {
        if let Some(profile) = &self.profile {
            check_name("profile", profile)?;
        }
        if let Some(cpus) = self.cpus {
            check_range("cpus", cpus, SANDBOX_CPUS_MIN, SANDBOX_CPUS_MAX)?;
        }
        if let Some(memory) = self.memory_bytes {
            check_size_range(
                "memory",
                memory,
                SANDBOX_MEMORY_BYTES_MIN,
                SANDBOX_MEMORY_BYTES_MAX,
            )?;
        }
        if let Some(disk) = self.disk_bytes {
            check_size_range("disk", disk, SANDBOX_DISK_BYTES_MIN, SANDBOX_DISK_BYTES_MAX)?;
        }
        Ok(())
    }
}

impl StartupProfileSpec {
    fn check(&self) -> Result<(), ValidationError> {
        check_name("id", &self.id)?;
        self.session.check().map_err(|e| e.within("session"))?;
        check_count(
            "credential_refs",
            self.credential_refs.len(),
            CREDENTIAL_REFS_MAX,
        )?;
        for (i, cref) in self.credential_refs.iter().enumerate() {
            let field = format!("credential_refs[{i}].mount");
            check_name(&field, &cref.mount)?;
            if let Some(first) = self.credential_refs[..i]
                .iter()
                .position(|other| other.mount == cref.mount)
            {
                return Err(ValidationError::new(
                    field,
                    format!(
                        "{:?} is already used by credential_refs[{first}]; mounts must be unique",
                        cref.mount
                    ),
                ));
            }
        }
        let probes = &self.readiness.probes;
        check_count("readiness.probes", probes.len(), READINESS_PROBES_MAX)?;
        for (i, probe) in probes.iter().enumerate() {
            check_name(&format!("readiness.probes[{i}].provider"), &probe.provider)?;
            check_name(&format!("readiness.probes[{i}].kind"), &probe.kind)?;
        }
        check_name(
            "observation.retention_class",
            &self.observation.retention_class,
        )?;
        check_name(
            "observation.redaction_profile",
            &self.observation.redaction_profile,
        )
    }
}

impl SessionSpec {
    fn check(&self) -> Result<(), ValidationError> {
        check_name("launcher", &self.launcher)?;
        check_workdir("workdir", &self.workdir)?;
        check_range("cols", self.cols, TERMINAL_COLS_MIN, TERMINAL_COLS_MAX)?;
        check_range("rows", self.rows, TERMINAL_ROWS_MIN, TERMINAL_ROWS_MAX)
    }
}

impl LifecycleSpec {
    fn check(&self) -> Result<(), ValidationError> {
        let durations = [
            (
                "timeout",
                self.timeout_ms,
                TASK_TIMEOUT_MS_MIN,
                TASK_TIMEOUT_MS_MAX,
            ),
            (
                "stage_timeout",
                self.stage_timeout_ms,
                STAGE_TIMEOUT_MS_MIN,
                STAGE_TIMEOUT_MS_MAX,
            ),
            (
                "provision_timeout",
                self.provision_timeout_ms,
                PROVISION_TIMEOUT_MS_MIN,
                PROVISION_TIMEOUT_MS_MAX,
            ),
            (
                "hang_timeout",
                self.hang_timeout_ms,
                HANG_TIMEOUT_MS_MIN,
                HANG_TIMEOUT_MS_MAX,
            ),
            ("cancel_grace", self.cancel_grace_ms, 0, CANCEL_GRACE_MS_MAX),
        ];
        for (field, value, min, max) in durations {
            check_duration_range(field, value, min, max)?;
        }
        check_count(
            "artifact_patterns",
            self.artifact_patterns.len(),
            ARTIFACT_PATTERNS_MAX,
        )?;
        for (i, pattern) in self.artifact_patterns.iter().enumerate() {
            check_relative_path(
                &format!("artifact_patterns[{i}]"),
                pattern,
                ARTIFACT_PATTERN_BYTES_MAX,
            )?;
        }
        let codes = &self.success_exit_codes;
        if codes.is_empty() {
            return Err(ValidationError::new(
                "success_exit_codes",
                "must list at least one exit code",
            ));
        }
        check_count("success_exit_codes", codes.len(), SUCCESS_EXIT_CODES_MAX)?;
        for (i, code) in codes.iter().enumerate() {
            let field = format!("success_exit_codes[{i}]");
            check_range(&field, *code, 0, EXIT_CODE_MAX)?;
            if let Some(first) = codes[..i].iter().position(|other| other == code) {
                return Err(ValidationError::new(
                    field,
                    format!("{code} is already listed at success_exit_codes[{first}]"),
                ));
            }
        }
        let retries = &self.retries;
        for (name, spec) in [
            ("clone", &retries.clone),
            ("provision", &retries.provision),
            ("agent_connect", &retries.agent_connect),
        ] {
            spec.check().map_err(|e| e.within(name).within("retries"))?;
        }
        Ok(())
    }
}

impl RetrySpec {
    fn check(&self) -> Result<(), ValidationError> {
        check_range("max", self.max, 0, RETRIES_MAX)?;
        if self.backoff_ms.is_empty() {
            return Err(ValidationError::new(
                "backoff",
                "must list at least one delay",
            ));
        }
        check_count("backoff", self.backoff_ms.len(), RETRY_BACKOFF_ENTRIES_MAX)?;
        for (i, delay) in self.backoff_ms.iter().enumerate() {
            check_duration_range(&format!("backoff[{i}]"), *delay, 0, RETRY_BACKOFF_MS_MAX)?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Field checks. Each takes the field path relative to its section; callers add the parent with
// `ValidationError::within`.

fn check_len(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.len() > max {
        return Err(ValidationError::new(
            field,
            format!("must be at most {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

fn check_count(field: &str, count: usize, max: usize) -> Result<(), ValidationError> {
    if count > max {
        return Err(ValidationError::new(
            field,
            format!("must have at most {max} entries, got {count}"),
        ));
    }
    Ok(())
}

fn check_range<T: PartialOrd + fmt::Display>(
    field: &str,
    value: T,
    min: T,
    max: T,
) -> Result<(), ValidationError> {
    if value < min || value > max {
        return Err(ValidationError::new(
            field,
            format!("must be between {min} and {max}, got {value}"),
        ));
    }
    Ok(())
}

fn check_duration_range(field: &str, ms: u64, min: u64, max: u64) -> Result<(), ValidationError> {
    if ms < min || ms > max {
        return Err(ValidationError::new(
            field,
            format!(
                "must be between {} and {}, got {}",
                format_duration_ms(min),
                format_duration_ms(max),
                format_duration_ms(ms)
            ),
        ));
    }
    Ok(())
}

fn check_size_range(field: &str, bytes: u64, min: u64, max: u64) -> Result<(), ValidationError> {
    if bytes < min || bytes > max {
        return Err(ValidationError::new(
            field,
            format!(
                "must be between {} and {} (1024-based), got {}",
                format_byte_size(min),
                format_byte_size(max),
                format_byte_size(bytes)
            ),
        ));
    }
    Ok(())
}

/// Free text shown to humans: non-blank, bounded, no control characters.
fn check_text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.trim().is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, value, max)?;
    if let Some(bad) = value.chars().find(|c| c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {bad:?}"),
        ));
    }
    Ok(())
}

/// A single printable ASCII word: model names, tool names.
fn check_token(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, value, max)?;
    if let Some(bad) = value.chars().find(|c| !c.is_ascii_graphic()) {
        return Err(ValidationError::new(
            field,
            format!("may contain only printable ASCII without spaces, found {bad:?}"),
        ));
    }
    Ok(())
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ValidationError> {
    check_count("labels", labels.len(), LABELS_MAX)?;
    for (key, value) in labels {
        if key.is_empty() || key.len() > LABEL_KEY_BYTES_MAX {
            return Err(ValidationError::new(
                "labels",
                format!("key {key:?} must be 1 to {LABEL_KEY_BYTES_MAX} bytes"),
            ));
        }
        if let Some(bad) = key
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '/' | '-')))
        {
            return Err(ValidationError::new(
                "labels",
                format!("key {key:?} may contain only A-Z, a-z, 0-9, '.', '_', '/' and '-', found {bad:?}"),
            ));
        }
        let field = format!("labels.{key}");
        check_len(&field, value, LABEL_VALUE_BYTES_MAX)?;
        if let Some(bad) = value.chars().find(|c| c.is_control()) {
            return Err(ValidationError::new(
                field,
                format!("must not contain control characters, found {bad:?}"),
            ));
        }
    }
    Ok(())
}

const URL_FORMS: &str = "expected an https://, http://, ssh://, git:// or file:// URL, \
     an absolute local path, or user@host:path";

fn check_repo_url(field: &str, url: &str) -> Result<(), ValidationError> {
    if url.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, url, REPO_URL_BYTES_MAX)?;
    if let Some(bad) = url.chars().find(|c| c.is_whitespace() || c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain whitespace or control characters, found {bad:?}"),
        ));
    }
    let credentials = || {
        ValidationError::new(
            field,
            "must not carry credentials; reference them in startup_profile.credential_refs \
             so secrets never enter task records",
        )
    };
    // git hands hosts and users to ssh as arguments; a leading '-' would become an option.
    let option_like = || ValidationError::new(field, "host and user must not start with '-'");
    if url.starts_with('/') {
        return Ok(());
    }
    if let Some((scheme, rest)) = url.split_once("://") {
        let scheme = scheme.to_ascii_lowercase();
        if !matches!(scheme.as_str(), "https" | "http" | "ssh" | "git" | "file") {
            return Err(ValidationError::new(
                field,
                format!("unsupported scheme {scheme:?}; {URL_FORMS}"),
            ));
        }
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        let host = match authority.rsplit_once('@') {
            Some((userinfo, host)) => {
                // A user name alone is how ssh names its account, but over http it is where
                // access tokens go (`https://TOKEN@host`), so http refuses any user info.
                if userinfo.contains(':') || scheme.starts_with("http") {
                    return Err(credentials());
                }
                host
            }
            None => authority,
        };
        if host.is_empty() && scheme != "file" {
            return Err(ValidationError::new(
                field,
                format!("has no host; {URL_FORMS}"),
            ));
        }
        if host.starts_with('-') {
            return Err(option_like());
        }
        if rest.len() == authority.len() && scheme == "file" {
            return Err(ValidationError::new(
                field,
                format!("has no path; {URL_FORMS}"),
            ));
        }
        return Ok(());
    }
    // scp-like `user@host:path`.
    if let Some((userinfo, _)) = url.split_once('@') {
        if userinfo.contains(':') {
            return Err(credentials());
        }
    }
    let (user, host) = url
        .split_once(':')
        .filter(|(left, path)| !left.contains('/') && !path.is_empty())
        .and_then(|(left, _)| left.split_once('@'))
        .filter(|(user, host)| !user.is_empty() && !host.is_empty())
        .ok_or_else(|| {
            // The text is not echoed: an unrecognized form may still hold a token.
            ValidationError::new(
                field,
                format!("is not a recognized repository location; {URL_FORMS}"),
            )
        })?;
    if user.starts_with('-') || host.starts_with('-') {
        return Err(option_like());
    }
    Ok(())
}

/// Git's ref-name rules (`git check-ref-format`), applied to a branch name.
fn check_branch(field: &str, branch: &str) -> Result<(), ValidationError> {
    let bad = |why: &str| {
        ValidationError::new(
            field,
            format!("{branch:?} is not a valid branch name: {why}"),
        )
    };
    if branch.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, branch, GIT_BRANCH_BYTES_MAX)?;
    if let Some(c) = branch
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || "~^:?*[\\".contains(*c))
    {
        return Err(bad(&format!(
            "must not contain whitespace, control characters or any of ~^:?*[\\, found {c:?}"
        )));
    }
    if branch.starts_with('-') {
        return Err(bad("must not start with '-'"));
    }
    if branch.contains("..") {
        return Err(bad("must not contain '..'"));
    }
    if branch.contains("@{") || branch == "@" {
        return Err(bad("must not be '@' or contain '@{'"));
    }
    if branch.ends_with('.') {
        return Err(bad("must not end with '.'"));
    }
    for component in branch.split('/') {
        if component.is_empty() {
            return Err(bad("must not start or end with '/' or contain '//'"));
        }
        if component.starts_with('.') {
            return Err(bad("no '/'-separated part may start with '.'"));
        }
        if component.ends_with(".lock") {
            return Err(bad("no '/'-separated part may end with '.lock'"));
        }
    }
    Ok(())
}

fn check_commit(field: &str, commit: &str) -> Result<(), ValidationError> {
    let len_ok = (GIT_COMMIT_DIGITS_MIN..=GIT_COMMIT_DIGITS_MAX).contains(&commit.len());
    if !len_ok || !commit.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(ValidationError::new(
            field,
            format!(
                "must be {GIT_COMMIT_DIGITS_MIN} to {GIT_COMMIT_DIGITS_MAX} hex digits, got {commit:?}"
            ),
        ));
    }
    Ok(())
}

/// A path inside the repository or the outbox: relative and unable to climb out with `..`.
fn check_relative_path(field: &str, path: &str, max: usize) -> Result<(), ValidationError> {
    if path.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    check_len(field, path, max)?;
    if let Some(bad) = path.chars().find(|c| c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {bad:?}"),
        ));
    }
    if path.starts_with('/') {
        return Err(ValidationError::new(
            field,
            format!("must be a relative path, got {path:?}"),
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(ValidationError::new(
            field,
            format!("must not contain a '..' segment, got {path:?}"),
        ));
    }
    Ok(())
}

fn check_workdir(field: &str, path: &str) -> Result<(), ValidationError> {
    check_len(field, path, WORKDIR_BYTES_MAX)?;
    if !path.starts_with('/') {
        return Err(ValidationError::new(
            field,
            format!("must be an absolute path, got {path:?}"),
        ));
    }
    if let Some(bad) = path.chars().find(|c| c.is_control()) {
        return Err(ValidationError::new(
            field,
            format!("must not contain control characters, found {bad:?}"),
        ));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(ValidationError::new(
            field,
            format!("must not contain a '..' segment, got {path:?}"),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Parsing.

/// Parses and validates a YAML manifest.
pub fn parse_manifest_yaml(text: &str) -> Result<TaskSpec, ValidationError> {
    check_manifest_size(text)?;
    let de = serde_yaml::Deserializer::from_str(text);
    let raw: RawManifest = serde_path_to_error::deserialize(de)
        .map_err(|e| from_serde(e.path(), &e.inner().to_string()))?;
    raw.into_spec()
}

/// Parses and validates a JSON manifest.
pub fn parse_manifest_json(text: &str) -> Result<TaskSpec, ValidationError> {
    check_manifest_size(text)?;
    let mut de = serde_json::Deserializer::from_str(text);
    let raw: RawManifest = serde_path_to_error::deserialize(&mut de)
        .map_err(|e| from_serde(e.path(), &e.inner().to_string()))?;
    de.end()
        .map_err(|e| ValidationError::new(MANIFEST_FIELD, e.to_string()))?;
    raw.into_spec()
}

/// The field named by errors about the document as a whole.
const MANIFEST_FIELD: &str = "manifest";

fn check_manifest_size(text: &str) -> Result<(), ValidationError> {
    if text.len() > MANIFEST_BYTES_MAX {
        return Err(ValidationError::new(
            MANIFEST_FIELD,
            format!(
                "must be at most {MANIFEST_BYTES_MAX} bytes, got {}",
                text.len()
            ),
        ));
    }
    Ok(())
}

/// Turns a decoding error into a `ValidationError` naming the offending path.
fn from_serde(path: &serde_path_to_error::Path, message: &str) -> ValidationError {
    let path = path.to_string();
    let path = if path == "." { String::new() } else { path };
    // serde_yaml prefixes its own copy of the path (sometimes the parent's); the field
    // already carries it.
    let message = match message.split_once(": ") {
        Some((head, rest))
            if path == head
                || path.starts_with(&format!("{head}."))
                || path.starts_with(&format!("{head}[")) =>
        {
            rest
        }
        _ => message,
    };
    // Missing and duplicate fields are reported against their parent; name the field instead.
    for (prefix, reason) in [
        ("missing field `", "is required"),
        ("duplicate field `", "is given more than once"),
    ] {
        if let Some((name, tail)) = message
            .strip_prefix(prefix)
            .and_then(|rest| rest.split_once('`'))
        {
            let field = if path.is_empty() {
                name.to_string()
            } else {
                format!("{path}.{name}")
            };
            return ValidationError::new(field, format!("{reason}{tail}"));
        }
    }
    let field = if path.is_empty() {
        MANIFEST_FIELD.to_string()
    } else {
        path
    };
    ValidationError::new(field, message)
}

/// A scalar read as text whether the document wrote it quoted or not (`version: 1`,
/// `memory: 4096`); the field's own parser decides what the text means.
struct RawScalar(String);

impl<'de> Deserialize<'de> for RawScalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ScalarVisitor;
        impl Visitor<'_> for ScalarVisitor {
            type Value = RawScalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawScalar, E> {
                Ok(RawScalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawScalar, E> {
                Ok(RawScalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawScalar, E> {
                Ok(RawScalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<RawScalar, E> {
                Ok(RawScalar(v.to_string()))
            }
        }
        deserializer.deserialize_any(ScalarVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    version: RawScalar,
    kind: String,
    metadata: RawMetadata,
    repository: RawRepository,
    // `claude` and `sandbox` are aliases; kept as separate fields rather than serde aliases so
    // later errors can name the section as the user spelled it.
    agent: Option<RawAgent>,
    claude: Option<RawAgent>,
    vm: Option<RawSandbox>,
    sandbox: Option<RawSandbox>,
    placement: Option<RawPlacement>,
    startup_profile: Option<RawStartupProfile>,
    lifecycle: Option<RawLifecycle>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    name: String,
    #[serde(default)]
    labels: RawLabels,
}

/// Labels as a map that refuses a repeated key, where a plain map would keep the last value.
#[derive(Default)]
struct RawLabels(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for RawLabels {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelsVisitor;
        impl<'de> Visitor<'de> for LabelsVisitor {
            type Value = RawLabels;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of label names to values")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<RawLabels, A::Error> {
                let mut labels = BTreeMap::new();
                while let Some(key) = map.next_key::<String>()? {
                    let value: RawScalar = map.next_value()?;
                    if labels.contains_key(&key) {
                        return Err(de::Error::custom(format_args!(
                            "label {key:?} is given more than once"
                        )));
                    }
                    labels.insert(key, value.0);
                }
                Ok(RawLabels(labels))
            }
        }
        deserializer.deserialize_map(LabelsVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRepository {
    url: String,
    branch: Option<String>,
    commit: Option<RawScalar>,
    subpath: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    prompt: String,
    model: Option<String>,
    max_turns: Option<u64>,
    allowed_tools: Option<Vec<String>>,
    provider: Option<String>,
    script: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSandbox {
    profile: Option<String>,
    cpus: Option<u64>,
    memory: Option<RawScalar>,
    disk: Option<RawScalar>,
    network_mode: Option<NetworkMode>,
    runtime: Option<RuntimeKind>,
    full_control: Option<bool>,
}

#[derive(Deserialize, Default, PartialEq)]
#[serde(rename_all = "snake_case")]
enum RawPlacementKind {
    #[default]
    Dedicated,
    Project,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    kind: Option<RawPlacementKind>,
    tenant: Option<String>,
    project: Option<String>,
    profile: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStartupProfile {
    id: String,
    trigger: StartupTrigger,
    session: RawSession,
    #[serde(default)]
    credential_refs: Vec<RawCredentialRef>,
    #[serde(default)]
    readiness: Option<RawReadiness>,
    observation: RawObservation,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSession {
    launcher: String,
    workdir: String,
    cols: u64,
    rows: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredentialRef {
    id: String,
    mount: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReadiness {
    #[serde(default)]
    probes: Vec<RawProbe>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    provider: String,
    kind: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawObservation {
    retention_class: String,
    redaction_profile: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLifecycle {
    timeout: Option<RawScalar>,
    stage_timeout: Option<RawScalar>,
    provision_timeout: Option<RawScalar>,
    hang_timeout: Option<RawScalar>,
    cancel_grace: Option<RawScalar>,
    failure_action: Option<FailureAction>,
    artifact_patterns: Option<Vec<String>>,
    success_exit_codes: Option<Vec<i64>>,
    retries: Option<RawRetries>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetries {
    clone: Option<RawRetry>,
    provision: Option<RawRetry>,
    agent_connect: Option<RawRetry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    max: Option<u64>,
    backoff: Option<Vec<RawScalar>>,
}

/// Picks whichever spelling of an aliased section was given, refusing both.
fn pick_alias<T>(
    canonical: (&'static str, Option<T>),
    alias: (&'static str, Option<T>),
) -> Result<Option<(&'static str, T)>, ValidationError> {
    match (canonical, alias) {
        ((c, Some(_)), (a, Some(_))) => Err(ValidationError::new(
            a,
            format!("is an alias of {c}; give only one of {c} and {a}"),
        )),
        ((c, Some(v)), _) => Ok(Some((c, v))),
        (_, (a, Some(v))) => Ok(Some((a, v))),
        _ => Ok(None),
    }
}

/// Narrows an integer after checking its range, so the error quotes the value as written.
fn narrow<T: TryFrom<u64>>(
    field: &str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<T, ValidationError> {
    check_range(field, value, min, max)?;
    T::try_from(value).map_err(|_| ValidationError::new(field, format!("{value} is out of range")))
}

fn parse_duration_or(
    field: &str,
    raw: Option<RawScalar>,
    default: u64,
) -> Result<u64, ValidationError> {
    raw.map_or(Ok(default), |s| parse_duration_ms(field, &s.0))
}

impl RawManifest {
    fn into_spec(self) -> Result<TaskSpec, ValidationError> {
        if self.version.0 != MANIFEST_VERSION {
            return Err(ValidationError::new(
                "version",
                format!("must be {MANIFEST_VERSION:?}, got {:?}", self.version.0),
            ));
        }
        if self.kind != MANIFEST_KIND {
            return Err(ValidationError::new(
                "kind",
                format!("must be {MANIFEST_KIND:?}, got {:?}", self.kind),
            ));
        }
        let labels = self.metadata.labels.0;
        // Labels first, so a bad key is reported as such before the priority is read.
        check_labels(&labels).map_err(|e| e.within("metadata"))?;
        let priority = priority_from_labels(&labels)?;
        let repository = self
            .repository
            .into_spec()
            .map_err(|e| e.within("repository"))?;
        let (agent_name, agent) = pick_alias(("agent", self.agent), ("claude", self.claude))?
            .ok_or_else(|| {
                ValidationError::new("agent", "is required (the seed's `claude` is an alias)")
            })?;
        let agent = agent.into_spec().map_err(|e| e.within(agent_name))?;
        let (vm_name, sandbox) = match pick_alias(("vm", self.vm), ("sandbox", self.sandbox))? {
            Some((name, raw)) => (name, raw.into_spec().map_err(|e| e.within(name))?),
            None => ("vm", RawSandbox::default_spec()),
        };
        let placement = match self.placement {
            Some(raw) => raw.into_spec().map_err(|e| e.within("placement"))?,
            None => Placement::Dedicated,
        };
        let startup_profile = self
            .startup_profile
            .map(RawStartupProfile::into_spec)
            .transpose()
            .map_err(|e| e.within("startup_profile"))?;
        let lifecycle = match self.lifecycle {
            Some(raw) => raw.into_spec().map_err(|e| e.within("lifecycle"))?,
            None => LifecycleSpec::default(),
        };
        let spec = TaskSpec {
            name: self.metadata.name,
            labels,
            priority,
            repository,
            agent,
            sandbox,
            placement,
            startup_profile,
            lifecycle,
        };
        spec.check(Spelling {
            agent: agent_name,
            vm: vm_name,
        })?;
        Ok(spec)
    }
}

impl RawRepository {
    fn into_spec(self) -> Result<RepositorySpec, ValidationError> {
        Ok(RepositorySpec {
            url: self.url,
            branch: self.branch,
            commit: self.commit.map(|c| c.0),
            subpath: self.subpath,
        })
    }
}

impl RawAgent {
    fn into_spec(self) -> Result<AgentSpec, ValidationError> {
        let provider = match &self.provider {
            Some(p) => Provider::parse("provider", p)?,
            None => Provider::Claude,
        };
        let max_turns = self
            .max_turns
            .map(|t| {
                narrow(
                    "max_turns",
                    t,
                    u64::from(AGENT_TURNS_MIN),
                    u64::from(AGENT_TURNS_MAX),
                )
            })
            .transpose()?;
        Ok(AgentSpec {
            prompt: self.prompt,
            model: self.model,
            max_turns,
            allowed_tools: self.allowed_tools,
            provider,
            script: self.script,
        })
    }
}

impl RawSandbox {
    fn default_spec() -> SandboxSpec {
        SandboxSpec {
            profile: None,
            cpus: None,
            memory_bytes: None,
            disk_bytes: None,
            network_mode: NetworkMode::default(),
            runtime: RuntimeKind::default(),
            full_control: false,
        }
    }

    fn into_spec(self) -> Result<SandboxSpec, ValidationError> {
        let cpus = self
            .cpus
            .map(|c| {
                narrow(
                    "cpus",
                    c,
                    u64::from(SANDBOX_CPUS_MIN),
                    u64::from(SANDBOX_CPUS_MAX),
                )
            })
            .transpose()?;
        let memory_bytes = self
            .memory
            .map(|m| parse_byte_size("memory", &m.0))
            .transpose()?;
        let disk_bytes = self
            .disk
            .map(|d| parse_byte_size("disk", &d.0))
            .transpose()?;
        Ok(SandboxSpec {
            profile: self.profile,
            cpus,
            memory_bytes,
            disk_bytes,
            network_mode: self.network_mode.unwrap_or_default(),
            runtime: self.runtime.unwrap_or_default(),
            full_control: self.full_control.unwrap_or(false),
        })
    }
}

impl RawPlacement {
    fn into_spec(self) -> Result<Placement, ValidationError> {
        let kind = self.kind.unwrap_or_default();
        let fields = [
            ("tenant", self.tenant),
            ("project", self.project),
            ("profile", self.profile),
        ];
        if kind == RawPlacementKind::Dedicated {
            if let Some((name, _)) = fields.iter().find(|(_, v)| v.is_some()) {
                return Err(ValidationError::new(
                    *name,
                    "is allowed only when placement.kind is project",
                ));
            }
            return Ok(Placement::Dedicated);
        }
        let [(_, tenant), (_, project), (_, profile)] = fields;
        let required = |name: &str, value: Option<String>| {
            value.ok_or_else(|| {
                ValidationError::new(name, "is required when placement.kind is project")
            })
        };
        let tenant = required("tenant", tenant)?;
        let project = required("project", project)?;
        let profile = required("profile", profile)?;
        Ok(Placement::Project {
            tenant: TenantId::new(tenant).map_err(|e| refield(e, "tenant"))?,
            project: ProjectId::new(project).map_err(|e| refield(e, "project"))?,
            profile: ProfileKey::new(profile).map_err(|e| refield(e, "profile"))?,
        })
    }
}

/// Renames the field of an error from an id constructor, which names the id kind, not the path.
fn refield(err: ValidationError, field: &str) -> ValidationError {
    ValidationError::new(field, err.reason)
}

impl RawStartupProfile {
    fn into_spec(self) -> Result<StartupProfileSpec, ValidationError> {
        let session = SessionSpec {
            launcher: self.session.launcher,
            workdir: self.session.workdir,
            cols: narrow(
                "session.cols",
                self.session.cols,
                u64::from(TERMINAL_COLS_MIN),
                u64::from(TERMINAL_COLS_MAX),
            )?,
            rows: narrow(
                "session.rows",
                self.session.rows,
                u64::from(TERMINAL_ROWS_MIN),
                u64::from(TERMINAL_ROWS_MAX),
            )?,
        };
        check_count(
            "credential_refs",
            self.credential_refs.len(),
            CREDENTIAL_REFS_MAX,
        )?;
        let credential_refs = self
            .credential_refs
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let id = CredentialId::new(r.id)
                    .map_err(|e| refield(e, &format!("credential_refs[{i}].id")))?;
                Ok(CredentialRef { id, mount: r.mount })
            })
            .collect::<Result<Vec<_>, ValidationError>>()?;
        let probes = self
            .readiness
            .map(|r| r.probes)
            .unwrap_or_default()
            .into_iter()
            .map(|p| ProbeSpec {
                provider: p.provider,
                kind: p.kind,
            })
            .collect();
        Ok(StartupProfileSpec {
            id: self.id,
            trigger: self.trigger,
            session,
            credential_refs,
            readiness: ReadinessSpec { probes },
            observation: ObservationSpec {
                retention_class: self.observation.retention_class,
                redaction_profile: self.observation.redaction_profile,
            },
        })
    }
}

impl RawLifecycle {
    fn into_spec(self) -> Result<LifecycleSpec, ValidationError> {
        let success_exit_codes = match self.success_exit_codes {
            None => vec![0],
            Some(codes) => codes
                .into_iter()
                .enumerate()
                .map(|(i, code)| {
                    let field = format!("success_exit_codes[{i}]");
                    check_range(&field, code, 0, i64::from(EXIT_CODE_MAX))?;
                    i32::try_from(code).map_err(|_| ValidationError::new(field, "is out of range"))
                })
                .collect::<Result<_, _>>()?,
        };
        let retries = self.retries.map_or(Ok(RetryPolicy::default()), |raw| {
            raw.into_spec().map_err(|e| e.within("retries"))
        })?;
        Ok(LifecycleSpec {
            timeout_ms: parse_duration_or("timeout", self.timeout, TASK_TIMEOUT_MS_DEFAULT)?,
            stage_timeout_ms: parse_duration_or(
                "stage_timeout",
                self.stage_timeout,
                STAGE_TIMEOUT_MS_DEFAULT,
            )?,
            provision_timeout_ms: parse_duration_or(
                "provision_timeout",
                self.provision_timeout,
                PROVISION_TIMEOUT_MS_DEFAULT,
            )?,
            hang_timeout_ms: parse_duration_or(
                "hang_timeout",
                self.hang_timeout,
                HANG_TIMEOUT_MS_DEFAULT,
            )?,
            cancel_grace_ms: parse_duration_or(
                "cancel_grace",
                self.cancel_grace,
                CANCEL_GRACE_MS_DEFAULT,
            )?,
            failure_action: self.failure_action.unwrap_or_default(),
            artifact_patterns: self.artifact_patterns.unwrap_or_default(),
            success_exit_codes,
            retries,
        })
    }
}

impl RawRetries {
    fn into_spec(self) -> Result<RetryPolicy, ValidationError> {
        let defaults = RetryPolicy::default();
        let merge = |name: &str, raw: Option<RawRetry>, default: RetrySpec| {
            raw.map_or(Ok(default.clone()), |r| r.into_spec(&default))
                .map_err(|e| e.within(name))
        };
        Ok(RetryPolicy {
            clone: merge("clone", self.clone, defaults.clone)?,
            provision: merge("provision", self.provision, defaults.provision)?,
            agent_connect: merge("agent_connect", self.agent_connect, defaults.agent_connect)?,
        })
    }
}

impl RawRetry {
    fn into_spec(self, default: &RetrySpec) -> Result<RetrySpec, ValidationError> {
        let max = match self.max {
            Some(m) => narrow("max", m, 0, u64::from(RETRIES_MAX))?,
            None => default.max,
        };
        let backoff_ms = match self.backoff {
            Some(entries) => entries
                .iter()
                .enumerate()
                .map(|(i, e)| parse_duration_ms(&format!("backoff[{i}]"), &e.0))
                .collect::<Result<_, _>>()?,
            None => default.backoff_ms.clone(),
        };
        Ok(RetrySpec { max, backoff_ms })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_yaml::{Mapping, Value};

    /// The seed's "Task Manifest Reference", verbatim.
    const SEED: &str = r#"version: "1"
kind: Task

metadata:
  name: "Refactor authentication module"
  labels:
    team: platform
    priority: high

repository:
  url: https://github.com/org/repo
  branch: main
  # commit: abc123  # Optional: pin to commit
  # subpath: packages/auth  # Optional: subdirectory

claude:
  prompt: |
    Refactor the authentication module to use OAuth 2.0.
    Update all tests and documentation.
  model: claude-sonnet-4-5-20250929
  max_turns: 100
  # allowed_tools: [Read, Write, Edit, Bash, Glob, Grep]  # Optional whitelist

vm:
  profile: agentic-dev
  cpus: 4
  memory: 8G
  disk: 40G
  # network_mode: outbound  # isolated | outbound | full

startup_profile:
  id: startup-claude-refactor
  trigger: on_instance_ready
  session:
    launcher: agentic-claude-automation
    workdir: /workspace
    cols: 120
    rows: 30
  credential_refs:
    - id: cred_anthropic_platform_ci
      mount: anthropic_api_key
    - id: cred_github_repo_push
      mount: github_token
  readiness:
    probes:
      - provider: claude
        kind: auth
      - provider: github
        kind: repo_access
  observation:
    retention_class: credentialed-short
    redaction_profile: provider-secrets-v1

lifecycle:
  timeout: 24h
  failure_action: preserve  # destroy | preserve
  artifact_patterns:
    - "*.patch"
    - "coverage/**/*"
    - "reports/*.json"
"#;

    const MINIMAL: &str = r#"
version: "1"
kind: Task
metadata:
  name: minimal
repository:
  url: https://github.com/org/repo
agent:
  prompt: Fix the flaky test.
"#;

    const STARTUP: &str = r#"
id: startup-a
trigger: on_instance_ready
session: { launcher: agentic-claude-automation, workdir: /workspace, cols: 120, rows: 30 }
credential_refs:
  - { id: cred_a, mount: key_a }
  - { id: cred_b, mount: key_b }
readiness: { probes: [ { provider: claude, kind: auth } ] }
observation: { retention_class: short, redaction_profile: secrets-v1 }
"#;

    const GIB: u64 = 1 << 30;

    fn yaml(text: &str) -> Value {
        serde_yaml::from_str(text).unwrap()
    }

    fn set(doc: &mut Value, path: &str, value: Value) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap();
        let mut node = doc;
        for part in parts {
            let map = node.as_mapping_mut().unwrap();
            if !map.contains_key(part) {
                map.insert(part.into(), Value::Mapping(Mapping::new()));
            }
            node = map.get_mut(part).unwrap();
        }
        node.as_mapping_mut().unwrap().insert(last.into(), value);
    }

    fn remove(doc: &mut Value, path: &str) {
        let mut parts: Vec<&str> = path.split('.').collect();
        let last = parts.pop().unwrap();
        let mut node = doc;
        for part in parts {
            node = node.get_mut(part).unwrap();
        }
        node.as_mapping_mut().unwrap().remove(last);
    }

    /// The minimal manifest with `(path, yaml value)` edits applied; value `-` removes the field.
    fn mutated(edits: &[(&str, &str)]) -> Value {
        let mut doc = yaml(MINIMAL);
        for (path, value) in edits {
            if *value == "-" {
                remove(&mut doc, path);
            } else {
                set(&mut doc, path, yaml(value));
            }
        }
        doc
    }

    fn parse_both(
        doc: &Value,
    ) -> (
        Result<TaskSpec, ValidationError>,
        Result<TaskSpec, ValidationError>,
    ) {
        let from_yaml = parse_manifest_yaml(&serde_yaml::to_string(doc).unwrap());
        let from_json = parse_manifest_json(&serde_json::to_string(doc).unwrap());
        (from_yaml, from_json)
    }

    fn repeat_list(item: &str, n: usize) -> String {
        format!("[{}]", vec![item; n].join(", "))
    }

    fn numbered_list(prefix: &str, n: usize) -> String {
        let items: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
        format!("[{}]", items.join(", "))
    }

    #[test]
    fn seed_example_parses() {
        let spec = parse_manifest_yaml(SEED).unwrap();
        assert_eq!(spec.name, "Refactor authentication module");
        assert_eq!(spec.priority, TaskPriority::High);
        assert_eq!(
            spec.labels.get("team").map(String::as_str),
            Some("platform")
        );
        assert_eq!(spec.repository.url, "https://github.com/org/repo");
        assert_eq!(spec.repository.branch.as_deref(), Some("main"));
        assert_eq!(spec.repository.commit, None);
        assert!(spec
            .agent
            .prompt
            .starts_with("Refactor the authentication module"));
        assert_eq!(
            spec.agent.model.as_deref(),
            Some("claude-sonnet-4-5-20250929")
        );
        assert_eq!(spec.agent.max_turns, Some(100));
        assert_eq!(spec.agent.provider, Provider::Claude);
        assert_eq!(spec.agent.allowed_tools, None);
        assert_eq!(spec.agent.script, None);
        assert_eq!(
            spec.sandbox,
            SandboxSpec {
                profile: Some("agentic-dev".into()),
                cpus: Some(4),
                memory_bytes: Some(8 * GIB),
                disk_bytes: Some(40 * GIB),
                network_mode: NetworkMode::Outbound,
                runtime: RuntimeKind::Process,
                full_control: false,
            }
        );
        assert_eq!(spec.requires_runtime(), RuntimeKind::Process);
        assert_eq!(spec.placement, Placement::Dedicated);
        let startup = spec.startup_profile.as_ref().unwrap();
        assert_eq!(startup.id, "startup-claude-refactor");
        assert_eq!(startup.trigger, StartupTrigger::OnInstanceReady);
        assert_eq!(startup.session.workdir, "/workspace");
        assert_eq!((startup.session.cols, startup.session.rows), (120, 30));
        assert_eq!(startup.credential_refs.len(), 2);
        assert_eq!(
            startup.credential_refs[1].id.as_str(),
            "cred_github_repo_push"
        );
        assert_eq!(startup.credential_refs[1].mount, "github_token");
        assert_eq!(startup.readiness.probes[1].kind, "repo_access");
        assert_eq!(startup.observation.redaction_profile, "provider-secrets-v1");
        let lifecycle = &spec.lifecycle;
        assert_eq!(lifecycle.failure_action, FailureAction::Preserve);
        assert_eq!(lifecycle.timeout_ms, 86_400_000);
        assert_eq!(lifecycle.stage_timeout_ms, 15 * 60_000);
        assert_eq!(lifecycle.provision_timeout_ms, 10 * 60_000);
        assert_eq!(lifecycle.hang_timeout_ms, 30 * 60_000);
        assert_eq!(lifecycle.cancel_grace_ms, 30_000);
        assert_eq!(
            lifecycle.artifact_patterns,
            ["*.patch", "coverage/**/*", "reports/*.json"]
        );
        assert_eq!(lifecycle.success_exit_codes, [0]);
        assert!(lifecycle.is_success_exit_code(0));
        assert!(!lifecycle.is_success_exit_code(1));
        assert_eq!(lifecycle.retries, RetryPolicy::default());
        assert_eq!(lifecycle.retries.clone.backoff_ms, [5_000, 10_000, 20_000]);
        assert_eq!(spec.validate(), Ok(()));
    }

    #[test]
    fn seed_example_round_trips_through_bincode() {
        let spec = parse_manifest_yaml(SEED).unwrap();
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&spec, config).unwrap();
        let (decoded, used): (TaskSpec, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(decoded, spec);
        assert_eq!(decoded.validate(), Ok(()));
    }

    #[test]
    fn project_placement_round_trips_through_bincode() {
        let doc = mutated(&[(
            "placement",
            "{ kind: project, tenant: acme, project: web, profile: reviewer }",
        )]);
        let spec = parse_both(&doc).0.unwrap();
        assert_eq!(
            spec.placement,
            Placement::Project {
                tenant: TenantId::new("acme").unwrap(),
                project: ProjectId::new("web").unwrap(),
                profile: ProfileKey::new("reviewer").unwrap(),
            }
        );
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(&spec, config).unwrap();
        let (decoded, _): (TaskSpec, usize) =
            bincode::serde::decode_from_slice(&bytes, config).unwrap();
        assert_eq!(decoded, spec);
    }

    #[test]
    fn minimal_manifest_takes_defaults() {
        let spec = parse_manifest_yaml(MINIMAL).unwrap();
        let expected = TaskSpec {
            name: "minimal".into(),
            labels: BTreeMap::new(),
            priority: TaskPriority::Normal,
            repository: RepositorySpec {
                url: "https://github.com/org/repo".into(),
                branch: None,
                commit: None,
                subpath: None,
            },
            agent: AgentSpec {
                prompt: "Fix the flaky test.".into(),
                model: None,
                max_turns: None,
                allowed_tools: None,
                provider: Provider::Claude,
                script: None,
            },
            sandbox: RawSandbox::default_spec(),
            placement: Placement::Dedicated,
            startup_profile: None,
            lifecycle: LifecycleSpec::default(),
        };
        assert_eq!(spec, expected);
        assert_eq!(spec.sandbox.network_mode, NetworkMode::Outbound);
        assert_eq!(spec.sandbox.runtime, RuntimeKind::Process);
        assert_eq!(spec.lifecycle.failure_action, FailureAction::Destroy);
        assert_eq!(spec.validate(), Ok(()));

        let json = r#"{"version": "1", "kind": "Task", "metadata": {"name": "minimal"},
            "repository": {"url": "https://github.com/org/repo"},
            "agent": {"prompt": "Fix the flaky test."}}"#;
        assert_eq!(parse_manifest_json(json).unwrap(), expected);
    }

    #[test]
    fn full_manifest_with_every_extension_parses() {
        let doc = mutated(&[
            ("version", "1"),
            ("metadata.labels", "{ priority: critical, app.kubernetes.io/name: web, build: 42 }"),
            ("repository.url", "git@github.com:org/repo.git"),
            ("repository.branch", "feature/oauth-2"),
            ("repository.commit", "0a1b2c3d4e5f"),
            ("repository.subpath", "packages/auth"),
            ("agent.provider", "script"),
            ("agent.script", "'echo hi'"),
            ("agent.allowed_tools", "[Read, 'Bash(git:*)']"),
            ("sandbox", "{ memory: 512M, disk: 1G, network_mode: isolated, runtime: kvm, full_control: true, cpus: 256 }"),
            ("placement", "{ kind: project, tenant: acme, project: web, profile: reviewer }"),
            ("startup_profile", STARTUP),
            ("lifecycle.timeout", "7d"),
            ("lifecycle.stage_timeout", "1h30m"),
            ("lifecycle.provision_timeout", "1s"),
            ("lifecycle.hang_timeout", "45m"),
            ("lifecycle.cancel_grace", "0s"),
            ("lifecycle.success_exit_codes", "[0, 3, 255]"),
            ("lifecycle.retries", "{ clone: { max: 5 }, provision: { backoff: [1s, 1h] }, agent_connect: { max: 0, backoff: [500ms] } }"),
        ]);
        let (from_yaml, from_json) = parse_both(&doc);
        let spec = from_yaml.unwrap();
        assert_eq!(from_json.unwrap(), spec);
        assert_eq!(spec.priority, TaskPriority::Critical);
        assert_eq!(spec.labels["build"], "42");
        assert_eq!(spec.agent.provider, Provider::Script);
        assert_eq!(spec.sandbox.memory_bytes, Some(512 << 20));
        assert_eq!(spec.requires_runtime(), RuntimeKind::Kvm);
        assert!(spec.sandbox.full_control);
        assert_eq!(spec.lifecycle.stage_timeout_ms, 5_400_000);
        assert_eq!(spec.lifecycle.success_exit_codes, [0, 3, 255]);
        let retries = &spec.lifecycle.retries;
        assert_eq!(retries.clone, RetrySpec::new(5, &[5_000, 10_000, 20_000]));
        assert_eq!(retries.provision, RetrySpec::new(2, &[1_000, 3_600_000]));
        assert_eq!(retries.agent_connect, RetrySpec::new(0, &[500]));
        assert_eq!(spec.validate(), Ok(()));
    }

    #[test]
    fn aliases_are_reported_as_written() {
        let doc = mutated(&[("agent", "-"), ("claude", "{ prompt: '' }")]);
        let (y, j) = parse_both(&doc);
        assert_eq!(y.unwrap_err().field, "claude.prompt");
        assert_eq!(j.unwrap_err().field, "claude.prompt");

        let doc = mutated(&[("agent", "-"), ("claude", "{ prompt: x, max_turns: many }")]);
        assert_eq!(parse_both(&doc).0.unwrap_err().field, "claude.max_turns");

        let doc = mutated(&[("sandbox.memory", "1K")]);
        assert_eq!(parse_both(&doc).0.unwrap_err().field, "sandbox.memory");
        let doc = mutated(&[("vm.memory", "1K")]);
        assert_eq!(parse_both(&doc).0.unwrap_err().field, "vm.memory");

        let doc = mutated(&[("claude", "{ prompt: x }")]);
        let err = parse_both(&doc).0.unwrap_err();
        assert_eq!(err.field, "claude");
        assert!(err.reason.contains("alias"), "{err}");

        let doc = mutated(&[("vm", "{}"), ("sandbox", "{}")]);
        assert_eq!(parse_both(&doc).0.unwrap_err().field, "sandbox");

        let doc = mutated(&[("agent", "-")]);
        assert_eq!(parse_both(&doc).0.unwrap_err().field, "agent");
    }

    #[test]
    fn bad_values_name_their_field() {
        let long_name = format!("'{}'", "n".repeat(TASK_NAME_BYTES_MAX + 1));
        let long_url = format!("https://h/{}", "a".repeat(REPO_URL_BYTES_MAX));
        let long_branch = "b".repeat(GIT_BRANCH_BYTES_MAX + 1);
        let long_value = "v".repeat(LABEL_VALUE_BYTES_MAX + 1);
        let long_commit = "a".repeat(GIT_COMMIT_DIGITS_MAX + 1);
        let long_prompt = "p".repeat(PROMPT_BYTES_MAX + 1);
        let long_script = "s".repeat(SCRIPT_BYTES_MAX + 1);
        let many_labels = format!(
            "{{ {} }}",
            (0..=LABELS_MAX)
                .map(|i| format!("k{i}: v"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let many_tools = numbered_list("tool", ALLOWED_TOOLS_MAX + 1);
        let many_patterns = numbered_list("p", ARTIFACT_PATTERNS_MAX + 1);
        let many_codes = format!(
            "[{}]",
            (0..=SUCCESS_EXIT_CODES_MAX)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let many_backoffs = repeat_list("1s", RETRY_BACKOFF_ENTRIES_MAX + 1);
        let many_refs = format!(
            "[{}]",
            (0..=CREDENTIAL_REFS_MAX)
                .map(|i| format!("{{ id: c{i}, mount: m{i} }}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let many_probes = repeat_list("{ provider: p, kind: k }", READINESS_PROBES_MAX + 1);
        let sp = ("startup_profile", STARTUP);

        let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
            // Document shape.
            (vec![("tiemout", "1")], "tiemout"),
            (vec![("lifecycle.tiemout", "1h")], "lifecycle.tiemout"),
            (vec![("repository.token", "x")], "repository.token"),
            (vec![("metadata", "-")], "metadata"),
            (vec![("repository.url", "-")], "repository.url"),
            (vec![("agent.prompt", "-")], "agent.prompt"),
            (vec![("version", "-")], "version"),
            (vec![("version", "'2'")], "version"),
            (vec![("version", "1.0")], "version"),
            (vec![("kind", "Job")], "kind"),
            (vec![("kind", "-")], "kind"),
            // Metadata.
            (vec![("metadata.name", "''")], "metadata.name"),
            (vec![("metadata.name", "\"a\\tb\"")], "metadata.name"),
            (vec![("metadata.name", &long_name)], "metadata.name"),
            (vec![("metadata.labels", &many_labels)], "metadata.labels"),
            (
                vec![("metadata.labels", "{ 'bad key': v }")],
                "metadata.labels",
            ),
            (vec![("metadata.labels", "{ '': v }")], "metadata.labels"),
            (vec![("metadata.labels", "[a]")], "metadata.labels"),
            (
                vec![("metadata.labels.team", &long_value)],
                "metadata.labels.team",
            ),
            (
                vec![("metadata.labels.team", "[a]")],
                "metadata.labels.team",
            ),
            (
                vec![("metadata.labels.priority", "urgent")],
                "metadata.labels.priority",
            ),
            (
                vec![("metadata.labels.priority", "High")],
                "metadata.labels.priority",
            ),
            // Repository.
            (
                vec![("repository.url", "https://user:secret@github.com/org/repo")],
                "repository.url",
            ),
            (
                vec![("repository.url", "https://ghp_token@github.com/org/repo")],
                "repository.url",
            ),
            (
                vec![("repository.url", "ssh://git:pw@github.com/org/repo")],
                "repository.url",
            ),
            (
                vec![("repository.url", "user:pw@github.com:org/repo")],
                "repository.url",
            ),
            (
                vec![("repository.url", "ftp://github.com/org/repo")],
                "repository.url",
            ),
            (
                vec![("repository.url", "https:///org/repo")],
                "repository.url",
            ),
            (
                vec![("repository.url", "'https://github.com/org repo'")],
                "repository.url",
            ),
            (vec![("repository.url", "relative/path")], "repository.url"),
            (vec![("repository.url", "git@github.com")], "repository.url"),
            (
                vec![("repository.url", "'-oProxyCommand=x@h:p'")],
                "repository.url",
            ),
            (
                vec![("repository.url", "'ssh://-oProxyCommand=x/p'")],
                "repository.url",
            ),
            (vec![("repository.url", "'file://'")], "repository.url"),
            (vec![("repository.url", "''")], "repository.url"),
            (vec![("repository.url", &long_url)], "repository.url"),
            (
                vec![("repository.branch", "'bad branch'")],
                "repository.branch",
            ),
            (vec![("repository.branch", "a..b")], "repository.branch"),
            (vec![("repository.branch", "-x")], "repository.branch"),
            (vec![("repository.branch", "a~1")], "repository.branch"),
            (vec![("repository.branch", "'a:b'")], "repository.branch"),
            (vec![("repository.branch", "feature/")], "repository.branch"),
            (vec![("repository.branch", "x.lock")], "repository.branch"),
            (
                vec![("repository.branch", "a/.hidden")],
                "repository.branch",
            ),
            (vec![("repository.branch", "'@'")], "repository.branch"),
            (
                vec![("repository.branch", &long_branch)],
                "repository.branch",
            ),
            (vec![("repository.commit", "abc")], "repository.commit"),
            (vec![("repository.commit", "zzzzzzz")], "repository.commit"),
            (
                vec![("repository.commit", &long_commit)],
                "repository.commit",
            ),
            (vec![("repository.subpath", "/abs")], "repository.subpath"),
            (vec![("repository.subpath", "a/../b")], "repository.subpath"),
            (vec![("repository.subpath", "..")], "repository.subpath"),
            (vec![("repository.subpath", "''")], "repository.subpath"),
            // Agent.
            (vec![("agent.prompt", "''")], "agent.prompt"),
            (vec![("agent.prompt", "'   '")], "agent.prompt"),
            (vec![("agent.prompt", &long_prompt)], "agent.prompt"),
            (vec![("agent.model", "'has space'")], "agent.model"),
            (vec![("agent.model", "''")], "agent.model"),
            (vec![("agent.max_turns", "0")], "agent.max_turns"),
            (vec![("agent.max_turns", "10001")], "agent.max_turns"),
            (vec![("agent.max_turns", "-1")], "agent.max_turns"),
            (
                vec![("agent.allowed_tools", &many_tools)],
                "agent.allowed_tools",
            ),
            (
                vec![("agent.allowed_tools", "[Read, 'has space']")],
                "agent.allowed_tools[1]",
            ),
            (
                vec![("agent.allowed_tools", "[Read, '']")],
                "agent.allowed_tools[1]",
            ),
            (vec![("agent.provider", "gpt")], "agent.provider"),
            (vec![("agent.provider", "script")], "agent.script"),
            (
                vec![("agent.provider", "script"), ("agent.script", "' '")],
                "agent.script",
            ),
            (
                vec![("agent.provider", "script"), ("agent.script", &long_script)],
                "agent.script",
            ),
            (vec![("agent.script", "'echo hi'")], "agent.script"),
            (
                vec![("agent.provider", "codex"), ("agent.script", "'echo hi'")],
                "agent.script",
            ),
            (vec![("agent.temperature", "1")], "agent.temperature"),
            // Sandbox.
            (vec![("vm.profile", "Bad_Profile")], "vm.profile"),
            (vec![("vm.cpus", "0")], "vm.cpus"),
            (vec![("vm.cpus", "257")], "vm.cpus"),
            (vec![("vm.cpus", "99999999999")], "vm.cpus"),
            (vec![("vm.memory", "8X")], "vm.memory"),
            (vec![("vm.memory", "-8G")], "vm.memory"),
            (vec![("vm.memory", "15M")], "vm.memory"),
            (vec![("vm.memory", "2T")], "vm.memory"),
            (vec![("vm.disk", "512M")], "vm.disk"),
            (vec![("vm.disk", "17T")], "vm.disk"),
            (vec![("vm.disk", "[1]")], "vm.disk"),
            (vec![("vm.network_mode", "host")], "vm.network_mode"),
            (vec![("vm.runtime", "podman")], "vm.runtime"),
            (vec![("vm.full_control", "maybe")], "vm.full_control"),
            (vec![("vm.gpus", "1")], "vm.gpus"),
            // Placement.
            (vec![("placement.kind", "shared")], "placement.kind"),
            (
                vec![("placement", "{ kind: project, tenant: acme, project: web }")],
                "placement.profile",
            ),
            (
                vec![("placement", "{ kind: project, profile: r, project: web }")],
                "placement.tenant",
            ),
            (vec![("placement", "{ tenant: acme }")], "placement.tenant"),
            (
                vec![("placement", "{ kind: dedicated, profile: r }")],
                "placement.profile",
            ),
            (
                vec![(
                    "placement",
                    "{ kind: project, tenant: Acme, project: web, profile: r }",
                )],
                "placement.tenant",
            ),
            (
                vec![(
                    "placement",
                    "{ kind: project, tenant: a, project: w, profile: 'r r' }",
                )],
                "placement.profile",
            ),
            // Startup profile.
            (
                vec![sp, ("startup_profile.id", "'Bad Id'")],
                "startup_profile.id",
            ),
            (vec![sp, ("startup_profile.id", "-")], "startup_profile.id"),
            (
                vec![sp, ("startup_profile.trigger", "on_boot")],
                "startup_profile.trigger",
            ),
            (
                vec![sp, ("startup_profile.session.launcher", "''")],
                "startup_profile.session.launcher",
            ),
            (
                vec![sp, ("startup_profile.session.workdir", "relative")],
                "startup_profile.session.workdir",
            ),
            (
                vec![sp, ("startup_profile.session.workdir", "/a/../b")],
                "startup_profile.session.workdir",
            ),
            (
                vec![sp, ("startup_profile.session.cols", "19")],
                "startup_profile.session.cols",
            ),
            (
                vec![sp, ("startup_profile.session.cols", "1001")],
                "startup_profile.session.cols",
            ),
            (
                vec![sp, ("startup_profile.session.rows", "4")],
                "startup_profile.session.rows",
            ),
            (
                vec![sp, ("startup_profile.session.rows", "-")],
                "startup_profile.session.rows",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.credential_refs",
                        "[{ id: ok, mount: a }, { id: 'Bad Id', mount: b }]",
                    ),
                ],
                "startup_profile.credential_refs[1].id",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.credential_refs",
                        "[{ id: a, mount: key }, { id: b, mount: key }]",
                    ),
                ],
                "startup_profile.credential_refs[1].mount",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.credential_refs",
                        "[{ id: a, mount: key }, { id: b, mount: 'K' }]",
                    ),
                ],
                "startup_profile.credential_refs[1].mount",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.credential_refs",
                        "[{ id: a, mount: key }, { id: b, mount: [1] }]",
                    ),
                ],
                "startup_profile.credential_refs[1].mount",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.credential_refs",
                        "[{ id: a, mount: key }, { id: b, mnt: x }]",
                    ),
                ],
                "startup_profile.credential_refs[1].mnt",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.credential_refs",
                        "[{ id: a, mount: key }, { id: b }]",
                    ),
                ],
                "startup_profile.credential_refs[1].mount",
            ),
            (
                vec![sp, ("startup_profile.credential_refs", &many_refs)],
                "startup_profile.credential_refs",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.readiness.probes",
                        "[{ provider: 'Bad', kind: auth }]",
                    ),
                ],
                "startup_profile.readiness.probes[0].provider",
            ),
            (
                vec![
                    sp,
                    (
                        "startup_profile.readiness.probes",
                        "[{ provider: a, kind: b }, { provider: a, kind: '' }]",
                    ),
                ],
                "startup_profile.readiness.probes[1].kind",
            ),
            (
                vec![sp, ("startup_profile.readiness.probes", &many_probes)],
                "startup_profile.readiness.probes",
            ),
            (
                vec![sp, ("startup_profile.observation.retention_class", "''")],
                "startup_profile.observation.retention_class",
            ),
            (
                vec![sp, ("startup_profile.observation.redaction_profile", "-")],
                "startup_profile.observation.redaction_profile",
            ),
            // Lifecycle.
            (vec![("lifecycle.timeout", "soon")], "lifecycle.timeout"),
            (vec![("lifecycle.timeout", "30")], "lifecycle.timeout"),
            (vec![("lifecycle.timeout", "-1h")], "lifecycle.timeout"),
            (vec![("lifecycle.timeout", "8d")], "lifecycle.timeout"),
            (vec![("lifecycle.timeout", "0s")], "lifecycle.timeout"),
            (vec![("lifecycle.timeout", "999ms")], "lifecycle.timeout"),
            (
                vec![("lifecycle.stage_timeout", "25h")],
                "lifecycle.stage_timeout",
            ),
            (
                vec![("lifecycle.provision_timeout", "0s")],
                "lifecycle.provision_timeout",
            ),
            (
                vec![("lifecycle.provision_timeout", "1d1ms")],
                "lifecycle.provision_timeout",
            ),
            (
                vec![("lifecycle.hang_timeout", "8d")],
                "lifecycle.hang_timeout",
            ),
            (
                vec![("lifecycle.cancel_grace", "2h")],
                "lifecycle.cancel_grace",
            ),
            (
                vec![("lifecycle.failure_action", "explode")],
                "lifecycle.failure_action",
            ),
            (
                vec![("lifecycle.artifact_patterns", "['/etc/passwd']")],
                "lifecycle.artifact_patterns[0]",
            ),
            (
                vec![("lifecycle.artifact_patterns", "['ok/*', '../x']")],
                "lifecycle.artifact_patterns[1]",
            ),
            (
                vec![("lifecycle.artifact_patterns", "['a/**/../b']")],
                "lifecycle.artifact_patterns[0]",
            ),
            (
                vec![("lifecycle.artifact_patterns", "['']")],
                "lifecycle.artifact_patterns[0]",
            ),
            (
                vec![("lifecycle.artifact_patterns", &many_patterns)],
                "lifecycle.artifact_patterns",
            ),
            (
                vec![("lifecycle.success_exit_codes", "[0, 0]")],
                "lifecycle.success_exit_codes[1]",
            ),
            (
                vec![("lifecycle.success_exit_codes", "[]")],
                "lifecycle.success_exit_codes",
            ),
            (
                vec![("lifecycle.success_exit_codes", "[0, 256]")],
                "lifecycle.success_exit_codes[1]",
            ),
            (
                vec![("lifecycle.success_exit_codes", "[-1]")],
                "lifecycle.success_exit_codes[0]",
            ),
            (
                vec![("lifecycle.success_exit_codes", &many_codes)],
                "lifecycle.success_exit_codes",
            ),
            (
                vec![("lifecycle.retries.clone.max", "101")],
                "lifecycle.retries.clone.max",
            ),
            (
                vec![("lifecycle.retries.provision.backoff", "[]")],
                "lifecycle.retries.provision.backoff",
            ),
            (
                vec![("lifecycle.retries.agent_connect.backoff", "[2s, 2h]")],
                "lifecycle.retries.agent_connect.backoff[1]",
            ),
            (
                vec![("lifecycle.retries.agent_connect.backoff", "[2s, later]")],
                "lifecycle.retries.agent_connect.backoff[1]",
            ),
            (
                vec![("lifecycle.retries.clone.backoff", &many_backoffs)],
                "lifecycle.retries.clone.backoff",
            ),
            (
                vec![("lifecycle.retries.restore", "{ max: 1 }")],
                "lifecycle.retries.restore",
            ),
            (
                vec![("lifecycle.retries.clone.tries", "1")],
                "lifecycle.retries.clone.tries",
            ),
        ];
        for (edits, field) in cases {
            let doc = mutated(&edits);
            let (from_yaml, from_json) = parse_both(&doc);
            let err = from_yaml.expect_err(&format!("YAML {edits:?} should be refused"));
            assert_eq!(err.field, field, "YAML {edits:?}: {err}");
            assert!(!err.reason.is_empty(), "{edits:?}");
            let err = from_json.expect_err(&format!("JSON {edits:?} should be refused"));
            assert_eq!(err.field, field, "JSON {edits:?}: {err}");
        }
    }

    #[test]
    fn reasons_explain_themselves() {
        let reason = |edits: &[(&str, &str)]| parse_both(&mutated(edits)).0.unwrap_err().reason;

        let r = reason(&[("lifecycle.tiemout", "1h")]);
        assert!(
            r.starts_with("unknown field `tiemout`") && r.contains("`timeout`"),
            "{r}"
        );
        let r = reason(&[("agent.max_turns", "many")]);
        assert!(r.starts_with("invalid type"), "{r}");
        let r = reason(&[("repository.url", "https://user:secret@github.com/org/repo")]);
        assert!(r.contains("credential_refs"), "{r}");
        assert!(
            !r.contains("secret@"),
            "the reason must not echo the secret: {r}"
        );
        let r = reason(&[("lifecycle.timeout", "soon")]);
        assert!(r.contains("24h"), "{r}");
        let r = reason(&[("lifecycle.timeout", "8d")]);
        assert!(r.contains("between 1s and 168h"), "{r}");
        let r = reason(&[("vm.memory", "2T")]);
        assert!(r.contains("between 16M and 1T"), "{r}");
        let r = reason(&[("metadata.labels.priority", "urgent")]);
        assert!(r.contains("low, normal, high, critical"), "{r}");
        let r = reason(&[("agent.prompt", "-")]);
        assert!(r.starts_with("is required"), "{r}");
        let r = reason(&[("lifecycle.failure_action", "explode")]);
        assert!(r.contains("destroy") && r.contains("preserve"), "{r}");
    }

    #[test]
    fn oversized_manifest_is_refused_before_parsing() {
        let text = format!("{MINIMAL}# {}\n", "x".repeat(MANIFEST_BYTES_MAX));
        for err in [
            parse_manifest_yaml(&text).unwrap_err(),
            parse_manifest_json(&text).unwrap_err(),
        ] {
            assert_eq!(err.field, "manifest");
            assert!(err.reason.contains("at most"), "{err}");
        }
    }

    #[test]
    fn malformed_documents_are_refused() {
        for text in [
            "",
            "version: [",
            "- a\n- b\n",
            "version: \"1\"\n---\nkind: Task\n",
        ] {
            let err = parse_manifest_yaml(text).unwrap_err();
            assert!(!err.field.is_empty(), "{text:?}: {err}");
        }
        let err = parse_manifest_json(r#"{"version": "1"} trailing"#).unwrap_err();
        assert!(!err.field.is_empty(), "{err}");
        let json = serde_json::to_string(&yaml(MINIMAL)).unwrap();
        let err = parse_manifest_json(&format!("{json} {{}}")).unwrap_err();
        assert_eq!(err.field, "manifest");
        // A second document must not be silently dropped.
        let err = parse_manifest_yaml(&format!("{MINIMAL}---\nkind: Other\n")).unwrap_err();
        assert_eq!(err.field, "manifest");
    }

    #[test]
    fn repeated_keys_are_refused() {
        let err = parse_manifest_yaml(&format!("{MINIMAL}kind: Task\n")).unwrap_err();
        assert_eq!(err.field, "kind");
        let text = MINIMAL.replace(
            "  name: minimal\n",
            "  name: minimal\n  labels: {team: a, team: b}\n",
        );
        let err = parse_manifest_yaml(&text).unwrap_err();
        assert_eq!(err.field, "metadata.labels");
        assert!(err.reason.contains("\"team\""), "{err}");
        let json = r#"{"version": "1", "kind": "Task",
            "metadata": {"name": "m", "labels": {"team": "a", "team": "b"}},
            "repository": {"url": "https://github.com/org/repo"}, "agent": {"prompt": "p"}}"#;
        assert_eq!(
            parse_manifest_json(json).unwrap_err().field,
            "metadata.labels"
        );
    }

    #[test]
    fn accepted_repository_locations() {
        for url in [
            "https://github.com/org/repo",
            "http://git.local:8080/repo.git",
            "ssh://git@github.com/org/repo.git",
            "git://example.org/repo",
            "file:///srv/git/repo",
            "/srv/git/repo",
            "git@github.com:org/repo.git",
        ] {
            let spec = parse_manifest_yaml(
                &serde_yaml::to_string(&mutated(&[("repository.url", &format!("'{url}'"))]))
                    .unwrap(),
            );
            assert!(spec.is_ok(), "{url}: {spec:?}");
        }
    }

    #[test]
    fn validate_rechecks_decoded_specs() {
        let good = parse_manifest_yaml(SEED).unwrap();
        type Tamper = fn(&mut TaskSpec);
        let cases: [(Tamper, &str); 9] = [
            (|s| s.agent.prompt.clear(), "agent.prompt"),
            (|s| s.sandbox.memory_bytes = Some(1), "vm.memory"),
            (
                |s| s.priority = TaskPriority::Low,
                "metadata.labels.priority",
            ),
            (|s| s.lifecycle.timeout_ms = 0, "lifecycle.timeout"),
            (
                |s| s.lifecycle.success_exit_codes = vec![1, 1],
                "lifecycle.success_exit_codes[1]",
            ),
            (
                |s| s.lifecycle.retries.clone.backoff_ms.clear(),
                "lifecycle.retries.clone.backoff",
            ),
            (
                |s| s.repository.url = "https://u:p@h/r".into(),
                "repository.url",
            ),
            (
                |s| {
                    let sp = s.startup_profile.as_mut().unwrap();
                    sp.credential_refs[1].mount = sp.credential_refs[0].mount.clone();
                },
                "startup_profile.credential_refs[1].mount",
            ),
            (|s| s.agent.script = Some("x".into()), "agent.script"),
        ];
        for (tamper, field) in cases {
            let mut spec = good.clone();
            tamper(&mut spec);
            assert_eq!(spec.validate().unwrap_err().field, field);
        }
    }

    #[test]
    fn bincode_refuses_malformed_ids() {
        #[derive(Serialize)]
        struct Fake {
            id: String,
            mount: String,
        }
        let config = bincode::config::standard();
        let bytes = bincode::serde::encode_to_vec(
            Fake {
                id: "Not An Id".into(),
                mount: "m".into(),
            },
            config,
        )
        .unwrap();
        let decoded: Result<(CredentialRef, usize), _> =
            bincode::serde::decode_from_slice(&bytes, config);
        assert!(decoded.is_err());
    }

    #[test]
    fn retry_delays_repeat_the_last_entry() {
        let spec = RetrySpec::new(3, &[5_000, 10_000, 20_000]);
        assert_eq!(spec.delay_ms(0), 5_000);
        assert_eq!(spec.delay_ms(1), 5_000);
        assert_eq!(spec.delay_ms(2), 10_000);
        assert_eq!(spec.delay_ms(3), 20_000);
        assert_eq!(spec.delay_ms(4), 20_000);
        assert_eq!(spec.delay_ms(u32::MAX), 20_000);
        assert_eq!(RetrySpec::new(1, &[]).delay_ms(1), 0);
        let connect = RetryPolicy::default().agent_connect;
        let total: u64 = (1..=connect.max).map(|n| connect.delay_ms(n)).sum();
        assert_eq!(total, 60_000);
    }

    #[test]
    fn priorities_order_and_rank() {
        use TaskPriority::*;
        assert!(Low < Normal && Normal < High && High < Critical);
        let ranks: Vec<u8> = TaskPriority::ALL.iter().map(|p| p.rank()).collect();
        assert_eq!(ranks, [0, 1, 2, 3]);
        assert_eq!(TaskPriority::default(), Normal);
    }

    #[test]
    fn keyword_names_match_serde_names() {
        fn check<T: Serialize + Copy + fmt::Display>(all: &[T]) {
            for v in all {
                assert_eq!(serde_json::to_value(v).unwrap(), v.to_string());
            }
        }
        check(TaskPriority::ALL);
        check(NetworkMode::ALL);
        check(RuntimeKind::ALL);
        check(FailureAction::ALL);
        check(StartupTrigger::ALL);
        assert_eq!(
            RuntimeKind::parse("runtime", "docker"),
            Ok(RuntimeKind::Docker)
        );
        assert_eq!("kvm".parse::<RuntimeKind>(), Ok(RuntimeKind::Kvm));
        assert_eq!(
            RuntimeKind::parse("vm.runtime", "lxc").unwrap_err().field,
            "vm.runtime"
        );
    }
}
