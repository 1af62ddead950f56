//! A Squadron control node: Raft on RocksDB, REST on every node, gRPC for agents and workers,
//! a peer listener for Raft and the node-to-node protocol, the leader's sweep and scheduler,
//! metrics and a dashboard. Every listener is TLS (`tls.rs`); nothing listens in plaintext.

pub mod authz;
pub mod bootstrap_admin;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod election_driver;
pub mod error;
pub mod grpc;
#[cfg(feature = "jepsen-faults")]
pub mod jepsen_fault;
pub mod leader_loops;
pub mod mcp_denials;
pub mod metrics;
pub mod node;
pub mod openapi;
pub mod peer;
pub mod raft_view;
pub mod read_index_rounds;
pub mod request_latency;
pub mod rest;
pub mod resumed_term;
pub mod retention_policy;
pub mod state_digests;
pub mod tls;
pub mod trace;
pub mod write_path;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use squadron_proto::v1::agent_service_server::AgentServiceServer;
use squadron_proto::v1::raft_service_server::RaftServiceServer;
use squadron_proto::v1::worker_control_server::WorkerControlServer;
use squadron_proto::v1::worker_service_server::WorkerServiceServer;
use squadron_raft::{wire, RaftGrpcService, RaftNode};
use squadron_store::NodeAddr;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::NodeConfig;
pub use node::ControlNode;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("configuration: {0}")]
    Config(#[from] config::ConfigError),
    #[error("data directory {path}: {source}")]
    DataDir {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("storage: {0}")]
    Store(String),
    #[error("raft: {0}")]
    Raft(String),
    #[error("TLS: {0} (make the node's certificates with `squadron init`)")]
    Tls(#[from] squadron_pki::PkiError),
    #[error("the peer client: {0}")]
    PeerClient(String),
    #[error("evidence counters: {0}")]
    Counters(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// A started node; dropping it does not stop it, `shutdown` does.
#[derive(Debug)]
pub struct RunningNode {
    pub node: Arc<ControlNode>,
    pub rest_addr: std::net::SocketAddr,
    pub grpc_addr: std::net::SocketAddr,
    pub peer_addr: std::net::SocketAddr,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl RunningNode {
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.node.raft.shutdown().await;
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// Resolves when the node is asked to stop by a signal.
    pub async fn wait(self) {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = ctrl_c.await;
                        return self.shutdown().await;
                    }
                };
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        self.shutdown().await;
    }
}

/// Opens storage, starts Raft and both servers, initialises a brand-new cluster when this node
/// is its designated initialiser, and starts the leader loops.
pub async fn start(config: NodeConfig) -> Result<RunningNode, ServerError> {
    config.validate()?;
    let tls = Arc::new(tls::NodeTls::load(&config.pki_dir(), config.node_id)?);
    let storage = open_raft(&config, &tls).await?;
    let (rest_listener, rest_addr) = bind(config.rest_listen).await?;
    let (grpc_listener, grpc_addr) = bind(config.grpc_listen).await?;
    let (peer_listener, peer_addr) = bind(config.peer_listen).await?;
    let raft = storage.raft.clone();
    let denials = mcp_denials::load(&config.data_dir).map_err(ServerError::Counters)?;
    let node = ControlNode::new(
        config.clone(),
        storage.raft,
        storage.reader,
        storage.append_stats,
        storage.resumed,
        tls.clone(),
        mcp_denials::McpDenials::restored(denials),
    )
    .map_err(|e| ServerError::PeerClient(e.to_string()))?;
    // The release evidence names this binary's digest: hashed now, off the runtime, so the
    // first evidence request does not wait for it.
    tokio::task::spawn_blocking(squadron_pki::own_binary_sha256);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = vec![
        serve(
            (grpc_listener, node.counters.accepted.grpc.clone()),
            tls.mtls_server()?,
            grpc_router(&node),
            shutdown_rx.clone(),
        ),
        serve(
            (rest_listener, node.counters.accepted.rest.clone()),
            tls.rest_server()?,
            rest::router(node.clone()),
            shutdown_rx.clone(),
        ),
        serve(
            (peer_listener, node.counters.accepted.peer.clone()),
            tls.mtls_server()?,
            squadron_pki::NodesOnly::new(peer_router(&node, shutdown_rx.clone())),
            shutdown_rx.clone(),
        ),
        reload_on_hangup(tls.clone(), shutdown_rx.clone()),
        mcp_denials::spawn_saver(node.clone(), config.data_dir.clone(), shutdown_rx.clone()),
    ];
    if storage.is_new {
        initialise_cluster(&config, &raft).await?;
        tasks.push(bootstrap_admin::spawn(node.clone(), shutdown_rx.clone()));
    }
    tasks.push(election_driver::spawn(node.clone(), shutdown_rx.clone()));
    tasks.push(leader_loops::spawn(node.clone(), shutdown_rx));
    tracing::info!(node = config.node_id, %rest_addr, %grpc_addr, %peer_addr, "control node started");
    Ok(RunningNode {
        node,
        rest_addr,
        grpc_addr,
        peer_addr,
        shutdown: shutdown_tx,
        tasks,
    })
}

struct OpenedRaft {
    raft: RaftNode,
    reader: squadron_store::StateReader,
    append_stats: Arc<squadron_store::AppendStats>,
    /// The data directory had no Raft state yet.
    is_new: bool,
    /// The term and log the node opened with (`resumed_term.rs`).
    resumed: resumed_term::ResumedTerm,
}

async fn open_raft(config: &NodeConfig, tls: &tls::NodeTls) -> Result<OpenedRaft, ServerError> {
    let raft_dir = config.data_dir.join("raft");
    let is_new = !raft_dir.exists();
    std::fs::create_dir_all(&raft_dir).map_err(|source| ServerError::DataDir {
        path: raft_dir.clone(),
        source,
    })?;
    let (mut log_store, state_machine) = squadron_store::open(&raft_dir)
        .await
        .map_err(|e| ServerError::Store(e.to_string()))?;
    let resumed = resumed_term::ResumedTerm::read(&mut log_store)
        .await
        .map_err(ServerError::Store)?;
    let reader = state_machine.reader();
    let append_stats = log_store.append_stats();
    let raft_config = config
        .raft
        .to_openraft(&config.cluster_name)
        .map_err(ServerError::Raft)?;
    let raft: RaftNode = openraft::Raft::new(
        config.node_id,
        raft_config,
        tls.raft_network()?,
        log_store,
        state_machine,
    )
    .await
    .map_err(|e| ServerError::Raft(e.to_string()))?;
    Ok(OpenedRaft {
        raft,
        reader,
        append_stats,
        is_new,
        resumed,
    })
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Serves `service` over TLS until shutdown.
/// `listener` with the count of the connections it accepted.
fn serve<S>(
    (listener, accepted): (TcpListener, Arc<std::sync::atomic::AtomicU64>),
    config: Arc<rustls::ServerConfig>,
    service: S,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()>
where
    S: tower::Service<
            axum::http::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    tokio::spawn(squadron_pki::serve_tls(
        listener,
        config,
        service,
        async move {
            let _ = stop.changed().await;
        },
        accepted,
    ))
}

/// The gRPC API: the leader-only worker and agent services (workers and agents present
/// certificates; the listener requires one).
fn grpc_router(node: &Arc<ControlNode>) -> axum::Router {
    let worker_service = WorkerServiceServer::new(grpc::WorkerGrpc::new(node.clone()));
    let agent_service = AgentServiceServer::new(grpc::AgentGrpc::new(node.clone()));
    let worker_control = WorkerControlServer::new(grpc::WorkerControlGrpc::new(node.clone()))
        .max_decoding_message_size(squadron_api::worker_control::WORKER_CONTROL_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(squadron_api::worker_control::WORKER_CONTROL_MESSAGE_BYTES_MAX);
    tonic::service::Routes::new(worker_service)
        .add_service(agent_service)
        .add_service(worker_control)
        .into_axum_router()
        .layer(axum::middleware::from_fn_with_state(
            node.clone(),
            authz::grpc_guard,
        ))
        .layer(axum::middleware::from_fn(trace::layer))
}

/// The peer listener's services: Raft and the node-to-node protocol. `lib.rs` wraps it so
/// only node certificates reach it.
fn peer_router(node: &Arc<ControlNode>, stop: watch::Receiver<bool>) -> axum::Router {
    let raft_service = RaftServiceServer::new(RaftGrpcService::new(
        node.raft.clone(),
        node.leader_contact.clone(),
        stop,
    ))
    .max_decoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX)
    .max_encoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX);
    tonic::service::Routes::new(raft_service)
        .into_axum_router()
        .merge(peer::router(node.clone()))
}

/// SIGHUP re-reads the node's certificate files (rotation without a restart).
fn reload_on_hangup(tls: Arc<tls::NodeTls>, mut stop: watch::Receiver<bool>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("SIGHUP not available: certificates reload only by the API");
            return;
        };
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = hangup.recv() => match tls.reload() {
                    Ok(()) => tracing::info!("certificates reloaded"),
                    Err(e) => tracing::error!(error = %e, "certificates not reloaded; the old ones stay"),
                },
            }
        }
    })
}

/// On the designated initialiser (the lowest initial member id) of a brand-new cluster.
async fn initialise_cluster(config: &NodeConfig, raft: &RaftNode) -> Result<(), ServerError> {
    let initialiser = config.initial_members.iter().map(|m| m.id).min();
    if initialiser != Some(config.node_id) {
        return Ok(());
    }
    let members: BTreeMap<u64, NodeAddr> = config
        .initial_members
        .iter()
        .map(|m| {
            (
                m.id,
                NodeAddr {
                    rest: m.rest.clone(),
                    grpc: m.grpc.clone(),
                    peer: m.peer.clone(),
                },
            )
        })
        .collect();
    match raft.initialize(members).await {
        Ok(()) => tracing::info!(node = config.node_id, "initialised a new cluster"),
        Err(openraft::error::RaftError::APIError(
            openraft::error::InitializeError::NotAllowed(_),
        )) => tracing::info!("cluster already initialised"),
        Err(e) => return Err(ServerError::Raft(e.to_string())),
    }
    Ok(())
}
