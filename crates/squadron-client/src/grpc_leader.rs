//! gRPC to the leader. Agents and workers talk gRPC to the leader only; a follower refuses
//! with `UNAVAILABLE` and the leader's gRPC address in `x-squadron-leader`. [`GrpcLeader`]
//! finds the leader through any node's REST status, keeps one channel to it, and follows a
//! refusal's redirect, so callers reconnect without knowing the cluster's layout.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use crate::types::ClusterStatus;
use crate::{ClientError, Consistency, SquadronClient};

/// The metadata key a follower puts the leader's gRPC address under.
pub const LEADER_METADATA: &str = "x-squadron-leader";
/// Connection set-up bound for one gRPC endpoint.
pub const GRPC_CONNECT_TIMEOUT_MS: u64 = 2_000;
/// Longest `host:port` accepted from a redirect.
pub const LEADER_ADDRESS_BYTES_MAX: usize = 256;

/// A channel to the current leader, shared by clones.
#[derive(Debug, Clone)]
pub struct GrpcLeader {
    rest: SquadronClient,
    current: Arc<Mutex<Option<(String, Channel)>>>,
}

impl GrpcLeader {
    /// `rest` is used only to discover the leader's gRPC address.
    pub fn new(rest: SquadronClient) -> Self {
        Self {
            rest,
            current: Arc::new(Mutex::new(None)),
        }
    }

    /// The channel to the leader, discovering it if needed.
    pub async fn channel(&self) -> Result<(String, Channel), ClientError> {
        let mut current = self.current.lock().await;
        if let Some((addr, ch)) = current.as_ref() {
            return Ok((addr.clone(), ch.clone()));
        }
        let addr = self.discover().await?;
        let ch = connect(&addr, &self.rest).map_err(ClientError::Invalid)?;
        *current = Some((addr.clone(), ch.clone()));
        Ok((addr, ch))
    }

    /// Forgets the current channel after a failure. When the failure is a follower's refusal
    /// naming the leader, the next [`channel`](Self::channel) goes straight there; returns
    /// whether it did.
    pub async fn on_error(&self, status: &tonic::Status) -> bool {
        let mut current = self.current.lock().await;
        *current = None;
        if let Some(addr) = redirect_of(status) {
            if let Ok(ch) = connect(&addr, &self.rest) {
                *current = Some((addr, ch));
                return true;
            }
        }
        false
    }

    /// Drops the channel (for example after a transport error), so the next call rediscovers.
    pub async fn reset(&self) {
        *self.current.lock().await = None;
    }

    /// The leader's gRPC address as the cluster reports it now (not the cached channel's).
    pub async fn leader_address(&self) -> Result<String, ClientError> {
        self.discover().await
    }

    async fn discover(&self) -> Result<String, ClientError> {
        let status: ClusterStatus = self
            .rest
            .cluster_status_without_digest(Consistency::Stale)
            .await?;
        let leader = status.leader.ok_or_else(|| ClientError::Api {
            endpoint: self
                .rest
                .preferred_endpoint()
                .unwrap_or_default()
                .to_string(),
            status: 503,
            body: crate::ErrorBody {
                code: squadron_core::error_code::ErrorCode::Unavailable,
                message: "no leader known yet".into(),
                field: None,
                rejection: None,
            },
        })?;
        status
            .members
            .iter()
            .find(|m| m.id == leader)
            .map(|m| m.grpc.clone())
            .ok_or_else(|| ClientError::Decode {
                endpoint: self
                    .rest
                    .preferred_endpoint()
                    .unwrap_or_default()
                    .to_string(),
                message: format!("leader {leader} is not among the members"),
            })
    }
}

/// The leader address a follower's refusal carries, if any.
pub fn redirect_of(status: &tonic::Status) -> Option<String> {
    if status.code() != tonic::Code::Unavailable {
        return None;
    }
    let v = status.metadata().get(LEADER_METADATA)?.to_str().ok()?;
    (!v.is_empty() && v.len() <= LEADER_ADDRESS_BYTES_MAX).then(|| v.to_string())
}

/// A channel to `addr` with the REST client's credentials: TLS with its certificate when it
/// has a CA (always, outside this crate's own tests). The error is a message: `ClientError`
/// is too large for a synchronous `Result`.
fn connect(addr: &str, rest: &SquadronClient) -> Result<Channel, String> {
    let connector = rest
        .credentials()
        .grpc_connector()
        .map_err(|e| format!("TLS: {e}"))?;
    let authority = addr.split_once("://").map_or(addr, |(_, rest)| rest);
    let scheme = if connector.is_some() { "https" } else { "http" };
    let ep = Endpoint::from_shared(format!("{scheme}://{authority}"))
        .map_err(|e| format!("bad gRPC address {addr:?}: {e}"))?
        .connect_timeout(Duration::from_millis(GRPC_CONNECT_TIMEOUT_MS))
        .tcp_nodelay(true);
    Ok(match connector {
        Some(c) => ep.connect_with_connector_lazy(c),
        None => ep.connect_lazy(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_refusal_names_the_leader() {
        let mut s = tonic::Status::unavailable("not the leader");
        s.metadata_mut()
            .insert(LEADER_METADATA, "127.0.0.1:8311".parse().unwrap());
        assert_eq!(redirect_of(&s).as_deref(), Some("127.0.0.1:8311"));
    }

    #[test]
    fn other_errors_are_not_redirects() {
        let mut s = tonic::Status::invalid_argument("bad");
        s.metadata_mut()
            .insert(LEADER_METADATA, "127.0.0.1:8311".parse().unwrap());
        assert_eq!(redirect_of(&s), None);
        assert_eq!(redirect_of(&tonic::Status::unavailable("no leader")), None);
    }
}
