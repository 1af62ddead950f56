//! The write path: every state change a node makes goes through here.
//!
//! - [`WritePath::propose_here`] proposes on this node, through the proposal batcher. Only a
//!   leader can; on a follower it answers [`WriteError::NotLeader`]. It is what a write
//!   forwarded by a follower runs on the leader, so a forwarded write is never forwarded
//!   again, and what the leader's own loops and the leader-only gRPC services run.
//! - [`WritePath::write`] is what the API edges call: on the leader `propose_here`; on a
//!   follower, or when `propose_here` learns that this node is not the leader, it forwards
//!   once to the leader (through the forward batcher) and answers with the leader's answer.
//! - [`WritePath::change_membership`] (`membership.rs`) is the same shape for Raft's
//!   membership changes, which are not commands of the state machine.
//!
//! Below it: `proposal_batcher.rs` and `forward_batcher.rs` (sharing `batch_loop.rs`) and the
//! peer client. Nothing here knows HTTP routes or the public API; `error.rs` says how each
//! failure maps to the error table.

mod batch_loop;
mod error;
pub mod forward_batcher;
mod membership;
pub mod proposal_batcher;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use squadron_core::access::Subject;
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, Response};
use squadron_raft::RaftNode;
use squadron_store::{NodeAddr, NodeId};

pub use error::{MembershipError, WriteError};
pub use forward_batcher::ForwardBatcher;
pub use proposal_batcher::ProposalBatcher;

use crate::clock::ClusterClock;
use crate::peer::wire::ProposeRequest;
use crate::peer::PeerClient;
use crate::raft_view;

/// Counters of `/metrics`.
#[derive(Debug, Default)]
pub struct WriteStats {
    /// Commands proposed by this node and applied.
    pub proposals: AtomicU64,
    /// Of those, the ones applied as a rejection.
    pub proposals_rejected: AtomicU64,
    /// Writes this node forwarded to the leader.
    pub forwards: AtomicU64,
    /// Writes that arrived while this node knew no leader, and so waited for an election.
    pub leader_waits: AtomicU64,
}

/// Where a write goes.
enum LeaderAt {
    Here,
    There(NodeAddr),
}

/// How long a write may wait: for its entry to commit, and for a leader when none is known.
#[derive(Debug, Clone, Copy)]
pub struct WriteTimeouts {
    pub proposal: Duration,
    pub leader_wait: Duration,
}

