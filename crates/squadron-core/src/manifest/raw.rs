//! The document as written: `Raw*` structs that mirror it (unknown fields refused) and their
//! conversion into a [`TaskSpec`], which parses durations, sizes and ids and applies defaults.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::Deserialize;

use super::checks::{check_count, check_labels, check_range};
use super::keywords::{FailureAction, NetworkMode, RuntimeKind, StartupTrigger};
use super::spec::{
    AgentSpec, CredentialRef, LifecycleSpec, ObservationSpec, Placement, ProbeSpec, ReadinessSpec,
    RepositorySpec, RetryPolicy, RetrySpec, SandboxSpec, SessionSpec, StartupProfileSpec, TaskSpec,
};
use super::validate::{priority_from_labels, Spelling};
use super::{MANIFEST_KIND, MANIFEST_VERSION};
use crate::ids::{CredentialId, ProfileKey, ProjectId, TenantId};
use crate::limits::*;
use crate::provider::Provider;
use crate::quantity::{parse_byte_size, parse_duration_ms};
use crate::validation_error::ValidationError;

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

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawManifest {
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

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawMetadata {
    name: String,
    #[serde(default)]
    labels: RawLabels,
}

impl JsonSchema for RawScalar {
    fn schema_name() -> Cow<'static, str> {
        "Scalar".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": ["string", "integer", "boolean"]})
    }
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

impl JsonSchema for RawLabels {
    fn schema_name() -> Cow<'static, str> {
        "Labels".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "object",
            "additionalProperties": generator.subschema_for::<RawScalar>(),
            "maxProperties": LABELS_MAX,
        })
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRepository {
    url: String,
    branch: Option<String>,
    commit: Option<RawScalar>,
    subpath: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    prompt: String,
    model: Option<String>,
    max_turns: Option<u64>,
    allowed_tools: Option<Vec<String>>,
    provider: Option<String>,
    script: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSandbox {
    profile: Option<String>,
    cpus: Option<u64>,
    memory: Option<RawScalar>,
    disk: Option<RawScalar>,
    network_mode: Option<NetworkMode>,
    runtime: Option<RuntimeKind>,
    full_control: Option<bool>,
}

#[derive(Deserialize, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "snake_case")]
enum RawPlacementKind {
    #[default]
    Dedicated,
    Project,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawPlacement {
    kind: Option<RawPlacementKind>,
    tenant: Option<String>,
    project: Option<String>,
    profile: Option<String>,
}

#[derive(Deserialize, JsonSchema)]
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

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawSession {
    launcher: String,
    workdir: String,
    cols: u64,
    rows: u64,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawCredentialRef {
    id: String,
    mount: String,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawReadiness {
    #[serde(default)]
    probes: Vec<RawProbe>,
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawProbe {
    provider: String,
    kind: String,
}

impl RawProbe {
    /// A probe is one the worker runs (`PROBES`). Checked here, where a manifest is read, not
    /// in `TaskSpec::validate`, which also runs on replay: a task an earlier version accepted
    /// must still apply.
    fn checked(self, i: usize) -> Result<ProbeSpec, ValidationError> {
        use crate::manifest::PROBES;
        let known = |f: &dyn Fn(&(&str, &str)) -> bool| PROBES.iter().any(f);
        let field = if !known(&|(p, _)| *p == self.provider) {
            "provider"
        } else if !known(&|(p, k)| *p == self.provider && *k == self.kind) {
            "kind"
        } else {
            return Ok(ProbeSpec {
                provider: self.provider,
                kind: self.kind,
            });
        };
        let all: Vec<String> = PROBES.iter().map(|(p, k)| format!("{p}/{k}")).collect();
        Err(ValidationError::new(
            format!("readiness.probes[{i}].{field}"),
            format!(
                "{}/{} is not a probe the worker runs; one of {}",
                self.provider,
                self.kind,
                all.join(", ")
            ),
        ))
    }
}

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawObservation {
    retention_class: String,
    redaction_profile: String,
}

#[derive(Deserialize, JsonSchema)]
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

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawRetries {
    clone: Option<RawRetry>,
    provision: Option<RawRetry>,
    agent_connect: Option<RawRetry>,
}

#[derive(Deserialize, JsonSchema)]
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
    pub(super) fn into_spec(self) -> Result<TaskSpec, ValidationError> {
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
        if let Some(profile) = &spec.startup_profile {
            profile
                .check_admission()
                .map_err(|e| e.within("startup_profile"))?;
        }
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
    pub(super) fn default_spec() -> SandboxSpec {
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
            .enumerate()
            .map(|(i, p)| p.checked(i))
            .collect::<Result<Vec<_>, ValidationError>>()?;
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

/// The manifest document as a user writes it (YAML or JSON), for the API's schema: the
/// parser's own structs stay private, and this names their schema.
#[derive(Debug, Clone, Copy)]
pub struct TaskManifest;

impl JsonSchema for TaskManifest {
    fn schema_name() -> Cow<'static, str> {
        "TaskManifest".into()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        RawManifest::json_schema(generator)
    }
}
