//! The Docker runtime: one container per task attempt, driven through the engine API
//! (bollard), the seed's "Docker containers are supported as a parallel runtime".
//!
//! # The container
//!
//! `provision` creates — does not start — a container named `squadron-task-<task>-a<attempt>`
//! from the agent image (built locally by `scripts/build-agent-image`, no registry), labelled
//! `squadron.task`, `squadron.attempt`, `squadron.worker` and `squadron.managed=true` so a
//! restarted worker finds it again (`adopt`). The task directory is bind-mounted:
//!
//! | host            | container      | mode |
//! |-----------------|----------------|------|
//! | `inbox/`        | `/mnt/inbox`   | rw   |
//! | `outbox/`       | `/mnt/outbox`  | rw   |
//! | `run/`          | `/mnt/run`     | ro   |
//! | global dir      | `/mnt/global`  | ro   |
//! | `agent/`        | `/run/squadron/agent` | rw |
//! | the worker's `squadron` binary | `/usr/local/bin/squadron` | ro |
//! | the libraries it links beyond the image's | `/usr/local/lib/squadron` | ro |
//!
//! With an agent binary configured (`squadron worker` always sets its own), the container's
//! command is `squadron agent -- <argv>` (`task::sandbox_agent`): the container starts at
//! PROVISIONING, the agent enrolls and registers through its relay sockets in `agent/`, and
//! starts the launcher once the task is RUNNING; `start` then finds the container running
//! and does nothing. Without one, the command is the launch spec's argv itself.
//!
//! The command is the launch spec's argv, its working directory the spec's, and its
//! environment the spec's allowlist only (the engine adds `PATH` and `HOSTNAME`). CPU, memory
//! (with swap equal to memory, so no swap) and pid limits come from the manifest.
//!
//! # Network modes
//!
//! - `isolated` → network mode `none`: a private namespace with only `lo`.
//! - `outbound` → the worker's managed network (`docker_network`): a private namespace on a
//!   bridge of the worker's own with the engine's NAT, no published ports, no traffic between
//!   containers, and the egress filter the process runtime uses: the host itself, link-local
//!   and the metadata address, every sandbox range and the deny list are unreachable.
//! - `gateway` → the worker's gateway bridge (`docker_network`): nothing is forwarded; the
//!   one address a container reaches is the worker's HTTP CONNECT proxy on the bridge
//!   (`runtime::gateway`), named in its `HTTPS_PROXY`, which admits it by its address once
//!   `start` (or `adopt`) has seen it and logs each connection to the task's events.
//! - `full` → network mode `host`: the host's own namespace, including services the host
//!   binds to 127.0.0.1 and the right to listen on host ports; refused, naming
//!   `network_mode`, unless the worker runs with `--allow-full-network`.
//!
//! # Hardened versus full control
//!
//! By default the container is hardened: every capability dropped, `no-new-privileges`, a
//! read-only root filesystem with a tmpfs `/tmp`, and the process never runs as root: as
//! the owner of the task's inbox when the worker is an ordinary user (it keeps the files it
//! writes the worker's), else as the sandbox user (nobody), to whom `provision` gives the
//! outbox and run directories and with whom it shares the inbox (`runtime::sandbox_user`).
//!
//! A manifest that asks for the seed's full-control mode ("the agent has full control within
//! container limits": install software, modify system configuration) gets instead: the
//! engine's default capability set (chown, dac_override, fowner, setuid/setgid, net_bind_service,
//! kill, … but not sys_admin, net_admin or sys_module), setuid binaries working, root as the
//! user and a writable root filesystem. It never gets `privileged`, extra devices, host
//! mounts beyond the task's, or the engine socket: the limits, the namespaces, the engine's
//! seccomp profile and the network mode still hold.
//!
//! Both modes run the engine's init (`docker-init`) as pid 1: the provider is then not pid 1,
//! so a SIGTERM it does not handle still ends it, and orphaned children are reaped. The
//! launch script redirects its own output into the progress files; the engine's log only
//! catches what comes before that, capped at `LOG_FILE_BYTES_MAX`.
//!
//! # Warm containers
//!
//! With `--docker-warm-pool N`, a task of the default shape claims a container started before
//! it came instead (`warm_pool`): same image, user, hardening and network, the task's
//! directories bound in beneath its slot, its limits set at the claim.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::{
    Config, CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
    StopContainerOptions,
};
use bollard::models::{
    ContainerInspectResponse, ContainerStateStatusEnum, ContainerSummary, HostConfig,
    HostConfigLogConfig, Mount, MountTypeEnum,
};
use bollard::{Docker, API_DEFAULT_VERSION};
use squadron_core::ids::{TaskId, WorkerId};
use squadron_core::manifest::{NetworkMode, RuntimeKind};
use squadron_isolation::NetworkConfig;

use crate::error::WorkerError;
use crate::runtime::agent_libraries::AGENT_LIBRARY_DIR;
use crate::runtime::boundary_network::{BoundaryNetwork, NetworkPermits};
use crate::runtime::docker_network::ManagedNetwork;
use crate::runtime::gateway::{self, Destinations, GatewayProxy, GATEWAY_PORT};
use crate::runtime::sandbox_user::SandboxUser;
use crate::runtime::{LaunchSpec, ReapReport, RunStatus, Runtime, SandboxHandle};
use crate::support::now_ms;
use crate::task::sandbox_agent::{self, AGENT_BINARY_MOUNT, AGENT_DIR_MOUNT};
use crate::task::task_dir::{TaskDir, GLOBAL_MOUNT, INBOX_MOUNT, OUTBOX_MOUNT, RUN_MOUNT};
pub(crate) use warm_pool::{PoolFigures, WarmPoolConfig, WARM_POOL_SIZE_MAX};
use warm_pool::{WarmPool, LABEL_POOL_SLOT};

