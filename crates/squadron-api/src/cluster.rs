//! The cluster: one node's view of it, and membership changes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One member in a node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MemberView {
    pub id: u64,
    /// `host:port` of the member's REST API.
    pub rest: String,
    pub grpc: String,
    /// `host:port` of the member's peer listener (absent from nodes older than it).
    #[serde(default)]
    pub peer: String,
    pub voter: bool,
}

/// `GET /api/v1/cluster/status`: one node's own view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterStatus {
    pub node_id: u64,
    pub role: String,
    pub leader: Option<u64>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub applied: Option<u64>,
    #[serde(default)]
    pub snapshot: Option<u64>,
    #[serde(default)]
    pub purged: Option<u64>,
    /// SHA-256 of this node's state at `applied` (INV-12); empty when the request asked
    /// `digest=false` (a digest that cannot be computed fails the request with 500).
    pub digest: String,
    #[serde(default)]
    pub clock_ms: u64,
    pub members: Vec<MemberView>,
}

/// `POST /api/v1/cluster/learners`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AddLearner {
    pub id: u64,
    pub rest: String,
    pub grpc: String,
    /// The new node's peer listener (Raft, the node-to-node protocol).
    pub peer: String,
}

/// `POST /api/v1/cluster/voters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PromoteVoter {
    pub id: u64,
}

/// The answer of a membership change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct MembershipChanged {
    pub log_index: u64,
    pub members: Vec<MemberView>,
}

/// `POST /api/v1/cluster/tls/reload`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TlsReloaded {
    /// The identity the node presents, now with the new certificate.
    pub identity: String,
}
