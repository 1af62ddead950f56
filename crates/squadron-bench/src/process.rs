//! A node process of either cluster: spawned with its output in a log file, killed with
//! SIGKILL when dropped, so no process outlives a failed run.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::BenchError;

/// Lines of a node's log quoted in a startup error.
const LOG_TAIL_LINES_MAX: usize = 30;

/// The lowest port a node is given: above the well-known and most registered services.
const NODE_PORT_MIN: u32 = 10_000;
/// Where the kernel's ephemeral range is read (`low high`).
const EPHEMERAL_RANGE_PATH: &str = "/proc/sys/net/ipv4/ip_local_port_range";
/// Ports at least between [`NODE_PORT_MIN`] and the ephemeral range for the count below to
/// be worth it; with fewer, the kernel picks.
const NODE_PORTS_MIN: u32 = 1_024;

/// A free loopback port for a node to listen on, below the kernel's ephemeral range: a port
/// the kernel handed out for `:0` could, in the moment between its release here and the
/// node's bind, become the local end of any outgoing connection on the machine — a cluster's
/// own members dial each other while the next node starts (CI saw etcd fail to start on
/// exactly that). Below the range only an explicit bind takes a port. Each process starts at
/// its own offset (from its pid) and counts up, so the clusters of one process never get the
/// same port, and two processes only where their counts meet. The test clusters take theirs
/// here too.
pub fn free_port() -> Result<u16, BenchError> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = ephemeral_low().unwrap_or(0);
    if low < NODE_PORT_MIN + NODE_PORTS_MIN {
        return kernel_port();
    }
    let span = low - NODE_PORT_MIN;
    let offset = std::process::id().wrapping_mul(7_919) % span;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = NODE_PORT_MIN + (offset + n) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    kernel_port()
}

/// The first port of the kernel's ephemeral range, when it can be read.
fn ephemeral_low() -> Option<u32> {
    let range = std::fs::read_to_string(EPHEMERAL_RANGE_PATH).ok()?;
    range.split_whitespace().next()?.parse().ok()
}

/// A port the kernel picks (bound, then released), where no span below its range is left.
fn kernel_port() -> Result<u16, BenchError> {
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

    /// Ports below the ephemeral range, each one once. (Whether one stays free after the
    /// check is every other process's to decide: not asserted here.)
    #[test]
    fn node_ports_are_below_the_ephemeral_range_and_never_repeat() {
        let low = ephemeral_low().expect("the kernel's ephemeral range");
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("a free port")).collect();
        for port in &ports {
            assert!(
                (NODE_PORT_MIN..low).contains(&u32::from(*port)),
                "{port} not below {low}"
            );
        }
        let distinct: std::collections::BTreeSet<&u16> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
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
