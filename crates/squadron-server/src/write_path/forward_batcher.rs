//! A follower's writes travel to the leader together: writes that need forwarding while
//! earlier forwards are in flight go in one request to the leader's propose-batch route, where
//! the leader proposes each (and its proposal batcher puts them into shared entries). One HTTP
//! round trip and one request to parse per batch instead of per write.
//!
//! Like the proposal batcher it adds no waiting: at most [`FORWARDS_IN_FLIGHT_MAX`] requests
//! are in flight, and the next takes every write queued by then. A batch of one uses the
//! single-write route, exactly as before batching.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use squadron_core::Response;
use squadron_store::NodeAddr;
use tokio::sync::{mpsc, oneshot};

use super::batch_loop::{run_batches, BatchLimits};
use super::WriteError;
use crate::peer::wire::{encode_propose_batch, ForwardAnswer, ProposeRequest};
use crate::peer::{wire, PeerClient};

/// Forward requests in flight to the leader at once.
pub const FORWARDS_IN_FLIGHT_MAX: usize = 2;
/// Writes waiting to be forwarded; beyond it a write is refused at once.
pub const FORWARD_QUEUE_MAX: usize = 16_384;
/// Most writes in one forwarded batch: as many as the leader accepts.
pub const FORWARD_BATCH_WRITES_MAX: usize = wire::PROPOSE_BATCH_WRITES_MAX;

struct Pending {
    leader: NodeAddr,
    json: Vec<u8>,
    reply: oneshot::Sender<Result<Response, WriteError>>,
}

#[derive(Debug, Clone)]
pub struct ForwardBatcher {
    tx: mpsc::Sender<Pending>,
    /// HTTP requests sent to the leader (a batch is one); `/metrics`.
    requests: Arc<AtomicU64>,
}

impl ForwardBatcher {
    /// `body_bytes_max` is the leader's request body limit; a batch stays under half of it.
    pub fn start(peer: PeerClient, body_bytes_max: usize) -> ForwardBatcher {
        let (tx, rx) = mpsc::channel(FORWARD_QUEUE_MAX);
        let requests = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(peer, rx, body_bytes_max / 2, requests.clone()));
        ForwardBatcher { tx, requests }
    }

    /// HTTP requests sent to the leader so far.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// Forwards one write to `leader` and waits for the leader's answer.
    pub async fn forward(
        &self,
        leader: NodeAddr,
        request: ProposeRequest,
    ) -> Result<Response, WriteError> {
        let json = serde_json::to_vec(&request).map_err(|e| WriteError::Encode(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            leader,
            json,
            reply,
        };
        if self.tx.try_send(pending).is_err() {
            return Err(WriteError::ForwardsOverloaded);
        }
        answer.await.unwrap_or(Err(WriteError::ForwarderStopped))
    }
}

async fn run(
    peer: PeerClient,
    rx: mpsc::Receiver<Pending>,
    batch_bytes_max: usize,
    requests: Arc<AtomicU64>,
) {
    let limits = BatchLimits {
        in_flight_max: FORWARDS_IN_FLIGHT_MAX,
        items_max: FORWARD_BATCH_WRITES_MAX,
        weight_max: batch_bytes_max,
    };
    run_batches(
        rx,
        limits,
        |p| p.json.len() + 1,
        // Leadership may have moved between two writes: each batch goes to one leader.
        |first, next| first.leader == next.leader,
        move |batch| {
            requests.fetch_add(1, Ordering::Relaxed);
            let peer = peer.clone();
            async move { send(&peer, batch).await }
        },
    )
    .await;
}

async fn send(peer: &PeerClient, mut batch: Vec<Pending>) {
    let leader = batch[0].leader.clone();
    if batch.len() == 1 {
        let Some(p) = batch.pop() else { return };
        let answer = peer
            .propose(&leader, p.json)
            .await
            .map_err(WriteError::from);
        let _ = p.reply.send(answer);
        return;
    }
    let body = encode_propose_batch(batch.iter().map(|p| p.json.as_slice()));
    let answers = peer
        .propose_batch(&leader, body)
        .await
        .map_err(WriteError::from)
        .and_then(|answers| {
            if answers.len() == batch.len() {
                Ok(answers)
            } else {
                Err(WriteError::ForwardIncomplete {
                    answered: answers.len(),
                    sent: batch.len(),
                })
            }
        });
    match answers {
        Ok(answers) => {
            for (p, a) in batch.into_iter().zip(answers) {
                let _ = p.reply.send(match a {
                    ForwardAnswer::Ok(r) => Ok(r),
                    ForwardAnswer::Error(body) => Err(WriteError::Leader(body)),
                });
            }
        }
        Err(e) => {
            for p in batch {
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}
