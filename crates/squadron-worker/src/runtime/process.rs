//! The process runtime: each attempt runs in a cgroup v2 leaf `<parent>/task-<id>-a<attempt>`
//! behind a bubblewrap boundary, through `squadron-isolation`.
//!
//! Inside the boundary the task's inbox and outbox are writable at `/mnt/inbox` and
//! `/mnt/outbox`, its run directory and the worker's global directory are read-only at
//! `/mnt/run` and `/mnt/global`, the host's system directories are read-only, /tmp is
//! private and nothing else of the host is visible. The network is the mode's (see
//! `boundary_network`): `outbound` gets a namespace of its own with NAT and the egress filter,
//! torn down by `destroy` (and, after a restart, by the sweep in `new`).
//!
//! Restart safety: the run's stdout and stderr go to the progress files, never through the
//! worker; the exit code is written by the shim to `<task root>/exit-code-a<attempt>`; a
//! marker `<task root>/started-a<attempt>`, created exclusively before the spawn, makes
//! `start` a no-op the second time, in this life or the next. A restarted worker finds the
//! leaf by its path (`adopt`) and reads the status from the leaf and those two files.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::io::ErrorKind;
use std::net::SocketAddrV4;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use squadron_core::ids::TaskId;
use squadron_core::manifest::RuntimeKind;
use squadron_isolation::bubblewrap::{BWRAP_PROGRAM_DEFAULT, SETPRIV_PROGRAM_DEFAULT};
use squadron_isolation::reaper::REAP_WAIT_MS_DEFAULT;
use squadron_isolation::{
    BubblewrapCommand, CgroupLeaf, CgroupLimits, CgroupRoot, CgroupRootConfig, IsolationError,
    LeafUsage, LimitHits, NetworkConfig, Reaper, SandboxLaunch, SandboxNetwork, SandboxProcess,
    Termination, TerminationOutcome,
};

use crate::config::WorkerConfig;
use crate::error::WorkerError;
use crate::runtime::boundary_network::{BoundaryNetwork, NetworkPermits};
use crate::runtime::gateway::{self, Destinations, GatewayProxy, GATEWAY_PORT};
use crate::runtime::sandbox_user::SandboxUser;
use crate::runtime::{LaunchSpec, ReapReport, RunStatus, Runtime, SandboxHandle};
use crate::task::task_dir::{TaskDir, GLOBAL_MOUNT, INBOX_MOUNT, OUTBOX_MOUNT, RUN_MOUNT};

#[cfg(test)]
mod network_tests;
#[cfg(test)]
mod tests;

/// The runtime's name in errors.
pub(crate) const PROCESS_RUNTIME: &str = "process";
/// Most attempts whose files this runtime remembers at once (provisioned or adopted, not
/// destroyed); one worker runs far fewer.
pub(crate) const ATTEMPTS_TRACKED_MAX: usize = 4096;

/// How the process runtime is set up on this worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProcessRuntimeConfig {
    /// Names this worker's cgroup parent, `<v2 base>/<worker>`; one path component.
    pub(crate) worker: String,
    /// Where leaves live; detected when unset (cgroup v2 mount, v1 memory/pids/cpu fallbacks).
    pub(crate) cgroup: CgroupRootConfig,
    pub(crate) bwrap: PathBuf,
    /// util-linux `setpriv`, which empties the bounding set inside the boundary; `None`
    /// leaves bubblewrap's own dropping (effective and permitted sets only).
    pub(crate) setpriv: Option<PathBuf>,
    /// Run providers as this host user (by default nobody, see `sandbox_user`); the
    /// outbox and run directories are then handed to that user before the start and the
    /// inbox shared with it (the global directory is not: it must be world-readable).
    /// `None` runs them as root without capabilities.
    pub(crate) sandbox_user: Option<SandboxUser>,
    /// Size of the private /tmp; `None` for the tmpfs default.
    pub(crate) tmp_bytes: Option<u64>,
    /// Programs, tag and deny list of `outbound` sandboxes' own networks.
    pub(crate) network: NetworkConfig,
    /// Whether `network_mode: full` (the host's network) may run here; refused otherwise.
    pub(crate) allow_full_network: bool,
    /// What `gateway` sandboxes may reach; `None`: the mode is refused.
    pub(crate) gateway: Option<Arc<Destinations>>,
    /// How long `destroy` waits for `populated 0` after `cgroup.kill`.
    pub(crate) reap_wait: Duration,
}

