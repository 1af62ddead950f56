//! The figures of a comparison: per workload and client count, per system, and their ratios.

use serde::{Deserialize, Serialize};

use crate::load::PointStats;
use crate::machine::MachineInfo;
use crate::options::Workload;
use crate::process::NodeMemory;

/// Squadron's figure divided by etcd's. Above 1 is better for ops/s, below 1 is better for
/// latencies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Ratios {
    pub ops_per_s: Option<f64>,
    pub p50: Option<f64>,
    pub p99: Option<f64>,
    pub p999: Option<f64>,
}

/// `a / b`, when `b` is not zero.
pub fn ratio(a: f64, b: f64) -> Option<f64> {
    (b > 0.0 && a.is_finite() && b.is_finite()).then(|| a / b)
}

impl Ratios {
    /// The ratios; latency ratios only when both sides completed operations.
    pub fn of(squadron: &PointStats, etcd: &PointStats) -> Self {
        let (s, e) = (&squadron.latency, &etcd.latency);
        let both = s.count > 0 && e.count > 0;
        let latency = |a: f64, b: f64| if both { ratio(a, b) } else { None };
        Self {
            ops_per_s: ratio(squadron.ops_per_s, etcd.ops_per_s),
            p50: latency(s.p50_ms, e.p50_ms),
            p99: latency(s.p99_ms, e.p99_ms),
            p999: latency(s.p999_ms, e.p999_ms),
        }
    }
}

/// One workload at one client count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparePoint {
    pub workload: Workload,
    pub clients: usize,
    pub squadron: Option<PointStats>,
    pub etcd: Option<PointStats>,
    /// Present when both systems ran.
    pub ratio: Option<Ratios>,
}

/// Kill -9 of the leader under a lease-cycle load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailoverResult {
    pub clients: usize,
    /// The node killed.
    pub killed: String,
    /// From the kill to the first write that started after it and succeeded; `None` when no
    /// write succeeded within the wait.
    pub recovery_ms: Option<f64>,
    /// From the kill until every surviving node named the same new leader, as seen by polling
    /// their status every 100 ms (so up to ~100 ms late); `None` if that never happened.
    #[serde(default)]
    pub leader_elected_ms: Option<f64>,
    /// How long the run waited for a write at most.
    pub wait_ms_max: u64,
    /// The load around the kill (errors are the writes that failed meanwhile).
    pub load: PointStats,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailoverComparison {
    pub squadron: Option<FailoverResult>,
    pub etcd: Option<FailoverResult>,
    /// Squadron's recovery time divided by etcd's.
    pub ratio: Option<f64>,
}

/// Resident memory per node at the end of the workloads (before the failover kill).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryComparison {
    pub squadron: Vec<NodeMemory>,
    pub etcd: Vec<NodeMemory>,
    /// Squadron's mean RSS per node divided by etcd's.
    pub ratio: Option<f64>,
}

/// Mean RSS per node, KiB.
pub fn mean_rss_kib(nodes: &[NodeMemory]) -> f64 {
    if nodes.is_empty() {
        return 0.0;
    }
    nodes.iter().map(|n| n.rss_kib as f64).sum::<f64>() / nodes.len() as f64
}

/// Everything `squadron bench compare` reports (`--output json` prints this).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub machine: MachineInfo,
    pub squadron_version: String,
    pub etcd_version: String,
    pub nodes: usize,
    pub clients: Vec<usize>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub seed: u64,
    pub points: Vec<ComparePoint>,
    pub failover: FailoverComparison,
    pub memory: MemoryComparison,
    /// Where the node directories were kept, if asked to keep them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
}
