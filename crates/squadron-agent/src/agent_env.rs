//! The agent's environment file (`agent.env`, the seed's): what the worker tells the agent
//! inside the sandbox — its task and attempt, the relay sockets that reach the control plane,
//! the cluster CA, and a one-time bootstrap token. Lines are `NAME=value`; `#` starts a
//! comment. The token is removed from the file as soon as it is read (DESIGN §5: "the token is
//! then scrubbed from wherever it was"), so nothing run later in the sandbox finds it.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use squadron_core::ids::TaskId;
use zeroize::Zeroizing;

use crate::error::AgentError;

/// Largest environment file read.
pub const AGENT_ENV_BYTES_MAX: u64 = 64 * 1024;
/// The heartbeat interval when the file names none (the seed's 30 s).
pub const HEARTBEAT_MS_DEFAULT: u64 = 30_000;
pub const HEARTBEAT_MS_MIN: u64 = 100;
pub const HEARTBEAT_MS_MAX: u64 = 300_000;
/// Directories whose files the heartbeat counts as the sandbox's disk use, at most.
pub const DISK_PATHS_MAX: usize = 8;

pub const TASK: &str = "SQUADRON_TASK";
pub const ATTEMPT: &str = "SQUADRON_ATTEMPT";
pub const REST_SOCKET: &str = "SQUADRON_REST_SOCKET";
pub const GRPC_SOCKET: &str = "SQUADRON_GRPC_SOCKET";
pub const CA_FILE: &str = "SQUADRON_CA_FILE";
pub const BOOTSTRAP_TOKEN: &str = "SQUADRON_BOOTSTRAP_TOKEN";
pub const HEARTBEAT_MS: &str = "SQUADRON_HEARTBEAT_MS";
pub const DISK_PATHS: &str = "SQUADRON_DISK_PATHS";
pub const CONNECT_PAUSES_MS: &str = "SQUADRON_CONNECT_PAUSES_MS";
/// In a VM: the virtio-serial port the relay sockets are carried over (`channel_bridge`).
pub const CHANNEL: &str = "SQUADRON_CHANNEL";

/// The seed's agent connect table when the file names none: 30 retries, 2 s apart.
pub const CONNECT_RETRIES_DEFAULT: usize = 30;
pub const CONNECT_PAUSE_MS_DEFAULT: u64 = 2_000;
/// The longest table taken (the manifest's own bound on retries).
pub const CONNECT_PAUSES_MAX: usize = 100;
pub const CONNECT_PAUSE_MS_MAX: u64 = 3_600 * 1_000;

const KNOWN: [&str; 10] = [
    CHANNEL,
    TASK,
    ATTEMPT,
    REST_SOCKET,
    GRPC_SOCKET,
    CA_FILE,
    BOOTSTRAP_TOKEN,
    HEARTBEAT_MS,
    DISK_PATHS,
    CONNECT_PAUSES_MS,
];

/// The parsed file. The token is held here only, zeroed when dropped.
pub struct AgentEnv {
    pub task: TaskId,
    pub attempt: u32,
    pub rest_socket: PathBuf,
    pub grpc_socket: PathBuf,
    pub ca_file: PathBuf,
    pub token: Zeroizing<String>,
    pub heartbeat_ms: u64,
    pub disk_paths: Vec<PathBuf>,
    /// The pauses before each retry of a call the control plane did not answer (the
    /// manifest's `lifecycle.retries.agent_connect`).
    pub connect_pauses: Vec<std::time::Duration>,
    /// Set in a VM: the agent serves `rest_socket` and `grpc_socket` itself, over this port.
    pub channel: Option<PathBuf>,
}

impl std::fmt::Debug for AgentEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentEnv")
            .field("task", &self.task)
            .field("attempt", &self.attempt)
            .field("rest_socket", &self.rest_socket)
            .field("grpc_socket", &self.grpc_socket)
            .field("token", &"[REDACTED]")
            .finish_non_exhaustive()
    }
}

