//! The server side of Raft RPC: decodes a payload, hands it to openraft, encodes the result
//! (success or openraft's own error) back.

use serde::de::DeserializeOwned;
use serde::Serialize;
use squadron_proto::v1::raft_service_server::RaftService;
use squadron_proto::v1::RaftPayload;
use tonic::{Request, Response, Status};

use std::sync::Arc;

use openraft::raft::{AppendEntriesResponse, InstallSnapshotRequest};
use squadron_store::TypeConfig;

use crate::{wire, LeaderContact, RaftNode};

/// Serves `RaftService` for one node.
#[derive(Clone)]
pub struct RaftGrpcService {
    raft: RaftNode,
    /// Touched by every append-entries and snapshot from a current leader.
    contact: Arc<LeaderContact>,
}

impl std::fmt::Debug for RaftGrpcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaftGrpcService")
    }
}

impl RaftGrpcService {
    pub fn new(raft: RaftNode, contact: Arc<LeaderContact>) -> Self {
        Self { raft, contact }
    }
}

fn decode<T: DeserializeOwned>(req: Request<RaftPayload>) -> Result<T, Status> {
    wire::decode(&req.into_inner().data).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn reply<T: Serialize>(value: &T) -> Result<Response<RaftPayload>, Status> {
    let data = wire::encode(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(Response::new(RaftPayload { data }))
}

#[tonic::async_trait]
impl RaftService for RaftGrpcService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        let answer = self.raft.append_entries(rpc).await;
        if matches!(&answer, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.contact.touch();
        }
        reply(&answer)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(request)?;
        let sender = rpc.vote;
        let answer = self.raft.install_snapshot(rpc).await;
        // A reply carrying a higher vote than the sender's: the sender is no leader now.
        if matches!(&answer, Ok(r) if r.vote <= sender) {
            self.contact.touch();
        }
        reply(&answer)
    }
}
