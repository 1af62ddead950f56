//! The Docker runtime's warm pool (`squadron worker --docker-warm-pool N`): containers
//! created and started before a task needs one, so a claim skips the engine's create and
//! start (about 250–400 ms here) — the anchors are Kubernetes agent-sandbox's warm claims and
//! E2B's resumes.
//!
//! # What a warm container is
//!
//! The shape of the default sandbox only: hardened, `network_mode: outbound`, the sandbox
//! user, `squadron agent` as its command. It starts with idle limits (one CPU, 128 MiB, 64
//! pids) and two empty directories of its slot bound in with slave propagation —
//! `{pool}/{slot}/mnt` at `/mnt` and `{pool}/{slot}/squadron` at `/run/squadron` — and its
//! agent waits for a launch file (`squadron agent --launch-file`).
//!
//! # A claim, at PROVISIONING
//!
//! The task's directories are bound beneath the slot on the host (inbox and outbox
//! read-write, the global directory read-only, the agent directory, the credential session
//! read-only), each `nosuid,nodev`; the propagation shows them at the paths a cold container
//! has. The engine then sets the task's CPU, memory and pid limits and the container is
//! renamed to the attempt's name, which is how a restarted worker adopts it (labels cannot
//! change after create). Nothing has started the task yet: `start` writes the launch file
//! (the launcher, its directory and environment) into the task's `run/` — which the worker
//! alone writes, read-only in every sandbox, so no earlier attempt can plant one — and binds
//! `run/` last; the agent, waiting for that file, then enrolls. A restarted worker that
//! adopted a renamed container does the same in its own `start`. The claim runs in a task
//! of its own, so a provision timeout never leaves it half done. A container is claimed once
//! and removed with its task: nothing of one task is ever in another's container. A claim
//! that fails (the container died idle) discards that container and provisions cold.
//!
//! # Refill and restart
//!
//! A background loop keeps `N` idle containers, one created at a time, and waits
//! `REFILL_RETRY_MS` after a failure. A worker stopping on a signal closes the pool and
//! removes its idle containers (`drain_pool`). A starting worker — with a pool or without one, as long
//! as an earlier life left the pool's directory — removes its idle containers of earlier
//! lives (by their `squadron-pool-` names), the binds a crash left at staging points and the
//! slots no container holds, and keeps the claimed ones for their tasks. Not pooled:
//! `full_control`, the other network modes, a launch without all three limits, a worker not
//! running as root (the slot's binds need it) or without the agent.

use std::collections::{HashMap, HashSet, VecDeque};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bollard::container::{
    Config, CreateContainerOptions, RenameContainerOptions, UpdateContainerOptions,
};
use bollard::models::{
    ContainerSummary, Mount, MountBindOptions, MountBindOptionsPropagationEnum, MountTypeEnum,
};
use squadron_api::agent_channel::{PooledLaunch, POOLED_LAUNCH_FILE_NAME};
use squadron_core::manifest::{NetworkMode, RuntimeKind};
use tokio::sync::Notify;

use super::{
    base_host_config, check_launch, engine_error, harden, DockerRuntime, EngineLimits,
    LABEL_MANAGED, LABEL_WORKER, NANO_CPUS_PER_CPU, RUNTIME_NAME,
};
use crate::error::WorkerError;
use crate::runtime::agent_libraries::AGENT_LIBRARY_DIR;
use crate::runtime::sandbox_user::SandboxUser;
use crate::runtime::{LaunchSpec, SandboxHandle};
use crate::task::sandbox_agent::{
    write_owned, AGENT_BINARY_MOUNT, AGENT_DIR_MOUNT, AGENT_ENV_NAME,
};
use crate::task::task_dir::{TaskDir, RUN_MOUNT};

/// Label with the slot number of a warm container, claimed or not.
pub(crate) const LABEL_POOL_SLOT: &str = "squadron.pool-slot";
/// What an unclaimed warm container's name starts with (then the pool's tag and the slot).
pub(crate) const POOL_NAME_PREFIX: &str = "squadron-pool-";
/// The most warm containers one worker keeps.
pub(crate) const WARM_POOL_SIZE_MAX: usize = 32;
/// How long the refill waits after the engine refused a warm container.
const REFILL_RETRY_MS: u64 = 5_000;
/// An idle warm container's limits, until a claim sets the task's.
const IDLE_MEMORY_BYTES: i64 = 128 * 1024 * 1024;
const IDLE_PIDS_MAX: i64 = 64;
const IDLE_CPUS: i64 = 1;
/// The launch file: the sandbox user reads it, nobody writes it.
const LAUNCH_FILE_MODE: u32 = 0o400;
/// The slot's directories and where a warm container sees them.
const SLOT_BINDS: [(&str, &str); 2] = [("mnt", "/mnt"), ("squadron", "/run/squadron")];

