//! A Squadron control node: Raft on RocksDB, REST on every node, gRPC for Raft (and, as they
//! land, agents and workers), the leader's sweep and scheduler, metrics and a dashboard.

pub mod clock;
pub mod config;
pub mod dashboard;
pub mod error;
pub mod grpc;
#[cfg(feature = "jepsen-fault-local-reads")]
pub mod jepsen_fault;
pub mod leader_loops;
pub mod mcp_denials;
pub mod metrics;
pub mod node;
pub mod openapi;
pub mod peer;
pub mod raft_view;
pub mod read_index_rounds;
pub mod rest;
pub mod write_path;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use squadron_proto::v1::agent_service_server::AgentServiceServer;
use squadron_proto::v1::raft_service_server::RaftServiceServer;
use squadron_proto::v1::worker_service_server::WorkerServiceServer;
use squadron_raft::{wire, GrpcNetworkFactory, RaftGrpcService, RaftNode};
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
    let storage = open_raft(&config).await?;
    let (rest_listener, rest_addr) = bind(config.rest_listen).await?;
    let (grpc_listener, grpc_addr) = bind(config.grpc_listen).await?;
    let raft = storage.raft.clone();
    let node = ControlNode::new(
        config.clone(),
        storage.raft,
        storage.reader,
        storage.append_stats,
    );
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let mut tasks = vec![
        serve_grpc(&node, grpc_listener, shutdown_rx.clone()),
        serve_rest(&node, rest_listener, shutdown_rx.clone()),
    ];
    if storage.is_new {
        initialise_cluster(&config, &raft).await?;
    }
    tasks.push(leader_loops::spawn(node.clone(), shutdown_rx));
    tracing::info!(node = config.node_id, %rest_addr, %grpc_addr, "control node started");
    Ok(RunningNode {
        node,
        rest_addr,
        grpc_addr,
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
}

async fn open_raft(config: &NodeConfig) -> Result<OpenedRaft, ServerError> {
    let raft_dir = config.data_dir.join("raft");
    let is_new = !raft_dir.exists();
    std::fs::create_dir_all(&raft_dir).map_err(|source| ServerError::DataDir {
        path: raft_dir.clone(),
        source,
    })?;
    let (log_store, state_machine) = squadron_store::open(&raft_dir)
        .await
        .map_err(|e| ServerError::Store(e.to_string()))?;
    let reader = state_machine.reader();
    let append_stats = log_store.append_stats();
    let raft_config = config
        .raft
        .to_openraft(&config.cluster_name)
        .map_err(ServerError::Raft)?;
    let raft: RaftNode = openraft::Raft::new(
        config.node_id,
        raft_config,
        GrpcNetworkFactory,
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
    })
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), ServerError> {
    let bind_error = |source| ServerError::Bind { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(bind_error)?;
    let local = listener.local_addr().map_err(bind_error)?;
    Ok((listener, local))
}

/// Raft, and the leader-only worker and agent services.
fn serve_grpc(
    node: &Arc<ControlNode>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let raft_service = RaftServiceServer::new(RaftGrpcService::new(node.raft.clone()))
        .max_decoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX)
        .max_encoding_message_size(wire::RAFT_PAYLOAD_BYTES_MAX);
    let worker_service = WorkerServiceServer::new(grpc::WorkerGrpc::new(node.clone()));
    let agent_service = AgentServiceServer::new(grpc::AgentGrpc::new(node.clone()));
    tokio::spawn(async move {
        // Small Raft messages must leave at once: with Nagle on, a reply written in two parts
        // waits for the peer's delayed ACK (~40 ms). The builder's `tcp_nodelay` covers only
        // listeners tonic binds itself, so accepted streams get it here.
        let incoming = tokio_stream::StreamExt::map(
            tokio_stream::wrappers::TcpListenerStream::new(listener),
            |stream| {
                stream.inspect(|s| {
                    if let Err(e) = s.set_nodelay(true) {
                        tracing::warn!(error = %e, "TCP_NODELAY not set on a gRPC connection");
                    }
                })
            },
        );
        let result = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(raft_service)
            .add_service(worker_service)
            .add_service(agent_service)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = stop.changed().await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    })
}

/// The public REST API and, beside it, the node-to-node protocol.
fn serve_rest(
    node: &Arc<ControlNode>,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    // The peer router shares the REST listener for now. It is merged here, at the top, and
    // not inside `rest::router`: it is the part that moves to its own (peer) listener.
    let app = rest::router(node.clone()).merge(peer::router(node.clone()));
    tokio::spawn(async move {
        let result = axum::serve(listener, app)
            .tcp_nodelay(true)
            .with_graceful_shutdown(async move {
                let _ = stop.changed().await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "REST server stopped");
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
