//! Signals to the harness's child processes (nodes, the takeover workload's worker).

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
