//! What `squadron bench scale` reports, and the node figures it reads from `/metrics`.

use serde::{Deserialize, Serialize};

use crate::machine::MachineInfo;
use crate::scale_load::LoadPhase;
use crate::scale_options::ScaleOptions;

/// A server histogram read back from its cumulative buckets: the percentiles are the upper
/// bounds of the buckets they fall in (the buckets double, so a figure is at most twice the
/// truth); `None` when they fall in the last, unbounded bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct BucketSummary {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_le_ms: Option<f64>,
    pub p99_le_ms: Option<f64>,
    /// The upper bound of the highest bucket any observation fell in.
    pub max_le_ms: Option<f64>,
}

impl BucketSummary {
    /// From `(upper bound in seconds, cumulative count)` pairs, the `+Inf` bucket included,
    /// and the sum of the observations in seconds.
    pub fn of(buckets: &[(f64, f64)], sum_s: f64) -> BucketSummary {
        let mut buckets = buckets.to_vec();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let count = buckets.last().map_or(0.0, |b| b.1);
        if count <= 0.0 {
            return BucketSummary::default();
        }
        let bound = |rank: f64| {
            buckets
                .iter()
                .find(|(_, c)| *c >= rank)
                .and_then(|(le, _)| le.is_finite().then_some(le * 1_000.0))
        };
        BucketSummary {
            count: count as u64,
            mean_ms: sum_s / count * 1_000.0,
            p50_le_ms: bound((0.50 * count).ceil()),
            p99_le_ms: bound((0.99 * count).ceil()),
            max_le_ms: bound(count),
        }
    }
}

/// One node's figures, read from its `/metrics` and `/proc`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeFigures {
    pub node: u64,
    pub rss_kib: Option<u64>,
    /// How long the node took to answer `/metrics` (it tallies the tasks under the state's
    /// read lock).
    pub metrics_ms: f64,
    pub entries_applied: u64,
    /// Each applied batch, lock wait included.
    pub apply: BucketSummary,
    /// The lock wait alone.
    pub apply_lock_wait: BucketSummary,
    /// Each log entry applied (DESIGN §7's apply p99).
    #[serde(default)]
    pub apply_entry: BucketSummary,
    /// The applying thread's CPU time for each entry.
    #[serde(default)]
    pub apply_entry_cpu: BucketSummary,
    pub snapshot_build: BucketSummary,
    /// The part of each build that holds the lock.
    pub snapshot_copy: BucketSummary,
    pub snapshot_install: BucketSummary,
    pub snapshot_bytes: u64,
    /// From the replicated state, so every caught-up node says the same: tasks submitted
    /// (`squadron_tasks_total{state="PENDING"}`), cancelled, and pending now.
    pub tasks_submitted: u64,
    pub tasks_cancelled: u64,
    pub tasks_pending: u64,
}

impl NodeFigures {
    /// Reads the state machine's figures from a node's `/metrics` text.
    pub fn from_metrics(node: u64, text: &str) -> NodeFigures {
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let Ok(scrape) = prometheus_parse::Scrape::parse(lines) else {
            return NodeFigures {
                node,
                ..NodeFigures::default()
            };
        };
        let scalar = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .and_then(|s| match s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => Some(v),
                    _ => None,
                })
                .unwrap_or(0.0)
        };
        let labelled = |name: &str, state: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name && s.labels.get("state") == Some(state))
                .and_then(|s| match s.value {
                    prometheus_parse::Value::Counter(v)
                    | prometheus_parse::Value::Gauge(v)
                    | prometheus_parse::Value::Untyped(v) => Some(v as u64),
                    _ => None,
                })
                .unwrap_or(0)
        };
        let histogram = |name: &str| {
            let buckets: Vec<(f64, f64)> = scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .map(|s| match &s.value {
                    prometheus_parse::Value::Histogram(b) => {
                        b.iter().map(|b| (b.less_than, b.count)).collect()
                    }
                    _ => Vec::new(),
                })
                .unwrap_or_default();
            BucketSummary::of(&buckets, scalar(&format!("{name}_sum")))
        };
        NodeFigures {
            node,
            rss_kib: None,
            metrics_ms: 0.0,
            entries_applied: scalar("squadron_entries_applied_total") as u64,
            apply: histogram("squadron_apply_duration_seconds"),
            apply_lock_wait: histogram("squadron_apply_lock_wait_seconds"),
            apply_entry: histogram("squadron_apply_entry_duration_seconds"),
            apply_entry_cpu: histogram("squadron_apply_entry_cpu_seconds"),
            snapshot_build: histogram("squadron_snapshot_build_duration_seconds"),
            snapshot_copy: histogram("squadron_snapshot_copy_duration_seconds"),
            snapshot_install: histogram("squadron_snapshot_install_duration_seconds"),
            snapshot_bytes: scalar("squadron_snapshot_bytes") as u64,
            tasks_submitted: labelled("squadron_tasks_total", "PENDING"),
            tasks_cancelled: labelled("squadron_tasks_total", "CANCELLED"),
            tasks_pending: labelled("squadron_tasks_active", "PENDING"),
        }
    }
}

