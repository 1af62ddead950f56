//! The worker's side of the identity runtime (ADR-0011): it runs agent profiles' provider
//! processes in their project's one sandbox, each under a runtime lease it holds, and does
//! what the operator facade asks — launch, graceful or crash takeover, stop, reap.
//!
//! Order of every step, and why:
//! - **Launch:** capability manifest checked against this host → sandbox opened (and
//!   attached to the project, INV-1) → lease acquired with the next generation's cgroup leaf
//!   as holder (INV-3, INV-5: the control plane admits at most `max_active`) → provider
//!   started in that leaf. A failed start is reaped and its lease released.
//! - **Renewal:** one `RenewLeases` command per tick for every lease this worker holds
//!   (one Raft entry per worker, not per agent). Each success moves the attempt's local
//!   deadline (send time + TTL − margin) into `/mnt/run/lease-deadline-ms`.
//! - **Self-fencing:** the provider runs under a watchdog (`/mnt/run/watchdog.sh`) that
//!   kills it once that deadline passes, so a provider whose worker died or lost the
//!   control plane stops writing on its own; a worker that is alive does the same from its
//!   side (terminate, reap), and the Git broker refuses the fenced generation anyway.
//! - **Graceful takeover (INV-8):** SIGTERM (the provider writes `/state/capsule.json`),
//!   grace, reap with `populated 0`, then one `GracefulTakeover` command (capsule commit and
//!   verify, fence, grant, with the reap evidence so the slot passes on), then the next
//!   provider starts with the capsule at `/mnt/run/capsule.json`.
//! - **Crash takeover (INV-9):** only for a generation that is not running and renewed
//!   here: wait for the lease to expire, reap its leaf for evidence (or find the recorded
//!   evidence), then one `CrashTakeover` command, then start. Without evidence (the holder
//!   was another worker) the control plane refuses, and the refusal says to decommission.
//! - **Mailbox:** each tick appends new mailbox messages (roster deltas included) to
//!   `/mnt/run/mailbox.jsonl` and acknowledges them under the lease. The run directory is
//!   read-only inside, so what a provider reads there was written by the worker.
//!
//! A restarted worker adopts the attempts of the active leases it holds (`adopt_all`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use squadron_client::types::{
    AckMessages, AcquireLease, AttachSandbox, CrashTakeover, GracefulTakeover, LeaseFence,
    RecordEvidence, RenewLeases, TakeoverEvidence,
};
use squadron_client::{
    AgentStatus, AgentView, BrokerEvidence, ClientError, Consistency, LaunchAgent,
    ReplacedGeneration, SandboxRepository, SquadronClient, StopAgent, TakeoverAgent, TakeoverKind,
    WorkerEvidence,
};
use squadron_core::capsule::{CapsuleDraft, CapsulePayload, ContinuityCapsule};
use squadron_core::command::NextHolder;
use squadron_core::error_code::ErrorCode;
use squadron_core::ids::{Generation, LeaseId, ProfileId, ProjectId, TenantId, WorkerId};
use squadron_core::lease::{FencingToken, LeaseHolder, LeaseState, RuntimeLease};
use squadron_core::limits::CAPSULE_SCHEMA_VERSION_CURRENT;
use squadron_core::mailbox::{MessageKind, MessagePayload};
use squadron_core::manifest::{NetworkMode, RuntimeKind};
use squadron_core::profile::AgentProfile;
use squadron_core::provider::Provider;
use squadron_core::response::LeaseGrant;
use squadron_core::Outcome;
use squadron_isolation::{BrokerServer, GitBroker};

use crate::agent::attempt::{AgentAttempt, AgentLaunch, AGENT_RUN_MOUNT, BROKER_MOUNT};
use crate::agent::config::{AgentConfig, ProviderLauncher, PROVIDER_SCRIPT_BYTES_MAX};
use crate::agent::error::AgentError;
use crate::agent::fence::ControlFence;
use crate::agent::project_sandbox::{ProjectSandbox, SandboxRecord};
use crate::agent::runtime::AgentRuntime;
use crate::runtime::{RunStatus, SandboxLimits};
use crate::support::write_atomic;

/// How often running attempts are checked for exit and mailboxes for news.
pub(crate) const SUPERVISOR_TICK_MS: u64 = 250;
/// Longest a crash takeover waits for the old lease to expire.
pub(crate) const WAIT_FOR_EXPIRY_MS_MAX: u64 = 120_000;
/// Largest `/state/capsule.json` read at a graceful takeover.
pub(crate) const CAPSULE_FILE_BYTES_MAX: u64 = 256 * 1024;
/// Largest prompt handed to a provider.
pub(crate) const PROMPT_BYTES_MAX: usize = 1 << 20;
/// Most bytes of mailbox deliveries kept in one generation's `mailbox.jsonl`; past it the
/// file is rewritten with the newest half.
pub(crate) const MAILBOX_FILE_BYTES_MAX: u64 = 8 << 20;
/// Most agents one worker supervises.
pub(crate) const AGENTS_MAX: usize = 1_024;
/// The broker socket's name in `/mnt/broker`.
pub(crate) const BROKER_SOCKET_NAME: &str = "git.sock";
/// Where `adopt_all` and the evidence look for projects' launch files with credentials.
const CREDENTIAL_FILE_MARKERS: [&str; 4] = ["credential", ".token", "secret", ".pem"];

/// The watchdog every provider runs under: it forwards SIGTERM and kills the provider once
/// the worker's deadline for the lease has passed (self-fencing). Exit status is the
/// provider's.
const WATCHDOG_SCRIPT: &str = r#"#!/bin/sh
# Squadron self-fencing watchdog: the provider may run only while the lease is renewed.
# An asynchronous command gets /dev/null as stdin unless redirected: pass ours (the prompt).
exec 3<&0
"$@" <&3 3<&- &
child=$!
exec 3<&-
trap 'kill -TERM "$child" 2>/dev/null' TERM INT
while kill -0 "$child" 2>/dev/null; do
  deadline=$(cat /mnt/run/lease-deadline-ms 2>/dev/null || echo 0)
  now=$(date +%s%3N)
  # Fails closed: a deadline or clock that is not a number stops the provider too.
  if ! [ "$now" -le "$deadline" ] 2>/dev/null; then
    echo "squadron: the lease was not renewed before $deadline; stopping the provider" >&2
    kill -KILL "$child" 2>/dev/null
    break
  fi
  sleep 0.2
done
wait "$child"
"#;

/// Cheap to clone; clones share the supervisor.
#[derive(Debug, Clone)]
pub(crate) struct AgentSupervisor {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    worker: WorkerId,
    data_dir: PathBuf,
    config: AgentConfig,
    runtime: AgentRuntime,
    control: SquadronClient,
    broker: GitBroker,
    /// Operator operations run one at a time: each reads the profile, decides and commits,
    /// and two interleaved on one profile would decide on stale reads.
    ops: tokio::sync::Mutex<()>,
    registry: Mutex<Registry>,
}

#[derive(Debug, Default)]
struct Registry {
    sandboxes: BTreeMap<(TenantId, ProjectId), Arc<ProjectSandbox>>,
    agents: BTreeMap<ProfileId, AgentEntry>,
    projects: BTreeMap<(TenantId, ProjectId), ProjectCounters>,
    /// Leases of attempts that never started or ended, whose release did not get through.
    pending_releases: Vec<FencingToken>,
}

#[derive(Debug)]
struct AgentEntry {
    view: AgentView,
    attempt: AgentAttempt,
    sandbox: Arc<ProjectSandbox>,
    /// Dropped (socket closed) when the attempt stops.
    broker_server: Option<BrokerServer>,
    /// Local clock: the provider must be gone by then unless a renewal moves it.
    deadline_ms: u64,
    /// Evidence of this attempt's reap not yet accepted by the control plane.
    pending_evidence: Option<ReplacedGeneration>,
}

/// A lease just granted and what its provider starts with.
struct GrantedAttempt<'a> {
    profile: &'a AgentProfile,
    sandbox: Arc<ProjectSandbox>,
    token: FencingToken,
    provider: Provider,
    /// The newest capsule, shown at `/mnt/run/capsule.json`.
    capsule: Option<ContinuityCapsule>,
    prompt: Option<String>,
    /// When the grant was requested (local clock): the first renewal deadline counts from it.
    sent_at: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct ProjectCounters {
    peak_processes: u32,
    messages_delivered: u64,
    roster_deltas_delivered: u64,
    self_fenced: u64,
}

