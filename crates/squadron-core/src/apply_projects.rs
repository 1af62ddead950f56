//! Projects, the single project sandbox (INV-1), profiles (INV-2), capability manifests and
//! MCP relation tuples (INV-14).

use std::collections::{BTreeSet, VecDeque};
use std::sync::Arc;

use crate::access::Subject;
use crate::command::{
    AttachSandbox, CreateProfile, CreateProject, DetachSandbox, GrantMcpUse, RequestAgentOperation,
    RevokeMcpUse, SetCapabilityManifest,
};
use crate::lease::check_descriptor;
use crate::limits::{
    ACTIVE_LEASES_PER_PROJECT_DEFAULT, ACTIVE_LEASES_PER_PROJECT_MAX, CAPABILITY_ENTRIES_MAX,
    PROFILES_PER_PROJECT_DEFAULT, PROFILES_PER_PROJECT_MAX, PROVIDERS_PER_PROFILE_MAX,
    RELATION_TUPLES_MAX,
};
use crate::mailbox::Mailbox;
use crate::profile::{AgentProfile, CapabilityManifest};
use crate::project::{Project, ProjectSandbox, ProjectStats};
use crate::provider::Provider;
use crate::rejection::{Entity, Rejection};
use crate::response::Outcome;
use crate::roster::{Roster, RosterStatus};
use crate::state::{ProjectKey, State};

fn bounded(field: &str, value: Option<u32>, default: u32, max: u32) -> Result<u32, Rejection> {
    let v = value.unwrap_or(default);
    if v == 0 || v > max {
        return Err(Rejection::invalid(
            field,
            format!("must be between 1 and {max}, got {v}"),
        ));
    }
    Ok(v)
}

/// A profile's providers: at least one, a bounded number, none twice.
fn check_providers(providers: &[Provider]) -> Result<(), Rejection> {
    if providers.is_empty() {
        return Err(Rejection::invalid(
            "providers",
            "must name at least one provider",
        ));
    }
    if providers.len() > PROVIDERS_PER_PROFILE_MAX {
        return Err(Rejection::invalid(
            "providers",
            format!(
                "must name at most {PROVIDERS_PER_PROFILE_MAX} providers, got {}",
                providers.len()
            ),
        ));
    }
    let distinct: BTreeSet<_> = providers.iter().collect();
    if distinct.len() != providers.len() {
        return Err(Rejection::invalid(
            "providers",
            "must not repeat a provider",
        ));
    }
    Ok(())
}

impl State {
    /// An operator's agent request, for the audit: the profile must exist, and only an
    /// operator (or an old entry) asks — a worker's or an agent's own acts are recorded as
    /// theirs, under their own commands.
    pub(crate) fn request_agent_operation(
        &mut self,
        subject: &Subject,
        c: RequestAgentOperation,
    ) -> Result<Outcome, Rejection> {
        if !matches!(
            subject,
            Subject::Operator(_) | Subject::System | Subject::Legacy
        ) {
            return Err(Rejection::denied(format!(
                "only an operator asks for an agent {}, not {subject}",
                c.operation.as_str()
            )));
        }
        self.profile_ref(c.profile)?;
        Ok(Outcome::AgentOperationRequested)
    }

    pub(crate) fn create_project(
        &mut self,
        now: u64,
        command: CreateProject,
    ) -> Result<Outcome, Rejection> {
        let CreateProject {
            tenant,
            project,
            max_profiles,
            max_active,
        } = command;
        let max_profiles = bounded(
            "max_profiles",
            max_profiles,
            PROFILES_PER_PROJECT_DEFAULT,
            PROFILES_PER_PROJECT_MAX,
        )?;
        let max_active = bounded(
            "max_active",
            max_active,
            ACTIVE_LEASES_PER_PROJECT_DEFAULT,
            ACTIVE_LEASES_PER_PROJECT_MAX,
        )?;
        let key = (tenant.clone(), project.clone());
        if self.projects.contains_key(&key) {
            return Err(Rejection::AlreadyExists {
                entity: Entity::Project,
                id: format!("{tenant}/{project}"),
            });
        }
        self.projects.insert(
            key,
            Project {
                tenant,
                project,
                max_profiles,
                max_active,
                created_at_ms: now,
                profiles: Vec::new(),
                slots_held: 0,
                sandbox: None,
                roster: Roster::default(),
                stats: ProjectStats::default(),
            },
        );
        Ok(Outcome::ProjectCreated)
    }

    pub(crate) fn attach_sandbox(
        &mut self,
        now: u64,
        subject: &Subject,
        command: AttachSandbox,
    ) -> Result<Outcome, Rejection> {
        self.require_not_other_worker(subject, &command.worker)?;
        let AttachSandbox {
            tenant,
            project,
            worker,
            runtime,
            sandbox_ref,
        } = command;
        let key: ProjectKey = (tenant, project);
        check_descriptor("sandbox_ref", &sandbox_ref, true)?;
        let project = self.project_ref(&key)?;
        // INV-1: one live sandbox per project; a second is refused, never created beside it.
        if let Some(existing) = &project.sandbox {
            return Err(Rejection::SandboxExists {
                worker: existing.worker.to_string(),
                sandbox_ref: existing.sandbox_ref.clone(),
            });
        }
        let w = self.worker_ref(&worker)?;
        if !w.runtimes.contains(&runtime) {
            return Err(Rejection::WorkerUnavailable {
                reason: format!("worker {worker} does not offer the {runtime} runtime"),
            });
        }
        let project = self.projects.get_mut(&key).expect("project checked above");
        project.sandbox = Some(ProjectSandbox {
            worker,
            runtime,
            sandbox_ref,
            attached_at_ms: now,
        });
        project.stats.sandboxes_attached += 1;
        Ok(Outcome::SandboxAttached)
    }

