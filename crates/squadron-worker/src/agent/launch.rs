//! Launch: a profile's next generation is granted a lease and its provider started, and the
//! start every takeover ends with (`start_or_release`).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use squadron_client::types::AcquireLease;
use squadron_client::LaunchAgent;
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, McpServerId, ProfileId};
use squadron_core::lease::FencingToken;
use squadron_core::manifest::NetworkMode;
use squadron_core::profile::AgentProfile;
use squadron_core::provider::Provider;
use squadron_core::roster::RosterSnapshot;
use squadron_core::Outcome;

use crate::agent::attempt::{AgentAttempt, AgentLaunch, AGENT_RUN_MOUNT, BROKER_MOUNT};
use crate::agent::config::{ProviderLauncher, PROVIDER_SCRIPT_BYTES_MAX};
use crate::agent::credentials;
use crate::agent::error::AgentError;
use crate::agent::mcp_access::McpAccess;
use crate::agent::native_session::NativeSession;
use crate::agent::project_sandbox::ProjectSandbox;
use crate::agent::registry::AgentEntry;
use crate::agent::state::{AgentState, AttemptStatus};
use crate::agent::stream_capsule::{pending_of, PENDING_FILE_NAME};
use crate::agent::supervisor::{
    blocking, check_prompt, grant_token, unexpected, AgentSupervisor, AGENTS_MAX,
    BROKER_SOCKET_NAME,
};
use crate::egress::EgressSession;
use crate::runtime::sandbox_user::SandboxUser;
use crate::task::launcher::{cli_script, provider_env, EGRESS_ENV_FILE_NAME};

/// The watchdog every provider runs under: it forwards SIGTERM and kills the provider once
/// the worker's deadline for the lease has passed (self-fencing). Exit status is the
/// provider's.
const WATCHDOG_SCRIPT: &str = include_str!("watchdog.sh");
/// The launch file the watchdog runs: the provider's command.
const PROVIDER_SCRIPT_NAME: &str = "provider.sh";

/// A lease just granted and what its provider starts with.
pub(super) struct GrantedAttempt<'a> {
    pub(super) profile: &'a AgentProfile,
    pub(super) sandbox: Arc<ProjectSandbox>,
    pub(super) token: FencingToken,
    pub(super) provider: Provider,
    /// The newest capsule, shown at `/mnt/run/capsule.json`.
    pub(super) capsule: Option<ContinuityCapsule>,
    pub(super) prompt: Option<String>,
    /// When the grant was requested (local clock): the first renewal deadline counts from it.
    pub(super) sent_at: u64,
}

impl AgentSupervisor {
    pub(crate) async fn launch(
        &self,
        id: ProfileId,
        req: LaunchAgent,
    ) -> Result<AgentState, AgentError> {
        let _op = self.inner.ops.lock().await;
        self.launch_locked(id, req).await
    }

    /// A launch, with the operations lock held.
    pub(super) async fn launch_locked(
        &self,
        id: ProfileId,
        req: LaunchAgent,
    ) -> Result<AgentState, AgentError> {
        if let Some(prompt) = &req.prompt {
            check_prompt(prompt)?;
        }
        let profile = self.profile(id).await?;
        let (running, here) = self.registry().admission(id);
        check_launchable(&profile, here)?;
        let provider = self.choose_provider(&profile, req.provider, None)?;
        self.check_capabilities(&profile)?;
        if running >= AGENTS_MAX {
            return Err(AgentError::new(
                ErrorCode::ResourceExhausted,
                format!("this worker supervises {AGENTS_MAX} agents already"),
            ));
        }
        let sandbox = self
            .sandbox_for(&profile, req.repository.as_ref(), req.worker.as_ref())
            .await?;
        let sb = sandbox.clone();
        let key = profile.key.clone();
        blocking(move || sb.ensure_profile(&key)).await?;

        // Everything that can fail is read before the grant, so a granted lease is either
        // started or released.
        let capsule = self.latest_capsule(id).await?;
        if let Some(ProviderLauncher::Cli) = self.inner.config.providers.get(&provider) {
            headless_prompt(provider, id, req.prompt.as_ref(), capsule.as_ref())?;
        }
        let next = profile.generation.successor();
        let holder = self.holder(&sandbox, &profile, provider, next);
        let sent_at = squadron_client::now_ms();
        let acquire = AcquireLease {
            expected_generation: profile.generation,
            provider,
            holder,
            ttl_ms: self.inner.config.lease_ttl_ms,
        };
        // The control link keys this call once (`call_key`), so a resend after a lost answer
        // gets the first answer (INV-11); after an error the operator reads the generation
        // again and decides, nothing here repeats the compare-and-swap blindly.
        let outcome = self
            .inner
            .control
            .acquire_lease(id, &acquire)
            .await
            .map_err(|e| AgentError::from(e).context("acquiring the lease"))?;
        let Outcome::LeaseGranted(grant) = outcome else {
            return Err(unexpected("acquire", &outcome));
        };
        self.start_or_release(GrantedAttempt {
            profile: &profile,
            sandbox,
            token: grant_token(id, &grant),
            provider,
            capsule,
            prompt: req.prompt,
            sent_at,
        })
        .await
    }

