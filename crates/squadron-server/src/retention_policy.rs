//! `[retention.terminal_tasks]` of a node's configuration: how long ended tasks stay listed
//! and how many are kept. The leader proposes its own node's policy (Nomad's servers GC jobs
//! by the leader's `job_gc_threshold` the same way), so set the same on every node.

use serde::{Deserialize, Serialize};
use squadron_core::command::PruneTasks;

/// The shortest `age_ms_max`: a task's end must stay visible long enough for its submitter to
/// read its outcome.
pub const TERMINAL_TASK_AGE_MS_MIN: u64 = 60_000;
/// The longest `age_ms_max`: a year.
pub const TERMINAL_TASK_AGE_MS_MAX: u64 = 365 * 24 * 3_600 * 1_000;
/// The largest `count_max`: DESIGN §7 sizes a node for 1M task records in 1.5 GiB; twice that
/// of ended ones alone is where a node would run out of memory first.
pub const TERMINAL_TASK_COUNT_MAX: u64 = 2_000_000;
/// `age_ms_max` by default: a week.
pub const TERMINAL_TASK_AGE_MS_DEFAULT: u64 = 7 * 24 * 3_600 * 1_000;
/// `count_max` by default.
pub const TERMINAL_TASK_COUNT_DEFAULT: u64 = 100_000;

/// `[retention]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionSettings {
    pub terminal_tasks: TerminalTaskRetention,
}

/// `[retention.terminal_tasks]`: a COMPLETED, FAILED or CANCELLED task is pruned once it
/// ended `age_ms_max` ago, or, while more than `count_max` of them are held, the one that
/// ended first. A FAILED_PRESERVED task goes by age only. Its logs and artifacts stay on its
/// worker; the API answers 404 "pruned" for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TerminalTaskRetention {
    pub age_ms_max: u64,
    pub count_max: u64,
}

impl Default for TerminalTaskRetention {
    fn default() -> Self {
        Self {
            age_ms_max: TERMINAL_TASK_AGE_MS_DEFAULT,
            count_max: TERMINAL_TASK_COUNT_DEFAULT,
        }
    }
}

impl TerminalTaskRetention {
    /// The field and reason of the first bad value.
    pub fn refusal(&self) -> Option<(&'static str, String)> {
        let age = self.age_ms_max;
        if !(TERMINAL_TASK_AGE_MS_MIN..=TERMINAL_TASK_AGE_MS_MAX).contains(&age) {
            return Some((
                "retention.terminal_tasks.age_ms_max",
                format!(
                    "must be {TERMINAL_TASK_AGE_MS_MIN}..={TERMINAL_TASK_AGE_MS_MAX} ms, got {age}"
                ),
            ));
        }
        if self.count_max > TERMINAL_TASK_COUNT_MAX {
            return Some((
                "retention.terminal_tasks.count_max",
                format!(
                    "must be 0..={TERMINAL_TASK_COUNT_MAX}, got {}",
                    self.count_max
                ),
            ));
        }
        None
    }

    pub fn command(&self) -> PruneTasks {
        PruneTasks {
            age_ms_max: self.age_ms_max,
            count_max: self.count_max,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_values_are_refused_by_name() {
        let short = TerminalTaskRetention {
            age_ms_max: 59_999,
            ..Default::default()
        };
        assert_eq!(
            short.refusal().map(|r| r.0),
            Some("retention.terminal_tasks.age_ms_max")
        );
        let many = TerminalTaskRetention {
            count_max: TERMINAL_TASK_COUNT_MAX + 1,
            ..Default::default()
        };
        let (field, reason) = many.refusal().expect("refused");
        assert_eq!(field, "retention.terminal_tasks.count_max");
        assert!(reason.contains("2000001"), "{reason}");
        assert_eq!(TerminalTaskRetention::default().refusal(), None);
        let none_kept = TerminalTaskRetention {
            count_max: 0,
            ..Default::default()
        };
        assert_eq!(none_kept.refusal(), None);
    }
}
