//! The sandbox contract every runtime implements (process, Docker, KVM).
//!
//! A runtime never pipes the provider's output through the worker: the launch script
//! redirects stdout and stderr into the task's progress files, so a run survives a worker
//! crash and a restarted worker re-adopts it by its labels or paths (`adopt`).

pub(crate) mod agent_libraries;
pub(crate) mod boundary_network;
pub(crate) mod docker;
pub(crate) mod docker_network;
pub(crate) mod gateway;
#[cfg(feature = "libvirt")]
pub(crate) mod kvm;
pub(crate) mod probe;
pub(crate) mod process;
pub(crate) mod project;
pub(crate) mod sandbox_user;
#[cfg(test)]
pub(crate) mod test_internet;

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use squadron_core::ids::TaskId;
use squadron_core::manifest::{Keyword as _, NetworkMode, RuntimeKind};

use crate::error::WorkerError;
use crate::task::credential_session::CredentialSession;
use crate::task::task_dir::TaskDir;

/// What to run and inside which boundary. Paths in `argv`, `workdir` and `stdin` are paths
/// inside the sandbox (see the `*_MOUNT` constants of `task_dir`).
#[derive(Debug, Clone)]
pub(crate) struct LaunchSpec {
    pub(crate) task: TaskId,
    pub(crate) attempt: u32,
    pub(crate) dir: TaskDir,
    /// The program and its arguments; conventionally `["/bin/sh", "/mnt/run/launch.sh"]`,
    /// a script that redirects output into the progress files and execs the provider.
    pub(crate) argv: Vec<String>,
    pub(crate) workdir: String,
    /// Already reduced to the allowlist; nothing of the worker's own environment leaks in.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) limits: SandboxLimits,
    pub(crate) network: NetworkMode,
    /// Docker only: keep capabilities and privileges (the seed's "agent has full control").
    pub(crate) full_control: bool,
    /// Host directory mounted read-only at `/mnt/global`, when the worker has one.
    pub(crate) global_dir: Option<std::path::PathBuf>,
    /// The session's credential tmpfs, bound read-only at its sandbox path (INV-13).
    pub(crate) credentials: Option<CredentialSession>,
    /// The credentials injected at egress, whose proxy the runtime serves on the sandbox's
    /// loopback; set once the lease is taken, just before the start.
    pub(crate) egress: Option<std::sync::Arc<crate::egress::EgressSession>>,
    /// The manifest preserves a failed sandbox: a runtime whose sandbox would end with its
    /// provider (a VM powers off) keeps it up after the exit instead, for break-glass.
    #[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
    pub(crate) keep_after_exit: bool,
}

/// Most sandboxes one runtime lists for the release evidence.
pub(crate) const SANDBOXES_LISTED_MAX: usize = 10_000;
/// What every attempt's sandbox name starts with ([`sandbox_name`]).
pub(crate) const SANDBOX_NAME_PREFIX: &str = "squadron-task-";

/// The task a sandbox was made for, read back from its name ([`sandbox_name`], or the process
/// runtime's leaf name); `None` for a name of neither form.
pub(crate) fn task_of_sandbox(name: &str) -> Option<TaskId> {
    let rest = name
        .strip_prefix(SANDBOX_NAME_PREFIX)
        .or_else(|| name.strip_prefix(process::LEAF_NAME_PREFIX))?;
    let (id, _) = rest.split_once("-a")?;
    TaskId::new(id.parse().ok()?).ok()
}

/// The name of one attempt's sandbox (a container, a domain): the task id, the attempt, and a
/// hash of the task directory. Task ids restart with every cluster, so only the directory
/// tells this worker's attempt from a leftover of another cluster or data directory.
pub(crate) fn sandbox_name(dir: &TaskDir, attempt: u32) -> String {
    format!(
        "{SANDBOX_NAME_PREFIX}{}-a{attempt}-{:08x}",
        dir.task().get(),
        fnv1a(dir.root().as_os_str().as_encoded_bytes()) as u32
    )
}

