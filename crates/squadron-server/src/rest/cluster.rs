//! Cluster status and membership. A membership change runs on the leader; a follower relays
//! it there through the peer protocol (`ControlNode::change_membership`).

use axum::extract::{Path, State};
use axum::routing::{delete, get, post};
use axum::Json;
use openraft::ServerState;
use squadron_store::{NodeAddr, NodeId};

use super::{body, json, query, AppState, Input, JsonBody, QueryParams, RouteBook};
use crate::error::ApiError;
use crate::node::{Consistency, ControlNode};
use crate::peer::wire::{MembershipChange, MembershipReply};
use squadron_api::{
    Access, AddLearner, ClusterStatus, MemberView, MembershipChanged, PromoteVoter, Scope,
    TlsReloaded,
};

pub fn routes(book: RouteBook) -> RouteBook {
    book.add(
        "GET",
        "/api/v1/cluster/status",
        "This node's view: role, leader, term, log, applied index, state digest, members",
        query::<squadron_api::ClusterStatusQuery>(),
        json::<ClusterStatus>(),
        Access::viewer(Scope::Unbound).and_workers(),
        get(status),
    )
    .add(
        "POST",
        "/api/v1/cluster/learners",
        "Add a node as a learner (it catches up, then can be promoted)",
        body::<squadron_api::AddLearner>(),
        json::<MembershipChanged>(),
        Access::admin(),
        post(add_learner),
    )
    .add(
        "POST",
        "/api/v1/cluster/voters",
        "Promote a learner to voter",
        body::<squadron_api::PromoteVoter>(),
        json::<MembershipChanged>(),
        Access::admin(),
        post(promote),
    )
    .add(
        "DELETE",
        "/api/v1/cluster/members/:id",
        "Remove a voter or learner from the cluster (the leader too)",
        Input::NONE,
        json::<MembershipChanged>(),
        Access::admin(),
        delete(remove),
    )
    .add(
        "POST",
        "/api/v1/cluster/tls/reload",
        "Re-read this node's certificate files (rotation); new connections use them",
        Input::NONE,
        json::<TlsReloaded>(),
        Access::admin(),
        post(reload_tls),
    )
}

async fn reload_tls(State(node): State<AppState>) -> Result<Json<TlsReloaded>, ApiError> {
    node.tls.reload().map_err(|e| {
        ApiError::internal(format!(
            "certificates not reloaded (the old ones stay): {e}"
        ))
    })?;
    tracing::info!("certificates reloaded");
    Ok(Json(TlsReloaded {
        identity: node.tls.identity.identity.to_string(),
    }))
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

/// This node's view; with `digested`, the state digest and the applied index it describes
/// (`StateDigests::current`), else the applied index now and no digest. `clock_ms` is read
/// now, so it may be of a later index than `applied`.
pub fn local_status(
    node: &ControlNode,
    digested: Option<crate::state_digests::IndexedDigest>,
) -> ClusterStatus {
    let m = node.raft.metrics().borrow().clone();
    let (applied, digest) =
        digested.unwrap_or_else(|| (node.state.last_applied().map(|l| l.index), String::new()));
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
        clock_ms: node.state.clock_ms(),
        members: node
            .members()
            .into_iter()
            .map(|(id, (addr, voter))| MemberView {
                id,
                rest: addr.rest,
                grpc: addr.grpc,
                peer: addr.peer,
                voter,
            })
            .collect(),
    }
}

async fn status(
    State(node): State<AppState>,
    QueryParams(q): QueryParams<squadron_api::ClusterStatusQuery>,
) -> Result<Json<ClusterStatus>, ApiError> {
    // The status is a node's own view; a linearizable request first catches up with the leader.
    if q.consistency == Consistency::Linearizable && node.leader().is_some() {
        node.read_barrier(Consistency::Linearizable).await?;
    }
    let digested = match q.digest {
        true => Some(
            node.state_digests
                .current(&node.state)
                .await
                .map_err(ApiError::internal)?,
        ),
        false => None,
    };
    Ok(Json(local_status(&node, digested)))
}

/// Runs the change on the leader (relayed there from a follower) and answers with the
/// leader's view of the members after it.
async fn change(
    node: &ControlNode,
    change: MembershipChange,
) -> Result<Json<MembershipChanged>, ApiError> {
    let reply: MembershipReply = node.change_membership(change).await?;
    Ok(Json(MembershipChanged {
        log_index: reply.log_index,
        members: reply
            .members
            .into_iter()
            .map(|m| MemberView {
                id: m.id,
                rest: m.addr.rest,
                grpc: m.addr.grpc,
                peer: m.addr.peer,
                voter: m.voter,
            })
            .collect(),
    }))
}

async fn add_learner(
    State(node): State<AppState>,
    JsonBody(body): JsonBody<AddLearner>,
) -> Result<Json<MembershipChanged>, ApiError> {
    let addr = NodeAddr {
        rest: body.rest,
        grpc: body.grpc,
        peer: body.peer,
    };
    change(&node, MembershipChange::AddLearner { id: body.id, addr }).await
}

async fn promote(
    State(node): State<AppState>,
    JsonBody(body): JsonBody<PromoteVoter>,
) -> Result<Json<MembershipChanged>, ApiError> {
    change(&node, MembershipChange::PromoteVoter { id: body.id }).await
}

async fn remove(
    State(node): State<AppState>,
    Path(raw): Path<String>,
) -> Result<Json<MembershipChanged>, ApiError> {
    let id: NodeId = raw
        .parse()
        .map_err(|_| ApiError::invalid("id", format!("must be a node id, got {raw:?}")))?;
    change(&node, MembershipChange::Remove { id }).await
}
