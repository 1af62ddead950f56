//! Cluster status and membership, and the internal endpoints followers use on the leader.

use std::collections::BTreeSet;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{delete, get, post};
use axum::Json;
use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::{ChangeMembers, ServerState};
use serde::{Deserialize, Serialize};
use squadron_store::{NodeAddr, NodeId};

use super::{AppState, JsonBody, QueryParams, RouteBook};
use crate::error::ApiError;
use crate::node::{Consistency, ControlNode, ProposeRequest, ReadIndexReply, FORWARDED_HEADER};

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "GET",
        "/api/v1/cluster/status",
        "This node's view: role, leader, term, log, applied index, state digest, members",
        None,
        get(status),
    )
    .add(
        "POST",
        "/api/v1/cluster/learners",
        "Add a node as a learner (it catches up, then can be promoted)",
        Some("AddLearner"),
        post(add_learner),
    )
    .add(
        "POST",
        "/api/v1/cluster/voters",
        "Promote a learner to voter",
        Some("PromoteVoter"),
        post(promote),
    )
    .add(
        "DELETE",
        "/api/v1/cluster/members/:id",
        "Remove a voter or learner from the cluster (the leader too)",
        None,
        delete(remove),
    )
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberView {
    pub id: NodeId,
    pub rest: String,
    pub grpc: String,
    pub voter: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub node_id: NodeId,
    pub role: String,
    pub leader: Option<NodeId>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub applied: Option<u64>,
    pub snapshot: Option<u64>,
    pub purged: Option<u64>,
    /// SHA-256 of this node's state at `applied` (INV-12).
    pub digest: String,
    pub clock_ms: u64,
    pub members: Vec<MemberView>,
}

fn role(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

pub fn local_status(node: &ControlNode) -> ClusterStatus {
    let m = node.raft.metrics().borrow().clone();
    // Digest and applied index are read together so they describe the same state.
    let (applied, digest, clock_ms) = node.state.with_data(|d| {
        (
            d.last_applied.map(|l| l.index),
            squadron_core::snapshot::state_digest(&d.state).to_hex(),
            d.state.clock_ms(),
        )
    });
    ClusterStatus {
        node_id: node.id,
        role: role(m.state).into(),
        leader: m.current_leader,
        term: m.current_term,
        last_log_index: m.last_log_index,
        applied,
        snapshot: m.snapshot.map(|l| l.index),
        purged: m.purged.map(|l| l.index),
        digest,
        clock_ms,
        members: node
            .members()
            .into_iter()
            .map(|(id, (addr, voter))| MemberView {
                id,
                rest: addr.rest,
                grpc: addr.grpc,
                voter,
            })
            .collect(),
    }
}

async fn status(
    State(node): State<AppState>,
    QueryParams(q): QueryParams<super::ConsistencyQuery>,
) -> Result<Json<ClusterStatus>, ApiError> {
    // The status is a node's own view; a linearizable request first catches up with the leader.
    if q.consistency == Consistency::Linearizable && node.leader().is_some() {
        node.read_barrier(Consistency::Linearizable).await?;
    }
    Ok(Json(local_status(&node)))
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AddLearner {
    pub id: NodeId,
    pub rest: String,
    pub grpc: String,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PromoteVoter {
    pub id: NodeId,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct MembershipChanged {
    pub log_index: u64,
    pub members: Vec<MemberView>,
}

type WriteError = RaftError<NodeId, ClientWriteError<NodeId, NodeAddr>>;

/// Attempts of a membership change refused because another one is still committing.
pub const MEMBERSHIP_RETRIES_MAX: u32 = 50;
/// Pause between those attempts.
pub const MEMBERSHIP_RETRY_DELAY_MS: u64 = 100;

/// Runs a membership change on the leader, forwarding the HTTP request once if this node is not.
async fn on_leader<F, Fut>(
    node: &ControlNode,
    headers: &HeaderMap,
    method: reqwest::Method,
    path: &str,
    body: Option<serde_json::Value>,
    change: F,
) -> Result<Json<MembershipChanged>, ApiError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<
        Output = Result<
            openraft::raft::ClientWriteResponse<squadron_store::TypeConfig>,
            WriteError,
        >,
    >,
{
    // A membership change is joint consensus in two steps; while the previous change's second
    // step commits, openraft refuses a new one as "in progress". That refusal means nothing was
    // applied, so waiting briefly and trying again is safe.
    let mut result = change().await;
    for _ in 0..MEMBERSHIP_RETRIES_MAX {
        match &result {
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                ChangeMembershipError::InProgress(_),
            ))) => {
                tokio::time::sleep(std::time::Duration::from_millis(MEMBERSHIP_RETRY_DELAY_MS))
                    .await;
                result = change().await;
            }
            _ => break,
        }
    }
    match result {
        Ok(reply) => Ok(Json(MembershipChanged {
            log_index: reply.log_id.index,
            members: local_status(node).members,
        })),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(fwd)))
            if !headers.contains_key(FORWARDED_HEADER) =>
        {
            let leader = fwd
                .leader_node
                .ok_or_else(|| ApiError::unavailable("no leader is known; retry shortly"))?;
            let client = reqwest::Client::new();
            let mut req = client
                .request(method, format!("http://{}{path}", leader.rest))
                .header(FORWARDED_HEADER, "1");
            if let Some(body) = body {
                req = req.json(&body);
            }
            let reply = req
                .send()
                .await
                .map_err(|e| ApiError::unavailable(format!("forwarding to the leader: {e}")))?;
            if reply.status().is_success() {
                reply
                    .json()
                    .await
                    .map(Json)
                    .map_err(|e| ApiError::internal(format!("leader reply: {e}")))
            } else {
                let body = reply
                    .json::<crate::error::ErrorBody>()
                    .await
                    .map_err(|e| ApiError::internal(format!("leader reply: {e}")))?;
                Err(ApiError { body })
            }
        }
        Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => Err(ApiError::new(
            squadron_core::error_code::ErrorCode::FailedPrecondition,
            e.to_string(),
        )),
        Err(e) => Err(ApiError::unavailable(e.to_string())),
    }
}