/// Where the pool keeps its slots and how many idle containers it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmPoolConfig {
    /// 0: no warm containers; what an earlier life left is still cleaned up.
    pub(crate) size: usize,
    /// `{data_dir}/docker-pool`: made a shared mount at start.
    pub(crate) dir: PathBuf,
}

impl WarmPoolConfig {
    /// Whether the runtime needs a pool at all: one to keep, or one an earlier life left.
    pub(crate) fn needed(&self) -> bool {
        self.size > 0 || self.dir.exists()
    }
}

/// A warm container: its engine id and its slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WarmContainer {
    pub(crate) id: String,
    pub(crate) slot: u64,
}

/// How the claims went, for `/metrics` and the bench.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PoolFigures {
    pub(crate) hits: u64,
    pub(crate) misses: u64,
    /// Launches of a shape the pool does not hold.
    pub(crate) ineligible: u64,
    pub(crate) idle: u64,
}

#[derive(Debug)]
pub(crate) struct WarmPool {
    config: WarmPoolConfig,
    /// Tells this data directory's warm containers from another worker's on the same engine.
    tag: String,
    state: Mutex<PoolState>,
    refill: Notify,
    hits: AtomicU64,
    misses: AtomicU64,
    ineligible: AtomicU64,
    /// Set at the worker's stop: no claim, no refill.
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct PoolState {
    idle: VecDeque<WarmContainer>,
    /// Claimed containers' slots, by container id, until `destroy` clears them.
    claimed: HashMap<String, u64>,
    next_slot: u64,
}

impl WarmPool {
    pub(crate) fn new(config: WarmPoolConfig) -> Result<Self, WorkerError> {
        if config.size > WARM_POOL_SIZE_MAX {
            return Err(WorkerError::Invalid {
                field: "docker_warm_pool".into(),
                message: format!("{} is more than {WARM_POOL_SIZE_MAX}", config.size),
            });
        }
        if !rustix::process::geteuid().is_root() {
            return Err(WorkerError::Invalid {
                field: "docker_warm_pool".into(),
                message: "a warm pool binds each task's directories into its container, which \
                          needs root: run the worker as root or without --docker-warm-pool"
                    .into(),
            });
        }
        squadron_isolation::slot_mounts::ensure_shared(&config.dir)
            .map_err(|e| WorkerError::runtime(RUNTIME_NAME, format!("the warm pool: {e}")))?;
        let tag = format!(
            "{:08x}",
            crate::runtime::fnv1a(config.dir.as_os_str().as_encoded_bytes()) as u32
        );
        Ok(WarmPool {
            config,
            tag,
            state: Mutex::default(),
            refill: Notify::new(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            ineligible: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        })
    }

    pub(crate) fn figures(&self) -> PoolFigures {
        PoolFigures {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            ineligible: self.ineligible.load(Ordering::Relaxed),
            idle: self.state().idle.len() as u64,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn name(&self, slot: u64) -> String {
        format!("{POOL_NAME_PREFIX}{}-{slot}", self.tag)
    }

    /// Where binds get their flags before they go beneath a slot: outside the pool's shared
    /// mount, so nothing there reaches a container.
    fn staging_dir(&self) -> PathBuf {
        let mut name = self.config.dir.as_os_str().to_owned();
        name.push(".staging");
        PathBuf::from(name)
    }

    fn slot_dir(&self, slot: u64) -> PathBuf {
        self.config.dir.join(slot.to_string())
    }

    /// Where beneath the slot a path of the container is: `None` for a path outside the
    /// slot's binds (not poolable).
    fn slot_path(&self, slot: u64, in_container: &str) -> Option<PathBuf> {
        SLOT_BINDS.iter().find_map(|(dir, at)| {
            let rest = Path::new(in_container).strip_prefix(at).ok()?;
            (!rest.as_os_str().is_empty()).then(|| self.slot_dir(slot).join(dir).join(rest))
        })
    }

    /// Binds a task's directory at its place beneath the slot.
    fn bind_in_slot(
        &self,
        slot: u64,
        host: &Path,
        target: &str,
        read_only: bool,
        field: &str,
    ) -> Result<(), WorkerError> {
        let at = self.slot_path(slot, target).ok_or_else(|| {
            super::invalid(field, format!("{target} is outside the warm pool's slot"))
        })?;
        squadron_isolation::slot_mounts::bind(host, &at, read_only, &self.staging_dir())
            .map_err(|e| WorkerError::runtime(RUNTIME_NAME, format!("{field}: {e}")))
    }

    /// Unbinds whatever a claim bound beneath the slot and removes its directories.
    fn clear_slot(&self, slot: u64) {
        let dir = self.slot_dir(slot);
        match squadron_isolation::slot_mounts::unmount_beneath(&dir) {
            Ok(_) => {
                if let Err(e) = crate::support::remove_path(&dir) {
                    tracing::warn!(slot, error = %e, "cannot remove a warm pool slot");
                }
            }
            Err(e) => tracing::warn!(slot, error = %e, "cannot unbind a warm pool slot"),
        }
    }

    /// The slot a destroyed container held, forgotten.
    pub(crate) fn release(&self, id: &str) -> Option<u64> {
        self.state().claimed.remove(id)
    }
}

impl DockerRuntime {
    /// Starts the pool: what the last life left is swept, then the refill loop runs for as
    /// long as the worker does.
    pub(super) async fn start_pool(&self, pool: &Arc<WarmPool>) -> Result<(), WorkerError> {
        self.sweep_pool(pool).await?;
        if pool.config.size > 0 {
            let runtime = self.clone();
            let pool = pool.clone();
            tokio::spawn(async move { runtime.refill_loop(pool).await });
        }
        Ok(())
    }

    async fn refill_loop(self, pool: Arc<WarmPool>) {
        loop {
            while pool.state().idle.len() < pool.config.size {
                if pool.closed.load(Ordering::SeqCst) {
                    return;
                }
                match self.create_warm(&pool).await {
                    // Made while the stop drained the pool: it goes too.
                    Ok(warm) if pool.closed.load(Ordering::SeqCst) => {
                        self.discard_warm(&pool, &warm).await;
                        return;
                    }
                    Ok(warm) => {
                        tracing::debug!(container = %warm.id, slot = warm.slot, "warm container ready");
                        pool.state().idle.push_back(warm);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot make a warm container; trying again");
                        tokio::time::sleep(Duration::from_millis(REFILL_RETRY_MS)).await;
                    }
                }
            }
            pool.refill.notified().await;
        }
    }

    /// Removes the idle containers of an earlier life and the slots no container holds; the
    /// claimed ones stay for their tasks' adoption.
    async fn sweep_pool(&self, pool: &WarmPool) -> Result<(), WorkerError> {
        let staging = pool.staging_dir();
        if let Err(e) = squadron_isolation::slot_mounts::unmount_beneath(&staging) {
            tracing::warn!(error = %e, "cannot unbind the warm pool's staging points");
        }
        let _ = crate::support::remove_path(&staging);
        let claimed = self.remove_idle_warm().await?;
        let held: HashSet<u64> = claimed.values().copied().collect();
        let mut highest = held.iter().copied().max().unwrap_or(0);
        pool.state().claimed.extend(claimed);
        let entries = std::fs::read_dir(&pool.config.dir)
            .map_err(|e| WorkerError::io("list the warm pool", &pool.config.dir, e))?;
        for entry in entries.flatten() {
            let Some(slot) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            highest = highest.max(slot);
            if !held.contains(&slot) {
                pool.clear_slot(slot);
            }
        }
        pool.state().next_slot = highest + 1;
        Ok(())
    }

    /// At the worker's stop: the pool closes and its idle containers and their slots go.
    pub(super) async fn drain_pool(&self) -> Result<(), WorkerError> {
        let Some(pool) = &self.pool else {
            return Ok(());
        };
        pool.closed.store(true, Ordering::SeqCst);
        pool.refill.notify_one();
        let idle: Vec<WarmContainer> = pool.state().idle.drain(..).collect();
        for warm in &idle {
            self.discard_warm(pool, warm).await;
        }
        tracing::info!(removed = idle.len(), "warm containers removed at stop");
        Ok(())
    }

    /// A warm container that will serve no task, removed with its slot.
    async fn discard_warm(&self, pool: &WarmPool, warm: &WarmContainer) {
        if let Err(e) = self.remove_forced(&warm.id).await {
            tracing::warn!(container = %warm.id, error = %e, "cannot remove a warm container");
        }
        pool.release(&warm.id);
        pool.clear_slot(warm.slot);
    }

    /// This worker's warm containers, idle or claimed, running or not.
    async fn warm_containers(&self) -> Result<Vec<ContainerSummary>, WorkerError> {
        let labels = vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_WORKER}={}", self.config.worker.as_str()),
            LABEL_POOL_SLOT.to_string(),
        ];
        self.labelled(labels, "list the warm pool's containers")
            .await
    }

    /// Removes the idle warm containers earlier lives left (their slots hold nothing bound)
    /// and answers the claimed ones, renamed for their tasks: container id → slot.
    pub(super) async fn remove_idle_warm(&self) -> Result<HashMap<String, u64>, WorkerError> {
        let mut claimed = HashMap::new();
        for c in self.warm_containers().await? {
            let (Some(id), Some(name)) = (c.id, c.names.and_then(|n| n.into_iter().next())) else {
                continue;
            };
            let slot = c
                .labels
                .and_then(|l| l.get(LABEL_POOL_SLOT).and_then(|s| s.parse::<u64>().ok()));
            if Self::is_idle_warm_name(&name) {
                self.remove_forced(&id).await?;
                tracing::info!(container = %id, ?slot, "removed a warm container of an earlier life");
            } else if let (true, Some(slot)) = (
                name.trim_start_matches('/')
                    .starts_with(crate::runtime::SANDBOX_NAME_PREFIX),
                slot,
            ) {
                claimed.insert(id, slot);
            }
        }
        Ok(claimed)
    }

    /// Creates and starts one warm container in a new slot.
    async fn create_warm(&self, pool: &WarmPool) -> Result<WarmContainer, WorkerError> {
        let slot = {
            let mut state = pool.state();
            state.next_slot += 1;
            state.next_slot - 1
        };
        let made = self.create_in_slot(pool, slot).await;
        if made.is_err() {
            pool.clear_slot(slot);
        }
        made
    }

    async fn create_in_slot(
        &self,
        pool: &WarmPool,
        slot: u64,
    ) -> Result<WarmContainer, WorkerError> {
        let mut mounts = Vec::new();
        for (dir, at) in SLOT_BINDS {
            let host = pool.slot_dir(slot).join(dir);
            std::fs::create_dir_all(&host)
                .map_err(|e| WorkerError::io("create a warm pool slot", &host, e))?;
            std::fs::set_permissions(&host, std::fs::Permissions::from_mode(0o755))
                .map_err(|e| WorkerError::io("create a warm pool slot", &host, e))?;
            mounts.push(slave_bind(&host, at));
        }
        mounts.extend(self.agent_mounts()?);
        let mut host = base_host_config(mounts, self.network_mode(NetworkMode::Outbound));
        harden(&mut host);
        host.nano_cpus = Some(IDLE_CPUS * NANO_CPUS_PER_CPU);
        host.memory = Some(IDLE_MEMORY_BYTES);
        host.memory_swap = Some(IDLE_MEMORY_BYTES);
        host.pids_limit = Some(IDLE_PIDS_MAX);
        let mut env = Vec::new();
        if self.config.agent_libraries.is_some() {
            env.push(format!("LD_LIBRARY_PATH={AGENT_LIBRARY_DIR}"));
        }
        let user: SandboxUser = self.config.sandbox_user;
        let config = Config {
            image: Some(self.config.image.clone()),
            cmd: Some(vec![
                AGENT_BINARY_MOUNT.to_string(),
                "agent".to_string(),
                "--env-file".to_string(),
                format!("{AGENT_DIR_MOUNT}/{AGENT_ENV_NAME}"),
                "--launch-file".to_string(),
                format!("{RUN_MOUNT}/{POOLED_LAUNCH_FILE_NAME}"),
            ]),
            entrypoint: Some(Vec::new()),
            working_dir: Some("/".to_string()),
            env: Some(env),
            user: Some(format!("{}:{}", user.uid, user.gid)),
            labels: Some(HashMap::from([
                (LABEL_MANAGED.to_string(), "true".to_string()),
                (
                    LABEL_WORKER.to_string(),
                    self.config.worker.as_str().to_string(),
                ),
                (LABEL_POOL_SLOT.to_string(), slot.to_string()),
            ])),
            stop_signal: Some("SIGTERM".to_string()),
            host_config: Some(host),
            ..Default::default()
        };
        let name = pool.name(slot);
        let options = CreateContainerOptions {
            name: name.clone(),
            platform: None,
        };
        let created = self
            .docker
            .create_container(Some(options), config)
            .await
            .map_err(|e| engine_error(&format!("create warm container {name}"), e))?;
        if let Err(e) = self
            .docker
            .start_container::<String>(&created.id, None)
            .await
        {
            self.remove_forced(&created.id).await?;
            return Err(engine_error(&format!("start warm container {name}"), e));
        }
        Ok(WarmContainer {
            id: created.id,
            slot,
        })
    }

    /// A warm container for this launch, claimed; `None` when the shape is not pooled, the
    /// pool is empty, or the claim failed (then the caller provisions cold).
    pub(super) async fn claim_warm(&self, spec: &LaunchSpec) -> Option<SandboxHandle> {
        let pool = self.pool.as_ref()?;
        if pool.closed.load(Ordering::SeqCst) {
            return None;
        }
        if !self.poolable(spec) {
            pool.ineligible.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let warm = pool.state().idle.pop_front();
        pool.refill.notify_one();
        let Some(warm) = warm else {
            pool.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        pool.state().claimed.insert(warm.id.clone(), warm.slot);
        // In a task of its own: a provision timeout dropping this future mid-claim would
        // leave the container half claimed, under no name a restart or a retry finds.
        let claiming = {
            let (runtime, pool, warm, spec) =
                (self.clone(), pool.clone(), warm.clone(), spec.clone());
            tokio::spawn(async move { runtime.claim(&pool, &warm, &spec).await })
        };
        let claimed = claiming.await.unwrap_or_else(|e| {
            Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!("the claim of a warm container ended: {e}"),
            ))
        });
        match claimed {
            Ok(handle) => {
                pool.hits.fetch_add(1, Ordering::Relaxed);
                tracing::info!(container = %warm.id, slot = warm.slot, task = %spec.task, "claimed a warm container");
                Some(handle)
            }
            Err(e) => {
                pool.misses.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(container = %warm.id, error = %e, "a warm container could not be claimed; provisioning cold");
                self.discard_warm(pool, &warm).await;
                None
            }
        }
    }

    /// The default sandbox's shape, which the pool holds; every limit set, since a claim
    /// replaces the idle ones.
    fn poolable(&self, spec: &LaunchSpec) -> bool {
        let limits = &spec.limits;
        !spec.full_control
            && spec.network == NetworkMode::Outbound
            && self.config.agent_binary.is_some()
            && limits.cpus.is_some()
            && limits.memory_bytes.is_some()
            && limits.pids_max.is_some()
            && self.hardened_user(spec).ok() == Some(self.config.sandbox_user)
    }

    async fn claim(
        &self,
        pool: &WarmPool,
        warm: &WarmContainer,
        spec: &LaunchSpec,
    ) -> Result<SandboxHandle, WorkerError> {
        let running = self
            .inspect(&warm.id)
            .await?
            .and_then(|c| c.state)
            .and_then(|s| s.running)
            .unwrap_or(false);
        if !running {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!("warm container {} no longer runs", warm.id),
            ));
        }
        check_launch(spec)?;
        self.hand_over(spec)?;
        // `run/`, which brings the launch, is bound by `start`.
        for (host, target, read_only, field) in self.task_binds(spec) {
            if target != RUN_MOUNT {
                pool.bind_in_slot(warm.slot, &host, &target, read_only, field)?;
            }
        }
        let limits = EngineLimits::of(&spec.limits)?;
        let update = UpdateContainerOptions::<String> {
            nano_cpus: limits.nano_cpus,
            memory: limits.memory,
            memory_swap: limits.memory,
            pids_limit: limits.pids,
            ..Default::default()
        };
        self.docker
            .update_container(&warm.id, update)
            .await
            .map_err(|e| engine_error(&format!("set the limits of container {}", warm.id), e))?;
        // Last: a restarted worker adopts by this name, and its `start` gives the launch.
        let name = Self::container_name(&spec.dir, spec.attempt);
        self.docker
            .rename_container(&warm.id, RenameContainerOptions { name })
            .await
            .map_err(|e| engine_error(&format!("rename container {}", warm.id), e))?;
        Ok(SandboxHandle {
            runtime: RuntimeKind::Docker,
            id: warm.id.clone(),
        })
    }

