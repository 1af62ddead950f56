//! The server side of Raft RPC: decodes a payload, hands it to openraft, encodes the result
//! (success or openraft's own error) back.

use serde::de::DeserializeOwned;
use serde::Serialize;
use squadron_proto::v1::raft_service_server::RaftService;
use squadron_proto::v1::RaftPayload;
use tonic::{Request, Response, Status};

use crate::{wire, RaftNode};

/// Serves `RaftService` for one node.
#[derive(Clone)]
pub struct RaftGrpcService {
    raft: RaftNode,
}

impl std::fmt::Debug for RaftGrpcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaftGrpcService")
    }
}

impl RaftGrpcService {
    pub fn new(raft: RaftNode) -> Self {
        Self { raft }
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
        reply(&self.raft.append_entries(rpc).await)
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        reply(&self.raft.vote(rpc).await)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request)?;
        reply(&self.raft.install_snapshot(rpc).await)
    }
}
