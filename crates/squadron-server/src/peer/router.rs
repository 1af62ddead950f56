//! The receiving side of the node-to-node protocol. Every handler runs its request on this
//! node — `propose_here`, the leader's read index, `change_membership_here` — so nothing that
//! arrives here is forwarded a second time.

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use squadron_core::Response;

use super::wire::{
    ForwardAnswer, MembershipChange, MembershipReply, PingReply, ProposeBatch, ProposeRequest,
    ReadIndexReply, MEMBERSHIP_PATH, PING_PATH, PROPOSE_BATCH_PATH, PROPOSE_BATCH_WRITES_MAX,
    PROPOSE_PATH, READ_INDEX_PATH,
};
use crate::error::ApiError;
use crate::node::ControlNode;
use crate::rest::JsonBody;
use crate::write_path::WriteError;

type PeerState = Arc<ControlNode>;

/// The peer routes, with the same body limit as the public API (a forwarded batch stays under
/// half of it).
pub fn router(node: PeerState) -> Router {
    let body_limit = node.config.server.body_bytes_max;
    Router::new()
        .route(PROPOSE_PATH, post(propose))
        .route(PROPOSE_BATCH_PATH, post(propose_batch))
        .route(READ_INDEX_PATH, get(read_index))
        .route(MEMBERSHIP_PATH, post(change_membership))
        .route(PING_PATH, get(ping))
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(node)
}

/// A forwarded write: proposed here, the leader stamping the time.
async fn run_forwarded(
    node: &ControlNode,
    request: ProposeRequest,
) -> Result<Response, WriteError> {
    let proposal = node.propose_here(request.subject, request.command, request.idempotency_key);
    crate::trace::within(request.trace_id, proposal)
        .await
        .map_err(|e| match e {
            WriteError::NotLeader { .. } => WriteError::LeadershipMoved,
            e => e,
        })
}

async fn propose(
    State(node): State<PeerState>,
    JsonBody(request): JsonBody<ProposeRequest>,
) -> Result<Json<Response>, ApiError> {
    Ok(Json(run_forwarded(&node, request).await?))
}

/// Each write of a batch is proposed as if it had come alone (and the proposal batcher shares
/// entries among them). Answers come in request order.
async fn propose_batch(
    State(node): State<PeerState>,
    JsonBody(batch): JsonBody<ProposeBatch>,
) -> Result<Json<Vec<ForwardAnswer>>, ApiError> {
    if batch.requests.len() > PROPOSE_BATCH_WRITES_MAX {
        return Err(ApiError::invalid(
            "requests",
            format!(
                "at most {PROPOSE_BATCH_WRITES_MAX} writes per batch, got {}",
                batch.requests.len()
            ),
        ));
    }
    let answers =
        futures_util::future::join_all(batch.requests.into_iter().map(|r| run_forwarded(&node, r)))
            .await;
    Ok(Json(
        answers
            .into_iter()
            .map(|a| match a {
                Ok(r) => ForwardAnswer::Ok(r),
                Err(e) => ForwardAnswer::Error(ApiError::from(e).body),
            })
            .collect(),
    ))
}

/// Another voter's election driver asks how far this node's log reaches and when it last
/// heard a leader.
async fn ping(State(node): State<PeerState>) -> Json<PingReply> {
    // Leading now, not merely named leader of its last term (a leader removed from the
    // membership keeps that name after it stepped down).
    let leading = node.raft.metrics().borrow().state == openraft::ServerState::Leader;
    let heard = if leading {
        0
    } else {
        u64::try_from(node.leader_contact.quiet_for().as_millis()).unwrap_or(u64::MAX)
    };
    Json(PingReply {
        last_log_index: node.raft.metrics().borrow().last_log_index,
        leader_heard_ms_ago: Some(heard),
    })
}

async fn read_index(State(node): State<PeerState>) -> Result<Json<ReadIndexReply>, ApiError> {
    let index = node.read_index().await?;
    // The follower waits until it has applied `index`, and learns the commit point from the
    // next AppendEntries: send it now rather than at the next heartbeat tick (up to
    // `heartbeat_interval_ms` later), so a follower read costs a round trip, not a tick.
    if let Err(e) = node.raft.trigger().heartbeat().await {
        tracing::debug!(error = %e, "heartbeat after a read index not sent");
    }
    Ok(Json(ReadIndexReply { index }))
}

async fn change_membership(
    State(node): State<PeerState>,
    JsonBody(change): JsonBody<MembershipChange>,
) -> Result<Json<MembershipReply>, ApiError> {
    Ok(Json(node.writes.change_membership_here(&change).await?))
}
