//! Raft timing and log-retention settings, with defaults that suit a loopback or LAN cluster.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// Raft settings a node's configuration file may override.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RaftTimeouts {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// A snapshot is built after this many entries since the last one.
    pub snapshot_after_entries: u64,
    /// Entries kept in the log behind the last snapshot, so a briefly lagging follower catches
    /// up from the log instead of a snapshot.
    pub max_in_snapshot_log_to_keep: u64,
    /// Entries sent in one append-entries RPC.
    pub max_payload_entries: u64,
    /// Bytes of snapshot sent in one install-snapshot chunk.
    pub snapshot_chunk_bytes: u64,
}

impl Default for RaftTimeouts {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 400,
            election_timeout_max_ms: 800,
            snapshot_after_entries: 10_000,
            max_in_snapshot_log_to_keep: 1_000,
            max_payload_entries: 512,
            snapshot_chunk_bytes: 1024 * 1024,
        }
    }
}

impl RaftTimeouts {
    /// The openraft configuration; refuses inconsistent timings with a message naming them.
    pub fn to_openraft(&self, cluster_name: &str) -> Result<Arc<openraft::Config>, String> {
        if self.election_timeout_min_ms <= self.heartbeat_interval_ms {
            return Err(format!(
                "raft.election_timeout_min_ms ({}) must exceed raft.heartbeat_interval_ms ({})",
                self.election_timeout_min_ms, self.heartbeat_interval_ms
            ));
        }
        let config = openraft::Config {
            cluster_name: cluster_name.to_string(),
            heartbeat_interval: self.heartbeat_interval_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_after_entries),
            max_in_snapshot_log_to_keep: self.max_in_snapshot_log_to_keep,
            max_payload_entries: self.max_payload_entries,
            snapshot_max_chunk_size: self.snapshot_chunk_bytes,
            ..Default::default()
        };
        let config = config
            .validate()
            .map_err(|e| format!("raft settings: {e}"))?;
        Ok(Arc::new(config))
    }
}
