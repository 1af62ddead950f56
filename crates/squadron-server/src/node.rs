//! A running control node: its Raft handle, its view of the state, and the two operations every
//! API is built on — `write` (propose through the leader; `write_path/`) and `read_barrier`
//! (linearizable reads through ReadIndex on the leader).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use squadron_core::access::Subject;
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, Response};
use squadron_raft::RaftNode;
use squadron_store::{NodeAddr, NodeId, StateReader};

use crate::clock::ClusterClock;
use crate::config::NodeConfig;
use crate::error::ApiError;
use crate::peer::wire::{MembershipChange, MembershipReply};
use crate::peer::{PeerClient, PeerError};
use crate::raft_view;
use crate::read_index_rounds::ReadIndexRounds;
use crate::resumed_term::ResumedTerm;
use crate::write_path::{MembershipError, WriteError, WritePath};

/// The header carrying a client's idempotency key (defined once, in `squadron-api`).
pub use squadron_api::IDEMPOTENCY_HEADER;

/// Read consistency a caller asks for (defined once, with the query strings).
pub use squadron_api::Consistency;

/// Counters exported on `/metrics` (the write path keeps its own, `WriteStats`).
#[derive(Debug, Default)]
pub struct Counters {
    pub linearizable_reads: AtomicU64,
    pub stale_reads: AtomicU64,
    /// MCP checks answered 403 / PERMISSION_DENIED, per project.
    pub mcp_denials: crate::mcp_denials::McpDenials,
    /// Connections each listener accepted: REST, gRPC, peer.
    pub accepted: ListenerConnections,
}

/// Connections accepted per listener since the node started.
#[derive(Debug, Default)]
pub struct ListenerConnections {
    pub rest: Arc<AtomicU64>,
    pub grpc: Arc<AtomicU64>,
    pub peer: Arc<AtomicU64>,
}

/// Rounds of leadership confirmation one linearizable read may take (all within the
/// request's timeout).
pub const READ_INDEX_ATTEMPTS_MAX: u32 = 25;
/// Pause before the second round; each next one waits twice as long, up to the max. The max
/// is short: a read held through a partition is answered by its first round after the heal,
/// and a pause of 800 ms put the chaos suite's first read after a one-way partition's heal at
/// 2.26 s (its bound: 2 s). A round is one heartbeat to the followers, shared by every read
/// waiting for it, so more of them cost little; there are enough that the request's timeout,
/// not their number, ends a read held through an outage (as with the longer pauses before).
pub const READ_INDEX_RETRY_MS: u64 = 50;
pub const READ_INDEX_RETRY_MS_MAX: u64 = 200;

pub struct ControlNode {
    pub id: NodeId,
    pub config: NodeConfig,
    pub raft: RaftNode,
    pub state: StateReader,
    pub counters: Counters,
    /// Synced log appends and the entries they carried (group commit).
    pub append_stats: Arc<squadron_store::AppendStats>,
    /// Proposals, forwards to the leader and membership changes.
    pub writes: WritePath,
    /// Read-index rounds on the leader (its own reads and followers' requests share them).
    pub leader_reads: ReadIndexRounds,
    /// Read-index requests to the leader, shared by this follower's concurrent reads.
    pub follower_reads: ReadIndexRounds,
    /// The node's certificates and the clients it dials other nodes and workers with.
    pub tls: Arc<crate::tls::NodeTls>,
    /// The time this node stamps proposals with and reads deadlines against.
    pub clock: Arc<ClusterClock>,
    /// When a leader last reached this node (the election driver's input).
    pub leader_contact: Arc<squadron_raft::LeaderContact>,
    /// The REST API's answer times (`/metrics`).
    pub request_latency: crate::request_latency::RequestLatency,
    /// The state digest status answers carry, computed one at a time off the runtime.
    pub state_digests: crate::state_digests::StateDigests,
}