    pub(crate) fn detach_sandbox(&mut self, command: DetachSandbox) -> Result<Outcome, Rejection> {
        let DetachSandbox {
            tenant,
            project,
            sandbox_ref,
        } = command;
        let key: ProjectKey = (tenant, project);
        let project = self.project_ref(&key)?;
        let Some(sandbox) = &project.sandbox else {
            return Err(Rejection::NoSandbox);
        };
        if sandbox.sandbox_ref != sandbox_ref {
            return Err(Rejection::not_found(Entity::Sandbox, &sandbox_ref));
        }
        // Provider processes live in the sandbox: it goes only when none can be running.
        if project.slots_held > 0 {
            return Err(Rejection::SandboxBusy {
                slots_held: project.slots_held,
            });
        }
        self.projects
            .get_mut(&key)
            .expect("project checked above")
            .sandbox = None;
        Ok(Outcome::SandboxDetached)
    }

    pub(crate) fn create_profile(
        &mut self,
        now: u64,
        command: CreateProfile,
    ) -> Result<Outcome, Rejection> {
        let CreateProfile {
            tenant,
            project,
            key: profile_key,
            providers,
            context_ref,
        } = command;
        let key: ProjectKey = (tenant, project);
        check_providers(&providers)?;
        if let Some(c) = &context_ref {
            check_descriptor("context_ref", c, false)?;
        }
        let project = self.project_ref(&key)?;
        let index_key = (key.0.clone(), key.1.clone(), profile_key.clone());
        if self.profile_index.contains_key(&index_key) {
            return Err(Rejection::AlreadyExists {
                entity: Entity::Profile,
                id: format!("{}/{}/{}", key.0, key.1, profile_key),
            });
        }
        let count = u32::try_from(project.profiles.len()).unwrap_or(u32::MAX);
        if count >= project.max_profiles {
            return Err(Rejection::ProfileLimitReached {
                count,
                max: project.max_profiles,
            });
        }

        let id = self.next_profile_id;
        self.next_profile_id = id.next();
        let profile = AgentProfile {
            id,
            tenant: key.0.clone(),
            project: key.1.clone(),
            key: profile_key.clone(),
            providers,
            worktree: format!("worktrees/{profile_key}"),
            subject: AgentProfile::subject_for(id),
            context_ref,
            capabilities: CapabilityManifest::default(),
            generation: crate::ids::Generation::ZERO,
            live_lease: None,
            fenced_unreaped: BTreeSet::new(),
            past_leases: VecDeque::new(),
            capsule_head: None,
            capsules: VecDeque::new(),
            created_at_ms: now,
        };
        self.profile_index.insert(index_key, id);
        self.profiles.insert(id, profile);
        self.mailboxes.insert(id, Arc::new(Mailbox::new(id)));
        let project = self.projects.get_mut(&key).expect("project checked above");
        project.profiles.push(id);
        assert!(
            project.profiles.len() <= project.max_profiles as usize,
            "INV-2 violated: project holds more profiles than max_profiles"
        );
        self.publish_roster(now, id, RosterStatus::Idle);
        Ok(Outcome::ProfileCreated { profile: id })
    }

    pub(crate) fn set_capability_manifest(
        &mut self,
        command: SetCapabilityManifest,
    ) -> Result<Outcome, Rejection> {
        let SetCapabilityManifest {
            profile,
            expected_version,
            required_skills,
            mcp_servers,
        } = command;
        for (field, n) in [
            ("required_skills", required_skills.len()),
            ("mcp_servers", mcp_servers.len()),
        ] {
            if n > CAPABILITY_ENTRIES_MAX {
                return Err(Rejection::invalid(
                    field,
                    format!("must have at most {CAPABILITY_ENTRIES_MAX} entries, got {n}"),
                ));
            }
        }
        let current = self.profile_ref(profile)?.capabilities.version;
        if current != expected_version {
            return Err(Rejection::ManifestVersionConflict {
                expected: expected_version,
                current,
            });
        }
        let p = self
            .profiles
            .get_mut(&profile)
            .expect("profile checked above");
        p.capabilities = CapabilityManifest {
            version: current + 1,
            required_skills: required_skills.into_iter().collect(),
            mcp_servers: mcp_servers.into_iter().collect(),
        };
        Ok(Outcome::CapabilityManifestSet {
            version: current + 1,
        })
    }

    pub(crate) fn grant_mcp_use(&mut self, command: GrantMcpUse) -> Result<Outcome, Rejection> {
        let GrantMcpUse { profile, server } = command;
        self.profile_ref(profile)?;
        if self.mcp_use.contains(&(profile, server.clone())) {
            return Err(Rejection::AlreadyExists {
                entity: Entity::Relation,
                id: format!("profile:{profile}#use@mcp_server:{server}"),
            });
        }
        if self.mcp_use.len() >= RELATION_TUPLES_MAX {
            return Err(Rejection::invalid(
                "server",
                format!("the relation store is full ({RELATION_TUPLES_MAX} tuples)"),
            ));
        }
        self.mcp_use.insert((profile, server));
        Ok(Outcome::McpUseGranted)
    }

    pub(crate) fn revoke_mcp_use(&mut self, command: RevokeMcpUse) -> Result<Outcome, Rejection> {
        let RevokeMcpUse { profile, server } = command;
        if !self.mcp_use.remove(&(profile, server.clone())) {
            return Err(Rejection::not_found(
                Entity::Relation,
                format!("profile:{profile}#use@mcp_server:{server}"),
            ));
        }
        Ok(Outcome::McpUseRevoked)
    }
}