impl AgentSupervisor {
    /// A supervisor for `worker`, its broker state under `data_dir/agent-broker`.
    pub(crate) fn new(
        worker: WorkerId,
        data_dir: PathBuf,
        config: AgentConfig,
        runtime: AgentRuntime,
        control: SquadronClient,
    ) -> Result<AgentSupervisor, crate::WorkerError> {
        config.validate()?;
        let fence = Arc::new(ControlFence::new(control.clone()));
        let broker = GitBroker::open(&data_dir.join("agent-broker"), fence)
            .map_err(|e| crate::WorkerError::runtime("git broker", e.to_string()))?;
        Ok(AgentSupervisor {
            inner: Arc::new(Inner {
                worker,
                data_dir,
                config,
                runtime,
                control,
                broker,
                ops: tokio::sync::Mutex::new(()),
                registry: Mutex::new(Registry::default()),
            }),
        })
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.inner
            .registry
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the renewal loop and the tick loop (exits, mailboxes, evidence, releases) on
    /// the current runtime. Renewals get their own task so a slow reap or mailbox read never
    /// delays them past a deadline.
    pub(crate) fn spawn_loops(&self) -> Vec<tokio::task::JoinHandle<()>> {
        let renewer = self.clone();
        let renewals = tokio::spawn(async move {
            let every = Duration::from_millis(renewer.inner.config.renew_interval_ms());
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                renewer.renew_all().await;
            }
        });
        let me = self.clone();
        let ticks = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(SUPERVISOR_TICK_MS));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                me.check_exits().await;
                me.deliver_mailboxes().await;
                me.retry_pending_evidence().await;
                me.retry_pending_releases().await;
            }
        });
        vec![renewals, ticks]
    }

    // --- operator operations --------------------------------------------------------------

    pub(crate) async fn launch(
        &self,
        id: ProfileId,
        req: LaunchAgent,
    ) -> Result<AgentView, AgentError> {
        let _op = self.inner.ops.lock().await;
        self.launch_locked(id, req).await
    }

    async fn launch_locked(
        &self,
        id: ProfileId,
        req: LaunchAgent,
    ) -> Result<AgentView, AgentError> {
        if let Some(prompt) = &req.prompt {
            check_prompt(prompt)?;
        }
        let profile = self.profile(id).await?;
        if let Some(entry) = self.registry().agents.get(&id) {
            if entry.view.status == AgentStatus::Running {
                return Err(AgentError::precondition(format!(
                    "profile {id} already runs generation {} here; stop it or take it over",
                    entry.view.generation
                )));
            }
        }
        if let Some(live) = profile.live_lease {
            return Err(AgentError::precondition(format!(
                "profile {id} holds lease {live} (generation {}); take it over instead of \
                 launching",
                profile.generation
            )));
        }
        let provider = self.choose_provider(&profile, req.provider, None)?;
        self.check_capabilities(&profile)?;
        let running = self
            .registry()
            .agents
            .values()
            .filter(|e| e.view.status == AgentStatus::Running)
            .count();
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
        let next = profile.generation.successor();
        let holder = self.holder(&sandbox, &profile, provider, next);
        let sent_at = squadron_client::now_ms();
        let outcome = self
            .inner
            .control
            .acquire_lease(
                id,
                &AcquireLease {
                    expected_generation: profile.generation,
                    provider,
                    holder,
                    ttl_ms: self.inner.config.lease_ttl_ms,
                },
                None,
            )
            .await
            .map_err(|e| AgentError::from(e).context("acquiring the lease"))?;
        let Outcome::LeaseGranted(grant) = outcome else {
            return Err(unexpected("acquire", &outcome));
        };
        let token = grant_token(id, &grant);
        self.start_or_release(GrantedAttempt {
            profile: &profile,
            sandbox,
            token,
            provider,
            capsule,
            prompt: req.prompt,
            sent_at,
        })
        .await
    }

    pub(crate) async fn takeover(
        &self,
        id: ProfileId,
        req: TakeoverAgent,
    ) -> Result<AgentView, AgentError> {
        let _op = self.inner.ops.lock().await;
        if let Some(prompt) = &req.prompt {
            check_prompt(prompt)?;
        }
        if let Some(wait) = req.wait_for_expiry_ms {
            if wait > WAIT_FOR_EXPIRY_MS_MAX {
                return Err(AgentError::invalid(
                    "wait_for_expiry_ms",
                    format!("must be at most {WAIT_FOR_EXPIRY_MS_MAX}, got {wait}"),
                ));
            }
        }
        match req.kind {
            TakeoverKind::Graceful => self.graceful(id, req).await,
            TakeoverKind::Crash => self.crash(id, req).await,
        }
    }

    async fn graceful(&self, id: ProfileId, req: TakeoverAgent) -> Result<AgentView, AgentError> {
        let profile = self.profile(id).await?;
        let (token, attempt, sandbox, old_provider) = {
            let reg = self.registry();
            let entry = reg.agents.get(&id).filter(|e| {
                e.view.status == AgentStatus::Running && e.view.generation == profile.generation
            });
            let Some(entry) = entry else {
                return Err(AgentError::precondition(format!(
                    "profile {id} has no running provider here at generation {}; a graceful \
                     takeover needs one (use kind crash for a dead one)",
                    profile.generation
                )));
            };
            (
                entry.view.token(),
                entry.attempt.clone(),
                entry.sandbox.clone(),
                entry.view.provider,
            )
        };
        let provider = self.choose_provider(&profile, req.provider, Some(old_provider))?;
        self.check_capabilities(&profile)?;
        // The old provider stops first (its TERM trap writes the capsule): the capsule must
        // describe a generation that no longer changes anything.
        let grace = Duration::from_millis(self.inner.config.stop_grace_ms);
        self.set_status(id, AgentStatus::Stopping, None);
        let evidence = match self.stop_attempt(&attempt, token.lease, grace).await {
            Ok(ev) => ev,
            Err(e) => {
                // Not proved gone: stop renewing, so the lease expires and nothing but
                // evidence can move past it.
                self.set_status(id, AgentStatus::SelfFenced, None);
                return Err(e.context("stopping the old provider"));
            }
        };
        self.set_status(id, AgentStatus::Stopped, None);
        let payload = read_capsule_file(&sandbox, &profile, token.generation);
        let head = profile.capsule_head;
        let draft = CapsuleDraft {
            sequence: head.map_or(1, |h| h.sequence + 1),
            previous: head.map(|h| h.digest),
            schema_version: CAPSULE_SCHEMA_VERSION_CURRENT,
            payload,
            expected_digest: None,
        };
        let next = token.generation.successor();
        let holder = self.holder(&sandbox, &profile, provider, next);
        let sent_at = squadron_client::now_ms();
        let outcome = self
            .inner
            .control
            .takeover_graceful(
                id,
                &GracefulTakeover {
                    lease: token.lease,
                    generation: token.generation,
                    capsule: draft,
                    next: NextHolder {
                        provider,
                        holder,
                        ttl_ms: self.inner.config.lease_ttl_ms,
                    },
                    old_reap_evidence: Some(takeover_evidence(&evidence)),
                },
                None,
            )
            .await;
        let outcome = match outcome {
            Ok(o) => o,
            Err(e) => {
                // The old provider is gone; keep its evidence so the slot is freed once the
                // lease can take it (release below, or expiry).
                self.queue_evidence(id, evidence.clone());
                self.release_or_queue(token).await;
                return Err(AgentError::from(e).context("graceful takeover"));
            }
        };
        let Outcome::TookOver {
            capsule: committed,
            grant,
            ..
        } = outcome
        else {
            return Err(unexpected("takeover", &outcome));
        };
        let token = grant_token(id, &grant);
        let capsule = match self.latest_capsule(id).await {
            Ok(c) => c,
            Err(e) => {
                self.release_or_queue(token).await;
                return Err(e.context("reading the committed capsule"));
            }
        };
        if let (Some((sequence, digest)), Some(c)) = (committed, &capsule) {
            if c.sequence != sequence || c.digest != digest || !c.verify() {
                self.release_or_queue(token).await;
                return Err(AgentError::new(
                    ErrorCode::Internal,
                    format!("capsule {sequence} of profile {id} does not verify after commit"),
                ));
            }
        }
        let mut view = self
            .start_or_release(GrantedAttempt {
                profile: &profile,
                sandbox,
                token,
                provider,
                capsule,
                prompt: req.prompt,
                sent_at,
            })
            .await?;
        view.replaced = Some(evidence);
        Ok(view)
    }

    async fn crash(&self, id: ProfileId, req: TakeoverAgent) -> Result<AgentView, AgentError> {
        let profile = self.profile(id).await?;
        if let Some(entry) = self.registry().agents.get(&id) {
            if entry.view.status == AgentStatus::Running {
                return Err(AgentError::precondition(format!(
                    "generation {} of profile {id} is running and renewed here; a crash \
                     takeover is for a dead provider (use kind graceful, or stop it)",
                    entry.view.generation
                )));
            }
        }
        if profile.live_lease.is_none() && profile.fenced_unreaped.is_empty() {
            // The dead generation was already proved gone (evidence recorded, e.g. by this
            // worker's adoption after a restart): nothing is left to take over, so the next
            // generation is a plain launch.
            return self
                .launch_locked(
                    id,
                    LaunchAgent {
                        provider: req.provider,
                        prompt: req.prompt,
                        ..LaunchAgent::default()
                    },
                )
                .await;
        }
        let old = self.takeover_target(&profile).await?;
        let old_provider = old.provider;
        let provider = self.choose_provider(&profile, req.provider, Some(old_provider))?;
        self.check_capabilities(&profile)?;
        // INV-9: expiry first. Nothing of the old generation is touched before it.
        let wait = req
            .wait_for_expiry_ms
            .unwrap_or(self.inner.config.lease_ttl_ms + 5_000);
        self.wait_for_expiry(&old, wait).await?;
        let sandbox = self.sandbox_of(&profile).await?;
        let evidence = if old.holder.worker == self.inner.worker {
            Some(
                self.reap_generation(&sandbox, &profile, old.generation)
                    .await?,
            )
        } else {
            None
        };
        let capsule = self.latest_capsule(id).await?;
        let next = old.generation.successor();
        let holder = self.holder(&sandbox, &profile, provider, next);
        let sent_at = squadron_client::now_ms();
        let outcome = self
            .inner
            .control
            .takeover_crash(
                id,
                &CrashTakeover {
                    lease: old.id,
                    generation: old.generation,
                    next: NextHolder {
                        provider,
                        holder,
                        ttl_ms: self.inner.config.lease_ttl_ms,
                    },
                    reap_evidence: evidence.as_ref().map(takeover_evidence),
                },
                None,
            )
            .await
            .map_err(|e| {
                let e = AgentError::from(e).context("crash takeover");
                if old.holder.worker != self.inner.worker {
                    let worker = &old.holder.worker;
                    AgentError {
                        message: format!(
                            "{}; generation {} ran on worker {worker}, whose cgroup only it \
                             can prove empty: restart it, or run `squadron worker \
                             decommission {worker}` if it is gone for good",
                            e.message, old.generation
                        ),
                        ..e
                    }
                } else {
                    e
                }
            })?;
        let Outcome::TookOver { grant, .. } = outcome else {
            return Err(unexpected("takeover", &outcome));
        };
        let token = grant_token(id, &grant);
        let mut view = self
            .start_or_release(GrantedAttempt {
                profile: &profile,
                sandbox,
                token,
                provider,
                capsule,
                prompt: req.prompt,
                sent_at,
            })
            .await?;
        // Without evidence of ours the control plane accepted evidence recorded earlier.
        view.replaced = evidence;
        Ok(view)
    }

    /// Stops the profile's provider, reaps it and ends its lease (released if still the
    /// profile's writer, else ended by the evidence).
    pub(crate) async fn stop(
        &self,
        id: ProfileId,
        req: StopAgent,
    ) -> Result<AgentView, AgentError> {
        let _op = self.inner.ops.lock().await;
        let grace = match req.grace_ms {
            Some(ms) if ms > crate::agent::config::AGENT_STOP_GRACE_MS_MAX => {
                return Err(AgentError::invalid(
                    "grace_ms",
                    format!(
                        "must be at most {}, got {ms}",
                        crate::agent::config::AGENT_STOP_GRACE_MS_MAX
                    ),
                ))
            }
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_millis(self.inner.config.stop_grace_ms),
        };
        let (attempt, token, status) = {
            let reg = self.registry();
            let Some(entry) = reg.agents.get(&id) else {
                return Err(AgentError::not_found(format!(
                    "profile {id} has no provider attempt on worker {}",
                    self.inner.worker
                )));
            };
            (entry.attempt.clone(), entry.view.token(), entry.view.status)
        };
        if status == AgentStatus::Running {
            self.set_status(id, AgentStatus::Stopping, None);
        }
        let evidence = match self.stop_attempt(&attempt, token.lease, grace).await {
            Ok(ev) => ev,
            Err(e) => {
                self.set_status(id, AgentStatus::SelfFenced, None);
                return Err(e.context("stopping the provider"));
            }
        };
        if status == AgentStatus::Running {
            self.set_status(id, AgentStatus::Stopped, None);
        }
        self.end_lease(token, evidence).await?;
        self.view(id)
    }

    /// Reaps the profile's current generation if it runs here and is not renewed (crashed,
    /// self-fenced, adopted dead), and records the evidence: a fenced or expired lease
    /// frees its slot.
    pub(crate) async fn reap(&self, id: ProfileId) -> Result<ReplacedGeneration, AgentError> {
        let _op = self.inner.ops.lock().await;
        let profile = self.profile(id).await?;
        if let Some(entry) = self.registry().agents.get(&id) {
            if entry.view.status == AgentStatus::Running {
                return Err(AgentError::precondition(format!(
                    "generation {} of profile {id} is running; stop it instead",
                    entry.view.generation
                )));
            }
        }
        let old = self.takeover_target(&profile).await?;
        if old.holder.worker != self.inner.worker {
            return Err(AgentError::precondition(format!(
                "generation {} of profile {id} ran on worker {}; only that worker can reap it",
                old.generation, old.holder.worker
            )));
        }
        // INV-9: nothing of a generation whose lease the leader still holds active is
        // killed; its expiry is confirmed by the leader's sweep fencing it.
        if old.state == LeaseState::Active {
            return Err(AgentError::precondition(format!(
                "lease {} of generation {} is active (expires at {} ms by the leader's clock); \
                 stop the provider, or reap once the lease has expired and been fenced",
                old.id, old.generation, old.expires_at_ms
            )));
        }
        let sandbox = self.sandbox_of(&profile).await?;
        let evidence = self
            .reap_generation(&sandbox, &profile, old.generation)
            .await?;
        let req = record_evidence(&old.token(), &evidence);
        self.inner
            .control
            .record_evidence(old.id, &req, None)
            .await
            .map_err(|e| AgentError::from(e).context("recording the reap evidence"))?;
        if let Some(entry) = self.registry().agents.get_mut(&id) {
            entry.pending_evidence = None;
            entry.broker_server = None;
        }
        self.inner.broker.unregister_profile(id.get());
        Ok(evidence)
    }

    /// The profile's attempt as this worker sees it.
    pub(crate) fn view(&self, id: ProfileId) -> Result<AgentView, AgentError> {
        self.registry()
            .agents
            .get(&id)
            .map(|e| e.view.clone())
            .ok_or_else(|| {
                AgentError::not_found(format!(
                    "profile {id} has no provider attempt on worker {}",
                    self.inner.worker
                ))
            })
    }

    /// Every attempt this worker knows.
    pub(crate) fn views(&self) -> Vec<AgentView> {
        self.registry()
            .agents
            .values()
            .map(|e| e.view.clone())
            .collect()
    }

    /// The worker's half of the project's release evidence.
    pub(crate) fn evidence(&self, tenant: &TenantId, project: &ProjectId) -> WorkerEvidence {
        let key = (tenant.clone(), project.clone());
        self.sample_processes(tenant, project);
        let counters = self
            .registry()
            .projects
            .get(&key)
            .copied()
            .unwrap_or_default();
        let root = self
            .inner
            .data_dir
            .join("projects")
            .join(tenant.as_str())
            .join(project.as_str());
        let stats = self.inner.broker.stats();
        let cgroup_dir = self.inner.runtime.project_cgroup_path(tenant, project);
        WorkerEvidence {
            worker: self.inner.worker.to_string(),
            sandboxes: u32::from(root.join("sandbox.json").is_file()),
            peak_concurrent_processes: counters.peak_processes,
            processes_now: populated_leaves(&cgroup_dir),
            mailbox_messages_delivered: counters.messages_delivered,
            roster_deltas_delivered: counters.roster_deltas_delivered,
            self_fenced: counters.self_fenced,
            broker: BrokerEvidence {
                commits_accepted: stats.accepted,
                accepted_from_non_current: stats.accepted_from_non_current,
                refused_stale_generation: stats.refused_stale,
                refused_other: stats.refused_head_moved
                    + stats.refused_invalid
                    + stats.refused_conflict
                    + stats.refused_forbidden
                    + stats.refused_other,
            },
            cgroup_leaves_left: list_dir_names(&cgroup_dir),
            credential_files_left: credential_files(&root.join("run")),
        }
    }

    /// After a restart: the attempts of every active lease this worker holds are adopted —
    /// renewed again when their leaf is populated, reported crashed when not.
    pub(crate) async fn adopt_all(&self) -> Result<usize, AgentError> {
        let _op = self.inner.ops.lock().await;
        let projects = self
            .inner
            .control
            .list_projects(Consistency::Linearizable)
            .await?;
        let mut adopted = 0;
        for summary in projects {
            let project = self
                .inner
                .control
                .get_project(&summary.tenant, &summary.project, Consistency::Linearizable)
                .await?;
            let ours = project
                .sandbox
                .as_ref()
                .is_some_and(|s| s.worker == self.inner.worker);
            if !ours {
                continue;
            }
            let leases = self
                .inner
                .control
                .list_leases(&summary.tenant, &summary.project, Consistency::Linearizable)
                .await?;
            for lease in leases
                .into_iter()
                .filter(|l| l.state.holds_slot() && l.holder.worker == self.inner.worker)
            {
                if self.registry().agents.contains_key(&lease.profile) {
                    continue;
                }
                let profile = self.profile(lease.profile).await?;
                let sandbox = self.sandbox_of(&profile).await?;
                let (rt, sb, key, generation) = (
                    self.inner.runtime.clone(),
                    sandbox.clone(),
                    profile.key.clone(),
                    lease.generation,
                );
                let Some(attempt) =
                    blocking(move || AgentAttempt::adopt(&rt, &sb, &key, generation)).await?
                else {
                    tracing::warn!(profile = %lease.profile, generation = %lease.generation, "active lease without an attempt here; it will expire");
                    continue;
                };
                let populated = matches!(attempt.status()?, RunStatus::Running);
                let running = populated;
                let broker_server = if running {
                    Some(self.serve_broker(&sandbox, &profile)?)
                } else {
                    None
                };
                let view = AgentView {
                    profile: profile.id,
                    key: profile.key.clone(),
                    tenant: profile.tenant.clone(),
                    project: profile.project.clone(),
                    worker: self.inner.worker.clone(),
                    provider: lease.provider,
                    lease: lease.id,
                    generation: lease.generation,
                    status: if running {
                        AgentStatus::Running
                    } else {
                        AgentStatus::Crashed
                    },
                    cgroup: attempt.cgroup_path().display().to_string(),
                    exit_code: None,
                    capsule_sequence: profile.capsule_head.map(|h| h.sequence),
                    mailbox_delivered_through: 0,
                    replaced: None,
                };
                tracing::info!(profile = %profile.id, generation = %lease.generation, running, state = lease.state.name(), "agent attempt adopted");
                // A fenced lease's process runs without authority: adopted to be stopped.
                let fenced = lease.state != LeaseState::Active;
                let token = lease.token();
                self.registry().agents.insert(
                    profile.id,
                    AgentEntry {
                        view,
                        attempt,
                        sandbox,
                        broker_server,
                        // The old deadline file stands; the next renewal moves it.
                        deadline_ms: lease.expires_at_ms,
                        pending_evidence: None,
                    },
                );
                if fenced {
                    if populated {
                        self.self_fence(token, "adopted with a fenced lease").await;
                    } else if let Ok(ev) = self
                        .reap_generation(
                            &self.sandbox_of(&profile).await?,
                            &profile,
                            lease.generation,
                        )
                        .await
                    {
                        self.queue_evidence(profile.id, ev);
                    }
                }
                adopted += 1;
            }
        }
        Ok(adopted)
    }

    // --- steps -----------------------------------------------------------------------------

    async fn profile(&self, id: ProfileId) -> Result<AgentProfile, AgentError> {
        self.inner
            .control
            .get_profile(id, Consistency::Linearizable)
            .await
            .map_err(AgentError::from)
    }

    async fn latest_capsule(&self, id: ProfileId) -> Result<Option<ContinuityCapsule>, AgentError> {
        let capsules = self
            .inner
            .control
            .list_capsules(id, Consistency::Linearizable)
            .await?;
        Ok(capsules.into_iter().max_by_key(|c| c.sequence))
    }

    /// The requested provider, else the first of the profile's (in its order of preference)
    /// this worker can launch, preferring one other than `current` (a takeover swaps).
    fn choose_provider(
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
    fn check_capabilities(&self, profile: &AgentProfile) -> Result<(), AgentError> {
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
            .filter(|s| !self.inner.config.mcp_servers.contains(*s))
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

    fn holder(
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
    async fn sandbox_for(
        &self,
        profile: &AgentProfile,
        repository: Option<&SandboxRepository>,
        worker: Option<&WorkerId>,
    ) -> Result<Arc<ProjectSandbox>, AgentError> {
        let project = self
            .inner
            .control
            .get_project(&profile.tenant, &profile.project, Consistency::Linearizable)
            .await?;
        if let Some(attached) = &project.sandbox {
            if attached.worker != self.inner.worker {
                return Err(AgentError::precondition(format!(
                    "project {}/{} has its sandbox on worker {}, not {} (INV-1)",
                    profile.tenant, profile.project, attached.worker, self.inner.worker
                )));
            }
            return self.sandbox_of(profile).await;
        }
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
        if repo.url.is_empty() {
            return Err(AgentError::invalid("repository.url", "must not be empty"));
        }
        let (data_dir, tenant, proj, url, branch) = (
            self.inner.data_dir.clone(),
            profile.tenant.clone(),
            profile.project.clone(),
            repo.url.clone(),
            repo.branch.clone(),
        );
        let sandbox = blocking(move || {
            ProjectSandbox::open_or_create(&data_dir, &tenant, &proj, &url, branch.as_deref())
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
            .attach_sandbox(&profile.tenant, &profile.project, &attach, None)
            .await
            .map_err(|e| AgentError::from(e).context("attaching the sandbox"))?;
        self.registry().sandboxes.insert(
            (profile.tenant.clone(), profile.project.clone()),
            sandbox.clone(),
        );
        Ok(sandbox)
    }

    /// The project's sandbox on this worker, opened from its record.
    async fn sandbox_of(&self, profile: &AgentProfile) -> Result<Arc<ProjectSandbox>, AgentError> {
        let key = (profile.tenant.clone(), profile.project.clone());
        if let Some(s) = self.registry().sandboxes.get(&key) {
            return Ok(s.clone());
        }
        let (data_dir, tenant, project) = (
            self.inner.data_dir.clone(),
            profile.tenant.clone(),
            profile.project.clone(),
        );
        let sandbox = blocking(move || {
            let record_path = data_dir
                .join("projects")
                .join(tenant.as_str())
                .join(project.as_str())
                .join("sandbox.json");
            let bytes = fs::read(&record_path).map_err(|e| {
                crate::WorkerError::Project(format!(
                    "project {tenant}/{project} is attached to this worker but {} cannot be \
                     read: {e}",
                    record_path.display()
                ))
            })?;
            let record: SandboxRecord = serde_json::from_slice(&bytes).map_err(|e| {
                crate::WorkerError::Project(format!("{}: {e}", record_path.display()))
            })?;
            ProjectSandbox::open_or_create(
                &data_dir,
                &tenant,
                &project,
                &record.repo_url,
                record.branch.as_deref(),
            )
        })
        .await?;
        let sandbox = Arc::new(sandbox);
        Ok(self
            .registry()
            .sandboxes
            .entry(key)
            .or_insert(sandbox)
            .clone())
    }

    fn serve_broker(
        &self,
        sandbox: &ProjectSandbox,
        profile: &AgentProfile,
    ) -> Result<BrokerServer, AgentError> {
        let dir = self.broker_dir(profile.id);
        fs::create_dir_all(&dir)
            .map_err(|e| AgentError::from(crate::WorkerError::io("creating", &dir, e)))?;
        let worktree = sandbox.profile_paths(&profile.key).worktree;
        self.inner
            .broker
            .register_profile(profile.id.get(), &worktree)
            .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))?;
        self.inner
            .broker
            .serve_profile(&dir.join(BROKER_SOCKET_NAME), profile.id.get())
            .map_err(|e| AgentError::new(ErrorCode::Internal, e.to_string()))
    }

    /// `{data_dir}/agent-sockets/p{id}`: apart from the sandbox, shown at `/mnt/broker`.
    pub(crate) fn broker_dir(&self, id: ProfileId) -> PathBuf {
        self.inner
            .data_dir
            .join("agent-sockets")
            .join(format!("p{id}"))
    }

    /// Starts the attempt of a granted lease; when the start fails, whatever started is
    /// reaped and the lease released, so a failed launch holds no slot.
    async fn start_or_release(&self, g: GrantedAttempt<'_>) -> Result<AgentView, AgentError> {
        let (profile, sandbox, token) = (g.profile, g.sandbox.clone(), g.token);
        match self.start(g).await {
            Ok(view) => Ok(view),
            Err(e) => {
                tracing::warn!(profile = %profile.id, generation = %token.generation, error = %e, "start failed; reaping and releasing");
                let (rt, sb, key, generation) = (
                    self.inner.runtime.clone(),
                    sandbox,
                    profile.key.clone(),
                    token.generation,
                );
                let adopted =
                    blocking(move || AgentAttempt::adopt(&rt, &sb, &key, generation)).await;
                if let Ok(Some(attempt)) = adopted {
                    if let Ok(ev) = self
                        .stop_attempt(&attempt, token.lease, Duration::ZERO)
                        .await
                    {
                        let _ = self.end_lease(token, ev).await;
                        return Err(e.context("starting the provider"));
                    }
                }
                self.release_or_queue(token).await;
                Err(e.context("starting the provider"))
            }
        }
    }

    async fn start(&self, g: GrantedAttempt<'_>) -> Result<AgentView, AgentError> {
        let GrantedAttempt {
            profile,
            sandbox,
            token,
            provider,
            capsule,
            prompt,
            sent_at,
        } = g;
        let config = &self.inner.config;
        let deadline = sent_at + config.lease_ttl_ms - config.self_fence_margin_ms;
        let roster = self
            .inner
            .control
            .roster(&profile.tenant, &profile.project, Consistency::Linearizable)
            .await?;
        let mut run_files = BTreeMap::new();
        run_files.insert(
            "watchdog.sh".to_owned(),
            WATCHDOG_SCRIPT.as_bytes().to_vec(),
        );
        run_files.insert(
            "lease-deadline-ms".to_owned(),
            deadline.to_string().into_bytes(),
        );
        run_files.insert("roster.json".to_owned(), to_json(&roster)?);
        run_files.insert(
            "identity.json".to_owned(),
            to_json(&serde_json::json!({
                "profile": profile.id,
                "key": profile.key,
                "subject": profile.subject,
                "lease": token.lease,
                "generation": token.generation,
                "provider": provider,
            }))?,
        );
        if let Some(c) = &capsule {
            run_files.insert("capsule.json".to_owned(), to_json(c)?);
        }
        let mut argv = vec![
            "/bin/sh".to_owned(),
            format!("{AGENT_RUN_MOUNT}/watchdog.sh"),
        ];
        match config.providers.get(&provider) {
            Some(ProviderLauncher::Command(command)) => argv.extend(command.iter().cloned()),
            Some(ProviderLauncher::Script(path)) => {
                let script = read_bounded(path, PROVIDER_SCRIPT_BYTES_MAX)?;
                run_files.insert("provider.sh".to_owned(), script);
                argv.push("/bin/sh".to_owned());
                argv.push(format!("{AGENT_RUN_MOUNT}/provider.sh"));
            }
            None => {
                return Err(AgentError::precondition(format!(
                    "worker {} has no launcher for provider {provider}",
                    self.inner.worker
                )))
            }
        }
        let stdin = prompt.map(|p| {
            run_files.insert("prompt".to_owned(), p.into_bytes());
            "prompt".to_owned()
        });
        let env = BTreeMap::from([
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("HOME".to_owned(), "/state".to_owned()),
            ("SQUADRON_PROFILE_ID".to_owned(), profile.id.to_string()),
            ("SQUADRON_LEASE_ID".to_owned(), token.lease.to_string()),
            ("SQUADRON_PROVIDER".to_owned(), provider.to_string()),
            (
                "SQUADRON_BROKER_SOCKET".to_owned(),
                format!("{BROKER_MOUNT}/{BROKER_SOCKET_NAME}"),
            ),
            (
                "SQUADRON_MAILBOX".to_owned(),
                format!("{AGENT_RUN_MOUNT}/mailbox.jsonl"),
            ),
        ]);
        let broker_server = self.serve_broker(&sandbox, profile)?;
        let launch = AgentLaunch {
            argv,
            env,
            run_files,
            stdin,
            network: NetworkMode::Outbound,
            limits: SandboxLimits::default(),
            broker_dir: Some(self.broker_dir(profile.id)),
        };
        let (rt, sb, key, generation) = (
            self.inner.runtime.clone(),
            sandbox.clone(),
            profile.key.clone(),
            token.generation,
        );
        let attempt =
            blocking(move || AgentAttempt::start(&rt, &sb, &key, generation, &launch)).await?;
        let view = AgentView {
            profile: profile.id,
            key: profile.key.clone(),
            tenant: profile.tenant.clone(),
            project: profile.project.clone(),
            worker: self.inner.worker.clone(),
            provider,
            lease: token.lease,
            generation: token.generation,
            status: AgentStatus::Running,
            cgroup: attempt.cgroup_path().display().to_string(),
            exit_code: None,
            capsule_sequence: capsule.as_ref().map(|c| c.sequence),
            mailbox_delivered_through: 0,
            replaced: None,
        };
        tracing::info!(profile = %profile.id, %provider, generation = %token.generation, lease = %token.lease, "agent launched");
        self.registry().agents.insert(
            profile.id,
            AgentEntry {
                view: view.clone(),
                attempt,
                sandbox,
                broker_server: Some(broker_server),
                deadline_ms: deadline,
                pending_evidence: None,
            },
        );
        self.sample_processes(&profile.tenant, &profile.project);
        Ok(view)
    }

    /// SIGTERM, `grace`, SIGKILL, then freeze → kill → `populated 0`. Only evidence that
    /// proves the leaf empty is returned.
    async fn stop_attempt(
        &self,
        attempt: &AgentAttempt,
        lease: LeaseId,
        grace: Duration,
    ) -> Result<ReplacedGeneration, AgentError> {
        let a = attempt.clone();
        let evidence = blocking(move || {
            if matches!(a.status()?, RunStatus::Running) {
                a.terminate(grace)?;
            }
            a.reap()
        })
        .await?;
        if evidence.populated {
            return Err(AgentError::new(
                ErrorCode::Internal,
                format!(
                    "{} is still populated after the kill; nothing was changed on the \
                     control plane ({})",
                    evidence.cgroup,
                    evidence.steps.join("; ")
                ),
            ));
        }
        Ok(ReplacedGeneration {
            lease,
            generation: attempt.generation(),
            cgroup: evidence.cgroup,
            populated: false,
            observed_at_ms: evidence.observed_at_ms,
        })
    }

    /// Reaps generation `generation` of the profile here, or returns its recorded evidence.
    async fn reap_generation(
        &self,
        sandbox: &Arc<ProjectSandbox>,
        profile: &AgentProfile,
        generation: Generation,
    ) -> Result<ReplacedGeneration, AgentError> {
        let (rt, sb, key) = (
            self.inner.runtime.clone(),
            sandbox.clone(),
            profile.key.clone(),
        );
        let lease = self.lease_of_generation(profile, generation).await?;
        let never_started = rt
            .leaf_path(sb.tenant(), sb.project(), &key, generation)
            .display()
            .to_string();
        let evidence = blocking(move || {
            if let Some(attempt) = AgentAttempt::adopt(&rt, &sb, &key, generation)? {
                if attempt.leaf().exists() {
                    return attempt.reap().map(Some);
                }
            }
            if let Some(recorded) = sb.reap_evidence(&key, generation)? {
                return Ok(Some(recorded));
            }
            // No start record and no leaf: the worker's own durable record says this
            // generation never ran here (a grant whose start was never reached), so its
            // leaf is empty by construction.
            if sb.started(&key, generation)?.is_none() {
                return Ok(Some(squadron_isolation::ReapEvidence {
                    cgroup: never_started,
                    populated: false,
                    observed_at_ms: squadron_client::now_ms(),
                    steps: vec!["never started: no start record, no leaf".into()],
                }));
            }
            Ok(None)
        })
        .await?;
        match evidence {
            Some(ev) if !ev.populated => Ok(ReplacedGeneration {
                lease,
                generation,
                cgroup: ev.cgroup,
                populated: false,
                observed_at_ms: ev.observed_at_ms,
            }),
            Some(ev) => Err(AgentError::new(
                ErrorCode::Internal,
                format!("{} is still populated after the kill", ev.cgroup),
            )),
            None => Err(AgentError::precondition(format!(
                "generation {generation} of profile {} never started on worker {}: no \
                 cgroup to reap",
                profile.id, self.inner.worker
            ))),
        }
    }

    async fn lease_of_generation(
        &self,
        profile: &AgentProfile,
        generation: Generation,
    ) -> Result<LeaseId, AgentError> {
        let candidates = profile
            .live_lease
            .into_iter()
            .chain(profile.fenced_unreaped.iter().copied());
        for id in candidates {
            let lease = self
                .inner
                .control
                .get_lease(id, Consistency::Linearizable)
                .await?;
            if lease.generation == generation {
                return Ok(id);
            }
        }
        Err(AgentError::precondition(format!(
            "profile {} has no unreaped lease of generation {generation}",
            profile.id
        )))
    }

    /// The lease a crash takeover or reap acts on: the current generation's, active or
    /// fenced and not yet reaped.
    async fn takeover_target(&self, profile: &AgentProfile) -> Result<RuntimeLease, AgentError> {
        let candidates = profile
            .live_lease
            .into_iter()
            .chain(profile.fenced_unreaped.iter().rev().copied());
        for id in candidates {
            let lease = self
                .inner
                .control
                .get_lease(id, Consistency::Linearizable)
                .await?;
            if lease.generation == profile.generation && lease.state.holds_slot() {
                return Ok(lease);
            }
        }
        Err(AgentError::precondition(format!(
            "profile {} has no active or unreaped lease at generation {}; launch it instead",
            profile.id, profile.generation
        )))
    }

    /// Polls until the control plane shows the lease expired or fenced.
    async fn wait_for_expiry(&self, lease: &RuntimeLease, wait_ms: u64) -> Result<(), AgentError> {
        let started = squadron_client::now_ms();
        loop {
            let now = self
                .inner
                .control
                .get_lease(lease.id, Consistency::Linearizable)
                .await?;
            // Expiry is the leader's to judge (its sweep fences an expired lease); this
            // host's clock only says when to ask again.
            if now.state != LeaseState::Active {
                return Ok(());
            }
            if squadron_client::now_ms().saturating_sub(started) >= wait_ms {
                return Err(AgentError::precondition(format!(
                    "lease {} of generation {} is still active (expires at {} ms) after \
                     {wait_ms} ms of waiting; a crash takeover waits until the leader has \
                     fenced it as expired (INV-9)",
                    lease.id, lease.generation, now.expires_at_ms
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Ends a lease whose process was reaped: released while it is still the writer, else
    /// ended by the evidence (fenced or expired).
    async fn end_lease(
        &self,
        token: FencingToken,
        evidence: ReplacedGeneration,
    ) -> Result<(), AgentError> {
        let released = self
            .inner
            .control
            .release_lease(
                token.lease,
                &LeaseFence {
                    profile: token.profile,
                    generation: token.generation,
                },
                None,
            )
            .await;
        let result = match released {
            Ok(_) => Ok(()),
            Err(ClientError::Api { .. }) => {
                let req = record_evidence(&token, &evidence);
                match self
                    .inner
                    .control
                    .record_evidence(token.lease, &req, None)
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        let e = AgentError::from(e);
                        // An ended lease needs nothing more.
                        if e.message.contains("already ended") {
                            Ok(())
                        } else {
                            self.queue_evidence(token.profile, evidence.clone());
                            Err(e.context("recording the reap evidence"))
                        }
                    }
                }
            }
            Err(e) => {
                self.queue_evidence(token.profile, evidence.clone());
                Err(AgentError::from(e).context("releasing the lease"))
            }
        };
        let mut reg = self.registry();
        if let Some(entry) = reg.agents.get_mut(&token.profile) {
            // A newer generation of the profile keeps its socket.
            if entry.view.lease == token.lease {
                entry.broker_server = None;
                self.inner.broker.unregister_profile(token.profile.get());
            }
        }
        drop(reg);
        result
    }

    /// Releases a lease whose attempt never ran (or ended); a release that does not get
    /// through is retried by the tick loop, so the slot is never left behind.
    async fn release_or_queue(&self, token: FencingToken) {
        if let Err(e) = self.release(token).await {
            tracing::warn!(lease = %token.lease, error = %e, "lease not released yet; retrying");
            self.registry().pending_releases.push(token);
        }
    }

    /// `Ok` when the lease is released or already ended; `Err` when it should be retried.
    async fn release(&self, token: FencingToken) -> Result<(), AgentError> {
        let fence = LeaseFence {
            profile: token.profile,
            generation: token.generation,
        };
        match self
            .inner
            .control
            .release_lease(token.lease, &fence, None)
            .await
        {
            Ok(_) => Ok(()),
            // Refused: no longer the profile's active lease (fenced, ended). A fenced one is
            // ended by evidence; `reap_generation` supplies it for a generation that never
            // started.
            Err(ClientError::Api { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    async fn retry_pending_releases(&self) {
        let pending = std::mem::take(&mut self.registry().pending_releases);
        for token in pending {
            if self.release(token).await.is_err() {
                self.registry().pending_releases.push(token);
            }
        }
    }

    fn queue_evidence(&self, id: ProfileId, evidence: ReplacedGeneration) {
        if let Some(entry) = self.registry().agents.get_mut(&id) {
            entry.pending_evidence = Some(evidence);
        }
    }

    fn set_status(&self, id: ProfileId, status: AgentStatus, exit_code: Option<i32>) {
        if let Some(entry) = self.registry().agents.get_mut(&id) {
            entry.view.status = status;
            if exit_code.is_some() {
                entry.view.exit_code = exit_code;
            }
        }
    }

    /// Counts the project's populated generation leaves and keeps the peak.
    fn sample_processes(&self, tenant: &TenantId, project: &ProjectId) {
        let now = populated_leaves(&self.inner.runtime.project_cgroup_path(tenant, project));
        let mut reg = self.registry();
        let counters = reg
            .projects
            .entry((tenant.clone(), project.clone()))
            .or_default();
        counters.peak_processes = counters.peak_processes.max(now);
    }

    // --- the tick loop ---------------------------------------------------------------------

    async fn renew_all(&self) {
        let tokens: Vec<FencingToken> = self
            .registry()
            .agents
            .values()
            .filter(|e| e.view.status == AgentStatus::Running)
            .map(|e| e.view.token())
            .collect();
        if tokens.is_empty() {
            return;
        }
        let config = &self.inner.config;
        let sent_at = squadron_client::now_ms();
        let answer = self
            .inner
            .control
            .renew_leases(
                &self.inner.worker,
                &RenewLeases {
                    fences: tokens.clone(),
                    ttl_ms: config.lease_ttl_ms,
                },
                None,
            )
            .await;
        match answer {
            Ok(Outcome::LeasesRenewed { results }) => {
                let deadline = sent_at + config.lease_ttl_ms - config.self_fence_margin_ms;
                for r in results {
                    let Some(token) = tokens.iter().find(|t| t.lease == r.lease) else {
                        continue;
                    };
                    match r.result {
                        Ok(_) => self.move_deadline(token.profile, deadline),
                        Err(rejection) => {
                            self.self_fence(*token, &format!("renewal refused: {rejection}"))
                                .await;
                        }
                    }
                }
            }
            Ok(other) => tracing::warn!(outcome = ?other, "unexpected renewal answer"),
            Err(ClientError::Api { body, .. }) if body.rejection.is_some() => {
                // The batch as a whole was refused (a worker that was declared lost): no
                // lease in it can be trusted any more.
                for token in tokens {
                    self.self_fence(token, &format!("renewal refused: {}", body.message))
                        .await;
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "lease renewal failed");
                let now = squadron_client::now_ms();
                let overdue: Vec<FencingToken> = {
                    let reg = self.registry();
                    tokens
                        .into_iter()
                        .filter(|t| {
                            reg.agents
                                .get(&t.profile)
                                .is_some_and(|e| e.deadline_ms <= now)
                        })
                        .collect()
                };
                for token in overdue {
                    self.self_fence(token, "the lease could not be renewed before its deadline")
                        .await;
                }
            }
        }
    }

    fn move_deadline(&self, id: ProfileId, deadline: u64) {
        let mut reg = self.registry();
        let Some(entry) = reg.agents.get_mut(&id) else {
            return;
        };
        if entry.view.status != AgentStatus::Running || deadline <= entry.deadline_ms {
            return;
        }
        entry.deadline_ms = deadline;
        let file = entry
            .sandbox
            .profile_paths(&entry.view.key)
            .generation_run_dir(entry.view.generation)
            .join("lease-deadline-ms");
        drop(reg);
        if let Err(e) = write_atomic(&file, deadline.to_string().as_bytes()) {
            tracing::warn!(profile = %id, error = %e, "cannot move the provider's deadline");
        }
    }

    /// The lease is no longer this attempt's (or cannot be shown to be): the provider is
    /// stopped and reaped at once, and the evidence recorded when the control plane takes it.
    async fn self_fence(&self, token: FencingToken, why: &str) {
        let attempt = {
            let reg = self.registry();
            match reg.agents.get(&token.profile) {
                Some(e) if e.view.status == AgentStatus::Running && e.view.lease == token.lease => {
                    e.attempt.clone()
                }
                _ => return,
            }
        };
        tracing::warn!(profile = %token.profile, generation = %token.generation, why, "self-fencing: stopping the provider");
        self.set_status(token.profile, AgentStatus::SelfFenced, None);
        {
            let mut reg = self.registry();
            if let Some(entry) = reg.agents.get(&token.profile) {
                let key = (entry.view.tenant.clone(), entry.view.project.clone());
                reg.projects.entry(key).or_default().self_fenced += 1;
            }
            if let Some(entry) = reg.agents.get_mut(&token.profile) {
                entry.broker_server = None;
            }
        }
        self.inner.broker.unregister_profile(token.profile.get());
        match self
            .stop_attempt(&attempt, token.lease, Duration::ZERO)
            .await
        {
            Ok(evidence) => self.queue_evidence(token.profile, evidence),
            Err(e) => {
                tracing::error!(profile = %token.profile, error = %e, "self-fenced provider not reaped")
            }
        }
    }

    /// Providers that ended without being asked: a normal exit releases the lease; a death
    /// by signal (or no recorded exit) leaves it to expire for a crash takeover.
    async fn check_exits(&self) {
        let running: Vec<(ProfileId, AgentAttempt, FencingToken, TenantId, ProjectId)> = self
            .registry()
            .agents
            .values()
            .filter(|e| e.view.status == AgentStatus::Running)
            .map(|e| {
                (
                    e.view.profile,
                    e.attempt.clone(),
                    e.view.token(),
                    e.view.tenant.clone(),
                    e.view.project.clone(),
                )
            })
            .collect();
        let mut projects = BTreeSet::new();
        for (id, attempt, token, tenant, project) in running {
            projects.insert((tenant, project));
            let a = attempt.clone();
            let status = match blocking(move || a.status()).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(profile = %id, error = %e, "cannot read the attempt's status");
                    continue;
                }
            };
            let code = match status {
                RunStatus::Running | RunStatus::Created => continue,
                RunStatus::Exited { code } => Some(code),
                RunStatus::Vanished => None,
            };
            // Another operation may have changed the entry while the status was read.
            let still = self.registry().agents.get(&id).is_some_and(|e| {
                e.view.status == AgentStatus::Running && e.view.lease == token.lease
            });
            if !still {
                continue;
            }
            let crashed = code.is_none_or(|c| c >= 128);
            tracing::info!(profile = %id, generation = %token.generation, ?code, crashed, "provider ended");
            self.inner.broker.unregister_profile(id.get());
            if crashed {
                self.set_status(id, AgentStatus::Crashed, code);
                if let Some(entry) = self.registry().agents.get_mut(&id) {
                    entry.broker_server = None;
                }
                continue;
            }
            self.set_status(id, AgentStatus::Exited, code);
            match self
                .stop_attempt(&attempt, token.lease, Duration::ZERO)
                .await
            {
                Ok(evidence) => {
                    if let Err(e) = self.end_lease(token, evidence).await {
                        tracing::warn!(profile = %id, error = %e, "lease of an exited provider not ended yet");
                    }
                }
                Err(e) => tracing::error!(profile = %id, error = %e, "exited provider not reaped"),
            }
        }
        for (tenant, project) in projects {
            self.sample_processes(&tenant, &project);
        }
    }

    async fn retry_pending_evidence(&self) {
        let pending: Vec<(FencingToken, ReplacedGeneration)> = self
            .registry()
            .agents
            .values()
            .filter_map(|e| e.pending_evidence.clone().map(|ev| (e.view.token(), ev)))
            .collect();
        for (token, evidence) in pending {
            let req = record_evidence(&token, &evidence);
            match self
                .inner
                .control
                .record_evidence(token.lease, &req, None)
                .await
            {
                Ok(_) => {
                    if let Some(e) = self.registry().agents.get_mut(&token.profile) {
                        e.pending_evidence = None;
                    }
                }
                Err(e) => {
                    let e = AgentError::from(e);
                    // Not expired yet: asked again next tick. Ended already: nothing to do.
                    if e.message.contains("already ended") || e.code == ErrorCode::NotFound {
                        if let Some(entry) = self.registry().agents.get_mut(&token.profile) {
                            entry.pending_evidence = None;
                        }
                    }
                }
            }
        }
    }

    /// Appends new mailbox messages of every running profile to its `mailbox.jsonl` and
    /// acknowledges them under the lease. Lifecycle noise never reaches a mailbox (the
    /// control plane refuses it), so everything there is relayed.
    async fn deliver_mailboxes(&self) {
        let running: Vec<(FencingToken, PathBuf, u64, (TenantId, ProjectId))> = self
            .registry()
            .agents
            .values()
            .filter(|e| e.view.status == AgentStatus::Running)
            .map(|e| {
                (
                    e.view.token(),
                    e.sandbox
                        .profile_paths(&e.view.key)
                        .generation_run_dir(e.view.generation)
                        .join("mailbox.jsonl"),
                    e.view.mailbox_delivered_through,
                    (e.view.tenant.clone(), e.view.project.clone()),
                )
            })
            .collect();
        for (token, file, through, project) in running {
            let mailbox = match self
                .inner
                .control
                .read_mailbox(token.profile, Consistency::Linearizable)
                .await
            {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(profile = %token.profile, error = %e, "mailbox not read");
                    continue;
                }
            };
            let fresh: Vec<_> = mailbox
                .messages
                .values()
                .filter(|m| m.seq > through.max(mailbox.acked_through))
                .collect();
            // Delivered but not acknowledged (an earlier ack was lost): acknowledge again.
            let Some(last) = fresh.last().map(|m| m.seq) else {
                if through > mailbox.acked_through {
                    self.acknowledge(token, through).await;
                }
                continue;
            };
            let mut lines = Vec::new();
            let mut roster = 0u64;
            for m in &fresh {
                if m.kind == MessageKind::RosterDelta
                    || matches!(m.payload, MessagePayload::Roster(_))
                {
                    roster += 1;
                }
                match serde_json::to_vec(m) {
                    Ok(mut line) => {
                        line.push(b'\n');
                        lines.extend(line);
                    }
                    Err(e) => tracing::warn!(error = %e, "message not encodable"),
                }
            }
            if let Err(e) = append_bounded(&file, &lines) {
                tracing::warn!(profile = %token.profile, error = %e, "mailbox not delivered");
                continue;
            }
            {
                let mut reg = self.registry();
                if let Some(entry) = reg.agents.get_mut(&token.profile) {
                    entry.view.mailbox_delivered_through = last;
                }
                let c = reg.projects.entry(project).or_default();
                c.messages_delivered += fresh.len() as u64;
                c.roster_deltas_delivered += roster;
            }
            self.acknowledge(token, last).await;
        }
    }

    /// Acknowledges a profile's mailbox through `seq` under its lease; a failure is retried
    /// by the next tick.
    async fn acknowledge(&self, token: FencingToken, seq: u64) {
        let ack = AckMessages {
            lease: token.lease,
            generation: token.generation,
            through_seq: seq,
        };
        if let Err(e) = self
            .inner
            .control
            .ack_messages(token.profile, &ack, None)
            .await
        {
            tracing::debug!(profile = %token.profile, error = %e, "mailbox not acknowledged yet");
        }
    }
}

fn grant_token(profile: ProfileId, grant: &LeaseGrant) -> FencingToken {
    FencingToken {
        profile,
        lease: grant.lease,
        generation: grant.generation,
    }
}

fn takeover_evidence(e: &ReplacedGeneration) -> TakeoverEvidence {
    TakeoverEvidence {
        cgroup: e.cgroup.clone(),
        populated: e.populated,
        observed_at_ms: e.observed_at_ms,
    }
}

fn record_evidence(token: &FencingToken, e: &ReplacedGeneration) -> RecordEvidence {
    RecordEvidence {
        profile: token.profile,
        generation: token.generation,
        cgroup: e.cgroup.clone(),
        populated: e.populated,
        observed_at_ms: e.observed_at_ms,
    }
}

fn unexpected(what: &str, outcome: &Outcome) -> AgentError {
    AgentError::new(
        ErrorCode::Internal,
        format!("unexpected answer to {what}: {outcome:?}"),
    )
}

fn check_prompt(prompt: &str) -> Result<(), AgentError> {
    if prompt.len() > PROMPT_BYTES_MAX {
        return Err(AgentError::invalid(
            "prompt",
            format!("{} bytes, at most {PROMPT_BYTES_MAX}", prompt.len()),
        ));
    }
    Ok(())
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

/// The capsule the stopped provider left at `/state/capsule.json`, or a note that it left
/// none. The file is the provider's: it is read without following a symlink, bounded, and
/// parsed strictly.
fn read_capsule_file(
    sandbox: &ProjectSandbox,
    profile: &AgentProfile,
    generation: Generation,
) -> CapsulePayload {
    let path = sandbox
        .profile_paths(&profile.key)
        .state
        .join("capsule.json");
    let fallback = |why: String| CapsulePayload {
        task_state: format!("generation {generation} stopped for a takeover; {why}"),
        context_ref: profile.context_ref.clone().unwrap_or_default(),
        ..CapsulePayload::default()
    };
    let meta = match fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(_) => return fallback("it wrote no /state/capsule.json".into()),
    };
    if !meta.is_file() || meta.len() > CAPSULE_FILE_BYTES_MAX {
        return fallback(format!(
            "/state/capsule.json was not a regular file of at most {CAPSULE_FILE_BYTES_MAX} bytes"
        ));
    }
    match fs::read(&path).map(|b| serde_json::from_slice::<CapsulePayload>(&b)) {
        Ok(Ok(payload)) => payload,
        Ok(Err(e)) => fallback(format!(
            "/state/capsule.json was not a capsule payload: {e}"
        )),
        Err(e) => fallback(format!("/state/capsule.json could not be read: {e}")),
    }
}

/// Appends to a file only the worker writes (the run directory is read-only inside); past
/// the bound the newest half is kept.
fn append_bounded(file: &Path, bytes: &[u8]) -> Result<(), AgentError> {
    let io = |e: std::io::Error| AgentError::from(crate::WorkerError::io("appending", file, e));
    let len = fs::metadata(file).map(|m| m.len()).unwrap_or(0);
    if len + bytes.len() as u64 > MAILBOX_FILE_BYTES_MAX {
        let old = fs::read(file).map_err(io)?;
        let keep = &old[old.len() / 2..];
        let start = keep
            .iter()
            .position(|b| *b == b'\n')
            .map_or(keep.len(), |p| p + 1);
        let mut next = keep[start..].to_vec();
        next.extend_from_slice(bytes);
        return write_atomic(file, &next).map_err(AgentError::from);
    }
    let mut f = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)
        .map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    Ok(())
}

/// Populated `profile-*-g*` leaves of a project cgroup.
fn populated_leaves(dir: &Path) -> u32 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    let mut n = 0;
    for entry in entries
        .flatten()
        .take(crate::agent::runtime::PROJECT_LEAVES_SCANNED_MAX)
    {
        let is_leaf = entry
            .file_name()
            .to_str()
            .is_some_and(|name| name.starts_with("profile-"));
        if is_leaf && crate::agent::project_sandbox::leaf_populated(&entry.path()).unwrap_or(false)
        {
            n += 1;
        }
    }
    n
}

fn list_dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path().display().to_string())
        .take(crate::agent::runtime::PROJECT_LEAVES_SCANNED_MAX)
        .collect()
}

/// Files under a project's launch directories whose names mark them as credentials.
fn credential_files(run_root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![run_root.to_path_buf()];
    let mut seen = 0usize;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > crate::agent::runtime::PROJECT_LEAVES_SCANNED_MAX * 16 {
                return found;
            }
            let path = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(t) if t.is_file() => {
                    let name = entry.file_name().to_string_lossy().to_lowercase();
                    if CREDENTIAL_FILE_MARKERS.iter().any(|m| name.contains(m)) {
                        found.push(path.display().to_string());
                    }
                }
                _ => {}
            }
        }
    }
    found
}