    /// `start` of a claimed container: the launch file written into the task's `run/`, then
    /// `run/` bound beneath the slot — the agent starts once it sees the file. Again after a
    /// restart: the file is written afresh and a `run/` bound already stays.
    pub(super) fn give_launch(
        &self,
        slot_label: &str,
        spec: &LaunchSpec,
    ) -> Result<(), WorkerError> {
        let pool = self.pool.as_ref().ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                "a claimed warm container, but this worker keeps no pool: start it with \
                 --docker-warm-pool, or cancel the task",
            )
        })?;
        let slot: u64 = slot_label.parse().map_err(|_| {
            super::invalid(
                "labels",
                format!("warm pool slot {slot_label:?} is not a number"),
            )
        })?;
        write_launch(spec, self.config.sandbox_user)?;
        let run = pool
            .slot_path(slot, RUN_MOUNT)
            .ok_or_else(|| super::invalid("run", format!("{RUN_MOUNT} is outside the slot")))?;
        let bound = squadron_isolation::slot_mounts::is_bound(&run)
            .map_err(|e| WorkerError::runtime(RUNTIME_NAME, e.to_string()))?;
        if !bound {
            pool.bind_in_slot(slot, &spec.dir.run(), RUN_MOUNT, true, "run")?;
        }
        Ok(())
    }

    /// After a claimed container is gone: the slot's binds and directories go too.
    pub(super) fn clear_claimed_slot(&self, id: &str, label: Option<&str>) {
        let Some(pool) = &self.pool else { return };
        let slot = pool
            .release(id)
            .or_else(|| label.and_then(|s| s.parse().ok()));
        if let Some(slot) = slot {
            pool.clear_slot(slot);
        }
    }

    /// A claimed warm container of the attempt, found by its name (its labels are the
    /// pool's).
    pub(super) async fn adopt_claimed(
        &self,
        dir: &TaskDir,
        attempt: u32,
    ) -> Result<Option<SandboxHandle>, WorkerError> {
        let name = Self::container_name(dir, attempt);
        let Some(found) = self.inspect(&name).await? else {
            return Ok(None);
        };
        if !self.is_attempts(&found, dir, attempt) {
            return Ok(None);
        }
        let id = found.id.ok_or_else(|| {
            WorkerError::runtime(RUNTIME_NAME, format!("container {name} has no id"))
        })?;
        tracing::info!(container = %id, task = %dir.task(), attempt, "adopted a claimed warm container");
        Ok(Some(SandboxHandle {
            runtime: RuntimeKind::Docker,
            id,
        }))
    }

    /// Whether `name` is an unclaimed warm container's (no task's sandbox).
    pub(super) fn is_idle_warm_name(name: &str) -> bool {
        name.trim_start_matches('/').starts_with(POOL_NAME_PREFIX)
    }
}