    /// The requested provider, else the first of the profile's (in its order of preference)
    /// this worker can launch, preferring one other than `current` (a takeover swaps).
    pub(super) fn choose_provider(
        &self,
        profile: &AgentProfile,
        requested: Option<Provider>,
        current: Option<Provider>,
    ) -> Result<Provider, AgentError> {
        let launchable = |p: &Provider| self.inner.config.providers.contains_key(p);
        if let Some(p) = requested {
            if !profile.providers.contains(&p) {
                return Err(AgentError::invalid(
                    "provider",
                    format!(
                        "{p} is not one of profile {}'s providers {:?}",
                        profile.id, profile.providers
                    ),
                ));
            }
            if !launchable(&p) {
                return Err(AgentError::precondition(format!(
                    "worker {} has no launcher for provider {p}",
                    self.inner.worker
                )));
            }
            return Ok(p);
        }
        let mut candidates = profile.providers.iter().filter(|p| launchable(p));
        let first = candidates.clone().find(|p| Some(**p) != current);
        first.or_else(|| candidates.next()).copied().ok_or_else(|| {
            AgentError::precondition(format!(
                "worker {} can launch none of profile {}'s providers {:?}",
                self.inner.worker, profile.id, profile.providers
            ))
        })
    }

    /// A missing required skill or MCP server denies the launch; there is no fallback.
    pub(super) fn check_capabilities(&self, profile: &AgentProfile) -> Result<(), AgentError> {
        let caps = &profile.capabilities;
        let missing_skills: Vec<_> = caps
            .required_skills
            .iter()
            .filter(|s| !self.inner.config.skills.contains(*s))
            .map(ToString::to_string)
            .collect();
        let missing_mcp: Vec<_> = caps
            .mcp_servers
            .iter()
            .filter(|s| !self.inner.config.mcp_servers.contains_key(*s))
            .map(ToString::to_string)
            .collect();
        if missing_skills.is_empty() && missing_mcp.is_empty() {
            return Ok(());
        }
        let mut what = Vec::new();
        if !missing_skills.is_empty() {
            what.push(format!("skills {}", missing_skills.join(", ")));
        }
        if !missing_mcp.is_empty() {
            what.push(format!("MCP servers {}", missing_mcp.join(", ")));
        }
        Err(AgentError::precondition(format!(
            "launch denied: capability manifest v{} of profile {} requires {} that worker {} \
             does not offer",
            caps.version,
            profile.id,
            what.join(" and "),
            self.inner.worker
        )))
    }

