//! A running control node: its Raft handle, its view of the state, and the two operations every
//! API is built on — `write` (propose through the leader) and `read_barrier` (linearizable
//! reads through ReadIndex on the leader).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, Response};

use crate::proposal_batcher::ProposeFailure;
use crate::read_index_rounds::ReadIndexRounds;
use squadron_raft::RaftNode;
use squadron_store::{NodeAddr, NodeId, StateReader};

use crate::config::NodeConfig;
use crate::error::ApiError;

/// Header that marks a request already forwarded once; it is never forwarded again.
pub const FORWARDED_HEADER: &str = "x-squadron-forwarded";
/// Header carrying a client's idempotency key.
pub const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// What a follower sends the leader to propose on its behalf. The leader stamps the time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProposeRequest {
    pub command: Command,
    pub idempotency_key: Option<IdempotencyKey>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadIndexReply {
    pub index: Option<u64>,
}

/// Read consistency a caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// ReadIndex through the leader: the read sees every write acknowledged before it began.
    #[default]
    Linearizable,
    /// This node's applied state, possibly behind.
    Stale,
}

/// Counters exported on `/metrics`.
#[derive(Debug, Default)]
pub struct Counters {
    pub proposals: AtomicU64,
    pub proposals_rejected: AtomicU64,
    pub forwards: AtomicU64,
    pub linearizable_reads: AtomicU64,
    pub stale_reads: AtomicU64,
    pub http_requests: AtomicU64,
    /// MCP checks answered 403 / PERMISSION_DENIED, per project.
    pub mcp_denials: crate::mcp_denials::McpDenials,
}

/// Rounds of leadership confirmation one linearizable read may take.
pub const READ_INDEX_ATTEMPTS_MAX: u32 = 3;
/// Pause before the second round; the third waits twice as long.
pub const READ_INDEX_RETRY_MS: u64 = 50;

pub struct ControlNode {
    pub id: NodeId,
    pub config: NodeConfig,
    pub raft: RaftNode,
    pub state: StateReader,
    pub counters: Counters,
    /// Synced log appends and the entries they carried (group commit).
    pub append_stats: Arc<squadron_store::AppendStats>,
    /// Writes proposed on this node share Raft entries (`Command::Batch`).
    pub batcher: crate::proposal_batcher::ProposalBatcher,
    /// Read-index rounds on the leader (its own reads and followers' requests share them).
    pub leader_reads: ReadIndexRounds,
    /// Read-index requests to the leader, shared by this follower's concurrent reads.
    pub follower_reads: ReadIndexRounds,
    /// A follower's writes to the leader, sent in shared requests.
    pub forwarder: crate::forward_batcher::ForwardBatcher,
}