impl ProcessRuntimeConfig {
    /// The defaults for worker `worker`: detected cgroups, `/usr/bin/bwrap`,
    /// `/usr/bin/setpriv`, the default sandbox user, a 1 GiB /tmp, own networks with no
    /// extra deny list, `full` refused.
    pub(crate) fn new(worker: impl Into<String>) -> Self {
        let worker = worker.into();
        ProcessRuntimeConfig {
            network: NetworkConfig::new(&worker),
            allow_full_network: false,
            gateway: None,
            worker,
            cgroup: CgroupRootConfig::default(),
            bwrap: PathBuf::from(BWRAP_PROGRAM_DEFAULT),
            setpriv: Some(PathBuf::from(SETPRIV_PROGRAM_DEFAULT)),
            sandbox_user: Some(SandboxUser::default()),
            tmp_bytes: Some(squadron_isolation::bubblewrap::SANDBOX_TMP_BYTES_DEFAULT),
            reap_wait: Duration::from_millis(REAP_WAIT_MS_DEFAULT),
        }
    }
}

impl ProcessRuntimeConfig {
    /// The process runtime of a worker (tasks and agent attempts share it): its cgroup
    /// mount, the egress deny list and whether `full` may run.
    pub(crate) fn for_worker(config: &WorkerConfig) -> Result<Self, WorkerError> {
        let mut pc = ProcessRuntimeConfig::new(config.id.to_string());
        if let Some(root) = &config.cgroup_root {
            pc.cgroup.v2_base = Some(root.join("squadron"));
        }
        pc.network.deny = config.egress_deny_networks()?;
        pc.network.allow = config.egress_allow_networks()?;
        pc.allow_full_network = config.allow_full_network;
        pc.gateway = config.gateway_destinations(&pc.network)?;
        Ok(pc)
    }

    pub(crate) fn permits(&self) -> NetworkPermits {
        NetworkPermits {
            full: self.allow_full_network,
            gateway: self.gateway.is_some(),
        }
    }
}

/// The files of one attempt, found from its task directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AttemptFiles {
    root: PathBuf,
    exit_code: PathBuf,
    started: PathBuf,
    /// Names the attempt's own network namespace, while it has one.
    network: PathBuf,
}

impl AttemptFiles {
    fn new(dir: &TaskDir, attempt: u32) -> Self {
        AttemptFiles {
            root: dir.root().to_path_buf(),
            exit_code: ProcessRuntime::exit_code_file(dir, attempt),
            started: ProcessRuntime::started_marker(dir, attempt),
            network: dir.root().join(format!("network-a{attempt}")),
        }
    }
}

/// Runs attempts as bubblewrap boundaries in cgroup leaves.
#[derive(Debug)]
pub(crate) struct ProcessRuntime {
    config: ProcessRuntimeConfig,
    root: CgroupRoot,
    /// Leaf path → the attempt's files, for `status`.
    attempts: Mutex<HashMap<String, AttemptFiles>>,
    /// Leaf path → the proxy of a `gateway` attempt, on its sandbox's host end.
    gateways: tokio::sync::Mutex<HashMap<String, GatewayProxy>>,
}

impl ProcessRuntime {
    /// Checks the host (see `probe`) and opens this worker's cgroup parent.
    /// Tears down the networks a previous life of this worker left behind.
    pub(crate) fn new(config: ProcessRuntimeConfig) -> Result<Self, WorkerError> {
        let root = Self::probe(&config)?;
        Self::sweep_networks(&config);
        Ok(ProcessRuntime {
            config,
            root,
            attempts: Mutex::new(HashMap::new()),
            gateways: tokio::sync::Mutex::new(HashMap::new()),
        })
    }

