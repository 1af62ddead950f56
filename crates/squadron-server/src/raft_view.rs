//! What this node's Raft knows about the cluster right now: the leader and the members, read
//! from openraft's metrics. Both the write path and the read path need the leader's addresses.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use squadron_raft::RaftNode;
use squadron_store::{NodeAddr, NodeId};

/// The leader as this node knows it, with its addresses.
pub fn leader(raft: &RaftNode) -> Option<(NodeId, NodeAddr)> {
    let metrics = raft.metrics().borrow().clone();
    let leader = metrics.current_leader?;
    let node = metrics
        .membership_config
        .membership()
        .get_node(&leader)
        .cloned()?;
    Some((leader, node))
}

/// The leader this node knows of, by id: openraft names one exactly while this node's vote is
/// committed, so `None` means an election is under way (or never ended).
pub fn leader_id(raft: &RaftNode) -> Option<NodeId> {
    raft.metrics().borrow().current_leader
}

/// Waits until this node knows a leader (an election under way has its outcome), up to
/// `within` (`server.leader_wait_ms`); answers its id. Nothing is proposed while it waits, so
/// a request that still finds no leader can be refused as never applied.
pub async fn await_leader(raft: &RaftNode, within: Duration) -> Option<NodeId> {
    let deadline = tokio::time::Instant::now() + within;
    let mut changes = raft.metrics();
    loop {
        if let Some(id) = leader_id(raft) {
            return Some(id);
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => continue,
            // Timed out, or Raft shut down.
            _ => return None,
        }
    }
}

/// This node's own id.
pub fn node_id(raft: &RaftNode) -> NodeId {
    raft.metrics().borrow().id
}

pub fn is_leader(raft: &RaftNode, id: NodeId) -> bool {
    raft.metrics().borrow().current_leader == Some(id)
}

/// The term this node leads, if it leads.
pub fn led_term(raft: &RaftNode, id: NodeId) -> Option<u64> {
    let metrics = raft.metrics();
    let metrics = metrics.borrow();
    (metrics.current_leader == Some(id)).then_some(metrics.current_term)
}

/// Members of the current configuration: addresses, and whether each is a voter.
pub fn members(raft: &RaftNode) -> BTreeMap<NodeId, (NodeAddr, bool)> {
    let metrics = raft.metrics().borrow().clone();
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| (*id, (node.clone(), voters.contains(id))))
        .collect()
}
