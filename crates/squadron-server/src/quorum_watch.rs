//! A node that cannot reach a majority of the voters does not campaign.
//!
//! openraft 0.9 has no pre-vote. A follower cut off from the others starts an election at
//! every timeout, raising its term each time; when the partition heals, its answers carry that
//! higher term, the leader steps down, and the cluster is without a leader for an election
//! (reads and writes fail for a second or two after every heal). This loop asks every other
//! voter over the peer listener (`/internal/v1/ping`) every half election timeout, and turns
//! the node's own elections off (`RuntimeConfigHandle::elect`) while fewer than a majority
//! (itself counted) answer: a node that could not win cannot inflate the term either. It
//! still votes, and follows any leader that reaches it. This is what pre-vote decides per
//! election, decided by reachability instead; it stays here until openraft offers pre-vote
//! (0.10 is not released on crates.io).

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::watch;

use crate::node::ControlNode;

/// Peers' answers a probe waits for at most, and the pause between probes, as a fraction of
/// the shortest election timeout: two looks per timeout.
const PROBES_PER_ELECTION_TIMEOUT: u64 = 2;

/// Whether `reachable` of `voters` (this node counted when it is one) make a majority.
pub fn quorum_reachable(voters: usize, reachable: usize) -> bool {
    voters == 0 || reachable * 2 > voters
}

pub fn spawn(
    node: Arc<ControlNode>,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let every = Duration::from_millis(
        (node.config.raft.election_timeout_min_ms / PROBES_PER_ELECTION_TIMEOUT).max(1),
    );
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut electing = true;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticks.tick() => {}
            }
            let allowed = node.is_leader() || reaches_quorum(&node, every).await;
            if allowed != electing {
                node.raft.runtime_config().elect(allowed);
                electing = allowed;
                if allowed {
                    tracing::info!("a majority of voters answers again; elections back on");
                } else {
                    tracing::warn!(
                        "fewer than a majority of voters answer; this node does not campaign \
                         until they do"
                    );
                }
            }
        }
    })
}

async fn reaches_quorum(node: &ControlNode, timeout: Duration) -> bool {
    let members = node.members();
    let voters: Vec<_> = members.iter().filter(|(_, (_, voter))| *voter).collect();
    let me = usize::from(voters.iter().any(|(id, _)| **id == node.id));
    let peer = node.writes.peer();
    let answers = join_all(
        voters
            .iter()
            .filter(|(id, _)| **id != node.id)
            .map(|(_, (addr, _))| peer.ping(addr, timeout)),
    )
    .await;
    let reachable = me + answers.iter().filter(|ok| **ok).count();
    quorum_reachable(voters.len(), reachable)
}

#[cfg(test)]
mod tests {
    use super::quorum_reachable;

    #[test]
    fn a_majority_counts_this_node_too() {
        assert!(quorum_reachable(1, 1));
        assert!(!quorum_reachable(3, 1));
        assert!(quorum_reachable(3, 2));
        assert!(!quorum_reachable(4, 2));
        assert!(quorum_reachable(5, 3));
        assert!(
            quorum_reachable(0, 0),
            "no membership yet: leave openraft alone"
        );
    }
}