/// The launch file in the task's `run/` (read-only in the sandbox), readable by the sandbox
/// user alone, replaced atomically. It holds the allowlisted environment (`--env-allow`),
/// which a cold container's engine config holds instead.
fn write_launch(spec: &LaunchSpec, user: SandboxUser) -> Result<(), WorkerError> {
    let mut env = spec.env.clone();
    SandboxUser::git_env(&mut env);
    let launch = PooledLaunch {
        argv: spec.argv.clone(),
        workdir: spec.workdir.clone(),
        env,
    };
    let bytes = serde_json::to_vec(&launch).map_err(|e| WorkerError::Invalid {
        field: "launch".into(),
        message: e.to_string(),
    })?;
    let path = spec.dir.run().join(POOLED_LAUNCH_FILE_NAME);
    write_owned(&path, &bytes, user.pair(), LAUNCH_FILE_MODE)
}

/// A bind whose later mounts beneath the host directory show inside the container.
fn slave_bind(host: &Path, target: &str) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(host.display().to_string()),
        typ: Some(MountTypeEnum::BIND),
        // Only what the host binds beneath it is written to, with its own flags.
        read_only: Some(true),
        bind_options: Some(MountBindOptions {
            propagation: Some(MountBindOptionsPropagationEnum::RSLAVE),
            ..Default::default()
        }),
        ..Default::default()
    }
}