impl AgentEnv {
    /// Reads the file and removes the token line from it before returning.
    pub fn take(path: &Path) -> Result<Self, AgentError> {
        let text = Zeroizing::new(read_bounded(path, AGENT_ENV_BYTES_MAX)?);
        let env = Self::parse(path, &text)?;
        scrub(path, &text)?;
        Ok(env)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, AgentError> {
        let bad = |message: String| AgentError::Env {
            path: path.to_path_buf(),
            message,
        };
        let mut values: std::collections::BTreeMap<&str, &str> = Default::default();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (name, value) = line
                .split_once('=')
                .ok_or_else(|| bad(format!("line {} is not NAME=value", n + 1)))?;
            if !KNOWN.contains(&name) {
                return Err(bad(format!("line {}: unknown name {name:?}", n + 1)));
            }
            if values.insert(name, value).is_some() {
                return Err(bad(format!("{name} is given twice")));
            }
        }
        let need = |name: &str| {
            values
                .get(name)
                .copied()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| bad(format!("{name} is required")))
        };
        let number = |name: &str, v: &str| {
            v.parse::<u64>()
                .map_err(|_| bad(format!("{name}: {v:?} is not a number")))
        };
        let task =
            TaskId::new(number(TASK, need(TASK)?)?).map_err(|e| bad(format!("{TASK}: {e}")))?;
        let attempt = u32::try_from(number(ATTEMPT, need(ATTEMPT)?)?)
            .map_err(|_| bad(format!("{ATTEMPT} is too large")))?;
        let heartbeat_ms = match values.get(HEARTBEAT_MS) {
            None => HEARTBEAT_MS_DEFAULT,
            Some(v) => number(HEARTBEAT_MS, v)?,
        };
        if !(HEARTBEAT_MS_MIN..=HEARTBEAT_MS_MAX).contains(&heartbeat_ms) {
            return Err(bad(format!(
                "{HEARTBEAT_MS} must be {HEARTBEAT_MS_MIN} to {HEARTBEAT_MS_MAX}, got {heartbeat_ms}"
            )));
        }
        let disk_paths: Vec<PathBuf> = values
            .get(DISK_PATHS)
            .map(|v| {
                v.split(':')
                    .filter(|p| !p.is_empty())
                    .map(PathBuf::from)
                    .collect()
            })
            .unwrap_or_default();
        if disk_paths.len() > DISK_PATHS_MAX {
            return Err(bad(format!(
                "{DISK_PATHS} names more than {DISK_PATHS_MAX} directories"
            )));
        }
        let connect_pauses = match values.get(CONNECT_PAUSES_MS) {
            None => vec![CONNECT_PAUSE_MS_DEFAULT; CONNECT_RETRIES_DEFAULT],
            Some(v) => v
                .split(',')
                .filter(|p| !p.is_empty())
                .map(|p| number(CONNECT_PAUSES_MS, p))
                .collect::<Result<Vec<u64>, _>>()?,
        };
        if connect_pauses.len() > CONNECT_PAUSES_MAX
            || connect_pauses.iter().any(|ms| *ms > CONNECT_PAUSE_MS_MAX)
        {
            return Err(bad(format!(
                "{CONNECT_PAUSES_MS} holds at most {CONNECT_PAUSES_MAX} pauses of at most \
                 {CONNECT_PAUSE_MS_MAX} ms"
            )));
        }
        Ok(AgentEnv {
            task,
            attempt,
            channel: values
                .get(CHANNEL)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            rest_socket: PathBuf::from(need(REST_SOCKET)?),
            grpc_socket: PathBuf::from(need(GRPC_SOCKET)?),
            ca_file: PathBuf::from(need(CA_FILE)?),
            token: Zeroizing::new(need(BOOTSTRAP_TOKEN)?.to_string()),
            heartbeat_ms,
            disk_paths,
            connect_pauses: connect_pauses
                .into_iter()
                .map(std::time::Duration::from_millis)
                .collect(),
        })
    }
}

/// A file the worker wrote, read whole unless it is larger than `max` bytes.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<String, AgentError> {
    let meta = std::fs::metadata(path).map_err(|e| AgentError::io("read", path, e))?;
    if meta.len() > max {
        return Err(AgentError::Env {
            path: path.to_path_buf(),
            message: format!("larger than {max} bytes"),
        });
    }
    std::fs::read_to_string(path).map_err(|e| AgentError::io("read", path, e))
}

