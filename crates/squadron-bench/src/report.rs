//! The figures of a comparison: per workload and client count, per system, and their ratios.

use serde::{Deserialize, Serialize};

use crate::load::PointStats;
use crate::machine::MachineInfo;
use crate::options::{ClientRoute, EtcdProtocol, Workload};
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

/// Squadron's own counters, summed over its nodes at the end of the workloads: how well
/// writes shared log entries and fsyncs, and reads shared read-index rounds.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SquadronInternals {
    /// Synced log appends (fsyncs) and the entries they carried, all nodes.
    pub log_appends: u64,
    pub log_entries: u64,
    /// Raft entries proposed by the nodes' batchers and the writes they carried.
    pub proposal_entries: u64,
    pub proposal_commands: u64,
    /// Read-index rounds and the linearizable reads they answered.
    pub read_rounds: u64,
    pub reads: u64,
    /// Writes a follower passed on to the leader (reports saved before it was counted: 0).
    #[serde(default)]
    pub forwards: u64,
}

impl SquadronInternals {
    pub fn entries_per_fsync(&self) -> Option<f64> {
        ratio(self.log_entries as f64, self.log_appends as f64)
    }
    pub fn writes_per_entry(&self) -> Option<f64> {
        ratio(self.proposal_commands as f64, self.proposal_entries as f64)
    }
    pub fn reads_per_round(&self) -> Option<f64> {
        ratio(self.reads as f64, self.read_rounds as f64)
    }

    /// Adds one node's `/metrics` text.
    pub fn add_metrics(&mut self, text: &str) {
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let mut parts = line.split_whitespace();
            let (Some(name), Some(value)) = (parts.next(), parts.next()) else {
                continue;
            };
            let Ok(value) = value.parse::<u64>() else {
                continue;
            };
            let field = match name {
                "squadron_log_appends_total" => &mut self.log_appends,
                "squadron_log_entries_appended_total" => &mut self.log_entries,
                "squadron_proposal_entries_total" => &mut self.proposal_entries,
                "squadron_proposal_commands_total" => &mut self.proposal_commands,
                "squadron_read_index_rounds_total" => &mut self.read_rounds,
                "squadron_read_index_reads_total" => &mut self.reads,
                "squadron_forwards_total" => &mut self.forwards,
                _ => continue,
            };
            *field += value;
        }
    }
}

/// Everything `squadron bench compare` reports (`--output json` prints this).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompareReport {
    pub machine: MachineInfo,
    pub squadron_version: String,
    pub etcd_version: String,
    /// How the load reached etcd: its gRPC API or its JSON gateway (reports saved before the
    /// choice existed went through the gateway).
    #[serde(default = "EtcdProtocol::gateway")]
    pub etcd_protocol: EtcdProtocol,
    /// Which node each client sent to first (reports saved before the choice existed spread
    /// their clients over the nodes).
    #[serde(default = "ClientRoute::spread")]
    pub route: ClientRoute,
    pub nodes: usize,
    pub clients: Vec<usize>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub seed: u64,
    pub points: Vec<ComparePoint>,
    pub failover: FailoverComparison,
    pub memory: MemoryComparison,
    /// Squadron's batching counters (absent when Squadron did not run or did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub squadron_internals: Option<SquadronInternals>,
    /// Where the node directories were kept, if asked to keep them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub work_dir: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internals_add_up_the_counters_of_every_node_and_ignore_the_rest() {
        let mut sum = SquadronInternals::default();
        let node =
            "# HELP squadron_log_appends_total x\n# TYPE squadron_log_appends_total counter\n\
                    squadron_log_appends_total 10\nsquadron_log_entries_appended_total 30\n\
                    squadron_proposal_entries_total 5\nsquadron_proposal_commands_total 25\n\
                    squadron_read_index_rounds_total 2\nsquadron_read_index_reads_total 8\n\
                    squadron_raft_term 7\ngarbage line here\nsquadron_log_appends_total nan\n";
        sum.add_metrics(node);
        sum.add_metrics(node);
        assert_eq!(sum.log_appends, 20);
        assert_eq!(sum.log_entries, 60);
        assert_eq!(sum.entries_per_fsync(), Some(3.0));
        assert_eq!(sum.writes_per_entry(), Some(5.0));
        assert_eq!(sum.reads_per_round(), Some(4.0));
        assert_eq!(SquadronInternals::default().writes_per_entry(), None);
    }
}