    /// Tears down this worker's sandbox networks no process is in: a previous life's. Run
    /// only while nothing of this life is starting.
    pub(crate) fn sweep_networks(config: &ProcessRuntimeConfig) {
        match SandboxNetwork::sweep(&config.network) {
            Ok(swept) if !swept.is_empty() => {
                tracing::info!(?swept, "removed sandbox networks left by an earlier run")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "cannot sweep leftover sandbox networks"),
        }
    }

    /// Whether this host can run the process runtime, and if not, every reason why: no
    /// bubblewrap, no setpriv, no cgroup v2, not permitted to create cgroups. On success
    /// returns the opened cgroup parent.
    pub(crate) fn probe(config: &ProcessRuntimeConfig) -> Result<CgroupRoot, WorkerError> {
        let mut problems = Vec::new();
        match std::process::Command::new(&config.bwrap)
            .arg("--version")
            .env_clear()
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => problems.push(format!(
                "bubblewrap {} --version failed ({}): {}",
                config.bwrap.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )),
            Err(e) => problems.push(format!(
                "bubblewrap not usable at {} ({e}); install the bubblewrap package",
                config.bwrap.display()
            )),
        }
        if let Some(setpriv) = &config.setpriv {
            if !setpriv.is_file() {
                problems.push(format!(
                    "setpriv not found at {} (util-linux)",
                    setpriv.display()
                ));
            }
        }
        if let Err(e) = config.network.probe() {
            problems.push(format!("sandbox networks: {e}"));
        }
        let root = match CgroupRoot::open(&config.worker, &config.cgroup) {
            Ok(root) => Some(root),
            Err(e) => {
                problems.push(format!("cgroups: {e}"));
                None
            }
        };
        match (root, problems.is_empty()) {
            (Some(root), true) => Ok(root),
            _ => Err(WorkerError::runtime(
                PROCESS_RUNTIME,
                format!("unavailable on this host: {}", problems.join("; ")),
            )),
        }
    }

    /// The leaf name of an attempt: `task-<id>-a<attempt>`.
    pub(crate) fn leaf_name(task: TaskId, attempt: u32) -> String {
        format!("{LEAF_NAME_PREFIX}{}-a{attempt}", task.get())
    }

    /// Where the shim records the attempt's exit code: beside, not inside, the mounted dirs.
    pub(crate) fn exit_code_file(dir: &TaskDir, attempt: u32) -> PathBuf {
        dir.root().join(format!("exit-code-a{attempt}"))
    }

    /// Created exclusively just before the spawn: its existence means "started once".
    pub(crate) fn started_marker(dir: &TaskDir, attempt: u32) -> PathBuf {
        dir.root().join(format!("started-a{attempt}"))
    }

    #[cfg(test)]
    pub(crate) fn cgroup_root(&self) -> &CgroupRoot {
        &self.root
    }

    /// The leaf behind a handle; only leaves of this worker's parent are accepted.
    pub(crate) fn leaf(&self, handle: &SandboxHandle) -> Result<CgroupLeaf, WorkerError> {
        let path = Path::new(&handle.id);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| {
                path.parent() == Some(self.root.v2_parent())
                    && handle.runtime == RuntimeKind::Process
            })
            .ok_or_else(|| WorkerError::Invalid {
                field: "sandbox handle".to_owned(),
                message: format!(
                    "{:?} ({}) is not a process leaf under {}",
                    handle.id,
                    handle.runtime,
                    self.root.v2_parent().display()
                ),
            })?;
        self.root.leaf(name).map_err(isolation)
    }

    fn handle_for(&self, leaf: &CgroupLeaf) -> SandboxHandle {
        SandboxHandle {
            runtime: RuntimeKind::Process,
            id: leaf.path().display().to_string(),
        }
    }

    fn remember(&self, leaf: &CgroupLeaf, files: AttemptFiles) -> Result<(), WorkerError> {
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        let key = leaf.path().display().to_string();
        if !attempts.contains_key(&key) && attempts.len() >= ATTEMPTS_TRACKED_MAX {
            return Err(WorkerError::runtime(
                PROCESS_RUNTIME,
                format!("more than {ATTEMPTS_TRACKED_MAX} live attempts; destroy some first"),
            ));
        }
        attempts.insert(key, files);
        Ok(())
    }

    fn files(&self, leaf: &CgroupLeaf) -> Option<AttemptFiles> {
        let attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        attempts.get(&leaf.path().display().to_string()).cloned()
    }

    fn forget(&self, leaf: &CgroupLeaf) {
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        attempts.remove(&leaf.path().display().to_string());
    }

    /// Serves a `gateway` sandbox's proxy on its host end, for connections from its address
    /// only (events to the task's `events.jsonl`); replaces one this life served before.
    async fn serve_gateway(
        &self,
        leaf: &CgroupLeaf,
        net: &SandboxNetwork,
        dir: &TaskDir,
    ) -> Result<SocketAddrV4, WorkerError> {
        let destinations = self.config.gateway.clone().ok_or_else(|| {
            WorkerError::runtime(PROCESS_RUNTIME, "gateway sandbox without an allow list")
        })?;
        let addr = SocketAddrV4::new(net.host_address(), GATEWAY_PORT);
        let mut gateways = self.gateways.lock().await;
        // A proxy of an earlier start of this attempt holds the address: drop it first.
        gateways.remove(&leaf.path().display().to_string());
        let proxy = GatewayProxy::start(addr.into(), destinations).await?;
        proxy.admit(net.sandbox_address(), dir.clone());
        gateways.insert(leaf.path().display().to_string(), proxy);
        Ok(addr)
    }

    fn boundary(
        &self,
        spec: &LaunchSpec,
        network: &BoundaryNetwork,
        proxy: Option<SocketAddrV4>,
    ) -> Result<Vec<String>, WorkerError> {
        let dir = &spec.dir;
        let mut env = spec.env.clone();
        if self.config.sandbox_user.is_some() {
            SandboxUser::git_env(&mut env);
        }
        if let Some(proxy) = proxy {
            gateway::proxy_env(proxy, &mut env);
        }
        let mut command = BubblewrapCommand::new(spec.argv.clone())
            .program(&self.config.bwrap)
            .setpriv(self.config.setpriv.clone())
            .sandbox_user(self.config.sandbox_user.map(SandboxUser::pair))
            .tmp_bytes(self.config.tmp_bytes)
            .bind_rw(dir.inbox(), INBOX_MOUNT)
            .bind_rw(dir.outbox(), OUTBOX_MOUNT)
            .bind_ro(dir.run(), RUN_MOUNT)
            .env(env);
        command = network.apply(command);
        if let Some(global) = &spec.global_dir {
            command = command.bind_ro(global, GLOBAL_MOUNT);
        }
        if let Some(session) = &spec.credentials {
            command = command.bind_ro(session.host_dir(), session.sandbox_dir());
        }
        if !spec.workdir.is_empty() {
            command = command.chdir(spec.workdir.clone());
        }
        command.argv().map_err(isolation)
    }
}

