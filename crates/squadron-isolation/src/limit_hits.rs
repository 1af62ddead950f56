//! Which of a leaf's limits stopped its processes, by the kernel's own counters, so a task
//! that died at its memory or pids limit fails saying so instead of "exited with code 137":
//! processes the OOM killer killed in the leaf (v2 `memory.events`, or v1
//! `memory.oom_control` where memory is v1) and forks refused at the pids limit
//! (`pids.events`, `max`), with the limits in force.

use std::path::Path;

use crate::cgroup_leaf::{flat_keyed, CgroupLeaf};
use crate::error::IsolationError;
use crate::leaf_usage::read_control;

/// A leaf's limit counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LimitHits {
    /// Processes of the leaf the OOM killer killed.
    pub oom_kills: u64,
    /// Times the leaf's memory use met its limit (v2 `memory.events` `max`, v1
    /// `memory.failcnt` plus `memory.memsw.failcnt`, else 1 if its peak reached the limit):
    /// with OOM kills, the limit is what killed them, not the host's own shortage.
    pub memory_limit_met: u64,
    /// Forks (and clones) refused at the leaf's pids limit.
    pub forks_refused: u64,
    /// The memory limit in force, in bytes; `None`: none set.
    pub memory_limit_bytes: Option<u64>,
    /// The pids limit in force; `None`: none set.
    pub pids_limit: Option<u64>,
}

impl LimitHits {
    /// The leaf's counters now; `None` when the leaf does not exist.
    pub fn of(leaf: &CgroupLeaf) -> Result<Option<LimitHits>, IsolationError> {
        if !leaf.exists() {
            return Ok(None);
        }
        let (oom_kills, memory_limit_met) = match leaf.memory_limit_file() {
            Some(limit) if limit.ends_with("memory.max") => {
                let events = leaf.path().join("memory.events");
                (counter(&events, "oom_kill")?, counter(&events, "max")?)
            }
            Some(limit) => (
                counter(&sibling(&limit, "memory.oom_control"), "oom_kill")?,
                v1_limit_met(&limit)?,
            ),
            None => (0, 0),
        };
        let forks_refused = match leaf.pids_limit_file() {
            Some(limit) => counter(&sibling(&limit, "pids.events"), "max")?,
            None => 0,
        };
        Ok(Some(LimitHits {
            oom_kills,
            memory_limit_met,
            forks_refused,
            memory_limit_bytes: leaf.memory_limit_file().and_then(|f| limit_value(&f)),
            pids_limit: leaf.pids_limit_file().and_then(|f| limit_value(&f)),
        }))
    }

    /// The limits that stopped something, for a task's error; `None` when none did.
    pub fn describe(&self) -> Option<String> {
        let mut hit = Vec::new();
        if self.oom_kills > 0 && self.memory_limit_met > 0 {
            let limit = self
                .memory_limit_bytes
                .map(|b| format!(" of {b} bytes"))
                .unwrap_or_default();
            hit.push(format!(
                "the memory limit{limit} was reached: the kernel killed {} process(es) out of \
                 memory",
                self.oom_kills
            ));
        }
        if self.forks_refused > 0 {
            let limit = self
                .pids_limit
                .map(|n| format!(" of {n}"))
                .unwrap_or_default();
            hit.push(format!(
                "the pids limit{limit} was reached: {} fork(s) refused",
                self.forks_refused
            ));
        }
        (!hit.is_empty()).then(|| hit.join("; "))
    }
}

fn sibling(file: &Path, name: &str) -> std::path::PathBuf {
    file.with_file_name(name)
}

/// A counter of a flat-keyed control file; 0 when the file or the key is absent (an older
/// kernel without the counter).
fn counter(file: &Path, key: &str) -> Result<u64, IsolationError> {
    let Some(text) = read_control(file)? else {
        return Ok(0);
    };
    Ok(flat_keyed(&text, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0))
}

/// v1: the failures counted at the memory limit and at the memory + swap one (`memsw`, set
/// equal to it, is charged first). Some kernels leave both counts at 0 when `memsw` refused
/// the charge, so a peak use that reached the limit counts once too.
fn v1_limit_met(limit_file: &Path) -> Result<u64, IsolationError> {
    let number = |name: &str| -> Result<u64, IsolationError> {
        Ok(read_control(&sibling(limit_file, name))?
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0))
    };
    let failed = number("memory.failcnt")? + number("memory.memsw.failcnt")?;
    let peak_reached = |peak: &str, limit: &str| {
        limit_value(&sibling(limit_file, limit))
            .is_some_and(|limit| number(peak).is_ok_and(|peak| peak >= limit))
    };
    let reached = peak_reached("memory.max_usage_in_bytes", "memory.limit_in_bytes")
        || peak_reached(
            "memory.memsw.max_usage_in_bytes",
            "memory.memsw.limit_in_bytes",
        );
    Ok(if failed == 0 && reached { 1 } else { failed })
}

/// A limit file's value: `max` (v2) or a v1 "unlimited" near `u64::MAX` reads as none.
fn limit_value(file: &Path) -> Option<u64> {
    let text = read_control(file).ok()??;
    parse_limit(&text)
}

/// `max`, or a number below v1's "unlimited" (`PAGE_COUNTER_MAX` pages, > 2^62 bytes).
pub(crate) fn parse_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n < 1 << 62).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_read_max_and_v1_unlimited_as_none() {
        assert_eq!(parse_limit("67108864\n"), Some(64 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("32"), Some(32));
    }

    #[test]
    fn only_the_limits_that_stopped_something_are_named() {
        let none = LimitHits {
            memory_limit_bytes: Some(64 << 20),
            pids_limit: Some(32),
            ..LimitHits::default()
        };
        assert_eq!(none.describe(), None);
        let host_wide = LimitHits {
            oom_kills: 2,
            ..none
        };
        assert_eq!(host_wide.describe(), None, "killed, but not at the limit");
        let memory = LimitHits {
            oom_kills: 2,
            memory_limit_met: 7,
            ..none
        };
        let text = memory.describe().expect("memory hit");
        assert!(text.contains("memory limit of 67108864 bytes"), "{text}");
        assert!(text.contains("killed 2 process"), "{text}");
        assert!(!text.contains("pids"), "{text}");
        let both = LimitHits {
            forks_refused: 5,
            ..memory
        };
        let text = both.describe().expect("both hit");
        assert!(
            text.contains("pids limit of 32 was reached: 5 fork"),
            "{text}"
        );
    }
}