pub struct WritePath {
    id: NodeId,
    raft: RaftNode,
    /// How long a proposal may wait for its entry to commit.
    timeout: Duration,
    /// How long a write that finds no leader waits for an election (`server.leader_wait_ms`).
    leader_wait: Duration,
    peer: PeerClient,
    /// Writes proposed on this node share Raft entries (`Command::Batch`).
    batcher: ProposalBatcher,
    /// A follower's writes to the leader, sent in shared requests.
    forwarder: ForwardBatcher,
    stats: WriteStats,
    /// Woken after a committed command that may allow a placement (`wakes_scheduler`).
    placement: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for WritePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WritePath")
            .field("id", &self.id)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl WritePath {
    /// Starts the proposal and forward batchers on the current runtime. `body_bytes_max` is
    /// the request body limit of every node (a forwarded batch stays under half of it).
    pub fn start(
        id: NodeId,
        raft: RaftNode,
        clock: Arc<ClusterClock>,
        peer: PeerClient,
        timeouts: WriteTimeouts,
        body_bytes_max: usize,
    ) -> WritePath {
        let WriteTimeouts {
            proposal: timeout,
            leader_wait,
        } = timeouts;
        WritePath {
            id,
            batcher: ProposalBatcher::start(raft.clone(), clock, timeout),
            forwarder: ForwardBatcher::start(peer.clone(), body_bytes_max),
            raft,
            timeout,
            leader_wait,
            peer,
            stats: WriteStats::default(),
            placement: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// Notified after a command that may let the scheduler place a task; a wake while
    /// nobody waits is kept for the next wait.
    pub fn placement_wake(&self) -> &tokio::sync::Notify {
        &self.placement
    }

    pub fn stats(&self) -> &WriteStats {
        &self.stats
    }

    pub fn batcher(&self) -> &ProposalBatcher {
        &self.batcher
    }

    pub fn forwarder(&self) -> &ForwardBatcher {
        &self.forwarder
    }

    /// The node-to-node client every call to another node goes through.
    pub fn peer(&self) -> &PeerClient {
        &self.peer
    }

    /// Proposes on this node and answers with what applying the command answered. Never
    /// forwards: on a follower it answers `NotLeader` with the leader's addresses.
    pub async fn propose_here(
        &self,
        subject: Subject,
        command: Command,
        idempotency_key: Option<IdempotencyKey>,
    ) -> Result<Response, WriteError> {
        let wakes_scheduler = command.wakes_scheduler();
        // On a timeout the entry may still commit: the outcome is unknown, so the caller must
        // not retry a compare-and-swap blindly.
        let response = tokio::time::timeout(
            self.timeout,
            self.batcher.propose(subject, idempotency_key, command),
        )
        .await
        .map_err(|_| WriteError::TimedOut)??;
        self.stats.proposals.fetch_add(1, Ordering::Relaxed);
        if !response.is_ok() {
            self.stats
                .proposals_rejected
                .fetch_add(1, Ordering::Relaxed);
        } else if wakes_scheduler {
            self.placement.notify_one();
        }
        Ok(response)
    }

    /// Proposes a command through the leader and answers with what applying it answered. On
    /// a follower the command is forwarded to the leader once; the caller sees the result,
    /// never "not leader". During an election it waits for the outcome (up to
    /// `server.leader_wait_ms`) rather than refusing at once.
    pub async fn write(
        &self,
        subject: Subject,
        command: Command,
        idempotency_key: Option<IdempotencyKey>,
    ) -> Result<Response, WriteError> {
        // A follower that knows the leader sends the write there at once rather than
        // learning it from a refused proposal.
        match self.leader().await {
            None => return Err(WriteError::NoLeader),
            Some(LeaderAt::There(leader)) => {
                return self
                    .forward(leader, subject, command, idempotency_key)
                    .await
            }
            Some(LeaderAt::Here) => {}
        }
        match self
            .propose_here(subject.clone(), command.clone(), idempotency_key.clone())
            .await
        {
            Err(WriteError::NotLeader {
                leader: Some(leader),
            }) => {
                self.forward(leader, subject, command, idempotency_key)
                    .await
            }
            // This node lost its leadership as it proposed. The proposal was refused before
            // anything was appended, so the write can go once to the election's winner.
            Err(WriteError::NotLeader { leader: None }) => match self.leader().await {
                Some(LeaderAt::There(leader)) => {
                    self.forward(leader, subject, command, idempotency_key)
                        .await
                }
                _ => Err(WriteError::NoLeader),
            },
            answer => answer,
        }
    }

    /// Where the leader is, waiting for an election's outcome when this node knows none.
    /// `None`: no leader within the wait, or one whose addresses this node does not have.
    async fn leader(&self) -> Option<LeaderAt> {
        if raft_view::leader_id(&self.raft).is_none() {
            self.stats.leader_waits.fetch_add(1, Ordering::Relaxed);
            raft_view::await_leader(&self.raft, self.leader_wait).await?;
        }
        // This node first: a leader that is leaving the membership still leads (and
        // proposes) until that change commits, though its addresses are gone from it.
        if raft_view::is_leader(&self.raft, self.id) {
            return Some(LeaderAt::Here);
        }
        raft_view::leader(&self.raft).map(|(_, addr)| LeaderAt::There(addr))
    }

    async fn forward(
        &self,
        leader: NodeAddr,
        subject: Subject,
        command: Command,
        idempotency_key: Option<IdempotencyKey>,
    ) -> Result<Response, WriteError> {
        self.stats.forwards.fetch_add(1, Ordering::Relaxed);
        let request = ProposeRequest {
            subject,
            command,
            idempotency_key,
            trace_id: crate::trace::current(),
        };
        self.forwarder.forward(leader, request).await
    }
}