async fn blocking<T, F>(f: F) -> Result<T, AgentError>
where
    F: FnOnce() -> Result<T, crate::WorkerError> + Send + 'static,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn append_bounded_keeps_whole_lines_past_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("mailbox.jsonl");
        let line = vec![b'x'; 1023];
        let mut one = line.clone();
        one.push(b'\n');
        let total = (MAILBOX_FILE_BYTES_MAX / 1024) + 8;
        for _ in 0..total {
            append_bounded(&file, &one).unwrap();
        }
        let bytes = fs::read(&file).unwrap();
        assert!(bytes.len() as u64 <= MAILBOX_FILE_BYTES_MAX);
        assert!(bytes.len() as u64 >= MAILBOX_FILE_BYTES_MAX / 2 - 1024);
        assert!(bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .all(|l| l == line.as_slice()));
    }

    #[test]
    fn credential_files_are_found_by_name_anywhere_under_run() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("a/g1")).unwrap();
        fs::write(dir.path().join("a/g1/launch.sh"), "x").unwrap();
        fs::write(dir.path().join("a/g1/api.token"), "x").unwrap();
        fs::write(dir.path().join("a/Credentials.json"), "x").unwrap();
        let mut found = credential_files(dir.path());
        found.sort();
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].ends_with("Credentials.json"));
        assert!(found[1].ends_with("api.token"));
    }
}
