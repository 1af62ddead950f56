//! The `takeover` workload's real worker: one `squadron worker` process with the process
//! runtime (bubblewrap, real cgroups), the harness's worker certificate, a git repository its
//! project sandbox is cloned from, and a provider script that commits through the worker's
//! identity broker. The nemesis pauses it (`worker-pause`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::workload::WORKER;

/// The lease TTL of the worker's agents: short, so a paused worker outlives its leases within
/// one fault and crash takeovers wait little for expiry.
pub const AGENT_LEASE_TTL_MS: u64 = 3_000;
/// The worker's heartbeat interval; the leader declares it lost after three missed ones.
pub const WORKER_HEARTBEAT_MS: u64 = 1_000;
/// How long the worker may take to start and register.
pub const WORKER_START_MS_MAX: u64 = 30_000;
/// How long a SIGTERMed worker may take to exit before it is killed.
pub const WORKER_STOP_MS_MAX: u64 = 30_000;
/// Tries of removing a killed tree's cgroup directories (its processes take a moment to go).
const CGROUP_REMOVE_TRIES_MAX: u32 = 50;
const CGROUP_REMOVE_RETRY_MS: u64 = 100;

/// The host's first cgroup v2 mount (`/proc/self/mountinfo`), which the worker is told to
/// use (`--cgroup-root`), so that the harness and the worker agree where its leaves are.
pub fn cgroup2_mount() -> Option<PathBuf> {
    cgroup2_mount_in(&std::fs::read_to_string("/proc/self/mountinfo").ok()?)
}

fn cgroup2_mount_in(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (fields, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        let point = fields.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(point))
    })
}

/// The worker's own cgroup directory (the process runtime's `{mount}/squadron/{worker}`); a
/// provider's leaf is beneath it.
pub fn cgroup_roots() -> Vec<PathBuf> {
    cgroup2_mount()
        .map(|m| m.join("squadron").join(WORKER))
        .into_iter()
        .collect()
}

/// Kills whatever an earlier run's worker left in its cgroup tree and removes the tree's
/// directories: a run that died early leaves provider leaves whose names the next run's
/// would reuse, and whose count its evidence would report. One takeover run per host at a
/// time (the worker's id is fixed).
fn clear_cgroups() {
    for root in cgroup_roots().iter().filter(|r| r.is_dir()) {
        let _ = std::fs::write(root.join("cgroup.kill"), "1");
        for _ in 0..CGROUP_REMOVE_TRIES_MAX {
            if remove_children(root) {
                break;
            }
            std::thread::sleep(Duration::from_millis(CGROUP_REMOVE_RETRY_MS));
        }
    }
}

/// Removes every cgroup directory beneath `dir`, deepest first; `true` when none is left.
fn remove_children(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return true;
    };
    let mut all_gone = true;
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            all_gone &= remove_children(&path) && std::fs::remove_dir(&path).is_ok();
        }
    }
    all_gone
}

/// What the provider does: commit once through the broker under its own fencing triple, then
/// wait; on SIGTERM (a graceful takeover or a stop) it leaves a capsule and exits.
const PROVIDER: &str = r#"#!/bin/sh
gen="$SQUADRON_GENERATION"
trap 'printf "{\"task_state\":\"handoff from g%s\",\"decisions\":[],\"pending_work\":[]}" "$gen" > /state/capsule.json; exit 0' TERM
echo "generation $gen" >> /workspace/notes.txt
python3 - > /state/commit-g$gen.json 2>&1 <<'PY'
import json, os, socket
def ask(req):
    s = socket.socket(socket.AF_UNIX)
    s.connect(os.environ["SQUADRON_BROKER_SOCKET"])
    s.sendall((json.dumps(req) + "\n").encode())
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    return json.loads(data)
fence = {"profile": int(os.environ["SQUADRON_PROFILE_ID"]),
         "lease": int(os.environ["SQUADRON_LEASE_ID"]),
         "generation": int(os.environ["SQUADRON_GENERATION"])}
head = ask(dict(op="head", **fence))
print(json.dumps(ask(dict(op="commit", expected_head=head.get("head"), paths=["notes.txt"],
    message="notes of generation %d" % fence["generation"],
    idempotency_key="notes-g%d" % fence["generation"], **fence))))
PY
while :; do sleep 0.2; done
"#;

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("worker: writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("worker: `{command}` failed: {message}")]
    Command { command: String, message: String },
    #[error("worker: spawning {bin}: {source}")]
    Spawn {
        bin: PathBuf,
        source: std::io::Error,
    },
    #[error("worker: sending SIG{signal}: {message}")]
    Signal {
        signal: &'static str,
        message: String,
    },
}

fn write(path: &Path, text: &str) -> Result<(), WorkerError> {
    std::fs::write(path, text).map_err(|source| WorkerError::Write {
        path: path.into(),
        source,
    })
}

