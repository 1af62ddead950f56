//! Counts and durations of a set of tasks. The state keeps one of the tasks its retention
//! policy pruned, so that figures which only ever grow (a Prometheus counter or histogram)
//! keep growing after the records themselves are gone, and (derived) one of every task that
//! ended; `/metrics` adds one of the live tasks to the latter.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::manifest::RuntimeKind;
use crate::task::{Task, TaskState};

/// Upper bounds of the duration buckets, in milliseconds: 0.5 s doubling to about 3 days
/// (the last bucket above them is unbounded). The metrics' histograms use the same bounds, so
/// the live tasks' durations and the pruned ones' add up bucket by bucket.
pub const DURATION_BUCKET_BOUNDS_MS: [u64; 20] = {
    let mut bounds = [0; 20];
    let mut i = 0;
    while i < bounds.len() {
        bounds[i] = 500 << i;
        i += 1;
    }
    bounds
};

/// A histogram of durations in the buckets of [`DURATION_BUCKET_BOUNDS_MS`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurationTally {
    pub count: u64,
    pub sum_ms: u64,
    /// How many durations fell in each bucket (not cumulative); one more than the bounds, the
    /// last for everything above the largest bound.
    pub buckets: Vec<u64>,
}

impl Default for DurationTally {
    fn default() -> Self {
        Self {
            count: 0,
            sum_ms: 0,
            buckets: vec![0; DURATION_BUCKET_BOUNDS_MS.len() + 1],
        }
    }
}

impl DurationTally {
    pub fn observe(&mut self, ms: u64) {
        let bucket = DURATION_BUCKET_BOUNDS_MS.partition_point(|bound| *bound < ms);
        self.count += 1;
        self.sum_ms = self.sum_ms.saturating_add(ms);
        self.buckets[bucket] += 1;
    }

    /// Adds another tally's counts to this one.
    pub fn absorb(&mut self, other: &DurationTally) {
        self.count += other.count;
        self.sum_ms = self.sum_ms.saturating_add(other.sum_ms);
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
    }

    /// Whether the tally has the shape [`DurationTally::default`] gives it and its counts
    /// agree (a snapshot must not decode into one that panics or lies).
    pub fn is_consistent(&self) -> bool {
        self.buckets.len() == DURATION_BUCKET_BOUNDS_MS.len() + 1
            && self.buckets.iter().sum::<u64>() == self.count
    }
}

/// Tasks summed: the state's pruned ones, its ended ones, or a scrape's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskTally {
    pub count: u64,
    /// For each state, how many of the tasks had entered it.
    pub entered: BTreeMap<TaskState, u64>,
    /// Submit to end, by the state the task ended in.
    pub durations: BTreeMap<TaskState, DurationTally>,
    /// PROVISIONING to READY, by runtime.
    pub provisions: BTreeMap<RuntimeKind, DurationTally>,
}

impl TaskTally {
    pub fn add(&mut self, task: &Task) {
        self.count += 1;
        for state in task.entered_at_ms.keys() {
            *self.entered.entry(*state).or_default() += 1;
        }
        let end = task.entered_at_ms.get(&task.state);
        if let Some(end) = end.filter(|_| task.state.is_terminal()) {
            self.durations
                .entry(task.state)
                .or_default()
                .observe(end.saturating_sub(task.submitted_at_ms));
        }
        if let Some(ms) = provision_ms(task) {
            self.provisions
                .entry(task.spec.sandbox.runtime)
                .or_default()
                .observe(ms);
        }
    }

    /// Adds another tally's figures to this one.
    pub fn absorb(&mut self, other: &TaskTally) {
        self.count += other.count;
        for (state, n) in &other.entered {
            *self.entered.entry(*state).or_default() += n;
        }
        for (state, tally) in &other.durations {
            self.durations.entry(*state).or_default().absorb(tally);
        }
        for (runtime, tally) in &other.provisions {
            self.provisions.entry(*runtime).or_default().absorb(tally);
        }
    }

    pub(crate) fn check(&self) -> Result<(), String> {
        let tallies = self.durations.values().chain(self.provisions.values());
        if tallies.clone().any(|t| !t.is_consistent()) {
            return Err("pruned tasks: a duration tally is malformed".into());
        }
        let ended: u64 = self.durations.values().map(|t| t.count).sum();
        if ended > self.count {
            return Err(format!(
                "pruned tasks: {ended} durations for {} tasks",
                self.count
            ));
        }
        Ok(())
    }
}

/// PROVISIONING to READY of a task that got that far.
pub fn provision_ms(task: &Task) -> Option<u64> {
    let from = task.entered_at_ms.get(&TaskState::Provisioning)?;
    let to = task.entered_at_ms.get(&TaskState::Ready)?;
    Some(to.saturating_sub(*from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_falls_in_the_first_bucket_whose_bound_holds_it() {
        let mut t = DurationTally::default();
        for ms in [0, 500, 501, 1_000, u64::MAX] {
            t.observe(ms);
        }
        assert_eq!(t.count, 5);
        assert_eq!(&t.buckets[..3], &[2, 2, 0]);
        assert_eq!(t.buckets[DURATION_BUCKET_BOUNDS_MS.len()], 1);
        assert!(t.is_consistent());
        assert_eq!(DURATION_BUCKET_BOUNDS_MS[19], 500 << 19);
    }

    #[test]
    fn a_tally_of_another_shape_is_inconsistent() {
        let mut t = DurationTally::default();
        t.buckets.pop();
        assert!(!t.is_consistent());
        let t = DurationTally {
            count: 1,
            ..Default::default()
        };
        assert!(!t.is_consistent());
    }
}