async fn add_learner(
    State(node): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<AddLearner>,
) -> Result<Json<MembershipChanged>, ApiError> {
    if body.id == 0 {
        return Err(ApiError::invalid("id", "must be a positive integer"));
    }
    for (field, addr) in [("rest", &body.rest), ("grpc", &body.grpc)] {
        if !addr.contains(':') || addr.len() > 256 {
            return Err(ApiError::invalid(
                field,
                format!("must be host:port, got {addr:?}"),
            ));
        }
    }
    let addr = NodeAddr {
        rest: body.rest.clone(),
        grpc: body.grpc.clone(),
    };
    let json = serde_json::to_value(&body).ok();
    on_leader(
        &node,
        &headers,
        reqwest::Method::POST,
        "/api/v1/cluster/learners",
        json,
        || node.raft.add_learner(body.id, addr.clone(), true),
    )
    .await
}

async fn promote(
    State(node): State<AppState>,
    headers: HeaderMap,
    JsonBody(body): JsonBody<PromoteVoter>,
) -> Result<Json<MembershipChanged>, ApiError> {
    if !node.members().contains_key(&body.id) && node.is_leader() {
        return Err(ApiError::not_found(format!(
            "node {} is not a learner of this cluster; add it first",
            body.id
        )));
    }
    let json = serde_json::to_value(&body).ok();
    let ids = BTreeSet::from([body.id]);
    on_leader(
        &node,
        &headers,
        reqwest::Method::POST,
        "/api/v1/cluster/voters",
        json,
        || {
            node.raft
                .change_membership(ChangeMembers::AddVoterIds(ids.clone()), false)
        },
    )
    .await
}

async fn remove(
    State(node): State<AppState>,
    headers: HeaderMap,
    Path(raw): Path<String>,
) -> Result<Json<MembershipChanged>, ApiError> {
    let id: NodeId = raw
        .parse()
        .map_err(|_| ApiError::invalid("id", format!("must be a node id, got {raw:?}")))?;
    let members = node.members();
    let Some((_, voter)) = members.get(&id) else {
        return Err(ApiError::not_found(format!("node {id} is not a member")));
    };
    let ids = BTreeSet::from([id]);
    let change = if *voter {
        ChangeMembers::RemoveVoters(ids)
    } else {
        ChangeMembers::RemoveNodes(ids)
    };
    let path = format!("/api/v1/cluster/members/{id}");
    on_leader(
        &node,
        &headers,
        reqwest::Method::DELETE,
        &path,
        None,
        || node.raft.change_membership(change.clone(), false),
    )
    .await
}

/// Followers forward writes here; the leader stamps the time and proposes.
pub async fn internal_propose(
    State(node): State<AppState>,
    JsonBody(req): JsonBody<ProposeRequest>,
) -> Result<Json<squadron_core::Response>, ApiError> {
    node.write(req.command, req.idempotency_key, true)
        .await
        .map(Json)
}

/// Most writes one forwarded batch may carry.
pub const PROPOSE_BATCH_WRITES_MAX: usize = crate::forward_batcher::FORWARD_BATCH_WRITES_MAX;

/// Followers forward writes here in batches; each is proposed as if it had come alone (and
/// the proposal batcher shares entries among them). Answers come in request order.
pub async fn internal_propose_batch(
    State(node): State<AppState>,
    JsonBody(req): JsonBody<crate::forward_batcher::ProposeBatch>,
) -> Result<Json<Vec<crate::forward_batcher::ForwardAnswer>>, ApiError> {
    use crate::forward_batcher::ForwardAnswer;
    if req.requests.len() > PROPOSE_BATCH_WRITES_MAX {
        return Err(ApiError::invalid(
            "requests",
            format!(
                "at most {PROPOSE_BATCH_WRITES_MAX} writes per batch, got {}",
                req.requests.len()
            ),
        ));
    }
    let answers = futures_util::future::join_all(
        req.requests
            .into_iter()
            .map(|r| node.write(r.command, r.idempotency_key, true)),
    )
    .await;
    Ok(Json(
        answers
            .into_iter()
            .map(|a| match a {
                Ok(r) => ForwardAnswer::Ok(r),
                Err(e) => ForwardAnswer::Error(e.body),
            })
            .collect(),
    ))
}

/// Followers ask here for the index a linearizable read must wait for.
pub async fn internal_read_index(
    State(node): State<AppState>,
) -> Result<Json<ReadIndexReply>, ApiError> {
    let index = node.read_index().await?;
    // The follower waits until it has applied `index`, and learns the commit point from the
    // next AppendEntries: send it now rather than at the next heartbeat tick (up to
    // `heartbeat_interval_ms` later), so a follower read costs a round trip, not a tick.
    if let Err(e) = node.raft.trigger().heartbeat().await {
        tracing::debug!(error = %e, "heartbeat after a read index not sent");
    }
    Ok(Json(ReadIndexReply { index }))
}
