//! `squadron server` and `squadron dev`: the commands that run a control node.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use crate::node;

#[derive(Debug, Args)]
pub struct ServerArgs {
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
}

#[derive(Debug, Args)]
pub struct DevArgs {
    #[arg(long, value_name = "DIR", default_value = "./.squadron")]
    pub data_dir: PathBuf,
    /// REST and dashboard address.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8120")]
    pub listen: SocketAddr,
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8121")]
    pub grpc_listen: SocketAddr,
    /// Raft and the node-to-node protocol (mTLS, node certificates only).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8122")]
    pub peer_listen: SocketAddr,
    /// Address of the local worker's output server.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8130")]
    pub worker_listen: SocketAddr,
    /// Do not start the local worker.
    #[arg(long)]
    pub no_worker: bool,
    /// Warm Docker containers the local worker keeps started for claims (0: none; see
    /// `squadron worker --docker-warm-pool`).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub docker_warm_pool: usize,
}

pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    node::server(&args.config).await
}

pub async fn dev(args: DevArgs) -> anyhow::Result<()> {
    node::dev(
        args.data_dir,
        args.listen,
        args.grpc_listen,
        args.peer_listen,
        (!args.no_worker).then_some(args.worker_listen),
        args.docker_warm_pool,
    )
    .await
}