/// The engine socket when the configuration names none.
pub(crate) const DEFAULT_SOCKET: &str = "/var/run/docker.sock";
/// The agent image `scripts/build-agent-image` builds.
pub(crate) const DEFAULT_IMAGE: &str = "squadron-agent:latest";

/// Label with the task id; with the attempt and managed labels, what `adopt` searches by.
pub(crate) const LABEL_TASK: &str = "squadron.task";
/// Label with the attempt number of the task.
pub(crate) const LABEL_ATTEMPT: &str = "squadron.attempt";
/// Label with the id of the worker that created the container.
pub(crate) const LABEL_WORKER: &str = "squadron.worker";
/// Label `true` on every container Squadron created.
pub(crate) const LABEL_MANAGED: &str = "squadron.managed";
/// Label with the host path of the task directory: task ids restart with every cluster, so
/// only the directory tells this worker's attempt from a leftover of another cluster or data
/// directory that happens to share the task id.
pub(crate) const LABEL_TASK_DIR: &str = "squadron.task-dir";

const RUNTIME_NAME: &str = "docker";
/// Every engine request but `stop` (which waits out the grace period) ends within this.
const REQUEST_TIMEOUT_SECS: u64 = 60;
/// How long a `stop` request may take beyond its grace period: the SIGKILL and the exit.
const STOP_MARGIN_SECS: u64 = 30;
/// How long `destroy` waits for the engine to report the container gone.
const REAP_WAIT_MS_MAX: u64 = 30_000;
const REAP_POLL_MS: u64 = 100;
/// The tmpfs `/tmp` of a hardened container (also charged to its memory limit).
const TMP_TMPFS_BYTES_MAX: u64 = 512 * 1024 * 1024;
/// The engine's own log of the container: only output before the launch script redirects.
const LOG_FILE_BYTES_MAX: u64 = 1024 * 1024;
const LOG_FILES_MAX: u32 = 2;
const NANO_CPUS_PER_CPU: i64 = 1_000_000_000;

/// How the worker reaches its Docker engine and what it runs there.
#[derive(Debug, Clone)]
pub(crate) struct DockerConfig {
    /// The engine's unix socket.
    pub(crate) socket: PathBuf,
    /// The agent image every container starts from.
    pub(crate) image: String,
    /// Written into the `squadron.worker` label.
    pub(crate) worker: WorkerId,
    /// Mounted read-only at `/mnt/global` when the launch spec brings no global directory.
    pub(crate) global_dir: Option<PathBuf>,
    /// Who a hardened container of a root worker runs as (never root).
    pub(crate) sandbox_user: SandboxUser,
    /// Whether `network_mode: full` (network mode `host`) may run here.
    pub(crate) allow_full_network: bool,
    /// Tag, `nft` and deny list of the managed network `outbound` containers join.
    pub(crate) network: NetworkConfig,
    /// What `gateway` containers may reach; `None`: the mode is refused.
    pub(crate) gateway: Option<Arc<Destinations>>,
    /// The `squadron` binary containers run `squadron agent` from; unset, they start the
    /// launcher directly.
    pub(crate) agent_binary: Option<PathBuf>,
    /// The libraries that binary links beyond the image's C runtime (`agent_libraries`),
    /// bound read-only at `AGENT_LIBRARY_DIR`.
    pub(crate) agent_libraries: Option<PathBuf>,
    /// Warm containers kept started for claims (`warm_pool`); `None`: every start is cold.
    pub(crate) warm_pool: Option<WarmPoolConfig>,
}

impl DockerConfig {
    /// The default socket and image for this worker.
    pub(crate) fn new(worker: WorkerId) -> Self {
        let worker_tag = worker.clone();
        DockerConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            image: DEFAULT_IMAGE.to_string(),
            worker,
            global_dir: None,
            sandbox_user: SandboxUser::default(),
            allow_full_network: false,
            network: NetworkConfig::new(worker_tag.as_str()),
            gateway: None,
            agent_binary: None,
            agent_libraries: None,
            warm_pool: None,
        }
    }
}

/// A connection to one Docker engine, at the API version both sides speak.
#[derive(Debug, Clone)]
pub(crate) struct DockerRuntime {
    docker: Docker,
    config: DockerConfig,
    /// The network `outbound` containers join.
    managed: ManagedNetwork,
    /// The bridge `gateway` containers join and its proxy, where the worker allows the mode.
    gateway: Option<Arc<GatewayBridge>>,
    pool: Option<Arc<WarmPool>>,
}

/// The gateway bridge, its proxy, and the address each of its containers was admitted by.
#[derive(Debug)]
struct GatewayBridge {
    network: ManagedNetwork,
    proxy: GatewayProxy,
    /// Container id → its address on the bridge.
    admitted: Mutex<HashMap<String, Ipv4Addr>>,
}

