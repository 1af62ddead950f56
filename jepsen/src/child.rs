//! The harness's child processes (nodes, the takeover workload's worker): their logs,
//! signals and stops.

use std::fs::File;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// `kill -SIGNAL pid`; the error is `kill`'s own message.
pub fn signal(pid: u32, signal: &str) -> Result<(), String> {
    let out = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
    }
    Ok(())
}

/// Waits up to `wait` for a signalled child to exit, then SIGKILLs it; the child is gone
/// either way.
pub fn wait_or_kill(child: &mut Option<Child>, wait: Duration) {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        match child.as_mut().map(Child::try_wait) {
            Some(Ok(None)) => std::thread::sleep(Duration::from_millis(50)),
            _ => {
                *child = None;
                return;
            }
        }
    }
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The child's log, opened for appending (created when missing): one handle for stdout,
/// one for stderr.
pub fn append_to(log: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
}

/// The last `lines` lines of a log, for error messages (empty when it cannot be read).
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