    /// Starts the attempt of a granted lease; when the start fails, whatever started is
    /// reaped and the lease released, so a failed launch holds no slot.
    pub(super) async fn start_or_release(
        &self,
        g: GrantedAttempt<'_>,
    ) -> Result<AgentState, AgentError> {
        let (profile, sandbox, token) = (g.profile, g.sandbox.clone(), g.token);
        let e = match self.start(g).await {
            Ok(state) => return Ok(state),
            Err(e) => e,
        };
        tracing::warn!(profile = %profile.id, generation = %token.generation, error = %e, "start failed; reaping and releasing");
        let (rt, key, generation) = (
            self.inner.runtime.clone(),
            profile.key.clone(),
            token.generation,
        );
        let adopted = blocking(move || AgentAttempt::adopt(&rt, &sandbox, &key, generation)).await;
        if let Ok(Some(attempt)) = adopted {
            if let Ok(proof) = self
                .stop_attempt(&attempt, token.lease, Duration::ZERO)
                .await
            {
                let _ = self.end_lease(token, proof).await;
                return Err(e.context("starting the provider"));
            }
        }
        self.release_or_queue(token).await;
        Err(e.context("starting the provider"))
    }

    async fn start(&self, mut g: GrantedAttempt<'_>) -> Result<AgentState, AgentError> {
        g.capsule = self.catch_up_capsule(&g).await?;
        let config = &self.inner.config;
        let deadline = g.sent_at + config.lease_ttl_ms - config.self_fence_margin_ms;
        let roster = self
            .inner
            .control
            .roster(&g.profile.tenant, &g.profile.project)
            .await?;
        let mcp = McpAccess::new(self.mcp_servers_for(g.profile.id).await?);
        let mut launch = self.agent_launch(&g, deadline, &roster, &mcp)?;
        let paths = g.sandbox.profile_paths(&g.profile.key);
        let owner = self
            .inner
            .runtime
            .config()
            .sandbox_user
            .map_or((0, 0), SandboxUser::pair);
        let (rt, sb, key, generation) = (
            self.inner.runtime.clone(),
            g.sandbox.clone(),
            g.profile.key.clone(),
            g.token.generation,
        );
        // Nothing of the generation runs after a failure from here on: its files go now, not
        // at a reap that may never find a start to reap.
        let wipe = {
            let (paths, key) = (paths.clone(), key.clone());
            move || {
                if let Err(e) = credentials::redact_and_wipe(&paths, generation) {
                    tracing::error!(profile = %key, %generation, error = %e, "cannot wipe the credentials of a failed start");
                }
            }
        };
        if let Some(credentials) = self.take_credentials(&paths, g.token, owner).await? {
            launch.env.extend(credentials.env.clone());
            if let Some(egress) = &credentials.egress {
                source_egress_env(&mut launch, egress).inspect_err(|_| wipe())?;
            }
            launch.credentials = Some(credentials);
        }
        let mut sockets = self
            .serve_sockets(&g.sandbox, g.profile, &mcp.token)
            .inspect_err(|_| wipe())?;
        // Closed with the sockets, whichever way the generation ends (a failed start too).
        sockets.egress = launch.credentials.as_ref().and_then(|c| c.egress.clone());
        let attempt = blocking(move || {
            AgentAttempt::start(&rt, &sb, &key, generation, &launch).inspect_err(|_| wipe())
        })
        .await?;
        let (profile, token) = (g.profile, g.token);
        let state = AgentState {
            profile: profile.id,
            key: profile.key.clone(),
            tenant: profile.tenant.clone(),
            project: profile.project.clone(),
            provider: g.provider,
            lease: token.lease,
            generation: token.generation,
            status: AttemptStatus::Running,
            cgroup: attempt.cgroup_path().display().to_string(),
            exit_code: None,
            capsule_sequence: g.capsule.as_ref().map(|c| c.sequence),
            mailbox_delivered_through: 0,
        };
        tracing::info!(profile = %profile.id, provider = %g.provider, generation = %token.generation, lease = %token.lease, "agent launched");
        self.registry().insert(AgentEntry {
            state: state.clone(),
            attempt,
            sandbox: g.sandbox,
            sockets: Some(sockets),
            deadline_ms: deadline,
            pending_evidence: None,
        });
        self.sample_processes(&profile.tenant, &profile.project);
        Ok(state)
    }