impl DockerRuntime {
    /// Connects to the engine, negotiates the API version down to the engine's, and checks
    /// that the agent image exists, so a worker without it fails at start and not per task.
    pub(crate) async fn connect(config: DockerConfig) -> Result<Self, WorkerError> {
        let socket = config.socket.to_str().ok_or_else(|| WorkerError::Invalid {
            field: "docker.socket".to_string(),
            message: format!("{} is not valid UTF-8", config.socket.display()),
        })?;
        let docker = Docker::connect_with_socket(socket, REQUEST_TIMEOUT_SECS, API_DEFAULT_VERSION)
            .map_err(|e| {
                WorkerError::runtime(
                    RUNTIME_NAME,
                    format!(
                        "cannot use the engine socket {socket}: {e} (is dockerd running? \
                         start it with `dockerd` or `systemctl start docker`)"
                    ),
                )
            })?;
        let docker = docker.negotiate_version().await.map_err(|e| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "the engine at {socket} is not reachable: {e} (is dockerd running? \
                     start it with `dockerd` or `systemctl start docker`)"
                ),
            )
        })?;
        match docker.inspect_image(&config.image).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {
                return Err(WorkerError::runtime(
                    RUNTIME_NAME,
                    format!(
                        "agent image {} not found in the engine at {socket}: build it with \
                         scripts/build-agent-image",
                        config.image
                    ),
                ))
            }
            Err(e) => return Err(engine_error(&format!("inspect image {}", config.image), e)),
        }
        tracing::info!(
            socket,
            api_version = %docker.client_version(),
            image = %config.image,
            "connected to the Docker engine"
        );
        let (managed, _) = ManagedNetwork::ensure(
            &docker,
            &config.network,
            ManagedNetwork::for_owner(&config.network.owner),
        )
        .await?;
        let gateway = match &config.gateway {
            Some(destinations) => Some(Arc::new(
                GatewayBridge::start(&docker, &config.network, destinations.clone()).await?,
            )),
            None => None,
        };
        let pool = match &config.warm_pool {
            // Without root nothing beneath the slots can be unbound; a pool asked for says so.
            Some(c) if c.size == 0 && !rustix::process::geteuid().is_root() => None,
            Some(c) if c.needed() => Some(Arc::new(WarmPool::new(c.clone())?)),
            _ => None,
        };
        let runtime = DockerRuntime {
            docker,
            config,
            managed,
            gateway,
            pool,
        };
        match &runtime.pool {
            Some(pool) => runtime.start_pool(pool).await?,
            None => {
                runtime.remove_idle_warm().await?;
            }
        }
        Ok(runtime)
    }

    /// Whether the container is this attempt's: by its labels, or, for a claimed warm
    /// container (whose labels were set before its task was known), by the attempt's name.
    fn is_attempts(&self, found: &ContainerInspectResponse, dir: &TaskDir, attempt: u32) -> bool {
        let labels = found
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if labels_match(&labels, dir, attempt) {
            return true;
        }
        let name = format!("/{}", Self::container_name(dir, attempt));
        labels.contains_key(LABEL_POOL_SLOT)
            && labels.get(LABEL_WORKER) == Some(&self.config.worker.as_str().to_string())
            && found.name.as_deref() == Some(name.as_str())
    }

    fn permits(&self) -> NetworkPermits {
        NetworkPermits {
            full: self.config.allow_full_network,
            gateway: self.gateway.is_some(),
        }
    }

    /// Admits a started gateway container's address to the proxy, for its task's events.
    async fn admit_gateway(&self, id: &str, dir: &TaskDir) -> Result<(), WorkerError> {
        let Some(gateway) = &self.gateway else {
            return Ok(());
        };
        let Some(found) = self.inspect(id).await? else {
            return Ok(());
        };
        let address = found
            .network_settings
            .and_then(|s| s.networks)
            .and_then(|n| n.get(&gateway.network.name).cloned())
            .and_then(|endpoint| endpoint.ip_address)
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let Some(address) = address else {
            // Not on the gateway bridge (another mode), or not running.
            return Ok(());
        };
        gateway.proxy.admit(address, dir.clone());
        gateway
            .admitted
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id.to_owned(), address);
        tracing::debug!(container = %id, %address, "admitted to the gateway proxy");
        Ok(())
    }

    fn forget_gateway(&self, id: &str) {
        if let Some(gateway) = &self.gateway {
            let address = gateway
                .admitted
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .remove(id);
            if let Some(address) = address {
                gateway.proxy.forget(address);
            }
        }
    }

    /// The engine network mode for a manifest network mode (see the module docs).
    pub(crate) fn network_mode(&self, mode: NetworkMode) -> String {
        match (mode, &self.gateway) {
            (NetworkMode::Isolated, _) => "none".to_owned(),
            (NetworkMode::Outbound, _) => self.managed.name.clone(),
            (NetworkMode::Full, _) => "host".to_owned(),
            (NetworkMode::Gateway, Some(g)) => g.network.name.clone(),
            // Refused before a container is made (`check_mode`); never a way out.
            (NetworkMode::Gateway, None) => "none".to_owned(),
        }
    }

    #[cfg(test)]
    /// The API version negotiated with the engine, e.g. `1.41`.
    pub(crate) fn api_version(&self) -> String {
        self.docker.client_version().to_string()
    }

    /// The container name of one attempt of a task (see [`LABEL_TASK_DIR`]).
    pub(crate) fn container_name(dir: &TaskDir, attempt: u32) -> String {
        crate::runtime::sandbox_name(dir, attempt)
    }

    fn labels(&self, dir: &TaskDir, attempt: u32) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_TASK.to_string(), dir.task().get().to_string()),
            (LABEL_ATTEMPT.to_string(), attempt.to_string()),
            (LABEL_TASK_DIR.to_string(), task_dir_label(dir)),
            (
                LABEL_WORKER.to_string(),
                self.config.worker.as_str().to_string(),
            ),
            (LABEL_MANAGED.to_string(), "true".to_string()),
        ])
    }

    /// The full container configuration for one launch spec.
    fn container_config(&self, spec: &LaunchSpec) -> Result<Config<String>, WorkerError> {
        check_launch(spec)?;
        let mut host = self.host_config(spec)?;
        let mut env = spec.env.clone();
        let user = if spec.full_control {
            // The image's user, root: installing software needs it.
            None
        } else {
            harden(&mut host);
            let user = self.hardened_user(spec)?;
            if user == self.config.sandbox_user {
                SandboxUser::git_env(&mut env);
            }
            Some(format!("{}:{}", user.uid, user.gid))
        };
        let cmd = match self.config.agent_binary {
            Some(_) => sandbox_agent::agent_argv(&spec.argv),
            None => spec.argv.clone(),
        };
        if self.config.agent_binary.is_some() && self.config.agent_libraries.is_some() {
            // For the agent only: it drops the variable before it starts the provider.
            env.insert("LD_LIBRARY_PATH".into(), AGENT_LIBRARY_DIR.into());
        }
        if let (NetworkMode::Gateway, Some(g)) = (spec.network, &self.gateway) {
            gateway::proxy_env(g.address(), &mut env);
        }
        Ok(Config {
            image: Some(self.config.image.clone()),
            cmd: Some(cmd),
            // The image's entrypoint, if any, must not wrap the provider.
            entrypoint: Some(Vec::new()),
            working_dir: Some(spec.workdir.clone()),
            env: Some(env.iter().map(|(k, v)| format!("{k}={v}")).collect()),
            user,
            labels: Some(self.labels(&spec.dir, spec.attempt)),
            stop_signal: Some("SIGTERM".to_string()),
            attach_stdin: Some(false),
            attach_stdout: Some(false),
            attach_stderr: Some(false),
            open_stdin: Some(false),
            tty: Some(false),
            host_config: Some(host),
            ..Default::default()
        })
    }

    /// Who a hardened container runs as: the inbox's owner when that is not root (a worker
    /// running as an ordinary user), else the sandbox user.
    fn hardened_user(&self, spec: &LaunchSpec) -> Result<SandboxUser, WorkerError> {
        let inbox = spec.dir.inbox();
        let meta = std::fs::metadata(&inbox)
            .map_err(|e| WorkerError::io("read the owner of the inbox", &inbox, e))?;
        if meta.uid() == 0 {
            return Ok(self.config.sandbox_user);
        }
        Ok(SandboxUser {
            uid: meta.uid(),
            gid: meta.gid(),
        })
    }

    /// A hardened container of a root worker runs as the sandbox user: the outbox and run
    /// directories become that user's and the inbox is shared with it, as in the process
    /// runtime.
    fn hand_over(&self, spec: &LaunchSpec) -> Result<(), WorkerError> {
        if spec.full_control || self.hardened_user(spec)? != self.config.sandbox_user {
            return Ok(());
        }
        let user = self.config.sandbox_user;
        user.hand_over(&spec.dir.outbox())?;
        user.hand_over(&spec.dir.run())?;
        user.share_work_tree(&spec.dir.inbox())
    }

    /// The task's own directories, as (host directory, path in the container, read-only,
    /// field named in an error): what a warm container gets bound in when it is claimed.
    fn task_binds(&self, spec: &LaunchSpec) -> Vec<(PathBuf, String, bool, &'static str)> {
        let mut binds = vec![
            (spec.dir.inbox(), INBOX_MOUNT.to_owned(), false, "inbox"),
            (spec.dir.outbox(), OUTBOX_MOUNT.to_owned(), false, "outbox"),
            (spec.dir.run(), RUN_MOUNT.to_owned(), true, "run"),
        ];
        if let Some(global) = spec.global_dir.as_ref().or(self.config.global_dir.as_ref()) {
            binds.push((global.clone(), GLOBAL_MOUNT.to_owned(), true, "global_dir"));
        }
        if self.config.agent_binary.is_some() {
            binds.push((spec.dir.agent(), AGENT_DIR_MOUNT.to_owned(), false, "agent"));
        }
        if let Some(session) = &spec.credentials {
            // The container config holds the path, never a value (INV-13).
            binds.push((
                session.host_dir().to_path_buf(),
                session.sandbox_dir().to_owned(),
                true,
                "credentials",
            ));
        }
        binds
    }

    /// The worker's own files every container with the agent gets: the binary and its
    /// libraries.
    fn agent_mounts(&self) -> Result<Vec<Mount>, WorkerError> {
        let mut mounts = Vec::new();
        if let Some(binary) = &self.config.agent_binary {
            mounts.push(bind_file(binary, AGENT_BINARY_MOUNT, "agent_binary")?);
            if let Some(libraries) = &self.config.agent_libraries {
                mounts.push(bind(libraries, AGENT_LIBRARY_DIR, true, "agent_libraries")?);
            }
        }
        Ok(mounts)
    }

    /// The mounts, network, limits and logging of an attempt's container.
    fn host_config(&self, spec: &LaunchSpec) -> Result<HostConfig, WorkerError> {
        let mut mounts = Vec::new();
        for (host, target, read_only, field) in self.task_binds(spec) {
            mounts.push(bind(&host, &target, read_only, field)?);
        }
        mounts.extend(self.agent_mounts()?);
        let mut host = base_host_config(mounts, self.network_mode(spec.network));
        let limits = EngineLimits::of(&spec.limits)?;
        host.nano_cpus = limits.nano_cpus;
        host.memory = limits.memory;
        host.memory_swap = limits.memory;
        host.pids_limit = limits.pids;
        Ok(host)
    }

    /// Removes the container with force (SIGKILL to what runs) and its anonymous volumes;
    /// `false` when the engine no longer knew it.
    async fn remove_forced(&self, id: &str) -> Result<bool, WorkerError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            link: false,
        };
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(true),
            Err(e) if is_not_found(&e) => Ok(false),
            Err(e) => Err(engine_error(&format!("remove container {id}"), e)),
        }
    }

    /// The container by id or name; `None` once the engine no longer knows it.
    async fn inspect(&self, id: &str) -> Result<Option<ContainerInspectResponse>, WorkerError> {
        match self.docker.inspect_container(id, None).await {
            Ok(found) => Ok(Some(found)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(engine_error(&format!("inspect container {id}"), e)),
        }
    }

    /// The containers, running or not, that carry every one of `labels` (`key=value`).
    async fn labelled(
        &self,
        labels: Vec<String>,
        what: &str,
    ) -> Result<Vec<ContainerSummary>, WorkerError> {
        let filters = HashMap::from([("label".to_string(), labels)]);
        self.docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters,
                ..Default::default()
            }))
            .await
            .map_err(|e| engine_error(what, e))
    }

    /// The container `provision` met under its name: ours when its labels say so.
    async fn existing_for(
        &self,
        name: &str,
        dir: &TaskDir,
        attempt: u32,
    ) -> Result<SandboxHandle, WorkerError> {
        let task = dir.task();
        let found = self.inspect(name).await?.ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!("container {name} conflicted on create but is gone now; retry"),
            )
        })?;
        let labels = found
            .config
            .as_ref()
            .and_then(|c| c.labels.clone())
            .unwrap_or_default();
        if !labels_match(&labels, dir, attempt) {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "a container named {name} exists but is not labelled as task {task} \
                     attempt {attempt}; remove it by hand"
                ),
            ));
        }
        let id = found.id.ok_or_else(|| {
            WorkerError::runtime(RUNTIME_NAME, format!("container {name} has no id"))
        })?;
        tracing::info!(container = %id, %task, attempt, "re-using the container an earlier life created");
        Ok(SandboxHandle {
            runtime: RuntimeKind::Docker,
            id,
        })
    }
}

