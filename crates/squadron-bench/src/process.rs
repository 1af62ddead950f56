//! A node process of either cluster: spawned with its output in a log file, killed with
//! SIGKILL when dropped, so no process outlives a failed run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// Lines of a node's log quoted in a startup error.
const LOG_TAIL_LINES_MAX: usize = 30;

/// A free loopback port (bound, then released: the window for a collision is tiny).
pub(crate) fn free_port() -> Result<u16, BenchError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| BenchError::io("bind a free port on", "127.0.0.1:0", e))
}

/// One running node.
#[derive(Debug)]
pub(crate) struct NodeProcess {
    pub(crate) name: String,
    pub(crate) log: PathBuf,
    child: Option<Child>,
}

impl NodeProcess {
    /// Spawns `command` with stdout and stderr appended to `log`.
    pub(crate) fn spawn(
        name: String,
        mut command: Command,
        log: PathBuf,
    ) -> Result<Self, BenchError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| BenchError::io("open log", &log, e))?;
        let err = file
            .try_clone()
            .map_err(|e| BenchError::io("open log", &log, e))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(file))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| BenchError::io("spawn node", format!("{name}: {command:?}"), e))?;
        Ok(Self {
            name,
            log,
            child: Some(child),
        })
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub(crate) fn running(&self) -> bool {
        self.child.is_some()
    }

    /// SIGKILL (kill -9): no shutdown path of the node runs.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The exit status if the process already ended on its own.
    pub(crate) fn exited(&mut self) -> Option<String> {
        let child = self.child.as_mut()?;
        match child.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// The resident set size, from `/proc/<pid>/status`.
    pub(crate) fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid()?)
    }

    pub(crate) fn log_tail(&self) -> String {
        format!(
            "--- {} ({}) ---\n{}",
            self.name,
            self.log.display(),
            tail(&self.log)
        )
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `VmRSS` of a process in KiB, if it runs.
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES_MAX)..].join("\n")
}

/// The memory of one node at the end of the workloads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeMemory {
    pub node: String,
    pub rss_kib: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_rss_is_read_from_proc_status() {
        let text = "Name:\tetcd\nVmPeak:\t  999 kB\nVmRSS:\t   51234 kB\nThreads:\t12\n";
        assert_eq!(parse_vm_rss(text), Some(51_234));
        assert_eq!(parse_vm_rss("Name:\tx\n"), None);
        let own = rss_kib(std::process::id()).expect("own RSS");
        assert!(own > 100, "{own}");
    }

    #[test]
    fn a_dropped_node_is_killed() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new("sleep");
        command.arg("600");
        let node = NodeProcess::spawn("sleeper".into(), command, dir.path().join("log")).unwrap();
        let pid = node.pid().unwrap();
        assert!(rss_kib(pid).is_some());
        drop(node);
        // Reaped by the drop: no /proc entry remains.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }
}
