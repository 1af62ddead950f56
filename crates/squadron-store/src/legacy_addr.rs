//! Memberships written before nodes had a peer listener (value formats 1 and 2): `NodeAddr`
//! was `{rest, grpc}`. Raft ran on the gRPC listener then, so the old `grpc` address is where
//! such a node's peer protocol was; decoding sets `peer` to it. A node still running an old
//! build there answers nothing on the new protocol until it is upgraded and its address
//! changed (`add_learner` again with the new peer address).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::type_config::{LogId, NodeAddr, NodeId, SnapshotMeta, StoredMembership};

/// `NodeAddr` of value formats 1 and 2 (openraft's `Node` bound wants `Serialize` too; it is
/// never written).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct NodeAddrV1 {
    rest: String,
    grpc: String,
}

impl From<NodeAddrV1> for NodeAddr {
    fn from(old: NodeAddrV1) -> Self {
        NodeAddr {
            peer: old.grpc.clone(),
            rest: old.rest,
            grpc: old.grpc,
        }
    }
}

pub(crate) type MembershipV1 = openraft::Membership<NodeId, NodeAddrV1>;

pub(crate) fn membership(old: MembershipV1) -> openraft::Membership<NodeId, NodeAddr> {
    let nodes: BTreeMap<NodeId, NodeAddr> = old
        .nodes()
        .map(|(id, addr)| (*id, NodeAddr::from(addr.clone())))
        .collect();
    openraft::Membership::new(old.get_joint_config().clone(), nodes)
}

/// `StoredMembership` of value formats 1 and 2 (fields in openraft's order).
#[derive(Debug, Deserialize)]
pub(crate) struct StoredMembershipV1 {
    log_id: Option<LogId>,
    membership: MembershipV1,
}

/// `SnapshotMeta` of value formats 1 and 2 (fields in openraft's order).
#[derive(Debug, Deserialize)]
pub(crate) struct SnapshotMetaV1 {
    last_log_id: Option<LogId>,
    last_membership: StoredMembershipV1,
    snapshot_id: String,
}

impl From<SnapshotMetaV1> for SnapshotMeta {
    fn from(old: SnapshotMetaV1) -> Self {
        SnapshotMeta {
            last_log_id: old.last_log_id,
            last_membership: StoredMembership::new(
                old.last_membership.log_id,
                membership(old.last_membership.membership),
            ),
            snapshot_id: old.snapshot_id,
        }
    }
}