/// 64-bit FNV-1a (`fnv`): a hash that never changes between builds, for sandbox names a
/// restarted worker must find again.
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = fnv::FnvHasher::default();
    hasher.write(bytes);
    hasher.finish()
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct SandboxLimits {
    pub(crate) cpus: Option<u32>,
    pub(crate) memory_bytes: Option<u64>,
    pub(crate) pids_max: Option<u64>,
    /// The sandbox's own disk where it has one (a VM's scratch disk); the task directory's
    /// quota is the driver's.
    pub(crate) disk_bytes: Option<u64>,
}

/// A sandbox the runtime created: a cgroup leaf path or a container id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SandboxHandle {
    pub(crate) runtime: RuntimeKind,
    pub(crate) id: String,
}

impl SandboxHandle {
    /// The id, if this handle is a sandbox of `kind`'s (a runtime never drives another's).
    pub(crate) fn id_for(&self, kind: RuntimeKind) -> Result<&str, WorkerError> {
        let invalid = |field: &str, message: String| WorkerError::Invalid {
            field: field.to_string(),
            message,
        };
        if self.runtime != kind {
            return Err(invalid(
                "sandbox.runtime",
                format!(
                    "the {kind} runtime cannot drive a {} sandbox ({})",
                    self.runtime, self.id
                ),
            ));
        }
        if self.id.is_empty() {
            return Err(invalid("sandbox.id", "is empty".to_string()));
        }
        Ok(&self.id)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunStatus {
    /// Created, provider not started yet.
    Created,
    Running,
    /// The provider exited with this code (128 + n when killed by signal n).
    Exited {
        code: i32,
    },
    /// The sandbox is gone and no exit code was recorded (killed from outside).
    Vanished,
}

/// Proof that a sandbox is quiescent, kept as reap evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReapReport {
    /// What was reaped: the cgroup path or `docker:<container id>`.
    pub(crate) sandbox: String,
    /// `false` once nothing is left running in it.
    pub(crate) populated: bool,
    pub(crate) observed_at_ms: u64,
    /// Human-readable steps taken (freeze, kill, wait), for the task's events.
    pub(crate) detail: String,
}

#[async_trait]
pub(crate) trait Runtime: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> RuntimeKind;

    /// PROVISIONING: create the sandbox (cgroup leaf and boundary, or container) without
    /// starting the provider.
    async fn provision(&self, spec: &LaunchSpec) -> Result<SandboxHandle, WorkerError>;

    /// RUNNING: start the provider in a provisioned sandbox.
    async fn start(&self, handle: &SandboxHandle, spec: &LaunchSpec) -> Result<(), WorkerError>;

    async fn status(&self, handle: &SandboxHandle) -> Result<RunStatus, WorkerError>;

    /// SIGTERM, wait up to `grace`, then SIGKILL whatever is left.
    async fn terminate(&self, handle: &SandboxHandle, grace: Duration) -> Result<(), WorkerError>;

    /// Kill everything left, prove quiescence and remove the sandbox.
    async fn destroy(&self, handle: &SandboxHandle) -> Result<ReapReport, WorkerError>;

    /// Finds the sandbox a previous life of this worker made for this attempt, if any.
    async fn adopt(
        &self,
        task: TaskId,
        attempt: u32,
        dir: &TaskDir,
    ) -> Result<Option<SandboxHandle>, WorkerError>;

    /// The break-glass line printed for FAILED_PRESERVED: how an operator gets inside.
    async fn break_glass(&self, handle: &SandboxHandle) -> String;

    /// Called once a failed attempt's sandbox is kept for break-glass and the worker is done
    /// reading it (outputs collected): a runtime that held it still meanwhile lets it run.
    async fn preserved(&self, _handle: &SandboxHandle) -> Result<(), WorkerError> {
        Ok(())
    }

    /// The task sandboxes this runtime holds for this worker now (leaves, containers,
    /// domains), by name, sorted, at most [`SANDBOXES_LISTED_MAX`]: once every task ended and
    /// none was preserved, none — what a soak counts as leaked.
    async fn sandboxes(&self) -> Result<Vec<String>, WorkerError>;