/// Rewrites the file without the token, atomically: a crash leaves the old file or the new.
fn scrub(path: &Path, text: &str) -> Result<(), AgentError> {
    let kept: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with(&format!("{BOOTSTRAP_TOKEN}=")))
        .map(|l| format!("{l}\n"))
        .collect();
    let mut file = atomic_write_file::AtomicWriteFile::open(path)
        .map_err(|e| AgentError::io("scrub the token from", path, e))?;
    file.write_all(kept.as_bytes())
        .and_then(|_| file.commit())
        .map_err(|e| AgentError::io("scrub the token from", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.env");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    const GOOD: &str = "# written by the worker\nSQUADRON_TASK=7\nSQUADRON_ATTEMPT=2\n\
        SQUADRON_REST_SOCKET=/run/squadron/agent/rest.sock\n\
        SQUADRON_GRPC_SOCKET=/run/squadron/agent/grpc.sock\n\
        SQUADRON_CA_FILE=/run/squadron/agent/ca.pem\n\
        SQUADRON_BOOTSTRAP_TOKEN=sqd_boot_secret\nSQUADRON_DISK_PATHS=/mnt/inbox:/mnt/outbox\n";

    #[test]
    fn taking_the_file_reads_it_and_leaves_it_without_the_token() {
        let (_dir, path) = file(GOOD);
        let env = AgentEnv::take(&path).unwrap();
        assert_eq!((env.task.get(), env.attempt), (7, 2));
        assert_eq!(env.token.as_str(), "sqd_boot_secret");
        assert_eq!(env.heartbeat_ms, HEARTBEAT_MS_DEFAULT);
        assert_eq!(env.disk_paths.len(), 2);
        assert_eq!(env.connect_pauses.len(), CONNECT_RETRIES_DEFAULT);
        assert!(!format!("{env:?}").contains("secret"));
        let left = std::fs::read_to_string(&path).unwrap();
        assert!(!left.contains("secret"), "{left}");
        assert!(left.contains("SQUADRON_TASK=7"), "{left}");
        // The file without its token no longer starts an agent.
        let again = AgentEnv::take(&path).unwrap_err().to_string();
        assert!(
            again.contains("SQUADRON_BOOTSTRAP_TOKEN is required"),
            "{again}"
        );
    }

    #[test]
    fn a_bad_file_is_refused_naming_the_line_or_name() {
        for (text, expect) in [
            (
                GOOD.replace("SQUADRON_TASK=7", "SQUADRON_TASK=seven"),
                "SQUADRON_TASK",
            ),
            (
                GOOD.replace("SQUADRON_ATTEMPT=2\n", ""),
                "SQUADRON_ATTEMPT is required",
            ),
            (format!("{GOOD}SQUADRON_TASK=8\n"), "given twice"),
            (format!("{GOOD}PATH=/bin\n"), "unknown name \"PATH\""),
            (format!("{GOOD}no equals sign\n"), "is not NAME=value"),
            (
                format!("{GOOD}SQUADRON_HEARTBEAT_MS=5\n"),
                "SQUADRON_HEARTBEAT_MS must be",
            ),
            (
                format!("{GOOD}SQUADRON_CONNECT_PAUSES_MS=10,x\n"),
                "SQUADRON_CONNECT_PAUSES_MS: \"x\" is not a number",
            ),
            (
                format!(
                    "{GOOD}SQUADRON_CONNECT_PAUSES_MS={}\n",
                    vec!["1"; 101].join(",")
                ),
                "at most 100 pauses",
            ),
        ] {
            let (_dir, path) = file(&text);
            let err = AgentEnv::take(&path).unwrap_err().to_string();
            assert!(err.contains(expect), "{expect}: {err}");
            // Refused before the scrub: the file is as it was.
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        }
        let (_dir, path) = file(&"#".repeat(AGENT_ENV_BYTES_MAX as usize + 1));
        let err = AgentEnv::take(&path).unwrap_err().to_string();
        assert!(err.contains("larger than"), "{err}");
    }
}