#[async_trait]
impl Runtime for DockerRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Docker
    }

    fn runs_agent(&self) -> bool {
        self.config.agent_binary.is_some()
    }

    fn pool_figures(&self) -> Option<PoolFigures> {
        self.pool.as_ref().map(|p| p.figures())
    }

    async fn drain_idle(&self) -> Result<(), WorkerError> {
        self.drain_pool().await
    }

    /// Only with the agent: it starts the provider once RUNNING, after the proxy listens;
    /// a container that runs its provider from the start could ask before that.
    fn serves_egress(&self) -> bool {
        self.runs_agent()
    }

    /// Binds the proxy's listener in the running container's own network namespace (its
    /// init's), so the provider reaches it on the container's loopback.
    async fn serve_egress(
        &self,
        handle: &SandboxHandle,
        egress: &Arc<crate::egress::EgressSession>,
    ) -> Result<(), WorkerError> {
        let id = docker_id(handle)?;
        let found = self.inspect(id).await?;
        let pid = found
            .and_then(|c| c.state)
            .and_then(|s| s.pid)
            .filter(|pid| *pid > 0)
            .ok_or_else(|| {
                WorkerError::runtime(
                    RUNTIME_NAME,
                    format!("container {id} is not running: no network to serve egress in"),
                )
            })?;
        let netns = PathBuf::from(format!("/proc/{pid}/ns/net"));
        let address = crate::egress::EgressSession::address();
        let listener = squadron_isolation::namespace_listener::bind_in_namespace(&netns, address)
            .map_err(|e| WorkerError::runtime(RUNTIME_NAME, e.to_string()))?;
        egress.serve(listener)
    }

    fn sandbox_owner(&self, spec: &LaunchSpec) -> Result<(u32, u32), WorkerError> {
        if spec.full_control {
            return Ok((0, 0));
        }
        Ok(self.hardened_user(spec)?.pair())
    }

    /// Creates the container; if this attempt's container already exists (a previous life
    /// crashed between create and checkpoint), returns it instead.
    async fn provision(&self, spec: &LaunchSpec) -> Result<SandboxHandle, WorkerError> {
        BoundaryNetwork::check_mode(spec.network, self.permits())?;
        if let Some(claimed) = self.claim_warm(spec).await {
            return Ok(claimed);
        }
        self.hand_over(spec)?;
        let config = self.container_config(spec)?;
        let name = Self::container_name(&spec.dir, spec.attempt);
        let options = CreateContainerOptions {
            name: name.clone(),
            platform: None,
        };
        match self.docker.create_container(Some(options), config).await {
            Ok(created) => {
                for warning in &created.warnings {
                    tracing::warn!(container = %created.id, %warning, "engine warning on create");
                }
                tracing::info!(container = %created.id, %name, "provisioned container");
                Ok(SandboxHandle {
                    runtime: RuntimeKind::Docker,
                    id: created.id,
                })
            }
            Err(e) if status_code(&e) == Some(409) => {
                self.existing_for(&name, &spec.dir, spec.attempt).await
            }
            Err(e) if is_not_found(&e) => Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "create container {name}: image {} not found ({e}); build it with \
                     scripts/build-agent-image",
                    self.config.image
                ),
            )),
            Err(e) => Err(engine_error(&format!("create container {name}"), e)),
        }
    }

    /// Starts the container only while it is still `created`: a container that already ran
    /// (started by an earlier life of the worker) is never started a second time.
    async fn start(&self, handle: &SandboxHandle, spec: &LaunchSpec) -> Result<(), WorkerError> {
        let id = docker_id(handle)?;
        let found = self.inspect(id).await?.ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!("container {id} vanished before start"),
            )
        })?;
        if !self.is_attempts(&found, &spec.dir, spec.attempt) {
            return Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!(
                    "container {id} is not labelled as task {} attempt {}",
                    spec.task, spec.attempt
                ),
            ));
        }
        // A claimed warm container runs already; its agent waits for the launch.
        if let Some(slot) = pool_slot(&found) {
            self.give_launch(slot, spec)?;
        }
        let status = found.state.as_ref().and_then(|s| s.status);
        if status != Some(ContainerStateStatusEnum::CREATED) {
            tracing::info!(container = %id, ?status, "container already started; not starting it again");
            return self.admit_gateway(id, &spec.dir).await;
        }
        self.docker
            .start_container::<String>(id, None)
            .await
            .map_err(|e| engine_error(&format!("start container {id}"), e))?;
        self.admit_gateway(id, &spec.dir).await
    }

    async fn status(&self, handle: &SandboxHandle) -> Result<RunStatus, WorkerError> {
        let id = docker_id(handle)?;
        let Some(found) = self.inspect(id).await? else {
            return Ok(RunStatus::Vanished);
        };
        let state = found.state.unwrap_or_default();
        match state.status {
            Some(ContainerStateStatusEnum::CREATED) => Ok(RunStatus::Created),
            Some(
                ContainerStateStatusEnum::RUNNING
                | ContainerStateStatusEnum::PAUSED
                | ContainerStateStatusEnum::RESTARTING,
            ) => Ok(RunStatus::Running),
            Some(
                ContainerStateStatusEnum::EXITED
                | ContainerStateStatusEnum::DEAD
                | ContainerStateStatusEnum::REMOVING,
            ) => {
                let code = state.exit_code.ok_or_else(|| {
                    WorkerError::runtime(
                        RUNTIME_NAME,
                        format!("container {id} stopped without an exit code"),
                    )
                })?;
                let code = i32::try_from(code).map_err(|_| {
                    WorkerError::runtime(
                        RUNTIME_NAME,
                        format!("container {id} reports exit code {code} out of range"),
                    )
                })?;
                if state.oom_killed == Some(true) {
                    tracing::warn!(container = %id, code, "the provider was killed for memory");
                }
                Ok(RunStatus::Exited { code })
            }
            Some(ContainerStateStatusEnum::EMPTY) | None => Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!("container {id} reports no state"),
            )),
        }
    }

    /// The engine's own account: a container whose cgroup met its memory limit is marked
    /// OOMKilled (the pids limit leaves no mark Docker reports).
    async fn limits_hit(&self, handle: &SandboxHandle) -> Option<String> {
        let id = docker_id(handle).ok()?;
        let found = self.inspect(id).await.ok()??;
        if found.state?.oom_killed != Some(true) {
            return None;
        }
        let limit = found
            .host_config
            .and_then(|h| h.memory)
            .filter(|b| *b > 0)
            .map(|b| format!(" of {b} bytes"))
            .unwrap_or_default();
        Some(format!(
            "the memory limit{limit} was reached: the kernel killed the container's process(es) \
             out of memory"
        ))
    }

    /// `docker stop -t <grace>`: SIGTERM to the init, which forwards it to the provider, and
    /// SIGKILL to the whole container once the grace period (rounded up to seconds) is over.
    async fn terminate(&self, handle: &SandboxHandle, grace: Duration) -> Result<(), WorkerError> {
        let id = docker_id(handle)?;
        let grace_secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let t = i64::try_from(grace_secs)
            .map_err(|_| invalid("grace", format!("{grace:?} is too long")))?;
        // The engine answers only once the container stopped, after at most the grace period.
        let docker = self
            .docker
            .clone()
            .with_timeout(Duration::from_secs(grace_secs + STOP_MARGIN_SECS));
        match docker
            .stop_container(id, Some(StopContainerOptions { t }))
            .await
        {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => return Ok(()),
            Err(e) => return Err(engine_error(&format!("stop container {id}"), e)),
        }
        match self.status(handle).await? {
            RunStatus::Running => Err(WorkerError::runtime(
                RUNTIME_NAME,
                format!("container {id} still runs after stop"),
            )),
            _ => Ok(()),
        }
    }

    /// Removes the container with force (SIGKILL to what is left) and proves it gone: the
    /// report is written only once the engine answers 404 for it.
    async fn destroy(&self, handle: &SandboxHandle) -> Result<ReapReport, WorkerError> {
        let id = docker_id(handle)?;
        let sandbox = format!("docker:{id}");
        let mut steps = Vec::new();
        self.forget_gateway(id);
        let found = self.inspect(id).await?;
        let slot = found.as_ref().and_then(pool_slot).map(str::to_owned);
        match found {
            None => steps.push("already removed".to_string()),
            Some(found) => {
                let state = found.state.unwrap_or_default();
                let status = state
                    .status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "unknown".to_string());
                match state.exit_code {
                    Some(code) if state.running != Some(true) => {
                        steps.push(format!("was {status} (exit code {code})"))
                    }
                    _ => steps.push(format!("was {status}")),
                }
                match self.remove_forced(id).await? {
                    true => steps.push("removed with force".to_string()),
                    false => steps.push("gone before removal".to_string()),
                }
            }
        }
        let deadline = tokio::time::Instant::now() + Duration::from_millis(REAP_WAIT_MS_MAX);
        while self.inspect(id).await?.is_some() {
            if tokio::time::Instant::now() >= deadline {
                return Err(WorkerError::runtime(
                    RUNTIME_NAME,
                    format!("container {id} still exists {REAP_WAIT_MS_MAX} ms after removal"),
                ));
            }
            tokio::time::sleep(Duration::from_millis(REAP_POLL_MS)).await;
        }
        steps.push("engine reports no such container".to_string());
        self.clear_claimed_slot(id, slot.as_deref());
        Ok(ReapReport {
            sandbox,
            populated: false,
            observed_at_ms: now_ms(),
            detail: steps.join("; "),
        })
    }

    /// Finds the attempt's container by its labels, running or not.
    async fn adopt(
        &self,
        task: TaskId,
        attempt: u32,
        dir: &TaskDir,
    ) -> Result<Option<SandboxHandle>, WorkerError> {
        let labels = vec![
            format!("{LABEL_TASK}={}", task.get()),
            format!("{LABEL_ATTEMPT}={attempt}"),
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_TASK_DIR}={}", task_dir_label(dir)),
        ];
        let found = self
            .labelled(labels, &format!("list containers of task {task}"))
            .await?;
        let name = format!("/{}", Self::container_name(dir, attempt));
        let chosen = match found.len() {
            0 => return self.adopt_claimed(dir, attempt).await,
            1 => found.into_iter().next(),
            _ => {
                // Only the container under the attempt's own name is ours; the name is unique.
                let ids: Vec<String> = found.iter().filter_map(|c| c.id.clone()).collect();
                let named = found
                    .into_iter()
                    .find(|c| c.names.as_ref().is_some_and(|names| names.contains(&name)));
                if named.is_none() {
                    return Err(WorkerError::runtime(
                        RUNTIME_NAME,
                        format!(
                            "{} containers carry the labels of task {task} attempt {attempt} \
                             and none is named {name}: {}",
                            ids.len(),
                            ids.join(", ")
                        ),
                    ));
                }
                named
            }
        };
        let id = chosen.and_then(|c| c.id).ok_or_else(|| {
            WorkerError::runtime(
                RUNTIME_NAME,
                format!("the container of task {task} attempt {attempt} has no id"),
            )
        })?;
        tracing::info!(container = %id, %task, attempt, "adopted container");
        self.admit_gateway(&id, dir).await?;
        Ok(Some(SandboxHandle {
            runtime: RuntimeKind::Docker,
            id,
        }))
    }

    /// This worker's containers, running or not, by name; idle warm containers hold no
    /// task and are not listed.
    async fn sandboxes(&self) -> Result<Vec<String>, WorkerError> {
        let labels = vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_WORKER}={}", self.config.worker.as_str()),
        ];
        let found = self
            .labelled(labels, "list this worker's containers")
            .await?;
        let mut names: Vec<String> = found
            .into_iter()
            .filter_map(|c| c.names?.into_iter().next())
            .map(|n| n.trim_start_matches('/').to_owned())
            .filter(|n| !Self::is_idle_warm_name(n))
            .take(crate::runtime::SANDBOXES_LISTED_MAX)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn break_glass(&self, handle: &SandboxHandle) -> String {
        let id = &handle.id;
        format!(
            "Direct access (dev/break-glass, bypasses the gateway's audit): docker exec -it {id} sh \
             — if the provider has exited, inspect a copy instead of restarting it: \
             docker commit {id} squadron-preserved:{short} && \
             docker run --rm -it --entrypoint /bin/sh squadron-preserved:{short}; \
             remove it when done: docker rm -f {id}",
            short = id.get(..12).unwrap_or(id)
        )
    }
}