#[async_trait]
impl Runtime for ProcessRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    /// For an adopted sandbox: its own namespace is the one its network record names.
    async fn serve_egress(
        &self,
        handle: &SandboxHandle,
        egress: &std::sync::Arc<crate::egress::EgressSession>,
    ) -> Result<(), WorkerError> {
        let leaf = self.leaf(handle)?;
        let files = self.files(&leaf).ok_or_else(|| {
            WorkerError::runtime(PROCESS_RUNTIME, format!("{} is not adopted", handle.id))
        })?;
        serve_egress_recorded(egress, &self.config.network, &files.network, &handle.id)
    }

    fn serves_egress(&self) -> bool {
        true
    }

    fn sandbox_owner(&self, _spec: &LaunchSpec) -> Result<(u32, u32), WorkerError> {
        Ok(self.config.sandbox_user.map_or((0, 0), SandboxUser::pair))
    }

    async fn provision(&self, spec: &LaunchSpec) -> Result<SandboxHandle, WorkerError> {
        BoundaryNetwork::check_mode(spec.network, self.config.permits())?;
        let leaf = self
            .root
            .leaf(&Self::leaf_name(spec.task, spec.attempt))
            .map_err(isolation)?;
        let files = AttemptFiles::new(&spec.dir, spec.attempt);
        if files.started.exists() {
            return Err(WorkerError::runtime(
                PROCESS_RUNTIME,
                format!(
                    "attempt {} of task {} was started already ({}); adopt it instead",
                    spec.attempt,
                    spec.task,
                    files.started.display()
                ),
            ));
        }
        leaf.create().map_err(isolation)?;
        let applied = leaf
            .set_limits(&CgroupLimits {
                memory_bytes: spec.limits.memory_bytes,
                pids_max: spec.limits.pids_max,
                cpus: spec.limits.cpus,
            })
            .map_err(isolation)?;
        for missing in &applied.unavailable {
            tracing::warn!(task = %spec.task, attempt = spec.attempt, "limit not enforced: {missing}");
        }
        if spec.full_control {
            tracing::info!(task = %spec.task, "full_control applies to Docker only; the process boundary stays closed");
        }
        self.remember(&leaf, files)?;
        Ok(self.handle_for(&leaf))
    }

    async fn start(&self, handle: &SandboxHandle, spec: &LaunchSpec) -> Result<(), WorkerError> {
        let leaf = self.leaf(handle)?;
        let expected = Self::leaf_name(spec.task, spec.attempt);
        if leaf.name() != expected {
            return Err(WorkerError::Invalid {
                field: "sandbox handle".to_owned(),
                message: format!("{} is not the leaf of this attempt ({expected})", handle.id),
            });
        }
        if !leaf.exists() {
            return Err(WorkerError::runtime(
                PROCESS_RUNTIME,
                format!("{} does not exist; provision first", handle.id),
            ));
        }
        // A leaf an older worker provisioned may lack a v1 directory this one uses (the cpu
        // one): made now, or the shim could not join it.
        leaf.create().map_err(isolation)?;
        let files = AttemptFiles::new(&spec.dir, spec.attempt);
        self.remember(&leaf, files.clone())?;
        BoundaryNetwork::check_mode(spec.network, self.config.permits())?;

        // The exclusive create is the once-only guarantee: whoever creates it starts.
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&files.started)
        {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                tracing::info!(sandbox = %handle.id, "already started; not starting twice");
                return Ok(());
            }
            Err(e) => return Err(WorkerError::io("create start marker", &files.started, e)),
        }
        if let Some(user) = self.config.sandbox_user {
            // run/ too, so the user can read what staging wrote there: its mount is
            // read-only, so owning it grants no writes.
            for dir in [spec.dir.outbox(), spec.dir.run()] {
                user.hand_over(&dir)?;
            }
            user.share_work_tree(&spec.dir.inbox())?;
        }
        let progress = spec.dir.progress();
        fs::create_dir_all(&progress)
            .map_err(|e| WorkerError::io("create progress directory", &progress, e))?;
        let network = BoundaryNetwork::prepare(
            &self.config.network,
            spec.network,
            self.config.permits(),
            &handle.id,
            &files.network,
            spec.egress.is_some(),
        )?;
        let proxy = match &network {
            BoundaryNetwork::Gateway(net) => Some(self.serve_gateway(&leaf, net, &spec.dir).await?),
            _ => None,
        };
        if let Some(egress) = &spec.egress {
            serve_egress(egress, &network)?;
        }
        let boundary = self.boundary(spec, &network, proxy)?;
        let launch = SandboxLaunch {
            leaf,
            boundary,
            exit_code_file: files.exit_code,
            stdin: None,
            output_root: spec.dir.outbox(),
            stdout: spec.dir.stdout_log(),
            stderr: spec.dir.stderr_log(),
        };
        let process = tokio::task::spawn_blocking(move || SandboxProcess::spawn(&launch))
            .await
            .map_err(joined)?
            .map_err(isolation)?;
        tracing::info!(sandbox = %handle.id, shim = process.shim_pid(), "sandbox started");
        process.detach();
        Ok(())
    }

    async fn status(&self, handle: &SandboxHandle) -> Result<RunStatus, WorkerError> {
        let leaf = self.leaf(handle)?;
        let Some(files) = self.files(&leaf) else {
            if !leaf.exists() {
                return Ok(RunStatus::Vanished);
            }
            return Err(WorkerError::runtime(
                PROCESS_RUNTIME,
                format!(
                    "{} is not known in this life of the worker; adopt it first",
                    handle.id
                ),
            ));
        };
        if leaf.populated().map_err(isolation)? {
            return Ok(RunStatus::Running);
        }
        if let Some(code) = SandboxProcess::read_exit_code(&files.exit_code).map_err(isolation)? {
            return Ok(RunStatus::Exited { code });
        }
        if leaf.exists() && !files.started.exists() {
            return Ok(RunStatus::Created);
        }
        Ok(RunStatus::Vanished)
    }

    async fn terminate(&self, handle: &SandboxHandle, grace: Duration) -> Result<(), WorkerError> {
        let leaf = self.leaf(handle)?;
        let outcome = tokio::task::spawn_blocking(move || Termination::new(grace).run(&leaf))
            .await
            .map_err(joined)?
            .map_err(isolation)?;
        match outcome {
            TerminationOutcome::StillPopulated => tracing::warn!(
                sandbox = %handle.id,
                "still populated after SIGTERM, SIGKILL and cgroup.kill; destroy will retry"
            ),
            other => tracing::info!(sandbox = %handle.id, outcome = ?other, "terminated"),
        }
        Ok(())
    }

    async fn destroy(&self, handle: &SandboxHandle) -> Result<ReapReport, WorkerError> {
        let leaf = self.leaf(handle)?;
        let reaper = Reaper::new(self.config.reap_wait);
        let target = leaf.clone();
        let evidence = tokio::task::spawn_blocking(move || reaper.reap(&target))
            .await
            .map_err(joined)?
            .map_err(isolation)?;
        if !evidence.populated {
            let key = leaf.path().display().to_string();
            if let Some(proxy) = self.gateways.lock().await.remove(&key) {
                proxy.stop();
            }
            if let Some(files) = self.files(&leaf) {
                BoundaryNetwork::tear_down(&self.config.network, &files.network)?;
            }
            self.forget(&leaf);
        }
        Ok(ReapReport {
            sandbox: evidence.cgroup,
            populated: evidence.populated,
            observed_at_ms: evidence.observed_at_ms,
            detail: evidence.steps.join("; "),
        })
    }

    async fn adopt(
        &self,
        task: TaskId,
        attempt: u32,
        dir: &TaskDir,
    ) -> Result<Option<SandboxHandle>, WorkerError> {
        let leaf = self
            .root
            .leaf(&Self::leaf_name(task, attempt))
            .map_err(isolation)?;
        if !leaf.exists() {
            return Ok(None);
        }
        let files = AttemptFiles::new(dir, attempt);
        // A gateway sandbox still running lost its proxy with the worker's last life.
        if leaf.populated().map_err(isolation)? {
            if let Some(net) =
                BoundaryNetwork::recorded_gateway(&self.config.network, &files.network)?
            {
                self.serve_gateway(&leaf, &net, dir).await?;
                tracing::info!(task = %task, attempt, "gateway proxy served again for an adopted sandbox");
            }
        }
        self.remember(&leaf, files)?;
        Ok(Some(self.handle_for(&leaf)))
    }

    fn measures_usage(&self) -> bool {
        true
    }

    async fn usage(&self, handle: &SandboxHandle) -> Result<Option<LeafUsage>, WorkerError> {
        let leaf = self.leaf(handle)?;
        tokio::task::spawn_blocking(move || LeafUsage::of(&leaf))
            .await
            .map_err(joined)?
            .map_err(isolation)
    }

    async fn limits_hit(&self, handle: &SandboxHandle) -> Option<String> {
        let leaf = self.leaf(handle).ok()?;
        let hits = tokio::task::spawn_blocking(move || LimitHits::of(&leaf)).await;
        match hits {
            Ok(Ok(hits)) => hits?.describe(),
            Ok(Err(e)) => {
                tracing::warn!(sandbox = %handle.id, error = %e, "the leaf's limit counters");
                None
            }
            Err(_) => None,
        }
    }

    /// The worker's task leaves (its agents' project cgroups live beside them, named
    /// otherwise).
    async fn sandboxes(&self) -> Result<Vec<String>, WorkerError> {
        let names = self.root.leaf_names().map_err(isolation)?;
        Ok(names
            .into_iter()
            .filter(|n| n.starts_with(LEAF_NAME_PREFIX))
            .take(crate::runtime::SANDBOXES_LISTED_MAX)
            .collect())
    }

    async fn break_glass(&self, handle: &SandboxHandle) -> String {
        let leaf = match self.leaf(handle) {
            Ok(leaf) => leaf,
            Err(e) => return format!("no break-glass for {}: {e}", handle.id),
        };
        let procs = leaf.path().join("cgroup.procs");
        match leaf.sandboxed_procs().ok().and_then(|p| p.first().copied()) {
            Some(pid) => format!(
                "nsenter --target {pid} --mount --uts --ipc --net --pid --root --wd -- /bin/sh  \
                 # members: cat {}",
                procs.display()
            ),
            None => {
                let files = self
                    .files(&leaf)
                    .map(|f| format!("; the task's files are in {}", f.root.display()))
                    .unwrap_or_default();
                format!(
                    "nothing runs in {} (cat {}){files}",
                    leaf.path().display(),
                    procs.display()
                )
            }
        }
    }
}

