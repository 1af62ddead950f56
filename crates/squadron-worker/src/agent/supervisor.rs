//! The worker's side of the identity runtime (ADR-0011): it runs agent profiles' provider
//! processes in their project's one sandbox, each under a runtime lease it holds, and does
//! what the operator facade asks — launch, graceful or crash takeover, stop, reap.
//!
//! Order of every step, and why:
//! - **Launch** (`launch`): capability manifest checked against this host → sandbox opened
//!   (and attached to the project, INV-1) → lease acquired with the next generation's cgroup
//!   leaf as holder (INV-3, INV-5: the control plane admits at most `max_active`) → provider
//!   started in that leaf. A failed start is reaped and its lease released.
//! - **Renewal** (`renewal`): one `RenewLeases` command per tick for every lease this worker
//!   holds (one Raft entry per worker, not per agent). Each success moves the attempt's local
//!   deadline (send time + TTL − margin) into `/mnt/run/lease-deadline-ms`.
//! - **Self-fencing:** the provider runs under a watchdog (`watchdog.sh`, at
//!   `/mnt/run/watchdog.sh`) that kills it once that deadline passes, so a provider whose
//!   worker died or lost the control plane stops writing on its own; a worker that is alive
//!   does the same from its side (terminate, reap), and the Git broker refuses the fenced
//!   generation anyway.
//! - **Graceful takeover (INV-8)** (`takeover`): SIGTERM (the provider writes
//!   `/state/capsule.json`), grace, reap with `populated 0`, then one `GracefulTakeover`
//!   command (capsule commit and verify, fence, grant, with the reap evidence so the slot
//!   passes on), then the next provider starts with the capsule at `/mnt/run/capsule.json`.
//! - **Crash takeover (INV-9)** (`takeover`): only for a generation that is not running and
//!   renewed here: wait for the lease to expire, reap its leaf for evidence (or find the
//!   recorded evidence), then one `CrashTakeover` command, then start. Without evidence (the
//!   holder was another worker) the control plane refuses, and the refusal says to
//!   decommission. Both takeovers end in one shared tail.
//! - **Mailbox** (`mailbox`): each tick appends new mailbox messages (roster deltas
//!   included) to `/mnt/run/mailbox.jsonl` and acknowledges them under the lease. The run
//!   directory is read-only inside, so what a provider reads there was written by the worker.
//!
//! - **Detached sandboxes** (`detached`): a loop of its own removes a project's sandbox once
//!   the project has not been attached to this worker for `--detached-sandbox-retention`.
//!
//! A restarted worker adopts the attempts of the active leases it holds (`adoption`).
//!
//! The supervisor's state is its own ([`AgentState`] in a [`Registry`] behind one lock);
//! the agent API turns it into the wire's `AgentView`.

use std::fs;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use squadron_client::types::AttachSandbox;
use squadron_client::{BrokerEvidence, SandboxRepository};
use squadron_core::capsule::ContinuityCapsule;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, ProfileId, ProjectId, TenantId, WorkerId};
use squadron_core::lease::{FencingToken, LeaseHolder};
use squadron_core::manifest::RuntimeKind;
use squadron_core::profile::AgentProfile;
use squadron_core::provider::Provider;
use squadron_core::response::LeaseGrant;
use squadron_core::Outcome;
use squadron_isolation::{BrokerServer, GitBroker};
use squadron_pki::SecretToken;

use crate::agent::config::AgentConfig;
use crate::agent::error::AgentError;
use crate::agent::evidence_ledger::{broker_evidence, EvidenceLedger};
use crate::agent::fence::ControlFence;
use crate::agent::mcp_gateway::{McpGateway, McpSocket, MCP_SOCKET_NAME};
use crate::agent::project_sandbox::{ProjectSandbox, ProjectVolume, SandboxRecord};
use crate::agent::registry::Registry;
use crate::agent::runtime::AgentRuntime;
use crate::agent::state::AgentState;
use crate::config::SandboxDefaults;
use crate::control_link::ControlLink;
use crate::egress::EgressSession;
use crate::error::WorkerError;

