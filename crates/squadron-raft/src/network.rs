//! The client side of Raft RPC: one lazily connected gRPC channel per peer.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use squadron_pki::TlsConnector;
use squadron_proto::v1::raft_service_client::RaftServiceClient;
use squadron_proto::v1::RaftPayload;
use squadron_store::{NodeAddr, NodeId, TypeConfig};
use tonic::transport::{Channel, Endpoint};

use crate::append_stream::{AppendSlot, AppendStats};
use crate::wire;

/// How long establishing a connection (TCP and TLS) to a peer may take. Well under the
/// kernel's first SYN retransmission (1 s): every call to a peer waits behind its channel's
/// one connection attempt, and an attempt begun inside a partition must give way soon after
/// the heal rather than hold votes and read rounds for a second.
pub const PEER_CONNECT_TIMEOUT_MS: u64 = 500;
/// HTTP/2 pings on every connection to a peer, and how long one may go unanswered before the
/// connection is dropped. A partition leaves TCP connections open but silent, and after the
/// heal a request on one waits out TCP's retransmission backoff (1.5–2 s measured here);
/// pings find the dead connection within the partition, so the heal meets a fresh one.
pub const PEER_KEEPALIVE_INTERVAL_MS: u64 = 250;
pub const PEER_KEEPALIVE_TIMEOUT_MS: u64 = 500;
/// How long openraft waits before it tries an unreachable peer again (its default: 500 ms,
/// which a heal then waits out before replication resumes).
pub const PEER_RETRY_MS: u64 = 100;

/// Builds a [`GrpcNetwork`] for a peer: TLS to the peer's listener, presenting this node's
/// certificate and accepting only a node's (`ExpectedPeer::AnyNode`).
///
/// Every client of one peer shares one channel. openraft 0.9 asks for a new client not only
/// per replication stream but for every leadership confirmation (`ensure_linearizable`: each
/// linearizable read's round) and every vote round; a channel of its own each time meant a
/// TCP connection and a TLS handshake per read round and follower — measured as most of a
/// single read's 1.5 ms in a release build. A tonic channel carries concurrent calls on one
/// HTTP/2 connection and connects again by itself once that connection is lost (the
/// keep-alive pings below find a silent one).
#[derive(Debug, Clone)]
pub struct GrpcNetworkFactory {
    connector: TlsConnector,
    channels: PeerChannels,
}

/// The channels of a [`GrpcNetworkFactory`], per peer: the address each dials, the channel and
/// the append stream on it. A handle the node keeps to forget them when its certificate is
/// rotated.
#[derive(Debug, Clone, Default)]
pub struct PeerChannels {
    peers: Arc<Mutex<BTreeMap<NodeId, Peer>>>,
    /// Kept when the peers are forgotten.
    stats: Arc<AppendStats>,
}

#[derive(Clone)]
struct Peer {
    address: String,
    channel: Channel,
    append: Arc<tokio::sync::Mutex<AppendSlot>>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("address", &self.address)
            .finish_non_exhaustive()
    }
}

impl PeerChannels {
    /// Clients made from now on dial afresh, with the certificate the connector holds then;
    /// clients made before keep their connections until those drop.
    pub fn forget_all(&self) {
        self.peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    pub fn append_stats(&self) -> &AppendStats {
        &self.stats
    }
}

impl GrpcNetworkFactory {
    /// `connector` carries the client configuration (`client_config(trust, AnyNode, node
    /// cert)`); a rotated node certificate is used by the next connection, and by every new
    /// client once `channels` were forgotten.
    pub fn new(connector: TlsConnector, channels: PeerChannels) -> Self {
        GrpcNetworkFactory {
            connector,
            channels,
        }
    }

    /// The channel to `target` at `peer`: the one made before, unless the peer's address
    /// changed (a member replaced under the same id).
    fn peer(&self, target: NodeId, peer: &str) -> Result<Peer, String> {
        let mut channels = self
            .channels
            .peers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(known) = channels.get(&target) {
            if known.address == peer {
                return Ok(known.clone());
            }
        }
        let channel = Endpoint::from_shared(format!("https://{peer}"))
            .map(|e| {
                e.connect_timeout(Duration::from_millis(PEER_CONNECT_TIMEOUT_MS))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_millis(PEER_KEEPALIVE_INTERVAL_MS))
                    .keep_alive_timeout(Duration::from_millis(PEER_KEEPALIVE_TIMEOUT_MS))
                    .keep_alive_while_idle(true)
                    .connect_with_connector_lazy(self.connector.clone())
            })
            .map_err(|e| e.to_string())?;
        let made = Peer {
            address: peer.to_string(),
            channel,
            append: Arc::default(),
        };
        channels.insert(target, made.clone());
        Ok(made)
    }
}

impl RaftNetworkFactory<TypeConfig> for GrpcNetworkFactory {
    type Network = GrpcNetwork;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> Self::Network {
        GrpcNetwork {
            target,
            node: node.clone(),
            peer: self.peer(target, &node.peer),
            stats: self.channels.stats.clone(),
        }
    }
}