    /// What the granted generation runs: the watchdog around the provider's command, the
    /// launch files, the prompt on standard input, and the fixed environment.
    fn agent_launch(
        &self,
        g: &GrantedAttempt<'_>,
        deadline: u64,
        roster: &RosterSnapshot,
        mcp: &McpAccess,
    ) -> Result<AgentLaunch, AgentError> {
        let mut run_files = run_files(g, deadline, roster)?;
        run_files.extend(mcp.run_files());
        let (script, prompt, provider_env) = self.provider_command(g, mcp)?;
        run_files.insert(PROVIDER_SCRIPT_NAME.to_owned(), script);
        let argv = vec![
            "/bin/sh".to_owned(),
            format!("{AGENT_RUN_MOUNT}/watchdog.sh"),
            "/bin/sh".to_owned(),
            format!("{AGENT_RUN_MOUNT}/provider.sh"),
        ];
        let inherited = g
            .capsule
            .as_ref()
            .map_or(&[][..], |c| c.payload.pending_work.as_slice());
        let pending = pending_of(g.prompt.as_deref(), inherited);
        run_files.insert(PENDING_FILE_NAME.to_owned(), to_json(&pending)?);
        let stdin = prompt.map(|p| {
            run_files.insert("prompt".to_owned(), p.into_bytes());
            "prompt".to_owned()
        });
        let mut env = self.inner.config.inherited_env.clone();
        env.extend(provider_env);
        env.extend(mcp.env());
        env.extend(agent_env(g));
        Ok(AgentLaunch {
            argv,
            env,
            run_files,
            stdin,
            network: NetworkMode::Outbound,
            limits: self.inner.limits.limits(None, None),
            broker_dir: Some(self.broker_dir(g.profile.id)),
            credentials: None,
            task_outbox: None,
        })
    }
}

/// The launch of a generation with credentials injected at egress: `egress.env` (the proxy's
/// base URLs and the generation's placeholder, nothing secret) among its launch files, sourced
/// by `provider.sh` before anything else, so the values reach the provider as files do,
/// never on bubblewrap's command line.
fn source_egress_env(launch: &mut AgentLaunch, egress: &EgressSession) -> Result<(), AgentError> {
    let script = launch
        .run_files
        .get_mut(PROVIDER_SCRIPT_NAME)
        .ok_or_else(|| AgentError::new(ErrorCode::Internal, "the launch has no provider.sh"))?;
    let mut sourced = format!(". {AGENT_RUN_MOUNT}/{EGRESS_ENV_FILE_NAME}\n").into_bytes();
    sourced.append(script);
    *script = sourced;
    launch.run_files.insert(
        EGRESS_ENV_FILE_NAME.to_owned(),
        egress.env_script()?.into_bytes(),
    );
    Ok(())
}

/// What the provider runs as: its script, its first turn on stdin, and the variables it
/// needs. A headless CLI resumes its own session when the capsule names one of the same
/// CLI's (`NativeSession`).
type ProviderCommand = (Vec<u8>, Option<String>, Vec<(String, String)>);

impl AgentSupervisor {
    /// The MCP servers the profile is granted that this worker offers: what its providers'
    /// configuration lists. The gateway still asks at every message, so a grant revoked
    /// meanwhile is refused.
    async fn mcp_servers_for(&self, id: ProfileId) -> Result<Vec<McpServerId>, AgentError> {
        let granted = self
            .inner
            .control
            .mcp_grants(id)
            .await
            .map_err(|e| AgentError::from(e).context("reading the profile's MCP grants"))?;
        Ok(granted
            .into_iter()
            .filter(|s| self.inner.mcp.offers(s))
            .collect())
    }