/// How often running attempts are checked for exit and mailboxes for news.
pub(crate) const SUPERVISOR_TICK_MS: u64 = 250;
/// Largest prompt handed to a provider.
pub(crate) const PROMPT_BYTES_MAX: usize = 1 << 20;
/// Most agents one worker supervises.
pub(crate) const AGENTS_MAX: usize = 1_024;
/// The broker socket's name in `/mnt/broker`.
pub(crate) const BROKER_SOCKET_NAME: &str = "git.sock";

/// A running generation's sockets; all close when this is dropped (the attempt stops).
#[derive(Debug)]
pub(crate) struct AgentSockets {
    _broker: BrokerServer,
    _mcp: McpSocket,
    /// The proxy of its credentials injected at egress, if any.
    pub(super) egress: Option<Arc<EgressSession>>,
}

impl Drop for AgentSockets {
    /// The proxy's accept loop holds the session too: closing it is what ends the serving.
    fn drop(&mut self) {
        if let Some(egress) = &self.egress {
            egress.close();
        }
    }
}

/// Cheap to clone; clones share the supervisor.
#[derive(Debug, Clone)]
pub(crate) struct AgentSupervisor {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(crate) struct Inner {
    pub(super) worker: WorkerId,
    pub(super) data_dir: PathBuf,
    pub(super) config: AgentConfig,
    /// The worker's sandbox limits; every attempt gets them (profiles carry none).
    pub(super) limits: SandboxDefaults,
    pub(super) runtime: AgentRuntime,
    /// Everything this supervisor asks of the control plane: gRPC to the leader.
    pub(super) control: ControlLink,
    pub(super) broker: GitBroker,
    pub(super) mcp: McpGateway,
    /// Operator operations run one at a time: each reads the profile, decides and commits,
    /// and two interleaved on one profile would decide on stale reads.
    pub(super) ops: tokio::sync::Mutex<()>,
    registry: Mutex<Registry>,
    /// What the broker counted in the worker's earlier lives (`evidence_ledger.rs`).
    pub(super) broker_base: BrokerEvidence,
    /// The counters as last saved, so the tick writes only what changed.
    saved: Mutex<EvidenceLedger>,
}

impl AgentSupervisor {
    /// A supervisor for `worker`, its broker state under `data_dir/agent-broker`.
    pub(crate) fn new(
        worker: WorkerId,
        data_dir: PathBuf,
        config: AgentConfig,
        limits: SandboxDefaults,
        runtime: AgentRuntime,
        control: ControlLink,
    ) -> Result<AgentSupervisor, WorkerError> {
        config.validate()?;
        let fence = Arc::new(ControlFence::new(control.clone()));
        let broker = GitBroker::open(&data_dir.join("agent-broker"), fence)
            .map_err(|e| WorkerError::runtime("git broker", e.to_string()))?;
        let ledger = EvidenceLedger::load(&data_dir)?;
        let mcp = McpGateway::new(config.mcp_servers.clone(), control.clone())?;
        Ok(AgentSupervisor {
            inner: Arc::new(Inner {
                worker,
                data_dir,
                config,
                limits,
                runtime,
                control,
                broker,
                mcp,
                ops: tokio::sync::Mutex::new(()),
                registry: Mutex::new(Registry::with_counters(ledger.project_counters())),
                broker_base: ledger.broker.clone(),
                saved: Mutex::new(ledger),
            }),
        })
    }

    pub(crate) fn worker(&self) -> &WorkerId {
        &self.inner.worker
    }

    /// The runtime its attempts run in: a `placement: project` task's attempt runs there too.
    pub(crate) fn runtime(&self) -> &AgentRuntime {
        &self.inner.runtime
    }

