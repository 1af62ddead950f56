//! Whether a soak leaked, decided from its samples alone (pure, so `squadron evidence` can
//! decide it again from a report): every count must return to its baseline at the end of
//! every cycle, and no Squadron process may grow its memory or open files beyond the bounds
//! between the end of the first cycle (caches warmed) and the last sample.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::sample::{Count, Sample, COUNT_ITEMS_MAX};

/// How much a process may grow over a soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bounds {
    pub rss_growth_bytes_max: u64,
    pub fd_growth_max: u64,
}

/// A series that stayed above its baseline after one or more cycles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Leak {
    pub series: String,
    pub baseline: u64,
    /// The most found at a cycle's end.
    pub found_max: u64,
    pub first_cycle: u32,
    /// Cycles whose end found more than the baseline.
    pub cycles: u32,
    /// What was found beyond the baseline, by name.
    pub items: Vec<String>,
}

/// A process that grew beyond a bound.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Growth {
    pub pid: u32,
    pub role: String,
    /// `rss_bytes` or `open_fds`.
    pub figure: String,
    pub from: u64,
    pub to: u64,
    pub bound: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SoakVerdict {
    pub leak_free: bool,
    pub leaks: Vec<Leak>,
    pub growth: Vec<Growth>,
    /// Cycles whose canary did not go as the ADR says (errors in the cycle's report).
    pub cycles_failed: Vec<u32>,
    /// Samples after the baseline that could not see everything.
    pub samples_incomplete: Vec<u32>,
}

/// Decides the verdict; `samples[0]` is the baseline.
pub fn judge(samples: &[Sample], cycles_failed: Vec<u32>, bounds: &Bounds) -> SoakVerdict {
    let leaks = samples
        .split_first()
        .map(|(base, rest)| leaks(base, rest))
        .unwrap_or_default();
    let growth = growth(samples, bounds);
    let samples_incomplete: Vec<u32> = samples
        .iter()
        .skip(1)
        .filter(|s| !s.errors.is_empty())
        .map(|s| s.cycle)
        .collect();
    SoakVerdict {
        leak_free: samples.len() >= 2
            && leaks.is_empty()
            && growth.is_empty()
            && cycles_failed.is_empty()
            && samples_incomplete.is_empty(),
        leaks,
        growth,
        cycles_failed,
        samples_incomplete,
    }
}

/// Series the first cycle may raise for good, judged from its end instead: a profile's
/// worktree is made at its first launch and kept for the profile's life.
pub const KEPT_FROM_FIRST_CYCLE: [&str; 1] = ["worktrees"];

/// The sample a series is judged against: the baseline; or, for a series the first cycle may
/// raise for good or one the baseline could not see (the worker's, on a project whose sandbox
/// the first cycle made), the first later sample that holds it. `None`: no sample does yet.
pub fn reference<'a>(series: &str, base: &'a Sample, rest: &'a [Sample]) -> Option<&'a Sample> {
    if !KEPT_FROM_FIRST_CYCLE.contains(&series) && base.counts.contains_key(series) {
        return Some(base);
    }
    rest.iter().find(|s| s.counts.contains_key(series))
}

fn leaks(base: &Sample, rest: &[Sample]) -> Vec<Leak> {
    let mut found: BTreeMap<&str, Leak> = BTreeMap::new();
    let zero = Count::default();
    for s in rest {
        for (series, count) in &s.counts {
            let Some(from) = reference(series, base, rest) else {
                continue;
            };
            if std::ptr::eq(from, s) {
                continue;
            }
            let before = from.counts.get(series).unwrap_or(&zero);
            if count.n <= before.n {
                continue;
            }
            let known: BTreeSet<&String> = before.items.iter().collect();
            let leak = found.entry(series).or_insert_with(|| Leak {
                series: series.clone(),
                baseline: before.n,
                found_max: 0,
                first_cycle: s.cycle,
                cycles: 0,
                items: Vec::new(),
            });
            leak.found_max = leak.found_max.max(count.n);
            leak.cycles += 1;
            for item in count.items.iter().filter(|i| !known.contains(i)) {
                if leak.items.len() < COUNT_ITEMS_MAX && !leak.items.contains(item) {
                    leak.items.push(item.clone());
                }
            }
        }
    }
    found.into_values().collect()
}

