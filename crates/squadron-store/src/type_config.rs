//! The openraft type configuration: what the Raft log carries and how nodes are addressed.

use std::fmt;

use serde::{Deserialize, Serialize};
use squadron_core::{CommandEnvelope, Response};

/// A cluster member's addresses, replicated in the membership config so that every node can
/// forward REST writes to the leader and tell gRPC clients where the leader listens.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAddr {
    /// `host:port` of the REST API.
    pub rest: String,
    /// `host:port` of the gRPC API (agents and workers).
    pub grpc: String,
    /// `host:port` of the peer listener: Raft and the node-to-node protocol (mTLS, node
    /// certificates only). Memberships written before it existed decode with the old `grpc`
    /// address here (`legacy_addr.rs`).
    pub peer: String,
}

impl fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "rest={} grpc={} peer={}",
            self.rest, self.grpc, self.peer
        )
    }
}

/// A control node's Raft id.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// Squadron's Raft types: entries carry core command envelopes, applying one answers a
    /// core response.
    pub TypeConfig:
        D = CommandEnvelope,
        R = Response,
        NodeId = NodeId,
        Node = NodeAddr,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type StoredMembership = openraft::StoredMembership<NodeId, NodeAddr>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, NodeAddr>;
pub type Snapshot = openraft::storage::Snapshot<TypeConfig>;