    /// The one lock over the supervisor's state; hold it for one transition, never across
    /// an await.
    pub(super) fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the renewal loop, the tick loop (exits, mailboxes, evidence, releases) and the
    /// detached sandboxes' sweep on the current runtime. Renewals get their own task so a
    /// slow reap or mailbox read never delays them past a deadline.
    pub(crate) fn spawn_loops(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let renewals = self.spawn_every(self.inner.config.renew_interval_ms(), |me| async move {
            me.renew_all().await
        });
        let ticks = self.spawn_every(SUPERVISOR_TICK_MS, |me| async move {
            me.check_exits().await;
            me.deliver_mailboxes().await;
            me.retry_pending_evidence().await;
            me.retry_pending_releases().await;
            me.save_evidence();
        });
        // Its own loop: a sweep reads the control plane once per local sandbox.
        let sweeps = self.spawn_every(
            self.inner.config.detached_sweep_interval_ms,
            |me| async move { me.sweep_detached().await },
        );
        vec![renewals, ticks, sweeps]
    }

    /// A task running `round` every `every_ms`; a late round delays the next instead of
    /// bunching them.
    fn spawn_every<F, Fut>(&self, every_ms: u64, round: F) -> tokio::task::JoinHandle<()>
    where
        F: Fn(AgentSupervisor) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(every_ms));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                round(me.clone()).await;
            }
        })
    }

    /// Saves the evidence counters when they changed since the last save; a failed save is
    /// tried again at the next tick.
    pub(crate) fn save_evidence(&self) {
        let now = EvidenceLedger::of(
            self.registry().all_counters().into_iter(),
            broker_evidence(&self.inner.broker_base, &self.inner.broker.stats()),
        );
        let mut saved = self
            .inner
            .saved
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if *saved == now {
            return;
        }
        match now.save(&self.inner.data_dir) {
            Ok(()) => *saved = now,
            Err(e) => tracing::warn!(error = %e, "cannot save the evidence counters"),
        }
    }

    /// The profile's attempt as this worker sees it.
    pub(crate) fn state(&self, id: ProfileId) -> Result<AgentState, AgentError> {
        self.registry().state(id).ok_or_else(|| {
            AgentError::not_found(format!(
                "profile {id} has no provider attempt on worker {}",
                self.inner.worker
            ))
        })
    }

    /// Every attempt this worker knows.
    pub(crate) fn states(&self) -> Vec<AgentState> {
        self.registry().states()
    }

    // --- reads and pieces shared by the steps ----------------------------------------------

    pub(super) async fn profile(&self, id: ProfileId) -> Result<AgentProfile, AgentError> {
        self.inner
            .control
            .get_profile(id)
            .await
            .map_err(AgentError::from)
    }

    pub(super) async fn latest_capsule(
        &self,
        id: ProfileId,
    ) -> Result<Option<ContinuityCapsule>, AgentError> {
        let capsules = self.inner.control.list_capsules(id).await?;
        Ok(capsules.into_iter().max_by_key(|c| c.sequence))
    }

    /// The lease holder of `generation`: this worker, and the generation's cgroup leaf.
    pub(super) fn holder(
        &self,
        sandbox: &ProjectSandbox,
        profile: &AgentProfile,
        provider: Provider,
        generation: Generation,
    ) -> LeaseHolder {
        let leaf = self.inner.runtime.leaf_path(
            sandbox.tenant(),
            sandbox.project(),
            &profile.key,
            generation,
        );
        LeaseHolder {
            worker: self.inner.worker.clone(),
            process: format!("{provider} for {} generation {generation}", profile.key),
            cgroup: Some(leaf.display().to_string()),
        }
    }

    /// The project's sandbox here: opened when attached to this worker, made and attached
    /// when the project has none (`repository` and, if given, `worker` naming this one).
    pub(super) async fn sandbox_for(
        &self,
        profile: &AgentProfile,
        repository: Option<&SandboxRepository>,
        worker: Option<&WorkerId>,
    ) -> Result<Arc<ProjectSandbox>, AgentError> {
        let project = self
            .inner
            .control
            .get_project(&profile.tenant, &profile.project)
            .await?;
        if let Some(attached) = &project.sandbox {
            if attached.worker != self.inner.worker {
                return Err(AgentError::precondition(format!(
                    "project {}/{} has its sandbox on worker {}, not {} (INV-1)",
                    profile.tenant, profile.project, attached.worker, self.inner.worker
                )));
            }
            return self.sandbox_of(&profile.tenant, &profile.project).await;
        }
        let repo = self.new_sandbox_repository(profile, repository, worker)?;
        let (data_dir, tenant, proj, url, branch) = (
            self.inner.data_dir.clone(),
            profile.tenant.clone(),
            profile.project.clone(),
            repo.url.clone(),
            repo.branch.clone(),
        );
        let quota = self.inner.config.project_disk_bytes;
        let sandbox = blocking(move || {
            ProjectSandbox::open_or_create(
                &data_dir,
                &tenant,
                &proj,
                &url,
                branch.as_deref(),
                quota,
            )
        })
        .await?;
        let sandbox = Arc::new(sandbox);
        let attach = AttachSandbox {
            worker: self.inner.worker.clone(),
            runtime: RuntimeKind::Process,
            sandbox_ref: sandbox.sandbox_ref(),
        };
        self.inner
            .control
            .attach_sandbox(&profile.tenant, &profile.project, &attach)
            .await
            .map_err(|e| AgentError::from(e).context("attaching the sandbox"))?;
        self.registry().add_sandbox(
            (profile.tenant.clone(), profile.project.clone()),
            sandbox.clone(),
        );
        Ok(sandbox)
    }

    /// What a project without a sandbox is made from: the request's repository, on this
    /// worker if the request names one.
    fn new_sandbox_repository<'r>(
        &self,
        profile: &AgentProfile,
        repository: Option<&'r SandboxRepository>,
        worker: Option<&WorkerId>,
    ) -> Result<&'r SandboxRepository, AgentError> {
        if let Some(w) = worker {
            if *w != self.inner.worker {
                return Err(AgentError::invalid(
                    "worker",
                    format!("this is worker {}, not {w}", self.inner.worker),
                ));
            }
        }
        let Some(repo) = repository else {
            return Err(AgentError::invalid(
                "repository",
                format!(
                    "project {}/{} has no sandbox yet: give repository.url (and worker) to \
                     make one",
                    profile.tenant, profile.project
                ),
            ));
        };
        // The same rule as a task's clone: a local path would be another tenant's checkout
        // or a task's inbox on this host.
        if let Some(refused) = squadron_core::worker_policy::repository_refusal(
            &self.inner.config.repository_sources,
            "repository.url",
            &repo.url,
        ) {
            return Err(AgentError::invalid(&refused.field, refused.reason));
        }
        Ok(repo)
    }

    /// The project's sandbox as this worker holds it open (every project with an attempt).
    pub(crate) fn sandbox_of_project(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<Arc<ProjectSandbox>, AgentError> {
        self.registry()
            .sandbox(&(tenant.clone(), project.clone()))
            .ok_or_else(|| {
                AgentError::not_found(format!(
                    "project {tenant}/{project} has no sandbox open on worker {}",
                    self.inner.worker
                ))
            })
    }

    /// The project's sandbox on this worker, opened from its record.
    pub(crate) async fn sandbox_of(
        &self,
        tenant: &TenantId,
        project: &ProjectId,
    ) -> Result<Arc<ProjectSandbox>, AgentError> {
        let key = (tenant.clone(), project.clone());
        if let Some(s) = self.registry().sandbox(&key) {
            return Ok(s);
        }
        let (data_dir, tenant, project) =
            (self.inner.data_dir.clone(), tenant.clone(), project.clone());
        let quota = self.inner.config.project_disk_bytes;
        let sandbox = blocking(move || {
            let data_dir = fs::canonicalize(&data_dir)
                .map_err(|e| WorkerError::io("resolving data dir", &data_dir, e))?;
            // The record is on the sandbox's volume: mounted again if a reboot unmounted it.
            ProjectVolume::of(&data_dir, &tenant, &project).remount()?;
            let record_path = data_dir
                .join("projects")
                .join(tenant.as_str())
                .join(project.as_str())
                .join("sandbox.json");
            let bytes = fs::read(&record_path).map_err(|e| {
                WorkerError::Project(format!(
                    "project {tenant}/{project} is attached to this worker but {} cannot be \
                     read: {e}",
                    record_path.display()
                ))
            })?;
            let record: SandboxRecord = serde_json::from_slice(&bytes)
                .map_err(|e| WorkerError::Project(format!("{}: {e}", record_path.display())))?;
            ProjectSandbox::open_or_create(
                &data_dir,
                &tenant,
                &project,
                &record.repo_url,
                record.branch.as_deref(),
                quota,
            )
        })
        .await?;
        Ok(self.registry().sandbox_or(key, Arc::new(sandbox)))
    }

    /// Registers the profile's worktree with the Git broker and serves its socket.
    /// The generation's sockets: the Git broker and the MCP gateway, both in the profile's
    /// socket directory (`/mnt/broker`), the gateway admitting only `mcp_token`.
    pub(super) fn serve_sockets(
        &self,
        sandbox: &ProjectSandbox,
        profile: &AgentProfile,
        mcp_token: &SecretToken,
    ) -> Result<AgentSockets, AgentError> {
        let dir = self.broker_dir(profile.id);
        fs::create_dir_all(&dir)
            .map_err(|e| AgentError::from(WorkerError::io("creating", &dir, e)))?;
        let worktree = sandbox.profile_paths(&profile.key).worktree;
        let admin = sandbox
            .git_dir()
            .join("worktrees")
            .join(profile.key.as_str());
        self.inner
            .broker
            .register_profile(profile.id.get(), &worktree, &admin)
            .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))?;
        let socket = dir.join(BROKER_SOCKET_NAME);
        let broker = self
            .inner
            .broker
            .serve_profile(&socket, profile.id.get())
            .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))?;
        // The sockets are 0660: the provider, running as the sandbox user, connects through
        // its group.
        let group = self.inner.runtime.config().sandbox_user.map(|u| u.gid);
        if let Some(gid) = group {
            std::os::unix::fs::lchown(&socket, None, Some(gid)).map_err(|e| {
                AgentError::from(WorkerError::io("share the broker socket", &socket, e))
            })?;
        }
        let mcp = self
            .inner
            .mcp
            .serve(&dir.join(MCP_SOCKET_NAME), profile.id, mcp_token, group)?;
        Ok(AgentSockets {
            _broker: broker,
            _mcp: mcp,
            egress: None,
        })
    }

    /// `{data_dir}/agent-sockets/p{id}`: apart from the sandbox, shown at `/mnt/broker`.
    pub(super) fn broker_dir(&self, id: ProfileId) -> PathBuf {
        self.inner
            .data_dir
            .join("agent-sockets")
            .join(format!("p{id}"))
    }
}

pub(super) fn grant_token(profile: ProfileId, grant: &LeaseGrant) -> FencingToken {
    FencingToken {
        profile,
        lease: grant.lease,
        generation: grant.generation,
    }
}

pub(super) fn unexpected(what: &str, outcome: &Outcome) -> AgentError {
    AgentError::new(
        ErrorCode::Internal,
        format!("unexpected answer to {what}: {outcome:?}"),
    )
}

pub(super) fn check_prompt(prompt: &str) -> Result<(), AgentError> {
    if prompt.len() > PROMPT_BYTES_MAX {
        return Err(AgentError::invalid(
            "prompt",
            format!("{} bytes, at most {PROMPT_BYTES_MAX}", prompt.len()),
        ));
    }
    Ok(())
}

/// Runs blocking file-system, cgroup and git work off the async threads.
pub(super) async fn blocking<T, F>(f: F) -> Result<T, AgentError>
where
    F: FnOnce() -> Result<T, WorkerError> + Send + 'static,
    T: Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(AgentError::from),
        Err(e) => Err(AgentError::new(
            ErrorCode::Internal,
            format!("a blocking step failed: {e}"),
        )),
    }
}