fn git(dir: &Path, args: &[&str]) -> Result<(), WorkerError> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| WorkerError::Command {
            command: format!("git {}", args.join(" ")),
            message: e.to_string(),
        })?;
    if !out.status.success() {
        return Err(WorkerError::Command {
            command: format!("git {}", args.join(" ")),
            message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// The worker process and its files.
#[derive(Debug)]
pub struct WorkerProcess {
    dir: PathBuf,
    log: PathBuf,
    /// The repository the project sandbox is cloned from.
    pub repository: PathBuf,
    /// The worker's data directory: its broker sockets, the project sandboxes.
    pub data_dir: PathBuf,
    /// Where control nodes reach its API.
    pub listen: String,
    control: Vec<String>,
    cert_dir: PathBuf,
    child: Option<Child>,
    paused: bool,
}

impl WorkerProcess {
    /// Writes the repository and the provider script under `dir`; starts nothing. `listen`
    /// must be an address every node can reach.
    pub fn prepare(
        dir: &Path,
        listen: String,
        control: Vec<String>,
        cert_dir: &Path,
    ) -> Result<Self, WorkerError> {
        let repository = dir.join("repo");
        std::fs::create_dir_all(&repository).map_err(|source| WorkerError::Write {
            path: repository.clone(),
            source,
        })?;
        write(&repository.join("README.md"), "jepsen takeover workload\n")?;
        git(&repository, &["init", "-q", "-b", "main"])?;
        git(&repository, &["add", "."])?;
        git(
            &repository,
            &[
                "-c",
                "user.name=jepsen",
                "-c",
                "user.email=jepsen@squadron.local",
                "commit",
                "-q",
                "-m",
                "initial",
            ],
        )?;
        write(&dir.join("provider.sh"), PROVIDER)?;
        Ok(Self {
            dir: dir.into(),
            log: dir.join("worker.log"),
            data_dir: dir.join("data"),
            repository,
            listen,
            control,
            cert_dir: cert_dir.into(),
            child: None,
            paused: false,
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the worker (a no-op if it runs).
    pub fn start(&mut self, bin: &Path) -> Result<(), WorkerError> {
        if self.child.is_some() {
            return Ok(());
        }
        clear_cgroups();
        let open_log = || {
            crate::child::append_to(&self.log).map_err(|source| WorkerError::Write {
                path: self.log.clone(),
                source,
            })
        };
        let script = self.dir.join("provider.sh");
        let cgroup_root = cgroup2_mount()
            .map(|m| vec!["--cgroup-root".into(), m.into_os_string()])
            .unwrap_or_default();
        let provider = |name: &str| format!("{name}={}", script.display());
        let child = Command::new(bin)
            .args(["worker", "--id", WORKER, "--data-dir"])
            .arg(&self.data_dir)
            .args(["--listen", &self.listen, "--runtimes", "process"])
            .args(["--control", &self.control.join(",")])
            .arg("--cert-dir")
            .arg(&self.cert_dir)
            .args(["--heartbeat-interval-ms", &WORKER_HEARTBEAT_MS.to_string()])
            .args(["--agent-lease-ttl-ms", &AGENT_LEASE_TTL_MS.to_string()])
            .args(cgroup_root)
            .args(["--provider-script", &provider("codex")])
            .args(["--provider-script", &provider("claude")])
            // The repository is a local one the harness made; quotas would loop-mount an
            // image per sandbox, which the chaos run does not test.
            .args(["--allow-local-repositories", "--no-disk-quota"])
            .env("RUST_LOG", "warn,squadron_worker=info")
            .stdin(Stdio::null())
            .stdout(Stdio::from(open_log()?))
            .stderr(Stdio::from(open_log()?))
            .spawn()
            .map_err(|source| WorkerError::Spawn {
                bin: bin.into(),
                source,
            })?;
        self.child = Some(child);
        self.paused = false;
        Ok(())
    }

    fn signal(&self, signal: &'static str) -> Result<(), WorkerError> {
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        crate::child::signal(pid, signal).map_err(|message| WorkerError::Signal { signal, message })
    }

    /// SIGSTOP: the worker neither renews its leases nor answers; its providers run on until
    /// their watchdogs stop them.
    pub fn pause(&mut self) -> Result<(), WorkerError> {
        self.signal("STOP")?;
        self.paused = self.child.is_some();
        Ok(())
    }

    /// SIGCONT.
    pub fn resume(&mut self) -> Result<(), WorkerError> {
        if self.paused {
            self.signal("CONT")?;
            self.paused = false;
        }
        Ok(())
    }

    /// SIGTERM, as a service manager stops it, then SIGKILL after a bound.
    pub fn stop(&mut self) {
        let _ = self.resume();
        let _ = self.signal("TERM");
        let running = self.child.is_some();
        crate::child::wait_or_kill(&mut self.child, Duration::from_millis(WORKER_STOP_MS_MAX));
        // A worker that stops keeps its sandboxes for its next life; this one has none.
        if running {
            clear_cgroups();
        }
    }

    /// The last lines of the worker's log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::child::tail(&self.log, lines)
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_cgroup2_mount_is_found_on_hybrid_and_pure_hosts() {
        let hybrid = "25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:24 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                      27 25 0:25 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            cgroup2_mount_in(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount_in(pure),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        assert_eq!(
            cgroup2_mount_in("27 25 0:25 / /x rw - cgroup cgroup rw\n"),
            None
        );
    }
}
