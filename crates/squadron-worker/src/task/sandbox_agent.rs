//! What a sandbox that runs `squadron agent` gets from its worker: a directory bound at
//! `AGENT_DIR_MOUNT` holding the agent's environment file (task, attempt, relay sockets, the
//! CA, a one-time bootstrap token and nothing else secret), the cluster CA and the relay
//! sockets (`agent_relay`), and the worker's own `squadron` binary bound read-only at
//! `AGENT_BINARY_MOUNT`, so the agent is always the worker's own version.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use squadron_core::ids::TaskId;

use squadron_api::agent_channel::PORT_NAME;

use crate::error::WorkerError;
use crate::runtime::LaunchSpec;
use crate::task::agent_relay::{GRPC_SOCKET_NAME, REST_SOCKET_NAME};
use crate::task::task_dir::{INBOX_MOUNT, OUTBOX_MOUNT};

/// Where the agent's directory is inside the sandbox.
pub(crate) const AGENT_DIR_MOUNT: &str = "/run/squadron/agent";
/// Where the worker's binary is inside the sandbox.
pub(crate) const AGENT_BINARY_MOUNT: &str = "/usr/local/bin/squadron";
pub(crate) const AGENT_ENV_NAME: &str = "agent.env";
pub(crate) const CA_NAME: &str = "ca.pem";
/// A VM's start script in the agent directory (`write_start_script`, read by `vm-init`).
#[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
pub(crate) const START_SCRIPT_NAME: &str = "start.sh";
/// Where a VM's agent binds its own relay sockets, in the guest (`vm-init` makes it).
pub(crate) const GUEST_BRIDGE_DIR: &str = "/run/squadron/bridge";
/// The longest a Unix socket path may be (`sun_path` holds 108 bytes with its NUL).
pub(crate) const SOCKET_PATH_BYTES_MAX: usize = 107;

/// What goes into the agent's environment file.
#[derive(Debug)]
pub(crate) struct AgentFiles<'a> {
    pub(crate) task: TaskId,
    pub(crate) attempt: u32,
    pub(crate) token: &'a str,
    pub(crate) ca_pem: &'a str,
    pub(crate) heartbeat_ms: u64,
    /// The task's agent connect table: the pause before each retry.
    pub(crate) connect_pauses: Vec<std::time::Duration>,
    /// A VM: the agent serves its relay sockets itself, in the guest, over the channel port.
    pub(crate) over_channel: bool,
}

impl AgentFiles<'_> {
    /// Writes the directory for `owner` (mode 0700; the environment file 0600): only the
    /// sandbox's user and the worker read it.
    pub(crate) fn write(&self, dir: &Path, owner: (u32, u32)) -> Result<(), WorkerError> {
        check_socket_room(dir)?;
        std::fs::create_dir_all(dir)
            .map_err(|e| WorkerError::io("create the agent directory", dir, e))?;
        let io = |what, path: &Path, e| WorkerError::io(what, path, e);
        std::os::unix::fs::chown(dir, Some(owner.0), Some(owner.1))
            .map_err(|e| io("give the agent directory to the sandbox user", dir, e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| io("restrict the agent directory", dir, e))?;
        let ca = dir.join(CA_NAME);
        write_owned(&ca, self.ca_pem.as_bytes(), owner, 0o644)?;
        let (sockets, channel) = if self.over_channel {
            (
                GUEST_BRIDGE_DIR,
                format!("SQUADRON_CHANNEL=/dev/virtio-ports/{PORT_NAME}\n"),
            )
        } else {
            (AGENT_DIR_MOUNT, String::new())
        };
        let env = format!(
            "# Written by the worker for the agent of task {task} attempt {attempt}.\n\
             SQUADRON_TASK={task}\nSQUADRON_ATTEMPT={attempt}\n{channel}\
             SQUADRON_REST_SOCKET={sockets}/{REST_SOCKET_NAME}\n\
             SQUADRON_GRPC_SOCKET={sockets}/{GRPC_SOCKET_NAME}\n\
             SQUADRON_CA_FILE={AGENT_DIR_MOUNT}/{CA_NAME}\n\
             SQUADRON_HEARTBEAT_MS={heartbeat}\n\
             SQUADRON_DISK_PATHS={INBOX_MOUNT}:{OUTBOX_MOUNT}\n\
             SQUADRON_CONNECT_PAUSES_MS={pauses}\n\
             SQUADRON_BOOTSTRAP_TOKEN={token}\n",
            task = self.task,
            attempt = self.attempt,
            heartbeat = self.heartbeat_ms,
            pauses = self
                .connect_pauses
                .iter()
                .map(|p| p.as_millis().to_string())
                .collect::<Vec<_>>()
                .join(","),
            token = self.token,
        );
        let zeroed = zeroize::Zeroizing::new(env);
        write_owned(&dir.join(AGENT_ENV_NAME), zeroed.as_bytes(), owner, 0o600)
    }
}

