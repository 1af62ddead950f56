//! Paths and bodies of the node-to-node protocol (JSON over HTTP). They are defined here and
//! nowhere else: the public API neither serves nor documents them.

use serde::{Deserialize, Serialize};
use squadron_core::access::Subject;
use squadron_core::ids::IdempotencyKey;
use squadron_core::{Command, Response};
use squadron_store::{NodeAddr, NodeId};

use crate::error::ErrorBody;

/// `POST` a [`ProposeRequest`]; answered with the [`Response`] of applying it.
pub const PROPOSE_PATH: &str = "/internal/v1/propose";
/// `POST` a [`ProposeBatch`]; answered with one [`ForwardAnswer`] per write, in order.
pub const PROPOSE_BATCH_PATH: &str = "/internal/v1/propose-batch";
/// `GET`; answered with a [`ReadIndexReply`].
pub const READ_INDEX_PATH: &str = "/internal/v1/read-index";
/// `POST` a [`MembershipChange`]; answered with a [`MembershipReply`].
pub const MEMBERSHIP_PATH: &str = "/internal/v1/membership";
/// `GET`; answered with a [`PingReply`] by any node that is up and reachable (the election
/// driver's pings).
pub const PING_PATH: &str = "/internal/v1/ping";

/// Most writes one forwarded batch may carry.
pub const PROPOSE_BATCH_WRITES_MAX: usize = 1_024;

/// A write a follower asks the leader to propose on its behalf. The leader stamps the time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProposeRequest {
    /// The caller the forwarding node authenticated; the leader proposes on its behalf.
    pub subject: Subject,
    pub command: Command,
    pub idempotency_key: Option<IdempotencyKey>,
    /// The write's trace id, named in the leader's log line of its apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<squadron_api::TraceId>,
}

/// Writes forwarded together; each is proposed as if it had come alone.
#[derive(Debug, Serialize, Deserialize)]
pub struct ProposeBatch {
    pub requests: Vec<ProposeRequest>,
}

/// Encodes a [`ProposeBatch`] from requests already encoded one by one (the forwarder encodes
/// each write when it is queued, so a batch costs no second encoding).
pub fn encode_propose_batch<'a>(requests: impl Iterator<Item = &'a [u8]> + Clone) -> Vec<u8> {
    let bytes: usize = requests.clone().map(|r| r.len() + 1).sum();
    let mut body = Vec::with_capacity(bytes + 16);
    body.extend_from_slice(b"{\"requests\":[");
    for (i, request) in requests.enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(request);
    }
    body.extend_from_slice(b"]}");
    body
}

/// One answer of a forwarded batch, in request order.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ForwardAnswer {
    Ok(Response),
    Error(ErrorBody),
}

/// The index a linearizable read on a follower must wait for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadIndexReply {
    pub index: Option<u64>,
}

/// A node's answer to a ping: how far its log reaches, and how long ago it heard a leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingReply {
    pub last_log_index: Option<u64>,
    /// Milliseconds since it last heard from a leader (0 when it is the leader): a voter
    /// refuses every vote until that reaches its leader lease. Absent from older nodes.
    #[serde(default)]
    pub leader_heard_ms_ago: Option<u64>,
}

/// A membership change a node relays to the leader.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum MembershipChange {
    /// Add a node as a learner; it catches up, then can be promoted.
    AddLearner { id: NodeId, addr: NodeAddr },
    /// Promote a learner to voter.
    PromoteVoter { id: NodeId },
    /// Remove a voter or a learner (the leader too).
    Remove { id: NodeId },
}

/// A committed membership change: its log index, and the members as the leader saw them
/// right after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipReply {
    pub log_index: u64,
    pub members: Vec<Member>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: NodeId,
    pub addr: NodeAddr,
    pub voter: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_encoded_from_single_requests_reads_back_as_a_propose_batch() {
        let requests: Vec<ProposeRequest> = (0..3)
            .map(|i| ProposeRequest {
                subject: Subject::System,
                command: Command::Sweep,
                idempotency_key: (i > 0).then(|| IdempotencyKey::new(format!("k{i}")).unwrap()),
                trace_id: (i == 2).then(squadron_api::TraceId::random),
            })
            .collect();
        let encoded: Vec<Vec<u8>> = requests
            .iter()
            .map(|r| serde_json::to_vec(r).unwrap())
            .collect();
        let body = encode_propose_batch(encoded.iter().map(Vec::as_slice));
        let batch: ProposeBatch = serde_json::from_slice(&body).unwrap();
        assert_eq!(batch.requests.len(), 3);
        assert_eq!(batch.requests[0].idempotency_key, None);
        assert_eq!(
            batch.requests[2]
                .idempotency_key
                .as_ref()
                .map(|k| k.as_str()),
            Some("k2")
        );
        let empty = encode_propose_batch(std::iter::empty());
        assert_eq!(empty, b"{\"requests\":[]}");
    }
}