/// A restarted or added node catching up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CatchUp {
    pub node: u64,
    /// The leader's applied index when the measurement began: the target.
    pub target_index: u64,
    /// Start (restart, or the request to add it) → the node answers its status.
    pub answered_ms: Option<f64>,
    /// Start → the node has applied up to the target.
    pub caught_up_ms: Option<f64>,
    /// The node's figures once caught up (its snapshot install, for an added node).
    pub figures: NodeFigures,
}

/// Everything `squadron bench scale` reports (`--output json` prints this).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleReport {
    pub machine: MachineInfo,
    pub squadron_version: String,
    pub options: ScaleOptions,
    pub profiles: LoadPhase,
    pub tasks: LoadPhase,
    /// Every node after the load.
    pub nodes: Vec<NodeFigures>,
    /// A follower killed with SIGKILL and started again from its disk.
    pub restart: CatchUp,
    /// A new node added as a learner, caught up from the leader (by snapshot when the leader's
    /// log no longer holds the start).
    pub install: CatchUp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_string(), |v| format!("{v:.1}"))
}

/// For figures of microseconds.
fn fine_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "—".to_string(), |v| format!("{v:.3}"))
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "—".to_string(), |k| format!("{:.0}", k as f64 / 1024.0))
}

fn phase_line(what: &str, p: &LoadPhase) -> String {
    format!(
        "{what:<9} {:>10} writes in {:>7.1} s = {:>7.0}/s; latency p50 {:.1} p99 {:.1} max {:.1} ms; {} errors\n",
        p.writes, p.seconds, p.writes_per_s, p.latency.p50_ms, p.latency.p99_ms, p.latency.max_ms, p.errors
    )
}