    fn provider_command(
        &self,
        g: &GrantedAttempt<'_>,
        mcp: &McpAccess,
    ) -> Result<ProviderCommand, AgentError> {
        match self.inner.config.providers.get(&g.provider) {
            Some(ProviderLauncher::Cli) => {
                let state = g.sandbox.profile_paths(&g.profile.key).state;
                let resume = g.capsule.as_ref().and_then(|c| {
                    NativeSession::to_resume(g.provider, &c.payload.context_ref, &state)
                });
                let script = cli_script(g.provider, |argv| {
                    mcp.insert_into(g.provider, argv);
                    if let Some(session) = &resume {
                        session.insert_into(argv);
                    }
                })?;
                let prompt = headless_prompt(
                    g.provider,
                    g.profile.id,
                    g.prompt.as_ref(),
                    g.capsule.as_ref(),
                )?;
                let env = provider_env(g.provider)
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                Ok((script.into_bytes(), Some(prompt), env))
            }
            Some(ProviderLauncher::Script(path)) => Ok((
                read_bounded(path, PROVIDER_SCRIPT_BYTES_MAX)?,
                g.prompt.clone(),
                Vec::new(),
            )),
            None => Err(AgentError::precondition(format!(
                "worker {} has no launcher for provider {}",
                self.inner.worker, g.provider
            ))),
        }
    }
}

/// What a headless CLI is told first: the capsule it continues from, rendered as text (the
/// same for every provider, so a swap carries it), then the operator's prompt — or, after a
/// takeover without one, to go on with the pending work. A first launch needs a prompt: a
/// headless CLI has nobody to ask.
fn headless_prompt(
    provider: Provider,
    profile: ProfileId,
    prompt: Option<&String>,
    capsule: Option<&ContinuityCapsule>,
) -> Result<String, AgentError> {
    let Some(capsule) = capsule else {
        return prompt.cloned().ok_or_else(|| {
            AgentError::invalid(
                "prompt",
                format!(
                    "{provider} runs headless and needs a prompt (--prompt-file) when profile \
                     {profile} has no capsule to continue from"
                ),
            )
        });
    };
    let then = prompt.map_or("Continue the pending work above.", String::as_str);
    Ok(format!("{}\n\n{then}", render_capsule(capsule)))
}

/// A capsule as a provider reads it.
pub(crate) fn render_capsule(c: &ContinuityCapsule) -> String {
    let list = |items: &[String]| -> String {
        if items.is_empty() {
            "- (none)\n".to_owned()
        } else {
            items.iter().map(|i| format!("- {i}\n")).collect()
        }
    };
    let p = &c.payload;
    format!(
        "You continue the work of agent profile {profile}: generation {generation} left this \
         continuity capsule (sequence {sequence}, digest {digest}).\n\
         Task state: {state}\nDecisions:\n{decisions}Pending work:\n{pending}\
         Repository revision: {revision}\nMailbox cursor: {cursor}\nContext: {context}",
        profile = c.profile,
        generation = c.generation,
        sequence = c.sequence,
        digest = c.digest.to_hex(),
        state = p.task_state,
        decisions = list(&p.decisions),
        pending = list(&p.pending_work),
        revision = p.repository_revision,
        cursor = p.mailbox_cursor,
        context = p.context_ref,
    )
}

/// A launch needs the profile idle here (`here`: the generation it runs here, if any) and
/// without a live lease anywhere.
fn check_launchable(profile: &AgentProfile, here: Option<Generation>) -> Result<(), AgentError> {
    let id = profile.id;
    if let Some(generation) = here {
        return Err(AgentError::precondition(format!(
            "profile {id} already runs generation {generation} here; stop it or take it over"
        )));
    }
    if let Some(live) = profile.live_lease {
        return Err(AgentError::precondition(format!(
            "profile {id} holds lease {live} (generation {}); take it over instead of \
             launching",
            profile.generation
        )));
    }
    Ok(())
}

/// The generation's launch files: the watchdog, its deadline, the roster, who it is, and the
/// capsule it starts from.
fn run_files(
    g: &GrantedAttempt<'_>,
    deadline: u64,
    roster: &RosterSnapshot,
) -> Result<BTreeMap<String, Vec<u8>>, AgentError> {
    let (profile, token) = (g.profile, g.token);
    let mut files = BTreeMap::new();
    files.insert(
        "watchdog.sh".to_owned(),
        WATCHDOG_SCRIPT.as_bytes().to_vec(),
    );
    files.insert(
        "lease-deadline-ms".to_owned(),
        deadline.to_string().into_bytes(),
    );
    files.insert("roster.json".to_owned(), to_json(roster)?);
    files.insert(
        "identity.json".to_owned(),
        to_json(&serde_json::json!({
            "profile": profile.id,
            "key": profile.key,
            "subject": profile.subject,
            "lease": token.lease,
            "generation": token.generation,
            "provider": g.provider,
        }))?,
    );
    if let Some(c) = &g.capsule {
        files.insert("capsule.json".to_owned(), to_json(c)?);
    }
    Ok(files)
}

