//! Reaping a leaf: freeze → kill → wait for `populated 0` in `cgroup.events` → rmdir.
//!
//! The proof of quiescence is the kernel's `populated 0` for the leaf, never a list of pids:
//! a pid list can miss a process forked after it was read, or name a reused pid. The pids
//! seen before the kill are still checked afterwards, as corroboration in the steps.

use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::cgroup_leaf::CgroupLeaf;
use crate::clock::now_ms;
use crate::error::IsolationError;
use crate::process_entry::ProcessEntry;

/// How long `Reaper::default` waits for `populated 0` after the kill.
pub const REAP_WAIT_MS_DEFAULT: u64 = 10_000;
/// The longest wait a reaper accepts; longer requests are clamped.
pub const REAP_WAIT_MS_MAX: u64 = 120_000;
/// Interval between reads of `cgroup.events` while waiting.
pub const REAP_POLL_MS: u64 = 20;
/// How long, after `populated 0`, the seen processes may take to finish exiting.
pub const REAP_EXIT_WAIT_MS_MAX: u64 = 2_000;
/// Tries of rmdir (every `REAP_POLL_MS`) on a leaf the kernel still reports busy right after
/// `populated 0` (a v1 memory leaf can stay busy for a moment while its charges drain).
pub const REAP_REMOVE_TRIES_MAX: u32 = 250;
/// Most pids listed by value in the steps; the rest are counted.
pub const REAP_PIDS_LISTED_MAX: usize = 32;

/// The result of a reap, kept as reap evidence for the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReapEvidence {
    /// The v2 leaf's path.
    pub cgroup: String,
    /// `false` only when the kernel reported `populated 0` (or the leaf no longer exists).
    pub populated: bool,
    /// When `populated` was last read, in ms since the Unix epoch.
    pub observed_at_ms: u64,
    /// What was done and seen, in order.
    pub steps: Vec<String>,
}

/// Freezes, kills and removes leaves, waiting a bounded time for them to empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reaper {
    wait: Duration,
}

impl Default for Reaper {
    fn default() -> Self {
        Reaper::new(Duration::from_millis(REAP_WAIT_MS_DEFAULT))
    }
}

impl Reaper {
    /// A reaper waiting up to `wait` (at most `REAP_WAIT_MS_MAX`) for `populated 0`.
    pub fn new(wait: Duration) -> Self {
        Reaper {
            wait: wait.min(Duration::from_millis(REAP_WAIT_MS_MAX)),
        }
    }

    /// Reaps `leaf`. A leaf that stays populated past the wait is not an error: the evidence
    /// says `populated: true`, the leaf stays (frozen and killed) and the caller must not
    /// treat it as proof. Errors are failures to read the leaf at all.
    pub fn reap(&self, leaf: &CgroupLeaf) -> Result<ReapEvidence, IsolationError> {
        let cgroup = leaf.path().display().to_string();
        let mut steps = Vec::new();
        if !leaf.exists() {
            // The v1 directories may outlive a v2 leaf removed by someone else.
            leaf.remove()?;
            steps.push("leaf absent: a cgroup can only be removed once empty".to_owned());
            return Ok(ReapEvidence {
                cgroup,
                populated: false,
                observed_at_ms: now_ms(),
                steps,
            });
        }

        let seen: Vec<ProcessEntry> = leaf
            .procs()?
            .into_iter()
            .filter_map(ProcessEntry::read)
            .collect();
        steps.push(format!(
            "saw {} process(es){}",
            seen.len(),
            list_pids(&seen)
        ));

        match leaf.freeze() {
            Ok(()) => steps.push("cgroup.freeze 1".to_owned()),
            // Killing works on a thawed leaf too; note it and go on.
            Err(e) => steps.push(format!("freeze failed ({e}); killing unfrozen")),
        }
        let method = leaf.kill()?;
        steps.push(format!("killed via {method}"));

        let started = Instant::now();
        let mut populated = leaf.populated()?;
        let mut observed_at_ms = now_ms();
        while populated && started.elapsed() < self.wait {
            thread::sleep(Duration::from_millis(REAP_POLL_MS));
            populated = leaf.populated()?;
            observed_at_ms = now_ms();
        }
        let waited_ms = started.elapsed().as_millis();
        if populated {
            steps.push(format!(
                "still populated after {waited_ms} ms; leaf kept frozen for inspection"
            ));
            return Ok(ReapEvidence {
                cgroup,
                populated,
                observed_at_ms,
                steps,
            });
        }
        steps.push(format!("cgroup.events populated 0 after {waited_ms} ms"));

        // A killed task leaves its cgroup early in its exit path, so `populated 0` can come a
        // moment before the last process is gone from /proc; the corroboration waits for it.
        let mut alive: Vec<ProcessEntry> = seen.iter().copied().filter(|p| p.is_alive()).collect();
        let mut exit_waited_ms = 0;
        while !alive.is_empty() && exit_waited_ms < REAP_EXIT_WAIT_MS_MAX {
            std::thread::sleep(std::time::Duration::from_millis(REAP_POLL_MS));
            exit_waited_ms += REAP_POLL_MS;
            alive.retain(|p| p.is_alive());
        }
        steps.push(format!(
            "{} of {} seen process(es) still alive{}",
            alive.len(),
            seen.len(),
            list_pids(&alive)
        ));

        steps.push(remove_with_retries(leaf));
        Ok(ReapEvidence {
            cgroup,
            populated,
            observed_at_ms,
            steps,
        })
    }
}

/// rmdir can briefly fail with EBUSY right after the last task left; retry a little.
fn remove_with_retries(leaf: &CgroupLeaf) -> String {
    let mut last_error = None;
    for _ in 0..REAP_REMOVE_TRIES_MAX {
        match leaf.remove() {
            Ok(()) => return format!("removed {}", leaf.path().display()),
            Err(e) => last_error = Some(e),
        }
        thread::sleep(Duration::from_millis(REAP_POLL_MS));
    }
    match last_error {
        Some(e) => format!("rmdir failed: {e}"),
        None => format!("removed {}", leaf.path().display()),
    }
}

fn list_pids(entries: &[ProcessEntry]) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let mut listed: Vec<String> = entries
        .iter()
        .take(REAP_PIDS_LISTED_MAX)
        .map(|e| e.pid.to_string())
        .collect();
    if entries.len() > REAP_PIDS_LISTED_MAX {
        listed.push(format!("and {} more", entries.len() - REAP_PIDS_LISTED_MAX));
    }
    format!(": {}", listed.join(" "))
}
