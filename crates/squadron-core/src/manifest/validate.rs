//! The semantic rules of a spec, one check per section. Field paths are relative to the section;
//! `TaskSpec::check` roots them (`lifecycle.timeout`).

use std::collections::BTreeMap;

use super::checks::*;
use super::keywords::{Keyword, TaskPriority};
use super::spec::{
    AgentSpec, CredentialRef, LifecycleSpec, RepositorySpec, RetrySpec, SandboxSpec, SessionSpec,
    StartupProfileSpec, TaskSpec,
};
use super::PRIORITY_LABEL;
use crate::ids::check_name;
use crate::limits::*;
use crate::provider::Provider;
use crate::validation_error::ValidationError;

/// How the user spelled the aliased top-level sections, so errors name what they wrote.
#[derive(Clone, Copy)]
pub(super) struct Spelling {
    pub(super) agent: &'static str,
    pub(super) vm: &'static str,
}

const CANONICAL: Spelling = Spelling {
    agent: "agent",
    vm: "vm",
};

impl TaskSpec {
    /// Re-checks a spec that arrived already decoded (from the Raft log, a snapshot, an RPC).
    /// Errors name fields by their canonical manifest paths (`agent.prompt`, `vm.memory`).
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.check(CANONICAL)
    }

    pub(super) fn check(&self, spelling: Spelling) -> Result<(), ValidationError> {
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

pub(super) fn priority_from_labels(
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

/// A list of credential references (a manifest's, or an agent profile's): at most
/// [`CREDENTIAL_REFS_MAX`], each mount a name, no mount twice. `field` names the list.
pub fn check_credential_refs(field: &str, refs: &[CredentialRef]) -> Result<(), ValidationError> {
    check_count(field, refs.len(), CREDENTIAL_REFS_MAX)?;
    for (i, cref) in refs.iter().enumerate() {
        let at = format!("{field}[{i}].mount");
        check_name(&at, &cref.mount)?;
        if let Some(first) = refs[..i].iter().position(|other| other.mount == cref.mount) {
            return Err(ValidationError::new(
                at,
                format!(
                    "{:?} is already used by {field}[{first}]; mounts must be unique",
                    cref.mount
                ),
            ));
        }
    }
    Ok(())
}

impl StartupProfileSpec {
    fn check(&self) -> Result<(), ValidationError> {
        check_name("id", &self.id)?;
        self.session.check().map_err(|e| e.within("session"))?;
        check_credential_refs("credential_refs", &self.credential_refs)?;
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
        // Any name here: entries of the log written before the profiles were named must
        // apply as they did. A new submission is held to the names (`check_admission`).
        check_name(
            "observation.redaction_profile",
            &self.observation.redaction_profile,
        )
    }

    /// What only a new submission is held to: the redaction profile and the retention class
    /// are ones this build knows (entries of the log written before they were named apply as
    /// they did).
    pub(super) fn check_admission(&self) -> Result<(), ValidationError> {
        let known = |field: &str, what: &str, value: &str, names: &[&str]| {
            if names.contains(&value) {
                return Ok(());
            }
            Err(ValidationError::new(
                field,
                format!(
                    "unknown {what} {value:?}; expected one of {}",
                    names.join(", ")
                ),
            ))
        };
        let o = &self.observation;
        known(
            "observation.redaction_profile",
            "redaction profile",
            &o.redaction_profile,
            &super::REDACTION_PROFILES,
        )?;
        known(
            "observation.retention_class",
            "retention class",
            &o.retention_class,
            &super::RETENTION_CLASSES,
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
        self.check_durations()?;
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
        check_success_exit_codes(&self.success_exit_codes)?;
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

    fn check_durations(&self) -> Result<(), ValidationError> {
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
        Ok(())
    }
}

/// At least one code, each a valid exit status, none twice.
fn check_success_exit_codes(codes: &[i32]) -> Result<(), ValidationError> {
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
    Ok(())
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
