//! Errors of the write path, one enum for proposals and one for membership changes. Each
//! names its class in the core's one error table (`ErrorCode`), and the edges turn that into
//! an HTTP status (`ApiError`) or a gRPC `Status`; the messages say what a caller may do next.

use squadron_core::error_code::ErrorCode;
use squadron_core::ValidationError;
use squadron_store::NodeAddr;

use crate::error::{ApiError, ErrorBody};
use crate::peer::PeerError;

/// Why a write got no answer from the state machine.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WriteError {
    /// This node cannot propose; the leader's addresses when known. `write` forwards on it;
    /// only `propose_here` returns it.
    #[error("this node is not the leader")]
    NotLeader { leader: Option<NodeAddr> },
    #[error("no leader is known; retry shortly")]
    NoLeader,
    /// A forwarded write reached a node that is no longer the leader. It is not forwarded a
    /// second time: the follower that sent it tells its caller.
    #[error("leadership moved while the request was forwarded; retry")]
    LeadershipMoved,
    /// The proposal queue is full.
    #[error("this node has too many writes waiting; retry shortly (nothing was proposed)")]
    Overloaded,
    /// The queue of writes waiting to be forwarded is full.
    #[error(
        "this node has too many writes waiting for the leader; retry shortly (nothing was sent)"
    )]
    ForwardsOverloaded,
    /// The entry may still commit.
    #[error(
        "timed out waiting for the write to commit; its outcome is unknown — retry only with \
         the same Idempotency-Key"
    )]
    TimedOut,
    /// Raft failed (shutting down, storage error) after the write was handed to it.
    #[error("raft: {0}; the outcome is unknown — retry only with the same Idempotency-Key")]
    Raft(String),
    /// The forward to the leader failed on the way.
    #[error("{}", forward_failure(.0))]
    Forward(PeerError),
    /// A batch answer that does not answer every write of the batch.
    #[error("the leader answered {answered} of {sent} forwarded writes; their outcome is unknown")]
    ForwardIncomplete { answered: usize, sent: usize },
    #[error("encoding a forwarded write: {0}")]
    Encode(String),
    #[error(
        "the forwarder stopped; the outcome is unknown — retry only with the same \
         Idempotency-Key"
    )]
    ForwarderStopped,
    /// The leader refused the forwarded write; its answer is passed on as it is.
    #[error("{}", .0.message)]
    Leader(ErrorBody),
}

fn forward_failure(e: &PeerError) -> String {
    match e {
        PeerError::Unreachable(e) => format!("the leader is unreachable ({e}); retry shortly"),
        PeerError::NoAnswer(e) => format!(
            "forwarding to the leader failed ({e}); the outcome is unknown — retry only with \
             the same Idempotency-Key"
        ),
        PeerError::BrokeOff(e) => format!(
            "the leader's answer broke off ({e}); the outcome is unknown — retry only with \
             the same Idempotency-Key"
        ),
        PeerError::Refused { text, .. } => {
            format!("the leader refused the forwarded write: {text}")
        }
        PeerError::Unreadable(e) => format!("the leader answered unreadably: {e}"),
    }
}

impl From<PeerError> for WriteError {
    fn from(e: PeerError) -> Self {
        match e {
            PeerError::Refused {
                body: Some(body), ..
            } => WriteError::Leader(body),
            e => WriteError::Forward(e),
        }
    }
}

impl WriteError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WriteError::Leader(body) => body.code,
            WriteError::Forward(PeerError::Unreadable(_))
            | WriteError::ForwardIncomplete { .. }
            | WriteError::Encode(_) => ErrorCode::Internal,
            _ => ErrorCode::Unavailable,
        }
    }
}

impl From<WriteError> for ApiError {
    fn from(e: WriteError) -> Self {
        match e {
            WriteError::Leader(body) => ApiError { body },
            e => ApiError::new(e.code(), e.to_string()),
        }
    }
}

/// Why a membership change was not made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MembershipError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    NotMember(String),
    /// This node is not the leader (openraft's words); the leader's addresses when known.
    #[error("{message}")]
    NotLeader {
        leader: Option<NodeAddr>,
        message: String,
    },
    #[error("no leader is known; retry shortly")]
    NoLeader,
    /// openraft refused the change as such (e.g. it would leave no voter).
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Raft(String),
    /// The relay to the leader got no answer.
    #[error("forwarding to the leader: {0}")]
    Relay(PeerError),
    /// The leader's answer could not be read.
    #[error("leader reply: {0}")]
    RelayReply(PeerError),
    /// The leader refused the relayed change; its answer is passed on as it is.
    #[error("{}", .0.message)]
    Leader(ErrorBody),
}