/// From the end of the first cycle (the baseline when there is no later sample) to the last.
fn growth(samples: &[Sample], bounds: &Bounds) -> Vec<Growth> {
    let (Some(first), Some(last)) = (samples.get(1).or(samples.first()), samples.last()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for p in &last.processes {
        let Some(q) = first
            .processes
            .iter()
            .find(|q| q.pid == p.pid && q.role == p.role)
        else {
            continue;
        };
        let figures = [
            (
                "rss_bytes",
                q.rss_bytes,
                p.rss_bytes,
                bounds.rss_growth_bytes_max,
            ),
            ("open_fds", q.open_fds, p.open_fds, bounds.fd_growth_max),
        ];
        for (figure, from, to, bound) in figures {
            if to.saturating_sub(from) > bound {
                out.push(Growth {
                    pid: p.pid,
                    role: p.role.clone(),
                    figure: figure.into(),
                    from,
                    to,
                    bound,
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::sample::ProcessFigures;
    use super::*;

    const BOUNDS: Bounds = Bounds {
        rss_growth_bytes_max: 1000,
        fd_growth_max: 4,
    };

    fn sample(cycle: u32, leaves: &[&str], leases: u64, rss: u64, fds: u64) -> Sample {
        let mut s = Sample {
            cycle,
            ..Sample::default()
        };
        s.counts.insert(
            "cgroup_leaves".into(),
            Count::of(leaves.iter().map(|l| l.to_string())),
        );
        s.counts
            .insert("leases_not_terminal".into(), Count::number(leases));
        s.processes.push(ProcessFigures {
            pid: 7,
            role: "worker".into(),
            rss_bytes: rss,
            open_fds: fds,
        });
        s
    }

    #[test]
    fn counts_back_at_their_baseline_after_every_cycle_pass() {
        let samples = [
            sample(0, &["keep"], 0, 100, 10),
            sample(1, &["keep"], 0, 5000, 20),
            sample(2, &["keep"], 0, 5500, 22),
            sample(3, &[], 0, 5900, 24),
        ];
        let v = judge(&samples, vec![], &BOUNDS);
        assert!(v.leak_free, "{v:?}");
    }

    #[test]
    fn a_leaf_left_after_a_cycle_is_a_leak_named_with_its_first_cycle() {
        let samples = [
            sample(0, &["keep"], 0, 100, 10),
            sample(1, &["keep"], 0, 100, 10),
            sample(2, &["keep", "g3-leaked"], 0, 100, 10),
            sample(3, &["keep", "g3-leaked"], 1, 100, 10),
        ];
        let v = judge(&samples, vec![], &BOUNDS);
        assert!(!v.leak_free);
        assert_eq!(v.leaks.len(), 2, "{v:?}");
        let leaf = v
            .leaks
            .iter()
            .find(|l| l.series == "cgroup_leaves")
            .unwrap();
        assert_eq!(
            (leaf.first_cycle, leaf.cycles, leaf.baseline, leaf.found_max),
            (2, 2, 1, 2)
        );
        assert_eq!(leaf.items, vec!["g3-leaked".to_string()]);
        let lease = v
            .leaks
            .iter()
            .find(|l| l.series == "leases_not_terminal")
            .unwrap();
        assert_eq!((lease.first_cycle, lease.found_max), (3, 1));
    }

    /// The worker's series are missing from the baseline of a project whose sandbox the first
    /// cycle made: they count from the first sample that holds them.
    #[test]
    fn a_series_missing_from_the_baseline_counts_from_its_first_sample() {
        let base = Sample::default();
        let v = judge(
            &[
                base.clone(),
                sample(1, &["x"], 0, 1, 1),
                sample(2, &["x"], 0, 1, 1),
            ],
            vec![],
            &BOUNDS,
        );
        assert!(v.leak_free, "{v:?}");
        let v = judge(
            &[
                base,
                sample(1, &["x"], 0, 1, 1),
                sample(2, &["x", "y"], 0, 1, 1),
            ],
            vec![],
            &BOUNDS,
        );
        assert_eq!(v.leaks.len(), 1, "{v:?}");
        assert_eq!(v.leaks[0].series, "cgroup_leaves");
        assert_eq!((v.leaks[0].baseline, v.leaks[0].first_cycle), (1, 2));
        assert_eq!(v.leaks[0].items, vec!["y".to_string()]);
    }

    /// Worktrees made by the first cycle's launches stay with their profiles; one more after
    /// it is a leak.
    #[test]
    fn worktrees_count_from_the_first_cycle_s_end() {
        let with = |cycle: u32, trees: &[&str]| {
            let mut s = sample(cycle, &[], 0, 100, 10);
            s.counts.insert(
                "worktrees".into(),
                Count::of(trees.iter().map(|t| t.to_string())),
            );
            s
        };
        let made = [with(0, &[]), with(1, &["a", "b"]), with(2, &["a", "b"])];
        assert!(judge(&made, vec![], &BOUNDS).leak_free);
        let grown = [
            with(0, &[]),
            with(1, &["a", "b"]),
            with(2, &["a", "b"]),
            with(3, &["a", "b", "c"]),
        ];
        let v = judge(&grown, vec![], &BOUNDS);
        assert_eq!(v.leaks.len(), 1, "{v:?}");
        let leak = &v.leaks[0];
        assert_eq!(
            (leak.series.as_str(), leak.baseline, leak.first_cycle),
            ("worktrees", 2, 3)
        );
        assert_eq!(leak.items, vec!["c".to_string()]);
        // Other series still count from the sample before the first cycle.
        let mut leaf = made.clone();
        leaf[1]
            .counts
            .insert("cgroup_leaves".into(), Count::of(["x".to_string()]));
        leaf[2]
            .counts
            .insert("cgroup_leaves".into(), Count::of(["x".to_string()]));
        assert!(!judge(&leaf, vec![], &BOUNDS).leak_free);
    }

    #[test]
    fn growth_counts_from_the_first_cycle_and_only_beyond_the_bound() {
        let samples = [
            sample(0, &[], 0, 100, 10),
            sample(1, &[], 0, 10_000, 30),
            sample(2, &[], 0, 11_000, 34),
        ];
        assert!(judge(&samples, vec![], &BOUNDS).leak_free);
        let grown = [
            sample(0, &[], 0, 100, 10),
            sample(1, &[], 0, 10_000, 30),
            sample(2, &[], 0, 11_001, 35),
        ];
        let v = judge(&grown, vec![], &BOUNDS);
        let figures: Vec<&str> = v.growth.iter().map(|g| g.figure.as_str()).collect();
        assert_eq!(figures, ["rss_bytes", "open_fds"], "{v:?}");
        assert!(!v.leak_free);
    }

    #[test]
    fn failed_cycles_incomplete_samples_and_no_cycle_at_all_fail() {
        let ok = [sample(0, &[], 0, 1, 1), sample(1, &[], 0, 1, 1)];
        assert!(!judge(&ok, vec![1], &BOUNDS).leak_free);
        let mut blind = ok.clone();
        blind[1].errors.push("the worker did not answer".into());
        let v = judge(&blind, vec![], &BOUNDS);
        assert_eq!(v.samples_incomplete, vec![1]);
        assert!(!v.leak_free);
        assert!(!judge(&ok[..1], vec![], &BOUNDS).leak_free);
    }
}