/// A VM's start script, which its init runs as the sandbox user: the launch spec's working
/// directory and environment, then the agent with the launcher (the role of a container's
/// configuration). Only the sandbox user and the worker read it: the environment may hold
/// allowlisted values.
#[cfg_attr(not(feature = "libvirt"), allow(dead_code))]
pub(crate) fn write_start_script(
    dir: &Path,
    spec: &LaunchSpec,
    owner: (u32, u32),
) -> Result<(), WorkerError> {
    let quote = |s: &str| {
        shlex::try_quote(s)
            .map(|q| q.into_owned())
            .map_err(|e| WorkerError::Invalid {
                field: "launch".to_string(),
                message: format!("{s:?} cannot be quoted for the guest's shell: {e}"),
            })
    };
    let mut script = format!(
        "# Written by the worker for task {} attempt {}.\ncd {} || exit {}\n",
        spec.task,
        spec.attempt,
        quote(&spec.workdir)?,
        crate::task::launcher::LAUNCH_WORKDIR_EXIT_CODE
    );
    for (name, value) in &spec.env {
        script.push_str(&format!("export {}={}\n", quote(name)?, quote(value)?));
    }
    let argv: Vec<String> = agent_argv(&spec.argv)
        .iter()
        .map(|a| quote(a))
        .collect::<Result<_, _>>()?;
    script.push_str(&format!("exec {}\n", argv.join(" ")));
    let zeroed = zeroize::Zeroizing::new(script);
    write_owned(
        &dir.join(START_SCRIPT_NAME),
        zeroed.as_bytes(),
        owner,
        0o600,
    )
}

/// The container command: the agent, which starts `launch` once the task is RUNNING.
pub(crate) fn agent_argv(launch: &[String]) -> Vec<String> {
    let mut argv = vec![
        AGENT_BINARY_MOUNT.to_string(),
        "agent".to_string(),
        "--env-file".to_string(),
        format!("{AGENT_DIR_MOUNT}/{AGENT_ENV_NAME}"),
        "--".to_string(),
    ];
    argv.extend(launch.iter().cloned());
    argv
}

fn check_socket_room(dir: &Path) -> Result<(), WorkerError> {
    let longest = dir
        .join(REST_SOCKET_NAME)
        .as_os_str()
        .len()
        .max(dir.join(GRPC_SOCKET_NAME).as_os_str().len());
    if longest > SOCKET_PATH_BYTES_MAX {
        return Err(WorkerError::Invalid {
            field: "data_dir".to_string(),
            message: format!(
                "the agent's relay sockets under {} would be {longest} bytes long, more than a \
                 Unix socket path takes ({SOCKET_PATH_BYTES_MAX}); use a shorter data directory",
                dir.display()
            ),
        });
    }
    Ok(())
}

/// `bytes` at `path`, replaced atomically, then `owner`'s with `mode`.
pub(crate) fn write_owned(
    path: &Path,
    bytes: &[u8],
    owner: (u32, u32),
    mode: u32,
) -> Result<(), WorkerError> {
    let io = |what, e| WorkerError::io(what, path, e);
    crate::support::write_atomic(path, bytes)?;
    std::os::unix::fs::chown(path, Some(owner.0), Some(owner.1)).map_err(|e| io("chown", e))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| io("chmod", e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    fn files(token: &str) -> AgentFiles<'_> {
        AgentFiles {
            task: TaskId::new(7).unwrap(),
            attempt: 2,
            token,
            ca_pem: "-----BEGIN CERTIFICATE-----\n",
            heartbeat_ms: 500,
            connect_pauses: vec![Duration::from_millis(2_000); 3],
            over_channel: false,
        }
    }

    /// The contract between the two sides: what the worker writes is what the agent reads.
    #[test]
    fn the_agent_reads_what_the_worker_writes_and_only_its_user_may() {
        let root = tempfile::tempdir().unwrap();
        let meta = std::fs::metadata(root.path()).unwrap();
        let owner = (meta.uid(), meta.gid());
        let dir = root.path().join("agent");
        files("sqd_boot_secret").write(&dir, owner).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join(AGENT_ENV_NAME)), 0o600);
        assert_eq!(mode(&dir.join(CA_NAME)), 0o644);
        let env = squadron_agent::AgentEnv::take(&dir.join(AGENT_ENV_NAME)).unwrap();
        assert_eq!((env.task.get(), env.attempt, env.heartbeat_ms), (7, 2, 500));
        assert_eq!(env.token.as_str(), "sqd_boot_secret");
        assert_eq!(env.connect_pauses, vec![Duration::from_millis(2_000); 3]);
        let inside = Path::new(AGENT_DIR_MOUNT);
        assert_eq!(env.grpc_socket, inside.join(GRPC_SOCKET_NAME));
        assert_eq!(env.rest_socket, inside.join(REST_SOCKET_NAME));
        assert_eq!(env.ca_file, inside.join(CA_NAME));
        assert_eq!(
            env.disk_paths,
            vec![PathBuf::from(INBOX_MOUNT), PathBuf::from(OUTBOX_MOUNT)]
        );
        let left = std::fs::read_to_string(dir.join(AGENT_ENV_NAME)).unwrap();
        assert!(!left.contains("secret"), "{left}");
    }

    #[test]
    fn a_directory_too_deep_for_a_socket_path_is_refused_naming_the_data_dir() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("d".repeat(SOCKET_PATH_BYTES_MAX));
        let err = files("t").write(&deep, (0, 0)).unwrap_err().to_string();
        assert!(err.contains("data_dir") && err.contains("shorter"), "{err}");
        assert!(!deep.exists(), "nothing is written");
    }

    #[test]
    fn the_container_runs_the_agent_with_the_launcher_after_the_separator() {
        let argv = agent_argv(&["/bin/sh".into(), "/mnt/run/launch.sh".into()]);
        assert_eq!(argv[0], AGENT_BINARY_MOUNT);
        assert_eq!(argv[1], "agent");
        let dash = argv.iter().position(|a| a == "--").unwrap();
        assert_eq!(&argv[dash + 1..], ["/bin/sh", "/mnt/run/launch.sh"]);
    }
}