impl GatewayBridge {
    /// Makes (or finds) the gateway bridge, installs its filter and serves its proxy on the
    /// bridge's address.
    async fn start(
        docker: &Docker,
        config: &NetworkConfig,
        destinations: Arc<Destinations>,
    ) -> Result<GatewayBridge, WorkerError> {
        let (network, address) = ManagedNetwork::ensure(
            docker,
            config,
            ManagedNetwork::gateway_for_owner(&config.owner, GATEWAY_PORT),
        )
        .await?;
        let proxy = GatewayProxy::start(
            SocketAddrV4::new(address, GATEWAY_PORT).into(),
            destinations,
        )
        .await?;
        Ok(GatewayBridge {
            network,
            proxy,
            admitted: Mutex::new(HashMap::new()),
        })
    }

    /// Where the bridge's containers find the proxy.
    fn address(&self) -> SocketAddrV4 {
        match self.proxy.addr() {
            std::net::SocketAddr::V4(a) => a,
            // Bound from an IPv4 address in `start`.
            std::net::SocketAddr::V6(_) => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, GATEWAY_PORT),
        }
    }
}

/// A launch the Docker runtime can run: its own task directory, a program, an absolute
/// working directory.
fn check_launch(spec: &LaunchSpec) -> Result<(), WorkerError> {
    if spec.task != spec.dir.task() {
        return Err(invalid(
            "launch.task",
            format!(
                "task {} does not match the task directory of task {}",
                spec.task,
                spec.dir.task()
            ),
        ));
    }
    if spec.argv.is_empty() {
        return Err(invalid("launch.argv", "must name a program".to_string()));
    }
    if !spec.workdir.starts_with('/') {
        return Err(invalid(
            "launch.workdir",
            format!(
                "must be an absolute path inside the sandbox, got {:?}",
                spec.workdir
            ),
        ));
    }
    Ok(())
}