/// The connection to one peer.
#[derive(Debug)]
pub struct GrpcNetwork {
    target: NodeId,
    node: NodeAddr,
    /// An address that does not parse is kept as the error, reported on every call.
    peer: Result<Peer, String>,
    stats: Arc<AppendStats>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

type Rpc<T, E> = Result<T, RPCError<NodeId, NodeAddr, E>>;

impl GrpcNetwork {
    async fn call<Req, Resp, E>(&self, kind: RpcKind, req: &Req, option: &RPCOption) -> Rpc<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let channel = self
            .peer
            .as_ref()
            .map(|p| p.channel.clone())
            .map_err(|e| RPCError::Unreachable(Unreachable::new(&TransportError(e.clone()))))?;
        let data = encode(req)?;
        let mut request = tonic::Request::new(RaftPayload { data });
        request.set_timeout(option.hard_ttl());
        let mut client = RaftServiceClient::new(channel)
            .max_decoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX)
            .max_encoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX);
        let reply = match kind {
            RpcKind::Append => client.append_entries(request).await,
            RpcKind::Vote => client.vote(request).await,
            RpcKind::Snapshot => client.install_snapshot(request).await,
        };
        let reply = reply.map_err(|status| {
            failure(
                status.code() == tonic::Code::Unavailable,
                format!("{}: {}", status.code(), status.message()),
            )
        })?;
        self.answer(&reply.into_inner())
    }

    /// The peer's answer: its result, or openraft's error it sent back.
    fn answer<Resp, E>(&self, reply: &RaftPayload) -> Rpc<Resp, E>
    where
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let result: Result<Resp, E> = wire::decode(&reply.data)
            .map_err(|e| RPCError::Network(NetworkError::new(&TransportError(e.to_string()))))?;
        result.map_err(|e| {
            RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                e,
            ))
        })
    }

    /// An append on the peer's stream, unless another client of the peer is using it or the
    /// peer has none (`None`: make a unary call). The exchange is bounded by openraft's soft
    /// time-to-live, so this error path normally runs before openraft drops the call at its
    /// hard one (either way the stream is dropped, `AppendSlot::exchange`).
    /// The request is encoded only once the stream is this caller's, so a unary call made in
    /// its place encodes it once.
    async fn append_streamed(
        &self,
        rpc: &AppendEntriesRequest<TypeConfig>,
        option: &RPCOption,
    ) -> Option<Rpc<RaftPayload, RaftError<NodeId>>> {
        let peer = self.peer.as_ref().ok()?;
        let mut slot = peer.append.clone().try_lock_owned().ok()?;
        if slot.unsupported() {
            return None;
        }
        let data = match encode(rpc) {
            Ok(data) => data,
            Err(e) => return Some(Err(e)),
        };
        let exchange = slot.exchange(peer.channel.clone(), data, &self.stats);
        let failed = match tokio::time::timeout(option.soft_ttl(), exchange).await {
            Ok(Ok(reply)) => {
                self.stats.streamed.fetch_add(1, Ordering::Relaxed);
                return Some(Ok(reply));
            }
            Ok(Err(e)) if e.unsupported() => {
                slot.mark_unsupported();
                return None;
            }
            Ok(Err(e)) => failure(e.unreachable(), e.to_string()),
            Err(_) => failure(
                false,
                format!("append stream: no answer within {:?}", option.soft_ttl()),
            ),
        };
        Some(Err(failed))
    }
}

/// A call that got no answer from the peer: unreachable (openraft backs off before the next
/// try) or a network error.
fn failure<E: std::error::Error>(
    unreachable: bool,
    message: String,
) -> RPCError<NodeId, NodeAddr, E> {
    let err = TransportError(message);
    if unreachable {
        RPCError::Unreachable(Unreachable::new(&err))
    } else {
        RPCError::Network(NetworkError::new(&err))
    }
}

fn encode<T: Serialize, E: std::error::Error>(
    req: &T,
) -> Result<Vec<u8>, RPCError<NodeId, NodeAddr, E>> {
    wire::encode(req)
        .map_err(|e| RPCError::Network(NetworkError::new(&TransportError(e.to_string()))))
}

#[derive(Debug, Clone, Copy)]
enum RpcKind {
    Append,
    Vote,
    Snapshot,
}

impl RaftNetwork<TypeConfig> for GrpcNetwork {
    fn backoff(&self) -> openraft::network::Backoff {
        openraft::network::Backoff::new(std::iter::repeat(Duration::from_millis(PEER_RETRY_MS)))
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpc<AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        match self.append_streamed(&rpc, &option).await {
            Some(reply) => self.answer(&reply?),
            None => {
                self.stats.unary.fetch_add(1, Ordering::Relaxed);
                self.call(RpcKind::Append, &rpc, &option).await
            }
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Rpc<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>> {
        self.call(RpcKind::Snapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Rpc<VoteResponse<NodeId>, RaftError<NodeId>> {
        self.call(RpcKind::Vote, &rpc, &option).await
    }
}
