//! The runtime of a `placement: project` task: its attempt runs as a generation of the profile
//! it names — the generation its runtime lease holds — inside the project's one sandbox
//! (`agent::attempt`): the generation's cgroup leaf under the project's cgroup, the profile's
//! worktree as its work tree, the same boundary as the profile's own providers. The profile is
//! busy meanwhile: the lease is its one writer, and the worker refuses another generation of
//! it while this one's leaf is populated.
//!
//! The task's own files stay the task's: its `launch.sh`, prompt and script become the
//! generation's launch files at `/mnt/run`, its outbox is shown at `/mnt/outbox` (progress
//! logs, events, artifacts), and the worktree is shown at `/mnt/inbox` as well as at
//! `/workspace`, so the `launch.sh` of a dedicated task runs unchanged. `.git` is read-only
//! inside, as for every generation: the task leaves its changes uncommitted in the worktree,
//! and its patch is collected against the worktree as it found it
//! (`task::collector::worktree`).
//!
//! PROVISIONING makes the profile's worktree if needed and snapshots it, recorded in the task's
//! root as `project-run-a{attempt}.json` (what `adopt` finds after a restart). There is no
//! `gateway` proxy in a project sandbox: that mode is refused.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use squadron_core::ids::{Generation, ProfileKey, ProjectId, TaskId, TenantId};
use squadron_core::manifest::{NetworkMode, RuntimeKind};

use crate::agent::attempt::{AgentAttempt, AgentLaunch};
use crate::agent::credentials::AgentCredentials;
use crate::agent::project_sandbox::ProjectSandbox;
use crate::agent::runtime::{isolation, AgentRuntime};
use crate::agent::supervisor::AgentSupervisor;
use crate::error::WorkerError;
use crate::runtime::boundary_network::{BoundaryNetwork, NetworkPermits};
use crate::runtime::sandbox_user::SandboxUser;
use crate::runtime::{LaunchSpec, ReapReport, RunStatus, Runtime, SandboxHandle};
use crate::support::{now_ms, write_atomic};
use crate::task::collector::worktree::{
    snapshot_worktree, ProfileWorktree, WorktreeSnapshot, SCRATCH_INDEX_NAME,
};
use crate::task::launcher::{
    EGRESS_ENV_FILE_NAME, LAUNCH_SCRIPT_NAME, PROMPT_FILE_NAME, SCRIPT_FILE_NAME,
};
use crate::task::task_dir::TaskDir;

/// The runtime's name in errors.
pub(crate) const PROJECT_RUNTIME: &str = "project sandbox";
/// Largest `project-run-a{n}.json` read back.
const PROJECT_RUN_RECORD_BYTES_MAX: u64 = 64 * 1024;
/// The task's launch files that become the generation's: whatever of them exists.
const TASK_RUN_FILES: [&str; 4] = [
    LAUNCH_SCRIPT_NAME,
    PROMPT_FILE_NAME,
    SCRIPT_FILE_NAME,
    EGRESS_ENV_FILE_NAME,
];

/// What PROVISIONING recorded of an attempt: the generation it runs as and the worktree it
/// found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ProjectRun {
    pub(crate) task: TaskId,
    pub(crate) attempt: u32,
    pub(crate) tenant: TenantId,
    pub(crate) project: ProjectId,
    pub(crate) profile: ProfileKey,
    pub(crate) generation: Generation,
    pub(crate) base: WorktreeSnapshot,
}

/// One `placement: project` task's runtime: its profile, generation and project sandbox.
#[derive(Debug)]
pub(crate) struct ProjectRuntime {
    agents: AgentRuntime,
    sandbox: Arc<ProjectSandbox>,
    key: ProfileKey,
    generation: Generation,
}

impl ProjectRuntime {
    pub(crate) fn new(
        agents: AgentRuntime,
        sandbox: Arc<ProjectSandbox>,
        key: ProfileKey,
        generation: Generation,
    ) -> Self {
        ProjectRuntime {
            agents,
            sandbox,
            key,
            generation,
        }
    }

