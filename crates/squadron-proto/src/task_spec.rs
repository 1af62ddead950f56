//! The task spec on the wire: the core's [`TaskSpec`] to its protobuf message and back.
//!
//! Core to proto cannot fail. Proto to core checks what the protobuf types cannot say — a
//! keyword's spelling, an id's grammar, a required sub-message, a 16-bit size — and refuses
//! with the field's path (`spec.sandbox.network_mode: unknown network_mode "x"; …`), never a
//! panic: the message came off the network.

use std::collections::BTreeMap;

use squadron_core::ids::{CredentialId, ProfileKey, ProjectId, TenantId};
use squadron_core::manifest::{
    AgentSpec, CredentialRef, Keyword, LifecycleSpec, ObservationSpec, Placement, ProbeSpec,
    ReadinessSpec, RepositorySpec, RetryPolicy, RetrySpec, SandboxSpec, SessionSpec,
    StartupProfileSpec, TaskSpec,
};
use squadron_core::provider::Provider;

use crate::conversion_error::{at, refused, required, ConversionError};
use crate::v1 as pb;

/// The root of every path an error names.
const ROOT: &str = "spec";

pub(crate) fn keyword<K: Keyword>(field: &str, value: &str) -> Result<K, ConversionError> {
    K::parse(field, value).map_err(refused(field))
}

// --- core to proto -----------------------------------------------------------------------------

impl From<&TaskSpec> for pb::TaskSpec {
    fn from(s: &TaskSpec) -> Self {
        pb::TaskSpec {
            name: s.name.clone(),
            labels: s.labels.clone().into_iter().collect(),
            priority: s.priority.as_str().into(),
            repository: Some(repository_to(&s.repository)),
            agent: Some(agent_to(&s.agent)),
            sandbox: Some(sandbox_to(&s.sandbox)),
            placement: Some(placement_to(&s.placement)),
            startup_profile: s.startup_profile.as_ref().map(startup_to),
            lifecycle: Some(lifecycle_to(&s.lifecycle)),
        }
    }
}

fn repository_to(r: &RepositorySpec) -> pb::RepositorySpec {
    pb::RepositorySpec {
        url: r.url.clone(),
        branch: r.branch.clone(),
        commit: r.commit.clone(),
        subpath: r.subpath.clone(),
    }
}

fn agent_to(a: &AgentSpec) -> pb::AgentSpec {
    pb::AgentSpec {
        prompt: a.prompt.clone(),
        model: a.model.clone(),
        max_turns: a.max_turns,
        allowed_tools: a.allowed_tools.as_ref().map(|tools| pb::ToolList {
            tools: tools.clone(),
        }),
        provider: a.provider.as_str().into(),
        script: a.script.clone(),
    }
}

fn sandbox_to(s: &SandboxSpec) -> pb::SandboxSpec {
    pb::SandboxSpec {
        profile: s.profile.clone(),
        cpus: s.cpus,
        memory_bytes: s.memory_bytes,
        disk_bytes: s.disk_bytes,
        network_mode: s.network_mode.as_str().into(),
        runtime: s.runtime.as_str().into(),
        full_control: s.full_control,
    }
}

fn placement_to(p: &Placement) -> pb::Placement {
    let kind = match p {
        Placement::Dedicated => pb::placement::Kind::Dedicated(pb::DedicatedPlacement {}),
        Placement::Project {
            tenant,
            project,
            profile,
        } => pb::placement::Kind::Project(pb::ProjectPlacement {
            tenant: tenant.to_string(),
            project: project.to_string(),
            profile: profile.to_string(),
        }),
    };
    pb::Placement { kind: Some(kind) }
}