impl std::fmt::Debug for ControlNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlNode")
            .field("id", &self.id)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl ControlNode {
    pub fn new(
        config: NodeConfig,
        raft: RaftNode,
        state: StateReader,
        append_stats: Arc<squadron_store::AppendStats>,
    ) -> Arc<Self> {
        let timeout = Duration::from_millis(config.server.request_timeout_ms);
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(Duration::from_millis(1_000))
            .build()
            .unwrap_or_else(|_| reqwest::Client::new());
        let batcher = crate::proposal_batcher::ProposalBatcher::start(raft.clone());
        let leader_reads = {
            let (raft, id) = (raft.clone(), config.node_id);
            ReadIndexRounds::new(Arc::new(move || {
                let raft = raft.clone();
                Box::pin(async move {
                    leader_read_index(&raft, id, timeout)
                        .await
                        .map_err(|e| e.body.message)
                })
            }))
        };
        let follower_reads = {
            let (raft, http) = (raft.clone(), http.clone());
            ReadIndexRounds::new(Arc::new(move || {
                let (raft, http) = (raft.clone(), http.clone());
                Box::pin(async move { remote_read_index(&raft, &http).await })
            }))
        };
        let forwarder = crate::forward_batcher::ForwardBatcher::start(
            http.clone(),
            config.server.body_bytes_max,
        );
        Arc::new(Self {
            id: config.node_id,
            config,
            forwarder,
            batcher,
            leader_reads,
            follower_reads,
            raft,
            state,
            counters: Counters::default(),
            append_stats,
        })
    }

    fn timeout(&self) -> Duration {
        Duration::from_millis(self.config.server.request_timeout_ms)
    }

    /// The leader as this node knows it, with its addresses.
    pub fn leader(&self) -> Option<(NodeId, NodeAddr)> {
        let metrics = self.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        let node = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned()?;
        Some((leader, node))
    }

    pub fn is_leader(&self) -> bool {
        self.raft.metrics().borrow().current_leader == Some(self.id)
    }

    /// Proposes a command and answers with what applying it answered. On a follower the command
    /// is forwarded to the leader once; the caller sees the result, never "not leader".
    pub async fn write(
        &self,
        command: Command,
        idempotency_key: Option<IdempotencyKey>,
        forwarded: bool,
    ) -> Result<Response, ApiError> {
        // A follower that knows the leader sends the write there at once rather than
        // learning it from a refused proposal.
        if !forwarded && !self.is_leader() {
            if let Some((_, leader)) = self.leader() {
                return self
                    .forward_write(
                        &leader,
                        ProposeRequest {
                            command,
                            idempotency_key,
                        },
                    )
                    .await;
            }
        }
        let result = tokio::time::timeout(
            self.timeout(),
            self.batcher
                .propose(idempotency_key.clone(), command.clone()),
        )
        .await;
        let result =
            match result {
                Ok(r) => r,
                // The entry may still commit: the outcome is unknown, so the caller must not retry
                // a compare-and-swap blindly.
                Err(_) => return Err(ApiError::unavailable(
                    "timed out waiting for the write to commit; its outcome is unknown — retry \
                     only with the same Idempotency-Key",
                )),
            };
        match result {
            Ok(response) => {
                self.counters.proposals.fetch_add(1, Ordering::Relaxed);
                if !response.is_ok() {
                    self.counters
                        .proposals_rejected
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(response)
            }
            Err(ProposeFailure::NotLeader(leader_node)) => {
                if forwarded {
                    return Err(ApiError::unavailable(
                        "leadership moved while the request was forwarded; retry",
                    ));
                }
                let Some(leader) = leader_node else {
                    return Err(ApiError::unavailable("no leader is known; retry shortly"));
                };
                self.forward_write(
                    &leader,
                    ProposeRequest {
                        command,
                        idempotency_key,
                    },
                )
                .await
            }
            Err(ProposeFailure::Overloaded) => Err(ApiError::unavailable(
                "this node has too many writes waiting; retry shortly (nothing was proposed)",
            )),
            Err(ProposeFailure::Raft(e)) => Err(ApiError::unavailable(format!(
                "raft: {e}; the outcome is unknown — retry only with the same Idempotency-Key"
            ))),
        }
    }

    async fn forward_write(
        &self,
        leader: &NodeAddr,
        request: ProposeRequest,
    ) -> Result<Response, ApiError> {
        self.counters.forwards.fetch_add(1, Ordering::Relaxed);
        self.forwarder.forward(leader.clone(), request).await
    }

    /// Makes the next local read linearizable: the leader confirms its leadership with a quorum
    /// and names its commit point; this node waits until it has applied that far.
    pub async fn read_barrier(&self, consistency: Consistency) -> Result<(), ApiError> {
        if consistency == Consistency::Stale {
            self.counters.stale_reads.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        #[cfg(feature = "jepsen-fault-local-reads")]
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
        let metrics = self.raft.metrics().borrow().clone();
        let membership = metrics.membership_config.membership();
        let voters: std::collections::BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| (*id, (node.clone(), voters.contains(id))))
            .collect()
    }
}

/// On the leader: confirms leadership and returns the index a read must wait for.
async fn leader_read_index(
    raft: &RaftNode,
    id: NodeId,
    timeout: Duration,
) -> Result<Option<u64>, ApiError> {
    // Confirming leadership needs a quorum of heartbeat answers; on a loaded machine one
    // round can miss its deadline while the leader is still the leader, so a failed round
    // is tried again (bounded) before the caller is told to retry.
    let mut last = String::new();
    for attempt in 0..READ_INDEX_ATTEMPTS_MAX {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(
                READ_INDEX_RETRY_MS * u64::from(attempt),
            ))
            .await;
        }
        match tokio::time::timeout(timeout, raft.get_read_log_id()).await {
            Err(_) => return Err(ApiError::unavailable("timed out confirming leadership")),
            Ok(Ok(read)) => return Ok(read.0.map(|l| l.index)),
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

/// On a follower: one read-index request to the leader.
async fn remote_read_index(raft: &RaftNode, http: &reqwest::Client) -> Result<Option<u64>, String> {
    let leader = {
        let metrics = raft.metrics().borrow().clone();
        metrics
            .current_leader
            .and_then(|l| metrics.membership_config.membership().get_node(&l).cloned())
    };
    let Some(leader) = leader else {
        return Err("no leader is known; retry shortly".into());
    };
    let url = format!("http://{}/internal/v1/read-index", leader.rest);
    let reply = http
        .get(&url)
        .header(FORWARDED_HEADER, "1")
        .send()
        .await
        .map_err(|e| format!("read index from leader: {e}"))?;
    if !reply.status().is_success() {
        return Err(format!(
            "the leader refused a read index ({})",
            reply.status()
        ));
    }
    reply
        .json::<ReadIndexReply>()
        .await
        .map(|r| r.index)
        .map_err(|e| format!("read index reply: {e}"))
}