/// Without full control: no capabilities, no new privileges, a read-only root with a
/// private /tmp.
/// A sandbox's limits in the engine's units: nano-CPUs, memory bytes (swap set equal, so
/// none), pids.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct EngineLimits {
    nano_cpus: Option<i64>,
    memory: Option<i64>,
    pids: Option<i64>,
}

impl EngineLimits {
    fn of(limits: &crate::runtime::SandboxLimits) -> Result<Self, WorkerError> {
        let memory = limits
            .memory_bytes
            .map(|bytes| {
                i64::try_from(bytes)
                    .map_err(|_| invalid("limits.memory_bytes", format!("{bytes} is too large")))
            })
            .transpose()?;
        let pids = limits
            .pids_max
            .map(|pids| {
                i64::try_from(pids)
                    .map_err(|_| invalid("limits.pids_max", format!("{pids} is too large")))
            })
            .transpose()?;
        Ok(EngineLimits {
            nano_cpus: limits
                .cpus
                .map(|cpus| i64::from(cpus).saturating_mul(NANO_CPUS_PER_CPU)),
            memory,
            pids,
        })
    }
}

/// What every container of this runtime has: its mounts, its network, the engine's init as
/// pid 1, never privileged, and a capped log.
fn base_host_config(mounts: Vec<Mount>, network_mode: String) -> HostConfig {
    HostConfig {
        mounts: Some(mounts),
        network_mode: Some(network_mode),
        init: Some(true),
        privileged: Some(false),
        auto_remove: Some(false),
        log_config: Some(HostConfigLogConfig {
            typ: Some("json-file".to_string()),
            config: Some(HashMap::from([
                ("max-size".to_string(), LOG_FILE_BYTES_MAX.to_string()),
                ("max-file".to_string(), LOG_FILES_MAX.to_string()),
            ])),
        }),
        ..Default::default()
    }
}

