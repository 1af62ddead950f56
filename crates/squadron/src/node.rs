//! `squadron server` and `squadron dev`: start a control node and run it until a signal.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use squadron_server::NodeConfig;

/// How long `dev` waits for its single node to elect itself before printing anyway.
const DEV_LEADER_WAIT: Duration = Duration::from_secs(15);

pub async fn server(config_path: &Path) -> anyhow::Result<()> {
    let config = NodeConfig::load(config_path)
        .with_context(|| format!("loading {}", config_path.display()))?;
    let id = config.node_id;
    let running = squadron_server::start(config)
        .await
        .context("starting the node")?;
    println!(
        "squadron node {id} listening rest={} grpc={}",
        running.rest_addr, running.grpc_addr
    );
    running.wait().await;
    tracing::info!(node = id, "stopped");
    Ok(())
}

pub async fn dev(
    data_dir: PathBuf,
    listen: SocketAddr,
    grpc_listen: SocketAddr,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    let config = NodeConfig::single_node(data_dir.clone(), listen, grpc_listen);
    let running = squadron_server::start(config)
        .await
        .context("starting the dev node")?;
    let started = Instant::now();
    while running.node.leader().is_none() && started.elapsed() < DEV_LEADER_WAIT {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if running.node.leader().is_none() {
        tracing::warn!(
            "no leader after {:?}; the API answers unavailable until one is elected",
            DEV_LEADER_WAIT
        );
    }
    let rest = running.rest_addr;
    println!(
        "squadron dev: single-node control plane (data in {})",
        data_dir.display()
    );
    println!("  REST API:  http://{rest}/api/v1   (OpenAPI: http://{rest}/api/v1/openapi.json)");
    println!("  dashboard: http://{rest}/");
    println!("  gRPC:      {}", running.grpc_addr);
    println!("  no local worker yet: dev mode runs the control plane only. Ctrl-C stops it.");
    running.wait().await;
    Ok(())
}
