//! One `squadron server` process: its configuration, data, log and life (start, kill -9,
//! pause, resume).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a graceful stop may take before the process is killed.
pub const STOP_WAIT_MS_MAX: u64 = 10_000;

/// A chaos node builds a snapshot after this many entries (production's default is 10,000)…
pub const CHAOS_SNAPSHOT_AFTER_ENTRIES: u64 = 64;
/// …and keeps this many behind it, so a node that falls further behind catches up by snapshot.
pub const CHAOS_LOGS_KEPT_AFTER_SNAPSHOT: u64 = 16;

/// The certificates' folder in a node's data directory: what a wipe keeps.
const PKI_DIR_NAME: &str = "pki";

fn write_error(id: u64, path: &Path, source: std::io::Error) -> NodeError {
    NodeError::Write {
        id,
        path: path.into(),
        source,
    }
}

/// Writes a node's config. `initial` are the voters of the new cluster (empty for a node that
/// joins later).
fn write_config(path: &Path, spec: &NodeSpec, initial: &[NodeSpec]) -> Result<(), NodeError> {
    let members: String = initial
        .iter()
        .map(|m| {
            format!(
                "[[initial_members]]\nid = {}\nrest = \"{}\"\ngrpc = \"{}\"\npeer = \"{}\"\n\n",
                m.id, m.rest, m.grpc, m.peer
            )
        })
        .collect();
    // Short election timeouts make failover (and thus the recovery bound) quick; the sweep
    // runs often so expiries are prompt. Snapshots every few dozen entries with few logs
    // kept make building, installing and purging, and catching up by snapshot, happen in
    // every run.
    let text = format!(
        "node_id = {id}\ncluster_name = \"jepsen\"\nrest_listen = \"{rest}\"\ngrpc_listen = \"{grpc}\"\n\
         peer_listen = \"{peer}\"\n\
         data_dir = \"data\"\n\n{members}[raft]\nheartbeat_interval_ms = 100\n\
         election_timeout_min_ms = 500\nelection_timeout_max_ms = 1000\n\
         snapshot_after_entries = {snapshot}\nmax_in_snapshot_log_to_keep = {kept}\n\n\
         [server]\nrequest_timeout_ms = 4000\n",
        id = spec.id,
        rest = spec.rest,
        grpc = spec.grpc,
        peer = spec.peer,
        snapshot = CHAOS_SNAPSHOT_AFTER_ENTRIES,
        kept = CHAOS_LOGS_KEPT_AFTER_SNAPSHOT,
    );
    std::fs::write(path, text).map_err(|e| write_error(spec.id, path, e))
}

/// How one node is reached and where it keeps its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub id: u64,
    /// `host:port` of REST.
    pub rest: String,
    /// `host:port` of gRPC.
    pub grpc: String,
    /// `host:port` of the peer listener.
    pub peer: String,
}

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("node {id}: cannot write {path}: {source}")]
    Write {
        id: u64,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("node {id}: cannot start {bin}: {source}")]
    Spawn {
        id: u64,
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("node {id}: `kill -{signal}` failed: {message}")]
    Signal {
        id: u64,
        signal: &'static str,
        message: String,
    },
}

/// A node process the harness owns.
#[derive(Debug)]
pub struct NodeProcess {
    pub spec: NodeSpec,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    /// Runs the binary inside a network namespace (`ip netns exec NS`), when set.
    pub exec_prefix: Vec<String>,
    /// `LD_PRELOAD`/`FAKETIME` and the like, for clock faults.
    pub extra_env: Vec<(String, String)>,
    child: Option<Child>,
    paused: bool,
}

impl NodeProcess {
    /// Writes the node's config. `initial` are the voters of the new cluster (empty for a
    /// node that joins later).
    pub fn prepare(base: &Path, spec: NodeSpec, initial: &[NodeSpec]) -> Result<Self, NodeError> {
        let dir = base.join(format!("n{}", spec.id));
        std::fs::create_dir_all(&dir).map_err(|e| write_error(spec.id, &dir, e))?;
        let config = dir.join("node.toml");
        write_config(&config, &spec, initial)?;
        Ok(Self {
            log: dir.join("node.log"),
            dir,
            config,
            spec,
            exec_prefix: Vec::new(),
            extra_env: Vec::new(),
            child: None,
            paused: false,
        })
    }

    /// A stopped node's disk replaced by an empty one: everything in its data directory but
    /// its certificates (`pki/`, what `squadron init` gives a new node) is removed, and its
    /// config names no initial members, as the operator's guide starts a node that joins.
    /// Returns the entries removed.
    pub fn wipe(&mut self) -> Result<Vec<String>, NodeError> {
        assert!(
            self.child.is_none(),
            "node {} is wiped while it runs",
            self.spec.id
        );
        let data = self.dir.join("data");
        let entries = std::fs::read_dir(&data).map_err(|e| write_error(self.spec.id, &data, e))?;
        let mut removed = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| write_error(self.spec.id, &data, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == PKI_DIR_NAME {
                continue;
            }
            let path = entry.path();
            let gone = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            gone.map_err(|e| write_error(self.spec.id, &path, e))?;
            removed.push(name);
        }
        write_config(&self.config, &self.spec, &[])?;
        Ok(removed)
    }

    pub fn url(&self) -> String {
        format!("https://{}", self.spec.rest)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the process (a no-op if it runs), logging to `node.log`.
    pub fn start(&mut self, bin: &Path) -> Result<(), NodeError> {
        if self.child.is_some() {
            return Ok(());
        }
        let open_log = || {
            crate::child::append_to(&self.log).map_err(|source| NodeError::Write {
                id: self.spec.id,
                path: self.log.clone(),
                source,
            })
        };
        let (stdout, stderr) = (open_log()?, open_log()?);
        let mut cmd = match self.exec_prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.args(["server", "--config"])
            .arg(&self.config)
            .env("RUST_LOG", "warn,squadron=info")
            .envs(self.extra_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr));
        let child = cmd.spawn().map_err(|source| NodeError::Spawn {
            id: self.spec.id,
            bin: bin.into(),
            source,
        })?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    fn signal(&self, signal: &'static str) -> Result<(), NodeError> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        crate::child::signal(pid, signal).map_err(|message| NodeError::Signal {
            id: self.spec.id,
            signal,
            message,
        })
    }

    /// SIGKILL: no shutdown path runs. Waits for the process to be gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.paused = false;
    }

    /// SIGTERM, then SIGKILL if the process is still there after `STOP_WAIT_MS_MAX`.
    pub fn stop(&mut self) -> Result<(), NodeError> {
        self.resume()?;
        self.signal("TERM")?;
        crate::child::wait_or_kill(&mut self.child, Duration::from_millis(STOP_WAIT_MS_MAX));
        Ok(())
    }

    /// SIGSTOP.
    pub fn pause(&mut self) -> Result<(), NodeError> {
        self.signal("STOP")?;
        self.paused = self.child.is_some();
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self) -> Result<(), NodeError> {
        if self.paused {
            self.signal("CONT")?;
            self.paused = false;
        }
        Ok(())
    }

    /// The last lines of the node's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::child::tail(&self.log, lines)
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.resume();
        self.kill();
    }
}