    /// The runtime of the attempt `run` records, in `agents`' sandbox of its project.
    pub(crate) async fn of_record(
        agents: &AgentSupervisor,
        run: &ProjectRun,
    ) -> Result<Self, WorkerError> {
        let sandbox = agents
            .sandbox_of(&run.tenant, &run.project)
            .await
            .map_err(|e| WorkerError::runtime(PROJECT_RUNTIME, e.to_string()))?;
        Ok(Self::new(
            agents.runtime().clone(),
            sandbox,
            run.profile.clone(),
            run.generation,
        ))
    }

    /// The profile's worktree on the host: what the task's disk use is counted over, with its
    /// outbox.
    pub(crate) fn worktree(&self) -> PathBuf {
        self.sandbox.profile_paths(&self.key).worktree
    }

    /// Where PROVISIONING records the attempt.
    pub(crate) fn record_path(dir: &TaskDir, attempt: u32) -> PathBuf {
        dir.root().join(format!("project-run-a{attempt}.json"))
    }

    /// The attempt's record, if PROVISIONING wrote one.
    pub(crate) fn record(dir: &TaskDir, attempt: u32) -> Result<Option<ProjectRun>, WorkerError> {
        let path = Self::record_path(dir, attempt);
        let bytes = match crate::support::read_bounded(&path, PROJECT_RUN_RECORD_BYTES_MAX) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(WorkerError::io("reading", &path, e)),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| WorkerError::runtime(PROJECT_RUNTIME, format!("{}: {e}", path.display())))
    }

    /// Where collection finds the task's work: the worktree and the snapshot it started from.
    pub(crate) fn collect_source(&self, run: &ProjectRun) -> ProfileWorktree {
        ProfileWorktree {
            worktree: self.sandbox.profile_paths(&self.key).worktree,
            admin: self.admin_dir(),
            base: run.base.clone(),
        }
    }

    fn admin_dir(&self) -> PathBuf {
        self.sandbox
            .git_dir()
            .join("worktrees")
            .join(self.key.as_str())
    }

    fn handle(&self) -> SandboxHandle {
        let leaf = self.agents.leaf_path(
            self.sandbox.tenant(),
            self.sandbox.project(),
            &self.key,
            self.generation,
        );
        SandboxHandle {
            runtime: RuntimeKind::Process,
            id: leaf.display().to_string(),
        }
    }

    /// Only this task's generation is driven here.
    fn check_handle(&self, handle: &SandboxHandle) -> Result<(), WorkerError> {
        let ours = self.handle();
        if *handle != ours {
            return Err(WorkerError::Invalid {
                field: "sandbox handle".to_owned(),
                message: format!("{} is not this attempt's leaf {}", handle.id, ours.id),
            });
        }
        Ok(())
    }

    /// The attempt once it started; `None` before.
    async fn attempt(&self) -> Result<Option<AgentAttempt>, WorkerError> {
        let (rt, sandbox, key, generation) = self.parts();
        blocking(move || AgentAttempt::adopt(&rt, &sandbox, &key, generation)).await
    }

    fn parts(&self) -> (AgentRuntime, Arc<ProjectSandbox>, ProfileKey, Generation) {
        (
            self.agents.clone(),
            self.sandbox.clone(),
            self.key.clone(),
            self.generation,
        )
    }

    /// The generation's launch: the task's command, environment and launch files, its
    /// outbox, limits, network and credentials.
    fn launch(&self, spec: &LaunchSpec) -> Result<AgentLaunch, WorkerError> {
        let run = spec.dir.run();
        let mut run_files = std::collections::BTreeMap::new();
        for name in TASK_RUN_FILES {
            let path = run.join(name);
            match std::fs::read(&path) {
                Ok(bytes) => {
                    run_files.insert(name.to_owned(), bytes);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(WorkerError::io("reading", &path, e)),
            }
        }
        let credentials = spec.credentials.as_ref().map(|session| AgentCredentials {
            host: session.host_dir().to_path_buf(),
            sandbox: session.sandbox_dir().to_owned(),
            // Already in the task's environment.
            env: Default::default(),
            egress: spec.egress.clone(),
        });
        Ok(AgentLaunch {
            argv: spec.argv.clone(),
            env: spec.env.clone(),
            run_files,
            stdin: None,
            network: spec.network,
            limits: spec.limits,
            broker_dir: None,
            credentials,
            task_outbox: Some(spec.dir.outbox()),
        })
    }
}