fn startup_to(s: &StartupProfileSpec) -> pb::StartupProfileSpec {
    pb::StartupProfileSpec {
        id: s.id.clone(),
        trigger: s.trigger.as_str().into(),
        session: Some(pb::SessionSpec {
            launcher: s.session.launcher.clone(),
            workdir: s.session.workdir.clone(),
            cols: s.session.cols.into(),
            rows: s.session.rows.into(),
        }),
        credential_refs: s
            .credential_refs
            .iter()
            .map(|c| pb::CredentialRef {
                id: c.id.to_string(),
                mount: c.mount.clone(),
            })
            .collect(),
        readiness: Some(pb::ReadinessSpec {
            probes: s
                .readiness
                .probes
                .iter()
                .map(|p| pb::ProbeSpec {
                    provider: p.provider.clone(),
                    kind: p.kind.clone(),
                })
                .collect(),
        }),
        observation: Some(pb::ObservationSpec {
            retention_class: s.observation.retention_class.clone(),
            redaction_profile: s.observation.redaction_profile.clone(),
        }),
    }
}

fn lifecycle_to(l: &LifecycleSpec) -> pb::LifecycleSpec {
    let retry = |r: &RetrySpec| pb::RetrySpec {
        max: r.max,
        backoff_ms: r.backoff_ms.clone(),
    };
    pb::LifecycleSpec {
        timeout_ms: l.timeout_ms,
        stage_timeout_ms: l.stage_timeout_ms,
        provision_timeout_ms: l.provision_timeout_ms,
        hang_timeout_ms: l.hang_timeout_ms,
        cancel_grace_ms: l.cancel_grace_ms,
        failure_action: l.failure_action.as_str().into(),
        artifact_patterns: l.artifact_patterns.clone(),
        success_exit_codes: l.success_exit_codes.clone(),
        retries: Some(pb::RetryPolicy {
            clone: Some(retry(&l.retries.clone)),
            provision: Some(retry(&l.retries.provision)),
            agent_connect: Some(retry(&l.retries.agent_connect)),
        }),
    }
}

// --- proto to core -----------------------------------------------------------------------------

impl TryFrom<pb::TaskSpec> for TaskSpec {
    type Error = ConversionError;

    fn try_from(s: pb::TaskSpec) -> Result<Self, ConversionError> {
        let f = |name| at(ROOT, name);
        Ok(TaskSpec {
            name: s.name,
            labels: s.labels.into_iter().collect::<BTreeMap<_, _>>(),
            priority: keyword(&f("priority"), &s.priority)?,
            repository: repository_from(required(s.repository, &f("repository"))?),
            agent: agent_from(required(s.agent, &f("agent"))?, &f("agent"))?,
            sandbox: sandbox_from(required(s.sandbox, &f("sandbox"))?, &f("sandbox"))?,
            placement: placement_from(required(s.placement, &f("placement"))?, &f("placement"))?,
            startup_profile: s
                .startup_profile
                .map(|p| startup_from(p, &f("startup_profile")))
                .transpose()?,
            lifecycle: lifecycle_from(required(s.lifecycle, &f("lifecycle"))?, &f("lifecycle"))?,
        })
    }
}

fn repository_from(r: pb::RepositorySpec) -> RepositorySpec {
    RepositorySpec {
        url: r.url,
        branch: r.branch,
        commit: r.commit,
        subpath: r.subpath,
    }
}

fn agent_from(a: pb::AgentSpec, path: &str) -> Result<AgentSpec, ConversionError> {
    let provider = at(path, "provider");
    Ok(AgentSpec {
        prompt: a.prompt,
        model: a.model,
        max_turns: a.max_turns,
        allowed_tools: a.allowed_tools.map(|l| l.tools),
        provider: Provider::parse(&provider, &a.provider).map_err(refused(&provider))?,
        script: a.script,
    })
}

fn sandbox_from(s: pb::SandboxSpec, path: &str) -> Result<SandboxSpec, ConversionError> {
    Ok(SandboxSpec {
        profile: s.profile,
        cpus: s.cpus,
        memory_bytes: s.memory_bytes,
        disk_bytes: s.disk_bytes,
        network_mode: keyword(&at(path, "network_mode"), &s.network_mode)?,
        runtime: keyword(&at(path, "runtime"), &s.runtime)?,
        full_control: s.full_control,
    })
}