fn harden(host: &mut HostConfig) {
    host.cap_drop = Some(vec!["ALL".to_string()]);
    host.security_opt = Some(vec!["no-new-privileges".to_string()]);
    host.readonly_rootfs = Some(true);
    host.tmpfs = Some(HashMap::from([(
        "/tmp".to_string(),
        format!("rw,exec,nosuid,nodev,mode=1777,size={TMP_TMPFS_BYTES_MAX}"),
    )]));
}

/// The warm pool slot a container was made in, from its label; `None` for a cold one.
fn pool_slot(found: &ContainerInspectResponse) -> Option<&str> {
    found
        .config
        .as_ref()?
        .labels
        .as_ref()?
        .get(LABEL_POOL_SLOT)
        .map(String::as_str)
}

fn labels_match(labels: &HashMap<String, String>, dir: &TaskDir, attempt: u32) -> bool {
    labels.get(LABEL_TASK) == Some(&dir.task().get().to_string())
        && labels.get(LABEL_ATTEMPT) == Some(&attempt.to_string())
        && labels.get(LABEL_MANAGED).map(String::as_str) == Some("true")
        && labels.get(LABEL_TASK_DIR) == Some(&task_dir_label(dir))
}

fn task_dir_label(dir: &TaskDir) -> String {
    dir.root().to_string_lossy().into_owned()
}