    /// Whether [`Runtime::usage`] measures this runtime's sandboxes.
    fn measures_usage(&self) -> bool {
        false
    }

    /// What a sandbox's processes use now by the host's own accounting (CPU time, memory),
    /// for a runtime that [`measures_usage`](Runtime::measures_usage); `None` once the
    /// sandbox is gone.
    async fn usage(
        &self,
        _handle: &SandboxHandle,
    ) -> Result<Option<squadron_isolation::LeafUsage>, WorkerError> {
        Ok(None)
    }

    /// Which of a sandbox's limits stopped something (memory, pids), for its task's error:
    /// "exited with code 137" does not say the task ran out of memory. `None` when none did,
    /// the sandbox is gone, or the runtime cannot tell.
    async fn limits_hit(&self, _handle: &SandboxHandle) -> Option<String> {
        None
    }

    /// The host (uid, gid) the provider runs as: credential files are given to it.
    fn sandbox_owner(&self, spec: &LaunchSpec) -> Result<(u32, u32), WorkerError>;

    /// Whether the sandbox runs `squadron agent` (`task::sandbox_agent`): it starts at
    /// PROVISIONING, READY waits for the agent's registration, and the agent starts the
    /// provider once the task is RUNNING. The process runtime launches the provider
    /// directly.
    fn runs_agent(&self) -> bool {
        false
    }

    /// Whether credentials injected at egress can reach this runtime's sandboxes: the worker's
    /// proxy needs a socket in the sandbox's own network namespace, made before the provider
    /// starts, or (a runtime whose agent is over a channel) the agent's channel.
    fn serves_egress(&self) -> bool {
        false
    }

    /// Serves egress injection's proxy on the loopback of a started sandbox: one whose agent
    /// has not started the provider yet, or one adopted after a restart, whose proxy went with
    /// the worker's last life. (The process runtime serves it as it starts the provider, in
    /// `start`, and here only for an adopted sandbox; a runtime whose agent is over a channel
    /// never here: the relay serves it.)
    async fn serve_egress(
        &self,
        _handle: &SandboxHandle,
        _egress: &std::sync::Arc<crate::egress::EgressSession>,
    ) -> Result<(), WorkerError> {
        Err(WorkerError::runtime(
            self.kind().as_str(),
            "this runtime does not serve credentials injected at egress".to_owned(),
        ))
    }

    /// Whether the agent reaches its relay over a channel the runtime provides (a VM's
    /// virtio-serial port) instead of sockets bound into the sandbox.
    fn agent_over_channel(&self) -> bool {
        false
    }

    /// How the runtime's warm pool's claims went, when it keeps one (`/worker/v1/metrics`).
    fn pool_figures(&self) -> Option<docker::PoolFigures> {
        None
    }

    /// At the worker's stop: removes what holds no task (warm sandboxes) and makes no more.
    async fn drain_idle(&self) -> Result<(), WorkerError> {
        Ok(())
    }

    /// The host end of the agent's channel of a started sandbox, once it exists.
    async fn agent_channel(
        &self,
        _handle: &SandboxHandle,
    ) -> Result<Option<std::path::PathBuf>, WorkerError> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The evidence names the task of each sandbox by reading back the names the runtimes
    /// gave: a container's or domain's, and a process leaf's.
    #[test]
    fn a_sandbox_name_gives_back_its_task() {
        let dir = TaskDir::new(std::path::Path::new("/tmp/w"), TaskId::new(42).unwrap());
        let named = sandbox_name(&dir, 3);
        assert_eq!(task_of_sandbox(&named), TaskId::new(42).ok());
        let leaf = process::ProcessRuntime::leaf_name(TaskId::new(7).unwrap(), 1);
        assert_eq!(task_of_sandbox(&leaf), TaskId::new(7).ok());
        for other in [
            "tenant-acme",
            "task-",
            "task-x-a1",
            "squadron-task-0-a1-00",
            "x",
        ] {
            assert_eq!(task_of_sandbox(other), None, "{other}");
        }
    }
}