/// The report as a terminal table.
pub fn render_scale(r: &ScaleReport) -> String {
    let o = &r.options;
    let mut out = format!(
        "squadron bench scale — {} nodes; {} projects × {} profiles = {} profiles; {} tasks \
         ({} left pending); {} clients; {} ({} CPUs)\n{}\n\n",
        o.nodes,
        o.projects,
        o.profiles_per_project,
        o.profiles(),
        o.tasks,
        o.pending_tasks,
        o.clients,
        r.machine.cpu_model,
        r.machine.cpus,
        r.squadron_version
    );
    out.push_str(&phase_line("profiles", &r.profiles));
    out.push_str(&phase_line("tasks", &r.tasks));
    for p in [&r.profiles, &r.tasks] {
        for e in &p.error_samples {
            out.push_str(&format!("  error: {e}\n"));
        }
    }
    out.push_str(&format!(
        "\n{:<5} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7} {:>10} {:>10} {:>10}\n",
        "node",
        "RSS MiB",
        "applied",
        "entry p50",
        "entry p99",
        "CPU p99",
        "apply p50",
        "apply p99",
        "apply max",
        "lock wait",
        "builds",
        "build max",
        "copy max",
        "snap MiB"
    ));
    for n in &r.nodes {
        out.push_str(&format!(
            "{:<5} {:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>10} {:>7} {:>10} {:>10} {:>10.1}\n",
            n.node,
            mib(n.rss_kib),
            n.entries_applied,
            fine_ms(n.apply_entry.p50_le_ms),
            fine_ms(n.apply_entry.p99_le_ms),
            fine_ms(n.apply_entry_cpu.p99_le_ms),
            ms(n.apply.p50_le_ms),
            ms(n.apply.p99_le_ms),
            ms(n.apply.max_le_ms),
            ms(n.apply_lock_wait.max_le_ms),
            n.snapshot_build.count,
            ms(n.snapshot_build.max_le_ms),
            ms(n.snapshot_copy.max_le_ms),
            n.snapshot_bytes as f64 / 1_048_576.0
        ));
    }
    out.push_str(
        "(entry: each log entry applied, wall time; CPU: the applying thread's CPU time for one; \
         apply: each batch of entries, lock wait included; \
         apply and snapshot figures are bucket upper bounds in ms: at most ×2 high)\n",
    );
    for n in &r.nodes {
        out.push_str(&format!(
            "node {}'s state: {} tasks submitted, {} cancelled, {} pending; /metrics took {:.0} ms\n",
            n.node, n.tasks_submitted, n.tasks_cancelled, n.tasks_pending, n.metrics_ms
        ));
    }
    out.push('\n');
    for (what, c) in [
        ("restart (kill -9, start from disk)", &r.restart),
        ("new follower (add as learner)", &r.install),
    ] {
        out.push_str(&format!(
            "{what:<36} node {}: answers after {} ms, applied to index {} after {} ms",
            c.node,
            ms(c.answered_ms),
            c.target_index,
            ms(c.caught_up_ms)
        ));
        if c.figures.snapshot_install.count > 0 {
            out.push_str(&format!(
                "; {} snapshot install(s), mean {:.0} ms",
                c.figures.snapshot_install.count, c.figures.snapshot_install.mean_ms
            ));
        }
        out.push('\n');
    }
    if let Some(dir) = &r.work_dir {
        out.push_str(&format!("nodes' directories kept in {dir}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_percentiles_are_upper_bounds_and_inf_is_none() {
        // 100 observations: 50 ≤ 1 ms, 49 more ≤ 2 ms, one above 4 ms.
        let b = [
            (0.001, 50.0),
            (0.002, 99.0),
            (0.004, 99.0),
            (f64::INFINITY, 100.0),
        ];
        let s = BucketSummary::of(&b, 0.25);
        assert_eq!(s.count, 100);
        assert_eq!(s.p50_le_ms, Some(1.0));
        assert_eq!(s.p99_le_ms, Some(2.0));
        assert_eq!(s.max_le_ms, None);
        assert!((s.mean_ms - 2.5).abs() < 1e-9);
        assert_eq!(BucketSummary::of(&[], 0.0), BucketSummary::default());
    }

    #[test]
    fn node_figures_are_read_from_an_exposition() {
        let text = "# TYPE squadron_apply_duration_seconds histogram\n\
            squadron_apply_duration_seconds_sum 0.003\n\
            squadron_apply_duration_seconds_count 3\n\
            squadron_apply_duration_seconds_bucket{le=\"0.001\"} 2\n\
            squadron_apply_duration_seconds_bucket{le=\"0.002\"} 3\n\
            squadron_apply_duration_seconds_bucket{le=\"+Inf\"} 3\n\
            # TYPE squadron_entries_applied counter\n\
            squadron_entries_applied_total 7\n\
            # TYPE squadron_snapshot_bytes gauge\n\
            squadron_snapshot_bytes 4096\n\
            # TYPE squadron_tasks_total counter\n\
            squadron_tasks_total{state=\"PENDING\"} 9\n\
            squadron_tasks_total{state=\"CANCELLED\"} 5\n\
            # TYPE squadron_tasks_active gauge\n\
            squadron_tasks_active{state=\"RUNNING\"} 1\n\
            squadron_tasks_active{state=\"PENDING\"} 4\n";
        let f = NodeFigures::from_metrics(2, text);
        assert_eq!((f.node, f.entries_applied, f.snapshot_bytes), (2, 7, 4096));
        assert_eq!(f.apply.count, 3);
        assert_eq!(f.apply.max_le_ms, Some(2.0));
        assert_eq!(f.snapshot_build.count, 0);
        assert_eq!(
            (f.tasks_submitted, f.tasks_cancelled, f.tasks_pending),
            (9, 5, 4)
        );
    }
}