/// A bind mount of an existing host directory, by its absolute path.
fn bind(source: &Path, target: &str, read_only: bool, field: &str) -> Result<Mount, WorkerError> {
    let absolute = std::fs::canonicalize(source)
        .map_err(|e| invalid(field, format!("{}: {e}", source.display())))?;
    if !absolute.is_dir() {
        return Err(invalid(
            field,
            format!("{} is not a directory", absolute.display()),
        ));
    }
    mount_of(&absolute, target, read_only, field)
}

/// A read-only bind of one executable file (the agent binary).
fn bind_file(source: &Path, target: &str, field: &str) -> Result<Mount, WorkerError> {
    let absolute = std::fs::canonicalize(source)
        .map_err(|e| invalid(field, format!("{}: {e}", source.display())))?;
    if !absolute.is_file() {
        return Err(invalid(
            field,
            format!("{} is not a file", absolute.display()),
        ));
    }
    mount_of(&absolute, target, true, field)
}

fn mount_of(
    absolute: &Path,
    target: &str,
    read_only: bool,
    field: &str,
) -> Result<Mount, WorkerError> {
    let absolute = absolute
        .to_str()
        .ok_or_else(|| invalid(field, format!("{} is not valid UTF-8", absolute.display())))?;
    Ok(Mount {
        target: Some(target.to_string()),
        source: Some(absolute.to_string()),
        typ: Some(MountTypeEnum::BIND),
        read_only: Some(read_only),
        ..Default::default()
    })
}

fn docker_id(handle: &SandboxHandle) -> Result<&str, WorkerError> {
    handle.id_for(RuntimeKind::Docker)
}

fn status_code(e: &bollard::errors::Error) -> Option<u16> {
    match e {
        bollard::errors::Error::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    status_code(e) == Some(404)
}

fn engine_error(what: &str, e: bollard::errors::Error) -> WorkerError {
    WorkerError::runtime(RUNTIME_NAME, format!("{what}: {e}"))
}

fn invalid(field: &str, message: String) -> WorkerError {
    WorkerError::Invalid {
        field: field.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests;
mod warm_pool;
