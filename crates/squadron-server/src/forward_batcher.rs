//! A follower's writes travel to the leader together: writes that need forwarding while
//! earlier forwards are in flight go in one request to `/internal/v1/propose-batch`, where the
//! leader proposes each (and its proposal batcher puts them into shared entries). One HTTP
//! round trip and one request to parse per batch instead of per write.
//!
//! Like the proposal batcher it adds no waiting: at most [`FORWARDS_IN_FLIGHT_MAX`] requests
//! are in flight, and the next takes every write queued by then. A batch of one uses the
//! single-write route, exactly as before batching.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use squadron_core::Response;
use squadron_store::NodeAddr;
use tokio::sync::{mpsc, oneshot};

use crate::batch_loop::{run_batches, BatchLimits};
use crate::error::{ApiError, ErrorBody};
use crate::node::{ProposeRequest, FORWARDED_HEADER};

/// Forward requests in flight to the leader at once.
pub const FORWARDS_IN_FLIGHT_MAX: usize = 2;
/// Writes waiting to be forwarded; beyond it a write is refused at once.
pub const FORWARD_QUEUE_MAX: usize = 16_384;
/// Most writes in one forwarded batch.
pub const FORWARD_BATCH_WRITES_MAX: usize = 1_024;

/// `POST /internal/v1/propose-batch`.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProposeBatch {
    pub requests: Vec<ProposeRequest>,
}

/// One answer of a forwarded batch, in request order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardAnswer {
    Ok(Response),
    Error(ErrorBody),
}

struct Pending {
    leader: NodeAddr,
    json: Vec<u8>,
    request: ProposeRequest,
    reply: oneshot::Sender<Result<Response, ApiError>>,
}

#[derive(Debug, Clone)]
pub struct ForwardBatcher {
    tx: mpsc::Sender<Pending>,
    /// HTTP requests sent to the leader (a batch is one); `/metrics`.
    requests: Arc<AtomicU64>,
}

impl ForwardBatcher {
    /// `body_bytes_max` is the leader's request body limit; a batch stays under half of it.
    pub fn start(http: reqwest::Client, body_bytes_max: usize) -> ForwardBatcher {
        let (tx, rx) = mpsc::channel(FORWARD_QUEUE_MAX);
        let requests = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(http, rx, body_bytes_max / 2, requests.clone()));
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
    ) -> Result<Response, ApiError> {
        let json = serde_json::to_vec(&request)
            .map_err(|e| ApiError::internal(format!("encoding a forwarded write: {e}")))?;
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            leader,
            json,
            request,
            reply,
        };
        if self.tx.try_send(pending).is_err() {
            return Err(ApiError::unavailable(
                "this node has too many writes waiting for the leader; retry shortly (nothing \
                 was sent)",
            ));
        }
        answer.await.unwrap_or_else(|_| {
            Err(ApiError::unavailable(
                "the forwarder stopped; the outcome is unknown — retry only with the same \
                 Idempotency-Key",
            ))
        })
    }
}

async fn run(
    http: reqwest::Client,
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
            let http = http.clone();
            async move { send(&http, batch).await }
        },
    )
    .await;
}

async fn send(http: &reqwest::Client, mut batch: Vec<Pending>) {
    let leader = batch[0].leader.rest.clone();
    if batch.len() == 1 {
        let Some(p) = batch.pop() else { return };
        let answer = post_one(http, &leader, p.json).await;
        let _ = p.reply.send(answer);
        return;
    }
    let mut body = Vec::with_capacity(batch.iter().map(|p| p.json.len() + 1).sum::<usize>() + 16);
    body.extend_from_slice(b"{\"requests\":[");
    for (i, p) in batch.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&p.json);
    }
    body.extend_from_slice(b"]}");
    let url = format!("http://{leader}/internal/v1/propose-batch");
    let answers = post(http, &url, body)
        .await
        .and_then(|bytes| {
            serde_json::from_slice::<Vec<ForwardAnswer>>(&bytes)
                .map_err(|e| ApiError::internal(format!("the leader answered unreadably: {e}")))
        })
        .and_then(|answers| {
            if answers.len() == batch.len() {
                Ok(answers)
            } else {
                Err(ApiError::internal(format!(
                    "the leader answered {} of {} forwarded writes; their outcome is unknown",
                    answers.len(),
                    batch.len()
                )))
            }
        });
    match answers {
        Ok(answers) => {
            for (p, a) in batch.into_iter().zip(answers) {
                let _ = p.reply.send(match a {
                    ForwardAnswer::Ok(r) => Ok(r),
                    ForwardAnswer::Error(body) => Err(ApiError { body }),
                });
            }
        }
        Err(e) => {
            for p in batch {
                drop(p.request);
                let _ = p.reply.send(Err(e.clone()));
            }
        }
    }
}

async fn post_one(
    http: &reqwest::Client,
    leader: &str,
    json: Vec<u8>,
) -> Result<Response, ApiError> {
    let url = format!("http://{leader}/internal/v1/propose");
    let bytes = post(http, &url, json).await?;
    serde_json::from_slice::<Response>(&bytes)
        .map_err(|e| ApiError::internal(format!("the leader answered unreadably: {e}")))
}

/// POSTs JSON with the forwarded mark; a non-2xx answer is the leader's error.
async fn post(http: &reqwest::Client, url: &str, body: Vec<u8>) -> Result<Vec<u8>, ApiError> {
    let sent = http
        .post(url)
        .header(FORWARDED_HEADER, "1")
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await;
    let reply = match sent {
        Ok(r) => r,
        Err(e) if e.is_connect() => {
            return Err(ApiError::unavailable(format!(
                "the leader is unreachable ({e}); retry shortly"
            )))
        }
        Err(e) => {
            return Err(ApiError::unavailable(format!(
                "forwarding to the leader failed ({e}); the outcome is unknown — retry only \
                 with the same Idempotency-Key"
            )))
        }
    };
    let ok = reply.status().is_success();
    let bytes = reply.bytes().await.map_err(|e| {
        ApiError::unavailable(format!(
            "the leader's answer broke off ({e}); the outcome is unknown — retry only with \
             the same Idempotency-Key"
        ))
    })?;
    if ok {
        return Ok(bytes.to_vec());
    }
    match serde_json::from_slice::<ErrorBody>(&bytes) {
        Ok(body) => Err(ApiError { body }),
        Err(_) => Err(ApiError::unavailable(format!(
            "the leader refused the forwarded write: {}",
            String::from_utf8_lossy(&bytes)
        ))),
    }
}