/// The provider's whole environment: nothing of the worker's own leaks in.
fn agent_env(g: &GrantedAttempt<'_>) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
        ("HOME".to_owned(), "/state".to_owned()),
        ("SQUADRON_PROFILE_ID".to_owned(), g.profile.id.to_string()),
        ("SQUADRON_LEASE_ID".to_owned(), g.token.lease.to_string()),
        ("SQUADRON_PROVIDER".to_owned(), g.provider.to_string()),
        (
            "SQUADRON_BROKER_SOCKET".to_owned(),
            format!("{BROKER_MOUNT}/{BROKER_SOCKET_NAME}"),
        ),
        (
            "SQUADRON_MAILBOX".to_owned(),
            format!("{AGENT_RUN_MOUNT}/mailbox.jsonl"),
        ),
    ])
}

fn to_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, AgentError> {
    serde_json::to_vec_pretty(value)
        .map_err(|e| AgentError::new(ErrorCode::Internal, format!("encoding: {e}")))
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, AgentError> {
    let meta = fs::metadata(path).map_err(|e| {
        AgentError::new(
            ErrorCode::FailedPrecondition,
            format!("provider script {}: {e}", path.display()),
        )
    })?;
    if meta.len() > max {
        return Err(AgentError::precondition(format!(
            "provider script {} is {} bytes, at most {max}",
            path.display(),
            meta.len()
        )));
    }
    fs::read(path)
        .map_err(|e| AgentError::precondition(format!("provider script {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use squadron_core::capsule::CapsulePayload;
    use squadron_core::ids::{Digest, LeaseId};

    use super::*;

    fn capsule() -> ContinuityCapsule {
        ContinuityCapsule {
            profile: ProfileId::new(3).unwrap(),
            lease: LeaseId::new(5).unwrap(),
            generation: Generation::new(2),
            sequence: 4,
            previous: None,
            schema_version: 1,
            payload: CapsulePayload {
                task_state: "half of the parser is written".into(),
                decisions: vec!["keep the old API".into()],
                pending_work: vec!["write the tests".into(), "update the docs".into()],
                repository_revision: "abc123".into(),
                mailbox_cursor: 7,
                context_ref: "codex-session:s-1".into(),
            },
            digest: Digest::from_bytes([9; 32]),
            committed_at_ms: 1,
        }
    }

    #[test]
    fn a_headless_cli_needs_a_prompt_or_a_capsule() {
        let id = ProfileId::new(3).unwrap();
        let err = headless_prompt(Provider::Claude, id, None, None).unwrap_err();
        assert!(err.to_string().contains("prompt"), "{err}");
        let prompt = "Fix the build.".to_owned();
        assert_eq!(
            headless_prompt(Provider::Claude, id, Some(&prompt), None).unwrap(),
            prompt
        );
    }

    #[test]
    fn the_capsule_comes_first_then_the_prompt_or_the_pending_work() {
        let id = ProfileId::new(3).unwrap();
        let c = capsule();
        let text = headless_prompt(Provider::Claude, id, None, Some(&c)).unwrap();
        for part in [
            "generation 2",
            "sequence 4",
            "Task state: half of the parser is written",
            "- keep the old API\n",
            "- write the tests\n- update the docs\n",
            "Repository revision: abc123",
            "Mailbox cursor: 7",
            "Context: codex-session:s-1",
            &c.digest.to_hex(),
        ] {
            assert!(text.contains(part), "{part:?} missing from:\n{text}");
        }
        assert!(text.ends_with("Continue the pending work above."), "{text}");
        let prompt = "Now the docs.".to_owned();
        let text = headless_prompt(Provider::Codex, id, Some(&prompt), Some(&c)).unwrap();
        assert!(text.starts_with("You continue") && text.ends_with("\n\nNow the docs."));
    }
}
