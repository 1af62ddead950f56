//! Cancelling a run: SIGTERM, a grace period, then SIGKILL.
//!
//! SIGTERM goes only to the processes inside the boundary's PID namespace. The shim and the
//! outer bubblewrap live in the worker's namespace and must survive: a SIGTERM to the outer
//! bubblewrap kills it, and `--die-with-parent` then SIGKILLs the whole boundary before the
//! provider could handle its SIGTERM; the shim must live on to record the exit code.
//!
//! SIGKILL first goes to the same processes, so that bubblewrap exits with 137 and the shim
//! records it; whatever still remains after `TERMINATE_KILL_SETTLE_MS` (shim included) is
//! killed through `cgroup.kill`.

use std::thread;
use std::time::{Duration, Instant};

use crate::cgroup_leaf::{send_signal, CgroupLeaf};
use crate::error::IsolationError;
use crate::reaper::REAP_WAIT_MS_DEFAULT;

/// The longest grace period accepted; longer requests are clamped.
pub const TERMINATE_GRACE_MS_MAX: u64 = 600_000;
/// After SIGKILL of the boundary, how long the shim gets to record the exit code.
pub const TERMINATE_KILL_SETTLE_MS: u64 = 5_000;
/// Interval between reads of `cgroup.events` while waiting.
pub const TERMINATE_POLL_MS: u64 = 20;

/// How a termination ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminationOutcome {
    /// The leaf was empty already (or absent).
    NotRunning,
    /// Everything exited within the grace period after SIGTERM.
    ExitedWithinGrace,
    /// SIGKILL of the boundary emptied the leaf; the shim recorded the exit code.
    Killed,
    /// Only `cgroup.kill` emptied the leaf; no exit code may have been recorded.
    KilledViaCgroup,
    /// The leaf is still populated after everything; the caller must reap it.
    StillPopulated,
}

/// SIGTERM, grace, SIGKILL for one leaf.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Termination {
    grace: Duration,
}

impl Termination {
    /// A termination allowing `grace` (at most `TERMINATE_GRACE_MS_MAX`) after SIGTERM.
    pub fn new(grace: Duration) -> Self {
        Termination {
            grace: grace.min(Duration::from_millis(TERMINATE_GRACE_MS_MAX)),
        }
    }

    /// Runs the sequence, blocking for at most grace + settle + reap wait.
    pub fn run(&self, leaf: &CgroupLeaf) -> Result<TerminationOutcome, IsolationError> {
        if !leaf.populated()? {
            return Ok(TerminationOutcome::NotRunning);
        }
        send_signal("TERM", &leaf.sandboxed_procs()?)?;
        if wait_empty(leaf, self.grace)? {
            return Ok(TerminationOutcome::ExitedWithinGrace);
        }
        send_signal("KILL", &leaf.sandboxed_procs()?)?;
        if wait_empty(leaf, Duration::from_millis(TERMINATE_KILL_SETTLE_MS))? {
            return Ok(TerminationOutcome::Killed);
        }
        leaf.kill()?;
        if wait_empty(leaf, Duration::from_millis(REAP_WAIT_MS_DEFAULT))? {
            return Ok(TerminationOutcome::KilledViaCgroup);
        }
        Ok(TerminationOutcome::StillPopulated)
    }
}

/// Polls `populated` until 0 (true) or `limit` passes (false).
fn wait_empty(leaf: &CgroupLeaf, limit: Duration) -> Result<bool, IsolationError> {
    let started = Instant::now();
    loop {
        if !leaf.populated()? {
            return Ok(true);
        }
        if started.elapsed() >= limit {
            return Ok(false);
        }
        thread::sleep(Duration::from_millis(TERMINATE_POLL_MS));
    }
}
