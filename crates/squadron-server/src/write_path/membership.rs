//! Membership changes (add a learner, promote it, remove a member) take the same path as a
//! write: run on the leader, or relayed once to it through the peer client. They are Raft's
//! own entries, not commands of the state machine, so they have their own entry point.

use std::collections::BTreeSet;
use std::future::Future;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::ChangeMembers;
use squadron_core::ValidationError;
use squadron_store::{NodeAddr, NodeId, TypeConfig};

use super::{MembershipError, WritePath};
use crate::peer::wire::{Member, MembershipChange, MembershipReply};
use crate::raft_view;

/// Attempts of a membership change refused because another one is still committing.
pub const MEMBERSHIP_RETRIES_MAX: u32 = 50;
/// Pause between those attempts.
pub const MEMBERSHIP_RETRY_DELAY_MS: u64 = 100;
/// Longest `host:port` a member may be given.
pub const NODE_ADDRESS_BYTES_MAX: usize = 256;

type RaftWriteError = RaftError<NodeId, ClientWriteError<NodeId, NodeAddr>>;
type Committed = ClientWriteResponse<TypeConfig>;

impl WritePath {
    /// Runs a membership change on the leader: here, or relayed once to the leader if this
    /// node is not. The answer is the leader's.
    pub async fn change_membership(
        &self,
        change: MembershipChange,
    ) -> Result<MembershipReply, MembershipError> {
        match self.change_membership_here(&change).await {
            Err(MembershipError::NotLeader { leader, .. }) => {
                let leader = leader.ok_or(MembershipError::NoLeader)?;
                Ok(self.peer.change_membership(&leader, &change).await?)
            }
            answer => answer,
        }
    }

    /// Runs a membership change on this node; on a follower it answers `NotLeader`. Checks
    /// against the member list use this node's view, which on the leader is the current one.
    pub async fn change_membership_here(
        &self,
        change: &MembershipChange,
    ) -> Result<MembershipReply, MembershipError> {
        let committed = match change {
            MembershipChange::AddLearner { id, addr } => {
                check_learner(*id, addr)?;
                retry_in_progress(|| self.raft.add_learner(*id, addr.clone(), true)).await
            }
            MembershipChange::PromoteVoter { id } => {
                let known = raft_view::members(&self.raft).contains_key(id);
                if !known && raft_view::is_leader(&self.raft, self.id) {
                    return Err(MembershipError::NotMember(format!(
                        "node {id} is not a learner of this cluster; add it first"
                    )));
                }
                // A follower may not have applied the learner the leader just added, and
                // openraft would refuse it from the follower's view: the leader decides.
                if !known {
                    return Err(MembershipError::NotLeader {
                        leader: raft_view::leader(&self.raft).map(|(_, addr)| addr),
                        message: format!("node {} is not the leader", self.id),
                    });
                }
                let ids = BTreeSet::from([*id]);
                retry_in_progress(|| {
                    self.raft
                        .change_membership(ChangeMembers::AddVoterIds(ids.clone()), false)
                })
                .await
            }
            MembershipChange::Remove { id } => {
                let change = self.removal(*id)?;
                retry_in_progress(|| self.raft.change_membership(change.clone(), false)).await
            }
        };
        let committed = committed.map_err(refusal)?;
        Ok(MembershipReply {
            log_index: committed.log_id.index,
            members: raft_view::members(&self.raft)
                .into_iter()
                .map(|(id, (addr, voter))| Member { id, addr, voter })
                .collect(),
        })
    }

    /// A voter is removed from the voters (and so from the cluster), a learner from the nodes.
    fn removal(&self, id: NodeId) -> Result<ChangeMembers<NodeId, NodeAddr>, MembershipError> {
        let members = raft_view::members(&self.raft);
        let Some((_, voter)) = members.get(&id) else {
            return Err(MembershipError::NotMember(format!(
                "node {id} is not a member"
            )));
        };
        let ids = BTreeSet::from([id]);
        Ok(if *voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        })
    }
}

fn check_learner(id: NodeId, addr: &NodeAddr) -> Result<(), ValidationError> {
    if id == 0 {
        return Err(ValidationError::new("id", "must be a positive integer"));
    }
    for (field, addr) in [
        ("rest", &addr.rest),
        ("grpc", &addr.grpc),
        ("peer", &addr.peer),
    ] {
        if !addr.contains(':') || addr.len() > NODE_ADDRESS_BYTES_MAX {
            return Err(ValidationError::new(
                field,
                format!("must be host:port, got {addr:?}"),
            ));
        }
    }
    Ok(())
}

/// A membership change is joint consensus in two steps; while the previous change's second
/// step commits, openraft refuses a new one as "in progress". That refusal means nothing was
/// applied, so waiting briefly and trying again is safe.
async fn retry_in_progress<F, Fut>(change: F) -> Result<Committed, RaftWriteError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<Committed, RaftWriteError>>,
{
    let mut result = change().await;
    for _ in 0..MEMBERSHIP_RETRIES_MAX {
        match &result {
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(_),
            ))) => {
                tokio::time::sleep(Duration::from_millis(MEMBERSHIP_RETRY_DELAY_MS)).await;
                result = change().await;
            }
            _ => break,
        }
    }
    result
}

fn refusal(e: RaftWriteError) -> MembershipError {
    let message = e.to_string();
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => MembershipError::NotLeader {
            leader: f.leader_node,
            message,
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            MembershipError::Refused(e.to_string())
        }
        _ => MembershipError::Raft(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(rest: &str, grpc: &str) -> NodeAddr {
        NodeAddr {
            rest: rest.into(),
            grpc: grpc.into(),
            peer: "h:3".into(),
        }
    }

    #[test]
    fn a_learner_needs_a_positive_id_and_host_port_addresses() {
        assert_eq!(check_learner(4, &addr("h:1", "h:2")), Ok(()));
        assert_eq!(
            check_learner(0, &addr("h:1", "h:2")).unwrap_err().field,
            "id"
        );
        assert_eq!(
            check_learner(4, &addr("h", "h:2")).unwrap_err().field,
            "rest"
        );
        let long = format!("{}:1", "h".repeat(NODE_ADDRESS_BYTES_MAX));
        assert_eq!(
            check_learner(4, &addr("h:1", &long)).unwrap_err().field,
            "grpc"
        );
    }
}