fn placement_from(p: pb::Placement, path: &str) -> Result<Placement, ConversionError> {
    match required(p.kind, &at(path, "kind"))? {
        pb::placement::Kind::Dedicated(pb::DedicatedPlacement {}) => Ok(Placement::Dedicated),
        pb::placement::Kind::Project(p) => {
            let path = at(path, "project");
            let (tenant, project, profile) = (
                at(&path, "tenant"),
                at(&path, "project"),
                at(&path, "profile"),
            );
            Ok(Placement::Project {
                tenant: TenantId::new(p.tenant).map_err(refused(&tenant))?,
                project: ProjectId::new(p.project).map_err(refused(&project))?,
                profile: ProfileKey::new(p.profile).map_err(refused(&profile))?,
            })
        }
    }
}

fn startup_from(
    s: pb::StartupProfileSpec,
    path: &str,
) -> Result<StartupProfileSpec, ConversionError> {
    let session = at(path, "session");
    let observation = required(s.observation, &at(path, "observation"))?;
    Ok(StartupProfileSpec {
        id: s.id,
        trigger: keyword(&at(path, "trigger"), &s.trigger)?,
        session: session_from(required(s.session, &session)?, &session)?,
        credential_refs: s
            .credential_refs
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let id = format!("{path}.credential_refs[{i}].id");
                Ok(CredentialRef {
                    id: CredentialId::new(c.id).map_err(refused(&id))?,
                    mount: c.mount,
                })
            })
            .collect::<Result<_, ConversionError>>()?,
        readiness: ReadinessSpec {
            probes: required(s.readiness, &at(path, "readiness"))?
                .probes
                .into_iter()
                .map(|p| ProbeSpec {
                    provider: p.provider,
                    kind: p.kind,
                })
                .collect(),
        },
        observation: ObservationSpec {
            retention_class: observation.retention_class,
            redaction_profile: observation.redaction_profile,
        },
    })
}

fn session_from(s: pb::SessionSpec, path: &str) -> Result<SessionSpec, ConversionError> {
    let narrow = |name: &str, value: u32| {
        u16::try_from(value).map_err(|_| ConversionError::Invalid {
            field: at(path, name),
            reason: format!("must be at most {}, got {value}", u16::MAX),
        })
    };
    Ok(SessionSpec {
        launcher: s.launcher,
        workdir: s.workdir,
        cols: narrow("cols", s.cols)?,
        rows: narrow("rows", s.rows)?,
    })
}

fn lifecycle_from(l: pb::LifecycleSpec, path: &str) -> Result<LifecycleSpec, ConversionError> {
    let retries = at(path, "retries");
    let policy = required(l.retries, &retries)?;
    let retry = |r: Option<pb::RetrySpec>, name: &str| {
        required(r, &at(&retries, name)).map(|r| RetrySpec {
            max: r.max,
            backoff_ms: r.backoff_ms,
        })
    };
    Ok(LifecycleSpec {
        timeout_ms: l.timeout_ms,
        stage_timeout_ms: l.stage_timeout_ms,
        provision_timeout_ms: l.provision_timeout_ms,
        hang_timeout_ms: l.hang_timeout_ms,
        cancel_grace_ms: l.cancel_grace_ms,
        failure_action: keyword(&at(path, "failure_action"), &l.failure_action)?,
        artifact_patterns: l.artifact_patterns,
        success_exit_codes: l.success_exit_codes,
        retries: RetryPolicy {
            clone: retry(policy.clone, "clone")?,
            provision: retry(policy.provision, "provision")?,
            agent_connect: retry(policy.agent_connect, "agent_connect")?,
        },
    })
}

#[cfg(test)]
mod tests;
