//! A running control node: its Raft handle, its view of the state, and the two operations every
//! API is built on — `write` (propose through the leader) and `read_barrier` (linearizable
//! reads through ReadIndex on the leader).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use openraft::error::{ClientWriteError, RaftError};
use serde::{Deserialize, Serialize};
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, CommandEnvelope, Response};
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
    http: reqwest::Client,
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
        Arc::new(Self {
            id: config.node_id,
            config,
            raft,
            state,
            counters: Counters::default(),
            append_stats,
            http,
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
        let envelope = CommandEnvelope {
            at_ms: now_ms(),
            idempotency_key: idempotency_key.clone(),
            command: command.clone(),
        };
        let result = tokio::time::timeout(self.timeout(), self.raft.client_write(envelope)).await;
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
            Ok(reply) => {
                self.counters.proposals.fetch_add(1, Ordering::Relaxed);
                if !reply.data.is_ok() {
                    self.counters
                        .proposals_rejected
                        .fetch_add(1, Ordering::Relaxed);
                }
                Ok(reply.data)
            }
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(fwd))) => {
                if forwarded {
                    return Err(ApiError::unavailable(
                        "leadership moved while the request was forwarded; retry",
                    ));
                }
                let Some(leader) = fwd.leader_node else {
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
            Err(e) => Err(ApiError::unavailable(format!("raft: {e}"))),
        }
    }

    async fn forward_write(
        &self,
        leader: &NodeAddr,
        request: ProposeRequest,
    ) -> Result<Response, ApiError> {
        self.counters.forwards.fetch_add(1, Ordering::Relaxed);
        let url = format!("http://{}/internal/v1/propose", leader.rest);
        let sent = self
            .http
            .post(&url)
            .header(FORWARDED_HEADER, "1")
            .json(&request)
            .send()
            .await;
        let reply = match sent {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Err(ApiError::unavailable(format!(
                    "the leader at {} is unreachable; retry shortly",
                    leader.rest
                )))
            }
            Err(e) => {
                return Err(ApiError::unavailable(format!(
                    "forwarding to the leader failed ({e}); the outcome is unknown — retry only \
                     with the same Idempotency-Key"
                )))
            }
        };
        if reply.status().is_success() {
            reply
                .json::<Response>()
                .await
                .map_err(|e| ApiError::internal(format!("leader answered unreadably: {e}")))
        } else {
            let body = reply
                .json::<crate::error::ErrorBody>()
                .await
                .map_err(|e| ApiError::internal(format!("leader answered unreadably: {e}")))?;
            Err(ApiError { body })
        }
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
        let index = if self.is_leader() {
            self.read_index().await?
        } else {
            let Some((_, leader)) = self.leader() else {
                return Err(ApiError::unavailable("no leader is known; retry shortly"));
            };
            let url = format!("http://{}/internal/v1/read-index", leader.rest);
            let reply = self
                .http
                .get(&url)
                .header(FORWARDED_HEADER, "1")
                .send()
                .await
                .map_err(|e| ApiError::unavailable(format!("read index from leader: {e}")))?;
            if !reply.status().is_success() {
                return Err(ApiError::unavailable(format!(
                    "the leader refused a read index ({})",
                    reply.status()
                )));
            }
            reply
                .json::<ReadIndexReply>()
                .await
                .map_err(|e| ApiError::internal(format!("read index reply: {e}")))?
                .index
        };
        if let Some(index) = index {
            self.raft
                .wait(Some(self.timeout()))
                .applied_index_at_least(Some(index), "linearizable read")
                .await
                .map_err(|e| ApiError::unavailable(format!("catching up to the leader: {e}")))?;
        }
        Ok(())
    }

    /// On the leader: confirms leadership and returns the index a read must wait for.
    pub async fn read_index(&self) -> Result<Option<u64>, ApiError> {
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
            match tokio::time::timeout(self.timeout(), self.raft.get_read_log_id()).await {
                Err(_) => return Err(ApiError::unavailable("timed out confirming leadership")),
                Ok(Ok(read)) => return Ok(read.0.map(|l| l.index)),
                Ok(Err(e)) => {
                    last = e.to_string();
                    if !self.is_leader() {
                        break;
                    }
                }
            }
        }
        Err(ApiError::unavailable(format!(
            "not able to serve a read index: {last}"
        )))
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