impl From<PeerError> for MembershipError {
    fn from(e: PeerError) -> Self {
        match e {
            PeerError::Refused {
                body: Some(body), ..
            } => MembershipError::Leader(body),
            e @ (PeerError::Unreachable(_) | PeerError::NoAnswer(_)) => MembershipError::Relay(e),
            e => MembershipError::RelayReply(e),
        }
    }
}

impl MembershipError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MembershipError::Invalid(_) => ErrorCode::InvalidArgument,
            MembershipError::NotMember(_) => ErrorCode::NotFound,
            MembershipError::Refused(_) => ErrorCode::FailedPrecondition,
            MembershipError::RelayReply(_) => ErrorCode::Internal,
            MembershipError::Leader(body) => body.code,
            MembershipError::NotLeader { .. }
            | MembershipError::NoLeader
            | MembershipError::Raft(_)
            | MembershipError::Relay(_) => ErrorCode::Unavailable,
        }
    }
}

impl From<MembershipError> for ApiError {
    fn from(e: MembershipError) -> Self {
        match e {
            MembershipError::Invalid(e) => e.into(),
            MembershipError::Leader(body) => ApiError { body },
            e => ApiError::new(e.code(), e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(e: WriteError) -> (u16, String) {
        let e = ApiError::from(e);
        (e.code().http_status(), e.body.message)
    }

    #[test]
    fn write_errors_keep_their_words_and_their_class() {
        assert_eq!(
            api(WriteError::NoLeader),
            (503, "no leader is known; retry shortly".into())
        );
        assert_eq!(
            api(WriteError::LeadershipMoved),
            (
                503,
                "leadership moved while the request was forwarded; retry".into()
            )
        );
        let (status, message) = api(WriteError::TimedOut);
        assert_eq!(status, 503);
        assert!(
            message.contains("outcome is unknown — retry only with the same Idempotency-Key"),
            "{message}"
        );
        let (status, message) = api(WriteError::Forward(PeerError::Unreachable(
            "refused".into(),
        )));
        assert_eq!(
            (status, message.as_str()),
            (503, "the leader is unreachable (refused); retry shortly")
        );
        let (status, message) = api(WriteError::Forward(PeerError::Unreadable("eof".into())));
        assert_eq!(
            (status, message.as_str()),
            (500, "the leader answered unreadably: eof")
        );
    }

    #[test]
    fn the_leaders_refusal_is_passed_on_unchanged() {
        let body = ErrorBody {
            code: ErrorCode::Conflict,
            message: "generation moved".into(),
            field: Some("expected_generation".into()),
            rejection: None,
        };
        let refused = PeerError::Refused {
            status: reqwest::StatusCode::CONFLICT,
            body: Some(body.clone()),
            text: String::new(),
        };
        assert_eq!(ApiError::from(WriteError::from(refused.clone())).body, body);
        assert_eq!(
            ApiError::from(MembershipError::from(refused)).body,
            body,
            "a relayed membership change passes the leader's refusal on too"
        );
        // Without an error body the refusal is the follower's own words.
        let bare = PeerError::Refused {
            status: reqwest::StatusCode::BAD_GATEWAY,
            body: None,
            text: "upstream".into(),
        };
        assert_eq!(
            api(WriteError::from(bare)),
            (
                503,
                "the leader refused the forwarded write: upstream".into()
            )
        );
    }

    #[test]
    fn membership_errors_map_through_the_error_table() {
        let cases = [
            (
                MembershipError::Invalid(ValidationError::new("id", "must be positive")),
                400,
            ),
            (
                MembershipError::NotMember("node 9 is not a member".into()),
                404,
            ),
            (
                MembershipError::Refused("no voter would be left".into()),
                409,
            ),
            (MembershipError::NoLeader, 503),
            (
                MembershipError::Relay(PeerError::NoAnswer("reset".into())),
                503,
            ),
            (
                MembershipError::RelayReply(PeerError::Unreadable("eof".into())),
                500,
            ),
        ];
        for (e, status) in cases {
            let text = e.to_string();
            let api = ApiError::from(e);
            assert_eq!(api.code().http_status(), status, "{text}");
        }
        let relay = ApiError::from(MembershipError::from(PeerError::Unreachable("down".into())));
        assert_eq!(relay.body.message, "forwarding to the leader: down");
    }
}
