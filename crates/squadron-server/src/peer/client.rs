//! The client side of the node-to-node protocol: one HTTP client, and so one connection pool,
//! for every call a node makes to another (forwarded writes, read indexes, membership
//! relays). Each call says what it wants; mapping a failure to the caller's words is the
//! caller's part, since "the outcome is unknown" means something different for each.

use std::time::Duration;

use serde::de::DeserializeOwned;
use squadron_core::Response;
use squadron_store::NodeAddr;

use super::wire::{
    ForwardAnswer, MembershipChange, MembershipReply, PingReply, ReadIndexReply, MEMBERSHIP_PATH,
    PING_PATH, PROPOSE_BATCH_PATH, PROPOSE_PATH, READ_INDEX_PATH,
};
use crate::error::ErrorBody;

/// How long a node-to-node call may take to connect.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 1_000;

use squadron_raft::network::{PEER_KEEPALIVE_INTERVAL_MS, PEER_KEEPALIVE_TIMEOUT_MS};

/// Why a node-to-node call got no usable answer. Messages are kept as text so that one
/// failure can be handed to every write of a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// No connection could be made: nothing was sent.
    #[error("{0}")]
    Unreachable(String),
    /// The request may have arrived, but no answer came (timeout, connection reset).
    #[error("{0}")]
    NoAnswer(String),
    /// The answer broke off while it was being read.
    #[error("{0}")]
    BrokeOff(String),
    /// The peer answered with an error status, and its error body when it sent one.
    #[error("{status}: {text}")]
    Refused {
        status: reqwest::StatusCode,
        body: Option<ErrorBody>,
        text: String,
    },
    /// A success answer that is not the JSON the call expects.
    #[error("{0}")]
    Unreadable(String),
}

#[derive(Debug, Clone)]
pub struct PeerClient {
    http: reqwest::Client,
    request_timeout: Duration,
}

impl PeerClient {
    /// `request_timeout` bounds forwarded writes and read indexes. A relayed membership change
    /// has none: adding a learner waits until it has caught up, which may take longer.
    /// `tls` is the node's peer client configuration (its certificate; any node's expected).
    pub fn new(
        request_timeout: Duration,
        tls: rustls::ClientConfig,
    ) -> Result<PeerClient, PeerError> {
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS))
            .tcp_nodelay(true)
            // A connection a partition silenced is found dead within it (see the Raft
            // network's constants): the heal then meets a fresh one.
            .http2_keep_alive_interval(Duration::from_millis(PEER_KEEPALIVE_INTERVAL_MS))
            .http2_keep_alive_timeout(Duration::from_millis(PEER_KEEPALIVE_TIMEOUT_MS))
            .http2_keep_alive_while_idle(true)
            .build()
            .map_err(|e| PeerError::Unreachable(format!("the peer client: {e}")))?;
        Ok(PeerClient {
            http,
            request_timeout,
        })
    }

    /// One forwarded write, already encoded as a `ProposeRequest`.
    pub async fn propose(
        &self,
        leader: &NodeAddr,
        request: Vec<u8>,
    ) -> Result<Response, PeerError> {
        let post = self.post_json(leader, PROPOSE_PATH, request);
        json(&self.send(post.timeout(self.request_timeout)).await?)
    }

    /// Forwarded writes in one request, already encoded as a `ProposeBatch`.
    pub async fn propose_batch(
        &self,
        leader: &NodeAddr,
        batch: Vec<u8>,
    ) -> Result<Vec<ForwardAnswer>, PeerError> {
        let post = self.post_json(leader, PROPOSE_BATCH_PATH, batch);
        json(&self.send(post.timeout(self.request_timeout)).await?)
    }

    /// The index a linearizable read on this follower must wait for.
    pub async fn read_index(&self, leader: &NodeAddr) -> Result<Option<u64>, PeerError> {
        let get = self
            .http
            .get(url(leader, READ_INDEX_PATH))
            .timeout(self.request_timeout);
        json::<ReadIndexReply>(&self.send(get).await?).map(|r| r.index)
    }

    /// `peer`'s answer on its peer listener within `timeout`, or `None`.
    pub async fn ping(&self, peer: &NodeAddr, timeout: Duration) -> Option<PingReply> {
        let get = self.http.get(url(peer, PING_PATH)).timeout(timeout);
        json(&self.send(get).await.ok()?).ok()
    }

    /// A membership change, run by the leader.
    pub async fn change_membership(
        &self,
        leader: &NodeAddr,
        change: &MembershipChange,
    ) -> Result<MembershipReply, PeerError> {
        let post = self.http.post(url(leader, MEMBERSHIP_PATH)).json(change);
        json(&self.send(post).await?)
    }

    fn post_json(&self, peer: &NodeAddr, path: &str, body: Vec<u8>) -> reqwest::RequestBuilder {
        self.http
            .post(url(peer, path))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body)
    }

    /// Sends a request and reads the whole answer; an error status is the peer's refusal.
    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Vec<u8>, PeerError> {
        let reply = request.send().await.map_err(|e| {
            if e.is_connect() {
                PeerError::Unreachable(with_causes(&e))
            } else {
                PeerError::NoAnswer(with_causes(&e))
            }
        })?;
        let status = reply.status();
        let bytes = reply
            .bytes()
            .await
            .map_err(|e| PeerError::BrokeOff(with_causes(&e)))?;
        if status.is_success() {
            return Ok(bytes.to_vec());
        }
        Err(PeerError::Refused {
            status,
            body: serde_json::from_slice::<ErrorBody>(&bytes).ok(),
            text: String::from_utf8_lossy(&bytes).into_owned(),
        })
    }
}

/// reqwest's own message ("error sending request for url …") names no cause; an operator
/// reading why a forward failed needs it (timed out, connection reset, refused stream).
fn with_causes(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let said = c.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}

fn url(peer: &NodeAddr, path: &str) -> String {
    format!("https://{}{path}", peer.peer)
}

fn json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, PeerError> {
    serde_json::from_slice(bytes).map_err(|e| PeerError::Unreadable(e.to_string()))
}