#[async_trait]
impl Runtime for ProjectRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn serves_egress(&self) -> bool {
        true
    }

    /// After a restart: the proxy served again in the namespace the generation's network
    /// record names.
    async fn serve_egress(
        &self,
        handle: &SandboxHandle,
        egress: &Arc<crate::egress::EgressSession>,
    ) -> Result<(), WorkerError> {
        self.check_handle(handle)?;
        let attempt = self.attempt().await?.ok_or_else(|| {
            WorkerError::runtime(PROJECT_RUNTIME, format!("{} never started", handle.id))
        })?;
        attempt.serve_egress_again(egress)
    }

    fn sandbox_owner(&self, _spec: &LaunchSpec) -> Result<(u32, u32), WorkerError> {
        Ok(self
            .agents
            .config()
            .sandbox_user
            .map_or((0, 0), SandboxUser::pair))
    }

    async fn provision(&self, spec: &LaunchSpec) -> Result<SandboxHandle, WorkerError> {
        if spec.network == NetworkMode::Gateway {
            return Err(WorkerError::Invalid {
                field: "vm.network_mode".to_owned(),
                message: "gateway needs a task sandbox's own proxy; a placement: project task \
                          runs in its project's sandbox, which has none (use outbound or \
                          isolated)"
                    .to_owned(),
            });
        }
        BoundaryNetwork::check_mode(
            spec.network,
            NetworkPermits {
                full: self.agents.config().allow_full_network,
                gateway: false,
            },
        )?;
        let record_path = Self::record_path(&spec.dir, spec.attempt);
        if let Some(run) = Self::record(&spec.dir, spec.attempt)? {
            if run.profile == self.key && run.generation == self.generation {
                return Ok(self.handle());
            }
        }
        let (rt, sandbox, key, generation) = self.parts();
        let admin = self.admin_dir();
        let scratch = spec.dir.root().join(SCRATCH_INDEX_NAME);
        let (task, attempt) = (spec.task, spec.attempt);
        blocking(move || {
            let paths = sandbox.ensure_profile(&key)?;
            if sandbox.started(&key, generation)?.is_some() {
                return Err(WorkerError::runtime(
                    PROJECT_RUNTIME,
                    format!("generation {generation} of {key} started already"),
                ));
            }
            // The snapshot must see the worktree at rest.
            let running = rt.running_generations(sandbox.tenant(), sandbox.project(), &key)?;
            if let Some(g) = running.first() {
                return Err(WorkerError::runtime(
                    PROJECT_RUNTIME,
                    format!("generation {g} of profile {key} still runs in its worktree"),
                ));
            }
            let mut notes = Vec::new();
            let base = snapshot_worktree(&admin, &paths.worktree, &scratch, &mut notes)
                .map_err(|why| WorkerError::runtime(PROJECT_RUNTIME, why))?;
            for note in notes {
                tracing::warn!(%task, profile = %key, "{note}");
            }
            let run = ProjectRun {
                task,
                attempt,
                tenant: sandbox.tenant().clone(),
                project: sandbox.project().clone(),
                profile: key,
                generation,
                base,
            };
            let json = serde_json::to_vec_pretty(&run)
                .map_err(|e| WorkerError::runtime(PROJECT_RUNTIME, e.to_string()))?;
            write_atomic(&record_path, &json)
        })
        .await?;
        Ok(self.handle())
    }

    async fn start(&self, handle: &SandboxHandle, spec: &LaunchSpec) -> Result<(), WorkerError> {
        self.check_handle(handle)?;
        if self.attempt().await?.is_some() {
            tracing::info!(sandbox = %handle.id, "already started; not starting twice");
            return Ok(());
        }
        let launch = self.launch(spec)?;
        let outbox = spec.dir.outbox();
        let progress = spec.dir.progress();
        let user = self.agents.config().sandbox_user;
        let (rt, sandbox, key, generation) = self.parts();
        blocking(move || {
            std::fs::create_dir_all(&progress)
                .map_err(|e| WorkerError::io("create progress directory", &progress, e))?;
            if let Some(user) = user {
                user.hand_over(&outbox)?;
            }
            AgentAttempt::start(&rt, &sandbox, &key, generation, &launch).map(|_| ())
        })
        .await
    }

    async fn status(&self, handle: &SandboxHandle) -> Result<RunStatus, WorkerError> {
        self.check_handle(handle)?;
        match self.attempt().await? {
            Some(attempt) => blocking(move || attempt.status()).await,
            None => Ok(RunStatus::Created),
        }
    }

    async fn terminate(&self, handle: &SandboxHandle, grace: Duration) -> Result<(), WorkerError> {
        self.check_handle(handle)?;
        if let Some(attempt) = self.attempt().await? {
            let outcome = blocking(move || attempt.terminate(grace)).await?;
            tracing::info!(sandbox = %handle.id, ?outcome, "terminated");
        }
        Ok(())
    }

    /// The generation's proving reap: its leaf frozen, killed, `populated 0`, removed, the
    /// evidence kept in the sandbox's run directory as for any generation.
    async fn destroy(&self, handle: &SandboxHandle) -> Result<ReapReport, WorkerError> {
        self.check_handle(handle)?;
        let Some(attempt) = self.attempt().await? else {
            return Ok(ReapReport {
                sandbox: handle.id.clone(),
                populated: false,
                observed_at_ms: now_ms(),
                detail: "never started".to_owned(),
            });
        };
        let evidence = blocking(move || attempt.reap()).await?;
        if evidence.populated {
            return Err(WorkerError::runtime(
                PROJECT_RUNTIME,
                format!(
                    "{} is still populated after the reap ({:?}); it is not proven quiescent",
                    evidence.cgroup, evidence.steps
                ),
            ));
        }
        Ok(ReapReport {
            sandbox: evidence.cgroup.clone(),
            populated: evidence.populated,
            observed_at_ms: evidence.observed_at_ms,
            detail: format!("{evidence:?}"),
        })
    }

    async fn adopt(
        &self,
        _task: TaskId,
        attempt: u32,
        dir: &TaskDir,
    ) -> Result<Option<SandboxHandle>, WorkerError> {
        match Self::record(dir, attempt)? {
            Some(run) if run.profile == self.key && run.generation == self.generation => {
                Ok(Some(self.handle()))
            }
            Some(run) => Err(WorkerError::runtime(
                PROJECT_RUNTIME,
                format!(
                    "attempt {attempt} was provisioned as generation {} of {}, not {} of {}",
                    run.generation, run.profile, self.generation, self.key
                ),
            )),
            None => Ok(None),
        }
    }

    async fn break_glass(&self, handle: &SandboxHandle) -> String {
        format!(
            "the task ran as generation {} of profile {}: its worktree {} keeps its changes (leaf {})",
            self.generation,
            self.key,
            self.sandbox.profile_paths(&self.key).worktree.display(),
            handle.id
        )
    }

    fn measures_usage(&self) -> bool {
        true
    }

    /// The generation's leaf, by the host's accounting.
    async fn usage(
        &self,
        handle: &SandboxHandle,
    ) -> Result<Option<squadron_isolation::LeafUsage>, WorkerError> {
        self.check_handle(handle)?;
        let Some(attempt) = self.attempt().await? else {
            return Ok(None);
        };
        blocking(move || squadron_isolation::LeafUsage::of(attempt.leaf()).map_err(isolation)).await
    }

    async fn limits_hit(&self, handle: &SandboxHandle) -> Option<String> {
        self.check_handle(handle).ok()?;
        let attempt = self.attempt().await.ok()??;
        let hits =
            blocking(move || squadron_isolation::LimitHits::of(attempt.leaf()).map_err(isolation))
                .await;
        hits.ok()??.describe()
    }

    /// A project's generations are the agent supervisor's to list.
    async fn sandboxes(&self) -> Result<Vec<String>, WorkerError> {
        Ok(Vec::new())
    }
}

/// Runs blocking cgroup, file-system and git work off the async threads.
async fn blocking<T, F>(f: F) -> Result<T, WorkerError>
where
    F: FnOnce() -> Result<T, WorkerError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        WorkerError::runtime(PROJECT_RUNTIME, format!("a blocking step failed: {e}"))
    })?
}