/// What every task attempt's leaf name starts with ([`ProcessRuntime::leaf_name`]).
pub(crate) const LEAF_NAME_PREFIX: &str = "task-";

fn isolation(e: IsolationError) -> WorkerError {
    WorkerError::runtime(PROCESS_RUNTIME, e.to_string())
}

fn joined(e: tokio::task::JoinError) -> WorkerError {
    WorkerError::runtime(PROCESS_RUNTIME, format!("blocking task failed: {e}"))
}

/// For a sandbox adopted after a restart (`whose`, for the error): egress injection's proxy
/// served again in the namespace its network `record` names.
pub(crate) fn serve_egress_recorded(
    egress: &std::sync::Arc<crate::egress::EgressSession>,
    network: &NetworkConfig,
    record: &Path,
    whose: &dyn std::fmt::Display,
) -> Result<(), WorkerError> {
    let net = BoundaryNetwork::recorded(network, record)?.ok_or_else(|| WorkerError::Invalid {
        field: "network_mode".to_owned(),
        message: format!("{whose} has no network of its own to serve egress in"),
    })?;
    serve_egress(egress, &BoundaryNetwork::Own(net))
}

/// Serves egress injection's proxy on the loopback of the sandbox's own namespace, before the
/// provider can ask for it (a task's, or an agent generation's).
pub(crate) fn serve_egress(
    egress: &std::sync::Arc<crate::egress::EgressSession>,
    network: &BoundaryNetwork,
) -> Result<(), WorkerError> {
    let (BoundaryNetwork::Own(net) | BoundaryNetwork::Gateway(net)) = network else {
        return Err(WorkerError::Invalid {
            field: "network_mode".to_owned(),
            message: "credentials injected at egress need a network of the sandbox's own \
                      (isolated, outbound or gateway)"
                .to_owned(),
        });
    };
    let address = crate::egress::EgressSession::address();
    let listener =
        squadron_isolation::namespace_listener::bind_in_namespace(&net.netns_path(), address)
            .map_err(isolation)?;
    egress.serve(listener)
}