impl std::fmt::Debug for ControlNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlNode")
            .field("id", &self.id)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl ControlNode {
    pub fn new(
        config: NodeConfig,
        raft: RaftNode,
        state: StateReader,
        append_stats: Arc<squadron_store::AppendStats>,
        resumed: ResumedTerm,
        tls: Arc<crate::tls::NodeTls>,
        mcp_denials: crate::mcp_denials::McpDenials,
    ) -> Result<Arc<Self>, PeerError> {
        let timeout = Duration::from_millis(config.server.request_timeout_ms);
        let leader_wait = Duration::from_millis(config.server.leader_wait_ms);
        // The one client of every call to another node.
        let tls_config = tls
            .peer_client()
            .map_err(|e| PeerError::Unreachable(e.to_string()))?;
        let peer = PeerClient::new(timeout, tls_config)?;
        let leader_reads = {
            let (raft, id) = (raft.clone(), config.node_id);
            ReadIndexRounds::new(Arc::new(move || {
                let raft = raft.clone();
                Box::pin(async move {
                    leader_read_index(&raft, id, resumed, timeout)
                        .await
                        .map_err(|e| e.body.message)
                })
            }))
        };
        let follower_reads = {
            let (raft, peer) = (raft.clone(), peer.clone());
            ReadIndexRounds::new(Arc::new(move || {
                let (raft, peer) = (raft.clone(), peer.clone());
                Box::pin(async move { remote_read_index(&raft, &peer, leader_wait).await })
            }))
        };
        let clock = Arc::new(ClusterClock::new(state.clone()));
        let writes = WritePath::start(
            config.node_id,
            raft.clone(),
            clock.clone(),
            peer,
            crate::write_path::WriteTimeouts {
                proposal: timeout,
                leader_wait,
            },
            config.server.body_bytes_max,
        );
        Ok(Arc::new(Self {
            id: config.node_id,
            config,
            writes,
            leader_reads,
            follower_reads,
            raft,
            state,
            counters: Counters {
                mcp_denials,
                ..Counters::default()
            },
            append_stats,
            tls,
            clock,
            leader_contact: Arc::default(),
            request_latency: Default::default(),
            state_digests: Default::default(),
        }))
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.server.request_timeout_ms)
    }

    /// The leader as this node knows it, with its addresses.
    pub fn leader(&self) -> Option<(NodeId, NodeAddr)> {
        raft_view::leader(&self.raft)
    }

    pub fn is_leader(&self) -> bool {
        raft_view::is_leader(&self.raft, self.id)
    }

    /// Proposes a command and answers with what applying it answered. On a follower the command
    /// is forwarded to the leader once; the caller sees the result, never "not leader".
    pub async fn write(
        &self,
        subject: Subject,
        command: Command,
        idempotency_key: Option<IdempotencyKey>,
    ) -> Result<Response, WriteError> {
        self.writes.write(subject, command, idempotency_key).await
    }

    /// Proposes on this node only (the leader): a forwarded write, the leader's own loops and
    /// the leader-only gRPC services. On a follower it answers `WriteError::NotLeader`.
    pub async fn propose_here(
        &self,
        subject: Subject,
        command: Command,
        idempotency_key: Option<IdempotencyKey>,
    ) -> Result<Response, WriteError> {
        self.writes
            .propose_here(subject, command, idempotency_key)
            .await
    }

    /// Runs a membership change on the leader, relaying it there once from a follower.
    pub async fn change_membership(
        &self,
        change: MembershipChange,
    ) -> Result<MembershipReply, MembershipError> {
        self.writes.change_membership(change).await
    }

    /// Makes the next local read linearizable: the leader confirms its leadership with a quorum
    /// and names its commit point; this node waits until it has applied that far.
    pub async fn read_barrier(&self, consistency: Consistency) -> Result<(), ApiError> {
        if consistency == Consistency::Stale {
            self.counters.stale_reads.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        #[cfg(feature = "jepsen-faults")]
        if crate::jepsen_fault::local_reads() {
            return Ok(());
        }
        self.counters
            .linearizable_reads
            .fetch_add(1, Ordering::Relaxed);
        let rounds = if self.is_leader() {
            &self.leader_reads
        } else {
            &self.follower_reads
        };
        let index = rounds.index().await.map_err(ApiError::unavailable)?;
        if let Some(index) = index {
            self.raft
                .wait(Some(self.timeout()))
                .applied_index_at_least(Some(index), "linearizable read")
                .await
                .map_err(|e| ApiError::unavailable(format!("catching up to the leader: {e}")))?;
        }
        Ok(())
    }

    /// On the leader: confirms leadership (in a round shared with concurrent reads) and
    /// returns the index a read must wait for.
    pub async fn read_index(&self) -> Result<Option<u64>, ApiError> {
        self.leader_reads
            .index()
            .await
            .map_err(ApiError::unavailable)
    }

    /// Members of the current configuration, voters and learners.
    pub fn members(&self) -> BTreeMap<NodeId, (NodeAddr, bool)> {
        raft_view::members(&self.raft)
    }
}

/// On the leader: confirms leadership and returns the index a read must wait for.
async fn leader_read_index(
    raft: &RaftNode,
    id: NodeId,
    resumed: ResumedTerm,
    timeout: Duration,
) -> Result<Option<u64>, ApiError> {
    // Confirming leadership needs a quorum of heartbeat answers; on a loaded machine rounds
    // can miss their deadline for a second or more while the leader is still the leader
    // (CI's 2 cores under VMs saw reads fail after three rounds in 150 ms), so failed rounds
    // are tried again, backing off, within the request's timeout before the caller is told
    // to retry.
    let deadline = tokio::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(READ_INDEX_RETRY_MS);
    let mut last = String::new();
    // Taken before the round: a read confirmed in a later term has that term's own first
    // entry, past every acknowledged write.
    let term = raft.metrics().borrow().current_term;
    for attempt in 0..READ_INDEX_ATTEMPTS_MAX {
        if attempt > 0 {
            if tokio::time::Instant::now() + pause >= deadline {
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(READ_INDEX_RETRY_MS_MAX));
        }
        match tokio::time::timeout_at(deadline, raft.get_read_log_id()).await {
            Err(_) => return Err(ApiError::unavailable("timed out confirming leadership")),
            Ok(Ok(read)) => return Ok(resumed.raise(term, read.0.map(|l| l.index))),
            Ok(Err(e)) => {
                last = e.to_string();
                if raft.metrics().borrow().current_leader != Some(id) {
                    break;
                }
            }
        }
    }
    Err(ApiError::unavailable(format!(
        "not able to serve a read index: {last}"
    )))
}

/// On a follower: one read-index request to the leader, once an election under way, if any,
/// has one (waiting up to `leader_wait`).
async fn remote_read_index(
    raft: &RaftNode,
    peer: &PeerClient,
    leader_wait: Duration,
) -> Result<Option<u64>, String> {
    raft_view::await_leader(raft, leader_wait).await;
    let Some((_, leader)) = raft_view::leader(raft) else {
        return Err("no leader is known; retry shortly".into());
    };
    peer.read_index(&leader).await.map_err(|e| match e {
        PeerError::Unreachable(e) | PeerError::NoAnswer(e) => {
            format!("read index from leader: {e}")
        }
        PeerError::Refused { status, body, text } => {
            let why = body.map_or(text, |b| b.message);
            format!("the leader refused a read index ({status}): {why}")
        }
        PeerError::BrokeOff(e) | PeerError::Unreadable(e) => format!("read index reply: {e}"),
    })
}
