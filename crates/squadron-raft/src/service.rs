//! The server side of Raft RPC: decodes a payload, hands it to openraft, encodes the result
//! (success or openraft's own error) back.

use serde::de::DeserializeOwned;
use serde::Serialize;
use squadron_proto::v1::raft_service_server::RaftService;
use squadron_proto::v1::RaftPayload;
use tonic::{Request, Response, Status};

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use openraft::raft::{AppendEntriesResponse, InstallSnapshotRequest};
use squadron_store::TypeConfig;
use tokio::sync::watch;
use tonic::Streaming;

use crate::{wire, LeaderContact, RaftNode};

/// Serves `RaftService` for one node.
#[derive(Clone)]
pub struct RaftGrpcService {
    raft: RaftNode,
    /// Touched by every append-entries and snapshot from a current leader.
    contact: Arc<LeaderContact>,
    /// Turns true when the node stops: append streams end then, rather than hold the
    /// listener's graceful shutdown for its whole grace (a leader never ends them itself).
    stop: watch::Receiver<bool>,
}

impl std::fmt::Debug for RaftGrpcService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RaftGrpcService")
    }
}

impl RaftGrpcService {
    pub fn new(raft: RaftNode, contact: Arc<LeaderContact>, stop: watch::Receiver<bool>) -> Self {
        Self {
            raft,
            contact,
            stop,
        }
    }

    async fn append(&self, request: &RaftPayload) -> Result<RaftPayload, Status> {
        let answer = self.raft.append_entries(decode(request)?).await;
        if matches!(&answer, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
            self.contact.touch();
        }
        encode(&answer)
    }

    /// The next request of an append stream, or `None` when it should end: the leader closed
    /// it, the node stops, or the request could not be read.
    async fn next_request(
        &mut self,
        requests: &mut Streaming<RaftPayload>,
    ) -> Option<Result<RaftPayload, Status>> {
        if *self.stop.borrow() {
            return None;
        }
        tokio::select! {
            _ = self.stop.changed() => None,
            next = requests.message() => next.transpose(),
        }
    }
}

/// An append stream's answers: one per request, in order; it ends after the first error.
type AppendAnswers = Pin<Box<dyn Stream<Item = Result<RaftPayload, Status>> + Send + 'static>>;

fn decode<T: DeserializeOwned>(payload: &RaftPayload) -> Result<T, Status> {
    wire::decode(&payload.data).map_err(|e| Status::invalid_argument(e.to_string()))
}

fn encode<T: Serialize>(value: &T) -> Result<RaftPayload, Status> {
    let data = wire::encode(value).map_err(|e| Status::internal(e.to_string()))?;
    Ok(RaftPayload { data })
}

#[tonic::async_trait]
impl RaftService for RaftGrpcService {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.append(request.get_ref()).await.map(Response::new)
    }

    type AppendEntriesStreamStream = AppendAnswers;

    async fn append_entries_stream(
        &self,
        request: Request<Streaming<RaftPayload>>,
    ) -> Result<Response<AppendAnswers>, Status> {
        let state = Some((self.clone(), request.into_inner()));
        let answers = futures_util::stream::unfold(state, |state| async move {
            let (mut this, mut requests) = state?;
            let answer = match this.next_request(&mut requests).await? {
                Ok(request) => this.append(&request).await,
                Err(status) => Err(status),
            };
            let next = answer.is_ok().then_some((this, requests));
            Some((answer, next))
        });
        Ok(Response::new(Box::pin(answers)))
    }

    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        let rpc = decode(request.get_ref())?;
        encode(&self.raft.vote(rpc).await).map(Response::new)
    }

    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        let rpc: InstallSnapshotRequest<TypeConfig> = decode(request.get_ref())?;
        let sender = rpc.vote;
        let answer = self.raft.install_snapshot(rpc).await;
        // A reply carrying a higher vote than the sender's: the sender is no leader now.
        if matches!(&answer, Ok(r) if r.vote <= sender) {
            self.contact.touch();
        }
        encode(&answer).map(Response::new)
    }
}
