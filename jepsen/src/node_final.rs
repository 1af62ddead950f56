//! Each node's view at the end of a run, for the replica-digest check (INV-12).

use serde::{Deserialize, Serialize};

/// One node's applied index and state digest after the quiet phase (`nodes.json`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFinal {
    pub id: u64,
    #[serde(default)]
    pub applied: Option<u64>,
    #[serde(default)]
    pub digest: Option<String>,
    /// The last entry in the node's snapshot, and the last it purged from its log.
    #[serde(default)]
    pub snapshot: Option<u64>,
    #[serde(default)]
    pub purged: Option<u64>,
    /// Why the node could not be asked, when it could not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl NodeFinal {
    /// What node `id` answered to a status request.
    pub fn answered(id: u64, s: squadron_client::ClusterStatus) -> Self {
        Self {
            id,
            applied: s.applied,
            digest: Some(s.digest),
            snapshot: s.snapshot,
            purged: s.purged,
            error: None,
        }
    }
}
